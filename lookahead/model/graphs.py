"""One sequence's step as a replayed CUDA graph: a forward of a few rows costs its kernels, not their launches.

On a GPU a step of a small or mid-sized model is bound by launching its
kernels one by one from Python (some 1,600 launches a step for 24 layers;
the GPU itself works a few of those milliseconds), not by the weights it
reads. A CUDA graph records every kernel of one forward once and replays them
all with one launch. Replaying needs every tensor the forward touches to sit
at the same address with the same shape each time, so a graphed step differs
from the eager one (target.py) in three ways:

- its rows are padded to a bucket (``BUCKETS``: 1, 2, 4, ... 128 rows); a
  padding row repeats x at x's position and sees only itself;
- its inputs (tokens, positions, the kept rows, the past length, the local
  mask) travel in one int64 buffer, and the 4-D mask is built inside the
  graph from them;
- the model attends over the cache's whole capacity C, not its P filled
  slots: the mask hides every slot past P but the step's own, and the new
  keys and values are written at slots P .. P + Qb - 1 by ``index_copy_``
  (``WriteCache``). The buffer is this object's (``StepGraphs.buffer``):
  the decode's cache arena (cache.py) adopts it, so the loop's gathers and
  crops work on it as before, and graphs captured once serve every later
  decode of that capacity.

The eager forward and the graphed one compute the same rows under the same
mask; hidden slots add exact zeros to the softmax. With ``capture`` off the
same static forward runs without a graph (how the CPU tests check it).
Letters: Qb bucket rows, Q the step's rows, K kept rows, C slots, V vocabulary.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from .cache import Arena

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from .attention import GroupedAttention

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)  # the row counts a graph is captured for (a step pads up to the next)
WARMUPS = 2  # eager forwards on a side stream before a capture (cuBLAS handles, lazy initialisations)
# The buffer's slots: every growth recaptures the graphs (each capture costs a few eager forwards), so
# the buffer starts large and doubles; attending over unused slots costs a GPU little.
GRAPH_SLOTS_MIN = 1024


def graph_capacity(capacity: int, need: int) -> int:
    """Slots the graphs' buffer takes to hold ``need``: GRAPH_SLOTS_MIN, doubled from the larger of that
    and ``capacity`` until it fits. 0, 300 -> 1024; 1024, 1100 -> 2048; 3000, 5000 -> 6000."""
    size = max(capacity, GRAPH_SLOTS_MIN)
    while size < need:
        size *= 2
    return size


def bucket(rows: int) -> int | None:
    """The least bucket holding ``rows`` rows, None past the largest: 3 -> 4, 8 -> 8, 200 -> None."""
    return next((b for b in BUCKETS if b >= rows), None)


def packed_inputs(tokens: np.ndarray, positions: np.ndarray, local: np.ndarray, keep: np.ndarray, past: int,
                  rows: int) -> np.ndarray:
    """One step's inputs as the int64 buffer a graph reads: tokens, positions, kept rows (each padded to
    ``rows`` = Qb), the past length, the local mask [Qb, Qb]. Padding rows repeat x at x's position
    and see only themselves; padding kept rows point at row 0.

    tokens [[7 8]], positions [[5 6]], local [[[1 0] [1 1]]], keep [0 1], past 5, rows 4 ->
    [7 8 7 7 | 5 6 5 5 | 0 1 0 0 | 5 | 1 0 0 0  1 1 0 0  0 0 1 0  0 0 0 1].
    """
    q, k = tokens.shape[1], keep.shape[0]
    out = np.zeros(3 * rows + 1 + rows * rows, dtype=np.int64)
    out[:q], out[q:rows] = tokens[0], tokens[0, 0]
    out[rows:rows + q], out[rows + q:2 * rows] = positions[0], positions[0, 0]
    out[2 * rows:2 * rows + k] = keep
    out[3 * rows] = past
    square = np.eye(rows, dtype=np.int64)  # [Qb, Qb]
    square[:q, :q] = local[0]
    out[3 * rows + 1:] = square.reshape(-1)
    return out


def static_mask(local: torch.Tensor, past: torch.Tensor, capacity: int, dtype: torch.dtype) -> torch.Tensor:
    """[1, 1, Qb, C] additive mask: slot s is visible to row i when s < past, or s = past + j and row i sees
    row j (local [Qb, Qb] bool); every other slot gets the dtype's lowest value. ``past``: a 0-d tensor,
    so the mask is built on the device (inside a graph) from it.

    past 2, C 5, local [[1 0] [1 1]] -> visible [[1 1 1 0 0], [1 1 1 1 0]].
    """
    rows = local.shape[0]
    column = torch.arange(capacity, device=local.device) - past  # [C]: a slot's place after the past
    inside = (column >= 0) & (column < rows)  # [C]
    window = local[:, column.clamp(0, rows - 1)]  # [Qb, C]: row i sees step row (s - past)
    visible = (column < 0)[None] | (inside[None] & window)  # [Qb, C]
    hidden = torch.zeros(visible.shape, dtype=dtype, device=local.device)
    return hidden.masked_fill_(~visible, torch.finfo(dtype).min)[None, None]


class WriteLayer(DynamicLayer):
    """One layer's keys and values as full buffers [1, H, C, D] (slices of the adopted arena buffer): a
    step's rows are written at ``slots`` [Qb] (a device tensor, so a replay writes where its inputs say)
    and the model attends over all C slots (the mask hides the unwritten)."""

    keys: torch.Tensor  # [1, H, C, D]
    values: torch.Tensor

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor):
        super().__init__()
        self.keys, self.values, self.slots = keys, values, slots
        self.is_initialized = True
        self.device = keys.device

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys.index_copy_(2, self.slots, key_states)
        self.values.index_copy_(2, self.slots, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return 0  # (the model's cache_position from it is not used: positions and the mask come given)


class WriteCache(DynamicCache):
    """The cache a graphed forward writes: every layer's ``WriteLayer`` over one buffer [2, L, 1, H, C, D]."""

    def __init__(self, buffer: torch.Tensor, slots: torch.Tensor):
        Cache.__init__(self, layers=[WriteLayer(buffer[0, i], buffer[1, i], slots) for i in range(buffer.shape[1])])


