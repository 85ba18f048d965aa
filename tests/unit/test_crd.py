"""The generated CRDs: in sync with the models, structural, and faithful to the models' rules.

What only an apiserver can judge (CEL evaluation, its cost estimates) is covered by
tests/integration/test_crd_admission.py; here are the rules the apiserver applies when the CRD
is created, checked by walking the schema, and the defaulting it applies to objects, replayed.
"""

from __future__ import annotations

import copy
import pathlib
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from pydantic import ValidationError, WithJsonSchema

from hybridserving.api import crd as crdgen
from hybridserving.api.base import Format, field_errors
from hybridserving.api.instance import HybridServingInstance, HybridServingInstanceStatus, InstancePorts
from hybridserving.api.pods import PodTemplate
from hybridserving.api.v1alpha1 import (
    CapacityStatus,
    Condition,
    HybridServing,
    HybridServingStatus,
    InstanceStatus,
    RoleStatus,
    SwitchRecord,
)

REPO = pathlib.Path(__file__).resolve().parents[2]
CRDS = crdgen.render_all()
HS_FILE = "hybridserving.io_hybridservings.yaml"
HSI_FILE = "hybridserving.io_hybridservinginstances.yaml"
TYPES = {"object", "array", "string", "integer", "number", "boolean"}
REASONS = {"FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate"}


def version_of(name: str) -> dict[str, Any]:
    (version,) = CRDS[name]["spec"]["versions"]
    return version


def schema_of(name: str) -> dict[str, Any]:
    return version_of(name)["schema"]["openAPIV3Schema"]


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node with its JSON path (`[]` for list items, `.*` for map values)."""
    yield path, node
    for prop, sub in node.get("properties", {}).items():
        yield from walk(sub, f"{path}.{prop}")
    if "items" in node:
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}.*")


def resolve(node: dict[str, Any], dotted: str) -> dict[str, Any]:
    """The schema node a `.a.b` path names, as the apiserver resolves fieldPath and jsonPath."""
    assert dotted.startswith("."), f"{dotted!r} must start with '.'"
    for part in dotted[1:].split("."):
        node = node["properties"][part]
    return node


def apply_defaults(node: dict[str, Any], value: Any) -> Any:
    """The apiserver's structural defaulting: absent fields take their default, then recurse."""
    if isinstance(value, dict) and "properties" in node:
        for prop, sub in node["properties"].items():
            if prop not in value and "default" in sub:
                value[prop] = copy.deepcopy(sub["default"])
        for prop, sub in node["properties"].items():
            if prop in value:
                apply_defaults(sub, value[prop])
    elif isinstance(value, list) and "items" in node:
        for item in value:
            apply_defaults(node["items"], item)
    return value


def violations(node: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """OpenAPI validation of `value` against a structural node, unknown fields included
    (the apiserver would prune them silently: for the operator's own writes that is data loss)."""
    if node.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, int | str):
            return [f"{path}: {value!r} is not integer or string"]
        # Each bound applies to its own JSON type, as in OpenAPI: minimum to numbers, pattern to strings.
        kind = "integer" if isinstance(value, int) else "string"
        drop = {"anyOf", "x-kubernetes-int-or-string", *(("minimum", "maximum") if kind == "string" else ())}
        return violations({**{k: v for k, v in node.items() if k not in drop}, "type": kind}, value, path)
    kind = node["type"]
    expected = {
        "object": dict,
        "array": list,
        "string": str,
        "boolean": bool,
        "integer": int,
        "number": (int, float),
    }[kind]
    if not isinstance(value, expected) or (kind in ("integer", "number") and isinstance(value, bool)):
        return [f"{path}: {value!r} is not {kind}"]
    found = []
    if "enum" in node and value not in node["enum"]:
        found.append(f"{path}: {value!r} not in {node['enum']}")
    if "minimum" in node and (value < node["minimum"] or (node.get("exclusiveMinimum") and value == node["minimum"])):
        found.append(f"{path}: {value} below minimum")
    if "maximum" in node and (value > node["maximum"] or (node.get("exclusiveMaximum") and value == node["maximum"])):
        found.append(f"{path}: {value} above maximum")
    if kind == "string":
        if len(value) < node.get("minLength", 0) or len(value) > node.get("maxLength", len(value)):
            found.append(f"{path}: length {len(value)} out of bounds")
        if "pattern" in node and not re.search(node["pattern"], value):
            found.append(f"{path}: {value!r} does not match {node['pattern']}")
    if kind == "array":
        if len(value) > node.get("maxItems", len(value)):
            found.append(f"{path}: {len(value)} items, more than maxItems")
        for i, item in enumerate(value):
            found += violations(node["items"], item, f"{path}[{i}]")
    if kind == "object" and path != ".metadata":  # the apiserver validates metadata itself
        found += [f"{path}.{key}: required" for key in node.get("required", ()) if key not in value]
        for key, item in value.items():
            if key in node.get("properties", {}):
                found += violations(node["properties"][key], item, f"{path}.{key}")
            elif isinstance(node.get("additionalProperties"), dict):
                found += violations(node["additionalProperties"], item, f"{path}.{key}")
            elif not node.get("x-kubernetes-preserve-unknown-fields"):
                found.append(f"{path}.{key}: unknown field (pruned)")
    return found


