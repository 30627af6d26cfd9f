"""What the ``lookahead`` commands share: the options that map to LookaheadConfig fields and to
sampling, the checks of what was typed, and how an error becomes one line (cli/main.py, cli/bench*.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NoReturn, TypeVar

import click

from lookahead.config import CHOICES, ConfigError, LookaheadConfig, field_kind, field_text
from lookahead.errors import OptionFix, one_line

F = TypeVar("F", bound=Callable[..., Any])  # a command callback, its options added by the decorators below

CLI_ERRORS = (ValueError, RuntimeError, OSError)  # every error type of ours subclasses one of these
DTYPES = ("float32", "bfloat16", "float16")


def field_help(field: dataclasses.Field) -> str:
    """A LookaheadConfig field's --help text: its documentation and range (``field_text``, lookahead/config.py),
    the other fields it names spelled as flags (max_tree_nodes -> --max-tree-nodes)."""
    text = field_text(field.name) if field.metadata.get("help") else f"LookaheadConfig.{field.name} (undocumented)"
    for name in sorted(LookaheadConfig.field_names(), key=len, reverse=True):
        if name != field.name and "_" in name:
            text = re.sub(rf"\b{name}\b", f"--{name.replace('_', '-')}", text)
    return text


def config_options(func: F) -> F:
    """One click option per LookaheadConfig field (``--window`` <-> ``window``), defaults and help from the
    dataclass, each of the type lookahead.config.field_kind gives (the one config parser, --config's and
    vLLM's settings' too)."""
    return config_options_with({})(func)


def config_options_with(defaults: Mapping[str, object]) -> Callable[[F], F]:
    """``config_options`` with the fields named in ``defaults`` defaulting to its values for one command
    (``lookahead serve``'s fair_share)."""
    unknown = set(defaults) - set(LookaheadConfig.field_names())
    assert not unknown, f"not LookaheadConfig fields: {sorted(unknown)}"

    def decorate(func: F) -> F:
        for field in reversed(dataclasses.fields(LookaheadConfig)):
            flag, kind, text = field.name.replace("_", "-"), field_kind(field.name), field_help(field)
            default = defaults.get(field.name, field.default)
            if kind is bool:
                func = click.option(f"--{flag}/--no-{flag}", field.name, default=default, show_default=True,
                                    help=text)(func)
            elif kind is str:  # checked by LookaheadConfig, so a bad value gets one line
                metavar = "|".join(CHOICES[field.name]) if field.name in CHOICES else "TEXT"
                func = click.option(f"--{flag}", field.name, type=str, default=default, show_default=True,
                                    metavar=metavar, help=text)(func)
            else:
                func = click.option(f"--{flag}", field.name, type=kind, default=default, show_default=True,
                                    help=text)(func)
        return func

    return decorate


def _set_threads(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    """--threads N: torch.set_num_threads(N) as soon as the option is read (before any model loads); a
    warning when N is more than the cores this process can run on."""
    if value is not None:
        import torch

        from lookahead.kernels.threads import usable_cores

        cores = usable_cores()
        if value > cores:
            warn_line(f"--threads {value} is more than the {cores} core{'s' if cores != 1 else ''} this process "
                      f"can run on: the extra threads wait for each other and every step slows down; pass "
                      f"--threads {cores} or fewer")
        torch.set_num_threads(value)
    return value


def threads_option(func: F) -> F:
    """--threads N: the threads torch (and so lookahead) computes on; left out, torch's own choice."""
    return click.option("--threads", type=click.IntRange(min=1), default=None, expose_value=False,
                        callback=_set_threads,
                        help="Threads to compute on (torch.set_num_threads; lookahead never uses more) "
                             "[default: torch's, i.e. OMP_NUM_THREADS or every core]. On a machine where other "
                             "work runs, fewer can be much faster.")(func)


def weights_option(func: F) -> F:
    """--weights auto|quantized|dequantized: load_model(weights=...), how a GGUF's weights are held."""
    from lookahead.loading.weights import WEIGHTS

    return click.option("--weights", type=click.Choice(WEIGHTS), default="auto", show_default=True,
                        help="How a GGUF model (an alias or a .gguf file) holds its weights: 'quantized' keeps the "
                             "file's block formats (about the file's size in memory; see --products for how they "
                             "multiply), 'dequantized' widens them to float32, 'auto' is 'quantized' on the CPU "
                             "in float32, else 'dequantized'.")(func)


def products_option(func: F) -> F:
    """--products auto|float32|int8: load_model(products=...), how a GGUF's kept blocks multiply."""
    from lookahead.loading.weights import PRODUCTS

    return click.option("--products", type=click.Choice(PRODUCTS), default="auto", show_default=True,
                        help="How a GGUF model's kept blocks multiply: 'float32' over the de-quantized values (the "
                             "float model's numbers), 'int8' with the inputs rounded to 8 bits and exact integer "
                             "sums (as llama.cpp; several times less work on a CPU with AVX-512 VNNI), 'auto' each "
                             "block format the one measured faster on this machine (kept in the cost cache). "
                             "Either way lookahead's output equals model.generate's on the same model.")(func)


def trust_remote_code_option(func: F) -> F:
    """--trust-remote-code: load_model(trust_remote_code=True)."""
    return click.option("--trust-remote-code", is_flag=True,
                        help="Let a checkpoint that ships its own modelling code run it "
                             "(load_model(trust_remote_code=True)).")(func)


SAMPLING_FIELDS = ("do_sample", "temperature", "top_k", "top_p", "min_p", "repetition_penalty")


def sampling_options(func: F) -> F:
    """--sample/--greedy, --temperature, --top-k, --top-p, --min-p, --repetition-penalty, --seed.

    Left out, each takes the model's generation_config value, as model.generate does.
    """
    options = [
        click.option("--sample/--greedy", "do_sample", default=None,
                     help="Sample (exactly the model's distribution) or decode greedily "
                          "[default: the model's generation_config, usually greedy]."),
        click.option("--temperature", type=float, default=None, help="Sampling temperature (0 = greedy)."),
        click.option("--top-k", type=int, default=None, help="Keep the k most likely tokens (0 = off)."),
        click.option("--top-p", type=float, default=None, help="Nucleus sampling mass in (0, 1]."),
        click.option("--min-p", type=float, default=None, help="Drop tokens below min_p x the top probability."),
        click.option("--repetition-penalty", type=float, default=None, help="> 1 penalises repeated tokens."),
        click.option("--seed", type=str, default=None,
                     help="torch.manual_seed before generating (reproducible samples): a whole number from 0 to "
                          "2**64-1."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def checked_sampling(sampling: Mapping[str, object]) -> None:
    """One line naming the flag (--top-p, not top_p) and exit status 2 for a sampling value out of the
    range generate takes (lookahead.call.decoding.RANGES, the engine's own check)."""
    from lookahead.call.decoding import RANGES

    for name, (low, high, closed) in RANGES.items():
        value = sampling.get(name)
        if not isinstance(value, (int, float)) or (low <= value <= high and (value > low or closed)):
            continue
        if high == float("inf"):
            bound = f"{'>=' if closed else '>'} {low:g}"
        else:
            bound = f"in {'[' if closed else '('}{low:g}, {high:g}]"
        fail(f"--{name.replace('_', '-')} must be {bound}, got {value:g}")


SEED_MAX = 2 ** 64 - 1  # torch.manual_seed takes 0 .. 2**64-1 (negatives only wrap around to those)


def checked_seed(text: str | None) -> int | None:
    """--seed as an int in 0 .. SEED_MAX (None when left out), or one line naming the range and exit status 2."""
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= SEED_MAX:
        fail(f"--seed must be a whole number from 0 to 2**64-1 ({SEED_MAX}), got {text}")
    return value


def checked_prompt(prompt: str) -> None:
    """One line and exit status 2 when --prompt is empty or not UTF-8 (bytes the shell handed over
    undecoded reach Python as lone surrogates, which no tokenizer takes)."""
    if not prompt.strip():
        fail("the prompt is empty: pass some text with --prompt")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(prompt[exc.start])
        what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"character U+{code:04X}"
        fail(f"--prompt is not UTF-8 text ({what} at character {exc.start + 1}): pass UTF-8 text, e.g. convert "
             f"it with iconv -f latin1 -t utf-8")


def fail(message: str) -> NoReturn:
    """One clear line on stderr and exit status 2."""
    click.echo(f"lookahead: error: {message}", err=True)
    sys.exit(2)


def warn_line(message: str) -> None:
    """One warning line on stderr (the run goes on)."""
    click.echo(f"lookahead: warning: {message}", err=True)


INTERRUPTED = 128 + signal.SIGINT  # 130: what a shell reports for a command Ctrl-C ended
READER_GONE = 128 + signal.SIGPIPE  # 141: what a shell reports for a command whose reader went away


def interrupted() -> NoReturn:
    """Ctrl-C: one line on stderr, exit status 130, no traceback."""
    if sys.stdout.isatty():
        click.echo("")  # end the line of text streamed so far
    click.echo("lookahead: interrupted (Ctrl-C)", err=True)
    sys.exit(INTERRUPTED)


def reader_gone() -> NoReturn:
    """stdout's reader went away (``lookahead generate ... | head -c 20``): exit at once and quietly with
    status 141, as a Unix tool killed by SIGPIPE does (the shell reports 128 + 13; ``set -o pipefail``
    scripts see the run was cut short, as for ``yes | head``). stdout is pointed at /dev/null first, so
    Python's last flush at exit has nowhere to fail."""
    with contextlib.suppress(OSError, ValueError):  # (a stdout without a file descriptor: nothing to flush)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    sys.exit(READER_GONE)


def cli_message(exc: Exception) -> str:
    """An error's message on one line, its fix spelled as a CLI option (--allow-untested-models, ...).

    A BrokenPipeError is no error to report (stdout's reader went away): it is raised again, for the
    ``lookahead`` group to end quietly (reader_gone) whichever command caught it."""
    if isinstance(exc, BrokenPipeError):
        raise exc
    fix, problem = getattr(exc, "fix", None), getattr(exc, "problem", None)  # set by lookahead.errors.with_fix
    if isinstance(fix, OptionFix) and isinstance(problem, str):
        return f"{problem}; {fix.cli_text()}"
    return one_line(exc)


@contextlib.contextmanager
def warnings_as_lines() -> Iterator[None]:
    """Show every warning raised inside as one line on stderr (not Python's two-line format)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        try:
            yield
        finally:
            for warning in caught:
                message = warning.message  # a Warning: warnings.warn makes a str message one of its category
                warn_line(one_line(message) if isinstance(message, Warning) else " ".join(message.split()))


def checked_config(values: Mapping[str, object]) -> LookaheadConfig:
    """The LookaheadConfig of the config options in values (``LookaheadConfig.from_mapping``), or one line
    naming the bad option and exit status 2."""
    try:
        return LookaheadConfig.from_mapping(values)
    except ConfigError as exc:
        fail(f"{exc} (option --{str(exc).split()[0].replace('_', '-')})")


def checked_memory_path(path: str | None, memory_tokens: int) -> None:
    """One line and exit status 2, before any model loads, when --memory cannot work: no store
    (--memory-tokens 0), or a path the memory file cannot be read from and written back to (the
    API's own check, lookahead/proposers/memory/file.py ``check_path``, so both say the same)."""
    if path is None:
        return
    if memory_tokens == 0:
        fail("--memory keeps requests in a memory store, and --memory-tokens 0 turns it off: "
             "pass --memory-tokens N (N >= 2) or leave --memory out")
    from lookahead.errors import MemoryFileError
    from lookahead.proposers.memory.file import check_path  # (numba's import: only when --memory is given)
    try:
        check_path(path, reading=True)
    except MemoryFileError as exc:
        fail(f"--memory: {exc}")

