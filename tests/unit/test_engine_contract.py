"""The HTTP contract between the operator and an SGLang 0.5.23 engine, run against the simulator.

Every behaviour the operator, the launcher or the policy relies on is asserted here with the
SGLang source it mirrors (paths relative to `sglang/srt/` in the 0.5.23 wheel). The same tests
run unchanged against a real server:

    python -m sglang.launch_server --model-path MODEL --host 0.0.0.0 --port 30000 \\
        --disaggregation-mode prefill --disaggregation-transfer-backend mooncake \\
        --enable-pd-role-switch --enable-metrics
    HYBRIDSERVING_ENGINE_URL=http://HOST:30000 .venv/bin/python -m pytest tests/unit/test_engine_contract.py

(the engine must be idle and born prefill; the tests switch it to decode and back). Without
`HYBRIDSERVING_ENGINE_URL` they start the SGLang simulator with those same flags.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hybridserving_engine.simulator.process import SimulatorProcess, free_port, simulator_env

from hybridserving.controller.engines import inflight_requests

ENGINE_URL = os.environ.get("HYBRIDSERVING_ENGINE_URL")
# GLM-5.2's weights need a node of 8 H200s, the simulator's default GPU, as they need them on SGLang.
ARGV = ["--tp-size", "8", "--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "mooncake",
        "--enable-pd-role-switch", "--enable-metrics"]


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    if ENGINE_URL:
        yield ENGINE_URL.rstrip("/")
        return
    argv = ["--model-path", "zai-org/GLM-5.2-FP8", "--host", "127.0.0.1", "--port", str(free_port()),
            "--disaggregation-bootstrap-port", str(free_port()), *ARGV]
    with SimulatorProcess(argv, env=simulator_env(time_scale=0.01)) as sim:
        sim.wait_ready()
        yield sim.url


def switch(engine: str, role: str, **extra: object) -> tuple[int, dict]:
    resp = httpx.post(engine + "/pd_role_switch", json={"new_role": role, **extra}, timeout=600)
    return resp.status_code, resp.json()


def samples(engine: str) -> dict[str, list]:
    text = httpx.get(engine + "/metrics", timeout=10).text
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def test_ready_answers_at_once_without_generating(engine):
    # entrypoints/http_server.py:714-718 and managers/tokenizer_manager.py:728-734: /ready reads
    # the server status; the readiness probe and the controller use it.
    start = time.monotonic()
    assert httpx.get(engine + "/ready", timeout=5).status_code == 200
    assert time.monotonic() - start < 0.9


@pytest.mark.parametrize("path", ["/health", "/health_generate"])
def test_health_runs_a_generation_and_answers_after_a_second_at_the_earliest(engine, path):
    # entrypoints/http_server.py:720-797: a one-token generation, polled in asyncio.sleep(1) steps
    # (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION defaults to true, environ.py:344), so a probe with
    # the kubelet's default 1 s timeout never passes.
    start = time.monotonic()
    assert httpx.get(engine + path, timeout=30).status_code == 200
    assert time.monotonic() - start >= 1.0
    with pytest.raises(httpx.TimeoutException):
        httpx.get(engine + path, timeout=0.9)


@pytest.fixture
def stalled_engine() -> Iterator[str]:
    """An engine whose scheduler has stopped making progress while its HTTP server still answers:
    the simulator's `stall_scheduler` fault, with a 2 s SGLANG_HEALTH_CHECK_TIMEOUT. A real
    server's scheduler cannot be hung on demand."""
    if ENGINE_URL:
        pytest.skip("a real engine's scheduler cannot be hung on demand")
    argv = ["--model-path", "zai-org/GLM-5.2-FP8", "--host", "127.0.0.1", "--port", str(free_port()),
            "--disaggregation-bootstrap-port", str(free_port()), *ARGV]
    with SimulatorProcess(argv, env={**simulator_env(time_scale=0.01), "SGLANG_HEALTH_CHECK_TIMEOUT": "2"}) as sim:
        sim.wait_ready()
        assert httpx.post(sim.url + "/sim/faults", json={"stall_scheduler": True}, timeout=10).status_code == 200
        yield sim.url


