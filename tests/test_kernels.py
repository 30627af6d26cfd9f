"""Numba kernels on tiny hand-written arrays: pool, context matcher, greedy acceptance."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lookahead.kernels.match import match_continuations
from lookahead.proposers.ngram import NgramPool
from lookahead.kernels.walk import accept_walk, chosen_walk


def greedy_accept(tokens: np.ndarray, parents: np.ndarray, root_next: int, node_next: np.ndarray):
    """Greedy verification (a test helper) from argmaxes: root_next at x, node_next[M] at the nodes.

    tokens [4 5 6 7], parents [-1 0 1 0], root_next 4, node_next [7 9 1 3]
    -> path [0 3], new [4 7 3].
    """
    best = np.concatenate([[root_next], node_next]).astype(np.int64)  # [1 + M]
    return accept_walk(tokens, parents, tokens == best[parents + 1], best)


def a(*values):
    return np.array(values, dtype=np.int64)


def test_pool_docstring_example():
    pool = NgramPool(vocab=16, ngram=3, capacity=2, max_keys=8)
    pool.insert_grams(np.array([[5, 7, 9], [5, 8, 1], [5, 7, 9], [5, 4, 4]]))
    assert pool.lookup(5, 4).tolist() == [[4, 4], [7, 9]]
    assert pool.lookup(6, 4).shape == (0, 2)
    assert pool.lookup(5, 1).tolist() == [[4, 4]]


def test_pool_deduplicates():
    pool = NgramPool(vocab=16, ngram=2, capacity=4, max_keys=8)
    pool.insert_grams(np.array([[1, 2], [1, 2], [1, 2]]))
    assert pool.size == 1 and pool.lookup(1, 9).tolist() == [[2]]


def test_pool_evicts_least_recent_key_when_full():
    pool = NgramPool(vocab=16, ngram=2, capacity=1, max_keys=2)
    pool.insert_grams(np.array([[1, 9], [2, 9], [1, 8], [3, 9]]))  # key 2 is the least recent
    assert pool.lookup(2, 1).shape == (0, 1)
    assert pool.lookup(1, 1).tolist() == [[8]] and pool.lookup(3, 1).tolist() == [[9]]


def test_pool_insert_sequence_and_out_of_range_keys():
    pool = NgramPool(vocab=8, ngram=3, capacity=4, max_keys=8)
    pool.insert_sequence(a(1, 2, 3, 1, 2, 4), 0, 6)
    assert pool.lookup(1, 4).tolist() == [[2, 4], [2, 3]]
    assert pool.lookup(3, 4).tolist() == [[1, 2]]
    pool.insert_grams(np.array([[99, 1, 2]]))  # outside the vocabulary: ignored
    assert pool.lookup(99, 4).shape == (0, 2)
    pool.insert_sequence(a(5, 6), 0, 2)  # shorter than N: nothing
    assert pool.lookup(5, 4).shape == (0, 2)


def test_pool_insert_sequence_from_start():
    pool = NgramPool(vocab=8, ngram=2, capacity=4, max_keys=8)
    pool.insert_sequence(a(1, 2, 3, 4), 2, 4)  # only grams starting at index >= 2
    assert pool.lookup(1, 4).shape == (0, 1) and pool.lookup(3, 4).tolist() == [[4]]


def test_match_docstring_example():
    out, lens, matched, count = match_continuations(a(1, 2, 3, 9, 1, 2, 3), 7, 1, 3, 2, 2)
    assert count == 1 and out[0].tolist() == [9, 1] and lens[0] == 2 and matched[0] == 3


def test_match_prefers_longest_suffix_and_most_recent():
    seq = a(7, 2, 5, 8, 2, 6, 1, 2)  # suffix [1 2] never re-occurs; [2] occurs at 1 and 4
    out, lens, matched, count = match_continuations(seq, 8, 1, 2, 2, 4)
    assert count == 2
    assert out[0].tolist() == [6, 1] and out[1].tolist() == [5, 8]  # most recent [2] first
    assert matched[:2].tolist() == [1, 1]


def test_match_measures_full_length_beyond_max_n():
    # suffix [5 6 7 8 9] occurred at 1..5; max_n is 2 but the match is 5 long (then seq[0] != seq[5])
    seq = a(3, 5, 6, 7, 8, 9, 1, 4, 5, 6, 7, 8, 9)
    out, lens, matched, count = match_continuations(seq, 13, 1, 2, 3, 1)
    assert count == 1 and out[0].tolist() == [1, 4, 5] and matched[0] == 5


def test_match_truncates_at_end_and_respects_stop():
    seq = a(4, 4, 0, 0)
    out, lens, matched, count = match_continuations(seq, 2, 1, 1, 3, 4)  # only seq[:2] = [4 4] counts
    assert count == 1 and lens[0] == 1 and out[0, 0] == 4 and matched[0] == 1
    assert match_continuations(a(1, 2, 3), 3, 1, 2, 2, 4)[3] == 0  # no repeat: nothing
    assert match_continuations(a(1, 1), 2, 1, 2, 2, 0)[3] == 0  # limit 0


def test_greedy_accept_docstring_example():
    path, new = greedy_accept(a(4, 5, 6, 7), a(-1, 0, 1, 0), 4, a(7, 9, 1, 3))
    assert path.tolist() == [0, 3] and new.tolist() == [4, 7, 3]


def test_greedy_accept_full_match_keeps_bonus_token():
    path, new = greedy_accept(a(4, 5, 6), a(-1, 0, 1), 4, a(5, 6, 8))
    assert path.tolist() == [0, 1, 2] and new.tolist() == [4, 5, 6, 8]


def test_greedy_accept_no_match_and_empty_tree():
    path, new = greedy_accept(a(4, 5), a(-1, 0), 9, a(5, 1))
    assert path.tolist() == [] and new.tolist() == [9]
    path, new = greedy_accept(a(), a(), 3, a())
    assert path.tolist() == [] and new.tolist() == [3]


def test_accept_walk_docstring_example():
    """The first accepted child is taken at every node; the last node's chosen token ends the step."""
    accept = np.array([True, False, True, True])
    path, new = accept_walk(a(4, 5, 6, 7), a(-1, 0, 1, 0), accept, a(9, 8, 1, 3, 2))
    assert path.tolist() == [0, 3] and new.tolist() == [4, 7, 2]
    path, new = accept_walk(a(4, 5), a(-1, -1), np.array([False, False]), a(6, 0, 0))
    assert path.tolist() == [] and new.tolist() == [6]  # nothing accepted: x's token alone


