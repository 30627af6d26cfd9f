"""One helper for the decode loop's host work: an array as a kernel takes it, copied only where it must be.

After a forward has streamed the weights through the CPU's caches, every numpy call of a step's host
work pays for memory the forward evicted from the caches (results/RESULTS.md keeps what it measured), so
arrays that already have the dtype and layout a numba kernel takes are passed as they are.
"""

from __future__ import annotations

import numpy as np


def contiguous(array: np.ndarray, dtype: type = np.int64) -> np.ndarray:
    """``array`` C-contiguous of ``dtype``: itself where it already is, else a copy.

    contiguous(np.arange(3)) is the same array; contiguous(np.arange(6)[::2]) -> a copy [0 2 4].
    """
    return array if array.dtype == dtype and array.flags.c_contiguous else np.ascontiguousarray(array, dtype=dtype)
