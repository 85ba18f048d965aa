"""The simulator's HTTP surface: SGLang 0.5.23's routes and response shapes over `SimulatedEngine`.

The router (smg) decides that a worker is SGLang from `/v1/models` (`owned_by: "sglang"`) and
then injects `bootstrap_host/port/room` into every PD request; the launcher drains through
`/v1/loads` and switches through `/pd_role_switch`; the operator's controller reads `/metrics`.
Each answer here keeps SGLang's keys and types, and adds `"simulator": true` where the
response is a JSON object describing the server, so nobody mistakes a simulator for an engine.
Like SGLang 0.5.23, there is no `/version` and no `/get_load` route.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import enum
import json
import logging
import os
import shlex
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncGenerator, Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from hybridserving.contract import SGLANG_VERSION
from hybridserving.core.perfmodel import PerformanceModel
from hybridserving.api.profiles import resolve_profile

from hybridserving_engine.simulator import auth
from hybridserving_engine.simulator.args import (
    DEFAULT_CONTEXT_LENGTH,
    FlagError,
    SimulatorOptions,
    parse_server_args,
    rank_pool_tokens,
    reserved_tokens,
    resolve_server_args,
    simulated_gpu,
    sized_capacity,
)
from hybridserving_engine.simulator.bootstrap import BootstrapServer, KvReceiver
from hybridserving_engine.simulator.contract import generate_contract_error
from hybridserving_engine.simulator.engine import (
    InvalidRequest,
    RequestAborted,
    SimRequest,
    SimulatedEngine,
    count_tokens,
)
from hybridserving_engine.simulator.faults import Faults
from hybridserving_engine.simulator.metrics import EngineMetrics, env_bool, local_schedulers
from hybridserving_engine.simulator.validation import (
    AbortReq,
    BaseReq,
    BodyUnreadable,
    ChatCompletionRequest,
    CompletionRequest,
    ContinueGenerationReqInput,
    GenerateReqInput,
    PauseGenerationReqInput,
    PdRoleSwitchReqInput,
    RequestValidationError,
    endpoint_context,
    read_body,
    require_json_media,
    validate_body,
    validate_query_int,
)

log = logging.getLogger("hybridserving.simulator")

DEFAULT_GENERATE_MAX_NEW_TOKENS = 128
DEFAULT_COMPLETION_MAX_TOKENS = 16
DEFAULT_CHAT_MAX_TOKENS = 128
LOAD_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})
BOOTSTRAP_TIMEOUT_S = float(os.environ.get("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "300"))
REQUEST_STATE_WAIT_TIMEOUT_S = int(os.environ.get("SGLANG_REQUEST_STATE_WAIT_TIMEOUT", "4"))
"""How long the tokenizer manager waits for a request's next output before it looks whether the
client is still there (`managers/tokenizer_manager.py:208`, `environ.py:1679`)."""
FORCE_STREAM_INTERVAL = int(os.environ.get("SGLANG_FORCE_STREAM_INTERVAL", "50"))
"""Every this many tokens the scheduler sends a request that does not stream an output all the
same (`managers/scheduler_components/output_streamer.py:49, 474-477`, `environ.py:688`)."""
DISCONNECT_POLL_S = 0.1
"""How often a stream looks whether its client has gone (uvicorn says so at once)."""


def token_text(index: int) -> str:
    """The text of the index-th generated token (the simulator has no model to sample from)."""
    return f" tok{index}"


def _advertised_ip(host: str) -> str:
    """The address a peer reaches this instance on, chosen as SGLang chooses its rank IP."""
    for name in ("SGLANG_HOST_IP", "HOST_IP"):
        if os.environ.get(name):
            return os.environ[name]
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


class InvalidBody(Exception):
    """A control route's body that is no JSON object."""


def _error_body(message: str, err_type: str, status: int) -> dict[str, Any]:
    """SGLang's `ErrorResponse` (`entrypoints/openai/protocol.py:106-111`)."""
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": status}


def _query(request: web.Request, name: str) -> str | None:
    """A query parameter as FastAPI reads it: Starlette's `QueryParams` keeps the last of repeated values."""
    values = request.query.getall(name, [])
    return values[-1] if values else None


def _validation_error(message: str) -> web.Response:
    """FastAPI's RequestValidationError as SGLang answers it (`entrypoints/http_server.py:635-692`)."""
    return web.json_response(_error_body(message, "Bad Request", 400), status=400)


def _openai_error(message: str, err_type: str = "BadRequestError", status: int = 400) -> web.Response:
    """`OpenAIServingBase.create_error_response` (`entrypoints/openai/serving_base.py:205-221`)."""
    return web.json_response(_error_body(message, err_type, status), status=status)


def _http_exception(status: int, message: str) -> web.Response:
    """An HTTPException through SGLang's handler (`entrypoints/http_server.py:578-630`): typed with its status."""
    return web.json_response(_error_body(message, str(status), status), status=status)


def _disconnected(request: web.Request) -> bool:
    """Starlette's `request.is_disconnected()`: the client has closed its connection."""
    return request.transport is None or request.transport.is_closing()


def _generate_error(message: str) -> web.Response:
    """`/generate`'s answer to a ValueError (`entrypoints/http_server.py:988-990, 2246-2250`)."""
    return web.json_response({"error": {"message": message}}, status=400)


class ServerStatus(enum.Enum):
    """The tokenizer manager's `server_status` once the server serves (`managers/tokenizer_manager.py:4028-4031`;
    `Starting` has no counterpart: the simulator opens its port only once loaded)."""

    UP = "Up"
    UNHEALTHY = "UnHealthy"


def exit_process(status: int) -> None:
    """The whole server goes, at once, as SGLang's does when its scheduler dies."""
    os._exit(status)


def kill_process() -> None:
    """`kill_process_tree(os.getpid())` as the main process's SIGQUIT handler runs it
    (`utils/common.py:2548-2552`): SIGKILL to itself; where that is ignored (PID 1 of a container),
    `sys.exit(0)`."""
    os.kill(os.getpid(), signal.SIGKILL)
    os._exit(0)


WATCHDOG_GRACE_S = 5.0
"""How long the watchdog waits, after its report, before it signals the main process
(`utils/watchdog.py:160-163`)."""


