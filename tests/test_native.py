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
from lookahead.model.fewrows import KERNEL_ROWS_MAX, MM_ROWS_MAX, TILED_CODE, linear_op
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


def test_sources_digest_names_the_build(tmp_path, monkeypatch):
    """Curves are cached per build (cost/store.py): the digest follows the sources' bytes, as a process first
    read them (a file edited while it runs does not change the build it loaded)."""
    first, second = tmp_path / "a.cpp", tmp_path / "b.cpp"
    first.write_text("int a;")
    second.write_text("int b;")
    digest = build.digest_of([first, second])
    assert len(digest) == 12 and int(digest, 16) >= 0
    assert build.digest_of([first, second]) == digest
    second.write_text("int c;")
    assert build.digest_of([first, second]) != digest
    second.write_text("int b;")
    monkeypatch.setattr(build, "SOURCES", [first, second])
    monkeypatch.setattr(build, "HEADERS", [])
    build.sources_digest.cache_clear()
    try:
        assert build.sources_digest() == digest
        second.write_text("int c;")
        assert build.sources_digest() == digest  # (read once a process)
    finally:
        build.sources_digest.cache_clear()


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
@pytest.mark.parametrize("code", [0, 1, 2, TILED_CODE])
@pytest.mark.parametrize("rows", [1, 2, 3, MM_ROWS_MAX, 9, 64, 65, 200, 257])
@pytest.mark.parametrize("bias", [False, True])
def test_native_op_gives_the_python_ops_products_to_the_bit(native_op, dtype, code, rows, bias):
    """Every route, dtype and row count: kernel (numba's, or the tiled one), W @ x^T and F.linear, as
    fewrows.linear_op computes them."""
    torch.manual_seed(rows * 7 + code)
    x, weight = torch.randn(1, rows, 1030, dtype=dtype), torch.randn(37, 1030, dtype=dtype)  # (long rows: wide kernel)
    b = torch.randn(37, dtype=dtype) if bias else None
    route = torch.tensor(code)
    got, expected = native_op(x, weight, b, route), linear_op(x, weight, b, route)
    assert got.shape == expected.shape == (1, rows, 37) and got.dtype == dtype
    assert torch.equal(got, expected)


@pytest.fixture(scope="module")
def tiled_op(native_op):
    op, why = build.tiled_kernel()
    if op is None:
        pytest.skip(why)  # (a CPU without AVX2 and FMA: numba's kernel runs there, tested above)
    return op


def widths() -> list[int]:
    """The tiled kernel's widths this CPU runs (8 lanes with AVX2 and FMA; 16 too with AVX-512F)."""
    op, _ = build.load_linear()
    return list(torch.ops.lookahead_native.tiled_widths()) if op is not None else []


@pytest.fixture(params=[8, 16])
def lanes(request, tiled_op):
    if request.param not in widths():
        pytest.skip(f"this CPU does not run the tiled kernel in {request.param} lanes")
    return request.param


def test_tiled_width_is_the_widest_this_cpu_runs_and_the_default(tiled_op, lanes):
    chosen = torch.ops.lookahead_native.tiled_lanes()
    assert chosen == max(widths())  # (by the CPU alone: a timing decided it by noise, and the numbers with it)
    timings = torch.ops.lookahead_native.tiled_width_timings()
    assert len(timings) == (2 if len(widths()) == 2 else 0)  # reported where there are two
    assert all(t > 0 for t in timings)
    assert torch.ops.lookahead_native.tiled_lanes() == chosen  # (timing them chose nothing)
    x, w = torch.randn(5, 100), torch.randn(9, 100)
    assert torch.equal(tiled_op(x, w, None), tiled_op(x, w, None, chosen))


def test_tiled_worked_example(tiled_op, lanes):
    w = torch.tensor([[1.0, 2.0], [0.0, 1.0], [1.0, 0.0]])  # [O=3, I=2]
    x = torch.tensor([[1.0, 1.0], [2.0, 0.0]])  # [R=2, I=2]
    assert tiled_op(x, w, None, lanes).tolist() == [[3, 1, 1], [2, 0, 2]]
    assert tiled_op(x, w, torch.tensor([1.0, 0.0, -1.0]), lanes).tolist() == [[4, 1, 0], [3, 0, 1]]


def test_tiled_sums_lanes_then_tail_as_documented(tiled_op, lanes):
    """I = lanes + 3: one product a lane here; 16 lanes added upper eight onto lower eight, then eight
    lanes as ((0+4)+(2+6)) + ((1+5)+(3+7)); then the three of the tail in order: chosen so that any other
    order rounds differently in float32."""
    big, tiny = 2.0 ** 24, 1.0
    values = [big, tiny, -big] + [tiny] * (lanes - 3) + [tiny] * 3
    x, w = torch.tensor([values]), torch.ones(1, lanes + 3)
    sums = np.array(values[:lanes], dtype=np.float32)  # float32 sums
    if lanes == 16:
        sums = sums[:8] + sums[8:]
    expected = ((sums[0] + sums[4]) + (sums[2] + sums[6])) + ((sums[1] + sums[5]) + (sums[3] + sums[7]))
    assert expected == lanes - 3  # (big + 1 rounds to big)
    for value in values[lanes:]:
        expected = np.float32(expected + np.float32(value))
    assert tiled_op(x, w, None, lanes).item() == float(expected)
    assert float(expected) != float(np.float32(x.double().sum().item()))  # (the order matters for this input)


@pytest.mark.parametrize("inputs", [5, 8, 64, 1030])
@pytest.mark.parametrize("outputs", [1, 7, 37])
def test_tiled_rows_do_not_depend_on_the_others(tiled_op, lanes, inputs, outputs):
    """Every row count 1..KERNEL_ROWS_MAX takes other tiles (8 lanes: 6, 4, 3 weight rows, 4-row groups and
    their rest; 16 lanes: one weight row by up to 6 rows, two by 7-9 rows, 6 by 4-row groups and their
    rest): each row's products equal that row's alone to the bit, and the product to float32 precision."""
    torch.manual_seed(inputs * 100 + outputs)
    w, x = torch.randn(outputs, inputs), torch.randn(KERNEL_ROWS_MAX, inputs)
    alone = torch.cat([tiled_op(x[r:r + 1], w, None, lanes) for r in range(KERNEL_ROWS_MAX)])  # [R, O]
    for rows in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 16, KERNEL_ROWS_MAX):
        together = tiled_op(x[:rows], w, None, lanes)
        assert torch.equal(together, alone[:rows])
    many = x.repeat(5, 1)  # [5R, I]: past the op's blocks of 128 rows
    assert torch.equal(tiled_op(many, w, None, lanes), alone.repeat(5, 1))
    torch.testing.assert_close(alone, (x.double() @ w.double().t()).float(), rtol=1e-5, atol=1e-4)


def test_tiled_refuses_what_it_does_not_compute(tiled_op):
    with pytest.raises(RuntimeError, match="float32 CPU tensors"):
        tiled_op(torch.randn(2, 8, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64), None)
    with pytest.raises(RuntimeError, match="contiguous weight"):
        tiled_op(torch.randn(2, 8), torch.randn(8, 3).t(), None)
    with pytest.raises(RuntimeError, match="does not run the tiled kernel in 12 lanes"):
        tiled_op(torch.randn(2, 8), torch.randn(3, 8), None, 12)


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
