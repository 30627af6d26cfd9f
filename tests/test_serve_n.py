"""``n`` > 1 on the real server (uvicorn on a loopback port, the real engine, a tiny random Llama and the
character-level tokenizer), talked to with the real openai client and httpx: a request of n choices is n
sequences of the batch, returned as choices 0..n-1 (streamed: chunks whose ``index`` says which choice,
each with its own finish_reason); usage counts the prompt once and sums the completion tokens. Greedy
choices all equal the n=1 answer; seeded sampled choices differ from each other and repeat across
identical requests, choice 0 being the n=1 answer with that seed. Two servers answer every request, one
speculating on every step and one with speculation off (``--candidates 0 --window 1 --no-auto-window``):
their answers are identical. logprobs, predictions and response_format hold per choice; every bad ``n``
is a 400 naming 'n' and the range."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import defaultdict

import httpx
import openai
import pytest
from conftest import tiny_model, tiny_tokenizer
from test_serve import KEY, MODEL, TEMPLATE, WAIT_S, ServerThread, error_of, metrics

from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.serve.app import create_app
from lookahead.serve.choices import choice_seed, merged, summed_usage
from lookahead.serve.engine import Completion, Engine, QueueFull

BATCH = 3  # the servers' max_batch: n may be 1 to 3
SPECULATE = LookaheadConfig(window=3, ngram=3, candidates=4, match_min=1, match_length=6,
                            budget="fixed")  # trees every step, whatever the machine's load
PLAIN = LookaheadConfig(window=1, candidates=0, auto_window=False)  # speculation off
MESSAGES = [{"role": "user", "content": "abcabcabcabcabc"}]  # repetitive: speculation's trees get accepted
PROMPT = "xyzxyzxyzxyz"
NEW = 24


def start(config: LookaheadConfig) -> tuple[ServerThread, openai.OpenAI, httpx.Client]:
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = TEMPLATE
    engine = Engine(LookaheadGenerator(tiny_model("llama"), tokenizer, config), max_batch=BATCH, max_queue=8)
    engine.start()
    server = ServerThread(create_app(engine, MODEL, api_key=KEY, stop_engine=True)).start()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=WAIT_S)
    http = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=WAIT_S)
    return server, client, http


@pytest.fixture(scope="module")
def servers():
    """Two servers of the same weights: "speculate" (trees every step) and "plain" (speculation off)."""
    started = {"speculate": start(SPECULATE), "plain": start(PLAIN)}
    yield {name: {"client": client, "http": http} for name, (_, client, http) in started.items()}
    for server, _, http in started.values():
        http.close()
        server.stop()


def chat(client: openai.OpenAI, **kwargs):
    return client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=NEW, **kwargs)


def streamed_choices(chunks, chat_kind: bool) -> tuple[dict[int, str], dict[int, list[str]], dict | None]:
    """A stream read back: each index's text, each index's finish reasons (one per chunk that had one), the
    usage chunk's usage (None: none came)."""
    texts: dict[int, str] = defaultdict(str)
    finishes: dict[int, list[str]] = defaultdict(list)
    usage = None
    for chunk in chunks:
        if chunk.usage is not None:
            assert not chunk.choices, "the usage chunk holds no choice"
            usage = chunk.usage.model_dump()
        for choice in chunk.choices:
            texts[choice.index] += (choice.delta.content or "") if chat_kind else choice.text
            if choice.finish_reason is not None:
                finishes[choice.index].append(choice.finish_reason)
    return dict(texts), dict(finishes), usage


# ------------------------------------------------------------------ greedy


@pytest.mark.parametrize("name", ["speculate", "plain"])
def test_greedy_chat_n3_is_three_copies_of_the_n1_answer(servers, name):
    client = servers[name]["client"]
    one = chat(client)
    three = chat(client, n=3)
    assert [c.index for c in three.choices] == [0, 1, 2]
    for choice in three.choices:
        assert choice.message.content == one.choices[0].message.content
        assert choice.finish_reason == one.choices[0].finish_reason
    assert one.usage.completion_tokens > 0
    assert three.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt counted once
    assert three.usage.completion_tokens == 3 * one.usage.completion_tokens
    assert three.usage.total_tokens == three.usage.prompt_tokens + three.usage.completion_tokens


