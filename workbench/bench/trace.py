"""`workbench bench trace`: what `workbench trace check` costs on the CLI's own traces, against the float64
recurrence any checker must compute.

Workloads (:data:`WORKLOADS`): the traces ``workbench trace run`` simulates with its defaults (profile sglang,
layer gdn, seed 0, no speculation, no prefix cache) and with each flag the CLI documents: ``--spec 2``,
``--prefix-cache no_buffer``, ``--prefix-cache extra_buffer``, ``--profile vllm --prefix-cache align`` and
``--layer mamba2``. Each is simulated, replayed with ``record=True`` and written, as ``trace run --out F``
does, then checked as ``trace check F`` does (read the file, replay every step beside the float64 shadow).
The check is the figure: CPU seconds (``time.process_time``) beside wall seconds, at the torch thread count
printed with it, and its split by phase (:data:`workbench.traces.replay.PHASES`, CPU seconds).

The baseline (:class:`Float64Baseline`) is the float64 recurrence over the same rows and tokens, batched per
step, what any checker must compute once: the float64 reference layer's step (``float64_reference``: the
kernels' torch references, called without the custom-op dispatch) over each batch the shadow ran, a verify's
commit included, on a float64 pool; its metadata and inputs made beforehand, untimed; no graphs, no checks,
no prefix cache. Its batches are the shadow's own, taken from the ``trace run`` replay (the check itself is
never instrumented). It runs between the check's steps, :data:`PAIR_EVERY` steps of it after each
:data:`PAIR_EVERY` steps checked, its seconds left out of the check's: the two are measured over the same
minutes, so a load that moves in the meantime moves both (measured one after the other on a loud day, the same
1,000-step baseline read 1.10 to 1.87 CPU-s in three runs within half a minute). ``ratio`` is check CPU over
baseline CPU; ``checking_ratio`` leaves out the replay phase (the float32 runner: the engine's step under test,
which costs about what the float64 step does), so it is what the checking adds to the subject's own run;
``subject_ratio`` is that phase alone over the baseline.
The shadow computes the baseline's batches, so ``1 + subject_ratio`` is the least any check of this subject
can cost (the goals line prints it).

The goals (issue 33): the default 2,000-step trace checked in at most 2x the baseline, and 10,000 steps of
every workload checked in under 30 s on a quiet machine. At one thread a quiet machine's wall clock shows the
CPU seconds; on a shared one even those grow with the other tenants' load (``wall / cpu`` is printed too), so a
fixed :class:`Calibrator` is sampled before, during (every :data:`CALIBRATE_EVERY` steps, its time left out)
and after each check with its baseline, and each figure is also given at the run's quietest moment
(``quiet_*``; the ratio needs no such scaling: its two terms ran side by side).
``quick`` checks 1,000 steps of each workload and gives its seconds per 10,000 steps by proportion (the cost
per step is flat: ``second half / first`` compares the medians of the two halves of the steps).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from workbench import threads
from workbench.layer_names import GDN, MAMBA2
from workbench.measure.timing import Results, TimingRecord, environment
from workbench.metadata import Metadata
from workbench.traces.format import read_trace, write_trace
from workbench.traces.model import Trace, TraceHeader
from workbench.traces.replay import PhaseTimer, TraceReplayer, TraceResult, replay_trace
from workbench.traces.simulate import simulate

WORKLOADS: dict[str, tuple[str, dict[str, Any]]] = {
    "default": ("workbench trace run", {}),
    "spec2": ("workbench trace run --spec 2", {"spec": 2}),
    "no_buffer": ("workbench trace run --prefix-cache no_buffer", {"prefix_cache": "no_buffer"}),
    "extra_buffer": ("workbench trace run --prefix-cache extra_buffer", {"prefix_cache": "extra_buffer"}),
    "align": ("workbench trace run --profile vllm --prefix-cache align", {"profile": "vllm", "prefix_cache": "align"}),
    MAMBA2: (f"workbench trace run --layer {MAMBA2}", {"layer": MAMBA2}),
}
"""The CLI's trace kinds: name -> (the command line, less ``--steps`` and ``--out``; the options it gives
``simulate`` beyond the CLI's defaults)."""

