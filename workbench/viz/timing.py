"""Timing figures: latency by batch size with IQR bands, the roofline, and the waste of a bucket list.

Pure functions, data in (``measure.timing.Results``, ``measure.ceilings.Ceilings``, bucket lists), a plotly
``go.Figure`` out. Colours: eager orange, replay blue everywhere (``viz.palette``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from workbench.buckets import choose_bucket
from workbench.extras import require
from workbench.measure.ceilings import Ceilings
from workbench.measure.timing import Results, TimingRecord
from workbench.viz.palette import BLUE, GREY, ORANGE, SEQUENCE, VERMILLION

if TYPE_CHECKING:
    import plotly.graph_objects as go

MODE_COLOURS = {"eager": ORANGE, "replay": BLUE}


def _rgba(hex_colour: str, alpha: float) -> str:
    h = hex_colour.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def _groups(results: Results, fields: Sequence[str]) -> dict[tuple[Any, ...], list[TimingRecord]]:
    out: dict[tuple[Any, ...], list[TimingRecord]] = {}
    for r in results:
        out.setdefault(tuple(getattr(r, f) for f in fields), []).append(r)
    return {k: sorted(v, key=lambda r: r.shape.get("bs", 0)) for k, v in out.items()}


def latency(results: Results, *, title: str | None = None) -> go.Figure:
    """Median latency against batch size, one line per (impl, mode), each with a band as wide as its IQR
    (median +- IQR/2); in ms when the largest median passes 10 ms, else us (the axis title says which).
    Records need ``shape["bs"]``; a line per ``what`` when several are present."""
    go = require("plotly.graph_objects", None, "workbench.viz figures")

    fig = go.Figure()
    groups = _groups(results, ("what", "impl", "mode"))
    # ms once the largest median passes 10 ms, so the axis never reads "70k" microseconds
    unit, scale = ("ms", 1e-3) if max((r.median_us for r in results), default=0.0) > 10_000 else ("us", 1.0)
    whats = {k[0] for k in groups}
    impls = {k[1] for k in groups}
    for i, ((what, impl, mode), recs) in enumerate(groups.items()):
        colour = MODE_COLOURS.get(mode, SEQUENCE[i % len(SEQUENCE)])
        name = " ".join(x for x in (what if len(whats) > 1 else "", impl if len(impls) > 1 else "", mode) if x)
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
                fillcolor=_rgba(colour, 0.2),
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
                line=dict(color=colour, dash="dot" if mode == "eager" else "solid"),
                customdata=[[r.iqr_us * scale, r.n, r.threads] for r in recs],
                hovertemplate=f"{name}<br>batch size %{{x}}<br>median %{{y:.1f}} {unit}"
                f"<br>IQR %{{customdata[0]:.1f}} {unit}"
                "<br>n=%{customdata[1]}, threads=%{customdata[2]}<extra></extra>",
            )
        )
    dev = sorted({r.device for r in results})
    fig.update_layout(
        title=title or f"Latency by batch size ({', '.join(dev)}): median, band = IQR",
        xaxis=dict(
            title="batch size (captured bucket)", type="log", tickvals=sorted({r.shape.get("bs", 0) for r in results})
        ),
        yaxis=dict(title=f"latency per step ({unit})", rangemode="tozero"),
        hovermode="closest",
        margin=dict(l=60, r=20, t=60, b=50),
    )
    return fig


def roofline(results: Results, ceilings: Ceilings | Mapping[str, Any]) -> go.Figure:
    """Each kernel's achieved bandwidth as a fraction of the measured copy bandwidth (left) and its FLOP
    rate as a fraction of the measured matmul rate (right), by batch size. Records without ``bytes`` /
    ``flops`` are left out of the panel that needs them."""
    go = require("plotly.graph_objects", None, "workbench.viz figures")
    make_subplots = require("plotly.subplots", None, "workbench.viz figures").make_subplots

    ceil = ceilings if isinstance(ceilings, Ceilings) else Ceilings.from_dict(dict(ceilings))
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=(
            f"fraction of copy bandwidth ({ceil.copy_gbps:.1f} GB/s)",
            f"fraction of matmul rate ({ceil.matmul_tflops:.3f} TFLOP/s)",
        ),
        horizontal_spacing=0.12,
    )
    groups = _groups(results, ("what", "impl"))
    bss = sorted({r.shape.get("bs", 0) for r in results})
    impls = {k[1] for k in groups}
    for i, ((what, impl), recs) in enumerate(groups.items()):
        name = f"{what} ({impl})" if len(impls) > 1 else what
        colour = SEQUENCE[i % len(SEQUENCE)]
        for col, frac, unit in ((1, ceil.fraction_of_copy, "GB/s"), (2, ceil.fraction_of_matmul, "TFLOP/s")):
            sel = [(r, frac(r)) for r in recs]
            sel = [(r, f) for r, f in sel if f is not None]
            if not sel:
                continue
            rate = [(r.gbps if col == 1 else r.tflops) for r, _ in sel]
            fig.add_trace(
                go.Scatter(
                    x=[r.shape.get("bs", 0) for r, _ in sel],
                    y=[f for _, f in sel],
                    mode="lines+markers",
                    name=name,
                    legendgroup=name,
                    showlegend=col == 1,
                    line=dict(color=colour),
                    customdata=[[r.median_us, x] for (r, _), x in zip(sel, rate, strict=True)],
                    hovertemplate=f"{name}<br>batch size %{{x}}<br>%{{y:.1%}} of the ceiling"
                    f"<br>%{{customdata[1]:.3g}} {unit}, median %{{customdata[0]:.1f}} us<extra></extra>",
                ),
                row=1,
                col=col,
            )
    for col in (1, 2):
        fig.add_hline(y=1.0, line=dict(color=GREY, dash="dash"), row=1, col=col)
        fig.update_xaxes(title_text="batch size", type="log", tickvals=bss, row=1, col=col)
        fig.update_yaxes(
            title_text="fraction of measured ceiling", tickformat=".0%", rangemode="tozero", row=1, col=col
        )
    fig.update_layout(
        title=f"Roofline on {ceil.device}: kernels against ceilings measured in the same run", margin=dict(t=80)
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
        titles.append(f"{n}: {len(bucket_lists[n])} buckets, {mean:.2f} padded rows/step")
    titles += [f"{n}: wasted state traffic" for n in names]
    fig = make_subplots(rows=2, cols=len(names), subplot_titles=titles, shared_xaxes=True, vertical_spacing=0.14)
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
        fig.update_yaxes(title_text="padded rows", row=1, col=c)
        fig.update_yaxes(title_text="MiB per step", row=2, col=c)
    fig.update_layout(
        title=f"Bucket waste for raw batch sizes 1..{max_bs} ({per_row / 2**20:.2f} MiB of state per row)",
        bargap=0.1,
        height=620,
        margin=dict(t=90),
    )
    return fig
