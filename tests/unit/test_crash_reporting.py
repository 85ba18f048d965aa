"""Engine crashes where people look: instance status, an Event, the fleet's Degraded condition
and the gauges the crash-loop alert reads, from what the kubelet reports on the pods.

The kubelet side (restart counts, CrashLoopBackOff, the FallbackToLogsOnError message) is the
pod runner's, checked here on its message rule; the whole chain runs in
tests/e2e/test_crash_loop_e2e.py.
"""

from __future__ import annotations

import pathlib
import time

from hybridserving.api.v1alpha1 import INSTANCE_KIND, KIND
from hybridserving.controller import reconcile as rec
from hybridserving.core.observed import CRASH_LOOP_MEMORY_SECONDS, ObservedPod, describe_termination, parse_time
from hybridserving_engine.podrunner.runner import rfc3339, termination_message

from support.apiserver import NS, MemoryApi
from support.fleets import SPEC, settle

LAST_LINE = ("engine crash loop: 5 consecutive engine failures, last exit status 3; "
             "exiting so that the container restarts")


def crash_looping(pod: dict, restarts: int = 3) -> None:
    pod["status"]["containerStatuses"] = [{
        "name": "engine", "ready": False, "restartCount": restarts,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 3, "reason": "Error", "message": f"starting\n{LAST_LINE}"}},
    }]
    pod["status"]["conditions"] = [{"type": "Ready", "status": "False"}]


def _sample(name: str, label_names, labels) -> float | None:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, dict(zip(label_names, labels, strict=True)))


def fleet_with_a_crash_loop() -> tuple[MemoryApi, dict]:
    """A settled fleet whose fleet-1 pod crash-loops, after one reconcile has seen it."""
    api = MemoryApi()
    api.user_apply(SPEC)
    settle(api)
    pod = api.store[("Pod", "fleet-1-0")]
    crash_looping(pod)
    rec.reconcile(api, NS, "fleet")
    return api, pod


