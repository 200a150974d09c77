"""Benchmarks: each result is written down in bench/RESULTS.md next to the command that made it."""
