"""`workbench bench kernels`: each decode kernel at engine-like shapes, with its bytes and FLOPs, against a
copy floor and the device's ceilings measured in the same run.

Each case builds one decode step of an op on a pool with a reserved slot 0 and live rows on shuffled slots,
and returns the callable, its cost (``kernels/*/cost.py``) and its state bytes. Records carry ``bytes`` /
``flops`` so :class:`workbench.measure.ceilings.Ceilings` can say what fraction of copy bandwidth each
reaches (the report's roofline uses :func:`sweep` too).

Decode is memory-bound: every row reads and writes its whole recurrent state once per step. With
``floors=True`` each kernel record gets a twin, ``mode="copy-floor"``, ``impl="copy"``, same ``what`` and
``shape``: the time to copy the same state bytes (``dst.copy_(src)`` preallocated; ``bytes`` counts read +
write). ``compare(res.filter(mode="kernel"), res.filter(mode="copy-floor"))`` is then how far each op is
from moving its state at copy speed. Measured back to back, the ratios are steadier than absolute times on
a shared CPU.

Devices: on the CPU the kernels run their torch references (the kernels' "auto" rule); on a GPU their
Triton implementations, timed with CUDA events against a device copy floor. The timings check nothing:
``benchmarks/gpu_kernels.py`` checks each Triton kernel against its float64 reference on the device first.

    >>> res = sweep([1], ops=["causal_conv1d_update"], preset="small", min_run_time=0.01, progress=False,
    ...             floors=True)
    >>> [(r.what, r.mode, r.shape["bs"], r.bytes > 0) for r in res]
    [('causal_conv1d_update', 'kernel', 1, True), ('causal_conv1d_update', 'copy-floor', 1, True)]

Adding an op: write a builder ``(bs, preset, device, impl) -> (fn, bytes, flops, state_bytes)`` and list
it in ``CASES``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch

from kernels import causal_conv1d, linear_attn, mamba2
from kernels import gated_delta_rule as gdn
from kernels.causal_conv1d.cost import update_cost
from kernels.gated_delta_rule.cost import recurrent_cost as gdn_cost
from kernels.linear_attn.cost import recurrent_cost as la_cost
from kernels.mamba2.cost import selective_state_update_cost
from workbench.bench.replay import recorded_impl
from workbench.measure.ceilings import measure_ceilings
from workbench.measure.timing import Results, TimingError, compare, environment, time_fn

# head shapes per preset: "engine" = Qwen3-Next-like GDN / Mamba2-2.7B-like, "small" = a quarter of the heads
PRESETS: dict[str, dict[str, int]] = {
    "engine": {
        "H": 16,
        "HV": 32,
        "K": 128,
        "V": 128,
        "nheads": 64,
        "headdim": 64,
        "dstate": 128,
        "ngroups": 8,
        "dim": 8192,
    },
    "small": {
        "H": 4,
        "HV": 8,
        "K": 128,
        "V": 128,
        "nheads": 16,
        "headdim": 64,
        "dstate": 128,
        "ngroups": 2,
        "dim": 2048,
    },
}
ACT = torch.bfloat16  # activations and the conv state; recurrent states and gates float32, as engines keep them

Built = tuple[Callable[[], Any], int, int, int]  # fn, bytes, flops, state bytes of the live rows


def _pool(bs: int, device: str, *shape: int) -> tuple[torch.Tensor, torch.Tensor]:
    state = torch.randn(bs + 1, *shape, device=device) * 0.1
    slots = (torch.randperm(bs) + 1).to(device=device, dtype=torch.int32)
    return state, slots


def _gdn(bs: int, p: dict[str, int], device: str, impl: str) -> Built:
    H, HV, K, V = p["H"], p["HV"], p["K"], p["V"]
    state, slots = _pool(bs, device, HV, K, V)
    cu = torch.arange(bs + 1, dtype=torch.int32, device=device)
    q, k = (torch.randn(bs, H, K, dtype=ACT, device=device) for _ in range(2))
    v = torch.randn(bs, HV, V, dtype=ACT, device=device)
    g, beta = -torch.rand(bs, HV, device=device), torch.rand(bs, HV, device=device)
    out = torch.empty(bs, HV, V, dtype=ACT, device=device)

    def fn() -> Any:
        return gdn.recurrent(
            q=q, k=k, v=v, g=g, beta=beta, state=state, state_indices=slots, cu_seqlens=cu,
            use_qk_l2norm=True, out=out, impl=impl,
        )  # fmt: skip

    c = gdn_cost(bs, bs, H, HV, K, V, ACT, use_qk_l2norm=True)
    return fn, c.bytes, c.flops, state[1:].nbytes  # live rows only: slot 0 is reserved


def _linear_attn(bs: int, p: dict[str, int], device: str, impl: str) -> Built:
    H, HV, K, V = p["H"], p["HV"], p["K"], p["V"]
    state, slots = _pool(bs, device, HV, K, V)
    cu = torch.arange(bs + 1, dtype=torch.int32, device=device)
    q, k = (torch.randn(bs, H, K, dtype=ACT, device=device) for _ in range(2))
    v = torch.randn(bs, HV, V, dtype=ACT, device=device)
    out = torch.empty(bs, HV, V, dtype=ACT, device=device)

    def fn() -> Any:
        return linear_attn.recurrent(
            q=q, k=k, v=v, state=state, state_indices=slots, cu_seqlens=cu, out=out, impl=impl
        )  # fmt: skip

    c = la_cost(bs, bs, H, HV, K, V, ACT)
    return fn, c.bytes, c.flops, state[1:].nbytes  # live rows only: slot 0 is reserved


def _mamba2(bs: int, p: dict[str, int], device: str, impl: str) -> Built:
    nh, hd, ds, ng = p["nheads"], p["headdim"], p["dstate"], p["ngroups"]
    state, slots = _pool(bs, device, nh, hd, ds)
    x = torch.randn(bs, nh, hd, dtype=ACT, device=device)
    dt = torch.rand(bs, nh, 1, device=device).expand(bs, nh, hd)  # per head, stride 0, as engines pass it
    A = -torch.rand(nh, 1, 1, device=device).expand(nh, hd, ds)
    B, C = (torch.randn(bs, ng, ds, dtype=ACT, device=device) for _ in range(2))
    out = torch.empty(bs, nh, hd, dtype=ACT, device=device)

    def fn() -> Any:
        return mamba2.selective_state_update(state, x, dt, A, B, C, state_batch_indices=slots, out=out, impl=impl)

    c = selective_state_update_cost(
        bs, nh, hd, ds, ng, ACT, has_D=False, has_z=False, has_dt_bias=False, dt_softplus=False
    )
    return fn, c.bytes, c.flops, state[1:].nbytes  # live rows only: slot 0 is reserved


def _conv(bs: int, p: dict[str, int], device: str, impl: str, width: int = 4) -> Built:
    dim = p["dim"]
    state, slots = _pool(bs, device, dim, width - 1)
    state = state.to(ACT)
    x = torch.randn(bs, 1, dim, dtype=ACT, device=device)
    weight = torch.randn(dim, width, dtype=ACT, device=device)
    out = torch.empty(bs, 1, dim, dtype=ACT, device=device)

    def fn() -> Any:
        return causal_conv1d.update(
            x, state, weight, conv_state_indices=slots, activation="silu", out=out, impl=impl
        )  # fmt: skip

    c = update_cost(bs, 1, dim, width, ACT, has_bias=False)
    return fn, c.bytes, c.flops, state[1:].nbytes  # live rows only: slot 0 is reserved


CASES: dict[str, Callable[[int, dict[str, int], str, str], Built]] = {
    "gdn_recurrent": _gdn,
    "linear_attn_recurrent": _linear_attn,
    "mamba2_selective_state_update": _mamba2,
    "causal_conv1d_update": _conv,
}
FULL_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
QUICK_BATCHES = (1, 8, 32)
QUICK_PRESET = "engine"  # the tests shrink it to "small"
FLOOR_MODE = "copy-floor"


def _floor(state_bytes: int, device: str) -> Callable[[], Any]:
    """A copy of ``state_bytes`` into memory allocated once (the floor of a step that must move its state)."""
    src = torch.empty(state_bytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    return partial(dst.copy_, src)


def sweep(
    batch_sizes: Sequence[int],
    *,
    ops: Sequence[str] | None = None,
    preset: str = "engine",
    device: str = "cpu",
    impl: str = "auto",
    progress: bool = True,
    min_run_time: float = 0.1,
    threads: int | None = None,
    floors: bool = False,
) -> Results:
    """Time every op in ``ops`` (default: all of ``CASES``) at each decode batch size.

    Records: ``what`` the op, ``shape={"bs": bs}``, ``impl`` (``recorded_impl``: "auto" is the reference on
    the CPU, Triton on a GPU), ``mode="kernel"``, ``bytes``/``flops`` from the op's cost function; with
    ``floors`` a ``mode="copy-floor"`` record of the same op and shape follows each (see the module
    docstring). An op that fails is listed in ``meta["errors"]`` (op -> "Type: message") and the others go on.
    """
    names = list(ops or CASES)
    bad = [o for o in names if o not in CASES]
    if bad or preset not in PRESETS:
        what = (
            f"ops: unknown {bad}, known {list(CASES)}" if bad else f"preset: expected {list(PRESETS)}, got {preset!r}"
        )
        raise TimingError(what)
    sizes = list(batch_sizes)
    if not sizes or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in sizes):
        raise TimingError(f"batch_sizes: expected ints >= 1, got {sizes!r}")
    from tqdm.auto import tqdm

    p = PRESETS[preset]
    torch.manual_seed(0)
    res = Results(meta={"benchmark": "kernels", "preset": preset, "shapes": dict(p), "errors": {}})
    if floors:
        res.meta["floor"] = "dst.copy_(src) of the live rows' state bytes, preallocated; bytes = read + write"
    timed = partial(time_fn, device=device, min_run_time=min_run_time, threads=threads)
    todo = [(o, bs) for o in names for bs in sizes]
    # None: tqdm keeps quiet where stderr is no terminal (logs, CI); a notebook still shows its bar
    for op, bs in tqdm(todo, desc=f"kernel sweep ({device})", disable=None if progress else True):
        if op in res.meta["errors"]:
            continue
        try:
            fn, nbytes, flops, state_bytes = CASES[op](bs, p, device, impl)
            rec = timed(fn, what=op, shape={"bs": bs}, impl=recorded_impl(impl, device), mode="kernel",
                        bytes=nbytes, flops=flops)  # fmt: skip
            del fn  # the op's pool goes before the floor's buffers arrive
            floor = None
            if floors:
                floor = timed(_floor(state_bytes, device), what=op, shape={"bs": bs}, impl="copy", mode=FLOOR_MODE,
                              bytes=2 * state_bytes)  # fmt: skip
        except Exception as exc:  # one broken op must not hide the others; the error is reported, not lost
            res.meta["errors"][op] = f"{type(exc).__name__}: {exc}"
            continue
        res.append(rec)
        if floor is not None:
            res.append(floor)
    res.meta["environment"] = environment(device)
    return res


def print_table(res: Results) -> None:
    """Median, IQR, copy floor, ratio to the floor, GB/s and fraction of the copy ceiling per op and bs."""
    from workbench.measure.ceilings import Ceilings

    ceil = Ceilings.from_dict(res.meta["ceilings"]) if res.meta.get("ceilings") else None
    floors = {r.key[:3]: r for r in res.filter(mode=FLOOR_MODE)}  # by (what, device, shape)
    print(f"{'op':<31}{'bs':>5}{'median us':>12}{'IQR us':>10}{'floor us':>11}{'ratio':>8}{'GB/s':>8}{'of copy':>9}")
    for r in res.filter(mode="kernel"):
        f = floors.get(r.key[:3])
        frac = ceil.fraction_of_copy(r) if ceil else None
        print(
            f"{r.what:<31}{r.shape['bs']:>5}{r.median_us:>12.1f}{r.iqr_us:>10.1f}"
            f"{f.median_us if f else float('nan'):>11.1f}{compare(r, f) if f else float('nan'):>8.2f}"
            f"{r.gbps or 0:>8.2f}{frac if frac is not None else float('nan'):>9.1%}"
        )
    for op, err in res.meta.get("errors", {}).items():
        print(f"{op:<31} error: {err}")


def run(quick: bool = False, json_path: str | None = None, device: str = "cpu", progress: bool = True) -> Results:
    """The `bench kernels` command: ceilings, then every op at decode batch sizes with its copy floor.

    Full: engine shapes at bs 1..256, ``min_run_time`` 0.2 s, a 64 MiB copy and a 1024^2 matmul for the
    ceilings on the CPU (``measure_ceilings``' defaults). Quick: ``QUICK_PRESET`` at ``QUICK_BATCHES``,
    0.05 s, a 16 MiB copy and a 256^2 matmul. Prints a table; writes JSON when ``json_path`` is given.
    ``meta["ceilings"]`` holds the ceilings, ``meta["errors"]`` any op that failed.
    """
    if quick:
        ceil = measure_ceilings(device, copy_bytes=2**24, matmul_n=256, min_run_time=0.05)
        res = sweep(QUICK_BATCHES, preset=QUICK_PRESET, device=device, progress=progress, min_run_time=0.05,
                    floors=True)  # fmt: skip
    else:
        ceil = measure_ceilings(device, min_run_time=0.2)
        res = sweep(FULL_BATCHES, preset="engine", device=device, progress=progress, min_run_time=0.2, floors=True)
    res.meta["ceilings"] = ceil.to_dict()
    res.meta["quick"] = quick
    print(repr(ceil))
    print_table(res)
    if json_path:
        print(f"wrote {res.save(json_path)}")
    return res
