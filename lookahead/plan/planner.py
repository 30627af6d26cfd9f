"""Plan a step: every proposer's candidates -> one scored trie -> the prefix the budget pays for.

The planner names no source: each is asked through the Proposer protocol
(proposers/base.py) with a ``StepContext`` (a source that must know what
the others reach asks for it, and they are asked first), told the step's
``Outcome`` afterwards, and asked what a window column is worth to it.

Two modes. ``rank`` / ``cut``: the tree lookahead's own loop verifies, as large as the budget pays
for. ``chain``: for an engine that verifies one chain of draft tokens per step and charges a row
for each (vLLM, lookahead/vllm/), the trie's best path, cut where a token's chance of acceptance
falls below the engine's price of a row (chain.py). Either way the step's outcome goes to ``learn``.

The acceptance estimates (acceptance.py) that score the trie are kept per
*regime*: greedy decoding, and sampling per temperature band. A candidate
that greedy decoding accepts 60% of the time is accepted less often at
T=1.0 (the target's probability of that token, not a 0/1 argmax match), so
mixing the two would make the budget over- or under-speculate. Each regime
starts from the sources' priors and learns only from steps decoded in it;
what each source learns for itself (its ``State``) is kept the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from ..config import LookaheadConfig
from ..core.rows import DrawnRows
from ..core.tree import TokenTree, empty_tree, prepend_chain, scored_groups, subtree
from ..kernels.trie import best_first_order, ranked_nodes
from ..proposers.base import Candidates, Others, Outcome, Proposer, StepContext, acts
from .acceptance import AcceptanceStats
from .budget import expected_gains
from .chain import best_chain
from .choice import StepChooser

SCORE_DEPTH = 32  # depths told apart by the acceptance estimates (deeper share the last): past it, copies
# are long enough that one estimate serves
BUILD_SLACK = 4  # the scored trie may hold this many times max_tree_nodes before pruning: room for the
# best-first cut to choose, without building tries no budget keeps
TEMPERATURE_BANDS = (0.35, 0.6, 0.85, 1.15, 1.5)  # sampling regimes: T below each edge, then above; acceptance
# falls with temperature, so each band learns its own estimates


def regime(do_sample: bool, temperature: float | None) -> str:
    """The estimate table a decode uses: 'greedy', or 'sample:<band>' by temperature."""
    if not do_sample:
        return "greedy"
    t = 1.0 if temperature is None else float(temperature)
    band = int(np.searchsorted(TEMPERATURE_BANDS, t, side="right"))
    return f"sample:{band}"


# A trie without nodes, ranked: shared (no numpy call a step), never written to (left writable: a read-only
# array is another type to numba's kernels, compiled again where one reaches them)
NO_ORDER = np.zeros(0, dtype=np.int64)
NO_PROBS = np.zeros(0)


@dataclass(frozen=True)
class DrawnChain:
    """A chain of tokens a draft DREW (sampling), as nodes of a scored trie."""

    tokens: np.ndarray  # [L] c_1 .. c_L
    nodes: np.ndarray  # [L] their node indices in the trie, in depth order
    q: torch.Tensor  # [L, V] q[d]: the distribution c_{d+1} was drawn from (at x for d = 0)


@dataclass(frozen=True)
class RankedTree:
    """A scored trie, its nodes in best-first order, and their path probabilities
    (the budget calibrates their sums, budget.py)."""

    tree: TokenTree
    order: np.ndarray  # [M] node indices, best first (every prefix is closed under parents)
    probs: np.ndarray  # [M] path probability of order[i]: keeping k nodes promises 1 + probs[:k].sum() tokens
    drawn: DrawnChain | None = None  # a draft's drawn chain, its own branch of the trie
    seconds: float = 0.0  # what proposing cost beyond the step's forward (a draft's forwards)


def drawn_rows(chain: DrawnChain | None, kept: np.ndarray) -> DrawnRows | None:
    """The decision rows of a cut tree (kept [k]: the trie's nodes kept, sorted) whose next token
    was drawn: x with c_1, then every kept chain node c_d with c_{d+1} (when the chain goes on).

    The draws are verified at those rows whether or not the drawn child itself was kept.
    """
    if chain is None:
        return None
    kept_chain = chain.nodes[np.isin(chain.nodes, kept)]  # a prefix of the chain: kept sets are closed
    inner = kept_chain[:chain.tokens.shape[0] - 1]  # the last drawn token has no draw after it
    rows = np.concatenate([[0], 1 + np.searchsorted(kept, inner)]).astype(np.int64)  # [R]
    return DrawnRows(rows, chain.tokens[:rows.shape[0]], chain.q[:rows.shape[0]])


def coverage(depths: np.ndarray, prob: np.ndarray, length: int) -> np.ndarray:
    """covered [length]: the best path probability among nodes at depth d + 1 (0 where none).

    depths [1 2 1 3], prob [.9 .5 .3 .2], length 4 -> [.9 .5 .2 0].
    """
    covered = np.zeros(length)
    if depths.shape[0]:
        np.maximum.at(covered, np.minimum(depths, length) - 1, prob)
    return covered


def split_drawn(cands: Candidates, offset: int) -> tuple[Candidates, Candidates | None]:
    """(the chosen rows, the drawn row or None) of one source's candidates: a source that drew
    row 0 (``q`` set) gets it back apart, its classes offset into the shared table."""
    if cands.q is None or not cands.count:
        return cands, None
    drawn = Candidates(cands.tokens[:1], cands.lens[:1], cands.classes[:1] + offset, cands.q)
    return Candidates(cands.tokens[1:], cands.lens[1:], cands.classes[1:]), drawn


Rows = tuple[np.ndarray, np.ndarray, np.ndarray, int]  # one source's (tokens [G, L], lens [G], classes [G, L],
# offset of its classes in the shared estimate table), as core/tree.py scored_groups takes them


class Planner:
    """One sequence's proposers and the call's acceptance estimates: ``rank`` gives the step's scored
    trie, ``cut`` its tree; the batch-wide choice of the step's shape is the ``StepChooser``'s."""

    def __init__(self, config: LookaheadConfig, proposers: list[Proposer], acceptance: AcceptanceStats,
                 chooser: StepChooser):
        self.config = config
        self.proposers = proposers
        self.acceptance = acceptance
        self.chooser = chooser
        self.states = [partial(acceptance.state, source.name) for source in proposers]  # what each learns
        # the sources told each step's outcome and new tokens: those whose learn / observe do something
        self.learners = [i for i, source in enumerate(proposers) if acts(source, "learn")]
        self.observers = [source for source in proposers if acts(source, "observe")]
        self.predicted = 0.0  # extra tokens the last planned tree promised (before calibration)
        self.drawn: DrawnRows | None = None  # the last cut tree's rows whose next token a draft drew
        self.offered: list[Candidates] = []  # the last step's candidates, one per source in order (as offered)
        self.behind: tuple[int, int] | None = None  # (start, stop) of the tokens the sources were not told of yet

    def begin(self, seq: np.ndarray, stop: int) -> None:
        """A new sequence whose prompt is seq[:stop]."""
        for source in self.proposers:
            source.begin(seq, stop)

    def column_worth(self) -> float:
        """Tokens one window column fed for one step is worth, later, to all the sources together."""
        return sum(source.column_worth(state) for source, state in zip(self.proposers, self.states))

    def rank(self, seq: np.ndarray, stop: int, tokens_left: int) -> RankedTree:
        """1. propose, 2. the scored trie in best-first order with path probabilities.

        ``tokens_left`` is how many tokens may still be appended: a node at depth
        >= tokens_left only decides tokens past the budget (or the model's context,
        whose positions must never be fed), so the trie is cut above it.
        """
        cap = self.config.max_tree_nodes
        if self.config.candidates == 0 or cap == 0 or tokens_left <= 1:
            return self.nothing()
        estimates = self.acceptance.estimates()  # [C, D]
        chosen, drawn, seconds, built = self._propose(seq, stop, estimates, tokens_left)
        tree, prob = built if built is not None else scored_groups(chosen, estimates, BUILD_SLACK * cap)
        chain = None
        if drawn is not None:
            # A drawn chain is its own branch (put first), never merged with another source's equal tokens,
            # and scored by classes fixed before each draw: which nodes the budget keeps
            # cannot depend on which tokens were drawn, so every draw verified at a row is
            # still a plain draw from that row's q (verify/verifier.py's min(1, p/q) needs exactly that).
            length = int(drawn.lens[0])
            classes = drawn.classes[0, :length]  # [L] already offset into the shared table
            cond = estimates[classes, np.minimum(np.arange(length), estimates.shape[1] - 1)]  # [L]
            tree, prob, nodes = prepend_chain(tree, prob, drawn.tokens[0, :length], classes, cond)
            chain = DrawnChain(drawn.tokens[0, :length], nodes, drawn.q)
        if tree.size == 0:
            return RankedTree(tree, NO_ORDER, NO_PROBS, None, seconds)
        deepest = min(tokens_left, cap + 1)  # no node deeper than cap survives anyway (a huge budget stays an int64)
        order, probs = ranked_nodes(tree.parents, prob, tree.depths, deepest)  # [M]: probs as the estimates say
        # (the budget's forecast_step calibrates their sums)
        return RankedTree(tree, order, probs, chain, seconds)

    def chain(self, seq: np.ndarray, stop: int, tokens_left: int, least: float,
              estimates: np.ndarray | None = None) -> TokenTree:
        """Chain mode: 1. propose, 2. the scored trie's best path (chain.py) of at most ``tokens_left`` draft
        tokens, cut where a token's path probability, scaled by how far the promises of recent chains held
        (the calibration), falls below ``least``; the chain as a tree (node d at depth d + 1), empty for
        none. ``estimates`` [C, D]: this step's, when the caller already has them (one table, many rows).

        The trie holds up to max(max_tree_nodes, tokens_left) nodes, none deeper than ``tokens_left``, so that the first
        source's long rows leave room for the others'. A drawn row (a sampling draft's, whose verification
        needs its q) is no chain's: chain mode proposes the chosen rows.
        """
        self.predicted = 0.0
        if tokens_left <= 0:
            return empty_tree()
        estimates = self.acceptance.estimates() if estimates is None else estimates
        chosen = self._propose(seq, stop, estimates, tokens_left)[0]
        tree, prob = scored_groups(chosen, estimates, max(self.config.max_tree_nodes, tokens_left), deepest=tokens_left)
        if not tree.size:
            return empty_tree()
        nodes = best_chain(tree.parents, prob, tokens_left, 0.0)  # [L] the best path, uncut
        promised = float(prob[nodes].sum())
        if promised <= 0.0:
            return empty_tree()
        trust = float(self.acceptance.calibrated(np.array([promised]))[0]) / promised  # how far promises held
        length = int(np.count_nonzero(prob[nodes] * trust >= least))  # path probabilities only fall along a path
        nodes = nodes[:length]
        self.predicted = float(prob[nodes].sum())
        return subtree(tree, nodes) if length else empty_tree()

    @staticmethod
    def nothing() -> RankedTree:
        """A ranked trie without nodes: a step that proposes nothing (no source asked)."""
        return RankedTree(empty_tree(), NO_ORDER, NO_PROBS)

    def cut(self, ranked: RankedTree, size: int) -> TokenTree:
        """The first ``size`` nodes of a ranked trie (closed under parents), as the step's tree."""
        self.predicted = sum(ranked.probs[:size].tolist())  # (a builtin sum: a step's numpy calls come cold)
        self.drawn = drawn_rows(ranked.drawn, np.sort(ranked.order[:size])) if ranked.drawn is not None else None
        return subtree(ranked.tree, ranked.order[:size])

    def _propose(self, seq: np.ndarray, stop: int, estimates: np.ndarray, tokens_left: int):
        """Candidates from every source (at most G each): each source's chosen rows with its offset into
        the shared table (``_rows``), a drawn chain (or None), the seconds the sources spent, and their
        scored trie when it is already built (what the others reach, when the source that asked added
        no chosen rows), else None.

        Sources are asked in priority order; a source that asks what the others reach
        (``StepContext.others``: one that costs time to ask, such as a draft model, spends it only
        where the step gains) has every source not already being asked asked first, once.
        """
        self._catch_up(seq)
        count = len(self.proposers)
        found: dict[int, Candidates] = {}
        asking: set[int] = set()
        reached: dict[int, tuple[list[int], tuple[TokenTree, np.ndarray], Others]] = {}

        def ask(i: int) -> None:
            if i in found or i in asking:
                return
            asking.add(i)
            step = StepContext(tokens_left, self.states[i], partial(others, i), self.chooser.unit)
            found[i] = self.proposers[i].propose(seq, stop, self.config.candidates,
                                                 self.acceptance.block(i, estimates), step)
            asking.discard(i)

        def others(i: int) -> Others:
            if i not in reached:
                for j in range(count):
                    if j != i:
                        ask(j)
                asked = [j for j in sorted(found) if j != i]
                free = self._rows([(split_drawn(found[j], 0)[0], j) for j in asked])
                tree, prob = scored_groups(free, estimates, BUILD_SLACK * self.config.max_tree_nodes)
                covered = coverage(tree.depths, prob, estimates.shape[1])  # [D]
                reached[i] = (asked, (tree, prob), Others(tree, covered, self._plain_step(tree, prob)))
            return reached[i][2]

        try:
            for i in range(count):
                ask(i)
        finally:  # ask and others hold each other: emptied, they (and what they hold) go now, not at the next gc
            ask = others = None  # type: ignore[assignment]
        self.offered = [found[i] for i in range(count)]
        drawn, groups = None, []
        for i in range(count):
            cands, row = split_drawn(found[i], self.acceptance.bounds[i])
            drawn = row if row is not None else drawn
            groups.append((cands, i))
        built = None
        for i, (asked, trie, _) in reached.items():
            if len(asked) == count - 1 and not groups[i][0].count:  # the asker added no chosen rows
                built = trie
                break
        return self._rows(groups), drawn, sum(c.seconds for c in found.values()), built

    def _plain_step(self, tree: TokenTree, prob: np.ndarray) -> tuple[float, float]:
        """(expected tokens, cost in plain steps) of this step if it verified ``tree`` alone, sized
        by the budget: what a source that costs time must beat (1, 1 without a cost model)."""
        if self.chooser.cost is None or tree.size == 0:
            return 1.0, 1.0
        probs = prob[best_first_order(tree.parents, prob)]  # [M]
        column_gain = self.column_worth()
        width, size = self.chooser.choose([probs], column_gain)
        tokens = expected_gains(probs, size, self.acceptance.calibrated)[size] + column_gain * width
        return float(tokens), self.chooser.price(size, width)

    def _rows(self, groups: list[tuple[Candidates, int]]) -> list[Rows]:
        """(candidates, source number) pairs as ``scored_groups`` takes them, in order: each source's rows
        with its offset into the shared estimate table (sources without rows left out)."""
        bounds = self.acceptance.bounds
        return [(c.tokens, c.lens, c.classes, bounds[i]) for c, i in groups if c.count]

    def learn(self, tree: TokenTree, path: np.ndarray, width: int = 0) -> None:
        """Count the verified nodes into the estimates and the tree's yield against its promise
        (a step without a tree moves the calibration's window on), then tell every source the
        step's outcome (``width`` window columns fed)."""
        self.acceptance.update(tree.classes, tree.depths, tree.parents, path)
        self.acceptance.observe_gain(self.predicted if tree.size else 0.0, int(path.shape[0]))
        if not self.learners:
            return
        price = partial(self.chooser.price, tree.size, width)
        bounds = self.acceptance.bounds
        for i in self.learners:
            self.proposers[i].learn(Outcome(tree, path, width, (bounds[i], bounds[i + 1]), self.states[i], price))

    def observe(self, seq: np.ndarray, start: int, stop: int, defer: bool = False) -> None:
        """seq[start:stop] was just accepted. ``defer`` (a step of a batch that proposes nothing for a while,
        plan/pause.py): the sources are told at the next proposal or at the end, of every token since the last
        time at once (what they keep is read only when they propose; each one's observe takes any span)."""
        self.behind = (start if self.behind is None else self.behind[0], stop)
        if not defer:
            self._catch_up(seq)

    def _catch_up(self, seq: np.ndarray) -> None:
        """Tell the sources of the tokens ``observe`` deferred, in one span (the spans it was given, joined)."""
        if self.behind is None:
            return
        (start, stop), self.behind = self.behind, None
        if start < stop:
            for source in self.observers:
                source.observe(seq, start, stop)

    def finish(self, seq: np.ndarray, stop: int) -> None:
        """The sequence ended as seq[:stop] (the sources told first of what they missed while it was deferred)."""
        self._catch_up(seq)
        for source in self.proposers:
            source.finish(seq, stop)
