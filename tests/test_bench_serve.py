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
    assert "| tool-calls | 1 | 2.00x | 3.00x | 2.50x | 4.00x | - | - | 2/2 | 2/2 |" in ratios
    assert "| tool-calls | 4 | 1.50x | - | 1.50x | - | - | - | 1/2 | - |" in ratios


def test_rounds_alternate_the_servers_and_pool_their_ratios():
    """(--rounds: a machine that slows down over the measurement weighs on both servers alike)"""
    from lookahead.benchmarks.serving import round_order

    assert round_order(["a", "b"], 3) == [(0, "a"), (0, "b"), (1, "b"), (1, "a"), (2, "a"), (2, "b")]
    assert round_order(["a", "b"], 1) == [(0, "a"), (0, "b")]

    def run(server: str, round_: int, tokens: int, wall: float, tpot: float, texts: list[str]) -> dict:
        return {"server": server, "dataset": "agent", "concurrency": 1, "round": round_, "requests": 2, "errors": 0,
                "output_tokens": tokens, "wall_s": wall, "throughput_tok_s": tokens / wall,
                "requests_per_s": 2 / wall, "ttft_p50_s": 0.2, "ttft_p99_s": 0.3, "tpot_p50_s": tpot,
                "tpot_p99_s": tpot, "tokens_per_forward": None, "command": [server], "step_parts": None,
                "records": [{"id": str(i), "text": t, "error": None} for i, t in enumerate(texts)]}

    # round 1 on a machine twice as slow for both: each round's ratio is 2.0, 3.0; pooled 100 / 40 over 100 / 110
    runs = [run("lookahead", 0, 50, 10.0, 0.01, ["a", "b"]), run("lookahead-plain", 0, 50, 20.0, 0.03, ["a", "b"]),
            run("lookahead-plain", 1, 50, 90.0, 0.05, ["a", "x"]), run("lookahead", 1, 50, 30.0, 0.02, ["a", "b"])]
    (row,) = ratio_rows(runs)
    assert row["throughput_vs_plain"] == pytest.approx((100 / 40) / (100 / 110))
    assert row["throughput_vs_plain_rounds"] == [pytest.approx(2.0), pytest.approx(3.0)]
    assert row["tpot_vs_plain"] == pytest.approx(0.04 / 0.015)  # (the medians of the rounds' p50)
    assert row["same_text_vs_plain"] == [3, 4]  # (round by round: 2/2, then 1/2)
    assert "2.75x (2.00, 3.00)" in ratio_table([row])
    assert row["tpot_p99_vs_plain"] is None  # (these records hold no times)
    assert "| agent | lookahead (round 2) | 1 |" in markdown_table(runs)


def test_tpot_p99_is_taken_over_every_request_of_every_round():
    """(the bar "p99 time per token no worse": one round's slow requests count as in one long run, not as one
    round's p99 among the rounds' medians)"""
    from lookahead.benchmarks.serving import pooled_tpot

    def run(server: str, round_: int, tpots: list[float | None]) -> dict:
        return {"server": server, "dataset": "chat", "concurrency": 4, "round": round_, "output_tokens": 10,
                "wall_s": 1.0, "throughput_tok_s": 10.0, "tpot_p50_s": 0.01, "records": [
                    {"id": str(i), "text": "t", "error": None, "tpot_s": t} for i, t in enumerate(tpots)]}

    ours = [run("lookahead", 0, [0.010, 0.012]), run("lookahead", 1, [0.011, 0.030])]
    theirs = [run("lookahead-plain", 0, [0.010, 0.020, None]), run("lookahead-plain", 1, [0.020, 0.040])]
    assert pooled_tpot(ours, 50) == pytest.approx(0.0115) and pooled_tpot(theirs, 50) == pytest.approx(0.020)
    assert pooled_tpot(ours, 100) == 0.030 and pooled_tpot([run("x", 0, [None])], 99) is None
    timed = {"id": "9", "text": "t", "error": None, "sent": 0.0, "first": 0.5, "end": 1.5, "completion_tokens": 11}
    assert pooled_tpot([{"records": [timed]}], 50) == pytest.approx(0.1)  # (no tpot_s: from its times)
    (row,) = ratio_rows(ours + theirs)
    assert row["tpot_p99_vs_plain"] == pytest.approx(percentile([0.010, 0.020, 0.020, 0.040], 99)
                                                      / percentile([0.010, 0.012, 0.011, 0.030], 99))
    assert f"| {row['tpot_p99_vs_plain']:.2f}x |" in ratio_table([row])


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


