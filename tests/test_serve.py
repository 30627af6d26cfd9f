"""`lookahead serve`: the real server (uvicorn on 127.0.0.1, the real engine, a tiny random Llama with a
character-level tokenizer) talked to with the real openai client and httpx. Greedy answers equal
model.generate on the same prompt ids, streamed or not; usage; stop strings trimmed; every error in
OpenAI's shape; a client that disconnects cancels its request; the API key; /metrics parses; the
command stops cleanly on SIGTERM and SIGINT and saves its memory file.

A forward pre-hook on the model's embedding (``Fault``) slows the engine's steps, holds them, or fails a
request whose prompt holds a chosen token: the engine's own failure, queueing and cancel paths, seen
through HTTP."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest
import torch
import uvicorn
from click.testing import CliRunner

from conftest import reference, save_model_dir, tiny_model, tiny_tokenizer
from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.cli.main import main
from lookahead.serve.app import create_app
from lookahead.serve.engine import Engine
from lookahead.serve.text import IncrementalDecoder, ReplyText, StopScanner

MODEL = "tiny-llama"
KEY = "test-key-123"
CONTEXT = 1024  # the tiny models' max_position_embeddings
# No spaces: the tiny tokenizer has one token per printable character from '!' to '}' and none for ' '.
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
WAIT_S = 20.0  # the longest any bounded wait in this file waits
POLL_S = 0.02  # the pause between two looks of ``wait_until``


def wait_until(ready: Callable[[], bool], what: str, looks: int = int(WAIT_S / POLL_S)) -> None:
    """Look at ``ready`` up to ``looks`` times, POLL_S apart (a loop that ends by itself); fail naming
    ``what`` never happened. The test asserts the state reached, never how long it took."""
    for _ in range(looks):
        if ready():
            return
        time.sleep(POLL_S)
    pytest.fail(what)
SAMPLE = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_]+="[^"]*"(,[a-zA-Z_]+="[^"]*")*\})? (\S+)')  # Prometheus


class Fault:
    """A forward pre-hook on the embedding: ``delay`` seconds per forward, ``gate`` (cleared: every forward
    waits for it), ``fail_on`` (a token id: a forward over it raises)."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()  # a forward reached the hook while the gate was closed
        self.fail_on: int | None = None

    def __call__(self, module, args):
        ids = args[0]
        if self.fail_on is not None and bool((ids == self.fail_on).any()):
            raise RuntimeError("injected fault: token %d" % self.fail_on)
        if not self.gate.is_set():
            self.entered.set()
            self.gate.wait(WAIT_S)
        if self.delay:
            time.sleep(self.delay)


class ServerThread:
    """uvicorn serving ``app`` on a free loopback port, in a thread."""

    def __init__(self, app) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self) -> ServerThread:
        self.thread.start()
        wait_until(lambda: self.server.started or not self.thread.is_alive(), "the server did not start")
        assert self.thread.is_alive(), "the server thread ended before it started serving"
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive(), "the server did not stop"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One server for the module: (url, model, tokenizer, engine, fault, memory file); the memory file is
    written when it stops."""
    model = tiny_model("llama")
    fault = Fault()
    model.get_input_embeddings().register_forward_pre_hook(fault)
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = TEMPLATE
    memory = tmp_path_factory.mktemp("serve") / "memory.lkm"
    engine = Engine(LookaheadGenerator(model, tokenizer, LookaheadConfig()), max_batch=2, max_queue=2,
                    memory_path=str(memory))
    engine.start()
    server = ServerThread(create_app(engine, MODEL, api_key=KEY, stop_engine=True)).start()
    yield {"url": server.url, "model": model, "tokenizer": tokenizer, "engine": engine, "fault": fault,
           "memory": memory}
    server.stop()
    assert memory.is_file() and memory.stat().st_size > 0, "stopping the server saved no memory file"


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served["url"] + "/v1", api_key=KEY, max_retries=0, timeout=WAIT_S)


@pytest.fixture(scope="module")
def http(served):
    with httpx.Client(base_url=served["url"], headers={"Authorization": f"Bearer {KEY}"}, timeout=WAIT_S) as c:
        yield c


def greedy(served, ids: list[int], new: int) -> tuple[str, int, str]:
    """model.generate's answer on ``ids``: (text, new tokens, OpenAI finish reason)."""
    out = reference(served["model"], torch.tensor([ids]), new)[0, len(ids):].tolist()
    text = served["tokenizer"].decode(out, skip_special_tokens=True)
    return text, len(out), "stop" if len(out) < new else "length"


