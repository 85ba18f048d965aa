"""`python -m hybridserving.demo`: the whole system on this machine, end to end.

A local Kubernetes control plane with fake GPU nodes, the operator, an example fleet whose
engines are the SGLang simulator, the real `smg` router discovering them, client traffic
whose mix swings from decode-heavy to prefill-heavy, and the role-switch controller
answering it. It prints what happens and where to look, then tears everything down
(`--keep` leaves it running until Ctrl-C).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
from importlib import resources
from typing import Any, Callable

import yaml

from hybridserving.api.crd import dump, render_all
from hybridserving.api.v1alpha1 import GROUP, INSTANCE_PLURAL, PLURAL
from hybridserving.commands.status import render
from hybridserving.demo.traffic import PhaseResult, run_phase
from hybridserving.devcluster import Cluster, DevClusterError, FleetSpec, MissingBinaries, find_binaries
from hybridserving.devcluster.stack import ProcessExited, Router, Stack, router_deployments

T0 = time.monotonic()
SWITCH_ANNOTATION = "hybridserving.io/switch-to"
# The interpreter the printed commands name: `make setup` puts the project there, and a shell's own
# `python` often lacks it.
PY = ".venv/bin/python"


class ClientRequestsFailed(RuntimeError):
    """Client requests through the router failed: the system ran, but did not serve."""


# What ends the demo with a report rather than a traceback: a step that could not be done, not a bug.
FAILURES = (DevClusterError, ClientRequestsFailed, TimeoutError, subprocess.TimeoutExpired, OSError)


def say(message: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {message}", flush=True)


def _wait(what: str, check: Callable[[], Any], timeout: float, alive: Callable[[], None],
          interval: float = 1.0) -> Any:
    """Poll `check` until it holds. `alive` raises once a process the check depends on exited: the
    wait then ends at once, naming the process and its log, instead of at the timeout naming neither."""
    deadline = time.monotonic() + timeout
    while True:
        alive()
        try:
            value = check()
        except Exception:
            alive()  # a process that exited explains the failed read better than the read itself
            raise
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def hint(error: BaseException) -> str:
    """What to do next, by the kind of failure."""
    if isinstance(error, ProcessExited):
        return "the end of its log is above"
    if isinstance(error, FileNotFoundError):
        return ("a program the demo runs is missing: `make setup` installs the router (smg) in .venv; "
                "openssl comes with the system's packages")
    if isinstance(error, (TimeoutError, subprocess.TimeoutExpired)):
        return ("a step that takes seconds on an idle machine took longer: the logs say which process was stuck "
                "or slow; on a busy machine, run the demo again when it is idle")
    if isinstance(error, ClientRequestsFailed):
        return "the client errors above, and the router's log, say why"
    if isinstance(error, DevClusterError):
        return "the control plane's logs say why"
    return "the traceback below says where"


def failure_report(step: str, error: BaseException, logs: dict[str, pathlib.Path]) -> str:
    """The demo's last words on a failure: the step, the error, what to do, and where the logs are."""
    return "\n".join([f"\nthe demo failed while {step}: {error}", f"hint: {hint(error)}", "logs (kept):",
                      *(f"  {path}  ({what})" for what, path in logs.items())])


def owner_refusal(cluster: Cluster) -> str | None:
    """Why the demo must leave the cluster of its name alone, if it must: another live process started
    it (a demo run with --keep, most likely), and stopping it would pull the cluster from under it."""
    owner = cluster.state().get("owner_pid")
    if owner == os.getpid() or not cluster.owner_alive():
        return None
    return (f"the cluster '{cluster.name}' belongs to a running process (pid {owner}), perhaps a demo run with "
            "--keep: stop that one (Ctrl-C in its terminal, or "
            f"`{PY} -m hybridserving.devcluster down --name {cluster.name}`), "
            "or run this one beside it with --cluster NAME")


