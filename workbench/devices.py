"""Which device stacks are usable here, and why the others are not. Never raises, never breaks torch.

torch_npu is probed in a subprocess: where Ascend's CANN libraries are missing, importing it fails (or,
through torch's backend autoload, breaks ``import torch`` itself), and that must not happen in this process.
torch itself is imported inside the functions, so that ``import workbench`` stays cheap.

Triton is reported per device, compiled and interpreted apart: compiled kernels need a GPU (CUDA, or an
Ascend NPU with triton-ascend); on a CPU Triton only runs interpreted, with ``TRITON_INTERPRET=1`` set
before a kernel module is imported (and then it interprets on every device).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from workbench.errors import DeviceUnavailable
from workbench.extras import install_command

if TYPE_CHECKING:
    import torch


def canonical_device(device: str | torch.device | int) -> torch.device:
    """The device as tensors made on it report theirs: ``"cuda"`` -> ``cuda:0`` (the current device),
    ``"cpu:0"`` -> ``cpu``, ``"npu"`` -> ``npu:0``; an int is a CUDA ordinal, as in torch.

    Every entry point that takes a device (pool, batch, layers, runner, CLI) normalises it here once, so
    that comparing it with ``tensor.device`` is meaningful: ``torch.device("cuda") != torch.device("cuda:0")``
    although both name the same GPU. Raises ``DeviceUnavailable`` (naming the device) where torch cannot
    allocate on it, e.g. ``"cuda"`` on a CPU-only build.
    """
    import torch

    if isinstance(device, torch.device) and device.type == "cpu":
        return torch.device("cpu")  # the common case, without an allocation
    try:
        return torch.empty(0, device=device).device
    except (RuntimeError, AssertionError, ValueError, TypeError) as e:
        raise DeviceUnavailable(f"device {device!r}: torch cannot allocate there ({e})") from e


@dataclass(frozen=True)
class DeviceStatus:
    name: str
    usable: bool
    detail: str


def _probe_npu(timeout: float = 60.0) -> DeviceStatus:
    if importlib.util.find_spec("torch_npu") is None:
        return DeviceStatus("npu", False, f"torch_npu not installed (on Ascend with CANN: {install_command('npu')})")
    code = "import torch, torch_npu; print(torch.npu.is_available(), torch.npu.device_count())"
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        return DeviceStatus("npu", False, f"torch_npu probe failed: {e}")
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["unknown error"])[-1]
        return DeviceStatus("npu", False, f"torch_npu failed to import (Ascend CANN libraries missing?): {last}")
    ok, _, count = res.stdout.strip().rpartition(" ")
    if not ok.endswith("True"):
        return DeviceStatus("npu", False, "torch_npu imports but no Ascend device is visible")
    return DeviceStatus("npu", True, f"{count} Ascend device(s)")


def _cuda() -> DeviceStatus:
    import torch

    if not torch.cuda.is_available():
        why = "torch is a CPU build" if torch.version.cuda is None else "no CUDA device visible"
        return DeviceStatus("cuda", False, why)
    name = torch.cuda.get_device_name(0)
    return DeviceStatus("cuda", True, f"{torch.cuda.device_count()} x {name}")


def _triton(cuda: DeviceStatus, npu: DeviceStatus) -> list[DeviceStatus]:
    """One line per device: how Triton kernels run there (compiled, interpreted, or not at all)."""
    try:
        import triton
    except Exception as e:  # a broken triton must not break the reference path
        why = f"triton failed to import: {e}"
        return [DeviceStatus(f"triton:{d}", False, why) for d in ("cpu", "cuda", "npu")]
    ver = f"triton {triton.__version__}"
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    if interpret:
        cpu = DeviceStatus("triton:cpu", True, f"{ver}, interpreted (TRITON_INTERPRET=1): slow, fp32/fp16 only")
    else:
        cpu = DeviceStatus(
            "triton:cpu", False, f"{ver} has no compiled CPU backend; set TRITON_INTERPRET=1 to interpret"
        )
    out = [cpu]
    for dev, status in (("cuda", cuda), ("npu", npu)):
        if not status.usable:
            out.append(DeviceStatus(f"triton:{dev}", False, f"not compiled: {dev} unusable ({status.detail})"))
        elif interpret:
            out.append(
                DeviceStatus(f"triton:{dev}", True, f"{ver}, interpreted: TRITON_INTERPRET=1 disables compiling")
            )
        elif dev == "npu" and importlib.util.find_spec("triton_ascend") is None and "ascend" not in ver.lower():
            out.append(DeviceStatus(f"triton:{dev}", False, f"{ver} is not triton-ascend: no NPU compiler"))
        else:
            out.append(DeviceStatus(f"triton:{dev}", True, f"{ver}, compiled"))
    return out


def devices(probe_npu: bool = True) -> list[DeviceStatus]:
    """Status of cpu, cuda, npu, then Triton on each of them (``triton:cpu`` etc., compiled or
    interpreted). ``probe_npu=False`` skips the (slow) torch_npu subprocess."""
    import torch

    cpu = DeviceStatus("cpu", True, f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    cuda = _cuda()
    npu = _probe_npu() if probe_npu else DeviceStatus("npu", False, "not probed (--no-npu-probe)")
    return [cpu, cuda, npu, *_triton(cuda, npu)]


def doctor_text(probe_npu: bool = True) -> str:
    """What `workbench doctor` prints."""
    lines = [f"{'device':12} {'usable':7} detail"]
    for d in devices(probe_npu):
        lines.append(f"{d.name:12} {'yes' if d.usable else 'no':7} {d.detail}")
    return "\n".join(lines)


TRITON_RESTART = (
    "restart the kernel with %env TRITON_INTERPRET=1 as its first cell (make lab sets it where no GPU is present)"
)
TRITON_ON_CPU = "Triton needs TRITON_INTERPRET=1 before torch and the kernels are imported: " + TRITON_RESTART


def kernels_compiled_for_a_gpu() -> bool:
    """Triton, or a module of ``kernels``, was imported before ``TRITON_INTERPRET=1`` was set: its functions
    are compiled ``JITFunction`` s, not the interpreter's, for good (the flag is read once, at import), and
    calling them on CPU tensors fails ("0 active drivers", "Cannot call @triton.jit'd outside of the scope
    of a kernel") until the process restarts."""
    return any(
        name.startswith(("kernels.", "triton.language"))
        and any(type(v).__name__ == "JITFunction" for v in vars(module).values())
        for name, module in list(sys.modules.items())
        if module is not None
    )


def triton_cpu_problem() -> str | None:
    """Why the Triton kernels cannot run on CPU tensors in this process, in one line naming the fix, or None.
    The widgets ask this before offering Triton (the playground's cases and the CPU dashboard)."""
    from kernels.dispatch import interpreter_on, triton_importable

    if not triton_importable():
        return "triton cannot be imported here (pip install triton, or choose reference)"
    if not interpreter_on():
        return TRITON_ON_CPU
    if kernels_compiled_for_a_gpu():
        return "the kernels were imported before TRITON_INTERPRET=1 was set. " + TRITON_ON_CPU
    return None
