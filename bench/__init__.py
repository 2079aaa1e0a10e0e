"""Benchmarks that print JSON; installed as `cadence.bench` so `cadence bench` runs them."""
