"""lookahead's proposer inside vLLM: ``speculative_config={"method": "custom_class", "model":
"lookahead.vllm.LookaheadProposer", "num_speculative_tokens": k}`` (proposer.py; settings.py for
``additional_config={"lookahead": {...}}``). Nothing here imports vLLM."""

from .proposer import LookaheadProposer

__all__ = ["LookaheadProposer"]
