"""Benchmarks behind `workbench bench ...`: they print figures and write JSON; they are not tests."""
