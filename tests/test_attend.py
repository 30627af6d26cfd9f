"""lookahead_native::attend (native/fused.cpp) and grouped_native (model/attention.py): a step's grouped-query
attention through the C++ kernel, torch's SDPA's numbers to float32 rounding, each row's numbers the same
whatever else the step holds, SDPA itself where the kernel does not take the call."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_model
from test_attention import Heads
from lookahead.model.attention import (
    NAME,
    NATIVE_NAME,
    GroupedAttention,
    causal_mask,
    grouped_native,
    native_attention,
)
from lookahead.native.build import load_linear

LOWEST = torch.finfo(torch.float32).min


@pytest.fixture(scope="module")
def attend():
    op, why = load_linear()  # (the library the attention op comes with)
    if op is None or not native_attention():
        pytest.skip(f"lookahead's C++ op could not be built here: {why}")
    if not torch.ops.lookahead_native.tiled_available():
        pytest.skip("this CPU has no AVX2 and FMA: the attention op runs torch's SDPA")
    return torch.ops.lookahead_native.attend


def widths():
    """The lanes this CPU attends in (8; 16 too with AVX-512F: linear.cpp's tiled_widths)."""
    op, _ = load_linear()
    return [8, 16] if op is not None and 16 in torch.ops.lookahead_native.tiled_widths() else [8]


def sdpa(q, k, v, mask, scale):
    """What the op stands for: torch's SDPA with grouped heads, in the op's layout [B, Q, Hq, D]."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True).transpose(1, 2)


def case(batch, heads, kv_heads, rows, keys, width, seed=0, mask_batch=None, hidden=0.3):
    """q [B, Hq, Q, D], k, v [B, Hk, S, D], an additive mask [B or 1, 1, Q, S] hiding ~``hidden`` of the keys
    (every row sees key 0)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, rows, width, generator=g)
    k = torch.randn(batch, kv_heads, keys, width, generator=g)
    v = torch.randn(batch, kv_heads, keys, width, generator=g)
    visible = torch.rand(mask_batch or batch, 1, rows, keys, generator=g) >= hidden
    visible[..., 0] = True
    return q, k, v, torch.zeros(visible.shape).masked_fill_(~visible, LOWEST)


@pytest.mark.parametrize("batch,heads,kv_heads,rows,keys,width", [
    (1, 9, 3, 1, 1, 64), (1, 9, 3, 1, 300, 64), (1, 9, 3, 7, 300, 64), (2, 4, 2, 5, 17, 16),
    (3, 4, 4, 32, 70, 32), (1, 8, 1, 3, 9, 128), (4, 6, 3, 16, 130, 16),
    (1, 9, 3, 1, 1030, 64), (2, 4, 2, 5, 600, 32), (1, 9, 3, 12, 513, 64)])  # (keys in several chunks of 256)
def test_attend_gives_sdpa_numbers(attend, batch, heads, kv_heads, rows, keys, width):
    q, k, v, mask = case(batch, heads, kv_heads, rows, keys, width)
    for lanes in widths():
        got = attend(q, k, v, mask, width ** -0.5, lanes)
        assert got.shape == (batch, rows, heads, width) and got.is_contiguous()
        torch.testing.assert_close(got, sdpa(q, k, v, mask, width ** -0.5), rtol=2e-5, atol=2e-6)


def test_the_process_attends_in_its_tiled_kernels_width(attend):
    q, k, v, mask = case(1, 9, 3, 4, 300, 64)
    lanes = torch.ops.lookahead_native.tiled_lanes()
    assert torch.equal(attend(q, k, v, mask, 0.125), attend(q, k, v, mask, 0.125, lanes))
    with pytest.raises(RuntimeError, match="does not attend in 12 lanes"):
        attend(q, k, v, mask, 0.125, 12)


def test_one_mask_for_the_batch_and_strided_inputs(attend):
    q, k, v, mask = case(3, 4, 2, 4, 40, 16, mask_batch=1)
    wide = torch.randn(3, 2, 50, 16)  # a cache buffer: the op reads slots 0 .. 39 of it in place
    wide[:, :, :40] = k
    got = attend(q.transpose(1, 2).contiguous().transpose(1, 2), wide[:, :, :40], v, mask, 0.7)
    torch.testing.assert_close(got, sdpa(q, k, v, mask, 0.7), rtol=2e-5, atol=2e-6)


def test_worked_example(attend):
    q, k = torch.zeros(1, 1, 1, 16), torch.zeros(1, 1, 2, 16)
    v = torch.stack([torch.full((16,), 1.0), torch.full((16,), 3.0)])[None, None]
    both = attend(q, k, v, torch.zeros(1, 1, 1, 2), 0.25)
    first = attend(q, k, v, torch.tensor([[[[0.0, float("-inf")]]]]), 0.25)
    assert torch.equal(both, torch.full((1, 1, 1, 16), 2.0)) and torch.equal(first, torch.full((1, 1, 1, 16), 1.0))


