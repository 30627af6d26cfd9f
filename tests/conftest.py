"""Tiny random-initialised models of several architectures, built in-process (no hub)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from lookahead.cost import CostModel, row_grid

VOCAB = 96
RUN_ON = {"device": "cpu"}  # the device tiny models run on: pytest's --device (conftest's own option)

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
              num_attention_heads=4, max_position_embeddings=1024, pad_token_id=0)


def _llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=2, **COMMON))


def _qwen2():
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(num_key_value_heads=2, **COMMON))


def _qwen3():
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(num_key_value_heads=2, head_dim=16, **COMMON))


def _mistral():
    # every layer uses a sliding window shorter than the generated text
    return transformers.MistralForCausalLM(transformers.MistralConfig(num_key_value_heads=2, sliding_window=12, **COMMON))


def _gemma3():
    # mixed sliding (window 10) and full layers
    cfg = transformers.Gemma3TextConfig(num_key_value_heads=2, head_dim=16, sliding_window=10,
                                        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                        **COMMON)
    return transformers.Gemma3ForCausalLM(cfg)


def _gpt_neox():
    cfg = transformers.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                     num_attention_heads=4, max_position_embeddings=1024, pad_token_id=0)
    return transformers.GPTNeoXForCausalLM(cfg)


def _gpt2():
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=3, n_head=4, n_positions=1024, pad_token_id=0,
                                  bos_token_id=1, eos_token_id=2, initializer_range=0.2)
    return transformers.GPT2LMHeadModel(cfg)


# GPT-2-style configs name their sizes n_embd / n_layer / n_head / n_positions. Some builders widen the
# initial weights (initializer_range=0.2, as for GPT-2): with the default 0.02 their random models loop
# on one token at once, and the EOS-mid-step test finds no fresh token accepted inside a step.
GPT_STYLE = dict(vocab_size=VOCAB, n_embd=64, n_layer=3, n_head=4, n_positions=1024, pad_token_id=0)
SLIDING = 12  # sliding windows shorter than prompt + 48 new tokens


def _phi3():
    return transformers.Phi3ForCausalLM(transformers.Phi3Config(num_key_value_heads=2, **COMMON))


def _phi3_sliding():
    cfg = transformers.Phi3Config(num_key_value_heads=2, sliding_window=SLIDING, **COMMON)
    return transformers.Phi3ForCausalLM(cfg)


def _olmo():
    return transformers.OlmoForCausalLM(transformers.OlmoConfig(num_key_value_heads=2, clip_qkv=4.0, **COMMON))


def _olmo2():
    return transformers.Olmo2ForCausalLM(transformers.Olmo2Config(num_key_value_heads=2, **COMMON))


def _stablelm():
    cfg = transformers.StableLmConfig(num_key_value_heads=2, qk_layernorm=True, use_qkv_bias=True, **COMMON)
    return transformers.StableLmForCausalLM(cfg)


def _granite():
    cfg = transformers.GraniteConfig(num_key_value_heads=2, embedding_multiplier=2.0, attention_multiplier=0.2,
                                     residual_multiplier=0.5, logits_scaling=2.0, **COMMON)
    return transformers.GraniteForCausalLM(cfg)


def _falcon():
    # rotary positions and the new decoder architecture (grouped KV heads); alibi=False
    cfg = transformers.FalconConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                                    num_kv_heads=2, new_decoder_architecture=True, alibi=False,
                                    ffn_hidden_size=128, max_position_embeddings=1024, pad_token_id=0,
                                    initializer_range=0.2)
    return transformers.FalconForCausalLM(cfg)


def _opt():
    cfg = transformers.OPTConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, ffn_dim=128,
                                 num_attention_heads=4, max_position_embeddings=1024, pad_token_id=0,
                                 bos_token_id=1, eos_token_id=2)
    return transformers.OPTForCausalLM(cfg)


def _gptj():
    return transformers.GPTJForCausalLM(transformers.GPTJConfig(rotary_dim=8, n_inner=128, **GPT_STYLE))


def _codegen():
    return transformers.CodeGenForCausalLM(transformers.CodeGenConfig(rotary_dim=8, n_inner=128, n_ctx=1024,
                                                                      **GPT_STYLE))


def _gemma():
    return transformers.GemmaForCausalLM(transformers.GemmaConfig(num_key_value_heads=2, head_dim=16,
                                                                  initializer_range=0.2, **COMMON))


def _gemma2():
    # alternating sliding (window 12) and full layers, attention and final logit soft-capping
    cfg = transformers.Gemma2Config(num_key_value_heads=2, head_dim=16, sliding_window=SLIDING,
                                    attn_logit_softcapping=5.0, final_logit_softcapping=3.0, **COMMON)
    return transformers.Gemma2ForCausalLM(cfg)


def _cohere():
    return transformers.CohereForCausalLM(transformers.CohereConfig(num_key_value_heads=2, use_qk_norm=False,
                                                                    initializer_range=0.2, **COMMON))


def _starcoder2():
    cfg = transformers.Starcoder2Config(num_key_value_heads=2, sliding_window=SLIDING, initializer_range=0.2,
                                        **COMMON)
    return transformers.Starcoder2ForCausalLM(cfg)


def _phi():
    return transformers.PhiForCausalLM(transformers.PhiConfig(qk_layernorm=True, **COMMON))


def _gpt_bigcode():
    return transformers.GPTBigCodeForCausalLM(transformers.GPTBigCodeConfig(n_inner=128, initializer_range=0.2,
                                                                            **GPT_STYLE))


def _mixtral():
    cfg = transformers.MixtralConfig(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                                     sliding_window=SLIDING, **COMMON)
    return transformers.MixtralForCausalLM(cfg)


def _smollm3():
    # every second layer without rotary positions (NoPE), as SmolLM3 does every fourth
    cfg = transformers.SmolLM3Config(num_key_value_heads=2, no_rope_layer_interval=2, initializer_range=0.2,
                                     **COMMON)
    return transformers.SmolLM3ForCausalLM(cfg)


def _glm4():
    return transformers.Glm4ForCausalLM(transformers.Glm4Config(num_key_value_heads=2, head_dim=16, **COMMON))


# The original seven run the whole exactness matrix; the rest run CORE configs (tests/test_exactness.py).
ORIGINAL = ("llama", "qwen2", "qwen3", "mistral", "gemma3", "gpt_neox", "gpt2")
BUILDERS = {"llama": _llama, "qwen2": _qwen2, "qwen3": _qwen3, "mistral": _mistral, "gemma3": _gemma3,
            "gpt_neox": _gpt_neox, "gpt2": _gpt2,
            "phi3": _phi3, "phi3_sliding": _phi3_sliding, "olmo": _olmo, "olmo2": _olmo2, "stablelm": _stablelm,
            "granite": _granite, "falcon": _falcon, "opt": _opt, "gptj": _gptj, "codegen": _codegen,
            "gemma": _gemma, "gemma2": _gemma2, "cohere": _cohere, "starcoder2": _starcoder2, "phi": _phi,
            "gpt_bigcode": _gpt_bigcode, "mixtral": _mixtral, "smollm3": _smollm3, "glm4": _glm4}


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu",
                     help="device the tiny models run on, e.g. cuda: tests/test_exactness.py, test_batch.py and "
                          "test_continuous.py prove greedy exactness there, test_sampling.py and test_draft.py's "
                          "sampling tests the target's distribution (other modules assume the CPU)")


def pytest_configure(config):
    RUN_ON["device"] = config.getoption("--device")
    if not hasattr(config, "workerinput"):  # pytest-xdist's controller, or a run without workers: once, first
        warm_kernels()


def warm_kernels() -> None:
    """Compile lookahead's numba kernels into numba's on-disk cache before any test starts (about a second
    where the cache is there). In a fresh clone every worker, server and CLI subprocess would otherwise
    compile them cold at the same time (55 s of one core each on a 2-core AMD EPYC)."""
    from lookahead.kernels import warmup
    from lookahead.kernels.threads import usable_cores

    warmup(workers=usable_cores())


def tiny_model(arch: str, seed: int = 0, attn: str = "sdpa"):
    """A tiny random model of ``arch`` in float32 eval mode, deterministic in seed; ``attn`` where the
    architecture supports it (as transformers chooses by default), else eager attention."""
    torch.manual_seed(seed)
    model = BUILDERS[arch]()
    if attn == "eager" or model._supports_sdpa:  # noqa: SLF001 (GPT-J, CodeGen, soft-capped Gemma 2: eager only)
        model.config._attn_implementation = attn  # noqa: SLF001 (public setter path differs across 5.x)
    model.generation_config.pad_token_id = 0
    return model.eval().to(RUN_ON["device"])


def tiny_tokenizer():
    """A character-level tokenizer over the tiny models' VOCAB ids, built in-process (no hub):
    <pad> <s> </s>, then one character each, '!' (id 3) up to '}' (id 95)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2}
    vocab.update({chr(33 + i): 3 + i for i in range(VOCAB - 3)})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<pad>"))  # no merges: one token per char
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """The suite computes on one thread: tiny models gain nothing from two, and with another process
    busy on one of two cores every parallel region waits for the descheduled thread (on this
    2-core machine, tests/test_sampling.py took 122 s on 2 threads against 29 s on 1 beside a
    busy process; idle, the same). The SmolLM2 tests run on one thread too. numba's thread pool is
    started first (as a generator starts it): started by a test's first direct call of a kernel, it
    would set the OpenMP runtime it shares with torch to its own count, two, for every later test."""
    from lookahead.kernels.threads import start_numba_threads

    start_numba_threads()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session", autouse=True)