def test_a_hung_scheduler_fails_health_after_the_timeout_and_stays_unhealthy_until_a_check_passes(stalled_engine):
    engine = stalled_engine
    # /ready and /ping read the server status only (entrypoints/http_server.py:714-718, 2190-2199;
    # managers/tokenizer_manager.py:728-734): a hung scheduler leaves them at 200.
    assert httpx.get(engine + "/ready", timeout=5).status_code == 200
    assert httpx.get(engine + "/ping", timeout=5).status_code == 200
    # /health's request gets no output for SGLANG_HEALTH_CHECK_TIMEOUT (read once, line 218; default
    # 20): 503, and the status turns UnHealthy (lines 776-799).
    start = time.monotonic()
    assert httpx.get(engine + "/health", timeout=30).status_code == 503
    assert time.monotonic() - start >= 2.0
    assert httpx.get(engine + "/ready", timeout=5).status_code == 503
    assert httpx.get(engine + "/ping", timeout=5).status_code == 503
    # Only a passing health check sets it Up again (line 784): a scheduler that recovers stays
    # unready until one runs.
    assert httpx.post(engine + "/sim/faults", json={"stall_scheduler": False}, timeout=10).status_code == 200
    time.sleep(0.5)
    assert httpx.get(engine + "/ready", timeout=5).status_code == 503
    assert httpx.get(engine + "/health_generate", timeout=30).status_code == 200
    assert httpx.get(engine + "/ready", timeout=5).status_code == 200
    assert httpx.get(engine + "/ping", timeout=5).status_code == 200


def test_the_scheduler_watchdog_kills_the_server_hung_mid_batch_and_spares_it_hung_idle():
    """`--watchdog-timeout` (300 s, arg_groups/fields/device.py:66-69) arms the scheduler's watchdog
    (managers/scheduler.py:1483-1486) only while the scheduler holds a batch
    (managers/scheduler_components/invariant_checker.py:521-523; cur_batch_for_debug is None on an
    idle round, managers/scheduler.py:2044). Once the forward count (line 4621) has not moved for
    the timeout it reports, waits 5 s and SIGQUITs the main process (utils/watchdog.py:137-163),
    whose handler kills the process tree, itself last, with SIGKILL
    (managers/tokenizer_manager.py:4072-4081, utils/common.py:2507-2552). A real scheduler cannot
    be hung on demand."""
    if ENGINE_URL:
        pytest.skip("a real engine's scheduler cannot be hung on demand")
    argv = ["--model-path", "zai-org/GLM-5.2-FP8", "--host", "127.0.0.1", "--port", str(free_port()),
            "--tp-size", "8", "--watchdog-timeout", "1"]
    with SimulatorProcess(argv, env=simulator_env(time_scale=0.01)) as sim:
        sim.wait_ready()
        faults = sim.url + "/sim/faults"
        assert httpx.post(faults, json={"stall_scheduler": True}, timeout=10).status_code == 200
        time.sleep(2.5)
        assert sim.proc.poll() is None and httpx.get(sim.url + "/ready", timeout=5).status_code == 200
        assert httpx.post(faults, json={"stall_scheduler": False}, timeout=10).status_code == 200
        body = {"input_ids": [1] * 16, "sampling_params": {"max_new_tokens": 100000}, "stream": True}
        with httpx.stream("POST", sim.url + "/generate", json=body, timeout=30) as generating:
            lines = generating.iter_lines()  # kept: a dropped iterator closes the stream, whose
            next(lines)  # request SGLang then aborts (managers/tokenizer_manager.py:958-966)
            assert httpx.post(faults, json={"stall_scheduler": True}, timeout=10).status_code == 200
            stalled_at = time.monotonic()
            assert sim.proc.wait(15) == -signal.SIGKILL
        assert 1 + 5 <= time.monotonic() - stalled_at <= 1.5 + 5 + 2


def test_server_info_is_the_start_up_configuration_and_model_info_the_live_role(engine):
    # entrypoints/http_server.py:863-892 (build_server_info over the resolved args) and 834-836.
    info = httpx.get(engine + "/server_info", timeout=10).json()
    assert info["disaggregation_mode"] == "prefill" and info["version"] == "0.5.23"
    assert [s["disaggregation_mode"] for s in info["internal_states"]] == ["prefill"] * len(info["internal_states"])
    assert httpx.get(engine + "/model_info", timeout=10).json()["disaggregation_mode"] == "prefill"


def test_idle_loads_hold_no_request_and_every_core_field_of_every_dp_rank(engine):
    # entrypoints/v1_loads.py:96-150: one entry per DP rank (managers/load_snapshot.py:516), each
    # with every core key, zero or not (to_dict, load_snapshot.py:233), and the sections asked for.
    loads = httpx.get(engine + "/v1/loads", params={"include": "core,disagg,queues"}, timeout=10).json()
    assert loads["loads"] and inflight_requests(loads) == 0
    assert sorted(load["dp_rank"] for load in loads["loads"]) == list(range(len(loads["loads"])))
    for load in loads["loads"]:
        assert {"num_running_reqs", "num_waiting_reqs", "num_waiting_uncached_tokens", "num_used_tokens",
                "max_total_num_tokens", "max_running_requests", "token_usage"} <= set(load)
        assert load["num_running_reqs"] == load["num_waiting_reqs"] == load["num_waiting_uncached_tokens"] == 0
        assert {"disaggregation", "queues"} <= set(load) and "memory" not in load


