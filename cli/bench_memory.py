"""``lookahead bench-memory``: repeated work answered in order, with and without memory across requests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

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
    from lookahead.config import LookaheadConfig


@click.command("bench-memory")
@click.option("--model", "model_name", default="smollm2-135m", show_default=True,
              help="Built-in alias, .gguf file, local directory or hub id.")
@click.option("--dataset", default="tool-calls", show_default=True,
              help="Data set whose requests are answered in order (as for `lookahead bench`).")
@click.option("--limit", type=int, default=48, show_default=True, help="Requests, in the data set's order.")
@click.option("--max-new-tokens", type=int, default=96, show_default=True)
@click.option("--slices", type=int, default=4, show_default=True, help="Parts of the sequence reported apart.")
@click.option("--anchor/--no-anchor", default=True, show_default=True,
              help="Also run SuffixDecoding's tree as the memory (built from arctic-inference's source, once).")
@click.option("--out", "out_dir", default=None, help="Directory for results.json and table.md.")
@click.option("--device", default="cpu", show_default=True)
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@trust_remote_code_option
@threads_option
@config_options
def bench_memory(model_name: str, dataset: str, limit: int, max_new_tokens: int, slices: int, anchor: bool,
                 out_dir: str | None, device: str, dtype: str, trust_remote_code: bool, **config_values: Any) -> None:
    """Requests of one kind in order: tokens/forward and speed vs greedy per slice, memory on and off."""
    if limit < 2 or max_new_tokens < 1 or not 1 <= slices <= limit:
        fail("--limit must be >= 2, --max-new-tokens >= 1 and --slices between 1 and --limit")
    config = checked_config(config_values)
    if config.memory_tokens == 0:
        fail("bench-memory compares memory on and off: leave --memory-tokens at a value >= 2")
    try:
        with warnings_as_lines():
            result = _run(model_name, dataset, limit, max_new_tokens, slices, anchor,
                          (device, dtype, trust_remote_code), config)
    except CLI_ERRORS as exc:
        fail(cli_message(exc))
    from lookahead.benchmarks.repeated import repeated_table

    table = repeated_table(result)
    click.echo(table)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "table.md").write_text(table + "\n")
        (out / "results.json").write_text(json.dumps({k: v for k, v in result.items()}, indent=1, default=str))


def _run(model_name: str, dataset: str, limit: int, max_new_tokens: int, slices: int, anchor: bool,
         loading: tuple[str, str, bool], config: LookaheadConfig) -> dict:
    """Load (device, dtype, trust_remote_code = loading), build the anchor if asked, run the sequence."""
    import torch

    from lookahead import load_model
    from lookahead.benchmarks.datasets import canonical_name, load_dataset
    from lookahead.benchmarks.parsers import render_prompt
    from lookahead.benchmarks.repeated import repeated_work
    from lookahead.benchmarks.report import environment, machine_line

    device, dtype, trust_remote_code = loading
    model, tokenizer = load_model(model_name, device=device, dtype=getattr(torch, dtype),
                                  trust_remote_code=trust_remote_code)
    prompts = [render_prompt(p, tokenizer, p.messages is not None)
               for p in load_dataset(canonical_name(dataset), limit)]
    cache = None
    if anchor:
        from lookahead.benchmarks.suffix_anchor import AnchorUnavailable, build_suffix_decoding

        try:
            cache = build_suffix_decoding(log=lambda line: click.echo(f"[bench-memory] {line}", err=True))
        except AnchorUnavailable as exc:
            click.echo(f"[bench-memory] SuffixDecoding skipped: {exc}", err=True)
    click.echo(f"[bench-memory] {machine_line(environment(dtype))}; {dataset}, {len(prompts)} requests in order, "
               f"{max_new_tokens} new tokens", err=True)

    def progress(index: int, rows: dict[str, tuple[int, int, float, float]]) -> None:
        cells = ", ".join(f"{name} {new}/{fwd} in {sec:.2f}s" for name, (new, fwd, sec, _) in rows.items())
        click.echo(f"[bench-memory] request {index + 1}: {cells}", err=True)

    result = repeated_work(model, tokenizer, prompts, max_new_tokens, config, cache, slices, progress)
    result["machine"] = machine_line(environment(dtype))
    return result
