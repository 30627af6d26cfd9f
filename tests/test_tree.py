"""Mask / position / trie builders against brute-force references and the docs/DESIGN.md drawing."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lookahead.core.tree import TokenTree, empty_tree, scored_tree, step_layout
from lookahead.plan.window import window_layout

DESIGN_DRAWING = """
1 . . . . . . . . .
1 1 . . . . . . . .
1 1 1 . . . . . . .
1 . . 1 . . . . . .
1 1 . . 1 . . . . .
1 1 1 . . 1 . . . .
1 . . . . . 1 . . .
1 . . . . . 1 1 . .
1 . . . . . . . 1 .
1 . . . . . . . 1 1
"""


def tree_from_candidates(cands: np.ndarray, lens: np.ndarray, max_nodes: int) -> TokenTree:
    """Merge candidate continuations cands[G, L] (valid up to lens[g]) into a trie, in row order."""
    classes = np.zeros(cands.shape, dtype=np.int64)  # one class, every estimate 1: order of rows
    return scored_tree(cands, lens, classes, np.ones((1, 1)), max_nodes)[0]


def drawing(text: str) -> np.ndarray:
    return np.array([[c == "1" for c in line.split()] for line in text.strip().splitlines()])


def test_layout_matches_the_design_drawing():
    """W=3, N=3, two candidates (u1 u2), (v1 v2) with distinct first tokens."""
    tree = tree_from_candidates(np.array([[11, 12], [21, 22]]), np.array([2, 2]), 10)
    layout = step_layout(window_layout(3, 3), tree)
    assert np.array_equal(layout.local_mask, drawing(DESIGN_DRAWING))
    assert layout.offsets.tolist() == [0, 1, 2, 1, 2, 3, 1, 2, 1, 2]
    assert layout.tree_start == 6


def brute_window(window: int, ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """Reference: cell (level l, column i) sees (0, j <= i) and (l' in 1..l, i)."""
    cells = [(l, i) for l in range(ngram - 1) for i in range(window)]
    mask = np.zeros((len(cells), len(cells)), dtype=bool)
    for a, (la, ia) in enumerate(cells):
        for b, (lb, ib) in enumerate(cells):
            mask[a, b] = (lb == 0 and ib <= ia) or (lb >= 1 and ib == ia and lb <= la)
    return np.array([l + i for l, i in cells]), mask


@given(st.integers(1, 7), st.integers(2, 6))
def test_window_layout_matches_brute_force(window, ngram):
    offsets, mask = window_layout(window, ngram)
    ref_offsets, ref_mask = brute_window(window, ngram)
    assert np.array_equal(offsets, ref_offsets)
    assert np.array_equal(mask, ref_mask)


def test_trie_merges_shared_prefixes():
    tree = tree_from_candidates(np.array([[4, 5, 6], [4, 7, 0]]), np.array([3, 2]), 10)
    assert tree.tokens.tolist() == [4, 5, 6, 7]
    assert tree.parents.tolist() == [-1, 0, 1, 0]
    assert tree.depths.tolist() == [1, 2, 3, 2]


def test_trie_respects_node_cap_and_empty_input():
    tree = tree_from_candidates(np.array([[1, 2, 3], [4, 5, 6]]), np.array([3, 3]), 4)
    assert tree.tokens.tolist() == [1, 2, 3, 4]
    assert tree_from_candidates(np.zeros((0, 3), dtype=np.int64), np.zeros(0, dtype=np.int64), 5).size == 0
    assert tree_from_candidates(np.array([[1]]), np.array([1]), 0).size == 0


@settings(max_examples=60)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=5), min_size=1, max_size=6))
def test_trie_holds_every_candidate_once(cands):
    width = max(map(len, cands))
    arr = np.array([c + [0] * (width - len(c)) for c in cands])
    tree = tree_from_candidates(arr, np.array([len(c) for c in cands]), 1000)
    paths = []
    for node in range(tree.size):  # the token path from x to each node
        path, cur = [], node
        while cur >= 0:
            path.append(int(tree.tokens[cur]))
            cur = int(tree.parents[cur])
        paths.append(tuple(reversed(path)))
        assert tree.depths[node] == len(path)
    prefixes = {tuple(c[:k]) for c in cands for k in range(1, len(c) + 1)}
    assert sorted(paths) == sorted(prefixes)  # one node per distinct prefix, nothing else
    layout = step_layout(window_layout(1, 2), tree)
    for node, path in enumerate(paths):  # a node sees x, itself and exactly its ancestors
        seen = {paths[j] for j in range(tree.size) if layout.local_mask[1 + node, 1 + j]}
        assert seen == {path[:k] for k in range(1, len(path) + 1)}
        assert layout.local_mask[1 + node, 0]


