"""lookahead's vLLM proposer driven as vLLM drives it, without vLLM: its chain, its requests told apart
by their tokens, its settings, and whole steps of a batch whose rows change hands.

vLLM itself runs in its own environment (tests_vllm/, built by .ci/run)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from lookahead.config import LookaheadConfig
from lookahead.decode.sources import SourceFactory
from lookahead.errors import ConfigError, MemoryFileError
from lookahead.plan.acceptance import AcceptanceStats
from lookahead.plan.chain import best_chain
from lookahead.plan.choice import StepChooser
from lookahead.plan.planner import SCORE_DEPTH, Planner
from lookahead.proposers.context import ContextMatcher
from lookahead.proposers.ngram import NgramPool
from lookahead.vllm import LookaheadProposer
from lookahead.vllm.clock import CEILING, DECAY, FLOOR, StepClock
from lookahead.vllm.proposer import AUTO_START, agreed
from lookahead.vllm.requests import RequestTracker
from lookahead.vllm.settings import settings_from

MAX_LEN = 256
VOCAB = 64


def test_best_chain_worked_example():
    parents = np.array([-1, -1, 0, 2])
    prob = np.array([0.9, 0.3, 0.6, 0.2])
    assert best_chain(parents, prob, 3, 0.25).tolist() == [0, 2]
    assert best_chain(parents, prob, 3, 0.0).tolist() == [0, 2, 3]
    assert best_chain(parents, prob, 1, 0.0).tolist() == [0]
    assert best_chain(parents, prob, 3, 0.95).tolist() == []
    assert best_chain(np.zeros(0, dtype=np.int64), np.zeros(0), 3, 0.0).tolist() == []


def test_best_chain_takes_the_best_child_at_every_depth():
    # x -> {0 (.5), 1 (.8)}; 1 -> {2 (.3), 3 (.7)}; 0 -> 4 (.49)
    parents = np.array([-1, -1, 1, 1, 0])
    prob = np.array([0.5, 0.8, 0.3, 0.7, 0.49])
    assert best_chain(parents, prob, 5, 0.0).tolist() == [1, 3]


def _row(tokens: list[int], width: int = 64) -> np.ndarray:
    row = np.zeros(width, dtype=np.int32)
    row[:len(tokens)] = tokens
    return row


def test_tracker_follows_a_request_and_sees_a_new_one_on_its_row():
    tracker: RequestTracker[list] = RequestTracker(list)
    first = tracker.step([(0, _row([5, 6, 7]), 3, 1)])
    assert len(first.begun) == 1 and not first.ended
    a = first.requests[0]
    second = tracker.step([(0, _row([5, 6, 7, 8]), 4, 1)])
    assert second.requests[0] is a and not second.begun and a.tokens.tolist() == [5, 6, 7, 8]
    third = tracker.step([(0, _row([9, 9, 4]), 3, 1)])
    assert third.ended == [a] and third.requests[0] is not a and len(third.begun) == 1


def test_tracker_follows_a_request_that_moved_rows_and_tells_equal_prompts_apart():
    tracker: RequestTracker[list] = RequestTracker(list)
    step = tracker.step([(0, _row([1, 2, 3]), 3, 1), (1, _row([1, 2, 3]), 3, 1), (2, _row([7, 7, 7]), 3, 1)])
    a, b, c = step.requests[0], step.requests[1], step.requests[2]
    assert len({id(a), id(b), id(c)}) == 3
    # a finished; the batch is condensed: c moves to row 0, b stays on row 1, each grows by what it accepted
    step = tracker.step([(0, _row([7, 7, 7, 5, 6]), 5, 2), (1, _row([1, 2, 3, 4]), 4, 1)])
    assert step.requests[0] is c and step.requests[1] is b
    assert step.ended == [a]
    assert c.tokens.tolist() == [7, 7, 7, 5, 6] and b.tokens.tolist() == [1, 2, 3, 4]


def test_tracker_grows_a_long_request():
    tracker: RequestTracker[list] = RequestTracker(list)
    tokens = list(range(1, 4))
    tracker.step([(0, _row(tokens, 600), 3, 1)])
    for n in range(4, 500):
        tokens.append(n % 50 + 1)
        step = tracker.step([(0, _row(tokens, 600), n, 1)])
        assert not step.begun
    assert step.requests[0].tokens.tolist() == tokens


def test_settings_defaults_and_errors(tmp_path):
    assert settings_from(None).least_accept is None and settings_from({}).memory is None  # None: "auto"
    assert settings_from({"lookahead": {"least_accept": "auto"}}).least_accept is None
    made = settings_from({"lookahead": {"memory": str(tmp_path / "m.lkm"), "match_max": 6, "least_accept": 0.5}})
    assert made.memory == tmp_path / "m.lkm" and made.config.match_max == 6 and made.least_accept == 0.5
    with pytest.raises(ConfigError, match="'windw' is no setting"):
        settings_from({"lookahead": {"windw": 3}})
    with pytest.raises(ConfigError, match="least_accept"):
        settings_from({"lookahead": {"least_accept": 2}})
    with pytest.raises(ConfigError, match="least_accept"):
        settings_from({"lookahead": {"least_accept": "often"}})
    with pytest.raises(ConfigError, match="save_seconds"):
        settings_from({"lookahead": {"save_seconds": -1}})
    with pytest.raises(ConfigError, match="match_min"):
        settings_from({"lookahead": {"match_min": 0}})
    with pytest.raises(ConfigError, match="JSON object"):
        settings_from({"lookahead": [1, 2]})
    with pytest.raises(ConfigError, match="memory_tokens is 0"):
        settings_from({"lookahead": {"memory": "x.lkm", "memory_tokens": 0}})


def _engine(k: int = 4, lookahead: dict | None = None) -> SimpleNamespace:
    """The parts of a VllmConfig the proposer reads (a fixed least_accept unless told: the steps here take
    microseconds, so what "auto" would learn from them says nothing)."""
    lookahead = {"least_accept": 0.3, **(lookahead or {})}
    model = SimpleNamespace(max_model_len=MAX_LEN, get_vocab_size=lambda: VOCAB, tokenizer=None,
                            trust_remote_code=False)
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k), model_config=model,
                           additional_config={"lookahead": lookahead})


class Batch:
    """vLLM's side of the exchange: rows of prompt + output, a target that continues each text as
    ``script`` says, and the drafts it verifies (greedy: the longest agreeing prefix, plus one)."""

    def __init__(self, proposer: LookaheadProposer, rows: int = 4):
        self.proposer = proposer
        self.tokens = np.zeros((rows, MAX_LEN), dtype=np.int32)
        self.lengths = np.zeros(rows, dtype=np.int32)
        self.sampled: list[list[int]] = [[] for _ in range(rows)]
        self.drafts: list[list[int]] = [[] for _ in range(rows)]
        self.proposed = self.accepted = 0

    def start(self, row: int, prompt: list[int], first: int) -> None:
        self.tokens[row, :len(prompt)] = prompt
        self.tokens[row, len(prompt)] = first
        self.lengths[row] = len(prompt) + 1
        self.sampled[row], self.drafts[row] = [first], []

    def stop(self, row: int) -> None:
        self.lengths[row], self.sampled[row], self.drafts[row] = 0, [], []

    def step(self, script: dict[int, list[int]]) -> None:
        """Verify each row's drafts against its script (the target's text), append, and ask for drafts."""
        for row, text in script.items():
            done = self.lengths[row]
            truth = text[done:]
            kept = 0
            for draft, true in zip(self.drafts[row], truth):
                if draft != true:
                    break
                kept += 1
            self.proposed += len(self.drafts[row])
            self.accepted += kept
            new = truth[:kept + 1]
            self.tokens[row, done:done + len(new)] = new
            self.lengths[row] = done + len(new)
            self.sampled[row] = new
        self.drafts = self.proposer.propose(self.sampled, self.lengths.copy(), self.tokens)
        for row, draft in enumerate(self.drafts):
            assert len(draft) <= self.proposer.k
            assert not draft or self.sampled[row], "a row that did not decode gets no drafts"


def _text(seed: int, length: int) -> list[int]:
    rng = np.random.default_rng(seed)
    phrase = rng.integers(1, VOCAB, 12).tolist()
    return (phrase * (length // 12 + 1))[:length]


def _run(batch: Batch, texts: dict[int, list[int]], prompt_len: int = 10) -> None:
    for row, text in texts.items():
        batch.start(row, text[:prompt_len], text[prompt_len])
    batch.drafts = batch.proposer.propose(batch.sampled, batch.lengths.copy(), batch.tokens)
    live = dict(texts)
    while live:
        batch.step(live)
        for row in [r for r in live if batch.lengths[r] >= len(live[r])]:
            del live[row]
            batch.stop(row)


def test_repetitive_text_gets_drafts_accepted():
    proposer = LookaheadProposer(_engine())
    batch = Batch(proposer)
    _run(batch, {0: _text(1, 120), 1: _text(2, 90)})
    assert batch.proposed > 0 and batch.accepted / batch.proposed > 0.7
    assert proposer.accepted == batch.accepted and proposer.proposed == batch.proposed


def test_random_text_gets_few_drafts():
    proposer = LookaheadProposer(_engine())
    batch = Batch(proposer)
    rng = np.random.default_rng(5)
    _run(batch, {0: rng.integers(1, VOCAB, 150).tolist()})
    assert batch.proposed < 40  # 140 steps: the estimates stop proposing what is not accepted


def test_memory_across_requests_raises_acceptance(tmp_path):
    path = tmp_path / "vllm.lkm"
    settings = {"memory": str(path), "save_seconds": 0, "context_match": False, "ngram_pool": False}
    proposer = LookaheadProposer(_engine(lookahead=settings))
    text = np.random.default_rng(3).integers(1, VOCAB, 80).tolist()  # no repeats inside it
    first = Batch(proposer)
    _run(first, {0: text})
    _run(first, {1: [63] * 20})  # the first request left the batch; the next step tells the proposer so
    again = Batch(proposer)
    _run(again, {2: text})
    assert first.accepted == 0 and again.accepted > 50
    assert path.exists()  # saved as requests finished (save_seconds 0)
    # A new engine loads the file and copies at once.
    fresh = LookaheadProposer(_engine(lookahead=settings))
    third = Batch(fresh)
    _run(third, {0: text})
    assert third.accepted > 50


def test_damaged_memory_file_is_refused(tmp_path):
    path = tmp_path / "bad.lkm"
    path.write_bytes(b"not a memory file")
    with pytest.raises(MemoryFileError, match="not a lookahead memory file"):
        LookaheadProposer(_engine(lookahead={"memory": str(path)}))


def test_no_drafts_past_the_model_length():
    proposer = LookaheadProposer(_engine(k=4))
    batch = Batch(proposer)
    text = _text(4, MAX_LEN)
    _run(batch, {0: text}, prompt_len=MAX_LEN - 6)
    assert batch.lengths[0] == 0  # finished: every row stopped at MAX_LEN, nothing past it was drafted


def _clock_on(rows: list[int], seconds: list[float], tokens: int = 2) -> StepClock:
    """A clock that saw steps over rows[i] take seconds[i] (the first starts the clock: not counted)."""
    clock, now = StepClock(), 0.0
    for q, taken in zip(rows, seconds):
        clock.proposed(q)
        now += taken
        clock.tick(now, tokens=tokens, clean=True)
    return clock


def test_step_clock_worked_example():
    rows = [4 if step % 2 else 12 for step in range(40)]
    clock = _clock_on(rows, [0.050 if q == 4 else 0.066 for q in rows], tokens=3)
    assert clock.slope() == pytest.approx(0.002, rel=1e-6)
    assert clock.rate() == pytest.approx(3 / 0.058, rel=0.05)
    assert clock.threshold(0.3) == pytest.approx(0.002 * clock.rate(), rel=1e-6)


def test_step_clock_falls_back_until_it_can_tell_a_row_cost():
    assert StepClock().threshold(0.3) == 0.3  # nothing seen
    clock = _clock_on([5] * 30, [0.04] * 30, tokens=5)
    assert clock.slope() is None and clock.threshold(0.3) == 0.3  # every step had 5 rows


def test_step_clock_leaves_out_steps_that_changed_the_batch_and_pauses():
    clock = StepClock()
    now = 0.0
    for step in range(40):
        rows = 2 + step % 3
        clock.proposed(rows)
        now += 0.02 + 0.001 * rows
        if step == 30:
            now += 5.0  # a pause between two waves of requests
        clock.tick(now, tokens=2, clean=step % 10 != 5)  # a request joined on these
    assert clock.slope() == pytest.approx(0.001, rel=1e-6)
    expensive = StepClock()
    for step in range(40):
        expensive.proposed(2 + step % 2)
        now += 0.02 + 0.5 * (2 + step % 2)
        expensive.tick(now, tokens=3, clean=True)
    assert expensive.threshold(0.3) == CEILING  # b * R = 0.5 s x 3 / 1.27 s: over the ceiling, clipped


def test_step_clock_fit_is_weighted_least_squares_with_its_standard_error():
    rng = np.random.default_rng(7)
    rows = [int(q) for q in rng.integers(2, 12, 60)]
    seconds = [0.03 + 0.002 * q + float(rng.normal(0, 0.004)) for q in rows]
    clock = _clock_on(rows, seconds)
    x, y = np.array(rows[1:], dtype=float), np.array(seconds[1:])  # older steps decayed
    w = DECAY ** np.arange(x.shape[0] - 1, -1, -1)
    mx, my = np.average(x, weights=w), np.average(y, weights=w)
    sxx = float(np.sum(w * (x - mx) ** 2))
    slope = float(np.sum(w * (x - mx) * (y - my))) / sxx
    residual = float(np.sum(w * (y - my - slope * (x - mx)) ** 2))
    error = np.sqrt(residual / (w.sum() - 2) / sxx)
    assert clock.slope() == pytest.approx(slope, rel=1e-6)
    assert clock.trust() == pytest.approx(slope ** 2 / (slope ** 2 + error ** 2), rel=1e-6)
    assert clock.threshold(0.3) == pytest.approx(min(max(clock.trust() * slope * clock.rate(), FLOOR), CEILING))


def test_step_clock_trusts_a_slope_the_steps_cannot_tell_from_noise_little():
    rng = np.random.default_rng(3)
    rows = [2 + step % 9 for step in range(80)]
    # Rows cost 2 ms each, but steps scatter by 60 ms around 70 ms (a machine busy with other work).
    noisy = _clock_on(rows, [0.07 + 0.002 * q + float(rng.uniform(-0.06, 0.06)) for q in rows], tokens=6)
    clean = _clock_on(rows, [0.07 + 0.002 * q for q in rows], tokens=6)
    assert clean.trust() == pytest.approx(1.0)
    assert noisy.slope() is not None and noisy.trust() < 0.6
    assert noisy.threshold(0.3) == pytest.approx(max(noisy.trust() * noisy.slope() * noisy.rate(), FLOOR))
    assert noisy.threshold(0.3) < min(max(noisy.slope() * noisy.rate(), FLOOR), CEILING)  # what the bare fit said


def test_auto_threshold_is_used_once_learned():
    proposer = LookaheadProposer(_engine(lookahead={"least_accept": "auto"}))
    assert proposer._least() == AUTO_START
    for rows in (3, 9) * 10:
        proposer.clock.proposed(rows)
        proposer.clock.tick((proposer.clock.last or 0.0) + 0.01 * rows, tokens=2, clean=True)
    assert proposer._least() == pytest.approx(min(max(0.01 * proposer.clock.rate(), FLOOR), CEILING))


def _copying_planner() -> tuple[Planner, np.ndarray]:
    """A planner over a context matcher alone, begun on a text whose motif [1 .. 8] repeats: the
    matcher's copy after the suffix [1 2] is [3 4 5 ...]."""
    config = LookaheadConfig()
    matcher = ContextMatcher(config.match_min, config.match_max, config.match_length)
    acceptance = AcceptanceStats([matcher.priors], SCORE_DEPTH)
    planner = Planner(config, [matcher], acceptance, StepChooser(config, None, acceptance))
    seq = np.array(list(range(1, 9)) * 2 + [1, 2], dtype=np.int64)
    planner.begin(seq, seq.shape[0])
    return planner, seq


