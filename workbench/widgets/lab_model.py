"""The model behind ``CaptureReplayLab``: capture a layer step per bucket, replay steps on random requests,
compare with eager and the float64 reference, accept after verify, keep a history of which slots each
action changed.

Plain Python (no ipywidgets). Every user-facing failure comes back as one line (``LabModel.error``) with the
control it belongs beside (``LabModel.error_control``, one of ``CONTROLS``), never as an exception into the
notebook. Settings are checked before any work starts (sizes, memory, CPU work: ``lab_plan``). Results say
only what is true: a step that ran eagerly says so and claims no replay; every result (step, accept,
history) is dropped when an input it depends on changes or a capture fails (``generation`` counts these).
Nothing typed is clamped: a value out of range is refused, beside its control. A value of a kind no
control holds (``KINDS``: None, a list, a number for a text), or a name that is no input, refuses the whole
``set`` and takes none of it: the inputs (and the results) stay as they were.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from workbench.batch import Batch
from workbench.engines.versions import SUPPORTED as ENGINES
from workbench.errors import MetadataError, WorkbenchError
from workbench.graphs import available_backends
from workbench.layer_names import DEFAULT_LAYER
from workbench.layers import Intermediate, float64_reference, get_layer_spec
from workbench.limits import check_int
from workbench.measure.integrity import DEFAULT_ATOL, DEFAULT_RTOL, changed_slots, snapshot
from workbench.metadata import build_metadata
from workbench.pool import StatePool
from workbench.profiles import get_profile
from workbench.runner import GraphRunner
from workbench.widgets.explorer_model import kind_error, parse_int_list, shown
from workbench.widgets.lab_plan import (
    BACKENDS,
    LAYERS,
    PRESETS,
    SEED_MAX,
    Plan,
    Refusal,
    layer_config,
    layer_modes,
    make_plan,
)
from workbench.widgets.lab_reports import AcceptReport, HistoryRow, StepReport, Verdict

# what a capture depends on: the control's name -> the model's attribute
INPUTS = {
    "layer": "layer_name",
    "preset": "preset",
    "profile": "profile",
    "backend": "backend",
    "buckets": "buckets_text",
    "draft_tokens": "draft_tokens",
    "metadata": "metadata",
}
PROFILE_METADATA = "profile"
"""The ``metadata`` input's default: the workbench's own backend for the profile (else an engine's name)."""
# the kind of value each input holds (``set`` takes no other) and what a text input holds, in words
KINDS = {name: "int" if name == "draft_tokens" else "text" for name in INPUTS}
TEXTS = {
    "layer": f"one of {list(LAYERS)}",
    "preset": f"one of {list(PRESETS)}",
    "profile": "a profile's name",
    "backend": f"one of {list(BACKENDS)}",
    "buckets": "comma-separated batch sizes, or '' for 1, 2, 4, 8",
    "metadata": f"{PROFILE_METADATA!r} or an engine's name",
}
CONTROLS = (*INPUTS, "batch_size", "mode", "seed", "accepted", "general")

__all__ = [
    "BACKENDS",
    "CONTROLS",
    "INPUTS",
    "LAYERS",
    "PRESETS",
    "PROFILE_METADATA",
    "AcceptReport",
    "HistoryRow",
    "LabModel",
    "StepReport",
    "Verdict",
    "backend_choices",
    "make_layer",
]


def backend_choices() -> list[tuple[str, str | None]]:
    """``(backend, reason it cannot run here or None)`` for each choice; "auto" always runs."""
    avail = available_backends()
    return [("auto", None)] + [(b, None if avail.get(b) == "ok" else avail.get(b, "unknown")) for b in BACKENDS[1:]]


def make_layer(
    layer: str, preset: str, impl: str = "reference", device: str = "cpu", state_layout: str | None = None
) -> Any:
    """A seeded layer (seed 0): a name of ``LAYERS``, "small" (tests, interpreter) or "engine", its state in
    ``state_layout`` (the lab passes its profile's; None: "k_first")."""
    cfg = layer_config(layer, preset)
    return get_layer_spec(layer).make(config=cfg, seed=0, device=device, impl=impl, state_layout=state_layout)


class LabModel:
    """Capture and replay one layer on one backend.

    Args:
        layer: a name of ``LAYERS`` (``workbench.layers.LAYERS``). preset: "small" or "engine".
            backend: "auto" | "cpu" | "cuda" | "npu".
        buckets: typed comma-separated batch sizes ("" = 1, 2, 4, 8). draft_tokens: D of target_verify.
        profile: padding convention of the pool (a name of ``workbench.profiles.PROFILES``). num_slots: state
            slots (default: (twice the largest bucket + 1) x slots per request + 1).
        metadata: ``"profile"`` (the workbench's metadata backend) or an installed engine's name
            (``workbench.engines.installed_engines()``): its own backend, real code, behind the runner's hooks.

    Under vLLM a request owns D slots and verify writes the state after draft token t to its slot t; accept
    copies nothing, and the lab's next verify of that request carries ``num_accepted_tokens`` so it reads
    slot ``num_accepted - 1``. (A decode step reads slot 0, as the workbench's vLLM decode does.)
    """

    def __init__(
        self,
        layer: str = DEFAULT_LAYER,
        preset: str = "small",
        backend: str = "auto",
        buckets: str = "1, 2, 4, 8",
        draft_tokens: int = 2,
        profile: str = "sglang",
        num_slots: int | None = None,
        metadata: str = PROFILE_METADATA,
    ) -> None:
        self.layer_name, self.preset, self.backend = layer, preset, backend
        self.metadata = metadata
        self.engine_label = ""
        self.buckets_text, self.draft_tokens, self.profile = buckets, draft_tokens, profile
        self.num_slots = num_slots
        self.runner: GraphRunner | None = None
        self.plan: Plan | None = None
        self.error: str | None = None
        self.error_control = "general"
        self.notice: str | None = None
        self.history: list[HistoryRow] = []
        self.last: StepReport | None = None
        self.accepted: AcceptReport | None = None
        self.generation = 0  # +1 each time the results are dropped
        self._accepted_counts: dict[int, int] = {}  # vLLM: request row -> tokens accepted at its last verify

    # -- settings --------------------------------------------------------------------------------------
    def _fail(self, control: str, message: str) -> None:
        self.error, self.error_control = message, control if control in CONTROLS else "general"

    def _clear(self) -> None:
        """Drop the runner and every result: they describe settings or a capture that is gone."""
        self.runner, self.plan, self.last, self.accepted = None, None, None, None
        self.history, self._accepted_counts = [], {}
        self.generation += 1

    def check(self) -> Plan | None:
        """Check the settings without building anything (microseconds); None with ``error`` set if refused."""
        self.error, self.error_control = None, "general"
        try:
            plan = make_plan(
                self.layer_name,
                self.preset,
                self.profile,
                self.backend,
                self.buckets_text,
                self.draft_tokens,
                self.num_slots,
                dict(backend_choices()),
            )
            if self.metadata != PROFILE_METADATA and (
                not isinstance(self.metadata, str) or self.metadata not in ENGINES
            ):
                raise Refusal(
                    "metadata",
                    f"metadata: {shown(self.metadata)} is not {PROFILE_METADATA!r} or one of {tuple(ENGINES)}",
                )
            return plan
        except Refusal as r:
            self._fail(r.control, str(r))
        except WorkbenchError as e:
            self._fail("general", str(e))
        return None

    def set(self, **changes: Any) -> bool:
        """Change capture inputs (``INPUTS``: layer, preset, profile, backend, buckets, draft_tokens).

        A value that differs drops the runner and every result (they no longer describe the settings) and
        says so in ``notice``. The new settings are checked at once; False (``error`` beside the control)
        when refused.
        """
        unknown = sorted(set(changes) - set(INPUTS))
        if unknown:
            self._fail("general", f"set: {unknown} are not lab inputs; inputs are {list(INPUTS)}")
            return False
        for k, v in changes.items():
            why = kind_error(k, KINDS[k], v, TEXTS.get(k, ""))
            if why is not None:
                self._fail(k, f"{why}; not taken, still {shown(getattr(self, INPUTS[k]))}")
                return False
        changed = [k for k, v in changes.items() if getattr(self, INPUTS[k]) != v]
        for k, v in changes.items():
            setattr(self, INPUTS[k], v)
        if changed and (self.runner is not None or self.history):
            self._clear()
            self.notice = f"{', '.join(changed)} changed: results cleared; press Capture to rebuild the pool and runner"
        return self.check() is not None

    # -- capture ---------------------------------------------------------------------------------------
    def capture(self, progress: Callable[[int, int], None] | None = None) -> bool:
        """Check the settings, build the layer, pool and runner and capture every bucket; ``progress(done,
        total)`` after each. Returns False (``error`` set, every earlier result dropped) when refused or failed."""
        self._clear()
        self.notice = None
        plan = self.check()
        if plan is None:
            return False
        try:
            dev = plan.device
            engine_backend = self._engine_backend(plan)
            impl = "reference" if dev == "cpu" else "auto"
            layer = make_layer(plan.layer, plan.preset, impl, dev, get_profile(plan.profile).state_layout)
            pool = StatePool(plan.num_slots, plan.profile, device=dev, slots_per_request=plan.per_request)
            runner = GraphRunner(
                layer,
                pool,
                buckets=plan.buckets,
                draft_tokens=plan.draft_tokens,
                backend=dev,
                state_seed=1,
                metadata_backend=engine_backend,
            )
        except Refusal as r:
            self._fail(r.control, str(r))
            return False
        except (WorkbenchError, ValueError, TypeError, RuntimeError) as e:
            self._fail("general", str(e))
            return False
        total = sum(len(runner.buckets(m)) for m in runner.modes)
        done = [0]
        inner = runner.graph_backend.capture

        def counting(fn: Any, **kw: Any) -> Any:
            g = inner(fn, **kw)
            done[0] += 1
            if progress is not None:
                progress(done[0], total)
            return g

        runner.graph_backend.capture = counting  # type: ignore[method-assign]
        before = snapshot(runner.state.tensors())
        try:
            runner.capture(progress=False)
        except (WorkbenchError, RuntimeError) as e:
            self._fail("general", f"capture failed: {e}")
            return False
        finally:
            runner.graph_backend.capture = inner  # type: ignore[method-assign]
        self.runner, self.plan = runner, plan
        pool.free(pool.live_rows)
        pool.alloc(pool.capacity)  # every request the pool holds: a step uses some, the others must stay put
        self.history.append(HistoryRow("capture", self._changed(before), []))
        return True

    def _engine_backend(self, plan: Plan) -> Any:
        """The engine's backend class for the runner, or None for the workbench's own (``metadata``)."""
        if self.metadata == PROFILE_METADATA:
            return None
        import workbench.engines as engines  # an engine is imported only when one is chosen
        from workbench.engines.base import probe_pool
        from workbench.engines.subject import engine_backend

        if self.metadata not in engines.SUPPORTED:
            raise Refusal(
                "metadata", f"metadata: {self.metadata!r} is not 'profile' or one of {tuple(engines.SUPPORTED)}"
            )
        adapter = engines.adapter_class(self.metadata)
        probe = adapter(probe_pool(adapter, plan.draft_tokens), plan.buckets, plan.draft_tokens, layer=plan.layer)
        if probe.profile != plan.profile:
            raise Refusal(
                "metadata",
                f"metadata: {probe.label} implements the {probe.profile!r} profile; choose it "
                f"(profile is {plan.profile!r})",
            )
        self.engine_label = probe.label
        return engine_backend(adapter, layer=plan.layer)

    def _changed(self, before: dict[str, torch.Tensor]) -> list[int]:
        assert self.runner is not None
        return sorted({s for _, s in changed_slots(before, self.runner.state.tensors())})

    @property
    def captured(self) -> list[tuple[str, int]]:
        return self.runner.captured if self.runner is not None else []

    @property
    def modes(self) -> tuple[str, ...]:
        """The modes :meth:`step` takes: the captured runner's, else those a capture of the current layer
        will have (decode, and target_verify with its ``draft_tokens`` D); none while the layer is refused.
        The view's mode dropdown lists exactly these."""
        if self.runner is not None:
            return self.runner.modes
        return layer_modes(self.layer_name) if self.layer_name in LAYERS else ()

    def capture_text(self) -> str:
        """What the capture left: its graphs, or "" when nothing is captured."""
        if self.runner is None:
            return ""
        engine = f" with {self.engine_label}" if self.metadata != PROFILE_METADATA and self.engine_label else ""
        return f"captured {len(self.captured)} graphs{engine}: {self.captured}"

    # -- a step ----------------------------------------------------------------------------------------
    def step(self, batch_size: int, mode: str = "decode", seed: int = 0, *, time_it: bool = True) -> StepReport | None:
        """Run ``batch_size`` random requests in ``mode``: replayed in their bucket, or eagerly above the
        largest; compared with eager and the float64 reference. None (``error`` set) when refused or failed;
        a failed step drops the previous step's and accept's results and logs what it changed."""
        self.error, self.notice = None, None
        runner, plan = self.runner, self.plan
        if runner is None or plan is None:
            self._fail("general", "press Capture first: no graph is captured")
            return None
        if mode not in runner.modes:
            self._fail("mode", f"mode: {mode!r} not captured for this layer; captured modes: {list(runner.modes)}")
            return None
        try:
            check_int("requests seed", seed, 0, SEED_MAX)
        except MetadataError as e:
            self._fail("seed", str(e))
            return None
        try:
            plan.check_step(batch_size, mode)
        except Refusal as refusal:
            self._fail(refusal.control, str(refusal))
            return None
        batch, x = self._draw(batch_size, mode, seed)
        pool = runner.pool
        rows = batch.req_pool_indices.tolist()
        live = sorted(s for r in rows for s in pool.slots_of(r))
        before = snapshot(runner.state.tensors())
        kept = runner.state.clone() if mode == "target_verify" else None
        try:
            cmp = runner.compare(batch, x)
        except (WorkbenchError, RuntimeError, ValueError) as e:
            self._fail("general", f"replay failed: {e}")
            self.last, self.accepted = None, None
            self.generation += 1
            self.history.append(HistoryRow(f"FAILED {mode} bs={batch_size}", self._changed(before), live))
            return None
        for row in rows:
            self._accepted_counts.pop(row, None)  # this step consumed (or, in decode, bypassed) the last accept
        changed = self._changed(before)
        label = f"{mode} bs={batch_size} -> {cmp.bucket if cmp.replayed else 'eager'}"
        allowed = sorted(set(live) | {pool.profile.dummy_slot})
        largest = runner.buckets(runner.meta_backend.graph_mode_of(batch))[-1]
        rep = StepReport(label, batch, cmp, changed, allowed, live, backend=runner.graph_backend.name)
        rep.largest_bucket, rep.before, rep.inputs = largest, kept, x if kept is not None else None
        if time_it:
            rep.eager_us, rep.replay_us = self._time(batch, x, replayed=cmp.replayed)
        self.history.append(HistoryRow(label, changed, live))
        self.last, self.accepted = rep, None
        return rep

    def _draw(self, batch_size: int, mode: str, seed: int) -> tuple[Batch, torch.Tensor]:
        """``batch_size`` random requests of the pool (scattered slots, random order), their inputs."""
        assert self.runner is not None
        runner, pool = self.runner, self.runner.pool
        rng = random.Random(seed)
        rows = rng.sample(pool.live_rows, batch_size)
        lens = [rng.randint(4, 400) for _ in rows]
        gen = torch.Generator().manual_seed(seed)
        hidden = runner.layer.config.hidden_size
        if mode == "decode":
            batch = Batch.decode(rows, lens, device=pool.device)
            x = torch.randn(batch_size, hidden, generator=gen)
        else:
            acc = None
            if pool.profile.spec_indices_2d:  # read the state the last accept left: slot num_accepted - 1
                acc = [self._accepted_counts.get(r, 1) for r in rows]
            batch = Batch.target_verify(rows, lens, runner.draft_tokens, num_accepted_tokens=acc, device=pool.device)
            x = torch.randn(batch_size * runner.draft_tokens, hidden, generator=gen)
        return batch, x.to(dtype=runner.layer.dtype, device=pool.device)

    def _time(self, batch: Batch, x: torch.Tensor, *, replayed: bool) -> tuple[float, float | None]:
        """Median eager time of this batch (us) and, when it has a graph, its replay time, on the runner's
        device; the state and the verify buffers are restored afterwards, in place."""
        from workbench.measure.timing import time_fn

        assert self.runner is not None
        runner = self.runner
        timed = partial(time_fn, what="lab_step", device=str(runner.pool.device), min_run_time=0.05)
        kept = dict(runner.state.tensors())
        inter = runner.last_intermediate
        if inter is not None:
            kept |= {"intermediate.conv": inter.conv, "intermediate.ssm": inter.ssm}
        saved = snapshot(kept)
        try:
            eager = timed(lambda: runner.eager(batch, x), mode="eager").median_us
            # last, so the runner's last step is the graph's again, as after compare
            replay = timed(lambda: runner.replay(batch, x), mode="replay").median_us if replayed else None
        finally:
            for name, t in kept.items():
                t.copy_(saved[name])  # same tensors: the graphs recorded their addresses
        return eager, replay

    # -- accept ----------------------------------------------------------------------------------------
    def accept(self, num_accepted: list[int] | str | None = None, seed: int = 0) -> AcceptReport | None:
        """After a verify step: accept ``num_accepted`` tokens per live row (typed, or random when None or
        ""), then check each request's accepted slot against the float64 reference of that step."""
        self.error, self.notice = None, None
        rep, runner = self.last, self.runner
        if runner is None or rep is None or rep.batch.mode != "target_verify" or rep.before is None:
            self._fail("accepted", "accept: run a target_verify step first")
            return None
        if self.accepted is not None:
            self._fail("accepted", "accept: this verify step is accepted already; run another target_verify step")
            return None
        r, d = rep.batch.raw_batch_size, runner.draft_tokens
        try:
            check_int("accept seed", seed, 0, SEED_MAX)
        except MetadataError as e:
            self._fail("seed", str(e))
            return None
        try:
            if num_accepted is None or isinstance(num_accepted, str):
                acc = parse_int_list("num_accepted", num_accepted) if num_accepted else []
            elif isinstance(num_accepted, list | tuple):
                acc = list(num_accepted)
            else:
                raise MetadataError(
                    f"num_accepted must be typed counts ('2, 1'), a list of ints or None (random), "
                    f"got {shown(num_accepted)}",
                    field="num_accepted",
                )
            if not acc:
                rng = random.Random(seed)
                acc = [rng.randint(1, d) for _ in range(r)]
            if len(acc) != r or any(isinstance(a, bool) or not isinstance(a, int) or not 1 <= a <= d for a in acc):
                raise MetadataError(
                    f"num_accepted: {shown(acc)}, need {r} values each in [1, {d}]", field="num_accepted"
                )
        except WorkbenchError as e:
            self._fail("accepted", str(e))
            return None
        before = snapshot(runner.state.tensors())
        try:
            runner.accept(acc)
        except (WorkbenchError, RuntimeError) as e:
            self._fail("general", f"accept failed: {e}")
            self.generation += 1
            self.history.append(HistoryRow(f"FAILED accept {acc}", self._changed(before), rep.live_slots))
            return None
        changed = self._changed(before)
        self.accepted = self._check_accepted(rep, acc, changed)
        self.history.append(HistoryRow(f"accept {acc}", changed, rep.live_slots))
        return self.accepted

    def accepted_slot(self, row: int, num_accepted: int) -> int:
        """The slot that holds request ``row``'s state after ``num_accepted`` tokens: its slot, or under
        vLLM's per-draft layout its slot ``num_accepted - 1`` (where the next verify reads)."""
        assert self.runner is not None
        slots = self.runner.pool.slots_of(row)
        return slots[num_accepted - 1] if self.runner.pool.profile.spec_indices_2d else slots[0]

    def _reference_steps(self, rep: StepReport) -> Intermediate:
        """The float64 reference of the verify step ``rep``: the state after each draft token, per row."""
        assert self.runner is not None and rep.before is not None and rep.inputs is not None
        runner = self.runner
        layer: Any = runner.layer  # a workbench layer (the lab builds it): float64_reference needs its .to
        ref = float64_reference(layer)
        meta = build_metadata(rep.batch, runner.pool, bucket=None)
        inter = ref.new_intermediate(rep.batch.raw_batch_size, runner.draft_tokens, torch.float64)
        ref.forward(rep.inputs.double(), meta, rep.before.to(torch.float64), inter)
        return inter

    def _check_accepted(self, rep: StepReport, acc: list[int], changed: list[int]) -> AcceptReport:
        assert self.runner is not None
        runner = self.runner
        ref = self._reference_steps(rep)
        atol, rtol = DEFAULT_ATOL[torch.float32], DEFAULT_RTOL[torch.float32]
        per_slot = runner.pool.profile.spec_indices_2d
        slots, holds, errors = [], [], []
        for i, (row, a) in enumerate(zip(rep.batch.req_pool_indices.tolist(), acc, strict=True)):
            slot = self.accepted_slot(row, a)
            ok, err = True, 0.0
            for got, want in (
                (runner.state.ssm[slot], ref.ssm[i, a - 1]),
                (runner.state.conv[slot], ref.conv[i, a - 1]),
            ):
                diff = (got.double() - want).abs()
                ok = ok and bool((diff <= atol + rtol * want.abs()).all())  # NaN fails
                err = max(err, float(diff.max()))
            slots.append(slot)
            holds.append(ok)
            errors.append(err)
            if per_slot:
                self._accepted_counts[row] = a
        foreign = sorted(set(changed) - set(rep.live_slots))
        return AcceptReport(
            acc, changed, foreign, slots, holds, errors, per_slot=per_slot, profile=runner.pool.profile.name
        )

    # -- views of the data --------------------------------------------------------------------------------
    def verdicts(self) -> list[Verdict]:
        """The last step's lines (how it ran, integrity), or the capture's, or nothing."""
        if self.last is not None:
            return self.last.verdicts()
        text = self.capture_text()
        return [Verdict(True, text, "capture")] if text else []

    def heatmap_data(self) -> tuple[list[list[bool]], list[list[bool]], list[int], list[str]]:
        """``(changed, allowed, slots, steps)`` of the history, for ``viz.integrity_heatmap``."""
        n = self.runner.pool.num_slots if self.runner is not None else 0
        slots = list(range(n))
        changed = [[s in set(h.changed) for s in slots] for h in self.history]
        allowed = [[s in set(h.allowed) for s in slots] for h in self.history]
        return changed, allowed, slots, [f"{i}: {h.label}" for i, h in enumerate(self.history)]

    def ops_rows(self, mode: str | None = None, bucket: int | None = None) -> list[dict[str, Any]]:
        """The recorded ops of one graph (default: the last step's) as rows; empty on a device graph, and
        when the last step ran eagerly (no graph ran)."""
        if self.runner is None:
            return []
        if mode is None or bucket is None:
            if self.last is None or self.last.comparison.bucket is None:
                return []
            mode, bucket = self.last.batch.mode, self.last.comparison.bucket
        ops = self.runner.graph(mode, bucket).ops
        if ops is None:
            return []
        return [
            {
                "#": op.index,
                "op": op.name,
                "inputs": " ".join(map(str, op.inputs)),
                "mutates": ",".join(op.mutates),
                "outputs": " ".join(map(str, op.outputs)),
                "replay": op.replay,
                "note": op.note,
            }
            for op in ops
        ]

    def ops_note(self) -> str:
        """Why the ops table is empty: no step yet, an eager step, or a device graph that lists none."""
        if self.runner is None or self.last is None:
            return "no step yet: press Replay"
        if not self.last.replayed:
            return f"no graph ran: {self.last.comparison.reason}, so the step ran eagerly"
        if self.runner.graph(self.last.batch.mode, self.last.comparison.bucket).ops is None:
            return f"the {self.runner.graph_backend.name} graph does not list its ops"
        return ""
