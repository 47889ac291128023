"""Benchmarks of megatron-rl (``make bench``: ``python -m benchmarks.run_all``) and, in
``benchmarks.studies``, the finished studies with their stored results. Every script runs as a
module from the repository root (``python -m benchmarks.<name>``) and shares ``harness``."""
