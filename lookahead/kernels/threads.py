"""numba's thread pool started beside torch's, torch's thread count kept as the user set it."""

from __future__ import annotations

import os

import numba
import torch


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system tells it, else every core)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


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
