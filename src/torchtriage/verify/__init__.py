"""Verify: A/B trials, statistics, loss parity, trace comparison and the run store."""