# --------------------------------------------------------------------------- files


def test_committed_crds_match_the_models():
    drifted = crdgen.check_all(REPO / folder for folder in crdgen.CRD_DIRS)
    assert not drifted, (
        "generated CRDs are out of date with the API models: "
        + ", ".join(str(path.relative_to(REPO)) for path in drifted)
        + "; run `make crds` and commit the result"
    )


def test_check_all_names_edited_and_missing_files(tmp_path):
    dirs, digests = [tmp_path / "a", tmp_path / "b"], tmp_path / crdgen.DIGESTS_FILE
    crdgen.write_all(dirs, digests)
    assert crdgen.check_all(dirs, digests) == []
    edited = dirs[1] / HS_FILE
    edited.write_text(edited.read_text().replace("maximum: 1024", "maximum: 2048", 1))
    (dirs[0] / HSI_FILE).unlink()
    digests.write_text("{}")
    assert sorted(crdgen.check_all(dirs, digests)) == sorted([edited, dirs[0] / HSI_FILE, digests])


def test_cli_check_fails_on_drift_and_write_repairs_it(tmp_path, capsys):
    target = str(tmp_path)
    digests = ["--digests", str(tmp_path / crdgen.DIGESTS_FILE)]
    assert crdgen.main(["--check", "--dir", target, *digests]) == 1
    assert "run `make crds`" in capsys.readouterr().err
    assert crdgen.main(["--dir", target, *digests]) == 0
    assert crdgen.main(["--check", "--dir", target, *digests]) == 0


def test_files_carry_the_header_and_parse_back_to_the_rendered_crd():
    for name, rendered in CRDS.items():
        text = (REPO / "crds" / name).read_text()
        assert text.startswith("# generated by `make crds`; do not edit\n")
        assert "&id" not in text, "YAML anchors make the CRD hard to read and diff"
        assert yaml.safe_load(text) == rendered
        assert (REPO / "charts/hybridserving/crds" / name).read_text() == text


