"""The reconcile (observe, validate, plan, act, report) against an in-memory API with faults.

`MemoryApi` (tests/support/apiserver.py) has the same methods as `controller.kube.Kube` and the
apiserver's write semantics that the reconcile relies on (merge patches, resourceVersion and uid
preconditions, AlreadyExists, the status subresource); its `fail` hook injects HTTP errors
into chosen writes. The real apiserver is exercised by tests/integration/test_operator.py.
"""

from __future__ import annotations

import copy
import itertools
import time
from collections import Counter
from typing import Any

import pytest

from hybridserving.api.v1alpha1 import INSTANCE_KIND, KIND, RoleStatus
from hybridserving.controller import reconcile as rec
from hybridserving.controller.status import last_progress
from hybridserving.controller.kube import KubeError
from hybridserving.core.actions import Cause
from hybridserving.core import backoff
from hybridserving.core import rendering
from hybridserving.core.backoff import ANNOTATION_GANG_RESTARTS, GangRestarts
from hybridserving.core.naming import ANNOTATION_RESTART_GENERATION, LABEL_NAME
from hybridserving.core.observed import parse_time
from hybridserving.core.rollout import RERENDERED
from hybridserving.core.switching import SwitchState
from support.apiserver import NS, MemoryApi
from support.fleets import SPEC, settle

# A switch in flight at its Switch step, as the role-switch controller records it.
SWITCH_RECORD = SwitchState.start("decode", "prefill", "in-place", "test", 0.0).advance("Switch", 1.0).to_annotation()



def test_a_settled_fleet_is_ready_and_a_further_pass_writes_nothing(api: MemoryApi) -> None:
    settle(api)
    assert api.condition("Ready")["status"] == "True"
    assert api.condition("LayoutValid")["status"] == "True"
    assert api.condition("Progressing")["status"] == "False"
    assert api.status()["prefill"]["summary"] == "2/2" and api.status()["ready"] == "True"
    assert all(c["observedGeneration"] == 1 for c in api.status()["conditions"])
    assert api.status()["capacity"]["decodeTokensPerInstance"] > 0
    assert {i["phase"] for i in api.status()["instances"]} == {"Ready"}
    before = sum(api.writes.values())
    stamps = [c["lastTransitionTime"] for c in api.status()["conditions"]]
    outcome = rec.reconcile(api, NS, "fleet")
    assert outcome.actions == [] and sum(api.writes.values()) == before, "steady state writes nothing"
    assert [c["lastTransitionTime"] for c in api.status()["conditions"]] == stamps
    events = [o for (k, _), o in api.store.items() if k == "Event"]
    assert {e["reason"] for e in events} >= {"CreatedInstance", "CreatedPod", "CreatedConfigMap"}


def test_a_pass_comes_back_when_a_just_ready_instance_has_been_ready_for_min_ready_seconds(api: MemoryApi) -> None:
    settle(api)
    assert rec.reconcile(api, NS, "fleet").requeue_after is None, "a settled fleet waits for nothing"
    just_now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    pod = next(o for (k, _), o in api.store.items() if k == "Pod")
    pod["status"]["conditions"][0]["lastTransitionTime"] = just_now
    requeue = rec.reconcile(api, NS, "fleet").requeue_after
    assert requeue is not None and 8.0 < requeue <= 10.5, requeue  # rollout.minReadySeconds 10, then half a second


def test_a_conflict_ends_the_pass_and_the_next_one_finishes_without_duplicates(api: MemoryApi) -> None:
    calls = itertools.count()
    api.fail = lambda verb, kind, name: 409 if verb != "apply" and next(calls) == 4 else None
    outcome = rec.reconcile(api, NS, "fleet")
    assert outcome.conflict and outcome.requeue_after == 1.0
    assert len(outcome.applied) == 4
    api.fail = lambda *a: None
    settle(api)
    kinds = Counter(k for k, _ in api.children())
    assert kinds[INSTANCE_KIND] == 4 and kinds["Pod"] == 4