class SimulatorServer:
    """One simulated SGLang server: HTTP app, scheduler, optional bootstrap server."""

    def __init__(self, args: argparse.Namespace, options: SimulatorOptions, argv: list[str]) -> None:
        self.args = args
        self.options = options
        self.argv = argv
        self.faults = Faults.parse(options.faults)
        self.arch = resolve_profile(options.profile)
        self.resolved = resolve_server_args(args, options)
        self.capacity = sized_capacity(args, options, self.resolved)
        self.perf = self._performance_model()
        self.role = args.disaggregation_mode
        self.metrics = EngineMetrics(
            args.served_model_name, self.role, args.enable_pd_role_switch,
            schedulers=local_schedulers(tp=args.tp_size, pp=args.pp_size, dp=args.dp_size, attn_dp=args.attn_dp_size,
                                        attn_cp=args.attn_cp_size, ep=args.ep_size, nnodes=args.nnodes),
            attention_dp=args.attn_dp_size > 1)
        runs_bootstrap = self.role == "prefill" or (args.enable_pd_role_switch and self.role != "null")
        self.bootstrap = (
            BootstrapServer(args.host, args.disaggregation_bootstrap_port, BOOTSTRAP_TIMEOUT_S)
            if runs_bootstrap else None
        )
        self.receiver = KvReceiver(BOOTSTRAP_TIMEOUT_S, self.resolved.page_size, self.resolved.kv_cache_dtype,
                                   on_incompatible=self._scheduler_died, dcp_size=args.dcp_size, pp_size=args.pp_size)
        self.engine = SimulatedEngine(
            role=self.role,
            perf=self.perf,
            metrics=self.metrics,
            faults=self.faults,
            role_switch_enabled=args.enable_pd_role_switch,
            transfer_backend=args.disaggregation_transfer_backend,
            context_length=args.context_length or DEFAULT_CONTEXT_LENGTH,
            max_prefill_tokens=args.max_prefill_tokens,
            bootstrap=self.bootstrap,
            receiver=self.receiver,
            dp_ranks=args.dp_size * args.attn_dp_size,
            follow_bootstrap_room=self._load_balance_method() == "follow_bootstrap_room",
            max_running_requests=self.resolved.max_running_requests,
            attn_dp_size=args.attn_dp_size,
            chunked_prefill_size=self.resolved.chunked_prefill_size,
            reserved_tokens=reserved_tokens(args, self.arch),
            sized_running_cap=self.capacity.running_cap,
        )
        self.startup_time = time.time()
        self.server_status = ServerStatus.UP
        self.shutting_down = False
        self.app = self._build_app()
        self._runner: web.AppRunner | None = None
        self._watchdogs: list[asyncio.Task[None]] = []

    def _performance_model(self) -> PerformanceModel:
        """Timings on the simulated GPU, and the KV pool SGLang sizes from its memory, which
        `--max-total-tokens` can only lower (`args.rank_pool_tokens`); the running-request cap is the
        scheduler's own (`SimulatedEngine.rank_max_running_requests`)."""
        rank_pool = rank_pool_tokens(self.args, self.capacity)
        return PerformanceModel.for_role(
            self.arch,
            tp=self.args.tp_size,
            dcp=self.args.dcp_size,
            kv_tokens=rank_pool * self.args.dp_size * self.args.attn_dp_size,
            time_scale=self.options.time_scale,
            gpu=simulated_gpu(self.options),
        )

    def startup_seconds(self) -> float:
        """Weights load and graph capture: the relaunch time of the performance model, unless overridden."""
        if self.options.startup_seconds is not None:
            return self.options.startup_seconds
        return self.perf.switch_seconds("relaunch")

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        delay = self.startup_seconds()
        log.info("simulator loading %s (profile %s) for %.2f s", self.args.model_path, self.options.profile, delay)
        await asyncio.sleep(delay)
        if self.bootstrap is not None:
            await self.bootstrap.start()
            self._register_prefill_ranks()
        self.engine.start()
        self._watchdogs = [asyncio.create_task(self._scheduler_watchdog(self.args.watchdog_timeout, soft=False))]
        if self.args.soft_watchdog_timeout is not None:
            self._watchdogs.append(asyncio.create_task(
                self._scheduler_watchdog(self.args.soft_watchdog_timeout, soft=True)))
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.args.host, self.args.port).start()
        log.info(
            "simulator serving SGLang %s API on %s:%d as %s (time scale %g)",
            SGLANG_VERSION, self.args.host, self.args.port, self.role, self.options.time_scale,
        )
        if self.faults.crash_after_s is not None:
            asyncio.get_running_loop().call_later(self.faults.crash_after_s, self._crash, "crash_after")

    async def shut_down(self) -> None:
        """SIGTERM as 0.5.23 takes it (`managers/tokenizer_manager.py:3508-3545, 4066-4070`): `/health`,
        `/ping` and `/ready` answer 503 at once, requests in flight, and any still sent, are served to
        the end, then the server stops; a server whose last health check failed (lines 3517-3524)
        or `SGL_FORCE_SHUTDOWN` stops at once.
        SGLang looks every 5 s; the simulator every 0.2 s, so that a stop costs tests no waiting."""
        self.shutting_down = True
        while (self.server_status is ServerStatus.UP and self.engine.has_requests()
               and not env_bool("SGL_FORCE_SHUTDOWN", False)):
            await asyncio.sleep(0.2)
        await self.stop()

    async def stop(self) -> None:
        self.shutting_down = True
        for watchdog in self._watchdogs:
            watchdog.cancel()
        await asyncio.gather(*self._watchdogs, return_exceptions=True)
        await self.engine.stop()
        await self.receiver.close()
        if self.bootstrap is not None:
            await self.bootstrap.stop()
        if self._runner is not None:
            await self._runner.cleanup()

    def _crash(self, why: str) -> None:
        log.error("simulator fault injected (%s): exiting with status 1", why)
        sys.stderr.flush()
        exit_process(1)

    async def _scheduler_watchdog(self, timeout: float, soft: bool) -> None:
        """SGLang's scheduler watchdog (`utils/watchdog.py:124-163`, armed by
        `managers/scheduler_components/invariant_checker.py:494-527` once the model is loaded,
        `managers/scheduler.py:1483-1486`): every `timeout / 2` s it looks whether the scheduler
        holds a batch and its forward count has not moved for more than `timeout` s. An idle
        scheduler never trips it, however long it hangs. The soft one (`--soft-watchdog-timeout`)
        only reports, and watches again; the hard one (`--watchdog-timeout`, 300 s) reports, waits
        5 s and SIGQUITs the main process, which kills its process tree, itself included, with
        SIGKILL (`managers/tokenizer_manager.py:4072-4081`)."""
        while True:
            last_counter, last_time = 0, time.monotonic()
            while True:
                now = time.monotonic()
                if self.engine.has_current_batch:
                    if self.engine.forward_ct == last_counter:
                        if now > last_time + timeout:
                            break
                    else:
                        last_counter, last_time = self.engine.forward_ct, now
                await asyncio.sleep(timeout / 2)
            log.error("Scheduler watchdog timeout (self.watchdog_timeout=%s, self.soft=%s)", timeout, soft)
            if soft:
                continue
            await asyncio.sleep(WATCHDOG_GRACE_S)
            log.error("SIGQUIT received. It usually means one child failed.")
            sys.stderr.flush()
            kill_process()
            return

    def _scheduler_died(self, error: str) -> None:
        """What SGLang's scheduler does on an exception it does not catch (see KvReceiver): it
        SIGQUITs the main process (`managers/scheduler.py:6369-6372`), which kills its process
        tree, itself included (`managers/tokenizer_manager.py:4072-4081`)."""
        log.error("Scheduler hit an exception: RuntimeError: %s", error)
        log.error("SIGQUIT received. It usually means one child failed.")
        sys.stderr.flush()
        kill_process()

    def _register_prefill_ranks(self) -> None:
        """What every prefill rank does at start-up: `PUT /route` with its layout and address."""
        a = self.args
        assert self.bootstrap is not None, "prefill ranks register with their own bootstrap server"
        attn_tp = max(1, a.tp_size // (a.attn_dp_size * a.attn_cp_size))
        for dp in range(a.attn_dp_size):
            for cp in range(a.attn_cp_size):
                for tp in range(attn_tp):
                    for pp in range(a.pp_size):
                        self.bootstrap.register({
                            "attn_tp_size": attn_tp, "attn_tp_rank": tp,
                            "attn_cp_size": a.attn_cp_size, "attn_cp_rank": cp,
                            "attn_dp_size": a.attn_dp_size, "attn_dp_rank": dp,
                            "pp_size": a.pp_size, "pp_rank": pp,
                            "system_dp_size": 1, "system_dp_rank": 0,
                            "rank_ip": _advertised_ip(a.host),
                            "rank_port": a.disaggregation_bootstrap_port,
                            "page_size": self.resolved.page_size,
                            "kv_cache_dtype": self.resolved.kv_cache_dtype,
                            "prefill_http_port": a.port,
                            "load_balance_method": self._load_balance_method(),
                            "decode_allocation_policy": a.disaggregation_decode_allocation_policy,
                        })

    def _load_balance_method(self) -> str:
        method: str = self.args.load_balance_method
        if method != "auto":
            return method
        return "follow_bootstrap_room" if self.role == "prefill" else "round_robin"

    # ------------------------------------------------------------------ routes

    def _build_app(self) -> web.Application:
        middlewares = []
        if self.args.api_key or self.args.admin_api_key:
            middlewares.append(auth.middleware(self.args.api_key, self.args.admin_api_key))
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=middlewares)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health)
        r.add_get("/ready", self.ready)
        r.add_get("/ping", self.ping)
        r.add_get("/server_info", self.server_info)
        r.add_get("/get_server_info", self.server_info)
        r.add_get("/model_info", self.model_info)
        r.add_get("/get_model_info", self.model_info)
        r.add_get("/v1/models", self.models)
        r.add_get("/v1/models/{model:.*}", self.model)
        r.add_get("/v1/loads", self.loads)
        r.add_get("/metrics", self.prometheus)
        r.add_route("POST", "/generate", self.generate)
        r.add_route("PUT", "/generate", self.generate)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_post("/pd_role_switch", self.pd_role_switch)
        r.add_post("/abort_request", self.abort_request)
        r.add_post("/pause_generation", self.pause_generation)
        r.add_post("/continue_generation", self.continue_generation)
        r.add_route("GET", "/flush_cache", self.flush_cache)
        r.add_route("POST", "/flush_cache", self.flush_cache)
        r.add_get("/sim/faults", self.get_faults)
        r.add_post("/sim/faults", self.set_faults)
        return app

    async def health(self, request: web.Request) -> web.Response:
        """`/health` and `/health_generate` as 0.5.23 answers them (`entrypoints/http_server.py:721-799`):
        503 while shutting down; a plain 200 for `/health` only when
        `SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION` is off (default on, `environ.py:344`); otherwise a
        one-token generation whose answer is awaited in `asyncio.sleep(1)` steps, so the reply never
        comes before one second. Any output of the scheduler is an answer and sets the status Up;
        none within `SGLANG_HEALTH_CHECK_TIMEOUT` (20 s, line 218) is a 503 that sets it UnHealthy
        (lines 779-799), which `/ready` and `/ping` then answer with until a later check passes.
        Shutting down is looked at on entry only (line 731): a check already waiting when SIGTERM
        comes passes on the scheduler's output, and the drain goes on."""
        if self.shutting_down:
            return web.Response(status=503)
        if request.path == "/health" and not env_bool("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", True):
            return web.Response(status=200)
        timeout = int(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
        tic = time.monotonic()
        # A scheduler that takes the request answers within the first second, even if it stalls or
        # pauses after; one that cannot answers once it can.
        answered = self.engine.responds()
        while time.monotonic() < tic + timeout:
            await asyncio.sleep(1)
            answered = answered or self.engine.responds()
            if answered:
                self.server_status = ServerStatus.UP
                return web.Response(status=200)
        log.error("Health check failed. Server couldn't get a response from detokenizer for last %d seconds.",
                  timeout)
        self.server_status = ServerStatus.UNHEALTHY
        return web.Response(status=503)

    def is_healthy(self) -> bool:
        """`TokenizerManager.is_healthy` (`managers/tokenizer_manager.py:728-730`): not shutting down and
        Up. An engine a failed rebuild broke is still Up here, as in SGLang, whose HTTP layer never
        reads `_pd_role_switch_unhealthy` (`disaggregation/role_switch.py:135, 184`); its next
        health check gets no output and turns it UnHealthy."""
        return not self.shutting_down and self.server_status is ServerStatus.UP

    async def ping(self, request: web.Request) -> web.Response:
        """200 while healthy, also while paused (`entrypoints/http_server.py:2190-2199`)."""
        return web.Response(status=200 if self.is_healthy() else 503)

    async def ready(self, request: web.Request) -> web.Response:
        """200 while healthy and not paused (`entrypoints/http_server.py:714-718`, `is_ready`,
        `managers/tokenizer_manager.py:732-734`): a stalled scheduler keeps it at 200 until a
        health check fails."""
        return web.Response(status=200 if self.is_healthy() and not self.engine.paused else 503)

    def server_info_dict(self) -> dict[str, Any]:
        a = self.args
        resolved = {k: v for k, v in vars(a).items()}
        # The top level is the start-up configuration (`build_server_info` over the resolved
        # server args, `entrypoints/http_server.py:863-892`, `utils/common.py:3584-3593`): a role
        # switch does not change it. The live role is in `internal_states[i]` and in `/model_info`
        # (line 834). `max_running_requests` is the flag as resolved (None when unset); the cap
        # the scheduler sizes from its pool is on `/v1/loads` only. The deprecated
        # `enable_dp_attention` says whether attention DP runs, whichever flag asked for it
        # (`server_args.py:332`, `resolved_dict`).
        resolved.update(
            enable_dp_attention=a.attn_dp_size > 1,
            disaggregation_mode=a.disaggregation_mode,
            load_balance_method=self._load_balance_method(),
            max_running_requests=self.resolved.max_running_requests,
            max_total_tokens=self.perf.kv_capacity_tokens,
            context_length=self.engine.context_length,
            chunked_prefill_size=self.resolved.chunked_prefill_size,
            page_size=self.resolved.page_size,
            mem_fraction_static=self.resolved.mem_fraction_static,
            prefill_attention_backend=self.resolved.prefill_attention_backend,
            decode_attention_backend=self.resolved.decode_attention_backend,
            dcp_comm_backend=a.dcp_comm_backend or "ag_rs",
            tokenizer_path=a.tokenizer_path or a.model_path,
            is_embedding=False,
            weight_version="default",
        )
        return {
            **resolved,
            "launch_command": shlex.join(["python3", "-m", "sglang.launch_server", *self.argv]),
            # One DP rank's pool, as the data-parallel controller reports its first scheduler's
            # (`managers/data_parallel_controller.py:821`).
            "max_total_num_tokens": self.engine.rank_kv_capacity,
            "max_req_input_len": self.engine.context_length - 1,
            "kv_events": None,
            "startup_time": self.startup_time,
            "internal_states": [self._internal_state()],
            "version": SGLANG_VERSION,
            "frontend": "python",
            "simulator": True,
            "simulator_profile": self.options.profile,
            "simulator_time_scale": self.options.time_scale,
        }

    def _internal_state(self) -> dict[str, Any]:
        return {
            "last_gen_throughput": self.engine.gen_throughput(),
            "load": sum(load["num_running_reqs"] for load in self.engine.loads()),
            "memory_usage": {"weight": 0.0, "kvcache": 0.0, "token_capacity": self.perf.kv_capacity_tokens,
                             "graph": 0.0},
            "disaggregation_mode": self.engine.role,
        }

    async def server_info(self, request: web.Request) -> web.Response:
        """Its `internal_states` come from the scheduler (`entrypoints/http_server.py:878`), so the
        answer waits while a role switch or a stall holds it."""
        await self.engine.scheduler_answers()
        return web.json_response(self.server_info_dict())

    async def model_info(self, request: web.Request) -> web.Response:
        a = self.args
        return web.json_response({
            "model_path": a.model_path,
            "served_model_name": a.served_model_name,
            "tokenizer_path": a.tokenizer_path or a.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": "auto",
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": self.engine.role,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": None,
            "architectures": [self.arch.hf_architecture],
            "simulator": True,
        })

    def _model_card(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": int(self.startup_time), "owned_by": "sglang",
                "root": name, "parent": None, "max_model_len": self.engine.context_length}

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_card(self.args.served_model_name)]})

    async def model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if name != self.args.served_model_name:
            return web.json_response(
                {"error": {"message": f"The model '{name}' does not exist", "type": "invalid_request_error",
                           "param": "model", "code": "model_not_found"}},
                status=404,
            )
        return web.json_response(self._model_card(name))

    async def loads(self, request: web.Request) -> web.Response:
        """`/v1/loads` as `entrypoints/v1_loads.py:96-150` answers it. Every core key is there,
        zero or not (`managers/load_snapshot.py:233`); an unknown section raises ValueError in
        `to_dict` unless "all" is among them (lines 235-243), outside the handler's try
        (v1_loads.py:141), so it is a 500, and only when some load is there to convert.
        `dp_rank` keeps that rank's entry; one outside the instance's DP ranks (replicas times
        attention-DP groups, one without either) leaves none, a 200 with no loads
        (`managers/tokenizer_control_mixin.py:1001-1028`)."""
        try:
            dp_rank = validate_query_int(_query(request, "dp_rank"), "dp_rank",
                                         endpoint_context(request.method, "/v1/loads"))
        except RequestValidationError as e:
            return _validation_error(e.message)
        include = _query(request, "include")
        sections = {s.strip() for s in include.split(",")} if include else None
        loads = [load for load in self.engine.loads() if dp_rank in (None, load["dp_rank"])]
        if loads and sections is not None and "all" not in sections and not sections <= LOAD_SECTIONS:
            return web.Response(status=500, text="Internal Server Error")
        if sections is not None and "all" not in sections:
            for load in loads:
                for key, name in (("memory", "memory"), ("disaggregation", "disagg"), ("queues", "queues")):
                    if name not in sections:
                        load.pop(key)
        if _query(request, "format") == "prometheus":
            samples: dict[str, list[str]] = {}
            for load in loads:
                rank = load.pop("dp_rank")
                for key, value in load.items():
                    prefix = {"disaggregation": "disagg"}.get(key, key)
                    items = [(f"sglang_{prefix}_{k}", v) for k, v in value.items()] if isinstance(value, dict) else (
                        [(f"sglang_{key}", value)])
                    for name, v in items:
                        if isinstance(v, (int, float)):
                            samples.setdefault(name, []).append(f'{name}{{dp_rank="{rank}"}} {v}')
            lines = [line for name, rows in samples.items() for line in (f"# TYPE {name} gauge", *rows)]
            return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")
        a = self.args
        accelerators = a.tp_size * a.pp_size
        if a.attn_dp_size > 1:
            accelerators //= self.engine.dp_ranks  # v1_loads.py:44-54: the accelerators behind one DP rank
        return web.json_response({
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
            "version": SGLANG_VERSION,
            "accelerator": "simulator",
            "num_accelerators": accelerators,
            "loads": loads,
        })

    async def prometheus(self, request: web.Request) -> web.Response:
        if not self.args.enable_metrics:
            # No route is mounted without --enable-metrics: FastAPI's own 404.
            return web.json_response({"detail": "Not Found"}, status=404)
        self.engine.refresh_gauges()
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    # ------------------------------------------------------------------ generation

    def _request(self, body: dict[str, Any], prompt_tokens: int, max_new_tokens: int | None, default_max: int,
                 streaming: bool) -> SimRequest:
        """The request the tokenizer manager would send on, after its checks; `max_new_tokens` is
        None when the client named no maximum."""
        for key in ("bootstrap_host", "bootstrap_port", "bootstrap_room"):
            if isinstance(body.get(key), list):
                raise InvalidRequest("batched requests are not supported by the simulator")
        self.engine.check_lengths(prompt_tokens, max_new_tokens)
        if max_new_tokens is not None and max_new_tokens < 0:  # sampling/sampling_params.py:285-289
            raise InvalidRequest(f"max_new_tokens must be at least 0, got {max_new_tokens}.")
        port = body.get("bootstrap_port")
        room = body.get("bootstrap_room")
        return SimRequest(
            prompt_tokens=prompt_tokens,
            max_new_tokens=int(default_max if max_new_tokens is None else max_new_tokens),
            streaming=streaming,
            bootstrap_host=body.get("bootstrap_host"),
            bootstrap_port=int(port) if port is not None else self.args.disaggregation_bootstrap_port,
            bootstrap_room=int(room) if room is not None else None,
            rid=str(body.get("rid") or uuid.uuid4().hex),
        )

    async def _tokens(self, req: SimRequest) -> AsyncGenerator[int, None]:
        """A stream's generated-token counts as they arrive; raises RequestAborted if the scheduler
        aborts it. A stream that stops before its request ends (its client gone, `_stream`) aborts
        the request if the scheduler has it, as `generate_request` does on any exception
        (`managers/tokenizer_manager.py:958-966`, `_release_req_states_on_failure`, lines 3850-3874)."""
        await self.engine.submit(req)
        try:
            while True:
                kind, *rest = await req.events.get()
                if kind == "token":
                    yield rest[0]
                elif kind == "error":
                    raise RequestAborted(rest[0], rest[1])
                else:
                    return
        except BaseException:
            if req.finish_reason is None and req in self.engine.active:
                self.engine.abort(req.rid)
            raise

    async def _complete(self, req: SimRequest, request: web.Request) -> int:
        """The tokens of a request that does not stream, once it ends; raises RequestAborted if the
        scheduler aborts it. The tokenizer manager hears of it every FORCE_STREAM_INTERVAL tokens
        and at its end, and looks whether its client is still there at each output short of the end
        (type 3) and after REQUEST_STATE_WAIT_TIMEOUT_S without one (type 1): the client gone, it
        aborts the request and answers with a ValueError (`managers/tokenizer_manager.py:1956-1974,
        2061-2072`)."""
        await self.engine.submit(req)

        async def output() -> list[Any]:
            while True:
                kind, *rest = await req.events.get()
                if kind != "token" or rest[0] % FORCE_STREAM_INTERVAL == 0:
                    return [kind, *rest]

        while True:
            try:
                kind, *rest = await asyncio.wait_for(output(), REQUEST_STATE_WAIT_TIMEOUT_S)
            except TimeoutError:
                gone = 1
            else:
                if kind == "error":
                    raise RequestAborted(rest[0], rest[1])
                if kind == "finish":
                    return req.generated
                gone = 3
            if req.finish_reason is None and _disconnected(request):
                self.engine.abort(req.rid)
                raise RequestAborted(400, f"Request is disconnected from the client side (type {gone}). "
                                          f"Abort request obj.rid={req.rid!r}")

    async def _stream(self, request: web.Request, chunks: AsyncGenerator[dict[str, Any], None]) -> web.StreamResponse:
        """An event stream. A client that leaves it is heard at once: uvicorn reports ASGI spec 2.3,
        so Starlette's StreamingResponse listens for the disconnect and cancels the stream
        (`starlette/responses.py`, `StreamingResponse.__call__`), and with it the request (`_tokens`),
        before the abort task it runs after the response (`entrypoints/http_server.py:977-981`,
        `managers/tokenizer_manager.py:2427-2438`) would, 2 s later."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        sending = asyncio.create_task(self._send_events(resp, chunks))
        try:
            while not sending.done():
                if _disconnected(request):
                    sending.cancel()
                await asyncio.wait({sending}, timeout=DISCONNECT_POLL_S)
        finally:
            sending.cancel()
        if not (sending.cancelled() or _disconnected(request)):
            sending.result()
        return resp

    @staticmethod
    async def _send_events(resp: web.StreamResponse, chunks: AsyncGenerator[dict[str, Any], None]) -> None:
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()

    @staticmethod
    async def _validated_body(request: web.Request, kind: type) -> dict[str, Any]:
        """The body of a route once FastAPI admits it as `kind` (`simulator.validation`):
        read, the OpenAI routes' Content-Type check, then the schema."""
        content_type = request.headers.get("Content-Type")
        endpoint = endpoint_context(request.method, request.path)
        body = read_body(await request.read(), content_type, endpoint)
        if kind in (CompletionRequest, ChatCompletionRequest):
            require_json_media(content_type)
        valid = validate_body(kind, body, endpoint)
        # A control route reads its Struct, defaults filled in; a generation route the body as sent.
        return valid if issubclass(kind, BaseReq) else dict(body)

    @staticmethod
    async def _json_body(request: web.Request) -> dict[str, Any]:
        """A control route's body: JSON when the Content-Type says so or is absent."""
        media = request.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        if media and media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
            raise InvalidBody(f"the body is {media}, not JSON")
        try:
            body = await request.json()
        except json.JSONDecodeError as e:
            raise InvalidBody(f"JSON decode error: {e}") from e
        if not isinstance(body, dict):
            raise InvalidBody("the body must be a JSON object")
        return body

    def _generate_request(self, body: dict[str, Any], stream: bool) -> SimRequest:
        if isinstance(body.get("text"), list) or (body.get("input_ids") and isinstance(body["input_ids"][0], list)):
            raise InvalidRequest("batched requests are not supported by the simulator")
        if body.get("input_ids") is not None:
            if not body["input_ids"]:
                raise InvalidRequest("input_ids cannot be empty.")  # managers/io_struct.py:488-499
            prompt = len(body["input_ids"])
        elif body.get("text") is not None:
            prompt = count_tokens(body["text"])
        else:
            raise InvalidRequest("Either text, input_ids or input_embeds should be provided.")
        max_new = (body.get("sampling_params") or {}).get("max_new_tokens")
        return self._request(body, prompt, max_new, DEFAULT_GENERATE_MAX_NEW_TOKENS, stream)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """`/generate` (`entrypoints/http_server.py:928-990`). A body the dataclass parse admits but
        the API schema does not is 400 `{"error": "<the schema's text>"}`, streamed or not
        (lines 937-939, `simulator.contract`). A ValueError of the tokenizer manager
        is 400 `{"error": {"message"}}` (line 990, `_create_error_response`, lines 2246-2250), and so
        is a scheduler's abort with 400 (`managers/tokenizer_manager.py:1916-1918`); an abort with
        another status goes through the HTTPException handler (lines 578-630). A stream is 200
        whatever happens: a ValueError is its last chunk, `invalid_request_error` (lines 957-974),
        and an abort is a chunk whose `finish_reason` says so (tokenizer_manager.py:1924)."""
        try:
            body = await self._validated_body(request, GenerateReqInput)
        except BodyUnreadable as e:
            return _http_exception(400, str(e))
        except RequestValidationError as e:
            return _validation_error(e.message)
        contract_error = generate_contract_error(body)
        if contract_error is not None:
            return web.json_response({"error": contract_error}, status=400)
        if not bool(body.get("stream")):
            try:
                req = self._generate_request(body, False)
                n = await self._complete(req, request)
            except InvalidRequest as e:
                return _generate_error(str(e))
            except RequestAborted as e:
                return _generate_error(str(e)) if e.status == 400 else _http_exception(e.status, str(e))
            return web.json_response(self._generate_chunk(req, n, final=True))

        async def chunks() -> AsyncGenerator[dict[str, Any], None]:
            try:
                req = self._generate_request(body, True)
                async with contextlib.aclosing(self._tokens(req)) as tokens:
                    async for n in tokens:
                        yield self._generate_chunk(req, n, final=False)
            except InvalidRequest as e:
                yield {"error": {"message": str(e), "type": "invalid_request_error", "code": 400, "retryable": False}}
                return
            except RequestAborted as e:
                yield self._generate_chunk(req, req.generated, final=True, abort=e)
                return
            yield self._generate_chunk(req, req.generated, final=True)

        return await self._stream(request, chunks())

    def _generate_chunk(self, req: SimRequest, n: int, final: bool,
                        abort: RequestAborted | None = None) -> dict[str, Any]:
        reason = req.finish_reason if final else None
        # FINISH_LENGTH(length=max_new_tokens) where the length cap ends it (`managers/
        # schedule_batch.py:2038-2042`); a PD prefill ends every request at length 0 once its KV
        # is sent, its one token notwithstanding (`disaggregation/prefill.py:1225-1226`).
        length = 0 if self.engine.role == "prefill" else n
        finish: dict[str, Any] | None = {"type": reason, "length": length} if reason else None
        if abort is not None:
            finish = {"type": "abort", "message": str(abort), "status_code": abort.status, "err_type": None}
        return {
            "text": "".join(token_text(i) for i in range(n)),
            "output_ids": [1000 + i for i in range(n)],
            "meta_info": {
                "id": req.rid,
                "finish_reason": finish,
                "prompt_tokens": req.prompt_tokens,
                "weight_version": "default",
                "num_retractions": 0,  # managers/tokenizer_manager.py:2512
                "completion_tokens": n,
                "cached_tokens": 0,
                "e2e_latency": time.monotonic() - req.arrival,
            },
        }

    @staticmethod
    def _usage(req: SimRequest) -> dict[str, Any]:
        return {"prompt_tokens": req.prompt_tokens, "total_tokens": req.prompt_tokens + req.generated,
                "completion_tokens": req.generated, "prompt_tokens_details": None}

    async def _openai(self, request: web.Request, kind: type, parse: Callable[[dict[str, Any]], SimRequest],
                      answer: Callable[[SimRequest, str, int, int], dict[str, Any]],
                      chunk: Callable[[SimRequest, str, int, int | None], dict[str, Any]]) -> web.StreamResponse:
        """`OpenAIServingBase.handle_request` (`entrypoints/openai/serving_base.py:80-142`) for
        completions and chat. A body outside the request's schema is FastAPI's 400; a refusal of
        the serving class or a ValueError of the tokenizer manager is `create_error_response`
        (lines 205-221: `BadRequestError`), a stream's too, as the first chunk is awaited before
        the answer starts (`serving_completions.py:208-212`, `serving_chat.py:2424-2428`). A
        scheduler's abort is `BadRequestError` when 400 and else typed with its status
        (`managers/tokenizer_manager.py:1916-1923`, serving_base.py:119-122); in a stream it is an
        error chunk typed with the status's name, after which the usage chunk still comes
        (`serving_completions.py:355-371, 479-496`, `serving_chat.py:2568-2578`)."""
        try:
            body = await self._validated_body(request, kind)
            req = parse(body)
        except BodyUnreadable as e:
            return _http_exception(400, str(e))
        except RequestValidationError as e:
            return _validation_error(e.message)
        except InvalidRequest as e:
            return _openai_error(str(e))
        model = body.get("model") or self.args.served_model_name
        created = int(time.time())
        if not body.get("stream"):
            try:
                n = await self._complete(req, request)
            except RequestAborted as e:
                return _openai_error(str(e)) if e.status == 400 else _openai_error(str(e), str(e.status), e.status)
            return web.json_response({**answer(req, model, created, n), "usage": self._usage(req)})
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        async def chunks() -> AsyncGenerator[dict[str, Any], None]:
            try:
                async with contextlib.aclosing(self._tokens(req)) as tokens:
                    async for n in tokens:
                        yield chunk(req, model, created, n)
                yield chunk(req, model, created, None)
            except RequestAborted as e:
                yield {"error": _error_body(str(e), HTTPStatus(e.status).name, e.status)}
            if include_usage:
                last = chunk(req, model, created, None)
                yield {**last, "choices": [], "usage": self._usage(req)}

        return await self._stream(request, chunks())

    def _completion_request(self, body: dict[str, Any]) -> SimRequest:
        prompt = body["prompt"]
        if not prompt or (isinstance(prompt, list) and all(not p for p in prompt)):
            raise InvalidRequest("Prompt cannot be empty")  # serving_completions.py:63-69
        if isinstance(prompt, list) and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise InvalidRequest("batched requests are not supported by the simulator")
            prompt = prompt[0]
        prompt_tokens = count_tokens(prompt) if isinstance(prompt, str) else len(prompt)
        # CompletionRequest.max_tokens defaults to 16 (entrypoints/openai/protocol.py): always a maximum.
        max_tokens = body.get("max_tokens")
        return self._request(body, prompt_tokens, DEFAULT_COMPLETION_MAX_TOKENS if max_tokens is None else max_tokens,
                             DEFAULT_COMPLETION_MAX_TOKENS, bool(body.get("stream")))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        def answer(req: SimRequest, model: str, created: int, n: int) -> dict[str, Any]:
            return {"id": f"cmpl-{req.rid}", "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": 0, "text": "".join(token_text(i) for i in range(n)), "logprobs": None,
                                 "finish_reason": req.finish_reason, "matched_stop": None}]}

        def chunk(req: SimRequest, model: str, created: int, n: int | None) -> dict[str, Any]:
            return {"id": f"cmpl-{req.rid}", "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": 0, "text": "" if n is None else token_text(n - 1), "logprobs": None,
                                 "finish_reason": req.finish_reason if n is None else None, "matched_stop": None}]}

        return await self._openai(request, CompletionRequest, self._completion_request, answer, chunk)

    def _chat_request(self, body: dict[str, Any]) -> SimRequest:
        messages = body["messages"]
        if not messages:
            raise InvalidRequest("Messages cannot be empty.")  # serving_chat.py:1103-1106
        text = "".join(f"<|{m.get('role', 'user')}|>{m.get('content') or ''}" for m in messages)
        # entrypoints/openai/protocol.py:1214: the first of them that is set and not 0.
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        return self._request(body, count_tokens(text), max_tokens, DEFAULT_CHAT_MAX_TOKENS, bool(body.get("stream")))

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        def answer(req: SimRequest, model: str, created: int, n: int) -> dict[str, Any]:
            return {"id": f"chatcmpl-{req.rid}", "object": "chat.completion", "created": created, "model": model,
                    "choices": [{"index": 0,
                                 "message": {"role": "assistant", "content": "".join(token_text(i) for i in range(n)),
                                             "reasoning_content": None, "tool_calls": None},
                                 "logprobs": None, "finish_reason": req.finish_reason, "matched_stop": None}]}

        def chunk(req: SimRequest, model: str, created: int, n: int | None) -> dict[str, Any]:
            base = {"id": f"chatcmpl-{req.rid}", "object": "chat.completion.chunk", "created": created, "model": model}
            if n is None:
                return {**base, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                             "finish_reason": req.finish_reason, "matched_stop": None}]}
            delta = {"content": token_text(n - 1)}
            if n == 1:
                delta = {"role": "assistant", **delta}
            return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}

        return await self._openai(request, ChatCompletionRequest, self._chat_request, answer, chunk)

    # ------------------------------------------------------------------ control

    async def _control_body(self, request: web.Request, kind: type) -> dict[str, Any] | web.Response:
        """A control route's body as FastAPI admits it, or FastAPI's refusal as SGLang answers it."""
        try:
            return await self._validated_body(request, kind)
        except BodyUnreadable as e:
            return _http_exception(400, str(e))
        except RequestValidationError as e:
            return _validation_error(e.message)

    async def pd_role_switch(self, request: web.Request) -> web.Response:
        """The scheduler's answer as the tokenizer manager passes it on: a success's message is
        "ok", or "ready" for `prepare_only`, the scheduler's own ("already in target role") being
        dropped (`managers/tokenizer_control_mixin.py:944-958`); the answer is the whole
        `PdRoleSwitchReqOutput`, its unset `rid` and `http_worker_ipc` too
        (`entrypoints/http_server.py:1646-1649`, `utils/msgspec_utils.py:38-44`)."""
        body = await self._control_body(request, PdRoleSwitchReqInput)
        if isinstance(body, web.Response):
            return body
        new_role, prepare_only = body["new_role"], body["prepare_only"]
        answer = await self.engine.switch_role(new_role, body["decode_cuda_graph_memory_gb"], prepare_only)
        message = ("ready" if prepare_only else "ok") if answer.success else answer.message
        return web.json_response(
            {"rid": None, "http_worker_ipc": None, "success": answer.success, "message": message,
             "old_role": answer.old_role, "new_role": new_role, "safe_to_restore": answer.safe_to_restore},
            status=200 if answer.success else 400,
        )

    async def abort_request(self, request: web.Request) -> web.Response:
        """`/abort_request` (`entrypoints/http_server.py:1721-1731`): 200 with no body, whatever was
        aborted. The tokenizer manager ignores an empty rid without `abort_all`, and with one
        tokenizer worker a rid it holds no request of; otherwise the scheduler aborts every request
        whose rid starts with it (`managers/tokenizer_manager.py:2241-2260`, `engine.abort`)."""
        body = await self._control_body(request, AbortReq)
        if isinstance(body, web.Response):
            return body
        rid, abort_all = body["rid"] or "", body["abort_all"]
        if not abort_all and not rid:
            log.warning("Ignore abort_request with empty rid and abort_all=False")
        elif abort_all or self.engine.knows(rid) or self.args.tokenizer_worker_num > 1:
            self.engine.abort(rid, abort_all)
        return web.Response(status=200)

    async def pause_generation(self, request: web.Request) -> web.Response:
        """`Annotated[PauseGenerationReqInput, Body()]` (`entrypoints/http_server.py:1831-1841`): a
        body is required, `{}` pausing with "abort"."""
        body = await self._control_body(request, PauseGenerationReqInput)
        if isinstance(body, web.Response):
            return body
        self.engine.pause(body["mode"])
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        """`Annotated[ContinueGenerationReqInput, Body()]` (`entrypoints/http_server.py:1844-1854`):
        a body is required, `{}` will do."""
        body = await self._control_body(request, ContinueGenerationReqInput)
        if isinstance(body, web.Response):
            return body
        self.engine.resume()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def flush_cache(self, request: web.Request) -> web.Response:
        if not self.engine.is_idle():
            return web.Response(status=400, text="Flush cache failed: there are running or waiting requests.\n")
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details. (When there are "
                                 "running or waiting requests, the operation will not be performed.)\n")

    async def get_faults(self, request: web.Request) -> web.Response:
        return web.json_response({**self.faults.to_dict(), "simulator": True})

    async def set_faults(self, request: web.Request) -> web.Response:
        try:
            changes = await self._json_body(request)
            self.faults.update(changes)
        except (InvalidBody, ValueError) as e:
            return _validation_error(str(e))
        finally:
            self.engine.apply_faults()  # what an update changed before it failed holds too
        if changes.get("crash"):
            asyncio.get_running_loop().call_later(0.05, self._crash, "crash")
        return web.json_response({**self.faults.to_dict(), "simulator": True})


