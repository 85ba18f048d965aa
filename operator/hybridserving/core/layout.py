"""Layout rules: what SGLang checks late or not at all, checked before any pod exists.

SGLang 0.5.23 validates most layout combinations only when the engine starts (minutes
after the pods were scheduled, and then as a crash loop), some only deep inside model
loading, and a few not at all (`tp % dcp` on CUDA builds wrong DCP groups silently).
`validate` reports every such rule at admission, each issue naming the field to change
and how, so that a bad spec never reaches a running fleet.

Rules that describe a limitation of the engine build carry the SGLang versions they were
read from (`engine_versions`, a PEP 440 specifier); an engine build that lifts one of the
limitations declares it in `spec.engine.capabilities` instead of the operator guessing
from a version number.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic.alias_generators import to_camel

from hybridserving.api.v1alpha1 import ROLES, HybridServingSpec, LayoutSpec, Role, RoleSpec
from hybridserving.core import ports, resolution, sglang_options
from hybridserving.contract import ENV_ENGINE_API_KEY, ENV_SETTINGS, PLACEHOLDERS
from hybridserving.api.profiles import PROFILES, ModelArchitecture
from hybridserving.core.resolution import SPECULATIVE_DEFAULT_MAX_RUNNING_REQUESTS
from hybridserving.core.switching import SwitchConfig

Severity = Literal["error", "warning"]

# The SGLang release whose parser and validation hooks these rules and `core.flags` follow.
VERIFIED_SGLANG = "0.5.23"
_FROM_VERIFIED = f">={VERIFIED_SGLANG}"

# DeepSeek-V3.2's architecture: the one DSA model SGLang refuses zigzag prefill CP for.
_DEEPSEEK_V32 = "DeepseekV32ForCausalLM"
# SGLang's DSA prefill CP asserts tp_size <= 8: it only runs inside one 8-GPU machine.
_DSA_PREFILL_CP_MAX_TP = 8


@dataclass(frozen=True)
class Rule:
    """One layout rule as the documentation lists it."""

    id: str
    severity: Severity
    summary: str
    engine: str  # what SGLang 0.5.23 does without the operator's check
    engine_versions: str | None = None


@dataclass(frozen=True)
class LayoutIssue:
    """A rule a spec breaks, with the field to change and the change to make."""

    path: str
    message: str
    fix: str
    rule: str
    severity: Severity
    engine_versions: str | None = None

    def __str__(self) -> str:
        return f"{self.severity}: {self.path}: {self.message} [{self.rule}] Fix: {self.fix}"


_RULES: tuple[Rule, ...] = (
    Rule("model-profile-known", "error", "model.profile names a built-in profile",
         "n/a: profiles are the operator's"),
    Rule("engine-version-supported", "error", "the engine is at least the SGLang release the argv is rendered for",
         "older releases lack --attn-dp-size and exit on the rendered argv", "<" + VERIFIED_SGLANG),
    Rule("engine-version-verified", "warning", "the engine is the SGLang release these rules were read from",
         "newer releases may add or lift checks", ">" + VERIFIED_SGLANG),
    Rule("dcp-divides-tp", "error", "dcp divides tp",
         "none on CUDA: DCP groups are chunks of the TP group, a remainder builds wrong groups"),
    Rule("attn-dp-divides-tp", "error", "attnDp divides tp", "late: asserted at startup"),
    Rule("attn-cp-divides-tp", "error", "attnCp divides tp", "late: asserted at startup"),
    Rule("attn-dp-cp-divide-tp", "error", "attnDp x attnCp divides tp", "late: asserted at startup"),
    Rule("attention-heads-divisible", "error", "the attention heads split evenly over the attention TP ranks",
         "late: fails while loading the model"),
    Rule("ep-divides-tp", "error", "ep divides tp (expert groups are carved out of the TP group)",
         "late: fails at distributed init"),
    Rule("nodes-divide-world", "error", "nodesPerInstance divides tp x pp",
         "late: check_server_args at startup", _FROM_VERIFIED),
    Rule("gpus-per-node", "error", "one pod of an instance needs no more GPUs than a node has",
         "n/a: the pod never schedules"),
    Rule("multi-node-fills-nodes", "error", "a multi-node instance uses every GPU of each of its nodes",
         "n/a: partial nodes spread collectives over more nodes than needed"),
    Rule("cp-strategy-required", "error", "attnCp > 1 names cpStrategy",
         "late: rejected at startup", _FROM_VERIFIED),
    Rule("cp-strategy-unused", "warning", "cpStrategy is only set with attnCp > 1",
         "n/a: without prefill CP the strategy is never rendered"),
    Rule("prefill-cp-excludes-dcp", "error", "one server runs prefill CP or DCP, not both",
         "late: rejected at startup", _FROM_VERIFIED),
    Rule("dcp-decode-only", "error", "dcp > 1 only on decode", "warns only"),
    Rule("attn-cp-prefill-only", "error", "attnCp > 1 only on prefill",
         "late: asserted at startup for DSA models", _FROM_VERIFIED),
    Rule("kda-excludes-prefill-cp", "error", "models with KDA layers do not use prefill CP",
         "none in the argument checks", _FROM_VERIFIED),
    Rule("dsa-v32-zigzag", "error", "DeepSeek-V3.2 prefill CP uses interleave",
         "late: rejected at startup", _FROM_VERIFIED),
    Rule("dsa-prefill-cp-max-tp", "error", "DSA prefill CP runs with tp <= 8",
         "late: asserted at startup", _FROM_VERIFIED),
    Rule("dsa-prefill-cp-single-node", "error", "DSA prefill CP runs on one node",
         "late or none: the CP path assumes one machine", _FROM_VERIFIED),
    Rule("dsa-dcp-in-pd", "error", "DSA models run dcp > 1 in PD mode only with capability dsa-dcp-pd",
         "late: rejected at startup", _FROM_VERIFIED),
    Rule("prefill-cp-forces-ep", "warning", "MLA prefill CP and DSA zigzag prefill CP run ep = tp with deepep",
         "rewrites: sets ep = tp and moe-a2a-backend deepep", _FROM_VERIFIED),
    Rule("mla-prefill-cp-size", "warning", "MLA prefill CP runs attnCp = tp / attnDp",
         "rewrites: sets attn-cp-size = tp / attn-dp-size", _FROM_VERIFIED),
    Rule("moe-a2a-forces-ep", "warning", "an MoE all-to-all backend runs ep = tp",
         "rewrites: sets ep = tp", _FROM_VERIFIED),
    Rule("layer-split-needs-dsa", "error", "layerSplit only for DSA models", "late: rejected at startup",
         _FROM_VERIFIED),
    Rule("layer-split-prefill-only", "error", "layerSplit only on prefill", "late: rejected at startup",
         _FROM_VERIFIED),
    Rule("layer-split-needs-interleave", "error", "layerSplit needs prefill CP with cpStrategy interleave",
         "late: rejected at startup", _FROM_VERIFIED),
    Rule("layer-split-needs-mooncake", "error", "layerSplit needs the mooncake transfer backend",
         "late: rejected at startup", _FROM_VERIFIED),
    Rule("layer-split-excludes-pp", "error", "layerSplit runs with pp = 1", "late: rejected at startup",
         _FROM_VERIFIED),
    Rule("prefill-cp-dcp-reshard", "error",
         "prefill context parallelism (attnCp > 1, layer-split or not) feeding DCP decode (the 2D reshard) needs "
         "capability prefill-cp-dcp-reshard",
         "late: decode raises \"PD decode DCP currently requires prefill attention CP=1\" on its first request",
         _FROM_VERIFIED),
    Rule("roles-pp-agree", "error", "decode's pp is prefill's pp, or 1",
         "late: decode asserts it on its first request", _FROM_VERIFIED),
    Rule("dcp-backend-needs-dcp", "error", "dcpCommBackend a2a / fi_a2a need dcp > 1",
         "late: rejected at startup", _FROM_VERIFIED),
    Rule("replicate-q-proj-needs-dcp", "error", "replicateQProj needs dcp > 1", "late: rejected at startup",
         _FROM_VERIFIED),
    Rule("replicate-q-proj-needs-a2a", "error", "replicateQProj needs dcpCommBackend a2a or fi_a2a",
         "late: rejected at startup", _FROM_VERIFIED),
    Rule("speculative-pp-prefill-only", "error", "speculative decoding with pp > 1 only on prefill",
         "late: asserted at startup", _FROM_VERIFIED),
    Rule("speculative-pp-eagle-only", "error", "speculative decoding with pp > 1 uses EAGLE (or NEXTN)",
         "late: asserted at startup", _FROM_VERIFIED),
    Rule("speculative-params-together", "error", "numSteps, eagleTopk and numDraftTokens are set together (or "
         "numSteps and eagleTopk, or none)", "late: asserts, or raises TypeError, at startup", _FROM_VERIFIED),
    Rule("speculative-chain-draft-tokens", "warning", "with eagleTopk 1, numDraftTokens is numSteps + 1 (or unset)",
         "rewrites: sets num-draft-tokens to num-steps + 1", _FROM_VERIFIED),
    Rule("speculative-tree-page-size", "error", "a draft tree (eagleTopk > 1, NGRAM's BFS breadth) with a resolved "
         "page size > 1 runs only on the attention backends that page it", "late: rejected at startup",
         _FROM_VERIFIED),
    Rule("speculative-attn-dp", "error", "NGRAM and STANDALONE speculative decoding run without attention DP",
         "late: rejected at startup", _FROM_VERIFIED),
    Rule("eagle-running-request-cap", "warning",
         "speculative decoding (EAGLE family and NGRAM) sets maxRunningRequests (else the engine caps it at 48)",
         "rewrites: sets max-running-requests 48, split over the attention-DP ranks", _FROM_VERIFIED),
    Rule("gpu-architecture-supported", "error",
         "layouts whose attention backends need Blackwell (SM100) run on a gpuType that has it",
         "late: the backend check raises at startup", _FROM_VERIFIED),
    Rule("gpu-type-declared", "warning",
         "layouts whose attention backends need Blackwell declare hardware.gpuType", "n/a: cannot be checked"),
    Rule("roles-page-size-agree", "error", "both roles run the same page size once the engine has resolved it",
         "late: decode raises \"Page size mismatch\" at bootstrap", _FROM_VERIFIED),
    Rule("extra-args-value", "error", "a value in engine.extraArgs is one SGLang's parser accepts for its flag "
         "(one of its choices, or a number)", "late: the parser exits at startup", _FROM_VERIFIED),
    Rule("moe-a2a-flashinfer-topology", "error", "moeA2aBackend flashinfer runs with attnDp = tp",
         "late: asserted at startup", _FROM_VERIFIED),
    Rule("moe-a2a-flashinfer-runner", "error", "moeA2aBackend flashinfer runs with a FlashInfer or DeepGEMM MoE "
         "runner named by --moe-runner-backend in engine.extraArgs", "late: asserted at startup", _FROM_VERIFIED),
    Rule("moe-a2a-mori-dispatch", "error", "moeA2aBackend mori on prefill dispatches at most "
         "SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK (4096) tokens per rank: the per-rank chunked prefill",
         "late: asserted at startup", _FROM_VERIFIED),
    Rule("kv-dtype-supported", "error", "the KV cache dtype is one the resolved attention backends read (DSA "
         "models and TensorRT-LLM / CuteDSL MLA: bf16 or fp8_e4m3)", "late: rejected at startup", _FROM_VERIFIED),
    Rule("roles-kv-dtype-agree", "error", "both roles run the same KV cache dtype",
         "late: decode raises \"KV cache dtype mismatch\" at bootstrap", _FROM_VERIFIED),
    Rule("speculative-needs-draft", "error", "a speculative algorithm has a draft: the model's MTP layer or a "
         "draft model", "late: fails while loading the draft"),
    Rule("vision-encoder-heads-tp", "warning", "the vision encoder's heads split over tp",
         "falls back to data parallelism for the encoder"),
    Rule("prefill-prefix-caching", "warning", "prefill keeps its prefix cache", "n/a: a silent loss of hits"),
    Rule("role-has-instances", "warning", "each role has instances (or role switch keeps a floor)",
         "n/a: PD needs both roles to serve a request"),
    Rule("multi-node-needs-rdma", "warning", "multi-node instances get RDMA devices or the host network",
         "none: collectives fall back to TCP"),
    Rule("role-switch-relaunch-compatible", "error",
         "with role switch on, both roles use the same GPUs per instance and nodes per instance",
         "n/a: the operator moves instances between roles"),
    Rule("role-switch-in-place", "warning", "with role switch on, instances switch in place",
         "rejects --enable-pd-role-switch with EP, PP, DCP, speculative decoding; every switch relaunches",
         _FROM_VERIFIED),
    Rule("rdma-resource-named", "error", "rdmaResourceCount > 0 names the extended resource in rdmaResourceName",
         "n/a: without a name the pods would request no RDMA devices"),
    Rule("ib-devices-per-gpu", "error", "with ibDevicesPerGpu, ibDevices hold that many devices for every GPU "
         "of a pod", "late: the transfer engine raises for a GPU the map leaves out"),
    Rule("role-switch-floors-fit", "error", "roleSwitch.minPrefill + minDecode fit in the fleet",
         "n/a: the controller's floors"),
    Rule("total-replicas-needs-role-switch", "error", "spec.replicas and scaling.enabled (the fleet's total) "
         "come with role switching", "n/a: the controller splits the total between roles"),
    Rule("role-switch-drain-timeout", "warning", "roleSwitch.drainTimeoutSeconds leaves time to drain an idle "
         "engine", "n/a: every switch aborts its drain and restores the old role"),
    Rule("scaling-bounds", "error", "scaling.minReplicas is at most scaling.maxReplicas", "n/a: the operator's scaler"),
    Rule("role-switch-floor-above-replicas", "warning", "a role starts at or above its role-switch floor",
         "n/a: the controller's floors"),
    Rule("extra-args-owned-flag", "error", "engine.extraArgs do not set flags the spec owns",
         "last flag wins: the engine runs a layout the operator did not plan"),
    Rule("extra-args-rejected-flag", "error", "engine.extraArgs hold no flag the 0.5.23 parser rejects",
         "late: exits with status 2 at startup", _FROM_VERIFIED),
    Rule("extra-args-deprecated-flag", "warning", "engine.extraArgs hold no deprecated flag",
         "warns and rewrites", _FROM_VERIFIED),
    Rule("extra-args-placeholder", "error", "engine.extraArgs hold no placeholder token of the per-role argv",
         "n/a: the launcher fills placeholders, so the token would take a per-pod value"),
    Rule("model-not-a-flag", "error", "model.path and model.servedModelName do not begin with '-'",
         "late: the parser reads the value as a flag and exits with status 2"),
    Rule("engine-env-owned", "error", "engine.env does not set a variable the operator sets per pod",
         "n/a: the later entry wins, so the launcher would take the user's port, rank or rendezvous"),
    Rule("engine-env-setting", "error", "engine.env gives the launcher's settings (and SGLang's health-check "
         "timeout) values they take", "late: the launcher exits naming it, so every engine pod of the rollout "
         "fails to start"),
    Rule("fleet-size", "error", "a fleet's instances, surge instances included, fit the 1024 it can number",
         "n/a: the operator numbers instances (and their host-network ports) from 0 to 1023"),
    Rule("bootstrap-port-distinct", "error", "transfer.bootstrapPort's series stays clear of the ports the "
         "operator allocates", "n/a: two servers of one instance would bind one port"),
)

RULES: dict[str, Rule] = {rule.id: rule for rule in _RULES}

Issues = Iterator[LayoutIssue]

# Flags `core.flags` renders from spec fields (with their aliases): an extraArgs copy would
# silently override the planned layout, since argparse keeps the last occurrence.
OWNED_FLAGS: dict[str, str] = {
    **dict.fromkeys(("--model-path", "--model"), "spec.model.path"),
    "--served-model-name": "spec.model.servedModelName",
    "--host": "the operator (0.0.0.0)",
    "--port": "the operator (allocated per instance)",
    **dict.fromkeys(("--tp-size", "--tensor-parallel-size", "--tp"), "spec.<role>.layout.tp"),
    **dict.fromkeys(("--pp-size", "--pipeline-parallel-size"), "spec.<role>.layout.pp"),
    **dict.fromkeys(("--attn-dp-size", "--attention-data-parallel-size"), "spec.<role>.layout.attnDp"),
    **dict.fromkeys(("--enable-prefill-cp", "--attn-cp-size", "--attention-context-parallel-size"),
                    "spec.<role>.layout.attnCp"),
    "--cp-strategy": "spec.<role>.layout.cpStrategy",
    "--enable-dsa-cache-layer-split": "spec.<role>.layout.layerSplit",
    **dict.fromkeys(("--dcp-size", "--decode-context-parallel-size"), "spec.<role>.layout.dcp"),
    "--dcp-comm-backend": "spec.<role>.layout.dcpCommBackend",
    **dict.fromkeys(("--dcp-replicate-q-proj", "--no-dcp-replicate-q-proj"), "spec.<role>.layout.replicateQProj"),
    **dict.fromkeys(("--ep-size", "--expert-parallel-size", "--ep"), "spec.<role>.layout.ep"),
    "--moe-a2a-backend": "spec.<role>.layout.moeA2aBackend",
    **dict.fromkeys(("--nnodes", "--node-rank", "--dist-init-addr", "--nccl-init-addr"),
                    "spec.<role>.nodesPerInstance"),
    "--disaggregation-mode": "the operator (the instance's role)",
    "--disaggregation-transfer-backend": "spec.transfer.backend",
    "--disaggregation-bootstrap-port": "spec.transfer.bootstrapPort",
    "--disaggregation-ib-device": "spec.transfer.ibDevices",
    "--engine-info-bootstrap-port": "the operator (allocated per instance)",
    "--enable-pd-role-switch": "spec.roleSwitch.enabled",
    "--speculative-algorithm": "spec.<role>.speculative.algorithm",
    "--speculative-draft-model-path": "spec.<role>.speculative.draftModelPath",
    "--speculative-num-steps": "spec.<role>.speculative.numSteps",
    "--speculative-eagle-topk": "spec.<role>.speculative.eagleTopk",
    "--speculative-num-draft-tokens": "spec.<role>.speculative.numDraftTokens",
    "--mem-fraction-static": "spec.<role>.memFractionStatic",
    "--max-running-requests": "spec.<role>.maxRunningRequests",
    "--page-size": "spec.<role>.pageSize",
    "--kv-cache-dtype": "spec.<role>.kvCacheDtype",
    "--disable-radix-cache": "spec.<role>.prefixCaching",
}

# Flags SGLang 0.5.23's parser rejects (unknown or ambiguous), or that fight the layout model.
_REJECTED_FLAGS: dict[str, str] = {
    "--cuda-graph-max-bs": "use --cuda-graph-max-bs-decode or --cuda-graph-max-bs-prefill (the short name is "
    "ambiguous)",
    "--prefill-round-robin-balance": "remove it (0.5.23 has no such flag; prefill load balancing is "
    "--load-balance-method)",
    **dict.fromkeys(("--dp-size", "--data-parallel-size", "--dp"),
                    "use spec.<role>.layout.attnDp (multi-node data-parallel replicas are rejected; the operator "
                    "runs replicas as separate instances)"),
    "--enable-dp-attention": "use spec.<role>.layout.attnDp (the flag is deprecated and rewrites --dp-size)",
    **dict.fromkeys(("--prefill-cp-size", "--pcp-size", "--cp-size", "--context-parallel-size",
                     "--enable-nsa-prefill-context-parallel", "--nsa-prefill-cp-mode", "--dsa-prefill-cp-mode"),
                    "use spec.prefill.layout.attnCp and cpStrategy"),
    **dict.fromkeys(("--enable-decode-cp", "--dcp-kv-cache-interleave-size"), "use spec.decode.layout.dcp"),
    **dict.fromkeys(("--disaggregation-decode-tp", "--disaggregation-decode-dp", "--disaggregation-prefill-pp"),
                    "set the layout per role in spec.prefill.layout / spec.decode.layout"),
    "--pd-role-switch": "use spec.roleSwitch.enabled",
    "--disaggregation-bootstrap-host": "remove it (the router passes the bootstrap host per request)",
    "--enable-deepep-moe": "use spec.<role>.layout.moeA2aBackend: deepep",
    **dict.fromkeys(("--api-key", "--admin-api-key"),
                    "remove it: the launcher passes the fleet's key (Secret <name>-engine-key); a second "
                    "key would lock out the router and the operator"),
    "--config": "remove it and put the flags in spec.engine.extraArgs (a config file can set flags the spec owns, "
    "out of the operator's sight)",
}

_DEPRECATED_FLAGS: dict[str, str] = {
    "--disable-cuda-graph": "use --cuda-graph-backend-decode=disabled and --cuda-graph-backend-prefill=disabled",
}


def _issue(rule_id: str, path: str, message: str, fix: str) -> LayoutIssue:
    rule = RULES[rule_id]
    return LayoutIssue(path=path, message=message, fix=fix, rule=rule.id, severity=rule.severity,
                       engine_versions=rule.engine_versions)


def engine_version(spec: HybridServingSpec) -> Version:
    """The engine's release as a comparable version.

    A custom build suffix that PEP 440 cannot read (`0.5.23-reshard`) keeps the rules of
    the release it was built from; the API's pattern guarantees the numeric prefix.
    """
    text = spec.engine.sglang_version
    try:
        return Version(text)
    except InvalidVersion:
        release = re.match(r"\d+\.\d+\.\d+", text)
        assert release is not None, "the API pattern guarantees a numeric release"
        return Version(release.group(0))


def applies(rule: Rule | LayoutIssue, version: Version) -> bool:
    """Whether a rule holds for an engine version (rules without a range hold for all)."""
    if rule.engine_versions is None:
        return True
    return SpecifierSet(rule.engine_versions).contains(version, prereleases=True)


def validate(spec: HybridServingSpec) -> list[LayoutIssue]:
    """Every layout rule the spec breaks, errors and warnings, in a stable order."""
    arch = _architecture(spec)
    version = engine_version(spec)
    issues: list[LayoutIssue] = []
    if arch is None:
        issues.append(_issue(
            "model-profile-known", "spec.model.profile",
            f"unknown model profile {spec.model.profile!r}",
            f"use one of the built-in profiles ({', '.join(sorted(PROFILES))}) or describe the model under "
            "spec.model.architecture instead",
        ))
    issues.extend(_check_engine_version(spec, version))
    for role in ROLES:
        issues.extend(_check_arithmetic(spec, role))
        issues.extend(_check_context_parallel(spec, role, arch))
        issues.extend(_check_decode_context_parallel(spec, role))
        issues.extend(_check_experts(spec, role, arch))
        issues.extend(_check_speculative(spec, role, arch))
        if arch is not None:
            issues.extend(_check_model_split(spec, role, arch))
    if arch is not None:
        issues.extend(_check_resolved(spec, arch))
    issues.extend(_check_reshard(spec, arch))
    issues.extend(_check_fleet(spec))
    issues.extend(_check_transfer(spec))
    issues.extend(_check_role_switch(spec))
    issues.extend(_check_model(spec))
    issues.extend(_check_env(spec))
    issues.extend(_check_extra_args(spec))
    return [issue for issue in issues if applies(issue, version)]


def errors(issues: list[LayoutIssue]) -> list[LayoutIssue]:
    """The issues that must block the spec (warnings are reported, not enforced)."""
    return [issue for issue in issues if issue.severity == "error"]


def role_switch_capability(spec: HybridServingSpec) -> tuple[bool, list[str]]:
    """Whether instances can switch role in place, and if not, every reason why.

    In place (`POST /pd_role_switch`) keeps the weights and the KV pool of the running
    server, so the same argv must serve both roles: identical layouts and pool settings,
    and none of the features SGLang 0.5.23 refuses `--enable-pd-role-switch` with. When
    this says no, a switch relaunches the engine with the other role's flags.
    """
    reasons: list[str] = []
    for role in ROLES:
        rs = spec.role(role)
        layout = rs.layout
        if layout.ep > 1:
            reasons.append(f"spec.{role}.layout.ep is {layout.ep}: expert parallelism")
        if layout.moe_a2a_backend not in (None, "none"):
            reasons.append(f"spec.{role}.layout.moeA2aBackend is {layout.moe_a2a_backend}")
        if layout.pp > 1:
            reasons.append(f"spec.{role}.layout.pp is {layout.pp}: pipeline parallelism")
        if layout.dcp > 1:
            reasons.append(f"spec.{role}.layout.dcp is {layout.dcp}: decode context parallelism")
        if rs.speculative is not None:
            reasons.append(f"spec.{role}.speculative is set: speculative decoding")
    if spec.transfer.backend != "mooncake":
        reasons.append(f"spec.transfer.backend is {spec.transfer.backend}: only mooncake can switch in place")
    differing = _differing_fields(spec.prefill, spec.decode)
    if differing:
        reasons.append("prefill and decode differ in " + ", ".join(differing) + ": one server cannot serve both")
    return not reasons, reasons


# --------------------------------------------------------------------------- helpers


def _architecture(spec: HybridServingSpec) -> ModelArchitecture | None:
    if spec.model.architecture is not None:
        return spec.model.architecture
    return PROFILES.get(spec.model.profile or "")


def _attn_tp(layout: LayoutSpec) -> int | None:
    """Ranks one attention head group is split over, when the layout divides evenly."""
    groups = layout.attn_dp * layout.attn_cp
    return layout.tp // groups if layout.tp % groups == 0 else None


def _prefill_cp_rewrites_moe(layout: LayoutSpec, arch: ModelArchitecture) -> bool:
    """SGLang forces deepep and ep = tp under MLA prefill CP and under DSA zigzag prefill CP
    (V3.2 zigzag is rejected outright, so it rewrites nothing)."""
    if layout.attn_cp == 1:
        return False
    if arch.attention == "mla":
        return True
    return arch.is_dsa and layout.cp_strategy == "zigzag" and arch.hf_architecture != _DEEPSEEK_V32


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _nodes_for(world: int, gpus_per_node: int) -> int:
    """The fewest nodes that split `world` GPUs evenly with no node over its GPU count."""
    return next(n for n in range(1, world + 1) if world % n == 0 and world // n <= gpus_per_node)


def _differing_fields(prefill: RoleSpec, decode: RoleSpec) -> list[str]:
    """Settings that shape the running server, and so must match for an in-place switch."""
    fields = [f"layout.{to_camel(name)}" for name in LayoutSpec.model_fields
              if getattr(prefill.layout, name) != getattr(decode.layout, name)]
    for name in ("nodes_per_instance", "mem_fraction_static", "page_size", "kv_cache_dtype",
                 "max_running_requests"):
        if getattr(prefill, name) != getattr(decode, name):
            fields.append(to_camel(name))
    return fields


# --------------------------------------------------------------------------- rules


def _check_engine_version(spec: HybridServingSpec, version: Version) -> Issues:
    path = "spec.engine.sglangVersion"
    if applies(RULES["engine-version-supported"], version):
        yield _issue("engine-version-supported", path,
                     f"SGLang {spec.engine.sglang_version} is older than {VERIFIED_SGLANG}, the release the "
                     "engine flags are rendered for",
                     f"use an engine image with SGLang {VERIFIED_SGLANG} or newer and set sglangVersion to match")
    if applies(RULES["engine-version-verified"], version):
        yield _issue("engine-version-verified", path,
                     f"SGLang {spec.engine.sglang_version} is newer than {VERIFIED_SGLANG}, the release the layout "
                     "rules and flags were verified against",
                     f"check the rendered flags with that release's parser, or pin SGLang {VERIFIED_SGLANG}")


def _check_arithmetic(spec: HybridServingSpec, role: Role) -> Issues:
    rs = spec.role(role)
    layout = rs.layout
    base = f"spec.{role}.layout"
    if layout.tp % layout.dcp:
        yield _issue("dcp-divides-tp", f"{base}.dcp",
                     f"dcp must divide tp: dcp {layout.dcp} does not divide tp {layout.tp} (SGLang builds DCP "
                     "groups by chunking each TP group and does not check this on CUDA)",
                     f"set dcp to a divisor of {layout.tp}: {_divisors(layout.tp)}")
    dp_ok = layout.tp % layout.attn_dp == 0
    cp_ok = layout.tp % layout.attn_cp == 0
    if not dp_ok:
        yield _issue("attn-dp-divides-tp", f"{base}.attnDp",
                     f"attnDp {layout.attn_dp} does not divide tp {layout.tp}",
                     f"set attnDp to a divisor of {layout.tp}: {_divisors(layout.tp)}")
    if not cp_ok:
        yield _issue("attn-cp-divides-tp", f"{base}.attnCp",
                     f"attnCp {layout.attn_cp} does not divide tp {layout.tp}",
                     f"set attnCp to a divisor of {layout.tp}: {_divisors(layout.tp)}")
    if dp_ok and cp_ok and layout.tp % (layout.attn_dp * layout.attn_cp):
        yield _issue("attn-dp-cp-divide-tp", f"{base}.attnCp",
                     f"attnDp x attnCp = {layout.attn_dp * layout.attn_cp} does not divide tp {layout.tp}",
                     f"choose attnDp and attnCp whose product divides {layout.tp}: with attnDp "
                     f"{layout.attn_dp}, attnCp one of {_divisors(layout.tp // layout.attn_dp)}")
    world = layout.world_size
    nodes = rs.nodes_per_instance
    gpus = spec.hardware.gpus_per_node
    if world % nodes:
        yield _issue("nodes-divide-world", f"spec.{role}.nodesPerInstance",
                     f"{world} GPUs per instance (tp {layout.tp} x pp {layout.pp}) do not split evenly over "
                     f"{nodes} nodes",
                     f"set nodesPerInstance to {_nodes_for(world, gpus)} ({world // _nodes_for(world, gpus)} "
                     f"GPUs on each of the {gpus}-GPU nodes)")
        return
    per_node = world // nodes
    if per_node > gpus:
        yield _issue("gpus-per-node", f"spec.{role}.nodesPerInstance",
                     f"each of the {nodes} pods of an instance needs {per_node} GPUs but nodes have {gpus} "
                     "(spec.hardware.gpusPerNode)",
                     f"set nodesPerInstance to {_nodes_for(world, gpus)} so that {world} GPUs fit on "
                     f"{gpus}-GPU nodes, or lower tp x pp")
    elif nodes > 1 and per_node != gpus:
        yield _issue("multi-node-fills-nodes", f"spec.{role}.nodesPerInstance",
                     f"the instance spans {nodes} nodes but uses {per_node} of the {gpus} GPUs on each: "
                     f"tp x pp must be {nodes * gpus} GPUs to fill them",
                     f"set nodesPerInstance to {-(-world // gpus)}" if world <= gpus or world % gpus == 0
                     else f"set tp x pp to {nodes * gpus}, a multiple of spec.hardware.gpusPerNode")


def _check_context_parallel(spec: HybridServingSpec, role: Role, arch: ModelArchitecture | None) -> Issues:
    rs = spec.role(role)
    layout = rs.layout
    base = f"spec.{role}.layout"
    if layout.attn_cp > 1 and layout.dcp > 1:
        yield _issue("prefill-cp-excludes-dcp", f"{base}.dcp",
                     "SGLang rejects decode context parallelism (dcp > 1) together with prefill context "
                     "parallelism (attnCp > 1) on one server",
                     "use attnCp on spec.prefill.layout and dcp on spec.decode.layout")
    elif role == "prefill" and layout.dcp > 1:
        yield _issue("dcp-decode-only", f"{base}.dcp",
                     "decode context parallelism on a prefill server shards nothing the prefill keeps",
                     "set spec.prefill.layout.dcp to 1 and use dcp on spec.decode.layout")
    elif role == "decode" and layout.attn_cp > 1:
        yield _issue("attn-cp-prefill-only", f"{base}.attnCp",
                     "prefill context parallelism splits prompts; a decode server has none to split",
                     "set spec.decode.layout.attnCp to 1 (use dcp for long contexts on decode)")
    if layout.attn_cp > 1 and layout.cp_strategy is None:
        yield _issue("cp-strategy-required", f"{base}.cpStrategy",
                     f"attnCp {layout.attn_cp} needs a split strategy; SGLang refuses to start without one",
                     "set cpStrategy: interleave for sparse (DSA) attention, zigzag for dense attention")
    if layout.attn_cp == 1 and layout.cp_strategy is not None:
        yield _issue("cp-strategy-unused", f"{base}.cpStrategy",
                     f"cpStrategy {layout.cp_strategy} has no effect with attnCp 1",
                     "set attnCp > 1 to enable prefill context parallelism, or remove cpStrategy")
    if arch is None or layout.attn_cp == 1:
        return
    if arch.kda_layers:
        yield _issue("kda-excludes-prefill-cp", f"{base}.cpStrategy",
                     f"the model's {arch.kda_layers} KDA layers carry a recurrent state token by token; "
                     f"{layout.cp_strategy or 'any'} prefill CP cannot split a prompt across them",
                     "remove attnCp and cpStrategy and use pp (pipeline parallelism) for long prompts")
        return
    if arch.hf_architecture == _DEEPSEEK_V32 and layout.cp_strategy == "zigzag":
        yield _issue("dsa-v32-zigzag", f"{base}.cpStrategy",
                     f"SGLang rejects zigzag prefill CP for {_DEEPSEEK_V32}",
                     "use cpStrategy: interleave (token i on rank i mod attnCp suits sparse attention)")
    if arch.is_dsa:
        if layout.tp > _DSA_PREFILL_CP_MAX_TP:
            yield _issue("dsa-prefill-cp-max-tp", f"{base}.tp",
                         f"DSA prefill context parallelism runs within one machine: tp {layout.tp} exceeds "
                         f"{_DSA_PREFILL_CP_MAX_TP}",
                         f"set tp to at most {_DSA_PREFILL_CP_MAX_TP} (and attnCp to a divisor of it), or drop attnCp")
        if rs.nodes_per_instance > 1:
            yield _issue("dsa-prefill-cp-single-node", f"spec.{role}.nodesPerInstance",
                         f"DSA prefill context parallelism runs within one node, not {rs.nodes_per_instance}",
                         "set nodesPerInstance to 1 (with pp 1), or drop attnCp")
    runs_as_planned = layout.ep == layout.tp and layout.moe_a2a_backend == "deepep"
    if arch.experts and _prefill_cp_rewrites_moe(layout, arch) and not runs_as_planned:
        yield _issue("prefill-cp-forces-ep", f"{base}.ep",
                     f"with this prefill CP SGLang runs the experts with ep = tp = {layout.tp} over deepep, "
                     f"not ep {layout.ep} / moeA2aBackend {layout.moe_a2a_backend or 'none'}",
                     f"set ep: {layout.tp} and moeA2aBackend: deepep so that the spec says what runs")
    attn_tp_groups = layout.tp // layout.attn_dp if layout.tp % layout.attn_dp == 0 else None
    if arch.attention == "mla" and attn_tp_groups is not None and layout.attn_cp != attn_tp_groups:
        yield _issue("mla-prefill-cp-size", f"{base}.attnCp",
                     f"with MLA prefill CP SGLang sets attnCp to tp / attnDp = {attn_tp_groups}, not "
                     f"{layout.attn_cp}",
                     f"set attnCp: {attn_tp_groups}")


def _check_decode_context_parallel(spec: HybridServingSpec, role: Role) -> Issues:
    layout = spec.role(role).layout
    base = f"spec.{role}.layout"
    if layout.dcp == 1 and layout.dcp_comm_backend in ("a2a", "fi_a2a"):
        yield _issue("dcp-backend-needs-dcp", f"{base}.dcpCommBackend",
                     f"dcpCommBackend {layout.dcp_comm_backend} needs dcp > 1",
                     "remove dcpCommBackend (or set dcp > 1)")
    if layout.replicate_q_proj:
        if layout.dcp == 1:
            yield _issue("replicate-q-proj-needs-dcp", f"{base}.replicateQProj",
                         "replicateQProj copies the query projection across DCP ranks; with dcp 1 there are none",
                         "remove replicateQProj (or set dcp > 1)")
        elif layout.dcp_comm_backend == "ag_rs":
            yield _issue("replicate-q-proj-needs-a2a", f"{base}.replicateQProj",
                         "replicateQProj works with the a2a and fi_a2a DCP backends, not ag_rs",
                         "set dcpCommBackend: a2a (or leave it unset), or remove replicateQProj")


def _check_experts(spec: HybridServingSpec, role: Role, arch: ModelArchitecture | None) -> Issues:
    layout = spec.role(role).layout
    base = f"spec.{role}.layout"
    if layout.tp % layout.ep:
        yield _issue("ep-divides-tp", f"{base}.ep",
                     f"ep {layout.ep} does not divide tp {layout.tp}: expert groups are carved out of the TP group",
                     f"set ep to a divisor of {layout.tp}: {_divisors(layout.tp)}")
    yield from _check_a2a_backend(spec, role)
    cp_rewrites = arch is not None and _prefill_cp_rewrites_moe(layout, arch)
    if layout.moe_a2a_backend not in (None, "none") and layout.ep != layout.tp and not cp_rewrites:
        yield _issue("moe-a2a-forces-ep", f"{base}.ep",
                     f"moeA2aBackend {layout.moe_a2a_backend} makes SGLang run ep = tp = {layout.tp}, not "
                     f"ep {layout.ep}",
                     f"set ep: {layout.tp}, or remove moeA2aBackend")


# arg_groups/moe_hook.py:530-541: the MoE runners FlashInfer's all-to-all dispatches to.
FLASHINFER_A2A_RUNNERS = ("flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_trtllm", "flashinfer_trtllm_routed",
                          "deep_gemm")
MORI_DISPATCH_ENV = "SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK"
MORI_DISPATCH_DEFAULT = 4096


def _check_a2a_backend(spec: HybridServingSpec, role: Role) -> Issues:
    """What the MoE all-to-all backends assert at startup (arg_groups/moe_hook.py:471-486, 530-541, 563-573)."""
    layout = spec.role(role).layout
    base = f"spec.{role}.layout"
    if layout.moe_a2a_backend == "flashinfer":
        if layout.attn_dp != layout.tp:
            yield _issue("moe-a2a-flashinfer-topology", f"{base}.attnDp",
                         f"moeA2aBackend flashinfer needs attnDp equal to tp ({layout.tp}), not {layout.attn_dp}: "
                         "SGLang asserts it at startup",
                         f"set attnDp: {layout.tp}, or use moeA2aBackend deepep")
        runner = sglang_options.value(spec.engine.extra_args, "--moe-runner-backend")
        if runner not in FLASHINFER_A2A_RUNNERS:
            yield _issue("moe-a2a-flashinfer-runner", f"{base}.moeA2aBackend",
                         f"moeA2aBackend flashinfer dispatches to {', '.join(FLASHINFER_A2A_RUNNERS)} MoE runners "
                         f"only, and the engine runs {runner or 'its automatic choice'}: SGLang asserts it at startup",
                         "set --moe-runner-backend to one of those (e.g. flashinfer_cutlass) in "
                         "spec.engine.extraArgs, or use moeA2aBackend deepep")
    if layout.moe_a2a_backend == "mori" and role == "prefill":
        limit = _env_int(spec, MORI_DISPATCH_ENV) or MORI_DISPATCH_DEFAULT
        chunked = sglang_options.int_value(spec.engine.extra_args, "--chunked-prefill-size")
        per_rank = (resolution.resolve(spec, role).chunked_prefill_size if chunked is None
                    else chunked // layout.attn_dp)
        if per_rank > limit:
            yield _issue("moe-a2a-mori-dispatch", f"{base}.moeA2aBackend",
                         f"prefill chunks of {per_rank} tokens per rank exceed the {limit} tokens MoRI dispatches "
                         f"per rank ({MORI_DISPATCH_ENV}): SGLang asserts it at startup",
                         f"set spec.engine.env {MORI_DISPATCH_ENV} to at least {per_rank}, or add "
                         f"--chunked-prefill-size {limit * layout.attn_dp} to spec.engine.extraArgs, or raise attnDp")


def _env_int(spec: HybridServingSpec, name: str) -> int | None:
    value = next((e.value for e in spec.engine.env if e.name == name and e.value), None)
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _check_speculative(spec: HybridServingSpec, role: Role, arch: ModelArchitecture | None) -> Issues:
    rs = spec.role(role)
    speculative = rs.speculative
    if speculative is None:
        return
    path = f"spec.{role}.speculative"
    if role == "decode" and rs.layout.pp > 1:
        yield _issue("speculative-pp-prefill-only", path,
                     "SGLang runs speculative decoding with pipeline parallelism only on prefill servers",
                     "remove spec.decode.speculative or set spec.decode.layout.pp to 1")
    if rs.layout.pp > 1 and speculative.algorithm not in ("EAGLE", "NEXTN"):
        yield _issue("speculative-pp-eagle-only", f"{path}.algorithm",
                     f"SGLang runs pipeline parallelism only with (single-layer) EAGLE speculative decoding, "
                     f"not {speculative.algorithm}",
                     f"use algorithm EAGLE or NEXTN, or set spec.{role}.layout.pp to 1")
    if rs.max_running_requests is None:
        per_rank = SPECULATIVE_DEFAULT_MAX_RUNNING_REQUESTS // rs.layout.attn_dp
        yield _issue("eagle-running-request-cap", f"spec.{role}.maxRunningRequests",
                     f"{speculative.algorithm} without maxRunningRequests: SGLang caps the server at "
                     f"{SPECULATIVE_DEFAULT_MAX_RUNNING_REQUESTS} running requests, {per_rank} per attention-DP rank "
                     f"at attnDp {rs.layout.attn_dp}",
                     f"set spec.{role}.maxRunningRequests to the batch the instance should run")
    steps = speculative.num_steps
    if steps is not None and speculative.eagle_topk == 1 and speculative.num_draft_tokens not in (None, steps + 1):
        # speculative_hook.py:1255-1266: a chain verifies one token past its steps, whatever is asked.
        yield _issue("speculative-chain-draft-tokens", f"{path}.numDraftTokens",
                     f"numDraftTokens {speculative.num_draft_tokens} with eagleTopk 1: SGLang drafts a chain and "
                     f"verifies numSteps + 1 = {steps + 1} tokens instead",
                     f"set {path}.numDraftTokens to {steps + 1} (or remove it), or raise eagleTopk for a tree")
    if speculative.draft_model_path:
        return
    reuses_mtp = speculative.algorithm in ("EAGLE", "NEXTN")
    if speculative.algorithm in ("EAGLE3", "STANDALONE") or (reuses_mtp and arch is not None and not arch.has_mtp):
        source = "has no MTP layer to draft with" if reuses_mtp else "needs a separate draft model"
        yield _issue("speculative-needs-draft", f"{path}.draftModelPath",
                     f"{speculative.algorithm} without draftModelPath: the model {source}",
                     "set draftModelPath to a draft model for this model, or use algorithm NGRAM")


def _check_model_split(spec: HybridServingSpec, role: Role, arch: ModelArchitecture) -> Issues:
    layout = spec.role(role).layout
    base = f"spec.{role}.layout"
    attn_tp = _attn_tp(layout)
    if attn_tp is not None and arch.attention_heads % attn_tp:
        yield _issue("attention-heads-divisible", f"{base}.tp",
                     f"{arch.attention_heads} attention heads do not split over {attn_tp} attention TP ranks "
                     "(tp / (attnDp x attnCp))",
                     f"choose tp, attnDp and attnCp so that tp / (attnDp x attnCp) divides {arch.attention_heads}")
    if arch.vision_encoder_heads and arch.vision_encoder_heads % layout.tp:
        yield _issue("vision-encoder-heads-tp", f"{base}.tp",
                     f"the vision encoder's {arch.vision_encoder_heads} heads do not split over tp {layout.tp}; "
                     "the engine runs the encoder data-parallel instead (more memory per GPU, no TP speed-up)",
                     f"accept it, or use a tp that divides {arch.vision_encoder_heads} on this role")


def _check_resolved(spec: HybridServingSpec, arch: ModelArchitecture) -> Issues:
    """Rules on what the engine runs after its start-up rewrites (`core.resolution`)."""
    resolved = {role: resolution.resolve(spec, role) for role in ROLES}
    gpu = spec.hardware.gpu
    for role in ROLES:
        r = resolved[role]
        needs = [b for b in (r.prefill_attention_backend, r.decode_attention_backend)
                 if b in ("trtllm_mla", "cutedsl_mla")]
        if not needs:
            continue
        why = (f"{arch.hf_architecture} with dcp {spec.role(role).layout.dcp} makes SGLang use "
               f"{' and '.join(sorted(set(needs)))}, which run only on Blackwell (SM100) GPUs")
        if gpu is None:
            yield _issue("gpu-type-declared", "spec.hardware.gpuType", f"{role}: {why}; the GPU is not declared",
                         "set spec.hardware.gpuType (B200, B300, GB200 or GB300 for this layout)")
        elif gpu.compute_capability_major != 10:
            yield _issue("gpu-architecture-supported", f"spec.{role}.layout.dcp",
                         f"{why}, and {spec.hardware.gpu_type} is {gpu.architecture}",
                         f"run this role on B200, B300, GB200 or GB300, or set spec.{role}.layout.dcp to 1")
    for role in ROLES:
        refusal = resolution.kv_dtype_refusal(arch, resolved[role])
        if refusal is not None:
            yield _issue("kv-dtype-supported", f"spec.{role}.kvCacheDtype",
                         f"{arch.hf_architecture} on this layout refuses kvCacheDtype "
                         f"{spec.role(role).kv_cache_dtype} at startup ({refusal})",
                         f"set spec.{role}.kvCacheDtype to fp8_e4m3 (or bf16), on both roles")
    for role in ROLES:
        yield from _check_draft(spec, role, arch, resolved[role])
    prefill, decode = resolved["prefill"], resolved["decode"]
    if prefill.page_size != decode.page_size:
        yield _issue("roles-page-size-agree", "spec.prefill.pageSize",
                     f"the engine resolves page size {prefill.page_size} on prefill and {decode.page_size} on "
                     "decode, and decode refuses a prefill with another page size",
                     "set spec.prefill.pageSize and spec.decode.pageSize both to "
                     f"{max(prefill.page_size, decode.page_size)}")
    if prefill.kv_cache_dtype != decode.kv_cache_dtype:
        yield _issue("roles-kv-dtype-agree", "spec.prefill.kvCacheDtype",
                     f"prefill stores KV as {prefill.kv_cache_dtype} and decode as {decode.kv_cache_dtype}; "
                     "decode refuses a prefill with another KV cache dtype",
                     "set spec.prefill.kvCacheDtype and spec.decode.kvCacheDtype to the same value")


def _check_draft(spec: HybridServingSpec, role: Role, arch: ModelArchitecture,
                 resolved: resolution.ResolvedArgs) -> Issues:
    """The speculative settings the engine refuses at startup (`resolution.draft_refusals`), each
    said for the field to change."""
    speculative = spec.role(role).speculative
    draft = resolution.role_draft(spec, role)
    if speculative is None or draft is None:
        return
    path = f"spec.{role}.speculative"
    chosen = resolution.chooses_attention_backend(spec.engine.extra_args)
    for refusal in resolution.draft_refusals(arch, draft, resolved, backend_chosen=chosen):
        if refusal.kind == "attn-dp":
            yield _issue("speculative-attn-dp", f"spec.{role}.layout.attnDp",
                         f"SGLang {VERIFIED_SGLANG} refuses {draft.algorithm} speculative decoding with attention "
                         f"data parallelism (attnDp {resolved.attn_dp})",
                         f"set spec.{role}.layout.attnDp to 1, or use algorithm EAGLE, EAGLE3 or NEXTN")
        elif refusal.kind == "shape-without-steps":
            named = " and ".join(name for name, value in (("eagleTopk", draft.eagle_topk),
                                                          ("numDraftTokens", draft.num_draft_tokens))
                                 if value is not None)
            yield _issue("speculative-params-together", f"{path}.numSteps",
                         f"{named} without numSteps: SGLang chooses numSteps, eagleTopk and numDraftTokens "
                         "together when numSteps is unset, and fails at startup when only some of them are set",
                         f"set {path}.numSteps as well, or remove {named}")
        elif refusal.kind == "steps-without-width":
            yield _issue("speculative-params-together", f"{path}.eagleTopk",
                         "numSteps without eagleTopk: SGLang fails at startup comparing the unset draft width",
                         f"set {path}.eagleTopk (1 drafts a chain, the engine's own choice for these models), or "
                         "remove numSteps" + (" and numDraftTokens" if draft.num_draft_tokens is not None else ""))
        else:
            width = resolution.draft_width(arch, draft)
            why = (f"on the {resolved.attention_backend} attention backend with page size {resolved.page_size}, "
                   "which this role resolves to; SGLang pages a draft tree only on "
                   + ", ".join(resolution.NGRAM_TREE_PAGING_BACKENDS if draft.algorithm == "NGRAM"
                                else resolution.TREE_PAGING_BACKENDS))
            if draft.algorithm == "NGRAM":
                yield _issue("speculative-tree-page-size", f"{path}.algorithm",
                             f"NGRAM drafts a tree {width} wide (its BFS breadth) {why}",
                             f"add {resolution.NGRAM_BFS_BREADTH_FLAG} 1 to spec.engine.extraArgs, or use "
                             "algorithm EAGLE or NEXTN with eagleTopk 1")
            else:
                whole = "" if draft.num_steps is not None else " with numSteps and numDraftTokens (numSteps + 1)"
                yield _issue("speculative-tree-page-size", f"{path}.eagleTopk",
                             f"eagleTopk {width} drafts a tree {why}", f"set {path}.eagleTopk to 1{whole}")


def _check_reshard(spec: HybridServingSpec, arch: ModelArchitecture | None) -> Issues:
    """Layer split and the 2D reshard it feeds, plus DSA DCP in PD mode."""
    capabilities = set(spec.engine.capabilities)
    for role in ROLES:
        rs = spec.role(role)
        layout = rs.layout
        base = f"spec.{role}.layout"
        if not layout.layer_split:
            continue
        if arch is not None and not arch.is_dsa:
            yield _issue("layer-split-needs-dsa", f"{base}.layerSplit",
                         "layerSplit keeps per-layer DSA caches; this model has no DSA attention",
                         "remove layerSplit")
        if role != "prefill":
            yield _issue("layer-split-prefill-only", f"{base}.layerSplit",
                         "layerSplit splits the prefill's KV by layer range; decode servers keep every layer",
                         "remove spec.decode.layout.layerSplit")
            continue
        if layout.attn_cp == 1 or layout.cp_strategy != "interleave":
            yield _issue("layer-split-needs-interleave", f"{base}.cpStrategy",
                         "layerSplit follows interleaved prefill context parallelism",
                         "set attnCp > 1 and cpStrategy: interleave, or remove layerSplit")
        if layout.pp > 1:
            yield _issue("layer-split-excludes-pp", f"{base}.pp",
                         "layerSplit already gives each rank a layer range; SGLang refuses it with pp > 1",
                         "set pp to 1 (use attnCp for long prompts), or remove layerSplit")
        if spec.transfer.backend != "mooncake":
            yield _issue("layer-split-needs-mooncake", "spec.transfer.backend",
                         f"layerSplit transfers KV with mooncake only, not {spec.transfer.backend}",
                         "set spec.transfer.backend: mooncake, or remove layerSplit")
    decode = spec.decode.layout
    prefill = spec.prefill.layout
    # Both checked by decode when it first meets a prefill (disaggregation/common/conn.py:1411-1421,
    # 1516-1518), uncaught: the decode scheduler dies on its first request, after both roles were Ready.
    if prefill.attn_cp > 1 and decode.dcp > 1 and "prefill-cp-dcp-reshard" not in capabilities:
        kind = "layer-split prefill" if prefill.layer_split else f"prefill with attnCp {prefill.attn_cp}"
        yield _issue("prefill-cp-dcp-reshard", "spec.prefill.layout.attnCp",
                     f"{kind} feeding dcp {decode.dcp} decode needs the 2D reshard, which SGLang {VERIFIED_SGLANG} "
                     "does not provide: decode refuses it on its first request (\"PD decode DCP currently requires "
                     "prefill attention CP=1\") and its server dies",
                     "set spec.prefill.layout.attnCp to 1 (and remove layerSplit), or set spec.decode.layout.dcp "
                     "to 1, or run an engine build with the 2D reshard and add prefill-cp-dcp-reshard to "
                     "spec.engine.capabilities")
    if decode.pp > 1 and decode.pp != prefill.pp:
        yield _issue("roles-pp-agree", "spec.decode.layout.pp",
                     f"decode runs pp {decode.pp} and prefill pp {prefill.pp}: decode takes KV from a prefill "
                     "with its own pp or runs pp 1, and asserts it on its first request (its server dies)",
                     f"set spec.decode.layout.pp to {prefill.pp if prefill.pp > 1 else 1} (with nodesPerInstance "
                     "to match), or spec.prefill.layout.pp to the same value")
    if arch is not None and arch.is_dsa and decode.dcp > 1 and "dsa-dcp-pd" not in capabilities:
        yield _issue("dsa-dcp-in-pd", "spec.decode.layout.dcp",
                     f"SGLang {VERIFIED_SGLANG} rejects DSA models ({arch.hf_architecture}) with dcp > 1 in PD mode",
                     "set spec.decode.layout.dcp to 1 (attnDp scales users instead), or run an engine build "
                     "that supports DSA DCP in PD mode and add dsa-dcp-pd to spec.engine.capabilities")


def _check_fleet_size(spec: HybridServingSpec) -> Issues:
    """Caught at admission: an instance index past the last (`ports.MAX_BLOCKS`) fails only the
    plan, so the fleet would keep its old spec and never roll; `kubectl scale` is held to it by
    the CRD's bound on spec.replicas."""
    if spec.replicas is not None:
        total, path = spec.replicas, "spec.replicas"
    else:
        total, path = spec.prefill.replicas + spec.decode.replicas, "spec.prefill.replicas"
    if spec.scaling.enabled and spec.scaling.max_replicas > total:
        total, path = spec.scaling.max_replicas, "spec.scaling.maxReplicas"
    surge = len(ROLES) * spec.rollout.max_surge
    if total > ports.MAX_BLOCKS:
        yield _issue("fleet-size", path, f"the fleet may hold {total} instances, more than the {ports.MAX_BLOCKS} "
                     "one fleet can number", f"keep the fleet at {ports.MAX_BLOCKS} instances or fewer, or split it "
                     "into several HybridServings")
    elif total + surge > ports.MAX_BLOCKS:
        yield _issue("fleet-size", "spec.rollout.maxSurge",
                     f"{total} instances plus {surge} surge instances while both roles roll (maxSurge "
                     f"{spec.rollout.max_surge} each) are more than the {ports.MAX_BLOCKS} one fleet can number",
                     f"set spec.rollout.maxSurge to at most {(ports.MAX_BLOCKS - total) // len(ROLES)}, or keep "
                     "the fleet smaller")