def test_server_info_has_the_flag_and_v1_loads_the_running_cap_each_rank_sized(engine):
    # The top level of /server_info is the resolved server args (utils/common.py:3584-3593): the
    # engine was started without --max-running-requests, so it is null. Each DP rank's scheduler
    # sizes its cap from its KV pool (mem_cache/kv_cache_configurator.py:3119-3131: 2048 to 4096
    # when unset, at most half the pool; a hybrid model's recurrent-state pool may lower it, lines
    # 3133-3160) and /v1/loads reports it (load_inquirer.py:242).
    assert httpx.get(engine + "/server_info", timeout=10).json()["max_running_requests"] is None
    loads = httpx.get(engine + "/v1/loads", timeout=10).json()["loads"]
    for load in loads:
        assert 1 <= load["max_running_requests"] <= min(4096, load["max_total_num_tokens"] // 2)


def test_a_prompt_between_its_prefill_chunks_is_in_no_queue_but_still_in_flight(engine):
    # A prompt longer than chunked_prefill_size is cut; the scheduler takes it out of the waiting
    # queue and holds it as chunked_req until its last chunk (managers/scheduler.py:4319-4327), so
    # no count of /v1/loads has it (load_inquirer.py:114, 141, 216-219; a PD prefill's running
    # batch stays empty) and only num_waiting_uncached_tokens shows its rest (lines 104-106).
    # SGLang's own idleness counts it (managers/scheduler.py:5346), and so does inflight_requests.
    info = httpx.get(engine + "/server_info", timeout=10).json()
    prompt = min(12 * info["chunked_prefill_size"], info["max_req_input_len"] - 1)
    assert prompt > 2 * info["chunked_prefill_size"], "the model's context holds too few chunks for this test"
    body = {"input_ids": [1] * prompt, "sampling_params": {"max_new_tokens": 1}, "bootstrap_host": "2.2.2.2",
            "bootstrap_room": 0}
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(httpx.post, engine + "/generate", json=body, timeout=600)
        mid_chunk = None
        while not answer.done() and mid_chunk is None:
            loads = httpx.get(engine + "/v1/loads", params={"include": "core,disagg,queues"}, timeout=10).json()
            for load in loads["loads"]:
                if load["num_waiting_uncached_tokens"] > 0 and load["queues"]["waiting"] == 0:
                    mid_chunk = loads
        assert answer.result().status_code == 200
    assert mid_chunk is not None, "never saw the prompt between its chunks"
    counts = [(load["num_running_reqs"], load["num_waiting_reqs"], load["queues"]["grammar"]) for load in
              mid_chunk["loads"]]
    assert set(counts) == {(0, 0, 0)}, "it is in no queue"
    assert inflight_requests(mid_chunk) >= 1


def test_in_flight_requests_are_counted_in_every_place_sglang_holds_them():
    # The shapes /v1/loads has (load_inquirer.py:109-255) with a request only in: the running batch,
    # the waiting or a PD queue (num_waiting_reqs, lines 114-141), a prefill's inflight queue, the
    # grammar queue (constrained/grammar_manager.py:206-207, counted at line 220), or the middle of
    # a chunked prefill (its rest in num_waiting_uncached_tokens, lines 104-106). queues.paused is
    # never raised in 0.5.23 (metrics_reporter.py:875-876, 1102-1103) and is not read.
    idle = {"num_running_reqs": 0, "num_waiting_reqs": 0, "num_waiting_uncached_tokens": 0,
            "disaggregation": {"prefill_inflight_queue_reqs": 0}, "queues": {"paused": 0, "grammar": 0}}
    assert inflight_requests({"loads": [idle, idle]}) == 0
    for held in ({"num_running_reqs": 1}, {"num_waiting_reqs": 1},
                 {"disaggregation": {"prefill_inflight_queue_reqs": 1}},
                 {"queues": {"paused": 0, "grammar": 1}}, {"num_waiting_uncached_tokens": 30000}):
        assert inflight_requests({"loads": [idle, {**idle, **held}]}) == 1, held
    # The waiting queue's own prompts are in num_waiting_uncached_tokens too: no request is counted twice.
    assert inflight_requests({"loads": [{**idle, "num_waiting_reqs": 2, "num_waiting_uncached_tokens": 900}]}) == 2


def test_an_unknown_loads_section_is_a_server_error(engine):
    # load_snapshot.py:237-243: to_dict raises ValueError for it, in v1_loads.py:141, outside the
    # try that turns the reader's ValueError into a 400 (lines 120-126): FastAPI answers 500.
    assert httpx.get(engine + "/v1/loads", params={"include": "bogus"}, timeout=10).status_code == 500
    # "all" is checked first (load_snapshot.py:235), so it covers an unknown name.
    assert httpx.get(engine + "/v1/loads", params={"include": "all,bogus"}, timeout=10).status_code == 200


def test_loads_of_one_dp_rank_keep_its_entry_and_of_no_rank_none(engine):
    # entrypoints/v1_loads.py:96-126 passes dp_rank, an Optional[int] query parameter, to
    # managers/tokenizer_control_mixin.py:1001-1028: a rank outside [0, num_dp_ranks) (the
    # replicas times the attention-DP groups, runtime_context.py:202-207; one without either)
    # returns no load, and to_dict never runs, so an unknown section is no error then (v1_loads.py:139-149).
    def loads(**params: object) -> httpx.Response:
        return httpx.get(engine + "/v1/loads", params=params, timeout=10)

    ranks = len(loads().json()["loads"])
    for rank in (0, ranks - 1):
        answer = loads(dp_rank=rank).json()
        assert set(answer) == {"timestamp", "version", "accelerator", "num_accelerators", "loads"}
        assert [load["dp_rank"] for load in answer["loads"]] == [rank]
    # FastAPI parses the integer as pydantic does, leniently.
    assert [load["dp_rank"] for load in loads(dp_rank="+0").json()["loads"]] == [0]
    for rank in (-1, ranks, 10**30):
        resp = loads(dp_rank=rank)
        assert resp.status_code == 200 and resp.json()["loads"] == [], rank
    assert loads(dp_rank=ranks, include="bogus").json()["loads"] == []
    assert loads(dp_rank=ranks, format="prometheus").text == "\n"
    # A rank that is no integer fails FastAPI's validation: SGLang's 400 ErrorResponse (http_server.py:635-687),
    # worded as for a body, the handler being v1_loads.py's get_loads.
    for rank in ("one", "0.5", ""):
        resp = loads(dp_rank=rank)
        body = resp.json()
        assert resp.status_code == 400 and set(body) == ERROR_RESPONSE_KEYS, (rank, body)
        assert (body["object"], body["type"], body["code"]) == ("error", "Bad Request", 400)
        assert body["message"].startswith(
            f"1 validation error:\n  {{'type': 'int_parsing', 'loc': ('query', 'dp_rank'), 'msg': 'Input should be a "
            f"valid integer, unable to parse string as an integer', 'input': '{rank}'}}\n\n  File "), body
        assert "/sglang/srt/entrypoints/v1_loads.py\", line 96, in get_loads\n    GET /v1/loads [{" in body["message"]


def test_default_metrics_have_no_forward_timer_and_no_prefill_utilization(engine):
    # managers/scheduler_components/metrics_reporter.py:325-341 (forward timing only with
    # SGLANG_ENABLE_METRICS_DEVICE_TIMER=1, default off: environ.py:479) and 1303-1306
    # (utilization is -1 on prefill).
    found = samples(engine)
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                 "sglang:num_prefill_bootstrap_queue_reqs", "sglang:num_decode_prealloc_queue_reqs"):
        assert name in found, name
    if os.environ.get("SGLANG_ENABLE_METRICS_DEVICE_TIMER", "0").lower() not in ("1", "true", "yes", "y"):
        assert "sglang:forward_execution_seconds_total" not in found
    assert {s.value for s in found["sglang:utilization"]} == {-1.0}


