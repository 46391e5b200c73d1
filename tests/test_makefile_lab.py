"""``make lab`` and ``make app`` start Jupyter and Voila with ``TRITON_INTERPRET=1`` where no GPU answers
``nvidia-smi`` (the kernels' Triton then runs in its interpreter), and without it where one does. Read from
``make -n``: printed, not run."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKE = shutil.which("make")


def _recipes(tmp_path: Path, nvidia_smi: str) -> list[str]:
    """The lab and app command lines ``make -n`` prints with ``nvidia-smi`` replaced by a script."""
    fake = tmp_path / "bin"
    fake.mkdir()
    script = fake / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n{nvidia_smi}\n")
    script.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = subprocess.run([MAKE, "-n", "lab", "app"], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if "/jupyter lab" in line or "/voila " in line]


@pytest.mark.skipif(MAKE is None, reason="make is not installed")
def test_lab_and_app_turn_the_interpreter_on_where_no_gpu_answers(tmp_path):
    lines = _recipes(tmp_path, 'echo "NVIDIA-SMI has failed: no devices were found" >&2; exit 6')
    assert len(lines) == 2 and all(line.startswith("TRITON_INTERPRET=1 ") for line in lines), lines


@pytest.mark.skipif(MAKE is None, reason="make is not installed")
def test_lab_and_app_leave_triton_alone_on_a_gpu(tmp_path):
    lines = _recipes(tmp_path, 'echo "GPU 0: NVIDIA H200 (UUID: GPU-0)"')
    assert len(lines) == 2 and not any("TRITON_INTERPRET" in line for line in lines), lines
