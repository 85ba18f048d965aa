"""Chaos under steady client load through the real router: what a fleet loses to each fault.

One fleet (one prefill and two decode instances, in-place role switching) on the local cluster, with
the operator, the pod runner (launchers + SGLang simulators) and `smg`. Each scenario runs under
closed-loop clients through the router and ends when the fleet serves with its full mix again; it
reports the requests sent, failed (an error answer) and lost (no answer: connection dropped or timed
out) and names the instance the fault hit. The scenarios:

* **manual role edit**: `spec.role` of a decode instance edited by hand (a safe switch to prefill;
  the fleet then runs two prefill and one decode instance);
* **operator kill**: the operator SIGKILLed and restarted while the fleet serves;
* **control-plane outage**: the kube-apiserver stopped for 20 s and started again with the same
  command line (an upgrade or a restart). The router keeps its workers throughout; the leader,
  which cannot renew its Lease, exits and is restarted as its kubelet would (so are the local
  cluster's scheduler and controller manager, which lose theirs too); afterwards the
  operator acts on a spec edit and on a deleted NetworkPolicy, and no engine, pod or container
  restarted, no role switched and the Degraded condition never changed;
* **pod deletion**: a prefill leader pod deleted (its gang restarts);
* **instance deletion**: a prefill HybridServingInstance deleted (the operator recreates it);
* **node drain**: `kubectl drain` of a prefill leader's node (eviction through the budget);
* **engine crash**: a prefill engine exits (the launcher restarts it);
* **hung engine**: a prefill engine made 1000x slower for 20 s;
* **crash-looping engine**: a prefill engine that exits at every start (a fault file the simulator
  reads at start-up) until its instance says CrashLoop, in status, in the fleet's Degraded condition
  and in an Event; then the fault is lifted and the next restart serves;
* **hostile endpoint calls from another pod**: a process without the fleet's engine key (this test,
  which like any pod on a cluster without an enforcing CNI reaches every engine port: the local
  cluster has no such CNI) calls `/pause_generation` (abort) and `/pd_role_switch` on every engine,
  without a key and with a wrong one: every call is refused (401), no client request fails and
  every engine keeps its role. The rendered NetworkPolicy, the other layer, is checked against the
  live pods: it selects them all and admits no pod outside the fleet.

The target (zero lost except requests already running on an engine that a scenario stops) is
asserted where it holds by design: a manual role edit, an operator kill, a control-plane outage
and hostile calls lose nothing and fail nothing. The other scenarios' losses are reported with the
instance named; each must recover and keep serving. The report is printed and written as JSON
($HYBRIDSERVING_CHAOS_REPORT, default /tmp/hybridserving-chaos.json).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest
import yaml

from hybridserving.devcluster import stack
from hybridserving.devcluster.stack import Router
from support.polling import wait_for

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = "deepseek-ai/DeepSeek-V3"
PROMPT = "The quick brown fox jumps over the lazy dog. " * 30  # ~340 simulated tokens
NAMESPACE = "chaos"
CLIENTS = 3
CLIENT_TIMEOUT_S = 30.0
OUTAGE_SECONDS = 20
REPORT = pathlib.Path(os.environ.get("HYBRIDSERVING_CHAOS_REPORT", "/tmp/hybridserving-chaos.json"))


def fleet_manifest(faults_file: pathlib.Path) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / "role-switch.yaml").read_text())
    doc["metadata"]["name"] = "chaos"
    spec = doc["spec"]
    spec["prefill"]["replicas"] = 1
    spec["decode"]["replicas"] = 2
    # The policy stays out of the way: only the scenarios move instances.
    spec["roleSwitch"].update(cooldownSeconds=3600, drainTimeoutSeconds=30, maxConcurrent=1, minPrefill=1,
                              minDecode=1)
    spec["engine"] = {"env": [
        {"name": "HYBRIDSERVING_SIM_PROFILE", "value": spec["model"]["profile"]},
        {"name": "HYBRIDSERVING_SIM_TIME_SCALE", "value": "0.2"},
        {"name": "HYBRIDSERVING_SIM_STARTUP_SECONDS", "value": "1"},
        {"name": "HYBRIDSERVING_POLL_INTERVAL_S", "value": "0.2"},
        {"name": "HYBRIDSERVING_RESTART_BACKOFF_S", "value": "0.5"},
        {"name": "HYBRIDSERVING_CRASH_LOOP_RESTARTS", "value": "3"},
        {"name": "HYBRIDSERVING_SIM_FAULTS_FILE", "value": str(faults_file)},
    ]}
    return doc


class Load:
    """Closed-loop clients through the router; failed = an error answer, lost = no answer."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.stop_event = threading.Event()
        self.sent = self.ok = 0
        self.failed: list[str] = []
        self.lost: list[str] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(CLIENTS)]
        for t in self.threads:
            t.start()

    def _client(self) -> None:
        with httpx.Client(timeout=CLIENT_TIMEOUT_S, trust_env=False, headers=self.router.headers) as client:
            while not self.stop_event.is_set():
                with self.lock:
                    self.sent += 1
                try:
                    resp = client.post(self.router.url + "/v1/completions",
                                       json={"model": MODEL, "prompt": PROMPT, "max_tokens": 16})
                except httpx.HTTPError as e:
                    with self.lock:
                        self.lost.append(f"{type(e).__name__}: {e}"[:200])
                    continue
                with self.lock:
                    if resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 16:
                        self.ok += 1
                    else:
                        self.failed.append(f"{resp.status_code}: {resp.text[:200]}")

    def stop(self) -> Load:
        self.stop_event.set()
        for t in self.threads:
            t.join(CLIENT_TIMEOUT_S + 10)
        return self


