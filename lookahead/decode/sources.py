"""The candidate sources of one sequence, in priority order (the order also fixes their estimate blocks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..call.decoding import Decoding
from ..config import LookaheadConfig
from ..cost import CostModel
from ..model.fewrows import FewRowLinear
from ..proposers.base import Proposer
from ..proposers.context import ContextMatcher
from ..proposers.draft.drafter import Drafter
from ..proposers.draft.proposer import DraftProposer
from ..proposers.grammar import ForcedTokens, NoForcedTokens
from ..proposers.memory import MemoryProposer, RequestMemory
from ..proposers.ngram import NgramPool, NgramProposer, WindowProposer
from ..proposers.prediction import NoPrediction, PredictionSource
from ..proposers.recycle import AdjacencyTable, RecyclingProposer
from ..verify.grammar import grammar_of


@dataclass(frozen=True)
class DraftModel:
    """A small causal LM drafting for the target, with what its forwards need."""

    model: Any  # a transformers causal LM with the target's vocabulary
    cost: CostModel | None  # its forward-cost curve (None: a fixed budget drafts draft_tokens)
    linears: FewRowLinear  # its linear layers, wrapped once per generator (model/fewrows.py)


class SequenceSources(NamedTuple):
    """One sequence's sources, and those among them whose counters go into the stats."""

    sources: list[Proposer]  # in priority order
    draft: DraftProposer | None  # the draft model's source (None: no draft)
    prediction: PredictionSource | None  # the request's predicted output (None: no prediction)


@dataclass(frozen=True)
class SourceFactory:
    """Builds one sequence's sources under ``config``: its predicted output (every sequence has the
    source, inert without a prediction, so that its block in the estimate table stays put), the draft
    (if any), the context matcher, the memory, the n-gram pool, recycling and the window's own pool,
    as the config turns them on, and for a call constrained by a grammar the tokens it forces."""

    config: LookaheadConfig
    memory: RequestMemory | None  # shared by every sequence and call
    recycled: AdjacencyTable | None  # shared by every sequence and call
    draft: DraftModel | None = None

    def build(self, decoding: Decoding | None, cost: CostModel | None, pool: NgramPool, window_pool: NgramPool | None,
              seed: int, prediction: np.ndarray | None = None) -> SequenceSources:
        """One sequence's sources; ``decoding``: what a draft drafts under (None: an engine that decodes
        itself, as vLLM, and so builds without a draft); ``cost``: the batch's curve; ``seed``: the stream a
        draft draws its tokens from when sampling; ``prediction``: the request's predicted output [P] (None:
        none)."""
        cfg = self.config
        predicted = PredictionSource(prediction, cfg.max_tree_nodes + 1) if prediction is not None else None
        sources: list[Proposer] = [predicted if predicted is not None else NoPrediction()]
        draft = None
        if self.draft is not None:
            if decoding is None:
                raise ValueError("a draft model drafts under the call's decoding: pass it to build, or build "
                                 "the factory without a draft")
            routing = self.draft.cost.routing if self.draft.cost is not None else None
            drafter = Drafter(self.draft.model, routing, cfg.draft_context, self.draft.linears)
            draft = draft_proposer(drafter, self.draft.cost, cfg, decoding, cost, seed)
            sources.append(draft)
        if cfg.context_match:
            sources.append(ContextMatcher(cfg.match_min, cfg.match_max, cfg.match_length))
        if self.memory is not None:
            sources.append(MemoryProposer(self.memory, cfg.match_length))
        if cfg.ngram_pool:
            sources.append(NgramProposer(pool, cfg.seed_from_prompt, cfg.seed_from_output))
        if self.recycled is not None:
            sources.append(RecyclingProposer(self.recycled, cfg.max_tree_nodes))
        if window_pool is not None:
            sources.append(WindowProposer(window_pool))
        mask = grammar_of(decoding.processors if decoding is not None else ())
        # the tokens a constrained call's grammar forces; for every other call an inert source in its place,
        # so that the shared estimate table's blocks are the same for both
        sources.append(ForcedTokens(mask.grammar, mask.stop, cfg.max_tree_nodes + 1) if mask is not None
                       else NoForcedTokens())
        return SequenceSources(sources, draft, predicted)


def draft_proposer(drafter: Drafter, draft_cost: CostModel | None, cfg: LookaheadConfig, decoding: Decoding,
                   cost: CostModel | None, seed: int) -> DraftProposer:
    """The draft model as a source; its chains stop where a draft forward costs more than it yields."""

    def ratio(rows: int) -> float:
        """A draft forward over ``rows`` rows, in plain target steps (x alone: the planner's unit)."""
        if cost is None or draft_cost is None:  # a fixed budget: draft up to draft_tokens
            return 0.0
        return float(draft_cost.step(rows)) / float(cost.step(1))

    return DraftProposer(drafter, decoding, cfg.draft_tokens, cfg.draft_alternatives, ratio, seed, draft_cost)
