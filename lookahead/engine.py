"""The decode loop: propose -> build tree -> forward -> verify -> commit.

One target forward per step over [x | lookahead window | token tree] with a
block-structured 4-D mask and explicit positions (see tree.py, DESIGN.md).
Every candidate source feeds one scored trie; the best-first prefix that
maximises expected tokens per second (scores.py, costmodel.py) is verified.
Shape letters: Q rows this step, P cached rows, W window, N n-gram, M tree
nodes, G candidates, K logit rows kept, R recycled successors, V vocab.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from .cache import keep_rows, new_cache
from .config import LookaheadConfig
from .costmodel import CostModel, load_cost_model
from .inputs import GenerateInputError, budget, eos_ids, prompt_array
from .kernels import warmup
from .kernels.trie import best_first_order
from .proposers.base import Candidates, no_candidates
from .proposers.context import ContextMatcher
from .proposers.jacobi import JacobiWindow
from .proposers.ngram import NgramPool, NgramProposer
from .proposers.recycle import AdjacencyTable, RecyclingProposer
from .scores import AcceptanceStats, choose_tree_size
from .stats import GenerationStats
from .support import AttentionLayout, check_model
from .tree import StepLayout, TokenTree, empty_tree, model_mask, scored_tree, step_layout, subtree
from .verify import greedy_accept

SCORE_DEPTH = 32  # depths told apart by the acceptance estimates (deeper share the last)
BUILD_SLACK = 4  # the scored trie may hold this many times max_tree_nodes before pruning


@dataclass
class StepResult:
    """What one forward pass produced, read back to the host once."""

    root_next: int  # argmax at x
    level_next: np.ndarray  # [W] argmax at the window's last level
    node_next: np.ndarray  # [M] argmax at each tree node
    row_tokens: np.ndarray  # [K] input token of every row whose logits were kept
    top: np.ndarray | None  # [K, R] top-R next tokens at those rows (token recycling), or None


def merge_candidates(groups: list[tuple[Candidates, int]]) -> Candidates:
    """Concatenate every source's candidates (in priority order), shifting each
    source's classes by its offset into the shared estimate table."""
    groups = [(c, off) for c, off in groups if c.count]
    if not groups:
        return no_candidates()
    width = max(c.tokens.shape[1] for c, _ in groups)

    def pad(a: np.ndarray) -> np.ndarray:
        return np.pad(a, ((0, 0), (0, width - a.shape[1])))

    tokens = np.concatenate([pad(c.tokens) for c, _ in groups])  # [G, L]
    classes = np.concatenate([pad(c.classes) + off for c, off in groups])  # [G, L]
    lens = np.concatenate([c.lens for c, _ in groups])  # [G]
    return Candidates(tokens, lens, classes)


def first_stop(new: np.ndarray, eos: np.ndarray, remaining: int) -> tuple[np.ndarray, bool]:
    """Cut new tokens at the first EOS (kept) or at the budget; whether decoding ends."""
    hits = np.flatnonzero(np.isin(new, eos)) if eos.size else np.zeros(0, dtype=np.int64)
    end = min(int(hits[0]) + 1 if hits.size else new.shape[0], remaining)
    return new[:end], bool(hits.size and hits[0] < end) or end >= remaining


class LookaheadGenerator:
    """Exact greedy lookahead decoding on a stock transformers causal LM.

    >>> gen = LookaheadGenerator(model, tokenizer, LookaheadConfig())
    >>> out = gen.generate(input_ids, max_new_tokens=64)  # == model.generate(..., do_sample=False)
    """

    def __init__(self, model, tokenizer=None, config: LookaheadConfig | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config if config is not None else LookaheadConfig()
        if not isinstance(self.config, LookaheadConfig):
            raise TypeError(f"config must be a LookaheadConfig, got {type(self.config).__name__}")
        self.layout: AttentionLayout = check_model(model, self.config.allow_untested_models)
        self.vocab = int(model.get_input_embeddings().weight.shape[0])
        self.last_stats: GenerationStats | None = None
        warmup()
        cfg = self.config
        # Learned across generate calls: the recycled successors, the acceptance
        # estimates (built with the first call's sources) and the step-cost curve.
        self.recycled = AdjacencyTable(self.vocab, cfg.recycle_width) if cfg.recycle else None
        self.acceptance: AcceptanceStats | None = None
        self.cost: CostModel | None = None
        if cfg.budget == "adaptive" and cfg.candidates > 0 and cfg.max_tree_nodes > 0:
            self.cost = self._measure_cost()

    def _measure_cost(self) -> CostModel:
        """The forward-cost curve up to the largest step this config can build (cached on disk)."""
        cfg = self.config
        return load_cost_model(self.model, self.layout, cfg.lookahead_rows + cfg.max_tree_nodes,
                               cfg.calibration_context, cfg.calibration_repeats, cfg.cost_cache_dir)

    # ------------------------------------------------------------------ API
    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 max_new_tokens: int | None = None, do_sample: bool = False,
                 eos_token_id: int | list[int] | None = None, streamer=None) -> torch.LongTensor:
        """Greedy-decode up to max_new_tokens; returns [1, prompt + new] like model.generate."""
        if do_sample:
            raise GenerateInputError("do_sample=True is not supported yet: lookahead decodes greedily "
                                     "(do_sample=False)")
        gen_config = getattr(self.model, "generation_config", None)
        prompt = prompt_array(input_ids, attention_mask, self.vocab)
        limit = budget(max_new_tokens, getattr(gen_config, "max_new_tokens", None))
        eos = eos_ids(eos_token_id, gen_config)
        run = _Decoding(self, prompt, limit, eos, streamer)
        seq = run.decode()
        self.last_stats = run.stats
        device = input_ids.device
        return torch.from_numpy(seq).to(device)[None]


