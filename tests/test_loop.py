"""The step loop's pure pieces: rows of A sequences, kept slots, the one mask builder, the one KV keeper."""

from __future__ import annotations

import numpy as np
import torch

from lookahead.decode.loop import kept_slots, step_rows
from lookahead.decode.sequence import StepPlan
from lookahead.model.cache import gather_slots
from lookahead.model.mask import PastSlots, step_mask
from lookahead.core.tree import StepLayout, empty_tree
from lookahead.core.rows import RowMap


def plan(tokens, offsets, local, keep) -> StepPlan:
    layout = StepLayout(np.array(offsets), np.array(local, dtype=bool), 1)
    return StepPlan(empty_tree(), layout, np.array(tokens), np.array(keep), RowMap(1, 0, 2))


def test_step_rows_pad_the_shorter_sequence_with_rows_that_see_themselves():
    long = plan([7, 8], [0, 1], [[1, 0], [1, 1]], [0, 1])
    short = plan([9], [0], [[1]], [0])
    rows = step_rows([long, short], np.array([5, 3]))
    assert rows.tokens.tolist() == [[7, 8], [9, 9]]
    assert rows.positions.tolist() == [[5, 6], [3, 3]]
    assert rows.local.tolist() == [[[True, False], [True, True]], [[True, False], [False, True]]]
    assert rows.keep.tolist() == [0, 1]  # both sequences' kept rows lead it


def test_step_rows_of_one_sequence_are_its_plan():
    one = plan([7, 8, 4], [0, 1, 1], [[1, 0, 0], [1, 1, 0], [1, 0, 1]], [0, 2])
    rows = step_rows([one], np.array([10]))
    assert rows.tokens.tolist() == [[7, 8, 4]] and rows.positions.tolist() == [[10, 11, 11]]
    assert rows.keep.tolist() == [0, 2]


def test_kept_slots_pad_with_zero_and_tell_when_nothing_moves():
    rows, counts, in_place = kept_slots([np.array([0, 2]), np.array([0])])
    assert rows.tolist() == [[0, 2], [0, 0]] and counts.tolist() == [2, 1] and not in_place
    _, _, in_place = kept_slots([np.array([0, 1]), np.array([0])])
    assert in_place


def test_gather_slots_one_and_several_sequences():
    tensor = torch.arange(2 * 1 * 4 * 1, dtype=torch.float32).reshape(2, 1, 4, 1)  # [A, H, S, D]
    got = gather_slots(tensor, torch.tensor([[3, 1], [0, 2]]))
    assert got[:, 0, :, 0].tolist() == [[3.0, 1.0], [4.0, 6.0]]
    assert gather_slots(tensor[:1], torch.tensor([[2, 0]]))[0, 0, :, 0].tolist() == [2.0, 0.0]


def visible(mask: torch.Tensor) -> list:
    return (mask[:, 0] == 0).tolist()


def test_step_mask_of_one_sequence_sees_every_slot_and_its_local_rows():
    local = torch.tensor([[[True, False], [True, True]]])
    q_pos = torch.tensor([[5, 6]])
    full = step_mask(frozenset({"full_attention"}), None, local, q_pos, 5, None, torch.float32)
    assert full.shape == (1, 1, 2, 7) and full.min() == torch.finfo(torch.float32).min
    assert visible(full)[0] == [[True] * 6 + [False], [True] * 7]
    # a window of 3: x at position 5 sees positions 3, 4, 5; the next row at 6 sees 4, 5, 6
    slide = step_mask(frozenset({"sliding_attention"}), 3, local, q_pos, 5, None, torch.float32)
    assert visible(slide)[0] == [[False, False, False, True, True, True, False],
                                 [False, False, False, False, True, True, True]]
    both = step_mask(frozenset({"full_attention", "sliding_attention"}), 3, local, q_pos, 5, None, torch.float32)
    assert set(both) == {"full_attention", "sliding_attention"}
    assert torch.equal(both["full_attention"], full) and torch.equal(both["sliding_attention"], slide)


def test_step_mask_of_a_batch_hides_holes_and_uses_each_slots_position():
    slots = PastSlots(torch.tensor([[False, True, True], [True, False, True]]),  # row 0 left-padded, row 1 a hole
                      torch.tensor([[0, 0, 1], [0, 1, 1]]))
    local = torch.tensor([[[True]], [[True]]])
    q_pos = torch.tensor([[2], [2]])
    full = step_mask(frozenset({"full_attention"}), None, local, q_pos, 3, slots, torch.float32)
    assert visible(full) == [[[False, True, True, True]], [[True, False, True, True]]]
    slide = step_mask(frozenset({"sliding_attention"}), 2, local, q_pos, 3, slots, torch.float32)
    assert visible(slide) == [[[False, False, True, True]], [[False, False, True, True]]]


def test_the_loop_the_sequences_and_the_sources_never_receive_the_generator(monkeypatch):
    """They read a DecodeContext: no argument (nor a field of one) is the LookaheadGenerator, in a
    batch of two with a draft-free config that turns every source on."""
    import dataclasses

    from conftest import tiny_model
    from lookahead import LookaheadConfig, LookaheadGenerator
    from lookahead.decode import loop, sequence, sources

    seen: list[object] = []

    def recording(cls, name):
        original = getattr(cls, name)

        def wrapper(self, *args, **kwargs):
            seen.extend(args)
            seen.extend(kwargs.values())
            return original(self, *args, **kwargs)
        monkeypatch.setattr(cls, name, wrapper)

    recording(loop.DecodeRun, "__init__")
    recording(sequence.Sequence, "__init__")
    recording(sources.SourceFactory, "build")
    model = tiny_model("llama")
    model.generation_config.pad_token_id = 0
    gen = LookaheadGenerator(model, config=LookaheadConfig(window=2, ngram=3, memory_tokens=64))
    gen.generate(torch.tensor([[5, 6, 7, 5, 6], [0, 9, 8, 9, 8]]), attention_mask=torch.tensor(
        [[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]]), max_new_tokens=6)
    assert len(seen) > 10, "the wrappers saw nothing: the test checks nothing"
    reached = list(seen)
    for value in seen:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            reached.extend(getattr(value, f.name) for f in dataclasses.fields(value))
    assert not any(isinstance(value, LookaheadGenerator) for value in reached)
    assert any(type(value).__name__ == "DecodeContext" for value in reached)


