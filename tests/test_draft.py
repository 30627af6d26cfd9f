"""The draft model as one more source: exactness (greedy and sampled), its KV cache, its checks."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers

from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.verify import verifier as verify
from lookahead.proposers.draft.checks import DraftModelError
from lookahead.proposers.draft.drafter import Drafter, common_prefix
from lookahead.call.inputs import GenerateInputError
from lookahead.plan.planner import DrawnChain, drawn_rows
from lookahead.proposers.draft.proposer import DraftProposer, confidence_bucket
from lookahead.core.tree import TokenTree, prepend_chain
from lookahead.model.cache import cache_keyword
from lookahead.kernels.walk import accept_walk
from lookahead.verify.sampling import speculative_rows

from conftest import COMMON, VOCAB, make_planner, plan_step
from test_sampling import (P_MIN, chi_square_p, exact_distribution, sample_runs, tiny_llama)

DRAFT_ONLY = dict(context_match=False, ngram_pool=False, recycle=False)


def perturbed(model, scale: float, seed: int = 0):
    """A copy of model with every weight moved by scale * its own spread: it agrees often, not always."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(torch.randn(param.shape, generator=gen).to(param.device) * scale * param.std().clamp_min(1e-3))
    return draft.eval()


def _tiny(kind: str):
    torch.manual_seed(0)
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=2, **COMMON)).eval()
    if kind == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(num_key_value_heads=2, **COMMON)).eval()
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=3, n_head=4, n_positions=1024,
                                  pad_token_id=0, bos_token_id=1, eos_token_id=2, initializer_range=0.2)
    return transformers.GPT2LMHeadModel(cfg).eval()


# ------------------------------------------------------------------ pure pieces
def test_pending_rows_of_the_next_sync():
    drafter = Drafter(_tiny("llama"))
    seq = np.array([4, 8, 15, 16, 23, 42], dtype=np.int64)
    drafter.begin(seq, 4)  # holds nothing: the first sync feeds the prompt
    assert drafter.pending(seq, 4) == 4 and drafter.forwards == 0
    drafter.sync(seq, 4)  # holds 4 8 15 16
    assert drafter.pending(seq, 4) == 1 and drafter.pending(seq, 6) == 2  # x again, or 23 42
    drafter.sync(seq, 6)  # holds all six
    assert drafter.pending(seq, 6) == 1  # x is fed again: its logits are needed
    other = np.array([4, 8, 99, 16], dtype=np.int64)
    assert drafter.pending(other, 4) == 2  # rows from the first difference on


def test_common_prefix():
    assert common_prefix(np.array([1, 2, 3, 9]), np.array([1, 2, 3, 4, 5])) == 3
    assert common_prefix(np.array([1, 2]), np.array([1, 2, 3])) == 2
    assert common_prefix(np.zeros(0, dtype=np.int64), np.array([4])) == 0


def test_confidence_bucket():
    assert [confidence_bucket(p) for p in (0.2, 0.3, 0.6, 0.99)] == [0, 1, 2, 5]


def test_prepend_chain_docstring_example():
    tree = TokenTree(np.array([4, 5]), np.array([-1, 0]), np.array([1, 2]), np.array([0, 0]))
    grown, prob, nodes = prepend_chain(tree, np.array([.9, .45]), np.array([4, 6]), np.array([3, 3]),
                                       np.array([.5, .5]))
    assert grown.tokens.tolist() == [4, 6, 4, 5]  # the drawn 4 is NOT merged with the chosen 4
    assert grown.parents.tolist() == [-1, 0, -1, 2]
    assert grown.depths.tolist() == [1, 2, 1, 2]
    assert grown.classes.tolist() == [3, 3, 0, 0]
    assert np.allclose(prob, [.5, .25, .9, .45])
    assert nodes.tolist() == [0, 1]
    # the walk takes the chain's 4 when x's row chose 4: it comes first among equal children
    path, new = accept_walk(grown.tokens, grown.parents, grown.tokens == 4, np.array([4, 9, 9, 9, 9]))
    assert path.tolist()[0] == 0


