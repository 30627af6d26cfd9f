"""load_model's refusals: each bad argument or checkpoint gets one clear error before anything heavy runs."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import transformers

import lookahead.loading.models as models
from conftest import COMMON, save_gguf_header, save_model_dir, save_remote_code_dir, tiny_model, truncate_weights
from lookahead import DeviceError, LookaheadGenerator, ModelLoadError, UnsupportedModelError, load_model
from lookahead.proposers.draft.checks import DraftModelError, check_draft_source
from lookahead.loading.checkpoint import REMOTE_CODE_FIX
from lookahead.loading.device import resolve_device
from lookahead.errors import one_line

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir(tmp_path_factory.mktemp("tiny-llama"), tiny_model("llama"))


@pytest.fixture(scope="module")
def remote_code_dir(tmp_path_factory):
    return save_remote_code_dir(tmp_path_factory.mktemp("tiny-custom"))


def test_a_saved_model_loads(model_dir):
    model, tokenizer = load_model(model_dir)
    assert model.config.model_type == "llama" and tokenizer("w3 w4")["input_ids"] == [5, 6]


@pytest.mark.parametrize("kwargs, words", [
    (dict(attn_implementation="flash_attention_2"), "attn_implementation 'flash_attention_2' cannot take"),
    (dict(dtype=torch.int64), "dtype must be a floating torch dtype"),
    (dict(dtype="float32"), "dtype must be a floating torch dtype"),
    (dict(trust_remote_code="yes"), "trust_remote_code must be True or False"),
])
def test_bad_load_arguments(model_dir, kwargs, words):
    with pytest.raises(ModelLoadError, match=words):
        load_model(model_dir, **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda(model_dir):
    with pytest.raises(DeviceError, match="device 'cuda' is not available on this machine.*use 'cpu'"):
        load_model(model_dir, device="cuda")


@pytest.mark.parametrize("device, words", [
    ("gpu", "unknown device 'gpu'"),
    ("cuda:99", "cuda"),
    ("meta", "holds no weights"),
    (3.5, "unknown device"),
])
def test_bad_devices(device, words):
    with pytest.raises(DeviceError, match=words):
        resolve_device(device)


def test_cpu_is_always_there():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


def test_encoder_decoder_checkpoint_is_refused_before_loading_weights(tmp_path):
    transformers.T5Config(vocab_size=32, d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8).save_pretrained(
        tmp_path)
    with pytest.raises(ModelLoadError, match="'t5'.* is an encoder-decoder model"):
        load_model(str(tmp_path))


def test_non_causal_checkpoint_is_refused(tmp_path):
    transformers.ViTConfig().save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="is not a causal language model"):
        load_model(str(tmp_path))


def test_remote_code_is_refused_unless_trusted(remote_code_dir):
    with pytest.raises(ModelLoadError, match="ships its own modelling code.*pass trust_remote_code=True") as refused:
        load_model(remote_code_dir)
    assert refused.value.fix is REMOTE_CODE_FIX  # the CLI spells it --trust-remote-code


def test_trusted_remote_code_loads_and_is_then_an_untested_architecture(remote_code_dir):
    model, _ = load_model(remote_code_dir, trust_remote_code=True)
    assert type(model).__name__ == "TinyCustomForCausalLM"
    with pytest.raises(UnsupportedModelError, match="'tiny_custom_lm' is not among"):
        LookaheadGenerator(model)


def test_load_errors_keep_the_whole_text_on_one_line(tmp_path):
    """transformers' own message (several lines, often longer than 120 characters) is kept whole."""
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')  # no weights
    with pytest.raises(ModelLoadError) as failed:
        load_model(str(tmp_path))
    cause = failed.value.__cause__
    assert cause is not None and one_line(cause) in str(failed.value)
    assert "\n" not in str(failed.value) and f"local directory {tmp_path}" in str(failed.value)


def test_one_line_joins_every_line():
    assert one_line(ValueError("first line\n  second line, with the fix\n")) == "first line second line, with the fix"
    assert one_line(ValueError("")) == "ValueError"


# ------------------------------------------------------------------ typos, damaged files, vocabularies before weights


