"""Tiny random-initialised models of several architectures, built in-process (no hub)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from lookahead.costmodel import CostModel, row_grid

VOCAB = 96

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
              num_attention_heads=4, max_position_embeddings=1024, pad_token_id=0)


def _llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=2, **COMMON))


def _qwen2():
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(num_key_value_heads=2, **COMMON))


def _qwen3():
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(num_key_value_heads=2, head_dim=16, **COMMON))


def _mistral():
    # every layer uses a sliding window shorter than the generated text
    return transformers.MistralForCausalLM(transformers.MistralConfig(num_key_value_heads=2, sliding_window=12, **COMMON))


def _gemma3():
    # mixed sliding (window 10) and full layers
    cfg = transformers.Gemma3TextConfig(num_key_value_heads=2, head_dim=16, sliding_window=10,
                                        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                        **COMMON)
    return transformers.Gemma3ForCausalLM(cfg)


def _gpt_neox():
    cfg = transformers.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                     num_attention_heads=4, max_position_embeddings=1024, pad_token_id=0)
    return transformers.GPTNeoXForCausalLM(cfg)


def _gpt2():
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=3, n_head=4, n_positions=1024, pad_token_id=0,
                                  bos_token_id=1, eos_token_id=2, initializer_range=0.2)
    return transformers.GPT2LMHeadModel(cfg)


BUILDERS = {"llama": _llama, "qwen2": _qwen2, "qwen3": _qwen3, "mistral": _mistral, "gemma3": _gemma3,
            "gpt_neox": _gpt_neox, "gpt2": _gpt2}


def tiny_model(arch: str, seed: int = 0, attn: str = "sdpa"):
    """A tiny random model of ``arch`` in float32 eval mode, deterministic in seed."""
    torch.manual_seed(seed)
    model = BUILDERS[arch]()
    model.config._attn_implementation = attn  # noqa: SLF001 (public setter path differs across 5.x)
    model.generation_config.pad_token_id = 0
    return model.eval()


def tiny_tokenizer():
    """A character-level tokenizer over the tiny models' VOCAB ids, built in-process (no hub):
    <pad> <s> </s>, then one character each, '!' (id 3) up to '}' (id 95)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2}
    vocab.update({chr(33 + i): 3 + i for i in range(VOCAB - 3)})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<pad>"))  # no merges: one token per char
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="session", autouse=True)
def synthetic_cost_curves():
    """Generators built by the tests get a fixed, mildly rising cost curve (2% more per row,
    no online refinement) instead of measuring this machine: a test's trees must not depend
    on how busy the CPU is (a curve measured under load can make every tree unprofitable).
    tests/test_scoring.py measures real curves through costmodel.load_cost_model itself."""
    import lookahead.engine as engine

    def load(model, layout, max_rows, context, repeats, cache_dir, batch=1):
        rows = np.array(row_grid(max_rows), dtype=np.float64)
        return CostModel(rows, 0.01 * batch * (1.0 + 0.02 * (rows - 1)), smoothing=0.0)

    patch = pytest.MonkeyPatch()
    patch.setattr(engine, "load_cost_model", load)
    yield
    patch.undo()


@pytest.fixture(scope="session", params=sorted(BUILDERS))
def arch_model(request):
    """(arch name, model) for every tiny architecture."""
    return request.param, tiny_model(request.param)


def reference(model, ids, max_new_tokens, eos_token_id=None):
    """model.generate greedy, the ground truth."""
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False)
    if eos_token_id is not None:
        kwargs["eos_token_id"] = eos_token_id
    with torch.inference_mode():
        return model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
