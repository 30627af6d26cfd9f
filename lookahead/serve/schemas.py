"""What the server reads and refuses: the request bodies of /v1/chat/completions and /v1/completions
(pydantic models, fields named as OpenAI names them), the OpenAI-style error (``APIError``: status,
message, type, param, code), and the checks that name a bad field and its fix.

A body is read as JSON (UTF-8), validated by the models, then checked field by field: a field this
server does not implement is refused unless it holds its neutral value (``"functions": []``,
``"echo": false``, ...), a field no OpenAI endpoint names is refused as unrecognized, and numbers out
of range are refused with the range (``n``: 1 to the server's batch size).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from .tools import ToolError, assistant_tool_calls, check_tool_turns, json_kind, tool_result

MAX_STOPS = 16  # stop strings per request (OpenAI takes 4)
MAX_DEPTH = 64  # arrays and objects nested in a request body (a tool's JSON schema nests a few levels)
MAX_STOP_CHARS = 512  # characters of one stop string (the text held back while a reply may be starting one)
SEED_RANGE = (-(2 ** 63), 2 ** 64 - 1)  # what torch.Generator.manual_seed takes
ROLES = ("system", "developer", "user", "assistant", "tool")  # "developer" is rendered as "system"


@dataclass
class APIError(Exception):
    """An error answered as OpenAI answers one: ``{"error": {"message", "type", "param", "code"}}``."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def body(self) -> dict[str, Any]:
        """The JSON body."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """A 400 naming ``param``."""
    return APIError(400, message, "invalid_request_error", param, code)


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last chunk with the usage."""

    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = None


class ChatMessage(BaseModel):
    """One message of ``messages``: a role and its text (a string, or a list of text parts)."""

    model_config = ConfigDict(extra="allow")
    role: str
    content: Any = None


class Common(BaseModel):
    """The fields both endpoints read; other fields are kept in ``model_extra`` for ``check_fields``."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    presence_penalty: Any = None  # presence_penalty, frequency_penalty, logit_bias: checked by scoring.py
    frequency_penalty: Any = None
    logit_bias: Any = None
    stop: Any = None  # a string or a list of strings (checked by stop_strings, which names the field)
    n: Any = None  # choices: an integer in [1, the server's batch size] (checked by choice_count, naming the field)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None  # accepted and ignored
    prediction: Any = None  # Predicted Outputs: {"type": "content", "content": ...} (checked by prediction.py)
    response_format: Any = None  # text / json_object / json_schema: checked by structured.py (naming the field)


class ChatRequest(Common):
    """The body of POST /v1/chat/completions."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: Any = None  # true / false, with top_logprobs 0-20: checked by scoring.py (naming the field)
    top_logprobs: Any = None
    tools: Any = None  # tools, tool_choice, parallel_tool_calls: checked by tools.tool_settings (naming the field)
    tool_choice: Any = None
    parallel_tool_calls: Any = None


class CompletionRequest(Common):
    """The body of POST /v1/completions."""

    prompt: Any  # a string (checked by prompt_text, which names the field)
    logprobs: Any = None  # 0-20 alternatives per token: checked by scoring.py (naming the field)


def _none_or(*neutral: Any) -> Callable[[Any], bool]:
    return lambda value: value is None or any(value == n and type(value) is type(n) for n in neutral)


def _empty(value: Any) -> bool:
    return value is None or value == [] or value == {}


ANY: Callable[[Any], bool] = lambda value: True  # noqa: E731 - accepted and ignored, whatever it holds

# Fields OpenAI's endpoints take that this server does not implement: accepted only while they hold
# a value that asks for nothing (what a client sends when it means "off"), refused otherwise.
UNSUPPORTED_CHAT: dict[str, Callable[[Any], bool]] = {
    "functions": _empty,  # (the deprecated form of tools: send tools)
    "function_call": _none_or("none", "auto"),
    "modalities": lambda v: v is None or v == ["text"],
    "audio": _none_or(),
    "reasoning_effort": _none_or(),
    "web_search_options": _none_or(),
    "service_tier": _none_or("auto", "default"),
    "store": _none_or(False),
    "metadata": ANY,
    "verbosity": _none_or(),
}
UNSUPPORTED_COMPLETION: dict[str, Callable[[Any], bool]] = {
    "echo": _none_or(False),
    "suffix": lambda v: v is None or v == "",
    "best_of": _none_or(1),
}