def test_window_of_width_zero_is_x_alone():
    from lookahead.plan.window import kept_window_rows, window_rows
    offsets, mask = window_layout(0, 4)
    assert offsets.tolist() == [0] and mask.tolist() == [[True]]
    assert window_rows(0, 4) == 1 and window_rows(3, 4) == 9 and window_rows(2, 2) == 2
    assert kept_window_rows(0, 4).tolist() == [0]
    assert kept_window_rows(2, 4).tolist() == [0, 4, 5]  # x, then the last level (level 2) of 2 columns
    assert kept_window_rows(3, 2).tolist() == [0, 1, 2]  # N = 2: the last level is level 0, x included


def test_window_previous_is_the_row_each_kept_row_follows():
    from lookahead.kernels.recycle import window_previous
    from lookahead.plan.window import kept_window_rows, window_layout
    assert window_previous(kept_window_rows(3, 4), 3).tolist() == [-1, 3, 4, 5]  # the level before, same column
    assert window_previous(kept_window_rows(3, 2), 3).tolist() == [-1, 0, 1]  # level 0: the column before
    assert window_previous(kept_window_rows(0, 4), 0).tolist() == [-1]  # x alone
    offsets, mask = window_layout(3, 4)
    rows = kept_window_rows(3, 4)[1:]
    before = window_previous(rows, 3)
    # the row before sits one position earlier and is seen by the kept row
    assert (offsets[before] == offsets[rows] - 1).all() and mask[rows, before].all()


def test_window_feeding_some_columns_advances_only_those():
    from lookahead.plan.window import JacobiWindow
    window = JacobiWindow(3, 3, seed=0)
    window.levels = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int64)  # [N-1, W]
    assert window.rows(9, 2).tolist() == [9, 2, 4, 5]  # x replaces level 0 column 0
    grams = window.advance(np.array([7, 8]))  # the model's argmax at the 2 fed last-level rows
    assert grams.tolist() == [[9, 4, 7], [2, 5, 8]]
    assert window.levels.tolist() == [[4, 5, 3], [7, 8, 6]]  # column 2 kept its stale guesses
    assert window.rows(1, 0).tolist() == [1]  # width 0: x alone
    assert window.advance(np.zeros(0, dtype=np.int64)).shape == (0, 3)


def test_matched_depth_docstring_example():
    from lookahead.core.tree import TokenTree
    from lookahead.core.tree import matched_depth
    tree = TokenTree(np.array([4, 5, 6, 7]), np.array([-1, 0, 1, 0]), np.array([1, 2, 3, 2]),
                     np.zeros(4, dtype=np.int64))
    assert matched_depth(tree, np.array([4, 5, 9])) == 2
    assert matched_depth(tree, np.array([7])) == 0
    assert matched_depth(tree, np.array([4, 7, 1])) == 2
    assert matched_depth(tree, np.array([4, 5, 6])) == 3
    assert matched_depth(empty_tree(), np.array([4])) == 0


