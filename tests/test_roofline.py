"""lookahead roofline (benchmarks/roofline.py, cli/roofline.py): structure, units and invariants on a
tiny Llama. No test asserts a time: only what the numbers must satisfy whatever the machine."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from click.testing import CliRunner

from lookahead.model.switches import ForwardSwitches
from lookahead.benchmarks import compute_roof as cr
from lookahead.benchmarks import roofline as rl
from lookahead.call.stats import PHASES
from lookahead.cli.main import main
from lookahead.cost.measure import decode_step_timer
from lookahead.kernels import linear
from lookahead.model import cache, fewrows
from lookahead.model.routing import Route, candidate_routes
from lookahead.model.support import check_model
from conftest import COMMON, save_model_dir, tiny_model, tiny_tokenizer

SMALL_STREAM = 1 << 20  # bytes the tests' bandwidth probe sums (the command's 256 MB is for real runs)


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def time_one(llama):
    return decode_step_timer(llama, check_model(llama, False), 16)


# ------------------------------------------------------------------ the limit


def test_weight_bytes_leave_out_an_untied_input_embedding(llama):
    assert not llama.config.tie_word_embeddings
    every = sum(p.numel() * p.element_size() for p in llama.parameters())
    table = llama.get_input_embeddings().weight
    assert rl.weight_bytes(llama) == every - table.numel() * 4
    assert llama.get_output_embeddings().weight.numel() * 4 <= rl.weight_bytes(llama)  # lm_head is read


def test_weight_bytes_count_a_tied_embedding_once():
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=2, tie_word_embeddings=True,
                                                                   **COMMON))
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    listed = sum(p.numel() * 4 for _, p in model.named_parameters(remove_duplicate=False))
    table = model.get_input_embeddings().weight.numel() * 4
    assert rl.weight_bytes(model) == listed - table  # listed twice, read (by lm_head) once
    assert rl.weight_bytes(model) == sum(p.numel() * 4 for p in model.parameters())


@pytest.mark.parametrize("products", ["float32", "int8"])
def test_weight_bytes_of_a_gguf_model_are_its_layers_blocks_as_held(products):
    """A GGUF model's linear layers hold blocks, or their 16-row layout for int8 products (``blocks`` then
    None): the bytes held count, once each, beside its parameters (its norms); its untied table is left out."""
    from gguf import GGMLQuantizationType as Q
    from test_quantized import quantized_model

    from lookahead.model.products import set_products
    from lookahead.model.quantized import QuantizedLinear, quantized_modules

    model = quantized_model("llama", Q.Q4_1)
    set_products(model, products)
    held = {id(m.stored): m.stored for m in quantized_modules(model) if isinstance(m, QuantizedLinear)}
    assert (products == "int8") == all(m.blocks is None for m in quantized_modules(model)
                                       if isinstance(m, QuantizedLinear))
    expected = sum(t.numel() * t.element_size() for t in held.values()) \
        + sum(p.numel() * p.element_size() for p in model.parameters())
    assert rl.weight_bytes(model) == expected


def test_bandwidth_is_bytes_over_the_median_time():
    bandwidth, times = rl.streaming_bandwidth(SMALL_STREAM, "cpu", warmups=1, repeats=3)
    assert len(times) == 3 and all(t > 0 for t in times)
    assert bandwidth == pytest.approx(SMALL_STREAM / float(np.median(times)))


def test_roofline_is_bytes_over_bandwidth():
    assert rl.roofline_seconds(540_000_000, 20e9) == pytest.approx(0.027)


def test_linear_macs_are_every_linear_layers_weights(llama):
    cfg = llama.config
    hidden, inner, heads, kv = cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads
    kv_width = kv * hidden // heads
    per_layer = 2 * hidden * hidden + 2 * hidden * kv_width + 3 * hidden * inner  # q o, k v, gate up down
    assert cr.linear_macs(llama) == cfg.num_hidden_layers * per_layer + cfg.vocab_size * hidden  # + the output head


def test_the_roof_is_the_larger_limit_and_the_ridge_joins_them():
    macs, roofline, flops = 134_479_872, 10.4e-3, 421e9  # the module's worked example
    assert cr.compute_seconds(macs, 32, flops) == pytest.approx(20.44e-3, rel=1e-3)
    assert cr.roof_seconds(roofline, macs, 32, flops) == pytest.approx(cr.compute_seconds(macs, 32, flops))
    assert cr.roof_seconds(roofline, macs, 1, flops) == roofline  # one row: the weights' bytes bound it
    ridge = cr.ridge_rows(roofline, macs, flops)
    assert ridge == pytest.approx(16.28, abs=0.01)
    assert cr.compute_seconds(macs, ridge, flops) == pytest.approx(roofline)  # where the two limits meet


def test_compute_throughput_times_each_route_that_runs_its_own_way(llama, time_one):
    routes = candidate_routes(1, True, onednn=False)  # torch x1, kernel x1, mm x1 (the suite runs on one thread)
    chosen = rl.peak_routes(routes, 16, 1)
    assert list(chosen) == ["torch x1", "kernel x1", "mm x1"]
    rates = cr.compute_throughput(llama, time_one.target.linears, chosen, rows=16, repeats=2)
    assert set(rates) == set(chosen) and all(r > 0 for r in rates.values())
    assert list(rl.peak_routes(routes, fewrows.FEW_ROWS_MAX + 1, 1)) == ["torch x1"]  # past the routed rows every
    # route is torch's: timed once
    assert list(rl.peak_routes(candidate_routes(2, True), 4, 1)) == ["torch x1", "kernel x1", "mm x1"]  # a route on
    # other threads than torch's is no candidate
    assert list(rl.peak_routes([None], 4, 1)) == ["as set"]  # off the CPU: torch as set
    assert cr.compute_throughput(torch.nn.Sequential(torch.nn.ReLU()), None, {"as set": None}) == {}  # no linears


# ------------------------------------------------------------------ routes and step costs


def test_routes_that_run_as_another_are_left_out():
    routes = candidate_routes(2, True)  # torch, kernel, mm on 2 threads and on 1
    labels = lambda q: [r.label for r in rl.own_routes(routes, q, 2)]  # noqa: E731
    assert labels(1) == labels(4) == labels(16) == labels(64) == [r.label for r in routes]  # W @ x^T: 1..64 rows
    from lookahead.model.fewrows import FEW_ROWS_MAX, KERNEL_ROWS_MAX
    from lookahead.native.build import tiled_width
    # past numba's 64 rows the kernel route runs as torch's, unless the tiled kernel takes them (to 256)
    assert labels(KERNEL_ROWS_MAX + 1) == (["torch x2", "kernel x2", "torch x1", "kernel x1"] if tiled_width()
                                           else ["torch x2", "torch x1"])  # (and W @ x^T stops at 64 rows)
    assert labels(FEW_ROWS_MAX + 1) == ["torch x2"]  # past the few-row limit every route is torch as set
    assert rl.runs_as(Route(1, "mm"), 65, 2) == Route(1, "torch")
    assert rl.own_routes([None], 3, 2) == [None]


def test_step_seconds_interleave_and_take_medians():
    routes = candidate_routes(2, False)  # torch and W @ x^T, on 2 threads and on 1
    calls = []
    factor = {"torch": 1.0, "kernel": 1.1, "mm": 0.9}

    def fake(q, route):
        calls.append((q, route.label))
        return q * factor[route.linear] * (2.0 if route.threads == 1 else 1.0)

    seconds = rl.step_seconds(fake, (4, 65), routes, 3, 2)
    assert list(seconds) == [r.label for r in routes]
    assert seconds["mm x2"] == [pytest.approx(3.6), None]  # W @ x^T runs 1..64 rows only
    assert seconds["torch x1"] == [pytest.approx(8.0), pytest.approx(130.0)]
    assert len(calls) == (4 + 2) * (1 + 3)  # a warm-up and 3 passes over every applicable (rows, route)
    timed = calls[6:]
    assert [q for q, _ in timed[:6]] == [4] * 4 + [65] * 2 and timed[6][0] == 65  # ascending, then descending
    assert timed[0][1] == "torch x2" and timed[8][1] == "mm x2"  # the routes' order turns each pass
    assert rl.best_routes(seconds) == [("mm x2", pytest.approx(3.6)), ("torch x2", pytest.approx(65.0))]


def test_a_hopeless_route_is_timed_no_further_at_that_row_count():
    routes = [Route(2, "torch"), Route(1, "torch")]
    calls = []

    def fake(q, route):
        calls.append((q, route.label))
        return 1.0 if route.threads == 1 or q == 2 else 10.0  # 2 threads: hopeless at 1 row, fine at 2

    seconds = rl.step_seconds(fake, (1, 2), routes, 4, 2)
    assert seconds == {"torch x2": [10.0, 1.0], "torch x1": [1.0, 1.0]}
    assert calls.count((1, "torch x2")) == 1 + 1 and calls.count((2, "torch x2")) == 1 + 4  # warm-up + passes


# ------------------------------------------------------------------ a step's breakdown


@pytest.mark.parametrize("name, ancestors, part", [
    ("aten::addmm", ("aten::linear",), "linears"),
    ("aten::t", ("aten::linear",), "linears"),
    ("aten::mm", (), "linears"),
    ("mkldnn::_linear_pointwise", (), "linears"),  # the onednn route's op (no aten op)
    ("lookahead_native::linear", (), "linears"),  # the C++ op a traced step's kernel route runs
    ("aten::empty", ("lookahead_native::linear",), "linears"),
    ("lookahead_native::attend", (), "attention"),  # lookahead's attention op (native/fused.cpp) ...
    ("aten::_scaled_dot_product_flash_attention_for_cpu", ("lookahead_native::attend",), "attention"),  # ... SDPA in it
    ("aten::bmm", ("aten::_scaled_dot_product_attention_math", "aten::scaled_dot_product_attention"), "attention"),
    ("aten::copy_", (rl.KV_RANGE,), "kv cache"),
    ("aten::copy_", ("aten::slice", rl.KV_RANGE), "kv cache"),
    ("aten::copy_", (), "other ops"),
    ("aten::mul", (), "other ops"),
    (rl.KV_RANGE, (), None),
])
def test_ops_are_split_by_their_outermost_telling_name(name, ancestors, part):
    assert rl.op_part(name, ancestors) == part


def test_scaled_parts_add_up_and_keep_proportions():
    parts = dict(zip(rl.PARTS, (4.0, 2.0, 1.0, 2.0, 1.0)))
    scaled = rl.scaled_parts(parts, 0.05)
    assert sum(scaled.values()) == pytest.approx(0.05)
    assert scaled["linears"] == pytest.approx(2 * scaled["attention"])
    assert rl.scaled_parts(dict.fromkeys(rl.PARTS, 0.0), 0.02)["python and dispatch"] == 0.02


@pytest.mark.parametrize("route", [Route(1, "torch"), Route(1, "kernel")])
def test_breakdown_parts_are_non_negative_and_add_up_to_the_step(time_one, route):
    update = cache.SlotLayer.update
    parts, profiled = rl.step_breakdown(time_one, 4, route, 0.123, steps=2)
    assert profiled > 0
    assert tuple(parts) == rl.PARTS
    assert all(value >= 0 for value in parts.values())
    assert sum(parts.values()) == pytest.approx(0.123)
    assert parts["linears"] > 0 and parts["attention"] > 0 and parts["kv cache"] > 0  # the kernel's time counts too
    assert fewrows.rows_linear is linear.rows_linear and cache.SlotLayer.update is update  # put back


def test_the_patches_are_put_back_when_a_step_fails():
    update = cache.SlotLayer.update

    def broken(q, route):
        raise RuntimeError("no step")

    with pytest.raises(RuntimeError):
        rl.step_breakdown(broken, 1, None, 0.01)
    assert fewrows.rows_linear is linear.rows_linear and cache.SlotLayer.update is update


# ------------------------------------------------------------------ host time and everything


def test_host_phases_cover_every_phase(llama):
    from lookahead import LookaheadConfig

    host = rl.host_phases(llama, tiny_tokenizer(), LookaheadConfig(cost_cache_dir=""),
                          rl.prompt_ids(None, 96), max_new_tokens=8)
    assert host["steps"] >= 1 and 1 <= host["new_tokens"] <= 16
    assert tuple(host["phase_s"]) == PHASES and all(v >= 0 for v in host["phase_s"].values())
    assert host["host_s"] >= 0 and host["forward_s"] > 0 and host["step_s"] > 0
    assert host["tokens_per_step"] == pytest.approx(host["new_tokens"] / host["steps"])


def test_prompt_ids_without_a_tokenizer_stay_in_the_vocabulary():
    ids = rl.prompt_ids(None, 50)
    assert len(ids) == 2 and all(0 <= t < 50 for p in ids for t in p) and ids[0] != ids[1]


def test_measure_roofline_holds_every_number_and_its_invariants(llama):
    from lookahead import LookaheadConfig

    result = rl.measure_roofline(llama, None, (2, 1), 8, 1, config=LookaheadConfig(cost_cache_dir=""),
                                 stream_min_bytes=SMALL_STREAM, host_tokens=6, peak_rows=12)
    assert result["roofline_s"] == pytest.approx(result["weight_bytes"] / result["bandwidth_bytes_per_s"])
    assert result["stream_bytes"] == SMALL_STREAM and result["weight_bytes"] < SMALL_STREAM
    assert [s["rows"] for s in result["steps"]] == [1, 2]
    compute = result["compute"]
    for step in result["steps"]:
        assert step["best_s"] == min(v for v in step["seconds"].values() if v is not None)
        assert step["seconds"][step["best_route"]] == step["best_s"]
        assert step["x_roofline"] == pytest.approx(step["best_s"] / result["roofline_s"])
        assert sum(step["breakdown_s"].values()) == pytest.approx(step["best_s"])
        assert all(v >= 0 for v in step["breakdown_s"].values()) and step["profiled_s"] > 0
        trace = step["traced"]  # the best route's step replayed from a trace, timed in the same passes
        assert trace["why"] is None and trace["seconds"] > 0 and trace["eager_s"] > 0
        assert trace["x_roofline"] == pytest.approx(trace["seconds"] / result["roofline_s"])
        assert sum(trace["breakdown_s"].values()) == pytest.approx(trace["seconds"])
        assert all(v >= 0 for v in trace["breakdown_s"].values()) and trace["profiled_s"] > 0
        roof = max(result["roofline_s"], 2 * step["rows"] * compute["macs_per_row"] / compute["peak_flops_per_s"])
        assert step["roof_s"] == pytest.approx(roof) and step["x_roof"] == pytest.approx(step["best_s"] / roof)
        assert trace["x_roof"] == pytest.approx(trace["seconds"] / roof)
        for timed in (step, trace):
            linears = timed["breakdown_s"]["linears"]
            assert timed["linear_flops_per_s"] == (pytest.approx(2 * step["rows"] * compute["macs_per_row"] / linears)
                                                   if linears > 0 else None)
    assert compute["rows"] == 12 and compute["macs_per_row"] == cr.linear_macs(llama)
    assert compute["peak_flops_per_s"] == max(compute["flops_per_s"].values()) > 0
    assert compute["flops_per_s"][compute["best_route"]] == compute["peak_flops_per_s"]
    assert compute["ridge_rows"] == pytest.approx(result["roofline_s"] * compute["peak_flops_per_s"]
                                                  / (2 * compute["macs_per_row"]))
    from lookahead.model.fewrows import onednn_available
    onednn = {"onednn x1"} if onednn_available() else set()  # (torch built with oneDNN: the CPU wheels are)
    assert set(result["routes"]) == {"torch x1", "kernel x1", "mm x1"} | onednn  # the suite runs on one thread
    json.dumps(result)  # every number is plain JSON


def test_measure_roofline_traces_whichever_route_timed_fastest(llama, monkeypatch):
    """On a busy machine any route may time fastest at any row count (medians of a few noisy steps);
    forced here: oneDNN's (never traced) at one row, then mm's at two, whose check of a trace made at
    one row refuses it to the bit. Every row count's step is still timed replayed from a trace: mm's
    from one made at its own step, the one-row step through the fastest route a trace replays."""
    from lookahead import LookaheadConfig
    from lookahead.model.fewrows import onednn_available

    measured = rl.step_seconds
    fastest = ["onednn x1" if onednn_available() else "torch x1", "mm x1"]  # per row count, ascending

    def rigged(*args, **kwargs) -> dict:
        seconds = measured(*args, **kwargs)
        for s, label in enumerate(fastest):
            seconds[label][s] = min(v[s] for v in seconds.values() if v[s] is not None) / 2
        return seconds

    monkeypatch.setattr(rl, "step_seconds", rigged)
    result = rl.measure_roofline(llama, None, (1, 2), 8, 1, config=LookaheadConfig(cost_cache_dir=""),
                                 stream_min_bytes=SMALL_STREAM, host_tokens=4, peak_rows=4)
    assert [s["best_route"] for s in result["steps"]] == fastest
    traces = [s["traced"] for s in result["steps"]]
    assert [t["why"] for t in traces] == [None, None], traces
    assert traces[0]["route"] != "onednn x1" and traces[1]["route"] == "mm x1"
    assert all(t["seconds"] > 0 and t["profiled_s"] > 0 for t in traces)
    assert any(line.startswith("| 2 | mm x1 | ") for line in rl.traced_lines(result["steps"]))


def test_measure_roofline_without_traces_times_none(llama):
    from lookahead import LookaheadConfig

    result = rl.measure_roofline(llama, None, (1,), 8, 1, config=LookaheadConfig(cost_cache_dir=""),
                                 stream_min_bytes=SMALL_STREAM, host_tokens=4, traced=False)
    assert [s["traced"] for s in result["steps"]] == [None]
    assert "traced ms" not in rl.report_markdown(result | dict(model="m", dtype="float32", cpu="c", torch="t",
                                                               transformers="x"))


# ------------------------------------------------------------------ the traced forward


def test_a_traced_timer_replays_its_steps_through_the_route_given(llama):
    time_traced = decode_step_timer(llama, check_model(llama, False), 16, switches=ForwardSwitches(traced=True))
    for q in (1, 3):
        for _ in range(2):  # the first step of a kind makes and checks its trace
            assert time_traced(q, Route(1, "kernel")) > 0
        assert time_traced.target.last_route == "kernel x1 traced"
    time_traced(3, Route(1, "torch"))
    assert time_traced.target.last_route == "torch x1 traced"  # one trace, the route told at run time
    assert time_traced.target.traced.failures == {}


class _Untraceable:
    """A traced timer whose target never managed a trace: its steps run eagerly."""

    def __init__(self):
        self.calls = 0
        failures = {"key": "RuntimeError: cannot trace this"}
        self.target = type("T", (), dict(last_route="kernel x1", traced=type("F", (), dict(failures=failures))))

    def __call__(self, q, route):
        self.calls += 1
        return 0.5


def test_traced_steps_pair_the_passes_and_say_why_no_trace_served():
    eager_calls = []

    def time_eager(q, route):
        eager_calls.append(q)
        return 0.01 * q

    untraceable = _Untraceable()
    steps, timers = rl.traced_steps(time_eager, lambda: untraceable, (1, 2), [Route(1, "kernel")] * 2, 3)
    assert timers == [untraceable, untraceable]  # one timer per row count, as the factory makes them
    assert [s["seconds"] for s in steps] == [None, None]
    assert [s["eager_s"] for s in steps] == [pytest.approx(0.01), pytest.approx(0.02)]
    assert all(s["why"] == "RuntimeError: cannot trace this" for s in steps)
    assert untraceable.calls == 4 and eager_calls == [1, 2] * 3  # warm-ups only: an eager step is not timed twice
    text = "\n".join(rl.traced_lines([dict(rows=1, best_route="kernel x1", traced=steps[0])]))
    assert "| 1 | kernel x1 | 10.0 | - |" in text and "No trace served: 1 rows: RuntimeError" in text


def test_traced_steps_time_both_in_every_pass(llama):
    layout = check_model(llama, False)
    time_eager = decode_step_timer(llama, layout, 16)
    steps, timers = rl.traced_steps(time_eager, lambda: decode_step_timer(llama, layout, 16, switches=ForwardSwitches(traced=True)), (1, 4),
                                    [Route(1, "kernel")] * 2, 2)
    assert all(s["why"] is None and s["seconds"] > 0 and s["eager_s"] > 0 for s in steps)
    assert [s["route"] for s in steps] == ["kernel x1", "kernel x1"]
    assert len({id(t) for t in timers}) == 2  # each row count's trace made at its own step
    assert all(t.target.last_route == "kernel x1 traced" for t in timers)


@pytest.mark.parametrize("args, words", [
    (dict(rows=(0,)), "rows, context, repeats and peak rows must be >= 1"),
    (dict(context=0), "rows, context, repeats and peak rows must be >= 1"),
    (dict(peak_rows=0), "rows, context, repeats and peak rows must be >= 1"),
    (dict(context=1020, rows=(8,)), "passes the model's context of 1024 positions"),
])
def test_measure_roofline_refuses_bad_arguments(llama, args, words):
    arguments = dict(rows=(1,), context=8, repeats=1) | args
    with pytest.raises(ValueError, match=words.replace("'", ".")):
        rl.measure_roofline(llama, None, arguments["rows"], arguments["context"], arguments["repeats"],
                            peak_rows=arguments.get("peak_rows", 4))


# ------------------------------------------------------------------ the command


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir(tmp_path_factory.mktemp("tiny-llama-roofline"), tiny_model("llama"))


def test_the_command_writes_the_report(model_dir, tmp_path):
    out = tmp_path / "report"
    result = CliRunner().invoke(main, ["roofline", "--model", model_dir, "--rows", "1", "--rows", "3",
                                       "--context", "16", "--repeats", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert {p.name for p in out.iterdir()} == {"roofline.json", "roofline.md", "roofline.png"}
    data = json.loads((out / "roofline.json").read_text())
    assert data["model"] == model_dir and data["dtype"] == "float32" and data["threads"] == 1
    assert data["stream_bytes"] >= rl.STREAM_MIN_BYTES
    assert [s["rows"] for s in data["steps"]] == [1, 3]
    text = (out / "roofline.md").read_text()
    assert text.startswith("# Roofline") and "- CPU: " in text and "GB/s" in text
    assert "| rows | best route | ms | x roofline | linears | attention | kv cache | other ops |" in text
    assert "| python+dispatch | x roof | linears GFLOP/s |" in text
    assert f"- compute roof: {data['compute']['peak_flops_per_s'] / 1e9:.0f} GFLOP/s (the linears over 256 rows" in text
    assert f"- ridge: {data['compute']['ridge_rows']:.1f} rows" in text
    assert "| propose |" in text and "| learn |" in text
    assert "| rows | route | eager ms | traced ms | traced / eager | x roofline |" in text
    assert all(s["traced"]["seconds"] > 0 for s in data["steps"])
    assert text.strip() in result.stdout
    assert (out / "roofline.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("args, words", [
    (["--rows", "0"], "--rows must be >= 1, got 0"),
    (["--rows", "2", "--rows", "-1"], "--rows must be >= 1, got -1"),
    (["--context", "0"], "--context must be >= 1, got 0"),
    (["--repeats", "0"], "--repeats must be >= 1, got 0"),
    (["--peak-rows", "0"], "--peak-rows must be >= 1, got 0"),
    (["--model", "/no/such/dir"], "cannot load model '/no/such/dir'"),
])
def test_bad_options_get_one_line_and_status_2(tmp_path, args, words):
    result = CliRunner().invoke(main, ["roofline", "--out", str(tmp_path / "o"), *args])
    assert result.exit_code == 2, result.output
    assert words in result.stderr and "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("Loading weights")]
    assert len(lines) == 1, result.stderr


def test_a_context_past_the_model_gets_one_line(model_dir, tmp_path):
    result = CliRunner().invoke(main, ["roofline", "--model", model_dir, "--context", "1020", "--rows", "8",
                                       "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert "passes the model's context of 1024 positions: pass a smaller --context or --rows" in result.stderr


def test_quiet_stderr_hides_only_what_is_written_inside(capfd):
    import os

    with rl.quiet_stderr():
        os.write(2, b"profiler_start\n")
    os.write(2, b"shown\n")
    assert capfd.readouterr().err == "shown\n"