def test_the_crds_are_kept_when_a_release_or_a_gitops_application_goes():
    """Deleting a CRD deletes every fleet of it and their pods; Helm and Argo CD honour `keep`."""
    for rendered in CRDS.values():
        assert rendered["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_rendering_is_deterministic():
    assert {name: crdgen.dump(c) for name, c in crdgen.render_all().items()} == {
        name: crdgen.dump(c) for name, c in CRDS.items()
    }


# --------------------------------------------------------------------------- CRD shape


@pytest.mark.parametrize(
    "name, kind, plural, short",
    [
        (HS_FILE, "HybridServing", "hybridservings", "hs"),
        (HSI_FILE, "HybridServingInstance", "hybridservinginstances", "hsi"),
    ],
)
def test_names_version_and_status_subresource(name, kind, plural, short):
    crd = CRDS[name]
    assert crd["metadata"]["name"] == f"{plural}.hybridserving.io"
    names = crd["spec"]["names"]
    assert (names["kind"], names["listKind"], names["plural"], names["singular"]) == (
        kind,
        f"{kind}List",
        plural,
        kind.lower(),
    )
    assert names["shortNames"] == [short]
    assert "all" not in names["categories"] and "hybridserving-all" in names["categories"]
    assert names["singular"] not in names["categories"], "kubectl get <singular> NAME would be ambiguous"
    assert crd["spec"]["scope"] == "Namespaced"
    version = version_of(name)
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"]["status"] == {}
    if kind == "HybridServing":
        # The fleet's total is what `kubectl scale`, HPA and KEDA drive; the selector finds its pods.
        assert version["subresources"]["scale"] == {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        }
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
        assert spec["replicas"]["type"] == "integer" and status["replicas"]["type"] == "integer"
        assert status["selector"]["type"] == "string"
    else:
        assert version["subresources"] == {"status": {}}


@pytest.mark.parametrize("name", [HS_FILE, HSI_FILE])
def test_root_schema_is_the_kubernetes_envelope(name):
    root = schema_of(name)
    assert root["type"] == "object"
    assert list(root["properties"]) == ["apiVersion", "kind", "metadata", "spec", "status"]
    # metadata may describe nothing but name (and generateName): here, for the name rule's fieldPath.
    assert root["properties"]["metadata"] in ({"type": "object"},
                                              {"type": "object", "properties": {"name": {"type": "string"}}})
    assert root["required"] == ["spec"]


def undescribed(node: dict[str, Any], path: str = "", parent_described: bool = False) -> list[str]:
    """The nodes `kubectl explain` shows without a word: all but metadata (the apiserver's) and
    the item or value of a list or map of scalars whose own description says what they hold."""
    if path == ".metadata" or path.startswith(".metadata."):
        return []
    described = "description" in node
    scalar = node.get("type") not in ("object", "array")  # an int-or-string node has no type
    found = [] if described or (parent_described and scalar and path.endswith(("[]", ".*"))) else [path or "(root)"]
    for prop, sub in node.get("properties", {}).items():
        found += undescribed(sub, f"{path}.{prop}", described)
    if "items" in node:
        found += undescribed(node["items"], f"{path}[]", described)
    if isinstance(node.get("additionalProperties"), dict):
        found += undescribed(node["additionalProperties"], f"{path}.*", described)
    return found


@pytest.mark.parametrize("name", [HS_FILE, HSI_FILE])
def test_kubectl_explain_describes_every_field(name):
    bare = undescribed(schema_of(name))
    assert not bare, f"{name}: no description at {', '.join(bare)}"


def test_a_scalar_item_needs_a_described_list():
    schema = {"type": "object", "description": "root", "properties": {
        "tags": {"type": "array", "items": {"type": "string"}},
        "named": {"type": "array", "description": "named", "items": {"type": "string"}},
        "objects": {"type": "array", "description": "objects", "items": {"type": "object"}},
        "metadata": {"type": "object", "properties": {"name": {"type": "string"}}},
    }}
    assert undescribed(schema) == [".tags", ".tags[]", ".objects[]"]


def cel_patterns(rule: str) -> list[str]:
    """The regular expressions of a rule's `matches('...')` or `matches(r'...')` calls (RE2 and Python
    agree on these)."""
    return re.findall(r"matches\(r?'([^']*)'\)", rule)


_MATCH_TERM = re.compile(r"(!?)(\w+)\.matches\(r'([^']*)'\)")


def cel_admits(condition: str, value: str) -> bool:
    """A format's CEL condition (`x.matches(r'...') && !x.matches(r'...') ...`), evaluated as the
    apiserver does: `matches` finds the regex anywhere in the string, as Python's re.search."""
    admitted = True
    for term in condition.split(" && "):
        match = _MATCH_TERM.fullmatch(term)
        assert match, f"{term!r} is not a format's term"
        negated, _, regex = match.groups()
        admitted &= bool(re.search(regex, value)) != bool(negated)
    return admitted


def format_condition(node: dict[str, Any]) -> str:
    """The CEL condition a string node's format rule holds its value to (for an int-or-string, a string's)."""
    rules = node.get("x-kubernetes-validations", [])
    assert len(rules) == 1, rules
    return rules[0]["rule"].removeprefix("type(self) == int || ")


@pytest.mark.parametrize("name", [HS_FILE, HSI_FILE])
def test_every_pattern_comes_with_a_rule_that_says_how_to_write_the_value(name):
    """The apiserver words a failed pattern only as "should match '<regex>'": a CEL rule on the same
    regex carries a message that names the form and gives an example, also where no webhook runs."""
    found = 0
    for path, node in walk(schema_of(name)):
        if "pattern" not in node:
            continue
        found += 1
        (rule,) = node.get("x-kubernetes-validations", [{}])
        assert cel_patterns(rule.get("rule", ""))[:1] == [node["pattern"]], (path, rule)
        assert rule["message"].startswith("must be ") and "e.g. " in rule["message"], (path, rule)
        # `matches` costs by the string's bound: an unbounded one could exceed the CRD's CEL budget.
        assert "maxLength" in node, path
    assert found


@pytest.mark.parametrize("name", [HS_FILE, HSI_FILE])
def test_every_pattern_means_the_same_to_python_and_to_the_apiserver(name):
    """Python reads `\\s`, `\\d`, `\\w` and `\\b` as Unicode classes, RE2 (the apiserver's `pattern` and CEL)
    as ASCII ones: with either, the CLI and the webhook could refuse what the CRD admits, or the reverse."""
    patterns = [node["pattern"] for _, node in walk(schema_of(name)) if "pattern" in node]
    assert patterns
    for pattern in patterns:
        assert not re.search(r"\\[sSdDwWbB]", pattern), pattern
    with pytest.raises(AssertionError, match="write the class's characters out"):
        Format(r"^[^\s]+$", "a word", "no spaces, e.g. word")


@pytest.mark.parametrize("name, valid", [
    ("a", True), ("fleet-1", True), ("f" * 40, True),
    ("1abc", False), ("9x", False), ("a.b", False), ("-a", False), ("a-", False), ("Fleet", False), ("f" * 41, False),
])
def test_the_fleet_name_rule_is_enforced_at_admission(name, valid):
    """Services named after the fleet need a DNS-1035 label and child names stay within 63: a CEL rule on the root."""
    (rule,) = schema_of(HS_FILE)["x-kubernetes-validations"]
    assert rule["fieldPath"] == ".metadata.name"
    (pattern,) = cel_patterns(rule["rule"])
    assert bool(re.search(pattern, name)) is valid
    assert "x-kubernetes-validations" not in schema_of(HSI_FILE)


POD_METADATA = ".spec.podTemplate.metadata"


@pytest.mark.parametrize("kind, key, valid", [
    ("labels", "team", True), ("labels", "example.com/team", True), ("labels", "a" * 253 + "/b", True),
    ("labels", "bad key!", False), ("labels", "Example.com/team", False), ("labels", "a" * 64, False),
    ("labels", "a" * 254 + "/b", False), ("labels", "a/b/c", False), ("labels", "/team", False),
    ("annotations", "Example.com/team", True), ("annotations", "bad key!", False),
])
def test_pod_template_keys_are_checked_by_the_apiserver_as_by_the_model(kind, key, valid):
    node = resolve(schema_of(HS_FILE), f"{POD_METADATA}.{kind}")
    (rule,) = node["x-kubernetes-validations"]
    assert rule["rule"].startswith("self.all(k, ") and rule["rule"].endswith(")")
    assert cel_admits(rule["rule"].removeprefix("self.all(k, ")[:-1], key) is valid
    assert node["maxProperties"] == 64
    body = {"metadata": {kind: {key: "x"}}}
    if valid:
        PodTemplate.model_validate(body)
    else:
        with pytest.raises(ValidationError, match=f"{kind[:-1]} key"):
            PodTemplate.model_validate(body)


@pytest.mark.parametrize("path, value, valid", [
    (f"{POD_METADATA}.labels", "ml-infra", True), (f"{POD_METADATA}.labels", "", True),
    (f"{POD_METADATA}.labels", "ml infra", False), (f"{POD_METADATA}.labels", "-x", False),
    (".spec.router.resources.requests", "500m", True), (".spec.router.resources.requests", "8Gi", True),
    (".spec.router.resources.requests", "1.5", True), (".spec.router.resources.requests", "1e3", True),
    (".spec.router.resources.requests", "lots", False), (".spec.router.resources.requests", "-1", False),
    (".spec.router.resources.requests", "1GiB", False),
])
def test_label_values_and_quantities_have_the_kubernetes_pattern(path, value, valid):
    node = resolve(schema_of(HS_FILE), path)["additionalProperties"]
    assert bool(re.search(node["pattern"], value)) is valid
    assert cel_admits(format_condition(node), value) is valid


def test_architecture_rules_sit_on_the_custom_architecture():
    rules = rules_at(HS_FILE, ".spec.model.architecture")
    assert rules["self.mlaLayers <= self.layers"]["fieldPath"] == ".mlaLayers"
    assert rules["self.attention != 'mla-dsa' || self.indexerLayers >= 1"]["fieldPath"] == ".indexerLayers"
    assert resolve(schema_of(HS_FILE), ".spec.model.architecture.mlaLayers")["minimum"] == 1


@pytest.mark.parametrize("name", [HS_FILE, HSI_FILE])
def test_schema_is_structural(name):
    for path, node in walk(schema_of(name)):
        if node.get("x-kubernetes-int-or-string"):  # the one typeless node the apiserver allows
            assert "type" not in node and node["anyOf"] == crdgen.INT_OR_STRING, path
            continue
        assert node.get("type") in TYPES and "anyOf" not in node, f"{path}: every node needs a type"
        assert set(node) <= set(crdgen.SCHEMA_KEYWORDS), f"{path}: {set(node) - set(crdgen.SCHEMA_KEYWORDS)}"
        assert not ("properties" in node and "additionalProperties" in node), path
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert node.get(bound, True) is True, f"{path}: OpenAPI v3 wants a boolean {bound}"
        if "required" in node:
            assert set(node["required"]) <= set(node["properties"]), path
        if node.get("x-kubernetes-list-type") == "map":
            item = node["items"]
            for key in node["x-kubernetes-list-map-keys"]:
                assert key in item.get("required", ()) or "default" in item["properties"][key], (
                    f"{path}: list-map key {key} must be required or defaulted"
                )
        if node.get("x-kubernetes-list-type") == "set":
            assert node["items"]["type"] in TYPES - {"object", "array"}, path


def test_generator_refuses_what_has_no_structural_form():
    from pydantic import BaseModel

    class Unions(BaseModel):
        api_version: str = "hybridserving.io/v1alpha1"
        kind: str = "Unions"
        spec: dict[str, int | list[str]]
        status: None = None

    with pytest.raises(ValueError, match=r"\.spec\.\*: anyOf .* has no structural form"):
        crdgen.render_schema(Unions)


def test_router_quantities_are_int_or_string_as_in_a_pod():
    node = resolve(schema_of(HS_FILE), ".spec.router.resources.requests")["additionalProperties"]
    assert node["x-kubernetes-int-or-string"] is True
    assert violations(node, 4) == [] and violations(node, "500m") == []
    assert violations(node, 0.5) == [": 0.5 is not integer or string"]
    assert violations(node, -1) == [": -1 below minimum"]
    assert violations(node, "lots") != []


def test_every_user_string_and_list_is_bounded():
    # The apiserver's CEL cost estimate assumes the worst case of every string and list a rule
    # might touch; unbounded ones make a later rule fail at CRD creation.
    for name in (HS_FILE, HSI_FILE):
        for path, node in walk(schema_of(name)["properties"]["spec"], ".spec"):
            if node.get("type") == "string" or node.get("x-kubernetes-int-or-string"):
                assert "maxLength" in node or "enum" in node, f"{name} {path}: string without maxLength"
            if node.get("type") == "array":
                assert "maxItems" in node, f"{name} {path}: list without maxItems"


def test_status_strings_and_lists_carry_the_bounds_their_writers_keep():
    # Free text whose writer keeps no bound stays unbounded: a bound would fail the status patch.
    unbounded = {".status.capacity.summary",  # "no capacity: <the exception>"
                 ".status.switches[].phase"}  # the launcher's message and the steps' timings
    for name in (HS_FILE, HSI_FILE):
        for path, node in walk(schema_of(name)["properties"]["status"], ".status"):
            if node.get("type") == "string" and path not in unbounded:
                assert "maxLength" in node or "enum" in node, f"{name} {path}: string without maxLength"
            if node.get("type") == "array":
                assert "maxItems" in node, f"{name} {path}: list without maxItems"
    errors = resolve(schema_of(HS_FILE), ".status.weights.errors")
    assert errors["maxItems"] == 5 and errors["items"]["maxLength"] == 253 + len(": ") + 200
    assert resolve(schema_of(HS_FILE), ".status.ready")["enum"] == ["True", "False", "Unknown"]


# --------------------------------------------------------------------------- CEL rules


def rules_at(name: str, dotted: str) -> dict[str, dict[str, str]]:
    return {rule["rule"]: rule for rule in resolve(schema_of(name), dotted).get("x-kubernetes-validations", [])}


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_layout_rules_sit_on_both_roles_layout(role):
    rules = rules_at(HS_FILE, f".spec.{role}.layout")
    assert rules["self.tp % self.dcp == 0"]["fieldPath"] == ".dcp"
    assert rules["self.attnCp == 1 || has(self.cpStrategy)"]["reason"] == "FieldValueRequired"
    assert "self.tp % (self.attnDp * self.attnCp) == 0" in rules


def test_fleet_rules_sit_where_expected():
    assert "has(self.profile) != has(self.architecture)" in rules_at(HS_FILE, ".spec.model")
    spec_rules = rules_at(HS_FILE, ".spec")
    assert spec_rules["!has(self.prefill.layout) || self.prefill.layout.dcp == 1"]["fieldPath"] == ".prefill.layout.dcp"
    assert any("self.rdmaResourceCount == 0" in rule for rule in rules_at(HS_FILE, ".spec.transfer"))


def test_instance_rules_guard_identity_and_ports():
    assert rules_at(HSI_FILE, ".spec.index") == {
        "self == oldSelf": {"rule": "self == oldSelf", "message": "index is immutable"}
    }
    assert "self >= oldSelf" in rules_at(HSI_FILE, ".spec.restartGeneration")
    (ports_rule,) = rules_at(HSI_FILE, ".spec.ports")
    assert ports_rule.count("!=") == 10  # every pair of the five ports


@pytest.mark.parametrize("name", [HS_FILE, HSI_FILE])
def test_every_rule_is_well_formed_and_points_at_a_field(name):
    count = 0
    for path, node in walk(schema_of(name)):
        for rule in node.get("x-kubernetes-validations", []):
            count += 1
            assert rule["rule"].strip() and rule["message"].strip(), path
            assert rule.get("reason", "FieldValueInvalid") in REASONS, path
            if "fieldPath" in rule:
                # The apiserver resolves fieldPath against the schema and refuses the CRD otherwise.
                resolve(node, rule["fieldPath"])
    assert count > 0


def test_every_model_rule_reaches_the_crd():
    def declared(model: type, seen: set[type]) -> set[str]:
        if model in seen or not hasattr(model, "model_fields"):
            return set()
        seen.add(model)
        extra = model.model_config.get("json_schema_extra") or {}
        rules = {rule["rule"] for rule in extra.get("x-kubernetes-validations", [])}
        for field in model.model_fields.values():
            field_extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            rules |= {rule["rule"] for rule in field_extra.get("x-kubernetes-validations", [])}
            for arg in [*field.metadata, *_types_in(field.annotation)]:
                if isinstance(arg, Format):
                    rules.add(arg.rule()["rule"])
                # A hand-written schema (an open pod spec patch, an int-or-string quantity).
                elif isinstance(arg, WithJsonSchema) and isinstance(arg.json_schema, dict):
                    rules |= {rule["rule"] for rule in arg.json_schema.get("x-kubernetes-validations", [])}
                else:
                    rules |= declared(arg, seen)
        return rules

    for name, model in ((HS_FILE, HybridServing), (HSI_FILE, HybridServingInstance)):
        emitted = {
            rule["rule"] for _, node in walk(schema_of(name)) for rule in node.get("x-kubernetes-validations", [])
        }
        assert declared(model, set()) == emitted


def _types_in(annotation: Any) -> Iterator[Any]:
    """The types an annotation names, and the metadata of the Annotated ones among them."""
    yield annotation
    yield from getattr(annotation, "__metadata__", ())
    for arg in getattr(annotation, "__args__", ()):
        yield from _types_in(arg)


# --------------------------------------------------------------------------- printer columns


@pytest.mark.parametrize("name", [HS_FILE, HSI_FILE])
def test_printer_columns_point_at_typed_fields(name):
    root = schema_of(name)
    columns = version_of(name)["additionalPrinterColumns"]
    assert columns[sum(1 for c in columns if c.get("priority", 0) == 0) - 1]["name"] == "Age"
    for column in columns:
        if column["jsonPath"] == ".metadata.creationTimestamp":
            assert column["type"] == "date"
            continue
        node = resolve(root, column["jsonPath"])
        assert node["type"] == column["type"], column


def test_fleet_columns_show_readiness_roles_and_capacity():
    paths = {c["name"]: c["jsonPath"] for c in version_of(HS_FILE)["additionalPrinterColumns"] if "priority" not in c}
    assert paths == {
        "Ready": ".status.ready",
        "Prefill": ".status.prefill.summary",
        "Decode": ".status.decode.summary",
        "KV Capacity": ".status.capacity.summary",
        "Age": ".metadata.creationTimestamp",
    }


# --------------------------------------------------------------------------- defaults


@pytest.mark.parametrize("name", [HS_FILE, HSI_FILE])
def test_every_default_is_valid_and_complete_as_written(name):
    # The apiserver validates each default as written (CEL included) before nested defaults
    # apply: an object default must already hold every nested default.
    for path, node in walk(schema_of(name)):
        if "default" in node:
            default = node["default"]
            assert violations(node, default, path) == []
            assert apply_defaults(node, copy.deepcopy(default)) == default, f"{path}: incomplete default"


MINIMAL_FLEET = {
    "apiVersion": "hybridserving.io/v1alpha1",
    "kind": "HybridServing",
    "metadata": {"name": "fleet"},
    "spec": {"model": {"path": "deepseek-ai/DeepSeek-V3", "profile": "deepseek-v3"}, "prefill": {}, "decode": {}},
}
MINIMAL_INSTANCE = {
    "apiVersion": "hybridserving.io/v1alpha1",
    "kind": "HybridServingInstance",
    "metadata": {"name": "fleet-decode-0"},
    "spec": {
        "role": "decode",
        "index": 0,
        "nodes": 2,
        "configHash": "5f3a9c",
        "ports": {"http": 30000, "bootstrap": 8998, "distInit": 20000, "engineInfoBootstrap": 6789},
    },
}


@pytest.mark.parametrize(
    "name, model, minimal",
    [(HS_FILE, HybridServing, MINIMAL_FLEET), (HSI_FILE, HybridServingInstance, MINIMAL_INSTANCE)],
)
def test_schema_defaults_are_the_model_defaults(name, model, minimal):
    schema = schema_of(name)
    defaulted = apply_defaults(schema, copy.deepcopy(minimal))
    assert violations(schema, defaulted) == []
    parsed = model.model_validate(defaulted)
    # What the apiserver stores is exactly what the operator's model makes of the same input.
    expected = model.model_validate(minimal).spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert defaulted["spec"] == expected
    assert parsed.spec == model.model_validate(minimal).spec
    status_node = schema["properties"]["status"]
    status_model = type(parsed).model_fields["status"].annotation.__args__[0]
    assert apply_defaults(status_node, {}) == status_model().model_dump(by_alias=True, exclude_none=True, mode="json")


def test_a_full_fleet_status_is_written_without_loss():
    status = HybridServingStatus(
        observed_generation=3,
        conditions=[
            Condition(type="Ready", status="True", reason="AllInstancesReady", observed_generation=3,
                      last_transition_time="2026-01-01T00:00:00Z"),
            Condition(type="LayoutValid", status="True", reason="Valid", last_transition_time="2026-01-01T00:00:00Z"),
        ],
        prefill=RoleStatus(desired=2, ready=2, updated=2, summary="2/2"),
        decode=RoleStatus(desired=2, ready=1, updated=2, summary="1/2"),
        instances=[
            InstanceStatus(name="fleet-prefill-0", role="prefill", phase="Ready", nodes=["gpu-0"], generation="ab12")
        ],
        capacity=CapacityStatus(
            decode_tokens_per_instance=1_000_000, decode_tokens_total=2_000_000, summary="2.0M tokens"
        ),
        switches=[
            SwitchRecord(instance="fleet-decode-1", from_role="decode", to_role="prefill", mode="in-place",
                         reason="prefill queue above target", outcome="Succeeded", started="2026-01-01T00:00:00Z",
                         finished="2026-01-01T00:01:00Z", phase="Verified")
        ],
        ready="True",
    )
    wire = status.to_wire()
    assert violations(schema_of(HS_FILE)["properties"]["status"], wire, ".status") == []
    assert HybridServingStatus.model_validate(wire) == status


def test_the_longest_status_values_the_operator_writes_fit_the_bounds():
    # A bound the operator's writers can exceed would fail their status patches: each writer's
    # longest value must pass the model and the schema alike.
    from types import SimpleNamespace

    from hybridserving.api.weights import WeightsSpec
    from hybridserving.controller.switching import _history_entry
    from hybridserving.core import weights
    from hybridserving.core.naming import engine_selector
    from hybridserving.core.observed import format_time
    from hybridserving.core.switching import SwitchState

    longest_name = "n" * 253
    spec = WeightsSpec(uri="hf://" + "m" * 1019, cache="Node")
    pods = [SimpleNamespace(name=f"p{i}", node_name=f"{longest_name[:-1]}{i}", weights_fill=("Failed", "x" * 5000),
                            weights_copy=weights.copy_directory(spec), deleting=False)
            for i in range(9)]
    last_time = format_time(253402300799)  # 9999-12-31T23:59:59Z
    switch = SwitchState("decode", "prefill", "relaunch", "r" * 5000, 0.0, step="Done", outcome="Failed",
                         message="m" * 5000)
    status = HybridServingStatus(
        conditions=[Condition(type="Ready", status="False", reason="InstancesNotReady", message="x" * 4000,
                              last_transition_time="2006-01-02T15:04:05.999999999+07:00")],
        instances=[InstanceStatus(name=longest_name, role="decode", phase="Ready", nodes=[longest_name] * 64,
                                  generation="f" * 63)],
        ready="True",
        last_progress_time=last_time,
        selector=engine_selector(longest_name),
        weights=weights.summarize(spec, pods),
        switches=[SwitchRecord.model_validate(_history_entry(longest_name, switch, finished=253402300799))],
    )
    assert len(status.weights.errors) == 5 and status.weights.nodes_failed == 9
    assert violations(schema_of(HS_FILE)["properties"]["status"], status.to_wire(), ".status") == []


def test_a_full_instance_status_is_written_without_loss():
    import datetime

    status = HybridServingInstanceStatus(
        phase="Switching",
        role="prefill",
        ready_pods=1,
        pod_names=["fleet-decode-1-0", "fleet-decode-1-1"],
        node_names=["gpu-0", "gpu-1"],
        conditions=[Condition(type="Ready", status="False", reason="Switching",
                              last_transition_time="2026-01-01T00:00:00Z")],
        observed_generation=5,
        last_switch=datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc),
    )
    wire = status.to_wire()
    assert violations(schema_of(HSI_FILE)["properties"]["status"], wire, ".status") == []
    assert HybridServingInstanceStatus.model_validate(wire) == status


