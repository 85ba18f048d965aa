"""Dict patches as the tests write them: specs as a base plus the part that differs, and the
apiserver's JSON merge patch for fakes that stand in for it in unit tests.
"""

from __future__ import annotations

import copy
from typing import Any


def overlaid(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A copy of `base` with `patch` laid over it, nested dicts merged; an explicit None stays
    (a test may mean `profile: null`), unlike in a merge patch."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = overlaid(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def apply_merge_patch(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386 JSON merge patch, in place, as the apiserver applies a merge-patch body."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            apply_merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
