"""Small HTML views (plain strings) the widgets show: the metadata table, any list of records, errors."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from workbench.metadata import Metadata
from workbench.viz.metadata import row_fate
from workbench.viz.palette import LIGHT_GREY, VERMILLION

_FATE_STYLE = {
    "live": "",
    "skipped": f"background:{LIGHT_GREY};color:#444",
    "processed": f"background:{VERMILLION};color:white",
}


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return html.escape(str(v))


def records_html(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None, *, styles=None) -> str:
    """An HTML table of ``rows`` (dicts); ``styles`` optional per-row CSS strings."""
    if not rows:
        return "<i>(no rows)</i>"
    cols = list(columns or rows[0].keys())
    head = "".join(f"<th style='padding:2px 6px;text-align:right'>{html.escape(c)}</th>" for c in cols)
    body = []
    for i, r in enumerate(rows):
        style = (styles[i] if styles else "") or ""
        tds = "".join(f"<td style='padding:1px 6px;text-align:right'>{_cell(r.get(c, ''))}</td>" for c in cols)
        body.append(f"<tr style='{style}'>{tds}</tr>")
    return (
        "<table style='border-collapse:collapse;font-family:monospace;font-size:12px'>"
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def metadata_html(meta: Metadata) -> str:
    """The metadata table as HTML: a header with the batch facts, then one line per batch row; padded rows
    shaded by what the kernel does with them (grey: skipped, vermillion: processed on the dummy slot)."""
    facts = html.escape(meta.facts_line())
    if meta.eager_reason:
        facts += f"<br><i>{html.escape(meta.eager_reason)}</i>"
    rows = meta.rows()
    for r in rows:
        r["kernel"] = row_fate(meta, r["row"])
    cols = ["row", "kind", "kernel", "req_pool_index", "state_index", "seq_len", "qsl_start", "qsl_end", "num_tokens"]
    if meta.num_accepted_tokens is not None:
        cols.append("num_accepted_tokens")
    styles = [_FATE_STYLE[r["kernel"]] for r in rows]
    qsl = html.escape(str(meta.query_start_loc.tolist()))
    return (
        f"<div style='margin:4px 0'>{facts}</div>{records_html(rows, cols, styles=styles)}"
        f"<div style='font-family:monospace;font-size:12px'>query_start_loc = {qsl}</div>"
    )


def error_html(message: str | None) -> str:
    """An error in words (vermillion), or nothing."""
    if not message:
        return ""
    return f"<span style='color:{VERMILLION}'>&#9888; {html.escape(message)}</span>"


def ok_html(message: str) -> str:
    return f"<span style='color:#009E73'>&#10004; {html.escape(message)}</span>"
