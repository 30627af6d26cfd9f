"""Draft-model proposer: a small causal LM with the target's vocabulary drafts a chain of
continuations of x, one draft forward per token, for as long as the next token pays.

- Greedy: each chain token is the draft's argmax after the decode's own
  processors; the runner-ups (``alternatives`` per depth) come free from the
  same logits and join the tree as one-token branches. Every such token is
  an ordinary deterministic candidate, merged into the trie like any other.
- Sampling: each chain token is DRAWN from q, the draft's processed
  distribution at its prefix (temperature and warpers as the target's), and
  the Candidates carry q [L, V]. verify/verifier.py accepts a drawn token with
  probability min(1, p/q) and otherwise draws from max(0, p - q)
  renormalised (speculative sampling); the chain stays its own branch of
  the tree (see plan/planner.py for why that keeps the output exact).

Classes: a chain token's class is the bucket of the draft's top probability
at the row it came from (max q, known before the draw: under sampling, the
tree's shape never depends on which token was drawn); a runner-up's class is
``BUCKETS`` + the bucket of its own draft probability.

Length: drafting trades tokens per step against step time. Before it
drafts, the proposer asks what the step would be without it
(``StepContext.others``: the other sources are asked first): ``plain``, the
tokens their tree is expected to yield and its cost in plain target steps,
and ``covered[d]``, their trie's best path probability at depth d + 1. Its
own ``rate`` is the tokens draft steps added lately past such a trie, per
plain target step their forwards took (measured: efficiency.DraftEfficiency, kept in
the source's state and learned from every step's outcome in ``learn``).
Drafting raises a step's tokens per second only while what it adds, per
step it costs, beats the step's tokens per step so far: the draft runs only
when ``rate`` beats the plain step's, and the chain stops at the first
token whose modelled gain (its path probability past ``covered``) per
forward (``cost_ratio`` target steps, from both measured cost curves) would
lower the rate. A step where the free sources already yield many tokens (a
long context match) drafts nothing; a draft that agrees with the target
drafts long chains where the text is new, and ``max_tokens`` caps it.

Catching up: the draft's cache is filled lazily: the prompt is fed by the
first forward that drafts, and the tokens accepted while the draft was
silent by the next one (at most ``draft_context`` rows: drafter.py). That
catch-up is a one-off, not part of what a drafting step costs from then
on: ``rate`` measures the draft's forwards as if each read one row, and the
catch-up's extra rows are paid only when the steps still to come would win
them back (``_recoups``: the gain ``rate`` promises per one-forward draft,
over the steps the remaining tokens take; docs/DESIGN.md says why the
catch-up is kept out of the rate).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ...call.decoding import Decoding
from ...call.processing import process_rows
from ...core.tree import TokenTree, matched_depth
from ..base import Candidates, Outcome, Source, StepContext, no_candidates
from .drafter import Drafter
from .efficiency import DraftEfficiency

if TYPE_CHECKING:
    from ...cost import CostModel

CONFIDENCE_EDGES = np.array([0.3, 0.5, 0.7, 0.85, 0.95])  # bucket = count of edges <= probability: a draft
# sure of its token is accepted far more often, so its chain tokens are scored per bucket
BUCKETS = CONFIDENCE_EDGES.shape[0] + 1
CHAIN_PRIORS = np.array([0.2, 0.4, 0.6, 0.75, 0.88, 0.95])  # assumed acceptance per confidence bucket: about
# the draft's own probability, before any is measured
ALTERNATIVE_PRIORS = np.array([0.1, 0.25, 0.3, 0.3, 0.3, 0.3])  # runner-ups: rarely above 0.5, since the chain
# token beat them


def confidence_bucket(prob: float) -> int:
    """The bucket of a draft probability: 0.2 -> 0, 0.6 -> 2, 0.99 -> 5."""
    return int(np.searchsorted(CONFIDENCE_EDGES, prob, side="right"))


@dataclass(frozen=True)
class Drafted:
    """What a step's draft was measured against, until the step's outcome comes (``DraftProposer.learn``)."""

    free: TokenTree  # the other sources' trie
    covered: float  # its depth-1 coverage (the DraftEfficiency band)
    cost: float  # plain target steps the draft's forwards took, the catch-up aside (0: it was silent)
    plain: float  # the cost of the step the other sources alone would have made, in plain target steps


class DraftProposer(Source):
    """Proposes the draft model's chain (and its runner-ups when greedy) after x, when it pays."""

    name = "draft"
    priors = np.concatenate([CHAIN_PRIORS, ALTERNATIVE_PRIORS])

    def __init__(self, drafter: Drafter, decoding: Decoding, max_tokens: int, alternatives: int,
                 cost_ratio: Callable[[int], float], seed: int, cost: CostModel | None = None):
        """``cost_ratio(rows)``: seconds of a draft forward over ``rows`` rows over those of a plain target step
        (0 = drafting is free: chains run to max_tokens); ``seed`` seeds the draws when sampling;
        ``cost``: the draft's CostModel, refined by every draft forward's measured time."""
        self.drafter = drafter
        self.cost = cost
        self.decoding = decoding
        self.max_tokens = max_tokens
        self.alternatives = 0 if decoding.do_sample else alternatives
        self.cost_ratio = cost_ratio
        self.rng = np.random.Generator(np.random.PCG64([seed, 2])) if decoding.do_sample else None
        self.drafted = 0  # draft tokens proposed so far (stats)
        self.asked: Drafted | None = None  # this step's draft, until its outcome is learned

    def begin(self, seq: np.ndarray, stop: int) -> None:
        """A new sequence: the draft's cache starts empty (the first draft forward feeds the prompt)."""
        self.drafter.begin(seq, stop)

    def observe(self, seq: np.ndarray, start: int, stop: int) -> None:
        """Nothing now: the next ``propose`` syncs the draft's cache with the accepted tokens."""

    def propose(self, seq: np.ndarray, stop: int, limit: int, estimates: np.ndarray,
                step: StepContext) -> Candidates:
        """``draft``, after the other sources: what they reach, and the rate the draft's steps
        added past such a trie lately (its DraftEfficiency), decide whether and how far it drafts."""
        others = step.others()
        covered = float(others.covered[0])
        rate = step.state(DraftEfficiency).rate(covered, float(self.cost_ratio(1)))
        found = self.draft(seq, stop, limit, estimates, others.covered, others.plain, rate, step.tokens_left)
        unit = step.unit()
        spent = (found.seconds - found.catch_up) / unit if unit else 0.0  # catch-ups aside
        self.asked = Drafted(others.tree, covered, spent, others.plain[1])
        return found

    def learn(self, outcome: Outcome) -> None:
        """What the draft added past the other sources' trie (the accepted path beyond its longest
        prefix they held), against what it cost: its forwards and, when it ran, the rows the
        target verified beyond the other sources' plan."""
        asked, self.asked = self.asked, None
        if asked is None:  # nothing was asked of it this step
            return
        beyond = int(outcome.path.shape[0]) - matched_depth(asked.free, outcome.tree.tokens[outcome.path])
        cost = asked.cost
        if cost > 0:
            cost += max(0.0, outcome.steps - asked.plain)
        outcome.state(DraftEfficiency).observe(asked.covered, cost, beyond)

    def draft(self, seq: np.ndarray, stop: int, limit: int, estimates: np.ndarray,
              covered: np.ndarray | None = None, plain: tuple[float, float] = (1.0, 1.0),
              rate: float | None = None, tokens_left: int | None = None) -> Candidates:
        """The draft's chain after seq[:stop] (row 0), then runner-up branches (greedy only); none
        when drafting is expected to lower the step's tokens per second.

        estimates [2 * BUCKETS, D] are this source's acceptance estimates per class and depth;
        covered [D] the other sources' best path probability per depth (None: nothing);
        plain (tokens, cost in plain target steps) of this step without the draft;
        rate: tokens draft steps added lately past the free trie at this coverage, per plain
        target step they cost, catch-ups aside (None: DraftEfficiency's prior);
        tokens_left: tokens still to generate (None: no end in view), over which a catch-up must pay.
        """
        began = time.perf_counter()
        ratio = self.cost_ratio(1)
        depth_cap = estimates.shape[1] - 1
        if covered is None:
            covered = np.zeros(depth_cap + 1)
        if rate is None:
            rate = DraftEfficiency().rate(float(covered[0]), ratio)
        tokens, steps = plain
        if ratio > 0 and rate * steps < tokens:  # a free draft (ratio 0: a fixed budget) always drafts
            return no_candidates()
        first_cost = self.cost_ratio(self.drafter.pending(seq, stop))  # also feeds what it has not seen
        if first_cost > ratio and not _recoups(first_cost - ratio, ratio, rate, tokens, steps, tokens_left):
            return no_candidates()
        logits = self.drafter.sync(seq, stop)  # [V] (the prompt too, at first)
        chain: list[int] = []
        classes: list[int] = []
        dists: list[torch.Tensor] = []
        branches: list[tuple[list[int], list[int]]] = []
        path, catch_up = 1.0, 0.0
        tick = began
        while True:
            q = self._distribution(logits, seq, stop, chain)  # [V]
            token, top, runners = self._pick(q)
            tick = self._observe(self.drafter.last_rows, tick)
            if not chain and first_cost > ratio:  # the first forward's rows beyond one: a one-off
                catch_up = (tick - began) * (1.0 - ratio / first_cost)
            depth = len(chain)
            cls = confidence_bucket(top)
            chain.append(token)
            classes.append(cls)
            dists.append(q)
            for alt, prob in runners:
                branches.append((chain[:-1] + [alt], classes[:-1] + [BUCKETS + confidence_bucket(prob)]))
            path *= estimates[cls, min(depth, depth_cap)]
            tokens += max(0.0, path - covered[min(depth, depth_cap)])
            steps += first_cost if depth == 0 else ratio
            after = min(depth + 1, depth_cap)
            if len(chain) >= self.max_tokens or not _pays(path * estimates[cls, after] - covered[after], ratio,
                                                          tokens, steps):
                break
            logits = self.drafter.feed(token)
        self.drafted += len(chain)
        rows = [(chain, classes)] + branches[:max(0, limit - 1)]
        drawn_q = torch.stack(dists) if self.rng is not None else None  # [L, V] the draws' distributions
        return _candidates(rows, drawn_q, time.perf_counter() - began, catch_up)

    def _observe(self, rows: int, since: float) -> float:
        """One draft forward over ``rows`` rows (and its read-back) ended now: refine the draft's curve."""
        now = time.perf_counter()
        if self.cost is not None:
            self.cost.observe(rows, now - since)
        return now

    def _distribution(self, logits: torch.Tensor, seq: np.ndarray, stop: int, chain: list[int]) -> torch.Tensor:
        """q [V]: the draft's processed distribution after seq[:stop] + chain."""
        paths = np.array([chain or [0]], dtype=np.int64)  # [1, max(1, d)]
        scores = process_rows(self.decoding, logits[None], seq, stop, paths, np.array([len(chain)]))
        return torch.softmax(scores.float(), dim=-1)[0]

    def _pick(self, q: torch.Tensor) -> tuple[int, float, list[tuple[int, float]]]:
        """(chain token, max q, [(runner-up, its q)]): the argmax when greedy, a draw from q when sampling."""
        values, index = q.topk(1 + self.alternatives)  # [1 + A]
        top, best = values.tolist(), index.tolist()  # the draft's host sync
        if self.rng is None:
            return best[0], top[0], [(t, p) for t, p in zip(best[1:], top[1:]) if p > 0]
        cdf = q.cumsum(0, dtype=torch.float64)  # [V]
        u = float(self.rng.random())
        drawn = int(torch.searchsorted(cdf, cdf[-1:] * u, right=True).clamp_max(q.shape[0] - 1))
        return drawn, top[0], []