def test_a_greedy_batch_staged_at_once_gives_each_sequence_what_its_own_stage_gives():
    """stage_batch + stage_from_batch against Verifier.stage, for sequences of different windows and trees
    (their kept rows are prefixes of the batch's K), with and without token recycling."""
    from lookahead.call.decoding import resolve_decoding
    from lookahead.core.tree import TokenTree
    from lookahead.verify.verifier import Verifier, stage_batch
    from conftest import tiny_model

    decoding = resolve_decoding(tiny_model("llama"), 4, torch.device("cpu"), max_new_tokens=8, do_sample=False)
    seq = np.array([3, 4, 5, 6, 0, 0, 0, 0], dtype=np.int64)
    trees = [TokenTree(np.array([7, 8, 9]), np.array([-1, 0, -1]), np.array([1, 2, 1]), np.zeros(3, dtype=np.int64)),
             TokenTree(np.array([5]), np.array([-1]), np.array([1]), np.zeros(1, dtype=np.int64)),
             empty_tree()]
    maps = [RowMap(3, 2, 2), RowMap(1, 0, 2), RowMap(4, 3, 3)]  # lead rows (window), then the tree's
    kept = [m.lead + t.size for m, t in zip(maps, trees)]
    logits = torch.randn(3, max(kept), 50)  # [A, K, V]
    for width in (None, 4):
        verifiers = [Verifier(decoding, width, 4) for _ in trees]
        assert all(v.plain_greedy for v in verifiers)
        argmax, top = stage_batch(logits, width)
        for a, (v, m, t, k) in enumerate(zip(verifiers, maps, trees, kept)):
            own = v.stage(logits[a, :k], m, t, seq, 4).numpy()
            assert own.shape[0] == v.staged_size(m, t, k)
            shared = v.stage_from_batch(argmax[a], top[a] if top is not None else None, m, t, k)
            assert np.array_equal(own, shared)
    # a step that proposed nothing (a paused batch) stages no successors, with recycling too: the same chosen
    # tokens and window argmax, no top-R
    verifiers = [Verifier(decoding, 4, 4) for _ in trees]
    argmax, top = stage_batch(logits, None)
    for a, (v, m, t, k) in enumerate(zip(verifiers, maps, trees, kept)):
        bare = v.stage(logits[a, :k], m, t, seq, 4, recycle=False).numpy()
        assert bare.shape[0] == v.staged_size(m, t, k, recycle=False) == v.staged_size(m, t, k) - k * 2 * 4
        assert np.array_equal(bare, v.stage_from_batch(argmax[a], None, m, t, k))
        full = v.stage(logits[a, :k], m, t, seq, 4).numpy()
        plain, staged = v.finish(bare, m, t, k, recycle=False), v.finish(full, m, t, k)
        assert plain.top is None and staged.top is not None
        assert np.array_equal(plain.new, staged.new) and np.array_equal(plain.window_next, staged.window_next)


def test_kept_slots_of_one_sequence_tell_in_place_by_its_last_row():
    rows, counts, in_place = kept_slots([np.array([0, 1, 2])])
    assert rows.tolist() == [[0, 1, 2]] and counts.tolist() == [3] and in_place
    rows, counts, in_place = kept_slots([np.array([0, 2, 5])])  # a tree path past a skipped sibling
    assert rows.tolist() == [[0, 2, 5]] and counts.tolist() == [3] and not in_place
    assert kept_slots([np.array([0])])[2]  # x alone stays where it is


def test_a_step_through_a_route_being_tried_refines_neither_the_curve_nor_the_check(monkeypatch):
    """The loop leaves a tried route's step out of the budget's learning (decode/loop.py, 6. learn)."""
    from conftest import tiny_model
    from lookahead import LookaheadConfig, LookaheadGenerator
    from lookahead.cost.curve import CostModel
    from lookahead.plan.choice import StepChooser

    gen = LookaheadGenerator(tiny_model("llama"), config=LookaheadConfig(traced_forward=False))
    observed, outcomes = [], []
    real_route = type(gen.target).route

    def route(self, batch, rows):
        picked = real_route(self, batch, rows)
        self.trying = len(outcomes) % 2 == 1  # every other step "tries" a route
        return picked

    real_observe, real_record_outcome = CostModel.observe, StepChooser.record_outcome
    monkeypatch.setattr(type(gen.target), "route", route)
    monkeypatch.setattr(CostModel, "observe", lambda self, q, s: (observed.append(len(outcomes)), real_observe(self, q, s)))
    monkeypatch.setattr(StepChooser, "record_outcome", lambda self, t, s: (outcomes.append(s), real_record_outcome(self, t, s)))
    gen.generate(torch.tensor([[5, 9, 13, 17] * 3]), max_new_tokens=12)
    assert gen.cost is not None and len(outcomes) == gen.last_stats.steps >= 6
    assert [s is None for s in outcomes] == [i % 2 == 1 for i in range(len(outcomes))]
    assert observed == [i for i in range(len(outcomes)) if i % 2 == 0]
