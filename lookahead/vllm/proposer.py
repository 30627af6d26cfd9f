"""lookahead's token-only sources as a vLLM speculative proposer (``method="custom_class"``).

vLLM (0.32 on) loads an outside proposer by class path and asks it each step for up to k draft
tokens per running request, which it then verifies itself, as a chain. ``LookaheadProposer`` answers
with lookahead's sources that need no logits, built by the engine's own factory (decode/sources.py)
and planned by the engine's own planner in its chain mode (plan/planner.py), one planner a request:

1. propose: the context matcher (what followed earlier occurrences of the current suffix), the
   n-gram pool fed by the prompt and the output, and the memory across requests (the text of the
   engine's finished requests, shared by all of them, bounded, optionally kept in a file);
2. build: their candidates merged into one trie scored by the acceptance estimates, of which the
   best path is proposed, cut where a token's chance of acceptance falls below ``least_accept``
   (``Planner.chain``; vLLM charges a row for every token proposed);
3. learn: what vLLM accepted of each chain counts into the estimates, and the sources see the new
   tokens (``Planner.learn`` / ``observe``), as in lookahead's loop.

vLLM gives the proposer no request ids; requests are told apart by their tokens (requests.py). The
settings come from ``additional_config={"lookahead": {...}}`` (settings.py). Nothing here imports
vLLM: the class is driven through the arguments vLLM passes, and the engine's config is read by
attribute. What vLLM verifies is vLLM's: greedy output is vLLM's own greedy output, token for token.
"""

from __future__ import annotations

import atexit
import multiprocessing.util
import time
from typing import Any

import numpy as np

from ..core.tree import TokenTree, empty_tree
from ..decode.sources import SourceFactory
from ..plan.acceptance import AcceptanceStats
from ..plan.choice import StepChooser
from ..plan.planner import SCORE_DEPTH, Planner
from ..proposers.base import Candidates, Proposer
from ..proposers.memory import RequestMemory
from ..proposers.memory.file import vocabulary_key
from ..proposers.ngram import NgramPool
from .clock import StepClock
from .requests import RequestTracker, Tracked
from .settings import VllmSettings, settings_from

AUTO_START = 0.3  # least_accept "auto" before the step clock has learned what a row costs


class RequestState:
    """One request's planner (its sources, the shared memory's proposer among them) and its pending chain."""

    def __init__(self, planner: Planner):
        self.planner = planner
        self.pending: TokenTree | None = None  # the chain proposed, as a tree (node d at depth d + 1), waiting
        # for what vLLM made of it
        self.begun = False


