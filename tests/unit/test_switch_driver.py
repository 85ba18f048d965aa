"""The role-switch controller (`controller.switching`) with an in-memory API, the real reconcile and fake engines.

The API is `MemoryApi` from tests/support/apiserver.py (merge patches, preconditions, status subresource). Each
tick runs the switch controller, then a reconcile pass (the planner relabels pods from the instance's
phase and role), then the fake "kubelet" and engines: each leader's launcher follows its pod's role
annotation the way the real one follows the downward-API file (drain, then switch in place or
relaunch, or refuse), and each engine reports `/v1/loads`, `/ready`, `/model_info`, `/server_info` and `/metrics`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest
from support.apiserver import NS, MemoryApi
from support.fleets import SPEC
from support.fleets import OPERATOR_KEY

from hybridserving.api.v1alpha1 import INSTANCE_KIND, KIND
from hybridserving.controller import reconcile as rec
from hybridserving.controller.engines import EngineSample, Scrape
from hybridserving.controller.kube import KubeError
from hybridserving.controller.switching import SwitchController
from hybridserving.contract import ANNOTATION_ROLE, LABEL_ROLE
from hybridserving.core import enginekey
from hybridserving.core.switching import (
    ANNOTATION_IN_PLACE_REFUSED,
    ANNOTATION_PINNED,
    ANNOTATION_SWITCH,
    ANNOTATION_SWITCH_TO,
)

FLEET_SPEC: dict[str, Any] = {
    **copy.deepcopy(SPEC),
    "roleSwitch": {"enabled": True, "minPrefill": 1, "minDecode": 1, "cooldownSeconds": 60,
                   "drainTimeoutSeconds": 20, "maxConcurrent": 1},
}
STEP_BOUNDS = {"unroute_settle_s": 2.0}


@dataclass
class FakeEngine:
    """One leader's engine and launcher."""

    role: str
    launcher_role: str
    inflight: int = 0
    healthy: bool = True
    refuse: bool = False
    fail_rebuild: bool = False  # the engine answers safe_to_restore false: the launcher relaunches itself
    switch_ticks: int = 2
    switch_count: int = 0
    last: dict[str, Any] | None = None
    pending: tuple[str, int] | None = None  # (target role, ticks left)
    handled: str = ""
    utilization: float = 0.1
    scrapes: int = 0
    busy_seconds: float = 0.0
    queue_tokens: int = 0
    kv_usage: float = 0.1
    running: int = 1
    stuck: bool = False
    log: list[str] = field(default_factory=list)

    def follow(self, annotated: str) -> None:
        """The launcher: act once on each change of the role file."""
        if annotated != self.handled:
            self.handled = annotated
            if annotated != self.launcher_role:
                self.pending = (annotated, self.switch_ticks)
        if self.pending is None:
            return
        target, left = self.pending
        if self.inflight:  # the launcher drains first
            self.inflight -= 1
            return
        if left > 0:
            self.pending = (target, left - 1)
            return
        self.pending = None
        self.switch_count += 1
        outcome = "Refused" if self.refuse else "Succeeded"
        message = "engine refused, still " + self.launcher_role if self.refuse else "fake"
        if self.fail_rebuild:
            message = f"engine relaunched as {target}"
        self.last = {"fromRole": self.launcher_role, "toRole": target, "outcome": outcome, "message": message}
        self.log.append(f"{self.launcher_role}->{target}:{outcome}" + (" (relaunch)" if self.fail_rebuild else ""))
        if outcome == "Succeeded":
            self.launcher_role = self.role = target

    def sample(self, switching: bool, scrape: bool) -> EngineSample:
        loads = {"loads": [{"num_running_reqs": self.inflight or (self.running if self.role == "decode" else 0),
                            "num_waiting_reqs": 0, "num_waiting_uncached_tokens": self.queue_tokens,
                            "token_usage": self.kv_usage, "disaggregation": {}, "queues": {"paused": 0}}]}
        if not self.inflight and self.role == "decode" and switching:
            loads["loads"][0]["num_running_reqs"] = 0
        s = EngineSample(loads=loads)
        if switching or scrape:
            s.model_info = {"disaggregation_mode": self.role}
        if switching:
            s.healthy = self.healthy
            s.launcher = {"role": self.launcher_role, "phase": "Ready" if self.pending is None else "Draining",
                          "switchCount": self.switch_count, "lastSwitch": self.last}
        if scrape:
            # One scrape a second; the GPU was busy `utilization` of it (the device-timer counter).
            self.scrapes += 1
            self.busy_seconds += self.utilization
            category = "extend" if self.role == "prefill" else "decode"
            s.scrape = Scrape(float(self.scrapes),
                              values={f"sglang:forward_execution_seconds_total:{category}": self.busy_seconds})
            s.server_info = {"disaggregation_mode": self.role, "simulator_time_scale": 1.0}
        return s


class FakeEngines:
    def __init__(self) -> None:
        self.by_ip: dict[str, FakeEngine] = {}
        self.calls = 0

    def sample_many(self, targets, api_key=None):
        self.calls += 1
        if api_key != enginekey.derive(OPERATOR_KEY, "hs-uid"):
            return {}  # the engines answer 401 to everything the controller reads
        out = {}
        for name, (engine_url, _launcher_url, switching, scrape) in targets.items():
            ip = engine_url.split("//")[1].split(":")[0]
            if ip in self.by_ip:
                out[name] = self.by_ip[ip].sample(switching, scrape)
        return out


