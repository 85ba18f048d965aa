"""Drift: whether an observed object still says what the plan says, and the patch that restores it.

The apiserver and other controllers add fields to what the operator writes; those are not
drift. Only where an addition changes what an object selects or grants (selectors, the
router's pod-level privileges) is anything beyond the plan drift, and the patch removes it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# Fields where anything beyond what the plan sets is drift, not someone else's addition: a
# selector key widens or narrows what a Service, budget or policy applies to, and a pod-level
# privilege on the router (host namespaces, volumes, security context, its token) grants
# what the plan never did. Everything else tolerates fields the apiserver or others add.
_EXACT_PATHS: dict[str, tuple[tuple[str, ...], ...]] = {
    "Service": (("spec", "selector"),),
    "PodDisruptionBudget": (("spec", "selector"),),
    "NetworkPolicy": (("spec",),),
    # A role's documents go with the last pod that runs them (`rendering.running_documents`).
    "ConfigMap": (("data",),),
    "Deployment": (
        ("spec", "selector"),
        ("spec", "template", "metadata", "labels"),
        *(("spec", "template", "spec", key) for key in (
            "hostNetwork", "hostPID", "hostIPC", "shareProcessNamespace", "hostUsers", "securityContext",
            "volumes", "serviceAccountName", "automountServiceAccountToken", "initContainers",
            "ephemeralContainers", "nodeName",
        )),
    ),
}
# Container fields of the router where an addition is drift (the list itself is matched by
# position, so the containers must still be the planned ones).
_EXACT_CONTAINER_FIELDS = ("securityContext", "volumeMounts", "command", "args", "env", "envFrom")


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, Mapping) or key not in obj:
            return None
        obj = obj[key]
    return obj


def _same(observed: Any, desired: Any) -> bool:
    """Equality where absent, null and false are the same "nothing".

    Empty selectors are not nothing: `namespaceSelector: {}` selects every namespace.
    """
    if (observed is None or observed is False) and (desired is None or desired is False):
        return True
    if isinstance(desired, Mapping) and isinstance(observed, Mapping):
        keys = set(observed) | set(desired)
        return all(_same(observed.get(k), desired.get(k)) for k in keys)
    if isinstance(desired, list) and isinstance(observed, list):
        return len(observed) == len(desired) and all(_same(o, d) for o, d in zip(observed, desired, strict=True))
    return bool(observed == desired)


def extra_fields(observed: Mapping[str, Any], desired: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """Paths under the exact fields of `desired`'s kind whose observed value the plan does not set.

    Each path is either a key to remove (present on the object, absent from the plan) or an
    exact field whose value differs; `overlay_removals` turns them into a merge patch.
    """
    kind = desired.get("kind", "")
    found: list[tuple[str, ...]] = []
    for path in _EXACT_PATHS.get(kind, ()):
        have, want = _at(observed, path), _at(desired, path)
        if _same(have, want):
            continue
        if isinstance(have, Mapping) and isinstance(want, Mapping):
            found.extend(_mapping_extras(have, want, path) or [path])
        else:
            found.append(path)
    if kind == "Deployment":
        have_c = _at(observed, ("spec", "template", "spec", "containers")) or []
        want_c = _at(desired, ("spec", "template", "spec", "containers")) or []
        for have, want in zip(have_c, want_c, strict=False):
            if any(not _same(have.get(f), want.get(f)) for f in _EXACT_CONTAINER_FIELDS):
                found.append(("spec", "template", "spec", "containers"))
                break
    return found


def _mapping_extras(have: Mapping[str, Any], want: Mapping[str, Any], path: tuple[str, ...]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for key, value in have.items():
        if key not in want:
            if value is not None and value is not False:
                out.append((*path, key))
        elif isinstance(value, Mapping) and isinstance(want[key], Mapping):
            out.extend(_mapping_extras(value, want[key], (*path, key)))
        elif not _same(value, want[key]):
            out.append((*path, key))
    return out


def overlay_removals(desired: dict[str, Any], paths: list[tuple[str, ...]]) -> dict[str, Any]:
    """`desired` as a merge patch that also removes the drifted paths the plan does not set.

    A path the plan sets keeps the plan's value (lists are replaced whole by a merge patch);
    a path it leaves out becomes null, which deletes the key.
    """
    if not paths:
        return desired
    body: dict[str, Any] = json.loads(json.dumps(desired))
    for path in paths:
        if _at(desired, path) is not None:
            continue
        node = body
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = None
    return body


def contains(observed: Any, desired: Any) -> bool:
    """Whether every field the plan sets has the planned value in the observed object.

    Fields the apiserver defaults or other controllers add are ignored; lists must match
    element by element, so a removed port or container is drift.
    """
    if isinstance(desired, Mapping):
        if not isinstance(observed, Mapping):
            return False
        return all(k in observed and contains(observed[k], v) for k, v in desired.items())
    if isinstance(desired, list):
        if not isinstance(observed, list) or len(observed) != len(desired):
            return False
        return all(contains(o, d) for o, d in zip(observed, desired, strict=True))
    return bool(observed == desired)


def changes(before: Any, after: Any, path: str) -> list[str]:
    """Where `after` differs from `before`, leaf by leaf, in words (`path: old → new`,
    `path: new (new)`, `path removed`): what a person reads before a write goes out. A list
    that differs is one change, said whole."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        out = []
        for key in sorted(set(before) | set(after), key=str):
            at = f"{path}.{key}"
            if key not in after:
                out.append(f"{at} removed")
            elif key not in before:
                out.append(f"{at}: {short(after[key])} (new)")
            else:
                out += changes(before[key], after[key], at)
        return out
    return [] if before == after else [f"{path}: {short(before)} → {short(after)}"]


def short(value: Any, limit: int = 60) -> str:
    """A value on one line of at most `limit` characters."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), sort_keys=True)
    return text if len(text) <= limit else text[:limit - 1] + "…"
