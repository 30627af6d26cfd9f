"""Best-first trees, token recycling, acceptance estimates and the step budget, on tiny
hand-written arrays (the cost model itself: tests/test_costmodel.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lookahead.config import LookaheadConfig
from lookahead.cost import CostModel
from lookahead.kernels.estimates import backoff_estimates
from lookahead.kernels.recycle import grow_recycled_tree, pair_learn, pair_slot, recycled_paths, tree_paths
from lookahead.kernels.trie import best_first_order, build_scored_trie, ranked_nodes
from lookahead.proposers.base import Proposer
from lookahead.proposers.context import ContextMatcher
from lookahead.proposers.ngram import NgramPool, NgramProposer
from lookahead.proposers.recycle import BUCKETS, AdjacencyTable, RecyclingProposer, rank_priors, top_successors
from lookahead.plan.acceptance import GAIN_LEVELS, GAIN_RANGE, AcceptanceStats, GainCalibration
from lookahead.plan.budget import forecast_step
from lookahead.core.tree import TokenTree, scored_tree, subtree

from conftest import make_planner, plan_step


def choose_tree_size(probs, base_rows, cost, cap, calibration=None):
    """Tree nodes of a single sequence's step with one window option of base_rows rows."""
    return forecast_step([probs], np.array([base_rows]), np.zeros(1), cost, cap, 0.0, calibration)[1]


def choose_batch_width(probs, base_rows, cost, cap):
    """Tree nodes every row of a batch verifies, one window option of base_rows rows."""
    return forecast_step(probs, np.array([base_rows]), np.zeros(1), cost, cap)[1]


def a(*values):
    return np.array(values, dtype=np.int64)


# ------------------------------------------------------------ scored trie
def test_scored_trie_docstring_example():
    tokens, parents, depths, cls, prob = build_scored_trie(
        np.array([[4, 5, 6], [4, 7, 0]]), a(3, 2), np.array([[0, 0, 0], [1, 1, 0]]),
        np.array([[.9, .5, .5], [.8, .6, .6]]), 10)
    assert tokens.tolist() == [4, 5, 6, 7] and parents.tolist() == [-1, 0, 1, 0] and depths.tolist() == [1, 2, 3, 2]
    assert cls.tolist() == [0, 0, 0, 1]
    assert np.allclose(prob, [.98, .49, .245, .588])  # 4 is proposed by both classes: 1 - .1 * .2
    assert best_first_order(parents, prob).tolist() == [0, 3, 1, 2]


def test_a_node_two_classes_propose_takes_the_best_class_and_both_chances():
    # both rows start with 4: row 1's class scores it higher, so the node takes class 1, and its
    # chance is that either holds: 1 - .8 * .3
    _, _, _, cls, prob = build_scored_trie(np.array([[4, 5], [4, 6]]), a(2, 2), np.array([[0, 0], [1, 1]]),
                                           np.array([[.2, .5], [.7, .5]]), 10)
    assert cls.tolist() == [1, 0, 1] and np.allclose(prob, [.76, .38, .38])


def test_one_class_proposing_a_node_twice_counts_once():
    _, _, _, cls, prob = build_scored_trie(np.array([[4, 5], [4, 6]]), a(2, 2), np.array([[1, 1], [1, 1]]),
                                           np.array([[.2, .5], [.7, .5]]), 10)
    assert cls.tolist() == [1, 1, 1] and np.allclose(prob, [.7, .35, .35])


def test_depths_beyond_the_table_use_its_last_column():
    _, _, depths, _, prob = build_scored_trie(np.array([[1, 2, 3]]), a(3), np.zeros((1, 3), dtype=np.int64),
                                              np.array([[.5, .4]]), 10)
    assert depths.tolist() == [1, 2, 3] and np.allclose(prob, [.5, .2, .08])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=5), min_size=1, max_size=8), st.data())
def test_every_prefix_of_the_best_first_order_is_a_tree(rows, data):
    """Property: whatever the estimates, any prefix is closed under parents and sorted by probability."""
    width = max(map(len, rows))
    cands = np.array([r + [0] * (width - len(r)) for r in rows])
    classes = np.array([[data.draw(st.integers(0, 2)) for _ in range(width)] for _ in rows])
    est = np.array([[data.draw(st.floats(0.01, 0.99)) for _ in range(3)] for _ in range(3)])
    tokens, parents, depths, cls, prob = build_scored_trie(cands, a(*map(len, rows)), classes, est, 100)
    order = best_first_order(parents, prob)
    assert sorted(order.tolist()) == list(range(tokens.shape[0]))
    for k in range(order.shape[0] + 1):
        tree = subtree(TokenTree(tokens, parents, depths, cls), order[:k])  # raises if not closed
        assert tree.size == k
        if k < order.shape[0]:  # the next node is the most probable one whose parent is already in
            taken = set(order[:k].tolist())
            ready = [n for n in range(tokens.shape[0]) if n not in taken and (parents[n] < 0 or parents[n] in taken)]
            assert prob[order[k]] == max(prob[ready])