class Harness:
    def __init__(self, spec: dict[str, Any] | None = None) -> None:
        self.api = MemoryApi()
        self.api.user_apply(copy.deepcopy(spec or FLEET_SPEC))
        self.engines = FakeEngines()
        self.leader_uids: dict[str, str] = {}
        self.now = 10_000.0
        self.ctl = self.controller()
        for _ in range(10):
            outcome = rec.reconcile(self.api, NS, "fleet")
            self.kubelet()
            if not outcome.actions:
                break

    def controller(self) -> SwitchController:
        return SwitchController(self.api, self.engines, clock=lambda: self.now, step_bounds=STEP_BOUNDS)

    def kubelet(self) -> None:
        """Pods run and are ready with an IP; each leader gets an engine following its role annotation."""
        for (kind, name), obj in self.api.store.items():
            if kind != "Pod":
                continue
            ip = "10.0.0." + name.split("-")[1]
            obj["spec"]["nodeName"] = "node-0"
            obj["status"] = {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}
            if obj["metadata"]["labels"].get("hybridserving.io/node-rank") == "0":
                role = obj["metadata"]["annotations"][ANNOTATION_ROLE]
                engine = self.engines.by_ip.setdefault(ip, FakeEngine(role, role, handled=role))
                if self.leader_uids.setdefault(ip, obj["metadata"]["uid"]) != obj["metadata"]["uid"]:
                    # A recreated pod: a fresh launcher starts the engine in the role its pod carries.
                    self.leader_uids[ip] = obj["metadata"]["uid"]
                    engine.role = engine.launcher_role = engine.handled = role
                    engine.pending, engine.switch_count, engine.last = None, 0, None
                    engine.log.append(f"started as {role}")
                if LABEL_ROLE not in obj["metadata"]["labels"] and engine.inflight and not engine.stuck:
                    engine.inflight -= 1  # out of the router: what it holds finishes, nothing new comes
                engine.follow(role)

    def tick(self, n: int = 1) -> None:
        for _ in range(n):
            self.now += 2.0
            self.ctl.tick(NS, "fleet")
            rec.reconcile(self.api, NS, "fleet")
            self.kubelet()

    def instance(self, name: str) -> dict[str, Any]:
        return self.api.store[(INSTANCE_KIND, name)]

    def leader(self, name: str) -> dict[str, Any]:
        return self.api.store[("Pod", f"{name}-0")]

    def engine(self, name: str) -> FakeEngine:
        return self.engines.by_ip["10.0.0." + name.split("-")[1]]

    def annotate(self, name: str, key: str, value: str | None) -> None:
        anns = self.instance(name)["metadata"].setdefault("annotations", {})
        if value is None:
            anns.pop(key, None)
        else:
            anns[key] = value
        self.instance(name)["metadata"]["resourceVersion"] = str(next(self.api.counter))

    def history(self) -> list[dict[str, Any]]:
        return self.api.status().get("switches") or []

    def events(self) -> list[tuple[str, str]]:
        return [(o["reason"], o["message"]) for (k, _), o in self.api.store.items() if k == "Event"]

    def reasons(self) -> list[str]:
        return [r for r, _ in self.events() if r.startswith("RoleSwitch") and r != "RoleSwitch"]  # not the reconcile's

    def run_until(self, done, limit: int = 60) -> None:
        for _ in range(limit):
            self.tick()
            if done():
                return
        raise AssertionError(f"not done; events {self.reasons()}; history {self.history()}")


def prefill_instances(h: Harness) -> list[str]:
    return sorted(n for (k, n), o in h.api.store.items() if k == INSTANCE_KIND and o["spec"]["role"] == "prefill")


@pytest.fixture
def h() -> Harness:
    return Harness()


def test_on_call_request_switches_in_place_and_records_everything(h: Harness) -> None:
    name = prefill_instances(h)[0]
    h.engine(name).inflight = 3
    h.annotate(name, ANNOTATION_SWITCH_TO, "decode")
    seen_unrouted_while_busy = False
    for _ in range(40):
        h.tick()
        if h.engine(name).inflight and LABEL_ROLE not in h.leader(name)["metadata"]["labels"]:
            seen_unrouted_while_busy = True
        if not h.instance(name)["metadata"].get("annotations", {}).get(ANNOTATION_SWITCH):
            break
    inst = h.instance(name)
    assert inst["spec"]["role"] == "decode"
    assert ANNOTATION_SWITCH_TO not in inst["metadata"]["annotations"]
    assert ANNOTATION_SWITCH not in inst["metadata"]["annotations"]
    assert inst["status"]["phase"] == "Ready" and inst["status"].get("lastSwitch")
    assert h.leader(name)["metadata"]["labels"][LABEL_ROLE] == "decode"
    assert h.leader(name)["metadata"]["annotations"][ANNOTATION_ROLE] == "decode"
    assert h.engine(name).log == ["prefill->decode:Succeeded"]
    assert seen_unrouted_while_busy, "the leader left the router before its requests were done"
    [entry] = h.history()
    assert entry["instance"] == name and entry["outcome"] == "Succeeded" and entry["mode"] == "in-place"
    assert entry["fromRole"] == "prefill" and entry["toRole"] == "decode" and entry["finished"]
    assert "Drain" in entry["phase"] and entry["reason"].startswith("on-call")
    assert h.reasons() == ["RoleSwitchStarted", "RoleSwitchUnrouted", "RoleSwitchDrained", "RoleSwitchSwitched",
                           "RoleSwitchVerified", "RoleSwitchSucceeded"]
    # The reconcile's own status fields are untouched by the history patch.
    status = h.api.status()
    assert {c["type"] for c in status["conditions"]} >= {"Ready", "RoleSwitching"}
    assert status["decode"]["summary"] == "3/3" and status["prefill"]["summary"] == "1/1"


def test_relaunch_mode_when_the_layout_forbids_in_place() -> None:
    spec = copy.deepcopy(FLEET_SPEC)
    spec["transfer"] = {"backend": "nixl"}
    h = Harness(spec)
    name = prefill_instances(h)[0]
    h.engine(name).switch_ticks = 5
    h.annotate(name, ANNOTATION_SWITCH_TO, "decode")
    phases = []
    for _ in range(40):
        h.tick()
        phases.append(h.instance(name)["status"].get("phase"))
        if h.history() and h.history()[-1]["outcome"] != "InProgress":
            break
    assert "Relaunching" in phases and "Switching" not in phases
    assert h.history()[-1]["mode"] == "relaunch" and h.history()[-1]["outcome"] == "Succeeded"


