"""Token recycling: the model's own top-R next tokens, remembered per token and
per pair of tokens, and expanded into a tree (kernels in kernels/recycle.py).

Every forward already computes the logits at x, at the window's last level and
at every tree node, rejected ones included. Their top-R tokens are stored as
"what follows token t" (the most recent sighting wins) in an adjacency table
[V, R] that lives as long as the generator, and, with the token each row
follows (x's predecessor, a tree node's parent, a window row's neighbour in
its column: decode/sequence.py), as "what follows the pair (s, t)" in a hashed pair
table [S, R]. From x a best-first tree is grown over both: a node offers its
pair's successors and its token's.

Each remembered successor also keeps how sure the model was of it: its
probability within the top-R (softmax over the R best logits, an upper bound
of its real probability that costs no pass over the vocabulary), cut into
``CONFIDENCE_EDGES`` buckets. A node's class is (rank, bucket), so the
acceptance estimates learn that a rank-0 successor the model gave 0.95 is
accepted far more often than one it gave 0.3 (under sampling its acceptance
IS the target's probability of it), and the budget speculates where the
model was sure, not where the text is open.
"""

from __future__ import annotations

import numpy as np
import torch

from ..core.arrays import contiguous
from ..kernels.recycle import recycled_paths, table_learn
from ..kernels.topk import top_entries, top_entries_rows
from .base import Candidates, Source, StepContext, no_candidates

PAIR_SLOTS = 65521  # slots of the pair table (a prime: kernels/recycle.py's pair_slot)
CONFIDENCE_EDGES = (0.25, 0.5, 0.75, 0.9)  # bucket b holds top-R probabilities in [edge b-1, edge b)
EDGES = np.array(CONFIDENCE_EDGES)
BUCKETS = len(CONFIDENCE_EDGES) + 1
BUCKET_MIDDLES = np.array([0.12, 0.37, 0.62, 0.82, 0.95])  # a typical probability in each bucket
RANK_DAMPING = 0.8  # a rank-r successor's prior is its bucket's middle times this / (1 + r): it may be stale
SHARED_ROWS = 2  # kept rows from which their top-R are read on numba's threads (top_entries_rows)


def rank_priors(width: int) -> np.ndarray:
    """Assumed acceptance [2 * R * B] of a successor of rank r in confidence bucket b (a token's:
    class r * B + b; a pair's: R * B + r * B + b) before any is measured: the bucket's typical
    probability, damped by rank (a remembered successor may be stale)."""
    damp = RANK_DAMPING / (1.0 + np.arange(width))  # [R]
    single = (damp[:, None] * BUCKET_MIDDLES[None, :]).reshape(-1)  # [R * B]
    return np.concatenate([single, single])


def top_successors(logits: torch.Tensor, width: int) -> torch.Tensor:
    """The top-R tokens of every row of logits [K, V] and their confidence buckets, on the device:
    int64 [K, 2R] (tokens, then buckets).

    A bucket is how many CONFIDENCE_EDGES the token's probability within the
    top R reaches (softmax over the R best logits). On the CPU (float32/64) numba's
    ``top_entries`` reads the rows, elsewhere torch's topk (the same result where no two
    logits of a row's top R are equal).
    """
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64) and not logits.requires_grad:
        rows = np.ascontiguousarray(logits.numpy())  # (the kernel reads C-contiguous rows; a slice may not be)
        read = top_entries_rows if rows.shape[0] >= SHARED_ROWS else top_entries  # (the same array either way)
        return torch.from_numpy(read(rows, width, EDGES))  # a few times torch's speed
    values, tokens = logits.topk(width, dim=-1)  # [K, R]
    share = torch.softmax(values.float(), dim=-1)  # [K, R]
    bucket = torch.zeros_like(tokens)
    for edge in CONFIDENCE_EDGES:
        bucket += share >= edge
    return torch.cat([tokens, bucket], dim=1)  # [K, 2R]


class AdjacencyTable:
    """token -> its most recent top-R successors (-1 = not seen yet) and their confidence buckets;
    (previous token, token) -> the same, in a hashed table of ``slots`` pairs (0: no pairs)."""

    def __init__(self, vocab: int, width: int, slots: int = PAIR_SLOTS):
        self.successors = np.full((vocab, width), -1, dtype=np.int64)  # [V, R]
        self.confidence = np.zeros((vocab, width), dtype=np.int64)  # [V, R] buckets 0 .. B-1
        self.pair_keys = np.full((slots, 2), -1, dtype=np.int64)  # [S, 2] (previous, token) held
        self.pair_successors = np.full((slots, width), -1, dtype=np.int64)  # [S, R]
        self.pair_confidence = np.zeros((slots, width), dtype=np.int64)  # [S, R]

    @property
    def width(self) -> int:
        return int(self.successors.shape[1])

    def learn(self, tokens: np.ndarray, top: np.ndarray, buckets: np.ndarray | None = None,
              prev: np.ndarray | None = None) -> None:
        """Row i of a forward carried tokens[i] after prev[i] (-1 or None: unknown); the model's
        top-R there were top[i, :R], with confidence buckets buckets[i, :R] (None: all 0)."""
        count, width = tokens.shape[0], self.width
        top = contiguous(top[:, :width])  # [K, R]
        buckets = np.zeros_like(top) if buckets is None else contiguous(buckets[:, :width])
        prev = np.full(count, -1, dtype=np.int64) if prev is None else contiguous(prev)
        table_learn(contiguous(tokens), prev, top, buckets, 0, BUCKETS, self.successors, self.confidence,
                    self.pair_keys, self.pair_successors, self.pair_confidence)

    def learn_staged(self, tokens: np.ndarray, staged: np.ndarray, prev: np.ndarray) -> None:
        """``learn`` from the verifier's staged layout: staged [K, 2R] holds each row's top-R, then their
        confidence buckets (``top_successors``); prev [K] (-1: unknown). No copy of either half."""
        staged = contiguous(staged)
        table_learn(contiguous(tokens), contiguous(prev), staged, staged, self.width, BUCKETS, self.successors,
                    self.confidence, self.pair_keys, self.pair_successors, self.pair_confidence)


class RecyclingProposer(Source):
    """Proposes a best-first tree of up to ``nodes`` recycled successors of x (the planner ranks
    them among the other sources' candidates and keeps what the budget pays for). Nothing to begin,
    observe or learn as ``Source``: the table is kept across sequences and learns from the forward's
    logits (``AdjacencyTable.learn_staged``, called by the sequence's commit)."""

    name = "recycle"

    def __init__(self, table: AdjacencyTable, nodes: int):
        self.table = table
        self.nodes = nodes
        self.priors = rank_priors(table.width)

    def propose(self, seq: np.ndarray, stop: int, limit: int, estimates: np.ndarray,
                step: StepContext | None = None) -> Candidates:
        if limit <= 0 or self.nodes <= 0:
            return no_candidates()
        table = self.table
        before = int(seq[stop - 2]) if stop >= 2 else -1  # x's previous token
        cands, lens, classes = recycled_paths(
            table.successors, table.confidence, table.pair_keys, table.pair_successors, table.pair_confidence,
            BUCKETS, before, int(seq[stop - 1]), estimates, self.nodes)
        if lens.shape[0] == 0:
            return no_candidates()
        return Candidates(cands, lens, classes)
