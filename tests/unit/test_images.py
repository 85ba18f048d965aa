"""The operator and engine image definitions, checked without a container engine.

No image is built here, so two things stand in for a build: hadolint (the real linter, installed
by tools/lint-tools.sh) over both Dockerfiles (tests/tooling/test_hadolint.py), and the checks here
that each image installs this project with the same extras the test suite installs (`test` pulls
`hybridserving[operator,engine]`), so what the tests exercised is what the images ship.
"""

from __future__ import annotations

import pathlib
import re
import shlex
import tomllib

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parents[2]
OPERATOR = ROOT / "Dockerfile"
ENGINE = ROOT / "images" / "engine" / "Dockerfile"
ENGINE_README = ENGINE.parent / "README.md"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def instructions(dockerfile: pathlib.Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    return [(ins.upper(), rest.strip()) for ins, _, rest in (ln.partition(" ") for ln in lines)]


def stages(dockerfile: pathlib.Path) -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for ins, rest in instructions(dockerfile):
        if ins == "FROM":
            out.append([])
        if out:
            out[-1].append((ins, rest))
    return out


def build_args(dockerfile: pathlib.Path) -> dict[str, str]:
    return dict(rest.split("=", 1) for ins, rest in instructions(dockerfile) if ins == "ARG" and "=" in rest)


def expand(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), text)


def pip_requirements(dockerfile: pathlib.Path) -> list[str]:
    """Every requirement passed to `pip install` in any RUN, build args expanded."""
    args = build_args(dockerfile)
    reqs: list[str] = []
    for ins, rest in instructions(dockerfile):
        if ins != "RUN":
            continue
        for command in re.split(r"&&|;", rest):
            words = shlex.split(expand(command, args))
            is_pip = "pip" in words or any(w.endswith("/pip") for w in words[:1])
            if is_pip and "install" in words:
                reqs += [w for w in words[words.index("install") + 1:] if not w.startswith("-")]
    return reqs


def project_extras(reqs: list[str]) -> set[str]:
    """Extras of this project a list of pip arguments installs (`./[operator]`)."""
    extras: set[str] = set()
    for r in reqs:
        m = re.fullmatch(r"\./?\[([\w,-]+)\]", r)
        if m:
            extras |= set(m.group(1).split(","))
    return extras


def extras_pulled_by_tests() -> set[str]:
    return set().union(*(Requirement(r).extras for r in PROJECT["optional-dependencies"]["test"]
                         if Requirement(r).name == PROJECT["name"]))


# ------------------------------------------------------------------------------- operator image


def test_operator_image_is_multi_stage_non_root_and_pinned() -> None:
    build, final = stages(OPERATOR)
    args = build_args(OPERATOR)
    base = expand(dict(final)["FROM"], args)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", base), base
    assert Version(base.split(":")[1].split("-")[0]) in SpecifierSet(PROJECT["requires-python"])
    final_ins = [ins for ins, _ in final]
    # The final stage only copies the built environment: no pip, no compiler, no apt.
    assert "RUN" not in final_ins
    assert ("COPY", "--from=build /opt/hybridserving /opt/hybridserving") in final
    assert [rest for ins, rest in final if ins == "USER"] == ["65532:65532"]
    assert dict(final)["ENTRYPOINT"] == '["python", "-m", "hybridserving.controller"]'


def test_operator_image_installs_the_operator_extra() -> None:
    extras = project_extras(pip_requirements(OPERATOR))
    assert extras == {"operator"}
    assert extras <= extras_pulled_by_tests()
    assert extras <= set(PROJECT["optional-dependencies"])


def test_operator_entrypoint_module_exists() -> None:
    main = ROOT / "operator" / "hybridserving" / "controller" / "__main__.py"
    assert main.exists(), "the image runs `python -m hybridserving.controller`"


# --------------------------------------------------------------------------------- engine image


def test_engine_image_pins_sglang_and_the_transfer_engines() -> None:
    (stage,) = stages(ENGINE)
    base = dict(stage)["FROM"]
    # The sglang 0.5.23 wheel requires CUDA 13 builds (flashinfer_python[cu13], cuda-python>=13):
    # a CUDA 12 base or transfer engine would not load beside it.
    assert re.fullmatch(r"lmsysorg/sglang:v0\.5\.23-cu13\d(@sha256:[0-9a-f]{64})?", base), base
    pinned = {Requirement(r).name: str(Requirement(r).specifier)
              for r in pip_requirements(ENGINE) if not r.startswith(".")}
    assert pinned == {"mooncake-transfer-engine-cuda13": "==0.3.14", "nixl": "==1.5.1"}


def test_the_engine_images_pages_name_its_base_and_pins() -> None:
    """The README and docs/install.md are where a platform team reads which CUDA its GPU nodes'
    driver must carry and which wheels to mirror: a base or pin changed in the Dockerfile alone
    would send them to the wrong ones."""
    (stage,) = stages(ENGINE)
    base = dict(stage)["FROM"]
    for page in (ENGINE_README, ROOT / "docs" / "install.md"):
        assert set(re.findall(r"lmsysorg/sglang:[\w.@:-]+", page.read_text())) == {base}, page
    readme = ENGINE_README.read_text()
    pins = {r for r in pip_requirements(ENGINE) if not r.startswith(".")}
    assert set(re.findall(r"`([\w.-]+==[^`\s]+)`", readme)) == pins
    # The CUDA the README gives next to the base is the tag's (cu130: 13, or 13.0).
    tag = re.fullmatch(r".*-cu(\d+)(\d)(@sha256:[0-9a-f]{64})?", base)
    said = re.search(rf"`{re.escape(base)}`, CUDA (\d+)(?:\.(\d+))?", readme)
    assert tag and said, "the README gives the base image's CUDA version next to it"
    assert said.group(1) == tag.group(1) and said.group(2) in (None, tag.group(2))


def test_engine_image_installs_the_engine_extra_and_runs_the_launcher() -> None:
    extras = project_extras(pip_requirements(ENGINE))
    assert extras == {"engine"}
    assert extras <= extras_pulled_by_tests()
    (stage,) = stages(ENGINE)
    assert dict(stage)["ENTRYPOINT"] == '["hybridserving-engine"]'
    assert "hybridserving-engine" in PROJECT["scripts"]


# ----------------------------------------------------------------------------------- build context


def test_dockerignore_admits_only_what_pip_needs() -> None:
    rules = [ln for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln and not ln.startswith("#")]
    assert rules[0] == "**"
    admitted = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    copied = set()
    for dockerfile in (OPERATOR, ENGINE):
        for ins, rest in instructions(dockerfile):
            if ins == "COPY" and not rest.startswith("--from"):
                copied |= {w.rstrip("/") for w in shlex.split(rest)[:-1]}
    assert copied == admitted


def test_default_engine_image_is_the_one_with_the_launcher() -> None:
    """Pods run `hybridserving-engine`; SGLang's own image lacks it, so the default must be ours."""
    from hybridserving.api.v1alpha1 import DEFAULT_ENGINE_IMAGE, EngineSpec

    assert EngineSpec().image is None, "unset: the operator's default (the chart's engineImage value)"
    default = DEFAULT_ENGINE_IMAGE
    assert not default.startswith("lmsysorg/")
    assert f"-t {default} ." in ENGINE.read_text()
    values = yaml.safe_load((ROOT / "charts" / "hybridserving" / "values.yaml").read_text())
    assert f"{values['engineImage']['repository']}:{values['engineImage']['tag']}" == default, (
        "the chart pins the same engine image as the release")