def test_a_multi_node_instance_relaunches_as_a_new_gang_in_the_new_role() -> None:
    """Relaunched on its pods, each rank's launcher would see the new role when its kubelet
    refreshed the pod's downward-API volume: a worker rank could restart in the old role beside
    a leader in the new one. A new gang's launchers all start in the new role."""
    spec = copy.deepcopy(FLEET_SPEC)
    spec["transfer"] = {"backend": "nixl"}  # no in-place switch
    for role in ("prefill", "decode"):
        spec[role] = {**spec[role], "layout": {"tp": 16}, "nodesPerInstance": 2}
    h = Harness(spec)
    name = prefill_instances(h)[0]
    uids = {rank: h.api.store[("Pod", f"{name}-{rank}")]["metadata"]["uid"] for rank in (0, 1)}
    h.annotate(name, ANNOTATION_SWITCH_TO, "decode")
    phases = []
    for _ in range(60):
        h.tick()
        phases.append(h.instance(name)["status"].get("phase"))
        for rank in (0, 1):
            pod = h.api.store.get(("Pod", f"{name}-{rank}"))
            if pod is not None and pod["metadata"]["uid"] == uids[rank]:
                assert pod["metadata"]["annotations"][ANNOTATION_ROLE] == "prefill", "an old pod never relabelled"
        if finished(h, 1):
            break
    entry = h.history()[-1]
    assert (entry["outcome"], entry["mode"]) == ("Succeeded", "relaunch"), entry
    assert entry["reason"].endswith("by relaunch (the gang is recreated as decode): its 2 ranks start the new role "
                                    "together")
    [drained] = [m for r, m in h.events() if r == "RoleSwitchDrained"]
    assert "refused" not in drained and drained.endswith("its 2 ranks start the new role together"), drained
    assert "Relaunching" in phases and "Switching" not in phases
    h.tick(2)
    for rank in (0, 1):
        pod = h.api.store[("Pod", f"{name}-{rank}")]
        assert pod["metadata"]["uid"] != uids[rank], f"rank {rank} recreated"
        assert pod["metadata"]["annotations"][ANNOTATION_ROLE] == "decode"
    assert h.instance(name)["spec"]["restartGeneration"] == 1
    assert h.engine(name).log == ["started as decode"], "the old launcher never switched"


def test_refusal_restores_the_old_role_and_records_refused(h: Harness) -> None:
    name = prefill_instances(h)[0]
    h.engine(name).refuse = True
    h.annotate(name, ANNOTATION_SWITCH_TO, "decode")
    h.run_until(lambda: h.history() and h.history()[-1]["outcome"] != "InProgress")
    assert h.instance(name)["spec"]["role"] == "prefill"
    h.tick(2)
    assert h.leader(name)["metadata"]["labels"][LABEL_ROLE] == "prefill"
    entry = h.history()[-1]
    assert entry["outcome"] == "Refused" and entry["phase"].startswith("Refused")
    assert "RoleSwitchRefused" in h.reasons() and "RoleSwitchRestored" in h.reasons()
    assert h.instance(name)["spec"]["restartGeneration"] == 0


def finished(h: Harness, count: int) -> bool:
    return len(h.history()) == count and h.history()[-1]["outcome"] != "InProgress"


@pytest.mark.parametrize("restart_operator", [False, True], ids=["one-operator", "operator-restarted-every-tick"])
def test_after_an_in_place_refusal_the_next_switch_of_the_instance_relaunches_and_completes(
        h: Harness, restart_operator: bool) -> None:
    """SGLang repeats most refusals (no memory left for decode CUDA graphs, a staging buffer, a
    transfer backend that cannot switch): trying in place again would drain the instance for
    nothing each time. The next switch that way relaunches instead: the launcher's flags switch in
    place, so the gang is recreated in the new role."""
    name = prefill_instances(h)[0]
    h.engine(name).refuse = True  # every in-place switch of this engine is refused
    h.annotate(name, ANNOTATION_SWITCH_TO, "decode")
    h.run_until(lambda: finished(h, 1))
    assert h.history()[0]["outcome"] == "Refused" and h.history()[0]["mode"] == "in-place"
    assert h.instance(name)["spec"]["role"] == "prefill" and h.instance(name)["spec"]["restartGeneration"] == 0
    refused = next(m for r, m in h.events() if r == "RoleSwitchRefused")
    assert "next switch to decode relaunches" in refused

    h.annotate(name, ANNOTATION_SWITCH_TO, "decode")  # the same move asked again
    uid = h.leader(name)["metadata"]["uid"]
    phases = []
    for _ in range(60):
        h.tick()
        if restart_operator:
            h.ctl = h.controller()  # only what the objects hold survives
        phases.append(h.instance(name)["status"].get("phase"))
        if finished(h, 2):
            break
    entry = h.history()[-1]
    assert entry["outcome"] == "Succeeded" and entry["mode"] == "relaunch", entry
    assert "refused this switch in place" in entry["reason"] and "engine refused, still prefill" in entry["reason"]
    assert "Relaunching" in phases and "Switching" not in phases
    inst = h.instance(name)
    assert inst["spec"]["role"] == "decode" and inst["spec"]["restartGeneration"] == 1
    assert inst["status"]["phase"] == "Ready"
    h.tick(2)
    assert h.leader(name)["metadata"]["uid"] != uid, "the gang was recreated"
    assert h.leader(name)["metadata"]["labels"][LABEL_ROLE] == "decode"
    assert h.engine(name).log == ["prefill->decode:Refused", "started as decode"], "never tried in place again"
    drained = [m for r, m in h.events() if r == "RoleSwitchDrained" and "relaunch" in m]
    assert len(drained) == 1 and "the gang is recreated as decode" in drained[0]
    assert "RoleSwitchFailed" not in h.reasons()


def test_a_refusal_is_remembered_per_direction_and_forgotten_with_a_new_revision(h: Harness) -> None:
    name = prefill_instances(h)[0]
    h.engine(name).refuse = True
    h.annotate(name, ANNOTATION_SWITCH_TO, "decode")
    h.run_until(lambda: finished(h, 1))
    assert h.instance(name)["metadata"]["annotations"].get(ANNOTATION_IN_PLACE_REFUSED)
    # Another configuration (say more memory left for decode's CUDA graphs) may well switch in
    # place: once the instance runs it, in place is tried again.
    revision = h.instance(name)["metadata"]["labels"]["hybridserving.io/revision-hash"]
    h.api.user_apply({**copy.deepcopy(FLEET_SPEC), "engine": {"env": [{"name": "X", "value": "1"}]}})
    h.run_until(lambda: h.instance(name)["metadata"]["labels"]["hybridserving.io/revision-hash"] != revision
                and h.instance(name)["status"].get("phase") == "Ready")
    h.engine(name).refuse = False
    h.annotate(name, ANNOTATION_SWITCH_TO, "decode")
    h.run_until(lambda: finished(h, 2))
    assert h.history()[-1]["mode"] == "in-place" and h.history()[-1]["outcome"] == "Succeeded"
    assert ANNOTATION_IN_PLACE_REFUSED not in h.instance(name)["metadata"]["annotations"], "the stale one went"
    assert h.instance(name)["spec"]["restartGeneration"] == 0


