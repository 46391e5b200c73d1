"""A self-contained HTML page: sections of text, tables and plotly figures, plotly's JavaScript embedded once.

The report (``workbench report``) and ``workbench bench --plot`` write one; it sits beside the figures so
that neither entry point imports the other.

Each figure is stored as JSON in a ``<script type="application/json" class="figure-data">`` next to its
``<div>`` and drawn by one small script at the end, so the page opens offline and a test can read every
figure back with ``json.loads``.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from workbench.html import Cell
from workbench.html import table as html_table

STYLE = """
body { font-family: system-ui, sans-serif; margin: 0 auto; max-width: 1300px; padding: 1em 2em; color: #222; }
nav a { margin-right: 1em; }
section { border-top: 1px solid #ccc; margin-top: 1.5em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 90%; }
th, td { border: 1px solid #ccc; padding: 2px 8px; text-align: left; }
th { background: #f0f0f0; }
caption { text-align: left; padding: 0.3em 0; }
pre { background: #f7f7f7; padding: 0.5em; overflow-x: auto; font-size: 85%; }
.note { color: #555; font-style: italic; }
.figure { width: 100%; }
"""

RENDER = """
document.querySelectorAll("script.figure-data").forEach(function (s) {
  var fig = JSON.parse(s.textContent);
  Plotly.newPlot(s.dataset.target, fig.data, fig.layout, {responsive: true, displaylogo: false});
});
"""


def esc(text: Any) -> str:
    """``str(text)`` with ``& < > " '`` escaped."""
    return html.escape(str(text))


def table(header: list[str], rows: list[list[Any]], *, classes: list[list[str]] | None = None) -> str:
    """``workbench.html.table`` with a class per cell: ``classes[i][j]`` is "good", "bad" or "" (the report's
    sections mark cells this way; they become green or vermillion cells)."""
    kinds = {"good": "ok", "bad": "fail"}

    def cell(v: Any, cls: str) -> Any:
        return Cell(v, kinds[cls]) if cls else v

    marked = [[cell(v, classes[i][j] if classes else "") for j, v in enumerate(r)] for i, r in enumerate(rows)]
    return html_table(header, marked, left=[header[0]] if header else ())


@dataclass
class Page:
    """Sections (id, heading, HTML parts) and figures of one page; ``render()`` is the whole file.

    >>> page = Page("demo")
    >>> page.section("intro", "Intro").append("<p>hi</p>")
    >>> [sid for sid, _, _ in page.sections]
    ['intro']
    """

    title: str
    sections: list[tuple[str, str, list[str]]] = field(default_factory=list)  # (id, heading, html parts)
    _figures: int = 0

    def section(self, sid: str, heading: str) -> list[str]:
        """Start a section; append HTML strings to the list returned."""
        parts: list[str] = []
        self.sections.append((sid, heading, parts))
        return parts

    def figure(self, fig: Any) -> str:
        """The HTML of one plotly figure (its JSON embedded; drawn when the page loads)."""
        self._figures += 1
        fid = f"figure-{self._figures}"
        data = fig.to_json().replace("</", "<\\/")  # a "</script>" inside a string must not end the tag
        height = fig.layout.height or 450
        return (
            f"<div class='figure' id='{fid}' style='height:{height}px'></div>"
            f"<script type='application/json' class='figure-data' data-target='{fid}'>{data}</script>"
        )

    def render(self) -> str:
        from plotly.offline import get_plotlyjs

        nav = " ".join(f"<a href='#{sid}'>{esc(h)}</a>" for sid, h, _ in self.sections)
        body = "\n".join(
            f"<section id='{sid}'><h2>{esc(h)}</h2>\n" + "\n".join(parts) + "</section>"
            for sid, h, parts in self.sections
        )
        return (
            "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{esc(self.title)}</title><style>{STYLE}</style>"
            f"<script type='text/javascript'>{get_plotlyjs()}</script></head>\n"
            f"<body><h1>{esc(self.title)}</h1><nav>{nav}</nav>\n{body}\n"
            f"<script type='text/javascript'>{RENDER}</script></body></html>\n"
        )
