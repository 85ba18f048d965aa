"""FastAPI's request validation on SGLang 0.5.23's generation and control routes and `/v1/loads`,
and SGLang's answer to it.

FastAPI reads the body (JSON only under a JSON Content-Type: a body sent without one stays bytes),
runs the route's dependencies (the OpenAI routes' `validate_json_request`,
`entrypoints/http_server.py:695-707`) and validates the body against the handler's parameter type
with pydantic. A failure is a RequestValidationError, which SGLang answers with 400 and an
ErrorResponse whose message is the exception's text followed by its error list
(`entrypoints/http_server.py:635-692`). The text is FastAPI's (`fastapi/exceptions.py`,
`ValidationException.__str__`, with the endpoint's file, line and route since 0.124; strict
Content-Type since 0.132; as in 0.163, the release the unpinned requirement installs): the count,
one pydantic error dict a line, then where the handler is. The file is where the lmsysorg/sglang
image installs SGLang; the rest is the same on every install.

The request types below declare the fields the simulator reads with SGLang's own annotations, in
SGLang's order, and pydantic validates them as it does there, so their errors are SGLang's; a
field the simulator does not read is not checked. Chat messages are checked as a list of objects,
not against each message type of the OpenAI schema. The control routes' bodies are msgspec Structs,
which SGLang hands pydantic through a schema of its own (`BaseReq`).
"""

from __future__ import annotations

import email.message
import json
from array import array
from dataclasses import dataclass, field
from typing import Annotated, Any, Dict, List, Literal, Optional, Union, get_type_hints

from pydantic import BaseModel, GetCoreSchemaHandler, PlainValidator, TypeAdapter, ValidationError, field_validator
from pydantic_core import CoreSchema, core_schema

SGLANG_ENTRYPOINTS = "/sgl-workspace/sglang/python/sglang/srt/entrypoints"
ENDPOINTS = {
    # The route, the file of its handler under `entrypoints/`, the handler, and the line
    # `inspect.getsourcelines` gives for it: its first decorator's.
    "/generate": ("http_server.py", "generate_request", 928),
    "/v1/completions": ("http_server.py", "openai_v1_completions", 1860),
    "/v1/chat/completions": ("http_server.py", "openai_v1_chat_completions", 1870),
    "/v1/loads": ("v1_loads.py", "get_loads", 96),
    "/pd_role_switch": ("http_server.py", "pd_role_switch", 1635),
    "/abort_request": ("http_server.py", "abort_request", 1721),
    "/pause_generation": ("http_server.py", "pause_generation", 1831),
    "/continue_generation": ("http_server.py", "continue_generation", 1844),
}

NO_BODY = object()
"""An empty body, which FastAPI leaves `Undefined` (`fastapi/routing.py`): missing, unlike JSON's null."""


class RequestValidationError(Exception):
    """FastAPI's RequestValidationError: pydantic-style error dicts, and where the handler is
    (None for an error raised by a dependency, which FastAPI gives no endpoint)."""

    def __init__(self, errors: list[dict[str, Any]], endpoint: str | None) -> None:
        super().__init__(errors)
        self.errors = errors
        self.endpoint = endpoint

    def __str__(self) -> str:
        """`ValidationException.__str__` (fastapi 0.163.2 `exceptions.py`)."""
        n = len(self.errors)
        text = f"{n} validation error{'s' if n != 1 else ''}:\n" + "".join(f"  {err}\n" for err in self.errors)
        return (text + (self.endpoint or "")).rstrip()

    @property
    def message(self) -> str:
        """SGLang's ErrorResponse message: the text, then the error list when it differs
        (`entrypoints/http_server.py:666-671`)."""
        text, listed = str(self), str(self.errors)
        return f"{text} {listed}" if listed and listed != text else text


class BodyUnreadable(Exception):
    """A JSON body FastAPI fails to read other than as invalid JSON (bytes that are no UTF-8, UTF-16
    or UTF-32 text, nesting past the recursion limit): it answers any such failure with
    `HTTPException(400, MESSAGE)` (`fastapi/routing.py`), through SGLang's HTTPException handler."""

    MESSAGE = "There was an error parsing the body"


