"""Benchmark scripts (``make bench``): they print figures; they are not tests."""