LEADER_GONE_AFTER_MISSES = 3


async def _answer_ok(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _serve_worker_rank(args: argparse.Namespace, options: SimulatorOptions, argv: list[str],
                             stop: asyncio.Event) -> None:
    """A worker rank (`entrypoints/engine.py:1234-1284`): once its schedulers are up it serves
    `launch_dummy_health_check_server` (`utils/common.py:3624-3664`) on `--host:--port`, whose
    `/ping`, `/health` and `/health_generate` answer 200 with no key, whatever the instance does. It
    runs no batches here, so it serves no `/metrics` (SGLang's would, with `--enable-metrics`).

    Its schedulers come up only once they have joined rank 0 (the distributed init at
    `--dist-init-addr`): here, once the leader's HTTP server answers. It then blocks until its
    schedulers exit (`block_until_scheduler_exits`, lines 1015-1026), which they do with rank 0's
    shutdown broadcast whether or not this rank had SIGTERM: a leader that stops (or restarts)
    takes its workers' engines with it. Here: once the leader is gone."""
    log.info("simulator node rank %d of %d: joining rank 0, loading, then serving the dummy health check server",
             args.node_rank, args.nnodes)
    loading = asyncio.create_task(_join_then_load(args, SimulatorServer(args, options, argv).startup_seconds()))
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    runner: web.AppRunner | None = None
    if loading.done():
        app = web.Application()
        for path in ("/ping", "/health", "/health_generate"):
            app.router.add_get(path, _answer_ok)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, args.host, args.port).start()
        log.info("simulator node rank %d serving its health check on %s:%d", args.node_rank, args.host, args.port)
        leader = _leader_url(args, loading.result())
        leader_gone = asyncio.create_task(_leader_answers_until_gone(leader))
        await asyncio.wait({stopping, leader_gone}, return_when=asyncio.FIRST_COMPLETED)
        if leader_gone.done():
            log.info("rank 0 stopped: node rank %d's schedulers exit with its shutdown broadcast", args.node_rank)
            stopping.cancel()
        else:
            leader_gone.cancel()
    else:
        loading.cancel()
        leader = _leader_url(args)
    if stopping.done():
        log.warning("SIGTERM received on node_rank %d; waiting for rank 0 to stop", args.node_rank)
        await _leader_answers_until_gone(leader)
    if runner is not None:
        await runner.cleanup()


