"""Sampling is exact: lookahead's samples follow exactly the target's processed distribution.

Chi-square goodness of fit between empirical and exact distributions, with
fixed seeds (deterministic), for the verifier alone on hand-made trees and
for ``LookaheadGenerator.generate`` on a tiny Llama with an 8-token
vocabulary, per candidate source and all together, with temperature, top-k,
top-p and a repetition penalty. The reference distribution is computed here
from the model's logits with an independent implementation of those
processors. Multi-token steps must really happen (else the test would be
vacuous), and deliberately wrong verifiers must be caught.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
import torch
import transformers

from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.verify import verifier as verify
from lookahead.core.tree import TokenTree
from lookahead.kernels.walk import accept_walk
from lookahead.verify.sampling import fast_top_k, sample_rows, sample_top_k
from lookahead.verify.verifier import accepted_children

from conftest import RUN_ON

VOCAB = 8
EOS = 7
P_MIN = 1e-3  # reject "same distribution" below this p-value
BATCH = 50  # samples drawn a batch at a time (a row of a batch decodes as a sequence alone; 9x faster)


# ------------------------------------------------------------ the statistics
def chi_square_p(counts: Counter, probs: dict, n: int) -> float:
    """p-value of observed counts against exact cell probabilities (cells with < 5 expected merged)."""
    assert abs(sum(probs.values()) - 1.0) < 1e-6, "the exact distribution must sum to 1"
    unknown = set(counts) - set(probs)
    assert not unknown or all(probs.get(c, 0.0) == 0 for c in unknown), f"impossible outcomes {unknown}"
    stat, cells, rare_obs, rare_exp = 0.0, 0, 0.0, 0.0
    for cell, p in probs.items():
        expected = n * p
        if expected < 5:
            rare_obs += counts.get(cell, 0)
            rare_exp += expected
            continue
        stat += (counts.get(cell, 0) - expected) ** 2 / expected
        cells += 1
    rare_obs += sum(counts[c] for c in unknown)
    if rare_exp > 0 or rare_obs > 0:
        stat += (rare_obs - rare_exp) ** 2 / max(rare_exp, 1e-9)
        cells += 1
    dof = max(cells - 1, 1)
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def test_chi_square_harness_tells_right_from_wrong():
    rng = np.random.default_rng(0)
    probs = {i: p for i, p in enumerate([0.5, 0.3, 0.15, 0.05])}
    draws = Counter(rng.choice(4, size=4000, p=list(probs.values())).tolist())
    assert chi_square_p(draws, probs, 4000) > P_MIN
    skewed = Counter(rng.choice(4, size=4000, p=[0.45, 0.35, 0.15, 0.05]).tolist())
    assert chi_square_p(skewed, probs, 4000) < P_MIN


# ------------------------------------------------- the verifier on hand trees
def _walk_samples(scores: torch.Tensor, tree: TokenTree, n: int, seed: int, accept=accepted_children,
                  shared_uniform: bool = False) -> list:
    """n steps of sampled verification (one uniform per depth); each the tuple of new tokens."""
    rng = np.random.default_rng(seed)
    depths = np.concatenate([[0], tree.depths])  # [1 + M]
    out = []
    for _ in range(n):
        u = rng.random(depths.max() + 1)[depths]  # [1 + M]: rows of one depth decide one position
        if shared_uniform:
            u[:] = u[0]
        chosen = sample_rows(scores, torch.from_numpy(u)).numpy()  # [1 + M]
        _, new = accept_walk(tree.tokens, tree.parents, accept(tree, chosen), chosen)
        out.append(tuple(new.tolist()))
    return out


def _hand_tree():
    """x's children 2, 0, 4 (in that order), 0's children 1 and 3, 1's child 5; scores per row."""
    tokens = np.array([2, 0, 4, 1, 3, 5], dtype=np.int64)
    parents = np.array([-1, -1, -1, 1, 1, 3], dtype=np.int64)
    depths = np.array([1, 1, 1, 2, 2, 3], dtype=np.int64)
    tree = TokenTree(tokens, parents, depths, np.zeros(6, dtype=np.int64))
    scores = torch.randn(7, 6, generator=torch.Generator().manual_seed(3)) * 1.5  # [1 + M, V]
    return tree, scores


