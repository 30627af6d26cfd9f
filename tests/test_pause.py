"""plan/pause.py: a batch stops proposing after a run of plain decisions, for longer each time, and proposes
again at once after a speculative one; a lone sequence always proposes."""

from __future__ import annotations

import numpy as np

from lookahead.plan.pause import LONGEST, RUN, SHORTEST, ProposalPause
from lookahead.proposers.base import no_candidates


def run_plain(pause: ProposalPause, steps: int, sequences: int = 4) -> list[bool]:
    """Whether each of ``steps`` steps proposed, the budget taking plain steps whenever asked."""
    proposed = []
    for _ in range(steps):
        asks = pause.proposing(sequences)
        proposed.append(asks)
        if asks:
            pause.decided(sequences, speculative=False)
    return proposed


def test_the_docstrings_worked_example():
    proposed = run_plain(ProposalPause(), 38)
    asked = [i + 1 for i, p in enumerate(proposed) if p]
    assert (RUN, SHORTEST, LONGEST) == (8, 4, 64)
    assert asked == [1, 2, 3, 4, 5, 6, 7, 8, 13, 22]  # (pauses of 4, 8, then 16: steps 23-38)


def test_pauses_grow_to_the_longest_and_no_further():
    proposed = run_plain(ProposalPause(), 2000)
    asked = [i for i, p in enumerate(proposed) if p]
    gaps = [b - a - 1 for a, b in zip(asked[RUN - 1:], asked[RUN:])]
    assert gaps[:5] == [4, 8, 16, 32, 64] and set(gaps[4:]) == {LONGEST}


def test_a_speculative_decision_ends_the_growth():
    pause = ProposalPause()
    run_plain(pause, 30)  # (pauses of 4 and 8 taken, the next 16)
    while not pause.proposing(4):
        pass
    pause.decided(4, speculative=True)
    assert run_plain(pause, RUN) == [True] * RUN  # (the count starts again)
    assert run_plain(pause, SHORTEST + 1) == [False] * SHORTEST + [True]  # (and the pause is the shortest)


def test_a_lone_sequence_and_a_pause_switched_off_always_propose():
    assert all(run_plain(ProposalPause(), 200, sequences=1))
    assert all(run_plain(ProposalPause(enabled=False), 200))
    pause = ProposalPause()
    run_plain(pause, RUN)  # (a pause begins)
    assert pause.proposing(1) and pause.proposing(4)  # (a batch down to one sequence drops it)


def test_a_batch_whose_budget_takes_plain_steps_proposes_less_and_decodes_the_same(monkeypatch):
    """Through the open batch (tiny Llama, three sequences): a budget that always answers "plain" makes the
    run stop ranking for the pauses, and every sequence's tokens are what the same run proposing every step
    gives, and what generate gives it alone."""
    import dataclasses

    import torch

    from conftest import tiny_model, tiny_tokenizer
    from lookahead import LookaheadConfig, LookaheadGenerator
    from lookahead.decode.sequence import Sequence
    from lookahead.plan.choice import StepChooser

    monkeypatch.setattr(StepChooser, "_forecast", lambda self, probs, gain, spent: (0, 0, None))
    ranks = {"count": 0}
    rank = Sequence.rank

    def counted(self):
        ranks["count"] += 1
        return rank(self)

    monkeypatch.setattr(Sequence, "rank", counted)
    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    prompts = [[5, 9, 14, 23, 5, 9, 14, 23, 5], [7, 8, 9, 7, 8, 9, 7], [11, 30, 11, 30, 11, 30, 12, 40]]
    outputs, counts = {}, {}
    for enabled in (True, False):
        config = dataclasses.replace(LookaheadConfig(), pause_plain_batches=enabled)
        batch = LookaheadGenerator(model, tokenizer, config).open_batch()
        handles = [batch.join(p, max_new_tokens=40, eos_token_id=[10 ** 6]) for p in prompts]
        ranks["count"] = 0
        for _ in range(200):
            if not batch.handles:
                break
            batch.step()
        outputs[enabled] = [h.output_ids.tolist() for h in handles]
        counts[enabled] = ranks["count"]
    assert outputs[True] == outputs[False]
    assert counts[False] >= 3 * 39 and counts[True] < counts[False] / 2  # (every step ranks every sequence, or not)
    for p, out in zip(prompts, outputs[True]):
        alone = LookaheadGenerator(model, tokenizer, LookaheadConfig()).generate(
            torch.tensor([p]), max_new_tokens=40, eos_token_id=[10 ** 6])
        assert out[-40:] == alone[0, -40:].tolist()


