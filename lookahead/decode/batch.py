"""Batched decoding: B left-padded prompts, each with its own tree, in one forward per step.

Every row keeps its own ``Sequence`` (output, window, pool, planner,
verifier); the rows share the forward, the KV cache and the step's one host
transfer. Rows accept different numbers of tokens, so the cache gets holes:
after a step, row a's kept entries are gathered to the front of the step's
slots and the slots past its own count are *masked* from then on (a zeroed
key would still count in the softmax). ``valid [A, P]`` says which cache
slots each row may see (left padding is a hole too) and ``slot_pos [A, P]``
the position of each slot's token; each row's positions advance by its own
accepted count. Rows that finish (EOS or budget) leave the batch and stop
costing work; the output pads them with ``pad_token_id`` like model.generate.
Letters: A active rows, Q step rows (the longest row's; shorter rows are
padded with rows that only see themselves), P cache slots, K kept rows.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ..model.cache import keep_rows_per_row
from ..call.decoding import Decoding
from .sequence import Sequence, StepPlan
from ..call.stats import GenerationStats
from ..model.target import to_device


class BatchDecoding:
    """One generate call over a left-padded batch."""

    def __init__(self, gen, ids: torch.Tensor, mask: torch.Tensor, prompts: list[np.ndarray],
                 decoding: Decoding, pad_token_id: int | None, rooms: list[int | None] | None = None):
        """``rooms``: per row, the new tokens the model's context holds after its prompt (None: no limit)."""
        self.target = gen.target
        self.ids, self.mask = ids, mask  # [B, T] on the CPU
        self.pad = pad_token_id
        self.stats = GenerationStats(prompt_tokens=int(mask.sum()))
        cost = gen.cost_for_batch(len(prompts))
        self.row_stats = [GenerationStats(prompt_tokens=int(p.shape[0])) for p in prompts]
        rooms = rooms if rooms is not None else [None] * len(prompts)
        self.seqs = [Sequence(gen, p, decoding, None, s, cost, room)
                     for p, s, room in zip(prompts, self.row_stats, rooms)]
        self.cache = self.target.new_cache()
        self.active = list(range(len(prompts)))  # batch rows still decoding, in cache order
        dev = self.target.device
        self.valid = torch.zeros(len(prompts), 0, dtype=torch.bool, device=dev)  # [A, P]
        self.slot_pos = torch.zeros(len(prompts), 0, dtype=torch.long, device=dev)  # [A, P]
        self.x_pos = np.zeros(len(prompts), dtype=np.int64)  # [A] position of each row's x

    def decode(self) -> torch.Tensor:
        """Prefill, steps until every row is done; [B, T + new] like model.generate."""
        start = time.perf_counter()
        if self.seqs[0].out.limit > 0:
            self._prefill()
            for seq in self.seqs:
                seq.begin()
        else:
            self.active = []
        self.stats.prefill_s = time.perf_counter() - start
        while self.active:
            self._step()
        out = self._output()
        self.stats.wall_time_s = time.perf_counter() - start
        self.stats.new_tokens = sum(s.out.new_tokens for s in self.seqs)
        return out

    def _prefill(self) -> None:
        """All prompt columns but the last through the model, with the padding mask and per-row positions."""
        dev, width = self.target.device, self.ids.shape[1]
        positions = (self.mask.cumsum(1) - 1).clamp_min(0)  # [B, T]: each row counts from its first token
        if width > 1:
            self.target.model(input_ids=self.ids[:, :-1].to(dev), attention_mask=self.mask[:, :-1].to(dev),
                              position_ids=positions[:, :-1].to(dev), past_key_values=self.cache,
                              use_cache=True, logits_to_keep=1)
        self.valid = self.mask[:, :-1].bool().to(dev)  # [B, T-1]
        self.slot_pos = positions[:, :-1].to(dev)  # [B, T-1]
        self.x_pos = positions[:, -1].numpy().copy()  # [B]

    def _step(self) -> None:
        """One batched step: plan every row, one forward, one transfer, commit every row."""
        began = time.perf_counter()
        seqs = [self.seqs[b] for b in self.active]
        ranked = [seq.rank() for seq in seqs]  # 1. propose
        planner = seqs[0].planner  # every row's planner shares the config, window options and batched cost
        columns, size = planner.choose([r.probs for r in ranked])  # 2. one window and tree width for the batch
        plans = [seq.plan(seq.planner.cut(r, size), columns) for seq, r in zip(seqs, ranked)]
        tokens, q_pos, local = self._rows(plans)  # [A, Q], [A, Q], [A, Q, Q]
        logits = self._forward(tokens, q_pos, local)  # 3. forward: [A, Q, V]
        staged = [seq.stage(logits[a, to_device(p.keep, logits.device)], p)  # 4. verify
                  for a, (seq, p) in enumerate(zip(seqs, plans))]
        host = torch.cat(staged).cpu().numpy()  # the step's one host sync
        bounds = np.cumsum([0] + [seq.staged_size(p) for seq, p in zip(seqs, plans)])
        results = [seq.commit(host[bounds[a]:bounds[a + 1]], p)  # 5. commit
                   for a, (seq, p) in enumerate(zip(seqs, plans))]
        self._keep([rows for _, rows in results], past=self.valid.shape[1])
        self._drop([a for a, (done, _) in enumerate(results) if done])
        self.stats.steps += 1
        self.stats.routes.append(self.target.last_route)
        self.stats.rows_per_step.append(int(tokens.shape[0] * tokens.shape[1]))
        self.stats.accepted.append(sum(s.accepted[-1] for s in (seq.stats for seq in seqs)))
        seconds = time.perf_counter() - began
        self.stats.step_seconds.append(seconds)
        seqs[0].planner.observe_step(int(tokens.shape[1]), seconds)  # the cost model is shared
        self.target.observe(int(tokens.shape[0]), int(tokens.shape[1]), seconds)

    def _rows(self, plans: list[StepPlan]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every row's step rows padded to the longest: tokens, positions, local masks."""
        width = max(p.tokens.shape[0] for p in plans)
        count = len(plans)
        tokens = np.zeros((count, width), dtype=np.int64)  # [A, Q]
        offsets = np.zeros((count, width), dtype=np.int64)  # [A, Q]
        local = np.zeros((count, width, width), dtype=bool)  # [A, Q, Q]
        for a, plan in enumerate(plans):
            q = plan.tokens.shape[0]
            tokens[a, :q], tokens[a, q:] = plan.tokens, plan.tokens[0]
            offsets[a, :q] = plan.layout.offsets
            local[a, :q, :q] = plan.layout.local_mask
            local[a, np.arange(q, width), np.arange(q, width)] = True  # padding rows see themselves only
        return tokens, self.x_pos[:, None] + offsets, local

    def _forward(self, tokens: np.ndarray, q_pos: np.ndarray, local: np.ndarray) -> torch.Tensor:
        """Logits [A, Q, V] of the step: every row sees its valid cache slots and its own rows."""
        dev = self.target.device
        count, width = tokens.shape
        q_pos_t = to_device(q_pos, dev)  # [A, Q]
        visible = torch.cat([self.valid[:, None, :].expand(count, width, -1), to_device(local, dev)],
                            dim=2)  # [A, Q, P+Q]
        k_pos = torch.cat([self.slot_pos, q_pos_t], dim=1)  # [A, P+Q]
        return self.target.forward_batch(self.cache, to_device(tokens, dev), q_pos_t, visible, k_pos)

    def _keep(self, kept: list[np.ndarray], past: int) -> None:
        """Gather every row's kept step rows to the front of the step's slots; mask the rest."""
        dev = self.target.device
        lens = np.array([rows.shape[0] for rows in kept])  # [A]
        rows = np.zeros((len(kept), int(lens.max())), dtype=np.int64)  # [A, K]
        for a, r in enumerate(kept):
            rows[a, :r.shape[0]] = r
        keep_rows_per_row(self.cache, past, to_device(rows, dev))
        column = np.arange(rows.shape[1])  # [K]
        self.valid = torch.cat([self.valid, to_device(column[None] < lens[:, None], dev)], dim=1)
        self.slot_pos = torch.cat([self.slot_pos, to_device(self.x_pos[:, None] + column, dev)], dim=1)
        self.x_pos = self.x_pos + lens  # the next x is the last token each row appended

    def _drop(self, finished: list[int]) -> None:
        """Finished rows leave the batch (their cache rows too)."""
        if not finished:
            return
        stay = [a for a in range(len(self.active)) if a not in set(finished)]
        self.active = [self.active[a] for a in stay]
        if not stay:
            return
        index = torch.tensor(stay, device=self.target.device)
        self.cache.batch_select_indices(index)
        self.valid, self.slot_pos, self.x_pos = self.valid[index], self.slot_pos[index], self.x_pos[stay]

    def _output(self) -> torch.Tensor:
        """[B, T + n]: each padded prompt, its new tokens, then pad_token_id up to the longest row."""
        new = [seq.out.seq[seq.out.prompt_len:seq.out.stop] for seq in self.seqs]
        longest = max(n.shape[0] for n in new)
        if any(n.shape[0] < longest for n in new) and self.pad is None:
            raise ValueError("rows finished at different lengths and the model has no pad_token_id (nor an "
                             "eos_token_id): set model.generation_config.pad_token_id")
        tail = np.full((len(new), longest), self.pad if self.pad is not None else 0, dtype=np.int64)
        for b, n in enumerate(new):
            tail[b, :n.shape[0]] = n
        return torch.cat([self.ids, torch.from_numpy(tail)], dim=1)
