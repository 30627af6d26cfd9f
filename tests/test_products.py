"""model/products.py: each block format multiplies in float32 or int8 as measured on this machine, the choice kept
per machine; load_model's products= and --products reach it."""

from __future__ import annotations

import json

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from lookahead.errors import ModelLoadError
from lookahead.model import products as chooser
from lookahead.model.products import choose_products, set_products
from lookahead.model.quantized import QuantizedLinear
from test_quantized import native, quantized_model, random_blocks  # noqa: F401 (the fixture builds the C++ op)


@pytest.fixture
def model(native):  # noqa: F811
    return quantized_model("llama", Q.Q4_K)


def products_of(model) -> set[str]:
    return {m.products for m in model.modules() if isinstance(m, QuantizedLinear)}


def test_set_products_everywhere_or_per_format(model):
    set_products(model, "int8")
    assert products_of(model) == {"int8"}
    set_products(model, {int(Q.Q6_K): "int8"})  # (no Q4_K entry: float32)
    assert products_of(model) == {"float32"}


def test_the_faster_product_is_kept_and_read_back(model, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.ops.lookahead_native, "qint8_vnni", lambda: True, raising=False)
    monkeypatch.setattr(chooser, "time_products", lambda layer: {"float32": 2.0, "int8": 1.0})
    monkeypatch.setattr(chooser, "others_busy", lambda before, after: 0.0)  # (a quiet machine, whatever runs now)
    lines: list[str] = []
    assert choose_products(model, str(tmp_path), say=lines.append) == {int(Q.Q4_K): "int8"}
    assert products_of(model) == {"int8"} and len(lines) == 1 and "Q4_K layers multiply in int8" in lines[0]
    stored = json.loads((tmp_path / chooser.STORE).read_text())
    assert [entry["chosen"] for entry in stored.values()] == ["int8"]

    def never(layer):
        raise AssertionError("measured again although the choice was kept")

    monkeypatch.setattr(chooser, "time_products", never)
    set_products(model, "float32")
    assert choose_products(model, str(tmp_path), say=lines.append) == {int(Q.Q4_K): "int8"}
    assert products_of(model) == {"int8"} and len(lines) == 1


def test_a_choice_timed_on_a_busy_machine_is_not_kept(model, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.ops.lookahead_native, "qint8_vnni", lambda: True, raising=False)
    monkeypatch.setattr(chooser, "time_products", lambda layer: {"float32": 2.0, "int8": 1.0})
    monkeypatch.setattr(chooser, "others_busy", lambda before, after: 1.5)
    lines: list[str] = []
    assert choose_products(model, str(tmp_path), say=lines.append) == {int(Q.Q4_K): "int8"}  # (used this run)
    assert not (tmp_path / chooser.STORE).exists() and "not kept: other processes kept 1.5 cores busy" in lines[0]


def test_int8_must_win_by_the_margin(model, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.ops.lookahead_native, "qint8_vnni", lambda: True, raising=False)
    monkeypatch.setattr(chooser, "time_products", lambda layer: {"float32": 1.0, "int8": 0.97})
    assert choose_products(model, "") == {int(Q.Q4_K): "float32"}  # ("": nothing kept)
    assert not (tmp_path / chooser.STORE).exists()


def test_without_vnni_or_avx2_float32_and_nothing_timed(model, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.ops.lookahead_native, "qint8_vnni", lambda: False, raising=False)
    monkeypatch.setattr(torch.ops.lookahead_native, "qint8_avx2", lambda: False, raising=False)
    monkeypatch.setattr(chooser, "time_products", lambda layer: pytest.fail("timed without VNNI or AVX2"))
    assert choose_products(model, str(tmp_path)) == {int(Q.Q4_K): "float32"}
    assert products_of(model) == {"float32"}


