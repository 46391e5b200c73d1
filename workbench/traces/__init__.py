"""Serving traces: many scheduler steps through capture and replay, checked across steps, from a file.

:mod:`~workbench.traces.model` (the data), :mod:`~workbench.traces.format` (JSON Lines, versioned, with a
JSON Schema), :mod:`~workbench.traces.simulate` (a seeded scheduler over a :class:`SimConfig`, with the
prefix caches of :mod:`~workbench.traces.strategies`), :mod:`~workbench.traces.replay` (every step through
the graph runner against the float64 reference; the first divergence). The folder's map: ``README.md`` here.
"""

from workbench.traces.model import (
    FORMAT,
    PREFIX_KEYS,
    STEP_MODES,
    VERSION,
    Trace,
    TraceEngine,
    TraceHeader,
    TraceRow,
    TraceStep,
    engine_note,
)

__all__ = [
    "FORMAT",
    "PREFIX_KEYS",
    "STEP_MODES",
    "VERSION",
    "Trace",
    "TraceEngine",
    "TraceHeader",
    "TraceRow",
    "TraceStep",
    "engine_note",
]