def _check_walks(samples: list, tree: TokenTree, scores: torch.Tensor) -> list[float]:
    """p-values: first token ~ p_x; after tree node t, the next token ~ p_t; after that, again."""
    probs = torch.softmax(scores.double(), -1).numpy()  # [1 + M, V]
    paths = {-1: ()}
    for i in range(tree.size):  # parents come first
        paths[i] = paths[int(tree.parents[i])] + (int(tree.tokens[i]),)
    pvalues = []
    for node, prefix in paths.items():
        nexts = Counter(s[len(prefix)] for s in samples if s[:len(prefix)] == prefix and len(s) > len(prefix))
        total = sum(nexts.values())
        if total >= 200:
            pvalues.append(chi_square_p(nexts, dict(enumerate(probs[node + 1].tolist())), total))
    return pvalues


def test_tree_rejection_sampling_emits_the_target_distribution():
    tree, scores = _hand_tree()
    pvalues = _check_walks(_walk_samples(scores, tree, 12000, seed=1), tree, scores)
    assert len(pvalues) >= 3  # x, node 0 and deeper rows were reached often enough to test
    assert min(pvalues) > P_MIN, pvalues


def test_children_holding_all_mass_are_always_accepted():
    """top-k leaves only the children: the residual is empty and some child must be taken."""
    tree, scores = _hand_tree()
    scores = scores.clone()
    scores[0, [1, 3, 5]] = -float("inf")  # x's row keeps only its children 2, 0, 4
    for new in _walk_samples(scores, tree, 2000, seed=2):
        assert new[0] in (2, 0, 4) and len(new) >= 2


def test_a_token_filtered_out_is_never_drawn():
    scores = torch.tensor([[0.0, -float("inf"), 1.0, -float("inf")]] * 4)
    u = torch.tensor([0.0, 0.3, 0.999999, 0.5], dtype=torch.float64)
    assert set(sample_rows(scores, u).tolist()) <= {0, 2}


def _accept_first_child(tree: TokenTree, chosen: np.ndarray) -> np.ndarray:
    """WRONG on purpose: always take a node's first child."""
    first = np.zeros(tree.size, dtype=bool)
    seen = set()
    for i, parent in enumerate(tree.parents.tolist()):
        first[i] = parent not in seen
        seen.add(parent)
    return first


def test_harness_catches_a_verifier_that_takes_the_first_child():
    tree, scores = _hand_tree()
    pvalues = _check_walks(_walk_samples(scores, tree, 12000, seed=1, accept=_accept_first_child), tree, scores)
    assert min(pvalues) < P_MIN


def test_harness_catches_one_uniform_for_every_position():
    """WRONG on purpose: the tokens of one step drawn from the same uniform (correlated)."""
    tree, scores = _hand_tree()
    pvalues = _check_walks(_walk_samples(scores, tree, 12000, seed=1, shared_uniform=True), tree, scores)
    assert min(pvalues) < P_MIN


