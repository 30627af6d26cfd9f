"""LookaheadGenerator: the public face. It checks the model and the call's arguments, holds what is
learned across calls (``Learned``) and runs each call's decode loop (decode/loop.py: propose ->
build the tree -> one forward -> verify -> commit -> learn).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from .call.decoding import Decoding, prepared_decoding
from .call.grammar import Grammar, Grammars
from .call.inputs import (
    ContextLimitWarning,
    GenerateInputError,
    context_cut_message,
    prompt_rows,
    tokens_left_in_context,
)
from .call.keywords import refuse_kwargs
from .call.prediction import prediction_rows
from .call.result import LookaheadOutput, generate_output
from .call.stats import GenerationStats
from .config import LookaheadConfig
from .cost import CostModel
from .cost.policy import CostPolicy, budgeted
from .decode.batch import BatchHandle, OpenBatch
from .decode.context import DecodeContext
from .decode.loop import DecodeRun
from .decode.padded import decode_padded
from .decode.settings import call_decoding
from .decode.sources import DraftModel, SourceFactory
from .kernels import warmup
from .kernels.threads import start_numba_threads, usable_cores
from .model.fewrows import FewRowLinear
from .model.heap import give_back_freed_memory, keep_freed_memory
from .model.hugepages import move_to_huge_pages
from .model.prefixes import PrefixStore
from .model.routing import Routing
from .model.support import check_model
from .model.switches import ForwardSwitches
from .model.target import Target, input_device
from .plan.acceptance import AcceptanceStats
from .plan.window import auto_window
from .proposers.draft.checks import check_draft
from .proposers.memory import RequestMemory
from .proposers.memory.file import vocabulary_key
from .proposers.recycle import AdjacencyTable

if TYPE_CHECKING:
    from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase
    from transformers.generation import LogitsProcessorList, StoppingCriteriaList
    from transformers.generation.streamers import BaseStreamer


@dataclass
class Learned:
    """What a generator learns across generate calls (it holds no reference to the model).

    Handing it to a new LookaheadGenerator of the same model and config
    continues from it (hf.py keeps one per model that way).
    """

    config: LookaheadConfig
    vocab: int
    recycled: AdjacencyTable | None  # the recycled successors
    acceptance: dict[str, AcceptanceStats]  # acceptance estimates, one table per regime (plan/planner.py)
    cost: CostModel | None  # the step-cost curve the budget prices steps by, refined by the steps that ran
    run_config: LookaheadConfig | None = None  # the config decodes run with (auto_window's choice); None: config
    routing: Routing | None = None  # how forwards run on this CPU (routing.py); None: as torch is set
    memory: RequestMemory | None = None  # earlier requests' text (proposers/memory/); None: no memory


class LookaheadGenerator:
    """Lookahead decoding on a stock transformers causal LM: greedy output identical to
    ``model.generate``, sampled output with exactly the target's distribution.

    >>> gen = LookaheadGenerator(model, tokenizer, LookaheadConfig())
    >>> out = gen.generate(input_ids, max_new_tokens=64)  # == model.generate(..., do_sample=False)
    >>> out = gen.generate(input_ids, max_new_tokens=64, do_sample=True, temperature=0.7)

    ``draft_model``: an optional small causal LM with the target's vocabulary
    (same tokenizer), on the target's device unless ``allow_draft_device``;
    it becomes one more candidate source in the same tree (proposers/draft/),
    its forwards counted by the budget. ``draft_tokenizer``, when given, is
    checked against ``tokenizer``.

    Args:
        model: the target, a transformers causal LM (checked: UnsupportedModelError where it cannot be driven
            exactly).
        tokenizer: its tokenizer (needed for stop strings, grammars, text predictions and memory).
        config: the engine's settings (a validated LookaheadConfig; the defaults when None).
        draft_model: an optional small causal LM drafting for the target (above).
        learned: acceptance statistics learned earlier (``Learned``), to start from.
        draft_tokenizer: the draft's tokenizer, checked against ``tokenizer``.
        allow_draft_device: let the draft run on another device than the target.
        memory: a memory of earlier requests to share (the server's); None builds one from ``config``.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None = None,
                 config: LookaheadConfig | None = None, draft_model: PreTrainedModel | None = None, *,
                 learned: Learned | None = None, draft_tokenizer: PreTrainedTokenizerBase | None = None,
                 allow_draft_device: bool = False, memory: Any = None):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config if config is not None else LookaheadConfig()
        if not isinstance(self.config, LookaheadConfig):
            raise TypeError(f"config must be a LookaheadConfig, got {type(self.config).__name__}")
        layout = check_model(model, self.config.allow_untested_models)
        if self.config.huge_pages and move_to_huge_pages(model):  # (before anything holds the weights: the trace,
            give_back_freed_memory()  # the kernels, a cost curve; then what the copies replaced goes back to the OS)
        if self.config.keep_freed_memory and input_device(model).type == "cpu":
            keep_freed_memory()  # (before a cost curve is measured: its forwards allocate as the steps will)
        self.target = Target(model, layout, ForwardSwitches.of(self.config))
        self.vocab = self.target.vocab
        self.last_stats: GenerationStats | None = None
        self.costs = CostPolicy(self.target, self.config)  # which curve prices which step (cost/policy.py)
        self.draft_model = draft_model
        self.draft: DraftModel | None = None
        if draft_model is not None:
            layout = check_draft(model, draft_model, tokenizer, draft_tokenizer, allow_draft_device,
                                 self.config.allow_untested_models)
            if self.config.huge_pages:
                move_to_huge_pages(draft_model)
            draft_cost = self.costs.draft(draft_model, layout) if self.config.budget == "adaptive" else None
            linears = FewRowLinear(draft_model, self.config.native_linear)  # the draft's linears, wrapped once
            self.draft = DraftModel(draft_model, draft_cost, linears)
        start_numba_threads()  # before the kernels' first parallel run: torch's thread count stays the user's
        warmup(workers=usable_cores())  # a fresh install compiles the kernels on every core
        if learned is not None and (learned.config != self.config or learned.vocab != self.vocab):
            raise ValueError("learned state comes from a generator with another config or vocabulary; "
                             "hand it only to a generator of the same model and LookaheadConfig")
        if learned is None:
            learned = self._fresh()
        # Learned across generate calls: the recycled successors, the acceptance
        # estimates (one table per regime, see plan/planner.py), the step-cost curve, how
        # forwards run on this CPU, and the config decodes run with (config, or config
        # with the window auto_window opened).
        self.recycled, self.acceptance, self.cost = learned.recycled, learned.acceptance, learned.cost
        self.run_config = learned.run_config if learned.run_config is not None else self.config
        if learned.routing is not None:
            self.target.routings[1] = learned.routing
        # Earlier requests' text: the learned store, or ``memory`` (any object with RequestMemory's
        # begin / observe / lookup / remember and priors: benchmarks put another store there).
        self.memory = memory if memory is not None else learned.memory
        # Prompts' prefilled cache slots, for the next prompts that begin with them (model/prefixes.py; read
        # only while reusing them is exact: ``reuse_is_exact``).
        self.prefixes = PrefixStore(self.config.prefix_cache_mb << 20) if self.config.prefix_cache_mb else None

    def _fresh(self) -> Learned:
        """Nothing learned yet; the cost curve measured (or read from disk) when the budget uses it or
        the model runs on the CPU (where it also chooses how forwards run), and the window auto_window
        opens where that curve says rows are nearly free (the curve is then measured again, up to the
        steps the window makes possible)."""
        cfg = self.config
        recycled = AdjacencyTable(self.vocab, cfg.recycle_width) if cfg.recycle else None
        cost, run = self.costs.measure(cfg), cfg
        if cost is not None and budgeted(cfg):
            run = auto_window(cfg, self.costs.priced(cost))
            if run is not cfg:
                cost = self.costs.measure(run)
        routing = cost.routing if cost is not None else None
        memory = RequestMemory(cfg.memory_tokens, cfg.memory_prompts, vocabulary_key(self.tokenizer, self.vocab),
                               self.vocab) if cfg.memory_tokens else None
        return Learned(cfg, self.vocab, recycled, {}, self.costs.priced(cost), run, routing, memory)

    @property
    def learned(self) -> Learned:
        """The state this generator learned so far (shared, not copied: it keeps learning)."""
        memory = self.memory if isinstance(self.memory, RequestMemory) else None
        return Learned(self.config, self.vocab, self.recycled, self.acceptance, self.cost, self.run_config,
                       self.target.routings.get(1), memory)

    def save_memory(self, path: str | os.PathLike[str]) -> None:
        """Write the text of this generator's earlier requests to ``path`` (atomically; a later
        ``load_memory``, here or in another process, continues from it). The file holds users' text.

        Args:
            path: the file to write (replaced atomically).

        Raises:
            GenerateInputError: the generator keeps no memory (``memory_tokens=0``); MemoryFileError: it
                cannot be written.
        """
        self._own_memory("save_memory").save(path)

    def load_memory(self, path: str | os.PathLike[str]) -> None:
        """Remember the requests saved at ``path`` (by ``save_memory`` or ``lookahead generate --memory``)
        instead of what this generator holds now. A truncated, damaged, other-version or other-vocabulary
        file raises MemoryFileError and changes nothing.

        Args:
            path: a file ``save_memory`` wrote.
        """
        self._own_memory("load_memory").load(path)

    def _own_memory(self, what: str) -> RequestMemory:
        """The store save_memory / load_memory work on (GenerateInputError when there is none)."""
        if not isinstance(self.memory, RequestMemory):
            raise GenerateInputError(f"{what}: this generator keeps no memory across requests "
                                     f"(memory_tokens=0); pass LookaheadConfig(memory_tokens=N) with N >= 2")
        return self.memory

    # ------------------------------------------------------------------ API
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 max_new_tokens: int | None = None, do_sample: bool | None = None,
                 temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                 min_p: float | None = None, repetition_penalty: float | None = None,
                 logits_processor: LogitsProcessorList | None = None,
                 eos_token_id: int | list[int] | None = None, streamer: BaseStreamer | None = None,
                 generator: torch.Generator | None = None, generation_config: GenerationConfig | None = None,
                 stopping_criteria: StoppingCriteriaList | None = None,
                 stop_strings: str | list[str] | None = None, max_time: float | None = None,
                 tokenizer: PreTrainedTokenizerBase | None = None,
                 return_dict_in_generate: bool | None = None, presence_penalty: float | None = None,
                 frequency_penalty: float | None = None, logit_bias: dict[int, float] | None = None,
                 logprobs: bool | int | None = None, prediction: Any = None, response_format: Any = None,
                 **kwargs: Any) -> torch.LongTensor | LookaheadOutput:
        """Decode up to max_new_tokens; returns [B, prompt + new] like model.generate.

        Every argument left as None takes the model's ``generation_config``
        value, as ``model.generate`` does. Greedy (do_sample False, or
        temperature 0) gives exactly model.generate's tokens; sampling draws
        from exactly the target's processed distribution, with random numbers
        from ``generator`` or torch's default generator (``torch.manual_seed``).
        A left-padded batch [B, T] with its attention_mask decodes every row at
        once, through the open batch the server steps (decode/padded.py).
        Decoding stops where model.generate would: EOS, max_new_tokens,
        ``stopping_criteria``, ``stop_strings`` (decoded with ``tokenizer``,
        else the generator's) or ``max_time`` seconds, even inside a multi-token
        step. With ``return_dict_in_generate`` the result is a
        LookaheadOutput (``.sequences``, ``.stats``). Any other keyword of ``model.generate`` is refused
        by name with what lookahead takes instead (GenerateInputError; beam search gets the refusal
        custom_generate gives it), save those that change nothing here (``use_cache``, ``num_beams=1``).
        Ids that look padded without an attention_mask get a PaddingWarning, as transformers warns.
        OpenAI's ``presence_penalty`` / ``frequency_penalty`` (in [-2, 2], over the output's tokens) and
        ``logit_bias`` ({token id: bias in [-100, 100]}) apply at every verified row (verify/penalties.py);
        ``logprobs`` (True, or k in [0, 20] alternatives) returns a LookaheadOutput whose ``.logprobs``
        holds each sequence's new tokens' logprobs (call/logprobs.py says from which distribution).
        ``prediction`` (Predicted Outputs: text, token ids, or a list of one per row) proposes the
        predicted output as candidates where the output aligns with it; the output stays the same, and
        ``last_stats`` counts ``accepted_prediction_tokens`` / ``rejected_prediction_tokens``.
        ``response_format`` ("json_object", or a JSON schema dict) constrains the output by a grammar
        (call/grammar.py, verify/grammar.py: every tree row masked along its own path) until it is complete,
        then an EOS id ends it; greedy output equals the constrained plain loop token for token.

        Args:
            input_ids: [B, T] prompt token ids (left-padded for B > 1).
            attention_mask: [B, T] 1 for a token, 0 for padding (None: every token real).
            max_new_tokens, do_sample, temperature, top_k, top_p, min_p, repetition_penalty, eos_token_id,
                logits_processor, stopping_criteria, stop_strings, max_time, streamer, generator,
                generation_config: as ``model.generate`` takes them.
            presence_penalty, frequency_penalty, logit_bias, logprobs: OpenAI's, as above.
            prediction: the expected output (Predicted Outputs), or None.
            response_format: "json_object", a JSON schema dict, or None.

        Returns:
            [B, T + N] the prompts followed by up to N = max_new_tokens new tokens each (rows that end early
            padded with the pad token), or a ``LookaheadOutput`` (``.sequences`` [B, T + N], ``.stats``,
            ``.logprobs``) with ``return_dict_in_generate`` or ``logprobs``.
        """
        ids, mask, prompts = prompt_rows(input_ids, attention_mask, self.vocab,
                                         self.model.generation_config)  # [B, T], [B, T], B prompts
        refuse_kwargs(kwargs, "LookaheadGenerator.generate", ids.shape[1], self.generate)
        decoding = call_decoding(  # (an open batch's join resolves its settings the same way)
            self.model, ids.shape[1], self.target.device, self.vocab,
            lambda spec: self.grammar(spec, tokenizer),
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, logit_bias=logit_bias,
            logits_processor=logits_processor, logprobs=logprobs, response_format=response_format,
            return_dict_in_generate=return_dict_in_generate, max_new_tokens=max_new_tokens, do_sample=do_sample,
            eos_token_id=eos_token_id, stopping_criteria=stopping_criteria, stop_strings=stop_strings,
            max_time=max_time, tokenizer=tokenizer if tokenizer is not None else self.tokenizer,
            generator=generator, generation_config=generation_config, temperature=temperature, top_k=top_k,
            top_p=top_p, min_p=min_p, repetition_penalty=repetition_penalty)
        # refuses a prompt that fills the context
        contexts_left = [tokens_left_in_context(p.shape[0], self.target.context) for p in prompts]
        predictions = prediction_rows(prediction, contexts_left, self.vocab, tokenizer if tokenizer is not None
                                      else self.tokenizer)  # Predicted Outputs: each row's [P] or None
        return self._run(ids, mask, prompts, decoding, streamer, input_ids.device, predictions)

    def grammar(self, response_format: Any, tokenizer: PreTrainedTokenizerBase | None = None) -> Grammar | None:
        """``response_format`` compiled over ``tokenizer`` (else the generator's), None when None.

        Args:
            response_format: an OpenAI ``response_format`` ({"type": "json_object"} or "json_schema" with its
                schema), or None.
            tokenizer: the vocabulary to compile over (the generator's when None).

        Returns:
            The compiled ``Grammar`` (compilers are reused across calls), or None.
        """
        if response_format is None:
            return None
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        grammars = getattr(self, "_grammars", None)
        if grammars is None or grammars.tokenizer is not tokenizer:
            grammars = self._grammars = Grammars(tokenizer, self.vocab)  # (compiler reused across calls)
        return grammars.compile(response_format)

    def generate_prepared(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                          generation_config: GenerationConfig, logits_processor: LogitsProcessorList | None,
                          stopping_criteria: StoppingCriteriaList | None, streamer: BaseStreamer | None = None,
                          prediction: Any = None) -> torch.LongTensor | LookaheadOutput:
        """Decode under a generation_config and processor / criteria lists transformers has already
        prepared (what model.generate hands a custom_generate callable, see hf.py), used as they are.

        The streamer receives the prompt, then every kept token; ``prediction`` as ``generate`` takes it.

        Args:
            input_ids: [B, T] prompt ids (left-padded where B > 1).
            attention_mask: [B, T], 0 on the padding, or None.
            generation_config, logits_processor, stopping_criteria: what transformers prepared.
            streamer: receives the prompt, then the kept tokens (B = 1).
            prediction: expected output ids or text (Predicted Outputs), as ``generate`` takes it.

        Returns:
            [B, T + N] ids (padded after a row's end), or a LookaheadOutput with
            ``return_dict_in_generate``.
        """
        length = int(input_ids.shape[-1]) if isinstance(input_ids, torch.Tensor) else 0
        decoding = prepared_decoding(generation_config, logits_processor, stopping_criteria, length)  # settings first
        ids, mask, prompts = prompt_rows(input_ids, attention_mask, self.vocab)
        # refuses a prompt that fills the context
        contexts_left = [tokens_left_in_context(p.shape[0], self.target.context) for p in prompts]
        predictions = prediction_rows(prediction, contexts_left, self.vocab, self.tokenizer)
        return self._run(ids, mask, prompts, decoding, streamer, input_ids.device, predictions)

    def _run(self, ids: torch.Tensor, mask: torch.Tensor, prompts: list[np.ndarray], decoding: Decoding,
             streamer: BaseStreamer | None, device: torch.device,
             predictions: list[np.ndarray | None] | None = None) -> torch.LongTensor | LookaheadOutput:
        """One decode; the ids [B, prompt + new] on ``device`` (or the output object with the stats);
        ``predictions``: each row's predicted output (call/prediction.py), or None.

        The ids are made outside inference mode: an ordinary tensor, as model.generate returns.
        """
        if len(prompts) > 1 and self.draft_model is not None:
            raise GenerateInputError("a draft model drafts for one sequence: generate batch size 1 with "
                                     "draft_model, or a batch without it")
        if len(prompts) > 1 and streamer is not None:
            raise GenerateInputError("a streamer takes one sequence: stream batch size 1 only, "
                                     "or pass streamer=None for a batch")
        # refuses a prompt that fills the context
        contexts_left = [tokens_left_in_context(p.shape[0], self.target.context) for p in prompts]
        # the open batch the server steps (decode/batch.py), holding this call's rows alone, priced throughout
        # by the curve of the call's batch size
        batch = OpenBatch(DecodeRun.open(self._context(len(prompts))), self.model, self.tokenizer, self.grammar)
        with torch.inference_mode():
            out, handles = decode_padded(batch, ids, mask, prompts, decoding, streamer, contexts_left, predictions)
        self.last_stats = batch.stats
        self._warn_context_cut(handles)
        logprobs = [log for log in (handle.logprobs for handle in handles) if log is not None] \
            if decoding.logprobs is not None else None
        return generate_output(cast(torch.LongTensor, out.clone().to(device)), batch.stats, decoding.return_dict,
                               logprobs)

    def _warn_context_cut(self, handles: list[BatchHandle]) -> None:
        """A ContextLimitWarning for every sequence that stopped at the model's context short of
        max_new_tokens (what model.generate warns about before failing or running past it)."""
        for handle in handles:
            if handle.cut_by_context and self.target.context is not None:
                message = context_cut_message(handle.prompt_tokens, handle.new_tokens, handle.max_new_tokens,
                                              self.target.context)
                warnings.warn(message, ContextLimitWarning, stacklevel=4)

    def open_batch(self) -> OpenBatch:
        """A batch that requests join (each with its own settings, as ``generate`` takes them for one prompt),
        step together and leave between steps (decode/batch.py: ``join`` / ``step`` / ``leave``; the server's
        loop), on this generator's learned state; every step priced by the curve of the batch size it has
        (read from disk, else priced by a stand-in and measured by ``measure_pending``: cost/policy.py)."""
        if self.draft is not None:
            raise GenerateInputError("a draft model drafts for one sequence: open a batch without draft_model")
        context = dataclasses.replace(self._context(1), cost_for=self._open_batch_cost)
        return OpenBatch(DecodeRun.open(context), self.model, self.tokenizer, self.grammar)

    @property
    def pending_curves(self) -> tuple[int, ...]:
        """Batch sizes an open batch has priced by a stand-in, whose curves ``measure_pending`` measures."""
        return tuple(sorted(self.costs.pending))

    def measure_pending(self, stop: Callable[[], bool] | None = None) -> int | None:
        """Measure the cost curve of the smallest batch size an open batch has priced by a stand-in so far
        (what ``generate`` over that many prompts measures on first use; kept on disk as theirs): for a
        caller that is idle (a server between requests). ``stop`` is asked before every timed forward: where
        it says True (requests came back) the measurement ends there, the size still pending. The size
        measured, or None where none is pending or ``stop`` ended it."""
        with torch.inference_mode():
            return self.costs.measure_pending(self.run_config, stop)

    def _batch_cost(self, batch: int) -> CostModel | None:
        """The budget's curve for a step over ``batch`` sequences (measured on first use of a size)."""
        return self.costs.for_batch(batch, self.run_config, self.cost)

    def _open_batch_cost(self, batch: int) -> CostModel | None:
        """The budget's curve for an open batch's step over ``batch`` sequences: a size not on disk is priced
        by a stand-in at once and left to ``measure_pending``."""
        return self.costs.for_batch(batch, self.run_config, self.cost, wait=False)

    def _context(self, batch: int) -> DecodeContext:
        """What a decode of ``batch`` sequences reads: the state learned so far, shared, not copied."""
        sources = SourceFactory(self.run_config, self.memory, self.recycled, self.draft)
        cost = self._batch_cost(batch)
        return DecodeContext(self.target, self.run_config, cost, self.acceptance, self.recycled, self.memory, sources,
                             prefixes=self.prefixes)
