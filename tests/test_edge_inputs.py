"""Hostile and edge input to generate(): a clear error or exactly model.generate's answer, never a torch traceback.

Single sequences, left-padded batches (batch.py) and model.generate(custom_generate=...) (hf.py) alike.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import transformers

import lookahead.cost.store as cost_store
import lookahead.cost.policy as engine
from conftest import COMMON, VOCAB, reference, tiny_model
from lookahead import (ContextLimitWarning, CustomGenerate, GenerateInputError, LookaheadConfig, LookaheadGenerator,
                       ProcessorOutputError)
from lookahead.call.output import OutputBuffer
from lookahead.model.support import attention_layout

NO_EOS = [VOCAB + 1000]
WIDE = LookaheadConfig(window=3, ngram=4, candidates=8, match_min=1, match_length=12, max_tree_nodes=48,
                       budget="fixed")  # speculates as deep as it can: rows far past x


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def gen(llama):
    return LookaheadGenerator(llama)


PROMPT = torch.tensor([[5, 6, 7, 5, 6, 7, 5]])


def test_numpy_integers_are_accepted_like_transformers_does(gen, llama):
    out = gen.generate(PROMPT, max_new_tokens=np.int64(8), eos_token_id=np.int64(VOCAB + 1000))
    assert torch.equal(out, reference(llama, PROMPT, 8, eos_token_id=NO_EOS))
    first = int(out[0, PROMPT.shape[1]])
    stopped = gen.generate(PROMPT, max_new_tokens=np.int32(8), eos_token_id=np.array([VOCAB + 1000, first]))
    assert stopped.shape[1] == PROMPT.shape[1] + 1 and int(stopped[0, -1]) == first
    assert gen.generate(PROMPT, max_new_tokens=torch.tensor(3)).shape[1] == PROMPT.shape[1] + 3


def test_numpy_integers_behind_model_generate(llama):
    """custom_generate: transformers reads the numpy integers, lookahead decodes what it prepared."""
    settings = dict(attention_mask=torch.ones_like(PROMPT), do_sample=False, max_new_tokens=np.int64(8),
                    eos_token_id=np.int64(VOCAB + 1000))
    with torch.inference_mode():
        out = llama.generate(PROMPT, custom_generate=CustomGenerate(), **settings)
    assert torch.equal(out, reference(llama, PROMPT, 8, eos_token_id=NO_EOS))


@pytest.mark.parametrize("mask", [[[1] * 7], [1] * 7, np.ones((1, 7)), np.ones(7, dtype=np.int64)])
def test_attention_mask_as_a_list_or_array_is_accepted(gen, llama, mask):
    """model.generate takes a tensor; a list or numpy array of the same 0s and 1s means the same here."""
    out = gen.generate(PROMPT, attention_mask=mask, max_new_tokens=6, eos_token_id=NO_EOS)
    assert torch.equal(out, reference(llama, PROMPT, 6, eos_token_id=NO_EOS))


def test_attention_mask_list_of_a_padded_batch(gen, llama):
    ids = torch.tensor([[0, 0, 5, 6, 7], [9, 5, 6, 7, 5]])
    out = gen.generate(ids, attention_mask=[[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], max_new_tokens=5, eos_token_id=NO_EOS)
    for row, prompt in enumerate(([5, 6, 7], [9, 5, 6, 7, 5])):
        alone = torch.tensor([prompt])
        assert out[row, 5:].tolist() == reference(llama, alone, 5, eos_token_id=NO_EOS)[0, len(prompt):].tolist()


@pytest.mark.parametrize("kwargs, words", [
    (dict(attention_mask="ones"), "attention_mask must be 0s and 1s shaped like input_ids"),
    (dict(attention_mask=[[1, 1], [1]]), "attention_mask must be 0s and 1s shaped like input_ids"),
    (dict(attention_mask=[[1] * 6]), r"attention_mask shape \(1, 6\) != input_ids shape \(1, 7\)"),
    (dict(max_new_tokens=np.float64(8.0)), "max_new_tokens must be an integer"),
    (dict(max_new_tokens=True), "max_new_tokens must be an integer"),
    (dict(max_new_tokens="8"), "max_new_tokens must be an integer"),
    (dict(eos_token_id="2"), "eos_token_id must be a token id"),
    (dict(eos_token_id=[2.5]), "eos_token_id must be a token id"),
    (dict(eos_token_id=np.int64(-1)), "eos_token_id must be a token id"),
])
def test_bad_edge_values_get_named_errors(gen, kwargs, words):
    with pytest.raises(GenerateInputError, match=words):
        gen.generate(PROMPT, **kwargs)


@pytest.mark.parametrize("huge", [10_000_000_000, 10 ** 20])
def test_huge_max_new_tokens_allocates_nothing_up_front(huge):
    """The buffer grows as tokens arrive: a huge budget that EOS ends early is fine (the context caps the rest)."""
    model = tiny_model("qwen2")
    gen = LookaheadGenerator(model, config=WIDE)
    first = int(reference(model, PROMPT, 1, eos_token_id=NO_EOS)[0, -1])
    out = gen.generate(PROMPT, max_new_tokens=huge, eos_token_id=first)
    assert torch.equal(out, reference(model, PROMPT, 20, eos_token_id=[first]))


def short_context(arch: str, context: int):
    """A tiny model whose position table holds only ``context`` positions (learned ones for gpt2/opt)."""
    torch.manual_seed(0)
    if arch == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=context, initializer_range=0.2,
            bos_token_id=1, eos_token_id=2))
    elif arch == "opt":
        model = transformers.OPTForCausalLM(transformers.OPTConfig(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, ffn_dim=128, num_attention_heads=4,
            max_position_embeddings=context, pad_token_id=0, bos_token_id=1, eos_token_id=2))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**COMMON,
                                                                          "max_position_embeddings": context}))
    model.generation_config.pad_token_id = 0
    return model.eval()


@pytest.mark.parametrize("arch", ["gpt2", "opt", "llama"])
def test_generation_that_fills_the_context_exactly_is_exact(arch):
    """Prompt + max_new_tokens == the context: no speculative row may reach past it (learned positions
    would raise an IndexError inside torch), and the tokens are model.generate's."""
    model = short_context(arch, 40)
    prompt = torch.tensor([[3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 5, 6]])  # 24
    gen = LookaheadGenerator(model, config=WIDE)
    out = gen.generate(prompt, max_new_tokens=16, eos_token_id=NO_EOS)
    assert torch.equal(out, reference(model, prompt, 16, eos_token_id=NO_EOS))
    assert max(gen.last_stats.rows_per_step) > 1  # it did speculate


