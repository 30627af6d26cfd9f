"""A step's forward replayed from a checked TorchScript trace (lookahead/model/traced.py).

A trace runs the eager forward's ops in the same order, so a decode through traces must give
model.generate's greedy output, with traces made for several step kinds and reused across
step lengths and pasts; a trace that disagrees with the eager forward is never used.
"""

from __future__ import annotations

import pytest
import torch

from conftest import VOCAB, record_compile_seconds, reference, tiny_model
from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.model import traced
from lookahead.model.traced import ONEDNN_UNTRACED, TraceKey, row_class, trace_linear, varied

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


def assert_every_trace_refused(gen: LookaheadGenerator) -> None:
    """A decode through ``gen`` equals generate's, made no trace (each failure noted) and ran no step traced."""
    ids = prompt(1)
    out = gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS)
    assert torch.equal(out, reference(gen.model, ids, NEW, eos_token_id=NO_EOS))
    forwards = gen.target.traced
    assert forwards is not None and not forwards.traces and forwards.failures
    assert not any(route.endswith("traced") for route in gen.last_stats.routes)


def test_row_classes_and_linear_kinds():
    assert [row_class(q) for q in (1, 2, 7, 8, 64, 65, 500)] == ["1", "2+", "2+", "2+", "2+", "2+", "2+"]
    assert [trace_linear(r) for r in (None, "torch", "kernel", "mm", "onednn")] == ["any"] * 4 + ["onednn"]


@pytest.mark.parametrize("code", [0, 1, 2])
@pytest.mark.parametrize("rows", [1, 3, 9, 70])
def test_the_linear_op_computes_what_its_route_computes(code, rows):
    from lookahead.model.fewrows import few_row_linear, linear_op

    x, weight, bias = torch.randn(1, rows, 24), torch.randn(10, 24), torch.randn(10)
    eager = few_row_linear(x, weight, bias, kernel=code == 1) if code else None
    expected = eager if eager is not None else torch.nn.functional.linear(x, weight, bias)
    assert torch.equal(linear_op(x, weight, bias, torch.tensor(code)), expected)


def test_varied_halves_tokens_drops_the_last_row_and_the_first_past_slot():
    tokens, positions = torch.tensor([[5, 6, 7]]), torch.tensor([[4, 5, 6]])
    keep, past, buffer = torch.tensor([0, 2]), torch.zeros(1).expand(4), torch.zeros(2, 1, 1, 1, 9, 2)
    route = torch.tensor(1)
    mask = torch.arange(3 * 7, dtype=torch.float32).view(1, 1, 3, 7)
    other = varied((tokens, positions, keep, past, buffer, route, mask))
    assert other[0].tolist() == [[2, 3]] and other[1].tolist() == [[3, 4]] and other[2].tolist() == [0]
    assert other[3].shape == (3,) and other[4] is buffer and other[5] is route
    assert other[6].tolist() == [[[[1, 2, 3, 4, 5], [8, 9, 10, 11, 12]]]]
    one = varied((tokens[:, 2:], positions[:, 2:], keep[:1], past, buffer, route))  # one row, no mask
    assert one[0].tolist() == [[3]] and one[1].tolist() == [[5]] and one[3].shape == (3,) and len(one) == 6
    masked = varied((tokens[:, 2:], positions[:, 2:], keep[:1], past, buffer, route, mask[:, :, 2:, 2:]))
    assert masked[6].tolist() == [[[[17, 18, 19, 20]]]], "one masked row: the first past slot's column dropped"


def test_a_trace_that_holds_a_linear_output_is_refused(monkeypatch):
    """A kernel called from Python while tracing is recorded as its output: such a trace must be refused."""
    def untraceable(x, weight, bias, route):
        return torch.from_numpy(torch.nn.functional.linear(x, weight, bias).numpy())  # (a trace sees a constant)

    gen = traced_generator("llama")
    gen.target.traced.op = untraceable
    assert_every_trace_refused(gen)


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
    assert_every_trace_refused(traced_generator("llama"))


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


