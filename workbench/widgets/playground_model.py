"""The model behind ``KernelPlayground``: check a kernel against the float64 reference under every padding
convention, the way the workbench's own tests do, and capture it through the CPU graph recorder.

A candidate is a function with the public op's signature (keyword arguments as in ``kernels.<op>``,
``pad_slot_id`` and ``out`` among them): ``partial(op, impl="triton")`` for the built-in Triton kernel
(the interpreter on the CPU), or the user's own. For each convention (sglang ``-1``, vLLM null slot ``0``,
Ascend: padded rows processed on dummy slot ``0``) the check draws fresh random inputs and a random state
pool (never zeros), poisons ``out`` with NaN, runs the candidate on float32 and the reference on float64,
and reports: outputs left unwritten (NaN), the error per (batch row, head), slots that changed but belong
to no processed row (must be bitwise unchanged), padded outputs that are not zeros where the row is skipped.
Plain Python, no ipywidgets.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from workbench.errors import CaptureError, MetadataError, WorkbenchError
from workbench.measure.integrity import DEFAULT_ATOL, DEFAULT_RTOL

# padding conventions: name -> the kernels' pad_slot_id (the skip rule of kernels/padding.py)
CONVENTIONS: dict[str, int | None] = {"sglang": -1, "vllm": 0, "sglang-ascend": None}
SENTINEL = {"sglang": -1, "vllm": 0, "sglang-ascend": 0}
DUMMY_SLOT = 0


@dataclass(frozen=True)
class Shapes:
    """Sizes of one check. rows: live batch rows; padded: padded rows at the tail; tokens: per row
    (decode 1, verify D; GDN / linear attention / conv1d); heads, head_k, head_v: value heads and dims
    (q/k heads = heads // 2 where even: GVA); dim, width: conv channels and kernel width; state_dim:
    Mamba2's d_state; num_slots: of the pool (default 2 * rows + 3)."""

    rows: int = 3
    padded: int = 2
    tokens: int = 2
    heads: int = 4
    head_k: int = 8
    head_v: int = 8
    dim: int = 16
    width: int = 4
    state_dim: int = 8
    num_slots: int | None = None

    def check(self) -> None:
        for name in ("rows", "tokens", "heads", "head_k", "head_v", "dim", "width", "state_dim"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise MetadataError(f"{name}: must be an int >= 1, got {v!r}")
        if isinstance(self.padded, bool) or not isinstance(self.padded, int) or self.padded < 0:
            raise MetadataError(f"padded: must be an int >= 0, got {self.padded!r}")
        if self.width < 2:
            raise MetadataError(f"width: a causal conv needs width >= 2, got {self.width}")
        if self.num_slots is not None and self.num_slots < self.rows + 1:
            raise MetadataError(f"num_slots: {self.num_slots} cannot hold {self.rows} rows beside the dummy slot")


@dataclass
class Case:
    """One drawn input: keyword arguments of the op (no pad_slot_id / out / impl), which of them is the
    state pool and the index tensor, the output shape, and the batch row of each leading output index
    (-1: padding tokens past ``cu_seqlens[-1]``)."""

    args: dict[str, Any]
    state_key: str
    index_key: str
    out_shape: tuple[int, ...]
    row_of: list[int]
    live_slots: list[int]


def _slots(g: torch.Generator, shapes: Shapes, convention: str) -> tuple[torch.Tensor, list[int], int]:
    n = shapes.num_slots or 2 * shapes.rows + 3
    live = (torch.randperm(n - 1, generator=g)[: shapes.rows] + 1).tolist()  # never the dummy slot 0
    idx = torch.tensor(live + [SENTINEL[convention]] * shapes.padded, dtype=torch.int32)
    return idx, live, n


def _packed_rows(shapes: Shapes) -> tuple[torch.Tensor, list[int], int]:
    """cu_seqlens of ``rows`` live rows of ``tokens`` each and zero-length padded rows; T = all rows' tokens
    (a graph bucket's worth), tokens past cu[-1] belong to nobody."""
    n, L = shapes.rows + shapes.padded, shapes.tokens
    lens = [L] * shapes.rows + [0] * shapes.padded
    cu = torch.tensor([0, *itertools_accumulate(lens)], dtype=torch.int32)
    T = n * L
    row_of = [t // L if t < shapes.rows * L else -1 for t in range(T)]
    return cu, row_of, T


def itertools_accumulate(xs: list[int]) -> list[int]:
    out, s = [], 0
    for x in xs:
        s += x
        out.append(s)
    return out


def _gdn_case(g: torch.Generator, shapes: Shapes, convention: str) -> Case:
    idx, live, n = _slots(g, shapes, convention)
    cu, row_of, T = _packed_rows(shapes)
    HV, K, V = shapes.heads, shapes.head_k, shapes.head_v
    H = HV // 2 if HV % 2 == 0 else HV
    args = {
        "q": torch.randn(T, H, K, generator=g),
        "k": torch.randn(T, H, K, generator=g),
        "v": torch.randn(T, HV, V, generator=g),
        "g": -F.softplus(torch.randn(T, HV, generator=g)),
        "beta": torch.sigmoid(torch.randn(T, HV, generator=g)),
        "state": 0.5 * torch.randn(n, HV, K, V, generator=g),
        "state_indices": idx,
        "cu_seqlens": cu,
        "use_qk_l2norm": True,
    }
    return Case(args, "state", "state_indices", (T, HV, V), row_of, live)


def _linear_case(g: torch.Generator, shapes: Shapes, convention: str) -> Case:
    case = _gdn_case(g, shapes, convention)
    for key in ("g", "beta", "use_qk_l2norm"):
        del case.args[key]
    scale = 0.5 / math.sqrt(shapes.head_k)  # a plain sum of outer products grows: keep the outputs O(1)
    case.args["scale"] = scale
    return case


def _conv_case(g: torch.Generator, shapes: Shapes, convention: str) -> Case:
    idx, live, n = _slots(g, shapes, convention)
    N, L, dim, W = shapes.rows + shapes.padded, shapes.tokens, shapes.dim, shapes.width
    args = {
        "x": torch.randn(N, L, dim, generator=g),
        "conv_state": torch.randn(n, dim, W - 1, generator=g),
        "weight": torch.randn(dim, W, generator=g) / math.sqrt(W),
        "bias": 0.1 * torch.randn(dim, generator=g),
        "conv_state_indices": idx,
        "activation": "silu",
    }
    return Case(args, "conv_state", "conv_state_indices", (N, L, dim), list(range(N)), live)


def _mamba2_case(g: torch.Generator, shapes: Shapes, convention: str) -> Case:
    idx, live, n = _slots(g, shapes, convention)
    N, nh, hd, ds = shapes.rows + shapes.padded, shapes.heads, shapes.head_v, shapes.state_dim
    ng = 2 if nh % 2 == 0 else 1
    args = {
        "state": 0.5 * torch.randn(n, nh, hd, ds, generator=g),
        "x": torch.randn(N, nh, hd, generator=g),
        "dt": torch.randn(N, nh, hd, generator=g),
        "A": -torch.rand(nh, hd, ds, generator=g) - 0.5,
        "B": torch.randn(N, ng, ds, generator=g),
        "C": torch.randn(N, ng, ds, generator=g),
        "D": torch.randn(nh, hd, generator=g),
        "z": torch.randn(N, nh, hd, generator=g),
        "dt_bias": 0.5 * torch.randn(nh, hd, generator=g),
        "dt_softplus": True,
        "state_batch_indices": idx,
    }
    return Case(args, "state", "state_batch_indices", (N, nh, hd), list(range(N)), live)


def _op(name: str) -> Callable[..., torch.Tensor]:
    import kernels.causal_conv1d as conv
    import kernels.gated_delta_rule as gdn
    import kernels.linear_attn as la
    import kernels.mamba2 as m2

    table: dict[str, Callable[..., torch.Tensor]] = {
        "gated_delta_rule.recurrent": gdn.recurrent,
        "linear_attn.recurrent": la.recurrent,
        "causal_conv1d.update": conv.update,
        "mamba2.selective_state_update": m2.selective_state_update,
    }
    return table[name]


OPS: dict[str, Callable[[torch.Generator, Shapes, str], Case]] = {
    "gated_delta_rule.recurrent": _gdn_case,
    "linear_attn.recurrent": _linear_case,
    "causal_conv1d.update": _conv_case,
    "mamba2.selective_state_update": _mamba2_case,
}
HEAD_NAME = {
    "gated_delta_rule.recurrent": "value head",
    "linear_attn.recurrent": "value head",
    "causal_conv1d.update": "channel",
    "mamba2.selective_state_update": "head",
}


@dataclass
class ConventionCheck:
    """One padding convention's result (see the module docstring)."""

    convention: str
    pad_slot_id: int | None
    error: str | None = None
    max_err: float = float("nan")
    atol: float = 0.0
    rtol: float = 0.0
    bad_outputs: int = 0
    unwritten: int = 0
    foreign_changed: list[int] = field(default_factory=list)
    state_err: float = 0.0
    bad_state_slots: list[int] = field(default_factory=list)
    padded_nonzero: list[int] = field(default_factory=list)
    row_labels: list[str] = field(default_factory=list)
    head_labels: list[str] = field(default_factory=list)
    err: list[list[float]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.error is None
            and self.bad_outputs == 0
            and self.unwritten == 0
            and not self.foreign_changed
            and not self.bad_state_slots
            and not self.padded_nonzero
        )

    def summary(self) -> str:
        if self.error:
            return f"{self.convention}: raised {self.error}"
        if self.ok:
            return f"{self.convention}: ok (max error {self.max_err:.2e}, untouched slots bitwise unchanged)"
        parts = []
        if self.unwritten:
            parts.append(f"{self.unwritten} output values never written (NaN)")
        if self.bad_outputs:
            parts.append(f"{self.bad_outputs} outputs off the float64 reference (max {self.max_err:.3g})")
        if self.foreign_changed:
            parts.append(f"slots {self.foreign_changed} changed but no processed row owns them")
        if self.bad_state_slots:
            parts.append(f"live slots {self.bad_state_slots} off the reference (max {self.state_err:.3g})")
        if self.padded_nonzero:
            where = ["padding tokens" if r == -1 else f"row {r}" for r in self.padded_nonzero]
            parts.append(f"outputs of skipped padding not zero: {', '.join(where)}")
        return f"{self.convention}: " + "; ".join(parts)


@dataclass
class CaptureCheck:
    """Capture through the CPU recorder, then replay on fresh values: ok when the replay matches the
    float64 reference on the new values (the graph did not freeze the capture-time ones)."""

    ok: bool
    detail: str
    num_ops: int = 0


@dataclass
class KernelCheck:
    """The result of :meth:`PlaygroundModel.run` / :func:`check_kernel`."""

    op: str
    candidate: str
    conventions: list[ConventionCheck]
    capture: CaptureCheck | None = None

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.conventions) and (self.capture is None or self.capture.ok)

    def summary(self) -> str:
        lines = [f"{self.op} [{self.candidate}]: {'OK' if self.ok else 'PROBLEMS'}"]
        lines += ["  " + c.summary() for c in self.conventions]
        if self.capture is not None:
            lines.append(f"  capture: {'ok' if self.capture.ok else 'FAILED'}: {self.capture.detail}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary()


def _reference(op: str, case: Case, pad: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 outputs and state of the reference on ``case``."""
    args = {
        k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in case.args.items()
    }
    out = _op(op)(**args, pad_slot_id=pad, impl="reference")
    return out, args[case.state_key]


def _per_row_head(diff: torch.Tensor, case: Case, op: str, nrows: int) -> list[list[float]]:
    """max |err| per (batch row, head); a last line for padding tokens when the op has them (NaN: inf)."""
    lead = diff.nan_to_num(float("inf"))
    lead = lead.amax(dim=1) if op == "causal_conv1d.update" else lead.amax(dim=2)  # [tokens or rows, heads]
    rows = [[0.0] * lead.shape[1] for _ in range(nrows + (1 if -1 in case.row_of else 0))]
    for i, r in enumerate(case.row_of):
        line = rows[r] if r >= 0 else rows[-1]
        for h, v in enumerate(lead[i].tolist()):
            line[h] = max(line[h], v)
    return rows


def check_convention(
    fn: Callable[..., torch.Tensor], op: str, shapes: Shapes, convention: str, seed: int = 0
) -> ConventionCheck:
    """Run ``fn`` once under ``convention`` and compare with the float64 reference (see module docstring)."""
    pad = CONVENTIONS[convention]
    res = ConventionCheck(convention, pad, atol=DEFAULT_ATOL[torch.float32], rtol=DEFAULT_RTOL[torch.float32])
    g = torch.Generator().manual_seed(seed)
    case = OPS[op](g, shapes, convention)
    ref_out, ref_state = _reference(op, case, pad)
    state = case.args[case.state_key]
    before = state.clone()
    out = torch.full(case.out_shape, float("nan"))  # unwritten outputs show as NaN
    try:
        got = fn(**case.args, pad_slot_id=pad, out=out)
    except Exception as e:  # the user's kernel may raise anything: report it, never into the notebook
        res.error = f"{type(e).__name__}: {e}"
        return res
    got = out if got is None else got
    nrows = shapes.rows + shapes.padded
    skipped = pad is not None
    # padded rows processed on the shared dummy slot (Ascend) have no defined output: compare live rows,
    # and padding tokens / skipped rows against zeros
    compare = [r < shapes.rows or (skipped and r >= 0) or r == -1 for r in case.row_of]
    mask = torch.tensor(compare)
    res.unwritten = int(torch.isnan(got).sum())
    diff = (got.double() - ref_out).abs()
    tol = res.atol + res.rtol * ref_out.abs()
    bad = ~(diff <= tol)
    res.bad_outputs = int(bad[mask].sum())
    res.max_err = float(diff[mask].nan_to_num(float("inf")).max()) if bool(mask.any()) else 0.0
    shown = torch.where(mask.view(-1, *[1] * (diff.dim() - 1)), diff, torch.zeros_like(diff))
    res.err = _per_row_head(shown, case, op, nrows)
    idx = case.args[case.index_key].tolist()
    res.row_labels = [
        f"row {r} -> slot {idx[r]}"
        if r < shapes.rows
        else f"row {r} (pad {idx[r]}, {'skipped' if skipped else 'processed'})"
        for r in range(nrows)
    ] + (["padding tokens"] if -1 in case.row_of else [])
    res.head_labels = [f"{HEAD_NAME[op]} {h}" for h in range(len(res.err[0]) if res.err else 0)]
    if skipped:
        zero_rows = sorted({r for r in case.row_of if r >= shapes.rows or r == -1})
        for r in zero_rows:
            sel = torch.tensor([x == r for x in case.row_of])
            if bool((got[sel] != 0).any()):
                res.padded_nonzero.append(r)
    allowed = set(case.live_slots) | (set() if skipped else {DUMMY_SLOT})
    changed = (state != before).reshape(state.shape[0], -1).any(dim=1).nonzero().flatten().tolist()
    res.foreign_changed = [s for s in changed if s not in allowed]
    for s in case.live_slots:
        d = (state[s].double() - ref_state[s]).abs()
        res.state_err = max(res.state_err, float(d.nan_to_num(float("inf")).max()))
        if bool((~(d <= res.atol + res.rtol * ref_state[s].abs())).any()):
            res.bad_state_slots.append(s)
    return res


def check_capture(fn: Callable[..., torch.Tensor], op: str, shapes: Shapes, seed: int = 0) -> CaptureCheck:
    """Capture ``fn`` (sglang convention) with the CPU recorder, copy fresh inputs and a fresh state into
    the captured tensors, replay, and compare with the float64 reference on the fresh values."""
    from workbench.graphs import get_backend

    pad = CONVENTIONS["sglang"]
    g = torch.Generator().manual_seed(seed)
    static = OPS[op](g, shapes, "sglang")
    out = torch.full(static.out_shape, float("nan"))
    try:
        graph = get_backend("cpu").capture(lambda: fn(**static.args, pad_slot_id=pad, out=out), warmup=1)
    except CaptureError as e:
        return CaptureCheck(False, f"capture refused: {e}")
    except Exception as e:  # the user's kernel may raise anything during warm-up or capture
        return CaptureCheck(False, f"capture raised {type(e).__name__}: {e}")
    fresh = OPS[op](torch.Generator().manual_seed(seed + 1000), shapes, "sglang")
    for k, v in static.args.items():
        if isinstance(v, torch.Tensor) and k not in (static.index_key, "cu_seqlens"):
            v.copy_(fresh.args[k])
    fresh.args[static.index_key] = static.args[static.index_key]  # indices stay: same slots as captured
    ref_out, ref_state = _reference(op, fresh, pad)
    out.fill_(float("nan"))
    graph.replay()
    got = graph.outputs if isinstance(graph.outputs, torch.Tensor) else out
    live = [r >= 0 and r < shapes.rows for r in static.row_of]
    mask = torch.tensor(live)
    err = float((got[mask].double() - ref_out[mask]).abs().nan_to_num(float("inf")).max())
    tol = DEFAULT_ATOL[torch.float32] + DEFAULT_RTOL[torch.float32] * float(ref_out[mask].abs().max())
    st = static.args[static.state_key]
    serr = max(float((st[s].double() - ref_state[s]).abs().max()) for s in static.live_slots)
    n_ops = len(graph.ops or [])
    ok = err <= tol and serr <= tol
    return CaptureCheck(
        ok,
        f"{n_ops} recorded op(s); replay on fresh inputs vs float64 reference: output error {err:.2e}, "
        f"state error {serr:.2e}",
        n_ops,
    )


def check_kernel(
    fn: Callable[..., torch.Tensor],
    op: str = "gated_delta_rule.recurrent",
    shapes: Shapes | None = None,
    *,
    conventions: tuple[str, ...] = tuple(CONVENTIONS),
    capture: bool = True,
    seed: int = 0,
    name: str | None = None,
) -> KernelCheck:
    """Check a kernel function with ``op``'s signature under every padding convention, and capture it.

    >>> from functools import partial
    >>> import kernels.gated_delta_rule as gdn
    >>> check_kernel(partial(gdn.recurrent, impl="reference")).ok
    True
    """
    if op not in OPS:
        raise MetadataError(f"op: {op!r} is not one of {list(OPS)}")
    shapes = shapes or Shapes()
    shapes.check()
    for c in conventions:
        if c not in CONVENTIONS:
            raise MetadataError(f"conventions: {c!r} is not one of {list(CONVENTIONS)}")
    results = [check_convention(fn, op, shapes, c, seed) for c in conventions]
    cap = check_capture(fn, op, shapes, seed) if capture else None
    return KernelCheck(op, name or getattr(fn, "__name__", None) or repr(fn), results, cap)


class PlaygroundModel:
    """Pick an op, shapes, conventions and an implementation ("triton" or "reference", or a user function
    via :meth:`use_kernel`); :meth:`run` returns a :class:`KernelCheck` (never raises: ``error`` is set)."""

    def __init__(self, op: str = "gated_delta_rule.recurrent", impl: str = "triton", **shape_kw: Any) -> None:
        self.op, self.impl = op, impl
        self.shapes = Shapes(**shape_kw)
        self.conventions: tuple[str, ...] = tuple(CONVENTIONS)
        self.capture = True
        self.user_fn: Callable[..., torch.Tensor] | None = None
        self.error: str | None = None
        self.result: KernelCheck | None = None

    def use_kernel(self, fn: Callable[..., torch.Tensor] | None) -> None:
        """Check ``fn`` (the op's signature) instead of a built-in implementation; None goes back."""
        self.user_fn = fn

    def candidate(self) -> tuple[Callable[..., torch.Tensor], str]:
        if self.user_fn is not None:
            return self.user_fn, getattr(self.user_fn, "__name__", "user kernel")
        if self.impl not in ("triton", "reference"):
            raise MetadataError(f"impl: {self.impl!r} is not 'triton' or 'reference'")
        return partial(_op(self.op), impl=self.impl), self.impl

    def run(self, **shape_changes: Any) -> KernelCheck | None:
        self.error, self.result = None, None
        try:
            if shape_changes:
                from dataclasses import replace

                self.shapes = replace(self.shapes, **shape_changes)
            fn, name = self.candidate()
            self.result = check_kernel(
                fn, self.op, self.shapes, conventions=self.conventions, capture=self.capture, name=name
            )
        except (WorkbenchError, TypeError, RuntimeError, ValueError) as e:
            self.error = str(e)
        return self.result
