"""The GPU scripts cannot rot between GPU runs: their --dry-run runs the same code paths on the CPU
(Triton interpreter, tiny shapes) and writes the one results schema (``Results.load`` reads it), and a
failed check makes them exit non-zero."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from kernels.conventions import CONVENTIONS
from kernels.testing import OPS
from workbench.measure.timing import GraphCaptureError, Results, TimingRecord
from workbench.sweeps.kernels import record_name

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "benchmarks"


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / script), "--dry-run", *args], capture_output=True, text=True, timeout=600
    )


def _load(script: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{script[:-3]}", SCRIPTS / script)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow  # a dry run: every op in the Triton interpreter, tens of seconds
def test_gpu_kernels_dry_run_checks_and_times_every_op(tmp_path):
    out = tmp_path / "kernels.json"
    done = _run("gpu_kernels.py", "--sweep", "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    res = Results.load(out)
    mod = _load("gpu_kernels.py")
    meta, checks = res.meta, res.meta["checks"]
    assert meta["benchmark"] == "gpu_kernels" and meta["checks_ok"] and not meta["errors"]
    assert all(c["ok"] for c in checks) and meta["conventions"] == list(CONVENTIONS)
    # every op and variant under every padding convention, padded rows included (Ascend: processed on slot 0)
    padded = {(c["op"], c["variant"], c["convention"]) for c in checks if c.get("padded") == 2}
    assert padded == {(op, v, conv) for op, spec in OPS.items() for v in spec.variants for conv in CONVENTIONS}
    # every timed case timed, each after its own check at the timed shape; nothing timed that is not checked
    names = {record_name(op, v) for op, v in mod.TIMED}  # as `bench kernels` names them
    kernels = res.filter(mode="kernel", impl="triton")
    assert {r.what for r in kernels} == names
    at_shape = {
        (record_name(c["op"], c["variant"]), c["bs"], c.get("block_v"), c.get("num_warps")) for c in checks if "bs" in c
    }
    assert {(r.what, r.shape["bs"], r.shape.get("block_v"), r.shape.get("num_warps")) for r in kernels} <= at_shape
    assert all(r.extra["check"]["ok"] and r.bytes and r.flops is not None for r in kernels)  # scatter: 0 FLOPs
    # each default launch beside its copy floor, measured the same way
    floors = {(r.what, r.shape["bs"], r.l2) for r in res.filter(mode="copy-floor", impl="copy")}
    assert {(r.what, r.shape["bs"], r.l2) for r in kernels if set(r.shape) == {"bs"}} == floors
    swept = {r.what for r in kernels if "block_v" in r.shape}
    assert swept == {record_name(op, v) for op, v in mod.SWEPT}  # each swept configuration checked, then timed
    # no GPU here: CPU timer, warm L2, no registers, no L2 size
    assert all(r.device == "cpu" and r.l2 == "warm" and r.graph_calls is None and r.n >= 5 for r in res)
    assert all(r.extra["n_regs"] is None and r.extra["l2_resident"] is None for r in kernels)
    assert meta["target"]["worst"] is None  # bs 1 only: no decode batch of 64 rows or more
    # fla's kernels need a GPU: skipped here, installed or not
    assert "fla comparison skipped: fla's kernels need a GPU (device cpu)" in done.stdout
    assert meta["fla"] == "skipped: fla's kernels need a GPU (device cpu)"


def test_gpu_kernels_exits_non_zero_when_a_check_fails(tmp_path, monkeypatch):
    import kernels.testing

    mod = _load("gpu_kernels.py")
    monkeypatch.setattr(kernels.testing, "rel_err", lambda got, want: 1.0)  # every comparison off
    out = tmp_path / "k.json"
    assert mod.main(["--dry-run", "--ops", "gated_delta_rule.scatter_accepted", "--out", str(out)]) == 1
    res = Results.load(out)
    assert not res.meta["checks_ok"] and len(res) == 0  # a failed check is never timed
    assert {c["convention"] for c in res.meta["checks"]} == set(CONVENTIONS)
    assert mod.main(["--dry-run", "--ops", "nope"]) == 2


def test_gpu_kernels_selects_ops_and_plans_extend_batches():
    mod = _load("gpu_kernels.py")
    ops, timed, unknown = mod.select(["causal_conv1d.varlen", "gated_delta_rule.recurrent[verify]", "x"])
    assert ops == ["gated_delta_rule.recurrent", "causal_conv1d.varlen"] and unknown == ["x"]
    assert timed == [("gated_delta_rule.recurrent", "verify"), ("causal_conv1d.varlen", "extend")]
    steps = mod.plan(mod.TIMED, [1, 64, 512], sweep=True, dry=False)
    extend = [(op, bs) for op, v, bs, cfg in steps if v == "extend" and cfg == [mod.DEFAULT]]
    assert {bs for _, bs in extend} == {1}  # prefill batches stop at EXTEND_MAX_BS rows
    sweeps = {(op, bs, len(cfg)) for op, v, bs, cfg in steps if cfg != [mod.DEFAULT]}
    assert sweeps == {("gated_delta_rule.recurrent", 512, 16), ("gated_delta_rule.chunked", 1, 9)}


def test_gpu_kernels_times_events_where_capture_is_refused(monkeypatch):
    import workbench.measure.timing as timing

    mod = _load("gpu_kernels.py")
    env = mod.Env(mod.parse_args(["--dry-run"]))
    env.cuda = True  # as on a GPU: graph_calls asked for; the timer itself is stubbed, nothing runs on a device
    asked = []

    def fake_time_fn(fn, *, graph_calls, **kw):
        asked.append(graph_calls)
        if graph_calls:
            raise GraphCaptureError("graph_calls: capture refused (RuntimeError: a host sync)")
        return TimingRecord(kw["what"], "cuda", {}, "", "kernel", 1.0, 0.1, 10, 1, extra=kw["extra"])

    monkeypatch.setattr(timing, "time_fn", fake_time_fn)
    rec = env.time(lambda: None, cold=False, what="op", extra={"n_regs": 40})
    assert asked == [mod.GRAPH_CALLS, None]  # graph first, then events around single calls
    assert rec.extra == {"n_regs": 40, "capture": "graph_calls: capture refused (RuntimeError: a host sync)"}


def test_gpu_kernels_refuses_a_missing_out_folder(tmp_path, capsys):
    mod = _load("gpu_kernels.py")
    missing = tmp_path / "no" / "k.json"
    assert mod.main(["--dry-run", "--out", str(missing)]) == 2
    assert capsys.readouterr().out == f"--out: folder {str(missing.parent)!r} does not exist (create it first)\n"
    assert not missing.parent.exists()  # refused before the run, and nothing created


def test_gpu_replay_refuses_a_missing_out_folder(tmp_path, capsys):
    mod = _load("gpu_replay.py")
    missing = tmp_path / "no" / "r.json"
    assert mod.main(["--dry-run", "--out", str(missing)]) == 2
    assert capsys.readouterr().err == f"--out: folder {str(missing.parent)!r} does not exist (create it first)\n"
    assert not missing.parent.exists()  # refused before the run, and nothing created


def test_fla_comparison_is_a_check_within_two_ulps():
    mod = _load("gpu_kernels.py")
    tol = mod.fla_tolerance(torch.bfloat16)
    assert tol == 2 * 2**-7 and mod.fla_tolerance(torch.float16) == 2 * 2**-10
    assert mod.fla_tolerance(torch.float32) == 1e-4
    rows = [mod.fla_check(bs, err, torch.bfloat16) for bs, err in ((1, tol / 2), (8, 3 * tol), (16, float("inf")))]
    assert [(c["check"], c["ok"]) for c in rows] == [
        ("fla_vs_ours/gated_delta_rule.recurrent[decode]/bs=1", True),
        ("fla_vs_ours/gated_delta_rule.recurrent[decode]/bs=8", False),
        ("fla_vs_ours/gated_delta_rule.recurrent[decode]/bs=16", False),
    ]
    assert rows[2]["max_err"] == "inf"  # strict JSON: Results.save writes no inf


def _fake_fla(monkeypatch) -> list:
    """An importable ``fla.ops.gated_delta_rule`` whose kernel answers garbage (as fla's CPU fallback did:
    a difference of 7.7e34); returns the list of its calls."""
    calls: list = []

    def fused_recurrent_gated_delta_rule(**kw):
        calls.append(kw)
        return torch.full_like(kw["v"], 7.7e34), None

    for name in ("fla", "fla.ops", "fla.ops.gated_delta_rule"):
        monkeypatch.setitem(sys.modules, name, ModuleType(name))
    sys.modules["fla.ops.gated_delta_rule"].fused_recurrent_gated_delta_rule = fused_recurrent_gated_delta_rule  # type: ignore[attr-defined]
    return calls


def test_fla_comparison_is_skipped_off_a_gpu_even_where_fla_imports(monkeypatch, capsys):
    """On the CPU fla falls back to code that is not its kernel: no MISMATCH reported against it, no check
    row, no fla record; one line says why."""
    calls = _fake_fla(monkeypatch)
    mod = _load("gpu_kernels.py")
    env = mod.Env(mod.parse_args(["--dry-run"]))
    res = Results(meta={"checks": [], "errors": []})
    why = mod.fla_compare(env, res, [1])
    out = capsys.readouterr().out
    assert out == "fla comparison skipped: fla's kernels need a GPU (device cpu)\n"
    assert why == "skipped: fla's kernels need a GPU (device cpu)"
    assert calls == [] and res.meta == {"checks": [], "errors": []} and len(res) == 0


@pytest.mark.slow  # a dry run: the replay path on the CPU, seconds
def test_gpu_replay_dry_run(tmp_path):
    out = tmp_path / "replay.json"
    done = _run("gpu_replay.py", "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    res = Results.load(out)
    assert res.meta["benchmark"] == "gpu_replay" and res.meta["checks_ok"] and res.meta["graph_backend"] == "cpu"
    assert all(c["ok"] for c in res.meta["checks"])
    assert {(r.shape["bs"], r.mode) for r in res} == {
        (b, m) for b in (1, 2) for m in ("eager", "eager-no-sync", "replay")
    }
    assert all(r.what == "gdn_decode_step" and r.device == "cpu" and r.impl == "triton" for r in res)
    assert "engine-style" in res.meta["modes"]["eager"] and "no host sync" in res.meta["modes"]["eager-no-sync"]


@pytest.mark.slow  # a dry run: the replay path on the CPU, seconds
def test_gpu_replay_exits_non_zero_when_integrity_fails(tmp_path, monkeypatch):
    from workbench.runner import GraphRunner

    real = GraphRunner.compare

    def broken(self, batch, inputs, **kw):
        cmp = real(self, batch, inputs, **kw)
        cmp.integrity.changed_slots.append(("ssm", 0))  # as if a foreign slot had changed
        return cmp

    monkeypatch.setattr(GraphRunner, "compare", broken)
    mod = _load("gpu_replay.py")
    out = tmp_path / "replay.json"
    assert mod.main(["--dry-run", "--out", str(out)]) == 1
    res = Results.load(out)
    assert not res.meta["checks_ok"] and len(res) == 6  # the timings are still written


@pytest.mark.slow  # a fresh interpreter (subprocess)
@pytest.mark.parametrize("script", ["gpu_kernels.py", "gpu_replay.py"])
def test_scripts_refuse_to_run_without_a_gpu(script):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the scripts would run for real")
    done = subprocess.run([sys.executable, str(SCRIPTS / script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "no CUDA device" in done.stdout + done.stderr