CLI_DEFAULTS: dict[str, Any] = {"profile": "sglang", "layer": GDN, "seed": 0}
"""What ``workbench trace run`` passes ``simulate`` when a flag is not given (``workbench/traces/cli.py``); every
other option keeps ``SimConfig``'s default there and here."""

RATIO_STEPS = 2_000
"""Steps of the default trace whose check is held to the baseline ratio."""

GOAL_RATIO = 2.0
GOAL_SECONDS = 30.0  # per 10,000 steps of any workload, quiet machine
GOAL_STEPS = 10_000
QUICK_STEPS = 1_000
PAIR_EVERY = 50
"""Steps of the check between two runs of the baseline over the same steps (about 0.3 s and 0.1 s of CPU here)."""


class CpuPhases(PhaseTimer):
    """The replay's timer in CPU seconds (``time.process_time``): phase totals in ``seconds``, the phase now
    running in ``phase``, and each step's CPU seconds in ``per_step`` (:meth:`step_done`). Given a
    :class:`Calibrator`, it samples it every ``every`` steps, between steps; given a :class:`Float64Baseline`,
    it advances it to the steps done every ``pair_every`` steps and after the last. The CPU seconds of both
    are kept in ``excluded`` and their wall seconds in ``excluded_wall`` (outside every phase and step)."""

    def __init__(
        self,
        calibrator: Calibrator | None = None,
        every: int = 500,
        baseline: Float64Baseline | None = None,
        pair_every: int = PAIR_EVERY,
    ) -> None:
        super().__init__()
        self.per_step: list[float] = []
        self.calibrator, self.every = calibrator, every
        self.baseline, self.pair_every = baseline, pair_every
        self.samples: list[float] = []
        self.excluded = self.excluded_wall = 0.0
        self._step_start = time.process_time()

    def __call__(self, phase: str | None) -> None:
        now = time.process_time()
        if self._phase is not None:
            self.lap(self._phase, now - self._start)
        self._phase, self._start = phase, now

    @property
    def phase(self) -> str | None:
        return self._phase

    def step_done(self, done: int, total: int) -> None:
        """``replay_trace``'s progress callback: one more step's CPU seconds (then, when due, the baseline's
        calls of the steps done and a calibrator sample, outside the step)."""
        now, wall = time.process_time(), time.perf_counter()
        self.per_step.append(now - self._step_start)
        if self.baseline is not None and (done % self.pair_every == 0 or done == total):
            self.baseline.advance(done)
        if self.calibrator is not None and done % self.every == 0:
            self.samples.append(self.calibrator.sample())
        later = time.process_time()
        self.excluded += later - now
        self.excluded_wall += time.perf_counter() - wall
        self._step_start = later


@dataclass
class ShadowCall:
    """One call the shadow made: a layer step (``x``, its unpadded metadata, verify rows with buffers) or a
    verify's commit (``accept``: its counts, and the steps a tree commits)."""

    kind: str
    meta: Metadata
    step: int  # the index of the trace step it belongs to
    x: torch.Tensor | None = None
    verify_rows: int = 0
    counts: torch.Tensor | None = None
    accept: dict[str, torch.Tensor] = field(default_factory=dict)