def test_every_example_manifest_survives_admission_without_pruning():
    examples = sorted((REPO / "examples").glob("*.yaml"))
    assert examples
    schema = schema_of(HS_FILE)
    for path in examples:
        manifest = yaml.safe_load(path.read_text())
        assert violations(schema, apply_defaults(schema, manifest)) == [], path.name


def test_wrong_types_and_out_of_range_values_fail_the_schema():
    schema = schema_of(HS_FILE)
    bad = copy.deepcopy(MINIMAL_FLEET)
    bad["spec"]["prefill"] = {"replicas": -1, "layout": {"tp": "eight"}}
    found = violations(schema, apply_defaults(schema, bad))
    assert ".spec.prefill.replicas: -1 below minimum" in found
    assert ".spec.prefill.layout.tp: 'eight' is not integer" in found


def test_instance_ports_must_be_distinct_in_the_model_too():
    with pytest.raises(ValueError, match="five distinct ports"):
        InstancePorts(http=30000, bootstrap=30000, dist_init=20000, engine_info_bootstrap=6789)


# --------------------------------------------------------------------------- names Kubernetes checks later

LABEL_KEYS = [("hybridserving.io/rack", True), ("topology.kubernetes.io/zone", True), ("kubernetes.io/hostname", True),
              ("rack", True), ("", False), ("rack id", False), ("Example.com/rack", False), ("a/b/c", False),
              ("/rack", False), ("a" * 64, False)]
