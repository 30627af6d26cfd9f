"""The server on the real default model (SmolLM2-135M-Instruct, its GGUF blocks kept): the logprobs of the
default server (speculating, its prefix cache on) equal those of the same server with speculation and the
prefix cache off, to the bit, on 16 prompts, through the real openai client on a loopback port. Each row of a step is computed by row-count
independent kernels (lookahead's attention op and the kept blocks' products), so a token accepted from a
tree carries the very logits the plain loop's one-row step gives it."""

from __future__ import annotations

import openai
import pytest
from test_serve import ServerThread

from lookahead import LookaheadConfig, LookaheadGenerator, load_model
from lookahead.serve.app import create_app
from lookahead.serve.engine import Engine

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
WAIT_S = 120.0  # the longest one request may take (a slow, busy 2-core machine)
NEW = 24
TOP = 5
# `--candidates 0 --window 1 --no-auto-window --prefix-cache-mb 0`: no speculation, and every prompt prefilled
# whole (the default server restores the chat template's shared opening from its prefix cache)
PLAIN = LookaheadConfig(candidates=0, window=1, auto_window=False, prefix_cache_mb=0)
PROMPTS = [  # 16: lists and code repeat themselves (trees accepted), the rest is open chat
    "Count from one to twenty in words, separated by commas.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List the days of the week, one per line.",
    "Rewrite in the past tense: The committee reviews the budget and approves the plan.",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Give three tips for writing clear emails.",
    "Translate to French: Good morning, how are you?",
    "Write a Python class Stack with push, pop and peek methods.",
    "Repeat the sentence 'the cat sat on the mat' three times.",
    "Explain what a hash table is in two sentences.",
    "Name the planets of the solar system in order.",
    "Write a SQL query that counts the rows of a table named users.",
    "Summarize: The meeting was moved from Monday to Tuesday because the room was booked.",
    "What is 12 times 12? Answer with the number only.",
    "Write the alphabet in capital letters separated by spaces.",
]


def answers(model, tokenizer, config: LookaheadConfig) -> tuple[list[tuple[list[str], list[float],
                                                                          list[list[tuple[str, float]]]]], float]:
    """Each prompt's (tokens, their logprobs, their top alternatives) from a server of ``config``, one
    request at a time; the server's tokens per forward and the prompt tokens its prefix cache gave back."""
    engine = Engine(LookaheadGenerator(model, tokenizer, config), max_batch=1)
    engine.start()
    server = ServerThread(create_app(engine, MODEL, stop_engine=True)).start()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=WAIT_S)
        out = []
        for prompt in PROMPTS:
            reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                                   max_tokens=NEW, logprobs=True, top_logprobs=TOP)
            entries = reply.choices[0].logprobs.content
            assert len(entries) == reply.usage.completion_tokens > 0
            out.append(([e.token for e in entries], [e.logprob for e in entries],
                        [[(t.token, t.logprob) for t in e.top_logprobs] for e in entries]))
        metrics = engine.metrics()
        return out, (metrics["tokens_per_forward"], metrics["prefix_cache_reused_tokens_total"])
    finally:
        server.stop()


def test_logprobs_are_the_same_bits_with_speculation_on_and_off():
    """(int8 products: the fast ones on every CPU with AVX2; tests/test_smollm2.py checks float32's tokens.)"""
    model, tokenizer = load_model(MODEL, products="int8")
    spec, (per_forward, reused) = answers(model, tokenizer, LookaheadConfig())
    plain, (plain_per_forward, plain_reused) = answers(model, tokenizer, PLAIN)
    assert plain_per_forward == 1.0 and plain_reused == 0
    assert per_forward > 1.0, "no token came from a tree: the comparison would be vacuous"
    assert reused > 0, "no prompt restored a kept prefix: the comparison would not cover the prefix cache"
    for prompt, a, b in zip(PROMPTS, spec, plain):
        assert a[0] == b[0], prompt  # the same tokens
        assert a[1] == b[1], prompt  # their logprobs, to the bit (JSON carries a float32's value exactly)
        assert a[2] == b[2], prompt  # the same alternatives with the same values