def test_the_onednn_route_is_not_traced_and_says_why():
    """torch's tracer cannot hold oneDNN's packed weights (opaque tensors) as a trace's constants."""
    from lookahead.model.fewrows import onednn_available, pack_for_onednn
    if onednn_available():
        with pytest.raises(RuntimeError, match="Unsupported value kind"):  # (what a trace of it raised)
            packed = pack_for_onednn(torch.randn(4, 8))
            torch.jit.trace(lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
                            (torch.randn(2, 8),), check_trace=False)
    forwards = traced_generator("llama").target.traced
    assert forwards is not None
    key = TraceKey("onednn", masked=True)
    assert forwards._new_trace(key, ()) is None and key not in forwards.traces
    assert forwards.failures[key] == ONEDNN_UNTRACED


def test_a_kind_is_traced_only_after_its_first_steps():
    gen = LookaheadGenerator(tiny_model("llama"), config=LookaheadConfig(traced_forward=True, candidates=0))
    forwards = gen.target.traced
    assert forwards is not None
    forwards.patience = 1.0  # (traced once its eager steps took TRACE_STEPS_GUESS mean steps)
    ids = prompt(3)
    gen.generate(ids, max_new_tokens=12, eos_token_id=NO_EOS)  # 11 one-row steps: fewer than a trace's price
    assert not forwards.traces and forwards.eager
    out = gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS)
    assert forwards.traces and "traced" in gen.last_stats.routes[-1]
    assert torch.equal(out, reference(gen.model, ids, NEW, eos_token_id=NO_EOS))


def test_a_call_that_may_run_long_traces_at_its_second_step():
    """(traced.py's ``due`` with the loop's horizon: the steps a call may still run count as if run, so a
    one-off call long enough to repay a trace does not first pay its price in eager steps)"""
    gen = LookaheadGenerator(tiny_model("llama"), config=LookaheadConfig(traced_forward=True, candidates=0))
    forwards = gen.target.traced
    assert forwards is not None and forwards.patience == traced.TRACE_PATIENCE
    ids = prompt(5)
    gen.generate(ids, max_new_tokens=12, eos_token_id=NO_EOS)  # (12 steps, a token each: 1 + 11 < 2 x 25 mean steps)
    assert not forwards.traces and sum(n for n, _ in forwards.eager.values()) == 12
    fresh = LookaheadGenerator(gen.model, config=LookaheadConfig(traced_forward=True, candidates=0))
    assert fresh.target.traced is not None
    out = fresh.generate(ids, max_new_tokens=80, eos_token_id=NO_EOS)  # (1 + 79 >= 50: traced at step 2)
    assert fresh.target.traced.traces and sum(n for n, _ in fresh.target.traced.eager.values()) == 1
    assert sum("traced" in route for route in fresh.last_stats.routes) == fresh.last_stats.steps - 1
    assert torch.equal(out, reference(gen.model, ids, 80, eos_token_id=NO_EOS))
    assert not forwards.due(TraceKey("any", masked=True), 0)  # (no horizon: the eager steps so far alone)


def test_on_by_default_off_where_asked():
    assert LookaheadGenerator(tiny_model("llama")).target.traced is not None
    assert LookaheadGenerator(tiny_model("llama"), config=LookaheadConfig(traced_forward=False)).target.traced is None


def test_a_hooked_model_runs_eagerly():
    gen = traced_generator("llama")
    calls = []
    handle = gen.model.get_input_embeddings().register_forward_pre_hook(lambda *args: calls.append(1))
    try:
        ids = prompt(4)
        out = gen.generate(ids, max_new_tokens=20, eos_token_id=NO_EOS)
    finally:
        handle.remove()
    assert torch.equal(out, reference(gen.model, ids, 20, eos_token_id=NO_EOS))
    assert not any(route.endswith("traced") for route in gen.last_stats.routes)
    assert len(calls) == gen.last_stats.steps + 1, "the hook missed a step"


