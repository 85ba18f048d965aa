"""The real router (smg 1.13.0) in front of one prefill and one decode engine pod, all on 127.0.0.1.

Checks what production depends on: smg takes the simulator for SGLang 0.5.23 and injects the
bootstrap room into both halves of each request; the prefill work lands on the prefill instance
and the decode work on the decode instance; TTFT and TPOT seen through the router are never
shorter than the performance model's (how much longer depends on the machine: a benchmark's figure).
"""

from __future__ import annotations

import functools
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from hybridserving.api.v1alpha1 import DEFAULT_GPU_TYPE
from hybridserving.core.perfmodel import PerformanceModel
from hybridserving.api.profiles import PROFILES
from hybridserving.core.router import WORKER_FLAGS
from support.completions import stream_completion
from support.polling import wait_for
from support.scrape import metric_sum

TIME_SCALE = 1.0
PROMPT = "The quick brown fox jumps over the lazy dog. " * 90  # 4,050 bytes: 1,013 simulated tokens
PROMPT_TOKENS = 1013
OUTPUT_TOKENS = 32
# Behaviour, not speed: the simulator takes at least the model's time for prefill, transfer and
# each decode step (a simulator that skipped its waits would serve instantly), and the client
# sees the first token no earlier than the engine produced it. How close to the model the
# figures come depends on how busy the machine is, so the test bounds them from below only
# and prints them (pytest -s); a timed upper bound would fail on a loaded machine.
MODEL_FLOOR = 0.95
TPOT_FLOOR = 0.75

stream = functools.partial(stream_completion, model="glm-5.2", prompt=PROMPT, max_tokens=OUTPUT_TOKENS, timeout=60)


def test_requests_through_smg_split_prefill_and_decode_work_at_no_less_than_model_latencies(engine_pod, smg_router):
    prefill = engine_pod("prefill", time_scale=TIME_SCALE)
    decode = engine_pod("decode", time_scale=TIME_SCALE)
    router = smg_router(prefill, decode)
    model = PerformanceModel.for_role(PROFILES["glm-5.2"], tp=8, time_scale=TIME_SCALE, gpu=DEFAULT_GPU_TYPE)

    # TTFT and TPOT of single streaming requests on idle instances.
    expected_ttft = model.prefill_seconds(PROMPT_TOKENS) + model.transfer_seconds(PROMPT_TOKENS)
    expected_tpot = sum(model.decode_step_seconds(1, PROMPT_TOKENS + k) for k in range(1, OUTPUT_TOKENS)) / (
        OUTPUT_TOKENS - 1)
    client_ttfts: list[float] = []
    for chat in (False, True):
        ttft, arrivals, text = stream(router, chat=chat)
        assert len(arrivals) == OUTPUT_TOKENS
        assert text.split() == [f"tok{i}" for i in range(OUTPUT_TOKENS)]
        tpot = (arrivals[-1] - arrivals[0]) / (OUTPUT_TOKENS - 1)
        print(f"client TTFT {ttft:.3f} s (model {expected_ttft:.3f} s), TPOT {tpot * 1000:.2f} ms "
              f"(model {expected_tpot * 1000:.2f} ms), chat={chat}")
        assert ttft >= expected_ttft * MODEL_FLOOR, f"TTFT {ttft:.3f} s below the model's {expected_ttft:.3f} s"
        assert tpot >= expected_tpot * TPOT_FLOOR, (
            f"TPOT {tpot * 1000:.2f} ms below the model's {expected_tpot * 1000:.2f} ms")
        client_ttfts.append(ttft)

    d_metrics = decode.metrics()
    hist = "sglang:time_to_first_token_seconds"
    engine_ttft = metric_sum(d_metrics, hist + "_sum", is_streaming="true") / metric_sum(
        d_metrics, hist + "_count", is_streaming="true")
    print(f"engine TTFT {engine_ttft:.3f} s (model {expected_ttft:.3f} s)")
    assert engine_ttft >= expected_ttft * MODEL_FLOOR, f"engine TTFT {engine_ttft:.3f} s, model {expected_ttft:.3f} s"
    assert max(client_ttfts) >= engine_ttft * 0.99, "the client saw a first token before the engine made one"

    # A concurrent burst of non-streaming requests: every one completes.
    def complete(i: int) -> dict:
        path = "/v1/chat/completions" if i % 2 else "/v1/completions"
        body = {"model": "glm-5.2", "max_tokens": OUTPUT_TOKENS}
        body.update({"messages": [{"role": "user", "content": PROMPT}]} if i % 2 else {"prompt": PROMPT})
        resp = httpx.post(router + path, json=body, timeout=60)
        assert resp.status_code == 200, resp.text
        return resp.json()

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(complete, range(8)))
    assert all(a["usage"]["completion_tokens"] == OUTPUT_TOKENS for a in answers)
    assert all(a["choices"][0]["finish_reason"] == "length" for a in answers)

    requests = 10
    p_metrics, d_metrics = prefill.metrics(), decode.metrics()
    realtime = "sglang:realtime_tokens_total"
    # Prefill computed every prompt and decoded nothing; decode the reverse.
    assert metric_sum(p_metrics, realtime, mode="prefill_compute") >= requests * PROMPT_TOKENS * 0.9
    assert metric_sum(p_metrics, realtime, mode="decode") == 0
    assert metric_sum(d_metrics, realtime, mode="prefill_compute") == 0
    # Decode steps produce all but the first token, which travels with the KV.
    assert metric_sum(d_metrics, realtime, mode="decode") == requests * (OUTPUT_TOKENS - 1)
    assert metric_sum(d_metrics, "sglang:generation_tokens_total") == requests * OUTPUT_TOKENS
    assert metric_sum(p_metrics, "sglang:num_requests_total") == requests
    assert metric_sum(d_metrics, "sglang:num_requests_total") == requests
    # Each pair met through a bootstrap room the router injected, and the prefill, the only side that
    # times a KV transfer (disaggregation/prefill.py:1243-1262), timed the KV it sent; none failed to meet.
    assert metric_sum(p_metrics, "sglang:kv_transfer_latency_ms_count") > 0
    assert metric_sum(d_metrics, "sglang:kv_transfer_latency_ms_count") == 0
    assert metric_sum(p_metrics, "sglang:num_bootstrap_failed_reqs_total") == 0
    assert metric_sum(d_metrics, "sglang:num_transfer_failed_reqs_total") == 0


