"""The first hour with the Python API (issue 36): each slip gets one clear line naming the fix.

- ``save_memory`` into a directory that does not exist: refused (MemoryFileError naming the path
  and the fix), nothing created, by the check ``--memory`` can share (``file.check_path``);
- saving leaves no ``<path>.lock`` beside the file;
- ``generate(ids, num_beams=2)`` and other keywords of ``model.generate`` lookahead does not take:
  refused by name with what it takes instead, beam search in the words custom_generate uses;
- a padded batch without ``attention_mask``: a PaddingWarning, as transformers warns.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from transformers import DynamicCache, GenerationConfig

import lookahead
from conftest import VOCAB, tiny_model
from lookahead import GenerateInputError, LookaheadConfig, LookaheadGenerator, MemoryFileError
from lookahead.call.inputs import padding_without_mask
from lookahead.errors import PaddingWarning
from lookahead.model.cache import cache_keyword
from lookahead.proposers.memory import file as memfile

NO_EOS = [VOCAB + 1000]  # an id that never occurs
PROMPT = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]])


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def gen(model):
    return LookaheadGenerator(model, config=LookaheadConfig(memory_tokens=4096))


def refusal(call) -> str:
    """The GenerateInputError's message of call()."""
    with pytest.raises(GenerateInputError) as caught:
        call()
    return str(caught.value)


# ---------------------------------------------------------------- save_memory's place
def test_saving_into_a_missing_directory_is_refused_and_nothing_is_created(gen, tmp_path):
    gen.generate(PROMPT, max_new_tokens=6, eos_token_id=NO_EOS)
    target = tmp_path / "absent" / "deeper" / "m.lkm"
    with pytest.raises(MemoryFileError) as caught:
        gen.save_memory(target)
    message = str(caught.value)
    assert str(target) in message and "does not exist" in message
    assert f"mkdir -p {target.parent}" in message and "pass a path in a directory you can write to" in message
    assert len(message.splitlines()) == 1
    assert os.listdir(tmp_path) == []  # no directory made, no lock file, no temporary


def test_the_place_check_is_one_check(tmp_path):
    """save_memory and --memory read the same check (file.check_path): a directory, a file in the
    way, a missing directory; a good place comes back with ~ expanded."""
    with pytest.raises(MemoryFileError, match="is a directory: pass a file path, e.g. .*memory.lkm"):
        memfile.check_path(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(MemoryFileError, match="is a file, not a directory"):
        memfile.check_path(blocker / "m.lkm")
    with pytest.raises(MemoryFileError, match="does not exist"):
        memfile.check_path(tmp_path / "no" / "m.lkm", reading=True)
    assert memfile.check_path(tmp_path / "m.lkm") == tmp_path / "m.lkm"
    assert memfile.check_path("~/m.lkm") == memfile.Path.home() / "m.lkm"


def test_saving_leaves_no_lock_file(gen, tmp_path):
    gen.generate(PROMPT, max_new_tokens=6, eos_token_id=NO_EOS)
    path = tmp_path / "m.lkm"
    gen.save_memory(path)
    gen.save_memory(path)  # again over the first
    assert os.listdir(tmp_path) == ["m.lkm"]
    gen.load_memory(path)


# ---------------------------------------------------------------- generate's keywords
def test_beam_search_is_refused_in_the_words_custom_generate_uses(gen, model):
    direct = refusal(lambda: gen.generate(PROMPT, max_new_tokens=4, num_beams=2))
    through = refusal(lambda: model.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=4,
                                             num_beams=2, custom_generate=lookahead.custom_generate))
    assert direct == through
    assert "beam search (num_beams=2)" in direct and "set num_beams=1" in direct
    assert "greedily or by sampling" in direct and len(direct.splitlines()) == 1


@pytest.mark.parametrize("kwargs, words", [
    (dict(tpo_k=5), "tpo_k: no such argument (did you mean top_k?), drop it"),
    (dict(colour=3), "colour: no such argument, drop it"),
    (dict(max_length=30), "max_length=30: pass max_new_tokens"),
    (dict(no_repeat_ngram_size=2), "generation_config=GenerationConfig(no_repeat_ngram_size=...)"),
    (dict(output_scores=True), "output_scores=True: lookahead returns the sequences and its stats only"),
    (dict(penalty_alpha=0.6), "penalty_alpha=0.6: a setting of another decoding strategy"),
    (dict(num_return_sequences=2), "num_return_sequences=2: lookahead returns one sequence per call"),
    (dict(assistant_model="draft"), "pass the draft model to LookaheadGenerator("),
    (dict(position_ids=torch.arange(1, 13)[None]), "position_ids other than 0..T-1"),
    (dict(inputs_embeds=torch.zeros(1, 12, 64)), "inputs_embeds: lookahead takes token ids, pass input_ids"),
])
def test_every_other_keyword_is_refused_by_name_with_what_to_do(gen, kwargs, words):
    message = refusal(lambda: gen.generate(PROMPT, max_new_tokens=4, **kwargs))
    assert words in message and len(message.splitlines()) == 1


