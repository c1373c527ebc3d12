"""Stand-alone timing scripts (run as ``python -m benchmarks.NAME``)."""
