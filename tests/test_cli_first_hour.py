"""What a new user meets in the first hour (issue 36, item 3): Ctrl-C, a closed pipe, an unknown name
offline, half precision and too many threads, a context shorter than --max-new-tokens, flags named in
messages, the JSON's settings and stop reason, --help, the memory file's lines and early check, the
README's custom_generate snippet. Each gets one clear line (exit status 2 for errors) or goes quiet."""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from click.testing import CliRunner
from conftest import save_model_dir, tiny_model

import lookahead
from lookahead.cli import main as cli
from lookahead.cli.main import main, stop_reason
from lookahead.config import LookaheadConfig
from lookahead.errors import ModelLoadError
from lookahead.kernels.threads import usable_cores
from lookahead.loading import models
from lookahead.proposers.memory import file

REPO = Path(__file__).resolve().parents[1]
FAST = ("--calibration-repeats", "1", "--calibration-context", "16", "--max-tree-nodes", "4")  # a quick cost curve


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Llama with a word-level tokenizer (w0 w1 ...), saved like a local hub directory."""
    return save_model_dir(tmp_path_factory.mktemp("tiny-llama"), tiny_model("llama"))


@pytest.fixture(scope="module")
def eos_model_dir(tmp_path_factory):
    """The tiny Llama with its end-of-sequence id set to the token greedy decoding gives "w3 w4" first."""
    model = tiny_model("llama")
    path = save_model_dir(tmp_path_factory.mktemp("eos-llama"), model)
    ids = transformers.AutoTokenizer.from_pretrained(path)("w3 w4", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        first = int(model(ids).logits[0, -1].argmax())
    config = transformers.GenerationConfig.from_pretrained(path)
    config.eos_token_id = first
    config.save_pretrained(path)
    return path


def invoke(*args: str):
    return CliRunner().invoke(main, ["generate", *args])


def lines(stderr: str) -> list[str]:
    """stderr's lines, without transformers' weight-loading progress bar."""
    return [line for line in stderr.replace("\r", "\n").splitlines()
            if line.strip() and not line.startswith("Loading weights")]


def one_clear_line(result, words: str) -> None:
    assert result.exit_code == 2, result.output
    assert words in result.stderr, result.stderr
    assert "Traceback" not in result.output
    assert len(lines(result.stderr)) == 1, result.stderr


# ------------------------------------------------------------------ Ctrl-C and a closed pipe


MARK = "test: slow_load sleeping"
INTERRUPTED_WHILE_LOADING = """
import sys, time
import lookahead
from lookahead.cli.main import main

def slow_load(*args, **kwargs):
    print("test: slow_load sleeping", file=sys.stderr, flush=True)
    time.sleep(300)

