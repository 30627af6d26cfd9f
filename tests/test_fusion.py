"""The fused ops of lookahead/native/fused.cpp and the trace rewrite that calls them (lookahead/model/fusion.py).

Each op must give the chain of ops it replaces to the bit (or run that chain where its recorded constants
are not what it fuses); a rewritten trace must decode exactly as model.generate, and where the rewrite
disagrees with the eager forward the trace as recorded serves instead.
"""

from __future__ import annotations

import mmap

import pytest
import torch
from conftest import VOCAB, reference
from gguf import GGMLQuantizationType as Q
from test_traced import NEW, prompt, traced_generator

from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.model import fusion, traced
from lookahead.model.attention import use_native
from lookahead.model.fewrows import routable_linears
from lookahead.model.quantized import QuantizedLinear, quantized_modules
from lookahead.model.traced import TracedForward
from lookahead.native import build

NO_EOS = [VOCAB + 1000]
needs_madvise = pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="this Python cannot advise huge pages")


@pytest.fixture(scope="module")
def ops():
    op, why = build.load_linear()
    assert op is not None and build.fused_ops(), f"the C++ ops could not be built here: {why}"
    return torch.ops.lookahead_native


def rms_chain(h, weight, eps, exponent=2, dims=(-1,), keepdim=True, mean_dtype=None, dtype=torch.float32):
    """transformers' LlamaRMSNorm after its input's cast, op by op."""
    variance = h.pow(exponent).mean(list(dims), keepdim=keepdim, dtype=mean_dtype)
    return weight * (h * torch.rsqrt(variance + eps)).to(dtype)


def rotate_chain(q, cos, sin):
    """apply_rotary_pos_emb's q * cos + rotate_half(q) * sin, op by op."""
    first, second = q[..., : q.shape[-1] // 2], q[..., q.shape[-1] // 2:]
    return q * cos + torch.cat((-second, first), dim=-1) * sin


def rms(ops, h, weight, eps, exponent=2, dims=(-1,), keepdim=True, mean_dtype=None, dtype=torch.float32):
    return ops.rms_norm(h, weight, eps, exponent, list(dims), keepdim, mean_dtype, 1, dtype)


def rotate(ops, q, cos, sin, end_b=None):
    half = q.shape[-1] // 2
    return ops.rotate_half(q, cos, sin, 3, 0, half, 1, 3, half, end_b, 1, -1, 1)


def bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


def decoded_exactly(gen, seed: int) -> TracedForward:
    """A decode of prompt ``seed`` through ``gen`` (a traced generator), asserted equal to model.generate's;
    the generator's traced forward."""
    ids = prompt(seed)
    out = gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS)
    assert torch.equal(out, reference(gen.model, ids, NEW, eos_token_id=NO_EOS)), f"prompt {seed}"
    assert gen.target.traced is not None
    return gen.target.traced


def test_worked_examples(ops):
    h, weight = torch.tensor([[3.0, 4.0]]), torch.tensor([1.0, 2.0])
    assert torch.allclose(rms(ops, h, weight, 0.0), torch.tensor([[0.848528, 2.262742]]))
    q = torch.tensor([1.0, 2.0, 3.0, 4.0]).view(1, 1, 1, 4)
    one = torch.ones(1, 1, 1, 4)
    assert rotate(ops, q, one, one).flatten().tolist() == [-2.0, -2.0, 4.0, 6.0]


@pytest.mark.parametrize("shape", [(1, 1, 576), (1, 7, 576), (4, 3, 64), (2, 5, 3, 16), (1, 1, 1)])
@pytest.mark.parametrize("eps", [1e-5, 1e-6, 0.1])
def test_rms_norm_gives_the_chains_bits(ops, shape, eps):
    torch.manual_seed(sum(shape))
    h, weight = torch.randn(shape) * 3, torch.randn(shape[-1])
    assert bits(rms(ops, h, weight, eps), rms_chain(h, weight, eps))
    assert bits(rms(ops, h, weight, eps, dims=(len(shape) - 1,)), rms_chain(h, weight, eps))
    wide = torch.randn(*shape[:-1], 2 * shape[-1])[..., ::2]  # (not contiguous)
    assert bits(rms(ops, wide, weight, eps), rms_chain(wide, weight, eps))


