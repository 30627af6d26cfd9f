"""A grammar's mask at every tree row: the scores of the tokens the grammar forbids become -inf.

``GrammarMask`` is a logits processor the verifier runs like the output penalties (call/processing.py's
``process_rows``): it is handed each row's own prefix, the prompt, the output so far and the tree path
from x down to the row, and masks that row with the grammar's state after the OUTPUT part of it (the
prompt is not constrained). So a row's masked scores are exactly those the plain loop masks when it
reaches that prefix: greedy output with speculation equals the constrained plain loop token for token,
and sampling draws from the masked distribution.

Rows are visited in sorted order with one matcher (call/matcher.py's ``GrammarFollower``): a depth's rows
share long prefixes, so each costs the accepts beyond what the previous row shared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, cast

import torch
from transformers.generation import logits_process as lp

from ..call.decoding import Decoding
from ..call.grammar import Grammar, load_xgrammar
from ..call.matcher import GrammarFollower, stop_tokens


class GrammarMask(lp.LogitsProcessor):
    """Sets to -inf the score of every token the grammar forbids after input_ids[r, start:] (the output).

    ``start`` is the prompt length (``at_start`` rebinds it for one sequence, with a matcher of its own).
    A row whose prefix the grammar refuses (a tree path through a token its parent's mask forbade: it is
    never accepted) is left unmasked.
    """

    def __init__(self, grammar: Grammar, stop: Sequence[int], start: int):
        self.grammar, self.stop, self.start = grammar, list(stop), int(start)
        self._follower: GrammarFollower | None = None  # made on first use (one per sequence: at_start)

    def at_start(self, start: int) -> GrammarMask:
        """The same constraint over the output from column ``start`` on, with a fresh matcher."""
        return GrammarMask(self.grammar, self.stop, start)

    @property
    def follower(self) -> GrammarFollower:
        if self._follower is None:
            self._follower = GrammarFollower(self.grammar, self.stop)
        return self._follower

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        xgr = load_xgrammar()
        outputs = input_ids[:, self.start:].tolist()  # n lists: each row's output so far
        bitmask = xgr.allocate_token_bitmask(len(outputs), self.grammar.vocab)  # [n, ceil(V / 32)] int32
        follower = self.follower
        for row in sorted(range(len(outputs)), key=outputs.__getitem__):
            if not (follower.goto(outputs[row]) and follower.fill(bitmask, row)):
                bitmask[row] = -1  # every bit set: the row is left as it is
        masked = scores.float() if scores.dtype != torch.float32 else scores
        masked = masked if masked.is_contiguous() else masked.contiguous()
        xgr.apply_token_bitmask_inplace(masked, bitmask.to(masked.device))
        return cast(torch.FloatTensor, masked)


def grammar_of(processors: Any) -> GrammarMask | None:
    """The GrammarMask among ``processors`` (None: the call is unconstrained)."""
    return next((proc for proc in processors if isinstance(proc, GrammarMask)), None)


def constrained(decoding: Decoding, grammar: Grammar | None, prompt_len: int) -> Decoding:
    """``decoding`` with ``grammar``'s mask first among its processors (itself when grammar is None), over
    the output after ``prompt_len`` columns (the verifier rebinds it to each sequence's own: ``at_start``).

    First: every processor after it (penalties, logit_bias, temperature, top-k, top-p) keeps a -inf score
    -inf, so the warpers see only what the grammar allows and nothing can leave a row all -inf; the
    mask ends the output with the call's EOS ids once the grammar is complete.
    """
    if grammar is None:
        return decoding
    mask = GrammarMask(grammar, stop_tokens(decoding.eos, grammar.vocab), prompt_len)
    return replace(decoding, processors=lp.LogitsProcessorList([mask, *decoding.processors]))
