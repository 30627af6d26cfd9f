"""generate(..., logprobs=k) (lookahead/call/logprobs.py, lookahead/verify/logprobs.py): every new token's
logprob and its k likeliest alternatives, the same whether the token came from the plain loop (one row a
step) or was accepted from a tree (the same tokens and alternatives; the values to float32 rounding, the
forward's own last-bit differences between row counts; the logprob computation itself is bit for bit
row-independent); equal to the log-softmax of model(...)'s logits recomputed over the whole text (after
the penalties and biases, before temperature); a batch's rows each get their own; a streamer with
``put_logprobs`` gets them with the tokens; bad values are refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import VOCAB
from test_penalties import NEW, NO_EOS, PLAIN, SPECULATE, model_for, prompt

from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.errors import GenerateInputError
from lookahead.verify.logprobs import read_logprobs, stage_logprobs
from lookahead.verify.penalties import OutputPenalty


def generated(config: LookaheadConfig, arch: str = "llama", ids: torch.Tensor | None = None, **kwargs):
    gen = LookaheadGenerator(model_for(arch), config=config)
    return gen.generate(prompt() if ids is None else ids, max_new_tokens=NEW, eos_token_id=NO_EOS, **kwargs)


def direct_logprobs(arch: str, sequence: torch.Tensor, prompt_len: int, presence: float = 0.0,
                    frequency: float = 0.0) -> torch.Tensor:
    """log_softmax [n, V] of model(sequence)'s logits at the rows that produced each new token, with the
    output penalties applied to each row's own prefix."""
    with torch.inference_mode():
        logits = model_for(arch)(sequence).logits[0].float()  # [L, V]
    rows = []
    penalty = OutputPenalty(presence, frequency, prompt_len)
    for position in range(prompt_len - 1, sequence.shape[1] - 1):
        scores = logits[position:position + 1]
        if presence or frequency:
            scores = penalty(sequence[:, :position + 1], scores)
        rows.append(torch.log_softmax(scores, dim=-1)[0])
    return torch.stack(rows)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_speculation_gives_the_plain_loops_tokens_and_logprobs(arch):
    """The same tokens and alternatives; the values agree to float32 rounding, not to the bit: on the CPU a
    row's logits still differ in their last bits with the step's row count (the linear route chosen per row
    count, the attention's sum order: docs/DESIGN.md), which the logprobs inherit. Given the same logits
    the logprob computation itself is row-independent to the bit (the test below)."""
    spec = generated(SPECULATE, arch, logprobs=5, return_dict_in_generate=True)
    plain = generated(PLAIN, arch, logprobs=5)
    assert torch.equal(spec.sequences, plain.sequences)
    assert sum(spec.stats.accepted) > spec.stats.steps, "no token came from a tree: the test would be vacuous"
    a, b = spec.logprobs[0], plain.logprobs[0]
    assert a.tokens.shape == (NEW,) and a.top_ids.shape == (NEW, 5) and a.logprobs.dtype == torch.float32
    assert torch.equal(a.tokens, spec.sequences[0, -NEW:])
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.top_ids, b.top_ids)
    assert torch.allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
    assert torch.allclose(a.top_logprobs, b.top_logprobs, atol=1e-5, rtol=0)


def test_a_rows_logprobs_do_not_depend_on_the_rows_beside_it():
    """The same scores give the same bits in a step of one row or of many, penalties applied per row."""
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(37, VOCAB, generator=gen) * 3  # [R, V]
    ids = torch.randint(3, VOCAB, (37, 12), generator=gen)  # [R, L]: each row's own prefix
    penalty = OutputPenalty(-0.5, 0.7, 4)
    processed = penalty(ids, scores)
    chosen = processed.argmax(-1)
    whole = stage_logprobs(processed, chosen, 5)
    alone = [stage_logprobs(penalty(ids[r:r + 1], scores[r:r + 1]), chosen[r:r + 1], 5) for r in range(37)]
    rows = 37
    assert torch.equal(whole[:rows], torch.cat([a[:1] for a in alone]))
    assert torch.equal(whole[rows:rows * 6], torch.cat([a[1:6] for a in alone]))
    assert torch.equal(whole[rows * 6:], torch.cat([a[6:] for a in alone]))
    read = read_logprobs(whole.numpy(), rows, 5, np.array([0, 3, 36]))
    expected = torch.log_softmax(processed, dim=-1)
    assert torch.equal(torch.from_numpy(read.logprobs), expected[[0, 3, 36], chosen[[0, 3, 36]]])
    assert torch.equal(torch.from_numpy(read.top_logprobs), expected[[0, 3, 36]].topk(5, dim=-1).values)


def test_logprobs_equal_the_log_softmax_of_a_direct_forward():
    ids = prompt()
    out = generated(SPECULATE, logprobs=4)
    got = out.logprobs[0]
    expected = direct_logprobs("llama", out.sequences, ids.shape[1])  # [n, V]
    picked = expected.gather(1, got.tokens[:, None])[:, 0]
    assert torch.allclose(got.logprobs, picked, atol=1e-5, rtol=0)
    values, index = expected.topk(4, dim=-1)
    assert torch.allclose(got.top_logprobs, values, atol=1e-5, rtol=0)
    assert torch.equal(got.top_ids[:, 0], index[:, 0])
    assert torch.equal(got.top_ids[:, 0], got.tokens)  # greedy: the chosen token is the likeliest
    assert torch.equal(got.logprobs, got.top_logprobs[:, 0])


