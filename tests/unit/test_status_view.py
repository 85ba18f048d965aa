"""The on-call view renders every fact an engineer needs from the objects' status."""

from __future__ import annotations

import io

from hybridserving.commands.status import render

HS = {
    "metadata": {"name": "flex", "generation": 3, "uid": "u1"},
    "status": {
        "observedGeneration": 3,
        "ready": "True",
        "prefill": {"summary": "1/1"},
        "decode": {"summary": "2/2"},
        "capacity": {"summary": "2.10M tokens per decode instance, 4.20M in 2"},
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "AllInstancesReady", "message": "prefill 1/1, decode 2/2"},
            {"type": "RoleSwitching", "status": "True", "reason": "Switching", "message": "switching: flex-2"},
        ],
        "switches": [
            {"instance": "flex-2", "fromRole": "prefill", "toRole": "decode", "mode": "in-place",
             "outcome": "Succeeded", "started": "2026-01-01T00:00:00Z", "reason": "decode KV 93%"},
        ],
    },
}
INSTANCES = [
    {"metadata": {"name": "flex-1"}, "spec": {"index": 1, "role": "decode", "nodes": 1},
     "status": {"role": "decode", "phase": "Ready", "readyPods": 1, "nodeNames": ["gpu-3"]}},
    {"metadata": {"name": "flex-0"}, "spec": {"index": 0, "role": "prefill", "nodes": 1},
     "status": {"role": "prefill", "phase": "Draining", "readyPods": 1, "nodeNames": ["gpu-0"]}},
]


def test_render_shows_instances_in_index_order_with_roles_phases_and_switches() -> None:
    out = io.StringIO()
    render(HS, INSTANCES, out)
    text = out.getvalue()
    assert "flex  ready=True  prefill 1/1  decode 2/2" in text
    assert "KV capacity: 2.10M tokens" in text
    assert text.index("flex-0") < text.index("flex-1")
    assert "Draining" in text and "gpu-3" in text
    assert "RoleSwitching" in text and "switching: flex-2" in text
    assert "in-place" in text and "decode KV 93%" in text


def test_render_shows_the_step_of_a_switch_in_progress_and_how_one_ended() -> None:
    refused = {"instance": "flex-1", "fromRole": "decode", "toRole": "prefill", "mode": "in-place",
               "outcome": "Refused", "started": "2026-01-01T00:10:00Z", "finished": "2026-01-01T00:10:20Z",
               "reason": "prefill queue 1.3",
               "phase": "Refused: --enable-pd-role-switch is not set (Unroute 0.1 s, Drain 12.0 s, Switch 0.2 s)"}
    running = {"instance": "flex-0", "fromRole": "prefill", "toRole": "decode", "mode": "relaunch",
               "outcome": "InProgress", "started": "2026-01-01T00:20:00Z", "reason": "on-call", "phase": "Drain"}
    hs = {**HS, "status": {**HS["status"], "switches": [*HS["status"]["switches"], refused, running]}}
    out = io.StringIO()
    render(hs, INSTANCES, out)
    lines = out.getvalue().splitlines()
    assert any("DETAIL" in line for line in lines)
    [done] = [line for line in lines if "prefill queue 1.3" in line]
    assert done.endswith("Refused: --enable-pd-role-switch is not set (Unroute 0.1 s, Drain 12.0 s, Switch 0.2 s)")
    [step] = [line for line in lines if "on-call" in line]
    assert step.rstrip().endswith("Drain") and "InProgress" in step


def test_render_marks_the_surge_instances_of_a_rollout() -> None:
    surge = {"metadata": {"name": "flex-3", "labels": {"hybridserving.io/surge": "true"}},
             "spec": {"index": 3, "role": "decode", "nodes": 1}, "status": {"role": "decode", "phase": "Starting"}}
    out = io.StringIO()
    render(HS, [*INSTANCES, surge], out)
    [row] = [line for line in out.getvalue().splitlines() if "flex-3" in line]
    assert "decode (surge)" in row and "flex-1" not in row
    assert "(surge)" not in next(line for line in out.getvalue().splitlines() if "flex-1" in line)


def test_render_without_status_says_so_instead_of_failing() -> None:
    out = io.StringIO()
    render({"metadata": {"name": "new", "generation": 1}}, [], out)
    assert "ready=Unknown" in out.getvalue() and "no role switches yet" in out.getvalue()


def test_render_has_a_rollout_line_with_the_revisions_and_what_holds_it() -> None:
    hs = {**HS, "status": {**HS["status"], "rollout": {  # type: ignore[dict-item]
        "currentRevision": "flex-aaa", "updateRevision": "flex-bbb", "lastGoodRevision": "flex-aaa",
        "updated": {"prefill": 1, "decode": 1}, "held": "Canary",
        "message": "held by canary 1: prefill 1/1, decode 1/2 updated"}}}
    out = io.StringIO()
    render(hs, INSTANCES, out)
    line = next(row for row in out.getvalue().splitlines() if "Rollout" in row)
    assert "[held: Canary]" in line and "held by canary 1" in line
    assert "update flex-bbb" in line and "current flex-aaa" in line and "last good flex-aaa" in line


def test_render_has_a_weights_line_with_the_download_progress_when_known() -> None:
    def line(weights: dict) -> str:
        out = io.StringIO()
        render({**HS, "status": {**HS["status"], "weights": weights}}, INSTANCES, out)
        return next(x for x in out.getvalue().splitlines() if "Weights:" in x)

    base = {"source": "hf://org/m", "nodesReady": 1, "nodesFilling": 1, "nodesFailed": 0}
    assert line({**base, "bytesDone": 1_500_000_000, "bytesTotal": 2_000_000_000}).endswith(
        "hf://org/m  1 node(s) ready, 1 filling, 0 failed; 75% (1.5 GB of 2.0 GB)")
    assert line(base).endswith("; progress unknown")
    assert "last error gpu-1: 503" in line({**base, "nodesFailed": 1, "errors": ["gpu-1: 503 from the hub"]})


def test_a_fleet_being_deleted_is_terminating_and_its_status_what_was_last_written() -> None:
    """The operator stops reconciling a fleet once it is being deleted: the Ready True it wrote
    before is no longer the fleet's state."""
    deleting = {**HS, "metadata": {**HS["metadata"], "deletionTimestamp": "2026-02-03T04:05:06Z",
                                   "finalizers": ["example.com/backup", "foregroundDeletion"]}}
    out = io.StringIO()
    render(deleting, INSTANCES, out)
    lines = out.getvalue().splitlines()
    assert lines[:3] == [
        "flex  Terminating since 2026-02-03T04:05:06Z (finalizers: example.com/backup, foregroundDeletion)  "
        "generation 3",
        "  last written before the deletion, no longer updated: ready=True  prefill 1/1  decode 2/2 "
        "(observed generation 3)",
        "  KV capacity: 2.10M tokens per decode instance, 4.20M in 2",
    ]
    conditions = lines.index("  conditions as last written before the deletion:")
    assert lines[conditions + 1].startswith("    Ready         True    AllInstancesReady: ")
    assert lines[conditions + 2].startswith("    RoleSwitching True    Switching: ")
    assert not any(line.startswith("flex  ready=") for line in lines)

    del deleting["metadata"]["finalizers"]
    out = io.StringIO()
    render(deleting, [], out)
    assert out.getvalue().startswith("flex  Terminating since 2026-02-03T04:05:06Z  generation 3\n")
