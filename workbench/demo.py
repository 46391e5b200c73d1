"""`workbench demo` / `make demo`: a headless tour of the metadata engine for every profile and mode.

``workbench demo`` prints :func:`tour_text`, then writes the HTML report (``workbench.cli`` runs both;
this module does not import the report).
"""

from __future__ import annotations

from workbench.sweeps.tour import metadata_tour


def tour_text() -> str:
    """The metadata tour (``workbench.sweeps.tour``) as text: one table per (profile, mode), blank-line
    separated."""
    return "\n\n".join(m.table() for m in metadata_tour())


def run_demo() -> int:
    """Print the tour; returns the exit status (0)."""
    print(tour_text())
    return 0