def test_greedy_chat_n3_streamed_has_each_index_its_text_and_one_finish_reason(servers):
    client = servers["speculate"]["client"]
    whole = chat(client, n=3)
    stream = chat(client, n=3, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    texts, finishes, usage = streamed_choices(chunks, True)
    assert sorted(texts) == [0, 1, 2]
    roles = [c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.role == "assistant"]
    assert sorted(roles) == [0, 1, 2]  # each choice opens with its role
    for choice in whole.choices:
        assert texts[choice.index] == choice.message.content
        assert finishes[choice.index] == [choice.finish_reason]
    assert usage is not None and usage["completion_tokens"] == whole.usage.completion_tokens
    assert usage["prompt_tokens"] == whole.usage.prompt_tokens
    assert chunks[-1].usage is not None, "the usage chunk comes after every choice's last chunk"


@pytest.mark.parametrize("stream", [False, True])
def test_completions_n3_greedy_streamed_or_not(servers, stream):
    client = servers["speculate"]["client"]
    one = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=NEW)
    if stream:
        texts, finishes, usage = streamed_choices(
            client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=NEW, n=3, stream=True,
                                      stream_options={"include_usage": True}), False)
        assert texts == {i: one.choices[0].text for i in range(3)}
        assert finishes == {i: [one.choices[0].finish_reason] for i in range(3)}
        assert usage is not None and usage["completion_tokens"] == 3 * one.usage.completion_tokens
    else:
        three = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=NEW, n=3)
        assert [(c.index, c.text, c.finish_reason) for c in three.choices] == \
            [(i, one.choices[0].text, one.choices[0].finish_reason) for i in range(3)]
        assert three.usage.completion_tokens == 3 * one.usage.completion_tokens


# ------------------------------------------------------------------ sampled


def sampled(client: openai.OpenAI, n: int, seed: int = 1234) -> list[str]:
    reply = chat(client, n=n, temperature=1.0, seed=seed)
    assert [c.index for c in reply.choices] == list(range(n))
    return [c.message.content for c in reply.choices]


def test_seeded_sampled_choices_differ_and_repeat_across_identical_requests(servers):
    client = servers["speculate"]["client"]
    first = sampled(client, 3)
    assert sampled(client, 3) == first  # the same request: the same choices
    assert len(set(first)) > 1, "the choices drew alike: each needs its own random stream"
    assert sampled(client, 1) == first[:1]  # choice 0 keeps the request's seed
    assert sampled(client, 3, seed=99) != first


def test_seeded_sampled_streamed_equals_not_streamed(servers):
    client = servers["speculate"]["client"]
    whole = sampled(client, 3)
    texts, finishes, _ = streamed_choices(chat(client, n=3, temperature=1.0, seed=1234, stream=True), True)
    assert [texts[i] for i in range(3)] == whole
    assert all(len(f) == 1 for f in finishes.values()) and sorted(finishes) == [0, 1, 2]


def test_choice_seeds_are_derived_from_the_seed_and_the_index():
    assert choice_seed(None, 2) is None and choice_seed(7, 0) == 7
    seeds = [choice_seed(7, i) for i in range(1, 50)]
    assert len(set(seeds)) == len(seeds) and all(0 <= s < 2 ** 63 for s in seeds)
    assert choice_seed(7, 1) == choice_seed(7, 1) != choice_seed(8, 1)


def test_usage_sums_completions_and_predictions_over_choices():
    """(the prompt counted once; its cached tokens the fewest any choice restored from the prefix cache)"""
    usages = [{"prompt_tokens": 5, "completion_tokens": c, "total_tokens": 5 + c,
               "prompt_tokens_details": {"cached_tokens": cached},
               "completion_tokens_details": {"accepted_prediction_tokens": a, "rejected_prediction_tokens": r}}
              for c, a, r, cached in [(3, 1, 2, 0), (4, 0, 5, 4)]]
    assert summed_usage(usages) == {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12,
                                    "prompt_tokens_details": {"cached_tokens": 0},
                                    "completion_tokens_details": {"accepted_prediction_tokens": 1,
                                                                  "rejected_prediction_tokens": 7}}