def test_a_failed_rebuild_is_not_remembered_the_launcher_relaunches_it_itself(h: Harness) -> None:
    """`safe_to_restore: false`: the launcher relaunches on the same pods; nothing changes here."""
    name = prefill_instances(h)[0]
    h.engine(name).fail_rebuild = True
    h.annotate(name, ANNOTATION_SWITCH_TO, "decode")
    h.run_until(lambda: finished(h, 1))
    assert h.history()[-1]["outcome"] == "Succeeded" and h.history()[-1]["mode"] == "in-place"
    assert ANNOTATION_IN_PLACE_REFUSED not in h.instance(name)["metadata"]["annotations"]
    assert h.instance(name)["spec"]["restartGeneration"] == 0
    h.engine(name).fail_rebuild = False
    h.annotate(name, ANNOTATION_SWITCH_TO, "prefill")
    h.run_until(lambda: finished(h, 2))
    assert h.history()[-1]["mode"] == "in-place" and h.history()[-1]["outcome"] == "Succeeded"


def test_the_policy_weighs_an_instance_refused_in_place_as_one_that_relaunches(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The policy's rules for relaunches then hold for it: their minutes count in the cost, the
    fast path never takes one, and a donor that switches in place is preferred."""
    from hybridserving.controller import switching as sw
    seen: list[dict[str, bool]] = []
    decide_all = sw.RoleSwitchPolicy.decide_all

    def spy(self: Any, now: float, states: Any, *args: Any) -> Any:
        seen.append({s.name: s.in_place for s in states})
        return decide_all(self, now, states, *args)

    monkeypatch.setattr(sw.RoleSwitchPolicy, "decide_all", spy)
    name = prefill_instances(h)[0]
    h.engine(name).refuse = True
    h.annotate(name, ANNOTATION_SWITCH_TO, "decode")
    h.run_until(lambda: finished(h, 1))
    h.tick()
    assert seen[-1][name] is False
    assert all(in_place for other, in_place in seen[-1].items() if other != name)


def test_drain_timeout_aborts(h: Harness) -> None:
    name = prefill_instances(h)[0]
    h.engine(name).inflight = 10_000
    h.engine(name).stuck = True  # requests never finish
    h.annotate(name, ANNOTATION_SWITCH_TO, "decode")
    h.run_until(lambda: h.history() and h.history()[-1]["outcome"] != "InProgress")
    assert h.history()[-1]["outcome"] == "Aborted" and "not idle" in h.history()[-1]["phase"]
    assert h.instance(name)["spec"]["role"] == "prefill"
    h.tick()
    assert h.leader(name)["metadata"]["labels"][LABEL_ROLE] == "prefill"


def routed_pods(h: Harness, role: str) -> list[str]:
    return sorted(n for (k, n), o in h.api.store.items()
                  if k == "Pod" and o["metadata"]["labels"].get(LABEL_ROLE) == role
                  and not o["metadata"].get("deletionTimestamp"))


def test_a_rollout_does_not_take_the_last_routed_instance_of_a_role_that_another_leaves_for_a_switch() -> None:
    """A draining instance keeps its pods ready but is out of the router: the rollout's budget
    (maxUnavailable 1) is spent on it, so the role's other instance keeps serving until the
    switch ends."""
    spec = copy.deepcopy(FLEET_SPEC)
    spec["roleSwitch"]["drainTimeoutSeconds"] = 600
    h = Harness(spec)
    leaving, staying = sorted(n for (k, n), o in h.api.store.items()
                              if k == INSTANCE_KIND and o["spec"]["role"] == "decode")
    h.engine(leaving).inflight = 10_000
    h.engine(leaving).stuck = True  # its drain outlasts the test
    h.annotate(leaving, ANNOTATION_SWITCH_TO, "prefill")
    h.tick(3)
    assert h.instance(leaving)["status"]["phase"] == "Draining"
    assert routed_pods(h, "decode") == [f"{staying}-0"]
    h.api.user_apply({**copy.deepcopy(spec), "engine": {"env": [{"name": "X", "value": "1"}]}})  # a change that rolls
    for _ in range(30):
        h.tick()
        assert routed_pods(h, "decode") == [f"{staying}-0"], h.events()
    assert h.instance(leaving)["status"]["phase"] == "Draining"
    assert any(o["spec"]["role"] == "prefill" and o["spec"]["configHash"] != h.instance(staying)["spec"]["configHash"]
               for (k, _), o in h.api.store.items() if k == INSTANCE_KIND)  # the other role did roll meanwhile


def test_operator_restarted_mid_switch_resumes_to_the_same_end(h: Harness) -> None:
    name = prefill_instances(h)[0]
    h.engine(name).inflight = 2
    h.annotate(name, ANNOTATION_SWITCH_TO, "decode")
    steps = set()
    for _ in range(40):
        h.tick()
        h.ctl = h.controller()  # a new operator process every tick: nothing in memory survives
        record = h.instance(name)["metadata"].get("annotations", {}).get(ANNOTATION_SWITCH)
        if record:
            steps.add(record.split('"step":"')[1].split('"')[0])
        if h.history() and h.history()[-1]["outcome"] != "InProgress":
            break
    assert steps >= {"Unroute", "Drain", "Switch", "Route"}  # Verify may pass in the tick Switch ends
    assert h.history()[-1]["outcome"] == "Succeeded" and len(h.history()) == 1
    assert h.instance(name)["spec"]["role"] == "decode"
    # Every process posted the Event of the step it found; the names let only the first one land.
    assert h.reasons().count("RoleSwitchStarted") == 1
    assert len(h.reasons()) == len(set(h.reasons())), h.reasons()


def test_a_replica_taking_over_posts_the_event_its_predecessor_died_before(h: Harness) -> None:
    name = prefill_instances(h)[0]
    h.engine(name).inflight = 2
    h.annotate(name, ANNOTATION_SWITCH_TO, "decode")
    h.api.fail = lambda verb, kind, obj: 503 if kind == "Event" else None  # it dies after the record lands
    h.tick()
    assert h.instance(name)["metadata"]["annotations"].get(ANNOTATION_SWITCH) and h.reasons() == []
    h.api.fail = lambda verb, kind, obj: None
    h.ctl = h.controller()
    h.run_until(lambda: h.history() and h.history()[-1]["outcome"] != "InProgress")
    assert h.reasons()[0] == "RoleSwitchStarted" and h.reasons().count("RoleSwitchStarted") == 1
    assert h.reasons()[-1] == "RoleSwitchSucceeded" and len(h.reasons()) == len(set(h.reasons())), h.reasons()


def test_conflicts_are_retried_without_duplicates(h: Harness) -> None:
    name = prefill_instances(h)[0]
    calls = {"n": 0}

    def fail(verb: str, kind: str, obj: str) -> int | None:
        if kind == INSTANCE_KIND and obj == name and verb == "patch":
            calls["n"] += 1
            return 409 if calls["n"] % 3 == 1 else None
        return None

    h.api.fail = fail
    h.annotate(name, ANNOTATION_SWITCH_TO, "decode")
    h.run_until(lambda: h.history() and h.history()[-1]["outcome"] != "InProgress")
    assert h.history()[-1]["outcome"] == "Succeeded" and len(h.history()) == 1
    assert h.engine(name).log == ["prefill->decode:Succeeded"]


def test_on_call_below_the_floor_is_rejected(h: Harness) -> None:
    spec = copy.deepcopy(FLEET_SPEC)
    spec["roleSwitch"]["minPrefill"] = 2
    h = Harness(spec)
    name = prefill_instances(h)[0]
    h.annotate(name, ANNOTATION_SWITCH_TO, "decode")
    h.tick(3)
    assert "RoleSwitchRejected" in h.reasons()
    assert h.instance(name)["spec"]["role"] == "prefill" and not h.history()
    assert ANNOTATION_SWITCH_TO not in h.instance(name)["metadata"]["annotations"]


def test_paused_fleet_holds_on_call_requests_until_unpaused() -> None:
    spec = copy.deepcopy(FLEET_SPEC)
    spec["rollout"] = {"paused": True}
    h = Harness(spec)
    name = prefill_instances(h)[0]
    h.annotate(name, ANNOTATION_SWITCH_TO, "decode")
    h.tick(5)
    assert not h.history() and h.instance(name)["metadata"]["annotations"][ANNOTATION_SWITCH_TO] == "decode"
    spec["rollout"]["paused"] = False
    h.api.user_apply(spec)
    h.run_until(lambda: h.history() and h.history()[-1]["outcome"] == "Succeeded")


def overload_prefill(h: Harness) -> None:
    for (kind, name), obj in h.api.store.items():
        if kind == INSTANCE_KIND:
            e = h.engine(name)
            if obj["spec"]["role"] == "prefill":
                e.utilization, e.queue_tokens = 1.0, 400_000
            else:
                e.utilization, e.kv_usage, e.running = 0.05, 0.01, 1


def test_the_policy_moves_an_idle_decode_instance_to_an_overloaded_prefill(h: Harness) -> None:
    overload_prefill(h)
    h.run_until(lambda: h.history() and h.history()[-1]["outcome"] == "Succeeded", limit=80)
    entry = h.history()[0]
    assert entry["fromRole"] == "decode" and entry["toRole"] == "prefill" and entry["reason"].startswith("policy:")
    assert len(prefill_instances(h)) == 3


def test_once_the_burst_is_over_the_policy_returns_the_fleet_to_its_declared_split(h: Harness) -> None:
    """The spec's replicas (2 prefill, 2 decode) are the split a quiet fleet goes back to."""
    overload_prefill(h)
    h.run_until(lambda: h.history() and h.history()[-1]["outcome"] == "Succeeded", limit=80)
    assert len(prefill_instances(h)) == 3
    for kind, name in list(h.api.store):
        if kind == INSTANCE_KIND:
            e = h.engine(name)
            e.utilization, e.queue_tokens, e.kv_usage, e.running = 0.05, 0, 0.01, 1
    quiet_from = h.now
    h.run_until(lambda: len(h.history()) == 2 and h.history()[-1]["outcome"] == "Succeeded", limit=200)
    back = h.history()[-1]
    assert back["fromRole"] == "prefill" and back["toRole"] == "decode"
    assert back["reason"].startswith("policy:") and "declared split 2:2" in back["reason"]
    assert h.now - quiet_from >= FLEET_SPEC["roleSwitch"]["cooldownSeconds"]  # quiet for a cooldown first
    assert len(prefill_instances(h)) == 2
    h.tick(60)
    assert len(h.history()) == 2  # home: nothing more moves


def test_pinned_instances_are_never_moved_by_the_policy(h: Harness) -> None:
    decode = sorted(n for (k, n), o in h.api.store.items() if k == INSTANCE_KIND and o["spec"]["role"] == "decode")
    for name in decode:
        h.annotate(name, ANNOTATION_PINNED, "true")
    overload_prefill(h)
    h.tick(40)
    assert not h.history()


def rollout_status(h: Harness) -> dict[str, Any]:
    return h.api.status().get("rollout") or {}


def revision_of(h: Harness, name: str) -> str:
    return "fleet-" + h.instance(name)["metadata"]["labels"].get("hybridserving.io/revision-hash", "")


def test_a_rollout_with_a_canary_holds_every_instance_in_its_role_until_it_is_done() -> None:
    """Each role's canary counts its rolled instances: a rolled decode moved to prefill would let
    decode roll one more, and the canary grow switch by switch. Once the canary is removed, the
    policy moves instances on the update revision again."""
    h = Harness()
    spec = copy.deepcopy(FLEET_SPEC)
    spec["engine"] = {"image": "registry.example/sglang:v2"}
    spec["rollout"] = {"canary": 1}
    h.api.user_apply(spec)
    overload_prefill(h)
    for _ in range(40):
        h.tick()
        overload_prefill(h)
        updated = sum(1 for n in instances(h) if revision_of(h, n) == rollout_status(h).get("updateRevision"))
        assert updated <= 2, f"the canary of 1 per role grew to {updated} instances"
    assert rollout_status(h).get("held") == "Canary"
    assert not h.history(), "no switch while the canary holds the rollout"
    del spec["rollout"]
    h.api.user_apply(spec)
    h.run_until(lambda: bool(h.history()), limit=80)
    [first] = h.history()
    assert (first["fromRole"], first["toRole"]) == ("decode", "prefill")
    assert revision_of(h, first["instance"]) == rollout_status(h)["updateRevision"]


def test_an_on_call_switch_of_an_instance_not_yet_rolled_waits_for_the_rollout() -> None:
    """Switched in place before its turn, the instance would keep its old engine flags (a switch
    changes only the role) while its new flags made the planner count it as rolled: it would never
    be replaced. No switch starts on an instance off the update revision."""
    h = Harness()
    spec = copy.deepcopy(FLEET_SPEC)
    spec["engine"] = {"image": "registry.example/sglang:v2"}
    h.api.user_apply(spec)
    decode = sorted(n for n in instances(h) if h.instance(n)["spec"]["role"] == "decode")
    for name in decode:
        h.annotate(name, ANNOTATION_SWITCH_TO, "prefill")
    started: set[str] = set()
    for _ in range(60):
        h.tick()
        update = rollout_status(h).get("updateRevision")
        for name in decode:
            record = (h.instance(name)["metadata"].get("annotations") or {}).get(ANNOTATION_SWITCH)
            if record is not None and name not in started:
                started.add(name)
                assert revision_of(h, name) == update, f"{name} switched before the rollout rolled it"
    assert started, "the request is honoured once the instance runs the update revision"
    assert rollout_status(h)["currentRevision"] == rollout_status(h)["updateRevision"]


@pytest.mark.parametrize("edit", [
    {"engine": {"extraArgs": ["--tp-size", "4"]}},  # a flag the operator owns: LayoutValid False
    {"model": {"profile": "deepseek-v9"}},  # no such profile: the model cannot even be resolved
])
def test_an_invalid_edit_that_turns_switching_on_moves_nothing(edit: dict[str, Any]) -> None:
    """The fleet stays on its last valid spec (switching off) until the spec is fixed: the switch
    controller follows the spec the reconcile plans from, not the invalid edit."""
    off = copy.deepcopy(FLEET_SPEC)
    off["roleSwitch"]["enabled"] = False
    h = Harness(off)
    before = {n: (o["metadata"]["uid"], o["spec"]["role"]) for (k, n), o in h.api.store.items() if k == INSTANCE_KIND}
    bad = copy.deepcopy(FLEET_SPEC)
    bad["model"] = {**bad["model"], **edit.get("model", {})}
    bad["engine"] = {**bad.get("engine", {}), **edit.get("engine", {})}
    h.api.user_apply(bad)
    overload_prefill(h)  # what would move an instance, were switching on
    h.tick(40)
    assert h.api.condition("LayoutValid")["status"] == "False"
    assert h.history() == [] and h.reasons() == []
    after = {n: (o["metadata"]["uid"], o["spec"]["role"]) for (k, n), o in h.api.store.items() if k == INSTANCE_KIND}
    assert after == before
    h.api.user_apply(FLEET_SPEC)  # fixed: switching on, valid
    h.run_until(lambda: h.history() and h.history()[-1]["outcome"] == "Succeeded", limit=80)


def test_a_switch_whose_history_write_fails_as_it_ends_is_recorded_once_the_write_lands(h: Harness) -> None:
    name = prefill_instances(h)[0]
    h.annotate(name, ANNOTATION_SWITCH_TO, "decode")
    h.run_until(lambda: '"step":"Route"' in h.instance(name)["metadata"]["annotations"].get(ANNOTATION_SWITCH, ""))
    failed = []

    def fail(verb: str, kind: str, obj: str) -> int | None:
        if kind == KIND and verb == "patch" and not failed:
            failed.append(obj)
            return 503  # the history write of the tick the switch ends
        return None

    h.api.fail = fail
    h.run_until(lambda: ANNOTATION_SWITCH not in h.instance(name)["metadata"]["annotations"])
    assert failed and h.instance(name)["spec"]["role"] == "decode"
    assert [e["outcome"] for e in h.history()] == ["Succeeded"]


def test_a_restart_whose_phase_write_fails_still_hands_the_instance_back(h: Harness) -> None:
    """The Restart step writes the record, spec.role and restartGeneration, then the phase; when the
    second write fails, the switch must not end with the instance left in a switch phase."""
    h.ctl = SwitchController(h.api, h.engines, clock=lambda: h.now,
                             step_bounds={**STEP_BOUNDS, "verify_timeout_s": 6.0})
    name = prefill_instances(h)[0]
    h.engine(name).healthy = False  # unhealthy after its switch: Verify fails into a Restart
    h.annotate(name, ANNOTATION_SWITCH_TO, "decode")
    failed: list[str] = []

    def fail(verb: str, kind: str, obj: str) -> int | None:
        record = h.instance(name)["metadata"].get("annotations", {}).get(ANNOTATION_SWITCH, "")
        if kind == INSTANCE_KIND and obj == name and verb == "patch" and '"step":"Restart"' in record and not failed:
            failed.append(obj)
            return 503  # the phase write right after the record's
        return None

    h.api.fail = fail
    for _ in range(60):
        h.now += 2.0
        try:
            h.ctl.tick(NS, "fleet")
        except KubeError:
            pass  # the pass that hit the failed write; the next one goes on
        rec.reconcile(h.api, NS, "fleet")
        h.kubelet()
        if failed and ANNOTATION_SWITCH not in h.instance(name)["metadata"].get("annotations", {}):
            break
    assert failed, "the Restart step was reached"
    assert ANNOTATION_SWITCH not in h.instance(name)["metadata"].get("annotations", {}), "the switch ended"
    assert h.history()[-1]["outcome"] == "Failed"
    h.tick(2)
    assert h.instance(name)["status"]["phase"] not in ("Draining", "Switching", "Relaunching"), \
        h.instance(name)["status"]
    assert h.instance(name)["spec"]["role"] == "prefill"
    assert "RoleEditAdopted" not in [r for r, _ in h.events()], "the old gang is no hand edit"


def test_a_switch_whose_instance_is_deleted_ends_aborted_in_the_history(h: Harness) -> None:
    name = prefill_instances(h)[0]
    h.engine(name).inflight = 10_000
    h.engine(name).stuck = True
    h.annotate(name, ANNOTATION_SWITCH_TO, "decode")
    h.tick(3)
    assert [e["outcome"] for e in h.history()] == ["InProgress"]
    h.instance(name)["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # a scale-down took it
    h.now += 2
    h.ctl.tick(NS, "fleet")
    [entry] = h.history()
    assert entry["outcome"] == "Aborted" and "the instance was deleted" in entry["phase"] and entry["finished"]


def test_disabled_switching_starts_nothing_and_writes_nothing() -> None:
    spec = copy.deepcopy(FLEET_SPEC)
    spec["roleSwitch"]["enabled"] = False
    h = Harness(spec)
    overload_prefill(h)
    before = sum(h.api.writes.values())
    for _ in range(5):
        h.now += 2
        h.ctl.tick(NS, "fleet")
    assert sum(h.api.writes.values()) == before and h.engines.calls == 0


def test_a_settled_fleet_costs_no_writes(h: Harness) -> None:
    before = sum(h.api.writes.values())
    for _ in range(5):
        h.now += 2
        h.ctl.tick(NS, "fleet")
    assert sum(h.api.writes.values()) == before


def test_a_missing_fleet_is_forgotten(h: Harness) -> None:
    del h.api.store[(KIND, "fleet")]
    assert h.ctl.tick(NS, "fleet").skipped and (NS, "fleet") not in h.ctl.memory


def test_history_is_bounded(h: Harness) -> None:
    h.api.store[(KIND, "fleet")].setdefault("status", {})["switches"] = [
        {"instance": f"old-{i}", "fromRole": "prefill", "toRole": "decode", "mode": "in-place", "reason": "r",
         "outcome": "Succeeded", "started": f"2020-01-01T00:00:{i:02d}Z"} for i in range(20)]
    name = prefill_instances(h)[0]
    h.annotate(name, ANNOTATION_SWITCH_TO, "decode")
    h.run_until(lambda: h.history()[-1].get("instance") == name and h.history()[-1]["outcome"] == "Succeeded")
    assert len(h.history()) == 20 and h.history()[0]["instance"] == "old-1"


def test_api_errors_other_than_conflicts_surface(h: Harness) -> None:
    name = prefill_instances(h)[0]
    h.annotate(name, ANNOTATION_SWITCH_TO, "decode")
    h.api.fail = lambda verb, kind, obj: 500 if kind == INSTANCE_KIND and verb == "patch" else None
    with pytest.raises(KubeError):
        h.ctl.tick(NS, "fleet")


# --------------------------------------------------------------------------- hand edits and drift


def edit_role(h: Harness, name: str, role: str) -> None:
    """`kubectl patch hsi NAME --type merge -p '{"spec":{"role":ROLE}}'`."""
    h.api.patch(INSTANCE_KIND, NS, name, {"spec": {"role": role}})


def test_a_hand_edit_of_spec_role_goes_through_unroute_and_drain(h: Harness) -> None:
    name = prefill_instances(h)[0]
    h.engine(name).inflight = 3
    edit_role(h, name, "decode")
    # The reconcile runs first (it watches instances): it must not relabel a serving engine.
    rec.reconcile(h.api, NS, "fleet")
    h.kubelet()
    assert h.leader(name)["metadata"]["annotations"][ANNOTATION_ROLE] == "prefill"
    assert h.leader(name)["metadata"]["labels"][LABEL_ROLE] == "prefill"
    assert h.engine(name).log == []
    seen_unrouted_while_busy = False
    for _ in range(40):
        h.tick()
        if h.engine(name).inflight and LABEL_ROLE not in h.leader(name)["metadata"]["labels"]:
            seen_unrouted_while_busy = True
        if h.history() and h.history()[-1]["outcome"] != "InProgress":
            break
    assert h.instance(name)["spec"]["role"] == "decode"
    assert h.leader(name)["metadata"]["labels"][LABEL_ROLE] == "decode"
    assert h.engine(name).log == ["prefill->decode:Succeeded"]
    assert seen_unrouted_while_busy, "the engine left the router before its requests were done"
    entry = h.history()[-1]
    assert entry["outcome"] == "Succeeded" and "Drain" in entry["phase"]
    assert ("RoleEditAdopted" in {r for r, _ in h.events()})


def test_a_hand_edit_below_the_floor_is_refused_and_undone() -> None:
    spec = copy.deepcopy(FLEET_SPEC)
    spec["roleSwitch"]["minPrefill"] = 2
    h = Harness(spec)
    name = prefill_instances(h)[0]
    edit_role(h, name, "decode")
    h.tick(3)
    assert h.instance(name)["spec"]["role"] == "prefill"
    assert h.leader(name)["metadata"]["labels"][LABEL_ROLE] == "prefill"
    assert h.engine(name).log == []
    assert "RoleSwitchRejected" in {r for r, _ in h.events()}


@pytest.mark.parametrize("which", [0, -1])
def test_a_hand_edit_with_switching_off_is_reverted_and_reported(which: int) -> None:
    spec = copy.deepcopy(FLEET_SPEC)
    spec["roleSwitch"]["enabled"] = False
    h = Harness(spec)
    name = prefill_instances(h)[which]
    instances = sorted(n for (k, n) in h.api.store if k == INSTANCE_KIND)
    edit_role(h, name, "decode")
    rec.reconcile(h.api, NS, "fleet")  # writes the instance's status role (the cheap signal)
    assert sorted(n for (k, n) in h.api.store if k == INSTANCE_KIND) == instances, (
        "the edit made no instance surplus: nothing deleted, nothing created")
    h.tick(2)
    assert h.instance(name)["spec"]["role"] == "prefill"
    assert h.leader(name)["metadata"]["labels"][LABEL_ROLE] == "prefill"
    assert h.engine(name).log == []
    assert "RoleEditReverted" in {r for r, _ in h.events()}


def test_an_engine_serving_another_role_than_routed_is_restarted(h: Harness) -> None:
    name = prefill_instances(h)[0]
    h.engine(name).role = "decode"  # e.g. a switch made behind the operator's back, straight to the engine
    h.tick(1)
    assert h.instance(name)["spec"].get("restartGeneration", 0) == 0, "one sighting is not drift yet"
    h.tick(1)
    assert h.instance(name)["spec"]["restartGeneration"] == 1
    assert "RoleDrift" in {r for r, _ in h.events()}


# --------------------------------------------------------------------------- the built-in scaler


def scaling_harness(**scaling: Any) -> Harness:
    spec = copy.deepcopy(FLEET_SPEC)
    spec["scaling"] = {"enabled": True, "minReplicas": 2, "maxReplicas": 8, **scaling}
    return Harness(spec)


def instances(h: Harness) -> list[str]:
    return sorted(n for (k, n) in h.api.store if k == INSTANCE_KIND)


def fleet_replicas(h: Harness) -> int | None:
    return h.api.store[(KIND, "fleet")]["spec"].get("replicas")


def test_the_scaler_grows_a_fleet_both_roles_overload_through_the_scale_subresource() -> None:
    h = scaling_harness()
    start = len(instances(h))
    for name in instances(h):
        e = h.engine(name)
        e.utilization, e.queue_tokens, e.kv_usage, e.running = 1.0, 400_000, 0.98, 256
    h.run_until(lambda: (fleet_replicas(h) or 0) > start, limit=60)
    assert h.api.writes[("patch-scale", KIND)] >= 1, "resized through the scale subresource, as HPA does"
    assert fleet_replicas(h) <= 8, "never past scaling.maxReplicas"
    h.tick(3)
    assert len(instances(h)) == fleet_replicas(h), "the reconcile creates what the total asks"
    assert any(reason == "ScaledUp" for reason, _ in h.events())


def test_the_scaler_shrinks_an_idle_fleet_after_its_delay_and_keeps_each_roles_floor() -> None:
    h = scaling_harness(scaleDownDelaySeconds=30)
    start = len(instances(h))
    for name in instances(h):
        e = h.engine(name)
        e.utilization, e.queue_tokens, e.kv_usage, e.running = 0.0, 0, 0.0, 0
    h.tick(10)  # 20 s: inside the delay
    assert fleet_replicas(h) is None, "nothing is removed before scaleDownDelaySeconds"
    h.run_until(lambda: fleet_replicas(h) == 2, limit=200)
    h.tick(3)
    roles = sorted(h.instance(n)["spec"]["role"] for n in instances(h))
    assert roles == ["decode", "prefill"] and start > 2
    assert any(reason == "ScaledDown" for reason, _ in h.events())
    h.tick(30)
    assert fleet_replicas(h) == 2, "never below scaling.minReplicas and the role floors"


def test_the_scaler_waits_for_the_reconcile_to_carry_out_a_resize_before_deciding_again() -> None:
    """With no scale-down delay, a scaler that decided again before the reconcile removed the
    instance it had asked away counted it once more and shrank the fleet a second time."""
    h = scaling_harness(scaleDownDelaySeconds=0)
    start = len(instances(h))
    for name in instances(h):
        e = h.engine(name)
        e.utilization, e.queue_tokens, e.kv_usage, e.running = 0.0, 0, 0.0, 0
    for _ in range(200):  # the controller alone: the reconcile is slow today
        h.now += 2.0
        h.ctl.tick(NS, "fleet")
        if fleet_replicas(h) is not None:
            break
    assert fleet_replicas(h) == start - 1
    for _ in range(30):
        h.now += 2.0
        h.ctl.tick(NS, "fleet")
    assert fleet_replicas(h) == start - 1, "one resize at a time, each on the fleet it left"
    h.tick(1)  # the controller still waits; the reconcile removes the instance
    assert len(instances(h)) == fleet_replicas(h) == start - 1
    h.tick(3)
    assert fleet_replicas(h) == start - 2, "once carried out, the surplus that is left is seen again"


def test_an_instance_stuck_crash_looping_neither_holds_a_scale_down_nor_counts_as_a_launch() -> None:
    """A gang that keeps crashing holds GPUs and serves nothing; counted as launching, it held every
    scale-down (and a launch slot) for as long as it stayed stuck."""
    h = scaling_harness(scaleDownDelaySeconds=30)
    start = len(instances(h))
    stuck = instances(h)[-1]
    kubelet = h.kubelet

    def crash_looping() -> None:
        kubelet()
        h.leader(stuck)["status"] = {
            "phase": "Running", "podIP": "10.0.0." + stuck.split("-")[1],
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "engine", "restartCount": 7, "ready": False,
                                   "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                   "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}

    h.kubelet = crash_looping  # type: ignore[method-assign]
    for name in instances(h):
        e = h.engine(name)
        e.utilization, e.queue_tokens, e.kv_usage, e.running = 0.0, 0, 0.0, 0
    h.tick(2)
    assert h.instance(stuck)["status"]["phase"] == "CrashLoop"
    h.run_until(lambda: (fleet_replicas(h) or start) < start, limit=200)
    assert any(reason == "ScaledDown" for reason, _ in h.events())


def test_a_refused_resize_is_a_warning_event_and_is_decided_again_later() -> None:
    h = scaling_harness()
    patch = h.api.patch
    refusing = [True]

    def refuse_scale(kind: str, namespace: str, name: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        if kw.get("subresource") == "scale" and refusing[0]:
            raise KubeError(403, "hybridservings/scale is forbidden")
        return patch(kind, namespace, name, body, **kw)

    h.api.patch = refuse_scale  # type: ignore[method-assign]
    for name in instances(h):
        e = h.engine(name)
        e.utilization, e.queue_tokens, e.kv_usage, e.running = 1.0, 400_000, 0.98, 256
    h.run_until(lambda: any(reason == "ScaleFailed" for reason, _ in h.events()), limit=60)
    assert fleet_replicas(h) is None
    failed = [m for reason, m in h.events() if reason == "ScaleFailed"]
    h.tick(5)  # the scaler waits its sustain window again before the next try (20 s)
    assert len([m for reason, m in h.events() if reason == "ScaleFailed"]) == len(failed) == 1
    refusing[0] = False
    h.run_until(lambda: (fleet_replicas(h) or 0) > 4, limit=60)


def test_a_fleet_left_alone_is_validated_once_and_an_edit_is_seen_at_the_next_tick(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The live spec is validated once per resourceVersion, not on every 2-s tick of every fleet."""
    from hybridserving.controller import switching as sw
    validated: list[str] = []

    def counted(body: dict[str, Any], policy: Any) -> Any:
        validated.append(body["metadata"]["resourceVersion"])
        return rec.validate(body, policy)

    monkeypatch.setattr(sw, "validate", counted)
    for _ in range(5):
        h.now += 2
        h.ctl.tick(NS, "fleet")
    assert len(validated) == len(set(validated)) == 1
    off = copy.deepcopy(FLEET_SPEC)
    off["roleSwitch"]["enabled"] = False
    h.api.user_apply(off)
    overload_prefill(h)  # what would move an instance, were switching still on
    h.now += 2
    report = h.ctl.tick(NS, "fleet")
    assert len(validated) == 2 and report.skipped and not report.started


def test_a_resize_made_while_the_scaler_decided_is_not_written_over() -> None:
    """`kubectl scale` (or an edit) lands between the tick's read of the fleet and its write: the
    scaler's write is a 409, and what the person set stands until a tick decides from it."""
    h = scaling_harness()
    for name in instances(h):
        e = h.engine(name)
        e.utilization, e.queue_tokens, e.kv_usage, e.running = 1.0, 400_000, 0.98, 256
    real_patch, resized = h.api.patch, []

    def patch(kind: str, namespace: str, name: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        if kw.get("subresource") == "scale" and not resized:
            resized.append(real_patch(KIND, namespace, name, {"spec": {"replicas": 7}}, subresource="scale"))
        return real_patch(kind, namespace, name, body, **kw)

    h.api.patch = patch  # type: ignore[method-assign]
    h.run_until(lambda: bool(resized), limit=60)
    assert fleet_replicas(h) == 7
    assert "ScaleFailed" not in {reason for reason, _ in h.events()}, "a conflict is a retry, not a failure"