@pytest.mark.parametrize("variant", [{"exponent": 3}, {"exponent": 2.5}, {"dims": (0,)}, {"keepdim": False},
                                     {"mean_dtype": torch.float64}, {"dtype": torch.float64}])
def test_rms_norm_runs_the_chain_where_its_constants_differ(ops, variant):
    torch.manual_seed(1)
    h, weight = torch.randn(8, 8).abs() + 0.1, torch.randn(8)  # (square: the chain runs without keepdim too)
    got = rms(ops, h, weight, 1e-5, **variant)
    want = rms_chain(h, weight, 1e-5, **variant)
    assert bits(got, want)


def test_rms_norm_of_other_dtypes_is_the_chains(ops):
    h, weight = torch.randn(2, 16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    assert bits(rms(ops, h, weight, 1e-5, dtype=torch.float64), rms_chain(h, weight, 1e-5, dtype=torch.float64))
    h, weight = torch.randn(2, 16).bfloat16(), torch.randn(16).bfloat16()
    assert bits(rms(ops, h, weight, 1e-5, dtype=torch.bfloat16), rms_chain(h, weight, 1e-5, dtype=torch.bfloat16))


@pytest.mark.parametrize("batch,heads,rows,width,cos_batch", [(1, 9, 1, 64, 1), (1, 3, 7, 64, 1), (3, 2, 4, 16, 3),
                                                              (3, 2, 4, 16, 1), (2, 1, 1, 2, 2)])
def test_rotate_half_gives_the_chains_bits(ops, batch, heads, rows, width, cos_batch):
    torch.manual_seed(batch * 100 + rows)
    q = torch.randn(batch, rows, heads, width).transpose(1, 2)  # [A, H, Q, D] as a layer's view of its projection
    angles = torch.randn(cos_batch, 1, rows, width) * 5
    cos, sin = angles.cos(), angles.sin()
    assert bits(rotate(ops, q, cos, sin), rotate_chain(q, cos, sin))
    assert bits(rotate(ops, q.contiguous(), cos, sin), rotate_chain(q, cos, sin))


def test_rotate_half_runs_the_chain_where_its_constants_differ(ops):
    torch.manual_seed(3)
    q, cos, sin = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 8)
    # slices of another dimension (the rows): the chain's own result
    got = ops.rotate_half(q, cos, sin, 2, 0, 1, 1, 2, 1, None, 1, 2, 1)
    first, second = q[:, :, :1], q[:, :, 1:]
    assert bits(got, q * cos + torch.cat((-second, first), dim=2) * sin)
    # alpha 2, an odd width, cos over every head
    turned = torch.cat((-q[..., 4:], q[..., :4]), dim=-1) * sin
    assert bits(ops.rotate_half(q, cos, sin, 3, 0, 4, 1, 3, 4, None, 1, 3, 2), torch.add(q * cos, turned, alpha=2))
    odd = torch.randn(1, 2, 3, 7)
    odd_cos = torch.randn(1, 1, 3, 7)
    assert bits(ops.rotate_half(odd, odd_cos, odd_cos, 3, 0, 3, 1, 3, 3, None, 1, 3, 1),
                rotate_chain(odd, odd_cos, odd_cos))
    heads_cos = torch.randn(1, 2, 3, 8)
    assert bits(rotate(ops, q, heads_cos, heads_cos), rotate_chain(q, heads_cos, heads_cos))


def test_same_casts_are_dropped_and_others_kept():
    def cast(x):
        return x.to(torch.float32) * 2 + x.to(torch.float64).to(torch.float32)

    x = torch.randn(3)
    graph = torch.jit.trace(cast, x).graph.copy()
    assert fusion.drop_same_casts(graph) == 1  # float32 -> float32; float32 -> float64 -> float32 stay
    kinds = [node.kind() for node in graph.nodes()]
    assert kinds.count("aten::to") == 2
    assert torch.equal(torch._C._create_function_from_graph("cast", graph)(x), cast(x))


