"""Streaming and stopping: every criterion model.generate honours stops lookahead on the same token,
also in the middle of a multi-token step, and streamers receive exactly the kept tokens in order.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer, TextStreamer
from transformers.generation.stopping_criteria import StopStringCriteria
from transformers.generation.streamers import BaseStreamer

from conftest import VOCAB, tiny_model, tiny_tokenizer
from lookahead import CustomGenerate, GenerateInputError, LookaheadConfig, LookaheadGenerator, LookaheadOutput
from lookahead.call.stopping import _per_token, _stop_strings, first_hit, split_criteria

NEW = 40
NO_EOS = [VOCAB + 1000]
WIDE = LookaheadConfig(window=3, ngram=3, candidates=4, match_min=1, match_length=6,
                      budget="fixed")  # long accepted steps; fixed: the same steps on every machine


def prompts() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1234)
    motif = torch.randint(3, VOCAB, (6,), generator=gen)
    return {"repeat": torch.cat([motif, motif, motif, motif[:4]])[None],
            "random": torch.randint(3, VOCAB, (17,), generator=gen)[None],
            "single": torch.tensor([[40]])}


PROMPTS = prompts()


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def reference(model, ids, **kwargs):
    """model.generate greedy with the same settings."""
    with torch.inference_mode():
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, **kwargs)


def inside_steps(accepted: list[int]) -> list[int]:
    """0-based indices of new tokens that are not the last of their (multi-token) step."""
    bounds = np.cumsum([0] + accepted)
    return [i for begin, end in zip(bounds[:-1], bounds[1:]) for i in range(begin, end - 1)]


def mid_step_cases(model, ids, config=WIDE, limit=3) -> tuple[torch.Tensor, list[int]]:
    """The free-running output and up to ``limit`` indices inside multi-token steps."""
    gen = LookaheadGenerator(model, config=config)
    out = gen.generate(ids, max_new_tokens=NEW, do_sample=False, eos_token_id=NO_EOS)
    inside = inside_steps(gen.last_stats.accepted)
    assert inside, "no multi-token step: the test would be vacuous"
    return out, inside[:limit]


class AtLength(StoppingCriteria):
    """Fires once the sequence holds ``length`` tokens; records every call (length, last token, scores)."""

    def __init__(self, length: int):
        self.length = length
        self.calls = []

    def __call__(self, input_ids, scores, **kwargs):
        self.calls.append((input_ids.shape[1], int(input_ids[0, -1]), scores))
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.length, dtype=torch.bool)


class Recorder(BaseStreamer):
    """Keeps every put() and counts end()."""

    def __init__(self):
        self.puts, self.ends = [], 0

    def put(self, value):
        self.puts.append(value.reshape(-1).tolist())

    def end(self):
        self.ends += 1


# --------------------------------------------------------- stopping criteria
@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2"])
def test_criterion_firing_mid_step_cuts_exactly_there(arch):
    model = tiny_model(arch)
    ids = PROMPTS["repeat"]
    _, inside = mid_step_cases(model, ids)
    gen = LookaheadGenerator(model, config=WIDE)
    for i in inside:
        length = ids.shape[1] + i + 1
        ours, theirs = AtLength(length), AtLength(length)
        got = gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS, stopping_criteria=[ours])
        ref = reference(model, ids, max_new_tokens=NEW, eos_token_id=NO_EOS,
                        stopping_criteria=StoppingCriteriaList([theirs]))
        assert torch.equal(got, ref) and got.shape[1] == length
        assert ours.calls == theirs.calls  # once per token, in order, with that token's prefix (scores None)


def test_criterion_through_custom_generate(model):
    ids = PROMPTS["repeat"]
    _, inside = mid_step_cases(model, ids)
    length = ids.shape[1] + inside[0] + 1
    ref = reference(model, ids, max_new_tokens=NEW, eos_token_id=NO_EOS,
                    stopping_criteria=StoppingCriteriaList([AtLength(length)]))
    with torch.inference_mode():
        got = model.generate(ids, max_new_tokens=NEW, do_sample=False, eos_token_id=NO_EOS,
                             stopping_criteria=StoppingCriteriaList([AtLength(length)]),
                             custom_generate=CustomGenerate(), lookahead_config=WIDE)
    assert torch.equal(got, ref) and got.shape[1] == length


def _fresh_stop_string(tokenizer, ids: torch.Tensor, out: torch.Tensor, inside: list[int]):
    """(index, string): a two-character stop string ending at new token i (inside a step), found nowhere
    earlier in prompt + output, so the stop must fall exactly on i."""
    chars = [tokenizer.convert_ids_to_tokens(t) for t in out[0].tolist()]
    start = ids.shape[1]
    for i in inside:
        pair = chars[start + i - 1:start + i + 1]
        if i == 0 or any(len(c) != 1 for c in pair):
            continue
        text = "".join(chars[:start + i + 1])
        if text.find("".join(pair)) == len(text) - 2:
            return i, "".join(pair)
    return None


@pytest.mark.parametrize("prompt", ["repeat", "random"])
def test_stop_strings_mid_step(model, tokenizer, prompt):
    ids = PROMPTS[prompt]
    out, inside = mid_step_cases(model, ids, limit=NEW)
    found = _fresh_stop_string(tokenizer, ids, out, inside)
    assert found, "no fresh character pair inside a step to stop on"
    i, stop = found
    ref = reference(model, ids, max_new_tokens=NEW, eos_token_id=NO_EOS, stop_strings=stop, tokenizer=tokenizer)
    assert ref.shape[1] == ids.shape[1] + i + 1
    gen = LookaheadGenerator(model, tokenizer, config=WIDE)
    assert torch.equal(gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS, stop_strings=stop), ref)
    config = GenerationConfig(max_new_tokens=NEW, do_sample=False, eos_token_id=NO_EOS, stop_strings=[stop])
    assert torch.equal(gen.generate(ids, generation_config=config), ref)  # from a generation_config too
    with torch.inference_mode():
        hf = model.generate(ids, max_new_tokens=NEW, do_sample=False, eos_token_id=NO_EOS, stop_strings=stop,
                            custom_generate=CustomGenerate(), lookahead_config=WIDE, lookahead_tokenizer=tokenizer)
    assert torch.equal(hf, ref)


def test_stop_string_longer_than_the_prefix(model, tokenizer):
    """A one-token prompt: the first prefixes are shorter than the stop string (asked one by one)."""
    ids = PROMPTS["single"]
    full = LookaheadGenerator(model, config=WIDE).generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS)
    chars = tokenizer.convert_ids_to_tokens(full[0].tolist())
    stop = "".join(chars[:4])
    if any(len(c) != 1 for c in chars[:4]):
        pytest.skip("special token among the first characters")
    ref = reference(model, ids, max_new_tokens=NEW, eos_token_id=NO_EOS, stop_strings=stop, tokenizer=tokenizer)
    got = LookaheadGenerator(model, tokenizer, config=WIDE).generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS,
                                                                     stop_strings=stop)
    assert torch.equal(got, ref) and got.shape[1] == 4


def test_batched_stop_strings_equal_asking_token_by_token(tokenizer):
    """The batched evaluation over a step's tails is the per-prefix evaluation (random sequences)."""
    criterion = StopStringCriteria(tokenizer, ["ab", "xyz", "q"])
    vocab = tokenizer.get_vocab()
    letters = np.array([vocab[c] for c in "abxyzq"] + [vocab["!"]])
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(200):
        seq = rng.choice(letters, size=rng.integers(2, 12))
        start = int(rng.integers(0, seq.shape[0] - 1))
        ids = torch.from_numpy(seq)[None]
        count = seq.shape[0] - start
        want = _per_token(criterion, ids, start, count)
        assert _stop_strings(criterion, seq, ids, start, count) == want
        hits += want < count
    assert hits > 20


