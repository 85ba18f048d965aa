"""tools/build-tools.sh on a cache that already holds every tool: what it links and what it clears,
without building anything (the binaries here are empty stand-ins)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "build-tools.sh"
STAGES = ("node-initialize", "node-heartbeat-with-lease", "pod-ready", "pod-complete", "pod-delete")
MONITORING_CRDS = ("podmonitors", "servicemonitors", "prometheusrules")


def versions() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (REPO / "tools" / "versions.env").read_text().splitlines())
    return {key: value for key, value in (p for p in pairs if len(p) == 2) if not key.startswith("#")}


def populate(cache: Path) -> None:
    """Every file the script's presence check looks for, as the build leaves them."""
    v = versions()
    tools = cache / "tools"
    executables = [tools / f"k8s-{v['K8S_VERSION']}" / b
                   for b in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")]
    executables += [tools / f"etcd-{v['ETCD_VERSION']}" / "etcd", tools / f"kwok-{v['KWOK_VERSION']}" / "kwok",
                    tools / f"helm-{v['HELM_VERSION']}" / "helm",
                    tools / f"promtool-{v['PROMETHEUS_VERSION']}" / "promtool"]
    for path in executables:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    stages = tools / f"kwok-{v['KWOK_VERSION']}" / "stages"
    stages.mkdir(parents=True)
    for stage in STAGES:
        (stages / f"{stage}.yaml").write_text("kind: Stage\n")
    crds = tools / f"prometheus-operator-crds-{v['PROMETHEUS_OPERATOR_VERSION']}"
    crds.mkdir(parents=True)
    for crd in MONITORING_CRDS:
        (crds / f"monitoring.coreos.com_{crd}.yaml").write_text("kind: CustomResourceDefinition\n")


def run(cwd: Path, cache: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HYBRIDSERVING_CACHE": cache}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.mark.parametrize("args", [(), ("--check",)])
def test_a_relative_cache_gets_links_that_resolve(tmp_path: Path, args: tuple[str, ...]) -> None:
    """A link holding the relative path would point below bin/ itself, nowhere."""
    populate(tmp_path / "cache")
    result = run(tmp_path, "cache", *args)
    assert result.returncode == 0, result.stderr
    links = sorted((tmp_path / "cache" / "bin").iterdir())
    assert [link.name for link in links] == sorted(
        ["etcd", "helm", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok",
         "promtool"])
    dangling = [link.name for link in links if not link.exists()]
    assert dangling == []


def test_an_interrupted_build_leaves_no_temporary_folder(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    populate(cache)
    leftover = cache / "tools" / "k8s-v0.0.0.tmp.12345"
    (leftover / "bin").mkdir(parents=True)
    (leftover / "bin" / "partial").write_bytes(b"\0" * 1024)
    result = run(tmp_path, str(cache))
    assert result.returncode == 0, result.stderr
    assert "all tools present" in result.stdout
    assert not leftover.exists()