def test_a_decode_leaving_while_the_other_waits_on_its_prefill_fails_no_request(engine_pod, smg_router):
    """Removing a worker (scale-down, role switch, roll) while the role's other worker has a queue.

    SGLang counts a decode's requests still waiting for their prefill's KV as waiting
    (`load_inquirer.py:114-141`). With smg's overload veto on (its default: 8 waiting), smg leaves
    such a decode out of routing while another decode is under the threshold, and it counts the
    one it is draining for removal (5 s) as that other decode: every request got 503 "No available
    decode workers" until the drain ended. The operator renders the router without the veto
    (`core.router.WORKER_FLAGS`, which the `smg_router` fixture passes as the operator does).
    """
    prefill = engine_pod("prefill", time_scale=TIME_SCALE)
    staying, leaving = engine_pod("decode", time_scale=TIME_SCALE), engine_pod("decode", time_scale=TIME_SCALE)
    router = smg_router(prefill, staying, leaving)

    def workers() -> dict[str, dict]:
        """smg's workers by URL."""
        return {w["url"]: w for w in httpx.get(router + "/workers", timeout=5).json()["workers"]}

    def stranded() -> None:
        """A decode half whose prefill never runs: it waits on `staying` for KV, as behind a backlog."""
        body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 4}, "bootstrap_host": "127.0.0.1",
                "bootstrap_port": prefill.bootstrap_port, "bootstrap_room": random.randrange(1 << 62)}
        try:
            httpx.post(staying.engine_url + "/generate", json=body, timeout=120)
        except httpx.HTTPError:
            pass  # aborted at the end of the test

    waiters = [threading.Thread(target=stranded, daemon=True) for _ in range(10)]
    for t in waiters:
        t.start()

    def smg_sees_the_queue() -> bool:
        """smg's load poll (every 10 s) has read the waiting requests of `staying`."""
        load = workers()[staying.engine_url].get("engine_load") or {}
        return sum(rank["num_waiting_reqs"] for rank in load.get("loads", [])) >= 8

    wait_for(smg_sees_the_queue, 30, "smg to read 8 or more waiting requests on the staying decode")
    stop, failures, served = threading.Event(), [], []
    request = {"model": "glm-5.2", "prompt": PROMPT, "max_tokens": 4}

    def client() -> None:
        with httpx.Client(timeout=60) as http:
            while not stop.is_set():
                resp = http.post(router + "/v1/completions", json=request)
                (served if resp.status_code == 200 else failures).append(resp.text[:200])

    sender = threading.Thread(target=client)
    sender.start()
    try:
        wait_for(lambda: len(served) >= 3, 30, "requests served before the removal")
        worker_id = workers()[leaving.engine_url]["id"]
        assert httpx.delete(f"{router}/workers/{worker_id}", timeout=5).status_code == 202
        wait_for(lambda: leaving.engine_url not in workers(), 30, "smg to drain and remove the leaving decode")
        removed = len(served)
        wait_for(lambda: len(served) >= removed + 3, 30, "requests served after the removal")
    finally:
        stop.set()
        sender.join(60)
        httpx.post(staying.engine_url + "/pause_generation", json={"mode": "abort"}, timeout=5)
    print(f"{len(served)} served, {len(failures)} failed, across the removal")
    assert not failures, failures[:3]