def _check_fleet(spec: HybridServingSpec) -> Issues:
    yield from _check_fleet_size(spec)
    if not spec.prefill.prefix_caching:
        yield _issue("prefill-prefix-caching", "spec.prefill.prefixCaching",
                     "prefill without a prefix cache recomputes every shared prompt prefix (system prompts, "
                     "multi-turn history) on every request",
                     "set spec.prefill.prefixCaching: true unless prompts share no prefixes")
    for role in ROLES:
        floor = spec.role_switch.min_prefill if role == "prefill" else spec.role_switch.min_decode
        kept_by_floor = spec.role_switch.enabled and floor >= 1
        if spec.role(role).replicas == 0 and not kept_by_floor:
            yield _issue("role-has-instances", f"spec.{role}.replicas",
                         f"no {role} instances: a disaggregated fleet serves no request without both roles",
                         f"set spec.{role}.replicas to at least 1, or enable roleSwitch with "
                         f"min{role.capitalize()} >= 1")
    multi_node = [role for role in ROLES if spec.role(role).nodes_per_instance > 1 and spec.role(role).replicas]
    if multi_node and spec.transfer.rdma_resource_count == 0 and not spec.network.host_network:
        yield _issue("multi-node-needs-rdma", "spec.transfer.rdmaResourceCount",
                     f"{' and '.join(multi_node)} instances span several nodes without RDMA devices or the "
                     "host network: tensor/expert collectives between nodes fall back to TCP",
                     "set spec.transfer.rdmaResourceCount (with rdmaResourceName) to the RDMA devices per node, "
                     "or spec.network.hostNetwork: true on RDMA-capable nodes")