# ------------------------------------------------------------------ the agent workload and the llama.cpp anchor

def test_the_fake_tools_answer_the_same_call_alike_and_every_schema_value():
    """The agent's tools: the server's own checker takes their schemas; every value their enums allow gets an
    answer (no error), the same one each time and whatever the spacing of the arguments' JSON; what the fake
    world cannot answer is an error result, deterministically too."""
    from lookahead.benchmarks.agent import FILES, TASKS, TOOLS, agent_requests, run_tool
    from lookahead.serve.tools import read_tools

    assert len(read_tools([json.loads(json.dumps(t)) for t in TOOLS])) == 4
    for tool in TOOLS:
        function = tool["function"]
        (parameter, schema), = function["parameters"]["properties"].items()
        for value in schema["enum"]:
            answer = run_tool(function["name"], json.dumps({parameter: value}))
            assert "error" not in json.loads(answer), (function["name"], value, answer)
            assert run_tool(function["name"], json.dumps({parameter: value}, separators=(",", ":"))) == answer
    assert json.loads(run_tool("read_file", '{"path": "tinycache/cache.py"}'))["content"] == FILES["tinycache/cache.py"]
    matches = json.loads(run_tool("search_files", '{"pattern": "tests/test_*.py"}'))["matches"]
    assert matches == ["tests/test_cache.py", "tests/test_parser.py", "tests/test_cli.py"]
    for name, arguments in (("launch", "{}"), ("get_weather", "not json"), ("get_weather", "[1]"),
                            ("get_weather", '{"town": "Paris"}'), ("read_file", '{"path": "/etc/passwd"}')):
        answer = run_tool(name, arguments)
        assert "error" in json.loads(answer) and run_tool(name, arguments) == answer
    assert 8 <= len(TASKS) <= 16 and len({ident for ident, _ in TASKS}) == len(TASKS)
    entries = agent_requests(3)
    assert [e[0] for e in entries] == [ident for ident, _ in TASKS[:3]]
    ident, messages, fields, plan = entries[0]
    assert messages[-1] == {"role": "user", "content": TASKS[0][1]} and fields["tools"] == list(TOOLS)
    assert plan.choices[0] == "required" and plan.max_turns == 4 and plan.execute is run_tool


class ScriptedTurns:
    """Stands in for the HTTP client: answers the conversation's turns from a script of (content, calls, error)
    and keeps what each turn was sent."""

    def __init__(self, script: list[tuple[str, list[dict], str | None]]) -> None:
        self.script, self.sent = list(script), []

    async def send(self, messages: list[dict], fields: dict) -> dict:
        self.sent.append((json.loads(json.dumps(messages)), dict(fields)))
        content, calls, error = self.script.pop(0)
        return {"text": content + "".join(c["name"] for c in calls), "content": content, "tool_calls": calls,
                "error": error, "completion_tokens": 3}


