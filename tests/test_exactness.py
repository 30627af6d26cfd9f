"""The heart of the suite: greedy output == model.generate(do_sample=False), token for token.

Every configuration on the original seven architectures, the CORE
configurations on every other tiny architecture (each one on
support.TESTED_MODEL_TYPES), prompts with and without repetition, over many
verify rounds, with EOS and max_new_tokens falling in the middle of a
multi-token step (three such stops on each of the original seven, one on
each of the others). The adaptive budget runs on conftest's synthetic cost curve.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import BUILDERS, ORIGINAL, VOCAB, reference, tiny_model
from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.cost import CostModel
from lookahead.plan.window import AUTO_WINDOW, auto_window

NEW = 48

CONFIGS = {
    "default": LookaheadConfig(),
    "window": LookaheadConfig(window=3, ngram=3, candidates=4, match_min=1, match_length=6),
    "plain": LookaheadConfig(window=1, ngram=2, candidates=0),
    "w1n2": LookaheadConfig(window=1, ngram=2, candidates=3),
    "pool-only": LookaheadConfig(window=4, ngram=3, candidates=4, context_match=False),
    "match-only": LookaheadConfig(window=1, ngram=2, candidates=6, seed_from_prompt=False,
                                  seed_from_output=False, match_length=9),
    "lade-large": LookaheadConfig(window=8, ngram=5, candidates=12, match_length=10, max_tree_nodes=64),
    "tiny-tree": LookaheadConfig(window=2, ngram=4, candidates=16, max_tree_nodes=3),
    "fixed": LookaheadConfig(budget="fixed"),
    "recycle-only": LookaheadConfig(context_match=False, seed_from_prompt=False, seed_from_output=False,
                                    budget="fixed", max_tree_nodes=12),
    "no-recycle": LookaheadConfig(recycle=False, recycle_width=3, candidates=6),
}


# Configs every architecture runs: the defaults, LADE-sized windows and trees from every source, and
# fixed-size trees grown from recycled tokens alone ("window" runs on every architecture too, in the
# EOS and max_new_tokens mid-step tests below).
CORE = ("default", "lade-large", "recycle-only")
CASES = [(arch, config) for arch in sorted(BUILDERS) for config in sorted(CONFIGS)
         if arch in ORIGINAL or config in CORE]


def prompts() -> dict[str, torch.Tensor]:
    """Repetitive and random prompts (deterministic)."""
    gen = torch.Generator().manual_seed(1234)
    motif = torch.randint(1, VOCAB, (6,), generator=gen)
    return {
        "repeat": torch.cat([motif, motif, motif, motif[:4]])[None],
        "copy": torch.cat([torch.randint(1, VOCAB, (12,), generator=gen), motif, torch.randint(1, VOCAB, (5,), generator=gen), motif[:2]])[None],
        "random": torch.randint(1, VOCAB, (17,), generator=gen)[None],
        "single": torch.tensor([[7]]),
    }


PROMPTS = prompts()


@functools.lru_cache(maxsize=None)
def model_for(arch: str):
    return tiny_model(arch)


@functools.lru_cache(maxsize=None)
def ref_for(arch: str, prompt: str, new: int = NEW, eos: tuple | None = None) -> torch.Tensor:
    eos_arg = list(eos) if eos is not None else [VOCAB + 1000]  # an id that never occurs: no EOS
    return reference(model_for(arch), PROMPTS[prompt], new, eos_token_id=eos_arg)


def run(arch: str, config: LookaheadConfig, prompt: str, new: int = NEW, eos=None):
    gen = LookaheadGenerator(model_for(arch), config=config)
    out = gen.generate(PROMPTS[prompt], max_new_tokens=new,
                       eos_token_id=list(eos) if eos is not None else [VOCAB + 1000])
    return out, gen.last_stats


@pytest.mark.parametrize("arch, config", CASES)
def test_greedy_matches_generate(arch, config):
    accepted_total = steps_total = 0
    for prompt in PROMPTS:
        out, stats = run(arch, CONFIGS[config], prompt)
        assert torch.equal(out, ref_for(arch, prompt)), f"{arch}/{config}/{prompt} diverges from model.generate"
        assert stats.new_tokens == NEW
        assert sum(stats.accepted) == NEW  # every new token comes from a step (x = last prompt token first)
        accepted_total += sum(stats.accepted)
        steps_total += stats.steps
    if config == "plain":
        assert accepted_total == steps_total  # one token per forward, nothing speculated
    else:
        assert accepted_total > steps_total, "speculation never accepted: the test would be vacuous"


def _inside_multi_token_step(stats) -> list[int]:
    """0-based indices of new tokens that are neither the first nor the last of a multi-token step."""
    bounds = np.cumsum([0] + stats.accepted)
    inside = []
    for begin, end in zip(bounds[:-1], bounds[1:]):
        inside.extend(range(begin, end - 1))
    return inside


@pytest.mark.parametrize("arch", sorted(BUILDERS))
def test_eos_in_the_middle_of_a_step(arch):
    """EOS ids given as a list; one fires on a token that is not the last of its step."""
    config = CONFIGS["window"]  # speculates widely: fresh tokens get accepted mid-step
    wanted = 3 if arch in ORIGINAL else 1  # the others: one stop inside a step proves their path
    checked = 0
    for seed in range(4):  # several random models: some loop before any fresh token
        model = tiny_model(arch, seed=seed)
        for ids in PROMPTS.values():
            if checked >= wanted and arch not in ORIGINAL:
                break
            gen = LookaheadGenerator(model, config=config)
            out = gen.generate(ids, max_new_tokens=NEW, eos_token_id=[VOCAB + 1000])
            new = out[0, ids.shape[1]:].tolist()
            inside = [i for i in _inside_multi_token_step(gen.last_stats) if new[i] not in new[:i]]
            for i in inside[:min(2, wanted)]:
                eos = [VOCAB + 1000, new[i]]
                got = gen.generate(ids, max_new_tokens=NEW, eos_token_id=eos)
                assert torch.equal(got, reference(model, ids, NEW, eos_token_id=eos))
                assert got.shape[1] == ids.shape[1] + i + 1  # stops right after the EOS
                assert gen.last_stats.new_tokens == i + 1
                checked += 1
        if checked >= wanted:
            break
    assert checked, "no multi-token step with a fresh token to stop on"


@pytest.mark.parametrize("arch", sorted(BUILDERS))
def test_max_new_tokens_ends_mid_step(arch):
    # A fixed budget: steps speculate whatever a row costs (on a GPU a tiny model's graphed step is so cheap
    # that the adaptive budget can judge speculation not worth its host time and decode plainly).
    config = dataclasses.replace(CONFIGS["window"], budget="fixed")
    _, stats = run(arch, config, "repeat")
    inside = _inside_multi_token_step(stats)
    assert inside
    for i in inside[:3 if arch in ORIGINAL else 1]:
        got, _ = run(arch, config, "repeat", new=i + 1)
        assert torch.equal(got, ref_for(arch, "repeat", new=i + 1))


@pytest.mark.parametrize("new", [0, 1, 2])
def test_tiny_budgets(new):
    got, stats = run("llama", CONFIGS["default"], "repeat", new=new)
    assert torch.equal(got, ref_for("llama", "repeat", new=new)) if new else torch.equal(got, PROMPTS["repeat"])
    assert stats.new_tokens == new


def test_eos_as_first_token():
    first = int(ref_for("qwen2", "random")[0, PROMPTS["random"].shape[1]])
    got, stats = run("qwen2", CONFIGS["default"], "random", eos=(first,))
    assert got[0, -1].item() == first and stats.new_tokens == 1 and stats.steps == 1


def test_eager_attention_is_exact_too():
    model = tiny_model("llama", attn="eager")
    ids = PROMPTS["repeat"]
    gen = LookaheadGenerator(model, config=CONFIGS["default"])
    assert torch.equal(gen.generate(ids, max_new_tokens=NEW), reference(model, ids, NEW))


@pytest.mark.parametrize("arch", ["gemma3", "mistral", "phi3_sliding", "gemma2", "starcoder2", "mixtral"])
def test_sliding_window_is_exercised(arch):
    """The tiny windows (10/12) are far shorter than prompt + 48 new tokens, and the engine masks them."""
    gen = LookaheadGenerator(model_for(arch), config=CONFIGS["plain"])
    assert gen.target.layout.sliding_window is not None
    assert gen.target.layout.sliding_window < PROMPTS["repeat"].shape[1] + NEW


def _with_cost(config: LookaheadConfig, seconds: list[float]) -> LookaheadGenerator:
    """A generator whose cost model is replaced by a hand-made curve over 1..len(seconds) rows."""
    gen = LookaheadGenerator(model_for("llama"), config=config)
    gen.cost = CostModel(np.arange(1, len(seconds) + 1, dtype=np.float64), np.array(seconds))
    return gen


def test_adaptive_budget_decodes_plainly_when_rows_are_dear():
    """Every extra row costs as much as a whole step: no tree can pay, each step is x alone."""
    gen = _with_cost(LookaheadConfig(max_tree_nodes=8), [1.0 + q for q in range(9)])
    gen.cost.smoothing = 0.0  # keep the hand-made curve: no refinement from real steps
    for prompt in ("repeat", "copy"):
        out = gen.generate(PROMPTS[prompt], max_new_tokens=NEW, eos_token_id=[VOCAB + 1000])
        assert torch.equal(out, ref_for("llama", prompt))
        assert set(gen.last_stats.rows_per_step) == {1}


def test_adaptive_budget_verifies_everything_when_rows_are_free():
    """A flat curve: every node with any chance of acceptance pays, so trees fill up to the cap
    (the window left out: auto_window would open it under the tests' curve, 9 rows costing 1.16 steps)."""
    gen = _with_cost(LookaheadConfig(max_tree_nodes=8, auto_window=False), [1.0] * 9)
    gen.cost.smoothing = 0.0
    out = gen.generate(PROMPTS["repeat"], max_new_tokens=NEW, eos_token_id=[VOCAB + 1000])
    assert torch.equal(out, ref_for("llama", "repeat"))
    assert max(gen.last_stats.rows_per_step) == 9  # x + 8 nodes
    assert sum(gen.last_stats.accepted) > gen.last_stats.steps


def test_generator_learns_across_calls_and_stays_exact():
    """Recycled successors and acceptance estimates carry over between generate calls."""
    gen = LookaheadGenerator(model_for("qwen2"), config=LookaheadConfig())
    first = gen.generate(PROMPTS["random"], max_new_tokens=NEW, eos_token_id=[VOCAB + 1000])
    trials = gen.acceptance["greedy"].trials.sum()
    assert (gen.recycled.successors >= 0).any()
    seq = first[0].tolist()
    pairs = {tuple(key) for key in gen.recycled.pair_keys.tolist() if key[0] >= 0}
    assert len(pairs) > 1 and pairs & set(zip(seq, seq[1:]))  # the text's own pairs, among the tree rows'
    again = gen.generate(PROMPTS["random"], max_new_tokens=NEW, eos_token_id=[VOCAB + 1000])
    assert torch.equal(first, again) and torch.equal(again, ref_for("qwen2", "random"))
    assert gen.acceptance["greedy"].trials.sum() != trials


@settings(max_examples=25, deadline=None)
@given(window=st.integers(1, 6), ngram=st.integers(2, 5), candidates=st.integers(0, 8),
       match_length=st.integers(1, 8), max_nodes=st.integers(0, 40), recycle=st.booleans(),
       budget=st.sampled_from(["adaptive", "fixed"]),
       prompt=st.lists(st.integers(1, 12), min_size=1, max_size=30))
def test_any_config_any_prompt_is_exact(window, ngram, candidates, match_length, max_nodes, recycle, budget,
                                        prompt):
    """Property: small alphabets make repetition (and acceptance) likely; output stays exact."""
    config = LookaheadConfig(window=window, ngram=ngram, candidates=candidates, match_length=match_length,
                             max_tree_nodes=max_nodes, recycle=recycle, budget=budget)
    ids = torch.tensor([prompt])
    model = model_for("llama")
    gen = LookaheadGenerator(model, config=config)
    assert torch.equal(gen.generate(ids, max_new_tokens=24), reference(model, ids, 24))


def test_window_width_changing_every_step_stays_exact(monkeypatch):
    """The budget feeds 0..W columns of the window, another number every step (x alone, stale
    columns fed again later): the output stays model.generate's."""
    import itertools
    from lookahead.plan.choice import StepChooser

    original = StepChooser.decide  # (the loop's choice of each step's shape)
    widths = itertools.cycle([3, 0, 1, 2, 3, 1, 0, 2])
    seen = []

    def cycling(self, probs, column_gain, spent=0.0):
        _, size = original(self, probs, column_gain, spent)
        seen.append(next(widths))
        return seen[-1], size

    monkeypatch.setattr(StepChooser, "decide", cycling)
    for arch in ("llama", "gpt2"):
        gen = LookaheadGenerator(model_for(arch), config=LookaheadConfig(window=3, ngram=4, candidates=4))
        for name, ids in PROMPTS.items():
            assert torch.equal(gen.generate(ids, max_new_tokens=NEW), ref_for(arch, name)), (arch, name)
    assert {0, 1, 2, 3} <= set(seen)


def test_flat_budget_curve_opens_the_window_and_stays_exact():
    """budget_curve="flat": every step priced like a one-row step (never refined), so the budget
    feeds the whole window; the output is still model.generate's."""
    gen = LookaheadGenerator(model_for("llama"), config=LookaheadConfig(budget_curve="flat", window=3, ngram=3))
    assert gen.cost.smoothing == 0  # never refined by real steps (flat_curve's own test: test_scoring.py)
    out = gen.generate(PROMPTS["copy"], max_new_tokens=NEW)
    assert torch.equal(out, ref_for("llama", "copy"))
    assert max(gen.last_stats.rows_per_step) >= 3 * 2  # all three columns of two levels were fed


def test_auto_window_opens_where_rows_are_nearly_free():
    """auto_window (pure): the W=15, N=5 window where a step over 1 + max_tree_nodes rows costs at
    most 1.3 one-row steps, with window=1 and the adaptive budget only."""
    rows = np.array([1.0, 8.0, 33.0])
    cheap = CostModel(rows, np.array([1.0, 1.05, 1.2]), smoothing=0.0)
    dear = CostModel(rows, np.array([1.0, 1.4, 3.0]), smoothing=0.0)  # SmolLM2 on a 2-core CPU
    config = LookaheadConfig()
    opened = auto_window(config, cheap)
    assert (opened.window, opened.ngram) == AUTO_WINDOW == (15, 5)
    assert opened == dataclasses.replace(config, window=15, ngram=5)  # nothing else changes
    assert auto_window(config, dear) is config
    assert auto_window(config, None) is config
    for kept in (LookaheadConfig(auto_window=False), LookaheadConfig(window=3, ngram=3),
                 LookaheadConfig(budget="fixed")):
        assert auto_window(kept, cheap) is kept


def test_flat_curve_opens_the_auto_window_and_stays_exact():
    """The default config on a flat curve decodes with the W=15, N=5 window, feeds it, and stays exact;
    under the tests' rising curve (2% a row: 33 rows cost 1.64 one-row steps) it stays x alone."""
    gen = LookaheadGenerator(model_for("llama"), config=LookaheadConfig(budget_curve="flat"))
    assert (gen.config.window, gen.run_config.window, gen.run_config.ngram) == (1, 15, 5)
    assert gen.cost.rows[-1] == 15 * 4 + 32  # measured up to the steps the window makes possible
    rows = []
    for name in ("copy", "random"):
        assert torch.equal(gen.generate(PROMPTS[name], max_new_tokens=NEW), ref_for("llama", name)), name
        rows += gen.last_stats.rows_per_step
    assert max(rows) > 1 + 32  # window rows beyond any tree
    again = LookaheadGenerator(model_for("llama"), config=gen.config, learned=gen.learned)
    assert again.run_config is gen.run_config  # a generator continuing from it keeps the window
    assert LookaheadGenerator(model_for("llama")).run_config.window == 1


@pytest.mark.parametrize("window", [1, 3])
def test_a_config_with_every_source_off_decodes_exactly(window):
    """No candidate source at all (no memory, recycling, pool or matcher; the window alone or x alone):
    the acceptance table has no classes, and decoding is still model.generate's."""
    config = LookaheadConfig(memory_tokens=0, recycle=False, ngram_pool=False, context_match=False, window=window,
                             ngram=3 if window > 1 else 2, auto_window=False)
    gen = LookaheadGenerator(model_for("llama"), config=config)
    for name, ids in PROMPTS.items():
        assert torch.equal(gen.generate(ids, max_new_tokens=NEW), ref_for("llama", name)), name
