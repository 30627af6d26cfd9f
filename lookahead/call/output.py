"""The sequence being generated: prompt + accepted tokens, the stop cut, the streamer.

A step's tokens are cut at the first EOS, at the budget, or right after the
first token at which a stopping criterion fires (call/stopping.py): exactly where
model.generate, which asks after every token, would have stopped. Only the
kept tokens reach the streamer, in order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from .logprobs import LogprobLog, StepLogprobs
from .stopping import first_hit

if TYPE_CHECKING:
    from transformers.generation.streamers import BaseStreamer


def first_stop(new: np.ndarray, eos: np.ndarray, remaining: int) -> tuple[np.ndarray, bool]:
    """Cut new tokens [k] at the first EOS (kept) or at the budget ``remaining``; whether decoding ends.

    first_stop([5 2 7], eos [2], 10) -> ([5 2], True); first_stop([5 6 7], eos [2], 2) -> ([5 6], True).
    """
    # (a step's few tokens as Python ints: a numpy call's fixed cost, on a CPU whose caches the forward
    # just flushed, exceeds this loop over a few tokens)
    end = min(new.shape[0], remaining)
    if eos.size:
        stops = eos.tolist()
        for i, token in enumerate(new[:end].tolist()):
            if token in stops:
                return new[:i + 1], True
    return new[:end], end >= remaining


class OutputBuffer:
    """``seq[:stop]`` is the prompt followed by every token accepted so far.

    The buffer grows as tokens arrive (a huge max_new_tokens allocates
    nothing up front); readers take ``seq`` afresh each time they need it.
    """

    GROWTH = 256  # tokens of headroom added when the buffer fills

    def __init__(self, prompt: np.ndarray, limit: int, eos: np.ndarray, streamer: BaseStreamer | None = None,
                 criteria: tuple = (), device: torch.device | str = "cpu", logprobs: int | None = None):
        self.prompt_len = int(prompt.shape[0])
        self.limit, self.eos, self.streamer = limit, eos, streamer
        self.criteria, self.device = criteria, device  # stopping criteria, and where they get input_ids
        # the kept tokens' logprobs (k alternatives each), or None when the call asks for none
        self.log = LogprobLog(logprobs) if logprobs is not None else None
        self.seq = np.zeros(self.prompt_len + min(limit, self.GROWTH) + 1, dtype=np.int64)  # [T + headroom + 1]
        self.seq[:self.prompt_len] = prompt
        self.stop = self.prompt_len
        if streamer is not None:
            streamer.put(torch.from_numpy(prompt.copy()))

    @property
    def new_tokens(self) -> int:
        """Tokens accepted so far (the prompt not counted)."""
        return self.stop - self.prompt_len

    @property
    def last(self) -> int:
        """The last token of the sequence (x of the next step)."""
        return int(self.seq[self.stop - 1])

    def append(self, new: np.ndarray, logprobs: StepLogprobs | None = None) -> bool:
        """Write new tokens (cut at EOS / budget / a stopping criterion), stream them; whether decoding ends.

        ``logprobs``: the new tokens' (as many rows), kept for those kept; a streamer with a
        ``put_logprobs`` method receives them just before the tokens' ``put``."""
        new, done = first_stop(new, self.eos, self.limit - self.new_tokens)
        start, end = self.stop, self.stop + new.shape[0]
        if end >= self.seq.shape[0]:
            grown = np.zeros(end + self.GROWTH, dtype=np.int64)
            grown[:start] = self.seq[:start]
            self.seq = grown
        self.seq[start:end] = new
        hit = first_hit(self.criteria, self.seq, start, end, self.device) if self.criteria else None
        if hit is not None:
            end, done = start + hit + 1, True
        self.stop = end
        if self.log is not None and logprobs is not None and end > start:
            kept = logprobs.head(end - start)
            self.log.add(self.seq[start:end], kept)
            if self.streamer is not None and hasattr(self.streamer, "put_logprobs"):
                self.streamer.put_logprobs(kept)
        if self.streamer is not None and end > start:
            self.streamer.put(torch.from_numpy(self.seq[start:end].copy()))
        return done

    def finish(self) -> np.ndarray:
        """End the stream; prompt + new tokens [T + n]."""
        if self.streamer is not None:
            self.streamer.end()
        return self.seq[:self.stop].copy()
