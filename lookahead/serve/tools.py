"""Tool calling, the request's side: ``tools``, ``tool_choice`` and ``parallel_tool_calls`` read and
checked, the history's ``tool`` messages and assistant ``tool_calls`` made into what a chat template
reads, and whether the served model's chat template takes tools at all.

Every bad input raises ``ToolError`` (a message naming the field and the fix, the field, a code);
schemas.py and app.py answer it as a 400. Nothing here imports the rest of the server.

A template takes tools when its source reads a ``tools`` variable (jinja's own analysis of the
template, not a text search). ``tool_choice``: ``"auto"`` (the default with tools) renders the tools
and parses the model's calls back; ``"none"`` renders the conversation without them (the model is
not told of any tool, so it cannot call one) and parses nothing; ``"required"`` and a named function
render and parse like ``"auto"`` and constrain the reply to calls of the tools (of the named one) whose
arguments follow their schemas (serve/structured.py: a grammar over the template's call format): one or
more calls while ``parallel_tool_calls`` is true (the default), exactly one when it is false.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .toolcalls import FORMATS, ParserFactory, parser_for

NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for a function's name
CHOICES = ("none", "auto", "required")  # the tool_choice strings this server honours (a named function: "required")


class ToolError(ValueError):
    """A bad tool field: ``message`` names the problem and the fix, ``param`` the field."""

    def __init__(self, message: str, param: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


@dataclass(frozen=True)
class ToolSettings:
    """A request's tools as the template reads them (OpenAI's ``{"type": "function", "function": {...}}``
    entries), whether to render and parse them (``choice``), and how many calls a reply may hold."""

    tools: tuple[dict[str, Any], ...]
    choice: str = "auto"  # "auto": rendered, calls parsed; "none": neither; "required": as auto, the reply calls
    parallel: bool = True  # False: a reply holds one call at most (later ones are dropped)
    function: str | None = None  # tool_choice naming a function (choice "required"): the call is to it

    def __post_init__(self) -> None:
        if self.choice not in CHOICES:
            raise ValueError(f"choice must be one of {CHOICES}, got {self.choice!r}")
        if self.function is not None and (self.choice != "required" or self.function not in self.names):
            raise ValueError(f"function {self.function!r} must be one of the tools' names, with choice 'required'")
        if not self.tools:
            raise ValueError("tools is empty: a request without tools has no ToolSettings")

    @property
    def names(self) -> frozenset[str]:
        """The functions' names."""
        return frozenset(tool["function"]["name"] for tool in self.tools)

    @property
    def active(self) -> bool:
        """Whether the tools are rendered and the model's calls parsed back."""
        return self.choice != "none"

    @property
    def forced(self) -> bool:
        """Whether the reply must be a call (tool_choice "required" or a named function)."""
        return self.choice == "required"


def tool_settings(tools: Any, choice: Any, parallel: Any) -> ToolSettings | None:
    """The request's ``tools``, ``tool_choice``, ``parallel_tool_calls`` checked (None: no tools); ToolError
    naming the field otherwise."""
    if parallel is not None and not isinstance(parallel, bool):
        raise ToolError("'parallel_tool_calls' must be true or false", "parallel_tool_calls")
    checked = read_tools(tools)
    names = frozenset(tool["function"]["name"] for tool in checked)
    picked, function = read_tool_choice(choice, names)
    if not checked:
        return None
    return ToolSettings(tuple(checked), picked, parallel is not False, function)


