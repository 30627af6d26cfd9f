"""Structured output, the request's side: ``response_format`` read, compiled into a grammar and made the
mask that constrains the request's decode (verify/grammar.py), with speculation as usual.

``{"type": "text"}`` (or none): free text. ``{"type": "json_object"}``: a JSON object.
``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": true}}``: a JSON value
valid for the schema (xgrammar's strict reading: no properties the schema does not name). ``strict``
false is constrained the same way (the output is then still valid for the schema). The output ends with
the model's EOS once the grammar is complete. Every bad value is a 400 naming the field and the fix: a
format this server does not know, a missing or non-object schema, a schema that is no JSON schema or
that the grammar engine rejects, and a server without the grammar engine (the extra to install).

``tool_choice`` "required" or a named function makes the reply calls in the ``<tool_call>`` format
(``tool_constraint``), through the same grammar engine: one or more calls (each block after an optional
newline, as Qwen2.5 writes parallel calls) while ``parallel_tool_calls`` is true (the default), exactly
one when it is false; with a named function, every call is to it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import Grammar, GrammarInputError, TaggedCall
from .schemas import bad_request

if TYPE_CHECKING:
    from .. import LookaheadGenerator
    from .tools import ToolSettings

FORMATS = ("text", "json_object", "json_schema")  # response_format.type values this server honours
SCHEMA_FIELD = "response_format.json_schema.schema"
CALL_TAGS = ("<tool_call>", "</tool_call>")  # the call format this server reads back (toolcalls.py: Qwen2.5 / Hermes)


def read_format(value: Any) -> tuple[Any, str] | None:
    """``response_format`` as (what call/grammar.py compiles: "json_object" or a schema dict, the field
    it came from); None for free text. APIError 400 naming the bad field."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") not in FORMATS:
        kind = value.get("type") if isinstance(value, dict) else value
        raise bad_request(f"'response_format' must be {{\"type\": \"text\"}}, {{\"type\": \"json_object\"}} or "
                          f"{{\"type\": \"json_schema\", \"json_schema\": {{\"name\": ..., \"schema\": {{...}}}}}}, "
                          f"got type {kind!r}", "response_format.type", "invalid_value")
    if value["type"] == "text":
        return None
    if value["type"] == "json_object":
        return "json_object", "response_format"
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise bad_request("'response_format.json_schema' must be an object {\"name\": ..., \"schema\": {...}, "
                          "\"strict\": true}: send the JSON schema there", "response_format.json_schema",
                          "invalid_value")
    if "schema" not in spec:
        raise bad_request("'response_format.json_schema.schema' is missing: send the JSON schema the output must "
                          "follow", SCHEMA_FIELD, "missing_required_parameter")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad_request(f"'response_format.json_schema.strict' must be true or false, got {strict!r}",
                          "response_format.json_schema.strict", "invalid_value")
    return spec["schema"], SCHEMA_FIELD


def constraint(generator: LookaheadGenerator, value: Any) -> Grammar | None:
    """The mask constraining a request's output as ``response_format`` asks (None: free text); APIError 400
    naming the field when it cannot be honoured."""
    read = read_format(value)
    if read is None:
        return None
    spec, field = read
    try:
        return generator.grammar(spec)  # (the decode masks by it, the model's EOS once it is complete)
    except GrammarInputError as exc:
        param = exc.field.replace("response_format", field, 1) if exc.field.startswith("response_format") \
            else exc.field
        message = str(exc).replace("response_format", field, 1) if field != "response_format" else str(exc)
        raise bad_request(message, param, "invalid_value") from None


def call_schema(settings: ToolSettings) -> dict[str, Any]:
    """The JSON of one call the template's format holds, ``{"name": ..., "arguments": {...}}``: to the named
    function, or to any of the tools (anyOf), its arguments valid for that tool's parameters."""
    options = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                "properties": {"name": {"const": tool["function"]["name"]},
                               "arguments": tool["function"].get("parameters") or {"type": "object"}}}
               for tool in settings.tools if settings.function in (None, tool["function"]["name"])]
    return options[0] if len(options) == 1 else {"anyOf": options}


def tool_constraint(generator: LookaheadGenerator, settings: ToolSettings | None) -> Grammar | None:
    """The mask making the reply calls (tool_choice "required" or a named function; None otherwise) in the
    ``<tool_call>`` format: one or more with ``parallel_tool_calls`` true, exactly one with it false;
    APIError 400 naming ``tools`` when the parameters cannot be compiled."""
    if settings is None or not settings.forced:
        return None
    try:
        most = None if settings.parallel else 1
        return generator.grammar(TaggedCall(call_schema(settings), *CALL_TAGS, most=most))
    except GrammarInputError as exc:
        message = str(exc).replace("response_format", "tools", 1)
        raise bad_request(message, "tools", "invalid_value") from None
