"""Check, then time, every Triton kernel of `kernels/` on one NVIDIA GPU (written for a lent H200).

    python benchmarks/gpu_kernels.py                 # checks + timings, about 3-5 min on an H200
    python benchmarks/gpu_kernels.py --sweep         # + block_v x num_warps sweeps (GDN decode and chunked)
    python benchmarks/gpu_kernels.py --dry-run       # the same code paths on the CPU, Triton interpreter, tiny shapes

Cases come from the one case builder, ``kernels.testing.make_case``, and are judged by ``Case.check``
(float64 reference on the same device; outputs NaN-poisoned first; every slot no live row owns and the
guard band around each pool bitwise unchanged; under a convention that processes padded rows, Ascend's,
their outputs and the dummy slot 0 are not compared: several rows write it at once). Three steps:

1. Padding checks: every op and variant of ``kernels.testing.OPS`` at "small" shapes (K, V not powers of
   two), three live rows and two padded ones, under every convention of ``kernels.conventions.CONVENTIONS``.
2. Per timed case (``TIMED``, engine shapes, ``bs`` live rows, no padding): the check at that shape first
   (the public op, and with ``--sweep`` the launcher under each configuration); a configuration whose
   check fails is not timed. Then ``workbench.measure.timing.time_fn`` times the op's Triton launcher
   (``OpSpec.launcher``: the kernel an engine's graph holds; the public op's host-side validation ran in
   the check) twice: L2 warm, ``GRAPH_CALLS`` calls per captured CUDA graph (launch overhead amortised),
   and L2 flushed before every repetition, one call per graph. A device-to-device copy of the case's live
   state bytes (``Case.state_bytes``: read + write) is timed the same two ways (``mode="copy-floor"``).
   Where capture is refused the call is timed between events instead and the record says why
   (``graph_calls`` None, ``extra["capture"]``). On the CPU (``--dry-run``) one warm pass: there is no L2
   to flush between calls. Records are named as ``workbench bench kernels`` names them (the op for its
   default variant, else ``op[variant]``), so the two benchmarks' records pair in ``ratio``.
3. fla: flash-linear-attention's ``fused_recurrent_gated_delta_rule`` on the GDN decode cases, where
   ``fla`` imports: its output against ours is a check (within two ulps of the output dtype), and when it
   passes fla is timed the same two ways (``impl="fla"``). Only on a GPU: fla's kernels need one, and off
   it fla runs a fallback that is not its kernel, so a dry run skips the comparison and says so in one line.

Writes one ``workbench.measure.timing.Results`` (``Results.load`` reads it) to
benchmarks/results/gpu_kernels_<device type>.json (a dry run: gpu_kernels_dryrun_cpu.json): the records,
and in ``meta`` the checks, errors, the environment and the decode target. benchmarks/README.md lists every
field. Exit status: 0 when every check passed and nothing errored, 1 otherwise, 2 on a bad argument or
without a CUDA device.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from kernels.testing import Case, CaseCheck
    from workbench.measure.timing import Results, TimingRecord

REPO = Path(__file__).resolve().parents[1]
GRAPH_CALLS = 10  # op calls per captured graph (warm L2)
# (op, variant) timed at engine shapes; extend variants only up to EXTEND_MAX_BS rows (prefill batches)
TIMED: tuple[tuple[str, str], ...] = (
    ("gated_delta_rule.recurrent", "decode"),
    ("gated_delta_rule.recurrent", "gating"),  # the engine's raw gate inputs, gated in the kernel
    ("gated_delta_rule.recurrent", "verify"),
    ("gated_delta_rule.scatter_accepted", "accept"),
    ("gated_delta_rule.chunked", "extend"),
    ("causal_conv1d.update", "decode"),
    ("causal_conv1d.varlen", "extend"),
    ("mamba2.selective_state_update", "decode"),
    ("linear_attn.recurrent", "decode"),
)
EXTEND_MAX_BS = 16
# block_v x num_warps swept with --sweep (each configuration checked first), and at which batch size
SWEPT: dict[tuple[str, str], tuple[tuple[int, ...], tuple[int, ...], str]] = {
    ("gated_delta_rule.recurrent", "decode"): ((16, 32, 64, 128), (1, 2, 4, 8), "largest"),
    ("gated_delta_rule.chunked", "extend"): ((16, 32, 64), (2, 4, 8), "smallest"),
}
FLA_CASE = ("gated_delta_rule.recurrent", "decode")
TARGET = {"what": "gated_delta_rule.recurrent", "min_bs": 64, "goal": 0.8}  # its decode variant

Config = tuple[int | None, int | None]  # (block_v, num_warps); (None, None): the launcher's defaults
DEFAULT: Config = (None, None)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="CPU + TRITON_INTERPRET=1, tiny shapes")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/gpu_kernels_<device>.json)")
    p.add_argument("--batches", type=int, nargs="*", default=None, help="live rows per timed case")
    p.add_argument("--min-run-time", type=float, default=0.05, help="seconds of repetitions per measurement")
    p.add_argument("--sweep", action="store_true", help="sweep block_v x num_warps of the GDN kernels")
    p.add_argument("--ops", nargs="*", default=None, help="ops or op[variant] names (default: all)")
    p.add_argument("--budget-s", type=float, default=420.0, help="start no new measurement after this")
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------------ setup


class Env:
    """The device, dtype, shapes and timing settings of one run.

    Imports torch and the kernels only here, after ``TRITON_INTERPRET`` is set for a dry run."""

    def __init__(self, args: argparse.Namespace) -> None:
        if args.dry_run:
            os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
        sys.path.insert(0, str(REPO))
        import torch

        from workbench.measure.timing import L2_FLUSHED, L2_WARM, l2_cache_bytes

        self.dry: bool = args.dry_run
        self.device = "cpu" if self.dry else "cuda"
        self.cuda = self.device == "cuda"
        self.dtype = torch.float32 if self.dry else torch.bfloat16  # bf16 is wrong in the interpreter
        self.shapes = "small" if self.dry else "engine"
        # the interpreter's times mean nothing: run each timing path a few calls, no more
        self.min_run_time = 1e-3 if self.dry else args.min_run_time
        self.l2_bytes = l2_cache_bytes(self.device)
        # L2 warm, then flushed; the CPU has no L2 to flush between calls (time_fn would only say so): warm only
        self.passes = (False, True) if self.cuda else (False,)
        self.coldest = L2_FLUSHED if self.cuda else L2_WARM  # the l2 of the last pass: the decode target's
        self.t0 = time.time()
        self.budget = args.budget_s
        self._floors: dict[tuple[int, bool], TimingRecord] = {}

    def over_budget(self) -> bool:
        return time.time() - self.t0 > self.budget

    def case(self, op: str, variant: str, bs: int) -> Case:
        """The timed case: ``bs`` live rows at the run's shapes and dtype, no padding, sglang slots."""
        from kernels.testing import make_case

        return make_case(
            op, variant, rows=bs, padded=0, convention="sglang", shapes=self.shapes, seed=bs, device=self.device,
            dtype=self.dtype,
        )  # fmt: skip

    def time(self, fn: Callable[[], Any], *, cold: bool, **kw: Any) -> TimingRecord:
        """``time_fn`` on this run's device: warm L2 with ``GRAPH_CALLS`` calls per graph, or a flushed L2
        with one call per graph (CPU: no graph, nothing flushed). A refused capture falls back to events
        around single calls, and the record keeps the reason in ``extra["capture"]``."""
        from workbench.measure.timing import GraphCaptureError, time_fn

        calls = (1 if cold else GRAPH_CALLS) if self.cuda else None
        warmup = 0 if self.dry else 1  # the check already ran the op; the interpreter has nothing to warm
        timed = dict(device=self.device, min_run_time=self.min_run_time, warmup=warmup, flush_l2=cold, **kw)
        try:
            return time_fn(fn, graph_calls=calls, **timed)
        except GraphCaptureError as e:
            print(f"  {e}; timing single calls between events instead")
            timed["extra"] = {**timed.get("extra", {}), "capture": str(e)}
            return time_fn(fn, graph_calls=None, **timed)

    def floor(self, case: Case, shape: dict[str, int], cold: bool) -> TimingRecord:
        """A device copy of ``case.state_bytes`` (half read, half written), timed like the op; cached per
        byte count and L2 state, renamed for each case."""
        import torch

        key = (case.state_bytes, cold)
        if key not in self._floors:
            src = torch.randn(max(case.state_bytes // 8, 1), device=self.device)  # float32: 4 bytes each
            dst = torch.empty_like(src)
            self._floors[key] = self.time(
                lambda: dst.copy_(src), cold=cold, what="copy", impl="copy", mode="copy-floor",
                bytes=case.state_bytes,
            )  # fmt: skip
        return replace(self._floors[key], what=record_what(case), shape=dict(shape))


def record_what(case: Case) -> str:
    """A record's ``what``, as ``workbench bench kernels`` names it: the op for its default variant, else
    ``op[variant]`` (so the two benchmarks' records pair in ``ratio``)."""
    from workbench.sweeps.kernels import record_name

    return record_name(case.op, case.variant)


def check_row(chk: CaseCheck, case: Case, label: str, **where: Any) -> dict[str, Any]:
    """One check as ``Results.meta["checks"]`` holds it (strict JSON: an infinite error becomes "inf")."""
    from workbench.measure.timing import json_safe

    return json_safe({
        "check": label, "op": case.op, "variant": case.variant, "convention": case.convention.name,
        "rows": case.rows, "padded": case.padded, **where, "ok": chk.ok, "max_err": chk.max_err,
        "tol": chk.tol, "summary": chk.summary(),
    })  # fmt: skip


def failed_row(label: str, **where: Any) -> dict[str, Any]:
    """A check that raised instead of returning a verdict."""
    return {"check": label, **where, "ok": False, "trace": traceback.format_exc()}


# ------------------------------------------------------------------------------------------------ launch


def launcher_call(case: Case, args: dict[str, Any], config: Config = DEFAULT) -> Callable[[], Any]:
    """The op's Triton launcher bound to ``args`` and a configuration (``Case.launch``)."""
    from kernels.testing import Call

    block_v, num_warps = config
    return case.launch(Call(args, {}), block_v=block_v, num_warps=num_warps)


def resources(kernel: Any) -> dict[str, int | None]:
    """Registers, spill bytes and shared memory of a compiled kernel (None in the interpreter)."""
    if kernel is not None and hasattr(kernel, "_init_handles"):
        kernel._init_handles()  # n_regs / n_spills are read from the loaded module
    if kernel is None or not hasattr(kernel, "n_regs"):
        return {"n_regs": None, "n_spills": None, "shared": None}
    return {"n_regs": int(kernel.n_regs), "n_spills": int(kernel.n_spills), "shared": int(kernel.metadata.shared)}


def footprint(case: Case) -> int:
    """Bytes of memory the case's tensors live in, each storage once (pools are views of their guarded
    storage, expanded parameters cost their storage): the working set of back-to-back calls."""
    import torch

    tensors = [v for v in case.args.values() if isinstance(v, torch.Tensor)]
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


# ------------------------------------------------------------------------------------------------ checks


def padding_checks(env: Env, ops: list[str]) -> list[dict[str, Any]]:
    """Every variant of ``ops`` at "small" shapes under every convention, two padded rows each (float32)."""
    import torch

    from kernels.conventions import CONVENTIONS
    from kernels.testing import OPS, make_case

    rows: list[dict[str, Any]] = []
    for op in ops:
        for variant in OPS[op].variants:
            for convention in CONVENTIONS:
                label = f"{op}[{variant}]/{convention}"
                where = {"op": op, "variant": variant, "convention": convention, "shapes": "small"}
                try:
                    case = make_case(op, variant, rows=3, padded=2, convention=convention, shapes="small",
                                     seed=len(rows), device=env.device, dtype=torch.float32)  # fmt: skip
                    rows.append(check_row(case.check(case.run(impl="triton")), case, label, shapes="small"))
                except Exception:
                    rows.append(failed_row(label, **where))
                print(f"check {label:<52} ok={rows[-1]['ok']}")
    return rows


def check_config(case: Case, config: Config) -> CaseCheck:
    """The default configuration through the public op (its validation included); another one through the
    launcher, on a fresh poisoned copy of the arguments."""
    if config == DEFAULT:
        return case.check(case.run(impl="triton"))
    call = case.fresh()
    launcher_call(case, call.args, config)()
    return case.check(call)


# ------------------------------------------------------------------------------------------------ timing


def config_shape(bs: int, config: Config) -> dict[str, int]:
    """The record's shape: ``{"bs": bs}``, plus ``block_v`` and ``num_warps`` for a swept configuration."""
    block_v, num_warps = config
    return (
        {"bs": bs} if config == DEFAULT else {"bs": bs, "block_v": int(block_v or 0), "num_warps": int(num_warps or 0)}
    )


def show(rec: TimingRecord, floor: TimingRecord | None = None) -> None:
    """One printed line per timed record."""
    cfg = "".join(f" {k}={v}" for k, v in rec.shape.items() if k != "bs")
    timer = f"graph x{rec.graph_calls}" if rec.graph_calls else ("events" if rec.device != "cpu" else "cpu timer")
    ratio = f"  copy/op {floor.median_us / rec.median_us:5.2f}" if floor is not None and rec.median_us > 0 else ""
    gbps = f"{rec.gbps:8.1f} GB/s" if rec.gbps is not None else ""
    regs = "" if rec.extra.get("n_regs") is None else f"  regs {rec.extra['n_regs']} spill {rec.extra['n_spills']}B"
    res = " L2-resident" if rec.extra.get("l2_resident") else ""
    print(f"{rec.what:<40} {rec.impl:<6} bs={rec.shape['bs']:<4}{cfg:<22} {rec.median_us:10.1f} us "
          f"IQR {rec.iqr_us:8.1f} {gbps}  [{rec.l2}, {timer}]{ratio}{res}{regs}")  # fmt: skip


def time_case(env: Env, res: Results, op: str, variant: str, bs: int, configs: list[Config]) -> None:
    """Check ``op[variant]`` at ``bs`` rows under each configuration, then time those that passed, warm and
    flushed, beside the copy floor (default configuration only: the floor does not depend on it)."""
    case = env.case(op, variant, bs)
    passed: list[tuple[Config, CaseCheck]] = []
    for config in configs:  # every check before any timing: timing mutates the arguments the reference saw
        label = f"{case.name}/{case.convention.name}/bs={bs}" + (
            "" if config == DEFAULT else f"/bv={config[0]}/nw={config[1]}"
        )
        shape = config_shape(bs, config)
        try:
            chk = check_config(case, config)
        except Exception:
            res.meta["checks"].append(
                failed_row(label, op=op, variant=variant, convention=case.convention.name, **shape)
            )
            print(f"{label}: CHECK RAISED\n{res.meta['checks'][-1]['trace']}")
            continue
        res.meta["checks"].append(check_row(chk, case, label, shapes=env.shapes, **shape))
        if chk.ok:
            passed.append((config, chk))
        else:
            print(f"{label}: CHECK FAILED, not timed: {chk.summary()}")
    foot = footprint(case)
    for config, chk in passed:
        try:  # one configuration that fails to time must not lose the others
            time_config(env, res, case, config, chk, foot)
        except Exception:
            stage = f"{case.name} bs={bs} bv={config[0]} nw={config[1]} timing"
            res.meta["errors"].append({"stage": stage, "trace": traceback.format_exc()})
            print(f"{stage}: error\n{res.meta['errors'][-1]['trace']}")


def time_config(env: Env, res: Results, case: Case, config: Config, chk: CaseCheck, foot: int) -> None:
    """Time one checked configuration of ``case`` on each L2 pass, the default one beside its copy floor."""
    call = launcher_call(case, case.args, config)
    facts: dict[str, Any] = {
        "check": {"ok": chk.ok, "max_err": chk.max_err, "tol": chk.tol},
        **resources(call()),
        "footprint_bytes": foot,
        "l2_resident": None if env.l2_bytes is None else foot <= env.l2_bytes,
    }
    shape = config_shape(case.rows, config)
    for cold in env.passes:
        rec = env.time(call, cold=cold, what=record_what(case), shape=shape, impl="triton", mode="kernel",
                       bytes=case.cost.bytes, flops=case.cost.flops, extra=facts)  # fmt: skip
        floor = env.floor(case, shape, cold) if config == DEFAULT else None
        res.append(rec)
        if floor is not None:
            res.append(floor)
        show(rec, floor)


# ------------------------------------------------------------------------------------------------ fla


def fla_tolerance(dtype: torch.dtype) -> float:
    """How far fla's output may be from ours (``kernels.testing.rel_err``: max |diff| over max(1, max |out|)).

    Both kernels read the same inputs, accumulate in fp32 and round the output once to ``dtype``; each
    rounding is within half an ulp, so the two differ by up to one ulp of the largest output (bf16: 2^-7 of
    it) and a second ulp where fp32 summation order tips a rounding. Two machine epsilons of ``dtype``:
    1.6e-2 for bf16, 2e-3 for fp16; 1e-4 for fp32, where the summation order alone is the difference."""
    import torch

    return max(2 * torch.finfo(dtype).eps, 1e-4)


def fla_check(bs: int, err: float, dtype: torch.dtype) -> dict[str, Any]:
    """fla's output against ours at ``bs`` rows, as a check row."""
    from workbench.measure.timing import json_safe

    tol = fla_tolerance(dtype)
    op, variant = FLA_CASE
    return json_safe({"check": f"fla_vs_ours/{op}[{variant}]/bs={bs}", "op": op, "variant": variant, "bs": bs,
                      "impl": "fla", "ok": err <= tol, "max_err": err, "tol": tol})  # fmt: skip


def fla_call(fused: Callable[..., Any], case: Case) -> Callable[[], Any]:
    """fla's call on the case's inputs: a batch of one packed sequence, one initial state per row."""
    a = case.args
    h0 = a["state"][a["state_indices"].long()]  # [N, HV, K, V], gathered from the rows' slots
    cu = a["cu_seqlens"].long()

    def call() -> Any:
        return fused(
            q=a["q"][None], k=a["k"][None], v=a["v"][None], g=a["g"][None], beta=a["beta"][None],
            scale=a["scale"], initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
            cu_seqlens=cu,
        )  # fmt: skip

    return call


def fla_compare(env: Env, res: Results, batches: list[int]) -> str:
    """fla beside ours on the decode cases; returns what happened, for ``meta["fla"]``."""
    from kernels.testing import rel_err

    if not env.cuda:  # fla has no CPU kernel: off a GPU it falls back to code that is not the kernel compared
        why = f"skipped: fla's kernels need a GPU (device {env.device})"
        print(f"fla comparison {why}")
        return why
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except Exception as e:  # not installed, or broken: the comparison is optional
        why = f"skipped: flash-linear-attention does not import ({type(e).__name__}: {e})"
        print(f"fla comparison {why}")
        return why
    for bs in batches:
        if env.over_budget():
            return "stopped: budget spent"
        try:
            case = env.case(*FLA_CASE, bs)
            call = fla_call(fused_recurrent_gated_delta_rule, case)
            ours = case.run(impl="triton").args["out"]
            err = rel_err(call()[0][0].float(), ours.float())
            chk = fla_check(bs, err, ours.dtype)
            res.meta["checks"].append(chk)
            print(f"fla vs ours bs={bs}: out diff {err:.2e} (tol {chk['tol']:.2e}) {'ok' if chk['ok'] else 'MISMATCH'}")
            if not chk["ok"]:
                continue  # a mismatching output's time does not count
            extra = {"check": {k: chk[k] for k in ("ok", "max_err", "tol")}, "vs": "triton"}
            for cold in env.passes:
                rec = env.time(call, cold=cold, what=record_what(case), shape={"bs": bs}, impl="fla", mode="kernel",
                               bytes=case.cost.bytes, flops=case.cost.flops, extra=extra)  # fmt: skip
                res.append(rec)
                show(rec)
        except Exception:
            res.meta["errors"].append({"stage": f"fla bs={bs}", "trace": traceback.format_exc()})
            print(f"fla bs={bs}: error\n{res.meta['errors'][-1]['trace']}")
    return "compared"


# ------------------------------------------------------------------------------------------------ main


def select(names: list[str] | None) -> tuple[list[str], list[tuple[str, str]], list[str]]:
    """``--ops`` entries (an op, or ``op[variant]``) as (ops to check, timed cases, unknown entries)."""
    from kernels.testing import OPS

    timed = [(op, v) for op, v in TIMED if names is None or op in names or f"{op}[{v}]" in names]
    known = set(OPS) | {f"{op}[{v}]" for op, spec in OPS.items() for v in spec.variants}
    unknown = sorted(set(names or ()) - known)
    ops = [op for op in OPS if names is None or any(n == op or n.startswith(f"{op}[") for n in names)]
    return ops, timed, unknown


def plan(
    timed: list[tuple[str, str]], batches: list[int], sweep: bool, dry: bool
) -> list[tuple[str, str, int, list[Config]]]:
    """(op, variant, bs, configurations) in order: every default launch, then the sweeps."""
    out = [(op, v, bs, [DEFAULT]) for op, v in timed for bs in batches if v != "extend" or bs <= EXTEND_MAX_BS]
    if sweep:
        for (op, v), (bvs, nws, where) in SWEPT.items():
            if (op, v) in timed:
                configs: list[Config] = [(bv, nw) for bv in bvs for nw in nws]
                small = [b for b in batches if v != "extend" or b <= EXTEND_MAX_BS] or batches[:1]
                out.append((op, v, small[-1] if where == "largest" else small[0], configs[:1] if dry else configs))
    return out


def target(env: Env, res: Results) -> dict[str, Any]:
    """The decode goal: copy-floor median over kernel median (flushed L2), worst case from ``min_bs`` rows."""
    from workbench.measure.timing import ratio

    sel = res.filter(what=TARGET["what"], l2=env.coldest)
    ratios = ratio(sel.filter(mode="copy-floor"), sel.filter(mode="kernel", impl="triton"))
    big = [r for k, r in ratios.rows if k["shape"]["bs"] >= TARGET["min_bs"] and set(k["shape"]) == {"bs"}]
    return {
        **TARGET,
        "l2": env.coldest,
        "measure": "copy-floor median / kernel median",
        "worst": min(big, default=None),
    }


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
    env = Env(args)
    ops, timed, unknown = select(args.ops)
    if unknown:
        from kernels.testing import OPS

        print(f"--ops: unknown {unknown}; known: {list(OPS)} (or op[variant])")
        return 2
    from kernels.conventions import CONVENTIONS
    from kernels.testing import SHAPES
    from workbench.measure.timing import Results, environment

    # dry run: one live row (the interpreter's time grows with the grid; padding checks cover more rows)
    batches = args.batches or ([1] if env.dry else [1, 4, 16, 64, 256, 512])
    res = Results(meta={
        "benchmark": "gpu_kernels", "dry_run": env.dry, "environment": environment(env.device),
        "triton": importlib.import_module("triton").__version__, "l2_bytes": env.l2_bytes,
        "graph_calls": GRAPH_CALLS if env.cuda else None, "min_run_time": env.min_run_time, "shapes": env.shapes,
        "sizes": SHAPES[env.shapes], "dtype": str(env.dtype).removeprefix("torch."), "conventions": list(CONVENTIONS),
        "checks": [], "errors": [],
    })  # fmt: skip
    res.meta["checks"] += padding_checks(env, ops)
    for op, variant, bs, configs in plan(timed, batches, args.sweep, env.dry):
        stage = f"{op}[{variant}] bs={bs}" + (" sweep" if configs != [DEFAULT] else "")
        if env.over_budget():
            res.meta["errors"].append({"stage": stage, "trace": f"skipped: budget {args.budget_s}s spent"})
            continue
        try:
            time_case(env, res, op, variant, bs, configs)
        except Exception:
            res.meta["errors"].append({"stage": stage, "trace": traceback.format_exc()})
            print(f"{stage}: error\n{res.meta['errors'][-1]['trace']}")
        if env.cuda:
            import torch

            torch.cuda.empty_cache()
    res.meta["fla"] = fla_compare(env, res, batches) if FLA_CASE in timed else "not asked for (--ops)"
    res.meta["target"] = target(env, res)
    checks = res.meta["checks"]
    res.meta["checks_ok"] = bool(checks) and all(c["ok"] for c in checks)
    res.meta["elapsed_s"] = time.time() - env.t0
    default = f"gpu_kernels_dryrun_{env.device}.json" if env.dry else f"gpu_kernels_{env.device}.json"
    out = Path(args.out or REPO / "benchmarks" / "results" / default)
    out.parent.mkdir(exist_ok=True)  # the default folder; a given --out's folder was checked before the run
    res.save(out)
    failed = [c["check"] for c in checks if not c["ok"]]
    print(f"checks ok: {res.meta['checks_ok']} (failed: {failed})  target: {res.meta['target']}")
    print(f"errors: {len(res.meta['errors'])}  wrote {len(res)} records to {out} in {res.meta['elapsed_s']:.0f}s")
    return 0 if res.meta["checks_ok"] and not res.meta["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