def read_tools(value: Any) -> list[dict[str, Any]]:
    """``tools``: a list of function tools, each with a valid, unique name and an object schema."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ToolError("'tools' must be a list of {\"type\": \"function\", \"function\": {\"name\": ..., "
                        "\"parameters\": {...}}}", "tools")
    out, seen = [], set()
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise ToolError(f"'{where}' must be an object {{\"type\": \"function\", \"function\": {{...}}}}", where)
        if tool.get("type") != "function":
            raise ToolError(f"'{where}.type' is {json.dumps(tool.get('type'))}: this server takes function tools "
                            f"only; send \"type\": \"function\"", f"{where}.type")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise ToolError(f"'{where}.function' is missing or not an object: send {{\"name\": ..., \"parameters\": "
                            f"{{...}}}}", f"{where}.function")
        name = _function_name(function.get("name"), f"{where}.function.name")
        if name in seen:
            raise ToolError(f"'{where}.function.name' {name!r} names a function an earlier tool names already: "
                            f"give each tool its own name", f"{where}.function.name")
        seen.add(name)
        entry: dict[str, Any] = {"name": name}
        description = function.get("description")
        if description is not None:
            if not isinstance(description, str):
                raise ToolError(f"'{where}.function.description' must be a string", f"{where}.function.description")
            entry["description"] = description
        if function.get("strict") not in (None, False):
            raise ToolError(f"'{where}.function.strict' asks for arguments that always match the schema, which "
                            f"needs decoding constrained to it: with \"tool_choice\": \"auto\" this server does not "
                            f"constrain decoding; leave \"strict\" out and send \"tool_choice\": \"required\" (or name "
                            f"the function) to constrain the call to its schema, or send \"strict\": false",
                            f"{where}.function.strict", "unsupported_parameter")
        parameters = function.get("parameters")
        if parameters is not None:
            check_schema(parameters, f"{where}.function.parameters")
            entry["parameters"] = parameters
        out.append({"type": "function", "function": entry})
    return out


def _function_name(value: Any, where: str) -> str:
    if value is None or value == "":
        raise ToolError(f"'{where}' is missing: give the function a name (letters, digits, '_' or '-', up to 64)",
                        where, "missing_required_parameter")
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise ToolError(f"'{where}' is {json.dumps(value)}: a function name is 1 to 64 letters, digits, '_' or '-'",
                        where)
    return value


def check_schema(schema: Any, where: str) -> None:
    """A function's ``parameters``: a JSON schema object describing an object (``"type": "object"`` when a type
    is given), its ``properties`` schemas, its ``required`` names among them."""
    if not isinstance(schema, dict):
        raise ToolError(f"'{where}' must be a JSON schema object such as {{\"type\": \"object\", \"properties\": "
                        f"{{...}}}}, got a JSON {json_kind(schema)}", where, "invalid_schema")
    kind = schema.get("type")
    if kind is not None and kind != "object":
        raise ToolError(f"'{where}.type' is {json.dumps(kind)}: a function's parameters are an object; send "
                        f"\"type\": \"object\" with the arguments under \"properties\"", f"{where}.type",
                        "invalid_schema")
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        raise ToolError(f"'{where}.properties' must be an object mapping each argument's name to its schema",
                        f"{where}.properties", "invalid_schema")
    for key, sub in properties.items():
        if not isinstance(sub, (dict, bool)):
            raise ToolError(f"'{where}.properties.{key}' must be a JSON schema (an object), got a JSON "
                            f"{json_kind(sub)}", f"{where}.properties.{key}", "invalid_schema")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ToolError(f"'{where}.required' must be a list of argument names", f"{where}.required",
                        "invalid_schema")
    missing = [r for r in required if r not in properties]
    if missing and "properties" in schema:
        raise ToolError(f"'{where}.required' names {', '.join(missing)}, which '{where}.properties' does not "
                        f"define: define them or drop them from 'required'", f"{where}.required", "invalid_schema")


def read_tool_choice(value: Any, names: frozenset[str]) -> tuple[str, str | None]:
    """``tool_choice`` as (choice, the named function or None): "none", "auto" (the default with tools) or
    "required" (also for a named function); ToolError for an unknown value and a choice that needs tools
    without them."""
    if value is None:
        return "auto", None
    if isinstance(value, str):
        if value == "required" and not names:
            raise ToolError("'tool_choice' is \"required\" but the request has no 'tools': send the tools",
                            "tool_choice")
        if value in CHOICES:
            return value, None
        raise ToolError(f"'tool_choice' is {json.dumps(value)}: send \"none\", \"auto\", \"required\" or "
                        f"{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}", "tool_choice")
    if not isinstance(value, dict) or value.get("type") != "function" or not isinstance(value.get("function"), dict):
        raise ToolError("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                        "\"function\": {\"name\": ...}}", "tool_choice")
    name = value["function"].get("name")
    if not names:
        raise ToolError("'tool_choice' names a function but the request has no 'tools': send the tools",
                        "tool_choice")
    if name not in names:
        raise ToolError(f"'tool_choice.function.name' is {json.dumps(name)}, which no tool defines: name one of "
                        f"{', '.join(sorted(names))}", "tool_choice.function.name")
    return "required", str(name)


# ------------------------------------------------------------------ the history


def assistant_tool_calls(value: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` as a template reads them: arguments as an object (a template
    writes them out with ``tojson``), not OpenAI's JSON string."""
    at = f"{where}.tool_calls"
    if not isinstance(value, list) or not value:
        raise ToolError(f"'{at}' must be a non-empty list of {{\"id\", \"type\": \"function\", \"function\": "
                        f"{{\"name\", \"arguments\"}}}}", at)
    calls, ids = [], set()
    for j, call in enumerate(value):
        here = f"{at}[{j}]"
        if not isinstance(call, dict):
            raise ToolError(f"'{here}' must be an object {{\"id\", \"type\": \"function\", \"function\": {{...}}}}",
                            here)
        ident = call.get("id")
        if not isinstance(ident, str) or not ident:
            raise ToolError(f"'{here}.id' is missing: send the id the call was answered with (a tool message's "
                            f"tool_call_id refers to it)", f"{here}.id", "missing_required_parameter")
        if ident in ids:
            raise ToolError(f"'{here}.id' {ident!r} repeats an earlier call's id: give each call its own id",
                            f"{here}.id")
        ids.add(ident)
        if call.get("type", "function") != "function":
            raise ToolError(f"'{here}.type' must be \"function\"", f"{here}.type")
        function = call.get("function")
        if not isinstance(function, dict):
            raise ToolError(f"'{here}.function' must be an object {{\"name\", \"arguments\"}}", f"{here}.function")
        name = _function_name(function.get("name"), f"{here}.function.name")
        arguments = _arguments(function.get("arguments"), f"{here}.function.arguments")
        calls.append({"id": ident, "type": "function", "function": {"name": name, "arguments": arguments}})
    return calls


