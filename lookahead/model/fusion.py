"""A trace's graph with a decoder layer's chains of small ops replaced by one C++ op each.

A traced step (traced.py) replays every op transformers' forward ran, and on
the CPU each costs the TorchScript interpreter and torch's dispatcher a few
microseconds, whatever it computes: SmolLM2-135M replays some 1,900 tensor ops
a step besides its 211 linear layers. Two chains of every Llama-style layer
make up half of them:

- the RMS norm, ``weight * (h * rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)``
  (``RMS_NORM``), twice a layer and once at the end;
- the rotary embedding's half rotation, ``q * cos + cat(-q[..., D/2:], q[..., :D/2]) * sin``
  (``ROTATE_HALF``), for the queries and the keys of every layer, with the
  tensor arithmetic that finds D/2.

``fused`` rewrites a trace's graph (TorchScript's subgraph rewriter, on
patterns written in its IR) so that each such chain calls
``lookahead_native::rms_norm`` or ``::rotate_half`` (lookahead/native/fused.cpp),
which compute the chain's result to the bit, and drops the dtype casts that
cast float32 to float32. The rewriter matches the chain's ops, not their
constants: the ops are handed the constants as recorded and run the chain op
by op where those are not what they fuse. The rewritten trace is then checked
against the eager forward as every trace is (traced.py's ``agrees``), and where
it disagrees the trace as recorded serves instead.

Of the tested architectures (tiny models, tests/test_fusion.py and a run over all
of them), Llama, Qwen2/3, Phi-3, Granite, SmolLM3 and GLM-4 fuse both chains (GLM-4
its norms only), GPT-NeoX, Phi, StableLM, OLMo 1/2 and Gemma their rotary only;
GPT-2, OPT, GPT-BigCode, GPT-J, CodeGen and Cohere compute both otherwise
(LayerNorm, an interleaved rotary) and keep their trace as recorded, less its
same-dtype casts. The rewrite shrinks a step's graph (nodes counted by
``lookahead roofline``'s traced timing; what it saves is measured there).

A GGUF model's layers multiply through lookahead's block products (quantized.py), one call per
layer; the calls that read one input (a layer's query, key and value projections, an MLP's gate and
up projections) over weights that lie back to back in memory (hugepages.py lays them out so) become
one call over the joined weights (``merge_products``: the same outputs to the bit, the input quantized
once, the op's overhead paid once).

Every rewritten graph then has its repeated shape arithmetic computed once
(``shared``: TorchScript's constant propagation and common-subexpression
passes): the same ops, each computed once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# transformers' LlamaRMSNorm after its input's cast to float32 (%h: that cast's output, which the layer's
# residual also reads; the chain's own values are read by nothing else)
RMS_NORM = """
graph(%h, %exponent, %dims, %keepdim, %mean_dtype, %eps, %alpha, %dtype, %non_blocking, %copy, %format, %weight):
  %squared = aten::pow(%h, %exponent)
  %variance = aten::mean(%squared, %dims, %keepdim, %mean_dtype)
  %shifted = aten::add(%variance, %eps, %alpha)
  %inverse = aten::rsqrt(%shifted)
  %scaled = aten::mul(%h, %inverse)
  %cast = aten::to(%scaled, %dtype, %non_blocking, %copy, %format)
  %out = aten::mul(%weight, %cast)
  return (%out)"""

RMS_NORM_FUSED = """
graph(%h, %exponent, %dims, %keepdim, %mean_dtype, %eps, %alpha, %dtype, %non_blocking, %copy, %format, %weight):
  %epsilon : float = aten::Float(%eps)
  %out = lookahead_native::rms_norm(%h, %weight, %epsilon, %exponent, %dims, %keepdim, %mean_dtype, %alpha, %dtype)
  return (%out)"""

# apply_rotary_pos_emb's q * cos + rotate_half(q) * sin, rotate_half's halves found as size // 2 on tensors
ROTATE_HALF = """
graph(%q, %cos, %sin, %size_dim_a, %two_a, %dim_a, %start_a, %step_a, %size_dim_b, %two_b, %dim_b, %end_b,
      %step_b, %cat_dim, %alpha):
  %direct = aten::mul(%q, %cos)
  %size_a = aten::size(%q, %size_dim_a)
  %size_a_t = prim::NumToTensor(%size_a)
  %half_a_t = aten::floor_divide(%size_a_t, %two_a)
  %half_a = aten::Int(%half_a_t)
  %first = aten::slice(%q, %dim_a, %start_a, %half_a, %step_a)
  %size_b = aten::size(%q, %size_dim_b)
  %size_b_t = prim::NumToTensor(%size_b)
  %half_b_t = aten::floor_divide(%size_b_t, %two_b)
  %half_b = aten::Int(%half_b_t)
  %second = aten::slice(%q, %dim_b, %half_b, %end_b, %step_b)
  %negated = aten::neg(%second)
  %halves : Tensor[] = prim::ListConstruct(%negated, %first)
  %rotated = aten::cat(%halves, %cat_dim)
  %turned = aten::mul(%rotated, %sin)
  %out = aten::add(%direct, %turned, %alpha)
  return (%out)"""

ROTATE_HALF_FUSED = """
graph(%q, %cos, %sin, %size_dim_a, %two_a, %dim_a, %start_a, %step_a, %size_dim_b, %two_b, %dim_b, %end_b,
      %step_b, %cat_dim, %alpha):
  %size_a : int = aten::size(%q, %size_dim_a)
  %divisor_a : int = aten::Int(%two_a)
  %half_a : int = aten::floordiv(%size_a, %divisor_a)
  %size_b : int = aten::size(%q, %size_dim_b)
  %divisor_b : int = aten::Int(%two_b)
  %half_b : int = aten::floordiv(%size_b, %divisor_b)
  %out = lookahead_native::rotate_half(%q, %cos, %sin, %dim_a, %start_a, %half_a, %step_a, %dim_b, %half_b,
                                       %end_b, %step_b, %cat_dim, %alpha)
  return (%out)"""

REWRITES = (("rms_norm", RMS_NORM, RMS_NORM_FUSED), ("rotate_half", ROTATE_HALF, ROTATE_HALF_FUSED))

FLOAT32 = 6  # torch.float32 as a TorchScript ScalarType int


@dataclass(frozen=True)
class Fused:
    """A rewritten trace and what the rewrite did: how many chains each op replaced, casts dropped, and
    the graph's nodes before and after."""

    function: Any  # a torch.jit.ScriptFunction over the rewritten graph, called as the trace is
    chains: dict[str, int]
    casts: int
    nodes: tuple[int, int]