def test_shared_values_are_computed_once_and_the_function_is_the_same():
    """A trace repeats shape arithmetic per use (here: each view reads the size anew); ``shared`` leaves
    one of each, and the graph computes the same values."""
    def repeated(x):
        return x.view(x.size(0), -1) * 2 + x.view(x.size(0), -1) * 2

    x = torch.randn(3, 4)
    graph = torch.jit.trace(repeated, x).graph.copy()
    before = [node.kind() for node in graph.nodes()]
    fusion.shared(graph)
    after = [node.kind() for node in graph.nodes()]
    assert before.count("aten::size") == 2 and after.count("aten::size") == 1
    assert before.count("aten::view") == 2 and after.count("aten::view") == 1
    assert before.count("aten::mul") == 2 and after.count("aten::mul") == 1
    assert torch.equal(torch._C._create_function_from_graph("repeated", graph)(x), repeated(x))


def test_shared_keeps_every_write():
    """Two equal in-place writes are two writes (a cache written twice is not written once)."""
    def written(x, out):
        out.add_(x)
        out.add_(x)
        return out * 1

    x, out = torch.randn(3), torch.zeros(3)
    graph = torch.jit.trace(written, (x, out.clone())).graph.copy()
    fusion.shared(graph)
    assert [node.kind() for node in graph.nodes()].count("aten::add_") == 2
    mine = out.clone()
    assert torch.equal(torch._C._create_function_from_graph("written", graph)(x, mine), 2 * x)
    assert torch.equal(mine, 2 * x)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_fused_trace_decodes_as_generate(ops, arch):
    gen = traced_generator(arch)
    forwards = [decoded_exactly(gen, seed) for seed in range(2)][-1]
    assert forwards.traces and forwards.fusions, "no trace was rewritten"
    for key, rewrite in forwards.fusions.items():
        assert forwards.traces[key] is rewrite.function
        assert rewrite.chains["rms_norm"] > 0 and rewrite.chains["rotate_half"] > 0
        assert rewrite.nodes[1] < rewrite.nodes[0]
    assert any(route.endswith("traced") for route in gen.last_stats.routes)


def test_a_model_with_nothing_to_fuse_keeps_its_trace(ops):
    forwards = decoded_exactly(traced_generator("gpt2"), 2)
    assert forwards.traces
    assert all(sum(rewrite.chains.values()) == 0 for rewrite in forwards.fusions.values())


def int8_model(arch: str, kind) -> torch.nn.Module:
    """A tiny model whose linear layers are GGUF blocks with int8 products, as load_model gives the shipped
    files: no nn.Linear is left for the linear op to route."""
    from test_quantized import quantized_model

    model = quantized_model(arch, kind)
    for module in quantized_modules(model):
        if isinstance(module, QuantizedLinear):
            module.products = "int8"
    use_native(model)
    return model


@pytest.mark.parametrize("arch, kind", [("llama", Q.Q4_1), ("qwen2", Q.Q4_K)], ids=lambda v: getattr(v, "name", v))
def test_a_gguf_models_trace_is_fused_and_decodes_as_generate_and_the_plain_loop(ops, arch, kind):
    model = int8_model(arch, kind)
    assert not routable_linears(model)  # (the linears' own op is never loaded for it)
    never = [VOCAB + 1000]
    ids = torch.tensor([[5, 9, 14, 23, 5, 9, 14, 23, 5, 9, 14, 23, 5, 9]])
    ref = reference(model, ids, 40, eos_token_id=never)
    speculated = 0
    for config in (LookaheadConfig(traced_forward=True), LookaheadConfig(window=1, ngram=2, candidates=0)):
        gen = LookaheadGenerator(model, config=config)
        gen.target.traced.patience = 0.0
        assert torch.equal(gen.generate(ids, max_new_tokens=40, eos_token_id=never), ref)
        forwards = gen.target.traced
        assert forwards.fusions, "no trace was rewritten"
        for key, rewrite in forwards.fusions.items():
            assert forwards.traces[key] is rewrite.function
            assert rewrite.chains["rms_norm"] > 0 and rewrite.chains["rotate_half"] > 0
        assert any(route.endswith("traced") for route in gen.last_stats.routes)
        speculated += sum(gen.last_stats.accepted) - gen.last_stats.steps
    assert speculated > 0  # (the speculating configuration's rows went through the fused trace too)


