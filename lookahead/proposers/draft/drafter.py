"""The draft model's KV cache, kept in step with the accepted tokens of one sequence.

The draft (a small causal LM sharing the target's vocabulary) runs plain
causal forwards over its own cache: ``sync`` brings the cache to the
accepted sequence (crop what was rejected, feed what it has not seen, the
bonus token included) and returns the draft's logits after x; ``feed``
appends one drafted token and returns the logits after it. The cache
remembers which tokens it holds, so a drafted token that the target then
accepted is never fed twice. It starts empty: the first ``sync`` feeds the
prompt.

A catch-up is bounded by ``context`` rows: when the draft would have to
read more than that (a long prompt, or many tokens accepted while it was
silent), it starts over on the last ``context`` tokens alone, as if the
text began there. Reading a long prompt can cost a draft as much as many
target steps; its proposals only need the recent text (the target
verifies every token, so what the draft reads never changes the output,
only how often it is right).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from ...model.cache import cache_keyword, new_cache
from ...model.fewrows import FewRowLinear
from ...model.routing import Routing, route_mode
from ...model.target import input_device, to_device

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def common_prefix(held: np.ndarray, seq: np.ndarray) -> int:
    """Length of the longest common prefix of held[H] and seq[T].

    held [1 2 3 9], seq [1 2 3 4 5] -> 3.
    """
    size = min(held.shape[0], seq.shape[0])
    differ = np.flatnonzero(held[:size] != seq[:size])
    return int(differ[0]) if differ.shape[0] else size


class Drafter:
    """One sequence's draft-model state: its cache and the tokens [H] it holds."""

    def __init__(self, model: PreTrainedModel, routing: Routing | None = None, context: int = 0,
                 linears: FewRowLinear | None = None):
        """``context``: most rows one catch-up feeds (0: no bound, the whole text). ``routing``: how
        the draft's forwards run on this CPU, measured with its cost curve (None: as torch is set);
        ``linears``: the draft's linear layers for the routes that reroute them (built once per model:
        wrapping them costs milliseconds; None: built here when there is a routing)."""
        self.model = model
        self.context = context
        self.routing = routing
        self.linears = linears if linears is not None or routing is None else FewRowLinear(model)
        self.device = input_device(model)
        self.cache = new_cache()  # written in place, cropped by its length
        self.cache_keyword = cache_keyword(model)  # how the forward takes the KV cache (transformers' version)
        self.held = np.zeros(0, dtype=np.int64)  # [H] tokens whose KV the cache holds: seq[start:start + H]
        self.start = 0  # where in the sequence the held tokens begin (> 0 after a bounded catch-up)
        self.forwards = 0  # draft forward passes run (prefill included)
        self.last_rows = 0  # rows fed by the latest forward

    def begin(self, seq: np.ndarray, stop: int) -> None:
        """A new sequence whose prompt is seq[:stop]: the cache starts empty, and the first
        ``sync`` feeds the prompt (a draft that never drafts never reads it)."""
        self._restart(0)

    def _restart(self, start: int) -> None:
        """An empty cache whose first token will be seq[start]."""
        self.cache = new_cache()  # written in place, cropped by its length
        self.held = np.zeros(0, dtype=np.int64)
        self.start = start

    def _kept(self, seq: np.ndarray, stop: int) -> int:
        """How many held tokens the next ``sync`` to seq[:stop] keeps (x is always fed again: its
        logits are needed), or -1 when it starts over (more than ``context`` rows to feed)."""
        keep = min(common_prefix(self.held, seq[self.start:stop]), stop - self.start - 1)
        if self.context and stop - self.start - keep > self.context:
            return -1
        return keep

    def pending(self, seq: np.ndarray, stop: int) -> int:
        """Rows the next ``sync`` to seq[:stop] feeds.

        With context 4, holding seq[0:2] of a 9-token seq: pending(seq, 9) = 4 (it starts over
        on seq[5:9]), where an unbounded drafter feeds 7.
        """
        keep = self._kept(seq, stop)
        return min(stop, self.context) if keep < 0 else stop - self.start - keep

    def sync(self, seq: np.ndarray, stop: int) -> torch.Tensor:
        """Bring the cache to seq[:stop] (x last) and return the draft's logits after x: [V]."""
        keep = self._kept(seq, stop)
        if keep < 0:
            self._restart(max(0, stop - self.context))
            keep = 0
        if keep < self.held.shape[0]:
            self.cache.crop(keep - self.held.shape[0])  # negative: the rows to drop (transformers 5.x)
            self.held = self.held[:keep]
        return self._run(seq[self.start + keep:stop])

    def feed(self, token: int) -> torch.Tensor:
        """Append one drafted token; the draft's logits after it: [V]."""
        return self._run(np.array([token], dtype=np.int64))

    def _run(self, tokens: np.ndarray) -> torch.Tensor:
        """One causal forward over tokens [T] after the held ones; the last row's logits [V]."""
        rows = int(tokens.shape[0])
        began = time.perf_counter()
        with route_mode(self.routing.route_for(rows) if self.routing is not None else None, rows, self.linears):
            out = self.model(input_ids=to_device(tokens, self.device)[None], use_cache=True, logits_to_keep=1,
                             **{self.cache_keyword: self.cache})
        if self.routing is not None:  # (only on the CPU, where a forward has run when it returns)
            self.routing.observe(rows, time.perf_counter() - began)
        logits = out.logits[0, -1]  # [V]
        self.held = np.concatenate([self.held, tokens])
        self.forwards += 1
        self.last_rows = int(tokens.shape[0])
        return logits
