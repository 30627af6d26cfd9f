"""Where a server's configuration defaults differ from ``LookaheadConfig``'s (``lookahead serve``'s options).

A server takes no batched step that a request is expected to decode slower in than without speculation
(fair_share 1: where a batched tree was allowed to slow a request, its p99 time per output token with four
clients was worse than the plain loop's; `lookahead bench-serve` measures both). (It traces each step kind on
sight whatever the defaults: Target.long_lived.)
Imports nothing: the command line reads it before torch is loaded.
"""

SERVE_DEFAULTS = {"fair_share": 1.0}
