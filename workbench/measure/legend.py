"""What every `workbench bench` table shares: the noisy-median flag and the legend under the table.

A median whose IQR is over ``NOISY_IQR`` of it (the report's threshold, one home in ``measure.timing``) is
printed with a ``!`` after it, and a ratio built on one such median too: at that n it is no measured
difference. Each table ends with one ``legend:`` line per column a reader could not guess.

    >>> from workbench.measure.timing import TimingRecord
    >>> mark(TimingRecord("x", "cpu", {}, "ref", "eager", 100.0, 60.0, 9, 1))
    '!'
"""

from __future__ import annotations

from collections.abc import Sequence

from workbench.measure.timing import NOISY_IQR, TimingRecord, is_noisy

FLAG = "!"


def mark(*recs: TimingRecord | None) -> str:
    """``FLAG`` when any of ``recs`` is noisy, else a space (so columns stay aligned)."""
    return FLAG if any(r is not None and is_noisy(r) for r in recs) else " "


def noisy_line() -> str:
    """The legend line of the flag."""
    return (
        f"{FLAG} after a median or ratio: its IQR (or an IQR it is built on) is over {NOISY_IQR:.0%} of the "
        "median: noise at this n, not a measured difference"
    )


def print_legend(lines: Sequence[str]) -> None:
    """``legend: <line>`` for each column explained, then the noisy flag's line."""
    for line in (*lines, noisy_line()):
        print(f"legend: {line}")
