"""4-D attention masks for one step, per layer kind (full / sliding window).

A step's rows see the whole KV prefix (subject to a sliding window) and,
among themselves, what ``local_mask`` allows (tree.py builds it). A stock
transformers 5.x model takes such a mask as-is together with explicit
position ids; models that mix full and sliding layers take a dict of masks.
"""

from __future__ import annotations

import torch


def additive_mask(local_mask: torch.Tensor, offsets: torch.Tensor, past: int,
                  sliding_window: int | None, dtype: torch.dtype) -> torch.Tensor:
    """The 4-D additive mask [1, 1, Q, past + Q] for one step.

    local_mask [Q, Q] bool and offsets [Q] are on the target device. Query row
    q sits at position past + offsets[q]; cached key k at position k. With a
    sliding window, a key is visible only when query_pos - key_pos < window.
    """
    rows = local_mask.shape[0]
    device = local_mask.device
    visible = torch.cat([torch.ones(rows, past, dtype=torch.bool, device=device), local_mask], dim=1)  # [Q, P+Q]
    if sliding_window is not None:
        q_pos = past + offsets  # [Q]
        k_pos = torch.cat([torch.arange(past, device=device), q_pos])  # [P+Q]
        visible &= (q_pos[:, None] - k_pos[None, :]) < sliding_window
    hidden = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill_(~visible, torch.finfo(dtype).min)
    return hidden[None, None]  # [1, 1, Q, P+Q] (built on the device: no host -> device copy)


def model_mask(kinds: frozenset, sliding_window: int | None, local_mask: torch.Tensor, offsets: torch.Tensor,
               past: int, dtype: torch.dtype):
    """The mask to pass the model: one 4-D mask, or {layer kind: mask} when full and
    sliding layers are mixed (transformers accepts such a dict)."""
    if kinds == {"full_attention"} or sliding_window is None:
        return additive_mask(local_mask, offsets, past, None, dtype)
    sliding = additive_mask(local_mask, offsets, past, sliding_window, dtype)
    if kinds == {"sliding_attention"}:
        return sliding
    return {"full_attention": additive_mask(local_mask, offsets, past, None, dtype),
            "sliding_attention": sliding}


def batch_model_mask(kinds: frozenset, sliding_window: int | None, visible: torch.Tensor, q_pos: torch.Tensor,
                     k_pos: torch.Tensor, dtype: torch.dtype):
    """``model_mask`` for a batch: visible [A, Q, P+Q] bool (cache holes and padding already
    hidden), q_pos [A, Q] and k_pos [A, P+Q] the rows' and keys' positions (per row)."""

    def additive(seen: torch.Tensor) -> torch.Tensor:
        zero = torch.zeros((), dtype=dtype, device=seen.device)
        low = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=seen.device)
        return torch.where(seen, zero, low)[:, None]  # [A, 1, Q, P+Q]

    if kinds == {"full_attention"} or sliding_window is None:
        return additive(visible)
    near = (q_pos[:, :, None] - k_pos[:, None, :]) < sliding_window  # [A, Q, P+Q]
    sliding = additive(visible & near)
    if kinds == {"sliding_attention"}:
        return sliding
    return {"full_attention": additive(visible), "sliding_attention": sliding}