@pytest.mark.parametrize("arch", ["llama", "gpt_neox"])
def test_a_traced_batch_gives_each_row_its_generate(arch):
    from test_batch import PROMPTS, alone, left_padded

    gen = traced_generator(arch, LookaheadConfig(traced_forward=True, window=2, ngram=3))
    ids, mask = left_padded(PROMPTS)
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=30, eos_token_id=NO_EOS)
    for i, tokens in enumerate(PROMPTS):
        assert out[i, ids.shape[1]:].tolist() == alone(gen.model, tokens), f"{arch}: row {i} differs"
    forwards = gen.target.traced
    assert forwards is not None and any(max(b for b, _ in shapes) > 1 for shapes in forwards.checked.values()), \
        forwards.failures
    assert any(route.endswith("traced") for route in gen.last_stats.routes)


# Steps of one row (no candidate: the window kept x alone) and of several (the prompt's repeated motif
# matched), chosen without timing (a fixed budget).
MIXED = LookaheadConfig(traced_forward=True, window=1, auto_window=False, budget="fixed")


def test_one_trace_serves_one_row_and_many_once_checked_at_each():
    """Target gives a traced model's one-row steps a mask too: one trace (made on the first step) serves
    steps of one row and of several, each row class checked once on its first step."""
    gen = traced_generator("llama", MIXED)
    checks = []
    agreed = traced.agreed

    def checking(eager, trace, inputs, in_place=False):
        checks.append(inputs[0].shape[1])
        return agreed(eager, trace, inputs, in_place)

    traced_agreed, traced.agreed = traced.agreed, checking
    try:
        ids = prompt(2)
        out = gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS)
    finally:
        traced.agreed = traced_agreed
    assert torch.equal(out, reference(gen.model, ids, NEW, eos_token_id=NO_EOS))
    forwards = gen.target.traced
    assert list(forwards.traces) == [traced.TraceKey("any", True)], forwards.traces
    assert forwards.checked[traced.TraceKey("any", True)] == {(1, "1"), (1, "2+")}
    stats = gen.last_stats
    rows_traced = {q > 1 for q, route in zip(stats.rows_per_step, stats.routes) if route.endswith("traced")}
    assert {q > 1 for q in stats.rows_per_step} == {False, True}, "the decode must have steps of both kinds"
    assert rows_traced == {False, True}, "steps of one row and of several ran through the one trace"
    assert len(checks) == 3, f"made and checked twice, then checked once at the other row class: {checks}"


def test_a_row_class_where_the_trace_disagrees_runs_eagerly(monkeypatch):
    """The trace agrees at the row class it was made at and not at the other: steps of that class run
    eagerly, and the decode stays exact."""
    gen = traced_generator("llama", MIXED)
    agreed = traced.agreed
    first = []  # the row class of the first step checked: where the trace is made

    def checking(eager, trace, inputs, in_place=False):
        here = traced.row_class(inputs[0].shape[1])
        first.append(first[0] if first else here)
        logits, seconds = agreed(eager, trace, inputs, in_place)
        return (logits if here == first[0] else None), seconds

    monkeypatch.setattr(traced, "agreed", checking)
    ids = prompt(2)
    out = gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS)
    assert torch.equal(out, reference(gen.model, ids, NEW, eos_token_id=NO_EOS))
    forwards = gen.target.traced
    key = traced.TraceKey("any", True)
    made, other = first[0], {"1": "2+", "2+": "1"}[first[0]]
    assert forwards.checked[key] == {(1, made)} and (key, (1, other)) in forwards.refused
    stats = gen.last_stats
    ran = {traced.row_class(q) for q, route in zip(stats.rows_per_step, stats.routes) if route.endswith("traced")}
    assert {traced.row_class(q) for q in stats.rows_per_step} == {"1", "2+"}, "steps of both kinds must run"
    assert ran == {made}, "only the row class the trace agreed at ran through it"


