"""ALL token choice: which tree tokens the target accepts, and the token after them.

Rows: of a step's kept logits, the *decision rows* are x (row 0) and every
tree node i (row 1 + i). Verification walks the tree from x: at a row, its
children are tried in node order; the first one marked accepted is taken;
when none is, the row's *fallback* token ends the step (``accept_walk``).

- Greedy: child t is accepted iff t is the argmax at its parent's row; the
  fallback is the argmax (after a full match it is the bonus token).
- Sampling (model-free candidates, no draft distribution): with p the
  target's processed distribution at the parent, children are tried in
  order; child t is accepted with probability p(t) / (1 - mass of the
  siblings tried before it), i.e. p(t) under the residual left by the
  rejected siblings; if none is accepted the next token is drawn from p with
  every child removed (renormalised). Each emitted token then has exactly
  probability p: P(t_j) = prod_{i<j}(1 - a_i) a_j = p(t_j), and any other
  token has (1 - sum_children p) * p(t) / (1 - sum_children p) = p(t). The
  acceptance draws, the residual draw per row and every softmax run on the
  device; the host receives everything in one transfer.

The window's next level (argmax of its last-level rows) and the recycled
top-R successors ride along in the same transfer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from numba import njit

from .kernels.trie import path_tokens, sibling_order
from .processing import Decoding, process_rows
from .tree import TokenTree


@njit(cache=True)
def accept_walk(tokens, parents, accept, fallback):
    """Accepted path and new tokens of one step.

    tokens[M], parents[M]: the tree (-1 = x); accept[M]: whether node i is
    accepted should the walk reach its parent; fallback[1 + M]: the token
    that ends the step at x (index 0) or at node i (index 1 + i). Returns
    (path[k] node indices, new[k + 1] tokens).

    Worked example: tokens [4 5 6 7], parents [-1 0 1 0], accept
    [T F T T], fallback [9 8 1 3 2] -> at x, node 0 (token 4) is accepted;
    among 0's children node 1 is not, node 3 (token 7) is; node 3 has no
    children, its fallback 2 ends the step: path [0 3], new [4 7 2].
    """
    size = tokens.shape[0]
    path = np.empty(size, dtype=np.int64)
    new = np.empty(size + 1, dtype=np.int64)
    cur = -1
    k = 0
    while True:
        child = -1
        for node in range(size):
            if parents[node] == cur and accept[node]:
                child = node
                break
        if child < 0:
            new[k] = fallback[cur + 1]
            break
        path[k] = child
        new[k] = tokens[child]
        k += 1
        cur = child
    return path[:k], new[:k + 1]


def greedy_accept(tokens: np.ndarray, parents: np.ndarray, root_next: int, node_next: np.ndarray):
    """Greedy verification from argmaxes: root_next at x, node_next[M] at the nodes.

    tokens [4 5 6 7], parents [-1 0 1 0], root_next 4, node_next [7 9 1 3]
    -> path [0 3], new [4 7 3].
    """
    best = np.concatenate([[root_next], node_next]).astype(np.int64)  # [1 + M]
    return accept_walk(tokens, parents, tokens == best[parents + 1], best)


@dataclass
class Choice:
    """What one step decided, read back to the host once."""

    path: np.ndarray  # [k] accepted node indices
    new: np.ndarray  # [k + 1] tokens to append: the path's, then the next one
    window_next: np.ndarray  # [W] argmax at the window's last level
    top: np.ndarray | None  # [K, R] top-R next tokens at every kept row (token recycling), or None


@dataclass(frozen=True)
class RowMap:
    """Where the kept logit rows [K] of a step come from: the window's kept rows, then the tree."""

    lead: int  # kept rows before the tree's (the window's; x is kept row 0)
    window: int  # W
    ngram: int  # N

    def window_rows(self) -> slice:
        """Kept rows of the window's last level [W]."""
        return slice(0, self.window) if self.ngram == 2 else slice(1, 1 + self.window)

    def decision_rows(self, nodes: int, device) -> torch.Tensor:
        """Kept rows [1 + M] of x and the tree nodes."""
        return torch.cat([torch.zeros(1, dtype=torch.long), self.lead + torch.arange(nodes)]).to(device)