def test_prefill_born_engine_needs_decode_graph_memory_to_become_decode_and_keeps_its_start_up_config(engine):
    # disaggregation/role_switch.py:79-89: no decode CUDA graphs captured yet -> the request must
    # carry decode_cuda_graph_memory_gb; refused with safe_to_restore (the engine keeps serving).
    status, body = switch(engine, "decode")
    assert status == 400 and body["success"] is False and body["safe_to_restore"] is True
    assert "decode_cuda_graph_memory_gb is required" in body["message"]
    status, body = switch(engine, "decode", decode_cuda_graph_memory_gb=-1.0)
    assert status == 400 and "non-negative" in body["message"] and body["safe_to_restore"] is True
    status, body = switch(engine, "decode", decode_cuda_graph_memory_gb=1.0)
    assert status == 200 and body["success"] is True and (body["old_role"], body["new_role"]) == ("prefill", "decode")
    try:
        assert httpx.get(engine + "/model_info", timeout=10).json()["disaggregation_mode"] == "decode"
        info = httpx.get(engine + "/server_info", timeout=10).json()
        assert info["disaggregation_mode"] == "prefill"
        assert {s["disaggregation_mode"] for s in info["internal_states"]} == {"decode"}
        # metrics_reporter.py:1307-1315: off prefill, utilization is never set (stays 0).
        assert {s.value for s in samples(engine)["sglang:utilization"]} == {0.0}
        # role_switch.py:66-72: switching to the role it has is a success with nothing done; the
        # tokenizer manager answers every success with "ok" (managers/tokenizer_control_mixin.py:946-953).
        status, body = switch(engine, "decode")
        assert status == 200 and body["success"] is True and body["message"] == "ok"
    finally:
        status, body = switch(engine, "prefill")
    assert status == 200 and body["success"] is True
    assert httpx.get(engine + "/model_info", timeout=10).json()["disaggregation_mode"] == "prefill"


