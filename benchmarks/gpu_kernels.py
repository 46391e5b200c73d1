"""Check, then time, every Triton kernel of `kernels/` on one NVIDIA GPU (written for a lent H200).

    python benchmarks/gpu_kernels.py                 # checks + timings, ~3-5 min on an H200
    python benchmarks/gpu_kernels.py --sweep         # + block_v x num_warps sweeps (GDN decode and chunked)
    python benchmarks/gpu_kernels.py --dry-run       # the same code paths on the CPU, Triton interpreter, tiny shapes

Every op -- GDN recurrent with ready gates and with the engine's raw gating inputs (what the layer
calls), GDN target-verify (intermediate states, no state write), scatter after verify, GDN chunked
prefill, causal conv1d update and varlen, Mamba2 selective state update, plain linear attention -- goes
through the same three steps:

1. Checks on the device, against the same op's torch reference run in float64 on the same device: small
   awkward cases under every padding convention (sglang -1, vLLM 0, Ascend dummy slot processed; K, V
   not powers of two), then the benchmark shape itself. Outputs and intermediate buffers are poisoned
   with NaN first; slots no live row owns must come back bitwise unchanged. Under the Ascend convention
   several padded rows write slot 0 concurrently (a benign race), so slot 0 is never compared there.
   A configuration whose check fails is not timed.
2. Timing: the op is captured `INNER` times in a CUDA graph and replayed (host Python out of the
   measurement, as in an engine's decode graph); median CUDA-event time over replays / INNER. Falls back to
   events around eager calls when capture is refused (noted as "events"). The floor is a device-to-device
   copy of the op's state bytes, timed the same way: `frac_of_copy = copy time / op time`.
   `GBps` uses the op's cost model (`kernels/*/cost.py`: the bytes really read and written, inputs,
   outputs, weights and metadata included). `l2_resident` flags rows whose working set fits in the
   device's L2 (then GB/s may exceed the HBM peak: the replays hit the cache).
3. Resources: registers and spill bytes of each launched configuration, from the compiled kernel's
   metadata (`CompiledKernel.n_regs`, `.n_spills`); with `--sweep`, per swept config, each checked first.

Optionally times flash-linear-attention's `fused_recurrent_gated_delta_rule` on the decode shapes when
`fla` imports (and says it is skipped when it does not).

Writes benchmarks/results/gpu_kernels_<device type>.json (a dry run: gpu_kernels_dryrun_cpu.json).
Exit status: 0 when every check passed and nothing errored, 1 otherwise, 2 without a CUDA device.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
INNER = 10  # op calls per captured graph
# L2 sizes by device name, where torch does not report it (torch.cuda.get_device_properties(..).L2_cache_size)
L2_BYTES = {"H200": 50 * 2**20, "H100": 50 * 2**20, "H20": 60 * 2**20, "A100": 40 * 2**20, "L40S": 96 * 2**20}
CONVENTIONS = {"sglang": -1, "vllm": 0, "ascend": None}  # pad_slot_id of each padding convention


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="CPU + TRITON_INTERPRET=1, tiny shapes, wall-clock timing")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/gpu_kernels_<device>.json)")
    p.add_argument("--batches", type=int, nargs="*", default=None, help="decode batch sizes")
    p.add_argument("--reps", type=int, default=30, help="graph replays per measurement")
    p.add_argument("--sweep", action="store_true", help="sweep block_v x num_warps of the GDN kernels")
    p.add_argument("--ops", nargs="*", default=None, help="a subset of the ops (default: all)")
    p.add_argument("--budget-s", type=float, default=420.0, help="start no new measurement after this")
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------------ setup


class Env:
    """The device, dtypes and shapes of one run, and the modules imported once TRITON_INTERPRET is set."""

    def __init__(self, args: argparse.Namespace) -> None:
        if args.dry_run:
            os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
        sys.path.insert(0, str(REPO))
        import torch

        self.torch = torch
        self.dry = args.dry_run
        self.dev = torch.device("cpu") if self.dry else torch.empty(0, device="cuda").device
        self.act = torch.float32 if self.dry else torch.bfloat16  # bf16 is wrong in the interpreter
        self.reps = 1 if self.dry else args.reps  # the interpreter's times mean nothing: run the path once
        self.t0 = time.time()
        self.budget = args.budget_s
        self.gdn = importlib.import_module("kernels.gated_delta_rule")
        self.conv = importlib.import_module("kernels.causal_conv1d")
        self.mamba2 = importlib.import_module("kernels.mamba2")
        self.la = importlib.import_module("kernels.linear_attn")
        self.l2_bytes = self._l2_bytes()

    def _l2_bytes(self) -> int | None:
        if self.dev.type != "cuda":
            return None
        props = self.torch.cuda.get_device_properties(self.dev)
        size = getattr(props, "L2_cache_size", None)
        if size:
            return int(size)
        return next((b for name, b in L2_BYTES.items() if name in props.name), None)

    def over_budget(self) -> bool:
        return time.time() - self.t0 > self.budget

    def gen(self, seed: int):
        return self.torch.Generator().manual_seed(seed)

    def randn(self, g, *shape, dtype=None, scale: float = 1.0):
        """Drawn on the host (reproducible across devices), then moved."""
        t = self.torch.randn(*shape, generator=g) * scale
        return t.to(device=self.dev, dtype=dtype or self.torch.float32)

    def rand(self, g, *shape, lo: float = 0.0, hi: float = 1.0):
        return (lo + (hi - lo) * self.torch.rand(*shape, generator=g)).to(self.dev)

    def ints(self, values, dtype=None):
        return self.torch.tensor(values, dtype=dtype or self.torch.int32, device=self.dev)


# ------------------------------------------------------------------------------------------------ cases


@dataclass
class Case:
    """One op call: its public function, the Triton launcher with the same keyword arguments, the
    arguments, what it writes, and which pool slots live rows may change.

    ``kwargs`` are passed by keyword to both ``op`` (plus ``impl=``) and ``launcher`` (plus the
    configuration); ``outputs`` are NaN-poisoned before a call and compared in full; ``pools`` maps a pool
    argument to the slots live rows write (every other slot must come back bitwise unchanged, except slot 0
    under the Ascend convention, where padded rows race on it). For the same reason, the outputs of padded
    rows that really run on slot 0 (conv update, Mamba2: one token per row) are undefined there, and
    ``compare_rows`` limits the comparison to the live rows.
    """

    name: str
    op: Callable[..., Any]
    launcher: str
    kwargs: dict[str, Any]
    outputs: tuple[str, ...]
    pools: dict[str, set[int]]
    cost: Any
    copy_bytes: int  # the floor: bytes of state the op must read and write
    tol: float
    ascend: bool = False
    compare_rows: int | None = None  # outputs compared on their first this-many rows only (see below)

    def tensors(self):
        import torch

        return {k: v for k, v in self.kwargs.items() if isinstance(v, torch.Tensor)}

    def footprint(self) -> int:
        """Bytes of memory the op's tensors live in (each storage once: expanded views cost their storage):
        the working set of back-to-back calls."""
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in self.tensors().values()}
        return sum(storages.values())


def _rows(env: Env, n_live: int, n_pad: int, convention: str, seed: int) -> tuple[list[int], int | None, set[int]]:
    """Slots of n_live live rows (a shuffled 1..n_live: slot 0 is the dummy / null slot) then n_pad padded
    rows carrying the convention's sentinel. Returns (slots, pad_slot_id, live slots)."""
    perm = (env.torch.randperm(n_live, generator=env.gen(seed)) + 1).tolist()
    pad = CONVENTIONS[convention]
    sentinel = -1 if pad == -1 else 0
    return perm + [sentinel] * n_pad, pad, set(perm)