@pytest.mark.parametrize("arch, asked", [("gpt2", 100), ("llama", 100), ("gpt2", 10 ** 20)])
def test_generation_past_the_context_stops_there_with_a_warning(arch, asked):
    model = short_context(arch, 40)
    prompt = torch.arange(3, 27)[None]  # 24 tokens
    gen = LookaheadGenerator(model, config=WIDE)
    with pytest.warns(ContextLimitWarning, match="max_position_embeddings 40"):
        out = gen.generate(prompt, max_new_tokens=asked, eos_token_id=NO_EOS)
    assert out.shape[1] == 40
    assert torch.equal(out, reference(model, prompt, 16, eos_token_id=NO_EOS))


def test_batch_rows_stop_at_their_own_context():
    """Each row's positions count from its first real token: a short row may run further than a long one.
    GPT-2's learned positions would fail on any row fed past 39."""
    model = short_context("gpt2", 40)
    prompts = [list(range(3, 27)), [5, 6, 7, 5, 6, 7, 5, 6]]  # 24 and 8 tokens: 16 and 32 left in the context
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    gen = LookaheadGenerator(model, config=WIDE)
    with pytest.warns(ContextLimitWarning) as caught:
        out = gen.generate(ids, attention_mask=mask, max_new_tokens=100, eos_token_id=NO_EOS)
    assert sorted(str(w.message).split(" new tokens")[0] for w in caught
                  if issubclass(w.category, ContextLimitWarning)) == ["generation stopped after 16",
                                                                       "generation stopped after 32"]
    assert out.shape == (2, width + 32)
    for row, prompt in enumerate(prompts):
        context_left = 40 - len(prompt)
        alone = reference(model, torch.tensor([prompt]), context_left, eos_token_id=NO_EOS)[0, len(prompt):]
        assert torch.equal(out[row, width:width + context_left], alone)
        assert bool((out[row, width + context_left:] == 0).all())  # the shorter row is padded like model.generate


