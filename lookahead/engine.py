"""The decode loop: propose -> build tree -> forward -> verify -> commit.

One target forward per step over [x | lookahead window | token tree] with a
block-structured 4-D mask and explicit positions (see tree.py, DESIGN.md).
Shape letters: Q rows this step, P cached rows, W window, N n-gram, M tree nodes, V vocab.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from .cache import keep_rows, new_cache
from .config import LookaheadConfig
from .inputs import GenerateInputError, budget, eos_ids, prompt_array
from .kernels import warmup
from .proposers.context import ContextMatcher
from .proposers.jacobi import JacobiWindow
from .proposers.ngram import NgramPool, NgramProposer
from .stats import GenerationStats
from .support import AttentionLayout, check_model
from .tree import StepLayout, TokenTree, additive_mask, step_layout, tree_from_candidates
from .verify import greedy_accept


@dataclass
class StepResult:
    """What one forward pass produced, read back to the host once."""

    root_next: int  # argmax at x
    level_next: np.ndarray  # [W] argmax at the window's last level
    node_next: np.ndarray  # [M] argmax at each tree node


def merge_candidates(groups: list[tuple[np.ndarray, np.ndarray]], limit: int) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate (cands, lens) groups in priority order, at most limit rows, padded."""
    groups = [g for g in groups if g[0].shape[0]]
    if not groups or limit <= 0:
        return np.zeros((0, 1), dtype=np.int64), np.zeros(0, dtype=np.int64)
    width = max(c.shape[1] for c, _ in groups)
    cands = np.concatenate([np.pad(c, ((0, 0), (0, width - c.shape[1]))) for c, _ in groups])  # [G, L]
    lens = np.concatenate([l for _, l in groups])  # [G]
    return cands[:limit], lens[:limit]


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
        self.proposers = self._proposers()
        self.stats = GenerationStats(prompt_tokens=self.prompt_len)

    def _proposers(self) -> list:
        """Candidate sources in priority order."""
        cfg = self.cfg
        sources = []
        if cfg.context_match:
            sources.append(ContextMatcher(cfg.match_min, cfg.match_max, cfg.match_length))
        sources.append(NgramProposer(self.pool, cfg.seed_from_prompt, cfg.seed_from_output))
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
        past = self.stop - 1  # x = seq[stop - 1] is not cached yet
        tree = self._build_tree(self._propose())  # 1. propose, 2. build tree
        layout = step_layout(self.cfg.window, self.cfg.ngram, tree)
        result = self._forward(tree, layout, past)  # 3. forward
        path, new = greedy_accept(tree.tokens, tree.parents, result.root_next, result.node_next)  # 4. verify
        return self._commit(path, new, result, layout, past)  # 5. commit

    # ------------------------------------------------------------- 1 and 2
    def _propose(self) -> tuple[np.ndarray, np.ndarray]:
        """Candidates from every source, in priority order, at most G."""
        limit = self.cfg.candidates
        if limit == 0 or self.cfg.max_tree_nodes == 0:
            return merge_candidates([], 0)
        groups = [source.propose(self.seq, self.stop, limit) for source in self.proposers]
        return merge_candidates(groups, limit)

    def _build_tree(self, cands: tuple[np.ndarray, np.ndarray]) -> TokenTree:
        """Merge candidates into a trie of at most max_tree_nodes nodes."""
        return tree_from_candidates(cands[0], cands[1], self.cfg.max_tree_nodes)

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
        best = out.logits[0].argmax(-1).cpu().numpy()  # [K]: the step's one host sync
        self.stats.steps += 1
        self.stats.rows_per_step.append(int(tokens.shape[0]))
        lead = head.shape[0]
        return StepResult(int(best[0]), best[lead - self.cfg.window:lead], best[lead:])

    def _mask(self, local: torch.Tensor, offsets: torch.Tensor, past: int):
        """The 4-D mask, or a {layer kind: mask} dict for models mixing full and sliding layers."""
        kinds, window = self.layout.kinds, self.layout.sliding_window
        if kinds == {"full_attention"} or window is None:
            return additive_mask(local, offsets, past, None, self.dtype)
        sliding = additive_mask(local, offsets, past, window, self.dtype)
        if kinds == {"sliding_attention"}:
            return sliding
        return {"full_attention": additive_mask(local, offsets, past, None, self.dtype),
                "sliding_attention": sliding}

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
        keep_rows(self.cache, past, torch.from_numpy(rows).to(self.device), contiguous=path.size == 0)
        self.pool.insert_grams(self.window.advance(result.level_next))
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