def test_a_gguf_model_with_the_native_ops_off_keeps_its_trace_as_recorded(ops):
    model = int8_model("llama", Q.Q4_1)
    gen = LookaheadGenerator(model, config=LookaheadConfig(native_linear=False))
    gen.target.traced.patience = 0.0
    ids = torch.tensor([[5, 9, 14, 23, 5, 9, 14, 23, 5, 9]])
    never = [VOCAB + 1000]
    assert torch.equal(gen.generate(ids, max_new_tokens=16, eos_token_id=never),
                       reference(model, ids, 16, eos_token_id=never))
    assert gen.target.traced.traces and not gen.target.traced.fusions and not gen.target.traced.fuse


def test_a_rewrite_that_disagrees_leaves_the_recorded_trace(ops, monkeypatch):
    """A rewritten trace that is not the eager forward's to the bit is never used: the recorded one serves."""
    real = traced.agrees

    def fused_disagrees(eager, trace, inputs):
        if any(trace is rewrite.function for rewrite in made):
            return False
        return real(eager, trace, inputs)

    made: list = []
    original = traced.fused

    def recording(trace):
        rewrite = original(trace)
        if rewrite is not None:
            made.append(rewrite)
        return rewrite

    monkeypatch.setattr(traced, "agrees", fused_disagrees)
    monkeypatch.setattr(traced, "fused", recording)
    gen = traced_generator("llama")
    forwards = decoded_exactly(gen, 4)
    assert made, "nothing was rewritten: the test would be vacuous"
    assert forwards.traces and not forwards.fusions
    assert all(trace is not rewrite.function for trace in forwards.traces.values() for rewrite in made)
    assert any(route.endswith("traced") for route in gen.last_stats.routes)


def test_kv_write_writes_the_steps_slots_and_returns_the_views_attention_reads(ops):
    buffer = torch.zeros(2, 3, 2, 2, 10, 4)  # [2, L, A, H, C, D]
    keys, values = buffer.unbind(0)
    k, v = torch.randn(2, 2, 3, 4), torch.randn(2, 2, 3, 4)  # [A, H, Q, D]
    read_k, read_v = ops.kv_write(keys[1], values[1], k, v, torch.zeros(1).expand(5))
    assert read_k.shape == read_v.shape == (2, 2, 8, 4)
    assert torch.equal(buffer[0, 1, :, :, 5:8], k) and torch.equal(buffer[1, 1, :, :, 5:8], v)
    assert not buffer[:, 1, :, :, :5].any() and not buffer[:, 1, :, :, 8:].any() and not buffer[:, (0, 2)].any()
    assert read_k.data_ptr() == buffer[0, 1].data_ptr() and read_v.data_ptr() == buffer[1, 1].data_ptr()


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "float64", "strided last"])
def test_kv_write_copies_every_layout_a_step_brings(ops, layout):
    """Rows of D contiguous elements are copied directly (the trace's values come transposed, [A, Q, H, D]
    in memory); anything else (here a last dimension with stride 2) goes through copy_: the same slots."""
    dtype = torch.float64 if layout == "float64" else torch.float32
    buffer = torch.zeros(2, 2, 3, 9, 4, dtype=dtype)  # [2, A, H, C, D]
    k = torch.randn(2, 3, 2, 4, dtype=dtype)  # [A, H, Q, D]
    v = torch.randn(2, 3, 2, 4, dtype=dtype)
    if layout == "transposed":
        v = torch.randn(2, 2, 3, 4).transpose(1, 2)  # [A, H, Q, D] over [A, Q, H, D]
    if layout == "strided last":
        k = torch.randn(2, 3, 2, 8)[..., ::2]
    keys, values = buffer.unbind(0)
    read_k, read_v = ops.kv_write(keys, values, k, v, torch.zeros(1).expand(6))
    assert torch.equal(buffer[0, :, :, 6:8], k) and torch.equal(buffer[1, :, :, 6:8], v)
    assert not buffer[:, :, :, :6].any() and not buffer[:, :, :, 8:].any()
    assert torch.equal(read_k[:, :, 6:], k) and read_k.shape == (2, 3, 8, 4)


