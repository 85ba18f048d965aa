"""HybridServingInstance, v1alpha1: one engine instance whose identity survives role changes.

A HybridServing owns one instance per engine (prefill or decode). The role-switch controller
moves an instance between roles by editing `spec.role` rather than deleting and recreating it,
so its name, index, ports and pods stay put and the router sees one endpoint change role.
Pods of the instance (a leader and its workers) are created by the operator from this object.
"""

from __future__ import annotations

from itertools import combinations
from typing import Annotated, Literal

from pydantic import AwareDatetime, ConfigDict, Field, model_validator

from hybridserving.api.base import ApiModel, Format, cel
from hybridserving.api.v1alpha1 import TIME_MAX_LENGTH, Condition, ObjectMeta, Role

InstancePhase = Literal[
    "Pending", "Starting", "Stalled", "Ready", "Unready", "Blocked", "CrashLoop", "Draining", "Switching",
    "Relaunching", "Failed",
]

Port = Annotated[int, Field(ge=1024, le=65535)]

# What `core` hashes a configuration into: short enough to be a label value.
CONFIG_HASH = Format("^[a-z0-9]+$", "a configuration hash", "lowercase letters and digits, e.g. 5f3a9c")

# A pod or node name (DNS subdomain).
ObjectName = Annotated[str, Field(max_length=253)]


class InstancePorts(ApiModel):
    """Ports the operator allocated; distinct per node when instances share a host network."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    " && ".join(
                        f"self.{a} != self.{b}"
                        for a, b in combinations(
                            ("http", "bootstrap", "distInit", "engineInfoBootstrap", "launcher"), 2
                        )
                    ),
                    "http, bootstrap, distInit, engineInfoBootstrap and launcher must be five distinct ports",
                )
            ]
        }
    )

    http: Port = Field(description="Engine HTTP server (--port); the router and probes use it.")
    bootstrap: Port = Field(
        description="KV-transfer bootstrap server (--disaggregation-bootstrap-port); decode "
        "instances reach prefill through it."
    )
    dist_init: Port = Field(description="torch.distributed rendezvous of the instance's pods (--dist-init-addr port).")
    engine_info_bootstrap: Port = Field(
        description="Port on which the leader publishes the engine's rank layout to its workers."
    )
    launcher: Port = Field(
        default=8080,
        description="The launcher's own endpoint (health, metrics, switch steps); the role-switch "
        "controller follows a switch there.",
    )

    @model_validator(mode="after")
    def _ports_are_distinct(self) -> InstancePorts:
        # The same rule as the CEL above, so the operator never writes what admission rejects.
        ports = (self.http, self.bootstrap, self.dist_init, self.engine_info_bootstrap, self.launcher)
        if len(set(ports)) != len(ports):
            raise ValueError("http, bootstrap, distInit, engineInfoBootstrap and launcher must be five distinct ports")
        return self


class HybridServingInstanceSpec(ApiModel):
    """What the instance's pods should run; the operator writes it from its fleet's plan, the
    role-switch controller changes its role."""

    role: Role = Field(
        description="Role the instance should serve; the role-switch controller changes it and "
        "the instance drains and switches (in place or by relaunch) to follow."
    )
    index: int = Field(
        ge=0,
        le=1023,
        description="Position of the instance in its HybridServing; part of its identity, so it never changes.",
        json_schema_extra={"x-kubernetes-validations": [cel("self == oldSelf", "index is immutable")]},
    )
    nodes: int = Field(ge=1, le=64, description="Pods (one per node) the instance spans: a leader and nodes-1 workers.")
    config_hash: Annotated[str, Field(min_length=1, max_length=63), CONFIG_HASH] = Field(
        description="Hash of the rendered engine configuration the pods should run; pods running "
        "another hash are rolled. Short enough to be a label value.",
    )
    ports: InstancePorts
    restart_generation: int = Field(
        default=0,
        ge=0,
        description="Bump to restart the whole gang (all pods of the instance) once.",
        json_schema_extra={"x-kubernetes-validations": [cel("self >= oldSelf", "restartGeneration may only increase")]},
    )


class HybridServingInstanceStatus(ApiModel):
    """What the operator observed of the instance's pods; lastSwitch, and phase during a switch,
    are the role-switch controller's."""

    phase: InstancePhase = Field(
        default="Pending",
        description="Pending (pods not scheduled), Starting (engine loading), Stalled (starting, and a pod has "
        "waited past its grace: on its schedulingGates for more than 2 minutes, for the scheduler its schedulerName "
        "names to try it for more than 3, or for its containers to be created for more than 10; the Ready condition "
        "names the pod and why), Ready (serving), "
        "Unready (the engine was ready and stopped answering its readiness probe: hung or overloaded), "
        "Blocked (a container cannot be created: image pull, missing Secret or ConfigMap; see the Ready "
        "condition), CrashLoop (an engine container keeps exiting: it waits in CrashLoopBackOff, or restarted within "
        "the last 10 minutes and is not Ready yet; see lastExit), "
        "Draining (finishing requests before a switch or restart), Switching (in-place role "
        "switch), Relaunching (restart with the other role's flags), Failed.",
    )
    role: Role | None = Field(
        default=None,
        description="Role the engine currently runs; differs from spec.role while a switch is in progress.",
    )
    ready_pods: int = Field(default=0, ge=0, le=64, description="Pods of the instance whose engine is ready.")
    restarts: int = Field(
        default=0,
        ge=0,
        description="restarts: container restarts of the instance's current pods, as the kubelet counts them.",
    )
    last_exit: str | None = Field(
        default=None,
        max_length=1024,
        description="lastExit: how an engine container of the instance last ended (exit code, reason, its last "
        "message line); set once a container has restarted.",
    )
    pod_names: list[ObjectName] = Field(
        default_factory=list, max_length=64, description="Pods of the instance, leader first."
    )
    node_names: list[ObjectName] = Field(
        default_factory=list, max_length=64, description="Nodes the pods run on, in pod order."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=32,
        description="Ready: True while the instance serves (`kubectl wait --for=condition=Ready`); its message says "
        "what it waits for otherwise.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(
        default=None, description="metadata.generation of the spec this status describes."
    )
    last_switch: AwareDatetime | None = Field(
        default=None, description="When the last role switch finished.",
        json_schema_extra={"maxLength": TIME_MAX_LENGTH})


class HybridServingInstance(ApiModel):
    """One engine instance (a gang of pods) of a HybridServing; owned and managed by the operator."""

    api_version: Literal["hybridserving.io/v1alpha1"] = "hybridserving.io/v1alpha1"
    kind: Literal["HybridServingInstance"] = "HybridServingInstance"
    metadata: ObjectMeta
    spec: HybridServingInstanceSpec
    status: HybridServingInstanceStatus | None = None
