"""The prefix cache (lookahead/model/prefixes.py): a prompt that begins with a kept one restores those cache
slots and prefills the rest, holding the bits a whole prefill gives it, where the products allow that (int8
products of GGUF blocks); generate and an open batch then decode exactly as without the cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import VOCAB, reference, tiny_model
from gguf import GGMLQuantizationType as Q
from test_quantized import quantized_model

from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.config import ConfigError
from lookahead.model.attention import use_native
from lookahead.model.cache import new_cache
from lookahead.model.prefixes import PrefixStore, common_prefix, reuse_is_exact
from lookahead.model.quantized import QuantizedLinear, quantized_modules

NEVER = [VOCAB + 1000]  # an EOS no row reaches: every decode runs to max_new_tokens
PROMPT = torch.tensor([[5, 9, 14, 23, 5, 9, 14, 23, 5, 9, 14, 23, 5, 9, 31, 40, 2, 17]])
MORE = torch.tensor([[7, 3, 11, 5, 9, 14, 23, 5]])  # a next turn's own tokens
NO_CACHE = LookaheadConfig(prefix_cache_mb=0)


def int8_model(arch: str, kind: Q) -> torch.nn.Module:
    """A tiny model of GGUF blocks with int8 products, attending through lookahead's op (as load_model sets up)."""
    model = quantized_model(arch, kind)
    for module in quantized_modules(model):
        if isinstance(module, QuantizedLinear):
            module.products = "int8"
    assert use_native(model)
    return model


@pytest.fixture(scope="module")
def llama_int8():
    return int8_model("llama", Q.Q8_0)


