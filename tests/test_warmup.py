"""A server's warm-up (lookahead/serve/warmup.py): every shape a batch meets first is traced and checked
before any request, nothing is learned or remembered, and requests after it decode exactly."""

from __future__ import annotations

import gc

import pytest
import torch
from conftest import VOCAB, reference, tiny_model, tiny_tokenizer
from test_traced import traced_generator

from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.serve.warmup import settle_heap, unsettle_heap, warm_up

NO_EOS = [VOCAB + 1000]


def test_warm_up_traces_every_first_shape_and_learns_nothing():
    gen = traced_generator("llama", LookaheadConfig(traced_forward=True, fair_share=1.0, memory_tokens=4096))
    done = warm_up(gen, max_batch=4)
    assert done.shapes == ((1, 1), (1, 2), (2, 1), (2, 2), (3, 1), (3, 2)) and done.seconds > 0
    traced = gen.target.traced
    assert traced is not None and len(traced.traces) == 1 and not traced.failures
    (key,) = traced.traces
    assert traced.checked[key] >= {(1, "1"), (1, "2+"), (2, "1"), (2, "2+"), (3, "1"), (3, "2+")}
    assert traced.serves(key, (4, "2+")) and traced.serves(key, (4, "1"))  # larger batches: no check left
    assert gen.acceptance and all(not table.seen_trials.any() for table in gen.acceptance.values())  # nothing decoded, nothing learned
    assert gen.memory.store.tokens == 0  # ... nor remembered

    # four requests at once after it: each exactly what model.generate gives on its prompt alone
    prompts = [torch.randint(3, VOCAB, (1, 6 + 3 * i), generator=torch.Generator().manual_seed(i)) for i in range(4)]
    batch = gen.open_batch()
    with torch.inference_mode():
        handles = [batch.join(ids[0], max_new_tokens=12, do_sample=False, eos_token_id=NO_EOS) for ids in prompts]
        while batch.handles:
            batch.step()
    for ids, handle in zip(prompts, handles):
        out = torch.cat([ids[0], torch.from_numpy(handle.output_ids)])[None]
        assert torch.equal(out, reference(gen.model, ids, 12, eos_token_id=NO_EOS))
    assert any(route.endswith("traced") for route in batch.stats.routes)


def test_a_server_of_one_sequence_warms_one_sequence():
    gen = traced_generator("qwen2")
    assert warm_up(gen, max_batch=1).shapes == ((1, 1), (1, 2))


def test_warm_up_makes_the_grammar_engines_token_table_where_it_can():
    """With a tokenizer (and xgrammar installed) the JSON-object grammar is compiled at warm-up, so the
    compiler and its vocabulary table exist before any request; without a tokenizer nothing is compiled."""
    pytest.importorskip("xgrammar")
    gen = LookaheadGenerator(tiny_model("llama"), tiny_tokenizer(), LookaheadConfig())
    assert getattr(gen, "_grammars", None) is None
    assert warm_up(gen, max_batch=1).grammar
    assert gen._grammars is not None and gen._grammars._compiler is not None  # (made once, kept)
    bare = traced_generator("qwen2")
    assert bare.tokenizer is None and not warm_up(bare, max_batch=1).grammar
    assert getattr(bare, "_grammars", None) is None


def test_a_grammar_engine_that_cannot_compile_leaves_the_warm_up_done(monkeypatch):
    """(a tokenizer the grammar engine cannot read: the traces are made all the same; the first constrained
    request compiles, and says why it cannot, as a 400)"""
    pytest.importorskip("xgrammar")
    gen = LookaheadGenerator(tiny_model("llama"), tiny_tokenizer(), LookaheadConfig())

    def unreadable(response_format, tokenizer=None):
        if response_format is None:  # (a join without a constraint asks too)
            return None
        raise RuntimeError("the tokenizer's vocabulary cannot be read")

    monkeypatch.setattr(gen, "grammar", unreadable)
    done = warm_up(gen, max_batch=1)
    assert done.shapes == ((1, 1), (1, 2)) and not done.grammar


def test_settle_heap_takes_what_is_alive_out_of_full_collections_until_unsettled():
    kept = [[i] for i in range(1000)]  # objects alive at start-up's end
    try:
        frozen = settle_heap()
        assert frozen == gc.get_freeze_count() >= len(kept)
        walked = {id(obj) for obj in gc.get_objects()}  # every generation the collector walks
        assert id(kept) not in walked and id(kept[0]) not in walked
        later = [0]
        assert id(later) in {id(obj) for obj in gc.get_objects()}  # what serving makes is still walked
        unsettle_heap()
        assert gc.get_freeze_count() == 0 and id(kept) in {id(obj) for obj in gc.get_objects()}
    finally:
        gc.unfreeze()
