"""Which architectures the engine claims, drives on request, or refuses: kept honest against transformers.

TESTED_MODEL_TYPES must be exactly the model types tests/test_exactness.py
builds; every other causal-LM type transformers ships is refused, with a
message naming it and the fix (or the reason it can never be driven).
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
import transformers
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from conftest import BUILDERS, tiny_model
from lookahead import LookaheadConfig, LookaheadGenerator, UnsupportedModelError, UntestedModelWarning
from lookahead.model.support import (TESTED_MODEL_TYPES, UNTESTED_FIX, bidirectional_attention, check_architecture,
                               check_model, context_length)

ALLOW = LookaheadConfig(allow_untested_models=True, budget="fixed")  # fixed: no cost curve to measure
SMALL = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)


def test_tested_list_is_exactly_what_the_exactness_suite_builds():
    built = {tiny_model(arch).config.model_type for arch in BUILDERS}
    assert built == TESTED_MODEL_TYPES, (f"claimed without a test: {sorted(TESTED_MODEL_TYPES - built)}; "
                                         f"tested but not claimed: {sorted(built - TESTED_MODEL_TYPES)}")


def test_every_tested_type_is_a_transformers_causal_lm():
    assert TESTED_MODEL_TYPES <= set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


@functools.lru_cache(maxsize=None)
def default_config(model_type: str):
    """transformers' default config of model_type, or None where transformers itself rejects its defaults
    (e.g. gemma4_assistant's validator in 5.23)."""
    try:
        return transformers.AutoConfig.for_model(model_type)
    except Exception:  # noqa: BLE001 (any failure of transformers' own defaults)
        return None


def causal_lm_configs():
    """(model type, default config, model class) of every causal LM transformers ships whose config is of
    no tested type (the class is imported, no model is built).

    A type whose default config cannot be built is checked by its config class: it must not be claimed.
    """
    for model_type, class_name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():
        config = default_config(model_type)
        if config is None:
            assert CONFIG_MAPPING[model_type].model_type not in TESTED_MODEL_TYPES, model_type
            continue
        if config.model_type not in TESTED_MODEL_TYPES:
            yield model_type, config, getattr(transformers, class_name)


def test_aliases_of_tested_types_are_the_tested_classes():
    """A mapping entry whose config is a tested type's (gpt-sw3 -> GPT2Config) names the same model class."""
    for model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        alias_of = CONFIG_MAPPING[model_type].model_type
        if alias_of in TESTED_MODEL_TYPES and alias_of != model_type:
            assert MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type] == MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[alias_of]


def test_most_default_configs_can_be_built():
    """The walk below is only meaningful when it sees nearly every type."""
    broken = [t for t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if default_config(t) is None]
    assert len(broken) < len(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) // 10, broken


def test_every_other_transformers_causal_lm_is_refused_with_a_clear_message():
    """Walks MODEL_FOR_CAUSAL_LM_MAPPING_NAMES: each untested type is refused by default, naming
    itself and either the flag that drives it anyway or why it can never be driven."""
    walked = 0
    for model_type, config, model_class in causal_lm_configs():
        config._attn_implementation = "sdpa"  # noqa: SLF001 (what load_model asks for)
        with pytest.raises(UnsupportedModelError) as refused:
            check_architecture(config, model_class, allow_untested=False)
        message = str(refused.value)
        assert model_type in message or config.model_type in message, message
        assert "allow_untested_models=True" in message or "use model.generate" in message, message
        walked += 1
    assert walked > 50  # transformers ships well over a hundred causal LM types


def test_untested_types_driven_on_request_are_flagged():
    """allow_untested_models=True: each type is either refused for a stated reason or driven with a warning;
    every stateful (recurrent / state-space) class is refused, whatever the flag."""
    flagged = refused = 0
    for model_type, config, model_class in causal_lm_configs():
        config._attn_implementation = "sdpa"  # noqa: SLF001
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                check_architecture(config, model_class, allow_untested=True)
            except UnsupportedModelError as exc:
                assert "use model.generate" in str(exc) or "invalid sliding window" in str(exc), str(exc)
                refused += 1
                continue
        assert not getattr(model_class, "_is_stateful", False), f"{model_type}: a recurrent state was driven"
        assert [w for w in caught if issubclass(w.category, UntestedModelWarning)
                and repr(config.model_type) in str(w.message)], model_type
        flagged += 1
    assert flagged and refused


