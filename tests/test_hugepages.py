"""model/hugepages.py: the model's weights moved, values unchanged, into one huge-page-advised mapping."""

from __future__ import annotations

import mmap

import pytest
import torch

from conftest import tiny_model
from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.model.hugepages import HUGE_PAGE, huge_pages_offered, move_to_huge_pages, on_huge_pages

needs_madvise = pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="this Python cannot advise huge pages")


@pytest.fixture
def offered(tmp_path):
    """A kernel setting that offers transparent huge pages where advised."""
    path = tmp_path / "enabled"
    path.write_text("always [madvise] never\n")
    return path


class Two(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(32, 32, bias=False)  # 4 KB of float32
        self.second = torch.nn.Linear(32, 48, bias=False)  # 6 KB


@needs_madvise
def test_the_docstring_example(offered):
    model = Two()
    before = [p.detach().clone() for p in model.parameters()]
    assert move_to_huge_pages(model, offered)
    first, second = model.first.weight, model.second.weight
    assert first.data_ptr() % HUGE_PAGE == 0 and second.data_ptr() == first.data_ptr() + 4096
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))  # values unchanged
    assert first.untyped_storage().nbytes() == 2 * 1024 * 1024 + 10 * 1024  # one mapping: 2 MB + 10 KB
    assert on_huge_pages(model)
    assert not move_to_huge_pages(model, offered)  # moved once: a second call leaves them
    assert first.data_ptr() % HUGE_PAGE == 0


@needs_madvise
def test_tied_weights_stay_tied_and_the_model_computes_the_same(offered):
    model = tiny_model("llama")
    x = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        expected = model(x).logits
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert move_to_huge_pages(model, offered)
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied
    with torch.no_grad():
        assert torch.equal(model(x).logits, expected)



@needs_madvise
def test_weights_that_share_another_storage_are_moved_and_told_apart(offered):
    """Parameters viewing one buffer of another layout (as a memory-mapped file's would) are not taken for
    moved: the fingerprint stays 4 KB, and the move copies them."""
    model = Two()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])  # one storage, no padding, no alignment
    with torch.no_grad():
        model.first.weight.data = flat[:1024].view(32, 32)
        model.second.weight.data = flat[1024:].view(48, 32)
    assert not on_huge_pages(model)
    assert move_to_huge_pages(model, offered) and on_huge_pages(model)
    assert torch.equal(model.second.weight.reshape(-1), flat[1024:])

def test_nothing_moves_where_the_kernel_offers_no_huge_pages(tmp_path):
    never = tmp_path / "enabled"
    never.write_text("always madvise [never]\n")
    model = Two()
    where = model.first.weight.data_ptr()
    assert not huge_pages_offered(never) and not move_to_huge_pages(model, never)
    assert model.first.weight.data_ptr() == where and not on_huge_pages(model)
    assert not huge_pages_offered(tmp_path / "missing")  # not Linux, or no such setting


@needs_madvise
def test_a_generator_moves_its_models_weights_unless_told_not_to(monkeypatch, offered):
    from lookahead.model import hugepages

    monkeypatch.setattr(hugepages, "SETTING", offered)
    monkeypatch.setattr(hugepages.move_to_huge_pages, "__defaults__", (offered,))
    kept = tiny_model("llama")
    LookaheadGenerator(kept, config=LookaheadConfig(huge_pages=False))
    assert not on_huge_pages(kept)
    moved = tiny_model("llama")
    prompt = torch.tensor([[5, 9, 13, 17, 5, 9, 13]])
    expected = moved.generate(prompt, max_new_tokens=12, do_sample=False)
    gen = LookaheadGenerator(moved)
    assert on_huge_pages(moved)
    assert torch.equal(gen.generate(prompt, max_new_tokens=12), expected)


@needs_madvise
def test_a_gguf_models_weight_buffers_move_with_its_parameters(offered):
    """The blocks a GGUF model's layers hold (here repacked for int8 products, the head's layout shared with the
    embedding) are copied into the mapping too, after the parameters, in the order of the modules, values
    unchanged; a buffer two modules share stays shared; the logits are the same."""
    from gguf import GGMLQuantizationType as Q
    from test_quantized import quantized_model

    from lookahead.model.hugepages import cpu_weight_buffers
    from lookahead.model.products import set_products
    from lookahead.model.quantized import QuantizedEmbedding, QuantizedLinear, quantized_modules

    model = quantized_model("llama", Q.Q4_1)
    set_products(model, "int8")
    attention = model.model.layers[0].self_attn
    key, value = attention.k_proj, attention.v_proj
    assert isinstance(key, QuantizedLinear) and key.packed.shape == value.packed.shape
    key._buffers["packed"] = value.packed  # one buffer in two modules (as a tied head's layout is)
    assert any(isinstance(m, QuantizedEmbedding) for m in quantized_modules(model))
    buffers = cpu_weight_buffers(model)
    before = [b.clone() for b in buffers]
    x = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        expected = model(x).logits
    assert buffers and move_to_huge_pages(model, offered) and on_huge_pages(model)
    moved = cpu_weight_buffers(model)
    storage = next(model.parameters()).untyped_storage().data_ptr()
    assert all(b.untyped_storage().data_ptr() == storage for b in moved)  # one mapping with the parameters
    assert all(torch.equal(a, b) for a, b in zip(moved, before))
    starts = [b.data_ptr() for b in moved]
    assert starts == sorted(starts)  # laid out in the modules' order
    assert key.packed is value.packed and key.packed.untyped_storage().data_ptr() == storage
    assert all(m.stored.data_ptr() in starts for m in quantized_modules(model))
    with torch.no_grad():
        assert torch.equal(model(x).logits, expected)
    assert not move_to_huge_pages(model, offered)  # moved once


@needs_madvise
def test_a_generator_gives_back_what_the_move_let_go_of(monkeypatch, offered):
    """After a move the process's heap is trimmed once (the weights' old copies, freed, go back to the OS); a
    model already moved is not moved again, nor trimmed again."""
    from lookahead import generator as generator_module
    from lookahead.model import hugepages

    monkeypatch.setattr(hugepages.move_to_huge_pages, "__defaults__", (offered,))
    trims = []
    monkeypatch.setattr(generator_module, "give_back_freed_memory", lambda: trims.append(1) or True)
    model = tiny_model("llama")
    LookaheadGenerator(model)
    assert on_huge_pages(model) and trims == [1]
    LookaheadGenerator(model)
    assert trims == [1]
