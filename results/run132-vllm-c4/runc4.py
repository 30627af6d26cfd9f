import sys
sys.path.insert(0, "/tmp/s38")
if __name__ == "__main__":
    import lookahead.benchmarks.vllm_bench as vb
    import os; vb.LOOKAHEAD_CLASS = os.environ.get("CLS", "timedprop.Timed")
    from lookahead.cli.main import main
    sys.exit(main())
