"""The engine launcher: config and role reading, preflight, supervision, drain on SIGTERM, role switch."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

import httpx
import pytest

from hybridserving.contract import CONFIG_HASH_FILE_NAME, ENV_NODE_RANK, role_document_name
from hybridserving_engine import preflight
from hybridserving_engine.launcher import (
    ConfigError,
    Launcher,
    RoleConfig,
    Settings,
    engine_url,
    inflight_requests,
    load_role_config,
    main,
    pinned_document,
    read_role,
    restart_backoff,
)
from hybridserving_engine.simulator.process import free_port, simulator_env, wait_http

# ------------------------------------------------------------------ configuration


def write_config(directory: Path, role: str, data: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{role}.json").write_text(json.dumps(data))


def test_shared_argv_gets_node_rank_and_nnodes_on_multi_node_instances(tmp_path):
    write_config(tmp_path, "decode", {"nnodes": 2, "argv": ["--tp-size", "16", "--dist-init-addr", "leader:20102"]})
    config = load_role_config(tmp_path / "decode.json")
    assert config.argv_for(1) == ["--tp-size", "16", "--dist-init-addr", "leader:20102", "--nnodes", "2",
                                  "--node-rank", "1"]
    with pytest.raises(ConfigError, match="outside 0..1"):
        config.argv_for(2)


def test_per_rank_argv_is_taken_as_written(tmp_path):
    write_config(tmp_path, "prefill", {"ranks": [["--node-rank", "0"], ["--node-rank", "1"]],
                                       "decode_cuda_graph_memory_gb": 3})
    config = load_role_config(tmp_path / "prefill.json")
    assert config.nnodes == 2 and config.argv_for(1) == ["--node-rank", "1"]
    assert config.decode_cuda_graph_memory_gb == 3.0
    assert RoleConfig(nnodes=1, argv=("--port", "1")).argv_for(0) == ["--port", "1"]


@pytest.mark.parametrize(
    "data, message",
    [
        ({"argv": [], "ranks": [[]]}, "exactly one"),
        ({"ranks": [["a"]], "nnodes": 2}, "lists 1 rank"),
        ({"argv": "--x"}, "list of strings"),
        ({"argv": [], "nnodes": "two"}, "'nnodes' must be a whole number of at least 1, not 'two'"),
        ({"argv": [], "nnodes": 2.5}, "'nnodes' must be a whole number of at least 1, not 2.5"),
        ({"argv": [], "nnodes": 0}, "'nnodes' must be a whole number"),
        ({"ranks": {"0": []}}, "'ranks' must be a list of argvs"),
        ({"argv": [], "decode_cuda_graph_memory_gb": "lots"}, "'decode_cuda_graph_memory_gb' must be a number"),
    ],
)
def test_bad_config_is_reported_with_the_file(tmp_path, data, message):
    write_config(tmp_path, "decode", data)
    with pytest.raises(ConfigError, match=message):
        load_role_config(tmp_path / "decode.json")
    with pytest.raises(ConfigError, match="does not exist"):
        load_role_config(tmp_path / "prefill.json")


def test_keys_a_newer_operator_adds_are_skipped_with_a_warning(tmp_path, caplog):
    """An engine image pinned across an operator upgrade reads the new operator's ConfigMap: refusing
    a key it does not know would crash-loop every pod the upgrade rolls."""
    write_config(tmp_path, "decode", {"argv": ["--x"], "nnodes": 1, "future_knob": 1})
    with caplog.at_level(logging.WARNING, logger="hybridserving.launcher"):
        config = load_role_config(tmp_path / "decode.json")
    assert config.argv_for(0) == ["--x"]
    assert "ignoring keys this launcher does not know, ['future_knob']" in caplog.text


def test_settings_are_read_as_admission_checks_them_and_a_bad_one_is_named(caplog):
    """A value the operator could not check (from a Secret or ConfigMap) stops the launcher with its
    name, where `float()` would have died with a traceback, and "false" would have meant on."""
    s = Settings.from_env({"HYBRIDSERVING_IDLE_WINDOW_S": "0.5", "HYBRIDSERVING_CRASH_LOOP_RESTARTS": "7",
                           "HYBRIDSERVING_PREFLIGHT_RDMA": "0", "SGLANG_HEALTH_CHECK_TIMEOUT": "45"})
    assert (s.idle_window_s, s.crash_loop_restarts, s.preflight_rdma, s.engine_health_timeout_s) == (0.5, 7, False, 45)
    assert Settings.from_env({}).preflight_rdma is True
    for name, value in (("HYBRIDSERVING_STOP_GRACE_S", "30s"), ("HYBRIDSERVING_CRASH_LOOP_EXIT", "false"),
                        ("HYBRIDSERVING_ENGINE_BACKEND", "vllm")):
        with pytest.raises(ConfigError, match=f"^{name}='{value}' is not .*: fix it in the fleet's spec.engine.env$"):
            Settings.from_env({name: value})
    for name in ("HYBRIDSERVING_NODE_RANK", "HYBRIDSERVING_LAUNCHER_PORT"):
        with pytest.raises(ConfigError, match=f"^{name}='x' is not a whole number: remove it from the fleet's "):
            Settings.from_env({name: "x"})
    env = {"HYBRIDSERVING_HEALTH_RECHECK_S": "-1"}
    with mock.patch.dict(os.environ, env), caplog.at_level(logging.ERROR, logger="hybridserving_engine.launcher"):
        assert main([]) == 2
    assert "HYBRIDSERVING_HEALTH_RECHECK_S='-1' is not a number of seconds above 0" in caplog.text


def test_role_file_holds_a_bare_value_or_a_labels_file(tmp_path):
    f = tmp_path / "role"
    f.write_text("decode\n")
    assert read_role(f) == "decode"
    f.write_text('app="x"\nhybridserving.io/role="prefill"\n')
    assert read_role(f) == "prefill"
    f.write_text("draining")
    assert read_role(f) is None
    assert read_role(tmp_path / "missing") is None
    # Whatever a read meets, the watcher of the file keeps watching: no role, the current one kept.
    f.write_bytes(b"\xff\xfe decode")
    assert read_role(f) is None
    assert read_role(tmp_path) is None


def test_the_restart_backoff_doubles_to_its_cap_after_any_number_of_failures():
    assert [restart_backoff(n, 2.0, 60.0) for n in (1, 2, 3, 5, 6)] == [2.0, 4.0, 8.0, 32.0, 60.0]
    # With crash-loop exits off a launcher counts failures for as long as the pod lives.
    assert restart_backoff(1025, 2.0, 60.0) == restart_backoff(10**6, 2.0, 60.0) == 60.0


# A pod's configHash: the template half, then the role-flags half naming its document.
TEMPLATE_HALF = "t" * 10


def starts(tmp_path: Path, role: str, until: int, **settings) -> tuple[list[list[str]], Launcher]:
    """The argvs of the engine's first `until` starts: an engine that exits at once, restarted."""
    seen: list[list[str]] = []

    def command(backend, argv):
        seen.append(list(argv))
        return [sys.executable, "-c", "raise SystemExit(3)"]

    launcher = Launcher(Settings(config_dir=tmp_path / "cfg", role_file=tmp_path / "podinfo" / "role",
                                 backend="simulator", host="127.0.0.1", port=free_port(), poll_interval_s=0.01,
                                 restart_backoff_s=0.01, restart_backoff_max_s=0.02, crash_loop_restarts=100,
                                 crash_loop_exit=False, **settings), command=command)

    async def scenario():
        task = asyncio.create_task(launcher.run())
        while len(seen) < until and not task.done():
            await asyncio.sleep(0.005)
        launcher._terminate.set()
        await task

    asyncio.run(scenario())
    return seen[:until], launcher


