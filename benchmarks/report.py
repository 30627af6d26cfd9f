"""Benchmark output: JSON with every raw number, a markdown table, a PNG figure.

    write_report(out_dir, records, cost=..., meta=...) -> {"json": path, "markdown": path, "figure": path}

The table has one row per (dataset, method): prompts, geometric-mean and
minimum speedup against the reference (greedy; or sampling, where the speedup
is a ratio of new tokens per second), tokens/s (total new tokens / total wall
time), mean accepted tokens per decode forward, mean target forwards, exact
match % against greedy (greedy mode only), peak RSS. A line above it names the
mode (``greedy`` or ``sampling T=0.7 top_k=50 top_p=1``) and the seed, a
second the CPU, its threads and whether other processes kept cores busy; the
JSON carries them all.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
from pathlib import Path

from lookahead.cost import cpu_name


def environment(dtype: str = "float32") -> dict:
    """Versions, CPU, threads, dtype."""
    import numpy
    import torch
    import transformers

    import lookahead

    versions = {"lookahead": lookahead.__version__, "python": sys.version.split()[0], "torch": torch.__version__,
                "transformers": transformers.__version__, "numpy": numpy.__version__}
    try:
        import numba
        versions["numba"] = numba.__version__
    except ImportError:  # pragma: no cover
        pass
    return {"versions": versions, "platform": platform.platform(), "cpu": cpu_name(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.is_available(), "dtype": dtype}


def machine_line(env: dict, busy_cores: int = 0) -> str:
    """'Measured on AMD EPYC (2 cores), torch on 2 threads, 1 core kept busy by another process.'"""
    busy = f", {busy_cores} core{'s' if busy_cores != 1 else ''} kept busy by other processes" if busy_cores else \
        ", nothing else running"
    return (f"Measured on {env['cpu']} ({env['cpu_count']} cores), torch on {env['torch_threads']} "
            f"thread{'s' if env['torch_threads'] != 1 else ''}{busy}.")


def geomean(values: list[float]) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 0.0


def summarize(records: list[dict]) -> list[dict]:
    """One summary row per (dataset, method), in first-seen order."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        groups.setdefault((r["dataset"], r["method"]), []).append(r)
    rows = []
    for (dataset, method), rs in groups.items():
        wall = sum(r["wall_time_s"] for r in rs)
        speedups = [r["speedup"] for r in rs]
        rows.append({
            "dataset": dataset, "method": method, "prompts": len(rs),
            "speedup_geomean": geomean(speedups), "speedup_min": min(speedups),
            "tokens_per_s": sum(r["new_tokens"] for r in rs) / wall if wall > 0 else 0.0,
            "accepted_per_step": sum(r["accepted_per_step"] for r in rs) / len(rs),
            "forwards": sum(r["forwards"] for r in rs) / len(rs),
            "new_tokens": sum(r["new_tokens"] for r in rs) / len(rs),
            "exact_pct": 100.0 * sum(r["exact_match"] for r in rs) / len(rs),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
        })
    return rows


def run_mode(records: list[dict]) -> dict:
    """{"mode": "greedy" | "sampling T=..", "seed": base seed}: what the first record (prompt 0) ran with."""
    first = records[0] if records else {}
    return {"mode": first.get("mode", "greedy"), "seed": first.get("seed", 0)}


def mode_line(mode: dict, reference: str) -> str:
    """One sentence naming the mode, the seed and what the speedup divides."""
    measure = "new tokens/s" if mode["mode"] != "greedy" else "wall time"
    return (f"Mode: {mode['mode']}, seed {mode['seed']} (+ prompt index); "
            f"speedup = {measure} against `{reference}` on the same prompt.")


def markdown_table(rows: list[dict], sampling: bool = False) -> str:
    """The summary rows as a GitHub markdown table; sampling: speedups are tokens/s ratios, no exact column."""
    unit = "tokens/s, " if sampling else ""
    head = (f"| dataset | method | n | speedup ({unit}geomean) | speedup ({unit}min) | tokens/s | accepted/step "
            f"| forwards |" + ("" if sampling else " exact % |"))
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|" + ("" if sampling else "---:|")]
    for r in rows:
        lines.append(f"| {r['dataset']} | {r['method']} | {r['prompts']} | {r['speedup_geomean']:.2f}x "
                     f"| {r['speedup_min']:.2f}x | {r['tokens_per_s']:.1f} | {r['accepted_per_step']:.2f} "
                     f"| {r['forwards']:.1f} |" + ("" if sampling else f" {r['exact_pct']:.0f} |"))
    return "\n".join(lines)


