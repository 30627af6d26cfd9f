"""One sequence being decoded: its output, Jacobi window, n-gram pool, planner and verifier.

The per-sequence half of a decode step (decode/loop.py runs the steps): ``rank`` proposes,
``plan`` gives the step's rows,
``stage`` what the host needs from their logits (on the device), ``commit``
appends the chosen tokens and says which step rows' KV entries to keep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..call.decoding import Decoding
from ..call.output import OutputBuffer
from ..call.stats import GenerationStats
from ..core.rows import DrawnRows, RowMap
from ..core.tree import StepLayout, TokenTree, step_rows_layout
from ..kernels.recycle import previous_tokens
from ..plan.planner import Planner, RankedTree
from ..plan.window import JacobiWindow
from ..proposers.base import Proposer
from ..proposers.draft.proposer import DraftProposer
from ..proposers.ngram import NgramPool
from ..proposers.prediction import PredictionSource
from ..proposers.recycle import AdjacencyTable
from ..verify.verifier import Verifier
from .context import DecodeContext

NO_ROWS = np.zeros(0, dtype=np.int64)  # the window's tokens where a step feeds x alone (read-only)
NO_ROWS.flags.writeable = False


@dataclass(frozen=True)
class StepPlan:
    """The rows of one sequence in one step."""

    tree: TokenTree
    layout: StepLayout  # offsets [Q] from x, local mask [Q, Q]
    tokens: np.ndarray  # [Q] input tokens: the window (x first), then the tree
    keep: np.ndarray  # [K] rows whose logits are needed
    rows: RowMap  # where the kept rows come from (the window's columns this step, then the tree)
    drawn: DrawnRows | None = None  # rows whose next token a draft drew (sampling with a draft)
    spent: float = 0.0  # seconds the proposers spent on forwards of their own (a draft's): not the target's
    recycle: bool = True  # the step stages its rows' top successors for token recycling, and its new tokens go to
    # the sources now (not on a step that proposes nothing: a batch's paused steps, plan/pause.py; the sources hear
    # of those tokens at its next proposal, Planner.observe)


@dataclass
class SequenceParts:
    """What one sequence is made of before its planner: output, window, pools, verifier, sources."""

    out: OutputBuffer
    asked: int  # max_new_tokens as asked (the output's limit may be cut by the model's context)
    window: JacobiWindow
    pool: NgramPool
    window_pool: NgramPool | None  # the window's own pool (a window of more than x alone)
    verifier: Verifier
    sources: list[Proposer]  # in priority order
    draft: DraftProposer | None  # the draft model's source, also among ``sources`` (None: no draft)
    prediction: PredictionSource | None = None  # the predicted output's source, also among ``sources``


def sequence_parts(context: DecodeContext, prompt: np.ndarray, decoding: Decoding, streamer: Any,
                   context_left: int | None, prediction: np.ndarray | None = None) -> SequenceParts:
    """The parts of a sequence decoding ``prompt`` [T] under ``context``; ``context_left``: the new tokens the
    model's context holds after this prompt (None: no limit); ``prediction``: its predicted output [P]."""
    cfg, vocab = context.config, context.target.vocab
    # never past the context
    limit = decoding.max_new_tokens if context_left is None else min(decoding.max_new_tokens, context_left)
    out = OutputBuffer(prompt, limit, decoding.eos, streamer, decoding.criteria, context.target.device,
                       decoding.logprobs)
    window = JacobiWindow(cfg.window, cfg.ngram, cfg.window_seed)
    pool = NgramPool(vocab, cfg.pool_ngram, cfg.pool_capacity, cfg.pool_max_keys)
    # A real window (more than x alone) feeds a pool of its own, proposed as its own source,
    # so that what its n-grams add is measured apart (the budget sizes the window by it).
    window_pool = NgramPool(vocab, cfg.ngram, cfg.pool_capacity, cfg.pool_max_keys) \
        if cfg.lookahead_rows > 1 else None
    recycled = context.recycled
    verifier = Verifier(decoding, recycled.width if recycled is not None else None, out.prompt_len)
    seed = verifier.uniforms.seed if verifier.uniforms is not None else 0
    built = context.sources.build(decoding, context.cost, pool, window_pool, seed, prediction)
    return SequenceParts(out, decoding.max_new_tokens, window, pool, window_pool, verifier, built.sources,
                         built.draft, built.prediction)


