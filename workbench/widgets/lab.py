"""``CaptureReplayLab``: a thin ipywidgets view over :class:`LabModel`.

Every action and every input change re-renders the whole view from the model (``_render``), so nothing on
screen outlives the model state it came from: when the model drops a result, the view drops it too.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go

from workbench import html as wb_html
from workbench.profiles import PROFILES
from workbench.viz import integrity_heatmap
from workbench.viz.metadata import INTEGRITY_LABELS, integrity_codes
from workbench.widgets.figure_sync import updating
from workbench.widgets.html import error_html, records_html
from workbench.widgets.lab_model import (
    CONTROLS,
    INPUTS,
    LAYERS,
    PRESETS,
    PROFILE_METADATA,
    LabModel,
    Verdict,
    backend_choices,
)

_PLACEHOLDER = ([[False]], [[False]], [0], ["(nothing yet)"])


def verdict_html(v: Verdict, css_class: str = "wb-verdict") -> str:
    """A verdict line: ✔ in green when its check passed, ✘ in vermillion when it failed, plain for a fact.
    ``data-ok`` carries the same ("true" | "false" | "none") for tests and browsers."""
    text = html.escape(v.text)
    state = "none" if v.ok is None else str(v.ok).lower()
    if v.ok is None:
        body = f"<span>{text}</span>"
    else:
        mark, colour = ("&#10004;", wb_html.OK) if v.ok else ("&#10008;", wb_html.FAIL)
        body = f"<span style='color:{colour}'>{mark} {text}</span>"
    return f"<div class='{css_class}' data-key='{v.key}' data-ok='{state}' style='white-space:pre-wrap'>{body}</div>"


def _pick(options: tuple[str, ...] | list[str], value: str) -> str | None:
    return value if value in options else None  # an unknown name shows as no choice; the model says why


class CaptureReplayLab(W.VBox):
    """Capture a layer step per bucket on a graph backend, then replay steps and check them.

    Controls: layer, preset, profile (the padding convention: pool and runner are rebuilt at the next
    Capture), backend (unavailable ones marked, with the reason), buckets, D (of target_verify); Capture (with
    a progress bar); then batch size, mode (exactly the modes the model's step takes, ``LabModel.modes``),
    random-requests seed and Replay; Verify + accept after a verify step. Shows how
    the step ran (replayed in its bucket, or eagerly above the largest) and its integrity, a slot heatmap of
    what each action changed (the dummy slot marked), the recorded ops of the replayed graph, and the
    step's timing. A refused value is one line under its control; changing an input clears the results.

    Attributes: ``model`` (:class:`LabModel`), the controls (``layer``, ``preset``, ``profile``,
    ``backend``, ``buckets``, ``draft_tokens``, ``capture_button``, ``progress``, ``batch_size``, ``mode``,
    ``seed``, ``replay_button``, ``accepted_text``, ``accept_button``), ``notes`` (an HTML line under each
    control, keyed as ``CONTROLS``), ``error`` (errors of no one control), ``result`` / ``timing`` /
    ``accept_result`` / ``ops`` (HTML), ``heatmap`` (FigureWidget).
    """

    def __init__(self, **params: Any) -> None:
        self.model = m = LabModel(**params)
        style = {"description_width": "110px"}
        self.layer = W.Dropdown(options=LAYERS, value=_pick(LAYERS, m.layer_name), description="layer", style=style)
        self.preset = W.Dropdown(
            options=PRESETS, value=_pick(PRESETS, m.preset), description="shape preset", style=style
        )
        names = tuple(PROFILES)
        self.profile = W.Dropdown(options=names, value=_pick(names, m.profile), description="profile", style=style)
        from workbench.engines import installed_engines  # reads distribution metadata only: no engine import

        engines = [("workbench profile", PROFILE_METADATA)]
        engines += [(f"{name} (real code)", name) for name in installed_engines()]
        self.metadata = W.Dropdown(
            options=engines,
            value=m.metadata if m.metadata in dict(engines).values() else PROFILE_METADATA,
            description="metadata",
            style=style,
        )
        choices = backend_choices()
        self.backend = W.Dropdown(
            options=[(b if why is None else f"{b} (unavailable)", b) for b, why in choices],
            value=_pick([b for b, _ in choices], m.backend),
            description="backend",
            style=style,
        )
        self.backend_note = W.HTML(
            "<br>".join(f"<small><b>{b}</b> unavailable: {html.escape(why)}</small>" for b, why in choices if why)
        )
        self.buckets = W.Text(value=m.buckets_text, description="buckets", style=style, continuous_update=False)
        self.draft_tokens = W.IntText(
            value=m.draft_tokens,
            description="D",
            tooltip="draft tokens per request of a target_verify step",
            style=style,
        )
        self.capture_button = W.Button(description="Capture", button_style="primary", icon="camera")
        self.progress = W.IntProgress(value=0, min=0, max=1, description="capture")
        self.batch_size = W.IntText(value=3, description="batch size", style=style)
        self.mode = W.Dropdown(options=m.modes, description="mode", style=style)  # what the model's step takes
        self.seed = W.IntText(value=0, description="requests seed", style=style)
        self.replay_button = W.Button(description="Replay", icon="play", disabled=True)
        self.accepted_text = W.Text(value="", placeholder="empty: random", description="accepted", style=style)
        self.accept_button = W.Button(description="Verify + accept", disabled=True)
        self.notes = {c: W.HTML() for c in CONTROLS if c != "general"}
        self.error, self.result, self.timing, self.ops, self.accept_result = (W.HTML() for _ in range(5))
        self.heatmap = go.FigureWidget(integrity_heatmap([[False]], slots=[0], steps=["(nothing yet)"]))
        self.inputs = {
            "layer": self.layer,
            "preset": self.preset,
            "profile": self.profile,
            "backend": self.backend,
            "buckets": self.buckets,
            "draft_tokens": self.draft_tokens,
            "metadata": self.metadata,
        }
        for name, control in self.inputs.items():
            control.observe(lambda change, name=name: self._on_input(name, change["new"]), names="value")
        self.capture_button.on_click(lambda _: self.do_capture())
        self.replay_button.on_click(lambda _: self.do_replay())
        self.accept_button.on_click(lambda _: self.do_accept())
        cell = self._with_note
        super().__init__(
            [
                W.HTML("<b>Capture and replay lab</b>"),
                W.HBox([cell("layer", self.layer), cell("preset", self.preset), cell("profile", self.profile)]),
                W.HBox([cell("backend", self.backend), self.backend_note]),
                W.HBox([cell("metadata", self.metadata)]),
                W.HBox([cell("buckets", self.buckets), cell("draft_tokens", self.draft_tokens)]),
                W.HBox([self.capture_button, self.progress]),
                W.HBox([cell("batch_size", self.batch_size), cell("mode", self.mode), cell("seed", self.seed)]),
                W.HBox([self.replay_button, cell("accepted", self.accepted_text), self.accept_button]),
                self.error,
                self.result,
                self.timing,
                self.accept_result,
                self.heatmap,
                W.HTML("<b>Recorded ops of the replayed graph</b>"),
                self.ops,
            ]
        )
        self._inputs_ok = m.check() is not None  # a refused setting shows under its control at once
        self._render()

    def _with_note(self, name: str, control: W.Widget) -> W.VBox:
        return W.VBox([control, self.notes[name]])

    # -- actions (what the buttons do; tests call these or .click()) -------------------------------------
    def _on_input(self, name: str, value: Any) -> None:
        if value is None:
            return  # a dropdown left without a choice (an unknown name was given)
        self._inputs_ok = self.model.set(**{name: value})
        self._render()

    def do_capture(self) -> bool:
        m = self.model
        self._inputs_ok = m.set(**{n: c.value for n, c in self.inputs.items() if c.value is not None})
        self.progress.value = 0

        def progress(done: int, total: int) -> None:
            self.progress.max = total
            self.progress.value = done

        ok = m.capture(progress)
        if not ok and m.error_control in INPUTS:
            self._inputs_ok = False
        self._render()
        return ok

    def do_replay(self) -> bool:
        rep = self.model.step(int(self.batch_size.value), self.mode.value, int(self.seed.value))
        self._render()
        return rep is not None

    def do_accept(self) -> bool:
        res = self.model.accept(self.accepted_text.value, seed=int(self.seed.value))
        self._render()
        return res is not None

    # -- the view of the model -------------------------------------------------------------------------
    def _render(self) -> None:
        m = self.model
        for name, note in self.notes.items():
            note.value = error_html(m.error) if m.error and m.error_control == name else ""
        general = m.error if m.error and m.error_control == "general" else None
        self.error.value = error_html(general)
        lines = m.verdicts()
        if lines:
            self.result.value = "".join(
                verdict_html(v, "wb-verdict wb-integrity" if v.key == "integrity" else "wb-verdict") for v in lines
            )
        else:
            self.result.value = f"<i>{html.escape(m.notice)}</i>" if m.notice else ""
        self.timing.value = html.escape(m.last.timing_text()) if m.last is not None else ""
        self.accept_result.value = verdict_html(m.accepted.verdict(), "wb-accept") if m.accepted else ""
        rows = m.ops_rows()
        self.ops.value = records_html(rows) if rows else (f"<i>{html.escape(m.ops_note())}</i>" if m.runner else "")
        if m.runner is None:
            self.progress.value = 0
        if tuple(self.mode.options) != m.modes:  # the model is the truth: the modes its step takes, no other
            self.mode.options = m.modes
        self.capture_button.disabled = not self._inputs_ok
        self.replay_button.disabled = m.runner is None
        last = m.last
        self.accept_button.disabled = not (last is not None and last.batch.mode == "target_verify" and not m.accepted)
        self._heatmap()

    def _heatmap(self) -> None:
        changed, allowed, slots, steps = self.model.heatmap_data()
        dummy = self.model.runner.pool.profile.dummy_slot if self.model.runner else None
        if not steps:  # every result was dropped: so is the heatmap
            changed, allowed, slots, steps = _PLACEHOLDER
            dummy = None
        codes = integrity_codes(changed, allowed, dummy, slots)
        words = [
            [f"{steps[i]}, slot {s}: {INTEGRITY_LABELS[c]}" for s, c in zip(slots, r, strict=True)]
            for i, r in enumerate(codes)
        ]
        with updating(self.heatmap):
            hm = self.heatmap.data[0]
            hm.z, hm.x, hm.y, hm.customdata = codes, [str(s) for s in slots], steps, words
            self.heatmap.layout.height = max(300, 160 + 28 * len(steps))
