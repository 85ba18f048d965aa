"""The simulator's request checks against SGLang 0.5.23's own code, from the wheel in the tool cache.

Each check the simulator mirrors is compared with what the wheel computes, and the source lines
the simulator cites are read from the wheel, so a cited line that moves or changes fails here.
"""

from __future__ import annotations

import json
import subprocess
from functools import cache
from pathlib import Path

import pytest

from hybridserving.api.profiles import PROFILES
from hybridserving_engine.simulator.args import AUTO_DRAFT_SHAPE, parse_server_args, reserved_tokens
from hybridserving_engine.simulator.contract import generate_contract_error
from support.sglang_parser import SGLangParserUnavailable, sglang_python
from support.sglang_resolver import GPUS, Resolved, resolve_many, with_model


@cache
def _srt() -> Path:
    """`sglang/srt/` of the cached wheel."""
    try:
        python = sglang_python()
    except SGLangParserUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    root = subprocess.run([str(python), "-c", "import importlib.util; "
                           "print(importlib.util.find_spec('sglang').submodule_search_locations[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    return Path(root) / "srt"


def cited(path: str, first: int, last: int) -> str:
    """Lines `first` to `last` of `sglang/srt/<path>`, as a citation `path:first-last` names them."""
    return "".join((_srt() / path).read_text().splitlines(keepends=True)[first - 1:last])


def _in_wheel(script: str, stdin: object) -> object:
    """Run `script` with the cached wheel's interpreter; it reads JSON on stdin and prints JSON."""
    proc = subprocess.run([str(sglang_python()), "-c", script], input=json.dumps(stdin), capture_output=True,
                          text=True, check=True)
    return json.loads(proc.stdout)


# ------------------------------------------------------------------ /generate's JSON contract

# The generated decoder imports msgspec only; it is loaded from its file, without `sglang/__init__.py`.
_CONTRACT = """
import importlib.util, json, os, sys
root = importlib.util.find_spec("sglang").submodule_search_locations[0]
spec = importlib.util.spec_from_file_location("api_types", os.path.join(root, "api", "v1", "api_types.py"))
mod = sys.modules["api_types"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
bodies = json.load(sys.stdin)
fields = {"generate": list(mod.GenerateRequest.__struct_fields__),
          "sampling": list(mod.SamplingParams.__struct_fields__)}
if bodies is None:
    print(json.dumps(fields))
    sys.exit()
out = []
for body in bodies:
    try:
        mod.GenerateRequest.from_json_value(body)
        out.append(None)
    except mod.JsonContractError as e:
        out.append(str(e))
    except TypeError:
        out.append("TypeError")
print(json.dumps(out))
"""

VALUES = [None, True, 0, -1, 1.5, "s", [], [1], [1.5], ["s"], [None], [True], [[1]], [["s"]], [[None]], [{}],
          [{"url": "u"}], {}, {"url": "u"}, {"url": "u", "fps": "x"}, {"x": 1}, {"k": "v"}, {"k": 1},
          {"enabled": True, "x": 1}, {"protocol_version": "1", "message_id": "m", "actions": [{"action_id": 1}]}]


def test_generate_refuses_what_the_wheels_json_contract_refuses_with_its_text() -> None:
    # entrypoints/http_server.py:937-939 run entrypoints/api_contract.py:12-18 on every /generate body.
    assert "contract_error = generate_contract_error(await request.json())" in cited(
        "entrypoints/http_server.py", 937, 939)
    gate = cited("entrypoints/api_contract.py", 12, 18)
    assert "GenerateRequest.from_json_value(body)" in gate and "return str(e)" in gate
    fields = _in_wheel(_CONTRACT, None)
    assert isinstance(fields, dict)
    bodies: list[object] = [{"text": "hi", field: value} for field in fields["generate"] for value in VALUES]
    bodies += [{"text": "hi", "sampling_params": {field: value}} for field in fields["sampling"] for value in VALUES]
    bodies += [{"text": "hi", "sampling_params": [{"max_new_tokens": 1}, {"max_tokens": 1}]},
               {"text": "hi", "no_such_field": 1, "stream": "yes"}, {"text": "hi", "stream": 1, "rid": 2},
               {"input_ids": [[1], "x"]}, {"image_data": [[{"url": "u", "x": 1}]]}, {"mm_hashes": [["a"], "b"]}]
    expected = _in_wheel(_CONTRACT, bodies)
    assert isinstance(expected, list)
    compared = 0
    for body, wheel in zip(bodies, expected, strict=True):
        if wheel != "TypeError":  # a required field left out: outside the gate, not modelled
            assert generate_contract_error(body) == wheel, body
            compared += 1
    assert compared > 0.9 * len(bodies)


# ------------------------------------------------------------------ EAGLE's reserved slots

SPECULATIVE = [
    [],
    ["--speculative-algorithm", "EAGLE"],
    ["--speculative-algorithm", "EAGLE3"],
    ["--speculative-algorithm", "NEXTN"],
    ["--speculative-algorithm", "STANDALONE"],
    ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
     "--speculative-num-draft-tokens", "9"],
    ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "2", "--speculative-eagle-topk", "4",
     "--speculative-num-draft-tokens", "6", "--attention-backend", "triton"],
    ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "2", "--speculative-eagle-topk", "2",
     "--speculative-num-draft-tokens", "7", "--attention-backend", "triton"],
]


def test_the_draft_slots_reserved_against_the_context_are_the_wheels() -> None:
    # managers/utils.py:484-500 (compute_num_reserved_tokens), added to the prompt's length by
    # managers/tokenizer_manager.py:1333-1335; from the wheel's resolved draft shape.
    reserve = cited("managers/utils.py", 484, 500)
    assert "if not algorithm.is_eagle():\n        return 0" in reserve
    assert "spec.speculative_eagle_topk * spec.speculative_num_steps,\n        max_speculative_num_draft_tokens()," in (
        reserve)
    assert "input_token_num += self.num_reserved_tokens" in cited("managers/tokenizer_manager.py", 1333, 1335)
    assert '"NEXTN" or speculative_algorithm == "EAGLE"' in cited("arg_groups/speculative_hook.py", 109, 115)
    eagle = cited("speculative/spec_info.py", 102, 109)
    assert "SpeculativeAlgorithm.EAGLE,\n            SpeculativeAlgorithm.EAGLE3," in eagle
    assert "return (3, 1, 4)" in cited("arg_groups/speculative_hook.py", 1430, 1462)
    cases = [(profile, argv) for profile in PROFILES for argv in SPECULATIVE]
    results = resolve_many([with_model(["--model-path", "m", *argv], profile) for profile, argv in cases],
                           GPUS["H200"])
    for (profile, argv), result in zip(cases, results, strict=True):
        assert isinstance(result, Resolved), (profile, argv, result)
        algorithm = result["speculative_algorithm"]
        steps, topk, draft = (result[f"speculative_{k}"] for k in ("num_steps", "eagle_topk", "num_draft_tokens"))
        # spec_info.py:102-109: EAGLE and EAGLE3 (NEXTN resolves to EAGLE; FROZEN_KV_MTP is Gemma4's drafts only).
        expected = max(topk * steps, draft) if algorithm in ("EAGLE", "EAGLE3") else 0
        assert reserved_tokens(parse_server_args(["--model-path", "m", *argv])) == expected, (profile, argv)
        if algorithm is not None and "--speculative-num-steps" not in argv:
            assert (steps, topk, draft) == AUTO_DRAFT_SHAPE, (profile, argv)
