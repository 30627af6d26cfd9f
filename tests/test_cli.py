"""The CLI: output, JSON, and one clear line for every bad input."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from click.testing import CliRunner

from lookahead.cli.main import main
from conftest import COMMON, save_gguf_header, save_model_dir, save_remote_code_dir, tiny_model, truncate_weights


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Llama with a word-level tokenizer, saved like a local hub directory."""
    return save_model_dir(tmp_path_factory.mktemp("tiny-llama"), tiny_model("llama"))


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


# ------------------------------------------------------------------ hostile and edge input


@pytest.fixture(scope="module")
def untested_model_dir(tmp_path_factory):
    """A tiny Arcee: loadable and causal, but not on the tested list."""
    torch.manual_seed(0)
    model = transformers.ArceeForCausalLM(transformers.ArceeConfig(num_key_value_heads=2, bos_token_id=1,
                                                                   eos_token_id=2, **COMMON))
    return save_model_dir(tmp_path_factory.mktemp("tiny-arcee"), model.eval())


def our_lines(stderr: str) -> list[str]:
    """stderr without transformers' own weight-loading progress bar."""
    return [line for line in stderr.replace("\r", "\n").splitlines() if line.strip()
            and not line.startswith("Loading weights")]


def one_clear_line(result, words):
    assert result.exit_code == 2, result.output
    assert words in result.stderr, result.stderr
    assert "Traceback" not in result.output
    assert len(our_lines(result.stderr)) == 1, result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_on_a_machine_without_it_gets_one_line(model_dir):
    one_clear_line(invoke("--model", model_dir, "--prompt", "w3", "--device", "cuda"),
                   "device 'cuda' is not available on this machine")


@pytest.mark.parametrize("device, words", [
    ("gpu", "unknown device 'gpu'"),
    (f"cuda:{torch.cuda.device_count()}", "cuda"),
    ("meta", "device 'meta' holds no weights"),
])
def test_bad_device_gets_one_line(model_dir, device, words):
    one_clear_line(invoke("--model", model_dir, "--prompt", "w3", "--device", device), words)


