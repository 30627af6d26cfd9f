"""Continuous batching (decode/loop.py's join / leave, serve/engine.py): sequences that join a running
batch at different steps, of different prompt lengths, each give model.generate's tokens on their
prompt alone; one that leaves changes nothing for the others; a seeded sampled sequence gives the
same tokens with and without company."""

from __future__ import annotations

import asyncio

import pytest
import torch

from conftest import RUN_ON, VOCAB, tiny_model
from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.decode import loop
from lookahead.model.cache import SlotCache, joined
from lookahead.serve.engine import Completion, Engine, QueueFull

NO_EOS = [VOCAB + 1000]
MOTIF = [5, 9, 13, 17, 21]
PROMPTS = [MOTIF * 3, [7, 8, 9], [40, 41] + MOTIF * 2 + [3], [11], [60, 61, 62, 60, 61, 62, 60],
           [30] * 9, MOTIF + [2, 4, 6, 8] * 3, [77, 78]]  # 8 prompts, lengths 15, 3, 13, 1, 7, 9, 17, 2
JOIN_AT = [0, 0, 1, 3, 4, 4, 7, 12]  # the step before which each joins
NEW = [24, 30, 18, 26, 12, 30, 22, 16]


def alone(model, prompt: list[int], new: int) -> list[int]:
    """model.generate greedy on one unpadded prompt: its new tokens."""
    ids = torch.tensor([prompt], device=model.device)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                             eos_token_id=NO_EOS)
    return out[0, len(prompt):].tolist()


def drive(gen: LookaheadGenerator, prompts: list[list[int]], join_at: list[int], new: list[int],
          leave_at: dict[int, int] | None = None, **sampling) -> dict[int, list[int]]:
    """Run an open batch (the public OpenBatch): prompt i joins before step join_at[i] (and leaves before
    step leave_at[i]); every sequence's new tokens, by index, as its events streamed them."""
    leave_at = leave_at or {}
    batch = gen.open_batch()
    handles, streamed, out, step, widest = {}, {}, {}, 0, 0
    with torch.inference_mode():
        while len(out) < len(prompts):
            for i, at in enumerate(join_at):
                if at == step:
                    handles[i] = batch.join(prompts[i], max_new_tokens=new[i], eos_token_id=NO_EOS, **sampling)
                    streamed[i] = []
            for i, at in leave_at.items():
                if at == step and i in handles and i not in out:
                    batch.leave(handles[i])
                    assert handles[i].finish_reason == "cancelled"
                    out[i] = streamed[i]
            widest = max(widest, len(batch.handles))
            for event in batch.step():
                i = next(k for k, h in handles.items() if h is event.handle)
                streamed[i].extend(event.tokens)
                if event.finish_reason is not None:
                    assert event.finish_reason == "length" and event.handle.finish_reason == "length"
                    out[i] = streamed[i]
            step += 1
            assert step < 500, "the batch never drained"
    for i, handle in handles.items():
        assert handle.output_ids.tolist() == out[i], f"sequence {i}: its events missed tokens"
        assert handle.prompt_tokens == len(prompts[i]) and handle.new_tokens == len(out[i])
    assert widest >= min(3, len(prompts) - 1), "the sequences never decoded side by side: the test shows nothing"
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3", "gpt2"])
def test_sequences_joining_at_different_steps_each_equal_generate_alone(arch, monkeypatch):
    """... across the cache's compactions too (decode/loop.py drops its holes on the way)."""
    compactions = []
    real = loop.compact_slots
    monkeypatch.setattr(loop, "compact_slots", lambda cache, index: (compactions.append(index.shape), real(cache, index)))
    model = tiny_model(arch)
    gen = LookaheadGenerator(model, config=LookaheadConfig(window=2, ngram=3))
    out = drive(gen, PROMPTS, JOIN_AT, NEW)
    for i, prompt in enumerate(PROMPTS):
        assert out[i] == alone(model, prompt, NEW[i]), f"{arch}: sequence {i} differs"
    assert compactions, "the cache was never compacted: the test would not cover it"


def test_a_fair_share_batch_equals_generate_alone():
    """fair_share 1 (steps no sequence decodes slower in) changes the steps' shapes, never the tokens."""
    model = tiny_model("llama")
    gen = LookaheadGenerator(model, config=LookaheadConfig(window=2, ngram=3, fair_share=1.0))
    out = drive(gen, PROMPTS, JOIN_AT, NEW)
    for i, prompt in enumerate(PROMPTS):
        assert out[i] == alone(model, prompt, NEW[i]), f"sequence {i} differs"


