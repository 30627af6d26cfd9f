"""The 4-D attention mask of one step, per layer kind (full / sliding window), for A >= 1 sequences.

A step's rows see the cache slots they may see (subject to a sliding window)
and, among themselves, what their local mask allows (core/tree.py and
plan/window.py build it). With one sequence every cache slot is visible and
slot p holds position p; with several, rows accept different numbers of
tokens, so the cache gets holes and left padding: ``PastSlots`` says which
slots each sequence sees and at which positions (decode/loop.py keeps it).
A stock transformers 5.x model takes such a mask as-is together with
explicit position ids; models that mix full and sliding layers take a dict.
Letters: A sequences, Q step rows, P cache slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PastSlots:
    """The cache slots of a batch: which each sequence sees, and the position of each slot's token."""

    valid: torch.Tensor  # [A, P] bool
    positions: torch.Tensor  # [A, P] long


def compacted(slots: PastSlots, counts: torch.Tensor, width: int) -> tuple[torch.Tensor, PastSlots]:
    """(index [A, W], the slots after): the cache slots that put each sequence's visible slots, in
    their order, at the right end of W = ``width`` slots (W >= every count), left-padded with hidden
    ones, and the ``PastSlots`` of that layout. ``counts`` [A]: each sequence's visible slots (the
    caller knows them; nothing is read back from the device). A padding slot points at slot 0.

    valid [[1 0 1 0] [0 1 1 1]], counts [2 3], width 3 -> index [[0 0 2] [1 2 3]],
    valid after [[0 1 1] [1 1 1]].
    """
    valid = slots.valid  # [A, P]
    count, past = valid.shape
    device = valid.device
    start = (width - counts)[:, None]  # [A, 1] the first visible slot after
    rank = valid.long().cumsum(1) - 1  # [A, P] each visible slot's place among its sequence's
    dest = torch.where(valid, start + rank, width)  # [A, P]: hidden slots go to a spare column W
    index = torch.zeros((count, width + 1), dtype=torch.long, device=device)
    index.scatter_(1, dest, torch.arange(past, device=device).expand(count, past))
    index = index[:, :width]  # [A, W]
    after = torch.arange(width, device=device)[None] >= start  # [A, W]
    return index, PastSlots(after, slots.positions.gather(1, index))


def additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[A, 1, Q, P+Q]: 0 where visible [A, Q, P+Q], the dtype's lowest value elsewhere (built on the device)."""
    hidden = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return hidden.masked_fill_(~visible, torch.finfo(dtype).min)[:, None]


def step_mask(kinds: frozenset[str], sliding_window: int | None, local: torch.Tensor, q_pos: torch.Tensor, past: int,
              slots: PastSlots | None, dtype: torch.dtype) -> torch.Tensor | dict[str, torch.Tensor]:
    """The mask to pass the model: one 4-D mask [A, 1, Q, P+Q], or {layer kind: mask} when full and
    sliding layers are mixed (transformers accepts such a dict).

    local [A, Q, Q] bool: which step rows each row sees; q_pos [A, Q]: the rows' positions; ``past``
    cache slots P, all visible at positions 0 .. P-1 (``slots`` None) or as ``slots`` says. A key
    is inside a sliding window when query position - key position < window.

    One sequence, past 2, rows at 2 and 3 where row 1 sees row 0: visible [[1 1 1 0], [1 1 1 1]].
    """
    count, rows = local.shape[0], local.shape[1]
    device = local.device
    seen = torch.ones(count, rows, past, dtype=torch.bool, device=device) if slots is None \
        else slots.valid[:, None, :].expand(count, rows, past)
    visible = torch.cat([seen, local], dim=2)  # [A, Q, P+Q]
    if kinds == {"full_attention"} or sliding_window is None:
        return additive(visible, dtype)
    past_pos = torch.arange(past, device=device)[None].expand(count, past) if slots is None else slots.positions
    k_pos = torch.cat([past_pos, q_pos], dim=1)  # [A, P+Q]
    near = (q_pos[:, :, None] - k_pos[:, None, :]) < sliding_window  # [A, Q, P+Q]
    sliding = additive(visible & near, dtype)
    if kinds == {"sliding_attention"}:
        return sliding
    return {"full_attention": additive(visible, dtype), "sliding_attention": sliding}
