"""A request's stop strings as the engine checks them: on the reply's text as the server shows it.

transformers' ``StopStringCriteria`` (what ``generate(stop_strings=...)`` uses, as ``model.generate``
does) builds a table of the whole vocabulary by the stop strings' length before the first token, on
the decode thread, and keeps it in a cache: seconds and gigabytes for a long stop string, while every
other stream in the batch waits. The server's contract is the text's (OpenAI's: the reply ends before
the first stop string in its text), which ``ReplyText`` (text.py) already reads token by token for the
stream, so the engine stops a sequence by the same reading: ``ReplyStops`` feeds each new token to a
``ReplyText`` of its own and fires at the token whose text completes a stop string. Nothing is built
ahead and nothing is kept beyond the reply's last few tokens of text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from transformers.generation.stopping_criteria import StoppingCriteria

from .text import ReplyText

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class ReplyStops(StoppingCriteria):
    """Fires once the reply after ``prompt`` meets one of ``stops`` in its text (then on every later call).

    Called as the decode loop calls stopping criteria (call/stopping.py): with the sequence so far, prompt
    first, one new token more each call (several a step where a tree was accepted). Each call reads the
    tokens past those already read, so the text is decoded once, incrementally.

    prompt [5 tokens], stops ["\\n\\n"]: the reply "Hi.", "\\n", "\\nBye" fires at the third token.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt: Sequence[int], stops: Sequence[str]) -> None:
        if not stops:
            raise ValueError("stops is empty: a ReplyStops needs at least one stop string")
        self.text = ReplyText(tokenizer, prompt, stops)
        self.read = len(prompt)  # tokens of the sequence read so far (the prompt is not reply text)
        self.stopped = False

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        """[B] whether the reply (``input_ids`` [1, L]: prompt and reply so far) has met a stop string."""
        length = int(input_ids.shape[-1])
        if not self.stopped and length > self.read:
            _, self.stopped = self.text.push(input_ids[0, self.read:].tolist())
            self.read = length
        return torch.full((input_ids.shape[0],), self.stopped, dtype=torch.bool,  # type: ignore[return-value]
                          device=input_ids.device)