def test_drawn_rows_follow_the_kept_chain():
    """The chain 0 1 2 and trie nodes 3 4 (chosen); the budget kept 0, 1, 3."""
    chain = DrawnChain(np.array([7, 8, 9]), np.array([0, 1, 2]), torch.eye(10)[:3])
    rows = drawn_rows(chain, np.array([0, 1, 3]))
    # x draws c1; the kept node c1 (new index 0) draws c2; c2 (new index 1) draws c3, not kept itself
    assert rows.rows.tolist() == [0, 1, 2] and rows.tokens.tolist() == [7, 8, 9]
    rows = drawn_rows(chain, np.array([3]))  # no chain node kept: x still tests c1
    assert rows.rows.tolist() == [0] and rows.tokens.tolist() == [7]
    assert drawn_rows(None, np.array([0])) is None


def test_speculative_rows_docstring_example():
    """p [.5 .5 0], q [.9 .1 0], drawn 0: kept with probability 5/9, else token 1."""
    n = 20000
    gen = torch.Generator().manual_seed(0)
    scores = torch.log(torch.tensor([[.5, .5, 1e-30]])).expand(n, -1)
    q = torch.tensor([[.9, .1, 0.]]).expand(n, -1)
    out = speculative_rows(scores, q, torch.zeros(n, dtype=torch.long), torch.rand(n, generator=gen),
                           torch.rand(n, generator=gen))
    kept = (out == 0).float().mean().item()
    assert abs(kept - 5 / 9) < 0.02
    assert set(out.tolist()) == {0, 1}


@pytest.mark.parametrize("seed", range(3))
def test_speculative_rows_emit_p_whatever_q(seed):
    """Over draws c ~ q, the emitted token follows p exactly (chi-square), for an unrelated q."""
    n, vocab = 20000, 6
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(vocab, generator=gen) * 2, -1)
    q = torch.softmax(torch.randn(vocab, generator=gen) * 2, -1)
    drawn = torch.multinomial(q, n, replacement=True, generator=gen)
    out = speculative_rows(p.log().expand(n, -1), q.expand(n, -1), drawn, torch.rand(n, generator=gen),
                           torch.rand(n, generator=gen))
    counts = np.bincount(out.numpy(), minlength=vocab)
    from collections import Counter
    assert chi_square_p(Counter(dict(enumerate(counts.tolist()))), dict(enumerate(p.tolist())), n) > P_MIN


# ------------------------------------------------------------------ greedy exactness
@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("sources,context", [("draft-only", 64), ("all", 64), ("draft-only", 3)])
def test_greedy_with_a_draft_equals_generate(kind, sources, context):
    """Context 3: the draft starts over on the last three tokens at almost every step."""
    model = _tiny(kind)
    draft = perturbed(model, 0.05)
    fields = DRAFT_ONLY if sources == "draft-only" else {}
    gen = LookaheadGenerator(model, config=LookaheadConfig(budget="fixed", draft_context=context, **fields),
                             draft_model=draft)
    rng = np.random.default_rng(1)
    steps = tokens = 0
    for _ in range(3):
        ids = torch.from_numpy(rng.integers(3, VOCAB, (1, 10)))
        ref = model.generate(ids, max_new_tokens=40, do_sample=False)
        out = gen.generate(ids, max_new_tokens=40)
        assert torch.equal(out, ref)
        steps += gen.last_stats.steps
        tokens += gen.last_stats.new_tokens
    assert tokens / steps > 1.2, f"{kind}/{sources}: {tokens / steps:.2f} tokens per forward"


def test_adaptive_budget_with_a_draft_equals_generate():
    model = _tiny("llama")
    gen = LookaheadGenerator(model, config=LookaheadConfig(cost_cache_dir=""), draft_model=perturbed(model, 0.05))
    ids = torch.tensor([[5, 9, 11, 5, 9, 30, 31]])
    assert torch.equal(gen.generate(ids, max_new_tokens=30), model.generate(ids, max_new_tokens=30, do_sample=False))


@pytest.mark.parametrize("max_new", [1, 2, 3, 17])
def test_draft_at_max_new_tokens_edges(max_new):
    model = _tiny("llama")
    gen = LookaheadGenerator(model, config=LookaheadConfig(budget="fixed", **DRAFT_ONLY),
                             draft_model=perturbed(model, 0.02))
    ids = torch.tensor([[4, 8, 15, 16, 23, 42]])
    assert torch.equal(gen.generate(ids, max_new_tokens=max_new),
                       model.generate(ids, max_new_tokens=max_new, do_sample=False))