class Told:
    """A source that records the spans it is told of and proposes nothing."""

    name = "told"

    def __init__(self) -> None:
        self.priors = np.array([0.5])
        self.spans: list[tuple[int, int]] = []
        self.ended: list[int] = []

    def begin(self, seq, stop):
        pass

    def propose(self, seq, stop, limit, estimates, step):
        return no_candidates()

    def observe(self, seq, start, stop):
        self.spans.append((start, stop))

    def learn(self, outcome):
        pass

    def finish(self, seq, stop):
        self.ended.append(stop)

    def column_worth(self, state):
        return 0.0


def told_planner():
    """A planner over one ``Told`` source, and a sequence of 40 tokens."""
    from conftest import make_planner

    from lookahead import LookaheadConfig
    from lookahead.plan.acceptance import AcceptanceStats

    source = Told()
    planner = make_planner(LookaheadConfig(), [source], AcceptanceStats([source.priors]), None)
    return planner, source, np.arange(40, dtype=np.int64)


def test_a_paused_steps_tokens_reach_the_sources_at_the_next_proposal_in_one_span():
    planner, source, seq = told_planner()
    planner.observe(seq, 10, 12)  # a proposing step's tokens: told at once
    for start, stop in ((12, 13), (13, 15), (15, 16)):  # three paused steps: deferred
        planner.observe(seq, start, stop, defer=True)
    assert source.spans == [(10, 12)]
    planner.rank(seq, 16, tokens_left=20)  # the next proposal hears of all of them first
    assert source.spans == [(10, 12), (12, 16)]
    planner.observe(seq, 16, 18, defer=True)
    planner.observe(seq, 18, 19)  # a step that proposed: its tokens and the deferred ones together
    assert source.spans[-1] == (16, 19)


def test_a_sequence_ending_while_paused_tells_its_sources_before_it_ends():
    planner, source, seq = told_planner()
    planner.observe(seq, 10, 11, defer=True)
    planner.observe(seq, 11, 13, defer=True)
    planner.finish(seq, 14)  # (the last step's own tokens are told to no observe, as ever)
    assert source.spans == [(10, 13)] and source.ended == [14]
    planner.finish(seq, 14)
    assert source.spans == [(10, 13)]  # nothing told twice


def test_a_paused_batch_feeds_its_pools_the_same_n_grams_later(monkeypatch):
    """Through the open batch (tiny Llama, three sequences, the budget always plain): the steps that propose
    nothing leave the sequences' n-gram pools as they were, and the next proposal finds in them every n-gram a
    batch proposing each step would have inserted by then."""
    from conftest import tiny_model, tiny_tokenizer

    from lookahead import LookaheadConfig, LookaheadGenerator
    from lookahead.plan.choice import StepChooser
    from lookahead.proposers.ngram import NgramProposer

    monkeypatch.setattr(StepChooser, "_forecast", lambda self, probs, gain, spent: (0, 0, None))
    inserted: dict[int, list[tuple[int, int]]] = {}
    insert = NgramProposer.observe

    def recorded(self, seq, start, stop):
        inserted.setdefault(id(self), []).append((start, stop))
        insert(self, seq, start, stop)

    monkeypatch.setattr(NgramProposer, "observe", recorded)
    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    prompts = [[5, 9, 14, 23, 5, 9, 14, 23, 5], [7, 8, 9, 7, 8, 9, 7], [11, 30, 11, 30, 11, 30, 12, 40]]
    batch = LookaheadGenerator(model, tokenizer, LookaheadConfig()).open_batch()
    handles = [batch.join(p, max_new_tokens=40, eos_token_id=[10 ** 6]) for p in prompts]
    for _ in range(60):
        if not batch.handles:
            break
        batch.step()
    assert all(h.new_tokens == 40 for h in handles)
    for spans in inserted.values():  # each pool told of every token once, in order, in fewer calls than steps
        starts = np.array([s for s, _ in spans])
        stops = np.array([t for _, t in spans])
        assert (starts[1:] == stops[:-1]).all() and len(spans) < 39
    assert len(inserted) == 3
