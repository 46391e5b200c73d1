"""``CaptureReplayLab``: a thin ipywidgets view over :class:`LabModel`."""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go

from workbench.viz import integrity_heatmap
from workbench.viz.metadata import INTEGRITY_LABELS, integrity_codes
from workbench.widgets.html import error_html, ok_html, records_html
from workbench.widgets.lab_model import LAYERS, PRESETS, LabModel, backend_choices


class CaptureReplayLab(W.VBox):
    """Capture a layer step per bucket on a graph backend, then replay steps and check them.

    Controls: layer, preset, backend (unavailable ones disabled, with the reason), buckets, D; Capture
    (with a progress bar); then batch size, mode, random-requests seed and Replay; Accept after verify.
    Shows replay vs eager, the integrity report, a slot heatmap of what each step changed (the dummy
    slot marked), the recorded ops of the replayed graph, and eager vs replay time of the batch.

    Attributes: ``model`` (:class:`LabModel`), the controls (``layer``, ``preset``, ``backend``,
    ``buckets``, ``draft_tokens``, ``capture_button``, ``progress``, ``batch_size``, ``mode``, ``seed``,
    ``replay_button``, ``accept_button``), ``result`` / ``ops`` / ``timing`` (HTML), ``heatmap`` (FigureWidget).
    """

    def __init__(self, **params: Any) -> None:
        self.model = LabModel(**params)
        m = self.model
        style = {"description_width": "120px"}
        self.layer = W.Dropdown(options=LAYERS, value=m.layer_name, description="layer", style=style)
        self.preset = W.Dropdown(options=PRESETS, value=m.preset, description="shape preset", style=style)
        choices = backend_choices()
        self.backend = W.Dropdown(
            options=[(b if why is None else f"{b} (unavailable)", b) for b, why in choices],
            value=m.backend,
            description="backend",
            style=style,
        )
        self.backend_reasons = {b: why for b, why in choices}
        self.backend_note = W.HTML(
            "<br>".join(f"<small><b>{b}</b> unavailable: {html.escape(why)}</small>" for b, why in choices if why)
        )
        self.buckets = W.Text(value=m.buckets_text, description="buckets", style=style)
        self.draft_tokens = W.BoundedIntText(value=m.draft_tokens, min=1, max=8, description="D", style=style)
        self.capture_button = W.Button(description="Capture", button_style="primary", icon="camera")
        self.progress = W.IntProgress(value=0, min=0, max=1, description="capture")
        self.batch_size = W.IntSlider(value=3, min=1, max=8, description="batch size", style=style)
        self.mode = W.Dropdown(options=("decode",), value="decode", description="mode", style=style)
        self.seed = W.IntText(value=0, description="requests seed", style=style)
        self.replay_button = W.Button(description="Replay", icon="play", disabled=True)
        self.accepted_text = W.Text(value="", placeholder="empty: random", description="accepted", style=style)
        self.accept_button = W.Button(description="Verify + accept", disabled=True)
        self.error = W.HTML()
        self.result = W.HTML()
        self.timing = W.HTML()
        self.ops = W.HTML()
        self.accept_result = W.HTML()
        self.heatmap = go.FigureWidget(integrity_heatmap([[False]], slots=[0], steps=["(nothing yet)"]))
        self.capture_button.on_click(lambda _: self.do_capture())
        self.replay_button.on_click(lambda _: self.do_replay())
        self.accept_button.on_click(lambda _: self.do_accept())
        self.backend.observe(self._on_backend, names="value")
        super().__init__(
            [
                W.HTML("<b>Capture and replay lab</b>"),
                W.HBox([self.layer, self.preset, self.backend]),
                self.backend_note,
                W.HBox([self.buckets, self.draft_tokens]),
                W.HBox([self.capture_button, self.progress]),
                W.HBox([self.batch_size, self.mode, self.seed]),
                W.HBox([self.replay_button, self.accepted_text, self.accept_button]),
                self.error,
                self.result,
                self.timing,
                self.accept_result,
                self.heatmap,
                W.HTML("<b>Recorded ops of the replayed graph</b>"),
                self.ops,
            ]
        )

    def _on_backend(self, change: dict) -> None:
        why = self.backend_reasons.get(change["new"])
        self.error.value = error_html(f"backend {change['new']} is unavailable here: {why}" if why else None)
        self.capture_button.disabled = why is not None

    # -- actions (what the buttons do; tests call these or .click()) -------------------------------------
    def do_capture(self) -> bool:
        m = self.model
        m.layer_name, m.preset, m.backend = self.layer.value, self.preset.value, self.backend.value
        m.buckets_text, m.draft_tokens = self.buckets.value, int(self.draft_tokens.value)
        self.progress.value = 0

        def progress(done: int, total: int) -> None:
            self.progress.max = total
            self.progress.value = done

        ok = m.capture(progress)
        self.error.value = error_html(m.error)
        self.replay_button.disabled = not ok
        self.accept_button.disabled = True
        if ok:
            assert m.runner is not None
            self.mode.options = m.modes
            self.batch_size.max = max(1, m.runner.pool.capacity)
            self.result.value = ok_html(f"captured {len(m.captured)} graphs: {m.captured}")
            self._heatmap()
        return ok

    def do_replay(self) -> bool:
        m = self.model
        rep = m.step(int(self.batch_size.value), self.mode.value, int(self.seed.value))
        self.error.value = error_html(m.error)
        if rep is None:
            return False
        cmp = rep.comparison
        head = (
            f"{rep.label}: replay == eager bitwise: <b>{cmp.bitwise_equal}</b> "
            f"(max output diff {cmp.max_output_diff:.3g}, max state diff {cmp.max_state_diff:.3g})"
        )
        verdict = ok_html(str(cmp.integrity)) if cmp.integrity.ok else error_html(str(cmp.integrity))
        self.result.value = (
            f"<div>{head}</div><div class='wb-integrity' data-ok='{str(cmp.integrity.ok).lower()}'>{verdict}</div>"
        )
        if rep.eager_us is not None and rep.replay_us is not None:
            where = m.runner.graph_backend.name if m.runner else ""
            self.timing.value = (
                f"eager {rep.eager_us:.1f} us, replay {rep.replay_us:.1f} us "
                f"({rep.eager_us / rep.replay_us:.2f}x) for this batch on {where}"
            )
        rows = m.ops_rows()
        self.ops.value = records_html(rows) if rows else "<i>the device graph does not list its ops</i>"
        self.accept_button.disabled = rep.batch.mode != "target_verify"
        self._heatmap()
        return True

    def do_accept(self) -> bool:
        m = self.model
        res = m.accept(self.accepted_text.value, seed=int(self.seed.value))
        self.error.value = error_html(m.error)
        if res is None:
            return False
        words = (
            f"accepted {res['num_accepted']}: slots changed {res['changed']}, "
            f"each live slot holds its accepted state: {all(res['holds_accepted_state'])}"
        )
        self.accept_result.value = ok_html(words) if not res["foreign"] else error_html(words)
        self.accept_button.disabled = True
        self._heatmap()
        return True

    def _heatmap(self) -> None:
        changed, allowed, slots, steps = self.model.heatmap_data()
        if not steps:
            return
        dummy = self.model.runner.pool.profile.dummy_slot if self.model.runner else None
        codes = integrity_codes(changed, allowed, dummy, slots)
        words = [
            [f"{steps[i]}, slot {s}: {INTEGRITY_LABELS[c]}" for s, c in zip(slots, r, strict=True)]
            for i, r in enumerate(codes)
        ]
        with self.heatmap.batch_update():
            hm = self.heatmap.data[0]
            hm.z, hm.x, hm.y, hm.customdata = codes, [str(s) for s in slots], steps, words
            self.heatmap.layout.height = max(300, 160 + 28 * len(steps))
