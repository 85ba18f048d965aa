"""Pod template keys of the wrong type are refused naming the field, never a crash.

The pod spec of a template is kept open, but the keys the operator merges onto its pod or reads
to check a template must have Kubernetes' shape. A wrong one used to stop `hybridserving
validate`, the webhook and the reconcile with a TypeError; it is refused as any bad field is.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, cast

import kopf
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from hybridserving.api.base import field_errors
from hybridserving.api.pods import PodTemplate
from hybridserving.api.podshape import POD_SPEC, Items, Obj
from hybridserving.api.v1alpha1 import KIND, HybridServing
from hybridserving.controller import admission
from hybridserving.controller import reconcile as rec
from hybridserving.controller.kube import Kube
from hybridserving.core import planner, rendering, surface
from hybridserving.core.observed import Observed
from hybridserving.manifests import ManifestInvalid, load_text
from support.apiserver import NS, MemoryApi
from support.fleets import SPEC, fleet, settle

ROOT = Path(__file__).resolve().parents[2]

# (the pod spec of the template, the field refused, what the message says it got)
WRONG = [
    ({"containers": 5}, "containers", "must be a list of containers (objects with a name), got an integer"),
    ({"initContainers": 5}, "initContainers", "got an integer"),
    ({"volumes": "scratch"}, "volumes", "must be a list of volumes (objects with a name), got a string"),
    ({"tolerations": 5}, "tolerations", "got an integer"),
    ({"tolerations": ["nvidia.com/gpu"]}, "tolerations[0]", "got a string"),
    ({"imagePullSecrets": {"name": "regcred"}}, "imagePullSecrets", "got an object"),
    ({"topologySpreadConstraints": 1}, "topologySpreadConstraints", "got an integer"),
    ({"nodeSelector": ["pool=gpu"]}, "nodeSelector", "got a list"),
    ({"nodeSelector": {"pool": 1}}, "nodeSelector.pool", "got an integer"),
    ({"affinity": []}, "affinity", "got a list"),
    ({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"topologyKey": "x"}}}},
     "affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution", "got an object"),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": 1}}}},
     "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms", "got an integer"),
    ({"resources": 5}, "resources", "got an integer"),
    ({"resources": {"requests": 5}}, "resources.requests", "got an integer"),
    ({"securityContext": True}, "securityContext", "got a boolean"),
    ({"enableServiceLinks": "yes"}, "enableServiceLinks", "must be true or false, got a string"),
    ({"containers": ["engine"]}, "containers[0]", "got a string"),
    ({"containers": [{"image": "x"}]}, "containers[0].name", "got nothing"),
    ({"containers": [{"name": 5, "image": "x"}]}, "containers[0].name", "got an integer"),
    ({"containers": [{"name": "x" * 64, "image": "x"}]}, "containers[0].name", "got 64 characters"),
    ({"containers": [{"name": "engine", "env": 5}]}, "containers[0].env", "got an integer"),
    ({"containers": [{"name": "engine", "env": [["A", "1"]]}]}, "containers[0].env[0]", "got a list"),
    ({"containers": [{"name": "engine", "envFrom": {"secretRef": {"name": "s"}}}]}, "containers[0].envFrom",
     "got an object"),
    ({"containers": [{"name": "engine", "volumeMounts": 5}]}, "containers[0].volumeMounts", "got an integer"),
    ({"containers": [{"name": "engine", "volumeMounts": [{"name": "x", "mountPath": ["/x"]}]}]},
     "containers[0].volumeMounts[0].mountPath", "got a list"),
    ({"containers": [{"name": "engine", "resources": [1]}]}, "containers[0].resources", "got a list"),
    ({"containers": [{"name": "engine", "resources": {"limits": "8Gi"}}]}, "containers[0].resources.limits",
     "got a string"),
    ({"initContainers": [{"name": "warm", "image": "x", "securityContext": "root"}]},
     "initContainers[0].securityContext", "got a string"),
    ({"volumes": [{"name": ["config"], "emptyDir": {}}]}, "volumes[0].name", "got a list"),
    ({"containers": [{"name": f"c{i}", "image": "x"} for i in range(65)]}, "containers", "got 65"),
]


def body_with(pod: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "role-switch.yaml").read_text())
    doc["spec"]["podTemplate"] = {"spec": pod}
    return doc


@pytest.mark.parametrize(("pod", "field", "text"), WRONG, ids=[w[1] for w in WRONG])
def test_a_wrong_type_is_refused_at_admission_naming_the_field_and_the_fix(pod: dict[str, Any], field: str,
                                                                           text: str) -> None:
    with pytest.raises(kopf.AdmissionError) as refused:
        admission.review(body_with(pod), None, "CREATE", [])
    message = str(refused.value)
    assert message.startswith(f"spec.podTemplate.spec.{field}: must be ") and text in message
    assert f"kubectl explain pod.spec.{field.split('[')[0].split('.')[0]}" in message
    assert refused.value.code == 422


@pytest.mark.parametrize(("pod", "field", "text"), WRONG, ids=[w[1] for w in WRONG])
def test_validate_names_the_field_of_a_role_template_too(pod: dict[str, Any], field: str, text: str) -> None:
    doc = body_with({})
    del doc["spec"]["podTemplate"]
    doc["spec"]["decode"]["podTemplate"] = {"spec": pod}
    with pytest.raises(ManifestInvalid) as refused:
        load_text(yaml.safe_dump(doc))
    assert any(e.path == f"spec.decode.podTemplate.spec.{field}" for e in refused.value.errors), refused.value


def test_every_wrong_key_is_named_in_one_refusal() -> None:
    with pytest.raises(ValidationError) as refused:
        PodTemplate.model_validate({"spec": {"containers": 5, "tolerations": {}, "volumes": [{"name": "v"}]}})
    (error,) = field_errors(refused.value)
    assert error.path == "spec.containers" and "; tolerations: must be a list of tolerations" in error.message


def test_the_reconcile_reports_a_wrong_type_and_leaves_the_running_fleet_alone() -> None:
    api = MemoryApi()
    api.user_apply(SPEC)
    settle(api)
    before = {k: copy.deepcopy(o) for k, o in api.store.items() if k[0] not in ("Event", KIND)}
    bad = copy.deepcopy(SPEC)
    bad["podTemplate"] = {"spec": {"containers": 5}}
    api.user_apply(bad)
    for _ in range(2):
        rec.reconcile(cast(Kube, api), NS, "fleet")  # MemoryApi has Kube's methods
    layout_valid = api.condition("LayoutValid")
    assert layout_valid["status"] == "False"
    assert "spec.podTemplate.spec.containers: must be a list of containers" in layout_valid["message"]
    assert {k: o for k, o in api.store.items() if k[0] not in ("Event", KIND)} == before, "no child was touched"


# --------------------------------------------------------------------------- any value

JSON = st.recursive(
    st.one_of(st.none(), st.integers(), st.floats(allow_nan=False), st.booleans(), st.text(max_size=4),
              st.sampled_from(["engine", "weights", "config", "/dev/shm", "HYBRIDSERVING_X", "nvidia.com/gpu"])),
    lambda inner: st.one_of(st.lists(inner, max_size=2), st.dictionaries(
        st.sampled_from(["name", "image", "mountPath", "requests", "limits", "cpu", "x"]), inner, max_size=3)),
    max_leaves=6,
)


def _paths(shape: object, at: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Each key of the table; "0" stands for a list's first item."""
    found: list[tuple[str, ...]] = [at] if at else []
    if isinstance(shape, Items):
        found += _paths(shape.item, (*at, "0"))
    if isinstance(shape, Obj):
        for key, sub in shape.fields.items():
            found += _paths(sub, (*at, key))
    return found


