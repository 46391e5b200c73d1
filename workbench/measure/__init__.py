"""Timing, cost models and integrity checks."""
