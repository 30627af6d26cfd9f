"""Drawing tokens on the device: per-position uniforms, inverse-CDF draws, top-k without passes over
the vocabulary, and speculative sampling's accept-or-redraw (verifier.py says where each is used)."""

from __future__ import annotations

import numpy as np
import torch
from transformers.generation import logits_process as lp

from ..call.decoding import Decoding


class PositionUniforms:
    """u[j]: the uniform that decides the j-th new token of a generate call.

    One 63-bit seed is drawn from ``generator`` (or torch's default
    generator) when the call starts; the uniforms are numpy PCG64 streams
    from it, indexed by output position, so they do not depend on how the
    positions are grouped into steps. Lane 0 draws the token, lane 1 tests
    a draft's drawn token (min(1, p/q)).
    """

    LANES = 2

    def __init__(self, generator: torch.Generator | None):
        device = generator.device if generator is not None else "cpu"
        self.seed = int(torch.randint(0, 2 ** 63 - 1, (1,), generator=generator, device=device))
        self.rngs = [np.random.Generator(np.random.PCG64(self.seed if lane == 0 else [self.seed, lane]))
                     for lane in range(self.LANES)]
        self.values = [np.zeros(0) for _ in range(self.LANES)]

    def at(self, positions: np.ndarray, lane: int = 0) -> np.ndarray:
        """Uniforms [R] in [0, 1) of output positions [R] (>= 0)."""
        need = int(positions.max(initial=-1)) + 1
        have = self.values[lane]
        if need > have.shape[0]:
            more = self.rngs[lane].random(max(need - have.shape[0], 64))
            self.values[lane] = have = np.concatenate([have, more])
        return have[positions]


NO_TOKEN = -1  # what a row draws when its scores hold no distribution (NaN, +inf, or every score -inf)


TOP_K_SPARE = 16  # top entries fetched beyond k, so that ties at the k-th score are kept as transformers keeps them


def fast_top_k(decoding: Decoding) -> int | None:
    """k when sampling ends in transformers' top-k warper (the default when sampling), else None.

    Then the warper's two passes over the vocabulary and the softmax and
    cumulative sum over it can be replaced by ``sample_top_k`` on the CPU.
    """
    procs = decoding.processors
    if not decoding.do_sample or not procs or type(procs[-1]) is not lp.TopKLogitsWarper:
        return None
    last = procs[-1]
    return int(last.top_k) if last.filter_value == float("-inf") else None


def sample_top_k(scores: torch.Tensor, k: int, u: torch.Tensor) -> torch.Tensor:
    """sample_rows(TopKLogitsWarper(k)(None, scores), u) [R], without passes over the vocabulary.

    transformers keeps every token whose score reaches the k-th largest (ties
    included) and gives the rest probability 0, which adds nothing to a
    cumulative sum; so the kept tokens are taken from the top k + TOP_K_SPARE,
    put back in vocabulary order, and drawn by inverse CDF over them alone. A
    row whose ties at the k-th score may reach past the spare entries (or
    whose k-th score is -inf) takes the full path, row by row, so every row's
    token depends on its own scores and uniform only.

    scores [R, V] = [[1, 5, 3, 4]], k = 2, u = [0.5]: tokens 1 and 3 are kept
    (probabilities .73 / .27 in vocabulary order) -> token 1.
    """
    vocab = scores.shape[1]
    k = min(k, vocab)
    wide = min(k + TOP_K_SPARE, vocab)
    values, index = scores.topk(wide, dim=-1)  # [R, S] best first
    kth = values[:, k - 1:k]  # [R, 1]
    order = index.argsort(dim=-1)  # [R, S] back to vocabulary order
    index, values = index.gather(1, order), values.gather(1, order)
    kept = values >= kth  # [R, S]
    probs = torch.softmax(values.float().masked_fill(~kept, float("-inf")), dim=-1)  # [R, S]
    cdf = probs.cumsum(-1, dtype=torch.float64)  # [R, S]
    target = (u.to(cdf.dtype) * cdf[:, -1])[:, None]  # [R, 1]
    out = index.gather(1, torch.searchsorted(cdf, target, right=True).clamp_max(wide - 1))[:, 0]  # [R]
    out = torch.where(torch.isfinite(cdf[:, -1]), out, NO_TOKEN)  # NaN / +inf scores: nothing to draw
    unsure = torch.isinf(kth[:, 0])
    if wide < vocab:
        unsure |= kept.sum(-1) == wide  # every spare entry ties with the k-th: more may follow
    rows = unsure.nonzero()[:, 0]  # on the CPU only (see Verifier): no device to wait for
    if rows.numel():
        full = lp.TopKLogitsWarper(k)(None, scores[rows])
        out[rows] = sample_rows(full, u[rows])
    return out


def sample_rows(scores: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The inverse-CDF draw [R] of softmax(scores [R, V]) at uniforms u [R].

    The first token whose cumulative probability exceeds u; a token of
    probability 0 (filtered by top-k / top-p) is never drawn.
    """
    return draw_rows(torch.softmax(scores.float(), dim=-1), u)


def draw_rows(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The inverse-CDF draw [R] of weights [R, V] (>= 0, not necessarily normalised) at uniforms u [R];
    NO_TOKEN for a row whose weights hold NaN or inf (a softmax of NaN, +inf or all -inf scores).

    weights [[0, 2, 1, 1]], u [0.6] -> the cumulative share passes 0.6 at token 2.
    """
    cdf = weights.cumsum(-1, dtype=torch.float64)  # [R, V] summed in float64: no drift over a large vocabulary
    target = (u.to(cdf.dtype) * cdf[:, -1])[:, None]  # [R, 1]
    drawn = torch.searchsorted(cdf, target, right=True)[:, 0].clamp_max(weights.shape[1] - 1)  # [R]
    return torch.where(torch.isfinite(cdf[:, -1]), drawn, NO_TOKEN)  # on the device: read with the step's data


def speculative_rows(scores: torch.Tensor, q: torch.Tensor, drawn: torch.Tensor, test: torch.Tensor,
                     u: torch.Tensor) -> torch.Tensor:
    """The token [R] each row emits when a draft drew drawn[R] from q[R, V] (speculative sampling).

    p = softmax(scores [R, V]) (the target's fully processed scores). The
    drawn token is kept iff test * q(drawn) < p(drawn), i.e. with probability
    min(1, p/q); otherwise the row's token is the inverse-CDF draw at u of
    max(0, p - q), which gives the drawn token no mass whenever it can be
    rejected. On the device, no host sync.

    p [.5 .5 0], q [.9 .1 0], drawn 0: kept with probability .5 / .9; else
    the residual [0 .4 0] emits token 1.
    """
    p = torch.softmax(scores.float(), dim=-1)  # [R, V]
    q = q.float()
    index = drawn[:, None]  # [R, 1]
    keep = test.to(p.dtype) * q.gather(1, index)[:, 0] < p.gather(1, index)[:, 0]  # [R]
    residual = (p - q).clamp_min(0.0)  # [R, V]
    return torch.where(keep, drawn, draw_rows(residual, u))  # [R]
