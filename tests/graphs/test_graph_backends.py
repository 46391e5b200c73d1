"""Backend choice and the reasons given when a device stack is missing."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from workbench.errors import DeviceUnavailable
from workbench.graphs import BACKENDS, CpuBackend, available_backends, get_backend
from workbench.graphs import npu as npu_mod


def test_available_backends_reports_every_backend_in_words() -> None:
    report = available_backends()
    assert set(report) == {"cuda", "npu", "cpu"}
    assert report["cpu"] == "ok"
    for name, why in report.items():
        assert isinstance(why, str) and why, name
        ok, reason = BACKENDS[name].is_available()
        assert (why == "ok") == ok and why == ("ok" if ok else reason)


def test_auto_picks_in_order_cuda_npu_cpu() -> None:
    report = available_backends()
    want = next((n for n in ("cuda", "npu") if report[n] == "ok"), "cpu")
    assert get_backend("auto").name == want
    if want == "cpu":
        assert isinstance(get_backend(), CpuBackend)
        assert get_backend().device == torch.device("cpu")


def test_auto_follows_an_explicit_device() -> None:
    assert get_backend("auto", device="cpu").name == "cpu"
    with pytest.raises(DeviceUnavailable, match="no graph backend for device"):
        get_backend("auto", device="meta")


@pytest.mark.parametrize("name", ["cuda", "npu"])
def test_unavailable_device_backend_says_why(name: str) -> None:
    ok, why = BACKENDS[name].is_available()
    if ok:
        pytest.skip(f"{name} is available here")
    assert isinstance(why, str) and len(why) > 10
    with pytest.raises(DeviceUnavailable, match=f"graph backend '{name}' is unavailable: ") as info:
        get_backend(name)
    assert why in str(info.value)


def test_unknown_backend_name() -> None:
    with pytest.raises(ValueError, match="must be one of"):
        get_backend("tpu")


def test_cpu_backend_rejects_other_devices() -> None:
    with pytest.raises(ValueError, match="runs on the cpu"):
        CpuBackend("meta")


@pytest.mark.slow  # a fresh interpreter (subprocess)
def test_importing_workbench_graphs_does_not_import_torch_npu() -> None:
    code = (
        "import sys, workbench.graphs as g; assert 'torch_npu' not in sys.modules, 'imported early'; "
        "print(g.available_backends()['npu'])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()


def test_broken_torch_npu_is_reported_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What torch_npu does where Ascend's CANN libraries are missing: fail inside its own import.
    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("a real torch_npu is installed here; the fake one would not be imported")
    pkg = tmp_path / "torch_npu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        textwrap.dedent(
            """
            raise OSError("libhccl.so: cannot open shared object file: No such file or directory")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    npu_mod._load.cache_clear()
    try:
        ok, why = npu_mod.NpuBackend.is_available()
        assert not ok
        assert why.startswith("torch_npu failed to import: libhccl.so")
        assert available_backends()["npu"] == why
        with pytest.raises(DeviceUnavailable, match="libhccl.so"):
            get_backend("npu")
        assert get_backend("auto").name in ("cuda", "cpu")
    finally:
        sys.modules.pop("torch_npu", None)
        npu_mod._load.cache_clear()


def test_missing_torch_npu_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(npu_mod.importlib.util, "find_spec", lambda name: None)
    npu_mod._load.cache_clear()
    try:
        assert npu_mod.NpuBackend.is_available() == (False, npu_mod._load()[1])
        assert npu_mod._load()[1].startswith("torch_npu not installed")
    finally:
        npu_mod._load.cache_clear()
