"""Memory across requests: the suffix store's kernels, its bounds, its file, and exactness with it full."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import BUILDERS, VOCAB, reference, tiny_model
from lookahead import ConfigError, GenerateInputError, LookaheadConfig, LookaheadGenerator, MemoryFileError
from lookahead.kernels.suffix import (MAX_WALK, ORDERS, PROB_EDGES, new_store, store_append, store_lookup,
                                      store_separate)
from lookahead.proposers.memory import RequestMemory
from lookahead.proposers.memory.proposer import PROMPT_TAIL
from lookahead.proposers.memory import file as memfile
from lookahead.proposers.memory.store import SuffixStore

NO_EOS = [VOCAB + 1000]  # an id that never occurs


def a(*values) -> np.ndarray:
    return np.array(values, dtype=np.int64)


# ---------------------------------------------------------------- kernels
def test_store_append_docstring_example():
    ring, heads, chain, state = new_store(8)
    orders = a(1, 2)
    store_append(a(5, 6, 5), ring, heads, chain, state, orders)
    store_separate(ring, state)
    assert ring[:4].tolist() == [5, 6, 5, -1] and state.tolist() == [4, 0]
    assert chain[0, 2] == 2 and chain[0, 0] == 0  # the second 5 chains back to the first
    assert (heads[1] >= 0).sum() == 2  # (5 6) and (6 5)


def test_store_lookup_docstring_example():
    ring, heads, chain, state = new_store(16)
    orders = a(1, 2)
    for request in ((1, 2, 3), (1, 2, 4), (1, 2, 3)):
        store_append(a(*request), ring, heads, chain, state, orders)
        store_separate(ring, state)
    tokens, lens, classes, order = store_lookup(a(9, 1, 2), 3, ring, heads, chain, state, orders, 2, 2,
                                                np.array([0.5]))
    assert order == 1 and lens.tolist() == [1, 1]
    assert tokens[:, 0].tolist() == [3, 4] and classes[:, 0].tolist() == [3, 2]


def test_a_deeper_token_is_classed_by_its_share_of_the_occurrences_that_reached_its_parent():
    ring, heads, chain, state = new_store(32)
    orders = a(1, 2)
    for request in ((1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 7, 8), (1, 2, 7, 9)):
        store_append(a(*request), ring, heads, chain, state, orders)
        store_separate(ring, state)
    tokens, lens, classes, order = store_lookup(a(1, 2), 2, ring, heads, chain, state, orders, 1, 2,
                                                np.array([0.5]))
    # "1 2" 4 times: 3 followed 2 of them (2 / 5, bucket 0), and 4 both that reached 3 (2 / 3, bucket 1)
    assert order == 1 and tokens.tolist() == [[3, 4]] and classes.tolist() == [[2, 3]]


def test_store_lookup_prefers_the_longest_match_and_stops_at_a_request_end():
    ring, heads, chain, state = new_store(32)
    orders = a(1, 2, 4)
    for request in ((7, 1, 2, 3, 8), (5, 6, 1, 2, 9)):
        store_append(a(*request), ring, heads, chain, state, orders)
        store_separate(ring, state)
    # "5 6 1 2" occurred once (order 4): only what followed it, 9, up to its request's end
    tokens, lens, _, order = store_lookup(a(5, 6, 1, 2), 4, ring, heads, chain, state, orders, 4, 8,
                                          np.array([0.5]))
    assert order == 2 and tokens[:, :1].tolist() == [[9]] and lens.tolist() == [1]
    # "1 2" alone occurred twice: both continuations, each to its request's end
    tokens, lens, _, order = store_lookup(a(4, 1, 2), 3, ring, heads, chain, state, orders, 4, 8, np.array([0.5]))
    assert order == 1 and sorted(map(tuple, (t[:n] for t, n in zip(tokens.tolist(), lens)))) == [(3, 8), (9,)]


def test_store_lookup_of_an_unseen_suffix_is_empty():
    ring, heads, chain, state = new_store(8)
    tokens, lens, classes, order = store_lookup(a(1, 2), 2, ring, heads, chain, state, a(1, 2), 4, 4,
                                                np.array([0.5]))
    assert order == -1 and tokens.shape == (0, 4) and lens.shape == (0,)


# ---------------------------------------------------------------- the store's bounds
def test_the_oldest_requests_are_evicted_first():
    store = SuffixStore(10)
    for request in ((1, 2, 3), (4, 5), (6, 7, 8, 9)):
        store.add(a(*request))
    assert [r.tolist() for r in store.held()] == [[4, 5], [6, 7, 8, 9]]  # 4 + 3 + 5 slots would pass 10
    assert store.tokens == 6 and store.requests == 2
    tokens, lens, _, _ = store.lookup(a(1, 2), 2, 4)  # evicted text is never proposed
    assert lens.shape == (0,)
    tokens, lens, _, _ = store.lookup(a(6, 7), 2, 4)
    assert tokens[0, :lens[0]].tolist() == [8, 9]


def test_a_request_longer_than_the_store_keeps_its_end():
    store = SuffixStore(5)
    store.add(np.arange(1, 11))
    assert [r.tolist() for r in store.held()] == [[7, 8, 9, 10]]


def test_many_requests_keep_the_store_bounded_and_lookups_exact():
    rng = np.random.default_rng(0)
    store = SuffixStore(4096)
    for _ in range(400):
        store.add(rng.integers(0, 50, rng.integers(5, 40)))
    assert store.tokens + store.requests <= 4096
    last = store.held()[-1]
    tokens, lens, _, order = store.lookup(last[:4], 4, 8)
    assert order >= 2  # a 4-token suffix of a held request is found
    assert any(row[:n].tolist() == last[4:4 + n].tolist() for row, n in zip(tokens, lens))


def reference_held(capacity: int, requests: list[list[int]]) -> list[list[int]]:
    """What a store of ``capacity`` keeps of ``requests`` added in order, by the rule alone: each
    request takes its length + 1 (a separator), one longer than the store keeps its last capacity - 1
    tokens, and the oldest requests go until the newest fits."""
    held: list[list[int]] = []
    for request in requests:
        request = request[max(len(request) - (capacity - 1), 0):]
        if not request:
            continue
        while held and sum(len(r) + 1 for r in held) + len(request) + 1 > capacity:
            held.pop(0)
        held.append(request)
    return held


def reference_lookup(held: list[list[int]], seq: list[int], limit: int, length: int):
    """store_lookup's answer by brute force over the held requests: the longest order whose suffix of
    seq occurred with a token after it, every occurrence's continuation (most recent first) merged
    into a trie, the ``limit`` leaves most occurrences reach, and each token's share bucket."""
    for order in range(ORDERS.shape[0] - 1, -1, -1):
        k = int(ORDERS[order])
        if k > len(seq):
            continue
        key = seq[len(seq) - k:]
        found = [r[end + 1:end + 1 + length] for r in reversed(held)
                 for end in range(len(r) - 2, k - 2, -1) if r[end - k + 1:end + 1] == key]
        if found:
            break
    else:
        return [], [], -1
    nodes: list[list[int]] = []  # [token, parent, hits], in the order they were made
    children: dict[tuple[int, int], int] = {}
    for continuation in found:
        cur = -1
        for token in continuation:
            if (cur, token) not in children:
                children[cur, token] = len(nodes)
                nodes.append([token, cur, 0])
            cur = children[cur, token]
            nodes[cur][2] += 1
    parents = {node[1] for node in nodes}
    leaves = sorted((i for i in range(len(nodes)) if i not in parents), key=lambda i: (-nodes[i][2], i))[:limit]
    rows, classes = [], []
    for leaf in leaves:
        path = []
        while leaf >= 0:
            path.append(leaf)
            leaf = nodes[leaf][1]
        path.reverse()
        rows.append([nodes[i][0] for i in path])
        above = [len(found)] + [nodes[i][2] for i in path[:-1]]
        shares = [nodes[i][2] / (up + 1) for i, up in zip(path, above)]
        classes.append([order * (PROB_EDGES.shape[0] + 1) + int(np.searchsorted(PROB_EDGES, x, side="right"))
                        for x in shares])
    return rows, classes, order


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(2, MAX_WALK - 4),
       requests=st.lists(st.lists(st.integers(0, 3), max_size=40), min_size=1, max_size=10),
       query=st.lists(st.integers(0, 3), min_size=1, max_size=40),
       pick=st.integers(0, 10 ** 6), limit=st.integers(1, 6), length=st.integers(1, 6))
