"""``lookahead bench-vllm``: vLLM on this machine without speculation, with its ``ngram`` and ``suffix``
proposers and with lookahead's (lookahead/vllm/), on chat data sets replayed in order.

Each method runs on an engine of its own, started here (``enforce_eager``: no compilation, so engines
start in about half a minute on a CPU), once per concurrency level c. The data set's prompts go in
order, c in flight, on one of two schedules:

- ``closed`` (the default): as c clients each sending their next request when their last one is
  answered. The first c start together; whenever one finishes, the next prompt joins the running
  batch, so c requests are in flight until the last prompts drain. A record per finished request:
  its tokens and the time since the one before it finished (0 for a request that finished in the
  same step as the one before it), so that the second half is the last half of the requests.
- ``waves``: c prompts at a time, as one ``LLM.chat`` call (vLLM batches them); the next wave starts
  when the last of them ended, so a wave's time is its slowest request's, and the batch thins out
  as its requests finish. A record per wave. (Runs up to 131 of results/RESULTS.md used this.)

At c = 1 both are the same: one request after another. Every method gets the same prompts, greedy,
with the same ``num_speculative_tokens``; per data set it reports tokens per second over every record
and over the second half of them (where the memory across requests has seen the first half), and
vLLM's spec-decode counters: draft tokens, accepted tokens and the mean accepted length (1 +
accepted / drafts: tokens per verification step).
Whether every method's greedy text equals vLLM's without speculation is counted too (vLLM verifies;
float noise between a verify step and a plain step may flip a rare token).

Needs vLLM (the ``[vllm]`` extra, in an environment of its own: docs/vllm.md); ``suffix`` needs the
``arctic-inference`` package and is left out, saying so, where it is missing.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

METHODS = ("none", "ngram", "suffix", "lookahead")
SCHEDULES = ("closed", "waves")  # how the prompts go in, c in flight (module docstring)
LOOKAHEAD_CLASS = "lookahead.vllm.LookaheadProposer"
NGRAM_RANGE = (2, 4)  # prompt_lookup_min, prompt_lookup_max of vLLM's ngram proposer here


@dataclass(frozen=True)
class Settings:
    """What one bench-vllm run measures."""

    model_dir: str
    datasets: dict[str, list[tuple[str, list[dict[str, Any]]]]]  # name -> (prompt id, chat messages), in order
    methods: tuple[str, ...]
    levels: tuple[int, ...]
    max_tokens: int
    k: int  # num_speculative_tokens of every method
    dtype: str
    lookahead: dict[str, Any]  # additional_config["lookahead"] of lookahead's proposer
    schedule: str = "closed"  # one of SCHEDULES

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; schedules: {', '.join(SCHEDULES)}")


def speculative_config(method: str, k: int) -> dict[str, Any] | None:
    """vLLM's speculative_config for a method (None: no speculation)."""
    if method == "none":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": NGRAM_RANGE[0],
                "prompt_lookup_max": NGRAM_RANGE[1]}
    if method == "suffix":
        return {"method": "suffix", "num_speculative_tokens": k}
    if method == "lookahead":
        return {"method": "custom_class", "model": LOOKAHEAD_CLASS, "num_speculative_tokens": k}
    raise ValueError(f"unknown method {method!r}; methods: {', '.join(METHODS)}")


def available(method: str) -> str | None:
    """Why a method cannot run here (None: it can)."""
    if method == "suffix" and importlib.util.find_spec("arctic_inference") is None:
        return "vLLM's suffix method needs the arctic-inference package (pip install arctic-inference)"
    return None


