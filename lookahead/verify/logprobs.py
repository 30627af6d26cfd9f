"""Logprobs on the device: the processors split where sampling's warpers begin, each decision row's
log-softmax, its chosen token's logprob and top-k, staged with the step's one host transfer.

Only when a call asks for them (Decoding.logprobs); the host reads them from the same transfer as the
chosen tokens: no extra sync. Float32 values travel as their bits (int32 inside the int64 staging
tensor), so the host reads the very numbers the device computed.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from transformers.generation import logits_process as lp

from ..call.decoding import Decoding
from ..call.logprobs import StepLogprobs

# Sampling's warpers: logprobs are read before the first of them (call/logprobs.py says why).
WARPERS = (lp.TemperatureLogitsWarper, lp.TopKLogitsWarper, lp.TopPLogitsWarper, lp.MinPLogitsWarper,
           lp.TypicalLogitsWarper, lp.EpsilonLogitsWarper, lp.EtaLogitsWarper)


def split_warpers(decoding: Decoding) -> tuple[Decoding, Decoding]:
    """(the processors before the first warper, the rest) as two Decodings; applied one after the other
    they give what ``decoding`` gives."""
    procs = list(decoding.processors)
    cut = next((i for i, proc in enumerate(procs) if isinstance(proc, WARPERS)), len(procs))
    return (replace(decoding, processors=lp.LogitsProcessorList(procs[:cut])),
            replace(decoding, processors=lp.LogitsProcessorList(procs[cut:])))


def stage_logprobs(scores: torch.Tensor, chosen: torch.Tensor, top: int) -> torch.Tensor:
    """int64 [R * (1 + 2 top)] on the device: the chosen tokens' logprobs [R], then the top ids [R, top] and
    their logprobs [R, top], from the decision rows' scores [R, V] (before the warpers) and chosen [R]
    (NO_TOKEN rows read token 0: the host refuses such a row anyway)."""
    logp = torch.log_softmax(scores.float(), dim=-1)  # [R, V]
    picked = logp.gather(1, chosen.clamp_min(0)[:, None])[:, 0]  # [R]
    parts = [_bits(picked)]
    if top:
        values, ids = logp.topk(top, dim=-1)  # [R, top] likeliest first
        parts += [ids.reshape(-1), _bits(values.reshape(-1))]
    return torch.cat(parts)


def staged_logprobs_size(rows: int, top: int) -> int:
    """Length of ``stage_logprobs``' tensor for ``rows`` decision rows."""
    return rows * (1 + 2 * top)


def read_logprobs(host: np.ndarray, rows: int, top: int, emitted: np.ndarray) -> StepLogprobs:
    """The logprobs of the tokens emitted from decision rows ``emitted`` [n] (x is row 0, tree node i row
    1 + i), from ``stage_logprobs``' values on the host (``rows`` decision rows)."""
    picked = _floats(host[:rows])  # [R]
    if top:
        ids = host[rows:rows + rows * top].reshape(rows, top)  # [R, top]
        values = _floats(host[rows + rows * top:rows * (1 + 2 * top)]).reshape(rows, top)
    else:
        ids, values = np.zeros((rows, 0), dtype=np.int64), np.zeros((rows, 0), dtype=np.float32)
    return StepLogprobs(picked[emitted], ids[emitted], values[emitted])


def emitting_rows(path: np.ndarray) -> np.ndarray:
    """[k + 1] the decision row that produced each new token of a step whose accepted path is ``path`` [k]:
    x for the first, then each accepted node (its child, or the bonus token, was chosen there)."""
    return np.concatenate([[0], 1 + path]).astype(np.int64)


def _bits(values: torch.Tensor) -> torch.Tensor:
    """float32 [n] as int64 [n] holding their bits (sign-extended int32)."""
    return values.float().contiguous().view(torch.int32).to(torch.int64)


def _floats(bits: np.ndarray) -> np.ndarray:
    """``_bits`` undone on the host: the float32 values [n]."""
    return bits.astype(np.int32).view(np.float32)
