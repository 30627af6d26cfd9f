"""Grouped-query attention under a custom mask without repeating the keys and values per head.

A step's rows come with a 4-D mask. Given a mask, transformers' SDPA path
(``sdpa_attention_forward``) cannot use torch's grouped-query attention and
copies every layer's whole past ``num_key_value_groups`` times per step
(``repeat_kv``): work that grows with the context, on every layer, every
step. torch's ``scaled_dot_product_attention(..., enable_gqa=True)`` takes a
mask and reads each key/value head for its query heads in place.

``GroupedAttention`` registers that attention under its own name through
transformers' public extension points (``AttentionInterface`` and
``AttentionMaskInterface``; nothing of transformers is replaced) and, while
entered, sets the model's ``attn_implementation`` to it, putting the user's
back on exit. It applies only to models that run transformers' own SDPA
with grouped heads; any call it does not cover (no mask, training-time
dropout, a softcap, a position bias, attention sinks, ...) goes to
transformers' SDPA function unchanged.

Worked example: 9 query heads over 3 key/value heads (SmolLM2), a step of
8 rows after 300 cached ones: transformers' path copies 2 x 3 x 3 x 308 x 64
floats per layer before attending; this one copies none. The outputs are
the same numbers: both run torch's SDPA kernel over the same heads.

With ``native`` (lookahead's C++ library loaded, native/build.py), float32
steps on the CPU attend through ``lookahead_native::attend`` instead
(``grouped_native``): the same attention for a step's rows and a prompt's
prefill of any length without SDPA's blocking for long queries, each row's keys
split into chunks that both cores share, in the vector width the process's tiled
kernel measured faster (8 lanes, or 16 with AVX-512F), each row's numbers
computed the same way whatever the forward's other rows (native/fused.cpp); what
it does not take (another dtype, a head width not a multiple of 16) goes to
torch's SDPA inside the op.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "lookahead_grouped_sdpa"  # the attention implementation's registered name
NATIVE_NAME = "lookahead_grouped_native"  # ... and with the C++ op
COVERED = frozenset({"sliding_window", "position_ids", "cache_position", "layer_idx", "use_cache"})  # ignorable


def plain(kwargs: dict[str, Any]) -> bool:
    """Whether an attention call's keywords ask for nothing these functions would drop (a softcap, a
    position bias, sinks, ...): each is unset, False, or one they may ignore (COVERED)."""
    return all(v is None or v is False or k in COVERED for k, v in kwargs.items())


def grouped_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """query [B, Hq, Q, D], key and value [B, Hkv, P+Q, D], attention_mask [B or 1, 1, Q, P+Q]
    -> ([B, Q, Hq, D], None), like transformers' ``sdpa_attention_forward``."""
    groups = getattr(module, "num_key_value_groups", 1)
    if groups == 1 or attention_mask is None or dropout or not plain(kwargs) or attention_mask.dtype == torch.bool \
            or query.shape[-1] != value.shape[-1]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling,
                                         enable_gqa=True)  # [B, Hq, Q, D]
    return out.transpose(1, 2).contiguous(), None


