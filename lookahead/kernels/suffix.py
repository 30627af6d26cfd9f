"""The suffix store's kernels (proposers/memory.py): earlier requests' tokens in a bounded ring,
indexed so that the longest match of the current suffix, and what followed each of its
occurrences, is found in a bounded number of probes whatever the store holds.

Layout (C = capacity, O = len(ORDERS), S = hash slots, a power of two):
- ``ring`` int32 [C]: the token at absolute position p sits at ring[p % C]; requests are
  separated by SEP; positions before ``state[OLDEST]`` are gone (evicted).
- ``heads`` int64 [O, S]: per order k = ORDERS[o], the latest position p whose k tokens
  ending at p hash to the slot (-1: none).
- ``chain`` int32 [O, C]: at p % C, how far back the previous position of the same slot
  lies (0: none). A walk from heads follows it, most recent first, and checks every
  occurrence's tokens (slots collide).
- ``state`` int64 [2]: HEAD (the next position written), OLDEST.
Host memory: 4 + 4 O bytes per token of capacity, and 8 O per hash slot (S < 2 C): at most
about 76 bytes per token with the six orders.
"""

from __future__ import annotations

import numpy as np
from numba import njit

ORDERS = np.array([1, 2, 4, 8, 16, 32], dtype=np.int64)  # match lengths indexed (the longest found wins)
SEP = -1  # between two requests in the ring: no match or continuation crosses it
HEAD, OLDEST = 0, 1  # indices into state
MAX_WALK = 64  # occurrences of one suffix looked at per step (the most recent ones)
PROB_EDGES = np.array([0.2, 0.5, 0.6, 0.8])  # a continuation token's share of the occurrences that reached its
# parent, cut into buckets: 0.5 up to 0.6 holds a continuation seen once (1 of 1 + 1), 0.6 up to 0.8 one seen 2-3 times