def chat_ids(served, messages: list[dict]) -> list[int]:
    encoded = served["tokenizer"].apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                      return_dict=True)
    return list(encoded["input_ids"])


def error_of(response: httpx.Response, status: int) -> dict:
    """The OpenAI-style error body of ``response``, checked for its status and shape."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def metrics(http: httpx.Client) -> dict[str, float]:
    """/metrics parsed (labels folded into the name); checks every sample has its HELP and TYPE first."""
    response = http.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    values, typed, helped = {}, {}, set()
    for line in response.text.splitlines():
        if line.startswith("# HELP "):
            helped.add(line.split()[2])
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            typed[name] = kind
        else:
            match = SAMPLE.fullmatch(line)
            assert match, f"not a Prometheus sample line: {line!r}"
            name = match.group(1)
            assert name in helped and name in typed, f"{name} has no HELP or TYPE before it"
            values[name + (match.group(2) or "")] = float(match.group(4))
    return values


# ------------------------------------------------------------------ answers


def test_chat_not_streamed_equals_generate_with_usage(served, client):
    messages = [{"role": "system", "content": "Be_brief."}, {"role": "user", "content": "Hello!"}]
    ids = chat_ids(served, messages)
    text, new, finish = greedy(served, ids, 24)
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24)
    assert reply.object == "chat.completion" and reply.model == MODEL and reply.id.startswith("chatcmpl-")
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == text and text
    assert reply.choices[0].finish_reason == finish
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == \
        (len(ids), new, len(ids) + new)


def test_chat_streamed_equals_generate_with_usage_chunk(served, client):
    messages = [{"role": "user", "content": [{"type": "text", "text": "Count:"}, {"type": "text", "text": "1,2,3"}]}]
    ids = chat_ids(served, [{"role": "user", "content": "Count:\n1,2,3"}])
    text, new, finish = greedy(served, ids, 30)
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=30, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [finish]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == new
    assert chunks[-1].usage.prompt_tokens == len(ids)
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_streamed_and_not_equal_generate(served, client):
    prompt = "def_f(x):return"
    ids = served["tokenizer"](prompt)["input_ids"]
    text, new, finish = greedy(served, ids, 20)
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=20)
    assert reply.object == "text_completion" and reply.choices[0].text == text
    assert reply.choices[0].finish_reason == finish
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(ids), new)
    streamed = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == text
    assert streamed[-1].choices[0].finish_reason == finish


def test_completions_default_max_tokens_is_sixteen(served, http):
    body = http.post("/v1/completions", json={"prompt": "abc"}).json()
    assert body["usage"]["completion_tokens"] <= 16
    assert body["choices"][0]["text"] == greedy(served, served["tokenizer"]("abc")["input_ids"], 16)[0]


def test_stop_strings_trimmed_streamed_and_not(served, client):
    prompt = "Once_upon"
    ids = served["tokenizer"](prompt)["input_ids"]
    text, _, _ = greedy(served, ids, 40)
    assert len(text) > 12, "the greedy answer is too short to place a stop string in"
    stop = text[8:10]
    expected = text[:text.find(stop)]
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, stop=stop)
    assert reply.choices[0].text == expected and reply.choices[0].finish_reason == "stop"
    stops = ["}}}}}", text[9:12]]  # a stop string that never appears, and one that does
    expected = text[:text.find(stops[1])]
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, stop=stops, stream=True))
    pieces = [c.choices[0].text for c in chunks]
    assert "".join(pieces) == expected and chunks[-1].choices[0].finish_reason == "stop"
    assert not any(stops[1] in piece for piece in pieces)
    messages = [{"role": "user", "content": prompt}]
    full, _, _ = greedy(served, chat_ids(served, messages), 40)
    assert len(full) > 10, "the greedy chat answer is too short to place a stop string in"
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40, stop=[full[6:8]])
    assert chat.choices[0].message.content == full[:full.find(full[6:8])]
    assert chat.choices[0].finish_reason == "stop"


def test_neutral_values_of_unsupported_fields_are_accepted(http):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "n": 1,
            "logprobs": False, "tools": [], "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {},
            "response_format": {"type": "text"}, "user": "u1", "temperature": 0, "top_p": 1.0, "seed": 7,
            "stream": False}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] <= 3


def test_sampled_with_a_seed_repeats(client):
    kwargs = dict(model=MODEL, prompt="abc", max_tokens=12, temperature=0.9, top_p=0.95, seed=11)
    first = client.completions.create(**kwargs).choices[0].text
    assert client.completions.create(**kwargs).choices[0].text == first


def test_models_health_and_metrics(served, client, http):
    client.completions.create(model=MODEL, prompt="abc", max_tokens=2)  # counted whichever tests ran before
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    assert httpx.get(served["url"] + "/health").json()["status"] == "ok"  # no key needed
    values = metrics(http)
    for name in ("requests_total", "requests_running", "queue_depth", "batch_size", "tokens_generated_total",
                 "forwards_total", "tokens_per_forward", "tokens_per_second", "memory_fill",
                 "client_disconnects_total", "step_seconds_total", "host_seconds_total", "forward_seconds_total"):
        assert f"lookahead_{name}" in values
    assert values["lookahead_requests_total"] >= 1 and values["lookahead_tokens_generated_total"] >= 1
    # a step's time is its host work and its forward (with the read-back), and little else
    host, forward = values["lookahead_host_seconds_total"], values["lookahead_forward_seconds_total"]
    assert 0 < host and 0 < forward and host + forward <= values["lookahead_step_seconds_total"]
    assert values['lookahead_http_responses_total{status="200"}'] >= 1
    kinds = dict(line.split()[2:4] for line in http.get("/metrics").text.splitlines() if line.startswith("# TYPE"))
    assert kinds["lookahead_requests_total"] == "counter" and kinds["lookahead_queue_depth"] == "gauge"


# ------------------------------------------------------------------ errors


def test_malformed_bodies_are_400_naming_the_fix(http):
    error = error_of(http.post("/v1/chat/completions", content=b'{"messages": [', headers={"Content-Type":
                                                                                           "application/json"}), 400)
    assert "not valid JSON" in error["message"] and error["code"] == "invalid_json"
    error = error_of(http.post("/v1/completions", content=b'{"prompt": "caf\xe9"}'), 400)
    assert "not UTF-8" in error["message"] and "0xe9" in error["message"]
    error = error_of(http.post("/v1/completions", content=b'["a"]'), 400)
    assert "JSON object" in error["message"]
    error = error_of(http.post("/v1/completions", content=b'{"prompt": "\\ud800"}'), 400)
    assert "surrogate" in error["message"]


@pytest.mark.parametrize("path, body, param, words", [
    ("/v1/chat/completions", {"model": MODEL}, "messages", "missing required field"),
    ("/v1/chat/completions", {"messages": "hi"}, "messages", "valid list"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "string"),
    ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, "messages[0].role", "missing"),
    ("/v1/chat/completions", {"messages": [{"role": "function", "content": "x"}]}, "messages[0].role", "function"),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id",
     "tool_call_id"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0]", "text only"),
    ("/v1/chat/completions", {"messages": []}, "messages", "at least one"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": "many"}, "max_tokens",
     "integer"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens",
     "at least 1"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -3},
     "max_completion_tokens", "at least 1"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens", "at least 1"),
    ("/v1/completions", {"prompt": 5}, "prompt", "string"),
    ("/v1/completions", {"prompt": ""}, "prompt", "empty"),
    ("/v1/completions", {}, "prompt", "missing"),
    ("/v1/completions", {"prompt": "hi", "temperature": 3}, "temperature", "[0, 2]"),
    ("/v1/completions", {"prompt": "hi", "top_p": 0}, "top_p", "(0, 1]"),
    ("/v1/completions", {"prompt": "hi", "stop": [1]}, "stop", "list of strings"),
    ("/v1/completions", {"prompt": "hi", "stop": ""}, "stop", "empty string"),
    ("/v1/completions", {"prompt": "hi", "stream": "sometimes"}, "stream", "boolean"),
    ("/v1/completions", {"prompt": "hi", "stream_options": {"include_usage": True}}, "stream_options", "stream"),
])
def test_invalid_fields_are_400_naming_the_field(http, path, body, param, words):
    error = error_of(http.post(path, json=body), 400)
    assert error["param"] == param and words in error["message"], error
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("path, field, value", [
    ("/v1/chat/completions", "tools", [{"type": "function", "function": {"name": "f"}}]),
    ("/v1/chat/completions", "functions", [{"name": "f"}]),
    ("/v1/chat/completions", "tool_choice", "required"),
    ("/v1/chat/completions", "top_k", 5),
    ("/v1/completions", "echo", True),
    ("/v1/completions", "best_of", 2),
    ("/v1/completions", "suffix", "end"),
])
def test_unsupported_fields_are_400_naming_the_field(http, path, field, value):
    body = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"}
    error = error_of(http.post(path, json={**body, field: value}), 400)
    assert error["param"] == field and (f"'{field}'" in error["message"] or f"{field}=" in error["message"]), error


def test_n_past_the_batch_size_through_the_client_too(client):
    """(This server's max_batch is 2: n=3 is refused, naming the field and the range; tests/test_serve_n.py
    has n itself.)"""
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], n=3)
    assert caught.value.body["param"] == "n" and "1 to 2" in caught.value.body["message"]


def test_the_context_is_checked(served, http):
    long_prompt = "ab" * (CONTEXT // 2 + 10)
    error = error_of(http.post("/v1/completions", json={"prompt": long_prompt, "max_tokens": 1}), 400)
    assert error["param"] == "prompt" and error["code"] == "context_length_exceeded"
    assert f"context is {CONTEXT}" in error["message"]
    prompt = "ab" * 250  # 500 tokens
    error = error_of(http.post("/v1/completions", json={"prompt": prompt, "max_tokens": CONTEXT}), 400)
    assert error["param"] == "max_tokens" and f"at most {CONTEXT - 500}" in error["message"]
    error = error_of(http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": long_prompt}]}),
                     400)
    assert error["param"] == "messages" and error["code"] == "context_length_exceeded"


def test_unknown_model_is_404(client, http):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.body["code"] == "model_not_found" and MODEL in caught.value.body["message"]
    error = error_of(http.post("/v1/completions", json={"model": "other", "prompt": "hi"}), 404)
    assert error["param"] == "model"
    error_of(http.get("/v1/models/other"), 404)


def test_unknown_routes_and_methods_in_openai_shape(http):
    assert "/v1/chat/completions" in error_of(http.get("/v1/nothing"), 404)["message"]
    error_of(http.get("/v1/chat/completions"), 405)


def test_api_key(served, client):
    for key in ("wrong-key", None):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        error = error_of(httpx.post(served["url"] + "/v1/completions", json={"prompt": "hi"}, headers=headers), 401)
        assert error["code"] == "invalid_api_key"
    error_of(httpx.get(served["url"] + "/metrics"), 401)
    error_of(httpx.get(served["url"] + "/v1/models"), 401)
    wrong = openai.OpenAI(base_url=served["url"] + "/v1", api_key="wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    assert client.models.list().data  # the right key still works


def test_no_api_key_set_needs_none(served):
    """A second app on the same engine, without a key: requests pass without Authorization."""
    server = ServerThread(create_app(served["engine"], MODEL)).start()
    try:
        response = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                              timeout=WAIT_S)
        assert response.status_code == 200, response.text
    finally:
        server.stop()


@pytest.mark.parametrize("n", [1, 2])
def test_an_engine_error_is_500_and_the_server_goes_on(served, client, http, n):
    fault, bad = served["fault"], "a|b"
    fault.fail_on = served["tokenizer"]("|")["input_ids"][0]
    try:
        error = error_of(http.post("/v1/completions", json={"prompt": bad, "max_tokens": 4, "n": n}), 500)
        assert "injected fault" in error["message"] and error["type"] == "server_error"
        with pytest.raises(openai.APIError) as caught:
            list(client.completions.create(model=MODEL, prompt=bad, max_tokens=4, stream=True, n=n))
        assert "injected fault" in caught.value.message
    finally:
        fault.fail_on = None
    wait_until(lambda: metrics(http)["lookahead_requests_running"] == 0, "a failed request's choice kept decoding")
    reply = client.completions.create(model=MODEL, prompt="abc", max_tokens=4)
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_a_full_queue_is_429_with_retry_after(served, client, http):
    """max_batch 2, max_queue 2: one request held inside its prefill, three waiting (one for the batch's free
    slot, two in the queue), the next one refused."""
    fault = served["fault"]
    fault.entered.clear()
    fault.gate.clear()
    results: list[int] = []

    def send() -> None:
        results.append(http.post("/v1/completions", json={"prompt": "abc", "max_tokens": 3}).status_code)

    threads = [threading.Thread(target=send) for _ in range(4)]
    try:
        threads[0].start()
        assert fault.entered.wait(WAIT_S), "the first request never reached the model"
        for thread in threads[1:]:
            thread.start()
        wait_until(lambda: metrics(http)["lookahead_queue_depth"] >= 3, "the three requests never queued")
        response = http.post("/v1/completions", json={"prompt": "abc", "max_tokens": 3})
        error = error_of(response, 429)
        assert error["code"] == "rate_limit_exceeded"
        assert int(response.headers["Retry-After"]) >= 1
        with pytest.raises(openai.RateLimitError):
            client.completions.create(model=MODEL, prompt="abc", max_tokens=3)
    finally:
        fault.gate.set()
        for thread in threads:
            thread.join(WAIT_S)
    assert results == [200, 200, 200, 200]


def test_a_request_of_n_choices_queues_all_of_them_or_none(served, http):
    """max_batch 2, max_queue 2: one request held inside its prefill and two waiting (room for three: the free
    slot's and the queue's); n=2 would make four waiting: 429, and none of its choices is queued. Once the
    queue has drained, n=2 is answered."""
    fault = served["fault"]
    fault.entered.clear()
    fault.gate.clear()
    results: list[int] = []

    def send() -> None:
        results.append(http.post("/v1/completions", json={"prompt": "abc", "max_tokens": 3}).status_code)

    threads = [threading.Thread(target=send) for _ in range(3)]
    try:
        threads[0].start()
        assert fault.entered.wait(WAIT_S), "the first request never reached the model"
        for thread in threads[1:]:
            thread.start()
        wait_until(lambda: metrics(http)["lookahead_queue_depth"] == 2, "the two requests never queued")
        before = metrics(http)["lookahead_requests_total"]
        error = error_of(http.post("/v1/completions", json={"prompt": "abc", "max_tokens": 3, "n": 2}), 429)
        assert error["code"] == "rate_limit_exceeded"
        now = metrics(http)
        assert now["lookahead_queue_depth"] == 2 and now["lookahead_requests_total"] == before  # none queued
    finally:
        fault.gate.set()
        for thread in threads:
            thread.join(WAIT_S)
    assert results == [200, 200, 200]
    response = http.post("/v1/completions", json={"prompt": "abc", "max_tokens": 3, "n": 2})
    assert response.status_code == 200 and [c["index"] for c in response.json()["choices"]] == [0, 1]


@pytest.mark.parametrize("n", [1, 2])
def test_a_client_that_disconnects_cancels_its_request(served, client, http, n):
    """Streamed: the client reads three chunks and leaves; whole: the client times out. Each request leaves the
    batch long before its 900 tokens (at 50 ms a forward, the whole answer would take seconds); with n=2, both
    of its choices leave."""
    fault, body = served["fault"], {"prompt": "hello", "max_tokens": 900, "n": n}
    before = metrics(http)
    fault.delay = 0.05
    try:
        with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
            assert response.status_code == 200
            seen = 0
            for line in response.iter_lines():
                seen += line.startswith("data: {")
                if seen >= 3:
                    break
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/completions", json=body, timeout=0.5)
        def both_left() -> bool:
            now = metrics(http)
            return now["lookahead_client_disconnects_total"] == before["lookahead_client_disconnects_total"] + 2 \
                and now["lookahead_requests_running"] == 0 and now["lookahead_queue_depth"] == 0

        wait_until(both_left, "both requests were not cancelled: one kept decoding after its client left")
        now = metrics(http)
        assert now["lookahead_tokens_generated_total"] - before["lookahead_tokens_generated_total"] < 900
    finally:
        fault.delay = 0.0
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "next"}], max_tokens=5)
    assert reply.choices[0].finish_reason in ("stop", "length")


# ------------------------------------------------------------------ text


def byte_tokenizer():
    """A byte-level tokenizer with one token per byte: characters past ASCII take 2 to 4 tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def test_incremental_decoding_never_emits_half_a_character():
    tokenizer = byte_tokenizer()
    text = "héllo 🙂 wörld, 日本語 — done"
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == len(text.encode("utf-8"))
    decoder = IncrementalDecoder(tokenizer, tokenizer("prompt: ")["input_ids"])
    pieces = [decoder.push([t]) for t in ids] + [decoder.flush()]
    assert "".join(pieces) == text
    assert not any("\ufffd" in piece for piece in pieces)
    cut = IncrementalDecoder(tokenizer)
    assert cut.push(tokenizer("🙂")["input_ids"][:2]) == "" and cut.flush() == "\ufffd"  # an unfinished character


