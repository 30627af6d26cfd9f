"""Repeated work: requests of one kind answered in order by one generator, so memory across requests
(proposers/memory/) fills as the sequence goes on.

Methods, each one generator kept for the whole sequence, run interleaved
request by request (the order rotates): transformers greedy, lookahead with
no memory (``memory_tokens=0``), lookahead with its suffix store, and, where
it builds here, lookahead with SuffixDecoding's official tree as the memory
(benchmarks/suffix_anchor.py) on the same verifier and budget. Every
lookahead output must equal greedy's. Reported per slice of the sequence:
tokens per forward and speed against greedy, and the store's host time per
step, so one sees the gain grow as the store fills.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from lookahead import LookaheadConfig, LookaheadGenerator


@dataclass
class Tally:
    """What one method did on a run of requests."""

    tokens: int = 0
    forwards: int = 0
    seconds: float = 0.0
    memory_s: float = 0.0
    ratios: list[float] = field(default_factory=list)  # greedy seconds / this method's, per request

    def add(self, tokens: int, forwards: int, seconds: float, memory_s: float, greedy_s: float) -> None:
        self.tokens += tokens
        self.forwards += forwards
        self.seconds += seconds
        self.memory_s += memory_s
        self.ratios.append(greedy_s / seconds if seconds > 0 else 0.0)

    def summary(self) -> dict:
        mean = math.exp(sum(map(math.log, self.ratios)) / len(self.ratios)) if self.ratios else 0.0
        return {"tokens": self.tokens, "forwards": self.forwards, "seconds": self.seconds,
                "tokens_per_forward": self.tokens / max(self.forwards, 1), "speedup": mean,
                "memory_ms_per_step": 1000 * self.memory_s / max(self.forwards, 1),
                "memory_share_of_step": self.memory_s / self.seconds if self.seconds else 0.0}


def generators(model, tokenizer, config: LookaheadConfig, anchor=None) -> dict[str, LookaheadGenerator]:
    """The lookahead methods: no memory, its own store, and SuffixDecoding's cache class (``anchor``) if built."""
    import dataclasses

    methods = {"no-memory": LookaheadGenerator(model, tokenizer, dataclasses.replace(config, memory_tokens=0)),
               "memory": LookaheadGenerator(model, tokenizer, config)}
    if anchor is not None:
        from lookahead.benchmarks.suffix_anchor import SuffixDecodingMemory

        methods["suffix-decoding"] = LookaheadGenerator(model, tokenizer, config, memory=SuffixDecodingMemory(anchor))
    return methods


def repeated_work(model, tokenizer, prompts: list[list[int]], max_new_tokens: int, config: LookaheadConfig,
                  anchor=None, slices: int = 4, progress=None) -> dict:
    """Answer ``prompts`` in order with every method; per-slice and second-half summaries, per-request
    records. Raises AssertionError if any lookahead output differs from greedy's."""
    gens = generators(model, tokenizer, config, anchor)
    names = ["greedy", *gens]
    pad = model.generation_config.pad_token_id
    records = []
    for index, prompt in enumerate(prompts):
        ids = torch.tensor([prompt])
        order = names[index % len(names):] + names[:index % len(names)]  # rotates: no method always goes first
        outs, rows = {}, {}
        for name in order:
            began = time.perf_counter()
            if name == "greedy":
                with torch.inference_mode():
                    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                         do_sample=False, pad_token_id=pad)
                seconds = time.perf_counter() - began
                new = int(out.shape[1] - ids.shape[1])
                rows[name] = (new, new, seconds, 0.0)
            else:
                out = gens[name].generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
                seconds = time.perf_counter() - began
                stats = gens[name].last_stats
                rows[name] = (stats.new_tokens, stats.steps, seconds, stats.memory_s)
            outs[name] = out
        for name in gens:
            if not torch.equal(outs[name], outs["greedy"]):
                raise AssertionError(f"request {index}: {name}'s tokens differ from greedy's")
        records.append(rows)
        if progress is not None:
            progress(index, rows)
    return {"slices": _slices(records, names, slices), "second_half": _summary(records[len(records) // 2:], names),
            "all": _summary(records, names), "records": records}


def _summary(records: list[dict], names: list[str]) -> dict:
    tallies = {name: Tally() for name in names}
    for rows in records:
        greedy_s = rows["greedy"][2]
        for name in names:
            tallies[name].add(*rows[name], greedy_s)
    return {name: tally.summary() for name, tally in tallies.items()}


def _slices(records: list[dict], names: list[str], slices: int) -> list[dict]:
    bounds = [round(i * len(records) / slices) for i in range(slices + 1)]
    return [{"requests": (lo, hi), **_summary(records[lo:hi], names)} for lo, hi in zip(bounds, bounds[1:]) if hi > lo]


def repeated_table(result: dict) -> str:
    """Markdown: tokens per forward and speed against greedy per slice, then the second half."""
    names = [n for n in result["all"] if n != "greedy"]
    head = "| requests | " + " | ".join(f"{n} tok/fwd | {n} vs greedy" for n in names) + " |"
    lines = [head, "|---|" + "---:|" * (2 * len(names))]
    rows = [(f"{s['requests'][0] + 1}-{s['requests'][1]}", s) for s in result["slices"]]
    rows.append(("**second half**", result["second_half"]))
    for label, part in rows:
        cells = " | ".join(f"{part[n]['tokens_per_forward']:.2f} | {part[n]['speedup']:.2f}x" for n in names)
        lines.append(f"| {label} | {cells} |")
    whole = result["all"]
    lines.append("")
    lines.append("Host time of the memory (look-up and update) per step: " + ", ".join(
        f"{n} {whole[n]['memory_ms_per_step']:.3f} ms ({100 * whole[n]['memory_share_of_step']:.2f}% of the time)"
        for n in names if whole[n]["memory_ms_per_step"] > 0) + ".")
    return "\n".join(lines)
