"""The server's engine: one thread owns the model and runs one open batch (``LookaheadGenerator.open_batch``,
the public ``OpenBatch``) that requests join and leave between steps. ``start`` runs it on a thread
of its own; ``start(thread=False)`` then ``run`` runs it in the caller's thread, which is what ``lookahead
serve`` does from the process's main thread: on the CPU, the OpenMP parallel regions of the linear
kernels (numba's and the C++ op's) run markedly slower when launched from any other thread
(`lookahead bench-serve` shows the difference in its time per output token).

A request (``Completion``: token ids and its sampling settings) is queued by ``Engine.submit``
(bounded: ``QueueFull`` past ``max_queue`` waiting beyond the batch's free slots, with a wait to advise at the
pace the latest requests left the batch; ``submit_all`` queues a request's ``n`` choices together, one
sequence each) and answered through its ``Ticket``: an asyncio stream
of ``Event``s, one per step that accepted tokens for it, the last with the finish reason and the
usage. Before every step the engine lets waiting requests join (up to ``max_batch`` sequences),
cancelled ones leave, and after it finishes the ones that ended. Each sequence decodes under its
own settings: a greedy one gives exactly ``model.generate``'s tokens on its prompt alone, a seeded
sampled one the same text whatever else is in the batch (its random numbers depend on its seed
and the output position only, verify/sampling.py). Every request reads and feeds the generator's
one memory of earlier requests, saved atomically to ``memory_path`` every ``save_every_s`` and at
``stop``.

A batch size whose cost curve the disk does not hold runs on a stand-in (cost/policy.py); its curve is
measured on this thread once nothing has run or waited for IDLE_WAIT_S (``_curve_due``), and a request that
arrives meanwhile stops it (measured again at the next idle moment).

An exception while a request joins fails that request alone; one inside a step fails the requests
in that step, and the engine starts a fresh batch for the next ones.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from transformers.generation.stopping_criteria import StoppingCriteriaList

from .. import BatchHandle, Grammar, LookaheadGenerator, OpenBatch, StepLogprobs
from .scoring import Scoring
from .stops import ReplyStops

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

IDLE_WAIT_S = 1.0  # how long the idle decode thread sleeps between looks at the clock (periodic saves, stop)
RETRY_PER_WAITING_S = 0.5  # a full queue's Retry-After per request that must leave first, until requests have ended
PACE_REQUESTS = 32  # the latest requests whose time in the batch gives the pace a full queue's Retry-After follows


@dataclass(frozen=True)
class Completion:
    """One request, tokenized: its prompt and how to decode it."""

    prompt: list[int]  # token ids, at least one
    max_tokens: int  # new tokens at most, >= 1
    temperature: float | None = None  # None or 0.0: greedy
    top_p: float | None = None
    seed: int | None = None  # sampling: the request's own random stream (the same text whatever runs beside it)
    stop: tuple[str, ...] = ()  # stop strings: decoding ends at one (the tokens returned include it)
    scoring: Scoring = Scoring()  # penalties, logit_bias, logprobs (serve/scoring.py)
    prediction: tuple[int, ...] = ()  # the predicted output's token ids (Predicted Outputs; empty: none)
    constraint: Grammar | None = None  # response_format's or a forced call's grammar (serve/structured.py; None: free)

    @property
    def sampled(self) -> bool:
        """Whether tokens are drawn (a temperature above 0) rather than chosen greedily."""
        return self.temperature is not None and self.temperature > 0.0


@dataclass(frozen=True)
class Event:
    """What a step did for one request; the last one carries the finish reason and the usage."""

    tokens: list[int]  # tokens accepted since the last event (possibly none on the last)
    finish_reason: str | None = None  # on the last: "stop" (EOS, a stop string), "length", "cancelled", "error"
    error: str | None = None  # with "error": what went wrong, one line
    prompt_tokens: int = 0  # usage, on the last event
    completion_tokens: int = 0
    prediction: tuple[int, int] = (0, 0)  # usage: (accepted, rejected) predicted tokens, on the last event
    cached_tokens: int = 0  # usage: prompt tokens the prefix cache gave back, on the last event
    logprobs: StepLogprobs | None = None  # the tokens' logprobs (when the request asks for them)


class QueueFull(Exception):
    """The engine's queue holds ``max_queue`` requests already: try again after ``retry_after`` seconds."""

    def __init__(self, waiting: int, retry_after: float):
        super().__init__(f"{waiting} requests are waiting already; retry after {retry_after:.0f} s")
        self.retry_after = retry_after