def annotate(tmp_path: Path, role: str, flags_half: str | None) -> None:
    """The downward-API files: the pod's role and, from an operator that mounts it, its configHash."""
    (tmp_path / "podinfo").mkdir(exist_ok=True)
    (tmp_path / "podinfo" / "role").write_text(role)
    if flags_half is not None:
        (tmp_path / "podinfo" / CONFIG_HASH_FILE_NAME).write_text(TEMPLATE_HALF + flags_half)


def test_restarts_keep_the_document_of_the_pods_config_hash_while_the_spec_moves_on(tmp_path):
    """A rollout not yet at this pod rewrites `<role>.json`; the engine restarts on its own flags."""
    write_config(tmp_path / "cfg", "decode", {"argv": ["--new"]})
    (tmp_path / "cfg" / role_document_name("decode", "aaaaaaaaaa")).write_text(json.dumps({"argv": ["--old"]}))
    (tmp_path / "cfg" / role_document_name("decode", "bbbbbbbbbb")).write_text(json.dumps({"argv": ["--new"]}))
    annotate(tmp_path, "decode", "aaaaaaaaaa")
    seen, _ = starts(tmp_path, "decode", until=3)
    assert seen == [["--old"]] * 3


def test_a_document_the_volume_does_not_show_yet_is_waited_for(tmp_path):
    """The kubelet updates the ConfigMap volume up to a minute after the pod's annotations."""
    write_config(tmp_path / "cfg", "prefill", {"argv": ["--spec"]})
    (tmp_path / "cfg" / role_document_name("prefill", "aaaaaaaaaa")).write_text(json.dumps({"argv": ["--a"]}))
    annotate(tmp_path, "prefill", "cccccccccc")

    def publish():
        time.sleep(0.2)
        (tmp_path / "cfg" / role_document_name("prefill", "cccccccccc")).write_text(json.dumps({"argv": ["--c"]}))

    with ThreadPoolExecutor(1) as pool:
        pool.submit(publish)
        seen, _ = starts(tmp_path, "prefill", until=1)
    assert seen == [["--c"]]


def test_a_pod_awaiting_its_document_says_so_and_stops_at_once_on_sigterm(tmp_path):
    """An unready pod names the file it waits for; deleting it neither waits out the deadline nor
    starts an engine only to stop it."""
    write_config(tmp_path / "cfg", "decode", {"argv": ["--spec"]})
    (tmp_path / "cfg" / role_document_name("decode", "aaaaaaaaaa")).write_text(json.dumps({"argv": ["--a"]}))
    annotate(tmp_path, "decode", "cccccccccc")
    started: list[list[str]] = []
    launcher = Launcher(Settings(config_dir=tmp_path / "cfg", role_file=tmp_path / "podinfo" / "role",
                                 backend="simulator", host="127.0.0.1", port=free_port(), poll_interval_s=0.01,
                                 config_wait_s=60.0),
                        command=lambda backend, argv: started.append(list(argv)) or [sys.executable, "-c", ""])

    async def scenario() -> tuple[dict, float]:
        task = asyncio.create_task(launcher.run())
        while "decode-cccccccccc.json" not in launcher.status()["message"] and not task.done():
            await asyncio.sleep(0.005)
        waiting = launcher.status()
        sigterm = time.monotonic()
        launcher._terminate.set()
        assert await asyncio.wait_for(task, 5) == 0
        return waiting, time.monotonic() - sigterm

    waiting, stopped_in = asyncio.run(scenario())
    assert waiting["ready"] is False and waiting["phase"] == "WaitingForRole"
    assert waiting["message"] == (f"waiting up to 60 s for decode-cccccccccc.json, the configuration this pod"
                                  f" runs, in {tmp_path / 'cfg'}")
    assert started == [] and launcher.status()["phase"] == "Stopped"
    assert stopped_in < 1.0


def test_without_documents_by_hash_or_past_the_wait_the_spec_document_stands(tmp_path, caplog):
    write_config(tmp_path / "cfg", "prefill", {"argv": ["--spec"]})
    annotate(tmp_path, "prefill", None)  # a pod rendered without the hash file
    assert starts(tmp_path, "prefill", until=1)[0] == [["--spec"]]
    annotate(tmp_path, "prefill", "cccccccccc")  # a ConfigMap written without documents by hash
    assert starts(tmp_path, "prefill", until=1)[0] == [["--spec"]]
    (tmp_path / "cfg" / role_document_name("prefill", "aaaaaaaaaa")).write_text(json.dumps({"argv": ["--a"]}))
    with caplog.at_level(logging.WARNING, logger="hybridserving_engine.launcher"):
        assert starts(tmp_path, "prefill", until=1, config_wait_s=0.05)[0] == [["--spec"]]
    assert "prefill-cccccccccc.json has not appeared" in caplog.text


def test_a_pod_annotated_with_the_other_role_starts_from_the_spec_document(tmp_path):
    """A hash is that of the role the pod is annotated with; it says nothing of the other role's flags."""
    write_config(tmp_path / "cfg", "prefill", {"argv": ["--spec"]})
    (tmp_path / "cfg" / role_document_name("prefill", "aaaaaaaaaa")).write_text(json.dumps({"argv": ["--a"]}))
    annotate(tmp_path, "decode", "aaaaaaaaaa")
    assert pinned_document(tmp_path / "cfg", tmp_path / "podinfo" / "role", "prefill") is None
    assert pinned_document(tmp_path / "cfg", tmp_path / "podinfo" / "role", "decode") == (
        tmp_path / "cfg" / "decode-aaaaaaaaaa.json")


def test_worker_ranks_reach_the_leader_for_loads():
    argv = ["--host", "0.0.0.0", "--port", "30000", "--dist-init-addr", "pod-0.svc:20102"]
    assert engine_url(argv, 0) == "http://127.0.0.1:30000"
    assert engine_url(argv, 1) == "http://pod-0.svc:30000"
    assert engine_url(argv, 1, "10.1.2.3") == "http://10.1.2.3:30000"
    assert engine_url(argv, 1, "fd00::7") == "http://[fd00::7]:30000"
    assert engine_url(argv, 0, "10.1.2.3") == "http://127.0.0.1:30000", "the leader's own API is local"