def _check_transfer(spec: HybridServingSpec) -> Issues:
    transfer = spec.transfer
    clash = ports.bootstrap_clash(transfer.bootstrap_port, host_network=spec.network.host_network)
    if clash is not None:
        lowest, highest = ports.bootstrap_span(host_network=spec.network.host_network)
        yield _issue("bootstrap-port-distinct", "spec.transfer.bootstrapPort",
                     f"bootstrap ports from {transfer.bootstrap_port} overlap the {clash}",
                     f"set spec.transfer.bootstrapPort between {lowest[0]} and {lowest[1]}"
                     + (f" or between {highest[0]} and {highest[1]}" if highest else "")
                     + " (the default 8998 is clear)")
    if transfer.rdma_resource_count > 0 and not transfer.rdma_resource_name:
        yield _issue("rdma-resource-named", "spec.transfer.rdmaResourceName",
                     f"rdmaResourceCount is {transfer.rdma_resource_count} but rdmaResourceName is empty, so the "
                     "pods would request no RDMA devices",
                     "set spec.transfer.rdmaResourceName to the device plugin's resource (e.g. rdma/ib), or "
                     "rdmaResourceCount: 0 for no RDMA devices")
    per_gpu = transfer.ib_devices_per_gpu
    if per_gpu is None or not transfer.ib_devices:
        return
    devices = len(transfer.ib_devices)
    gpus = max(spec.role(role).gpus_per_pod for role in ROLES)
    if devices % per_gpu or devices < gpus * per_gpu:
        yield _issue("ib-devices-per-gpu", "spec.transfer.ibDevices",
                     f"{devices} device(s) do not split into {per_gpu} per GPU for the {gpus} GPUs of a pod",
                     f"give {gpus * per_gpu} devices in GPU order ({per_gpu} for GPU 0, then GPU 1, ...), "
                     "or unset spec.transfer.ibDevicesPerGpu to let every GPU use every device")