def test_batch_with_a_prompt_that_fills_the_context_is_refused():
    gen = LookaheadGenerator(short_context("gpt2", 40), config=WIDE)
    ids = torch.cat([torch.zeros(1, 38, dtype=torch.long), torch.arange(3, 5)[None]], 1)
    ids = torch.cat([ids, torch.randint(1, VOCAB, (1, 40))])  # row 0: 2 tokens after padding, row 1: 40
    mask = torch.cat([torch.cat([torch.zeros(1, 38), torch.ones(1, 2)], 1), torch.ones(1, 40)]).long()
    with pytest.raises(GenerateInputError, match="prompt has 40 tokens.* is 40"):
        gen.generate(ids, attention_mask=mask, max_new_tokens=4)


def test_past_the_context_behind_model_generate():
    """custom_generate stops at the context with the same warning (plain model.generate fails there on
    GPT-2: an IndexError in its position table)."""
    model = short_context("gpt2", 40)
    prompt = torch.arange(3, 27)[None]
    with pytest.warns(ContextLimitWarning, match="max_position_embeddings 40"), torch.inference_mode():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=100, do_sample=False,
                             eos_token_id=NO_EOS, custom_generate=CustomGenerate())
    assert torch.equal(out, reference(model, prompt, 16, eos_token_id=NO_EOS))


def test_no_context_warning_when_eos_comes_first():
    model = short_context("llama", 40)
    prompt = torch.arange(3, 27)[None]
    first = int(reference(model, prompt, 1, eos_token_id=NO_EOS)[0, -1])
    gen = LookaheadGenerator(model, config=WIDE)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = gen.generate(prompt, max_new_tokens=100, eos_token_id=first)
    assert out.shape[1] == prompt.shape[1] + 1
    assert not [w for w in caught if issubclass(w.category, ContextLimitWarning)]


def test_output_buffer_of_a_huge_budget_starts_small():
    buffer = OutputBuffer(np.arange(1, 8), 10 ** 20, np.zeros(0, dtype=np.int64))
    assert buffer.seq.shape[0] <= 7 + OutputBuffer.GROWTH + 1
    assert not buffer.append(np.arange(1, 600))  # grows as tokens arrive, far from the budget
    assert buffer.new_tokens == 599 and buffer.seq.shape[0] < 2000


@pytest.mark.parametrize("length", [40, 41, 60])
def test_prompt_that_fills_the_context_is_refused(length):
    gen = LookaheadGenerator(short_context("gpt2", 40), config=WIDE)
    with pytest.raises(GenerateInputError, match="max_position_embeddings.* is 40.*at most 39 tokens"):
        gen.generate(torch.randint(1, VOCAB, (1, length)), max_new_tokens=4)


def test_cost_curve_is_measured_inside_a_short_context(monkeypatch):
    """The adaptive budget's calibration context (256 by default) is cut to fit a 40-position model;
    the rows measured after it are fed positions clamped to the context."""
    monkeypatch.setattr(engine, "load_cost_model", cost_store.load_cost_model)  # measure for real here
    model = short_context("gpt2", 40)
    gen = LookaheadGenerator(model, config=LookaheadConfig(cost_cache_dir=""))
    prompt = torch.arange(3, 27)[None]
    assert gen.cost is not None
    assert torch.equal(gen.generate(prompt, max_new_tokens=16, eos_token_id=NO_EOS),
                       reference(model, prompt, 16, eos_token_id=NO_EOS))


