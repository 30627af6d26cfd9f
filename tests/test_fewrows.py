"""Few-row linears on the CPU (lookahead/fewrows.py, lookahead/kernels/linear.py): same products,
other kernels, only where asked."""


import numba
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import VOCAB, reference, tiny_model
from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.config import ConfigError
from lookahead.model.fewrows import (KERNEL_ROWS_MAX, MM_ROWS_MAX, FewRowLinear, RoutedWeight, few_row_linear,
                                     onednn_available, pack_for_onednn)
from lookahead.model.routing import Route, Routing
from lookahead.kernels.linear import (BLOCK, WIDE_INPUTS, WIDE_ROWS, _rows_linear_narrow, _rows_linear_wide,
                                      linear_into, rows_linear)


def into(kernel):
    """``kernel`` (one that writes into a given ``out``) as a function of (w, x) returning out [R, O]."""
    def product(w, x):
        out = np.full((x.shape[0], w.shape[0]), np.nan, dtype=x.dtype)
        kernel(w, x, out)
        return out
    return product


@pytest.mark.parametrize("kernel", [rows_linear, into(linear_into), into(_rows_linear_narrow),
                                    into(_rows_linear_wide)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_linear_worked_example(kernel, dtype):
    w = np.array([[1, 2], [0, 1], [1, 0]], dtype=dtype)  # [O=3, I=2]
    x = np.array([[1, 1], [2, 0]], dtype=dtype)  # [R=2, I=2]
    out = kernel(w, x)
    assert out.dtype == dtype and out.tolist() == [[3, 1, 1], [2, 0, 2]]


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 8, WIDE_ROWS, 13, 16])
@pytest.mark.parametrize("outputs", [1, 4, 7])
def test_both_kernels_compute_every_block_and_remainder(rows, outputs):
    """Blocks of 4 rows (and outputs), and what is left over on either side, all summed right."""
    rng = np.random.default_rng(rows * 10 + outputs)
    w, x = rng.integers(-3, 4, (outputs, 5)).astype(np.float64), rng.integers(-3, 4, (rows, 5)).astype(np.float64)
    for kernel in (_rows_linear_narrow, _rows_linear_wide):
        assert np.array_equal(into(kernel)(w, x), x @ w.T)  # small integers: every order sums exactly


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 9])
def test_wide_kernel_computes_padding_rows_without_writing_them(rows):
    """x padded with zero rows to whole blocks, out as long as the real rows: only those are written."""
    rng = np.random.default_rng(rows)
    w, x = rng.integers(-3, 4, (7, 5)).astype(np.float32), rng.integers(-3, 4, (rows, 5)).astype(np.float32)
    padded = np.concatenate((x, np.zeros((-rows % BLOCK, 5), dtype=np.float32)))
    out = np.full((rows, 7), np.nan, dtype=np.float32)
    _rows_linear_wide(w, padded, out)
    assert np.array_equal(out, x @ w.T)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 7, 8, WIDE_ROWS, 64])
@pytest.mark.parametrize("inputs", [5, WIDE_INPUTS])
def test_rows_linear_picks_a_kernel_and_pads_to_whole_blocks(rows, inputs):
    """Long weight rows take the wide kernel from 3 rows, padded with zero rows; the padding never shows."""
    rng = np.random.default_rng(rows + inputs)
    w, x = rng.integers(-2, 3, (6, inputs)).astype(np.float32), rng.integers(-2, 3, (rows, inputs)).astype(np.float32)
    out = rows_linear(w, x)
    assert out.shape == (rows, 6) and np.array_equal(out, x @ w.T)


def test_rows_linear_keeps_nan_and_infinity():
    w = np.array([[1, 1], [1, 2]], dtype=np.float32)
    out = rows_linear(w, np.array([[np.inf, 1], [np.nan, 2]], dtype=np.float32))
    assert (out[0] == np.inf).all() and np.isnan(out[1]).all()


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 8, KERNEL_ROWS_MAX])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_few_row_linear_is_the_same_product(rows, bias, dtype):
    torch.manual_seed(rows)
    x = torch.randn(1, rows, 24, dtype=dtype)  # [B, R, I]
    weight, b = torch.randn(40, 24, dtype=dtype), (torch.randn(40, dtype=dtype) if bias else None)
    out = few_row_linear(x, weight, b)
    assert out is not None and out.shape == (1, rows, 40) and out.dtype == dtype
    torch.testing.assert_close(out, F.linear(x, weight, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 8, 33, MM_ROWS_MAX])
