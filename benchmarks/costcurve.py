"""Forward-cost curve for the report: time of one forward over k new tokens, relative to k = 1.

The same decode-shaped measurement the engine's cost model makes
(lookahead.cost.measure_forward_seconds), over a wider k range. On a
memory-bound machine the curve stays near 1 for small k: that slack is what
speculation spends.
"""

from __future__ import annotations

from lookahead.cost import measure_forward_seconds
from lookahead.model.support import attention_layout

KS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def cost_curve(model, context: int = 300, ks=KS, repeats: int = 5, seed: int = 0) -> dict:
    """{"context", "repeats", "k", "seconds" (median per k), "relative" (to k = 1)}."""
    seconds = measure_forward_seconds(model, attention_layout(model.config), tuple(ks), context, repeats, seed)
    base = seconds[0]
    return {"context": context, "repeats": repeats, "k": list(ks), "seconds": seconds,
            "relative": [s / base for s in seconds]}