def test_a_server_error_is_reported_and_the_rest_goes_on(api: MemoryApi) -> None:
    api.fail = lambda verb, kind, name: 500 if kind == "PodDisruptionBudget" else None
    for _ in range(3):
        outcome = rec.reconcile(api, NS, "fleet")
        api.run_pods()
    assert outcome.errors and "PodDisruptionBudget" in outcome.errors[0]
    degraded = api.condition("Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "ReconcileError"
    assert sum(1 for k, _ in api.children() if k == "Pod") == 4, "the fleet was built regardless"
    api.fail = lambda *a: None
    settle(api)
    assert api.condition("Degraded")["status"] == "False"


@pytest.mark.parametrize("stop_after", range(0, 30, 3))
def test_a_pass_killed_after_any_write_converges_to_the_same_fleet(stop_after: int) -> None:
    reference = MemoryApi()
    reference.user_apply(SPEC)
    settle(reference)
    api = MemoryApi()
    api.user_apply(SPEC)
    rec.reconcile(api, NS, "fleet", plan_hook=lambda actions: actions[:stop_after])
    settle(api)
    assert api.children() == reference.children()


def test_an_invalid_update_is_reported_and_leaves_the_fleet_alone(api: MemoryApi) -> None:
    settle(api)
    before = {k: copy.deepcopy(o) for k, o in api.store.items() if k[0] != "Event"}
    # tp 8 with dcp 3: CEL rejects this one at admission; here it stands for any rule CEL cannot express.
    bad = copy.deepcopy(SPEC)
    bad["decode"]["layout"] = {"tp": 8, "dcp": 3}
    api.user_apply(bad)
    for _ in range(3):
        rec.reconcile(api, NS, "fleet")
    layout_valid = api.condition("LayoutValid")
    assert layout_valid["status"] == "False" and layout_valid["observedGeneration"] == 2
    assert "spec.decode.layout.dcp" in layout_valid["message"] and "Fix:" in layout_valid["message"]
    assert "last valid spec" in layout_valid["message"]
    after = {k: o for k, o in api.store.items() if k[0] not in ("Event", KIND)}
    assert after == {k: o for k, o in before.items() if k[0] != KIND}, "no child was touched"
    warnings = [o for (k, _), o in api.store.items() if k == "Event" and o["type"] == "Warning"]
    assert len(warnings) == 1 and warnings[0]["reason"] == "LayoutInvalid"
    api.user_apply(SPEC)
    settle(api)
    assert api.condition("LayoutValid")["status"] == "True"


def test_a_gang_restart_continues_while_the_spec_is_invalid(api: MemoryApi) -> None:
    settle(api)
    bad = copy.deepcopy(SPEC)
    bad["model"] = {"path": "x", "profile": "no-such-model"}
    api.user_apply(bad)
    del api.store[("Pod", "fleet-0-0")]
    settle(api)
    assert ("Pod", "fleet-0-0") in api.store, "the last valid spec heals the fleet"
    assert api.condition("LayoutValid")["status"] == "False"


def test_an_invalid_first_spec_creates_nothing() -> None:
    api = MemoryApi()
    bad = copy.deepcopy(SPEC)
    bad["prefill"]["layout"] = {"tp": "eight"}
    api.user_apply(bad)
    outcome = rec.reconcile(api, NS, "fleet")
    assert outcome.actions == [] and api.children() == set()
    assert api.condition("LayoutValid")["status"] == "False"
    assert "spec.prefill.layout.tp" in api.condition("LayoutValid")["message"]
    assert api.condition("Ready")["reason"] == "NoValidSpec"


def test_unschedulable_instances_say_what_they_need(api: MemoryApi) -> None:
    rec.reconcile(api, NS, "fleet")
    rec.reconcile(api, NS, "fleet")
    for (kind, _), obj in api.store.items():
        if kind == "Pod":
            obj["status"] = {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/8 nodes are available: 8 Insufficient nvidia.com/gpu."}]}
    rec.reconcile(api, NS, "fleet")
    degraded = api.condition("Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "Unschedulable"
    assert "needs a node with 8 free nvidia.com/gpu" in degraded["message"]
    assert "Insufficient nvidia.com/gpu" in degraded["message"]


def test_a_deleted_fleet_is_left_to_the_garbage_collector(api: MemoryApi) -> None:
    settle(api)
    api.store[(KIND, "fleet")]["metadata"]["deletionTimestamp"] = "now"
    before = sum(api.writes.values())
    assert rec.reconcile(api, NS, "fleet").gone
    assert sum(api.writes.values()) == before
    del api.store[(KIND, "fleet")]
    assert rec.reconcile(api, NS, "fleet").gone


def test_the_operator_never_writes_the_spec_of_a_hybridserving(api: MemoryApi) -> None:
    seen: list[str] = []
    inner = api.patch

    def spy(kind: str, namespace: str, name: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        if kind == KIND:
            seen.append(kw.get("subresource") or "main")
        return inner(kind, namespace, name, body, **kw)

    api.patch = spy  # type: ignore[method-assign]
    settle(api)
    assert seen and set(seen) == {"status"}


def test_the_deployed_rbac_is_generated_from_the_rules() -> None:
    from hybridserving.controller import rbac

    assert rbac.DEPLOY_FILE.read_text() == rbac.render(), "run python -m hybridserving.controller.rbac --write"


def test_every_write_the_reconcile_makes_is_granted(api: MemoryApi) -> None:
    """Run a whole lifecycle and check each (verb, resource) against the ClusterRole."""
    from hybridserving.controller import rbac
    from hybridserving.controller.kube import RESOURCES

    settle(api)
    bigger = copy.deepcopy(SPEC)
    bigger["engine"] = {"image": "v2"}
    bigger["decode"]["replicas"] = 1
    bigger["router"] = {"enabled": False}
    api.user_apply(bigger)
    settle(api, passes=30)
    granted = {(r.group, res, verb) for r in rbac.RULES for res in r.resources for verb in r.verbs}
    for verb, kind in api.writes:
        resource = RESOURCES[kind]
        plural = resource.plural + ("/status" if verb == "patch-status" else "")
        # A server-side apply creates what is missing and patches what exists.
        for needed in ("create", "patch") if verb == "apply" else (verb.split("-")[0],):
            assert (resource.group, plural, needed) in granted, (verb, kind)
    assert {v for v, _ in api.writes} >= {"create", "patch", "delete", "patch-status"}


def test_a_role_switch_is_counted_once(api: MemoryApi) -> None:
    from hybridserving.controller import metrics

    def switches() -> float:
        return metrics.ROLE_SWITCHES.labels("decode", "prefill")._value.get()

    flexible = copy.deepcopy(SPEC)
    flexible["roleSwitch"] = {"enabled": True}
    api.user_apply(flexible)
    settle(api)
    before = switches()
    api.store[(INSTANCE_KIND, "fleet-3")]["spec"]["role"] = "prefill"
    # ...with its record on the instance, as the switch controller writes spec.role at its Switch step.
    api.store[(INSTANCE_KIND, "fleet-3")]["metadata"].setdefault("annotations", {})[
        "hybridserving.io/switch"
    ] = SWITCH_RECORD
    settle(api)
    assert switches() == before + 1
    pods = {k: o["metadata"]["uid"] for k, o in api.store.items() if k[0] == "Pod"}
    assert api.store[("Pod", "fleet-3-0")]["metadata"]["labels"]["hybridserving.io/role"] == "prefill"
    settle(api)
    assert switches() == before + 1
    assert pods == {k: o["metadata"]["uid"] for k, o in api.store.items() if k[0] == "Pod"}


def test_engine_privileges_not_granted_make_the_layout_invalid_with_the_field() -> None:
    from hybridserving.controller.reconcile import validate
    from hybridserving.core.privileges import EnginePolicy

    body = {
        "apiVersion": "hybridserving.io/v1alpha1", "kind": "HybridServing",
        "metadata": {"name": "rdma", "namespace": "default"},
        "spec": {"model": {"path": "m", "profile": "deepseek-v3"},
                 "prefill": {"layout": {"tp": 8}}, "decode": {"layout": {"tp": 8}},
                 "network": {"hostNetwork": True}, "transfer": {"rdmaResourceCount": 8}},
    }
    _, ok = validate(body, EnginePolicy(allow_host_network=True, allow_ipc_lock=True))
    assert ok.valid
    _, refused = validate(body, EnginePolicy())
    assert not refused.valid, "nothing is granted unless the operator was told so"
    paths = {i.path for i in refused.errors}
    assert paths == {"spec.network.hostNetwork", "spec.transfer.rdmaResourceCount"}
    assert "enginePolicy.allowHostNetwork" in refused.message()


# --------------------------------------------------------------------------- faults the pass must report


@pytest.mark.parametrize("length", [41, 64, 253])
def test_a_name_too_long_is_reported_before_anything_is_read_or_written(length: int) -> None:
    """Names past a label value's 63 characters made the listing of children fail before validation."""
    api = MemoryApi()
    long_name = "f" * length

    def lists(kind: str, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        if any(len(v) > 63 for v in labels.values()):
            raise KubeError(400, "unable to parse requirement: values must be no more than 63 characters")
        return MemoryApi.list(api, kind, namespace, labels)

    api.list = lists  # type: ignore[method-assign]
    api.user_apply(SPEC, name=long_name)
    outcome = rec.reconcile(api, NS, long_name)
    assert not outcome.actions and not [k for k in api.store if k[0] not in (KIND, "Event")]
    status = api.store[(KIND, long_name)]["status"]
    layout = next(c for c in status["conditions"] if c["type"] == "LayoutValid")
    assert layout["status"] == "False" and "metadata.name" in layout["message"]
    assert status["ready"] == "False"


def test_a_plan_that_raises_is_reported_and_the_fleet_is_repaired_from_the_last_applied_spec(
    api: MemoryApi, monkeypatch: pytest.MonkeyPatch,
) -> None:
    settle(api)
    real_plan = rec.planner.plan

    def plan(hs: Any, observed: Any, access: Any = None, last_good_revision: str = "") -> Any:
        if hs.spec.prefill.replicas == 3:
            raise ValueError("a spec validation let through")
        return real_plan(hs, observed, access, last_good_revision)

    monkeypatch.setattr(rec.planner, "plan", plan)
    api.user_apply({**SPEC, "prefill": {"replicas": 3, "layout": {"tp": 8}}})
    api.store.pop(("Pod", "fleet-0-0"))
    outcome = rec.reconcile(api, NS, "fleet")
    degraded = api.condition("Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "PlanFailed"
    assert "a spec validation let through" in degraded["message"]
    progressing = api.condition("Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "PlanFailed"), progressing
    assert ("Pod", "fleet-0-0") in api.store, "the deleted pod was recreated from the spec the fleet runs"
    assert outcome.errors, "a failed pass: the work queue retries it on its back-off"


def test_a_role_switch_is_no_progress_but_more_instances_ready_or_updated_is() -> None:
    """A switch moves an instance from one role's counts to the other's: a policy that keeps
    switching must not keep resetting the clock of a rollout stuck on a hung canary."""
    then = "2020-01-01T00:00:00Z"
    previous = {"lastProgressTime": then, "prefill": {"ready": 2, "updated": 1}, "decode": {"ready": 2, "updated": 1}}
    progressing = {"status": "True", "reason": "RollingOut", "observedGeneration": 4}

    def at(prefill: tuple[int, int], decode: tuple[int, int]) -> float:
        per_role = {"prefill": RoleStatus(ready=prefill[0], updated=prefill[1]),
                    "decode": RoleStatus(ready=decode[0], updated=decode[1])}
        return last_progress(previous, progressing, 4, per_role, None, True, clock=2e9)

    assert at((3, 2), (1, 0)) != 2e9, "a rolled decode switched to prefill"
    assert at((2, 1), (2, 1)) != 2e9
    assert at((3, 1), (2, 1)) == 2e9, "one more instance ready"
    assert at((2, 2), (2, 1)) == 2e9, "one more instance updated"


def test_a_name_held_by_an_object_not_ours_is_reported_and_backs_off(api: MemoryApi) -> None:
    api.store[("ConfigMap", "fleet-prefill-config")] = {
        "kind": "ConfigMap", "metadata": {"name": "fleet-prefill-config", "uid": "squatter", "resourceVersion": "1"}}
    outcome = rec.reconcile(api, NS, "fleet")
    assert not outcome.conflict, "not a race: retrying at once cannot succeed"
    degraded = api.condition("Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "NameTaken"
    assert "ConfigMap/fleet-prefill-config" in degraded["message"]
    assert any(k == INSTANCE_KIND for k, _ in api.store), "the rest of the fleet is still built"
    assert outcome.errors, "a failed pass: the work queue retries it on its back-off"


@pytest.mark.parametrize("status, reason", [(403, "WriteForbidden"), (422, "WriteInvalid")])
def test_a_refused_write_is_reported_with_its_kind_and_the_rest_goes_on(api: MemoryApi, status: int,
                                                                         reason: str) -> None:
    api.fail = lambda verb, kind, name: status if kind == "Deployment" else None
    outcome = rec.reconcile(api, NS, "fleet")
    assert outcome.errors and not outcome.conflict
    degraded = api.condition("Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == reason
    assert "Deployment/fleet-router" in degraded["message"]
    assert sum(1 for k, _ in api.children() if k == INSTANCE_KIND) == 4


def test_a_fleet_that_stops_progressing_says_so_naming_the_instances(api: MemoryApi) -> None:
    for _ in range(3):
        rec.reconcile(api, NS, "fleet")  # pods never run: a hung start
    progressing = api.condition("Progressing")
    assert progressing["status"] == "True"
    api.status()["lastProgressTime"] = "2020-01-01T00:00:00Z"
    rec.reconcile(api, NS, "fleet", progress_deadline_seconds=600)
    progressing, degraded = api.condition("Progressing"), api.condition("Degraded")
    assert progressing["status"] == "False" and progressing["reason"] == "ProgressDeadlineExceeded"
    assert "fleet-0" in progressing["message"] and "fleet-3" in progressing["message"]
    assert degraded["status"] == "True" and degraded["reason"] == "ProgressDeadlineExceeded"
    rec.reconcile(api, NS, "fleet", progress_deadline_seconds=600)
    assert api.condition("Progressing")["reason"] == "ProgressDeadlineExceeded", "no flapping back"
    api.run_pods()
    settle(api)
    rec.reconcile(api, NS, "fleet")
    assert api.condition("Progressing")["reason"] == "Complete"
    assert api.condition("Degraded")["status"] == "False"


def test_a_crash_looping_engine_is_named_in_degraded(api: MemoryApi) -> None:
    settle(api)
    pod = api.store[("Pod", "fleet-1-0")]
    pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}],
                     "containerStatuses": [{"name": "engine", "restartCount": 4,
                                            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                            "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}
    rec.reconcile(api, NS, "fleet")
    degraded = api.condition("Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "CrashLoop"
    assert "fleet-1 is crash looping" in degraded["message"]


def test_images_outside_the_allow_list_are_refused_naming_the_field() -> None:
    from hybridserving.controller.reconcile import validate
    from hybridserving.core.privileges import EnginePolicy

    body = {
        "apiVersion": "hybridserving.io/v1alpha1", "kind": "HybridServing",
        "metadata": {"name": "imgs", "namespace": "default"},
        "spec": {**SPEC, "engine": {"image": "evil.example/miner:1"}},
    }
    policy = EnginePolicy(allowed_images=("registry.example/serving/",))
    _, refused = validate(body, policy)
    assert [i.path for i in refused.errors] == ["spec.engine.image", "spec.router.image"]
    assert "enginePolicy.allowedImages" in refused.message()
    body["spec"] = {**SPEC, "engine": {"image": "registry.example/serving/sglang:0.5.23"},
                    "router": {"image": "registry.example/serving/smg:1.13.0"}}
    _, ok = validate(body, policy)
    assert ok.valid, ok.message()
    _, anything = validate({**body, "spec": {**SPEC, "engine": {"image": "evil.example/miner:1"}}}, EnginePolicy())
    assert anything.valid, "no allow-list: any image (the chart documents the risk)"


def test_a_fleet_naming_no_engine_image_runs_the_operators_default_and_is_checked_against_the_allow_list() -> None:
    from hybridserving.controller.reconcile import validate
    from hybridserving.core.privileges import EnginePolicy
    from support.apiserver import FakeCluster

    body = {"apiVersion": "hybridserving.io/v1alpha1", "kind": "HybridServing",
            "metadata": {"name": "dflt", "namespace": "default", "uid": "u"}, "spec": dict(SPEC)}
    policy = EnginePolicy(default_image="registry.example/serving/engine:9",
                          allowed_images=("registry.example/", "lightseekorg/smg:"))
    hs, checked = validate(body, policy)
    assert hs is not None and checked.valid, checked.message()
    cluster = FakeCluster()
    for _ in range(3):  # configs and instances, then pods
        cluster.reconcile(hs)
    images = {c["image"] for pod in cluster.pods().values() for c in pod["spec"]["containers"]}
    assert images == {"registry.example/serving/engine:9"}
    named, _ = validate({**body, "spec": {**SPEC, "engine": {"image": "registry.example/own:1"}}}, policy)
    assert named is not None and named.spec.engine.image == "registry.example/own:1", "the fleet's own wins"
    _, refused = validate(body, EnginePolicy(default_image="elsewhere.example/engine:1",
                                             allowed_images=("registry.example/", "lightseekorg/smg:")))
    assert [i.path for i in refused.errors] == ["spec.engine.image"]


def test_a_fleet_naming_no_router_image_runs_the_operators_default_so_a_mirror_is_set_once() -> None:
    """An air-gapped cluster lists only its registry in allowedImages: the operator's default router
    image (chart value routerImage) points there once, for every fleet that names none."""
    from hybridserving.controller.reconcile import validate
    from hybridserving.core.privileges import EnginePolicy

    body = {"apiVersion": "hybridserving.io/v1alpha1", "kind": "HybridServing",
            "metadata": {"name": "dflt", "namespace": "default", "uid": "u"}, "spec": dict(SPEC)}
    mirror = EnginePolicy(default_image="registry.example/engine:9", default_router_image="registry.example/smg:1.13.0",
                          allowed_images=("registry.example/",))
    hs, checked = validate(body, mirror)
    assert hs is not None and checked.valid, checked.message()
    from hybridserving.core import planner
    from hybridserving.core.observed import Observed

    (router,) = [o for (kind, _), o in planner.plan(hs, Observed()).objects.items() if kind == "Deployment"]
    assert [c["image"] for c in router["spec"]["template"]["spec"]["containers"]] == ["registry.example/smg:1.13.0"]
    _, refused = validate(body, EnginePolicy(default_image="registry.example/engine:9",
                                             allowed_images=("registry.example/",)))
    assert [i.path for i in refused.errors] == ["spec.router.image"], "this release's default is not mirrored"
    named, _ = validate({**body, "spec": {**SPEC, "router": {"image": "registry.example/smg:1.12.0"}}}, mirror)
    assert named is not None and named.spec.router_image() == "registry.example/smg:1.12.0", "the fleet's own wins"


def ago(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - seconds))


def events(api: MemoryApi) -> list[dict[str, Any]]:
    return [o for (k, _), o in sorted(api.store.items()) if k == "Event"]


def test_events_name_the_writes_the_apiserver_took_and_a_refused_one_gets_one_warning(api: MemoryApi) -> None:
    api.fail = lambda verb, kind, name: 403 if verb == "create" and name == "fleet-prefill-config" else None
    outcome = rec.reconcile(api, NS, "fleet")
    assert outcome.applied and all(a.name != "fleet-prefill-config" for a in outcome.applied)
    normal = " ".join(e["message"] for e in events(api) if e["type"] == "Normal")
    assert "fleet-prefill-config" not in normal, "a refused create is not reported as made"
    last = outcome.applied[-1]
    assert f"{last.verb} {last.kind}" in normal and last.name in normal, "the last write taken is reported"
    warnings = [e for e in events(api) if e["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["WriteForbidden"]
    assert "fleet-prefill-config" in warnings[0]["message"]
    rec.reconcile(api, NS, "fleet")
    assert len([e for e in events(api) if e["type"] == "Warning"]) == 1, "once, when the reason starts"


def test_a_refused_instance_status_write_leaves_the_fleet_degraded_not_ready(api: MemoryApi) -> None:
    settle(api)
    api.store[("Pod", "fleet-1-0")]["status"] = {
        "phase": "Running", "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": [{"name": "engine", "restartCount": 4,
                               "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                               "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}
    api.fail = lambda verb, kind, name: 403 if verb == "patch" and kind == INSTANCE_KIND else None
    outcome = rec.reconcile(api, NS, "fleet")
    assert outcome.errors and outcome.requeue_after is not None
    assert api.condition("Ready")["status"] == "False" and api.status()["ready"] == "False"
    degraded = api.condition("Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "WriteForbidden"
    assert f"status of {INSTANCE_KIND}/fleet-1 not written" in degraded["message"]
    assert "fleet-1 is crash looping" in degraded["message"]
    assert [e["reason"] for e in events(api) if e["type"] == "Warning"] == ["WriteForbidden"]


def test_a_refused_fleet_status_write_is_told_in_an_event_and_the_pass_fails(api: MemoryApi) -> None:
    settle(api)
    api.store[("Pod", "fleet-1-0")]["status"] = {"phase": "Running",
                                                 "conditions": [{"type": "Ready", "status": "False"}]}
    api.fail = lambda verb, kind, name: 403 if verb == "patch" and kind == KIND else None
    with pytest.raises(KubeError) as raised:
        rec.reconcile(api, NS, "fleet")
    assert raised.value.status == 403, "the work queue retries a failed pass with a growing back-off"
    assert api.condition("Ready")["status"] == "True", "the stored status could not be changed"
    warning = next(e for e in events(api) if e["reason"] == "StatusNotWritten")
    assert warning["type"] == "Warning" and "Ready=False" in warning["message"]


def test_a_child_that_lost_its_fleet_label_gets_it_back_and_the_rest_is_repaired(api: MemoryApi) -> None:
    settle(api)
    api.store[("ConfigMap", "fleet-prefill-config")]["metadata"]["labels"].pop(LABEL_NAME)
    del api.store[("Pod", "fleet-3-0")]
    outcome = rec.reconcile(api, NS, "fleet")
    assert not outcome.conflict and not outcome.errors
    assert api.store[("ConfigMap", "fleet-prefill-config")]["metadata"]["labels"][LABEL_NAME] == "fleet"
    assert ("Pod", "fleet-3-0") in api.store, "the writes after the hidden object's still ran"
    settle(api)
    assert api.condition("Ready")["status"] == "True" and api.condition("Degraded")["status"] == "False"


def test_an_engine_that_stops_answering_and_a_container_that_cannot_start_are_named_in_degraded(
    api: MemoryApi,
) -> None:
    settle(api)
    started, turned = ago(3600), ago(120)
    api.store[("Pod", "fleet-1-0")]["status"] = {
        "phase": "Running", "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": turned}],
        "containerStatuses": [{"name": "engine", "restartCount": 0, "ready": False,
                               "state": {"running": {"startedAt": started}}}]}
    api.store[("Pod", "fleet-2-0")]["status"] = {
        "phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": [{"name": "engine", "restartCount": 0, "ready": False, "state": {"waiting": {
            "reason": "ImagePullBackOff", "message": 'Back-off pulling image "sglang:typo"'}}}]}
    rec.reconcile(api, NS, "fleet")
    phases = {i["name"]: i["phase"] for i in api.status()["instances"]}
    assert phases["fleet-1"] == "Unready" and phases["fleet-2"] == "Blocked", phases
    blocked = api.store[(INSTANCE_KIND, "fleet-2")]["status"]["conditions"][0]
    assert blocked["status"] == "False" and "ImagePullBackOff" in blocked["message"]
    assert "sglang:typo" in blocked["message"]
    degraded = api.condition("Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "ContainerBlocked"
    assert "fleet-2 cannot start: container engine: ImagePullBackOff" in degraded["message"]
    assert "fleet-1 stopped answering the engine's readiness probe" in degraded["message"]
    assert api.condition("Ready")["status"] == "False"
    assert [e["reason"] for e in events(api) if e["type"] == "Warning"] == ["ContainerBlocked"]

    api.store[("Pod", "fleet-2-0")]["status"] = {"phase": "Running",
                                                 "conditions": [{"type": "Ready", "status": "True"}]}
    rec.reconcile(api, NS, "fleet")
    assert api.condition("Degraded")["reason"] == "EngineUnready"
    assert [e["reason"] for e in events(api) if e["type"] == "Warning"] == ["ContainerBlocked", "EngineUnready"]


def test_an_engine_loading_since_its_container_started_is_starting_not_unready(api: MemoryApi) -> None:
    settle(api)
    api.store[("Pod", "fleet-1-0")]["status"] = {
        "phase": "Running", "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": ago(60)}],
        "containerStatuses": [{"name": "engine", "restartCount": 0, "ready": False,
                               "state": {"running": {"startedAt": ago(55)}}}]}
    rec.reconcile(api, NS, "fleet")
    assert {i["name"]: i["phase"] for i in api.status()["instances"]}["fleet-1"] == "Starting"
    assert api.condition("Degraded")["status"] == "False"


def test_a_canary_held_for_hours_then_promoted_has_its_whole_progress_deadline(api: MemoryApi) -> None:
    settle(api)
    spec = copy.deepcopy(SPEC)
    spec["engine"] = {"image": "registry.example/sglang:v2"}
    spec["rollout"] = {"canary": 1}
    api.user_apply(spec)
    settle(api)
    assert api.condition("Progressing")["reason"] == "RolloutHeldByCanary"
    api.status()["lastProgressTime"] = "2020-01-01T00:00:00Z"  # the canary baked for years
    api.condition("Progressing")["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    rec.reconcile(api, NS, "fleet", progress_deadline_seconds=600)
    assert api.condition("Progressing")["reason"] == "RolloutHeldByCanary", "a hold is not stuck"
    spec["rollout"] = {}
    api.user_apply(spec)
    rec.reconcile(api, NS, "fleet", progress_deadline_seconds=600)
    progressing = api.condition("Progressing")
    assert progressing["status"] == "True" and progressing["reason"] == "RollingOut", progressing
    assert api.condition("Degraded")["status"] == "False"


def test_a_canary_that_never_comes_up_is_no_hold_and_its_rollout_runs_into_the_progress_deadline(
        api: MemoryApi) -> None:
    settle(api)
    spec = copy.deepcopy(SPEC)
    spec["engine"] = {"image": "registry.example/sglang:v2"}
    spec["rollout"] = {"canary": 1}
    api.user_apply(spec)

    def hang_decode_canary() -> None:
        """The new image's decode engine loads and never answers /ready, without crashing."""
        for (kind, _), pod in api.store.items():
            if (kind == "Pod" and pod["spec"]["containers"][0]["image"].endswith(":v2")
                    and pod["metadata"]["labels"].get("hybridserving.io/role") == "decode"):
                pod["status"] = {
                    "phase": "Running", "conditions": [{"type": "Ready", "status": "False",
                                                        "lastTransitionTime": ago(7200)}],
                    "containerStatuses": [{"name": "engine", "restartCount": 0, "ready": False,
                                           "state": {"running": {"startedAt": ago(7200)}}}]}

    for _ in range(6):
        rec.reconcile(api, NS, "fleet")
        api.run_pods()
        hang_decode_canary()
    progressing = api.condition("Progressing")
    assert progressing["reason"] == "RollingOut" and "once canary fleet-3 is available" in progressing["message"]
    assert api.status()["rollout"]["held"] == "", "not a hold: nothing asks on-call to promote it"
    api.status()["lastProgressTime"] = "2020-01-01T00:00:00Z"
    api.condition("Progressing")["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    rec.reconcile(api, NS, "fleet", progress_deadline_seconds=600)
    progressing, degraded = api.condition("Progressing"), api.condition("Degraded")
    assert progressing["status"] == "False" and progressing["reason"] == "ProgressDeadlineExceeded", progressing
    assert degraded["status"] == "True" and "not ready: fleet-3" in degraded["message"], degraded
    assert api.condition("Ready")["status"] == "False"
    api.run_pods()
    rec.reconcile(api, NS, "fleet", progress_deadline_seconds=600)
    assert api.condition("Progressing")["reason"] == "RolloutHeldByCanary", "once it serves, the hold is the user's"
    assert api.condition("Degraded")["status"] == "False"


def test_a_roll_to_pods_the_apiserver_refuses_keeps_the_running_gangs_and_says_why(api: MemoryApi) -> None:
    """Pod content no admission check caught (the webhook down during the update): the rollout would
    delete each gang and fail to create its successor. The dry run of the first new pod holds it."""
    settle(api)
    pods = {name: pod["metadata"]["uid"] for (kind, name), pod in api.store.items() if kind == "Pod"}
    hashes = {name: o["spec"]["configHash"] for (kind, name), o in api.store.items() if kind == INSTANCE_KIND}
    api.fail = lambda verb, kind, name: 422 if verb == "create-dry-run" and kind == "Pod" else None
    spec = copy.deepcopy(SPEC)
    spec["engine"] = {"image": "registry.example/sglang:v2"}
    api.user_apply(spec)
    for _ in range(4):
        rec.reconcile(api, NS, "fleet")
        api.run_pods()
    assert {name: pod["metadata"]["uid"] for (kind, name), pod in api.store.items() if kind == "Pod"} == pods
    assert {name: o["spec"]["configHash"] for (kind, name), o in api.store.items() if kind == INSTANCE_KIND} == hashes
    degraded = api.condition("Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "RolloutPodInvalid", degraded
    assert "not rolled: the apiserver refuses its new pods" in degraded["message"]
    assert api.condition("Ready")["status"] == "True", "every instance still serves"
    assert [e["reason"] for e in events(api) if e["type"] == "Warning"] == ["RolloutPodInvalid"]

    api.fail = lambda verb, kind, name: None  # the field fixed, or the refusal was never the spec's
    settle(api, passes=20)
    assert {pod["spec"]["containers"][0]["image"] for (kind, _), pod in api.store.items()
            if kind == "Pod"} == {"registry.example/sglang:v2"}
    assert api.condition("Degraded")["status"] == "False"


def render_as_a_newer_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on the operator renders every engine pod with one more env var, as a new operator
    version may: the spec and its configuration revision stay what they were."""
    older = rendering.pod_spec

    def newer(*args: Any, **kwargs: Any) -> dict[str, Any]:
        pod = older(*args, **kwargs)
        pod["containers"][0].setdefault("env", []).append({"name": "HYBRIDSERVING_NEWER", "value": "1"})
        return pod

    monkeypatch.setattr(rendering, "pod_spec", newer)


def newer_pods(api: MemoryApi) -> set[str]:
    return {name for (kind, name), pod in api.store.items() if kind == "Pod"
            and {"name": "HYBRIDSERVING_NEWER", "value": "1"} in pod["spec"]["containers"][0].get("env", [])}


def test_an_operator_that_renders_the_pods_anew_rolls_them_and_says_the_configuration_is_unchanged(
        api: MemoryApi, monkeypatch: pytest.MonkeyPatch) -> None:
    settle(api)
    revisions = {k for k in api.store if k[0] == "ControllerRevision"}
    update = api.status()["rollout"]["updateRevision"]
    render_as_a_newer_operator(monkeypatch)
    outcome = rec.reconcile(api, NS, "fleet")
    rolls = [a for a in outcome.actions if a.kind == INSTANCE_KIND]
    assert len(rolls) == 1 and Cause.ROLLOUT in rolls[0].causes, "within maxUnavailable 1, as a spec change"
    assert rolls[0].reason.startswith(f"rolling prefill instance to {RERENDERED} ("), rolls[0].reason
    rollout = api.status()["rollout"]
    assert rollout["currentRevision"] == rollout["updateRevision"] == update
    assert rollout["message"].startswith(f"configuration {update} unchanged, rolling to the pod template "
                                         "this operator now renders (its version or settings changed): "), rollout
    progressing = api.condition("Progressing")
    assert progressing["reason"] == "RollingOut"
    assert progressing["message"].startswith(f"3 instance(s) to roll to {RERENDERED}, one role at a time: ")
    settle(api)
    assert newer_pods(api) == {"fleet-0-0", "fleet-1-0", "fleet-2-0", "fleet-3-0"}
    assert {k for k in api.store if k[0] == "ControllerRevision"} == revisions, "no new configuration recorded"
    assert api.condition("Progressing")["reason"] == "Complete"
    assert api.status()["rollout"]["message"] == f"every instance runs {update}"


def test_a_paused_or_canaried_fleet_holds_an_operator_upgrades_roll_as_it_holds_a_spec_change(
        api: MemoryApi, monkeypatch: pytest.MonkeyPatch) -> None:
    settle(api)
    api.user_apply({**SPEC, "rollout": {"paused": True}})
    settle(api)
    render_as_a_newer_operator(monkeypatch)
    settle(api)
    assert newer_pods(api) == set(), "paused: no engine restarts"
    progressing = api.condition("Progressing")
    assert progressing["reason"] == "RolloutPaused"
    assert progressing["message"] == (f"rollout paused with 4 instance(s) to roll to {RERENDERED}: "
                                      "fleet-0, fleet-1, fleet-2, fleet-3")
    api.user_apply({**SPEC, "rollout": {"canary": 1}})
    settle(api)
    assert len(newer_pods(api)) == 2, "one instance of each role"
    assert api.condition("Progressing")["reason"] == "RolloutHeldByCanary"
    api.user_apply(SPEC)
    settle(api)
    assert len(newer_pods(api)) == 4


def test_a_rollout_that_keeps_bringing_instances_up_is_not_called_stuck(api: MemoryApi) -> None:
    for _ in range(3):
        rec.reconcile(api, NS, "fleet")
    api.status()["lastProgressTime"] = "2020-01-01T00:00:00Z"
    api.condition("Progressing")["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    pod = api.store[("Pod", "fleet-0-0")]
    pod["spec"]["nodeName"] = "node-0"
    pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    rec.reconcile(api, NS, "fleet", progress_deadline_seconds=600)
    assert api.condition("Progressing")["status"] == "True", "one more instance ready is progress"
    assert parse_time(api.status()["lastProgressTime"]) > time.time() - 60


def test_an_engine_unready_for_less_than_three_probe_periods_is_not_reported_yet(api: MemoryApi) -> None:
    settle(api)
    api.store[("Pod", "fleet-1-0")]["status"] = {
        "phase": "Running", "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": ago(10)}],
        "containerStatuses": [{"name": "engine", "restartCount": 0, "ready": False,
                               "state": {"running": {"startedAt": ago(3600)}}}]}
    rec.reconcile(api, NS, "fleet")
    assert {i["name"]: i["phase"] for i in api.status()["instances"]}["fleet-1"] == "Starting"
    assert api.condition("Degraded")["status"] == "False"


def test_a_name_that_starts_with_a_digit_is_refused_before_anything_is_written() -> None:
    api = MemoryApi()
    api.user_apply(SPEC, name="1abc")
    outcome = rec.reconcile(api, NS, "1abc")
    assert not outcome.actions, "no Service named 1abc-router: Kubernetes refuses it (DNS-1035)"
    layout = next(c for c in api.store[(KIND, "1abc")]["status"]["conditions"] if c["type"] == "LayoutValid")
    assert layout["status"] == "False" and layout["message"].startswith("metadata.name: ")
    assert "must start with a lowercase letter" in layout["message"]


def test_a_gang_that_keeps_failing_backs_off_says_so_and_each_restart_is_an_event(api: MemoryApi) -> None:
    settle(api)

    def restart_events() -> list[str]:
        return [e["message"] for e in events(api)
                if e["involvedObject"]["kind"] == INSTANCE_KIND and e["reason"] == "GangRestart"]

    api.store[("Pod", "fleet-1-0")]["status"]["phase"] = "Failed"
    rec.reconcile(api, NS, "fleet")
    assert len(restart_events()) == 1 and "gang restart 1 in a row: pod fleet-1-0 failed" in restart_events()[0]
    settle(api)
    api.store[("Pod", "fleet-1-0")]["status"]["phase"] = "Failed"  # right after its start
    held = rec.reconcile(api, NS, "fleet")
    assert not [a for a in held.actions if Cause.GANG_RESTART in a.causes] and len(restart_events()) == 1
    assert held.requeue_after is not None and held.requeue_after <= 10.5, "back when the restart is due"
    degraded = api.condition("Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "CrashLoopBackOff", degraded
    assert "fleet-1 keeps failing (pod fleet-1-0 failed) after 1 gang restart(s) in a row: next restart at " \
        in degraded["message"]
    ready = api.store[(INSTANCE_KIND, "fleet-1")]["status"]["conditions"][0]
    assert ready["status"] == "False" and ready["reason"] == "CrashLoopBackOff"
    assert "next restart at" in ready["message"]
    assert "CrashLoopBackOff" in {e["reason"] for e in events(api) if e["type"] == "Warning"}

    # The record on the instance is all a pass reads: one started now (a restarted operator) too.
    annotations = api.store[(INSTANCE_KIND, "fleet-1")]["metadata"]["annotations"]
    record = GangRestarts.from_annotation(annotations[ANNOTATION_GANG_RESTARTS])
    assert record is not None and record.count == 1
    annotations[ANNOTATION_GANG_RESTARTS] = GangRestarts(1, time.time() - 10).to_annotation()
    again = rec.reconcile(api, NS, "fleet")
    assert [a.name for a in again.applied if Cause.GANG_RESTART in a.causes and a.kind == INSTANCE_KIND] == ["fleet-1"]
    assert len(restart_events()) == 2 and "gang restart 2 in a row" in restart_events()[1]
    assert "next restart waits 20s" in restart_events()[1]


def test_a_gang_in_its_restart_loop_stays_degraded_until_it_is_ready_again(api: MemoryApi) -> None:
    """Degraded is True from the first back-off until the restarted gang is Ready: not False
    while each restarted gang starts, as a pod stays CrashLoopBackOff until its container runs."""
    settle(api)
    pod, instance = ("Pod", "fleet-1-0"), (INSTANCE_KIND, "fleet-1")
    seen: list[tuple[str, str, str]] = []

    def step(what: str) -> dict[str, Any]:
        rec.reconcile(api, NS, "fleet")
        degraded = api.condition("Degraded")
        seen.append((what, degraded["status"], degraded["reason"]))
        return degraded

    def record() -> GangRestarts:
        annotations = api.store[instance]["metadata"]["annotations"]
        restarts = GangRestarts.from_annotation(annotations[ANNOTATION_GANG_RESTARTS])
        assert restarts is not None
        return restarts

    def restart_due() -> None:
        """Time passes until the held restart is due (its record, all a pass reads, moves back)."""
        held = record()
        api.store[instance]["metadata"]["annotations"][ANNOTATION_GANG_RESTARTS] = GangRestarts(
            held.count, held.last - backoff.delay(held.count)).to_annotation()

    def restarted_gang_created(what: str) -> None:
        generation = api.store[instance]["spec"]["restartGeneration"]
        for _ in range(3):
            if pod in api.store and api.store[pod]["metadata"]["annotations"].get(
                    ANNOTATION_RESTART_GENERATION) == str(generation):
                return
            step(what)
        raise AssertionError("the restarted gang's pod was not created")

    def fail() -> None:
        api.store[pod].setdefault("status", {})["phase"] = "Failed"

    fail()
    rec.reconcile(api, NS, "fleet")
    restarted_gang_created("first restart")
    assert record().count == 1
    assert api.condition("Degraded")["status"] == "False", "one failure restarted at once is no loop yet"
    seen.clear()

    fail()  # the restarted gang fails before it is Ready
    first = step("held by its back-off")
    assert "fleet-1 keeps failing (pod fleet-1-0 failed) after 1 gang restart(s) in a row: next restart at " \
        in first["message"]
    for count in (2, 3):
        restart_due()
        step(f"restart {count}")
        assert record().count == count
        starting = api.condition("Degraded")
        assert starting["reason"] == "CrashLoopBackOff", starting
        assert f"fleet-1 keeps failing: gang restart {count} in a row at " in starting["message"]
        assert "is starting again" in starting["message"]
        ready = api.store[instance]["status"]["conditions"][0]
        assert (ready["status"], ready["reason"]) == ("False", "CrashLoopBackOff"), ready
        restarted_gang_created(f"restart {count}: its pod created")
        api.store[pod]["spec"]["nodeName"] = "node-0"
        api.store[pod]["status"] = {  # the engine loads
            "phase": "Running", "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": ago(20)}],
            "containerStatuses": [{"name": "engine", "restartCount": 0, "ready": False,
                                   "state": {"running": {"startedAt": ago(15)}}}]}
        step(f"restart {count}: the engine loads")
        if count == 2:
            fail()
            assert f"after {count} gang restart(s) in a row: next restart at" in step("fails again")["message"]
    assert all((status, reason) == ("True", "CrashLoopBackOff") for _, status, reason in seen), seen
    assert api.condition("Degraded")["lastTransitionTime"] == first["lastTransitionTime"]

    api.run_pods()
    degraded = step("Ready")
    assert (degraded["status"], degraded["reason"]) == ("False", "AsExpected"), degraded
    assert record().count == 3, "the back-off remembers the restarts until the gang has served 10 minutes"
    assert [e["reason"] for e in events(api) if e["type"] == "Warning" and e["involvedObject"]["kind"] == KIND] \
        == ["CrashLoopBackOff"], "one Warning for the whole loop"

    api.store[pod]["status"] = {  # the engine that served pauses (a role switch, a hiccup)
        "phase": "Running", "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": ago(5)}],
        "containerStatuses": [{"name": "engine", "restartCount": 0, "ready": False,
                               "state": {"running": {"startedAt": ago(60)}}}]}
    paused = step("served, then paused")
    assert paused["status"] == "False", "a gang Ready since its restart is out of its loop"


def test_pods_gated_untried_by_their_scheduler_or_never_created_are_named_in_degraded(api: MemoryApi) -> None:
    settle(api)
    gated = api.store[("Pod", "fleet-0-0")]
    gated["metadata"]["creationTimestamp"] = ago(300)
    gated["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    gated["spec"].pop("nodeName", None)
    gated["status"] = {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}
    creating = api.store[("Pod", "fleet-2-0")]
    creating["status"] = {"phase": "Pending", "startTime": ago(900), "containerStatuses": [
        {"name": "engine", "ready": False, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}]}
    rec.reconcile(api, NS, "fleet")
    degraded = api.condition("Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "SchedulingGated", degraded
    assert "pod fleet-0-0 has waited 5 min on its scheduling gate(s) kueue.x-k8s.io/admission" in degraded["message"]
    assert "pod fleet-2-0 has waited 15 min for its container(s) engine to be created" in degraded["message"]
    phases = {i["name"]: i["phase"] for i in api.status()["instances"]}
    assert (phases["fleet-0"], phases["fleet-2"]) == ("Stalled", "Stalled"), phases
    status = api.store[(INSTANCE_KIND, "fleet-0")]["status"]
    assert status["phase"] == "Stalled" and status["conditions"][0]["reason"] == "SchedulingGated"

    gated["spec"]["schedulingGates"] = []
    rec.reconcile(api, NS, "fleet")
    assert api.condition("Degraded")["reason"] == "ContainerNotCreated"
    assert {i["name"]: i["phase"] for i in api.status()["instances"]}["fleet-0"] == "Starting"

    # A scheduler that is not running never writes PodScheduled: the pod waits without a word.
    gated["spec"]["schedulerName"] = "volcano"
    gated["status"] = {"phase": "Pending"}
    rec.reconcile(api, NS, "fleet")
    degraded = api.condition("Degraded")
    assert degraded["reason"] == "NoScheduler", degraded
    assert "pod fleet-0-0 has waited 5 min for a scheduler named 'volcano' to try it" in degraded["message"]
    assert "pod fleet-2-0 has waited 15 min for its container(s) engine to be created" in degraded["message"]
    assert api.store[(INSTANCE_KIND, "fleet-0")]["status"]["conditions"][0]["reason"] == "NoScheduler"


def gang_workload_spec() -> dict[str, Any]:
    spec = copy.deepcopy(SPEC)
    spec["gang"] = {"mode": "Workload"}
    return spec


def test_a_kind_the_cluster_does_not_serve_is_degraded_and_backs_off_not_retried_as_a_race(api: MemoryApi) -> None:
    """A create's 404 is the API not served (Workload is alpha): retrying at once cannot succeed."""
    api.user_apply(gang_workload_spec())
    api.fail = lambda verb, kind, name: 404 if verb == "create" and kind == "Workload" else None
    for _ in range(4):  # instances, then their pods and Workloads
        outcome = rec.reconcile(api, NS, "fleet")
        api.run_pods()
    assert not outcome.conflict and outcome.errors
    degraded = api.condition("Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "APINotServed"
    assert "does not serve Workload" in degraded["message"] and "enable that API" in degraded["message"]
    assert any(k == "Pod" for k, _ in api.store), "the rest of the fleet is still created"
    assert [e["reason"] for e in events(api) if e["type"] == "Warning"] == ["APINotServed"]


def test_an_invalid_edit_that_drops_the_workload_gang_still_heals_from_the_applied_spec(api: MemoryApi) -> None:
    """The pass plans from the last applied spec, which has Workloads: it must list them to see them."""
    api.user_apply(gang_workload_spec())
    settle(api)
    workloads = sorted(n for k, n in api.store if k == "Workload")
    assert workloads
    invalid = copy.deepcopy(SPEC)
    invalid["decode"]["layout"]["tp"] = 7
    api.user_apply(invalid)
    del api.store[("Pod", "fleet-0-0")]
    outcome = rec.reconcile(api, NS, "fleet")
    assert not outcome.conflict and not outcome.errors
    assert ("Pod", "fleet-0-0") in api.store, "the deleted pod comes back"
    assert sorted(n for k, n in api.store if k == "Workload") == workloads
    assert api.condition("LayoutValid")["status"] == "False" and api.condition("Degraded")["status"] == "False"


@pytest.mark.parametrize("deleting", [True, False], ids=["draining", "not-yet-collected"])
def test_a_scale_up_that_meets_the_pod_of_the_instance_it_replaces_waits_for_it(api: MemoryApi,
                                                                               deleting: bool) -> None:
    """Scaled down, the instance's pods drain under its uid (up to drainTimeoutSeconds + 30 s);
    scaled up again meanwhile, the new instance takes the same index and its pod the same name. The
    old pod leaves by itself: the create waits for it, it is not NameTaken and not a failure."""
    settle(api)
    spec = copy.deepcopy(SPEC)
    spec["decode"]["replicas"] = 1
    api.user_apply(spec)
    rec.reconcile(api, NS, "fleet")
    assert ("Pod", "fleet-3-0") in api.store and (INSTANCE_KIND, "fleet-3") not in api.store
    old = api.store[("Pod", "fleet-3-0")]
    old_owner = old["metadata"]["ownerReferences"][0]["uid"]
    if deleting:  # the garbage collector deleted it, its engine drains
        old["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    api.user_apply(SPEC)
    for _ in range(4):
        outcome = rec.reconcile(api, NS, "fleet")
        api.run_pods()
        assert not outcome.errors, outcome.errors
        assert api.condition("Degraded")["reason"] != "NameTaken"
        assert outcome.requeue_after is not None, "it looks again soon"
    assert api.store[("Pod", "fleet-3-0")]["metadata"]["ownerReferences"][0]["uid"] == old_owner
    assert api.condition("Degraded")["status"] == "False"
    for key in [k for k, o in api.store.items()  # drained and collected, with the rest of the old instance's
                if old_owner in {r["uid"] for r in o["metadata"].get("ownerReferences") or []}]:
        del api.store[key]
    settle(api)
    new = api.store[("Pod", "fleet-3-0")]["metadata"]["ownerReferences"][0]["uid"]
    assert new == api.store[(INSTANCE_KIND, "fleet-3")]["metadata"]["uid"] != old_owner
    assert api.condition("Ready")["status"] == "True" and api.condition("Degraded")["status"] == "False"


@pytest.mark.parametrize("owner", [None, {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8f",
                                          "uid": "rs-uid", "controller": True}], ids=["orphaned", "someone-elses"])
def test_a_pod_name_held_by_a_live_object_with_the_fleets_label_is_still_name_taken(
        api: MemoryApi, owner: dict[str, Any] | None) -> None:
    """Neither an orphan (nobody deletes it) nor an object with a live owner of its own leaves by
    itself: the fleet's label alone does not make the wait transient."""
    settle(api)
    pod = api.store.pop(("Pod", "fleet-3-0"))
    pod["metadata"]["uid"] = "squatter"
    pod["metadata"]["ownerReferences"] = [owner] if owner else []
    api.store[("Pod", "fleet-3-0")] = pod
    outcome = rec.reconcile(api, NS, "fleet")
    degraded = api.condition("Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "NameTaken")
    assert "Pod/fleet-3-0" in degraded["message"] and outcome.errors


def test_a_fleet_nothing_can_be_planned_for_drops_the_counts_of_its_last_plan(
    api: MemoryApi, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With no plan, no instance is judged: the role counts and instance list an earlier pass wrote
    would say 2/2 Ready beside ready=False (a merge patch keeps what it does not name)."""
    settle(api)
    assert api.status()["decode"]["summary"] == "2/2"

    def plan(*_: Any, **__: Any) -> Any:
        raise ValueError("a planner bug")

    monkeypatch.setattr(rec.planner, "plan", plan)
    api.user_apply({**SPEC, "decode": {"replicas": 3, "layout": {"tp": 8}}})
    rec.reconcile(api, NS, "fleet")
    status = api.status()
    assert status["ready"] == "False" and api.condition("Ready")["reason"] == "PlanFailed"
    assert not {"prefill", "decode", "instances", "capacity"} & status.keys(), status.keys()
    assert status["replicas"] == 4, "the instances that exist, for the scale subresource"
    writes = sum(api.writes.values())
    rec.reconcile(api, NS, "fleet")
    assert sum(api.writes.values()) == writes, "the removal is written once"