def test_a_decode_crashing_under_load_fails_only_what_it_held_and_the_prefill_keeps_serving(engine_pod, smg_router):
    """An engine that exits with requests in flight, behind the router as the operator runs it and,
    on the same engines at the same moment, behind smg with its default circuit breaker.

    smg records a PD request's outcome on both workers of its pair (pd_router.rs,
    `record_outcome` on prefill and decode after each dual dispatch) and opens a circuit after 10
    consecutive failures for 60 s: the crash opens the healthy prefill's circuit and that router
    answers "No available prefill workers" to everything after. The operator's router runs
    without the breaker (`core.router.WORKER_FLAGS`): smg retries each failed request on a newly
    selected pair, so at most the requests the decode held fail.
    """
    prefill = engine_pod("prefill", time_scale=TIME_SCALE)
    steady, crashing = engine_pod("decode", time_scale=TIME_SCALE), engine_pod("decode", time_scale=TIME_SCALE)
    ours = smg_router(prefill, steady, crashing)
    default = smg_router(prefill, steady, crashing,
                         worker_flags=tuple(f for f in WORKER_FLAGS if f != "--disable-circuit-breaker"))
    stop = threading.Event()
    crashed_at: list[float] = []
    answers: dict[str, list[tuple[float, int, str]]] = {ours: [], default: []}
    request = {"model": "glm-5.2", "prompt": PROMPT, "max_tokens": 64}

    def client(router: str) -> None:
        with httpx.Client(timeout=60) as http:
            while not stop.is_set():
                resp = http.post(router + "/v1/completions", json=request)
                answers[router].append((time.monotonic(), resp.status_code, resp.text[:200]))

    clients = {ours: 12, default: 24}  # the default router needs 10 failures in a row to open a circuit
    senders = [threading.Thread(target=client, args=(router,)) for router, n in clients.items() for _ in range(n)]
    for t in senders:
        t.start()
    try:
        wait_for(lambda: all(sum(1 for a in got if a[1] == 200) >= 10 for got in answers.values()), 60,
                 "both routers serving")
        crashed_at.append(time.monotonic())
        httpx.post(crashing.engine_url + "/sim/faults", json={"crash": True}, timeout=5)
        time.sleep(15)
    finally:
        stop.set()
        for t in senders:
            t.join(90)

    def after(router: str) -> tuple[int, list[str]]:
        """Requests answered after the crash: how many were served, the errors of the others."""
        later = [a for a in answers[router] if a[0] > crashed_at[0]]
        return sum(1 for a in later if a[1] == 200), [a[2] for a in later if a[1] != 200]

    (ours_served, ours_failed), (default_served, default_failed) = after(ours), after(default)
    print(f"after the crash: operator's router {ours_served} served, {len(ours_failed)} failed; "
          f"smg's defaults {default_served} served, {len(default_failed)} failed")
    assert len(ours_failed) <= clients[ours], ours_failed[:3]
    assert ours_served >= 3 * clients[ours], "the operator's router stopped serving after the crash"
    # The contract the flag rests on: with the breaker, the healthy prefill was shut out.
    assert len(default_failed) > clients[default], "smg's breaker no longer takes the prefill out"
    assert any("No available prefill workers" in error for error in default_failed), default_failed[:3]


