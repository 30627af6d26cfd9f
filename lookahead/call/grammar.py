"""A call's structured-output constraint (``response_format``) compiled into a grammar (xgrammar).

``response_format`` is ``"json_object"`` (any JSON object) or a JSON schema (a dict: the output is a JSON
value valid for it, keys in the schema's order, no whitespace between tokens, additional properties
refused unless the schema allows them: xgrammar's strict mode). The grammar engine is the optional
extra ``lookahead-lm[grammar]`` (xgrammar), imported only when a call asks for a constraint; without it
the call is refused by name with the install command.

``Grammars`` compiles for one tokenizer and vocabulary width and keeps the compiler (its token table
is built once per tokenizer, and it caches compiled grammars). Its compiles may come from several threads
(the server compiles a request's constraint off its event loop): they take turns.
"""

from __future__ import annotations

import importlib
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import GenerateInputError, one_line

EXTRA = "pip install 'lookahead-lm[grammar]'"  # the extra that brings the grammar engine (xgrammar)
JSON_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
# A tool call's JSON as chat templates write calls back into the history (transformers' ``tojson``: json.dumps's
# separators), so a call reads as the model learned it and as the next request resends it (the prefix cache,
# model/prefixes.py, then restores it too).
TEMPLATE_SEPARATORS = (", ", ": ")


class GrammarInputError(GenerateInputError):
    """A structured-output constraint that cannot be honoured; ``field`` names the argument (the server's
    400 names it)."""

    def __init__(self, message: str, field: str = "response_format"):
        super().__init__(message)
        self.field = field


def load_xgrammar() -> Any:
    """The xgrammar module, or GrammarInputError naming the extra that installs it."""
    try:
        return importlib.import_module("xgrammar")
    except ImportError:
        raise GrammarInputError(f"structured output (response_format) needs the grammar engine xgrammar, "
                                f"which is not installed: {EXTRA}") from None


@dataclass(frozen=True)
class TaggedCall:
    """A reply that is tool calls as a chat template writes them: each ``open_tag``, a JSON value valid for
    ``schema`` (", " and ": " between its items where the tokenizer writes them: ``Grammars.call_separators``),
    ``close_tag`` (a newline allowed after the open tag and before the close tag). ``most``: 1,
    exactly one call; None, one or more, a newline allowed between two (parallel calls)."""

    schema: dict
    open_tag: str  # e.g. "<tool_call>" (Qwen2.5 / Hermes)
    close_tag: str  # e.g. "</tool_call>"
    most: int | None = 1  # 1: one call; None: one or more

    def __post_init__(self) -> None:
        if self.most not in (1, None):
            raise ValueError(f"most must be 1 (one call) or None (one or more), got {self.most!r}")


@dataclass(frozen=True)
class Grammar:
    """One compiled constraint: the xgrammar CompiledGrammar and the vocabulary width V of the logits."""

    compiled: Any  # xgrammar.CompiledGrammar
    vocab: int  # V: the logits' width (a bitmask covers all of it)
    source: str  # what was compiled: "json_object" or the schema's JSON text (for messages and tests)
    spell: Callable[[str], list[int]] | None = field(default=None, compare=False)  # a text in the tokenizer's
    # own tokens with its added tokens spelled out in characters (``spelling``), as a model writes a text it
    # writes character by character; None: no such tokenization