def test_split_criteria_reads_length_and_eos(model):
    config = GenerationConfig(max_length=30, eos_token_id=[5, 9], max_time=3.0)
    model._prepare_special_tokens(config, True, device="cpu")
    criteria = model._get_stopping_criteria(generation_config=config, stopping_criteria=StoppingCriteriaList())
    limit, eos, rest = split_criteria(criteria, 12)
    assert limit == 18 and eos.tolist() == [5, 9] and [type(c).__name__ for c in rest] == ["MaxTimeCriteria"]


def test_first_hit_without_criteria_or_tokens():
    seq = np.arange(6)
    assert first_hit((), seq, 3, 6, "cpu") is None
    assert first_hit((AtLength(1),), seq, 6, 6, "cpu") is None


# ------------------------------------------------------------------- max_time
def first_step_accepts_several(model, gen: LookaheadGenerator) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt, free output): the prompt + a prefix of the model's own looping output, so that the very
    first step accepts several tokens."""
    base = gen.generate(PROMPTS["repeat"], max_new_tokens=NEW, eos_token_id=NO_EOS)
    for cut in range(PROMPTS["repeat"].shape[1] + 2, base.shape[1] - 4):
        ids = base[:, :cut]
        free = gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS)
        if gen.last_stats.accepted[0] > 1:
            return ids, free
    raise AssertionError("no prompt whose first step accepts several tokens")


def test_max_time_zero_stops_after_one_token(model):
    """max_time=0 expires before the first token is checked: model.generate keeps that one token,
    and so must lookahead although its first step accepted several."""
    gen = LookaheadGenerator(model, config=WIDE)
    ids, free = first_step_accepts_several(model, gen)
    got = gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS, max_time=0.0)
    ref = reference(model, ids, max_new_tokens=NEW, eos_token_id=NO_EOS, max_time=0.0)
    assert torch.equal(got, ref) and got.shape[1] == ids.shape[1] + 1
    with torch.inference_mode():
        hf = model.generate(ids, max_new_tokens=NEW, do_sample=False, eos_token_id=NO_EOS, max_time=0.0,
                            custom_generate=CustomGenerate(), lookahead_config=WIDE)
    assert torch.equal(hf, ref)
    roomy = gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS, max_time=1e6)
    assert torch.equal(roomy, free)


# ------------------------------------------------------------------ streamers
def test_streamer_gets_the_prompt_then_every_kept_token_in_order(model):
    ids = PROMPTS["repeat"]
    _, inside = mid_step_cases(model, ids)
    length = ids.shape[1] + inside[-1] + 1
    gen = LookaheadGenerator(model, config=WIDE)
    for criteria in ([], [AtLength(length)]):
        rec = Recorder()
        out = gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS, streamer=rec, stopping_criteria=criteria)
        assert rec.puts[0] == ids[0].tolist() and rec.ends == 1
        assert sum(rec.puts[1:], []) == out[0, ids.shape[1]:].tolist()
        assert max(len(p) for p in rec.puts[1:]) > 1  # multi-token steps arrive as they are accepted


def test_custom_generate_streams_through_lookahead_streamer(model):
    ids = PROMPTS["repeat"]
    rec = Recorder()
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=NEW, do_sample=False, eos_token_id=NO_EOS,
                             custom_generate=CustomGenerate(), lookahead_streamer=rec)
    assert rec.puts[0] == ids[0].tolist() and rec.ends == 1  # the prompt once, then the tokens
    assert sum(rec.puts[1:], []) == out[0, ids.shape[1]:].tolist()


def test_text_streamers_print_exactly_the_generated_text(model, tokenizer, capsys):
    ids = PROMPTS["repeat"]
    gen = LookaheadGenerator(model, tokenizer, config=WIDE)
    out = gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS,
                       streamer=TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True))
    text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert capsys.readouterr().out == text + "\n"
    callers = {  # our API, and model.generate through custom_generate
        "ours": lambda streamer: gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS, streamer=streamer),
        "hf": lambda streamer: model.generate(ids, max_new_tokens=NEW, do_sample=False, eos_token_id=NO_EOS,
                                              custom_generate=CustomGenerate(), lookahead_config=WIDE,
                                              lookahead_streamer=streamer)}
    for name, call in callers.items():
        streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True, timeout=60)
        result = {}
        worker = threading.Thread(target=lambda: result.update(out=call(streamer)))
        worker.start()
        received = "".join(streamer)
        worker.join()
        assert received == tokenizer.decode(result["out"][0, ids.shape[1]:], skip_special_tokens=True) == text, name


# --------------------------------------------------------- return / refusals
def test_return_dict_in_generate(model):
    ids = PROMPTS["repeat"]
    gen = LookaheadGenerator(model)
    plain_out = gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS)
    out = gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS, return_dict_in_generate=True)
    assert isinstance(out, LookaheadOutput) and torch.equal(out.sequences, plain_out)
    assert out.stats is gen.last_stats and out.stats.new_tokens == NEW


@pytest.mark.parametrize("kwargs, words", [
    (dict(stop_strings="ab"), "stop_strings need the tokenizer"),
    (dict(stop_strings=""), "stop_strings must be a non-empty string"),
    (dict(max_time=-1.0), "max_time must be >= 0"),
    (dict(max_time="soon"), "max_time must be a number"),
    (dict(stopping_criteria=[3]), "stopping_criteria must be a list"),
    (dict(return_dict_in_generate="yes"), "return_dict_in_generate must be True or False"),
    (dict(return_dict_in_generate=True, output_scores=True), "output_scores"),
    (dict(num_beams=3), "beam search"),
])
def test_bad_stopping_inputs_are_named(model, kwargs, words):
    gen = LookaheadGenerator(model)
    if "output_scores" in kwargs or "num_beams" in kwargs:
        config = GenerationConfig(**{k: v for k, v in kwargs.items() if k != "return_dict_in_generate"})
        kwargs = {k: v for k, v in kwargs.items() if k == "return_dict_in_generate"} | {"generation_config": config}
    with pytest.raises(GenerateInputError, match=words):
        gen.generate(PROMPTS["repeat"], max_new_tokens=4, **kwargs)
