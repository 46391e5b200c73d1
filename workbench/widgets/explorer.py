"""``MetadataExplorer``: a thin ipywidgets view over :class:`ExplorerModel` with plotly ``FigureWidget``s
updated in place (``figure_sync.updating``) on every control change."""

from __future__ import annotations

from typing import Any

import ipywidgets as W
import plotly.graph_objects as go

from workbench import html
from workbench.metadata import DraftTree
from workbench.viz import metadata as vm
from workbench.viz import tree as vt
from workbench.widgets.explorer_model import (
    LIMITS,
    PROFILE_CHOICES,
    PROFILE_NAMES,
    SLIDERS,
    ExplorerModel,
    ExplorerState,
    TreeView,
)
from workbench.widgets.figure_sync import updating
from workbench.widgets.html import error_html, metadata_html
from workbench.widgets.stale import mark_stale, stale_html


def update_padding_map(fig: go.FigureWidget, metas: list) -> None:
    """Write :func:`viz.metadata.padding_map_traces` of ``metas`` into ``fig`` in place, laid out as
    :func:`viz.metadata.padding_map` lays it out (``padding_cells``, ``padding_map_layout``)."""
    data = vm.padding_map_traces(metas)
    max_bs = max((m.batch_size for m in metas), default=1)
    with updating(fig):
        for tr in fig.data:
            d = data[tr.name]
            tr.update(**vm.padding_cells(d["x"]), y=d["y"], customdata=d["customdata"])
            tr.text = d["text"] if max_bs <= 48 else [""] * len(d["x"])  # cell text unreadable past that
        fig.update_layout(**vm.padding_map_layout(metas))


def update_slot_map(fig: go.FigureWidget, meta: Any, pool: Any) -> None:
    """Write :func:`viz.metadata.slot_map_traces` into ``fig`` in place, laid out by
    :func:`viz.metadata.slot_map_layout`."""
    data = vm.slot_map_traces(meta, pool)
    with updating(fig):
        for tr in fig.data:
            d = data[tr.name]
            tr.x, tr.y, tr.customdata = d["x"], d["y"], d["customdata"]
        fig.update_layout(**vm.slot_map_layout(meta, pool))


def update_qsl(fig: go.FigureWidget, metas: list) -> None:
    """Write :func:`viz.metadata.qsl_traces` into ``fig`` in place (spare traces emptied and hidden)."""
    data = vm.qsl_traces(metas)
    while len(fig.data) < len(data):  # grows only; never re-created
        fig.add_trace(go.Scatter(mode="lines+markers", line=dict(shape="hv")))
    with updating(fig):
        for k, tr in enumerate(fig.data):
            if k < len(data):
                t = data[k]
                tr.update(name=t["name"], x=t["x"], y=t["y"], customdata=t["customdata"], visible=True)
                tr.marker.symbol = t["symbol"]
            else:
                tr.update(x=[], y=[], customdata=[], visible=False)


def update_tree(fig: go.FigureWidget, view: TreeView) -> None:
    """Write :func:`viz.tree.draft_tree_traces` of ``view`` into ``fig`` in place, laid out by
    :func:`viz.tree.draft_tree_layout` (no tree: the figure keeps what it shows)."""
    if view.tree is None:
        return
    data = vt.draft_tree_traces(view.tree, view.row, accept_index=view.accept_index)
    with updating(fig):
        for tr in fig.data:
            d = data[tr.name]
            tr.update(x=d["x"], y=d["y"], text=d["text"], customdata=d["customdata"])
            if "color" in d:
                tr.marker.color = d["color"]
        fig.update_layout(**vt.draft_tree_layout(view.tree, view.row, accept_index=view.accept_index))


def _range(name: str, value: Any) -> dict[str, Any]:
    """``value``, ``min``, ``max`` of slider ``name``: its ``SLIDERS`` range, widened to hold a starting value
    within the model's limit (ipywidgets would cut it silently)."""
    lo, hi = SLIDERS[name]
    top = LIMITS[name][1] if name in LIMITS else hi
    ok = (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and LIMITS.get(name, (lo, top))[0] <= value <= top
    )
    return {"value": value, "min": lo, "max": max(hi, value)} if ok else {"value": lo, "min": lo, "max": hi}


def _note_html(note: str | None) -> str:
    return f"<span style='color:#666'>{html.escape(note)}</span>" if note else ""


