"""Structured output (call/grammar.py, verify/grammar.py, proposers/grammar.py): a grammar masks every row
of the token tree with the grammar's state after that row's own path, so greedy output with speculation
equals the constrained plain loop and model.generate with the same mask, token for token; the output
is JSON valid for the schema once the grammar ends it; bad schemas are refused by name."""

from __future__ import annotations

import functools
import json
import sys

import numpy as np
import pytest
import torch
from transformers.generation import LogitsProcessorList

from conftest import tiny_model, tiny_tokenizer
from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.call.grammar import GrammarInputError, Grammars
from lookahead.call.processing import process_rows
from lookahead.verify.grammar import GrammarMask, constrained

pytest.importorskip("xgrammar")

NEW = 60
EOS = 2  # the tiny tokenizer's </s>
SPECULATE = LookaheadConfig(window=3, ngram=3, candidates=4, match_min=1, match_length=6, budget="fixed")
PLAIN = LookaheadConfig(window=1, ngram=2, candidates=0)
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "kind", "tags"],
          "properties": {"ok": {"type": "boolean"}, "kind": {"enum": ["red", "blue", "green"]},
                         "tags": {"type": "array", "items": {"enum": ["x", "yy"]}, "maxItems": 3}}}


@functools.lru_cache(maxsize=None)
def model():
    return tiny_model("llama")


@functools.lru_cache(maxsize=None)
def tokenizer():
    return tiny_tokenizer()


def prompt() -> torch.Tensor:
    text = '{"ok":true,"kind":"blue","tags":["x"]}{"ok":false,"kind":"red","tags":[]}{"ok":'
    return torch.tensor([tokenizer()(text, add_special_tokens=False).input_ids])


def generated(config: LookaheadConfig, response_format=SCHEMA, **kwargs):
    gen = LookaheadGenerator(model(), tokenizer(), config)
    out = gen.generate(prompt(), max_new_tokens=NEW, eos_token_id=EOS, response_format=response_format, **kwargs)
    return out, gen.last_stats


def text_of(out: torch.Tensor) -> str:
    new = out[0, prompt().shape[1]:].tolist()
    assert new[-1] == EOS, "the output did not end by the grammar: nothing to parse"
    return tokenizer().decode(new[:-1])


def mask_for(response_format, start: int) -> GrammarMask:
    grammar = Grammars(tokenizer(), model().config.vocab_size).compile(response_format)
    return GrammarMask(grammar, [EOS], start)


def test_constrained_greedy_with_speculation_equals_plain_loop_and_generate():
    ids = prompt()
    spec, stats = generated(SPECULATE)
    plain, plain_stats = generated(PLAIN)
    with torch.inference_mode():
        reference = model().generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False,
                                     eos_token_id=EOS,
                                     logits_processor=LogitsProcessorList([mask_for(SCHEMA, ids.shape[1])]))
        free = model().generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False,
                                eos_token_id=EOS)
    assert torch.equal(plain, reference), "the constrained plain loop differs from model.generate with the mask"
    assert torch.equal(spec, reference), "constrained speculation differs from the constrained plain loop"
    assert not torch.equal(free, reference), "the grammar changes nothing: the test would be vacuous"
    value = json.loads(text_of(spec))
    assert set(value) == {"ok", "kind", "tags"} and isinstance(value["ok"], bool) and value["kind"] in SCHEMA[
        "properties"]["kind"]["enum"] and all(tag in ("x", "yy") for tag in value["tags"]) and len(value["tags"]) <= 3
    assert sum(plain_stats.accepted) == plain_stats.steps  # the plain loop: one token a step
    assert sum(stats.accepted) > stats.steps, "speculation never accepted a token: the test would be vacuous"


def test_json_object_output_is_an_object():
    out, _ = generated(SPECULATE, "json_object")
    new = out[0, prompt().shape[1]:].tolist()
    free, _ = generated(SPECULATE, None)
    assert tokenizer().decode(new[:1]) == "{"  # an object, whatever the model would have said
    assert tokenizer().decode(free[0, prompt().shape[1]:][:1]) != "{", "the model says '{' anyway: vacuous"
    assert mask_for("json_object", 0).follower.goto(new), "the output left the grammar of a JSON object"
    assert not mask_for("json_object", 0).follower.goto(free[0, prompt().shape[1]:].tolist())