def new_store(capacity: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(ring [C], heads [O, S], chain [O, C], state [2]) of an empty store of ``capacity`` tokens."""
    slots = 1 << max(4, int(capacity - 1).bit_length())  # S >= C, a power of two
    ring = np.full(capacity, SEP, dtype=np.int32)
    heads = np.full((ORDERS.shape[0], slots), -1, dtype=np.int64)
    chain = np.zeros((ORDERS.shape[0], capacity), dtype=np.int32)
    return ring, heads, chain, np.zeros(2, dtype=np.int64)


@njit(cache=True)
def _step_hash(h: np.uint64, token: int):
    """One more token into a running hash (uint64, wrapping)."""
    return (h ^ np.uint64(token + 2)) * np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True)
def store_append(tokens: np.ndarray, ring: np.ndarray, heads: np.ndarray, chain: np.ndarray, state: np.ndarray,
                 orders: np.ndarray) -> None:
    """Append tokens [n] (no SEP among them) at HEAD, indexing every order's k-gram that ends at
    each new position and lies after OLDEST. The caller keeps HEAD + n - OLDEST <= C (evicting
    whole requests first: proposers/memory.py).

    Worked example: C 8, orders [1 2], empty store; append [5 6 5] then [SEP] (store_separate):
    ring [5 6 5 SEP ...]; order 1 slot of 5 heads at position 2, chain[0, 2] = 2 (back to 0);
    order 2 indexes (5 6) at 1 and (6 5) at 2.
    """
    capacity = ring.shape[0]
    mask = np.uint64(heads.shape[1] - 1)
    longest = orders[orders.shape[0] - 1]
    for i in range(tokens.shape[0]):
        p = state[0]
        ring[p % capacity] = tokens[i]
        h = np.uint64(0)
        o = 0
        for j in range(longest):
            q = p - j
            if q < state[1] or ring[q % capacity] == SEP:
                break
            h = _step_hash(h, ring[q % capacity])
            if j + 1 == orders[o]:
                slot = np.int64(h & mask)
                prev = heads[o, slot]
                chain[o, p % capacity] = p - prev if prev >= state[1] else 0
                heads[o, slot] = p
                o += 1
                if o == orders.shape[0]:
                    break
        state[0] = p + 1


@njit(cache=True)
def store_separate(ring: np.ndarray, state: np.ndarray) -> None:
    """End a request: one SEP at HEAD (never indexed)."""
    ring[state[0] % ring.shape[0]] = SEP
    state[0] += 1


@njit(cache=True)
def _occurrences(seq: np.ndarray, stop: int, ring: np.ndarray, heads: np.ndarray, chain: np.ndarray, state: np.ndarray,
                 orders: np.ndarray):
    """(the longest order o whose k-gram ending at seq[stop-1] occurred with a token after it,
    its occurrences' positions [<= MAX_WALK], most recent first); o = -1 when none did."""
    capacity = ring.shape[0]
    mask = np.uint64(heads.shape[1] - 1)
    found = np.empty(MAX_WALK, dtype=np.int64)
    hashes = np.zeros(orders.shape[0], dtype=np.uint64)
    h = np.uint64(0)
    o = 0
    for j in range(min(stop, orders[orders.shape[0] - 1])):
        h = _step_hash(h, seq[stop - 1 - j])
        if j + 1 == orders[o]:
            hashes[o] = h
            o += 1
            if o == orders.shape[0]:
                break
    for order in range(o - 1, -1, -1):
        k = orders[order]
        p = heads[order, np.int64(hashes[order] & mask)]
        count = 0
        walks = 0
        while p >= state[1] and p >= k - 1 and walks < MAX_WALK:
            walks += 1
            same = p + 1 < state[0] and ring[(p + 1) % capacity] != SEP and p - k + 1 >= state[1]
            for j in range(k):
                if not same:
                    break
                same = ring[(p - j) % capacity] == seq[stop - 1 - j]
            if same:
                found[count] = p
                count += 1
            back = chain[order, p % capacity]
            if back == 0:
                break
            p -= back
        if count:
            return order, found[:count]
    return -1, found[:0]


@njit(cache=True)
def store_lookup(seq: np.ndarray, stop: int, ring: np.ndarray, heads: np.ndarray, chain: np.ndarray, state: np.ndarray,
                 orders: np.ndarray, limit: int, length: int,
                 edges: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Up to ``limit`` continuations of seq[:stop] from the store, most frequent first.

    Returns (tokens [G, L], lens [G], classes [G, L], order): the occurrences of the
    longest indexed suffix (order o: ORDERS[o] tokens) each give the tokens after them
    (at most ``length``, up to their request's end); merged into a trie, every node counts
    the occurrences through it; the rows are the paths to the G leaves of most occurrences.
    A token's class is o * (len(edges) + 1) + the bucket of its node's share of the occurrences
    that reached its parent (all of them at the first token), counted with one more that went
    elsewhere: a continuation seen once gets 1/2. The share is given the parent because the
    budget's estimates are: the chance a token holds once the one before it did.

    Worked example: ring [1 2 3 SEP 1 2 4 SEP 1 2 3 SEP], orders [1 2], seq [9 1 2], limit 2,
    length 2, edges [0.5]: "1 2" occurred 3 times (o = 1), followed by 3, 4, 3 -> rows
    [[3], [4]], lens [1 1], classes [[3], [2]] (3 holds 2 of 3 + 1, 4 holds 1).
    """
    capacity = ring.shape[0]
    buckets = edges.shape[0] + 1
    order, found = _occurrences(seq, stop, ring, heads, chain, state, orders)
    size = found.shape[0]
    top = max(size * length, 1)
    tok = np.empty(top, dtype=np.int64)  # trie nodes: token, parent, hits, first child, next sibling
    parent = np.empty(top, dtype=np.int64)
    hits = np.zeros(top, dtype=np.int64)
    child = np.full(top, -1, dtype=np.int64)
    sibling = np.full(top, -1, dtype=np.int64)
    roots = -1
    nodes = 0
    for i in range(size):
        cur = -1
        for d in range(length):
            q = found[i] + 1 + d
            if q >= state[0] or ring[q % capacity] == SEP:
                break
            t = ring[q % capacity]
            node = roots if cur < 0 else child[cur]
            while node >= 0 and tok[node] != t:
                node = sibling[node]
            if node < 0:
                node = nodes
                nodes += 1
                tok[node], parent[node] = t, cur
                if cur < 0:
                    sibling[node], roots = roots, node
                else:
                    sibling[node], child[cur] = child[cur], node
            hits[node] += 1
            cur = node
    leaves = np.empty(nodes, dtype=np.int64)
    count = 0
    for node in range(nodes):
        if child[node] < 0:
            leaves[count] = node
            count += 1
    keys = np.empty(count, dtype=np.int64)
    for i in range(count):
        keys[i] = -hits[leaves[i]] * (nodes + 1) + leaves[i]  # most hits first, then the earliest made
    chosen = leaves[np.argsort(keys)][:min(limit, count)]
    rows = chosen.shape[0]
    out = np.zeros((rows, length), dtype=np.int64)
    classes = np.zeros((rows, length), dtype=np.int64)
    lens = np.zeros(rows, dtype=np.int64)
    for r in range(rows):
        depth = 0
        node = chosen[r]
        while node >= 0:
            depth += 1
            node = parent[node]
        lens[r] = depth
        node = chosen[r]
        for d in range(depth - 1, -1, -1):
            above = hits[parent[node]] if parent[node] >= 0 else size
            share = hits[node] / (above + 1)  # of the occurrences that reached its parent; once seen is no sure thing
            bucket = 0
            while bucket < edges.shape[0] and share >= edges[bucket]:
                bucket += 1
            out[r, d] = tok[node]
            classes[r, d] = order * buckets + bucket
            node = parent[node]
    return out, lens, classes, order