def test_existing_file_that_is_no_model(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    one_clear_line(invoke("--model", str(path), "--prompt", "hi"), "is a file, not a model")


def test_directory_without_config(tmp_path):
    one_clear_line(invoke("--model", str(tmp_path), "--prompt", "hi"), "has no config.json")


def test_broken_local_directory_is_called_a_directory(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')  # no weights
    result = invoke("--model", str(tmp_path), "--prompt", "hi")
    one_clear_line(result, f"local directory {tmp_path}")
    assert "hub id" not in result.stderr


def test_error_text_is_never_cut_short(model_dir, monkeypatch):
    """Every line of an error's message reaches stderr, joined into one line (no first-line-only cut)."""
    import lookahead

    tail = "and the fix is at the end of a long second line " + "x" * 150

    def refuse(*args, **kwargs):
        raise lookahead.ModelLoadError(f"first line\n{tail}")

    monkeypatch.setattr(lookahead, "load_model", refuse)
    one_clear_line(invoke("--model", model_dir, "--prompt", "w3"), f"first line {tail}")


def test_untested_architecture_names_the_cli_flag(untested_model_dir):
    result = invoke("--model", untested_model_dir, "--prompt", "w3 w4", "--no-chat", "--max-new-tokens", "4")
    one_clear_line(result, "pass --allow-untested-models to try it anyway")
    assert "LookaheadConfig" not in result.stderr and "'arcee'" in result.stderr


def test_untested_architecture_runs_with_the_flag_and_a_one_line_warning(untested_model_dir, tmp_path):
    result = invoke("--model", untested_model_dir, "--prompt", "w3 w4", "--no-chat", "--max-new-tokens", "4",
                    "--allow-untested-models", "--json", "--cost-cache-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["new_tokens"] >= 1
    assert "lookahead: warning: model type 'arcee' is not among" in result.stderr


@pytest.mark.parametrize("huge", ["10000000000", str(10 ** 20)])
def test_huge_max_new_tokens_stops_at_the_context_with_a_warning(short_model_dir, huge):
    result = invoke("--model", short_model_dir, "--prompt", "w3 w4 w5 w3 w4 w5", "--no-chat", "--json",
                    "--max-new-tokens", huge, "--budget", "fixed")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert 1 <= data["new_tokens"] <= 48 - 6
    if data["new_tokens"] == 48 - 6:  # no EOS came first
        assert "lookahead: warning: generation stopped" in result.stderr
        assert "max_position_embeddings 48" in result.stderr


def test_prompt_longer_than_the_context(short_model_dir):
    one_clear_line(invoke("--model", short_model_dir, "--prompt", " ".join(["w3"] * 60), "--no-chat"),
                   "max_position_embeddings) is 48")


def bench_invoke(*args):
    return CliRunner().invoke(main, ["bench", *args])


def test_bench_out_unwritable_fails_before_loading_anything(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    result = bench_invoke("--model", "/no/such/model", "--out", str(blocker / "report"))
    one_clear_line(result, f"cannot write the report to --out {blocker / 'report'}")


def test_bench_out_check_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setattr("lookahead.cli.bench._bench",
                        lambda *args: ("table", {"json": "j", "markdown": "m", "figure": "f"}, None))
    result = bench_invoke("--out", str(tmp_path / "new" / "dir"))
    assert result.exit_code == 0, result.output
    assert list(tmp_path.iterdir()) == []


def test_remote_code_refusal_names_the_cli_flag(tmp_path):
    result = invoke("--model", save_remote_code_dir(tmp_path), "--prompt", "w3")
    one_clear_line(result, "ships its own modelling code")
    assert "pass --trust-remote-code if you trust that code" in result.stderr


@pytest.mark.parametrize("command", [["bench", "--out"], ["bench-batch", "--dataset"]])
def test_every_loading_command_has_the_flag_it_names(tmp_path, command):
    """bench and bench-batch load models too: the refusal names --trust-remote-code, which they accept."""
    extra = [str(tmp_path / "report")] if command[1] == "--out" else ["gsm8k"]
    remote = save_remote_code_dir(tmp_path / "remote")
    result = CliRunner().invoke(main, [command[0], "--model", remote, command[1], *extra])
    one_clear_line(result, "pass --trust-remote-code if you trust that code")
    flag = CliRunner().invoke(main, [command[0], "--help"])
    assert "--trust-remote-code" in flag.stdout


def test_trusted_remote_code_runs_from_the_cli_as_an_untested_architecture(tmp_path):
    remote = save_remote_code_dir(tmp_path / "remote")
    result = invoke("--model", remote, "--prompt", "w3 w4", "--no-chat", "--trust-remote-code", "--json",
                    "--max-new-tokens", "4", "--allow-untested-models", "--budget", "fixed")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["new_tokens"] >= 1
    assert "lookahead: warning: model type 'tiny_custom_lm' is not among" in result.stderr


# ------------------------------------------------------------------ bytes, seeds, typos, damaged files


def test_a_prompt_that_is_not_utf8_gets_one_line():
    """Bytes the shell passes undecoded (printf 'caf\\xe9') reach click as surrogate escapes."""
    one_clear_line(invoke("--prompt", "caf\udce9"),
                   "--prompt is not UTF-8 text (byte 0xe9 at character 4): pass UTF-8 text")


@pytest.mark.parametrize("seed", ["1e23", str(10 ** 23), str(2 ** 64), "-1", "seven"])
def test_a_seed_out_of_range_gets_one_line(seed):
    one_clear_line(invoke("--prompt", "hi", "--seed", seed),
                   f"--seed must be a whole number from 0 to 2**64-1 (18446744073709551615), got {seed}")


def test_the_largest_seed_is_taken(model_dir, tmp_path):
    result = invoke("--model", model_dir, "--prompt", "w3 w4", "--no-chat", "--max-new-tokens", "3", "--sample",
                    "--seed", str(2 ** 64 - 1), "--json", "--cost-cache-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["sampling"]["seed"] == 2 ** 64 - 1


def test_an_alias_typo_fails_at_once_naming_the_alias(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_clear_line(invoke("--model", "smollm2-13m", "--prompt", "hi"), "did you mean smollm2-135m?")


def test_a_corrupt_gguf_gets_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # the cache it would convert into
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"GGUF" + bytes(7))
    one_clear_line(invoke("--model", str(path), "--prompt", "hi"), f"cannot read the GGUF file {path}")


def test_truncated_cached_weights_get_one_line_naming_the_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # never the real cache
    cached = tmp_path / ".cache" / "lookahead" / "models" / "smollm2-135m"
    save_model_dir(cached, tiny_model("llama"))
    truncate_weights(cached)
    one_clear_line(invoke("--prompt", "hi", "--weights", "dequantized"), f"delete the directory {cached} to rebuild it")


def test_a_draft_of_another_vocabulary_is_refused_before_it_loads(model_dir, tmp_path):
    draft = save_model_dir(tmp_path / "draft", transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**{**COMMON, "vocab_size": 128})))
    truncate_weights(draft)  # reading its weights would fail with another message
    one_clear_line(invoke("--model", model_dir, "--draft-model", draft, "--prompt", "w3"),
                   f"the draft model {draft} declares a vocabulary of 128 tokens")
    gguf = save_gguf_header(tmp_path / "draft.gguf", 128)  # a header and no weights at all
    one_clear_line(invoke("--model", model_dir, "--draft-model", gguf, "--prompt", "w3"),
                   "declares a vocabulary of 128 tokens (its config, read before its weights), the target has 96")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "w3 w4"}\n')
    bench = CliRunner().invoke(main, ["bench", "--model", model_dir, "--draft", draft, "--prompts", str(prompts),
                                      "--out", str(tmp_path / "out"), "--no-cost-curve"])
    one_clear_line(bench, f"the draft model {draft} declares a vocabulary of 128 tokens")  # bench --draft too


def test_sampling_scores_that_overflow_get_one_line(model_dir):
    """A temperature so small that every score overflows leaves nothing to sample (model.generate fails too)."""
    one_clear_line(invoke("--model", model_dir, "--prompt", "w3 w4", "--no-chat", "--sample", "--temperature", "1e-45",
                          "--max-new-tokens", "4"), "sampling has no distribution to draw the next token from")


def test_memory_file_is_written_and_read_back(model_dir, tmp_path):
    memory = tmp_path / "memory.lkm"
    args = ("--model", model_dir, "--prompt", "w3 w4 w5 w6", "--no-chat", "--max-new-tokens", "24", "--json",
            "--budget", "fixed", "--no-context-match", "--no-ngram-pool", "--no-recycle", "--memory", str(memory))
    first = invoke(*args)
    assert first.exit_code == 0, first.output
    assert memory.exists()
    second = invoke(*args)  # the same request again: answered from the file's store
    assert second.exit_code == 0, second.output
    assert json.loads(second.stdout)["text"] == json.loads(first.stdout)["text"]
    assert json.loads(second.stdout)["steps"] < json.loads(first.stdout)["steps"]


@pytest.mark.parametrize("case, words", [
    ("off", "--memory-tokens 0 turns it off"),
    ("directory", "is a directory: pass a file path"),
    ("no-directory", "does not exist; create it first"),
])
def test_memory_paths_that_cannot_work_fail_before_loading(tmp_path, case, words):
    path = {"off": tmp_path / "m.lkm", "directory": tmp_path, "no-directory": tmp_path / "absent" / "m.lkm"}[case]
    extra = ["--memory-tokens", "0"] if case == "off" else []
    result = invoke("--model", "/no/such/model", "--prompt", "hi", "--memory", str(path), *extra)
    one_clear_line(result, words)


def test_a_damaged_memory_file_gets_one_line_and_is_left_alone(model_dir, tmp_path):
    memory = tmp_path / "memory.lkm"
    memory.write_bytes(b"LOOKAHEAD-MEMORY\n{\"version\": 1}\n")
    result = invoke("--model", model_dir, "--prompt", "w3 w4", "--no-chat", "--max-new-tokens", "4",
                    "--memory", str(memory))
    one_clear_line(result, "damaged header (it lacks requests, tokens, vocabulary)")
    assert memory.read_bytes() == b"LOOKAHEAD-MEMORY\n{\"version\": 1}\n"
    assert CliRunner().invoke(main, ["bench-memory", "--memory-tokens", "0"]).exit_code == 2
