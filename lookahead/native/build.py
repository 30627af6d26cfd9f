"""Build and load lookahead's C++ ops (linear.cpp, fused.cpp) with torch's extension builder, once per machine.

``torch.utils.cpp_extension.load`` compiles the source with the C++ compiler
torch was built for (ninja drives it), keeps the library in its own cache
(``~/.cache/torch_extensions``, one build per source and torch version) and
loads it into the process, which registers ``torch.ops.lookahead_native``.
The first build on a machine takes 15-30 s; later processes load the built
library in well under a second. Where it cannot be built (no compiler, no
ninja, a GPU-only build of torch without CPU headers), ``load_linear``
says why and lookahead keeps its Python op (model/fewrows.py), which computes
the same products with more overhead per call.

Builders in several processes at once (a test run's workers) wait for one
another on a lock the OS releases when a process dies, so a build killed
half-way never leaves the others waiting on torch's own lock file.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from pathlib import Path

import torch
from filelock import FileLock

from ..kernels.threads import start_numba_threads
from .entry import entry_points

NAME = "lookahead_native"  # the library's name and its ops' namespace (linear.cpp's TORCH_LIBRARY)
SOURCES = [Path(__file__).with_name(name) for name in ("linear.cpp", "fused.cpp", "quant.cpp", "quant8.cpp")]
# included by the sources: part of a build's identity
HEADERS = [Path(__file__).with_name(name) for name in ("quant_formats.h", "quant8k.h", "quant8x16.h", "quant8x16s.h")]
# -ffp-contract=off: no multiply and add fused unless written so (fused.cpp's ops round as torch's ops do)
CFLAGS = ["-O3", "-fopenmp", "-ffp-contract=off"]


@functools.lru_cache(maxsize=1)
def sources_digest() -> str:
    """The digest (``digest_of``) of the sources as this process first read them: the identity of the build it
    loads, so a cost curve or a product choice measured on one build's kernels is not taken for another's
    (cost/store.py, model/products.py). Read once: sources edited on disk while the process runs do not make its
    kernels another build's (its keys would otherwise change between writing a choice and reading it back)."""
    return digest_of(SOURCES + HEADERS)


def digest_of(paths: list[Path]) -> str:
    """The first 12 hex digits of the files' SHA-256, in order. Worked example: the same files -> the same
    digest, one character changed -> another."""
    digest = hashlib.sha256()
    for source in paths:
        digest.update(source.read_bytes())
    return digest.hexdigest()[:12]


def loaded() -> bool:
    """Whether this process has the op (torch's operator registry is the process's)."""
    return hasattr(torch.ops, NAME) and hasattr(getattr(torch.ops, NAME), "linear")


def load_linear() -> tuple[Callable[..., torch.Tensor] | None, str]:
    """``torch.ops.lookahead_native.linear`` with the numba kernel's entry points handed to it, and "";
    or None and why it could not be had. Builds the library on the machine's first call; starts numba's
    thread pool (torch's thread count kept), which the entry points need before they are loaded."""
    if not loaded():
        try:
            _build_and_load()
        except Exception as error:  # noqa: BLE001  (whatever a compiler, ninja or the loader raise: no native op)
            text = str(error).strip().splitlines()
            return None, f"{type(error).__name__}: {text[-1] if text else ''}"[:300]
    try:
        start_numba_threads()
        float32, float64 = entry_points()
        torch.ops.lookahead_native.set_kernels(float32.address, float64.address)
    except Exception as error:  # noqa: BLE001  (numba could not compile the entry points)
        return None, f"{type(error).__name__}: {error}"[:300]
    return torch.ops.lookahead_native.linear, ""


def tiled_kernel() -> tuple[Callable[..., torch.Tensor] | None, str]:
    """``torch.ops.lookahead_native.tiled`` (the tiled float32 kernel, linear.cpp) and ""; or None and why:
    the library is not loaded in this process (``load_linear``), or this CPU lacks AVX2 and FMA. It runs in
    the width ``tiled_width`` says."""
    if not loaded():
        return None, "lookahead's C++ op is not loaded (load_linear)"
    if not torch.ops.lookahead_native.tiled_available():
        return None, "this CPU has no AVX2 and FMA: the tiled kernel cannot run (numba's kernel runs instead)"
    return torch.ops.lookahead_native.tiled, ""


def tiled_width() -> int:
    """The lanes this process's tiled kernel and attention sum in (linear.cpp's ``tiled_lanes``): the widest
    this CPU runs, 16 with AVX-512F, else 8 with AVX2 and FMA; 0: no tiled kernel or no library loaded. Fixed
    by the CPU, not by a timing, so a machine gives a model the same numbers in every process."""
    if not loaded() or not torch.ops.lookahead_native.tiled_available():
        return 0
    return int(torch.ops.lookahead_native.tiled_lanes())


def tiled_width_timings() -> list[float]:
    """What each width takes here (ms at 8 and at 16 lanes, linear.cpp's ``tiled_width_timings``), for
    reports: measured once a process on first call; empty where one width alone runs or nothing is loaded."""
    if not loaded() or not torch.ops.lookahead_native.tiled_available():
        return []
    return list(torch.ops.lookahead_native.tiled_width_timings())


def fused_ops() -> bool:
    """Whether this process has the fused ops of fused.cpp (``lookahead_native::rms_norm`` and
    ``::rotate_half``, which model/fusion.py writes into traces, and ``::kv_write``, which a traced layer
    calls, model/traced.py); they come with the library (load_linear)."""
    ops = ("rms_norm", "rotate_half", "kv_write")
    return loaded() and all(hasattr(torch.ops.lookahead_native, name) for name in ops)


def _build_and_load() -> None:
    """Build (where not built yet for this source and torch) and load the library, one builder at a time."""
    from torch.utils import cpp_extension  # (imports setuptools: only when a build may be needed)

    directory = Path(cpp_extension._get_build_directory(NAME, verbose=False))
    with FileLock(str(directory / "lookahead.lock")):
        (directory / "lock").unlink(missing_ok=True)  # torch's own lock, left by a builder that was killed
        cpp_extension.load(NAME, [str(source) for source in SOURCES], extra_cflags=CFLAGS,
                           extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)
