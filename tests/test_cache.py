"""keep_rows on the decode's cache (SlotCache) and on a transformers DynamicCache, on their own; the
SlotCache's in-place writes, growth and rollback against a DynamicCache fed the same rows."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from lookahead.model.cache import SLOTS_MIN, SlotCache, compact_slots, keep_rows, keep_sequences, new_cache
from lookahead.model.mask import PastSlots, compacted

KINDS = [lambda: new_cache(2), new_cache, DynamicCache]  # an arena for both layers; a buffer per layer; transformers'


@pytest.fixture(params=KINDS, ids=["arena", "slot", "dynamic"])
def kind(request):
    return request.param


def filled(past: int, rows: int, layers: int = 2, kind=new_cache) -> DynamicCache:
    """A cache whose row r holds the value r in every key/value entry."""
    cache = kind()
    total = past + rows
    for layer in range(layers):
        ramp = torch.arange(total, dtype=torch.float32).view(1, 1, total, 1).expand(1, 2, total, 3).clone()
        cache.update(ramp, ramp + 1000, layer)
    return cache


def row_values(cache: DynamicCache, layer: int = 0) -> list[float]:
    return cache.layers[layer].keys[0, 0, :, 0].tolist()


def test_keep_non_contiguous_rows(kind):
    cache = filled(past=4, rows=6, kind=kind)
    keep_rows(cache, 4, torch.tensor([[0, 2, 5]]), in_place=False)
    assert cache.get_seq_length() == 7
    for layer in range(2):
        assert row_values(cache, layer) == [0, 1, 2, 3, 4, 6, 9]
        assert cache.layers[layer].values[0, 1, :, 2].tolist() == [1000, 1001, 1002, 1003, 1004, 1006, 1009]


def test_keep_only_x_crops(kind):
    cache = filled(past=3, rows=5, kind=kind)
    keep_rows(cache, 3, torch.tensor([[0]]), in_place=True)
    assert row_values(cache) == [0, 1, 2, 3]


def test_cache_does_not_grow_across_steps(kind):
    cache = filled(past=2, rows=8, kind=kind)
    keep_rows(cache, 2, torch.tensor([[0, 3]]), in_place=False)
    for layer in range(2):  # next step: 8 more rows appended, 2 kept
        step = torch.full((1, 2, 8, 3), -1.0)
        cache.update(step, step, layer)
    keep_rows(cache, 4, torch.tensor([[0, 1]]), in_place=True)
    assert cache.get_seq_length() == 6 and cache.layers[0].keys.shape[2] == 6


def test_slot_cache_matches_a_dynamic_cache_through_growth_rollback_and_batch_selection():
    """Random steps (append Q rows, keep a prefix) past several buffer growths: the same rows."""
    torch.manual_seed(0)
    slot, dynamic = SlotCache(), DynamicCache()
    prompt = torch.randn(3, 2, SLOTS_MIN - 5, 4)  # [A, H, T, D]: the first step outgrows the first buffer
    for cache in (slot, dynamic):
        cache.update(prompt, -prompt, 0)
    for step in range(60):
        rows = int(torch.randint(1, 20, ()))
        new = torch.randn(3, 2, rows, 4)
        got = slot.update(new, -new, 0)
        want = dynamic.update(new, -new, 0)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        drop = int(torch.randint(0, rows, ()))
        slot.crop(-drop)
        dynamic.crop(-drop)
        assert slot.get_seq_length() == dynamic.get_seq_length()
    layer = slot.layers[0]
    assert layer.key_buffer.shape[2] > SLOTS_MIN and layer.key_buffer.shape[2] >= layer.length
    index = torch.tensor([2, 0])
    slot.batch_select_indices(index)
    dynamic.batch_select_indices(index)
    assert torch.equal(slot.layers[0].keys, dynamic.layers[0].keys)
    assert torch.equal(slot.layers[0].values, dynamic.layers[0].values)


@pytest.mark.parametrize("batch", [1, 3])
def test_the_arena_keeps_the_rows_a_dynamic_cache_keeps(batch):
    """Three layers in one arena (and a fourth layer of another head count beside it), random steps
    and random kept rows per sequence past several growths, then a sequence dropped: the same rows."""
    torch.manual_seed(batch)
    arena, dynamic = SlotCache(layers=3), DynamicCache()
    shapes = [(batch, 2, 4)] * 3 + [(batch, 1, 4)]  # [A, H, D] per layer: the last one does not fit

    def step(rows: int) -> None:
        for layer, (a, h, d) in enumerate(shapes):
            new = torch.randn(a, h, rows, d)
            got, want = arena.update(new, -new, layer), dynamic.update(new, -new, layer)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])

    step(SLOTS_MIN - 3)
    assert arena.arena.holds(arena.layers[:3]) and not arena.layers[3].in_arena
    for _ in range(40):
        past = arena.get_seq_length()
        rows = int(torch.randint(2, 12, ()))
        step(rows)
        keep = int(torch.randint(1, rows + 1, ()))
        kept = torch.stack([torch.cat([torch.zeros(1, dtype=torch.long), torch.randperm(rows - 1)[:keep - 1].sort()
                                       .values + 1]) for _ in range(batch)])  # [A, K]: x, then any rows
        for cache in (arena, dynamic):
            keep_rows(cache, past, kept, in_place=False)
        assert arena.get_seq_length() == dynamic.get_seq_length() == past + keep
    assert arena.arena.buffer.shape[4] > SLOTS_MIN
    if batch > 1:
        for cache in (arena, dynamic):
            cache.batch_select_indices(torch.tensor([2, 0]))
    for mine, theirs in zip(arena.layers, dynamic.layers):
        assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)


@pytest.mark.parametrize("stay", [[0, 2], [1, 2, 3], [0, 1, 2], [3]])
def test_dropped_sequences_leave_the_others_rows_and_steps_as_a_dynamic_cache_keeps_them(kind, stay):
    """Four sequences, some dropped (in the arena: rows moved down in place, no copy of the buffer),
    then more steps appended and kept: the same keys and values as a DynamicCache's selection."""
    torch.manual_seed(len(stay))
    mine, theirs = kind(), DynamicCache()
    for layer in range(2):
        prompt = torch.randn(4, 2, 7, 3)  # [A, H, T, D]
        for cache in (mine, theirs):
            cache.update(prompt, -prompt, layer)
    keep_sequences(mine, stay, torch.device("cpu"))
    theirs.batch_select_indices(torch.tensor(stay))
    for _ in range(3):
        for layer in range(2):
            new = torch.randn(len(stay), 2, 5, 3)
            for cache in (mine, theirs):
                cache.update(new, -new, layer)
        kept = torch.tensor([[0, 3]] * len(stay))
        for cache in (mine, theirs):
            keep_rows(cache, cache.get_seq_length() - 5, kept, in_place=False)
    for a, b in zip(mine.layers, theirs.layers):
        assert a.keys.shape[0] == len(stay) and torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_slot_cache_writes_in_place_and_crop_is_a_length():
    cache = SlotCache()
    first = torch.ones(1, 1, 4, 2)
    cache.update(first, first, 0)
    buffer = cache.layers[0].key_buffer
    cache.update(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2), 0)
    assert cache.layers[0].key_buffer is buffer  # no new tensor for the past: the rows were written in place
    cache.crop(-3)
    assert cache.get_seq_length() == 4 and cache.layers[0].keys.shape == (1, 1, 4, 2)
    assert cache.layers[0].key_buffer is buffer
    with pytest.raises(ValueError, match="negative"):
        cache.crop(2)


