"""`hybridserving upgrade-check` (core.upgrade): what this version would roll, read from a fleet the
reconcile built in the in-memory API, with "a newer version" played by patching the renderer as
tests/unit/test_reconcile.py does. Against the real apiserver (its defaulting of pods included):
tests/integration/test_operator.py."""

from __future__ import annotations

import copy
import io
import json
from dataclasses import replace
from typing import Any

import pytest

from hybridserving.api.crd import ANNOTATION_SCHEMA_DIGEST, expected_digests
from hybridserving.api.v1alpha1 import DEFAULT_ENGINE_IMAGE
from hybridserving.cli import build_parser
from hybridserving.commands import upgrade as command
from hybridserving.core import crdschema, flags, rendering, revisions, router
from hybridserving.core.rollout import RERENDERED
from hybridserving.core.privileges import EnginePolicy
from hybridserving.core.upgrade import GRANTS_UNKNOWN, FleetPreview, preview
from support.apiserver import NS, MemoryApi
from support.fleets import SPEC, settle

NEXT_IMAGE = "registry.example/engine:next"
CURRENT = crdschema.assess([{"metadata": {"name": name, "annotations": {ANNOTATION_SCHEMA_DIGEST: digest}}}
                            for name, digest in expected_digests().items()], expected_digests())


def check(api: MemoryApi, default_image: str | None = None) -> FleetPreview:
    """The preview of the fleet from what the API holds, children listed by label as the CLI does."""
    body = api.store[("HybridServing", "fleet")]
    children = [o for k, o in api.store.items() if k in api.children()]
    by_kind = {kind: [o for o in children if o["kind"] == kind] for kind in ("HybridServingInstance", "Pod")}
    others = [o for o in children if o["kind"] not in by_kind]
    policy = replace(GRANTS_UNKNOWN, default_image=default_image) if default_image else GRANTS_UNKNOWN
    return preview(body, by_kind["HybridServingInstance"], by_kind["Pod"], others, policy)


def causes(p: FleetPreview) -> dict[str, str]:
    return {i.name: i.cause for i in p.instances}


def test_a_settled_fleet_rolls_nothing(api: MemoryApi) -> None:
    settle(api)
    p = check(api)
    assert causes(p) == dict.fromkeys(("fleet-0", "fleet-1", "fleet-2", "fleet-3"), "current")
    assert p.revision == api.status()["rollout"]["updateRevision"]
    out = io.StringIO()
    command.render([p], out)
    assert out.getvalue() == (f"{NS}/fleet: nothing rolls (4 instance(s) up to date)\n"
                              "this version rolls 0 of 4 instance(s) in 1 fleet(s)\n")


def test_a_version_that_renders_the_pods_anew_rolls_every_instance_and_names_the_fields(
        api: MemoryApi, monkeypatch: pytest.MonkeyPatch) -> None:
    settle(api)
    older = rendering.pod_spec

    def newer(*args: Any, **kwargs: Any) -> dict[str, Any]:
        pod = older(*args, **kwargs)
        pod["containers"][0].setdefault("env", []).append({"name": "HYBRIDSERVING_NEWER", "value": "1"})
        pod["containers"][0]["readinessProbe"]["periodSeconds"] = 7
        return pod

    monkeypatch.setattr(rendering, "pod_spec", newer)
    p = check(api)
    assert set(causes(p).values()) == {"rendering"}
    assert {i.changes for i in p.instances} == {(
        "pod spec.containers[engine].env[HYBRIDSERVING_NEWER] (new)",
        "pod spec.containers[engine].readinessProbe.periodSeconds: 10 → 7",
    )}
    out = io.StringIO()
    command.render([p], out)
    text = out.getvalue()
    assert text.startswith(f"{NS}/fleet: 4 of 4 instance(s) would roll, within spec.rollout: 1 instance(s) of a role "
                           "at a time, one role at a time\n"), text
    assert RERENDERED in text and "this version rolls 4 of 4 instance(s) in 1 fleet(s): set spec.rollout" in text


def test_a_changed_engine_flag_rolls_only_its_role_and_names_the_flag(
        api: MemoryApi, monkeypatch: pytest.MonkeyPatch) -> None:
    settle(api)
    older = flags.render_template

    def newer(spec: Any, role: str) -> list[str]:
        argv = older(spec, role)
        return [*argv, "--enable-metrics-for-all-schedulers"] if role == "decode" else argv

    monkeypatch.setattr(flags, "render_template", newer)
    p = check(api)
    roles = {i.name: i.role for i in p.instances}
    assert {n: c for n, c in causes(p).items() if c != "current"} == {
        n: "rendering" for n, r in roles.items() if r == "decode"}
    assert {i.changes for i in p.rolling} == {("decode flag --enable-metrics-for-all-schedulers: (unset) → (set)",)}


