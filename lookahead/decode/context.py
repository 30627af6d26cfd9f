"""What one generate call's decode is given: the target, the config it runs with, the batch's cost
curve, what is learned across calls (acceptance tables, recycled successors, the memory) and the
factory of each sequence's sources. The generator builds one per call; the loop and the sequences
read it and never see the generator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..call.decoding import Decoding
from ..config import LookaheadConfig
from ..cost import CostModel
from ..model.prefixes import PrefixStore
from ..model.target import Target
from ..plan.acceptance import AcceptanceStats
from ..plan.planner import SCORE_DEPTH, regime
from ..proposers.base import Proposer
from ..proposers.memory import RequestMemory
from ..proposers.recycle import AdjacencyTable
from .sources import SourceFactory


@dataclass
class DecodeContext:
    """One call's decode: everything it reads besides the prompts and the call's own settings."""

    target: Target
    config: LookaheadConfig  # what decodes run with: the user's config, or with the window auto_window opened
    cost: CostModel | None  # the budget's curve for this batch size (None: a fixed budget)
    tables: dict[str, AcceptanceStats]  # acceptance estimates by regime, learned across calls (shared, not copied)
    recycled: AdjacencyTable | None  # the recycled successors, learned across calls
    memory: RequestMemory | None  # earlier requests' text (any object with RequestMemory's methods), or None
    sources: SourceFactory  # builds each sequence's candidate sources
    cost_for: Callable[[int], CostModel | None] | None = None  # the curve per batch size, where sequences join
    # and leave a running batch (None: ``cost`` throughout)
    prefixes: PrefixStore | None = None  # earlier prompts' prefilled slots, shared across calls (None: none kept)

    def acceptance(self, decoding: Decoding, proposers: list[Proposer]) -> AcceptanceStats:
        """The estimate table of this decoding's regime (made from the sources' priors when new)."""
        key = regime(decoding.do_sample, decoding.temperature) + ("+draft" if self.sources.draft is not None else "")
        if key not in self.tables:
            self.tables[key] = AcceptanceStats([p.priors for p in proposers], SCORE_DEPTH)
        return self.tables[key]
