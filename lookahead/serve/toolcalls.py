"""Tool calls read back from a model's text, as it streams: one small parser per format a chat
template teaches its model, each turning text into content pieces (``str``) and calls (``Call``).

A parser is fed the reply's visible text piece by piece (``feed``) and told where it ends
(``finish``); whatever the split, the pieces it returns are the same (a piece of content may be cut
differently, never differently joined). Content that may still turn out to be the start of a call
is held back until it cannot. Whitespace that only separates content from a call (or two calls)
is not content; a reply with no call comes back as exactly its text.

A call block the parser cannot read (not JSON, no name, a function no tool defines, arguments that
are no object) is not a call: its text is content, so nothing the model wrote is lost.

Formats:
    ``TaggedJsonCalls``  Qwen2.5 (the Hermes format): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n``
                         ``</tool_call>``, repeated for parallel calls; a block holding a JSON list of such
                         objects (SmolLM2's function-calling format) is read as its calls in order.
    ``WholeReplyCalls``  around it: a reply that is nothing but the call's JSON, without the tags: bare, in a
                         ```json fence, or opened with the doubled brace Qwen2.5's template shows the format
                         with (``{{"name": ...}``): Qwen2.5-Coder-Instruct may answer so, untagged, on its
                         template's own tool prompt. Such a reply is held back until it ends (it is a call
                         only if nothing else follows), or until it can no longer be one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .text import partial_tail


@dataclass(frozen=True)
class Call:
    """One call the model made: a function's name and its arguments as JSON text of an object."""

    name: str
    arguments: str


Piece = str | Call  # content text, or a call


class CallParser(Protocol):
    """What the server feeds a reply's text through (see the module's docstring)."""

    def feed(self, text: str) -> list[Piece]: ...

    def finish(self) -> list[Piece]: ...


class TaggedJsonCalls:
    """Calls as JSON between an opening and a closing tag (``<tool_call>`` ... ``</tool_call>``).

    ``names``: the functions the request defines (a call to any other is content). ``max_calls``: calls
    past this many are dropped (``parallel_tool_calls: false``: one); None: no limit.
    """

    def __init__(self, names: frozenset[str], max_calls: int | None = None, open_tag: str = "<tool_call>",
                 close_tag: str = "</tool_call>") -> None:
        if not open_tag or not close_tag:
            raise ValueError("open_tag and close_tag must be non-empty")
        if max_calls is not None and max_calls < 1:
            raise ValueError(f"max_calls must be None or >= 1, got {max_calls}")
        self.names, self.max_calls = names, max_calls
        self.open, self.close = open_tag, close_tag
        self.buffer = ""  # text not read yet: inside a block, or what may be the start of the opening tag
        self.inside = False  # the buffer is a block's body (its opening tag was read)
        self.pending = ""  # whitespace after the last content: content only if content follows (or the reply ends)
        self.after_call = False  # no content since the last call: whitespace here separates, it is not content
        self.calls = 0  # calls returned so far

    def feed(self, text: str) -> list[Piece]:
        """The content and calls ``text`` completes."""
        out: list[Piece] = []
        self.buffer += text
        while True:
            if self.inside:
                end = self.buffer.find(self.close)
                if end < 0:
                    return out
                body, self.buffer = self.buffer[:end], self.buffer[end + len(self.close):]
                self.inside = False
                self._block(body, True, out)
            else:
                start = self.buffer.find(self.open)
                if start < 0:
                    keep = partial_tail(self.buffer, self.open)
                    self._text(self.buffer[:len(self.buffer) - keep], out)
                    self.buffer = self.buffer[len(self.buffer) - keep:]
                    return out
                self._text(self.buffer[:start], out)
                self.buffer = self.buffer[start + len(self.open):]
                self.inside = True

    def finish(self) -> list[Piece]:
        """The rest at the end of the reply (a block left open is read as it stands, less any start of its
        closing tag it ends in)."""
        out: list[Piece] = []
        if self.inside:
            self._block(self.buffer, False, out)
        else:
            self._text(self.buffer, out)
        self.buffer, self.inside = "", False
        if self.pending:
            out.append(self.pending)
            self.pending = ""
        return out

    def _text(self, text: str, out: list[Piece]) -> None:
        """Content, less the whitespace that only separates it from a call."""
        text, self.pending = self.pending + text, ""
        if self.after_call:
            text = text.lstrip()
            if not text:
                return
            self.after_call = False
        body = text.rstrip()
        self.pending = text[len(body):]
        if body:
            out.append(body)

    def _block(self, body: str, closed: bool, out: list[Piece]) -> None:
        # a block the reply's end left open may end in part of its closing tag (max_tokens cut it there)
        calls = self._calls(body if closed else body[:len(body) - partial_tail(body, self.close)])
        if calls is None:  # not a call: the block is content as the model wrote it
            self._text(self.open + body + (self.close if closed else ""), out)
            return
        self.pending, self.after_call = "", True
        for call in calls:
            if self.max_calls is None or self.calls < self.max_calls:
                self.calls += 1
                out.append(call)

    def _calls(self, body: str) -> list[Call] | None:
        return read_calls(body, self.names)


