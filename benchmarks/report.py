"""Benchmark output: JSON with every raw number, a markdown table, a PNG figure.

    write_report(out_dir, records, cost=..., meta=...) -> {"json": path, "markdown": path, "figure": path}
    redraw(bench.json, figure.png)  # the figure again from a recorded run, nothing measured
    python -m lookahead.benchmarks.report bench.json figure.png

The table has one row per (dataset, method): prompts, geometric-mean and
minimum speedup against the reference (greedy; or sampling, where the speedup
is a ratio of new tokens per second), tokens/s (total new tokens / total wall
time), mean accepted tokens per decode forward, mean target forwards, exact
match % against greedy (greedy mode only), peak RSS. Three lines above it say
where the numbers come from: the model, the prompt count and new tokens; the
mode (``greedy`` or ``sampling T=0.7 top_k=50 top_p=1``) and the seed; the
CPU, its threads and whether other processes kept cores busy. The figure's
title says the same. Where the run has both ``lookahead`` and ``lookahead-plain``
(the same routes with speculation off), a second table splits lookahead's
speedup into the kernels' gain (plain vs the reference) and speculation's
(lookahead vs plain), per data set and over all prompts. The JSON carries
them all.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

from lookahead.cost import cpu_name

PLAIN = "lookahead-plain"  # benchmarks/runner.py's method without speculation
SPECULATING = "lookahead"  # the method whose gain is split


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
    """'Measured on <CPU> (2 cores), torch on 2 threads, 1 core kept busy by other processes.': <CPU> is
    ``env['cpu']``, the machine's own name as ``environment`` read it (lookahead.cost.cpu_name)."""
    busy = f", {busy_cores} core{'s' if busy_cores != 1 else ''} kept busy by other processes" if busy_cores else \
        ", nothing else running"
    return (f"Measured on {env['cpu']} ({env['cpu_count']} cores), torch on {env['torch_threads']} "
            f"thread{'s' if env['torch_threads'] != 1 else ''}{busy}.")


def prompt_count(records: list[dict]) -> int:
    """Distinct prompts among the records (a prompt is run once by every method)."""
    return len({(r["dataset"], r.get("prompt_id"), r.get("turn", 1)) for r in records})


def run_line(meta: dict, records: list[dict]) -> str:
    """'Model smollm2-135m (float32), 21 prompts from 7 data sets, up to 128 new tokens each.'"""
    datasets = len(dict.fromkeys(r["dataset"] for r in records))
    prompts = prompt_count(records)
    new = meta.get("max_new_tokens")
    return (f"Model {meta.get('model', 'unnamed')} ({meta.get('dtype', 'float32')}), {prompts} prompt"
            f"{'s' if prompts != 1 else ''} from {datasets} data set{'s' if datasets != 1 else ''}, "
            + (f"up to {new} new tokens each." if new is not None else "new tokens not recorded."))


def caption(meta: dict, env: dict, records: list[dict]) -> str:
    """The figure's second title line: model, CPU and threads, prompts, new tokens, mode."""
    mode = run_mode(records)["mode"]
    busy = meta.get("busy_cores", 0)
    threads = env.get("torch_threads")
    return (f"{meta.get('model', 'unnamed')} ({meta.get('dtype', 'float32')}) on {env.get('cpu', 'an unnamed CPU')} "
            f"({env.get('cpu_count')} cores, torch on {threads} thread{'s' if threads != 1 else ''}"
            f"{f', {busy} kept busy' if busy else ''}); {prompt_count(records)} prompts, up to "
            f"{meta.get('max_new_tokens', '?')} new tokens; {mode}")


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