def _cu(env: Env, lens: list[int]):
    out, acc = [0], 0
    for n in lens:
        acc += n
        out.append(acc)
    return env.ints(out)


def gdn_case(env: Env, kind: str, bs: int, *, small: bool, convention: str = "sglang", n_pad: int = 0, seed: int = 0):
    """kind: decode | gating | verify | chunked. small: awkward shapes (K, V not powers of two)."""
    torch, gdn = env.torch, env.gdn
    H, HV, K, V = (1, 2, 12, 20) if small else ((1, 2, 16, 16) if env.dry else (16, 32, 128, 128))
    D = 3 if small else 4
    L = {"decode": 1, "gating": 1, "verify": D, "chunked": 20 if small else (16 if env.dry else 1024)}[kind]
    slots, pad, live = _rows(env, bs, n_pad, convention, seed)
    lens = [L] * bs + [0] * n_pad  # padded rows of a varlen batch are zero-length (qsl padded with its last value)
    if kind == "chunked" and small:
        lens[0] = 5  # a short row next to a chunk and a tail
    T = sum(lens) + (2 if small else 0)  # tokens past cu_seqlens[-1]: a bucket's padding, zeroed
    g = env.gen(seed + 1)
    act = torch.float32 if small else env.act
    kw: dict[str, Any] = dict(
        q=env.randn(g, T, H, K, dtype=act),
        k=torch.nn.functional.normalize(env.randn(g, T, H, K), dim=-1).to(act),
        v=env.randn(g, T, HV, V, dtype=act),
        state=env.randn(g, bs + 1, HV, K, V, scale=0.5),
        state_indices=env.ints(slots),
        cu_seqlens=_cu(env, lens),
        out=torch.empty(T, HV, V, dtype=act, device=env.dev),
        scale=K**-0.5,
        use_qk_l2norm=True,
        has_initial_state=None,
        disable_state_update=kind == "verify",
        pad_slot_id=pad,
    )
    if kind == "gating":  # the engine's raw inputs, gated inside the kernel: what the layer calls
        kw.update(
            a=env.randn(g, T, HV, scale=2.0),
            b=env.randn(g, T, HV, scale=2.0),
            A_log=env.randn(g, HV, scale=0.5),
            dt_bias=env.randn(g, HV, scale=0.5),
        )
    else:
        kw.update(g=-env.rand(g, T, HV, lo=0.02, hi=0.5), beta=env.rand(g, T, HV, lo=0.1, hi=0.9))
    outputs: tuple[str, ...] = ("out",)
    if kind == "verify":
        kw["intermediate_states"] = torch.empty(bs + n_pad, D, HV, K, V, device=env.dev)
        outputs += ("intermediate_states",)
    if kind == "chunked":
        kw["chunk_size"] = gdn.ops.DEFAULT_CHUNK_SIZE
        op, launcher = gdn.chunked, "kernels.gated_delta_rule.triton_chunked:launch_chunked"
    else:
        kw["intermediate_states"] = kw.get("intermediate_states")
        op, launcher = gdn.recurrent, "kernels.gated_delta_rule.triton_recurrent:launch_recurrent"
    state_bytes = bs * HV * K * V * 4
    if kind == "chunked":
        cost = gdn.chunked_cost(sum(lens), bs, H, HV, K, V, act, chunk_size=kw["chunk_size"])
    else:
        cost = gdn.recurrent_cost(
            sum(lens), bs, H, HV, K, V, act, num_intermediate=bs * D if kind == "verify" else 0,
            fused_gating=kind == "gating", use_qk_l2norm=True, state_update=kind != "verify",
        )  # fmt: skip
    written = set() if kind == "verify" else live
    tol = 2e-5 if small else (2e-2 if act == torch.bfloat16 else 1e-4)
    copy_bytes = state_bytes * (D + 1) if kind == "verify" else 2 * state_bytes
    return Case(f"gdn_{kind}", op, launcher, kw, outputs, {"state": written}, cost, copy_bytes, tol, pad is None)


