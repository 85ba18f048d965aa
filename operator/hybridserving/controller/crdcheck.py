"""Says so when the installed CRDs are not the ones this operator was built with.

At start-up and every `CHECK_SECONDS` the installed CRDs are read (a LIST by name: the operator's
ClusterRole grants `list, watch` on CRDs and nothing more) and judged by `core.crdschema`. A CRD
that is not current is logged at ERROR once per distinct finding, with the fix, and
`hybridserving_crd_schema_current` is 0 for it (the HybridServingCRDSchemaOutdated alert). A read
that fails changes nothing and is retried the next period: an outage or a missing permission is
not an outdated schema. Fleets and their conditions are never touched.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from hybridserving.api.crd import expected_digests
from hybridserving.controller import metrics
from hybridserving.controller.kube import Kube, KubeError
from hybridserving.core import crdschema

log = logging.getLogger("hybridserving.controller.crdcheck")

KIND = "CustomResourceDefinition"
CHECK_SECONDS = 600.0
EXPECTED = expected_digests()
"""This build's digests, by CRD name (package data generated with the CRDs)."""


class SchemaCheck:
    """Reads the installed CRDs, sets the gauge and logs what changed since the last reading."""

    def __init__(self, kube: Kube, expected: Mapping[str, str]) -> None:
        self.kube = kube
        self.expected = dict(expected)
        self._last: dict[str, crdschema.Finding] = {}

    def once(self) -> list[crdschema.Finding] | None:
        """The findings, or None when the CRDs could not be read. Blocking: run it on a thread."""
        try:
            installed = [obj for name in self.expected for obj in self.kube.list_cluster_named(KIND, name)]
        except KubeError as exc:
            log.warning("could not read the installed CRDs to compare their schema digests (%s); "
                        "the next check tries again", exc)
            return None
        findings = crdschema.assess(installed, self.expected)
        for finding in findings:
            metrics.CRD_SCHEMA_CURRENT.labels(finding.crd).set(1 if finding.current else 0)
            if finding == self._last.get(finding.crd):
                continue
            if isinstance(finding, crdschema.Current):
                if finding.crd in self._last:
                    log.info("CRD %s now has the schema digest this operator was built with", finding.crd)
            else:
                log.error("%s", finding.describe())
            self._last[finding.crd] = finding
        return findings


async def run(kube: Kube, interval: float = CHECK_SECONDS) -> None:
    """Check now and then every `interval` seconds, each reading on a thread."""
    check = SchemaCheck(kube, EXPECTED)
    while True:
        try:
            await asyncio.to_thread(check.once)
        except Exception:  # noqa: BLE001 - a check that fails must not end the checks after it
            log.exception("the CRD schema check failed; the next check tries again")
        await asyncio.sleep(interval)