def test_inflight_requests_counts_every_queue_of_every_dp_rank():
    # As SGLang reports them: a decode's num_waiting_reqs already holds its prealloc and transfer
    # queues (2 waiting + 3 + 4), a prefill's its bootstrap queue; a prefill's inflight queue and the
    # requests waiting for their grammar are apart.
    decode = {"loads": [
        {"num_running_reqs": 1, "num_waiting_reqs": 9, "queues": {"grammar": 1},
         "disaggregation": {"mode": "decode", "decode_prealloc_queue_reqs": 3, "decode_transfer_queue_reqs": 4,
                            "kv_transfer_latency_ms": 9.0}},
        {"num_running_reqs": 5, "num_waiting_reqs": 0},
    ]}
    assert inflight_requests(decode) == 16, "each request once"
    prefill = {"loads": [{"num_running_reqs": 0, "num_waiting_reqs": 2,
                          "disaggregation": {"mode": "prefill", "prefill_bootstrap_queue_reqs": 1,
                                             "prefill_inflight_queue_reqs": 3}}]}
    assert inflight_requests(prefill) == 5
    assert inflight_requests({"loads": [{"num_running_reqs": 0, "num_waiting_reqs": 0}]}) == 0


# ------------------------------------------------------------------ preflight


def probes(gpus: int = 8, rdma: tuple[str, ...] = ("mlx5_0",), modules: tuple[str, ...] = ("mooncake",)):
    return preflight.Probes(gpu_count=lambda: gpus, rdma_devices=lambda: list(rdma),
                            importable=lambda m: m in modules)


PD_ARGV = ["--tp-size", "16", "--nnodes", "2", "--disaggregation-mode", "decode"]


def test_preflight_passes_a_well_provisioned_node():
    assert preflight.check(PD_ARGV, probes()) == []


def test_preflight_names_missing_gpus_rdma_and_transfer_module():
    problems = preflight.check(PD_ARGV, probes(gpus=4, rdma=(), modules=()))
    assert len(problems) == 3
    assert "found 4 GPU(s), the engine flags need 8" in problems[0]
    assert "'mooncake'" in problems[1] and "not installed" in problems[1]
    assert "no RDMA device under /sys/class/infiniband" in problems[2]