def _check_role_switch(spec: HybridServingSpec) -> Issues:
    switch, scaling = spec.role_switch, spec.scaling
    if switch.enabled:
        yield from _check_drain_timeout(spec)
    # Checked whatever else holds, as the CRD's rule on ScalingSpec is: bounds that cannot hold are
    # refused by the apiserver even with the scaler or role switching off.
    if scaling.min_replicas > scaling.max_replicas:
        yield _issue("scaling-bounds", "spec.scaling.minReplicas",
                     f"scaling.minReplicas {scaling.min_replicas} is above scaling.maxReplicas "
                     f"{scaling.max_replicas}",
                     "set minReplicas at most maxReplicas")
    if not switch.enabled:
        if spec.replicas is not None:
            yield _issue("total-replicas-needs-role-switch", "spec.replicas",
                         "spec.replicas sizes the fleet's total, which only the role-switch controller can split "
                         "between roles",
                         "set spec.roleSwitch.enabled: true, or unset spec.replicas and size "
                         "spec.prefill.replicas and spec.decode.replicas")
        if spec.scaling.enabled:
            yield _issue("total-replicas-needs-role-switch", "spec.scaling.enabled",
                         "the built-in scaler sizes the fleet's total, which only the role-switch controller can "
                         "split between roles",
                         "set spec.roleSwitch.enabled: true, or spec.scaling.enabled: false")
        return
    prefill, decode = spec.prefill, spec.decode
    if (prefill.layout.world_size, prefill.nodes_per_instance) != (decode.layout.world_size,
                                                                    decode.nodes_per_instance):
        yield _issue("role-switch-relaunch-compatible", "spec.roleSwitch.enabled",
                     f"prefill instances use {prefill.layout.world_size} GPUs on {prefill.nodes_per_instance} "
                     f"node(s), decode instances {decode.layout.world_size} GPUs on {decode.nodes_per_instance}: "
                     "an instance's pods cannot run the other role",
                     "give both roles the same tp x pp and nodesPerInstance, or set roleSwitch.enabled: false")
    else:
        in_place, reasons = role_switch_capability(spec)
        if not in_place:
            yield _issue("role-switch-in-place", "spec.roleSwitch.enabled",
                         "role switches relaunch the engine (minutes each) instead of switching in place: "
                         + "; ".join(reasons),
                         "use identical single-stage layouts on both roles without ep, pp, dcp or speculative "
                         "decoding, and mooncake transfer, for in-place switches; or accept relaunches")
    total = spec.total_instances()
    if switch.min_prefill + switch.min_decode > total:
        yield _issue("role-switch-floors-fit", "spec.roleSwitch.minPrefill",
                     f"minPrefill {switch.min_prefill} + minDecode {switch.min_decode} exceed the fleet's "
                     f"{total} instances",
                     f"lower minPrefill/minDecode to at most {total} together, or add replicas")
        return
    if scaling.enabled and switch.min_prefill + switch.min_decode > scaling.min_replicas:
        yield _issue("role-switch-floors-fit", "spec.scaling.minReplicas",
                     f"minPrefill {switch.min_prefill} + minDecode {switch.min_decode} exceed "
                     f"scaling.minReplicas {scaling.min_replicas}: the scaler could shrink the fleet below them",
                     f"set spec.scaling.minReplicas to at least {switch.min_prefill + switch.min_decode}")
    floors: tuple[tuple[Role, int, str], ...] = (("prefill", switch.min_prefill, "minPrefill"),
                                                 ("decode", switch.min_decode, "minDecode"))
    for role, floor, field in floors:
        replicas = spec.role(role).replicas
        if floor > replicas:
            yield _issue("role-switch-floor-above-replicas", f"spec.roleSwitch.{field}",
                         f"{field} {floor} is above spec.{role}.replicas {replicas}: the controller starts by "
                         f"moving instances into {role}",
                         f"set spec.{role}.replicas to at least {floor}, or lower {field}")


