"""Forced tokens: what a structured-output grammar forces next (a schema's keys, braces, quotes), proposed
as candidates that cost no forward to make.

The source follows the output with a matcher of its own (call/matcher.py's ``GrammarFollower``) and
proposes one row: xgrammar's jump-forward tokens (the forced continuation, tokenized greedily by the
longest vocabulary tokens), else the one token the grammar allows next when it allows only one (the
EOS id once the grammar is complete and nothing may follow). The mask makes these the only tokens the
target can take where the grammar allows nothing else, so they are accepted there; where the forced
text could be tokenized otherwise, the target's own choice decides (the row is a candidate, never an
answer).
"""

from __future__ import annotations

from collections.abc import Sequence

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
        tokens, label = self.forced()
        if not tokens:
            return no_candidates()
        row = np.array(tokens[:length], dtype=np.int64)  # [L]
        return single_class(row[None], np.array([row.shape[0]], dtype=np.int64), np.array([label]))

    def forced(self) -> tuple[list[int], int]:
        """(the tokens forced after where the matcher stands, their class); ([], 0) when there is a choice."""
        matcher = self.follower.matcher
        if matcher.is_terminated():
            return [], 0
        jump = list(matcher.find_jump_forward_tokens())
        if jump:
            return jump, 0
        xgr = load_xgrammar()
        bitmask = xgr.allocate_token_bitmask(1, self.grammar.vocab)  # [1, ceil(V / 32)]
        self.follower.fill(bitmask, 0)
        allowed = only_allowed(bitmask[0].numpy(), self.grammar.vocab)
        return ([allowed], 1) if allowed is not None else ([], 0)


def only_allowed(words: np.ndarray, vocab: int) -> int | None:
    """The one token id a bitmask row [ceil(V / 32)] int32 allows (bit t % 32 of word t // 32), or None
    when it allows none or several."""
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab]  # [V] 0/1
    allowed = np.flatnonzero(bits)
    return int(allowed[0]) if allowed.shape[0] == 1 else None
