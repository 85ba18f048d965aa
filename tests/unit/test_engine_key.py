"""Each fleet's engine API key: derived by the operator, written to one Secret, referenced by pods and
the router, never in plain text in any other object."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from hybridserving.api.v1alpha1 import KIND
from hybridserving.contract import ENV_ENGINE_API_KEY
from hybridserving.controller import __main__ as operator_main
from hybridserving.controller import reconcile as rec
from hybridserving.core import enginekey, layout
from hybridserving.core.naming import API_VERSION
from support.apiserver import NS, MemoryApi
from support.fleets import SPEC, settle



def fleet_key(operator_key: bytes) -> str:
    return enginekey.derive(operator_key, "hs-uid")  # MemoryApi.user_apply's uid


def test_the_key_is_a_function_of_the_operator_key_and_the_fleet_uid() -> None:
    key = enginekey.derive(b"k" * 32, "uid-1")
    assert key == enginekey.derive(b"k" * 32, "uid-1") and len(key) == 64
    assert key != enginekey.derive(b"k" * 32, "uid-2"), "a recreated fleet gets a new key"
    assert key != enginekey.derive(b"j" * 32, "uid-1")
    with pytest.raises(ValueError, match="HYBRIDSERVING_OPERATOR_KEY"):
        enginekey.derive(b"", "uid-1")


def test_the_fleet_secret_holds_the_key_and_belongs_to_the_fleet(api: MemoryApi, operator_key: bytes) -> None:
    settle(api)
    secret = api.store[("Secret", "fleet-engine-key")]
    assert base64.b64decode(secret["data"][enginekey.SECRET_KEY]).decode() == fleet_key(operator_key)
    assert secret["metadata"]["ownerReferences"] == [
        {"apiVersion": API_VERSION, "kind": KIND, "name": "fleet", "uid": "hs-uid", "controller": True,
         "blockOwnerDeletion": True}]


def test_the_key_is_in_no_object_but_its_secret(api: MemoryApi, operator_key: bytes) -> None:
    """Pods and the router read it by reference (`secretKeyRef`); the router's `--api-key` is the
    `$(VAR)` Kubernetes expands from that reference. The operator's own status, events and configs
    never carry it, in plain text or base64."""
    settle(api)
    key = fleet_key(operator_key)
    encoded = base64.b64encode(key.encode()).decode()
    leaks = [k for k, o in api.store.items() if k[0] != "Secret" and (key in json.dumps(o) or encoded in json.dumps(o))]
    assert leaks == []
    reference = {"name": ENV_ENGINE_API_KEY,
                 "valueFrom": {"secretKeyRef": {"name": "fleet-engine-key", "key": enginekey.SECRET_KEY}}}
    pods = [o for (kind, _), o in api.store.items() if kind == "Pod"]
    assert pods and all(reference in p["spec"]["containers"][0]["env"] for p in pods)
    [deployment] = [o for (kind, _), o in api.store.items() if kind == "Deployment"]
    router = deployment["spec"]["template"]["spec"]["containers"][0]
    assert router["env"] == [reference]
    args = router["args"]
    assert args[args.index("--api-key") + 1] == f"$({ENV_ENGINE_API_KEY})"


def test_a_steady_fleet_does_not_rewrite_its_secret(api: MemoryApi) -> None:
    settle(api)
    before = api.writes[("apply", "Secret")]
    assert before >= 1
    rec.reconcile(api, NS, "fleet")
    assert api.writes[("apply", "Secret")] == before


def test_a_deleted_secret_comes_back_while_the_fleet_is_not_ready(api: MemoryApi) -> None:
    """A container restarted without its Secret cannot start (its env references it): the fleet is
    then not Ready, and the next pass writes the Secret again although it plans nothing else."""
    settle(api)
    del api.store[("Secret", "fleet-engine-key")]
    for obj in api.store.values():
        if obj.get("kind") == "Pod":
            obj["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    rec.reconcile(api, NS, "fleet")  # the status turns not Ready
    outcome = rec.reconcile(api, NS, "fleet")
    assert outcome.actions == [] and ("Secret", "fleet-engine-key") in api.store


def test_someone_elses_secret_of_that_name_is_not_taken_over(api: MemoryApi) -> None:
    api.store[("Secret", "fleet-engine-key")] = {"metadata": {"name": "fleet-engine-key"}, "data": {"x": "eQ=="}}
    outcome = rec.reconcile(api, NS, "fleet")
    assert outcome.error_reason == "NameTaken" and "Secret/fleet-engine-key" in outcome.errors[0]
    assert api.store[("Secret", "fleet-engine-key")]["data"] == {"x": "eQ=="}


@pytest.mark.parametrize("extra", [{"engine": {"extraArgs": ["--api-key", "mine"]}},
                                   {"engine": {"extraArgs": ["--admin-api-key=mine"]}}])
def test_a_key_of_the_fleet_owners_own_is_refused(extra: dict[str, Any]) -> None:
    from hybridserving.api.v1alpha1 import HybridServing

    spec = copy.deepcopy(SPEC) | extra
    hs = HybridServing.model_validate({"metadata": {"name": "f", "namespace": NS}, "spec": spec})
    issues = [i for i in layout.validate(hs.spec) if i.rule == "extra-args-rejected-flag"]
    assert issues and "Secret <name>-engine-key" in issues[0].fix


def test_the_key_variable_is_the_operators() -> None:
    from hybridserving.api.v1alpha1 import HybridServing

    spec = copy.deepcopy(SPEC) | {"engine": {"env": [{"name": ENV_ENGINE_API_KEY, "value": "mine"}]}}
    hs = HybridServing.model_validate({"metadata": {"name": "f", "namespace": NS}, "spec": spec})
    assert [i.path for i in layout.validate(hs.spec) if i.rule == "engine-env-owned"] == ["spec.engine.env[0]"]


@pytest.mark.parametrize("value", ["", "short"])
def test_the_operator_will_not_start_without_a_key_of_its_own(value: str) -> None:
    with pytest.raises(SystemExit, match="HYBRIDSERVING_OPERATOR_KEY must hold at least 32"):
        operator_main.operator_key({"HYBRIDSERVING_OPERATOR_KEY": value})
    assert operator_main.operator_key({"HYBRIDSERVING_OPERATOR_KEY": "x" * 32}) == b"x" * 32
