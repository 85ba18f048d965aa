"""Engine ports of each instance: fixed in a pod network, one block per instance on the host network.

With its own network namespace every pod can use the engine's usual ports, so all instances
get block 0. On the host network, instances that land on one node would collide, and the
scheduler only keeps apart pods that *declare* the same host port; the operator therefore
gives every instance of a HybridServing its own block (declared as hostPorts, so instances
of different HybridServings that happen to share a block are never co-scheduled). A block is
kept in the instance's spec for the instance's whole life, so restarts and role switches
never move a port the router, the probes or the partner instances already know.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hybridserving.api.instance import InstancePorts

# First port of each series; block b adds b, or b x STRIDE for the two series SGLang derives
# more ports from. With attention DP, SGLang binds the 6 ports above the dist-init port, or
# above --port + 233 when an instance has no --dist-init-addr (server_args.py:818-874,
# ZMQ_TCP_PORT_DELTA at line 728). A stride of 8 keeps those inside their own block's gap
# (offsets 1..7 modulo 8), never on another block's port. The series are far enough apart that
# no two overlap for the 1024 instances an index can name.
STRIDE = 8
HTTP_BASE = 30000  # 30000 .. 38184 (+ derived up to 38429)
DIST_INIT_BASE = 12000  # 12000 .. 20184 (+ derived up to 20190)
ENGINE_INFO_BOOTSTRAP_BASE = 6789
LAUNCHER_BASE = 28000
MAX_BLOCKS = 1024
# server_args.py:818-874: ports SGLang derives for attention DP, relative to the base it uses.
ATTENTION_DP_DERIVED = range(1, 7)
ZMQ_TCP_PORT_DELTA = 233


def block_ports(block: int, bootstrap_base: int) -> InstancePorts:
    """The ports of block `block`; the bootstrap series starts at the fleet's bootstrap port."""
    return InstancePorts(
        http=HTTP_BASE + STRIDE * block,
        bootstrap=bootstrap_base + block,
        dist_init=DIST_INIT_BASE + STRIDE * block,
        engine_info_bootstrap=ENGINE_INFO_BOOTSTRAP_BASE + block,
        launcher=LAUNCHER_BASE + block,
    )


def bootstrap_span(*, host_network: bool) -> tuple[tuple[int, int], tuple[int, int] | None]:
    """The ranges a fleet's first bootstrap port may take: below the other series, or between them.

    Bootstrap ports run from the fleet's base up one per block, so the whole run must miss
    every other series' run; on the pod network there is one block only.
    """
    blocks = MAX_BLOCKS if host_network else 1
    low = (1024, ENGINE_INFO_BOOTSTRAP_BASE - blocks)
    middle = (ENGINE_INFO_BOOTSTRAP_BASE + blocks, DIST_INIT_BASE - blocks)
    return low, middle


def _allocated_series(blocks: int) -> tuple[tuple[str, int, int], ...]:
    """Each allocated series as (name, first, last port), derived attention-DP ports included."""
    strided_last = STRIDE * (blocks - 1)
    return (
        ("engine-info bootstrap ports", ENGINE_INFO_BOOTSTRAP_BASE, ENGINE_INFO_BOOTSTRAP_BASE + blocks - 1),
        ("dist-init ports", DIST_INIT_BASE, DIST_INIT_BASE + strided_last + ATTENTION_DP_DERIVED[-1]),
        ("launcher ports", LAUNCHER_BASE, LAUNCHER_BASE + blocks - 1),
        ("HTTP ports", HTTP_BASE, HTTP_BASE + strided_last + ZMQ_TCP_PORT_DELTA + ATTENTION_DP_DERIVED[-1]),
    )


def bootstrap_clash(bootstrap_base: int, *, host_network: bool) -> str | None:
    """Which allocated series a fleet's bootstrap run overlaps, or None when it is clear."""
    blocks = MAX_BLOCKS if host_network else 1
    span = range(bootstrap_base, bootstrap_base + blocks)
    for name, first, last in _allocated_series(blocks):
        if span.start <= last and first < span.stop:
            return f"{name} ({first}..{last})"
    if span.stop - 1 > 65535:
        return f"end of the port range (the run ends at {span.stop - 1})"
    return None


def block_of(ports: InstancePorts, bootstrap_base: int) -> int | None:
    """The block `ports` form, or None when they are not one block of this fleet's series."""
    block, rest = divmod(ports.http - HTTP_BASE, STRIDE)
    if rest == 0 and 0 <= block < MAX_BLOCKS and ports == block_ports(block, bootstrap_base):
        return block
    return None


def allocate(
    names: Iterable[str],
    held: Mapping[str, InstancePorts],
    *,
    host_network: bool,
    bootstrap_base: int,
    reserved: Iterable[InstancePorts] = (),
) -> dict[str, InstancePorts]:
    """Ports for every instance in `names` (in order), keeping each block an instance already holds.

    `held` maps instance names to the ports their objects carry. On the host network a new
    instance (or one whose ports are not a block of this fleet, or collide with an earlier
    one's) gets the lowest block nobody keeps; in a pod network everyone gets block 0.
    `reserved` are ports of instances on their way out: their pods may still hold them.
    """
    names = list(names)
    if not host_network:
        return {name: block_ports(0, bootstrap_base) for name in names}
    kept: dict[str, int] = {}
    taken = {b for b in (block_of(p, bootstrap_base) for p in reserved) if b is not None}
    for name in names:
        ports = held.get(name)
        block = None if ports is None else block_of(ports, bootstrap_base)
        if block is not None and block not in taken:
            kept[name] = block
            taken.add(block)
    result: dict[str, InstancePorts] = {}
    free = (b for b in range(MAX_BLOCKS) if b not in taken)
    for name in names:
        block = kept[name] if name in kept else next(free)
        result[name] = block_ports(block, bootstrap_base)
    return result


def attention_dp_ports(ports: InstancePorts, *, multi_node: bool) -> set[int]:
    """The ports an attention-DP engine binds besides its declared ones: above the dist-init port
    on multi-node instances, above --port + 233 on one node (server_args.py:818-874)."""
    base = ports.dist_init if multi_node else ports.http + ZMQ_TCP_PORT_DELTA
    return {base + offset for offset in ATTENTION_DP_DERIVED}