def _arguments(value: Any, where: str) -> dict[str, Any]:
    """A call's arguments: OpenAI's JSON string of an object (an object is taken as it is)."""
    if isinstance(value, dict):
        return value
    if not isinstance(value, str):
        raise ToolError(f"'{where}' must be a JSON string of an object, e.g. \"{{\\\"city\\\": \\\"Paris\\\"}}\"",
                        where)
    try:
        parsed = json.loads(value) if value.strip() else {}
    except json.JSONDecodeError as exc:
        raise ToolError(f"'{where}' is not valid JSON ({exc.msg} at column {exc.colno}): send the arguments as a "
                        f"JSON object in a string", where) from None
    if not isinstance(parsed, dict):
        raise ToolError(f"'{where}' is a JSON {json_kind(parsed)}: send the arguments as a JSON object", where)
    return parsed


def tool_result(extra: Mapping[str, Any], where: str) -> str:
    """A tool message's ``tool_call_id`` (checked against the calls it answers by ``check_tool_turns``)."""
    ident = extra.get("tool_call_id")
    if not isinstance(ident, str) or not ident:
        raise ToolError(f"'{where}.tool_call_id' is missing: a tool message answers one call; send that call's id "
                        f"(the 'id' of one of the assistant message's tool_calls)", f"{where}.tool_call_id",
                        "missing_required_parameter")
    return ident


