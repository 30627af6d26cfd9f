"""Numba kernels (pure @njit functions) and their one-time warm-up."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

from .budget import forecast_options
from .curve import refine_curve
from .estimates import ESTIMATE_CEILING, ESTIMATE_FLOOR, backoff_estimates, count_tree
from .linear import WIDE_ROWS, rows_linear
from .match import match_continuations
from .pool import new_pool, pool_insert_grams, pool_insert_sequence, pool_lookup
from .recycle import grow_recycled_tree, pair_learn, previous_tokens, recycled_paths, table_learn, tree_paths
from .suffix import ORDERS, PROB_EDGES, new_store, store_append, store_lookup, store_separate
from .topk import top_entries, top_entries_rows
from .trie import (
    best_first_order,
    build_scored_trie,
    layout_mask,
    path_tokens,
    ranked_nodes,
    step_arrays,
    subtree_arrays,
    trie_extend,
    trie_probs,
)
from .walk import accept_walk, chosen_walk

SEQ = np.array([1, 2, 3, 1, 2], dtype=np.int64)


def _warm_planning() -> None:
    """The estimates, the budget's forecast and the cost curve."""
    backoff_estimates(np.full(1, 0.5), np.zeros((1, 2)), np.zeros((1, 2)), np.ones((1, 2)), ESTIMATE_FLOOR,
                      ESTIMATE_CEILING)
    count_tree(np.zeros(2, dtype=np.int64), np.ones(2, dtype=np.int64), np.array([-1, 0], dtype=np.int64),
               np.zeros(1, dtype=np.int64), np.zeros((1, 2)), np.zeros((1, 2)), np.ones((1, 2)), 8.0)
    forecast_options(np.full((1, 2), 0.5), np.array([2], dtype=np.int64), np.array([1, 3], dtype=np.int64),
                     np.zeros(2), np.array([1.0, 4.0]), np.ones(2), 1e-9, 2, 0.0, np.zeros(1), np.ones(1), 1e-9, 1.0,
                     1.0, 0.0)
    refine_curve(np.array([1.0, 4.0]), np.ones(2), np.zeros(2), np.zeros(2), np.ones(2), 2.0, 1.0, 0.1, 8.0, 1, 100.0)


def _warm_sources() -> None:
    """The context match, the n-gram pool and the memory store."""
    match_continuations(SEQ, 5, 1, 2, 2, 2)
    pool = new_pool(8, 4, 2, 2)
    pool_insert_sequence(SEQ, 0, 5, *pool)
    pool_insert_grams(np.array([[1, 2, 3]], dtype=np.int64), *pool)
    pool_lookup(1, 2, pool[0], pool[2], pool[3])
    ring, heads, chain, state = new_store(16)
    store_append(SEQ, ring, heads, chain, state, ORDERS)
    store_separate(ring, state)
    store_lookup(SEQ, 2, ring, heads, chain, state, ORDERS, 2, 2, PROB_EDGES)


def _scored_trie() -> tuple[np.ndarray, ...]:
    cands = np.array([[1, 2]], dtype=np.int64)
    return build_scored_trie(cands, np.array([2], dtype=np.int64), np.zeros((1, 2), dtype=np.int64), np.ones((1, 1)),
                             4)


def _warm_trees() -> None:
    """The trie, its layout and mask, and verification's walk."""
    tokens, parents, depths, _, prob = _scored_trie()
    nodes, cond = np.empty((4, 2), dtype=np.int64), np.empty(2)  # the trie merged a source at a time (core/tree.py)
    trie_probs(nodes[1], cond, trie_extend(nodes, cond, 0, tokens[None], np.ones(1, dtype=np.int64),
                                           np.zeros((1, 2), dtype=np.int64), 0, np.ones((1, 1)), 2))
    best_first_order(parents, prob)
    ranked_nodes(parents, prob, depths, 2)
    shared = np.ones((1, 1), dtype=np.bool_)
    layout_mask(shared, parents)
    shared.flags.writeable = False  # the window's masks are cached read-only (plan/window.py)
    layout_mask(shared, parents)
    none, zero = np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)
    none.flags.writeable = zero.flags.writeable = False  # (the window's offsets, kept rows and, for x alone,
    # rows are cached read-only too: plan/window.py, decode/sequence.py)
    step_arrays(zero, shared, none, 1, zero, tokens, parents, depths)  # x alone
    step_arrays(zero, shared, np.ones(1, dtype=np.int64), 1, zero, tokens, parents, depths)  # a window's rows
    subtree_arrays(tokens, parents, depths, np.zeros_like(tokens), np.zeros(1, dtype=np.int64))
    path_tokens(tokens, parents, depths)
    accept_walk(tokens, parents, np.ones(2, dtype=np.bool_), np.array([2, 3, 4], dtype=np.int64))
    chosen_walk(tokens, parents, np.array([2, 3, 4], dtype=np.int64))