def test_a_cost_cache_dir_that_cannot_be_written_says_why_and_how_to_fix_it(tmp_path, monkeypatch, capsys):
    """The line after a measurement names the directory, the reason and the option; nothing claims 'cached in'."""
    monkeypatch.setattr(cost_store, "decode_step_timer", lambda *args, **kwargs: lambda q, route=None: 0.01 + 0.001 * q)
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # a file where the cache directory should be
    model = tiny_model("llama")
    cost = cost_store.load_cost_model(model, attention_layout(model.config), 4, 8, 1, str(blocked / "costs"))
    after = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"not cached: {blocked / 'costs'} cannot be written (Not a directory)" in after
    assert "pass a writable --cost-cache-dir DIR (cost_cache_dir), or ''" in after and "cached in" not in after
    assert cost.rows.tolist() == [1, 2, 3, 4]  # decoding goes on with the measured curve


class FillScores(transformers.LogitsProcessor):
    """Every score becomes ``value`` (NaN or -inf): no distribution is left to sample from."""

    def __init__(self, value: float):
        self.value = value

    def __call__(self, input_ids, scores):
        return torch.full_like(scores, self.value)


@pytest.mark.parametrize("value", [float("nan"), float("-inf")])
@pytest.mark.parametrize("top_k", [0, 50])  # the full softmax, and the top-k fast path (verify.sample_top_k)
def test_processor_output_with_nothing_to_sample_is_named(gen, llama, value, top_k):
    with pytest.raises(RuntimeError, match="probability tensor contains"):  # what model.generate says
        llama.generate(PROMPT, max_new_tokens=4, do_sample=True, top_k=top_k, logits_processor=[FillScores(value)])
    with pytest.raises(ProcessorOutputError, match=r"after the logits processors \(FillScores.*the scores hold NaN "
                                                   r"or \+inf, or all are -inf.*fix or drop the logits_processor"):
        gen.generate(PROMPT, max_new_tokens=4, do_sample=True, top_k=top_k, logits_processor=[FillScores(value)])


def test_processor_output_with_nothing_to_sample_in_a_batch(gen):
    ids = torch.tensor([[0, 0, 5, 6, 7], [9, 5, 6, 7, 5]])
    with pytest.raises(ProcessorOutputError, match="fix or drop the logits_processor"):
        gen.generate(ids, attention_mask=(ids != 0).long(), max_new_tokens=4, do_sample=True,
                     logits_processor=[FillScores(float("nan"))])


class NaNAfter(transformers.LogitsProcessor):
    """NaN scores after ``token``, which ``token``'s own score of -inf keeps from ever being sampled."""

    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids, scores):
        scores = torch.where((input_ids[:, -1] == self.token)[:, None], float("nan"), scores)
        return scores.index_fill(1, torch.tensor([self.token], device=scores.device), float("-inf"))


def test_nan_scores_off_the_sampled_path_are_no_error(llama):
    """Speculated rows after token 6 hold NaN scores, but 6 is never drawn: model.generate never sees
    them, so lookahead neither raises nor emits anything but real draws."""
    gen = LookaheadGenerator(llama, config=WIDE)
    prompt = torch.tensor([[5, 6, 5, 6, 5, 6, 5]])  # the n-grams propose 6 after 5 at every step
    out = gen.generate(prompt, max_new_tokens=12, do_sample=True, logits_processor=[NaNAfter(6)],
                       eos_token_id=NO_EOS)
    new = out[0, prompt.shape[1]:]
    assert new.shape[0] == 12 and 6 not in new.tolist() and bool(((new >= 0) & (new < VOCAB)).all())
    assert gen.last_stats.steps <= 12