def test_chosen_walk_docstring_example():
    path, new = chosen_walk(a(4, 5, 6, 7), a(-1, 0, 1, 0), a(4, 7, 1, 3, 2))
    assert path.tolist() == [0, 3] and new.tolist() == [4, 7, 2]
    path, new = chosen_walk(a(), a(), a(3))
    assert path.tolist() == [] and new.tolist() == [3]  # no tree: x's row alone


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_chosen_walk_is_accept_walk_over_the_verifiers_rule(data):
    """Random trees and chosen rows: the fused walk is accept_walk over accepted_children's array."""
    size = data.draw(st.integers(0, 12))
    parents = np.array([data.draw(st.integers(-1, i - 1)) for i in range(size)], dtype=np.int64)
    tokens = np.array(data.draw(st.lists(st.integers(0, 3), min_size=size, max_size=size)), dtype=np.int64)
    chosen = np.array(data.draw(st.lists(st.integers(0, 3), min_size=size + 1, max_size=size + 1)), dtype=np.int64)
    path, new = chosen_walk(tokens, parents, chosen)
    want_path, want_new = accept_walk(tokens, parents, tokens == chosen[parents + 1], chosen)
    assert path.tolist() == want_path.tolist() and new.tolist() == want_new.tolist()


WARMUP_SCRIPT = """
import importlib, pkgutil, sys
import numpy as np, torch
sys.path.insert(0, sys.argv[1])
from conftest import tiny_model
import lookahead.kernels as kernels
from lookahead import LookaheadConfig, LookaheadGenerator


def signatures():
    found = {}
    for info in pkgutil.iter_modules(kernels.__path__):
        module = importlib.import_module("lookahead.kernels." + info.name)
        for name, value in vars(module).items():
            if hasattr(value, "signatures") and hasattr(value, "py_func"):
                found[info.name + "." + name] = len(value.signatures)
    return found


gen = LookaheadGenerator(tiny_model("llama"), config=LookaheadConfig(budget="fixed"))  # runs warmup()
before = signatures()
ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 9, 10]])
for _ in range(2):  # the second request reads what the first left in the memory
    gen.generate(ids, max_new_tokens=24)
after = signatures()
grown = sorted(name for name in after if after[name] != before.get(name))
assert gen.memory.store.requests == 2, gen.memory.store.requests
print("compiled during generation:", grown)
sys.exit(1 if grown else 0)
"""