# Environment the operator gives every engine pod (per-pod ports, rank, rendezvous, role file):
# a copy in engine.env would override it, the later entry winning.
OWNED_ENV = frozenset({
    "HYBRIDSERVING_CONFIG_DIR", "HYBRIDSERVING_ROLE_FILE", "HYBRIDSERVING_NODE_RANK",
    "HYBRIDSERVING_DRAIN_TIMEOUT_S", "HYBRIDSERVING_PORT", "HYBRIDSERVING_BOOTSTRAP_PORT",
    "HYBRIDSERVING_ENGINE_INFO_BOOTSTRAP_PORT", "HYBRIDSERVING_LAUNCHER_PORT", "HYBRIDSERVING_DIST_INIT_ADDR",
    ENV_ENGINE_API_KEY,  # the operator's engine calls and the router's use the derived key (core/enginekey.py)
    # The busy time the role-switch policy reads (core/rendering.py sets it to 1).
    "SGLANG_ENABLE_METRICS_DEVICE_TIMER",
})


def _check_env(spec: HybridServingSpec) -> Issues:
    for index, var in enumerate(spec.engine.env):
        if var.name in OWNED_ENV:
            yield _issue("engine-env-owned", f"spec.engine.env[{index}]",
                         f"{var.name} is set by the operator for each pod; a copy here would replace it",
                         f"remove {var.name} from spec.engine.env")
        elif var.name in ENV_SETTINGS and var.plain_value is not None:
            setting = ENV_SETTINGS[var.name]
            try:
                setting.read(var.plain_value)
            except ValueError as err:
                yield _issue("engine-env-setting", f"spec.engine.env[{index}].value", str(err),
                             f"set {var.name} to {setting.expected} (default {setting.default}), or remove it")


