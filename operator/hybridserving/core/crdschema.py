"""Whether the CRDs the apiserver holds are the ones this operator was built with.

Helm installs a chart's `crds/` on the first install only, so a `helm upgrade` without the
server-side apply of docs/install.md leaves the old schema in place: the apiserver then prunes
the fields the new operator writes and lacks its new CEL rules, and nothing fails. Every
generated CRD carries the digest of its spec (`api.crd.ANNOTATION_SCHEMA_DIGEST`); the digest on
the installed CRD is compared with the one of this build. The installed spec itself is not
hashed: the apiserver adds defaults of its own to it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from hybridserving.api.crd import ANNOTATION_SCHEMA_DIGEST

FIX = ("kubectl apply --server-side --force-conflicts --field-manager=hybridserving-crds "
       "-f charts/hybridserving/crds/")
"""The upgrade step of docs/install.md that installs the chart's CRDs (then `helm upgrade`)."""
_CONSEQUENCE = ("the apiserver prunes the fields this operator writes that the installed schema lacks. "
                f"Apply the chart's CRDs: {FIX}")


@dataclass(frozen=True)
class Current:
    """The installed CRD carries this build's digest."""

    crd: str
    digest: str

    current: ClassVar[bool] = True


@dataclass(frozen=True)
class Differs:
    """The installed CRD is another release's: older when the upgrade step was skipped, newer
    while an older operator still runs."""

    crd: str
    installed: str
    expected: str

    current: ClassVar[bool] = False

    def describe(self) -> str:
        return (f"CRD {self.crd} has schema digest {self.installed}, this operator was built with {self.expected}: "
                f"{_CONSEQUENCE}")


@dataclass(frozen=True)
class Unstamped:
    """The installed CRD has no digest: it comes from a release before CRDs were stamped."""

    crd: str
    expected: str

    current: ClassVar[bool] = False

    def describe(self) -> str:
        return (f"CRD {self.crd} carries no schema digest (installed by an earlier release), this operator was "
                f"built with {self.expected}: {_CONSEQUENCE}")


@dataclass(frozen=True)
class Missing:
    """No CRD of this name is installed."""

    crd: str
    expected: str

    current: ClassVar[bool] = False

    def describe(self) -> str:
        return f"CRD {self.crd} is not installed (this operator was built with {self.expected}). Apply: {FIX}"


Outdated = Differs | Unstamped | Missing
Finding = Current | Outdated


def assess(installed: Iterable[Mapping[str, Any]], expected: Mapping[str, str]) -> list[Finding]:
    """One finding per CRD of `expected` (CRD name to this build's digest), in its order, from the
    CRD objects the apiserver holds; CRDs not in `expected` are ignored."""
    held = {obj["metadata"]["name"]: obj for obj in installed}
    findings: list[Finding] = []
    for name, digest in expected.items():
        obj = held.get(name)
        if obj is None:
            findings.append(Missing(name, digest))
            continue
        stamp = (obj["metadata"].get("annotations") or {}).get(ANNOTATION_SCHEMA_DIGEST)
        if stamp is None:
            findings.append(Unstamped(name, digest))
        elif stamp != digest:
            findings.append(Differs(name, stamp, digest))
        else:
            findings.append(Current(name, digest))
    return findings
