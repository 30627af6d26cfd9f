"""keep_rows on a transformers DynamicCache, on its own."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from lookahead.model.cache import keep_rows


def filled(past: int, rows: int, layers: int = 2) -> DynamicCache:
    """A cache whose row r holds the value r in every key/value entry."""
    cache = DynamicCache()
    total = past + rows
    for layer in range(layers):
        ramp = torch.arange(total, dtype=torch.float32).view(1, 1, total, 1).expand(1, 2, total, 3).clone()
        cache.update(ramp, ramp + 1000, layer)
    return cache


def row_values(cache: DynamicCache, layer: int = 0) -> list[float]:
    return cache.layers[layer].keys[0, 0, :, 0].tolist()


def test_keep_non_contiguous_rows():
    cache = filled(past=4, rows=6)
    keep_rows(cache, 4, torch.tensor([[0, 2, 5]]), in_place=False)
    assert cache.get_seq_length() == 7
    for layer in range(2):
        assert row_values(cache, layer) == [0, 1, 2, 3, 4, 6, 9]
        assert cache.layers[layer].values[0, 1, :, 2].tolist() == [1000, 1001, 1002, 1003, 1004, 1006, 1009]


def test_keep_only_x_crops():
    cache = filled(past=3, rows=5)
    keep_rows(cache, 3, torch.tensor([[0]]), in_place=True)
    assert row_values(cache) == [0, 1, 2, 3]


def test_cache_does_not_grow_across_steps():
    cache = filled(past=2, rows=8)
    keep_rows(cache, 2, torch.tensor([[0, 3]]), in_place=False)
    for layer in range(2):  # next step: 8 more rows appended, 2 kept
        step = torch.full((1, 2, 8, 3), -1.0)
        cache.update(step, step, layer)
    keep_rows(cache, 4, torch.tensor([[0, 1]]), in_place=True)
    assert cache.get_seq_length() == 6 and cache.layers[0].keys.shape[2] == 6
