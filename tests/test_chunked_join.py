"""A prompt joining an open batch while others decode is prefilled ``prefill_chunk`` rows a step
(lookahead/decode/loop.py's ``join``): the decoding sequences go on getting tokens meanwhile, the joining one
decodes once all of its prompt is in, and every sequence's tokens are model.generate's. Only where a prompt
prefilled in parts holds a whole prefill's bits (int8 products of GGUF blocks); elsewhere a prompt is prefilled
whole, as before."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import VOCAB, reference, tiny_model
from gguf import GGMLQuantizationType as Q
from test_prefixes import int8_model

from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.config import ConfigError

NEVER = [VOCAB + 1000]  # an EOS no row reaches: every decode runs to max_new_tokens
FIRST = np.array([5, 9, 14, 23, 5, 9, 14, 23, 5, 9, 31, 40])  # the sequence decoding when the long one joins
LONG = np.random.default_rng(7).integers(1, VOCAB, 41)  # 40 slots to prefill: 5 chunks of 8
CHUNK = LookaheadConfig(prefill_chunk=8)


def expected(model, prompt: np.ndarray, new: int) -> list[int]:
    """model.generate's new tokens for ``prompt`` alone, greedy."""
    ids = torch.from_numpy(prompt)[None]
    return reference(model, ids, new, eos_token_id=NEVER)[0, ids.shape[1]:].tolist()


@pytest.fixture(scope="module", params=[("llama", Q.Q8_0), ("qwen2", Q.Q4_1)], ids=lambda v: f"{v[0]}-{v[1].name}")
def int8(request):
    return int8_model(*request.param)


def test_a_long_prompt_joins_a_chunk_a_step_while_the_other_decodes_and_both_decode_exactly(int8):
    batch = LookaheadGenerator(int8, config=CHUNK).open_batch()
    first = batch.join(FIRST, max_new_tokens=30, do_sample=False, eos_token_id=NEVER)
    batch.step()
    long = batch.join(LONG, max_new_tokens=12, do_sample=False, eos_token_id=NEVER)
    assert batch.run.joining(long._seq) and long.new_tokens == 0  # noqa: SLF001
    assert batch.handles == [first, long]  # the joining one is a handle of the batch's already
    waited = 0
    while batch.run.joining(long._seq):  # noqa: SLF001
        before = first.new_tokens
        events = batch.step()
        waited += 1
        assert first.new_tokens > before  # the decoding sequence got tokens in every step of the prefill
        assert all(event.handle is not long for event in events) or not batch.run.joining(long._seq)  # noqa: SLF001
    assert waited == 5  # 40 slots, 8 a step: the fifth chunk completes it and it decodes in that step
    assert batch.stats.sequences_per_step == [1, 1, 1, 1, 1, 2]  # a joining sequence is in no step (a server's
    # tokens a forward count sequences by this)
    assert long.new_tokens >= 1
    while batch.handles:
        batch.step()
    assert first.output_ids.tolist() == expected(int8, FIRST, 30)
    assert long.output_ids.tolist() == expected(int8, LONG, 12)


def test_a_joining_prompt_is_prefilled_whole_once_nothing_else_decodes(int8):
    batch = LookaheadGenerator(int8, config=CHUNK).open_batch()
    short = batch.join(FIRST, max_new_tokens=1, do_sample=False, eos_token_id=NEVER)
    long = batch.join(LONG, max_new_tokens=6, do_sample=False, eos_token_id=NEVER)
    assert batch.run.joining(long._seq)  # noqa: SLF001
    batch.step()  # one chunk, then the short one's step ends it
    assert short.finish_reason == "length" and batch.run.joining(long._seq)  # noqa: SLF001
    batch.step()  # nobody waits: the rest of the prompt at once, then its first step
    assert not batch.run.pending and long.new_tokens >= 1
    while batch.handles:
        batch.step()
    assert long.output_ids.tolist() == expected(int8, LONG, 6)


def test_a_joining_sequence_can_leave_before_its_prompt_is_in(int8):
    batch = LookaheadGenerator(int8, config=CHUNK).open_batch()
    first = batch.join(FIRST, max_new_tokens=10, do_sample=False, eos_token_id=NEVER)
    long = batch.join(LONG, max_new_tokens=6, do_sample=False, eos_token_id=NEVER)
    batch.step()
    batch.leave(long)
    assert long.finish_reason == "cancelled" and not batch.run.pending and batch.handles == [first]
    while batch.handles:
        batch.step()
    assert long.new_tokens == 0
    assert first.output_ids.tolist() == expected(int8, FIRST, 10)


def test_a_chunked_prompt_is_kept_for_the_prefix_cache_once_it_is_all_in(int8):
    gen = LookaheadGenerator(int8, config=CHUNK)
    batch = gen.open_batch()
    batch.join(FIRST, max_new_tokens=20, do_sample=False, eos_token_id=NEVER)
    long = batch.join(LONG, max_new_tokens=4, do_sample=False, eos_token_id=NEVER)
    while batch.run.joining(long._seq):  # noqa: SLF001
        batch.step()
    again = batch.join(np.concatenate([LONG, [3, 4]]), max_new_tokens=4, do_sample=False, eos_token_id=NEVER)
    assert again.cached_prompt_tokens == LONG.shape[0] - 1  # its whole prompt came back from the store
    while batch.handles:
        batch.step()
    assert again.output_ids.tolist() == expected(int8, np.concatenate([LONG, [3, 4]]), 4)


