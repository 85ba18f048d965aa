"""The launcher and the engine's processes: its output without the fleet's key, its stop, SIGTERM in
the middle of a start or a role switch, and the orphans it leaves to PID 1."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from support.polling import wait_for
from hybridserving.devcluster.cluster import pid_alive
from hybridserving_engine import children
from hybridserving_engine import launcher as launcher_module
from hybridserving_engine.children import Redactor
from hybridserving_engine.launcher import Launcher, Settings
from hybridserving_engine.simulator.process import free_port

KEY = "fleet-key-0123456789abcdef"


def settings(tmp_path: Path, role: str = "prefill", argv: list[str] | None = None, **overrides) -> Settings:
    cfg = tmp_path / "cfg"
    cfg.mkdir(exist_ok=True)
    for r in ("prefill", "decode"):
        (cfg / f"{r}.json").write_text(json.dumps({"argv": argv or []}))
    (tmp_path / "role").write_text(role)
    values = dict(config_dir=cfg, role_file=tmp_path / "role", backend="simulator", host="127.0.0.1",
                  port=free_port(), poll_interval_s=0.01, drain_timeout_s=30, idle_window_s=0.05)
    values.update(overrides)
    return Settings(**values)


def python(script: str):
    """An engine command: `script` run by Python with the engine's argv."""
    return lambda backend, argv: [sys.executable, "-c", textwrap.dedent(script), *argv]


async def until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


# ------------------------------------------------------------------ output


def test_the_key_is_blanked_however_the_output_is_cut(monkeypatch):
    r = Redactor(KEY)
    line = f"server_args={{'api_key': '{KEY}', 'port': 1}}\n".encode()
    out = b"".join(r.feed(line[i:i + 7]) for i in range(0, len(line), 7)) + r.close()
    assert out == b"server_args={'api_key': '<redacted>', 'port': 1}\n"
    # A line with no end in sight is passed on in pieces, never with a piece of the key at a cut.
    monkeypatch.setattr(children, "MAX_LINE", 64)
    r = Redactor(KEY)
    long = b"x" * 60 + KEY.encode() + b"y" * 100
    pieces = [r.feed(long[:70]), r.feed(long[70:150]), r.feed(long[150:]), r.close()]
    assert pieces[0] == b"x" * 60 and b"".join(pieces) == b"x" * 60 + b"<redacted>" + b"y" * 100
    assert Redactor(None).feed(b"no key\rprogress") == b"no key\r"


def test_output_that_cannot_be_passed_on_is_still_read_to_its_end():
    engine_r, engine_w = os.pipe()
    log_r, log_w = os.pipe()
    os.close(log_r)  # writes to log_w now fail (EPIPE)
    forwarder = children.Forwarder(engine_r, log_w, KEY)
    try:
        for _ in range(64):  # four times what a pipe holds
            os.write(engine_w, b"x" * 4095 + b"\n")
    finally:
        os.close(engine_w)
    assert forwarder.join(10)
    os.close(log_w)


def test_the_engines_output_reaches_the_log_whole_and_without_the_key(tmp_path, capfd):
    # SGLang logs its server_args, api_key included (entrypoints/engine.py:1185): here a stand-in
    # prints its argv on both streams, then more than a pipe holds, then a last line without an end.
    engine = python("""
        import sys
        print("server_args=", sys.argv[1:], flush=True)
        print("server_args=", sys.argv[1:], file=sys.stderr, flush=True)
        for i in range(40000):
            print(f"line {i} " + "x" * 80)
        sys.stdout.write("last words")
        raise SystemExit(3)
    """)
    launcher = Launcher(settings(tmp_path, api_key=KEY, crash_loop_restarts=1, restart_backoff_s=0.01),
                        command=engine)
    assert asyncio.run(asyncio.wait_for(launcher.run(), 60)) == 3
    out, err = capfd.readouterr()
    assert KEY not in out and KEY not in err
    assert "'--api-key', '<redacted>'" in out and "'--api-key', '<redacted>'" in err
    assert out.count("x" * 80) == 40000 and out.endswith("last words")


# ------------------------------------------------------------------ stopping


