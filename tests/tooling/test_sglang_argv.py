"""Every argv the operator renders parses with SGLang 0.5.23's own argument parser.

The cases are every example manifest and every built-in profile under the layouts it is
typically served with, both roles, every node rank. Each argv must parse (no unknown,
ambiguous or invalid flag, no deprecation warning), and the parsed values must be the ones
the spec asked for. A missing parser install fails the test rather than skipping it: run
tools/sglang-parser.sh.
"""

from __future__ import annotations

from typing import Any

import pytest

from hybridserving.api.v1alpha1 import ROLES, HybridServingSpec, Role
from hybridserving.core.flags import in_place_role_switch, render_argv
from hybridserving.core.layout import OWNED_FLAGS, validate
from hybridserving.api.profiles import PROFILES
from support.sglang_fleets import EXAMPLES, LEADER, PORTS, example_specs, profile_specs
from hybridserving.core.sglang_options import OPTIONS, resolve
from support.sglang_parser import (
    SGLangArgs,
    SGLangArgvError,
    SGLangParserUnavailable,
    option_strings,
    parse_many,
    sglang_python,
)

SPECS = {**example_specs(), **profile_specs()}
CASES: list[tuple[str, HybridServingSpec, Role, int]] = [
    (name, spec, role, rank)
    for name, spec in SPECS.items()
    for role in ROLES
    for rank in range(spec.role(role).nodes_per_instance)
]


def _argv(spec: HybridServingSpec, role: Role, rank: int) -> list[str]:
    return render_argv(spec, role, node_rank=rank, dist_init_addr=LEADER, ports=PORTS)


@pytest.fixture(scope="module")
def parsed() -> dict[tuple[str, Role, int], SGLangArgs | SGLangArgvError]:
    try:
        sglang_python()
    except SGLangParserUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    results = parse_many(_argv(spec, role, rank) for _, spec, role, rank in CASES)
    return {(name, role, rank): result for (name, _, role, rank), result in zip(CASES, results, strict=True)}


def test_cases_cover_every_profile_and_example() -> None:
    for profile in PROFILES:
        assert sum(name.startswith(f"{profile}/") for name in SPECS) >= 5, profile
    assert sum(name.startswith("example/") for name in SPECS) == len(list(EXAMPLES.glob("*.yaml")))
    assert any(rank > 0 for _, _, _, rank in CASES)


def _expected(spec: HybridServingSpec, role: Role, rank: int) -> dict[str, Any]:
    """What the parsed namespace must hold, derived from the spec independently of the renderer."""
    rs = spec.role(role)
    layout = rs.layout
    speculative = rs.speculative
    # Mounted weights (a claim, an image, a node cache) load from the mount and keep serving under
    # model.path; a hub source without cache lets the engine download the hub id itself.
    weights = spec.model.weights
    mounted = weights is not None and not (weights.uri.startswith("hf://") and weights.cache == "None")
    model_path = spec.model.path if weights is None else "/models/weights" if mounted else weights.uri[len("hf://"):]
    expected: dict[str, Any] = {
        "model_path": model_path,
        "host": "0.0.0.0",
        "port": PORTS.http,
        "tp_size": layout.tp,
        "pp_size": layout.pp,
        "attn_dp_size": layout.attn_dp,
        "dp_size": 1,
        "attn_cp_size": layout.attn_cp,
        "enable_prefill_cp": layout.attn_cp > 1,
        "cp_strategy": layout.cp_strategy if layout.attn_cp > 1 else None,
        "enable_dsa_cache_layer_split": layout.layer_split,
        "dcp_size": layout.dcp,
        "dcp_comm_backend": layout.dcp_comm_backend,
        "dcp_replicate_q_proj": layout.replicate_q_proj if layout.dcp > 1 else None,
        "ep_size": layout.ep,
        "moe_a2a_backend": layout.moe_a2a_backend or "none",
        "nnodes": rs.nodes_per_instance,
        "node_rank": rank,
        "dist_init_addr": f"{LEADER}:{PORTS.dist_init}" if rs.nodes_per_instance > 1 else None,
        "disaggregation_mode": role,
        "disaggregation_transfer_backend": spec.transfer.backend,
        "disaggregation_bootstrap_port": PORTS.bootstrap,
        "engine_info_bootstrap_port": PORTS.engine_info_bootstrap,
        "enable_pd_role_switch": in_place_role_switch(spec),
        "enable_metrics": True,
        "speculative_algorithm": speculative.algorithm if speculative else None,
        "speculative_num_steps": speculative.num_steps if speculative else None,
        "speculative_eagle_topk": speculative.eagle_topk if speculative else None,
        "speculative_num_draft_tokens": speculative.num_draft_tokens if speculative else None,
        "speculative_draft_model_path": speculative.draft_model_path if speculative else None,
        "mem_fraction_static": rs.mem_fraction_static,
        "max_running_requests": rs.max_running_requests,
        "page_size": rs.page_size,
        "kv_cache_dtype": rs.kv_cache_dtype,
        "disable_radix_cache": role == "prefill" and not rs.prefix_caching,
    }
    if spec.model.served_model_name:
        expected["served_model_name"] = spec.model.served_model_name
    elif mounted:
        expected["served_model_name"] = spec.model.path
    return expected


@pytest.mark.parametrize(("name", "role", "rank"), [(n, r, k) for n, _, r, k in CASES],
                         ids=[f"{n}-{r}-{k}" for n, _, r, k in CASES])