def gdn_scatter_case(env: Env, bs: int, *, small: bool, convention: str = "sglang", n_pad: int = 0, seed: int = 0):
    HV, K, V = (2, 12, 20) if small else ((2, 16, 16) if env.dry else (32, 128, 128))
    D = 4
    slots, pad, live = _rows(env, bs, n_pad, convention, seed)
    g = env.gen(seed + 2)
    acc = (env.torch.randint(1, D + 1, (bs + n_pad,), generator=g)).to(env.torch.int32)
    kw = dict(
        state=env.randn(g, bs + 1, HV, K, V),
        intermediate_states=env.randn(g, bs + n_pad, D, HV, K, V),
        state_indices=env.ints(slots),
        num_accepted=acc.to(env.dev),
        pad_slot_id=pad,
    )
    # Ascend: padded rows are live to the kernel and write slot 0 from their own intermediate row
    written = live | ({0} if pad is None and n_pad else set())
    cost = env.gdn.scatter_accepted_cost(bs, HV, K, V)
    state_bytes = bs * HV * K * V * 4
    launcher = "kernels.gated_delta_rule.triton_recurrent:launch_scatter_accepted"
    return Case("gdn_scatter_accepted", env.gdn.scatter_accepted, launcher, kw, (), {"state": written}, cost,
                2 * state_bytes, 0.0, pad is None)  # fmt: skip


