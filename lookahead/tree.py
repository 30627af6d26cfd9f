"""Pure builders of one step's layout: [x | lookahead window | token tree].

Rows (Q = W * (N - 1) + M):
  0 .. W*(N-1)-1   the window, level by level; row 0 (level 0, column 0) is x
  W*(N-1) .. Q-1   the tree nodes (M of them), each a child of x or of a node

Offsets are positions relative to x (x at offset 0). ``local_mask[Q, Q]`` says
which of this step's rows a row may attend to; every row also sees the whole
KV prefix (subject to a sliding window). See DESIGN.md section 1 for a drawing.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from .kernels.trie import ancestor_mask, build_scored_trie


@dataclass(frozen=True)
class TokenTree:
    """Candidates merged into a trie; node i's parent is parents[i] (-1 = x), parents first."""

    tokens: np.ndarray  # [M] int64
    parents: np.ndarray  # [M] int64
    depths: np.ndarray  # [M] int64, x has depth 0
    classes: np.ndarray  # [M] int64, the acceptance class each node is scored and counted under

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])


@dataclass(frozen=True)
class StepLayout:
    """Token rows, relative positions and the local mask of one forward pass."""

    offsets: np.ndarray  # [Q] int64, position - position of x
    local_mask: np.ndarray  # [Q, Q] bool
    tree_start: int  # first tree row = W * (N - 1)


def empty_tree() -> TokenTree:
    """A tree with no nodes."""
    none = np.zeros(0, dtype=np.int64)
    return TokenTree(none, none, none, none)


def scored_tree(cands: np.ndarray, lens: np.ndarray, classes: np.ndarray, estimates: np.ndarray,
                max_nodes: int) -> tuple[TokenTree, np.ndarray]:
    """Merge cands[G, L] (valid up to lens[g], labelled classes[G, L]) into a trie of at most
    max_nodes nodes, each with its path probability under estimates[C, D]: (tree, prob[M])."""
    if cands.shape[0] == 0 or max_nodes <= 0:
        return empty_tree(), np.zeros(0)
    tokens, parents, depths, cls, prob = build_scored_trie(
        cands.astype(np.int64), lens.astype(np.int64), classes.astype(np.int64), estimates, max_nodes)
    return TokenTree(tokens, parents, depths, cls), prob


def tree_from_candidates(cands: np.ndarray, lens: np.ndarray, max_nodes: int) -> TokenTree:
    """Merge candidate continuations cands[G, L] (valid up to lens[g]) into a trie, in row order."""
    classes = np.zeros(cands.shape, dtype=np.int64)  # one class, every estimate 1: order of rows
    return scored_tree(cands, lens, classes, np.ones((1, 1)), max_nodes)[0]


def subtree(tree: TokenTree, nodes: np.ndarray) -> TokenTree:
    """The tree of the given nodes (closed under parents), renumbered in their original order."""
    keep = np.sort(nodes)  # [k]; parents keep coming before children
    index = np.full(tree.size, -1, dtype=np.int64)
    index[keep] = np.arange(keep.shape[0])
    parents = tree.parents[keep]
    parents = np.where(parents >= 0, index[np.maximum(parents, 0)], -1)
    if (parents[tree.parents[keep] >= 0] < 0).any():
        raise ValueError("subtree: the nodes are not closed under parents")
    return TokenTree(tree.tokens[keep], parents, tree.depths[keep], tree.classes[keep])


@lru_cache(maxsize=64)
def window_layout(window: int, ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """Offsets [W*(N-1)] and mask [W*(N-1), W*(N-1)] of the lookahead window.

    Built once per (W, N) and cached (the decode loop asks every step);
    callers copy the arrays, never write to them.

    Level 0 is a causal chain (x, a1, ..., a_{W-1}) at offsets 0..W-1. Level
    l >= 1, column i sits at offset i + l and sees level 0 up to column i plus
    the same column of levels 1..l.
    """
    levels = ngram - 1
    rows = window * levels
    level = np.repeat(np.arange(levels), window)  # [R]
    column = np.tile(np.arange(window), levels)  # [R]
    offsets = (level + column).astype(np.int64)
    sees_level0 = (level[None, :] == 0) & (column[None, :] <= column[:, None])  # [R, R]
    same_column = (column[None, :] == column[:, None]) & (level[None, :] >= 1) & (level[None, :] <= level[:, None])
    mask = sees_level0 | same_column
    assert mask.shape == (rows, rows)
    offsets.flags.writeable = mask.flags.writeable = False  # shared by the cache
    return offsets, mask


def step_layout(window: int, ngram: int, tree: TokenTree) -> StepLayout:
    """Offsets and local mask of [window | tree]; tree nodes see x and their ancestors."""
    w_offsets, w_mask = window_layout(window, ngram)
    start = w_offsets.shape[0]
    size = start + tree.size
    mask = np.zeros((size, size), dtype=bool)
    mask[:start, :start] = w_mask
    if tree.size:
        mask[start:, 0] = True
        mask[start:, start:] = ancestor_mask(tree.parents)
    offsets = np.concatenate([w_offsets, tree.depths]).astype(np.int64)
    return StepLayout(offsets, mask, start)


def additive_mask(local_mask: torch.Tensor, offsets: torch.Tensor, past: int,
                  sliding_window: int | None, dtype: torch.dtype) -> torch.Tensor:
    """The 4-D additive mask [1, 1, Q, past + Q] for one step.

    local_mask [Q, Q] bool and offsets [Q] are on the target device. Query row
    q sits at position past + offsets[q]; cached key k at position k. With a
    sliding window, a key is visible only when query_pos - key_pos < window.
    """
    rows = local_mask.shape[0]
    device = local_mask.device
    visible = torch.cat([torch.ones(rows, past, dtype=torch.bool, device=device), local_mask], dim=1)  # [Q, P+Q]
    if sliding_window is not None:
        q_pos = past + offsets  # [Q]
        k_pos = torch.cat([torch.arange(past, device=device), q_pos])  # [P+Q]
        visible &= (q_pos[:, None] - k_pos[None, :]) < sliding_window
    zero = torch.zeros((), dtype=dtype, device=device)
    low = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=device)
    return torch.where(visible, zero, low)[None, None]  # [1, 1, Q, P+Q]


def model_mask(kinds: frozenset, sliding_window: int | None, local_mask: torch.Tensor, offsets: torch.Tensor,
               past: int, dtype: torch.dtype):
    """The mask to pass the model: one 4-D mask, or {layer kind: mask} when full and
    sliding layers are mixed (transformers accepts such a dict)."""
    if kinds == {"full_attention"} or sliding_window is None:
        return additive_mask(local_mask, offsets, past, None, dtype)
    sliding = additive_mask(local_mask, offsets, past, sliding_window, dtype)
    if kinds == {"sliding_attention"}:
        return sliding
    return {"full_attention": additive_mask(local_mask, offsets, past, None, dtype),
            "sliding_attention": sliding}
