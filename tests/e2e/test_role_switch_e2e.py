"""Role switches end to end on the local cluster, under steady client load through the real router.

The operator (with its role-switch controller), the pod runner (launchers + SGLang simulators at the
pod IPs) and `smg` with the operator-rendered arguments, as in test_fleet_e2e. Two fleets, one after
the other (the local cluster has four 8-GPU nodes):

* **in place** (`examples/role-switch.yaml`: identical layouts, mooncake): one prefill and two decode
  instances; the mix shifts to long prompts with short answers, prefill saturates, and the policy on
  its own moves a decode instance to prefill (`POST /pd_role_switch`, no restart);
* **relaunch** (the same fleet on nixl, which cannot switch in place): an on-call request
  (`hybridserving.io/switch-to`) moves a decode instance to prefill by relaunching its engine;
* **restore** (in place, `drainTimeoutSeconds: 1`, long answers): an on-call switch that cannot
  drain in time aborts and is back in the router within seconds.

All under client load that never stops: every request must succeed. Each switch shows up in the
HybridServing's `status.switches` and as Events.
"""

from __future__ import annotations

import time

import httpx

from hybridserving.devcluster.stack import launcher_url
from support.polling import wait_for
from support.served_fleet import SHORT_PROMPT, Load, bring_up, manifest, report, tear_down

LONG_PROMPT = "All work and no play makes Jack a dull boy. " * 1500  # ~16,500 simulated tokens
SWITCH_EVENTS = ["RoleSwitchStarted", "RoleSwitchUnrouted", "RoleSwitchDrained", "RoleSwitchSwitched",
                 "RoleSwitchVerified", "RoleSwitchSucceeded"]


def test_policy_switches_a_decode_instance_to_prefill_in_place_under_load(
        local_cluster, fleet_operator, pod_runner, discovering_router) -> None:
    namespace = "role-switch-in-place"
    f = bring_up(local_cluster, discovering_router, namespace,
                 manifest("rs-inplace", backend="mooncake", time_scale=0.5, startup_seconds=2.0))
    try:
        steady = Load(f.router, 2, SHORT_PROMPT, 32, "steady load (1K-token prompts, 32 tokens out)")
        time.sleep(5)
        # Restarts before this point (a launcher that lost a port race at start-up) are not the switch's.
        restarts_before = {n: p["status"]["containerStatuses"][0]["restartCount"] for n, p in f.leaders().items()}
        uids_before = {n: p["metadata"]["uid"] for n, p in f.leaders().items()}
        # The mix shifts: long prompts, short answers. Prefill saturates, decode idles.
        heavy = Load(f.router, 12, LONG_PROMPT, 4, "prefill-heavy load (16K-token prompts, 4 tokens out)")
        started = time.monotonic()
        switch = wait_for(f.finished_switch, 300, "the policy's switch to finish", interval=1)
        decided_after = time.monotonic() - started
        # Routed again means in the router again, at once: smg ignores a label back within 6 s of its
        # removal and finds the worker only by its periodic pass, a minute later (docs/role-switch.md).
        wait_for(lambda: f.serving(2, 1), 15, "two prefill and one decode leaders in the router")
        heavy.stop()
        time.sleep(3)
        steady.stop()
        report(f, switch, [steady, heavy])
        print(f"  switch finished {decided_after:.0f} s after the mix shifted")
        assert switch["reason"].startswith("policy:"), switch
        assert (switch["fromRole"], switch["toRole"], switch["mode"], switch["outcome"]) == (
            "decode", "prefill", "in-place", "Succeeded")
        assert not steady.failures and not heavy.failures, (steady.failures + heavy.failures)[:5]
        assert steady.ok > 10 and heavy.ok > 10
        reasons = [e["reason"] for e in f.events()]
        assert all(r in reasons for r in SWITCH_EVENTS), reasons
        inst = f.kubectl_json("get", "hybridservinginstance", switch["instance"])
        assert inst["spec"]["role"] == "prefill" and inst["status"]["lastSwitch"]
        assert "hybridserving.io/switch" not in (inst["metadata"].get("annotations") or {})
        # In place: the pod and its engine process were never restarted.
        leader = f.leaders()[switch["instance"]]
        assert leader["metadata"]["uid"] == uids_before[switch["instance"]]
        assert leader["status"]["containerStatuses"][0]["restartCount"] == restarts_before[switch["instance"]]
        launcher = httpx.get(launcher_url(leader) + "/status", timeout=5, trust_env=False).json()
        assert launcher["lastSwitch"]["mode"] == "in-place" and launcher["lastSwitch"]["outcome"] == "Succeeded"
        assert launcher["engine"]["restarts"] == 0

        # The other way: a prefill-born engine has no decode CUDA graphs, so SGLang switches it to
        # decode in place only given decode_cuda_graph_memory_gb (disaggregation/role_switch.py:79-89).
        born_prefill = sorted(n for n, pod in f.leaders().items()
                              if n != switch["instance"] and f.kubectl_json("get", "hybridservinginstance", n)
                              ["spec"]["role"] == "prefill")[0]
        victim_uid = f.leaders()[born_prefill]["metadata"]["uid"]
        f.cluster.kubectl("-n", namespace, "annotate", "hybridservinginstance", born_prefill,
                          "hybridserving.io/switch-to=decode")

        def back_to_decode() -> dict | None:
            return next((s for s in f.status().get("switches", [])
                         if s["instance"] == born_prefill and s["outcome"] != "InProgress"), None)

        p2d = wait_for(back_to_decode, 180, "the on-call prefill -> decode switch to finish", interval=1)
        assert (p2d["fromRole"], p2d["toRole"], p2d["mode"], p2d["outcome"]) == (
            "prefill", "decode", "in-place", "Succeeded"), p2d
        wait_for(lambda: f.serving(1, 2), 15, "one prefill and two decode leaders in the router")
        leader = f.leaders()[born_prefill]
        assert leader["metadata"]["uid"] == victim_uid
        launcher = httpx.get(launcher_url(leader) + "/status", timeout=5, trust_env=False).json()
        assert (launcher["role"], launcher["lastSwitch"]["mode"], launcher["engine"]["restarts"]) == (
            "decode", "in-place", 0)
        engine = f"http://{leader['status']['podIP']}:{launcher['engine']['url'].rsplit(':', 1)[1]}"
        assert httpx.get(engine + "/model_info", headers=f.router.headers, timeout=5,
                         trust_env=False).json()["disaggregation_mode"] == "decode"
    finally:
        tear_down(local_cluster, namespace)


