"""model/stepways.py: the ways Target.step runs a step (graphed, replayed from a trace, eager), each offered
the step in turn; every way gives the same logits."""

from __future__ import annotations

import numpy as np
import torch

from conftest import tiny_model
from lookahead.model.stepways import EagerStep, GraphedStep, ReplayedStep, StepCall
from lookahead.model.support import check_model
from lookahead.model.target import Target
from test_traced import NEW, NO_EOS, prompt, traced_generator


def one_step(target: Target, ids: torch.Tensor) -> tuple[StepCall, torch.Tensor]:
    """A prefilled cache and the call of the step over ids' last token (one row, every logit kept); the
    model's own logits for that row [1, 1, V]."""
    cache = target.new_cache()
    tokens = ids[0].numpy()
    target.prefill(cache, tokens[None, :-1])
    past = tokens.shape[0] - 1
    call = StepCall(cache, tokens[None, -1:], np.array([[past]]), np.ones((1, 1, 1), dtype=bool),
                    np.array([0]), past, None)
    with torch.inference_mode():
        expected = target.model(ids).logits[:, -1:]
    return call, expected


def test_the_eager_way_runs_the_models_forward():
    model = tiny_model("llama")
    target = Target(model, check_model(model, False))
    call, expected = one_step(target, prompt(1))
    with torch.inference_mode():
        logits = EagerStep(target).run(call)
    assert call.prepared and call.key is None  # (prepared by the way itself; no trace without a traced forward)
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


def test_the_graphed_way_passes_where_no_graphs_were_captured():
    model = tiny_model("llama")
    target = Target(model, check_model(model, False))
    assert target.graphs is None  # (the CPU captures none)
    call, _ = one_step(target, prompt(1))
    assert GraphedStep(target).run(call) is None and not call.prepared


def test_the_replayed_way_serves_only_a_trace_made_and_checked_at_the_shape():
    gen = traced_generator("llama")
    target = gen.target
    call, _ = one_step(target, prompt(1))
    with torch.inference_mode():
        assert ReplayedStep(target).run(call) is None  # (no trace yet)
    ids = prompt(1)
    out = gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS)  # (makes and checks the traces)
    assert any(route.endswith("traced") for route in gen.last_stats.routes)
    call, expected = one_step(target, ids)
    with torch.inference_mode():
        replayed = ReplayedStep(target).run(call)
    assert replayed is not None and out.shape[1] > ids.shape[1]
    torch.testing.assert_close(replayed, expected, rtol=1e-5, atol=1e-5)


def test_target_step_takes_the_first_way_that_runs():
    model = tiny_model("llama")
    target = Target(model, check_model(model, False))
    call, expected = one_step(target, prompt(1))
    offered = []

    class Passing:
        name = "passing"

        def run(self, step_call):
            offered.append(step_call)
            return None

    class Fixed:
        name = "fixed"

        def run(self, step_call):
            return torch.zeros(1, 1, 7)

    target.ways = (Passing(), Fixed(), EagerStep(target))
    assert torch.equal(target.step(call.cache, call.tokens, call.positions, call.local, call.keep, call.past),
                       torch.zeros(1, 1, 7))
    assert len(offered) == 1
    target.ways = (Passing(), EagerStep(target))
    with torch.inference_mode():
        logits = target.step(call.cache, call.tokens, call.positions, call.local, call.keep, call.past)
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
