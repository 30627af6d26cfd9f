"""Log-probabilities of the emitted tokens, on the host: what a step gave (``StepLogprobs``), what a
sequence gathered (``LogprobLog``) and what generate returns (``SequenceLogprobs``).

Which distribution: the log-softmax, in float32, of the target's logits at the row that produced the
token, after the logits processors that come before sampling's warpers (repetition_penalty,
presence / frequency penalty, logit_bias, the call's own processors), before temperature, top-k,
top-p and the other warpers (verify/logprobs.py splits the list there): the model's distribution as
penalties and biases leave it, the numbers OpenAI reports. A row's logits do not depend on how many
rows its step verified, so the numbers are the same whether a token came from the plain loop or was
accepted from a tree.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, replace

import numpy as np
import torch

from ..errors import GenerateInputError
from .decoding import Decoding

MAX_TOP_LOGPROBS = 20  # alternatives per token at most (OpenAI's limit)


def check_logprobs(value: object) -> int | None:
    """``generate``'s ``logprobs``: None / False (off), True (the chosen tokens' alone: 0 alternatives) or an
    integer k in [0, MAX_TOP_LOGPROBS] (the k likeliest tokens beside each chosen one)."""
    if value is None or value is False:
        return None
    if value is True:
        return 0
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
            or not 0 <= int(value) <= MAX_TOP_LOGPROBS:
        raise GenerateInputError(f"logprobs must be True, False, None or an integer in [0, {MAX_TOP_LOGPROBS}] (the "
                                 f"likeliest tokens reported beside each new token), got {value!r}")
    return int(value)


@dataclass(frozen=True)
class StepLogprobs:
    """The logprobs of a step's new tokens [n], in order."""

    logprobs: np.ndarray  # [n] float32: each new token's
    top_ids: np.ndarray  # [n, k] int64: the k likeliest tokens at its row, likeliest first
    top_logprobs: np.ndarray  # [n, k] float32: theirs

    def head(self, count: int) -> StepLogprobs:
        """The first ``count`` tokens' (a step cut at EOS, the budget, a stop string).

        Args:
            count: how many of the step's tokens to keep (<= ``size``).

        Returns:
            A StepLogprobs of [count] logprobs and [count, k] top ids and logprobs.
        """
        return StepLogprobs(self.logprobs[:count], self.top_ids[:count], self.top_logprobs[:count])

    @property
    def size(self) -> int:
        return int(self.logprobs.shape[0])


@dataclass(frozen=True)
class SequenceLogprobs:
    """One returned sequence's new tokens and their logprobs (``LookaheadOutput.logprobs``)."""

    tokens: torch.Tensor  # [n] int64: the new tokens (padding after an early stop not included)
    logprobs: torch.Tensor  # [n] float32: log p(token) at the row that produced it
    top_ids: torch.Tensor  # [n, k] int64: the k likeliest tokens there, likeliest first
    top_logprobs: torch.Tensor  # [n, k] float32: their log p


class LogprobLog:
    """The logprobs of a sequence's kept tokens, step by step."""

    def __init__(self, top: int):
        self.top = top  # k alternatives per token
        self.tokens: list[np.ndarray] = []
        self.steps: list[StepLogprobs] = []

    def add(self, tokens: np.ndarray, step: StepLogprobs) -> None:
        """Kept tokens [n] and their logprobs (n rows)."""
        assert step.size == tokens.shape[0], "one logprob row per kept token"
        self.tokens.append(np.asarray(tokens, dtype=np.int64).copy())
        self.steps.append(step)

    def result(self) -> SequenceLogprobs:
        """Everything so far as tensors."""
        k = self.top
        tokens = np.concatenate(self.tokens) if self.tokens else np.zeros(0, dtype=np.int64)
        logprobs = np.concatenate([s.logprobs for s in self.steps]) if self.steps else np.zeros(0, np.float32)
        ids = np.concatenate([s.top_ids for s in self.steps]) if self.steps else np.zeros((0, k), np.int64)
        tops = np.concatenate([s.top_logprobs for s in self.steps]) if self.steps else np.zeros((0, k), np.float32)
        return SequenceLogprobs(torch.from_numpy(tokens), torch.from_numpy(logprobs.astype(np.float32)),
                                torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(tops.astype(np.float32)))


def with_logprobs(decoding: Decoding, value: object, return_dict_in_generate: object) -> Decoding:
    """``decoding`` asking for ``generate``'s ``logprobs`` (``check_logprobs``); asking for them returns a
    LookaheadOutput (``.logprobs``), so return_dict_in_generate=False with them is refused."""
    top = check_logprobs(value)
    if top is None:
        return decoding
    if return_dict_in_generate is False:
        raise GenerateInputError("logprobs come back on the output object (.logprobs): drop "
                                 "return_dict_in_generate=False, or drop logprobs")
    return replace(decoding, logprobs=top, return_dict=True)
