"""Small HTML tables for the notebook view of result objects (their ``_repr_html_``).

Standard library only, at the bottom layer, so ``metadata``, ``measure`` and ``runner`` can render
themselves without importing ``viz``. Every value is escaped. Rows carry a class (``wb-live``, ``wb-pad``,
``wb-fail``, ``wb-ok``, ``wb-warn``) and an inline style, because notebook front ends drop ``<style>`` blocks
of untrusted outputs but keep inline styles. Every HTML table of the workbench (result objects, widgets,
notebooks) is built by :func:`table`; a :class:`Cell` colours one cell (a verdict in a row of text).

>>> print(table(["row", "kind"], [[0, "live"], [1, "pad"]], row_kinds=["live", "pad"]))  # doctest: +ELLIPSIS
<table class="wb-table" ...><thead>...<tr class="wb-pad" style="background-color:#D9D9D9;color:#000">...
>>> print(table(["case", "state"], [["a<b", Cell("broken", "fail")]], caption="zoo"))  # doctest: +ELLIPSIS
<table ...><caption ...>zoo</caption>...<td ...>a&lt;b</td><td class="wb-fail" style="...#D55E00...">broken</td>...
"""

from __future__ import annotations

import html
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

# The Okabe-Ito colours of ``workbench.viz.palette`` (that module sits above this one; a test keeps the two
# equal): padded rows grey as in the figures, failures vermillion, passes green, live rows blue.
LIVE = "#0072B2"  # palette.BLUE
PAD = "#D9D9D9"  # palette.LIGHT_GREY
FAIL = "#D55E00"  # palette.VERMILLION
OK = "#009E73"  # palette.GREEN
WARN = "#E69F00"  # palette.ORANGE
FAIL_TINT = "#F7DCCA"  # VERMILLION at about 25 % on white: a whole row stays readable
WARN_TINT = "#F9E7BF"  # ORANGE at about 25 % on white

# live: a row as it should be; pad: a padded batch row; fail: a failure; ok: a pass; warn: worth a second look
# (a noisy timing, a silent signature change)
KINDS = ("live", "pad", "fail", "ok", "warn")
_ROW_STYLE = {
    "live": "",
    "pad": f"background-color:{PAD};color:#000",
    "fail": f"background-color:{FAIL_TINT};color:#000;border-left:4px solid {FAIL}",
    "ok": "",
    "warn": f"background-color:{WARN_TINT};color:#000;border-left:4px solid {WARN}",
}
# a single cell's kind colours its text (its row keeps its own background)
_CELL_KIND_STYLE = {
    "live": "",
    "pad": f"background-color:{PAD};color:#000",
    "fail": f"color:{FAIL};font-weight:bold",
    "ok": f"color:{OK};font-weight:bold",
    "warn": f"color:{WARN};font-weight:bold",
}
_TABLE_STYLE = "border-collapse:collapse;font-family:monospace;font-size:12px;margin:2px 0"
_CELL_STYLE = "padding:1px 8px;text-align:right;border-bottom:1px solid #ddd"
_LEFT = "text-align:left"  # overrides _CELL_STYLE's right alignment (numbers) for columns of words
_CAPTION_STYLE = "text-align:left;font-family:monospace;font-size:12px;padding:2px 0"


@dataclass(frozen=True)
class Cell:
    """A table value with its own kind (one of ``KINDS``): ``Cell("broken", "fail")``. Still escaped."""

    value: object
    kind: str = "live"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Cell.kind: {self.kind!r} is not one of {KINDS}")


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
    caption: str | None = None,
    left: Collection[str] = (),
) -> str:
    """An HTML table; ``row_kinds[i]`` (one of ``KINDS``) colours row ``i``, a :class:`Cell` one cell.

    Above ``max_rows`` rows the middle is elided into one "... n more rows ..." row and the last
    ``tail_rows`` stay visible (padded rows sit at the tail of a batch). ``caption``: a line above the
    table; ``left``: the columns (by name) aligned left, for text; the others align right, for numbers.
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
    unknown = set(left) - set(columns)
    if unknown:
        raise ValueError(f"left: {sorted(unknown)} are not columns of {list(columns)}")
    styles = [f"{_CELL_STYLE};{_LEFT}" if c in left else _CELL_STYLE for c in columns]
    out = [f'<table class="wb-table" style="{_TABLE_STYLE}">']
    if caption is not None:
        out.append(f'<caption style="{_CAPTION_STYLE}">{escape(caption)}</caption>')
    out.append("<thead><tr>")
    out += [f'<th style="{s}">{escape(c)}</th>' for c, s in zip(columns, styles, strict=True)]
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
        if len(cells) != len(columns):
            raise ValueError(f"rows: a row of {len(cells)} cells under {len(columns)} columns")
        out += [_cell(v, s) for v, s in zip(cells, styles, strict=True)]
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _cell(value: object, style: str) -> str:
    if not isinstance(value, Cell) or value.kind == "live":
        text = value.value if isinstance(value, Cell) else value
        return f'<td style="{style}">{escape(text)}</td>'
    return f'<td class="wb-{value.kind}" style="{style};{_CELL_KIND_STYLE[value.kind]}">{escape(value.value)}</td>'


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