# ------------------------------------------------------------------ speculation on and off


@pytest.mark.parametrize("kwargs", [{}, {"temperature": 1.0, "seed": 5}, {"temperature": 0.7, "top_p": 0.9,
                                                                            "seed": 11}])
def test_speculation_on_and_off_give_the_same_choices(servers, kwargs):
    answers = {}
    for name in ("speculate", "plain"):
        reply = chat(servers[name]["client"], n=3, **kwargs)
        answers[name] = [(c.index, c.message.content, c.finish_reason) for c in reply.choices]
    assert answers["speculate"] == answers["plain"]
    streamed = chat(servers["plain"]["client"], n=3, stream=True, **kwargs)
    texts, _, _ = streamed_choices(streamed, True)
    assert [texts[i] for i in range(3)] == [text for _, text, _ in answers["speculate"]]
    assert metrics(servers["speculate"]["http"])["lookahead_tokens_per_forward"] > 1.0, "it did not speculate"
    assert metrics(servers["plain"]["http"])["lookahead_tokens_per_forward"] == 1.0


# ------------------------------------------------------------------ with logprobs, predictions, response_format


def test_logprobs_come_per_choice(servers):
    client = servers["speculate"]["client"]
    one = chat(client, logprobs=True, top_logprobs=2)
    two = chat(client, n=2, logprobs=True, top_logprobs=2)
    expected = [(t.token, t.logprob, [a.token for a in t.top_logprobs]) for t in one.choices[0].logprobs.content]
    assert expected
    for choice in two.choices:
        got = [(t.token, t.logprob, [a.token for a in t.top_logprobs]) for t in choice.logprobs.content]
        assert got == expected


def test_streamed_logprobs_follow_their_choice(servers):
    client = servers["speculate"]["client"]
    whole = chat(client, n=2, logprobs=True, top_logprobs=1, temperature=1.0, seed=21)
    streamed: dict[int, list] = defaultdict(list)
    for chunk in chat(client, n=2, logprobs=True, top_logprobs=1, temperature=1.0, seed=21, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] += [(t.token, t.logprob) for t in (choice.logprobs.content if choice.logprobs
                                                                      else None) or []]
    for choice in whole.choices:
        assert streamed[choice.index] == [(t.token, t.logprob) for t in choice.logprobs.content]
    assert streamed[0] != streamed[1], "the two sampled choices drew alike"


def test_a_prediction_serves_every_choice_and_usage_sums_its_tokens(servers):
    client = servers["speculate"]["client"]
    answer = chat(client).choices[0].message.content
    prediction = {"type": "content", "content": answer}
    one = chat(client, prediction=prediction)
    three = chat(client, n=3, prediction=prediction)
    assert [c.message.content for c in three.choices] == [answer] * 3
    accepted = one.usage.completion_tokens_details.accepted_prediction_tokens
    assert accepted > 0
    assert three.usage.completion_tokens_details.accepted_prediction_tokens == 3 * accepted
    assert three.usage.completion_tokens_details.rejected_prediction_tokens == \
        3 * one.usage.completion_tokens_details.rejected_prediction_tokens


def test_response_format_holds_for_every_choice(servers):
    pytest.importorskip("xgrammar")
    http = servers["speculate"]["http"]
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 40, "response_format": {"type": "json_object"}}
    one = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
    response = http.post("/v1/chat/completions", json={**body, "n": 2, "temperature": 1.0, "seed": 3})
    assert response.status_code == 200, response.text
    contents = [c["message"]["content"] for c in response.json()["choices"]]
    assert one.startswith("{") and all(c.startswith("{") for c in contents), contents
    for content, choice in zip(contents, response.json()["choices"]):
        if choice["finish_reason"] == "stop":
            assert isinstance(json.loads(content), dict)


