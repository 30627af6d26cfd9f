"""The model's weights on transparent huge pages (Linux, CPU).

A decode step streams every weight once. In 4 KB pages that is one TLB entry per 4 KB (some 131,000 for
SmolLM2-135M's 538 MB in float32): the step walks page tables all along, the hardware prefetchers stop
at every page's end, and the entries the host's own work held between steps are gone. On 2 MB pages the
same weights take about 270 entries. Linux backs anonymous memory with 2 MB pages where asked to
(``madvise(MADV_HUGEPAGE)``, transparent huge pages "madvise" or "always"); torch's allocations are not
so advised, so ``move_to_huge_pages`` copies every CPU parameter, values unchanged, into one anonymous
private mapping advised so (2 MB-aligned, each parameter at a 64-byte boundary) and points the
parameters at it (``param.data``): tied weights stay tied, and the mapping lives as long as any
parameter views it. Values are unchanged, so the tokens are too; what it buys in speed is the machine's:
`lookahead bench` with and without --huge-pages measures it (results/RESULTS.md keeps the measurements).

Nothing is moved off Linux, where the kernel offers no transparent huge pages ("never"), for parameters
not on the CPU, or where the CPU parameters already lie as a move leaves them (``moved_here``: a model
handed to generator after generator is copied once).

Worked example: a model whose two linear layers hold 4 KB and 6 KB of float32 weights -> one mapping of
2 MB + 10 KB, the first weight at its 2 MB boundary, the second 4 KB on; both views of it, their values
as before; a second call moves nothing.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import torch

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


def padded(params: list[torch.nn.Parameter]) -> list[int]:
    """Each parameter's bytes, rounded up to ALIGN: its span in the mapping."""
    return [-(-p.numel() * p.element_size() // ALIGN) * ALIGN for p in params]


def moved_here(params: list[torch.nn.Parameter]) -> bool:
    """Whether the parameters sit as ``move_to_huge_pages`` lays them out: all in one storage of their
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
    """Copy the model's CPU parameters into one huge-page-advised mapping and point them at it; whether
    they were moved (see the module docstring for when nothing is)."""
    params = cpu_parameters(model)
    if not params or moved_here(params):
        return False
    spans = padded(params)
    arena = huge_bytes(sum(spans), setting)
    if arena is None:
        return False
    at = 0
    with torch.no_grad():
        for param, span in zip(params, spans):
            moved = arena[at:at + param.numel() * param.element_size()].view(param.dtype).view(param.shape)
            moved.copy_(param.data)
            param.data = moved  # the old storage goes with its last reference
            at += span
    return True


def on_huge_pages(model: torch.nn.Module) -> bool:
    """Whether the model's CPU parameters were moved (``move_to_huge_pages``; a curve measured on them is
    kept apart from one measured on 4 KB pages)."""
    return moved_here(cpu_parameters(model))
