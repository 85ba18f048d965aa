"""Each fleet's engine API key: derived, never read back, handed to pods through a Secret.

SGLang closes every endpoint but `/health*`, `/ready*` and `/metrics*` to callers without
`Authorization: Bearer <--api-key>` (`sglang/srt/utils/auth.py:98-151`, installed at
`entrypoints/http_server.py:2880-2898`), control endpoints (`/pause_generation`,
`/pd_role_switch`, `/abort_request`, ...) included. That holds where no CNI enforces the
fleet's NetworkPolicy. Who holds the key: the engines (`--api-key`, added by the launcher from
the environment), the router (`--api-key`, which smg also sends to the workers it discovers),
and the operator, which reads engines while it switches roles.

The operator has no Secret reads, so it does not store the key: it recomputes it as
HMAC-SHA256(operator key, fleet uid). The operator key is the operator's own (its environment,
from a Secret the chart generates once); the fleet uid changes when a fleet is recreated, so a
new fleet never inherits an old key. Rendered objects carry only a `secretKeyRef`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

from hybridserving.contract import ENV_ENGINE_API_KEY

SECRET_KEY = "api-key"
"""The data key of the fleet's Secret that holds the engine API key."""


def secret_name(hs: str) -> str:
    return f"{hs}-engine-key"


def derive(operator_key: bytes, fleet_uid: str) -> str:
    """The fleet's key: hex, so it is one token on a command line and in a Bearer header."""
    if not operator_key:
        raise ValueError("the operator key is empty: set HYBRIDSERVING_OPERATOR_KEY")
    if not fleet_uid:
        raise ValueError("a fleet without a uid has no engine key (it was never created)")
    return hmac.new(operator_key, fleet_uid.encode(), hashlib.sha256).hexdigest()


def env_var(hs: str) -> dict[str, Any]:
    """The container variable that carries the key, by reference to the fleet's Secret."""
    return {"name": ENV_ENGINE_API_KEY,
            "valueFrom": {"secretKeyRef": {"name": secret_name(hs), "key": SECRET_KEY}}}


def secret(meta: dict[str, Any], key: str) -> dict[str, Any]:
    """The Secret pods read the key from; `meta` names it and makes the fleet its owner."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "Opaque",
        "data": {SECRET_KEY: base64.b64encode(key.encode()).decode()},
    }
