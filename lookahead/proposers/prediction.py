"""Predicted Outputs: a request's predicted output (OpenAI's ``prediction``) as a candidate source.

The prediction is never fed through the model as text: it only proposes, from the place in it
where the output currently stands, the tokens that follow there; the model verifies them like
any other candidates, so the output is what it would have been without a prediction.

Where the output stands in the prediction (``Alignment``): from the prediction's first token at
the output's first, one position on for every output token that equals the prediction's next.
At a token that does not, the alignment is found again (``realign``): the longest suffix of the
text so far (up to ``MATCH_MAX`` tokens) that occurs in the prediction with a token after it,
the occurrence nearest at or after where the alignment was lost (else the nearest before), so
that an edit in the middle of a predicted file costs the tokens of the edit and the prediction
proposes again from the first tokens after it.

Counts, as OpenAI reports them in ``usage.completion_tokens_details``: ``accepted`` is the
prediction's tokens the output matched while aligned (each position once), ``rejected`` the
prediction's tokens that were fed to the model as candidates (in a verified tree) and never
matched by the output.
"""

from __future__ import annotations

import numpy as np

from .base import Candidates, Outcome, Source, StepContext, no_candidates, single_class

MATCH_MAX = 32  # most tokens of the text's suffix matched when realigning (a longer match tells no more)
RUN_EDGES = np.array([2, 3, 5, 9, 17], dtype=np.int64)  # runs of 1, 2, 3-4, 5-8, 9-16, 17+ aligned tokens
# Class 0: the output's start, aligned with the prediction's start; class 1 + b: b = count of edges <= the run
# of tokens the output has matched since it was (re)aligned. A prediction is usually right: high priors,
# lower for an alignment a single token found.
PREDICTION_PRIORS = np.array([0.85, 0.35, 0.5, 0.65, 0.8, 0.88, 0.92])


def realign(predicted: np.ndarray, seq: np.ndarray, stop: int, near: int) -> tuple[int, int]:
    """(the prediction's position that follows seq[:stop], the length of the suffix matched), or (-1, 0)
    where seq's last token occurs nowhere in predicted [P] with a token after it.

    The longest suffix of seq[:stop] (at most MATCH_MAX tokens) that ends inside predicted[:P - 1];
    among its occurrences, the first that ends at or after ``near`` - 1, else the last.
    predicted [5 6 7 5 6 8], seq [.. 9 5 6], near 0 -> (2, 2); seq [.. 7 5 6] -> (5, 3).
    """
    size = predicted.shape[0]
    ends = np.flatnonzero(predicted[:size - 1] == seq[stop - 1])  # [E] positions of the last token
    if ends.shape[0] == 0:
        return -1, 0
    length = 1
    while length < min(MATCH_MAX, stop):
        back = ends[ends >= length]  # occurrences with room for one more token before them
        longer = back[predicted[back - length] == seq[stop - 1 - length]]
        if longer.shape[0] == 0:
            break
        ends, length = longer, length + 1
    after = ends[ends + 1 >= near]
    end = int(after[0]) if after.shape[0] else int(ends[-1])
    return end + 1, length


def chain_nodes(tokens: list[int], parents: list[int], row: list[int]) -> list[int]:
    """The nodes of a tree (tokens, parents [M], parents before children) that spell a prefix of ``row``
    from the root, in depth order: where the row's tokens were fed to the model.

    tokens [4 5 6], parents [-1 0 0], row [4 6 9] -> [0 2]; row [5] -> [].
    """
    nodes: list[int] = []
    parent = -1
    for node, (token, above) in enumerate(zip(tokens, parents)):
        if len(nodes) < len(row) and above == parent and token == row[len(nodes)]:
            nodes.append(node)
            parent = node
    return nodes


