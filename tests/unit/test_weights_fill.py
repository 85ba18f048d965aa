"""The node-cache fill against a hub on loopback: once per node, resumable, errors in words."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from hybridserving.contract import WEIGHTS_PROGRESS_PATH
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


class NotAHub:
    """A mirror or proxy that answers 200 with what the hub would not: an HTML page for the file
    list, a chunked body that breaks off for a file."""

    def __enter__(self) -> str:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if "/api/models/org/garbage/" in self.path:  # no HTTP at all
                    self.wfile.write(b"garbage\r\n\r\n")
                    self.close_connection = True
                elif "/api/models/org/html/" in self.path:
                    body = b"<html>Sign in to continue</html>"
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                elif "/api/models/" in self.path:
                    body = json.dumps({"siblings": [{"rfilename": "model.safetensors"}]}).encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                else:  # one chunk of a longer body, then the connection goes
                    self.send_response(200)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    self.wfile.write(b"1000\r\n" + b"x" * 100)
                    self.wfile.flush()
                    self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(("repo", "expected"), [
    ("org/html", "did not answer the file list of org/html@main as the hub's API does (JSONDecodeError"),
    ("org/cut", "model.safetensors: the download broke off after 100 bytes: IncompleteRead("),
    ("org/garbage", "did not answer as an HTTP server: BadStatusLine("),
])
def test_a_server_that_is_not_the_hub_is_a_failure_in_words_not_a_traceback(
        tmp_path: Path, repo: str, expected: str, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "termination"
    with NotAHub() as endpoint:
        for key, value in {"HYBRIDSERVING_WEIGHTS_REPO": repo, "HYBRIDSERVING_WEIGHTS_DIR": str(tmp_path / "m"),
                           "HF_ENDPOINT": endpoint, "HYBRIDSERVING_TERMINATION_LOG": str(log)}.items():
            monkeypatch.setenv(key, value)
        assert weights.main([]) == 1
    assert expected in log.read_text(), log.read_text()
    assert not (tmp_path / "m" / weights.COMPLETE).exists()
    assert not (tmp_path / "m" / "model.safetensors").exists(), "only a whole file is put in place"


def test_a_torn_completion_marker_is_no_completion(tmp_path: Path) -> None:
    directory = tmp_path / "m"
    directory.mkdir()
    (directory / weights.COMPLETE).write_text('{"repo": "org/mo')  # an older version's write, cut short
    with FakeHub({"org/model": FILES}, token="hf_test") as hub:
        outcome = weights.fill(source(hub), directory)
    assert outcome["downloaded"] is True and outcome["files"] == 2
    assert json.loads((directory / weights.COMPLETE).read_text())["files"] == 2
    assert not list(directory.glob("*.tmp")), "written aside, then renamed"


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


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def read_progress(port: int) -> dict | None:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{WEIGHTS_PROGRESS_PATH}", timeout=1) as r:
            return json.load(r)
    except (urllib.error.URLError, OSError):
        return None


def test_a_running_fill_serves_its_progress_on_the_launcher_port_and_a_waiting_pod_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    total = sum(map(len, FILES.values()))
    directory = tmp_path / "m"
    port, waiting_port = free_port(), free_port()
    seen: list[dict] = []
    with FakeHub({"org/model": FILES}, token="hf_test", bytes_per_second=200_000) as hub:
        for key, value in {"HYBRIDSERVING_WEIGHTS_REPO": "org/model", "HYBRIDSERVING_WEIGHTS_DIR": str(directory),
                           "HF_ENDPOINT": hub.endpoint, "HF_TOKEN": "hf_test",
                           "HYBRIDSERVING_LAUNCHER_HOST": "127.0.0.1", "HYBRIDSERVING_LAUNCHER_PORT": str(port),
                           "HYBRIDSERVING_TERMINATION_LOG": str(tmp_path / "termination")}.items():
            monkeypatch.setenv(key, value)
        runner = threading.Thread(target=weights.main, args=([],))
        runner.start()
        # A second pod on the node: it waits on the lock and serves the file the first one writes.
        waiting = weights.serve_progress(weights.progress_file(directory), "127.0.0.1", waiting_port)
        assert waiting is not None
        try:
            while runner.is_alive():
                doc = read_progress(port)
                if doc is not None:
                    seen.append(doc)
                    assert read_progress(waiting_port) is not None
                time.sleep(0.05)
        finally:
            runner.join()
            waiting.shutdown()
            waiting.server_close()
    config = len(FILES["config.json"])
    middle = [d for d in seen if config < d["bytesDone"] < total]
    assert middle, "progress moves within a file, not only between files"
    assert all(d["bytesTotal"] == total and d["filesTotal"] == 2 for d in middle)
    assert read_progress(port) is None, "the endpoint goes with the step (the launcher takes the port)"
    final = json.loads(weights.progress_file(directory).read_text())
    assert (final["bytesDone"], final["filesDone"]) == (total, 2)


def test_a_port_in_use_leaves_progress_unserved_and_the_fill_goes_on(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert weights.serve_progress(tmp_path / "p", "127.0.0.1", taken.getsockname()[1]) is None


def test_sizes_come_from_the_hub_listing_and_a_missing_one_leaves_the_total_unknown(tmp_path: Path) -> None:
    with FakeHub({"org/model": FILES}, token="hf_test") as hub:
        listing = source(hub).files()
    assert listing.sizes == {name: len(data) for name, data in FILES.items()}
    assert listing.commit == "0" * 40
    progress = weights.Progress(tmp_path / "p", source(hub), {"a": 3, "b": None})
    progress.write()
    assert json.loads((tmp_path / "p").read_text())["bytesTotal"] is None


def fill_fails(hub: FakeHub, directory: Path, says: str) -> None:
    with pytest.raises(weights.FetchError) as failed:
        weights.fill(source(hub), directory)
    assert says in str(failed.value), failed.value
    assert not (directory / weights.COMPLETE).exists()


@pytest.mark.parametrize("hostile", ["../victim/model.safetensors", "/cache/victim/model.safetensors",
                                     "a/../../victim/model.safetensors", "a//b", ".complete", "x.part"])
def test_a_listed_name_outside_the_copy_fails_the_fill_and_writes_nothing(tmp_path: Path, hostile: str) -> None:
    victim = tmp_path / "victim" / "model.safetensors"
    victim.parent.mkdir()
    victim.write_bytes(b"GOOD")
    with FakeHub({"org/model": {**FILES, hostile: b"EVIL"}}, token="hf_test") as hub:
        fill_fails(hub, tmp_path / "m", "listed a file name that is no path inside the copy")
    assert victim.read_bytes() == b"GOOD"
    assert not hub.downloads, "refused before any download"


def test_the_token_stays_on_the_hub_when_a_file_is_redirected_elsewhere(tmp_path: Path) -> None:
    with FakeHub({"org/model": FILES}) as cdn, FakeHub({"org/model": FILES}, token="hf_test") as hub:
        hub.redirect_to = cdn
        outcome = weights.fill(source(hub), tmp_path / "m")
    assert outcome["downloaded"] is True and sum(cdn.downloads.values()) == 2
    assert hub.authorizations and set(hub.authorizations) == {"Bearer hf_test"}
    assert cdn.authorizations == [None, None], "another origin never sees the token"


def test_every_file_comes_from_the_commit_the_listing_named_and_the_copy_records_it(tmp_path: Path) -> None:
    with FakeHub({"org/model": FILES}, token="hf_test") as hub:
        hub.sha = "a" * 40
        first = weights.fill(source(hub), tmp_path / "node-a")
        hub.sha = "b" * 40  # the branch moves
        second = weights.fill(source(hub), tmp_path / "node-b")
    assert hub.revisions == {"a" * 40: 2, "b" * 40: 2}, "never by the branch's name"
    assert (first["commit"], second["commit"]) == ("a" * 40, "b" * 40)
    assert json.loads((tmp_path / "node-a" / weights.COMPLETE).read_text())["commit"] == "a" * 40


def test_a_listing_with_no_files_completes_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "m"
    directory.mkdir()
    (directory / "config.json").write_bytes(b"{}")  # an earlier attempt's
    with FakeHub({"org/model": {}}, token="hf_test") as hub:
        fill_fails(hub, directory, "no files listed")


def test_a_file_left_short_is_fetched_again_and_a_short_download_fails(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "m"
    directory.mkdir()
    (directory / "config.json").write_bytes(FILES["config.json"])
    (directory / "model-00001.safetensors").write_bytes(b"x" * 10)  # cut short by a crash
    (directory / "model-00001.safetensors.part").write_bytes(b"x")
    with FakeHub({"org/model": FILES}, token="hf_test") as hub:
        outcome = weights.fill(source(hub), directory)
        assert outcome["downloadedFiles"] == 1
        assert (directory / "model-00001.safetensors").read_bytes() == FILES["model-00001.safetensors"]
        assert not list(directory.rglob("*.part")), "an earlier attempt's leftovers go"
        listed = weights.Source.files
        monkeypatch.setattr(weights.Source, "files", lambda self: weights.Listing(
            {name: size + 1 for name, size in listed(self).sizes.items()}, None))
        fill_fails(hub, tmp_path / "other", f"got {len(FILES['config.json'])} of {len(FILES['config.json']) + 1}")


def test_a_copy_that_cannot_fit_fails_before_it_downloads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    with FakeHub({"org/model": FILES}, token="hf_test") as hub:
        fill_fails(hub, tmp_path / "m", "the node cache has 0.0 GB free and the copy needs 0.0 GB more")
    assert not hub.downloads


def test_a_cache_this_user_cannot_write_says_how_to_create_it_and_a_finished_copy_needs_no_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    with FakeHub({"org/model": FILES}, token="hf_test") as hub:
        weights.fill(source(hub), tmp_path / "done")
        real_open = os.open

        def refused(path, flags, *args):  # what a root-owned hostPath does to uid 65532
            if str(path).endswith(".lock"):
                raise PermissionError(13, "Permission denied", str(path))
            return real_open(path, flags, *args)

        monkeypatch.setattr(os, "open", refused)
        assert weights.fill(source(hub), tmp_path / "done")["downloaded"] is False
        fill_fails(hub, tmp_path / "m", "the node cache is not writable by this pod's user")
    with pytest.raises(weights.FetchError, match="install -d -o 65532"):
        weights.fill(source(hub), tmp_path / "m")
