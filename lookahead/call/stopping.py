"""Stopping criteria, checked after every new token exactly as model.generate checks them.

A step may accept several tokens at once; model.generate would have run the
criteria after each of them, in order, and stopped at the first that fires.
``first_hit`` reproduces that: the cut falls on exactly the token where
model.generate stops.

transformers' ``StoppingCriteriaList`` is split once per call
(``split_criteria``): the length limit (``MaxLengthCriteria``) and the EOS ids
(``EosTokenCriteria``) become the token budget and the EOS set that
call/output.py cuts at in numpy; stop strings are checked over all of a step's
tokens in one batched call (only the last ``maximum_token_len`` tokens
matter to them); any other criterion (``MaxTimeCriteria``, user criteria) is
called once per new token with that token's prefix, like model.generate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from transformers.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
)


def split_criteria(criteria: StoppingCriteriaList | None, prompt_len: int) -> tuple[int | None, np.ndarray, tuple]:
    """(new-token budget or None, EOS ids [E], the remaining criteria) of a StoppingCriteriaList.

    Only criteria of exactly transformers' classes are interpreted (a subclass
    may change ``__call__``, so it is kept and called like any other).
    """
    limit: int | None = None
    eos: list[int] = []
    rest: list[Any] = []
    for criterion in criteria or ():
        if type(criterion) is MaxLengthCriteria:
            budget = max(int(criterion.max_length) - prompt_len, 0)
            limit = budget if limit is None else min(limit, budget)
        elif type(criterion) is EosTokenCriteria:
            eos.extend(int(t) for t in torch.as_tensor(criterion.eos_token_id).flatten().tolist())
        else:
            rest.append(criterion)
    return limit, np.unique(np.asarray(eos, dtype=np.int64)), tuple(rest)


def _fired(result: torch.Tensor | bool) -> bool:
    """A criterion's answer (BoolTensor [B] or a plain bool) for our batch of one."""
    return bool(torch.as_tensor(result).any())


def _per_token(criterion: Callable[..., Any], ids: torch.Tensor, start: int, count: int) -> int:
    """First j < count such that criterion fires on ids[:, :start + j + 1]; count if none."""
    for j in range(count):
        if _fired(criterion(ids[:, :start + j + 1], None)):
            return j
    return count


def _stop_strings(criterion: StopStringCriteria, seq: np.ndarray, ids: torch.Tensor, start: int, count: int) -> int:
    """First j < count at which a stop string ends; one batched call for every full-length tail."""
    width = int(criterion.maximum_token_len)
    short = min(max(width - start - 1, 0), count)  # prefixes shorter than the tail the criterion reads
    first = _per_token(criterion, ids, start, short)
    if first < short or short == count:
        return first
    ends = np.arange(start + short + 1, start + count + 1)  # [n] prefix lengths
    tails = seq[ends[:, None] - width + np.arange(width)]  # [n, width]: the last `width` tokens of each prefix
    fired = torch.as_tensor(criterion(torch.from_numpy(tails).to(ids.device), None))  # [n]
    hits = np.flatnonzero(fired.cpu().numpy())
    return short + int(hits[0]) if hits.size else count


def first_hit(criteria: tuple, seq: np.ndarray, start: int, end: int, device: torch.device | str) -> int | None:
    """0-based index of the first token of seq[start:end] after which any criterion fires, or None.

    seq[:start] is the sequence before this step's tokens. Stop strings (pure)
    are evaluated over all tokens at once; every other criterion is called
    token by token, all of them at each token, up to the stopping one: the
    calls model.generate would have made. Like model.generate (without
    output_scores, which lookahead refuses), criteria get ``scores=None``.
    """
    count = end - start
    if not criteria or count <= 0:
        return None
    ids = torch.from_numpy(seq[:end].copy()).to(device)[None]  # [1, end]: one copy / transfer per step
    first = count
    for criterion in criteria:
        if type(criterion) is StopStringCriteria:
            first = min(first, _stop_strings(criterion, seq, ids, start, first))
    asked = [c for c in criteria if type(c) is not StopStringCriteria]
    for j in range(min(first + 1, count) if asked else 0):
        fired = [_fired(c(ids[:, :start + j + 1], None)) for c in asked]  # every one, as the list asks
        if any(fired):
            return j
    return first if first < count else None
