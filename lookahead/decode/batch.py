"""An open batch: the public way to decode many requests together (``LookaheadGenerator.open_batch``).

Requests ``join`` with their own settings (the arguments ``generate`` takes for one prompt, resolved by
generate's own path over the model's generation_config: decode/settings.py), the batch ``step``s every
running one together (decode/loop.py's ``DecodeRun``: one forward per step), and they leave between
steps: finished (EOS, a stop string, max_new_tokens, the model's context) or cancelled (``leave``). Each
sequence decodes exactly as ``generate`` decodes it alone: a greedy one gives model.generate's tokens on
its prompt, a seeded sampled one the same text whatever else is in the batch.

``step`` returns one ``BatchEvent`` per sequence that gained tokens or ended in it: its new tokens (cut
where generate cuts them), their logprobs when asked for, and on its last event the finish reason.
A sequence that ends is finished there: its sources hear of it (the generator's memory keeps its text).
A failure in that bookkeeping ends that sequence alone with finish reason "error" (``BatchHandle.error``);
an exception inside a step leaves the batch unusable: open a new one.

``generate`` decodes through the same batch and steps (decode/padded.py): its left-padded prompts enter
together (``admit``: one padded prefill, as model.generate's), then step until every one has ended.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..call.decoding import Decoding
from ..call.grammar import Grammar
from ..call.inputs import tokens_left_in_context
from ..call.logprobs import SequenceLogprobs, StepLogprobs
from ..call.prediction import prediction_rows
from ..call.stats import GenerationStats
from ..errors import GenerateInputError
from .loop import DecodeRun
from .sequence import Sequence
from .settings import call_decoding

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from transformers.generation import LogitsProcessorList, StoppingCriteriaList
    from transformers.generation.streamers import BaseStreamer

FINISH_REASONS = ("stop", "length", "cancelled", "error")  # a BatchHandle's finish_reason once it ended
SEED_RANGE = (-(2 ** 63), 2 ** 64 - 1)  # what torch.Generator.manual_seed takes


class _Collector:
    """A streamer (transformers' put / end, and put_logprobs) gathering a sequence's tokens until drained.

    The output buffer puts the prompt first (as ``model.generate`` streams): that one is skipped.
    ``forward``: a user's streamer (generate's) that receives every call as it comes, the prompt included;
    ``put_logprobs`` only where it has that method."""

    def __init__(self, forward: BaseStreamer | None = None) -> None:
        self.prompt_seen = False
        self.tokens: list[int] = []
        self.logprobs: list[StepLogprobs] = []
        self.forward = forward

    def put_logprobs(self, step: StepLogprobs) -> None:
        self.logprobs.append(step)
        if self.forward is not None and hasattr(self.forward, "put_logprobs"):
            self.forward.put_logprobs(step)

    def put(self, value: torch.Tensor) -> None:
        if self.forward is not None:
            self.forward.put(value)
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.tokens.extend(value.reshape(-1).tolist())

    def end(self) -> None:
        """The forwarded streamer's end; nothing else: the final event is the batch's (it knows the finish
        reason)."""
        if self.forward is not None:
            self.forward.end()

    def drain(self) -> tuple[list[int], StepLogprobs | None]:
        """The tokens put since the last drain and their logprobs (None: none asked for)."""
        tokens, self.tokens = self.tokens, []
        steps, self.logprobs = self.logprobs, []
        if not steps:
            return tokens, None
        if len(steps) == 1:
            return tokens, steps[0]
        return tokens, StepLogprobs(np.concatenate([s.logprobs for s in steps]),
                                    np.concatenate([s.top_ids for s in steps]),
                                    np.concatenate([s.top_logprobs for s in steps]))


class BatchHandle:
    """One sequence of an open batch: what it produced so far and, once it ended, why."""

    def __init__(self, seq: Sequence, collector: _Collector):
        self._seq, self._collector = seq, collector
        self.finish_reason: str | None = None  # one of FINISH_REASONS once the sequence ended
        self.error: BaseException | None = None  # with finish_reason "error": what failed

    @property
    def prompt_tokens(self) -> int:
        return self._seq.out.prompt_len

    @property
    def new_tokens(self) -> int:
        """Tokens produced so far (the prompt not counted)."""
        return self._seq.out.new_tokens

    @property
    def output_ids(self) -> np.ndarray:
        """[n] the new tokens so far (a copy)."""
        out = self._seq.out
        return out.seq[out.prompt_len:out.stop].copy()

    @property
    def logprobs(self) -> SequenceLogprobs | None:
        """The new tokens' logprobs so far (None: the sequence asked for none)."""
        log = self._seq.out.log
        return log.result() if log is not None else None

    @property
    def prediction_tokens(self) -> tuple[int, int]:
        """(accepted, rejected) predicted tokens (Predicted Outputs), final once the sequence ended."""
        return self._seq.stats.accepted_prediction_tokens, self._seq.stats.rejected_prediction_tokens

    @property
    def cached_prompt_tokens(self) -> int:
        """Prompt tokens whose cache slots the prefix store gave back (model/prefixes.py), not prefilled."""
        return self._seq.stats.cached_prompt_tokens

    @property
    def stats(self) -> GenerationStats:
        """This sequence's own stats (tokens accepted per step, predicted tokens)."""
        return self._seq.stats

    @property
    def max_new_tokens(self) -> int:
        """max_new_tokens as asked (the sequence may stop sooner at the model's context)."""
        return self._seq.asked

    @property
    def cut_by_context(self) -> bool:
        """Whether the sequence stopped at the model's context short of max_new_tokens (not at an EOS)."""
        return self._seq.cut_by_context()

    def _end(self, reason: str) -> None:
        """The sequence ended: its sources hear of it (the memory keeps its text) unless it never began; its
        stream ends."""
        if self.finish_reason is not None:
            return
        try:
            self._seq.finish()  # (the sources hear of it only if it began: Sequence.finish)
        except Exception as exc:  # noqa: BLE001 - a source's bookkeeping fails this sequence alone
            self.finish_reason, self.error = "error", exc
            return
        self.finish_reason = reason

    def _reason(self) -> str:
        """'length' where the sequence used its max_new_tokens (or the model's context), else 'stop'."""
        out = self._seq.out
        if out.new_tokens > 0 and out.last in out.eos:
            return "stop"
        return "length" if out.new_tokens >= out.limit else "stop"


