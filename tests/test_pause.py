"""plan/pause.py: a batch stops proposing after a run of plain decisions, for longer each time, and proposes
again at once after a speculative one; a lone sequence always proposes."""

from __future__ import annotations

from lookahead.plan.pause import LONGEST, RUN, SHORTEST, ProposalPause


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
