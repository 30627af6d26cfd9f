"""Which models the engine can drive, and how their attention must be masked."""

from __future__ import annotations

from dataclasses import dataclass

# Architectures whose greedy output is proven identical to model.generate by
# tests/test_exactness.py (a custom 4-D mask passes through transformers'
# masking utilities as-is, and position ids are honoured).
TESTED_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral", "gpt_neox", "gemma3_text", "gpt2"})
MASKED_ATTENTION = frozenset({"eager", "sdpa"})
KNOWN_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})


class UnsupportedModelError(ValueError):
    """The engine cannot drive this model exactly; the message says why and what to do."""


@dataclass(frozen=True)
class AttentionLayout:
    """Kinds of attention layers ("full_attention", "sliding_attention") and the window size."""

    kinds: frozenset[str]
    sliding_window: int | None


def attention_layout(config) -> AttentionLayout:
    """Read the layer kinds and sliding window of a (text) model config."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
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


def check_model(model, allow_untested: bool) -> AttentionLayout:
    """Raise UnsupportedModelError unless the engine can drive ``model`` exactly."""
    config = model.config
    name = getattr(config, "model_type", type(model).__name__)
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(f"{name} is an encoder-decoder model; lookahead drives decoder-only causal LMs")
    impl = getattr(config, "_attn_implementation", "sdpa")
    if impl not in MASKED_ATTENTION:
        raise UnsupportedModelError(
            f"attention implementation {impl!r} ignores custom 4-D masks; load the model with "
            f"attn_implementation='sdpa' or 'eager'")
    if name not in TESTED_MODEL_TYPES and not allow_untested:
        raise UnsupportedModelError(
            f"model type {name!r} is not among the architectures proven exact "
            f"({', '.join(sorted(TESTED_MODEL_TYPES))}); pass "
            f"LookaheadConfig(allow_untested_models=True) to try it anyway")
    layout = attention_layout(config)
    unknown = layout.kinds - KNOWN_LAYER_TYPES
    if unknown:
        raise UnsupportedModelError(f"{name} has layer types {sorted(unknown)} the 4-D mask cannot express")
    if layout.sliding_window is not None and layout.sliding_window < 1:
        raise UnsupportedModelError(f"{name} has an invalid sliding window {layout.sliding_window}")
    return layout
