"""The public open batch (lookahead/decode/batch.py, ``LookaheadGenerator.open_batch``): sequences that join
with different settings in one batch each decode what ``generate`` gives them alone, their events carry every
token (and its logprobs) in order with the finish reason last; bad settings are refused by name and nothing
joins; a sequence that leaves ends "cancelled" and the memory keeps it."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import torch

from conftest import VOCAB, tiny_model, tiny_tokenizer
from lookahead import (
    BatchEvent,
    BatchHandle,
    GenerateInputError,
    LookaheadConfig,
    LookaheadGenerator,
    OpenBatch,
    StepLogprobs,
)

NEW = 30
NO_EOS = [VOCAB + 1000]
SPECULATE = LookaheadConfig(window=3, ngram=3, candidates=4, match_min=1, match_length=6,
                            budget="fixed")  # trees every step, whatever the machine's load


@functools.lru_cache(maxsize=None)
def model():
    return tiny_model("llama")


def generator(**config) -> LookaheadGenerator:
    return LookaheadGenerator(model(), tiny_tokenizer(), dataclasses.replace(SPECULATE, **config))


def prompt(seed: int) -> list[int]:
    motif = torch.randint(3, VOCAB, (5,), generator=torch.Generator().manual_seed(seed)).tolist()
    return motif * 3 + motif[:2]


def alone(prompt_ids: list[int], **settings) -> torch.Tensor:
    """generate on the prompt alone, on a generator of its own: its new tokens [n] (or the output object)."""
    out = generator().generate(torch.tensor([prompt_ids]), max_new_tokens=NEW, eos_token_id=NO_EOS, **settings)
    return out


def run_all(batch: OpenBatch, handles: list[BatchHandle]) -> dict[int, list[BatchEvent]]:
    """Step until every handle ended; each handle's events, by its index."""
    events: dict[int, list[BatchEvent]] = {i: [] for i in range(len(handles))}
    for _ in range(500):
        if not batch.handles:
            return events
        for event in batch.step():
            events[next(i for i, h in enumerate(handles) if h is event.handle)].append(event)
    raise AssertionError("the batch never drained")


def streamed(events: list[BatchEvent]) -> list[int]:
    assert events and events[-1].finish_reason is not None, "no final event"
    assert all(e.finish_reason is None for e in events[:-1]), "an event after the final one"
    return [t for e in events for t in e.tokens]


def test_sequences_with_their_own_settings_each_decode_what_generate_gives_them():
    """Greedy, a stop string, logprobs, penalties with a bias, a seeded sampled one and a Predicted Output,
    side by side in one batch: each one's tokens are generate's on its prompt alone with those settings."""
    prompts = [prompt(i) for i in range(6)]
    plain = alone(prompts[1])[0, len(prompts[1]):].tolist()
    tokenizer = tiny_tokenizer()
    at = next(j for j in range(6, NEW - 1) if min(plain[j:j + 2]) >= 3)  # two plain characters
    stop = tokenizer.decode(plain[at:at + 2])  # met by new token at + 1 at the latest
    penalties = dict(presence_penalty=0.7, frequency_penalty=0.4, logit_bias={int(plain[0]): -100.0})
    predicted = alone(prompts[5])[0, len(prompts[5]):].tolist()
    settings = [{}, {"stop_strings": [stop]}, {"logprobs": 3}, penalties,
                {"do_sample": True, "temperature": 0.8}, {"prediction": predicted}]
    batch = generator().open_batch()
    handles = []
    for i, (ids, extra) in enumerate(zip(prompts, settings)):
        seeded = {"seed": 11} if extra.get("do_sample") else {}
        handles.append(batch.join(ids, max_new_tokens=NEW, eos_token_id=NO_EOS, **extra, **seeded))
        if i == 2:  # the rest join a batch that already ran a step
            batch.step()
    early = {i: h.output_ids.tolist() for i, h in enumerate(handles[:3])}
    assert len(batch.handles) == 6 and all(early.values())
    events = run_all(batch, handles)
    for i, (ids, extra, handle) in enumerate(zip(prompts, settings, handles)):
        tokens = early[i] + streamed(events[i]) if i < 3 else streamed(events[i])
        assert tokens == handle.output_ids.tolist(), f"sequence {i}: its events missed tokens"
        reference = dict(extra)
        if extra.get("do_sample"):
            reference["generator"] = torch.Generator().manual_seed(11)
        if "stop_strings" in extra:
            reference["tokenizer"] = tokenizer
        expected = alone(ids, **reference)
        expected = expected.sequences if "logprobs" in extra else expected
        assert tokens == expected[0, len(ids):].tolist(), f"sequence {i} ({extra}) differs from generate"
    assert handles[1].finish_reason == "stop" and handles[1].new_tokens <= at + 2
    assert stop in tokenizer.decode(handles[1].output_ids.tolist())
    assert [h.finish_reason for i, h in enumerate(handles) if i != 1] == ["length"] * 5
    assert handles[5].prediction_tokens[0] > 0  # the prediction was the output: it was accepted
    for i in (3, 4):  # the penalties and the sampling changed the output: the comparisons above show something
        assert handles[i].output_ids.tolist() != alone(prompts[i])[0, len(prompts[i]):].tolist()