def test_draft_stops_at_eos_inside_a_step():
    """EOS set to a token greedy decoding reaches mid-way: the output ends there, like generate's."""
    model = _tiny("llama")
    ids = torch.tensor([[4, 8, 15, 16, 23, 42]])
    free = model.generate(ids, max_new_tokens=30, do_sample=False)[0, ids.shape[1]:].tolist()
    eos = free[12]
    gen = LookaheadGenerator(model, config=LookaheadConfig(budget="fixed", **DRAFT_ONLY),
                             draft_model=perturbed(model, 0.01))
    out = gen.generate(ids, max_new_tokens=30, eos_token_id=eos)
    ref = model.generate(ids, max_new_tokens=30, do_sample=False, eos_token_id=eos, pad_token_id=0)
    assert torch.equal(out, ref[:, :out.shape[1]]) and out[0, -1].item() == eos


# ------------------------------------------------------------------ the draft's cache
@pytest.mark.parametrize("context", [0, 4])
def test_drafter_cache_matches_a_fresh_forward_after_rejections(context):
    """After a decode with rejections, the draft's KV rows equal those of one forward over the
    tokens it says it holds, and those are the output from where it last started over (with
    context 4 it starts over whenever more than 4 tokens wait, from the prompt on)."""
    model = _tiny("llama")
    draft = perturbed(model, 0.2)  # disagrees often: many rejections
    gen = LookaheadGenerator(model, config=LookaheadConfig(budget="fixed", draft_context=context, **DRAFT_ONLY),
                             draft_model=draft)
    ids = torch.tensor([[4, 8, 15, 16, 23, 42]])
    captured, starts = {}, set()
    original = Drafter.sync

    def spy(self, seq, stop):
        captured["drafter"] = self
        captured["seq"] = seq[:stop].copy()
        logits = original(self, seq, stop)
        starts.add(self.start)
        return logits

    Drafter.sync = spy
    try:
        out = gen.generate(ids, max_new_tokens=40)
    finally:
        Drafter.sync = original
    drafter = captured["drafter"]
    assert gen.last_stats.accepted_per_step < gen.last_stats.drafted / gen.last_stats.steps  # rejections happened
    assert (starts == {0}) == (context == 0), starts  # a bounded drafter started over, from the prompt on
    seq = captured["seq"][drafter.start:]  # the last synced text, from where the draft started
    held = drafter.held
    assert context == 0 or min(starts) == ids.shape[1] - context  # the prompt alone was cut to 4 tokens
    assert np.array_equal(held[:len(seq)], seq)  # in step with the last accepted text
    assert np.array_equal(captured["seq"], out[0, :len(captured["seq"])].numpy())
    with torch.inference_mode():
        fresh = transformers.DynamicCache()
        draft(input_ids=torch.from_numpy(held)[None], use_cache=True, **{cache_keyword(draft): fresh})
    assert drafter.cache.get_seq_length() == held.shape[0]
    for mine, ref in zip(drafter.cache.layers, fresh.layers):
        assert torch.allclose(mine.keys, ref.keys, atol=1e-5) and torch.allclose(mine.values, ref.values, atol=1e-5)


def test_bounded_catch_up_starts_over_on_the_recent_text():
    """The docstring's example: context 4, holding seq[0:2] of nine tokens, the next sync reads
    seq[5:9] alone, as a fresh forward over those four would."""
    model = _tiny("llama")
    seq = np.array([4, 8, 15, 16, 23, 42, 7, 9, 11], dtype=np.int64)
    drafter = Drafter(model, context=4)
    drafter.begin(seq, 2)
    drafter.sync(seq, 2)
    assert drafter.pending(seq, 9) == 4 and Drafter(model).pending(seq, 9) == 9
    drafter.sync(seq, 2)  # nothing new: x alone again
    assert drafter.pending(seq, 9) == 4
    logits = drafter.sync(seq, 9)
    assert drafter.start == 5 and np.array_equal(drafter.held, seq[5:9])
    with torch.inference_mode():
        ref = model(input_ids=torch.from_numpy(seq[5:9])[None]).logits[0, -1]
    assert torch.allclose(logits, ref, atol=1e-5)
    assert drafter.pending(seq, 9) == 1 and drafter.forwards == 3  # then in step as usual