def test_warmup_compiles_every_kernel_a_generation_calls():
    """In a fresh interpreter (numba's caches loaded, nothing compiled yet in the process), two
    generations with memory add no signature to any kernel past what the generator's warm-up
    compiled: no first request pays a compile inside its time (or the memory's host time)."""
    tests = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, "-c", WARMUP_SCRIPT, tests], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]


def test_top_entries_docstring_example():
    from lookahead.kernels.topk import top_entries

    out = top_entries(np.array([[0.0, 3.0, 1.0, 3.0]], dtype=np.float32), 2, np.array([0.25, 0.5]))
    assert out.tolist() == [[1, 3, 2, 2]]  # the earlier of two equal columns first; 0.5 each: both edges


def test_top_entries_finds_the_top_across_blocks_and_a_short_last_block():
    from lookahead.kernels.topk import BLOCK, top_entries

    row = np.zeros(3 * BLOCK + 5, dtype=np.float32)  # three whole blocks and a short one
    row[[7, BLOCK + 1, BLOCK + 2, 3 * BLOCK + 4]] = [5.0, 9.0, 7.0, 8.0]  # two of the best in one block
    out = top_entries(np.stack([row, -row]), 3, np.array([0.9]))
    assert out[0, :3].tolist() == [BLOCK + 1, 3 * BLOCK + 4, BLOCK + 2]
    assert out[0, 3:].tolist() == [0, 0, 0]  # e^9 / (e^9 + e^8 + e^7) = 0.67: under 0.9
    assert out[1, :3].tolist() == [0, 1, 2]  # every other column ties at 0: the earliest
    assert out[1, 3:].tolist() == [0, 0, 0]


def test_top_entries_matches_torch_topk_on_random_rows_and_survives_nan():
    import torch

    from lookahead.kernels.topk import top_entries

    rng = np.random.default_rng(0)
    scores = rng.standard_normal((6, 1000)).astype(np.float32)  # no two equal: one right answer
    out = top_entries(scores, 8, np.array([0.5]))
    assert (out[:, :8] == torch.from_numpy(scores).topk(8, dim=-1).indices.numpy()).all()
    assert top_entries(scores, 5000, np.array([0.5])).shape == (6, 2000)  # R at most the row's length
    scores[0, :200] = np.nan  # a failed row: still valid columns, every number found
    row = top_entries(scores[:1], 4, np.array([0.5]))[0, :4]
    assert ((row >= 0) & (row < 1000)).all() and len(set(row.tolist())) == 4


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_top_entries_rows_shared_among_threads_are_top_entries(dtype):
    from lookahead.kernels.topk import top_entries, top_entries_rows

    rng = np.random.default_rng(1)
    scores = rng.standard_normal((9, 3000)).astype(dtype)
    scores[2] = 0.0  # every column ties: the earliest first
    scores[4, :700] = np.nan  # a failed row
    scores[5, rng.integers(0, 3000, 50)] = 4.0  # many equal best columns
    edges = np.array([0.25, 0.5, 0.75, 0.9])
    for width in (1, 8, 5000):
        assert np.array_equal(top_entries_rows(scores, width, edges), top_entries(scores, width, edges))
    assert top_entries_rows(scores[:0], 8, edges).shape == (0, 16)
    assert top_entries_rows(np.array([[0.0, 3.0, 1.0, 3.0]], dtype=dtype), 2, np.array([0.25, 0.5])).tolist() == \
        [[1, 3, 2, 2]]  # the docstring's example