def record_shadow(replayer: TraceReplayer, timer: CpuPhases) -> list[ShadowCall]:
    """Keep every float64 step and commit ``replayer``'s shadow makes from now on (its reference's ``forward``
    in the ``reference`` phase, ``accept`` in the ``check`` phase: the prefix cache's recomputations of
    checkpoints run in the ``prefix`` phase and are not the recurrence over the step's rows), each with the step
    it belongs to: the steps ``timer`` has been told of (run the replay with ``progress=timer.step_done``)."""
    ref, calls = replayer.ref, []
    forward, accept = ref.forward, ref.accept
    last: dict[int, Metadata] = {}  # id of the shadow's metadata object -> its recorded copy

    def on_forward(x: torch.Tensor, meta: Metadata, state: Any, inter: Any = None) -> torch.Tensor:
        if timer.phase == "reference":
            copy = meta.clone()
            last.clear()
            last[id(meta)] = copy
            rows = 0 if inter is None else int(inter.ssm.shape[0])
            calls.append(ShadowCall("forward", copy, len(timer.per_step), x=x.clone(), verify_rows=rows))
        return forward(x, meta, state, inter)

    def on_accept(state: Any, inter: Any, meta: Metadata, counts: Any, **kw: Any) -> None:
        if timer.phase == "check":
            copy = last.get(id(meta)) or meta.clone()
            steps = {k: v.clone() for k, v in kw.items() if isinstance(v, torch.Tensor)}
            kept = None if counts is None else counts.clone()
            calls.append(ShadowCall("accept", copy, len(timer.per_step), counts=kept, accept=steps))
        return accept(state, inter, meta, counts, **kw)

    ref.forward, ref.accept = on_forward, on_accept
    return calls


class Float64Baseline:
    """The float64 recurrence over the shadow's batches (``calls``, :func:`record_shadow`) of a replay whose
    float64 reference layer is ``ref`` and whose trace's header is ``header``: on a fresh float64 pool, batched
    per step as the shadow ran them, in inference mode as the replay's steps. :meth:`advance` runs the calls
    of the steps done so far; ``cpu_s`` is the CPU seconds they took, ``done`` how many calls ran."""

    def __init__(self, ref: Any, header: TraceHeader, calls: list[ShadowCall]) -> None:
        self.ref, self.header, self.calls = ref, header, calls
        self.state = ref.new_state(header.num_slots, seed=1, dtype=torch.float64)
        self.inter: Any = None
        self.done = 0
        self.cpu_s = 0.0

    def advance(self, steps: int) -> None:
        """Run every call not yet run of the first ``steps`` steps."""
        ref, h, calls = self.ref, self.header, self.calls
        forward, accept = type(ref).forward, type(ref).accept  # the class's: record_shadow's hooks are the instance's
        with torch.inference_mode():
            start = time.process_time()
            while self.done < len(calls) and calls[self.done].step < steps:
                c = calls[self.done]
                if c.kind == "forward":
                    assert c.x is not None
                    rows = c.verify_rows
                    self.inter = ref.new_intermediate(rows, h.draft_tokens, torch.float64) if rows else None
                    forward(ref, c.x, c.meta, self.state, self.inter)
                else:
                    accept(ref, self.state, self.inter, c.meta, c.counts, **c.accept)
                self.done += 1
            self.cpu_s += time.process_time() - start


class Calibrator:
    """A fixed CPU workload of the replay's kind (a float64 Gated DeltaNet decode step of four rows on the small
    layer, :data:`CALIBRATION_CALLS` times), sampled before, during and after each measurement.

    On a shared machine a process's CPU seconds grow with the load (the other tenants' work slows each
    instruction: shared cores and caches), so the same check reads 25 or 38 CPU-s an hour apart. The least the
    calibrator took in the run (``best``) is the nearest this machine came to quiet; a measurement whose
    samples took ``m`` (their median) is scaled by ``best / m`` (:meth:`quiet`): what it would have read at
    the run's quietest moment, the quiet-machine figure if that moment was quiet."""

    def __init__(self) -> None:
        from workbench.batch import Batch
        from workbench.layers import float64_reference, make_layer
        from workbench.metadata import build_metadata
        from workbench.pool import StatePool

        self.layer = float64_reference(make_layer(GDN))
        pool = StatePool(8, "sglang")
        rows = pool.alloc(4)
        self.meta = build_metadata(Batch.decode(rows, [5, 6, 7, 8]), pool, bucket=None)
        self.state = self.layer.new_state(8, seed=0, dtype=torch.float64)
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(4, self.layer.config.hidden_size, generator=g, dtype=torch.float64)
        self.samples: list[float] = []

    def sample(self, reps: int = 3) -> float:
        """The least CPU seconds of ``reps`` runs of the workload now (also kept in ``samples``)."""
        best = float("inf")
        with torch.inference_mode():
            for _ in range(reps):
                start = time.process_time()
                for _ in range(CALIBRATION_CALLS):
                    self.layer.forward(self.x, self.meta, self.state)
                best = min(best, time.process_time() - start)
        self.samples.append(best)
        return best

    @property
    def best(self) -> float:
        return min(self.samples)

    def quiet(self, seconds: float, during: list[float]) -> float:
        """``seconds`` measured while the calibrator's samples ``during`` were taken, at the run's quietest
        moment."""
        return seconds * self.best / statistics.median(during)