def _detach_output(log: pathlib.Path) -> None:
    """Send stdout and stderr to `log`: once the terminal is closed, a write to it fails (EIO), and one
    that failed during the teardown would cut it short and leave the control plane running."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)


def _exit_on_signal(signum: int, _frame: object) -> None:
    sys.exit(128 + signum)


class Fleet:
    """Reads of one HybridServing and its instances through kubectl (the user's own view)."""

    def __init__(self, cluster: Cluster, namespace: str, name: str, model: str):
        self.cluster, self.namespace, self.name, self.model = cluster, namespace, name, model

    def _get(self, resource: str, name: str | None = None) -> Any:
        args = ["-n", self.namespace, "get", f"{resource}.{GROUP}", *([name] if name else []), "-o", "json"]
        return json.loads(self.cluster.kubectl(*args).stdout)

    def hs(self) -> dict[str, Any]:
        fleet: dict[str, Any] = self._get(PLURAL, self.name)
        return fleet

    def instances(self) -> list[dict[str, Any]]:
        uid = self.hs()["metadata"]["uid"]
        return [i for i in self._get(INSTANCE_PLURAL)["items"]
                if any(o.get("uid") == uid for o in i["metadata"].get("ownerReferences") or [])]

    def view(self) -> str:
        out = io.StringIO()
        render(self.hs(), self.instances(), out)
        return out.getvalue()

    def switches(self) -> list[dict[str, Any]]:
        return (self.hs().get("status") or {}).get("switches") or []


def _phase(stack: Stack, router: Router, name: str, fleet: Fleet, seconds: float, **shape: Any) -> PhaseResult:
    say(f"traffic: {name} for {seconds:.0f} s ({shape['concurrency']} streams of "
        f"{shape['prompt_tokens']}-token prompts, {shape['output_tokens']} tokens out)")
    result = asyncio.run(run_phase(router.url, name, seconds=seconds, model=fleet.model, headers=router.headers,
                                   **shape))
    say(result.summary())
    for error in sorted(set(result.errors))[:5]:
        say(f"  client error: {error}")
    stack.check_alive()  # requests that failed because a process exited: name it
    return result


class Steps:
    """The step under way: the report of a failure names it."""

    def __init__(self) -> None:
        self.current = "preparing"


def _show(args: argparse.Namespace, cluster: Cluster, stack: Stack, manifest: dict[str, Any],
          steps: Steps) -> None:
    """The demo itself, from an empty cluster to the fleet after a role switch; raises on a failure."""
    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]

    def wait(what: str, check: Callable[[], Any], timeout: float, interval: float = 1.0) -> Any:
        steps.current = f"waiting for {what}"
        return _wait(what, check, timeout, stack.check_alive, interval)

    if cluster.is_running():
        steps.current = f"stopping the cluster '{args.cluster}' left by an earlier run"
        say(steps.current)
        cluster.down(quiet=True)
    steps.current = f"starting the local control plane '{args.cluster}'"
    say(f"local control plane '{args.cluster}': {args.nodes} fake GPU nodes x 8 GPUs")
    cluster.up()
    steps.current = "installing the CRDs"
    cluster.kubectl("apply", "--server-side", "--field-manager=hybridserving-crds", "-f", "-",
                    input="---\n".join(dump(doc) for doc in render_all().values()))
    cluster.wait_established(doc["metadata"]["name"] for doc in render_all().values())
    steps.current = "starting the operator and the pod runner"
    say(f"operator and pod runner starting (logs in {stack.workdir})")
    stack.start()
    steps.current = "applying the example fleet"
    say(f"kubectl apply -f {name}.yaml  (the embedded example fleet, engines on the SGLang simulator)")
    cluster.kubectl("apply", "--server-side", "--field-manager=demo-user", "-f", "-",
                    input=yaml.safe_dump(manifest))
    fleet = Fleet(cluster, namespace, name, manifest["spec"]["model"]["path"])
    wait("the fleet to be Ready", lambda: (fleet.hs().get("status") or {}).get("ready") == "True", 180)
    say("fleet Ready:\n" + fleet.view())
    steps.current = "starting the router"
    [deployment] = router_deployments(cluster, namespace, name)
    router = stack.router(namespace, deployment)
    wait("the router to discover 4 healthy workers",
         lambda: sum(1 for w in router.workers() if w.get("is_healthy")) >= 4, 120)
    say(f"router at {router.url} discovered the leaders by label (Kubernetes service discovery)")

    results: list[PhaseResult] = []
    steps.current = "sending client traffic"
    results.append(_phase(stack, router, "decode-heavy", fleet, args.phase_seconds,
                          prompt_tokens=256, output_tokens=256, concurrency=16))
    before = len(fleet.switches())
    results.append(_phase(stack, router, "prefill-heavy", fleet, args.phase_seconds * 2,
                          prompt_tokens=24_000, output_tokens=4, concurrency=28))
    if len(fleet.switches()) == before:
        steps.current = "asking for a role switch"
        target = next(i for i in fleet.instances() if i["spec"]["role"] == "decode")
        inst = target["metadata"]["name"]
        say(f"no policy switch yet: the on-call path, `kubectl annotate hsi {inst} {SWITCH_ANNOTATION}=prefill`")
        cluster.kubectl("-n", namespace, "annotate", f"{INSTANCE_PLURAL}.{GROUP}", inst,
                        f"{SWITCH_ANNOTATION}=prefill", "--overwrite")
    wait("a role switch to finish",
         lambda: any(s.get("outcome") != "InProgress" for s in fleet.switches()[before:]), 180, 2.0)
    steps.current = "sending client traffic"
    results.append(_phase(stack, router, "after the switch", fleet, args.phase_seconds / 2,
                          prompt_tokens=24_000, output_tokens=4, concurrency=28))
    steps.current = "reading the fleet and its Events"
    say("the fleet now:\n" + fleet.view())
    events = cluster.kubectl("-n", namespace, "get", "events", "--field-selector",
                             f"involvedObject.name={name}", "--sort-by=.lastTimestamp",
                             "-o", "custom-columns=REASON:.reason,MESSAGE:.message").stdout
    say("events on the fleet (last 12):\n" + "\n".join(events.splitlines()[-12:]))
    failed = sum(r.failed for r in results)
    sent = sum(r.sent for r in results)
    say(f"client requests: {sent} sent, {failed} failed")
    print(
        "\nwhere to look (while it runs, with --keep):\n"
        f"  eval \"$({PY} -m hybridserving.devcluster env --name {args.cluster} --path)\"\n"
        "  kubectl get hs,hsi -o wide          # printer columns: ready, prefill x/y, decode x/y, KV capacity\n"
        f"  .venv/bin/hybridserving status {name}  # instances, roles, phases, capacity, recent switches\n"
        f"  kubectl describe hs {name}           # conditions and Events\n"
        f"  logs: {stack.workdir}\n"
    )
    if args.keep:
        steps.current = "running (--keep)"
        say("running; Ctrl-C to tear down")
        if signal.sigwait({signal.SIGINT, signal.SIGTERM, signal.SIGHUP}) == signal.SIGHUP:
            _detach_output(stack.workdir / "demo.log")
    if failed:
        steps.current = "sending client traffic"
        raise ClientRequestsFailed(f"{failed} of {sent} client requests failed")


