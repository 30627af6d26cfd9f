"""LookaheadConfig: every knob of the engine, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, fields

from .errors import ConfigError

CHOICES = {"budget": ("adaptive", "fixed"), "budget_curve": ("measured", "flat")}  # fields with fixed string values


def _check_int(name: str, value: object, low: int, high: int | None = None) -> None:
    """Raise ConfigError unless value is an int in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"between {low} and {high}"
        raise ConfigError(f"{name} must be {bound}, got {value}")


@dataclass(frozen=True)
class LookaheadConfig:
    """Settings of one LookaheadGenerator (hardware choices are measured where it runs, not set here).

    Letters used in shape comments: W = window, N = ngram, G = candidates.

    Example: ``LookaheadConfig(window=15, ngram=5)`` asks for a window of 15 columns, N - 1 = 4 levels
    deep (``lookahead_rows`` 60); ``LookaheadConfig(window=0)`` raises ConfigError("window must be
    between 1 and 64, got 0").
    """

    # With budget="adaptive" (the default) every step verifies exactly as many tree
    # nodes as pay on this machine: it measures the forward-cost curve once (cached on
    # disk) and tracks acceptance per source, class and depth, and feeds 0 to W of the
    # window's columns. W=1 (x alone) leaves the window to auto_window.
    window: int = 1  # W: columns of the Jacobi lookahead window (>= 1)
    ngram: int = 2  # N: n-gram size of the window's columns; the window has N-1 levels (>= 2)
    pool_ngram: int = 2  # n-gram size of the pool fed by the prompt and the output (its own, not N)
    # With window=1 and the adaptive budget: open a W=15, N=5 window (its columns then fed step by step
    # as they pay) where the measured cost curve says rows are nearly free (a step over 1 + max_tree_nodes
    # rows costs at most CHEAP_STEP = 1.3 one-row steps, plan/window.py: a GPU at batch 1, or
    # budget_curve="flat"); elsewhere (a CPU, typically) it stays x alone (why: docs/DESIGN.md).
    auto_window: bool = True
    candidates: int = 4  # G: max candidate continuations per source per step (0 = none)
    pool_capacity: int = 4  # n-grams kept per first token in the pool (LRU)
    pool_max_keys: int = 16384  # distinct first tokens kept in the pool (LRU)
    ngram_pool: bool = True  # propose the pool's n-grams that start with x
    seed_from_prompt: bool = True  # put every prompt n-gram into the pool
    seed_from_output: bool = True  # put every accepted n-gram into the pool
    context_match: bool = True  # propose continuations of suffix matches in prompt + output
    match_min: int = 2  # shortest suffix that counts as a context match
    match_max: int = 4  # longest suffix tried by the context matcher
    match_length: int = 32  # most tokens proposed after a context match
    recycle: bool = True  # propose the model's own recent top-k successors (token recycling)
    recycle_width: int = 8  # successors remembered per token (R)
    draft_tokens: int = 8  # longest chain a draft model drafts per step (with LookaheadGenerator(draft_model=))
    draft_alternatives: int = 1  # greedy: the draft's runner-ups per chain depth, as one-token branches
    # Most tokens a draft model reads at once to catch up (the prompt, or text accepted while it was
    # silent): past that it starts over on the last draft_context tokens (0: it always reads everything).
    draft_context: int = 64
    # Memory across requests: tokens of earlier requests' text kept (the generator's lifetime, or a file
    # with save_memory / --memory) and proposed from when the current text repeats them; oldest requests
    # are evicted first; about 76 bytes of host memory per token (0: no store).
    memory_tokens: int = 262144
    memory_prompts: bool = False  # keep the requests' prompts in the store too, not only their outputs
    max_tree_nodes: int = 32  # cap on verification-tree nodes per step
    budget: str = "adaptive"  # "adaptive": size each step's tree by cost model; "fixed": always the cap
    # "measured": the budget prices a step by this machine's measured cost curve; "flat": every step
    # costs the same whatever its rows (what a GPU at batch 1 does up to a few hundred rows): a
    # simulation that shows what the budget builds where rows are free.
    budget_curve: str = "measured"
    cost_cache_dir: str = "~/.cache/lookahead/costs"  # where measured cost curves are kept ("" = nowhere)
    calibration_context: int = 256  # context tokens behind the cost measurement
    calibration_repeats: int = 5  # most timed passes per row count (median; stops once 3 agree)
    # On the CPU, let the cost measurement try lookahead's own linear kernel for 1-64-row forwards
    # (lookahead/model/fewrows.py) beside torch's (F.linear, and W @ x^T for 2-7 rows), each on torch's
    # threads and on one: every row count then runs through whichever route was fastest on this
    # machine, re-checked as steps run (lookahead/model/routing.py). False: torch's kernels only. No effect
    # on a GPU.
    few_row_matmul: bool = True
    window_seed: int = 0  # RNG seed of the window's initial guesses (sampling uses torch's generator)
    allow_untested_models: bool = False  # drive architectures outside the tested list

    def __post_init__(self) -> None:
        _check_int("window", self.window, 1, 64)
        _check_int("ngram", self.ngram, 2, 16)
        _check_int("pool_ngram", self.pool_ngram, 2, 16)
        _check_int("candidates", self.candidates, 0, 256)
        _check_int("pool_capacity", self.pool_capacity, 1, 1024)
        _check_int("pool_max_keys", self.pool_max_keys, 1)
        _check_int("match_min", self.match_min, 1, 64)
        _check_int("match_max", self.match_max, self.match_min, 64)
        _check_int("match_length", self.match_length, 1, 256)
        _check_int("max_tree_nodes", self.max_tree_nodes, 0, 4096)
        _check_int("draft_tokens", self.draft_tokens, 1, 64)
        _check_int("draft_alternatives", self.draft_alternatives, 0, 8)
        _check_int("draft_context", self.draft_context, 0)
        _check_int("recycle_width", self.recycle_width, 1, 64)
        _check_int("memory_tokens", self.memory_tokens, 0, 1 << 31)
        if self.memory_tokens == 1:
            raise ConfigError("memory_tokens must be 0 (no memory across requests) or at least 2, got 1")
        _check_int("calibration_context", self.calibration_context, 1, 65536)
        _check_int("calibration_repeats", self.calibration_repeats, 1, 100)
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name} must be one of {', '.join(map(repr, allowed))}, "
                                  f"got {getattr(self, name)!r}")
        if not isinstance(self.cost_cache_dir, str):
            raise ConfigError(f"cost_cache_dir must be a path string ('' to keep nothing on disk), "
                              f"got {self.cost_cache_dir!r}")
        _check_int("window_seed", self.window_seed, 0)
        for name in ("ngram_pool", "seed_from_prompt", "seed_from_output", "context_match", "recycle",
                     "auto_window", "few_row_matmul", "allow_untested_models", "memory_prompts"):
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