# ------------------------------------------------------------------------------------------ errors
#
# What a client (and the router, which passes them on) sees for a request SGLang refuses. Three
# shapes: FastAPI's validation error and the OpenAI routes' refusals are an ErrorResponse
# (entrypoints/openai/protocol.py:106-111); /generate answers a ValueError with a bare message, and
# a body outside its JSON contract with the schema's text as the whole "error".

ERROR_RESPONSE_KEYS = {"object", "message", "type", "param", "code"}


def sse(resp: httpx.Response) -> list:
    """The `data:` payloads of a stream, `[DONE]` as a string."""
    lines = [line[len("data: "):] for line in resp.text.splitlines() if line.startswith("data: ")]
    return [line if line == "[DONE]" else json.loads(line) for line in lines]


HANDLERS = {"/generate": "generate_request", "/v1/completions": "openai_v1_completions",
            "/v1/chat/completions": "openai_v1_chat_completions"}


def validation_message(answer: dict, path: str) -> tuple[str, str]:
    """FastAPI's RequestValidationError text as SGLang's handler words it (entrypoints/http_server.py:
    666-671): "N validation error(s):", one pydantic error a line, the handler's file, line and route,
    then the error list again. Returns the error lines and the list."""
    text, _, listed = answer["message"].partition(f", in {HANDLERS[path]}\n    POST {path} ")
    assert listed.startswith("[{") and "\n  File " in text, answer["message"]
    return text.split("\n  File ")[0], listed


@pytest.mark.parametrize("path", ["/generate", "/v1/completions", "/v1/chat/completions"])
def test_a_body_that_is_no_json_is_a_bad_request_error_response(engine, path):
    # FastAPI raises RequestValidationError, which SGLang answers with 400 and an ErrorResponse typed
    # "Bad Request" (entrypoints/http_server.py:635-692); so it does for a /generate field of the
    # wrong type (GenerateReqInput, managers/io_struct.py:177-191), streamed or not, and for a
    # /generate body sent without a JSON Content-Type, which FastAPI leaves as bytes.
    resp = httpx.post(engine + path, content=b"{not json", headers={"Content-Type": "application/json"}, timeout=30)
    errors, _ = validation_message(resp.json(), path)
    assert errors == ("1 validation error:\n  {'type': 'json_invalid', 'loc': ('body', 1), 'msg': 'JSON decode "
                      "error', 'input': {}, 'ctx': {'error': 'Expecting property name enclosed in double quotes'}}\n")
    answers = [resp]
    if path == "/generate":
        for stream in (False, True):
            answers.append(httpx.post(engine + path, json={"text": 5, "stream": stream}, timeout=30))
            errors, _ = validation_message(answers[-1].json(), path)
            assert errors.startswith("2 validation errors:\n") and "'loc': ('body', 'text', 'str'), 'msg': " \
                "'Input should be a valid string', 'input': 5}" in errors
        answers.append(httpx.post(engine + path, content=b'{"text": "hi"}', timeout=30))
        assert "'type': 'dataclass_type', 'loc': ('body',)" in validation_message(answers[-1].json(), path)[0]
    for resp in answers:
        body = resp.json()
        assert resp.status_code == 400 and set(body) == ERROR_RESPONSE_KEYS, body
        assert (body["object"], body["type"], body["param"], body["code"]) == ("error", "Bad Request", None, 400)


