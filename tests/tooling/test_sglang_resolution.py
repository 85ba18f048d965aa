"""The operator's mirror of SGLang's start-up resolution agrees with the wheel's own resolution.

`core/resolution.py` is hand-written; here SGLang 0.5.23's `prepare_server_args`, `resolve_once()`
and `check_server_args()` run on CPU (`support.sglang_resolver`) over what the operator renders:
every example fleet on its declared GPU, and every built-in profile under its typical layouts on
an H200 (Hopper) and a B200 (Blackwell), both roles. Each resolved value the mirror claims is
compared field by field; where the wheel refuses an argv, the operator's layout rules must refuse
the same role for the same reason. A difference is either fixed in the mirror or named below with
its source line and why it stays.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping

import pytest

from hybridserving.api.profiles import PROFILES
from hybridserving.api.v1alpha1 import GPU_TYPES, ROLES, HybridServingSpec, Role
from hybridserving.core import resolution
from hybridserving.core.flags import keeps_radix_cache, render_argv
from hybridserving.core.layout import LayoutIssue, errors, validate
from support.patches import overlaid
from support.sglang_fleets import LEADER, PORTS, TYPICAL, example_specs
from support.sglang_parser import SGLangParserUnavailable
from support.sglang_resolver import GPUS, Refused, Resolved, resolution_python, resolve_many, with_model

MATRIX_GPUS = ("H200", "B200")
# Typical layouts plus the stock-engine variant of DSA decode context parallelism, which the
# operator refuses without the dsa-dcp-pd capability: the wheel must refuse it as well.
LAYOUTS = {**TYPICAL, "dcp-decode-dsa-stock": {"decode": {"layout": {"dcp": 8, "replicateQProj": False}}}}
# Speculative settings the wheel resolves or refuses: the draft shape left to the engine, given in
# part, drafted as a tree, and the algorithms that exclude attention DP.
_DECODE_CAP = {"maxRunningRequests": 128}
LAYOUTS |= {
    "speculative-auto": {"prefill": {"speculative": {"algorithm": "NEXTN"}},
                         "decode": {"speculative": {"algorithm": "EAGLE"}, **_DECODE_CAP}},
    "speculative-steps-only": {"decode": {"speculative": {"algorithm": "EAGLE", "numSteps": 3}, **_DECODE_CAP}},
    "speculative-no-steps": {"decode": {"speculative": {"algorithm": "EAGLE", "eagleTopk": 1, "numDraftTokens": 4},
                                        **_DECODE_CAP}},
    "speculative-tree": {"decode": {"speculative": {"algorithm": "EAGLE", "numSteps": 3, "eagleTopk": 4,
                                                    "numDraftTokens": 8}, **_DECODE_CAP}},
    "speculative-chain-draft-tokens": {"decode": {"speculative": {"algorithm": "EAGLE", "numSteps": 3, "eagleTopk": 1,
                                                                  "numDraftTokens": 8}, **_DECODE_CAP}},
    "speculative-attn-dp": {"decode": {"layout": {"attnDp": 8}, **_DECODE_CAP,
                                       "speculative": {"algorithm": "EAGLE", "numSteps": 2, "eagleTopk": 1,
                                                       "numDraftTokens": 3}}},
    "ngram": {"decode": {"speculative": {"algorithm": "NGRAM"}}},
    "ngram-chain": {"engine": {"extraArgs": ["--speculative-ngram-max-bfs=1"]},
                    "decode": {"speculative": {"algorithm": "NGRAM"}}},
    "ngram-attn-dp": {"engine": {"extraArgs": ["--speculative-ngram-max-bfs-breadth", "1"]},
                      "decode": {"layout": {"attnDp": 8}, "speculative": {"algorithm": "NGRAM"}}},
    "a2a-flashinfer-tp": {"decode": {"layout": {"ep": 8, "moeA2aBackend": "flashinfer"}}},
    "a2a-flashinfer": {"decode": {"layout": {"ep": 8, "attnDp": 8, "moeA2aBackend": "flashinfer"}}},
    "a2a-mori": {"prefill": {"layout": {"ep": 8, "moeA2aBackend": "mori"}}},
    "a2a-mori-attn-dp": {"prefill": {"layout": {"ep": 8, "attnDp": 8, "moeA2aBackend": "mori"}}},
    "kv-e5m2": {"prefill": {"kvCacheDtype": "fp8_e5m2"}, "decode": {"kvCacheDtype": "fp8_e5m2"}},
    "kv-auto": {"prefill": {"kvCacheDtype": "auto"}, "decode": {"kvCacheDtype": "auto"}},
    "kv-bf16": {"prefill": {"kvCacheDtype": "bf16"}, "decode": {"kvCacheDtype": "bf16"}},
    "standalone-attn-dp": {"decode": {"layout": {"attnDp": 8}, **_DECODE_CAP,
                                      "speculative": {"algorithm": "STANDALONE", "draftModelPath": "org/draft"}}},
}

# Layout rules that stand for a refusal of the engine at start-up: the role the issue's path
# names must be refused by the wheel with an error ("Type: message") this pattern finds.
REFUSALS = {
    # arg_groups/overrides.py:1204-1213 (trtllm_mla), 1233-1246 (cutedsl_mla)
    "gpu-architecture-supported": "only supported on Blackwell GPUs",
    # arg_groups/model_overrides/deepseek_v2.py:18-24
    "dsa-dcp-in-pd": "DSA DCP does not support PD disaggregation",
    # arg_groups/speculative_hook.py:1159-1163 (a bare assert), 1273-1277 (`None > 1`)
    "speculative-params-together": r"^AssertionError: $|^TypeError: '>' not supported between instances of 'NoneType'",
    # arg_groups/speculative_hook.py:1268-1283 (EAGLE family), 1355-1365 (NGRAM)
    "speculative-tree-page-size": r"speculative_eagle_topk(\(\d+\))? > 1 with page_size",
    # arg_groups/moe_hook.py:471-486, 530-541, 563-573
    "moe-a2a-flashinfer-topology": "Flashinfer MoE A2A requires --attn-dp-size equal to --tp-size",
    "moe-a2a-flashinfer-runner": "FlashInfer MoE A2A is supported with",
    "moe-a2a-mori-dispatch": "SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK",
    # arg_groups/overrides.py:541-544 (DSA), 1203-1217 (trtllm_mla), 1247-1255 (cutedsl_mla)
    "kv-dtype-supported": r"DeepSeek DSA only supports bf16/bfloat16 or fp8_e4m3"
                          r"|MLA backend only supports kv-cache-dtype",
    # arg_groups/speculative_hook.py:1078-1084, 1366-1370
    "speculative-attn-dp": "(standalone|ngram) speculative decoding does not support dp attention",
}
# Decode refuses a prefill with another page size at bootstrap (disaggregation/common/conn.py:1320-1334):
# not a start-up refusal, checked across the two roles' resolved values instead.
CROSS_ROLE_RULES = {"roles-page-size-agree"}

# The mirror's fields and the wheel's names for them.
FIELDS = {
    "chunked_prefill_size": "chunked_prefill_size",
    "decode_cuda_graph_max_bs": "cuda_graph_decode_max_bs",
    "mem_fraction_static": "mem_fraction_static",
    "max_running_requests": "max_running_requests",
    "page_size": "page_size",
    "kv_cache_dtype": "kv_cache_dtype",
    "prefill_attention_backend": "prefill_attention_backend",
    "decode_attention_backend": "decode_attention_backend",
    "attention_backend": "attention_backend",
    "dsa_prefill_backend": "dsa_prefill_backend",
    "dsa_decode_backend": "dsa_decode_backend",
    "draft_tree_width": "speculative_eagle_topk",
    "draft_tokens": "speculative_num_draft_tokens",
    "disable_radix_cache": "disable_radix_cache",
}


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    gpu: str
    role: Role
    spec: HybridServingSpec

    @property
    def id(self) -> str:
        return f"{self.name}@{self.gpu}-{self.role}"


@dataclasses.dataclass(frozen=True)
class Difference:
    """A named, expected difference between the wheel and the mirror."""

    name: str
    source: str
    why: str
    applies: Callable[[Case], bool]
    fields: frozenset[str] = frozenset()
    """Mirror fields that may differ; empty: the wheel refuses the argv."""
    refusal: str = ""


def _dsa_dcp_with_capability(case: Case) -> bool:
    layout = case.spec.role(case.role).layout
    return (case.role == "decode" and case.spec.architecture().is_dsa and layout.dcp > 1
            and "dsa-dcp-pd" in case.spec.engine.capabilities)


DIFFERENCES = [
    Difference(
        name="extra-args-not-mirrored",
        source="core/resolution.py (scope); engine.extraArgs are rendered verbatim by core/flags.py",
        why="the mirror resolves the flags the spec owns; a free flag such as --cuda-graph-max-bs-decode "
            "in engine.extraArgs changes the engine's value but not the operator's model of it",
        applies=lambda case: "--cuda-graph-max-bs-decode" in case.spec.engine.extra_args,
        fields=frozenset({"decode_cuda_graph_max_bs"}),
    ),
    Difference(
        name="dsa-dcp-pd-capability",
        source="sglang/srt/arg_groups/model_overrides/deepseek_v2.py:18-24",
        why="engine.capabilities [dsa-dcp-pd] declares an engine build that serves DSA decode context "
            "parallelism in PD mode; the stock 0.5.23 wheel refuses it, which is why the operator asks "
            "for the capability (rule dsa-dcp-in-pd)",
        applies=_dsa_dcp_with_capability,
        refusal="DSA DCP does not support PD disaggregation",
    ),
]


def _matrix() -> list[Case]:
    cases = []
    for profile in sorted(PROFILES):
        for layout, patch in LAYOUTS.items():
            for gpu in MATRIX_GPUS:
                base = {
                    "model": {"path": f"org/{profile}", "profile": profile},
                    "hardware": {"gpuType": gpu},
                    "prefill": {"replicas": 1, "layout": {"tp": 8}},
                    "decode": {"replicas": 1, "layout": {"tp": 8}},
                }
                spec = HybridServingSpec.model_validate(overlaid(base, patch))
                rules = {issue.rule for issue in errors(validate(spec))}
                if rules <= set(REFUSALS) | CROSS_ROLE_RULES:
                    cases += [Case(f"{profile}/{layout}", gpu, role, spec) for role in ROLES]
    return cases


def _examples() -> list[Case]:
    return [Case(name, spec.hardware.gpu_type or "H200", role, spec)
            for name, spec in example_specs().items() for role in ROLES]


CASES = _examples() + _matrix()


@pytest.fixture(scope="module")
def resolved() -> dict[str, Resolved | Refused]:
    """Every case resolved by the wheel, one subprocess per GPU model."""
    try:
        resolution_python()
    except SGLangParserUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    out: dict[str, Resolved | Refused] = {}
    for gpu in sorted({case.gpu for case in CASES}):
        batch = [case for case in CASES if case.gpu == gpu]
        out.update(zip([c.id for c in batch], resolve_many(map(_argv, batch), GPUS[gpu]), strict=True))
    return out


def _argv(case: Case) -> list[str]:
    return with_model(render_argv(case.spec, case.role, node_rank=0, dist_init_addr=LEADER, ports=PORTS),
                      case.spec.model.profile or "")


def _refusing_issues(case: Case) -> list[LayoutIssue]:
    return [issue for issue in errors(validate(case.spec))
            if issue.rule in REFUSALS and issue.path.split(".")[1] == case.role]


def _difference(case: Case) -> Difference | None:
    matches = [d for d in DIFFERENCES if d.applies(case)]
    assert len(matches) <= 1, [d.name for d in matches]
    return matches[0] if matches else None


def _mirror(case: Case) -> dict[str, object]:
    return {**resolution.resolve(case.spec, case.role).to_dict(),
            "draft_tree_width": resolution.draft_tree_width(case.spec, case.role),
            "draft_tokens": resolution.role_draft_tokens(case.spec, case.role),
            # The radix cache also sizes a hybrid model's state pool (core.capacity.state_slots).
            "disable_radix_cache": not keeps_radix_cache(case.spec, case.role)}


def _refused_as(result: Refused, rule: str) -> bool:
    return re.search(REFUSALS[rule], f"{result.type}: {result.message}") is not None


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_the_mirror_resolves_as_the_wheel(resolved: Mapping[str, Resolved | Refused], case: Case) -> None:
    result = resolved[case.id]
    difference = _difference(case)
    if difference is not None and difference.refusal:
        assert isinstance(result, Refused) and difference.refusal in result.message, (difference.name, result)
        return
    refusing = _refusing_issues(case)
    if refusing:
        assert isinstance(result, Refused), f"the operator refuses ({refusing[0].message}) but the wheel resolves"
        assert any(_refused_as(result, issue.rule) for issue in refusing), (result, refusing)
        return
    assert isinstance(result, Resolved), f"the wheel refuses what the operator accepts: {result}"
    mirror = _mirror(case)
    allowed = difference.fields if difference else frozenset()
    assert set(mirror) == set(FIELDS)
    got = {field: result[wheel] for field, wheel in FIELDS.items() if field not in allowed}
    want = {field: mirror[field] for field in FIELDS if field not in allowed}
    assert got == want, {k: (want[k], got[k]) for k in want if want[k] != got[k]}
    for field in allowed:
        assert result[FIELDS[field]] != mirror[field], f"{difference.name} no longer differs in {field}"


def test_the_roles_page_size_rule_is_the_wheels(resolved: Mapping[str, Resolved | Refused]) -> None:
    """roles-page-size-agree fires exactly where the wheel resolves the two roles to other page sizes."""
    checked = 0
    fleets = {(case.name, case.gpu): case.spec for case in CASES}
    for (name, gpu), spec in fleets.items():
        prefill, decode = resolved[f"{name}@{gpu}-prefill"], resolved[f"{name}@{gpu}-decode"]
        if not (isinstance(prefill, Resolved) and isinstance(decode, Resolved)):
            continue
        fires = any(issue.rule == "roles-page-size-agree" for issue in validate(spec))
        assert fires == (prefill["page_size"] != decode["page_size"]), (name, gpu)
        checked += 1
    assert checked > 100


def test_the_chain_draft_tokens_warning_is_the_wheels(resolved: Mapping[str, Resolved | Refused]) -> None:
    """speculative-chain-draft-tokens warns exactly where the wheel rewrites numDraftTokens
    (arg_groups/speculative_hook.py:1255-1266 logs it)."""
    fired = 0
    for case in CASES:
        result = resolved[case.id]
        if not isinstance(result, Resolved):
            continue
        warns = any(issue.rule == "speculative-chain-draft-tokens" and issue.path.split(".")[1] == case.role
                    for issue in validate(case.spec))
        rewrites = any("speculative_num_draft_tokens is adjusted" in line for line in result.warnings)
        assert warns == rewrites, case.id
        fired += warns
    assert fired >= 2 * len(MATRIX_GPUS)


def test_every_named_difference_is_observed_and_the_matrix_covers_refusals(
        resolved: Mapping[str, Resolved | Refused]) -> None:
    """A named difference that no case shows any more is stale; each refusal rule has a case."""
    for difference in DIFFERENCES:
        assert any(difference.applies(case) for case in CASES), difference.name
    refused_rules = {issue.rule for case in CASES for issue in _refusing_issues(case)
                     if isinstance(resolved[case.id], Refused)}
    assert refused_rules == set(REFUSALS)
    # Kimi K3 with DCP: refused on Hopper by both, resolved on Blackwell by both.
    assert isinstance(resolved["kimi-k3/dcp-decode@H200-decode"], Refused)
    assert resolved["kimi-k3/dcp-decode@B200-decode"]["decode_attention_backend"] == "cutedsl_mla"


def test_a_result_does_not_depend_on_the_rest_of_the_batch(resolved: Mapping[str, Resolved | Refused]) -> None:
    """Hooks export variables and the wheel caches per process: one batch, reversed, must give
    each argv the values it got among all the others."""
    on_b200 = [case for case in CASES if case.gpu == "B200"]
    sample = [case for case in on_b200 if isinstance(resolved[case.id], Refused)] + on_b200[::9]
    again = resolve_many([_argv(case) for case in reversed(sample)], GPUS["B200"])[::-1]
    assert again == [resolved[case.id] for case in sample]
    assert any(isinstance(result, Refused) for result in again) and len(sample) > 10


def test_the_declared_gpus_are_the_operators() -> None:
    """The wheel sees the memory and architecture the operator's GPU table gives the mirror."""
    for name in {case.gpu for case in CASES}:
        assert GPUS[name].memory_gib == GPU_TYPES[name].memory_gib
        assert GPUS[name].capability[0] == GPU_TYPES[name].compute_capability_major
