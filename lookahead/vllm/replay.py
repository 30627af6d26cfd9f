"""vLLM's chain verification replayed without vLLM: lookahead's proposer against SuffixDecoding on
known greedy answers, in seconds instead of an engine run per setting.

``lookahead bench-vllm`` measures proposers inside vLLM, ten minutes a run, its figures moving by
about 5% from one run to the next. What a proposer does there follows from what it drafts, though:
vLLM asks it for up to k tokens after each step, accepts the longest prefix that agrees with its
greedy answer, and adds one token of its own. So, given each request's greedy answer (here
``model.generate``'s, exact through lookahead's generator; vLLM's own text equals it up to float
noise), one request at a time in order:

1. the prefill gives the answer's first token (a step);
2. the proposer is asked as vLLM asks it (the request's tokens so far, what the last step accepted);
3. its draft is checked against the answer: a accepted tokens and one more advance the request (a
   step; every draft token costs its row, also past the answer's end, as vLLM verifies a draft whole and
   drops what follows max_tokens); repeat from 2 until the answer is out.

Counted per request: steps, draft tokens, accepted tokens. Time is modelled from vLLM's own cost,
``step_ms`` a verification step and ``draft_ms`` a draft token (what ``bench-vllm``'s totals give by
least squares: ``lookahead bench-vllm`` measures them), and lookahead's proposer reads that modelled clock, so
its "auto" cut learns the row cost it would learn inside vLLM. The report gives each proposer's counts,
its modelled tokens/s over all requests and over the second half, and the **oracle** of the two:
at every step, with hindsight, the draft accepted furthest (how far choosing between them could go).

Worked example: answer [5 6 7 8] (prompt [5 6]), k 2, a proposer that drafts [7 8] after [5 6 5 6]:
step 1 gives 5; the proposer drafts nothing after [5 6 5] (step 2 gives 6); after [5 6 5 6] it drafts
[7 8], both accepted (step 3 ends the answer): 3 steps, 2 draft tokens, 2 accepted; at 20 ms a step
and 5 a draft token, 4 tokens in 70 ms, 57.1 tokens/s.

Run: ``python -m lookahead.cli.replay_vllm --dataset tool-calls`` (the command: cli/replay_vllm.py;
SuffixDecoding is built from arctic-inference's source once, as ``lookahead bench-memory --anchor``
builds it; ``--no-suffix`` skips it). ``--log steps.jsonl`` writes lookahead's lane step by step
(``step_record``): its draft, what was accepted, the answer's next k tokens and every source's
candidate rows with their classes, the data for studying which candidate a chain should have followed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import IO, Any, Protocol

import click
import numpy as np

# vLLM's suffix method as vLLM 0.32 drives arctic-inference's cache (its SpeculativeConfig defaults)
SUFFIX_DEPTH, SUFFIX_CACHED, SUFFIX_FACTOR, SUFFIX_MIN_PROB = 24, 10000, 1.0, 0.1
MAX_LEN = 4096  # the replayed engine's max_model_len


class Driver(Protocol):
    """A proposer asked as vLLM asks it, one request at a time."""

    def propose(self, request: int, prompt: np.ndarray, done: np.ndarray, sampled: list[int], k: int) -> list[int]:
        """Up to k draft tokens after prompt + done (the answer so far), ``sampled`` its last step's tokens."""
        ...

    def advance(self, seconds: float) -> None:
        """The modelled time moved on by ``seconds`` (the step just verified)."""
        ...

    def close(self) -> None:
        """The last request has ended."""
        ...


@dataclass
class Count:
    """One request's replay."""

    tokens: int  # the answer's length
    steps: int = 0  # verification steps, the prefill's included
    drafts: int = 0  # draft tokens proposed
    accepted: int = 0  # of them accepted


def accepted_prefix(draft: Sequence[int], answer: np.ndarray, at: int) -> int:
    """How many of ``draft`` agree with answer[at:], from the first on."""
    count = 0
    for token in draft:
        if at + count >= answer.shape[0] or int(answer[at + count]) != int(token):
            break
        count += 1
    return count


def replay(answers: list[tuple[np.ndarray, np.ndarray]], drivers: list[Driver], k: int, step_ms: float,
           draft_ms: float, log: Callable[[dict[str, Any]], None] | None = None) -> list[Count]:
    """The counts per request of one replay, each (prompt, answer) in order. One driver: its own drafts.
    Several (fresh ones, not shared with another replay): the oracle, at every step the draft accepted
    furthest (the shorter on a tie), every driver asked and told what was accepted, as vLLM would tell
    the one proposer it runs. ``log`` gets one record a step (``step_record``)."""
    counts: list[Count] = []
    for request, (prompt, answer) in enumerate(answers):
        count = Count(int(answer.shape[0]), steps=1)  # the prefill's step gives the first token
        counts.append(count)
        at, sampled = 1, [int(answer[0])]
        while at < answer.shape[0]:
            drafts = [list(d.propose(request, prompt, answer[:at], sampled, k)) for d in drivers]  # (each row paid
            # for, past the answer's end too: vLLM verifies a draft whole and drops what follows max_tokens)
            kept = [accepted_prefix(draft, answer, at) for draft in drafts]
            if log is not None:
                log(step_record(request, at, answer[at:at + k], drivers, drafts, kept))
            best = max(range(len(drivers)), key=lambda i: (kept[i], -len(drafts[i])))
            count.steps += 1
            count.drafts += len(drafts[best])
            count.accepted += kept[best]
            for d in drivers:
                d.advance((step_ms + draft_ms * len(drafts[best])) / 1000.0)
            sampled = [int(t) for t in answer[at:at + kept[best] + 1]]
            at += kept[best] + 1
    for d in drivers:
        d.close()
    return counts


