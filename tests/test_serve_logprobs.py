"""The server's logprobs, penalties and logit_bias (lookahead/serve/scoring.py), through the real server on a
loopback port and the real openai client: chat ``logprobs`` / ``top_logprobs`` and completions ``logprobs``
in OpenAI's shapes, streamed and not, equal to the log-softmax of the model's own logits over the answer;
greedy answers with penalties and logit_bias equal model.generate with the same processors; every bad
value is a 400 naming the field."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch
from conftest import VOCAB, tiny_model, tiny_tokenizer
from test_serve import ServerThread
from transformers.generation import LogitsProcessorList

from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.serve.app import create_app
from lookahead.serve.engine import Engine
from lookahead.verify.penalties import OutputPenalty

MODEL = "tiny-llama"
# The tiny tokenizer has one token per printable character from '!' to '}' (tests/test_serve.py's template).
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
WAIT_S = 20.0  # the longest any bounded wait in this file waits
MESSAGES = [{"role": "user", "content": "abcabcabcabc"}]
NEW = 24
ATOL = 1e-5  # the server's rows run in other step shapes than the direct forward: float32 rounding apart


@pytest.fixture(scope="module")
def served():
    model = tiny_model("llama")
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = TEMPLATE
    engine = Engine(LookaheadGenerator(model, tokenizer, LookaheadConfig()), max_batch=2)
    engine.start()
    server = ServerThread(create_app(engine, MODEL, stop_engine=True)).start()
    yield {"url": server.url, "model": model, "tokenizer": tokenizer}
    server.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served["url"] + "/v1", api_key="none", max_retries=0, timeout=WAIT_S)


@pytest.fixture(scope="module")
def http(served):
    with httpx.Client(base_url=served["url"], timeout=WAIT_S) as c:
        yield c


def chat_ids(served) -> list[int]:
    encoded = served["tokenizer"].apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                                      return_dict=True)
    return list(encoded["input_ids"])


def answer(served, ids: list[int], **kwargs) -> list[int]:
    """model.generate's greedy tokens after ``ids`` (EOS kept, as the logprobs count it)."""
    with torch.inference_mode():
        prompt = torch.tensor([ids])
        out = served["model"].generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW,
                                       do_sample=False, **kwargs)
    return out[0, len(ids):].tolist()


def direct(served, ids: list[int], new: list[int]) -> torch.Tensor:
    """log_softmax [n, V] of the model's logits at the rows that produced ``new`` after ``ids``."""
    with torch.inference_mode():
        logits = served["model"](torch.tensor([ids + new])).logits[0, len(ids) - 1:-1].float()
    return torch.log_softmax(logits, dim=-1)


def text_of(served, token: int) -> str:
    return served["tokenizer"].decode([token], skip_special_tokens=False, clean_up_tokenization_spaces=False)


def check_chat_entries(served, entries, ids: list[int], top: int) -> None:
    """``choices[].logprobs.content`` entries against the model's greedy answer and its own logits."""
    new = answer(served, ids)
    expected = direct(served, ids, new)
    assert [e.token for e in entries] == [text_of(served, t) for t in new]
    for i, (entry, token) in enumerate(zip(entries, new)):
        assert entry.bytes == list(entry.token.encode("utf-8"))
        assert abs(entry.logprob - float(expected[i, token])) < ATOL
        values, index = expected[i].topk(top)
        assert [t.token for t in entry.top_logprobs] == [text_of(served, int(t)) for t in index]
        assert all(abs(t.logprob - float(v)) < ATOL for t, v in zip(entry.top_logprobs, values))


def test_chat_logprobs_in_openais_shape(served, client):
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=NEW, logprobs=True,
                                           top_logprobs=3)
    entries = reply.choices[0].logprobs.content
    assert len(entries) == reply.usage.completion_tokens
    check_chat_entries(served, entries, chat_ids(served), 3)


def test_chat_logprobs_streamed(served, client):
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=NEW, logprobs=True,
                                            top_logprobs=2, stream=True, stream_options={"include_usage": True})
    entries, usage, text = [], None, ""
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.logprobs is not None:
                entries.extend(choice.logprobs.content)
    assert usage is not None and len(entries) == usage.completion_tokens
    assert text == "".join(e.token for e in entries).replace("</s>", "")
    check_chat_entries(served, entries, chat_ids(served), 2)


def test_chat_logprobs_without_alternatives(served, client):
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, logprobs=True)
    entries = reply.choices[0].logprobs.content
    assert len(entries) == reply.usage.completion_tokens and all(e.top_logprobs == [] for e in entries)
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6)
    assert plain.choices[0].logprobs is None


def check_completion_logprobs(served, logprobs: dict, ids: list[int], top: int) -> None:
    new = answer(served, ids)
    expected = direct(served, ids, new)
    assert logprobs["tokens"] == [text_of(served, t) for t in new]
    offsets = [0]
    for token in logprobs["tokens"][:-1]:
        offsets.append(offsets[-1] + len(token))
    assert logprobs["text_offset"] == offsets
    for i, token in enumerate(new):
        assert abs(logprobs["token_logprobs"][i] - float(expected[i, token])) < ATOL
        values, index = expected[i].topk(top)
        alternatives = logprobs["top_logprobs"][i]
        assert list(alternatives) == [text_of(served, int(t)) for t in index]
        assert all(abs(alternatives[text_of(served, int(t))] - float(v)) < ATOL for t, v in zip(index, values))