def test_events_carry_the_logprobs_generate_returns():
    ids = prompt(3)
    batch = generator().open_batch()
    handle = batch.join(ids, max_new_tokens=NEW, eos_token_id=NO_EOS, logprobs=4)
    events = run_all(batch, [handle])[0]
    steps = [e.logprobs for e in events if e.tokens]
    assert steps and all(isinstance(s, StepLogprobs) and s.size == len(e.tokens)
                         for s, e in zip(steps, [e for e in events if e.tokens]))
    mine = np.concatenate([s.logprobs for s in steps])
    top = np.concatenate([s.top_ids for s in steps])
    theirs = alone(ids, logprobs=4).logprobs[0]
    assert streamed(events) == theirs.tokens.tolist()
    assert np.array_equal(top, theirs.top_ids.numpy())
    assert np.allclose(mine, theirs.logprobs.numpy(), atol=1e-4)  # (equal up to float32 rounding: test_logprobs.py)
    assert torch.equal(handle.logprobs.logprobs, torch.from_numpy(mine))


@pytest.mark.parametrize("prompt_ids, settings, named", [
    ([], {}, "prompt_ids"),
    ([[5, 6]], {}, "prompt_ids"),
    ([5, VOCAB], {}, "vocabulary"),
    ([5, 6], {"temperature": -1.0, "do_sample": True}, "temperature"),
    ([5, 6], {"presence_penalty": 3.0}, "presence_penalty"),
    ([5, 6], {"logit_bias": {VOCAB: 1.0}}, "logit_bias"),
    ([5, 6], {"logprobs": 21}, "logprobs"),
    ([5, 6], {"seed": "x"}, "seed"),
    ([5, 6], {"prediction": [VOCAB + 3]}, "prediction"),
    ([5, 6], {"max_new_tokens": -1}, "max_new_tokens"),
    ([5, 6], {"stop_strings": [""]}, "stop_strings"),
])
def test_bad_settings_are_refused_by_name_and_nothing_joins(prompt_ids, settings, named):
    batch = generator().open_batch()
    kept = batch.join([7, 8, 9], max_new_tokens=4, eos_token_id=NO_EOS)
    with pytest.raises(GenerateInputError, match=named):
        batch.join(prompt_ids, **settings)
    assert batch.handles == [kept]


def test_a_sequence_with_nothing_to_generate_ends_at_join():
    batch = generator().open_batch()
    handle = batch.join([5, 6, 7], max_new_tokens=0)
    assert handle.finish_reason == "length" and handle.new_tokens == 0
    assert batch.handles == [] and batch.step() == []


def test_a_sequence_that_leaves_ends_cancelled_and_the_memory_keeps_it():
    gen = generator(memory_tokens=256)
    batch = gen.open_batch()
    gone = batch.join(prompt(1), max_new_tokens=200, eos_token_id=NO_EOS)
    stays = batch.join(prompt(2), max_new_tokens=NEW, eos_token_id=NO_EOS)
    batch.step()
    assert gen.memory.store.tokens == 0
    batch.leave(gone)
    assert gone.finish_reason == "cancelled" and 0 < gone.new_tokens < 200 and batch.handles == [stays]
    assert gen.memory.store.tokens > 0  # the memory kept what it produced
    batch.leave(gone)  # (nothing: it ended already)
    assert gone.finish_reason == "cancelled"
    run_all(batch, [stays])
    assert stays.output_ids.tolist() == alone(prompt(2))[0, len(prompt(2)):].tolist()


def test_a_failure_at_a_sequences_end_fails_that_sequence_alone():
    batch = generator().open_batch()
    failing = batch.join(prompt(1), max_new_tokens=6, eos_token_id=NO_EOS)
    other = batch.join(prompt(2), max_new_tokens=NEW, eos_token_id=NO_EOS)

    def broken() -> np.ndarray:
        raise RuntimeError("a source's bookkeeping failed")

    failing._seq.finish = broken  # noqa: SLF001 (the sequence underneath, made to fail at its end)
    events = run_all(batch, [failing, other])
    assert events[0][-1].finish_reason == "error" and failing.finish_reason == "error"
    assert isinstance(failing.error, RuntimeError)
    assert other.finish_reason == "length"
    assert streamed(events[1]) == alone(prompt(2))[0, len(prompt(2)):].tolist()


def test_a_trial_step_needs_running_sequences_and_spends_the_batch():
    batch = generator().open_batch()
    with pytest.raises(ValueError, match="running sequences"):
        batch.trial_step(1)
    handle = batch.join(prompt(4), max_new_tokens=NEW, eos_token_id=NO_EOS)
    steps = batch.stats.steps
    batch.trial_step(2)
    assert handle.new_tokens == 0 and batch.stats.steps == steps  # nothing decoded, nothing counted
    with pytest.raises(RuntimeError, match="spent"):
        batch.step()
    with pytest.raises(RuntimeError, match="spent"):
        batch.join(prompt(5), max_new_tokens=NEW)
