"""GGUF block formats kept as shipped (native/quant.cpp, model/quantized.py): the de-quantized values are the
`gguf` package's to the bit, a row's product has the same bits at any row count, thread count and instruction
set, and lookahead over a model holding such weights equals model.generate and its own plain loop."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from conftest import VOCAB, reference, tiny_model
from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.errors import ModelLoadError
from lookahead.model.attention import use_native
from lookahead.model.quantized import FORMATS, QuantizedEmbedding, QuantizedLinear, quantized_modules, weights_summary
from lookahead.native.build import load_linear

ops = None


@pytest.fixture(scope="module", autouse=True)
def native():
    global ops
    op, why = load_linear()
    if op is None:
        pytest.skip(f"lookahead's C++ op cannot be built here: {why}")
    ops = torch.ops.lookahead_native


ALL = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]
HALVES = {Q.Q4_0: (0,), Q.Q5_0: (0,), Q.Q8_0: (0,), Q.Q4_1: (0, 2), Q.Q5_1: (0, 2), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2),
          Q.Q6_K: (208,)}


def random_blocks(kind: Q, rows: int, inputs: int, seed: int = 0, scale: float = 0.05) -> np.ndarray:
    """Random rows of blocks in format ``kind`` [rows, row bytes]: random quantized bits, finite half scales."""
    rng = np.random.default_rng(seed)
    weights, size = gguf.GGML_QUANT_SIZES[kind]
    raw = rng.integers(0, 256, size=(rows, inputs // weights, size), dtype=np.uint8)
    for offset in HALVES[kind]:
        halves = (rng.standard_normal((rows, inputs // weights)) * scale).astype(np.float16)
        raw[:, :, offset:offset + 2] = halves.view(np.uint8).reshape(rows, inputs // weights, 2)
    return raw.reshape(rows, -1)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def isas() -> list[int]:
    return list(range(int(ops.qisa()) + 1))  # 0 plain C++, 1 AVX2 + FMA, 2 AVX-512F: all this CPU runs


@pytest.mark.parametrize("kind", ALL, ids=lambda k: k.name)
def test_dequantized_values_are_gguf_bits(kind):
    inputs = 512
    blocks = random_blocks(kind, 19, inputs, seed=int(kind))
    ours = ops.qdequantize(torch.from_numpy(blocks), int(kind), inputs).numpy()
    theirs = gguf.quants.dequantize(blocks, kind)
    assert ours.dtype == np.float32 and np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def rows_alone_and_together(product, paths: list[int], blocks: torch.Tensor, kind: Q, x: torch.Tensor,
                            row_counts: tuple[int, ...]) -> torch.Tensor:
    """Each row of x [R, I] through ``product`` alone, asserted bit-equal to the same row among the first
    ``rows`` rows of every count, on one and two threads and every instruction-set path; the alone rows."""
    inputs = x.shape[1]
    alone = torch.cat([product(x[r:r + 1], blocks, int(kind), inputs, None, paths[0]) for r in range(x.shape[0])])
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            for isa in paths:
                for rows in row_counts:
                    got = product(x[:rows], blocks, int(kind), inputs, None, isa)
                    assert torch.equal(bits(got), bits(alone[:rows])), (count, isa, rows)
    finally:
        torch.set_num_threads(threads)
    return alone


@pytest.mark.parametrize("kind", ALL, ids=lambda k: k.name)
def test_a_rows_bits_do_not_depend_on_rows_threads_or_instruction_set(kind):
    inputs, outputs = 512, 45
    blocks = torch.from_numpy(random_blocks(kind, outputs, inputs, seed=7))
    x = torch.randn(70, inputs, generator=torch.Generator().manual_seed(3))  # past a tile (8) and a block (64)
    alone = rows_alone_and_together(ops.qlinear, isas(), blocks, kind, x, (1, 3, 8, 9, 33, 70))
    dense = torch.from_numpy(gguf.quants.dequantize(blocks.numpy(), kind))
    torch.testing.assert_close(alone, x @ dense.T, rtol=1e-4, atol=1e-3)  # the same product, another order


def worked_example() -> tuple[np.ndarray, torch.Tensor]:
    """The worked example of native/quant.cpp and quant8.cpp: a Q8_0 block with d = 0.5, q = [2, -4, 0 ...]
    (weights [1, -2, 0 ...]) and x = [1, 1, 0 ...]."""
    block = np.zeros(34, dtype=np.uint8)
    block[0:2] = np.array([0.5], dtype=np.float16).view(np.uint8)
    block[2:4] = np.array([2, -4], dtype=np.int8).view(np.uint8)
    x = torch.zeros(1, 32)
    x[0, :2] = 1.0
    return block, x


def test_worked_example_q8_0():
    block, x = worked_example()
    out = ops.qlinear(x, torch.from_numpy(block[None]), int(Q.Q8_0), 32, None)
    assert out.tolist() == [[-1.0]]
    layer = QuantizedLinear(torch.from_numpy(block[None]), int(Q.Q8_0), 32, 1, bias=torch.tensor([0.25]))
    assert layer(x).tolist() == [[-0.75]]


def test_a_constructed_near_tie_is_decided_the_same_at_every_row_count():
    """Two outputs whose weights are the same values in another block order: equal sums in exact arithmetic,
    a last-bit tie in float32. Their argmax, and every bit, is the same whether the row is alone or among others."""
    inputs = 1024
    one = random_blocks(Q.Q8_0, 1, inputs, seed=11).reshape(inputs // 32, 34)
    swapped = np.concatenate([one[16:], one[:16]]).reshape(1, -1)  # the same weights, blocks rotated
    blocks = torch.from_numpy(np.concatenate([one.reshape(1, -1), swapped]))
    half = torch.randn(40, inputs // 2, generator=torch.Generator().manual_seed(5))
    rows = torch.cat([half, half], dim=1)  # halves alike: both outputs sum the same terms, in another order
    together = ops.qlinear(rows, blocks, int(Q.Q8_0), inputs, None)
    ties = 0
    for r in range(rows.shape[0]):
        alone = ops.qlinear(rows[r:r + 1], blocks, int(Q.Q8_0), inputs, None)
        assert torch.equal(bits(alone[0]), bits(together[r]))
        assert int(alone.argmax()) == int(together[r].argmax())
        ties += int((together[r, 0] - together[r, 1]).abs() <= together[r].abs().max() * 2e-7)
    assert ties >= 10  # the construction made near-ties (else the test would be vacuous)


def test_bad_blocks_are_named():
    with pytest.raises(RuntimeError, match="not one of the block formats"):
        ops.qlinear(torch.randn(1, 32), torch.zeros(1, 18, dtype=torch.uint8), 99, 32, None)
    with pytest.raises(RuntimeError, match="takes 18 bytes"):
        ops.qlinear(torch.randn(1, 32), torch.zeros(1, 17, dtype=torch.uint8), int(Q.Q4_0), 32, None)
    with pytest.raises(ValueError, match=r"do not hold a \[2, 32\] weight in Q4_0"):
        QuantizedLinear(torch.zeros(3, 18, dtype=torch.uint8), int(Q.Q4_0), 32, 2)
    with pytest.raises(RuntimeError, match="out of range"):
        ops.qrows(torch.zeros(2, 18, dtype=torch.uint8), torch.tensor([2]), int(Q.Q4_0), 32)


# ---- tiny models holding quantized weights: lookahead equals model.generate and its plain loop ----

def quantize_tiny(model: torch.nn.Module, kind: Q, seed: int = 0) -> torch.nn.Module:
    """Every nn.Linear and the embedding of a tiny model replaced by block-format stand-ins: quantized from the
    model's own weights where gguf-py quantizes the format (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), random blocks else."""
    rng_seed = seed
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                weight = child.weight.detach().numpy()
                if kind in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
                    rng_seed += 1
                    blocks = random_blocks(kind, weight.shape[0], weight.shape[1], seed=rng_seed, scale=0.003)
                else:
                    blocks = gguf.quants.quantize(weight, kind)
                bias = child.bias.detach() if child.bias is not None else None
                setattr(module, child_name, QuantizedLinear(torch.from_numpy(blocks), int(kind), child.in_features,
                                                            child.out_features, bias))
            elif type(child) is torch.nn.Embedding:
                blocks = gguf.quants.quantize(child.weight.detach().numpy(), Q.Q8_0)
                setattr(module, child_name, QuantizedEmbedding(torch.from_numpy(blocks), int(Q.Q8_0),
                                                               child.num_embeddings, child.embedding_dim))
    return model