def slots(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


# ---- pure parts ----

def test_common_prefix_worked_examples():
    a = np.array
    assert common_prefix(a([5, 9, 14, 2]), a([5, 9, 7])) == 2
    assert common_prefix(a([5, 9]), a([5, 9, 14])) == 2
    assert common_prefix(a([1]), a([2])) == 0
    assert common_prefix(a([], dtype=np.int64), a([3])) == 0
    assert common_prefix(a([4, 4, 4]), a([4, 4, 4])) == 3


SLOT = 2 * 2 * (2 * 4 * 4)  # bytes of one slot of hand_cache: 2 layers x (keys + values) x [2 heads, 4] float32


def hand_cache(tokens: int, layers: int = 2, fill: float = 0.0):
    """A SlotCache of ``layers`` layers holding ``tokens`` slots [1, 2, tokens, 4], slot s of layer l holding
    fill + 100 l + s (values: the negative)."""
    cache = new_cache(layers)
    for layer in range(layers):
        keys = (fill + 100 * layer + torch.arange(tokens, dtype=torch.float32)).view(1, 1, tokens, 1)
        keys = keys.expand(1, 2, tokens, 4).contiguous()
        cache.update(keys, -keys, layer)
    return cache


def test_the_store_restores_the_longest_kept_prefix_and_its_values():
    store = PrefixStore(100 * SLOT)
    store.keep(np.array([5, 9, 14, 2]), hand_cache(4))
    store.keep(np.array([5, 7]), hand_cache(2, fill=0.5))
    cache = new_cache(2)
    assert store.restore(np.array([5, 9, 14, 8, 8]), cache) == 3
    assert cache.get_seq_length() == 3
    for layer, (keys, values) in enumerate(slots(cache)):
        expected = (100 * layer + torch.arange(3, dtype=torch.float32)).view(1, 1, 3, 1).expand(1, 2, 3, 4)
        assert torch.equal(keys, expected) and torch.equal(values, -expected)
    assert store.reused_tokens == 3
    assert store.restore(np.array([6, 9]), new_cache(2)) == 0  # nothing shared: nothing written


def test_a_longer_prompt_replaces_its_prefix_and_a_shorter_one_is_not_kept_again():
    store = PrefixStore(100 * SLOT)
    store.keep(np.array([5, 9, 14]), hand_cache(3))
    store.keep(np.array([5, 9, 14, 2, 8]), hand_cache(5))
    assert len(store) == 1 and store.tokens == 5 and store.size == 5 * SLOT
    store.keep(np.array([5, 9]), hand_cache(2))  # held already inside the five-token one
    assert len(store) == 1 and store.tokens == 5


def test_the_least_recently_used_prompt_goes_first_and_the_capacity_holds():
    store = PrefixStore(10 * SLOT)  # ten tokens' slots
    store.keep(np.array([1, 2, 3, 4]), hand_cache(4))
    store.keep(np.array([7, 8, 9, 10]), hand_cache(4))
    assert store.restore(np.array([1, 2, 3, 4, 5]), new_cache(2)) == 4  # [1 2 3 4] now the most recent
    store.keep(np.array([20, 21, 22, 23]), hand_cache(4))  # 12 > 10: [7 8 9 10] goes
    assert store.tokens == 8 and len(store) == 2
    assert store.longest(np.array([7, 8, 9]))[1] == 0
    assert store.longest(np.array([1, 2, 3]))[1] == 3
    store.keep(np.arange(11), hand_cache(11))  # longer than the whole store: not kept
    assert store.tokens == 8 and store.size == 8 * SLOT
    store.clear()
    assert len(store) == 0 and store.tokens == 0 and store.size == 0 and store.reused_tokens == 0


def test_a_store_of_no_tokens_and_a_bad_setting_are_refused():
    with pytest.raises(ValueError, match="at least one byte"):
        PrefixStore(0)
    with pytest.raises(ConfigError, match="prefix_cache_mb"):
        LookaheadConfig(prefix_cache_mb=-1)


def test_reuse_is_exact_only_with_int8_products(llama_int8):
    assert reuse_is_exact(llama_int8)
    assert not reuse_is_exact(tiny_model("llama"))  # float32 weights: torch's matrix product
    float_products = quantized_model("llama", Q.Q8_0)  # kept blocks, float32 products: tiles past some rows
    use_native(float_products)
    assert not reuse_is_exact(float_products)
    torch_attention = int8_model("llama", Q.Q8_0)
    torch_attention.config._attn_implementation = "sdpa"  # torch's SDPA: a long query blocked otherwise
    assert not reuse_is_exact(torch_attention)


# ---- bits: a restored prefix + the rest prefilled == the whole prompt prefilled ----

@pytest.mark.parametrize("arch, kind", [("llama", Q.Q8_0), ("qwen2", Q.Q4_1), ("gemma3", Q.Q8_0)],
                         ids=lambda v: getattr(v, "name", v))
def test_a_restored_prefix_and_the_rest_hold_the_bits_of_a_whole_prefill(arch, kind):
    model = int8_model(arch, kind)
    assert reuse_is_exact(model)
    target = LookaheadGenerator(model).target
    prompt = np.random.default_rng(3).integers(1, VOCAB, 80)  # [T]
    with torch.inference_mode():
        whole = target.new_cache()
        target.prefill(whole, prompt[None])
        for split in (1, 7, 33, 79):
            store = PrefixStore(1 << 30)
            first = target.new_cache()
            target.prefill(first, prompt[None, :split])
            store.keep(prompt[:split], first)
            cache = target.new_cache()
            assert store.restore(prompt, cache) == split
            target.prefill(cache, prompt[None, split:])
            for (k, v), (wk, wv) in zip(slots(cache), slots(whole), strict=True):
                assert torch.equal(k, wk) and torch.equal(v, wv), f"{arch}: split at {split}"


# ---- decoding: the same tokens and logprobs as without the cache ----

def test_generate_on_a_resent_conversation_restores_it_and_decodes_exactly(llama_int8):
    gen = LookaheadGenerator(llama_int8)
    first = gen.generate(PROMPT, max_new_tokens=20, eos_token_id=NEVER)
    assert gen.last_stats.cached_prompt_tokens == 0
    second = torch.cat([first, MORE], 1)  # the conversation resent with a next turn
    out = gen.generate(second, max_new_tokens=30, eos_token_id=NEVER, logprobs=3, return_dict_in_generate=True)
    # the first call kept its prompt and output up to its last step's x
    assert PROMPT.shape[1] <= out.stats.cached_prompt_tokens < first.shape[1]
    fresh = LookaheadGenerator(llama_int8, config=NO_CACHE).generate(
        second, max_new_tokens=30, eos_token_id=NEVER, logprobs=3, return_dict_in_generate=True)
    assert fresh.stats.cached_prompt_tokens == 0
    assert torch.equal(out.sequences, fresh.sequences)
    assert torch.equal(out.sequences, reference(llama_int8, second, 30, eos_token_id=NEVER))
    assert torch.equal(out.logprobs[0].logprobs, fresh.logprobs[0].logprobs)  # to the bit
    assert torch.equal(out.logprobs[0].top_logprobs, fresh.logprobs[0].top_logprobs)
    again = gen.generate(second, max_new_tokens=30, eos_token_id=NEVER)  # all of it kept now
    assert gen.last_stats.cached_prompt_tokens == second.shape[1] - 1
    assert torch.equal(again, out.sequences)


def whole_prefill_bits_equal(target, kept) -> bool:
    with torch.inference_mode():
        cache = target.new_cache()
        target.prefill(cache, kept.tokens[None])
    return all(torch.equal(k, kk) and torch.equal(v, kv)
               for (k, v), kk, kv in zip(slots(cache), kept.keys, kept.values, strict=True))


@pytest.mark.parametrize("count", [1, 3])
def test_a_finished_sequence_keeps_its_prompt_and_output_with_a_whole_prefills_bits(llama_int8, count):
    """What decode steps wrote (trees, accepted rows gathered, a batch's padding and holes) is kept with the
    bits a prefill of the same tokens gives: a next turn restoring it decodes as without the cache."""
    gen = LookaheadGenerator(llama_int8, config=LookaheadConfig(window=8, ngram=5, candidates=12, match_length=10,
                                                                max_tree_nodes=64))
    batch = gen.open_batch()
    prompts = [PROMPT[0].numpy()[:18 - 4 * i] for i in range(count)]  # lengths 18, 14, 10: padded beside each other
    handles = [batch.join(p, max_new_tokens=24 + 6 * i, do_sample=False, eos_token_id=NEVER)
               for i, p in enumerate(prompts)]
    while batch.handles:
        batch.step()
    assert sum(batch.stats.accepted) > batch.stats.steps  # trees were accepted: the rows came from several-row steps
    kept = sorted(gen.prefixes._kept.values(), key=lambda k: k.tokens.shape[0])  # noqa: SLF001
    assert len(kept) == count
    for entry in kept:
        owner = next(h for h in handles if np.array_equal(np.concatenate([prompts[handles.index(h)],
                                                                          h.output_ids])[:entry.tokens.shape[0]],
                                                          entry.tokens))
        assert entry.tokens.shape[0] > owner.prompt_tokens  # its output too
        assert whole_prefill_bits_equal(gen.target, entry)


def test_requests_joining_an_open_batch_restore_their_prefix_and_decode_exactly(llama_int8):
    gen = LookaheadGenerator(llama_int8)
    plain = LookaheadGenerator(llama_int8, config=NO_CACHE)

    def run(generator: LookaheadGenerator, prompts: list[np.ndarray]) -> tuple[list[list[int]], list[int]]:
        batch = generator.open_batch()
        handles = [batch.join(p, max_new_tokens=16, do_sample=False, eos_token_id=NEVER) for p in prompts]
        while batch.handles:
            batch.step()
        return [h.output_ids.tolist() for h in handles], [h.cached_prompt_tokens for h in handles]

    base = PROMPT[0].numpy()
    prompts = [base, np.concatenate([base, MORE[0].numpy()]), np.concatenate([base[:9], [44, 45, 46]])]
    outs, cached = run(gen, prompts)
    assert cached == [0, base.shape[0] - 1, 9]  # the second begins with all of the first as kept, the third with 9
    reference_outs, none = run(plain, prompts)
    assert none == [0, 0, 0]
    assert outs == reference_outs


def test_float32_products_keep_no_prompt():
    model = tiny_model("llama")
    gen = LookaheadGenerator(model)
    gen.generate(PROMPT, max_new_tokens=4, eos_token_id=NEVER)
    gen.generate(torch.cat([PROMPT, MORE], 1), max_new_tokens=4, eos_token_id=NEVER)
    assert gen.last_stats.cached_prompt_tokens == 0 and gen.prefixes is not None and len(gen.prefixes) == 0


# ---- the server: a resent conversation's usage says what the cache gave back, the text is the same ----

def test_the_server_reports_cached_prompt_tokens_and_answers_as_without_the_cache(llama_int8):
    import openai
    from conftest import tiny_tokenizer
    from test_serve import ServerThread

    from lookahead.serve.app import create_app
    from lookahead.serve.engine import Engine

    def replies(config: LookaheadConfig) -> tuple[list[str], list[int], float]:
        engine = Engine(LookaheadGenerator(llama_int8, tiny_tokenizer(), config), max_batch=2)
        engine.start()
        server = ServerThread(create_app(engine, "tiny", stop_engine=True)).start()
        try:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
            texts, cached, prompt = [], [], "abcabcabcdefdefxyz"
            for turn in range(3):
                reply = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0)
                texts.append(reply.choices[0].text)
                cached.append(reply.usage.prompt_tokens_details.cached_tokens)
                prompt += reply.choices[0].text + "qrs"[turn] * 3  # the conversation resent with a next turn
            return texts, cached, engine.metrics()["prefix_cache_reused_tokens_total"]
        finally:
            server.stop()

    texts, cached, reused = replies(LookaheadConfig())
    plain_texts, plain_cached, plain_reused = replies(NO_CACHE)
    assert texts == plain_texts
    assert cached[0] == 0 and cached[1] > 0 and cached[2] > cached[1] and reused == sum(cached)
    assert plain_cached == [0, 0, 0] and plain_reused == 0