def test_generators_sharing_a_model_stay_exact():
    """Two generators over one model (as the bench runs them), each tracing, called in turn."""
    model = tiny_model("qwen3")
    gens = [LookaheadGenerator(model, config=LookaheadConfig(traced_forward=True, candidates=c)) for c in (0, 8)]
    for gen in gens:
        assert gen.target.traced is not None
        gen.target.traced.patience = 0.0
    for seed in range(2):
        ids = prompt(seed)
        expected = reference(model, ids, NEW, eos_token_id=NO_EOS)
        for gen in gens:
            assert torch.equal(gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS), expected)
    assert all(gen.target.traced is not None and gen.target.traced.traces for gen in gens)
    assert all(type(m.weight) is torch.nn.Parameter for m in model.modules() if isinstance(m, torch.nn.Linear))


def test_a_trace_serves_another_batch_size_once_checked_there(monkeypatch):
    """A trace made on one sequence is checked once on its first step of three; where that check
    fails, the batch of three runs eagerly and stays exact."""
    from test_batch import PROMPTS, alone, left_padded

    for fails in (False, True):
        gen = traced_generator("llama", LookaheadConfig(traced_forward=True, window=2, ngram=3))
        ids = prompt(7)
        assert torch.equal(gen.generate(ids, max_new_tokens=20, eos_token_id=NO_EOS),
                           reference(gen.model, ids, 20, eos_token_id=NO_EOS))
        forwards = gen.target.traced
        assert forwards is not None and forwards.traces and all({b for b, _ in s} == {1} for s in forwards.checked.values())
        made = dict(forwards.traces)
        checks = []
        agreed = traced.agreed

        def checking(eager, trace, inputs, in_place=False, fails=fails):
            checks.append(inputs[0].shape[0])
            logits, seconds = agreed(eager, trace, inputs, in_place)
            return (None if fails and inputs[0].shape[0] > 1 else logits), seconds

        monkeypatch.setattr(traced, "agreed", checking)
        padded, mask = left_padded(PROMPTS)
        out = gen.generate(padded, attention_mask=mask, max_new_tokens=20, eos_token_id=NO_EOS)
        for i, tokens in enumerate(PROMPTS):
            assert out[i, padded.shape[1]:].tolist() == alone(gen.model, tokens, 20), f"fails={fails}: row {i}"
        batch = len(PROMPTS)
        assert batch in checks, "the batch size was never checked"
        traced_steps = [r for r in gen.last_stats.routes if r.endswith("traced")]
        if fails:  # (a trace made during the batch is checked there too, and refused; the last rows run alone)
            assert any((key, (batch, rows)) in forwards.refused for key in made for rows in ("1", "2+"))
            assert all({b for b, _ in shapes} == {1} for shapes in forwards.checked.values()), forwards.checked
        else:
            assert any(batch in {b for b, _ in forwards.checked[key]} for key in made) and traced_steps
        monkeypatch.undo()


def test_making_a_trace_is_not_taken_for_the_steps_cost(monkeypatch):
    """The seconds a step spends making a trace are told apart (Target.compile_seconds), and the route's
    re-check (and the cost curve, from the same figure) learn from the rest: a slow trace never makes
    a row count look dear. (Making a trace here sleeps a second more than a tiny model's step takes.)"""
    import time as clock

    gen = traced_generator("llama")
    made = traced.TracedForward._new_trace

    def slow(self, key, inputs):
        clock.sleep(1.0)
        return made(self, key, inputs)

    monkeypatch.setattr(traced.TracedForward, "_new_trace", slow)
    compiles, observed = record_compile_seconds(monkeypatch, gen)
    ids = prompt(3)
    assert torch.equal(gen.generate(ids, max_new_tokens=20, eos_token_id=NO_EOS),
                       reference(gen.model, ids, 20, eos_token_id=NO_EOS))
    assert len(observed) == len(compiles)
    making = [i for i, s in enumerate(compiles) if s >= 1.0]
    assert making and len(making) == len(gen.target.traced.traces), (compiles, gen.target.traced.traces)
    assert all(observed[i] < compiles[i] for i in making), (observed, compiles)
    checking = [i for i, s in enumerate(compiles) if 0.0 < s < 1.0]  # (the other row class's first step: a check)
    assert len(checking) <= 1, compiles


