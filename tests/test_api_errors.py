"""Every bad input gets a clear, named error; never a traceback from inside torch."""

from __future__ import annotations

import pytest
import torch
from transformers import T5Config, T5ForConditionalGeneration

from conftest import tiny_model
from lookahead import (ConfigError, GenerateInputError, LookaheadConfig, LookaheadGenerator,
                       UnsupportedModelError)
from lookahead.model.support import attention_layout


@pytest.fixture(scope="module")
def gen():
    return LookaheadGenerator(tiny_model("llama"))


@pytest.mark.parametrize("kwargs, words", [
    (dict(window=0), "window must be between 1 and 64"),
    (dict(ngram=1), "ngram must be between 2 and 16"),
    (dict(candidates=-1), "candidates"),
    (dict(window=2.5), "window must be an integer"),
    (dict(match_min=3, match_max=2), "match_max must be between 3"),
    (dict(context_match="yes"), "context_match must be True or False"),
    (dict(pool_capacity=0), "pool_capacity"),
    (dict(budget="auto"), "budget must be one of 'adaptive', 'fixed'"),
    (dict(recycle_width=0), "recycle_width must be between 1 and 64"),
    (dict(recycle=1), "recycle must be True or False"),
    (dict(fair_share=1.5), "fair_share must be a number between 0 and 1, got 1.5"),
    (dict(fair_share="1"), "fair_share must be a number between 0 and 1"),
    (dict(cost_cache_dir=None), "cost_cache_dir must be a path string"),
    (dict(calibration_repeats=0), "calibration_repeats"),
    (dict(draft_context=-1), "draft_context must be >= 0, got -1"),
])
def test_config_rejects_bad_values(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        LookaheadConfig(**kwargs)


def test_config_is_frozen():
    with pytest.raises(AttributeError):
        LookaheadConfig().window = 3


@pytest.mark.parametrize("ids, kwargs, words", [
    (torch.tensor([[1, 2], [3, 4]]), dict(attention_mask=torch.tensor([[1, 1], [0, 0]])), "a prompt is empty"),
    (torch.tensor([[1, 2], [3, 4]]), dict(attention_mask=torch.tensor([[1, 1, 1]])), "attention_mask shape"),
    (torch.zeros(1, 0, dtype=torch.long), {}, "prompt is empty"),
    (torch.tensor([[1.0, 2.0]]), {}, "integer token ids"),
    ([[1, 2]], {}, "torch.LongTensor"),
    (torch.tensor([[1, 500]]), {}, "outside the vocabulary"),
    (torch.tensor([[1, 2]]), dict(attention_mask=torch.tensor([[1, 0]])), "pad on the left"),
    (torch.tensor([[1, 2]]), dict(max_new_tokens=-1), "max_new_tokens must be an integer >= 0"),
    (torch.tensor([[1, 2]]), dict(max_new_tokens=2.0), "max_new_tokens"),
    (torch.tensor([[1, 2]]), dict(do_sample="yes"), "do_sample must be True or False"),
    (torch.tensor([[1, 2]]), dict(do_sample=True, temperature=-1.0), r"temperature must be in \[0.0, inf\]"),
    (torch.tensor([[1, 2]]), dict(do_sample=True, temperature="hot"), "temperature must be a number"),
    (torch.tensor([[1, 2]]), dict(do_sample=True, top_p=1.5), r"top_p must be in \(0.0, 1.0\]"),
    (torch.tensor([[1, 2]]), dict(do_sample=True, top_p=0.0), "top_p must be in"),
    (torch.tensor([[1, 2]]), dict(do_sample=True, top_k=-1), "top_k must be in"),
    (torch.tensor([[1, 2]]), dict(do_sample=True, top_k=2.5), "top_k must be an integer"),
    (torch.tensor([[1, 2]]), dict(do_sample=True, min_p=2.0), "min_p must be in"),
    (torch.tensor([[1, 2]]), dict(repetition_penalty=0.0), "repetition_penalty must be in"),
    (torch.tensor([[1, 2]]), dict(do_sample=True, generator=3), "generator must be a torch.Generator"),
    (torch.tensor([[1, 2]]), dict(logits_processor=[3]), "logits_processor must be a list"),
    (torch.tensor([[1, 2]]), dict(eos_token_id=[-3]), "eos_token_id"),
    (torch.tensor([[1, 2]], device="meta"), {}, "input_ids is on the meta device, which holds shapes but no "
                                                "values: pass real token ids"),
    (torch.tensor([[1, 2]]), dict(attention_mask=torch.ones(1, 2, device="meta")),
     "attention_mask is on the meta device"),
])
def test_generate_rejects_bad_inputs(gen, ids, kwargs, words):
    with pytest.raises(GenerateInputError, match=words):
        gen.generate(ids, **kwargs)


def test_one_dimensional_prompt_is_batch_of_one(gen):
    out = gen.generate(torch.tensor([3, 4, 5]), max_new_tokens=4)
    assert out.shape == (1, 7)


def test_flash_attention_is_refused():
    model = tiny_model("llama")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(UnsupportedModelError, match="sdpa"):
        LookaheadGenerator(model)


def test_untested_architecture_is_refused_unless_allowed():
    model = tiny_model("llama")
    model.config.model_type = "brand_new_arch"
    with pytest.raises(UnsupportedModelError, match="allow_untested_models=True"):
        LookaheadGenerator(model)
    LookaheadGenerator(model, config=LookaheadConfig(allow_untested_models=True))


def test_encoder_decoder_is_refused():
    model = T5ForConditionalGeneration(T5Config(vocab_size=32, d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8))
    with pytest.raises(UnsupportedModelError, match="encoder-decoder"):
        LookaheadGenerator(model)


def test_attention_layout_of_each_kind():
    assert attention_layout(tiny_model("llama").config).kinds == {"full_attention"}
    mistral = attention_layout(tiny_model("mistral").config)
    assert mistral.kinds == {"sliding_attention"} and mistral.sliding_window == 12
    gemma = attention_layout(tiny_model("gemma3").config)
    assert gemma.kinds == {"full_attention", "sliding_attention"} and gemma.sliding_window == 10
    assert attention_layout(tiny_model("qwen2").config).sliding_window is None


def test_config_type_is_checked():
    with pytest.raises(TypeError, match="LookaheadConfig"):
        LookaheadGenerator(tiny_model("llama"), config={"window": 3})
