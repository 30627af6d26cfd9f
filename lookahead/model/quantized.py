"""Linear layers and embeddings whose weights stay in a GGUF block format (native/quant.cpp computes with them).

``QuantizedLinear`` stands in for an ``nn.Linear`` and ``QuantizedEmbedding``
for an ``nn.Embedding`` of a transformers model: each holds its weight as the
GGUF file's blocks (``blocks`` [O, row bytes], uint8, one row of the weight
per row) and de-quantizes inside ``lookahead_native::qlinear`` /
``::qrows``. The de-quantized values are the float32 values the ``gguf``
package's ``dequantize`` gives, and every output is summed in one fixed order
(native/quant.cpp), so a row's result has the same bits at any row count, in
any batch, on any thread count and on every instruction set the kernel runs
(AVX-512F, AVX2 with FMA, plain C++). The model stays a transformers model:
``model.generate`` runs through the same modules and is the reference that
lookahead's output equals.

Inputs in another float dtype are computed in float32 and cast back. The
modules run on the CPU only; ``load_model(weights="dequantized")`` gives the
float weights for other devices.

Worked example: a Q8_0 row with d = 0.5 and q = [2, -4, 0, ...] holds the weights [1, -2, 0, ...];
``QuantizedLinear`` over it maps x = [1, 1, 0, ...] to [-1].
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import torch

from ..errors import ModelLoadError

# GGML type codes (gguf.GGMLQuantizationType) the kernel reads, by name; block (weights, bytes) each
FORMATS: dict[str, int] = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
BLOCKS: dict[int, tuple[int, int]] = {2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
                                      12: (256, 144), 13: (256, 176), 14: (256, 210)}
FORMAT_NAMES = {code: name for name, code in FORMATS.items()}
# How QuantizedLinear multiplies: "float32", the de-quantized weights (gguf's values) by the inputs in float32
# fused multiply-adds (native/quant.cpp); "int8", the weights' integers by the inputs quantized to int8 (per
# 256 for the K formats, per 32 for the others) in exact integer sums, as llama.cpp computes (native/quant8.cpp,
# native/quant8k.h). Either in one fixed order: a row's bits do not depend on the step's other rows.
# model/products.py chooses between them per machine.
PRODUCTS = ("float32", "int8")
# Formats whose int8 products run on the weights repacked sixteen rows at a time (native/quant8x16.h, quant8x16s.h):
# a layer of one of them with a multiple of 16 outputs holds ``packed`` instead of ``blocks`` while it multiplies
# in int8 (the same bytes, rearranged losslessly; ``blocks`` comes back byte for byte when it multiplies in float32)
PACKED_FORMATS = (3, 6, 8, 12, 14)  # Q4_1, Q5_0, Q8_0 (native/quant8x16s.h), Q4_K, Q6_K (native/quant8x16.h)
TILE_FORMATS = PACKED_FORMATS  # the packed formats whose int8 products also run on AMX tiles
TILES_ROWS_MIN = 64  # a sequence's rows from which a forward (a prefill) goes through de-quantized tiles (kernel_only)
TILE_OUTPUTS = 256  # weight rows de-quantized at a time there (1.5 MB at 1536 inputs)


def row_bytes(format_code: int, inputs: int) -> int:
    """Bytes a row of ``inputs`` weights takes in the format (inputs a multiple of its block)."""
    weights, size = BLOCKS[format_code]
    return inputs // weights * size


def takes(format_code: int, inputs: int) -> bool:
    """Whether the kernel computes with a row of ``inputs`` weights in this format."""
    return format_code in BLOCKS and inputs > 0 and inputs % BLOCKS[format_code][0] == 0


def packs(format_code: int, in_features: int, out_features: int) -> bool:
    """Whether int8 products of this layer run on the 16-row layout (PACKED_FORMATS)."""
    return format_code in PACKED_FORMATS and in_features % BLOCKS[format_code][0] == 0 and out_features % 16 == 0


def _load_native() -> None:
    """Build or load lookahead's C++ ops (native/build.py) where this process has not yet, naming why not."""
    from ..native.build import load_linear

    op, failure = load_linear()
    if op is None:
        raise ModelLoadError(f"lookahead's C++ kernel, which GGUF blocks compute with, cannot be built here: "
                             f"{failure}; load the model with weights='dequantized' (--weights dequantized)")