def nesting(value: Any) -> int:
    """How deep arrays and objects nest in a parsed JSON value (a scalar: 0), without recursing.

    {"a": [1, {"b": []}]} -> 4."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _too_deep() -> APIError:
    return bad_request(f"the request body nests arrays and objects more than {MAX_DEPTH} deep: send a flatter JSON "
                       f"object", code="invalid_json")


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body; APIError 400 when it is not UTF-8, not JSON or not an object."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"the request body is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}): "
                          f"send the JSON encoded as UTF-8", code="invalid_encoding") from None
    if not text.strip():
        raise bad_request("the request body is empty: send a JSON object", code="invalid_json")
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_request(f"the request body is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}): "
                          f"send one JSON object", code="invalid_json") from None
    except RecursionError:  # nested past what the parser reads
        raise _too_deep() from None
    if nesting(body) > MAX_DEPTH:
        raise _too_deep()
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got a JSON {json_kind(body)}",
                          code="invalid_json")
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request("the request body holds a lone surrogate escape (\\ud800-\\udfff without its pair), which is "
                          "no character: send whole UTF-16 pairs or the characters themselves",
                          code="invalid_encoding") from None
    return body


R = TypeVar("R", bound=Common)


def validated(model: type[R], body: Mapping[str, Any]) -> R:
    """``body`` as ``model``; APIError 400 naming the first bad field (OpenAI's shape, not FastAPI's 422)."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise _validation_error(exc) from None


def _validation_error(exc: ValidationError) -> APIError:
    error = exc.errors(include_url=False)[0]
    param = field_path(error["loc"])
    if error["type"] == "missing":
        return bad_request(f"missing required field '{param}'", param, "missing_required_parameter")
    got = json.dumps(error.get("input"), ensure_ascii=False, default=str)
    got = got if len(got) <= 60 else got[:57] + "..."
    return bad_request(f"invalid value for '{param}': {error['msg']} (got {got})", param, "invalid_value")


def field_path(loc: tuple[int | str, ...] | list[int | str]) -> str:
    """A pydantic location as a field path: ("messages", 0, "content") -> "messages[0].content"."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def check_fields(request: Common, unsupported: Mapping[str, Callable[[Any], bool]]) -> None:
    """APIError 400 for a field this server does not implement (unless neutral) or does not know."""
    for name, value in (request.model_extra or {}).items():
        neutral = unsupported.get(name)
        if neutral is None:
            raise bad_request(f"unrecognized request field '{name}': remove it (this endpoint takes "
                              f"{', '.join(known_fields(type(request)))})", name, "unknown_parameter")
        if not neutral(value):
            raise bad_request(f"'{name}' is not supported by this server: leave it out", name, "unsupported_parameter")


def choice_count(value: Any, most: int) -> int:
    """``n``: how many choices to decode (1 when left out), an integer from 1 to ``most`` (the server's batch
    size: each choice is a sequence of the batch); APIError 400 naming 'n' and the range otherwise."""
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int):
        got = json.dumps(value, ensure_ascii=False, default=str)
        raise bad_request(f"'n' must be an integer from 1 to {most} (the choices to return), got "
                          f"{got if len(got) <= 60 else got[:57] + '...'}", "n", "invalid_value")
    if not 1 <= value <= most:
        raise bad_request(f"'n' is {value}: send an integer from 1 to {most} (this server decodes each choice as a "
                          f"sequence of its batch, at most {most} at once; repeat the request for more)", "n",
                          "invalid_value")
    return value


def known_fields(model: type[Common]) -> list[str]:
    """The fields ``model`` reads, in order."""
    return list(model.model_fields)


def stop_strings(value: Any) -> tuple[str, ...]:
    """``stop``: a string or a list of strings (up to MAX_STOPS, none empty or longer than MAX_STOP_CHARS) as a
    tuple."""
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("'stop' must be a string or a list of strings", "stop", "invalid_value")
    if len(stops) > MAX_STOPS:
        raise bad_request(f"'stop' holds {len(stops)} strings: send at most {MAX_STOPS}", "stop", "invalid_value")
    if any(s == "" for s in stops):
        raise bad_request("'stop' holds an empty string, which would stop before the first token: remove it",
                          "stop", "invalid_value")
    for index, stop in enumerate(stops):
        if len(stop) > MAX_STOP_CHARS:
            where = "stop" if isinstance(value, str) else f"stop[{index}]"
            raise bad_request(f"'{where}' is {len(stop)} characters long: send stop strings of at most "
                              f"{MAX_STOP_CHARS} characters", where, "invalid_value")
    return tuple(dict.fromkeys(stops))


def check_sampling(request: Common) -> None:
    """APIError 400 for a temperature, top_p or seed out of its range."""
    if request.temperature is not None and not 0.0 <= request.temperature <= 2.0:
        raise bad_request(f"'temperature' must lie in [0, 2] (0: greedy), got {request.temperature}",
                          "temperature", "invalid_value")
    if request.top_p is not None and not 0.0 < request.top_p <= 1.0:
        raise bad_request(f"'top_p' must lie in (0, 1], got {request.top_p}", "top_p", "invalid_value")
    if request.seed is not None and not SEED_RANGE[0] <= request.seed <= SEED_RANGE[1]:
        raise bad_request(f"'seed' must lie in [-2**63, 2**64-1], got {request.seed}", "seed", "invalid_value")


def max_tokens(request: Common) -> tuple[int | None, str]:
    """The request's max_tokens (None: left out) and the field it came from (max_completion_tokens first)."""
    value, name = request.max_tokens, "max_tokens"
    if isinstance(request, ChatRequest) and request.max_completion_tokens is not None:
        if value is not None and value != request.max_completion_tokens:
            raise bad_request(f"'max_tokens' ({value}) and 'max_completion_tokens' ({request.max_completion_tokens}) "
                              f"disagree: send one of them", "max_completion_tokens", "invalid_value")
        value, name = request.max_completion_tokens, "max_completion_tokens"
    if value is not None and value < 1:
        raise bad_request(f"'{name}' must be at least 1, got {value}: ask for one new token or more", name,
                          "invalid_value")
    return value, name