RESOURCES = [("nvidia.com/gpu", True), ("amd.com/gpu", True), ("rdma/ib", True), ("example.com/Gpu_1", True),
             ("a" * 244 + "/x", True), ("gpu", False), ("nvidia.com/", False), ("kubernetes.io/gpu", False),
             ("gpu.kubernetes.io/x", False), ("requests.example.com/gpu", False), ("Nvidia.com/gpu", False),
             ("nvidia.com/gpu/x", False), ("a" * 245 + "/x", False), ("nvidia.com/ gpu", False)]
IMAGES = [("lightseekorg/smg:1.13.0", True), ("registry.example:5000/smg@sha256:0a1b", True), ("", False),
          (" lightseekorg/smg", False), ("lightseekorg/smg :1.13.0", False)]
CASES = [
    *((f"network.{field}", key, valid) for field in ("nvlinkDomainKey", "rdmaFabricKey", "rackKey")
      for key, valid in LABEL_KEYS),
    *(("hardware.gpuResourceName", name, valid) for name, valid in RESOURCES),
    *(("transfer.rdmaResourceName", name, valid) for name, valid in RESOURCES if name),
    ("transfer.rdmaResourceName", "", True),
    *(("router.image", image, valid) for image, valid in IMAGES),
]


def admitted_by_schema(node: dict[str, Any], value: str) -> bool:
    """The field's pattern and its format's CEL rule, evaluated as written."""
    return not violations(node, value) and cel_admits(format_condition(node), value)


@pytest.mark.parametrize("field, value, valid", CASES)
def test_names_the_operator_writes_into_pods_are_checked_by_the_apiserver_as_by_the_model(field, value, valid):
    """Topology keys, resource names and the router image go into every pod: one the apiserver or the
    scheduler refuses would leave an instance deleted for a rollout unable to come back."""
    assert admitted_by_schema(resolve(schema_of(HS_FILE), f".spec.{field}"), value) is valid
    section, name = field.split(".")
    fleet = copy.deepcopy(MINIMAL_FLEET)
    fleet["spec"][section] = {name: value}
    if valid:
        HybridServing.model_validate(fleet)
        return
    with pytest.raises(ValidationError) as refused:
        HybridServing.model_validate(fleet)
    (error,) = field_errors(refused.value)
    assert error.path == f"spec.{field}"
    # The model's error is the apiserver's: the value, then the rule's message.
    (rule,) = resolve(schema_of(HS_FILE), f".spec.{field}")["x-kubernetes-validations"]
    assert (error.kind, error.message) == ("string_format", f"{value!r} {rule['message']}")
