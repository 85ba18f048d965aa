"""How many SGLang simulators, and how many requests per second, one CPU core sustains.

A fleet test or demo runs many simulated engines on one machine, so their cost per engine and per
request decides how large a simulated fleet can be. The simulators run in one child process (one
event loop: at most one core); a load generator in this process drives them over loopback HTTP.
The time scale is tiny so the performance model's sleeps vanish and the CPU is the bottleneck.

    .venv/bin/python benchmarks/bench_engine_simulator.py [--engines 1 8 32] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import aiohttp

from hybridserving_engine.simulator.args import SimulatorOptions, parse_server_args
from hybridserving_engine.simulator.process import free_ports, wait_http

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def host(ports: list[int], time_scale: float) -> None:
    """Child: serve one unified simulator per port until killed."""
    from hybridserving_engine.simulator.server import SimulatorServer

    options = SimulatorOptions(profile="glm-5.2", time_scale=time_scale, startup_seconds=0.0, faults="")
    for port in ports:
        argv = ["--model-path", "m", "--host", "127.0.0.1", "--port", str(port), "--tp-size", "8", "--enable-metrics"]
        await SimulatorServer(parse_server_args(argv), options, argv).start()
    await asyncio.Event().wait()


def start_host(n: int, time_scale: float) -> tuple[subprocess.Popen, list[int]]:
    ports = free_ports(n)
    log = tempfile.NamedTemporaryFile(prefix="bench-sim-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, __file__, "--host-ports", json.dumps(ports), "--time-scale",
                             str(time_scale)], stdout=log, stderr=subprocess.STDOUT)
    try:
        for port in ports:
            wait_http(f"http://127.0.0.1:{port}/health", timeout=120)
    except TimeoutError as err:
        proc.kill()
        log_tail = pathlib.Path(log.name).read_text()[-3000:]
        raise RuntimeError(f"simulator host did not start; its log:\n{log_tail}") from err
    return proc, ports


async def drive(ports: list[int], seconds: float, concurrency: int, max_tokens: int) -> tuple[int, int]:
    """Closed-loop load: `concurrency` clients, round-robin over engines; returns (requests, tokens)."""
    done = tokens = 0
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def client(i: int) -> None:
            nonlocal done, tokens
            k = i
            while time.monotonic() < deadline:
                url = f"http://127.0.0.1:{ports[k % len(ports)]}/v1/completions"
                async with session.post(url, json={"prompt": "hello " * 200, "max_tokens": max_tokens}) as r:
                    body = await r.json()
                done += 1
                tokens += body["usage"]["completion_tokens"]
                k += 1

        await asyncio.gather(*(client(i) for i in range(concurrency)))
    return done, tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--time-scale", type=float, default=1e-4)
    p.add_argument("--host-ports", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.host_ports:
        asyncio.run(host(json.loads(args.host_ports), args.time_scale))
        return

    print(f"SGLang simulator on one core (time scale {args.time_scale:g}, {args.max_tokens} output tokens, "
          f"{args.concurrency} concurrent clients, {args.seconds:g} s per run)")
    print(f"{'engines':>8} {'idle CPU %':>11} {'RSS MiB':>8} {'MiB/engine':>11} {'req/s':>8} {'tok/s':>9} "
          f"{'sim CPU %':>10} {'req/s per core':>15}")
    for n in args.engines:
        proc, ports = start_host(n, args.time_scale)
        try:
            time.sleep(0.5)
            c0, t0 = cpu_seconds(proc.pid), time.monotonic()
            time.sleep(2.0)
            idle = (cpu_seconds(proc.pid) - c0) / (time.monotonic() - t0) * 100
            rss = rss_mib(proc.pid)
            c0, t0 = cpu_seconds(proc.pid), time.monotonic()
            done, tokens = asyncio.run(drive(ports, args.seconds, args.concurrency, args.max_tokens))
            wall = time.monotonic() - t0
            busy = (cpu_seconds(proc.pid) - c0) / wall
            rate = done / wall
            print(f"{n:>8} {idle:>11.1f} {rss:>8.0f} {rss / n:>11.1f} {rate:>8.0f} {tokens / wall:>9.0f} "
                  f"{busy * 100:>10.0f} {rate / max(busy, 1e-9):>15.0f}")
        finally:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
