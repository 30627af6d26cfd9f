"""A cost curve's file in the disk cache: read back only for exactly the fingerprint it was
measured under, written atomically (store.py decides what is kept, curve.py saves a refined curve)."""

from __future__ import annotations

import json
import os
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

    def save(self, seconds: list[float], routes: list[list[float]]) -> str | None:
        """Save the seconds atomically; None when written, else why not (a read-only or full disk only
        costs a measurement next time)."""
        return _write(self.path, self.fingerprint, seconds, routes)


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


def _write(path: str, fingerprint: dict, seconds: list[float], routes: list[list[float]]) -> str | None:
    """Save atomically; None when written, else why not (a read-only or full disk only costs a
    re-measurement next time)."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as handle:
            json.dump({"fingerprint": fingerprint, "seconds": seconds, "routes": routes}, handle)
        os.replace(tmp, path)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None