def check_tool_turns(messages: list[dict[str, Any]]) -> None:
    """Each tool message follows the assistant message whose call it answers (other tool messages between),
    names one of that message's call ids, and is that call's only answer; it gets the function's ``name``."""
    open_calls: dict[str, str] = {}  # id -> function name, of the last assistant message with tool_calls
    asked_at: int | None = None
    for i, message in enumerate(messages):
        role = message["role"]
        if role == "assistant" and message.get("tool_calls"):
            open_calls = {c["id"]: c["function"]["name"] for c in message["tool_calls"]}
            asked_at = i
        elif role == "tool":
            ident = message["tool_call_id"]
            if asked_at is None:
                raise ToolError(f"'messages[{i}]' is a tool message that answers no call: a tool message follows the "
                                f"assistant message whose tool_calls it answers", f"messages[{i}].role")
            if ident not in open_calls:
                raise ToolError(f"'messages[{i}].tool_call_id' is {ident!r}, which no call of messages[{asked_at}] "
                                f"has (or an earlier tool message answered): send one of "
                                f"{', '.join(sorted(open_calls)) or '(none left)'}", f"messages[{i}].tool_call_id")
            message.setdefault("name", open_calls.pop(ident))
        else:
            open_calls, asked_at = {}, None


def has_tool_turns(messages: list[dict[str, Any]]) -> int | None:
    """The index of the history's first tool message or assistant message with tool_calls (None: none)."""
    for i, message in enumerate(messages):
        if message["role"] == "tool" or message.get("tool_calls"):
            return i
    return None


# ------------------------------------------------------------------ the template


def template_source(tokenizer: Any, with_tools: bool) -> str | None:
    """The chat template ``apply_chat_template`` uses (a tokenizer may keep several by name: the
    "tool_use" one is taken with tools, as transformers takes it)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return template.get("tool_use") if with_tools and "tool_use" in template else template.get("default")
    return template if isinstance(template, str) and template else None


def template_takes_tools(source: str) -> bool:
    """Whether a chat template reads a ``tools`` variable (an undeclared name in jinja's parse of it; a
    template jinja cannot parse without transformers' own tags: whether the word ``tools`` appears in it)."""
    from jinja2 import Environment, meta
    from jinja2.exceptions import TemplateSyntaxError

    try:
        parsed = Environment(extensions=["jinja2.ext.loopcontrols"]).parse(source)
    except TemplateSyntaxError:
        return re.search(r"\btools\b", source) is not None
    return "tools" in meta.find_undeclared_variables(parsed)


def json_kind(value: Any) -> str:
    """What JSON calls ``value``'s type, for messages about a value that is not an object."""
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    return "null" if value is None else "number"


def tool_parser(tokenizer: Any, settings: ToolSettings | None, messages: list[dict[str, Any]],
                model: str) -> ParserFactory | None:
    """The parser for the model's calls (None: the request parses none); ToolError where the request needs a
    chat template that takes tools (tools to render, tool turns in the history) and the model's has none, or
    one whose calls this server cannot read back."""
    rendered = settings is not None and settings.active
    turn = has_tool_turns(messages)
    if not rendered and turn is None:
        return None
    param = "tools" if rendered else f"messages[{turn}]"
    source = template_source(tokenizer, True)
    if source is None:
        return None  # no chat template at all: the chat endpoint refuses the request (no_chat_template)
    if not template_takes_tools(source):
        raise ToolError(f"'{param}': the model '{model}' has a chat template without tool support (it reads no "
                        f"'tools'), so it cannot be told of tools or shown tool calls: leave out 'tools' and the "
                        f"tool messages, or serve a model whose template takes tools (e.g. Qwen2.5)", param,
                        "tools_not_supported")
    if not rendered:
        return None
    factory = parser_for(source)
    if factory is None:
        raise ToolError(f"'tools': the model '{model}''s chat template takes tools, but the calls it teaches are in "
                        f"a format this server cannot read back ({', '.join(n for _, n, _ in FORMATS)} only): leave "
                        f"out 'tools'", "tools", "tools_not_supported")
    return factory
