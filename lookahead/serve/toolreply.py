"""A reply's content and tool calls in OpenAI's shapes: the streamed deltas (``{"content": ...}`` and
``{"tool_calls": [{"index", "id", "type", "function": {"name", "arguments"}}]}``), the whole message,
and the finish reason (``"tool_calls"`` where the model called and stopped by itself).

Each call is streamed whole, in one delta, once its block has been read (its arguments are not cut
into pieces); the whole message is the same parser fed the whole text, so a streamed reply joins to
exactly the message a non-streamed one gets.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from .toolcalls import Call, CallParser, Piece


def call_id() -> str:
    """A fresh call id, as OpenAI writes them: ``call_`` and 24 hex digits."""
    return "call_" + uuid.uuid4().hex[:24]


class ToolReply:
    """Turns a reply's text into OpenAI deltas through ``parser``; ``calls`` are the calls so far."""

    def __init__(self, parser: CallParser, new_id: Callable[[], str] = call_id) -> None:
        self.parser, self.new_id = parser, new_id
        self.calls: list[dict[str, Any]] = []

    def feed(self, text: str) -> list[dict[str, Any]]:
        """The deltas ``text`` completes."""
        return self._deltas(self.parser.feed(text)) if text else []

    def finish(self) -> list[dict[str, Any]]:
        """The last deltas, at the end of the reply."""
        return self._deltas(self.parser.finish())

    def finish_reason(self, reason: str) -> str:
        """``"tool_calls"`` where the reply holds a call and ended by itself ("stop"); else ``reason``."""
        return "tool_calls" if self.calls and reason == "stop" else reason

    def _deltas(self, pieces: list[Piece]) -> list[dict[str, Any]]:
        deltas: list[dict[str, Any]] = []
        for piece in pieces:
            if isinstance(piece, Call):
                call = {"id": self.new_id(), "type": "function",
                        "function": {"name": piece.name, "arguments": piece.arguments}}
                self.calls.append(call)
                deltas.append({"tool_calls": [{"index": len(self.calls) - 1, **call}]})
            elif deltas and "content" in deltas[-1]:
                deltas[-1]["content"] += piece
            else:
                deltas.append({"content": piece})
        return deltas


def tool_message(reply: ToolReply, text: str) -> dict[str, Any]:
    """The assistant message of a whole reply: its content (None when it only calls) and its tool_calls."""
    deltas = reply.feed(text) + reply.finish()
    content = "".join(d["content"] for d in deltas if "content" in d)
    message: dict[str, Any] = {"role": "assistant", "content": content if content or not reply.calls else None}
    if reply.calls:
        message["tool_calls"] = reply.calls
    return message