PATHS = _paths(POD_SPEC)


def _template_with(path: tuple[str, ...], value: Any) -> Any:
    """`value` at `path` of a pod spec; each list on the way holds one object, named `engine`."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    inner = _template_with(rest, value)
    if head != "0":
        return {head: inner}
    return [{"name": "engine", **inner} if rest else inner]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(PATHS), value=JSON)
def test_any_value_at_a_key_the_operator_reads_is_refused_as_a_field_or_checked_and_rendered(
    path: tuple[str, ...], value: Any
) -> None:
    pod = _template_with(path, value)
    try:
        hs = fleet(podTemplate={"spec": pod})
    except ValidationError as refused:
        assert all(e.path.startswith("spec.podTemplate.spec") for e in field_errors(refused))
        return
    surface.check(hs.spec)
    planner.plan(hs, Observed())


# --------------------------------------------------------------------------- nulls

# (the pod spec of the template, the field refused, how the message says it merges)
NULLS = [
    ({"containers": None}, "containers", "the template's containers merge into the pod's by name"),
    ({"initContainers": None}, "initContainers", "the template's init containers merge into the pod's by name"),
    ({"volumes": None}, "volumes", "the template's lists are appended, so leave the key out to keep the pod's"),
    ({"tolerations": None}, "tolerations", "the template's lists are appended"),
    ({"topologySpreadConstraints": None}, "topologySpreadConstraints", "the template's lists are appended"),
    ({"nodeSelector": None}, "nodeSelector", "the template's objects merge key by key"),
    ({"nodeSelector": {"pool": None}}, "nodeSelector.pool", "write a string of at most 63 characters to change it"),
    ({"affinity": None}, "affinity", "the template's objects merge key by key"),
    ({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": None}}},
     "affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution", "the template's lists are appended"),
    ({"securityContext": None}, "securityContext", "the template's objects merge key by key"),
    ({"automountServiceAccountToken": None}, "automountServiceAccountToken", "write true or false to change it"),
    ({"containers": [{"name": "engine", "env": None}]}, "containers[0].env", "the template's lists are appended"),
    ({"containers": [{"name": "engine", "volumeMounts": None}]}, "containers[0].volumeMounts", "lists are appended"),
    ({"containers": [{"name": "engine", "resources": {"requests": None}}]}, "containers[0].resources.requests",
     "the template's objects merge key by key"),
    ({"initContainers": [{"name": "warm", "image": "x", "env": None}]}, "initContainers[0].env", "are appended"),
]


@pytest.mark.parametrize(("pod", "field", "text"), NULLS, ids=[n[1] for n in NULLS])
def test_a_null_where_the_template_merges_is_refused_at_admission_saying_to_leave_the_key_out(
    pod: dict[str, Any], field: str, text: str
) -> None:
    with pytest.raises(kopf.AdmissionError) as refused:
        admission.review(body_with(pod), None, "CREATE", [])
    message = str(refused.value)
    assert message.startswith(f"spec.podTemplate.spec.{field}: remove the key: null would replace any "), message
    assert text in message and refused.value.code == 422


@pytest.mark.parametrize(("pod", "field", "text"), NULLS, ids=[n[1] for n in NULLS])
def test_validate_refuses_a_null_in_a_role_template_as_the_webhook_does(pod: dict[str, Any], field: str,
                                                                        text: str) -> None:
    """The CLI keeps the nulls of a pod template's spec, as the apiserver stores them for the webhook to see."""
    doc = body_with({})
    del doc["spec"]["podTemplate"]
    doc["spec"]["decode"]["podTemplate"] = {"spec": pod}
    with pytest.raises(ManifestInvalid) as refused:
        load_text(yaml.safe_dump(doc))
    assert any(e.path == f"spec.decode.podTemplate.spec.{field}" and text in e.message
               for e in refused.value.errors), refused.value


