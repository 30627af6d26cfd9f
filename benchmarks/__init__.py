"""The benchmark (installed as lookahead.benchmarks; needs the [bench] extra): data sets, runner,
cost curve, report."""
