"""Small HTML views (plain strings) the widgets show: a record's own table, any list of records, errors.

Tables come from :func:`workbench.html.table` and a metadata record renders itself (``Metadata._repr_html_``),
so a widget shows what a notebook cell ending in the same object shows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from workbench import html
from workbench.metadata import Metadata


def records_html(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None, *, row_kinds: Sequence[str] | None = None
) -> str:
    """A table of ``rows`` (dicts; ``columns`` default to the first row's keys); ``row_kinds`` as in
    :func:`workbench.html.table`. A key a row lacks shows as an empty cell."""
    if not rows:
        return html.note("(no rows)")
    cols = list(columns or rows[0].keys())
    return html.table(cols, [[r.get(c, "") for c in cols] for r in rows], row_kinds=row_kinds)


def metadata_html(meta: Metadata) -> str:
    """The record's own rendering (padded rows grey, the kernel's fate of each row, processed padding in
    vermillion): one view of a ``Metadata`` everywhere."""
    return meta._repr_html_()


def error_html(message: str | None) -> str:
    """An error in words (vermillion), or nothing."""
    if not message:
        return ""
    return f"<span style='color:{html.FAIL}'>&#9888; {html.escape(message)}</span>"


def ok_html(message: str) -> str:
    """A success in words (green)."""
    return f"<span style='color:{html.OK}'>&#10004; {html.escape(message)}</span>"