class _Decoding:
    """State of one generate call: cache, sequence buffer, proposers, window, stats."""

    def __init__(self, gen: LookaheadGenerator, prompt: np.ndarray, limit: int, eos: np.ndarray, streamer):
        cfg = gen.config
        self.cfg, self.model, self.layout = cfg, gen.model, gen.layout
        self.device = next(gen.model.parameters()).device
        self.dtype = next(gen.model.parameters()).dtype
        self.limit, self.eos, self.streamer = limit, eos, streamer
        self.prompt_len = prompt.shape[0]
        self.seq = np.zeros(self.prompt_len + limit + 1, dtype=np.int64)  # prompt + output
        self.seq[:self.prompt_len] = prompt
        self.stop = self.prompt_len  # seq[:stop] is final
        self.cache = new_cache()
        self.window = JacobiWindow(cfg.window, cfg.ngram, cfg.seed)
        self.pool = NgramPool(gen.vocab, cfg.ngram, cfg.pool_capacity, cfg.pool_max_keys)
        self.recycled, self.cost = gen.recycled, gen.cost
        self.proposers = self._proposers()
        if gen.acceptance is None:
            gen.acceptance = AcceptanceStats([p.priors for p in self.proposers], SCORE_DEPTH)
        self.acceptance = gen.acceptance
        self.stats = GenerationStats(prompt_tokens=self.prompt_len)

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
        """Prefill, then steps until EOS or the budget; returns prompt + new tokens."""
        start = time.perf_counter()
        if self.streamer is not None:
            self.streamer.put(torch.from_numpy(self.seq[:self.prompt_len].copy()))
        done = self.limit == 0 or self._prefill()
        self.stats.prefill_s = time.perf_counter() - start
        if not done:
            self.window.begin(self.seq[:self.prompt_len])
            for source in self.proposers:
                source.begin(self.seq, self.prompt_len)
        while not done:
            done = self._step()
        if self.streamer is not None:
            self.streamer.end()
        self.stats.wall_time_s = time.perf_counter() - start
        self.stats.new_tokens = self.stop - self.prompt_len
        return self.seq[:self.stop].copy()

    def _prefill(self) -> bool:
        """Run the prompt; its last logits give the first new token. Whether decoding ends."""
        ids = torch.from_numpy(self.seq[:self.prompt_len]).to(self.device)[None]  # [1, T]
        out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        first = out.logits[0, -1].argmax(-1).cpu().numpy().reshape(1)
        return self._append(first)

    def _step(self) -> bool:
        """One decode step; whether decoding ends."""
        began = time.perf_counter()
        past = self.stop - 1  # x = seq[stop - 1] is not cached yet
        estimates = self.acceptance.estimates()  # [C, D]
        tree = self._build_tree(self._propose(estimates), estimates)  # 1. propose, 2. build tree
        layout = step_layout(self.cfg.window, self.cfg.ngram, tree)
        result = self._forward(tree, layout, past)  # 3. forward
        path, new = greedy_accept(tree.tokens, tree.parents, result.root_next, result.node_next)  # 4. verify
        self._learn(tree, path, result)
        done = self._commit(path, new, result, layout, past)  # 5. commit
        seconds = time.perf_counter() - began
        self.stats.step_seconds.append(seconds)
        if self.cost is not None:
            self.cost.observe(layout.offsets.shape[0], seconds)
        return done

    # ------------------------------------------------------------- 1 and 2
    def _propose(self, estimates: np.ndarray) -> Candidates:
        """Candidates from every source (at most G each), classes in the shared table."""
        limit = self.cfg.candidates
        if limit == 0 or self.cfg.max_tree_nodes == 0:
            return merge_candidates([])
        groups = []
        for i, source in enumerate(self.proposers):
            block = self.acceptance.block(i, estimates)  # [C_i, D]
            groups.append((source.propose(self.seq, self.stop, limit, block), int(self.acceptance.offsets[i])))
        return merge_candidates(groups)

    def _build_tree(self, cands: Candidates, estimates: np.ndarray) -> TokenTree:
        """One scored trie of every candidate; keep the best-first prefix the budget pays for."""
        cap = self.cfg.max_tree_nodes
        if cands.count == 0 or cap == 0:
            return empty_tree()
        tree, prob = scored_tree(cands.tokens, cands.lens, cands.classes, estimates, BUILD_SLACK * cap)
        order = best_first_order(tree.parents, prob)  # [M]
        size = choose_tree_size(prob[order], self.cfg.lookahead_rows, self.cost, cap)
        return subtree(tree, order[:size])

    # ------------------------------------------------------------------- 3
    def _forward(self, tree: TokenTree, layout: StepLayout, past: int) -> StepResult:
        """One target forward over [window | tree]; argmax of the rows that matter."""
        x = int(self.seq[self.stop - 1])
        tokens = np.concatenate([self.window.rows(x), tree.tokens])  # [Q]
        last = self.window.last_level_rows()  # [W]
        head = last if self.cfg.ngram == 2 else np.concatenate([[0], last])  # row 0 first
        keep = np.concatenate([head, layout.tree_start + np.arange(tree.size)])  # [K]
        offsets = torch.from_numpy(layout.offsets).to(self.device)  # [Q]
        mask = self._mask(torch.from_numpy(layout.local_mask).to(self.device), offsets, past)
        out = self.model(input_ids=torch.from_numpy(tokens).to(self.device)[None],  # [1, Q]
                         position_ids=(past + offsets)[None],  # [1, Q]
                         attention_mask=mask, past_key_values=self.cache, use_cache=True,
                         logits_to_keep=torch.from_numpy(keep).to(self.device))
        best, top = self._read_back(out.logits[0])  # [K], [K, R]: the step's one host sync
        self.stats.steps += 1
        self.stats.rows_per_step.append(int(tokens.shape[0]))
        lead = head.shape[0]
        return StepResult(int(best[0]), best[lead - self.cfg.window:lead], best[lead:], tokens[keep], top)

    def _read_back(self, logits: torch.Tensor) -> tuple[np.ndarray, np.ndarray | None]:
        """Argmax [K] (and top-R [K, R] when recycling) of logits [K, V], in one transfer."""
        best = logits.argmax(-1)  # [K]: exactly what greedy decoding picks
        if self.recycled is None:
            return best.cpu().numpy(), None
        top = logits.topk(self.recycled.width, dim=-1).indices  # [K, R]
        host = torch.cat([best[:, None], top], dim=1).cpu().numpy()  # [K, 1 + R]
        return host[:, 0], host[:, 1:]

    def _mask(self, local: torch.Tensor, offsets: torch.Tensor, past: int):
        """The 4-D mask, or a {layer kind: mask} dict for models mixing full and sliding layers."""
        return model_mask(self.layout.kinds, self.layout.sliding_window, local, offsets, past, self.dtype)

    # ------------------------------------------------------------------- 4
    def _learn(self, tree: TokenTree, path: np.ndarray, result: StepResult) -> None:
        """Count the verified nodes into the acceptance estimates; recycle the top-R."""
        self.acceptance.update(tree.classes, tree.depths, tree.parents, path)
        if self.recycled is not None:
            self.recycled.learn(result.row_tokens, result.top)

    # ------------------------------------------------------------------- 5
    def _commit(self, path: np.ndarray, new: np.ndarray, result: StepResult,
                layout: StepLayout, past: int) -> bool:
        """Append the accepted tokens, keep their KV rows, feed the pool. Whether decoding ends."""
        start = self.stop
        done = self._append(new)
        self.stats.accepted.append(self.stop - start)
        if done:
            return True
        rows = np.concatenate([[0], layout.tree_start + path])  # [k+1] step rows to keep
        in_place = bool((rows == np.arange(rows.shape[0])).all())  # e.g. a chain right after x: no gather
        keep_rows(self.cache, past, torch.from_numpy(rows).to(self.device), contiguous=in_place)
        grams = self.window.advance(result.level_next)  # [W, N]
        if self.cfg.ngram_pool:  # nobody reads the pool otherwise
            self.pool.insert_grams(grams)
        for source in self.proposers:
            source.observe(self.seq, start, self.stop)
        return False

    def _append(self, new: np.ndarray) -> bool:
        """Write new tokens (cut at EOS / budget) to the sequence; whether decoding ends."""
        remaining = self.limit - (self.stop - self.prompt_len)
        new, done = first_stop(new, self.eos, remaining)
        self.seq[self.stop:self.stop + new.shape[0]] = new
        self.stop += new.shape[0]
        if self.streamer is not None and new.shape[0]:
            self.streamer.put(torch.from_numpy(new.copy()))
        return done