class Sequence:
    """State of one sequence across the steps of one generate call."""

    def __init__(self, parts: SequenceParts, planner: Planner, recycled: AdjacencyTable | None,
                 stats: GenerationStats):
        """``planner`` over ``parts.sources``; ``recycled``: the shared successor table it feeds (or None)."""
        self.cfg = planner.config
        self.out, self.asked, self.window = parts.out, parts.asked, parts.window
        self.pool, self.window_pool, self.verifier = parts.pool, parts.window_pool, parts.verifier
        self.draft, self.planner, self.recycled, self.stats = parts.draft, planner, recycled, stats
        self.prediction = parts.prediction
        self.begun = False  # whether the prompt went in (a call with nothing to generate never begins)

    def count_draft(self) -> None:
        """Put the draft model's work into the stats (nothing without a draft)."""
        if self.draft is not None:
            self.stats.draft_forwards = self.draft.drafter.forwards
            self.stats.drafted = self.draft.drafted

    def finish(self) -> np.ndarray:
        """The sequence is done: the sources hear of it (if it began), its stats take the draft's and the
        prediction's final counts, the stream ends; prompt + new tokens [T + n]."""
        if self.begun:
            self.planner.finish(self.out.seq, self.out.stop)
        if self.prediction is not None:  # (final once the sources heard of the end)
            self.stats.accepted_prediction_tokens, self.stats.rejected_prediction_tokens = self.prediction.counts
        self.count_draft()
        return self.out.finish()

    def begin(self) -> None:
        """The prompt is in: start the window and the proposers."""
        self.begun = True
        self.window.begin(self.out.seq[:self.out.prompt_len])
        self.planner.begin(self.out.seq, self.out.prompt_len)

    def cut_by_context(self) -> bool:
        """Whether decoding stopped at the model's context short of max_new_tokens (and not at an EOS)."""
        out = self.out
        return out.limit < self.asked and out.new_tokens == out.limit and out.last not in out.eos

    def plan(self, ranked: RankedTree, size: int, width: int, proposing: bool = True) -> StepPlan:
        """2. build the tree: the first ``size`` nodes of the ranked trie after ``width`` window columns;
        the step's rows [x | window | tree]; ``proposing`` False: the step proposed nothing (a paused batch),
        and stages nothing for token recycling.

        Tree nodes stay inside the tokens still allowed (the budget, cut at the
        model's context): no decisive row is fed a position past the context.
        """
        tree = self.planner.cut(ranked, size)
        x = self.out.last
        window_tokens = self.window.rows(x, width) if width else NO_ROWS  # (x alone: the kernel writes x)
        kept = self.window.kept_rows(width)  # [1 + w] or [w] (or [1]: x alone)
        layout, tokens, keep = step_rows_layout(self.window.layout(width), window_tokens, x, kept, tree)  # [Q], [K]
        rows = RowMap(lead=kept.shape[0], window=width, ngram=self.cfg.ngram)
        return StepPlan(tree, layout, tokens, keep, rows, self.planner.drawn, ranked.seconds, proposing)

    def _previous(self, plan: StepPlan) -> np.ndarray:
        """[K] the token before each kept row's token in the text that row sees: x's predecessor
        for x, the window row's in its column (the level before, or the column before on level 0;
        ``window_previous``), a tree node's parent (x for depth 1)."""
        seq, stop, tree = self.out.seq, self.out.stop, plan.tree
        return previous_tokens(plan.keep[:plan.rows.lead], plan.rows.window, plan.tokens, tree.parents, tree.tokens,
                               int(seq[stop - 1]), int(seq[stop - 2]) if stop >= 2 else -1)

    def tokens_left(self) -> int:
        """Tokens this sequence may still append."""
        return self.out.limit - self.out.new_tokens

    def rank(self) -> RankedTree:
        """1. propose, 2. the scored trie in best-first order (a batch cuts every row at one width)."""
        return self.planner.rank(self.out.seq, self.out.stop, self.tokens_left())

    def stage(self, logits: torch.Tensor, plan: StepPlan) -> torch.Tensor:
        """4. verify, device half: what the host needs from the kept rows' logits [K, V]."""
        return self.verifier.stage(logits, plan.rows, plan.tree, self.out.seq, self.out.stop, plan.drawn, plan.recycle)

    def staged_size(self, plan: StepPlan) -> int:
        return self.verifier.staged_size(plan.rows, plan.tree, plan.keep.shape[0], plan.recycle)

    def commit(self, host: np.ndarray, plan: StepPlan) -> tuple[bool, np.ndarray]:
        """4. verify (host half) and 5. commit: append the chosen tokens, learn, feed the pool.

        Returns (whether this sequence is done, the step rows [k + 1] whose KV entries to keep).
        """
        choice = self.verifier.finish(host, plan.rows, plan.tree, plan.keep.shape[0], plan.recycle)
        self.planner.learn(plan.tree, choice.path, plan.rows.window)
        if self.recycled is not None and choice.top is not None:  # top: every kept row's top 2R, with recycling
            self.recycled.learn_staged(plan.tokens[plan.keep], choice.top, self._previous(plan))
        start = self.out.stop
        done = self.out.append(choice.new, choice.logprobs)
        self.stats.accepted.append(self.out.stop - start)
        rows = np.concatenate([[0], plan.layout.tree_start + choice.path])  # [k + 1] step rows to keep
        if done:
            return True, rows
        grams = self.window.advance(choice.window_next)  # [w, N]
        if self.window_pool is not None:
            self.window_pool.insert_grams(grams)
        self.planner.observe(self.out.seq, start, self.out.stop, defer=not plan.recycle)
        return False, rows
