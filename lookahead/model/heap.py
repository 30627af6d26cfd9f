"""The C heap's freed memory: handed back to the OS after a load, kept for the next forward afterwards
(glibc's malloc on Linux; elsewhere nothing is changed).

A forward on the CPU allocates its intermediates anew and frees them at its end: a prefill's gate and up
projections alone are tokens x intermediate width x 4 bytes each, tens of MB a layer. glibc's malloc serves
a block above its mmap threshold (128 KiB at start, following the sizes freed up to 32 MiB) with a fresh
mapping, unmapped again when freed, and hands the top of its heap back to the OS whenever more than its trim
threshold lies free there. Either way the next forward's blocks of the same sizes arrive as new pages, which
the kernel zeroes on first touch: one minor page fault per 4 KiB, paid again every forward.
``keep_freed_memory`` sets both thresholds (``mallopt``): blocks up to MMAP_THRESHOLD bytes come from the
heap, and up to TRIM_THRESHOLD bytes of free heap stay mapped, so a forward reuses pages the one before
touched. The price is resident memory: the process keeps up to TRIM_THRESHOLD bytes it freed. These are
the allocator's settings for the whole process, as glibc's MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_
environment variables would set them at start; ``LookaheadGenerator`` sets them for a model on the CPU
(``LookaheadConfig.keep_freed_memory``; a GPU's forwards allocate on the device).

``give_back_freed_memory`` is the other direction, once: ``malloc_trim`` after a load, which replaces many
tensors (a GGUF's blocks repacked) whose freed space would otherwise stay resident.

Worked example: a 2,000-token prefill of a 0.5B model (intermediate width 4,864) allocates 39 MB blocks, above
the 32 MB glibc's own threshold follows sizes up to: with its defaults every one is mapped afresh, about a
million minor page faults a prefill; with these thresholds some 25,000 (``resource.getrusage(...).ru_minflt``
counts them).
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (glibc's malloc.h)
MMAP_THRESHOLD = 256 << 20  # bytes: blocks up to this size come from the heap, not fresh mappings
TRIM_THRESHOLD = 1 << 30  # bytes of free heap top the process keeps mapped for its next blocks


def _libc() -> Any | None:
    """The C library's functions as this process links them (``dlopen(NULL)``: no search for the library's file),
    or None where ctypes cannot open the process."""
    try:
        return ctypes.CDLL(None)
    except (OSError, TypeError):
        return None


def _glibc() -> Any | None:
    """The process's C library where it is glibc on Linux (it has ``gnu_get_libc_version`` and ``mallopt``), else
    None."""
    libc = _libc() if sys.platform.startswith("linux") else None
    if libc is None or not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    return libc


def keep_freed_memory() -> bool:
    """Set glibc malloc's mmap threshold to MMAP_THRESHOLD and its trim threshold to TRIM_THRESHOLD for this
    process (see the module); True where both took, False where the C library is not glibc (nothing changed).
    Setting them again changes nothing."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD,
                                                                                      TRIM_THRESHOLD))


def give_back_freed_memory() -> bool:
    """Return the C heap's freed pages to the OS (glibc's malloc_trim): loading replaces many tensors of a few
    MB (a GGUF's blocks repacked), whose freed space the allocator would otherwise keep resident. False where
    the C library has no malloc_trim (nothing done)."""
    libc = _libc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    libc.malloc_trim(0)
    return True
