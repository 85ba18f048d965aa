"""The sglang argv harness must be SGLang's real parser, not a look-alike.

Each case below only comes out this way when argparse runs on sglang 0.5.23's
full flag set: the ambiguity needs both ``--cuda-graph-max-bs-decode`` and
``--cuda-graph-max-bs-prefill`` to exist, the unknown flag needs the real set to
lack it, the choice lists are SGLang's. A missing install fails these tests
(it does not skip them): run ``tools/sglang-parser.sh``.
"""

from __future__ import annotations

import pytest

from support import sglang_parser
from support.sglang_parser import (
    SGLangArgs,
    SGLangArgvError,
    SGLangParserUnavailable,
    parse_many,
    parse_with_sglang,
)

BASE = ["--model-path", "x"]

CASES = {
    "decode_dcp": BASE + ["--tp-size", "8", "--dcp-size", "4", "--disaggregation-mode", "decode"],
    "ambiguous": BASE + ["--cuda-graph-max-bs", "8"],
    "unknown": BASE + ["--prefill-round-robin-balance"],
    "bad_choice": BASE + ["--cp-strategy", "foo"],
    "nixl": BASE + ["--disaggregation-transfer-backend", "nixl"],
    "bad_int": BASE + ["--tp-size", "eight"],
    "alias": BASE + ["--tensor-parallel-size", "4", "--decode-context-parallel-size", "2"],
    "deprecated": BASE + ["--dp-size", "8", "--enable-dp-attention"],
    "ib_shared": BASE + ["--disaggregation-ib-device", "mlx5_0,mlx5_1"],
    "ib_per_gpu": BASE + ["--disaggregation-ib-device", '{"0":"mlx5_0,mlx5_1","1":"mlx5_2"}'],
    "ib_bad_map": BASE + ["--disaggregation-ib-device", '{"gpu0":"mlx5_0"}'],
    "prefill_cp": BASE
    + ["--disaggregation-mode", "prefill", "--enable-prefill-cp", "--cp-strategy", "zigzag", "--attn-cp-size", "4"],
}


@pytest.fixture(scope="module")
def results() -> dict[str, SGLangArgs | SGLangArgvError]:
    missing = None
    try:
        sglang_parser.sglang_python()
    except SGLangParserUnavailable as exc:
        missing = str(exc)
    if missing:
        pytest.fail(missing, pytrace=False)
    names = list(CASES)
    return dict(zip(names, parse_many(CASES[name] for name in names), strict=True))


def _ok(results: dict, name: str) -> SGLangArgs:
    result = results[name]
    assert isinstance(result, SGLangArgs), f"{name}: {result}"
    return result


def _error(results: dict, name: str) -> SGLangArgvError:
    result = results[name]
    assert isinstance(result, SGLangArgvError), f"{name} parsed but should not: {CASES[name]}"
    return result


def test_valid_decode_with_dcp_parses(results):
    args = _ok(results, "decode_dcp")
    assert args["model_path"] == "x"
    assert args["tp_size"] == 8
    assert args["dcp_size"] == 4
    assert args["disaggregation_mode"] == "decode"
    assert args.warnings == []


def test_prefix_shared_by_two_flags_is_ambiguous(results):
    message = _error(results, "ambiguous").message
    assert message.startswith("ambiguous option: --cuda-graph-max-bs could match")
    assert "--cuda-graph-max-bs-decode" in message
    assert "--cuda-graph-max-bs-prefill" in message


def test_unknown_flag_is_rejected(results):
    assert _error(results, "unknown").message == (
        "unrecognized arguments: --prefill-round-robin-balance"
    )


def test_value_outside_choices_is_rejected(results):
    message = _error(results, "bad_choice").message
    assert message.startswith("argument --cp-strategy: invalid choice: 'foo'")
    assert "'zigzag'" in message and "'interleave'" in message


def test_value_of_wrong_type_is_rejected(results):
    assert "invalid int value: 'eight'" in _error(results, "bad_int").message


def test_ib_devices_are_read_by_sglangs_connector_code(results):
    assert _ok(results, "ib_shared").ib_devices == "mlx5_0,mlx5_1"
    assert _ok(results, "ib_per_gpu").ib_devices == {"0": "mlx5_0,mlx5_1", "1": "mlx5_2"}
    assert _ok(results, "decode_dcp").ib_devices is None
    assert _error(results, "ib_bad_map").message.startswith("parse_ib_device_config: Invalid format")


