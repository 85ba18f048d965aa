"""The validating admission webhook, served by the operator (kopf's admission server).

CEL in the CRD refuses what one field or a few neighbours can show; the layout rules,
capacity, privileges and the pod surface need the operator's own code. The webhook runs
the checks of `hybridserving validate` (`core.fleet.assess`: layout rules, pod surface, weights,
capacity) and the chart's engine privileges, so a bad spec is refused at `kubectl apply` with
the same field paths and fixes, and warnings come back as admission warnings.

Failure policy, per operation:

* CREATE fails closed: while the webhook is down no new fleet is admitted unchecked.
* UPDATE fails open: an outage never blocks an edit (scale-down in an incident, a rollback),
  and an update the webhook could not see is still checked by the reconcile, which keeps the
  fleet on its last valid spec and says so in LayoutValid.
* DELETE is never sent to the webhook, and updates that do not change the spec (labels,
  finalizers during deletion) or that belong to an object being deleted are always allowed.
* Only the main resource is matched: status writes never depend on the webhook.
* Both webhooks are persistent: an operator that stops (an upgrade, a drain) leaves them in
  the configuration, so creates stay refused rather than admitted unchecked until it is back.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import pathlib
import tempfile
from typing import Any

import kopf
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from hybridserving.api.v1alpha1 import GROUP, PLURAL, VERSION
from hybridserving.controller import handlers
from hybridserving.controller.reconcile import validate
from hybridserving.core import fleet, privileges

log = logging.getLogger("hybridserving.admission")

# The ValidatingWebhookConfiguration kopf keeps up to date (its webhooks and caBundle).
CONFIGURATION_NAME = "hybridserving.io"


def self_signed(host: str, directory: pathlib.Path, days: int = 365) -> tuple[pathlib.Path, pathlib.Path]:
    """A serving certificate for `host` (DNS name or IP) that is its own CA: (certfile, keyfile)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    try:
        san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        san = x509.DNSName(host)
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([san]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    certfile, keyfile = directory / "tls.crt", directory / "tls.key"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    keyfile.chmod(0o600)
    return certfile, keyfile


def configure(settings: kopf.OperatorSettings, *, addr: str, port: int, host: str,
              certfile: str | None = None, keyfile: str | None = None) -> None:
    """Serve the webhook and keep the cluster's configuration pointing at it.

    Without a certificate (cert-manager or the platform's), one is made for `host` at start;
    kopf writes it into the configuration's caBundle.
    """
    if certfile is None or keyfile is None:
        made = self_signed(host, pathlib.Path(tempfile.mkdtemp(prefix="hybridserving-webhook-")))
        certfile, keyfile = str(made[0]), str(made[1])
    settings.admission.server = kopf.WebhookServer(addr=addr, port=port, host=host, certfile=certfile,
                                                   pkeyfile=keyfile, cafile=certfile)
    settings.admission.managed = CONFIGURATION_NAME


def review(body: dict[str, Any], old: dict[str, Any] | None, operation: str, warnings: list[str]) -> None:
    """Refuse an invalid spec naming every field and fix; report warnings. Raises kopf.AdmissionError."""
    if operation == "UPDATE":
        if (body.get("metadata") or {}).get("deletionTimestamp"):
            return
        if old is not None and (old.get("spec") or {}) == (body.get("spec") or {}):
            return
    hs, validation = validate(dict(body), handlers.OPTIONS.engine_policy)
    if hs is None or validation.parse_error:
        raise kopf.AdmissionError(validation.parse_error or "not a HybridServing", code=422)
    # Everything `hybridserving validate` reports (layout, pod surface, weights, capacity), and privileges.
    issues = [*fleet.assess(hs.spec).issues, *privileges.check(hs.spec, handlers.OPTIONS.engine_policy)]
    errors = [i for i in issues if i.severity == "error"]
    warnings.extend(f"{i.path}: {i.message}. Fix: {i.fix}" for i in issues if i.severity != "error")
    if errors:
        raise kopf.AdmissionError(
            "; ".join(f"{i.path}: {i.message}. Fix: {i.fix}" for i in errors)[:8000], code=422)


@kopf.on.validate(GROUP, VERSION, PLURAL, id="create", operations=["CREATE"], ignore_failures=False,
                  persistent=True)
def check_create(body: kopf.Body, warnings: list[str], **_: Any) -> None:
    review(dict(body), None, "CREATE", warnings)


@kopf.on.validate(GROUP, VERSION, PLURAL, id="update", operations=["UPDATE"], ignore_failures=True,
                  persistent=True)
def check_update(body: kopf.Body, warnings: list[str], old: kopf.BodyEssence | None = None, **_: Any) -> None:
    review(dict(body), dict(old) if old else None, "UPDATE", warnings)