def chat_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """``messages`` as the chat template reads them ({"role", "content"} with text content; a tool message's
    ``tool_call_id``, an assistant message's ``tool_calls``, tools.py); APIError 400 naming the message for a
    role or content this server cannot render (images, audio, function messages) or a tool turn out of place."""
    if not messages:
        raise bad_request("'messages' is empty: send at least one message", "messages", "invalid_value")
    out = []
    try:
        for i, message in enumerate(messages):
            out.append(_chat_message(message, f"messages[{i}]"))
        check_tool_turns(out)
    except ToolError as exc:
        raise bad_request(exc.message, exc.param, exc.code) from None
    return out


def _chat_message(message: ChatMessage, where: str) -> dict[str, Any]:
    if message.role not in ROLES:
        raise bad_request(f"'{where}.role' is {message.role!r}: this server takes {', '.join(ROLES)} messages "
                          f"(no function messages: send tool messages)", f"{where}.role", "invalid_value")
    extra = message.model_extra or {}
    for name in ("function_call", "audio"):
        if extra.get(name):
            raise bad_request(f"'{where}.{name}' is not supported by this server: leave it out",
                              f"{where}.{name}", "unsupported_parameter")
    calls = extra.get("tool_calls")
    calls = None if calls == [] else calls  # (an empty list, as some clients send: no calls)
    if calls is not None and message.role != "assistant":
        raise bad_request(f"'{where}.tool_calls' is only taken on an assistant message", f"{where}.tool_calls",
                          "invalid_value")
    if message.role == "tool":
        return {"role": "tool", "content": _message_text(message.content, where),
                "tool_call_id": tool_result(extra, where)}
    if calls is not None:
        text = "" if message.content is None else _message_text(message.content, where)
        return {"role": "assistant", "content": text, "tool_calls": assistant_tool_calls(calls, where)}
    role = "system" if message.role == "developer" else message.role
    return {"role": role, "content": _message_text(message.content, where)}


def _message_text(content: Any, where: str) -> str:
    """A message's content as one string: a string, or the text parts of a list joined by newlines."""
    if isinstance(content, str):
        return content
    if content is None:
        raise bad_request(f"'{where}.content' is missing: send the message's text", f"{where}.content",
                          "invalid_value")
    if not isinstance(content, list):
        raise bad_request(f"'{where}.content' must be a string or a list of text parts", f"{where}.content",
                          "invalid_value")
    texts = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            what = f"of type {kind!r}" if isinstance(kind, str) else "not a text part"
            raise bad_request(f"'{at}' is {what}: this server takes text only ({{\"type\": \"text\", \"text\": ...}})",
                              at, "unsupported_content")
        texts.append(part["text"])
    return "\n".join(texts)


def prompt_text(value: Any) -> str:
    """/v1/completions' ``prompt``: a string (or a list holding one string)."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    if not isinstance(value, str):
        raise bad_request("'prompt' must be a string (one prompt per request)", "prompt", "invalid_value")
    if not value:
        raise bad_request("'prompt' is empty: send the text to continue", "prompt", "invalid_value")
    return value
