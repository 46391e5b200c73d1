"""The model behind ``CaptureReplayLab``: capture a layer step per bucket, replay steps on random requests,
compare with eager and the float64 reference, keep a history of which slots each step changed.

Plain Python (no ipywidgets). Every user-facing failure comes back as a message (``LabModel.error``),
never as an exception into the notebook.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from workbench.batch import Batch
from workbench.errors import MetadataError, WorkbenchError
from workbench.graphs import available_backends
from workbench.layers import GatedDeltaNetLayer, GDNConfig, Mamba2Config, Mamba2Layer
from workbench.measure.integrity import changed_slots, snapshot
from workbench.pool import StatePool
from workbench.profiles import get_profile
from workbench.runner import Comparison, GraphRunner
from workbench.widgets.explorer_model import parse_int_list

LAYERS = ("gdn", "mamba2")
PRESETS = ("small", "engine")  # the names of workbench.sweeps.common
BACKENDS = ("auto", "cpu", "cuda", "npu")


def backend_choices() -> list[tuple[str, str | None]]:
    """``(backend, reason it cannot run here or None)`` for each choice; "auto" always runs."""
    avail = available_backends()
    return [("auto", None)] + [(b, None if avail.get(b) == "ok" else avail.get(b, "unknown")) for b in BACKENDS[1:]]


def make_layer(layer: str, preset: str, impl: str = "reference") -> Any:
    """A seeded layer: "gdn" (Gated DeltaNet) or "mamba2", "small" (tests, interpreter) or "engine"."""
    if layer not in LAYERS:
        raise MetadataError(f"layer: {layer!r} is not one of {list(LAYERS)}")
    if preset not in PRESETS:
        raise MetadataError(f"preset: {preset!r} is not one of {list(PRESETS)}")
    if layer == "gdn":
        return GatedDeltaNetLayer(GDNConfig.small() if preset == "small" else GDNConfig(), seed=0, impl=impl)
    return Mamba2Layer(Mamba2Config.small() if preset == "small" else Mamba2Config(), seed=0, impl=impl)


@dataclass
class StepReport:
    """One replayed step: the comparison, what it changed, the op list and the two timings."""

    label: str
    batch: Batch
    comparison: Comparison
    changed: list[int]
    allowed: list[int]
    live_slots: list[int]
    eager_us: float | None = None
    replay_us: float | None = None

    @property
    def clean(self) -> bool:
        return self.comparison.integrity.ok


@dataclass
class HistoryRow:
    """Slots one action changed and the slots it was allowed to change (for the integrity heatmap)."""

    label: str
    changed: list[int]
    allowed: list[int] = field(default_factory=list)


class LabModel:
    """Capture and replay one layer on one backend.

    Args:
        layer: "gdn" or "mamba2". preset: "small" or "engine". backend: "auto" | "cpu" | "cuda" | "npu".
        buckets: typed comma-separated batch sizes ("" = 1, 2, 4, 8). draft_tokens: D of target_verify.
        profile: padding convention of the pool. num_slots: state slots (default: (twice the largest bucket + 1)
            x slots per request + 1).
    """

    def __init__(
        self,
        layer: str = "gdn",
        preset: str = "small",
        backend: str = "auto",
        buckets: str = "1, 2, 4, 8",
        draft_tokens: int = 2,
        profile: str = "sglang",
        num_slots: int | None = None,
    ) -> None:
        self.layer_name, self.preset, self.backend = layer, preset, backend
        self.buckets_text, self.draft_tokens, self.profile = buckets, draft_tokens, profile
        self.num_slots = num_slots
        self.runner: GraphRunner | None = None
        self.error: str | None = None
        self.history: list[HistoryRow] = []
        self.last: StepReport | None = None
        self.accepted: dict[str, Any] | None = None

    # -- capture --------------------------------------------------------------------------------------
    def capture(self, progress: Callable[[int, int], None] | None = None) -> bool:
        """Build the layer, pool and runner and capture every bucket; ``progress(done, total)`` after each.
        Returns False (with ``error`` set) on a bad setting or an unavailable backend."""
        self.error, self.runner, self.last, self.accepted = None, None, None, None
        self.history = []
        try:
            buckets = parse_int_list("buckets", self.buckets_text) or [1, 2, 4, 8]
            layer = make_layer(self.layer_name, self.preset)
            reasons = dict(backend_choices())
            if self.backend not in reasons:
                raise MetadataError(f"backend: {self.backend!r} is not one of {list(BACKENDS)}")
            if reasons[self.backend] is not None:
                raise MetadataError(f"backend: {self.backend} is unavailable here: {reasons[self.backend]}")
            dev = self.backend
            if self.backend == "auto":  # the first device backend that runs here, else the CPU recorder
                dev = next((b for b, why in reasons.items() if why is None and b in ("cuda", "npu")), "cpu")
            if dev != "cpu":
                layer = type(layer)(layer.config, seed=0, device=dev, impl="auto")
            # vLLM's verify indices are [bs, D]: each request owns D slots
            per_request = get_profile(self.profile).slots_per_request(self.draft_tokens)
            n = self.num_slots or (2 * max(buckets) + 1) * per_request + 1
            pool = StatePool(n, self.profile, device=dev, slots_per_request=per_request)
            runner = GraphRunner(
                layer, pool, buckets=buckets, draft_tokens=self.draft_tokens, backend=self.backend, state_seed=1
            )
        except (WorkbenchError, ValueError, TypeError, RuntimeError) as e:
            self.error = str(e)
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
            self.error = f"capture failed: {e}"
            return False
        finally:
            runner.graph_backend.capture = inner  # type: ignore[method-assign]
        self.runner = runner
        self._fill_pool()
        self.history.append(HistoryRow("capture", self._changed(before), []))
        return True

    def _fill_pool(self) -> None:
        """Allocate every request the pool holds: a step uses some, the others must stay unchanged."""
        assert self.runner is not None
        pool = self.runner.pool
        pool.free(pool.live_rows)
        pool.alloc(pool.capacity)

    def _changed(self, before: dict[str, torch.Tensor]) -> list[int]:
        assert self.runner is not None
        return sorted({s for _, s in changed_slots(before, self.runner.state.tensors())})

    @property
    def captured(self) -> list[tuple[str, int]]:
        return self.runner.captured if self.runner is not None else []

    @property
    def modes(self) -> tuple[str, ...]:
        return self.runner.modes if self.runner is not None else ()

    # -- a step ----------------------------------------------------------------------------------------
    def step(self, batch_size: int, mode: str = "decode", seed: int = 0, *, time_it: bool = True) -> StepReport | None:
        """Replay ``batch_size`` random requests in ``mode``; compare with eager and the float64 reference.
        Returns None (with ``error`` set) when nothing is captured or the input is bad."""
        self.error = None
        if self.runner is None:
            self.error = "press Capture first: no graph is captured"
            return None
        runner = self.runner
        if mode not in runner.modes:
            self.error = f"mode: {mode!r} not captured for this layer; captured modes: {list(runner.modes)}"
            return None
        pool = runner.pool
        if not 1 <= batch_size <= pool.capacity:
            self.error = f"batch size: {batch_size} is not in [1, {pool.capacity}] (the pool's requests)"
            return None
        rng = random.Random(seed)
        rows = rng.sample(pool.live_rows, batch_size)  # scattered slots, random order
        lens = [rng.randint(4, 400) for _ in rows]
        gen = torch.Generator().manual_seed(seed)
        hidden = runner.layer.config.hidden_size
        if mode == "decode":
            batch = Batch.decode(rows, lens, device=pool.device)
            x = torch.randn(batch_size, hidden, generator=gen)
        else:
            batch = Batch.target_verify(rows, lens, runner.draft_tokens, device=pool.device)
            x = torch.randn(batch_size * runner.draft_tokens, hidden, generator=gen)
        x = x.to(dtype=runner.layer.dtype, device=pool.device)
        live = sorted(s for r in rows for s in pool.slots_of(r))
        before = snapshot(runner.state.tensors())
        try:
            cmp = runner.compare(batch, x)
        except (WorkbenchError, RuntimeError, ValueError) as e:
            self.error = f"replay failed: {e}"
            return None
        changed = self._changed(before)
        label = f"{mode} bs={batch_size} -> {cmp.bucket if cmp.replayed else 'eager'}"
        allowed = sorted(set(live) | {pool.profile.dummy_slot})
        rep = StepReport(label, batch, cmp, changed, allowed, live)
        if time_it:
            rep.eager_us, rep.replay_us = self._time(batch, x)
        self.history.append(HistoryRow(label, changed, live))
        self.last = rep
        return rep

    def _time(self, batch: Batch, x: torch.Tensor) -> tuple[float, float]:
        """Median eager and replay time of this batch (us) on the runner's device (CUDA/NPU events on a GPU/NPU,
        ``torch.utils.benchmark`` on the CPU); the state is restored afterwards, in place."""
        from workbench.measure.timing import time_fn

        assert self.runner is not None
        runner = self.runner
        timed = partial(time_fn, what="lab_step", device=str(runner.pool.device), min_run_time=0.05)
        saved = snapshot(runner.state.tensors())
        try:
            eager = timed(lambda: runner.eager(batch, x), mode="eager").median_us
            replay = timed(lambda: runner.replay(batch, x), mode="replay").median_us
        finally:
            for name, t in runner.state.tensors().items():
                t.copy_(saved[name])  # same tensors: the graphs recorded their addresses
        return eager, replay

    def accept(self, num_accepted: list[int] | str | None = None, seed: int = 0) -> dict[str, Any] | None:
        """After a verify step: accept ``num_accepted`` tokens per live row (typed, or random when None);
        returns which slots changed (only the live rows' may) and whether each holds its accepted state."""
        self.error = None
        rep = self.last
        if self.runner is None or rep is None or rep.batch.mode != "target_verify":
            self.error = "accept: run a target_verify step first"
            return None
        r, d = rep.batch.raw_batch_size, self.runner.draft_tokens
        try:
            if isinstance(num_accepted, str):
                acc = parse_int_list("num_accepted", num_accepted) if num_accepted.strip() else None
            else:
                acc = num_accepted
            if acc is None:
                rng = random.Random(seed)
                acc = [rng.randint(1, d) for _ in range(r)]
            if len(acc) != r or any(not 1 <= a <= d for a in acc):
                raise MetadataError(f"num_accepted: {acc}, need {r} values each in [1, {d}]")
        except WorkbenchError as e:
            self.error = str(e)
            return None
        inter = self.runner.last_intermediate
        before = snapshot(self.runner.state.tensors())
        self.runner.accept(acc)
        changed = self._changed(before)
        ssm = self.runner.state.ssm
        holds = []
        if inter is not None:
            for i, (row, a) in enumerate(zip(rep.batch.req_pool_indices.tolist(), acc, strict=True)):
                slot = self.runner.pool.slots_of(row)[0]
                holds.append(bool(torch.equal(ssm[slot], inter.ssm[i, a - 1])))
        foreign = sorted(set(changed) - set(rep.live_slots))
        self.history.append(HistoryRow(f"accept {acc}", changed, rep.live_slots))
        self.accepted = {"num_accepted": acc, "changed": changed, "foreign": foreign, "holds_accepted_state": holds}
        return self.accepted

    # -- views of the data --------------------------------------------------------------------------------
    def heatmap_data(self) -> tuple[list[list[bool]], list[list[bool]], list[int], list[str]]:
        """``(changed, allowed, slots, steps)`` of the history, for ``viz.integrity_heatmap``."""
        n = self.runner.pool.num_slots if self.runner is not None else 0
        slots = list(range(n))
        changed = [[s in set(h.changed) for s in slots] for h in self.history]
        allowed = [[s in set(h.allowed) for s in slots] for h in self.history]
        return changed, allowed, slots, [f"{i}: {h.label}" for i, h in enumerate(self.history)]

    def ops_rows(self, mode: str | None = None, bucket: int | None = None) -> list[dict[str, Any]]:
        """The recorded ops of one graph (default: the last step's) as rows; empty on a device graph."""
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
