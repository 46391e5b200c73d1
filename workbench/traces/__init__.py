"""Serving traces: many scheduler steps through capture and replay, checked across steps, from a file.

:mod:`~workbench.traces.model` (the data), :mod:`~workbench.traces.format` (JSON Lines, versioned, with a
JSON Schema), :mod:`~workbench.traces.simulate` (a seeded scheduler: admission under a token budget,
chunked prefill, decode, speculation, finishing, slot reuse), :mod:`~workbench.traces.replay` (every step
through the graph runner against the float64 reference; the first divergence).
"""

from workbench.traces.model import (
    FORMAT,
    PREFIX_KEYS,
    STEP_MODES,
    VERSION,
    Trace,
    TraceHeader,
    TraceRow,
    TraceStep,
)

__all__ = ["FORMAT", "PREFIX_KEYS", "STEP_MODES", "VERSION", "Trace", "TraceHeader", "TraceRow", "TraceStep"]
