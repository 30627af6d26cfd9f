"""Pure builders of one step's layout: [x | lookahead window | token tree].

Rows (Q = W * (N - 1) + M):
  0 .. W*(N-1)-1   the window, level by level; row 0 (level 0, column 0) is x
  W*(N-1) .. Q-1   the tree nodes (M of them), each a child of x or of a node

Offsets are positions relative to x (x at offset 0). ``local_mask[Q, Q]`` says
which of this step's rows a row may attend to; every row also sees the whole
KV prefix (subject to a sliding window). docs/DESIGN.md draws the mask; the
window's own rows come from window.py, the 4-D masks from model/mask.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels.trie import build_scored_trie, layout_mask, step_arrays, subtree_arrays, trie_extend, trie_probs
from ..kernels.walk import accept_walk
from .arrays import contiguous


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
    tokens, parents, depths, cls, prob = build_scored_trie(contiguous(cands), contiguous(lens), contiguous(classes),
                                                           estimates, max_nodes)
    return TokenTree(tokens, parents, depths, cls), prob


def scored_groups(groups: list[tuple[np.ndarray, np.ndarray, np.ndarray, int]], estimates: np.ndarray,
                  max_nodes: int, deepest: int = 1 << 30) -> tuple[TokenTree, np.ndarray]:
    """``scored_tree`` of several sources' rows without stacking them first: groups of (cands [G, L],
    lens [G], classes [G, L], offset into estimates' rows), merged in order into a trie of at most
    max_nodes nodes, no row deeper than ``deepest`` (one kernel call a group, one for the
    probabilities). The same trie as ``scored_tree`` over the groups stacked, classes offset."""
    if max_nodes <= 0 or not groups:
        return empty_tree(), np.zeros(0)
    nodes = np.empty((4, max_nodes), dtype=np.int64)  # tokens, parents, depths, classes
    cond = np.empty(max_nodes)  # [S] each node's chance given its parent
    m = 0
    for cands, lens, classes, offset in groups:
        m = trie_extend(nodes, cond, m, cands, lens, classes, offset, estimates, deepest)
    return TokenTree(nodes[0, :m], nodes[1, :m], nodes[2, :m], nodes[3, :m]), trie_probs(nodes[1], cond, m)


def prepend_chain(tree: TokenTree, prob: np.ndarray, tokens: np.ndarray, classes: np.ndarray,
                  cond: np.ndarray) -> tuple[TokenTree, np.ndarray, np.ndarray]:
    """The trie with a chain tokens[L] put first, below x, as its own branch (never merged with
    existing nodes, even where a token repeats a sibling's; being first, it is the child the
    verification walk takes when both carry the chosen token), each node scored cond[L] given its
    parent: (tree, prob [L + M], the chain's node indices [L]).

    tree tokens [4 5], parents [-1 0], prob [.9 .45]; chain [4 6] with cond [.5 .5]
    -> tokens [4 6 4 5], parents [-1 0 -1 2], prob [.5 .25 .9 .45], nodes [0 1].
    """
    length = int(tokens.shape[0])
    nodes = np.arange(length, dtype=np.int64)  # [L]
    parents = np.concatenate([[-1], nodes[:-1]]).astype(np.int64)  # [L]
    shifted = np.where(tree.parents >= 0, tree.parents + length, -1)  # [M]
    grown = TokenTree(np.concatenate([tokens, tree.tokens]).astype(np.int64),
                      np.concatenate([parents, shifted]).astype(np.int64),
                      np.concatenate([np.arange(1, length + 1), tree.depths]).astype(np.int64),
                      np.concatenate([classes, tree.classes]).astype(np.int64))
    return grown, np.concatenate([np.cumprod(cond), prob]), nodes


def subtree(tree: TokenTree, nodes: np.ndarray) -> TokenTree:
    """The tree of the given nodes (closed under parents), renumbered in their original order."""
    tokens, parents, depths, classes, closed = subtree_arrays(tree.tokens, tree.parents, tree.depths, tree.classes,
                                                              contiguous(nodes))
    if not closed:
        raise ValueError("subtree: the nodes are not closed under parents")
    return TokenTree(tokens, parents, depths, classes)


def step_layout(window: tuple[np.ndarray, np.ndarray], tree: TokenTree) -> StepLayout:
    """Offsets and local mask of [window | tree] from the window's (offsets, mask)
    (window.py); tree nodes see x and their ancestors."""
    w_offsets, w_mask = window
    offsets = np.concatenate([w_offsets, tree.depths]).astype(np.int64)
    return StepLayout(offsets, layout_mask(w_mask, tree.parents), w_offsets.shape[0])


def step_rows_layout(window: tuple[np.ndarray, np.ndarray], window_tokens: np.ndarray, x: int, kept: np.ndarray,
                     tree: TokenTree) -> tuple[StepLayout, np.ndarray, np.ndarray]:
    """``step_layout`` of [window | tree], with the rows' tokens [Q] (x at row 0, then the window's
    other rows from window_tokens, empty for x alone, then the tree's) and the kept rows [K] (the
    window's ``kept``, then every tree row), in one kernel call.

    Window x alone, x 7, kept [0], tree tokens [4 5] (parents [-1 0]) -> offsets [0 1 2],
    tokens [7 4 5], keep [0 1 2].
    """
    w_offsets, w_mask = window
    offsets, mask, tokens, keep = step_arrays(w_offsets, w_mask, window_tokens, x, kept, tree.tokens, tree.parents,
                                              tree.depths)
    return StepLayout(offsets, mask, w_offsets.shape[0]), tokens, keep


def matched_depth(tree: TokenTree, tokens: np.ndarray) -> int:
    """How many of tokens[k] (an accepted path from x down) the tree holds as a path from x:
    the tokens a greedy walk of this tree alone would have accepted.

    tree tokens [4 5 6 7], parents [-1 0 1 0]: [4 5 9] -> 2, [7] -> 0 (7 is no child of x),
    [4 7 1] -> 2.
    """
    k = int(tokens.shape[0])
    if tree.size == 0 or k == 0:
        return 0
    level = np.minimum(tree.depths, k) - 1  # [M] the accepted token each node must equal
    accept = (tree.depths <= k) & (tree.tokens == tokens[level])  # [M]
    path, _ = accept_walk(tree.tokens, tree.parents, accept, np.zeros(tree.size + 1, dtype=np.int64))
    return int(path.shape[0])
