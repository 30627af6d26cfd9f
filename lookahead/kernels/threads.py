"""numba's thread pool started beside torch's, torch's thread count kept as the user set it."""

from __future__ import annotations

import numba
import torch


def start_numba_threads() -> None:
    """Start numba's thread pool, keeping torch's thread count as the user set it.

    numba starts its pool on first use; its OpenMP layer shares torch's OpenMP
    runtime and sets that runtime's thread count to numba's own on the way
    (OMP_NUM_THREADS=1 or torch.set_num_threads(1) would become 2 here). Idempotent and
    cheap once started.
    """
    threads = torch.get_num_threads()
    numba.get_num_threads()  # starts the pool
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