def _warm_topk() -> None:
    """The top-k of the logits, over float32 and float64 rows."""
    for scores in (np.zeros((1, 3), dtype=np.float32), np.zeros((1, 3))):
        top_entries(scores, 2, np.array([0.5]))
        top_entries_rows(scores, 2, np.array([0.5]))


def _warm_recycle() -> None:
    """The recycled successors' tables and trees."""
    adj = np.array([[1, -1], [0, -1]], dtype=np.int64)
    keys, pair_adj = np.full((3, 2), -1, dtype=np.int64), np.full((3, 2), -1, dtype=np.int64)
    pair_learn(np.array([1], dtype=np.int64), np.array([0], dtype=np.int64), adj[:1], np.zeros_like(adj[:1]),
               keys, pair_adj, np.zeros_like(pair_adj))
    grown = grow_recycled_tree(adj, np.zeros_like(adj), keys, pair_adj, np.zeros_like(pair_adj), 1, 1, 0,
                               np.full((4, 2), 0.5), 3)
    tree_paths(*grown)
    recycled_paths(adj, np.zeros_like(adj), keys, pair_adj, np.zeros_like(pair_adj), 1, 1, 0, np.full((4, 2), 0.5), 3)
    previous_tokens(np.array([0, 2], dtype=np.int64), 2, SEQ, np.array([-1, 0], dtype=np.int64), SEQ[:2], 1, -1)
    table_learn(np.array([1, 5], dtype=np.int64), np.array([0, -1], dtype=np.int64), adj, np.zeros_like(adj), 0, 3,
                np.full((4, 2), -1, dtype=np.int64), np.zeros((4, 2), dtype=np.int64), keys, pair_adj,
                np.zeros_like(pair_adj))


def _warm_linear() -> None:
    """Both few-row linear kernels behind rows_linear."""
    for rows in (1, WIDE_ROWS):
        rows_linear(np.ones((2, 2), dtype=np.float32), np.ones((rows, 2), dtype=np.float32))


# Each group a share of the compile, the longest first, so that workers taking the next group as one ends
# finish together (a group's cold compile, one at a time: `NUMBA_CACHE_DIR=$(mktemp -d) python -c
# "from lookahead.kernels import warm_group; warm_group(I)"` under `time`).
WARM_GROUPS: tuple[Callable[[], None], ...] = (_warm_trees, _warm_sources, _warm_planning, _warm_recycle,
                                               _warm_linear, _warm_topk)
ENTRY_KERNELS = (backoff_estimates, count_tree, forecast_options, refine_curve, match_continuations,
                 pool_insert_sequence, pool_insert_grams, pool_lookup, store_append, store_separate, store_lookup,
                 build_scored_trie, best_first_order, ranked_nodes, step_arrays, layout_mask, subtree_arrays,
                 path_tokens, accept_walk, chosen_walk, top_entries, top_entries_rows, pair_learn, grow_recycled_tree,
                 tree_paths, previous_tokens, table_learn, recycled_paths)


def cached() -> bool:
    """Whether numba's on-disk cache holds a current entry for every kernel the warm-up calls (False where
    that cannot be told: numba's cache files are its own business)."""
    try:
        return all(bool(kernel._cache._cache_file._load_index()) for kernel in ENTRY_KERNELS)  # noqa: SLF001
    except Exception:  # noqa: BLE001 (another numba's internals: assume a cold cache, which only costs processes)
        return False


def warm_group(index: int) -> None:
    """Compile WARM_GROUPS[index] (what each of ``warmup``'s processes runs)."""
    WARM_GROUPS[index]()


def warmup(workers: int = 1) -> None:
    """Compile (or load from numba's on-disk cache) every kernel on tiny arrays.

    ``workers`` > 1 and a cache without every kernel (a fresh install): the groups first compile in up to
    that many fresh interpreters at once (numba writes each kernel's cache files atomically), then this
    process loads what they cached. Where they fail, this process compiles as with one worker.
    """
    if workers > 1 and not cached():
        _compile_in_processes(workers)
    for group in WARM_GROUPS:
        group()


def _compile_in_processes(workers: int) -> None:
    """Run the warm-up groups in ``workers`` fresh interpreters (``python -c``: nothing of the caller's
    main module runs there), each taking the next group as one ends."""
    pending = list(range(len(WARM_GROUPS)))
    running: list[subprocess.Popen] = []
    try:
        while pending or running:
            while pending and len(running) < workers:
                code = f"from lookahead.kernels import warm_group; warm_group({pending.pop(0)})"
                running.append(subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                                                stderr=subprocess.DEVNULL))
            time.sleep(0.05)
            running = [p for p in running if p.poll() is None]
    except OSError:
        pass  # no interpreter to start: this process compiles them
    finally:
        for process in running:
            process.kill()
