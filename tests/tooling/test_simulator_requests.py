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

from hybridserving.api.profiles import PROFILES, resolve_profile
from hybridserving.core.resolution import auto_draft_shape
from hybridserving_engine.simulator.args import (
    FlagError,
    SimulatorOptions,
    parse_server_args,
    reserved_tokens,
    resolve_server_args,
)
from hybridserving_engine.simulator import validation
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
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


# ------------------------------------------------------------------ FastAPI's validation of the bodies

# In the cached wheel's interpreter (its pydantic is the pin SGLang runs with there), the request
# types are built from SGLang's own source: each field the simulator declares, with its annotation
# and default as SGLang writes them, `input_ids`' validator from `utils/field_validators.py`, and
# `CompletionRequest`'s max_tokens validator; a chat message is any object on both sides. The errors
# are compared as a set: the order of a union's alternatives is the one of the first equal union
# `typing` cached in the process, which depends on what it imported before.
_VALIDATE = r"""
import ast, importlib.util, json, os, sys
from dataclasses import dataclass, field
from typing import Annotated, Any, Dict, List, Optional, Union
from pydantic import BaseModel, Field, PlainValidator, TypeAdapter, ValidationError, field_validator

srt = os.path.join(importlib.util.find_spec("sglang").submodule_search_locations[0], "srt")
spec = importlib.util.spec_from_file_location("fv", os.path.join(srt, "utils", "field_validators.py"))
fv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fv)
request = json.load(sys.stdin)

def members(path, classes, names):
    source = open(os.path.join(srt, path)).read()
    lines = source.splitlines()
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name in classes:
            for item in node.body:
                name = item.target.id if isinstance(item, ast.AnnAssign) else getattr(item, "name", None)
                if name in names:
                    first = min([item.lineno] + [d.lineno for d in getattr(item, "decorator_list", [])])
                    found[name] = "\n".join(lines[first - 1:item.end_lineno])
    return "\n".join(found[n] for n in names)

namespace = dict(globals(), validate_optional_list_i64_1d_2d=fv.validate_optional_list_i64_1d_2d,
                 DEFAULT_MODEL_NAME="default")
exec("@dataclass\nclass GenerateReqInput:\n" + members("managers/io_struct.py", ["GenerateReqInput"],
     request["fields"]["GenerateReqInput"]), namespace)
exec("class CompletionRequest(BaseModel):\n" + members("entrypoints/openai/protocol.py",
     ["PDRoutingFields", "CompletionRequest"], request["fields"]["CompletionRequest"]), namespace)
exec("class ChatCompletionRequest(BaseModel):\n    messages: List[Dict[str, Any]]\n" + members(
     "entrypoints/openai/protocol.py", ["PDRoutingFields", "ChatCompletionRequest"],
     [n for n in request["fields"]["ChatCompletionRequest"] if n != "messages"]), namespace)
out = []
for kind, body in request["cases"]:
    if isinstance(body, dict) and set(body) == {"bytes"}:
        body = body["bytes"].encode()
    try:
        TypeAdapter(namespace[kind]).validate_python(body, from_attributes=True)
        out.append(None)
    except ValidationError as e:
        out.append(sorted(str({**err, "loc": ("body", *err["loc"])}) for err in e.errors(include_url=False)))
print(json.dumps(out))
"""

BAD = [None, 5, -1, 1.5, "s", True, [], [1], [1, "a"], [2**63], [[1], [2]], [[1], 2], [[1, "a"]], ["s"], [None],
       [{}], {}, {"k": 1}]
KINDS = (validation.GenerateReqInput, validation.CompletionRequest, validation.ChatCompletionRequest)


def _fields(kind: type) -> list[str]:
    return list(getattr(kind, "model_fields", None) or kind.__dataclass_fields__)


def test_the_bodies_fastapi_refuses_are_refused_with_pydantics_errors_under_sglangs_types() -> None:
    base = {"GenerateReqInput": {"text": "hi"}, "CompletionRequest": {"prompt": "hi"},
            "ChatCompletionRequest": {"messages": [{"role": "user", "content": "hi"}]}}
    cases: list[tuple[str, object]] = []
    for kind in KINDS:
        name = kind.__name__
        cases += [(name, {**base[name], field: value}) for field in _fields(kind) for value in BAD]
        # JSON's null is validated as None; only an empty body is missing (test_engine_contract.py).
        cases += [(name, body) for body in (None, [], "s", {"bytes": '{"text": "hi"}'}, {},
                                            {"stream": "maybe", "max_tokens": "x", "text": 1, "prompt": 1,
                                             "messages": 1, "input_ids": "x", "bootstrap_port": "p"})]
    fields = {kind.__name__: _fields(kind) for kind in KINDS}
    fields["CompletionRequest"].append("validate_max_tokens_positive")
    request = {"fields": fields, "cases": cases}
    expected = _in_wheel(_VALIDATE, request)
    assert isinstance(expected, list)
    refused = 0
    for (name, body), wheel in zip(cases, expected, strict=True):
        kind = getattr(validation, name)
        value = body["bytes"].encode() if isinstance(body, dict) and set(body) == {"bytes"} else body
        try:
            validation.validate_body(kind, value, endpoint="")
            simulated = None
        except validation.RequestValidationError as e:
            simulated = sorted(str(err) for err in e.errors)
            refused += 1
        assert simulated == wheel, (name, body)
    assert refused > len(cases) / 2


