"""What every API model shares: camelCase on the wire, unknown fields refused, CEL rule entries."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import (BaseModel, ConfigDict, GetCoreSchemaHandler, GetJsonSchemaHandler, ValidationError,
                      ValidationInfo, model_validator)
from pydantic.config import JsonDict
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema


def cel(rule: str, message: str, field_path: str | None = None, reason: str | None = None) -> JsonDict:
    """One `x-kubernetes-validations` entry; `field_path` is relative to the node, e.g. "layout.dcp".

    The apiserver wants fieldPath as a JSON path starting with "." and refuses the CRD otherwise.
    """
    entry: JsonDict = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = f".{field_path}"
    if reason:
        entry["reason"] = reason
    return entry


@dataclass(frozen=True)
class Format:
    """A string grammar, stated once for every reader of the value: the model, the webhook and the CLI
    (`admits`), and the apiserver (the schema's `pattern` and a CEL rule on the same text).

    The apiserver words a failed `pattern` only as "should match '<regex>'"; the CEL rule beside it
    carries `message`, which names the form and gives an example, so that a cluster whose webhook
    is off (or down) still says how to write the value. Use it as `Annotated[str, Field(max_length=N),
    FORMAT]`: the bound is checked first, and it keeps the rule's CEL cost within the apiserver's budget.

    `pattern` is anchored, and each regex is the same text for Python, OpenAPI and RE2 (CEL): no
    lookaround, and a `'`-free text for CEL's raw string literal. `forbids` are what a regex cannot
    say as a single match (a part's length, a reserved prefix): a value matching one is refused.
    """

    pattern: str
    noun: str
    shape: str
    forbids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        assert self.pattern.startswith("^") and self.pattern.endswith("$"), self.pattern
        for regex in (self.pattern, *self.forbids):
            assert "'" not in regex, f"{regex}: a CEL raw string literal cannot hold '"
            # Python reads these classes as Unicode, RE2 as ASCII: spell the characters out.
            assert not re.search(r"\\[sSdDwWbB]", regex), f"{regex}: write the class's characters out"

    @property
    def message(self) -> str:
        """What a value must look like, with an example: the CEL rule's message, the model's error."""
        return f"must be {self.noun}: {self.shape}"

    def admits(self, value: str) -> bool:
        return re.fullmatch(self.pattern, value) is not None and not any(re.search(f, value) for f in self.forbids)

    def refusal(self, value: object) -> str:
        return f"{value!r} {self.message}"

    def condition(self, subject: str = "self") -> str:
        """The CEL expression that holds when `subject` (a string) is admitted."""
        return " && ".join([f"{subject}.matches(r'{self.pattern}')",
                            *(f"!{subject}.matches(r'{regex}')" for regex in self.forbids)])

    def rule(self) -> JsonDict:
        return cel(self.condition(), self.message)

    def _checked(self, value: str) -> str:
        if not self.admits(value):
            # The refusal as context, not as the template: the template's braces would be formatted.
            raise PydanticCustomError("string_format", "{refusal}", {"refusal": self.refusal(value)})
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self._checked, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema["pattern"] = self.pattern
        json_schema["x-kubernetes-validations"] = [self.rule()]
        return json_schema


# Validation context for an object read from the cluster (`model_validate(..., context=FROM_CLUSTER)`).
FROM_CLUSTER: dict[str, bool] = {"fromCluster": True}


class ApiModel(BaseModel):
    """Base: camelCase on the wire, unknown fields rejected (a typo in a file), except in objects
    read from the cluster.

    The apiserver prunes what its CRD does not know, so a field this code does not know, in an
    object the apiserver sent, is one a newer CRD defines: the CRDs applied ahead of the
    operator in an upgrade, or the operator rolled back under them. Its defaults appear in every
    fleet at once, and refusing them would refuse every fleet (and every create or update, at
    the webhook) until the versions agree; they are dropped instead, as the older CRD would.
    """

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _drop_newer_fields(cls, data: Any, info: ValidationInfo) -> Any:
        if not (isinstance(data, dict) and info.context and info.context.get("fromCluster")):
            return data
        known = {name for name in cls.model_fields} | {f.alias for f in cls.model_fields.values() if f.alias}
        return {key: value for key, value in data.items() if key in known}

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class FieldInvalid(ValueError):
    """A rule across fields, raised by a model validator, that names the field to change.

    Pydantic places a model validator's error at the model; `field` (the wire path below it, e.g.
    "maxUnavailable" or "labels.team") lets the error name the field as the CEL rule's fieldPath
    does, so the CLI, the webhook and the apiserver point at the same line of YAML.
    """

    def __init__(self, field: str | int, message: str):
        super().__init__(message)
        self.field = field

    @property
    def loc(self) -> tuple[str | int, ...]:
        """`field` as a location: an int is an index into the list validated, as the apiserver's `[1]`."""
        return (self.field,) if isinstance(self.field, int) else tuple(self.field.split("."))


@dataclass(frozen=True)
class FieldError:
    """One refused value: where it is in the object as written, what is wrong, pydantic's error type."""

    path: str
    message: str
    kind: str


def _field_path(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
        elif not str(item).startswith("function-"):
            parts.append(str(item))
    return ".".join(parts) or "(document)"


def field_errors(exc: ValidationError) -> list[FieldError]:
    """Pydantic's errors as wire field paths (`spec.prefill.layout.tp`, `...containers[0]`)."""
    out = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, FieldInvalid):
            loc += cause.loc
        out.append(FieldError(_field_path(loc), err["msg"].removeprefix("Value error, "), err["type"]))
    return out