@pytest.mark.parametrize("path, null", [
    ("/generate", "{'type': 'dataclass_type', 'loc': ('body',), 'msg': 'Input should be a dictionary or an instance "
                  "of GenerateReqInput', 'input': None, 'ctx': {'class_name': 'GenerateReqInput'}}"),
    ("/v1/completions", "{'type': 'model_attributes_type', 'loc': ('body',), 'msg': 'Input should be a valid "
                        "dictionary or object to extract fields from', 'input': None}"),
    ("/v1/chat/completions", "{'type': 'model_attributes_type', 'loc': ('body',), 'msg': 'Input should be a valid "
                             "dictionary or object to extract fields from', 'input': None}")])
def test_no_body_is_a_missing_body_and_null_one_of_another_type(engine, path, null):
    # FastAPI hands an empty body to no validator: the handler's one body parameter is required, so
    # it is missing. JSON's null is a body, None, which pydantic refuses (fastapi/routing.py,
    # fastapi/dependencies/utils.py, `_validate_value_with_model_field`).
    for content, error in ((b"", "{'type': 'missing', 'loc': ('body',), 'msg': 'Field required', 'input': None}"),
                           (b"null", null)):
        resp = httpx.post(engine + path, content=content, headers={"Content-Type": "application/json"}, timeout=30)
        assert resp.status_code == 400
        errors, _ = validation_message(resp.json(), path)
        assert errors == f"1 validation error:\n  {error}\n", content


@pytest.mark.parametrize("path", ["/generate", "/v1/completions", "/v1/chat/completions"])
def test_a_json_body_that_is_no_text_is_an_http_exception_error_response(engine, path):
    # FastAPI reads a JSON body with json.loads; any failure but a JSONDecodeError (here the bytes are
    # no UTF-8) is its HTTPException(400, "There was an error parsing the body") (fastapi/routing.py),
    # which SGLang's handler answers as an ErrorResponse typed with the status (http_server.py:578-630).
    resp = httpx.post(engine + path, content=b'{"text": "\xff"}', headers={"Content-Type": "application/json"},
                      timeout=30)
    assert resp.status_code == 400
    assert resp.json() == {"object": "error", "message": "There was an error parsing the body", "type": "400",
                           "param": None, "code": 400}


@pytest.mark.parametrize("path, body, error", [
    ("/v1/completions", {"max_tokens": 1}, "{'type': 'missing', 'loc': ('body', 'prompt'), 'msg': 'Field required', "
                                           "'input': {'max_tokens': 1}}"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "'msg': 'Value error, max_tokens must be positive'"),
    ("/v1/chat/completions", {}, "{'type': 'missing', 'loc': ('body', 'messages'), 'msg': 'Field required', "
                                 "'input': {}}"),
    ("/v1/chat/completions", {"messages": "hi"}, "{'type': 'list_type', 'loc': ('body', 'messages'), "
                                                 "'msg': 'Input should be a valid list', 'input': 'hi'}")])
def test_an_openai_request_outside_its_schema_or_not_sent_as_json_is_a_bad_request(engine, path, body, error):
    # CompletionRequest.prompt and ChatCompletionRequest.messages are required, max_tokens must be
    # positive (entrypoints/openai/protocol.py:372, 448-453, 919); both routes insist on
    # application/json (http_server.py:695-707, 1860, 1870), a check raised outside the route, so
    # its text names no handler; either is the validation error of lines 635-692.
    resp = httpx.post(engine + path, json=body, timeout=30)
    assert error in validation_message(resp.json(), path)[0]
    media = httpx.post(engine + path, content=json.dumps({"prompt": "hi", "messages": [{"role": "user",
                                                                                      "content": "hi"}]}),
                       headers={"Content-Type": "text/plain"}, timeout=30)
    wrong = ("{'loc': ['header', 'content-type'], 'msg': \"Unsupported Media Type: Only 'application/json' is "
             "allowed\", 'type': 'value_error'}")
    assert media.json()["message"] == f"1 validation error:\n  {wrong} [{wrong}]"
    for answer in (resp.json(), media.json()):
        assert set(answer) == ERROR_RESPONSE_KEYS, answer
        assert (answer["type"], answer["code"]) == ("Bad Request", 400)
    assert resp.status_code == media.status_code == 400