def no_hub(monkeypatch):
    """Fail the test if anything reads a config (the first thing a hub lookup does)."""
    def refuse(*args, **kwargs):
        pytest.fail("a config was read: the name went on to the hub")

    monkeypatch.setattr(models, "read_config_dict", refuse)


@pytest.mark.parametrize("name, alias", [("smollm2-13m", "smollm2-135m"), ("SmolLM2-135M", "smollm2-135m"),
                                         ("qwen2.5-coder-1.5", "qwen2.5-coder-1.5b"), ("gemma3", "gemma3-270m")])
def test_an_alias_typo_fails_at_once_naming_the_alias(monkeypatch, tmp_path, name, alias):
    monkeypatch.chdir(tmp_path)
    no_hub(monkeypatch)
    with pytest.raises(ModelLoadError, match=f"unknown model '{name}'.*did you mean {alias}\\?.*name a hub "
                                             f"model as org/name"):
        load_model(name, cache_dir=tmp_path)


def test_the_typo_rule_leaves_hub_ids_paths_and_unlike_names_alone(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2-13m").mkdir()  # an existing directory is tried as one, however it is spelled
    for name in ("org/smollm2-13m", "smollm2-13m", "gpt2", "smollm2-13m.gguf"):
        models.check_alias_typo(name, models.Path(name))
    with pytest.raises(ModelLoadError, match="has no config.json"):
        load_model("smollm2-13m")


def test_a_local_directory_named_like_an_alias_typo_loads(model_dir, tmp_path, monkeypatch):
    import shutil

    shutil.copytree(model_dir, tmp_path / "smollm2-13m")
    monkeypatch.chdir(tmp_path)
    model, _ = load_model("smollm2-13m")
    assert model.config.model_type == "llama"


def test_a_corrupt_gguf_is_named(tmp_path):
    import struct

    path = tmp_path / "cut.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 5, 10) + b"\x01\x02")  # the header, cut short
    with pytest.raises(ModelLoadError, match=f"cannot read the GGUF file {path} .*damaged.*download it again"):
        load_model(str(path), cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache" / "models").exists() or not any((tmp_path / "cache" / "models").iterdir())


def test_truncated_cached_weights_name_the_file_and_the_directory_to_delete(tmp_path):
    cached = tmp_path / "models" / "smollm2-135m"
    save_model_dir(cached, tiny_model("llama"))
    weights = truncate_weights(cached)
    with pytest.raises(ModelLoadError) as failed:
        load_model("smollm2-135m", cache_dir=tmp_path, weights="dequantized")  # (the float weights' cache)
    assert f"the weights file {weights} cannot be read" in str(failed.value)
    assert f"delete the directory {cached} to rebuild it" in str(failed.value)


def test_truncated_weights_of_a_local_directory_are_named(tmp_path):
    save_model_dir(tmp_path / "mine", tiny_model("llama"))
    weights = truncate_weights(tmp_path / "mine")
    with pytest.raises(ModelLoadError, match=f"the weights file {weights} cannot be read.*download the checkpoint"):
        load_model(str(tmp_path / "mine"))


def test_declared_vocabulary_is_read_without_weights(tmp_path, model_dir):
    gguf = save_gguf_header(tmp_path / "draft.gguf", 128)
    assert models.declared_vocab_size(gguf, cache_dir=tmp_path) == 128  # from the header
    assert models.declared_vocab_size(model_dir) == 96  # from config.json
    assert models.declared_vocab_size("qwen2.5-coder-1.5b", cache_dir=tmp_path / "empty") is None  # not assembled
    assert models.declared_vocab_size("org/not-cached", cache_dir=tmp_path) is None  # the hub is not asked


def test_a_draft_of_another_vocabulary_is_refused_before_its_weights_load(tmp_path):
    target = tiny_model("llama")
    draft_dir = save_model_dir(tmp_path / "draft", transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**{**COMMON, "vocab_size": 128})))
    truncate_weights(draft_dir)  # loading it would fail otherwise
    for name in (draft_dir, save_gguf_header(tmp_path / "draft.gguf", 128)):
        with pytest.raises(DraftModelError, match="declares a vocabulary of 128 tokens.*the target has 96"):
            check_draft_source(target, name, cache_dir=tmp_path)
    check_draft_source(target, save_gguf_header(tmp_path / "same.gguf", 96), cache_dir=tmp_path)  # no objection
    check_draft_source(target, "org/unknown", cache_dir=tmp_path)  # unknown without loading: check_draft later