def test_preflight_checks_nixl_and_tolerates_rdma_free_setups_when_told():
    argv = ["--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "nixl"]
    assert preflight.check(argv, probes(gpus=1, rdma=(), modules=("nixl",)), require_rdma=False) == []
    assert "'nixl'" in preflight.check(argv, probes(gpus=1, modules=()))[0]


def test_preflight_reports_an_unreadable_gpu_count():
    def broken() -> int:
        raise RuntimeError("CUDA driver not loaded")

    problems = preflight.check(["--tp-size", "2"], preflight.Probes(gpu_count=broken))
    assert problems == ["cannot count GPUs (RuntimeError: CUDA driver not loaded); the engine needs 2 per node"]


def test_failed_preflight_exits_without_starting_the_engine_naming_the_problem_last(tmp_path, caplog):
    write_config(tmp_path / "cfg", "decode", {"argv": PD_ARGV})
    (tmp_path / "role").write_text("decode")
    settings = Settings(config_dir=tmp_path / "cfg", role_file=tmp_path / "role", host="127.0.0.1",
                        port=free_port(), poll_interval_s=0.01)
    launcher = Launcher(settings, probes=probes(gpus=0))
    caplog.set_level(logging.ERROR, logger="hybridserving.launcher")
    # No SIGTERM: the container exits for the kubelet to restart it with its back-off.
    assert asyncio.run(asyncio.wait_for(launcher.run(), 10)) == 1
    assert launcher.proc is None and launcher.phase == "PreflightFailed" and "found 0 GPU(s)" in launcher.message
    last = caplog.records[-1].getMessage()  # the termination message (FallbackToLogsOnError)
    assert last.startswith("preflight failed: ") and "found 0 GPU(s)" in last and "restarts" in last


def test_preflight_runs_off_the_event_loop_so_liveness_is_answered(tmp_path):
    write_config(tmp_path / "cfg", "decode", {"argv": PD_ARGV})
    (tmp_path / "role").write_text("decode")
    settings = Settings(config_dir=tmp_path / "cfg", role_file=tmp_path / "role", host="127.0.0.1",
                        port=free_port(), poll_interval_s=0.01)
    answers: list[object] = []

    def slow_gpu_count() -> int:
        """A cold torch import or a slow CUDA driver: the kubelet probes liveness meanwhile."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{settings.port}/healthz", timeout=1.0) as resp:
                answers.append(resp.status)
        except OSError as e:
            answers.append(e)
        return 0

    launcher = Launcher(settings, probes=preflight.Probes(gpu_count=slow_gpu_count, rdma_devices=lambda: ["mlx5_0"],
                                                          importable=lambda name: True))
    assert asyncio.run(asyncio.wait_for(launcher.run(), 10)) == 1
    assert answers == [200], answers


# ------------------------------------------------------------------ supervision


def test_a_crashing_engine_is_restarted_with_backoff_and_reported_as_crash_loop(tmp_path):
    write_config(tmp_path / "cfg", "prefill", {"argv": []})
    (tmp_path / "role").write_text("prefill")
    settings = Settings(config_dir=tmp_path / "cfg", role_file=tmp_path / "role", backend="simulator",
                        host="127.0.0.1", port=free_port(), poll_interval_s=0.01, restart_backoff_s=0.01,
                        restart_backoff_max_s=0.05, crash_loop_restarts=3, crash_loop_exit=False)
    crashing = Launcher(settings, command=lambda backend, argv: [sys.executable, "-c", "raise SystemExit(3)"])

    async def scenario():
        task = asyncio.create_task(crashing.run())
        phases = set()
        while crashing.restarts < 4:
            phases.add(crashing.phase)
            await asyncio.sleep(0.005)
        phases.add(crashing.phase)
        status = crashing.status()
        crashing._terminate.set()
        assert await task == 0
        return phases, status

    phases, status = asyncio.run(scenario())
    assert {"Restarting", "CrashLoop"} <= phases
    assert status["engine"]["lastExitCode"] == 3 and status["engine"]["restarts"] >= 4
    assert status["ready"] is False
    text = crashing.metrics.registry.get_sample_value("hybridserving_launcher_engine_restarts_total")
    assert text >= 4


def test_a_crash_loop_exits_the_launcher_so_the_kubelet_counts_it(tmp_path, caplog):
    """By default the launcher hands a crash loop to the kubelet: after `crash_loop_restarts`
    failures in a row it exits with the engine's status, its last log line saying why."""
    write_config(tmp_path / "cfg", "prefill", {"argv": []})
    (tmp_path / "role").write_text("prefill")
    settings = Settings(config_dir=tmp_path / "cfg", role_file=tmp_path / "role", backend="simulator",
                        host="127.0.0.1", port=free_port(), poll_interval_s=0.01, restart_backoff_s=0.01,
                        restart_backoff_max_s=0.05, crash_loop_restarts=3)
    assert Settings.from_env({}).crash_loop_exit is True
    assert Settings.from_env({"HYBRIDSERVING_CRASH_LOOP_EXIT": "0"}).crash_loop_exit is False
    crashing = Launcher(settings, command=lambda backend, argv: [sys.executable, "-c", "raise SystemExit(3)"])
    with caplog.at_level(logging.ERROR, logger="hybridserving.launcher"):
        status = asyncio.run(asyncio.wait_for(crashing.run(), 30))
    assert status == 3
    assert crashing.restarts == 3 and crashing.phase == "CrashLoop"
    assert caplog.records[-1].getMessage().startswith(
        "engine crash loop: 3 consecutive engine failures, last exit status 3")


def test_a_relaunch_that_does_not_start_in_time_fails_the_switch_and_counts_as_a_failed_start(tmp_path, caplog):
    """The relaunch's engine is stopped at the startup deadline, not left Starting, and its failed
    start goes down the crash path: here, with a crash loop at one failure, the launcher exits."""
    for role in ("prefill", "decode"):
        write_config(tmp_path / "cfg", role, {"argv": ["--port", str(free_port())]})
    settings = Settings(config_dir=tmp_path / "cfg", role_file=tmp_path / "role", backend="simulator",
                        host="127.0.0.1", port=free_port(), poll_interval_s=0.01, startup_timeout_s=0.5,
                        stop_grace_s=5, crash_loop_restarts=1)
    hanging = Launcher(settings, command=lambda backend, argv: [sys.executable, "-c", "import time; time.sleep(60)"])
    hanging.role = "prefill"

    async def scenario():
        record = await asyncio.wait_for(hanging.switch_role("decode"), 30)
        assert hanging._terminate.is_set(), "the crash loop ends the launcher"
        return record

    with caplog.at_level(logging.ERROR, logger="hybridserving.launcher"):
        record = asyncio.run(scenario())
    cause = "engine not ready within HYBRIDSERVING_STARTUP_TIMEOUT_S (0.5 s) of its start"
    assert (record.mode, record.outcome, record.message) == ("relaunch", "Failed", cause)
    assert hanging.proc is None and hanging.last_exit_code == -signal.SIGTERM and hanging.restarts == 1
    assert (hanging.exit_status, hanging.phase) == (128 + signal.SIGTERM, "CrashLoop")
    assert caplog.records[-1].getMessage() == (
        f"engine crash loop: 1 consecutive engine failures, last exit status -15 ({cause}); "
        "exiting so that the container restarts")


def test_a_worker_ranks_stop_fits_the_pods_grace_when_its_leader_outlasts_the_drain(tmp_path, monkeypatch):
    """The kubelet kills a pod at terminationGracePeriodSeconds (drain timeout + stop grace): a worker
    whose drain ran its whole timeout does not wait a second timeout for its leader to stop."""
    settings = Settings(config_dir=tmp_path, role_file=tmp_path / "role", host="127.0.0.1", port=free_port(),
                        node_rank=1, drain_timeout_s=1.0, stop_grace_s=1.0, poll_interval_s=0.05)
    worker = Launcher(settings)

    async def drain_that_times_out(until_terminate: bool = False, deadline: float | None = None) -> bool:
        await asyncio.sleep(settings.drain_timeout_s)
        return False

    async def leader_still_up() -> bool:
        return True

    monkeypatch.setattr(worker, "drain", drain_that_times_out)
    monkeypatch.setattr(worker, "_leader_answers", leader_still_up)

    async def scenario() -> float:
        deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(1)"
        worker.proc = await asyncio.create_subprocess_exec(sys.executable, "-c", deaf, start_new_session=True)
        began = time.monotonic()
        await worker._shutdown()
        return time.monotonic() - began

    took = asyncio.run(scenario())
    assert worker.proc is None and worker.phase == "Stopped"
    grace = settings.drain_timeout_s + settings.stop_grace_s
    assert took < grace + 0.5, f"stopped after {took:.1f} s, past the pod's {grace:.0f} s grace"


def test_a_worker_rank_takes_its_leader_for_stopped_only_after_probes_in_a_row_go_unanswered(tmp_path, monkeypatch):
    """One missed probe of a leader still draining (a stalled event loop, a lost packet) is not its
    stop: a worker that took it for one would have its engine killed at the end of its stop grace,
    mid-collective, failing the requests the leader holds."""
    settings = Settings(config_dir=tmp_path, role_file=tmp_path / "role", host="127.0.0.1", port=free_port(),
                        node_rank=1, drain_timeout_s=30.0, stop_grace_s=1.0, poll_interval_s=0.01)
    worker = Launcher(settings)
    answers = iter([False, True, False, False, False, True])
    probes: list[bool] = []

    async def leader_answers() -> bool:
        probes.append(next(answers))
        return probes[-1]

    monkeypatch.setattr(worker, "_leader_answers", leader_answers)

    async def scenario() -> None:
        worker.proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(60)")
        try:
            await worker._wait_for_leader_to_stop(time.monotonic() + 20)
            assert worker.proc.returncode is None
        finally:
            worker.proc.kill()
            await worker.proc.wait()

    asyncio.run(scenario())
    assert probes == [False, True, False, False, False], "stopped waiting at the third miss in a row, not before"


def test_a_worker_rank_drains_with_its_leader_at_the_address_it_joined_once_the_name_is_gone(tmp_path, monkeypatch):
    """The leader's name is the instance's headless Service, which the garbage collector deletes
    with the pods when the instance goes: the worker's drain reads the leader's loads at the address
    it resolved when it turned Ready, and waits for the leader's requests, not for a name lookup to
    fail."""
    from aiohttp import web

    port = free_port()
    served = {"until": 0.0}

    async def loads(request: web.Request) -> web.Response:
        busy = 1 if time.monotonic() < served["until"] else 0
        return web.json_response({"loads": [{"dp_rank": 0, "num_running_reqs": busy, "num_waiting_reqs": 0}]})

    async def ready(request: web.Request) -> web.Response:
        return web.Response(status=200)

    real_getaddrinfo = __import__("socket").getaddrinfo
    service = {"exists": True}

    def getaddrinfo(host, *args, **kwargs):
        if host == "fleet-decode-0.ns.svc":
            if not service["exists"]:
                raise __import__("socket").gaierror(-2, "Name or service not known")
            host = "127.0.0.1"
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr("socket.getaddrinfo", getaddrinfo)
    settings = Settings(config_dir=tmp_path, role_file=tmp_path / "role", host="127.0.0.2", port=free_port(),
                        node_rank=1, drain_timeout_s=20.0, idle_window_s=0.3, poll_interval_s=0.05)
    worker = Launcher(settings)
    worker.argv = ["--host", "127.0.0.2", "--port", str(port), "--dist-init-addr", "fleet-decode-0.ns.svc:20102"]
    worker.may_hold_requests = True

    async def scenario() -> float:
        app = web.Application()
        app.router.add_get("/v1/loads", loads)
        app.router.add_get("/ready", ready)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        worker.proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(60)")
        try:
            await worker._remember_leader()
            service["exists"] = False  # the instance is deleted: its Service goes with its pods
            served["until"] = time.monotonic() + 1.5  # the leader still holds a request
            began = time.monotonic()
            assert await worker.drain() is True
            return time.monotonic() - began
        finally:
            worker.proc.kill()
            await worker.proc.wait()
            await runner.cleanup()
            if worker._session is not None:
                await worker._session.close()

    took = asyncio.run(scenario())
    assert worker.leader_address == "127.0.0.1"
    assert took >= 1.5, f"the drain ended after {took:.2f} s, while the leader still held its request"


def test_supervising_a_long_running_engine_keeps_one_wait_for_its_exit(tmp_path):
    write_config(tmp_path / "cfg", "prefill", {"argv": []})
    (tmp_path / "role").write_text("prefill")
    settings = Settings(config_dir=tmp_path / "cfg", role_file=tmp_path / "role", backend="simulator",
                        host="127.0.0.1", port=free_port(), poll_interval_s=0.001, startup_timeout_s=60)
    running = Launcher(settings, command=lambda backend, argv: [sys.executable, "-c", "import time; time.sleep(60)"])

    async def scenario() -> int:
        task = asyncio.create_task(running.run())
        await asyncio.sleep(1.0)  # about a thousand supervision polls
        assert running.proc is not None and running.proc.returncode is None
        # asyncio's subprocess transport keeps every exit waiter until the process exits.
        waiters = len(running.proc._transport._exit_waiters)  # type: ignore[attr-defined]
        running._terminate.set()
        await task
        return waiters

    assert asyncio.run(asyncio.wait_for(scenario(), 60)) <= 2


# ------------------------------------------------------------------ real launcher processes


class Pod:
    """A launcher process running the simulator, configured as the operator would."""

    def __init__(self, tmp_path: Path, role: str, switch_flag: bool = True, faults: str = "",
                 extra: list[str] | None = None, time_scale: float = 0.01, idle_window_s: float = 1.0,
                 api_key: str | None = None, node_rank: int = 0, startup_seconds: float = 0.0,
                 extra_env: dict[str, str] | None = None, nnodes: int = 1, port: int | None = None) -> None:
        self.port, self.bootstrap, self.launcher_port = port or free_port(), free_port(), free_port()
        # A worker rank of a two-node instance runs on a host of its own, and reaches its leader (if
        # the test starts one, on the same `port`) on 127.0.0.1.
        nnodes = 2 if node_rank else nnodes
        host = "127.0.0.2" if node_rank else "127.0.0.1"
        # GLM-5.2's weights need a node of 8 H200s (the simulator's GPU), or two nodes.
        layout = (["--tp-size", "16", "--dist-init-addr", f"127.0.0.1:{free_port()}"] if nnodes > 1
                  else ["--tp-size", "8"])
        for r in ("prefill", "decode"):
            # Like the operator's ConfigMap: per-pod values are placeholders the launcher fills from env.
            argv = ["--model-path", "m", "--host", host, "--port", "{port}",
                    "--disaggregation-mode", r, "--disaggregation-bootstrap-port", str(self.bootstrap),
                    *(["--enable-pd-role-switch"] if switch_flag else []), *layout, *(extra or [])]
            write_config(tmp_path / "cfg", r, {"argv": argv, "decode_cuda_graph_memory_gb": 1.0, "nnodes": nnodes})
        self.role_file = tmp_path / "role"
        self.role_file.write_text(role)
        env = simulator_env(time_scale=time_scale, faults=faults, startup_seconds=startup_seconds)
        env.update(extra_env or {})
        env[ENV_NODE_RANK] = str(node_rank)
        env.update(HYBRIDSERVING_CONFIG_DIR=str(tmp_path / "cfg"), HYBRIDSERVING_ROLE_FILE=str(self.role_file),
                   HYBRIDSERVING_LAUNCHER_HOST="127.0.0.1", HYBRIDSERVING_LAUNCHER_PORT=str(self.launcher_port),
                   HYBRIDSERVING_POLL_INTERVAL_S="0.1", HYBRIDSERVING_DRAIN_TIMEOUT_S="30",
                   HYBRIDSERVING_IDLE_WINDOW_S=str(idle_window_s), HYBRIDSERVING_PORT=str(self.port))
        if api_key:
            env["HYBRIDSERVING_ENGINE_API_KEY"] = api_key
        self.log = tmp_path / "launcher.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "hybridserving_engine.launcher", "--backend",
                                          "simulator"], env=env, stdout=out, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.launcher_port}"
        self.engine = f"http://127.0.0.1:{self.port}"
        try:
            wait_http(self.url + ("/healthz" if startup_seconds else "/readyz"), timeout=30)
        except BaseException:
            # The fixture only records a pod that started; one that did not must not outlive the test.
            self.stop()
            raise

    def status(self) -> dict:
        with urllib.request.urlopen(self.url + "/status", timeout=5) as resp:
            return json.load(resp)

    def wait_switch(self, timeout: float = 20, count: int = 1) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.status()
            last = status["lastSwitch"]
            if (last and status["switchCount"] >= count and last["outcome"] != "InProgress"
                    and status["phase"] not in ("Draining", "Switching")):
                return status
            time.sleep(0.05)
        raise TimeoutError(self.log.read_text())

    def stop(self) -> None:
        """SIGTERM, and SIGKILL to the launcher and its engine if it has not stopped in 30 s."""
        if self.proc.poll() is None:
            try:
                engine = (self.status().get("engine") or {}).get("pid")
            except OSError:
                engine = None
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                if engine:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(engine, signal.SIGKILL)  # the engine leads a session of its own
                raise


