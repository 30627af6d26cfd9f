"""Earlier prompts' keys and values, reused by a prompt that begins with the same tokens (a prefix cache).

An agent resends its whole conversation every turn; an editor resends the same system prompt. Their
prompts' prefills repeat work done for the previous request. ``PrefixStore`` keeps the prefilled cache
slots of recent prompts (bounded in bytes, least recently used dropped) and, when a new prompt starts
with the tokens of a kept one, writes those slots into the new cache and prefills only the rest.

That is exact only where a row's keys and values do not depend on how many rows a forward computes
together: a prompt prefilled as prefix + rest must hold the bits a whole prefill gives it, or the
decode would no longer be the one ``model.generate`` runs. ``reuse_is_exact`` says when: on the CPU,
with every linear layer of the model computing int8 products of GGUF blocks (native/quant8*.h: integer
sums, one order at every row count) and every forward attending through lookahead's op (native/fused.cpp:
a row's output a function of its visible keys alone), as ``load_model`` sets up a GGUF's kept blocks.
Float32 products go through torch's matrix product or de-quantized tiles, and torch's SDPA blocks a long
query otherwise than a short one: their last bits depend on the row count, so there the store is not
read (the decode loop asks ``reuse_is_exact`` before each prefill).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
from transformers.cache_utils import Cache

from .attention import NATIVE_NAME
from .cache import SlotCache, SlotLayer
from .quantized import QuantizedLinear


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens ``a`` [T] and ``b`` [U] share.

    Worked example: [5, 9, 14, 2] and [5, 9, 7] -> 2; [5, 9] and [5, 9, 14] -> 2; [1] and [2] -> 0.
    """
    n = min(a.shape[0], b.shape[0])
    same = a[:n] == b[:n]
    return n if bool(same.all()) else int(np.argmin(same))


def reuse_is_exact(model: torch.nn.Module) -> bool:
    """Whether a prompt's cache slots are the same bits prefilled whole or as a kept prefix and the rest:
    the model on the CPU, attending through lookahead's op for every forward (attention.py's ``use_native``,
    as ``load_model`` sets it: a row's attention is a function of its visible keys alone), and every linear
    layer but the output head (whose logits a prefill drops) a ``QuantizedLinear`` with int8 products."""
    if getattr(getattr(model, "config", None), "_attn_implementation", None) != NATIVE_NAME:
        return False  # (torch's SDPA blocks a long query's keys otherwise than a short one's)
    output_embeddings = getattr(model, "get_output_embeddings", None)
    head = output_embeddings() if callable(output_embeddings) else None
    blocks = 0
    for module in model.modules():
        if module is head:
            continue
        if isinstance(module, QuantizedLinear):
            if module.products != "int8":
                return False
            blocks += 1
        elif isinstance(module, torch.nn.Linear):
            return False
    parameter = next(model.parameters(), None)
    buffer = next(model.buffers(), None)
    device = parameter.device if parameter is not None else buffer.device if buffer is not None else None
    return blocks > 0 and device is not None and device.type == "cpu"


def slot_bytes(buffer: torch.Tensor) -> int:
    """Bytes one slot of one sequence takes in a cache buffer [A, H, capacity, D]."""
    return int(buffer.shape[1] * buffer.shape[3] * buffer.element_size())


@dataclass
class KeptPrefix:
    """One prompt's prefilled slots: its tokens [L] and, per cache layer, keys and values [1, H, L, D]."""

    tokens: np.ndarray
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    size: int  # bytes of keys and values


class PrefixStore:
    """Prefilled prompts kept for reuse, at most ``capacity`` bytes of keys and values in all (least recently
    used dropped).

    Worked example: ``keep([5, 9, 14, 2], cache)`` keeps four slots; a later prompt [5, 9, 14, 2, 8, 3]
    ``restore``s those four into its new cache and prefills [8, 3] alone; ``keep`` of that prompt then
    replaces the four-token entry (a prefix of it) by the six-token one.
    """

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"a prefix store holds at least one byte, got capacity {capacity}")
        self.capacity = capacity
        self._kept: OrderedDict[int, KeptPrefix] = OrderedDict()  # oldest first
        self._next = 0
        self.tokens = 0  # tokens held in all
        self.size = 0  # bytes held in all
        self.reused_tokens = 0  # prompt tokens restored instead of prefilled, since the store was made

    def __len__(self) -> int:
        return len(self._kept)

    def longest(self, tokens: np.ndarray) -> tuple[int, int]:
        """(key, length) of the kept prompt sharing the most leading tokens with ``tokens`` [T] ((-1, 0): none)."""
        best, length = -1, 0
        for key, kept in self._kept.items():
            shared = common_prefix(kept.tokens, tokens)
            if shared > length:
                best, length = key, shared
        return best, length

    def restore(self, tokens: np.ndarray, cache: Cache) -> int:
        """Write the slots of the longest kept prefix of ``tokens`` [T] into the empty ``cache``; how many
        (0: none shared). The entry becomes the most recently used."""
        key, length = self.longest(tokens)
        if length == 0:
            return 0
        kept = self._kept[key]
        self._kept.move_to_end(key)
        for index, (keys, values) in enumerate(zip(kept.keys, kept.values)):
            cache.update(keys[:, :, :length], values[:, :, :length], index)
        self.reused_tokens += length
        return length

    def keep(self, tokens: np.ndarray, cache: SlotCache, row: int = 0, index: torch.Tensor | None = None) -> None:
        """Keep a copy of the slots of ``cache``'s sequence ``row`` that hold ``tokens`` [L]: its first L slots,
        or those ``index`` [L] names (a batch's row, whose slots have holes). A kept prompt that is a prefix of
        ``tokens`` is replaced; where a kept one already begins with all of ``tokens``, that one is kept
        instead (made the most recently used)."""
        length = int(tokens.shape[0])
        if length == 0 or (index is not None and index.shape[0] != length):
            return
        layers = [layer for layer in cache.layers if isinstance(layer, SlotLayer) and layer.get_seq_length() >= length]
        if not layers or len(layers) < len(cache.layers):
            return  # (a layer of another kind, or one the prefill did not fill: nothing consistent to keep)
        size = length * sum(slot_bytes(layer.key_buffer) + slot_bytes(layer.value_buffer) for layer in layers)
        if size > self.capacity:
            return
        for key, kept in list(self._kept.items()):
            shared = common_prefix(kept.tokens, tokens)
            if shared == length:  # a kept prompt holds all of these already
                self._kept.move_to_end(key)
                return
            if shared == kept.tokens.shape[0]:  # superseded by this longer one
                self._drop(key)

        def taken(buffer: torch.Tensor) -> torch.Tensor:  # [A, H, capacity, D] -> a copy [1, H, L, D]
            part = buffer[row:row + 1]
            return part[:, :, :length].clone() if index is None else part.index_select(2, index)

        keys = [taken(layer.key_buffer) for layer in layers]
        values = [taken(layer.value_buffer) for layer in layers]
        while self._kept and self.size + size > self.capacity:
            self._drop(next(iter(self._kept)))
        self._kept[self._next] = KeptPrefix(tokens.copy(), keys, values, size)
        self._next += 1
        self.tokens += length
        self.size += size

    def clear(self) -> None:
        """Forget every kept prompt (and the count of tokens reused): as new."""
        self._kept.clear()
        self.tokens = self.size = self.reused_tokens = 0

    def _drop(self, key: int) -> None:
        kept = self._kept.pop(key)
        self.tokens -= int(kept.tokens.shape[0])
        self.size -= kept.size