BUILDER = """
import sys, time
from pathlib import Path
from lookahead.loading.models import one_builder
cache = Path(sys.argv[1])
with one_builder(cache, "tiny"):
    if not (cache / "built").exists():  # what resolve_local_dir checks again once it holds the lock
        with open(cache / "builds", "a") as log:
            log.write("built\\n")
        time.sleep(0.5)
        (cache / "built").write_text("done")
"""


def test_two_processes_loading_one_model_first_build_it_once(tmp_path):
    """Two processes (two test workers, a server beside generate) that load a model into an empty cache
    at once: the second waits for the first's build and finds it, rather than building beside it."""
    procs = [subprocess.Popen([sys.executable, "-c", BUILDER, str(tmp_path)]) for _ in range(2)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    assert (tmp_path / "builds").read_text() == "built\n" and (tmp_path / "built").read_text() == "done"


def test_the_collector_is_paused_while_a_model_loads_and_back_after(tmp_path, monkeypatch):
    """loading/collector.py: off inside load_model (also when the load fails), on again after; a collector
    the caller had turned off stays off."""
    import gc

    from lookahead.loading.collector import collections_paused

    directory = save_model_dir(tmp_path / "model", tiny_model("llama"))
    seen: list[bool] = []
    load = models._load_model

    def watched(*args):
        seen.append(gc.isenabled())
        return load(*args)

    monkeypatch.setattr(models, "_load_model", watched)
    assert gc.isenabled()
    model, _ = load_model(directory)
    assert seen == [False] and gc.isenabled() and model is not None
    with pytest.raises(ModelLoadError):
        load_model(str(tmp_path / "nowhere"))
    assert seen == [False, False] and gc.isenabled()
    gc.disable()
    try:
        with collections_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # (it was off before)
    finally:
        gc.enable()
    with pytest.raises(RuntimeError), collections_paused():
        raise RuntimeError("the body fails")
    assert gc.isenabled()


def test_the_gguf_weights_map_is_made_once_and_kept_with_what_it_follows(tmp_path):
    """(loading/gguf.py's ``weights_map``: transformers' GGUF-to-parameter name map, kept in the header directory
    and read back only where the versions, architecture, processor and parameter names are as they were)"""
    from lookahead.loading.gguf import WEIGHTS_MAP, weights_map

    class Processor:
        pass

    made = []

    def make(model, processor):
        made.append(1)
        return {f"gguf.{name}": name for name in model.state_dict()}

    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    first = weights_map(model, Processor(), "llama", tmp_path, make)
    assert first == {"gguf.0.weight": "0.weight", "gguf.0.bias": "0.bias", "gguf.1.weight": "1.weight",
                     "gguf.1.bias": "1.bias"} and len(made) == 1 and (tmp_path / WEIGHTS_MAP).is_file()
    assert weights_map(model, Processor(), "llama", tmp_path, make) == first and len(made) == 1  # (read back)
    assert weights_map(model, Processor(), "qwen2", tmp_path, make) == first and len(made) == 2  # (made again)
    other = torch.nn.Sequential(torch.nn.Linear(2, 3))
    assert weights_map(other, Processor(), "qwen2", tmp_path, make) == {"gguf.0.weight": "0.weight",
                                                                        "gguf.0.bias": "0.bias"}
    assert len(made) == 3  # (other parameter names: not the kept map)
    (tmp_path / WEIGHTS_MAP).write_text("{not json")
    assert weights_map(other, Processor(), "qwen2", tmp_path, make) and len(made) == 4  # (a damaged file: made)
    assert weights_map(other, Processor(), "qwen2", tmp_path / "missing" / "dir", make) and len(made) == 5
    assert not any(p.name.endswith(".partial") for p in tmp_path.iterdir())
