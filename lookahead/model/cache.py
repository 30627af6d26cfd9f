"""Keep exactly the KV rows of the accepted paths on a transformers DynamicCache.

After a step's forward the cache holds past + Q slots per sequence. Each
sequence's accepted rows (x, then the accepted tree nodes: not contiguous in
general) are gathered to slots past .. past + k - 1 and everything after
the longest sequence's k is cropped away. A sequence that kept fewer rows
than the longest leaves slots it must not see: decode/loop.py masks them
(a zeroed key would still count in the softmax).
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache


def cache_keyword(model) -> str:
    """The keyword ``model``'s forward takes its KV cache by: ``cache`` from transformers 5.24 on
    (``past_key_values`` still works there, with a deprecation warning), ``past_key_values`` before."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # a forward whose signature cannot be read: the name every version knows
        return "past_key_values"
    return "cache" if "cache" in params and "past_key_values" not in params else "past_key_values"


def new_cache() -> DynamicCache:
    """A cache of plain full-length layers (sliding windows are applied by our mask).

    Sliding-window cache layers forget old rows as they go, which would make a
    rejected speculation impossible to roll back; full layers keep every row
    and the 4-D mask hides what a sliding layer must not see.
    """
    return DynamicCache()


def keep_rows(cache: DynamicCache, past: int, rows: torch.Tensor, in_place: bool) -> None:
    """Sequence a keeps its step rows rows[a, :] (indices into this step's Q rows, padded to a common
    length K) at slots past .. past + K - 1; the rest is cropped.

    ``in_place`` (every sequence keeps rows 0 .. k-1, known on the host) skips the gather. The
    layers may sit on several devices (a device_map): the indices go to each.
    """
    count = rows.shape[1]
    if not in_place:
        sources: dict[torch.device, torch.Tensor] = {}  # [A, K] absolute cache slots, per device
        for layer in cache.layers:
            for tensor in (layer.keys, layer.values):  # [A, H, P+Q, D]
                if tensor.device not in sources:
                    sources[tensor.device] = rows.to(tensor.device, non_blocking=True) + past
                tensor[:, :, past:past + count] = gather_slots(tensor, sources[tensor.device])
    surplus = cache.get_seq_length() - (past + count)
    if surplus > 0:
        cache.crop(-surplus)  # negative = number of rows to drop (all transformers 5.x)


def gather_slots(tensor: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """tensor [A, H, S, D] at slots [A, K] of each sequence: [A, H, K, D] (one sequence: an index_select)."""
    if tensor.shape[0] == 1:
        return tensor.index_select(2, slots[0])
    index = slots[:, None, :, None].expand(-1, tensor.shape[1], -1, tensor.shape[3])  # [A, H, K, D]
    return tensor.gather(2, index)