def test_compaction_keeps_the_slots_each_sequence_sees():
    """After every step of a joining batch, each sequence sees as many slots as its x's position, the
    visible slots' positions count 0, 1, ... in order, and compaction leaves no more slots than the
    longest sequence needs plus the holes it tolerates."""
    model = tiny_model("llama")
    gen = LookaheadGenerator(model, config=LookaheadConfig(window=2, ngram=3))
    batch = gen.open_batch()
    run = batch.run  # the decode loop underneath, whose slots are checked
    seen_compacted = False
    with torch.inference_mode():
        for i in range(4):
            batch.join(PROMPTS[i], max_new_tokens=NEW[i], eos_token_id=NO_EOS)
        while run.active:
            past = run.past
            run.step()
            if run.slots is None or not run.active:
                continue
            valid, positions = run.slots.valid.cpu().numpy(), run.slots.positions.cpu().numpy()
            assert valid.shape == (len(run.active), run.past)
            for a in range(len(run.active)):
                assert valid[a].sum() == run.x_pos[a]
                assert positions[a][valid[a]].tolist() == list(range(int(run.x_pos[a])))
            holes = run.past - int(run.x_pos.max())
            assert holes < max(loop.COMPACT_MIN_SLOTS, loop.COMPACT_SHARE * run.past)
            seen_compacted |= run.past < past
    assert seen_compacted, "no step compacted the cache"


def test_a_sequence_that_leaves_changes_nothing_for_the_others():
    model = tiny_model("llama")
    gen = LookaheadGenerator(model)
    out = drive(gen, PROMPTS[:4], JOIN_AT[:4], NEW[:4], leave_at={1: 3})
    assert out[1] == alone(model, PROMPTS[1], NEW[1])[:len(out[1])] and len(out[1]) < NEW[1]
    for i in (0, 2, 3):
        assert out[i] == alone(model, PROMPTS[i], NEW[i])


def test_a_batch_that_drained_takes_new_sequences():
    """Every sequence finished (the batch is empty, its cache stale); the next joins start afresh."""
    model = tiny_model("llama")
    gen = LookaheadGenerator(model)
    out = drive(gen, PROMPTS[:3], [0, 0, 40], [4, 4, 10])  # the third joins long after the first two ended
    for i in range(3):
        assert out[i] == alone(model, PROMPTS[i], [4, 4, 10][i])


def test_a_seeded_sampled_sequence_is_the_same_with_and_without_company():
    model = tiny_model("llama")
    gen = LookaheadGenerator(model)
    sampling = dict(do_sample=True, temperature=0.9)
    prompt = PROMPTS[0]

    def seeded(prompts, join_at, new):
        batch = gen.open_batch()
        handles, step = [], 0
        with torch.inference_mode():
            while True:
                for i, at in enumerate(join_at):
                    if at == step:
                        handles.append(batch.join(prompts[i], max_new_tokens=new[i], eos_token_id=NO_EOS,
                                                  seed=1234 if i == 0 else i, **sampling))
                batch.step()
                step += 1
                if step > max(join_at) and not batch.handles:
                    return handles[0].output_ids.tolist()

    lone = seeded([prompt], [0], [30])
    crowded = seeded([prompt] + PROMPTS[1:5], [0, 0, 2, 5, 9], [30, 20, 25, 10, 30])
    assert lone == crowded and len(lone) == 30


def test_joined_pads_the_shorter_past_in_front():
    torch.manual_seed(0)
    ours, theirs = SlotCache(2), SlotCache(2)
    a = [torch.randn(2, 3, 5, 4) for _ in range(4)]  # 2 sequences, 3 heads, 5 slots, head size 4
    b = [torch.randn(1, 3, 2, 4) for _ in range(4)]
    for layer in range(2):
        ours.update(a[2 * layer], a[2 * layer + 1], layer)
        theirs.update(b[2 * layer], b[2 * layer + 1], layer)
    out, before, pad = joined(ours, theirs, 5, 2, 2)
    assert (before, pad) == (0, 3) and out.get_seq_length() == 5
    keys = out.layers[1].keys  # [3, 3, 5, 4]
    assert torch.equal(keys[:2], a[2]) and torch.equal(keys[2, :, 3:], b[2][0]) and not keys[2, :, :3].any()
    back, before, pad = joined(theirs, ours, 2, 5, 2)  # now the batch's past is the shorter
    assert (before, pad) == (3, 0) and torch.equal(back.layers[0].values[1:], a[1])


