"""Few-row linears on the CPU (lookahead/fewrows.py): same products, other kernel, only where asked."""

from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F

from conftest import VOCAB, reference, tiny_model
from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.config import ConfigError
from lookahead.fewrows import FEW_ROWS_MAX, FewRowLinear, few_row_linear, few_rows


@pytest.mark.parametrize("rows", range(2, FEW_ROWS_MAX + 1))
@pytest.mark.parametrize("bias", [False, True])
def test_few_row_linear_is_the_same_product(rows, bias):
    torch.manual_seed(rows)
    x = torch.randn(1, rows, 24)  # [B, R, I]
    weight, b = torch.randn(40, 24), (torch.randn(40) if bias else None)
    out = few_row_linear(x, weight, b)
    assert out is not None and out.shape == (1, rows, 40)
    torch.testing.assert_close(out, F.linear(x, weight, b), rtol=1e-5, atol=1e-5)


def test_few_row_linear_leaves_other_shapes_to_torch():
    weight = torch.randn(8, 4)
    assert few_row_linear(torch.randn(1, 4), weight) is None  # one row: torch's matrix-vector kernel
    assert few_row_linear(torch.randn(FEW_ROWS_MAX + 1, 4), weight) is None  # many rows: torch's own
    assert few_row_linear(torch.randn(3, 4, dtype=torch.float64), weight) is None  # mixed dtypes: torch says so
    assert few_row_linear(torch.randn(3, 5), weight) is None  # a shape error stays torch's

    class Quantized(torch.Tensor):
        pass

    assert few_row_linear(torch.randn(3, 4), weight.as_subclass(Quantized)) is None  # a subclass keeps its own


def test_the_mode_reroutes_linear_inside_it_only():
    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 32)
    x = torch.randn(3, 16)
    with FewRowLinear():
        inside = layer(x)
    assert torch.equal(inside, few_row_linear(x, layer.weight, layer.bias))  # bit for bit: the rerouted kernel
    torch.testing.assert_close(inside, F.linear(x, layer.weight, layer.bias))
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))  # outside: untouched


def test_few_rows_enters_the_mode_only_for_few_cpu_rows_when_enabled():
    cpu = torch.device("cpu")
    assert isinstance(few_rows(cpu, 2, True), FewRowLinear)
    assert isinstance(few_rows(cpu, FEW_ROWS_MAX, True), FewRowLinear)
    for rows, enabled, device in [(1, True, cpu), (FEW_ROWS_MAX + 1, True, cpu), (3, False, cpu),
                                  (3, True, torch.device("cuda"))]:
        assert isinstance(few_rows(device, rows, enabled), nullcontext)


def test_config_checks_the_switch():
    with pytest.raises(ConfigError, match="few_row_matmul must be True or False"):
        LookaheadConfig(few_row_matmul=1)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_both_routings_are_exact(arch):
    model = tiny_model(arch)
    motif = torch.arange(3, 9)
    prompt = torch.cat([motif, motif, motif[:3]])[None]  # copies: multi-token steps of few rows
    ref = reference(model, prompt, 40, eos_token_id=[VOCAB + 1000])
    for enabled in (False, True):
        gen = LookaheadGenerator(model, config=LookaheadConfig(few_row_matmul=enabled, max_tree_nodes=5,
                                                               budget="fixed"))
        out = gen.generate(prompt, max_new_tokens=40, eos_token_id=[VOCAB + 1000])
        assert torch.equal(out, ref)
        rows = gen.last_stats.rows_per_step
        assert gen.target.few_row_matmul is enabled and max(rows) <= 6 and sum(r > 1 for r in rows) > 3