def test_stop_scanner_holds_back_what_may_start_a_stop_string():
    scanner = StopScanner(["</end>", "STOP"])
    shown = [scanner.feed(piece) for piece in ["abc<", "/e", "nd", "x", "ST", "O", "P tail"]]
    assert shown == [("abc", False), ("", False), ("", False), ("</endx", False), ("", False), ("", False),
                     ("", True)]
    assert scanner.finish() == ""
    open_ended = StopScanner(["STOP"])
    assert open_ended.feed("abcST") == ("abc", False) and open_ended.finish() == "ST"
    reply = ReplyText(byte_tokenizer(), stops=["wör"])
    ids = byte_tokenizer()("héllo wörld")["input_ids"]
    text, stopped = reply.push(ids)
    assert (text, stopped) == ("héllo ", True)


# ------------------------------------------------------------------ the command


def test_serve_command_checks_before_loading(tmp_path, monkeypatch):
    runner = CliRunner()
    result = runner.invoke(main, ["serve", "--model", "/nonexistent", "--memory", str(tmp_path)])
    assert result.exit_code == 2 and "is a directory" in result.stderr
    result = runner.invoke(main, ["serve", "--model", "/nonexistent", "--api-key", " "])
    assert result.exit_code == 2 and "--api-key is empty" in result.stderr
    empty = tmp_path / "key"
    empty.write_text("\n")
    result = runner.invoke(main, ["serve", "--model", "/nonexistent", "--api-key-file", str(empty)])
    assert result.exit_code == 2 and "first line is empty" in result.stderr
    result = runner.invoke(main, ["serve", "--model", "/nonexistent", "--api-key-file", str(tmp_path / "none")])
    assert result.exit_code == 2 and "cannot be read" in result.stderr
    result = runner.invoke(main, ["serve", "--model", "/nonexistent", "--api-key-file", str(empty), "--api-key", "k"])
    assert result.exit_code == 2 and "both given" in result.stderr
    result = runner.invoke(main, ["serve", "--model", "/nonexistent", "--max-batch", "0"])
    assert result.exit_code == 2
    monkeypatch.setitem(sys.modules, "fastapi", None)  # find_spec -> None: as if not installed
    result = runner.invoke(main, ["serve", "--model", "/nonexistent"])
    assert result.exit_code == 2 and 'pip install "lookahead-lm[serve]"' in result.stderr


