"""Weights filled once per node from a hub on loopback, through the operator, scheduler and pod runner.

A fleet of one prefill and one decode instance is pinned (through its pod template) to two
fake nodes; its weights come from `hf://` with `cache: Node` and the hub token from a
Secret. The hub counts every file it serves, so the test can show: one download per node,
none for a restarted pod or a role switch, a token that reached the fill step (the hub
refused nothing) yet appears in no object the operator wrote, and a failed download that
is reported in status and Events while the other instance keeps serving. A throttled hub
shows the download's progress in status while it runs: the operator reads it from the fill
steps through the pods' launcher ports.
"""

from __future__ import annotations

import json
import secrets
import shutil

import pytest
import yaml

from hybridserving.core import weights as core_weights
from support.fakehub import FakeHub
from support.polling import wait_for
from support.served_fleet import ROOT

NAME = "dsv3-weights"
REPO = "deepseek-ai/DeepSeek-V3"
NODES = ["gpu-node-6", "gpu-node-7"]
FILES = {"config.json": b'{"architectures": ["DeepseekV3ForCausalLM"]}',
         "model-00001-of-00002.safetensors": b"\x01" * 400_000,
         "model-00002-of-00002.safetensors": b"\x02" * 200_000}


def manifest(endpoint: str) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / "role-switch.yaml").read_text())
    doc["metadata"]["name"] = NAME
    doc["spec"]["prefill"]["replicas"] = 1
    doc["spec"]["decode"]["replicas"] = 1
    # The test moves the only prefill instance to decode through an on-call switch: no floor forbids it.
    doc["spec"]["roleSwitch"].update(minPrefill=0, minDecode=0)
    doc["spec"]["model"]["weights"] = {"uri": f"hf://{REPO}", "cache": "Node", "endpoint": endpoint,
                                       "tokenSecretRef": {"name": "hub-token", "key": "HF_TOKEN"}}
    doc["spec"]["engine"] = {"env": [
        {"name": "HYBRIDSERVING_SIM_PROFILE", "value": "deepseek-v3"},
        {"name": "HYBRIDSERVING_SIM_STARTUP_SECONDS", "value": "1"},
        {"name": "HYBRIDSERVING_POLL_INTERVAL_S", "value": "0.2"},
    ]}
    doc["spec"]["podTemplate"] = {"spec": {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": NODES}]}]}}}}}
    return doc


class View:
    def __init__(self, cluster, namespace: str) -> None:
        self.cluster, self.ns = cluster, namespace

    def get(self, *what: str) -> dict:
        return json.loads(self.cluster.kubectl("-n", self.ns, "get", *what, "-o", "json").stdout)

    def leaders(self) -> dict[str, dict]:
        pods = self.get("pods", "-l", f"hybridserving.io/name={NAME},hybridserving.io/leader=true")["items"]
        return {p["metadata"]["name"]: p for p in pods if not p["metadata"].get("deletionTimestamp")}

    @staticmethod
    def ready(pod: dict) -> bool:
        """Ready after its weights step ran: kwok marks a new pod Ready before the pod runner starts it,
        and only the runner writes the fill's outcome (its termination message)."""
        status = pod.get("status", {})
        filled = any(s["name"] == core_weights.FILL_CONTAINER
                     and (s.get("state") or {}).get("terminated", {}).get("message")
                     for s in status.get("initContainerStatuses") or [])
        return filled and any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))

    def all_ready(self) -> bool:
        pods = self.leaders()
        return len(pods) == 2 and all(self.ready(p) for p in pods.values())

    def weights_status(self) -> dict:
        return (self.get("hybridserving", NAME).get("status") or {}).get("weights") or {}


@pytest.fixture
def hub_fleet(request, local_cluster, fleet_operator, pod_runner, tmp_path):
    """The fleet on a hub of its own; an indirect parameter throttles the hub (bytes per second)."""
    ns = f"w-{secrets.token_hex(4)}"
    token = f"hf_{secrets.token_hex(16)}"
    local_cluster.kubectl("create", "namespace", ns)
    local_cluster.kubectl("-n", ns, "create", "secret", "generic", "hub-token", f"--from-literal=HF_TOKEN={token}")
    with FakeHub({REPO: FILES}, token=token, bytes_per_second=getattr(request, "param", None)) as hub:
        doc = manifest(hub.endpoint)
        doc["metadata"]["namespace"] = ns
        local_cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))
        try:
            yield View(local_cluster, ns), hub, token, pod_runner
        finally:
            local_cluster.kubectl("-n", ns, "delete", "hybridserving", NAME, "--wait=true", "--timeout=90s",
                                  check=False)
            local_cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
            for node in NODES:
                shutil.rmtree(pod_runner / "nodes" / node, ignore_errors=True)


def per_file() -> set[tuple[str, str]]:
    return {(REPO, name) for name in FILES}