def test_refine_curve_worked_example():
    from lookahead.kernels.curve import refine_curve

    seen, mean, seconds = np.zeros(2), np.zeros(2), np.zeros(2)
    level = refine_curve(np.array([1.0, 4.0]), np.array([1.0, 2.0]), seen, mean, seconds, 1.0, 2.0, 0.1, 1.0, 1, 8.0)
    assert seen.tolist() == [1.0, 0.0] and np.allclose(mean, [np.log(2), 0.0])
    assert np.isclose(level, np.log(2) * (1 - np.exp(-1)))
    assert np.allclose(seconds, [1.76, 3.10], atol=0.01)
    # a step between the points splits its weight; one far off the curve counts as ratio_limit at most
    refine_curve(np.array([1.0, 4.0]), np.array([1.0, 2.0]), seen, mean, seconds, 2.5, 1e6, 0.1, 1.0, 2, 8.0)
    assert np.allclose(seen, [1.5, 0.5]) and np.isclose(mean[1], np.log(8.0))


def test_refine_curve_never_prices_an_unshown_point_above_a_larger_shown_one():
    from lookahead.kernels.curve import refine_curve

    rows, start = np.array([1.0, 2.0, 3.0]), np.array([5.0, 2.0, 3.0])
    seen, mean, seconds = np.array([0.0, 9.0, 0.0]), np.zeros(3), np.zeros(3)
    refine_curve(rows, start, seen, mean, seconds, 2.0, 2.0, 0.1, 4.0, 9, 8.0)  # (one more step at 2 rows, on the curve)
    assert np.allclose(seconds, [2.0, 2.0, 3.0])  # 1 row: 5 lowered to 2; 3 rows above 2 stays
    seen[0] = 4.0  # once steps have shown the one-row point it keeps its own price, dip or not
    refine_curve(rows, start, seen, mean, seconds, 2.0, 2.0, 0.1, 4.0, 10, 8.0)
    assert seconds[0] > 4.9


def test_table_learn_worked_example_and_last_row_wins():
    from lookahead.kernels.recycle import pair_slot, table_learn

    successors, confidence = np.full((8, 2), -1, dtype=np.int64), np.zeros((8, 2), dtype=np.int64)
    keys, pairs, pair_conf = np.full((5, 2), -1, dtype=np.int64), np.full((5, 2), -1, dtype=np.int64), \
        np.zeros((5, 2), dtype=np.int64)
    i64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
    table_learn(i64(5), i64(-1), i64([7, 8]).reshape(1, 2), i64([9, 0]).reshape(1, 2), 0, 3, successors, confidence,
                keys, pairs, pair_conf)
    assert successors[5].tolist() == [7, 8] and confidence[5].tolist() == [2, 0] and (keys == -1).all()
    # a token twice: the later row wins; a known predecessor fills the pair's slot; a token past V is skipped
    table_learn(i64(3, 3, 99), i64(-1, 4, 2), i64([1, 2], [6, 7], [5, 5]), i64([1, 1], [0, 2], [0, 0]), 0, 3,
                successors, confidence, keys, pairs, pair_conf)
    assert successors[3].tolist() == [6, 7] and confidence[3].tolist() == [0, 2]
    s = pair_slot(4, 3, 5)
    assert keys[s].tolist() == [4, 3] and pairs[s].tolist() == [6, 7] and pair_conf[s].tolist() == [0, 2]
    # the staged layout [K, 2R]: top in the first R columns, the buckets in the next R (bucket_column R)
    staged = i64([4, 1, 2, 0])
    table_learn(i64(6), i64(-1), staged.reshape(1, 4), staged.reshape(1, 4), 2, 3, successors, confidence, keys, pairs,
                pair_conf)
    assert successors[6].tolist() == [4, 1] and confidence[6].tolist() == [2, 0]


