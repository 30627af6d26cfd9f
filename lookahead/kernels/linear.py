"""Numba kernel of a linear layer over a few rows on the CPU: out[r, o] = sum_i x[r, i] w[o, i].

A decode step feeds one to a few token rows through every linear layer, so
each layer's product is a matrix times one or a few vectors: it streams the
weights once and does little arithmetic per weight. Written as one loop over
the output features, split between the CPU's threads, that streams each
weight row once while the few input rows stay in cache (several sums
kept in registers), the product runs at the memory's speed on every core,
where a general BLAS kernel may not over so few rows. Whether it beats
torch's own on a given CPU is measured there (lookahead/model/fewrows.py,
lookahead/model/routing.py; `lookahead roofline` times every route).

Worked example: w = [[1 2] [0 1] [1 0]] (O = 3 outputs, I = 2 inputs),
x = [[1 1] [2 0]] (R = 2 rows) -> [[3 1 1] [2 0 2]].

Sums are reassociated (vectorised), so the results differ from torch's in the
last bits, as any two matrix kernels do; NaN and infinity keep their meaning.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

FLAGS = {"reassoc", "contract"}  # vectorised sums and fused multiply-adds; NaN / inf semantics kept


BLOCK = 4  # rows (and, in the wide kernel, outputs) summed together in registers
WIDE_ROWS = 9  # from this many rows the wide kernel always pays
WIDE_INPUTS = 1024  # ... and from 3 rows when a weight row is at least this long


def rows_linear(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """out [R, O] = x [R, I] @ w [O, I]^T, both C-contiguous and of one float dtype.

    Narrow kernel: each thread streams its weight rows one at a time (one stream per core),
    BLOCK input rows at a time sharing each weight load. Wide kernel: BLOCK weight rows by
    BLOCK input rows at a time (16 running sums; the rows padded with zeros to a multiple of
    BLOCK), which halves the input loads but keeps BLOCK weight streams per core. The wide kernel
    pays from WIDE_ROWS rows, and from 3 rows (with the padding) on long weight rows
    (WIDE_INPUTS): the thresholds stand where the faster of the two changed, as `lookahead bench
    --no-native-linear` (this kernel on every kernel-route product) and `lookahead roofline --rows 3
    --rows 8 --rows 9` where the C++ op is not built measure it; results/RESULTS.md keeps the timings.
    """
    out = np.empty((x.shape[0], w.shape[0]), dtype=x.dtype)
    linear_into(w, x, out)
    return out


@njit(fastmath=FLAGS, cache=True)
def linear_into(w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """out [R, O] = x [R, I] @ w [O, I]^T (``rows_linear`` writing into a given array: the entry point
    native/entry.py hands to the C++ op). Worked example: as the module's, out given as np.empty((2, 3))."""
    rows, inputs = x.shape
    if rows >= WIDE_ROWS or (rows >= 3 and inputs >= WIDE_INPUTS):
        padded = -rows % BLOCK
        if padded:
            x = np.concatenate((x, np.zeros((padded, inputs), dtype=x.dtype)))
        _rows_linear_wide(w, x, out)
    else:
        _rows_linear_narrow(w, x, out)


@njit(fastmath=FLAGS, cache=True, inline="always")
def _dot(w: np.ndarray, x: np.ndarray, o: int, r: int):
    """sum_i w[o, i] x[r, i]."""
    total = x.dtype.type(0)
    for i in range(w.shape[1]):
        total += w[o, i] * x[r, i]
    return total


@njit(parallel=True, fastmath=FLAGS, cache=True)
def _rows_linear_narrow(w: np.ndarray, x: np.ndarray, out: np.ndarray):
    """rows_linear into ``out`` [R, O], one weight row at a time."""
    outputs, inputs = w.shape
    rows = x.shape[0]
    for o in prange(outputs):
        r0 = 0
        while r0 + BLOCK <= rows:
            acc = np.zeros(BLOCK, dtype=x.dtype)  # [r]
            for i in range(inputs):
                weight = w[o, i]
                for c in range(BLOCK):
                    acc[c] += weight * x[r0 + c, i]
            for c in range(BLOCK):
                out[r0 + c, o] = acc[c]
            r0 += BLOCK
        for r in range(r0, rows):
            out[r, o] = _dot(w, x, o, r)


@njit(parallel=True, fastmath=FLAGS, cache=True)
def _rows_linear_wide(w: np.ndarray, x: np.ndarray, out: np.ndarray):
    """rows_linear into ``out`` [R, O], BLOCK weight rows by BLOCK input rows at a time; x [R', I] may hold
    rows of padding beyond out's R (R' >= R), computed and not written."""
    outputs, inputs = w.shape
    rows = out.shape[0]
    for block in prange((outputs + BLOCK - 1) // BLOCK):
        o0 = block * BLOCK
        o_n = min(BLOCK, outputs - o0)
        for r0 in range(0, rows, BLOCK):
            r_n = min(BLOCK, x.shape[0] - r0)
            if o_n == BLOCK and r_n == BLOCK:
                acc = np.zeros((BLOCK, BLOCK), dtype=x.dtype)  # [o, r]
                for i in range(inputs):
                    for a in range(BLOCK):
                        weight = w[o0 + a, i]
                        for c in range(BLOCK):
                            acc[a, c] += weight * x[r0 + c, i]
                for a in range(BLOCK):
                    for c in range(min(BLOCK, rows - r0)):
                        out[r0 + c, o0 + a] = acc[a, c]
            else:
                for a in range(o_n):
                    for c in range(min(r_n, rows - r0)):
                        out[r0 + c, o0 + a] = _dot(w, x, o0 + a, r0 + c)
