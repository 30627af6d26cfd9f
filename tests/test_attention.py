"""Grouped-query attention under a custom mask (model/attention.py): the same numbers as transformers'
SDPA path, switched in for the forward only, and only where it applies."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from conftest import tiny_model
from lookahead.model.attention import NAME, GroupedAttention, applies, grouped_sdpa


class Heads(torch.nn.Module):
    """What the attention functions read of an attention module."""

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


@pytest.mark.parametrize("rows,past", [(1, 0), (5, 7), (16, 40)])
def test_grouped_sdpa_equals_transformers_sdpa_under_a_tree_mask(rows, past):
    torch.manual_seed(rows)
    query = torch.randn(2, 6, rows, 8)  # [B, Hq, Q, D]
    key, value = torch.randn(2, 3, past + rows, 8), torch.randn(2, 3, past + rows, 8)  # [B, Hkv, P+Q, D]
    visible = torch.rand(2, 1, rows, past + rows) < 0.6  # any pattern, every row sees itself
    visible[..., torch.arange(rows), past + torch.arange(rows)] = True
    mask = torch.zeros(visible.shape).masked_fill_(~visible, torch.finfo(torch.float32).min)
    module = Heads(groups=2)
    got, _ = grouped_sdpa(module, query, key, value, mask, scaling=0.3, use_cache=True, position_ids=None)
    want, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    assert got.shape == want.shape == (2, rows, 6, 8)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_calls_it_does_not_cover_go_to_transformers_unchanged(monkeypatch):
    import lookahead.model.attention as attention

    seen = []
    monkeypatch.setattr(attention, "sdpa_attention_forward", lambda *a, **k: seen.append(k) or ("theirs", None))
    query, key = torch.randn(1, 4, 2, 8), torch.randn(1, 2, 2, 8)
    mask = torch.zeros(1, 1, 2, 2)
    assert grouped_sdpa(Heads(2), query, key, key, None)[0] == "theirs"  # no mask: their own GQA path
    assert grouped_sdpa(Heads(1), query, key, key, mask)[0] == "theirs"  # no grouped heads
    assert grouped_sdpa(Heads(2), query, key, key, mask, softcap=30.0)[0] == "theirs"  # a softcap
    assert grouped_sdpa(Heads(2), query, key, key, mask, dropout=0.1)[0] == "theirs"
    assert grouped_sdpa(Heads(2), query, key, key, mask.bool())[0] == "theirs"
    assert len(seen) == 5
    assert grouped_sdpa(Heads(2), query, key, key, mask)[0].shape == (1, 2, 4, 8)  # covered: its own


def test_switched_for_the_forward_only_and_only_where_it_applies():
    model = tiny_model("llama")  # 4 query heads over 2 key/value heads, SDPA
    assert applies(model)
    grouped = GroupedAttention(model)
    with grouped.switched():
        assert model.config._attn_implementation == NAME
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError):
        with grouped.switched():
            raise RuntimeError("a forward that fails")
    assert model.config._attn_implementation == "sdpa"
    eager = tiny_model("llama", attn="eager")
    assert not applies(eager)
    with GroupedAttention(eager).switched():
        assert eager.config._attn_implementation == "eager"  # the user's choice stands
    assert not applies(tiny_model("gpt2"))  # one key/value head per query head