def _check_drain_timeout(spec: HybridServingSpec) -> Issues:
    """Both drains need more than the drain timeout allows: the controller's waits for the router
    to let go of the instance (`SwitchConfig.unroute_settle_s`), the launcher's for an idle window
    (`HYBRIDSERVING_IDLE_WINDOW_S`), each bounded by drainTimeoutSeconds."""
    setting = ENV_SETTINGS["HYBRIDSERVING_IDLE_WINDOW_S"]
    given = next((var.plain_value for var in spec.engine.env if var.name == setting.name), None)
    try:
        idle = float(setting.read(given))
    except ValueError:
        return  # engine-env-setting names it
    settle = SwitchConfig().unroute_settle_s
    least = max(settle, idle)
    timeout = spec.role_switch.drain_timeout_seconds
    if timeout <= least:
        yield _issue("role-switch-drain-timeout", "spec.roleSwitch.drainTimeoutSeconds",
                     f"drainTimeoutSeconds {timeout} leaves no time to drain even an idle engine: the switch "
                     f"waits {settle:g} s for the router to let go of it and the launcher {idle:g} s of idleness "
                     f"({setting.name}), so every switch aborts and restores the old role",
                     f"set spec.roleSwitch.drainTimeoutSeconds above {least:g} s (the default, 600, also waits "
                     "out long requests)")


