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
from collections.abc import Callable
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

SLOTS_MIN = 256  # the fewest slots a layer's buffer holds ...
GROWTH = 1.5  # ... and the headroom it is given past what must fit (a few copies of the past per decode)


def grown(capacity: int, length: int) -> int:
    """Slots a buffer of ``capacity`` grows to so that ``length`` fit, with room to spare: GROWTH times
    the larger of the two. A new buffer (capacity 0) gets that room too: a prefill or a batch's join
    builds one at exactly its past, and the very next step would otherwise copy it all again.

    100, 120 -> 256; 400, 401 -> 601; 0, 300 -> 450.
    """
    return max(int(max(capacity, length) * GROWTH), SLOTS_MIN)


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword ``model``'s forward takes its KV cache by: ``cache`` from transformers 5.24 on
    (``past_key_values`` still works there, with a deprecation warning), ``past_key_values`` before."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # a forward whose signature cannot be read: the name every version knows
        return "past_key_values"
    return "cache" if "cache" in params and "past_key_values" not in params else "past_key_values"


class Arena:
    """The keys and values of every layer of one shape in one buffer [2, L, A, H, capacity, D], so
    that keeping a step's rows is one gather for all layers, not two per layer.

    Layers join on their first update (``admits``: the first layer's batch, heads, head size, dtype
    and device); one of another shape keeps buffers of its own. The buffer grows for all members at
    once (GROWTH), copying the slots any member filled.
    """

    def __init__(self, layers: int):
        self.layers = layers  # L
        self.buffer: torch.Tensor | None = None  # [2, L, A, H, C, D]
        self.members: list[SlotLayer] = []
        self.filled = 0  # the most slots any member has held since the last growth

    def admits(self, states: torch.Tensor) -> bool:
        """Whether a layer whose new rows are ``states`` [A, H, Q, D] can live in the buffer."""
        b = self.buffer
        return b is None or (states.dtype == b.dtype and states.device == b.device
                             and (states.shape[0], states.shape[1], states.shape[3])
                             == (b.shape[2], b.shape[3], b.shape[5]))

    def join(self, layer: SlotLayer, states: torch.Tensor) -> None:
        """Admit ``layer`` (its first new rows ``states`` [A, H, Q, D]), making the buffer if it is the first."""
        if self.buffer is None:
            count, heads, _, size = states.shape
            self.buffer = states.new_empty((2, self.layers, count, heads, 0, size))
        if layer not in self.members:  # (a layer reset and started again joins once)
            self.members.append(layer)

    def reserve(self, length: int) -> None:
        """Room for ``length`` slots in every member."""
        buffer = self.buffer
        assert buffer is not None, "a layer joins (making the buffer) before it reserves"
        capacity = buffer.shape[4]
        if length > capacity:
            larger = buffer.new_empty(buffer.shape[:4] + (grown(capacity, length),) + buffer.shape[5:])
            larger[:, :, :, :, :self.filled] = buffer[:, :, :, :, :self.filled]
            self.buffer = larger
            self.refresh()
        self.filled = max(self.filled, length)

    def refresh(self) -> None:
        """Every member's buffers and views from the (new) buffer."""
        buffer = self.buffer
        assert buffer is not None, "only an arena with members is refreshed"
        for layer in self.members:
            layer.key_buffer, layer.value_buffer = buffer[0, layer.index], buffer[1, layer.index]

    def keep_sequences(self, stay: list[int]) -> None:
        """Keep only the sequences ``stay`` (ascending), in that order, as the first rows of the buffer.

        Each kept sequence's filled slots move down in place (a later row to an earlier one, so no
        source is overwritten before it is read) and the buffer becomes a view of its first
        len(stay) rows: no copy of the whole buffer, and none of the rows that stay where they are.
        """
        buffer = self.buffer
        assert buffer is not None, "only an arena with members keeps sequences"
        used = max((layer.length for layer in self.members), default=0)
        for row, source in enumerate(stay):
            if source != row:
                buffer[:, :, row, :, :used] = buffer[:, :, source, :, :used]
        self.buffer = buffer[:, :, :len(stay)]
        self.refresh()

    def holds(self, layers: list) -> bool:
        """Whether every one of ``layers`` lives in the buffer."""
        return self.buffer is not None and len(self.members) == len(layers)


