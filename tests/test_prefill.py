"""Whose kernel prefills prompts (model/prefill.py): measured on the first prefills, then the faster."""

from __future__ import annotations

import pytest
import torch

from conftest import VOCAB, reference, tiny_model
from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.model import prefill
from lookahead.model.prefill import MEASURED_ROWS, TRIES, PrefillChoice


class Clock:
    """time.perf_counter for prefill.py: each prefill's body advances it by the next of ``seconds``."""

    def __init__(self, monkeypatch):
        self.now = 0.0
        monkeypatch.setattr(prefill.time, "perf_counter", lambda: self.now)


class Linears:
    """A FewRowLinear's ``routed`` alone, counting the bodies it ran."""

    def __init__(self):
        self.entered = 0

    def routed(self, kernel=True):
        assert kernel
        outer = self

        class Routed:
            def __enter__(self):
                outer.entered += 1

            def __exit__(self, *exc):
                return False

        return Routed()


def run(choice: PrefillChoice, clock: Clock, rows: int, seconds: float) -> None:
    with choice.running(rows):
        clock.now += seconds


def test_worked_example_alternates_then_keeps_the_faster_per_row(monkeypatch):
    clock, linears = Clock(monkeypatch), Linears()
    choice = PrefillChoice(linears)
    kinds = []
    for seconds in (0.02, 0.01, 0.03, 0.01):  # torch, kernel, torch, kernel over 100 rows
        kinds.append(choice.next_kind(100))
        run(choice, clock, 100, seconds)
    assert kinds == ["torch", "kernel"] * TRIES and choice.chosen == "kernel"
    assert choice.per_row == {"torch": pytest.approx([2e-4, 3e-4]), "kernel": pytest.approx([1e-4, 1e-4])}
    run(choice, clock, 5, 1.0)  # chosen: short prompts too, and nothing timed any more
    assert linears.entered == 3 and len(choice.per_row["kernel"]) == TRIES


def test_torch_is_kept_where_it_is_faster_per_row_of_prompts_of_any_length(monkeypatch):
    clock = Clock(monkeypatch)
    choice = PrefillChoice(Linears())
    for rows, seconds in ((400, 0.4), (50, 0.1), (60, 0.06), (300, 0.6)):  # torch 1e-3 a row, the kernel 2e-3
        run(choice, clock, rows, seconds)
    assert choice.chosen == "torch"


def test_short_prompts_run_on_torch_and_are_not_timed(monkeypatch):
    clock, linears = Clock(monkeypatch), Linears()
    choice = PrefillChoice(linears)
    for _ in range(5):
        assert choice.next_kind(MEASURED_ROWS - 1) == "torch"
        run(choice, clock, MEASURED_ROWS - 1, 0.01)
    assert linears.entered == 0 and choice.chosen is None and not any(choice.per_row.values())


def test_without_the_tiled_kernel_every_prefill_is_torchs():
    choice = PrefillChoice(None)
    assert choice.chosen == "torch" and choice.next_kind(1000) == "torch"
    with choice.running(1000):
        pass
    assert not any(choice.per_row.values())


def test_prompts_prefilled_through_either_kernel_decode_as_generate_does():
    """Four long prompts (the choice made after them) and one more: every output is generate's."""
    model = tiny_model("llama")
    gen = LookaheadGenerator(model, config=LookaheadConfig())
    choice = gen.target.prefills
    if choice.linears is None:
        pytest.skip("the tiled kernel is not loaded here (no C++ compiler, or no AVX2)")
    for seed in range(2 * TRIES + 1):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(1, VOCAB, (1, MEASURED_ROWS + 40 + 7 * seed), generator=g)
        out = gen.generate(ids, max_new_tokens=24, eos_token_id=VOCAB + 1)
        assert torch.equal(out, reference(model, ids, 24, eos_token_id=VOCAB + 1))
    assert choice.chosen in ("torch", "kernel") and all(len(v) == TRIES for v in choice.per_row.values())


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3", "phi3"])
def test_prompts_prefilled_through_the_kernel_decode_as_generate_does(arch):
    """The kernel chosen (whatever the timings would say): long prompts, one at a time and a left-padded
    batch, every output generate's; architectures with biases (qwen2), sliding layers (gemma3), fused
    projections (phi3)."""
    model = tiny_model(arch)
    gen = LookaheadGenerator(model, config=LookaheadConfig())
    if gen.target.prefills.linears is None:
        pytest.skip("the tiled kernel is not loaded here (no C++ compiler, or no AVX2)")
    choice = gen.target.prefills
    choice.chosen = "kernel"
    kinds = []
    running = choice.running
    choice.running = lambda rows: (kinds.append((rows, choice.next_kind(rows))), running(rows))[1]
    g = torch.Generator().manual_seed(5)
    for length in (MEASURED_ROWS + 9, 3 * MEASURED_ROWS):
        ids = torch.randint(1, VOCAB, (1, length), generator=g)
        out = gen.generate(ids, max_new_tokens=20, eos_token_id=VOCAB + 1)
        assert torch.equal(out, reference(model, ids, 20, eos_token_id=VOCAB + 1))
    long, short = torch.randint(1, VOCAB, (1, 50), generator=g), torch.randint(1, VOCAB, (1, 38), generator=g)
    batch = torch.cat([long, torch.cat([torch.zeros(1, 12, dtype=torch.long), short], 1)])  # [2, 50], left-padded
    mask = torch.cat([torch.ones(1, 50, dtype=torch.long), (torch.arange(50) >= 12).long()[None]])
    outs = gen.generate(batch, attention_mask=mask, max_new_tokens=16, eos_token_id=VOCAB + 1)
    assert torch.equal(outs[:1], reference(model, long, 16, eos_token_id=VOCAB + 1))
    assert torch.equal(outs[1:, 12:], reference(model, short, 16, eos_token_id=VOCAB + 1))
    assert kinds == [(MEASURED_ROWS + 8, "kernel"), (3 * MEASURED_ROWS - 1, "kernel"), (2 * 49, "kernel")]


def test_few_row_matmul_off_prefills_through_torch():
    gen = LookaheadGenerator(tiny_model("llama"), config=LookaheadConfig(few_row_matmul=False))
    assert gen.target.prefills.linears is None and gen.target.prefills.next_kind(500) == "torch"
