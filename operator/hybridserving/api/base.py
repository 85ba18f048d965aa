"""What every API model shares: camelCase on the wire, unknown fields refused, CEL rule entries."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
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