def grouped_native(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                   is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """``grouped_sdpa`` through ``lookahead_native::attend`` where it applies (float32 on the CPU, an additive
    mask [B or 1, 1, Q, P+Q], nothing it would drop); otherwise ``grouped_sdpa`` itself."""
    if attention_mask is None and not dropout and plain(kwargs) and query.device.type == "cpu" \
            and query.dtype == torch.float32 and getattr(module, "is_causal", True) and is_causal is not False:
        attention_mask = causal_mask(query.shape[2], key.shape[2], query.dtype)  # (a mask transformers skipped)
    elif attention_mask is not None and attention_mask.dtype == torch.bool and query.dtype == torch.float32:
        # (transformers' boolean masks, True where a key is seen, as the additive mask the op reads)
        attention_mask = torch.zeros(attention_mask.shape, dtype=query.dtype).masked_fill_(
            ~attention_mask, torch.finfo(query.dtype).min)
    if attention_mask is None or dropout or not plain(kwargs) or query.device.type != "cpu" \
            or query.dtype != torch.float32 or attention_mask.dtype != torch.float32 or attention_mask.dim() != 4:
        return grouped_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                            is_causal=is_causal, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return torch.ops.lookahead_native.attend(query, key, value, attention_mask, float(scale)), None


@functools.lru_cache(maxsize=4)  # (every layer of one forward asks for the same mask; it is only read)
def causal_mask(rows: int, keys: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive mask [1, 1, Q, S] of Q causal rows that are the last of S keys (row i sees keys up to
    S - Q + i): what transformers means by no mask and ``is_causal``, written out so that the call attends
    through ``lookahead_native::attend`` as a masked step does. Worked example: (2, 3) -> [[0, 0, min],
    [0, 0, 0]]."""
    hidden = torch.ones(rows, keys, dtype=torch.bool).triu_(keys - rows + 1)  # [Q, S]
    return torch.zeros(rows, keys, dtype=dtype).masked_fill_(hidden, torch.finfo(dtype).min)[None, None]


def native_attention() -> bool:
    """Whether this process has ``lookahead_native::attend`` (native/build.py loads it with the linear op)."""
    ops = getattr(torch.ops, "lookahead_native", None)
    return ops is not None and hasattr(ops, "attend")


def register() -> None:
    """Make ``NAME`` and ``NATIVE_NAME`` known to transformers (idempotent): the attentions above, SDPA's mask
    format."""
    AttentionInterface.register(NAME, grouped_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    AttentionInterface.register(NATIVE_NAME, grouped_native)
    AttentionMaskInterface.register(NATIVE_NAME, sdpa_mask)


def applies(model: torch.nn.Module) -> bool:
    """Whether the model runs transformers' SDPA (or ``NATIVE_NAME``, ``use_native``) with fewer key/value
    heads than query heads."""
    config = getattr(model, "config", None)
    text = config.get_text_config(decoder=True) if config is not None else None
    if text is None or getattr(config, "_attn_implementation", None) not in ("sdpa", NATIVE_NAME):
        return False
    heads = getattr(text, "num_attention_heads", None)
    kv_heads = getattr(text, "num_key_value_heads", None)
    return bool(heads and kv_heads and kv_heads < heads and not getattr(config, "sub_configs", None))


def use_native(model: torch.nn.Module) -> bool:
    """The model attends through ``grouped_native`` for good, ``model.generate`` included (where it applies and
    this process has the C++ op): every forward of it, whoever runs it, then computes a row's attention the
    same way, so ``model.generate`` on it gives lookahead's plain loop's bits. Whether it was switched."""
    if not applies(model) or not native_attention():
        return False
    register()
    model.config._attn_implementation = NATIVE_NAME  # type: ignore[union-attr]
    return True


class GroupedAttention:
    """A model's attention switched to ``grouped_sdpa`` (``native``: ``grouped_native``, where this process has
    the C++ op) while ``switched()`` is entered (where it applies)."""

    def __init__(self, model: torch.nn.Module, native: bool = False):
        self.config: Any = model.config  # a transformers PretrainedConfig
        self.on = applies(model)
        always = getattr(self.config, "_attn_implementation", None) == NATIVE_NAME  # (``use_native``)
        self.native = self.on and (native or always) and native_attention()
        if self.on:
            register()

    @contextmanager
    def switched(self) -> Iterator[None]:
        """The body's forwards attend through grouped_sdpa or grouped_native; the user's implementation is put
        back after."""
        if not self.on or self.config._attn_implementation != "sdpa":
            yield
            return
        self.config._attn_implementation = NATIVE_NAME if self.native else NAME
        try:
            yield
        finally:
            self.config._attn_implementation = "sdpa"