def test_stop_signals_the_engines_main_process_and_kills_its_group_after_the_grace(tmp_path):
    # SGLang's schedulers have no SIGTERM handler; one that got the signal would die at once and take
    # the main process's graceful exit with it. Only the main process may get it.
    marks = tmp_path / "marks"
    marks.mkdir()
    engine = python(f"""
        import signal, subprocess, sys, time
        from pathlib import Path
        marks = Path({str(marks)!r})
        child = subprocess.Popen([sys.executable, "-c", '''
        import signal, time
        from pathlib import Path
        signal.signal(signal.SIGTERM, lambda *_: Path({str(marks)!r}, "child").touch())
        Path({str(marks)!r}, "child-up").touch()
        time.sleep(60)
        '''])
        signal.signal(signal.SIGTERM, lambda *_: (marks / "parent").touch())
        while not (marks / "child-up").exists():
            time.sleep(0.01)
        (marks / "pid").write_text(str(child.pid))
        time.sleep(60)
    """)
    launcher = Launcher(settings(tmp_path, stop_grace_s=1.0), command=engine)

    async def scenario() -> float:
        await launcher.start_engine("prefill")
        await until(lambda: (marks / "pid").exists())
        started = time.monotonic()
        await launcher.stop_engine()
        return time.monotonic() - started

    took = asyncio.run(scenario())
    child = int((marks / "pid").read_text())
    assert (marks / "parent").exists() and not (marks / "child").exists()
    assert 1.0 <= took < 10 and not pid_alive(child)
    assert launcher.last_exit_code == -9


def test_stopping_an_engine_that_exited_before_the_loop_heard_of_it_reports_its_status(tmp_path, monkeypatch):
    """asyncio's child watcher reaps an engine that exits on its own thread and tells the loop later;
    a stop in between finds `returncode` unset and a pid the kernel no longer knows (ESRCH). The stop
    must still end with the engine's exit status, not with ProcessLookupError out of the shutdown."""
    launcher = Launcher(settings(tmp_path), command=python("import time; time.sleep(0.2); raise SystemExit(7)"))
    signalled: list[int] = []
    engine: list[int] = []
    real_kill = os.kill

    def kill_after_the_reap(pid: int, sig: int) -> None:
        if pid not in engine:
            return real_kill(pid, sig)
        deadline = time.monotonic() + 10
        while pid_alive(pid):  # exited: from here the watcher may reap it before the loop hears
            assert time.monotonic() < deadline, "the engine did not exit"
            time.sleep(0.01)
        signalled.append(sig)
        raise ProcessLookupError(errno.ESRCH, "No such process")

    async def scenario() -> None:
        await launcher.start_engine("prefill")
        assert launcher.proc is not None and launcher.proc.returncode is None
        engine.append(launcher.proc.pid)
        monkeypatch.setattr(os, "kill", kill_after_the_reap)
        await launcher.stop_engine()

    asyncio.run(scenario())
    assert signalled == [signal.SIGTERM]
    assert launcher.last_exit_code == 7 and launcher.proc is None


def test_an_engine_that_crashed_is_not_ready_while_its_output_is_still_being_read(tmp_path, monkeypatch):
    """The crash path waits for the engine's output to end (up to seconds where something outside
    its group holds the pipe); `/readyz` is answered meanwhile and must not say ready."""
    launcher = Launcher(settings(tmp_path), command=python("raise SystemExit(3)"))
    ready_while_reading: list[bool] = []
    finish_output = launcher._finish_output

    async def slow_finish() -> None:
        ready_while_reading.append(launcher.is_ready())
        await finish_output()

    async def scenario() -> None:
        await launcher.start_engine("prefill")
        assert launcher.proc is not None
        await launcher.proc.wait()
        launcher.set_phase("Ready", "serving")
        launcher.engine_healthy = True
        monkeypatch.setattr(launcher, "_finish_output", slow_finish)
        launcher._terminate.set()  # no restart after the backoff: only the crash path's start is under test
        await launcher._restart_after_crash()

    asyncio.run(scenario())
    assert ready_while_reading == [False]
    assert launcher.last_exit_code == 3 and not launcher.is_ready()