def test_ranked_nodes_docstring_example():
    parents, prob, depths = a(-1, 0, 0, -1), np.array([.9, .3, .5, .6]), a(1, 2, 2, 1)
    order, probs = ranked_nodes(parents, prob, depths, 3)
    assert order.tolist() == [0, 3, 2, 1] and np.allclose(probs, [.9, .6, .5, .3])
    order, probs = ranked_nodes(parents, prob, depths, 2)
    assert order.tolist() == [0, 3] and np.allclose(probs, [.9, .6])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=5), min_size=1, max_size=8), st.integers(1, 6),
       st.data())
def test_ranked_nodes_is_the_best_first_order_cut_by_depth(rows, deepest, data):
    """Property: the nodes shallower than ``deepest`` in best-first order, their probabilities, a tree."""
    width = max(map(len, rows))
    cands = np.array([r + [0] * (width - len(r)) for r in rows])
    est = np.array([[data.draw(st.floats(0.01, 0.99)) for _ in range(3)]])
    tokens, parents, depths, cls, prob = build_scored_trie(cands, a(*map(len, rows)), np.zeros_like(cands), est, 100)
    order, probs = ranked_nodes(parents, prob, depths, deepest)
    full = best_first_order(parents, prob)
    assert order.tolist() == [n for n in full.tolist() if depths[n] < deepest]
    assert np.array_equal(probs, prob[order])
    assert subtree(TokenTree(tokens, parents, depths, cls), order).size == order.shape[0]  # closed under parents

def test_subtree_renumbers_and_refuses_orphans():
    tree = TokenTree(a(4, 5, 6, 7), a(-1, 0, 1, 0), a(1, 2, 3, 2), a(0, 0, 0, 1))
    kept = subtree(tree, a(3, 0))
    assert kept.tokens.tolist() == [4, 7] and kept.parents.tolist() == [-1, 0] and kept.classes.tolist() == [0, 1]
    with pytest.raises(ValueError, match="closed under parents"):
        subtree(tree, a(1))


def test_scored_tree_of_nothing_is_empty():
    tree, prob = scored_tree(np.zeros((0, 2), dtype=np.int64), a(), np.zeros((0, 2), dtype=np.int64),
                             np.ones((1, 1)), 8)
    assert tree.size == 0 and prob.shape == (0,)


# --------------------------------------------------------- token recycling
def recycling_example():
    adj = np.full((6, 2), -1, dtype=np.int64)
    adj[1], adj[2] = [2, 3], [4, 5]
    return adj, np.zeros_like(adj), np.array([[.8, .5], [.3, .2], [.9, .9], [.1, .1]])


def no_pairs(width: int = 2, slots: int = 0):
    """An empty pair table: keys [S, 2], successors [S, R], confidence [S, R]."""
    return (np.full((slots, 2), -1, dtype=np.int64), np.full((slots, width), -1, dtype=np.int64),
            np.zeros((slots, width), dtype=np.int64))


def grow(adj, conf, buckets, x, est, max_nodes, pairs=None, before=-1):
    return grow_recycled_tree(adj, conf, *(pairs or no_pairs(adj.shape[1])), buckets, before, x, est, max_nodes)


def test_recycled_tree_docstring_example():
    adj, conf, est = recycling_example()
    tokens, parents, depths, classes = grow(adj, conf, 1, 1, est, 3)
    assert tokens.tolist() == [2, 4, 3] and parents.tolist() == [-1, 0, -1]
    assert depths.tolist() == [1, 2, 1] and classes.tolist() == [0, 0, 1]
    cands, lens, labels = tree_paths(tokens, parents, depths, classes)
    assert cands.tolist() == [[2, 4], [3, 0]] and lens.tolist() == [2, 1] and labels.tolist() == [[0, 0], [1, 0]]



def test_recycled_paths_are_the_grown_trees_paths_in_one_call():
    adj, conf, est = recycling_example()
    cands, lens, labels = recycled_paths(adj, conf, *no_pairs(adj.shape[1]), 1, -1, 1, est, 3)
    assert cands.tolist() == [[2, 4], [3, 0]] and lens.tolist() == [2, 1] and labels.tolist() == [[0, 0], [1, 0]]
    unknown = np.full_like(adj, -1)  # no successor of x known: no rows
    assert recycled_paths(unknown, conf, *no_pairs(adj.shape[1]), 1, -1, 1, est, 3)[1].shape == (0,)

def test_recycled_tree_scores_by_rank_and_confidence_bucket():
    adj, conf, _ = recycling_example()
    conf[1] = [0, 1]  # token 1: its rank-0 successor 2 was unsure (bucket 0), rank-1 successor 3 sure (bucket 1)
    est = np.array([[.2, .2], [.9, .9], [.1, .1], [.7, .7]])  # class r * 2 + b, by depth
    tokens, parents, depths, classes = grow(adj, conf, 2, 1, est, 1)
    assert tokens.tolist() == [3] and classes.tolist() == [3]  # the sure rank 1 (.7) before the unsure rank 0 (.2)
    tokens, parents, depths, classes = grow(adj, conf, 2, 1, est, 2)
    assert tokens.tolist() == [3, 2] and classes.tolist() == [3, 0]  # then rank 0 (3 has no successors)