# ------------------------------------------------------------------ sampling exactness
@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.fixture(scope="module")
def draft(model):
    return perturbed(model, 0.3, seed=5)


PROMPT = torch.tensor([[1, 3, 2, 5, 4, 1, 3]])
T1 = dict(temperature=1.0, top_k=0, top_p=1.0)


def _sampler(model, draft, **fields) -> LookaheadGenerator:
    return LookaheadGenerator(model, config=LookaheadConfig(budget="fixed", max_tree_nodes=12, **fields),
                              draft_model=draft)


@pytest.mark.parametrize("sources,context", [("draft-only", 64), ("all", 64), ("draft-only", 2)])
def test_sampling_with_a_draft_follows_the_exact_distribution(model, draft, sources, context):
    """Context 2: the draft's q comes from the last two tokens alone (it starts over each step)."""
    gen = _sampler(model, draft, draft_context=context, **(DRAFT_ONLY if sources == "draft-only" else {}))
    counts, one_forward = sample_runs(gen, PROMPT, 2, 2000, seed=21, **T1)  # batch 1: a draft drafts for one
    assert one_forward > 0.1, f"only {one_forward:.0%} of runs took both tokens in one forward"
    assert chi_square_p(counts, exact_distribution(model, PROMPT, 2, **T1), 2000) > P_MIN


def test_sampling_with_a_draft_and_warpers(model, draft):
    settings = dict(temperature=0.7, top_k=5, top_p=1.0, repetition_penalty=1.3)
    gen = _sampler(model, draft)
    counts, one_forward = sample_runs(gen, PROMPT, 2, 2000, seed=22, **settings)
    assert one_forward > 0.1
    assert chi_square_p(counts, exact_distribution(model, PROMPT, 2, **settings), 2000) > P_MIN


def _always_keep(scores, q, drawn, test, u):
    """WRONG on purpose: keep every drawn token (the draft's distribution leaks into the output)."""
    return drawn


def test_harness_catches_a_verifier_that_keeps_every_draw(model, draft, monkeypatch):
    monkeypatch.setattr(verify, "speculative_rows", _always_keep)
    gen = _sampler(model, draft, **DRAFT_ONLY)
    # 600 draws: p underflowed to 0.0 from 500 on, seeds 21-23 (2,000 drew 53 s of the suite for nothing)
    counts, _ = sample_runs(gen, PROMPT, 2, 600, seed=21, **T1)
    assert chi_square_p(counts, exact_distribution(model, PROMPT, 2, **T1), 600) < P_MIN


# ------------------------------------------------------------------ refusals
def test_draft_with_another_vocabulary_is_refused():
    model = _tiny("llama")
    cfg = transformers.LlamaConfig(num_key_value_heads=2, **{**COMMON, "vocab_size": VOCAB + 8})
    other = transformers.LlamaForCausalLM(cfg)
    with pytest.raises(DraftModelError, match=rf"{VOCAB + 8} tokens\) differs from the target's \({VOCAB} tokens"):
        LookaheadGenerator(model, draft_model=other)


class _Vocab:
    def __init__(self, vocab):
        self.vocab = vocab

    def get_vocab(self):
        return dict(self.vocab)


def test_draft_tokenizer_mismatch_is_refused():
    model = _tiny("llama")
    with pytest.raises(DraftModelError, match="does not match the target's"):
        LookaheadGenerator(model, _Vocab({"a": 0, "b": 1}), draft_model=perturbed(model, 0.01),
                           draft_tokenizer=_Vocab({"a": 1, "b": 0}))


def test_draft_that_is_not_a_causal_lm_is_refused():
    model = _tiny("llama")
    with pytest.raises(DraftModelError, match="must be a transformers causal LM"):
        LookaheadGenerator(model, draft_model="qwen2.5-coder-0.5b")
    bert = transformers.BertModel(transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1,
                                                          num_attention_heads=2, intermediate_size=64))
    with pytest.raises(DraftModelError, match="draft_model: "):
        LookaheadGenerator(model, draft_model=bert)


def test_draft_on_another_device_is_refused(monkeypatch):
    model = _tiny("llama")
    draft = perturbed(model, 0.01)
    import lookahead.proposers.draft.checks as check
    real = check.input_device
    monkeypatch.setattr(check, "input_device", lambda m: torch.device("meta") if m is draft else real(m))
    with pytest.raises(DraftModelError, match=r"draft model is on meta but the target on cpu.*allow_draft_device"):
        LookaheadGenerator(model, draft_model=draft)