def test_sampled_constrained_output_keeps_the_grammar():
    for seed in range(3):
        out, _ = generated(SPECULATE, do_sample=True, temperature=1.5, generator=torch.Generator().manual_seed(seed))
        value = json.loads(text_of(out))
        assert value["kind"] in ("red", "blue", "green") and isinstance(value["ok"], bool)


def test_the_mask_follows_each_rows_own_path():
    """A hand-built tree: x, then two branches; every row is masked by its own path (after the prompt)."""
    tok = tokenizer()
    start = 3
    seq = np.array([7, 8, 9, *tok('{"ok":', add_special_tokens=False).input_ids], dtype=np.int64)  # prompt + output
    t, f, comma = (tok.convert_tokens_to_ids(c) for c in "tf,")
    r = tok.convert_tokens_to_ids("r")
    paths = np.array([[0, 0], [t, 0], [f, 0], [t, r], [comma, 0]], dtype=np.int64)  # [R, D] x's row first
    depths = np.array([0, 1, 1, 2, 1])
    mask = mask_for(SCHEMA, start)
    decoding = constrained(generated_decoding(), mask.grammar, start)
    scores = process_rows(decoding, torch.zeros(5, model().config.vocab_size), seq, len(seq), paths, depths)
    allowed = [set(torch.nonzero(row == 0).flatten().tolist()) for row in scores]
    letter = tok.convert_tokens_to_ids
    assert allowed[0] == {t, f}  # after '{"ok":' a boolean begins
    assert allowed[1] == {r}  # 't' -> 'r'
    assert allowed[2] == {letter("a")}  # 'f' -> 'a'
    assert allowed[3] == {letter("u")}  # 'tr' -> 'u'
    assert len(allowed[4]) == model().config.vocab_size  # ',' is refused at its parent: never accepted, unmasked
    assert torch.isinf(scores[0]).sum() == model().config.vocab_size - 2


def generated_decoding():
    from lookahead.call.decoding import resolve_decoding
    return resolve_decoding(model(), prompt().shape[1], torch.device("cpu"), max_new_tokens=NEW, eos_token_id=EOS)


@pytest.mark.parametrize("schema, words", [
    ({"type": "objec"}, "no JSON schema type"),
    ("json", "JSON schema"),
    ({"type": "object", "properties": []}, "properties must map"),
    ({"type": "object", "required": "a"}, "required must be a list"),
])
def test_bad_schemas_are_refused_by_name(schema, words):
    with pytest.raises(GrammarInputError, match=words) as info:
        generated(PLAIN, schema)
    assert info.value.field.startswith("response_format")


def test_a_constraint_needs_an_eos_inside_the_vocabulary():
    gen = LookaheadGenerator(model(), tokenizer(), PLAIN)
    with pytest.raises(GrammarInputError, match="end-of-sequence"):
        gen.generate(prompt(), max_new_tokens=4, eos_token_id=[10_000], response_format=SCHEMA)


ONLY_GRAMMAR = LookaheadConfig(window=1, ngram=2, candidates=4, context_match=False, ngram_pool=False, recycle=False,
                               memory_tokens=0, budget="fixed")  # the grammar's forced tokens are the only source


def forced_source():
    from lookahead.proposers.grammar import ForcedTokens
    mask = mask_for(SCHEMA, 0)
    return ForcedTokens(mask.grammar, [EOS], 40)


def proposed(source, seq: np.ndarray, prompt_len: int) -> str:
    source.begin(seq, prompt_len)
    cands = source.propose(seq, len(seq), 4, np.zeros((2, 40)))
    return tokenizer().decode(cands.tokens[0, :cands.lens[0]]) if cands.count else ""


def test_forced_tokens_are_what_the_grammar_forces():
    tok = tokenizer()
    ids = lambda text: np.array([5, 6, *tok(text, add_special_tokens=False).input_ids], dtype=np.int64)  # noqa: E731
    assert proposed(forced_source(), ids(""), 2) == '{"ok":'
    assert proposed(forced_source(), ids('{"ok":t'), 2) == 'rue,"kind":"'
    assert proposed(forced_source(), ids('{"ok":false,"kind":"b'), 2) == 'lue","tags":['
    assert proposed(forced_source(), ids('{"ok":false,"kind":"'), 2) == ""  # a choice: red, blue or green
    assert proposed(forced_source(), ids('{"ok":true,"kind":"red","tags":["x","x","x"]}'), 2) == tok.decode([EOS])


