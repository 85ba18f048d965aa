"""The fleet's total resized under steady client load through the real router: what HPA or KEDA
does through the scale subresource, here by `kubectl scale`.

A switching fleet of one prefill and two decode instances (`examples/role-switch.yaml` on the
SGLang simulator) grows to five instances and shrinks to two while closed-loop clients keep
sending through `smg`; every request must succeed. New instances join the router once their
engine is ready; removed ones leave it and drain their engine on termination.
"""

from __future__ import annotations

from collections import Counter

from support.polling import wait_for
from support.served_fleet import SHORT_PROMPT, FleetUnderTest, Load, bring_up, manifest, tear_down


def routed(f: FleetUnderTest, prefill: int, decode: int) -> bool:
    """The instances exist with these roles, and the router has exactly them as healthy workers."""
    roles = Counter(i["spec"]["role"] for i in f.kubectl_json("get", "hybridservinginstances")["items"])
    return roles == Counter(prefill=prefill, decode=decode) and f.serving(prefill, decode)


def test_kubectl_scale_grows_and_shrinks_a_fleet_under_load_without_failing_a_request(
        local_cluster, fleet_operator, pod_runner, discovering_router) -> None:
    namespace = "scaling"
    doc = manifest("rs-scale", backend="mooncake", time_scale=0.5, startup_seconds=2.0)
    f = bring_up(local_cluster, discovering_router, namespace, doc)
    try:
        load = Load(f.router, 3, SHORT_PROMPT, 32, "steady load (1K-token prompts, 32 tokens out)")
        wait_for(lambda: load.ok >= 5, 60, "requests flowing")
        f.cluster.kubectl("-n", namespace, "scale", "hybridserving", f.name, "--replicas=5")
        # Shares 1:2 of five: the new instances are one prefill and one decode.
        wait_for(lambda: routed(f, 2, 3), 240, "five instances, two prefill and three decode, routed")
        grown = load.ok
        f.cluster.kubectl("-n", namespace, "scale", "hybridserving", f.name, "--replicas=2")
        wait_for(lambda: routed(f, 1, 1), 240, "two instances, one per role (the floors), routed")
        wait_for(lambda: load.ok >= grown + 5, 60, "requests flowing after the shrink")
        load.stop()
        print(f"\n[{namespace}] 3 -> 5 -> 2 instances; {load}")
        assert not load.failures, load.failures[:5]
        status = f.status()
        assert status["replicas"] == 2 and status["ready"] == "True"
        messages = [e["message"] for e in f.kubectl_json("get", "events")["items"]
                    if e["reason"] in ("CreatedInstance", "DeletedInstance")]
        assert any("new " in m for m in messages) and any("scaled down" in m for m in messages), messages
    finally:
        tear_down(local_cluster, namespace)


LONG_PROMPT = "All work and no play makes Jack a dull boy. " * 1500  # ~16,500 simulated tokens


def scaled_events(f: FleetUnderTest) -> list[str]:
    return [e["reason"] for e in sorted(f.kubectl_json("get", "events")["items"],
                                        key=lambda e: e["metadata"]["creationTimestamp"])
            if e["reason"] in ("ScaledUp", "ScaledDown")]


def test_the_built_in_scaler_shrinks_an_idle_fleet_and_grows_it_under_prefill_pressure(
        local_cluster, fleet_operator, pod_runner, discovering_router) -> None:
    """`spec.scaling.enabled`: the operator's own scaler writes `spec.replicas` through the scale
    subresource, from the same demand the role-switch policy reads."""
    namespace = "scaling-built-in"
    doc = manifest("rs-autoscale", backend="mooncake", time_scale=0.5, startup_seconds=2.0)
    doc["spec"]["scaling"] = {"enabled": True, "minReplicas": 2, "maxReplicas": 4, "scaleDownDelaySeconds": 20}
    f = bring_up(local_cluster, discovering_router, namespace, doc, serving=None)
    try:
        wait_for(lambda: min(f.router_workers()[role] for role in ("prefill", "decode")) >= 1, 180,
                 "a prefill and a decode worker in the router")
        light = Load(f.router, 1, SHORT_PROMPT, 32, "light load (1K-token prompts, 32 tokens out)")
        wait_for(lambda: routed(f, 1, 1), 300, "the scaler to shrink the idle fleet to its floors")
        assert f.kubectl_json("get", "hybridserving", f.name)["spec"]["replicas"] == 2
        heavy = Load(f.router, 12, LONG_PROMPT, 4, "prefill-heavy load (16K-token prompts, 4 tokens out)")
        # The decode floor leaves nothing to switch: only a bigger fleet relieves prefill.
        wait_for(lambda: f.kubectl_json("get", "hybridserving", f.name)["spec"]["replicas"] > 2, 300,
                 "the scaler to grow the fleet")
        wait_for(lambda: sum(f.router_workers().values()) >= 3, 240, "the new instance routed")
        heavy.stop()
        light.stop()
        print(f"\n[{namespace}] events {scaled_events(f)}; {light}; {heavy}")
        assert not light.failures and not heavy.failures, (light.failures + heavy.failures)[:5]
        events = scaled_events(f)
        assert events[0] == "ScaledDown" and "ScaledUp" in events, events
    finally:
        tear_down(local_cluster, namespace)