def test_the_drain_on_sigterm_ends_at_the_drain_timeout_counted_from_the_signal(tmp_path, monkeypatch):
    """The pod's grace is the drain timeout plus the stop grace, from the signal: a shutdown that
    starts late, or an engine whose `/v1/loads` never answers, must not eat into the stop grace."""
    launcher = Launcher(settings(tmp_path, drain_timeout_s=5), command=python("import time; time.sleep(60)"))

    async def hanging_loads() -> None:
        await asyncio.sleep(60)

    async def scenario() -> tuple[float, float]:
        await launcher.start_engine("prefill")
        launcher.may_hold_requests = True
        monkeypatch.setattr(launcher, "engine_loads", hanging_loads)
        started = time.monotonic()
        assert not await launcher.drain(deadline=started + 0.3)
        unanswered = time.monotonic() - started
        launcher._on_terminate()
        launcher._terminated_at = time.monotonic() - 4.8  # the signal came while the launcher was busy
        assert not launcher.is_ready()
        started = time.monotonic()
        await launcher._shutdown()
        return unanswered, time.monotonic() - started

    unanswered, shutdown = asyncio.run(scenario())
    assert unanswered < 2.0, f"a drain waited {unanswered:.1f} s on an unanswered read past its deadline"
    assert shutdown < 3.0, f"the shutdown drained {shutdown:.1f} s past the drain timeout from the signal"
    assert launcher.phase == "Stopped" and launcher.proc is None


def test_a_role_watch_that_fails_unforeseen_is_logged_and_keeps_watching(tmp_path, monkeypatch, caplog):
    """Nothing awaits the watchers: one ended by an error would stop role switches silently."""
    launcher = Launcher(settings(tmp_path), command=python("import time; time.sleep(60)"))
    launcher._handled_role = "prefill"
    failures = iter([RuntimeError("a read nobody foresaw")])
    real_read_role = launcher_module.read_role

    def read_role_failing_once(path: Path) -> str | None:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return real_read_role(path)

    monkeypatch.setattr(launcher_module, "read_role", read_role_failing_once)

    async def scenario() -> None:
        watcher = asyncio.create_task(launcher._keep_watching(launcher._watch_role_file, "role file watch"))
        try:
            (tmp_path / "role").write_text("decode")
            await asyncio.wait_for(launcher._role_changed.wait(), 10)
        finally:
            watcher.cancel()

    asyncio.run(scenario())
    assert launcher.desired_role == "decode"
    assert "role file watch failed" in caplog.text and "a read nobody foresaw" in caplog.text


def test_sigterm_while_the_engine_starts_stops_it_without_draining(tmp_path):
    # An engine that has not served yet holds no request: no waiting out the drain timeout (30 s).
    launcher = Launcher(settings(tmp_path), command=python("import time; time.sleep(60)"))

    async def scenario() -> float:
        task = asyncio.create_task(launcher.run())
        await until(lambda: launcher.proc is not None and launcher.phase == "Starting")
        await asyncio.sleep(0.2)
        started = time.monotonic()
        launcher._terminate.set()
        assert await asyncio.wait_for(task, 20) == 0
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 5
    assert launcher.phase == "Stopped" and launcher.proc is None


def test_a_launcher_that_fails_takes_its_engine_down_with_it(tmp_path, monkeypatch):
    launcher = Launcher(settings(tmp_path), command=python("import time; time.sleep(60)"))

    async def failing_supervision() -> None:
        raise RuntimeError("supervision failed")

    monkeypatch.setattr(launcher, "_supervise", failing_supervision)

    async def scenario() -> int:
        task = asyncio.create_task(launcher.run())
        await until(lambda: launcher.proc is not None)
        engine = launcher.proc.pid
        with pytest.raises(RuntimeError, match="supervision failed"):
            await asyncio.wait_for(task, 20)
        return engine

    engine = asyncio.run(scenario())
    wait_for(lambda: not pid_alive(engine), 5, "the engine to be killed")