def conv_update_case(env: Env, bs: int, *, small: bool, convention: str = "sglang", n_pad: int = 0, seed: int = 0):
    torch = env.torch
    dim, W = (40, 4) if small else ((64, 4) if env.dry else (8192, 4))
    L = 1 if not small else 2  # small: a verify-like step of 2 tokens with intermediate windows
    slots, pad, live = _rows(env, bs, n_pad, convention, seed)
    N = bs + n_pad
    g = env.gen(seed + 3)
    act = torch.float32 if small else env.act
    kw: dict[str, Any] = dict(
        x=env.randn(g, N, L, dim, dtype=act),
        conv_state=env.randn(g, bs + 1, dim, W - 1),
        weight=env.randn(g, dim, W, dtype=act),
        bias=env.randn(g, dim, dtype=act),
        conv_state_indices=env.ints(slots),
        intermediate_conv_windows=torch.empty(N, L, dim, W - 1, device=env.dev) if small else None,
        out=torch.empty(N, L, dim, dtype=act, device=env.dev),
        activation="silu",
        disable_state_update=False,
        pad_slot_id=pad,
    )
    outputs = ("out", "intermediate_conv_windows") if small else ("out",)
    cost = env.conv.update_cost(bs, L, dim, W, act, state_dtype=torch.float32, intermediate=small)
    written = live | ({0} if pad is None and n_pad else set())
    tol = 2e-5 if small else (2e-2 if act == torch.bfloat16 else 1e-4)
    launcher = "kernels.causal_conv1d.triton_conv:update_triton"
    return Case("conv1d_update", env.conv.update, launcher, kw, outputs, {"conv_state": written}, cost,
                2 * bs * dim * (W - 1) * 4, tol, pad is None, bs if pad is None else None)  # fmt: skip


def conv_varlen_case(env: Env, bs: int, *, small: bool, convention: str = "sglang", n_pad: int = 0, seed: int = 0):
    torch = env.torch
    dim, W = (40, 4) if small else ((64, 4) if env.dry else (8192, 4))
    slots, pad, live = _rows(env, bs, n_pad, convention, seed)
    lens = [(1 + (n * 3) % 7) for n in range(bs)] + [0] * n_pad if small else [6 if env.dry else 512] * bs
    T = sum(lens) + (2 if small else 0)
    g = env.gen(seed + 4)
    act = torch.float32 if small else env.act
    init = [n % 3 != 1 for n in range(bs + n_pad)]
    kw: dict[str, Any] = dict(
        x=env.randn(g, T, dim, dtype=act),
        weight=env.randn(g, dim, W, dtype=act),
        bias=env.randn(g, dim, dtype=act),
        conv_state=env.randn(g, bs + 1, dim, W - 1),
        cache_indices=env.ints(slots),
        has_initial_state=torch.tensor(init, device=env.dev),
        cu_seqlens=_cu(env, lens),
        out=torch.empty(T, dim, dtype=act, device=env.dev),
        activation="silu",
        pad_slot_id=pad,
    )
    cost = env.conv.varlen_cost(sum(lens), bs, dim, W, act, state_dtype=torch.float32)
    tol = 2e-5 if small else (2e-2 if act == torch.bfloat16 else 1e-4)
    launcher = "kernels.causal_conv1d.triton_conv:varlen_triton"
    return Case("conv1d_varlen", env.conv.varlen, launcher, kw, ("out",), {"conv_state": live}, cost,
                2 * bs * dim * (W - 1) * 4, tol, pad is None)  # fmt: skip


def mamba2_case(env: Env, bs: int, *, small: bool, convention: str = "sglang", n_pad: int = 0, seed: int = 0):
    torch = env.torch
    nh, hd, ds, ng = (4, 12, 20, 2) if small else ((4, 16, 16, 2) if env.dry else (64, 64, 128, 8))
    slots, pad, live = _rows(env, bs, n_pad, convention, seed)
    N = bs + n_pad
    g = env.gen(seed + 5)
    act = torch.float32 if small else env.act
    kw: dict[str, Any] = dict(
        state=env.randn(g, bs + 1, nh, hd, ds, scale=0.3),
        x=env.randn(g, N, nh, hd, dtype=act),
        dt=env.rand(g, N, nh, 1).expand(N, nh, hd),  # per-head values expanded (stride 0), as engines pass them
        A=-env.rand(g, nh, 1, 1, lo=0.1, hi=1.0).expand(nh, hd, ds),
        B=env.randn(g, N, ng, ds, dtype=act),
        C=env.randn(g, N, ng, ds, dtype=act),
        D=env.randn(g, nh, 1).expand(nh, hd),
        z=env.randn(g, N, nh, hd, dtype=act),
        dt_bias=env.randn(g, nh, 1, scale=0.5).expand(nh, hd),
        dt_softplus=True,
        state_batch_indices=env.ints(slots),
        pad_slot_id=pad,
        out=torch.empty(N, nh, hd, dtype=act, device=env.dev),
    )
    cost = env.mamba2.selective_state_update_cost(bs, nh, hd, ds, ng, act)
    written = live | ({0} if pad is None and n_pad else set())
    tol = 2e-5 if small else (2e-2 if act == torch.bfloat16 else 1e-4)
    launcher = "kernels.mamba2.triton_ssu:selective_state_update_triton"
    return Case("mamba2_ssu", env.mamba2.selective_state_update, launcher, kw, ("out",), {"state": written}, cost,
                2 * bs * nh * hd * ds * 4, tol, pad is None, bs if pad is None else None)  # fmt: skip