def test_with_avx2_alone_only_formats_that_all_repack_are_timed(model, tmp_path, monkeypatch):
    """AVX2 runs the 16-row layout's integer products, not the row-major ones (plain C++ there): a format with a
    layer that cannot repack keeps float32 untimed; the others are timed as with VNNI."""
    monkeypatch.setattr(torch.ops.lookahead_native, "qint8_vnni", lambda: False, raising=False)
    monkeypatch.setattr(torch.ops.lookahead_native, "qint8_avx2", lambda: True, raising=False)
    monkeypatch.setattr(chooser, "others_busy", lambda before, after: 0.0)
    timed: list[int] = []
    monkeypatch.setattr(chooser, "time_products",
                        lambda layer: timed.append(layer.format_code) or {"float32": 2.0, "int8": 1.0})
    assert chooser.packed_isa() == chooser.AVX2
    blocks = torch.from_numpy(random_blocks(Q.Q6_K, 24, 256, seed=3))  # (24 outputs: no 16-row layout)
    model.odd = QuantizedLinear(blocks, int(Q.Q6_K), 256, 24)
    assert choose_products(model, str(tmp_path)) == {int(Q.Q4_K): "int8", int(Q.Q6_K): "float32"}
    assert timed == [int(Q.Q4_K)] and model.odd.products == "float32"


def test_a_damaged_store_is_measured_again(model, tmp_path, monkeypatch):
    (tmp_path / chooser.STORE).write_text("{not json")
    monkeypatch.setattr(torch.ops.lookahead_native, "qint8_vnni", lambda: True, raising=False)
    monkeypatch.setattr(chooser, "others_busy", lambda before, after: 0.0)
    monkeypatch.setattr(chooser, "time_products", lambda layer: {"float32": 1.0, "int8": 3.0})
    assert choose_products(model, str(tmp_path)) == {int(Q.Q4_K): "float32"}
    assert "float32" in (tmp_path / chooser.STORE).read_text()


def test_time_products_times_both(model):
    layer = next(m for m in model.modules() if isinstance(m, QuantizedLinear))
    seconds = chooser.time_products(layer)
    assert set(seconds) == {"float32", "int8"} and all(s > 0 for s in seconds.values())


def test_load_model_names_a_bad_products_value():
    from lookahead import load_model

    with pytest.raises(ModelLoadError, match="products must be one of auto, float32, int8"):
        load_model("smollm2-135m", products="int4")


def test_the_cli_offers_products():
    from click.testing import CliRunner

    from lookahead.cli.main import main as cli

    for command in ("generate", "bench", "serve", "roofline"):
        out = CliRunner().invoke(cli, [command, "--help"]).output
        assert "--products [auto|float32|int8]" in out, command


def test_a_kept_choice_follows_the_margin_from_its_times(model, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.ops.lookahead_native, "qint8_vnni", lambda: True, raising=False)
    monkeypatch.setattr(chooser, "time_products", lambda layer: pytest.fail("measured again although kept"))
    layer = chooser._largest_per_format(model)[int(Q.Q4_K)]
    key = chooser.choice_key(layer)
    assert key.startswith(f"{chooser.cpu_name()} | {torch.get_num_threads()} threads | Q4_K "
                          f"{layer.out_features}x{layer.in_features} | build ")
    (tmp_path / chooser.STORE).write_text(json.dumps({key: {"float32": 1.0, "int8": 0.9, "chosen": "int8"}}))
    assert choose_products(model, str(tmp_path)) == {int(Q.Q4_K): "float32"}  # (0.9 > INT8_MARGIN)