def test_recycled_tree_docstring_pair_example():
    adj, conf, est = recycling_example()
    pairs = no_pairs(slots=11)
    top = np.array([[5, -1]], dtype=np.int64)
    pair_learn(a(1), a(2), top, np.zeros_like(top), *pairs)  # after 1 2 the model ranked 5 first
    assert pair_slot(3, 7, 11) == 8 and pairs[0][pair_slot(1, 2, 11)].tolist() == [1, 2]
    tokens, parents, depths, classes = grow(adj, conf, 1, 1, est, 3, pairs)
    assert tokens.tolist() == [2, 5, 4] and parents.tolist() == [-1, 0, 0] and classes.tolist() == [0, 2, 0]
    tokens, parents, depths, classes = grow(adj, conf, 1, 1, est, 5, pairs)  # 5 is not offered twice
    assert tokens.tolist() == [2, 5, 4, 3] and classes.tolist() == [0, 2, 0, 1]


def test_recycled_tree_uses_x_predecessor_for_the_first_pair():
    adj, conf, est = recycling_example()
    pairs = no_pairs(slots=11)
    top = np.array([[4, -1]], dtype=np.int64)
    pair_learn(a(0), a(1), top, np.zeros_like(top), *pairs)  # after 0 1: 4
    assert grow(adj, conf, 1, 1, est, 1, pairs, before=0)[0].tolist() == [4]  # pair rank 0 (.9) beats .8
    assert grow(adj, conf, 1, 1, est, 1, pairs, before=3)[0].tolist() == [2]  # another predecessor: no pair


def test_pair_table_newest_pair_wins_its_slot_and_lookup_checks_the_key():
    keys, succ, conf = no_pairs(slots=3)
    top = np.array([[7, 8], [9, 6]], dtype=np.int64)
    pair_learn(a(1, 3), a(2, 2), top, np.ones_like(top), keys, succ, conf)
    slot_a, slot_b = pair_slot(1, 2, 3), pair_slot(3, 2, 3)  # 0 and 2
    assert slot_a != slot_b and keys[slot_b].tolist() == [3, 2] and succ[slot_b].tolist() == [9, 6]
    pair_learn(a(-1), a(5), top[:1], top[:1], keys, succ, conf)  # unknown predecessor: nothing stored
    assert keys[slot_a].tolist() == [1, 2]
    adj = np.full((10, 2), -1, dtype=np.int64)
    est = np.full((4, 2), 0.5)
    assert pair_slot(4, 2, 3) == slot_a  # x = 2 after 4 lands on (1, 2)'s slot: the key differs, nothing offered
    assert grow(adj, np.zeros_like(adj), 1, 2, est, 3, (keys, succ, conf), before=4)[0].shape == (0,)


def test_recycled_tree_stops_when_nothing_is_known():
    adj, conf, est = recycling_example()
    assert grow(adj, conf, 1, 5, est, 4)[0].shape == (0,)  # token 5 was never seen
    assert grow(adj, conf, 1, 1, est, 10)[0].shape == (4,)  # only 2, 3, 4, 5 are reachable


def test_adjacency_learns_latest_top_and_ignores_foreign_ids():
    table = AdjacencyTable(vocab=8, width=2)
    table.learn(a(1, 3, 99, -1), np.array([[2, 4, 5], [6, 7, 0], [1, 1, 1], [1, 1, 1]]),
                np.array([[4, 1, 0], [2, 2, 2], [0, 0, 0], [0, 0, 0]]))
    table.learn(a(1), np.array([[5, 6, 7]]))
    assert table.successors[1].tolist() == [5, 6] and table.successors[3].tolist() == [6, 7]
    assert table.confidence[1].tolist() == [0, 0] and table.confidence[3].tolist() == [2, 2]
    assert (table.successors[[0, 2, 4, 5, 6, 7]] == -1).all()