@dataclass
class Outcome:
    scenario: str
    target: str
    sent: int
    ok: int
    failed: int
    lost: int
    recovered_s: float
    notes: list[str] = field(default_factory=list)


class Chaos:
    """The fleet under test and the means to hurt it."""

    def __init__(self, cluster, router: Router, operator: OperatorHandle, faults_file: pathlib.Path) -> None:
        self.cluster, self.router, self.operator, self.faults_file = cluster, router, operator, faults_file
        self.outcomes: list[Outcome] = []

    def kubectl(self, *args: str, check: bool = True):
        return self.cluster.kubectl("-n", NAMESPACE, *args, check=check)

    def json(self, *args: str) -> dict:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def leaders(self) -> dict[str, dict]:
        pods = self.json("get", "pods", "-l", "hybridserving.io/name=chaos,hybridserving.io/leader=true")
        return {p["metadata"]["labels"]["hybridserving.io/instance"]: p for p in pods["items"]
                if not p["metadata"].get("deletionTimestamp")}

    def roles(self) -> dict[str, str]:
        return {i["metadata"]["name"]: i["spec"]["role"] for i in self.json("get", "hybridservinginstances")["items"]}

    def engine_url(self, instance: str, leader: dict) -> str:
        port = self.json("get", "hybridservinginstance", instance)["spec"]["ports"]["http"]
        return f"http://{leader['status']['podIP']}:{port}"

    def victim(self) -> str:
        """An instance of the role that has most: the fleet keeps serving both roles meanwhile."""
        roles = self.roles()
        crowded = max(("decode", "prefill"), key=lambda r: list(roles.values()).count(r))
        return sorted(n for n, r in roles.items() if r == crowded)[-1]

    def routed(self) -> list[str]:
        """The roles of the router's healthy workers (the router's own view: no API call)."""
        workers = httpx.get(self.router.url + "/workers", headers=self.router.headers, timeout=5,
                            trust_env=False).json()["workers"]
        return sorted(w["worker_type"] for w in workers if w.get("is_healthy"))

    def serving(self) -> bool:
        """Every instance ready, routed by its role, healthy in the router, and a request through
        the router answered: what clients see, which the router's view of its workers only
        suggests, is what the next scenario must start from."""
        try:
            healthy = self.routed()
        except httpx.HTTPError:
            return False
        ready = [p for p in self.leaders().values()
                 if {c["type"]: c["status"] for c in p["status"].get("conditions", [])}.get("Ready") == "True"
                 and p["metadata"]["labels"].get("hybridserving.io/role")]
        if healthy != sorted(self.roles().values()) or len(ready) != 3:
            return False
        try:
            answer = httpx.post(self.router.url + "/v1/completions", headers=self.router.headers, timeout=10,
                                trust_env=False, json={"model": MODEL, "prompt": PROMPT, "max_tokens": 1})
        except httpx.HTTPError:
            return False
        return answer.status_code == 200

    def engines(self) -> dict[str, tuple[str, int, int, int, float]]:
        """Per instance what any restart changes: its leader pod, the container's restarts, the
        engine process, its restarts and start (the launcher's /status)."""
        out = {}
        for name, pod in self.leaders().items():
            engine = httpx.get(stack.launcher_url(pod) + "/status", timeout=5, trust_env=False).json()["engine"]
            out[name] = (pod["metadata"]["uid"], pod["status"]["containerStatuses"][0]["restartCount"],
                         engine["pid"], engine["restarts"], engine["startedAt"])
        return out

    def fleet(self) -> dict:
        return self.json("get", "hybridserving", "chaos")

    def conditions(self) -> dict[str, dict]:
        return {c["type"]: c for c in self.fleet()["status"]["conditions"]}

    def run(self, scenario: str, target: str, hurt) -> Outcome:
        """Load, hurt, wait until the full mix serves again (3 s at least), stop the load, record."""
        load = Load(self.router)
        time.sleep(3)
        started = time.monotonic()
        notes = hurt() or []
        time.sleep(3)
        wait_for(self.serving, 300, f"{scenario}: the fleet serving its full mix again", interval=1)
        recovered = time.monotonic() - started
        time.sleep(2)
        load.stop()
        outcome = Outcome(scenario, target, load.sent, load.ok, len(load.failed), len(load.lost),
                          round(recovered, 1), [*notes, *sorted(set(load.failed + load.lost))[:3]])
        self.outcomes.append(outcome)
        print(f"\n[chaos] {scenario} ({target}): sent {outcome.sent}, ok {outcome.ok}, failed {outcome.failed}, "
              f"lost {outcome.lost}, serving again after {outcome.recovered_s} s; {'; '.join(outcome.notes)}")
        return outcome


