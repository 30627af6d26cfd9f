"""When a batch stops proposing for a while: the host work of proposing saved on steps the budget takes plain.

With several sequences in a batch (a server's clients on open chat) every step ranks every sequence's
candidates (1. propose) before the budget prices them, and where rows are dear the budget takes plain
steps almost always: the proposing is then host work each step pays for nothing. ``ProposalPause``
watches the budget's decisions for the batch. After RUN plain decisions in a row it skips proposing for
``pause`` steps (plain steps, which give the tokens any plain step gives), and each time the budget,
asked again after a pause, still takes a plain step, the next pause is twice as long (up to LONGEST);
a speculative decision (a tree or a window column) brings it back to SHORTEST and the count to zero. A
step of one sequence always proposes: there a plain decision costs one sequence's ranking, and
speculation is what a lone request gains from. A paused step does none of the rest of speculation's host
work either: its new tokens reach the sources at the next proposal (``Planner.observe``), and its time does
not refine the cost curve.

Worked example (RUN 8, SHORTEST 4, LONGEST 64), a batch whose budget always takes plain steps: steps
1-8 propose, 9-12 do not (pause 4), 13 proposes, 14-21 do not (8), 22 proposes, 23-38 do not (16), ...
then one step in 65 proposes. Were step 13's decision a tree instead, steps 14-21 would propose, and a
pause would come only after 8 more plain decisions, 4 steps long.
"""

from __future__ import annotations

RUN = 8  # plain decisions in a row before a pause
SHORTEST = 4  # steps of the first pause
LONGEST = 64  # steps a pause grows to at most


class ProposalPause:
    """Whether a batch's step proposes, from the budget's recent decisions (see the module)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.plain_run = 0  # plain decisions in a row since the last speculative one
        self.pause = SHORTEST  # steps the next pause lasts
        self.left = 0  # steps of the current pause still to come

    def proposing(self, sequences: int) -> bool:
        """Whether a step of ``sequences`` sequences proposes; a step that does not uses up one of the pause."""
        if not self.enabled or sequences < 2:
            self.left = 0
            return True
        if self.left > 0:
            self.left -= 1
            return False
        return True

    def decided(self, sequences: int, speculative: bool) -> None:
        """The budget shaped a proposing step of ``sequences`` sequences: speculative (a tree or window columns)
        or plain."""
        if not self.enabled or sequences < 2 or speculative:
            self.plain_run, self.pause = 0, SHORTEST
            return
        self.plain_run += 1
        if self.plain_run >= RUN:
            self.left = self.pause
            self.pause = min(2 * self.pause, LONGEST)
            self.plain_run = RUN - 1  # (after the pause one more plain decision starts the next, longer one)
