"""Keep exactly the KV rows of the accepted path on a transformers DynamicCache.

After a step's forward the cache holds past + Q rows. The accepted rows
(x, then the accepted tree nodes: not contiguous in general) are gathered to
past .. past + k - 1 and everything after them is cropped away.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


def new_cache() -> DynamicCache:
    """A cache of plain full-length layers (sliding windows are applied by our mask).

    Sliding-window cache layers forget old rows as they go, which would make a
    rejected speculation impossible to roll back; full layers keep every row
    and the 4-D mask hides what a sliding layer must not see.
    """
    return DynamicCache()


def keep_rows(cache: DynamicCache, past: int, rows: torch.Tensor, contiguous: bool) -> None:
    """Keep step rows `rows` [k] (indices into this step's Q rows) at past .. past + k - 1.

    ``contiguous`` (rows == 0..k-1, known on the host) skips the gather. The
    layers may sit on several devices (a device_map): the indices go to each.
    """
    count = rows.shape[0]
    if not contiguous:
        sources: dict[torch.device, torch.Tensor] = {}  # [k] absolute cache rows, per device
        for layer in cache.layers:
            for tensor in (layer.keys, layer.values):  # [B, H, P+Q, D]
                if tensor.device not in sources:
                    sources[tensor.device] = rows.to(tensor.device, non_blocking=True) + past
                tensor[:, :, past:past + count] = tensor.index_select(2, sources[tensor.device])
    surplus = cache.get_seq_length() - (past + count)
    if surplus > 0:
        cache.crop(-surplus)  # negative = number of rows to drop (all transformers 5.x)


def cache_length(cache: DynamicCache) -> int:
    """Rows currently held by the cache."""
    return cache.get_seq_length()


def keep_rows_per_row(cache: DynamicCache, past: int, rows: torch.Tensor) -> None:
    """Batched ``keep_rows``: batch row a keeps its step rows rows[a, :] (indices into this
    step's Q rows, padded to a common length K) at past .. past + K - 1; the rest is cropped.

    Entries past a row's own count are kept too but must be masked (see batch.py): a
    rejected slot is hidden by the mask, never zeroed (a zero key still counts in softmax).
    """
    count = rows.shape[1]
    for layer in cache.layers:
        for tensor in (layer.keys, layer.values):  # [A, H, P+Q, D]
            index = (rows + past)[:, None, :, None].expand(-1, tensor.shape[1], -1, tensor.shape[3])  # [A, H, K, D]
            tensor[:, :, past:past + count] = tensor.gather(2, index)
    surplus = cache.get_seq_length() - (past + count)
    if surplus > 0:
        cache.crop(-surplus)