@dataclass(frozen=True)
class BatchEvent:
    """What one step did for one sequence: its new tokens and, on its last event, why it ended."""

    handle: BatchHandle
    tokens: list[int]  # new since the last event (possibly none on the last)
    logprobs: StepLogprobs | None = None  # theirs, when the sequence asked for logprobs
    finish_reason: str | None = None  # on the last: one of FINISH_REASONS (``handle.error`` with "error")


class OpenBatch:
    """Sequences that join, step together and leave (see the module's docstring). Open one with
    ``LookaheadGenerator.open_batch()``; it decodes on the generator's learned state."""

    def __init__(self, run: DecodeRun, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None,
                 grammar: Callable[[Any], Grammar | None]):
        """``grammar``: a response_format compiled (the generator's ``grammar``; None for None)."""
        self.run = run  # the decode loop underneath (decode/loop.py)
        self.model, self.tokenizer, self.grammar = model, tokenizer, grammar
        self.vocab = run.target.vocab
        self._handles: dict[int, BatchHandle] = {}  # id(sequence) -> its handle, while it runs
        self._spent = False  # a trial step ran: the cache holds its rows, nothing more decodes here

    @property
    def handles(self) -> list[BatchHandle]:
        """The sequences still decoding, in the batch's order, then those still joining (their prompts being
        prefilled a chunk a step: ``LookaheadConfig.prefill_chunk``)."""
        return [self._handles[id(seq)] for seq in self.run.active + [join.seq for join in self.run.pending]]

    @property
    def stats(self) -> GenerationStats:
        """The batch's stats so far: steps, and each step's seconds (host and forward apart)."""
        return self.run.stats

    def join(self, prompt_ids: Any, *, max_new_tokens: int | None = None, do_sample: bool | None = None,
             temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
             min_p: float | None = None, repetition_penalty: float | None = None, seed: int | None = None,
             eos_token_id: int | list[int] | None = None, stop_strings: str | list[str] | None = None,
             presence_penalty: float | None = None, frequency_penalty: float | None = None,
             logit_bias: dict[int, float] | None = None, logprobs: bool | int | None = None,
             prediction: Any = None, logits_processor: LogitsProcessorList | None = None,
             stopping_criteria: StoppingCriteriaList | None = None, response_format: Any = None) -> BatchHandle:
        """``prompt_ids`` ([T] token ids, at least one) joins the batch at the next step (a prompt longer than
        ``LookaheadConfig.prefill_chunk`` while others decode: once all of it is in, prefilled that many rows a
        step; its handle is among ``handles`` meanwhile), decoded under the
        settings ``generate`` takes for one prompt (each None: the model's generation_config value);
        ``seed``: a sampled sequence's own random stream; ``response_format`` as generate takes it, or a
        Grammar the generator compiled already (``LookaheadGenerator.grammar``: a server compiles while it
        checks the request, not in its decode loop). A sequence with nothing to generate
        (max_new_tokens 0) never joins: its handle has ended already ("length"). Bad settings raise
        GenerateInputError naming the argument, and nothing joins.

        Args:
            prompt_ids: [T] the prompt's token ids.
            max_new_tokens ... response_format: as ``LookaheadGenerator.generate`` takes them, for this prompt
                (``stopping_criteria``: objects of their own for this sequence: a stateful criterion is called
                with its prefix one token longer each time).
            seed: this sequence's own random stream when it samples (None: torch's default generator).

        Returns:
            The sequence's ``BatchHandle``: its new tokens so far (``output_ids`` [n]), logprobs, stats and,
            once it ended, ``finish_reason``.
        """
        self._check_usable()
        prompt = _prompt(prompt_ids, self.vocab)  # [T]
        target = self.run.target
        context_left = tokens_left_in_context(prompt.shape[0], target.context)  # refuses a prompt filling it
        generator = torch.Generator(device=target.device).manual_seed(_seed(seed)) if seed is not None else None
        decoding = call_decoding(  # (generate's own path: decode/settings.py)
            self.model, prompt.shape[0], target.device, self.vocab,
            lambda spec: spec if isinstance(spec, Grammar) else self.grammar(spec),
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, logit_bias=logit_bias,
            logits_processor=logits_processor, logprobs=logprobs, response_format=response_format,
            stopping_criteria=stopping_criteria, max_new_tokens=max_new_tokens, do_sample=do_sample,
            eos_token_id=eos_token_id, stop_strings=stop_strings, tokenizer=self.tokenizer, generator=generator,
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repetition_penalty=repetition_penalty)
        rows = prediction_rows(prediction, [context_left], self.vocab, self.tokenizer)
        collector = _Collector()
        seq = self.run.join(prompt, decoding, collector, context_left, rows[0] if rows is not None else None)
        handle = BatchHandle(seq, collector)
        if seq in self.run.active or self.run.joining(seq):
            self._handles[id(seq)] = handle
        else:
            handle._end(handle._reason())  # nothing to generate
        return handle

    def admit(self, ids: torch.Tensor, mask: torch.Tensor, prompts: list[np.ndarray], decoding: Decoding,
              streamer: BaseStreamer | None = None, contexts_left: list[int | None] | None = None,
              predictions: list[np.ndarray | None] | None = None) -> list[BatchHandle]:
        """``generate``'s way in: a left-padded batch joins a batch with no sequence running, every row under
        the call's one ``decoding`` (resolved once over the padded width, as model.generate resolves a
        batch's settings), prefilled together as model.generate prefills it (``DecodeRun.admit``). The rows
        then step as joined ones do.

        Args:
            ids, mask: [B, T] on the CPU, left-padded; ``prompts``: B rows [T_b] without their padding.
            decoding: the call's settings (call/decoding.py), checked already.
            streamer: one row's (B = 1): it receives the prompt, every kept token, and ``end`` when the row ends.
            contexts_left, predictions: per row, as ``join`` takes them (None: no limit, no prediction).

        Returns:
            The B rows' handles, in row order (every one ended already where there is nothing to generate).
        """
        self._check_usable()
        count = len(prompts)
        if streamer is not None and count != 1:
            raise GenerateInputError("a streamer takes one sequence: stream batch size 1 only, "
                                     "or pass streamer=None for a batch")
        collectors = [_Collector(streamer) for _ in prompts]
        seqs = self.run.admit(ids, mask, prompts, decoding, list(collectors),
                              contexts_left if contexts_left is not None else [None] * count,
                              predictions if predictions is not None else [None] * count)
        handles = [BatchHandle(seq, collector) for seq, collector in zip(seqs, collectors)]
        running = {id(seq) for seq in self.run.active}
        for handle in handles:
            if id(handle._seq) in running:
                self._handles[id(handle._seq)] = handle
            else:
                handle._end(handle._reason())  # nothing to generate
        return handles

    def step(self) -> list[BatchEvent]:
        """One step of every running sequence (one forward for all of them).

        Returns:
            A ``BatchEvent`` (handle, its new tokens, their logprobs, the finish reason or None) for each
            sequence that gained tokens or ended in this step, in the batch's order.
        """
        self._check_usable()
        running = self.handles
        if not running:
            return []
        finished = {id(seq) for seq in self.run.step()}
        events = []
        for handle in running:
            if id(handle._seq) in finished:
                del self._handles[id(handle._seq)]
                handle._end(handle._reason())
            tokens, logprobs = handle._collector.drain()
            if tokens or handle.finish_reason is not None:
                events.append(BatchEvent(handle, tokens, logprobs, handle.finish_reason))
        return events

    def leave(self, handle: BatchHandle) -> None:
        """``handle``'s sequence leaves before the next step (a cancelled request): finish reason
        "cancelled"; the memory keeps what it produced. Nothing for a sequence that ended already.

        Args:
            handle: what ``join`` returned for the sequence.
        """
        if handle.finish_reason is not None:
            return
        self._handles.pop(id(handle._seq), None)
        self.run.leave(handle._seq)
        handle._end("cancelled")

    def trial_step(self, rows: int) -> None:
        """One forward of ``rows`` rows per joined sequence (a chain of its last ``rows`` tokens) through the
        target, as a step of that shape runs, with nothing verified, committed or learned: what a server's
        warm-up runs to make each step shape's cost curve and trace before its first request. The batch is
        spent after it (its cache holds the trial rows): ``join`` and ``step`` then raise; open a new one.

        Args:
            rows: rows per running sequence (>= 1).
        """
        self._check_usable()
        run = self.run
        run.finish_joins()  # (every joined sequence takes part, its prompt all in)
        count = len(run.active)
        if count == 0 or rows < 1:
            raise ValueError(f"trial_step needs running sequences and rows >= 1 (got {count} sequences, {rows} rows)")
        tokens = np.stack([seq.out.seq[seq.out.stop - rows:seq.out.stop] for seq in run.active])  # [A, Q]
        if tokens.shape[1] != rows:
            raise ValueError(f"trial_step: every prompt needs at least {rows} tokens")
        positions = run.x_pos[:, None] + np.arange(rows)  # [A, Q]
        local = np.repeat(np.tril(np.ones((rows, rows), dtype=bool))[None], count, axis=0)  # [A, Q, Q]: a chain
        self._spent = True
        with torch.inference_mode():
            run.target.step(run.cache, tokens, positions, local, np.arange(rows), run.past, run.slots)

    def _check_usable(self) -> None:
        if self._spent:
            raise RuntimeError("this batch ran a trial step and is spent: open a new one with open_batch()")