CALIBRATION_CALLS = 50
CALIBRATE_EVERY = 500  # steps of a check between calibrator samples


def simulated(name: str, steps: int) -> Trace:
    """The trace ``workbench trace run`` simulates for workload ``name`` with ``--steps steps``."""
    _, options = WORKLOADS[name]
    opts = {**CLI_DEFAULTS, **options}
    return simulate(opts.pop("profile"), opts.pop("layer"), steps=steps, **opts)


def measure(name: str, steps: int, device: str = "cpu", calibrator: Calibrator | None = None) -> dict[str, Any]:
    """Simulate workload ``name`` (``steps`` steps), replay it recording what each step used (``trace run
    --out``, whose shadow calls the baseline takes), then check the written file (``trace check``) with the
    baseline run between its steps (:data:`PAIR_EVERY`): the figures of :func:`run`'s table, with the check's
    per-step CPU seconds under ``per_step`` and the calibrator's samples around and during the two under
    ``calibration`` (:class:`Calibrator`)."""
    cal = calibrator or Calibrator()
    backend = "cpu" if device == "auto" else device
    t0 = time.process_time()
    trace = simulated(name, steps)
    simulate_cpu = time.process_time() - t0
    recorder = CpuPhases()
    first = TraceReplayer(trace, backend=backend, timer=recorder, record=True)
    calls = record_shadow(first, recorder)
    first.run(progress=recorder.step_done, stop_at_first=False)  # the steps tell record_shadow where it is
    recorded = first.recorded_trace()
    paired = Float64Baseline(first.ref, trace.header, calls)
    del calls, first
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{name}.jsonl")
        write_trace(recorded, path, check=False)
        del recorded, trace
        timer = CpuPhases(cal, every=CALIBRATE_EVERY, baseline=paired, pair_every=PAIR_EVERY)
        before = cal.sample()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        result: TraceResult = replay_trace(read_trace(path), backend=backend, timer=timer, progress=timer.step_done)
        check_cpu = time.process_time() - cpu0 - timer.excluded
        check_wall = time.perf_counter() - wall0 - timer.excluded_wall
        around_check = [before, *timer.samples, cal.sample()]
    paired.advance(len(timer.per_step))  # the steps since the last pairing, where the check stopped early
    baseline = paired.cpu_s
    phases = {k: round(v, 3) for k, v in timer.seconds.items()}
    replay_phase = timer.seconds["replay"]
    half = len(timer.per_step) // 2
    flat = (
        statistics.median(timer.per_step[half:]) / max(statistics.median(timer.per_step[:half]), 1e-12) if half else 1.0
    )
    return {
        "command": f"{WORKLOADS[name][0]} --steps {steps} --out F; workbench trace check F",
        "steps": steps,
        "ok": result.ok,
        "divergences": len(result.divergences),
        "graph_steps": result.graph_steps,
        "eager_steps": result.eager_steps,
        "simulate_cpu_s": round(simulate_cpu, 3),
        "check_cpu_s": round(check_cpu, 3),
        "check_wall_s": round(check_wall, 3),
        "baseline_cpu_s": round(baseline, 3),
        "ratio": round(check_cpu / baseline, 3) if baseline else None,
        "checking_ratio": round((check_cpu - replay_phase) / baseline, 3) if baseline else None,
        "subject_ratio": round(replay_phase / baseline, 3) if baseline else None,
        "phases_cpu_s": phases,
        "other_cpu_s": round(check_cpu - sum(timer.seconds.values()), 3),
        "per_10k_cpu_s": round(check_cpu * GOAL_STEPS / steps, 2),
        "second_half_ratio": round(flat, 3),
        "baseline_calls": paired.done,  # of the shadow's calls, run over the steps the check ran
        "shadow_calls": len(paired.calls),
        "paired_every": PAIR_EVERY,
        "calibration": {"check": around_check},  # around and during the check, the baseline run between its steps
        "per_step": timer.per_step,
    }


