"""The benchmark runner, report writer, exact-match check and bench CLI on a tiny random Llama
(no timing assertions)."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from conftest import tiny_model

from lookahead import LookaheadConfig
from lookahead.benchmarks.configs import parse_config_spec
from lookahead.benchmarks.costcurve import cost_curve
from lookahead.benchmarks.report import (
    caption,
    figure,
    gain_table,
    gains,
    geomean,
    redraw,
    summarize,
    tick_overlaps,
    write_report,
)
from lookahead.benchmarks.runner import (
    PLAIN,
    PRESETS,
    BenchPrompt,
    ExactMatchError,
    Method,
    Sampling,
    check_exact,
    default_methods,
    lookahead_method,
    plain_config,
    preset_specs,
    run_benchmark,
)
from lookahead.cli.main import main

MAX_NEW = 12


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def prompts():
    repeat = [5, 6, 7, 8, 9] * 4
    return [BenchPrompt("tiny", "a", [1] + repeat), BenchPrompt("tiny", "b", [1, 40, 41, 42, 43, 40, 41, 42], turn=2)]


@pytest.fixture(scope="module")
def records(model, prompts):
    methods = default_methods(model, None, LookaheadConfig(), ["wide:window=4,ngram=4,candidates=6"])
    seen = []
    out = run_benchmark(model, methods, prompts, MAX_NEW, progress=seen.append)
    assert len(seen) == len(prompts) * len(methods)
    return out


def test_runner_records_every_prompt_and_method(records):
    assert [(r["prompt_id"], r["method"]) for r in records] == [
        (p, m) for p in ("a", "b") for m in ("greedy", "prompt-lookup", "lookahead", PLAIN, "wide")]
    for r in records:
        assert r["new_tokens"] == MAX_NEW == len(r["tokens"])
        assert r["wall_time_s"] > 0 and r["tokens_per_s"] > 0 and r["speedup"] > 0 and r["peak_rss_mb"] > 0
        assert r["exact_match"], r
    greedy = [r for r in records if r["method"] == "greedy"]
    assert all(r["forwards"] == MAX_NEW and r["accepted_per_step"] == 1.0 and r["speedup"] == 1.0 for r in greedy)
    lookahead = [r for r in records if r["method"] in ("lookahead", PLAIN, "wide")]
    assert all(r["must_match"] and r["accepted"] and r["forwards"] == len(r["accepted"]) + 1 for r in lookahead)
    # every decode step's host and forward time, one of each per step (none for transformers' methods)
    assert all(len(r["host_s"]) == len(r["forward_s"]) == len(r["accepted"]) for r in lookahead)
    assert all(min(r["host_s"]) >= 0 and min(r["forward_s"]) > 0 for r in lookahead)
    assert all(not r["host_s"] and not r["forward_s"] for r in greedy)
    check_exact(records)  # does not raise


def test_the_warm_up_makes_each_lookahead_methods_trace(model, prompts):
    """The trace is a one-time cost like the kernels' compiling: made in the untimed warm-up call, before
    the first timed prompt (left to the heuristic, the first timed prompt paid it: 1.32x greedy against
    2.7x over all nine in run 121). (A timed step of another kind, a route measured on this machine,
    may still make that kind's trace.)"""
    methods = default_methods(model, None, LookaheadConfig())
    traced = [m.generator.target.traced for m in methods if m.generator is not None]
    if not traced or any(t is None for t in traced):
        pytest.skip("no traced forward for this model here")
    made = []
    for t in traced:
        original = t._new_trace

        def counted(key, inputs, t=t, original=original):
            made.append((t, key))
            return original(key, inputs)

        t._new_trace = counted
    run_benchmark(model, methods, prompts, 4, warmup=True, progress=lambda line: made.append(line))
    first_timed = next(i for i, m in enumerate(made) if isinstance(m, str))  # progress: a timed run ended
    assert {id(m[0]) for m in made[:first_timed]} == {id(t) for t in traced}  # every generator traced before
    assert all(t.patience > 0 for t in traced)  # the heuristic is back for the timed calls


def test_exact_match_check_fails_on_wrong_tokens(model, prompts):
    def wrong(ids, m):
        return torch.cat([ids, torch.full((1, m), 3)], dim=1)

    methods = [default_methods(model, None)[0], Method("broken", wrong, exact=True)]
    records = run_benchmark(model, methods, prompts, 4, warmup=False)
    assert [r["exact_match"] for r in records if r["method"] == "broken"] == [False, False]
    with pytest.raises(ExactMatchError, match="broken on tiny/a"):
        check_exact(records)
    # a method that need not match (e.g. fp16 prompt lookup) is reported, not enforced
    check_exact([dict(r, must_match=False) for r in records])


def test_runner_requires_greedy_first(model, prompts):
    with pytest.raises(ValueError, match="greedy"):
        run_benchmark(model, default_methods(model, None)[1:], prompts, 2)


def test_parse_config_spec():
    name, cfg = parse_config_spec("wide:window=5,ngram=4,candidates=8,context_match=false")
    assert name == "wide" and (cfg.window, cfg.ngram, cfg.candidates, cfg.context_match) == (5, 4, 8, False)
    name, cfg = parse_config_spec("window=2")
    assert name == "lookahead[window=2]" and cfg.window == 2 and cfg.ngram == LookaheadConfig().ngram
    with pytest.raises(ValueError, match="FIELD=VALUE"):
        parse_config_spec("x:colour=3")
    with pytest.raises(ValueError, match="integer"):
        parse_config_spec("x:window=big")
    name, cfg = parse_config_spec("f:budget=fixed,recycle=no")
    assert (cfg.budget, cfg.recycle) == ("fixed", False)


def test_one_config_parser_for_the_commands_options_and_the_specs():
    """The commands' options and --config specs build LookaheadConfig through the config module's parser
    (``LookaheadConfig.from_mapping``, ``parse_value``)."""
    import click

    from lookahead.cli.options import checked_config, config_options
    from lookahead.config import ConfigError, parse_value

    config_from = LookaheadConfig.from_mapping

    assert (parse_value("recycle", " No "), parse_value("window", "7"), parse_value("budget", " fixed ")) == (
        False, 7, "fixed")
    with pytest.raises(ValueError, match="recycle must be true or false, got 'maybe'"):
        parse_value("recycle", "maybe")
    assert config_from({"window": "5", "recycle": "false"}) == config_from({"window": 5, "recycle": False})
    base = LookaheadConfig(ngram=3)
    assert config_from({"window": 2}, base) == LookaheadConfig(ngram=3, window=2)
    assert parse_config_spec("x:match-min=3", base)[1] == LookaheadConfig(ngram=3, match_min=3)
    with pytest.raises(ConfigError, match="'colour' is no LookaheadConfig field"):
        config_from({"colour": 3})
    with pytest.raises(ConfigError, match="window must be an integer, got 'big'"):
        config_from({"window": "big"})

    seen = []

    @click.command()
    @config_options
    def show(**values):
        seen.append(checked_config(values))

    result = CliRunner().invoke(show, ["--window", "5", "--no-recycle", "--budget", "fixed"])
    assert result.exit_code == 0, result.output
    assert seen == [parse_config_spec("window=5,recycle=false,budget=fixed")[1]]


def test_presets_are_valid_configs():
    specs = preset_specs(["all"])
    assert [s.split(":")[0] for s in specs] == list(PRESETS)
    configs = dict(parse_config_spec(s) for s in specs)
    lade = configs["lade-gpu"]
    assert (lade.window, lade.ngram, lade.pool_ngram, lade.candidates, lade.budget) == (15, 5, 5, 15, "fixed")
    assert not configs["recycle-only"].context_match and not configs["recycle-only"].ngram_pool
    assert configs["no-speculation"].candidates == 0 and configs["no-speculation"].few_row_matmul
    assert not configs["stock-kernels"].few_row_matmul and configs["stock-kernels"].candidates > 0
    assert configs["stock-kernels"].onednn_linear and not LookaheadConfig().onednn_linear  # torch's oneDNN too
    assert preset_specs(["pool-only"]) == [f"pool-only:{PRESETS['pool-only']}"]
    with pytest.raises(ValueError, match="unknown preset 'lade'"):
        preset_specs(["lade"])


def test_report_writes_json_markdown_png(tmp_path, records, model):
    cost = cost_curve(model, context=20, ks=(1, 2, 4), repeats=1)
    # structure only (one median per k, normalised to k = 1); no time is compared
    per_k = cost["seconds"]
    assert cost["k"] == [1, 2, 4] and len(per_k) == 3 and cost["relative"][0] == 1.0
    paths = write_report(tmp_path / "out", records, cost, {"model": "tiny", "dtype": "float32"})
    data = json.loads(paths["json"].read_text())
    assert data["environment"]["dtype"] == "float32" and data["environment"]["torch_threads"] >= 1
    assert {"torch", "transformers", "python"} <= set(data["environment"]["versions"])
    assert len(data["records"]) == len(records) and data["cost_curve"]["k"] == [1, 2, 4]
    rows = {(r["dataset"], r["method"]): r for r in data["summary"]}
    assert rows[("tiny", "lookahead")]["exact_pct"] == 100.0 and rows[("tiny", "greedy")]["speedup_geomean"] == 1.0
    assert (data["meta"]["mode"], data["meta"]["seed"]) == ("greedy", 0)
    table = paths["markdown"].read_text()
    assert "| tiny | lookahead | 2 |" in table and "| tiny | wide | 2 |" in table and "x k=1" in table
    assert "Mode: greedy, seed 0" in table and "| speedup (geomean) |" in table and "exact %" in table
    steps = sum(len(r["host_s"]) for r in records if r["method"] == "lookahead")
    assert "| method | steps | host ms | forward ms |" in table and f"| lookahead | {steps} |" in table
    assert "| greedy |" not in table.split("| method | steps |")[1]  # only methods that report steps
    assert paths["figure"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summary_numbers():
    recs = [dict(dataset="d", method="m", wall_time_s=t, speedup=s, new_tokens=10, accepted_per_step=a,
                 forwards=5, exact_match=e, peak_rss_mb=1.0)
            for t, s, a, e in ((1.0, 2.0, 2.0, True), (2.0, 0.5, 1.0, False))]
    (row,) = summarize(recs)
    assert row["speedup_geomean"] == pytest.approx(1.0) and row["speedup_min"] == 0.5
    assert row["tokens_per_s"] == pytest.approx(20 / 3) and row["exact_pct"] == 50.0
    assert geomean([]) == 0.0


# ---------------------------------------------------------------- sample mode

SAMPLING = Sampling(temperature=0.7, top_k=20)
SEED = 5


def half_sampler(model):
    """transformers sampling that stops after half the tokens: a method whose token count differs."""
    def run(ids, m):
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=m // 2, **SAMPLING.kwargs())
    return run


def sample_run(model, prompts):
    """Fresh sample-mode methods on the prompts (default, adaptive budget: the sampled text
    depends on the seed alone, not on measured step times)."""
    methods = default_methods(model, None, LookaheadConfig(), sampling=SAMPLING)
    methods.append(Method("half", half_sampler(model), sampling=SAMPLING))
    return run_benchmark(model, methods, prompts, MAX_NEW, seed=SEED)


@pytest.fixture(scope="module")
def sampled(model, prompts):
    """Two sample-mode benchmarks with the same seed."""
    return sample_run(model, prompts), sample_run(model, prompts)


def by_prompt(records):
    return {(r["prompt_id"], r["method"]): r for r in records}


def test_sample_mode_runs_every_method_with_the_mode_and_seed(sampled):
    records = sampled[0]
    assert [(r["prompt_id"], r["method"]) for r in records] == [
        (p, m) for p in ("a", "b") for m in ("sampling", "prompt-lookup", "lookahead", PLAIN, "half")]
    assert {r["mode"] for r in records} == {"sampling T=0.7 top_k=20 top_p=1"}  # top_p: transformers' default
    assert [r["seed"] for r in records] == [SEED] * 5 + [SEED + 1] * 5
    lookahead = [r for r in records if r["method"] == "lookahead"]
    assert all(r["accepted"] and r["forwards"] == len(r["accepted"]) + 1 for r in lookahead)
    assert all(r["accepted_per_step"] >= 1 for r in records if r["new_tokens"] > 1)


def test_sample_mode_speedup_is_the_tokens_per_second_ratio(sampled):
    records = by_prompt(sampled[0])
    differ = 0
    for (prompt, _method), r in records.items():
        ref = records[(prompt, "sampling")]
        assert r["tokens_per_s"] == pytest.approx(r["new_tokens"] / r["wall_time_s"])
        assert r["speedup"] == pytest.approx(r["tokens_per_s"] / ref["tokens_per_s"])
        if r["new_tokens"] != ref["new_tokens"]:  # then the wall-time ratio is a different number
            differ += 1
            assert r["speedup"] != pytest.approx(ref["wall_time_s"] / r["wall_time_s"])
    assert differ >= 2  # "half" on both prompts at least


def test_sample_mode_same_seed_same_tokens(sampled):
    first, second = (by_prompt(records) for records in sampled)
    assert {k: r["tokens"] for k, r in first.items()} == {k: r["tokens"] for k, r in second.items()}
    # every method on a prompt starts from the same seed: "half" replays the reference's first draws
    for prompt in ("a", "b"):
        reference = first[(prompt, "sampling")]["tokens"]
        assert first[(prompt, "half")]["tokens"] == reference[:MAX_NEW // 2]
    assert first[("a", "sampling")]["tokens"] != first[("b", "sampling")]["tokens"]


def test_sample_mode_checks_no_exact_match(sampled):
    records = sampled[0]
    assert not any(r["must_match"] for r in records)
    check_exact(records)  # does not raise, although the outputs differ:
    with pytest.raises(ExactMatchError):
        check_exact([dict(r, must_match=True) for r in records])


def test_sample_mode_report_names_mode_seed_and_unit(tmp_path, sampled):
    paths = write_report(tmp_path / "out", sampled[0], None, {"model": "tiny", "dtype": "float32"})
    data = json.loads(paths["json"].read_text())
    assert (data["meta"]["mode"], data["meta"]["seed"]) == ("sampling T=0.7 top_k=20 top_p=1", SEED)
    table = paths["markdown"].read_text()
    assert "Mode: sampling T=0.7 top_k=20 top_p=1, seed 5" in table and "new tokens/s against `sampling`" in table
    assert "| speedup (tokens/s, geomean) | speedup (tokens/s, min) |" in table and "exact %" not in table
    assert "| tiny | lookahead | 2 |" in table


def test_greedy_mode_stays_greedy_when_the_model_samples_by_default(prompts):
    model = tiny_model("llama")
    model.generation_config.do_sample, model.generation_config.top_k = True, 5  # the model's default: sampling
    methods = default_methods(model, None)
    records = run_benchmark(model, methods, prompts, 8, warmup=False)
    assert {r["mode"] for r in records} == {"greedy"}
    check_exact(records)  # lookahead passed do_sample=False, like the greedy reference


def test_runner_refuses_mixed_modes(model, prompts):
    methods = default_methods(model, None)[:1] + [lookahead_method(model, None, sampling=SAMPLING)]
    with pytest.raises(ValueError, match="decode differently"):
        run_benchmark(model, methods, prompts, 2, warmup=False)


@pytest.mark.parametrize("kwargs, words", [
    (dict(temperature=0.0), "temperature must be > 0"), (dict(temperature=-1.0), "temperature must be > 0"),
    (dict(top_k=-1), "top_k must be >= 0"), (dict(top_p=0.0), "top_p must be in (0, 1]"),
    (dict(top_p=1.5), "top_p must be in (0, 1]"),
])
def test_sampling_settings_are_checked(kwargs, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace("]", r"\]")):
        Sampling(**kwargs)
    assert Sampling().kwargs() == {"do_sample": True, "temperature": 0.7}  # None = the model's own value


# ---------------------------------------------------------------- bench CLI options

def bench_cli(*args):
    return CliRunner().invoke(main, ["bench", *args])


@pytest.fixture
def bench_calls(monkeypatch):
    """Replace the benchmark itself: the CLI's parsed sampling settings and seed are recorded."""
    calls = []

    def fake(*args):
        calls.append({"sampling": args[-3], "seed": args[-2], "busy_cores": args[-1]})
        return "table", {"json": "j", "markdown": "m", "figure": "f"}, None

    monkeypatch.setattr("lookahead.cli.bench._bench", fake)  # lookahead.cli.main calls it through bench
    return calls


@pytest.mark.parametrize("args, sampling, seed", [
    ([], None, 0),
    (["--sample"], Sampling(temperature=0.7), 0),
    (["--sample", "--temperature", "1.3", "--top-k", "7", "--top-p", "0.9", "--seed", "11"],
     Sampling(temperature=1.3, top_k=7, top_p=0.9), 11),
    (["--greedy", "--seed", "3"], None, 3),
    (["--sample", "--ignore-eos"], Sampling(temperature=0.7, ignore_eos=True), 0),
])
def test_bench_cli_parses_sampling_options(bench_calls, args, sampling, seed):
    result = bench_cli(*args)
    assert result.exit_code == 0, result.output
    assert bench_calls == [{"sampling": sampling, "seed": seed, "busy_cores": 0}]


@pytest.mark.parametrize("args, words", [
    (["--sample", "--temperature", "-1"], "temperature must be > 0, got -1.0 (option --temperature)"),
    (["--sample", "--temperature", "0"], "temperature must be > 0, got 0.0 (option --temperature)"),
    (["--sample", "--top-k", "-2"], "top_k must be >= 0 (0 = off), got -2 (option --top-k)"),
    (["--sample", "--top-p", "1.5"], "top_p must be in (0, 1], got 1.5 (option --top-p)"),
    (["--temperature", "0.5"], "--temperature only applies with --sample"),
    (["--top-p", "0.5"], "--top-p only applies with --sample"),
    (["--seed", "-1"], "--seed must be a whole number from 0 to 2**64-1"),
    (["--seed", "1e23"], "--seed must be a whole number from 0 to 2**64-1 (18446744073709551615), got 1e23"),
    (["--ignore-eos"], "--ignore-eos only applies with --sample"),
])
def test_bench_cli_bad_sampling_option_gets_one_line(bench_calls, args, words):
    result = bench_cli(*args)
    assert result.exit_code == 2 and not bench_calls
    assert words in result.stderr
    assert "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1


def test_ignore_eos_decodes_exactly_max_new_tokens(model, prompts):
    """With EOS ignored every sampled run has max_new_tokens new tokens, so tokens/s compare equal lengths."""
    sampling = Sampling(temperature=1.0, ignore_eos=True)
    methods = default_methods(model, None, LookaheadConfig(), sampling=sampling)
    records = run_benchmark(model, methods, prompts, MAX_NEW, seed=SEED)
    assert {r["new_tokens"] for r in records} == {MAX_NEW}
    assert all(r["mode"].endswith("EOS ignored") for r in records)


def test_acceptance_table_counts_tokens_per_forward_and_exactness(model, prompts):
    """benchmarks/acceptance.py: new tokens over decode forwards, and outputs checked against generate."""
    from lookahead import LookaheadGenerator
    from lookahead.benchmarks.acceptance import greedy_references, markdown, tokens_per_forward

    references = greedy_references(model, prompts, MAX_NEW)
    gen = LookaheadGenerator(model, config=LookaheadConfig(budget_curve="flat"))
    value, exact = tokens_per_forward(gen, prompts, MAX_NEW, references)
    assert exact == len(prompts)
    assert value == pytest.approx(len(prompts) * MAX_NEW / gen_steps(model, prompts))
    assert value > 1.0  # prompt "a" repeats a 5-token cycle: copies arrive several tokens a forward
    wrong = [r[:-1] + [r[-1] + 1] for r in references]
    assert tokens_per_forward(gen, prompts, MAX_NEW, wrong)[1] == 0
    table = markdown([{"dataset": "tiny", "config": "flat", "tokens_per_forward": value, "exact": 2, "prompts": 2},
                      {"dataset": "tiny", "config": "win", "tokens_per_forward": 2.5, "exact": 1, "prompts": 2}])
    assert table.splitlines() == ["| data set | flat | win | exact % |", "|---|---:|---:|---:|",
                                  f"| tiny | {value:.2f} | 2.50 | 75 |"]


def gen_steps(model, prompts) -> int:
    """Decode forwards of a fresh flat-curve generator over ``prompts`` (one generator, in order)."""
    from lookahead import LookaheadGenerator
    gen = LookaheadGenerator(model, config=LookaheadConfig(budget_curve="flat"))
    steps = 0
    for prompt in prompts:
        gen.generate(torch.tensor([prompt.input_ids]), max_new_tokens=MAX_NEW)
        steps += gen.last_stats.steps
    return steps


def test_bench_passes_busy_cores_and_threads(bench_calls):
    threads = torch.get_num_threads()
    try:
        result = bench_cli("--busy-cores", "1", "--threads", "1")
        assert result.exit_code == 0, result.output
        assert bench_calls == [{"sampling": None, "seed": 0, "busy_cores": 1}] and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    for bad in (["--busy-cores", "-1"], ["--threads", "0"]):
        result = bench_cli(*bad)
        assert result.exit_code == 2 and "range" in result.output


def test_busy_cores_spin_while_inside_and_stop_after():
    from lookahead.benchmarks.busy import busy_cores

    with busy_cores(0) as none:
        assert none == []
    with busy_cores(2) as spinners:
        assert len(spinners) == 2 and all(s.poll() is None for s in spinners)  # running
    assert all(s.poll() is not None for s in spinners)  # killed on the way out


def test_the_report_names_the_machine(tmp_path):
    from lookahead.benchmarks.report import environment, machine_line

    env = environment()
    line = machine_line(env, 1)
    assert line.startswith(f"Measured on {env['cpu']} ({env['cpu_count']} cores), torch on ")
    assert "1 core kept busy by other processes" in line and "nothing else running" in machine_line(env)
    paths = write_report(tmp_path, [], meta={"busy_cores": 1})
    assert "1 core kept busy" in paths["table"]


# ---------------------------------------------------------------- where the numbers come from (issue 36)

def test_lookahead_plain_is_the_same_routes_without_speculation(model, records):
    """lookahead-plain: the lookahead config with no candidates and the window x alone, one token
    a forward, equal to greedy; in every default bench beside lookahead."""
    config = LookaheadConfig(window=3, ngram=4, candidates=6, recycle=False)
    plain = plain_config(config)
    assert (plain.candidates, plain.window, plain.auto_window) == (0, 1, False)
    assert plain == LookaheadConfig(window=1, ngram=4, candidates=0, recycle=False, auto_window=False)
    methods = default_methods(model, None, config)
    assert [m.name for m in methods][2:4] == ["lookahead", PLAIN]
    assert methods[3].config["candidates"] == 0 and methods[3].exact
    runs = [r for r in records if r["method"] == PLAIN]
    assert len(runs) == 2
    assert all(r["accepted"] == [1] * MAX_NEW and r["forwards"] == MAX_NEW + 1 and r["exact_match"] for r in runs)
    assert all(r["routes"] for r in runs) or all(not r["routes"] for r in records)  # lookahead's own routes


def test_gains_split_lookahead_into_kernels_and_speculation():
    def record(dataset, prompt, method, speedup):
        return dict(dataset=dataset, prompt_id=prompt, turn=1, seed=0, method=method, speedup=speedup)

    records = [record("d", "a", "greedy", 1.0), record("d", "a", PLAIN, 1.5), record("d", "a", "lookahead", 3.0),
               record("d", "b", "greedy", 1.0), record("d", "b", PLAIN, 2.0), record("d", "b", "lookahead", 2.0),
               record("e", "c", "greedy", 1.0), record("e", "c", PLAIN, 1.2), record("e", "c", "lookahead", 3.6)]
    rows = {r["dataset"]: r for r in gains(records)}
    assert list(rows) == ["d", "e", "all"]
    assert rows["d"]["kernel"] == pytest.approx(geomean([1.5, 2.0]))
    assert rows["d"]["speculation"] == pytest.approx(geomean([2.0, 1.0]))
    assert rows["e"]["speculation"] == pytest.approx(3.0) and rows["all"]["prompts"] == 3
    for row in rows.values():  # per prompt total = kernels x speculation, so the geomeans multiply too
        assert row["total"] == pytest.approx(row["kernel"] * row["speculation"])
    table = gain_table(gains(records), "greedy")
    assert f"| dataset | n | kernels: {PLAIN} vs greedy | speculation: lookahead vs {PLAIN} " in table
    assert "| **all** | 3 |" in table and "| e | 1 | 1.20x | 3.00x | 3.60x |" in table
    assert gains([r for r in records if r["method"] != PLAIN]) == [] and gain_table([], "greedy") == ""


def test_the_report_says_where_its_numbers_come_from(tmp_path, records):
    paths = write_report(tmp_path / "out", records, None,
                         {"model": "tiny-llama", "dtype": "float32", "max_new_tokens": MAX_NEW})
    table = paths["markdown"].read_text()
    head = table.splitlines()[:3]
    assert head[0] == f"Model tiny-llama (float32), 2 prompts from 1 data set, up to {MAX_NEW} new tokens each."
    assert head[1].startswith("Mode: greedy, seed 0") and head[2].startswith("Measured on ")
    assert "torch on " in head[2] and " thread" in head[2]
    assert f"| tiny | {PLAIN} | 2 |" in table  # one more row (column of the figure)
    assert f"kernels: {PLAIN} vs greedy" in table and f"speculation: lookahead vs {PLAIN}" in table
    assert table.index("| dataset | method |") < table.index("Where lookahead's speedup comes from")
    data = json.loads(paths["json"].read_text())
    text = caption(data["meta"], data["environment"], records)
    env = data["environment"]
    assert text.startswith(f"tiny-llama (float32) on {env['cpu']} ({env['cpu_count']} cores, torch on ")
    assert text.endswith(f"2 prompts, up to {MAX_NEW} new tokens; greedy")


def test_the_figure_has_a_title_and_readable_labels(records):
    import matplotlib.pyplot as plt

    rows = summarize(records)
    fig = figure(records, rows, None, "tiny-llama on a CPU; 2 prompts, up to 12 new tokens; greedy")
    try:
        assert fig._suptitle.get_text() == ("lookahead bench: tiny-llama on a CPU; 2 prompts, up to 12 new tokens; "
                                            "greedy")  # noqa: SLF001
        assert f"{PLAIN}: lookahead's kernels alone" in fig.axes[0].get_title()
        assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == [
            "prompt-lookup", "lookahead", PLAIN, "wide"]
    finally:
        plt.close(fig)
    # many long data-set names: the labels turn (or shrink) until none overlaps another
    names = ["humaneval-annotate", "humaneval-chat", "mt-bench-1", "passage-qa", "translate", "summarize",
             "tool-calls", "open-qa", "writing", "gsm8k", "mt-bench", "humaneval"]
    many = [dict(r, dataset=name, prompt_id=f"{name}/{r['prompt_id']}") for name in names for r in records]
    fig = figure(many, summarize(many), None, "many")
    try:
        assert not tick_overlaps(fig, fig.axes[0])
        assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == names
    finally:
        plt.close(fig)


def test_a_recorded_run_is_redrawn_without_running_anything(tmp_path, records, monkeypatch):
    paths = write_report(tmp_path / "out", records, None, {"model": "tiny", "max_new_tokens": MAX_NEW})
    monkeypatch.setattr("lookahead.benchmarks.runner.run_benchmark",
                        lambda *a, **k: pytest.fail("redraw ran a benchmark"))
    out = redraw(paths["json"], tmp_path / "again.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_smoke_run_names_model_and_splits_the_gain(tmp_path):
    """The whole command on a tiny saved model and two prompts of one's own: the printed table and
    bench.md name the model, prompts, new tokens and mode, and carry lookahead-plain's split."""
    from conftest import save_model_dir

    model_dir = save_model_dir(tmp_path / "model", tiny_model("llama"))
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text('{"text": "w3 w4 w5 w6 w3 w4 w5 w6 w3"}\n{"text": "w7 w8 w9 w7 w8 w9 w7"}\n')
    result = bench_cli("--model", model_dir, "--prompts", str(prompts), "--max-new-tokens", "6",
                       "--no-cost-curve", "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    head = f"Model {model_dir} (float32), 2 prompts from 1 data set, up to 6 new tokens each."
    assert head in result.stdout and "Mode: greedy" in result.stdout and "Measured on " in result.stdout
    assert f"| mine | {PLAIN} | 2 |" in result.stdout and f"speculation: lookahead vs {PLAIN}" in result.stdout
    assert (tmp_path / "out" / "bench.md").read_text().startswith(head)
    assert (tmp_path / "out" / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