def test_a_new_router_flag_rolls_the_router_and_no_instance_and_is_named(
        api: MemoryApi, monkeypatch: pytest.MonkeyPatch) -> None:
    settle(api)
    assert check(api).routers == ()
    monkeypatch.setattr(router, "WORKER_FLAGS", (*router.WORKER_FLAGS, "--retry-max-retries", "7"))
    older_fields = router.container_fields

    def newer_fields(spec: Any) -> dict[str, Any]:
        return {**older_fields(spec), "lifecycle": {"preStop": {"sleep": {"seconds": 9}}}}

    monkeypatch.setattr(router, "container_fields", newer_fields)
    p = check(api)
    assert set(causes(p).values()) == {"current"}
    assert [(r.name, r.changes) for r in p.routers] == [(name, (
        "router flag --retry-max-retries: (unset) → 7",
        "pod spec.template.spec.containers[router].lifecycle.preStop.sleep.seconds: 5 → 9",
    )) for (kind, name) in sorted(api.store) if kind == "Deployment"]
    out = io.StringIO()
    command.render([p], out)
    [deployment] = [r.name for r in p.routers]
    assert out.getvalue() == (
        f"{NS}/fleet: no instance rolls (4 instance(s) up to date)\n"
        f"  router Deployment {deployment} would roll (smg restarts and drains its connections, no engine "
        "restarts): router flag --retry-max-retries: (unset) → 7; "
        "pod spec.template.spec.containers[router].lifecycle.preStop.sleep.seconds: 5 → 9\n"
        "this version rolls 0 of 4 instance(s) and 1 router Deployment(s) in 1 fleet(s)\n")
    assert command.to_dict(p)["routers"] == [{"name": deployment, "changes": list(p.routers[0].changes)}]
    # --exit-code gates engine restarts: a router roll restarts none.
    args = build_parser().parse_args(["upgrade-check", "--exit-code"])
    assert command.report([p], CURRENT, args, io.StringIO()) == 0


def test_a_new_default_engine_image_is_a_new_configuration_for_fleets_that_name_none(api: MemoryApi) -> None:
    settle(api)
    p = check(api, NEXT_IMAGE)
    assert set(causes(p).values()) == {"configuration"}
    assert {i.changes for i in p.instances} == {(
        f"revision {api.status()['rollout']['updateRevision']} → {p.revision}",
        f"pod spec.containers[engine].image: {DEFAULT_ENGINE_IMAGE} → {NEXT_IMAGE}")}

    api.user_apply({**SPEC, "engine": {"image": "registry.example/engine:pinned"}})
    settle(api, passes=40)  # the whole roll, one instance of a role at a time
    assert set(causes(check(api, NEXT_IMAGE)).values()) == {"current"}, "a fleet naming its image keeps it"