def test_nixl_transfer_backend_parses(results):
    args = _ok(results, "nixl")
    assert args["disaggregation_transfer_backend"] == "nixl"


def test_long_aliases_land_on_the_same_fields(results):
    args = _ok(results, "alias")
    assert (args["tp_size"], args["dcp_size"]) == (4, 2)


def test_deprecated_flag_parses_and_reports_its_warning(results):
    args = _ok(results, "deprecated")
    assert args["enable_dp_attention"] is True
    assert any("--enable-dp-attention" in line and "deprecated" in line for line in args.warnings)


def test_prefill_context_parallel_flags_parse(results):
    args = _ok(results, "prefill_cp")
    assert args["enable_prefill_cp"] is True
    assert (args["cp_strategy"], args["attn_cp_size"]) == ("zigzag", 4)


def test_defaults_are_sglangs(results):
    # Values read from the 0.5.23 wheel; nothing here is computed from torch.
    args = _ok(results, "nixl")
    assert args["host"] == "127.0.0.1"
    assert args["port"] == 30000
    assert args["disaggregation_mode"] == "null"
    assert args["disaggregation_bootstrap_port"] == 8998
    assert args["load_balance_method"] == "auto"
    assert args["dcp_comm_backend"] is None


def test_single_argv_raises_with_the_parser_message(results):
    with pytest.raises(SGLangArgvError) as caught:
        parse_with_sglang(CASES["unknown"])
    assert caught.value.argv == CASES["unknown"]
    assert "unrecognized arguments" in str(caught.value)
    assert parse_with_sglang(CASES["nixl"])["disaggregation_transfer_backend"] == "nixl"


def test_missing_install_names_the_installer(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDSERVING_CACHE", str(tmp_path))
    with pytest.raises(SGLangParserUnavailable, match="tools/sglang-parser.sh"):
        parse_with_sglang(BASE)


def test_stubbed_torch_cannot_decide_a_parse():
    """Once armed, any use of the torch/triton placeholders voids the run.

    It must escape argparse's ``except (TypeError, ValueError)`` around type
    conversion, or a type function touching torch would read as a bad value.
    """
    assert not issubclass(sglang_parser._StubTouched, Exception)
    placeholder = sglang_parser._Placeholder("torch.cuda.is_available()")
    saved = dict(sglang_parser._STATE)
    sglang_parser._STATE.update(armed=True, touched=[])
    try:
        for use in (bool, int, lambda p: p.device, lambda p: p(), lambda p: -p):
            with pytest.raises(sglang_parser._StubTouched):
                use(placeholder)
        with pytest.raises(sglang_parser._StubTouched):
            sglang_parser._jsonable({"value": [placeholder]})
    finally:
        sglang_parser._STATE.clear()
        sglang_parser._STATE.update(saved)


def test_the_simulators_flag_table_is_the_wheels_parser():
    """The SGLang simulator accepts exactly these flags (and exits 2 on any other), so the table
    must be what `sglang serve`'s parser holds; regenerate it with
    `python -m support.sglang_parser --dump-flags` from the cache venv."""
    from hybridserving.contract import sglang_flag_values, sglang_flags

    try:
        table = sglang_parser.dump_flags()
    except SGLangParserUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    assert table["flags"] == sglang_flags()
    assert table["values"] == sglang_flag_values()


def test_extra_args_values_are_refused_exactly_where_the_parser_exits():
    """The value check of engine.extraArgs (rule extra-args-value) against the wheel's parser: for
    every flag with a checked value, a good value and a bad one, the operator refuses exactly the
    argvs the parser rejects."""
    from hybridserving.contract import sglang_flag_values
    from hybridserving.core import sglang_options

    samples = []
    for flag, accepts in sorted(sglang_flag_values().items()):
        if "choices" in accepts:
            samples += [(flag, accepts["choices"][-1]), (flag, "not-a-choice")]
        else:
            samples += [(flag, "8"), (flag, "eight")]
            if accepts["type"] == "float":
                samples.append((flag, "0.5"))
    try:
        parsed = parse_many(BASE + [flag, value] for flag, value in samples)
    except SGLangParserUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    checked = 0
    for (flag, value), result in zip(samples, parsed, strict=True):
        refused = sglang_options.value_refusal(flag, value)
        value_error = isinstance(result, SGLangArgvError) and "invalid" in result.message and flag in result.message
        assert (refused is not None) == value_error, (flag, value, refused, result)
        checked += refused is not None
    assert checked > 100
