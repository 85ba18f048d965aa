"""The prefill/decode rendezvous: SGLang's bootstrap server plus a simulated KV hand-over.

SGLang's prefill runs an aiohttp bootstrap server (`PUT/GET /route`, `/health`, DP-rank rooms)
where its ranks register; a decode instance looks the prefill ranks up there and the KV then
moves over RDMA, keyed by the request's `bootstrap_room`. The simulator keeps the same server and
routes, and replaces the RDMA write with one loopback HTTP call on the address the prefill
registered: the decode instance POSTs `/sim/kv/{room}` once it holds KV slots for the request,
and the call returns when the prefill instance has computed the prompt and "sent" its KV. So the
prefill work happens on the prefill instance and the decode work on the decode instance, and each
waits for the other exactly where SGLang's queues would.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

log = logging.getLogger("hybridserving.simulator")

# SGLang's health-check requests carry this host; they never reach a peer.
FAKE_BOOTSTRAP_HOST = "2.2.2.2"


class HandoffError(RuntimeError):
    """The peer never showed up, or the hand-over was aborted."""


@dataclass
class Room:
    """One request's rendezvous: the decode side's slot reservation and the prefill side's result."""

    decode_ready: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Future[dict[str, Any]] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class BootstrapServer:
    """SGLang's `CommonKVBootstrapServer` routes, plus the simulator's `/sim/kv/{room}` hand-over."""

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self.host = host
        self.port = port
        self.timeout_s = timeout_s
        self.rooms: dict[int, Room] = {}
        self.rank_table: dict[tuple[int, int, int, int], dict[str, Any]] = {}
        self.layout: dict[str, Any] | None = None
        self.expected_ranks = 0
        self.room_to_dp_rank: dict[int, int] = {}
        self.app = web.Application()
        self.app.router.add_route("*", "/route", self._route)
        self.app.router.add_post("/register_dp_rank", self._register_dp_rank)
        self.app.router.add_post("/query_dp_ranks", self._query_dp_ranks)
        self.app.router.add_get("/health", self._health)
        self.app.router.add_post("/sim/kv/{room}", self._kv_handoff)
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        log.info("simulator bootstrap server listening on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        for room in self.rooms.values():
            if not room.done.done():
                room.done.set_exception(HandoffError("bootstrap server stopped"))
        if self._runner is not None:
            await self._runner.cleanup()

    # ---- registration (what the prefill ranks do at start-up)

    def register(self, registration: dict[str, Any]) -> None:
        """Record one prefill rank, as `PUT /route` does."""
        if self.layout is None:
            self.layout = {
                "attn_tp_size": registration["attn_tp_size"],
                "attn_cp_size": registration["attn_cp_size"],
                "dp_size": registration["attn_dp_size"],
                "pp_size": registration["pp_size"],
                "page_size": registration["page_size"],
                "kv_cache_dtype": registration["kv_cache_dtype"],
                "follow_bootstrap_room": registration.get("load_balance_method", "follow_bootstrap_room")
                == "follow_bootstrap_room",
                "enable_dsa_cache_layer_split": bool(registration.get("enable_dsa_cache_layer_split", False)),
                "enable_kv_cache_sharding": bool(registration.get("enable_kv_cache_sharding", False)),
                "prefill_http_port": registration.get("prefill_http_port"),
                "decode_allocation_policy": registration.get("decode_allocation_policy", "early"),
            }
            lay = self.layout
            self.expected_ranks = lay["attn_tp_size"] * lay["attn_cp_size"] * lay["dp_size"] * lay["pp_size"]
        key = (
            registration["attn_dp_rank"],
            registration["attn_cp_rank"],
            registration["attn_tp_rank"],
            registration["pp_rank"],
        )
        self.rank_table[key] = {"rank_ip": registration["rank_ip"], "rank_port": int(registration["rank_port"])}

    def ready(self) -> bool:
        return self.layout is not None and len(self.rank_table) >= self.expected_ranks

    async def _route(self, request: web.Request) -> web.StreamResponse:
        if request.method == "PUT":
            self.register(await request.json())
            return web.Response(text="OK")
        if request.method != "GET":
            return web.Response(text="Method not allowed", status=405)
        q = request.query
        names = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")
        if not all(q.get(n) for n in names):
            return web.Response(text="Missing inputs for bootstrap server.", status=400)
        dp_rank, cp_rank, tp_rank, pp_rank = (int(q[n]) for n in names)
        key = (dp_rank, cp_rank, tp_rank, pp_rank)
        if not self.ready():
            return web.Response(
                text=f"Prefill server not fully registered yet ({len(self.rank_table)} workers registered).",
                status=503,
            )
        if key == (-1, -1, -1, -1):
            return web.json_response(self.layout)
        info = self.rank_table.get(key)
        if info is None:
            return web.Response(text=f"Bootstrap info not found for {key}", status=404)
        return web.json_response(info)

    async def _register_dp_rank(self, request: web.Request) -> web.Response:
        data = await request.json()
        self.room_to_dp_rank[int(data["bootstrap_room"])] = int(data["dp_rank"])
        return web.Response(text="OK")

    async def _query_dp_ranks(self, request: web.Request) -> web.Response:
        data = await request.json()
        rooms = [int(r) for r in data["bootstrap_rooms"]]
        return web.json_response({str(r): self.room_to_dp_rank[r] for r in rooms if r in self.room_to_dp_rank})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    # ---- the hand-over

    def room(self, room_id: int) -> Room:
        room = self.rooms.get(room_id)
        if room is None:
            room = self.rooms[room_id] = Room()
        return room

    async def wait_for_decode(self, room_id: int) -> None:
        """Prefill side: block in the bootstrap queue until the decode peer holds KV slots."""
        room = self.room(room_id)
        try:
            await asyncio.wait_for(room.decode_ready.wait(), self.timeout_s)
        except asyncio.TimeoutError:
            self.rooms.pop(room_id, None)
            raise HandoffError(f"no decode peer registered room {room_id} within {self.timeout_s:.0f} s") from None

    def publish(self, room_id: int, result: dict[str, Any]) -> None:
        """Prefill side: the KV of `room_id` has landed on the decode peer."""
        room = self.rooms.pop(room_id, None)
        if room is not None and not room.done.done():
            room.done.set_result(result)

    def fail(self, room_id: int, reason: str) -> None:
        room = self.rooms.pop(room_id, None)
        if room is not None and not room.done.done():
            room.done.set_exception(HandoffError(reason))

    async def _kv_handoff(self, request: web.Request) -> web.Response:
        room_id = int(request.match_info["room"])
        room = self.room(room_id)
        room.decode_ready.set()
        try:
            result = await asyncio.wait_for(asyncio.shield(room.done), self.timeout_s)
        except asyncio.TimeoutError:
            self.rooms.pop(room_id, None)
            return web.json_response({"error": f"prefill never served room {room_id}"}, status=504)
        except HandoffError as e:
            return web.json_response({"error": str(e)}, status=502)
        return web.json_response(result)


class KvReceiver:
    """Decode side: find the prefill rank through its bootstrap server, then wait for the KV."""

    def __init__(self, timeout_s: float, page_size: int = 1, kv_cache_dtype: str = "auto",
                 on_incompatible: Callable[[str], None] | None = None, dcp_size: int = 1, pp_size: int = 1) -> None:
        self.timeout_s = timeout_s
        self.page_size = page_size
        self.kv_cache_dtype = kv_cache_dtype
        self.dcp_size = dcp_size
        self.pp_size = pp_size
        self.on_incompatible = on_incompatible
        self._rank_addr: dict[tuple[str, int], tuple[str, int]] = {}
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
                connector=aiohttp.TCPConnector(limit=0),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _prefill_rank(self, host: str, port: int) -> tuple[str, int]:
        cached = self._rank_addr.get((host, port))
        if cached is not None:
            return cached
        base = f"http://{host}:{port}/route"
        deadline = time.monotonic() + self.timeout_s
        layout_params = dict.fromkeys(("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank"), "-1")
        rank_params = {"prefill_dp_rank": "0", "prefill_cp_rank": "0", "target_tp_rank": "0", "target_pp_rank": "0"}
        while True:
            try:
                (layout_status, layout), (status, info) = await asyncio.gather(
                    self._get_json(base, layout_params), self._get_json(base, rank_params))
                if layout_status == 200:
                    self._check_layout(layout)
                if status == 200:
                    addr = (info["rank_ip"], int(info["rank_port"]))
                    self._rank_addr[(host, port)] = addr
                    return addr
                detail = str(info)
            except aiohttp.ClientError as e:
                detail = str(e)
            if time.monotonic() > deadline:
                raise HandoffError(f"bootstrap server {host}:{port} not ready: {detail}")
            await asyncio.sleep(0.2)

    async def _get_json(self, url: str, params: dict[str, str]) -> tuple[int, Any]:
        async with self._client().get(url, params=params) as resp:
            if resp.status == 200:
                return resp.status, await resp.json()
            return resp.status, await resp.text()

    def _check_layout(self, info: dict[str, Any]) -> None:
        """The decode side's sanity checks on the prefill it pairs with
        (`disaggregation/common/conn.py:1319-1334`, the DCP one at 1411-1421, the pp assert at
        1516-1518).

        SGLang raises a RuntimeError there that nothing catches on the way up
        (`disaggregation/decode.py:1200`, `_resolve_pending_reqs`): the decode scheduler dies
        and SIGQUITs its server (`managers/scheduler.py:6370-6373`). `on_incompatible` does
        the same to the simulator's process; the request fails either way.
        """
        message = None
        if info.get("page_size") is not None and info["page_size"] != self.page_size:
            message = (f"Page size mismatch: prefill server has page_size={info['page_size']}, but decode server has "
                       f"page_size={self.page_size}. Both servers must use the same --page-size value.")
        elif info.get("kv_cache_dtype") is not None and info["kv_cache_dtype"] != self.kv_cache_dtype:
            message = (f"KV cache dtype mismatch: prefill server has kv_cache_dtype={info['kv_cache_dtype']}, but "
                       f"decode server has kv_cache_dtype={self.kv_cache_dtype}. Both servers must use the same "
                       "--kv-cache-dtype value.")
        elif self.dcp_size > 1 and info.get("attn_cp_size", 1) != 1:
            message = f"PD decode DCP currently requires prefill attention CP=1, got {info['attn_cp_size']}."
        elif info.get("pp_size") is not None and self.pp_size not in (info["pp_size"], 1):
            message = f"Decode pp size ({self.pp_size}) should be equal to prefill pp size ({info['pp_size']}) or 1"
        if message is None:
            return
        if self.on_incompatible is not None:
            self.on_incompatible(message)
        raise HandoffError(message)

    async def receive(self, host: str, port: int, room_id: int, prompt_tokens: int) -> dict[str, Any]:
        """Announce the reserved slots for `room_id` and return once the prefill has sent the KV."""
        rank_ip, rank_port = await self._prefill_rank(host, port)
        url = f"http://{rank_ip}:{rank_port}/sim/kv/{room_id}"
        try:
            async with self._client().post(url, json={"prompt_tokens": prompt_tokens}) as resp:
                body: dict[str, Any] = await resp.json()
                if resp.status != 200:
                    raise HandoffError(body.get("error", f"hand-over failed with HTTP {resp.status}"))
                return body
        except aiohttp.ClientError as e:
            self._rank_addr.pop((host, port), None)
            raise HandoffError(f"KV hand-over from {host}:{port} failed: {e}") from e
