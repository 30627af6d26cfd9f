"""Other work on the machine, for benchmarks: processes that keep cores busy while a comparison runs.

``lookahead bench --busy-cores 1`` runs the whole comparison (the generators'
construction included, where cost curves are measured) beside one such
process: what a laptop or a shared server looks like to the engine.
"""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager

LIMIT_S = 4 * 3600  # a busy process ends by itself after this long, whatever happens to the bench
SPIN = f"import time\nend = time.monotonic() + {LIMIT_S}\nwhile time.monotonic() < end:\n    pass\n"


@contextmanager
def busy_cores(count: int):
    """``count`` processes that spin on the CPU for the body's duration (none for 0)."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.DEVNULL) for _ in range(count)]
    try:
        yield spinners
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
