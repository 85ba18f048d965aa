"""The validating admission webhook, served by the operator (kopf's admission server).

CEL in the CRD refuses what one field or a few neighbours can show; the layout rules,
capacity, privileges and the pod surface need the operator's own code. The webhook judges a
spec by the reconcile's own `validate` (`core.fleet.check`: layout rules, pod surface, weights,
capacity, and the chart's engine privileges), so it refuses exactly the specs the operator would
not follow, at `kubectl apply`, with the field paths and fixes of `hybridserving validate`, and
warnings come back as admission warnings, with, on an update, what the step from the old spec
does that the new one does not show (`core.consequences`: an edit that restarts every engine, a
field the edit leaves to the value the scaler wrote).

Failure policy, per operation (set in the chart's configuration):

* CREATE fails closed: while the webhook is down no new fleet is admitted unchecked.
* UPDATE fails open: an outage never blocks an edit (scale-down in an incident, a rollback),
  and an update the webhook could not see is still checked by the reconcile, which keeps the
  fleet on its last valid spec and says so in LayoutValid.
* DELETE is never sent to the webhook, and updates that do not change the spec (labels,
  finalizers during deletion) or that belong to an object being deleted are always allowed.
* Only the main resource is matched: status writes never depend on the webhook.

The ValidatingWebhookConfiguration and the serving certificate belong to the Helm release
(charts/hybridserving/templates/webhook.yaml), not to the operator: they stay while the operator
is stopped (an upgrade, a drain), so creates stay refused rather than admitted unchecked until it
is back, and they go with `helm uninstall` or `webhook.enabled=false`, so no configuration is left
refusing creates with nothing behind it. The configuration reaches the operator through its
Service (never a URL: the apiserver often cannot resolve cluster DNS). The operator only serves:
kopf's managed mode stays off, because it would write a configuration of its own (and an empty
MutatingWebhookConfiguration besides) and need cluster-wide write access to both kinds.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf
from pydantic import ValidationError

from hybridserving.api.base import FROM_CLUSTER
from hybridserving.api.v1alpha1 import GROUP, PLURAL, VERSION, HybridServingSpec
from hybridserving.controller import handlers
from hybridserving.core import consequences
from hybridserving.controller.reconcile import validate

log = logging.getLogger("hybridserving.admission")


def configure(settings: kopf.OperatorSettings, *, addr: str, port: int, certfile: str, keyfile: str) -> None:
    """Serve the webhook with the release's certificate; kopf reloads it when the files change.

    The configuration calls each handler at the path of its id (`/create`, `/update`), which is
    where kopf's server routes it.
    """
    settings.admission.server = kopf.WebhookServer(addr=addr, port=port, certfile=certfile, pkeyfile=keyfile)


def review(body: dict[str, Any], old: dict[str, Any] | None, operation: str, warnings: list[str]) -> None:
    """Refuse an invalid spec naming every field and fix; report warnings. Raises kopf.AdmissionError."""
    if operation == "UPDATE":
        if (body.get("metadata") or {}).get("deletionTimestamp"):
            return
        if old is not None and (old.get("spec") or {}) == (body.get("spec") or {}):
            return
    hs, validation = validate(dict(body), handlers.OPTIONS.engine_policy)
    if validation.parse_errors:
        raise kopf.AdmissionError(validation.message(), code=422)
    warnings.extend(f"{i.path}: {i.message}. Fix: {i.fix}" for i in validation.issues if i.severity != "error")
    if hs is not None and old is not None:
        try:
            before = HybridServingSpec.model_validate(old.get("spec") or {}, context=FROM_CLUSTER)
        except ValidationError:
            before = None  # a spec an older version admitted: nothing to compare with
        if before is not None:
            warnings.extend(f"{c.path}: {c.message}. Fix: {c.fix}" for c in consequences.of_update(before, hs.spec))
    if validation.errors:
        raise kopf.AdmissionError(
            "; ".join(f"{i.path}: {i.message}. Fix: {i.fix}" for i in validation.errors)[:8000], code=422)


@kopf.on.validate(GROUP, VERSION, PLURAL, id="create", operations=["CREATE"])
def check_create(body: kopf.Body, warnings: list[str], **_: Any) -> None:
    review(dict(body), None, "CREATE", warnings)


@kopf.on.validate(GROUP, VERSION, PLURAL, id="update", operations=["UPDATE"])
def check_update(body: kopf.Body, warnings: list[str], old: kopf.BodyEssence | None = None, **_: Any) -> None:
    review(dict(body), dict(old) if old else None, "UPDATE", warnings)