def synthetic_cost_curves():
    """Generators built by the tests get a fixed, mildly rising cost curve (2% more per row,
    no online refinement) instead of measuring this machine: a test's trees must not depend
    on how busy the CPU is (a curve measured under load can make every tree unprofitable).
    tests/test_costmodel.py measures real curves through lookahead.cost.load_cost_model itself
    (lookahead/cost/policy.py is where generators call it). The disk is taken to hold every batch size's
    curve (``cached_cost_model``), so an open batch never waits for one to be measured; tests/test_pending.py
    takes it to hold none."""
    import lookahead.cost.policy as engine

    def load(model, layout, max_rows, context, repeats, cache_dir, batch=1, switches=None, bound_s=12.0,
             keep_busy=False, fresh=False, stop=None):
        rows = np.array(row_grid(max_rows), dtype=np.float64)
        return CostModel(rows, 0.01 * batch * (1.0 + 0.02 * (rows - 1)), smoothing=0.0)

    def cached(model, layout, max_rows, context, repeats, cache_dir, batch=1, switches=None):
        return load(model, layout, max_rows, context, repeats, cache_dir, batch)

    patch = pytest.MonkeyPatch()
    patch.setattr(engine, "load_cost_model", load)
    patch.setattr(engine, "cached_cost_model", cached)
    yield
    patch.undo()


