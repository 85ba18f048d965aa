"""The Helm chart rendered by the real `helm` binary (built by tools/build-tools.sh), without a cluster."""

from __future__ import annotations

import pathlib
import subprocess
from collections.abc import Iterable
from typing import Any

import pytest
import yaml

from hybridserving.devcluster import bin_dir, read_versions

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "hybridserving"
RELEASE = "hs"
RELEASE_NS = "hs-system"


def helm_binary() -> pathlib.Path:
    helm = bin_dir() / "helm"
    if not helm.exists():
        pytest.fail(f"{helm} is missing: build it with `bash tools/build-tools.sh` (or `make tools`)", pytrace=False)
    return helm


def kube_version() -> str:
    """The Kubernetes version the tools are built for, so templates see the same Capabilities."""
    return str(read_versions()["K8S_VERSION"]).lstrip("v")


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm_binary()), *args], capture_output=True, text=True, timeout=60)


def template_args(sets: Iterable[str]) -> list[str]:
    args = ["template", RELEASE, str(CHART), "--namespace", RELEASE_NS, "--kube-version", kube_version()]
    for s in sets:
        args += ["--set", s]
    return args


def render(*sets: str) -> list[dict[str, Any]]:
    proc = helm(*template_args(sets))
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def render_error(*sets: str) -> str:
    proc = helm(*template_args(sets))
    assert proc.returncode != 0, f"helm template accepted {sets}"
    return str(proc.stderr)


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def the(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = of_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = the(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return dict(container)
