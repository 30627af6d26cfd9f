"""The server's loop in one process: C clients in a closed loop, lookahead against speculation off.

    python -m lookahead.benchmarks.closed_loop --dataset mt-bench-1 --limit 16 --concurrency 4 --out OUT.json

What ``lookahead bench-serve`` measures, without HTTP, a server process or a client: the batch
that ``lookahead serve`` decodes (``LookaheadGenerator.open_batch``; ``DecodeRun.join`` and ``step``),
fed by C clients that each send their next prompt when their last one ends, greedy, every request
``--max-new-tokens`` long unless it ends first. Two generators share the model, each set up as
``lookahead serve`` sets up its own (its defaults, ``SERVE_DEFAULTS``: fair_share 1; every step kind
traced on sight, ``Target.long_lived``): lookahead's defaults and the plain options of bench-serve's
``lookahead-plain`` (``PLAIN``: no candidates, the window x alone, no sources, no memory). Each first
serves ``--warmup`` requests of another data set (so its traces, shape checks and batch curves are
made), then both serve the same prompts, the order of the two alternating between ``--rounds``; each
round serves the next ``--limit`` prompts of the data set (the same prompts again would meet
lookahead's memory of them: in one such round it ran 1.9x the plain loop, 54 tokens a step, copying
its own earlier answers).

Per run: tokens/s, steps, the seconds spent joining (each join prefills its prompt alone) and in
steps, the host's share of the steps; per step kind (plain, tree, window: what the budget chose,
``StepChooser.forecast``) and number of sequences: steps, mean ms, tokens a step and tokens/s,
beside the forecast's tokens and ms. Both generators' tokens are compared request by request (they
must be the same: greedy output does not depend on speculation or company).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import click
import numpy as np
import torch

from lookahead import LookaheadConfig, LookaheadGenerator, load_model
from lookahead.cost.measure import cpu_name
from lookahead.plan.choice import StepChooser
from lookahead.serve.defaults import SERVE_DEFAULTS

from .datasets import canonical_name, load_dataset
from .parsers import render_prompt

PLAIN = {"candidates": 0, "window": 1, "auto_window": False, "memory_tokens": 0, "recycle": False,
         "context_match": False, "seed_from_prompt": False, "seed_from_output": False}


def serve(gen: LookaheadGenerator, prompts: list[np.ndarray], clients: int, new: int,
          kinds: list[tuple[str, int, float, float]]) -> dict[str, Any]:
    """Serve ``prompts`` in order with ``clients`` closed-loop clients; ``kinds`` collects each step's forecast
    (kind, sequences, tokens, seconds) as the chooser made it. The run's numbers and every request's tokens."""
    run = gen.open_batch()
    queue = list(range(len(prompts)))
    handles: dict[int, Any] = {}
    joins = 0.0
    kinds.clear()
    began = time.perf_counter()
    while queue or run.handles:
        while queue and len(run.handles) < clients:
            i = queue.pop(0)
            start = time.perf_counter()
            handles[i] = run.join(prompts[i], max_new_tokens=new, do_sample=False)
            joins += time.perf_counter() - start
        if run.handles:
            run.step()
    wall = time.perf_counter() - began
    stats = run.stats
    tokens = {i: handle.output_ids.tolist() for i, handle in handles.items()}
    steps = [(k[0], k[1], acc, sec, k[2], k[3], host)
             for k, acc, sec, host in zip(kinds, stats.accepted, stats.step_seconds, stats.host_seconds)]
    return {"tokens_per_s": sum(stats.accepted) / wall, "new_tokens": sum(stats.accepted), "steps": stats.steps,
            "wall_s": wall, "join_s": joins, "step_s": sum(stats.step_seconds), "host_s": sum(stats.host_seconds),
            "step_kinds": steps, "tokens": tokens}


def by_kind(steps: list[tuple]) -> dict[str, dict[str, float]]:
    """Steps grouped by (kind, sequences): count, mean ms (and the host's share), tokens a step, tokens/s, forecast
    tokens and ms."""
    groups: dict[str, list[tuple]] = defaultdict(list)
    for kind, sequences, *rest in steps:
        groups[f"{kind} x{sequences}"].append(tuple(rest))
    table = {}
    for key, rows in sorted(groups.items()):
        accepted, seconds, forecast_tokens, forecast_seconds, host = (np.array(c, dtype=float) for c in zip(*rows))
        table[key] = {"steps": len(rows), "ms": 1e3 * seconds.mean(), "host_ms": 1e3 * host.mean(),
                      "tokens": accepted.mean(),
                      "tokens_per_s": accepted.sum() / seconds.sum() if seconds.sum() > 0 else 0.0,
                      "forecast_tokens": forecast_tokens.mean(), "forecast_ms": 1e3 * forecast_seconds.mean()}
    return table


class ForecastLog:
    """Every ``StepChooser.decide`` of this process, recorded as (kind, sequences, tokens, seconds) forecast."""

    def __init__(self) -> None:
        self.kinds: list[tuple[str, int, float, float]] = []
        self.original = StepChooser.decide

    def __enter__(self) -> ForecastLog:
        original, kinds = self.original, self.kinds

        def decide(chooser: StepChooser, probs: list, column_gain: float, spent: float = 0.0) -> tuple[int, int]:
            shape = original(chooser, probs, column_gain, spent)
            f = chooser.forecast
            kinds.append((f[0], f[1], f[2], f[3]) if f is not None else ("fixed", len(probs), 0.0, 0.0))
            return shape

        StepChooser.decide = decide  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        StepChooser.decide = self.original  # type: ignore[method-assign]


def compare(model: Any, tokenizer: Any, rounds: list[list[np.ndarray]], warmup: list[np.ndarray], clients: int,
            new: int) -> dict[str, Any]:
    """Both generators on each round's prompts after ``warmup``, which goes first alternating; the report."""
    gens = {"lookahead": LookaheadGenerator(model, tokenizer, LookaheadConfig(**SERVE_DEFAULTS)),
            "plain": LookaheadGenerator(model, tokenizer, LookaheadConfig(**{**SERVE_DEFAULTS, **PLAIN}))}
    for gen in gens.values():
        gen.target.long_lived()  # (as the server's engine does)
    report: dict[str, Any] = {"cpu": cpu_name(), "torch": torch.__version__,
                              "threads": torch.get_num_threads(), "clients": clients, "max_new_tokens": new,
                              "requests": [len(p) for p in rounds], "rounds": []}
    with ForecastLog() as log:
        for gen in gens.values():
            if warmup:
                serve(gen, warmup, clients, new, log.kinds)
        for r, prompts in enumerate(rounds):
            order = list(gens) if r % 2 == 0 else list(reversed(gens))
            runs = {name: serve(gens[name], prompts, clients, new, log.kinds) for name in order}
            same = sum(runs["lookahead"]["tokens"][i] == runs["plain"]["tokens"][i] for i in range(len(prompts)))
            entry = {"order": order, "same_tokens": same, "ratio": runs["lookahead"]["tokens_per_s"]
                     / runs["plain"]["tokens_per_s"]}
            for name, numbers in runs.items():
                numbers.pop("tokens")
                numbers["by_kind"] = by_kind(numbers.pop("step_kinds"))
                entry[name] = numbers
            report["rounds"].append(entry)
    return report


@click.command()
@click.option("--model", "model_name", default="smollm2-135m", show_default=True)
@click.option("--dataset", default="mt-bench-1", show_default=True, help="Chat data set served in order.")
@click.option("--limit", type=click.IntRange(1), default=16, show_default=True, help="Requests per round.")
@click.option("--offset", type=click.IntRange(0), default=0, show_default=True, help="Prompts skipped first.")
@click.option("--warmup-dataset", default="humaneval-chat", show_default=True)
@click.option("--warmup", type=click.IntRange(0), default=16, show_default=True, help="Warm-up requests.")
@click.option("--concurrency", type=click.IntRange(1), default=4, show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(1), default=96, show_default=True)
@click.option("--rounds", type=click.IntRange(1), default=1, show_default=True,
              help="Rounds, each on the next --limit prompts, the two loops' order alternating.")
@click.option("--threads", type=click.IntRange(1), default=None, help="Torch threads (default: as torch has them).")
@click.option("--out", type=click.Path(path_type=Path), required=True)
def main(model_name: str, dataset: str, limit: int, offset: int, warmup_dataset: str, warmup: int,
         concurrency: int, max_new_tokens: int, rounds: int, threads: int | None, out: Path) -> None:
    if threads is not None:
        torch.set_num_threads(threads)
    model, tokenizer = load_model(model_name, dtype=torch.float32)

    def prompts(name: str, count: int, skip: int) -> list[np.ndarray]:
        chosen = load_dataset(canonical_name(name), skip + count)[skip:]
        return [np.asarray(render_prompt(p, tokenizer, p.messages is not None), dtype=np.int64) for p in chosen]

    every = prompts(dataset, limit * rounds, offset)
    if len(every) < limit * rounds:
        raise click.UsageError(f"{dataset} has {len(every) + offset} prompts: fewer than --offset + --limit x --rounds")
    report = compare(model, tokenizer, [every[r * limit:(r + 1) * limit] for r in range(rounds)],
                     prompts(warmup_dataset, warmup, 0) if warmup else [], concurrency, max_new_tokens)
    report.update(model=model_name, dataset=dataset, offset=offset)
    out.write_text(json.dumps(report, indent=1))
    for r, entry in enumerate(report["rounds"]):
        click.echo(f"round {r} ({' then '.join(entry['order'])}): lookahead {entry['ratio']:.3f}x the plain loop, "
                   f"{entry['same_tokens']}/{limit} requests the same tokens")
        for name in ("lookahead", "plain"):
            n = entry[name]
            click.echo(f"  {name}: {n['tokens_per_s']:.1f} tokens/s, {n['steps']} steps, joins {n['join_s']:.2f} s, "
                       f"steps {n['step_s']:.2f} s (host {n['host_s']:.2f})")
            for key, k in n["by_kind"].items():
                click.echo(f"    {key:<10} {k['steps']:4d} steps {k['ms']:6.1f} ms (host {k['host_ms']:.2f}) "
                           f"{k['tokens']:5.2f} tokens "
                           f"{k['tokens_per_s']:6.1f} tokens/s (forecast {k['forecast_tokens']:.2f} in "
                           f"{k['forecast_ms']:.1f} ms)")
    click.echo(f"wrote {out}")


if __name__ == "__main__":
    main()