def test_sigterm_during_a_relaunch_switch_starts_no_new_engine(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    starts: list[list[str]] = []

    def engine(backend: str, argv: list[str]) -> list[str]:
        starts.append(argv)
        # Takes a second to stop, as an engine that releases its GPUs does.
        return python(f"""
            import signal, sys, time
            from pathlib import Path
            signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1), sys.exit(0)))
            Path({str(marks)!r}, "up").touch()
            time.sleep(60)
        """)(backend, argv)

    launcher = Launcher(settings(tmp_path, stop_grace_s=10), command=engine)

    async def scenario() -> None:
        task = asyncio.create_task(launcher.run())
        await until(lambda: (marks / "up").exists())
        (tmp_path / "role").write_text("decode")
        await until(lambda: launcher.last_switch is not None and launcher.last_switch.step == "Stopping")
        launcher._terminate.set()
        assert await asyncio.wait_for(task, 20) == 0

    asyncio.run(scenario())
    assert len(starts) == 1
    assert launcher.last_switch is not None
    assert (launcher.last_switch.mode, launcher.last_switch.outcome) == ("relaunch", "Aborted")
    assert "Starting" not in [s["step"] for s in launcher.last_switch.steps]


# ------------------------------------------------------------------ an engine's HTTP API, stood in for


class FakeEngine:
    """The routes the launcher calls, on a port of its own; /pd_role_switch and /model_info answer
    only when told to."""

    def __init__(self) -> None:
        self.port = free_port()
        self.answer = asyncio.Event()
        self.switch_posted = asyncio.Event()
        app = web.Application()
        app.router.add_get("/ready", self._ok)
        app.router.add_get("/v1/loads", self._loads)
        app.router.add_post("/pd_role_switch", self._switch)
        app.router.add_get("/model_info", self._model_info)
        self.runner = web.AppRunner(app)

    async def __aenter__(self) -> FakeEngine:
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.answer.set()
        await self.runner.cleanup()

    async def _ok(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def _loads(self, request: web.Request) -> web.Response:
        return web.json_response({"loads": [{"num_running_reqs": 0, "num_waiting_reqs": 0}]})

    async def _switch(self, request: web.Request) -> web.Response:
        self.switch_posted.set()
        await self.answer.wait()
        return web.json_response({"success": True})

    async def _model_info(self, request: web.Request) -> web.Response:
        await self.answer.wait()
        return web.json_response({"disaggregation_mode": "decode"})


def test_sigterm_ends_an_in_place_switch_the_engine_has_not_answered(tmp_path):
    async def scenario() -> Launcher:
        async with FakeEngine() as fake:
            argv = ["--host", "127.0.0.1", "--port", str(fake.port), "--enable-pd-role-switch"]
            launcher = Launcher(settings(tmp_path, argv=argv), command=python("import time; time.sleep(60)"))
            task = asyncio.create_task(launcher.run())
            await until(lambda: launcher.phase == "Ready")
            (tmp_path / "role").write_text("decode")
            await asyncio.wait_for(fake.switch_posted.wait(), 10)
            launcher._terminate.set()
            assert await asyncio.wait_for(task, 10) == 0
            return launcher

    launcher = asyncio.run(scenario())
    assert launcher.last_switch is not None
    assert (launcher.last_switch.mode, launcher.last_switch.outcome) == ("in-place", "Aborted")
    assert launcher.role == "prefill" and launcher.phase == "Stopped"


def test_an_engine_that_times_out_reporting_its_role_reports_none(tmp_path):
    # aiohttp's total timeout raises TimeoutError, not a ClientError.
    async def scenario() -> str | None:
        async with FakeEngine() as fake:
            launcher = Launcher(settings(tmp_path))
            launcher.argv = ["--port", str(fake.port)]
            launcher._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.2))
            try:
                return await launcher._engine_role()
            finally:
                await launcher._session.close()

    assert asyncio.run(scenario()) is None


# ------------------------------------------------------------------ orphans


def test_orphans_of_the_engine_are_reaped_and_the_engine_itself_is_left_to_asyncio():
    # As a subreaper the script inherits orphans as PID 1 does: the engine (a session leader) leaves
    # a child behind; the orphan is reaped, the engine's own exit status is not taken.
    script = textwrap.dedent("""
        import ctypes, json, subprocess, time
        from hybridserving_engine.children import reap_orphans
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
        engine = subprocess.Popen(["sh", "-c", "sleep 0.2 & echo $!; exit 7"], stdout=subprocess.PIPE,
                                  start_new_session=True)
        orphan = int(engine.stdout.readline())
        time.sleep(0.6)
        reaped = reap_orphans()
        print(json.dumps({"engine": engine.pid, "orphan": orphan, "reaped": reaped, "status": engine.wait()}))
    """)
    result = json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, check=True,
                                       timeout=30).stdout)
    assert result["reaped"] == [result["orphan"]] and result["status"] == 7


def test_a_launcher_that_reaps_orphans_still_sees_its_engines_exit_status(tmp_path):
    stray = subprocess.Popen([sys.executable, "-c", "pass"])  # a zombie child that leads no session
    launcher = Launcher(settings(tmp_path, crash_loop_restarts=1),
                        command=python("import time; time.sleep(0.5); raise SystemExit(3)"), reaps_orphans=True)
    assert asyncio.run(asyncio.wait_for(launcher.run(), 30)) == 3
    assert launcher.last_exit_code == 3
    with pytest.raises(ChildProcessError):
        os.waitpid(stray.pid, os.WNOHANG)
    stray.returncode = 0  # reaped above; keeps Popen from looking again
