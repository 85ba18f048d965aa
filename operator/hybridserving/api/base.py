"""What every API model shares: camelCase on the wire, unknown fields refused, CEL rule entries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.config import JsonDict
from pydantic.alias_generators import to_camel


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


class ApiModel(BaseModel):
    """Base: camelCase on the wire, unknown fields rejected (the CRD prunes them anyway)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

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