def quantized_model(arch: str, kind: Q) -> torch.nn.Module:
    if kind in (Q.Q4_K, Q.Q5_K, Q.Q6_K):  # K formats: rows of 256 weights
        import transformers

        torch.manual_seed(0)
        config = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[arch](
            vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
        model.generation_config.pad_token_id = 0
    else:
        model = tiny_model(arch)
    return quantize_tiny(model, kind)


PROMPT = torch.tensor([[5, 9, 14, 23, 5, 9, 14, 23, 5, 9, 14, 23, 5, 9]])
# "lade" as the original lookahead decoding runs: a fixed window and tree every step, whatever the cost curve
# measured on a busy test machine says, so that the vacuity guards below always see candidates verified
CONFIGS = {"default": LookaheadConfig(), "lade": LookaheadConfig(window=8, ngram=5, candidates=12, match_length=10,
                                                                    max_tree_nodes=64, budget="fixed"),
           "plain": LookaheadConfig(window=1, ngram=2, candidates=0)}


@pytest.mark.parametrize("arch, kind", [("llama", Q.Q4_0), ("qwen2", Q.Q8_0), ("llama", Q.Q4_1), ("qwen2", Q.Q5_1),
                                        ("llama", Q.Q4_K), ("qwen2", Q.Q6_K), ("llama", Q.Q5_K)],
                         ids=lambda v: getattr(v, "name", v))
def test_quantized_model_greedy_equals_generate_and_the_plain_loop(arch, kind):
    model = quantized_model(arch, kind)
    assert len(quantized_modules(model)) > 0 and "GGUF blocks" in weights_summary(model)
    never = [VOCAB + 1000]
    ref = reference(model, PROMPT, 40, eos_token_id=never)
    outs, speculated = {}, 0
    for name, config in CONFIGS.items():
        gen = LookaheadGenerator(model, config=config)
        outs[name] = gen.generate(PROMPT, max_new_tokens=40, eos_token_id=never)
        if name != "plain":
            speculated += sum(gen.last_stats.accepted) - gen.last_stats.steps
    for name, out in outs.items():
        assert torch.equal(out, ref), f"{arch}/{kind.name}/{name} diverges from model.generate"
    assert speculated > 0  # some step accepted more than one token: the comparison is not vacuous


def test_quantized_modules_refuse_other_devices_with_the_fix():
    layer = QuantizedLinear(torch.zeros(1, 34, dtype=torch.uint8), int(Q.Q8_0), 32, 1)
    with pytest.raises(ModelLoadError, match="weights='dequantized'"):
        layer(torch.zeros(1, 32, device="meta"))


def test_formats_table_matches_gguf():
    for name, code in FORMATS.items():
        assert int(getattr(Q, name)) == code


# ---- integer products (native/quant8.cpp): llama.cpp's arithmetic, still one order for every row count ----

@pytest.mark.parametrize("kind", ALL, ids=lambda k: k.name)
def test_int8_products_have_one_order_at_every_row_count_and_instruction_set(kind):
    inputs = 768 if kind in (Q.Q4_K, Q.Q5_K, Q.Q6_K) else 352  # (352: eleven units, the last pair half empty)
    blocks = torch.from_numpy(random_blocks(kind, 23, inputs, seed=9))
    x = torch.randn(70, inputs, generator=torch.Generator().manual_seed(4))
    paths = [0, 1] if ops.qint8_vnni() else [0]
    alone = rows_alone_and_together(ops.qlinear_int8, paths, blocks, kind, x, (1, 2, 5, 8, 13, 70))
    exact = ops.qlinear(x, blocks, int(kind), inputs, None)
    assert ((alone - exact).norm() / exact.norm()).item() < 0.02  # inputs rounded to 8 bits: near, not equal


def test_int8_worked_example():
    block, x = worked_example()
    out = ops.qlinear_int8(x, torch.from_numpy(block[None]), int(Q.Q8_0), 32, None)
    assert abs(out.item() + 1.0) < 1e-6


def test_int8_k_worked_example():
    """native/quant8k.h's head: a Q4_K super-block with d 1, dmin 0, every scale 1 and every q 2, x all 1 -> 512."""
    block = np.zeros(144, dtype=np.uint8)
    block[0:2] = np.array([1.0], dtype=np.float16).view(np.uint8)
    block[4:8] = 1  # sub-blocks 0-3: scale 1, min 0 (the six-bit pairs of scale_min_k4)
    block[12:16] = 1  # sub-blocks 4-7: scale 1 (low nibbles), min 0 (high nibbles)
    block[16:] = 0x22  # every nibble 2
    blocks = torch.from_numpy(block[None])
    assert torch.equal(ops.qlinear(torch.ones(1, 256), blocks, int(Q.Q4_K), 256, None), torch.tensor([[512.0]]))
    for isa in isas_int8():
        assert ops.qlinear_int8(torch.ones(1, 256), blocks, int(Q.Q4_K), 256, None, isa).item() == 512.0


def isas_int8() -> list[int]:
    """The integer products' paths this CPU runs (0: plain C++; 1: AVX-512 VNNI)."""
    return [0, 1] if ops.qint8_vnni() else [0]


@pytest.mark.parametrize("arch, kind", [("llama", Q.Q4_1), ("qwen2", Q.Q4_K), ("llama", Q.Q6_K), ("qwen2", Q.Q5_0)],
                         ids=lambda v: getattr(v, "name", v))
def test_int8_model_greedy_equals_generate_and_the_plain_loop(arch, kind):
    model = quantized_model(arch, kind)
    for module in quantized_modules(model):
        if isinstance(module, QuantizedLinear):
            module.products = "int8"
    assert "int8 products" in weights_summary(model)
    assert use_native(model)  # (as load_model does: model.generate attends through lookahead's op)
    never = [VOCAB + 1000]
    ref = reference(model, PROMPT, 40, eos_token_id=never)
    speculated = 0
    for config in CONFIGS.values():
        gen = LookaheadGenerator(model, config=config)
        assert torch.equal(gen.generate(PROMPT, max_new_tokens=40, eos_token_id=never), ref)
        speculated += sum(gen.last_stats.accepted) - gen.last_stats.steps
    assert speculated > 0


def test_many_rows_go_through_tiles_except_in_decode_steps():
    from lookahead.model.quantized import TILES_ROWS_MIN, kernel_only

    blocks = torch.from_numpy(random_blocks(Q.Q4_K, 300, 512, seed=2))  # (300 outputs: a last short tile)
    layer = QuantizedLinear(blocks, int(Q.Q4_K), 512, 300, bias=torch.randn(300))
    x = torch.randn(TILES_ROWS_MIN + 5, 512)
    tiled = layer(x)  # (a prefill's rows: tiles)
    few = layer(x[:3])  # (fewer rows than TILES_ROWS_MIN: the kernel)
    with kernel_only([layer]):
        assert not layer.tiles
        kernel = layer(x)
    assert layer.tiles
    torch.testing.assert_close(tiled, kernel, rtol=1e-3, atol=1e-3)
    assert not torch.equal(bits(tiled), bits(kernel))  # (another order: the test sees which path ran)
    assert torch.equal(bits(few), bits(kernel[:3]))
    batch = x[:3 * 22].view(3, 22, 512)  # (66 rows in all, 22 a sequence: each takes its path alone, the kernel)
    assert torch.equal(bits(layer(batch)), bits(torch.cat([layer(part) for part in batch]).view(3, 22, -1)))
    assert torch.equal(bits(layer(batch)[0]), bits(kernel[:22]))
    layer.products = "int8"  # integer products never take tiles: their kernel serves a prefill
    assert torch.equal(layer(x), torch.ops.lookahead_native.qlinear_int8(x, blocks, int(Q.Q4_K), 512, layer.bias))


def test_a_long_prompt_prefilled_through_tiles_decodes_as_the_plain_loop():
    model = quantized_model("llama", Q.Q4_0)
    use_native(model)  # (as load_model does)
    prompt = torch.cat([PROMPT] * 6, dim=1)  # 84 rows: the prefill goes through tiles
    never = [VOCAB + 1000]
    plain = LookaheadGenerator(model, config=CONFIGS["plain"]).generate(prompt, max_new_tokens=30, eos_token_id=never)
    assert torch.equal(plain, reference(model, prompt, 30, eos_token_id=never))  # (model.generate prefills alike)
    speculated = 0
    for config in (CONFIGS["default"], CONFIGS["lade"]):
        gen = LookaheadGenerator(model, config=config)
        assert torch.equal(gen.generate(prompt, max_new_tokens=30, eos_token_id=never), plain)
        speculated += sum(gen.last_stats.accepted) - gen.last_stats.steps
    assert speculated > 0


# ---- the real default model, loaded with its blocks kept (slow: the registry's GGUF) ----

@pytest.fixture(scope="module")
def smollm2_both():
    from lookahead import load_model

    return load_model("smollm2-135m", products="float32"), load_model("smollm2-135m", weights="dequantized")[0]


@pytest.mark.slow
def test_the_default_model_keeps_its_blocks_and_their_values_are_the_float_models(smollm2_both):
    (model, tokenizer), dense = smollm2_both
    held = {name: m for name, m in model.named_modules() if isinstance(m, QuantizedLinear)}
    assert {m.format_name for m in held.values()} == {"Q4_1", "Q8_0"}  # its layers, and the tied head
    assert isinstance(model.get_input_embeddings(), QuantizedEmbedding)
    assert model.lm_head.blocks is model.get_input_embeddings().blocks  # tied: one copy of the table
    modules = dict(dense.named_modules())
    for name, layer in held.items():
        assert torch.equal(bits(layer.dequantized()), bits(modules[name].weight.detach())), name
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, dense(ids).logits, rtol=1e-3, atol=1e-3)


