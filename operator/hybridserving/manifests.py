"""Reading HybridServing manifests from YAML, with errors a person can act on.

Users hand the CLI the same files they `kubectl apply`, so a malformed document, a wrong
type or a hostile name must come back as "field path: problem; fix", never a traceback.
"""

from __future__ import annotations

import functools
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from hybridserving.api.base import field_errors
from hybridserving.api.crd import render_schema
from hybridserving.api.v1alpha1 import GROUP, INSTANCE_KIND, KIND, HybridServing


@dataclass(frozen=True)
class ManifestError:
    """One problem with one document, located by field path (or line, for YAML syntax)."""

    path: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message} (fix: {self.fix})"


class ManifestInvalid(Exception):
    """The errors of one document; `others`, those of the later documents of the same file that
    fail too, so that one run names every document to fix."""

    def __init__(self, source: str, errors: list[ManifestError], others: tuple[ManifestInvalid, ...] = ()):
        self.source, self.errors, self.others = source, errors, others
        super().__init__("; ".join(f"{d.source}: " + "; ".join(str(e) for e in d.errors) for d in self.documents))

    @property
    def documents(self) -> tuple[ManifestInvalid, ...]:
        return (self, *self.others)


_FIXES = {
    "int_parsing": "write a whole number without quotes",
    "int_type": "write a whole number without quotes",
    "float_parsing": "write a number without quotes",
    "bool_parsing": "write true or false",
    "bool_type": "write true or false without quotes",
    "string_type": "quote the value: this field is a string",
    "literal_error": "use one of the allowed values",
    "extra_forbidden": "remove the field or check its spelling (fields are camelCase)",
    "missing": "add the field",
    "greater_than_equal": "raise the value",
    "less_than_equal": "lower the value",
    "greater_than": "raise the value",
    "less_than": "lower the value",
    "string_too_long": "shorten the value",
    "string_format": "write the value in the form the message gives",
}


def errors_from_validation(exc: ValidationError, reference: str = "`kubectl explain hybridserving.{path}`"
                           ) -> list[ManifestError]:
    """Pydantic's errors as field paths in the YAML, each with the fix for its kind of error (else
    to see `reference`, formatted with the path)."""
    out = []
    for err in field_errors(exc):
        fix = _FIXES.get(err.kind, "see " + reference.format(path=err.path))
        if err.kind == "value_error":
            fix = "give each value once" if err.message.startswith("Duplicate value") else "see the message"
        out.append(ManifestError(err.path, err.message, fix))
    return out


# Values one document may hold. YAML aliases repeat their anchor's value, so a few hundred bytes
# can name billions of values (the "billion laughs"); kubectl refuses such "excessive aliasing". A
# fleet, with every list at its schema bound, is a few thousand values; this is far above any.
MAX_VALUES = 100_000
# Levels of nesting: a fleet is about a dozen deep; the JSON reader behind the schema stops at 255.
MAX_DEPTH = 100

_TOO_DEEP = ManifestError("(document)", "the YAML nests too deeply to read",
                          "remove the extra nesting: a HybridServing is about a dozen levels deep")


class _NotSent(Exception):
    """The document is not one kubectl would send: too large, too deep, or a number JSON cannot carry."""

    def __init__(self, error: ManifestError):
        super().__init__(error.message)
        self.error = error


@functools.cache
def _crd_schema() -> Mapping[str, Any]:
    return render_schema(HybridServing)


def _keeps_null(parent: Mapping[str, Any] | None, node: Mapping[str, Any] | None) -> bool:
    """Whether the apiserver stores a null at a key of schema `node` (None: the schema does not name
    the key) in an object of schema `parent` (None: inside such a key). It prunes a null where the
    schema is not nullable, before defaulting; it keeps one the schema marks nullable, and one at a
    key it keeps unknown (x-kubernetes-preserve-unknown-fields)."""
    if node is not None:
        return bool(node.get("nullable"))
    return parent is None or bool(parent.get("x-kubernetes-preserve-unknown-fields"))


def _field_schema(node: Mapping[str, Any] | None, key: str) -> Mapping[str, Any] | None:
    if node is None:
        return None
    sub = (node.get("properties") or {}).get(key, node.get("additionalProperties"))
    return sub if isinstance(sub, Mapping) else None