def linear_attn_case(env: Env, bs: int, *, small: bool, convention: str = "sglang", n_pad: int = 0, seed: int = 0):
    torch = env.torch
    H, HV, K, V = (1, 2, 12, 20) if small else ((1, 2, 16, 16) if env.dry else (16, 32, 128, 128))
    slots, pad, live = _rows(env, bs, n_pad, convention, seed)
    lens = [1 + n % 3 for n in range(bs)] + [0] * n_pad if small else [1] * bs
    T = sum(lens) + (2 if small else 0)
    g = env.gen(seed + 6)
    act = torch.float32 if small else env.act
    kw: dict[str, Any] = dict(
        q=env.randn(g, T, H, K, dtype=act),
        k=env.randn(g, T, H, K, dtype=act, scale=0.3),
        v=env.randn(g, T, HV, V, dtype=act),
        state=env.randn(g, bs + 1, HV, K, V, scale=0.3),
        state_indices=env.ints(slots),
        cu_seqlens=_cu(env, lens),
        scale=K**-0.5,
        pad_slot_id=pad,
        out=torch.empty(T, HV, V, dtype=act, device=env.dev),
    )
    cost = env.la.recurrent_cost(sum(lens), bs, H, HV, K, V, act)
    tol = 2e-5 if small else (2e-2 if act == torch.bfloat16 else 1e-4)
    launcher = "kernels.linear_attn.triton_recurrent:recurrent_triton"
    return Case("linear_attn", env.la.recurrent, launcher, kw, ("out",), {"state": live}, cost,
                2 * bs * HV * K * V * 4, tol, pad is None)  # fmt: skip


BUILDERS: dict[str, Callable[..., Case]] = {
    "gdn_decode": lambda env, bs, **kw: gdn_case(env, "decode", bs, **kw),
    "gdn_gating_decode": lambda env, bs, **kw: gdn_case(env, "gating", bs, **kw),
    "gdn_verify": lambda env, bs, **kw: gdn_case(env, "verify", bs, **kw),
    "gdn_scatter_accepted": gdn_scatter_case,
    "gdn_chunked": lambda env, bs, **kw: gdn_case(env, "chunked", bs, **kw),
    "conv1d_update": conv_update_case,
    "conv1d_varlen": conv_varlen_case,
    "mamba2_ssu": mamba2_case,
    "linear_attn": linear_attn_case,
}
SWEPT = {"gdn_decode": ((16, 32, 64, 128), (1, 2, 4, 8)), "gdn_chunked": ((16, 32, 64), (2, 4, 8))}


# ------------------------------------------------------------------------------------------------ check


def rel_err(env: Env, got, want) -> float:
    """max |got - want| / max(1, max |want|), NaN-aware: NaN where the other side is not NaN is an error
    (an unwritten poisoned row, or a row written that should not be); NaN on both sides is not."""
    torch = env.torch
    a, b = got.detach().double(), want.detach().double().to(got.device)
    if a.numel() == 0:
        return 0.0
    both = a.isnan() & b.isnan()
    diff = torch.where(both, torch.zeros_like(a), (a - b).abs())
    diff = torch.where(diff.isnan(), torch.full_like(diff, float("inf")), diff)
    scale = max(1.0, float(torch.nan_to_num(b, nan=0.0).abs().max()))
    return float(diff.max()) / scale


def _fresh(env: Env, case: Case, dtype=None) -> dict[str, Any]:
    """A copy of the arguments (floats in ``dtype`` when given), outputs poisoned with NaN."""
    torch = env.torch
    out = {}
    for k, v in case.kwargs.items():
        if isinstance(v, torch.Tensor):
            v = v.clone() if dtype is None or not v.is_floating_point() else v.to(dtype)  # .to copies
            if k in case.outputs:
                v.fill_(float("nan"))
        out[k] = v
    return out