def test_serve_command_refuses_a_damaged_memory_file(tmp_path):
    directory = save_model_dir(tmp_path / "model", tiny_model("llama"))
    memory = tmp_path / "memory.lkm"
    memory.write_bytes(b"not a memory file")
    result = CliRunner().invoke(main, ["serve", "--model", directory, "--memory", str(memory), "--port", "0"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.output and "memory" in lines[-1].lower()


def test_serve_command_freezes_the_start_ups_heap_while_it_serves(tmp_path, monkeypatch):
    """The model loaded and the warm-up run, what is alive leaves the garbage collector's full collections
    (serve/warmup.py settle_heap) before the port opens, and comes back when serving has ended (for the
    interpreter's finalization); the serving loop itself is stubbed out here."""
    import gc

    import lookahead.cli.serve as serve_command

    directory = save_model_dir(tmp_path / "model", tiny_model("llama"))
    seen: list[tuple[int, bool]] = []
    monkeypatch.setattr(serve_command, "_run", lambda engine, *args: seen.append(
        (gc.get_freeze_count(), any(obj is engine.generator.model for obj in gc.get_objects()))))
    try:
        result = CliRunner().invoke(main, ["serve", "--model", directory, "--port", "0", "--threads", "1",
                                           "--cost-cache-dir", ""])
        assert result.exit_code == 0, result.output
        assert "warmed up in" in result.stderr
        assert len(seen) == 1
        frozen, model_walked = seen[0]
        assert frozen > 0 and not model_walked  # (the model is among the frozen objects)
        assert gc.get_freeze_count() == 0  # (handed back once serving ended)
    finally:
        gc.unfreeze()


def _start_command(directory: str, memory: Path) -> tuple[subprocess.Popen, list[str]]:
    """``lookahead serve`` on a free port in a child process; its stderr lines are collected in a thread (the
    list ends with END_OF_STDERR once the child's stderr has closed)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, "-m", "lookahead.cli.main", "serve", "--model", directory, "--port",
                                "0", "--memory", str(memory), "--cost-cache-dir", "", "--threads", "1"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
        lines.append(END_OF_STDERR)

    threading.Thread(target=read, daemon=True).start()
    return process, lines


END_OF_STDERR = "(the server's stderr closed)\n"


def _stream_through(url: str, signal_it: Callable[[], None]) -> tuple[threading.Thread, list[str]]:
    """A long streamed completion (EOS banned) read in a thread to its end; ``signal_it`` is called once its
    first chunk has come. (The thread, the stream's lines as they come.)"""
    seen: list[str] = []

    def read() -> None:
        body = {"prompt": "w1 w2", "max_tokens": 900, "stream": True, "logit_bias": {"2": -100}}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
            for line in response.iter_lines():
                if line:
                    seen.append(line)
                    if len(seen) == 1:
                        signal_it()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, seen


def test_serve_command_stops_cleanly_on_sigterm_and_sigint_and_saves_memory(tmp_path):
    """Also with a stream running at SIGTERM: it ends (by itself, or by the engine near the grace's end) with
    [DONE], not cut mid-body."""
    directory = save_model_dir(tmp_path / "model", tiny_model("llama"))
    streams: list[tuple[threading.Thread, list[str]]] = []
    started = {sig: _start_command(directory, tmp_path / f"memory-{sig.name}.lkm")
               for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for sig, (process, lines) in started.items():
            def listening() -> bool:
                assert process.poll() is None, "".join(lines)
                return any(re.search(r"Uvicorn running on (http://\S+)", line) for line in lines)

            wait_until(listening, "the server never said where it listens:\n" + "".join(lines), looks=6000)
            found = [re.search(r"Uvicorn running on (http://\S+)", line) for line in lines]
            url = next(m.group(1) for m in found if m)
            assert any("warmed up in" in line for line in lines), "".join(lines)  # before the port opened
            response = httpx.post(url + "/v1/completions", json={"prompt": "w1 w2 w3 w1 w2", "max_tokens": 6},
                                  timeout=WAIT_S)
            assert response.status_code == 200, response.text
            assert response.json()["usage"]["prompt_tokens"] == 5
            if sig == signal.SIGTERM:  # a stream running when the signal comes still ends with [DONE]
                streams.append(_stream_through(url, lambda p=process, s=sig: p.send_signal(s)))
            else:
                process.send_signal(sig)
        for thread, seen in streams:
            thread.join(60)
            assert seen and seen[-1] == "data: [DONE]", seen[-3:]
        for sig, (process, lines) in started.items():
            assert process.wait(60) == 0, "".join(lines)
            wait_until(lambda lines=lines: lines[-1:] == [END_OF_STDERR], "the server's stderr never closed")
            # (the objects frozen while it served were handed back: nothing reported leaked at exit)
            assert not any("leaked" in line for line in lines), "".join(lines)
            memory = tmp_path / f"memory-{sig.name}.lkm"
            assert memory.is_file() and memory.stat().st_size > 0, f"{sig.name}: no memory file saved"
    finally:
        for process, _ in started.values():
            if process.poll() is None:
                process.kill()
                process.wait()


def test_the_decode_loop_runs_in_the_callers_thread_until_the_server_stops_it(tmp_path):
    """``lookahead serve``'s arrangement: the engine's loop in this thread (``start(thread=False)``, ``run``),
    uvicorn on another. Requests are answered as generate answers them; the server's shutdown (from a
    client's thread here) stops the loop, waits for its last step, then saves the memory file."""
    model = tiny_model("llama")
    tokenizer = tiny_tokenizer()
    memory = tmp_path / "memory.lkm"
    engine = Engine(LookaheadGenerator(model, tokenizer, LookaheadConfig()), max_batch=2, memory_path=str(memory))
    engine.start(thread=False)
    server = ServerThread(create_app(engine, MODEL, stop_engine=True)).start()
    prompts = ["abcabcab", "xyz_xyz_"]
    replies: dict[str, str] = {}
    errors: list[BaseException] = []
    ran_on: list[threading.Thread] = []
    step = engine._step  # noqa: SLF001 (to see which thread decodes)

    def stepping(run):
        ran_on.append(threading.current_thread())
        return step(run)

    engine._step = stepping  # noqa: SLF001

    def one(prompt: str) -> None:
        try:
            with httpx.Client(base_url=server.url, timeout=WAIT_S) as c:
                replies[prompt] = c.post("/v1/completions", json={"model": MODEL, "prompt": prompt,
                                                                  "max_tokens": 24}).json()["choices"][0]["text"]
        except BaseException as exc:  # noqa: BLE001 (reported below, in the test's thread)
            errors.append(exc)

    def clients() -> None:
        workers = [threading.Thread(target=one, args=(p,)) for p in prompts]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(WAIT_S)
        server.stop()  # its shutdown stops the engine: ``run`` below returns

    threading.Thread(target=clients, daemon=True).start()
    engine.run()
    assert not errors, errors
    served = {"model": model, "tokenizer": tokenizer}
    for prompt in prompts:
        assert replies[prompt] == greedy(served, tokenizer(prompt)["input_ids"], 24)[0]
    assert ran_on and set(ran_on) == {threading.current_thread()}
    assert memory.is_file() and memory.stat().st_size > 0, "stopping the server saved no memory file"
    engine.run()  # stopped: returns at once


def test_error_bodies_are_json(served):
    response = httpx.post(served["url"] + "/v1/completions", content=b"{", headers={"Authorization": f"Bearer {KEY}"})
    assert response.headers["content-type"].startswith("application/json")
    json.loads(response.text)


def test_serve_defaults_trace_steps_and_keep_each_request_at_its_plain_rate():
    """lookahead serve's own defaults (cli/serve.py's SERVE_DEFAULTS); generate keeps LookaheadConfig's."""
    from lookahead.cli.serve import serve

    ours = {p.name: p.default for p in serve.params}
    assert ours["traced_forward"] is True and ours["fair_share"] == 1.0
    assert LookaheadConfig().traced_forward is True and LookaheadConfig().fair_share == 0.0
