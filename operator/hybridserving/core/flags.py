"""Engine flags: the exact SGLang 0.5.23 argv for one role of a HybridServing.

One function renders every flag, so the pods, the ConfigMap and the tests that feed the
argv to SGLang's real parser all see the same command line. Only full flag names are
rendered: `--tp` and `--dp` parse only through argparse's prefix abbreviation, which a
new flag can make ambiguous at any release. Flags whose default already says what the
spec says are left out, so that the argv reads as the layout's differences from plain TP.

Values that differ per instance or per pod (ports allocated under host networking, the
node rank, the leader's address) are placeholders in the per-role template (`render_template`,
which the ConfigMap carries: `rendering.role_config`), filled by whole-token substitution
(`fill_placeholders`) in the pod; `render_argv` is that template filled with an instance's
ports, so what `plan` prints is what the pods run.
"""

from __future__ import annotations

import json

from hybridserving.api.instance import InstancePorts
from hybridserving.api.v1alpha1 import HybridServingSpec, Role
from hybridserving.contract import PLACEHOLDERS, fill_placeholders
from hybridserving.core import weights
from hybridserving.core.layout import role_switch_capability
from hybridserving.core.ports import block_ports


def default_ports(spec: HybridServingSpec) -> InstancePorts:
    """The ports of an instance on the pod network: the first block (`ports.block_ports`), which
    every such instance gets, its bootstrap port the spec's."""
    return block_ports(0, spec.transfer.bootstrap_port)


def keeps_radix_cache(spec: HybridServingSpec, role: Role) -> bool:
    """Whether the role's engines run a radix (prefix) cache, which also sizes a hybrid model's state pool.

    Decode servers run without one unless told (arg_groups/pd_disaggregation_hook.py:97-127); only
    prefill has one to turn off. An engine keeps the radix-cache setting of the role it was born with
    across in-place switches (managers/scheduler.py:614 reads it once; disaggregation/role_switch.py:
    282-294 only resets the tree), so a decode-born instance would serve prefill without a prefix
    cache: switching fleets start decode with it.
    """
    if role == "prefill":
        return spec.prefill.prefix_caching
    return in_place_role_switch(spec) and spec.prefill.prefix_caching


def in_place_role_switch(spec: HybridServingSpec) -> bool:
    """Whether the engines start with `--enable-pd-role-switch`.

    Only when role switch is on and possible in place: SGLang refuses the flag with the
    layouts that cannot switch in place, and it makes every instance start a bootstrap
    server, which is wasted where switches relaunch the engine.
    """
    return spec.role_switch.enabled and role_switch_capability(spec)[0]


