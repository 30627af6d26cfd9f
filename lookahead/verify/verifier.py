"""ALL token choice: which tree tokens the target accepts, and the token after them.

Rows: of a step's kept logits, the *decision rows* are x (row 0) and every
tree node i (row 1 + i). Each decision row yields one *chosen* token: what
the target itself puts after that row's prefix. Verification then walks the
tree from x: a child is accepted iff its token is the token chosen at its
parent's row; when no child is, the chosen token ends the step
(``walk``; after a full match it is the bonus token).

- Greedy: the chosen token is the argmax of the processed scores.
- Sampling (model-free candidates, no draft distribution): multi-candidate
  rejection sampling over a node's children. With p the target's processed
  distribution at the parent, children t_1, t_2, ... are tried in order;
  t_i is accepted with probability p(t_i) / (1 - p(t_1) - ... - p(t_{i-1})),
  i.e. p(t_i) under the residual left by the rejected siblings; if none is,
  the next token is drawn from p with the children removed (renormalised).
  Every emitted token thus has probability exactly p. We realise this
  procedure with ONE uniform u per row: s = the inverse-CDF draw of p at u;
  t_i is accepted iff s = t_i (given s is none of t_1..t_{i-1}, s = t_i has
  probability p(t_i) / (1 - sum of those), as the procedure asks), and if s
  is no child it is a draw from the residual. The uniform of a row depends
  only on the output position it decides (``PositionUniforms``), so the
  sampled text is a function of the seed alone: the same under any tree,
  budget or machine timing, and reproducible with ``torch.manual_seed``.
- Sampling with a draft model (speculative sampling): at a row whose child
  c was DRAWN from the draft's distribution q (``DrawnRows``), c is
  accepted with probability min(1, p(c) / q(c)) (a second uniform per
  position); otherwise the row's token is drawn from max(0, p - q)
  renormalised, by inverse CDF at the row's uniform, and the row's other
  children are tried against that draw as above (a draw from the residual
  either is one of them or stands for "none"). So the row emits c with
  probability min(p(c), q(c)) summed over the draws and any t with
  probability p(t) in all (Leviathan et al. 2023; Chen et al. 2023), given
  that c is a plain draw from q (plan/planner.py keeps the tree independent of
  it). The test runs at the row whether or not c made it into the tree:
  an accepted c that is no node simply ends the step. With a draft the
  text still depends on the seed alone for a fixed tree, but the draft's
  draws come from its own stream, consumed as drafted.

The softmax, the inverse-CDF draws and the argmaxes run on the device; the
host receives everything in one transfer, together with the window's next
level (argmax of its last-level rows), the recycled top-R successors and, when the call asks for them,
the logprobs of every decision row's chosen token and its likeliest alternatives (verify/logprobs.py). A
row whose processed scores leave nothing to draw from (NaN, +inf, or every
score -inf: transformers' sampling fails there) draws ``NO_TOKEN``, which
the host refuses on that same transfer (``check_drawn``): no extra sync.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from transformers.generation import logits_process as lp

from ..call.decoding import Decoding
from ..call.logprobs import StepLogprobs
from ..call.processing import process_rows
from ..core.rows import DrawnRows, RowMap
from ..core.tree import TokenTree
from ..errors import ProcessorOutputError
from ..kernels.trie import path_tokens
from ..kernels.walk import chosen_walk
from ..model.target import row_argmax, to_device
from ..proposers.recycle import top_successors
from .logprobs import emitting_rows, read_logprobs, split_warpers, stage_logprobs, staged_logprobs_size
from .penalties import bind_decoding
from .sampling import NO_TOKEN, PositionUniforms, fast_top_k, sample_rows, sample_top_k, speculative_rows


@dataclass
class Choice:
    """What one step decided, read back to the host once."""

    path: np.ndarray  # [k] accepted node indices
    new: np.ndarray  # [k + 1] tokens to append: the path's, then the next one
    window_next: np.ndarray  # [W] argmax at the window's last level
    top: np.ndarray | None  # [K, 2R] top-R next tokens at every kept row, then their confidence
    # buckets (token recycling, proposers/recycle.py), or None
    logprobs: StepLogprobs | None = None  # the new tokens' logprobs [k + 1] (when the call asks for them)


class Verifier:
    """Chooses tokens from a step's logits under one Decoding (greedy or sampling)."""

    def __init__(self, decoding: Decoding, recycle_width: int | None, prompt_len: int):
        decoding = bind_decoding(decoding, prompt_len)  # output penalties count from this sequence's prompt end
        self.decoding = decoding
        self.logprobs = decoding.logprobs  # k alternatives per token, or None: no logprobs staged
        self.recycle_width = recycle_width  # R, or None without token recycling
        self.prompt_len = prompt_len
        self.uniforms = PositionUniforms(decoding.generator) if decoding.do_sample else None
        # Sampling that ends in a top-k warper draws from the top k directly (sample_top_k); the
        # other processors run as usual. On the CPU only: its fallback looks at the rows on the host.
        self.top_k = fast_top_k(decoding)
        self.row_processing = decoding if self.top_k is None else replace(
            decoding, processors=lp.LogitsProcessorList(decoding.processors[:-1]))
        # With logprobs: each processing split where the warpers begin (the logprobs' distribution is between)
        self.splits = None if self.logprobs is None else \
            {True: split_warpers(self.row_processing), False: split_warpers(decoding)}

    def stage(self, logits: torch.Tensor, rows: RowMap, tree: TokenTree, seq: np.ndarray, stop: int,
              drawn: DrawnRows | None = None, recycle: bool = True) -> torch.Tensor:
        """Everything the host needs from logits [K, V], as one int64 tensor on the device
        (``staged_size`` long): window argmax, top-R, the chosen token of every decision row
        (``drawn``: rows whose child a draft drew, sampling only; ``recycle`` False: no top-R this step, as
        on a step that proposes nothing, whose successors no source is waiting for)."""
        parts = [row_argmax(logits[rows.window_rows()])] if rows.window else []  # [W] (none without a window)
        width = self.staged_width(recycle)
        if width is not None:
            parts.append(top_successors(logits, width).reshape(-1))  # [K * 2R]
        decide = logits if rows.lead == 1 else logits[rows.decision_rows(tree.size, logits.device)]  # [1 + M, V]
        top_k = self.top_k if decide.device.type == "cpu" else None  # drawn from the top k directly
        fast = top_k is not None
        processing = self.row_processing if fast else self.decoding
        if self.logprobs is None:
            scores = self._processed(decide, tree, seq, stop, processing)
        else:  # the distribution logprobs are read from: before the warpers (verify/logprobs.py)
            assert self.splits is not None
            head, tail = self.splits[fast]
            before = self._processed(decide, tree, seq, stop, head)
            scores = self._processed(before, tree, seq, stop, tail)
        if self.uniforms is None:
            parts.append(row_argmax(scores))  # [1 + M]: exactly what greedy decoding picks
        else:
            depths = np.concatenate([[0], tree.depths])  # [1 + M]
            positions = stop - self.prompt_len + depths  # [1 + M] output positions decided
            u = to_device(self.uniforms.at(positions), scores.device)  # [1 + M]
            chosen = sample_top_k(scores, top_k, u) if top_k is not None else sample_rows(scores, u)  # [1 + M]
            if drawn is not None:
                full = self.decoding.processors[-1](None, scores[drawn.rows]) if fast else scores[drawn.rows]
                test = to_device(self.uniforms.at(positions[drawn.rows], lane=1), scores.device)  # [R]
                picked = speculative_rows(full, drawn.q.to(scores.device), to_device(drawn.tokens, scores.device),
                                          test, u[drawn.rows])  # [R]
                chosen = chosen.index_put((to_device(drawn.rows, scores.device),), picked)
            parts.append(chosen)
        if self.logprobs is not None:
            parts.append(stage_logprobs(before, parts[-1], self.logprobs))  # [(1 + M) * (1 + 2k)]
        return torch.cat(parts)

    @property
    def plain_greedy(self) -> bool:
        """Whether this sequence's chosen tokens are the argmax of its raw logits (greedy, no logits
        processor): then a batch's sequences can be staged together (``stage_batch``)."""
        return self.uniforms is None and not self.decoding.processors and self.logprobs is None

    def stage_from_batch(self, argmax: np.ndarray, top: np.ndarray | None, rows: RowMap, tree: TokenTree,
                 kept: int) -> np.ndarray:
        """What ``stage`` would have given (on the host), from this sequence's share of ``stage_batch``:
        argmax [K'] of its step's logit rows and top [K', 2R] (K' >= kept: the batch's rows; None: the step
        staged no successors, as ``stage`` with ``recycle`` False)."""
        assert self.plain_greedy, "only a plain greedy sequence is staged with its batch"
        parts = [argmax[rows.window_rows()]]  # [W]
        if top is not None:
            assert self.recycle_width is not None, "only token recycling stages the top-R successors"
            parts.append(top[:kept].reshape(-1))  # [K * 2R]
        parts.append(argmax[:kept] if rows.lead == 1 else np.concatenate([argmax[:1], argmax[rows.lead:kept]]))
        return np.concatenate(parts)

    def staged_width(self, recycle: bool = True) -> int | None:
        """R where a step stages every kept row's top-R successors (token recycling, and ``recycle``), else None."""
        return self.recycle_width if recycle else None

    def staged_size(self, rows: RowMap, tree: TokenTree, kept: int, recycle: bool = True) -> int:
        """Length of ``stage``'s tensor for a tree with ``kept`` logit rows."""
        extra = staged_logprobs_size(1 + tree.size, self.logprobs) if self.logprobs is not None else 0
        width = self.staged_width(recycle)
        return rows.window + (kept * 2 * width if width is not None else 0) + 1 + tree.size + extra

    def _processed(self, scores: torch.Tensor, tree: TokenTree, seq: np.ndarray, stop: int,
                   decoding: Decoding) -> torch.Tensor:
        """The decision rows' scores after ``decoding``'s logits processors, each with its own prefix."""
        if not decoding.processors:
            return scores
        paths = np.zeros((1 + tree.size, max(1, int(tree.depths.max(initial=0)))), dtype=np.int64)  # [1 + M, D]
        if tree.size:
            nodes = path_tokens(tree.tokens, tree.parents, tree.depths)  # [M, D]
            paths[1:, :nodes.shape[1]] = nodes
        depths = np.concatenate([[0], tree.depths])  # [1 + M]
        return process_rows(decoding, scores, seq, stop, paths, depths)

    def finish(self, host: np.ndarray, rows: RowMap, tree: TokenTree, kept: int, recycle: bool = True) -> Choice:
        """Split the staged values (now on the host) into window argmax, top-R (None where ``recycle`` is
        False or there is no recycling) and the chosen tokens; walk the tree."""
        at = rows.window
        window_next = host[:at]
        top = None
        width = self.staged_width(recycle)
        if width is not None:
            top = host[at:at + kept * 2 * width].reshape(kept, 2 * width)
            at += kept * 2 * width
        chosen = host[at:at + 1 + tree.size]  # [1 + M] the target's token after x and after every node
        path, new = walk(tree, chosen)
        check_drawn(int(new[-1]), self.decoding)
        logprobs = None
        if self.logprobs is not None:
            logprobs = read_logprobs(host[at + 1 + tree.size:], 1 + tree.size, self.logprobs, emitting_rows(path))
        return Choice(path, new, window_next, top, logprobs)


