"""GPU benchmarks (issue 11): bench/gpu/run.sh."""