def _cpu_only(module: torch.nn.Module, x: torch.Tensor) -> None:
    if x.device.type != "cpu":
        raise ModelLoadError(f"{type(module).__name__} holds GGUF blocks that lookahead's kernel reads on the CPU "
                             f"only, got an input on {x.device}: load the model with weights='dequantized' "
                             f"(--weights dequantized) to run it on another device")


class QuantizedLinear(torch.nn.Module):
    """An ``nn.Linear`` whose weight [O, I] is kept as GGUF blocks [O, row bytes]: y [..., O] = x [..., I] W^T + b."""

    blocks: torch.Tensor | None  # [O, row bytes] uint8 (None while ``packed`` holds them)
    packed: torch.Tensor | None  # [O / 16, I / 256 * chunk bytes] uint8: int8 products of PACKED_FORMATS

    def __init__(self, blocks: torch.Tensor, format_code: int, in_features: int, out_features: int,
                 bias: torch.Tensor | None = None, products: str = "float32") -> None:
        super().__init__()
        if not takes(format_code, in_features) or tuple(blocks.shape) != (out_features,
                                                                          row_bytes(format_code, in_features)):
            raise ValueError(f"blocks {tuple(blocks.shape)} do not hold a [{out_features}, {in_features}] weight "
                             f"in {FORMAT_NAMES.get(format_code, format_code)}")
        self.in_features, self.out_features, self.format_code = in_features, out_features, format_code
        self.tiles = True  # many rows through de-quantized tiles and torch's product (cleared by ``kernel_only``)
        # the row count from which packed int8 products run on AMX tiles (0: never; model/products.py measures
        # it): the same bits as the VNNI path, so only the time depends on it
        self.amx_rows = 0
        self.prefetch = 0  # bytes ahead the packed products ask for their weights (measured as amx_rows is)
        self.register_buffer("blocks", blocks.contiguous(), persistent=False)
        self.register_buffer("packed", None, persistent=False)
        self.bias = torch.nn.Parameter(bias, requires_grad=False) if bias is not None else None
        self._products = "float32"
        self.products = products

    @property
    def products(self) -> str:
        """"float32" or "int8" (PRODUCTS); setting it to int8 repacks a PACKED_FORMATS layer's blocks, setting it
        back restores them."""
        return self._products

    @products.setter
    def products(self, value: str) -> None:
        if value not in PRODUCTS:
            raise ValueError(f"products must be one of {', '.join(PRODUCTS)}, got {value!r}")
        self._products = value
        if value == "int8" and packs(self.format_code, self.in_features, self.out_features):
            if self.packed is None:
                _load_native()
                self.packed = torch.ops.lookahead_native.qpack16(self.weight_blocks(), self.format_code,
                                                                  self.in_features)
                self.blocks = None
        elif self.packed is not None:
            self.blocks = self.weight_blocks()
            self.packed = None

    def weight_blocks(self) -> torch.Tensor:
        """The GGUF blocks [O, row bytes] (unpacked from ``packed`` where that holds them: a new tensor)."""
        if self.blocks is not None:
            return self.blocks
        assert self.packed is not None
        return torch.ops.lookahead_native.qunpack16(self.packed, self.format_code, self.in_features)

    @property
    def stored(self) -> torch.Tensor:
        """The tensor that holds the weight's bytes (``blocks`` or ``packed``)."""
        stored = self.blocks if self.blocks is not None else self.packed
        assert stored is not None
        return stored

    @property
    def format_name(self) -> str:
        return FORMAT_NAMES[self.format_code]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _cpu_only(self, x)
        dtype = x.dtype
        bias = self.bias.float() if self.bias is not None else None
        # (a sequence's own rows decide, x [..., T, I]: a prompt prefilled beside others takes the path it takes
        # alone, not the batch's total)
        if self.tiles and self.products == "float32" and x.dim() >= 2 and x.shape[-2] >= TILES_ROWS_MIN:
            out = self._through_tiles(x.float(), bias)
            return out if dtype == torch.float32 else out.to(dtype)
        if self.packed is not None:
            out = torch.ops.lookahead_native.qlinear_int8_x16(x.float(), self.packed, self.format_code,
                                                              self.in_features, bias, -1, self.amx_rows,
                                                              self.prefetch)
        else:
            product = torch.ops.lookahead_native.qlinear_int8 if self.products == "int8" else \
                torch.ops.lookahead_native.qlinear
            out = product(x.float(), self.blocks, self.format_code, self.in_features, bias)
        return out if dtype == torch.float32 else out.to(dtype)

    def _through_tiles(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., I] W^T (+ bias) with W de-quantized TILE_OUTPUTS rows at a time and multiplied by torch's
        matrix product: a prompt's many rows share each tile's de-quantizing (``kernel_only``)."""
        flat = x.reshape(-1, self.in_features)  # [R, I]
        out = torch.empty(flat.shape[0], self.out_features, dtype=torch.float32)  # [R, O]
        for start in range(0, self.out_features, TILE_OUTPUTS):
            tile = torch.ops.lookahead_native.qdequantize(self.stored[start:start + TILE_OUTPUTS], self.format_code,
                                                          self.in_features)  # [t, I] (float32 products: blocks)
            out[:, start:start + tile.shape[0]] = flat @ tile.t()  # [R, t]
        if bias is not None:
            out += bias
        return out.view(*x.shape[:-1], self.out_features)

    def dequantized(self) -> torch.Tensor:
        """The weight [O, I] as float32 (a new tensor)."""
        return torch.ops.lookahead_native.qdequantize(self.weight_blocks(), self.format_code, self.in_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, format={self.format_name}, " \
               f"bias={self.bias is not None}, products={self.products}"


class QuantizedEmbedding(torch.nn.Module):
    """An ``nn.Embedding`` whose table [V, D] is kept as GGUF blocks: ids [...] -> float32 rows [..., D]
    (times ``embed_scale`` where the module it stands in for scaled its rows, as Gemma's does)."""

    blocks: torch.Tensor | None  # [V, row bytes] uint8 (None while ``packed`` holds them)
    packed: torch.Tensor | None  # a tied output head's 16-row layout of the same table (``share_packed``)

    def __init__(self, blocks: torch.Tensor, format_code: int, num_embeddings: int, embedding_dim: int,
                 padding_idx: int | None = None, embed_scale: torch.Tensor | None = None) -> None:
        super().__init__()
        if not takes(format_code, embedding_dim) or tuple(blocks.shape) != (num_embeddings,
                                                                            row_bytes(format_code, embedding_dim)):
            raise ValueError(f"blocks {tuple(blocks.shape)} do not hold a [{num_embeddings}, {embedding_dim}] table "
                             f"in {FORMAT_NAMES.get(format_code, format_code)}")
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.format_code = format_code
        self.register_buffer("blocks", blocks.contiguous(), persistent=False)
        self.register_buffer("packed", None, persistent=False)
        self.embed_scale: torch.Tensor | None
        self.register_buffer("embed_scale", embed_scale, persistent=False)

    @property
    def format_name(self) -> str:
        return FORMAT_NAMES[self.format_code]

    @property
    def stored(self) -> torch.Tensor:
        """The tensor that holds the table's bytes (``blocks`` or ``packed``)."""
        stored = self.blocks if self.blocks is not None else self.packed
        assert stored is not None
        return stored

    def share_packed(self, packed: torch.Tensor) -> None:
        """Read the table from a tied output head's 16-row layout of it (model/products.py's ``set_products``),
        letting go of ``blocks``: one copy of the table in memory."""
        self.packed, self.blocks = packed, None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        _cpu_only(self, ids)
        ops = torch.ops.lookahead_native
        if self.packed is None:
            rows = ops.qrows(self.blocks, ids, self.format_code, self.embedding_dim)
        else:  # (the groups of 16 rows the ids fall in, unpacked to blocks, then their rows as qrows reads them)
            flat = ids.reshape(-1).long()  # [K]
            if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.num_embeddings):
                bad = flat[(flat < 0) | (flat >= self.num_embeddings)][0]
                raise RuntimeError(f"lookahead_native::qrows: id {int(bad)} is out of range [0, "
                                   f"{self.num_embeddings})")
            groups, where = torch.unique(flat // 16, return_inverse=True)  # [G], [K]
            blocks = ops.qunpack16(self.packed[groups].contiguous(), self.format_code, self.embedding_dim)
            rows = ops.qrows(blocks, where * 16 + flat % 16, self.format_code,
                             self.embedding_dim).view(*ids.shape, self.embedding_dim)
        return rows if self.embed_scale is None else rows * self.embed_scale.to(torch.float32)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, format={self.format_name}"


@contextmanager
def kernel_only(layers: list[QuantizedLinear]) -> Iterator[None]:
    """Inside, ``layers`` compute every row count through their kernel, never through tiles: lookahead's
    decode steps (``Target.step``), whose rows must get the bits a one-row step gives them. Outside, a
    forward of sequences of TILES_ROWS_MIN rows or more with float32 products (a prompt's prefill, lookahead's or
    ``model.generate``'s alike) goes through de-quantized tiles and torch's matrix product: compute-bound
    work, where the few-row kernel would de-quantize every weight again for every TILE rows. The tiles sum
    in another order than the kernel, the same in every prefill, so a prompt's cache holds the same bits
    whoever prefills it."""
    for layer in layers:
        layer.tiles = False
    try:
        yield
    finally:
        for layer in layers:
            layer.tiles = True


def quantized_linears(model: torch.nn.Module) -> list[QuantizedLinear]:
    """The model's ``QuantizedLinear`` layers."""
    return [m for m in model.modules() if isinstance(m, QuantizedLinear)]


def quantized_modules(model: torch.nn.Module) -> list[QuantizedLinear | QuantizedEmbedding]:
    """The model's modules that hold GGUF blocks."""
    return [m for m in model.modules() if isinstance(m, QuantizedLinear | QuantizedEmbedding)]


def weights_summary(model: torch.nn.Module) -> str:
    """One line on how the model holds its weights: the block formats and their bytes, or 'float'."""
    modules = quantized_modules(model)
    if not modules:
        return "float weights"
    counts: dict[str, int] = {}
    seen: set[int] = set()
    total = 0
    packed = 0
    for module in modules:
        counts[module.format_name] = counts.get(module.format_name, 0) + 1
        stored = module.stored
        packed += isinstance(module, QuantizedLinear) and module.packed is not None
        if stored.data_ptr() not in seen:  # (a tied output head shares its embedding's blocks)
            seen.add(stored.data_ptr())
            total += stored.numel()
    formats = ", ".join(f"{count} {name}" for name, count in sorted(counts.items()))
    products = sorted({m.products for m in modules if isinstance(m, QuantizedLinear)})
    ways = sorted({(m.format_code, m.amx_rows, m.prefetch) for m in modules if isinstance(m, QuantizedLinear) and
                   m.packed is not None})
    how = "; ".join(f"{FORMAT_NAMES[code]}" + (f" on AMX tiles from {rows} rows" if rows else "") +
                    (f" prefetching {ahead} B" if ahead else "") for code, rows, ahead in ways)
    repacked = f", {packed} repacked by 16 rows ({how})" if packed else ""
    return f"GGUF blocks as shipped ({formats}; {total / 1e6:.0f} MB; {'/'.join(products)} products{repacked})"


def embedding_facts(model: torch.nn.Module) -> tuple[torch.device, torch.dtype, int]:
    """(device, dtype of what it returns, rows) of the model's input embedding, float or quantized."""
    embedding = model.get_input_embeddings()  # type: ignore[operator]
    if isinstance(embedding, QuantizedEmbedding):
        return torch.device("cpu"), torch.float32, embedding.num_embeddings  # (the kernel's device)
    weight = cast(torch.Tensor, embedding.weight)  # [V, D]
    return weight.device, weight.dtype, int(weight.shape[0])
