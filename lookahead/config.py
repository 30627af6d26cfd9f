"""LookaheadConfig: every knob of the engine, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, fields


class ConfigError(ValueError):
    """A configuration value is out of range; the message names the field and the fix."""


def _check_int(name: str, value, low: int, high: int | None = None) -> None:
    """Raise ConfigError unless value is an int in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"between {low} and {high}"
        raise ConfigError(f"{name} must be {bound}, got {value}")


@dataclass(frozen=True)
class LookaheadConfig:
    """Settings of one LookaheadGenerator (defaults measured on a 2-core CPU, SmolLM2-135M).

    Letters used in shape comments: W = window, N = ngram, G = candidates.
    """

    # Defaults measured on a 2-core CPU (SmolLM2-135M, float32): there one forward over
    # 4 tokens costs 1.6x one over 1 token, so a wide window does not pay and the
    # default keeps the window at x alone (W=1, N=2: the pool learns from the output)
    # and verifies two cheap candidates. On a GPU raise window/ngram/candidates.
    window: int = 1  # W: columns of the Jacobi lookahead window (>= 1)
    ngram: int = 2  # N: n-gram size; the window has N-1 levels (>= 2)
    candidates: int = 2  # G: max candidate continuations verified per step (0 = none)
    pool_capacity: int = 4  # n-grams kept per first token in the pool (LRU)
    pool_max_keys: int = 16384  # distinct first tokens kept in the pool (LRU)
    seed_from_prompt: bool = True  # put every prompt n-gram into the pool
    seed_from_output: bool = True  # put every accepted n-gram into the pool
    context_match: bool = True  # propose continuations of suffix matches in prompt + output
    match_min: int = 2  # shortest suffix that counts as a context match
    match_max: int = 4  # longest suffix tried by the context matcher
    match_length: int = 8  # tokens proposed after a context match
    max_tree_nodes: int = 32  # cap on verification-tree nodes per step
    seed: int = 0  # RNG seed of the window's initial guesses
    allow_untested_models: bool = False  # drive architectures outside the tested list

    def __post_init__(self) -> None:
        _check_int("window", self.window, 1, 64)
        _check_int("ngram", self.ngram, 2, 16)
        _check_int("candidates", self.candidates, 0, 256)
        _check_int("pool_capacity", self.pool_capacity, 1, 1024)
        _check_int("pool_max_keys", self.pool_max_keys, 1)
        _check_int("match_min", self.match_min, 1, 64)
        _check_int("match_max", self.match_max, self.match_min, 64)
        _check_int("match_length", self.match_length, 1, 256)
        _check_int("max_tree_nodes", self.max_tree_nodes, 0, 4096)
        _check_int("seed", self.seed, 0)
        for name in ("seed_from_prompt", "seed_from_output", "context_match", "allow_untested_models"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be True or False, got {getattr(self, name)!r}")

    @property
    def lookahead_rows(self) -> int:
        """Rows of the lookahead branch, x included: W * (N - 1)."""
        return self.window * (self.ngram - 1)

    @classmethod
    def field_names(cls) -> list[str]:
        """Names of all fields (the CLI maps one option to each)."""
        return [f.name for f in fields(cls)]