def counters(llm: Any) -> dict[str, float]:
    """vLLM's spec-decode counters so far: drafts, draft tokens, accepted tokens (0 without speculation)."""
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    found = dict.fromkeys(names.values(), 0.0)
    for metric in llm.get_metrics():
        if metric.name in names:
            found[names[metric.name]] = float(metric.value)
    return found


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Tokens per second over every record (a wave or a finished request) and over the second half of
    them, and the counters' sums."""
    half = records[len(records) // 2:]

    def rate(part: list[dict[str, Any]]) -> float | None:
        seconds = sum(w["seconds"] for w in part)
        return sum(w["tokens"] for w in part) / seconds if seconds > 0 else None

    drafts = sum(r["drafts"] for r in records)
    accepted = sum(r["accepted"] for r in records)
    return {"tokens": sum(r["tokens"] for r in records), "seconds": sum(r["seconds"] for r in records),
            "tokens_per_s": rate(records), "second_half_tokens_per_s": rate(half),
            "draft_tokens": sum(r["draft_tokens"] for r in records), "accepted": accepted,
            "mean_accepted_length": 1 + accepted / drafts if drafts else None}


def run_engine(method: str, level: int, settings: Settings, log: Callable[[str], None]) -> dict[str, Any]:
    """One engine for ``method``: every data set in order, ``level`` prompts in flight on the settings'
    schedule; its records."""
    from vllm import LLM, SamplingParams

    began = time.perf_counter()
    extra = {"lookahead": settings.lookahead} if method == "lookahead" and settings.lookahead else {}
    llm = LLM(model=settings.model_dir, dtype=settings.dtype, max_model_len=4096, gpu_memory_utilization=0.2,
              enforce_eager=True, seed=0, speculative_config=speculative_config(method, settings.k),
              disable_log_stats=False, additional_config=extra)
    startup = time.perf_counter() - began
    params = SamplingParams(temperature=0, max_tokens=settings.max_tokens)
    out: dict[str, Any] = {"method": method, "concurrency": level, "startup_s": startup, "datasets": {}}
    try:
        llm.chat([[{"role": "user", "content": "Hello"}]], params, use_tqdm=False)  # warm-up, not counted
        for name, prompts in settings.datasets.items():
            run = _closed if settings.schedule == "closed" else _waves
            records, texts = run(llm, prompts, params, level)
            summary = summarize(records)
            out["datasets"][name] = {**summary, "schedule": settings.schedule, "records": records, "texts": texts}
            log(f"{method} c{level} {name}: {summary['tokens_per_s']:.1f} tokens/s "
                f"(second half {summary['second_half_tokens_per_s']:.1f}), mean accepted length "
                f"{_num(summary['mean_accepted_length'])}")
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    return out


def _waves(llm: Any, prompts: list[tuple[str, list[dict[str, Any]]]], params: Any,
           level: int) -> tuple[list[dict[str, Any]], dict[str, list[int]]]:
    """The prompts ``level`` at a time, a wave each (module docstring): (a record per wave, texts)."""
    waves, texts = [], {}
    for start in range(0, len(prompts), level):
        wave = prompts[start:start + level]
        before = counters(llm)
        t0 = time.perf_counter()
        outs = llm.chat([messages for _, messages in wave], params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        after = counters(llm)
        for (ident, _), o in zip(wave, outs):
            texts[ident] = list(o.outputs[0].token_ids)
        waves.append({"tokens": sum(len(o.outputs[0].token_ids) for o in outs), "seconds": seconds,
                      **{key: after[key] - before[key] for key in after}})
    return waves, texts


def _closed(llm: Any, prompts: list[tuple[str, list[dict[str, Any]]]], params: Any,
            level: int) -> tuple[list[dict[str, Any]], dict[str, list[int]]]:
    """The prompts in order with ``level`` in flight, the next joining as one finishes (module
    docstring): (a record per finished request, texts)."""
    engine = llm.llm_engine
    waiting = list(prompts)
    idents: dict[str, str] = {}  # vLLM's request id -> prompt id

    def send() -> None:
        ident, messages = waiting.pop(0)
        (request,) = llm.enqueue_chat([messages], params, use_tqdm=False)
        # (enqueue returns the engine's id, the LLM's own counter with a suffix after "-"; its outputs
        # carry the counter alone)
        idents[request] = idents[request.split("-")[0]] = ident

    for _ in range(min(level, len(waiting))):
        send()
    records, texts = [], {}
    before = counters(llm)
    last = time.perf_counter()
    while engine.has_unfinished_requests():
        done = [o for o in engine.step() if o.finished]
        if not done:
            continue
        now, after = time.perf_counter(), counters(llm)
        for i, o in enumerate(done):
            texts[idents[o.request_id]] = list(o.outputs[0].token_ids)
            if waiting:
                send()
            # one record per request, so that halves split the requests alike for every method: requests
            # that finished together share the time (and the counters) since the last that finished before
            records.append({"tokens": len(o.outputs[0].token_ids), "seconds": now - last if i == 0 else 0.0,
                            **{key: after[key] - before[key] if i == 0 else 0.0 for key in after}})
        before, last = after, now
    return records, texts


def run_bench(settings: Settings, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every method at every level (an engine each); the runs, with the texts compared to 'none'."""
    from lookahead.cost.measure import cpu_name

    runs, skipped = [], {}
    for method in settings.methods:
        why = available(method)
        if why is not None:
            skipped[method] = why
            log(f"{method}: skipped ({why})")
            continue
        for level in settings.levels:
            runs.append(run_engine(method, level, settings, log))
    plain = {(r["concurrency"], name): d["texts"] for r in runs if r["method"] == "none"
             for name, d in r["datasets"].items()}
    for run in runs:
        for name, data in run["datasets"].items():
            reference = plain.get((run["concurrency"], name))
            data["same_text_as_none"] = None if reference is None else sum(
                data["texts"].get(ident) == tokens for ident, tokens in reference.items())
            data["prompts"] = len(data["texts"])
    import vllm

    return {"meta": {"cpu": cpu_name(), "vllm": vllm.__version__, "model": settings.model_dir,
                     "dtype": settings.dtype, "k": settings.k, "max_tokens": settings.max_tokens,
                     "ngram_range": list(NGRAM_RANGE), "lookahead_settings": settings.lookahead,
                     "schedule": settings.schedule,
                     "skipped": skipped, "datasets": {n: len(p) for n, p in settings.datasets.items()}},
            "runs": runs}


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (data set, concurrency, method), with the ratio to 'none' and to 'ngram' there."""
    found = {(name, r["concurrency"], r["method"]): d for r in data["runs"] for name, d in r["datasets"].items()}
    out = []
    for (name, level, method), d in found.items():
        base = found.get((name, level, "none"), {})
        ngram = found.get((name, level, "ngram"), {})
        suffix = found.get((name, level, "suffix"), {})

        def ratio(other: dict[str, Any], key: str, d: dict[str, Any] = d) -> float | None:
            return d[key] / other[key] if other.get(key) and d.get(key) else None

        out.append({"dataset": name, "concurrency": level, "method": method, "tokens_per_s": d["tokens_per_s"],
                    "second_half_tokens_per_s": d["second_half_tokens_per_s"],
                    "mean_accepted_length": d["mean_accepted_length"], "vs_none": ratio(base, "tokens_per_s"),
                    "half_vs_ngram": ratio(ngram, "second_half_tokens_per_s"),
                    "half_vs_suffix": ratio(suffix, "second_half_tokens_per_s"),
                    "same": f"{d['same_text_as_none']}/{d['prompts']}" if d["same_text_as_none"] is not None else "-"})
    return sorted(out, key=lambda r: (r["dataset"], r["concurrency"], METHODS.index(r["method"])))


def markdown(data: dict[str, Any]) -> str:
    """The report: settings, then a table row per (data set, concurrency, method)."""
    meta = data["meta"]
    closed = meta.get("schedule", "waves") == "closed"  # (reports of runs before the schedules: waves)
    lines = [f"# bench-vllm: {Path(meta['model']).name} ({meta['dtype']}), vLLM {meta['vllm']}", "",
             f"- CPU: {meta['cpu']}", f"- num_speculative_tokens {meta['k']}, max_tokens {meta['max_tokens']}, "
             f"greedy; ngram prompt_lookup {meta['ngram_range'][0]}-{meta['ngram_range'][1]}",
             "- prompts: " + ", ".join(f"{n} {c}" for n, c in meta["datasets"].items()) + " (in order, "
             + ("`concurrency` in flight, the next joining as one finishes)" if closed
                else "in waves of `concurrency`)")]
    lines += [f"- {m}: skipped ({why})" for m, why in meta["skipped"].items()]
    lines += ["", "| data set | c | method | tokens/s | 2nd half tokens/s | mean accepted length | vs none "
              "| 2nd half vs ngram | 2nd half vs suffix | same text as none |",
              "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows(data):
        lines.append(f"| {r['dataset']} | {r['concurrency']} | {r['method']} | {_num(r['tokens_per_s'], 1)} | "
                     f"{_num(r['second_half_tokens_per_s'], 1)} | {_num(r['mean_accepted_length'])} | "
                     f"{_num(r['vs_none'])}x | {_num(r['half_vs_ngram'])}x | {_num(r['half_vs_suffix'])}x | "
                     f"{r['same']} |")
    return "\n".join(lines)


def plot(path: Path, data: dict[str, Any]) -> Path:
    """Tokens per second (second half of the records) per method, one panel per (data set, concurrency)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = rows(data)
    panels = sorted({(r["dataset"], r["concurrency"]) for r in table})
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6), squeeze=False)
    for ax, (name, level) in zip(axes[0], panels):
        mine = [r for r in table if (r["dataset"], r["concurrency"]) == (name, level)]
        ax.bar([r["method"] for r in mine], [r["second_half_tokens_per_s"] or 0 for r in mine],
               color=["#999999" if r["method"] == "none" else "#1f77b4" if r["method"] == "lookahead" else "#ff7f0e"
                      for r in mine])
        ax.set_title(f"{name}, concurrency {level}", fontsize=9)
        ax.set_ylabel("tokens/s (second half)")
    fig.suptitle(f"vLLM on {data['meta']['cpu']}: {Path(data['meta']['model']).name}, "
                 f"k={data['meta']['k']}, greedy", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(out_dir: str | Path, data: dict[str, Any]) -> dict[str, Any]:
    """bench-vllm.json (texts left out), bench-vllm.md and bench-vllm.png under out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    kept = {"meta": data["meta"], "runs": [{**r, "datasets": {n: {k: v for k, v in d.items() if k != "texts"}
                                                               for n, d in r["datasets"].items()}}
                                           for r in data["runs"]]}
    (out / "bench-vllm.json").write_text(json.dumps(kept, indent=1))
    text = markdown(data)
    (out / "bench-vllm.md").write_text(text + "\n")
    return {"json": out / "bench-vllm.json", "markdown": out / "bench-vllm.md",
            "figure": plot(out / "bench-vllm.png", data), "text": text}
