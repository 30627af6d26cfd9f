"""A suffix store on disk: written atomically, versioned, tied to the tokenizer's vocabulary.

Layout (little-endian): MAGIC, then a JSON header line {"version", "vocabulary", "requests",
"tokens"}, then the requests' lengths (int64 [R]) and their tokens (int32 [n]), then the SHA-256
of everything before it. A file that is truncated, altered, of another format version or of
another vocabulary is refused whole (``MemoryFileError``); nothing is half-read. Writers take an
exclusive lock on ``<path>.lock`` and replace the file in one rename, so two processes sharing a
file never leave it half-written (the later save wins).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...errors import MemoryFileError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

MAGIC = b"LOOKAHEAD-MEMORY\n"
VERSION = 1  # raise when the layout changes: older files are then refused, not misread
DIGEST = 32  # bytes of the trailing SHA-256


def vocabulary_key(tokenizer: PreTrainedTokenizerBase | None, vocab: int) -> str:
    """What ties a file to its tokenizer: a digest of the tokenizer's vocabulary (token -> id), or
    the vocabulary size alone when there is no tokenizer."""
    if tokenizer is None or not hasattr(tokenizer, "get_vocab"):
        return f"size:{vocab}"
    items = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    data = json.dumps(items, ensure_ascii=False).encode()
    return f"sha256:{hashlib.sha256(data).hexdigest()[:32]}"


def encode(requests: list[np.ndarray], vocabulary: str) -> bytes:
    """The file's bytes for ``requests`` (token arrays, oldest first)."""
    lengths = np.array([r.shape[0] for r in requests], dtype="<i8")
    tokens = np.concatenate(requests).astype("<i4") if requests else np.zeros(0, dtype="<i4")
    header = json.dumps({"version": VERSION, "vocabulary": vocabulary, "requests": int(lengths.shape[0]),
                         "tokens": int(tokens.shape[0])}).encode() + b"\n"
    body = MAGIC + header + lengths.tobytes() + tokens.tobytes()
    return body + hashlib.sha256(body).digest()


def decode(data: bytes, vocabulary: str, vocab: int, where: str) -> list[np.ndarray]:
    """The requests of a file's bytes, after every check (MemoryFileError naming ``where`` otherwise)."""
    if not data.startswith(MAGIC):
        raise MemoryFileError(f"{where} is not a lookahead memory file (it does not start with {MAGIC[:-1]!r}); "
                              f"pass the path of a file written by save_memory / --memory, or a new path")
    end = data.find(b"\n", len(MAGIC))
    try:
        header = json.loads(data[len(MAGIC):end]) if end > 0 else None
    except ValueError:
        header = None
    if not isinstance(header, dict):
        raise damaged(where, "has a damaged header")
    if header.get("version") != VERSION:
        raise MemoryFileError(f"{where} was written in memory format {header.get('version')!r}; this lookahead "
                              f"reads format {VERSION}: delete it or pass another path (it is rebuilt as "
                              f"requests run)")
    lacking = sorted({"vocabulary", "requests", "tokens"} - header.keys())
    if lacking:
        raise damaged(where, f"has a damaged header (it lacks {', '.join(lacking)})")
    if header["vocabulary"] != vocabulary:
        raise MemoryFileError(f"{where} belongs to another tokenizer's vocabulary ({header['vocabulary']}, "
                              f"this generator's is {vocabulary}): its token ids would mean other text; pass a "
                              f"memory file of this model's tokenizer, or a new path")
    count, total, start = header["requests"], header["tokens"], end + 1
    counted = all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (count, total))
    if not counted or len(data) != start + 8 * count + 4 * total + DIGEST \
            or hashlib.sha256(data[:-DIGEST]).digest() != data[-DIGEST:]:
        raise damaged(where, "is truncated or damaged (its size or checksum does not match what it declares)")
    lengths = np.frombuffer(data, dtype="<i8", count=count, offset=start).astype(np.int64)
    tokens = np.frombuffer(data, dtype="<i4", count=total, offset=start + 8 * count).astype(np.int64)
    if lengths.sum() != total or (lengths < 0).any() or (tokens < 0).any() or (tokens >= vocab).any():
        raise MemoryFileError(f"{where} holds token ids outside this model's vocabulary of {vocab} or "
                              f"inconsistent lengths: delete it or pass a memory file of this model")
    return np.split(tokens, np.cumsum(lengths)[:-1]) if count else []


def damaged(where: str, what: str) -> MemoryFileError:
    """The error for a file that is no longer what was written: ``where`` ``what``, and the fix."""
    return MemoryFileError(f"{where} {what}: delete it (it is rebuilt as requests run) or restore it from a copy")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``<path>.lock`` while writing path (other writers wait)."""
    with open(f"{path}.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write(path: str | os.PathLike, requests: list[np.ndarray], vocabulary: str) -> None:
    """Write the requests to path atomically (a temporary file in its directory, then one rename)."""
    path = Path(path)
    data = encode(requests, vocabulary)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with locked(path):
            handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
            try:
                with os.fdopen(handle, "wb") as out:
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(temporary, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise
    except OSError as exc:
        raise MemoryFileError(f"cannot write the memory file {path} ({exc.strerror or exc}); pass a path in a "
                              f"directory you can write to") from None


def read(path: str | os.PathLike, vocabulary: str, vocab: int) -> list[np.ndarray]:
    """The requests saved at path (MemoryFileError when it cannot be read or is not a good memory file)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise MemoryFileError(f"cannot read the memory file {path} ({exc.strerror or exc}); pass the path of "
                              f"a file written by save_memory / --memory") from None
    return decode(data, vocabulary, vocab, str(path))