@pytest.fixture
def pod(tmp_path):
    pods: list[Pod] = []

    def start(*args, **kwargs) -> Pod:
        pods.append(Pod(tmp_path / str(len(pods)), *args, **kwargs))
        return pods[-1]

    yield start
    stopped = [p for p in pods if p.proc.poll() is None]
    errors = []
    for p in stopped:
        try:
            p.stop()
        except subprocess.TimeoutExpired as e:
            errors.append(e)
    assert not errors, f"launchers that did not stop on SIGTERM: {errors}"


@pytest.mark.slow
def test_sigterm_drains_in_flight_requests_before_stopping_the_engine(pod):
    # Unified engine: each request prefills and decodes 150 tokens, about 1 s at time scale 0.1.
    p = pod("prefill", switch_flag=False, extra=["--disaggregation-mode", "null"], time_scale=0.1,
            idle_window_s=2.0)

    def complete(_: int) -> dict:
        resp = httpx.post(p.engine + "/v1/completions", json={"prompt": "hello " * 50, "max_tokens": 150},
                          timeout=60)
        return resp.json()

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(complete, i) for i in range(6)]
        time.sleep(0.3)
        p.proc.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        with pytest.raises(urllib.error.HTTPError) as unready:
            urllib.request.urlopen(p.url + "/readyz", timeout=5)
        assert unready.value.code == 503
        answers = [f.result() for f in futures]
    assert all(a["usage"]["completion_tokens"] == 150 for a in answers)
    assert p.proc.wait(30) == 0
    log = p.log.read_text()
    assert log.index("phase Draining: pod is terminating") < log.index("simulator shutting down")