def step_record(request: int, at: int, truth: np.ndarray, drivers: Sequence[Driver], drafts: list[list[int]],
                kept: list[int]) -> dict[str, Any]:
    """One step of a replay as data for studying how a proposer chooses: the request, the answer's position
    and its next tokens (what a perfect draft would be), and per driver its draft, how much of it was
    accepted and, for a driver that keeps them (``LookaheadDriver(offered=True)``), every source's candidate
    rows with their classes. Request 0 at 3, truth [7 8], a draft [7 9] -> accepted 1."""
    lanes = []
    for driver, draft, accepted in zip(drivers, drafts, kept):
        offered = getattr(driver, "offered", None)
        lanes.append({"draft": [int(t) for t in draft], "accepted": accepted,
                      "offered": offered() if callable(offered) else None})
    return {"request": request, "at": at, "truth": [int(t) for t in truth], "drivers": lanes}


def summary(counts: list[Count], step_ms: float, draft_ms: float) -> dict[str, Any]:
    """Totals of a lane's requests, and its modelled tokens/s over all of them and over the second half."""

    def rate(part: list[Count]) -> float:
        seconds = sum(c.steps * step_ms + c.drafts * draft_ms for c in part) / 1000.0
        return sum(c.tokens for c in part) / seconds if seconds > 0 else math.nan

    steps, drafts, accepted = (sum(getattr(c, f) for c in counts) for f in ("steps", "drafts", "accepted"))
    tokens = sum(c.tokens for c in counts)
    return {"tokens": tokens, "steps": steps, "drafts": drafts, "accepted": accepted,
            "accepted_per_draft": accepted / drafts if drafts else None, "tokens_per_step": tokens / steps,
            "tokens_per_s": rate(counts), "second_half_tokens_per_s": rate(counts[len(counts) // 2:])}


class LookaheadDriver:
    """``LookaheadProposer`` as vLLM drives it (one row; the engine's config as attributes), reading the
    replay's modelled clock."""

    def __init__(self, vocab: int, settings: dict[str, Any], k: int, offered: bool = False):
        """``offered``: keep each step's candidate rows for ``offered()`` (the replay's log)."""
        from .proposer import LookaheadProposer

        model = SimpleNamespace(max_model_len=MAX_LEN, get_vocab_size=lambda: vocab, tokenizer=None,
                                trust_remote_code=False)
        config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k), model_config=model,
                                 additional_config={"lookahead": settings})
        self.proposer = LookaheadProposer(config)
        self.seconds = 0.0
        self.proposer.now = lambda: self.seconds
        self.row = np.zeros((1, MAX_LEN), dtype=np.int64)
        if offered:
            self.proposer.offered = []

    def offered(self) -> list[dict[str, Any]] | None:
        """The last step's candidate rows, source by source in the order they were asked (None: not kept)."""
        if self.proposer.offered is None:
            return None
        rows = []
        for name, found in (self.proposer.offered[0] if self.proposer.offered else []):
            for g in range(found.count):
                length = int(found.lens[g])
                rows.append({"source": name, "tokens": [int(t) for t in found.tokens[g, :length]],
                             "classes": [int(c) for c in found.classes[g, :length]]})
        return rows

    def propose(self, request: int, prompt: np.ndarray, done: np.ndarray, sampled: list[int], k: int) -> list[int]:
        length = prompt.shape[0] + done.shape[0]
        self.row[0, :prompt.shape[0]] = prompt
        self.row[0, prompt.shape[0]:length] = done
        return self.proposer.propose([sampled], np.array([length]), self.row)[0]

    def advance(self, seconds: float) -> None:
        self.seconds += seconds

    def close(self) -> None:
        self.proposer.close()


class SuffixDriver:
    """arctic-inference's ``SuffixDecodingCache`` as vLLM's suffix method drives it: a request starts with
    its prompt, each step's tokens are added to its response, the pattern is the last SUFFIX_DEPTH tokens,
    and a request is stopped when the next one arrives."""

    def __init__(self, cache_class: Any):
        self.cache = cache_class(max_tree_depth=SUFFIX_DEPTH, max_cached_requests=SUFFIX_CACHED)
        self.active: int | None = None

    def propose(self, request: int, prompt: np.ndarray, done: np.ndarray, sampled: list[int], k: int) -> list[int]:
        if self.active is not None and self.active != request:
            self.cache.stop_request(self.active)
            self.active = None
        if self.active is None:
            self.cache.start_request(request, prompt.astype(np.int32))
            self.active = request
        self.cache.add_active_response(request, sampled)
        pattern = np.concatenate([prompt, done])[-SUFFIX_DEPTH:].astype(np.int32)
        draft = self.cache.speculate(request, pattern, max_spec_tokens=k, max_spec_factor=SUFFIX_FACTOR,
                                     min_token_prob=SUFFIX_MIN_PROB)
        return [int(t) for t in draft.token_ids]

    def advance(self, seconds: float) -> None:
        """SuffixDecoding reads no clock."""

    def close(self) -> None:
        if self.active is not None:
            self.cache.stop_request(self.active)
            self.active = None


def greedy_answers(model: Any, tokenizer: Any, prompts: list[list[dict[str, Any]]], max_tokens: int,
                   log: Callable[[str], None]) -> list[tuple[np.ndarray, np.ndarray]]:
    """(prompt ids, greedy answer ids) per chat prompt, rendered with the model's chat template and
    decoded by lookahead's generator (model.generate's greedy text)."""
    import torch

    from lookahead import LookaheadGenerator

    generator = LookaheadGenerator(model, tokenizer)
    answers = []
    for i, messages in enumerate(prompts):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        prompt = np.asarray(ids, dtype=np.int64)
        out = generator.generate(torch.from_numpy(prompt)[None], max_new_tokens=max_tokens)
        answers.append((prompt, out[0, prompt.shape[0]:].numpy().astype(np.int64)))
        log(f"answer {i + 1}/{len(prompts)}: {answers[-1][1].shape[0]} tokens")
    return answers


def markdown(report: dict[str, Any]) -> str:
    """One table per data set: each proposer's counts and modelled tokens/s, then the oracle."""
    meta = report["meta"]
    lines = [f"# vLLM replay: {meta['model']}, k {meta['k']}, max_tokens {meta['max_tokens']}", "",
             f"Modelled time: {meta['step_ms']} ms a step + {meta['draft_ms']} ms a draft token (one request at a "
             "time). Not measured inside vLLM: counts of what each proposer's drafts would have had accepted.", ""]
    for name, lanes in report["datasets"].items():
        lines += [f"## {name}", "", "| proposer | steps | draft tokens | accepted | accepted / draft | tokens / step "
                  "| modelled tokens/s | 2nd half |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for lane, s in lanes.items():
            per_draft = "-" if s["accepted_per_draft"] is None else f"{s['accepted_per_draft']:.2f}"
            lines.append(f"| {lane} | {s['steps']} | {s['drafts']} | {s['accepted']} | {per_draft} | "
                         f"{s['tokens_per_step']:.2f} | {s['tokens_per_s']:.1f} | "
                         f"{s['second_half_tokens_per_s']:.1f} |")
        lines.append("")
    if meta["skipped"]:
        lines.append(f"suffix: skipped ({meta['skipped']})")
    return "\n".join(lines)


def replay_all(model_name: str, chats: dict[str, list[list[dict[str, Any]]]], max_tokens: int, k: int,
               step_ms: float, draft_ms: float, settings: dict[str, Any], cache_class: Any, skipped: str | None,
               log_file: IO[str] | None) -> dict[str, Any]:
    """Every data set's lanes replayed on the model's greedy answers: the report ``markdown`` prints. With
    ``log_file``, lookahead's lane writes one JSON line a step (``step_record`` and the data set's name)."""
    import torch

    from lookahead import load_model

    model, tokenizer = load_model(model_name, dtype=torch.float32)
    vocab = len(tokenizer)
    report: dict[str, Any] = {"meta": {"model": model_name, "k": k, "max_tokens": max_tokens, "step_ms": step_ms,
                                       "draft_ms": draft_ms, "lookahead_settings": settings, "skipped": skipped},
                              "datasets": {}}
    for name, prompts in chats.items():
        answers = greedy_answers(model, tokenizer, prompts, max_tokens, lambda line: click.echo(line, err=True))
        lanes: dict[str, Callable[[], list[Driver]]] = {
            "lookahead": lambda: [LookaheadDriver(vocab, settings, k, offered=log_file is not None)]}
        if cache_class is not None:
            lanes["suffix"] = lambda: [SuffixDriver(cache_class)]
            lanes["oracle (the better draft each step)"] = lambda: [LookaheadDriver(vocab, settings, k),
                                                                    SuffixDriver(cache_class)]
        write = None
        if log_file is not None:
            def write(record: dict[str, Any], name: str = name) -> None:
                assert log_file is not None
                log_file.write(json.dumps({"dataset": name, **record}) + "\n")
        report["datasets"][name] = {
            lane: summary(replay(answers, make(), k, step_ms, draft_ms, write if lane == "lookahead" else None),
                          step_ms, draft_ms)
            for lane, make in lanes.items()}
    return report