def step_table(records: list[dict]) -> str:
    """Per method that reports its steps (lookahead's): the median host and forward milliseconds of
    a decode step over every step of every prompt; "" when no method does."""
    steps: dict[str, tuple[list[float], list[float]]] = {}
    for r in records:
        if r.get("host_s"):
            host, forward = steps.setdefault(r["method"], ([], []))
            host.extend(r["host_s"])
            forward.extend(r.get("forward_s", []))
    if not steps:
        return ""
    lines = ["Decode steps: the host's own work (propose, plan, commit, cache, learn) and the forward with its "
             "read-back, median ms a step:", "",
             "| method | steps | host ms | forward ms |", "|---|---:|---:|---:|"]
    for method, (host, forward) in steps.items():
        lines.append(f"| {method} | {len(host)} | {statistics.median(host) * 1e3:.2f} "
                     f"| {statistics.median(forward) * 1e3 if forward else 0.0:.1f} |")
    return "\n".join(lines)


def cost_table(cost: dict) -> str:
    """The cost curve as a one-line-per-k markdown table."""
    lines = [f"Forward cost over k new tokens with {cost['context']} tokens of context, relative to k = 1 "
             f"(median of {cost['repeats']}):", "",
             "| k | " + " | ".join(str(k) for k in cost["k"]) + " |",
             "|---|" + "---:|" * len(cost["k"]),
             "| ms | " + " | ".join(f"{1000 * s:.1f}" for s in cost["seconds"]) + " |",
             "| x k=1 | " + " | ".join(f"{x:.2f}" for x in cost["relative"]) + " |"]
    return "\n".join(lines)


def plot(path: Path, records: list[dict], rows: list[dict], cost: dict | None) -> Path:
    """Speedup per dataset and method; histogram of accepted tokens per step; the cost curve."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    reference = rows[0]["method"] if rows else "greedy"  # the reference runs first
    methods = [m for m in dict.fromkeys(r["method"] for r in rows) if m != reference]
    width = 0.8 / max(len(methods), 1)
    for i, method in enumerate(methods):
        values = [next((r["speedup_geomean"] for r in rows if r["dataset"] == d and r["method"] == method), 0.0)
                  for d in datasets]
        axes[0].bar(np.arange(len(datasets)) + i * width, values, width, label=method)
    axes[0].axhline(1.0, color="black", linewidth=0.8)
    axes[0].set_xticks(np.arange(len(datasets)) + width * (len(methods) - 1) / 2, datasets)
    unit = "tokens/s " if run_mode(records)["mode"] != "greedy" else ""
    axes[0].set_ylabel(f"{unit}speedup vs {reference} (geomean)")
    if methods:  # a report of the reference alone has no bars to name
        axes[0].legend(fontsize=7)
    hist = {m: [a for r in records if r["method"] == m for a in r["accepted"]] for m in methods}
    hist = {m: a for m, a in hist.items() if a}
    if hist:
        top = max(max(a) for a in hist.values())
        axes[1].hist(list(hist.values()), bins=np.arange(0.5, top + 1.5), label=list(hist), density=True)
        axes[1].legend(fontsize=7)
    axes[1].set_xlabel("tokens accepted per forward")
    axes[1].set_ylabel("fraction of steps")
    if cost:
        axes[2].plot(cost["k"], cost["relative"], marker="o")
        axes[2].set_xscale("log", base=2)
        axes[2].set_xlabel(f"new tokens k per forward ({cost['context']} ctx)")
        axes[2].set_ylabel("time / time(k=1)")
    else:
        axes[2].set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path


def write_report(out_dir: str | Path, records: list[dict], cost: dict | None = None,
                 meta: dict | None = None) -> dict:
    """Write bench.json, bench.md, bench.png under out_dir; the paths and the table."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = summarize(records)
    mode = run_mode(records)
    reference = rows[0]["method"] if rows else "greedy"
    meta = {**(meta or {}), **mode}
    env = environment(meta.get("dtype", "float32"))
    steps = step_table(records)
    table = mode_line(mode, reference) + "\n" + machine_line(env, meta.get("busy_cores", 0)) + "\n\n" + \
        markdown_table(rows, sampling=mode["mode"] != "greedy") + ("\n\n" + steps if steps else "")
    data = {"meta": meta, "environment": env,
            "summary": rows, "records": records, "cost_curve": cost}
    (out / "bench.json").write_text(json.dumps(data, indent=1))
    text = table + ("\n\n" + cost_table(cost) if cost else "") + "\n"
    (out / "bench.md").write_text(text)
    figure = plot(out / "bench.png", records, rows, cost)
    return {"json": out / "bench.json", "markdown": out / "bench.md", "figure": figure, "table": table,
            "summary": rows}
