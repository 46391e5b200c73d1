"""Timing figures: latency by batch size with IQR bands, the roofline, and the waste of a bucket list.

Pure functions, data in (``measure.timing.Results``, ``measure.ceilings.Ceilings``, bucket lists), a plotly
``go.Figure`` out. Colours: eager orange, replay blue everywhere (``viz.palette``).
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from workbench.buckets import choose_bucket
from workbench.extras import require
from workbench.limits import gib
from workbench.measure.ceilings import Ceilings
from workbench.measure.timing import Results, TimingError, TimingRecord
from workbench.viz.palette import BLACK, BLUE, GREEN, GREY, ORANGE, PURPLE, SEQUENCE, SKY, VERMILLION

if TYPE_CHECKING:
    import plotly.graph_objects as go

MODE_COLOURS = {"eager": ORANGE, "replay": BLUE}
# a saved run overlaid on the live one: never the live run's orange or blue
OVERLAY_COLOURS = [GREEN, VERMILLION, PURPLE, SKY, BLACK]


def _rgba(hex_colour: str, alpha: float) -> str:
    h = hex_colour.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def _groups(results: Results, fields: Sequence[str]) -> dict[tuple[Any, ...], list[TimingRecord]]:
    out: dict[tuple[Any, ...], list[TimingRecord]] = {}
    for r in results:
        out.setdefault(tuple(getattr(r, f) for f in fields), []).append(r)
    return {k: sorted(v, key=lambda r: r.shape.get("bs", 0)) for k, v in out.items()}


def benchmark_kind(res: Results) -> str:
    """What ``res`` measured, to keep unlike runs off one axis: ``meta["benchmark"]`` ("replay", "metadata",
    "kernels", ...), else read from its records' ``what`` (a layer's ``*_decode_step`` is "replay")."""
    kind = res.meta.get("benchmark")
    if kind:
        return str(kind)
    whats = sorted({r.what for r in res})
    if whats and all(w.endswith("_decode_step") for w in whats):
        return "replay"
    if whats == ["metadata_update"]:
        return "metadata"
    return f"records of {', '.join(whats)}" if whats else "empty"


def check_overlay(base: Results, label: str, other: Results) -> None:
    """Refuse to draw ``other`` on ``base``'s axis when they are different benchmarks (metadata updates in us
    are no layer latency): one line naming both kinds. An empty ``base`` takes any kind."""
    if not len(base) or not len(other):
        return
    a, b = benchmark_kind(base), benchmark_kind(other)
    if a != b:
        whats = ", ".join(sorted({r.what for r in other})[:3])
        raise TimingError(
            f"overlays[{label!r}]: a {b!r} benchmark ({whats}), not {a!r} like this figure: different "
            "quantities, not one axis"
        )


def _latency_lines(
    fig: Any, results: Results, *, scale: float, unit: str, run: str | None, colour: str | None, symbol: str
) -> None:
    """One line per (what, impl, mode) of ``results``, each with its IQR band. ``run``: the run's label in the
    legend (None: the only run); ``colour``: one colour for the whole run (None: by mode)."""
    go = require("plotly.graph_objects", None, "workbench.viz figures")
    groups = _groups(results, ("what", "impl", "mode"))
    whats = {k[0] for k in groups}
    impls = {k[1] for k in groups}
    for i, ((what, impl, mode), recs) in enumerate(groups.items()):
        c = colour or MODE_COLOURS.get(mode, SEQUENCE[i % len(SEQUENCE)])
        parts = (run or "", what if len(whats) > 1 else "", impl if len(impls) > 1 else "", mode)
        name = " ".join(x for x in parts if x)
        xs = [r.shape["bs"] for r in recs]
        med = [r.median_us * scale for r in recs]
        lo = [(r.median_us - r.iqr_us / 2) * scale for r in recs]
        hi = [(r.median_us + r.iqr_us / 2) * scale for r in recs]
        fig.add_trace(
            go.Scatter(
                x=xs + xs[::-1],
                y=hi + lo[::-1],
                mode="lines",
                fill="toself",
                fillcolor=_rgba(c, 0.2),
                line=dict(width=0),
                hoverinfo="skip",
                name=f"{name} IQR",
                legendgroup=name,
                showlegend=False,
            )
        )
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=med,
                mode="lines+markers",
                name=name,
                legendgroup=name,
                line=dict(color=c, dash="dot" if mode == "eager" else "solid"),
                marker=dict(symbol=symbol),
                customdata=[[r.iqr_us * scale, r.n, r.threads] for r in recs],
                hovertemplate=f"{name}<br>batch size %{{x}}<br>median %{{y:.1f}} {unit}"
                f"<br>IQR %{{customdata[0]:.1f}} {unit}"
                "<br>n=%{customdata[1]}, threads=%{customdata[2]}<extra></extra>",
            )
        )


def latency(results: Results, *, title: str | None = None, overlays: Mapping[str, Results] | None = None) -> go.Figure:
    """Median latency against batch size, one line per (impl, mode), each with a band as wide as its IQR
    (median +- IQR/2); in ms when the largest median passes 10 ms, else us (the axis title says which).
    Records need ``shape["bs"]``; a line per ``what`` when several are present.

    ``overlays``: saved runs by label, drawn on the same axes, each in a colour of its own (the live run keeps
    eager orange / replay blue; an overlay's eager is dotted, its replay solid, its markers diamonds). A run of
    another benchmark kind (:func:`benchmark_kind`) is refused with a ``TimingError``.
    """
    go = require("plotly.graph_objects", None, "workbench.viz figures")

    runs = dict(overlays or {})
    for label, other in runs.items():
        check_overlay(results, label, other)
    every = [r for res in (results, *runs.values()) for r in res]
    fig = go.Figure()
    # ms once the largest median passes 10 ms, so the axis never reads "70k" microseconds
    unit, scale = ("ms", 1e-3) if max((r.median_us for r in every), default=0.0) > 10_000 else ("us", 1.0)
    live = "this run" if runs else None
    _latency_lines(fig, results, scale=scale, unit=unit, run=live, colour=None, symbol="circle")
    for k, (label, other) in enumerate(runs.items()):
        colour = OVERLAY_COLOURS[k % len(OVERLAY_COLOURS)]
        _latency_lines(fig, other, scale=scale, unit=unit, run=label, colour=colour, symbol="diamond")
    dev = sorted({r.device for r in every})
    fig.update_layout(
        title=title or f"Latency by batch size ({', '.join(dev)}): median, band = IQR",
        xaxis=dict(
            title="batch size (captured bucket)", type="log", tickvals=sorted({r.shape.get("bs", 0) for r in every})
        ),
        yaxis=dict(title=f"latency per step ({unit})", rangemode="tozero"),
        hovermode="closest",
        margin=dict(l=60, r=20, t=60, b=50),
    )
    return fig


def _bytes_text(nbytes: int) -> str:
    return gib(nbytes).replace(" ", "\u00a0")  # a size never wraps between number and unit


def roofline_notes(results: Results, ceil: Ceilings) -> list[str]:
    """The lines under the roofline: the copy ceiling and its spread, and why points pass 100% (a working
    set that fits the last-level cache is read faster than the DRAM copy bandwidth)."""
    band = "; the grey band is its spread" if ceil.copy_spread else ""
    lines = [f"Copy ceiling: {ceil.copy_text()} on a {gib(ceil.copy_bytes)} copy{band}."]
    if ceil.copy_in_cache:
        lines.append(f"The copy itself fits the {ceil.cache_text()}: this ceiling measured the cache, not DRAM.")
    over = [r for r in results if (f := ceil.fraction_of_copy(r)) is not None and f > 1.0]
    cached = [r for r in over if ceil.fits_cache(r)]
    beyond = [r for r in over if ceil.fits_cache(r) is False]
    if cached:
        lines.append(
            f"{len(cached)} point(s) above 100% move bytes that fit the {ceil.cache_text()} (open diamonds): a "
            "working set in the cache is read faster than DRAM copy bandwidth."
        )
    if beyond:
        lines.append(
            f"{len(beyond)} point(s) above 100% move more than the cache holds: the ceiling may be low in this "
            "run (see its spread), or the cost model counts bytes the kernel does not move."
        )
    if len(over) > len(cached) + len(beyond):
        lines.append(
            f"{len(over) - len(cached) - len(beyond)} point(s) above 100%, and no cache size recorded: a working "
            "set that fits a cache (L1/L2/last level) is read faster than DRAM copy bandwidth."
        )
    return lines


def roofline(results: Results, ceilings: Ceilings | Mapping[str, Any]) -> go.Figure:
    """Each kernel's achieved bandwidth as a fraction of the measured copy bandwidth (left) and its FLOP
    rate as a fraction of the measured matmul rate (right), by batch size. Records without ``bytes`` /
    ``flops`` are left out of the panel that needs them.

    The ceilings are medians of repeats: a grey band spans each one's min-max as a fraction of it. A point
    whose bytes fit the last-level cache (``Ceilings.fits_cache``) is an open diamond and says so on hover;
    the note under the figure (:func:`roofline_notes`) explains every point above 100%."""
    go = require("plotly.graph_objects", None, "workbench.viz figures")
    make_subplots = require("plotly.subplots", None, "workbench.viz figures").make_subplots

    ceil = ceilings if isinstance(ceilings, Ceilings) else Ceilings.from_dict(dict(ceilings))
    fig = make_subplots(
        rows=1,
        cols=2,
        # two lines each: a panel's title fits its width in a 700 px widget too
        subplot_titles=(
            f"fraction of copy bandwidth<br>({ceil.copy_gbps:.1f} GB/s)",
            f"fraction of matmul rate<br>({ceil.matmul_tflops:.3f} TFLOP/s)",
        ),
        horizontal_spacing=0.12,
    )
    fig.update_annotations(font_size=14)
    groups = _groups(results, ("what", "impl"))
    bss = sorted({r.shape.get("bs", 0) for r in results})
    impls = {k[1] for k in groups}
    cache = ceil.cache_text()
    for i, ((what, impl), recs) in enumerate(groups.items()):
        name = f"{what} ({impl})" if len(impls) > 1 else what
        colour = SEQUENCE[i % len(SEQUENCE)]
        for col, frac, unit in ((1, ceil.fraction_of_copy, "GB/s"), (2, ceil.fraction_of_matmul, "TFLOP/s")):
            sel = [(r, frac(r)) for r in recs]
            sel = [(r, f) for r, f in sel if f is not None]
            if not sel:
                continue
            rate = [(r.gbps if col == 1 else r.tflops) for r, _ in sel]
            fits = [col == 1 and bool(ceil.fits_cache(r)) for r, _ in sel]
            where = [
                f"<br>{_bytes_text(r.bytes or 0)} per call fits the {cache}: read from the cache, faster than DRAM"
                if fit
                else ""
                for (r, _), fit in zip(sel, fits, strict=True)
            ]
            fig.add_trace(
                go.Scatter(
                    x=[r.shape.get("bs", 0) for r, _ in sel],
                    y=[f for _, f in sel],
                    mode="lines+markers",
                    name=name,
                    legendgroup=name,
                    showlegend=col == 1,
                    line=dict(color=colour),
                    marker=dict(symbol=["diamond-open" if fit else "circle" for fit in fits], size=8),
                    customdata=[[r.median_us, x, w] for (r, _), x, w in zip(sel, rate, where, strict=True)],
                    hovertemplate=f"{name}<br>batch size %{{x}}<br>%{{y:.1%}} of the ceiling"
                    f"<br>%{{customdata[1]:.3g}} {unit}, median %{{customdata[0]:.1f}} us%{{customdata[2]}}"
                    "<extra></extra>",
                ),
                row=1,
                col=col,
            )
    if any(ceil.fits_cache(r) for r in results):
        fig.add_trace(  # a legend entry for the marker, no data
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                marker=dict(symbol="diamond-open", size=8, color=GREY),
                name=f"bytes fit the {cache}",
            ),
            row=1,
            col=1,
        )
    for col, spread, median in ((1, ceil.copy_spread, ceil.copy_gbps), (2, ceil.matmul_spread, ceil.matmul_tflops)):
        if spread is not None and median > 0:
            fig.add_hrect(
                y0=spread[0] / median, y1=spread[1] / median, fillcolor=GREY, opacity=0.2, line_width=0, row=1, col=col
            )
        fig.add_hline(y=1.0, line=dict(color=GREY, dash="dash"), row=1, col=col)
        fig.update_xaxes(title_text="batch size", type="log", tickvals=bss, row=1, col=col)
        fig.update_yaxes(  # one axis title for both panels (the same quantity): none over the left panel
            title_text="fraction of measured ceiling" if col == 1 else None,
            tickformat=".0%",
            rangemode="tozero",
            row=1,
            col=col,
        )
    notes = roofline_notes(results, ceil)
    lines = [part for note in notes for part in textwrap.wrap(note, 100)]  # plotly never wraps a line itself
    fig.add_annotation(
        text="<br>".join(lines),
        xref="paper",
        yref="paper",
        x=0,
        y=-0.2,
        xanchor="left",
        yanchor="top",
        align="left",
        showarrow=False,
        font=dict(size=11),
        name="notes",
    )
    fig.update_layout(
        title=f"Roofline on {ceil.device}: kernels against ceilings measured in the same run",
        height=480 + 16 * len(lines),
        margin=dict(t=100, b=90 + 16 * len(lines)),  # t: the title above two-line panel titles
    )
    return fig


def _gdn_state_bytes_per_row() -> int:
    """Recurrent + conv state of one request in an engine-sized Gated DeltaNet layer (float32)."""
    from workbench.layers import GDNConfig

    c = GDNConfig()
    return 4 * (c.num_v_heads * c.head_k_dim * c.head_v_dim + c.conv_dim * (c.conv_kernel - 1))


def waste_table(buckets: Sequence[int], max_bs: int) -> list[tuple[int, int | None, int]]:
    """``(raw batch size, bucket or None above the largest, padded rows)`` for raw sizes 1..max_bs."""
    out = []
    for raw in range(1, max_bs + 1):
        b = choose_bucket(raw, sorted(buckets))
        out.append((raw, b, (b - raw) if b is not None else 0))
    return out


def bucket_waste(
    bucket_lists: Mapping[str, Sequence[int]], max_bs: int, *, state_bytes_per_row: int | None = None
) -> go.Figure:
    """Padded rows per raw batch size for each bucket list, side by side, and the state traffic they waste.

    Top row: padded rows (bucket - raw). Bottom row: the state bytes those rows read and write when a
    profile processes them on the dummy slot (Ascend; sglang and vLLM skip them and pay only the rows of
    compute), ``2 * padded * state_bytes_per_row`` in MiB (default: an engine-sized Gated DeltaNet layer).
    Raw sizes above the largest bucket run eagerly (no padding) and are marked with an x.
    """
    go = require("plotly.graph_objects", None, "workbench.viz figures")
    make_subplots = require("plotly.subplots", None, "workbench.viz figures").make_subplots

    per_row = state_bytes_per_row if state_bytes_per_row is not None else _gdn_state_bytes_per_row()
    names = list(bucket_lists)
    tables = {n: waste_table(bucket_lists[n], max_bs) for n in names}
    titles = []
    for n in names:
        t = tables[n]
        mean = sum(p for _, _, p in t) / max(len(t), 1)
        # one short line each, so that a panel's title fits its width with three lists in a 700 px widget
        titles.append(f"<b>{n}</b><br>{len(bucket_lists[n])} buckets<br>{mean:.2f} padded rows/step")
    titles += ["wasted state traffic" for _ in names]
    fig = make_subplots(
        rows=2,
        cols=len(names),
        subplot_titles=titles,
        shared_xaxes=True,
        vertical_spacing=0.14,
        horizontal_spacing=0.08,
    )
    fig.update_annotations(font_size=12)
    for c, n in enumerate(names, start=1):
        t = tables[n]
        graph = [(raw, b, p) for raw, b, p in t if b is not None]
        eager = [raw for raw, b, _ in t if b is None]
        fig.add_trace(
            go.Bar(
                x=[raw for raw, _, _ in graph],
                y=[p for _, _, p in graph],
                marker_color=BLUE,
                name="padded rows",
                legendgroup="padded",
                showlegend=c == 1,
                customdata=[[b] for _, b, _ in graph],
                hovertemplate=f"{n}<br>raw batch %{{x}} -> bucket %{{customdata[0]}}"
                "<br>%{y} padded rows<extra></extra>",
            ),
            row=1,
            col=c,
        )
        fig.add_trace(
            go.Bar(
                x=[raw for raw, _, _ in graph],
                y=[2 * p * per_row / 2**20 for _, _, p in graph],
                marker_color=VERMILLION,
                name="wasted state traffic (MiB)",
                legendgroup="traffic",
                showlegend=c == 1,
                hovertemplate=f"{n}<br>raw batch %{{x}}: %{{y:.1f}} MiB"
                " read + written on the dummy slot<extra></extra>",
            ),
            row=2,
            col=c,
        )
        if eager:
            fig.add_trace(
                go.Scatter(
                    x=eager,
                    y=[0] * len(eager),
                    mode="markers",
                    marker=dict(symbol="x", color=GREY, size=6),
                    name="eager: above the largest bucket",
                    legendgroup="eager",
                    showlegend=c == 1,
                    hovertemplate=f"{n}<br>raw batch %{{x}}: no bucket, runs eagerly<extra></extra>",
                ),
                row=1,
                col=c,
            )
        fig.update_xaxes(title_text="raw batch size", row=2, col=c)
        # axis titles on the left column only (each row is one quantity): none over a neighbouring panel
        fig.update_yaxes(title_text="padded rows" if c == 1 else None, row=1, col=c)
        fig.update_yaxes(title_text="MiB per step" if c == 1 else None, row=2, col=c)
    fig.update_layout(
        title=f"Bucket waste for raw batch sizes 1..{max_bs} ({per_row / 2**20:.2f} MiB of state per row)",
        bargap=0.1,
        height=660,
        margin=dict(t=130, b=10),  # t: the title above three-line panel titles
        # at the figure's foot (yref "container" reserves its rows): the panels keep the whole width
        legend=dict(orientation="h", yref="container", y=0, yanchor="bottom", x=0, xanchor="left"),
    )
    return fig
