"""The planner's chain mode (``Planner.chain``): what an engine that verifies chains (vLLM) is offered,
the best path of the scored trie.

lookahead's own loop verifies a token tree; vLLM verifies one chain of up to k draft tokens per
request and charges each a row. So of the trie every source's candidates merge into
(core/tree.py), the chain proposed is its best path: from x, the child whose path probability
(the chance every token up to it is accepted) is highest, then that node's best child, and so on,
stopping at ``k`` tokens or where the path probability falls below ``least`` (a token that likely
would not be accepted costs a row and gains nothing).

Worked example: parents [-1 -1 0 2], prob [.9 .3 .6 .2], k 3, least .25 -> nodes [0 2]
(node 1 loses to node 0 at depth 1; node 3's .2 is below .25).
"""

from __future__ import annotations

import numpy as np


def best_chain(parents: np.ndarray, prob: np.ndarray, k: int, least: float) -> np.ndarray:
    """[L] the trie nodes of the best path (L <= k), depth 1 first; see the module docstring.

    parents [M] (-1: a child of x, parents before children), prob [M] path probabilities.
    """
    chain: list[int] = []
    parent = -1
    while len(chain) < k:
        children = np.flatnonzero(parents == parent)  # [c]
        if children.shape[0] == 0:
            break
        best = int(children[np.argmax(prob[children])])
        if prob[best] < least:
            break
        chain.append(best)
        parent = best
    return np.array(chain, dtype=np.int64)
