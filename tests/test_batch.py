"""Batches: row i of a left-padded batch equals model.generate on prompt i alone (greedy, float32);
sampling stays distribution-exact per row; finished rows are padded like model.generate."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from conftest import VOCAB, tiny_model
from lookahead import GenerateInputError, LookaheadConfig, LookaheadGenerator

MOTIF = [5, 9, 13, 17, 21]
PROMPTS = [MOTIF * 3, [7, 8, 9], [40, 41] + MOTIF * 2 + [3], [11]]  # ragged: lengths 15, 3, 13, 1
NEW = 30
NO_EOS = [VOCAB + 1000]


def left_padded(prompts: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids [B, T] and attention_mask [B, T], padded on the left."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def alone(model, prompt: list[int], new: int = NEW, eos=NO_EOS) -> list[int]:
    """model.generate greedy on one unpadded prompt: its new tokens."""
    ids = torch.tensor([prompt], device=model.device)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                             eos_token_id=eos)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "gemma3", "gpt_neox", "gpt2"])
def test_each_row_equals_generate_alone(arch):
    model = tiny_model(arch)
    gen = LookaheadGenerator(model, config=LookaheadConfig(window=2, ngram=3))
    ids, mask = left_padded(PROMPTS)
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=NO_EOS)
    assert out.shape == (len(PROMPTS), ids.shape[1] + NEW)
    assert torch.equal(out[:, :ids.shape[1]], ids)  # the padded prompts come back as given
    for i, prompt in enumerate(PROMPTS):
        assert out[i, ids.shape[1]:].tolist() == alone(model, prompt), f"{arch}: row {i} differs"
    stats = gen.last_stats
    assert stats.new_tokens == NEW * len(PROMPTS)
    assert sum(stats.accepted) > stats.steps * len(PROMPTS), "no row ever accepted a speculated token"


def test_rows_stopping_at_eos_are_padded_like_model_generate():
    """Rows stop at EOS at different steps; each equals its prompt alone, then pad_token_id,
    in the shape model.generate gives the same padded batch."""
    model = tiny_model("llama")
    gen = LookaheadGenerator(model)
    ids, mask = left_padded(PROMPTS)
    firsts = [alone(model, p)[3] for p in PROMPTS]  # an EOS that makes rows stop at different steps
    eos = [firsts[0]]
    with torch.inference_mode():
        ref = model.generate(ids.to(model.device), attention_mask=mask.to(model.device), max_new_tokens=NEW,
                             do_sample=False, eos_token_id=eos,
                             pad_token_id=0)
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=eos)
    for i, prompt in enumerate(PROMPTS):  # row by row against each prompt alone (exact), then the padding
        want = alone(model, prompt, eos=eos)
        assert out[i, ids.shape[1]:ids.shape[1] + len(want)].tolist() == want
        assert (out[i, ids.shape[1] + len(want):] == 0).all()
    assert out.shape == ref.shape  # (tokens may differ in float noise: batched model.generate pads too)


def test_rows_that_finish_leave_the_batch():
    model = tiny_model("qwen2")
    gen = LookaheadGenerator(model, config=LookaheadConfig(budget="fixed", max_tree_nodes=4))
    ids, mask = left_padded(PROMPTS)
    eos = [alone(model, PROMPTS[1])[2]]  # row 1 ends after 3 tokens
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=eos)
    rows = gen.last_stats.rows_per_step
    assert rows[-1] < rows[0] or len(set(rows)) > 1  # fewer rows once some finished
    for i, prompt in enumerate(PROMPTS):
        want = alone(model, prompt, eos=eos)
        assert out[i, ids.shape[1]:ids.shape[1] + len(want)].tolist() == want


def test_single_prompt_with_left_padding():
    model = tiny_model("llama")
    gen = LookaheadGenerator(model)
    ids, mask = left_padded([[7, 8, 9, 7, 8]], pad=0)
    ids, mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], 1), torch.cat([torch.zeros(1, 3, dtype=torch.long), mask], 1)
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=NO_EOS)
    assert out.shape == (1, ids.shape[1] + NEW)
    assert out[0, ids.shape[1]:].tolist() == alone(model, [7, 8, 9, 7, 8])


def test_right_padding_and_streamers_are_refused():
    gen = LookaheadGenerator(tiny_model("llama"))
    ids, _ = left_padded(PROMPTS)
    with pytest.raises(GenerateInputError, match="pad on the left"):
        gen.generate(torch.tensor([[3, 4, 0]]), attention_mask=torch.tensor([[1, 1, 0]]))
    with pytest.raises(GenerateInputError, match="streamer"):
        gen.generate(ids, attention_mask=(ids != 0).long(), streamer=object())


def test_sampled_rows_follow_their_own_distribution():
    """Row 1 of a sampled batch has the same first-token law as the prompt sampled alone
    (chi-square against model.generate's exact first-token distribution)."""
    model = tiny_model("llama")
    gen = LookaheadGenerator(model, config=LookaheadConfig(budget="fixed", max_tree_nodes=8))
    ids, mask = left_padded([MOTIF * 2, [7, 8, 9]])
    with torch.inference_mode():
        probs = torch.softmax(model(torch.tensor([[7, 8, 9]], device=model.device)).logits[0, -1].double().cpu() / 0.5, -1)
    torch.manual_seed(0)
    counts = Counter()
    for _ in range(400):
        out = gen.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=True, temperature=0.5,
                           top_k=0, eos_token_id=NO_EOS)
        counts[int(out[1, ids.shape[1]])] += 1
    from test_sampling import chi_square_p
    assert chi_square_p(counts, dict(enumerate(probs.tolist())), 400) > 1e-3
