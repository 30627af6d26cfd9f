"""The C heap keeping a forward's freed memory (lookahead/model/heap.py): glibc's thresholds set, blocks freed and
allocated again coming back without fresh pages, and the generator setting them only when told to."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from conftest import tiny_model
from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.model import heap

GLIBC = heap._glibc() is not None
glibc_only = pytest.mark.skipif(not GLIBC, reason="the C library here is not glibc: nothing to set")

# Three 40 MB blocks (above the 32 MB that glibc's own threshold grows to at most), each written through,
# then freed, five times over; prints the minor page faults of the last four rounds.
ROUNDS = """
import ctypes, ctypes.util, resource, sys
from lookahead.model.heap import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 40 << 20
counts = []
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [libc.malloc(size) for _ in range(3)]
    for block in blocks:
        ctypes.memset(block, 1, size)
    for block in blocks:
        libc.free(block)
    counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(sum(counts[1:]))
"""


def faults_over_rounds(setting: str) -> int:
    """Minor page faults of ROUNDS' last four rounds in a fresh interpreter, the thresholds kept or as glibc
    starts."""
    done = subprocess.run([sys.executable, "-c", ROUNDS, setting], capture_output=True, text=True, timeout=120,
                          check=True)
    return int(done.stdout.split()[-1])


@glibc_only
def test_blocks_freed_and_allocated_again_come_back_without_fresh_pages():
    pages = 4 * 3 * (40 << 20) // 4096  # the last four rounds' blocks in 4 KB pages
    as_glibc_starts = faults_over_rounds("default")
    if as_glibc_starts < pages // 2:
        pytest.skip(f"glibc's defaults faulted only {as_glibc_starts} pages (huge pages for every mapping?): "
                    f"the count cannot tell the settings apart here")
    kept = faults_over_rounds("keep")
    assert kept < pages // 100, (kept, as_glibc_starts)


@glibc_only
def test_keep_freed_memory_takes_and_again_changes_nothing():
    assert heap.keep_freed_memory()
    assert heap.keep_freed_memory()


def test_nothing_is_set_where_the_c_library_is_not_glibc(monkeypatch):
    monkeypatch.setattr(heap.sys, "platform", "darwin")
    assert heap._glibc() is None
    assert heap.keep_freed_memory() is False


def test_a_generator_on_the_cpu_keeps_freed_memory_unless_told_not_to(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr("lookahead.generator.keep_freed_memory", lambda: calls.append(1) or True)
    model = tiny_model("llama")
    LookaheadGenerator(model, config=LookaheadConfig(keep_freed_memory=False))
    assert calls == []
    prompt = torch.tensor([[5, 9, 13, 17, 5, 9, 13]])
    expected = model.generate(prompt, max_new_tokens=12, do_sample=False)
    gen = LookaheadGenerator(model)
    assert calls == [1]
    assert torch.equal(gen.generate(prompt, max_new_tokens=12), expected)