@pytest.mark.parametrize("past, length", [(6, 3), (2, 6), (4, 4)])
def test_joined_arenas_hold_what_joined_layers_hold_after_a_sequence_left(past, length):
    """Two caches whose arenas hold every layer join in one copy of each (after one of three sequences
    left the batch: its arena a view of the first two rows): the same keys and values, padding
    zeroed, as joining layer by layer, and room for the next step without a copy."""
    from lookahead.model.cache import keep_sequences, new_cache

    torch.manual_seed(past)
    states = [torch.randn(3, 2, past, 4) for _ in range(4)] + [torch.randn(1, 2, length, 4) for _ in range(4)]
    arenas, plain = (new_cache(2), new_cache(2)), (new_cache(), new_cache())  # (batch, newcomer) each
    for batch, newcomer in (arenas, plain):
        for layer in range(2):
            batch.update(states[2 * layer], states[2 * layer + 1], layer)
            newcomer.update(states[4 + 2 * layer], states[5 + 2 * layer], layer)
        keep_sequences(batch, [0, 2], torch.device("cpu"))
    fast, before, pad = joined(*arenas, past, length, 2)
    slow, before_slow, pad_slow = joined(*plain, past, length, None)
    assert (before, pad) == (before_slow, pad_slow) == (max(past, length) - past, max(past, length) - length)
    for mine, theirs in zip(fast.layers, slow.layers):
        assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)
    assert fast.arena.buffer.shape[4] > max(past, length)  # room to grow


def test_the_engine_answers_requests_in_flight_together():
    """Requests submitted together and apart through the engine: each greedy one is generate's; a
    cancelled one ends 'cancelled'; the counters add up."""
    model = tiny_model("llama")
    gen = LookaheadGenerator(model, config=LookaheadConfig(memory_tokens=256))
    engine = Engine(gen, max_batch=3, max_queue=8)

    async def collect(ticket):
        tokens, last = [], None
        async for event in ticket.events():
            tokens.extend(event.tokens)
            last = event
        return tokens, last

    async def main():
        engine.start()
        try:
            tickets = [engine.submit(Completion(p, n)) for p, n in zip(PROMPTS[:5], NEW[:5])]
            gone = engine.submit(Completion(PROMPTS[5], 200))
            gone.cancel()
            results = await asyncio.wait_for(asyncio.gather(*(collect(t) for t in tickets + [gone])), 120)
            return results, engine.metrics()
        finally:
            engine.stop()

    results, metrics = asyncio.run(main())
    for (tokens, last), prompt, new in zip(results[:5], PROMPTS, NEW):
        expected = alone(model, prompt, new)
        assert tokens == expected and last.finish_reason == "length"
        assert (last.prompt_tokens, last.completion_tokens) == (len(prompt), new)
    assert results[5][1].finish_reason == "cancelled" and len(results[5][0]) < 200
    assert metrics["requests_total"] == 6 and metrics["tokens_generated_total"] >= sum(NEW[:5])
    assert metrics["forwards_total"] > 0 and metrics["memory_fill"] > 0
    assert metrics["sequence_steps_total"] >= metrics["forwards_total"]  # some steps held several requests
    assert 1.0 <= metrics["tokens_per_forward"] <= metrics["tokens_generated_total"] / metrics["forwards_total"]


def test_the_engine_refuses_past_its_queue_and_bad_requests():
    """max_batch 1, max_queue 0, no decode loop running: the free slot's request is queued, the next refused."""
    gen = LookaheadGenerator(tiny_model("llama"))
    engine = Engine(gen, max_batch=1, max_queue=0)

    async def main():
        engine.start(thread=False)  # (running, with no loop: what is queued stays queued)
        try:
            engine.submit(Completion([5, 6], 4))
            with pytest.raises(QueueFull):
                engine.submit(Completion([5, 6], 4))
            with pytest.raises(ValueError, match="max_tokens"):
                engine.submit(Completion([5, 6], 0))
            with pytest.raises(ValueError, match="token ids"):
                engine.submit(Completion([VOCAB], 3))
        finally:
            engine.stop()

    asyncio.run(main())


@pytest.mark.skipif(RUN_ON["device"] != "cpu", reason="traces are the CPU's route (model/target.py); a GPU captures graphs")
def test_an_open_batch_runs_outside_inference_mode_through_a_trace():
    """join / step / leave take no grad context from the caller: a traced step writes its cache through views
    that autograd would refuse to let it modify (it raised once, stepped outside inference mode)."""
    gen = LookaheadGenerator(tiny_model("llama"), config=LookaheadConfig(traced_forward=True))
    assert gen.target.traced is not None
    gen.target.traced.patience = 0.0  # traced from the first step
    batch = gen.open_batch()
    handles = [batch.join(p, max_new_tokens=16, eos_token_id=NO_EOS) for p in PROMPTS[:2]]
    out = {}
    while batch.handles:
        for event in batch.step():
            if event.finish_reason is not None:
                out[handles.index(event.handle)] = event.handle.output_ids.tolist()
    assert gen.target.traced.traces, "no trace was made: the test would show nothing"
    assert any(route.endswith("traced") for route in batch.stats.routes)
    assert out == {i: alone(gen.model, PROMPTS[i], 16) for i in range(2)}