def test_a_trace_of_kv_write_follows_the_past(ops):
    """The past comes as a tensor's size, which a trace keeps a size (an int argument would be a constant)."""
    def step(buffer, k, v, past):
        keys, values = buffer.unbind(0)
        read_k, read_v = ops.kv_write(keys, values, k, v, past)
        return read_k.sum(2), read_v.sum(2)

    k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    trace = torch.jit.trace(step, (torch.zeros(2, 1, 2, 10, 4), k, v, torch.zeros(1).expand(5)))
    for past in (0, 2, 7):
        mine, theirs = torch.zeros(2, 1, 2, 10, 4), torch.zeros(2, 1, 2, 10, 4)
        want = step(mine, k, v, torch.zeros(1).expand(past))
        got = trace(theirs, k, v, torch.zeros(1).expand(past))
        assert torch.equal(mine, theirs) and all(torch.equal(a, b) for a, b in zip(want, got))
        assert torch.equal(theirs[0, :, :, past:past + 3], k)


def test_a_rewrite_that_raises_leaves_the_recorded_trace(ops, monkeypatch):
    """A rewritten trace that fails when run (say a fused op meets an argument it cannot take) is dropped
    like one that disagrees: the recorded trace is checked and serves."""
    original = traced.fused

    def broken(trace):
        rewrite = original(trace)
        if rewrite is None:
            return None

        def fails(*inputs):
            raise RuntimeError("a fused op could not run")

        return fusion.Fused(fails, rewrite.chains, rewrite.casts, rewrite.nodes)

    monkeypatch.setattr(traced, "fused", broken)
    gen = traced_generator("llama")
    forwards = decoded_exactly(gen, 5)
    assert forwards.traces and not forwards.fusions and not forwards.failures
    assert any(route.endswith("traced") for route in gen.last_stats.routes)


def packed_products(kind, outputs: list[int], inputs: int, back_to_back: bool, bias: bool = False):
    """Packed int8 weights of ``outputs`` rows each (one storage, each right after the one before, or each its
    own) and a traced function multiplying one input by each: (function, weights, biases)."""
    from test_quantized import random_blocks

    ops = torch.ops.lookahead_native
    packs = [ops.qpack16(torch.from_numpy(random_blocks(kind, o, inputs, seed=o + i)), int(kind), inputs)
             for i, o in enumerate(outputs)]
    if back_to_back:
        storage = torch.cat([p.reshape(-1) for p in packs])
        at, views = 0, []
        for p in packs:
            views.append(storage[at:at + p.numel()].view(p.shape))
            at += p.numel()
        packs = views
    biases = [torch.randn(o) for o in outputs] if bias else [None] * len(outputs)

    def products(x):
        return tuple(ops.qlinear_int8_x16(x, p, int(kind), inputs, b, -1, 0, 0) for p, b in zip(packs, biases))

    return torch.jit.trace(products, (torch.randn(1, 2, inputs),), check_trace=False), packs, biases


def product_calls(graph) -> int:
    return sum(node.kind() == "lookahead_native::qlinear_int8_x16" for node in graph.nodes())


@pytest.mark.parametrize("bias", [False, True])
def test_products_of_one_input_by_weights_back_to_back_become_one_call_with_the_same_bits(ops, bias):
    trace, _, _ = packed_products(Q.Q8_0, [64, 16, 32], 64, back_to_back=True, bias=bias)
    graph = trace.graph.copy()
    assert product_calls(graph) == 3
    assert fusion.merge_products(graph) == 2 and product_calls(graph) == 1
    merged = torch._C._create_function_from_graph("merged", graph)
    for rows in (1, 3, 17):
        x = torch.randn(2, rows, 64)
        expected, got = trace(x), merged(x)
        assert [tuple(t.shape) for t in got] == [(2, rows, 64), (2, rows, 16), (2, rows, 32)]
        assert all(bits(a, b) for a, b in zip(expected, got))


