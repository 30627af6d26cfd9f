"""What machine this is, in words a result file and a cache key can carry."""

from __future__ import annotations

import platform
import time

import psutil


def cpu_name() -> str:
    """The CPU's model name, with its family and model numbers and its widest vector extension where
    /proc/cpuinfo gives them ('<model name> (family 26, model 2, AVX-512)': the name alone is the same for
    CPUs generations apart), or the machine type where it cannot be read."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if not key.strip():
                    break  # (the first processor's block is enough)
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name")
    if not name:
        return platform.processor() or platform.machine()
    flags = set(fields.get("flags", "").split())
    widest = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else None
    about = [f"family {fields['cpu family']}" if "cpu family" in fields else None,
             f"model {fields['model']}" if "model" in fields else None, widest]
    said = ", ".join(part for part in about if part)
    return f"{name} ({said})" if said else name


# ---------------------------------------------------------------- other processes' load
LOAD_SPAN_S = 0.25  # others_busy counts over at least this long (a shorter measurement is taken as quiet)


def cpu_snapshot() -> tuple[float, float, float]:
    """(a clock, seconds all CPUs have been busy, seconds this process has run): for ``others_busy``."""
    total = psutil.cpu_times()
    guest = getattr(total, "guest", 0.0) + getattr(total, "guest_nice", 0.0)  # already counted in user
    busy = sum(total) - total.idle - getattr(total, "iowait", 0.0) - guest
    own = psutil.Process().cpu_times()
    return time.monotonic(), busy, own.user + own.system


def others_busy(before: tuple[float, float, float], after: tuple[float, float, float]) -> float:
    """How many cores other processes (or other machines sharing this one) kept busy between two snapshots."""
    wall = after[0] - before[0]  # (CPU times tick every 10 ms: a shorter span cannot tell)
    return max(0.0, (after[1] - before[1]) - (after[2] - before[2])) / wall if wall >= LOAD_SPAN_S else 0.0