class WholeReplyCalls:
    """``inner``, except for a reply that is nothing but a call's JSON without the tags (see the module's
    docstring): while the reply may still be one, its text is held back; at its end, it is read as calls."""

    def __init__(self, inner: TaggedJsonCalls) -> None:
        self.inner = inner
        self.held = ""  # the reply so far, while it may be a bare call
        self.deciding = True

    def feed(self, text: str) -> list[Piece]:
        if not self.deciding:
            return self.inner.feed(text)
        self.held += text
        if may_be_bare_call(self.held):
            return []
        self.deciding = False
        held, self.held = self.held, ""
        return self.inner.feed(held)

    def finish(self) -> list[Piece]:
        if self.deciding and self.held.strip():
            calls = read_calls(unfenced(self.held), self.inner.names)
            if calls is not None:
                self.deciding, self.held = False, ""
                most = self.inner.max_calls
                return list(calls[:most] if most is not None else calls)
        held, self.held, self.deciding = self.held, "", False
        return self.inner.feed(held) + self.inner.finish()


def may_be_bare_call(text: str) -> bool:
    """Whether a reply that begins with ``text`` may be nothing but a call's JSON (bare, or in a ```json
    fence): false stays false as the text grows."""
    text = text.lstrip()
    if "```".startswith(text):
        return True
    if text.startswith("```"):
        header, newline, text = text.partition("\n")
        if not newline:
            return "```json".startswith(header.rstrip()) or header.rstrip() == "```json"
        if header.strip() not in ("```", "```json"):
            return False
        text = text.lstrip()
    if not text or text == "[":
        return True
    if text[0] == "[":
        text = text[1:].lstrip()
    return not text or text[0] == "{"


def unfenced(text: str) -> str:
    """A reply's text without the ```json fence around it (the text itself where it has none)."""
    text = text.strip()
    if text.startswith("```") and text.endswith("```") and "\n" in text:
        return text.partition("\n")[2][:-3]
    return text


def read_calls(body: str, names: frozenset[str]) -> list[Call] | None:
    """The calls a JSON text holds: an object ``{"name", "arguments"}`` or a list of them, also written with
    the doubled opening brace of Qwen2.5's template (None: it is no call of a known function)."""
    body = body.strip()
    texts = [body] + ([body[1:], body[1:-1]] if body.startswith("{{") else [])
    for text in texts:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            continue
        items = value if isinstance(value, list) else [value]
        calls = [_call(item, names) for item in items]
        if calls and all(call is not None for call in calls):
            return [call for call in calls if call is not None]
    return None


def _call(item: Any, names: frozenset[str]) -> Call | None:
    """``{"name": ..., "arguments": {...}}`` (arguments also as a JSON string, or left out: none) as a Call."""
    if not isinstance(item, dict) or item.get("name") not in names:
        return None
    arguments = item.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return Call(str(item["name"]), json.dumps(arguments, ensure_ascii=False))


ParserFactory = Callable[[frozenset[str], "int | None"], CallParser]

# The formats this server reads, each found by a marker its chat template writes into the prompt.
FORMATS: tuple[tuple[str, str, ParserFactory], ...] = (
    ("<tool_call>", "Qwen2.5 / Hermes <tool_call> JSON",
     lambda names, most: WholeReplyCalls(TaggedJsonCalls(names, most))),
)


def parser_for(template: str) -> ParserFactory | None:
    """The parser for the calls a chat template teaches (None: no format this server reads)."""
    for marker, _, factory in FORMATS:
        if marker in template:
            return factory
    return None