def test_rendered_argv_parses_to_the_spec(parsed: dict, name: str, role: Role, rank: int) -> None:
    result = parsed[(name, role, rank)]
    assert isinstance(result, SGLangArgs), str(result)
    assert not [line for line in result.warnings if "deprecat" in line.lower()], result.warnings
    expected = _expected(SPECS[name], role, rank)
    got = {key: result.get(key, "<missing>") for key in expected}
    assert got == expected
    assert result.ib_devices == _expected_ib_devices(SPECS[name], role)


def _expected_ib_devices(spec: HybridServingSpec, role: Role) -> str | dict[str, str] | None:
    """What SGLang's connectors must read from the flag: every GPU of the pod gets its devices."""
    devices, per_gpu = spec.transfer.ib_devices, spec.transfer.ib_devices_per_gpu
    if not devices:
        return None
    if per_gpu is None:
        return ",".join(devices)
    return {str(gpu): ",".join(devices[gpu * per_gpu:(gpu + 1) * per_gpu])
            for gpu in range(spec.role(role).gpus_per_pod)}


def test_cases_include_shared_and_per_gpu_devices() -> None:
    assert any(s.transfer.ib_devices and s.transfer.ib_devices_per_gpu is None for s in SPECS.values())
    assert any(s.transfer.ib_devices_per_gpu for s in SPECS.values())


def test_extra_args_reach_the_parser() -> None:
    """A flag the 0.5.23 parser rejects in extraArgs fails here, as it would in the pod."""
    spec = HybridServingSpec.model_validate({
        "model": {"path": "org/m", "profile": "deepseek-v3"},
        "engine": {"extraArgs": ["--cuda-graph-max-bs", "8"]},
        "prefill": {"layout": {"tp": 8}},
        "decode": {"layout": {"tp": 8}},
    })
    (result,) = parse_many([render_argv(spec, "decode")])
    assert isinstance(result, SGLangArgvError)
    assert "ambiguous option: --cuda-graph-max-bs" in result.message
    assert any(issue.rule == "extra-args-rejected-flag" for issue in validate(spec))


def test_the_fleet_key_the_launcher_appends_is_the_api_key() -> None:
    """The launcher appends `--api-key <key>` from the pod's environment after the rendered argv
    (hybridserving_engine/launcher.py): SGLang reads it as its API key, and no admin key."""
    spec = HybridServingSpec.model_validate({
        "model": {"path": "org/m", "profile": "deepseek-v3"},
        "prefill": {"layout": {"tp": 8}},
        "decode": {"layout": {"tp": 8}},
    })
    (result,) = parse_many([render_argv(spec, "decode") + ["--api-key", "0123abcd" * 8]])
    assert isinstance(result, SGLangArgs), str(result)
    assert (result["api_key"], result["admin_api_key"]) == ("0123abcd" * 8, None)


# Abbreviations and spellings of owned and free flags, as an attacker or a typo writes them.
ABBREVIATIONS = (
    ["--disaggregation-mo", "decode"], ["--tp-si", "4"], ["--hos", "127.0.0.1"], ["--por", "1"], ["--por=1"],
    ["--mem-fraction-st", "0.5"], ["--served-model-na", "x"], ["--dcp-size=2"], ["--trust-remote-co"],
    ["--mod", "x"], ["--enable-pd-role"], ["--kv-cache-dt", "fp8_e4m3"], ["--trust-remote-code"],
)


def test_the_operator_knows_every_option_of_the_parser() -> None:
    """The operator's copy of the option list is the pinned parser's, so it resolves prefixes alike."""
    assert sorted(OPTIONS) == option_strings()


ABBREVIATION_SPEC = HybridServingSpec.model_validate({
    "model": {"path": "org/m", "profile": "deepseek-v3"},
    "prefill": {"layout": {"tp": 8}},
    "decode": {"layout": {"tp": 8}},
})


@pytest.fixture(scope="module")
def abbreviations_parsed() -> list[SGLangArgs | SGLangArgvError]:
    """The bare decode argv, then the argv with each abbreviation appended, in one parser run."""
    bare = render_argv(ABBREVIATION_SPEC, "decode")
    return parse_many([bare] + [bare + extra for extra in ABBREVIATIONS])


@pytest.mark.parametrize("case", range(len(ABBREVIATIONS)), ids=lambda i: " ".join(ABBREVIATIONS[i]))
def test_extra_args_resolve_as_the_parser_reads_them(abbreviations_parsed: list, case: int) -> None:
    """What `resolve` calls owned, ambiguous or free, SGLang's parser reads the same way.

    The owned-flag rule fires exactly when the parser lets the token set a flag the spec
    renders; an ambiguous abbreviation is one the parser exits on.
    """
    extra = ABBREVIATIONS[case]
    bare, result = abbreviations_parsed[0], abbreviations_parsed[case + 1]
    assert not isinstance(bare, SGLangArgvError)
    resolution = resolve(extra[0])
    assert resolution is not None
    spec = HybridServingSpec.model_validate({**ABBREVIATION_SPEC.to_wire(), "engine": {"extraArgs": extra}})
    owned = [i for i in validate(spec) if i.rule == "extra-args-owned-flag"]
    if resolution.ambiguous:
        assert isinstance(result, SGLangArgvError) and "ambiguous option" in result.message
        assert not owned
        return
    assert not isinstance(result, SGLangArgvError), result
    assert resolution.flag is not None
    dest = resolution.flag.lstrip("-").replace("-", "_")
    assert dest in result
    assert {k for k in result if result[k] != bare[k]} <= {dest}, "the token set another flag than resolved"
    assert bool(owned) == (resolution.flag in OWNED_FLAGS)