@dataclass
class OperatorHandle:
    """The session's leader-elected operator replicas: the operator-kill scenario SIGKILLs the
    leader and, after the outage, starts a fresh replica as a Deployment's ReplicaSet would."""

    replicas: object

    def kill_and_restart(self, down_s: float) -> None:
        leader = self.replicas.leader()  # type: ignore[attr-defined]
        os.kill(leader.proc.pid, signal.SIGKILL)
        leader.proc.wait(10)
        time.sleep(down_s)
        self.replicas.start()  # type: ignore[attr-defined]

    def leader(self) -> str:
        """The replica that holds the Lease (waiting for one)."""
        return self.replicas.leader().identity  # type: ignore[attr-defined]

    def live(self) -> list:
        return [r for r in self.replicas.replicas if r.proc.poll() is None]  # type: ignore[attr-defined]

    def restart_exited(self, replicas: list) -> list[str]:
        """A fresh replica for each of `replicas` that exited, as the kubelet restarts a container
        that exits (it needs no apiserver for that): a leader that cannot renew its Lease for the
        renew deadline exits (controller/leadership.py)."""
        exited = [r for r in replicas if r.proc.poll() is not None]
        for _ in exited:
            self.replicas.start()  # type: ignore[attr-defined]
        return [f"{r.identity} exited ({r.proc.returncode})" for r in exited]


@pytest.fixture(scope="session")
def operator_handle(fleet_operator) -> OperatorHandle:
    """The session's operator; replicas it starts are stopped with the session's."""
    return OperatorHandle(fleet_operator)


def test_faults_under_steady_load(local_cluster, fleet_operator, pod_runner, discovering_router,
                                  operator_handle, tmp_path: pathlib.Path) -> None:
    local_cluster.kubectl("create", "namespace", NAMESPACE)
    chaos: Chaos | None = None
    faults_file = tmp_path / "engine-faults"
    try:
        local_cluster.kubectl("-n", NAMESPACE, "apply", "-f", "-",
                              input=yaml.safe_dump(fleet_manifest(faults_file)))
        wait_for(lambda: stack.router_deployments(local_cluster, NAMESPACE, "chaos"), 60, "the router Deployment")
        [router] = stack.router_deployments(local_cluster, NAMESPACE, "chaos")
        chaos = Chaos(local_cluster, discovering_router(NAMESPACE, router), operator_handle, faults_file)
        wait_for(chaos.serving, 180, "the fleet serving")
        _scenarios(chaos)
    finally:
        REPORT.write_text(json.dumps([o.__dict__ for o in chaos.outcomes] if chaos else [], indent=1))
        bound = _bound_ports(local_cluster)
        stack.delete_namespace(local_cluster, NAMESPACE)
        # Pod objects go before their processes stop; the next test's pods may get the same loopback
        # IPs, so wait until the fleet's engines and launchers have let go of their ports.
        wait_for(lambda: not any(_listening(addr) for addr in bound), 120, "the fleet's ports released")


