"""A generate call through an open batch: its left-padded prompts enter together (``OpenBatch.admit``: one
padded prefill, as model.generate's), the batch steps until every row has ended (``OpenBatch.step``, the
server's loop), then the rows [B, T + N] and the call's stats are made from the rows' handles.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..call.decoding import Decoding
from ..call.stats import GenerationStats
from .batch import BatchHandle, OpenBatch

if TYPE_CHECKING:
    from transformers.generation.streamers import BaseStreamer


def decode_padded(batch: OpenBatch, ids: torch.Tensor, mask: torch.Tensor, prompts: list[np.ndarray],
                  decoding: Decoding, streamer: BaseStreamer | None = None,
                  contexts_left: list[int | None] | None = None,
                  predictions: list[np.ndarray | None] | None = None) -> tuple[torch.Tensor, list[BatchHandle]]:
    """Decode a left-padded batch to its end in ``batch`` (a fresh one, holding no sequence).

    Args:
        ids, mask: [B, T] on the CPU, left-padded; ``prompts``: B rows [T_b] without their padding.
        decoding: the call's settings; streamer, contexts_left, predictions: as ``OpenBatch.admit`` takes them.

    Returns:
        ([B, T + N] each padded prompt, its new tokens, then pad_token_id up to the longest row; the rows'
        handles). ``batch.stats`` then holds the call's stats. A row whose end failed in its sources'
        bookkeeping raises that error here, once every row has ended.
    """
    memory = batch.run.memory
    start = time.perf_counter()
    memory_before = memory.seconds if memory is not None else 0.0
    handles = batch.admit(ids, mask, prompts, decoding, streamer, contexts_left, predictions)
    while batch.handles:
        batch.step()
    for handle in handles:
        if handle.error is not None:
            raise handle.error
    out = padded_rows(ids, [handle.output_ids for handle in handles], decoding.pad_token_id)
    _sum_up(batch.stats, handles, time.perf_counter() - start)
    if memory is not None:
        batch.stats.memory_s = memory.seconds - memory_before
    return out, handles


def padded_rows(ids: torch.Tensor, new: list[np.ndarray], pad: int | None) -> torch.Tensor:
    """[B, T + n]: each prompt row of ``ids`` [B, T], its new tokens ``new`` [n_b], then ``pad`` up to the
    longest row (ValueError when rows differ in length and there is no pad id)."""
    longest = max(n.shape[0] for n in new)
    if any(n.shape[0] < longest for n in new) and pad is None:
        raise ValueError("rows finished at different lengths and the model has no pad_token_id (nor an "
                         "eos_token_id): set model.generation_config.pad_token_id")
    tail = np.full((len(new), longest), pad if pad is not None else 0, dtype=np.int64)  # [B, n]
    for b, n in enumerate(new):
        tail[b, :n.shape[0]] = n
    return torch.cat([ids, torch.from_numpy(tail)], dim=1)


def _sum_up(stats: GenerationStats, handles: list[BatchHandle], wall_s: float) -> None:
    """The call's totals over its rows into ``stats`` (the steps' own entries are there already)."""
    stats.wall_time_s = wall_s
    stats.new_tokens = sum(handle.new_tokens for handle in handles)
    stats.draft_forwards = sum(handle.stats.draft_forwards for handle in handles)
    stats.drafted = sum(handle.stats.drafted for handle in handles)
    stats.accepted_prediction_tokens = sum(handle.stats.accepted_prediction_tokens for handle in handles)
    stats.rejected_prediction_tokens = sum(handle.stats.rejected_prediction_tokens for handle in handles)
