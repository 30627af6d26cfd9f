"""LookaheadConfig: every knob of the engine, validated on construction."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

from .errors import ConfigError

TRUE_WORDS = ("true", "1", "yes")  # a switch's value written as text (parse_value)
FALSE_WORDS = ("false", "0", "no")
T = TypeVar("T")


def documented(default: T, help_text: str, low: int | float | str | None = None, high: int | float | None = None,
               choices: tuple[str, ...] | None = None) -> T:
    """A LookaheadConfig field declared once: its default, its documentation (``metadata["help"]``), and for
    a number the range it must lie in (``low``: a number or another field's name; ``high``: None for no
    bound), for a string the values it may take (``choices``). The constructor checks every field from
    this, the CLI's --help and docs/configuration.md render it (``field_text``)."""
    return field(default=default, metadata={"help": help_text, "low": low, "high": high, "choices": choices})


def _check_int(name: str, value: object, low: int, high: int | None = None) -> None:
    """Raise ConfigError unless value is an int in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"between {low} and {high}"
        raise ConfigError(f"{name} must be {bound}, got {value}")


def _check_field(name: str, value: object, default: object, about: Mapping[str, Any], config: object) -> None:
    """Raise ConfigError unless ``value`` is of its field's kind (the default's type) and within its declared
    range or choices (``documented``)."""
    low, high, choices = about.get("low"), about.get("high"), about.get("choices")
    if isinstance(low, str):
        low = getattr(config, low)  # (a bound set by another field)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be True or False, got {value!r}")
    elif isinstance(default, int):
        _check_int(name, value, int(low if low is not None else -(1 << 63)), None if high is None else int(high))
    elif isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (low is not None and value < low) or (high is not None and value > high):
            raise ConfigError(f"{name} must be a number between {low:g} and {high:g}, got {value!r}")
    elif choices is not None:
        if value not in choices:
            raise ConfigError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    elif isinstance(default, str) and not isinstance(value, str):
        raise ConfigError(f"{name} must be a path string ('' to keep nothing on disk), got {value!r}")


@dataclass(frozen=True)
class LookaheadConfig:
    """Settings of one LookaheadGenerator (hardware choices are measured where it runs, not set here).

    Letters used in shape comments: W = window, N = ngram, G = candidates.

    Example: ``LookaheadConfig(window=15, ngram=5)`` asks for a window of 15 columns, N - 1 = 4 levels
    deep (``lookahead_rows`` 60); ``LookaheadConfig(window=0)`` raises ConfigError("window must be
    between 1 and 64, got 0").
    """

    # With budget="adaptive" (the default) every step verifies exactly as many tree nodes as pay on this
    # machine: it measures the forward-cost curve once (cached on disk), tracks acceptance per source,
    # class and depth, and feeds 0 to W of the window's columns. W=1 (x alone) leaves the window to
    # auto_window. Each field's help (metadata["help"], documented()) is its documentation: the CLI's
    # --help shows it (cli/options.py), docs/configuration.md's table says the same.
    window: int = documented(1, "W: columns of the Jacobi lookahead window; the budget feeds 0 to W of "
                                "them each step; 1: no window (see auto_window)", 1, 64)
    ngram: int = documented(2, "N: n-gram size of the window's columns; the window has N-1 levels", 2, 16)
    pool_ngram: int = documented(2, "n-gram size of the pool fed by the prompt and the output, its own, not N",
                                 2, 16)
    # 1.3 is CHEAP_STEP (plan/window.py); why a CPU typically stays at x alone: docs/DESIGN.md.
    auto_window: bool = documented(True, "with window 1 and the adaptive budget, open a W=15, N=5 window where "
                                         "the measured cost curve says rows are nearly free (a step of "
                                         "1 + max_tree_nodes rows costs at most 1.3 one-row steps: a GPU at "
                                         "batch 1, or budget_curve flat); elsewhere, typically a CPU, no window")
    candidates: int = documented(4, "G: most candidate continuations per source per step (0: none)", 0, 256)
    pool_capacity: int = documented(4, "n-grams kept per first token in the pool, least recently used dropped",
                                    1, 1024)
    pool_max_keys: int = documented(16384, "distinct first tokens kept in the pool, least recently used dropped",
                                        1)
    ngram_pool: bool = documented(True, "propose the pool's n-grams that start with the last token")
    seed_from_prompt: bool = documented(True, "put every n-gram of the prompt into the pool")
    seed_from_output: bool = documented(True, "put every accepted n-gram into the pool")
    context_match: bool = documented(True, "propose what followed earlier occurrences of the current suffix in "
                                           "the prompt and the output")
    match_min: int = documented(2, "shortest suffix that counts as a context match", 1, 64)
    match_max: int = documented(4, "longest suffix the context matcher tries", "match_min", 64)
    match_length: int = documented(32, "most tokens proposed after a context match", 1, 256)
    recycle: bool = documented(True, "token recycling: propose the model's own recent top-k successors")
    recycle_width: int = documented(8, "R: successors remembered per token for recycling", 1, 64)
    draft_tokens: int = documented(8, "longest chain a draft model drafts per step, with a draft model only",
                                   1, 64)
    draft_alternatives: int = documented(1, "greedy: the draft's runner-ups per chain depth, added as one-token "
                                            "branches", 0, 8)
    draft_context: int = documented(64, "most tokens a draft model reads at once to catch up (the prompt, or "
                                        "text accepted while it was silent); past that it starts over on the "
                                        "last that many tokens (0: it always reads everything)", 0)
    memory_tokens: int = documented(262144, "memory across requests: tokens of earlier requests' text kept (for "
                                            "the generator's lifetime, or in a file with save_memory / --memory) "
                                            "and proposed from when the current text repeats them; oldest "
                                            "requests evicted first; about 76 bytes of host memory each (0: no "
                                            "store, else at least 2)", 0, 1 << 31)
    memory_prompts: bool = documented(False, "keep the requests' prompts in the memory store too, not only their "
                                             "outputs")
    prefix_cache_mb: int = documented(256, "prefix cache: MiB of memory for copies of prompts' prefilled keys and "
                                           "values (and of finished requests' output), so that a prompt beginning "
                                           "with a kept one (a resent conversation) prefills only the rest; least "
                                           "recently used dropped. Used only where that gives the bits a whole "
                                           "prefill gives (int8 products of GGUF blocks on the CPU); 0: none",
                                      0, 1 << 20)
    prefill_chunk: int = documented(256, "rows a prompt is prefilled in, one forward after another, where that "
                                        "gives a whole prefill's bits (int8 products of GGUF blocks on the CPU): "
                                        "a long prompt's intermediate tensors stay small (less memory kept, and "
                                        "faster where a whole prompt's would outgrow the caches), and a prompt "
                                        "joining a batch whose sequences decode (an open batch, a server) takes "
                                        "one chunk before each step, so that their streams wait for one chunk, "
                                        "not the whole prompt; 0: every prompt whole", 0, 1 << 20)
    max_tree_nodes: int = documented(32, "cap on verification-tree nodes per step", 0, 4096)
    budget: str = documented("adaptive", "adaptive: size each step's tree and window by the cost curve; fixed: "
                                         "always the whole window and up to max_tree_nodes",
                             choices=("adaptive", "fixed"))
    # "flat" is what a GPU at batch 1 does up to a few hundred rows.
    budget_curve: str = documented("measured", "measured: the budget prices a step by this machine's measured "
                                               "cost curve; flat: every step costs one row's whatever its rows (a "
                                               "simulation of what the budget builds where rows are free)",
                                   choices=("measured", "flat"))
    check_speculation: bool = documented(True, "scale what the budget expects of speculative steps by what they "
                                               "really gave lately against their forecast, relative to plain "
                                               "steps (lookahead/plan/speculation.py); off: trust the forecast")
    pause_plain_batches: bool = documented(True, "with several sequences in a batch, stop proposing for a while "
                                                 "after a run of steps the budget took plain (proposing is host "
                                                 "work every sequence pays each step), longer each time it stays "
                                                 "plain (lookahead/plan/pause.py); off: propose every step")
    fair_share: float = documented(0.0, "with several sequences in a batch (a server), admit a step shape only if "
                                        "every sequence is expected to decode at this fraction of a plain step's "
                                        "rate or faster (1: no request slower than without speculation, "
                                        "0: the batch's total tokens per second alone decide)", 0.0, 1.0)
    cost_cache_dir: str = documented("~/.cache/lookahead/costs", "where measured cost curves are kept "
                                                                 "('': keep nothing on disk)")
    calibration_context: int = documented(256, "context tokens behind the cost measurement", 1, 65536)
    calibration_repeats: int = documented(5, "most timed passes per row count in the cost measurement (median; "
                                             "stops once 3 agree)", 1, 100)
    # Each curve is bounded on its own: the target's, a draft's, each batch size's (lookahead/cost/measure.py).
    calibration_seconds: int = documented(12, "wall-clock bound in seconds on one cost measurement, its prefill "
                                              "included; where the full one would not fit it times fewer "
                                              "row counts (the others interpolated) or fewer passes, and says "
                                              "which; only the coarsest (every route once at the smallest and "
                                              "largest step) may take longer", 1, 3600)
    # What a step costs under someone else's load is unknown, so by default such a curve is not kept.
    keep_busy_curve: bool = documented(False, "cache a cost curve measured while other processes kept a quarter "
                                              "core or more busy; by default it is used for that run only and "
                                              "measured again next run (or measure one while the machine is idle: "
                                              "lookahead costs measure)")
    # The routes: lookahead/model/fewrows.py beside F.linear (and W @ x^T for 1-64 rows), each on torch's
    # threads and on one; every row count runs through the fastest, re-checked as steps run (model/routing.py).
    onednn_linear: bool = documented(False, "on the CPU, let the cost measurement also try torch's oneDNN linear "
                                            "over weights packed once (a copy as large as the linear layers' "
                                            "weights, float32, made only where it fits in a third of the free "
                                            "memory); it wins over 8 rows and more, and with few_row_matmul off")
    few_row_matmul: bool = documented(True, "on the CPU, let the cost measurement try lookahead's own linear "
                                            "kernel for a step's forwards beside torch's, each row count then "
                                            "running through the fastest route, and prompts prefill through its "
                                            "tiled kernel where the first prefills measure it faster; off: "
                                            "torch's kernels only (no effect on a GPU)")
    cuda_graphs: bool = documented(True, "on a CUDA GPU, replay a single sequence's steps as CUDA graphs (one "
                                         "captured per step size of 1-128 rows, over a KV buffer kept for "
                                         "later calls): a step then costs its kernels, not their launches "
                                         "from Python; no effect on the CPU, with several sequences at once "
                                         "or on models with sliding-window layers")
    traced_forward: bool = documented(True, "on the CPU, replay a step's forward from a TorchScript trace of "
                                            "the model: its ops without the Python around them. One trace "
                                            "(about a second to make) serves every step length, route and "
                                            "batch size; it is made once the process's eager steps, with the "
                                            "steps the call may still run, take twice that (in a server: on "
                                            "sight), and used only where it gives the "
                                            "eager forward's logits and keys to the bit; steps run eagerly "
                                            "while a forward hook is set. No effect on a GPU or with "
                                            "sliding-window layers")
    native_linear: bool = documented(True, "on the CPU, lookahead's C++ op (built with the C++ compiler and "
                                           "ninja torch builds its extensions with, once per machine when its "
                                           "first generator is made, 15-30 s, then kept): a traced forward calls "
                                           "the linear kernel through it, with no Python between the layers, "
                                           "and float32 products over 2-64 rows run through its tiled AVX2 "
                                           "kernel, eager or traced; where it cannot be built, or off, a "
                                           "Python op and numba's kernel, which pays the interpreter's call on "
                                           "every layer (`lookahead bench` with and without --native-linear "
                                           "measures the difference)")
    native_attention: bool = documented(True, "on the CPU, with native_linear's C++ op loaded: a float32 step's "
                                               "grouped-query attention (query heads sharing key/value heads, "
                                               "as Llama-style models have) over its 1-128 rows through the "
                                               "op's kernel instead of torch's SDPA, whose blocking is sized for "
                                               "long queries; no effect otherwise")
    huge_pages: bool = documented(True, "on a Linux CPU that offers transparent huge pages: the model's "
                                        "weights copied once, values unchanged, into memory backed by 2 MB "
                                        "pages, so a step streams them with fewer TLB misses (`lookahead bench` "
                                        "with and without --huge-pages measures the gain); the copy is shared "
                                        "by every generator of the model")
    keep_freed_memory: bool = documented(True, "on a Linux CPU with glibc: the C heap keeps what a forward "
                                               "frees for the next one (malloc's mmap threshold 256 MB and trim "
                                               "threshold 1 GB, set for the whole process) instead of the kernel "
                                               "handing every forward's intermediates fresh pages to zero; up to "
                                               "1 GB more resident; the gain grows with the prompt: blocks past "
                                               "32 MB, glibc's own limit, were mapped afresh every prefill (a "
                                               "prefill timed with and without --keep-freed-memory measures it); "
                                               "once set, the process keeps it")
    window_seed: int = documented(0, "RNG seed of the window's initial guesses (sampling draws from torch's "
                                     "random generator)", 0)
    allow_untested_models: bool = documented(False, "drive architectures outside the tested list (with an "
                                                    "UntestedModelWarning)")

    def __post_init__(self) -> None:
        for item in fields(self):
            _check_field(item.name, getattr(self, item.name), item.default, item.metadata, self)
        if self.memory_tokens == 1:
            raise ConfigError("memory_tokens must be 0 (no memory across requests) or at least 2, got 1")

    @property
    def lookahead_rows(self) -> int:
        """Rows of the lookahead branch, x included: W * (N - 1)."""
        return self.window * (self.ngram - 1)

    @classmethod
    def field_names(cls) -> list[str]:
        """Names of all fields (the CLI maps one option to each)."""
        return [f.name for f in fields(cls)]

    @classmethod
    def from_mapping(cls, values: Mapping[str, object], base: LookaheadConfig | None = None) -> LookaheadConfig:
        """``base`` (default: LookaheadConfig()) with the fields named in ``values`` replaced: the one way a
        config is made from what a person or a file gave (the CLI's options, vLLM's ``additional_config``,
        a benchmark's ``--config`` spec).

        A value is the field's value or, for a bool, int or float field, its text (read by ``parse_value``).
        ``{"window": "5", "recycle": "no"}`` -> LookaheadConfig(window=5, recycle=False). ConfigError names a
        key that is no field, or text that is no value of its field; the constructor's checks name a value
        out of range.
        """
        unknown = [key for key in values if key not in _defaults()]
        if unknown:
            raise ConfigError(f"{unknown[0]!r} is no LookaheadConfig field; fields: {', '.join(_defaults())}")
        typed: dict[str, Any] = {key: parse_value(key, value) if isinstance(value, str) and field_kind(key) is not str
                                 else value for key, value in values.items()}
        return replace(base or cls(), **typed)


def _defaults() -> dict[str, object]:
    """Every LookaheadConfig field's default, by name, in the dataclass's order."""
    return {f.name: f.default for f in fields(LookaheadConfig)}


def field_kind(name: str) -> type:
    """The type of a LookaheadConfig field's value, read from its default: bool, int, float or str."""
    return type(_defaults()[name])


def parse_value(name: str, raw: str) -> bool | int | float | str:
    """Field ``name``'s value written as text (stripped): true/false (or 1/0, yes/no) for a switch, a whole
    number for an int field, a number for a float field, the text itself for a str field. ConfigError names
    the field and the text."""
    kind, text = field_kind(name), raw.strip()
    if kind is bool:
        if text.lower() not in TRUE_WORDS + FALSE_WORDS:
            raise ConfigError(f"{name} must be true or false, got {text!r}")
        return text.lower() in TRUE_WORDS
    if kind is int:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"{name} must be an integer, got {text!r}") from None
    if kind is float:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"{name} must be a number, got {text!r}") from None
    return text


CHOICES = {f.name: f.metadata["choices"] for f in fields(LookaheadConfig) if f.metadata.get("choices")}


def field_text(name: str) -> str:
    """A field's documentation with its declared range or choices: what --help and docs/configuration.md say.
    Worked example: field_text("window") ends with "[1-64]"."""
    about = next(f.metadata for f in fields(LookaheadConfig) if f.name == name)
    low, high, choices = about.get("low"), about.get("high"), about.get("choices")
    if choices:
        return f"{about['help']} [{' | '.join(choices)}]"
    if low is None:
        return str(about["help"])
    bound = f">= {low}" if high is None else f"{low} to {high}" if isinstance(low, str) else f"{low}-{high}"
    return f"{about['help']} [{bound}]"


def configuration_table() -> str:
    """docs/configuration.md's table of every field (name, default, documentation), from the declarations."""
    rows = ["| field | default | meaning |", "|---|---|---|"]
    for item in fields(LookaheadConfig):
        default = f"`{item.default!r}`" if isinstance(item.default, str) else str(item.default)
        text = field_text(item.name).replace("|", "\\|")
        rows.append(f"| `{item.name}` | {default} | {text} |")
    return "\n".join(rows) + "\n"
