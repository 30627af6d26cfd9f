"""The benchmark runner, report writer and exact-match check on a tiny random Llama (no timing assertions)."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.costcurve import cost_curve
from benchmarks.report import geomean, summarize, write_report
from benchmarks.runner import (PRESETS, preset_specs, BenchPrompt, ExactMatchError, Method, check_exact, default_methods,
                               parse_config_spec, run_benchmark)
from lookahead import LookaheadConfig
from conftest import tiny_model

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
        (p, m) for p in ("a", "b") for m in ("greedy", "prompt-lookup", "lookahead", "wide")]
    for r in records:
        assert r["new_tokens"] == MAX_NEW == len(r["tokens"])
        assert r["wall_time_s"] > 0 and r["tokens_per_s"] > 0 and r["speedup"] > 0 and r["peak_rss_mb"] > 0
        assert r["exact_match"], r
    greedy = [r for r in records if r["method"] == "greedy"]
    assert all(r["forwards"] == MAX_NEW and r["accepted_per_step"] == 1.0 and r["speedup"] == 1.0 for r in greedy)
    lookahead = [r for r in records if r["method"] in ("lookahead", "wide")]
    assert all(r["must_match"] and r["accepted"] and r["forwards"] == len(r["accepted"]) + 1 for r in lookahead)
    check_exact(records)  # does not raise


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


def test_presets_are_valid_configs():
    specs = preset_specs(["all"])
    assert [s.split(":")[0] for s in specs] == list(PRESETS)
    configs = dict(parse_config_spec(s) for s in specs)
    lade = configs["lade-gpu"]
    assert (lade.window, lade.ngram, lade.candidates, lade.budget) == (15, 5, 15, "fixed")
    assert not configs["recycle-only"].context_match and not configs["recycle-only"].ngram_pool
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
    table = paths["markdown"].read_text()
    assert "| tiny | lookahead | 2 |" in table and "| tiny | wide | 2 |" in table and "x k=1" in table
    assert paths["figure"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summary_numbers():
    recs = [dict(dataset="d", method="m", wall_time_s=t, speedup=s, new_tokens=10, accepted_per_step=a,
                 forwards=5, exact_match=e, peak_rss_mb=1.0)
            for t, s, a, e in ((1.0, 2.0, 2.0, True), (2.0, 0.5, 1.0, False))]
    (row,) = summarize(recs)
    assert row["speedup_geomean"] == pytest.approx(1.0) and row["speedup_min"] == 0.5
    assert row["tokens_per_s"] == pytest.approx(20 / 3) and row["exact_pct"] == 50.0
    assert geomean([]) == 0.0