def _seed(seed: object) -> int:
    """A sampled sequence's seed, checked: an integer torch.Generator.manual_seed takes."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral) \
            or not SEED_RANGE[0] <= int(seed) <= SEED_RANGE[1]:
        raise GenerateInputError(f"seed must be an integer in [{SEED_RANGE[0]}, {SEED_RANGE[1]}], got {seed!r}")
    return int(seed)


def _prompt(prompt_ids: Any, vocab: int) -> np.ndarray:
    """One prompt's token ids as int64 [T], or GenerateInputError naming what is wrong."""
    if isinstance(prompt_ids, torch.Tensor):
        prompt_ids = prompt_ids.detach().cpu().numpy()
    try:
        prompt = np.asarray(prompt_ids)
    except (TypeError, ValueError):
        prompt = np.zeros(0)
    if prompt.ndim != 1 or prompt.shape[0] == 0 or not np.issubdtype(prompt.dtype, np.integer):
        raise GenerateInputError(f"prompt_ids must be one prompt's token ids (a non-empty list of integers or a 1-D "
                                 f"integer array), got {type(prompt_ids).__name__} of shape {prompt.shape}")
    if int(prompt.min()) < 0 or int(prompt.max()) >= vocab:
        raise GenerateInputError(f"prompt_ids hold token ids outside the vocabulary [0, {vocab})")
    return prompt.astype(np.int64)
