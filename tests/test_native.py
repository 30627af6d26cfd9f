"""lookahead's C++ linear op (lookahead/native/): built on first use, the Python op's products to the bit,
recorded by traces in its place, and where it cannot be built, the Python op instead."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch

from conftest import VOCAB, reference, tiny_model
from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.config import ConfigError
from lookahead.kernels.threads import start_numba_threads
from lookahead.model.fewrows import MM_ROWS_MAX, linear_op
from lookahead.native import build
from lookahead.native.entry import entry_points

NO_EOS = [VOCAB + 1000]


@pytest.fixture(autouse=True)
def threads_kept():
    """The kernel called here outside a routed forward runs on numba's threads, whose OpenMP runtime torch
    shares: numba is held to torch's count and torch's count put back after (the suite runs on one)."""
    threads = torch.get_num_threads()
    start_numba_threads()
    numba.set_num_threads(threads)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def native_op():
    start_numba_threads()
    op, why = build.load_linear()
    assert op is not None, f"the C++ op could not be built here: {why}"
    return op


def test_entry_point_worked_example():
    start_numba_threads()
    float32, float64 = entry_points()
    for entry, dtype in ((float32, np.float32), (float64, np.float64)):
        w = np.array([[1, 2], [0, 1], [1, 0]], dtype=dtype)  # [O=3, I=2]
        x = np.array([[1, 1], [2, 0]], dtype=dtype)  # [R=2, I=2]
        out = np.full((2, 3), np.nan, dtype=dtype)
        entry.ctypes(w.ctypes.data, x.ctypes.data, out.ctypes.data, 2, 2, 3)
        assert out.tolist() == [[3, 1, 1], [2, 0, 2]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("code", [0, 1, 2])
@pytest.mark.parametrize("rows", [1, 2, 3, MM_ROWS_MAX, 9, 64, 65])
@pytest.mark.parametrize("bias", [False, True])
def test_native_op_gives_the_python_ops_products_to_the_bit(native_op, dtype, code, rows, bias):
    """Every route, dtype and row count: kernel, W @ x^T and F.linear, as fewrows.linear_op computes them."""
    torch.manual_seed(rows * 7 + code)
    x, weight = torch.randn(1, rows, 1030, dtype=dtype), torch.randn(37, 1030, dtype=dtype)  # (long rows: wide kernel)
    b = torch.randn(37, dtype=dtype) if bias else None
    route = torch.tensor(code)
    got, expected = native_op(x, weight, b, route), linear_op(x, weight, b, route)
    assert got.shape == expected.shape == (1, rows, 37) and got.dtype == dtype
    assert torch.equal(got, expected)


def test_native_op_falls_back_to_torch_for_what_the_kernel_does_not_take(native_op):
    """A transposed (non-contiguous) weight and a mismatched dtype go to F.linear, as in the Python op."""
    x, weight = torch.randn(2, 16), torch.randn(16, 8).t()  # weight [8, 16], not contiguous
    assert torch.equal(native_op(x, weight, None, torch.tensor(1)), torch.nn.functional.linear(x, weight))
    with pytest.raises(RuntimeError):
        native_op(x.double(), torch.randn(8, 16), None, torch.tensor(1))


def traced_decode(config: LookaheadConfig, seed: int, new: int):
    """A tiny Llama's generator tracing on sight, after a greedy decode of ``new`` tokens that must equal
    model.generate's: its TracedForward."""
    gen = LookaheadGenerator(tiny_model("llama"), config=config)
    gen.target.traced.patience = 0.0
    ids = torch.randint(1, VOCAB, (1, 12), generator=torch.Generator().manual_seed(seed))
    out = gen.generate(ids, max_new_tokens=new, eos_token_id=NO_EOS)
    assert torch.equal(out, reference(gen.model, ids, new, eos_token_id=NO_EOS))
    assert any(route.endswith("traced") for route in gen.last_stats.routes)
    return gen.target.traced


def test_traces_record_the_native_op_and_decode_as_generate(native_op):
    forwards = traced_decode(LookaheadConfig(), 3, 30)
    assert forwards.op is native_op and forwards.traces and not forwards.native_failure
    graphs = [str(trace.graph) for trace in forwards.traces.values()]
    assert all("lookahead_native::linear" in g and "lookahead::linear" not in g for g in graphs)


def test_native_off_records_the_python_op():
    forwards = traced_decode(LookaheadConfig(native_linear=False), 4, 20)
    assert forwards.op is linear_op and forwards.traces
    assert all("lookahead::linear" in str(t.graph) and "lookahead_native" not in str(t.graph)
               for t in forwards.traces.values())


def test_a_failed_build_keeps_the_python_op_and_says_why(monkeypatch):
    def no_compiler() -> None:
        raise RuntimeError("Error building extension 'lookahead_native'\nc++: command not found")

    monkeypatch.setattr(build, "loaded", lambda: False)
    monkeypatch.setattr(build, "_build_and_load", no_compiler)
    op, why = build.load_linear()
    assert op is None and why == "RuntimeError: c++: command not found"
    forwards = traced_decode(LookaheadConfig(), 5, 20)
    assert forwards.op is linear_op and forwards.native_failure == "RuntimeError: c++: command not found"
    assert forwards.traces, "the Python op still traces"


def test_native_linear_must_be_a_bool():
    with pytest.raises(ConfigError, match="native_linear must be True or False"):
        LookaheadConfig(native_linear=1)