def test_top_successors_buckets_the_share_within_the_top():
    logits = torch.tensor([[0.0, 10.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    out = top_successors(logits, 2)  # [K, 2R]
    assert out[0, 0] == 1 and out[0, 2:].tolist() == [4, 0]  # token 1 holds ~1.0 of the top 2 (bucket 4), the next ~0
    assert out[1, 2:].tolist() == [2, 2]  # two equal logits: .5 each, bucket 2 ([.5, .75))
    assert set(out[1, :2].tolist()) <= {0, 1, 2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_top_successors_takes_any_layout_and_dtype(dtype):
    """Rows that are a strided view (a slice of a step's logits) or of a dtype numba's kernel does not
    read (bfloat16: torch's topk) give what torch's topk gives."""
    torch.manual_seed(0)
    base = torch.randn(3, 400).to(dtype)
    for logits in (base, base[:, ::2], base.t().contiguous().t()):
        out = top_successors(logits, 4)
        assert out[:, :4].tolist() == logits.float().topk(4, dim=-1).indices.tolist()


def test_rank_priors_fall_with_rank_and_rise_with_confidence():
    single, paired = rank_priors(3).reshape(2, 3, BUCKETS)  # a token's successors, then a pair's
    assert (single == paired).all()
    priors = single
    assert (np.diff(priors, axis=0) < 0).all() and (np.diff(priors, axis=1) > 0).all()
    assert ((priors > 0) & (priors < 1)).all()



def test_adjacency_table_learns_the_staged_layout_as_its_two_halves():
    """learn_staged reads top-R and the buckets from the verifier's [K, 2R] rows as learn does from two arrays."""
    staged = np.array([[2, 3, 1, 0], [4, 5, 0, 2], [6, 7, 3, 3]])
    tokens, prev = a(1, 2, 1), a(-1, 1, 2)
    split, whole = AdjacencyTable(vocab=8, width=2), AdjacencyTable(vocab=8, width=2)
    split.learn(tokens, staged[:, :2], staged[:, 2:], prev)
    whole.learn_staged(tokens, staged, prev)
    for name in ("successors", "confidence", "pair_keys", "pair_successors", "pair_confidence"):
        assert np.array_equal(getattr(split, name), getattr(whole, name)), name
    assert whole.successors[1].tolist() == [6, 7] and whole.confidence[2].tolist() == [0, 2]

def test_recycling_proposer_paths_carry_rank_bucket_classes():
    table = AdjacencyTable(vocab=8, width=2)
    table.learn(a(1, 2), np.array([[2, 3], [4, 5]]), np.array([[1, 0], [0, 0]]))
    source = RecyclingProposer(table, nodes=3)
    assert isinstance(source, Proposer) and source.priors.shape == (4 * BUCKETS,)
    est = np.full((4 * BUCKETS, 2), 0.05)
    est[1], est[0], est[BUCKETS] = [.8, .8], [.5, .5], [.3, .3]  # (rank 0, bucket 1), (0, 0), (1, 0)
    cands = source.propose(a(0, 1), 2, 4, est)
    assert cands.tokens.tolist() == [[2, 4], [3, 0]] and cands.classes.tolist() == [[1, 0], [BUCKETS, 0]]
    assert source.propose(a(0, 1), 2, 0, np.ones((4 * BUCKETS, 2))).count == 0  # limit 0: nothing
    table.learn(a(1), np.array([[6, 3]]), np.array([[4, 0]]), prev=a(0))  # after 0 1: 6, surely
    est[2 * BUCKETS + 4] = [.9, .9]  # a pair's rank 0, bucket 4
    cands = source.propose(a(0, 1), 2, 4, est)  # 6 and 3 offered once each, as the pair's
    assert cands.tokens.tolist() == [[6], [3]] and cands.classes[:, 0].tolist() == [2 * BUCKETS + 4, 3 * BUCKETS]
    cands = source.propose(a(5, 1), 2, 4, est)  # another predecessor: the token's own list (6 learned too)
    assert sorted(zip(cands.tokens[:, 0].tolist(), cands.classes[:, 0].tolist())) == [(3, BUCKETS), (6, 4)]


def test_context_matcher_labels_by_match_length():
    matcher = ContextMatcher(match_min=1, match_max=2, length=3)
    seq = a(3, 5, 6, 7, 8, 9, 1, 4, 5, 6, 7, 8, 9)  # the suffix matches 5 tokens back
    cands = matcher.propose(seq, 13, 1, np.ones((7, 4)))
    assert cands.tokens.tolist() == [[1, 4, 5]] and cands.classes.tolist() == [[3, 3, 3]]  # 4-5 bucket
    short = matcher.propose(a(7, 2, 5, 8, 2), 5, 1, np.ones((7, 4)))
    assert short.classes[0, 0] == 0  # a one-token match


def test_pool_proposer_labels_by_recency_rank():
    pool = NgramPool(vocab=16, ngram=2, capacity=4, max_keys=8)
    source = NgramProposer(pool, seed_from_prompt=True, seed_from_output=True)
    source.begin(a(1, 2, 1, 3, 1, 4, 1, 5, 1, 6), 10)
    cands = source.propose(a(1, 2, 1, 3, 1, 4, 1, 5, 1, 6, 1), 11, 4, np.ones((4, 2)))
    assert cands.tokens[:, 0].tolist() == [6, 5, 4, 3] and cands.classes[:, 0].tolist() == [0, 1, 2, 3]


# ------------------------------------------------------ acceptance estimates
def test_acceptance_counts_trials_and_hits():
    stats = AcceptanceStats([np.array([.5]), np.array([.25, .25])], depth=2, strength=4.0)
    assert stats.offsets.tolist() == [0, 1, 3] and stats.block(1, stats.estimates()).shape == (2, 2)
    # tree: 0 (class 0, d1) -> 1 (class 0, d2); 2 (class 1, d1) -> 3 (class 2, d2); path [0]
    stats.update(a(0, 0, 1, 2), a(1, 2, 1, 2), a(-1, 0, -1, 2), a(0))
    est = stats.estimates()
    assert np.isclose(est[0, 0], (2 + 1) / (4 + 1))  # reached and accepted
    assert np.isclose(est[0, 1], 4 * .6 / (4 + 1))  # reached (parent accepted), rejected; prior: depth 1's .6
    assert np.isclose(est[1, 0], 1 / (4 + 1))  # reached, rejected
    assert np.isclose(est[1, 1], .2)  # never tried at depth 2: what depth 1 learned
    assert np.isclose(est[2, 0], .25) and np.isclose(est[2, 1], .25)  # parent rejected: not a trial


def test_backoff_estimates_docstring_example():
    est = backoff_estimates(np.array([.5]), np.array([[2., 0.]]), np.array([[2., 0.]]), np.array([[4., 4.]]), 0., 1.)
    assert np.allclose(est, [[2 / 3, 2 / 3]])


def test_backoff_estimates_clip_the_table_not_the_chain():
    # depth 1 is 1.0 unclipped (clipped to .9 in the table); depth 2 starts from the unclipped 1.0
    est = backoff_estimates(np.array([1.]), np.array([[0., 0.]]), np.array([[0., 1.]]), np.array([[1., 1.]]), 0., .9)
    assert np.allclose(est, [[.9, .5]])


def test_acceptance_forgets_old_counts():
    stats = AcceptanceStats([np.array([.5])], depth=1, strength=2.0, horizon=10.0)
    for _ in range(40):
        stats.update(a(0), a(1), a(-1), a(0))
    assert stats.trials[0, 0] <= 10.0 and stats.estimates()[0, 0] > 0.9


# ---------------------------------------------------------------- budget
def test_budget_trades_tokens_against_time():
    cost = CostModel(np.array([1., 2., 3., 4.]), np.array([1., 1.1, 2., 2.1]))
    probs = np.array([.9, .8, .1])
    # k=0: 1/1; k=1: 1.9/1.1 = 1.73; k=2: 2.7/2.0; k=3: 2.8/2.1 -> 1
    assert choose_tree_size(probs, 1, cost, 8) == 1
    assert choose_tree_size(probs, 1, None, 2) == 2  # fixed budget: the cap
    assert choose_tree_size(np.zeros(0), 1, cost, 8) == 0
    assert choose_tree_size(np.array([.01]), 1, cost, 8) == 0  # nothing pays: plain decoding


def test_calibration_follows_yield_per_level_of_promise():
    gain = GainCalibration()
    assert np.allclose(gain.calibrated(np.array([0.5, 3.0])), [0.5, 3.0])  # nothing verified yet
    for _ in range(60):
        gain.observe(0.7, 0)  # trees promising 0.7 tokens yield nothing (open text) ...
        gain.observe(8.0, 8)  # ... while trees promising 8 (a copy) yield 8
    low, high = gain.calibrated(np.array([0.7, 8.0]))
    assert low < 0.7 * 0.25 and 7.5 < high <= 8.0  # the copy keeps its trust


def test_calibration_forgets_a_bad_patch_after_plain_steps():
    gain = GainCalibration()
    for _ in range(30):
        gain.observe(1.0, 0)
    assert gain.calibrated(np.array([1.0]))[0] < 0.2  # speculation at this level stops ...
    for _ in range(300):
        gain.observe(0.0, 0)  # ... plain steps move the window on ...
    assert gain.calibrated(np.array([1.0]))[0] > 0.9  # ... and the level is trusted again
    for _ in range(300):
        gain.observe(1.0, 0)
    assert np.isclose(gain.calibrated(np.array([1.0]))[0], GAIN_RANGE[0])  # clipped below


def test_calibration_splits_a_promise_between_the_levels_around_it():
    gain = GainCalibration()
    for _ in range(40):
        gain.observe(np.sqrt(2.0), 0)  # halfway (in log) between the levels 1 and 2
    factors = gain.factors()
    at = {level: i for i, level in enumerate(GAIN_LEVELS)}
    assert np.isclose(factors[at[1.0]], factors[at[2.0]], rtol=0.5) and factors[at[2.0]] < 0.5
    assert factors[at[0.25]] == 1.0 and factors[at[16.0]] == 1.0  # far levels untouched



def test_calibration_decays_by_a_running_factor_and_folds_it_back():
    """The lazily kept decay gives the decayed sums a plain recurrence gives, also across the fold-back."""
    from lookahead.core.learner import DecayedSlots
    from lookahead.plan.acceptance import GAIN_DECAY, GAIN_PRIOR_TREES
    gain = GainCalibration()
    steps = int(np.log(DecayedSlots.RESCALE) / np.log(GAIN_DECAY)) + 50  # past the point where the factor is folded back
    yielded = promised = 0.0  # the level of 2.0 tokens, as a plain recurrence decays it
    rng = np.random.default_rng(0)
    for step in range(steps):
        kept = int(rng.integers(0, 3)) if step % 3 else 0
        gain.observe(2.0 if step % 3 else 0.0, kept)
        yielded = yielded * GAIN_DECAY + kept
        promised = promised * GAIN_DECAY + (2.0 if step % 3 else 0.0)
    assert gain.ratio.scale > GAIN_DECAY ** (steps - 1)  # folded back at least once (unfolded: GAIN_DECAY ** steps)
    prior = GAIN_PRIOR_TREES * 2.0
    expected = min(max((yielded + prior) / (promised + prior), GAIN_RANGE[0]), GAIN_RANGE[1])
    assert np.isclose(gain.factors()[list(GAIN_LEVELS).index(2.0)], expected)


def test_budget_speculates_nothing_where_trees_never_paid():
    cost = CostModel(np.array([1., 2., 8.]), np.array([1., 1.3, 1.5]))
    probs = np.array([.5, .3, .2])
    stats = AcceptanceStats([np.array([0.5])])
    assert choose_tree_size(probs, 1, cost, 8, calibration=stats.calibration()) == 3  # 2.0 / 1.5 beats 1 / 1
    for _ in range(20):
        for promised in (0.5, 0.8, 1.0):  # the sizes on offer
            stats.observe_gain(predicted=promised, realised=0)
    assert choose_tree_size(probs, 1, cost, 8, calibration=stats.calibration()) == 0  # a plain decode step


def test_planner_scales_its_tree_by_the_calibration():
    config = LookaheadConfig(recycle=False, ngram_pool=False)
    matcher = ContextMatcher(config.match_min, config.match_max, config.match_length)
    cost = CostModel(np.array([1.0, 64.0]), np.array([1.0, 1.0 + 63 * 0.05]))  # a row costs 5% of a step
    seq = np.array([1, 2, 3, 4, 5, 6, 7, 8, 1, 2], dtype=np.int64)  # "1 2" recurs: "3 4 5 6 7 8" follows
    sizes = []
    for factor_steps in (0, 20):
        stats = AcceptanceStats([matcher.priors])
        for _ in range(factor_steps):
            for promised in GAIN_LEVELS:  # trees of every size
                stats.observe_gain(predicted=promised, realised=0)
        planner = make_planner(config, [matcher], stats, cost)
        sizes.append(plan_step(planner, seq, seq.shape[0], tokens_left=64)[0].size)
    assert sizes[0] > sizes[1]  # the same candidates, trusted less after trees that never paid


def test_batch_width_weighs_every_row_against_the_padded_step():
    cost = CostModel(np.array([1.0, 64.0]), np.array([1.0, 1.0 + 63 * 0.3]))  # a row costs 30% of a step
    sure, unsure = np.array([0.9, 0.9, 0.9]), np.array([0.05, 0.05, 0.05])
    assert choose_tree_size(sure, 1, cost, 8) == 3  # alone, the sure row speculates all three
    # (1 + 1) / 1 = 2.0 at k = 0; (2 + 0.95) / 1.3 = 2.27 at k = 1; (2 + 1.9) / 1.6 = 2.44; (2 + 2.85) / 1.9 = 2.55
    assert choose_batch_width([sure, unsure], 1, cost, 8) == 3
    # four unsure rows pay for the padded width too: (5 + 0.9 + 0.2) / 1.3 = 4.69 < 5 / 1 at k = 0
    assert choose_batch_width([sure] + [unsure] * 4, 1, cost, 8) == 0
    assert choose_batch_width([sure, np.zeros(0)], 1, cost, 2) == 2  # a row with no nodes adds only its 1
    assert choose_batch_width([np.zeros(0), np.zeros(0)], 1, cost, 8) == 0
    assert choose_batch_width([sure, unsure], 1, None, 2) == 2  # fixed budget: the cap


def test_forecast_step_docstring_example():
    cost = CostModel(np.array([1.0, 64.0]), np.array([1.0, 1.0 + 63 * 0.1]), smoothing=0.0)
    assert forecast_step([np.array([.9, .1])], np.array([1, 3]), np.array([0.0, .5]), cost, 8)[:2] == (1, 1)
    assert forecast_step([np.array([.9, .1])], np.array([1, 3]), np.array([0.0, .5]), None, 8)[:2] == (1, 2)  # fixed
    # Speculative steps lately costing 2x their forecast: the plain step wins (docstring); trees that gave
    # half their promise alone leave the window's column worth taking.
    assert forecast_step([np.array([.9, .1])], np.array([1, 3]), np.array([0.0, .5]), cost, 8, cost_correction=2.0)[:2] == (0, 0)
    assert forecast_step([np.array([.9, .1])], np.array([1, 3]), np.array([0.0, .5]), cost, 8, extra=0.5)[:2] == (1, 1)
    assert forecast_step([np.array([.9, .1])], np.array([1]), np.array([0.0]), cost, 8, extra=0.1)[:2] == (0, 0)


def test_window_opens_where_rows_are_free_and_stays_shut_where_they_cost():
    from lookahead.cost import flat_curve
    rows = np.array([1, 3, 6, 9])  # x alone, then 1..3 columns of a 4-gram window
    gain = np.arange(4) * 0.05  # what each width's columns are worth
    steep = CostModel(np.array([1.0, 64.0]), np.array([1.0, 1.0 + 63 * 0.2]), smoothing=0.0)
    probs = [np.array([.8, .6, .3])]
    assert forecast_step(probs, rows, gain, flat_curve(steep), 8)[:2] == (3, 3)  # free rows: everything
    assert forecast_step(probs, rows, gain, steep, 8)[0] == 0  # 0.4 of a step for 0.05 tokens a column: shut


def test_window_value_follows_what_its_ngrams_added_per_column():
    from lookahead.proposers.ngram import COLUMN_PRIOR, column_learner
    learner = column_learner()
    assert np.isclose(learner.value(), COLUMN_PRIOR[0] / COLUMN_PRIOR[1])
    for _ in range(200):
        learner.step(2, 4)  # half a token per column fed
    assert 0.4 < learner.value() < 0.5
    for _ in range(200):
        learner.step(0, 4)  # its n-grams stopped paying
    assert learner.value() < 0.02


def test_planner_credits_accepted_nodes_of_the_window_source_only():
    from lookahead.proposers.ngram import NgramPool, WindowProposer, column_learner
    from lookahead.core.tree import TokenTree
    config = LookaheadConfig(window=3, ngram=3, recycle=False, ngram_pool=False)
    matcher = ContextMatcher(config.match_min, config.match_max, config.match_length)
    window = WindowProposer(NgramPool(64, 3, 4, 64))
    stats = AcceptanceStats([matcher.priors, window.priors])
    planner = make_planner(config, [matcher, window], stats, None)
    assert planner.chooser.widths.tolist() == [3]  # a fixed budget feeds the whole window
    off = int(stats.offsets[1])
    tree = TokenTree(a(5, 6, 7), a(-1, 0, 1), a(1, 2, 3), a(0, off, off + 1))  # a matcher node, then two window nodes
    planner.learn(tree, a(0, 1), width=3)  # the matcher's node and one window node accepted
    learner = stats.state("window", column_learner)  # the window source's own learner, kept in the table
    assert np.isclose(learner.num, 1.0) and np.isclose(learner.den, 3.0)
    assert np.isclose(planner.column_worth(), (1.0 + 1.0) / (3.0 + 20.0))  # what the planner asks the sources


def test_expected_gains_never_fall_as_nodes_are_added():
    from lookahead.plan.budget import expected_gains
    stats = AcceptanceStats([np.array([0.5])])
    for _ in range(40):
        stats.observe_gain(predicted=2.0, realised=0)  # trees promising 2 tokens yielded nothing
    probs = np.full(8, 0.3)  # promises 0.3, 0.6, ... 2.4
    raw = 1.0 + stats.calibrated(np.concatenate([[0.0], np.cumsum(probs)]))
    assert (np.diff(raw) < 0).any()  # calibrated apart, the levels disagree ...
    gains = expected_gains(probs, 8, stats.calibrated)
    assert (np.diff(gains) >= 0).all() and gains[0] == 1.0  # ... but more nodes never yield less


def test_flat_curve_prices_every_size_like_one_row_and_never_learns():
    from lookahead.cost import flat_curve
    curve = CostModel(np.array([1.0, 4.0, 16.0]), np.array([2.0, 3.0, 5.0]))  # hand-written, not timed
    flat = flat_curve(curve)
    assert flat.step(np.array([1.0, 4.0, 16.0, 40.0])).tolist() == [2.0, 2.0, 2.0, 2.0]
    flat.observe(16, 9.0)
    assert flat.step(np.array([16.0])).tolist() == [2.0] and curve.seconds.tolist() == [2.0, 3.0, 5.0]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 6), st.integers(0, 6)), min_size=0, max_size=5),
       st.integers(1, 40), st.integers(1, 7), st.integers(0, 2**31 - 1))
