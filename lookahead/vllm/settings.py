"""What a vLLM engine tells lookahead's proposer: ``additional_config={"lookahead": {...}}``.

vLLM builds a custom proposer from its ``VllmConfig`` alone, so the proposer's settings travel in
the one free-form part of it, ``additional_config`` (``--additional-config`` of ``vllm serve``),
under the key ``"lookahead"``. Every key is optional:

- ``memory``: a file for the memory across requests (the format of ``lookahead serve --memory``),
  loaded when the engine starts (a damaged file or one of another tokenizer is refused: the engine
  does not start) and saved, atomically, as requests finish, at most every ``save_seconds``. The
  proposer sees a request finish at the next step that no longer carries it, and vLLM's worker
  process is ended without running exit handlers (tried with its OpenAI server and Ctrl-C), so what
  finished in the last ``save_seconds`` before a shutdown, or just before the engine went idle, may
  be missing from the file. Without a file the memory lives as long as the engine.
- ``save_seconds`` (10): the least time between two saves of the memory file (0: after every
  request).
- ``least_accept`` ("auto"): a draft token is proposed only where its estimated chance of being
  accepted (with every token before it) is at least this, since vLLM spends a row on each token
  proposed; "auto" learns it from what a row of the engine's steps costs (clock.py), a number from 0
  to 1 fixes it.
- any field of ``LookaheadConfig`` that its token-only sources read: ``context_match``,
  ``match_min``, ``match_max``, ``match_length``, ``ngram_pool``, ``pool_ngram``, ``pool_capacity``,
  ``pool_max_keys``, ``seed_from_prompt``, ``seed_from_output``, ``candidates``, ``max_tree_nodes``,
  ``memory_tokens`` (0: no memory across requests) and ``memory_prompts``.

A key that is none of these, or a value out of range, is refused with ``ConfigError`` naming it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import LookaheadConfig
from ..errors import ConfigError

KEY = "lookahead"  # the key of additional_config the settings sit under
SOURCE_FIELDS = ("context_match", "match_min", "match_max", "match_length", "ngram_pool", "pool_ngram",
                 "pool_capacity", "pool_max_keys", "seed_from_prompt", "seed_from_output", "candidates",
                 "max_tree_nodes", "memory_tokens", "memory_prompts")  # LookaheadConfig fields read here
OWN_FIELDS = ("memory", "save_seconds", "least_accept")


@dataclass(frozen=True)
class VllmSettings:
    """The proposer's settings (see the module docstring), validated on construction."""

    config: LookaheadConfig = field(default_factory=LookaheadConfig)
    memory: Path | None = None
    save_seconds: float = 10.0
    least_accept: float | None = None  # None: "auto" (clock.py)

    def __post_init__(self) -> None:
        if not (isinstance(self.save_seconds, (int, float)) and math.isfinite(self.save_seconds)
                and self.save_seconds >= 0):
            raise ConfigError(f"save_seconds must be a number >= 0, got {self.save_seconds!r}")
        if self.least_accept is not None and not (isinstance(self.least_accept, (int, float))
                                                  and not isinstance(self.least_accept, bool)
                                                  and 0 <= self.least_accept <= 1):
            raise ConfigError(f"least_accept must be \"auto\" or a number from 0 to 1, got {self.least_accept!r}")
        if self.memory is not None and self.config.memory_tokens == 0:
            raise ConfigError("memory names a file but memory_tokens is 0 (no memory across requests); "
                              "drop one of the two")


def settings_from(additional: Any) -> VllmSettings:
    """The settings under ``additional[KEY]`` (vLLM's ``additional_config``; missing: the defaults)."""
    given = (additional or {}).get(KEY, {}) if isinstance(additional, dict) else {}
    if not isinstance(given, dict):
        raise ConfigError(f"additional_config[{KEY!r}] must be a JSON object of settings, got {given!r}")
    unknown = [k for k in given if k not in SOURCE_FIELDS + OWN_FIELDS]
    if unknown:
        raise ConfigError(f"{unknown[0]!r} is no setting of lookahead's vLLM proposer; settings: "
                          f"{', '.join(OWN_FIELDS + SOURCE_FIELDS)}")
    config = LookaheadConfig.from_mapping({k: v for k, v in given.items() if k in SOURCE_FIELDS})
    memory = given.get("memory")
    if memory is not None and not isinstance(memory, str):
        raise ConfigError(f"memory must be a file path (a string), got {memory!r}")
    own = {k: given[k] for k in ("save_seconds", "least_accept") if k in given}
    if own.get("least_accept") == "auto":
        own["least_accept"] = None
    return VllmSettings(config, Path(memory).expanduser() if memory else None, **own)