@pytest.mark.slow
def test_the_default_model_decodes_as_its_plain_loop_and_generate(smollm2_both):
    (model, tokenizer), _ = smollm2_both
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Write a Python function that reverses a list."}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    plain = LookaheadGenerator(model, tokenizer, CONFIGS["plain"]).generate(ids, max_new_tokens=48)
    gen = LookaheadGenerator(model, tokenizer)
    assert torch.equal(gen.generate(ids, max_new_tokens=48), plain)
    assert gen.last_stats.steps < gen.last_stats.new_tokens


def test_bad_weights_choices_are_named(tmp_path):
    from lookahead import load_model

    with pytest.raises(ModelLoadError, match="weights must be one of auto, quantized, dequantized"):
        load_model("smollm2-135m", weights="q4")
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match="computes in float32, not torch.bfloat16.*weights='dequantized'"):
        load_model(str(gguf), dtype=torch.bfloat16, weights="quantized")


@pytest.mark.slow
def test_a_one_row_step_attends_as_a_multi_row_step_does(smollm2_both):
    """Untraced, a one-row step goes through lookahead's attention op as multi-row steps do, so the first
    step's row (the last prompt token) reaches every layer with the same bits alone or in a tree (through
    transformers' SDPA without a mask, the attention output differed in its last bits)."""
    (model, tokenizer), _ = smollm2_both
    layers = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Write a Python function that reverses a "
                                                                     "string."}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]

    def first_step_inputs(config: LookaheadConfig) -> tuple[list[torch.Tensor], int]:
        seen: dict[int, tuple[torch.Tensor, int]] = {}

        def hook(module, args, out):
            x = args[0].reshape(-1, args[0].shape[-1])
            if x.shape[0] < ids.shape[1] - 1:  # (not the prefill: the prompt but its last token)
                seen.setdefault(id(module), (x[0].clone(), x.shape[0]))
        generator = LookaheadGenerator(model, tokenizer, config)
        hooks = [layer.register_forward_hook(hook) for layer in layers]
        try:
            generator.generate(ids, max_new_tokens=2)
        finally:
            for h in hooks:
                h.remove()
        return [seen[id(layer)][0] for layer in layers], seen[id(layers[0])][1]

    alone, one = first_step_inputs(LookaheadConfig(window=1, ngram=2, candidates=0, auto_window=False,
                                                   traced_forward=False))
    in_tree, rows = first_step_inputs(LookaheadConfig(window=3, ngram=3, candidates=4, auto_window=False,
                                                      budget="fixed", traced_forward=False))
    assert one == 1 and rows > 1  # (else the comparison would be vacuous)
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(alone, in_tree))