def test_a_server_traces_by_default_and_on_sight():
    """``lookahead serve`` and ``generate`` default to the traced forward, and an engine makes each kind's
    trace on its first step: a server pays for a trace once, for every request after."""
    from lookahead.cli.main import main
    from lookahead.serve.engine import Engine

    def default(command: str) -> object:
        return next(p.default for p in main.commands[command].params if p.name == "traced_forward")

    assert default("serve") is True and default("generate") is True
    gen = LookaheadGenerator(tiny_model("llama"), config=LookaheadConfig(traced_forward=True))
    assert gen.target.traced is not None and gen.target.traced.patience > 0
    Engine(gen)
    assert gen.target.traced.patience == 0.0


def test_a_serving_trace_replays_with_the_routes_threads_alone(monkeypatch):
    """Once a kind's trace is made and checked at a step's shape, the step replays it without swapping
    the layers' weights for the route's (``FewRowLinear.routed``): its linear op is told the route. A
    forward hook set after that still sends the steps to the eager forward, weights routed."""
    import numpy as np

    from lookahead.model.fewrows import FewRowLinear
    from lookahead.model.routing import Route, Routing

    gen = traced_generator("llama")
    gen.target.routings = {1: Routing(np.array([1]), [Route(1, "kernel")], np.ones((1, 1)))}  # the kernel's route
    ids = prompt(6)
    expected = reference(gen.model, ids, NEW, eos_token_id=NO_EOS)
    assert torch.equal(gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS), expected)  # makes the traces
    forwards = gen.target.traced
    assert forwards is not None and {shape for shapes in forwards.checked.values() for shape in shapes} \
        == {(1, "1"), (1, "2+")}, forwards.checked
    entered = []
    routed = FewRowLinear.routed

    def counting(self, *args, **kwargs):
        entered.append(1)
        return routed(self, *args, **kwargs)

    monkeypatch.setattr(FewRowLinear, "routed", counting)
    assert torch.equal(gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS), expected)
    routes = gen.last_stats.routes
    assert routes and all(route == "kernel x1 traced" for route in routes), routes
    assert not entered, f"{len(entered)} replayed steps swapped the weights"
    calls = []
    handle = gen.model.get_input_embeddings().register_forward_pre_hook(lambda *args: calls.append(1))
    try:
        out = gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS)
    finally:
        handle.remove()
    assert torch.equal(out, expected)
    assert len(calls) == gen.last_stats.steps + 1, "the hook missed a step"
    assert len(entered) == gen.last_stats.steps and not any("traced" in r for r in gen.last_stats.routes)


def test_weights_loaded_in_place_of_the_traced_ones_are_traced_again():
    """``load_state_dict(assign=True)`` puts new parameters in the model: the traces, which hold the old
    ones as constants, are dropped and the next decode follows the new weights."""
    gen = traced_generator("llama")
    ids = prompt(2)
    gen.generate(ids, max_new_tokens=12, eos_token_id=NO_EOS)
    forwards = gen.target.traced
    assert forwards is not None and forwards.traces
    other = tiny_model("llama", seed=7).state_dict()
    gen.model.load_state_dict({k: v.clone() for k, v in other.items()}, assign=True)
    out = gen.generate(ids, max_new_tokens=12, eos_token_id=NO_EOS)
    assert torch.equal(out, reference(gen.model, ids, 12, eos_token_id=NO_EOS))


def _writes(value: float):
    """A forward that writes ``value`` into slot 0 of the buffer and returns the tokens as its logits."""
    def forward(tokens, positions, keep, past, buffer, route):
        buffer[0] = value
        return tokens.float()
    return forward


def _step(buffer):
    tokens = torch.arange(3)[None]
    return tokens, tokens, torch.arange(3), torch.zeros(0), buffer, torch.tensor(0)


def test_a_check_in_place_keeps_the_traces_writes_where_it_agrees():
    buffer = torch.zeros(4)
    logits, seconds = traced.agreed(_writes(1.0), _writes(1.0), _step(buffer), in_place=True)
    assert logits is not None and torch.equal(logits, torch.arange(3.0)[None]) and seconds >= 0.0
    assert buffer.tolist() == [1.0, 0.0, 0.0, 0.0], "the step's own buffer holds the replay's writes"