@pytest.mark.slow
def test_a_worker_rank_is_ready_only_once_its_engine_serves_its_health_check(pod):
    # A live process is not a loaded one: a worker rank's dummy health check answers only after its
    # schedulers are up (entrypoints/engine.py:1234-1284), so its pod is not Ready while it loads.
    leader = pod("decode", nnodes=2)
    p = pod("decode", node_rank=1, startup_seconds=3.0, port=leader.port)
    assert p.status()["phase"] == "Starting"
    deadline = time.monotonic() + 30
    while p.status()["phase"] != "Ready":
        assert time.monotonic() < deadline, p.log.read_text()
        time.sleep(0.1)
    assert "serving its health check" in p.log.read_text()
    # Its leader is gone: there is nothing to drain, so it stops at once rather than after the
    # drain timeout (30 s).
    leader.stop()
    stopping = time.monotonic()
    p.stop()
    assert time.monotonic() - stopping < 10, p.log.read_text()


@pytest.mark.slow
def test_a_leader_restart_takes_the_worker_ranks_engine_down_and_its_launcher_starts_it_again(pod):
    """SGLang's worker ranks exit with rank 0's shutdown broadcast (`entrypoints/engine.py:1261-1263,
    1287`): a leader engine that restarts leaves its workers to be started again by their own
    launchers, which then serve as before."""
    leader = pod("decode", nnodes=2)
    worker = pod("decode", node_rank=1, port=leader.port)
    worker_pid = worker.status()["engine"]["pid"]
    leader_pid = leader.status()["engine"]["pid"]
    with urllib.request.urlopen(urllib.request.Request(leader.engine + "/sim/faults", data=b'{"crash": true}',
                                                       headers={"Content-Type": "application/json"}), timeout=5):
        pass
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ls, ws = leader.status(), worker.status()
        if (ls["ready"] and ws["ready"] and ls["engine"]["pid"] != leader_pid
                and ws["engine"]["pid"] not in (None, worker_pid)):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"leader {leader.status()}\nworker {worker.status()}\n{worker.log.read_text()[-3000:]}")
    assert ws["role"] == "decode" and ws["engine"]["restarts"] == 1 and ws["engine"]["lastExitCode"] == 0, ws
    assert "rank 0 stopped" in worker.log.read_text()


def test_in_place_switch_drains_then_posts_pd_role_switch(pod):
    p = pod("prefill")
    pid = p.status()["engine"]["pid"]
    p.role_file.write_text("decode")
    status = p.wait_switch()
    last = status["lastSwitch"]
    assert (last["outcome"], last["mode"], status["role"], status["phase"]) == ("Succeeded", "in-place", "decode",
                                                                                 "Ready")
    assert [s["step"] for s in last["steps"]] == ["Draining", "Switching", "Verifying", "Succeeded"]
    assert status["engine"]["pid"] == pid
    # Verified by the live role (/model_info); /server_info's top level stays the start-up role.
    assert httpx.get(p.engine + "/model_info").json()["disaggregation_mode"] == "decode"
    assert httpx.get(p.engine + "/server_info").json()["disaggregation_mode"] == "prefill"
    # The launcher keeps reaching its engine on the filled-in port after the switch.
    assert status["engine"]["url"] == p.engine and status["ready"] is True
    metrics = httpx.get(p.url + "/metrics").text
    assert ('hybridserving_launcher_role_switches_total{from_role="prefill",mode="in-place",outcome="Succeeded",'
            'to_role="decode"} 1.0') in metrics
    assert 'hybridserving_launcher_role{role="decode"} 1.0' in metrics


@pytest.mark.slow
def test_with_the_fleet_key_the_engine_refuses_others_and_the_launcher_still_drains_and_switches(pod):
    """The key reaches SGLang as --api-key from the pod's environment, not from the rendered argv,
    and the launcher's own calls (/v1/loads, /pd_role_switch, /model_info) carry it."""
    key = "fleet-key-0123456789"
    p = pod("prefill", api_key=key)
    refused = httpx.post(p.engine + "/pause_generation", json={"mode": "abort"})
    assert (refused.status_code, refused.json()) == (401, {"error": "Unauthorized"})
    p.role_file.write_text("decode")
    status = p.wait_switch()
    assert (status["lastSwitch"]["outcome"], status["role"]) == ("Succeeded", "decode"), status
    auth = {"Authorization": f"Bearer {key}"}
    assert httpx.get(p.engine + "/model_info", headers=auth).json()["disaggregation_mode"] == "decode"
    assert key not in p.log.read_text() and key not in json.dumps(status)


@pytest.mark.slow
def test_a_hung_engine_turns_unready_by_its_own_health_check_and_is_restarted(pod):
    """A stalled scheduler leaves SGLang's `/ready` at 200 (`entrypoints/http_server.py:714-718`)
    until a `/health` gets no output within SGLANG_HEALTH_CHECK_TIMEOUT (lines 776-799), which
    latches it UnHealthy: the launcher runs that check, and restarts an engine that fails it twice.
    A paused engine (`/ready` 503, `/ping` 200: lines 2190-2199) is left alone: its health request
    would wait for it to continue (`managers/tokenizer_manager.py:938-939`)."""
    p = pod("prefill", extra_env={"SGLANG_HEALTH_CHECK_TIMEOUT": "1", "HYBRIDSERVING_HEALTH_RECHECK_S": "0.5"})
    pid = p.status()["engine"]["pid"]
    assert httpx.post(p.engine + "/pause_generation", json={"mode": "abort"}).status_code == 200
    time.sleep(4)  # two failed checks would restart it within 3 s
    status = p.status()
    assert (status["engine"]["pid"], status["engine"]["restarts"], status["phase"]) == (pid, 0, "Ready"), status
    assert httpx.post(p.engine + "/continue_generation", json={}).status_code == 200
    wait_http(p.url + "/readyz", timeout=10)

    assert httpx.post(p.engine + "/sim/faults", json={"stall_scheduler": True}).status_code == 200
    seen_unready, deadline = False, time.monotonic() + 30
    while time.monotonic() < deadline:
        status = p.status()
        seen_unready = seen_unready or (not status["ready"] and status["engine"]["pid"] == pid)
        if status["engine"]["restarts"] >= 1 and status["ready"]:
            break
        time.sleep(0.05)
    else:
        raise TimeoutError(p.log.read_text())
    assert seen_unready, "the engine's failed health check took it out before the restart"
    assert status["engine"]["pid"] != pid and status["phase"] == "Ready"
    assert "engine hung: /health failed twice" in p.log.read_text()


