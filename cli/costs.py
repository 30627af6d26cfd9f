"""``lookahead costs``: the step-cost curves lookahead keeps in cost_cache_dir (lookahead/cost/): list them,
measure one now (say while the machine is idle), clear them."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from lookahead.config import LookaheadConfig

from .options import (
    CLI_ERRORS,
    DTYPES,
    checked_config,
    cli_message,
    config_options,
    fail,
    threads_option,
    trust_remote_code_option,
    warnings_as_lines,
)

if TYPE_CHECKING:
    from lookahead.cost.curve import CostModel
    from lookahead.cost.disk import CachedCurve

CACHE_DIR = LookaheadConfig.cost_cache_dir  # the default where curves are kept
COLUMNS = ("model", "dtype", "device", "cpu", "threads", "batch", "rows", "written", "file", "notes")


def cache_dir_option(func: Any) -> Any:
    """--cost-cache-dir DIR: the directory the curves are kept in (LookaheadConfig.cost_cache_dir)."""
    return click.option("--cost-cache-dir", default=CACHE_DIR, show_default=True,
                        help="Where measured cost curves are kept (LookaheadConfig.cost_cache_dir).")(func)


def checked_cache_dir(cost_cache_dir: str) -> str:
    """The cache directory with ~ expanded, or one line and exit status 2 when it is empty."""
    if not cost_cache_dir.strip():
        fail("--cost-cache-dir is empty, which keeps no curves: pass the directory they are kept in "
             f"(left out: {CACHE_DIR})")
    return os.path.expanduser(cost_cache_dir)


@click.group("costs")
def costs() -> None:
    """The measured step-cost curves lookahead keeps: list them, measure one now, clear them.

    A curve says what a decode step over q rows costs on this machine; lookahead measures one the first
    time a model, dtype and thread count decodes (within --calibration-seconds), and keeps it only if it
    looks right and no other process kept the CPU busy meanwhile (--keep-busy-curve keeps it anyway)."""


# ---------------------------------------------------------------- list
@costs.command("list")
@cache_dir_option
def list_curves(cost_cache_dir: str) -> None:
    """The cached curves, newest first: model, CPU, threads, batch size, rows, when written, file."""
    from lookahead.cost.disk import cached_curves

    directory = checked_cache_dir(cost_cache_dir)
    found = cached_curves(directory)
    if not found:
        where = "" if os.path.isdir(directory) else " (the directory does not exist)"
        click.echo(f"no cost curves in {directory}{where}")
        return
    click.echo(f"{len(found)} cost curve file{'s' if len(found) != 1 else ''} in {directory}, newest first:")
    click.echo(table([COLUMNS] + [described(curve) for curve in found]))


def described(curve: CachedCurve) -> tuple[str, ...]:
    """One row of ``costs list``: COLUMNS of a cached curve (a file that is no curve says so in notes)."""
    import torch

    from lookahead.cost.measure import cpu_name
    from lookahead.cost.store import LOAD_LIMIT, ROUTES_VERSION, model_name

    written = time.strftime("%Y-%m-%d %H:%M", time.localtime(curve.written))
    name = os.path.basename(curve.path)
    fp = curve.fingerprint
    if fp is None:
        why = "left over from a write that was cut short" if name.endswith(".tmp") else "unreadable: no curve file"
        return ("?", "", "", "", "", "", "", written, name, f"{why} (costs clear removes it)")
    rows = fp.get("rows") or [0]
    notes = []
    if fp.get("routes_version") != ROUTES_VERSION:
        notes.append("measured by an older lookahead: not read")
    if fp.get("torch") != torch.__version__:
        notes.append(f"torch {fp.get('torch')}: not read by torch {torch.__version__}")
    if fp.get("cpu") != cpu_name():
        notes.append("another CPU: not read here")
    defaults = LookaheadConfig()
    if fp.get("device") == "cpu" and not any("kernel" in str(route) for route in fp.get("routes", [])):
        notes.append("torch's kernels only (few_row_matmul off)")
    if fp.get("context") != defaults.calibration_context:
        notes.append(f"context {fp.get('context')}")
    if fp.get("repeats") != defaults.calibration_repeats:
        notes.append(f"calibration_repeats {fp.get('repeats')}")
    about = curve.about
    if isinstance(about.get("busy_cores"), (int, float)) and about["busy_cores"] >= LOAD_LIMIT:
        notes.append(f"kept while other processes kept {about['busy_cores']:.1f} cores busy")
    timed = about.get("rows_timed")
    if isinstance(timed, list) and len(timed) < len(rows):
        notes.append(f"{len(timed)} of {len(rows)} row counts timed (calibration_seconds)")
    if isinstance(about.get("refined_steps"), int):
        notes.append(f"refined by {about['refined_steps']} steps")
    return (short_path(model_name(fp)) if fp.get("name_or_path") else f"({fp.get('model_type', '?')}, unnamed)",
            str(fp.get("dtype", "")).removeprefix("torch."), str(fp.get("device", "")), str(fp.get("cpu", "")),
            str(fp.get("threads", "")), str(fp.get("batch", 1)), f"{rows[0]}-{rows[-1]}", written, name,
            "; ".join(notes))


def short_path(name: str) -> str:
    """A path under the home directory written with ~ (other names as they are)."""
    home = os.path.expanduser("~")
    return "~" + name[len(home):] if home not in ("", "~", "/") and name.startswith(home + os.sep) else name


def table(rows: list[tuple[str, ...]]) -> str:
    """Rows of cells as left-aligned columns two spaces apart (the last column unpadded)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


