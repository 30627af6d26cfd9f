"""lookahead/vllm/replay.py (and its command, cli/replay_vllm.py): vLLM's chain verification replayed on
known answers, without vLLM."""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from lookahead.benchmarks import suffix_anchor
from lookahead.cli.replay_vllm import main
from lookahead.vllm.replay import LookaheadDriver, SuffixDriver, accepted_prefix, replay, summary


def a(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


class Scripted:
    """Drafts what ``script`` maps the tokens so far (prompt + done) to; records the modelled time."""

    def __init__(self, script):
        self.script = script
        self.seconds = 0.0
        self.closed = False

    def propose(self, request, prompt, done, sampled, k):
        return list(self.script(np.concatenate([prompt, done]), k))

    def advance(self, seconds):
        self.seconds += seconds

    def close(self):
        self.closed = True


def perfect(answers):
    """Drafts the next k tokens of the answer whose prompt and start the tokens are."""
    def script(tokens, k):
        for prompt, answer in answers:
            whole = np.concatenate([prompt, answer])
            if whole.shape[0] >= tokens.shape[0] and np.array_equal(whole[:tokens.shape[0]], tokens):
                return whole[tokens.shape[0]:tokens.shape[0] + k].tolist()
        return []
    return Scripted(script)


def test_accepted_prefix_counts_agreement_from_the_first_token():
    assert accepted_prefix([7, 8, 9], a(5, 7, 8, 1), 1) == 2
    assert accepted_prefix([6], a(5, 7), 1) == 0 and accepted_prefix([], a(5, 7), 1) == 0
    assert accepted_prefix([7, 8], a(5, 7), 1) == 1  # past the answer's end: not accepted


def test_the_docstring_example():
    answers = [(a(5, 6), a(5, 6, 7, 8))]
    driver = Scripted(lambda tokens, k: [7, 8] if tokens.tolist() == [5, 6, 5, 6] else [])
    counts = replay(answers, [driver], 2, 20.0, 5.0)
    assert (counts[0].steps, counts[0].drafts, counts[0].accepted) == (3, 2, 2)
    assert np.isclose(summary(counts, 20.0, 5.0)["tokens_per_s"], 4 / 0.070)
    assert driver.closed and np.isclose(driver.seconds, 0.020 + 0.030)  # the two verifying steps, modelled


def test_a_perfect_proposer_and_one_that_drafts_nothing():
    answers = [(a(1, 2), np.arange(10, 20)), (a(3), np.arange(30, 37))]
    counts = replay(answers, [perfect(answers)], 3, 10.0, 1.0)
    # 10 tokens: the prefill's, then 3 + 1, 3 + 1, and the last one drafted and accepted (the answer ends)
    assert [(c.steps, c.drafts, c.accepted) for c in counts] == [(4, 7, 7), (3, 5, 5)]
    nothing = replay(answers, [Scripted(lambda tokens, k: [])], 3, 10.0, 1.0)
    assert [(c.steps, c.drafts, c.accepted) for c in nothing] == [(10, 0, 0), (7, 0, 0)]
    report = summary(counts, 10.0, 1.0)
    assert report["tokens"] == 17 and report["steps"] == 7 and report["accepted_per_draft"] == 1.0
    assert np.isclose(report["second_half_tokens_per_s"], 7 / (3 * 0.010 + 5 * 0.001))


def test_the_oracle_follows_the_draft_accepted_furthest_and_tells_every_driver():
    answers = [(a(1, 2), np.arange(10, 20))]
    good, nothing = perfect(answers), Scripted(lambda tokens, k: [])
    oracle = replay(answers, [nothing, good], 3, 10.0, 1.0)
    assert (oracle[0].steps, oracle[0].accepted) == (4, 7)  # the perfect drafts, whichever driver comes first
    assert np.isclose(nothing.seconds, good.seconds) and nothing.closed and good.closed
    wrong = Scripted(lambda tokens, k: [99] * k)  # as long as the good one's, never accepted
    tie = replay(answers, [wrong, Scripted(lambda tokens, k: [])], 3, 10.0, 1.0)
    assert tie[0].drafts == 0  # nothing accepted either way: the shorter draft, which costs no rows


def test_lookaheads_proposer_copies_a_repeated_answer_and_learns_the_modelled_row_cost():
    motif = list(range(40, 52))
    prompt = np.array(motif * 2, dtype=np.int64)
    answers = [(prompt, np.array(motif * 6, dtype=np.int64)) for _ in range(3)]
    fixed = replay(answers, [LookaheadDriver(vocab=64, settings={"least_accept": 0.3}, k=4)], 4, 20.0, 5.0)
    assert sum(c.accepted for c in fixed) > 0.8 * sum(c.drafts for c in fixed) > 0  # the copy holds
    # each step gives its accepted tokens and one more (the last step's own may fall past the answer's end)
    assert all(c.steps + c.accepted - c.tokens in (0, 1) for c in fixed)
    rng = np.random.default_rng(0)  # text that repeats in part: chains of every length, rows that vary
    mixed = [(rng.integers(40, 46, 30), np.concatenate([np.array(motif[:5 + i]), rng.integers(40, 46, 40)]))
             for i in range(6)]
    auto = LookaheadDriver(vocab=64, settings={}, k=4)  # "auto": the step clock reads the replay's time
    replay(mixed, [auto], 4, 20.0, 5.0)
    slope = auto.proposer.clock.slope()
    assert slope is not None and np.isclose(slope, 0.005, rtol=0.05)  # 5 ms a draft token's row


def _cached_suffix_class():
    """arctic-inference's cache where an earlier benchmark built it (never built here: minutes of C++)."""
    where = str(suffix_anchor.build_dir())
    if where not in sys.path:
        sys.path.insert(0, where)
    try:
        return importlib.import_module("arctic_inference.suffix_decoding").SuffixDecodingCache
    except ImportError:
        return None


def test_suffix_driver_drives_arctics_cache_as_vllm_does():
    cache_class = _cached_suffix_class()
    if cache_class is None:
        pytest.skip("arctic-inference's SuffixDecoding is not built on this machine (lookahead bench-memory "
                    "--anchor builds it)")
    motif = list(range(40, 52))
    answers = [(np.array(motif * 2, dtype=np.int64), np.array(motif * 4, dtype=np.int64)) for _ in range(3)]
    counts = replay(answers, [SuffixDriver(cache_class)], 4, 20.0, 5.0)
    assert sum(c.accepted for c in counts) > 0 and all(c.steps + c.accepted - c.tokens in (0, 1) for c in counts)


def test_cli_refuses_bad_settings_and_completion_data_sets_before_loading_a_model():
    runner = CliRunner()
    result = runner.invoke(main, ["--no-suffix", "--lookahead-settings", '{"bogus": 1}'])
    assert result.exit_code == 2 and "'bogus' is no setting" in result.output
    result = runner.invoke(main, ["--no-suffix", "--dataset", "humaneval", "--limit", "1"])
    assert result.exit_code == 2 and "completion prompts" in result.output


def test_the_step_log_holds_each_draft_its_truth_and_the_sources_rows():
    """--log's records: one a step, the truth being the answer's next k tokens, the draft's accepted prefix
    counted against it, and the candidate rows of every source lookahead's proposer asked."""
    motif = list(range(40, 52))
    answers = [(np.array(motif * 2, dtype=np.int64), np.array(motif * 3, dtype=np.int64)) for _ in range(2)]
    records = []
    counts = replay(answers, [LookaheadDriver(vocab=64, settings={"least_accept": 0.3}, k=4, offered=True)], 4,
                    20.0, 5.0, records.append)
    assert len(records) == sum(c.steps - 1 for c in counts)  # every step after the prefill's
    for record in records:
        prompt, answer = answers[record["request"]]
        assert record["truth"] == answer[record["at"]:record["at"] + 4].tolist()
        lane = record["drivers"][0]
        assert lane["accepted"] == accepted_prefix(lane["draft"], answer, record["at"])
        assert all(len(row["tokens"]) == len(row["classes"]) > 0 for row in lane["offered"])
    sources = {row["source"] for record in records for row in record["drivers"][0]["offered"]}
    assert "context" in sources  # the motif repeats in the prompt: the context matcher offers its copy
    # a drafted chain starts with a token some source offered first
    drafted = [r for r in records if r["drivers"][0]["draft"]]
    assert drafted and all(any(row["tokens"][0] == r["drivers"][0]["draft"][0] for row in r["drivers"][0]["offered"])
                           for r in drafted)
    quiet = LookaheadDriver(vocab=64, settings={}, k=4)  # not asked to keep them: nothing kept
    replay(answers[:1], [quiet], 4, 20.0, 5.0)
    assert quiet.offered() is None and quiet.proposer.offered is None


def test_cli_refuses_a_log_it_cannot_write_before_loading_a_model(tmp_path):
    result = CliRunner().invoke(main, ["--no-suffix", "--log", str(tmp_path / "missing" / "steps.jsonl")])
    assert result.exit_code == 2 and "--log" in result.output and "existing, writable directory" in result.output