@pytest.mark.slow
def test_an_engine_its_scheduler_watchdog_killed_is_restarted(pod):
    """A scheduler hung mid-batch for `--watchdog-timeout` has SGLang kill its own process tree with
    SIGKILL (`utils/watchdog.py:137-163`, `managers/tokenizer_manager.py:4072-4081`): before the
    launcher's own health check notices, the crash path restarts it, reporting the signal."""
    p = pod("prefill", switch_flag=False, extra=["--disaggregation-mode", "null", "--watchdog-timeout", "1"],
            extra_env={"HYBRIDSERVING_RESTART_BACKOFF_S": "0.1"})
    pid = p.status()["engine"]["pid"]
    body = {"input_ids": [1] * 16, "sampling_params": {"max_new_tokens": 100000}, "stream": True}
    with httpx.stream("POST", p.engine + "/generate", json=body, timeout=30) as generating:
        lines = generating.iter_lines()  # kept: a dropped iterator closes the stream, whose
        next(lines)  # request SGLang then aborts (managers/tokenizer_manager.py:958-966)
        assert httpx.post(p.engine + "/sim/faults", json={"stall_scheduler": True}).status_code == 200
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status = p.status()
            if status["engine"]["restarts"] >= 1 and status["ready"]:
                break
            time.sleep(0.1)
        else:
            raise TimeoutError(p.log.read_text())
    assert status["engine"]["pid"] != pid and status["engine"]["lastExitCode"] == -signal.SIGKILL
    log = p.log.read_text()
    assert "Scheduler watchdog timeout" in log and "engine hung" not in log


@pytest.mark.slow
def test_an_engine_that_does_not_start_in_time_is_stopped_and_restarted_as_a_failed_start(pod):
    """A start that hangs (a stuck weight read, a hung graph capture, a rank waiting for a dead
    peer) keeps the launcher's /healthz, the pod's liveness probe, at 200: the startup deadline is
    what ends it, on the first start as on every restart, and it counts toward the crash loop."""
    # The simulator's own start-up delay is wall time (time_scale does not scale it): far past the deadline.
    p = pod("prefill", startup_seconds=120, extra_env={
        "HYBRIDSERVING_STARTUP_TIMEOUT_S": "2", "HYBRIDSERVING_STOP_GRACE_S": "5",
        "HYBRIDSERVING_RESTART_BACKOFF_S": "1", "HYBRIDSERVING_CRASH_LOOP_RESTARTS": "2"})
    first = p.status()
    assert first["phase"] == "Starting" and first["engine"]["restarts"] == 0, first
    deadline = time.monotonic() + 30
    while (status := p.status())["engine"]["restarts"] < 1:
        assert time.monotonic() < deadline, p.log.read_text()
        time.sleep(0.05)
    assert status["phase"] == "Restarting", status
    assert status["message"].startswith("engine not ready within HYBRIDSERVING_STARTUP_TIMEOUT_S (2 s)"), status
    assert status["engine"]["pid"] is None and status["ready"] is False
    while (status := p.status())["engine"]["pid"] is None:
        assert time.monotonic() < deadline, p.log.read_text()
        time.sleep(0.05)
    assert status["engine"]["pid"] != first["engine"]["pid"] and status["phase"] == "Starting", status
    # The restarted engine does not start in time either: two failed starts in a row are a crash loop.
    assert p.proc.wait(30) == 1
    log = p.log.read_text()
    assert log.count("ERROR hybridserving.launcher: engine not ready within HYBRIDSERVING_STARTUP_TIMEOUT_S (2 s) "
                     "of its start; stopping it to restart it") == 2, log
    assert log.rstrip().splitlines()[-1].endswith(
        "engine crash loop: 2 consecutive engine failures, last exit status 0 (engine not ready within "
        "HYBRIDSERVING_STARTUP_TIMEOUT_S (2 s) of its start); exiting so that the container restarts"), log


ASKED_AGAIN = "draining once more and asking again"


@pytest.mark.slow
def test_refused_switch_keeps_the_old_role_and_reports_it(pod):
    p = pod("prefill", faults="refuse_switch")
    p.role_file.write_text("decode")
    status = p.wait_switch()
    assert status["lastSwitch"]["outcome"] == "Refused" and "still prefill" in status["lastSwitch"]["message"]
    assert (status["role"], status["phase"], status["ready"]) == ("prefill", "Ready", True)
    assert httpx.get(p.engine + "/model_info").json()["disaggregation_mode"] == "prefill"
    assert p.log.read_text().count(ASKED_AGAIN) == 1, "asked twice, the second refusal stands"


@pytest.mark.slow
def test_a_refusal_that_does_not_repeat_after_a_second_drain_is_no_refusal(pod):
    # A request that lands after the drain's idle window is refused as not idle, with the engine
    # left as it was (disaggregation/role_switch.py:73-77): drained again, the engine switches.
    # Here the refusal is the simulator's fault, lifted while the launcher drains the second time.
    p = pod("prefill", faults="refuse_switch", idle_window_s=1.0)
    p.role_file.write_text("decode")
    deadline = time.monotonic() + 20
    while ASKED_AGAIN not in p.log.read_text():
        assert time.monotonic() < deadline, p.log.read_text()
        time.sleep(0.05)
    assert httpx.post(p.engine + "/sim/faults", json={"refuse_switch": False}).json()["refuse_switch"] is False
    status = p.wait_switch()
    assert status["lastSwitch"]["outcome"] == "Succeeded", status
    assert (status["role"], status["phase"]) == ("decode", "Ready")
    assert httpx.get(p.engine + "/model_info").json()["disaggregation_mode"] == "decode"