def test_a_crash_looping_pod_turns_its_instance_to_crash_loop_with_the_last_exit() -> None:
    api, pod = fleet_with_a_crash_loop()

    inst = api.store[(INSTANCE_KIND, "fleet-1")]["status"]
    assert inst["phase"] == "CrashLoop" and inst["restarts"] == 3
    assert inst["lastExit"] == f"exit code 3 (Error): {LAST_LINE}"
    degraded = api.condition("Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "CrashLoop"
    assert "fleet-1 is crash looping (exit code 3 (Error)" in degraded["message"]
    events = [o for (k, _), o in api.store.items() if k == "Event" and o["reason"] == "CrashLoop"]
    assert sorted(e["involvedObject"]["kind"] for e in events) == [KIND, INSTANCE_KIND], "one on each"
    events = [e for e in events if e["involvedObject"]["kind"] == INSTANCE_KIND]
    assert events[0]["type"] == "Warning"
    assert events[0]["involvedObject"]["name"] == "fleet-1" and LAST_LINE in events[0]["message"]
    assert _sample("hybridserving_instance_crash_looping", ("namespace", "hybridserving", "hybridserving_instance"),
                   (NS, "fleet", "fleet-1")) == 1
    assert _sample("hybridserving_instance_restarts", ("namespace", "hybridserving", "hybridserving_instance"),
                   (NS, "fleet", "fleet-1")) == 3
    assert _sample("hybridserving_instance_crash_looping", ("namespace", "hybridserving", "hybridserving_instance"),
                   (NS, "fleet", "fleet-0")) == 0
    assert _sample("hybridserving_fleet_condition", ("namespace", "hybridserving", "type", "status"),
                   (NS, "fleet", "Degraded", "True")) == 1

    # Still looping: no second Event. Running again: Ready, the restarts and the last exit stay.
    rec.reconcile(api, NS, "fleet")
    assert len([o for (k, _), o in api.store.items() if k == "Event" and o["reason"] == "CrashLoop"]) == 2
    pod["status"]["containerStatuses"][0]["state"] = {"running": {}}
    pod["status"]["containerStatuses"][0]["ready"] = True
    pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    rec.reconcile(api, NS, "fleet")
    inst = api.store[(INSTANCE_KIND, "fleet-1")]["status"]
    assert inst["phase"] == "Ready" and inst["restarts"] == 3 and inst["lastExit"].startswith("exit code 3")
    assert api.condition("Degraded")["status"] == "False"
    assert _sample("hybridserving_instance_crash_looping", ("namespace", "hybridserving", "hybridserving_instance"),
                   (NS, "fleet", "fleet-1")) == 0


def between_exits(pod: dict, finished_at: str) -> None:
    """The kubelet restarted the container after its back-off: it runs and loads, not Ready yet."""
    status = pod["status"]["containerStatuses"][0]
    status["state"] = {"running": {"startedAt": finished_at}}
    status["lastState"]["terminated"]["finishedAt"] = finished_at


def test_a_crash_loop_stays_reported_while_the_engine_runs_between_two_exits() -> None:
    api, pod = fleet_with_a_crash_loop()
    assert api.condition("Degraded")["reason"] == "CrashLoop"

    between_exits(pod, rfc3339(time.time() - 5))
    rec.reconcile(api, NS, "fleet")
    assert api.store[(INSTANCE_KIND, "fleet-1")]["status"]["phase"] == "CrashLoop"
    degraded = api.condition("Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "CrashLoop", degraded
    assert api.condition("Ready")["status"] == "False"
    assert len([o for (k, _), o in api.store.items() if k == "Event" and o["reason"] == "CrashLoop"]) == 2

    # Past the kubelet's back-off memory without another exit, it is a starting engine again.
    between_exits(pod, rfc3339(time.time() - CRASH_LOOP_MEMORY_SECONDS - 5))
    rec.reconcile(api, NS, "fleet")
    assert api.store[(INSTANCE_KIND, "fleet-1")]["status"]["phase"] == "Starting"
    assert api.condition("Degraded")["status"] == "False"


def test_a_deleted_fleet_leaves_no_series_behind() -> None:
    api = MemoryApi()
    api.user_apply(SPEC, name="gone")
    rec.reconcile(api, NS, "gone")
    labels = ("namespace", "hybridserving", "type", "status")
    assert _sample("hybridserving_fleet_condition", labels, (NS, "gone", "Ready", "False")) == 1
    del api.store[(KIND, "gone")]
    rec.reconcile(api, NS, "gone")
    assert _sample("hybridserving_fleet_condition", labels, (NS, "gone", "Ready", "False")) is None


def test_observed_pods_read_the_kubelets_crash_loop() -> None:
    body = {"metadata": {"name": "p"}, "status": {}}
    crash_looping(body, restarts=7)
    pod = ObservedPod.from_manifest(body)
    assert pod.restarts == 7 and pod.crash_looping
    assert pod.last_exit == f"exit code 3 (Error): {LAST_LINE}"
    assert describe_termination({"exitCode": 137, "reason": "OOMKilled"}) == "exit code 137 (OOMKilled)"
    assert not ObservedPod.from_manifest({"metadata": {"name": "q"}}).crash_looping

    between_exits(body, "2026-01-01T00:00:00Z")
    exited = parse_time("2026-01-01T00:00:00Z")
    assert exited is not None
    assert ObservedPod.from_manifest(body, now=exited + 30).crash_looping
    assert not ObservedPod.from_manifest(body, now=exited + CRASH_LOOP_MEMORY_SECONDS).crash_looping
    assert not ObservedPod.from_manifest(body).crash_looping  # no clock: only the waiting reason counts
    body["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    assert not ObservedPod.from_manifest(body, now=exited + 30).crash_looping  # serving again


def test_the_pod_runner_reports_the_logs_tail_as_the_kubelet_does(tmp_path: pathlib.Path) -> None:
    log = tmp_path / "container.log"
    log.write_text("".join(f"line {i}\n" for i in range(500)) + LAST_LINE + "\n")
    fallback = {"terminationMessagePolicy": "FallbackToLogsOnError"}
    message = termination_message(fallback, 3, log)
    assert message.endswith(LAST_LINE) and len(message.splitlines()) <= 80 and len(message) <= 2048
    assert termination_message(fallback, 0, log) == ""  # a clean exit keeps no message
    assert termination_message({}, 3, log) == ""  # the default policy reads /dev/termination-log only
    assert termination_message(fallback, 3, tmp_path / "missing.log") == ""


def test_an_init_container_that_keeps_failing_is_a_crash_loop_naming_it() -> None:
    """The weights fill failing on a refused download holds the pod before the engine starts."""
    api = MemoryApi()
    api.user_apply(SPEC)
    settle(api)
    pod = api.store[("Pod", "fleet-1-0")]
    pod["status"] = {
        "phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}],
        "initContainerStatuses": [{
            "name": "weights", "restartCount": 6,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s restarting"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": "401 Unauthorized"}}}],
        "containerStatuses": [{"name": "engine", "restartCount": 0,
                               "state": {"waiting": {"reason": "PodInitializing"}}}],
    }
    rec.reconcile(api, NS, "fleet")
    assert api.store[(INSTANCE_KIND, "fleet-1")]["status"]["phase"] == "CrashLoop"
    degraded = api.condition("Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "CrashLoop"
    assert "fleet-1 is crash looping (init container weights: exit code 1 (Error): 401 Unauthorized)" in \
        degraded["message"]


def test_a_crash_loop_during_a_switch_phase_still_makes_the_fleet_degraded() -> None:
    """The instance shows its switch phase (the role-switch controller's), but an engine that
    crash-loops after a relaunch is a fleet in trouble now, not when the switch times out."""
    api, pod = fleet_with_a_crash_loop()
    api.store[(INSTANCE_KIND, "fleet-1")]["status"]["phase"] = "Relaunching"
    rec.reconcile(api, NS, "fleet")
    degraded = api.condition("Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "CrashLoop"
    assert "fleet-1 is crash looping" in degraded["message"]
