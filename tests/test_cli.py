"""The CLI: output, JSON, and one clear line for every bad input."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from lookahead.cli.main import main
from conftest import VOCAB, tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Llama with a word-level tokenizer, saved like a local hub directory."""
    path = tmp_path_factory.mktemp("tiny-llama")
    words = ["<pad>", "<eos>"] + [f"w{i}" for i in range(VOCAB - 2)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")
    model = tiny_model("llama")
    model.generation_config.eos_token_id = 1
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def invoke(*args):
    return CliRunner().invoke(main, ["generate", *args])


def test_generate_json(model_dir):
    result = invoke("--model", model_dir, "--prompt", "w3 w4 w5 w3 w4 w5 w3", "--no-chat",
                    "--max-new-tokens", "12", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {"text", "new_tokens", "steps", "accepted_per_step", "tokens_per_s"} <= data.keys()
    assert 1 <= data["new_tokens"] <= 12 and data["steps"] >= 1
    assert data["text"].startswith("w")


def test_generate_streams_text_and_stats(model_dir, tmp_path):
    result = invoke("--model", model_dir, "--prompt", "w3 w4 w5", "--no-chat", "--max-new-tokens", "6",
                    "--window", "2", "--ngram", "3", "--candidates", "2", "--no-context-match",
                    "--budget", "fixed", "--no-recycle", "--cost-cache-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "w" in result.stdout
    assert "tokens/step" in result.stderr


@pytest.mark.parametrize("args, words", [
    (["--prompt", "   "], "prompt is empty"),
    (["--prompt", "hi", "--max-new-tokens", "-1"], "--max-new-tokens must be >= 0"),
    (["--prompt", "hi", "--window", "0"], "window must be between 1 and 64"),
    (["--prompt", "hi", "--ngram", "1"], "ngram must be between 2"),
    (["--prompt", "hi", "--budget", "auto"], "budget must be one of 'adaptive', 'fixed', got 'auto' (option --budget)"),
    (["--prompt", "hi", "--recycle-width", "0"], "recycle_width must be between 1 and 64"),
    (["--prompt", "hi", "--model", "/no/such/dir"], "cannot load model '/no/such/dir'"),
    (["--prompt", "hi", "--model", "/no/such/file.gguf"], "GGUF file /no/such/file.gguf (not found)"),
])
def test_bad_input_gets_one_line(args, words):
    result = invoke(*args)
    assert result.exit_code == 2
    assert words in result.stderr
    assert "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1