def gains(records: list[dict]) -> list[dict]:
    """Per data set, then over every prompt ("all"): the geometric means of the per-prompt ratios
    kernel = lookahead-plain vs the reference, speculation = lookahead vs lookahead-plain and
    total = lookahead vs the reference (each the records' speedup unit: wall time when greedy,
    new tokens/s when sampling; total = kernel x speculation, prompt by prompt and so in geomean).
    [] unless the records hold both methods."""
    runs: dict[tuple, dict[str, dict]] = {}
    for r in records:
        if r["method"] in (PLAIN, SPECULATING):
            runs.setdefault((r["dataset"], r.get("prompt_id"), r.get("turn", 1), r.get("seed")), {})[r["method"]] = r
    pairs = [(key[0], both[PLAIN]["speedup"], both[SPECULATING]["speedup"]) for key, both in runs.items()
             if len(both) == 2 and both[PLAIN]["speedup"] > 0 and both[SPECULATING]["speedup"] > 0]
    if not pairs:
        return []
    groups = [(d, [p for p in pairs if p[0] == d]) for d in dict.fromkeys(p[0] for p in pairs)]
    if len(groups) > 1:
        groups.append(("all", pairs))
    return [{"dataset": name, "prompts": len(group), "kernel": geomean([plain for _, plain, _ in group]),
             "speculation": geomean([spec / plain for _, plain, spec in group]),
             "total": geomean([spec for _, _, spec in group])} for name, group in groups]


def gain_table(rows: list[dict], reference: str) -> str:
    """``gains`` as markdown: where lookahead's speedup comes from; "" without rows."""
    if not rows:
        return ""
    lines = [f"Where lookahead's speedup comes from (geomeans of per-prompt ratios): its kernels, cache and "
             f"loop without speculation (`{PLAIN}` vs `{reference}`) and speculation on top of them "
             f"(`{SPECULATING}` vs `{PLAIN}`); total = kernels x speculation:", "",
             f"| dataset | n | kernels: {PLAIN} vs {reference} | speculation: {SPECULATING} vs {PLAIN} "
             f"| total: {SPECULATING} vs {reference} |", "|---|---:|---:|---:|---:|"]
    for r in rows:
        name = f"**{r['dataset']}**" if r["dataset"] == "all" else r["dataset"]
        lines.append(f"| {name} | {r['prompts']} | {r['kernel']:.2f}x | {r['speculation']:.2f}x | {r['total']:.2f}x |")
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


