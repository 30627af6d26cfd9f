"""load_model's refusals: each bad argument or checkpoint gets one clear error before anything heavy runs."""

from __future__ import annotations

import pytest
import torch
import transformers

from conftest import save_model_dir, save_remote_code_dir, tiny_model
from lookahead import DeviceError, LookaheadGenerator, ModelLoadError, UnsupportedModelError, load_model
from lookahead.checkpoint import REMOTE_CODE_FIX
from lookahead.device import resolve_device
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
