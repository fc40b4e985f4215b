"""What the benchmarks share. Nothing here imports a benchmark module."""