@pytest.mark.slow
def test_prefill_born_instance_switches_to_decode_and_back_in_place(pod):
    p = pod("prefill")
    pid = p.status()["engine"]["pid"]
    for count, role in enumerate(("decode", "prefill", "decode"), start=1):
        p.role_file.write_text(role)
        status = p.wait_switch(count=count)
        assert (status["lastSwitch"]["outcome"], status["lastSwitch"]["mode"], status["role"]) == (
            "Succeeded", "in-place", role), status
        assert httpx.get(p.engine + "/model_info").json()["disaggregation_mode"] == role
    assert p.status()["engine"]["pid"] == pid


@pytest.mark.slow
def test_sigterm_waits_for_an_idle_window_so_late_routed_requests_are_served(pod):
    # The router notices a terminating pod a moment later; a request it sends meanwhile must be served.
    p = pod("prefill", switch_flag=False, extra=["--disaggregation-mode", "null"], idle_window_s=2.0)
    p.proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    resp = httpx.post(p.engine + "/v1/completions", json={"prompt": "hello", "max_tokens": 8}, timeout=30)
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 8
    assert p.proc.wait(30) == 0


@pytest.mark.slow
def test_relaunch_switch_restarts_the_engine_with_the_other_roles_flags(pod):
    p = pod("decode", switch_flag=False)
    pid = p.status()["engine"]["pid"]
    p.role_file.write_text("prefill")
    status = p.wait_switch()
    last = status["lastSwitch"]
    assert (last["outcome"], last["mode"], status["role"]) == ("Succeeded", "relaunch", "prefill")
    assert [s["step"] for s in last["steps"]] == ["Draining", "Stopping", "Starting", "Succeeded"]
    assert status["engine"]["pid"] != pid
    assert httpx.get(p.engine + "/model_info").json()["disaggregation_mode"] == "prefill"


@pytest.mark.slow
def test_failed_in_place_rebuild_falls_back_to_a_relaunch(pod):
    p = pod("prefill", faults="fail_rebuild")
    p.role_file.write_text("decode")
    status = p.wait_switch()
    steps = [s["step"] for s in status["lastSwitch"]["steps"]]
    assert steps[:2] == ["Draining", "Switching"] and "Relaunching" in steps and steps[-1] == "Succeeded"
    assert status["role"] == "decode" and status["ready"] is True
    assert httpx.get(p.engine + "/health").status_code == 200


@pytest.mark.slow
def test_a_multi_node_leader_whose_rebuild_failed_leaves_the_gang_to_be_recreated(pod):
    """Relaunched alone, the leader would take its worker ranks' engines down, and each would come
    back in whatever role its own launcher held by then: the gang changes role together, recreated
    by the controller on a Failed outcome."""
    leader = pod("prefill", nnodes=2, faults="fail_rebuild")
    worker = pod("prefill", node_rank=1, port=leader.port)
    leader_pid, worker_pid = leader.status()["engine"]["pid"], worker.status()["engine"]["pid"]
    leader.role_file.write_text("decode")
    status = leader.wait_switch()
    last = status["lastSwitch"]
    assert last["outcome"] == "Failed" and "the gang needs a restart" in last["message"], last
    assert "Relaunching" not in [s["step"] for s in last["steps"]], last
    assert status["role"] == "prefill" and status["engine"]["pid"] == leader_pid, status
    assert worker.status()["engine"]["pid"] == worker_pid, "the worker rank's engine was left alone"
    # The engine's own /ready still answers (SGLang's broken flag only refuses later switches), so
    # the launcher says what it is: not ready, its gang to be recreated.
    assert (status["phase"], status["ready"]) == ("Failed", False), status
    assert httpx.get(leader.engine + "/ready").status_code == 200
    # An engine that then exits is not restarted alone, in its old role beside worker ranks in the new.
    with urllib.request.urlopen(urllib.request.Request(leader.engine + "/sim/faults", data=b'{"crash": true}',
                                                       headers={"Content-Type": "application/json"}), timeout=5):
        pass
    deadline = time.monotonic() + 10
    while leader.status()["engine"]["pid"] is not None:
        assert time.monotonic() < deadline, leader.log.read_text()[-3000:]
        time.sleep(0.1)
    time.sleep(3.0)  # past the restart back-off (2 s)
    status = leader.status()
    assert (status["phase"], status["ready"], status["engine"]["pid"], status["engine"]["restarts"]) == (
        "Failed", False, None, 0), status
    assert "waiting for the gang to be recreated" in status["message"], status


@pytest.mark.slow
def test_a_worker_rank_follows_a_switch_without_waiting_out_its_leaders_requests(pod):
    """A worker rank's role file can change after its leader serves again (each kubelet refreshes it
    on its own schedule): it holds no request of its own, so it takes the new role at once, where a
    drain would wait on the leader's requests until the drain timeout and keep the old role."""
    leader = pod("prefill", nnodes=2)
    worker = pod("prefill", node_rank=1, port=leader.port)
    # A prefill request whose decode never comes for its KV waits in the bootstrap queue.
    body = {"input_ids": [1] * 16, "sampling_params": {"max_new_tokens": 4}, "bootstrap_host": "127.0.0.1",
            "bootstrap_room": 7}
    with ThreadPoolExecutor(1) as pool:
        pool.submit(httpx.post, leader.engine + "/generate", json=body, timeout=5)
        deadline = time.monotonic() + 10
        while not inflight_requests(httpx.get(leader.engine + "/v1/loads").json()):
            assert time.monotonic() < deadline, "the leader holds the request"
            time.sleep(0.05)
        worker.role_file.write_text("decode")
        status = worker.wait_switch(timeout=4)
        assert inflight_requests(httpx.get(leader.engine + "/v1/loads").json()), "the leader is still busy"
        # Freed, so that the leader's own drain at the end of the test has nothing to wait for.
        assert httpx.post(leader.engine + "/pause_generation", json={"mode": "abort"}).status_code == 200
        assert httpx.post(leader.engine + "/continue_generation", json={}).status_code == 200
    assert (status["lastSwitch"]["outcome"], status["role"]) == ("Succeeded", "decode"), status
    assert "Draining" not in [s["step"] for s in status["lastSwitch"]["steps"]], status


def test_pod_values_fill_the_operators_placeholders_from_the_environment() -> None:
    from hybridserving_engine.launcher import ConfigError, fill_pod_values

    template = ["--port", "{port}", "--node-rank", "{node_rank}", "--dist-init-addr", "{dist_init_addr}",
                "--json-model-override-args", '{"a": 1}']
    env = {"HYBRIDSERVING_PORT": "31000", "HYBRIDSERVING_DIST_INIT_ADDR": "fleet-0.ns.svc:20001"}
    assert fill_pod_values(template, env, 1) == [
        "--port", "31000", "--node-rank", "1", "--dist-init-addr", "fleet-0.ns.svc:20001",
        "--json-model-override-args", '{"a": 1}',
    ]
    with pytest.raises(ConfigError, match="HYBRIDSERVING_"):
        fill_pod_values(["--port", "{port}"], {}, 0)