def test_a_prefill_that_crashes_leaves_routing_within_seconds_and_returns_with_its_engine(engine_pod, smg_router):
    """A prefill engine that exits and takes a while to start again (loading weights), behind the
    `cache_aware` prefill policy (the default), which sends each prompt to the prefill holding its
    prefix and retries it there.

    The operator's router probes each worker's `/ready` every second (`core.router.HEALTH_FLAGS`):
    no request that reaches it after it shut the dead prefill out fails, and the prefill is healthy
    in it again once its engine is. With smg's health-check defaults (`/health` every 60 s) the
    dead prefill stayed routed for its whole restart: requests failed until it ended (docs/operator.md).
    """
    restart = 20.0
    crashing = engine_pod("prefill", time_scale=TIME_SCALE, startup_seconds=restart)
    steady = engine_pod("prefill", time_scale=TIME_SCALE)
    decodes = engine_pod("decode", time_scale=TIME_SCALE), engine_pod("decode", time_scale=TIME_SCALE)
    router = smg_router((crashing, steady), *decodes, prefill_policy="cache_aware")
    tenants = [f"Tenant {i} instructions. " * 200 for i in range(8)]  # a cached prefix each
    stop = threading.Event()
    answers: list[tuple[float, int, str]] = []

    def client(seed: int) -> None:
        pick = random.Random(seed)
        with httpx.Client(timeout=60) as http:
            while not stop.is_set():
                started = time.monotonic()
                body = {"model": "glm-5.2", "prompt": pick.choice(tenants) + str(pick.random()), "max_tokens": 16}
                try:
                    resp = http.post(router + "/v1/completions", json=body)
                    answers.append((started, resp.status_code, resp.text[:200]))
                except httpx.HTTPError as e:
                    answers.append((started, 0, repr(e)))  # no answer at all: a failure too

    def routed() -> bool:
        """The router's own view: is the crashing prefill a healthy worker?"""
        workers = httpx.get(router + "/workers", timeout=5).json()["workers"]
        return any(w["url"] == crashing.engine_url and w.get("is_healthy") for w in workers)

    senders = [threading.Thread(target=client, args=(i,)) for i in range(12)]
    for t in senders:
        t.start()
    try:
        wait_for(lambda: sum(1 for a in answers if a[1] == 200) >= 10, 60, "the router serving")
        crashed = time.monotonic()
        httpx.post(crashing.engine_url + "/sim/faults", json={"crash": True}, timeout=5)
        wait_for(lambda: not routed(), 10, "the router to shut the dead prefill out")
        shut_out = time.monotonic()
        # What HybridServingRouterNoWorkers reads: the unhealthy prefill stays in the pool
        # (--no-remove-unhealthy-workers), and its checks count as failures.
        before = router.metrics()
        time.sleep(2.5)
        out = router.metrics()
        assert metric_sum(out, "smg_worker_pool_size", worker_type="prefill") == 2
        assert metric_sum(out, "smg_worker_health", worker=crashing.engine_url) == 0
        assert metric_sum(out, "smg_worker_health", worker=steady.engine_url) == 1
        assert (metric_sum(out, "smg_worker_health_checks_total", worker_type="prefill", result="failure")
                > metric_sum(before, "smg_worker_health_checks_total", worker_type="prefill", result="failure"))
        wait_for(lambda: httpx.get(crashing.engine_url + "/ready", timeout=2).status_code == 200, restart + 30,
                 "the crashed prefill's engine to start again")
    finally:
        stop.set()
        for t in senders:
            t.join(90)
    wait_for(routed, 15, "the prefill back in the router with its engine")

    failed = [(started - crashed, text) for started, status, text in answers if status != 200 and started >= crashed]
    served = sum(1 for started, status, _ in answers if status == 200 and started >= shut_out)
    print(f"shut out {shut_out - crashed:.1f} s after the crash; {len(failed)} failed, the last sent at "
          f"+{max((t for t, _ in failed), default=0):.1f} s; {served} served after it")
    assert not [f for f in failed if f[0] > shut_out - crashed], failed
    assert served >= 10, "the router kept serving on the other prefill"
