"""Which product each GGUF block format multiplies with on this machine: float32 or int8, chosen by measurement.

``QuantizedLinear`` (model/quantized.py) computes either way in one fixed order per output, so both give a
row the same bits at every row count; they differ in what they compute. "float32" multiplies the
de-quantized weights (the float model's values) by the inputs: the output follows transformers on the
de-quantized model. "int8" rounds the inputs to 8 bits (per 256 inputs for the K formats, per 32 for the
others) and sums exact integer products, as llama.cpp does: a little further from the float model, and on a
CPU with AVX-512 VNNI several times less work per weight (native/quant8.cpp, native/quant8k.h; with AVX2,
native/quant8x16.h's byte products).

``choose_products`` times both on one layer of each format the model holds, at a decode step's row counts
(1 and 4 rows, interleaved, the median of several passes), and keeps int8 only where it is faster by
INT8_MARGIN. The choice is kept per machine (CPU model, thread count, format, shape and kernel build) in a JSON file
beside the cost curves, so a machine decodes a model the same way every run; delete the file to measure
again. A choice measured while other processes kept the cores busy (BUSY_LIMIT) is used for that run
only, as the cost curves are. A CPU with AVX2 but without VNNI runs the 16-row layout's integer products
(PACKED_FORMATS) in AVX2 and the others in plain C++ (a reference, never faster): there int8 is timed only for
a format every layer of which repacks, and the rest multiply in float32. Without AVX2 either: float32.

``choose_paths`` then times the layers int8 repacks sixteen rows at a time (Q4_1, Q5_0, Q8_0, Q4_K, Q6_K)
streaming from memory: whether asking for the weights PREFETCH bytes ahead pays, and from how many rows AMX
tiles beat VNNI where the CPU and OS offer them (on an AVX2 CPU without VNNI, the prefetch alone). Every path
gives the same bits; these choices set only the time, and are kept the same way.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable

import torch

from ..native.build import sources_digest
from .machine import cpu_name, cpu_snapshot, others_busy
from .quantized import FORMAT_NAMES, PRODUCTS, TILE_FORMATS, QuantizedEmbedding, QuantizedLinear, packs

# int8 is kept where its time is at most this share of float32's: the float model's own numbers are worth a
# little time (the integer products' text leaves transformers' greedy on the de-quantized model at near-ties;
# `python -m lookahead.benchmarks.llamacpp` reports how far each output follows it)
INT8_MARGIN = 0.8
ROWS = (1, 4)  # the step sizes timed: a plain step and a small tree
PASSES = 7  # timed passes per product and row count (interleaved); the median counts
STORE = "products.json"  # in the cost cache directory
BUSY_LIMIT = 0.25  # cores other processes kept busy while timing from which a choice is not kept
AMX_ROWS = (2, 4, 8, 16)  # row counts at which the packed int8 products are timed on VNNI and on AMX tiles
STREAM_BYTES = 256_000_000  # weight bytes a timed pass of them reads (more than a CPU's caches hold)
PREFETCH = (0, 4096)  # how far ahead packed products may ask for their weights (0: the hardware's prefetch alone)
VNNI, AVX2 = 1, 3  # qlinear_int8_x16's isa for the packed products' SIMD paths (packed_isa)


def set_products(model: torch.nn.Module, products: str | dict[int, str]) -> None:
    """Every ``QuantizedLinear`` of the model multiplies with ``products`` ("float32" or "int8"), or, given
    a {format code: products} map, with its format's entry (float32 where the map has none). An output head
    tied to a ``QuantizedEmbedding`` that repacks for int8 hands the embedding its 16-row layout, so the
    table is held once."""
    tables = {m.blocks.data_ptr(): m for m in model.modules()
              if isinstance(m, QuantizedEmbedding) and m.blocks is not None}
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            shared = tables.get(module.blocks.data_ptr()) if module.blocks is not None else None
            module.products = products if isinstance(products, str) else products.get(module.format_code, "float32")
            if shared is not None and module.packed is not None:
                shared.share_packed(module.packed)


def choose_products(model: torch.nn.Module, cache_dir: str = "~/.cache/lookahead/costs",
                    say: Callable[[str], None] | None = None) -> dict[int, str]:
    """{format code: "float32" | "int8"} for the formats of the model's ``QuantizedLinear`` layers, measured
    here (or read from ``cache_dir``'s STORE, where this machine measured it before; "" keeps nothing) and
    set on the layers. ``say`` gets one line per format measured."""
    layers = _largest_per_format(model)
    if not layers:
        return {}
    fast = _fast_int8_formats(model)
    chosen: dict[int, str] = {code: "float32" for code in layers if code not in fast}
    if not fast:
        set_products(model, chosen)
        return chosen
    path = os.path.join(os.path.expanduser(cache_dir), STORE) if cache_dir else ""
    kept = _read(path)
    measured = []
    before = cpu_snapshot()
    for code, layer in layers.items():
        if code not in fast:
            continue
        key = choice_key(layer)
        entry = kept.get(key)
        if entry is None or not _timed(entry):
            seconds = time_products(layer)
            entry = {"float32": seconds["float32"], "int8": seconds["int8"]}
            kept[key] = entry
            measured.append((code, layer, seconds["int8"] / seconds["float32"], _choice(entry)))
        entry["chosen"] = _choice(entry)  # (from the kept times: a changed INT8_MARGIN applies at once)
        chosen[code] = entry["chosen"]
    busy = others_busy(before, cpu_snapshot()) if measured else 0.0
    keeping = bool(path) and busy < BUSY_LIMIT
    for code, layer, ratio, choice in measured:
        if say is not None:
            where = f"kept in {path}" if keeping else \
                f"not kept: other processes kept {busy:.1f} cores busy" if path else "not kept: no cache directory"
            say(f"lookahead: {FORMAT_NAMES[code]} layers multiply in {choice} on this CPU (int8 products took "
                f"{ratio:.2f}x float32's time on a {layer.out_features}x{layer.in_features} layer; {where})")
    if keeping and measured:
        _write(path, kept)
    set_products(model, chosen)
    return chosen


def choose_paths(model: torch.nn.Module, cache_dir: str = "~/.cache/lookahead/costs",
                 say: Callable[[str], None] | None = None) -> dict[int, tuple[int, int]]:
    """{format code: (amx_rows, prefetch)} for the model's packed int8 layers (``QuantizedLinear.packed``): from
    how many rows they run on AMX tiles rather than VNNI (0: never, or no AMX tiles here), and how far ahead
    they ask for their weights (PREFETCH), each measured here streaming the format's layers (time_paths) or
    read from ``cache_dir``'s STORE as ``choose_products`` keeps its choice, and set on the layers. Only the
    time depends on them: every path gives the same bits. Empty where nothing is packed or the CPU has no
    VNNI (the plain C++ path)."""
    ops = torch.ops.lookahead_native
    packed = {code: layer for code, layer in _largest_per_format(model).items() if layer.packed is not None}
    if not packed or not packed_isa():
        return {}
    by_format = {code: [m for m in model.modules() if isinstance(m, QuantizedLinear) and m.packed is not None and
                        m.format_code == code] for code in packed}
    path = os.path.join(os.path.expanduser(cache_dir), STORE) if cache_dir else ""
    kept = _read(path)
    amx = bool(ops.qint8_amx()) and packed_isa() == VNNI  # (tiles are timed against the VNNI path)
    before, measured = cpu_snapshot(), []
    for code, layer in packed.items():
        key = f"{choice_key(layer)} | paths"  # (its format's largest layer names the model's shapes)
        tiles = amx and code in TILE_FORMATS
        if not _paths_timed(kept.get(key, {}), tiles):
            kept[key] = time_paths(by_format[code], tiles)
            measured.append(code)
    busy = others_busy(before, cpu_snapshot()) if measured else 0.0
    if path and measured and busy < BUSY_LIMIT:
        _write(path, kept)
    chosen = {code: (amx_rows(kept[f"{choice_key(layer)} | paths"]),
                     prefetch_bytes(kept[f"{choice_key(layer)} | paths"])) for code, layer in packed.items()}
    for module in model.modules():
        if isinstance(module, QuantizedLinear) and module.packed is not None:
            module.amx_rows, module.prefetch = chosen.get(module.format_code, (0, 0))
    for code in measured:
        if say is not None:
            rows, ahead = chosen[code]
            where = "kept" if path and busy < BUSY_LIMIT else "not kept"
            way = f"on AMX tiles from {rows} rows" if rows else \
                "never on AMX tiles (VNNI was faster at every row count)" if amx and code in TILE_FORMATS else \
                "on VNNI" if packed_isa() == VNNI else "on AVX2"
            say(f"lookahead: {FORMAT_NAMES[code]} int8 products run {way}, weights asked for "
                f"{f'{ahead} bytes ahead' if ahead else 'by the hardware alone'} on this CPU ({where})")
    return chosen


def packed_isa() -> int:
    """The instruction set the 16-row layout's int8 products run in here, as qlinear_int8_x16's ``isa``: VNNI
    (AVX-512 VNNI), AVX2 (AVX2, FMA and F16C), or 0 (neither: plain C++, never faster than float32)."""
    ops = torch.ops.lookahead_native
    return VNNI if ops.qint8_vnni() else AVX2 if ops.qint8_avx2() else 0


def _fast_int8_formats(model: torch.nn.Module) -> set[int]:
    """The block formats of the model's ``QuantizedLinear`` layers whose int8 products run in SIMD here: every
    format with VNNI; with AVX2 alone, those every layer of which repacks by 16 rows (``packs``); else none."""
    isa = packed_isa()
    layers = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    if isa == VNNI:
        return {m.format_code for m in layers}
    if isa == AVX2:
        return {code for code in {m.format_code for m in layers}
                if all(packs(m.format_code, m.in_features, m.out_features) for m in layers if m.format_code == code)}
    return set()


def time_paths(layers: list[QuantizedLinear], tiles: bool) -> dict[str, dict[str, float]]:
    """Seconds per pass over ``layers`` (packed, of one format) of their int8 products: one row on VNNI (AVX2
    without it) with each of PREFETCH ("prefetch"), and, where ``tiles``, VNNI ("vnni") against AMX tiles ("amx")
    at each of AMX_ROWS row counts; the median of PASSES interleaved passes, keyed by the count as text. The
    layers are taken until STREAM_BYTES: a decode step reads its weights from memory, not from a cache one layer
    fits in, and the paths compare differently there."""
    ops = torch.ops.lookahead_native
    chosen, total = [], 0
    for layer in sorted(layers, key=lambda m: -m.stored.numel()):
        if total >= STREAM_BYTES:
            break
        chosen.append(layer)
        total += layer.stored.numel()

    def inputs(rows: int) -> dict[int, torch.Tensor]:  # [R, I] per width
        return {layer.in_features: torch.randn(rows, layer.in_features, generator=torch.Generator().manual_seed(rows))
                for layer in chosen}

    def timed(rows: int, ways: dict[str, tuple[int, int]]) -> dict[str, float]:
        x = inputs(rows)
        samples: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(PASSES + 1):  # (the first pass warms what it can and is dropped)
            for name, (isa, ahead) in ways.items():
                start = time.perf_counter()
                for layer in chosen:
                    ops.qlinear_int8_x16(x[layer.in_features], layer.packed, layer.format_code, layer.in_features,
                                         None, isa, 0, ahead)
                samples[name].append(time.perf_counter() - start)
        return {name: statistics.median(values[1:]) for name, values in samples.items()}

    isa = packed_isa()
    times: dict[str, dict[str, float]] = {"prefetch": timed(1, {str(ahead): (isa, ahead) for ahead in PREFETCH})}
    if tiles:
        ahead = prefetch_bytes(times)
        times["vnni"], times["amx"] = {}, {}
        for rows in AMX_ROWS:
            both = timed(rows, {"vnni": (1, ahead), "amx": (2, ahead)})
            times["vnni"][str(rows)], times["amx"][str(rows)] = both["vnni"], both["amx"]
    return times


def _paths_timed(entry: dict, tiles: bool) -> bool:
    """Whether a kept entry holds the prefetch times and, where ``tiles``, both paths' at every AMX_ROWS count."""
    prefetch = isinstance(entry.get("prefetch"), dict) and \
        all(isinstance(entry["prefetch"].get(str(ahead)), float) for ahead in PREFETCH)
    return prefetch and (not tiles or _tiles_timed(entry))


def _tiles_timed(entry: dict) -> bool:
    """Whether a kept entry holds both paths' times at every row count of AMX_ROWS."""
    return all(isinstance(entry.get(name), dict) and
               all(isinstance(entry[name].get(str(rows)), float) for rows in AMX_ROWS) for name in ("vnni", "amx"))


def amx_rows(entry: dict) -> int:
    """The fewest rows from which AMX tiles were faster than VNNI at every timed count of AMX_ROWS (0: never, or
    not timed). Worked example: VNNI {2: 1, 4: 2, 8: 4, 16: 8}, AMX {2: 2, 4: 2.5, 8: 3, 16: 4} -> 8."""
    if not _tiles_timed(entry):
        return 0
    start = 0
    for rows in reversed(AMX_ROWS):
        if entry["amx"][str(rows)] >= entry["vnni"][str(rows)]:
            break
        start = rows
    return start


def prefetch_bytes(entry: dict) -> int:
    """The PREFETCH distance whose one-row pass was fastest (0 where not timed). Worked example: {"0": 2.0,
    "4096": 1.5} -> 4096."""
    timed = entry.get("prefetch")
    if not isinstance(timed, dict) or not timed:
        return 0
    return int(min(timed, key=lambda ahead: (timed[ahead], int(ahead))))


def choice_key(layer: QuantizedLinear) -> str:
    """Where a layer's choice is kept in STORE: this CPU, thread count, the layer's format and shape, and the
    kernels' build (a choice timed on other kernels is measured again)."""
    return f"{cpu_name()} | {torch.get_num_threads()} threads | {FORMAT_NAMES[layer.format_code]} " \
           f"{layer.out_features}x{layer.in_features} | build {sources_digest()}"


def _timed(entry: dict) -> bool:
    """Whether a kept entry holds both products' times."""
    return isinstance(entry, dict) and all(isinstance(entry.get(name), float) and entry[name] > 0
                                           for name in PRODUCTS)


def _choice(entry: dict) -> str:
    """int8 where its time is at most INT8_MARGIN of float32's, else float32."""
    return "int8" if entry["int8"] / entry["float32"] <= INT8_MARGIN else "float32"


def _largest_per_format(model: torch.nn.Module) -> dict[int, QuantizedLinear]:
    """The model's largest ``QuantizedLinear`` of each block format."""
    largest: dict[int, QuantizedLinear] = {}
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            best = largest.get(module.format_code)
            if best is None or module.stored.numel() > best.stored.numel():
                largest[module.format_code] = module
    return largest


def time_products(layer: QuantizedLinear) -> dict[str, float]:
    """Seconds per call of the layer's two products, summed over ROWS (the median of PASSES interleaved
    passes each)."""
    ops = torch.ops.lookahead_native
    blocks = layer.weight_blocks()
    product: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "float32": lambda x: ops.qlinear(x, blocks, layer.format_code, layer.in_features, None)}
    if packs(layer.format_code, layer.in_features, layer.out_features):  # (int8 runs on the 16-row layout)
        packed = layer.packed if layer.packed is not None else \
            ops.qpack16(blocks, layer.format_code, layer.in_features)
        product["int8"] = lambda x: ops.qlinear_int8_x16(x, packed, layer.format_code, layer.in_features, None)
    else:
        product["int8"] = lambda x: ops.qlinear_int8(x, blocks, layer.format_code, layer.in_features, None)
    total = {name: 0.0 for name in product}
    for rows in ROWS:
        x = torch.randn(rows, layer.in_features, generator=torch.Generator().manual_seed(rows))  # [R, I]
        samples: dict[str, list[float]] = {name: [] for name in product}
        for _ in range(PASSES + 1):  # (the first pass warms the caches and is dropped)
            for name, op in product.items():
                start = time.perf_counter()
                op(x)
                samples[name].append(time.perf_counter() - start)
        for name in product:
            total[name] += statistics.median(samples[name][1:])
    return total


def _read(path: str) -> dict:
    if not path:
        return {}
    try:
        with open(path) as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write(path: str, data: dict) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
        os.replace(temporary, path)
    except OSError:
        pass  # (an unwritable cache: the choice is measured again next run)
