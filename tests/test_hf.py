"""model.generate(..., custom_generate=lookahead.custom_generate) and text-generation pipelines.

The callable decodes with the generation settings transformers prepared
(greedy or sampling, processors, stopping criteria): its output must equal
plain model.generate (greedy) and our own LookaheadGenerator, in fewer
forward passes than tokens.
"""

from __future__ import annotations

import gc
import weakref
from contextlib import contextmanager

import pytest
import torch
from transformers import DynamicCache, pipeline
from transformers.generation.utils import GenerateDecoderOnlyOutput

import lookahead
from lookahead.model.cache import cache_keyword
from conftest import ORIGINAL, VOCAB, tiny_model, tiny_tokenizer
from lookahead import (CustomGenerate, GenerateInputError, LookaheadConfig, LookaheadGenerator, LookaheadOutput,
                       custom_generate)

NEW = 40
NO_EOS = [VOCAB + 1000]  # an id that never occurs


def repeat_prompt() -> torch.Tensor:
    """A motif four times: the context matcher copies from it."""
    motif = torch.randint(3, VOCAB, (6,), generator=torch.Generator().manual_seed(1234))
    return torch.cat([motif, motif, motif, motif[:4]])[None]


PROMPT = repeat_prompt()


@contextmanager
def count_forwards(model):
    """Counts the model's forward calls in the block (a forward pre-hook): yields a one-item list."""
    calls = [0]

    def hook(module, args):
        calls[0] += 1

    handle = model.register_forward_pre_hook(hook)
    try:
        yield calls
    finally:
        handle.remove()


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def plain(model, ids=PROMPT, **kwargs):
    with torch.inference_mode():
        return model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)


def with_lookahead(model, ids=PROMPT, cg=custom_generate, **kwargs):
    return plain(model, ids, custom_generate=cg, **kwargs)


# The seven architectures main ran here; test_exactness.py proves every other tested one (the path
# behind custom_generate differs only in how the settings are prepared, not per architecture).
@pytest.mark.parametrize("arch", sorted(ORIGINAL))
def test_greedy_equals_generate_in_fewer_forwards(arch):
    model = tiny_model(arch)
    settings = dict(max_new_tokens=NEW, do_sample=False, eos_token_id=NO_EOS)
    ref = plain(model, **settings)
    cg = CustomGenerate()
    with_lookahead(model, cg=cg, **settings)  # the first call measures the cost curve (forwards of its own)
    with count_forwards(model) as calls:
        out = with_lookahead(model, cg=cg, **settings)
    assert torch.equal(out, ref)
    assert calls[0] < NEW, f"{calls[0]} forward passes for {NEW} tokens: no speculation was accepted"
    ours = LookaheadGenerator(model).generate(PROMPT, **settings)
    assert torch.equal(out, ours)


def test_the_exported_callable_and_no_attention_mask(model):
    """The module-level instance; a prompt passed without attention_mask (transformers hands None)."""
    assert isinstance(lookahead.custom_generate, CustomGenerate)
    with torch.inference_mode():
        ref = model.generate(PROMPT, max_new_tokens=NEW, do_sample=False, eos_token_id=NO_EOS)
        out = model.generate(PROMPT, max_new_tokens=NEW, do_sample=False, eos_token_id=NO_EOS,
                             custom_generate=lookahead.custom_generate)
    assert torch.equal(out, ref)


def test_output_is_an_ordinary_tensor(model):
    """Like model.generate's (called outside inference mode), the ids can be edited in place."""
    out = model.generate(PROMPT, max_new_tokens=4, do_sample=False, custom_generate=custom_generate)
    out[0, 0] = 5
    assert not out.is_inference()


def test_processors_are_applied_once(model):
    """transformers hands over its full processor list; applying it again would change the output."""
    settings = dict(max_new_tokens=NEW, do_sample=False, eos_token_id=NO_EOS, repetition_penalty=1.8,
                    no_repeat_ngram_size=3)
    ref = plain(model, **settings)
    assert not torch.equal(ref, plain(model, max_new_tokens=NEW, do_sample=False, eos_token_id=NO_EOS))
    assert torch.equal(with_lookahead(model, **settings), ref)


def test_generation_config_defaults_are_used(model):
    """max_new_tokens and EOS left out come from the model's generation_config, as in model.generate."""
    ref = plain(model)
    out = with_lookahead(model)
    assert torch.equal(out, ref)
    assert out.shape[1] <= PROMPT.shape[1] + 20


def test_sampling_is_reproducible_and_equals_our_api(model):
    settings = dict(max_new_tokens=NEW, do_sample=True, temperature=0.8, top_k=20, eos_token_id=NO_EOS)
    outs = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        outs.append(with_lookahead(model, **settings))
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(outs[0], outs[2])
    torch.manual_seed(0)
    ours = LookaheadGenerator(model).generate(PROMPT, **settings)
    assert torch.equal(outs[0], ours)


def test_lookahead_config_keyword(model):
    """lookahead_config reaches the generator: a plain config decodes one token per forward."""
    cg = CustomGenerate()
    out = with_lookahead(model, cg=cg, max_new_tokens=NEW, do_sample=False, eos_token_id=NO_EOS,
                         lookahead_config=LookaheadConfig(candidates=0), return_dict_in_generate=True)
    assert out.stats.steps == NEW
    assert torch.equal(out.sequences, plain(model, max_new_tokens=NEW, do_sample=False, eos_token_id=NO_EOS))