def test_batch_with_a_draft_is_refused():
    model = _tiny("llama")
    gen = LookaheadGenerator(model, config=LookaheadConfig(budget="fixed"), draft_model=perturbed(model, 0.01))
    with pytest.raises(GenerateInputError, match="batch size 1"):
        gen.generate(torch.tensor([[4, 5, 6], [7, 8, 9]]), max_new_tokens=4)


def test_coverage_docstring_example():
    from lookahead.plan.planner import coverage
    assert coverage(np.array([1, 2, 1, 3]), np.array([.9, .5, .3, .2]), 4).tolist() == [.9, .5, .2, 0.]


def _proposer(model, ratio: float):
    from lookahead.call.decoding import resolve_decoding
    decoding = resolve_decoding(model, 6, torch.device("cpu"), max_new_tokens=8, do_sample=False)
    return DraftProposer(Drafter(perturbed(model, 0.01)), decoding, 8, 1, lambda rows: ratio, 0)


def test_draft_stays_silent_where_its_steps_added_little_lately():
    """Where draft steps lately added few tokens past the free sources' trie per plain step
    they cost (a copy the free sources cover), no draft forward is spent, not even on the
    prompt; where they added many, the chain runs."""
    proposer = _proposer(_tiny("llama"), 0.1)
    seq = np.array([4, 8, 15, 16, 23, 42], dtype=np.int64)
    proposer.begin(seq, 6)
    estimates, covered = np.full((12, 32), 0.9), np.full(32, 0.95)
    assert proposer.draft(seq, 6, 4, estimates, covered=covered, rate=0.5).count == 0
    assert proposer.drafter.forwards == 0  # not even the prompt was fed
    found = proposer.draft(seq, 6, 4, estimates, covered=np.zeros(32), rate=2.0)
    assert found.count >= 1 and found.lens[0] == 8  # estimates of .9: the chain runs to max_tokens
    assert proposer.drafter.held.shape[0] == 6 + 7  # the prompt (x included) and the chain but its last


def test_draft_stays_silent_where_the_plain_step_already_yields_more():
    """The same rate of a draft step pays after a one-token step, not after a step whose free
    tree yields five tokens for 1.5 plain steps: it would lower the step's tokens per second."""
    proposer = _proposer(_tiny("llama"), 0.3)
    seq = np.array([4, 8, 15, 16, 23, 42], dtype=np.int64)
    proposer.begin(seq, 6)
    estimates, covered = np.full((12, 32), 0.9), np.full(32, 0.2)
    assert proposer.draft(seq, 6, 4, estimates, covered=covered, plain=(5.0, 1.5), rate=3.0).count == 0
    assert proposer.drafter.forwards == 0
    found = proposer.draft(seq, 6, 4, estimates, covered=covered, plain=(1.0, 1.0), rate=3.0)
    assert found.count >= 1 and 1 <= found.lens[0] < 8  # stops where one more token lowers the rate


class _CostlySource(DraftProposer):
    """A draft stand-in: the real gate around a chain fixed in advance: proposes 7 8 9 in 0.6 s,
    0.1 s of them a catch-up; one forward costs 0.2 steps."""

    priors = np.full(12, 0.9)

    def __init__(self):
        super().__init__(None, SimpleNamespace(do_sample=False), 8, 0, lambda rows: 0.2, 0)
        self.rates, self.tokens_left = [], []

    def begin(self, seq, stop):
        pass

    def draft(self, seq, stop, limit, estimates, covered=None, plain=(1.0, 1.0), rate=None, tokens_left=None):
        from lookahead.proposers.base import Candidates
        self.rates.append(rate)
        self.tokens_left.append(tokens_left)
        return Candidates(np.array([[7, 8, 9]]), np.array([3]), np.zeros((1, 3), dtype=np.int64), seconds=0.6,
                          catch_up=0.1)


