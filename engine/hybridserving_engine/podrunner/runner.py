"""The watch loop and one worker per pod it runs: the kubelet's job for engine leaders and routers
on fake nodes.

A simulated multi-node instance runs whole on its leader (the simulator's worker ranks run no
batches: they serve SGLang's dummy health check and wait for rank 0 to stop), so worker pods get
no process: they keep the Running, Ready status kwok gives them, which is what the operator reads
for gang health.

Each leader's worker thread materialises the pod's volumes, starts the container's command
(the launcher) at the pod IP, probes it, writes the readiness and the restart count into the
pod's status, refreshes ConfigMap volumes and the role file while the pod lives, and stops
the process when the pod goes, honouring its grace period.

Like the kubelet, it keeps a deleted pod's object until its process has stopped (a finalizer,
`FINALIZER`): kwok's own pod-delete stage removes a deleted pod at once, which would free its IP
for a replacement while the old engine still drains on it, so that a router could find the new
pod's address answered by the old engine.
"""

from __future__ import annotations

import base64
import ipaddress
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as TransportError

from hybridserving_engine.podrunner.container import ContainerProcess, container_command, container_environment
from hybridserving_engine.podrunner.probe import ReadinessProbe
from hybridserving_engine.podrunner.volumes import (
    AtomicDirectory,
    MissingSource,
    pin_wildcard_host,
    volume_files,
)

log = logging.getLogger("hybridserving.podrunner")

POD_SELECTOR = "hybridserving.io/component in (engine,router)"
NODE_RANK_LABEL = "hybridserving.io/node-rank"
COMPONENT_LABEL = "hybridserving.io/component"
FAKE_NODE_SELECTOR = "type=kwok"
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
FINALIZER = "hybridserving.io/pod-runner"
TICK_SECONDS = 0.2
# What an apiserver that restarts or is briefly unreachable raises: the worker keeps its
# container running and tries again on its next tick, as the kubelet does.
API_UNAVAILABLE = (ApiException, TransportError, OSError)