def _merged(path: tuple[str, ...]) -> bool:
    """Whether a template's value under `path` merges onto the pod's: through objects, and through the
    items of the lists that merge by name; an item a list appends replaces nothing."""
    shape: object = POD_SPEC
    for key in path:
        if isinstance(shape, Items):
            if not shape.by_name:
                return False
            shape = shape.item
        else:
            assert isinstance(shape, Obj)
            shape = shape.fields[key]
    return True


# Each key of the table a template merges onto the pod (a container's name is required: a null is missing).
MERGED = [p for p in PATHS if p[-1] != "0" and p[-2:] != ("0", "name") and _merged(p[:-1])]


@pytest.mark.parametrize("path", MERGED, ids=[".".join(p) for p in MERGED])
def test_every_key_the_template_merges_refuses_a_null(path: tuple[str, ...]) -> None:
    with pytest.raises(ValidationError) as refused:
        fleet(podTemplate={"spec": _template_with(path, None)})
    (error,) = field_errors(refused.value)
    assert error.message.startswith("remove the key: null would replace any "), error
    assert error.path == "spec.podTemplate.spec." + ".".join(path).replace(".0.", "[0].")


def _leader_pod(hs: HybridServing) -> dict[str, Any]:
    """The pod spec of an instance's leader, templates merged."""
    instance = next(iter(planner.plan(hs, Observed()).instances.values()))
    return rendering.pod_spec(hs, instance.name, 0, instance.role, instance.ports)