def test_learned_state_is_kept_per_model_without_keeping_it_alive():
    model = tiny_model("qwen2")
    cg = CustomGenerate()
    settings = dict(max_new_tokens=NEW, do_sample=False, eos_token_id=NO_EOS)
    with_lookahead(model, cg=cg, **settings)
    first = cg.generator(model)
    trials = first.acceptance["greedy"].trials.sum()
    with_lookahead(model, cg=cg, **settings)
    again = cg.generator(model)
    assert again.cost is first.cost and again.recycled is first.recycled  # not measured / learned anew
    assert again.acceptance["greedy"].trials.sum() > trials
    alive = weakref.ref(model)
    del model, first, again
    gc.collect()
    assert alive() is None, "the adapter keeps the model alive"


def test_return_dict_in_generate(model):
    settings = dict(max_new_tokens=NEW, do_sample=False, eos_token_id=NO_EOS)
    out = with_lookahead(model, return_dict_in_generate=True, **settings)
    assert isinstance(out, LookaheadOutput) and isinstance(out, GenerateDecoderOnlyOutput)
    assert torch.equal(out.sequences, plain(model, **settings))
    assert out.stats.new_tokens == NEW and out.stats.steps < NEW


@pytest.mark.parametrize("kwargs, words", [
    (dict(num_beams=2), "beam search"),
    (dict(num_return_sequences=2, do_sample=True), "num_return_sequences"),
    (dict(return_dict_in_generate=True, output_scores=True), "output_scores"),
    (dict(stop_strings="ab"), "lookahead_tokenizer"),
    (dict(lookahead_config={"window": 2}), "LookaheadConfig"),
])
def test_what_cannot_be_honoured_is_refused(model, kwargs, words):
    with pytest.raises((GenerateInputError, TypeError), match=words):
        with_lookahead(model, max_new_tokens=4, **kwargs)


def test_batches_run_and_caches_are_refused(model):
    """A batch through custom_generate: every row equals model.generate on that prompt alone."""
    settings = dict(max_new_tokens=8, do_sample=False, eos_token_id=NO_EOS)
    batch = with_lookahead(model, torch.cat([PROMPT, PROMPT.flip(1)]), **settings)
    assert torch.equal(batch[0], plain(model, PROMPT, **settings)[0])
    assert torch.equal(batch[1], plain(model, PROMPT.flip(1), **settings)[0])
    with pytest.raises(GenerateInputError, match="past_key_values / cache"):
        with_lookahead(model, max_new_tokens=4, **{cache_keyword(model): DynamicCache()})


# ------------------------------------------------------------------ pipelines
TEXT = "abcdefabcdefabcdefabcd"


@pytest.fixture(scope="module")
def pipe(model):
    return pipeline("text-generation", model=model, tokenizer=tiny_tokenizer(), device="cpu")


def test_pipeline_with_custom_generate(pipe, model):
    """Per call, or once for every call of a pipeline (a generate argument given at construction)."""
    settings = dict(max_new_tokens=NEW, do_sample=False, eos_token_id=NO_EOS, return_full_text=False)
    ref = pipe(TEXT, **settings)[0]["generated_text"]
    assert ref  # something was generated
    assert pipe(TEXT, custom_generate=custom_generate, **settings)[0]["generated_text"] == ref
    fast = pipeline("text-generation", model=model, tokenizer=pipe.tokenizer, device="cpu",
                    custom_generate=custom_generate)
    assert fast(TEXT, **settings)[0]["generated_text"] == ref
    torch.manual_seed(3)
    sampled = fast(TEXT, max_new_tokens=NEW, do_sample=True, return_full_text=False)[0]["generated_text"]
    torch.manual_seed(3)
    assert fast(TEXT, max_new_tokens=NEW, do_sample=True, return_full_text=False)[0]["generated_text"] == sampled


def test_pipeline_stop_sequence(pipe):
    """A pipeline's stop_sequence arrives as stop_strings; the tokenizer goes as lookahead_tokenizer."""
    settings = dict(max_new_tokens=NEW, do_sample=False, eos_token_id=NO_EOS, return_full_text=False)
    full = pipe(TEXT, **settings)[0]["generated_text"]
    stop = full[5:7]
    ref = pipe(TEXT, stop_sequence=stop, **settings)[0]["generated_text"]
    assert len(ref) < len(full)
    got = pipe(TEXT, stop_sequence=stop, custom_generate=custom_generate, lookahead_tokenizer=pipe.tokenizer,
               **settings)[0]["generated_text"]
    assert got == ref


def test_a_streamer_is_refused_with_what_to_pass_instead(model):
    """transformers pushes the prompt to streamer= and never hands it to the callable: refused, and ended
    so that a reader thread stops waiting."""
    from transformers import TextIteratorStreamer

    streamer = TextIteratorStreamer(tiny_tokenizer(), skip_prompt=True, timeout=60)  # not ended: queue.Empty
    with pytest.raises(GenerateInputError, match="pass lookahead_streamer=streamer to model.generate instead"):
        with_lookahead(model, max_new_tokens=4, streamer=streamer)
    assert "".join(streamer) == ""  # ended: iterating stops at once