# ---- Q4_K / Q6_K repacked sixteen rows at a time (native/quant8x16.h) ----

PACKED = [Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q6_K]


@pytest.mark.parametrize("kind", PACKED, ids=lambda k: k.name)
def test_the_16_row_layout_gives_back_the_blocks_byte_for_byte(kind):
    blocks = torch.from_numpy(random_blocks(kind, 48, 768, seed=11))
    packed = ops.qpack16(blocks, int(kind), 768)
    assert packed.numel() == blocks.numel() + (64 * 3 * 3 if kind == Q.Q4_K else 0)  # (Q4_K: its scales as bytes)
    assert packed.shape[0] == 3 and packed.numel() >= blocks.numel()
    assert torch.equal(ops.qunpack16(packed, int(kind), 768), blocks)


@pytest.mark.parametrize("kind", PACKED, ids=lambda k: k.name)
def test_16_row_products_have_one_order_at_every_row_count_and_instruction_set(kind):
    blocks = torch.from_numpy(random_blocks(kind, 32, 768, seed=12))
    packed = ops.qpack16(blocks, int(kind), 768)
    x = torch.randn(70, 768, generator=torch.Generator().manual_seed(5))
    alone = rows_alone_and_together(ops.qlinear_int8_x16, isas_x16(kind), packed, kind, x,
                                    (1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 33, 70))  # (AVX2 passes: up to 8 or 16 rows)
    # the same integers as the row-major integer products, their floats summed in another order: near, not equal
    torch.testing.assert_close(alone, ops.qlinear_int8(x, blocks, int(kind), 768, None), rtol=1e-4, atol=1e-3)