lookahead.load_model = slow_load
main(["generate", "--prompt", "hi"], prog_name="lookahead")
"""


def test_ctrl_c_while_loading_is_one_line_and_exit_130(tmp_path):
    """A real SIGINT to a real process, while the model loads: one line, exit status 130, no traceback."""
    err = tmp_path / "stderr"
    with open(err, "w") as sink:
        # SIGINT as a terminal's Ctrl-C finds it: a suite started in the background of a non-interactive
        # shell hands its children SIGINT ignored, and Python then never raises KeyboardInterrupt
        process = subprocess.Popen([sys.executable, "-c", INTERRUPTED_WHILE_LOADING], stdout=subprocess.DEVNULL,
                                   stderr=sink, cwd=tmp_path,
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 300  # importing torch and transformers on a busy machine
        # (a marker no import-time warning prints: the signal must come while the load sleeps)
        while MARK not in err.read_text() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert MARK in err.read_text(), err.read_text()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 130
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    said = lines(err.read_text())
    assert said == [MARK, "lookahead: interrupted (Ctrl-C)"], said


@pytest.mark.parametrize("command", ["generate", "bench"])
def test_ctrl_c_in_any_command_is_one_line_and_exit_130(monkeypatch, tmp_path, command):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(lookahead, "load_model", interrupted)
    monkeypatch.setattr("lookahead.cli.bench._bench", interrupted)
    args = [command, "--prompt", "hi"] if command == "generate" else [command, "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 130, result.output
    assert lines(result.stderr) == ["lookahead: interrupted (Ctrl-C)"]


def test_a_reader_that_goes_away_ends_generate_quietly(model_dir, tmp_path):
    """`lookahead generate ... | head -c 20`: the pipe is closed before the first token is written; the
    process ends at once with status 141 (128 + SIGPIPE, as a Unix tool killed by SIGPIPE) and says nothing."""
    process = subprocess.Popen([sys.executable, "-m", "lookahead.cli.main", "generate", "--model", model_dir,
                                "--prompt", "w3 w4", "--no-chat", "--max-new-tokens", "200",
                                "--cost-cache-dir", str(tmp_path), *FAST],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    process.stdout.close()  # the reader is gone before anything is written
    try:
        _, err = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = err.decode()
    assert process.returncode == 141, text
    for word in ("error", "Broken pipe", "Traceback", "Exception ignored"):
        assert word not in text, text


@pytest.mark.parametrize("command", ["generate", "bench"])
def test_a_broken_pipe_is_no_error_in_any_command(monkeypatch, tmp_path, command):
    def gone(*args, **kwargs):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(lookahead, "load_model", gone)
    monkeypatch.setattr("lookahead.cli.bench._bench", gone)
    args = [command, "--prompt", "hi"] if command == "generate" else [command, "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 141, result.output
    assert lines(result.stderr) == []


# ------------------------------------------------------------------ an unknown name offline


def hub_asked(monkeypatch, reachable: bool) -> list[bool]:
    """The probe answers ``reachable``; the returned list gets local_only of every config read."""
    asked: list[bool] = []
    read = models.read_config_dict

    def recording(source, local_only):
        asked.append(local_only)
        return read(source, local_only)

    monkeypatch.setattr(models, "hub_reachable", lambda *args: reachable)
    monkeypatch.setattr(models, "read_config_dict", recording)
    return asked


def test_an_unknown_name_offline_fails_at_once_from_the_cache_alone(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    asked = hub_asked(monkeypatch, reachable=False)
    with pytest.raises(ModelLoadError, match="cannot load model 'no-such-model'; tried: built-in aliases .*"
                                             "not in the hub cache .* cannot be reached from this machine"):
        lookahead.load_model("no-such-model", cache_dir=tmp_path)
    assert asked == [True]  # the hub cache only: no download, no retries
    result = invoke("--model", "no-such-model", "--prompt", "Hi")
    one_clear_line(result, "pass a built-in alias (gemma3-270m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, "
                           "smollm2-135m), a .gguf file or a model directory, or connect to the internet")
    assert "Retrying" not in result.output


def test_a_hub_id_is_still_asked_of_the_hub_online(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    asked = hub_asked(monkeypatch, reachable=True)

    def unreachable(source, local_only):
        asked.append(local_only)
        raise OSError("no connection in this test")

    monkeypatch.setattr(models, "read_config_dict", unreachable)
    with pytest.raises(ModelLoadError, match="hub id 'org/model' \\(OSError: no connection in this test\\)"):
        lookahead.load_model("org/model", cache_dir=tmp_path)
    assert asked == [False]


def test_a_cached_hub_id_loads_offline(monkeypatch, tmp_path):
    """A hub id in huggingface_hub's cache loads with the hub out of reach (no retries, no download)."""
    import huggingface_hub.constants

    revision = "0" * 40
    repo = tmp_path / "hub" / "models--org--tiny"
    save_model_dir(repo / "snapshots" / revision, tiny_model("llama"))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    asked = hub_asked(monkeypatch, reachable=False)
    model, tokenizer = lookahead.load_model("org/tiny", cache_dir=tmp_path / "lookahead")
    assert model.config.model_type == "llama" and tokenizer("w3")["input_ids"] == [5]
    assert asked == [True]


