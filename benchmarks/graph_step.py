"""The step with and without CUDA graphs (lookahead/model/graphs.py), on a random model of a real shape.

    python -m lookahead.benchmarks.graph_step --shape smollm2-1.7b --dtype bfloat16 --out OUT.json

For each shape, in one process:

1. **The step per row count**: one decode-shaped step (``Target.step`` after ``--context`` cached
   tokens, its argmax read back, then cropped away, as the cost measurement times it) through the
   eager forward and through the graphs, interleaved, median of ``--repeats``; beside it the
   memory roofline (the weights' bytes over a device copy's measured bandwidth).
2. **A decode** of ``--new`` tokens from a random prompt: transformers greedy (``model.generate``),
   lookahead's plain loop (no speculation) eager and graphed, lookahead's defaults graphed and
   eager, and a flat budget graphed (``budget_curve="flat"``: every step priced alike, the widest
   trees, so the most host work a step): milliseconds per token, the median host and forward time of a step, and whether the text
   equals greedy's. Random weights read the same bytes and run the same kernels as the real model,
   but their text is noise: tokens per step here say nothing about real text.

``--no-capture`` (for a CPU dry run) runs the graphs' static forward without capturing.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

import click
import numpy as np
import torch

from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.model.graphs import StepGraphs
from lookahead.model.support import attention_layout
from lookahead.model.switches import ForwardSwitches
from lookahead.model.target import Target

from .shaped_model import SHAPES, shaped_config

ROWS = (1, 2, 4, 8, 16, 32, 64, 128)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bandwidth(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Bytes per second a device copy moves (read plus write counted: a forward reads its weights at about
    this rate), best of 5."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        sync(device)
        began = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - began)
    return 2 * nbytes / best


def static_graphs(target: Target) -> StepGraphs:
    """The graphs' static forward for ``target``, run without capturing (a dry run off CUDA)."""
    return StepGraphs(target.model, target.cache_keyword, target.attention, target.dtype, capture=False,
                      positions=target.positions)


def target_for(model, mode: str) -> Target:
    """A Target running steps eagerly ("eager"), through captured graphs ("graphs") or through the graphs'
    static forward without a capture ("static")."""
    target = Target(model, attention_layout(model.config), ForwardSwitches(graphs=mode == "graphs"))
    if mode == "static":
        target.graphs = static_graphs(target)
    if mode == "graphs" and target.graphs is None:
        raise click.UsageError("graphs need a CUDA device (use --no-capture for a dry run elsewhere)")
    return target


def step_timer(model, mode: str, context: int, seed: int = 0):
    """time_one(q): seconds of one step over q causal rows after ``context`` cached tokens, read back."""
    target = target_for(model, mode)
    rng = np.random.default_rng(seed)
    cache = target.new_cache()
    with torch.inference_mode():
        target.prefill(cache, rng.integers(3, target.vocab, (1, context), dtype=np.int64))

    def time_one(q: int) -> float:
        tokens = rng.integers(3, target.vocab, (1, q), dtype=np.int64)
        positions = (context + np.arange(q))[None]
        local = np.tril(np.ones((1, q, q), dtype=bool))
        with torch.inference_mode():
            sync(target.device)
            began = time.perf_counter()
            target.step(cache, tokens, positions, local, np.arange(q), context).argmax(-1).cpu()
            took = time.perf_counter() - began
            cache.crop(-q)
        return took

    return time_one, target


def step_costs(model, modes: list[str], context: int, repeats: int) -> dict:
    """{mode: {rows: median ms}}, the modes interleaved pass by pass (a warm-up pass first: captures)."""
    timers = {mode: step_timer(model, mode, context)[0] for mode in modes}
    for time_one in timers.values():
        for q in ROWS:
            time_one(q)
    seconds: dict[str, dict[int, list[float]]] = {mode: {q: [] for q in ROWS} for mode in modes}
    for _ in range(repeats):
        for q in ROWS:
            for mode, time_one in timers.items():
                seconds[mode][q].append(time_one(q))
    return {mode: {q: 1e3 * statistics.median(v) for q, v in per.items()} for mode, per in seconds.items()}