def fused(trace: Any) -> Fused | None:
    """``trace`` (a ScriptFunction from torch.jit.trace) with its RMS norms and half rotations as one op each,
    its float32-to-float32 casts dropped and its sibling block products merged (``chains["products"]``: the
    calls merged away); None where nothing matched or the rewrite cannot be made
    (the caller keeps the trace as recorded). The ops must be loaded (native/build.py's ``fused_ops``)."""
    graph = trace.graph.copy()
    before = _count(graph)
    try:
        chains = {}
        for name, pattern, replacement in REWRITES:
            torch._C._jit_pass_custom_pattern_based_rewrite_graph(pattern, replacement, graph)
            chains[name] = sum(node.kind() == f"lookahead_native::{name}" for node in graph.nodes())
        casts = drop_same_casts(graph)
        chains["products"] = merge_products(graph)
        shared(graph)
        graph.lint()
        if not any(chains.values()) and not casts and _count(graph) == before:
            return None
        function = torch._C._create_function_from_graph("lookahead_fused_step", graph)
    except Exception:  # noqa: BLE001  (a private TorchScript pass that fails here: the trace as recorded serves)
        return None
    return Fused(function, chains, casts, (before, _count(graph)))


def shared(graph: Any) -> None:
    """Fold what the graph's constants decide, compute each repeated value once, drop what nothing reads.

    A trace records a layer's shape arithmetic afresh for every layer and every use (a size read, turned
    into a tensor and back into an int four times; the rotary's cos and sin unsqueezed again in each
    layer; a norm's epsilon converted to a float in each norm). These are TorchScript's own passes over
    pure ops (alias analysis keeps anything that writes where it was), so no tensor op computes anything
    else: the graph only asks the interpreter less (SmolLM2-135M's step: 1,795 nodes to 1,134).
    """
    torch._C._jit_pass_constant_propagation(graph)
    torch._C._jit_pass_cse(graph)
    torch._C._jit_pass_dce(graph)


def drop_same_casts(graph: Any) -> int:
    """Remove every ``aten::to(x, float32, False, False, None)`` whose ``x`` is recorded as float32 (it
    returns ``x`` itself): its uses read ``x``. Returns how many were removed."""
    dropped = 0
    for node in list(graph.nodes()):
        if node.kind() != "aten::to" or node.inputsSize() != 5:
            continue
        source, *rest = list(node.inputs())
        kind = source.type()
        if not isinstance(kind, torch._C.TensorType) or kind.scalarType() != "Float":
            continue
        if [_constant(value) for value in rest] != [FLOAT32, False, False, None]:
            continue
        node.output().replaceAllUsesWith(source)
        node.destroy()
        dropped += 1
    return dropped


def _constant(value: Any) -> Any:
    """The constant ``value`` holds (a ``prim::Constant``'s), or a marker that matches no constant."""
    node = value.node()
    if node.kind() != "prim::Constant":
        return _NOT_CONSTANT
    return value.toIValue()


_NOT_CONSTANT = object()


def _count(graph: Any) -> int:
    """The graph's nodes other than constants."""
    return sum(node.kind() != "prim::Constant" for node in graph.nodes())


