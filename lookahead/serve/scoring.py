"""The scoring fields of a request and the logprobs of a reply, in OpenAI's shapes.

Request: ``presence_penalty`` / ``frequency_penalty`` (numbers in [-2, 2]), ``logit_bias`` (an object
mapping token ids, as strings, to biases in [-100, 100]), and the logprobs asked for: chat's
``logprobs`` (true / false) with ``top_logprobs`` (0-20, only with ``logprobs: true``), completions'
``logprobs`` (0-20 alternatives; OpenAI takes up to 5). Each bad value is a 400 naming the field and
the fix (``scoring_fields``).

Reply: every token the engine produced for the reply (up to and including the one where a stop string
was met, the tokens the usage counts) with its logprob and alternatives (call/logprobs.py says from
which distribution): chat ``choices[].logprobs = {"content": [{token, logprob, bytes, top_logprobs:
[{token, logprob, bytes}]}], "refusal": null}``; completions ``choices[].logprobs = {tokens,
token_logprobs, top_logprobs: [{token: logprob}], text_offset}``, each token's text offset counted from
the start of the completion's text. A token's text is its own decoding (a token that ends inside a
character shows U+FFFD; ``bytes`` are that text's UTF-8). A logprob of -inf (a token no distribution
can reach) is reported as -9999.0, as vLLM reports it: JSON has no infinity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import BIAS_RANGE, MAX_TOP_LOGPROBS, PENALTY_RANGE, StepLogprobs
from .schemas import ChatRequest, Common, bad_request

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

FLOOR = -9999.0  # what a logprob of -inf is reported as


@dataclass(frozen=True)
class Scoring:
    """A request's scoring settings, checked."""

    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias)
    logprobs: int | None = None  # alternatives per token (0: the chosen token's alone); None: no logprobs


@dataclass(frozen=True)
class TokenScore:
    """One reply token's logprob and its alternatives (likeliest first)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


def scoring_fields(request: Common, vocab: int) -> Scoring:
    """The request's scoring fields, checked against the model's ``vocab`` (APIError 400 naming the field)."""
    if isinstance(request, ChatRequest):
        logprobs = _chat_logprobs(request.logprobs, request.top_logprobs)
    else:
        logprobs = _count("logprobs", getattr(request, "logprobs", None),
                          "the likeliest tokens reported beside each token")
    return Scoring(_penalty("presence_penalty", request.presence_penalty),
                   _penalty("frequency_penalty", request.frequency_penalty),
                   _logit_bias(request.logit_bias, vocab), logprobs)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _penalty(name: str, value: Any) -> float:
    if value is None:
        return 0.0
    if not _number(value) or not PENALTY_RANGE[0] <= value <= PENALTY_RANGE[1]:
        raise bad_request(f"'{name}' must be a number in [-2, 2] (0: off), got {value!r}", name, "invalid_value")
    return float(value)


def _logit_bias(value: Any, vocab: int) -> tuple[tuple[int, float], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise bad_request("'logit_bias' must be an object mapping token ids to biases in [-100, 100], e.g. "
                          "{\"50256\": -100}", "logit_bias", "invalid_value")
    out = []
    for key, bias in value.items():
        token = int(key) if isinstance(key, str) and key.isascii() and key.isdigit() else None
        if token is None or token >= vocab:
            raise bad_request(f"'logit_bias' key {key!r} is no token id of this model: send token ids in "
                              f"[0, {vocab}) as strings", "logit_bias", "invalid_value")
        if not _number(bias) or not BIAS_RANGE[0] <= bias <= BIAS_RANGE[1]:
            raise bad_request(f"'logit_bias[\"{key}\"]' must be a number in [-100, 100], got {bias!r}",
                              "logit_bias", "invalid_value")
        out.append((token, float(bias)))
    return tuple(out)


def _count(name: str, value: Any, what: str) -> int | None:
    """An integer in [0, MAX_TOP_LOGPROBS] (None: left out)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise bad_request(f"'{name}' must be an integer in [0, {MAX_TOP_LOGPROBS}] ({what}), got {value!r}", name,
                          "invalid_value")
    return value


def _chat_logprobs(logprobs: Any, top: Any) -> int | None:
    if logprobs is not None and not isinstance(logprobs, bool):
        raise bad_request(f"'logprobs' must be true or false, got {logprobs!r}; the number of alternatives "
                          f"goes in 'top_logprobs'", "logprobs", "invalid_value")
    count = _count("top_logprobs", top, "the likeliest tokens reported beside each token")
    if count and not logprobs:
        raise bad_request("'top_logprobs' needs \"logprobs\": true: send both, or leave top_logprobs out",
                          "top_logprobs", "invalid_value")
    return (count or 0) if logprobs else None


def token_scores(tokens: list[int], step: StepLogprobs | None) -> list[TokenScore]:
    """The logprobs an engine event carried for its ``tokens`` (none when the request asked for none)."""
    if step is None:
        return []
    return [TokenScore(int(token), float(step.logprobs[i]),
                       tuple((int(t), float(v)) for t, v in zip(step.top_ids[i], step.top_logprobs[i])))
            for i, token in enumerate(tokens)]


class LogprobShape:
    """A reply's logprobs in OpenAI's shape for its endpoint, chunk by chunk (offsets run across chunks)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, chat: bool) -> None:
        self.tokenizer, self.chat = tokenizer, chat
        self.offset = 0  # completions: the text offset of the next token

    def text(self, token: int) -> str:
        return str(self.tokenizer.decode([token], skip_special_tokens=False, clean_up_tokenization_spaces=False))

    def field(self, scores: list[TokenScore]) -> dict[str, Any]:
        """``choices[].logprobs`` for ``scores``."""
        if self.chat:
            return {"content": [self._chat_entry(s) for s in scores], "refusal": None}
        texts = [self.text(s.token) for s in scores]
        offsets = []
        for text in texts:
            offsets.append(self.offset)
            self.offset += len(text)
        return {"tokens": texts, "token_logprobs": [_finite(s.logprob) for s in scores],
                "top_logprobs": [{self.text(t): _finite(v) for t, v in s.top} for s in scores],
                "text_offset": offsets}

    def _chat_entry(self, score: TokenScore) -> dict[str, Any]:
        entry = self._chat_token(score.token, score.logprob)
        entry["top_logprobs"] = [self._chat_token(t, v) for t, v in score.top]
        return entry

    def _chat_token(self, token: int, logprob: float) -> dict[str, Any]:
        text = self.text(token)
        return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode("utf-8"))}


def _finite(value: float) -> float:
    return value if value > FLOOR else FLOOR


def take(held: list[TokenScore]) -> list[TokenScore]:
    """Everything in ``held``, which is emptied."""
    out = list(held)
    held.clear()
    return out


def reply_shape(tokenizer: PreTrainedTokenizerBase, scoring: Scoring, chat: bool) -> LogprobShape | None:
    """The shape a reply's logprobs take (None: the request asked for none)."""
    return LogprobShape(tokenizer, chat) if scoring.logprobs is not None else None