def test_the_draft_efficiency_is_measured_past_the_free_trie():
    """The context matcher proposes 7 8 (a copy), the draft 7 8 9; with 7 8 9 accepted the draft
    alone added one token (9), for 0.5 s of forwards beside the catch-up (2.5 plain steps of
    0.2 s) plus what the target's step cost beyond the free sources' plan."""
    from lookahead.cost import CostModel
    from lookahead.proposers.context import ContextMatcher
    from lookahead.plan.acceptance import AcceptanceStats
    from lookahead.proposers.draft.efficiency import DRAFT_PRIORS, DraftEfficiency
    config = LookaheadConfig(match_min=1)
    matcher, draft = ContextMatcher(1, 4, 2), _CostlySource()
    stats = AcceptanceStats([draft.priors, matcher.priors])
    planner = make_planner(config, [draft, matcher], stats, CostModel(np.array([1.0, 64.0]), np.array([0.2, 0.4])))
    seq = np.array([5, 7, 8, 3, 5], dtype=np.int64)  # x = 5 was followed by 7 8 before
    planner.begin(seq, 5)
    tree, _ = plan_step(planner, seq, 5, tokens_left=16)
    covered, plain = draft.asked.covered, draft.asked.plain
    efficiency = stats.state("draft", DraftEfficiency)  # the draft's own learner, kept in the regime's table
    assert draft.rates == [pytest.approx(DRAFT_PRIORS[efficiency.band(covered)] / 0.2)]  # the prior: one forward
    assert draft.tokens_left == [16]  # the tokens still to come, over which a catch-up must pay
    path = np.array([tree.tokens.tolist().index(t) for t in (7, 8, 9)])  # parents come first: 7 -> 8 -> 9
    assert tree.parents[path].tolist() == [-1, path[0], path[1]]
    planner.learn(tree, path)
    band = efficiency.band(covered)
    extra = max(0.0, float(planner.chooser.cost.step(1 + tree.size) / planner.chooser.cost.step(1)) - plain)
    assert extra > 0  # the merged tree is wider than the free plan
    assert efficiency.tokens[band] == pytest.approx(1.0) and efficiency.cost[band] == pytest.approx(2.5 + extra)
    assert draft.asked is None


def test_draft_efficiency_docstring_example_and_bands():
    from lookahead.proposers.draft.efficiency import DRAFT_PRIORS, DraftEfficiency
    efficiency = DraftEfficiency()
    assert efficiency.rate(0.3, 0.4) == pytest.approx(1.5)
    efficiency.observe(0.3, 10.0, 1)  # draft steps costing ten plain steps at low coverage added one token
    assert efficiency.rate(0.3, 0.4) == pytest.approx((1 + 0.6) / 10.4)
    assert efficiency.rate(0.9, 0.4) == pytest.approx(DRAFT_PRIORS[2] / 0.4)  # another band: untouched
    assert [DraftEfficiency.band(c) for c in (0.3, 0.6, 0.9)] == [0, 1, 2]
    efficiency.observe(0.3, 0.0, 5)  # a silent step only decays
    assert efficiency.tokens[0] == pytest.approx(0.95)


def test_draft_efficiency_drifts_back_to_its_prior_while_silent():
    """A band where drafting stopped paying is tried again: half its prior back after about 60 silent steps."""
    from lookahead.proposers.draft.efficiency import DraftEfficiency
    efficiency = DraftEfficiency()
    efficiency.observe(0.3, 8.0, 0)
    low = efficiency.rate(0.3, 0.4)
    assert low < 0.1
    for _ in range(100):
        efficiency.observe(0.3, 0.0, 0)  # silent steps
    assert efficiency.rate(0.3, 0.4) > 0.75 > low


def test_recoups_docstring_example():
    from lookahead.proposers.draft.proposer import _recoups
    assert _recoups(2.0, 0.5, 1.5, 1.0, 1.0, 100) and not _recoups(2.0, 0.5, 1.5, 1.0, 1.0, 5)
    assert _recoups(50.0, 0.5, 1.5, 1.0, 1.0, None)  # no end in view
    assert not _recoups(0.1, 0.5, 0.9, 1.0, 1.0, 1000)  # a rate below the plain step's saves nothing


