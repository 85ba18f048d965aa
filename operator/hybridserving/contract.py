"""What the operator and the engine pod's launcher agree on, in one place both sides import.

The operator renders pods and role configs (`core.rendering`, `core.flags`); the launcher in the
engine image reads them (`hybridserving_engine.launcher`); the controller reads engines the way
the launcher drains them. Names, paths, placeholders and the role-config keys live here so the two
sides cannot drift. The standard library only: the engine image carries no pydantic models or
operator code for it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Literal

ROLES = ("prefill", "decode")

# The SGLang release both sides are written against (engine/, docs/engine-contract.md).
SGLANG_VERSION = "0.5.23"


@cache
def _flag_table() -> dict[str, Any]:
    """`sglang_flags.json`, dumped from the pinned wheel's parser (`python -m support.sglang_parser
    --dump-flags` in tests/; a test keeps the file equal to the parser)."""
    table: dict[str, Any] = json.loads(resources.files("hybridserving").joinpath("sglang_flags.json").read_text())
    if table["sglang_version"] != SGLANG_VERSION:
        raise RuntimeError(f"sglang_flags.json is for SGLang {table['sglang_version']}, not {SGLANG_VERSION}")
    return table


def sglang_flags() -> dict[str, int | str | None]:
    """Every option of SGLang's `sglang serve` parser with its argparse nargs. The operator
    resolves `engine.extraArgs` against it and the SGLang simulator accepts exactly these flags,
    so both read this one table."""
    flags: dict[str, int | str | None] = _flag_table()["flags"]
    return flags


def sglang_flag_values() -> dict[str, dict[str, Any]]:
    """What SGLang's parser accepts as the value of each one-value option it checks: `choices`
    (strings) or `type` ("int" / "float"); from the same dump as `sglang_flags`."""
    values: dict[str, dict[str, Any]] = _flag_table()["values"]
    return values

# The router-facing role label of a leader pod, and the pod annotation the launcher reads (through a
# downward-API file) for its role; same key.
LABEL_ROLE = "hybridserving.io/role"
ANNOTATION_ROLE = "hybridserving.io/role"

CONFIG_DIR = "/etc/hybridserving/engine"
PODINFO_DIR = "/etc/hybridserving/podinfo"
ROLE_FILE = f"{PODINFO_DIR}/role"
# Beside the role file, from the same downward-API volume (so the two change together): the pod's
# `hybridserving.io/config-hash`, the template half and the role-flags half of the role it is
# annotated with. The launcher starts that role from `role_document_name(role, hash)`, which the
# operator keeps in the role's ConfigMap while any pod of the fleet runs it: a pod not rolled yet
# keeps its own flags across engine restarts while a rollout is under way or paused.
CONFIG_HASH_FILE_NAME = "config-hash"
HALF_HASH = 10
"""Characters of each half of a configHash (the template half, then the role-flags half)."""
ENGINE_COMMAND = ("hybridserving-engine",)

# Environment the operator sets on engine pods and the launcher reads.
ENV_CONFIG_DIR = "HYBRIDSERVING_CONFIG_DIR"
ENV_ROLE_FILE = "HYBRIDSERVING_ROLE_FILE"
ENV_NODE_RANK = "HYBRIDSERVING_NODE_RANK"
ENV_DRAIN_TIMEOUT_S = "HYBRIDSERVING_DRAIN_TIMEOUT_S"
ENV_LAUNCHER_PORT = "HYBRIDSERVING_LAUNCHER_PORT"
# The fleet's engine API key, from the Secret the operator writes (`core.enginekey`): the launcher
# passes it to SGLang as `--api-key` and sends it on its own calls; never in the rendered argv.
ENV_ENGINE_API_KEY = "HYBRIDSERVING_ENGINE_API_KEY"
# The node-cache fill step (init container `weights`) serves its download's progress here on the
# launcher port (ENV_LAUNCHER_PORT in its environment too), which the launcher takes only after it.
WEIGHTS_PROGRESS_PATH = "/weights"
ENV_PREFIX = "HYBRIDSERVING_"
"""`HYBRIDSERVING_<PLACEHOLDER>` carries the value of each placeholder below."""

# Whole-token placeholders of the per-role argv template, by the value that fills them.
PLACEHOLDERS: dict[str, str] = {
    "port": "{port}",
    "bootstrap_port": "{bootstrap_port}",
    "engine_info_bootstrap_port": "{engine_info_bootstrap_port}",
    "node_rank": "{node_rank}",
    "dist_init_addr": "{dist_init_addr}",
}


@dataclass(frozen=True)
class EnvSetting:
    """A setting the engine container reads from its environment (docs/engine.md, Environment).

    The launcher reads each with `read`, and the operator checks a fleet's `spec.engine.env`
    value with the same `read` at admission: a typo is refused with the fleet instead of
    crash-looping every engine pod of a rollout, or, for a choice, quietly meaning another one.
    """

    name: str
    default: str
    kind: Literal["seconds", "count", "choice"]
    minimum: float = 0.0
    """The smallest value taken; `positive` excludes it."""
    positive: bool = False
    choices: tuple[str, ...] = ()

    @property
    def expected(self) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        bound = f"{'above' if self.positive else 'at least'} {self.minimum:g}"
        return f"a number of seconds {bound}" if self.kind == "seconds" else f"a whole number {bound}"

    def read(self, raw: str | None) -> float | int | str:
        """The value `raw` (None: unset) stands for; ValueError naming the variable and what it takes."""
        text = self.default if raw is None else raw
        if self.kind == "choice":
            if text in self.choices:
                return text
            raise ValueError(f"{self.name}={text!r} is not {self.expected}")
        try:
            value: float | int = float(text) if self.kind == "seconds" else int(text)
        except ValueError:
            raise ValueError(f"{self.name}={text!r} is not {self.expected}") from None
        if not math.isfinite(value) or value < self.minimum or (self.positive and value == self.minimum):
            raise ValueError(f"{self.name}={text!r} is not {self.expected}")
        return value


ENV_SETTINGS: dict[str, EnvSetting] = {s.name: s for s in (
    EnvSetting("HYBRIDSERVING_ENGINE_BACKEND", "sglang", "choice", choices=("sglang", "simulator")),
    EnvSetting(ENV_DRAIN_TIMEOUT_S, "600", "seconds"),
    EnvSetting("HYBRIDSERVING_IDLE_WINDOW_S", "3", "seconds"),
    EnvSetting("HYBRIDSERVING_STOP_GRACE_S", "30", "seconds"),
    EnvSetting("HYBRIDSERVING_STARTUP_TIMEOUT_S", "3600", "seconds", positive=True),
    EnvSetting("HYBRIDSERVING_POLL_INTERVAL_S", "1", "seconds", positive=True),
    EnvSetting("HYBRIDSERVING_CONFIG_WAIT_S", "120", "seconds"),
    EnvSetting("HYBRIDSERVING_RESTART_BACKOFF_S", "2", "seconds"),
    EnvSetting("HYBRIDSERVING_RESTART_BACKOFF_MAX_S", "60", "seconds"),
    EnvSetting("HYBRIDSERVING_CRASH_LOOP_RESTARTS", "5", "count", minimum=1),
    EnvSetting("HYBRIDSERVING_CRASH_LOOP_EXIT", "1", "choice", choices=("1", "0")),
    EnvSetting("HYBRIDSERVING_HEALTH_RECHECK_S", "30", "seconds", positive=True),
    # SGLang's own, which the engine inherits: `int(os.getenv(...))` at import
    # (`entrypoints/http_server.py:218`), so "2.5" stops it from starting.
    EnvSetting("SGLANG_HEALTH_CHECK_TIMEOUT", "20", "count", minimum=1),
    EnvSetting("HYBRIDSERVING_PREFLIGHT", "enforce", "choice", choices=("enforce", "warn", "off")),
    EnvSetting("HYBRIDSERVING_PREFLIGHT_RDMA", "1", "choice", choices=("1", "0")),
)}


def role_document_name(role: str, flags_hash: str) -> str:
    """The ConfigMap key of the role document whose digest is `flags_hash` (a configHash's second half)."""
    return f"{role}-{flags_hash}.json"


# `<CONFIG_DIR>/<role>.json`: {"nnodes": N, "argv": [...]} or {"nnodes": N, "ranks": [[...], ...]},
# optionally "decode_cuda_graph_memory_gb" (sent with `POST /pd_role_switch` to decode).
ROLE_CONFIG_KEYS = frozenset({"nnodes", "argv", "ranks", "decode_cuda_graph_memory_gb"})


def bearer(api_key: str | None) -> dict[str, str]:
    """The header SGLang checks (`utils/auth.py:108-117`: `Authorization: Bearer <key>`); none without a key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def placeholder_env(name: str) -> str:
    """The pod environment variable that fills placeholder `name`."""
    return f"{ENV_PREFIX}{name.upper()}"


def fill_placeholders(template: Sequence[str], values: Mapping[str, str | int]) -> list[str]:
    """Replace every whole-token placeholder of `template` by its value.

    Whole tokens only, so a value containing braces (a JSON argument in extraArgs) is
    never touched; a placeholder without a value is an error rather than a literal
    `{port}` handed to the engine.
    """
    by_token = {token: name for name, token in PLACEHOLDERS.items()}
    argv: list[str] = []
    for token in template:
        name = by_token.get(token)
        if name is None:
            argv.append(token)
        elif name in values:
            argv.append(str(values[name]))
        else:
            raise ValueError(f"no value for placeholder {token} (give {name!r})")
    return argv


def inflight_requests(loads: Mapping[str, Any]) -> int:
    """Requests an engine still holds, from its `/v1/loads` answer (every queue, every DP rank):
    0 only when the engine is idle as SGLang's own `is_fully_idle` sees it
    (`managers/scheduler.py:5344-5374`: no running batch, no chunked request, empty waiting,
    grammar and PD queues).

    Every core field is in each entry (`managers/load_snapshot.py:233`); the sections are there only
    when asked for, so theirs default to 0. `num_waiting_reqs` already counts a prefill's bootstrap
    queue and a decode's prealloc, transfer and retracted queues
    (`managers/scheduler_components/load_inquirer.py:114-141`); a prefill's inflight queue (its KV
    still being sent) and the requests waiting for their grammar to compile (held outside the
    waiting queue until it is ready: `constrained/grammar_manager.py:206-207`,
    `managers/scheduler.py:3327-3329`) are counted apart (`load_inquirer.py:209-221`). Its
    `queues.paused` is not read: 0.5.23 never raises it (the reporter copies and resets a count
    nothing adds to, `metrics_reporter.py:875-876, 1102-1103`), and a request sent to a paused
    engine waits at the tokenizer, in no count (`managers/tokenizer_manager.py:938-939`); nothing
    here pauses an engine. The grammar
    count is the scheduler's metrics snapshot, taken at each batch's stats and at the latest every
    30 s while idle (`managers/scheduler_components/metrics_reporter.py:864, 1494-1519`; engine pods
    run `--enable-metrics`, without which it stays 0).

    A prompt in the middle of a chunked prefill is in none of them: the scheduler takes it out of
    the waiting queue and holds it as `chunked_req` until its last chunk (`managers/scheduler.py:
    4319-4327`), and the running batch gets it only after that. Its uncomputed tokens are the one
    trace of it, in `num_waiting_uncached_tokens` (`load_inquirer.py:104-106`), so a rank with such
    tokens holds at least one request even when every count is 0; without this a drain ends in the
    middle of a long prefill.
    """
    total = 0
    for load in loads.get("loads") or []:
        queues = load.get("queues") or {}
        held = int(load.get("num_running_reqs") or 0) + int(load.get("num_waiting_reqs") or 0)
        held += int((load.get("disaggregation") or {}).get("prefill_inflight_queue_reqs") or 0)
        held += int(queues.get("grammar") or 0)
        if int(load.get("num_waiting_uncached_tokens") or 0) > 0:
            held = max(held, 1)
        total += held
    return total


def expand_references(arg: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion of a container's command and args (`$$` escapes; unknown
    names stay as written): how the router's `--api-key $(HYBRIDSERVING_ENGINE_API_KEY)` gets the
    key from the Secret its env references. The local stand-ins for the kubelet use it."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), arg)
