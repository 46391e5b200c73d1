"""Registers and spills of every Triton kernel's default launch, compiled for a GPU that is not here.

    python benchmarks/kernel_resources.py [--arch 90] [--json PATH]

Each kernel is launched through its own launcher (the same arguments as a real call, on CPU tensors at
engine shapes) while Triton's active driver is a stand-in that names a CUDA target (sm_90 by default) and
``JITFunction.run`` compiles without launching (``warmup=True``). Triton's own ptxas run (its bundled
ptxas, its flags) prints its ``-v`` log (``knobs.nvidia.dump_ptxas_log``), which gives registers per
thread, spill stores/loads and the stack frame: what ``CompiledKernel.n_regs`` / ``n_spills`` would say
on the device (benchmarks/gpu_kernels.py reports those there).

Nothing runs on a GPU; nothing here is a timing. Needs triton with its NVIDIA backend (ptxas included in
the wheel), no CUDA driver.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)  # compile for real, before any kernel module is imported
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, said explicitly (no warning)
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import triton  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver as triton_driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

CACHE_DIR = tempfile.mkdtemp(prefix="kernel_resources_")


class CompileOnlyDriver:
    """The few calls ``JITFunction.run`` makes of the active driver, for a target without a device."""

    def __init__(self, target: GPUTarget) -> None:
        self.target = target

    def get_current_target(self) -> GPUTarget:
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


def _compile_only(launch) -> list[Any]:
    """Run ``launch()`` with every Triton launch turned into a compile; returns the compiled kernels."""
    kernels: list[Any] = []
    real_run = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        kernel = real_run(self, *args, grid=grid, warmup=True, **kwargs)
        kernels.append(kernel)
        return kernel

    JITFunction.run = run
    try:
        launch()
    finally:
        JITFunction.run = real_run
    return kernels


def ptxas_report(log: str, kernel: Any) -> dict[str, Any]:
    """Registers, spill stores/loads and stack frame (bytes) from the ``ptxas -v`` log of Triton's own
    compile of ``kernel`` (its flags: -lineinfo, --regAllocOptLevel=2, fmad as the options say)."""
    regs = re.findall(r"Used (\d+) registers", log)
    spill = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if not regs or not spill:
        raise RuntimeError(f"no ptxas -v report in the compile log: {log[-500:]!r}")
    stack, stores, loads = (int(x) for x in spill[-1])
    return {
        "regs": int(regs[-1]),
        "spill_store_bytes": stores,
        "spill_load_bytes": loads,
        "stack_bytes": stack,
        "shared_bytes": int(kernel.metadata.shared),
        "num_warps": int(kernel.metadata.num_warps),
    }


def compile_and_report(launch) -> dict[str, Any]:
    """Compile the kernel ``launch()`` would launch, with Triton printing its ptxas log; parse it."""
    knobs.nvidia.dump_ptxas_log = True
    knobs.cache.dir = CACHE_DIR  # a fresh cache: a cached kernel would skip ptxas and print nothing
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            kernels = _compile_only(launch)
    finally:
        knobs.nvidia.dump_ptxas_log = False
    return ptxas_report(buf.getvalue(), kernels[-1])


# ------------------------------------------------------------------------------------------ the launches


def _launch(op: str, variant: str, **config: Any) -> Any:
    """A launch of ``op``'s Triton kernel on engine shapes (``kernels.testing``'s one case builder: 4 rows,
    bf16 activations), with a configuration; compiled, never run (the values do not matter)."""
    from kernels.testing import make_case

    case = make_case(op, variant, rows=4, padded=0, shapes="engine", dtype=torch.bfloat16, guard=0)
    return case.launch(case.fresh(), **config)


def launches() -> list[tuple[str, str, Any]]:
    """(kernel, configuration, launch) of every default launch, and the chunked kernel's alternatives."""
    gdn, chunked, scatter = (
        "gated_delta_rule.recurrent",
        "gated_delta_rule.chunked",
        "gated_delta_rule.scatter_accepted",
    )
    old, c64 = "old default: C=64, BV=64, 8 warps", {"chunk_size": 64, "num_warps": 8}
    rows = [
        ("gdn recurrent (decode)", "default: BV=32, 4 warps", _launch(gdn, "decode")),
        ("gdn recurrent (engine gating)", "default: BV=32, 4 warps", _launch(gdn, "gating")),
        ("gdn recurrent (verify, D=4)", "default: BV=32, 4 warps", _launch(gdn, "verify")),
        ("gdn scatter_accepted", "default: BLOCK=1024, 4 warps", _launch(scatter, "accept")),
        ("gdn chunked", "default: C=16, BV=16, 8 warps", _launch(chunked, "extend")),
        ("gdn chunked", "C=16, BV=32, 8 warps", _launch(chunked, "extend", block_v=32)),
        ("gdn chunked", "C=16, BV=32, 4 warps", _launch(chunked, "extend", block_v=32, num_warps=4)),
        ("gdn chunked", "C=32, BV=16, 8 warps", _launch(chunked, "extend", chunk_size=32)),
        ("gdn chunked", old, _launch(chunked, "extend", block_v=64, **c64)),
        ("gdn chunked", "C=64, BV=32, 8 warps", _launch(chunked, "extend", block_v=32, **c64)),
        ("causal_conv1d update", "default: BLOCK_D=256, 4 warps", _launch("causal_conv1d.update", "decode")),
        ("causal_conv1d varlen", "default: BLOCK_D=256, 4 warps", _launch("causal_conv1d.varlen", "extend")),
        ("mamba2 selective_state_update", "default: BLOCK_P=32, BLOCK_S=128, 4 warps",
         _launch("mamba2.selective_state_update", "decode")),
        ("linear_attn recurrent", "default: BLOCK_V=64, 4 warps", _launch("linear_attn.recurrent", "decode")),
    ]  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="90", help="compute capability without the dot (90: H100/H200)")
    ap.add_argument("--json", default=None, help="also write the table as JSON here")
    args = ap.parse_args(argv)
    ptx_arch = f"{args.arch}a" if args.arch == "90" else args.arch  # Triton emits sm_90a for Hopper
    os.environ["TRITON_CACHE_DIR"] = CACHE_DIR
    triton_driver.set_active(CompileOnlyDriver(GPUTarget("cuda", int(args.arch), 32)))
    rows = []
    print(f"| kernel | config | regs | spill stores B | spill loads B | stack B | shared B |  (sm_{ptx_arch})")
    print("|---|---|---|---|---|---|---|")
    for kernel, config, launch in launches():
        try:
            rep = compile_and_report(launch)
        except Exception as e:  # one kernel that does not compile must not hide the others
            rep = {"error": f"{type(e).__name__}: {e}"}
        rows.append({"kernel": kernel, "config": config, **rep})
        if "error" in rep:
            print(f"| {kernel} | {config} | error: {rep['error'][:200]} |")
        else:
            print(
                f"| {kernel} | {config} | {rep['regs']} | {rep['spill_store_bytes']} | {rep['spill_load_bytes']} "
                f"| {rep['stack_bytes']} | {rep['shared_bytes']} |"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"arch": ptx_arch, "triton": triton.__version__, "rows": rows}, indent=1))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
