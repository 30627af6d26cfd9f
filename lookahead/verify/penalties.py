"""OpenAI's presence / frequency penalties and logit_bias, as logits processors the verifier applies at
every tree row with that row's own prefix (call/processing.py's ``process_rows``).

A penalty counts the tokens of the OUTPUT so far (the prompt not counted, as OpenAI and vLLM count):
at a tree row that is the output before the step followed by the path from x down to the row, so a
row's penalised scores are exactly those the plain loop computes when it reaches that prefix, and
greedy output with speculation equals the plain loop with the same penalties, token for token:

    score[t] -= frequency_penalty * count[t] + presence_penalty * (count[t] > 0)

``logit_bias`` adds its value to the score of each token it names, at every row (row-wise: run once
over all rows). Both are additive, so their order does not matter; transformers puts the call's own
processors after its defaults (repetition_penalty, ...) and before the sampling warpers
(temperature, top-k, top-p), which is where they go here too.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import cast

import numpy as np
import torch
from transformers.generation import logits_process as lp

from ..call.decoding import Decoding
from ..errors import GenerateInputError

PENALTY_RANGE = (-2.0, 2.0)  # OpenAI's range of presence_penalty and frequency_penalty
BIAS_RANGE = (-100.0, 100.0)  # OpenAI's range of a logit_bias value


class OutputPenalty(lp.LogitsProcessor):
    """presence / frequency penalty over the tokens of input_ids [n, L] from column ``start`` on (the output).

    transformers' ``model.generate`` hands it [B, prompt + new] with ``start`` = the (padded) prompt
    length; the verifier rebinds ``start`` to each sequence's own prompt length (``for_prompt``), since
    it hands a sequence's rows its unpadded prefix.
    """

    def __init__(self, presence: float, frequency: float, start: int):
        self.presence, self.frequency, self.start = float(presence), float(frequency), int(start)

    def at_start(self, start: int) -> OutputPenalty:
        """The same penalty over the tokens from column ``start`` on."""
        return OutputPenalty(self.presence, self.frequency, start)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        out = input_ids[:, self.start:]  # [n, L - start]
        counts = torch.zeros(scores.shape, dtype=scores.dtype, device=scores.device)  # [n, V]
        counts.scatter_add_(1, out, torch.ones(out.shape, dtype=scores.dtype, device=scores.device))
        penalty = counts * self.frequency + (counts > 0).to(scores.dtype) * self.presence  # [n, V]
        return cast(torch.FloatTensor, scores - penalty)


class LogitBias(lp.LogitsProcessor):
    """Adds ``bias[t]`` to the score of token t at every row (the scores row alone decides: row-wise)."""

    row_wise = True  # process_rows runs it once over all rows (call/decoding.py's segments)

    def __init__(self, bias: Mapping[int, float]):
        self.bias = dict(bias)
        self._dense: torch.Tensor | None = None  # [V] on the scores' device, made on first use

    def __call__(self, input_ids: torch.LongTensor | None, scores: torch.FloatTensor) -> torch.FloatTensor:
        dense = self._dense
        if dense is None or dense.shape[0] != scores.shape[-1] or dense.device != scores.device \
                or dense.dtype != scores.dtype:
            dense = torch.zeros(scores.shape[-1], dtype=scores.dtype)
            dense[list(self.bias)] = torch.tensor(list(self.bias.values()), dtype=scores.dtype)
            self._dense = dense = dense.to(scores.device)
        return cast(torch.FloatTensor, scores + dense)


@dataclass(frozen=True)
class Penalties:
    """The OpenAI-style scoring settings of one call, checked on construction (GenerateInputError)."""

    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)  # token id -> bias
    vocab: int | None = None  # the logits' width: logit_bias keys must lie in [0, vocab)

    def __post_init__(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _real(value) or not PENALTY_RANGE[0] <= value <= PENALTY_RANGE[1]:
                raise GenerateInputError(f"{name} must be a number in [-2, 2] (0: off), got {value!r}")
        if not isinstance(self.logit_bias, Mapping):
            raise GenerateInputError(f"logit_bias must map token ids to biases in [-100, 100], "
                                     f"got {type(self.logit_bias).__name__}")
        top = f"[0, {self.vocab})" if self.vocab is not None else ">= 0"
        for token, bias in self.logit_bias.items():
            if isinstance(token, bool) or not isinstance(token, numbers.Integral) or token < 0 \
                    or (self.vocab is not None and token >= self.vocab):
                raise GenerateInputError(f"logit_bias key {token!r} is no token id of this model: keys must be "
                                         f"integer token ids in {top}")
            if not _real(bias) or not BIAS_RANGE[0] <= bias <= BIAS_RANGE[1]:
                raise GenerateInputError(f"logit_bias[{token}] must be a number in [-100, 100], got {bias!r}")

    @property
    def active(self) -> bool:
        """Whether these settings change any score."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias)

    def processors(self, prompt_len: int) -> list[lp.LogitsProcessor]:
        """The processors of these settings for prompts of ``prompt_len`` columns (none when all are off)."""
        procs: list[lp.LogitsProcessor] = []
        if self.presence_penalty or self.frequency_penalty:
            procs.append(OutputPenalty(self.presence_penalty, self.frequency_penalty, prompt_len))
        if self.logit_bias:
            procs.append(LogitBias({int(t): float(b) for t, b in self.logit_bias.items()}))
        return procs


def _real(value: object) -> bool:
    """A finite real number (numpy's too), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)) and math.isfinite(value)


def for_prompt(processors: lp.LogitsProcessorList, prompt_len: int) -> lp.LogitsProcessorList | None:
    """``processors`` with every OutputPenalty counting from column ``prompt_len`` (a sequence's own prompt
    length), or None when there is none to rebind. Any processor with an ``at_start`` method is rebound
    the same way (verify/grammar.py's GrammarMask: one matcher per sequence)."""
    if not any(_rebinds(proc) for proc in processors):
        return None
    return lp.LogitsProcessorList([proc.at_start(prompt_len) if _rebinds(proc) else proc for proc in processors])


def _rebinds(proc: object) -> bool:
    """Whether ``proc`` counts from a prompt length it must be told per sequence (``at_start``)."""
    return isinstance(proc, OutputPenalty) or callable(getattr(proc, "at_start", None))


def bind_decoding(decoding: Decoding, prompt_len: int) -> Decoding:
    """``decoding`` whose output penalties count from ``prompt_len`` (itself when it has none)."""
    rebound = for_prompt(decoding.processors, prompt_len)
    return decoding if rebound is None else replace(decoding, processors=rebound)


def merged_processors(user: object, penalties: Penalties, prompt_len: int) -> object:
    """The call's ``logits_processor`` followed by ``penalties``' processors (``user`` itself when these add
    none, or when it is no list: resolve_decoding refuses it by name)."""
    extra = penalties.processors(prompt_len)
    if not extra:
        return user
    if user is None:
        return lp.LogitsProcessorList(extra)
    if isinstance(user, (list, tuple)):
        return lp.LogitsProcessorList([*user, *extra])
    return user
