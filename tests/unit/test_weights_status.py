"""`status.weights` while node caches fill: the fill steps' progress read from their pods, summed per fleet."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest

from hybridserving.api.weights import WeightsSpec
from hybridserving.contract import ENV_LAUNCHER_PORT
from hybridserving.controller import reconcile as rec
from hybridserving.controller.engines import Engines
from hybridserving.core import weights
from hybridserving.core.privileges import EnginePolicy
from hybridserving.core.observed import ObservedPod
from hybridserving.core.weights import FillProgress
from support.apiserver import NS, MemoryApi
from support.fleets import SPEC

HF = WeightsSpec.model_validate({"uri": "hf://org/model", "cache": "Node"})
NODE_CACHE = EnginePolicy(allow_node_cache=True)  # what the chart's enginePolicy.allowNodeCache grants


def pod_manifest(name: str, node: str, state: dict[str, Any] | None, *, ip: str | None = "10.0.0.1",
                 port: str | None = "28000", copy: str = weights.copy_directory(HF),
                 deleting: bool = False) -> dict[str, Any]:
    env = [{"name": "HYBRIDSERVING_WEIGHTS_REPO", "value": "org/model"}, {"name": weights.COPY_ENV, "value": copy}]
    if port is not None:
        env.append({"name": ENV_LAUNCHER_PORT, "value": port})
    status: dict[str, Any] = {"initContainerStatuses": [{"name": "weights", "state": state}] if state else []}
    if ip:
        status["podIP"] = ip
    meta: dict[str, Any] = {"name": name, **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {})}
    return {"metadata": meta, "spec": {"nodeName": node, "initContainers": [
        {"name": "weights", "env": env}]}, "status": status}


def filled(bytes_: int, commit: str | None = None) -> dict[str, Any]:
    done = {"bytes": bytes_, "downloaded": True, **({"commit": commit} if commit else {})}
    return {"terminated": {"exitCode": 0, "message": json.dumps(done)}}


FAILED: dict[str, Any] = {"terminated": {"exitCode": 1, "message": "404 from the hub for org/model@typo"}}


RUNNING: dict[str, Any] = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}


def pods(*manifests: dict[str, Any]) -> list[ObservedPod]:
    return [ObservedPod.from_manifest(m) for m in manifests]


def test_progress_parses_figures_and_refuses_anything_else() -> None:
    assert FillProgress.parse({"bytesDone": 5, "bytesTotal": 10}) == FillProgress(5, 10)
    assert FillProgress.parse({"bytesDone": 5, "bytesTotal": None}) == FillProgress(5, None)
    for doc in ({}, {"bytesDone": "5"}, {"bytesDone": -1}, {"bytesDone": True}, {"bytesDone": 11, "bytesTotal": 10},
                {"bytesDone": 1, "bytesTotal": 2.5}, {"status": "ok"}):
        assert FillProgress.parse(doc) is None, doc


def test_only_a_running_fill_that_names_its_port_is_asked() -> None:
    assert weights.progress_address(pod_manifest("a", "n", RUNNING)) == ("10.0.0.1", 28000)
    assert weights.progress_address(pod_manifest("a", "n", {"waiting": {"reason": "CrashLoopBackOff"}})) is None
    assert weights.progress_address(pod_manifest("a", "n", filled(10))) is None
    assert weights.progress_address(pod_manifest("a", "n", RUNNING, ip=None)) is None
    assert weights.progress_address(pod_manifest("a", "n", RUNNING, port=None)) is None, "rendered before it served"


def test_the_fill_step_serves_progress_on_the_launcher_port() -> None:
    from hybridserving.api.v1alpha1 import HybridServingSpec

    spec = HybridServingSpec.model_validate({**SPEC, "model": {**SPEC["model"], "weights": {
        "uri": "hf://org/model", "cache": "Node"}}})
    (fill,) = weights.render(spec, 28003).init_containers
    assert {"name": ENV_LAUNCHER_PORT, "value": "28003"} in fill["env"]


def test_fleet_progress_adds_up_the_nodes_whose_figures_are_known() -> None:
    observed = pods(
        pod_manifest("ready-0", "node-a", filled(1000)),
        pod_manifest("fill-0", "node-b", RUNNING),
        pod_manifest("fill-1", "node-b", RUNNING, ip="10.0.0.2"),  # waits on node-b's lock, same download
        pod_manifest("silent-0", "node-c", RUNNING, ip="10.0.0.3"),  # did not answer
    )
    said = {"fill-0": FillProgress(250, 1000), "fill-1": FillProgress(300, 1000)}
    status = weights.summarize(HF, observed, said)
    assert (status["nodesReady"], status["nodesFilling"]) == (1, 2)
    assert (status["bytesDone"], status["bytesTotal"]) == (1300, 2000), "node-c is left out of both"
    assert status["bytes"] == 1000


def test_progress_is_unknown_without_a_figure_and_the_size_falls_back_to_the_spec() -> None:
    filling = pods(pod_manifest("fill-0", "node-b", RUNNING))
    status = weights.summarize(HF, filling, {})
    assert status["bytesDone"] is None and status["bytesTotal"] is None
    status = weights.summarize(HF, filling, {"fill-0": FillProgress(40, None)})
    assert status["bytesDone"] is None, "no total from the hub and none in the spec"
    sized = HF.model_copy(update={"size_bytes": 100})
    status = weights.summarize(sized, filling, {"fill-0": FillProgress(40, None)})
    assert (status["bytesDone"], status["bytesTotal"]) == (40, 100)
    done = weights.summarize(HF, pods(pod_manifest("ready-0", "node-a", filled(1000)),
                                      pod_manifest("ready-1", "node-b", filled(1000))))
    assert (done["bytesDone"], done["bytesTotal"]) == (2000, 2000)


def test_only_pods_that_fill_the_copy_the_spec_names_count() -> None:
    typo = HF.model_copy(update={"revision": "typo"})
    observed = pods(
        pod_manifest("old-0", "node-a", filled(1000)),  # the earlier revision's copy, filled
        pod_manifest("new-0", "node-a", FAILED, copy=weights.copy_directory(typo)),
        pod_manifest("going-0", "node-b", filled(1000), copy=weights.copy_directory(typo), deleting=True),
    )
    status = weights.summarize(typo, observed)
    assert (status["nodesReady"], status["nodesFailed"]) == (0, 1)
    assert status["errors"] == ["node-a: 404 from the hub for org/model@typo"]
    assert rec.weights_warnings({"nodesFailed": 0}, status)[0][0] == "WeightsFailed"


def test_nodes_holding_different_commits_are_counted_and_warned_once() -> None:
    same = weights.summarize(HF, pods(pod_manifest("a-0", "node-a", filled(1000, "a" * 40)),
                                      pod_manifest("b-0", "node-b", filled(1000, "a" * 40))))
    moved = weights.summarize(HF, pods(pod_manifest("a-0", "node-a", filled(1000, "a" * 40)),
                                       pod_manifest("b-0", "node-b", filled(1000, "b" * 40))))
    assert (same["commits"], moved["commits"]) == (1, 2)
    assert rec.weights_warnings(same, same) == ()
    ((reason, message),) = rec.weights_warnings(same, moved)
    assert reason == "WeightsCommitsDiffer" and "set spec.model.weights.revision to one commit" in message
    assert rec.weights_warnings(moved, moved) == (), "said once, not on every pass"


def test_a_node_cache_on_a_branch_is_warned_at_admission_and_a_commit_is_not() -> None:
    spec = spec_with(HF)
    (issue,) = [i for i in weights.check(spec) if i.rule == "weights-revision-unpinned"]
    assert issue.path == "spec.model.weights.revision" and "40-character commit" in issue.fix
    pinned = spec_with(HF.model_copy(update={"revision": "c" * 40}))
    assert not [i for i in weights.check(pinned) if i.rule == "weights-revision-unpinned"]


def spec_with(w: WeightsSpec) -> Any:
    from hybridserving.api.v1alpha1 import HybridServingSpec

    weighted = {**SPEC["model"], "weights": w.model_dump(by_alias=True)}
    return HybridServingSpec.model_validate({**SPEC, "model": weighted})


# --------------------------------------------------------------------------- through the reconcile


@pytest.fixture
def filling() -> MemoryApi:
    """A node-cache fleet whose pods all run their fill step."""
    api = MemoryApi()
    api.user_apply({**SPEC, "model": {**SPEC["model"], "weights": {"uri": "hf://org/model", "cache": "Node"}}})
    while not any(kind == "Pod" for kind, _ in api.store):  # instances first, their pods next pass
        rec.reconcile(api, NS, "fleet", engine_policy=NODE_CACHE)
    for i, ((kind, _), obj) in enumerate(sorted(api.store.items())):
        if kind == "Pod":
            obj["spec"]["nodeName"] = f"node-{i}"
            obj["status"] = {"phase": "Pending", "podIP": f"10.0.0.{i}",
                             "initContainerStatuses": [{"name": "weights", "state": RUNNING}]}
    return api


def test_the_reconcile_asks_running_fills_and_writes_the_fleets_progress(filling: MemoryApi) -> None:
    asked: list[Mapping[str, tuple[str, int]]] = []

    def probe(targets: Mapping[str, tuple[str, int]]) -> dict[str, FillProgress]:
        asked.append(dict(targets))
        return {name: FillProgress(10, 100) for name in targets}

    outcome = rec.reconcile(filling, NS, "fleet", engine_policy=NODE_CACHE, fill_probe=probe)
    (targets,) = asked
    assert len(targets) == 4 and all(port == 28000 for _, port in targets.values())
    status = filling.status()["weights"]
    assert (status["nodesFilling"], status["bytesDone"], status["bytesTotal"]) == (4, 40, 400)
    assert outcome.requeue_after == rec.WEIGHTS_PROGRESS_SECONDS, "progress is read again soon"


def test_one_pod_per_node_is_asked(filling: MemoryApi) -> None:
    for (kind, _), obj in filling.store.items():
        if kind == "Pod":
            obj["spec"]["nodeName"] = "node-shared"
    asked: list[Mapping[str, tuple[str, int]]] = []
    rec.reconcile(filling, NS, "fleet", engine_policy=NODE_CACHE, fill_probe=lambda t: asked.append(dict(t)) or {})
    assert [len(t) for t in asked] == [1]


def test_a_failing_probe_leaves_the_figures_unknown_and_nothing_else(filling: MemoryApi) -> None:
    rec.reconcile(filling, NS, "fleet", engine_policy=NODE_CACHE,
                  fill_probe=lambda t: {n: FillProgress(10, 100) for n in t})
    before = {k: v for k, v in filling.status().items() if k != "weights"}

    def broken(targets: Mapping[str, tuple[str, int]]) -> dict[str, FillProgress]:
        raise RuntimeError("boom")

    outcome = rec.reconcile(filling, NS, "fleet", engine_policy=NODE_CACHE, fill_probe=broken)
    status = filling.status()
    assert "bytesDone" not in status["weights"] and "bytesTotal" not in status["weights"], "cleared, not stale"
    assert status["weights"]["nodesFilling"] == 4
    assert {k: v for k, v in status.items() if k != "weights"} == before
    assert not outcome.errors


def test_engines_read_progress_and_count_silence_as_unknown() -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    answers = {"/weights": (200, {"bytesDone": 7, "bytesTotal": 9})}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            code, doc = answers.get(self.path, (404, {}))
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    engines = Engines(timeout=1.0)
    try:
        port = server.server_address[1]
        got = engines.fill_progress_many({"up": ("127.0.0.1", port), "closed": ("127.0.0.1", 1)})
        assert got == {"up": FillProgress(7, 9)}
        answers["/weights"] = (200, {"something": "else"})
        assert engines.fill_progress(("127.0.0.1", port)) is None
        with socket.socket() as silent:  # accepts connections, never answers
            silent.bind(("127.0.0.1", 0))
            silent.listen(8)
            slow = Engines(timeout=10.0)
            started = time.monotonic()
            try:
                assert slow.fill_progress_many({f"p{i}": silent.getsockname() for i in range(20)}, budget=0.5) == {}
            finally:
                slow.close()
            assert time.monotonic() - started < 2.0, "silent pods cost the pass the budget, not their timeouts"
    finally:
        engines.close()
        server.shutdown()
        server.server_close()


# --------------------------------------------------------------------------- image volumes

OCI = {**SPEC, "model": {**SPEC["model"], "weights": {"uri": "oci://registry.example/models/dsv3:fp8"}}}


def test_a_cluster_that_drops_image_volumes_gets_no_engine_pod_and_is_told_the_field_and_fix() -> None:
    api = MemoryApi()
    api.image_volumes = False
    api.user_apply(OCI)
    for _ in range(3):
        outcome = rec.reconcile(api, NS, "fleet")
    assert not [n for k, n in api.store if k == "Pod"], "no engine would run without its weights"
    assert api.writes[("create-dry-run", "Pod")] >= 1
    degraded = api.condition("Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == rec.WEIGHTS_VOLUME_DROPPED
    assert "spec.model.weights.uri oci://registry.example/models/dsv3:fp8" in degraded["message"]
    assert "ImageVolume feature gate" in degraded["message"]
    events = [o for (k, _), o in api.store.items() if k == "Event" and o["reason"] == rec.WEIGHTS_VOLUME_DROPPED]
    assert len(events) == 1 and events[0]["type"] == "Warning", "said once, not every pass"
    assert outcome.errors and outcome.requeue_after is not None
    # The gate turned on: the next pass creates the pods, with their image volume.
    api.image_volumes = True
    for _ in range(3):
        rec.reconcile(api, NS, "fleet")
    created = [o for (k, _), o in api.store.items() if k == "Pod"]
    assert created and all(weights.volume_kept(p) for p in created)
    assert api.condition("Degraded")["status"] == "False"


def test_a_cluster_that_keeps_image_volumes_creates_the_pods_as_usual() -> None:
    api = MemoryApi()
    api.user_apply(OCI)
    for _ in range(3):
        rec.reconcile(api, NS, "fleet")
    created = [o for (k, _), o in api.store.items() if k == "Pod"]
    assert len(created) == 4 and all(weights.volume_kept(p) for p in created)
    assert api.condition("Degraded")["status"] == "False"