def isas_x16(kind: Q = Q.Q4_K) -> list[int]:
    """The packed products' paths this CPU runs for ``kind`` (0: plain C++; 1: AVX-512 VNNI; 2: AMX tiles; 3:
    AVX2)."""
    return isas_int8() + ([2] if ops.qint8_amx() and kind in PACKED else []) + ([3] if ops.qint8_avx2() else [])


def test_16_row_worked_example_q8_0():
    """native/quant8x16s.h's head: the Q8_0 block of test_int8_worked_example in all 16 rows -> -1 each."""
    block, x = worked_example()
    packed = ops.qpack16(torch.from_numpy(np.tile(block, (16, 1))), int(Q.Q8_0), 32)
    for isa in isas_x16(Q.Q8_0):
        out = ops.qlinear_int8_x16(x, packed, int(Q.Q8_0), 32, None, isa)
        assert out.shape == (1, 16) and (out + 1.0).abs().max() < 1e-6


@pytest.mark.parametrize("kind", [Q.Q4_1, Q.Q5_0, Q.Q8_0], ids=lambda k: k.name)
def test_32_weight_blocks_in_an_odd_count_give_every_path_the_same_bits(kind):
    """(the AMX kernel takes a row's blocks two at a time, the last of an odd count alone: 96 inputs, 3 blocks)"""
    blocks = torch.from_numpy(random_blocks(kind, 32, 96, seed=21))
    packed = ops.qpack16(blocks, int(kind), 96)
    x = torch.randn(40, 96, generator=torch.Generator().manual_seed(9))
    plain = ops.qlinear_int8_x16(x, packed, int(kind), 96, None, 0)
    for isa in isas_x16(kind):
        for rows in (1, 5, 16, 17, 40):
            got = ops.qlinear_int8_x16(x[:rows], packed, int(kind), 96, None, isa)
            assert torch.equal(bits(got), bits(plain[:rows])), (isa, rows)


