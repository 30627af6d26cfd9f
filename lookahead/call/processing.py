"""The target's processed scores at every verified row of a step.

``process_rows`` applies a decode's processor list (call/decoding.py) at every verified row of a step with
the row's OWN prefix: the prompt, the output so far, then the tree tokens
from x down to that row. Processors that only look at the scores row
(temperature, top-k, top-p, ...) run once over all rows; the others run once
per tree depth, over the rows of that depth, with input ids
[sequence | path to the row].
"""

from __future__ import annotations

import numpy as np
import torch

from ..call.decoding import Decoding
from ..model.target import to_device


def process_rows(decoding: Decoding, scores: torch.Tensor, seq: np.ndarray, stop: int, paths: np.ndarray,
                 depths: np.ndarray) -> torch.Tensor:
    """Processed scores [R, V] of rows whose prefix is seq[:stop] + paths[r, :depths[r]].

    scores [R, V] are the raw logits of the rows (float32 or the model's
    dtype); paths [R, D] the tree tokens from x down to each row (row 0 is x
    itself: depth 0).
    """
    if not decoding.processors:
        return scores
    scores = scores.float()
    prefix = None
    for wise, procs in decoding.segments:
        if wise:
            for proc in procs:
                scores = proc(None, scores)
            continue
        if prefix is None:
            prefix = to_device(seq[:stop].copy(), scores.device)  # [T]
            paths_t = to_device(paths, scores.device)  # [R, D]
            groups = [(d, np.flatnonzero(depths == d)) for d in np.unique(depths)]
        out = scores.clone()
        for depth, rows in groups:
            index = to_device(rows, scores.device)
            ids = torch.cat([prefix.expand(rows.shape[0], -1), paths_t[index, :depth]], dim=1)  # [n, T + d]
            part = scores[index]  # [n, V]
            for proc in procs:
                part = proc(ids, part)
            out[index] = part
        scores = out
    return scores