def test_buffers_grow_by_the_rule():
    from lookahead.model.cache import grown

    assert grown(100, 120) == SLOTS_MIN and grown(400, 401) == 601 and grown(400, 900) == 1350
    assert grown(0, 300) == 450  # a new buffer has room past what it holds


def test_a_joined_batch_takes_its_next_steps_without_copying_its_past():
    """A batch built by a join at exactly its past (300 slots) must not be copied again by the next
    step's rows: its buffer was made with room to spare."""
    from lookahead.model.cache import joined

    ours, theirs = filled(past=300, rows=0, kind=lambda: new_cache(2)), filled(past=200, rows=0, kind=lambda: new_cache(2))
    out, _, _ = joined(ours, theirs, 300, 200, 2)
    buffer = out.arena.buffer
    for layer in range(2):
        step = torch.zeros((2, 2, 16, 3))
        out.update(step, step, layer)
    assert out.arena.buffer is buffer and out.get_seq_length() == 316


def test_a_reset_cache_starts_again_in_its_arena():
    cache = SlotCache(layers=2)
    for layer in range(2):
        cache.update(torch.ones(1, 2, 5, 3), torch.ones(1, 2, 5, 3), layer)
    cache.reset()
    assert cache.get_seq_length() == 0
    fresh = torch.arange(6, dtype=torch.float32).view(1, 2, 1, 3)
    for layer in range(2):
        keys, values = cache.update(fresh, -fresh, layer)
        assert torch.equal(keys, fresh) and torch.equal(values, -fresh)
    assert len(cache.arena.members) == 2 and cache.arena.holds(cache.layers)  # each layer joined once


def test_compacted_moves_each_sequences_visible_slots_to_the_right_end():
    valid = torch.tensor([[1, 0, 1, 0], [0, 1, 1, 1]], dtype=torch.bool)
    positions = torch.tensor([[0, 9, 1, 9], [9, 0, 1, 2]])
    index, after = compacted(PastSlots(valid, positions), torch.tensor([2, 3]), 3)
    assert index.tolist() == [[0, 0, 2], [1, 2, 3]]
    assert after.valid.tolist() == [[False, True, True], [True, True, True]]
    assert after.positions[after.valid].tolist() == [0, 1, 0, 1, 2]


def test_compact_slots_gathers_every_layer_of_every_sequence(kind):
    """Two sequences, sequence a's slot s holding 100 a + s: each keeps its own slots, in order."""
    cache = kind()
    for layer in range(2):
        ramp = torch.arange(6, dtype=torch.float32).view(1, 1, 6, 1).expand(2, 2, 6, 3).clone()
        ramp[1] += 100
        cache.update(ramp, ramp + 1000, layer)
    compact_slots(cache, torch.tensor([[0, 2, 5], [1, 3, 4]]))
    assert cache.get_seq_length() == 3
    for layer in range(2):
        assert cache.layers[layer].keys[:, 1, :, 2].tolist() == [[0, 2, 5], [101, 103, 104]]
        assert cache.layers[layer].values[:, 0, :, 0].tolist() == [[1000, 1002, 1005], [1101, 1103, 1104]]
