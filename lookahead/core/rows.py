"""Which rows of a step's logits are which: shared by the planner, the sequence and the verifier."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class RowMap:
    """Where the kept logit rows [K] of a step come from: the window's kept rows, then the tree."""

    lead: int  # kept rows before the tree's (the window's; x is kept row 0)
    window: int  # W
    ngram: int  # N

    def window_rows(self) -> slice:
        """Kept rows of the window's last level [W]."""
        return slice(0, self.window) if self.ngram == 2 else slice(1, 1 + self.window)

    def decision_rows(self, nodes: int, device: torch.device | str) -> torch.Tensor:
        """Kept rows [1 + M] of x and the tree nodes."""
        return torch.cat([torch.zeros(1, dtype=torch.long, device=device),
                          self.lead + torch.arange(nodes, device=device)])  # made on the device: no copy


@dataclass(frozen=True)
class DrawnRows:
    """Decision rows whose next token a draft DREW from its distribution q (sampling)."""

    rows: np.ndarray  # [R] decision rows (0 = x, 1 + i = tree node i)
    tokens: np.ndarray  # [R] the drawn token after each
    q: torch.Tensor  # [R, V] the distribution each was drawn from (on the draft's device)
