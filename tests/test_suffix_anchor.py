"""SuffixDecoding's official tree as lookahead's memory (benchmarks/suffix_anchor.py): its draft as
candidate rows, and greedy exactness through it where it builds here (skipped, saying why, where not)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import VOCAB, reference, tiny_model
from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.benchmarks.suffix_anchor import AnchorUnavailable, build_suffix_decoding, draft_rows, order_of

NO_EOS = [VOCAB + 1000]


def test_draft_rows_docstring_example():
    rows = draft_rows(np.array([5, 6, 7]), np.array([-1, 0, 0]), np.array([0.9, 0.6, 0.3]), 1, 4)
    assert rows.tokens.tolist() == [[5, 6], [5, 7]] and rows.lens.tolist() == [2, 2]
    # order 1 (5 buckets each); shares given the parent: .9, .6 / .9, .3 / .9
    assert rows.classes.tolist() == [[9, 8], [9, 6]]
    assert draft_rows(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0), 0, 4).count == 0


def test_match_lengths_map_to_the_store_orders():
    assert [order_of(n) for n in (0, 1, 2, 3, 4, 7, 8, 40)] == [0, 0, 1, 1, 2, 2, 3, 5]


@pytest.fixture(scope="module")
def anchor():
    try:
        return build_suffix_decoding(log=lambda line: None)
    except AnchorUnavailable as exc:
        pytest.skip(f"SuffixDecoding cannot be built here: {exc}")


def test_greedy_is_exact_with_suffix_decoding_as_the_memory(anchor):
    from lookahead.benchmarks.suffix_anchor import SuffixDecodingMemory

    model = tiny_model("llama")
    config = LookaheadConfig(budget="fixed", context_match=False, ngram_pool=False, recycle=False)
    gen = LookaheadGenerator(model, config=config, memory=SuffixDecodingMemory(anchor))
    ids = torch.randint(1, VOCAB, (1, 12), generator=torch.Generator().manual_seed(3))
    steps = []
    for _ in range(2):
        out = gen.generate(ids, max_new_tokens=40, eos_token_id=NO_EOS)
        assert torch.equal(out, reference(model, ids, 40, eos_token_id=NO_EOS))
        steps.append(gen.last_stats.steps)
    assert steps[1] < steps[0]  # the second time, the first answer is in its global tree
