"""A change prefill and decode must agree on, rolled as a canary under client load through the real routers.

A fleet of two prefill and two decode instances (`examples/role-switch.yaml` on the SGLang
simulator, role switching off) changes its page size: SGLang's decode side refuses a prefill with
another page size and its server dies of it (`core.pairing`; the simulator does the same), so the
old and the new configuration must never be paired. The change rolls as a canary of one instance
per role, holds, resumes, and is rolled back with `hybridserving rollback`, while closed-loop
clients keep sending through the fleet's router Service: the pod runner runs the router pods the
operator's Deployments create (smg, with their readiness probes), and `support.router_service`
sends each request to one of the Service's ready endpoints as kube-proxy would.

Counted: every request answered; both configurations serving while the canary holds; every worker
every ready router listed, sampled twice a second, a pod of the router's own pairing key; no engine
log with a page-size mismatch (the decode server that met one would have died of it).

The second test rolls the same change on one prefill and one decode with `maxSurge: 1` and
`maxUnavailable: 0`: without surge no compatible pair can outlive the roll of a lone instance;
with it the new configuration has its pair before the old one loses anything, and no request
fails or finds no router.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from hybridserving.contract import CONFIG_HASH_FILE_NAME, HALF_HASH, role_document_name
from hybridserving.devcluster import stack
from support.polling import wait_for
from support.router_service import RouterService
from support.served_fleet import ROOT, SHORT_PROMPT, Load, manifest, tear_down

NAME = "canary"
NAMESPACE = "canary-rollout"


def status(cluster, namespace: str = NAMESPACE, name: str = NAME) -> dict[str, Any]:
    obj = json.loads(cluster.kubectl("-n", namespace, "get", "hybridserving", name, "-o", "json").stdout)
    out: dict[str, Any] = obj.get("status") or {}
    out["_current"] = out.get("observedGeneration") == obj["metadata"]["generation"]
    return out


def routers(cluster, namespace: str = NAMESPACE, name: str = NAME) -> list[str]:
    return stack.router_deployments(cluster, namespace, name)


def mismatches(pods_dir, namespace: str = NAMESPACE) -> list[str]:
    return [f"{log.parent.name}: {line.strip()[:200]}" for log in pods_dir.glob(f"{namespace}_*/*.log")
            for line in log.read_text(errors="replace").splitlines() if "mismatch" in line]


def leader_of(cluster, key: str, role: str) -> dict[str, Any]:
    """A leader pod of the fleet on pairing key `key`, annotated with `role`."""
    pods = json.loads(cluster.kubectl("-n", NAMESPACE, "get", "pods", "-o", "json", "-l",
                                      f"hybridserving.io/name={NAME},hybridserving.io/leader=true,"
                                      f"hybridserving.io/pairing-key={key}").stdout)["items"]
    return next(p for p in pods if p["metadata"]["annotations"].get("hybridserving.io/role") == role)


def configmap_documents(cluster, role: str) -> dict[str, Any]:
    """The role documents by hash the fleet's ConfigMap holds for `role` (`<role>.json` aside)."""
    data = json.loads(cluster.kubectl("-n", NAMESPACE, "get", "configmap", f"{NAME}-{role}-config", "-o",
                                      "json").stdout)["data"]
    return {k: json.loads(v) for k, v in data.items() if k.startswith(f"{role}-")}


def pod_document(pods_dir, pod: dict[str, Any]) -> dict[str, Any]:
    """The document a pod's launcher starts from: the one its downward-API config-hash names, as
    the pod runner projected the pod's volumes."""
    meta = pod["metadata"]
    volumes = pods_dir / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}" / "volumes"
    role = (volumes / "podinfo" / "role").read_text()
    config_hash = (volumes / "podinfo" / CONFIG_HASH_FILE_NAME).read_text()
    flags_half = config_hash[HALF_HASH:]
    document: dict[str, Any] = json.loads((volumes / "config" / role_document_name(role, flags_half)).read_text())
    return document


