"""`hybridserving rollback`: which revision it goes back to, what it writes, and when it warns."""

from __future__ import annotations

import copy
import io
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from hybridserving.api.v1alpha1 import HybridServingSpec
from hybridserving.commands.rollback import choose, gitops_manager, rollback
from hybridserving.core import revisions
from support.fleets import SPEC


def spec(image: str, **extra: Any) -> dict[str, Any]:
    out = copy.deepcopy(SPEC)
    out["engine"] = {"image": image}
    out.update(extra)
    return HybridServingSpec.model_validate(out).to_wire()


def revision(image: str, number: int, owner: str = "uid-1") -> dict[str, Any]:
    s = spec(image)
    name = f"hs-{revisions.revision_hash(HybridServingSpec.model_validate(s))}"
    return {"metadata": {"name": name, "ownerReferences": [{"uid": owner}]}, "revision": number,
            "data": {"spec": revisions.revision_spec(s)}}


class FakeApi:
    """The fleet and its ControllerRevisions, as CustomObjectsApi answers for them. `meddling`: what
    others write to the fleet between a read and each replace, one per replace, in turn."""

    def __init__(self, hs: dict[str, Any], revs: list[dict[str, Any]],
                 meddling: list[Callable[[dict[str, Any]], None]] | None = None) -> None:
        self.hs, self.revs = hs, revs
        self.meddling = list(meddling or [])
        self.replaced: dict[str, Any] | None = None
        self.replaces = 0

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str,
                                     name: str) -> object:
        return copy.deepcopy(self.hs)

    def list_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, *,
                                      label_selector: str | None = None) -> object:
        assert (group, plural, label_selector) == ("apps", "controllerrevisions", "hybridserving.io/name=hs")
        return {"items": copy.deepcopy(self.revs)}

    def replace_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str,
                                         body: dict[str, Any], *, field_manager: str | None = None) -> object:
        assert field_manager == "hybridserving-rollback"
        self.replaces += 1
        if self.meddling:
            self.meddling.pop(0)(self.hs)
        if body["metadata"]["resourceVersion"] != self.hs["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        self.replaced = body
        self.hs = copy.deepcopy(body)
        return body


def fleet(image: str, last_good: str = "", **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": "hs", "uid": "uid-1", "resourceVersion": "42", "managedFields": [{}], **meta},
            "spec": spec(image, prefill={"replicas": 4, "layout": {"tp": 8}}, rollout={"canary": 1}),
            "status": {"rollout": {"lastGoodRevision": last_good}}}


def test_rollback_goes_to_the_last_good_revision_keeping_replicas_and_rollout() -> None:
    revs = [revision("v1", 1), revision("v2", 2), revision("v3", 3)]
    api = FakeApi(fleet("v3", last_good=revs[0]["metadata"]["name"]), revs)
    out = io.StringIO()
    assert rollback(api, "ns", "hs", None, out) == 0
    assert api.replaced is not None
    written = api.replaced
    assert written["spec"]["engine"]["image"] == "v1"
    assert written["spec"]["prefill"]["replicas"] == 4 and written["spec"]["rollout"]["canary"] == 1
    assert written["metadata"]["resourceVersion"] == "42", "conditional on what was read"
    assert "managedFields" not in written["metadata"] and "status" not in written
    assert out.getvalue().splitlines() == [
        f"hs rolled back to revision 1 ({revs[0]['metadata']['name']}); the operator rolls it out within "
        "spec.rollout (maxUnavailable, canary, paused)",
        "  spec.engine.image: v3 → v1"]


def test_rolling_back_a_held_canary_to_what_the_rest_run_calls_the_canary_off() -> None:
    """Held at canary 1 on v3, the instances not rolled run v2: going back to v2, they count as the
    canary before anything moves, so a kept canary would hold the v3 canaries for good."""
    revs = [revision("v1", 1), revision("v2", 2), revision("v3", 3)]
    v2, v3 = revs[1]["metadata"]["name"], revs[2]["metadata"]["name"]
    hs = fleet("v3", last_good=v2)
    hs["status"]["rollout"].update(held="Canary", currentRevision=v2, updateRevision=v3)
    api = FakeApi(hs, revs)
    out = io.StringIO()
    assert rollback(api, "ns", "hs", None, out) == 0
    assert api.replaced is not None
    assert api.replaced["spec"]["engine"]["image"] == "v2" and "canary" not in api.replaced["spec"]["rollout"]
    assert api.replaced["spec"]["prefill"]["replicas"] == 4
    lines = out.getvalue().splitlines()
    assert "  spec.rollout.canary removed" in lines
    assert lines[-1].startswith(f"  the canary is called off: spec.rollout.canary is removed, or it would hold the "
                                f"canaries on {v3} (the instances it counts already run {v2})")

    # Back past what the rest run (v1), the canary holds the way back as it held the way forward.
    api = FakeApi(copy.deepcopy(hs), revs)
    assert rollback(api, "ns", "hs", 1, io.StringIO()) == 0
    assert api.replaced is not None and api.replaced["spec"]["rollout"]["canary"] == 1
    # Not held (the canaries still coming up, or promoted): the setting is the user's to keep.
    hs["status"]["rollout"]["held"] = ""
    api = FakeApi(hs, revs)
    assert rollback(api, "ns", "hs", None, io.StringIO()) == 0
    assert api.replaced is not None and api.replaced["spec"]["rollout"]["canary"] == 1


def test_rolling_back_a_paused_fleet_warns_that_nothing_serving_rolls() -> None:
    revs = [revision("v1", 1), revision("v2", 2)]
    hs = fleet("v2", last_good=revs[0]["metadata"]["name"])
    hs["spec"]["rollout"]["paused"] = True
    api = FakeApi(hs, revs)
    out = io.StringIO()
    assert rollback(api, "ns", "hs", None, out) == 0
    assert out.getvalue().splitlines()[-1] == (
        "  warning: spec.rollout.paused is true: nothing that serves rolls back until it is set to false")


def test_a_dry_run_says_the_revision_and_what_it_changes_and_writes_nothing() -> None:
    revs = [revision("v1", 1), revision("v2", 2)]
    api = FakeApi(fleet("v2"), revs)
    api.revs[0]["data"]["spec"]["decode"]["maxRunningRequests"] = 64
    api.hs["spec"]["prefill"]["maxRunningRequests"] = 32  # set after revision 1: it goes
    out = io.StringIO()
    assert rollback(api, "ns", "hs", None, out, dry_run=True) == 0 and api.replaced is None
    assert out.getvalue().splitlines() == [
        f"hs would roll back to revision 1 ({revs[0]['metadata']['name']}); nothing written (--dry-run)",
        "  spec.decode.maxRunningRequests: 64 (new)",
        "  spec.engine.image: v2 → v1",
        "  spec.prefill.maxRunningRequests removed"]


def test_without_a_last_good_one_it_goes_to_the_revision_before_the_current_one() -> None:
    revs = [revision("v1", 1), revision("v2", 2), revision("v3", 3)]
    assert choose(revs, revs[2]["metadata"]["name"], revs[2]["metadata"]["name"], None) is revs[1]
    assert choose(revs, revs[2]["metadata"]["name"], "", None) is revs[1]
    assert choose(revs, revs[2]["metadata"]["name"], "", 1) is revs[0]
    with pytest.raises(ValueError, match="--to-revision 7: no such revision \\(kept: 3, 2, 1\\)"):
        choose(revs, "x", "", 7)
    with pytest.raises(ValueError, match="no earlier revision"):
        choose(revs[:1], revs[0]["metadata"]["name"], "", None)


def on_the_default_image(revs: list[dict[str, Any]], generation: int, observed: int) -> dict[str, Any]:
    """A fleet whose spec names no image, running revision 2 as status records it."""
    hs = fleet("v2", last_good=revs[1]["metadata"]["name"], generation=generation)
    del hs["spec"]["engine"]["image"]
    hs["status"].update(observedGeneration=observed)
    hs["status"]["rollout"]["updateRevision"] = revs[1]["metadata"]["name"]
    return hs


def test_a_fleet_on_the_default_image_is_rolled_back_from_the_revision_status_names() -> None:
    """A spec that names no image runs the chart's default, which its revisions record and the
    spec alone does not say: the current revision is the one status recorded for this generation."""
    revs = [revision("v1", 1), revision("v2", 2)]
    api = FakeApi(on_the_default_image(revs, generation=5, observed=5), revs)
    out = io.StringIO()
    assert rollback(api, "ns", "hs", None, out) == 0
    assert api.replaced is not None and api.replaced["spec"]["engine"]["image"] == "v1"
    assert "rolled back to revision 1" in out.getvalue()


def test_a_spec_on_the_default_image_not_yet_applied_is_not_guessed_at() -> None:
    """Just after an edit (the operator lagging or down), a spec that names no image matches no
    revision: the last good one would be the one that runs, and writing it would only pin its image."""
    revs = [revision("v1", 1), revision("v2", 2)]
    api = FakeApi(on_the_default_image(revs, generation=6, observed=5), revs)
    out = io.StringIO()
    assert rollback(api, "ns", "hs", None, out) == 1 and api.replaced is None
    assert out.getvalue().startswith("error: hs: generation 6 of the spec is not applied yet (status says 5)")
    assert "--to-revision N" in out.getvalue()
    assert rollback(api, "ns", "hs", 1, io.StringIO()) == 0, "a named revision needs no guess"
    assert api.replaced is not None and api.replaced["spec"]["engine"]["image"] == "v1"


def test_a_revision_of_another_object_is_not_used() -> None:
    api = FakeApi(fleet("v2"), [revision("v1", 1, owner="someone-else"), revision("v2", 2)])
    out = io.StringIO()
    assert rollback(api, "ns", "hs", 1, out) == 1 and api.replaced is None
    assert "no such revision (kept: 2)" in out.getvalue()


def test_rolling_back_to_what_runs_writes_nothing() -> None:
    api = FakeApi(fleet("v2"), [revision("v1", 1), revision("v2", 2)])
    out = io.StringIO()
    assert rollback(api, "ns", "hs", 2, out) == 0 and api.replaced is None
    assert "nothing to do" in out.getvalue()


@pytest.mark.parametrize("meta, tool", [
    ({"annotations": {"argocd.argoproj.io/tracking-id": "app:hybridserving.io/HybridServing:ns/hs"}}, "Argo CD"),
    ({"labels": {"argocd.argoproj.io/instance": "app"}}, "Argo CD"),
    ({"labels": {"kustomize.toolkit.fluxcd.io/name": "apps"}}, "Flux"),
    ({"labels": {"helm.toolkit.fluxcd.io/name": "serving"}}, "Flux"),
    ({"labels": {"app.kubernetes.io/instance": "hs"}}, None),
])
def test_gitops_tools_are_recognised_by_their_marks(meta: dict[str, Any], tool: str | None) -> None:
    assert gitops_manager(meta) == tool


def test_a_fleet_managed_by_gitops_is_rolled_back_with_a_warning_to_revert_in_git() -> None:
    revs = [revision("v1", 1), revision("v2", 2)]
    api = FakeApi(fleet("v2", labels={"kustomize.toolkit.fluxcd.io/name": "apps"}), revs)
    out = io.StringIO()
    assert rollback(api, "ns", "hs", None, out) == 0
    assert "warning: hs is managed by Flux: revert the change in git" in out.getvalue()


def refused_by_the_operator(revs: list[dict[str, Any]], running: int) -> dict[str, Any]:
    """A fleet edited to a spec the operator refuses (status has seen it): it keeps running `running`."""
    name = revs[running - 1]["metadata"]["name"]
    hs = fleet("evil/engine:latest", last_good=name, generation=5)
    hs["status"].update(observedGeneration=5, conditions=[
        {"type": "LayoutValid", "status": "False", "reason": "LayoutInvalid", "observedGeneration": 5}])
    hs["status"]["rollout"].update(updateRevision=name, currentRevision=name)
    return hs


def test_a_spec_the_operator_refuses_is_rolled_back_to_the_revision_the_fleet_runs() -> None:
    """The operator runs the last valid spec while the spec fails validation: status names that
    revision, not the spec's own, so it is the way back, and asking for it by number writes it."""
    revs = [revision("v1", 1), revision("v2", 2)]
    for to_revision in (None, 2):
        api = FakeApi(refused_by_the_operator(revs, 2), revs)
        out = io.StringIO()
        assert rollback(api, "ns", "hs", to_revision, out) == 0, out.getvalue()
        assert api.replaced is not None and api.replaced["spec"]["engine"]["image"] == "v2"
        assert out.getvalue().splitlines() == [
            f"hs: generation 5 of the spec is not applied (LayoutValid False: it fails validation); "
            f"the fleet runs revision 2 ({revs[1]['metadata']['name']})",
            f"hs rolled back to revision 2 ({revs[1]['metadata']['name']}); the operator rolls it out within "
            "spec.rollout (maxUnavailable, canary, paused)",
            "  spec.engine.image: evil/engine:latest → v2"]


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_restored_spec_that_fails_validation_is_refused_and_nothing_written(dry_run: bool) -> None:
    """The live fleet total (spec.replicas) is kept; revision 1 has no role switch to split it."""
    revs = [revision("v1", 1), revision("v2", 2)]
    hs = fleet("v2", last_good=revs[0]["metadata"]["name"])
    hs["spec"] = spec("v2", roleSwitch={"enabled": True}, replicas=6)
    api = FakeApi(hs, revs)
    out = io.StringIO()
    assert rollback(api, "ns", "hs", None, out, dry_run=dry_run) == 1 and api.replaced is None
    lines = out.getvalue().splitlines()
    assert lines[0] == (f"error: hs: revision 1 ({revs[0]['metadata']['name']}) with the live spec's rollout, "
                        "replicas and scaling, which a rollback keeps, fails validation; nothing written")
    assert lines[1].startswith("error: spec.replicas: spec.replicas sizes the fleet's total")
    assert lines[2].startswith("  fix: ") and "unset spec.replicas" in lines[2]


def test_a_conflict_from_a_status_write_is_retried_on_the_new_resource_version() -> None:
    def status_written(hs: dict[str, Any]) -> None:
        hs["metadata"]["resourceVersion"] = str(int(hs["metadata"]["resourceVersion"]) + 1)
        hs["status"]["rollout"]["message"] = "rolling"

    revs = [revision("v1", 1), revision("v2", 2)]
    api = FakeApi(fleet("v2", generation=3), revs, meddling=[status_written, status_written])
    out = io.StringIO()
    assert rollback(api, "ns", "hs", 1, out) == 0, out.getvalue()
    assert api.replaces == 3 and api.replaced is not None
    assert api.replaced["spec"]["engine"]["image"] == "v1" and api.replaced["metadata"]["resourceVersion"] == "44"
    assert "status" not in api.replaced


def test_a_conflict_from_a_spec_change_is_refused() -> None:
    def spec_edited(hs: dict[str, Any]) -> None:
        hs["metadata"].update(resourceVersion="43", generation=4)
        hs["spec"]["engine"]["image"] = "v3"

    revs = [revision("v1", 1), revision("v2", 2)]
    api = FakeApi(fleet("v2", generation=3), revs, meddling=[spec_edited])
    out = io.StringIO()
    assert rollback(api, "ns", "hs", 1, out) == 1
    assert api.replaces == 1 and api.replaced is None
    assert out.getvalue().splitlines() == [
        "error: hs: someone else changed the spec while rolling back (generation 3 → 4); nothing written",
        "  fix: check what changed (kubectl get hybridserving hs -n ns -o yaml), then run the command again"]


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_fleet_being_deleted_is_not_rolled_back(dry_run: bool) -> None:
    revs = [revision("v1", 1), revision("v2", 2)]
    api = FakeApi(fleet("v2", deletionTimestamp="2025-01-01T00:00:00Z"), revs)
    out = io.StringIO()
    assert rollback(api, "ns", "hs", None, out, dry_run=dry_run) == 1 and api.replaced is None
    assert out.getvalue().splitlines()[0] == (
        "error: hs: being deleted (since 2025-01-01T00:00:00Z): the operator no longer reconciles it, "
        "so nothing would roll it back; nothing written")


def test_rolling_back_a_setting_leaves_the_default_image_to_the_operator_and_an_image_rollback_says_it_pins() -> None:
    """Revisions record the chart's default image; a rollback of anything else must not write it
    into a spec that names none, or the fleet stops following the chart's default."""
    old = spec("default:1", prefill={"replicas": 4, "layout": {"tp": 8}, "maxRunningRequests": 64})
    name = f"hs-{revisions.revision_hash(HybridServingSpec.model_validate(old))}"
    revs = [{"metadata": {"name": name, "ownerReferences": [{"uid": "uid-1"}]}, "revision": 1,
             "data": {"spec": revisions.revision_spec(old)}}, revision("default:1", 2)]
    api = FakeApi(on_the_default_image(revs, generation=5, observed=5), revs)
    out = io.StringIO()
    assert rollback(api, "ns", "hs", 1, out) == 0 and api.replaced is not None
    assert "image" not in api.replaced["spec"].get("engine", {}), out.getvalue()
    assert api.replaced["spec"]["prefill"]["maxRunningRequests"] == 64
    assert "note:" not in out.getvalue() and "spec.engine.image" not in out.getvalue()

    revs = [revision("default:0", 1), revision("default:1", 2)]  # the default itself changed
    api = FakeApi(on_the_default_image(revs, generation=5, observed=5), revs)
    out = io.StringIO()
    assert rollback(api, "ns", "hs", 1, out) == 0 and api.replaced["spec"]["engine"]["image"] == "default:0"
    assert "note: hs: spec.engine.image was the operator's default and is written as revision 1's default:0" \
        in out.getvalue()
