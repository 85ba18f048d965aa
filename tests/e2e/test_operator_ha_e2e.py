"""Operator HA: the leader killed in the middle of a role switch hands over to a standby within
seconds, the switch resumes from its instance annotation and completes once, with no duplicate
action and no failed client request through the real router.

The shared operator (conftest `fleet_operator`) runs with `--leader-elect`; this test adds a
second replica, which stands by. An on-call switch relaunches a decode instance as prefill (nixl:
no in-place switch; the relaunch takes the model's restart time x 0.01, about 8 s), the leader is
SIGKILLed while the instance is draining or relaunching, and the standby must take the Lease after
it runs out (8 s) and finish the switch. Both replicas answer their liveness probe throughout
(the operator's /healthz, healthy once the startup handler returns, which a standby's does at once).
"No duplicate action" is counted three ways: one RoleSwitchStarted Event, one entry in
status.switches, and one switch in the engine's launcher.
"""

from __future__ import annotations

import signal
import time

import httpx

from hybridserving.devcluster.stack import launcher_url
from support.polling import wait_for
from support.served_fleet import SHORT_PROMPT, Load, bring_up, manifest, report, tear_down

HANDOVER_WITHIN_S = 15  # the e2e lease (8 s, conftest) + a retry period, on a shared 2-core machine


def probe(replica, path: str) -> int:
    """The status of an operator replica's health endpoint (conftest.OperatorReplica)."""
    return httpx.get(replica.health_url + path, timeout=5, trust_env=False).status_code


def test_killing_the_leader_mid_switch_hands_over_and_the_switch_completes_once(
        local_cluster, fleet_operator, pod_runner, discovering_router) -> None:
    namespace = "operator-ha"
    first = fleet_operator.leader()
    second = fleet_operator.start()
    wait_for(lambda: "standing by" in second.log.read_text(), 60, "the second replica to stand by")
    assert fleet_operator.holder() == first.identity
    # The standby is alive: a liveness probe must not restart it while it waits for the Lease.
    assert probe(second, "/healthz") == 200 and probe(first, "/healthz") == 200
    f = bring_up(local_cluster, discovering_router, namespace,
                 manifest("ha", backend="nixl", time_scale=0.01, startup_seconds=None))
    try:
        steady = Load(f.router, 3, SHORT_PROMPT, 32, "steady load (1K-token prompts, 32 tokens out)")
        time.sleep(3)
        instances = f.kubectl_json("get", "hybridservinginstances")["items"]
        victim = sorted(i["metadata"]["name"] for i in instances if i["spec"]["role"] == "decode")[-1]
        f.cluster.kubectl("-n", namespace, "annotate", "hybridservinginstance", victim,
                          "hybridserving.io/switch-to=prefill")

        def switching() -> str | None:
            phase = (f.kubectl_json("get", "hybridservinginstance", victim).get("status") or {}).get("phase")
            return phase if phase in ("Draining", "Relaunching", "Switching") else None

        phase_at_kill = wait_for(switching, 60, "the switch to be under way", interval=0.2)
        first.proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        first.proc.wait(10)
        wait_for(lambda: fleet_operator.holder() == second.identity, 60, "the standby to take the lease",
                 interval=0.2)
        handover = time.monotonic() - killed
        switch = wait_for(f.finished_switch, 180, "the switch to finish", interval=1)
        done = time.monotonic() - killed
        wait_for(lambda: f.serving(2, 1), 90, "two prefill and one decode leaders in the router")
        time.sleep(2)
        steady.stop()
        report(f, switch, [steady])
        print(f"  leader killed while {victim} was {phase_at_kill}; standby took the lease after {handover:.1f} s; "
              f"switch finished {done:.1f} s after the kill")

        assert handover < HANDOVER_WITHIN_S, handover
        assert (switch["instance"], switch["fromRole"], switch["toRole"], switch["outcome"]) == (
            victim, "decode", "prefill", "Succeeded")
        records = [s for s in f.status().get("switches", []) if s["instance"] == victim]
        assert len(records) == 1, records
        started = [e for e in f.events() if e["reason"] == "RoleSwitchStarted"]
        assert len(started) == 1 and sum(e.get("count", 1) for e in started) == 1, started
        launcher = httpx.get(launcher_url(f.leaders()[victim]) + "/status", timeout=5, trust_env=False).json()
        assert launcher["switchCount"] == 1 and launcher["lastSwitch"]["outcome"] == "Succeeded", launcher
        assert not steady.failures, steady.failures[:5]
        assert steady.ok > 10
        assert "took the lease" in second.log.read_text()
        assert probe(second, "/healthz") == 200
    finally:
        tear_down(local_cluster, namespace)
