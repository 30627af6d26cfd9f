"""Which models the engine can drive, and how their attention must be masked."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import OptionFix, UnsupportedModelError, UntestedModelWarning, with_fix

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel

# Architectures whose greedy output is proven identical to model.generate by
# tests/test_exactness.py (a custom 4-D mask passes through transformers'
# masking utilities as-is, and position ids are honoured). tests/test_support.py
# checks that this is exactly the set of model types the exactness suite builds.
TESTED_MODEL_TYPES = frozenset({
    "llama", "qwen2", "qwen3", "mistral", "gpt_neox", "gemma3_text", "gpt2",
    "phi3", "olmo", "olmo2", "stablelm", "granite", "falcon", "opt", "gptj", "codegen", "gemma", "gemma2",
    "cohere", "starcoder2", "phi", "gpt_bigcode", "mixtral", "smollm3", "glm4",
})
MASKED_ATTENTION = frozenset({"eager", "sdpa"})
# ... and those lookahead itself switches a model to (model/attention.py), which take them too
DRIVEN_ATTENTION = MASKED_ATTENTION | {"lookahead_grouped_sdpa", "lookahead_grouped_native"}
KNOWN_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})
# layer types whose layers carry a recurrent state through the sequence (transformers names them so since it
# dropped the models' _is_stateful flag): refused as recurrent, not as an unknown layout
RECURRENT_LAYER_TYPES = frozenset({"linear_attention", "mamba", "mamba2", "recurrent", "rwkv", "conv"})
ALIBI_MODEL_TYPES = frozenset({"bloom"})  # ALiBi always, with no switch in the config
UNTESTED_FIX = OptionFix("allow_untested_models", "LookaheadConfig(allow_untested_models=True)", "to try it anyway")


@dataclass(frozen=True)
class AttentionLayout:
    """Kinds of attention layers ("full_attention", "sliding_attention") and the window size."""

    kinds: frozenset[str]
    sliding_window: int | None


def text_config(config: PretrainedConfig) -> PretrainedConfig:
    """The decoder's (text) config of a model config."""
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def attention_layout(config: PretrainedConfig) -> AttentionLayout:
    """Read the layer kinds and sliding window of a (text) model config."""
    text = text_config(config)
    window = getattr(text, "sliding_window", None)
    if getattr(text, "use_sliding_window", True) is False:
        window = None
    types = getattr(text, "layer_types", None)
    if not types:
        types = ["sliding_attention" if window else "full_attention"]
    kinds = frozenset(types)
    if "sliding_attention" not in kinds:
        window = None
    return AttentionLayout(kinds, window)


def context_length(config: PretrainedConfig) -> int | None:
    """The model's context (max_position_embeddings; n_positions is mapped onto it), or None."""
    value = getattr(text_config(config), "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def uses_alibi(config: PretrainedConfig) -> bool:
    """Whether attention is biased by ALiBi (bloom; falcon with alibi=True; mpt; ...)."""
    text = text_config(config)
    attn = getattr(text, "attn_config", None)
    attn_alibi = attn.get("alibi") if isinstance(attn, dict) else getattr(attn, "alibi", False)
    return (getattr(text, "model_type", None) in ALIBI_MODEL_TYPES or getattr(text, "alibi", False) is True
            or attn_alibi is True or getattr(text, "position_embedding_type", None) == "alibi")


def refusal(config: PretrainedConfig, model_class: type[Any] | None = None) -> str | None:
    """Why the engine can never drive this architecture exactly, or None when nothing is known against it."""
    name = getattr(config, "model_type", None) or getattr(model_class, "__name__", "this model")
    if getattr(config, "is_encoder_decoder", False):
        return f"{name} is an encoder-decoder model; lookahead drives decoder-only causal LMs (use model.generate)"
    if model_class is not None and hasattr(model_class, "can_generate") and not model_class.can_generate():
        return (f"{model_class.__name__} has no generation head; load a causal LM "
                f"(AutoModelForCausalLM / load_model) to decode with lookahead")
    stateful = model_class is not None and getattr(model_class, "_is_stateful", False)
    if stateful or attention_layout(config).kinds & RECURRENT_LAYER_TYPES:
        return (f"{name} keeps a recurrent state that cannot be rolled back to a prefix (like assisted "
                f"generation, lookahead must discard rejected tokens); use model.generate")
    if uses_alibi(config):
        return (f"{name} uses ALiBi position biases, which transformers builds from a 2-D padding mask: "
                f"the step's 4-D tree mask and explicit positions cannot reach them; use model.generate")
    unknown = attention_layout(config).kinds - KNOWN_LAYER_TYPES
    if unknown:
        return (f"{name} has layer types {sorted(unknown)} the 4-D mask cannot express "
                f"(only {sorted(KNOWN_LAYER_TYPES)}); use model.generate")
    window = attention_layout(config).sliding_window
    if window is not None and window < 1:
        return f"{name} has an invalid sliding window {window}"
    return None


def bidirectional_attention(model: torch.nn.Module) -> str | None:
    """The first self-attention module that attends both ways (is_causal False), or None."""
    for path, module in model.named_modules():
        cross = getattr(module, "is_cross_attention", False) or "cross" in path or "encoder_attn" in path
        if getattr(module, "is_causal", True) is False and not cross:
            return path
    return None


def check_architecture(config: PretrainedConfig, model_class: type[Any] | None,
                       allow_untested: bool) -> AttentionLayout:
    """Raise UnsupportedModelError unless an architecture can be driven; warn when it is untested."""
    name = getattr(config, "model_type", None) or getattr(model_class, "__name__", "this model")
    reason = refusal(config, model_class)
    if reason is not None:
        raise UnsupportedModelError(reason)
    impl = getattr(config, "_attn_implementation", "sdpa")
    if impl not in DRIVEN_ATTENTION:
        raise UnsupportedModelError(
            f"attention implementation {impl!r} ignores custom 4-D masks; load the model with "
            f"attn_implementation='sdpa' or 'eager'")
    if name not in TESTED_MODEL_TYPES:
        problem = (f"model type {name!r} is not among the architectures proven exact "
                   f"({', '.join(sorted(TESTED_MODEL_TYPES))})")
        if not allow_untested:
            raise with_fix(UnsupportedModelError, problem, UNTESTED_FIX)
        warnings.warn(f"{problem}; driving it anyway as asked (allow_untested_models): compare a few outputs "
                      f"with model.generate before relying on them", UntestedModelWarning, stacklevel=4)
    return attention_layout(config)


def check_model(model: PreTrainedModel, allow_untested: bool) -> AttentionLayout:
    """Raise UnsupportedModelError unless the engine can drive ``model`` exactly."""
    config = model.config
    name = getattr(config, "model_type", type(model).__name__)
    reason = refusal(config, type(model))
    if reason is None and (path := bidirectional_attention(model)) is not None:
        reason = (f"{name} attends both ways ({path} is not causal; e.g. a BERT-style model without "
                  f"is_decoder=True): lookahead drives causal LMs only")
    if reason is not None:
        raise UnsupportedModelError(reason)
    if getattr(config, "_attn_implementation", None) == "sdpa" and getattr(model, "_supports_sdpa", True) is False:
        raise UnsupportedModelError(
            f"{name} does not support attn_implementation='sdpa' (set anyway, its attention would skip the "
            f"causal mask); load it with attn_implementation='eager', which load_model picks for it by default")
    return check_architecture(config, type(model), allow_untested)