class FilledSlots:
    """A ``SlotLayer``'s keys or values: the view of the filled slots of its buffer (the attribute named
    ``buffer``), made when read; None before the layer's first update. transformers' layer sets None on
    construction (ignored); any other assignment is refused: write into the view instead."""

    def __init__(self, buffer: str):
        self.buffer = buffer

    def __get__(self, layer: Any, owner: type | None = None) -> Any:
        if layer is None:
            return self
        return getattr(layer, self.buffer)[:, :, :layer.length] if layer.is_initialized else None

    def __set__(self, layer: Any, value: torch.Tensor | None) -> None:
        if value is not None:
            raise AttributeError(f"a SlotLayer's view of its {self.buffer} is read-only: write into it instead")


class SlotLayer(DynamicLayer):
    """One layer's keys and values [A, H, S, D] in buffers [A, H, capacity, D] (its slice of the
    cache's ``Arena`` when it fits there); ``keys`` and ``values`` are views of the first ``length``
    slots, made when read (a crop or a rollback only sets the length: no view of every layer made
    each step), so writing into them writes the buffers."""

    key_buffer: torch.Tensor  # [A, H, capacity, D]
    value_buffer: torch.Tensor

    keys = FilledSlots("key_buffer")  # [A, H, S, D] (None before the first update)
    values = FilledSlots("value_buffer")

    def __init__(self, arena: Arena | None = None, index: int = 0):
        super().__init__()
        self.arena, self.index = arena, index
        self.in_arena = False

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.length = 0
        arena = self.arena
        self.in_arena = arena is not None and self.index < arena.layers and arena.admits(key_states) \
            and arena.admits(value_states)
        if self.in_arena and arena is not None:
            arena.join(self, key_states)
            buffer = arena.buffer
            assert buffer is not None  # made by join
            self.key_buffer, self.value_buffer = buffer[0, self.index], buffer[1, self.index]
        else:
            self.key_buffer = key_states.new_empty(key_states.shape[:2] + (0,) + key_states.shape[3:])
            self.value_buffer = value_states.new_empty(value_states.shape[:2] + (0,) + value_states.shape[3:])
        self.is_initialized = True

    def _reserve(self, length: int) -> None:
        """Room for ``length`` slots (the filled ones copied over when the buffers grow)."""
        if self.in_arena and self.arena is not None:
            self.arena.reserve(length)
            return
        capacity = self.key_buffer.shape[2]
        if length <= capacity:
            return
        for name in ("key_buffer", "value_buffer"):
            old = getattr(self, name)
            new = old.new_empty(old.shape[:2] + (grown(capacity, length),) + old.shape[3:])
            new[:, :, :self.length] = old[:, :, :self.length]
            setattr(self, name, new)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new rows [A, H, Q, D] after the filled slots; the filled slots' views."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[2]
        self._reserve(end)
        self.key_buffer[:, :, self.length:end] = key_states
        self.value_buffer[:, :, self.length:end] = value_states
        self.length = end
        return self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]  # [A, H, S, D]

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last ``-tokens_to_remove`` slots (a negative count, as transformers 5.x crops)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes the negative number of slots to drop, not {tokens_to_remove}")
        if self.is_initialized and tokens_to_remove:
            self.length = max(self.length + tokens_to_remove, 0)

    def _select(self, pick: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Keep the sequences ``pick`` (a function of a buffer [A, ...]) selects; arena members are
        selected with their arena (SlotCache)."""
        if self.is_initialized and not self.in_arena:
            self.key_buffer, self.value_buffer = pick(self.key_buffer), pick(self.value_buffer)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._select(lambda buffer: buffer[indices])

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._select(lambda buffer: buffer.repeat_interleave(repeats, dim=0))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx.to(self.device))

    def reset(self) -> None:
        self.length = 0
        super().reset()


class SlotCache(DynamicCache):
    """A DynamicCache of ``SlotLayer`` layers: full-length, written in place, rolled back by length.

    With ``layers`` (the model's decoder layer count) the layers share one ``Arena``; without, each
    keeps its own buffers.
    """

    def __init__(self, layers: int | None = None):
        self.arena = Arena(layers) if layers else None
        if not layers:
            Cache.__init__(self, layer_class_to_replicate=SlotLayer)
        else:
            Cache.__init__(self, layers=[SlotLayer(self.arena, i) for i in range(layers)])
            self.layer_class_to_replicate = SlotLayer  # a cache layer past ``layers`` (if a model has one): its own

    def _select(self, pick: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Select sequences in the arena (once for all its members) and in every other layer."""
        if self.arena is not None and self.arena.buffer is not None:
            self.arena.buffer = pick(self.arena.buffer.transpose(0, 2)).transpose(0, 2).contiguous()  # batch: dim 2
            self.arena.refresh()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._select(lambda buffer: buffer[indices])
        super().batch_select_indices(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._select(lambda buffer: buffer.repeat_interleave(repeats, dim=0))
        super().batch_repeat_interleave(repeats)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._select(lambda buffer: buffer[beam_idx.to(buffer.device)])
        super().reorder_cache(beam_idx)


def new_cache(layers: int | None = None) -> SlotCache:
    """A cache of plain full-length layers (sliding windows are applied by our mask); ``layers``:
    the model's decoder layers, which then share one buffer (``Arena``).

    Sliding-window cache layers forget old rows as they go, which would make a
    rejected speculation impossible to roll back; full layers keep every row
    and the 4-D mask hides what a sliding layer must not see.
    """
    return SlotCache(layers)


def keep_sequences(cache: DynamicCache, stay: list[int], device: torch.device) -> None:
    """Keep only the sequences ``stay`` (batch rows, ascending) of ``cache``, in that order: in place
    where an arena holds every layer (``Arena.keep_sequences``), else through ``batch_select_indices``
    (indices on ``device``)."""
    assert stay == sorted(stay), "sequences stay in their order"
    arena = arena_of(cache)
    if arena is not None:
        arena.keep_sequences(stay)
        return
    cache.batch_select_indices(torch.tensor(stay, device=device))


def keep_rows(cache: DynamicCache, past: int, rows: torch.Tensor, in_place: bool, filled: int | None = None) -> None:
    """Sequence a keeps its step rows rows[a, :] (indices into this step's Q rows, padded to a common
    length K) at slots past .. past + K - 1; the rest is cropped.

    ``in_place`` (every sequence keeps rows 0 .. k-1, known on the host) skips the gather. ``filled``:
    the slots the cache holds now (past + Q, which the caller knows: asking the cache costs more than
    the crop), None to ask it.
    """
    if not in_place:
        _gather_to(cache, rows, past, past)
    _crop_to(cache, past + rows.shape[1], filled)


def compact_slots(cache: DynamicCache, index: torch.Tensor) -> None:
    """Keep, for each sequence a, the slots index[a, :] [A, W] in that order at slots 0 .. W-1 (W no
    more than the cache holds); the rest is cropped.

    Keys [[k0 k1 k2]] (one sequence, 3 slots), index [[0 2]] -> [[k0 k2]].
    """
    _gather_to(cache, index, 0, 0)
    _crop_to(cache, index.shape[1])


def _gather_to(cache: DynamicCache, index: torch.Tensor, offset: int, start: int) -> None:
    """Write every sequence a's slots offset + index[a, :] [A, K] at slots start .. start + K - 1 of every
    layer: one gather of the arena where it holds every layer, else two per layer. The layers may sit
    on several devices (a device_map): the indices go to each."""
    count = index.shape[1]
    arena = arena_of(cache)
    if arena is not None:
        buffer = arena.buffer  # [2, L, A, H, C, D]: every layer's keys and values
        assert buffer is not None, "an arena that holds its layers has a buffer"
        slots = index.to(buffer.device, non_blocking=True) + offset  # [A, K]
        if buffer.shape[2] == 1:
            buffer[:, :, :, :, start:start + count] = buffer.index_select(4, slots[0])
        else:
            spread = slots[None, None, :, None, :, None].expand(*buffer.shape[:4], count, buffer.shape[5])
            buffer[:, :, :, :, start:start + count] = buffer.gather(4, spread)
        return
    sources: dict[torch.device, torch.Tensor] = {}  # [A, K] absolute cache slots, per device
    layers: list[Any] = cache.layers  # SlotLayer or DynamicLayer: keys and values [A, H, S, D]
    for layer in layers:
        if not layer.is_initialized:
            continue  # a layer that never ran (one sharing another's cache, say)
        for tensor in (layer.keys, layer.values):  # [A, H, S, D]
            if tensor.device not in sources:
                sources[tensor.device] = index.to(tensor.device, non_blocking=True) + offset
            tensor[:, :, start:start + count] = gather_slots(tensor, sources[tensor.device])


def _crop_to(cache: DynamicCache, length: int, filled: int | None = None) -> None:
    """Forget every slot past ``length`` (of ``filled``, the slots held; None: the cache says)."""
    surplus = (cache.get_seq_length() if filled is None else filled) - length
    if surplus > 0:
        cache.crop(-surplus)  # negative = number of rows to drop (all transformers 5.x)


def gather_slots(tensor: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """tensor [A, H, S, D] at slots [A, K] of each sequence: [A, H, K, D] (one sequence: an index_select)."""
    if tensor.shape[0] == 1:
        return tensor.index_select(2, slots[0])
    index = slots[:, None, :, None].expand(-1, tensor.shape[1], -1, tensor.shape[3])  # [A, H, K, D]
    return tensor.gather(2, index)


def joined(cache: DynamicCache, other: DynamicCache, past: int, length: int,
           layers: int | None = None) -> tuple[SlotCache, int, int]:
    """A new cache holding ``cache``'s sequences (``past`` slots each), then ``other``'s (``length``
    slots), the shorter left-padded with zero slots to the longer: (the cache, the slots padded in
    front of ``cache``'s rows, those in front of ``other``'s). The caller masks the padding.

    past 5, length 3 -> keys [A + 1, H, 5, D], 0, 2; past 2, length 4 -> keys [A + 1, H, 4, D], 2, 0.
    """
    width = max(past, length)
    before, pad = width - past, width - length
    arenas = arena_of(cache), arena_of(other)
    if layers and arenas[0] is not None and arenas[1] is not None:
        return _joined_arenas(arenas[0], arenas[1], past, length, layers), before, pad
    out = new_cache(layers)
    ours_layers: list[Any] = cache.layers  # SlotLayer or DynamicLayer: keys and values [A, H, S, D]
    their_layers: list[Any] = other.layers
    for index, (mine, theirs) in enumerate(zip(ours_layers, their_layers)):
        if not mine.is_initialized:  # a layer that never ran (one sharing another's cache, say)
            continue
        stacked = []
        for name in ("keys", "values"):
            ours: torch.Tensor = getattr(mine, name)  # [A, H, past, D]
            new = getattr(theirs, name) if theirs.is_initialized else ours.new_zeros(
                (1, ours.shape[1], 0, ours.shape[3]))  # [1, H, length, D]
            stacked.append(torch.cat([_left_padded(ours, before), _left_padded(new, pad)]))  # [A + 1, H, width, D]
        out.update(stacked[0], stacked[1], index)
    return out, before, pad


def arena_of(cache: Cache) -> Arena | None:
    """The cache's arena when it holds every layer of the cache, else None."""
    arena = getattr(cache, "arena", None)
    return arena if arena is not None and arena.holds(cache.layers) else None


def _joined_arenas(ours: Arena, theirs: Arena, past: int, length: int, layers: int) -> SlotCache:
    """``joined`` where both caches keep every layer in an arena of the same layout: one new buffer
    with room to grow (``grown``), each side copied into it once, the padding zeroed."""
    mine, new = ours.buffer, theirs.buffer  # [2, L, A, H, C, D], [2, L, 1, H, C', D]
    assert mine is not None and new is not None, "an arena that holds its layers has a buffer"
    if (mine.dtype, mine.device, mine.shape[:2], mine.shape[3], mine.shape[5]) != (
            new.dtype, new.device, new.shape[:2], new.shape[3], new.shape[5]):
        raise ValueError("joined caches must share dtype, device, layers, heads and head size")
    width = max(past, length)
    count = mine.shape[2]
    out = new_cache(layers)
    buffer = mine.new_empty(mine.shape[:2] + (count + new.shape[2], mine.shape[3], grown(0, width), mine.shape[5]))
    buffer[:, :, :count, :, :width - past] = 0
    buffer[:, :, :count, :, width - past:width] = mine[:, :, :, :, :past]
    buffer[:, :, count:, :, :width - length] = 0
    buffer[:, :, count:, :, width - length:width] = new[:, :, :, :, :length]
    arena = out.arena
    assert arena is not None, "a cache made with layers has an arena"
    members: list[Any] = out.layers  # SlotLayer, one per decoder layer
    for index, layer in enumerate(members):  # each layer joins the arena as on its first update ...
        layer.lazy_initialization(buffer[0, index, :, :, :0], buffer[1, index, :, :, :0])
        layer.length = width
    arena.buffer, arena.filled = buffer, width  # ... then reads the joined buffer
    arena.refresh()
    return out


def _left_padded(tensor: torch.Tensor, slots: int) -> torch.Tensor:
    """tensor [A, H, S, D] with ``slots`` zero slots in front: [A, H, slots + S, D]."""
    if slots == 0:
        return tensor
    zeros = tensor.new_zeros(tensor.shape[:2] + (slots,) + tensor.shape[3:])
    return torch.cat([zeros, tensor], dim=2)