@dataclass
class Graph:
    """One captured forward over Qb rows: its input buffer, its kept rows' logits [1, Qb, V] (both at fixed
    addresses), and the CUDA graph that rewrites the second from the first (None: run eagerly)."""

    inputs: torch.Tensor  # [3 Qb + 1 + Qb^2] int64
    logits: torch.Tensor  # [1, Qb, V]
    graph: Any  # torch.cuda.CUDAGraph | None


class StepGraphs:
    """The graphed steps of one model (one sequence, full attention): a graph per bucket, captured on a
    bucket's first step, over one KV buffer that the running decode's arena adopts."""

    def __init__(self, model: PreTrainedModel, cache_keyword: str, attention: GroupedAttention, dtype: torch.dtype,
                 capture: bool, positions: Callable[[torch.Tensor], torch.Tensor]):
        self.model = model
        self.positions = positions  # position ids as the model is fed them (Target.positions), on the device
        self.dtype = dtype  # the mask's (the input embedding's)
        self.cache_keyword = cache_keyword
        self.attention = attention
        self.capture = capture  # False: the same static forward, run eagerly (CPU tests)
        self.buffer: torch.Tensor | None = None  # [2, L, 1, H, C, D] the adopted KV buffer
        self.owner: weakref.ref[Arena] | None = None  # the arena that holds it now
        self.graphs: dict[int, Graph] = {}  # Qb -> its graph over ``buffer``
        self.pool: Any = None  # one memory pool for every graph (they never run at once)
        self.failure = ""  # why graphs are off for this model (a capture failed), "" while they are on
        self.compile_seconds = 0.0  # seconds the latest step spent adopting the buffer or capturing (0.0: neither)

    def step(self, arena: Arena, tokens: np.ndarray, positions: np.ndarray, local: np.ndarray, keep: np.ndarray,
             past: int) -> torch.Tensor | None:
        """Logits [1, K, V] of rows ``keep`` of one sequence's step (target.py's ``step`` arguments), or None
        where no graph applies (too many rows, a failed capture): then the caller runs it eagerly.
        The arena's layers hold past + Q slots afterwards, as after an eager step."""
        self.compile_seconds = 0.0
        rows = bucket(tokens.shape[1])
        if rows is None or self.failure:
            return None
        began = time.perf_counter()
        buffer, adopted = self._adopt(arena, past + rows)
        graph = self.graphs.get(rows)
        packed = torch.from_numpy(packed_inputs(tokens, positions, local, keep, past, rows))
        made = graph is None
        if made:
            graph = self._new_graph(rows, packed, buffer)
        if adopted or made:  # a new decode's prompt copied in, a graph captured: not what the step costs
            self.compile_seconds = time.perf_counter() - began
        if graph is None:
            return None
        graph.inputs.copy_(packed, non_blocking=True)
        if graph.graph is not None:
            graph.graph.replay()
        else:
            graph.logits.copy_(self._forward(graph.inputs, buffer, rows))
        end = past + tokens.shape[1]
        for layer in arena.members:
            layer.length = end
        arena.filled = max(arena.filled, end)
        return graph.logits[:, :keep.shape[0]].clone()  # (the next replay rewrites graph.logits)

    def _forward(self, inputs: torch.Tensor, buffer: torch.Tensor, rows: int) -> torch.Tensor:
        """The static forward: inputs [3 Qb + 1 + Qb^2] -> kept rows' logits [1, Qb, V]; every shape fixed by
        ``rows`` and the buffer's capacity, every value read from device tensors."""
        tokens, keep = inputs[:rows][None], inputs[2 * rows:3 * rows]
        positions = self.positions(inputs[rows:2 * rows][None])
        past = inputs[3 * rows]
        local = inputs[3 * rows + 1:].view(rows, rows).bool()  # [Qb, Qb]
        slots = past + torch.arange(rows, device=inputs.device)  # [Qb] where the rows' keys go
        mask = static_mask(local, past, buffer.shape[4], self.dtype)
        with self.attention.switched():
            out = self.model(input_ids=tokens, position_ids=positions, attention_mask=mask, use_cache=True,
                             logits_to_keep=0, **{self.cache_keyword: WriteCache(buffer, slots)})
        return out.logits.index_select(1, keep)  # [1, Qb, V]

    def _new_graph(self, rows: int, packed: torch.Tensor, buffer: torch.Tensor) -> Graph | None:
        """The graph for ``rows`` (its first step's inputs ``packed``: its warm-up forwards write that step's
        keys, which its run then writes again); None (and ``failure`` set) when the forward cannot be
        captured."""
        inputs = packed.to(buffer.device)
        if not self.capture:
            return self.graphs.setdefault(rows, Graph(inputs, self._forward(inputs, buffer, rows), None))
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARMUPS):
                    self._forward(inputs, buffer, rows)
            torch.cuda.current_stream().wait_stream(side)
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                logits = self._forward(inputs, buffer, rows)
        except RuntimeError as error:  # a forward that syncs with the host (or any capture error): eager from now on
            self.failure = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            self.graphs.clear()
            return None
        # A first replay (the step's own keys written once more, the same values), waited for: a graph is
        # uploaded to the device at its first launch, and the step's own replay is then timed as later ones.
        graph.replay()
        torch.cuda.current_stream().synchronize()
        return self.graphs.setdefault(rows, Graph(inputs, logits, graph))

    def _adopt(self, arena: Arena, need: int) -> tuple[torch.Tensor, bool]:
        """The buffer, holding at least ``need`` slots, as ``arena``'s buffer (its filled slots copied in),
        and whether that took any work (False: the arena held it already, large enough).

        A buffer too small (or of another layout) is replaced by one of ``graph_capacity``, and every graph
        over the old one is dropped; another arena still holding it first gets a copy of its own.
        """
        current = arena.buffer  # [2, L, 1, H, C, D]
        assert current is not None, "an arena that holds its layers has a buffer"
        own = self.buffer
        if own is not None and current.data_ptr() == own.data_ptr() and current.shape == own.shape \
                and own.shape[4] >= need:
            return own, False
        layout = current.shape[:4] + current.shape[5:]
        if own is None or own.shape[:4] + own.shape[5:] != layout or own.dtype != current.dtype \
                or own.device != current.device or own.shape[4] < need:
            capacity = graph_capacity(own.shape[4] if own is not None else 0, need)
            self._release(arena)
            self.graphs.clear()
            self.buffer = None  # (the old buffer and its graphs go before the new one is allocated)
            own = current.new_zeros(current.shape[:4] + (capacity,) + current.shape[5:])  # zeros: finite keys
        else:
            self._release(arena)
        filled = min(arena.filled, current.shape[4])
        if current.data_ptr() != own.data_ptr():
            own[:, :, :, :, :filled] = current[:, :, :, :, :filled]
        self.buffer = own
        arena.buffer = own
        arena.refresh()
        self.owner = weakref.ref(arena)
        return own, True

    def _release(self, arena: Arena) -> None:
        """The arena that held the buffer before ``arena`` (a decode still alive) keeps a copy of its own."""
        previous = self.owner() if self.owner is not None else None
        own = self.buffer
        if previous is not None and previous is not arena and own is not None and previous.buffer is not None \
                and previous.buffer.data_ptr() == own.data_ptr():
            previous.buffer = previous.buffer.clone()
            previous.refresh()
        self.owner = None
