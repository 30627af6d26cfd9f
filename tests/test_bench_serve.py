"""`lookahead bench-serve` (lookahead/benchmarks/serving.py, cli/bench_serve.py): percentiles, the /metrics
parse, the summaries, ratios and tables on hand-made numbers; the one-line errors; a server that does not
come up; and one small run against real `lookahead serve` processes of a tiny random Llama (no timing
assertions). A slow test runs all three servers, transformers serve included, on the default model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import save_model_dir, tiny_model
from lookahead.benchmarks import serving
from lookahead.benchmarks.parsers import Prompt
from lookahead.benchmarks.serving import (
    PLAIN_OPTIONS,
    ServerProcess,
    ServerStartError,
    markdown_table,
    parse_concurrency,
    parse_metrics,
    percentile,
    ratio_rows,
    ratio_table,
    request_times,
    server_command,
    summarize_run,
    step_parts,
    tokens_per_forward,
    write_report,
)
from lookahead.cli.main import main

TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"  # words w0 .. w93, spaces between


def invoke(*args: str):
    return CliRunner().invoke(main, ["bench-serve", *args])


# ------------------------------------------------------------------ pure pieces

def test_percentile_interpolates_like_numpy():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([4, 1, 3, 2], 0) == 1 and percentile([4, 1, 3, 2], 100) == 4
    assert percentile(list(range(1, 101)), 99) == pytest.approx(99.01)
    assert percentile([0.25], 99) == 0.25
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_metrics_text_parse_and_tokens_per_forward():
    text = """# HELP lookahead_tokens_generated_total Tokens generated.
# TYPE lookahead_tokens_generated_total counter
lookahead_tokens_generated_total 120.0
# TYPE lookahead_sequence_steps_total counter
lookahead_sequence_steps_total 50
lookahead_tokens_per_forward 2.4
lookahead_http_responses_total{status="200"} 7
lookahead_http_responses_total{status="429",path="/v1 x"} 1 1700000000

