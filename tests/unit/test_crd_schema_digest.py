"""The schema digest stamped on every CRD, the judgement of the installed CRDs against it, and the
operator's periodic check: its gauge, its log lines, and a failed read that changes nothing."""

from __future__ import annotations

import asyncio
import copy
import logging
import pathlib
import re
from typing import Any

import kopf
import pytest
import yaml
from prometheus_client import REGISTRY

from hybridserving.api import crd as crdgen
from hybridserving.controller import crdcheck, handlers
from hybridserving.controller.kube import Kube, KubeError, Objects
from hybridserving.core import crdschema
from hybridserving.core.crdschema import Current, Differs, Missing, Unstamped

REPO = pathlib.Path(__file__).resolve().parents[2]
FLEETS = "hybridservings.hybridserving.io"
INSTANCES = "hybridservinginstances.hybridserving.io"
KEY = crdgen.ANNOTATION_SCHEMA_DIGEST


def rendered(name: str) -> dict[str, Any]:
    (crd,) = [c for c in crdgen.render_all().values() if c["metadata"]["name"] == name]
    return crd


# ------------------------------------------------------------------------------------------ digest


def test_the_digest_ignores_key_order_and_follows_every_value() -> None:
    spec = rendered(FLEETS)["spec"]
    reordered = dict(reversed(list(spec.items())))
    assert crdgen.schema_digest(reordered) == crdgen.schema_digest(spec)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", crdgen.schema_digest(spec))
    dropped = copy.deepcopy(spec)
    del dropped["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["router"]
    assert crdgen.schema_digest(dropped) != crdgen.schema_digest(spec)
    renamed = copy.deepcopy(spec)
    renamed["versions"][0]["additionalPrinterColumns"][0]["description"] += "."
    assert crdgen.schema_digest(renamed) != crdgen.schema_digest(spec)


def test_the_package_ships_the_digests_the_models_render() -> None:
    """The operator reads them from its package, as generated with the CRD files."""
    assert crdgen.render_digests() == crdgen.render_digests()
    assert set(crdgen.render_digests()) == {FLEETS, INSTANCES}
    assert crdcheck.EXPECTED == crdgen.expected_digests() == crdgen.render_digests()


def test_check_names_stale_package_digests(tmp_path: pathlib.Path) -> None:
    stale = tmp_path / crdgen.DIGESTS_FILE
    stale.write_text(crdgen.dump_digests({FLEETS: "sha256:old", INSTANCES: "sha256:old"}))
    dirs = [tmp_path / "a"]
    crdgen.write_all(dirs, stale)
    assert crdgen.check_all(dirs, stale) == []
    assert crdgen.expected_digests() == crdgen.render_digests()  # the package's own file is untouched
    stale.write_text(crdgen.dump_digests({FLEETS: "sha256:old"}))
    assert crdgen.check_all(dirs, stale) == [stale]


@pytest.mark.parametrize("folder", crdgen.CRD_DIRS)
def test_every_committed_crd_carries_the_digest_of_its_own_spec(folder: str) -> None:
    files = sorted((REPO / folder).glob("*.yaml"))
    assert len(files) == 2
    for path in files:
        crd = yaml.safe_load(path.read_text())
        assert crd["metadata"]["annotations"][KEY] == crdgen.schema_digest(crd["spec"]), path
        assert crd["metadata"]["annotations"][KEY] == crdgen.expected_digests()[crd["metadata"]["name"]]


# -------------------------------------------------------------------------------------- judgement


def installed(name: str, digest: str | None) -> dict[str, Any]:
    """A CRD as the apiserver returns it: its own metadata and defaults beside the stamp."""
    crd = copy.deepcopy(rendered(name if name in (FLEETS, INSTANCES) else FLEETS))
    crd["metadata"] = {"name": name, "uid": "u", "resourceVersion": "7",
                       "annotations": {"other": "x", **({KEY: digest} if digest else {})}}
    crd["spec"]["conversion"] = {"strategy": "None"}
    return crd


EXPECTED = {FLEETS: "sha256:new-fleet", INSTANCES: "sha256:new-instance"}


def test_each_crd_is_current_differs_unstamped_or_missing() -> None:
    findings = crdschema.assess([installed(FLEETS, "sha256:old"), installed(INSTANCES, "sha256:new-instance"),
                                 installed("other.example.io", None)], EXPECTED)
    assert findings == [Differs(FLEETS, "sha256:old", "sha256:new-fleet"), Current(INSTANCES, "sha256:new-instance")]
    assert [f.current for f in findings] == [False, True]
    assert crdschema.assess([installed(INSTANCES, None)], EXPECTED) == [
        Missing(FLEETS, "sha256:new-fleet"), Unstamped(INSTANCES, "sha256:new-instance")]
    unannotated = installed(FLEETS, None)
    del unannotated["metadata"]["annotations"]
    assert crdschema.assess([unannotated], {FLEETS: "sha256:x"}) == [Unstamped(FLEETS, "sha256:x")]


def test_the_committed_crds_as_installed_are_current() -> None:
    """The apiserver's own additions to the spec do not count: only the stamp is compared."""
    digests = crdgen.expected_digests()
    assert crdschema.assess([installed(n, d) for n, d in digests.items()], digests) == [
        Current(n, d) for n, d in digests.items()]


def test_every_outdated_finding_names_the_crd_the_digests_and_the_fix() -> None:
    for finding in (Differs(FLEETS, "sha256:old", "sha256:new"), Unstamped(FLEETS, "sha256:new"),
                    Missing(FLEETS, "sha256:new")):
        text = finding.describe()
        assert FLEETS in text and "sha256:new" in text and text.endswith(crdschema.FIX)
    assert "sha256:old" in Differs(FLEETS, "sha256:old", "sha256:new").describe()


def test_the_fix_is_the_upgrade_step_of_the_install_guide() -> None:
    guide = (REPO / "docs" / "install.md").read_text()
    commands = [" ".join(block.replace("\\\n", " ").split()) for block in re.findall(r"```bash\n(.*?)```", guide, re.S)]
    assert any(crdschema.FIX in command for command in commands)


# ------------------------------------------------------------------------------------ the check


class CrdKube(Kube):
    """The apiserver's CRDs, held in memory; `fail` makes every read fail with that error."""

    def __init__(self, crds: list[dict[str, Any]]) -> None:
        super().__init__(None, "crd")  # type: ignore[arg-type]
        self.crds = crds
        self.fail: KubeError | None = None

    def sibling(self, component: str) -> Kube:
        return self

    def list_cluster_named(self, kind: str, name: str) -> Objects:
        assert kind == "CustomResourceDefinition"
        self._count_read("list", kind)
        if self.fail is not None:
            raise self.fail
        return [copy.deepcopy(c) for c in self.crds if c["metadata"]["name"] == name]


def gauge(crd: str) -> float | None:
    return REGISTRY.get_sample_value("hybridserving_crd_schema_current", {"crd": crd})


def test_the_check_sets_the_gauge_logs_each_finding_once_and_survives_failed_reads(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "hybridserving.controller.crdcheck")
    kube = CrdKube([installed(FLEETS, "sha256:new-fleet"), installed(INSTANCES, "sha256:new-instance")])
    check = crdcheck.SchemaCheck(kube, EXPECTED)
    assert check.once() == [Current(FLEETS, "sha256:new-fleet"), Current(INSTANCES, "sha256:new-instance")]
    assert gauge(FLEETS) == gauge(INSTANCES) == 1
    assert caplog.records == []

    kube.crds[0] = installed(FLEETS, "sha256:old")
    for _ in range(3):
        check.once()
    assert gauge(FLEETS) == 0 and gauge(INSTANCES) == 1
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert error.getMessage() == Differs(FLEETS, "sha256:old", "sha256:new-fleet").describe()

    # An outage or a missing permission is not an outdated schema: nothing changes, a warning says so.
    caplog.clear()
    kube.crds[0] = installed(FLEETS, "sha256:new-fleet")
    kube.fail = KubeError(403, "customresourcedefinitions is forbidden")
    assert check.once() is None
    assert gauge(FLEETS) == 0 and gauge(INSTANCES) == 1
    (warning,) = caplog.records
    assert warning.levelno == logging.WARNING and "403" in warning.getMessage()

    caplog.clear()
    kube.fail = None
    check.once()
    assert gauge(FLEETS) == 1
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, f"CRD {FLEETS} now has the schema digest this operator was built with")]

    # The same finding again, after the CRD was current in between, is logged again.
    caplog.clear()
    kube.crds = [installed(INSTANCES, "sha256:new-instance")]
    check.once()
    check.once()
    assert gauge(FLEETS) == 0
    assert [r.getMessage() for r in caplog.records] == [Missing(FLEETS, "sha256:new-fleet").describe()]


