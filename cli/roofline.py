"""``lookahead roofline``: this machine's memory roofline of a model and its compute roof beside its measured
step cost per row count, a breakdown of a step, and the host's share of real steps (benchmarks/roofline.py,
benchmarks/compute_roof.py)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .bench import checked_out_dir
from .options import (
    CLI_ERRORS,
    DTYPES,
    cli_message,
    fail,
    products_option,
    threads_option,
    trust_remote_code_option,
    warnings_as_lines,
    weights_option,
)

DEFAULT_ROWS = (1, 2, 4, 8, 16, 32)


@click.command("roofline")
@click.option("--model", "model_name", default="smollm2-135m", show_default=True,
              help="Built-in alias, .gguf file, local directory or hub id.")
@click.option("--device", default="cpu", show_default=True)
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@click.option("--context", type=int, default=256, show_default=True, help="Cached tokens behind every timed step.")
@click.option("--rows", "rows", type=int, multiple=True, default=DEFAULT_ROWS, show_default=True,
              help="Rows per step (repeatable).")
@click.option("--repeats", type=int, default=7, show_default=True,
              help="Timed passes over every row count and route (the median counts).")
@click.option("--out", "out_dir", default="roofline-out", show_default=True,
              help="Directory for roofline.json, roofline.md and roofline.png.")
@click.option("--peak-rows", type=int, default=None,
              help="Rows of the compute roof's products, where the arithmetic bounds them  [default: 256, the most "
                   "a step is routed for; raise it on a GPU, whose ridge lies further out]")
@click.option("--traced/--no-traced", default=True, show_default=True,
              help="On the CPU, time the best route's step replayed from a TorchScript trace too.")
@click.option("--allow-untested-models", is_flag=True, help="Measure an architecture outside the tested list.")
@trust_remote_code_option
@weights_option
@products_option
@threads_option
def roofline(model_name: str, device: str, dtype: str, context: int, rows: tuple[int, ...], repeats: int, out_dir: str,
             peak_rows: int | None, traced: bool, allow_untested_models: bool, trust_remote_code: bool,
             weights: str, products: str) -> None:
    """The model's memory roofline on this machine beside its measured steps (markdown on stdout)."""
    if any(q < 1 for q in rows):
        fail(f"--rows must be >= 1, got {min(rows)}")
    if context < 1:
        fail(f"--context must be >= 1, got {context}")
    if repeats < 1:
        fail(f"--repeats must be >= 1, got {repeats}")
    if peak_rows is not None and peak_rows < 1:
        fail(f"--peak-rows must be >= 1, got {peak_rows}")
    checked_out_dir(out_dir)
    try:
        with warnings_as_lines():
            result = _measure(model_name, (device, dtype, trust_remote_code, weights, products), tuple(rows), context,
                              repeats, allow_untested_models, traced, peak_rows)
            text = write_roofline(out_dir, result)
    except CLI_ERRORS as exc:
        fail(cli_message(exc))
    click.echo(text)


def _measure(model_name: str, loading: tuple[str, str, bool, str, str], rows: tuple[int, ...], context: int,
             repeats: int, allow_untested: bool, traced: bool = True, peak_rows: int | None = None) -> dict:
    """Load (device, dtype, trust_remote_code, weights, products = loading) and measure; the result with the
    machine's and the model's names added."""
    import torch
    import transformers

    from lookahead import load_model
    from lookahead.benchmarks.roofline import measure_roofline
    from lookahead.config import LookaheadConfig
    from lookahead.cost.measure import cpu_name
    from lookahead.native.build import tiled_width, tiled_width_timings

    device, dtype, trust_remote_code, weights, products = loading
    model, tokenizer = load_model(model_name, device=device, dtype=getattr(torch, dtype),
                                  trust_remote_code=trust_remote_code, weights=weights, products=products)
    config = LookaheadConfig(allow_untested_models=allow_untested)
    peak = {} if peak_rows is None else {"peak_rows": peak_rows}
    result = measure_roofline(model, tokenizer, rows, context, repeats, allow_untested, config, traced=traced, **peak)
    lanes, timings = tiled_width(), tiled_width_timings()  # (after the measurement, which loaded the C++ op)
    return {"model": model_name, "dtype": dtype, "cpu": cpu_name(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tiled_lanes": lanes, "tiled_timings_ms": timings, **result}


def write_roofline(out_dir: str, result: dict) -> str:
    """Write roofline.json, roofline.md and roofline.png under out_dir (made if missing); the markdown."""
    from lookahead.benchmarks.roofline import plot_roofline, report_markdown

    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    text = report_markdown(result)
    (out / "roofline.json").write_text(json.dumps(result, indent=1))
    (out / "roofline.md").write_text(text + "\n")
    plot_roofline(result, out / "roofline.png")
    return text