class EngineStopped(RuntimeError):
    """The engine is not running (not started yet, or stopped): no request is taken."""


class Ticket:
    """One request's answer: ``events()`` streams it (call from the event loop that submitted it)."""

    def __init__(self, ident: str, completion: Completion, loop: asyncio.AbstractEventLoop):
        self.id = ident
        self.completion = completion
        self.loop = loop
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.started: float | None = None  # when it began to join the batch (time.monotonic; None: not yet)
        self.closed = False  # the final event was sent (decode thread only)

    async def events(self) -> AsyncIterator[Event]:
        """Every event until, and including, the final one (the one with a finish_reason)."""
        while True:
            event = await self.queue.get()
            yield event
            if event.finish_reason is not None:
                return

    def cancel(self) -> None:
        """Stop decoding this request: it leaves the batch before the next step (a disconnect)."""
        self.cancelled.set()

    def send(self, event: Event) -> None:
        """Hand ``event`` to the event loop (from the decode thread); nothing after the final one."""
        if self.closed:
            return
        self.closed = event.finish_reason is not None
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody listens any more
            pass

    def close(self, reason: str, prompt_tokens: int, completion_tokens: int, error: str | None = None,
              prediction: tuple[int, int] = (0, 0), cached_tokens: int = 0) -> None:
        """The final event (``prediction``: the accepted and rejected predicted tokens; ``cached_tokens``: the
        prompt tokens the prefix cache gave back)."""
        self.send(Event([], reason, error, prompt_tokens, completion_tokens, prediction=prediction,
                        cached_tokens=cached_tokens))


@dataclass
class Counters:
    """What /metrics reports (written by the decode thread, read by anyone)."""

    requests_total: int = 0
    tokens_generated_total: int = 0
    forwards_total: int = 0  # steps of the batch: one forward each
    sequence_steps_total: int = 0  # steps counted once per sequence in them (a step of 4 sequences: 4)
    step_seconds_total: float = 0.0
    host_seconds_total: float = 0.0  # the steps' host work (propose, plan, commit, cache, learn: stats.PHASES)
    forward_seconds_total: float = 0.0  # ... and their forwards with the read-back (stats.DEVICE_PHASES)