# ---------------------------------------------------------------- measure
@costs.command("measure")
@click.option("--model", "model_name", default="smollm2-135m", show_default=True,
              help="Built-in alias, .gguf file, local directory or hub id.")
@click.option("--device", default="cpu", show_default=True, help="Where the model runs (as for generate).")
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True,
              help="The model's dtype (as for generate): each dtype has its own curve.")
@click.option("--batch-size", "batch_sizes", type=click.IntRange(min=2), multiple=True,
              help="Also measure the curve of steps over this many sequences (repeatable): what batched generate "
                   "calls and lookahead serve decode with.")
@trust_remote_code_option
@threads_option
@config_options
def measure(model_name: str, device: str, dtype: str, batch_sizes: tuple[int, ...], trust_remote_code: bool,
            **values: Any) -> None:
    """Measure the step-cost curve now and cache it, over whatever is cached (e.g. while the machine is idle).

    The same curves `lookahead generate` with these options measures: same --threads, --dtype and
    LookaheadConfig options, so generate reads them back. Exit status 1 when a curve could not be cached
    (the line before says why)."""
    config = checked_config(values)
    checked_cache_dir(config.cost_cache_dir)
    try:
        with warnings_as_lines():
            measured = _measure(model_name, (device, dtype, trust_remote_code), config, batch_sizes)
    except CLI_ERRORS as exc:
        fail(cli_message(exc))
    if not measured:
        click.echo(f"nothing to measure: {model_name} on {device} needs no curve without the adaptive budget "
                   f"(--budget adaptive) off the CPU")
        return
    for batch, curve in measured:
        click.echo(f"batch {batch}: " + (f"cached in {curve.cached}" if curve.cached else "not cached"))
    if any(curve.cached is None for _, curve in measured):
        click.echo("lookahead: a curve was not cached (the line above it says why)", err=True)
        sys.exit(1)