def figure(records: list[dict], rows: list[dict], cost: dict | None, subtitle: str = "") -> Any:
    """The report's matplotlib figure: speedup per dataset and method; histogram of accepted tokens
    per step; the cost curve; a title naming what was run where (``subtitle``: ``caption``)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.8), gridspec_kw={"width_ratios": [1.5, 1, 1]})
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    reference = rows[0]["method"] if rows else "greedy"  # the reference runs first
    methods = [m for m in dict.fromkeys(r["method"] for r in rows) if m != reference]
    width = 0.8 / max(len(methods), 1)
    for i, method in enumerate(methods):
        values = [next((r["speedup_geomean"] for r in rows if r["dataset"] == d and r["method"] == method), 0.0)
                  for d in datasets]
        axes[0].bar(np.arange(len(datasets)) + i * width, values, width, label=method)
    axes[0].axhline(1.0, color="black", linewidth=0.8)
    axes[0].set_xticks(np.arange(len(datasets)) + width * (len(methods) - 1) / 2, datasets, fontsize=8)
    sampled = run_mode(records)["mode"] != "greedy"
    axes[0].set_ylabel(f"{'tokens/s ' if sampled else ''}speedup vs {reference} (geomean)")
    split = (f"\n{PLAIN}: lookahead's kernels alone, no speculation" if PLAIN in methods else
             f"\n(no {PLAIN} in this run: kernels and speculation not split)" if SPECULATING in methods else "")
    axes[0].set_title(f"Speedup against transformers {reference}{split}", fontsize=9)
    if methods:  # a report of the reference alone has no bars to name
        axes[0].legend(fontsize=7)
    # a method that never speculates accepts one token a step: nothing to draw
    hist = {m: [a for r in records if r["method"] == m for a in r["accepted"]] for m in methods}
    hist = {m: a for m, a in hist.items() if a and max(a) > 1}
    if hist:
        top = max(max(a) for a in hist.values())
        axes[1].hist(list(hist.values()), bins=np.arange(0.5, top + 1.5), label=list(hist), density=True)
        axes[1].legend(fontsize=7)
    axes[1].set_xlabel("tokens accepted per forward")
    axes[1].set_ylabel("fraction of steps")
    axes[1].set_title("Tokens per forward" + (f" ({PLAIN}: always 1)" if PLAIN in methods else ""), fontsize=9)
    if cost:
        axes[2].plot(cost["k"], cost["relative"], marker="o")
        axes[2].set_xscale("log", base=2)
        axes[2].set_xlabel(f"new tokens k per forward ({cost['context']} ctx)")
        axes[2].set_ylabel("time / time(k=1)")
        axes[2].set_title("transformers' forward cost by rows", fontsize=9)
    else:
        axes[2].set_axis_off()
    fig.suptitle("lookahead bench" + (f": {subtitle}" if subtitle else ""), fontsize=10)
    fig.tight_layout()
    _readable_ticks(fig, axes[0])
    return fig


def tick_overlaps(fig: Any, axis: Any) -> bool:
    """Whether any two of ``axis``'s x tick labels overlap as drawn."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [label.get_window_extent(renderer) for label in axis.get_xticklabels() if label.get_text()]
    return any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def _readable_ticks(fig: Any, axis: Any) -> None:
    """Turn the x tick labels (30, 60, then 90 degrees, then a smaller font) until none overlaps."""
    for rotation, size in ((0, 8), (30, 8), (60, 8), (90, 8), (90, 6), (90, 4)):
        for label in axis.get_xticklabels():
            label.set_rotation(rotation)
            label.set_horizontalalignment("center" if rotation in (0, 90) else "right")
            label.set_rotation_mode("anchor" if rotation not in (0, 90) else "default")
            label.set_fontsize(size)
        fig.tight_layout()
        if not tick_overlaps(fig, axis):
            return


def plot(path: Path, records: list[dict], rows: list[dict], cost: dict | None, subtitle: str = "") -> Path:
    """``figure`` written to path as a PNG."""
    import matplotlib.pyplot as plt

    fig = figure(records, rows, cost, subtitle)
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
    split = gain_table(gains(records), reference)
    steps = step_table(records)
    table = run_line(meta, records) + "\n" + mode_line(mode, reference) + "\n" + \
        machine_line(env, meta.get("busy_cores", 0)) + "\n\n" + \
        markdown_table(rows, sampling=mode["mode"] != "greedy") + ("\n\n" + split if split else "") + \
        ("\n\n" + steps if steps else "")
    data = {"meta": meta, "environment": env,
            "summary": rows, "records": records, "cost_curve": cost}
    (out / "bench.json").write_text(json.dumps(data, indent=1))
    text = table + ("\n\n" + cost_table(cost) if cost else "") + "\n"
    (out / "bench.md").write_text(text)
    figure = plot(out / "bench.png", records, rows, cost, caption(meta, env, records))
    return {"json": out / "bench.json", "markdown": out / "bench.md", "figure": figure, "table": table,
            "summary": rows}


def redraw(json_path: str | Path, figure_path: str | Path) -> Path:
    """The figure of a recorded run (a bench.json write_report wrote) drawn again as this version
    draws it, from the recorded numbers and environment alone: nothing is measured."""
    data = json.loads(Path(json_path).read_text())
    records, meta, env = data["records"], data.get("meta", {}), data.get("environment", {})
    return plot(Path(figure_path), records, summarize(records), data.get("cost_curve"), caption(meta, env, records))


if __name__ == "__main__":  # python -m lookahead.benchmarks.report bench.json figure.png
    if len(sys.argv) != 3:
        sys.exit("usage: python -m lookahead.benchmarks.report BENCH_JSON FIGURE_PNG")
    print(redraw(sys.argv[1], sys.argv[2]))
