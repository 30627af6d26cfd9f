"""The candidate sources of one sequence, in priority order (the order also fixes their estimate blocks)."""

from __future__ import annotations

from ..call.decoding import Decoding
from ..proposers.context import ContextMatcher
from ..proposers.draft.drafter import Drafter
from ..proposers.draft.proposer import DraftProposer
from ..proposers.memory import MemoryProposer
from ..proposers.ngram import NgramPool, NgramProposer, WindowProposer
from ..proposers.recycle import AdjacencyTable, RecyclingProposer


def build_proposers(gen, cfg, decoding: Decoding, cost, pool: NgramPool, window_pool: NgramPool | None,
                    recycled: AdjacencyTable | None, seed: int) -> tuple[list, DraftProposer | None]:
    """(the sources, the draft model's source or None: its counters go into the stats) for one
    sequence decoded under ``cfg``.

    ``seed``: the stream a draft draws its tokens from when sampling.
    """
    sources, draft = [], None
    if gen.draft_model is not None:
        drafter = Drafter(gen.draft_model, gen.draft_cost.routing if gen.draft_cost is not None else None,
                          cfg.draft_context, gen.draft_linears)
        draft = draft_proposer(drafter, gen.draft_cost, cfg, decoding, cost, seed)
        sources.append(draft)
    if cfg.context_match:
        sources.append(ContextMatcher(cfg.match_min, cfg.match_max, cfg.match_length))
    if gen.memory is not None:
        sources.append(MemoryProposer(gen.memory, cfg.match_length))
    if cfg.ngram_pool:
        sources.append(NgramProposer(pool, cfg.seed_from_prompt, cfg.seed_from_output))
    if recycled is not None:
        sources.append(RecyclingProposer(recycled, cfg.max_tree_nodes))
    if window_pool is not None:
        sources.append(WindowProposer(window_pool))
    return sources, draft


def draft_proposer(drafter: Drafter, draft_cost, cfg, decoding: Decoding, cost, seed: int) -> DraftProposer:
    """The draft model as a source; its chains stop where a draft forward costs more than it yields."""

    def ratio(rows: int) -> float:
        """A draft forward over ``rows`` rows, in plain target steps (x alone: the planner's unit)."""
        if cost is None or draft_cost is None:  # a fixed budget: draft up to draft_tokens
            return 0.0
        return float(draft_cost.step(rows)) / float(cost.step(1))

    return DraftProposer(drafter, decoding, cfg.draft_tokens, cfg.draft_alternatives, ratio, seed, draft_cost)