def test_other_dtypes_take_the_transposed_product(rows):
    torch.manual_seed(rows)
    x, weight, b = torch.randn(rows, 24).bfloat16(), torch.randn(40, 24).bfloat16(), torch.randn(40).bfloat16()
    out = few_row_linear(x, weight, b)
    assert out is not None and out.dtype == torch.bfloat16
    torch.testing.assert_close(out, F.linear(x, weight, b), rtol=2e-2, atol=2e-2)


def test_few_row_linear_leaves_other_cases_to_torch():
    weight = torch.randn(8, 4)
    assert few_row_linear(torch.randn(KERNEL_ROWS_MAX + 1, 4), weight) is None  # many rows: torch's own
    assert few_row_linear(torch.randn(MM_ROWS_MAX + 1, 4).bfloat16(), weight.bfloat16()) is None
    assert few_row_linear(torch.randn(3, 4, dtype=torch.float64), weight) is None  # mixed dtypes: torch says so
    assert few_row_linear(torch.randn(3, 5), weight) is None  # a shape error stays torch's
    assert few_row_linear(torch.randn(3, 8), weight.t()) is None  # a transposed (non-contiguous) weight
    assert few_row_linear(torch.randn(3, 4, requires_grad=True), weight) is None  # autograd must see it
    with torch.no_grad():
        assert few_row_linear(torch.randn(3, 4, requires_grad=True), weight) is not None

    class Quantized(torch.Tensor):
        pass

    assert few_row_linear(torch.randn(3, 4), weight.as_subclass(Quantized)) is None  # a subclass keeps its own


def test_the_mode_reroutes_linear_inside_it_only():
    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 32)
    x = torch.randn(3, 16)
    with torch.no_grad():
        linears = FewRowLinear(layer)
        with linears.routed():
            assert type(layer.weight) is RoutedWeight
            inside = layer(x)
        assert type(layer.weight) is torch.nn.Parameter  # put back
        # bit for bit: the kernel (float32: the tiled one, where it is built and the CPU runs it)
        assert torch.equal(inside, few_row_linear(x, layer.weight, layer.bias, tiled=linears.tiled))
        if linears.tiled is not None:
            assert torch.equal(inside, torch.ops.lookahead_native.tiled(x, layer.weight, layer.bias))
        numba_product = few_row_linear(x, layer.weight, layer.bias)
        with FewRowLinear(layer, native=False).routed():
            assert torch.equal(layer(x), numba_product)  # native off: numba's kernel
        torch.testing.assert_close(inside, F.linear(x, layer.weight, layer.bias))
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))  # outside: untouched


def test_the_mode_caps_numba_threads_at_torch_threads_and_restores_them():
    before, torch_threads = numba.get_num_threads(), torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with FewRowLinear(torch.nn.Linear(4, 4)).routed():
            assert numba.get_num_threads() == 1
        assert numba.get_num_threads() == before
    finally:
        torch.set_num_threads(torch_threads)