def test_the_probe_asks_nothing_when_huggingface_hub_is_offline(monkeypatch):
    import huggingface_hub.constants
    import huggingface_hub.utils

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.utils, "get_session", lambda: pytest.fail("the hub was asked"))
    assert models.hub_reachable() is False


def test_a_path_that_is_no_hub_id_is_not_probed(monkeypatch):
    monkeypatch.setattr(models, "hub_reachable", lambda *args: pytest.fail("probed the hub for a path"))
    with pytest.raises(ModelLoadError, match="cannot load model '/no/such/dir'"):
        lookahead.load_model("/no/such/dir")


# ------------------------------------------------------------------ warnings: dtype, threads, the context


@pytest.mark.parametrize("dtype, slow", [("float16", True), ("bfloat16", False)])
def test_half_precision_gets_a_warning(tmp_path, dtype, slow):
    result = invoke("--model", str(tmp_path / "absent"), "--prompt", "hi", "--dtype", dtype)
    warning = [line for line in lines(result.stderr) if line.startswith("lookahead: warning:")]
    assert len(warning) == 1, result.stderr
    assert f"--dtype {dtype}: greedy output equals model.generate's exactly only in float32" in warning[0]
    assert ("several times slower" in warning[0]) is slow
    assert "pass --dtype float32" in warning[0]
    assert "warning" not in invoke("--model", str(tmp_path / "absent"), "--prompt", "hi").stderr


def test_more_threads_than_cores_gets_a_warning_naming_the_cores(monkeypatch):
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # the suite stays on its one thread
    cores = usable_cores()
    result = invoke("--threads", str(cores + 62), "--prompt", " ")
    assert result.exit_code == 2  # (the empty prompt)
    assert (f"lookahead: warning: --threads {cores + 62} is more than the {cores} core{'s' if cores > 1 else ''} "
            f"this process can run on") in result.stderr
    assert f"pass --threads {cores} or fewer" in result.stderr
    assert "warning" not in invoke("--threads", str(cores), "--prompt", " ").stderr