def test_previous_tokens_worked_example_and_window_rows():
    from lookahead.kernels.recycle import previous_tokens

    i64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
    assert previous_tokens(i64(0), 0, i64(9, 4, 6), i64(-1, 0), i64(4, 6), 9, 2).tolist() == [2, 9, 4]
    # width 2, N 3: step rows [x | level 0: 11 12 | level 1: 21 22]; kept x, 21, 22 follow before-x, 11, 12
    step = i64(9, 11, 12, 21, 22, 30)
    assert previous_tokens(i64(0, 3, 4), 2, step, i64(-1), i64(30), 9, 5).tolist() == [5, 11, 12, 9]


def test_forecast_options_worked_example_and_curve_seconds():
    from lookahead.kernels.budget import curve_seconds, forecast_options

    rows, seconds = np.array([1.0, 4.0]), np.array([2.0, 3.0])
    assert [round(curve_seconds(rows, seconds, 1e-9, q), 2) for q in (2.0, 7.0, 0.0)] == [2.33, 4.0, 2.0]
    grid = np.array([1.0, 2.0, 3.0, 4.0])
    out = forecast_options(np.array([[0.9, 0.1]]), np.array([2]), np.array([1, 3]), np.array([0.0, 0.5]), grid,
                           1.0 + 0.1 * (grid - 1), 1e-9, 8, 0.0, np.zeros(0), np.zeros(0), 1e-9, 1.0, 1.0)
    assert out[:2] == (1, 1) and np.isclose(out[2], 1.9) and np.isclose(out[3], 1.3)


def test_forecast_options_share_keeps_every_sequence_near_its_plain_rate():
    """Two sequences, one with three likely nodes and one with none, a step of 1 + 0.2 s a row past the
    first: the batch's best is k = 3 ((3.7 + 1) / 1.6), where the empty one gets 1 token in 1.6 s,
    0.625 of its plain rate; share 0.7 stops at k = 2 (1 / 1.4 = 0.71), share 1 keeps the plain step."""
    from lookahead.kernels.budget import forecast_options

    grid = np.array([1.0, 2.0])

    def choose(share):
        out = forecast_options(np.array([[0.9, 0.9, 0.9], [0.0, 0.0, 0.0]]), np.array([3, 0]), np.array([1]),
                               np.zeros(1), grid, 1.0 + 0.2 * (grid - 1), 1e-9, 8, 0.0, np.zeros(0), np.zeros(0),
                               1e-9, 1.0, 1.0, share)
        return out[:2]

    assert choose(0.0) == (0, 3) and choose(0.5) == (0, 3)
    assert choose(0.7) == (0, 2) and choose(1.0) == (0, 0)


def _count_in_numpy(classes, depths, parents, path, trials, hits, weight, horizon):
    """AcceptanceStats.update as numpy wrote it before its kernel: the reference."""
    accepted = np.zeros(classes.shape[0], dtype=bool)
    accepted[path] = True
    reached = (parents < 0) | accepted[np.maximum(parents, 0)]
    col = np.minimum(depths - 1, trials.shape[1] - 1)
    cells = (classes[reached], col[reached])
    np.add.at(trials, cells, 1.0)
    np.add.at(hits, (classes[accepted], col[accepted]), 1.0)
    full = trials[cells] + weight[cells] > horizon
    if full.any():
        halve = (cells[0][full], cells[1][full])
        for counts in (trials, hits, weight):
            counts[halve] *= 0.5