def test_a_refusal_reads_as_fastapis_validation_error_in_sglangs_error_response() -> None:
    # entrypoints/http_server.py:635-692: the exception's text, then its error list when that differs.
    handler = cited("entrypoints/http_server.py", 635, 692)
    assert "@app.exception_handler(RequestValidationError)" in handler
    assert 'message = f"{exc_str} {errors_str}"' in cited("entrypoints/http_server.py", 666, 671)
    assert "if media_type != \"application/json\":" in cited("entrypoints/http_server.py", 695, 707)
    for path, (file, function, line) in validation.ENDPOINTS.items():
        decorated = cited(f"entrypoints/{file}", line, line + 6)
        assert decorated.startswith(("@app.", "@router.")) and f'"{path}"' in decorated, path
        assert f"async def {function}(" in decorated, path
    endpoint = validation.endpoint_context("PUT", "/generate")
    with pytest.raises(validation.RequestValidationError) as refused:
        validation.validate_body(validation.GenerateReqInput, {"text": 5}, endpoint)
    errors = refused.value.errors
    assert sorted(e["loc"] for e in errors) == [("body", "text", "list[str]"), ("body", "text", "str")]
    text = ("2 validation errors:\n" + "".join(f"  {e}\n" for e in errors)
            + f'\n  File "{validation.SGLANG_ENTRYPOINTS}/http_server.py", line 928, in generate_request\n'
            '    PUT /generate')
    assert refused.value.message == f"{text} {errors}"
    with pytest.raises(validation.RequestValidationError) as media:
        validation.require_json_media("text/plain")
    assert media.value.message == (
        "1 validation error:\n  {'loc': ['header', 'content-type'], 'msg': \"Unsupported Media Type: Only "
        "'application/json' is allowed\", 'type': 'value_error'} [{'loc': ['header', 'content-type'], 'msg': "
        "\"Unsupported Media Type: Only 'application/json' is allowed\", 'type': 'value_error'}]")


# The control routes' bodies are msgspec Structs of `managers/io_struct.py`, read with pydantic
# through `utils/msgspec_utils.py`'s schema, both loaded from the wheel's files: `BaseReq` whole, each
# other Struct with the fields the simulator declares, as SGLang writes them.
_VALIDATE_STRUCTS = r"""
import ast, importlib.util, json, os, sys
from typing import List, Literal, Optional
import msgspec
from pydantic import TypeAdapter, ValidationError

srt = os.path.join(importlib.util.find_spec("sglang").submodule_search_locations[0], "srt")
spec = importlib.util.spec_from_file_location("msgspec_utils", os.path.join(srt, "utils", "msgspec_utils.py"))
mu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mu)
request = json.load(sys.stdin)
source = open(os.path.join(srt, "managers", "io_struct.py")).read()
lines = source.splitlines()
classes = {node.name: node for node in ast.parse(source).body if isinstance(node, ast.ClassDef)}
namespace = dict(msgspec=msgspec, List=List, Literal=Literal, Optional=Optional,
                 msgspec_struct_pydantic_core_schema=mu.msgspec_struct_pydantic_core_schema)
exec(ast.get_source_segment(source, classes["BaseReq"]), namespace)
for name, fields in request["fields"].items():
    node = classes[name]
    members = [ast.get_source_segment(source, item) for item in node.body
               if isinstance(item, ast.AnnAssign) and item.target.id in fields]
    assert len(members) == len(fields), name
    exec(lines[node.lineno - 1] + "\n" + "\n".join("    " + m for m in members), namespace)
out = {"base": [f.name for f in msgspec.structs.fields(namespace["BaseReq"])], "errors": []}
for kind, body in request["cases"]:
    try:
        TypeAdapter(namespace[kind]).validate_python(body, from_attributes=True)
        out["errors"].append(None)
    except ValidationError as e:
        out["errors"].append([str({**err, "loc": ("body", *err["loc"])}) for err in e.errors(include_url=False)])
print(json.dumps(out))
"""

STRUCTS = (validation.PdRoleSwitchReqInput, validation.PauseGenerationReqInput,
           validation.ContinueGenerationReqInput, validation.AbortReq)