def test_the_conversation_driver_runs_the_calls_and_sends_them_back():
    import asyncio

    from lookahead.benchmarks.agent import agent_plan, run_tool
    from lookahead.benchmarks.conversation import run_conversation

    start = [{"role": "user", "content": "Weather, then tests?"}]
    weather = {"name": "get_weather", "arguments": '{"city":"Paris"}'}  # (no spaces: sent back canonical)
    tests = {"name": "run_tests", "arguments": '{"module": "tests/test_cli.py"}'}
    client = ScriptedTurns([("Let me look.", [weather], None), ("", [tests, weather], None), ("It is 14 C.", [], None)])
    records = asyncio.run(run_conversation(client.send, "c1", start, {"tools": ["T"]}, agent_plan()))
    assert [(r["id"], r["turn"], r["tool_choice"]) for r in records] == [
        ("c1#0", 0, "required"), ("c1#1", 1, "auto"), ("c1#2", 2, "auto")]  # the third answered: the end
    assert [fields["tool_choice"] for _, fields in client.sent] == ["required", "auto", "auto"]
    assert all(fields["tools"] == ["T"] for _, fields in client.sent)
    paris = run_tool("get_weather", '{"city": "Paris"}')
    assert records[0]["tool_results"] == [paris]
    assert records[1]["tool_results"] == [run_tool("run_tests", tests["arguments"]), paris]
    assert "tool_results" not in records[2]
    second, third = client.sent[1][0], client.sent[2][0]
    assert second == start + [
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_0_0", "type": "function", "function": {"name": "get_weather",
                                                                "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_0_0", "content": paris}]
    assert third[:len(second)] == second and [m["role"] for m in third[len(second):]] == ["assistant", "tool", "tool"]
    assert third[len(second)]["content"] is None and [m["tool_call_id"] for m in third[-2:]] == ["call_1_0", "call_1_1"]

    looping = ScriptedTurns([("", [weather], None)] * 4)  # calls every turn: bounded by the plan
    records = asyncio.run(run_conversation(looping.send, "c2", start, {}, agent_plan()))
    assert len(records) == 4 and "tool_results" not in records[-1] and len(looping.sent[-1][0]) == 1 + 2 * 3
    failed = ScriptedTurns([("", [weather], "APIError: boom")])  # a failed turn ends its conversation
    assert len(asyncio.run(run_conversation(failed.send, "c3", start, {}, agent_plan()))) == 1


class Streamed:
    """Stands in for openai.AsyncOpenAI: ``chat.completions.create`` streams the given chunks (or raises)."""

    def __init__(self, chunks: list | Exception) -> None:
        self.chunks, self.asked = chunks, []
        self.chat = self
        self.completions = self

    async def create(self, **kwargs):  # noqa: ANN003, ANN201 (the client's own signature)
        self.asked.append(kwargs)
        if isinstance(self.chunks, Exception):
            raise self.chunks

        async def stream():  # noqa: ANN202
            for chunk in self.chunks:
                yield chunk
        return stream()


def delta_chunk(content: str | None = None, calls: list | None = None, finish: str | None = None):
    from types import SimpleNamespace as NS

    return NS(usage=None, choices=[NS(delta=NS(content=content, tool_calls=calls), finish_reason=finish)])