def _measure(model_name: str, loading: tuple[str, str, bool], config: LookaheadConfig,
             batch_sizes: tuple[int, ...]) -> list[tuple[int, CostModel]]:
    """Load (device, dtype, trust_remote_code = loading) and measure, whatever the cache holds, the curves a
    generator with ``config`` measures (cost/policy.py), then those of ``batch_sizes``: [(batch, curve)],
    [] where none is needed."""
    import torch

    from lookahead import load_model
    from lookahead.cost.policy import CostPolicy, budgeted
    from lookahead.kernels import warmup
    from lookahead.kernels.threads import start_numba_threads, usable_cores
    from lookahead.model.heap import keep_freed_memory
    from lookahead.model.hugepages import move_to_huge_pages
    from lookahead.model.support import check_model
    from lookahead.model.switches import ForwardSwitches
    from lookahead.model.target import Target, input_device
    from lookahead.plan.window import auto_window

    device, dtype, trust_remote_code = loading
    model, _ = load_model(model_name, device=device, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code)
    # (as LookaheadGenerator builds it: the weights where its would be, the same curves, the same cache keys)
    if config.huge_pages:
        move_to_huge_pages(model)
    if config.keep_freed_memory and input_device(model).type == "cpu":
        keep_freed_memory()
    target = Target(model, check_model(model, config.allow_untested_models), ForwardSwitches.of(config))
    policy = CostPolicy(target, config)
    start_numba_threads()  # as a generator does before its measurement: the kernels compiled, not timed compiling
    warmup(workers=usable_cores())
    cost = policy.measure(config, fresh=True)
    if cost is None:
        return []
    run = auto_window(config, policy.priced(cost)) if budgeted(config) else config
    if run is not config:  # the window opens here: a generator measures again, up to the steps it makes
        cost = policy.measure(run, fresh=True)
        assert cost is not None  # (needed for run as for config)
    measured = [(1, cost)]
    for batch in sorted(set(batch_sizes)):
        curve = policy.measure(run, batch, fresh=True)
        assert curve is not None
        measured.append((batch, curve))
    return measured


# ---------------------------------------------------------------- clear
@costs.command("clear")
@click.option("--model", "model_name", default=None,
              help="Remove only this model's curves: a name as --model takes it (an alias, a directory, a .gguf, "
                   "a hub id) [default: every curve].")
@cache_dir_option
def clear(model_name: str | None, cost_cache_dir: str) -> None:
    """Remove cached curves (all, or one model's): the next run measures again."""
    from lookahead.cost.disk import cached_curves

    directory = checked_cache_dir(cost_cache_dir)
    found = cached_curves(directory)
    chosen = [c for c in found if model_name is None or (c.fingerprint is not None
                                                         and names_model(model_name, c.fingerprint))]
    if model_name is not None and not chosen:
        present = sorted({short_path(_name(c.fingerprint)) for c in found if c.fingerprint is not None})
        click.echo(f"no cost curves of {model_name} in {directory}"
                   + (f" (curves there: {', '.join(present)})" if present else ""))
        return
    removed = 0
    for curve in chosen:
        try:
            os.remove(curve.path)
            removed += 1
        except FileNotFoundError:  # removed meanwhile
            continue
        except OSError as exc:
            fail(f"cannot remove {curve.path} ({exc.strerror or exc}): remove it by hand, or pass a "
                 f"--cost-cache-dir you can write to")
    what = f" of {model_name}" if model_name is not None else ""
    click.echo(f"removed {removed} cost curve file{'s' if removed != 1 else ''}{what} from {directory}")


def _name(fingerprint: dict) -> str:
    """The model a fingerprint names, as ``costs list`` shows it."""
    from lookahead.cost.store import model_name

    return model_name(fingerprint) if fingerprint.get("name_or_path") else f"({fingerprint.get('model_type')}, unnamed)"


def names_model(name: str, fingerprint: dict) -> bool:
    """Whether ``--model name`` names the model a curve was measured for: its name or path as loaded, the
    alias whose directory lookahead built, the same directory written another way, or the .gguf file whose
    de-quantized directory it was (lookahead names that directory after the file)."""
    from lookahead.cost.store import model_name

    loaded = str(fingerprint.get("name_or_path") or "")
    if not loaded:
        return False
    if name in (loaded, model_name(fingerprint)):
        return True
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        built = Path(loaded)
        return built.parent.name == "models" and built.name.startswith(f"{path.stem}-")
    return path.exists() and os.path.realpath(path) == os.path.realpath(loaded)