def test_forced_tokens_speed_up_the_constrained_decode_and_change_nothing():
    plain, _ = generated(PLAIN)
    forced, stats = generated(ONLY_GRAMMAR)
    assert torch.equal(forced, plain)
    assert sum(stats.accepted) >= 2 * stats.steps, "the forced tokens were not accepted in long runs"


def test_sampled_constrained_text_with_a_seed_is_the_same_with_speculation():
    for seed in range(2):
        settings = dict(do_sample=True, temperature=1.3)
        # a generator of its own for each run: torch's default one is also drawn by building the cached model
        spec, _ = generated(SPECULATE, generator=torch.Generator().manual_seed(seed), **settings)
        plain, _ = generated(PLAIN, generator=torch.Generator().manual_seed(seed), **settings)
        assert torch.equal(spec, plain)


def test_a_batch_constrains_each_sequence_by_its_own_output():
    """Left-padded prompts of different lengths: each row's grammar follows its own output (the verifier
    gives each sequence a matcher of its own, from its own prompt length), as each prompt alone decodes."""
    long, short = prompt(), torch.randint(3, 96, (1, 9), generator=torch.Generator().manual_seed(2))
    pad = long.shape[1] - short.shape[1]
    ids = torch.cat([long, torch.cat([torch.zeros((1, pad), dtype=torch.long), short], dim=1)])
    mask = torch.ones_like(ids)
    mask[1, :pad] = 0
    gen = LookaheadGenerator(model(), tokenizer(), SPECULATE)
    batch = gen.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=EOS, response_format=SCHEMA)
    alones = []
    for row, alone_prompt in enumerate((long, short)):
        alone = LookaheadGenerator(model(), tokenizer(), PLAIN).generate(
            alone_prompt, max_new_tokens=NEW, eos_token_id=EOS, response_format=SCHEMA)[0, alone_prompt.shape[1]:]
        got = batch[row, ids.shape[1]:][:alone.shape[0]]
        assert torch.equal(got, alone), f"row {row} differs from its prompt decoded alone"
        alones.append(alone.tolist())
    assert alones[0] != alones[1], "both prompts give the same output: a shared matcher would go unseen"


def test_without_the_grammar_engine_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # (import xgrammar now raises ImportError)
    with pytest.raises(GrammarInputError, match=r"lookahead-lm\[grammar\]"):
        Grammars(tokenizer(), model().config.vocab_size).compile(SCHEMA)


@pytest.mark.parametrize("settings", [dict(top_k=5), dict(top_p=0.9), dict(top_k=3, top_p=0.5, min_p=0.05)])
def test_sampling_warpers_after_the_mask_keep_the_grammar(settings):
    """The warpers see the masked scores: top-k / top-p never bring back a token the grammar forbids, even
    where it allows fewer tokens than k."""
    for seed in range(2):
        out, _ = generated(SPECULATE, do_sample=True, temperature=1.2, generator=torch.Generator().manual_seed(seed),
                           **settings)
        value = json.loads(text_of(out))
        assert value["kind"] in ("red", "blue", "green") and isinstance(value["ok"], bool)


def test_free_and_constrained_calls_share_one_generator():
    """A generator answers a free call, then a constrained one, then a free one again (the server's case):
    every call has the forced-token source's place (inert without a grammar), so the estimate table the
    earlier calls made fits the later ones; each output is what a fresh generator gives."""
    gen = LookaheadGenerator(model(), tokenizer(), SPECULATE)
    free = gen.generate(prompt(), max_new_tokens=NEW, eos_token_id=EOS)
    constrained = gen.generate(prompt(), max_new_tokens=NEW, eos_token_id=EOS, response_format=SCHEMA)
    again = gen.generate(prompt(), max_new_tokens=NEW, eos_token_id=EOS)
    assert torch.equal(free, again)
    assert torch.equal(constrained, generated(SPECULATE)[0])
    assert not torch.equal(free, constrained)  # (the grammar changed the output: the comparison is not vacuous)