def test_worked_example_hidden_key_between(attend):
    q, k = torch.zeros(1, 1, 1, 16), torch.zeros(1, 1, 3, 16)
    v = torch.stack([torch.full((16,), x) for x in (1.0, 5.0, 3.0)])[None, None]
    got = attend(q, k, v, torch.tensor([[[[0.0, float("-inf"), 0.0]]]]), 0.25)
    assert torch.equal(got, torch.full((1, 1, 1, 16), 2.0))


@pytest.mark.parametrize("keys", [40, 300, 700])
def test_hidden_keys_between_visible_ones_take_no_place(attend, keys):
    """A row over keys with hidden ones among them (a tree row's siblings, a batch's padding) gives the bits
    of the same row over its visible keys alone, packed together: the plain loop's row at that position.
    Random patterns, the visible ones crossing chunk ends (KEY_CHUNK 256), both widths, one thread or two."""
    threads = torch.get_num_threads()
    try:
        for seed in range(6):
            q, k, v, mask = case(1, 6, 2, 3, keys, 64, seed=seed, hidden=0.1 + 0.15 * (seed % 3))
            mask[0, 0, 2, :keys // 3] = float("-inf")  # row 2: a padded sequence's hidden start
            for lanes in widths():
                for count in (1, 2):
                    torch.set_num_threads(count)
                    full = attend(q, k, v, mask, 0.125, lanes)
                    for t in range(3):
                        seen = (mask[0, 0, t] > LOWEST).nonzero().flatten()
                        packed = attend(q[:, :, t:t + 1], k[:, :, seen], v[:, :, seen],
                                        torch.zeros(1, 1, 1, len(seen)), 0.125, lanes)
                        assert torch.equal(full[:, t], packed[:, 0]), (seed, lanes, count, t)
    finally:
        torch.set_num_threads(threads)


def test_a_row_that_sees_nothing_gives_zeros_as_sdpa_does(attend):
    q, k, v, mask = case(1, 4, 2, 3, 10, 16)
    mask[0, 0, 1] = float("-inf")
    got = attend(q, k, v, mask, 0.25)
    assert torch.equal(got[0, 1], torch.zeros(4, 16))
    torch.testing.assert_close(got, sdpa(q, k, v, mask, 0.25), rtol=2e-5, atol=2e-6)


def test_a_rows_numbers_do_not_depend_on_the_others(attend):
    """Row t of a step gives the same bits alone, among other rows, in another batch, and with more keys
    hidden after it (the tree's rows, a batch's padding): what keeps tree sizes from changing greedy text."""
    q, k, v, mask = case(2, 9, 3, 12, 200, 64, hidden=0.2)
    full = attend(q, k, v, mask, 0.125)  # [B, Q, Hq, D]
    for t in (0, 5, 11):
        alone = attend(q[:, :, t:t + 1], k, v, mask[:, :, t:t + 1], 0.125)
        assert torch.equal(alone[:, 0], full[:, t])
        more = torch.cat([k, torch.randn(2, 3, 9, 64)], dim=2), torch.cat([v, torch.randn(2, 3, 9, 64)], dim=2)
        padded = torch.cat([mask[:, :, t:t + 1], torch.full((2, 1, 1, 9), LOWEST)], dim=3)
        assert torch.equal(attend(q[:, :, t:t + 1], *more, padded, 0.125)[:, 0], full[:, t])
    assert torch.equal(attend(q[1:], k[1:], v[1:], mask[1:], 0.125), full[1:])


def test_a_rows_numbers_do_not_depend_on_the_others_over_several_chunks(attend):
    """As above with the keys split into chunks (KEY_CHUNK, 256): a row alone or among others, with hidden keys
    appended across a chunk's end, and on one thread or two, gives the same bits. (498 keys: the last chunk
    ends two keys into a group of four, which the hidden keys then fill.)"""
    q, k, v, mask = case(1, 9, 3, 6, 498, 64, hidden=0.2)
    threads = torch.get_num_threads()
    for lanes in widths():
        full = attend(q, k, v, mask, 0.125, lanes)
        torch.testing.assert_close(full, sdpa(q, k, v, mask, 0.125), rtol=2e-5, atol=2e-6)
        try:
            for count in (1, 2):
                torch.set_num_threads(count)
                assert torch.equal(attend(q, k, v, mask, 0.125, lanes), full)
                for t in (0, 5):
                    alone = attend(q[:, :, t:t + 1], k, v, mask[:, :, t:t + 1], 0.125, lanes)
                    assert torch.equal(alone[:, 0], full[:, t])
                    more = (torch.cat([k, torch.randn(1, 3, 30, 64)], dim=2),
                            torch.cat([v, torch.randn(1, 3, 30, 64)], dim=2))
                    padded = torch.cat([mask[:, :, t:t + 1], torch.full((1, 1, 1, 30), LOWEST)], dim=3)  # 528 keys:
                    # a chunk more
                    assert torch.equal(attend(q[:, :, t:t + 1], *more, padded, 0.125, lanes)[:, 0], full[:, t])
        finally:
            torch.set_num_threads(threads)


def test_a_chunk_whose_keys_are_all_hidden_adds_nothing(attend):
    q, k, v, mask = case(1, 4, 2, 3, 700, 16)
    mask[..., 256:512] = float("-inf")  # the second chunk hidden from every row
    mask[0, 0, 1, 1:] = float("-inf")  # row 1 sees key 0 alone
    mask[0, 0, 2] = float("-inf")  # row 2 sees nothing
    for lanes in widths():
        got = attend(q, k, v, mask, 0.25, lanes)
        torch.testing.assert_close(got, sdpa(q, k, v, mask, 0.25), rtol=2e-5, atol=2e-6)
        assert torch.equal(got[0, 1], v[0, :, 0].repeat_interleave(2, dim=0))  # (heads 0 1 read kv head 0, 2 3 head 1)
        assert torch.equal(got[0, 2], torch.zeros(4, 16))


@pytest.mark.parametrize("shape", ["width", "dtype"])
def test_what_the_kernel_does_not_take_runs_sdpa(attend, shape):
    rows, width = (2, 8) if shape == "width" else (2, 16)
    q, k, v, mask = case(1, 4, 2, rows, 20, width)
    if shape == "dtype":
        q, k, v, mask = q.double(), k.double(), v.double(), mask.double()
    assert torch.equal(attend(q, k, v, mask, 0.3), sdpa(q, k, v, mask, 0.3).contiguous())


def test_grouped_native_calls_the_op_where_it_applies(attend, monkeypatch):
    import lookahead.model.attention as attention

    q, k, v, mask = case(1, 4, 2, 3, 12, 16)
    got, _ = grouped_native(Heads(2), q, k, v, mask, scaling=0.25, position_ids=None)
    assert torch.equal(got, attend(q, k, v, mask, 0.25))
    # no mask: transformers' causal rows, written out and attended through the op (what a masked step does)
    causal, _ = grouped_native(Heads(2), q, k, v, None, scaling=0.25)
    assert torch.equal(causal, attend(q, k, v, causal_mask(3, 12, torch.float32), 0.25))
    one, _ = grouped_native(Heads(2), q[:, :, 2:], k, v, None, scaling=0.25)  # one row: every key
    assert torch.equal(one[:, 0], causal[:, 2])
    seen = []
    monkeypatch.setattr(attention, "grouped_sdpa", lambda *a, **kw: seen.append(kw) or ("sdpa", None))
    assert grouped_native(Heads(2), q, k, v, None, is_causal=False)[0] == "sdpa"  # (not causal: not written out)
    assert grouped_native(Heads(2), q, k, v, mask, dropout=0.1)[0] == "sdpa"
    assert grouped_native(Heads(2), q, k, v, mask, softcap=30.0)[0] == "sdpa"
    assert grouped_native(Heads(2), q.double(), k.double(), v.double(), mask.double())[0] == "sdpa"
    assert len(seen) == 4


def test_a_boolean_mask_attends_through_the_op_as_its_additive_form(attend):
    q, k, v, mask = case(2, 4, 2, 3, 12, 16)
    seen = mask > LOWEST  # transformers' form: True where a key is seen
    got, _ = grouped_native(Heads(2), q, k, v, seen, scaling=0.25)
    assert torch.equal(got, attend(q, k, v, mask, 0.25))


def test_causal_mask_worked_example():
    low = torch.finfo(torch.float32).min
    assert torch.equal(causal_mask(2, 3, torch.float32), torch.tensor([[[[0.0, 0.0, low], [0.0, 0.0, 0.0]]]]))


def test_switched_to_the_native_attention_only_where_asked(attend):
    model = tiny_model("llama")
    with GroupedAttention(model, native=True).switched():
        assert model.config._attn_implementation == NATIVE_NAME
    with GroupedAttention(model, native=False).switched():
        assert model.config._attn_implementation == NAME
    assert model.config._attn_implementation == "sdpa"


def test_a_long_prompts_prefill_attends_here_with_each_rows_own_bits(attend):
    """A prefill of more rows than any decode step (a 300-token prompt in one forward, as model.generate runs
    it) attends in the op, each row with the bits it gets in a forward of one row or of a chunk of the prompt:
    a prompt's cache is the same however its prefill is cut (lookahead's loop, model.generate), which integer
    products need (they turn a last-bit difference into another 8-bit input)."""
    rows = 300
    q, k, v, _ = case(1, 9, 3, rows, rows, 64)
    mask = causal_mask(rows, rows, torch.float32)
    full = grouped_native(Heads(3), q, k, v, mask, scaling=0.125)[0]  # [B, Q, Hq, D]
    torch.testing.assert_close(full, sdpa(q, k, v, mask, 0.125), rtol=2e-5, atol=2e-6)
    for start, stop in ((0, 1), (0, 130), (130, 200), (299, 300)):
        keys = stop  # (the rows' own prefix of the cache)
        part = attend(q[:, :, start:stop], k[:, :, :keys], v[:, :, :keys], mask[:, :, start:stop, :keys], 0.125)
        assert torch.equal(part, full[:, start:stop]), (start, stop)
