"""CPU timings of the kernels' torch references at engine-like decode shapes, against a copy floor.

    python -m workbench.bench.kernels [--quick] [--json PATH]

Decode is memory-bound: every row reads and writes its whole recurrent state once per step. The floor of
each measurement is the time to copy the same number of state bytes (`dst.copy_(src)`, preallocated,
read + write), so `ratio = median / floor` says how far an op is from moving its state at copy speed.
Times are medians of torch.utils.benchmark.Timer.blocked_autorange. The CPU may be shared: ratios are
measured back to back and are steadier than the absolute numbers.

Adding an op: write a `_case_<name>(bs) -> (fn, state_bytes)` builder and list it in `CASES`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.benchmark import Timer

DEFAULT_JSON = "benchmarks/results/kernels_cpu.json"
FULL_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
QUICK_BATCHES = (1, 8, 32)

Case = Callable[[int], tuple[Callable[[], object], int]]


def _pool(bs: int, *shape: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A float32 pool with a reserved slot 0 and live rows on shuffled slots 1..bs."""
    state = torch.randn(bs + 1, *shape) * 0.1
    slots = (torch.randperm(bs) + 1).to(torch.int32)
    return state, slots


def _case_gdn_recurrent(bs: int, H: int = 16, HV: int = 32, K: int = 128, V: int = 128):
    """Gated DeltaNet decode (Qwen3-Next-like heads), bf16 activations, fp32 gates and state."""
    from kernels import gated_delta_rule as gdn

    state, slots = _pool(bs, HV, K, V)
    cu = torch.arange(bs + 1, dtype=torch.int32)
    q, k = (torch.randn(bs, H, K, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(bs, HV, V, dtype=torch.bfloat16)
    g, beta = -torch.rand(bs, HV), torch.rand(bs, HV)
    out = torch.empty(bs, HV, V, dtype=torch.bfloat16)

    def fn():
        return gdn.recurrent(
            q,
            k,
            v,
            g,
            beta,
            state=state,
            state_indices=slots,
            cu_seqlens=cu,
            use_qk_l2norm=True,
            out=out,
            impl="reference",
        )

    return fn, bs * HV * K * V * 4


def _case_linear_attn(bs: int, H: int = 16, HV: int = 32, K: int = 128, V: int = 128):
    from kernels import linear_attn

    state, slots = _pool(bs, HV, K, V)
    cu = torch.arange(bs + 1, dtype=torch.int32)
    q, k = (torch.randn(bs, H, K, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(bs, HV, V, dtype=torch.bfloat16)
    out = torch.empty(bs, HV, V, dtype=torch.bfloat16)

    def fn():
        return linear_attn.recurrent(q, k, v, state, slots, cu, out=out, impl="reference")

    return fn, bs * HV * K * V * 4


def _case_mamba2(bs: int, nheads: int = 64, headdim: int = 64, dstate: int = 128, ngroups: int = 8):
    from kernels import mamba2

    state, slots = _pool(bs, nheads, headdim, dstate)
    x = torch.randn(bs, nheads, headdim, dtype=torch.bfloat16)
    dt = torch.rand(bs, nheads, 1).expand(bs, nheads, headdim)
    A = -torch.rand(nheads, 1, 1).expand(nheads, headdim, dstate)
    B, C = (torch.randn(bs, ngroups, dstate, dtype=torch.bfloat16) for _ in range(2))
    out = torch.empty(bs, nheads, headdim, dtype=torch.bfloat16)

    def fn():
        return mamba2.selective_state_update(
            state, x, dt, A, B, C, state_batch_indices=slots, out=out, impl="reference"
        )

    return fn, bs * nheads * headdim * dstate * 4


def _case_causal_conv1d(bs: int, dim: int = 8192, width: int = 4):
    from kernels import causal_conv1d

    state, slots = _pool(bs, dim, width - 1)
    x = torch.randn(bs, 1, dim, dtype=torch.bfloat16)
    weight = torch.randn(dim, width, dtype=torch.bfloat16)
    out = torch.empty(bs, 1, dim, dtype=torch.bfloat16)

    def fn():
        return causal_conv1d.update(
            x, state, weight, conv_state_indices=slots, activation="silu", out=out, impl="reference"
        )

    return fn, bs * dim * (width - 1) * 4


CASES: dict[str, Case] = {
    "gdn_recurrent": _case_gdn_recurrent,
    "linear_attn_recurrent": _case_linear_attn,
    "mamba2_selective_state_update": _case_mamba2,
    "causal_conv1d_update": _case_causal_conv1d,
}


def _median_s(fn: Callable[[], object], min_run_time: float) -> float:
    fn()  # warm-up: first-call imports and allocations stay out of the timing
    return Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time).median


def _floor_s(nbytes: int, min_run_time: float) -> float:
    src = torch.randn(nbytes // 4)
    dst = torch.empty_like(src)
    return _median_s(lambda: dst.copy_(src), min_run_time)


def run(quick: bool = False, json_path: str | None = None, ops: list[str] | None = None) -> dict:
    """Time every op in `ops` (default: all of CASES) at decode batch sizes; print a table.

    Returns {"meta": {...}, "results": [{"op", "bs", "median_us", "floor_us", "ratio", "state_bytes",
    "GBps"}, ...]} and writes it as JSON to `json_path` when given. An op whose module is missing or
    broken is reported under "errors" instead of stopping the others.
    """
    batches = QUICK_BATCHES if quick else FULL_BATCHES
    min_run_time = 0.05 if quick else 0.2
    torch.manual_seed(0)
    results, errors = [], {}
    print(f"{'op':<32}{'bs':>5}{'median us':>12}{'floor us':>12}{'ratio':>8}{'GB/s':>8}")
    for name in ops or list(CASES):
        for bs in batches:
            try:
                fn, nbytes = CASES[name](bs)
                t = _median_s(fn, min_run_time)
            except Exception as exc:  # report and go on: one broken op must not hide the others
                errors[name] = f"{type(exc).__name__}: {exc}"
                print(f"{name:<32} error: {errors[name]}")
                break
            floor = _floor_s(nbytes, min_run_time)
            row = {
                "op": name,
                "bs": bs,
                "median_us": t * 1e6,
                "floor_us": floor * 1e6,
                "ratio": t / floor,
                "state_bytes": nbytes,
                "GBps": 2 * nbytes / t / 1e9,  # state read + written
            }
            results.append(row)
            print(
                f"{name:<32}{bs:>5}{row['median_us']:>12.0f}{row['floor_us']:>12.0f}{row['ratio']:>8.2f}{row['GBps']:>8.1f}"
            )
            del fn
    report = {
        "meta": {
            "device": "cpu",
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "machine": platform.machine(),
            "quick": quick,
            "floor": "dst.copy_(src) of the same float32 state bytes",
        },
        "results": results,
        "errors": errors,
    }
    if json_path:
        path = Path(json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1))
        print(f"wrote {path}")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.bench.kernels", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three batch sizes, short timings")
    parser.add_argument("--json", default=DEFAULT_JSON, help=f"output path (default {DEFAULT_JSON}; '' for none)")
    parser.add_argument("--ops", nargs="*", choices=list(CASES), help="subset of ops (default: all)")
    args = parser.parse_args(argv)
    report = run(quick=args.quick, json_path=args.json or None, ops=args.ops)
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
