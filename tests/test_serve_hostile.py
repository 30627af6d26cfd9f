"""What hostile or careless input does to the server (the real server on a loopback port, the real HTTP
client): long stop strings are refused or cost nothing ahead (lookahead/serve/stops.py), deeply nested
bodies are 400, streams cut by a stopping engine end with an error event and [DONE], a burst is admitted
up to the batch's free slots and the queue, and the advised wait follows the pace of the batch."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
import torch
from conftest import tiny_model, tiny_tokenizer
from test_serve import TEMPLATE, WAIT_S, Fault, ServerThread, error_of, wait_until

from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.serve.app import create_app
from lookahead.serve.engine import Engine
from lookahead.serve.schemas import MAX_DEPTH, MAX_STOP_CHARS, nesting, parse_body
from lookahead.serve.stops import ReplyStops

MODEL = "tiny-llama"


@pytest.fixture()
def server():
    """A fresh server of its own (the tests stop its engine): (url, engine, fault)."""
    model = tiny_model("llama")
    fault = Fault()
    hook = model.get_input_embeddings().register_forward_pre_hook(fault)
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = TEMPLATE
    engine = Engine(LookaheadGenerator(model, tokenizer, LookaheadConfig()), max_batch=2, max_queue=2)
    engine.start()
    thread = ServerThread(create_app(engine, MODEL, stop_engine=True)).start()
    yield {"url": thread.url, "engine": engine, "fault": fault}
    fault.gate.set()
    thread.stop()
    hook.remove()


# ------------------------------------------------------------------ stop strings


def test_reply_stops_fires_at_the_token_whose_text_completes_a_stop_string():
    tokenizer = tiny_tokenizer()
    prompt = tokenizer("ab")["input_ids"]
    reply = tokenizer("xyz&&uv")["input_ids"]
    stops = ReplyStops(tokenizer, prompt, ["&&u", "zz"])
    fired = [bool(stops(torch.tensor([prompt + reply[:k]]), None)[0]) for k in range(1, len(reply) + 1)]
    assert fired == [False, False, False, False, False, True, True]  # at "u", and from then on
    stops = ReplyStops(tokenizer, prompt, ["&&u"])
    assert bool(stops(torch.tensor([prompt + reply]), None)[0])  # several tokens in one call (an accepted tree)
    amp = tokenizer("&&")["input_ids"]  # a prompt's text is no part of the reply's
    assert not ReplyStops(tokenizer, amp, ["&&u"])(torch.tensor([amp + tokenizer("u")["input_ids"]]), None)[0]
    with pytest.raises(ValueError, match="at least one stop string"):
        ReplyStops(tokenizer, prompt, [])


def test_a_stop_string_longer_than_the_bound_is_400_naming_it(server):
    url = server["url"]
    long = "z" * 10_000
    for stop, param in ((long, "stop"), (["ok", long], "stop[1]")):
        response = httpx.post(url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 4, "stop": stop},
                              timeout=WAIT_S)
        error = error_of(response, 400)
        assert error["param"] == param and f"at most {MAX_STOP_CHARS} characters" in error["message"]
    response = httpx.post(url + "/v1/completions", timeout=WAIT_S,
                          json={"prompt": "Hello", "max_tokens": 4, "stop": "z" * MAX_STOP_CHARS})
    assert response.status_code == 200, response.text


def test_the_engine_checks_stop_strings_on_the_text_and_builds_no_vocabulary_table():
    """A request's stop strings reach the batch as a ReplyStops (nothing built ahead), never as generate's
    stop_strings (transformers' StopStringCriteria: a vocabulary-by-length table on the decode thread)."""
    from lookahead.serve.engine import Completion, _settings

    settings = _settings(Completion(prompt=[5, 6], max_tokens=3, stop=("z" * MAX_STOP_CHARS,)), tiny_tokenizer())
    assert "stop_strings" not in settings
    assert [type(c) for c in settings["stopping_criteria"]] == [ReplyStops]
    assert _settings(Completion(prompt=[5, 6], max_tokens=3), tiny_tokenizer())["stopping_criteria"] is None


# ------------------------------------------------------------------ nested bodies


def test_nesting_counts_arrays_and_objects():
    assert nesting(5) == 0 and nesting([]) == 1 and nesting({"a": [1, {"b": []}]}) == 4
    deep: list = []
    for _ in range(5000):  # deeper than Python's recursion limit
        deep = [deep]
    assert nesting(deep) == 5001


@pytest.mark.parametrize("body", [
    b"[" * 10_000 + b"]" * 10_000,  # past what json.loads reads (RecursionError)
    ('{"prompt": "x", "stop": ' + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "}").encode(),
])
def test_a_deeply_nested_body_is_400(server, body):
    response = httpx.post(server["url"] + "/v1/completions", content=body,
                          headers={"Content-Type": "application/json"}, timeout=WAIT_S)
    error = error_of(response, 400)
    assert f"more than {MAX_DEPTH} deep" in error["message"]


def test_a_body_within_the_depth_is_read():
    schema: dict = {"type": "string"}
    for _ in range(MAX_DEPTH // 2 - 2):
        schema = {"type": "object", "properties": {"a": schema}}
    body = {"model": MODEL, "prompt": "x", "response_format": {"type": "json_schema", "json_schema": {
        "name": "deep", "schema": schema}}}
    assert nesting(body) <= MAX_DEPTH
    assert parse_body(json.dumps(body).encode()) == body


# ------------------------------------------------------------------ stopping with streams running


def test_streams_running_when_the_engine_stops_end_with_an_error_event_and_done(server):
    """What `lookahead serve` does near the end of its grace on SIGTERM (cli/serve.py): the engine stops, and
    every stream still running gets its error event and [DONE] rather than a body cut mid-stream."""
    url, fault = server["url"], server["fault"]
    fault.delay = 0.02
    lines: dict[int, list[str]] = {0: [], 1: []}

    def stream(index: int) -> None:
        body = {"prompt": "abc", "max_tokens": 900, "stream": True, "logit_bias": {"2": -100}}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=WAIT_S) as response:
            lines[index].extend(line for line in response.iter_lines() if line)

    workers = [threading.Thread(target=stream, args=(i,)) for i in lines]
    for worker in workers:
        worker.start()
    wait_until(lambda: all(len(seen) >= 3 for seen in lines.values()), "the streams never began")
    server["engine"].stop()
    for worker in workers:
        worker.join(WAIT_S)
    for seen in lines.values():
        assert seen[-1] == "data: [DONE]"
        error = json.loads(seen[-2].removeprefix("data: "))["error"]
        assert "stopping" in error["message"]


# ------------------------------------------------------------------ a burst against the queue


def test_a_burst_is_admitted_up_to_the_free_slots_and_the_queue(server):
    """max_batch 2, max_queue 2, the model held (every forward waits): the first request is taken into the
    batch, then 2 + 1 more wait (the free slot's and the queue's); the next are 429 with Retry-After."""
    url, fault = server["url"], server["fault"]
    fault.entered.clear()
    fault.gate.clear()
    statuses: list[int] = []

    def send() -> None:
        statuses.append(httpx.post(url + "/v1/completions", json={"prompt": "abc", "max_tokens": 2},
                                   timeout=WAIT_S).status_code)

    threads = [threading.Thread(target=send)]
    threads[0].start()
    try:
        assert fault.entered.wait(WAIT_S), "the first request never reached the model"
        for _ in range(3):
            threads.append(threading.Thread(target=send))
            threads[-1].start()
        wait_until(lambda: server["engine"].metrics()["queue_depth"] == 3, "three requests never queued")
        refused = [httpx.post(url + "/v1/completions", json={"prompt": "abc", "max_tokens": 2}, timeout=WAIT_S)
                   for _ in range(3)]
        assert all(r.status_code == 429 and int(r.headers["Retry-After"]) >= 1 for r in refused)
    finally:
        fault.gate.set()
        for thread in threads:
            thread.join(WAIT_S)
    assert statuses == [200] * 4


def test_the_advised_wait_follows_the_pace_of_the_batch():
    """Before any request has ended: RETRY_PER_WAITING_S per request that must leave; after: their mean time
    in the batch over its slots."""
    from lookahead.serve.engine import RETRY_PER_WAITING_S

    engine = Engine(LookaheadGenerator(tiny_model("llama"), tiny_tokenizer()), max_batch=4, max_queue=2)
    assert engine._retry_after(3) == pytest.approx(3 * RETRY_PER_WAITING_S)  # noqa: SLF001
    engine._durations.extend([2.0, 6.0])  # noqa: SLF001 (as two ended requests leave them)
    assert engine._retry_after(2) == pytest.approx(2 * 4.0 / 4)  # noqa: SLF001
    assert engine._retry_after(0) == pytest.approx(4.0 / 4)  # noqa: SLF001 (at least one must leave)


def test_partial_tail_compares_only_tails_that_begin_like_the_tag():
    from lookahead.serve.text import partial_tail

    assert partial_tail("ab<st", "<stop>") == 3 and partial_tail("ab", "<stop>") == 0
    assert partial_tail("<stop", "<stop>") == 5 and partial_tail("x<stop>", "<stop>") == 0  # (shorter than it)
    assert partial_tail("a<<", "<<x") == 2 and partial_tail("", "<") == 0