# ------------------------------------------------- end to end on a tiny Llama
def tiny_llama() -> transformers.LlamaForCausalLM:
    """8-token vocabulary, peaked distributions (large init), EOS = 7."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                                   initializer_range=0.3, pad_token_id=0, bos_token_id=0, eos_token_id=EOS)
    model = transformers.LlamaForCausalLM(cfg).eval().to(RUN_ON["device"])  # (pytest --device, conftest)
    model.generation_config.pad_token_id = 0
    return model


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.fixture(scope="module")
def prompt(model):
    """[a b y f f f f a b] where y is the model's likely next token after the whole prompt:
    the context matcher (after "a b") and the pool (bigram "b y") both propose it."""
    rng = np.random.default_rng(0)
    with torch.inference_mode():
        for _ in range(200):  # deterministic search over fillers f and y
            fill = rng.integers(0, EOS, 4).tolist()
            for y in range(EOS):
                text = [1, 3, y] + fill + [1, 3]
                probs = torch.softmax(model(torch.tensor([text], device=model.device)).logits[0, -1], -1)
                if float(probs[y]) > 0.4:
                    return torch.tensor([text], device=model.device)
    raise AssertionError("no prompt whose proposed continuation is likely")


def reference_probs(logits: torch.Tensor, prefix: list[int], temperature=1.0, top_k=0, top_p=1.0,
                    repetition_penalty=1.0) -> np.ndarray:
    """The processed next-token distribution [V], written out independently of transformers."""
    s = logits.double().clone()
    if repetition_penalty != 1.0:
        for t in set(prefix):
            s[t] = s[t] / repetition_penalty if s[t] > 0 else s[t] * repetition_penalty
    s = s / temperature
    if top_k:
        s[s < torch.topk(s, top_k).values[-1]] = -float("inf")
    if top_p < 1.0:
        order = torch.argsort(s)  # ascending
        cum = torch.cumsum(torch.softmax(s[order], -1), -1)
        drop = cum <= 1 - top_p
        drop[-1] = False
        s[order[drop]] = -float("inf")
    return torch.softmax(s, -1).cpu().numpy()


@torch.inference_mode()
def exact_distribution(model, ids: torch.Tensor, tokens: int, **settings) -> dict:
    """P(first ``tokens`` new tokens) by enumeration; a sequence ending in EOS is its own cell."""
    cells = {}

    def visit(prefix: list[int], prob: float, left: int) -> None:
        row = reference_probs(model(torch.tensor([prefix], device=model.device)).logits[0, -1], prefix, **settings)
        for t in range(VOCAB):
            p = prob * float(row[t])
            if p <= 0:
                continue
            new = tuple(prefix[ids.shape[1]:]) + (t,)
            if left == 1 or t == EOS:
                cells[new] = cells.get(new, 0.0) + p
            else:
                visit(prefix + [t], p, left - 1)

    visit(ids[0].tolist(), 1.0, tokens)
    return cells


def sample_runs(gen: LookaheadGenerator, ids: torch.Tensor, tokens: int, n: int, seed: int, batch: int = 1,
                **settings):
    """n sampled generations, drawn as the rows of batches of ``batch`` copies of ``ids`` [1, T] (the
    rows are independent: each has its own uniforms, and whatever the others proposed, a row's text
    follows the target's distribution). Returns (Counter of new-token tuples, the mean over rows of the
    tokens their first forward gave beyond one: with tokens=2, the share of rows done in one forward)."""
    assert n % batch == 0, "n must be a whole number of batches"
    torch.manual_seed(seed)
    counts, multi = Counter(), 0
    rows = ids.repeat(batch, 1)  # [B, T]
    for _ in range(n // batch):
        out = gen.generate(rows, max_new_tokens=tokens, do_sample=True, **settings)
        counts.update(_to_eos(row) for row in out[:, ids.shape[1]:].tolist())
        multi += gen.last_stats.accepted[0] - batch  # the first step's tokens beyond one a row
    return counts, multi / n


def _to_eos(new: list[int]) -> tuple[int, ...]:
    """A batch row's new tokens up to its first EOS (after it: padding), as a sequence alone returns them."""
    return tuple(new[:new.index(EOS) + 1] if EOS in new else new)


SOURCES = {  # each source alone, then all together
    "context": dict(ngram_pool=False, recycle=False, memory_tokens=0),
    "pool": dict(context_match=False, recycle=False, memory_tokens=0),
    "recycle": dict(context_match=False, ngram_pool=False, memory_tokens=0),
    "memory": dict(context_match=False, ngram_pool=False, recycle=False),  # fed by every earlier sample
    "all": dict(),
}
SETTINGS = {
    "T1": dict(temperature=1.0, top_k=0, top_p=1.0),
    "T0.7-topk5-rep1.3": dict(temperature=0.7, top_k=5, top_p=1.0, repetition_penalty=1.3),
    "T1.3-topp0.9": dict(temperature=1.3, top_k=0, top_p=0.9),
}


def _generator(model, **fields) -> LookaheadGenerator:
    """A fixed 12-node budget: tree sizes do not depend on this machine's timings."""
    return LookaheadGenerator(model, config=LookaheadConfig(budget="fixed", max_tree_nodes=12, **fields))


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_each_source_samples_the_exact_distribution(model, prompt, source):
    gen = _generator(model, **SOURCES[source])
    settings = SETTINGS["T1"]
    gen.generate(prompt, max_new_tokens=8, do_sample=True, **settings)  # recycling learns successors
    counts, multi = sample_runs(gen, prompt, 2, 3000, seed=11, batch=BATCH, **settings)
    assert multi > 0.1, f"{source}: only {multi:.0%} of rows took both tokens in one forward"
    assert chi_square_p(counts, exact_distribution(model, prompt, 2, **settings), 3000) > P_MIN


@pytest.mark.parametrize("setting", ["T0.7-topk5-rep1.3", "T1.3-topp0.9"])
def test_warpers_and_repetition_penalty_apply_per_tree_row(model, prompt, setting):
    gen = _generator(model)
    settings = SETTINGS[setting]
    gen.generate(prompt, max_new_tokens=8, do_sample=True, **settings)
    counts, multi = sample_runs(gen, prompt, 2, 3000, seed=12, batch=BATCH, **settings)
    assert multi > 0.1
    assert chi_square_p(counts, exact_distribution(model, prompt, 2, **settings), 3000) > P_MIN