def decode(model, ids: torch.Tensor, new: int, graph_mode: str, calibration_s: int) -> dict:
    """ms per token and step medians of greedy and of lookahead's variants, each after a warm-up call."""
    device = ids.device
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=4, do_sample=False)
        sync(device)
        began = time.perf_counter()
        greedy = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False)
        sync(device)
    took = time.perf_counter() - began
    produced = greedy.shape[1] - ids.shape[1]
    rows = {"transformers greedy": {"ms_per_token": 1e3 * took / produced, "tokens": produced, "equal": True}}
    plain = dict(window=1, ngram=2, candidates=0)
    variants = {"plain eager": (plain, "eager"), f"plain {graph_mode}": (plain, graph_mode),
                f"defaults {graph_mode}": ({}, graph_mode), "defaults eager": ({}, "eager"),
                f"flat {graph_mode}": ({"budget_curve": "flat"}, graph_mode)}
    for name, (fields, mode) in variants.items():
        config = LookaheadConfig(cost_cache_dir="", calibration_seconds=calibration_s, **fields,
                                 cuda_graphs=mode == "graphs")
        gen = LookaheadGenerator(model, config=config)
        if mode == "static":
            gen.target.graphs = static_graphs(gen.target)
        gen.generate(ids, max_new_tokens=4)
        sync(device)
        began = time.perf_counter()
        out = gen.generate(ids, max_new_tokens=new)
        sync(device)
        took = time.perf_counter() - began
        stats = gen.last_stats
        same = min(out.shape[1], greedy.shape[1])
        agree = int((out[0, ids.shape[1]:same].cpu() == greedy[0, ids.shape[1]:same].cpu()).cumprod(0).sum())
        rows[name] = {"ms_per_token": 1e3 * took / max(stats.new_tokens, 1), "tokens": stats.new_tokens,
                      "equal": bool(torch.equal(out.cpu(), greedy.cpu())), "first_equal_tokens": agree,
                      "steps": stats.steps, "tokens_per_step": stats.new_tokens / max(stats.steps, 1),
                      "rows_median": statistics.median(stats.rows_per_step),
                      "host_ms_median": 1e3 * statistics.median(stats.host_seconds),
                      "forward_ms_median": 1e3 * statistics.median(stats.forward_seconds),
                      "graph_steps": stats.routes.count("graph"),
                      "graph_failure": gen.target.graphs.failure if gen.target.graphs is not None else ""}
        del gen
    return rows


@click.command()
@click.option("--shape", "shapes", multiple=True, type=click.Choice(sorted(SHAPES)), default=("smollm2-1.7b",))
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="bfloat16")
@click.option("--device", default="cuda")
@click.option("--context", type=int, default=256)
@click.option("--repeats", type=int, default=7)
@click.option("--new", type=int, default=128)
@click.option("--prompt-tokens", type=int, default=64)
@click.option("--calibration-seconds", type=int, default=6)
@click.option("--no-capture", is_flag=True, help="the graphs' static forward without capturing (a CPU dry run)")
@click.option("--skip-decode", is_flag=True)
@click.option("--out", type=click.Path(path_type=Path), required=True)
def main(shapes, dtype, device, context, repeats, new, prompt_tokens, calibration_seconds, no_capture, skip_decode,
         out):
    from transformers import AutoModelForCausalLM

    dev = torch.device(device)
    graph_mode = "static" if no_capture else "graphs"
    report: dict = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor(),
                    "torch": torch.__version__, "dtype": dtype, "context": context, "shapes": {}}
    report["bandwidth_GBps"] = bandwidth(dev) / 1e9
    for shape in shapes:
        torch.manual_seed(0)
        began = time.perf_counter()
        with torch.device(dev):
            model = AutoModelForCausalLM.from_config(shaped_config(shape), dtype=getattr(torch, dtype)).eval()
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        entry: dict = {"weight_GB": weight_bytes / 1e9, "build_s": time.perf_counter() - began,
                       "roofline_ms": 1e3 * weight_bytes / (report["bandwidth_GBps"] * 1e9)}
        costs = step_costs(model, ["eager", graph_mode], context, repeats)
        entry["step_ms"] = costs
        print(f"== {shape} ({entry['weight_GB']:.2f} GB, roofline {entry['roofline_ms']:.2f} ms)", flush=True)
        print("rows      " + "  ".join(f"{q:>6}" for q in ROWS))
        for mode, per in costs.items():
            print(f"{mode:<9} " + "  ".join(f"{per[q]:6.2f}" for q in ROWS), flush=True)
        if not skip_decode:
            rng = torch.Generator().manual_seed(1)
            ids = torch.randint(3, model.config.vocab_size, (1, prompt_tokens), generator=rng).to(dev)
            entry["decode"] = decode(model, ids, new, graph_mode, calibration_seconds)
            for name, row in entry["decode"].items():
                print(f"  {name:<22} " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                                   for k, v in row.items()), flush=True)
        report["shapes"][shape] = entry
        del model
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