def _teardown(cluster: Cluster, stack: Stack, *, keep_logs: bool) -> bool:
    """Stop the stack and the cluster; False, with what to run instead, when that failed.

    A second Ctrl-C (the terminal's first one reached the operator and the pod runner too; they
    drain on their own), or the SIGTERM a CI cancel sends after its SIGINT, must not cut the teardown
    short: that would leave the control plane running. Each process stop is bounded (SIGKILL after
    its grace), so ignoring them cannot hang it. A hangup only moves the output off the closed terminal.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, lambda *_: _detach_output(stack.workdir / "demo.log"))
    say("tearing down (Ctrl-C and SIGTERM are ignored until it is done; it takes seconds)")
    try:
        stack.stop()
        cluster.down(quiet=True, purge=not keep_logs)
    except DevClusterError as exc:
        print(f"teardown failed: {exc}\nstop what is left with "
              f"`{PY} -m hybridserving.devcluster down --name {cluster.name}`", file=sys.stderr, flush=True)
        return False
    return True


def run(args: argparse.Namespace) -> int:
    try:
        find_binaries()
    except MissingBinaries as exc:
        print(f"{exc}\nrun `make tools` (or `bash tools/build-tools.sh`) first; the first build takes ~12 min")
        return 2
    manifest = yaml.safe_load(resources.files("hybridserving.demo").joinpath("fleet.yaml").read_text())
    cluster = Cluster(args.cluster, FleetSpec(nodes=args.nodes), progress=say, probed_readiness=True)
    refusal = owner_refusal(cluster)
    if refusal:
        print(refusal, file=sys.stderr)
        return 1
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="hybridserving-demo-"))
    stack = Stack(cluster, workdir)
    logs = {"operator, pod runner and its engines, router": workdir, "control plane": cluster.log_dir}
    steps = Steps()

    def hang_up(signum: int, frame: object) -> None:
        _detach_output(workdir / "demo.log")
        _exit_on_signal(signum, frame)

    # SIGTERM and a hangup (the terminal closed) tear down as Ctrl-C does: without it the pod runner's
    # engines outlive the demo and hold the pod addresses the next one hands out again.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGHUP, hang_up)
    # The logs go with the cluster only when the demo ran through or was stopped on purpose.
    keep_logs, report = True, ""
    try:
        _show(args, cluster, stack, manifest, steps)
        keep_logs = False
    except FAILURES as exc:
        report = failure_report(steps.current, exc, logs)
    except (KeyboardInterrupt, SystemExit):
        keep_logs = False
        raise
    except Exception as exc:
        report = failure_report(steps.current, exc, logs)
        raise
    finally:
        torn_down = _teardown(cluster, stack, keep_logs=keep_logs)
        if report:
            print(report, file=sys.stderr, flush=True)
    return 0 if torn_down and not keep_logs else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hybridserving.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", default="demo", help="name of the local cluster")
    ap.add_argument("--nodes", type=int, default=4, help="fake GPU nodes (8 GPUs each)")
    ap.add_argument("--phase-seconds", type=float, default=40.0, help="length of a traffic phase")
    ap.add_argument("--keep", action="store_true", help="leave it running until Ctrl-C")
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