def test_scored_groups_is_the_trie_of_the_groups_stacked(shapes, max_nodes, deepest, seed):
    """Each source's rows merged in order, without stacking them first: the same trie as scored_tree over
    the rows stacked (padded, classes offset) and cut at ``deepest`` tokens."""
    from lookahead.core.tree import scored_groups, scored_tree

    rng = np.random.default_rng(seed)
    est = rng.uniform(0.05, 0.95, (10, 4))
    groups = []
    for rows, cols, offset in shapes:
        tokens = rng.integers(0, 4, (rows, cols))  # few tokens: rows share prefixes, sources merge
        classes = rng.integers(0, 4, (rows, cols))
        groups.append((tokens, rng.integers(1, cols + 1, rows), classes, offset))
    tree, prob = scored_groups([g for g in groups if g[0].shape[0]], est, max_nodes, deepest)
    kept = [g for g in groups if g[0].shape[0]]
    if not kept:
        assert tree.size == 0 and prob.shape[0] == 0
        return
    width = max(g[0].shape[1] for g in kept)
    stacked = np.concatenate([np.pad(t, ((0, 0), (0, width - t.shape[1]))) for t, _, _, _ in kept])
    classes = np.concatenate([np.pad(c, ((0, 0), (0, width - c.shape[1]))) + off for _, _, c, off in kept])
    lens = np.minimum(np.concatenate([n for _, n, _, _ in kept]), deepest)
    want, want_prob = scored_tree(stacked, lens, classes, est, max_nodes)
    for name in ("tokens", "parents", "depths", "classes"):
        np.testing.assert_array_equal(getattr(tree, name), getattr(want, name))
    np.testing.assert_allclose(prob, want_prob)


