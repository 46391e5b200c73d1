"""`workbench bench trace`: steps per second of a serving trace checked across steps, split by phase.

A seeded sglang trace with speculation (``workbench.traces.simulate``) for ``GDNConfig.small()`` on the CPU
recorder runs through :class:`~workbench.traces.replay.TraceReplayer`: each step replayed (or run eagerly)
and checked against the float64 shadow of every request. The table gives the median and IQR per step of
each phase (simulate, replay, reference, check), the total, steps per second, and the median of the last
half of the steps against the first (the cost per step must stay flat in the number of steps: no check
that grows with history). The goal: 10,000 steps checked in under 60 s on the 2-core development machine.
Then a prefix-cache trace per strategy (sglang ``no_buffer`` and ``extra_buffer`` with speculation, both again
on Mamba2, vLLM ``align`` without and with speculation: ``PREFIX_RUNS``; a fifth of the steps each): hits,
checkpoints verified, and its checkpoint checks and copies against its check phase (the goal: at most twice
the check time).
"""

from __future__ import annotations

import statistics
import time

import torch

from workbench.layer_names import GDN, MAMBA2
from workbench.measure.timing import Results, TimingRecord
from workbench.traces.replay import PhaseTimer, TraceReplayer
from workbench.traces.simulate import simulate

PHASES = ("replay", "reference", "check")
"""The phases of a step's forward the table splits its cost into (the replay's own, :class:`ForwardSplit`)."""


class ForwardSplit(PhaseTimer):
    """The replay's timer for the benchmark: the phase totals, and each forward's ``(replay, reference,
    check)`` seconds in ``forwards`` (a step whose forward ran to its check)."""

    def __init__(self) -> None:
        super().__init__()
        self.forwards: list[tuple[float, float, float]] = []
        self._split: dict[str, float] = {}

    def lap(self, phase: str, seconds: float) -> None:
        super().lap(phase, seconds)
        if phase not in PHASES:
            return
        self._split[phase] = seconds
        if phase == PHASES[-1]:
            self.forwards.append((self._split.get("replay", 0.0), self._split.get("reference", 0.0), seconds))
            self._split = {}


PREFIX_RUNS = {
    "no_buffer": ("sglang", GDN, "no_buffer", 0),
    "extra_buffer": ("sglang", GDN, "extra_buffer", 2),
    "mamba2_no_buffer": ("sglang", MAMBA2, "no_buffer", 0),
    "mamba2_extra_buffer": ("sglang", MAMBA2, "extra_buffer", 2),
    "align": ("vllm", GDN, "align", 0),
    "align_spec": ("vllm", GDN, "align", 3),
}
"""The prefix-cache traces timed: name -> (profile, layer, strategy, spec)."""


def _prefix_cache_cost(
    profile: str, layer: str, strategy: str, steps: int, device: str, spec: int = 0
) -> dict[str, float | int | bool]:
    """A prefix-cache trace: the cost of its checkpoint checks and copies against the trace's own check phase
    (the goal: verifying checkpoints at most doubles the check time)."""
    trace = simulate(profile, layer, steps=steps, seed=0, prefix_cache=strategy, spec=spec)
    replayer = TraceReplayer(trace, backend="cpu" if device == "auto" else device, timer=PhaseTimer())
    t0 = time.perf_counter()
    result = replayer.run(stop_at_first=False)
    seconds = time.perf_counter() - t0
    check, prefix = result.seconds["check"], result.seconds["prefix"]
    ratio = (check + prefix) / check if check else float("inf")
    print(
        f"prefix cache ({profile} {layer} {strategy}{f', spec {spec}' if spec else ''}), {steps:,} steps: "
        f"{result.hits} hits, "
        f"{result.verified}/{result.checkpoints} checkpoints verified, {steps / seconds:,.0f} steps/s; "
        f"checks {check:.2f} s + checkpoints {prefix:.2f} s = {ratio:.2f}x the check time (goal: at most 2x); "
        f"{'OK' if result.ok else 'FAIL'}"
    )
    return {
        "steps": steps, "ok": result.ok, "hits": result.hits, "checkpoints": result.checkpoints,
        "verified": result.verified, "seconds": round(seconds, 2), "check_seconds": round(check, 3),
        "prefix_seconds": round(prefix, 3), "check_ratio": round(ratio, 3),
    }  # fmt: skip


def run(
    quick: bool = False,
    json_path: str | None = None,
    device: str = "cpu",
    progress: bool = True,
    steps: int | None = None,
) -> Results:
    """Simulate, replay and check ``steps`` steps (default 500 when ``quick``, else 10,000); print the table,
    write JSON if asked."""
    steps = steps or (500 if quick else 10_000)
    t0 = time.perf_counter()
    trace = simulate("sglang", GDN, steps=steps, seed=0, spec=2, buckets=[1, 2, 4, 8], max_running=10)
    simulate_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    timer = ForwardSplit()
    replayer = TraceReplayer(trace, backend="cpu" if device == "auto" else device, timer=timer)
    capture_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    result = replayer.run(stop_at_first=False)
    run_s = time.perf_counter() - t2
    res = Results(meta={"benchmark": "trace", "quick": quick, "steps": steps, "ok": result.ok})
    half = len(timer.forwards) // 2
    print(f"{steps:,} steps, {result.summary()}")
    print(f"{'phase':<10}{'median us/step':>16}{'IQR':>10}{'total s':>10}{'2nd half / 1st':>16}")
    rows = [("simulate", [simulate_s / steps] * steps)]
    rows += [(name, [t[i] for t in timer.forwards]) for i, name in enumerate(PHASES)]
    for name, values in rows:
        flat = statistics.median(values[half:]) / max(statistics.median(values[:half]), 1e-12) if half else 1.0
        rec = TimingRecord.from_times(
            [v * 1e6 for v in values],
            what="trace_step",
            device="cpu",
            shape={"steps": steps},
            impl="reference",
            mode=name,
            threads=torch.get_num_threads(),
            extra={"total_s": round(sum(values), 3), "second_half_ratio": round(flat, 3)},
        )
        print(f"{name:<10}{rec.median_us:16.1f}{rec.iqr_us:10.1f}{sum(values):10.2f}{flat:15.2f}x")
        res.records.append(rec)
    total = simulate_s + run_s
    print(f"total {total:.1f} s (+ capture {capture_s:.1f} s): {steps / total:,.0f} steps/s; goal 10,000 in 60 s")
    res.meta.update({"seconds": round(total, 2), "capture_seconds": round(capture_s, 2), "steps_per_s": steps / total})
    res.meta["prefix_cache"] = {
        name: _prefix_cache_cost(profile, layer, strategy, max(steps // 5, 100), device, spec)
        for name, (profile, layer, strategy, spec) in PREFIX_RUNS.items()
    }
    if json_path:
        print(f"wrote {res.save(json_path)}")
    return res
