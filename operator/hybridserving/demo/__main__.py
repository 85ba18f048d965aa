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
import pathlib
import signal
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
from hybridserving.devcluster import Cluster, FleetSpec, MissingBinaries, find_binaries
from hybridserving.devcluster.stack import Router, Stack, router_deployments

T0 = time.monotonic()
SWITCH_ANNOTATION = "hybridserving.io/switch-to"


def say(message: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {message}", flush=True)


def _wait(what: str, check: Callable[[], Any], timeout: float, interval: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


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


def _phase(router: Router, name: str, fleet: Fleet, seconds: float, **shape: Any) -> PhaseResult:
    say(f"traffic: {name} for {seconds:.0f} s ({shape['concurrency']} streams of "
        f"{shape['prompt_tokens']}-token prompts, {shape['output_tokens']} tokens out)")
    result = asyncio.run(run_phase(router.url, name, seconds=seconds, model=fleet.model, headers=router.headers,
                                   **shape))
    say(result.summary())
    for error in sorted(set(result.errors))[:5]:
        say(f"  client error: {error}")
    return result


def run(args: argparse.Namespace) -> int:
    try:
        find_binaries()
    except MissingBinaries as exc:
        print(f"{exc}\nrun `make tools` (or `bash tools/build-tools.sh`) first; the first build takes ~12 min")
        return 2
    manifest = yaml.safe_load(resources.files("hybridserving.demo").joinpath("fleet.yaml").read_text())
    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="hybridserving-demo-"))
    cluster = Cluster(args.cluster, FleetSpec(nodes=args.nodes), progress=say, probed_readiness=True)
    stack = Stack(cluster, workdir)
    results: list[PhaseResult] = []
    # SIGTERM tears down like Ctrl-C does; a cluster left by an earlier demo starts afresh.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if cluster.is_running():
        say(f"stopping the cluster '{args.cluster}' left by an earlier run")
        cluster.down(quiet=True)
    try:
        say(f"local control plane '{args.cluster}': {args.nodes} fake GPU nodes x 8 GPUs")
        cluster.up()
        cluster.kubectl("apply", "--server-side", "--field-manager=hybridserving-crds", "-f", "-",
                        input="---\n".join(dump(doc) for doc in render_all().values()))
        cluster.wait_established(doc["metadata"]["name"] for doc in render_all().values())
        say(f"operator and pod runner starting (logs in {workdir})")
        stack.start()
        say(f"kubectl apply -f {name}.yaml  (the embedded example fleet, engines on the SGLang simulator)")
        cluster.kubectl("apply", "--server-side", "--field-manager=demo-user", "-f", "-",
                        input=yaml.safe_dump(manifest))
        fleet = Fleet(cluster, namespace, name, manifest["spec"]["model"]["path"])
        _wait("the fleet to be Ready", lambda: (fleet.hs().get("status") or {}).get("ready") == "True", 180)
        say("fleet Ready:\n" + fleet.view())
        [deployment] = router_deployments(cluster, namespace, name)
        router = stack.router(namespace, deployment)
        _wait("the router to discover 4 healthy workers",
              lambda: sum(1 for w in router.workers() if w.get("is_healthy")) >= 4, 120)
        say(f"router at {router.url} discovered the leaders by label (Kubernetes service discovery)")

        results.append(_phase(router, "decode-heavy", fleet, args.phase_seconds,
                              prompt_tokens=256, output_tokens=256, concurrency=16))
        before = len(fleet.switches())
        results.append(_phase(router, "prefill-heavy", fleet, args.phase_seconds * 2,
                              prompt_tokens=24_000, output_tokens=4, concurrency=28))
        if len(fleet.switches()) == before:
            target = next(i for i in fleet.instances() if i["spec"]["role"] == "decode")
            inst = target["metadata"]["name"]
            say(f"no policy switch yet: the on-call path, `kubectl annotate hsi {inst} {SWITCH_ANNOTATION}=prefill`")
            cluster.kubectl("-n", namespace, "annotate", f"{INSTANCE_PLURAL}.{GROUP}", inst,
                            f"{SWITCH_ANNOTATION}=prefill", "--overwrite")
        _wait("a role switch to finish",
              lambda: any(s.get("outcome") != "InProgress" for s in fleet.switches()[before:]), 180, 2.0)
        results.append(_phase(router, "after the switch", fleet, args.phase_seconds / 2,
                              prompt_tokens=24_000, output_tokens=4, concurrency=28))
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
            f"  eval \"$(python -m hybridserving.devcluster env --name {args.cluster})\"\n"
            "  kubectl get hs,hsi -o wide          # printer columns: ready, prefill x/y, decode x/y, KV capacity\n"
            f"  hybridserving status {name}          # instances, roles, phases, capacity, recent switches\n"
            f"  kubectl describe hs {name}           # conditions and Events\n"
            f"  logs: {workdir}\n"
        )
        if args.keep:
            say("running; Ctrl-C to tear down")
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
        return 0 if failed == 0 else 1
    finally:
        # A second Ctrl-C (the terminal's first one reached the operator and the pod runner too;
        # they drain on their own) must not cut the teardown short: that would leave the control
        # plane running. Each process stop is bounded (SIGKILL after its grace).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        say("tearing down (Ctrl-C is ignored until it is done; it takes seconds)")
        stack.stop()
        cluster.down(quiet=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hybridserving.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", default="demo", help="name of the local cluster")
    ap.add_argument("--nodes", type=int, default=4, help="fake GPU nodes (8 GPUs each)")
    ap.add_argument("--phase-seconds", type=float, default=40.0, help="length of a traffic phase")
    ap.add_argument("--keep", action="store_true", help="leave it running until Ctrl-C")
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