def test_products_whose_weights_lie_apart_stay_apart(ops):
    trace, _, _ = packed_products(Q.Q8_0, [64, 16, 32], 64, back_to_back=False)
    graph = trace.graph.copy()
    assert fusion.merge_products(graph) == 0 and product_calls(graph) == 3


def test_products_of_other_inputs_or_other_choices_stay_apart(ops):
    from test_quantized import random_blocks

    inputs = 64
    storage = torch.cat([ops.qpack16(torch.from_numpy(random_blocks(Q.Q8_0, 16, inputs, seed=s)), int(Q.Q8_0),
                                     inputs).reshape(-1) for s in range(3)])
    first, second, third = storage.view(3, 16 // 16, -1).unbind(0)

    def products(x, y):  # the first two read other inputs; the third asks for another path (AMX rows)
        return (ops.qlinear_int8_x16(x, first, int(Q.Q8_0), inputs, None, -1, 0, 0),
                ops.qlinear_int8_x16(y, second, int(Q.Q8_0), inputs, None, -1, 0, 0),
                ops.qlinear_int8_x16(y, third, int(Q.Q8_0), inputs, None, -1, 16, 0))

    trace = torch.jit.trace(products, (torch.randn(1, inputs), torch.randn(1, inputs)), check_trace=False)
    graph = trace.graph.copy()
    assert fusion.merge_products(graph) == 0 and product_calls(graph) == 3


@needs_madvise
def test_a_gguf_model_on_huge_pages_multiplies_its_projections_in_one_call(ops, tmp_path, monkeypatch):
    from lookahead.model import hugepages

    offered = tmp_path / "enabled"
    offered.write_text("always [madvise] never\n")
    monkeypatch.setattr(hugepages.move_to_huge_pages, "__defaults__", (offered,))
    model = int8_model("llama", Q.Q4_1)
    never = [VOCAB + 1000]
    ids = torch.tensor([[5, 9, 14, 23, 5, 9, 14, 23, 5, 9, 14, 23, 5, 9]])
    ref = reference(model, ids, 40, eos_token_id=never)
    gen = LookaheadGenerator(model, config=LookaheadConfig(traced_forward=True))
    assert hugepages.on_huge_pages(model)
    gen.target.traced.patience = 0.0
    assert torch.equal(gen.generate(ids, max_new_tokens=40, eos_token_id=never), ref)
    layers = model.config.num_hidden_layers
    (rewrite,) = gen.target.traced.fusions.values()
    assert rewrite.chains["products"] == 3 * layers  # q, k, v as one call and gate, up as one, in every layer
    assert sum(gen.last_stats.accepted) > gen.last_stats.steps  # (trees verified through it too)


@pytest.mark.parametrize("op", ["qlinear", "qlinear_int8"])
def test_products_of_unpacked_blocks_back_to_back_become_one_call(ops, op):
    from test_quantized import random_blocks

    inputs, outputs = 64, [24, 8]
    blocks = [torch.from_numpy(random_blocks(Q.Q5_1, o, inputs, seed=o)) for o in outputs]
    storage = torch.cat([b.reshape(-1) for b in blocks])
    first, second = storage[:blocks[0].numel()].view(blocks[0].shape), storage[blocks[0].numel():].view(blocks[1].shape)
    product = getattr(ops, op)

    def products(x):
        return product(x, first, int(Q.Q5_1), inputs, None, -1), product(x, second, int(Q.Q5_1), inputs, None, -1)

    trace = torch.jit.trace(products, (torch.randn(1, inputs),), check_trace=False)
    graph = trace.graph.copy()
    assert fusion.merge_products(graph) == 1
    assert sum(node.kind() == f"lookahead_native::{op}" for node in graph.nodes()) == 1
    merged = torch._C._create_function_from_graph("merged", graph)
    for rows in (1, 5):
        x = torch.randn(rows, inputs)
        assert all(bits(a, b) for a, b in zip(trace(x), merged(x)))