def test_logprobs_are_read_after_penalties_and_before_temperature():
    ids = prompt()
    settings = dict(logprobs=3, do_sample=True, temperature=0.5, presence_penalty=-0.4, frequency_penalty=0.3)
    # a generator of its own for each run: torch's default one is also drawn by building the cached model
    out = generated(SPECULATE, generator=torch.Generator().manual_seed(5), **settings)
    plain = generated(PLAIN, generator=torch.Generator().manual_seed(5), **settings)
    got = out.logprobs[0]
    assert torch.equal(out.sequences, plain.sequences)
    assert torch.allclose(got.logprobs, plain.logprobs[0].logprobs, atol=1e-5, rtol=0)
    expected = direct_logprobs("llama", out.sequences, ids.shape[1], presence=-0.4, frequency=0.3)
    assert torch.allclose(got.logprobs, expected.gather(1, got.tokens[:, None])[:, 0], atol=1e-5, rtol=0)
    assert torch.allclose(got.top_logprobs, expected.topk(3, dim=-1).values, atol=1e-5, rtol=0)
    unpenalised = direct_logprobs("llama", out.sequences, ids.shape[1])
    assert not torch.allclose(got.top_logprobs, unpenalised.topk(3, dim=-1).values, atol=1e-3), "vacuous"


def test_logprobs_with_logit_bias_include_the_bias():
    ids = prompt()
    out = generated(SPECULATE, logprobs=2, logit_bias={20: 5.0, 11: -3.0})
    got = out.logprobs[0]
    raw = direct_logprobs("llama", out.sequences, ids.shape[1])  # [n, V] without the bias
    with torch.inference_mode():
        logits = model_for("llama")(out.sequences).logits[0, ids.shape[1] - 1:-1].float().clone()  # [n, V]
    logits = logits.clone()
    logits[:, 20] += 5.0
    logits[:, 11] -= 3.0
    expected = torch.log_softmax(logits, dim=-1)
    assert torch.allclose(got.logprobs, expected.gather(1, got.tokens[:, None])[:, 0], atol=1e-5, rtol=0)
    assert torch.allclose(got.top_logprobs, expected.topk(2, dim=-1).values, atol=1e-5, rtol=0)
    assert (got.top_ids == 20).sum() > (raw.topk(2, dim=-1).indices == 20).sum(), "the bias changed nothing"


def test_a_batch_gives_each_row_its_own_logprobs():
    long, short = prompt(), prompt()[:, 4:]
    pad = long.shape[1] - short.shape[1]
    ids = torch.cat([long, torch.cat([torch.zeros((1, pad), dtype=torch.long), short], dim=1)])
    mask = torch.ones_like(ids)
    mask[1, :pad] = 0
    gen = LookaheadGenerator(model_for("llama"), config=SPECULATE)
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=NO_EOS, logprobs=2)
    assert len(out.logprobs) == 2
    for row, alone in ((0, long), (1, short)):
        single = generated(PLAIN, ids=alone, logprobs=2).logprobs[0]
        assert torch.equal(out.logprobs[row].tokens, single.tokens)
        assert torch.allclose(out.logprobs[row].logprobs, single.logprobs, atol=1e-5, rtol=0)


def test_eos_cuts_the_logprobs_with_the_tokens():
    free = generated(PLAIN)[0, prompt().shape[1]:]
    eos = int(free[7])
    out = LookaheadGenerator(model_for("llama"), config=SPECULATE).generate(
        prompt(), max_new_tokens=NEW, eos_token_id=eos, logprobs=1)
    n = out.sequences.shape[1] - prompt().shape[1]
    assert int(out.sequences[0, -1]) == eos and n < NEW
    assert out.logprobs[0].tokens.shape == (n,) and out.logprobs[0].top_ids.shape == (n, 1)


class Recorder:
    """A streamer that also takes logprobs."""

    def __init__(self):
        self.tokens, self.logprobs, self.prompt = [], [], None

    def put(self, value):
        if self.prompt is None:
            self.prompt = value
            return
        self.tokens.extend(value.reshape(-1).tolist())

    def put_logprobs(self, step):
        self.logprobs.extend(step.logprobs.tolist())

    def end(self):
        pass


def test_a_streamer_gets_the_logprobs_with_the_tokens():
    recorder = Recorder()
    out = generated(SPECULATE, logprobs=True, streamer=recorder)
    assert recorder.tokens == out.logprobs[0].tokens.tolist()
    assert recorder.logprobs == out.logprobs[0].logprobs.tolist()
    assert out.logprobs[0].top_ids.shape == (NEW, 0)


def test_without_logprobs_nothing_changes():
    out = generated(SPECULATE)
    assert isinstance(out, torch.Tensor)
    assert generated(SPECULATE, return_dict_in_generate=True).logprobs is None


@pytest.mark.parametrize("value", [21, -1, 2.0, "5"])
def test_bad_logprobs_are_refused(value):
    with pytest.raises(GenerateInputError, match="logprobs must be"):
        generated(PLAIN, logprobs=value)


def test_logprobs_need_the_output_object():
    with pytest.raises(GenerateInputError, match="return_dict_in_generate=False"):
        generated(PLAIN, logprobs=2, return_dict_in_generate=False)