def check_case(env: Env, case: Case, *, block_v: int | None = None, num_warps: int | None = None) -> dict:
    """Triton (the public op, or the launcher with a configuration) vs the op's reference in float64 on the
    same device. Returns a row with the errors, the untouched-slot verdict and ``ok``."""
    torch = env.torch
    tri = _fresh(env, case)
    if block_v is None and num_warps is None:
        case.op(**tri, impl="triton")
    else:
        launch(case, tri, block_v=block_v, num_warps=num_warps)
    ref = _fresh(env, case, torch.float64)
    case.op(**ref, impl="reference")
    rows = slice(case.compare_rows)  # slice(None): all
    errs = {name: rel_err(env, tri[name][rows], ref[name][rows]) for name in case.outputs}
    untouched = True
    for pool, written in case.pools.items():
        before, after, want = case.kwargs[pool], tri[pool], ref[pool]
        for s in range(before.shape[0]):
            if case.ascend and s == 0:
                continue  # padded rows race on the dummy slot: never compared on a device
            if s in written:
                errs[f"{pool}[written]"] = max(errs.get(f"{pool}[written]", 0.0), rel_err(env, after[s], want[s]))
            elif not torch.equal(after[s], before[s]):
                untouched = False
    ok = untouched and all(e <= case.tol for e in errs.values())
    return dict(errors=errs, untouched=untouched, tol=case.tol, ok=ok)


def launch(case: Case, kwargs: dict[str, Any], **config) -> Any:
    """The case's Triton launcher on ``kwargs`` with an explicit configuration; returns the compiled kernel."""
    module, _, name = case.launcher.partition(":")
    fn = getattr(importlib.import_module(module), name)
    extra = {k: v for k, v in config.items() if v is not None}
    args = {k: v for k, v in kwargs.items() if k not in ("impl",)}
    if case.name.startswith("gdn_") and case.name != "gdn_scatter_accepted":
        args.setdefault("intermediate_states", None)
    if case.name == "gdn_chunked":
        args.pop("intermediate_states", None)
    return fn(**args, **extra)


def resources(kernel: Any) -> dict[str, Any]:
    """Registers and spill bytes of a compiled kernel (None in the interpreter)."""
    if kernel is not None and hasattr(kernel, "_init_handles"):
        kernel._init_handles()  # n_regs / n_spills are read from the loaded module
    if kernel is None or not hasattr(kernel, "n_regs"):
        return {"n_regs": None, "n_spills": None}
    return {"n_regs": int(kernel.n_regs), "n_spills": int(kernel.n_spills), "shared": int(kernel.metadata.shared)}


def padding_checks(env: Env, ops: list[str]) -> list[dict]:
    """Every op at small awkward shapes under the three padding conventions, two padded rows each."""
    rows = []
    for op in ops:
        build = BUILDERS[op]
        for convention in CONVENTIONS:
            try:
                case = build(env, 3, small=True, convention=convention, n_pad=2, seed=len(rows))
                rows.append(dict(check=f"{op}/{convention}", **check_case(env, case)))
            except Exception:
                rows.append(dict(check=f"{op}/{convention}", ok=False, trace=traceback.format_exc()))
            print(f"check {rows[-1]['check']:<32} ok={rows[-1]['ok']}")
    return rows


# ------------------------------------------------------------------------------------------------ timing


def measure_us(env: Env, fn: Callable[[], Any]) -> tuple[float, str]:
    """Median microseconds of one fn() call, and how it was measured ("graph", "events" or "wall")."""
    torch, reps = env.torch, env.reps
    fn()  # compile / warm up
    if env.dev.type == "cpu":
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts) * 1e6, "wall"
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as required before capture
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(INNER):
                fn()
        run, per, mode = graph.replay, INNER, "graph"
    except Exception as e:  # capture refused: events around eager calls (host overhead included)
        torch.cuda.synchronize()
        why = (str(e).splitlines() or [""])[0][:200]
        print(f"  CUDA graph capture refused ({type(e).__name__}: {why}); timing eager calls between events instead")
        run, per, mode = fn, 1, "events"
    run()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends, strict=True):
        s.record()
        run()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)) * 1e3 / per, mode