class Engine:
    """One decode thread over a generator; requests join its running batch (see the module's docstring)."""

    def __init__(self, generator: LookaheadGenerator, max_batch: int = 8, max_queue: int = 64,
                 memory_path: str | os.PathLike[str] | None = None, save_every_s: float = 300.0) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        if not save_every_s > 0:
            raise ValueError(f"save_every_s must be > 0, got {save_every_s}")
        if generator.draft_model is not None:
            raise ValueError("a draft model drafts for one sequence; serve without draft_model")
        if memory_path is not None and generator.learned.memory is None:
            raise ValueError("memory_path needs a memory: LookaheadConfig(memory_tokens=N) with N >= 2")
        self.generator = generator
        generator.target.long_lived()  # (a server pays for a traced forward's traces over all its requests)
        self.max_batch, self.max_queue = max_batch, max_queue
        self.memory_path, self.save_every_s = memory_path, save_every_s
        self.counters = Counters()
        self._cond = threading.Condition()
        self._waiting: collections.deque[Ticket] = collections.deque()
        self._live: list[tuple[BatchHandle, Ticket]] = []
        self._running = False
        self._thread: threading.Thread | None = None  # the loop's own thread (``start``), if it has one
        self._looping: threading.Thread | None = None  # the thread running the loop now (None: none)
        self._done = threading.Event()  # the loop has ended (set by ``run`` on its way out)
        self._ids = itertools.count(1)
        self._saved_at = time.monotonic()
        self._joining = 0  # requests taken from the queue that have not yet joined the batch (or ended)
        self._durations: collections.deque[float] = collections.deque(maxlen=PACE_REQUESTS)  # seconds in the batch
        self.memory_loaded = False  # ``start`` read memory_path (it existed)

    @property
    def memory_tokens(self) -> int:
        """Tokens of earlier requests the memory holds now (0 without a memory)."""
        memory = self.generator.learned.memory
        return int(memory.store.tokens) if memory is not None else 0

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase | None:
        """The generator's tokenizer."""
        return self.generator.tokenizer

    @property
    def context_length(self) -> int | None:
        """The model's context in tokens (None: it names none): a prompt + max_tokens must fit."""
        return self.generator.target.context

    # ------------------------------------------------------------------ lifecycle
    def start(self, thread: bool = True) -> None:
        """Load the memory file (when it exists: a damaged one raises MemoryFileError) and start decoding: on
        a thread of its own, or (``thread=False``) in whichever thread then calls ``run``."""
        if self._running:
            return
        if self.memory_path is not None and os.path.exists(self.memory_path):
            self.generator.load_memory(self.memory_path)
            self.memory_loaded = True
        self._running = True
        self._saved_at = time.monotonic()
        self._done.clear()
        if thread:
            self._thread = threading.Thread(target=self.run, name="lookahead-engine", daemon=True)
            self._thread.start()

    def run(self) -> None:
        """The decode loop, in the calling thread, until ``stop`` (from another thread: a request handler, a
        signal's shutdown); returns at once when the engine is not started."""
        self._looping = threading.current_thread()
        try:
            self._loop()
        finally:
            self._looping = None
            self._done.set()

    def stop(self) -> None:
        """Stop decoding: every request still waiting or running ends with an error event; the memory is
        saved (atomically) to ``memory_path`` once the loop's last step has ended."""
        with self._cond:
            if not self._running:
                return
            self._running = False
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        elif self._looping is not None and self._looping is not threading.current_thread():
            self._done.wait()  # the loop runs in another thread (``run``): it ends after its current step
        self._save()

    def submit(self, completion: Completion) -> Ticket:
        """Queue ``completion`` (from the event loop that will read its ticket); QueueFull past max_queue."""
        return self.submit_all([completion])[0]

    def submit_all(self, completions: list[Completion]) -> list[Ticket]:
        """Queue all of ``completions`` or none (one request's ``n`` choices, each a sequence of its own);
        QueueFull past max_queue waiting beyond the batch's free slots: they count as that many waiting
        requests, except that a group larger than all of that room is taken when nothing else waits.
        ValueError for an empty list or a bad completion."""
        if not completions:
            raise ValueError("completions is empty: queue at least one")
        for completion in completions:
            _check(completion, self.generator.vocab)
        loop = asyncio.get_running_loop()
        with self._cond:
            if not self._running:
                raise EngineStopped("the engine is not running")
            waiting = len(self._waiting)
            # the queue holds max_queue requests beyond those the batch's free slots take next
            room = self.max_queue + max(0, self.max_batch - len(self._live) - self._joining)
            if waiting >= room or (waiting and waiting + len(completions) > room):
                raise QueueFull(waiting, self._retry_after(waiting + len(completions) - room))
            tickets = [Ticket(f"cmpl-{next(self._ids)}", completion, loop) for completion in completions]
            self._waiting.extend(tickets)
            self.counters.requests_total += 1
            self._cond.notify_all()
        return tickets

    def _retry_after(self, leaving: int) -> float:
        """Seconds until ``leaving`` (>= 1 counted) requests have left the batch, at the pace of the latest ones
        (their mean time in the batch over max_batch slots); RETRY_PER_WAITING_S each before any has ended."""
        leaving = max(leaving, 1)
        if not self._durations:
            return RETRY_PER_WAITING_S * leaving
        return leaving * sum(self._durations) / len(self._durations) / self.max_batch

    def metrics(self) -> dict[str, float]:
        """Counters and gauges for /metrics."""
        c = self.counters
        memory = self.generator.learned.memory
        fill = self.memory_tokens / memory.store.capacity if memory is not None else 0.0
        prefixes = self.generator.prefixes
        with self._cond:
            waiting, running = len(self._waiting), len(self._live)
        return {"requests_total": float(c.requests_total), "requests_running": float(running),
                "queue_depth": float(waiting), "batch_size": float(running),
                "tokens_generated_total": float(c.tokens_generated_total), "forwards_total": float(c.forwards_total),
                "sequence_steps_total": float(c.sequence_steps_total),
                # tokens each sequence gained per step it was in: 1.0 for plain decoding at any batch size
                "tokens_per_forward": (c.tokens_generated_total / c.sequence_steps_total
                                       if c.sequence_steps_total else 0.0),
                "tokens_per_second": (c.tokens_generated_total / c.step_seconds_total
                                      if c.step_seconds_total else 0.0),
                "step_seconds_total": c.step_seconds_total, "host_seconds_total": c.host_seconds_total,
                "forward_seconds_total": c.forward_seconds_total,
                "prefix_cache_tokens": float(prefixes.tokens) if prefixes is not None else 0.0,
                "prefix_cache_bytes": float(prefixes.size) if prefixes is not None else 0.0,
                "prefix_cache_reused_tokens_total": float(prefixes.reused_tokens) if prefixes is not None else 0.0,
                "memory_fill": fill}

    # ------------------------------------------------------------------ the decode thread
    def _loop(self) -> None:
        run: OpenBatch | None = None
        with torch.inference_mode():
            while True:
                admitted = self._next()
                if admitted is None:
                    break
                if run is None:
                    run = self.generator.open_batch()
                for ticket in admitted:
                    self._admit(run, ticket)
                self._cancel(run)
                if self._live and not self._step(run):
                    run = None  # a step failed: its requests got an error; the next ones start afresh
                if not admitted and not self._live and self._curve_due():
                    self._measure_idle()
                if time.monotonic() - self._saved_at >= self.save_every_s:
                    self._save()
        self._fail_all("the server is stopping")

    def _next(self) -> list[Ticket] | None:
        """Wait for work; the requests that may join now (None: stop)."""
        with self._cond:
            while self._running and not self._waiting and not self._live:
                self._cond.wait(IDLE_WAIT_S)
                if time.monotonic() - self._saved_at >= self.save_every_s or self._curve_due():
                    break
            if not self._running:
                return None
            free_slots = self.max_batch - len(self._live)
            admitted = [self._waiting.popleft() for _ in range(min(free_slots, len(self._waiting)))]
            self._joining += len(admitted)
            return admitted

    def _curve_due(self) -> bool:
        """Whether a batch size's cost curve waits to be measured while nothing else does: a batch larger than
        the warm-up's ran on a stand-in (cost/policy.py). It is measured on this thread (the curve's
        calibration_seconds at most, once per size and machine: the disk keeps it); a request that arrives
        meanwhile ends it before its next timed forward (it is measured again at the next idle moment)."""
        return bool(self.generator.pending_curves) and not self._waiting and not self._live

    def _measure_idle(self) -> None:
        """Measure a pending batch size's curve, stopped by a request's arrival; one that fails is said on
        stderr and leaves that size on its stand-in (the engine goes on serving)."""
        try:
            self.generator.measure_pending(stop=lambda: bool(self._waiting))
        except Exception as exc:  # (a measurement's failure is no request's: nothing to answer with it)
            print(f"lookahead: measuring a batch size's step cost failed ({_one_line(exc)}); that size keeps the "
                  f"curve it was priced by", file=sys.stderr, flush=True)

    def _admit(self, run: OpenBatch, ticket: Ticket) -> None:
        """``ticket``'s request joins the batch (or is answered at once: cancelled, nothing to do, refused)."""
        try:
            self._join(run, ticket)
        finally:
            with self._cond:
                self._joining -= 1

    def _join(self, run: OpenBatch, ticket: Ticket) -> None:
        completion = ticket.completion
        if ticket.cancelled.is_set():
            ticket.close("cancelled", len(completion.prompt), 0)
            return
        ticket.started = time.monotonic()
        try:
            handle = run.join(completion.prompt, **_settings(completion, self.generator.tokenizer))
        except Exception as exc:  # this request alone fails
            ticket.close("error", len(completion.prompt), 0, _one_line(exc))
            return
        if handle.finish_reason is not None:
            self._end(handle, ticket)
            return
        with self._cond:
            self._live.append((handle, ticket))

    def _cancel(self, run: OpenBatch) -> None:
        """Cancelled requests leave the batch."""
        for handle, ticket in list(self._live):
            if ticket.cancelled.is_set():
                run.leave(handle)
                self._end(handle, ticket)

    def _step(self, run: OpenBatch) -> bool:
        """One step of the batch; its tokens go out, the requests it finished end. False when the step failed."""
        steps_before = run.stats.steps
        start = time.perf_counter()
        tickets = {id(handle): ticket for handle, ticket in self._live}
        try:
            events = run.step()
        except Exception as exc:  # the requests in this step fail; the server goes on
            self._fail_live(_one_line(exc))
            return False
        c = self.counters
        c.step_seconds_total += time.perf_counter() - start
        c.host_seconds_total += sum(run.stats.host_seconds[steps_before:])
        c.forward_seconds_total += sum(run.stats.forward_seconds[steps_before:])
        c.forwards_total += run.stats.steps - steps_before
        c.sequence_steps_total += sum(run.stats.sequences_per_step[steps_before:])  # (joining ones not in a step)
        c.tokens_generated_total += sum(len(event.tokens) for event in events)
        for event in events:
            ticket = tickets[id(event.handle)]
            if event.tokens:
                ticket.send(Event(event.tokens, logprobs=event.logprobs))
            if event.finish_reason is not None:
                self._end(event.handle, ticket)
        return True

    def _end(self, handle: BatchHandle, ticket: Ticket) -> None:
        """``handle``'s request ended (the batch finished it: the memory kept it): the final event goes out."""
        with self._cond:
            self._live = [(h, t) for h, t in self._live if h is not handle]
            if ticket.started is not None:
                self._durations.append(time.monotonic() - ticket.started)
        if handle.finish_reason == "error":
            error = _one_line(handle.error) if handle.error is not None else "the sequence failed"
            ticket.close("error", handle.prompt_tokens, handle.new_tokens, error)
            return
        ticket.close(handle.finish_reason or "stop", handle.prompt_tokens, handle.new_tokens,
                     prediction=handle.prediction_tokens, cached_tokens=handle.cached_prompt_tokens)

    def _fail_live(self, message: str) -> None:
        """Every running request ends with an error event."""
        with self._cond:
            live, self._live = self._live, []
        for handle, ticket in live:
            ticket.close("error", handle.prompt_tokens, handle.new_tokens, message)

    def _fail_all(self, message: str) -> None:
        """Every running and waiting request ends with an error event (the engine stops)."""
        self._fail_live(message)
        with self._cond:
            waiting = list(self._waiting)
            self._waiting.clear()
        for ticket in waiting:
            ticket.close("error", len(ticket.completion.prompt), 0, message)

    def _save(self) -> None:
        """The memory to ``memory_path`` (atomically), if the engine keeps one there."""
        self._saved_at = time.monotonic()
        if self.memory_path is not None:
            self.generator.save_memory(self.memory_path)


