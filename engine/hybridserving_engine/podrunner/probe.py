"""The container's readiness probe, with the kubelet's semantics.

Readiness is what the router's discovery and the operator both act on, so it follows the
pod's own `readinessProbe`: the path and (named) port it names, `periodSeconds`,
`timeoutSeconds`, and the success and failure thresholds that turn a series of results into
a state. A container starts unready and becomes ready after `successThreshold` successes in
a row; a ready one turns unready after `failureThreshold` failures in a row.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Pod IPs are loopback addresses: never through a proxy the environment may name.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class ReadinessProbe:
    url: str | None  # None: no probe, ready once running (the kubelet's rule)
    period_seconds: float = 10.0
    timeout_seconds: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3
    ready: bool = False
    _successes: int = 0
    _failures: int = 0

    @classmethod
    def from_container(cls, container: Mapping[str, Any], pod_ip: str,
                       period_override: float | None = None) -> ReadinessProbe:
        """The probe of `container` aimed at `pod_ip`; `period_override` replaces periodSeconds
        (tests shorten it; thresholds stay as the pod says)."""
        spec = container.get("readinessProbe")
        if not spec:
            return cls(url=None)
        get = spec.get("httpGet")
        if get is None:
            raise ValueError("only httpGet readiness probes are supported")
        port = get["port"]
        if isinstance(port, str) and not port.isdigit():
            named = {p.get("name"): p["containerPort"] for p in container.get("ports") or []}
            if port not in named:
                raise ValueError(f"readiness probe names port {port!r}, which the container does not declare")
            port = named[port]
        scheme = get.get("scheme", "HTTP").lower()
        return cls(
            url=f"{scheme}://{pod_ip}:{port}{get.get('path', '/')}",
            period_seconds=period_override or float(spec.get("periodSeconds", 10)),
            timeout_seconds=float(spec.get("timeoutSeconds", 1)),
            success_threshold=int(spec.get("successThreshold", 1)),
            failure_threshold=int(spec.get("failureThreshold", 3)),
        )

    def reset(self) -> None:
        """A (re)started container is unready until the probe passes again."""
        self.ready = self.url is None
        self._successes = self._failures = 0

    def check(self) -> bool:
        """Probe once (200-399 is a success, as for the kubelet); return the readiness state."""
        if self.url is None:
            self.ready = True
            return True
        try:
            with _OPENER.open(self.url, timeout=self.timeout_seconds) as resp:
                ok = 200 <= resp.status < 400
        except urllib.error.HTTPError as e:
            ok = 200 <= e.code < 400
        except (urllib.error.URLError, OSError):
            ok = False
        if ok:
            self._successes, self._failures = self._successes + 1, 0
            if self._successes >= self.success_threshold:
                self.ready = True
        else:
            self._successes, self._failures = 0, self._failures + 1
            if self._failures >= self.failure_threshold:
                self.ready = False
        return self.ready