def calibrated(m: dict[str, Any], cal: Calibrator) -> None:
    """Add to ``m`` (:func:`measure`'s) its check and baseline seconds at the run's quietest moment
    (``quiet_check_cpu_s``, ``quiet_baseline_cpu_s``, ``quiet_per_10k_s``) and the calibrator's best
    (``calibrator_best_s``). The two ran paired, under the same samples: their ratio is the measured one."""
    during = m["calibration"]["check"]
    check = cal.quiet(m["check_cpu_s"], during)
    base = cal.quiet(m["baseline_cpu_s"], during)
    m.update({
        "quiet_check_cpu_s": round(check, 3), "quiet_baseline_cpu_s": round(base, 3),
        "quiet_per_10k_s": round(check * GOAL_STEPS / m["steps"], 2), "calibrator_best_s": round(cal.best, 5),
    })  # fmt: skip


def _record(name: str, m: dict[str, Any], nthreads: int) -> TimingRecord:
    """The check's per-step CPU times of workload ``name`` as a record (``extra``: every other figure)."""
    extra = {k: v for k, v in m.items() if k != "per_step"}
    return TimingRecord.from_times(
        [t * 1e6 for t in m["per_step"]], what="trace_check", device="cpu", shape={"steps": m["steps"]},
        impl=name, mode="check", threads=nthreads, extra=extra, env=environment("cpu"),
    )  # fmt: skip


def _line(name: str, m: dict[str, Any]) -> str:
    contention = m["check_wall_s"] / m["check_cpu_s"] if m["check_cpu_s"] else float("nan")
    scaled = "" if m["steps"] == GOAL_STEPS else f" (by proportion from {m['steps']:,})"
    return (
        f"{name:<13}{m['steps']:>7,}{m['check_cpu_s']:>9.2f}{m['check_wall_s']:>9.2f}{contention:>9.2f}"
        f"{m['baseline_cpu_s']:>10.2f}{m['ratio']:>7.2f}x{m['checking_ratio']:>9.2f}x{m['second_half_ratio']:>8.2f}"
        f"   {m['per_10k_cpu_s']:.1f} s / 10,000 steps{scaled}; {'OK' if m['ok'] else 'FAIL'}"
    )