class Verifier:
    """Chooses tokens from a step's logits under one Decoding (greedy or sampling)."""

    def __init__(self, decoding: Decoding, recycle_width: int | None):
        self.decoding = decoding
        self.recycle_width = recycle_width  # R, or None without token recycling

    def choose(self, logits: torch.Tensor, rows: RowMap, tree: TokenTree, seq: np.ndarray, stop: int) -> Choice:
        """Verify the tree against logits [K, V] (on the device); one host transfer."""
        nodes = tree.size
        parts = [logits[rows.window_rows()].argmax(-1)]  # [W]
        if self.recycle_width is not None:
            parts.append(logits.topk(self.recycle_width, dim=-1).indices.reshape(-1))  # [K * R]
        decide = logits if rows.lead == 1 else logits[rows.decision_rows(nodes, logits.device)]  # [1 + M, V]
        scores = self._processed(decide, tree, seq, stop)  # [1 + M, V]
        if self.decoding.do_sample:
            accept, fallback = sample_decisions(scores, tree, self.decoding.generator)
            parts += [accept.long(), fallback]
        else:
            parts.append(scores.argmax(-1))  # [1 + M]: exactly what greedy decoding picks
        host = torch.cat(parts).cpu().numpy()  # the step's one host sync
        return self._unpack(host, rows, tree, logits.shape[0])

    def _processed(self, scores: torch.Tensor, tree: TokenTree, seq: np.ndarray, stop: int) -> torch.Tensor:
        """The decision rows' scores after the call's logits processors, each with its own prefix."""
        if not self.decoding.processors:
            return scores
        paths = np.zeros((1 + tree.size, max(1, int(tree.depths.max(initial=0)))), dtype=np.int64)  # [1 + M, D]
        if tree.size:
            nodes = path_tokens(tree.tokens, tree.parents, tree.depths)  # [M, D]
            paths[1:, :nodes.shape[1]] = nodes
        depths = np.concatenate([[0], tree.depths])  # [1 + M]
        return process_rows(self.decoding, scores, seq, stop, paths, depths)

    def _unpack(self, host: np.ndarray, rows: RowMap, tree: TokenTree, kept: int) -> Choice:
        """Split the one transfer into window argmax, top-R and the walk's inputs; walk the tree."""
        at = rows.window
        window_next = host[:at]
        top = None
        if self.recycle_width is not None:
            top = host[at:at + kept * self.recycle_width].reshape(kept, self.recycle_width)
            at += kept * self.recycle_width
        if self.decoding.do_sample:
            accept = host[at:at + tree.size].astype(bool)
            fallback = host[at + tree.size:]
        else:
            fallback = host[at:]  # argmax at x and every node
            accept = tree.tokens == fallback[tree.parents + 1]
        path, new = accept_walk(tree.tokens, tree.parents, accept, fallback)
        return Choice(path, new, window_next, top)


def sample_decisions(scores: torch.Tensor, tree: TokenTree, generator: torch.Generator | None):
    """Acceptance draws accept[M] and residual draws fallback[1 + M] from processed scores [1 + M, V].

    Node i (token t, parent row r) is accepted, if the walk reaches r and no
    earlier sibling was, with probability p_r(t) / (1 - p_r(earlier
    siblings)). Row r's fallback is a draw from p_r without r's children.
    """
    probs = torch.softmax(scores.float(), dim=-1)  # [1 + M, V]
    device = probs.device
    size = tree.size
    if size == 0:
        return torch.zeros(0, dtype=torch.bool, device=device), _draw(probs, generator)
    earlier, last = sibling_order(tree.parents)  # [M, M], [M]
    parent_row = torch.from_numpy(tree.parents + 1).to(device)  # [M]
    token = torch.from_numpy(tree.tokens).to(device)  # [M]
    p_tok = probs[parent_row, token]  # [M]
    before = torch.from_numpy(earlier).to(device, probs.dtype) @ p_tok  # [M]: mass of siblings tried first
    left = torch.maximum((1.0 - before).clamp_min(0.0), p_tok)  # [M]: residual mass when node i is tried
    chance = torch.where(p_tok > 0, p_tok / left.clamp_min(1e-30), torch.zeros_like(p_tok))  # [M]
    residual = probs.index_put((parent_row, token), torch.zeros_like(p_tok))  # [1 + M, V]: children removed
    empty = residual.sum(-1) <= 0  # [1 + M]: the children held all of p
    forced = torch.from_numpy(last).to(device) & empty[parent_row]  # the last child must then be taken
    chance = torch.where(forced, torch.ones_like(chance), chance)
    accept = torch.rand(size, generator=generator, device=device) < chance  # [M]
    residual = torch.where(empty[:, None], probs, residual)  # such rows never fall back: any valid row
    return accept, _draw(residual, generator)


def _draw(weights: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row [R] drawn from weights [R, V] (non-negative, rows not all zero)."""
    return torch.multinomial(weights, 1, generator=generator)[:, 0]