def _pays(gain: float, cost: float, tokens: float, steps: float) -> bool:
    """Whether ``gain`` more tokens for ``cost`` more target steps raise a step's rate of
    ``tokens`` per ``steps`` (a free forward pays whenever it adds anything).

    _pays(0.5, 0.4, 1.0, 1.0) -> True (1.25 > 1); _pays(0.5, 0.4, 4.0, 1.5) -> False.
    """
    if cost <= 0:
        return gain > 0
    return gain > 0 and gain * steps >= cost * tokens


def _recoups(extra: float, forward: float, rate: float, tokens: float, steps: float,
             tokens_left: int | None) -> bool:
    """Whether a catch-up costing ``extra`` plain steps beyond one draft forward (``forward``
    plain steps) is won back: each step still to come (``tokens_left`` tokens at ``tokens`` per step
    of ``steps`` plain steps) that drafts one forward adds ``rate * forward`` tokens, which
    would otherwise take ``rate * forward * steps / tokens`` plain steps; tokens_left None: no end in view.

    _recoups(2.0, 0.5, 1.5, 1.0, 1.0, 100) -> True (100 steps x 0.25 = 25 >= 2);
    _recoups(2.0, 0.5, 1.5, 1.0, 1.0, 5) -> False (1.25 < 2).
    """
    if tokens_left is None:
        return True
    saved = forward * (rate * steps / tokens - 1.0)  # plain steps one drafting step saves
    return saved * tokens_left / tokens >= extra


def _candidates(rows: list[tuple[list[int], list[int]]], q: torch.Tensor | None, seconds: float,
                catch_up: float) -> Candidates:
    """Candidates of token rows with their classes (row 0 the chain), zero-padded."""
    width = max(len(tokens) for tokens, _ in rows)
    tokens = np.zeros((len(rows), width), dtype=np.int64)  # [G, L]
    classes = np.zeros((len(rows), width), dtype=np.int64)  # [G, L]
    lens = np.array([len(t) for t, _ in rows], dtype=np.int64)  # [G]
    for g, (toks, cls) in enumerate(rows):
        tokens[g, :len(toks)] = toks
        classes[g, :len(cls)] = cls
    return Candidates(tokens, lens, classes, q=q, seconds=seconds, catch_up=catch_up)
