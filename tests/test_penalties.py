"""presence_penalty, frequency_penalty and logit_bias (lookahead/verify/penalties.py): greedy with
speculation equals the plain loop with the same settings and model.generate with the same processors,
token for token (penalties count the output so far plus the tree path to each row); logit_bias equals
transformers' sequence_bias of one-token sequences; a batch counts each sequence's own output; sampled
text with a seed is the same with speculation as without; bad settings are refused by name."""

from __future__ import annotations

import functools

import pytest
import torch
from transformers.generation import LogitsProcessorList

from conftest import VOCAB, tiny_model
from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.errors import GenerateInputError
from lookahead.verify.penalties import LogitBias, OutputPenalty, Penalties

NEW = 40
NO_EOS = [VOCAB + 1000]  # an id that never occurs
SPECULATE = LookaheadConfig(window=3, ngram=3, candidates=4, match_min=1, match_length=6,
                            budget="fixed")  # trees every step, whatever the machine's load
PLAIN = LookaheadConfig(window=1, ngram=2, candidates=0)


@functools.lru_cache(maxsize=None)
def model_for(arch: str):
    return tiny_model(arch)


def prompt() -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    motif = torch.randint(3, VOCAB, (6,), generator=gen)
    return torch.cat([motif, motif, motif, motif[:3]])[None]  # [1, 21]: repetitive, so trees get accepted


def generated(config: LookaheadConfig, arch: str = "llama", ids: torch.Tensor | None = None, **kwargs):
    gen = LookaheadGenerator(model_for(arch), config=config)
    out = gen.generate(prompt() if ids is None else ids, max_new_tokens=NEW, eos_token_id=NO_EOS, **kwargs)
    return out, gen.last_stats


def hf_generate(arch: str, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    with torch.inference_mode():
        return model_for(arch).generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW,
                                        do_sample=False, eos_token_id=NO_EOS, **kwargs)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("presence, frequency", [(-0.8, 0.5), (0.6, 1.5), (-1.0, -0.4)])
def test_penalties_with_speculation_equal_the_plain_loop_and_generate(arch, presence, frequency):
    ids = prompt()
    settings = dict(presence_penalty=presence, frequency_penalty=frequency)
    spec, stats = generated(SPECULATE, arch, **settings)
    plain, plain_stats = generated(PLAIN, arch, **settings)
    reference = hf_generate(arch, ids, logits_processor=LogitsProcessorList(
        [OutputPenalty(presence, frequency, ids.shape[1])]))
    unpenalised = hf_generate(arch, ids)
    assert torch.equal(plain, reference), "the plain loop with penalties differs from model.generate with them"
    assert torch.equal(spec, reference), "speculation with penalties differs from the plain loop"
    assert not torch.equal(reference, unpenalised), "these penalties change nothing: the test would be vacuous"
    assert sum(plain_stats.accepted) == plain_stats.steps  # the plain loop: one token a step
    assert sum(stats.accepted) > stats.steps, "speculation never accepted a token: the test would be vacuous"


def test_logit_bias_equals_transformers_sequence_bias():
    ids = prompt()
    free = hf_generate("llama", ids)[0, ids.shape[1]:]
    bias = {int(free[0]): -100.0, int(free[3]): -5.0, 17: 4.5, 40: 2.0}
    spec, stats = generated(SPECULATE, logit_bias=bias)
    plain, _ = generated(PLAIN, logit_bias=bias)
    reference = hf_generate("llama", ids, sequence_bias=[[[t], b] for t, b in bias.items()])
    assert torch.equal(plain, reference)
    assert torch.equal(spec, reference)
    assert not torch.equal(reference[0, ids.shape[1]:], free), "the bias changes nothing: vacuous"
    assert int(free[0]) not in reference[0, ids.shape[1]:].tolist()  # -100 bans a token in practice
    assert sum(stats.accepted) > stats.steps


