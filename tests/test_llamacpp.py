"""The llama.cpp comparison's own arithmetic and its refusals (the server itself is not installed here)."""

from __future__ import annotations

import click
import numpy as np
import pytest

from lookahead.benchmarks.llamacpp import Row, Server, summary
from lookahead.proposers.draft.drafter import common_prefix


def row(llama: tuple[int, float], ours: tuple[int, float], exact: bool = True, equal: int = 0) -> Row:
    return Row("d", 5, llama[0], llama[1], 50.0, equal, ours[0], ours[1], exact, 30, 2.0)


def test_summary_worked_example():
    out = summary([row((10, 1.0), (20, 1.0)), row((30, 1.0), (30, 2.0), exact=False, equal=30)])
    assert out["llama_tokens_per_s"] == pytest.approx(20.0)
    assert out["lookahead_tokens_per_s"] == pytest.approx(50 / 3)
    assert (out["ratio_min"], out["ratio_max"]) == (0.5, 2.0) and out["ratio_geomean"] == pytest.approx(1.0)
    assert out["lookahead_exact"] == 1 and out["llama_all_equal"] == 1  # (the second row's 30 of 30)


def test_the_texts_agreement_is_their_common_prefix():
    assert common_prefix(np.asarray([1, 2, 3]), np.asarray([1, 2, 4])) == 2
    assert common_prefix(np.asarray([1, 2]), np.asarray([1, 2, 3])) == 2
    assert common_prefix(np.asarray([], dtype=np.int64), np.asarray([1])) == 0


def test_a_missing_server_or_weights_file_is_named(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"")
    with pytest.raises(click.BadParameter, match="--server"):
        Server(str(tmp_path / "nope"), str(gguf), 2, 18181, (), tmp_path / "log")
    with pytest.raises(click.BadParameter, match="--gguf"):
        Server(str(gguf), str(tmp_path / "none.gguf"), 2, 18181, (), tmp_path / "log")