def _leader_host(args: argparse.Namespace) -> str:
    """The leader's name: the host of `--dist-init-addr`."""
    return str(args.dist_init_addr or "127.0.0.1:0").rsplit(":", 1)[0]


def _leader_url(args: argparse.Namespace, address: str | None = None) -> str:
    """The leader's `/ready`: at `address` once the rank has joined it, else by its name."""
    host = address or _leader_host(args)
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address
    return f"http://{host}:{args.port}/ready"


async def _leader_address(args: argparse.Namespace) -> str | None:
    """The address the leader's name resolves to as the rank joins it; None where it does not."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(_leader_host(args), None, type=socket.SOCK_STREAM)
    except OSError:
        return None
    return str(infos[0][4][0]) if infos else None


async def _leader_answers(url: str) -> bool:
    """Whether the leader's HTTP server answers at all (a 503 while it starts or stops counts)."""
    try:
        await asyncio.get_running_loop().run_in_executor(None, lambda: urllib.request.urlopen(url, timeout=1).close())
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False
    return True


async def _leader_answers_until_gone(url: str) -> None:
    """A worker rank ignores SIGTERM and stops with rank 0's shutdown broadcast
    (`entrypoints/engine.py:1261-1272`), which comes over the connections the ranks made as they
    joined, whatever becomes of the leader's name: here, once the leader's HTTP server at the
    address it was joined at has missed `LEADER_GONE_AFTER_MISSES` probes in a row (one is a blip,
    which no broadcast stands for)."""
    misses = 0
    while True:
        misses = 0 if await _leader_answers(url) else misses + 1
        if misses >= LEADER_GONE_AFTER_MISSES:
            return
        await asyncio.sleep(0.2)


