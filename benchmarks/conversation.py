"""One multi-turn tool-call conversation, driven turn by turn (the ``agent`` workload of bench-serve).

``run_conversation`` sends the conversation's messages with its request fields (the tools) and the turn's
``tool_choice``, reads the model's calls off the turn's record, runs each call through the plan's fake tools,
appends the assistant message with its ``tool_calls`` and one ``tool`` message per call, and sends the next
turn; it ends after the plan's last turn (whose calls are not run), at a turn that made no call (the model
answered), or at a failed turn. Each turn is one request: one record, timed and counted like any other.

The history sent back is the client's own, the same for every server that answered alike: the calls' ids
are ``call_<turn>_<i>`` (not the server's random ones, which a template may render), and their arguments
the canonical JSON text of what the model wrote (``canonical_arguments``), so two servers whose turns agree
get identical next prompts, whatever spacing their JSON had.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

Send = Callable[[list[dict[str, Any]], dict[str, Any]], Awaitable[dict[str, Any]]]  # (messages, fields) -> record


@dataclass(frozen=True)
class AgentPlan:
    """How a conversation runs: ``choices[k]`` is turn k's ``tool_choice`` (so ``len(choices)`` turns at most),
    ``execute(name, arguments JSON text)`` a tool's result as text (deterministic: the same call, the same
    result)."""

    choices: tuple[str, ...]
    execute: Callable[[str, str], str]

    def __post_init__(self) -> None:
        if not self.choices:
            raise ValueError("an agent plan needs at least one turn")

    @property
    def max_turns(self) -> int:
        """Requests a conversation sends at most."""
        return len(self.choices)


def canonical_arguments(arguments: str) -> str:
    """A call's arguments as ``json.dumps`` writes their value (key order kept, ", " and ": " separators); the
    text itself when it is no JSON."""
    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False)
    except (json.JSONDecodeError, TypeError):
        return arguments


def call_id(turn: int, index: int) -> str:
    """The id the client gives call ``index`` of turn ``turn`` in the history it sends back."""
    return f"call_{turn}_{index}"


def turn_messages(turn: int, content: str, calls: list[dict[str, str]],
                  results: list[str]) -> list[dict[str, Any]]:
    """The assistant message holding turn ``turn``'s calls (``{"name", "arguments"}``), then one tool message per
    call carrying its result."""
    ids = [call_id(turn, i) for i in range(len(calls))]
    assistant = {"role": "assistant", "content": content or None, "tool_calls": [
        {"id": ident, "type": "function",
         "function": {"name": call["name"], "arguments": canonical_arguments(call["arguments"])}}
        for ident, call in zip(ids, calls)]}
    return [assistant, *({"role": "tool", "tool_call_id": ident, "content": result}
                         for ident, result in zip(ids, results))]


async def run_conversation(send: Send, ident: str, messages: list[dict[str, Any]], fields: dict[str, Any],
                           plan: AgentPlan) -> list[dict[str, Any]]:
    """The conversation's turn records, in order (see the module). ``send(messages, fields)`` makes one request
    and returns its record, which holds ``error`` (None: answered), ``content`` and ``tool_calls`` (a list of
    ``{"name", "arguments"}``). Each record gains ``id`` (``<ident>#<turn>``), ``conversation``, ``turn``,
    ``tool_choice`` and, where its calls were run, ``tool_results`` (one per call, in order)."""
    history = list(messages)
    records: list[dict[str, Any]] = []
    for turn, choice in enumerate(plan.choices):
        record = dict(await send(history, {**fields, "tool_choice": choice}))
        record.update(id=f"{ident}#{turn}", conversation=ident, turn=turn, tool_choice=choice)
        records.append(record)
        calls = record.get("tool_calls") or []
        if record.get("error") is not None or not calls or turn + 1 == plan.max_turns:
            break
        results = [plan.execute(call["name"], call["arguments"]) for call in calls]
        record["tool_results"] = results
        history = history + turn_messages(turn, record.get("content") or "", calls, results)
    return records