def check_schema(schema: object, where: str = "response_format") -> None:
    """Refuse what is no JSON schema before the grammar engine sees it (GrammarInputError naming ``where``)."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise GrammarInputError(f"{where} must be a JSON schema (a JSON object) or 'json_object', "
                                f"got {type(schema).__name__}", where)
    kinds = schema.get("type")
    for kind in kinds if isinstance(kinds, list) else [kinds]:
        if kind is not None and kind not in JSON_TYPES:
            raise GrammarInputError(f"{where}.type {kind!r} is no JSON schema type: use one of "
                                    f"{', '.join(JSON_TYPES)}", where)
    properties = schema.get("properties")
    if properties is not None and not isinstance(properties, dict):
        raise GrammarInputError(f"{where}.properties must map property names to schemas, "
                                f"got {type(properties).__name__}", where)
    for name, inner in (properties or {}).items():
        check_schema(inner, f"{where}.properties.{name}")
    required = schema.get("required")
    if required is not None and not (isinstance(required, list) and all(isinstance(r, str) for r in required)):
        raise GrammarInputError(f"{where}.required must be a list of property names, got {required!r}", where)
    if isinstance(schema.get("items"), (dict, bool)):
        check_schema(schema["items"], f"{where}.items")


class Grammars:
    """Compiles constraints for one tokenizer and logits width V (the compiler is made on first use)."""

    def __init__(self, tokenizer: Any, vocab: int):
        self.tokenizer = tokenizer
        self.vocab = int(vocab)
        self._compiler: Any = None
        self._turn = threading.Lock()  # one compile (or the compiler's making) at a time

    def compiler(self) -> Any:
        """The xgrammar GrammarCompiler over this tokenizer's tokens (made once)."""
        if self._compiler is None:
            xgr = load_xgrammar()
            if self.tokenizer is None:
                raise GrammarInputError("response_format needs the tokenizer: build "
                                        "LookaheadGenerator(model, tokenizer) to constrain the output")
            info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab)
            self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        return self._compiler

    def compile(self, response_format: object, field: str = "response_format") -> Grammar:
        """``response_format`` ("json_object" or a JSON schema dict) compiled (GrammarInputError naming
        ``field`` when it is neither, or when the grammar engine rejects the schema); one thread at a time."""
        with self._turn:
            return self._compile(response_format, field)

    def _compile(self, response_format: object, field: str) -> Grammar:
        """``compile``, its caller holding the turn."""
        if response_format == "json_object":  # any JSON object, any keys (strict mode off)
            compiled = self.compiler().compile_json_schema('{"type": "object"}', any_whitespace=False,
                                                           separators=(",", ":"), strict_mode=False)
            return Grammar(compiled, self.vocab, "json_object", spelling(self.tokenizer))
        if isinstance(response_format, TaggedCall):
            return self._tagged(response_format, field)
        check_schema(response_format, field)
        text = json.dumps(response_format)
        try:
            compiled = self.compiler().compile_json_schema(text, any_whitespace=False, separators=(",", ":"),
                                                           strict_mode=True)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise GrammarInputError(f"{field}: the grammar engine rejects this JSON schema: {engine_message(exc)}; "
                                    f"fix the schema there, with the JSON schema keywords xgrammar supports (type, "
                                    f"properties, required, items, enum, const, anyOf, $ref to #/$defs, ...)",
                                    field) from None
        return Grammar(compiled, self.vocab, text, spelling(self.tokenizer))

    def call_separators(self) -> tuple[str, str]:
        """A tool call's JSON separators: TEMPLATE_SEPARATORS where the tokenizer writes a space (a real one
        does), else "," and ":" (a vocabulary without a space could not write the others)."""
        probe = "a, b"
        tokenizer = self.tokenizer
        writes = tokenizer is not None and tokenizer.decode(tokenizer.encode(probe, add_special_tokens=False)) == probe
        return TEMPLATE_SEPARATORS if writes else (",", ":")

    def _tagged(self, call: TaggedCall, field: str) -> Grammar:
        """``call`` compiled: the tags around the schema's JSON (GrammarInputError naming ``field``)."""
        xgr = load_xgrammar()
        text = json.dumps(call.schema)
        try:
            body = xgr.Grammar.from_json_schema(text, any_whitespace=False, separators=self.call_separators(),
                                                strict_mode=True)
            opening = xgr.Grammar.from_ebnf(f'root ::= {json.dumps(call.open_tag)} "\\n"?')
            closing = xgr.Grammar.from_ebnf(f'root ::= "\\n"? {json.dumps(call.close_tag)}')
            one = xgr.Grammar.concat(opening, body, closing)
            compiled = self.compiler().compile_grammar(one if call.most == 1 else _one_or_more(xgr, one))
        except (RuntimeError, ValueError, TypeError) as exc:
            raise GrammarInputError(f"{field}: the grammar engine rejects the tools' parameter schemas: "
                                    f"{engine_message(exc)}; fix the schema there", field) from None
        source = f"{call.open_tag}{text}{call.close_tag}"
        return Grammar(compiled, self.vocab, source if call.most == 1 else f"({source})+", spelling(self.tokenizer))


def spelling(tokenizer: Any) -> Callable[[str], list[int]] | None:
    """A function giving a text's tokens as the tokenizer's own model splits it with no added token matched:
    ``<tool_call>`` as ``<``, ``tool``, ``_call``, ``>`` where Qwen2.5's tokenizer also holds it as one added
    token (the spelling a model that writes the tag in characters uses); None for a tokenizer without a fast
    backend. The function gives [] for a text its tokens do not decode back to."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None

    def spell(text: str) -> list[int]:
        normal = backend.normalizer.normalize_str(text) if backend.normalizer is not None else text
        split = backend.pre_tokenizer
        pieces = split.pre_tokenize_str(normal) if split is not None else [(normal, None)]
        ids = [token.id for piece, _ in pieces for token in backend.model.tokenize(piece)]
        return ids if tokenizer.decode(ids) == text else []

    return spell


def _one_or_more(xgr: Any, one: Any) -> Any:
    """The grammar ``one``, then ``one`` again any number of times, each after an optional newline (xgrammar's
    structural tag: the same rules as ``one`` alone, so each call reads exactly as a single call does)."""
    call = {"type": "grammar", "grammar": str(one)}
    again = {"type": "sequence", "elements": [{"type": "optional", "content": {"type": "const_string",
                                                                                 "value": "\n"}}, call]}
    return xgr.Grammar.from_structural_tag({"type": "structural_tag", "format": {
        "type": "sequence", "elements": [call, {"type": "star", "content": again}]}})


def engine_message(exc: BaseException) -> str:
    """xgrammar's error on one line without its source location ("[hh:mm:ss] /path/file.cc:94: ")."""
    return re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", one_line(exc))