def test_generate_answers_a_tokenizer_value_error_with_a_bare_message(engine):
    # managers/io_struct.py:444-455 and managers/tokenizer_manager.py:1333-1378 raise ValueError;
    # /generate answers it 400 {"error": {"message"}} (entrypoints/http_server.py:988-990, 2246-2250).
    context = httpx.get(engine + "/server_info", timeout=10).json()["context_length"]
    cases = [
        ({}, "Either text, input_ids or input_embeds should be provided."),
        ({"input_ids": [1] * context}, f"The input ({context} tokens) is longer than the model's context length "
                                       f"({context} tokens)."),
        ({"input_ids": [1] * 8, "sampling_params": {"max_new_tokens": context}},
         f"Requested token count exceeds the model's maximum context length of {context} tokens. You requested a "
         f"total of {context + 8} tokens: 8 tokens from the input messages and {context} tokens for the "
         "completion. Please reduce the number of tokens in the input messages or the completion to fit within "
         "the limit."),
    ]
    for body, message in cases:
        resp = httpx.post(engine + "/generate", json=body, timeout=30)
        assert (resp.status_code, resp.json()) == (400, {"error": {"message": message}})
    # Streamed, the answer has started: the error is the last chunk (lines 957-975).
    resp = httpx.post(engine + "/generate", json={"stream": True}, timeout=30)
    assert resp.status_code == 200 and sse(resp) == [
        {"error": {"message": cases[0][1], "type": "invalid_request_error", "code": 400, "retryable": False}},
        "[DONE]"]


def test_generate_refuses_a_body_outside_its_json_contract_with_the_schemas_text(engine):
    # entrypoints/http_server.py:937-939: a body the GenerateReqInput dataclass admits is decoded again
    # by the API schema's decoder (entrypoints/api_contract.py:12-18, sglang/api/v1/api_types.py), whose
    # first violation is 400 {"error": "<text>"}, before anything streams; SamplingParams rejects
    # unknown keys (api_types.py:1256-1321), and pydantic's lax bool takes "yes" where the schema does not.
    for stream in (False, True):
        resp = httpx.post(engine + "/generate", json={"text": "hi", "stream": stream,
                                                      "sampling_params": {"max_tokens": 4}}, timeout=30)
        body = resp.json()
        assert resp.status_code == 400 and set(body) == {"error"}, body
        assert body["error"].startswith("unknown field `max_tokens`, expected one of `max_new_tokens`, `stop`, ")
    resp = httpx.post(engine + "/generate", json={"text": "hi", "stream": "yes"}, timeout=30)
    assert (resp.status_code, resp.json()) == (400, {"error": 'invalid type: string "yes", expected a boolean'})


def test_openai_routes_answer_a_refusal_with_a_bad_request_error_response(engine):
    # serving_completions.py:63-69 and serving_chat.py:1103-1106 refuse an empty prompt or message
    # list; a ValueError of the tokenizer manager is caught too (serving_completions.py:518-519,
    # serving_chat.py:2818-2819), streamed or not, as the first chunk is awaited before the answer
    # starts (serving_completions.py:208-212, serving_chat.py:2424-2428): create_error_response,
    # typed BadRequestError (entrypoints/openai/serving_base.py:205-221).
    context = httpx.get(engine + "/server_info", timeout=10).json()["context_length"]
    cases = [
        ("/v1/completions", {"prompt": ""}, "Prompt cannot be empty"),
        ("/v1/chat/completions", {"messages": []}, "Messages cannot be empty."),
        ("/v1/completions", {"prompt": [1] * 8, "max_tokens": context}, "Requested token count exceeds"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": context,
                                  "stream": True}, "Requested token count exceeds"),
    ]
    for path, body, message in cases:
        resp = httpx.post(engine + path, json=body, timeout=30)
        answer = resp.json()
        assert resp.status_code == 400 and set(answer) == ERROR_RESPONSE_KEYS, answer
        assert (answer["object"], answer["type"], answer["param"], answer["code"]) == (
            "error", "BadRequestError", None, 400)
        assert answer["message"].startswith(message), answer


def test_a_request_the_scheduler_aborts_is_refused_or_ends_its_stream(engine):
    # This prefill engine aborts a request without a bootstrap room, with 400
    # (managers/scheduler.py:3048-3059). Not streamed, that is the ValueError answer
    # (managers/tokenizer_manager.py:1916-1918): /generate's bare message, an OpenAI route's
    # BadRequestError. Streamed, /generate's last chunk carries the abort as its finish_reason
    # (tokenizer_manager.py:1924, managers/schedule_batch.py:339-345); an OpenAI stream ends with an
    # error chunk typed with the status's name (serving_completions.py:355-371).
    message = "Invalid request: Disaggregated request received without bootstrap room id."
    resp = httpx.post(engine + "/generate", json={"text": "hi"}, timeout=30)
    assert resp.status_code == 400 and resp.json()["error"]["message"].startswith(message)
    resp = httpx.post(engine + "/v1/completions", json={"prompt": "hi"}, timeout=30)
    assert resp.status_code == 400 and resp.json()["type"] == "BadRequestError"

    resp = httpx.post(engine + "/generate", json={"text": "hi", "stream": True}, timeout=30)
    *_, last, done = sse(resp)
    assert resp.status_code == 200 and done == "[DONE]"
    reason = last["meta_info"]["finish_reason"]
    assert (reason["type"], reason["status_code"]) == ("abort", 400) and reason["message"].startswith(message)
    resp = httpx.post(engine + "/v1/completions", json={"prompt": "hi", "stream": True}, timeout=30)
    *_, last, done = sse(resp)
    assert resp.status_code == 200 and done == "[DONE]"
    assert set(last) == {"error"} and set(last["error"]) == ERROR_RESPONSE_KEYS
    assert (last["error"]["type"], last["error"]["code"]) == ("BAD_REQUEST", 400)
    assert last["error"]["message"].startswith(message)


