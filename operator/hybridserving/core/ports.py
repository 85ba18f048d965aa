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

# First port of each series; block b adds b. The series are far enough apart that no two
# overlap for the 1024 instances an index can name (8998 + 1023 < 20000 etc.).
HTTP_BASE = 30000
DIST_INIT_BASE = 20000
ENGINE_INFO_BOOTSTRAP_BASE = 6789
LAUNCHER_BASE = 28000
MAX_BLOCKS = 1024


def block_ports(block: int, bootstrap_base: int) -> InstancePorts:
    """The ports of block `block`; the bootstrap series starts at the fleet's bootstrap port."""
    return InstancePorts(
        http=HTTP_BASE + block,
        bootstrap=bootstrap_base + block,
        dist_init=DIST_INIT_BASE + block,
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


def bootstrap_clash(bootstrap_base: int, *, host_network: bool) -> str | None:
    """Which allocated series a fleet's bootstrap run overlaps, or None when it is clear."""
    blocks = MAX_BLOCKS if host_network else 1
    span = range(bootstrap_base, bootstrap_base + blocks)
    for name, base in (("engine-info bootstrap ports", ENGINE_INFO_BOOTSTRAP_BASE),
                       ("dist-init ports", DIST_INIT_BASE),
                       ("launcher ports", LAUNCHER_BASE),
                       ("HTTP ports", HTTP_BASE)):
        if span.start < base + blocks and base < span.stop:
            return f"{name} ({base}..{base + blocks - 1})"
    if span.stop - 1 > 65535:
        return f"end of the port range (the run ends at {span.stop - 1})"
    return None


def block_of(ports: InstancePorts, bootstrap_base: int) -> int | None:
    """The block `ports` form, or None when they are not one block of this fleet's series."""
    block = ports.http - HTTP_BASE
    if 0 <= block < MAX_BLOCKS and ports == block_ports(block, bootstrap_base):
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
