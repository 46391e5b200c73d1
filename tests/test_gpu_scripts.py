"""The GPU scripts cannot rot between GPU runs: their --dry-run runs the same code paths on the CPU
(Triton interpreter, tiny shapes), and a failed check makes them exit non-zero."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "benchmarks"


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / script), "--dry-run", *args], capture_output=True, text=True, timeout=600
    )


def _load(script: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{script[:-3]}", SCRIPTS / script)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow  # a dry run: the Triton interpreter or the replay path on the CPU, seconds
def test_gpu_kernels_dry_run_checks_and_times_every_op(tmp_path):
    out = tmp_path / "kernels.json"
    done = _run("gpu_kernels.py", "--sweep", "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    mod = _load("gpu_kernels.py")
    ops = set(mod.BUILDERS)
    assert report["checks_ok"] and not report["errors"]
    checked = {c["check"] for c in report["checks"]}
    for op in ops:
        for convention in mod.CONVENTIONS:
            assert f"{op}/{convention}" in checked  # every op under every padding convention
    timed = {r["op"] for r in report["timings"]}
    assert timed == ops  # every op timed, each after its own check at the timed shape
    assert {c["check"].split("/")[0] for c in report["checks"] if "/bs=" in c["check"]} == ops
    swept = [r for r in report["timings"] if r["block_v"] is not None]
    assert {r["op"] for r in swept} == set(mod.SWEPT)  # each swept configuration checked, then timed
    assert all(r["l2_resident"] is None and r["n_regs"] is None for r in report["timings"])  # no GPU here
    assert report["meta"]["device_type"] == "cpu"
    if importlib.util.find_spec("fla") is None:
        assert "fla comparison skipped" in done.stdout and "skipped" in report["fla"][0]


def test_gpu_kernels_exits_non_zero_when_a_check_fails(tmp_path, monkeypatch, capsys):
    mod = _load("gpu_kernels.py")
    monkeypatch.setattr(mod, "rel_err", lambda env, got, want: 1.0)  # every comparison off
    out = tmp_path / "k.json"
    assert mod.main(["--dry-run", "--ops", "gdn_scatter_accepted", "--out", str(out)]) == 1
    report = json.loads(out.read_text())
    assert not report["checks_ok"] and report["timings"] == []  # a failed check is never timed
    assert mod.main(["--dry-run", "--ops", "nope"]) == 2


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
    import torch

    mod = _load("gpu_kernels.py")
    env = type("E", (), {"torch": torch})()
    tol = mod.fla_tolerance(env, torch.bfloat16)
    assert tol == 2 * 2**-7 and mod.fla_tolerance(env, torch.float16) == 2 * 2**-10
    assert mod.fla_tolerance(env, torch.float32) == 1e-4
    rows = [
        {"skipped": "fla does not import"},
        {"op": "fla_fused_recurrent_gdn", "bs": 1, "out_diff_vs_ours": tol / 2, "tol": tol},
        {"op": "fla_fused_recurrent_gdn", "bs": 8, "out_diff_vs_ours": 3 * tol, "tol": tol},
        {"op": "fla_fused_recurrent_gdn", "bs": 16, "error": "Traceback ..."},
    ]
    checks = mod.fla_checks(rows)
    assert [(c["check"], c["ok"]) for c in checks] == [("fla_vs_ours/bs=1", True), ("fla_vs_ours/bs=8", False)]


@pytest.mark.slow  # a dry run: the Triton interpreter or the replay path on the CPU, seconds
def test_gpu_replay_dry_run(tmp_path):
    out = tmp_path / "replay.json"
    done = _run("gpu_replay.py", "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["checks_ok"] and report["device"] == "cpu" and report["backend"] == "cpu"
    assert {"eager_us", "eager_sync_us", "replay_us"} <= set(report["results"][0])
    assert "engine-style" in report["columns"]["eager_sync_us"]


@pytest.mark.slow  # a dry run: the Triton interpreter or the replay path on the CPU, seconds
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
    assert not json.loads(out.read_text())["checks_ok"]


@pytest.mark.slow  # a fresh interpreter (subprocess)
@pytest.mark.parametrize("script", ["gpu_kernels.py", "gpu_replay.py"])
def test_scripts_refuse_to_run_without_a_gpu(script):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the scripts would run for real")
    done = subprocess.run([sys.executable, str(SCRIPTS / script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "no CUDA device" in done.stdout + done.stderr