def test_weights_come_once_per_node_and_restarts_and_switches_reuse_them(hub_fleet, local_cluster) -> None:
    view, hub, token, state = hub_fleet
    wait_for(view.all_ready, timeout=180, what="both instances Ready with their weights")
    assert hub.refused == 0, "the token from the Secret reached the fill step"
    assert dict(hub.downloads) == {key: 2 for key in per_file()}, "one download per node"
    nodes = sorted(p["spec"]["nodeName"] for p in view.leaders().values())
    assert nodes == NODES
    wait_for(lambda: view.weights_status().get("nodesReady") == 2, timeout=30, what="status.weights")
    status = view.weights_status()
    assert status["bytes"] == sum(map(len, FILES.values())) and status["nodesFailed"] == 0
    for node in NODES:
        cached = state / "nodes" / node / "var/lib/hybridserving/models"
        (copy,) = [d for d in cached.iterdir() if d.is_dir()]
        assert (copy / "model-00001-of-00002.safetensors").read_bytes() == FILES["model-00001-of-00002.safetensors"]

    # A restart: the pod is recreated on its node (the only one with room) and finds the copy.
    leaders = view.leaders()
    victim = next(n for n, p in leaders.items() if p["metadata"]["labels"].get("hybridserving.io/role") == "prefill")
    old_uid = leaders[victim]["metadata"]["uid"]
    local_cluster.kubectl("-n", view.ns, "delete", "pod", victim, "--wait=false")
    wait_for(lambda: victim in view.leaders() and view.leaders()[victim]["metadata"]["uid"] != old_uid
             and view.all_ready(), timeout=120, what="restarted pod Ready")
    fill = next(s for s in view.leaders()[victim]["status"]["initContainerStatuses"]
                if s["name"] == core_weights.FILL_CONTAINER)
    assert json.loads(fill["state"]["terminated"]["message"])["downloaded"] is False
    assert dict(hub.downloads) == {key: 2 for key in per_file()}, "no second download after a restart"

    # A role switch (an on-call request, drained and verified like the policy's): the engine switches
    # on the same pods, so nothing downloads.
    instance = victim.rsplit("-", 1)[0]
    local_cluster.kubectl("-n", view.ns, "annotate", "hybridservinginstance", instance,
                          "hybridserving.io/switch-to=decode")
    wait_for(lambda: view.leaders()[victim]["metadata"]["labels"].get("hybridserving.io/role") == "decode"
             and view.all_ready(), timeout=300, what="switched instance Ready")
    assert dict(hub.downloads) == {key: 2 for key in per_file()}, "no download for a role switch"

    # The token is only in its Secret: no object the operator wrote holds it.
    dump = local_cluster.kubectl(
        "-n", view.ns, "get",
        "pods,services,configmaps,events,deployments,serviceaccounts,roles,rolebindings,poddisruptionbudgets,"
        "hybridservings,hybridservinginstances", "-o", "json").stdout
    assert json.loads(dump)["items"], "objects were read"
    assert token not in dump


def test_a_failed_download_is_reported_and_the_other_instance_keeps_serving(hub_fleet, local_cluster) -> None:
    view, hub, token, state = hub_fleet
    wait_for(view.all_ready, timeout=180, what="both instances Ready with their weights")
    leaders = view.leaders()
    victim, survivor = sorted(leaders, key=lambda n: leaders[n]["spec"]["nodeName"])
    survivor_uid = leaders[survivor]["metadata"]["uid"]
    node = leaders[victim]["spec"]["nodeName"]
    shutil.rmtree(state / "nodes" / node)  # the node lost its copy (a replaced disk)
    hub.failing = True
    local_cluster.kubectl("-n", view.ns, "delete", "pod", victim, "--wait=false")
    wait_for(lambda: view.weights_status().get("nodesFailed", 0) >= 1, timeout=90, what="failure in status")
    status = view.weights_status()
    assert "503 from the hub" in " ".join(status["errors"]) and node in " ".join(status["errors"])
    events = view.get("events", "--field-selector", "reason=WeightsFailed")["items"]
    assert events and "running instances keep serving" in events[0]["message"]
    assert token not in json.dumps(events)
    # The survivor is the same pod (never restarted) and Ready; its Ready condition is written by the
    # pod runner's probe and kwok, so it is read until both agree rather than at one instant.
    pods = wait_for(lambda: (lambda p: p if view.ready(p[survivor]) else None)(view.leaders()), timeout=60,
                    what="the surviving instance Ready")
    assert pods[survivor]["metadata"]["uid"] == survivor_uid
    assert not view.ready(pods[victim])
    hub.failing = False
    wait_for(view.all_ready, timeout=120, what="the retried fill succeeds")
    assert dict(hub.downloads) == {key: 3 for key in per_file()}, "only the node that lost its copy downloaded"


# About 15 s per node for FILES: long enough for the operator to read the progress mid-way
# (it looks every 5 s while a node fills), short enough to keep the test quick.
THROTTLE_BYTES_PER_SECOND = 40_000


@pytest.mark.parametrize("hub_fleet", [THROTTLE_BYTES_PER_SECOND], indirect=True)
def test_status_shows_the_download_progress_while_it_runs(hub_fleet) -> None:
    view, hub, token, state = hub_fleet
    copy = sum(map(len, FILES.values()))
    config = 2 * len(FILES["config.json"])  # the first file, on both nodes: the weight files come after
    during = wait_for(lambda: (lambda w: w if w.get("bytesTotal") and config < w.get("bytesDone", 0) < w["bytesTotal"]
                               else None)(view.weights_status()), timeout=120, interval=0.5,
                      what="status.weights with the weight files part-way")
    assert during["nodesFilling"] >= 1 and during["nodesReady"] < 2
    assert during["bytesTotal"] % copy == 0, "one copy per node the figure covers"
    wait_for(view.all_ready, timeout=180, what="both instances Ready with their weights")
    after = wait_for(lambda: (lambda w: w if w.get("nodesReady") == 2 else None)(view.weights_status()),
                     timeout=30, what="status.weights complete")
    assert (after["bytesDone"], after["bytesTotal"], after["nodesFilling"]) == (2 * copy, 2 * copy, 0)
