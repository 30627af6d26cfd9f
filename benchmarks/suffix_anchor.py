"""The anchor for memory across requests: SuffixDecoding's official suffix tree (Snowflake's
arctic-inference, ``csrc/suffix_decoding``, C++ with nanobind, CPU only), built from its source
distribution and wrapped as a memory for lookahead's memory source, so that it and lookahead's own
suffix store run on the same verifier and budget.

A benchmark extra, never a runtime dependency: ``build_suffix_decoding`` fetches the pinned source
distribution from the package index, builds the extension with cmake and a C++20 compiler (nanobind
installed with pip when missing) and caches it; where any of that fails it says why and returns None.
"""

from __future__ import annotations

import hashlib
import importlib
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from lookahead.kernels.suffix import ORDERS, PROB_EDGES
from lookahead.loading.registry import default_cache_dir
from lookahead.proposers.base import Candidates, no_candidates
from lookahead.proposers.memory.proposer import memory_priors

VERSION = "0.3.0"
SDIST = f"arctic_inference-{VERSION}.tar.gz"
SDIST_URL = ("https://files.pythonhosted.org/packages/63/c1/"
             f"573fa2f00097cd9cc1167b31fd900b2482f58f3491867cebdd5516626533/{SDIST}")  # the index's own link
SDIST_SHA256 = "7f22e3e1b1071c6061c0d6951be17c0fb50b08d06d6e543144c8f52faba60a36"
NANOBIND = "nanobind>=2.4"
BUILD_TIMEOUT_S = 900
# SuffixDecoding's speculation settings as its cache uses them by default (tree speculation on: lookahead
# verifies trees), the depth lookahead's own store proposes to.
MAX_DEPTH = 64
MAX_SPEC_TOKENS = 32
SPEC_FACTOR, SPEC_OFFSET, MIN_TOKEN_PROB = 1.0, 0.0, 0.1


class AnchorUnavailable(RuntimeError):
    """SuffixDecoding's tree could not be built here; the message says why."""


def build_dir(cache_dir: Path | None = None) -> Path:
    return (cache_dir or default_cache_dir()) / f"arctic-inference-{VERSION}"


def build_suffix_decoding(cache_dir: Path | None = None, log=print):
    """The ``SuffixDecodingCache`` class of arctic-inference, built once (cached); AnchorUnavailable
    naming what is missing where it cannot be built."""
    where = build_dir(cache_dir)
    if str(where) not in sys.path:
        sys.path.insert(0, str(where))
    try:
        return importlib.import_module("arctic_inference.suffix_decoding").SuffixDecodingCache
    except ImportError:
        pass
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        raise AnchorUnavailable(f"building SuffixDecoding needs {' and '.join(missing)} on PATH")
    if not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        raise AnchorUnavailable("building SuffixDecoding needs Python's headers (Python.h)")
    log(f"building SuffixDecoding (arctic-inference {VERSION}) into {where}, once")
    with tempfile.TemporaryDirectory() as scratch:
        source = _fetch_source(Path(scratch))
        _build(source, where)
    importlib.invalidate_caches()
    try:
        return importlib.import_module("arctic_inference.suffix_decoding").SuffixDecodingCache
    except ImportError as exc:
        raise AnchorUnavailable(f"SuffixDecoding was built but does not import: {exc}") from None


def _fetch_source(scratch: Path) -> Path:
    """The source distribution, sha256-checked and unpacked; its directory."""
    archive = scratch / SDIST
    try:
        with urllib.request.urlopen(SDIST_URL, timeout=60) as response:
            archive.write_bytes(response.read())
    except OSError as exc:
        raise AnchorUnavailable(f"cannot download {SDIST_URL}: {exc}") from None
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise AnchorUnavailable(f"{SDIST} has sha256 {digest}, expected {SDIST_SHA256}")
    with tarfile.open(archive) as tar:
        tar.extractall(scratch, filter="data")
    return scratch / f"arctic_inference-{VERSION}"


def _run(command: list[str], cwd: Path) -> None:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    if done.returncode:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise AnchorUnavailable(f"{' '.join(command[:3])} failed: {' | '.join(tail)}")


def _build(source: Path, where: Path) -> None:
    """cmake + make of csrc/suffix_decoding; the module and its Python layer laid out as a package."""
    try:
        importlib.import_module("nanobind")
    except ImportError:
        _run([sys.executable, "-m", "pip", "install", "--quiet", NANOBIND], source)
    build = source / "build"
    build.mkdir()
    _run(["cmake", str(source / "csrc" / "suffix_decoding"), "-DCMAKE_BUILD_TYPE=Release",
          f"-DPython_EXECUTABLE={sys.executable}"], build)
    _run(["cmake", "--build", ".", "-j", "2"], build)
    package = where / "arctic_inference" / "suffix_decoding"
    package.mkdir(parents=True, exist_ok=True)
    (where / "arctic_inference" / "__init__.py").write_text("")
    for name in ("__init__.py", "cache.py"):
        shutil.copy(source / "arctic_inference" / "suffix_decoding" / name, package / name)
    for built in build.glob("_C*.so"):
        shutil.copy(built, package / built.name)


