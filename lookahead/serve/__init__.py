"""lookahead serve: an OpenAI-compatible server over one continuous-batching decode loop (engine.py)."""
