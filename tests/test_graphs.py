"""One sequence's step as a CUDA graph (lookahead/model/graphs.py).

On the CPU the graphed step's static forward (rows padded to a bucket, inputs in one buffer, the mask
built from them, attention over the whole buffer, keys written by index) runs without a capture, and
must give exactly what the eager step gives: greedy output equal to model.generate. With
``--device cuda`` the same tests capture and replay real graphs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import RUN_ON, VOCAB, record_compile_seconds, reference, tiny_model
from lookahead.model.switches import ForwardSwitches
from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.errors import ConfigError
from lookahead.model.cache import arena_of
from lookahead.model.graphs import BUCKETS, StepGraphs, bucket, graph_capacity, packed_inputs, static_mask
from lookahead.model.mask import step_mask

NEW = 40
# Full-attention architectures of different kinds: grouped heads (llama, qwen3), learned positions (gpt2),
# a parallel block (gpt_neox).
ARCHS = ("llama", "qwen3", "gpt2", "gpt_neox")


def test_bucket_is_the_least_that_holds():
    assert [bucket(r) for r in (1, 2, 3, 5, 8, 9, 128)] == [1, 2, 4, 8, 8, 16, 128]
    assert bucket(BUCKETS[-1] + 1) is None


def test_graph_capacity_starts_large_and_doubles():
    assert [graph_capacity(0, 300), graph_capacity(1024, 1024), graph_capacity(1024, 1100),
            graph_capacity(3000, 5000)] == [1024, 1024, 2048, 6000]


def test_packed_inputs_worked_example():
    out = packed_inputs(np.array([[7, 8]]), np.array([[5, 6]]), np.array([[[1, 0], [1, 1]]], dtype=bool),
                        np.array([0, 1]), 5, 4)
    expected = [7, 8, 7, 7, 5, 6, 5, 5, 0, 1, 0, 0, 5] + [1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1]
    assert out.tolist() == expected


@pytest.mark.parametrize("past, rows, capacity", [(0, 1, 4), (2, 2, 5), (7, 4, 16), (3, 8, 11)])
def test_static_mask_is_the_step_mask_then_hidden(past, rows, capacity):
    rng = np.random.default_rng(past * 31 + rows)
    local = np.tril(rng.random((rows, rows)) < 0.6)
    np.fill_diagonal(local, True)
    ours = static_mask(torch.from_numpy(local), torch.tensor(past), capacity, torch.float32)  # [1, 1, Qb, C]
    eager = step_mask(frozenset({"full_attention"}), None, torch.from_numpy(local)[None],
                      torch.arange(past, past + rows)[None], past, None, torch.float32)  # [1, 1, Qb, P+Qb]
    assert ours.shape == (1, 1, rows, capacity)
    assert torch.equal(ours[..., :past + rows], eager)
    assert bool((ours[..., past + rows:] == torch.finfo(torch.float32).min).all())


def graphed(arch: str, config: LookaheadConfig | None = None) -> LookaheadGenerator:
    """A generator whose target runs one sequence's steps through StepGraphs (captured on CUDA; on the CPU
    the same static forward without a capture)."""
    gen = LookaheadGenerator(tiny_model(arch), config=config or LookaheadConfig())
    cpu_graphs(gen.target)
    assert gen.target.graphs is not None, "a CUDA run with default config takes graphs"
    return gen


def cpu_graphs(target) -> None:
    """On the CPU, give ``target`` the graphs' static forward without a capture (CUDA takes real graphs)."""
    if RUN_ON["device"] == "cpu":
        target.graphs = StepGraphs(target.model, target.cache_keyword, target.attention, target.dtype, capture=False,
                                   positions=target.positions)


def slow_captures(monkeypatch) -> None:
    """Making a bucket's graph sleeps a second more than a tiny model's step takes."""
    import time as clock

    made = StepGraphs._new_graph

    def slow(self, rows, packed, buffer):
        clock.sleep(1.0)
        return made(self, rows, packed, buffer)

    monkeypatch.setattr(StepGraphs, "_new_graph", slow)


