"""LookaheadGenerator and its decode loop: plan -> forward -> verify -> commit.

One target forward per step over [x | lookahead window | token tree] with a
block-structured 4-D mask and explicit positions (tree.py, mask.py,
target.py). Every candidate source feeds one scored trie; the best-first
prefix that maximises expected tokens per second is verified (planner.py);
verify.py chooses every token, greedy or sampled.
Shape letters: Q rows this step, P cached rows, W window, N n-gram, M tree
nodes, K logit rows kept, R recycled successors, V vocab.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from .cache import keep_rows
from .config import LookaheadConfig
from .costmodel import CostModel, load_cost_model
from .inputs import prompt_array
from .kernels import warmup
from .output import OutputBuffer
from .planner import SCORE_DEPTH, Planner, regime
from .processing import Decoding, prepared_decoding, resolve_decoding
from .proposers.context import ContextMatcher
from .proposers.ngram import NgramPool, NgramProposer
from .proposers.recycle import AdjacencyTable, RecyclingProposer
from .result import LookaheadOutput, generate_output
from .scores import AcceptanceStats
from .stats import GenerationStats
from .support import check_model
from .target import Target
from .tree import TokenTree, step_layout
from .verify import Choice, RowMap, Verifier
from .window import JacobiWindow


@dataclass
class Learned:
    """What a generator learns across generate calls (it holds no reference to the model).

    Handing it to a new LookaheadGenerator of the same model and config
    continues from it (hf.py keeps one per model that way).
    """

    config: LookaheadConfig
    vocab: int
    recycled: AdjacencyTable | None  # the recycled successors
    acceptance: dict[str, AcceptanceStats]  # acceptance estimates, one table per regime (planner.py)
    cost: CostModel | None  # the step-cost curve and its running overhead


class LookaheadGenerator:
    """Lookahead decoding on a stock transformers causal LM: greedy output identical to
    ``model.generate``, sampled output with exactly the target's distribution.

    >>> gen = LookaheadGenerator(model, tokenizer, LookaheadConfig())
    >>> out = gen.generate(input_ids, max_new_tokens=64)  # == model.generate(..., do_sample=False)
    >>> out = gen.generate(input_ids, max_new_tokens=64, do_sample=True, temperature=0.7)
    """

    def __init__(self, model, tokenizer=None, config: LookaheadConfig | None = None, *,
                 learned: Learned | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config if config is not None else LookaheadConfig()
        if not isinstance(self.config, LookaheadConfig):
            raise TypeError(f"config must be a LookaheadConfig, got {type(self.config).__name__}")
        self.target = Target(model, check_model(model, self.config.allow_untested_models))
        self.vocab = self.target.vocab
        self.last_stats: GenerationStats | None = None
        warmup()
        if learned is not None and (learned.config != self.config or learned.vocab != self.vocab):
            raise ValueError("learned state comes from a generator with another config or vocabulary; "
                             "hand it only to a generator of the same model and LookaheadConfig")
        if learned is None:
            learned = self._fresh()
        # Learned across generate calls: the recycled successors, the acceptance
        # estimates (one table per regime, see planner.py) and the step-cost curve.
        self.recycled, self.acceptance, self.cost = learned.recycled, learned.acceptance, learned.cost

    def _fresh(self) -> Learned:
        """Nothing learned yet; the cost curve measured (or read from disk) when the budget uses it."""
        cfg = self.config
        recycled = AdjacencyTable(self.vocab, cfg.recycle_width) if cfg.recycle else None
        cost = None
        if cfg.budget == "adaptive" and cfg.candidates > 0 and cfg.max_tree_nodes > 0:
            cost = self._measure_cost()
        return Learned(cfg, self.vocab, recycled, {}, cost)

    @property
    def learned(self) -> Learned:
        """The state this generator learned so far (shared, not copied: it keeps learning)."""
        return Learned(self.config, self.vocab, self.recycled, self.acceptance, self.cost)

    def _measure_cost(self) -> CostModel:
        """The forward-cost curve up to the largest step this config can build (cached on disk)."""
        cfg = self.config
        return load_cost_model(self.model, self.target.layout, cfg.lookahead_rows + cfg.max_tree_nodes,
                               cfg.calibration_context, cfg.calibration_repeats, cfg.cost_cache_dir)

    # ------------------------------------------------------------------ API
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 max_new_tokens: int | None = None, do_sample: bool | None = None,
                 temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                 min_p: float | None = None, repetition_penalty: float | None = None, logits_processor=None,
                 eos_token_id: int | list[int] | None = None, streamer=None,
                 generator: torch.Generator | None = None, generation_config=None, stopping_criteria=None,
                 stop_strings: str | list[str] | None = None, max_time: float | None = None, tokenizer=None,
                 return_dict_in_generate: bool | None = None) -> torch.LongTensor | LookaheadOutput:
        """Decode up to max_new_tokens; returns [1, prompt + new] like model.generate.

        Every argument left as None takes the model's ``generation_config``
        value, as ``model.generate`` does. Greedy (do_sample False, or
        temperature 0) gives exactly model.generate's tokens; sampling draws
        from exactly the target's processed distribution, with random numbers
        from ``generator`` or torch's default generator (``torch.manual_seed``).
        Decoding stops where model.generate would: EOS, max_new_tokens,
        ``stopping_criteria``, ``stop_strings`` (decoded with ``tokenizer``, else
        the generator's) or ``max_time`` seconds, even inside a multi-token step.
        With ``return_dict_in_generate`` the result is a LookaheadOutput
        (``.sequences``, ``.stats``).
        """
        prompt = prompt_array(input_ids, attention_mask, self.vocab)
        decoding = resolve_decoding(
            self.model, prompt.shape[0], self.target.device, max_new_tokens=max_new_tokens, do_sample=do_sample,
            eos_token_id=eos_token_id, logits_processor=logits_processor, stopping_criteria=stopping_criteria,
            stop_strings=stop_strings, max_time=max_time,
            tokenizer=tokenizer if tokenizer is not None else self.tokenizer,
            return_dict_in_generate=return_dict_in_generate, generator=generator,
            generation_config=generation_config, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            repetition_penalty=repetition_penalty)
        return self._run(prompt, decoding, streamer, input_ids.device)

    def generate_prepared(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, generation_config,
                          logits_processor, stopping_criteria, streamer=None) -> torch.LongTensor | LookaheadOutput:
        """Decode under a generation_config and processor / criteria lists transformers has already
        prepared (what model.generate hands a custom_generate callable, see hf.py), used as they are.

        The streamer receives the prompt, then every kept token.
        """
        length = int(input_ids.shape[-1]) if isinstance(input_ids, torch.Tensor) else 0
        decoding = prepared_decoding(generation_config, logits_processor, stopping_criteria, length)  # settings first:
        prompt = prompt_array(input_ids, attention_mask, self.vocab)  # beams would show as a batch here
        return self._run(prompt, decoding, streamer, input_ids.device)

    def _run(self, prompt: np.ndarray, decoding: Decoding, streamer, device) -> torch.LongTensor | LookaheadOutput:
        """One decode; the ids [1, prompt + new] on ``device`` (or the output object with the stats).

        The ids are made outside inference mode: an ordinary tensor, as model.generate returns.
        """
        with torch.inference_mode():
            run = _Decoding(self, prompt, decoding, streamer)
            seq = run.decode()
        self.last_stats = run.stats
        return generate_output(torch.from_numpy(seq).to(device)[None], run.stats, decoding.return_dict)

    def acceptance_for(self, decoding: Decoding, proposers: list) -> AcceptanceStats:
        """The estimate table of this decoding's regime (made from the sources' priors when new)."""
        key = regime(decoding.do_sample, decoding.temperature)
        if key not in self.acceptance:
            self.acceptance[key] = AcceptanceStats([p.priors for p in proposers], SCORE_DEPTH)
        return self.acceptance[key]


class _Decoding:
    """One generate call: the KV cache, the output, the window, the planner and the verifier."""

    def __init__(self, gen: LookaheadGenerator, prompt: np.ndarray, decoding: Decoding, streamer):
        cfg = gen.config
        self.cfg, self.target, self.recycled = cfg, gen.target, gen.recycled
        self.out = OutputBuffer(prompt, decoding.max_new_tokens, decoding.eos, streamer, decoding.criteria,
                                gen.target.device)
        self.cache = self.target.new_cache()
        self.window = JacobiWindow(cfg.window, cfg.ngram, cfg.window_seed)
        self.rows = RowMap(lead=self.window.kept_rows.shape[0], window=cfg.window, ngram=cfg.ngram)
        self.pool = NgramPool(gen.vocab, cfg.ngram, cfg.pool_capacity, cfg.pool_max_keys)
        proposers = self._proposers()
        self.planner = Planner(cfg, proposers, gen.acceptance_for(decoding, proposers), gen.cost,
                               self.window.size)
        self.verifier = Verifier(decoding, self.recycled.width if self.recycled is not None else None,
                                 self.out.prompt_len)
        self.stats = GenerationStats(prompt_tokens=self.out.prompt_len)

    def _proposers(self) -> list:
        """Candidate sources in priority order (the order also fixes their estimate blocks)."""
        cfg = self.cfg
        sources = []
        if cfg.context_match:
            sources.append(ContextMatcher(cfg.match_min, cfg.match_max, cfg.match_length))
        if cfg.ngram_pool:
            sources.append(NgramProposer(self.pool, cfg.seed_from_prompt, cfg.seed_from_output))
        if self.recycled is not None:
            sources.append(RecyclingProposer(self.recycled, cfg.max_tree_nodes))
        return sources

    # ------------------------------------------------------------- the loop
    def decode(self) -> np.ndarray:
        """Prefill all but the last prompt token, then steps until a stop (EOS, budget, criteria).

        The last prompt token is the first step's x, so the first new tokens
        are already speculated (a copy from the prompt can arrive in one go).
        """
        start = time.perf_counter()
        done = self.out.limit == 0
        if not done:
            self.target.prefill(self.cache, self.out.seq[:self.out.prompt_len - 1])
            self.window.begin(self.out.seq[:self.out.prompt_len])
            self.planner.begin(self.out.seq, self.out.prompt_len)
        self.stats.prefill_s = time.perf_counter() - start
        while not done:
            done = self._step()
        seq = self.out.finish()
        self.stats.wall_time_s = time.perf_counter() - start
        self.stats.new_tokens = self.out.new_tokens
        return seq

    def _step(self) -> bool:
        """One decode step; whether decoding ends."""
        began = time.perf_counter()
        seq, stop = self.out.seq, self.out.stop
        past = stop - 1  # x = seq[stop - 1] is not cached yet
        tree = self.planner.plan(seq, stop)  # 1. propose, 2. build the tree
        layout = step_layout(self.window.layout(), tree)
        tokens = np.concatenate([self.window.rows(self.out.last), tree.tokens])  # [Q]
        keep = np.concatenate([self.window.kept_rows, layout.tree_start + np.arange(tree.size)])  # [K]
        logits = self.target.forward(self.cache, tokens, layout.offsets, layout.local_mask, past, keep)  # 3.
        choice = self.verifier.choose(logits, self.rows, tree, seq, stop)  # 4. verify
        self._learn(tree, choice, tokens[keep])
        done = self._commit(choice, layout.tree_start, past)  # 5. commit
        seconds = time.perf_counter() - began
        self.stats.steps += 1
        self.stats.rows_per_step.append(int(tokens.shape[0]))
        self.stats.step_seconds.append(seconds)
        self.planner.observe_step(int(tokens.shape[0]), seconds)
        return done

    def _learn(self, tree: TokenTree, choice: Choice, row_tokens: np.ndarray) -> None:
        """Count the verified nodes into the estimates; recycle the top-R of every kept row."""
        self.planner.learn(tree, choice.path)
        if self.recycled is not None:
            self.recycled.learn(row_tokens, choice.top)

    def _commit(self, choice: Choice, tree_start: int, past: int) -> bool:
        """Append the chosen tokens, keep their KV rows, feed the pool. Whether decoding ends."""
        start = self.out.stop
        done = self.out.append(choice.new)  # 5a. the stop cut: EOS, budget, criteria
        self.stats.accepted.append(self.out.stop - start)
        if done:
            return True
        rows = np.concatenate([[0], tree_start + choice.path])  # [k+1] step rows to keep
        in_place = bool((rows == np.arange(rows.shape[0])).all())  # e.g. a chain right after x: no gather
        keep_rows(self.cache, past, torch.from_numpy(rows).to(self.target.device), contiguous=in_place)
        grams = self.window.advance(choice.window_next)  # [W, N]
        if self.cfg.ngram_pool:  # nobody reads the pool otherwise
            self.pool.insert_grams(grams)
        self.planner.observe(self.out.seq, start, self.out.stop)
        return False
