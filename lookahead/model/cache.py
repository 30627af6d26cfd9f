"""The KV cache of a decode: written in place by position, rolled back by its length.

``SlotCache`` is a transformers ``DynamicCache`` whose layers (``SlotLayer``)
hold their keys and values in buffers allocated ahead of need: a step's new
rows are copied into the next free slots (not concatenated onto a new tensor
holding the whole past, as ``DynamicLayer`` does on every layer of every
step), the model sees a view of the filled slots, and dropping rows is a
change of length. The buffers grow geometrically, so a decode copies its
past over only a few times in all.

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
from transformers.cache_utils import Cache, DynamicLayer

SLOTS_MIN = 256  # the fewest slots a layer's buffer holds ...
GROWTH = 1.5  # ... and by how much it grows when full (a few copies of the past per decode)


def cache_keyword(model) -> str:
    """The keyword ``model``'s forward takes its KV cache by: ``cache`` from transformers 5.24 on
    (``past_key_values`` still works there, with a deprecation warning), ``past_key_values`` before."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # a forward whose signature cannot be read: the name every version knows
        return "past_key_values"
    return "cache" if "cache" in params and "past_key_values" not in params else "past_key_values"


class SlotLayer(DynamicLayer):
    """One layer's keys and values [A, H, S, D] in buffers [A, H, capacity, D]; ``keys`` and
    ``values`` are views of the first ``length`` slots, so writing into them writes the buffers."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.length = 0
        self.key_buffer = key_states.new_empty(key_states.shape[:2] + (0,) + key_states.shape[3:])
        self.value_buffer = value_states.new_empty(value_states.shape[:2] + (0,) + value_states.shape[3:])
        self._views()
        self.is_initialized = True

    def _views(self) -> None:
        self.keys = self.key_buffer[:, :, :self.length]  # [A, H, S, D]
        self.values = self.value_buffer[:, :, :self.length]

    def _reserve(self, length: int) -> None:
        """Room for ``length`` slots (the filled ones copied over when the buffers grow)."""
        capacity = self.key_buffer.shape[2]
        if length <= capacity:
            return
        capacity = max(length, int(capacity * GROWTH), SLOTS_MIN)
        for name in ("key_buffer", "value_buffer"):
            old = getattr(self, name)
            new = old.new_empty(old.shape[:2] + (capacity,) + old.shape[3:])
            new[:, :, :self.length] = old[:, :, :self.length]
            setattr(self, name, new)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write the new rows [A, H, Q, D] after the filled slots; the filled slots' views."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[2]
        self._reserve(end)
        self.key_buffer[:, :, self.length:end] = key_states
        self.value_buffer[:, :, self.length:end] = value_states
        self.length = end
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last ``-tokens_to_remove`` slots (a negative count, as transformers 5.x crops)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes the negative number of slots to drop, not {tokens_to_remove}")
        if self.is_initialized and tokens_to_remove:
            self.length = max(self.length + tokens_to_remove, 0)
            self._views()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the sequences ``indices`` (copies their buffers)."""
        if self.is_initialized:
            self.key_buffer, self.value_buffer = self.key_buffer[indices], self.value_buffer[indices]
            self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self.key_buffer = self.key_buffer.repeat_interleave(repeats, dim=0)
            self.value_buffer = self.value_buffer.repeat_interleave(repeats, dim=0)
            self._views()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx.to(self.device))

    def reset(self) -> None:
        self.length = 0
        super().reset()


class SlotCache(DynamicCache):
    """A DynamicCache of ``SlotLayer`` layers: full-length, written in place, rolled back by length."""

    def __init__(self):
        Cache.__init__(self, layer_class_to_replicate=SlotLayer)


def new_cache() -> SlotCache:
    """A cache of plain full-length layers (sliding windows are applied by our mask).

    Sliding-window cache layers forget old rows as they go, which would make a
    rejected speculation impossible to roll back; full layers keep every row
    and the 4-D mask hides what a sliding layer must not see.
    """
    return SlotCache()


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
