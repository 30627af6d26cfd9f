"""A step's forward replayed from a checked TorchScript trace (lookahead/model/traced.py).

A trace runs the eager forward's ops in the same order, so a decode through traces must give
model.generate's greedy output, with traces made for several step kinds and reused across
step lengths and pasts; a trace that disagrees with the eager forward is never used.
"""

from __future__ import annotations

import pytest
import torch

from conftest import VOCAB, reference, tiny_model
from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.model import traced
from lookahead.model.traced import row_class, shortened

NEW = 40
ARCHS = ("llama", "qwen3", "gpt2", "gpt_neox")
NO_EOS = [VOCAB + 1000]


def prompt(seed: int, length: int = 14) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    motif = torch.randint(1, VOCAB, (5,), generator=gen)
    return torch.cat([torch.randint(1, VOCAB, (length - 10,), generator=gen), motif, motif])[None]


def traced_generator(arch: str, config: LookaheadConfig | None = None) -> LookaheadGenerator:
    """A generator tracing every step kind on its first step (not once its eager steps paid for a trace)."""
    gen = LookaheadGenerator(tiny_model(arch), config=config or LookaheadConfig(traced_forward=True))
    assert gen.target.traced is not None
    gen.target.traced.patience = 0.0
    return gen


def test_row_classes_follow_the_linear_paths():
    assert [row_class(q) for q in (1, 2, 7, 8, 64, 65, 500)] == ["1", "2-7", "2-7", "8-64", "8-64", "65+", "65+"]


def test_shortened_drops_the_last_row_and_the_first_past_slot():
    tokens, positions = torch.tensor([[5, 6, 7]]), torch.tensor([[4, 5, 6]])
    keep, past, buffer = torch.tensor([0, 2]), torch.zeros(1).expand(4), torch.zeros(2, 1, 1, 1, 9, 2)
    mask = torch.arange(3 * 7, dtype=torch.float32).view(1, 1, 3, 7)
    short = shortened((tokens, positions, keep, past, buffer, mask))
    assert short is not None
    assert short[0].tolist() == [[5, 6]] and short[1].tolist() == [[4, 5]] and short[2].tolist() == [0]
    assert short[3].shape == (3,) and short[4] is buffer
    assert short[5].tolist() == [[[[1, 2, 3, 4, 5], [8, 9, 10, 11, 12]]]]
    assert shortened((tokens[:, :1], positions[:, :1], keep[:1], past, buffer)) is None  # one row, no mask


@pytest.mark.parametrize("arch", ARCHS)
def test_traced_steps_match_generate(arch):
    gen = traced_generator(arch)
    traced_steps = spoken = 0
    for seed in range(3):
        ids = prompt(seed)
        out = gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS)
        assert torch.equal(out, reference(gen.model, ids, NEW, eos_token_id=NO_EOS)), \
            f"{arch}: traced steps diverge from model.generate (prompt {seed})"
        stats = gen.last_stats
        traced_steps += sum(route.endswith("traced") for route in stats.routes)
        spoken += sum(a > 1 for a in stats.accepted)
    forwards = gen.target.traced
    assert forwards is not None and forwards.traces, f"{arch}: no trace was made ({forwards and forwards.failures})"
    assert traced_steps > 0, "no step ran through a trace: the test would be vacuous"
    assert spoken > 0, "nothing speculated was accepted: the test would be vacuous"


def test_one_trace_serves_many_step_lengths():
    config = LookaheadConfig(traced_forward=True, window=6, ngram=4, candidates=12, max_tree_nodes=40,
                             budget="fixed")
    gen = traced_generator("llama", config)
    ids = prompt(5, 24)
    out = gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS)
    assert torch.equal(out, reference(gen.model, ids, NEW, eos_token_id=NO_EOS))
    rows = {q for q, route in zip(gen.last_stats.rows_per_step, gen.last_stats.routes) if route.endswith("traced")}
    forwards = gen.target.traced
    assert forwards is not None
    assert len(rows) > len(forwards.traces), "every step length got a trace of its own"


def test_a_trace_that_disagrees_is_never_used(monkeypatch):
    monkeypatch.setattr(traced, "agrees", lambda *args: False)
    gen = traced_generator("llama")
    ids = prompt(1)
    out = gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS)
    assert torch.equal(out, reference(gen.model, ids, NEW, eos_token_id=NO_EOS))
    forwards = gen.target.traced
    assert forwards is not None and not forwards.traces and forwards.failures
    assert not any(route.endswith("traced") for route in gen.last_stats.routes)


def test_a_model_cast_after_tracing_is_traced_again():
    gen = traced_generator("llama")
    model = gen.model
    ids = prompt(2)
    gen.generate(ids, max_new_tokens=12, eos_token_id=NO_EOS)
    forwards = gen.target.traced
    assert forwards is not None and forwards.traces
    model.double()
    model.float()  # new tensors: the old traces hold the old ones
    before = dict(forwards.traces)
    out = gen.generate(ids, max_new_tokens=12, eos_token_id=NO_EOS)
    assert torch.equal(out, reference(model, ids, 12, eos_token_id=NO_EOS))
    assert all(forwards.traces.get(key) is not trace for key, trace in before.items())


def test_a_kind_is_traced_only_after_its_first_steps():
    gen = LookaheadGenerator(tiny_model("llama"), config=LookaheadConfig(traced_forward=True, candidates=0))
    forwards = gen.target.traced
    assert forwards is not None
    ids = prompt(3)
    gen.generate(ids, max_new_tokens=12, eos_token_id=NO_EOS)  # 11 one-row steps: fewer than a trace's price
    assert not forwards.traces and forwards.eager
    out = gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS)
    assert forwards.traces and "traced" in gen.last_stats.routes[-1]
    assert torch.equal(out, reference(gen.model, ids, NEW, eos_token_id=NO_EOS))


def test_off_where_asked():
    assert LookaheadGenerator(tiny_model("llama"), config=LookaheadConfig(traced_forward=False)).target.traced is None


@pytest.mark.parametrize("arch", ["llama", "gpt_neox"])
def test_a_traced_batch_gives_each_row_its_generate(arch):
    from test_batch import PROMPTS, alone, left_padded

    gen = traced_generator(arch, LookaheadConfig(traced_forward=True, window=2, ngram=3))
    ids, mask = left_padded(PROMPTS)
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=30, eos_token_id=NO_EOS)
    for i, tokens in enumerate(PROMPTS):
        assert out[i, ids.shape[1]:].tolist() == alone(gen.model, tokens), f"{arch}: row {i} differs"
    forwards = gen.target.traced
    assert forwards is not None and any(key.batch > 1 for key in forwards.traces), forwards and forwards.failures
    assert any(route.endswith("traced") for route in gen.last_stats.routes)
