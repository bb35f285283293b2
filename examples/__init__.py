"""Runnable examples of `towers`; each is an absl app whose logic a test imports."""