def test_a_failed_first_read_sets_no_gauge() -> None:
    kube = CrdKube([])
    kube.fail = KubeError(0, "ConnectionRefusedError")
    assert crdcheck.SchemaCheck(kube, {"never.read.example.io": "sha256:x"}).once() is None
    assert gauge("never.read.example.io") is None


def test_the_check_reads_each_crd_by_name_with_a_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """A LIST with a field selector on the cluster-scoped path: the ClusterRole grants list, not get."""
    calls: list[tuple[str, str, dict[str, str] | None]] = []

    def call(self: Kube, method: str, path: str, *, query: dict[str, str] | None = None, **_: Any) -> dict[str, Any]:
        calls.append((method, path, query))
        return {"items": []}

    monkeypatch.setattr(Kube, "_call", call)
    assert crdcheck.SchemaCheck(Kube(None, "crd"), EXPECTED).once() == [  # type: ignore[arg-type]
        Missing(FLEETS, "sha256:new-fleet"), Missing(INSTANCES, "sha256:new-instance")]
    assert calls == [
        ("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", {"fieldSelector": f"metadata.name={n}"})
        for n in (FLEETS, INSTANCES)]


def test_the_operator_checks_at_start_and_then_every_period(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = CrdKube([installed(FLEETS, "sha256:old"), installed(INSTANCES, crdcheck.EXPECTED[INSTANCES])])
    monkeypatch.setattr(handlers, "OPTIONS", handlers.Options(kube=kube, crd_check_seconds=0.05))

    async def scenario() -> None:
        await handlers.start(settings=kopf.OperatorSettings())
        try:
            for _ in range(200):
                if kube.reads[("list", "CustomResourceDefinition")] >= 6:  # three checks of two CRDs
                    break
                await asyncio.sleep(0.01)
        finally:
            await handlers.stop()
        assert kube.reads[("list", "CustomResourceDefinition")] >= 6
        assert gauge(FLEETS) == 0 and gauge(INSTANCES) == 1

    asyncio.run(scenario())