# The block products a GGUF layer runs (quantized.py): (x, weight rows, format, inputs, bias, the rest constants)
PRODUCTS = {"lookahead_native::qlinear_int8_x16": 16, "lookahead_native::qlinear_int8": 1,
            "lookahead_native::qlinear": 1}  # op -> outputs per row of its weight tensor


def merge_products(graph: Any) -> int:
    """Products of one input by weights that lie back to back in one storage, each one call, made one call
    over the joined weights, each product's output then a slice of the joined output; how many calls
    were merged away.

    A layer's query, key and value projections (and an MLP's gate and up projections) read the same
    input: each call quantizes that input again and pays the op's own overhead (its threads woken, its
    output allocated) for a few hundred outputs. Called once over all of them, every output is computed
    as before (each output's sum is its own: the same bits, whatever the outputs beside it), and the
    input is read once. The weights must be graph constants of one dtype and row width whose bytes follow
    each other in their storage (hugepages.py lays a model's weight buffers out so, in the modules' order);
    the other arguments (format, inputs, the kernel's choices) constants equal across the calls, and the
    biases all absent or all constants (joined). Calls whose weights lie apart are left as they are.

    Worked example: q = P(x, Wq) [.., 576], k = P(x, Wk) [.., 192], v = P(x, Wv) [.., 192], Wq Wk Wv back to
    back -> y = P(x, W) [.., 960], q = y[..., 0:576], k = y[..., 576:768], v = y[..., 768:960]."""
    groups: dict[tuple, list[tuple[Any, torch.Tensor, Any, int]]] = {}
    for index, node in enumerate(graph.nodes()):
        per_row = PRODUCTS.get(node.kind())
        if per_row is None:
            continue
        x, weight, *rest = list(node.inputs())
        values = [_constant(value) for value in (weight, *rest)]
        if any(value is _NOT_CONSTANT for value in values) or not isinstance(values[0], torch.Tensor):
            continue
        tensor, bias = values[0], values[3]
        if tensor.dim() != 2 or not tensor.is_contiguous() or not (bias is None or isinstance(bias, torch.Tensor)):
            continue
        key = (node.kind(), x.unique(), tensor.untyped_storage().data_ptr(), tensor.dtype, tensor.shape[1],
               bias is None, *(repr(value) for value in values[1:3]), *(repr(value) for value in values[4:]))
        groups.setdefault(key, []).append((node, tensor, bias, index))
    merged = 0
    for members in groups.values():
        for run in _back_to_back(members):
            if len(run) > 1:
                _merge(graph, run, PRODUCTS[run[0][0].kind()])
                merged += len(run) - 1
    return merged


def _back_to_back(members: list[tuple[Any, torch.Tensor, Any, int]]) -> list[list[tuple[Any, torch.Tensor, Any, int]]]:
    """The calls in runs whose weights follow each other in memory (each run in the weights' order)."""
    ordered = sorted(members, key=lambda member: member[1].data_ptr())
    runs: list[list[tuple[Any, torch.Tensor, Any, int]]] = []
    for member in ordered:
        last = runs[-1][-1][1] if runs else None
        if last is not None and last.data_ptr() + last.numel() * last.element_size() == member[1].data_ptr():
            runs[-1].append(member)
        else:
            runs.append([member])
    return runs


def _merge(graph: Any, run: list[tuple[Any, torch.Tensor, Any, int]], per_row: int) -> None:
    """One call over ``run``'s joined weights (a view of their storage, no copy) in place of its calls (each with
    its position in the graph), placed before the first of them; each call's output a slice of it."""
    nodes = [node for node, _, _, _ in run]
    first = min(run, key=lambda member: member[3])[0]
    tensors = [tensor for _, tensor, _, _ in run]
    rows = sum(int(tensor.shape[0]) for tensor in tensors)
    joined = tensors[0].new_empty(0).set_(tensors[0].untyped_storage(), tensors[0].storage_offset(),
                                          (rows, tensors[0].shape[1]), (tensors[0].shape[1], 1))
    biases = [bias for _, _, bias, _ in run]
    inputs = list(run[0][0].inputs())
    with graph.insert_point_guard(first):
        weight = graph.insertConstant(joined)
        bias = inputs[4] if biases[0] is None else graph.insertConstant(torch.cat(biases))
        call = graph.create(run[0][0].kind(), [inputs[0], weight, *inputs[2:4], bias, *inputs[5:]])
        graph.insertNode(call)
        call.output().setType(torch._C.TensorType.get())
        start = 0
        for node, tensor, _, _ in run:
            end = start + per_row * int(tensor.shape[0])
            part = graph.create("aten::slice", [call.output(), graph.insertConstant(-1), graph.insertConstant(start),
                                                graph.insertConstant(end), graph.insertConstant(1)])
            graph.insertNode(part)
            part.output().setType(node.output().type())
            node.output().replaceAllUsesWith(part.output())
            start = end
    for node in nodes:
        node.destroy()