async def _join_then_load(args: argparse.Namespace, startup_seconds: float) -> str | None:
    """Join rank 0, then load; the leader's address as joined (`_leader_address`)."""
    url = _leader_url(args)
    while not await _leader_answers(url):
        await asyncio.sleep(0.2)
    log.info("simulator node rank %d joined rank 0", args.node_rank)
    address = await _leader_address(args)
    await asyncio.sleep(startup_seconds)
    return address


async def _serve(args: argparse.Namespace, options: SimulatorOptions, argv: list[str]) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if args.node_rank > 0:
        await _serve_worker_rank(args, options, argv, stop)
        return 0
    server = SimulatorServer(args, options, argv)
    starting = asyncio.create_task(server.start())
    stopping = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if starting in done:
        starting.result()
        await stopping
    else:
        starting.cancel()
    log.info("simulator shutting down")
    await (server.shut_down() if starting in done else server.stop())
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    options = SimulatorOptions.from_env()
    if Faults.parse(options.faults).crash_on_start:
        log.error("simulator fault injected (crash_on_start): exiting with status 1")
        return 1
    try:
        args = parse_server_args(argv)
        rank_pool_tokens(args, sized_capacity(args, options, resolve_server_args(args, options)))
    except FlagError as e:
        log.error("simulator refuses these SGLang flags: %s", e)
        return 1
    return asyncio.run(_serve(args, options, argv))