lookahead_broken not-a-number
"""
    samples = parse_metrics(text)
    assert samples == {"lookahead_tokens_generated_total": 120.0, "lookahead_sequence_steps_total": 50.0,
                       "lookahead_tokens_per_forward": 2.4, 'lookahead_http_responses_total{status="200"}': 7.0,
                       'lookahead_http_responses_total{status="429",path="/v1 x"}': 1.0}
    after = {**samples, "lookahead_tokens_generated_total": 420.0, "lookahead_sequence_steps_total": 150.0}
    assert tokens_per_forward(samples, after) == 3.0
    timed = {"lookahead_forwards_total": 4.0, "lookahead_host_seconds_total": 0.5,
             "lookahead_forward_seconds_total": 3.0}
    later = {"lookahead_forwards_total": 14.0, "lookahead_host_seconds_total": 0.52,
             "lookahead_forward_seconds_total": 3.3}
    assert step_parts(timed, later) == pytest.approx((0.002, 0.03))
    assert step_parts(timed, timed) is None and step_parts(samples, after) is None  # no steps; no such counters
    assert tokens_per_forward(samples, samples) is None  # no forwards in between
    assert tokens_per_forward(None, after) is None
    assert tokens_per_forward({"other": 1.0}, {"other": 2.0}) is None


def test_concurrency_levels():
    assert parse_concurrency("1,4") == [1, 4]
    assert parse_concurrency(" 2, 2,8 ") == [2, 8]
    for bad in ("0", "1,-2", "a", "1,,2", ""):
        with pytest.raises(ValueError):
            parse_concurrency(bad)


def record(ident: str, sent: float, first: float | None, end: float, tokens: int, error: str | None = None,
           text: str = "x") -> dict:
    rec = {"id": ident, "sent": sent, "first": first, "end": end, "completion_tokens": tokens, "prompt_tokens": 10,
           "error": error, "text": text}
    rec["ttft_s"], rec["tpot_s"] = request_times(rec)
    return rec


def test_request_times_and_run_summary():
    records = [record("a", 0.0, 0.5, 2.5, 5),  # TTFT 0.5, TPOT 2.0 / 4
               record("b", 0.0, 1.0, 2.0, 3),  # TTFT 1.0, TPOT 0.5
               record("c", 1.0, 1.5, 1.6, 1),  # one token: no TPOT
               record("d", 1.0, None, 3.0, 0, error="APIError: boom")]
    assert request_times(records[0]) == (0.5, 0.5)
    assert request_times(records[2]) == (0.5, None)
    assert request_times(records[3]) == (None, None)
    summary = summarize_run(records, wall_s=4.0)
    assert summary["requests"] == 4 and summary["errors"] == 1
    assert summary["output_tokens"] == 9 and summary["prompt_tokens"] == 30
    assert summary["throughput_tok_s"] == 9 / 4.0 and summary["requests_per_s"] == 3 / 4.0
    assert summary["ttft_p50_s"] == 0.5 and summary["ttft_p99_s"] == pytest.approx(0.99)
    assert summary["tpot_p50_s"] == 0.5 and summary["tpot_p99_s"] == 0.5


def hand_made_runs() -> list[dict]:
    def run(server: str, concurrency: int, tokens_s: float, tpot: float, tpf: float | None, texts: list[str]) -> dict:
        return {"server": server, "dataset": "tool-calls", "concurrency": concurrency, "requests": 2, "errors": 0,
                "output_tokens": 96, "throughput_tok_s": tokens_s, "requests_per_s": tokens_s / 48,
                "ttft_p50_s": 0.2, "ttft_p99_s": 0.3, "tpot_p50_s": tpot, "tpot_p99_s": tpot * 2,
                "tokens_per_forward": tpf, "command": [server, "--port", "1"],
                "step_parts": (0.0015, 0.030) if tpf is not None else None,
                "records": [{"id": str(i), "text": t, "error": None} for i, t in enumerate(texts)]}

    return [run("lookahead", 1, 60.0, 0.010, 2.5, ["a", "b"]), run("lookahead", 4, 120.0, 0.020, 5.0, ["a", "b"]),
            run("lookahead-plain", 1, 30.0, 0.025, 1.0, ["a", "b"]),
            run("lookahead-plain", 4, 80.0, 0.030, 3.9, ["a", "c"]),
            run("transformers", 1, 20.0, 0.040, None, ["a", "b"])]


def test_ratios_and_tables():
    runs = hand_made_runs()
    rows = ratio_rows(runs)
    assert [(r["dataset"], r["concurrency"]) for r in rows] == [("tool-calls", 1), ("tool-calls", 4)]
    one, four = rows
    assert one["throughput_vs_plain"] == 2.0 and one["throughput_vs_transformers"] == 3.0
    assert one["tpot_vs_plain"] == pytest.approx(2.5) and one["tpot_vs_transformers"] == pytest.approx(4.0)
    assert one["same_text_vs_plain"] == [2, 2] and four["same_text_vs_plain"] == [1, 2]
    assert four["throughput_vs_plain"] == 1.5 and four["throughput_vs_transformers"] is None  # no such run
    table = markdown_table(runs)
    assert table.splitlines()[0].startswith("| data set | server | concurrency |")
    assert "| tool-calls | lookahead | 1 | 2 | 96 | 60.0 | 1.25 | 200.0 | 300.0 | 10.0 | 20.0 | 2.50 | 1.5 / 30.0 |" \
        in table
    assert "| tool-calls | transformers | 1 | 2 | 96 | 20.0 | 0.42 | 200.0 | 300.0 | 40.0 | 80.0 | - | - |" in table
    ratios = ratio_table(rows)
    assert "| tool-calls | 1 | 2.00x | 3.00x | 2.50x | 4.00x | 2/2 | 2/2 |" in ratios
    assert "| tool-calls | 4 | 1.50x | - | 1.50x | - | 1/2 | - |" in ratios


def test_write_report(tmp_path):
    runs = hand_made_runs()
    data = {"meta": {"environment": {"cpu": "Test CPU", "cpu_count": 2}, "threads": 2, "model": "tiny",
                     "max_tokens": 96, "limit": 2, "concurrency": [1, 4], "started": "s", "finished": "f"},
            "servers": {"lookahead": {"commands": [["lookahead", "serve"]]},
                        "lookahead-plain": {"commands": [["lookahead", "serve", *PLAIN_OPTIONS]]},
                        "transformers": {"commands": [["transformers", "serve", "dir"]],
                                         "continuous_batching": False, "continuous_batching_error": "no CB here"}},
            "runs": runs, "ratios": ratio_rows(runs)}
    paths = write_report(tmp_path / "out", data)
    assert json.loads(Path(paths["json"]).read_text())["runs"][0]["server"] == "lookahead"
    text = Path(paths["markdown"]).read_text()
    assert "Test CPU" in text and "2 torch threads" in text and "without continuous batching: no CB here" in text
    assert "speculation off: --candidates 0" in text
    assert Path(paths["figure"]).stat().st_size > 0


def test_the_anchor_batches_continuously_for_several_clients_only(tmp_path, monkeypatch):
    """One client: transformers serve as it starts by default; several: --continuous-batching, retried without
    where it fails. The report names both commands and says which level ran which."""
    tried = []

    def one_run(name, dataset, prompts, concurrency, settings, max_batch, cb, env, log_dir, label, log, info):
        tried.append((concurrency, cb))
        if cb and len(tried) == 2 and fail_once:
            raise serving.RunError("no CB here")
        info["commands"].append(server_command(name, "m", "/dir", 1000 + len(tried), max_batch, cb))
        return {**hand_made_runs()[0], "server": name, "concurrency": concurrency}

    monkeypatch.setattr(serving, "_one_run", one_run)
    settings = serving.Settings(model="m", model_dir="/dir", datasets={"d": [("p", [])], "e": [("q", [])]},
                                servers=["transformers"], concurrency=(1, 4))
    fail_once = False
    data = serving.run_bench(settings, tmp_path, log=lambda line: None)
    assert tried == [(1, False), (4, True)] * 2
    assert [r["continuous_batching"] for r in data["runs"]] == [False, True] * 2
    assert data["servers"]["transformers"]["continuous_batching_at"] == [4]  # once, whatever the data sets
    text = Path(write_report(tmp_path / "out", data)["markdown"]).read_text()
    assert "continuous batching with 4 clients, without with one" in text
    commands = [line for line in text.splitlines() if line.startswith("- transformers")]
    assert len(commands) == 2 and ["--continuous-batching" in c for c in commands] == [False, True], commands
    tried.clear()
    fail_once = True
    data = serving.run_bench(settings, tmp_path, log=lambda line: None)
    assert tried == [(1, False), (4, True), (4, False), (1, False), (4, False)]
    assert data["servers"]["transformers"]["continuous_batching"] is False
    assert "without continuous batching: no CB here" in Path(write_report(tmp_path / "o2", data)["markdown"]).read_text()


def test_server_commands():
    plain = server_command("lookahead-plain", "m", "/dir", 1234, 4, lookahead_args=("--threads", "2"))
    assert plain[1:4] == ["-m", "lookahead.cli.main", "serve"]
    assert plain[-len(PLAIN_OPTIONS):] == list(PLAIN_OPTIONS) and "--threads" in plain
    assert ["--port", "1234"] == plain[plain.index("--port"):plain.index("--port") + 2]
    assert "--candidates" not in server_command("lookahead", "m", "/dir", 1, 1)
    anchor = server_command("transformers", "m", "/dir", 1, 1)
    assert "serve" in anchor and "/dir" in anchor and "--continuous-batching" in anchor
    assert "--continuous-batching" not in server_command("transformers", "m", "/dir", 1, 1, continuous_batching=False)
    with pytest.raises(ValueError):
        server_command("vllm", "m", "/dir", 1, 1)


# ------------------------------------------------------------------ errors

def test_a_server_that_does_not_come_up_names_its_stderr(tmp_path):
    hangs = [sys.executable, "-c", "import sys, time; print('loading forever', file=sys.stderr, flush=True); "
                                   "time.sleep(60)"]
    server = ServerProcess("hangs", hangs, serving.free_port(), tmp_path)
    with pytest.raises(ServerStartError, match="did not answer GET .*within 1 s.*loading forever"):
        server.start(timeout=1.0)
    assert not server.alive()  # stopped
    dies = [sys.executable, "-c", "import sys; print('no such model', file=sys.stderr); sys.exit(3)"]
    with pytest.raises(ServerStartError, match="exited with status 3.*no such model"):
        ServerProcess("dies", dies, serving.free_port(), tmp_path).start(timeout=30.0)


def test_bad_options_are_one_line(tmp_path):
    for args, words in ((["--dataset", "nope"], "unknown dataset 'nope'"),
                        (["--concurrency", "0"], "concurrency level must be >= 1"),
                        (["--concurrency", "1,x"], "whole numbers >= 1"),
                        (["--limit", "0"], "--limit must be >= 1"),
                        (["--max-tokens", "0"], "--max-tokens must be >= 1")):
        result = invoke(*args, "--out", str(tmp_path / "out"))
        assert result.exit_code == 2, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("lookahead: error:") and words in lines[0], result.output


def test_completion_data_sets_are_refused(tmp_path, monkeypatch):
    import lookahead.benchmarks.datasets as datasets

    monkeypatch.setattr(datasets, "load_dataset",
                        lambda name, limit=None: [Prompt("humaneval", "0", None, "def f():", None, None)])
    result = invoke("--dataset", "humaneval", "--out", str(tmp_path / "out"))
    assert result.exit_code == 2 and "holds completion prompts" in result.output, result.output


def test_a_server_that_does_not_come_up_ends_the_command_in_one_line(tmp_path, monkeypatch):
    import lookahead.benchmarks.datasets as datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda name, limit=None: chat_prompts(name, limit))
    monkeypatch.setattr(serving, "server_command", lambda *args, **kwargs: [
        sys.executable, "-c", "import sys, time; print('stuck on startup', file=sys.stderr, flush=True); "
                              "time.sleep(60)"])
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    result = invoke("--model", str(model), "--dataset", "tool-calls", "--startup-timeout", "1",
                    "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("lookahead: error: server lookahead did not answer GET") and "stuck on startup" in last


# ------------------------------------------------------------------ end to end

def chat_prompts(name: str, limit: int | None) -> list[Prompt]:
    """Chat prompts the tiny word-level tokenizer reads (w0 .. w93), repetitive enough to speculate on."""
    texts = ["w5 w6 w7 w8 w5 w6 w7 w8 w5 w6", "w10 w11 w12 w10 w11 w12 w10", "w20 w21 w20 w21 w20 w21"]
    prompts = [Prompt(name, str(i), [{"role": "user", "content": text}], None, None, None,
                      prediction=text if name == "humaneval-edit" else None)  # (an edit: the text as prediction)
               for i, text in enumerate(texts)]
    return prompts[:limit]


def tiny_model_dir(path: Path) -> str:
    """A tiny random Llama saved with a word-level tokenizer and a chat template."""
    from transformers import AutoTokenizer

    directory = save_model_dir(path, tiny_model("llama"))
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(directory)
    return directory


def test_end_to_end_against_real_lookahead_servers(tmp_path, monkeypatch):
    import lookahead.benchmarks.datasets as datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda name, limit=None: chat_prompts(name, limit))
    directory = tiny_model_dir(tmp_path / "model")
    out = tmp_path / "out"
    result = invoke("--model", directory, "--dataset", "humaneval-edit", "--server", "lookahead",
                    "--server", "lookahead-plain", "--concurrency", "2", "--limit", "2", "--max-tokens", "8",
                    "--threads", "1", "--startup-timeout", "120", "--lookahead-arg=--cost-cache-dir=",
                    "--out", str(out))
    assert result.exit_code == 0, result.output
    data = json.loads((out / "bench-serve.json").read_text())
    runs = {(r["server"], r["concurrency"]): r for r in data["runs"]}
    # (one concurrency: each level is a fresh server of each kind, 12-15 s to start here; the levels' split
    # into rows is tested on hand-made runs above)
    assert set(runs) == {("lookahead", 2), ("lookahead-plain", 2)}
    for (server, _), run in runs.items():
        assert run["requests"] == 2 and run["errors"] == 0, run
        assert run["output_tokens"] > 0 and run["throughput_tok_s"] > 0 and run["requests_per_s"] > 0
        assert all(r["tokens_from"] == "usage" for r in run["records"])
        counts = [r["prediction_tokens"] for r in run["records"]]  # (the prediction went with each request)
        assert all(c is not None and c["accepted"] + c["rejected"] >= 0 for c in counts), counts
        if server == "lookahead-plain":  # (no candidates: nothing of the prediction is proposed)
            assert all(c["rejected"] == 0 for c in counts), counts
        assert run["tokens_per_forward"] is not None and run["ttft_p50_s"] is not None
        host, forward = run["step_parts"]  # the server's own seconds of its steps (/metrics)
        assert host > 0 and forward > 0
        assert "--cost-cache-dir=" in run["command"] and ("--candidates" in run["command"]) == (server != "lookahead")
    assert runs[("lookahead-plain", 2)]["tokens_per_forward"] == 1.0  # plain decoding: one token a forward
    for row in data["ratios"]:  # greedy: both servers answer every prompt with the same text
        assert row["same_text_vs_plain"] == [2, 2], row
        assert row["throughput_vs_plain"] is not None and row["throughput_vs_transformers"] is None
    meta = data["meta"]
    assert meta["threads"] == 1 and meta["model_dir"] == directory and meta["environment"]["cpu"]
    assert meta["command"] and meta["started"] <= meta["finished"]
    assert (out / "bench-serve.md").is_file() and (out / "bench-serve.png").is_file()
    assert any(p.suffix == ".err" for p in (out / "logs").iterdir())


@pytest.mark.slow
def test_lookahead_against_transformers_serve_on_the_default_model(tmp_path):
    """lookahead and transformers serve on SmolLM2, in the order the default runs them, one client (so
    transformers serve as it starts by default, without continuous batching: its paged cache, sized to
    this machine's memory, took 20-30 s to set up here). (lookahead-plain is the same server with other options, and two
    clients a batch, both run against real servers above: leaving them out here saves a server's start
    and warm-up and, on a machine with no cached curves, the measurement of SmolLM2's batch-2 curve.)"""
    out = tmp_path / "out"
    result = invoke("--dataset", "mt-bench-1", "--server", "transformers", "--server", "lookahead",
                    "--concurrency", "1", "--limit", "2", "--max-tokens", "8", "--threads", "1", "--out", str(out))
    assert result.exit_code == 0, result.output
    data = json.loads((out / "bench-serve.json").read_text())
    assert [r["server"] for r in data["runs"]] == ["lookahead", "transformers"]
    assert all(r["errors"] == 0 and r["output_tokens"] > 0 for r in data["runs"])
    anchor = data["servers"]["transformers"]
    assert anchor["continuous_batching"] is False and "--continuous-batching" not in anchor["commands"][-1]
    assert data["ratios"][0]["throughput_vs_transformers"] is not None


def test_the_edit_workload_sends_the_file_as_its_prediction():
    """humaneval-edit: a small change asked of a whole file, the file itself the prediction (what an editor
    sends with OpenAI's Predicted Outputs), and its requests carry it as the request's field."""
    from lookahead.benchmarks.datasets import chat_requests

    requests = chat_requests("humaneval-edit", 2)
    assert [ident for ident, _, _ in requests] == ["HumanEval/0", "HumanEval/1"]
    (_, rename, fields), (_, add, _) = requests
    assert "Rename the function `has_close_elements` to `has_close_elements_v2`" in rename[0]["content"]
    assert "Add the line `# reviewed: HumanEval/1`" in add[0]["content"]
    prediction = fields["prediction"]
    assert prediction["type"] == "content" and prediction["content"].startswith("```python\nfrom typing import")
    assert prediction["content"] in rename[0]["content"]  # (the file as the request quotes it)
    assert serving._prediction_counts(None) is None
