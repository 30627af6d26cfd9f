"""C entry points of lookahead's few-row kernel (kernels/linear.py), for the C++ op of linear.cpp.

``numba.cfunc`` compiles a function with a C signature: the op calls it by
address with raw pointers, and it wraps them as arrays (``carray``, no copy)
and runs ``linear_into`` on numba's thread pool, as a call from Python would.
One entry point per dtype the kernel computes in (float32, float64), each
``out [R, O] = x [R, I] @ w [O, I]^T`` over C-contiguous buffers.

Compiled on first use (``entry_points``), not at import: a few seconds the
first time on a machine, then read from numba's disk cache.

Worked example: with w = [[1 2] [0 1] [1 0]] and x = [[1 1] [2 0]] as float32
buffers, ``entry_points()[0]`` called as f(w, x, out, 2, 2, 3) leaves
out = [[3 1 1] [2 0 2]].
"""

from __future__ import annotations

from functools import cache

import numpy as np
from numba import carray, cfunc, types

from ..kernels.linear import linear_into

SIGNATURE = types.void(types.voidptr, types.voidptr, types.voidptr, types.int64, types.int64, types.int64)


def _float32_linear(w, x, out, rows, inputs, outputs):  # noqa: ANN001  (numba compiles it; see SIGNATURE)
    """linear_into over float32 buffers given by address."""
    linear_into(carray(w, (outputs, inputs), dtype=np.float32), carray(x, (rows, inputs), dtype=np.float32),
                carray(out, (rows, outputs), dtype=np.float32))


def _float64_linear(w, x, out, rows, inputs, outputs):  # noqa: ANN001
    """linear_into over float64 buffers given by address."""
    linear_into(carray(w, (outputs, inputs), dtype=np.float64), carray(x, (rows, inputs), dtype=np.float64),
                carray(out, (rows, outputs), dtype=np.float64))


@cache
def entry_points() -> tuple:
    """The compiled entry points (float32, float64): objects whose ``address`` is the C function's and whose
    ``ctypes`` calls it from Python (the tests' way). Made once per process and kept: the C++ op holds
    their addresses, which live as long as these objects do. numba's thread pool must be started first
    (a cached entry point loaded before it would not find the pool's scheduler)."""
    return tuple(cfunc(SIGNATURE, cache=True)(function) for function in (_float32_linear, _float64_linear))