def order_of(match_len: int) -> int:
    """The index of the longest of lookahead's store orders (kernels/suffix.ORDERS) a match reaches."""
    return max(int(np.searchsorted(ORDERS, max(match_len, 1), side="right")) - 1, 0)


class SuffixDecodingMemory:
    """SuffixDecoding's cache as lookahead's memory across requests (proposers/memory/proposer.py):
    a global tree of every response and a tree of the current prompt, as arctic-inference keeps them;
    its speculation tree becomes candidate rows with lookahead's store's classes (match order, share)."""

    priors = memory_priors()

    def __init__(self, cache_class, max_depth: int = MAX_DEPTH):
        self.cache = cache_class(max_tree_depth=max_depth)
        self.max_depth = max_depth
        self.request = -1
        self.fed = 0  # how much of the current sequence the cache has
        self.seconds = 0.0

    def begin(self, seq: np.ndarray, stop: int) -> None:
        began = time.perf_counter()
        self.request += 1
        self.cache.start_request(self.request, seq[:stop].astype(np.int32))
        self.fed = stop
        self.seconds += time.perf_counter() - began

    def observe(self, seq: np.ndarray, start: int, stop: int) -> None:
        began = time.perf_counter()
        self._feed(seq, stop)
        self.seconds += time.perf_counter() - began

    def _feed(self, seq: np.ndarray, stop: int) -> None:
        if stop > self.fed:
            self.cache.add_active_response(self.request, seq[self.fed:stop].astype(np.int32))
            self.fed = stop

    def lookup(self, seq: np.ndarray, stop: int, limit: int, length: int) -> Candidates:
        began = time.perf_counter()
        context = seq[max(0, stop - self.max_depth):stop].astype(np.int32)
        draft = self.cache.speculate(self.request, context, max_spec_tokens=min(length, MAX_SPEC_TOKENS),
                                     max_spec_factor=SPEC_FACTOR, max_spec_offset=SPEC_OFFSET,
                                     min_token_prob=MIN_TOKEN_PROB, use_tree_spec=True)
        out = draft_rows(np.asarray(draft.token_ids, dtype=np.int64), np.asarray(draft.parents, dtype=np.int64),
                         np.asarray(draft.probs, dtype=np.float64), order_of(draft.match_len), limit)
        self.seconds += time.perf_counter() - began
        return out

    def remember(self, seq: np.ndarray, prompt_len: int, stop: int) -> None:
        began = time.perf_counter()
        self._feed(seq, stop)  # the last step's tokens
        self.cache.stop_request(self.request)
        self.seconds += time.perf_counter() - began


def draft_rows(tokens: np.ndarray, parents: np.ndarray, probs: np.ndarray, order: int, limit: int) -> Candidates:
    """A speculation tree (tokens [M], parents [M], -1 for the root's children, probs [M] each node's
    estimated probability) as candidate rows: the paths to its ``limit`` most probable leaves.

    tokens [5 6 7], parents [-1 0 0], probs [.9 .6 .3] -> rows [[5 6] [5 7]].
    """
    if tokens.shape[0] == 0 or limit <= 0:
        return no_candidates()
    leaves = np.setdiff1d(np.arange(tokens.shape[0]), parents[parents >= 0])
    leaves = leaves[np.argsort(-probs[leaves], kind="stable")][:limit]
    buckets = PROB_EDGES.shape[0] + 1
    paths = []
    for leaf in leaves:
        path, node = [], int(leaf)
        while node >= 0:
            path.append(node)
            node = int(parents[node])
        paths.append(path[::-1])
    width = max(len(p) for p in paths)
    rows = np.zeros((len(paths), width), dtype=np.int64)
    classes = np.zeros((len(paths), width), dtype=np.int64)
    lens = np.array([len(p) for p in paths], dtype=np.int64)
    for r, path in enumerate(paths):
        rows[r, :len(path)] = tokens[path]
        above = np.concatenate([[1.0], probs[path[:-1]]])  # the parent's path probability (x: 1)
        share = probs[path] / np.maximum(above, 1e-12)  # given the parent, as lookahead's store counts it
        classes[r, :len(path)] = order * buckets + np.searchsorted(PROB_EDGES, share, side="right")
    return Candidates(rows, lens, classes)