def test_step_arrays_worked_example():
    from lookahead.kernels.trie import step_arrays
    offsets, mask, tokens, keep = step_arrays(
        np.zeros(1, dtype=np.int64), np.ones((1, 1), dtype=bool), np.zeros(0, dtype=np.int64), 7,
        np.zeros(1, dtype=np.int64), np.array([4, 5]), np.array([-1, 0]), np.array([1, 2]))
    assert offsets.tolist() == [0, 1, 2] and tokens.tolist() == [7, 4, 5] and keep.tolist() == [0, 1, 2]
    assert mask.astype(int).tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 3), st.integers(2, 4), st.lists(st.integers(-1, 12), min_size=0, max_size=12), st.data())
def test_step_rows_layout_is_the_layout_and_the_concatenated_rows(width, ngram, raw, data):
    """One kernel call gives what step_layout and the window's rows and kept rows concatenated gave."""
    from lookahead.core.tree import step_rows_layout
    from lookahead.plan.window import JacobiWindow, kept_window_rows
    parents = np.array([min(p, i - 1) for i, p in enumerate(raw)], dtype=np.int64)  # each parent before its node
    depths = np.zeros(parents.shape[0], dtype=np.int64)
    for i, p in enumerate(parents):
        depths[i] = 1 if p < 0 else depths[p] + 1
    tokens = np.array(data.draw(st.lists(st.integers(0, 99), min_size=parents.shape[0],
                                         max_size=parents.shape[0])), dtype=np.int64)
    tree = TokenTree(tokens, parents, depths, np.zeros_like(tokens))
    window = JacobiWindow(3, ngram, 0)
    window.begin(np.arange(10, 20))
    x = 42
    rows = window.rows(x, width)  # [x] for width 0
    kept = kept_window_rows(width, ngram)
    layout, got_tokens, keep = step_rows_layout(window.layout(width), rows if width else np.zeros(0, np.int64), x,
                                                kept, tree)
    expected = step_layout(window.layout(width), tree)
    assert layout.offsets.tolist() == expected.offsets.tolist()
    assert (layout.local_mask == expected.local_mask).all() and layout.tree_start == expected.tree_start
    assert got_tokens.tolist() == np.concatenate([rows, tokens]).tolist()
    assert keep.tolist() == np.concatenate([kept, expected.tree_start + np.arange(tree.size)]).tolist()


def test_kept_window_rows_are_shared_read_only():
    from lookahead.plan.window import kept_window_rows
    assert kept_window_rows(2, 4) is kept_window_rows(2, 4) and not kept_window_rows(2, 4).flags.writeable


def test_first_stop_cuts_at_eos_and_at_the_budget():
    from lookahead.call.output import first_stop
    new, done = first_stop(np.array([5, 2, 7]), np.array([2]), 10)
    assert new.tolist() == [5, 2] and done
    new, done = first_stop(np.array([5, 6, 7]), np.array([2]), 2)
    assert new.tolist() == [5, 6] and done
    new, done = first_stop(np.array([5, 6, 7]), np.array([2, 9]), 10)
    assert new.tolist() == [5, 6, 7] and not done
    new, done = first_stop(np.array([5, 9]), np.zeros(0, dtype=np.int64), 2)  # no EOS: the budget alone
    assert new.tolist() == [5, 9] and done
    new, done = first_stop(np.array([2, 2]), np.array([2]), 1)  # EOS right at the budget's edge
    assert new.tolist() == [2] and done


def test_contiguous_passes_an_array_that_is_already_so_and_copies_one_that_is_not():
    from lookahead.core.arrays import contiguous
    same = np.arange(3)
    assert contiguous(same) is same
    strided = contiguous(np.arange(6)[::2])
    assert strided.tolist() == [0, 2, 4] and strided.flags.c_contiguous
    floats = contiguous(np.arange(3), np.float64)
    assert floats.dtype == np.float64 and floats.tolist() == [0.0, 1.0, 2.0]