def test_a_check_in_place_leaves_the_eager_forwards_writes_where_it_disagrees():
    buffer = torch.zeros(4)
    logits, _ = traced.agreed(_writes(1.0), _writes(2.0), _step(buffer), in_place=True)
    assert logits is None
    assert buffer.tolist() == [1.0, 0.0, 0.0, 0.0], "the buffer holds what an eager step writes"
    copy = torch.zeros(4)
    assert traced.agreed(_writes(1.0), _writes(1.0), _step(copy))[0] is not None and not copy.any(), \
        "a check on copies leaves the buffer as it was"


def test_same_is_to_the_bit():
    nan = torch.tensor([float("nan"), 1.0])
    assert traced.same(nan, nan.clone())
    assert not traced.same(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert not traced.same(torch.ones(2), torch.ones(3)) and not traced.same(torch.ones(2), torch.ones(2).double())
    half = torch.ones(2, dtype=torch.bfloat16)
    assert traced.same(half, half.clone()) and not traced.same(half, half + 1)


def test_a_batch_size_is_not_checked_once_two_others_of_several_agreed():
    """Agreement at batch sizes 2 and 3 covers 4 for the same row class (``TracedForward.serves``): a batch of
    four runs through the trace with no check of its own there, and stays exact."""
    from test_batch import PROMPTS, alone, left_padded

    gen = traced_generator("llama", LookaheadConfig(traced_forward=True, window=2, ngram=3))
    checks = []
    agreed = traced.agreed

    def checking(eager, trace, inputs, in_place=False):
        checks.append(traced.shape_of(inputs[0]))
        return agreed(eager, trace, inputs, in_place)

    traced.agreed, saved = checking, traced.agreed
    try:
        for size in (2, 3):
            ids, mask = left_padded(PROMPTS[:size])
            gen.generate(ids, attention_mask=mask, max_new_tokens=20, eos_token_id=NO_EOS)
        forwards = gen.target.traced
        key = traced.TraceKey("any", True)
        confirmed = {r for r in ("1", "2+") if {(2, r), (3, r)} <= forwards.checked[key]}
        assert confirmed, f"no row class agreed at both sizes: the test would show nothing ({forwards.checked})"
        checks.clear()
        ids, mask = left_padded(PROMPTS)
        out = gen.generate(ids, attention_mask=mask, max_new_tokens=20, eos_token_id=NO_EOS)
    finally:
        traced.agreed = saved
    for i, tokens in enumerate(PROMPTS):
        assert out[i, ids.shape[1]:].tolist() == alone(gen.model, tokens, 20), f"row {i}"
    assert not [c for c in checks if c[0] == len(PROMPTS) and c[1] in confirmed], checks
    stats = gen.last_stats
    assert any(route.endswith("traced") for route in stats.routes)
    assert forwards.serves(key, (8, next(iter(confirmed))))


def test_a_refusal_at_one_batch_size_leaves_every_other_to_its_own_check():
    forwards = traced_generator("llama").target.traced
    key = traced.TraceKey("any", True)
    forwards.checked[key] = {(2, "2+"), (3, "2+")}
    assert forwards.serves(key, (4, "2+")) and not forwards.serves(key, (4, "1"))
    assert not forwards.serves(key, (1, "2+")), "one sequence is a class of its own"
    forwards.checked[key] = {(2, "2+"), (3, "2+")}
    forwards.refused.add((key, (5, "2+")))
    assert not forwards.serves(key, (4, "2+")) and forwards.serves(key, (3, "2+"))


def test_a_check_in_place_whose_replay_fails_leaves_the_eager_forwards_writes():
    def fails(tokens, positions, keep, past, buffer, route):
        buffer[1] = 7.0  # part-way through, then it raises
        raise RuntimeError("the trace cannot run this shape")

    buffer = torch.zeros(4)
    with pytest.raises(RuntimeError):
        traced.agreed(_writes(1.0), fails, _step(buffer), in_place=True)
    assert buffer.tolist() == [1.0, 0.0, 0.0, 0.0], "the buffer holds what an eager step writes"