def test_every_key_of_the_table_the_operator_renders_refuses_a_null() -> None:
    pod = _leader_pod(fleet())
    (engine,) = pod["containers"]
    rendered = {(key,) for key in pod} | {("containers", "0", key) for key in engine if key != "name"}
    assert {("containers",), ("volumes",), ("affinity",), ("containers", "0", "env")} <= rendered & set(PATHS)
    assert rendered & set(PATHS) <= set(MERGED)


def test_a_null_elsewhere_is_kept_as_written_as_kubernetes_reads_it_as_absent() -> None:
    """A key the table leaves open, or one of an item a list appends, replaces nothing of the operator's."""
    pod = {"hostAliases": None, "tolerations": [{"key": "gpu", "operator": "Exists", "value": None}],
           "containers": [{"name": "engine", "env": [{"name": "TRACE", "value": None}]}],
           "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": None}}]}
    hs = fleet(podTemplate={"spec": pod})
    assert hs.spec.pod_template is not None and hs.spec.pod_template.spec == pod
    assert not [i for i in surface.check(hs.spec) if i.severity == "error"]
    rendered = _leader_pod(hs)
    assert rendered["hostAliases"] is None and rendered["tolerations"] == pod["tolerations"]
    (engine,) = rendered["containers"]
    assert engine["env"][-1] == {"name": "TRACE", "value": None} and len(engine["env"]) > 1
    assert rendered["volumes"][-1] == pod["volumes"][0] and len(rendered["volumes"]) > 1


@pytest.mark.parametrize(("pod", "field"), [({"containers": None}, "containers"),
                                            ({"tolerations": None}, "tolerations"),
                                            ({"nodeSelector": {"pool": None}}, "nodeSelector.pool")])
def test_the_reconcile_reports_a_null_and_leaves_the_running_fleet_alone(pod: dict[str, Any], field: str) -> None:
    api = MemoryApi()
    api.user_apply({**SPEC, "podTemplate": {"spec": {"nodeSelector": {"pool": "gpu"}}}})
    settle(api)
    before = {k: copy.deepcopy(o) for k, o in api.store.items() if k[0] not in ("Event", KIND)}
    api.user_apply({**SPEC, "podTemplate": {"spec": pod}})
    for _ in range(2):
        rec.reconcile(cast(Kube, api), NS, "fleet")  # MemoryApi has Kube's methods
    layout_valid = api.condition("LayoutValid")
    assert layout_valid["status"] == "False"
    assert f"spec.podTemplate.spec.{field}: remove the key: null would replace any" in layout_valid["message"]
    assert {k: o for k, o in api.store.items() if k[0] not in ("Event", KIND)} == before, "no child was touched"


def test_a_fleet_stored_with_a_null_before_it_was_refused_runs_on_untouched() -> None:
    """Its spec and the spec last applied both hold the null; neither reads now, so nothing is planned."""
    api = MemoryApi()
    api.user_apply({**SPEC, "podTemplate": {"spec": {"hostAliases": None}}})
    settle(api)
    api.store[(KIND, "fleet")]["spec"]["podTemplate"]["spec"]["tolerations"] = None
    applied = api.store[("ConfigMap", "fleet-applied")]["data"]
    spec = json.loads(applied["spec.json"])
    spec["podTemplate"]["spec"]["tolerations"] = None
    applied["spec.json"] = json.dumps(spec)
    before = {k: copy.deepcopy(o) for k, o in api.store.items() if k[0] not in ("Event", KIND)}
    outcome = rec.reconcile(cast(Kube, api), NS, "fleet")  # MemoryApi has Kube's methods
    assert not outcome.applied
    assert {k: o for k, o in api.store.items() if k[0] not in ("Event", KIND)} == before, "no child was touched"
    assert "spec.podTemplate.spec.tolerations: remove the key" in api.condition("LayoutValid")["message"]