class Alignment:
    """Where the output stands in the predicted tokens [P], and which of them it matched or was offered."""

    def __init__(self, predicted: np.ndarray):
        self.predicted = predicted  # [P] int64
        self.tokens = predicted.tolist()  # the same, for the per-token checks (no numpy scalar each)
        self.position = 0  # the prediction's position the next output token is compared with (-1: none)
        self.run = 0  # output tokens matched since the alignment was (re)made (0 at the start)
        self.lost = 0  # where the alignment was last lost (realigning prefers what follows it)
        self.matched = np.zeros(predicted.shape[0], dtype=bool)  # [P] positions the output matched aligned
        self.offered = np.zeros(predicted.shape[0], dtype=bool)  # [P] positions fed to the model as candidates

    def follow(self, seq: np.ndarray, start: int, stop: int) -> None:
        """seq[start:stop] was appended to the output: step on where it matches, realign where it does not."""
        tokens = self.tokens
        for i, token in enumerate(seq[start:stop].tolist(), start):
            at = self.position
            if 0 <= at < len(tokens) and tokens[at] == token:
                self.matched[at] = True
                self.position, self.run = at + 1, self.run + 1
                continue
            if at >= 0:
                self.lost = at
            self.position, self.run = realign(self.predicted, seq, i + 1, self.lost)

    def row(self, length: int) -> np.ndarray:
        """[L] up to ``length`` predicted tokens after the output as it stands (none while unaligned)."""
        if self.position < 0:
            return self.predicted[:0]
        return self.predicted[self.position:self.position + length]

    def label(self) -> int:
        """The class of what ``row`` proposes now (PREDICTION_PRIORS)."""
        if self.run == 0:
            return 0
        return 1 + int(RUN_EDGES.searchsorted(self.run, side="right"))

    def offer(self, start: int, count: int) -> None:
        """predicted[start:start + count] were fed to the model as candidates."""
        self.offered[start:start + count] = True

    @property
    def accepted(self) -> int:
        """Predicted tokens the output matched."""
        return int(self.matched.sum())

    @property
    def rejected(self) -> int:
        """Predicted tokens fed to the model that the output never matched."""
        return int((self.offered & ~self.matched).sum())


class NoPrediction(Source):
    """The prediction's place among the sources for a sequence without one: it proposes nothing. Every
    sequence has the source (one or the other), so its block in the shared estimate table stays put."""

    name = "prediction"
    priors = PREDICTION_PRIORS

    def propose(self, seq: np.ndarray, stop: int, limit: int, estimates: np.ndarray,
                step: StepContext | None = None) -> Candidates:
        return no_candidates()


class PredictionSource(NoPrediction):
    """Proposes the continuation of one sequence's predicted tokens [P] from where the output stands in
    them (one row of up to ``length`` tokens), and counts what the output accepted of them."""

    def __init__(self, predicted: np.ndarray, length: int):
        self.predicted = np.ascontiguousarray(predicted, dtype=np.int64)
        self.length = length
        self.alignment = Alignment(self.predicted)
        self.seen = 0  # the text up to here has been followed
        self.proposed: tuple[int, list[int]] = (0, [])  # (first position, tokens) of the last row proposed

    def begin(self, seq: np.ndarray, stop: int) -> None:
        self.alignment = Alignment(self.predicted)
        self.seen = stop

    def propose(self, seq: np.ndarray, stop: int, limit: int, estimates: np.ndarray,
                step: StepContext | None = None) -> Candidates:
        self.follow(seq, stop)
        length = self.length if step is None else min(self.length, step.tokens_left)
        row = self.alignment.row(length)  # [L]
        if row.shape[0] == 0 or limit <= 0:
            self.proposed = (0, [])
            return no_candidates()
        self.proposed = (self.alignment.position, row.tolist())
        labels = np.array([self.alignment.label()], dtype=np.int64)
        return single_class(row[None], np.array([row.shape[0]], dtype=np.int64), labels)

    def learn(self, outcome: Outcome) -> None:
        """Mark the proposed tokens the verified tree held as offered to the model."""
        start, row = self.proposed
        self.proposed = (0, [])
        if row and outcome.tree.size:
            fed = chain_nodes(outcome.tree.tokens.tolist(), outcome.tree.parents.tolist(), row)
            self.alignment.offer(start, len(fed))

    def observe(self, seq: np.ndarray, start: int, stop: int) -> None:
        self.follow(seq, stop)

    def finish(self, seq: np.ndarray, stop: int) -> None:
        """The last step's tokens (told to no ``observe``) are followed too: the counts are final."""
        self.follow(seq, stop)

    def follow(self, seq: np.ndarray, stop: int) -> None:
        """Follow the output up to seq[:stop] (what was appended since the last look)."""
        if stop > self.seen:
            self.alignment.follow(seq, self.seen, stop)
            self.seen = stop

    @property
    def counts(self) -> tuple[int, int]:
        """(accepted, rejected) predicted tokens so far (final after ``finish``)."""
        return self.alignment.accepted, self.alignment.rejected
