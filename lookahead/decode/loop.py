"""The decode loop for A >= 1 sequences: plan -> forward -> verify -> commit -> learn. Sequences enter a run
by ``join`` (one prompt, prefilled alone, at once or a chunk a step while the others decode: an open batch's
requests) or ``admit`` (a generate call's left-padded batch, prefilled together as model.generate prefills
it), step together and leave.

Every sequence keeps its own ``Sequence`` (output, window, pool, planner,
verifier); they share the forward, the KV cache and the step's one host
transfer. One sequence is the case A = 1 of the same loop.

Sequences accept different numbers of tokens, so with several the cache
gets holes: after a step, sequence a's kept rows are gathered to the front
of the step's slots and the slots past its own count are *masked* from then
on (a zeroed key would still count in the softmax). ``PastSlots`` says which
cache slots each sequence sees (left padding is a hole too) and the position
of each slot's token; each sequence's positions advance by its own accepted
count. With one sequence there are no holes and no padding: every slot is
seen and slot p holds position p, so nothing is tracked (``slots`` None).
Sequences that finish (EOS or budget) leave the batch and stop costing
work; generate's output pads them with ``pad_token_id`` like model.generate (decode/padded.py).
Letters: B sequences asked, A still decoding, Q step rows (the longest
sequence's; shorter ones are padded with rows that see only themselves),
P cache slots, K kept rows, T prompt columns, V vocabulary.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from ..call.decoding import Decoding
from ..call.stats import DEVICE_PHASES, PHASES, GenerationStats
from ..model.cache import SlotCache, compact_slots, joined, keep_rows, keep_sequences
from ..model.mask import PastSlots, compacted
from ..model.prefixes import reuse_is_exact
from ..model.target import to_device
from ..plan.choice import StepChooser
from ..plan.planner import Planner
from ..verify.verifier import stage_batch
from .context import DecodeContext
from .sequence import Sequence, StepPlan, sequence_parts

# The cache is compacted (every sequence's visible slots moved together, the holes dropped) once its
# holes reach this share of its slots and at least COMPACT_MIN_SLOTS: a step reads every slot, a hole
# too, while compacting copies the visible ones once.
COMPACT_SHARE = 0.25
COMPACT_MIN_SLOTS = 32


@dataclass
class PendingJoin:
    """A sequence's prompt being prefilled into a cache of its own (``DecodeRun._opened``): at once, or, joining
    while the batch's sequences decode, ``LookaheadConfig.prefill_chunk`` rows before each step (``DecodeRun.join``)."""

    seq: Sequence
    cache: SlotCache  # its own cache, ``done`` slots filled
    body: np.ndarray  # [T - 1] its prompt but the last token (the first step's x)
    done: int  # slots prefilled or restored from the prefix store so far
    exact: bool  # whether its slots may go to the prefix store (model/prefixes.py's ``reuse_is_exact``)


@dataclass(frozen=True)
class StepRows:
    """The rows of one step of A sequences, as the target runs them."""

    tokens: np.ndarray  # [A, Q]
    positions: np.ndarray  # [A, Q]
    local: np.ndarray  # [A, Q, Q] which step rows each row sees
    keep: np.ndarray  # [K] rows whose logits are needed (every sequence's kept rows are a prefix of them)


def step_rows(plans: list[StepPlan], x_pos: np.ndarray) -> StepRows:
    """Every sequence's step rows padded to the longest: a padding row repeats x and sees only itself.

    Two plans of 2 and 1 rows (x at positions 5 and 3) -> tokens [[x0 t0] [x1 x1]],
    positions [[5 6] [3 3]], local [[[1 0] [1 1]] [[1 0] [0 1]]].
    """
    if len(plans) == 1:  # (the plan's own arrays, as views: no padding, no copy)
        plan = plans[0]
        return StepRows(plan.tokens[None], x_pos[:, None] + plan.layout.offsets, plan.layout.local_mask[None],
                        plan.keep)
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
        local[a, np.arange(q, width), np.arange(q, width)] = True
    # One window width for all: every plan keeps the same window rows, then the tree's from the same start
    # (StepPlan.keep), so each plan's kept rows are a prefix of the longest's, which are the step's [K] (the
    # loop slices the logits by it). (No check here: every numpy call is host work on every step.)
    keep = max((p.keep for p in plans), key=len)  # [K]
    return StepRows(tokens, x_pos[:, None] + offsets, local, keep)