def test_config_checks_the_switch():
    with pytest.raises(ConfigError, match="few_row_matmul must be True or False"):
        LookaheadConfig(few_row_matmul=1)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_both_routings_are_exact(arch, monkeypatch):
    import lookahead.model.fewrows as fewrows

    calls = []

    def counted(w, x):
        calls.append(x.shape[0])
        return rows_linear(w, x)

    fewrows.load_linear()
    tiled, _ = fewrows.tiled_kernel()

    def counted_tiled(x, w, bias):
        calls.append(x.numel() // x.shape[-1])
        return tiled(x, w, bias)

    monkeypatch.setattr(fewrows, "rows_linear", counted)  # numba's kernel, or where the tiled one runs, that
    monkeypatch.setattr(fewrows, "tiled_kernel", lambda: (counted_tiled if tiled is not None else None, ""))
    model = tiny_model(arch)
    motif = torch.arange(3, 9)
    prompt = torch.cat([motif, motif, motif[:3]])[None]  # copies: multi-token steps of few rows
    ref = reference(model, prompt, 40, eos_token_id=[VOCAB + 1000])
    for enabled in (False, True):
        calls.clear()
        gen = LookaheadGenerator(model, config=LookaheadConfig(few_row_matmul=enabled, max_tree_nodes=5,
                                                               budget="fixed", traced_forward=False))  # (eager)
        route = Route(1, "kernel" if enabled else "torch")
        gen.target.routings[1] = Routing(np.array([1]), [route], np.array([[0.01]]))
        out = gen.generate(prompt, max_new_tokens=40, eos_token_id=[VOCAB + 1000])
        assert torch.equal(out, ref)
        rows = gen.last_stats.rows_per_step
        assert max(rows) <= 6 and sum(r > 1 for r in rows) > 3
        assert set(gen.last_stats.routes) == {route.label}  # every step ran the route set
        assert bool(calls) is enabled and (not enabled or max(calls) > 1)  # the kernel ran the decode's linears


def test_without_the_kernel_one_to_64_rows_go_through_w_times_x():
    torch.manual_seed(0)
    weight, bias = torch.randn(32, 16), torch.randn(32)
    for rows in (2, 3, 8, MM_ROWS_MAX):
        x = torch.randn(rows, 16)
        out = few_row_linear(x, weight, bias, kernel=False)
        assert torch.equal(out, torch.addmm(bias[:, None], weight, x.t()).t())  # W @ x^T, bit for bit
        torch.testing.assert_close(out, F.linear(x, weight, bias))
    x = torch.randn(1, 16)  # one row: as itself twice (torch's matrix-vector kernel is the slow one)
    out = few_row_linear(x, weight, bias, kernel=False)
    assert torch.equal(out, torch.addmm(bias[:, None], weight, x.repeat(2, 1).t())[:, :1].t())
    torch.testing.assert_close(out, F.linear(x, weight, bias))
    assert few_row_linear(torch.randn(MM_ROWS_MAX + 1, 16), weight, kernel=False) is None  # torch's own
    with torch.no_grad():
        layer = torch.nn.Linear(16, 32)
        x = torch.randn(3, 16)
        with FewRowLinear(layer).routed(kernel=False):
            inside = layer(x)
        assert torch.equal(inside, torch.addmm(layer.bias[:, None], layer.weight, x.t()).t())


needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN")


@needs_onednn
@pytest.mark.parametrize("rows", [1, 3, 9, 40])
@pytest.mark.parametrize("bias", [False, True])
def test_the_onednn_route_is_the_same_product_and_only_inside(rows, bias):
    torch.manual_seed(rows)
    layer = torch.nn.Linear(24, 40, bias=bias)
    x = torch.randn(1, rows, 24)  # [B, R, I]
    linears = FewRowLinear(layer)
    with torch.no_grad():
        with linears.routed(onednn=True):
            assert type(layer.weight) is RoutedWeight and layer.weight.packed is not None
            inside = layer(x)
        assert type(layer.weight) is torch.nn.Parameter  # put back
        torch.testing.assert_close(inside, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
        packed = linears.wrapped["onednn"][0].packed
        with linears.routed(onednn=True):
            assert linears.wrapped["onednn"][0].packed is packed  # packed once, on first use
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))  # outside: torch's own


def test_weights_oneDNN_cannot_take_stay_with_torch():
    assert pack_for_onednn(torch.randn(4, 4, dtype=torch.float64)) is None
    assert pack_for_onednn(torch.randn(4, 4).bfloat16()) is None
    layer = torch.nn.Linear(16, 8).double()
    x = torch.randn(3, 16, dtype=torch.float64)
    with torch.no_grad():
        with FewRowLinear(layer).routed(onednn=True):
            assert layer.weight.packed is None
            inside = layer(x)
    assert torch.equal(inside, torch.addmm(layer.bias[:, None], layer.weight, x.t()).t())  # the mm route's product


@needs_onednn
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_onednn_routing_is_exact(arch):
    model = tiny_model(arch)
    motif = torch.arange(3, 9)
    prompt = torch.cat([motif, motif, motif[:3]])[None]  # copies: multi-token steps of few rows
    ref = reference(model, prompt, 40, eos_token_id=[VOCAB + 1000])
    gen = LookaheadGenerator(model, config=LookaheadConfig(max_tree_nodes=5, budget="fixed"))
    route = Route(1, "onednn")
    gen.target.routings[1] = Routing(np.array([1]), [route], np.array([[0.01]]))
    out = gen.generate(prompt, max_new_tokens=40, eos_token_id=[VOCAB + 1000])
    assert torch.equal(out, ref)
    rows = gen.last_stats.rows_per_step
    assert sum(r > 1 for r in rows) > 3 and set(gen.last_stats.routes) == {"onednn x1"}