def test_a_streamed_turns_tool_calls_are_gathered_and_compared_canonically():
    import asyncio
    from types import SimpleNamespace as NS

    import httpx
    import openai

    def call(index: int, name: str | None, arguments: str):  # noqa: ANN202
        return NS(index=index, function=NS(name=name, arguments=arguments))

    chunks = [delta_chunk("Checking."), delta_chunk(calls=[call(0, "get_weather", "")]),
              delta_chunk(calls=[call(0, None, '{"city":'), call(1, "run_tests", '{"module":')]),
              delta_chunk(calls=[call(0, None, '"Oslo"}'), call(1, None, '"tests/test_cli.py"}')]),
              delta_chunk(finish="tool_calls"), NS(usage=NS(completion_tokens=9, prompt_tokens=50), choices=[])]
    spec = serving.Client("http://x", "m", stream_usage=True)
    client = Streamed(chunks)
    record = asyncio.run(serving.one_request(client, spec, [], 16, 0.0, {"tools": ["T"], "tool_choice": "auto"}))
    assert client.asked[0]["extra_body"]["tools"] == ["T"] and client.asked[0]["extra_body"]["tool_choice"] == "auto"
    assert record["tool_calls"] == [{"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                                    {"name": "run_tests", "arguments": '{"module":"tests/test_cli.py"}'}]
    assert record["content"] == "Checking." and record["finish_reason"] == "tool_calls"
    assert record["text"] == 'Checking.get_weather{"city": "Oslo"}run_tests{"module": "tests/test_cli.py"}'
    assert record["completion_tokens"] == 9 and record["error"] is None and record["status"] is None
    refused = openai.BadRequestError("tools are not supported", body=None, response=httpx.Response(
        400, request=httpx.Request("POST", "http://x/v1/chat/completions")))
    record = asyncio.run(serving.one_request(Streamed(refused), spec, [], 16, 0.0))
    assert record["status"] == 400 and record["error"].startswith("BadRequestError")


def turn(conversation: str, index: int, text: str) -> dict:
    return {"id": f"{conversation}#{index}", "conversation": conversation, "turn": index, "text": text,
            "error": None}


def test_conversations_are_compared_turn_by_turn_while_their_texts_agree():
    ours = {"records": [turn("a", 0, "x"), turn("a", 1, "y"), turn("b", 0, "p"), turn("b", 1, "q"),
                        turn("b", 2, "r"), turn("b", 3, "s")]}
    theirs = {"records": [turn("a", 0, "x"), turn("a", 1, "y"), turn("b", 0, "p"), turn("b", 1, "DIFFERENT"),
                          turn("b", 2, "r")]}
    # a0 a1 b0 the same; b1 differs (compared); b2 and b3 after it are not compared, whatever they say
    assert serving.text_agreement(ours, theirs) == (3, 4, 2)
    assert serving.same_text(ours, theirs) == [3, 4]
    runs = [{**hand_made_runs()[0], "dataset": "agent", "server": server, "records": run["records"]}
            for server, run in (("lookahead", ours), ("llama.cpp", theirs))]
    row, = ratio_rows(runs)
    assert row["same_text_vs_llamacpp"] == [3, 4] and row["diverged_vs_llamacpp"] == 2
    assert row["same_text_vs_plain"] is None
    assert "| 3/4 (+2 diverged) |" in ratio_table([row])


def test_a_server_that_refuses_every_request_is_not_supported():
    refused = {"error": "BadRequestError: no tools here", "status": 400}
    assert serving.refusal([refused, {**refused, "error": "BadRequestError: again"}]) == refused["error"]
    assert serving.refusal([refused, {"error": None, "status": None}]) is None  # it answered one
    assert serving.refusal([{**refused, "status": 429}]) is None  # busy is no refusal
    assert serving.refusal([{**refused, "status": 503}]) is None
    assert serving.refusal([{**refused, "status": 501}]) == refused["error"]  # (llama.cpp's "not supported")
    assert serving.refusal([{"error": "APIConnectionError: gone", "status": None}]) is None
    assert serving.refusal([]) is None


def test_the_llama_cpp_command_line():
    anchor = serving.LlamaServer("/b/llama-server", "/m/model.gguf", ("--spec-type", "ngram-mod"))
    command = server_command("llama.cpp", "m", "/dir", 4321, 4, lookahead_args=("--threads", "2"), llama=anchor,
                             threads=3)
    assert command[0] == "/b/llama-server" and command[command.index("-m") + 1] == "/m/model.gguf"
    assert "--jinja" in command and command[-2:] == ["--spec-type", "ngram-mod"]
    assert command[command.index("-t") + 1] == "3" and command[command.index("-tb") + 1] == "3"
    assert command[command.index("-np") + 1] == "4" and command[command.index("-c") + 1] == str(4 * 4096)
    assert command[command.index("--port") + 1] == "4321" and "--threads" not in command
    with pytest.raises(ValueError, match="LlamaServer"):
        server_command("llama.cpp", "m", "/dir", 1, 1)


def test_the_report_holds_the_llama_cpp_anchor(tmp_path):
    runs = hand_made_runs()
    runs.append({**runs[0], "server": "llama.cpp", "throughput_tok_s": 40.0, "tpot_p50_s": 0.02,
                 "tokens_per_forward": None, "step_parts": None, "command": ["llama-server", "--jinja"],
                 "records": [{"id": "0", "text": "a", "error": None}, {"id": "1", "text": "z", "error": None}]})
    edit = {**runs[0], "dataset": "humaneval-edit", "prediction": {"requests": 2, "reported": 2, "accepted": 30,
                                                                   "rejected": 4}}
    runs += [edit, {**edit, "server": "llama.cpp", "prediction": {"requests": 2, "reported": 0, "accepted": 0,
                                                                  "rejected": 0}},
             {**runs[0], "dataset": "agent", "server": "llama.cpp", "throughput_tok_s": 0.0, "errors": 2,
              "unsupported": "BadRequestError: tools param requires --jinja flag"}]
    rows = ratio_rows(runs)
    assert rows[0]["throughput_vs_llamacpp"] == 1.5 and rows[0]["same_text_vs_llamacpp"] == [1, 2]
    assert rows[0]["tpot_vs_llamacpp"] == pytest.approx(2.0)
    table = ratio_table(rows)
    assert "tokens/s vs llama.cpp" in table.splitlines()[0] and "same text as llama.cpp" in table.splitlines()[0]
    assert "| tool-calls | 1 | 2.00x | 3.00x | 1.50x | 2.50x | 4.00x | 2.00x | - | - | - | 2/2 | 2/2 | 1/2 |" in table
    data = {"meta": {"environment": {"cpu": "Test CPU", "cpu_count": 2}, "threads": 2, "model": "tiny",
                     "max_tokens": 96, "limit": 2, "concurrency": [1, 4], "started": "s", "finished": "f"},
            "servers": {"lookahead": {"commands": [["lookahead", "serve"]]},
                        "llama.cpp": {"commands": [["/b/llama-server", "-m", "m.gguf", "--jinja"]]}},
            "runs": runs, "ratios": rows}
    text = Path(write_report(tmp_path / "out", data)["markdown"]).read_text()
    assert "- llama.cpp (llama.cpp's llama-server on the model's GGUF file, --jinja" in text
    assert "`/b/llama-server -m m.gguf --jinja`" in text
    assert "| agent | llama.cpp | 1 | 2 (not supported) |" in text
    assert "- llama.cpp on agent, 1 client(s): BadRequestError: tools param requires --jinja flag" in text
    assert "- lookahead on humaneval-edit, 1 client(s): 30 accepted, 4 rejected prediction tokens" in text
    assert "- llama.cpp on humaneval-edit, 1 client(s): no prediction tokens reported" in text


def test_llama_server_options_are_checked_first(tmp_path):
    for args, words in ((["--llama-server", str(tmp_path / "no-such-llama-server")], "--llama-server "),
                        (["--server", "llama.cpp"], "--server llama.cpp needs --llama-server PATH"),
                        (["--llama-server", __file__], "not executable"),
                        (["--llama-server", sys.executable, "--llama-gguf", str(tmp_path / "none.gguf")],
                         "--llama-gguf ")):
        result = invoke(*args, "--out", str(tmp_path / "out"))
        assert result.exit_code == 2, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("lookahead: error:") and words in lines[0], result.output
    assert "no such file" in invoke("--llama-server", str(tmp_path / "nope"), "--out", str(tmp_path / "o")).output
    from lookahead.cli.bench_serve import bench_serve_datasets, chosen_servers

    assert chosen_servers((), "/b/llama-server") == ["lookahead", "lookahead-plain", "transformers", "llama.cpp"]
    assert chosen_servers((), None) == ["lookahead", "lookahead-plain", "transformers"]
    assert chosen_servers(("llama.cpp", "lookahead"), "/b") == ["lookahead", "llama.cpp"]
    assert chosen_servers(("lookahead-plain",), "/b") == ["lookahead-plain", "llama.cpp"]  # (the binary: run it)
    assert bench_serve_datasets(["Tool_Calls", "agent", "bfcl"]) == ("tool-calls", "agent", "tool-calls")


def tool_model_dir(path: Path, template: str) -> str:
    """A tiny random Llama saved with the character-level tokenizer and ``template`` as its chat template."""
    from conftest import tiny_tokenizer

    model = tiny_model("llama")
    model.generation_config.eos_token_id = 2  # (the character-level tokenizer's </s>)
    model.config.max_position_embeddings = 4096  # (the tools rendered a character a token: 2,300 tokens)
    model.save_pretrained(path)
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = template
    tokenizer.save_pretrained(path)
    return str(path)


def test_agent_conversations_against_real_lookahead_servers(tmp_path):
    """The agent workload on real servers (a tiny random model under Qwen2.5's chat template): the first
    turn's call is constrained to the tools' schemas, so it parses into tool_calls; its fake result goes
    back and the conversation goes on; speculation on and off answer every turn alike (greedy)."""
    from lookahead.benchmarks.agent import TOOLS, run_tool

    template = (Path(__file__).parent / "fixtures" / "qwen2.5_chat_template.jinja").read_text()
    directory = tool_model_dir(tmp_path / "model", template)
    out = tmp_path / "out"
    result = invoke("--model", directory, "--dataset", "agent", "--server", "lookahead", "--server",
                    "lookahead-plain", "--concurrency", "1", "--limit", "2", "--max-tokens", "160", "--threads", "1",
                    "--startup-timeout", "120", "--lookahead-arg=--cost-cache-dir=", "--out", str(out))
    assert result.exit_code == 0, result.output
    data = json.loads((out / "bench-serve.json").read_text())
    assert [r["server"] for r in data["runs"]] == ["lookahead", "lookahead-plain"]
    for run in data["runs"]:
        records = run["records"]
        assert run["errors"] == 0 and run["unsupported"] is None, records
        assert {r["conversation"] for r in records} == {"weather-paris", "warmer-city"}
        for first in (r for r in records if r["turn"] == 0):
            calls = first["tool_calls"]  # tool_choice "required": a call (or several), valid for the schema
            # (length, not tool_calls, on this model: after the closed call the grammar lets it go on with tokens
            # that decode to nothing until max_tokens; the server parses the call all the same)
            assert calls and first["finish_reason"] in ("tool_calls", "length") and first["tool_choice"] == "required"
            assert all(call["name"] in {t["function"]["name"] for t in TOOLS} for call in calls)
            assert first["tool_results"] == [run_tool(call["name"], call["arguments"]) for call in calls]
            assert all("error" not in json.loads(result) for result in first["tool_results"])
        assert len(records) >= 4 and all(r["completion_tokens"] > 0 for r in records)
        assert run["agent"]["conversations"] == 2 and run["agent"]["turns"] == len(records)
        assert run["agent"]["calls_run"] >= 2 and run["output_tokens"] > 0
    row, = data["ratios"]
    turns = len(data["runs"][0]["records"])
    assert row["same_text_vs_plain"] == [turns, turns] and row["diverged_vs_plain"] == 0, row
    assert "Agent conversations" in (out / "bench-serve.md").read_text()


def test_a_server_without_tool_support_is_reported_not_supported(tmp_path):
    """The agent workload on a model whose template takes no tools: the server refuses every first turn (400),
    and the run is reported as not supported instead of failing the command."""
    directory = tiny_model_dir(tmp_path / "model")
    out = tmp_path / "out"
    result = invoke("--model", directory, "--dataset", "agent", "--server", "lookahead-plain", "--concurrency", "1",
                    "--limit", "1", "--max-tokens", "8", "--threads", "1", "--startup-timeout", "120",
                    "--lookahead-arg=--cost-cache-dir=", "--out", str(out))
    assert result.exit_code == 0, result.output
    run, = json.loads((out / "bench-serve.json").read_text())["runs"]
    assert run["requests"] == 1 and run["errors"] == 1 and run["records"][0]["status"] == 400
    assert "tool" in run["unsupported"], run["unsupported"]
    assert "Not supported" in (out / "bench-serve.md").read_text()
