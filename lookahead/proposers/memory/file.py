"""A suffix store on disk: written atomically, versioned, tied to the tokenizer's vocabulary.

Layout (little-endian): MAGIC, then a JSON header line {"version", "vocabulary", "requests",
"tokens"}, then the requests' lengths (int64 [R]) and their tokens (int32 [n]), then the SHA-256
of everything before it. A file that is truncated, altered, of another format version or of
another vocabulary is refused whole (``MemoryFileError``); nothing is half-read. Writers take an
exclusive lock on ``<path>.lock`` and replace the file in one rename, so two processes sharing a
file never leave it half-written (the later save wins); the lock file is gone once the last writer
is done (``locked``). ``check_path`` is the one check of a memory file's place (save_memory and
the commands' ``--memory``): a missing directory is refused, never created.
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


def check_path(path: str | os.PathLike[str], reading: bool = False) -> Path:
    """``path`` (``~`` expanded) when a memory file can be written there: its directory exists and is
    writable, and it is not itself a directory; with ``reading``, an existing file must be readable
    too (what ``--memory`` reads first and writes back). MemoryFileError naming the path and the fix
    otherwise: a missing directory is refused, never created (a typo would scatter users' text)."""
    where = Path(path).expanduser()
    parent = where.parent  # Path("m.lkm").parent is Path(".")
    if where.is_dir():
        raise MemoryFileError(f"the memory file {path} is a directory: pass a file path, "
                              f"e.g. {where / 'memory.lkm'}")
    if not parent.exists():
        raise MemoryFileError(f"cannot write the memory file {path}: the directory {parent} does not exist; "
                              f"create it first (mkdir -p {parent}) or pass a path in a directory you can write to")
    if not parent.is_dir():
        raise MemoryFileError(f"cannot write the memory file {path}: {parent} is a file, not a directory; "
                              f"pass a path in a directory you can write to")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise MemoryFileError(f"cannot write the memory file {path}: the directory {parent} is not writable; "
                              f"pass a path in a directory you can write to")
    if reading and where.exists() and not os.access(where, os.R_OK):
        raise MemoryFileError(f"cannot read the memory file {path}: it is not readable; make it readable "
                              f"(chmod u+r) or pass another path")
    return where


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``<path>.lock`` while writing path (other writers wait); no lock file is
    left behind.

    The holder removes the lock file before it lets go, so a writer that opened it earlier and was
    waiting may then hold a lock on a file that is no longer there: each writer, once it holds the
    lock, checks that the file it locked is still the one at ``<path>.lock`` (same device and inode)
    and starts over if not. Only the holder ever removes the file, and ``open`` only creates one
    where none is, so at any moment at most one writer holds a lock on the file at that name: two
    writers never write at once, and none waits on a file nobody else can reach.
    """
    name = f"{path}.lock"
    while True:
        lock = open(name, "a+b")  # closed below: at once if stale, else after the unlink
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            held = os.fstat(lock.fileno())
            try:
                current = os.stat(name)
            except FileNotFoundError:
                current = None
            if current is not None and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
                break  # the lock is held on the file at that name: ours until unlinked
        except BaseException:
            lock.close()
            raise
        lock.close()  # a file the previous holder removed: open the one at the name now
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)  # while still holding it: a writer waiting on this file starts over
        lock.close()  # lets go of the lock


def write(path: str | os.PathLike[str], requests: list[np.ndarray], vocabulary: str) -> None:
    """Write the requests to path atomically (a temporary file in its directory, then one rename).

    A path whose directory does not exist (or is not one, or is not writable) is refused
    (``check_path``): no directory is created."""
    path = check_path(path)
    data = encode(requests, vocabulary)
    try:
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


def read(path: str | os.PathLike[str], vocabulary: str, vocab: int) -> list[np.ndarray]:
    """The requests saved at path (MemoryFileError when it cannot be read or is not a good memory file)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise MemoryFileError(f"cannot read the memory file {path} ({exc.strerror or exc}); pass the path of "
                              f"a file written by save_memory / --memory") from None
    return decode(data, vocabulary, vocab, str(path))