def test_max_new_tokens_beyond_the_context_gets_a_warning_at_start(short_model_dir, tmp_path):
    result = invoke("--model", short_model_dir, "--prompt", "w3 w4 w5 w3 w4 w5", "--no-chat", "--json",
                    "--max-new-tokens", "100000000", "--budget", "fixed", "--cost-cache-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    said = lines(result.stderr)
    start = [i for i, line in enumerate(said) if "--max-new-tokens 100000000 does not fit" in line]
    assert start and "[lookahead]" not in " ".join(said[:start[0]]), said  # before the run's own lines
    assert ("the model's context (max_position_embeddings) is 48 tokens and the prompt takes 6, so at most 42 new "
            "tokens are generated") in said[start[0]]
    data = json.loads(result.stdout)
    assert data["stop_reason"] == ("context" if data["new_tokens"] == 42 else "eos")


# ------------------------------------------------------------------ flags named as flags


@pytest.mark.parametrize("args, words", [
    (["--sample", "--top-p", "2"], "--top-p must be in (0, 1], got 2"),
    (["--top-p", "0"], "--top-p must be in (0, 1], got 0"),
    (["--temperature", "-1"], "--temperature must be >= 0, got -1"),
    (["--min-p", "1.5"], "--min-p must be in [0, 1], got 1.5"),
    (["--repetition-penalty", "0"], "--repetition-penalty must be > 0, got 0"),
    (["--top-k", "-3"], "--top-k must be >= 0, got -3"),
    (["--temperature", "nan"], "--temperature must be >= 0, got nan"),
])
def test_a_sampling_value_out_of_range_names_the_flag_before_loading(monkeypatch, args, words):
    monkeypatch.setattr(lookahead, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    result = invoke("--prompt", "hi", *args)
    one_clear_line(result, words)
    assert re.search(r"\b(top_p|min_p|top_k|repetition_penalty)\b", result.stderr) is None


# ------------------------------------------------------------------ --json: settings used, stop reason


def test_json_gives_the_sampling_settings_used_and_the_stop_reason(model_dir, tmp_path):
    greedy = invoke("--model", model_dir, "--prompt", "w3 w4", "--no-chat", "--max-new-tokens", "3", "--json",
                    "--cost-cache-dir", str(tmp_path))
    assert greedy.exit_code == 0, greedy.output
    data = json.loads(greedy.stdout)
    for name in ("temperature", "top_k", "top_p", "repetition_penalty"):  # the model's, else transformers' own
        assert isinstance(data["sampling"][name], (int, float)), (name, data["sampling"])
    assert data["sampling"]["do_sample"] is False and data["sampling"]["seed"] is None
    assert data["new_tokens"] == 3 and data["stop_reason"] == "length"
    sampled = invoke("--model", model_dir, "--prompt", "w3 w4", "--no-chat", "--max-new-tokens", "3", "--json",
                     "--sample", "--temperature", "0.5", "--top-k", "7", "--top-p", "0.9", "--min-p", "0.01",
                     "--repetition-penalty", "1.1", "--seed", "3", "--cost-cache-dir", str(tmp_path))
    assert sampled.exit_code == 0, sampled.output
    assert json.loads(sampled.stdout)["sampling"] == {"do_sample": True, "temperature": 0.5, "top_k": 7,
                                                       "top_p": 0.9, "min_p": 0.01, "repetition_penalty": 1.1,
                                                       "seed": 3}
    zero = invoke("--model", model_dir, "--prompt", "w3 w4", "--no-chat", "--max-new-tokens", "2", "--json",
                  "--sample", "--temperature", "0", "--cost-cache-dir", str(tmp_path))
    assert json.loads(zero.stdout)["sampling"]["do_sample"] is False  # temperature 0 decodes greedily


def test_an_answer_that_ends_says_eos(eos_model_dir, tmp_path):
    result = invoke("--model", eos_model_dir, "--prompt", "w3 w4", "--no-chat", "--max-new-tokens", "8", "--json",
                    "--cost-cache-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["new_tokens"], data["stop_reason"]) == (1, "eos")
    streamed = invoke("--model", eos_model_dir, "--prompt", "w3 w4", "--no-chat", "--max-new-tokens", "8",
                      "--cost-cache-dir", str(tmp_path))
    assert streamed.exit_code == 0 and "cut at --max-new-tokens" not in streamed.stderr


def test_an_answer_cut_at_max_new_tokens_says_so_on_stderr(model_dir, tmp_path):
    result = invoke("--model", model_dir, "--prompt", "w3 w4", "--no-chat", "--max-new-tokens", "3",
                    "--cost-cache-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    cut = [line for line in lines(result.stderr) if "cut at --max-new-tokens" in line]
    assert cut == ["lookahead: the answer was cut at --max-new-tokens 3 before it ended: pass a larger "
                   "--max-new-tokens for the rest"]


def test_stop_reasons():
    assert stop_reason([5, 9, 2], {2}, 3, 100) == "eos"  # the model's end comes first, even at the limit
    assert stop_reason([5, 9, 7], {2}, 3, 100) == "length"
    assert stop_reason([], {2}, 0, 100) == "length"
    assert stop_reason([5, 9], {2}, 10, 2) == "context"
    assert stop_reason([5, 9], {2}, 10, None) == "other"


# ------------------------------------------------------------------ --help


def test_every_config_field_is_documented_in_one_machine_readable_place():
    missing = [f.name for f in dataclasses.fields(LookaheadConfig) if not f.metadata.get("help")]
    assert not missing, (f"give these LookaheadConfig fields their help, as the others have it "
                         f"(documented(default, 'what it does'), lookahead/config.py): {missing}")


def test_every_option_of_generate_and_every_config_option_has_help_text():
    fields = set(LookaheadConfig.field_names())
    for name, command in main.commands.items():
        for param in command.params:
            if isinstance(param, cli.click.Option) and (name == "generate" or param.name in fields):
                text = param.help or ""
                assert text.strip(), f"lookahead {name} {param.opts[0]} has no help"
                assert not text.startswith("LookaheadConfig."), f"lookahead {name} {param.opts[0]}: {text}"
    shown = CliRunner().invoke(main, ["generate", "--help"]).stdout
    assert "Most new tokens to generate" in shown and "Where the model runs" in shown
    assert "W: columns of the Jacobi lookahead window" in shown
    assert "up to --max-tree-nodes" in shown  # other fields named as their flags
    assert "LookaheadConfig." not in shown and "undocumented" not in shown


# ------------------------------------------------------------------ --memory


def test_memory_lines_say_what_was_read_and_written(model_dir, tmp_path):
    memory = tmp_path / "m.lkm"
    args = ("--model", model_dir, "--prompt", "w3 w4 w5", "--no-chat", "--max-new-tokens", "6",
            "--cost-cache-dir", str(tmp_path), "--memory", str(memory))
    first = invoke(*args)
    assert first.exit_code == 0, first.output
    said = [line for line in lines(first.stderr) if "memory:" in line]
    assert said[0] == f"lookahead: memory: {memory} does not exist yet; it is written after this request"
    assert re.fullmatch(rf"lookahead: memory: saved 1 request \(\d+ tokens\) to {re.escape(str(memory))}", said[1])
    second = invoke(*args)
    assert second.exit_code == 0, second.output
    said = [line for line in lines(second.stderr) if "memory:" in line]
    assert re.fullmatch(rf"lookahead: memory: loaded 1 request \(\d+ tokens\) from {re.escape(str(memory))}",
                        said[0])
    assert re.fullmatch(rf"lookahead: memory: saved 2 requests \(\d+ tokens\) to {re.escape(str(memory))}", said[1])


@pytest.mark.parametrize("kind, words", [
    ("vocabulary", "belongs to another tokenizer's vocabulary"),
    ("version", "was written in memory format 99"),
])
def test_a_foreign_memory_file_is_refused_before_the_generator_is_built(model_dir, tmp_path, monkeypatch,
                                                                       kind, words):
    memory = tmp_path / "m.lkm"
    file.write(memory, [np.array([3, 4, 5])], "sha256:another-tokenizer")
    if kind == "version":
        memory.write_bytes(memory.read_bytes().replace(b'"version": 1', b'"version": 99'))
    before = memory.read_bytes()
    monkeypatch.setattr(lookahead, "LookaheadGenerator",
                        lambda *a, **k: pytest.fail("the generator (and its cost measurement) came first"))
    one_clear_line(invoke("--model", model_dir, "--prompt", "w3 w4", "--no-chat", "--memory", str(memory)), words)
    assert memory.read_bytes() == before


# ------------------------------------------------------------------ the README's custom_generate snippet


def readme_block(heading: str) -> str:
    """The first ```python block after ``heading`` in README.md."""
    text = (REPO / "README.md").read_text()
    return text[text.index(heading):].split("```python\n", 1)[1].split("```", 1)[0]


def test_the_custom_generate_snippet_defines_what_it_uses():
    code = readme_block("### Inside `model.generate`: `custom_generate`")
    assert "inputs = " in code.split("model.generate(**inputs")[0]
    for call in re.findall(r"model\.generate\((.*?)\)\n", code, re.S):
        assert "max_new_tokens=" in call, call


@pytest.mark.slow
def test_the_custom_generate_snippet_runs_on_the_default_model(capfd):
    """The README's snippet as it is, on SmolLM2: it runs, and transformers warns about nothing (no
    max_length fallback)."""
    exec(compile(readme_block("### Inside `model.generate`: `custom_generate`"), "README.md", "exec"), {})
    assert "max_length" not in capfd.readouterr().err
