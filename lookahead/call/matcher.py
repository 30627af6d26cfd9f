"""A grammar matcher that follows token sequences (verify/grammar.py's mask, proposers/grammar.py's source).

``GrammarFollower`` keeps one xgrammar matcher on some token sequence and moves it to another by rolling
back to their common prefix and accepting the rest. ``stop_tokens`` are the ids that end a constrained
output once its grammar is complete.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .grammar import Grammar, GrammarInputError, load_xgrammar


class GrammarFollower:
    """An xgrammar matcher on ``accepted`` (the tokens it took so far); ``goto`` moves it to any sequence."""

    def __init__(self, grammar: Grammar, stop_tokens: Sequence[int]):
        xgr = load_xgrammar()
        self.matcher = xgr.GrammarMatcher(grammar.compiled, override_stop_tokens=list(stop_tokens),
                                          max_rollback_tokens=-1)
        self.accepted: list[int] = []

    def goto(self, tokens: Sequence[int]) -> bool:
        """Move to ``tokens``: True when the grammar accepts all of them (the matcher then stands after
        them), False when it refuses one (the matcher stands after the longest accepted prefix)."""
        common = 0
        limit = min(len(tokens), len(self.accepted))
        while common < limit and self.accepted[common] == tokens[common]:
            common += 1
        if common < len(self.accepted):
            self.matcher.rollback(len(self.accepted) - common)
            del self.accepted[common:]
        for token in tokens[common:]:
            if self.matcher.is_terminated() or not self.matcher.accept_token(int(token)):
                return False
            self.accepted.append(int(token))
        return True

    def fill(self, bitmask: torch.Tensor, row: int) -> bool:
        """Write the allowed next tokens into bitmask[row] (False, nothing written, once terminated)."""
        if self.matcher.is_terminated():
            return False
        self.matcher.fill_next_token_bitmask(bitmask, row)
        return True


def stop_tokens(eos: np.ndarray, vocab: int) -> list[int]:
    """The call's EOS ids inside the vocabulary: what ends a constrained output once the grammar is done
    (GrammarInputError when there is none: the output could never end)."""
    ids = [int(t) for t in np.asarray(eos).reshape(-1) if 0 <= int(t) < vocab]
    if not ids:
        raise GrammarInputError("response_format needs an end-of-sequence token id inside the vocabulary "
                                f"(got eos_token_id {np.asarray(eos).tolist()}): pass eos_token_id=<the "
                                "tokenizer's eos id> so the output can end where the grammar is complete")
    return ids
