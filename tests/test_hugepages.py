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
