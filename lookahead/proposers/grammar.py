"""Forced tokens: what a structured-output grammar forces next (a schema's keys, braces, quotes), proposed
as candidates that cost no forward to make.

The source follows the output with a matcher of its own (call/matcher.py's ``GrammarFollower``) and
proposes xgrammar's jump-forward tokens (the forced continuation, tokenized greedily by the longest
vocabulary tokens) and, where it differs, the same text as the tokenizer's own model splits it with no
added token matched (``Grammar.spell``: a tag such as ``<tool_call>`` is one added token to xgrammar's
greedy tokenization, while a model may write it in characters, and then does so every time); else the
one token the grammar allows next when it allows only one (the EOS id once the grammar is complete and
nothing may follow). Where the grammar allows a newline after the forced text and forces more text after
it (a call's open tag, then its JSON: templates write the newline between), the spelled text through
that newline is one more row. The mask makes these the only tokens the target can take where the grammar allows
nothing else, so they are accepted there; where the forced text could be tokenized otherwise, the
target's own choice decides (the rows are candidates, never an answer).

Worked example (Qwen2.5's tokenizer, a forced call's start): the forced text ``<tool_call>`` gives the
rows [<tool_call>] (xgrammar's, one added token), [<, tool, _call, >] (spelled) and, the newline allowed
and the call's JSON forced after it, [<, tool, _call, >\n, {", name, ":, (space)"] (through the newline).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..call.grammar import Grammar, load_xgrammar
from ..call.matcher import GrammarFollower
from .base import Candidates, Source, StepContext, no_candidates, single_class

FORCED_PRIORS = np.array([0.9, 0.98])  # class 0: jump-forward text; 1: the only token the grammar allows


class NoForcedTokens(Source):
    """The forced tokens' place among the sources for a call without a grammar: it proposes nothing. Every
    sequence has the source (one or the other), so the shared estimate table has the same blocks for a
    constrained call as for the free calls before it."""

    name = "grammar"
    priors = FORCED_PRIORS

    def propose(self, seq: np.ndarray, stop: int, limit: int, estimates: np.ndarray,
                step: StepContext | None = None) -> Candidates:
        return no_candidates()


class ForcedTokens(NoForcedTokens):
    """Proposes the tokens ``grammar`` forces after the output so far (one row of up to ``length``)."""

    def __init__(self, grammar: Grammar, stop: Sequence[int], length: int):
        self.grammar, self.stop, self.length = grammar, list(stop), int(length)
        self.follower = GrammarFollower(grammar, self.stop)
        self.prompt_len = 0

    def begin(self, seq: np.ndarray, stop: int) -> None:
        self.follower = GrammarFollower(self.grammar, self.stop)
        self.prompt_len = stop

    def propose(self, seq: np.ndarray, stop: int, limit: int, estimates: np.ndarray,
                step: StepContext | None = None) -> Candidates:
        length = self.length if step is None else min(self.length, step.tokens_left)
        if limit <= 0 or length <= 0 or not self.follower.goto(seq[self.prompt_len:stop].tolist()):
            return no_candidates()
        rows, label = self.forced()
        if not rows:
            return no_candidates()
        lens = np.array([min(len(row), length) for row in rows], dtype=np.int64)  # [G]
        tokens = np.zeros((len(rows), int(lens.max())), dtype=np.int64)  # [G, L]
        for g, row in enumerate(rows):
            tokens[g, :lens[g]] = row[:lens[g]]
        return single_class(tokens, lens, np.full(len(rows), label, dtype=np.int64))

    def forced(self) -> tuple[list[list[int]], int]:
        """(the rows of tokens forced after where the matcher stands, their class): xgrammar's jump-forward
        tokens, the text spelled, and spelled through a newline (see the module), each left out where another
        row begins with it (class 0); the one token allowed (class 1); ([], 0) when there is a choice."""
        matcher = self.follower.matcher
        if matcher.is_terminated():
            return [], 0
        jump = list(matcher.find_jump_forward_tokens())
        if jump:
            text = matcher.find_jump_forward_string()
            return longest_rows([jump, self.spelled(text), self.spelled(text + through_newline(matcher, text))]), 0
        xgr = load_xgrammar()
        bitmask = xgr.allocate_token_bitmask(1, self.grammar.vocab)  # [1, ceil(V / 32)]
        self.follower.fill(bitmask, 0)
        allowed = only_allowed(bitmask[0].numpy(), self.grammar.vocab)
        return ([[allowed]], 1) if allowed is not None else ([], 0)

    def spelled(self, text: str) -> list[int]:
        """``text`` as ``Grammar.spell`` writes it ([] without a spelling, or where a token is past V)."""
        tokens = self.grammar.spell(text) if self.grammar.spell is not None and text else []
        return tokens if tokens and max(tokens) < self.grammar.vocab else []


def longest_rows(rows: list[list[int]]) -> list[list[int]]:
    """``rows`` without the empty ones, the repeats and those another row begins with (the trie holds them).

    [[1, 2], [], [1, 2, 3], [4], [4]] -> [[1, 2, 3], [4]].
    """
    kept: list[list[int]] = []
    for i, row in enumerate(rows):
        covered = any(other[:len(row)] == row and (len(other) > len(row) or j < i)
                      for j, other in enumerate(rows) if j != i and len(other) >= len(row))
        if row and not covered:
            kept.append(row)
    return kept


def through_newline(matcher: Any, text: str) -> str:
    """"\n" and the text the grammar forces after it, where ``matcher`` (standing before the forced ``text``)
    takes a newline after ``text`` and then forces more; "" otherwise. (A copy of the matcher is moved.)"""
    ahead = matcher.fork()
    if not (ahead.accept_string(text) and ahead.accept_string("\n")):
        return ""
    after = ahead.find_jump_forward_string()
    return "\n" + after if after else ""


def only_allowed(words: np.ndarray, vocab: int) -> int | None:
    """The one token id a bitmask row [ceil(V / 32)] int32 allows (bit t % 32 of word t // 32), or None
    when it allows none or several."""
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab]  # [V] 0/1
    allowed = np.flatnonzero(bits)
    return int(allowed[0]) if allowed.shape[0] == 1 else None