def _as_kubectl_sends(value: Any, schema: Mapping[str, Any] | None, path: str = "", budget: list[int] | None = None,
                      depth: int = 0) -> Any:
    """The document as kubectl's YAML-to-JSON step writes it and the apiserver then reads it against
    the CRD's `schema`: a whole float (`8.0`) becomes `8`; a field set to null is left out where the
    apiserver prunes it (the operator's own fields, none nullable, whose defaults then fill in) and
    kept where it stores it (the keys of a pod template's spec), so the model judges the nulls the
    webhook and the reconcile see. Raises _NotSent past MAX_VALUES values, counted as expanded,
    before the expansion costs the memory and time an alias bomb asks for, or past MAX_DEPTH levels;
    and for a number JSON cannot carry (.inf, .nan), which kubectl fails to convert."""
    budget = [MAX_VALUES] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0:
        raise _NotSent(ManifestError(
            "(document)", f"more than {MAX_VALUES:,} values, counting each alias (*name) as the values it repeats",
            "remove the excess: a HybridServing has a few thousand values at most, and write values out "
            "instead of nesting aliases"))
    if depth > MAX_DEPTH:
        raise _NotSent(_TOO_DEEP)
    if isinstance(value, dict):
        subs = {k: _field_schema(schema, str(k)) for k in value}
        return {k: _as_kubectl_sends(v, subs[k], f"{path}.{k}" if path else str(k), budget, depth + 1)
                for k, v in value.items() if v is not None or _keeps_null(schema, subs[k])}
    if isinstance(value, list):
        items = schema.get("items") if schema is not None else None
        return [_as_kubectl_sends(v, items, f"{path}[{i}]", budget, depth + 1) for i, v in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        raise _NotSent(ManifestError(path or "(document)", f"{value} is not a number JSON can carry",
                                      "write a finite number, or quote the value if it is a string"))
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def parse_document(doc: Any, source: str = "<input>") -> HybridServing:
    if not isinstance(doc, dict):
        raise ManifestInvalid(
            source, [ManifestError("(document)", "expected a mapping (a HybridServing object)", "check the YAML")]
        )
    kind = doc.get("kind")
    if kind != KIND:
        raise ManifestInvalid(
            source, [ManifestError("kind", f"expected HybridServing, got {kind!r}", "set kind: HybridServing")]
        )
    if "apiVersion" not in doc:
        # The model would fill it in; kubectl refuses the object ("apiVersion not set").
        raise ManifestInvalid(source, [ManifestError(
            "apiVersion", "not set: kubectl refuses an object without it", f"set apiVersion: {GROUP}/v1alpha1")])
    try:
        sent = _as_kubectl_sends(doc, _crd_schema())
    except _NotSent as exc:
        raise ManifestInvalid(source, [exc.error]) from None
    try:
        # As the apiserver reads it: JSON types checked as they are, so a quoted "8" or "true"
        # fails here as it fails `kubectl apply`, rather than passing `validate` first.
        return HybridServing.model_validate_json(json.dumps(sent, default=str), strict=True)
    except ValidationError as exc:
        raise ManifestInvalid(source, errors_from_validation(exc)) from None


class _DuplicateKey(yaml.constructor.ConstructorError):
    pass


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that reads as kubectl's YAML reader (go-yaml v2, then JSON) reads: a key given
    twice in one mapping is an error ("already set in map"), where PyYAML keeps the last silently
    and `validate` would pass a fleet the apply refuses; a timestamp stays the text it was written
    as (go-yaml hands one to an untyped value as its string, so `2024-01-01` as an annotation key
    or value is that text, where PyYAML makes a date that JSON cannot carry); and `!!binary` is its
    decoded text."""

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_yaml_binary(self, node: yaml.ScalarNode) -> str:  # type: ignore[override]
        data = super().construct_yaml_binary(node)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise yaml.constructor.ConstructorError(
                None, None, "!!binary data that is not UTF-8 text: a HybridServing holds text only",
                node.start_mark) from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key, which SafeLoader refuses below
                continue
            if first is not None:
                raise _DuplicateKey(None, None, f"key {key!r} already set in this mapping at line {first}",
                                    key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_constructor("tag:yaml.org,2002:binary", _StrictLoader.construct_yaml_binary)


def yaml_documents(text: str, source: str = "<input>") -> list[Any]:
    """The documents of a YAML text that are not empty, read as kubectl reads them (a key given
    twice is an error); ManifestInvalid with the line and column where it is not YAML."""
    try:
        return [d for d in yaml.load_all(text, Loader=_StrictLoader) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(document)"
        problem = getattr(exc, "problem", None) or str(exc)
        fix = "remove one of the two" if isinstance(exc, _DuplicateKey) else "fix the YAML syntax"
        raise ManifestInvalid(source, [ManifestError(where, f"malformed YAML: {problem}", fix)]) from None
    except RecursionError:
        # The YAML reader recurses once per level; a manifest needs a dozen.
        raise ManifestInvalid(source, [_TOO_DEEP]) from None


def _objects(docs: list[Any], source: str) -> list[tuple[Any, str]]:
    """Each object of the documents with where it stands, a list's (`kind: List`, or a typed list
    such as `kubectl get hs -o yaml` writes) items one by one, as kubectl applies them."""
    out = []
    for n, doc in enumerate(docs, 1):
        # Each document's number in the stream, when there are several, so an error says which.
        where = f"{source} (document {n})" if len(docs) > 1 else source
        kind = doc.get("kind") if isinstance(doc, dict) else None
        if isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list):
            out += [(item, f"{where} (item {i})") for i, item in enumerate(doc["items"])]
        else:
            out.append((doc, where))
    return out


def _not_applied(doc: Any, where: str) -> ManifestInvalid | None:
    """Why kubectl would refuse an object that is not a HybridServing, or None for another kind it
    applies (the fleet's neighbours in a GitOps bundle), which `validate` leaves to kubectl."""
    if not isinstance(doc, dict):
        return ManifestInvalid(where, [ManifestError(
            "(document)", "not an object: kubectl applies mappings with apiVersion and kind",
            "remove the document or write it as an object")])
    kind, api_version = doc.get("kind"), doc.get("apiVersion")
    if not isinstance(kind, str) or not kind:
        return ManifestInvalid(where, [ManifestError(
            "kind", "not set: kubectl refuses an object without it", f"set kind: {KIND}")])
    ours = isinstance(api_version, str) and api_version.split("/")[0] == GROUP
    if kind.lower() == KIND.lower() or (ours and kind not in (KIND, INSTANCE_KIND)):
        return ManifestInvalid(where, [ManifestError(
            "kind", f"{kind!r} is not a kind {GROUP} serves (kinds are case-sensitive)", f"set kind: {KIND}")])
    return None


def load_text(text: str, source: str = "<input>") -> list[HybridServing]:
    """Every HybridServing in a (multi-document) YAML text, a list's items included; other kinds
    are skipped, but a near miss (`kind: Hybridserving`, a kind hybridserving.io does not serve)
    or an object kubectl would refuse outright is an error, not a fleet silently left out."""
    found, failed = [], []
    first: dict[tuple[str, str], str] = {}  # (namespace, name) -> where that fleet is first
    for doc, where in _objects(yaml_documents(text, source), source):
        if isinstance(doc, dict) and doc.get("kind") == KIND:
            try:
                hs = parse_document(doc, where)
            except ManifestInvalid as exc:
                failed.append(exc)
                continue
            key = (hs.metadata.namespace or "", hs.metadata.name)
            if key in first:
                # kubectl apply would apply both, the last one winning: one of them is a mistake.
                failed.append(ManifestInvalid(where, [ManifestError(
                    "metadata.name", f"fleet {hs.metadata.name!r}"
                    + (f" in namespace {key[0]!r}" if key[0] else "")
                    + f" is already defined in {first[key]}: kubectl apply would keep only the last one",
                    "give each fleet its own name, or remove the copy")]))
                continue
            first[key] = where
            found.append(hs)
        elif (refused := _not_applied(doc, where)) is not None:
            failed.append(refused)
    if failed:
        raise ManifestInvalid(failed[0].source, failed[0].errors, tuple(failed[1:]))
    if not found:
        raise ManifestInvalid(
            source, [ManifestError("(document)", "no HybridServing object found", "check kind and apiVersion")]
        )
    return found


def load_file(path: str | Path) -> list[HybridServing]:
    """The fleets in file `path`; `-` is standard input, as for `kubectl apply -f -`."""
    source, text = read_text(path)
    return load_text(text, source)


def read_text(path: str | Path) -> tuple[str, str]:
    """(where it came from, the text) of file `path`, `-` being standard input; ManifestInvalid
    naming the file when it cannot be read or is not UTF-8."""
    source = "<stdin>" if str(path) == "-" else str(path)
    try:
        data = sys.stdin.buffer.read() if source == "<stdin>" else Path(path).read_bytes()
        text = data.decode("utf-8")
    except OSError as exc:
        raise ManifestInvalid(source, [ManifestError("(file)", exc.strerror or str(exc), "check the path")]) from None
    except UnicodeDecodeError as exc:
        raise ManifestInvalid(
            source,
            [ManifestError("(file)", f"not UTF-8 text: byte 0x{exc.object[exc.start]:02x} at offset {exc.start}",
                           "save the file as UTF-8")],
        ) from None
    return source, text
