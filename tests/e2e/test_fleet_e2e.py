"""A fleet end to end on the local cluster: operator, pods, launchers, SGLang simulators, real router.

`examples/role-switch.yaml`, shrunk to one prefill and two decode instances and given the simulator's
knobs through `spec.engine.env`, is applied to a real control plane. The operator renders the fleet;
the pod runner (standing in for the kubelet on kwok's fake GPU nodes) runs each leader pod's launcher
and simulator at the pod IP; `smg` runs with the arguments of the operator's router Deployment and
discovers the leaders through the API. Then: requests split between prefill and decode with the
performance model's latencies; a crashed engine takes its pod out of the router and back; a launcher
killed outright is restarted and counted; a pod deleted under load finishes what it holds.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import signal
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import yaml

from hybridserving.core.perfmodel import PerformanceModel
from hybridserving.api.profiles import PROFILES
from hybridserving.devcluster.cluster import pid_alive
from hybridserving.devcluster import stack
from hybridserving.devcluster.stack import Router, launcher_url
from support.completions import complete, stream_completion
from support.polling import wait_for
from support.scrape import metric_sum

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAME = "dsv3-flex"
MODEL = "deepseek-ai/DeepSeek-V3"
TIME_SCALE = 1.0
STARTUP_SECONDS = 2.0  # weights "load" in 2 s instead of the model's relaunch time
PROMPT = "The quick brown fox jumps over the lazy dog. " * 90  # 4,050 bytes: 1,013 simulated tokens
PROMPT_TOKENS = 1013
OUTPUT_TOKENS = 32
# Seen by the client, TTFT also crosses the router and two more HTTP hops on a CPU shared with the
# control plane and the operator, so only the lower bound is behaviour (the simulator waits the
# model's time, it never answers early); how close to the model it stays is a benchmark's figure,
# printed here, since a loaded machine stretches every hop.
TPOT_FLOOR = 0.75  # decode steps keep their own clock: a batch of one never steps faster than this
# The pod runner probes every second; the pod's probe turns unready after 3 failures, the router
# reconciles on watch events within about a second.
UNREADY_WITHIN_S = 15
# The launcher waits this long before restarting a crashed engine, so an outage always outlasts the
# three failed probes (an engine back within three periods never leaves the router, as with a kubelet).
RESTART_BACKOFF_S = 5.0
# The router re-adds a worker it dropped on a later pass of its discovery (events, or every 60 s).
ROUTER_RESYNC_S = 75

stream = functools.partial(stream_completion, model=MODEL, prompt=PROMPT, max_tokens=OUTPUT_TOKENS)
ask = functools.partial(complete, model=MODEL, prompt=PROMPT, max_tokens=OUTPUT_TOKENS)


def fleet_manifest() -> dict:
    doc = yaml.safe_load((ROOT / "examples" / "role-switch.yaml").read_text())
    doc["spec"]["prefill"]["replicas"] = 1
    doc["spec"]["decode"]["replicas"] = 2
    doc["spec"]["engine"] = {"env": [
        {"name": "HYBRIDSERVING_SIM_PROFILE", "value": doc["spec"]["model"]["profile"]},
        {"name": "HYBRIDSERVING_SIM_GPU_TYPE", "value": doc["spec"]["hardware"]["gpuType"]},
        {"name": "HYBRIDSERVING_SIM_TIME_SCALE", "value": str(TIME_SCALE)},
        {"name": "HYBRIDSERVING_SIM_STARTUP_SECONDS", "value": str(STARTUP_SECONDS)},
        {"name": "HYBRIDSERVING_POLL_INTERVAL_S", "value": "0.2"},
        {"name": "HYBRIDSERVING_RESTART_BACKOFF_S", "value": str(RESTART_BACKOFF_S)},
    ]}
    return doc


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.load(resp)


def metrics_of(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        return resp.read().decode()


class Fleet:
    """The applied fleet as the tests see it: its leader pods, their engines, the router."""

    def __init__(self, cluster, namespace: str, router: Router) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.router = router

    def pods(self, role: str) -> list[dict]:
        out = self.cluster.kubectl("-n", self.namespace, "get", "pods", "-o", "json", "-l",
                                   f"hybridserving.io/name={NAME},hybridserving.io/role={role}")
        return [p for p in json.loads(out.stdout)["items"] if not p["metadata"].get("deletionTimestamp")]

    def pod(self, name: str) -> dict | None:
        out = self.cluster.kubectl("-n", self.namespace, "get", "pod", name, "-o", "json", check=False)
        return json.loads(out.stdout) if out.returncode == 0 else None

    @staticmethod
    def ready(pod: dict | None) -> bool:
        conditions = {c["type"]: c["status"] for c in (pod or {}).get("status", {}).get("conditions", [])}
        return conditions.get("Ready") == "True"

    @staticmethod
    def engine_url(pod: dict) -> str:
        return f"http://{pod['status']['podIP']}:30000"

    def router_workers(self) -> dict[str, str]:
        """URL → worker type of the healthy workers the router holds."""
        workers = httpx.get(self.router.url + "/workers", headers=self.router.headers, timeout=5).json()["workers"]
        return {w["url"]: w["worker_type"] for w in workers if w.get("is_healthy")}

    def serving(self) -> bool:
        """Every leader ready and registered with the router under its role."""
        want = {self.engine_url(p): role for role in ("prefill", "decode") for p in self.pods(role) if self.ready(p)}
        counts = {role: len(self.pods(role)) for role in ("prefill", "decode")}
        return counts == {"prefill": 1, "decode": 2} and len(want) == 3 and self.router_workers() == want


@pytest.fixture(scope="module")
def fleet(local_cluster, fleet_operator, pod_runner):
    """The fleet applied, its engines running, the router discovering all three leaders."""
    namespace = "fleet-e2e"
    local_cluster.kubectl("create", "namespace", namespace)
    local_cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(fleet_manifest()))
    wait_for(lambda: stack.router_deployments(local_cluster, namespace, NAME), 60,
             "the operator to render the router Deployment")
    yield namespace
    local_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture
def serving_fleet(local_cluster, fleet, discovering_router) -> Fleet:
    started = time.monotonic()
    [router] = stack.router_deployments(local_cluster, fleet, NAME)
    f = Fleet(local_cluster, fleet, discovering_router(fleet, router))
    wait_for(f.serving, 120, "three ready leaders registered with the router")
    print(f"fleet serving {time.monotonic() - started:.1f} s after the router started")
    return f


def test_requests_split_between_prefill_and_decode_pods_with_model_latencies(serving_fleet: Fleet):
    f = serving_fleet
    prefill_urls = [f.engine_url(p) for p in f.pods("prefill")]
    decode_urls = [f.engine_url(p) for p in f.pods("decode")]
    before = {u: metrics_of(u) for u in prefill_urls + decode_urls}
    model = PerformanceModel.for_role(PROFILES["deepseek-v3"], tp=8, time_scale=TIME_SCALE,
                                      gpu=fleet_manifest()["spec"]["hardware"]["gpuType"])
    expected_ttft = model.prefill_seconds(PROMPT_TOKENS) + model.transfer_seconds(PROMPT_TOKENS)
    expected_tpot = sum(model.decode_step_seconds(1, PROMPT_TOKENS + k) for k in range(1, OUTPUT_TOKENS)) / (
        OUTPUT_TOKENS - 1)

    # One request first: the router's first request to a newly discovered worker pays for its
    # connections and health bookkeeping (a health check of SGLang's /health takes a second,
    # entrypoints/http_server.py:720-797), which is no part of the engine's latency.
    stream(f.router.url, headers=f.router.headers, chat=False)
    for chat in (False, True):
        ttft, arrivals, text = stream(f.router.url, headers=f.router.headers, chat=chat)
        assert text.split() == [f"tok{i}" for i in range(OUTPUT_TOKENS)]
        assert ttft >= expected_ttft * 0.95, f"TTFT {ttft:.3f} s, model {expected_ttft:.3f} s"
        tpot = (arrivals[-1] - arrivals[0]) / (OUTPUT_TOKENS - 1)
        assert tpot >= expected_tpot * TPOT_FLOOR, f"TPOT {tpot * 1000:.2f} ms, model {expected_tpot * 1000:.2f} ms"
        print(f"{'chat' if chat else 'completion'}: TTFT {ttft * 1000:.0f} ms (model {expected_ttft * 1000:.0f}), "
              f"TPOT {tpot * 1000:.1f} ms (model {expected_tpot * 1000:.1f})")

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: ask(f.router.url, headers=f.router.headers, chat=i % 2 == 1), range(8)))
    assert all(a["usage"]["completion_tokens"] == OUTPUT_TOKENS for a in answers)

    requests = 11  # the warm-up, two measured streams and eight concurrent requests

    def delta(urls: list[str], name: str, **labels: str) -> float:
        return sum(metric_sum(metrics_of(u), name, **labels) - metric_sum(before[u], name, **labels) for u in urls)

    realtime = "sglang:realtime_tokens_total"
    # Every prompt was computed on the prefill pod (chat templates add a few tokens) and nothing decoded
    # there; the decode pods the reverse.
    computed = delta(prefill_urls, realtime, mode="prefill_compute")
    assert requests * PROMPT_TOKENS <= computed <= requests * (PROMPT_TOKENS + 8)
    assert delta(decode_urls, "sglang:prompt_tokens_total") == computed
    assert delta(prefill_urls, realtime, mode="decode") == 0
    assert delta(decode_urls, realtime, mode="prefill_compute") == 0
    assert delta(decode_urls, realtime, mode="decode") == requests * (OUTPUT_TOKENS - 1)
    assert delta(decode_urls, "sglang:generation_tokens_total") == requests * OUTPUT_TOKENS
    assert delta(prefill_urls, "sglang:num_requests_total") == requests
    assert delta(decode_urls, "sglang:num_requests_total") == requests
    assert delta(prefill_urls, "sglang:num_bootstrap_failed_reqs_total") == 0
    assert delta(decode_urls, "sglang:num_transfer_failed_reqs_total") == 0


def test_crashed_engine_leaves_the_router_and_comes_back(serving_fleet: Fleet):
    f = serving_fleet
    pod = f.pods("decode")[0]
    name, url = pod["metadata"]["name"], f.engine_url(pod)
    httpx.post(url + "/sim/faults", json={"crash": True}, timeout=5)
    crashed = time.monotonic()
    wait_for(lambda: not f.ready(f.pod(name)), UNREADY_WITHIN_S, f"{name} to turn unready")
    unready = time.monotonic() - crashed
    wait_for(lambda: url not in f.router_workers(), UNREADY_WITHIN_S, f"the router to drop {url}")
    dropped = time.monotonic() - crashed
    # Meanwhile the other decode pod serves.
    assert ask(f.router.url, headers=f.router.headers)["usage"]["completion_tokens"] == OUTPUT_TOKENS
    wait_for(lambda: f.ready(f.pod(name)), 30, f"{name} to be ready again")
    ready_again = time.monotonic() - crashed
    wait_for(lambda: f.router_workers().get(url) == "decode", ROUTER_RESYNC_S, f"the router to take {url} back")
    print(f"engine crash: unready after {unready:.1f} s, dropped by the router after {dropped:.1f} s, "
          f"ready again after {ready_again:.1f} s, back in the router after {time.monotonic() - crashed:.1f} s")
    # The launcher restarted its engine; the container itself never exited.
    assert f.pod(name)["status"]["containerStatuses"][0]["restartCount"] == 0
    assert ask(f.router.url, headers=f.router.headers, chat=True)["usage"]["completion_tokens"] == OUTPUT_TOKENS


def test_killed_launcher_is_restarted_and_counted(serving_fleet: Fleet):
    f = serving_fleet
    pod = f.pods("decode")[-1]
    name, url = pod["metadata"]["name"], f.engine_url(pod)
    engine_pid = get_json(launcher_url(pod) + "/status")["engine"]["pid"]
    with open(f"/proc/{engine_pid}/stat") as fh:
        launcher_pid = int(fh.read().rpartition(")")[2].split()[1])
    os.kill(launcher_pid, signal.SIGKILL)
    wait_for(lambda: f.pod(name)["status"]["containerStatuses"][0]["restartCount"] == 1, 30,
             f"{name}'s restart to be counted")
    wait_for(lambda: f.ready(f.pod(name)) and f.router_workers().get(url) == "decode", ROUTER_RESYNC_S,
             f"{name} to come back into the router")
    status = f.pod(name)["status"]["containerStatuses"][0]
    assert status["lastState"]["terminated"]["exitCode"] == 128 + signal.SIGKILL
    # Nothing of the killed container survives: its engine went with it.
    assert not pid_alive(engine_pid)


def test_pod_deleted_under_load_finishes_its_requests(serving_fleet: Fleet):
    f = serving_fleet
    decodes = {f.engine_url(p): p for p in f.pods("decode")}
    long_output = 256

    def busiest() -> tuple[str, float] | None:
        # The victim is whichever decode pod the router gave work to: after the crash test the
        # pod that crashed may still be out of routing, waiting to turn Ready again.
        running = {u: metric_sum(metrics_of(u), "sglang:num_running_reqs") for u in decodes}
        url = max(running, key=running.__getitem__)
        return (url, running[url]) if running[url] > 0 else None

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(stream, f.router.url, headers=f.router.headers, chat=i % 2 == 1,
                               max_tokens=long_output) for i in range(8)]
        url, held = wait_for(busiest, 10, "requests running on a decode pod")
        victim = decodes[url]
        name, uid = victim["metadata"]["name"], victim["metadata"]["uid"]
        f.cluster.kubectl("-n", f.namespace, "delete", "pod", name, "--wait=false")
        results = [fut.result() for fut in futures]
    for _, arrivals, text in results:
        assert len(arrivals) == long_output
        assert text.split() == [f"tok{i}" for i in range(long_output)]
    print(f"deleted {name} holding {held:.0f} running request(s); all 8 streams completed")
    # The operator replaces the pod (same name, new uid) and it rejoins the router.
    wait_for(lambda: (p := f.pod(name)) is not None and p["metadata"]["uid"] != uid and f.ready(p), 90,
             f"a new {name} to be ready")
    wait_for(f.serving, 60, "the fleet to serve with the replacement pod")
