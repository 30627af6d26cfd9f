"""Tokens per forward per data set and config: what a budget accepts, with no clock involved.

    python -m lookahead.benchmarks.acceptance --model smollm2-135m --dataset humaneval --dataset gsm8k \\
        --config "flat:budget_curve=flat" --config "flat-window:budget_curve=flat,window=15,ngram=5"

Each config gets ONE generator per data set, reused over the data set's
prompts (as the README recommends), and decodes every prompt greedily; the
table gives new tokens over decode forwards (the prefill aside) per data set
and config, and whether every output equals ``model.generate`` (exact %).
With ``budget_curve=flat`` (every step priced like a one-row step, as on a
GPU at batch 1) the numbers do not depend on this machine's timing at all:
the same command gives the same table on any machine. With the measured
curve they depend on the curve measured here.
"""

from __future__ import annotations

import click
import torch

from lookahead import LookaheadGenerator, load_model
from lookahead.benchmarks.configs import parse_config_spec
from lookahead.benchmarks.datasets import DATASETS, load_dataset
from lookahead.benchmarks.runner import prepare_prompts


def tokens_per_forward(gen: LookaheadGenerator, prompts: list, max_new_tokens: int,
                       references: list[list[int]]) -> tuple[float, int]:
    """(new tokens over decode forwards, outputs equal to their reference) over ``prompts`` in order."""
    tokens = steps = exact = 0
    for prompt, reference in zip(prompts, references, strict=False):
        out = gen.generate(torch.tensor([prompt.input_ids]), max_new_tokens=max_new_tokens, do_sample=False)
        tokens += gen.last_stats.new_tokens
        steps += gen.last_stats.steps
        exact += int(out[0].tolist() == reference)
    return tokens / max(steps, 1), exact


@torch.inference_mode()
def greedy_references(model, prompts: list, max_new_tokens: int) -> list[list[int]]:
    """model.generate's greedy output for every prompt."""
    out = []
    for prompt in prompts:
        ids = torch.tensor([prompt.input_ids])
        out.append(model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                  do_sample=False)[0].tolist())
    return out


def acceptance_table(model, tokenizer, datasets: list[str], configs: list[str], limit: int,
                     max_new_tokens: int) -> list[dict]:
    """One record per (data set, config): tokens per forward and how many outputs were exact."""
    named = [parse_config_spec(spec) for spec in configs]
    records = []
    for dataset in datasets:
        prompts = prepare_prompts(dataset, load_dataset(dataset, limit), model, tokenizer, max_new_tokens)
        references = greedy_references(model, prompts, max_new_tokens)
        for name, config in named:
            gen = LookaheadGenerator(model, tokenizer, config)
            value, exact = tokens_per_forward(gen, prompts, max_new_tokens, references)
            records.append({"dataset": dataset, "config": name, "tokens_per_forward": value,
                            "exact": exact, "prompts": len(prompts)})
            click.echo(f"{dataset:>20} {name:>16} {value:6.2f} tokens/forward, exact {exact}/{len(prompts)}",
                       err=True)
    return records


def markdown(records: list[dict]) -> str:
    """Data sets as rows, configs as columns (tokens per forward), then exact %."""
    configs = list(dict.fromkeys(r["config"] for r in records))
    datasets = list(dict.fromkeys(r["dataset"] for r in records))
    cell = {(r["dataset"], r["config"]): r for r in records}
    lines = ["| data set | " + " | ".join(configs) + " | exact % |",
             "|---|" + "---:|" * (len(configs) + 1)]
    for d in datasets:
        rows = [cell[(d, c)] for c in configs]
        exact = 100.0 * sum(r["exact"] for r in rows) / sum(r["prompts"] for r in rows)
        lines.append(f"| {d} | " + " | ".join(f"{r['tokens_per_forward']:.2f}" for r in rows) + f" | {exact:.0f} |")
    return "\n".join(lines)


@click.command()
@click.option("--model", "model_name", default="smollm2-135m", show_default=True)
@click.option("--dataset", "datasets", multiple=True, type=click.Choice(DATASETS), default=("humaneval", "gsm8k"),
              show_default=True)
@click.option("--config", "configs", multiple=True, default=("flat:budget_curve=flat",), show_default=True,
              help="NAME:FIELD=VALUE,... (repeatable), as `lookahead bench --config`.")
@click.option("--limit", type=int, default=5, show_default=True, help="Prompts per data set.")
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
def main(model_name, datasets, configs, limit, max_new_tokens):
    """Print the tokens-per-forward table (markdown) of every config on every data set."""
    for spec in configs:
        try:
            parse_config_spec(spec)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--config") from None
    model, tokenizer = load_model(model_name)
    click.echo(markdown(acceptance_table(model, tokenizer, list(datasets), list(configs), limit, max_new_tokens)))


if __name__ == "__main__":
    main()