@pytest.mark.parametrize("outputs", [16, 48, 80], ids=lambda o: f"{o // 16}groups")
@pytest.mark.parametrize("kind", PACKED, ids=lambda k: k.name)
def test_groups_taken_in_pairs_give_every_path_the_same_bits(kind, outputs):
    """(the VNNI products take a thread's groups of 16 outputs two at a time, a last odd one alone, the K formats'
    from five rows: one, three and five groups, split between one or two threads; the many-row kernels' passes
    hold up to 64 rows: 65 and 130 rows are two and three passes)"""
    inputs = 512 if kind in (Q.Q4_K, Q.Q6_K) else 128
    blocks = torch.from_numpy(random_blocks(kind, outputs, inputs, seed=23))
    packed = ops.qpack16(blocks, int(kind), inputs)
    x = torch.randn(130, inputs, generator=torch.Generator().manual_seed(10))
    rows_alone_and_together(ops.qlinear_int8_x16, isas_x16(kind), packed, kind, x,
                            (1, 2, 3, 4, 5, 16, 17, 33, 64, 65, 130))


def test_the_automatic_path_switches_to_tiles_from_amx_rows_with_the_same_bits():
    x = torch.randn(20, 512, generator=torch.Generator().manual_seed(7))
    for kind in (Q.Q5_0, Q.Q4_K):
        blocks = torch.from_numpy(random_blocks(kind, 32, 512, seed=16))
        packed = ops.qpack16(blocks, int(kind), 512)
        plain = ops.qlinear_int8_x16(x, packed, int(kind), 512, None, 0)
        for rows in (1, 3, 8, 20):
            for amx_rows in (0, 1, 4, 16):
                got = ops.qlinear_int8_x16(x[:rows], packed, int(kind), 512, None, -1, amx_rows)
                assert torch.equal(bits(got), bits(plain[:rows])), (kind, rows, amx_rows)
    blocks = torch.from_numpy(random_blocks(Q.Q4_K, 32, 512, seed=16))
    packed = ops.qpack16(blocks, int(Q.Q4_K), 512)
    plain = ops.qlinear_int8_x16(x, packed, int(Q.Q4_K), 512, None, 0)
    for ahead in (0, 64, 4096):  # (how far ahead the weights are asked for: the time only)
        assert torch.equal(bits(ops.qlinear_int8_x16(x, packed, int(Q.Q4_K), 512, None, -1, 4, ahead)), bits(plain))
    if not ops.qint8_amx():
        with pytest.raises(RuntimeError, match="no AMX tiles"):
            ops.qlinear_int8_x16(x, packed, int(Q.Q4_K), 512, None, 2)
    with pytest.raises(RuntimeError, match="prefetch must be 0 to"):
        ops.qlinear_int8_x16(x, packed, int(Q.Q4_K), 512, None, -1, 0, -1)
    with pytest.raises(RuntimeError, match="isa must be -1, 0, 1, 2 or 3"):
        ops.qlinear_int8_x16(x, packed, int(Q.Q4_K), 512, None, 4)
    if not ops.qint8_avx2():
        with pytest.raises(RuntimeError, match="no AVX2, FMA and F16C"):
            ops.qlinear_int8_x16(x, packed, int(Q.Q4_K), 512, None, 3)