def test_on_call_request_relaunches_a_decode_instance_as_prefill_under_load(
        local_cluster, fleet_operator, pod_runner, discovering_router) -> None:
    namespace = "role-switch-relaunch"
    # Relaunch time = the model's restart time (780 s) x 0.01.
    f = bring_up(local_cluster, discovering_router, namespace,
                 manifest("rs-relaunch", backend="nixl", time_scale=0.01, startup_seconds=None))
    try:
        steady = Load(f.router, 3, SHORT_PROMPT, 32, "steady load (1K-token prompts, 32 tokens out)")
        time.sleep(5)
        instances = f.kubectl_json("get", "hybridservinginstances")["items"]
        victim = sorted(i["metadata"]["name"] for i in instances if i["spec"]["role"] == "decode")[-1]
        before = f.leaders()[victim]
        f.cluster.kubectl("-n", namespace, "annotate", "hybridservinginstance", victim,
                          "hybridserving.io/switch-to=prefill")
        # Deadlines for progress, not for speed: under CPU contention a relaunch takes several
        # times its modelled 8 s, and smg may re-add a worker only on its 60 s resync.
        switch = wait_for(f.finished_switch, 600, "the on-call switch to finish", interval=1)
        wait_for(lambda: f.serving(2, 1), 180, "two prefill and one decode leaders in the router")
        time.sleep(3)
        steady.stop()
        report(f, switch, [steady])
        assert (switch["instance"], switch["fromRole"], switch["toRole"], switch["mode"], switch["outcome"]) == (
            victim, "decode", "prefill", "relaunch", "Succeeded")
        assert switch["reason"].startswith("on-call")
        assert not steady.failures, steady.failures[:5]
        assert steady.ok > 10
        reasons = [e["reason"] for e in f.events()]
        assert all(r in reasons for r in SWITCH_EVENTS), reasons
        leader = f.leaders()[victim]
        launcher = httpx.get(launcher_url(leader) + "/status", timeout=5, trust_env=False).json()
        assert launcher["lastSwitch"]["mode"] == "relaunch" and launcher["lastSwitch"]["outcome"] == "Succeeded"
        assert leader["metadata"]["uid"] == before["metadata"]["uid"], "same pod"
        assert (leader["status"]["containerStatuses"][0]["restartCount"]
                == before["status"]["containerStatuses"][0]["restartCount"]), "engine relaunched inside the container"
    finally:
        tear_down(local_cluster, namespace)


def test_a_switch_that_cannot_drain_in_time_puts_the_instance_back_in_the_router_at_once(
        local_cluster, fleet_operator, pod_runner, discovering_router) -> None:
    """drainTimeoutSeconds 1 under long answers: the switch aborts a second into its drain and
    restores the instance. smg ignores a label back within 6 s of its removal, removes the worker
    anyway and finds it again only by its periodic pass a minute later; the operator keeps the label
    off for 8 s, so the instance is back in the router within seconds of the Restore."""
    namespace = "role-switch-restore"
    doc = manifest("rs-restore", backend="mooncake", time_scale=0.5, startup_seconds=2.0)
    doc["spec"]["roleSwitch"]["drainTimeoutSeconds"] = 1
    f = bring_up(local_cluster, discovering_router, namespace, doc)
    try:
        long_answers = Load(f.router, 4, SHORT_PROMPT, 2000, "long answers (1K-token prompts, 2,000 tokens out)")
        time.sleep(5)
        instances = f.kubectl_json("get", "hybridservinginstances")["items"]
        victim = sorted(i["metadata"]["name"] for i in instances if i["spec"]["role"] == "decode")[0]
        f.cluster.kubectl("-n", namespace, "annotate", "hybridservinginstance", victim,
                          "hybridserving.io/switch-to=prefill")
        switch = wait_for(f.finished_switch, 120, "the on-call switch to end", interval=0.5)
        ended = time.monotonic()
        wait_for(lambda: f.serving(1, 2), 15, "the restored decode instance back in the router")
        print(f"  back in the router {time.monotonic() - ended:.1f} s after the switch ended")
        long_answers.stop()
        report(f, switch, [long_answers])
        assert (switch["instance"], switch["fromRole"], switch["toRole"], switch["outcome"]) == (
            victim, "decode", "prefill", "Aborted"), switch
        assert "not idle after 1 s of draining" in switch["phase"], switch
        assert not long_answers.failures, long_answers.failures[:5]
        assert f.kubectl_json("get", "hybridservinginstance", victim)["spec"]["role"] == "decode"
    finally:
        tear_down(local_cluster, namespace)