class MetadataExplorer(W.VBox):
    """Build state-index / query_start_loc metadata interactively and see padding, slots and qsl.

    Controls: profile (or all three), mode, raw batch size, seq lens (typed or random), draft tokens, draft
    topk (draft trees, sglang), bucket list (engine default or typed), pool size, fragmentation. In
    target_verify a "tree of row" slider picks the live row whose draft tree (and a random accepted path)
    the tree figure draws. Bad typed input and sizes past the
    model's ``LIMITS`` show the error beside the control that caused it, before any work; nothing raises
    into the notebook. While the inputs are refused the figures are veiled and the table dimmed under the
    model's ``stale`` line (they show the last accepted step). A slider at its end says, beside it, that a
    larger typed value was cut to it.

    Attributes: ``model`` (the :class:`ExplorerModel`), ``controls`` (name -> widget), ``errors`` (name ->
    HTML widget beside it), ``notes`` (name -> HTML, grey), ``padding_fig``, ``slot_fig``, ``qsl_fig``,
    ``tree_fig`` (FigureWidgets), ``tree_row`` (the row slider), ``tree_note`` (HTML), ``table`` (HTML).
    """

    def __init__(self, **params: Any) -> None:
        self.model = ExplorerModel(**params)
        p = self.model.params
        style = {"description_width": "150px"}
        # every typed or slid control: same width, and it reports on release, not on every drag step
        row: dict[str, Any] = {"style": style, "layout": W.Layout(width="420px"), "continuous_update": False}
        self.controls: dict[str, W.Widget] = {
            "profile": W.Dropdown(options=PROFILE_CHOICES, value=p.profile, description="profile", style=style),
            "mode": W.Dropdown(
                options=("decode", "target_verify", "extend", "idle"), value=p.mode, description="mode", style=style
            ),
            "raw_batch_size": W.IntSlider(
                **_range("raw_batch_size", p.raw_batch_size), description="raw batch size", **row
            ),
            "seq_lens": W.Text(
                value=p.seq_lens, description="seq lens", placeholder="empty: random; or 7, 3, 9", **row
            ),
            "draft_tokens": W.IntSlider(**_range("draft_tokens", p.draft_tokens), description="draft tokens D", **row),
            "topk": W.IntSlider(**_range("topk", p.topk), description="draft topk (trees)", **row),
            "buckets": W.Text(value=p.buckets, description="buckets", placeholder="empty: engine default", **row),
            "pool_size": W.IntSlider(**_range("pool_size", p.pool_size), description="pool slots", **row),
            "fragmentation": W.FloatSlider(
                **_range("fragmentation", p.fragmentation), step=0.05, description="fragmentation", **row
            ),
        }
        self.focus = W.Dropdown(options=PROFILE_NAMES, value=PROFILE_NAMES[0], description="slot map of", style=style)
        from workbench.engines import installed_engines  # distribution metadata only: no engine is imported

        self.engine = W.Dropdown(
            options=[("none", ""), *((f"{e} (real code)", e) for e in installed_engines())],
            value="",
            description="engine beside",
            style=style,
            disabled=not installed_engines(),
        )
        self.engine_table = W.HTML()
        self.errors = {name: W.HTML() for name in (*self.controls, "general")}
        self.notes = {name: W.HTML() for name in (*SLIDERS, "profile")}
        st = self.model.state
        metas = st.metas or self._placeholder()
        self.padding_fig = go.FigureWidget(vm.padding_map(metas))
        self.qsl_fig = go.FigureWidget(vm.qsl_staircase(metas))
        self.slot_fig = go.FigureWidget(vm.slot_map(metas[0], (st.pools or [self._placeholder_pool()])[0]))
        self.tree_row = W.IntSlider(value=0, min=0, max=0, description="tree of row", style=style)
        self.tree_note = W.HTML()
        first = self.model.tree_view(0)  # no tree yet (not a verify): a chain of 3 lays the figure out
        self.tree_fig = go.FigureWidget(
            vt.draft_tree_figure(first.tree or DraftTree.chain(1, 3), first.row, accept_index=first.accept_index)
        )
        self.tree_box = W.VBox([W.HBox([self.tree_row, self.tree_note]), self.tree_fig])
        self.table = W.HTML()
        self._table_body = ""  # the last good table, dimmed while the inputs are refused
        self._syncing = False
        for name, w in self.controls.items():
            w.observe(self._on_change, names="value")
            w._wb_name = name  # which parameter the control sets
        self.focus.observe(lambda _: None if self._syncing else self._render(self.model.state), names="value")
        self.engine.observe(lambda _: self._render_engine(), names="value")
        self.tree_row.observe(lambda _: None if self._syncing else self._render_tree(), names="value")
        rows = [
            W.HBox([w, self.errors[n], *([self.notes[n]] if n in self.notes else [])]) for n, w in self.controls.items()
        ]
        super().__init__(
            [
                W.HTML("<b>Metadata explorer</b>: change a control, the figures follow."),
                *rows,
                self.errors["general"],
                self.padding_fig,
                W.HBox([self.focus]),
                self.slot_fig,
                self.qsl_fig,
                self.tree_box,
                W.HTML("<b>Metadata table</b> (padded rows grey; the line below says what the kernel does with them)"),
                self.table,
                W.HBox([self.engine]),
                self.engine_table,
            ]
        )
        self._render(st)

    # the first figure needs some steps to lay out; a failing start (bad params) draws a minimal one
    @staticmethod
    def _placeholder() -> list:
        return ExplorerModel(profile="sglang", raw_batch_size=1).state.metas

    @staticmethod
    def _placeholder_pool():
        return ExplorerModel(profile="sglang", raw_batch_size=1).state.pools[0]

    def _on_change(self, change: dict) -> None:
        if self._syncing:
            return
        self.set(**{change["owner"]._wb_name: change["new"]})

    def set(self, **changes: Any) -> ExplorerState:
        """Apply parameter changes (as the controls do) and update everything in place."""
        st = self.model.update(**changes)
        self._render(st)
        return st

    def _sync_slider(self, name: str, value: Any) -> None:
        """Show ``value`` on slider ``name`` without a change event, widening its range rather than letting
        ipywidgets cut it (a value past the model's limit was refused: the slider keeps its place)."""
        w = self.controls[name]
        lo, hi = LIMITS[name][:2] if name in LIMITS else SLIDERS[name]
        if w.value == value or isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
            return
        self._syncing = True
        try:
            w.min, w.max = min(w.min, value), max(w.max, value)
            w.value = value
        finally:
            self._syncing = False

    def _render(self, st: ExplorerState) -> None:
        for name, w in self.errors.items():
            w.value = error_html(st.errors.get(name))
        notes = self.model.notes()
        for name, w in self.notes.items():
            w.value = _note_html(notes.get(name))
        typed = bool(st.params.seq_lens.strip())  # the typed list decides the batch size: show it on the slider
        for name in SLIDERS:  # a value set from Python shows on its slider too
            self._sync_slider(
                name, st.raw_batch_size if name == "raw_batch_size" and typed else getattr(st.params, name)
            )
        stale = self.model.stale
        for fig in (self.padding_fig, self.slot_fig, self.qsl_fig, self.tree_fig):
            mark_stale(fig, stale)
        if not st.metas:  # the last good figures stay, veiled; the table dims under the same line
            self.table.value = stale_html(stale, self._table_body)
            return
        shown = [m.profile.name for m in st.metas]
        self.focus.disabled = len(shown) == 1
        k = shown.index(self.focus.value) if self.focus.value in shown else 0
        if self.focus.value != shown[k]:
            self._syncing = True  # the dropdown names the profile the slot map shows, even when disabled
            try:
                self.focus.value = shown[k]
            finally:
                self._syncing = False
        update_padding_map(self.padding_fig, st.metas)
        update_slot_map(self.slot_fig, st.metas[k], st.pools[k])
        update_qsl(self.qsl_fig, st.metas)
        self._render_tree()
        self._table_body = "".join(metadata_html(m) for m in st.metas)
        self.table.value = self._table_body
        self._render_engine()

    def _render_tree(self) -> None:
        """The tree figure of the chosen row; the section shows in target_verify only, the row slider's range
        following the live rows (it picks a row to draw, as the slot map's dropdown picks a profile)."""
        shown = self.model.shown
        tree = shown.tree if shown is not None else None
        self.tree_box.layout.display = None if tree is not None else "none"
        if tree is None:
            return
        top = max(tree.num_requests - 1, 0)
        if self.tree_row.max != top:
            self._syncing = True
            try:
                self.tree_row.max = top  # a row past the new top moves to it: the last live row
            finally:
                self._syncing = False
        view = self.model.tree_view(self.tree_row.value)
        self.tree_note.value = _note_html(view.note)
        update_tree(self.tree_fig, view)

    def _render_engine(self) -> None:
        """The chosen engine's own metadata beside the profile's, for the same batch (none chosen: empty)."""
        engine = self.engine.value
        if not engine:
            self.engine_table.value = ""
            return
        try:
            rows = self.model.engine_rows(engine)
        except Exception as e:  # noqa: BLE001 - the engine's own error is what to show
            self.engine_table.value = error_html(f"{engine}: {type(e).__name__}: {e}")
            return
        if not rows:
            shown = ", ".join(m.profile.name for m in self.model.state.metas) or "none"
            self.engine_table.value = error_html(f"{engine}: no step shown uses its profile (shown: {shown})")
            return
        cols = ("profile", "field", "profile's value", "engine's value", "equal")
        body = [[p, f, a, b, "yes" if same else "NO"] for p, f, a, b, same in rows]
        kinds = ["ok" if same else "fail" for *_, same in rows]
        self.engine_table.value = html.table(cols, body, row_kinds=kinds, left=cols)