@pytest.mark.parametrize("make, words", [
    (lambda: transformers.BloomForCausalLM(transformers.BloomConfig(vocab_size=64, hidden_size=32, n_layer=2,
                                                                    n_head=4)), "ALiBi"),
    (lambda: transformers.FalconForCausalLM(transformers.FalconConfig(alibi=True, **SMALL)), "ALiBi"),
    (lambda: transformers.MptForCausalLM(transformers.MptConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4)),
     "ALiBi"),
    (lambda: transformers.MambaForCausalLM(transformers.MambaConfig(vocab_size=64, hidden_size=32,
                                                                    num_hidden_layers=2)), "recurrent state"),
    (lambda: transformers.BertLMHeadModel(transformers.BertConfig(intermediate_size=64, **SMALL)),
     "attends both ways"),
    (lambda: transformers.BertForMaskedLM(transformers.BertConfig(intermediate_size=64, **SMALL)),
     "no generation head"),
    (lambda: transformers.LlamaModel(transformers.LlamaConfig(intermediate_size=64, **SMALL)), "no generation head"),
    (lambda: transformers.T5ForConditionalGeneration(transformers.T5Config(vocab_size=32, d_model=16, d_ff=32,
                                                                           num_layers=1, num_heads=2, d_kv=8)),
     "encoder-decoder"),
])
def test_models_that_cannot_be_driven_are_refused_even_when_untested_ones_are_allowed(make, words):
    torch.manual_seed(0)
    model = make().eval()
    with pytest.raises(UnsupportedModelError, match=words) as refused:
        LookaheadGenerator(model, config=ALLOW)
    assert "allow_untested_models" not in str(refused.value)  # no flag helps


def test_falcon_without_alibi_is_driven():
    """The same architecture with rotary positions is on the tested list (conftest builds it)."""
    assert LookaheadGenerator(tiny_model("falcon"), config=ALLOW).target.layout.kinds == {"full_attention"}


def test_untested_refusal_names_the_flag_and_allowing_warns():
    model = tiny_model("llama")
    model.config.model_type = "brand_new_arch"
    with pytest.raises(UnsupportedModelError, match=r"LookaheadConfig\(allow_untested_models=True\)") as refused:
        LookaheadGenerator(model)
    assert refused.value.fix is UNTESTED_FIX  # the CLI spells it --allow-untested-models
    with pytest.warns(UntestedModelWarning, match="brand_new_arch"):
        LookaheadGenerator(model, config=ALLOW)


def test_no_tested_model_is_taken_for_a_bidirectional_one():
    for arch in BUILDERS:
        assert bidirectional_attention(tiny_model(arch)) is None, arch


def test_bert_as_a_decoder_is_causal_and_merely_untested():
    config = transformers.BertConfig(intermediate_size=64, is_decoder=True, **SMALL)
    model = transformers.BertLMHeadModel(config).eval()
    with pytest.raises(UnsupportedModelError, match="not among the architectures proven exact"):
        check_model(model, allow_untested=False)


def test_context_length_reads_every_spelling():
    assert context_length(tiny_model("llama").config) == 1024  # max_position_embeddings
    assert context_length(tiny_model("gpt2").config) == 1024  # n_positions
    assert context_length(transformers.BloomConfig()) is None  # ALiBi: no position table


def test_sdpa_forced_on_a_model_without_it_is_refused(monkeypatch):
    """A model class that runs eager attention only (GPT-J before transformers 5.24); with sdpa forced
    its attention would skip the causal mask."""
    model = tiny_model("gptj")
    monkeypatch.setattr(type(model), "_supports_sdpa", False)
    model.config._attn_implementation = "sdpa"  # noqa: SLF001
    with pytest.raises(UnsupportedModelError, match="does not support attn_implementation='sdpa'"):
        LookaheadGenerator(model, config=ALLOW)