def kept_slots(kept: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, bool]:
    """(rows [A, K] padded with 0, counts [A], whether every sequence keeps rows 0 .. k-1 in place).

    [[0 2], [0]] -> ([[0 2] [0 0]], [2 1], False); [[0 1], [0]] -> (..., True).
    """
    if len(kept) == 1:  # (one sequence: the scalar check, no padding)
        rows = kept[0]
        size = rows.shape[0]
        return rows[None], np.array([size]), int(rows[-1]) == size - 1  # rows ascend from 0: in place iff so
    counts = np.array([r.shape[0] for r in kept])  # [A]
    rows = np.zeros((len(kept), int(counts.max())), dtype=np.int64)  # [A, K]
    for a, r in enumerate(kept):
        rows[a, :r.shape[0]] = r
    in_place = all(bool((r == np.arange(r.shape[0])).all()) for r in kept)  # e.g. a chain right after x
    return rows, counts, in_place


class DecodeRun:
    """Sequences stepping together: they join (``join``, or a padded batch at once: ``admit``) and leave
    between steps (the public face: decode/batch.py's ``OpenBatch``)."""

    def __init__(self, context: DecodeContext):
        self.context = context
        self.target = context.target
        self.stats = GenerationStats()
        self.memory = context.memory  # earlier requests' text (its host time goes into the stats)
        self.chooser: StepChooser | None = None  # the batch's one choice per step (made with the first sequence)
        self.cache = self.target.new_cache()
        self.active: list[Sequence] = []  # sequences still decoding, in cache order
        self.past = 0  # cache slots P
        self.x_pos = np.zeros(0, dtype=np.int64)  # [A] position of each sequence's x
        self.slots: PastSlots | None = None  # with several sequences: which slots each sees (see above)
        self.pending: list[PendingJoin] = []  # joining sequences whose prompts are prefilled a chunk a step

    @classmethod
    def open(cls, context: DecodeContext) -> DecodeRun:
        """A run with no sequence yet: sequences ``join`` (or ``admit``) and ``leave`` it between ``step``s."""
        return cls(context)

    def _sequence(self, prompt: np.ndarray, decoding: Decoding, streamer: Any, context_left: int | None,
                  prediction: np.ndarray | None = None) -> Sequence:
        """A new sequence decoding ``prompt`` [T] under ``decoding`` (its regime's acceptance table)."""
        context = self.context
        parts = sequence_parts(context, prompt, decoding, streamer, context_left, prediction)
        acceptance = context.acceptance(decoding, parts.sources)
        if self.chooser is None:
            self.chooser = StepChooser(context.config, context.cost, acceptance)
        planner = Planner(context.config, parts.sources, acceptance, self.chooser)
        return Sequence(parts, planner, context.recycled, GenerationStats(prompt_tokens=int(prompt.shape[0])))

    @torch.inference_mode()
    def admit(self, ids: torch.Tensor, mask: torch.Tensor, prompts: list[np.ndarray], decoding: Decoding,
              streamers: list[Any], contexts_left: list[int | None],
              predictions: list[np.ndarray | None]) -> list[Sequence]:
        """A generate call's left-padded batch joins a run with no sequence running, every row under the call's
        one ``decoding``, prefilled together as model.generate prefills it (``_prefill``).

        Args:
            ids, mask: [B, T] on the CPU, left-padded.
            prompts: B rows [T_b], each without its padding.
            streamers, contexts_left, predictions: one per row, as ``join`` takes them.

        Returns:
            The B sequences, in row order: all running, or (nothing to generate: max_new_tokens 0) none, and
            then nothing is prefilled and none begins.
        """
        if self.active or self.pending:
            raise RuntimeError("admit: a padded batch joins a run with no sequence running")
        seqs = [self._sequence(p, decoding, streamer, left, predicted)
                for p, streamer, left, predicted in zip(prompts, streamers, contexts_left, predictions)]
        self.stats.prompt_tokens += int(mask.sum())
        if max(seq.out.limit for seq in seqs) <= 0:
            return seqs
        start = time.perf_counter()
        self.cache = self.target.new_cache()
        self._prefill(ids, mask, seqs)
        for seq in seqs:
            seq.begin()
        self.active = list(seqs)
        self.stats.prefill_s += time.perf_counter() - start
        self._recost()
        return seqs

    def _prefill(self, ids: torch.Tensor, mask: torch.Tensor, seqs: list[Sequence]) -> None:
        """All prompt columns but the last through the model. One sequence: its prompt as it is.
        Several: ids, mask [B, T] with the padding mask and each row's positions, which start the slots'
        bookkeeping."""
        if len(seqs) == 1:
            prompt = seqs[0].out.seq[:seqs[0].out.prompt_len]  # without its left padding
            join = self._opened(prompt, seqs[0])  # (as ``join`` prefills it when nobody decodes)
            self._filled(join, join.body.shape[0])
            self.cache = join.cache
            self.past = prompt.shape[0] - 1
            self.x_pos = np.array([self.past], dtype=np.int64)
            self.slots = None
            return
        held = mask.numpy()  # [B, T]
        positions = np.maximum(held.cumsum(1) - 1, 0)  # [B, T]: each row counts from its first token
        self.target.prefill(self.cache, ids.numpy()[:, :-1], held[:, :-1], positions[:, :-1])
        dev = self.target.device
        self.slots = PastSlots(to_device(held[:, :-1].astype(bool), dev), to_device(positions[:, :-1], dev))
        self.past = held.shape[1] - 1
        self.x_pos = positions[:, -1].copy()  # [B]

    def step(self) -> list[Sequence]:
        """One step of every active sequence: 1. propose, 2. build the trees, 3. one forward,
        4. verify (one host transfer), 5. commit (and the KV cache's rows), 6. learn. Before it, the first
        joining sequence's prompt is prefilled one chunk further (``join``; the whole of it where no sequence
        is decoding), and joins the step once all of it is in.

        Returns the sequences that finished in it (they have left the batch; ``Sequence.finish``
        is the caller's: decode/batch.py's ``OpenBatch.step`` finishes each there). Runs in inference mode, entered
        here where the caller has not (a server's loop, generate: already in it)."""
        if torch.is_inference_mode_enabled():
            return self._step()
        with torch.inference_mode():
            return self._step()

    def _step(self) -> list[Sequence]:
        """``step``, in inference mode."""
        if self.pending:
            self._advance_join()
        if not self.active:
            return []
        clock = time.perf_counter
        marks = [clock()]  # the end of each phase (stats.PHASES)
        seqs = list(self.active)
        assert self.chooser is not None, "a run with sequences has its chooser"
        proposing = self.chooser.proposing(len(seqs))  # (not while a batch's budget keeps taking plain steps)
        ranked = [seq.rank() if proposing else Planner.nothing() for seq in seqs]  # 1. propose: scored tries
        marks.append(clock())
        spent = sum(r.seconds for r in ranked)  # what the sources spent on forwards of their own (a draft's)
        column_gain = sum(seq.planner.column_worth() for seq in seqs) / len(seqs) if proposing else 0.0  # a window
        # column's worth to the sources (a step that proposes nothing is plain whatever it is)
        width, size = self.chooser.decide([r.probs for r in ranked], column_gain, spent)  # 2. one shape for all
        plans = [seq.plan(r, size, width, proposing) for seq, r in zip(seqs, ranked)]
        rows = step_rows(plans, self.x_pos)
        marks.append(clock())
        horizon = max(seq.tokens_left() for seq in seqs)  # (each step gives every sequence a token at least)
        logits = self.target.step(self.cache, rows.tokens, rows.positions, rows.local, rows.keep, self.past,
                                  self.slots, horizon)  # 3. forward: [A, K, V]
        marks.append(clock())
        staged = self._verify(seqs, plans, logits)  # 4. verify: the step's one host sync
        marks.append(clock())
        results = [seq.commit(staged[a], p) for a, (seq, p) in enumerate(zip(seqs, plans))]  # 5. commit
        marks.append(clock())
        finished = [a for a, (done, _) in enumerate(results) if done]
        self._remember(finished)
        continues = len(finished) < len(seqs)
        if continues:
            self._keep([kept for _, kept in results], self.past + rows.tokens.shape[1])
        changed = clock()  # from here on, the batch's own changes
        if continues:
            self._drop(finished)
            self._compact()
        else:
            self.active = []
        if finished:
            self._recost()
        marks.append(clock())
        seconds = marks[-1] - marks[0]
        # 6. learn what the step cost: the target's share alone (a draft's forwards, a catch-up over a
        # whole prompt among them, would make every row count look costlier), without the batch's own
        # changes (a sequence leaving, the cache compacted: the same whatever shape the step took).
        # A step that made a trace of its forward (model/traced.py) took that compile time too.
        changes = marks[-1] - changed
        compile_seconds = self.target.compile_seconds
        target_seconds = max(seconds - spent - changes - compile_seconds, 0.0)
        # A step through a route its routing was trying (routing.py) says what that route costs, not what the
        # steps the budget prices cost: it refines neither the curve nor the speculation check's times.
        count, width = rows.tokens.shape
        timed = not self.target.trying
        if timed and proposing:  # (a paused batch's plain steps refine nothing: host work each step for little)
            self.chooser.observe(width, target_seconds)  # the batch's cost curve
        accepted = sum(seq.stats.accepted[-1] for seq in seqs)  # tokens the step gave, all sequences
        # ... and its outcome against its forecast (the speculation check)
        self.chooser.record_outcome(accepted, seconds - changes - compile_seconds if timed else None)
        # The route is re-checked on the forward and its read-back alone (what its measurement timed): the
        # host's own work (joins, compaction, a draft) is the same whichever route ran, noise to it.
        self.target.observe(count, width, marks[4] - marks[2] - compile_seconds)
        marks.append(clock())
        self._record(rows, accepted, marks)
        return [seqs[a] for a in finished]

    def _verify(self, seqs: list[Sequence], plans: list[StepPlan], logits: torch.Tensor) -> list[np.ndarray]:
        """4. verify: what each sequence's commit needs from the step's logits [A, K, V], read back to the
        host in one transfer. Several plain greedy sequences are staged together (``stage_batch``);
        otherwise each stages its own kept rows (they lead rows.keep) and the parts travel as one."""
        # (one table for the run: one width; every plan of a step stages successors or none does)
        widths = {seq.verifier.staged_width(p.recycle) for seq, p in zip(seqs, plans)}
        if len(seqs) > 1 and len(widths) == 1 and all(seq.verifier.plain_greedy for seq in seqs):
            argmax, top = stage_batch(logits, widths.pop())
            return [seq.verifier.stage_from_batch(argmax[a], top[a] if top is not None else None, p.rows, p.tree,
                                          p.keep.shape[0]) for a, (seq, p) in enumerate(zip(seqs, plans))]
        staged = [seq.stage(logits[a, :p.keep.shape[0]], p) for a, (seq, p) in enumerate(zip(seqs, plans))]
        if len(staged) == 1:  # (one sequence: its part is the whole, no bounds to count)
            return [staged[0].cpu().numpy()]
        host = torch.cat(staged).cpu().numpy()
        bounds = np.cumsum([0] + [seq.staged_size(p) for seq, p in zip(seqs, plans)])
        return [host[bounds[a]:bounds[a + 1]] for a in range(len(seqs))]

    @torch.inference_mode()
    def join(self, prompt: np.ndarray, decoding: Decoding, streamer: Any = None, context_left: int | None = None,
             prediction: np.ndarray | None = None) -> Sequence:
        """A sequence decoding ``prompt`` [T] joins the batch at the next step.

        Its prompt (all but the last token, the first step's x) is prefilled alone: here, at once, where no
        sequence is decoding, the prompt is no longer than ``LookaheadConfig.prefill_chunk`` (0: every prompt)
        or a prompt prefilled in parts would not give a whole prefill's bits (model/prefixes.py); else
        ``prefill_chunk`` rows before each of the next steps, so that the decoding sequences wait for one
        chunk a step, not the whole prompt (``joining`` says whether it still is). Its keys and
        values then sit beside the others' as one more batch row, left-padded to the longer past (or
        the others' are), the padding hidden by the slots' mask. ``context_left``: the new tokens the
        model's context holds after the prompt (None: no limit). A sequence with nothing to
        generate (max_new_tokens or context_left 0) never joins: check ``Sequence.tokens_left()``.
        ``prediction``: its predicted output [P] (None: none).
        """
        seq = self._sequence(prompt, decoding, streamer, context_left, prediction)
        if seq.tokens_left() <= 0:
            return seq
        join = self._opened(prompt, seq)
        chunk = self.context.config.prefill_chunk
        if self.active and join.exact and 0 < chunk < join.body.shape[0] - join.done:
            self.pending.append(join)  # (prefilled a chunk a step: ``_advance_join``)
        else:
            self._prefill_join(join, join.body.shape[0])
        return seq

    def joining(self, seq: Sequence) -> bool:
        """Whether ``seq`` joined and its prompt is still being prefilled (it decodes once all of it is in)."""
        return any(join.seq is seq for join in self.pending)

    def _opened(self, prompt: np.ndarray, seq: Sequence) -> PendingJoin:
        """``seq``'s prompt [T] about to be prefilled into a new cache of its own: the slots of the longest earlier
        prompt it begins with restored from the prefix store where reusing them is exact (model/prefixes.py), else
        none; ``seq``'s stats count the tokens restored."""
        body = prompt[:-1]  # [T - 1]
        exact = reuse_is_exact(self.target.model)
        cache = self.target.new_cache()
        store = self.context.prefixes
        if store is None or not exact:
            return PendingJoin(seq, cache, body, 0, exact)
        reused = store.restore(body, cache)
        seq.stats.cached_prompt_tokens = reused
        self.stats.cached_prompt_tokens += reused
        return PendingJoin(seq, cache, body, reused, exact)

    @torch.inference_mode()
    def finish_joins(self) -> None:
        """Every joining sequence's prompt prefilled to its end now; they join the batch."""
        while self.pending:
            self._prefill_join(self.pending[0], self.pending[0].body.shape[0])

    def _advance_join(self) -> None:
        """The first joining sequence's prompt prefilled ``prefill_chunk`` rows further (all of the rest where no
        sequence is decoding: nobody waits); once all of it is in, it joins the batch."""
        join = self.pending[0]
        rows = self.context.config.prefill_chunk if self.active else join.body.shape[0]
        self._prefill_join(join, rows)

    def _prefill_join(self, join: PendingJoin, rows: int) -> None:
        """``rows`` more of ``join``'s prompt into its cache (``_filled``); once all of it is in, the sequence joins
        the batch."""
        if not self._filled(join, rows):
            return
        if join in self.pending:
            self.pending.remove(join)
        self._enter(join.seq, join.cache, join.done)

    def _filled(self, join: PendingJoin, rows: int) -> bool:
        """``rows`` more of ``join``'s prompt into its cache, in forwards of at most ``prefill_chunk`` columns where
        that is exact; whether all of it is in now (then it is kept in the prefix store, where there is one and
        reuse is exact)."""
        end = min(join.done + rows, join.body.shape[0])
        chunk = self.context.config.prefill_chunk if join.exact else 0
        self.target.prefill(join.cache, join.body[None, join.done:end], chunk=chunk)
        join.done = end
        if end < join.body.shape[0]:
            return False
        store = self.context.prefixes
        if store is not None and join.exact:
            store.keep(join.body, join.cache)
        return True

    def _enter(self, seq: Sequence, own: SlotCache, length: int) -> None:
        """``seq``, its prompt prefilled into ``own`` (``length`` slots), joins the batch and begins."""
        if not self.active:
            self.cache, self.past, self.slots = own, length, None
            self.x_pos = np.array([length], dtype=np.int64)
        else:
            self._place(own, length)
        self.active.append(seq)
        seq.begin()
        self._recost()

    def _remember(self, finished: list[int]) -> None:
        """Keep each finished sequence's cache slots in the prefix store: its prompt and output up to this
        step's x (the step's own rows are not committed to the cache), for a next request that resends
        them (a conversation's next turn)."""
        store = self.context.prefixes
        if not finished or store is None or not reuse_is_exact(self.target.model):
            return
        for a in finished:
            length = int(self.x_pos[a])  # the slots the sequence sees: its tokens before x
            index = torch.nonzero(self.slots.valid[a]).flatten() if self.slots is not None else None
            store.keep(self.active[a].out.seq[:length], self.cache, a, index)

    def _place(self, own: DynamicCache, length: int) -> None:
        """A new sequence's cache ``own`` (``length`` slots) beside the batch's, left-padded to the longer."""
        dev = self.target.device
        slots = self.slots if self.slots is not None else PastSlots(  # one sequence so far: it sees every slot
            torch.ones((1, self.past), dtype=torch.bool, device=dev), torch.arange(self.past, device=dev)[None])
        self.cache, before, pad = joined(self.cache, own, self.past, length, self.target.layers)
        width = self.past + before
        count = len(self.active)
        valid = torch.zeros((count + 1, width), dtype=torch.bool, device=dev)  # [A + 1, P']
        positions = torch.zeros((count + 1, width), dtype=slots.positions.dtype, device=dev)
        valid[:count, before:], positions[:count, before:] = slots.valid, slots.positions
        valid[count, pad:] = True
        positions[count, pad:] = torch.arange(length, device=dev)
        self.slots = PastSlots(valid, positions)
        self.past = width
        self.x_pos = np.append(self.x_pos, length)

    @torch.inference_mode()
    def leave(self, seq: Sequence) -> None:
        """``seq`` leaves the batch before the next step (a cancelled request; its cache row too, or its prompt's
        prefill where it is still joining)."""
        self.pending = [join for join in self.pending if join.seq is not seq]
        if seq not in self.active:
            return
        if len(self.active) == 1:
            self.active = []
        else:
            self._drop([self.active.index(seq)])
        self._recost()

    def _recost(self) -> None:
        """The budget's curve for the batch as it now is (where the context prices batch sizes apart)."""
        if self.context.cost_for is not None and self.chooser is not None and self.active:
            self.chooser.cost = self.context.cost_for(len(self.active))

    def _record(self, rows: StepRows, accepted: int, marks: list[float]) -> None:
        """One step into the call's stats; ``marks``: its start and the end of each phase (stats.PHASES)."""
        stats = self.stats
        stats.steps += 1
        stats.routes.append(self.target.last_route)
        stats.rows_per_step.append(int(rows.tokens.size))
        stats.sequences_per_step.append(int(rows.tokens.shape[0]))
        stats.accepted.append(accepted)
        device = 0.0
        for phase, start, end in zip(PHASES, marks, marks[1:]):
            stats.phase_seconds[phase] += end - start
            device += end - start if phase in DEVICE_PHASES else 0.0
        total = marks[-1] - marks[0]
        stats.step_seconds.append(total)
        stats.forward_seconds.append(device)
        stats.host_seconds.append(total - device)

    def _keep(self, kept: list[np.ndarray], filled: int) -> None:
        """Gather every sequence's kept step rows to the front of the step's slots; mask the rest. The cache
        holds ``filled`` slots (the past and the step's rows)."""
        rows, counts, in_place = kept_slots(kept)
        dev = self.target.device
        # In place, keep_rows reads only how many rows: no copy to the device is needed.
        keep_rows(self.cache, self.past, torch.from_numpy(rows) if in_place else to_device(rows, dev), in_place,
                  filled)
        if self.slots is not None:
            column = np.arange(rows.shape[1])  # [K]
            self.slots = PastSlots(
                torch.cat([self.slots.valid, to_device(column[None] < counts[:, None], dev)], dim=1),
                torch.cat([self.slots.positions, to_device(self.x_pos[:, None] + column, dev)], dim=1))
        self.past += rows.shape[1]
        self.x_pos = self.x_pos + counts  # the next x is the last token each sequence appended

    def _compact(self) -> None:
        """Drop the cache's holes (slots no sequence sees) once they are COMPACT_SHARE of it.

        Sequences accept different numbers of tokens, and every step keeps the longest one's count
        of slots for all; joins pad the shorter past. Left alone, holes grow with every step the
        batch lives (four sequences of open chat: 431 slots a step where plain decoding had 245).
        Each sequence's visible slot count is its x's position (``x_pos``), known on the host.
        """
        if self.slots is None:
            return
        longest = int(self.x_pos.max())
        holes = self.past - longest
        if holes < COMPACT_MIN_SLOTS or holes < COMPACT_SHARE * self.past:
            return
        index, self.slots = compacted(self.slots, to_device(self.x_pos, self.target.device), longest)
        compact_slots(self.cache, index)
        self.past = longest

    def _drop(self, finished: list[int]) -> None:
        """Finished sequences leave the batch (their cache rows too)."""
        if not finished:
            return
        stay = [a for a in range(len(self.active)) if a not in set(finished)]
        self.active = [self.active[a] for a in stay]
        if not stay:
            return
        keep_sequences(self.cache, stay, self.target.device)
        self.x_pos = self.x_pos[stay]
        if self.slots is not None:
            index = torch.tensor(stay, device=self.target.device)
            self.slots = PastSlots(self.slots.valid[index], self.slots.positions[index])