def test_completion_logprobs_in_openais_shape(served, client):
    prompt = "abcabcabcab"
    ids = served["tokenizer"](prompt)["input_ids"]
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=NEW, logprobs=4)
    logprobs = reply.choices[0].logprobs.model_dump()
    assert len(logprobs["tokens"]) == reply.usage.completion_tokens
    check_completion_logprobs(served, logprobs, ids, 4)


def test_completion_logprobs_streamed(served, client):
    prompt = "abcabcabcab"
    ids = served["tokenizer"](prompt)["input_ids"]
    merged: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in client.completions.create(model=MODEL, prompt=prompt, max_tokens=NEW, logprobs=2, stream=True):
        for choice in chunk.choices:
            if choice.logprobs is not None:
                for name, values in choice.logprobs.model_dump().items():
                    merged[name].extend(values)
    check_completion_logprobs(served, merged, ids, 2)


@pytest.mark.parametrize("settings", [dict(presence_penalty=-0.8, frequency_penalty=0.6),
                                      dict(frequency_penalty=1.5), dict(presence_penalty=1.2)])
def test_penalties_give_generates_answer_with_the_same_processor(served, client, settings):
    ids = chat_ids(served)
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=NEW, logprobs=True,
                                           **settings)
    penalty = OutputPenalty(settings.get("presence_penalty", 0.0), settings.get("frequency_penalty", 0.0), len(ids))
    expected = answer(served, ids, logits_processor=LogitsProcessorList([penalty]))
    assert expected != answer(served, ids), "the penalties change nothing here: the test would be vacuous"
    assert [e.token for e in reply.choices[0].logprobs.content] == [text_of(served, t) for t in expected]


def test_logit_bias_gives_generates_answer_with_sequence_bias(served, client):
    ids = chat_ids(served)
    free = answer(served, ids)
    bias = {free[0]: -100.0, free[2]: -4.0, 40: 3.0}
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=NEW, logprobs=True,
                                           logit_bias={str(t): b for t, b in bias.items()})
    expected = answer(served, ids, sequence_bias=[[[t], b] for t, b in bias.items()])
    assert expected != free
    assert [e.token for e in reply.choices[0].logprobs.content] == [text_of(served, t) for t in expected]


CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@pytest.mark.parametrize("path, fields, param, words", [
    (CHAT, {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "[0, 20]"),
    (CHAT, {"logprobs": True, "top_logprobs": -1}, "top_logprobs", "[0, 20]"),
    (CHAT, {"logprobs": True, "top_logprobs": 2.5}, "top_logprobs", "integer"),
    (CHAT, {"top_logprobs": 3}, "top_logprobs", "\"logprobs\": true"),
    (CHAT, {"logprobs": 5}, "logprobs", "true or false"),
    (COMPLETIONS, {"logprobs": 21}, "logprobs", "[0, 20]"),
    (COMPLETIONS, {"logprobs": True}, "logprobs", "integer"),
    (CHAT, {"presence_penalty": 2.5}, "presence_penalty", "[-2, 2]"),
    (COMPLETIONS, {"frequency_penalty": -2.1}, "frequency_penalty", "[-2, 2]"),
    (CHAT, {"frequency_penalty": "1"}, "frequency_penalty", "[-2, 2]"),
    (CHAT, {"logit_bias": {str(VOCAB): 1}}, "logit_bias", f"[0, {VOCAB})"),
    (COMPLETIONS, {"logit_bias": {"abc": 1}}, "logit_bias", "no token id"),
    (CHAT, {"logit_bias": {"-3": 1}}, "logit_bias", "no token id"),
    (CHAT, {"logit_bias": {"5": 101}}, "logit_bias", "[-100, 100]"),
    (COMPLETIONS, {"logit_bias": [5, 1]}, "logit_bias", "object"),
    (CHAT, {"n": 3}, "n", "1 to 2"),  # (n past the batch size of 2)
])
def test_bad_values_are_400_naming_the_field(http, path, fields, param, words):
    body = {"messages": MESSAGES} if path == CHAT else {"prompt": "abc"}
    response = http.post(path, json={**body, "max_tokens": 2, **fields})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_a_stop_string_ends_the_logprobs_with_the_tokens_usage_counts(served, client):
    prompt = "abcabcabcab"
    ids = served["tokenizer"](prompt)["input_ids"]
    free = [text_of(served, t) for t in answer(served, ids)]
    at = next(i for i in range(3, len(free)) if free[i] not in free[:i] and len(free[i]) == 1)
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=NEW, logprobs=1, stop=free[at])
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and choice.text == "".join(free[:at])
    assert choice.logprobs.tokens == free[:at + 1]  # the stop string's token included, as usage counts it
    assert reply.usage.completion_tokens == at + 1