class LookaheadProposer:
    """A vLLM custom proposer (``speculative_config={"method": "custom_class", "model":
    "lookahead.vllm.LookaheadProposer", "num_speculative_tokens": k}``); see the module docstring."""

    def __init__(self, vllm_config: Any):
        spec = vllm_config.speculative_config
        model = vllm_config.model_config
        self.k = int(spec.num_speculative_tokens)
        self.max_len = int(model.max_model_len)
        self.settings: VllmSettings = settings_from(getattr(vllm_config, "additional_config", None))
        cfg = self.settings.config
        self.vocab = int(model.get_vocab_size())
        self.memory = self._memory(model) if cfg.memory_tokens else None
        # the engine's factory, without what needs the model's logits (recycling) or a model of its own (a draft)
        self.factory = SourceFactory(cfg, self.memory, recycled=None)
        priors = [source.priors for source in self._sources()]
        self.acceptance = AcceptanceStats(priors, SCORE_DEPTH)  # shared by every request, as the engine's regime
        self.chooser = StepChooser(cfg, None, self.acceptance)  # no cost curve: a step's price is 1 plain step
        self.tracker: RequestTracker[RequestState] = RequestTracker(self._new_state)
        self.saved_at = time.monotonic()
        self.clock = StepClock()  # what a row of vLLM's step costs here (least_accept "auto")
        self.now = time.perf_counter  # the clock the step clock reads (a replay gives its modelled time)
        self.proposed = 0  # draft tokens proposed, all requests
        self.accepted = 0  # of them accepted
        self.closed = False
        # Set to a list to keep, at every call, each row's candidates as the sources offered them: [(source
        # name, Candidates), ...] per row of the batch (the replay's log, replay.py; None: nothing kept)
        self.offered: list[list[tuple[str, Candidates]]] | None = None
        if self.settings.memory is not None:
            # On the way out, where the process gets to run its exit handlers: atexit for an engine in
            # this process, multiprocessing's finalizers for a worker process that ends normally. (vLLM's
            # OpenAI server stopped with Ctrl-C ends its worker without either: settings.py.)
            atexit.register(self.close)
            multiprocessing.util.Finalize(self, self.close, exitpriority=0)

    # ---------------------------------------------------------------- vLLM's interface
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load: the sources read tokens only."""

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings: Any = None, **kwargs: Any) -> list[list[int]]:
        """Draft tokens (at most k) per row of the batch: rows ``token_ids_cpu[i, :num_tokens_no_spec[i]]``,
        of which ``sampled_token_ids[i]`` were accepted this step (none: the row is not decoding)."""
        rows = [(i, token_ids_cpu[i], int(num_tokens_no_spec[i]), len(sampled))
                for i, sampled in enumerate(sampled_token_ids) if sampled]
        step = self.tracker.step(rows)
        self.clock.tick(self.now(), sum(r[3] for r in rows), clean=not step.begun and not step.ended)
        for ended in step.ended:
            self._finish(ended)
        for index, tracked in step.requests.items():
            self._learn(tracked, rows_accepted=len(sampled_token_ids[index]))
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        if self.offered is not None:
            self.offered = [[] for _ in sampled_token_ids]
        least, estimates = self._least(), self.acceptance.estimates()  # once a step: [C, D] for every request
        for index, tracked in step.requests.items():
            drafts[index] = self._chain(tracked, least, estimates,
                                        self.offered[index] if self.offered is not None else None)
        self.clock.proposed(len(step.requests) + sum(len(d) for d in drafts))
        return drafts

    def _least(self) -> float:
        """The least acceptance chance a draft token needs this step: the setting, or learned ("auto")."""
        least = self.settings.least_accept
        return self.clock.threshold(AUTO_START) if least is None else least

    # ---------------------------------------------------------------- the steps
    def _sources(self) -> list[Proposer]:
        """One request's sources, from the engine's factory: no draft (no decoding to read), no prediction
        (its inert place kept, as the engine keeps it), an n-gram pool of its own."""
        cfg = self.settings.config
        pool = NgramPool(self.vocab, cfg.pool_ngram, cfg.pool_capacity, cfg.pool_max_keys)
        return self.factory.build(None, None, pool, None, 0).sources

    def _new_state(self) -> RequestState:
        """A new request: its sources and its planner over the shared estimates."""
        return RequestState(Planner(self.settings.config, self._sources(), self.acceptance, self.chooser))

    def _learn(self, tracked: Tracked[RequestState], rows_accepted: int) -> None:
        """3. learn: what vLLM kept of the pending chain, and the new tokens for the sources."""
        state, seq = tracked.state, tracked.tokens
        stop = tracked.length
        if not state.begun:  # the prompt and the first token: the sources start on them
            state.begun = True
            state.planner.begin(seq, stop)
            return
        start = stop - rows_accepted
        tree, state.pending = state.pending if state.pending is not None else empty_tree(), None
        kept = agreed(tree.tokens, seq[start:stop])
        self.proposed += tree.size
        self.accepted += kept
        state.planner.learn(tree, np.arange(kept, dtype=np.int64))
        state.planner.observe(seq, start, stop)

    def _chain(self, tracked: Tracked[RequestState], least: float, estimates: np.ndarray,
               offered: list[tuple[str, Candidates]] | None = None) -> list[int]:
        """1. propose and 2. build: the request's planner's chain (``Planner.chain``) under estimates [C, D]
        (maybe empty); ``offered`` (when given) gets each source's candidates."""
        state, planner = tracked.state, tracked.state.planner
        tokens_left = min(self.k, self.max_len - tracked.length)
        if tokens_left <= 0:
            return []
        chain = planner.chain(tracked.tokens, tracked.length, tokens_left, least, estimates)
        if offered is not None:
            offered.extend((source.name, found) for source, found in zip(planner.proposers, planner.offered))
        state.pending = chain if chain.size else None
        return [int(t) for t in chain.tokens]

    def _finish(self, tracked: Tracked[RequestState]) -> None:
        """A request left the batch (finished, or preempted: it comes back as a new one)."""
        _end(tracked)
        if self.settings.memory is not None and time.monotonic() - self.saved_at >= self.settings.save_seconds:
            self.save()

    # ---------------------------------------------------------------- the memory
    def _memory(self, model: Any) -> RequestMemory:
        """The memory across requests, loaded from the settings' file when it exists."""
        cfg, path = self.settings.config, self.settings.memory
        vocabulary = vocabulary_key(_tokenizer(model), self.vocab) if path is not None else f"size:{self.vocab}"
        memory = RequestMemory(cfg.memory_tokens, cfg.memory_prompts, vocabulary, self.vocab)
        if path is not None and path.exists():
            memory.load(path)
        return memory

    def close(self) -> None:
        """The engine is going away: every request still tracked is done (its last step was seen), so it
        goes into the memory, which is saved. Once only."""
        if self.closed:
            return
        self.closed = True
        for tracked in self.tracker.finish_all():
            _end(tracked)
        self.save()

    def save(self) -> None:
        """Write the memory to the settings' file (atomically; nothing without a file)."""
        if self.memory is None or self.settings.memory is None:
            return
        self.memory.save(self.settings.memory)
        self.saved_at = time.monotonic()


def agreed(chain: np.ndarray, new: np.ndarray) -> int:
    """How many of the chain's tokens [L] vLLM accepted: those that agree with the step's new tokens [A]
    from the first on (vLLM's own token after them is not the chain's). [7 8 9], [7 8 5] -> 2."""
    differ = np.flatnonzero(chain[:new.shape[0]] != new[:chain.shape[0]])
    return int(differ[0]) if differ.shape[0] else min(chain.shape[0], new.shape[0])


def _end(tracked: Tracked[RequestState]) -> None:
    """The request is done: its sources hear so (the memory keeps its text), if they ever began."""
    if tracked.state.begun:
        tracked.state.planner.finish(tracked.tokens, tracked.length)


def _tokenizer(model: Any) -> Any:
    """The engine's tokenizer (transformers'), for the memory file's vocabulary key (None: the engine
    names none, and the file is tied to the vocabulary's size alone)."""
    if not getattr(model, "tokenizer", None):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model.tokenizer, trust_remote_code=bool(model.trust_remote_code))