def render_ib_device(spec: HybridServingSpec) -> str | None:
    """The value of --disaggregation-ib-device, or None to let the engine detect devices.

    A plain list lets every GPU's transfer engine open every device, so traffic of a GPU can
    cross the PCIe switch to a NIC under another GPU; with ibDevicesPerGpu each GPU gets the
    devices next to it, in the JSON map SGLang's Mooncake and NIXL backends read per GPU id.
    """
    devices = spec.transfer.ib_devices
    if not devices:
        return None
    per_gpu = spec.transfer.ib_devices_per_gpu
    if per_gpu is None:
        return ",".join(devices)
    groups = {str(gpu): ",".join(devices[gpu * per_gpu:(gpu + 1) * per_gpu])
              for gpu in range(len(devices) // per_gpu)}
    return json.dumps(groups, separators=(",", ":"))


def render_template(spec: HybridServingSpec, role: Role) -> list[str]:
    """The argv of one role with PLACEHOLDERS for the per-instance and per-pod values."""
    rs = spec.role(role)
    layout = rs.layout
    argv = ["--model-path", weights.engine_model_path(spec), *weights.engine_args(spec)]
    if served := weights.served_model_name(spec):
        argv += ["--served-model-name", served]
    argv += ["--host", "0.0.0.0", "--port", PLACEHOLDERS["port"]]

    argv += ["--tp-size", str(layout.tp)]
    if layout.pp > 1:
        argv += ["--pp-size", str(layout.pp)]
    if layout.attn_dp > 1:
        argv += ["--attn-dp-size", str(layout.attn_dp)]
    if layout.attn_cp > 1:
        argv += ["--enable-prefill-cp", "--attn-cp-size", str(layout.attn_cp)]
        if layout.cp_strategy is not None:
            argv += ["--cp-strategy", layout.cp_strategy]
    if layout.layer_split:
        argv += ["--enable-dsa-cache-layer-split"]
    if layout.dcp > 1:
        argv += ["--dcp-size", str(layout.dcp)]
    if layout.dcp_comm_backend is not None:
        argv += ["--dcp-comm-backend", layout.dcp_comm_backend]
    if layout.replicate_q_proj is not None and layout.dcp > 1:
        # BooleanOptional: an explicit "no" overrides the DSA default of replicating under a2a.
        argv += ["--dcp-replicate-q-proj" if layout.replicate_q_proj else "--no-dcp-replicate-q-proj"]
    if layout.ep > 1:
        argv += ["--ep-size", str(layout.ep)]
    if layout.moe_a2a_backend is not None:
        argv += ["--moe-a2a-backend", layout.moe_a2a_backend]

    if rs.nodes_per_instance > 1:
        argv += [
            "--nnodes", str(rs.nodes_per_instance),
            "--node-rank", PLACEHOLDERS["node_rank"],
            "--dist-init-addr", PLACEHOLDERS["dist_init_addr"],
        ]

    argv += [
        "--disaggregation-mode", role,
        "--disaggregation-transfer-backend", spec.transfer.backend,
        "--disaggregation-bootstrap-port", PLACEHOLDERS["bootstrap_port"],
    ]
    ib_device = render_ib_device(spec)
    if ib_device is not None:
        argv += ["--disaggregation-ib-device", ib_device]
    argv += ["--engine-info-bootstrap-port", PLACEHOLDERS["engine_info_bootstrap_port"]]
    if in_place_role_switch(spec):
        argv += ["--enable-pd-role-switch"]
    argv += ["--enable-metrics"]

    speculative = rs.speculative
    if speculative is not None:
        argv += ["--speculative-algorithm", speculative.algorithm]
        if speculative.draft_model_path:
            argv += ["--speculative-draft-model-path", speculative.draft_model_path]
        for flag, value in (
            ("--speculative-num-steps", speculative.num_steps),
            ("--speculative-eagle-topk", speculative.eagle_topk),
            ("--speculative-num-draft-tokens", speculative.num_draft_tokens),
        ):
            if value is not None:
                argv += [flag, str(value)]

    if rs.mem_fraction_static is not None:
        argv += ["--mem-fraction-static", repr(rs.mem_fraction_static)]
    if rs.max_running_requests is not None:
        argv += ["--max-running-requests", str(rs.max_running_requests)]
    if rs.page_size is not None:
        argv += ["--page-size", str(rs.page_size)]
    argv += ["--kv-cache-dtype", rs.kv_cache_dtype]
    if role == "prefill" and not rs.prefix_caching:
        argv += ["--disable-radix-cache"]
    if role == "decode" and keeps_radix_cache(spec, role):
        argv += ["--disaggregation-decode-enable-radix-cache"]

    return argv + list(spec.engine.extra_args)


def render_argv(
    spec: HybridServingSpec,
    role: Role,
    *,
    node_rank: int = 0,
    dist_init_addr: str | None = None,
    ports: InstancePorts | None = None,
) -> list[str]:
    """The argv after `python3 -m sglang.launch_server` for one pod of one instance.

    `dist_init_addr` is the leader pod's host (name or IP); the port comes from
    `ports.dist_init`. Multi-node instances need it on every rank, the leader included.
    """
    nodes = spec.role(role).nodes_per_instance
    if not 0 <= node_rank < nodes:
        raise ValueError(f"node_rank {node_rank} outside 0..{nodes - 1} for {role} instances of {nodes} node(s)")
    if nodes > 1 and not dist_init_addr:
        raise ValueError(f"{role} instances span {nodes} nodes: give dist_init_addr, the leader pod's host")
    given = ports or default_ports(spec)
    values: dict[str, str | int] = {
        "port": given.http,
        "bootstrap_port": given.bootstrap,
        "engine_info_bootstrap_port": given.engine_info_bootstrap,
        "node_rank": node_rank,
    }
    if dist_init_addr:
        values["dist_init_addr"] = f"{dist_init_addr}:{given.dist_init}"
    return fill_placeholders(render_template(spec, role), values)