def _bound_ports(cluster) -> list[tuple[str, int]]:
    out = cluster.kubectl("-n", NAMESPACE, "get", "pods", "-o", "json", check=False)
    if out.returncode != 0:
        return []
    return [(pod["status"]["podIP"], port["containerPort"])
            for pod in json.loads(out.stdout)["items"] if (pod.get("status") or {}).get("podIP")
            for container in pod["spec"]["containers"] for port in container.get("ports") or []]


def _listening(addr: tuple[str, int]) -> bool:
    try:
        socket.create_connection(addr, timeout=0.5).close()
    except OSError:
        return False
    return True


def _scenarios(chaos: Chaos) -> None:
    # Manual role edit: a safe switch (unroute, drain, switch, verify, route). The fleet keeps the
    # new mix (two prefill, one decode) for the scenarios that follow.
    def edit_role() -> list[str]:
        victim = chaos.victim()
        chaos.kubectl("patch", "hybridservinginstance", victim, "--type=merge", "-p",
                      json.dumps({"spec": {"role": "prefill"}}))
        wait_for(lambda: any(s["instance"] == victim and s["outcome"] != "InProgress"
                             for s in chaos.json("get", "hybridserving", "chaos").get("status", {})
                             .get("switches", [])), 240, "the adopted switch to finish", interval=1)
        switch = [s for s in chaos.json("get", "hybridserving", "chaos")["status"]["switches"]
                  if s["instance"] == victim][-1]
        assert switch["outcome"] == "Succeeded", switch
        return [f"{victim}: decode -> prefill {switch['outcome']} ({switch['phase']})"]

    edited = chaos.run("manual role edit", "zero lost", edit_role)
    assert edited.failed == 0 and edited.lost == 0, edited

    def kill_operator() -> list[str]:
        chaos.operator.kill_and_restart(down_s=10)
        return ["operator SIGKILLed, down 10 s, restarted"]

    killed = chaos.run("operator kill", "zero lost", kill_operator)
    assert killed.failed == 0 and killed.lost == 0, killed

    def hostile_calls() -> list[str]:
        roles = chaos.roles()
        answers: list[tuple[int, dict]] = []
        for name, pod in chaos.leaders().items():
            engine = chaos.engine_url(name, pod)
            other = "decode" if roles[name] == "prefill" else "prefill"
            for headers in ({}, {"Authorization": "Bearer not-the-key"}):
                for path, body in (("/pause_generation", {"mode": "abort"}), ("/pd_role_switch", {"new_role": other})):
                    resp = httpx.post(engine + path, json=body, headers=headers, timeout=10, trust_env=False)
                    answers.append((resp.status_code, resp.json()))
        assert len(answers) == 4 * len(roles) and set(map(json.dumps, answers)) == {
            json.dumps([401, {"error": "Unauthorized"}])}, answers
        time.sleep(2)  # what a paused engine or a switched role would show by now
        assert chaos.roles() == roles
        for name, pod in chaos.leaders().items():
            engine = chaos.engine_url(name, pod)
            live = httpx.get(engine + "/model_info", headers=chaos.router.headers, timeout=5, trust_env=False).json()
            assert live["disaggregation_mode"] == roles[name], (name, live)
            assert httpx.get(engine + "/ready", timeout=5, trust_env=False).status_code == 200, f"{name} paused"
        return [f"{len(answers)} calls to {len(roles)} engines without the key: all 401; every engine kept its "
                "role and kept serving"]

    hostile = chaos.run("hostile endpoint calls from another pod", "refused, zero failed", hostile_calls)
    assert hostile.failed == 0 and hostile.lost == 0, hostile

    def delete_pod() -> list[str]:
        victim = chaos.victim()
        chaos.kubectl("delete", "pod", f"{victim}-0", "--wait=false")
        return [f"{victim}-0 deleted"]

    def delete_instance() -> list[str]:
        victim = chaos.victim()
        chaos.kubectl("delete", "hybridservinginstance", victim, "--wait=false")
        return [f"instance {victim} deleted"]

    def drain_node() -> list[str]:
        victim = chaos.victim()
        node = chaos.leaders()[victim]["spec"]["nodeName"]
        drained = chaos.cluster.kubectl("drain", node, "--ignore-daemonsets", "--delete-emptydir-data",
                                        "--timeout=180s", check=False, timeout=200)
        chaos.cluster.kubectl("uncordon", node, check=False)
        assert drained.returncode == 0, drained.stderr[-1000:]
        return [f"node {node} of {victim} drained"]

    def crash_engine() -> list[str]:
        victim = chaos.victim()
        pod = chaos.leaders()[victim]
        port = chaos.json("get", "hybridservinginstance", victim)["spec"]["ports"]["http"]
        httpx.post(f"http://{pod['status']['podIP']}:{port}/sim/faults", json={"crash": True}, timeout=5,
                   trust_env=False)
        return [f"{victim}'s engine crashed"]

    def hang_engine() -> list[str]:
        victim = chaos.victim()
        pod = chaos.leaders()[victim]
        port = chaos.json("get", "hybridservinginstance", victim)["spec"]["ports"]["http"]
        url = f"http://{pod['status']['podIP']}:{port}/sim/faults"
        httpx.post(url, json={"slow": 1000}, timeout=5, trust_env=False)
        time.sleep(20)
        httpx.post(url, json={"slow": 1}, timeout=5, trust_env=False)
        return [f"{victim}'s engine 1000x slower for 20 s (nothing restarts a slow engine that answers /health)"]

    def crash_loop() -> list[str]:
        victim = chaos.victim()
        pod = chaos.leaders()[victim]
        port = chaos.json("get", "hybridservinginstance", victim)["spec"]["ports"]["http"]
        chaos.faults_file.write_text("crash_on_start\n")  # every start from now on exits at once
        try:
            httpx.post(f"http://{pod['status']['podIP']}:{port}/sim/faults", json={"crash": True}, timeout=5,
                       trust_env=False)
            wait_for(lambda: chaos.json("get", "hybridservinginstance", victim).get("status", {}).get("phase")
                     == "CrashLoop", 180, f"{victim} reported as CrashLoop", interval=1)

            def fleet_conditions() -> dict[str, dict]:
                return {c["type"]: c for c in chaos.json("get", "hybridserving", "chaos")["status"]["conditions"]}

            # A reconcile writes its instances' status before the fleet's: a read between the two
            # writes sees the instance in CrashLoop and the fleet not yet Degraded. The conditions
            # checked below are the ones the fleet reported together, in one status.
            degraded = wait_for(lambda: (c := fleet_conditions())["Degraded"]["status"] == "True" and c, 60,
                                "the fleet's Degraded condition", interval=1)
            events = chaos.json("get", "events", "--field-selector",
                                f"involvedObject.name={victim},reason=CrashLoop")["items"]
        finally:
            chaos.faults_file.write_text("")
        assert degraded["Degraded"]["status"] == "True" and victim in degraded["Degraded"]["message"], degraded
        assert degraded["Ready"]["status"] == "False", degraded["Ready"]
        assert events, f"no CrashLoop Event for {victim}"
        restarts = chaos.leaders()[victim]["status"]["containerStatuses"][0]["restartCount"]
        return [f"{victim}'s engine exited at every start until its instance said CrashLoop "
                f"(container restarts {restarts}; Degraded: {degraded['Degraded']['message'][:120]})"]

    for scenario, hurt in (("pod deletion", delete_pod), ("instance deletion", delete_instance),
                           ("node drain", drain_node), ("engine crash", crash_engine),
                           ("hung engine", hang_engine), ("crash-looping engine", crash_loop)):
        outcome = chaos.run(scenario, "lost only what ran on the engine it stopped", hurt)
        assert outcome.ok > 0, outcome

    # Control-plane outage: the kube-apiserver stopped for OUTAGE_SECONDS and started again with
    # the same command line, as an upgrade or a restart does. The router, the engines and their
    # launchers serve without it; the operator acts again once it is back, and nothing restarts.
    # Last: as on a real control plane, the scheduler and the controller manager lose their leases
    # and are restarted, and the scheduler places pods again only after its informers' back-off
    # and the lease it waits out (up to about 45 s after the apiserver is back): no later
    # scenario waits on that.
    def control_plane_outage() -> list[str]:
        def healthy() -> dict | None:  # the crash loop before has ended: the fleet says so too
            hs = chaos.fleet()
            return hs if {c["type"]: c["status"] for c in hs["status"]["conditions"]}.get("Degraded") == "False" \
                else None

        fleet = wait_for(healthy, 60, "the fleet not Degraded before the outage", interval=1)
        engines = chaos.engines()
        degraded = [(c["status"], c["lastTransitionTime"]) for c in fleet["status"]["conditions"]
                    if c["type"] == "Degraded"]
        # The outage meets a leader that holds the Lease.
        leader = chaos.operator.leader()
        routed, replicas = chaos.routed(), chaos.operator.live()
        during: list[list[str]] = []
        outage = threading.Event()

        def watch_router() -> None:
            while not outage.wait(1):
                during.append(chaos.routed())

        watcher = threading.Thread(target=watch_router, daemon=True)
        watcher.start()
        try:
            chaos.cluster.restart("kube-apiserver", down_seconds=OUTAGE_SECONDS)
        finally:
            outage.set()
            watcher.join(10)
        back = time.monotonic()
        exited = chaos.operator.restart_exited(replicas)
        assert during and all(r == routed for r in during), f"the router's workers changed: {during}"
        # The operator acts again: a spec edit made now shows in status, a deleted object comes back.
        chaos.kubectl("patch", "hybridserving", "chaos", "--type=merge", "-p",
                      json.dumps({"spec": {"roleSwitch": {"cooldownSeconds": 3599}}}))
        chaos.kubectl("delete", "networkpolicy", "chaos-engines")

        def current() -> dict | None:
            hs = chaos.fleet()
            ready = {c["type"]: c["status"] for c in hs["status"]["conditions"]}.get("Ready")
            return hs if hs["status"].get("observedGeneration") == hs["metadata"]["generation"] and \
                ready == "True" else None

        now = wait_for(current, 90, "the fleet's status current and Ready after the outage", interval=1)
        wait_for(lambda: chaos.kubectl("get", "networkpolicy", "chaos-engines", check=False).returncode == 0, 90,
                 "the deleted NetworkPolicy recreated", interval=1)
        resumed = time.monotonic() - back
        assert chaos.engines() == engines, "an engine, its pod or its container restarted"
        assert now["status"].get("switches", []) == fleet["status"].get("switches", []), "a role switch ran"
        assert [(c["status"], c["lastTransitionTime"]) for c in now["status"]["conditions"]
                if c["type"] == "Degraded"] == degraded == [("False", degraded[0][1])], "Degraded came and went"
        return [f"kube-apiserver down {OUTAGE_SECONDS} s; router kept {len(routed)} healthy workers "
                f"({len(during)} samples); leader {leader}: {'; '.join(exited) or 'no replica exited'}, "
                "a replica started for each as its kubelet would; "
                f"operator acted on a spec edit and a deleted NetworkPolicy {resumed:.0f} s after the apiserver "
                "was back; no engine, pod or container restarted, no switch, Degraded unchanged"]

    outage = chaos.run("control-plane outage", "zero lost", control_plane_outage)
    assert outage.failed == 0 and outage.lost == 0, outage

    # The other layer against hostile calls: the policy selects every engine pod and admits no pod
    # outside the fleet (where a CNI enforces it).
    policy = chaos.json("get", "networkpolicy", "chaos-engines")["spec"]
    selector = policy["podSelector"]["matchLabels"]
    pods = chaos.json("get", "pods", "-l", ",".join(f"{k}={v}" for k, v in selector.items()))["items"]
    assert len(pods) == 3, "every engine pod is under the policy"
    stranger = {"app": "curious"}
    admitted = [peer for rule in policy["ingress"] for peer in rule["from"]
                if all(stranger.get(k) == v for k, v in peer["podSelector"]["matchLabels"].items())]
    assert admitted == []
    print("\n[chaos] summary")
    for o in chaos.outcomes:
        print(f"  {o.scenario:40s} sent {o.sent:5d}  ok {o.ok:5d}  failed {o.failed:3d}  lost {o.lost:3d}  "
              f"serving again after {o.recovered_s:5.1f} s")