def run(
    quick: bool = False,
    json_path: str | None = None,
    device: str = "cpu",
    progress: bool = True,
    steps: int | None = None,
    workloads: tuple[str, ...] | None = None,
    threads_count: int | None = None,
    ratio_steps: int = RATIO_STEPS,
) -> Results:
    """Check the default trace at ``ratio_steps`` steps against the baseline, then ``steps`` steps of each
    workload (default :data:`GOAL_STEPS`, :data:`QUICK_STEPS` when ``quick``; ``workloads``: names of
    :data:`WORKLOADS`, default all); print the table, write JSON if asked. ``threads_count``: torch's intra-op
    threads for the run (``workbench.threads.configure``); None keeps the count the caller set (the command
    line sets ``--threads``, else ``LINATTN_THREADS``, else one)."""
    if threads_count is not None:
        threads.configure(threads_count)
    nthreads = torch.get_num_threads()
    steps = steps or (QUICK_STEPS if quick else GOAL_STEPS)
    names = workloads or tuple(WORKLOADS)
    say: Callable[[str], None] = (lambda s: print(s, flush=True)) if progress else (lambda s: None)
    say(f"bench trace: {threads.describe()}; CPU seconds (process_time) beside wall; baseline: the float64 recurrence")
    head = (
        f"{'workload':<13}{'steps':>7}{'cpu s':>9}{'wall s':>9}{'wall/cpu':>9}{'base s':>10}{'ratio':>8}"
        f"{'checking':>10}{'2nd/1st':>8}"
    )
    res = Results(meta={"benchmark": "trace", "quick": quick, "steps": steps, "threads": nthreads})
    cal = Calibrator()
    for _ in range(3):
        cal.sample()
    say(head)
    ratio = measure("default", ratio_steps, device, cal)
    say(_line("default", ratio))
    measured = [("default", ratio)]  # in the order of their records
    by_name: dict[str, dict[str, Any]] = {}
    for name in names:
        m = ratio if (name == "default" and steps == ratio_steps) else measure(name, steps, device, cal)
        if m is not ratio:
            say(_line(name, m))
            measured.append((name, m))
        by_name[name] = m
    say(
        f"at the run's quietest moment (calibrator {cal.best * 1e3:.1f} ms there, "
        f"{max(cal.samples) * 1e3:.1f} ms at the busiest):"
    )
    for name, m in measured:
        calibrated(m, cal)
        res.records.append(_record(name, m, nthreads))
        scaled = "" if m["steps"] == GOAL_STEPS else f" (by proportion from {m['steps']:,})"
        say(
            f"  {name:<13}{m['steps']:>7,} steps: check {m['quiet_check_cpu_s']:.2f} s, baseline "
            f"{m['quiet_baseline_cpu_s']:.2f} s, {m['ratio']:.2f}x; {m['quiet_per_10k_s']:.1f} s per 10,000 steps"
            f"{scaled}"
        )
    figures = {name: {k: v for k, v in m.items() if k != "per_step"} for name, m in by_name.items()}
    worst_name = max(figures, key=lambda n: figures[n]["quiet_per_10k_s"])
    worst = figures[worst_name]
    done = {
        "ratio_steps": ratio_steps,
        "ratio_default": ratio["ratio"],
        "ratio_goal": GOAL_RATIO,
        "ratio_ok": ratio["ratio"] <= GOAL_RATIO,
        # the shadow is the baseline's own computation, so no check of this subject costs less than this
        "ratio_floor_default": round(1 + ratio["subject_ratio"], 3),
        "worst_workload": worst_name,
        "worst_per_10k_cpu_s": worst["per_10k_cpu_s"],
        "worst_quiet_per_10k_s": worst["quiet_per_10k_s"],
        "seconds_goal": GOAL_SECONDS,
        "seconds_ok": worst["quiet_per_10k_s"] < GOAL_SECONDS,
    }
    say(
        f"goals: default {ratio_steps:,}-step check {ratio['ratio']:.2f}x the float64 recurrence run between its "
        f"steps (every {PAIR_EVERY}; goal at most {GOAL_RATIO:g}x: "
        f"{'met' if done['ratio_ok'] else 'not met'}; the engine step under test alone, the replay phase, "
        f"{ratio['subject_ratio']:.2f}x, which puts the floor of a check beside the float64 recurrence at "
        f"{done['ratio_floor_default']:.2f}x in this run); slowest workload {done['worst_workload']} "
        f"{worst['quiet_per_10k_s']:.1f} s per 10,000 steps calibrated, {worst['per_10k_cpu_s']:.1f} CPU-s as measured "
        f"(goal under {GOAL_SECONDS:g} s on a quiet machine: {'met' if done['seconds_ok'] else 'not met'}); "
        f"{threads.describe()}"
    )
    res.meta.update({
        "ratio_run": {k: v for k, v in ratio.items() if k != "per_step"}, "workloads": figures, "goals": done,
        "calibration": {"calls": CALIBRATION_CALLS, "samples_s": cal.samples, "best_s": cal.best},
        "load_average": list(os.getloadavg()),
    })  # fmt: skip
    if json_path:
        say(f"wrote {res.save(json_path)}")
    return res
