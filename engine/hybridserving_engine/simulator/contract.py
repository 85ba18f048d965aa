"""`/generate`'s JSON contract gate as SGLang 0.5.23 runs it (`entrypoints/api_contract.py:12-18`).

After FastAPI's dataclass parse admits a body, SGLang decodes it again with the decoder generated
from its API schema (`sglang/api/v1/api_types.py`, `decode_GenerateRequest`) and refuses the first
violation with serde's wording, e.g. ``unknown field `max_tokens`, expected one of ...`` for a
sampling parameter it does not know. The decoders here follow the generated ones field by field,
in the body's key order, so the first error is the same one. A struct that lacks a field the
schema requires without a default is a TypeError there, outside the gate: not modelled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


class ContractError(ValueError):
    """The body violates the schema: `JsonContractError` (`sglang/api/v1/api_types.py:18-19`)."""


Decoder = Callable[[Any], None]


def _unexpected(v: Any) -> str:
    """serde's `Unexpected` display (`sglang/api/v1/api_types.py:30-46`)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{'true' if v else 'false'}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, str):
        return f'string "{v}"'
    if isinstance(v, list):
        return "sequence"
    if isinstance(v, dict):
        return "map"
    return type(v).__name__


def _invalid_type(v: Any, expected: str) -> ContractError:
    return ContractError(f"invalid type: {_unexpected(v)}, expected {expected}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _scalar(accepts: Callable[[Any], bool], expected: str) -> Decoder:
    def decode(v: Any) -> None:
        if not accepts(v):
            raise _invalid_type(v, expected)
    return decode


def _uint(expected: str) -> Decoder:
    def decode(v: Any) -> None:
        if not _is_int(v):
            raise _invalid_type(v, expected)
        if v < 0:
            raise ContractError(f"invalid value: integer `{v}`, expected {expected}")
    return decode


BOOL = _scalar(lambda v: isinstance(v, bool), "a boolean")
I64 = _scalar(_is_int, "i64")
F64 = _scalar(_is_number, "f64")
STR = _scalar(lambda v: isinstance(v, str), "a string")


def _optional(item: Decoder) -> Decoder:
    def decode(v: Any) -> None:
        if v is not None:
            item(v)
    return decode


def _seq(item: Decoder) -> Decoder:
    def decode(v: Any) -> None:
        if not isinstance(v, list):
            raise _invalid_type(v, "a sequence")
        for e in v:
            item(e)
    return decode


def _map(item: Decoder) -> Decoder:
    def decode(v: Any) -> None:
        if not isinstance(v, dict):
            raise _invalid_type(v, "a map")
        for e in v.values():
            item(e)
    return decode


def _or_list(name: str, accepts: Callable[[Any], bool], listed: Decoder) -> Decoder:
    """`decode_<X>OrList`: a list is the list form, anything else must be the one value."""
    def decode(v: Any) -> None:
        if isinstance(v, list):
            listed(v)
        elif not accepts(v):
            raise _invalid_type(v, f"a value or an array of values for {name}")
    return decode


def _flat_or_batch(name: str, is_item: Callable[[Any], bool], flat: Decoder, batch: Decoder) -> Decoder:
    """`decode_TokenIdsOrList`, `decode_StringListOrList`: `[]` and `[item, ...]` are one flat
    list, any other list a batch."""
    def decode(v: Any) -> None:
        if not isinstance(v, list):
            raise _invalid_type(v, f"a value or an array of values for {name}")
        (flat if not v or is_item(v[0]) else batch)(v)
    return decode


def _struct(name: str, fields: Mapping[str, Decoder], *, deny_unknown: bool) -> Decoder:
    """`decode_<Struct>`: each key in the body's order; an unknown one is refused with serde's
    `unknown_field` text (`sglang/api/v1/api_types.py:97-110`) where the schema denies it."""
    def decode(v: Any) -> None:
        if not isinstance(v, dict):
            raise _invalid_type(v, f"struct {name}")
        for key, x in v.items():
            field = fields.get(key)
            if field is not None:
                field(x)
            elif deny_unknown:
                raise _unknown_field(key, tuple(fields))
    return decode


def _unknown_field(key: str, fields: tuple[str, ...]) -> ContractError:
    if not fields:
        return ContractError(f"unknown field `{key}`, there are no fields")
    if len(fields) == 1:
        return ContractError(f"unknown field `{key}`, expected `{fields[0]}`")
    if len(fields) == 2:
        return ContractError(f"unknown field `{key}`, expected `{fields[0]}` or `{fields[1]}`")
    return ContractError(f"unknown field `{key}`, expected one of {', '.join(f'`{f}`' for f in fields)}")


def _any(v: Any) -> None:
    """A field the schema keeps as arbitrary JSON."""


I64_LIST = _seq(I64)
STRING_LIST = _seq(STR)
STRING_OR_LIST = _or_list("StringOrList", lambda v: isinstance(v, str), STRING_LIST)
TOKEN_IDS_OR_LIST = _flat_or_batch("TokenIdsOrList", _is_number, I64_LIST, _seq(I64_LIST))
BOOL_OR_LIST = _or_list("BoolOrList", lambda v: isinstance(v, bool), _seq(BOOL))
INT64_OR_LIST = _or_list("Int64OrList", _is_int, I64_LIST)
OPTIONAL_STRING_LIST = _seq(_optional(STR))
OPTIONAL_STRING_OR_LIST = _or_list("OptionalStringOrList", lambda v: isinstance(v, str), OPTIONAL_STRING_LIST)
OPTIONAL_INT64_OR_LIST = _or_list("OptionalInt64OrList", _is_int, _seq(_optional(I64)))
STRING_LIST_OR_LIST = _flat_or_batch("StringListOrList", lambda v: isinstance(v, str), STRING_LIST,
                                     _seq(STRING_LIST))

WATERMARK = _struct("WatermarkRequestConfig", {"enabled": _optional(BOOL), "key": _optional(STR),
                                               "context_window": _optional(I64)}, deny_unknown=True)
SAMPLING_PARAMS = _struct("SamplingParams", {
    "max_new_tokens": _optional(I64), "stop": _optional(STRING_OR_LIST), "stop_token_ids": _optional(I64_LIST),
    "stop_regex": _optional(STRING_OR_LIST), "temperature": _optional(F64), "top_p": _optional(F64),
    "top_k": _optional(I64), "min_p": _optional(F64), "frequency_penalty": _optional(F64),
    "presence_penalty": _optional(F64), "repetition_penalty": _optional(F64), "min_new_tokens": _optional(I64),
    "n": _optional(I64), "json_schema": _optional(STR), "regex": _optional(STR), "ebnf": _optional(STR),
    "structural_tag": _optional(STR), "ignore_eos": _optional(BOOL), "skip_special_tokens": _optional(BOOL),
    "spaces_between_special_tokens": _optional(BOOL), "no_stop_trim": _optional(BOOL),
    "stream_interval": _optional(I64), "logit_bias": _optional(_map(F64)), "sampling_seed": _optional(I64),
    "custom_params": _any, "beam_width": _optional(I64), "watermark": _optional(WATERMARK),
    "choice": _optional(STRING_LIST),
}, deny_unknown=True)  # sglang/api/v1/api_types.py:1256-1321


def _sampling_params_or_list(v: Any) -> None:
    if isinstance(v, list):
        _seq(SAMPLING_PARAMS)(v)
    elif not isinstance(v, dict):
        raise _invalid_type(v, "a value or an array of values for SamplingParamsOrList")
    else:
        SAMPLING_PARAMS(v)


MEDIA_REF = _struct("MediaRef", {
    "url": STR, "detail": _optional(STR), "max_dynamic_patch": _optional(I64), "content_hash": _optional(STR),
    "min_pixels": _optional(I64), "max_pixels": _optional(I64), "total_max_pixels": _optional(I64),
    "fps": _optional(F64), "num_frames": _optional(I64), "min_frames": _optional(I64), "max_frames": _optional(I64),
    "max_tokens_per_frame": _optional(I64), "max_image_tokens": _optional(I64), "use_audio": _optional(BOOL),
    "image_grid_thw": _optional(_seq(I64_LIST)),
}, deny_unknown=True)


def _media_item(v: Any) -> None:
    if isinstance(v, dict):
        MEDIA_REF(v)
    elif not isinstance(v, str):
        raise _invalid_type(v, "one of the MediaItem shapes")


MEDIA_ITEMS = _seq(_optional(_media_item))


def _media_input(v: Any) -> None:
    """`decode_MediaInput` (`sglang/api/v1/api_types.py:2034-2043`)."""
    if isinstance(v, (str, dict)):
        _media_item(v)
    elif isinstance(v, list):
        (_seq(_optional(MEDIA_ITEMS)) if v and isinstance(v[0], list) else MEDIA_ITEMS)(v)
    else:
        raise _invalid_type(v, "one of the MediaInput shapes")


KV_HINTS_ENVELOPE = _struct("KvHintsEnvelope", {
    "protocol_version": STR, "message_id": STR,
    "actions": _optional(_seq(_struct("KvHintAction", {"action_id": STR, "action_type": STR,
                                                        "action_version": STR, "payload": _any},
                                      deny_unknown=False))),
}, deny_unknown=False)


def _kv_hints_or_list(v: Any) -> None:
    if isinstance(v, list):
        _seq(_optional(KV_HINTS_ENVELOPE))(v)
    elif not isinstance(v, dict):
        raise _invalid_type(v, "a value or an array of values for KvHintsEnvelopeOrList")
    else:
        KV_HINTS_ENVELOPE(v)


GENERATE_REQUEST = _struct("GenerateRequest", {
    "rid": _optional(STRING_OR_LIST), "text": _optional(STRING_OR_LIST), "input_ids": _optional(TOKEN_IDS_OR_LIST),
    "stream": _optional(BOOL), "sampling_params": _optional(_sampling_params_or_list),
    "return_logprob": _optional(BOOL_OR_LIST), "logprob_start_len": _optional(INT64_OR_LIST),
    "top_logprobs_num": _optional(INT64_OR_LIST), "token_ids_logprob": _optional(TOKEN_IDS_OR_LIST),
    "return_hidden_states": _optional(BOOL_OR_LIST), "return_text_in_logprobs": _optional(BOOL),
    "bootstrap_host": _optional(OPTIONAL_STRING_OR_LIST), "bootstrap_port": _optional(OPTIONAL_INT64_OR_LIST),
    "bootstrap_room": _optional(OPTIONAL_INT64_OR_LIST), "bootstrap_pair_key": _optional(OPTIONAL_STRING_OR_LIST),
    "decode_tp_size": _optional(OPTIONAL_INT64_OR_LIST), "routed_dp_rank": _optional(I64),
    "disagg_prefill_dp_rank": _optional(I64), "image_data": _optional(_media_input),
    "mm_hashes": _optional(STRING_LIST_OR_LIST), "video_data": _optional(_media_input),
    "audio_data": _optional(_media_input), "extra_key": _optional(STRING_OR_LIST), "priority": _optional(I64),
    "cache_salt": _optional(STRING_OR_LIST), "require_reasoning": _optional(BOOL),
    "lora_path": _optional(OPTIONAL_STRING_OR_LIST), "session_params": _any,
    "kv_hints": _optional(_kv_hints_or_list), "routing_key": _optional(STR),
    "max_thinking_tokens": _optional(_uint("u64")), "session_id": _optional(STR),
    "custom_logit_processor": _optional(OPTIONAL_STRING_OR_LIST), "custom_labels": _optional(_map(STR)),
    "images_config": _optional(_struct("ImagesConfig", {"image_mode": _optional(STR), "prefix": STR},
                                       deny_unknown=False)),
    "return_prompt_token_ids": BOOL, "routed_experts_start_len": I64,
    "return_sampling_mask": _optional(BOOL_OR_LIST), "modalities": _optional(OPTIONAL_STRING_LIST),
}, deny_unknown=False)  # sglang/api/v1/api_types.py:1413-1495


def generate_contract_error(body: Any) -> str | None:
    """The contract violation in a parsed `/generate` body, or None."""
    try:
        GENERATE_REQUEST(body)
    except ContractError as e:
        return str(e)
    return None
