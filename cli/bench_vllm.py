"""``lookahead bench-vllm``: vLLM without speculation, with its ngram and suffix proposers and with
lookahead's, on chat data sets in order (lookahead/benchmarks/vllm_bench.py). Runs where vLLM is
installed (docs/vllm.md)."""

from __future__ import annotations

import importlib.util
import json

import click

from .bench import checked_datasets, checked_out_dir, require_bench_extra
from .bench_serve import chat_prompts, local_model_dir
from .options import CLI_ERRORS, cli_message, fail

DEFAULT_DATASETS = ("tool-calls", "mt-bench-1")
METHODS = ("none", "ngram", "suffix", "lookahead")  # lookahead.benchmarks.vllm_bench.METHODS
SCHEDULES = ("closed", "waves")  # lookahead.benchmarks.vllm_bench.SCHEDULES


@click.command("bench-vllm")
@click.option("--model", "model_name", default="smollm2-135m", show_default=True,
              help="Built-in alias, .gguf file or local directory (vLLM gets its directory).")
@click.option("--dataset", "datasets", multiple=True, default=(), show_default=", ".join(DEFAULT_DATASETS),
              help="Chat data set replayed in order (repeatable), as `lookahead bench` names them.")
@click.option("--limit", type=click.IntRange(min=1), default=24, show_default=True,
              help="Prompts per data set, in its order.")
@click.option("--concurrency", default="1,4", show_default=True,
              help="Requests in flight, comma-separated levels; each level runs on a freshly started engine.")
@click.option("--schedule", type=click.Choice(SCHEDULES), default="closed", show_default=True,
              help="closed: `concurrency` requests in flight, the next prompt joining as one finishes (as that "
                   "many clients); waves: `concurrency` prompts at a time, the next wave after the slowest of them.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=64, show_default=True,
              help="max_tokens of every request.")
@click.option("--method", "methods", multiple=True, type=click.Choice(METHODS), default=(),
              show_default="all four", help="Methods to measure (repeatable).")
@click.option("--k", "k", type=click.IntRange(1, 32), default=6, show_default=True,
              help="num_speculative_tokens of every speculating method.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True,
              help="vLLM's dtype.")
@click.option("--lookahead-settings", default="{}", show_default=True,
              help='additional_config["lookahead"] of lookahead\'s proposer, as JSON, e.g. \'{"least_accept": 0.4}\'.')
@click.option("--out", "out_dir", default="bench-vllm-out", show_default=True,
              help="Directory for bench-vllm.json, bench-vllm.md and bench-vllm.png.")
def bench_vllm(model_name: str, datasets: tuple[str, ...], limit: int, concurrency: str, schedule: str,
               max_tokens: int, methods: tuple[str, ...], k: int, dtype: str, lookahead_settings: str,
               out_dir: str) -> None:
    """Measure vLLM on this machine without speculation, with ngram, suffix and lookahead's proposer:
    tokens/s (all, and the second half of each data set), mean accepted length, same text as without.

    Needs vLLM (pip install -e ".[vllm]" in an environment of its own; docs/vllm.md) and the [bench]
    extra. Run it on an otherwise idle machine.
    """
    require_bench_extra()
    if importlib.util.find_spec("vllm") is None:
        fail('lookahead bench-vllm needs vLLM in this environment: pip install -e ".[vllm]" in an environment '
             'of its own (docs/vllm.md)')
    from lookahead.benchmarks.serving import parse_concurrency
    from lookahead.benchmarks.vllm_bench import Settings, run_bench, write_report
    from lookahead.vllm.settings import settings_from

    try:
        levels = parse_concurrency(concurrency)
    except ValueError as exc:
        fail(f"{exc} (option --concurrency)")
    try:
        extra = json.loads(lookahead_settings)
        settings_from({"lookahead": extra})  # refused here, not inside an engine
    except (ValueError, TypeError) as exc:
        fail(f"{cli_message(exc)} (option --lookahead-settings)")
    names = checked_datasets(datasets or DEFAULT_DATASETS)
    checked_out_dir(out_dir)
    try:
        prompts = chat_prompts(names, limit)
        model_dir = local_model_dir(model_name)
    except CLI_ERRORS as exc:
        fail(cli_message(exc))
    chosen = tuple(m for m in METHODS if m in methods) if methods else METHODS
    settings = Settings(model_dir, prompts, chosen, tuple(levels), max_tokens, k, dtype, extra, schedule)
    data = run_bench(settings, log=lambda line: click.echo(line, err=True))
    paths = write_report(out_dir, data)
    click.echo(paths["text"])
    click.echo(f"wrote {paths['json']}, {paths['markdown']}, {paths['figure']}")