def test_amx_rows_is_where_tiles_win_from_there_on():
    from lookahead.model.products import amx_rows

    vnni = {"2": 1.0, "4": 2.0, "8": 4.0, "16": 8.0}
    assert amx_rows({"vnni": vnni, "amx": {"2": 2.0, "4": 2.5, "8": 3.0, "16": 4.0}}) == 8  # (the docstring's)
    assert amx_rows({"vnni": vnni, "amx": {"2": 0.5, "4": 2.5, "8": 3.0, "16": 4.0}}) == 8  # (not a lone win)
    assert amx_rows({"vnni": vnni, "amx": {"2": 0.5, "4": 1.0, "8": 3.0, "16": 4.0}}) == 2
    assert amx_rows({"vnni": vnni, "amx": {"2": 2.0, "4": 2.5, "8": 5.0, "16": 9.0}}) == 0
    assert amx_rows({"vnni": vnni}) == 0 and amx_rows({}) == 0


def test_16_row_worked_example():
    """native/quant8x16.h's head: the Q4_K super-block of test_int8_k_worked_example in all 16 rows -> 512 each."""
    block = np.zeros(144, dtype=np.uint8)
    block[0:2] = np.array([1.0], dtype=np.float16).view(np.uint8)
    block[4:8] = 1
    block[12:16] = 1
    block[16:] = 0x22
    packed = ops.qpack16(torch.from_numpy(np.tile(block, (16, 1))), int(Q.Q4_K), 256)
    for isa in isas_x16():
        assert torch.equal(ops.qlinear_int8_x16(torch.ones(1, 256), packed, int(Q.Q4_K), 256, None, isa),
                           torch.full((1, 16), 512.0))


def test_a_constructed_near_tie_of_16_row_products_is_decided_the_same_at_every_row_count():
    """Two outputs whose products differ only in the last float bits: every row count sees the same bits."""
    blocks = random_blocks(Q.Q6_K, 16, 256, seed=13)
    blocks[1] = blocks[0]
    blocks[1, 192] = blocks[0, 192] ^ 1  # (one group's scale off by one: outputs 0 and 1 nearly tie)
    packed = ops.qpack16(torch.from_numpy(blocks), int(Q.Q6_K), 256)
    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(6))
    x[:, 0:16] = 0.0
    x[:, 0] = 0.05  # (that group's one input small: the scale's difference is a small part of the output)
    together = ops.qlinear_int8_x16(x, packed, int(Q.Q6_K), 256, None)
    for r in range(9):
        assert torch.equal(bits(ops.qlinear_int8_x16(x[r:r + 1], packed, int(Q.Q6_K), 256, None)),
                           bits(together[r:r + 1]))
    gap = (together[:, 0] - together[:, 1]).abs()
    assert (gap > 0).all() and (gap < 0.02 * together[:, 0].abs()).all()


