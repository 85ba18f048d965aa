"""Both Dockerfiles linted by the real hadolint (installed by tools/lint-tools.sh).

The image definitions' other checks, which need no tool, are in tests/unit/test_images.py.
"""

from __future__ import annotations

import pathlib
import subprocess

import pytest

from hybridserving.devcluster import bin_dir

ROOT = pathlib.Path(__file__).resolve().parents[2]
OPERATOR = ROOT / "Dockerfile"
ENGINE = ROOT / "images" / "engine" / "Dockerfile"


@pytest.mark.parametrize("dockerfile", [OPERATOR, ENGINE], ids=["operator", "engine"])
def test_hadolint_passes(dockerfile: pathlib.Path) -> None:
    hadolint = bin_dir() / "hadolint"
    if not hadolint.exists():
        pytest.fail(f"{hadolint} is missing: install it with `bash tools/lint-tools.sh`", pytrace=False)
    proc = subprocess.run([str(hadolint), "--no-color", "--failure-threshold", "info", str(dockerfile)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_has_real_rules() -> None:
    """The linter must find something in a bad Dockerfile, or passing above would mean nothing."""
    hadolint = bin_dir() / "hadolint"
    if not hadolint.exists():
        pytest.fail(f"{hadolint} is missing: install it with `bash tools/lint-tools.sh`", pytrace=False)
    bad = "FROM python:latest\nRUN pip install requests\nUSER root\n"
    proc = subprocess.run([str(hadolint), "--no-color", "-"], input=bad, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    for rule in ("DL3007", "DL3013", "DL3042", "DL3002"):
        assert rule in proc.stdout, proc.stdout
