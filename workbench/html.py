"""Small HTML tables for the notebook view of result objects (their ``_repr_html_``).

Standard library only, at the bottom layer, so ``metadata``, ``measure`` and ``runner`` can render
themselves without importing ``viz``. Every value is escaped. Rows carry a class (``wb-live``, ``wb-pad``,
``wb-fail``, ``wb-ok``) and an inline style, because notebook front ends drop ``<style>`` blocks of
untrusted outputs but keep inline styles.

>>> print(table(["row", "kind"], [[0, "live"], [1, "pad"]], row_kinds=["live", "pad"]))  # doctest: +ELLIPSIS
<table class="wb-table" ...><thead>...<tr class="wb-pad" style="background-color:#D9D9D9;color:#000">...
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

# The Okabe-Ito colours of ``workbench.viz.palette`` (that module sits above this one; a test keeps the two
# equal): padded rows grey as in the figures, failures vermillion, passes green, live rows blue.
LIVE = "#0072B2"  # palette.BLUE
PAD = "#D9D9D9"  # palette.LIGHT_GREY
FAIL = "#D55E00"  # palette.VERMILLION
OK = "#009E73"  # palette.GREEN
FAIL_TINT = "#F7DCCA"  # VERMILLION at about 25 % on white: a whole row stays readable

KINDS = ("live", "pad", "fail", "ok")
_ROW_STYLE = {
    "live": "",
    "pad": f"background-color:{PAD};color:#000",
    "fail": f"background-color:{FAIL_TINT};color:#000;border-left:4px solid {FAIL}",
    "ok": "",
}
_TABLE_STYLE = "border-collapse:collapse;font-family:monospace;font-size:12px;margin:2px 0"
_CELL_STYLE = "padding:1px 8px;text-align:right;border-bottom:1px solid #ddd"


def escape(value: object) -> str:
    """``str(value)`` with ``& < > " '`` escaped; floats to 3 significant digits, bools yes/no."""
    if isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, float):
        text = f"{value:.3g}"
    else:
        text = str(value)
    return html.escape(text, quote=True)


def badge(ok: bool, text: str | None = None) -> str:
    """A coloured word: green "ok" or vermillion "FAIL" (or ``text`` in that colour), bold."""
    colour = OK if ok else FAIL
    label = text if text is not None else ("ok" if ok else "FAIL")
    return f'<span class="wb-{"ok" if ok else "fail"}" style="color:{colour};font-weight:bold">{escape(label)}</span>'


def facts(items: Mapping[str, object]) -> str:
    """One line of ``name=value`` pairs (values escaped), for the head of a result."""
    parts = [f"<b>{escape(k)}</b>={escape(v)}" for k, v in items.items()]
    return f'<div class="wb-facts" style="font-family:monospace;font-size:12px">{"&nbsp; ".join(parts)}</div>'


def note(text: str, *, fail: bool = False) -> str:
    """A short line of text below or above a table (vermillion when it reports a failure)."""
    colour = f"color:{FAIL};" if fail else ""
    return f'<div class="wb-note" style="{colour}font-family:monospace;font-size:12px">{escape(text)}</div>'


def table(
    columns: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    row_kinds: Sequence[str] | None = None,
    max_rows: int | None = None,
    tail_rows: int = 4,
) -> str:
    """An HTML table; ``row_kinds[i]`` (one of ``KINDS``) colours row ``i``.

    Above ``max_rows`` rows the middle is elided into one "... n more rows ..." row and the last
    ``tail_rows`` stay visible (padded rows sit at the tail of a batch).
    """
    kinds = list(row_kinds) if row_kinds is not None else ["live"] * len(rows)
    if len(kinds) != len(rows):
        raise ValueError(f"row_kinds: {len(kinds)} kinds for {len(rows)} rows")
    for i, kind in enumerate(kinds):
        if kind not in KINDS:
            raise ValueError(f"row_kinds[{i}]: {kind!r} is not one of {KINDS}")
    shown: list[tuple[Sequence[object] | None, str]] = list(zip(rows, kinds, strict=True))
    if max_rows is not None and len(rows) > max_rows:
        head = max(max_rows - tail_rows, 1)
        tail = shown[len(rows) - tail_rows :] if tail_rows > 0 else []
        shown = [*shown[:head], (None, f"{len(rows) - head - len(tail)}"), *tail]
    out = [f'<table class="wb-table" style="{_TABLE_STYLE}"><thead><tr>']
    out += [f'<th style="{_CELL_STYLE}">{escape(c)}</th>' for c in columns]
    out.append("</tr></thead><tbody>")
    for cells, kind in shown:
        if cells is None:  # the elided middle
            span = len(columns)
            out.append(
                f'<tr class="wb-more"><td colspan="{span}" style="{_CELL_STYLE}">... {kind} more rows ...</td></tr>'
            )
            continue
        style = _ROW_STYLE[kind]
        out.append(f'<tr class="wb-{kind}"' + (f' style="{style}"' if style else "") + ">")
        out += [f'<td style="{_CELL_STYLE}">{escape(v)}</td>' for v in cells]
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def block(*parts: str, title: str | None = None) -> str:
    """Parts (already HTML) stacked in one ``div``, under an escaped bold ``title``."""
    head = f'<div style="font-weight:bold;font-family:monospace">{escape(title)}</div>' if title else ""
    return f'<div class="wb-result">{head}{"".join(parts)}</div>'


def short_list(values: Sequence[object], limit: int = 12) -> str:
    """``[a, b, c, ..., y, z]``: a list cut in the middle past ``limit`` items (plain text, for reprs)."""
    items = list(values)
    if len(items) <= limit:
        return "[" + ", ".join(map(str, items)) + "]"
    k = limit // 2
    return "[" + ", ".join(map(str, items[:k])) + ", ..., " + ", ".join(map(str, items[-k:])) + "]"