def unhold(uid: str, finalizers: list[str]) -> list[dict[str, Any]]:
    """The JSON patch that removes this runner's finalizer from the pod `uid` only: a replacement of
    the same name, or a finalizer list changed since it was read, fails the test and keeps its own."""
    at = f"/metadata/finalizers/{finalizers.index(FINALIZER)}"
    return [{"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "test", "path": at, "value": FINALIZER}, {"op": "remove", "path": at}]


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def runs(pod: Mapping[str, Any]) -> bool:
    """Whether the runner runs the pod's container: an engine instance's leader, or a router."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(COMPONENT_LABEL) == "router" or labels.get(NODE_RANK_LABEL) == "0"


def grace_seconds(pod: Mapping[str, Any]) -> float:
    """The deletion's grace period if the pod is being deleted, else its spec's (default 30 s)."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionGracePeriodSeconds") is not None:
        return float(meta["deletionGracePeriodSeconds"])
    return float((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))


def loopback_ip(pod: Mapping[str, Any]) -> str | None:
    """The pod IP if it is a loopback address (kwok's range on the local cluster), else None:
    the runner binds nothing else."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    return ip if ipaddress.ip_address(ip).is_loopback else None



def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's Ready condition is True, as the apiserver holds it."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


# The kubelet's FallbackToLogsOnError: at most this much of the log's tail becomes the message.
MESSAGE_MAX_LINES, MESSAGE_MAX_BYTES = 80, 2048


def termination_message(container: dict[str, Any], code: int, log_path: Path) -> str:
    """What the kubelet reports as lastState.terminated.message for a container that exited.

    Only `terminationMessagePolicy: FallbackToLogsOnError` with a failed exit is served (the
    process writes no /dev/termination-log here): the last 80 lines of its log, at most 2 KiB.
    """
    if container.get("terminationMessagePolicy") != "FallbackToLogsOnError" or code == 0:
        return ""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            tail = f.read()
    except OSError:
        return ""
    lines = tail.decode("utf-8", "replace").splitlines()[-MESSAGE_MAX_LINES:]
    return "\n".join(lines)[-MESSAGE_MAX_BYTES:]

class PodWorker:
    """Runs one leader pod's container for as long as the pod lives."""

    def __init__(self, runner: PodRunner, pod: dict[str, Any]) -> None:
        self.runner = runner
        self.pod = pod
        meta = pod["metadata"]
        self.namespace, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.dir = runner.state_dir / f"{self.namespace}_{self.name}_{self.uid[:8]}"
        self.container_spec = pod["spec"]["containers"][0]
        if len(pod["spec"]["containers"]) > 1:
            log.warning("%s/%s: only its first container, %s, is run", self.namespace, self.name,
                        self.container_spec["name"])
        pod_ip = loopback_ip(pod)
        if pod_ip is None:
            raise ValueError(f"{self.namespace}/{self.name}: only pods with a loopback IP are run")
        self.pod_ip = pod_ip
        self.probe = ReadinessProbe.from_container(self.container_spec, self.pod_ip, runner.probe_period_seconds)
        self.process: ContainerProcess | None = None
        self.restarts = 0
        self.last_terminated: dict[str, Any] | None = None
        self.waiting_reason: str | None = "ContainerCreating"
        self._failures_in_a_row = 0
        self._volumes: dict[str, AtomicDirectory] = {}
        self._host_dirs: dict[str, Path] = {}  # hostPath and claim volumes: outlive the pod
        self._materialised = False
        self.init_containers: list[dict[str, Any]] = list(pod["spec"].get("initContainers") or [])
        self._init_index = 0
        self._init_process: ContainerProcess | None = None
        self._init_retry_at = 0.0
        self._init_failures = 0
        self._init_statuses: dict[str, dict[str, Any]] = {}
        self._changed = threading.Event()
        self._terminate: float | None = None  # grace period, once the pod goes
        self._held = self._hold_tried = False  # FINALIZER on the pod; a hold refused for good
        self._reported: tuple[object, ...] | None = None
        self.thread = threading.Thread(target=self._run, name=f"pod-{self.name}", daemon=True)

    # ---- called from the watch thread

    def update(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        if self._reported is not None and pod_ready(pod) is not self._reported[0]:
            # Someone else wrote the pod's readiness: the node lifecycle controller marks the pods
            # of a node whose lease it saw go stale NotReady (an apiserver outage longer than its
            # grace period does that to every node). The kubelet's status manager reports its own
            # status again when the apiserver's differs; so does the next tick.
            self._reported = None
        self._changed.set()

    def terminate(self, grace: float) -> None:
        if self._terminate is None:
            self._terminate = grace
        self._changed.set()

    def wake(self) -> None:
        self._changed.set()

    # ---- the worker thread

    def _run(self) -> None:
        try:
            self._serve()
        except Exception:
            log.exception("%s/%s: worker failed", self.namespace, self.name)
        finally:
            self._stop()
            self._release()

    def _hold(self) -> None:
        """Keep the pod's object (and so its IP) until the process has stopped."""
        try:
            self.runner.core.patch_namespaced_pod(self.name, self.namespace, {"metadata": {"finalizers": [FINALIZER]}},
                                                  _content_type=STRATEGIC_MERGE)
            self._held = True
        except ApiException as e:
            if e.status is not None and e.status < 500:  # being deleted already (no new finalizer) or gone
                log.info("%s/%s: not held (%s)", self.namespace, self.name, e.reason)
                self._hold_tried = True
        except (TransportError, OSError):
            pass  # the API is away for a moment: the next tick tries again

    def _release(self) -> None:
        """Drop the finalizer of this very pod (a replacement of the same name keeps its own)."""
        for attempt in range(3):
            if not self._held:
                return
            try:
                meta = self.runner.core.read_namespaced_pod(self.name, self.namespace).metadata
                finalizers = list((meta and meta.finalizers) or [])
                if meta is None or meta.uid != self.uid or FINALIZER not in finalizers:
                    return
                self.runner.core.patch_namespaced_pod(self.name, self.namespace, unhold(self.uid, finalizers),
                                                      _content_type=JSON_PATCH)
                return
            except ApiException as e:
                if e.status == 404:
                    return
                log.warning("%s/%s: finalizer not removed yet (%s)", self.namespace, self.name, e.reason)
            except (TransportError, OSError) as e:
                log.warning("%s/%s: finalizer not removed yet (%s)", self.namespace, self.name, e)
            time.sleep(1 + attempt)

    def _serve(self) -> None:
        self._report()  # not Ready until the probe says so, whatever kwok's stage wrote
        next_probe = next_refresh = 0.0
        restart_at: float | None = 0.0
        while self._terminate is None and not self.runner.stopping.is_set():
            now = time.monotonic()
            if not (self._held or self._hold_tried):
                self._hold()
            if self._changed.is_set() or now >= next_refresh:
                self._changed.clear()
                next_refresh = now + self.runner.volume_refresh_seconds
                self._materialise()
            # No process starts before the pod is held: a pod deleted before that would free its IP
            # while the process still drains on it.
            startable = self._materialised and (self._held or self._hold_tried)
            if self._init_index < len(self.init_containers):
                if startable:
                    try:
                        self._step_init(now)
                    except API_UNAVAILABLE as e:
                        self._init_retry_at = now + 1.0
                        log.warning("%s/%s: init container not started (%s); retrying", self.namespace, self.name, e)
            elif self.process is None or restart_at is not None:
                if restart_at is not None and now >= restart_at and startable:
                    # The container's env reads Secrets and ConfigMaps (the engine API key): an
                    # apiserver away for a moment delays the start, as it delays the kubelet's,
                    # and loses neither the pod's restart count nor its last state.
                    try:
                        self._start()
                    except API_UNAVAILABLE as e:
                        restart_at = now + 1.0
                        log.warning("%s/%s: container not started (%s); retrying", self.namespace, self.name, e)
                    else:
                        restart_at = None
                        next_probe = now
            else:
                code = self.process.exit_code()
                if code is not None:
                    restart_at = now + self._backoff()
                    self._exited(code)
            if self.process is not None and restart_at is None and now >= next_probe:
                self.probe.check()
                next_probe = now + self.probe.period_seconds
            self._report()
            self._changed.wait(TICK_SECONDS)

    def _backoff(self) -> float:
        """The kubelet's restart back-off: doubling per restart, capped; reset after a long run."""
        assert self.process is not None and self.process.started_at is not None
        if time.time() - self.process.started_at > self.runner.backoff_reset_seconds:
            self._failures_in_a_row = 0
        self._failures_in_a_row += 1
        return min(self.runner.restart_backoff_seconds * 2.0 ** (self._failures_in_a_row - 1),
                   self.runner.restart_backoff_max_seconds)

    def _step_init(self, now: float) -> None:
        """Run the init containers one after the other; a failed one is retried with back-off."""
        spec = self.init_containers[self._init_index]
        name = spec["name"]
        if self._init_process is None:
            if now < self._init_retry_at:
                return
            env = container_environment(spec, self.pod, self._mounts(spec),
                                        read_key=self.runner.read_key_for(self.namespace))
            env["HYBRIDSERVING_TERMINATION_LOG"] = str(self._termination_log(name))
            self._termination_log(name).unlink(missing_ok=True)
            self._init_process = ContainerProcess(container_command(spec, env, self.pod_ip), env, self.dir,
                                                  self.dir / f"init-{name}.log")
            self._init_process.start()
            self.waiting_reason = "PodInitializing"
            previous = self._init_statuses.get(name, {}).get("lastState")
            self._init_statuses[name] = {"state": {"running": {"startedAt": now_rfc3339()}},
                                         **({"lastState": previous} if previous else {})}
            log.info("%s/%s: init container %s started", self.namespace, self.name, name)
            return
        code = self._init_process.exit_code()
        if code is None:
            return
        log_file = self._termination_log(name)
        message = log_file.read_text()[:4096] if log_file.exists() else ""
        terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error", "message": message,
                      "startedAt": rfc3339(self._init_process.started_at or time.time()), "finishedAt": now_rfc3339()}
        self._init_process = None
        if code == 0:
            self._init_statuses[name] = {"state": {"terminated": terminated}}
            self._init_index += 1
            log.info("%s/%s: init container %s completed", self.namespace, self.name, name)
            return
        self._init_failures += 1
        self._init_retry_at = now + min(self.runner.restart_backoff_seconds * 2 ** (self._init_failures - 1),
                                        self.runner.restart_backoff_max_seconds)
        self._init_statuses[name] = {"state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                     "lastState": {"terminated": terminated}}
        log.warning("%s/%s: init container %s failed (%d): %s", self.namespace, self.name, name, code, message)

    def _termination_log(self, container: str) -> Path:
        return self.dir / f"termination-{container}"

    def _mounts(self, container: dict[str, Any]) -> dict[str, Path]:
        """Mount path -> local directory of every mounted volume of `container` (subPath honoured)."""
        out: dict[str, Path] = {}
        for m in container.get("volumeMounts") or []:
            base = self._host_dirs.get(m["name"]) or (self._volumes[m["name"]].path if m["name"] in self._volumes
                                                     else None)
            if base is None:
                continue
            path = base / m["subPath"] if m.get("subPath") else base
            if m["name"] in self._host_dirs:
                path.mkdir(parents=True, exist_ok=True)
            out[m["mountPath"]] = path
        return out

    def _materialise(self) -> None:
        """Write every volume of the pod (ConfigMaps read now, downward API from the latest pod)."""
        mounts = {m["name"] for c in (self.container_spec, *self.init_containers) for m in c.get("volumeMounts") or []}
        pending: dict[str, dict[str, str]] = {}
        try:
            for volume in self.pod["spec"].get("volumes") or []:
                if volume["name"] not in mounts:
                    continue
                host_dir = self.runner.host_directory(volume, self.namespace, self.pod["spec"].get("nodeName") or "")
                if host_dir is not None:
                    self._host_dirs[volume["name"]] = host_dir
                    continue
                files = volume_files(volume, self.pod, self.runner.read_config_map_for(self.namespace))
                pending[volume["name"]] = {} if files is None else {
                    path: pin_wildcard_host(content, self.pod_ip) for path, content in files.items()}
        except MissingSource as e:
            if not self._materialised:
                self.waiting_reason = "ContainerCreating"
                log.info("%s/%s: waiting for volumes: %s", self.namespace, self.name, e)
            return
        except API_UNAVAILABLE as e:
            log.warning("%s/%s: volumes not refreshed (%s); next tick", self.namespace, self.name, e)
            return
        for name, files in pending.items():
            directory = self._volumes.get(name) or AtomicDirectory(self.dir / "volumes" / name)
            self._volumes[name] = directory
            if directory.write(files) and self.process is not None:
                log.info("%s/%s: volume %s updated", self.namespace, self.name, name)
        self._materialised = True

    def _start(self) -> None:
        mounts = self._mounts(self.container_spec)
        env = container_environment(self.container_spec, self.pod, mounts,
                                    read_key=self.runner.read_key_for(self.namespace))
        command = container_command(self.container_spec, env, self.pod_ip)
        self.process = ContainerProcess(command, env, self.dir, self.dir / "container.log")
        self.process.start()
        self.probe.reset()
        self.waiting_reason = None
        log.info("%s/%s: started %s at %s (pid %d, restart %d)", self.namespace, self.name,
                 self.container_spec["name"], self.pod_ip, self.process.pid, self.restarts)

    def _exited(self, code: int) -> None:
        assert self.process is not None
        log.warning("%s/%s: container exited with %d; restarting", self.namespace, self.name, code)
        self.last_terminated = {
            "exitCode": code if code >= 0 else 128 - code,  # killed by a signal: 128 + its number
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": rfc3339(self.process.started_at or time.time()),
            "finishedAt": now_rfc3339(),
        }
        message = termination_message(self.container_spec, code, self.dir / "container.log")
        if message:
            self.last_terminated["message"] = message
        self.restarts += 1
        self.probe.reset()
        self.waiting_reason = "CrashLoopBackOff"

    def _stop(self) -> None:
        grace = self._terminate if self._terminate is not None else self.runner.shutdown_grace_seconds
        own = time.monotonic() + grace

        def deadline() -> float:
            # The runner's own shutdown cuts a stop under way to its shutdown grace: a runner
            # killed before its containers are stopped leaves their engines running.
            stop_by = self.runner.stop_by
            return own if stop_by is None else min(own, stop_by)

        self.probe.ready = False
        self._report()  # a terminating pod is unready at once
        if self._init_process is not None:
            self._init_process.stop(deadline)
        if self.process is not None:
            # The kubelet runs the preStop hook first, within the grace period.
            pause = float(((self.container_spec.get("lifecycle") or {}).get("preStop") or {}).get(
                "sleep", {}).get("seconds", 0))
            if pause and self._terminate is not None:
                log.info("%s/%s: preStop sleep %.0f s", self.namespace, self.name, min(pause, grace))
                pause_end = time.monotonic() + pause
                while (left := min(pause_end, deadline()) - time.monotonic()) > 0:
                    time.sleep(min(left, TICK_SECONDS))
            log.info("%s/%s: stopping (grace %.0f s)", self.namespace, self.name,
                     max(0.0, deadline() - time.monotonic()))
            code = self.process.stop(deadline)
            log.info("%s/%s: stopped, exit %s", self.namespace, self.name, code)
        shutil.rmtree(self.dir / "volumes", ignore_errors=True)

    # ---- status

    def _report(self) -> None:
        """Patch the pod's status when readiness, restarts or the container state changed."""
        running = self.process is not None and self.waiting_reason is None
        key = (self.probe.ready and running and self._terminate is None, self.restarts, running, self.waiting_reason,
               repr(self._init_statuses))
        if key == self._reported:
            return
        ready = key[0]
        status_word = "True" if ready else "False"
        stamp = now_rfc3339()
        container: dict[str, Any] = {
            "name": self.container_spec["name"],
            "image": self.container_spec.get("image", ""),
            "imageID": "",
            "ready": ready,
            "started": running,
            "restartCount": self.restarts,
        }
        if running:
            assert self.process is not None and self.process.started_at is not None, "a running container started"
            container["state"] = {"running": {"startedAt": rfc3339(self.process.started_at)}}
        else:
            container["state"] = {"waiting": {"reason": self.waiting_reason}}
        if self.last_terminated:
            container["lastState"] = {"terminated": self.last_terminated}
        conditions = [
            {"type": kind, "status": status_word, "lastTransitionTime": stamp,
             **({} if ready else {"reason": "ContainersNotReady",
                                  "message": f"containers with unready status: [{self.container_spec['name']}]"})}
            for kind in ("Ready", "ContainersReady")
        ]
        body: dict[str, Any] = {"status": {"conditions": conditions, "containerStatuses": [container]}}
        if self.init_containers:
            body["status"]["initContainerStatuses"] = [
                {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": "terminated" in
                 self._init_statuses.get(c["name"], {}).get("state", {}), "restartCount": 0,
                 **self._init_statuses.get(c["name"], {"state": {"waiting": {"reason": "PodInitializing"}}})}
                for c in self.init_containers
            ]
        try:
            self.runner.core.patch_namespaced_pod_status(self.name, self.namespace, body, _content_type=STRATEGIC_MERGE)
        except ApiException as e:
            if e.status != 404:
                log.warning("%s/%s: status patch failed: %s", self.namespace, self.name, e.reason)
                return
        except (TransportError, OSError) as e:
            log.warning("%s/%s: status patch failed (%s); next tick", self.namespace, self.name, e)
            return
        self._reported = key


class PodRunner:
    """Watches engine pods and keeps one worker per leader pod on a fake node."""

    def __init__(self, api_client: client.ApiClient, state_dir: Path, namespace: str | None = None, *,
                 probe_period_seconds: float | None = None, volume_refresh_seconds: float = 5.0,
                 restart_backoff_seconds: float = 10.0, restart_backoff_max_seconds: float = 300.0,
                 backoff_reset_seconds: float = 600.0, shutdown_grace_seconds: float = 30.0,
                 node_selector: str = FAKE_NODE_SELECTOR) -> None:
        self.core = client.CoreV1Api(api_client)
        self.state_dir = state_dir
        self.namespace = namespace
        self.probe_period_seconds = probe_period_seconds
        self.volume_refresh_seconds = volume_refresh_seconds
        self.restart_backoff_seconds = restart_backoff_seconds
        self.restart_backoff_max_seconds = restart_backoff_max_seconds
        self.backoff_reset_seconds = backoff_reset_seconds
        self.shutdown_grace_seconds = shutdown_grace_seconds
        self.node_selector = node_selector
        self.stopping = threading.Event()
        # When every container must be stopped by, once the runner itself stops.
        self.stop_by: float | None = None
        self.workers: dict[str, PodWorker] = {}
        self._nodes: set[str] = set()

    def read_config_map_for(self, namespace: str) -> Callable[[str], Mapping[str, str] | None]:
        def read(name: str) -> Mapping[str, str] | None:
            try:
                return self.core.read_namespaced_config_map(name, namespace).data or {}
            except ApiException as e:
                if e.status == 404:
                    return None
                raise
        return read

    def read_key_for(self, namespace: str) -> Callable[[str, Mapping[str, Any]], str | None]:
        """Reads a Secret or ConfigMap key for an env `valueFrom` (None when absent)."""
        def read(kind: str, selector: Mapping[str, Any]) -> str | None:
            try:
                if kind == "secretKeyRef":
                    data = self.core.read_namespaced_secret(selector["name"], namespace).data or {}
                    raw = data.get(selector["key"])
                    return None if raw is None else base64.b64decode(raw).decode()
                config_map = self.core.read_namespaced_config_map(selector["name"], namespace)
                return (config_map.data or {}).get(selector["key"])
            except ApiException as e:
                if e.status == 404:
                    return None
                raise
        return read

    def host_directory(self, volume: Mapping[str, Any], namespace: str, node: str) -> Path | None:
        """The local directory behind a node's hostPath or a claim, or None for other volumes.

        A hostPath belongs to its node (`nodes/<node>/<path>`), so pods on one fake node share
        it and pods on another do not; a claim is shared storage (`claims/<namespace>/<claim>`).
        """
        if "hostPath" in volume:
            host_path: str = volume["hostPath"]["path"]
            return self.state_dir / "nodes" / node / host_path.lstrip("/")
        if "persistentVolumeClaim" in volume:
            claim: str = volume["persistentVolumeClaim"]["claimName"]
            return self.state_dir / "claims" / namespace / claim
        return None

    def _on_fake_node(self, node: str | None) -> bool:
        if node and node not in self._nodes:
            nodes = self.core.list_node(label_selector=self.node_selector).items
            self._nodes = {n.metadata.name for n in nodes if n.metadata is not None and n.metadata.name}
        return node in self._nodes

    def observe(self, event_type: str, pod: dict[str, Any]) -> None:
        """React to one pod event: start, update or stop its worker."""
        meta = pod["metadata"]
        uid = meta["uid"]
        worker = self.workers.get(uid)
        if event_type == "DELETED" or meta.get("deletionTimestamp"):
            if worker is not None:
                worker.update(pod)
                worker.terminate(grace_seconds(pod))
            elif event_type != "DELETED" and FINALIZER in (meta.get("finalizers") or []):
                self._release_unheld(meta)
            return
        if worker is not None:
            worker.update(pod)
            return
        status = pod.get("status") or {}
        if (status.get("phase") != "Running" or not runs(pod)
                or not self._on_fake_node((pod.get("spec") or {}).get("nodeName"))):
            return
        if loopback_ip(pod) is None:
            if status.get("podIP"):
                log.error("%s/%s: pod IP %s is not a loopback address; not running it",
                          meta["namespace"], meta["name"], status["podIP"])
            return
        worker = PodWorker(self, pod)
        self.workers[uid] = worker
        worker.thread.start()

    def _release_unheld(self, meta: Mapping[str, Any]) -> None:
        """Drop the finalizer of a deleted pod no worker holds: one whose worker gave up releasing
        it while the apiserver was away, or one deleted while this runner was down (its containers
        died with the runner). Kept, the pod would stay Terminating, and the fixed name of an
        engine pod (`<instance>-<rank>`) would keep its replacement from being created. A relist
        tries again."""
        try:
            self.core.patch_namespaced_pod(meta["name"], meta["namespace"],
                                           unhold(meta["uid"], list(meta.get("finalizers") or [])),
                                           _content_type=JSON_PATCH)
            log.info("%s/%s: released (no process ran for it here)", meta["namespace"], meta["name"])
        except API_UNAVAILABLE as e:
            log.warning("%s/%s: finalizer not removed yet (%s); next relist", meta["namespace"], meta["name"], e)

    def _list(self) -> tuple[list[dict[str, Any]], str]:
        result = (self.core.list_namespaced_pod(self.namespace, label_selector=POD_SELECTOR) if self.namespace
                  else self.core.list_pod_for_all_namespaces(label_selector=POD_SELECTOR))
        pods = [self.core.api_client.sanitize_for_serialization(p) for p in result.items]
        assert result.metadata is not None and result.metadata.resource_version is not None, "lists are versioned"
        return pods, result.metadata.resource_version

    def run(self) -> None:
        """List, then watch, until `stopping` is set; relist when the watch expires."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        while not self.stopping.is_set():
            try:
                pods, version = self._list()
                seen = {p["metadata"]["uid"] for p in pods}
                for uid, worker in list(self.workers.items()):
                    if uid not in seen:
                        worker.terminate(grace_seconds(worker.pod))
                for pod in pods:
                    self.observe("ADDED", pod)
                self._watch(version)
            except ApiException as e:
                if e.status != 410:
                    log.warning("pod watch failed (%s); relisting", e.reason)
                    self.stopping.wait(1)
            except Exception as e:  # the API went away for a moment: relist
                log.warning("pod watch failed (%s); relisting", e)
                self.stopping.wait(1)
            self._forget_finished()

    def _watch(self, version: str) -> None:
        w = watch.Watch()
        kwargs = {"label_selector": POD_SELECTOR, "resource_version": version, "timeout_seconds": 30,
                  "allow_watch_bookmarks": True}
        lister = (self.core.list_namespaced_pod if self.namespace else self.core.list_pod_for_all_namespaces)
        args = (self.namespace,) if self.namespace else ()
        for event in w.stream(lister, *args, **kwargs):
            if self.stopping.is_set():
                w.stop()
                return
            if event["type"] == "ERROR":
                return  # an expired resourceVersion: relist
            if event["type"] == "BOOKMARK":
                continue
            self.observe(event["type"], self.core.api_client.sanitize_for_serialization(event["object"]))
            self._forget_finished()

    def _forget_finished(self) -> None:
        for uid, worker in list(self.workers.items()):
            if not worker.thread.is_alive():
                del self.workers[uid]

    def stop(self) -> None:
        """Stop every pod's process (within the shutdown grace) and wait for the workers."""
        self.stop_by = time.monotonic() + self.shutdown_grace_seconds
        self.stopping.set()
        for worker in list(self.workers.values()):
            worker.wake()
        for worker in list(self.workers.values()):
            worker.thread.join()