class Timer:
    """Times cases against the device copy floor (cached per byte count) and collects rows."""

    def __init__(self, env: Env) -> None:
        self.env, self.rows, self._floors = env, [], {}

    def floor_us(self, nbytes: int) -> float:
        if nbytes not in self._floors:
            torch = self.env.torch
            src = torch.randn(max(nbytes // 8, 1), device=self.env.dev)  # read nbytes/2, write nbytes/2
            dst = torch.empty_like(src)
            self._floors[nbytes] = measure_us(self.env, lambda: dst.copy_(src))[0]
        return self._floors[nbytes]

    def time(self, op: str, bs: int, case: Case, check: dict, *, block_v=None, num_warps=None) -> dict:
        env = self.env
        kw = case.kwargs  # as built: engine layouts (stride-0 expanded parameters) kept
        kernel = launch(case, kw, block_v=block_v, num_warps=num_warps)
        if block_v is None and num_warps is None:
            t, mode = measure_us(env, lambda: case.op(**kw, impl="triton"))
        else:
            t, mode = measure_us(env, lambda: launch(case, kw, block_v=block_v, num_warps=num_warps))
        floor = self.floor_us(case.copy_bytes)
        foot = case.footprint()
        row = dict(
            op=op, bs=bs, block_v=block_v, num_warps=num_warps, median_us=t, mode=mode,
            bytes=case.cost.bytes, GBps=case.cost.bytes / t / 1e3, TFLOPs=case.cost.flops / t / 1e6,
            copy_us=floor, frac_of_copy=floor / t, footprint_bytes=foot,
            l2_resident=None if env.l2_bytes is None else foot <= env.l2_bytes,
            max_rel_err=max(check["errors"].values(), default=0.0), **resources(kernel),
        )  # fmt: skip
        self.rows.append(row)
        cfg = "" if block_v is None and num_warps is None else f" bv={block_v} nw={num_warps}"
        l2 = " L2" if row["l2_resident"] else ""
        regs = "" if row["n_regs"] is None else f"  regs {row['n_regs']} spill {row['n_spills']}B"
        print(
            f"{op:<22} bs={bs:<4}{cfg} {t:9.1f} us  {row['GBps']:7.1f} GB/s{l2}  frac {row['frac_of_copy']:.2f}  "
            f"[{mode}]  err {row['max_rel_err']:.1e}{regs}"
        )
        return row


# ------------------------------------------------------------------------------------------------ fla


def fla_tolerance(env: Env, dtype) -> float:
    """How far fla's output may be from ours (``rel_err``: max |diff| over max(1, max |out|)).

    Both kernels read the same inputs, accumulate in fp32 and round the output once to ``dtype``; each
    rounding is within half an ulp, so the two differ by up to one ulp of the largest output (bf16: 2^-7 of it)
    and a second ulp where fp32 summation order tips a rounding. Two machine epsilons of ``dtype``: 1.6e-2 for
    bf16, 2e-3 for fp16; 1e-4 for fp32, where the summation order alone is the difference."""
    return max(2 * env.torch.finfo(dtype).eps, 1e-4)


def fla_checks(rows: list[dict]) -> list[dict]:
    """The comparisons that ran, as checks (a skipped or failed fla call is no check: fla is optional)."""
    return [
        dict(check=f"fla_vs_ours/bs={r['bs']}", errors={"out": r["out_diff_vs_ours"]}, tol=r["tol"], ok=ok)
        for r in rows
        if "out_diff_vs_ours" in r
        for ok in [r["out_diff_vs_ours"] <= r["tol"]]
    ]


def fla_rows(env: Env, batches: list[int]) -> list[dict]:
    """flash-linear-attention's fused_recurrent_gated_delta_rule on the decode shapes, beside ours."""
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except Exception as e:  # not installed, or broken: the comparison is optional
        print(f"fla comparison skipped: flash-linear-attention does not import ({type(e).__name__}: {e})")
        return [{"skipped": f"fla does not import: {type(e).__name__}: {e}"}]
    rows: list[dict] = []
    for bs in batches:
        if env.over_budget():
            break
        case = gdn_case(env, "decode", bs, small=False)
        kw = case.kwargs
        h0 = kw["state"][1 : bs + 1][kw["state_indices"].long() - 1]  # fla takes one initial state per sequence

        def fla_call(kw=kw, h0=h0):
            return fused_recurrent_gated_delta_rule(
                q=kw["q"][None], k=kw["k"][None], v=kw["v"][None], g=kw["g"][None], beta=kw["beta"][None],
                scale=kw["scale"], initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                cu_seqlens=kw["cu_seqlens"].long(),
            )  # fmt: skip

        try:
            o, _ = fla_call()
            ours = _fresh(env, case)
            case.op(**ours, impl="triton")
            err = rel_err(env, o[0].float(), ours["out"].float())
            tol = fla_tolerance(env, ours["out"].dtype)
            t, mode = measure_us(env, fla_call)
            rows.append(
                dict(op="fla_fused_recurrent_gdn", bs=bs, median_us=t, mode=mode, out_diff_vs_ours=err, tol=tol)
            )
            verdict = "ok" if err <= tol else "MISMATCH"
            print(f"fla fused_recurrent     bs={bs:<4} {t:9.1f} us  [{mode}]  out diff vs ours {err:.1e} ({verdict})")
        except Exception:
            rows.append(dict(op="fla_fused_recurrent_gdn", bs=bs, error=traceback.format_exc()))
            print(f"fla bs={bs}: error\n{rows[-1]['error']}")
    return rows


# ------------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device: use --dry-run for the CPU interpreter run of the same code paths")
            return 2
    if args.out and not Path(args.out).parent.is_dir():
        print(f"--out: folder {str(Path(args.out).parent)!r} does not exist (create it first)")
        return 2
    ops = args.ops or list(BUILDERS)
    unknown = sorted(set(ops) - set(BUILDERS))
    if unknown:
        print(f"--ops: unknown {unknown}; known: {list(BUILDERS)}")
        return 2
    env = Env(args)
    batches = args.batches or ([2] if env.dry else [1, 4, 16, 64, 256, 512])
    report: dict[str, Any] = {
        "meta": {
            "device": "cpu (TRITON_INTERPRET=1)" if env.dry else env.torch.cuda.get_device_name(env.dev),
            "device_type": env.dev.type,
            "torch": env.torch.__version__,
            "triton": importlib.import_module("triton").__version__,
            "l2_bytes": env.l2_bytes,
            "inner_calls_per_graph": INNER,
            "reps": env.reps,
            "dry_run": env.dry,
        },
        "checks": padding_checks(env, ops),
        "timings": [],
        "errors": [],
    }
    timer = Timer(env)
    plan = [(op, bs) for op in ops for bs in batches]
    plan = [(op, bs) for op, bs in plan if not (op == "gdn_chunked" and bs > 16)]
    if args.sweep:
        swept = [op for op in SWEPT if op in ops]
        plan += [(f"{op}@sweep", bs) for op in swept for bs in (batches[-1:] if op == "gdn_decode" else batches[:1])]
    for op, bs in plan:
        if env.over_budget():
            report["errors"].append({"stage": f"{op} bs={bs}", "trace": f"skipped: budget {args.budget_s}s spent"})
            continue
        name = op.removesuffix("@sweep")
        try:
            case = BUILDERS[name](env, bs, small=False)
            configs = [(None, None)]
            if op.endswith("@sweep"):
                configs = [(bv, nw) for bv in SWEPT[name][0] for nw in SWEPT[name][1]]
                if env.dry:
                    configs = configs[:1]
            for bv, nw in configs:
                chk = check_case(env, case, block_v=bv, num_warps=nw)
                report["checks"].append(dict(check=f"{name}/bs={bs}/bv={bv}/nw={nw}", **chk))
                if not chk["ok"]:
                    print(f"{name} bs={bs} bv={bv} nw={nw}: CHECK FAILED {chk['errors']} untouched={chk['untouched']}")
                    continue  # a wrong configuration's time does not count
                timer.time(name, bs, case, chk, block_v=bv, num_warps=nw)
            del case
        except Exception:
            report["errors"].append({"stage": f"{op} bs={bs}", "trace": traceback.format_exc()})
            print(f"{op} bs={bs}: error\n{traceback.format_exc()}")
        if env.dev.type == "cuda":
            env.torch.cuda.empty_cache()
    report["timings"] = timer.rows
    report["fla"] = fla_rows(env, batches) if "gdn_decode" in ops else []
    report["checks"] += fla_checks(report["fla"])
    big = [r for r in timer.rows if r["op"] == "gdn_decode" and r["bs"] >= 64 and r["block_v"] is None]
    report["target"] = {
        "gdn_decode_frac_of_copy_min_bs_ge_64": min((r["frac_of_copy"] for r in big), default=None),
        "goal": 0.8,
    }
    report["checks_ok"] = bool(report["checks"]) and all(c["ok"] for c in report["checks"])
    report["elapsed_s"] = time.time() - env.t0
    default = f"gpu_kernels_dryrun_{env.dev.type}.json" if env.dry else f"gpu_kernels_{env.dev.type}.json"
    out = Path(args.out or REPO / "benchmarks" / "results" / default)
    out.parent.mkdir(exist_ok=True)  # the default folder; a given --out's folder was checked before the run
    out.write_text(json.dumps(report, indent=1, default=str))
    failed = [c["check"] for c in report["checks"] if not c["ok"]]
    print(f"checks ok: {report['checks_ok']} (failed: {failed})  target: {report['target']}")
    print(f"errors: {len(report['errors'])}  wrote {out} in {report['elapsed_s']:.0f}s")
    return 0 if report["checks_ok"] and not report["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