def test_trie_extend_worked_example():
    """The docstring's example: two sources' rows sharing a first token, merged one call a source."""
    from lookahead.kernels.trie import trie_extend, trie_probs

    nodes, cond = np.zeros((4, 4), dtype=np.int64), np.zeros(4)
    est = np.array([[.9, .5], [.8, .6]])
    m = trie_extend(nodes, cond, 0, np.array([[4, 5]]), a(2), np.zeros((1, 2), dtype=np.int64), 0, est, 9)
    assert m == 2
    m = trie_extend(nodes, cond, m, np.array([[4, 6]]), a(2), np.zeros((1, 2), dtype=np.int64), 1, est, 9)
    assert m == 3
    assert nodes[0, :m].tolist() == [4, 5, 6] and nodes[1, :m].tolist() == [-1, 0, 0]
    assert nodes[3, :m].tolist() == [0, 0, 1]  # the shared 4 keeps the better class (.9 > .8)
    np.testing.assert_allclose(cond[:m], [.98, .5, .6])
    np.testing.assert_allclose(trie_probs(nodes[1], cond, m), [.98, .49, .588])
    # a full trie takes no new node, a row cut at deepest 1 adds only its first token
    assert trie_extend(nodes[:, :3].copy(), cond[:3].copy(), 3, np.array([[7, 8]]), a(2),
                       np.zeros((1, 2), dtype=np.int64), 0, est, 9) == 3
    assert trie_extend(nodes, cond, 3, np.array([[7, 8]]), a(2), np.zeros((1, 2), dtype=np.int64), 0, est, 1) == 4


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5), st.integers(1, 9), st.integers(0, 2**31 - 1))
def test_row_argmax_is_torch_argmax_with_ties_nan_and_infinity(rows, vocab, seed):
    """The verifier's CPU argmax (numpy's) picks what torch.argmax picks: the first maximal index,
    NaN as the maximum, on rows full of ties, infinities and -inf."""
    from lookahead.verify.verifier import row_argmax

    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 3, (rows, vocab)).astype(np.float32)  # [R, V] many ties
    specials = rng.random((rows, vocab))
    scores[specials < 0.1] = np.nan
    scores[(specials >= 0.1) & (specials < 0.2)] = np.inf
    scores[(specials >= 0.2) & (specials < 0.3)] = -np.inf
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        t = torch.from_numpy(scores).to(dtype)
        got = row_argmax(t)
        assert got.dtype == torch.int64 and torch.equal(got, t.argmax(-1))