def test_the_planners_chain_mode_proposes_the_best_path_cut_by_tokens_left_and_least():
    planner, seq = _copying_planner()
    stop = seq.shape[0]
    chain = planner.chain(seq, stop, 3, 0.0)
    assert chain.tokens.tolist() == [3, 4, 5] and chain.parents.tolist() == [-1, 0, 1]
    assert chain.depths.tolist() == [1, 2, 3] and 0.0 < planner.predicted < 3.0  # the promise learn will count
    assert planner.offered[0].count > 0 and planner.offered[0].tokens[0, :3].tolist() == [3, 4, 5]
    assert planner.chain(seq, stop, 1, 0.0).tokens.tolist() == [3]
    nothing = planner.chain(seq, stop, 3, 1.0)  # no path probability reaches 1
    assert nothing.size == 0 and planner.predicted == 0.0
    assert planner.chain(seq, stop, 0, 0.0).size == 0
    # the learned outcome moves the estimates the next chain is scored by
    before = planner.acceptance.estimates().copy()
    chain = planner.chain(seq, stop, 3, 0.0)
    planner.learn(chain, np.arange(3))
    assert (planner.acceptance.estimates() >= before).all() and (planner.acceptance.estimates() > before).any()


def test_the_proposer_drafts_through_the_engines_factory_and_planner():
    proposer = LookaheadProposer(_engine())
    state = proposer._new_state()
    assert type(state.planner) is Planner and state.planner.acceptance is proposer.acceptance
    config = proposer.settings.config
    pool = NgramPool(VOCAB, config.pool_ngram, config.pool_capacity, config.pool_max_keys)
    engine = SourceFactory(config, proposer.memory, None).build(None, None, pool, None, 0).sources
    assert [type(s) for s in state.planner.proposers] == [type(s) for s in engine]
    assert [s.name for s in state.planner.proposers] == ["prediction", "context", "memory", "ngram", "grammar"]
    quiet = LookaheadProposer(_engine(lookahead={"context_match": False, "memory_tokens": 0}))
    assert [s.name for s in quiet._new_state().planner.proposers] == ["prediction", "ngram", "grammar"]
    # the settings' values may be text, read by the config module's one parser
    assert settings_from({"lookahead": {"match_max": "6", "ngram_pool": "no"}}).config == LookaheadConfig(
        match_max=6, ngram_pool=False)


def test_agreed_counts_the_chain_tokens_vllm_kept():
    assert agreed(np.array([7, 8, 9]), np.array([7, 8, 5])) == 2
    assert agreed(np.array([7, 8]), np.array([7, 8, 5])) == 2  # all kept, vLLM's own token after them
    assert agreed(np.array([7, 8, 9]), np.array([6])) == 0
    assert agreed(np.zeros(0, dtype=np.int64), np.array([6])) == 0