def test_the_control_bodies_fastapi_refuses_are_refused_with_the_errors_of_sglangs_structs() -> None:
    fields = {kind.__name__: list(kind.__annotations__) for kind in STRUCTS}
    cases: list[tuple[str, object]] = []
    for kind in STRUCTS:
        name = kind.__name__
        cases += [(name, body) for body in (None, [], "s", 5, {}, {"unknown": 1}, {"rid": "r", "http_worker_ipc": 1})]
        cases += [(name, {field: value}) for field in ["rid", *fields[name]]
                  for value in (*BAD, "prefill", "retract", "in_place", "yes", "off", 0, 2.0)]
    expected = _in_wheel(_VALIDATE_STRUCTS, {"fields": fields, "cases": cases})
    assert isinstance(expected, dict)
    assert expected["base"] == list(validation.BaseReq.__annotations__)
    refused = 0
    for (name, body), wheel in zip(cases, expected["errors"], strict=True):
        try:
            validation.validate_body(getattr(validation, name), body, endpoint="")
            simulated = None
        except validation.RequestValidationError as e:
            simulated = [str(err) for err in e.errors]
            refused += 1
        assert simulated == wheel, (name, body)
    assert refused > len(cases) / 2


def test_the_control_routes_are_the_wheels() -> None:
    """What the simulator's control routes mirror, as the wheel's source says it."""
    # /server_info's top level is `resolved_dict()`, whose enable_dp_attention is the attention-DP width.
    assert "result = server_args.resolved_dict()" in cited("utils/common.py", 3584, 3593)
    assert 'resolved["enable_dp_attention"] = resolving_view(self).attn_dp_size > 1' in cited(
        "server_args.py", 332, 332)
    assert '"num_retractions": recv_obj.retraction_counts[i],' in cited("managers/tokenizer_manager.py", 2507, 2513)
    # /pd_role_switch: a prepare checks, answers "ready" and switches nothing.
    prepare = cited("disaggregation/role_switch.py", 113, 121)
    assert "if recv_req.prepare_only:" in prepare and 'message="ready",' in prepare
    assert "safe_to_restore=True," in prepare
    answer = cited("managers/tokenizer_control_mixin.py", 944, 958)
    assert "if all_success and not obj.prepare_only:" in answer and 'elif all_success:\n            msg = "ready"' in (
        answer)
    assert "msgspec_to_builtins(result)," in cited("entrypoints/http_server.py", 1646, 1649)
    # /abort_request: an AbortReq, 200 with no body; the tokenizer's gate, the scheduler's prefix match.
    route = cited("entrypoints/http_server.py", 1721, 1731)
    assert "async def abort_request(obj: Annotated[AbortReq, Body()], request: Request):" in route
    assert "return Response(status_code=200)" in route
    gate = cited("managers/tokenizer_manager.py", 2241, 2260)
    assert "if not abort_all and not rid:" in gate and "elif get_serving().tokenizer_worker_num == 1:" in gate
    assert "req.rid.startswith(recv_req.rid)" in cited("managers/scheduler.py", 5675, 5810)
    assert 'self.rid = ""' in cited("managers/io_struct.py", 2285, 2296)
    # /pause_generation and /continue_generation take their Structs as the body.
    for line, kind in ((1831, "PauseGenerationReqInput"), (1844, "ContinueGenerationReqInput")):
        handler = cited("entrypoints/http_server.py", line, line + 4)
        assert f"obj: Annotated[{kind}, Body()], request: Request" in handler
    assert 'mode: Literal["abort", "retract", "in_place"] = "abort"' in cited("managers/io_struct.py", 1927, 1946)
    assert "torch_empty_cache: bool = True" in cited("managers/io_struct.py", 1949, 1955)


def test_a_client_that_leaves_has_its_request_aborted_as_in_the_wheel() -> None:
    """`server._complete` and `server._stream`: when the tokenizer manager looks for a client that
    left, and what aborts the request it finds gone."""
    from hybridserving_engine.simulator import server

    assert "SGLANG_REQUEST_STATE_WAIT_TIMEOUT = EnvInt(4)" in cited("environ.py", 1679, 1679)
    assert "SGLANG_FORCE_STREAM_INTERVAL = EnvInt(50)" in cited("environ.py", 688, 688)
    assert (server.REQUEST_STATE_WAIT_TIMEOUT_S, server.FORCE_STREAM_INTERVAL) == (4, 50)
    assert "len(req.output_ids) % self.default_force_stream_interval == 0" in cited(
        "managers/scheduler_components/output_streamer.py", 474, 477)
    for first, last, kind in ((1956, 1974, 1), (2061, 2072, 3)):
        wait = cited("managers/tokenizer_manager.py", first, last)
        assert "await request.is_disconnected()" in wait and "self.abort_request(obj.rid)" in wait
        assert f"Request is disconnected from the client side (type {kind}). Abort request {{obj.rid=}}" in wait
    assert "except BaseException:" in cited("managers/tokenizer_manager.py", 958, 966)
    release = cited("managers/tokenizer_manager.py", 3850, 3874)
    assert "if state.dispatched:" in release and "self.abort_request(rid)" in release
    assert "background=_global_state.tokenizer_manager.create_abort_task(obj)," in cited(
        "entrypoints/http_server.py", 977, 981)
    assert "await asyncio.sleep(2)" in cited("managers/tokenizer_manager.py", 2427, 2438)


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