def test_count_tree_worked_example_and_numpy_on_random_trees():
    from lookahead.kernels.estimates import count_tree

    i64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
    trials, hits, weight = np.zeros((2, 3)), np.zeros((2, 3)), np.ones((2, 3))
    count_tree(i64(0, 1), i64(1, 2), i64(-1, 0), i64(0), trials, hits, weight, 100.0)
    assert trials[0, 0] == trials[1, 1] == 1.0 and hits.sum() == hits[0, 0] == 1.0 and trials.sum() == 2.0
    rng = np.random.default_rng(7)
    for _ in range(300):
        size = int(rng.integers(1, 30))
        parents = np.array([-1] + [int(rng.integers(-1, m)) for m in range(1, size)], dtype=np.int64)
        depths = np.ones(size, dtype=np.int64)
        for m in range(1, size):
            depths[m] = depths[parents[m]] + 1 if parents[m] >= 0 else 1
        path, node = [], -1  # a chain of accepted nodes from x down
        while True:
            children = [m for m in range(size) if parents[m] == node]
            if not children or rng.random() < 0.3:
                break
            node = int(rng.choice(children))
            path.append(node)
        classes = rng.integers(0, 3, size).astype(np.int64)
        tables = [rng.uniform(0, 6, (3, 4)) for _ in range(3)]
        ours = [t.copy() for t in tables]
        count_tree(classes, depths, parents, np.array(path, dtype=np.int64), *ours, 9.0)
        _count_in_numpy(classes, depths, parents, np.array(path, dtype=np.int64), *tables, 9.0)
        assert all(np.allclose(a, b) for a, b in zip(ours, tables))


def test_layout_mask_and_subtree_arrays_worked_examples():
    from lookahead.kernels.trie import layout_mask, subtree_arrays

    i64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
    assert layout_mask(np.ones((1, 1), dtype=np.bool_), i64(-1, 0)).astype(int).tolist() == \
        [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    window = np.array([[1, 0], [1, 1]], dtype=np.bool_)  # x and one window row
    assert layout_mask(window, i64(-1)).astype(int).tolist() == [[1, 0, 0], [1, 1, 0], [1, 0, 1]]
    tokens, parents, depths, classes, closed = subtree_arrays(i64(4, 5, 6, 7), i64(-1, 0, 0, 1), i64(1, 2, 2, 3),
                                                              i64(0, 1, 2, 3), i64(3, 0, 1))
    assert closed and parents.tolist() == [-1, 0, 1] and tokens.tolist() == [4, 5, 7] and classes.tolist() == [0, 1, 3]
    assert not subtree_arrays(i64(4, 5), i64(-1, 0), i64(1, 2), i64(0, 0), i64(1))[4]  # its parent left out


def test_a_warm_cache_starts_no_process_and_a_cold_one_compiles_in_several(monkeypatch):
    """The suite's warm-up filled numba's cache: warmup(workers=2) loads it and starts nothing. A cache that
    lacks one kernel sends the groups to fresh interpreters, no more at once than asked, each group once;
    where no interpreter starts, this process compiles them itself."""
    import lookahead.kernels as kernels

    assert kernels.cached()
    started = []
    monkeypatch.setattr(kernels.subprocess, "Popen", lambda *a, **k: started.append(a) or pytest.fail("started"))
    kernels.warmup(workers=2)
    assert started == []

    monkeypatch.setattr(kernels.ENTRY_KERNELS[3]._cache._cache_file, "_load_index", lambda: {})
    assert not kernels.cached()
    live, most, codes = [], [0], []

    class Fake:
        """A process that ends on its second poll."""

        def __init__(self, command, **kwargs):
            self.polls = 0
            codes.append(command[-1])
            live.append(self)
            most[0] = max(most[0], len(live))

        def poll(self):
            self.polls += 1
            if self.polls < 2:
                return None
            live.remove(self)
            return 0

    monkeypatch.setattr(kernels.subprocess, "Popen", Fake)
    monkeypatch.setattr(kernels.time, "sleep", lambda seconds: None)
    kernels.warmup(workers=2)
    assert sorted(codes) == [f"from lookahead.kernels import warm_group; warm_group({i})"
                             for i in range(len(kernels.WARM_GROUPS))] and most[0] == 2 and not live

    def no_interpreter(*args, **kwargs):
        raise FileNotFoundError("no python here")

    monkeypatch.setattr(kernels.subprocess, "Popen", no_interpreter)
    kernels.warmup(workers=2)  # compiles (loads) here instead
