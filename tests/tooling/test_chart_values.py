"""`upgrade-check --values` reads the chart's values as the chart does: the same files, rendered
by the real `helm`, give the operator the flags whose engine policy the check plans with, and
the fields it reads have the chart schema's types and constraints."""

from __future__ import annotations

import json
import pathlib
from dataclasses import replace
from typing import Any

import pytest
import yaml

from hybridserving.commands import chartvalues
from hybridserving.controller import __main__ as operator_main
from hybridserving.manifests import ManifestInvalid
from support.chart import CHART, helm, operator_container, template_args

# Each case is the values files of one `helm template -f a -f b`, in order.
VALUES = [
    [{}],
    [{"engineImage": {"tag": "next"}}],
    [{"engineImage": {"repository": "registry.example/serving/engine", "digest": "sha256:" + "a" * 64}}],
    [{"enginePolicy": {"allowHostNetwork": True, "allowIpcLock": True,
                       "allowedImages": ["registry.example/serving/", "lightseekorg/"]}}],
    # A null deletes the key, default and all; an optional one then reads as absent.
    [{"engineImage": {"digest": None}, "enginePolicy": {"allowedImages": None}}],
    [{"engineImage": {"digest": "sha256:" + "b" * 64}}, {"engineImage": {"digest": None}}],
    [{"engineImage": None}, {"engineImage": {"repository": "registry.example/engine", "tag": "v2"}}],
    [{"routerImage": {"repository": "registry.example/mirror/smg", "digest": "sha256:" + "c" * 64}}],
    [{"enginePolicy": {"allowNodeCache": True, "allowedNodeCachePaths": ["/mnt/nvme", "/data/models"],
                       "allowServiceAccount": True}}],
    [{"enginePolicy": {"allowedNodeCachePaths": None}}],
]


@pytest.mark.parametrize("files", VALUES, ids=["defaults", "tag", "digest", "grants", "null-optional",
                                              "null-overrides-file", "file-overrides-null",
                                              "router-mirror", "node-cache-and-account", "null-cache-paths"])
def test_the_values_give_the_policy_the_chart_gives_the_operator(
        tmp_path: pathlib.Path, files: list[dict[str, Any]]) -> None:
    paths = write(tmp_path, files)
    proc = helm(*template_args([]), *(a for p in paths for a in ("-f", p)))
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    flags = operator_main.arguments().parse_args(operator_container(docs)["args"])
    running = operator_main.engine_policy(flags)
    # The release's own Secrets are named by the release, which a values file does not hold.
    assert chartvalues.read(paths).policy() == replace(running, operator_namespace=None, operator_secrets=())


@pytest.mark.parametrize(("values", "field"), [
    ({"engineImage": {"tag": None}}, "engineImage.tag"),
    ({"enginePolicy": {"allowIpcLock": None}}, "enginePolicy.allowIpcLock"),
    ({"enginePolicy": {"allowNodeCache": None}}, "enginePolicy.allowNodeCache"),
    ({"enginePolicy": None}, "enginePolicy"),
    ({"engineImage": None}, "engineImage"),
    ({"routerImage": {"repository": None}}, "routerImage.repository"),
    ({"routerImage": None}, "routerImage"),
])
def test_a_null_that_removes_a_value_the_chart_needs_is_refused_as_helm_refuses_it(
        tmp_path: pathlib.Path, values: dict[str, Any], field: str) -> None:
    """Helm fails such a release (its schema, or a template reading the removed map); the check
    names the field instead of planning with a default the upgrade would not have."""
    paths = write(tmp_path, [values])
    proc = helm(*template_args([]), "-f", paths[0])
    assert proc.returncode != 0, proc.stdout
    with pytest.raises(ManifestInvalid) as refused:
        chartvalues.read(paths)
    [error] = refused.value.errors
    assert (error.path, error.fix) == (field, "give a value, or leave the key out to keep the chart's default")
    assert "removes the chart's default" in error.message


def write(tmp_path: pathlib.Path, files: list[dict[str, Any]]) -> list[str]:
    paths = []
    for i, values in enumerate(files):
        path = tmp_path / f"values-{i}.yaml"
        path.write_text(yaml.safe_dump(values))
        paths.append(str(path))
    return paths


def test_the_fields_read_have_the_chart_schemas_types_and_constraints() -> None:
    """The schema's `required` holds for the values the chart's defaults complete: a model with a
    default there would hide a null that removed it."""
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]
    for key, model in (("engineImage", chartvalues.ImageValues), ("routerImage", chartvalues.ImageValues),
                       ("enginePolicy", chartvalues.EnginePolicyValues)):
        ours, theirs = model.model_json_schema(by_alias=True), schema[key]
        assert ours.get("additionalProperties") is theirs.get("additionalProperties") is False, key
        assert set(ours["properties"]) == set(theirs["properties"]), key
        for name, field in theirs["properties"].items():
            mine = ours["properties"][name]
            for part in ("type", "pattern", "minLength"):
                assert mine.get(part) == field.get(part), f"{key}.{name}: {part}"
            if "items" in field:
                assert {k: mine["items"].get(k) for k in field["items"]} == field["items"], f"{key}.{name}"
        assert set(ours.get("required", [])) == set(theirs.get("required", [])), key


def test_the_chart_defaults_are_the_ones_read_without_values() -> None:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert chartvalues.DEFAULTS == {key: defaults[key] for key in chartvalues.DEFAULTS}
    assert chartvalues.ChartValues.model_validate(defaults).policy() == chartvalues.read([]).policy()
