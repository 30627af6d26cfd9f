"""``lookahead bench-batch``: tokens/s of lookahead against model.generate on left-padded batches."""

from __future__ import annotations

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


@click.command("bench-batch")
@click.option("--model", "model_name", default="smollm2-135m", show_default=True,
              help="Built-in alias, .gguf file, local directory or hub id.")
@click.option("--dataset", "datasets", multiple=True, default=("mt-bench", "gsm8k"), show_default=True,
              help="Data set (repeatable), as for `lookahead bench`.")
@click.option("--limit", type=int, default=8, show_default=True, help="Prompts per data set.")
@click.option("--batch-size", "sizes", type=int, multiple=True, default=(1, 4, 8), show_default=True,
              help="Batch size (repeatable).")
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--device", default="cpu", show_default=True)
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@trust_remote_code_option
@threads_option
@config_options
def bench_batch(model_name: str, datasets: tuple[str, ...], limit: int, sizes: tuple[int, ...], max_new_tokens: int,
                device: str, dtype: str, trust_remote_code: bool, **config_values: Any) -> None:
    """Greedy batches: lookahead vs model.generate, tokens/s per batch size (markdown on stdout)."""
    if limit < 1 or max_new_tokens < 1 or any(s < 1 for s in sizes):
        fail("--limit, --max-new-tokens and --batch-size must be >= 1")
    config = checked_config(config_values)
    try:
        with warnings_as_lines():
            rows = _throughput(model_name, datasets, limit, sizes, max_new_tokens,
                               (device, dtype, trust_remote_code), config)
    except CLI_ERRORS as exc:
        fail(cli_message(exc))
    from lookahead.benchmarks.batching import batch_table

    click.echo(batch_table(rows))


def _throughput(model_name: str, datasets: tuple[str, ...], limit: int, sizes: tuple[int, ...], max_new_tokens: int,
                loading: tuple[str, str, bool], config: LookaheadConfig) -> list[dict]:
    """Load (device, dtype, trust_remote_code = loading) and time every batch size; the table's rows."""
    import torch

    from lookahead import load_model
    from lookahead.benchmarks.batching import batch_throughput
    from lookahead.benchmarks.datasets import canonical_name, load_dataset
    from lookahead.benchmarks.parsers import render_prompt

    device, dtype, trust_remote_code = loading
    model, tokenizer = load_model(model_name, device=device, dtype=getattr(torch, dtype),
                                  trust_remote_code=trust_remote_code)
    prompts = []
    for name in datasets:
        for prompt in load_dataset(canonical_name(name), limit):
            prompts.append(render_prompt(prompt, tokenizer, prompt.messages is not None))
    return batch_throughput(model, tokenizer, prompts, tuple(sizes), max_new_tokens, config)

