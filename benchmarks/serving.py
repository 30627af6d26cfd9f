"""``lookahead bench-serve``: OpenAI-compatible servers measured side by side under concurrent clients.

Up to four servers, each started here as a subprocess on a free loopback port, measured, and stopped:

    lookahead        ``lookahead serve`` with its defaults
    lookahead-plain  the same server and continuous-batching loop with speculation off (``PLAIN_OPTIONS``:
                     no candidates, the window x alone, no sources fed, no memory): one token per forward
    transformers     ``transformers serve <model dir>``, the anchor: with one client as one starts it by default
                     (without continuous batching, which on 2 CPU cores answered one client slower: 6.9
                     against 8.0 tokens/s on the tool calls), with more clients with ``--continuous-batching``
                     where it answers on this machine (tried first), else without; the results say which
    llama.cpp        llama.cpp's ``llama-server`` (a build given, ``LlamaServer``) on the model's GGUF file, the
                     second anchor: ``--jinja`` (tools through the model's chat template, its own call parser),
                     the same threads, one slot per client (``-np``, 4096 tokens of context each), greedy by
                     the requests' temperature 0; the command benchmarks/llamacpp.py runs, plus those

Every (server, data set, concurrency) runs on a freshly started server, so that what one level taught
lookahead's memory across requests does not answer the next level's identical requests. After
``/health`` answers, ``concurrency`` warm-up requests (a fixed prompt, staggered lengths, so every batch
size from ``concurrency`` down to 1 is stepped once: lazily measured cost curves, a paged cache's set-up)
go first and are not counted. Then the data set's chat prompts, in order, are replayed by
``concurrency`` clients (the official ``openai`` client, async), each sending its next prompt when its
last answer ended: greedy (temperature 0), ``max_tokens`` each, streamed. The ``agent`` data set
(benchmarks/agent.py) is conversations instead of prompts: a client runs one conversation's turns one
after another (benchmarks/conversation.py: each turn one request with the tools, its calls run by fake
tools and sent back), and every turn is a request record like any other.

A run in which a server refused every request (an HTTP error status other than 429 and 503: a request
kind it does not take, such as tools on a template without them) is kept, marked ``unsupported`` with the first refusal,
and named in the report; the run goes on to the next server. Where the requests carried a prediction
(Predicted Outputs), the report sums the accepted and rejected prediction tokens each server reported, or
says that it reported none (llama.cpp takes the field and ignores it).

Per run: throughput (output tokens / wall time, first request sent to last answer ended), requests/s,
time to first token (TTFT: request sent to its first streamed text) and time per output token (TPOT,
as vLLM's benchmark defines it: (latency - TTFT) / (output tokens - 1)), their p50 and p99 over the
requests, and for the lookahead servers tokens per forward from ``/metrics`` (the deltas of
``lookahead_tokens_generated_total`` and ``lookahead_sequence_steps_total`` over the measured requests:
the tokens each sequence gained per step it was in, 1.0 for plain decoding at any concurrency).
Output tokens are the usage the server reports on its last chunk (``stream_options.include_usage``
for lookahead; transformers sends it unasked and refuses the option), else the reply's text
re-tokenized (recorded per request as ``tokens_from``). The same text check (``text_agreement``) compares
lookahead's answer to each prompt with each other server's; a conversation's turns only while the two
servers' turns agree (a later turn's prompt holds the earlier answers): the turns after the first that
differs are counted apart as diverged.

``write_report`` writes bench-serve.json (every number, every request, every command line),
bench-serve.md (the tables) and bench-serve.png.
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
import os
import shlex
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lookahead.benchmarks.conversation import canonical_arguments, run_conversation

SERVERS: tuple[str, ...] = ("lookahead", "lookahead-plain", "transformers", "llama.cpp")
# the servers lookahead is compared with, and the label of their columns in the ratio rows
OTHERS: tuple[tuple[str, str], ...] = (("lookahead-plain", "plain"), ("transformers", "transformers"),
                                       ("llama.cpp", "llamacpp"))
DEFAULT_DATASETS: tuple[str, ...] = ("tool-calls", "mt-bench-1")
# lookahead serve's LookaheadConfig options that make it plain decoding in the same server and loop:
# no candidates (nothing proposed, no tree: plan/planner.py), the window x alone (window 1, auto_window
# off), and no source fed beside the steps: no memory store, no recycling table, no context matcher, and
# the n-gram pool left on but never fed (a config with every source off fails: AcceptanceStats gets no
# priors to concatenate). A step is one row per sequence and no speculative host work.
PLAIN_OPTIONS: tuple[str, ...] = ("--candidates", "0", "--window", "1", "--no-auto-window", "--memory-tokens", "0",
                                  "--no-recycle", "--no-context-match", "--no-seed-from-prompt",
                                  "--no-seed-from-output")
HOST = "127.0.0.1"
WARMUP_PROMPT = "Write two sentences about the sea."
WARMUP_STEP = 4  # warm-up request i asks for WARMUP_STEP * (i + 1) tokens: they finish one after another
STDERR_LINES = 8  # a server's last stderr lines quoted when it does not come up
STOP_WAIT_S = 30.0  # SIGTERM, then this long before SIGKILL
METRIC_TOKENS = "lookahead_tokens_generated_total"
METRIC_FORWARDS = "lookahead_sequence_steps_total"  # steps counted once per sequence in them
METRIC_STEPS = "lookahead_forwards_total"  # the batch's steps, one forward each
METRIC_HOST = "lookahead_host_seconds_total"  # the steps' host work
METRIC_FORWARD = "lookahead_forward_seconds_total"  # the steps' forwards with their read-back


class BenchServeError(RuntimeError):
    """A run that could not be measured; ``results`` holds what was measured before it (see run_bench)."""

    results: dict[str, Any] | None = None


class ServerStartError(BenchServeError):
    """A server exited or did not answer GET /health in time (the message quotes its last stderr lines)."""


class RunError(BenchServeError):
    """A server came up but could not answer (its warm-up requests failed)."""


# ---------------------------------------------------------------- pure pieces

def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) of values, interpolated linearly between order statistics (numpy's
    default); None for no values. percentile([1, 2, 3, 4], 50) == 2.5."""
    if not 0 <= q <= 100:
        raise ValueError(f"q must lie in [0, 100], got {q}")
    ordered = sorted(float(v) for v in values)
    if not ordered:
        return None
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition as {name: value}; a labelled sample is keyed ``name{labels}`` as written.
    Comments (# HELP, # TYPE), blank lines and lines whose value is no number are skipped."""
    samples: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        space = next((i for i, char in enumerate(line) if char.isspace()), len(line))
        if 0 <= line.find("{") < space:  # name{labels} value
            head, _, rest = line.partition("{")
            labels, _, rest = rest.rpartition("}")
            key = f"{head}{{{labels}}}"
        else:  # name value
            key, rest = line[:space], line[space:]
        parts = rest.split()
        if not parts:
            continue
        try:
            samples[key] = float(parts[0])
        except ValueError:
            continue
    return samples


def tokens_per_forward(before: dict[str, float] | None, after: dict[str, float] | None) -> float | None:
    """Tokens generated per forward between two /metrics scrapes; None without both counters or forwards."""
    if not before or not after:
        return None
    try:
        tokens = after[METRIC_TOKENS] - before[METRIC_TOKENS]
        forwards = after[METRIC_FORWARDS] - before[METRIC_FORWARDS]
    except KeyError:
        return None
    return tokens / forwards if forwards > 0 else None


def step_parts(before: dict[str, float] | None, after: dict[str, float] | None) -> tuple[float, float] | None:
    """(host, forward) seconds a step between two /metrics scrapes, the batch's steps counted once; None
    without both scrapes' counters (another server, an older lookahead) or steps."""
    if not before or not after:
        return None
    try:
        steps = after[METRIC_STEPS] - before[METRIC_STEPS]
        host = after[METRIC_HOST] - before[METRIC_HOST]
        forward = after[METRIC_FORWARD] - before[METRIC_FORWARD]
    except KeyError:
        return None
    return (host / steps, forward / steps) if steps > 0 else None


def parse_concurrency(text: str) -> list[int]:
    """'1,4' -> [1, 4] (duplicates dropped, order kept); ValueError unless every item is a whole number >= 1."""
    levels: list[int] = []
    for part in str(text).split(","):
        item = part.strip()
        try:
            value = int(item)
        except ValueError:
            raise ValueError(f"concurrency levels are whole numbers >= 1 separated by commas, got {item!r} "
                             f"in {text!r}") from None
        if value < 1:
            raise ValueError(f"a concurrency level must be >= 1, got {value} in {text!r}")
        if value not in levels:
            levels.append(value)
    return levels


def request_times(record: dict[str, Any]) -> tuple[float | None, float | None]:
    """(TTFT, TPOT) in seconds of one request record (sent, first, end, completion_tokens); None where
    undefined (no text arrived; TPOT with fewer than two output tokens)."""
    if record.get("error") is not None or record.get("first") is None:
        return None, None
    ttft = record["first"] - record["sent"]
    tokens = record.get("completion_tokens") or 0
    tpot = (record["end"] - record["first"]) / (tokens - 1) if tokens >= 2 else None
    return ttft, tpot


def summarize_run(records: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """A run's numbers from its request records and its wall time (first sent to last ended)."""
    ok = [r for r in records if r.get("error") is None]
    times = [request_times(r) for r in ok]
    ttft = [t for t, _ in times if t is not None]
    tpot = [p for _, p in times if p is not None]
    tokens = sum(int(r.get("completion_tokens") or 0) for r in ok)
    return {
        "requests": len(records), "errors": len(records) - len(ok), "output_tokens": tokens,
        "prompt_tokens": sum(int(r.get("prompt_tokens") or 0) for r in ok), "wall_s": wall_s,
        "throughput_tok_s": tokens / wall_s if wall_s > 0 else 0.0,
        "requests_per_s": len(ok) / wall_s if wall_s > 0 else 0.0,
        "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
        "tpot_p50_s": percentile(tpot, 50), "tpot_p99_s": percentile(tpot, 99),
    }


def ratio_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (data set, concurrency): lookahead's throughput over each other server's (OTHERS: lookahead-plain,
    transformers, llama.cpp), the other server's TPOT p50 over lookahead's (> 1: lookahead faster), on how
    many prompts (a conversation's turns) both replied the same text ([same, compared]), and how many of
    lookahead's turns were not compared because an earlier turn of their conversation differed (``diverged``,
    see text_agreement); None where a side is missing. Over several rounds (run_bench): the throughput of all
    of a server's rounds together (their tokens over their wall time), the median of the rounds' TPOT p50,
    the texts compared round by round and summed, each round's throughput ratio
    (``throughput_vs_<label>_rounds``), and the other server's TPOT p99 over lookahead's, each taken over every
    request of every round together (``tpot_p99_vs_<label>``: a few slow requests of one round weigh as much as
    they would in one long run)."""
    by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in runs:
        by_key.setdefault((r["dataset"], r["concurrency"], r["server"]), []).append(r)
    keys = list(dict.fromkeys((r["dataset"], r["concurrency"]) for r in runs))
    rows = []
    for dataset, concurrency in keys:
        ours = by_key.get((dataset, concurrency, "lookahead"), [])
        row: dict[str, Any] = {"dataset": dataset, "concurrency": concurrency}
        for other, label in OTHERS:
            theirs = by_key.get((dataset, concurrency, other), [])
            row[f"throughput_vs_{label}"] = _ratio(pooled_throughput(ours), pooled_throughput(theirs))
            row[f"tpot_vs_{label}"] = _ratio(median_of(theirs, "tpot_p50_s"), median_of(ours, "tpot_p50_s"))
            row[f"tpot_p99_vs_{label}"] = _ratio(pooled_tpot(theirs, 99), pooled_tpot(ours, 99))
            pairs = list(zip(ours, theirs))  # (round by round: both lists are in round order)
            agreements = [a for a in (text_agreement(o, t) for o, t in pairs) if a is not None]
            row[f"same_text_vs_{label}"] = [sum(a[0] for a in agreements), sum(a[1] for a in agreements)] \
                if agreements else None
            row[f"diverged_vs_{label}"] = sum(a[2] for a in agreements) if agreements else None
            if len(pairs) > 1:
                row[f"throughput_vs_{label}_rounds"] = [_ratio(o.get("throughput_tok_s"), t.get("throughput_tok_s"))
                                                        for o, t in pairs]
        rows.append(row)
    return rows


def pooled_throughput(runs: list[dict[str, Any]]) -> float | None:
    """Output tokens per second of ``runs`` together (their tokens over their summed wall time; one run's own
    throughput; None: no run)."""
    if len(runs) == 1:
        return runs[0].get("throughput_tok_s")
    wall = sum(r.get("wall_s") or 0.0 for r in runs)
    return sum(r.get("output_tokens") or 0 for r in runs) / wall if runs and wall > 0 else None


def pooled_tpot(runs: list[dict[str, Any]], q: float) -> float | None:
    """The q-th percentile of the TPOT of every request of ``runs`` together (a record's ``tpot_s``, else
    request_times's; None: no request with a TPOT). Runs with TPOTs [10, 20] and [30, 40] ms: p50 25 ms."""
    values = []
    for run in runs:
        for record in run.get("records") or []:
            tpot = record["tpot_s"] if "tpot_s" in record else request_times(record)[1]
            if tpot is not None:
                values.append(tpot)
    return percentile(values, q)


def median_of(runs: list[dict[str, Any]], field: str) -> float | None:
    """The median of ``field`` over ``runs`` (None where no run has it)."""
    values = [r[field] for r in runs if r.get(field) is not None]
    return statistics.median(values) if values else None


def same_text(ours: dict[str, Any] | None, theirs: dict[str, Any] | None) -> list[int] | None:
    """[prompts both answered with the same text, prompts compared] of two runs (None: a run missing); see
    text_agreement."""
    agreement = text_agreement(ours, theirs)
    return None if agreement is None else list(agreement[:2])


def text_agreement(ours: dict[str, Any] | None, theirs: dict[str, Any] | None) -> tuple[int, int, int] | None:
    """(same, compared, diverged) of two runs' answered records, matched by id (None: a run missing).

    A prompt both answered is compared. A conversation's turns (records with ``conversation`` and ``turn``)
    are compared in turn order only while the two servers' texts agree: the first turn that differs is
    compared (and counts as not the same), and every later turn of that conversation in ``ours`` is not
    compared (its prompt holds the differing answer, so the servers were asked different things): those
    turns are counted as ``diverged``. A turn only one side answered is neither compared nor diverged."""
    if not ours or not theirs:
        return None
    other = {r.get("id"): r.get("text") for r in theirs.get("records", []) if r and r.get("error") is None}
    same = compared = diverged = 0
    parted: set[Any] = set()  # conversations whose texts differed at some turn
    for record in sorted((r for r in ours.get("records", []) if r and r.get("error") is None),
                         key=lambda r: (str(r.get("conversation", "")), r.get("turn") or 0)):
        conversation = record.get("conversation")
        if conversation is not None and conversation in parted:
            diverged += 1
            continue
        key = record.get("id")
        if key not in other:
            continue
        compared += 1
        if record.get("text") == other[key]:
            same += 1
        elif conversation is not None:
            parted.add(conversation)
    return same, compared, diverged


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return top / bottom if top and bottom else None


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def markdown_table(runs: list[dict[str, Any]]) -> str:
    """One row per run: data set, server, concurrency, requests (errors), tokens/s, requests/s, TTFT and
    TPOT p50/p99 in ms, tokens per forward, a step's host and forward ms (lookahead's servers)."""
    lines = ["| data set | server | concurrency | requests | output tokens | tokens/s | requests/s | TTFT p50 ms "
             "| TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | tokens/forward | step host / forward ms |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    rounds = any(r.get("round") for r in runs)  # (several rounds: each run's round beside its server)
    for r in runs:
        errors = " (not supported)" if r.get("unsupported") else f" ({r['errors']} failed)" if r.get("errors") else ""
        tpf = r.get("tokens_per_forward")
        parts = r.get("step_parts")
        server = r["server"] + (f" (round {r['round'] + 1})" if rounds else "")
        lines.append(f"| {r['dataset']} | {server} | {r['concurrency']} | {r['requests']}{errors} "
                     f"| {r['output_tokens']} | {r['throughput_tok_s']:.1f} | {r['requests_per_s']:.2f} "
                     f"| {_ms(r.get('ttft_p50_s'))} | {_ms(r.get('ttft_p99_s'))} | {_ms(r.get('tpot_p50_s'))} "
                     f"| {_ms(r.get('tpot_p99_s'))} | {'-' if tpf is None else f'{tpf:.2f}'} "
                     f"| {'-' if not parts else f'{_ms(parts[0])} / {_ms(parts[1])}'} |")
    return "\n".join(lines)


def _same(pair: list[int] | None, diverged: int | None = None) -> str:
    if not pair:
        return "-"
    return f"{pair[0]}/{pair[1]}" + (f" (+{diverged} diverged)" if diverged else "")


def ratio_table(rows: list[dict[str, Any]]) -> str:
    """Lookahead against the plain server and transformers (and llama.cpp, where any row holds a number for
    it) at each concurrency: throughput ratios and TPOT (p50, p99) ratios, all > 1 where lookahead is faster, and
    the prompts answered with the same text ("same/compared", "+N diverged": a conversation's turns after its
    texts parted, not compared)."""
    labels = ["plain", "transformers"] + [label for _, label in OTHERS[2:]
                                          if any(r.get(f"throughput_vs_{label}") is not None
                                                 or r.get(f"same_text_vs_{label}") is not None for r in rows)]
    names = {label: other.replace("lookahead-", "") for other, label in OTHERS}
    lines = ["| data set | concurrency | " + " | ".join(f"tokens/s vs {names[label]}" for label in labels) + " | "
             + " | ".join(f"TPOT vs {names[label]}" for label in labels) + " | "
             + " | ".join(f"TPOT p99 vs {names[label]}" for label in labels) + " | "
             + " | ".join(f"same text as {names[label]}" for label in labels) + " |",
             "|---|---:|" + "---:|" * (4 * len(labels))]
    for r in rows:
        cells = ([_x(r.get(f"throughput_vs_{label}")) + each_round(r.get(f"throughput_vs_{label}_rounds"))
                  for label in labels]
                 + [_x(r.get(f"tpot_vs_{label}")) for label in labels]
                 + [_x(r.get(f"tpot_p99_vs_{label}")) for label in labels]
                 + [_same(r.get(f"same_text_vs_{label}"), r.get(f"diverged_vs_{label}")) for label in labels])
        lines.append(f"| {r['dataset']} | {r['concurrency']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def each_round(ratios: list[float | None] | None) -> str:
    """ " (1.48, 1.56)": each round's ratio, after the pooled one ("" for one round)."""
    if not ratios:
        return ""
    return " (" + ", ".join("-" if x is None else f"{x:.2f}" for x in ratios) + ")"


def report_text(data: dict[str, Any]) -> str:
    """The markdown report: what was measured where, the runs, the ratios, the servers' command lines."""
    meta = data["meta"]
    env = meta.get("environment", {})
    lines = [f"Measured on {env.get('cpu', '?')} ({env.get('cpu_count', '?')} cores), servers on "
             f"{meta['threads']} torch thread{'s' if meta['threads'] != 1 else ''} each (one server at a time), "
             f"{meta['started']} to {meta['finished']}.",
             f"Model {meta['model']}; greedy (temperature 0), max_tokens {meta['max_tokens']}, "
             f"{meta['limit']} prompts per data set in order, streamed; concurrency "
             f"{', '.join(map(str, meta['concurrency']))}; a fresh server per run, warmed up first"
             + (f"; {meta['rounds']} rounds, the servers' order reversed each round (the ratios pool them; in "
                f"brackets, each round's)." if meta.get("rounds", 1) > 1 else "."),
             "", markdown_table(data["runs"])]
    if meta.get("incomplete"):
        lines[2:2] = [f"INCOMPLETE: {meta['incomplete']}"]
    if data.get("ratios"):
        lines += ["", "lookahead against the others (> 1: lookahead faster; TPOT: theirs / ours, p50 the median of the "
                  "rounds', p99 over every request of every round):", "",
                  ratio_table(data["ratios"])]
    lines += ["", "TTFT: request sent to its first streamed text; TPOT: (latency - TTFT) / (output tokens - 1); "
              "tokens/forward: the lookahead servers' /metrics over the measured requests, the tokens each "
              "sequence gained per step it was in (1.0 for plain decoding at any concurrency); step host / "
              "forward ms: the same /metrics' seconds of the batch's steps, their host work (proposing, planning, "
              "committing, the cache's bookkeeping) and their forwards with the read-back, per step.", "",
              "Servers:",
              ""]
    for name, server in data["servers"].items():
        extra = ""
        if name == "transformers":
            extra = anchor_label(server, data["meta"].get("concurrency", ()))
        elif name == "lookahead-plain":
            extra = " (speculation off: " + " ".join(PLAIN_OPTIONS) + ")"
        elif name == "llama.cpp":
            extra = " (llama.cpp's llama-server on the model's GGUF file, --jinja, greedy by the requests)"
        # the first command of each kind, with and without continuous batching (they differ in ports too)
        firsts: dict[bool, list[str]] = {}
        for command in server.get("commands", []):
            firsts.setdefault("--continuous-batching" in command, command)
        lines += [f"- {name}{extra}: `{shlex.join(c)}`" for c in firsts.values()]
    return "\n".join(lines + run_notes(data["runs"])) + "\n"


def run_notes(runs: list[dict[str, Any]]) -> list[str]:
    """The report's lines on what the tables do not show: the runs a server refused (not supported), the
    prediction tokens each server reported, the agent conversations' turns and calls."""
    lines: list[str] = []
    refused = [r for r in runs if r.get("unsupported")]
    if refused:
        lines += ["", "Not supported (every request refused; the run is kept, its numbers are zero):", ""]
        lines += [f"- {r['server']} on {r['dataset']}, {r['concurrency']} client(s): {r['unsupported']}"
                  for r in refused]
    predicted = [r for r in runs if r.get("prediction")]
    if predicted:
        lines += ["", "Predicted Outputs (requests that sent a prediction):", ""]
        for r in predicted:
            counts = r["prediction"]
            said = (f"{counts['accepted']} accepted, {counts['rejected']} rejected prediction tokens reported on "
                    f"{counts['reported']} of {counts['requests']} requests" if counts["reported"] else
                    f"no prediction tokens reported on its {counts['requests']} requests (it ignores the prediction "
                    f"or does not report it)")
            lines.append(f"- {r['server']} on {r['dataset']}, {r['concurrency']} client(s): {said}")
    agents = [r for r in runs if r.get("agent")]
    if agents:
        lines += ["", "Agent conversations (a turn is a request; same text compared turn by turn while the texts "
                      "agree, the turns after the first difference counted as diverged):", ""]
        lines += [f"- {r['server']} on {r['dataset']}, {r['concurrency']} client(s): {a['conversations']} "
                  f"conversations, {a['turns']} turns, {a['turns_with_calls']} with tool calls, {a['calls_run']} "
                  f"calls run" for r in agents for a in (r["agent"],)]
    return lines


def anchor_label(server: dict[str, Any], levels: Sequence[int]) -> str:
    """How transformers serve ran: " (continuous batching with 4 clients, without with one)", " (continuous
    batching)", " (without continuous batching: why)", or "" where the results do not say."""
    cb, at = server.get("continuous_batching"), server.get("continuous_batching_at")
    if cb is None:
        return ""
    if not cb:
        error = server.get("continuous_batching_error")
        return f" (without continuous batching{': ' + error if error else ''})"
    if at and 1 in levels:
        return f" (continuous batching with {', '.join(map(str, at))} clients, without with one)"
    return " (continuous batching)"


def plot(path: Path, runs: list[dict[str, Any]]) -> Path:
    """Throughput, TPOT p50 and TTFT p50 against concurrency: a line per server (colour) and data set (style)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    servers = list(dict.fromkeys(r["server"] for r in runs))
    datasets = list(dict.fromkeys(r["dataset"] for r in runs))
    styles = ["-", "--", ":", "-."]
    panels = (("throughput_tok_s", 1.0, "output tokens/s"), ("tpot_p50_s", 1e3, "TPOT p50 (ms)"),
              ("ttft_p50_s", 1e3, "TTFT p50 (ms)"))
    for ax, (key, scale, label) in zip(axes, panels):
        for i, server in enumerate(servers):
            for j, dataset in enumerate(datasets):
                points = sorted((r["concurrency"], r[key] * scale) for r in runs
                                if r["server"] == server and r["dataset"] == dataset and r.get(key) is not None)
                if points:
                    xs, ys = zip(*points)
                    ax.plot(xs, ys, styles[j % len(styles)], marker="o", color=f"C{i}", label=f"{server} {dataset}")
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        ax.set_xticks(sorted({r["concurrency"] for r in runs}))
    if runs:
        axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path


def write_report(out_dir: str | Path, data: dict[str, Any]) -> dict[str, Any]:
    """bench-serve.json, bench-serve.md and bench-serve.png under out_dir; their paths and the report's text."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = report_text(data)
    (out / "bench-serve.json").write_text(json.dumps(data, indent=1))
    (out / "bench-serve.md").write_text(text)
    figure = plot(out / "bench-serve.png", data["runs"])
    return {"json": out / "bench-serve.json", "markdown": out / "bench-serve.md", "figure": figure, "text": text}


# ---------------------------------------------------------------- servers

def free_port() -> int:
    """A TCP port free on the loopback address now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class LlamaServer:
    """llama.cpp's server as bench-serve runs it: the ``llama-server`` binary, the GGUF file it serves, and
    extra arguments (``--spec-type ngram-mod``, say)."""

    binary: str
    gguf: str
    args: tuple[str, ...] = ()


def server_command(name: str, model: str, model_dir: str, port: int, max_batch: int,
                   continuous_batching: bool = True, lookahead_args: Sequence[str] = (),
                   llama: LlamaServer | None = None, threads: int = 1) -> list[str]:
    """The command line that starts server ``name`` on ``port`` (this Python's interpreter; for llama.cpp, its
    binary on its GGUF file with ``--jinja``, ``threads`` threads and ``max_batch`` slots)."""
    if name == "llama.cpp":
        if llama is None:
            raise ValueError("server llama.cpp needs its binary and GGUF file (a LlamaServer)")
        from lookahead.benchmarks.llamacpp import server_command as llama_command

        return llama_command(llama.binary, llama.gguf, threads, port, ("--jinja", *llama.args), slots=max_batch,
                             host=HOST)
    if name in ("lookahead", "lookahead-plain"):
        plain = list(PLAIN_OPTIONS) if name == "lookahead-plain" else []
        return [sys.executable, "-m", "lookahead.cli.main", "serve", "--model", model, "--host", HOST,
                "--port", str(port), "--max-batch", str(max_batch), *lookahead_args, *plain]
    if name == "transformers":
        return [sys.executable, "-m", "transformers.cli.transformers", "serve", model_dir,
                *(["--continuous-batching"] if continuous_batching else []), "--device", "cpu", "--dtype", "float32",
                "--host", HOST, "--port", str(port)]
    raise ValueError(f"unknown server {name!r}; servers: {', '.join(SERVERS)}")


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """(status, body) of a GET; the status of an HTTP error too; OSError when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (loopback, ours)
            return int(response.status), response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode("utf-8", "replace")


class ServerProcess:
    """One server subprocess: its stdout and stderr in files under log_dir, up once GET /health says 200."""

    def __init__(self, name: str, command: list[str], port: int, log_dir: Path, env: dict[str, str] | None = None,
                 label: str | None = None) -> None:
        self.name, self.command, self.port = name, command, port
        self.base = f"http://{HOST}:{port}"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.stdout_path = log_dir / f"{label or name}.out"
        self.stderr_path = log_dir / f"{label or name}.err"
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float) -> float:
        """Start the process and wait for GET /health to answer 200; seconds it took. ServerStartError (with
        the last stderr lines) when the process exits first or nothing answers within ``timeout`` seconds."""
        started = time.perf_counter()
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen(self.command, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                            env=self.env)
        deadline = started + timeout
        while True:
            code = self.process.poll()
            if code is not None:
                raise ServerStartError(f"server {self.name} exited with status {code} before answering GET "
                                       f"{self.base}/health (command: {shlex.join(self.command)}); "
                                       f"its last stderr lines: {self.stderr_tail()}")
            try:
                status, _ = http_get(f"{self.base}/health", timeout=2.0)
                if status == 200:
                    return time.perf_counter() - started
            except OSError:
                pass
            if time.perf_counter() > deadline:
                self.stop()
                raise ServerStartError(f"server {self.name} did not answer GET {self.base}/health within "
                                       f"{timeout:.0f} s (command: {shlex.join(self.command)}); its last stderr "
                                       f"lines: {self.stderr_tail()}")
            time.sleep(0.25)

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.process is not None and self.process.poll() is None

    def metrics(self) -> dict[str, float] | None:
        """GET /metrics parsed (None when it does not answer 200)."""
        try:
            status, body = http_get(f"{self.base}/metrics")
        except OSError:
            return None
        return parse_metrics(body) if status == 200 else None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after STOP_WAIT_S seconds (this process only, by its id)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def stderr_tail(self, lines: int = STDERR_LINES) -> str:
        """The last non-empty stderr lines, joined by ' | ' (progress bars' carriage returns split too)."""
        try:
            text = self.stderr_path.read_text("utf-8", "replace")
        except OSError:
            return "(no stderr)"
        kept = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
        return " | ".join(kept[-lines:]) or "(no stderr)"


# ---------------------------------------------------------------- clients

@dataclass
class Client:
    """How requests reach one server: its base URL, the model name it answers to, whether to ask for the
    usage on the last streamed chunk, and a fallback token counter for replies without usage."""

    base_url: str
    model: str
    stream_usage: bool
    count_tokens: Callable[[str], int] | None = None
    timeout: float = 600.0
    failures: list[str] = field(default_factory=list)


async def one_request(client: Any, spec: Client, messages: list[dict[str, Any]], max_tokens: int,
                      clock: float, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Send one streamed greedy chat request (with the request fields ``extra``, such as a prediction); its
    record (times in seconds after ``clock``)."""
    import openai

    sent = time.perf_counter()
    first: float | None = None
    pieces: list[str] = []
    content: list[str] = []
    calls: dict[int, dict[str, str]] = {}  # the streamed tool calls by index: name, arguments joined
    usage: Any = None
    finish: str | None = None
    error: str | None = None
    status: int | None = None
    try:
        stream = await client.chat.completions.create(
            model=spec.model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True,
            extra_body={**({"stream_options": {"include_usage": True}} if spec.stream_usage else {}), **(extra or {})}
            or None)
        async for chunk in stream:
            if getattr(chunk, "usage", None) is not None:
                usage = chunk.usage
            for choice in chunk.choices or ():
                delta = choice.delta
                piece = (delta.content or "") if delta is not None else ""
                content.append(piece)
                for call in (delta.tool_calls or ()) if delta is not None else ():
                    if call.function is not None:
                        piece += _add_call(calls, call)
                if piece:
                    first = first if first is not None else time.perf_counter()
                    pieces.append(piece)
                finish = choice.finish_reason or finish
    except (openai.OpenAIError, OSError, ValueError) as exc:
        error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        status = getattr(exc, "status_code", None)
    end = time.perf_counter()
    tool_calls = [calls[i] for i in sorted(calls)]
    # (with calls: the content, then each call's name and its arguments' canonical JSON, so that two servers
    # making the same call with other spacing in its JSON answer the same text)
    text = "".join(content) + "".join(c["name"] + canonical_arguments(c["arguments"]) for c in tool_calls) \
        if tool_calls else "".join(pieces)
    tokens, source = 0, "none"
    if usage is not None and getattr(usage, "completion_tokens", None) is not None:
        tokens, source = int(usage.completion_tokens), "usage"
    elif spec.count_tokens is not None and text:
        tokens, source = spec.count_tokens(text), "tokenizer"
    record = {"sent": sent - clock, "first": None if first is None else first - clock, "end": end - clock,
              "completion_tokens": tokens, "tokens_from": source,
              "prompt_tokens": getattr(usage, "prompt_tokens", None) if usage is not None else None,
              "prediction_tokens": _prediction_counts(usage),
              "finish_reason": finish, "chunks": len(pieces), "text": text, "content": "".join(content),
              "tool_calls": tool_calls, "error": error, "status": status}
    ttft, tpot = request_times(record)
    record["ttft_s"], record["tpot_s"] = ttft, tpot
    return record


def _add_call(calls: dict[int, dict[str, str]], call: Any) -> str:
    """Fold one streamed tool-call delta into ``calls`` (by its index: the name from the delta that first names
    it, as OpenAI streams it once, the arguments' pieces joined); the text it added."""
    entry = calls.setdefault(int(getattr(call, "index", 0) or 0), {"name": "", "arguments": ""})
    name, arguments = call.function.name or "", call.function.arguments or ""
    entry["name"] = entry["name"] or name
    entry["arguments"] += arguments
    return name + arguments


def _prediction_counts(usage: Any) -> dict[str, int] | None:
    """usage.completion_tokens_details' accepted and rejected prediction tokens, where the server reports them."""
    details = getattr(usage, "completion_tokens_details", None) if usage is not None else None
    accepted = getattr(details, "accepted_prediction_tokens", None) if details is not None else None
    if accepted is None:
        return None
    return {"accepted": int(accepted), "rejected": int(getattr(details, "rejected_prediction_tokens", 0) or 0)}


async def replay(spec: Client, prompts: Sequence[tuple[Any, ...]], concurrency: int,
                 max_tokens: int | Sequence[int]) -> tuple[list[dict[str, Any]], float]:
    """The prompts ((id, chat messages), (id, chat messages, request fields), or (id, chat messages, request
    fields, AgentPlan): a conversation of several requests, benchmarks/conversation.py), in order, through
    ``concurrency`` clients (each sends its next prompt, or its conversation's next turn, when its last answer
    ended); (records in prompt order, a conversation's turns in turn order; wall seconds from the first sent
    to the last ended)."""
    import openai

    lengths = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else list(max_tokens)
    client = openai.AsyncOpenAI(base_url=f"{spec.base_url}/v1", api_key="bench-serve", max_retries=0,
                                timeout=spec.timeout)
    queue = collections.deque(enumerate(prompts))
    records: list[list[dict[str, Any]]] = [[] for _ in prompts]
    clock = time.perf_counter()

    async def worker() -> None:
        while queue:
            index, (ident, messages, *rest) = queue.popleft()
            fields = rest[0] if rest else None
            plan = rest[1] if len(rest) > 1 else None

            async def send(history: list[dict[str, Any]], extra: dict[str, Any] | None, limit: int = lengths[index]
                           ) -> dict[str, Any]:
                return await one_request(client, spec, history, limit, clock, extra)

            if plan is None:
                records[index] = [{"index": index, "id": ident, **await send(messages, fields)}]
            else:
                turns = await run_conversation(send, ident, messages, fields or {}, plan)
                records[index] = [{"index": index, **turn} for turn in turns]

    try:
        await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(prompts))))))
    finally:
        await client.close()
    done = [r for group in records for r in group]
    wall = (max(r["end"] for r in done) - min(r["sent"] for r in done)) if done else 0.0
    return done, wall


def warm_up(spec: Client, concurrency: int, max_tokens: int) -> tuple[float, list[str]]:
    """``concurrency`` requests at once on WARMUP_PROMPT, request i asking for WARMUP_STEP * (i + 1) tokens
    (at most max_tokens), so the batch shrinks one by one; (seconds, the errors)."""
    prompts = [(f"warm-up-{i}", [{"role": "user", "content": WARMUP_PROMPT}]) for i in range(concurrency)]
    lengths = [min(max_tokens, WARMUP_STEP * (i + 1)) for i in range(concurrency)]
    started = time.perf_counter()
    records, _ = asyncio.run(replay(spec, prompts, concurrency, lengths))
    return time.perf_counter() - started, [r["error"] for r in records if r.get("error")]


# ---------------------------------------------------------------- the bench

@dataclass
class Settings:
    """What one bench-serve run measures and how."""

    model: str  # the name lookahead serve loads (alias, directory, ...)
    model_dir: str  # the same model as a local directory (transformers serve's argument)
    datasets: dict[str, list[tuple[Any, ...]]]  # name -> (prompt id, chat messages[, request fields]), in order
    servers: Sequence[str] = SERVERS
    concurrency: Sequence[int] = (1, 4)
    max_tokens: int = 96
    limit: int = 16
    threads: int = 1
    startup_timeout: float = 600.0
    request_timeout: float = 600.0
    lookahead_args: Sequence[str] = ()
    count_tokens: Callable[[str], int] | None = None
    llama: LlamaServer | None = None  # llama.cpp's server, for the server "llama.cpp"
    rounds: int = 1  # every server's runs this many times, the servers' order reversed each round (run_bench)


def server_env(threads: int) -> dict[str, str]:
    """The environment every server runs in: this one, with torch's (OpenMP's, MKL's) threads set."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
                "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"})
    return env


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def round_order(servers: Sequence[str], rounds: int) -> list[tuple[int, str]]:
    """(round, server) in the order they run: the servers in order, then reversed, and so on, so that a machine
    slowing down or speeding up over the measurement weighs on every server alike.

    ["a", "b"], 3 rounds -> [(0, a), (0, b), (1, b), (1, a), (2, a), (2, b)].
    """
    return [(r, name) for r in range(rounds) for name in (servers if r % 2 == 0 else list(reversed(servers)))]


def run_bench(settings: Settings, out_dir: str | Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every server, data set and concurrency level, a fresh server each, ``settings.rounds`` times
    (``round_order``); the results (see write_report). ServerStartError / RunError where a lookahead server
    cannot be measured; transformers is retried without --continuous-batching when it fails with it."""
    log_dir = Path(out_dir) / "logs"
    env = server_env(settings.threads)
    max_batch = max(settings.concurrency)
    servers: dict[str, dict[str, Any]] = {name: {"commands": []} for name in settings.servers}
    continuous_batching: bool | None = True if "transformers" in settings.servers else None
    runs: list[dict[str, Any]] = []
    started = _now()
    try:
        for round_, name in round_order(settings.servers, settings.rounds):
            for dataset, prompts in settings.datasets.items():
                for concurrency in settings.concurrency:
                    label = f"{name}-{dataset}-c{concurrency}" + (f"-r{round_}" if settings.rounds > 1 else "")
                    while True:
                        cb = bool(continuous_batching) and concurrency > 1
                        try:
                            run = _one_run(name, dataset, prompts, concurrency, settings, max_batch, cb, env,
                                           log_dir, label, log, servers[name])
                        except BenchServeError as exc:
                            if name == "transformers" and cb:  # once more, without continuous batching
                                log(f"[bench-serve] transformers serve --continuous-batching failed here ({exc}); "
                                    f"running it without")
                                continuous_batching = False
                                servers[name]["continuous_batching_error"] = str(exc)
                                continue
                            raise
                        break
                    run["round"] = round_
                    if name == "transformers":
                        run["continuous_batching"] = cb
                        servers[name]["continuous_batching"] = cb or bool(servers[name].get("continuous_batching"))
                        at = servers[name].setdefault("continuous_batching_at", [])
                        if cb and concurrency not in at:
                            at.append(concurrency)
                    runs.append(run)
    except BenchServeError as exc:
        exc.results = _results(settings, max_batch, started, servers, runs) if runs else None
        raise
    return _results(settings, max_batch, started, servers, runs)


def _results(settings: Settings, max_batch: int, started: str, servers: dict[str, dict[str, Any]],
             runs: list[dict[str, Any]]) -> dict[str, Any]:
    """What write_report writes: the settings and machine (meta), the servers' command lines, the runs, the ratios."""
    from lookahead.benchmarks.report import environment

    return {"meta": {"environment": environment(), "model": settings.model, "model_dir": settings.model_dir,
                     "datasets": list(settings.datasets),
                     "limit": settings.limit, "max_tokens": settings.max_tokens,
                     "concurrency": list(settings.concurrency), "threads": settings.threads, "max_batch": max_batch,
                     "servers": list(settings.servers), "rounds": settings.rounds,
                     "plain_options": list(PLAIN_OPTIONS),
                     "llama": None if settings.llama is None else {"binary": settings.llama.binary,
                                                                   "gguf": settings.llama.gguf,
                                                                   "args": list(settings.llama.args)},
                     "warmup": {"prompt": WARMUP_PROMPT, "step": WARMUP_STEP}, "started": started,
                     "finished": _now()},
            "servers": servers, "runs": runs, "ratios": ratio_rows(runs)}


def _one_run(name: str, dataset: str, prompts: list[tuple[Any, ...]], concurrency: int,
             settings: Settings, max_batch: int, cb: bool, env: dict[str, str], log_dir: Path, label: str,
             log: Callable[[str], None], server_info: dict[str, Any]) -> dict[str, Any]:
    """Start server ``name``, warm it up, replay the prompts with ``concurrency`` clients, stop it."""
    port = free_port()
    command = server_command(name, settings.model, settings.model_dir, port, max_batch, cb, settings.lookahead_args,
                             llama=settings.llama, threads=settings.threads)
    server_info["commands"].append(command)
    server = ServerProcess(name, command, port, log_dir, env, label)
    lookahead = name in ("lookahead", "lookahead-plain")  # (the servers with lookahead's /metrics)
    anchor = name == "transformers"  # (serves its model directory; sends the usage unasked, refuses asking)
    spec = Client(server.base, settings.model_dir if anchor else settings.model, stream_usage=not anchor,
                  count_tokens=settings.count_tokens, timeout=settings.request_timeout)
    log(f"[bench-serve] {label}: starting {shlex.join(command)}")
    try:
        startup_s = server.start(settings.startup_timeout)
        warmup_s, errors = warm_up(spec, concurrency, settings.max_tokens)
        if errors or not server.alive():
            raise RunError(f"server {name}'s warm-up requests failed ({errors[0] if errors else 'it exited'}); "
                           f"its last stderr lines: {server.stderr_tail()}")
        before = server.metrics() if lookahead else None
        log(f"[bench-serve] {label}: up in {startup_s:.1f} s, warmed up in {warmup_s:.1f} s; "
            f"{len(prompts)} requests")
        records, wall = asyncio.run(replay(spec, prompts, concurrency, settings.max_tokens))
        after = server.metrics() if lookahead else None
    finally:
        server.stop()
    run = {"server": name, "dataset": dataset, "concurrency": concurrency, "command": command,
           "startup_s": startup_s, "warmup_s": warmup_s, **summarize_run(records, wall),
           "tokens_per_forward": tokens_per_forward(before, after), "step_parts": step_parts(before, after),
           "metrics_before": before, "metrics_after": after, "unsupported": refusal(records),
           "prediction": prediction_summary(prompts, records), "agent": agent_summary(prompts, records),
           "records": records}
    log(f"[bench-serve] {label}: {run['throughput_tok_s']:.1f} tokens/s, {run['requests_per_s']:.2f} requests/s"
        + (f", {run['errors']} failed (first: {next(r['error'] for r in records if r.get('error'))})"
           if run["errors"] else ""))
    return run


def refusal(records: list[dict[str, Any]]) -> str | None:
    """The first error when the server refused every request with an HTTP error status (a request kind it does
    not take: 400, 422, llama.cpp's 501 "not supported" and the 500 it answers for some), other than busy (429,
    503); None when it answered any, or failed without an answer (a connection lost, a timeout)."""
    refused = [r for r in records if r.get("error") is not None and isinstance(r.get("status"), int)
               and 400 <= r["status"] < 600 and r["status"] not in (429, 503)]
    return str(refused[0]["error"]) if records and len(refused) == len(records) else None


def prediction_summary(prompts: Sequence[tuple[Any, ...]], records: list[dict[str, Any]]) -> dict[str, int] | None:
    """Where the prompts carried a prediction: how many requests did, how many answers reported prediction
    tokens, and the accepted and rejected tokens they reported; None where none carried one."""
    carried = sum(1 for p in prompts if len(p) > 2 and isinstance(p[2], dict) and "prediction" in p[2])
    if not carried:
        return None
    counts = [r["prediction_tokens"] for r in records if r.get("prediction_tokens")]
    return {"requests": carried, "reported": len(counts), "accepted": sum(c["accepted"] for c in counts),
            "rejected": sum(c["rejected"] for c in counts)}


def agent_summary(prompts: Sequence[tuple[Any, ...]], records: list[dict[str, Any]]) -> dict[str, int] | None:
    """Where the prompts are conversations: how many, the turns sent, the turns that called a tool, the calls
    run; None otherwise."""
    conversations = sum(1 for p in prompts if len(p) > 3 and p[3] is not None)
    if not conversations:
        return None
    return {"conversations": conversations, "turns": len(records),
            "turns_with_calls": sum(1 for r in records if r.get("tool_calls")),
            "calls_run": sum(len(r.get("tool_results") or ()) for r in records)}