def test_a_catch_up_is_paid_only_where_the_remaining_tokens_win_it_back(monkeypatch):
    """Rate 1.5 tokens per plain step, a forward 0.5 steps, a 6-row prompt to read costing
    3 steps: with 4 tokens to go the draft stays silent (and reads nothing); with 100 it
    reads the prompt and drafts, and the catch-up's share of its seconds is set apart.

    The proposer's clock is a counter that reads 0, 1, 2, ... seconds: the first forward ends
    at the second read, 1 s after the start, and all but 0.5 / 3 of it is the catch-up."""
    model = _tiny("llama")
    from lookahead.call.decoding import resolve_decoding
    from lookahead.proposers.draft import proposer as draft_module
    reads = iter(range(1000))
    monkeypatch.setattr(draft_module, "time", SimpleNamespace(perf_counter=lambda: float(next(reads))))
    decoding = resolve_decoding(model, 6, torch.device("cpu"), max_new_tokens=8, do_sample=False)
    proposer = DraftProposer(Drafter(perturbed(model, 0.01)), decoding, 8, 1,
                             lambda rows: 0.5 if rows == 1 else 3.0, 0)
    seq = np.array([4, 8, 15, 16, 23, 42], dtype=np.int64)
    proposer.begin(seq, 6)
    estimates = np.full((12, 32), 0.9)
    silent = proposer.draft(seq, 6, 4, estimates, rate=1.5, tokens_left=4)
    assert silent.count == 0 and proposer.drafter.forwards == 0 and silent.catch_up == 0.0
    found = proposer.draft(seq, 6, 4, estimates, rate=1.5, tokens_left=100)
    assert found.count >= 1 and proposer.drafter.forwards >= 1
    assert found.catch_up == pytest.approx(1.0 - 0.5 / 3.0)
    assert found.seconds > found.catch_up  # the chain's later forwards count as drafting


def test_pays_docstring_example():
    from lookahead.proposers.draft.proposer import _pays
    assert _pays(0.5, 0.4, 1.0, 1.0) and not _pays(0.5, 0.4, 4.0, 1.5)
    assert _pays(0.1, 0.0, 9.0, 1.0) and not _pays(0.0, 0.0, 1.0, 1.0) and not _pays(-0.1, 0.4, 1.0, 1.0)


def test_the_target_curve_learns_without_the_draft_seconds(monkeypatch):
    """A step's seconds include the draft's forwards (a catch-up over the whole prompt among them);
    the target's cost curve must learn from the rest alone, or the draft's presence makes every
    row count look costlier and shrinks the trees."""
    import itertools
    from lookahead.plan.choice import StepChooser
    from lookahead.plan.planner import Planner
    from lookahead.proposers.draft import proposer as draft_module
    reads = itertools.count(1)
    # The draft's clock advances a microsecond a read: its seconds are known to be > 0, not timed.
    monkeypatch.setattr(draft_module, "time", SimpleNamespace(perf_counter=lambda: next(reads) * 1e-6))
    propose = DraftProposer.propose

    def free_propose(self, *args, **kwargs):  # priced free, the draft drafts every step
        self.cost_ratio = lambda rows: 0.0
        return propose(self, *args, **kwargs)

    monkeypatch.setattr(DraftProposer, "propose", free_propose)
    model = _tiny("llama")
    gen = LookaheadGenerator(model, config=LookaheadConfig(cost_cache_dir=""), draft_model=perturbed(model, 0.05))
    spent, observed = [], []
    rank, observe_step = Planner.rank, StepChooser.observe

    def recording_rank(self, *args):
        out = rank(self, *args)
        spent.append(out.seconds)  # one sequence: what the step spent on the draft's forwards
        return out

    def recording_observe(self, rows, seconds):
        observed.append(seconds)
        observe_step(self, rows, seconds)

    monkeypatch.setattr(Planner, "rank", recording_rank)
    monkeypatch.setattr(StepChooser, "observe", recording_observe)
    ids = torch.tensor([[5, 9, 11, 5, 9, 30, 31, 7, 8, 9, 10, 11]])
    gen.generate(ids, max_new_tokens=30)
    steps = np.asarray(gen.last_stats.step_seconds)
    assert len(spent) == len(observed) == steps.shape[0]
    assert gen.last_stats.draft_forwards > 0 and max(spent) > 0, "the draft never ran: the test shows nothing"
    # What the curve learned is the step's time less the draft's, up to the learning itself (the last
    # phase of the step, inside step_seconds and host_seconds, after the time learned was read).
    gap = np.maximum(steps - np.asarray(spent), 0.0) - np.asarray(observed)  # [steps]: the learning phase
    assert (gap >= 0).all() and (gap <= np.asarray(gen.last_stats.host_seconds)).all()