def _forecast_in_numpy(probs, window_rows, window_gain, cost, cap, calibrate, extra, cost_correction):
    """The budget's choice written out in numpy (as before its kernel): the reference for the kernel."""
    from lookahead.plan.budget import expected_gains

    limit = min(max(int(p.shape[0]) for p in probs), cap)
    gains = np.zeros(limit + 1)
    for row in probs:
        own = expected_gains(row, limit, calibrate)
        gains += np.concatenate([own, np.full(limit + 1 - own.shape[0], own[-1])])
    seconds = cost.step(window_rows[:, None] + np.arange(limit + 1)[None, :])
    base = float(len(probs))
    tokens = base + extra * (gains[None, :] - base) + base * window_gain[:, None]
    priced = seconds * cost_correction
    priced[0, 0] = seconds[0, 0]
    best = int(np.argmax(tokens / priced))
    return best // (limit + 1), best % (limit + 1), float(gains[best % (limit + 1)])


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_the_budget_kernel_chooses_what_numpy_chooses(seed):
    from lookahead.plan.budget import forecast_step

    rng = np.random.default_rng(seed)
    stats = AcceptanceStats([np.array([0.5])])
    for _ in range(int(rng.integers(0, 30))):
        stats.observe_gain(predicted=float(rng.uniform(0.1, 10)), realised=int(rng.integers(0, 6)))
    probs = [np.sort(rng.random(int(rng.integers(0, 20))))[::-1] * rng.random() for _ in range(int(rng.integers(1, 5)))]
    rows = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 32.0])
    cost = CostModel(rows, np.sort(rng.uniform(0.01, 0.05, rows.shape[0])))
    window_rows = np.array([1, 3, 5]) if rng.random() < 0.5 else np.array([1])
    window_gain = np.concatenate([[0.0], rng.uniform(0, 0.3, window_rows.shape[0] - 1)])
    extra, cost_correction, cap = float(rng.uniform(0.1, 1.5)), float(rng.uniform(0.67, 4.0)), int(rng.integers(0, 24))
    calibrated = rng.random() < 0.7
    option, size, expected = forecast_step(probs, window_rows, window_gain, cost, cap, 0.0,
                                           stats.calibration() if calibrated else None, extra, cost_correction)
    want = _forecast_in_numpy(probs, window_rows, window_gain, cost, cap, stats.calibrated if calibrated else None,
                              extra, cost_correction)
    assert (option, size) == want[:2] and np.isclose(expected[0], want[2])
