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