# ------------------------------------------------------------------ bad n


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("n", [0, -1, BATCH + 1, 100, 2.5, "2", True, [2]])
def test_bad_n_is_a_400_naming_n_and_the_range(servers, path, n):
    body = {"messages": MESSAGES} if "chat" in path else {"prompt": PROMPT}
    error = error_of(servers["speculate"]["http"].post(path, json={"model": MODEL, **body, "n": n}), 400)
    assert error["param"] == "n" and "'n'" in error["message"] and f"1 to {BATCH}" in error["message"], error


def test_n_above_the_batch_through_the_client_too(servers):
    with pytest.raises(openai.BadRequestError) as caught:
        chat(servers["speculate"]["client"], n=BATCH + 1)
    assert caught.value.body["param"] == "n"


def test_n_1_and_n_left_out_are_one_choice(servers):
    client = servers["speculate"]["client"]
    assert len(chat(client, n=1).choices) == 1 and len(chat(client).choices) == 1


# ------------------------------------------------------------------ the parts: queueing n, reading n streams


def test_a_requests_choices_queue_together_all_or_none():
    """max_batch 3, max_queue 2 and no decode loop running (nothing leaves the queue): room for 5 waiting (the
    3 free slots' and the queue's); a group counts as that many waiting requests; one larger than the whole
    room is taken while nothing else waits."""
    tokenizer = tiny_tokenizer()
    completion = Completion(prompt=[5, 6, 7], max_tokens=2)

    async def queue(groups: list[int]) -> list[str]:
        engine = Engine(LookaheadGenerator(tiny_model("llama"), tokenizer, PLAIN), max_batch=BATCH, max_queue=2)
        engine.start(thread=False)  # (running, with no loop: what is queued stays queued)
        outcomes = []
        try:
            for size in groups:
                try:
                    outcomes.append(f"queued {len(engine.submit_all([completion] * size))}")
                except QueueFull:
                    outcomes.append("full")
            outcomes.append(f"waiting {engine.metrics()['queue_depth']:.0f}")
        finally:
            engine.stop()
        return outcomes

    assert asyncio.run(queue([3, 3, 2, 1])) == ["queued 3", "full", "queued 2", "full", "waiting 5"]
    assert asyncio.run(queue([6, 1])) == ["queued 6", "full", "waiting 6"]
    with pytest.raises(ValueError, match="empty"):
        asyncio.run(queue([0]))


def test_merged_reads_every_stream_in_its_own_order_and_raises_a_streams_error():
    async def stream(name: str, pauses: list[float], fail: bool = False):
        for i, pause in enumerate(pauses):
            await asyncio.sleep(pause)
            yield f"{name}{i}"
        if fail:
            raise RuntimeError(f"{name} failed")

    async def read(streams) -> list[tuple[int, str]]:
        return [item async for item in merged(streams)]

    got = asyncio.run(read([stream("a", [0.03, 0.0, 0.03]), stream("b", [0.0, 0.05]), stream("c", [])]))
    assert sorted(got) == [(0, "a0"), (0, "a1"), (0, "a2"), (1, "b0"), (1, "b1")]
    assert [item for index, item in got if index == 0] == ["a0", "a1", "a2"]
    assert got[0] == (1, "b0"), "items come as they arrive, not stream by stream"
    with pytest.raises(RuntimeError, match="b failed"):
        asyncio.run(read([stream("a", [0.01] * 5), stream("b", [0.0], fail=True)]))


def test_closing_merged_early_stops_reading_every_stream():
    stopped: list[str] = []

    async def endless(name: str):
        try:
            while True:
                await asyncio.sleep(0.001)
                yield name
        finally:
            stopped.append(name)

    async def read_three() -> list[str]:
        seen = []
        async with contextlib.aclosing(merged([endless("a"), endless("b")])) as items:
            async for _, item in items:
                seen.append(item)
                if len(seen) == 3:
                    break
        for _ in range(10):  # (bounded: the cancelled readers end within a few turns of the loop)
            if len(stopped) == 2:
                break
            await asyncio.sleep(0.001)
        return seen

    assert len(asyncio.run(read_three())) == 3
    assert sorted(stopped) == ["a", "b"], "a stream was still being read after the reader closed"