# ------------------------------------------------------------------------------------------ API keys
#
# SGLang started with `--api-key` (HYBRIDSERVING_KEYED_ENGINE_URL and HYBRIDSERVING_ENGINE_API_KEY
# against a real server). The middleware is utils/auth.py:154-213, installed when a key is set
# (entrypoints/http_server.py:2887-2898); the decision is `decide_request_auth`, lines 74-151.

API_KEY = os.environ.get("HYBRIDSERVING_ENGINE_API_KEY", "contract-test-key")


@pytest.fixture(scope="module")
def keyed_engine() -> Iterator[str]:
    url = os.environ.get("HYBRIDSERVING_KEYED_ENGINE_URL")
    if url:
        yield url.rstrip("/")
        return
    argv = ["--model-path", "zai-org/GLM-5.2-FP8", "--host", "127.0.0.1", "--port", str(free_port()),
            "--disaggregation-bootstrap-port", str(free_port()), *ARGV, "--api-key", API_KEY]
    with SimulatorProcess(argv, env=simulator_env(time_scale=0.01)) as sim:
        sim.wait_ready()
        yield sim.url


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY},
                                     {"Authorization": f"Basic {API_KEY}"}])
@pytest.mark.parametrize("path, body", [("/pause_generation", {"mode": "abort"}),
                                        ("/pd_role_switch", {"new_role": "decode"}),
                                        ("/abort_request", {"abort_all": True}),
                                        ("/continue_generation", {}), ("/flush_cache", {})])
def test_control_endpoints_refuse_a_caller_without_the_key(keyed_engine, path, body, headers):
    """ADMIN_OPTIONAL routes (http_server.py:1025-1026, 1635-1636, 1721-1722, 1831-1832, 1844-1845) take
    --api-key when no admin key is set (auth.py:133-143), as `Bearer <key>` only (lines 108-117);
    a refusal is 401 `{"error": "Unauthorized"}` (lines 192-204) and the engine is untouched."""
    resp = httpx.post(keyed_engine + path, json=body, headers=headers, timeout=30)
    assert (resp.status_code, resp.json()) == (401, {"error": "Unauthorized"})
    info = httpx.get(keyed_engine + "/model_info", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10)
    assert info.json()["disaggregation_mode"] == "prefill"
    assert httpx.get(keyed_engine + "/ready", timeout=10).status_code == 200, "not paused"


@pytest.mark.parametrize("path", ["/v1/loads", "/server_info", "/model_info", "/v1/models"])
def test_every_other_route_needs_the_key_too(keyed_engine, path):
    """NORMAL routes need --api-key when it is set (auth.py:145-149): /server_info would hand out
    the key itself (its resolved args and launch_command, utils/common.py:3584-3593)."""
    assert httpx.get(keyed_engine + path, timeout=10).status_code == 401
    ok = httpx.get(keyed_engine + path, headers={"Authorization": f"bearer {API_KEY}"}, timeout=10)
    assert ok.status_code == 200, "the scheme is case-insensitive (auth.py:115)"


@pytest.mark.parametrize("path", ["/ready", "/health", "/metrics"])
def test_probes_and_scrapes_need_no_key(keyed_engine, path):
    """`/health*`, `/ready*` and `/metrics*` are always open, for kubelet probes and Prometheus
    (auth.py:92-106)."""
    assert httpx.get(keyed_engine + path, timeout=30).status_code == 200


def test_the_key_holder_may_switch_roles(keyed_engine):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    resp = httpx.post(keyed_engine + "/pd_role_switch", json={"new_role": "decode", "decode_cuda_graph_memory_gb": 2.0},
                      headers=headers, timeout=600)
    assert resp.status_code == 200 and resp.json()["success"], resp.text
    back = httpx.post(keyed_engine + "/pd_role_switch", json={"new_role": "prefill"}, headers=headers, timeout=600)
    assert back.status_code == 200 and back.json()["success"], back.text