def test_pod_metadata_this_version_renders_anew_is_named_by_key(
        api: MemoryApi, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the template's labels and annotations count (the hash covers them); the operator's own
    are patched in place and roll nothing."""
    api.user_apply({**SPEC, "podTemplate": {"metadata": {"labels": {"example.com/team": "serving"}}}})
    settle(api)
    older = rendering.pod_extra_metadata

    def newer(*args: Any) -> tuple[dict[str, str], dict[str, str]]:
        labels, annotations = older(*args)
        return {**labels, "example.com/team": "inference"}, {**annotations, "example.com/scrape": "true"}

    monkeypatch.setattr(rendering, "pod_extra_metadata", newer)
    p = check(api)
    assert set(causes(p).values()) == {"rendering"}
    assert {i.changes for i in p.instances} == {(
        "pod metadata.annotations[example.com/scrape] (new)",
        "pod metadata.labels[example.com/team]: serving → inference",
    )}


def test_a_rollout_under_way_is_told_apart_from_what_the_upgrade_rolls(api: MemoryApi) -> None:
    settle(api)
    api.user_apply({**SPEC, "engine": {"image": "registry.example/engine:v2"}, "rollout": {"canary": 1}})
    settle(api)
    p = check(api)
    assert sorted(causes(p).values()) == ["current", "current", "rollout", "rollout"]
    assert p.upgrade_rolls == ()
    assert p.pace.startswith("held at the canary: 1 instance(s) of each role roll")


def test_a_spec_edit_the_running_operator_has_not_applied_yet_is_no_roll_of_the_upgrade(api: MemoryApi) -> None:
    """The running operator lags or is down: the edit rolls whichever version runs."""
    settle(api)
    api.user_apply({**SPEC, "engine": {"image": "registry.example/engine:v2"}})
    body = api.store[("HybridServing", "fleet")]
    assert body["metadata"]["generation"] != body["status"]["observedGeneration"], "not reconciled since"
    p = check(api)
    assert set(causes(p).values()) == {"rollout"} and p.upgrade_rolls == ()
    assert {i.changes for i in p.instances} == {(
        f"generation {body['metadata']['generation']} of the spec, not yet applied by the running version "
        f"(observed: {body['status']['observedGeneration']})",)}
    args = build_parser().parse_args(["upgrade-check", "--exit-code"])
    assert command.report([p], CURRENT, args, io.StringIO()) == 0


def test_a_paused_fleet_says_nothing_rolls_until_it_is_resumed(
        api: MemoryApi, monkeypatch: pytest.MonkeyPatch) -> None:
    api.user_apply({**SPEC, "rollout": {"paused": True}})
    settle(api)
    monkeypatch.setattr(rendering, "pod_spec", lambda *a, **k: {})
    p = check(api)
    assert set(causes(p).values()) == {"rendering"}
    assert p.pace == "held: spec.rollout.paused is set, nothing rolls until it is removed"


def test_a_spec_this_version_refuses_is_reported_and_not_planned(api: MemoryApi) -> None:
    settle(api)
    body = api.store[("HybridServing", "fleet")]
    broken = copy.deepcopy(body)
    broken["spec"]["decode"]["layout"]["tp"] = "eight"
    api.store[("HybridServing", "fleet")] = broken
    p = check(api)
    assert p.instances == () and p.invalid and p.invalid[0].startswith("spec.decode.layout.tp: ")
    unsupported = copy.deepcopy(body)
    unsupported["spec"]["decode"]["layout"]["tp"] = 3
    api.store[("HybridServing", "fleet")] = unsupported
    p = check(api)
    assert p.instances == () and any(i.startswith("spec.decode.layout") for i in p.invalid), p.invalid
    out = io.StringIO()
    command.render([p], out)
    assert out.getvalue().startswith(f"{NS}/fleet: this version would stop planning it (LayoutValid False)")


def test_a_version_that_only_reads_the_spec_as_another_revision_restarts_nothing(
        api: MemoryApi, monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner relabels such instances with the new revision; their pods stay."""
    settle(api)
    older = revisions.revision_spec
    monkeypatch.setattr(revisions, "revision_spec", lambda wire: {**older(wire), "newField": "its default"})
    p = check(api)
    assert p.revision != api.status()["rollout"]["updateRevision"]
    assert set(causes(p).values()) == {"current"}


def test_an_instance_this_version_cannot_read_is_reported_not_a_traceback(api: MemoryApi) -> None:
    settle(api)
    api.store[("HybridServingInstance", "fleet-0")]["spec"]["role"] = "router"
    p = check(api)
    assert p.instances == () and p.invalid[0].startswith("a HybridServingInstance this version cannot read: "), p


def test_children_of_another_fleet_or_owner_do_not_count(api: MemoryApi) -> None:
    settle(api)
    stray = copy.deepcopy(api.store[("HybridServingInstance", "fleet-0")])
    stray["metadata"].update(name="fleet-9", uid="someone-else", ownerReferences=[{"uid": "another-owner"}])
    api.store[("HybridServingInstance", "fleet-9")] = stray
    assert "fleet-9" not in causes(check(api))


def test_the_json_output_is_stable() -> None:
    p = preview({"metadata": {"name": "x", "namespace": "ns"}, "spec": {}}, [], [], [])
    assert json.loads(json.dumps(command.to_dict(p))) == {
        "name": "x", "namespace": "ns", "revision": "", "pace": "", "invalid": list(p.invalid),
        "alreadyInvalid": False, "instances": [], "routers": []}
    assert p.invalid and all(i.startswith("spec.") for i in p.invalid)


def test_exit_code_3_says_the_upgrade_would_roll_and_a_rollout_under_way_does_not_count(
        api: MemoryApi, monkeypatch: pytest.MonkeyPatch) -> None:
    settle(api)
    args = build_parser().parse_args(["upgrade-check", "--exit-code"])
    assert command.report([check(api)], CURRENT, args, io.StringIO()) == 0
    api.user_apply({**SPEC, "engine": {"image": "registry.example/engine:v2"}, "rollout": {"canary": 1}})
    settle(api)
    assert command.report([check(api)], CURRENT, args, io.StringIO()) == 0
    monkeypatch.setattr(rendering, "pod_spec", lambda *a, **k: {})
    assert command.report([check(api)], CURRENT, args, io.StringIO()) == command.EXIT_ROLLS == 3
    assert command.report([check(api)], CURRENT, build_parser().parse_args(["upgrade-check"]), io.StringIO()) == 0


def test_exit_code_4_says_the_upgrade_would_stop_planning_a_fleet_the_running_version_plans(
        api: MemoryApi, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fleet this version refuses keeps its pods, but nothing heals, rolls or switches it: the
    worse answer, so it wins over 3. One the running version refuses already is not the upgrade's."""
    settle(api)
    args = build_parser().parse_args(["upgrade-check", "--exit-code"])
    monkeypatch.setattr(rendering, "pod_spec", lambda *a, **k: {})
    stricter = copy.deepcopy(api.store[("HybridServing", "fleet")])
    stricter["spec"]["decode"]["layout"]["tp"] = 3
    refused = preview(stricter, [], [], [])
    assert refused.upgrade_refuses and not refused.already_invalid
    assert command.report([check(api), refused], CURRENT, args, io.StringIO()) == command.EXIT_REFUSES == 4
    out = io.StringIO()
    command.render([refused], out)
    assert out.getvalue().startswith(f"{NS}/fleet: this version would stop planning it (LayoutValid False): "
                                     "its instances stay as they are, but nothing heals, rolls or switches them")
    assert out.getvalue().endswith("this version would stop planning 1 fleet(s) the running one plans: fix their "
                                   "spec (the errors above) before the upgrade\n")

    stricter["status"]["conditions"] = [
        {**c, "status": "False"} if c["type"] == "LayoutValid" else c for c in stricter["status"]["conditions"]]
    known = preview(stricter, [], [], [])
    assert known.invalid and known.already_invalid and not known.upgrade_refuses
    assert command.report([known], CURRENT, args, io.StringIO()) == 0
    out = io.StringIO()
    command.render([known], out)
    assert out.getvalue() == (f"{NS}/fleet: not planned by this version, nor by the one running "
                              f"(LayoutValid False):\n  {known.invalid[0]}\n"
                              "this version rolls 0 of 0 instance(s) in 1 fleet(s)\n")


def test_the_installed_crds_come_first_and_say_the_step_when_they_are_not_this_versions() -> None:
    """Helm never upgrades CRDs. Not counted by --exit-code: applying them is the step before the
    upgrade, which a pipeline may take after its gate; with -o json they go to stderr."""
    table, js = (build_parser().parse_args(["upgrade-check", "--exit-code", *extra]) for extra in ([], ["-o", "json"]))
    [crd, instance_crd] = expected_digests()
    out, err = io.StringIO(), io.StringIO()
    assert command.report([], CURRENT, table, out, err) == 0
    assert out.getvalue() == (f"CRDs: this version's ({crd}, {instance_crd})\n"
                              "no HybridServing found: nothing to roll\n") and err.getvalue() == ""
    assert command.report([], CURRENT, js, out := io.StringIO(), err) == 0
    assert json.loads(out.getvalue()) == [] and err.getvalue() == ""

    older = crdschema.assess([{"metadata": {"name": crd, "annotations": {ANNOTATION_SCHEMA_DIGEST: "0" * 16}}}],
                             expected_digests())
    out, err = io.StringIO(), io.StringIO()
    assert command.report([], older, table, out, err) == 0
    assert command.report([], older, js, io.StringIO(), err) == 0
    for said in (out.getvalue().splitlines()[:2], err.getvalue().splitlines()):
        assert said[0].startswith(f"CRDs: before `helm upgrade`: CRD {crd} has schema digest {'0' * 16}, "), said
        assert said[1].startswith(f"CRDs: before `helm upgrade`: CRD {instance_crd} is not installed"), said
        assert all(line.endswith(crdschema.FIX) for line in said), said
    out = io.StringIO()
    command.report([], "403 Forbidden", table, out)
    assert out.getvalue().startswith(f"CRDs: not read (403 Forbidden); before `helm upgrade`, apply this "
                                     f"version's: {crdschema.FIX}\n")


def test_values_that_no_longer_grant_what_a_fleet_needs_make_it_refused(api: MemoryApi) -> None:
    """`--values`: the installation's grants are checked as the reconcile checks them."""
    settle(api)
    body = api.store[("HybridServing", "fleet")]
    allowed = EnginePolicy(allowed_images=("hybridserving/", "lightseekorg/"))
    assert not preview(body, [], [], [], allowed).invalid
    narrower = preview(body, [], [], [], EnginePolicy(allowed_images=("registry.example/serving/",)))
    assert narrower.upgrade_refuses and [i.split(":")[0] for i in narrower.invalid] == [
        "spec.engine.image", "spec.router.image"], narrower.invalid
    assert "enginePolicy.allowedImages: registry.example/serving/" in narrower.invalid[0]


def test_no_fleet_is_said_in_words() -> None:
    out = io.StringIO()
    command.render([], out)
    assert out.getvalue() == "no HybridServing found: nothing to roll\n"