def test_an_incompatible_change_rolls_as_a_canary_holds_resumes_and_rolls_back_without_mixing(
        local_cluster, fleet_operator, pod_runner) -> None:
    doc = manifest(NAME, backend="mooncake", time_scale=0.5, startup_seconds=2.0)
    doc["spec"]["prefill"]["replicas"] = 2
    doc["spec"]["roleSwitch"]["enabled"] = False
    local_cluster.kubectl("create", "namespace", NAMESPACE)
    local_cluster.kubectl("-n", NAMESPACE, "apply", "-f", "-", input=json.dumps(doc))
    wait_for(lambda: routers(local_cluster), 60, "the router Deployment")
    wait_for(lambda: stack.secret_value(local_cluster, NAMESPACE, f"{NAME}-engine-key", "api-key"), 60,
             "the fleet's engine key")
    service = RouterService(local_cluster, NAMESPACE, NAME)
    timeline: list[str] = []
    started = time.monotonic()

    def mark(what: str) -> None:
        timeline.append(f"{time.monotonic() - started:6.1f} s  {what} (requests ok so far: {load.ok})")

    try:
        [first] = routers(local_cluster)
        old_key = first.rsplit("-", 1)[1]
        wait_for(lambda: status(local_cluster).get("ready") == "True" and service.ready_keys() == {old_key}
                 and service.serving(), 240, "the fleet Ready behind its router")
        load = Load(service, 3, SHORT_PROMPT, 32, "steady load (1K-token prompts, 32 tokens out)")  # type: ignore[arg-type]
        wait_for(lambda: load.ok >= 5, 60, "requests flowing")
        mark("serving on the first configuration")

        # 1. The incompatible change, as a canary of one instance per role: it holds with both keys routed.
        patch = {"spec": {"prefill": {"pageSize": 64}, "decode": {"pageSize": 64}, "rollout": {"canary": 1}}}
        local_cluster.kubectl("-n", NAMESPACE, "patch", "hybridserving", NAME, "--type=merge", "-p", json.dumps(patch))
        wait_for(lambda: len(routers(local_cluster)) == 2, 60, "a router for the new pairing key")
        new_key = next(r for r in routers(local_cluster) if r != first).rsplit("-", 1)[1]

        def held() -> bool:
            s = status(local_cluster)
            rollout = s.get("rollout") or {}
            return bool(s["_current"] and rollout.get("held") == "Canary"
                        and rollout.get("updated") == {"prefill": 1, "decode": 1}
                        and service.ready_keys() == {old_key, new_key})

        wait_for(held, 300, "the canary held, both configurations routed", interval=1)
        mark("canary held: one instance per role on the new page size")
        at_hold = dict(service.picks)
        wait_for(lambda: all(service.picks[k] >= at_hold.get(k, 0) + 10 for k in (old_key, new_key)), 120,
                 "both configurations taking requests while held")
        during_hold = {k: service.picks[k] - at_hold.get(k, 0) for k in (old_key, new_key)}
        assert routers(local_cluster) == sorted([first, f"{NAME}-router-{new_key}"]), "held: nothing retires"
        mark(f"held: requests to the old key {during_hold[old_key]}, to the new key {during_hold[new_key]}")

        # Each pod finds its own configuration's document where its launcher starts the engine from
        # (docs/engine.md): an old-key engine restarting while held keeps page size 1.
        for role in ("prefill", "decode"):
            documents = configmap_documents(local_cluster, role)
            assert len(documents) == 2, f"held: both {role} documents kept, found {sorted(documents)}"
            for key in (old_key, new_key):
                argv = pod_document(pod_runner, leader_of(local_cluster, key, role))["argv"]
                page_size = dict(zip(argv, argv[1:], strict=False)).get("--page-size")
                assert (page_size == "64") == (key == new_key), (role, key, argv)

        # 2. Resume: the rest rolls; the old key's router retires before its last pair goes.
        local_cluster.kubectl("-n", NAMESPACE, "patch", "hybridserving", NAME, "--type=merge", "-p",
                              json.dumps({"spec": {"rollout": {"canary": None}}}))

        def settled_on(key: str) -> bool:
            s = status(local_cluster)
            rollout = s.get("rollout") or {}
            return bool(s["_current"] and s.get("ready") == "True" and not rollout.get("held")
                        and rollout.get("updated") == {"prefill": 2, "decode": 2}
                        and routers(local_cluster) == [f"{NAME}-router-{key}"] and service.ready_keys() == {key})

        wait_for(lambda: settled_on(new_key), 400, "the roll completed on the new key", interval=1)
        wait_for(lambda: all(len(configmap_documents(local_cluster, role)) == 1 for role in ("prefill", "decode")),
                 60, "the old documents gone with the last pods that ran them")
        mark("resumed: every instance on the new page size, one router")
        wait_for(lambda: service.picks[new_key] >= at_hold.get(new_key, 0) + during_hold[new_key] + 20, 60,
                 "requests after the roll")

        # 3. Roll back with the CLI: the first configuration, its pairing key and its router come back.
        out = subprocess.run([sys.executable, "-m", "hybridserving.cli", "rollback", NAME, "-n", NAMESPACE,
                              "--kubeconfig", str(local_cluster.kubeconfig)],
                             capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
        assert out.returncode == 0, out.stdout + out.stderr
        wait_for(lambda: settled_on(old_key), 400, "the rollback completed on the first key", interval=1)
        mark("rolled back: every instance on the first configuration, its router back")
        after = service.picks[old_key]
        wait_for(lambda: service.picks[old_key] >= after + 20, 60, "requests after the rollback")
        load.stop()
        mark("load stopped")

        print(f"\n[{NAMESPACE}] page size 1 -> 64 (canary 1 per role, held, resumed) -> rolled back; {load}")
        print("\n".join(f"  {line}" for line in timeline))
        print("  the router Service's ready endpoints:\n" + "\n".join(f"    {line}" for line in service.events))
        print(f"  requests that found no ready router, by second: {dict(service.no_router)}")
        print(f"  requests by router pairing key: {dict(service.picks)} (old {old_key}, new {new_key})")
        print(f"  router audits: {service.audit.samples} samples, {service.audit.workers_seen} workers listed, "
              f"{len(service.audit.foreign)} of another key "
              f"({service.audit.momentary} for a moment at a freed address, {len(service.audit.draining)} "
              "while smg drained them)")
        if service.audit.draining:
            print(f"  e.g. {service.audit.draining[0]}")
        found = mismatches(pod_runner)
        print(f"  engine logs with a page-size or KV-dtype mismatch: {len(found)}")
        assert not load.failures, load.failures[:5]
        assert service.audit.samples > 100 and service.audit.workers_seen > 0
        assert not service.audit.foreign, service.audit.foreign[:5]
        assert not found, found[:5]
        assert all(during_hold[k] >= 10 for k in during_hold), during_hold
    finally:
        service.stop()
        tear_down(local_cluster, NAMESPACE)


def test_one_instance_per_role_rolls_an_incompatible_change_with_surge_and_no_gap(
        local_cluster, fleet_operator, pod_runner) -> None:
    name, namespace = "surge", "surge-rollout"
    doc = manifest(name, backend="mooncake", time_scale=0.5, startup_seconds=2.0)
    doc["spec"]["decode"]["replicas"] = 1
    doc["spec"]["roleSwitch"]["enabled"] = False
    doc["spec"]["rollout"] = {"maxUnavailable": 0, "maxSurge": 1}
    local_cluster.kubectl("create", "namespace", namespace)
    local_cluster.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(doc))
    wait_for(lambda: routers(local_cluster, namespace, name), 60, "the router Deployment")
    wait_for(lambda: stack.secret_value(local_cluster, namespace, f"{name}-engine-key", "api-key"), 60,
             "the fleet's engine key")
    service = RouterService(local_cluster, namespace, name)
    try:
        [first] = routers(local_cluster, namespace, name)
        old_key = first.rsplit("-", 1)[1]
        wait_for(lambda: status(local_cluster, namespace, name).get("ready") == "True"
                 and service.ready_keys() == {old_key} and service.serving(), 240, "the fleet Ready behind its router")
        load = Load(service, 3, SHORT_PROMPT, 32, "steady load (1K-token prompts, 32 tokens out)")  # type: ignore[arg-type]
        wait_for(lambda: load.ok >= 5, 60, "requests flowing")
        patch = {"spec": {"prefill": {"pageSize": 64}, "decode": {"pageSize": 64}}}
        local_cluster.kubectl("-n", namespace, "patch", "hybridserving", name, "--type=merge", "-p", json.dumps(patch))
        most: dict[str, int] = {}
        messages: list[str] = []

        def settled() -> bool:
            s = status(local_cluster, namespace, name)
            instances = json.loads(local_cluster.kubectl("-n", namespace, "get", "hybridservinginstances",
                                                         "-o", "json").stdout)["items"]
            for role in ("prefill", "decode"):
                most[role] = max(most.get(role, 0), sum(1 for i in instances if i["spec"]["role"] == role))
            message = (s.get("rollout") or {}).get("message", "")
            if message and (not messages or messages[-1] != message):
                messages.append(message)
            keys = {r.rsplit("-", 1)[1] for r in routers(local_cluster, namespace, name)}
            return bool(s["_current"] and s.get("ready") == "True" and len(instances) == 2
                        and (s.get("rollout") or {}).get("updated") == {"prefill": 1, "decode": 1}
                        and len(keys) == 1 and keys != {old_key} and service.ready_keys() == keys)

        wait_for(settled, 400, "the roll completed with the surge instances gone", interval=1)
        new_key = service.ready_keys().pop()
        after = service.picks[new_key]
        wait_for(lambda: service.picks[new_key] >= after + 20, 60, "requests after the roll")
        load.stop()
        print(f"\n[{namespace}] 1 prefill + 1 decode, page size 1 -> 64 with maxSurge 1, maxUnavailable 0; {load}")
        print(f"  most instances per role during the roll: {most}")
        print("  rollout messages:\n" + "\n".join(f"    {m}" for m in messages))
        print("  the router Service's ready endpoints:\n" + "\n".join(f"    {line}" for line in service.events))
        print(f"  requests that found no ready router, by second: {dict(service.no_router)}")
        print(f"  requests by router pairing key: {dict(service.picks)} (old {old_key}, new {new_key})")
        print(f"  router audits: {service.audit.samples} samples, {len(service.audit.foreign)} workers of another key")
        found = mismatches(pod_runner, namespace)
        print(f"  engine logs with a page-size or KV-dtype mismatch: {len(found)}")
        assert most == {"prefill": 2, "decode": 2}, most
        assert not load.failures, load.failures[:5]
        assert not service.no_router, dict(service.no_router)
        assert not service.audit.foreign, service.audit.foreign[:5]
        assert not found, found[:5]
        assert any("surge" in m for m in messages), messages
    finally:
        service.stop()
        tear_down(local_cluster, namespace)