def endpoint_context(method: str, path: str) -> str:
    """`ValidationException._format_endpoint_context` for one of the routes of `ENDPOINTS`."""
    file, function, line = ENDPOINTS[path]
    return f'\n  File "{SGLANG_ENTRYPOINTS}/{file}", line {line}, in {function}\n    {method} {path}'


def read_body(raw: bytes, content_type: str | None, endpoint: str) -> Any:
    """The body FastAPI validates: NO_BODY when empty; decoded JSON under `application/json` or
    `application/*+json` (null being None); else the bytes themselves, a Content-Type being required
    (`strict_content_type`). Undecodable JSON is a `json_invalid` error; a body that is no text,
    or nests too deep, is BodyUnreadable."""
    if not raw:
        return NO_BODY
    if not content_type:
        return raw
    header = email.message.Message()
    header["content-type"] = content_type
    subtype = header.get_content_subtype()
    if header.get_content_maintype() != "application" or not (subtype == "json" or subtype.endswith("+json")):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error",
                            "input": {}, "ctx": {"error": e.msg}}], endpoint) from e
    except (ValueError, RecursionError) as e:
        raise BodyUnreadable(BodyUnreadable.MESSAGE) from e


def require_json_media(content_type: str | None) -> None:
    """`validate_json_request` (`entrypoints/http_server.py:695-707`), the OpenAI routes' dependency."""
    if (content_type or "").lower().split(";", maxsplit=1)[0] != "application/json":
        raise RequestValidationError([{"loc": ["header", "content-type"],
                            "msg": "Unsupported Media Type: Only 'application/json' is allowed",
                            "type": "value_error"}], None)


_INT = TypeAdapter(int)


def validate_query_int(value: str | None, name: str, endpoint: str) -> int | None:
    """An `Optional[int]` query parameter as FastAPI validates it before the handler runs: pydantic's
    lax integer parsing of the string ("+1", " 1 ", "1.0" and "1_0" are integers; an empty value is
    not), its errors under `("query", name)`."""
    if value is None:
        return None
    try:
        return _INT.validate_python(value)
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("query", name)} for err in e.errors(include_url=False)],
                                     endpoint) from e


def validate_list_i64_1d(v: Any) -> list[int]:
    """`utils/field_validators.py:41-55`."""
    if v is None:
        raise ValueError("must not be None")
    if not isinstance(v, list):
        raise ValueError(f"must be list; got {type(v).__name__}")
    if not v:
        return v
    if not isinstance(v[0], int):
        raise ValueError(f"elements must be int; got {type(v[0]).__name__}")
    try:
        array("q", v)
    except (TypeError, OverflowError) as e:
        raise ValueError(f"contains non-int64 element: {e}") from None
    return v


def validate_optional_list_i64_1d_2d(v: Any) -> list[int] | list[list[int]] | None:
    """`utils/field_validators.py:58-81`: `GenerateReqInput.input_ids`' validator."""
    if v is None:
        return v
    if not isinstance(v, list):
        raise ValueError(f"must be list or null; got {type(v).__name__}")
    if not v:
        return v
    if isinstance(v[0], int):
        return validate_list_i64_1d(v)
    if isinstance(v[0], list):
        for i, row in enumerate(v):
            try:
                validate_list_i64_1d(row)
            except ValueError as e:
                raise ValueError(f"row {i}: {e}") from None
        return v
    raise ValueError(f"elements must be int or list; got {type(v[0]).__name__}")


@dataclass
class GenerateReqInput:
    """`managers/io_struct.py:177`, the fields the simulator reads."""

    rid: Optional[Union[str, List[str]]] = field(default=None, kw_only=True)
    text: Optional[Union[List[str], str]] = None
    input_ids: Annotated[
        Optional[Union[List[List[int]], List[int]]],
        PlainValidator(validate_optional_list_i64_1d_2d),
    ] = None
    sampling_params: Optional[Union[List[Dict[str, Any]], Dict[str, Any]]] = None
    stream: bool = False
    bootstrap_host: Optional[Union[List[Optional[str]], str]] = None
    bootstrap_port: Optional[Union[List[Optional[int]], int]] = None
    bootstrap_room: Optional[Union[List[Optional[int]], int]] = None


