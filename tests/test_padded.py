"""generate through the open batch (lookahead/decode/padded.py): a call's left-padded prompts enter the batch
together (``OpenBatch.admit``: one padded prefill, as model.generate's) and step through ``OpenBatch.step``, the
server's loop; the output, the streamer's calls and the errors are generate's."""

from __future__ import annotations

import pytest
import torch

from conftest import VOCAB, tiny_model
from lookahead import GenerateInputError, LookaheadConfig, LookaheadGenerator
from lookahead.decode import sequence as sequence_module
from lookahead.decode.batch import OpenBatch
from lookahead.decode.loop import DecodeRun
from lookahead.decode.settings import call_decoding

MOTIF = [5, 9, 13, 17, 21]
PROMPTS = [MOTIF * 3, [7, 8, 9], [40, 41] + MOTIF * 2 + [3]]  # ragged: lengths 15, 3, 13
NEW = 20
NO_EOS = [VOCAB + 1000]


def left_padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids [B, T] and attention_mask [B, T], padded on the left with 0."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


class Recorder:
    """A streamer recording transformers' put / end calls in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int]]] = []

    def put(self, value: torch.Tensor) -> None:
        self.calls.append(("put", value.reshape(-1).tolist()))

    def end(self) -> None:
        self.calls.append(("end", []))


def test_a_padded_batch_is_admitted_in_one_padded_prefill_and_steps_through_the_open_batch(monkeypatch):
    """One prefill of the whole padded batch with its mask (model.generate's), then every step an
    OpenBatch.step; each row equals model.generate on the same padded batch."""
    model = tiny_model("llama")
    gen = LookaheadGenerator(model, config=LookaheadConfig(window=2, ngram=3, memory_tokens=0))
    prefills: list[tuple[tuple[int, ...], bool]] = []
    prefill = gen.target.prefill

    def recording_prefill(cache, ids, mask=None, positions=None, chunk=0):
        prefills.append((tuple(ids.shape), mask is not None))
        return prefill(cache, ids, mask, positions, chunk)

    steps: list[int] = []
    step = OpenBatch.step

    def counting_step(self):
        steps.append(len(self.handles))
        return step(self)

    monkeypatch.setattr(gen.target, "prefill", recording_prefill)
    monkeypatch.setattr(OpenBatch, "step", counting_step)
    ids, mask = left_padded(PROMPTS)
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=NO_EOS)
    with torch.inference_mode():
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, eos_token_id=NO_EOS)
    assert torch.equal(out, expected)
    assert prefills == [((len(PROMPTS), ids.shape[1] - 1), True)]
    assert len(steps) == gen.last_stats.steps > 0 and steps[0] == len(PROMPTS)
    assert gen.last_stats.new_tokens == NEW * len(PROMPTS) and gen.last_stats.prompt_tokens == int(mask.sum())
    assert not hasattr(DecodeRun, "decode"), "generate's loop is the open batch's: no second loop in DecodeRun"


def test_one_prompt_is_prefilled_alone_as_join_prefills_it(monkeypatch):
    """A single (left-padded) row: its prompt without the padding, no mask; the output keeps the padding."""
    model = tiny_model("qwen2")
    gen = LookaheadGenerator(model, config=LookaheadConfig(memory_tokens=0))
    prefills: list[tuple[list[int], bool]] = []
    prefill = gen.target.prefill

    def recording_prefill(cache, ids, mask=None, positions=None, chunk=0):
        prefills.append((ids.reshape(-1).tolist(), mask is not None))
        return prefill(cache, ids, mask, positions, chunk)

    monkeypatch.setattr(gen.target, "prefill", recording_prefill)
    ids, mask = left_padded([PROMPTS[1], PROMPTS[0]])
    out = gen.generate(ids[:1], attention_mask=mask[:1], max_new_tokens=NEW, eos_token_id=NO_EOS)
    assert prefills == [(PROMPTS[1][:-1], False)]
    assert torch.equal(out[:, :ids.shape[1]], ids[:1])
    with torch.inference_mode():
        alone = model.generate(torch.tensor([PROMPTS[1]]), max_new_tokens=NEW, do_sample=False, eos_token_id=NO_EOS)
    assert out[0, ids.shape[1]:].tolist() == alone[0, len(PROMPTS[1]):].tolist()


def test_the_streamer_gets_the_prompt_each_kept_token_and_end_even_with_nothing_to_generate():
    model = tiny_model("llama")
    gen = LookaheadGenerator(model, config=LookaheadConfig(memory_tokens=0))
    prompt = torch.tensor([MOTIF * 2])
    streamer = Recorder()
    out = gen.generate(prompt, max_new_tokens=NEW, eos_token_id=NO_EOS, streamer=streamer)
    kinds = [kind for kind, _ in streamer.calls]
    assert kinds[0] == "put" and kinds[-1] == "end" and kinds.count("end") == 1
    assert streamer.calls[0][1] == MOTIF * 2
    assert sum((tokens for _, tokens in streamer.calls[1:]), []) == out[0, prompt.shape[1]:].tolist()
    nothing = Recorder()
    out = gen.generate(prompt, max_new_tokens=0, streamer=nothing)
    assert torch.equal(out, prompt)
    assert nothing.calls == [("put", MOTIF * 2), ("end", [])]


def test_a_failure_when_a_row_ends_is_raised_by_generate(monkeypatch):
    """The open batch ends a row whose sources' bookkeeping fails with finish reason "error"; generate raises it."""
    gen = LookaheadGenerator(tiny_model("llama"), config=LookaheadConfig(memory_tokens=0))

    def failing_finish(self):
        raise RuntimeError("bookkeeping failed")

    monkeypatch.setattr(sequence_module.Sequence, "finish", failing_finish)
    ids, mask = left_padded(PROMPTS)
    with pytest.raises(RuntimeError, match="bookkeeping failed"):
        gen.generate(ids, attention_mask=mask, max_new_tokens=4)


def test_admit_refuses_a_batch_with_running_sequences_and_a_streamer_for_several_rows():
    gen = LookaheadGenerator(tiny_model("llama"), config=LookaheadConfig(memory_tokens=0))
    batch = gen.open_batch()
    batch.join([5, 6, 7], max_new_tokens=4)
    decoding = call_decoding(gen.model, 3, gen.target.device, gen.vocab, gen.grammar, max_new_tokens=4)
    ids, mask = left_padded([[1, 2, 3]])
    with pytest.raises(RuntimeError, match="no sequence running"):
        batch.admit(ids, mask, [ids[0].numpy()], decoding)
    fresh = gen.open_batch()
    ids, mask = left_padded([[1, 2, 3], [4, 5]])
    with pytest.raises(GenerateInputError, match="streamer takes one sequence"):
        fresh.admit(ids, mask, [ids[0].numpy(), ids[1, 1:].numpy()], decoding, streamer=Recorder())