def test_a_request_for_no_tokens_ends_as_the_wheel_ends_it() -> None:
    """What `SimulatedEngine._emit_first_output` and the simulator's finish reason mirror: no token is
    sampled for `max_new_tokens` 0, the length cap ends it at 0 and the output is cut there, the
    tokenizer manager observes TTFT on that output, and a PD prefill ends every request at length 0."""
    assert "return self.sampling_params.max_new_tokens == 0 and spec_alg is None" in cited(
        "managers/schedule_batch.py", 1501, 1506)
    assert "if len(self.output_ids) >= self.sampling_params.max_new_tokens:" in cited(
        "managers/schedule_batch.py", 2038, 2042)
    assert "self.finished_len = self.sampling_params.max_new_tokens" in cited("managers/schedule_batch.py", 2038, 2042)
    assert "return self.output_ids[: self.finished_len]" in cited("managers/schedule_batch.py", 1509, 1513)
    assert "if not forward_batch.is_prefill_only:" in cited("managers/tp_worker.py", 742, 751)
    assert "torch.zeros(" in cited("managers/tp_worker.py", 742, 751)
    ttft = cited("managers/tokenizer_manager.py", 3235, 3246)
    assert "and self.disaggregation_mode != DisaggregationMode.PREFILL" in ttft
    assert "observe_time_to_first_token(" in ttft
    assert "req.finished_reason = FINISH_LENGTH(length=0)" in cited("disaggregation/prefill.py", 1225, 1226)


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
        arch = resolve_profile(profile)
        assert reserved_tokens(parse_server_args(["--model-path", "m", *argv]), arch) == expected, (profile, argv)
        if algorithm is not None and "--speculative-num-steps" not in argv:
            assert (steps, topk, draft) == auto_draft_shape(arch, algorithm), (profile, argv)


_BASE = ["--model-path", "m", "--tp-size", "8", "--disaggregation-mode", "decode", "--max-running-requests", "128"]
_EAGLE_TREE = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
               "--speculative-num-draft-tokens", "8"]
# Draft shapes given whole, in part and as trees, with and without a backend chosen outright, and
# the algorithms that exclude attention DP.
DRAFT_SETTINGS = [
    ["--speculative-algorithm", "EAGLE"],
    ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3"],
    ["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "1"],
    ["--speculative-algorithm", "NEXTN", "--speculative-num-draft-tokens", "4"],
    ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4"],
    _EAGLE_TREE,
    [*_EAGLE_TREE, "--attention-backend", "triton"],
    [*_EAGLE_TREE, "--decode-attention-backend", "triton"],
    ["--speculative-algorithm", "NGRAM"],
    ["--speculative-algorithm", "NGRAM", "--speculative-ngram-max-bfs-breadth", "1"],
    ["--speculative-algorithm", "NGRAM", "--speculative-ngram-max-bfs-breadth", "1", "--attn-dp-size", "8"],
    ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "m", "--attn-dp-size", "8"],
    ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
     "--speculative-num-draft-tokens", "3", "--attn-dp-size", "8"],
]


@pytest.mark.parametrize("gpu", ["H200", "B200"])
def test_the_simulator_refuses_the_speculative_settings_the_wheel_refuses_with_its_error(gpu: str) -> None:
    """`core.resolution.draft_refusals`, which the operator's layout rules read too: the simulator
    starts where the wheel resolves and fails with the wheel's own exception where it refuses."""
    cases = [(profile, [*_BASE, *argv]) for profile in PROFILES for argv in DRAFT_SETTINGS]
    results = resolve_many([with_model(argv, profile) for profile, argv in cases], GPUS[gpu])
    refused = 0
    for (profile, argv), result in zip(cases, results, strict=True):
        options = SimulatorOptions(profile=profile, time_scale=1.0, startup_seconds=None, faults="", gpu_type=gpu)
        try:
            resolve_server_args(parse_server_args(argv), options)
            simulated = None
        except FlagError as exc:
            simulated = str(exc)
        if isinstance(result, Resolved):
            assert simulated is None, (profile, argv, simulated)
            continue
        refused += 1
        assert simulated is not None, (profile, argv, result)
        assert simulated.startswith(f"{result.type}: {result.message} ("), (profile, argv, simulated, result)
    assert refused >= 2 * len(PROFILES)
