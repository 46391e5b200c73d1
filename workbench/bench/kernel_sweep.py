"""Decode kernels timed with their bytes and FLOPs (``kernels/*/cost.py``), for the roofline.

Each case builds one decode step of an op at engine-like head shapes on a pool with a reserved slot 0 and
live rows on shuffled slots, and returns the callable and its cost. Records carry ``bytes``/``flops`` so
:class:`workbench.measure.ceilings.Ceilings` can say what fraction of copy bandwidth each reaches.

    >>> res = sweep([1], ops=["causal_conv1d_update"], preset="small", min_run_time=0.01, progress=False)
    >>> rec = res[0]; (rec.what, rec.shape["bs"], rec.bytes > 0, rec.flops > 0)
    ('causal_conv1d_update', 1, True, True)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from kernels import causal_conv1d, linear_attn, mamba2
from kernels import gated_delta_rule as gdn
from kernels.causal_conv1d.cost import update_cost
from kernels.gated_delta_rule.cost import recurrent_cost as gdn_cost
from kernels.linear_attn.cost import recurrent_cost as la_cost
from kernels.mamba2.cost import selective_state_update_cost
from workbench.bench.replay import recorded_impl
from workbench.measure.timing import Results, TimingError, environment, time_fn

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
ACT = torch.bfloat16  # activations; states and gates float32, as engines keep them

Built = tuple[Callable[[], Any], int, int]  # fn, bytes, flops


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
    return fn, c.bytes, c.flops


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
    return fn, c.bytes, c.flops


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
    return fn, c.bytes, c.flops


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
    return fn, c.bytes, c.flops


CASES: dict[str, Callable[[int, dict[str, int], str, str], Built]] = {
    "gdn_recurrent": _gdn,
    "linear_attn_recurrent": _linear_attn,
    "mamba2_selective_state_update": _mamba2,
    "causal_conv1d_update": _conv,
}


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
) -> Results:
    """Time every op in ``ops`` (default: all of ``CASES``) at each decode batch size.

    Records: ``what`` the op, ``shape={"bs": bs}``, ``impl``, ``mode="kernel"``, ``bytes``/``flops`` from
    the op's cost function. An op that fails is listed in ``meta["errors"]`` and the others go on.
    """
    names = list(ops or CASES)
    bad = [o for o in names if o not in CASES]
    if bad or preset not in PRESETS:
        what = (
            f"ops: unknown {bad}, known {list(CASES)}" if bad else f"preset: expected {list(PRESETS)}, got {preset!r}"
        )
        raise TimingError(what)
    from tqdm.auto import tqdm

    p = PRESETS[preset]
    torch.manual_seed(0)
    res = Results(meta={"benchmark": "kernels", "preset": preset, "shapes": dict(p), "errors": {}})
    todo = [(o, bs) for o in names for bs in batch_sizes]
    for op, bs in tqdm(todo, desc=f"kernel sweep ({device})", disable=not progress):
        if op in res.meta["errors"]:
            continue
        try:
            fn, nbytes, flops = CASES[op](bs, p, device, impl)
            rec = time_fn(fn, what=op, device=device, shape={"bs": bs}, impl=recorded_impl(impl, device), mode="kernel",
                          min_run_time=min_run_time, bytes=nbytes, flops=flops, threads=threads)  # fmt: skip
        except Exception as exc:  # one broken op must not hide the others; the error is reported, not lost
            res.meta["errors"][op] = f"{type(exc).__name__}: {exc}"
            continue
        res.append(rec)
    res.meta["environment"] = environment(device)
    return res
