"""The node-cache fill against a hub on loopback: once per node, resumable, errors in words."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from support.fakehub import FakeHub
from hybridserving_engine import weights

FILES = {"config.json": b'{"architectures": ["DeepseekV3ForCausalLM"]}', "model-00001.safetensors": b"x" * 300_000}


def source(hub: FakeHub, token: str | None = "hf_test") -> weights.Source:
    return weights.Source(repo="org/model", revision="main", endpoint=hub.endpoint, token=token)


def test_a_node_downloads_once_and_every_later_fill_reuses_the_copy(tmp_path: Path) -> None:
    with FakeHub({"org/model": FILES}, token="hf_test") as hub:
        first = weights.fill(source(hub), tmp_path / "org--model")
        second = weights.fill(source(hub), tmp_path / "org--model")
    assert first["downloaded"] is True and first["bytes"] == sum(map(len, FILES.values()))
    assert second["downloaded"] is False and second["bytes"] == first["bytes"]
    assert dict(hub.downloads) == {("org/model", name): 1 for name in FILES}
    assert (tmp_path / "org--model" / "model-00001.safetensors").read_bytes() == FILES["model-00001.safetensors"]


def test_concurrent_pods_on_one_node_share_one_download(tmp_path: Path) -> None:
    with FakeHub({"org/model": FILES}, token="hf_test") as hub:
        results: list[dict] = []
        threads = [threading.Thread(target=lambda: results.append(weights.fill(source(hub), tmp_path / "m")))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(r["downloaded"] for r in results) == [False, False, False, True]
    assert set(hub.downloads.values()) == {1}


def test_an_interrupted_fill_resumes_with_the_missing_files_only(tmp_path: Path) -> None:
    directory = tmp_path / "m"
    directory.mkdir()
    (directory / "config.json").write_bytes(FILES["config.json"])
    with FakeHub({"org/model": FILES}, token="hf_test") as hub:
        outcome = weights.fill(source(hub), directory)
    assert outcome["downloadedFiles"] == 1 and hub.downloads == {("org/model", "model-00001.safetensors"): 1}


@pytest.mark.parametrize(("token", "repo", "expected"), [
    (None, "org/model", "401 from the hub for org/model@main: the token is missing or wrong"),
    ("hf_test", "org/other", "404 from the hub for org/other@main"),
])
def test_failures_say_what_is_wrong_and_leave_no_marker(tmp_path: Path, token, repo, expected,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "termination"
    with FakeHub({"org/model": FILES}, token="hf_test") as hub:
        monkeypatch.setenv("HYBRIDSERVING_WEIGHTS_REPO", repo)
        monkeypatch.setenv("HYBRIDSERVING_WEIGHTS_DIR", str(tmp_path / "m"))
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HYBRIDSERVING_TERMINATION_LOG", str(log))
        if token:
            monkeypatch.setenv("HF_TOKEN", token)
        else:
            monkeypatch.delenv("HF_TOKEN", raising=False)
        assert weights.main([]) == 1
    assert log.read_text().startswith(expected)
    assert not (tmp_path / "m" / weights.COMPLETE).exists()


def test_success_writes_the_outcome_as_the_termination_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "termination"
    with FakeHub({"org/model": FILES}, token="hf_test") as hub:
        for key, value in {"HYBRIDSERVING_WEIGHTS_REPO": "org/model", "HYBRIDSERVING_WEIGHTS_DIR": str(tmp_path / "m"),
                           "HF_ENDPOINT": hub.endpoint, "HF_TOKEN": "hf_test",
                           "HYBRIDSERVING_TERMINATION_LOG": str(log)}.items():
            monkeypatch.setenv(key, value)
        assert weights.main([]) == 0
    outcome = json.loads(log.read_text())
    assert outcome["downloaded"] is True and outcome["files"] == 2