def test_the_packed_layers_paths_are_measured_kept_and_set(model, tmp_path, monkeypatch):
    from lookahead.model.products import choose_paths

    set_products(model, "int8")
    packed = [m for m in model.modules() if isinstance(m, QuantizedLinear) and m.packed is not None]
    assert packed  # (the tiny Q4_K model's layers repack for int8)
    monkeypatch.setattr(torch.ops.lookahead_native, "qint8_vnni", lambda: False, raising=False)
    monkeypatch.setattr(torch.ops.lookahead_native, "qint8_avx2", lambda: False, raising=False)
    assert choose_paths(model, str(tmp_path)) == {} and {(m.amx_rows, m.prefetch) for m in packed} == {(0, 0)}
    monkeypatch.setattr(torch.ops.lookahead_native, "qint8_avx2", lambda: True, raising=False)  # (AVX2 alone)
    monkeypatch.setattr(torch.ops.lookahead_native, "qint8_amx", lambda: True, raising=False)  # (unused without VNNI)
    monkeypatch.setattr(chooser, "others_busy", lambda before, after: 0.0)
    monkeypatch.setattr(chooser, "time_paths", lambda layers, tiles: {"prefetch": {"0": 2.0, "4096": 1.5}})
    lines: list[str] = []
    assert choose_paths(model, str(tmp_path / "avx2"), say=lines.append) == {int(Q.Q4_K): (0, 4096)}
    assert "Q4_K int8 products run on AVX2, weights asked for 4096 bytes ahead" in lines[0]
    monkeypatch.setattr(torch.ops.lookahead_native, "qint8_vnni", lambda: True, raising=False)
    monkeypatch.setattr(torch.ops.lookahead_native, "qint8_amx", lambda: True, raising=False)
    monkeypatch.setattr(chooser, "others_busy", lambda before, after: 0.0)
    timed = {"prefetch": {"0": 2.0, "4096": 1.5},
             "vnni": {"2": 1.0, "4": 2.0, "8": 4.0, "16": 8.0}, "amx": {"2": 2.0, "4": 1.5, "8": 2.0, "16": 3.0}}
    monkeypatch.setattr(chooser, "time_paths", lambda layers, tiles: timed)
    lines = []
    assert choose_paths(model, str(tmp_path), say=lines.append) == {int(Q.Q4_K): (4, 4096)}
    assert {(m.amx_rows, m.prefetch) for m in packed} == {(4, 4096)}
    assert "Q4_K int8 products run on AMX tiles from 4 rows, weights asked for 4096 bytes ahead" in lines[0]
    monkeypatch.setattr(chooser, "time_paths", lambda layers, tiles: pytest.fail("measured again although kept"))
    for m in packed:
        m.amx_rows = m.prefetch = 0
    assert choose_paths(model, str(tmp_path), say=lines.append) == {int(Q.Q4_K): (4, 4096)} and len(lines) == 1
    assert {(m.amx_rows, m.prefetch) for m in packed} == {(4, 4096)}
    monkeypatch.setattr(torch.ops.lookahead_native, "qint8_amx", lambda: False, raising=False)  # (a CPU without)
    monkeypatch.setattr(chooser, "time_paths", lambda layers, tiles: {"prefetch": {"0": 1.0, "4096": 1.2}})
    assert choose_paths(model, str(tmp_path / "other")) == {int(Q.Q4_K): (0, 0)}
    set_products(model, "float32")  # (nothing packed: nothing to choose)
    assert choose_paths(model, str(tmp_path)) == {}


def test_prefetch_bytes_is_the_fastest_distance():
    assert chooser.prefetch_bytes({"prefetch": {"0": 2.0, "4096": 1.5}}) == 4096  # (the docstring's)
    assert chooser.prefetch_bytes({"prefetch": {"0": 1.0, "4096": 1.0}}) == 0  # (a tie: the hardware alone)
    assert chooser.prefetch_bytes({}) == 0


def test_time_paths_times_every_way(model):
    set_products(model, "int8")
    packed = [m for m in model.modules() if isinstance(m, QuantizedLinear) and m.packed is not None]
    if not chooser.packed_isa():
        pytest.skip("this CPU has neither AVX-512 VNNI nor AVX2: the packed products run in plain C++")
    tiles = bool(torch.ops.lookahead_native.qint8_amx())
    times = chooser.time_paths(packed, tiles)
    assert set(times["prefetch"]) == {str(ahead) for ahead in chooser.PREFETCH}
    if tiles:
        assert all(set(times[name]) == {str(r) for r in chooser.AMX_ROWS} for name in ("vnni", "amx"))
    assert all(s > 0 for t in times.values() for s in t.values())