def test_three_tokens_in_one_forward_follow_the_joint_distribution(model, prompt):
    """top-k 3 keeps 27 cells for three tokens; deep tree nodes are accepted too."""
    gen = _generator(model)
    settings = dict(temperature=1.0, top_k=3, top_p=1.0)
    gen.generate(prompt, max_new_tokens=8, do_sample=True, **settings)
    counts, multi = sample_runs(gen, prompt, 3, 3000, seed=13, batch=BATCH, **settings)
    assert multi > 1.0  # over 1 of at most 2 extra tokens a row: some rows took all three in one forward
    assert chi_square_p(counts, exact_distribution(model, prompt, 3, **settings), 3000) > P_MIN


def _same_uniform_everywhere(self, positions, lane=0):
    """WRONG on purpose: every row of a step decided by the uniform of its first position."""
    return np.full(positions.shape[0], self.rngs[lane].random())


@pytest.mark.parametrize("wrong", ["first-child", "same-uniform"])
def test_end_to_end_harness_catches_a_wrong_verifier(model, prompt, wrong, monkeypatch):
    if wrong == "first-child":
        monkeypatch.setattr(verify, "walk", lambda tree, chosen: accept_walk(
            tree.tokens, tree.parents, _accept_first_child(tree, chosen), chosen))
    else:
        monkeypatch.setattr(verify.PositionUniforms, "at", _same_uniform_everywhere)
    gen = _generator(model)
    settings = SETTINGS["T1"]
    gen.generate(prompt, max_new_tokens=8, do_sample=True, **settings)
    counts, _ = sample_runs(gen, prompt, 2, 600, seed=11, batch=BATCH, **settings)
    assert chi_square_p(counts, exact_distribution(model, prompt, 2, **settings), 600) < P_MIN


def test_sampled_text_depends_on_the_seed_only(model, prompt):
    """The uniforms are per output position: any tree, budget or timing gives the same sample."""
    outs = []
    for fields in (dict(), dict(budget="fixed", max_tree_nodes=3), dict(candidates=0),
                   dict(window=3, ngram=3, recycle=False)):
        gen = LookaheadGenerator(model, config=LookaheadConfig(**fields))
        torch.manual_seed(123)
        outs.append(gen.generate(prompt, max_new_tokens=20, do_sample=True, temperature=0.9, eos_token_id=[99]))
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_default_generator_as_users_call_it(model, prompt):
    """LookaheadGenerator(model) with its defaults (adaptive budget), a fresh generator per run."""
    settings = SETTINGS["T1"]
    torch.manual_seed(5)
    counts, one_forward = Counter(), 0
    gen = LookaheadGenerator(model)
    for _ in range(1000):
        out = gen.generate(prompt, max_new_tokens=2, do_sample=True, **settings)
        counts[tuple(out[0, prompt.shape[1]:].tolist())] += 1
        one_forward += gen.last_stats.steps == 1
    assert one_forward / 1000 > 0.1
    assert chi_square_p(counts, exact_distribution(model, prompt, 2, **settings), 1000) > P_MIN


def test_same_seed_same_sample(model, prompt):
    gen = _generator(model)
    outs = []
    for _ in range(2):
        torch.manual_seed(42)
        outs.append(gen.generate(prompt, max_new_tokens=12, do_sample=True, temperature=0.9))
    assert torch.equal(*outs)
    g1, g2 = (torch.Generator(device=model.device).manual_seed(7) for _ in range(2))  # (on the model's device)
    a = gen.generate(prompt, max_new_tokens=12, do_sample=True, generator=g1)
    b = gen.generate(prompt, max_new_tokens=12, do_sample=True, generator=g2)
    assert torch.equal(a, b)


def test_temperature_zero_and_do_sample_false_are_greedy(model, prompt):
    gen = _generator(model)
    with torch.inference_mode():
        ref = model.generate(prompt, max_new_tokens=16, do_sample=False)
    assert torch.equal(gen.generate(prompt, max_new_tokens=16, do_sample=True, temperature=0.0), ref)
    assert torch.equal(gen.generate(prompt, max_new_tokens=16, do_sample=False, temperature=0.7), ref)