@pytest.fixture(scope="session", params=sorted(BUILDERS))
def arch_model(request):
    """(arch name, model) for every tiny architecture."""
    return request.param, tiny_model(request.param)


def save_model_dir(path, model) -> str:
    """Save ``model`` with a word-level tokenizer (w0 w1 ...) like a local hub directory; its path."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<eos>"] + [f"w{i}" for i in range(VOCAB - 2)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")
    model.generation_config.eos_token_id = 1
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


CUSTOM_CONFIG = '''from transformers import LlamaConfig


class TinyCustomConfig(LlamaConfig):
    model_type = "tiny_custom_lm"
'''
CUSTOM_MODEL = '''from transformers import LlamaForCausalLM

from .configuration_tiny_custom import TinyCustomConfig


class TinyCustomForCausalLM(LlamaForCausalLM):
    config_class = TinyCustomConfig
'''



def save_remote_code_dir(path) -> str:
    """A checkpoint whose config.json points at its own modelling code (a Llama under another name)."""
    import json
    from pathlib import Path

    save_model_dir(path, tiny_model("llama"))
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    config.update(model_type="tiny_custom_lm", architectures=["TinyCustomForCausalLM"],
                  auto_map={"AutoConfig": "configuration_tiny_custom.TinyCustomConfig",
                            "AutoModelForCausalLM": "modeling_tiny_custom.TinyCustomForCausalLM"})
    (path / "config.json").write_text(json.dumps(config))
    (path / "configuration_tiny_custom.py").write_text(CUSTOM_CONFIG)
    (path / "modeling_tiny_custom.py").write_text(CUSTOM_MODEL)
    return str(path)


def save_gguf_header(path, vocab: int) -> str:
    """A GGUF file with a Llama header and a vocabulary of ``vocab`` tokens but no tensors: what a
    vocabulary check may read; loading it as a model fails."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list([f"t{i}" for i in range(vocab)])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def truncate_weights(directory) -> str:
    """Cut a saved model's model.safetensors to half its size (a download cut short); its path."""
    from pathlib import Path

    weights = Path(directory) / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:len(data) // 2])
    return str(weights)


def reference(model, ids, max_new_tokens, eos_token_id=None):
    """model.generate greedy, the ground truth."""
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False)
    if eos_token_id is not None:
        kwargs["eos_token_id"] = eos_token_id
    with torch.inference_mode():
        ids = ids.to(RUN_ON["device"])  # (not model.device: an offloaded model says "meta")
        return model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs).cpu()


def record_compile_seconds(monkeypatch, gen) -> tuple[list[float], list[float]]:
    """Two lists the generator's steps fill as they run: each step's compile seconds (Target.compile_seconds: making a
    trace, capturing a graph) and the seconds the route's re-check observed for it."""
    compiles: list[float] = []
    observed: list[float] = []
    step = gen.target.step

    def stepping(*args, **kwargs):
        logits = step(*args, **kwargs)
        compiles.append(gen.target.compile_seconds)
        return logits

    monkeypatch.setattr(gen.target, "step", stepping)
    monkeypatch.setattr(gen.target, "observe", lambda count, width, seconds: observed.append(seconds))
    return compiles, observed


def make_planner(config, proposers, acceptance, cost):
    """A Planner with a StepChooser of its own, as decode/loop.py gives one to a batch of one."""
    from lookahead.plan.choice import StepChooser
    from lookahead.plan.planner import Planner
    return Planner(config, proposers, acceptance, StepChooser(config, cost, acceptance))


def plan_step(planner, seq: np.ndarray, stop: int, tokens_left: int):
    """(tree, window width) of one sequence's step, as decode/loop.py plans it: rank, choose, cut."""
    ranked = planner.rank(seq, stop, tokens_left)
    width, size = planner.chooser.choose([ranked.probs], planner.column_worth(), ranked.seconds)
    return planner.cut(ranked, size), width


@pytest.fixture(scope="module")
def short_model_dir(tmp_path_factory):
    """A tiny Llama whose context holds 48 positions."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**COMMON, "max_position_embeddings": 48}))
    return save_model_dir(tmp_path_factory.mktemp("short-llama"), model.eval())
