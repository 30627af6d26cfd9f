"""What generate returns: the token ids, or (return_dict_in_generate=True) an output object with the stats."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .logprobs import SequenceLogprobs
from .stats import GenerationStats


@dataclass
class LookaheadOutput(GenerateDecoderOnlyOutput):
    """``model.generate``'s output with ``return_dict_in_generate=True`` (``sequences`` [1, prompt + new];
    scores, logits, attentions and hidden states are not recorded), plus lookahead's ``stats``."""

    stats: GenerationStats | None = None
    logprobs: list[SequenceLogprobs] | None = None  # per sequence, with generate(logprobs=...) (call/logprobs.py)


def generate_output(sequences: torch.LongTensor, stats: GenerationStats, return_dict: bool,
                    logprobs: list[SequenceLogprobs] | None = None) -> torch.LongTensor | LookaheadOutput:
    """The ids [1, prompt + new], or a LookaheadOutput holding them, the stats (and the logprobs)."""
    if return_dict:
        return LookaheadOutput(sequences=sequences, stats=stats, logprobs=logprobs)
    return sequences
