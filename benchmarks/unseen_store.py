"""What memory across requests costs a prompt it has never seen: memory off, an empty store, and a
store full of unrelated text, on the same prompts, interleaved with transformers greedy.

    python -m lookahead.benchmarks.unseen_store --prompts benchmarks/prompts/own-10.jsonl

(own-10.jsonl, installed with the package, is the default.)

One generator per method, kept for the whole run. The unrelated store holds
the chat-rendered prompts of ``--unrelated`` (tool calls by default). Both
stores are put back as they were before every call (arrays copied in place),
so no prompt ever meets its own earlier answer. Each prompt runs ``--repeats``
times per method, the order rotating; the best time counts. Prints, per
method, the geometric mean speed against greedy (slowest prompt), the time
against memory off, and the memory's host time per step. Every output must
equal greedy's.
"""

from __future__ import annotations

import copy
import math
import time

import click
import numpy as np
import torch

from lookahead import LookaheadConfig, LookaheadGenerator, load_model
from lookahead.proposers.memory.store import SuffixStore


class Snapshot:
    """A store's arrays and request starts, to put back in place before every call."""

    def __init__(self, store):
        self.store = store
        self.arrays = [a.copy() for a in self.parts()]
        self.starts = copy.copy(store.starts)

    def parts(self) -> tuple:
        return self.store.ring, self.store.heads, self.store.chain, self.store.state

    def restore(self) -> None:
        for live, saved in zip(self.parts(), self.arrays, strict=False):
            np.copyto(live, saved)
        self.store.starts = copy.copy(self.starts)


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


@click.command()
@click.option("--model", "model_name", default="smollm2-135m", show_default=True)
@click.option("--prompts", "prompt_file", default=None, show_default="the installed own-10.jsonl")
@click.option("--unrelated", default="tool-calls", show_default=True, help="Data set whose prompts fill the store.")
@click.option("--unrelated-limit", type=int, default=60, show_default=True)
@click.option("--max-new-tokens", type=int, default=96, show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True)
def main(model_name, prompt_file, unrelated, unrelated_limit, max_new_tokens, repeats):
    from lookahead.benchmarks.datasets import PROMPTS_DIR, load_dataset
    from lookahead.benchmarks.parsers import parse_prompt_file, render_prompt
    from lookahead.benchmarks.report import environment, machine_line

    model, tok = load_model(model_name)
    prompt_file = prompt_file if prompt_file is not None else PROMPTS_DIR / "own-10.jsonl"
    prompts = [render_prompt(p, tok, chat=True) for p in parse_prompt_file(prompt_file)]
    filler = [render_prompt(p, tok, chat=True) for p in load_dataset(unrelated, unrelated_limit)]
    gens = {"off": LookaheadGenerator(model, tok, LookaheadConfig(memory_tokens=0)),
            "empty": LookaheadGenerator(model, tok, LookaheadConfig()),
            "unrelated": LookaheadGenerator(model, tok, LookaheadConfig())}
    for g in gens.values():  # warm up (kernels compiled, cost curve measured), then empty the stores again
        g.generate(torch.tensor([prompts[0]]), max_new_tokens=8)
        if g.memory is not None:
            g.memory.store = SuffixStore(g.memory.store.capacity)
    for p in filler:
        gens["unrelated"].memory.store.add(np.array(p))
    snaps = {k: Snapshot(gens[k].memory.store) for k in ("empty", "unrelated")}
    store = gens["unrelated"].memory.store
    click.echo(f"{machine_line(environment('float32'))}; unrelated store: {store.tokens} tokens, "
               f"{store.requests} requests", err=True)
    names = ["greedy", *gens]
    best = {k: [] for k in names}
    memory_s = {k: 0.0 for k in gens}
    steps = {k: 0 for k in gens}
    for i, p in enumerate(prompts):
        ids = torch.tensor([p])
        times = {k: [] for k in names}
        for rep in range(repeats):
            turn = (i + rep) % len(names)
            outs = {}
            for k in names[turn:] + names[:turn]:
                if k in snaps:
                    snaps[k].restore()
                began = time.perf_counter()
                if k == "greedy":
                    with torch.inference_mode():
                        outs[k] = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                                 max_new_tokens=max_new_tokens,
                                                 pad_token_id=model.generation_config.pad_token_id)
                else:
                    outs[k] = gens[k].generate(ids, max_new_tokens=max_new_tokens)
                times[k].append(time.perf_counter() - began)
                if k != "greedy":
                    memory_s[k] += gens[k].last_stats.memory_s
                    steps[k] += gens[k].last_stats.steps
            for k in gens:
                if not torch.equal(outs[k], outs["greedy"]):
                    raise SystemExit(f"prompt {i}: {k}'s tokens differ from greedy's")
        for k in names:
            best[k].append(min(times[k]))
        click.echo(f"prompt {i}: " + ", ".join(f"{k} {best['greedy'][-1] / best[k][-1]:.2f}x" for k in gens),
                   err=True)
    click.echo("| method | vs greedy (slowest) | time against memory off | memory host time per step |")
    click.echo("|---|---:|---:|---:|")
    for k in gens:
        ratios = [g / x for g, x in zip(best["greedy"], best[k], strict=False)]
        against = geomean([x / o for x, o in zip(best[k], best["off"], strict=False)])
        click.echo(f"| {k} | {geomean(ratios):.2f}x ({min(ratios):.2f}x) | {against:.3f} | "
                   f"{1000 * memory_s[k] / max(steps[k], 1):.3f} ms |")


if __name__ == "__main__":
    main()
