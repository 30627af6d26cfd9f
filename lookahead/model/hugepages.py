"""The model's weights on transparent huge pages (Linux, CPU).

A decode step streams every weight once. In 4 KB pages that is one TLB entry per 4 KB (some 131,000 for
SmolLM2-135M's 538 MB in float32): the step walks page tables all along, the hardware prefetchers stop
at every page's end, and the entries the host's own work held between steps are gone. On 2 MB pages the
same weights take about 270 entries. Linux backs anonymous memory with 2 MB pages where asked to
(``madvise(MADV_HUGEPAGE)``, transparent huge pages "madvise" or "always"); torch's allocations are not
so advised, so ``move_to_huge_pages`` copies the model's CPU weights, values unchanged, into one anonymous
private mapping advised so (2 MB-aligned, each tensor at a 64-byte boundary) and points the model at it:
every parameter (``param.data``), then the weights a GGUF model's layers hold as buffers (quantized.py:
their blocks, or the same repacked 16 rows at a time), in the order of the modules, so that the layers that
read one input (a layer's query, key and value projections) lie back to back where their sizes keep the
64-byte boundaries (fusion.py then multiplies them in one call). Tied weights stay tied (a buffer two
modules share is moved once and both point at the copy), and the mapping lives as long as any tensor views
it. Values are unchanged, so the tokens are too; what it buys in speed is the machine's:
`lookahead bench` with and without --huge-pages measures it (results/RESULTS.md keeps the measurements).

Nothing is moved off Linux, where the kernel offers no transparent huge pages ("never"), for tensors
not on the CPU, or where the CPU weights already lie as a move leaves them (``moved_here``: a model
handed to generator after generator is copied once).

Worked example: a model whose two linear layers hold 4 KB and 6 KB of float32 weights -> one mapping of
2 MB + 10 KB, the first weight at its 2 MB boundary, the second 4 KB on; both views of it, their values
as before; a second call moves nothing.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import torch

from .quantized import quantized_modules

HUGE_PAGE = 2 << 20  # bytes of an x86-64 transparent huge page
ALIGN = 64  # bytes: each parameter starts on a cache line
SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_pages_offered(setting: Path = SETTING) -> bool:
    """Whether this kernel backs advised anonymous memory with transparent huge pages (Linux, "always" or
    "madvise" chosen in ``setting``) and Python can advise it."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        chosen = setting.read_text()
    except OSError:
        return False
    return "[always]" in chosen or "[madvise]" in chosen


def cpu_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The model's distinct parameters that live in the CPU's memory (shared ones once)."""
    return [p for p in model.parameters() if p.device.type == "cpu" and not p.is_sparse]


def cpu_weight_buffers(model: torch.nn.Module) -> list[torch.Tensor]:
    """The distinct CPU tensors the model's GGUF layers hold their weights in (quantized.py's ``stored``: the
    blocks or their 16-row layout), in the order of the modules; shared ones once."""
    seen: set[int] = set()
    buffers = []
    for module in quantized_modules(model):
        stored = module.stored
        if stored.device.type == "cpu" and id(stored) not in seen:
            seen.add(id(stored))
            buffers.append(stored)
    return buffers


def cpu_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """What ``move_to_huge_pages`` moves: the CPU parameters, then the GGUF layers' weight buffers."""
    return [*cpu_parameters(model), *cpu_weight_buffers(model)]


def padded(params: list[torch.Tensor]) -> list[int]:
    """Each tensor's bytes, rounded up to ALIGN: its span in the mapping."""
    return [-(-p.numel() * p.element_size() // ALIGN) * ALIGN for p in params]


def moved_here(params: list[torch.Tensor]) -> bool:
    """Whether the tensors sit as ``move_to_huge_pages`` lays them out: all in one storage of their
    padded bytes plus a huge page, the first on a 2 MB boundary, each ALIGN after the one before (a
    model whose weights view one memory-mapped file, say, does not)."""
    if not params or len({p.untyped_storage().data_ptr() for p in params}) > 1:
        return False
    spans = padded(params)
    if params[0].untyped_storage().nbytes() != sum(spans) + HUGE_PAGE or params[0].data_ptr() % HUGE_PAGE:
        return False
    starts = [params[0].data_ptr() + sum(spans[:i]) for i in range(len(params))]
    return all(p.data_ptr() == start for p, start in zip(params, starts))


def huge_bytes(nbytes: int, setting: Path = SETTING) -> torch.Tensor | None:
    """[nbytes] uint8 in a fresh anonymous private mapping advised MADV_HUGEPAGE, starting on a 2 MB
    boundary and untouched (its pages fault in as 2 MB pages when first written), or None where the kernel
    offers no transparent huge pages or refuses the advice. The tensor (and any view of it) keeps the
    mapping alive."""
    if not huge_pages_offered(setting):
        return None
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        mapping.madvise(mmap.MADV_HUGEPAGE)  # before any page is touched
    except OSError:  # (a kernel built without them refuses the advice)
        mapping.close()
        return None
    arena = torch.frombuffer(mapping, dtype=torch.uint8)
    start = -arena.data_ptr() % HUGE_PAGE
    return arena[start:start + nbytes]


def move_to_huge_pages(model: torch.nn.Module, setting: Path = SETTING) -> bool:
    """Copy the model's CPU weights (``cpu_weights``) into one huge-page-advised mapping and point the model at
    it; whether they were moved (see the module docstring for when nothing is)."""
    params, buffers = cpu_parameters(model), cpu_weight_buffers(model)
    weights = [*params, *buffers]
    if not weights or moved_here(weights):
        return False
    spans = padded(weights)
    arena = huge_bytes(sum(spans), setting)
    if arena is None:
        return False
    at = 0
    copies: dict[int, torch.Tensor] = {}  # id of a buffer -> its copy
    with torch.no_grad():
        for weight, span in zip(weights, spans):
            moved = arena[at:at + weight.numel() * weight.element_size()].view(weight.dtype).view(weight.shape)
            moved.copy_(weight.data)
            if isinstance(weight, torch.nn.Parameter):
                weight.data = moved  # the old storage goes with its last reference
            else:
                copies[id(weight)] = moved
            at += span
    for module in model.modules():  # every slot holding a moved buffer (a tied head's layout: two modules)
        for name, buffer in module._buffers.items():
            if buffer is not None and id(buffer) in copies:
                module._buffers[name] = copies[id(buffer)]
    return True


def on_huge_pages(model: torch.nn.Module) -> bool:
    """Whether the model's CPU weights were moved (``move_to_huge_pages``; a curve measured on them is
    kept apart from one measured on 4 KB pages)."""
    return moved_here(cpu_weights(model))
