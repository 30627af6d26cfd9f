"""Models loaded with accelerate's device_map, CPU and disk offload included, decode exactly
as model.generate; the input device comes from accelerate's hook, not from the first parameter."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from conftest import VOCAB, reference, tiny_model
from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.cost import model_fingerprint
from lookahead.model.support import check_model
from lookahead.model.target import Target, input_device, spans_devices

NEW = 40
NO_EOS = [VOCAB + 1000]  # an id that never occurs
# Layers 0 and 2 stay in memory; the embedding, layer 1 and the head are read from disk at every forward.
SPLIT_MAP = {"model.embed_tokens": "disk", "model.layers.0": "cpu", "model.layers.1": "disk",
             "model.layers.2": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "disk"}


def repetitive_prompt() -> torch.Tensor:
    motif = torch.randint(1, VOCAB, (6,), generator=torch.Generator().manual_seed(7))
    return torch.cat([motif, motif, motif, motif[:3]])[None]  # [1, 21]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny random Llama saved with save_pretrained."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_model("llama").save_pretrained(folder)
    return folder


def load(folder, **placement):
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa",
                                                **placement).eval()


@pytest.fixture(scope="module", params=["explicit-map", "auto-max-memory"])
def offloaded(request, saved, tmp_path_factory):
    """The saved model reloaded with some modules offloaded to disk (an explicit map, or
    device_map="auto" with a CPU memory cap smaller than the model)."""
    offload = tmp_path_factory.mktemp("offload")
    if request.param == "explicit-map":
        model = load(saved, device_map=SPLIT_MAP, offload_folder=str(offload))
    else:
        model = load(saved, device_map="auto", max_memory={"cpu": "250KB"}, offload_folder=str(offload))
    assert "disk" in set(model.hf_device_map.values()), model.hf_device_map  # the test offloads for real
    return model


# The adaptive budget decides by measured time whether speculating pays, so only the fixed
# budget is sure to speculate; every config must reproduce model.generate.
ADAPTIVE = LookaheadConfig(calibration_context=32, calibration_repeats=1)  # the default budget, measured quickly
FIXED = {"fixed": LookaheadConfig(budget="fixed"), "fixed-window": LookaheadConfig(budget="fixed", window=3, ngram=3)}


@pytest.mark.parametrize("name", ["adaptive", *FIXED])
def test_offloaded_greedy_matches_generate(offloaded, name):
    ids = repetitive_prompt()
    expected = reference(offloaded, ids, NEW, eos_token_id=NO_EOS)
    gen = LookaheadGenerator(offloaded, config=FIXED.get(name, ADAPTIVE))
    out = gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS)
    assert torch.equal(out, expected)
    if name in FIXED:
        assert max(gen.last_stats.accepted) > 1, "no multi-token step: the test proves nothing about speculation"
        assert gen.last_stats.steps < NEW


def test_offloaded_matches_the_model_in_memory(saved, offloaded):
    """Same tokens as the same weights loaded without a device_map (the reference is not fooled by offload)."""
    plain = load(saved)
    ids = repetitive_prompt()
    out = LookaheadGenerator(offloaded, config=FIXED["fixed"]).generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS)
    assert torch.equal(out, reference(plain, ids, NEW, eos_token_id=NO_EOS))


def test_input_device_comes_from_the_hook_not_the_offloaded_embedding(saved, tmp_path):
    model = load(saved, device_map=SPLIT_MAP, offload_folder=str(tmp_path))
    assert model.get_input_embeddings().weight.device.type == "meta"  # on disk until it runs
    assert next(model.parameters()).device.type == "meta"
    assert input_device(model) == torch.device("cpu")
    target = Target(model, check_model(model, False))
    assert target.device == torch.device("cpu") and target.dtype == torch.float32 and target.vocab == VOCAB
    assert not target.select_after  # offloaded layers run on the main device


def test_cost_fingerprint_names_the_device_and_the_placement(saved, tmp_path):
    model = load(saved, device_map=SPLIT_MAP, offload_folder=str(tmp_path))
    fingerprint = model_fingerprint(model, (1, 2), 16, 1)
    assert fingerprint["device"] == "cpu" and fingerprint["dtype"] == "torch.float32"
    assert fingerprint["device_map"] == {name: str(where) for name, where in SPLIT_MAP.items()}
    assert "device_map" not in model_fingerprint(tiny_model("llama"), (1, 2), 16, 1)


def test_spans_devices():
    cpu, gpu0 = torch.device("cpu"), torch.device("cuda:0")
    model = tiny_model("llama")
    assert not spans_devices(model, cpu)  # no device_map
    for placement, main, spans in [
        ({"model.embed_tokens": "cpu", "model.layers": "disk"}, cpu, False),
        ({"model.embed_tokens": 0, "model.layers": "cpu", "lm_head": "disk"}, gpu0, False),  # offload runs on 0
        ({"model.embed_tokens": "cuda", "lm_head": "cuda:0"}, gpu0, False),
        ({"model.embed_tokens": 0, "model.layers": 1, "lm_head": 1}, gpu0, True),
        ({"model.embed_tokens": 0, "lm_head": "cuda:1"}, gpu0, True),
    ]:
        model.hf_device_map = placement
        assert spans_devices(model, main) is spans, placement


def test_rows_selected_after_the_forward_when_layers_span_devices():
    """Layers on several devices: every row's logits come back and the kept rows are picked
    on the input device. Exercised here on one device by declaring a two-GPU map."""
    ids = repetitive_prompt()
    expected = reference(tiny_model("llama"), ids, NEW, eos_token_id=NO_EOS)
    model = tiny_model("llama")
    model.hf_device_map = {"model": "cpu", "lm_head": 1}  # lm_head "on another device"
    for config in (ADAPTIVE, *FIXED.values()):
        gen = LookaheadGenerator(model, config=config)
        assert gen.target.select_after
        assert torch.equal(gen.generate(ids, max_new_tokens=NEW, eos_token_id=NO_EOS), expected)
        assert config is ADAPTIVE or max(gen.last_stats.accepted) > 1