def test_several_unknown_keywords_are_all_named(gen):
    message = refusal(lambda: gen.generate(PROMPT, max_new_tokens=4, tpo_p=0.9, colour=3))
    assert message.startswith("LookaheadGenerator.generate cannot honour tpo_p: no such argument (did you "
                              "mean top_p?), drop it; colour:")


def test_keywords_that_change_nothing_pass(gen, model):
    """use_cache, num_beams=1, default positions, output_* off, None: what model.generate code passes."""
    expected = gen.generate(PROMPT, max_new_tokens=6, eos_token_id=NO_EOS)
    got = gen.generate(PROMPT, max_new_tokens=6, eos_token_id=NO_EOS, use_cache=False, num_beams=1,
                       num_return_sequences=1, output_scores=False, position_ids=torch.arange(12)[None],
                       synced_gpus=False, colour=None)
    assert torch.equal(got, expected)


def test_the_suggested_generation_config_is_honoured(gen, model):
    """The fix the refusal names for a generation setting works: generation_config=GenerationConfig(...)."""
    with torch.inference_mode():
        reference = model.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=16,
                                   do_sample=False, no_repeat_ngram_size=2, eos_token_id=NO_EOS)
    got = gen.generate(PROMPT, max_new_tokens=16, eos_token_id=NO_EOS,
                       generation_config=GenerationConfig(no_repeat_ngram_size=2, do_sample=False))
    assert torch.equal(got, reference)


def test_a_cache_is_refused_in_the_same_words_both_ways(gen, model):
    cache = DynamicCache()
    with torch.inference_mode():
        model(PROMPT[:, :4], use_cache=True, **{cache_keyword(model): cache})  # a cache holding 4 tokens
    direct = refusal(lambda: gen.generate(PROMPT, max_new_tokens=4, past_key_values=cache))
    through = refusal(lambda: model.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=4,
                                             custom_generate=lookahead.custom_generate,
                                             **{cache_keyword(model): cache}))
    clause = "past_key_values / cache: lookahead keeps its own KV cache and can neither continue from nor fill yours"
    assert clause in direct and clause in through
    assert direct.startswith("LookaheadGenerator.generate cannot honour ")
    assert through.startswith("model.generate(..., custom_generate=lookahead.custom_generate) cannot honour ")


# ---------------------------------------------------------------- padding without a mask
def left_padded() -> torch.Tensor:
    """Two prompts, the second left-padded with the tiny models' pad token 0."""
    return torch.tensor([[5, 6, 7, 8, 9, 10], [0, 0, 0, 7, 8, 9]])


def test_a_padded_batch_without_a_mask_warns(gen):
    with pytest.warns(PaddingWarning, match="no attention_mask was given.*attention_mask=batch"):
        gen.generate(left_padded(), max_new_tokens=4, eos_token_id=NO_EOS)


def test_the_warning_names_the_cause_on_one_line(gen):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gen.generate(left_padded(), max_new_tokens=4, eos_token_id=NO_EOS)
    (warning,) = [w for w in caught if w.category is PaddingWarning]
    text = str(warning.message)
    assert len(text.splitlines()) == 1 and "pad token (0)" in text
    assert warning.filename == __file__  # points at the caller's line


def test_no_warning_with_a_mask_or_without_padding(gen):
    ids = left_padded()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PaddingWarning)
        gen.generate(ids, attention_mask=(ids != 0).long(), max_new_tokens=4, eos_token_id=NO_EOS)
        gen.generate(PROMPT, max_new_tokens=4, eos_token_id=NO_EOS)
        gen.generate(torch.cat([PROMPT, PROMPT.flip(1)]), max_new_tokens=4, eos_token_id=NO_EOS)


@pytest.mark.parametrize("ids, pad, bos, eos, padded", [
    ([[0, 0, 5, 6], [4, 5, 6, 7]], 0, None, None, True),  # left padding
    ([[4, 5, 0, 0], [4, 5, 6, 7]], 0, None, None, True),  # right padding
    ([[4, 5, 6, 7]], 0, None, None, False),
    ([[4, 5, 6, 7]], None, None, None, False),  # no pad token known
    ([[1, 5, 6, 7], [1, 1, 6, 7]], 1, 1, None, True),  # pad = BOS: a doubled BOS is padding
    ([[1, 5, 6, 7], [1, 4, 6, 7]], 1, 1, None, False),  # pad = BOS: one BOS is a prompt's start
    ([[4, 5, 6, 2]], 2, None, [2, 3], False),  # pad = EOS: a prompt may end with one
])
def test_what_looks_padded(ids, pad, bos, eos, padded):
    assert padding_without_mask(torch.tensor(ids), pad, bos, eos) is padded
