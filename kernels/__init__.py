"""Compute only: the linear-attention ops the workbench captures and times. Knows nothing of `workbench`.

One folder per op, each with a readable torch reference (float64-capable, CPU) beside a Triton kernel.
"""