def prompt(seed: int, length: int = 14) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    motif = torch.randint(1, VOCAB, (5,), generator=gen)
    return torch.cat([torch.randint(1, VOCAB, (length - 10,), generator=gen), motif, motif])[None]


@pytest.mark.parametrize("arch", ARCHS)
def test_graphed_steps_match_generate(arch):
    gen = graphed(arch)
    model = gen.model
    graph_steps = spoken = 0
    for seed in range(3):
        ids = prompt(seed).to(RUN_ON["device"])
        out = gen.generate(ids, max_new_tokens=NEW, eos_token_id=[VOCAB + 1000])
        assert torch.equal(out.cpu(), reference(model, ids, NEW, eos_token_id=[VOCAB + 1000]).cpu()), \
            f"{arch}: graphed steps diverge from model.generate (prompt {seed})"
        stats = gen.last_stats
        graph_steps += stats.routes.count("graph")
        spoken += sum(a > 1 for a in stats.accepted)
    assert graph_steps > 0, "no step ran through the graphs: the test would be vacuous"
    assert spoken > 0, "nothing speculated was accepted: the test would be vacuous"
    assert gen.target.graphs is not None and not gen.target.graphs.failure


def test_many_rows_and_fixed_trees_stay_exact():
    """Steps of several buckets (fixed budget, large trees), the same graphs reused by a second call."""
    config = LookaheadConfig(window=6, ngram=4, candidates=12, max_tree_nodes=40, budget="fixed")
    gen = graphed("llama", config)
    ids = prompt(5, 24).to(RUN_ON["device"])
    ref = reference(gen.model, ids, NEW, eos_token_id=[VOCAB + 1000]).cpu()
    first = gen.generate(ids, max_new_tokens=NEW, eos_token_id=[VOCAB + 1000])
    graphs = gen.target.graphs
    assert graphs is not None
    captured = dict(graphs.graphs)
    assert len({bucket(r) for r in gen.last_stats.rows_per_step}) > 1
    second = gen.generate(ids, max_new_tokens=NEW, eos_token_id=[VOCAB + 1000])
    assert torch.equal(first.cpu(), ref) and torch.equal(second.cpu(), ref)
    assert all(graphs.graphs.get(rows) is graph for rows, graph in captured.items()), "a second call recaptured"


def test_eos_and_max_new_tokens_mid_step():
    gen = graphed("qwen3")
    ids = prompt(2).to(RUN_ON["device"])
    ref = reference(gen.model, ids, NEW, eos_token_id=[VOCAB + 1000]).cpu()
    eos = int(ref[0, ids.shape[1] + 9])  # a token the output reaches on its tenth new token
    expected = reference(gen.model, ids, NEW, eos_token_id=[eos]).cpu()
    assert torch.equal(gen.generate(ids, max_new_tokens=NEW, eos_token_id=[eos]).cpu(), expected)
    for new in (1, 2, 7):
        out = gen.generate(ids, max_new_tokens=new, eos_token_id=[VOCAB + 1000]).cpu()
        assert torch.equal(out, ref[:, :ids.shape[1] + new])


def test_a_step_past_the_largest_bucket_runs_eagerly():
    gen = graphed("llama")
    target = gen.target
    cache = target.new_cache()
    ids = prompt(3).numpy()
    target.prefill(cache, ids[:, :-1])
    rows = BUCKETS[-1] + 1
    tokens = np.full((1, rows), ids[0, -1])
    positions = np.arange(ids.shape[1] - 1, ids.shape[1] - 1 + rows)[None]
    local = np.tril(np.ones((1, rows, rows), dtype=bool))
    with torch.inference_mode():
        logits = target.step(cache, tokens, positions, local, np.arange(2), ids.shape[1] - 1)
    assert logits.shape == (1, 2, VOCAB)
    assert target.last_route != "graph"
    assert cache.get_seq_length() == ids.shape[1] - 1 + rows