def _settings(completion: Completion, tokenizer: Any) -> dict[str, Any]:
    """The request's settings as ``OpenBatch.join`` takes them (the model's generation_config beneath); its
    stop strings read on the reply's text as the server shows it (stops.py: nothing built ahead)."""
    scoring = completion.scoring
    stops = StoppingCriteriaList([ReplyStops(tokenizer, completion.prompt, completion.stop)]) if completion.stop \
        else None
    sampling: dict[str, Any] = {}
    if completion.sampled:
        sampling = {"temperature": completion.temperature, "top_p": completion.top_p}
    return {"max_new_tokens": completion.max_tokens, "do_sample": completion.sampled, "seed": completion.seed,
            "stopping_criteria": stops, "presence_penalty": scoring.presence_penalty,
            "frequency_penalty": scoring.frequency_penalty, "logit_bias": dict(scoring.logit_bias),
            "logprobs": scoring.logprobs, "prediction": list(completion.prediction) or None,
            "response_format": completion.constraint, **sampling}


def _check(completion: Completion, vocab: int) -> None:
    """ValueError naming what is wrong with a request the engine cannot decode."""
    if not completion.prompt:
        raise ValueError("prompt: at least one token is needed")
    if min(completion.prompt) < 0 or max(completion.prompt) >= vocab:
        raise ValueError(f"prompt: token ids must lie in [0, {vocab})")
    if completion.max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {completion.max_tokens}")
    if completion.prediction and (min(completion.prediction) < 0 or max(completion.prediction) >= vocab):
        raise ValueError(f"prediction: token ids must lie in [0, {vocab})")


def _one_line(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
