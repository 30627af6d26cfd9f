"""A cost curve's file in the disk cache: read back only for exactly the fingerprint it was
measured under, written atomically (store.py decides what is kept, curve.py saves a refined curve),
with a note of how it was measured; and the cache as a whole (``cached_curves``, for ``lookahead costs``)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import TypeGuard

from .measure import implausibility


@dataclass(frozen=True)
class CurveStore:
    """Where a curve is cached on disk: the file, and the fingerprint it is saved under."""

    path: str
    fingerprint: dict

    def read(self) -> tuple[list[float], list[list[float]]] | None:
        """The saved seconds [S] and every route's [R][S], or None (missing, foreign, corrupt or
        implausible file)."""
        return _read(self.path, self.fingerprint)

    def save(self, seconds: list[float], routes: list[list[float]], about: dict | None = None) -> str | None:
        """Save the seconds atomically, with ``about`` (how they were measured, or refined: what a
        measurement's line said, for ``lookahead costs list``) merged into what the file said before;
        None when written, else why not (a read-only or full disk only costs a measurement next time)."""
        return _write(self.path, self.fingerprint, seconds, routes, {**_about(self.path), **(about or {})})


def _read(path: str, fingerprint: dict) -> tuple[list[float], list[list[float]]] | None:
    """Saved seconds [S] and route curves [R][S] for exactly this fingerprint, or None (missing, foreign,
    corrupt or implausible file: a curve cached before plausibility was checked is measured again)."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("fingerprint") != fingerprint:
        return None
    seconds, routes = data.get("seconds"), data.get("routes")
    size = len(fingerprint["rows"])
    if not _positive_floats(seconds, size) or not isinstance(routes, list) \
            or len(routes) != len(fingerprint["routes"]) or not all(_positive_floats(r, size) for r in routes):
        return None
    if implausibility(fingerprint["rows"], [seconds]) is not None:
        return None
    return seconds, routes


def _positive_floats(values: object, size: int) -> TypeGuard[list[float]]:
    """Whether values is a list of ``size`` positive floats."""
    return isinstance(values, list) and len(values) == size and all(isinstance(v, float) and v > 0 for v in values)


def _about(path: str) -> dict:
    """What the file at path says about how its curve was measured ({} when there is none or no file)."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    about = data.get("about") if isinstance(data, dict) else None
    return about if isinstance(about, dict) else {}


def _write(path: str, fingerprint: dict, seconds: list[float], routes: list[list[float]], about: dict) -> str | None:
    """Save atomically; None when written, else why not (a read-only or full disk only costs a
    re-measurement next time)."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as handle:
            json.dump({"fingerprint": fingerprint, "seconds": seconds, "routes": routes, "about": about}, handle)
        os.replace(tmp, path)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


# ---------------------------------------------------------------- the cache as a whole (lookahead costs)
CURVE_FILE = re.compile(r"^[0-9a-f]{24}\.json$")  # store.py names a curve's file by KEY_DIGITS hex digits
LEFTOVER_FILE = re.compile(r"^[0-9a-f]{24}\.json\.\d+\.tmp$")  # a write a crash interrupted


@dataclass(frozen=True)
class CachedCurve:
    """One file of the cache: its path, when it was last written (seconds since the epoch), and its
    fingerprint and ``about`` (None: the file cannot be read as a curve)."""

    path: str
    written: float
    fingerprint: dict | None
    about: dict


def cached_curves(directory: str) -> list[CachedCurve]:
    """Every curve file (and leftover temporary file) in ``directory``, newest first; [] when it does not
    exist. Only files named as store.py names them: a directory shared with other files is safe."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = []
    for name in names:
        if not (CURVE_FILE.match(name) or LEFTOVER_FILE.match(name)):
            continue
        path = os.path.join(directory, name)
        try:
            written = os.path.getmtime(path)
        except OSError:  # removed meanwhile
            continue
        try:
            with open(path) as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            data = None
        fingerprint = data.get("fingerprint") if isinstance(data, dict) and CURVE_FILE.match(name) else None
        about = data.get("about") if isinstance(data, dict) else None
        found.append(CachedCurve(path, written, fingerprint if isinstance(fingerprint, dict) else None,
                                 about if isinstance(about, dict) else {}))
    return sorted(found, key=lambda c: (-c.written, c.path))