def _check_model(spec: HybridServingSpec) -> Issues:
    for field, value in (("path", spec.model.path), ("servedModelName", spec.model.served_model_name)):
        if value is not None and value.startswith("-"):
            yield _issue("model-not-a-flag", f"spec.model.{field}",
                         f"{value!r} begins with '-': SGLang's parser reads it as a flag, not as the value",
                         f"set spec.model.{field} to a path or name that does not begin with '-'")


def _check_extra_args(spec: HybridServingSpec) -> Issues:
    placeholders = set(PLACEHOLDERS.values())
    args = spec.engine.extra_args
    for index, arg in enumerate(args):
        path = f"spec.engine.extraArgs[{index}]"
        if arg in placeholders:
            yield _issue("extra-args-placeholder", path,
                         f"{arg} is a placeholder the launcher fills with a per-pod value",
                         "remove it: the operator renders the flag that takes this value")
            continue
        resolution = sglang_options.resolve(arg)
        if resolution is None:
            continue  # a value, not a flag
        name = arg.split("=", 1)[0]
        if name in OWNED_FLAGS or name in _REJECTED_FLAGS or name in _DEPRECATED_FLAGS:
            resolution = sglang_options.Resolution(arg, name)  # named in full: the tables' own advice
        if resolution.ambiguous:
            yield _issue("extra-args-rejected-flag", path,
                         f"{resolution.token} abbreviates several SGLang {VERIFIED_SGLANG} flags "
                         f"({', '.join(resolution.ambiguous)}): the parser exits at startup",
                         "use the flag's full name")
            continue
        flag = resolution.flag
        if flag is None:
            yield _issue("extra-args-rejected-flag", path,
                         f"{resolution.token} is no flag of SGLang {VERIFIED_SGLANG}: the parser exits at startup",
                         "remove it, or check its spelling against `python -m sglang.launch_server --help`")
            continue
        spelled = flag if flag == name else f"{name} (read as {flag})"
        if flag in OWNED_FLAGS:
            yield _issue("extra-args-owned-flag", path,
                         f"{spelled} is rendered from the spec; a second copy overrides the planned layout",
                         f"remove it from extraArgs and set {OWNED_FLAGS[flag]}")
        elif flag in _REJECTED_FLAGS:
            yield _issue("extra-args-rejected-flag", path,
                         f"{spelled} makes SGLang {VERIFIED_SGLANG} exit at startup or fights the spec's layout",
                         _REJECTED_FLAGS[flag])
        elif flag in _DEPRECATED_FLAGS:
            yield _issue("extra-args-deprecated-flag", path, f"{spelled} is deprecated", _DEPRECATED_FLAGS[flag])
        elif (refused := sglang_options.value_refusal(flag, sglang_options.value_at(args, index))) is not None:
            yield _issue("extra-args-value", path,
                         f"{spelled} {refused}: SGLang {VERIFIED_SGLANG}'s parser exits at startup",
                         f"give {flag} a value it accepts, or remove it")
        elif flag == "--tokenizer-worker-num" and (sglang_options.int_value(args, flag) or 0) > 1:
            # Every engine gets --api-key from the launcher, and each tokenizer worker asserts there is
            # none (entrypoints/http_server.py:258-261): the server never comes up.
            yield _issue("extra-args-rejected-flag", path,
                         f"{spelled} above 1 starts SGLang {VERIFIED_SGLANG} in multi-tokenizer mode, which "
                         "refuses the --api-key the launcher always passes: every engine fails at startup",
                         "remove it, or set it to 1 (the fleet's engines are always started with --api-key)")