def test_penalties_and_bias_together_beside_repetition_penalty():
    ids = prompt()
    bias = {5: 3.0, 9: -2.0}
    settings = dict(presence_penalty=-0.5, frequency_penalty=0.25, logit_bias=bias, repetition_penalty=1.2)
    spec, _ = generated(SPECULATE, **settings)
    plain, _ = generated(PLAIN, **settings)
    reference = hf_generate("llama", ids, repetition_penalty=1.2, logits_processor=LogitsProcessorList(
        [OutputPenalty(-0.5, 0.25, ids.shape[1]), LogitBias(bias)]))
    assert torch.equal(plain, reference)
    assert torch.equal(spec, reference)


def test_batch_counts_each_sequences_own_output():
    """Left-padded prompts of different lengths: each row's penalties count its own output only (the
    verifier rebinds the count's start to each prompt's own length), as each prompt alone decodes."""
    long, short = prompt(), prompt()[:, 5:]
    pad = long.shape[1] - short.shape[1]
    ids = torch.cat([long, torch.cat([torch.zeros((1, pad), dtype=torch.long), short], dim=1)])
    mask = torch.ones_like(ids)
    mask[1, :pad] = 0
    settings = dict(presence_penalty=-0.7, frequency_penalty=0.4)
    gen = LookaheadGenerator(model_for("llama"), config=SPECULATE)
    batch = gen.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=NO_EOS, **settings)
    alone_long, _ = generated(PLAIN, ids=long, **settings)
    alone_short, _ = generated(PLAIN, ids=short, **settings)
    assert torch.equal(batch[0, long.shape[1]:], alone_long[0, long.shape[1]:])
    assert torch.equal(batch[1, ids.shape[1]:], alone_short[0, short.shape[1]:])


def test_sampled_text_with_a_seed_is_the_same_with_speculation():
    settings = dict(do_sample=True, temperature=0.8, presence_penalty=-0.6, frequency_penalty=0.3,
                    logit_bias={11: 2.0})
    # a generator of its own for each run: torch's default one is also drawn by building the cached model
    spec, stats = generated(SPECULATE, generator=torch.Generator().manual_seed(3), **settings)
    plain, _ = generated(PLAIN, generator=torch.Generator().manual_seed(3), **settings)
    assert torch.equal(spec, plain)


@pytest.mark.parametrize("kwargs, named", [
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty=-2.01), "frequency_penalty"),
    (dict(frequency_penalty=float("nan")), "frequency_penalty"),
    (dict(presence_penalty="0.5"), "presence_penalty"),
    (dict(logit_bias={VOCAB: 1.0}), "logit_bias key"),
    (dict(logit_bias={-1: 1.0}), "logit_bias key"),
    (dict(logit_bias={"12": 1.0}), "logit_bias key"),
    (dict(logit_bias={12: 100.5}), "logit_bias[12]"),
    (dict(logit_bias=[(12, 1.0)]), "logit_bias must map"),
])
def test_bad_settings_are_refused_by_name(kwargs, named):
    gen = LookaheadGenerator(model_for("llama"), config=PLAIN)
    with pytest.raises(GenerateInputError, match=named.replace("[", r"\[")):
        gen.generate(prompt(), max_new_tokens=4, **kwargs)


def test_penalties_are_checked_on_construction():
    assert not Penalties().active and Penalties().processors(5) == []
    assert Penalties(logit_bias={3: -100, 4: 100}, vocab=VOCAB).active
    with pytest.raises(GenerateInputError, match=r"\[0, 96\)"):
        Penalties(logit_bias={96: 0.0}, vocab=VOCAB)


def test_numpy_numbers_are_taken():
    import numpy as np

    bias = {int(k): 3.0 for k in (5, 9)}
    with_numpy, _ = generated(PLAIN, presence_penalty=np.float32(-0.5), frequency_penalty=np.float64(0.25),
                              logit_bias={np.int64(k): np.float32(v) for k, v in bias.items()})
    plain, _ = generated(PLAIN, presence_penalty=-0.5, frequency_penalty=0.25, logit_bias=bias)
    assert torch.equal(with_numpy, plain)
