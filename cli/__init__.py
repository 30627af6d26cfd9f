"""The `lookahead` command (installed as lookahead.cli): main.py (generate) and bench.py (bench)."""
