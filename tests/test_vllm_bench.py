"""bench-vllm's schedules and summary (benchmarks/vllm_bench.py) without vLLM: an engine stand-in
that finishes each request after a given number of steps, so that who is in flight when is known.

vLLM itself runs the bench in its own environment (README, "vLLM"); this checks the bookkeeping that
turns its outputs into records and rates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from lookahead.benchmarks import vllm_bench
from lookahead.benchmarks.vllm_bench import Settings, _closed, _waves, markdown, summarize


@dataclass
class FakeLLM:
    """Requests finish after ``steps[prompt]`` engine steps with that many tokens; a counter of drafted
    tokens grows by one per running request and step."""

    steps: dict[str, int]
    running: dict[str, list] = field(default_factory=dict)  # request id -> [prompt, steps left]
    flight: list[int] = field(default_factory=list)  # requests running at each step
    drafted: float = 0.0
    made: int = 0

    @property
    def llm_engine(self) -> FakeLLM:
        return self

    def enqueue_chat(self, conversations, params, use_tqdm=False):
        ids = []
        for messages in conversations:
            ident = str(self.made)
            self.made += 1
            prompt = messages[0]["content"]
            self.running[ident] = [prompt, self.steps[prompt]]
            ids.append(ident)
        return ids

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def step(self):
        self.flight.append(len(self.running))
        out = []
        for ident, entry in list(self.running.items()):
            entry[1] -= 1
            self.drafted += 1
            if entry[1] == 0:
                del self.running[ident]
                tokens = list(range(self.steps[entry[0]]))
                out.append(SimpleNamespace(request_id=ident, finished=True,
                                           outputs=[SimpleNamespace(token_ids=tokens)]))
        return out

    def chat(self, conversations, params, use_tqdm=False):
        ids = self.enqueue_chat(conversations, params)
        done = {}
        while self.running:
            for o in self.step():
                done[o.request_id] = o
        return [done[i] for i in ids]

    def get_metrics(self):
        return [SimpleNamespace(name="vllm:spec_decode_num_draft_tokens", value=self.drafted)]


PROMPTS = [(f"p{i}", [{"role": "user", "content": f"q{i}"}]) for i in range(5)]
STEPS = {"q0": 3, "q1": 1, "q2": 2, "q3": 4, "q4": 1}


def test_closed_keeps_level_in_flight_and_joins_in_order():
    llm = FakeLLM(dict(STEPS))
    records, texts = _closed(llm, PROMPTS, None, 2)
    # q0 (3 steps) and q1 (1) start; q1 ends at step 1 and q2 joins; q0 and q2 end at step 3, q3 and q4
    # join; q4 ends at step 4, q3 at step 7.
    assert llm.flight == [2, 2, 2, 2, 1, 1, 1]
    assert texts == {f"p{i}": list(range(STEPS[f"q{i}"])) for i in range(5)}
    # a record per request, in the order the engine reports them (q0 and q2 in one step), the second of a
    # step's records with no time or counts of its own
    assert [r["tokens"] for r in records] == [1, 3, 2, 1, 4]
    assert sorted(r["tokens"] for r in records) == sorted(STEPS.values())
    assert records[2]["seconds"] == 0.0 and records[2]["draft_tokens"] == 0.0
    assert sum(r["draft_tokens"] for r in records) == sum(llm.flight)
    assert all(r["seconds"] >= 0 for r in records)


def test_closed_halves_split_the_requests_when_they_finish_together():
    """Four equal requests two at a time finish in pairs: four records, the second half two requests."""
    prompts = PROMPTS[:4]
    records, _ = _closed(FakeLLM({f"q{i}": 2 for i in range(4)}), prompts, None, 2)
    assert [r["tokens"] for r in records] == [2, 2, 2, 2]
    assert [r["seconds"] > 0 for r in records] == [True, False, True, False]
    assert sum(r["tokens"] for r in records[len(records) // 2:]) == 4  # summarize's second half: the last pair


def test_waves_wait_for_the_slowest_request():
    llm = FakeLLM(dict(STEPS))
    records, texts = _waves(llm, PROMPTS, None, 2)
    assert llm.flight == [2, 1, 1, 2, 2, 1, 1, 1]  # wave (q0, q1): 3 steps; (q2, q3): 4; (q4): 1
    assert [r["tokens"] for r in records] == [4, 6, 1]
    assert len(texts) == 5


def test_one_in_flight_is_one_request_after_another_on_both_schedules():
    closed, _ = _closed(FakeLLM(dict(STEPS)), PROMPTS, None, 1)
    waves, _ = _waves(FakeLLM(dict(STEPS)), PROMPTS, None, 1)
    assert [r["tokens"] for r in closed] == [r["tokens"] for r in waves] == [3, 1, 2, 4, 1]


def test_summary_second_half_is_its_records_tokens_over_their_seconds():
    records = [{"tokens": 10, "seconds": 1.0, "drafts": 2, "draft_tokens": 6, "accepted": 3},
               {"tokens": 30, "seconds": 1.0, "drafts": 2, "draft_tokens": 6, "accepted": 1},
               {"tokens": 20, "seconds": 0.5, "drafts": 0, "draft_tokens": 0, "accepted": 0}]
    got = summarize(records)
    assert got["tokens_per_s"] == pytest.approx(60 / 2.5)
    assert got["second_half_tokens_per_s"] == pytest.approx(50 / 1.5)
    assert got["mean_accepted_length"] == pytest.approx(1 + 4 / 4)


def test_unknown_schedule_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="closed, waves"):
        Settings("m", {}, ("none",), (1,), 8, 4, "float32", {}, "bursts")


def test_report_says_which_schedule_ran():
    data = {"meta": {"model": "m", "dtype": "float32", "vllm": "x", "cpu": "c", "k": 4, "max_tokens": 8,
                     "ngram_range": [2, 4], "skipped": {}, "datasets": {"d": 5}, "schedule": "closed"},
            "runs": []}
    assert "in flight, the next joining" in markdown(data)
    data["meta"]["schedule"] = "waves"
    assert "in waves of" in markdown(data)
    assert vllm_bench.SCHEDULES == ("closed", "waves")