def test_store_lookup_equals_a_brute_force_search_of_what_it_holds(capacity, requests, query, pick, limit, length):
    """On a store below MAX_WALK positions (so no walk is cut short), over a 4-token vocabulary (so
    matches are many and deep, and hash slots may collide), through evictions and requests longer than the
    store: what it holds and every look-up are what the rules say, found by brute force."""
    store = SuffixStore(capacity)
    for request in requests:
        store.add(np.array(request, dtype=np.int64))
    held = reference_held(capacity, requests)
    assert [r.tolist() for r in store.held()] == held
    source = held[pick % len(held)] if held else []
    tail = source[:pick // 7 % (len(source) + 1)]  # a query ending in held text (long matches), and a random one
    for seq in (query, query + tail):
        tokens, lens, classes, order = store.lookup(np.array(seq, dtype=np.int64), len(seq), limit, length)
        rows, row_classes, want_order = reference_lookup(held, seq, limit, length)
        assert order == want_order
        assert [t[:n].tolist() for t, n in zip(tokens, lens)] == rows
        assert [c[:n].tolist() for c, n in zip(classes, lens)] == row_classes


def test_a_capacity_below_two_is_refused():
    with pytest.raises(ValueError, match="at least 2"):
        SuffixStore(1)
    with pytest.raises(ConfigError, match="memory_tokens"):
        LookaheadConfig(memory_tokens=-1)
    with pytest.raises(ConfigError, match="memory_tokens"):
        LookaheadConfig(memory_tokens=1)


# ---------------------------------------------------------------- the file
def memory_with(*requests, vocab: int = 100) -> RequestMemory:
    memory = RequestMemory(64, False, "size:100", vocab)
    for request in requests:
        memory.store.add(a(*request))
    return memory


def test_a_saved_memory_loads_back(tmp_path):
    path = tmp_path / "memory.lkm"
    memory_with((1, 2, 3), (4, 5)).save(path)
    other = memory_with((9, 9))
    other.load(path)
    assert [r.tolist() for r in other.store.held()] == [[1, 2, 3], [4, 5]]
    assert os.listdir(tmp_path) == ["memory.lkm"]  # no temporary, no lock file left


@pytest.mark.parametrize("damage, message", [
    (lambda data: data[:-5], "truncated or damaged"),
    (lambda data: data[:-40] + bytes([data[-40] ^ 1]) + data[-39:], "truncated or damaged"),
    (lambda data: b"PK\x03\x04 a zip file" + data, "not a lookahead memory file"),
    (lambda data: data.replace(b'"version": 1', b'"version": 9'), "format 9"),
    (lambda data: data.replace(b"size:100", b"size:101"), "another tokenizer"),
    (lambda data: data[:40], "damaged"),
    (lambda data: data.replace(b'"requests": 1', b'"requests": "1"'), "truncated or damaged"),
])
def test_a_bad_file_is_refused_whole_and_nothing_changes(tmp_path, damage, message):
    path = tmp_path / "memory.lkm"
    memory_with((1, 2, 3)).save(path)
    path.write_bytes(damage(path.read_bytes()))
    memory = memory_with((7, 8))
    with pytest.raises(MemoryFileError, match=message):
        memory.load(path)
    assert [r.tolist() for r in memory.store.held()] == [[7, 8]]


def test_token_ids_outside_the_vocabulary_are_refused(tmp_path):
    path = tmp_path / "memory.lkm"
    memory_with((1, 2, 99)).save(path)
    with pytest.raises(MemoryFileError, match="outside this model's vocabulary of 50"):
        RequestMemory(64, False, "size:100", 50).load(path)


def test_a_missing_file_and_an_unwritable_place_name_the_fix(tmp_path):
    with pytest.raises(MemoryFileError, match="cannot read the memory file"):
        memory_with().load(tmp_path / "absent.lkm")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(MemoryFileError, match="cannot write the memory file .* is a file, not a directory; "
                                              "pass a path in a directory you can write to"):
        memory_with((1,)).save(blocker / "memory.lkm")  # its "directory" is a file


def test_a_failed_save_leaves_the_good_file_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "memory.lkm"
    memory_with((1, 2, 3)).save(path)
    before = path.read_bytes()

    def refuse(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(memfile.os, "replace", refuse)
    with pytest.raises(MemoryFileError, match="No space left on device"):
        memory_with((4, 5)).save(path)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["memory.lkm"]  # no temporary, no lock file


def test_two_processes_saving_to_one_file_never_corrupt_it(tmp_path):
    path = tmp_path / "shared.lkm"
    script = textwrap.dedent(f"""
        import numpy as np, sys
        from lookahead.proposers.memory import file
        mine = int(sys.argv[1])
        for i in range(40):
            file.write({str(path)!r}, [np.full(200 + i, mine, dtype=np.int64)], "size:100")
    """)
    runs = [subprocess.Popen([sys.executable, "-c", script, str(k)]) for k in (3, 4)]
    assert [run.wait(timeout=120) for run in runs] == [0, 0]
    requests = memfile.read(path, "size:100", 100)  # a whole file from one of them
    assert len(requests) == 1 and requests[0].shape[0] == 239 and len(set(requests[0].tolist())) == 1
    assert os.listdir(tmp_path) == ["shared.lkm"]  # the last writer removed the lock file


def test_the_lock_excludes_writers_that_wait_on_a_removed_lock_file(tmp_path):
    """Each holder removes <path>.lock before it lets go; a writer that opened that file while
    waiting must not count its lock as held (it would write beside the next holder). Threads
    here: flock locks of separately opened files exclude each other within one process too."""
    import threading

    path = tmp_path / "m.lkm"
    inside, most, errors = [0], [0], []
    guard = threading.Lock()

    def writer() -> None:
        try:
            for _ in range(60):
                with memfile.locked(path):
                    with guard:
                        inside[0] += 1
                        most[0] = max(most[0], inside[0])
                    os.sched_yield()
                    with guard:
                        inside[0] -= 1
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors and most[0] == 1
    assert os.listdir(tmp_path) == []


def test_a_lock_taken_on_a_removed_lock_file_starts_over(tmp_path, monkeypatch):
    """The race itself, staged: a writer opens <path>.lock, the holder removes it meanwhile;
    the writer's lock on the removed file is not taken as held: it locks the file at the name."""
    path = tmp_path / "m.lkm"
    name = f"{path}.lock"
    opened = []
    real_open = open

    def open_then_lose_it(file, *args, **kwargs):
        handle = real_open(file, *args, **kwargs)
        if file == name and not opened:
            os.unlink(name)  # what the previous holder does before letting go
        opened.append(os.fstat(handle.fileno()).st_ino)
        return handle

    monkeypatch.setattr("builtins.open", open_then_lose_it)
    with memfile.locked(path):
        assert len(opened) == 2 and os.stat(name).st_ino == opened[1]  # started over on the file at the name
    assert not os.path.exists(name)


# ---------------------------------------------------------------- the generator
MEMORY_ONLY = dict(context_match=False, ngram_pool=False, recycle=False)


def prompt(seed: int, length: int = 12) -> torch.Tensor:
    return torch.randint(1, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", sorted(BUILDERS))
def test_greedy_is_exact_with_a_store_full_of_related_and_unrelated_text(arch):
    model = tiny_model(arch)
    gen = LookaheadGenerator(model, config=LookaheadConfig(**MEMORY_ONLY))
    rng = np.random.default_rng(5)
    for _ in range(20):  # unrelated text first
        gen.memory.store.add(rng.integers(1, VOCAB, 60))
    prompts = [prompt(s) for s in (1, 2, 1, 3, 2)]  # requests repeat: the store holds their outputs
    for ids in prompts:
        out = gen.generate(ids, max_new_tokens=40, eos_token_id=NO_EOS)
        assert torch.equal(out, reference(model, ids, 40, eos_token_id=NO_EOS)), arch
    assert gen.last_stats.steps < 40 / 2, "the store never let a repeated request through faster"
    # a stop mid-step (max_new_tokens) and an EOS inside a copied stretch
    ref = reference(model, prompts[0], 40, eos_token_id=NO_EOS)[0, prompts[0].shape[1]:]
    eos = int(ref[17])
    for new, stop in ((1, NO_EOS), (13, NO_EOS), (40, [eos])):
        out = gen.generate(prompts[0], max_new_tokens=new, eos_token_id=stop)
        assert torch.equal(out, reference(model, prompts[0], new, eos_token_id=stop)), (arch, new, stop)


def test_a_repeated_request_is_answered_from_the_store():
    model = tiny_model("llama")
    gen = LookaheadGenerator(model, config=LookaheadConfig(budget="fixed", max_tree_nodes=32, **MEMORY_ONLY))
    ids = prompt(7)
    gen.generate(ids, max_new_tokens=48, eos_token_id=NO_EOS)
    first = gen.last_stats.steps
    assert gen.memory.store.requests == 1
    assert gen.memory.store.tokens == PROMPT_TAIL + 48  # the output, after its prompt's last tokens
    gen.generate(ids, max_new_tokens=48, eos_token_id=NO_EOS)
    # the first step finds no match (the store keeps outputs, not prompts), then 32-token copies: 4 steps
    assert gen.last_stats.steps <= 4 and 4 * gen.last_stats.steps <= first
    assert gen.last_stats.memory_s > 0


def test_memory_lasts_across_custom_generate_calls():
    from lookahead import custom_generate

    model = tiny_model("llama")
    ids = prompt(8)
    kwargs = dict(custom_generate=custom_generate, max_new_tokens=32, do_sample=False, eos_token_id=NO_EOS,
                  lookahead_config=LookaheadConfig(budget="fixed", **MEMORY_ONLY))
    first = model.generate(ids, **kwargs)
    assert torch.equal(model.generate(ids, **kwargs), first)
    gen = custom_generate.generator(model, LookaheadConfig(budget="fixed", **MEMORY_ONLY))
    assert gen.memory.store.requests == 2 and gen.memory.store.tokens == 2 * (PROMPT_TAIL + 32)  # both calls, one store


def test_no_store_when_memory_tokens_is_zero(tmp_path):
    gen = LookaheadGenerator(tiny_model("llama"), config=LookaheadConfig(memory_tokens=0))
    assert gen.memory is None
    gen.generate(prompt(1), max_new_tokens=4, eos_token_id=NO_EOS)
    assert gen.last_stats.memory_s == 0.0
    with pytest.raises(GenerateInputError, match="memory_tokens=0.*memory_tokens=N"):
        gen.save_memory(tmp_path / "m.lkm")


def test_a_generator_saves_and_loads_its_memory(tmp_path):
    model = tiny_model("llama")
    config = LookaheadConfig(budget="fixed", **MEMORY_ONLY)
    first = LookaheadGenerator(model, config=config)
    ids = prompt(9)
    first.generate(ids, max_new_tokens=32, eos_token_id=NO_EOS)
    first.save_memory(tmp_path / "m.lkm")
    second = LookaheadGenerator(model, config=LookaheadConfig(budget="fixed", memory_tokens=4096, **MEMORY_ONLY))
    second.load_memory(tmp_path / "m.lkm")
    second.generate(ids, max_new_tokens=32, eos_token_id=NO_EOS)
    assert second.last_stats.steps <= 3  # no match at x, then one 32-token copy
