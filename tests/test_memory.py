"""Long generations stay flat in memory apart from the KV cache (no timing is measured or asserted).

Host memory is traced with tracemalloc (numpy arrays and Python objects; torch
tensors such as the KV cache are not traced): going from a short to a long
generation may add only a few hundred bytes per extra token (the sequence
buffer and one stats entry per step), never a vocabulary-sized array per step
or anything quadratic. The KV cache may hold only the sequence's rows (and the
last step's).
"""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest
import torch
import transformers

from conftest import reference
from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.decode.batch import BatchHandle, OpenBatch
from lookahead.decode.loop import DecodeRun
from lookahead.decode.padded import decode_padded
from lookahead.call.output import OutputBuffer
from lookahead.call.decoding import resolve_decoding

VOCAB = 2048  # a leaked logits row per step would be 8 KB: far above the allowance below
SHORT, LONG = 300, 1500
BYTES_PER_EXTRA_TOKEN = 1024


@pytest.fixture(scope="module")
def gen():
    torch.manual_seed(0)
    # wide initial weights: the random model loops less, so steps stay short (about 3 tokens each) and a
    # per-step leak shows per token
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, max_position_embeddings=8192, pad_token_id=0,
                                      initializer_range=0.2)
    model = transformers.LlamaForCausalLM(config).eval()
    model.generation_config.pad_token_id = 0
    # no memory across requests: the measured runs would replay the text of the runs before them (a 1500-token
    # answer in 52 steps), so the short and the long run would not be alike but for their length
    generator = LookaheadGenerator(model, config=LookaheadConfig(memory_tokens=0))
    if generator.target.traced is not None:
        # trace on sight: the trace (a one-time allocation, about 1.3 MB) is made in the warm-up call below,
        # not in whichever measured run's eager steps first outlast its cost on this machine's clock
        generator.target.traced.patience = 0.0
    generator.generate(torch.from_numpy(PROMPT)[None], max_new_tokens=50)  # one-time allocations happen here
    return generator


PROMPT = np.array([11, 12, 13, 14, 15, 11, 12, 13], dtype=np.int64)


def traced_run(gen: LookaheadGenerator, new: int) -> tuple[OpenBatch, BatchHandle, int, int]:
    """One greedy decode of ``new`` tokens (no EOS), as generate runs it (decode/padded.py); traced host memory
    held at its end, and its peak (with the batch and the sequence's handle)."""
    decoding = resolve_decoding(gen.model, PROMPT.shape[0], gen.target.device, max_new_tokens=new,
                                do_sample=False, eos_token_id=[VOCAB + 1])
    tracemalloc.start()
    try:
        ids = torch.from_numpy(PROMPT)[None]
        run = OpenBatch(DecodeRun.open(gen._context(1)), gen.model, gen.tokenizer, gen.grammar)
        with torch.inference_mode():
            _, handles = decode_padded(run, ids, torch.ones_like(ids), [PROMPT], decoding)
        # what the run holds, not the garbage its steps left in reference cycles that the collector had not
        # reached yet (21 to 81 acceptance-estimate arrays of ~8 KB: held varied by 0.5 MB between alike runs)
        gc.collect()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return run, handles[0], held, peak


def test_long_generation_memory_is_linear_and_the_cache_holds_the_sequence(gen):
    _, _, short_held, short_peak = traced_run(gen, SHORT)
    batch, handle, long_held, long_peak = traced_run(gen, LONG)
    out, stats = handle._seq.out, batch.stats
    assert out.new_tokens == LONG
    # The sequence's rows (all but the last token's), plus at most the final step's rows (not cropped: the
    # call ends there): every earlier step's rejected rows were dropped.
    assert out.stop - 1 <= batch.run.cache.get_seq_length() <= out.stop - 1 + stats.rows_per_step[-1]
    assert out.seq.shape[0] <= out.stop + OutputBuffer.GROWTH + 1  # the buffer grew with the text, no further
    assert len(stats.rows_per_step) == len(stats.accepted) == stats.steps  # one stats entry per step, no more
    assert stats.steps > LONG // 8  # short steps: a per-step leak would be a per-token one
    for what, growth in (("held", long_held - short_held), ("peak", long_peak - short_peak)):
        assert growth < BYTES_PER_EXTRA_TOKEN * (LONG - SHORT), f"{what}: {growth} bytes for {LONG - SHORT} more tokens"


def test_long_generation_is_exact(gen):
    ids = torch.from_numpy(PROMPT)[None]
    out = gen.generate(ids, max_new_tokens=LONG, eos_token_id=VOCAB + 1)
    assert torch.equal(out, reference(gen.model, ids, LONG, eos_token_id=[VOCAB + 1]))