def test_an_int8_layer_holds_its_blocks_repacked_and_gives_them_back():
    blocks = torch.from_numpy(random_blocks(Q.Q4_K, 32, 512, seed=14))
    layer = QuantizedLinear(blocks.clone(), int(Q.Q4_K), 512, 32, bias=torch.randn(32))
    x = torch.randn(3, 512)
    layer.products = "int8"
    assert layer.blocks is None and layer.packed is not None
    assert "repacked by 16 rows" in weights_summary(layer)
    assert torch.equal(layer(x), ops.qlinear_int8_x16(x, layer.packed, int(Q.Q4_K), 512, layer.bias))
    assert torch.equal(layer.dequantized(), ops.qdequantize(blocks, int(Q.Q4_K), 512))
    layer.products = "float32"
    assert layer.packed is None and torch.equal(layer.blocks, blocks)
    odd = QuantizedLinear(blocks[:24].clone(), int(Q.Q4_K), 512, 24, products="int8")  # (24 rows: not by 16)
    assert odd.packed is None and torch.equal(odd(x), ops.qlinear_int8(x, blocks[:24], int(Q.Q4_K), 512, None))


def test_bad_16_row_layouts_are_named():
    with pytest.raises(RuntimeError, match="no 16-row layout"):
        ops.qpack16(torch.zeros(16, 18, dtype=torch.uint8), int(Q.Q4_0), 32)
    with pytest.raises(RuntimeError, match="multiple of 32 inputs and of 16 outputs"):
        ops.qpack16(torch.zeros(8, 20, dtype=torch.uint8), int(Q.Q4_1), 32)
    with pytest.raises(RuntimeError, match="multiple of 256 inputs and of 16 outputs"):
        ops.qpack16(torch.zeros(8, 144, dtype=torch.uint8), int(Q.Q4_K), 256)
    with pytest.raises(RuntimeError, match="qpack16's uint8 CPU tensor"):
        ops.qlinear_int8_x16(torch.ones(1, 256), torch.zeros(1, 100, dtype=torch.uint8), int(Q.Q4_K), 256, None)


def test_a_tied_head_repacked_for_int8_shares_its_layout_with_the_embedding():
    from lookahead.model.products import set_products

    blocks = torch.from_numpy(random_blocks(Q.Q6_K, 48, 256, seed=15))
    model = torch.nn.Module()
    model.embed = QuantizedEmbedding(blocks, int(Q.Q6_K), 48, 256)
    model.head = QuantizedLinear(model.embed.blocks, int(Q.Q6_K), 256, 48)
    ids = torch.tensor([[0, 47, 17, 17, 3]])
    before = model.embed(ids)
    set_products(model, "int8")
    assert model.embed.blocks is None and model.embed.packed is model.head.packed  # (one copy of the table)
    assert torch.equal(model.embed(ids), before)
    assert model.embed(torch.zeros(0, dtype=torch.long)).shape == (0, 256)
    with pytest.raises(RuntimeError, match="id 48 is out of range"):
        model.embed(torch.tensor([1, 48]))


@pytest.mark.parametrize("kind", PACKED, ids=lambda k: k.name)
def test_16_row_products_at_the_extremes_give_the_plain_paths_bits(kind):
    """Every weight at its largest or smallest value (Q8_0's -128 too) by inputs all at +-127 after rounding: the
    AVX2 path sums pairs of byte products in 16 bits (native/quant8x16.h), and none may saturate."""
    weights, size = gguf.GGML_QUANT_SIZES[kind]
    x = torch.cat([torch.ones(1, 512), -torch.ones(1, 512),
                   torch.sign(torch.randn(2, 512, generator=torch.Generator().manual_seed(8))) + 0.0])
    for fill in (0xFF, 0x80, 0x7F, 0x00):
        blocks = np.full((32, 512 // weights, size), fill, dtype=np.uint8)
        for offset in HALVES[kind]:
            blocks[:, :, offset:offset + 2] = np.array([0.01], dtype=np.float16).view(np.uint8)
        packed = ops.qpack16(torch.from_numpy(blocks.reshape(32, -1)), int(kind), 512)
        for rows in (x, torch.cat([x, x, x])):  # (4 rows: the register-held AVX2 kernels; 12: the many-row ones)
            plain = ops.qlinear_int8_x16(rows, packed, int(kind), 512, None, 0)
            assert plain.abs().max() > 0 or fill == 0x00
            for isa in isas_x16(kind):
                assert torch.equal(bits(ops.qlinear_int8_x16(rows, packed, int(kind), 512, None, isa)), bits(plain)), \
                    (hex(fill), isa, rows.shape[0])
