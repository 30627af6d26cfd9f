"""The config's machine switches, as the target and the cost measurement take them: one value, not six flags."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import LookaheadConfig


@dataclass(frozen=True)
class ForwardSwitches:
    """How a step's forward may run here (each a LookaheadConfig field; none changes the numbers a row gets
    beyond what that field's documentation says). Worked example: ``ForwardSwitches.of(LookaheadConfig(
    traced_forward=False))`` -> ForwardSwitches(traced=False, ...) with the other defaults."""

    graphs: bool = False  # cuda_graphs: one sequence's steps replayed as CUDA graphs (model/graphs.py)
    traced: bool = False  # traced_forward: steps replayed from a TorchScript trace on the CPU (model/traced.py)
    native: bool = True  # native_linear: the C++ op and its tiled kernel (model/fewrows.py, native/)
    attention: bool = True  # native_attention: grouped-query attention through that op (model/attention.py)
    few_row_matmul: bool = True  # few_row_matmul: lookahead's linear kernel among the routes; prompts through it
    onednn: bool = False  # onednn_linear: torch's oneDNN linear among the routes the cost measurement tries
    heap: bool = True  # keep_freed_memory: the C heap keeps a forward's freed memory for the next (model/heap.py)

    @classmethod
    def of(cls, config: LookaheadConfig) -> ForwardSwitches:
        """The switches a config sets."""
        return cls(graphs=config.cuda_graphs, traced=config.traced_forward, native=config.native_linear,
                   attention=config.native_attention, few_row_matmul=config.few_row_matmul,
                   onednn=config.onednn_linear, heap=config.keep_freed_memory)