def test_a_second_live_cache_keeps_its_own_copy():
    """The graphs' buffer moves to a new decode's cache; a cache that held it before and is still alive
    keeps what it held (a copy), not what the new decode writes."""
    gen = graphed("llama")
    target = gen.target
    ids = prompt(4).numpy()
    caches = [target.new_cache(), target.new_cache()]
    one = np.tril(np.ones((1, 1, 1), dtype=bool))
    with torch.inference_mode():
        for cache in caches:
            target.prefill(cache, ids[:, :-1])
        target.step(caches[0], ids[:, -1:], np.array([[ids.shape[1] - 1]]), one, np.arange(1), ids.shape[1] - 1)
        first = arena_of(caches[0])
        assert first is not None and target.graphs is not None and first.buffer is target.graphs.buffer
        before = first.buffer[:, :, :, :, :ids.shape[1]].clone()
        other = ids[:, -1:] % (VOCAB - 1) + 1  # another token
        target.step(caches[1], other, np.array([[ids.shape[1] - 1]]), one, np.arange(1), ids.shape[1] - 1)
    second = arena_of(caches[1])
    assert second is not None and second.buffer is target.graphs.buffer and first.buffer is not second.buffer
    assert torch.equal(first.buffer[:, :, :, :, :ids.shape[1]], before)


def test_cuda_graphs_is_checked_and_off_on_the_cpu():
    with pytest.raises(ConfigError, match="cuda_graphs must be True or False"):
        LookaheadConfig(cuda_graphs="yes")  # type: ignore[arg-type]
    gen = LookaheadGenerator(tiny_model("llama").to("cpu"), config=LookaheadConfig())
    assert gen.target.graphs is None  # graphs are for CUDA devices only



def test_capturing_a_graph_is_not_taken_for_the_steps_cost(monkeypatch):
    """The seconds a step spends making its bucket's graph (on CUDA a capture and its warm-up forwards) are
    told apart (Target.compile_seconds), and the cost curve learns from the rest: a slow capture never makes a row
    count look dear (on an H100 it had priced a one-row step at 6x a 24-row one, which then ran every
    step). (Making a graph here sleeps a second more than a tiny model's step takes.)"""
    gen = graphed("llama", LookaheadConfig(window=4, ngram=3, candidates=8, max_tree_nodes=20, budget="fixed"))
    graphs = gen.target.graphs
    assert graphs is not None
    slow_captures(monkeypatch)
    compiles, observed = record_compile_seconds(monkeypatch, gen)
    ids = prompt(3).to(RUN_ON["device"])
    assert torch.equal(gen.generate(ids, max_new_tokens=20, eos_token_id=[VOCAB + 1000]).cpu(),
                       reference(gen.model, ids, 20, eos_token_id=[VOCAB + 1000]).cpu())
    assert len(observed) == len(compiles) and gen.last_stats.routes.count("graph") == len(compiles)
    making = [i for i, s in enumerate(compiles) if s >= 1.0]
    assert making and len(making) == len(graphs.graphs), (compiles, sorted(graphs.graphs))
    assert all(observed[i] < 1.0 for i in making), (observed, compiles)
    assert all(s < 1.0 for i, s in enumerate(compiles) if i not in making)  # replays: nothing compiled


def test_the_cost_measurement_times_a_step_again_after_capturing_its_graph(monkeypatch):
    """A measured step that captured its bucket's graph (or made a trace) is timed again: the curve holds
    what replays cost, not a capture's (on an H100 one pass had timed 16 rows at 36x 92 rows)."""
    from lookahead.cost.measure import decode_step_timer
    from lookahead.model.support import attention_layout

    model = tiny_model("llama")
    timer = decode_step_timer(model, attention_layout(model), context=20, switches=ForwardSwitches(graphs=True))  # (CUDA: captured)
    cpu_graphs(timer.target)
    graphs = timer.target.graphs
    assert graphs is not None
    slow_captures(monkeypatch)
    for q in (1, 3, 8):
        before = set(graphs.graphs)
        took = timer(q)
        assert bucket(q) in set(graphs.graphs) - before, "the step made no graph: the test would be vacuous"
        assert took < 1.0, f"{q} rows timed with the capture: {took:.2f} s"
        assert timer.target.last_route == "graph" and timer.target.compile_seconds == 0.0