def test_greedy_with_repetition_penalty_matches_generate(model, prompt):
    """Processors apply in greedy mode too, each tree row with its own prefix."""
    gen = _generator(model)
    with torch.inference_mode():
        ref = model.generate(prompt, max_new_tokens=24, do_sample=False, repetition_penalty=1.5)
    out = gen.generate(prompt, max_new_tokens=24, repetition_penalty=1.5)
    assert torch.equal(out, ref)
    assert gen.last_stats.steps < 24  # speculation happened


def test_estimates_are_kept_per_regime(model, prompt):
    gen = _generator(model)
    gen.generate(prompt, max_new_tokens=8)
    gen.generate(prompt, max_new_tokens=8, do_sample=True, temperature=0.7)
    gen.generate(prompt, max_new_tokens=8, do_sample=True, temperature=1.0)
    assert set(gen.acceptance) == {"greedy", "sample:2", "sample:3"}


def test_processors_see_each_rows_own_prefix(model):
    """A repetition penalty at depth 3 sees the two tree tokens above the row; rows of each
    depth are processed exactly as transformers processes that full sequence alone."""
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor, TopKLogitsWarper

    from lookahead.call.decoding import Decoding
    from lookahead.call.processing import process_rows

    procs = [RepetitionPenaltyLogitsProcessor(2.0), TopKLogitsWarper(4)]
    decoding = Decoding(True, 1.0, procs, 8, np.zeros(0, dtype=np.int64), None)
    seq = np.array([1, 1, 2, 0, 0], dtype=np.int64)  # only seq[:3] = [1 1 2] is the sequence
    paths = np.array([[0, 0, 0], [5, 0, 0], [5, 6, 0], [5, 6, 3]], dtype=np.int64)  # x, then a chain
    depths = np.array([0, 1, 2, 3])
    scores = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(0)).abs() + 0.1  # > 0
    got = process_rows(decoding, scores.clone(), seq, 3, paths, depths)
    for row in range(4):
        ids = torch.tensor([[1, 1, 2] + paths[row, :depths[row]].tolist()])
        want = scores[row:row + 1]
        for proc in procs:
            want = proc(ids, want)
        assert torch.equal(got[row], want[0])
    assert got[3, 6] == -float("inf") or got[3, 6] == scores[3, 6] / 2  # token 6 (depth 2) penalised


def test_sample_top_k_docstring_example():
    u = torch.tensor([0.5, 0.8], dtype=torch.float64)
    assert sample_top_k(torch.tensor([[1.0, 5, 3, 4], [1.0, 5, 3, 4]]), 2, u).tolist() == [1, 3]  # .73 / .27


@pytest.mark.parametrize("case", ["distinct", "ties", "all_tied", "few_finite"])
def test_sample_top_k_draws_what_the_warper_then_sample_rows_draws(case):
    """The shortcut equals transformers' TopKLogitsWarper followed by the full inverse-CDF draw,
    ties at the k-th score included (those rows take the full path)."""
    gen = torch.Generator().manual_seed(3)
    for k in (1, 2, 7, 50):
        scores = torch.randn(9, 500, generator=gen) * 3  # [R, V]
        if case == "ties":
            scores = (scores * 2).round() / 2  # many equal scores around the k-th
        elif case == "all_tied":
            scores[:] = 1.5
        elif case == "few_finite":
            scores[:, 3:] = float("-inf")  # fewer than k finite scores: the k-th is -inf
        for _ in range(20):
            u = torch.rand(9, dtype=torch.float64, generator=gen)
            expect = sample_rows(transformers.generation.TopKLogitsWarper(k)(None, scores), u)
            assert torch.equal(sample_top_k(scores, k, u), expect)


def test_fast_top_k_only_when_sampling_ends_in_top_k():
    from lookahead.call.decoding import Decoding
    from transformers.generation import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, \
        TopPLogitsWarper

    def decoding(procs, do_sample=True):
        return Decoding(do_sample, 0.7, LogitsProcessorList(procs), 8, np.zeros(0, dtype=np.int64), None)

    assert fast_top_k(decoding([TemperatureLogitsWarper(0.7), TopKLogitsWarper(50)])) == 50
    assert fast_top_k(decoding([TopKLogitsWarper(50), TopPLogitsWarper(0.9)])) is None  # top-p after it
    assert fast_top_k(decoding([TopKLogitsWarper(5, filter_value=-1e4)])) is None  # not a zero probability
    assert fast_top_k(decoding([TopKLogitsWarper(5)], do_sample=False)) is None
    assert fast_top_k(decoding([])) is None
