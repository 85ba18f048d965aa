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
from support.chart import CHART, helm, operator_container, template_args

VALUES = [
    {},
    {"engineImage": {"tag": "next"}},
    {"engineImage": {"repository": "registry.example/serving/engine", "digest": "sha256:" + "a" * 64}},
    {"enginePolicy": {"allowHostNetwork": True, "allowIpcLock": True,
                      "allowedImages": ["registry.example/serving/", "lightseekorg/"]}},
]


@pytest.mark.parametrize("values", VALUES, ids=["defaults", "tag", "digest", "grants"])
def test_the_values_give_the_policy_the_chart_gives_the_operator(
        tmp_path: pathlib.Path, values: dict[str, Any]) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    proc = helm(*template_args([]), "-f", str(path))
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    flags = operator_main.arguments().parse_args(operator_container(docs)["args"])
    running = operator_main.engine_policy(flags)
    assert chartvalues.read([str(path)]).policy() == replace(running, operator_namespace=None)


def test_the_fields_read_have_the_chart_schemas_types_and_constraints() -> None:
    """Defaults aside (a values file gives only what it overrides): the schema's `required` holds
    for the merged values, which the defaults complete."""
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]
    for key, model in (("engineImage", chartvalues.EngineImageValues),
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


def test_the_chart_defaults_are_the_ones_read_without_values() -> None:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert (chartvalues.ChartValues.model_validate(defaults).policy()
            == chartvalues.ChartValues().policy() == chartvalues.read([]).policy())