def stage_batch(logits: torch.Tensor, recycle_width: int | None) -> tuple[np.ndarray, np.ndarray | None]:
    """A batch of plain greedy sequences' logits [A, K, V] staged at once, in one host transfer: the
    argmax [A, K] of every row and (with token recycling) its top-R successors [A, K, 2R]. Each
    sequence takes its share with ``Verifier.stage_from_batch``: the same values its own ``stage`` gives,
    from two device calls for the batch instead of a handful per sequence."""
    count, kept, vocab = logits.shape
    flat = logits.reshape(count * kept, vocab)  # [A * K, V]
    parts = [row_argmax(flat)]  # [A * K]
    if recycle_width is not None:
        parts.append(top_successors(flat, recycle_width).reshape(-1))  # [A * K * 2R]
    host = torch.cat(parts).cpu().numpy() if len(parts) > 1 else parts[0].cpu().numpy()  # the one host sync
    argmax = host[:count * kept].reshape(count, kept)
    top = host[count * kept:].reshape(count, kept, 2 * recycle_width) if recycle_width is not None else None
    return argmax, top


def check_drawn(token: int, decoding: Decoding) -> None:
    """Raise ProcessorOutputError when the token that ends a step is NO_TOKEN.

    Only the row the walk ends at counts: a speculated row off the accepted
    path may hold scores the real sequence never reaches, and model.generate
    would never have sampled there (a NO_TOKEN row accepts no child, so the
    walk ends at the first one it reaches).
    """
    if token == NO_TOKEN:
        names = ", ".join(type(proc).__name__ for proc in decoding.processors)
        raise ProcessorOutputError(
            f"sampling has no distribution to draw the next token from: after the logits processors ({names}) "
            f"the scores hold NaN or +inf, or all are -inf (model.generate fails there too: 'probability tensor "
            f"contains either inf, nan or element < 0'); fix or drop the logits_processor that produces them "
            f"(or raise a temperature so low that the scores overflow)")


def accepted_children(tree: TokenTree, chosen: np.ndarray) -> np.ndarray:
    """accept[M]: node i's token is the one chosen at its parent's row (chosen[1 + M], x first): the rule
    ``walk`` applies, as an array for ``accept_walk`` (kernels/walk.py)."""
    return tree.tokens == chosen[tree.parents + 1]


def walk(tree: TokenTree, chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(path [k], new tokens [k + 1]) of the step: down ``tree`` while a child holds the token chosen at its
    parent's row (chosen [1 + M], x first; ``accepted_children``), then that row's token. One kernel call."""
    return chosen_walk(tree.tokens, tree.parents, chosen)