def test_a_trial_step_runs_every_joined_sequence_its_prompt_all_in(int8):
    batch = LookaheadGenerator(int8, config=CHUNK).open_batch()
    for i in range(3):  # (three prompts of their own: nothing comes back from the prefix cache)
        batch.join((LONG + i) % VOCAB, max_new_tokens=4, do_sample=False, eos_token_id=NEVER)
    assert len(batch.run.pending) == 2
    batch.trial_step(2)
    assert not batch.run.pending and len(batch.run.active) == 3


@pytest.mark.parametrize("config", [LookaheadConfig(prefill_chunk=0), LookaheadConfig(prefill_chunk=40)])
def test_no_chunk_or_a_prompt_within_one_is_prefilled_at_once(int8, config):
    batch = LookaheadGenerator(int8, config=config).open_batch()
    batch.join(FIRST, max_new_tokens=4, do_sample=False, eos_token_id=NEVER)
    long = batch.join(LONG, max_new_tokens=4, do_sample=False, eos_token_id=NEVER)
    assert not batch.run.pending and long._seq in batch.run.active  # noqa: SLF001


def test_float32_products_prefill_a_joining_prompt_whole():
    """Their row's bits depend on the forward's row count: a prompt in parts would not hold a whole prefill's."""
    model = tiny_model("llama")
    batch = LookaheadGenerator(model, config=CHUNK).open_batch()
    first = batch.join(FIRST, max_new_tokens=8, do_sample=False, eos_token_id=NEVER)
    long = batch.join(LONG, max_new_tokens=8, do_sample=False, eos_token_id=NEVER)
    assert not batch.run.pending
    while batch.handles:
        batch.step()
    assert first.output_ids.tolist() == expected(model, FIRST, 8)
    assert long.output_ids.tolist() == expected(model, LONG, 8)


def test_a_negative_chunk_is_refused():
    with pytest.raises(ConfigError, match="prefill_chunk"):
        LookaheadConfig(prefill_chunk=-1)


def test_the_server_joins_a_long_prompt_a_chunk_a_step_and_answers_as_with_whole_prefills(monkeypatch):
    """The real server on loopback: a long completion joins while a stream decodes; with chunks of 4 rows its
    prompt is prefilled over several of the stream's steps, and both answers are those of a server that prefills
    every prompt whole."""
    import threading

    import openai
    from conftest import tiny_tokenizer
    from test_serve import ServerThread

    from lookahead.decode.loop import DecodeRun
    from lookahead.serve.app import create_app
    from lookahead.serve.engine import Engine

    model = int8_model("llama", Q.Q8_0)
    chunks = []
    advance = DecodeRun._advance_join  # noqa: SLF001
    monkeypatch.setattr(DecodeRun, "_advance_join", lambda run: (chunks.append(len(run.active)), advance(run)))

    def replies(config: LookaheadConfig) -> tuple[str, str]:
        engine = Engine(LookaheadGenerator(model, tiny_tokenizer(), config), max_batch=2)
        engine.start()
        server = ServerThread(create_app(engine, "tiny", stop_engine=True)).start()
        try:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
            streamed: list[str] = []
            began = threading.Event()

            def stream() -> None:
                for chunk in client.completions.create(model="tiny", prompt="abcabcabd", max_tokens=300,
                                                       temperature=0, stream=True):
                    streamed.append(chunk.choices[0].text if chunk.choices else "")
                    began.set()

            thread = threading.Thread(target=stream)
            thread.start()
            assert began.wait(60)
            joined = client.completions.create(model="tiny", prompt="xyzzyxwvutsrqponmlkjihgfedcbaxyz", max_tokens=8,
                                               temperature=0)
            thread.join(60)
            return "".join(streamed), joined.choices[0].text
        finally:
            server.stop()

    chunked = replies(LookaheadConfig(prefill_chunk=4))
    during = [count for count in chunks if count > 0]
    whole = replies(LookaheadConfig(prefill_chunk=0))
    assert chunked == whole
    assert len(during) >= 3  # the long prompt took several chunks while the stream decoded


def prefill_widths(model: torch.nn.Module) -> list[int]:
    """The columns of every prefill forward the model runs from now on (forwards keeping one row's logits)."""
    widths: list[int] = []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1])
        if isinstance(kwargs.get("logits_to_keep"), int) and kwargs["logits_to_keep"] == 1 else None, with_kwargs=True)
    return widths


def test_a_long_prompt_alone_is_prefilled_chunk_by_chunk_and_generate_decodes_exactly():
    model = int8_model("llama", Q.Q8_0)
    widths = prefill_widths(model)
    ids = torch.from_numpy(LONG)[None]
    out = LookaheadGenerator(model, config=CHUNK).generate(ids, max_new_tokens=12, eos_token_id=NEVER)
    assert widths == [8, 8, 8, 8, 8]  # 40 slots, 8 a forward
    assert torch.equal(out, reference(model, ids, 12, eos_token_id=NEVER))


def test_float32_products_prefill_a_prompt_alone_whole():
    model = tiny_model("llama")
    widths = prefill_widths(model)
    LookaheadGenerator(model, config=CHUNK).generate(torch.from_numpy(LONG)[None], max_new_tokens=4,
                                                     eos_token_id=NEVER)
    assert widths == [40]
