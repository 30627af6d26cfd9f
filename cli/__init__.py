"""The `lookahead` command (installed as lookahead.cli): main.py (generate), bench.py (bench), bench_batch.py
(bench-batch)."""