class PDRoutingFields(BaseModel):
    """`entrypoints/openai/protocol.py:348-354`."""

    bootstrap_host: Optional[Union[List[str], str]] = None
    bootstrap_port: Optional[Union[List[Optional[int]], int]] = None
    bootstrap_room: Optional[Union[List[int], int]] = None


class CompletionRequest(PDRoutingFields):
    """`entrypoints/openai/protocol.py:365-453`, the fields the simulator reads."""

    model: str = "default"
    prompt: Union[List[int], List[List[int]], str, List[str]]
    max_tokens: int = 16
    stream: bool = False

    @field_validator("max_tokens")
    @classmethod
    def validate_max_tokens_positive(cls, v: int) -> int:
        """Lines 448-453."""
        if v is not None and v <= 0:
            raise ValueError("max_tokens must be positive")
        return v


class ChatCompletionRequest(PDRoutingFields):
    """`entrypoints/openai/protocol.py:909`, the fields the simulator reads; a message is any object."""

    messages: List[Dict[str, Any]]
    model: str = "default"
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    stream: bool = False


class BaseReq:
    """`managers/io_struct.py:86-94`, the base of the control routes' msgspec Structs, with the
    schema SGLang gives pydantic for them (`utils/msgspec_utils.py:70-118`): the fields, base
    first, as a typed dict whose other keys are ignored (each field here has a default), built
    into the Struct after validation; and, FastAPI validating a body in Python mode, that after an
    instance check, left to right. A refused body fails both branches: the instance check's error
    comes first, then the typed dict's, each under its branch's name."""

    rid: Optional[str] = None
    http_worker_ipc: Optional[str] = None

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        fields = {
            name: core_schema.typed_dict_field(
                core_schema.with_default_schema(handler.generate_schema(annotation), default=getattr(cls, name)),
                required=False)
            for name, annotation in get_type_hints(cls).items()
        }
        typed_dict = core_schema.typed_dict_schema(fields, cls_name=cls.__name__, extra_behavior="ignore",
                                                   ref=cls.__name__)

        def build_struct(value: dict[str, Any]) -> dict[str, Any]:
            """The Struct's fields, defaults filled in: what the handler reads."""
            return value

        struct = core_schema.no_info_after_validator_function(build_struct, typed_dict)
        return core_schema.union_schema([core_schema.is_instance_schema(cls), struct], mode="left_to_right")


class PdRoleSwitchReqInput(BaseReq):
    """`managers/io_struct.py:2265-2274`: the role is taken as written, "Decode" is refused."""

    new_role: Literal["prefill", "decode", ""] = ""
    decode_cuda_graph_bs: Optional[List[int]] = None
    decode_cuda_graph_memory_gb: Optional[float] = None
    prepare_only: bool = False


class PauseGenerationReqInput(BaseReq):
    """`managers/io_struct.py:1927-1946`."""

    mode: Literal["abort", "retract", "in_place"] = "abort"


class ContinueGenerationReqInput(BaseReq):
    """`managers/io_struct.py:1949-1955`."""

    torch_empty_cache: bool = True


class AbortReq(BaseReq):
    """`managers/io_struct.py:2285-2296`, the fields the simulator reads; an unset rid is ""."""

    abort_all: bool = False


_ADAPTERS: dict[type, TypeAdapter[Any]] = {
    kind: TypeAdapter(kind)
    for kind in (GenerateReqInput, CompletionRequest, ChatCompletionRequest, PdRoleSwitchReqInput,
                 PauseGenerationReqInput, ContinueGenerationReqInput, AbortReq)
}


def validate_body(kind: type, body: Any, endpoint: str) -> Any:
    """FastAPI's validation of the one body parameter, the value it hands the handler: pydantic's
    errors under `("body", ...)` (`fastapi/_compat/v2.py`, `_regenerate_error_with_loc`). An empty
    body is never handed to pydantic: the required parameter is missing
    (`fastapi/dependencies/utils.py`, `_validate_value_with_model_field`); JSON's null is, as None."""
    if body is NO_BODY:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}],
                                     endpoint)
    try:
        return _ADAPTERS[kind].validate_python(body, from_attributes=True)
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors(include_url=False)],
                          endpoint) from e
