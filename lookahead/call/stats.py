"""Counters and timing of one generate call."""

from __future__ import annotations

from dataclasses import dataclass, field

# The phases of a decode step (decode/loop.py): "forward" and "verify" are the device's work and the
# host sync (forward_seconds: the forward, then the verifier's argmax / top-k / draws over the kept
# rows' logits and the one read-back), the others the host's (host_seconds; a draft model's own
# forwards, when there is one, run inside "propose").
PHASES = ("propose", "plan", "forward", "verify", "commit", "cache", "learn")
DEVICE_PHASES = ("forward", "verify")


@dataclass
class GenerationStats:
    """What one generate call did. ``steps`` counts target forward passes after the prefill."""

    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens whose cache slots came from the prefix store, not a prefill
    new_tokens: int = 0
    steps: int = 0  # decode forward passes of the target (the prefill not counted)
    prefill_s: float = 0.0
    wall_time_s: float = 0.0  # prefill + decode
    rows_per_step: list[int] = field(default_factory=list)  # Q of every decode forward
    sequences_per_step: list[int] = field(default_factory=list)  # A of every decode forward (those still joining not)
    accepted: list[int] = field(default_factory=list)  # tokens committed by every decode forward
    step_seconds: list[float] = field(default_factory=list)  # wall time of every decode step
    draft_forwards: int = 0  # forward passes of the draft model (prefill included), if any
    drafted: int = 0  # tokens the draft model proposed
    memory_s: float = 0.0  # host time the memory across requests spent looking up and storing
    accepted_prediction_tokens: int = 0  # predicted tokens the output matched (proposers/prediction.py)
    rejected_prediction_tokens: int = 0  # predicted tokens fed to the model as candidates and never matched
    routes: list[str] = field(default_factory=list)  # route of each decode forward (model/routing.py; "" as set)
    # Every decode step's wall time split in two: the target's forward with the read-back of what
    # verification needs (device work and the one host sync) and the host's own planning and
    # bookkeeping (all the rest); phase_seconds sums each phase of the loop over the call.
    forward_seconds: list[float] = field(default_factory=list)
    host_seconds: list[float] = field(default_factory=list)
    phase_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    @property
    def accepted_per_step(self) -> float:
        """Mean tokens committed per decode forward pass (1.0 = plain decoding)."""
        return sum(self.accepted) / self.steps if self.steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        """New tokens per second of wall time, prefill included."""
        return self.new_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0
