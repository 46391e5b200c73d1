"""One seeded case builder per op and one check against the float64 reference.

What the kernel tests, the kernel-conformance harness (``workbench.kernelcheck``), ``workbench bench
kernels`` and both GPU scripts build their inputs with, and how they judge an output. A case is one call
of a public op (``kernels.<op>``) on a padded batch under one padding convention
(:mod:`kernels.conventions`):

- ``rows`` live rows on shuffled, non-contiguous slots of a state pool that also holds free slots (the
  lowest and highest usable slot are always live: edges catch off-by-one addressing); then ``padded``
  padded rows carrying the convention's sentinel. Varlen ops get zero-length padded rows (as the engines
  pad ``query_start_loc``) and a few tokens past ``cu_seqlens[-1]`` (a bucket's unused tail).
- Every pool sits inside a *guard band*: ``guard`` slots before and after it in the same storage, filled
  with :data:`GUARD_VALUE`. A kernel that addresses ``state[-1]`` (sglang's sentinel, unguarded) or one
  past the end touches them; the check compares them bitwise. The value is finite on purpose: a
  read-modify-write of a NaN slot stores NaN again, bit for bit what was there, and would pass.
- Inputs are drawn on the host from ``seed`` (the same values on every device), never zeros; outputs are
  NaN-poisoned before every call, so an unwritten row shows.
- Tree variants (``"tree"``: sglang's topk > 1 verify) draw a random draft tree per row from the seed
  (:meth:`_Draw.tree`: node t's parent uniform in 0..t-1; a row may come out a chain), passed as
  ``retrieve_parent_token``; the scatter's ``"accepted_steps"`` commits any step (a tree's node).
- Ops with a K x V state (``OpSpec.state_layouts``) build their pools and intermediate states in the
  case's ``state_layout`` (:data:`kernels.conventions.STATE_LAYOUTS`): one seed, the same states in either.

The check (:meth:`Case.check`) compares a call with the op's torch reference run in float64 on the same
inputs: outputs of live rows, padding tokens and skipped rows (which must be zeros), the live slots of
each pool; every other slot and the guard band bitwise unchanged. What the reference leaves unwritten (the
intermediate buffers' rows of skipped padded rows: scratch nobody reads) may stay unwritten (NaN) or be
zero; a kernel that writes anything else there fails, as does one that leaves NaN where the reference
wrote. Under a convention that processes padded rows (Ascend: on the dummy slot) their outputs and the
dummy slot are not compared: several rows write it at once, nobody reads it.

>>> case = make_case("gated_delta_rule.recurrent", "verify", convention="vllm", rows=2, padded=1)
>>> case.check(case.run(impl="reference")).ok
True
>>> call = case.fresh(); _ = case.fn(**call.args, impl="reference"); call.args["state"][0] += 1
>>> case.check(call).summary()
'gated_delta_rule.recurrent[verify] vllm: slot(s) [0] of state changed but no processed row owns them'
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from kernels.conventions import (
    CONVENTIONS,
    DEFAULT_STATE_LAYOUT,
    STATE_LAYOUTS,
    Convention,
    check_state_layout,
    get_convention,
    state_dims,
    to_layout,
)
from kernels.cost import Cost

# Shape presets, one vocabulary across the workbench: "small" for tests and the Triton interpreter (awkward
# sizes: K and V not powers of two), "quarter" a quarter of an engine layer's heads, "engine" engine-like
# (Qwen3-Next-sized GDN, Mamba2-2.7B-sized SSM). D: draft tokens of a verify step; extend: the longest
# extend row; dim, width: conv channels and kernel width.
SHAPES: dict[str, dict[str, int]] = {
    "small": {"H": 1, "HV": 2, "K": 12, "V": 20, "D": 3, "extend": 20, "dim": 40, "width": 4,
              "nheads": 4, "headdim": 12, "dstate": 20, "ngroups": 2},
    "quarter": {"H": 4, "HV": 8, "K": 128, "V": 128, "D": 4, "extend": 256, "dim": 2048, "width": 4,
                "nheads": 16, "headdim": 64, "dstate": 128, "ngroups": 2},
    "engine": {"H": 16, "HV": 32, "K": 128, "V": 128, "D": 4, "extend": 1024, "dim": 8192, "width": 4,
               "nheads": 64, "headdim": 64, "dstate": 128, "ngroups": 8},
}  # fmt: skip

GUARD_VALUE = 1000.0
"""What the guard slots hold: finite (see the module docstring) and far from any state a case draws."""

# Largest relative error (see :func:`rel_err`) of an output in this dtype against the float64 reference.
TOLERANCE: dict[torch.dtype, float] = {
    torch.float64: 1e-10,
    torch.float32: 1e-4,
    torch.float16: 2e-3,
    torch.bfloat16: 2e-2,
}


def tolerance(dtype: torch.dtype) -> float:
    """The relative tolerance of outputs computed in ``dtype`` (fp32 states, fp32 accumulation)."""
    if dtype not in TOLERANCE:
        raise ValueError(f"dtype: no tolerance for {dtype}; choose one of {list(TOLERANCE)}")
    return TOLERANCE[dtype]


def cu_seqlens(lens: list[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """int32 ``[len(lens) + 1]`` token offsets ``[0, l0, l0 + l1, ...]`` of packed sequences.

    >>> cu_seqlens([2, 0, 3]).tolist()
    [0, 2, 2, 5]
    """
    out, acc = [0], 0
    for n in lens:
        acc += n
        out.append(acc)
    return torch.tensor(out, dtype=torch.int32, device=device)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """``max |got - want| / max(1, max |want|)``, NaN-aware: a NaN on one side only is an error (an unwritten
    poisoned value, or one written that should not be: ``inf``); NaN on both sides (neither wrote) is not."""
    a, b = got.detach().double(), want.detach().double().to(got.device)
    if a.numel() == 0:
        return 0.0
    both = a.isnan() & b.isnan()
    diff = torch.where(both, torch.zeros_like(a), (a - b).abs()).nan_to_num(float("inf"))
    return float(diff.max()) / max(1.0, float(b.nan_to_num(0.0).abs().max()))


def error_text(err: float) -> str:
    """An error of :func:`rel_err` of the kernel's values against the reference's, in words: ``inf`` is a NaN
    on one side only (:meth:`Case.check` judges the reference's unwritten values apart, so there it is the
    kernel's)."""
    return "the kernel left NaN where the reference is finite" if err == float("inf") else f"{err:.3g}"


@dataclass(frozen=True)
class OpSpec:
    """An op the builders know: its public function (``module:attr``), variants, Triton launcher, what its
    main output's second axis is called (for per-row, per-head error maps), and the state layouts its
    ``state_layout`` argument takes (empty: the op has no layout choice, e.g. Mamba2, the convolutions)."""

    name: str
    target: str
    variants: tuple[str, ...]
    launcher: str
    head_name: str
    state_layouts: tuple[str, ...] = ()

    @property
    def fn(self) -> Callable[..., Any]:
        module, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(module), attr)


OPS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in (
        OpSpec("gated_delta_rule.recurrent", "kernels.gated_delta_rule:recurrent",
               ("decode", "gating", "verify", "tree", "extend"),
               "kernels.gated_delta_rule.triton_recurrent:launch_recurrent", "value head", STATE_LAYOUTS),
        OpSpec("gated_delta_rule.chunked", "kernels.gated_delta_rule:chunked", ("extend",),
               "kernels.gated_delta_rule.triton_chunked:launch_chunked", "value head", STATE_LAYOUTS),
        OpSpec("gated_delta_rule.scatter_accepted", "kernels.gated_delta_rule:scatter_accepted",
               ("accept", "accepted_steps"),
               "kernels.gated_delta_rule.triton_recurrent:launch_scatter_accepted", "value head", STATE_LAYOUTS),
        OpSpec("causal_conv1d.update", "kernels.causal_conv1d:update", ("decode", "verify", "tree"),
               "kernels.causal_conv1d.triton_conv:update_triton", "channel"),
        OpSpec("causal_conv1d.varlen", "kernels.causal_conv1d:varlen", ("extend",),
               "kernels.causal_conv1d.triton_conv:varlen_triton", "channel"),
        OpSpec("mamba2.selective_state_update", "kernels.mamba2:selective_state_update",
               ("decode", "verify", "tree"),
               "kernels.mamba2.triton_ssu:selective_state_update_triton", "head"),
        OpSpec("mamba2.chunk_scan", "kernels.mamba2:chunk_scan", ("extend",),
               "kernels.mamba2.triton_scan:chunk_scan_triton", "head"),
        OpSpec("linear_attn.recurrent", "kernels.linear_attn:recurrent", ("decode", "extend"),
               "kernels.linear_attn.triton_recurrent:recurrent_triton", "value head", STATE_LAYOUTS),
    )
}  # fmt: skip


def get_op(op: str) -> OpSpec:
    """The spec of ``op`` (``"gated_delta_rule.recurrent"``, ...); ValueError names the choices."""
    try:
        return OPS[op]
    except (KeyError, TypeError):
        raise ValueError(f"op: unknown op {op!r}; choose one of {list(OPS)}") from None


@dataclass
class Call:
    """The arguments of one call (keyword, ``impl`` excluded) and the storages the pools are views of."""

    args: dict[str, Any]
    storage: dict[str, torch.Tensor]


@dataclass
class Case:
    """One drawn call of an op; see the module docstring. Build with :func:`make_case`.

    Attributes:
        op, variant, convention: what is called, how, under which padding convention.
        rows, padded: live and padded batch rows.
        args: keyword arguments of the public op (``pad_slot_id`` and ``out`` included, ``impl`` not);
            pools are views into ``storage`` (guard band around them).
        outputs: the output tensors among ``args``, NaN-poisoned in every :meth:`fresh` call.
        row_of: per output, the batch row of each index of its first axis (-1: a token past
            ``cu_seqlens[-1]``).
        live_slots: the slot of each live row.
        guard: guard slots before and after each pool.
        cost: bytes moved and FLOPs (``kernels/*/cost.py``); state_bytes: the bytes of live state the op
            must read and write (the copy floor of a memory-bound step: a slot read and written, or for
            verify a slot read and D per-step states written).
        tol: the relative tolerance of :meth:`check` (``tolerance(dtype)``).
        state_layout: how the pools (and intermediate states) lay out a head's K x V state; None for an op
            without a layout choice (:attr:`OpSpec.state_layouts` empty).
    """

    op: str
    variant: str
    convention: Convention
    rows: int
    padded: int
    args: dict[str, Any]
    outputs: tuple[str, ...]
    row_of: dict[str, list[int]]
    live_slots: list[int]
    guard: int
    storage: dict[str, torch.Tensor]
    cost: Cost
    state_bytes: int
    tol: float
    state_layout: str | None = None
    _reference: Call | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return f"{self.op}[{self.variant}]"

    @property
    def spec(self) -> OpSpec:
        return OPS[self.op]

    @property
    def fn(self) -> Callable[..., Any]:
        """The public op (pass ``impl=``)."""
        return self.spec.fn

    @property
    def pools(self) -> tuple[str, ...]:
        return tuple(self.storage)

    def may_change(self) -> set[int]:
        """Slots a correct call may change: the live rows' slots, and the dummy slot where padded rows are
        processed on it."""
        dummy = {self.convention.dummy_slot} if self.convention.processes_padding and self.padded else set()
        return set(self.live_slots) | dummy

    def fresh(self, dtype: torch.dtype | None = None) -> Call:
        """A copy of the arguments (floating tensors in ``dtype`` when given), outputs poisoned with NaN; each
        pool a view into a copy of its storage, guard band included."""

        def copy(t: torch.Tensor) -> torch.Tensor:
            as_dtype = dtype is not None and t.is_floating_point() and t.dtype != dtype
            if 0 in t.stride():  # an expanded per-head parameter, as engines pass them: keep it expanded
                compact = t[tuple(slice(0, 1) if st == 0 else slice(None) for st in t.stride())]
                return (compact.to(dtype) if as_dtype else compact.clone()).expand(t.shape)
            return t.to(dtype) if as_dtype else t.clone()

        args: dict[str, Any] = {}
        for k, v in self.args.items():
            if isinstance(v, torch.Tensor) and k not in self.storage:
                v = copy(v)
                if k in self.outputs:
                    v.fill_(float("nan"))
            args[k] = v
        storage = {k: copy(s) for k, s in self.storage.items()}
        for k, s in storage.items():
            args[k] = s[self.guard : self.guard + self.args[k].shape[0]]
        return Call(args, storage)

    def run(self, fn: Callable[..., Any] | None = None, impl: str | None = None) -> Call:
        """Call ``fn`` (default: the public op) on a :meth:`fresh` copy, with ``impl=`` when given."""
        call = self.fresh()
        kw = {} if impl is None else {"impl": impl}
        (fn or self.fn)(**call.args, **kw)
        return call

    def launch(self, call: Call, **config: Any) -> Callable[[], Any]:
        """The op's Triton launcher (``OpSpec.launcher``) bound to ``call``'s arguments and a launch
        configuration (``block_v=``, ``num_warps=``, ``chunk_size=``, ...; None values dropped); calling it
        launches once and returns what the launcher returns (the compiled kernel, None in the interpreter).

        Launchers take every argument by keyword, on tensors the public op has validated (launch a case the
        public op accepted); what the call leaves out gets the public op's default, as the op passes it.
        """
        module, _, name = self.spec.launcher.partition(":")
        fn = getattr(importlib.import_module(module), name)
        public = inspect.signature(self.fn).parameters
        defaults = {k: p.default for k, p in public.items() if p.default is not inspect.Parameter.empty}
        wanted = inspect.signature(fn).parameters
        kw = {k: call.args[k] if k in call.args else defaults[k] for k in wanted if k in call.args or k in defaults}
        kw.update({k: v for k, v in config.items() if v is not None})
        return lambda: fn(**kw)

    def reference(self) -> Call:
        """The op's torch reference on float64 copies of the inputs (computed once)."""
        if self._reference is None:
            call = self.fresh(torch.float64)
            self.fn(**call.args, impl="reference")
            self._reference = call
        return self._reference

    def compared(self, output: str) -> torch.Tensor:
        """Bool mask over ``output``'s first axis: the indices the check compares (all but padded rows
        processed on the dummy slot, whose values are undefined)."""
        keep = [r < self.rows or not self.convention.processes_padding or r == -1 for r in self.row_of[output]]
        return torch.tensor(keep, dtype=torch.bool)

    def check(self, call: Call, tol: float | None = None) -> CaseCheck:
        """Compare ``call`` (after the candidate ran on it) with the float64 reference.

        Where the reference leaves an output value unwritten (NaN from the poisoning: the intermediate
        buffers' rows of skipped padded rows, scratch nobody reads), the kernel may leave it unwritten or
        write zero (an engine's memset); any other value fails (:attr:`CaseCheck.scratch_written`). Everywhere
        else a NaN from the kernel is a value it never wrote (:attr:`CaseCheck.unwritten`)."""
        tol = self.tol if tol is None else tol
        ref = self.reference()
        res = CaseCheck(self.name, self.convention.name, tol, live_rows=self.rows)
        for name in self.outputs:
            got, want = call.args[name], ref.args[name]
            g, w = got.detach().double(), want.detach().double().to(got.device)
            mask = self.compared(name).to(got.device)
            rows = self.row_of[name]
            scratch = w.isnan()  # the reference leaves it unwritten: nobody reads it
            left = g.isnan() & ~scratch  # the kernel left NaN where the reference wrote
            stray = scratch & ~g.isnan() & (g != 0)  # the kernel wrote a non-zero value into scratch
            judged = torch.where(scratch, w, g)  # scratch is judged by `stray` alone
            res.unwritten += int(left[mask].sum())
            res.output_err[name] = rel_err(judged[mask], w[mask])
            res.unwritten_rows += [(name, r) for r in _rows_where(left, mask, rows)]
            for r in _rows_where(stray, mask, rows):
                sel = torch.tensor([x == r for x in rows], device=got.device)
                res.scratch_written.append((name, r, float(g[sel][stray[sel]][0])))
            wrong = ~scratch & ~g.isnan() & (g != w)  # a written value that is not the reference's
            padding = [r >= self.rows or r == -1 for r in rows]
            pad = torch.tensor(padding, dtype=torch.bool, device=got.device) & mask
            res.padded_wrong += [(name, r) for r in _rows_where(wrong, pad, rows)]
        before = self.storage
        allowed = self.may_change()
        for pool in self.storage:
            after, want, base = call.args[pool], ref.args[pool], self.args[pool]
            changed = (after != base) & ~(after.isnan() & base.isnan())
            slots = changed.reshape(after.shape[0], -1).any(dim=1).nonzero().flatten().tolist()
            res.foreign_changed += [(pool, s) for s in slots if s not in allowed]
            for s in self.live_slots:
                e = rel_err(after[s], want[s])
                res.state_err = max(res.state_err, e)
                if e > tol:
                    res.bad_state_slots.append((pool, s))
            n, g = base.shape[0], self.guard
            for side, sl in (("before", slice(0, g)), ("after", slice(g + n, None))):
                if not _bitwise_equal(call.storage[pool][sl], before[pool][sl]):
                    res.guard_changed.append((pool, side))
        return res

    def error_map(self, call: Call, output: str = "out") -> tuple[list[str], list[str], list[list[float]]]:
        """Max ``|got - want|`` per (batch row, head) of ``output``: row labels, head labels, values (NaN on
        one side: inf, but scratch the reference leaves unwritten is 0 when left unwritten or zeroed, as
        :meth:`check` judges it; rows the check does not compare: 0). A last row holds the tokens past
        ``cu_seqlens[-1]`` when the op has them."""
        got, want = call.args[output].double(), self.reference().args[output].to(call.args[output].device)
        excused = want.isnan() & (got.isnan() | (got == 0))  # scratch left unwritten or zeroed (see check)
        diff = torch.where(excused, torch.zeros_like(got), (got - want).abs()).nan_to_num(float("inf"))
        keep = self.compared(output).to(diff.device).view(-1, *[1] * (diff.dim() - 1))
        diff = torch.where(keep, diff, torch.zeros_like(diff))
        head_axis = diff.dim() - 1 if self.op.startswith("causal_conv1d") else 1
        per = diff.movedim(head_axis, 1).reshape(diff.shape[0], diff.shape[head_axis], -1).amax(dim=2)
        has_tail = -1 in self.row_of[output]
        nrows = self.rows + self.padded
        err = [[0.0] * per.shape[1] for _ in range(nrows + int(has_tail))]
        for i, r in enumerate(self.row_of[output]):
            line = err[r] if r >= 0 else err[-1]
            for h, v in enumerate(per[i].tolist()):
                line[h] = max(line[h], v)
        idx = self.args["state_indices"].tolist()
        fate = "processed" if self.convention.processes_padding else "skipped"
        labels = [
            f"row {r} -> slot {idx[r]}" if r < self.rows else f"row {r} (pad {idx[r]}, {fate})" for r in range(nrows)
        ]
        labels += ["padding tokens"] if has_tail else []
        heads = [f"{self.spec.head_name} {h}" for h in range(per.shape[1])]
        return labels, heads, err


def _rows_where(bad: torch.Tensor, keep: torch.Tensor, rows: list[int]) -> list[int]:
    """The batch rows (``row_of``'s, -1: padding tokens) of the first-axis indices in ``keep`` where ``bad``
    holds anywhere, in order of first appearance."""
    hit = (bad.reshape(bad.shape[0], -1).any(dim=1) & keep).tolist() if bad.numel() else []
    return list(dict.fromkeys(r for r, h in zip(rows, hit, strict=True) if h))


def _rows_text(name: str, rows: list[int]) -> str:
    """``"out rows 3-4"``, ``"out row 0, rows 2-3, padding tokens"``: the rows of one output, runs joined."""
    parts, live = [], sorted(r for r in rows if r >= 0)
    while live:
        lo = hi = live.pop(0)
        while live and live[0] == hi + 1:
            hi = live.pop(0)
        parts.append(f"row {lo}" if lo == hi else f"rows {lo}-{hi}")
    parts += ["padding tokens"] if -1 in rows else []
    return f"{name} {', '.join(parts)}"


def _where(found: list[tuple[str, int]]) -> str:
    """The rows of ``(output, row)`` pairs, grouped by output (:func:`_rows_text`)."""
    names = dict.fromkeys(k for k, _ in found)
    return "; ".join(_rows_text(k, [r for n, r in found if n == k]) for k in names)


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (NaN payloads included)."""
    if a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return bool(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


@dataclass
class CaseCheck:
    """The verdict of :meth:`Case.check`: each list names what went wrong, empty when right.

    Attributes:
        live_rows: the case's live rows (rows past them are padded rows).
        output_err: per output, :func:`rel_err` against the reference where the reference wrote (``inf``: the
            kernel left NaN there).
        unwritten, unwritten_rows: how many output values the kernel left NaN where the reference wrote
            one, and their ``(output, row)``.
        scratch_written: ``(output, row, a value)`` where the kernel wrote non-zero values that the reference
            leaves unwritten (scratch nobody reads: unwritten or zero are accepted, nothing else).
        padded_wrong: ``(output, row)`` of skipped padding (row -1: tokens past ``cu_seqlens[-1]``) written
            with values other than the reference's zeros.
        state_err, bad_state_slots: the live slots' largest error, and those past ``tol``.
        foreign_changed: ``(pool, slot)`` changed that no processed row owns; guard_changed: ``(pool, side)``.
    """

    case: str
    convention: str
    tol: float
    live_rows: int = 0
    output_err: dict[str, float] = field(default_factory=dict)
    unwritten: int = 0
    unwritten_rows: list[tuple[str, int]] = field(default_factory=list)
    scratch_written: list[tuple[str, int, float]] = field(default_factory=list)
    padded_wrong: list[tuple[str, int]] = field(default_factory=list)
    state_err: float = 0.0
    bad_state_slots: list[tuple[str, int]] = field(default_factory=list)
    foreign_changed: list[tuple[str, int]] = field(default_factory=list)
    guard_changed: list[tuple[str, str]] = field(default_factory=list)

    @property
    def max_err(self) -> float:
        return max([self.state_err, *self.output_err.values()])

    @property
    def bad_outputs(self) -> list[str]:
        return [k for k, e in self.output_err.items() if e > self.tol]

    @property
    def ok(self) -> bool:
        return not (
            self.unwritten
            or self.bad_outputs
            or self.scratch_written
            or self.padded_wrong
            or self.bad_state_slots
            or self.foreign_changed
            or self.guard_changed
        )

    def problems(self) -> list[str]:
        """One phrase per kind of failure, naming the rows, slots and tensors, and which side (the kernel or
        the reference) held what."""
        out = []
        if self.guard_changed:
            where = ", ".join(f"{side} {pool}" for pool, side in self.guard_changed)
            out.append(f"memory outside the pool written (guard band {where}): a padded row was not skipped")
        if self.unwritten:
            padding = any(r == -1 or r >= self.live_rows for _, r in self.unwritten_rows)
            out.append(
                f"{self.unwritten} output value(s) never written: the kernel left NaN where the reference is "
                f"finite ({_where(self.unwritten_rows)})"
                + ("; the reference writes zeros for skipped padding" if padding else "")
            )
        for k in self.bad_outputs:
            if self.output_err[k] != float("inf"):  # inf: the kernel's NaN, said above
                out.append(f"{k} off the float64 reference (error {self.output_err[k]:.3g} > {self.tol:g})")
        for k in dict.fromkeys(n for n, _, _ in self.scratch_written):
            found = [(r, v) for n, r, v in self.scratch_written if n == k]
            where = _rows_text(k, [r for r, _ in found])
            out.append(
                f"the kernel wrote non-zero values (e.g. {found[0][1]:.4g}) into {where}, "
                "which the reference leaves unwritten (NaN): scratch nobody reads may stay unwritten or be zero, "
                "nothing else"
            )
        if self.padded_wrong:
            out.append(
                f"outputs of skipped padding not zero: the kernel wrote non-zero values where the reference writes "
                f"zeros ({_where(self.padded_wrong)})"
            )
        if self.foreign_changed:
            for pool in dict.fromkeys(p for p, _ in self.foreign_changed):
                slots = [s for p, s in self.foreign_changed if p == pool]
                out.append(f"slot(s) {slots} of {pool} changed but no processed row owns them")
        if self.bad_state_slots:
            slots = [s for _, s in self.bad_state_slots]
            out.append(f"live slot(s) {slots} off the reference (error {error_text(self.state_err)})")
        return out

    def summary(self) -> str:
        head = f"{self.case} {self.convention}"
        if self.ok:
            return f"{head}: ok (max error {self.max_err:.2e}, untouched slots and guard band bitwise unchanged)"
        return f"{head}: " + "; ".join(self.problems())

    def __repr__(self) -> str:
        return f"CaseCheck({self.summary()!r})"


# ----------------------------------------------------------------------------------------------- builders


class _Draw:
    """Host-side draws from one seed, moved to the case's device and dtype."""

    def __init__(self, seed: int, device: torch.device, dtype: torch.dtype) -> None:
        self.g = torch.Generator().manual_seed(seed)
        self.device, self.dtype = device, dtype

    def randn(self, *shape: int, scale: float = 1.0, dtype: torch.dtype | None = None) -> torch.Tensor:
        return (torch.randn(*shape, generator=self.g) * scale).to(self.device, dtype or self.dtype)

    def uniform(self, *shape: int, lo: float, hi: float) -> torch.Tensor:
        return (lo + (hi - lo) * torch.rand(*shape, generator=self.g)).to(self.device)

    def ints(self, values: list[int], dtype: torch.dtype = torch.int32) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.device)

    def nan(self, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.full(shape, float("nan"), device=self.device, dtype=dtype or self.dtype)

    def tree(self, rows: int, nodes: int) -> torch.Tensor:
        """int32 ``[rows, nodes]`` ``retrieve_parent_token``: a random draft tree per row, node t's parent
        uniform in 0..t-1 (node 0, the root, holds 0, as sglang writes it). A row may come out a chain."""
        parents = torch.zeros(rows, nodes, dtype=torch.int32)
        for t in range(1, nodes):
            parents[:, t] = torch.randint(0, t, (rows,), generator=self.g, dtype=torch.int32)
        return parents.to(self.device)


@dataclass
class _Batch:
    """The rows of a case: slots, lengths, and the pool size."""

    rows: int
    padded: int
    convention: Convention
    num_slots: int
    live: list[int]

    @property
    def n(self) -> int:
        return self.rows + self.padded

    @property
    def indices(self) -> list[int]:
        return self.live + [self.convention.sentinel] * self.padded


def _slots(g: torch.Generator, rows: int, padded: int, convention: Convention, num_slots: int | None) -> _Batch:
    first = convention.first_live_slot
    n = num_slots if num_slots is not None else rows + first + max(2, rows // 2)
    if n - first < rows:
        raise ValueError(f"num_slots: {n} cannot hold {rows} live rows beside the dummy slot {convention.dummy_slot}")
    middle = (torch.randperm(n - first - 2, generator=g) + first + 1).tolist() if n - first > 2 else []
    edges = [first, n - 1] if n - first >= 2 else [first]
    live = (edges + middle)[:rows]
    order = torch.randperm(rows, generator=g).tolist()
    return _Batch(rows, padded, convention, n, [live[i] for i in order])


def _pool(d: _Draw, b: _Batch, guard: int, *slot: int, scale: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """A float32 pool of ``b.num_slots`` random slots inside ``guard`` slots of :data:`GUARD_VALUE` each side:
    (storage, view)."""
    storage = torch.full((b.num_slots + 2 * guard, *slot), GUARD_VALUE, device=d.device)
    storage[guard : guard + b.num_slots] = d.randn(b.num_slots, *slot, scale=scale, dtype=torch.float32)
    return storage, storage[guard : guard + b.num_slots]


def _lens(b: _Batch, L: int | list[int], padded_tokens: bool) -> list[int]:
    live = [L] * b.rows if isinstance(L, int) else L
    pad = (live[0] if live else 1) if padded_tokens else 0
    return live + [pad] * b.padded


def _token_rows(lens: list[int], rows: int, T: int, padded_tokens: bool) -> list[int]:
    """Batch row of each packed token; -1 past the live tokens (or past every row's tokens with
    ``padded_tokens``: then padded rows own theirs)."""
    out = [r for r, n in enumerate(lens) for _ in range(n)]
    return out + [-1] * (T - len(out))


@dataclass
class _Ctx:
    spec: dict[str, int]
    draw: _Draw
    batch: _Batch
    guard: int
    padded_tokens: bool
    tail: int  # tokens past cu_seqlens[-1] of varlen ops
    layout: str = DEFAULT_STATE_LAYOUT  # of K x V states (ops with OpSpec.state_layouts)

    def kv_state(self, *lead: int, K: int, V: int, scale: float = 1.0, nan: bool = False) -> torch.Tensor:
        """Float32 ``[*lead, K, V]`` states (NaN, or drawn K-first whatever the layout, so that one seed gives
        the same states in both), laid out :attr:`layout`."""
        if nan:
            return self.draw.nan(*lead, *state_dims(self.layout, K, V), dtype=torch.float32)
        return to_layout(self.draw.randn(*lead, K, V, scale=scale, dtype=torch.float32), "k_first", self.layout)

    def kv_pool(self, HV: int, K: int, V: int, scale: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`_pool` of ``[HV, K, V]`` slots laid out :attr:`layout` (drawn K-first, as :meth:`kv_state`)."""
        storage, _ = _pool(self.draw, self.batch, self.guard, HV, K, V, scale=scale)
        storage = to_layout(storage, "k_first", self.layout)
        return storage, storage[self.guard : self.guard + self.batch.num_slots]


def _extend_lens(rows: int, longest: int) -> list[int]:
    """Varied extend lengths up to ``longest``, one short row (a chunk and a tail), never zero."""
    lens = [max(1, (longest * (3 + 5 * i)) // 8 % longest + 1) for i in range(rows)]
    if rows > 1:
        lens[0] = max(1, min(5, longest))
    return lens


def _gdn_recurrent(c: _Ctx, variant: str, chunked: bool = False) -> tuple[dict[str, Any], dict[str, list[int]], Cost]:
    from kernels.gated_delta_rule import chunked_cost, recurrent_cost
    from kernels.gated_delta_rule.ops import DEFAULT_CHUNK_SIZE

    s, d, b = c.spec, c.draw, c.batch
    H, HV, K, V, D = s["H"], s["HV"], s["K"], s["V"], s["D"]
    verify = variant in ("verify", "tree")  # tree: a verify whose tokens are the nodes of a draft tree
    L: int | list[int] = 1 if variant in ("decode", "gating") else D if verify else _extend_lens(b.rows, s["extend"])
    lens = _lens(b, L, c.padded_tokens)
    T = sum(lens) + c.tail
    storage, state = c.kv_pool(HV, K, V)
    args: dict[str, Any] = {
        "q": d.randn(T, H, K),
        "k": d.randn(T, H, K),
        "v": d.randn(T, HV, V),
        "state": state,
        "state_indices": d.ints(b.indices),
        "cu_seqlens": cu_seqlens(lens, d.device),
        "scale": K**-0.5,
        "use_qk_l2norm": True,
        "pad_slot_id": b.convention.pad_slot_id,
        "out": d.nan(T, HV, V),
    }
    fused = variant in ("gating", "tree")  # sglang's tree verify gates in the kernel too
    if fused:  # the engine's raw inputs, gated inside the kernel (what the layers call)
        f32 = torch.float32
        args.update(
            a=d.randn(T, HV, scale=2.0, dtype=f32),
            b=d.randn(T, HV, scale=2.0, dtype=f32),
            A_log=d.randn(HV, scale=0.5, dtype=f32),
            dt_bias=d.randn(HV, scale=0.5, dtype=f32),
        )
    else:
        args.update(g=-d.uniform(T, HV, lo=0.02, hi=0.5), beta=d.uniform(T, HV, lo=0.1, hi=0.9))
    row_of = {"out": _token_rows(lens, b.rows, T, c.padded_tokens)}
    built: dict[str, Any] = {"args": args, "storage": {"state": storage}}
    if verify:
        args["intermediate_states"] = c.kv_state(b.n, D, HV, K=K, V=V, nan=True)
        args["disable_state_update"] = True
        row_of["intermediate_states"] = list(range(b.n))
        built["transfers"] = 1 + D  # the slot read once, D per-step states written
    if variant == "tree":
        args["retrieve_parent_token"] = d.tree(b.n, D)
    if variant == "extend":
        args["has_initial_state"] = d.ints([i % 3 != 1 for i in range(b.n)], dtype=torch.bool)
    n_tok = sum(lens[: b.rows])
    if chunked:
        args["chunk_size"] = DEFAULT_CHUNK_SIZE
        cost = chunked_cost(n_tok, b.rows, H, HV, K, V, d.dtype, chunk_size=DEFAULT_CHUNK_SIZE)
    else:
        cost = recurrent_cost(
            n_tok, b.rows, H, HV, K, V, d.dtype, num_intermediate=b.rows * D if verify else 0,
            fused_gating=fused, use_qk_l2norm=True, state_update=not verify, tree=variant == "tree",
        )  # fmt: skip
    return built, row_of, cost


def _gdn_scatter(c: _Ctx, variant: str) -> tuple[dict[str, Any], dict[str, list[int]], Cost]:
    from kernels.gated_delta_rule import scatter_accepted_cost

    s, d, b = c.spec, c.draw, c.batch
    HV, K, V, D = s["HV"], s["K"], s["V"], s["D"]
    storage, state = c.kv_pool(HV, K, V)
    accepted = (torch.randint(1, D + 1, (b.n,), generator=d.g)).tolist()
    args = {
        "state": state,
        "intermediate_states": c.kv_state(b.n, D, HV, K=K, V=V),
        "state_indices": d.ints(b.indices),
        "num_accepted": d.ints(accepted),
        "pad_slot_id": b.convention.pad_slot_id,
    }
    if variant == "accepted_steps":  # any step, a tree's accepted node: sglang's last_correct_step_indices
        args["accepted_steps"] = d.ints(torch.randint(0, D, (b.n,), generator=d.g).tolist())
        del args["num_accepted"]
    return {"args": args, "storage": {"state": storage}}, {}, scatter_accepted_cost(b.rows, HV, K, V)


def _conv_update(c: _Ctx, variant: str) -> tuple[dict[str, Any], dict[str, list[int]], Cost]:
    from kernels.causal_conv1d import update_cost

    s, d, b = c.spec, c.draw, c.batch
    dim, W = s["dim"], s["width"]
    verify = variant in ("verify", "tree")
    L = s["D"] if verify else 1
    storage, pool = _pool(d, b, c.guard, dim, W - 1, scale=1.0)
    args: dict[str, Any] = {
        "x": d.randn(b.n, L, dim),
        "conv_state": pool,
        "weight": d.randn(dim, W, scale=W**-0.5),
        "bias": d.randn(dim, scale=0.1),
        "state_indices": d.ints(b.indices),
        "activation": "silu",
        "pad_slot_id": b.convention.pad_slot_id,
        "out": d.nan(b.n, L, dim),
    }
    row_of = {"out": list(range(b.n))}
    built: dict[str, Any] = {"args": args, "storage": {"conv_state": storage}}
    if verify:  # per-step windows for the accept step; the pool itself is left alone
        args["intermediate_conv_windows"] = d.nan(b.n, L, dim, W - 1, dtype=torch.float32)
        args["disable_state_update"] = True
        row_of["intermediate_conv_windows"] = list(range(b.n))
        built["transfers"] = 1 + L
    if variant == "tree":
        args["retrieve_parent_token"] = d.tree(b.n, L)
    cost = update_cost(b.rows, L, dim, W, d.dtype, state_dtype=torch.float32, intermediate=verify,
                       state_update=not verify, tree=variant == "tree")  # fmt: skip
    return built, row_of, cost


def _conv_varlen(c: _Ctx, variant: str) -> tuple[dict[str, Any], dict[str, list[int]], Cost]:
    from kernels.causal_conv1d import varlen_cost

    s, d, b = c.spec, c.draw, c.batch
    dim, W = s["dim"], s["width"]
    lens = _lens(b, _extend_lens(b.rows, s["extend"]), c.padded_tokens)
    T = sum(lens) + c.tail
    storage, pool = _pool(d, b, c.guard, dim, W - 1, scale=1.0)
    args = {
        "x": d.randn(T, dim),
        "weight": d.randn(dim, W, scale=W**-0.5),
        "bias": d.randn(dim, scale=0.1),
        "conv_state": pool,
        "state_indices": d.ints(b.indices),
        "has_initial_state": d.ints([i % 3 != 1 for i in range(b.n)], dtype=torch.bool),
        "cu_seqlens": cu_seqlens(lens, d.device),
        "activation": "silu",
        "pad_slot_id": b.convention.pad_slot_id,
        "out": d.nan(T, dim),
    }
    cost = varlen_cost(sum(lens[: b.rows]), b.rows, dim, W, d.dtype, state_dtype=torch.float32)
    row_of = {"out": _token_rows(lens, b.rows, T, c.padded_tokens)}
    return {"args": args, "storage": {"conv_state": storage}}, row_of, cost


def _mamba2(c: _Ctx, variant: str) -> tuple[dict[str, Any], dict[str, list[int]], Cost]:
    from kernels.mamba2 import selective_state_update_cost

    s, d, b = c.spec, c.draw, c.batch
    nh, hd, ds, ng = s["nheads"], s["headdim"], s["dstate"], s["ngroups"]
    verify = variant in ("verify", "tree")
    lead = (b.n, s["D"]) if verify else (b.n,)  # a verify's D draft tokens per row
    storage, state = _pool(d, b, c.guard, nh, hd, ds, scale=0.3)
    f32 = torch.float32
    args = {
        "state": state,
        "x": d.randn(*lead, nh, hd),
        # per-head parameters expanded over headdim (stride 0), as the engines pass them
        "dt": d.uniform(*lead, nh, 1, lo=0.0, hi=1.0).expand(*lead, nh, hd),
        "A": (-d.uniform(nh, 1, 1, lo=0.1, hi=1.0)).expand(nh, hd, ds),
        "B": d.randn(*lead, ng, ds),
        "C": d.randn(*lead, ng, ds),
        "D": d.randn(nh, 1, dtype=f32).expand(nh, hd),
        "z": d.randn(*lead, nh, hd),
        "dt_bias": d.randn(nh, 1, scale=0.5, dtype=f32).expand(nh, hd),
        "dt_softplus": True,
        "state_indices": d.ints(b.indices),
        "pad_slot_id": b.convention.pad_slot_id,
        "out": d.nan(*lead, nh, hd),
    }
    row_of = {"out": list(range(b.n))}
    built: dict[str, Any] = {"args": args, "storage": {"state": storage}}
    if verify:  # the state after each draft step, by batch row; the pool itself is left alone
        args["intermediate_states"] = d.nan(*lead, nh, hd, ds, dtype=f32)
        args["disable_state_update"] = True
        row_of["intermediate_states"] = list(range(b.n))
        built["transfers"] = 1 + s["D"]
    if variant == "tree":
        args["retrieve_parent_token"] = d.tree(b.n, s["D"])
    cost = selective_state_update_cost(
        b.rows, nh, hd, ds, ng, d.dtype, steps=s["D"] if verify else 1, state_update=not verify, intermediate=verify,
        tree=variant == "tree",
    )  # fmt: skip
    return built, row_of, cost


def scan_chunk_size(extend: int) -> int:
    """``chunk_size`` of a ``mamba2.chunk_scan`` case whose longest row has ``extend`` tokens: 4 for short
    rows (they start on and off the grid, several entries each), 64 for long ones (an entry is a whole
    state: the grid stays a fraction of the tokens)."""
    return 4 if extend < 64 else 64


def _mamba2_scan(c: _Ctx, variant: str) -> tuple[dict[str, Any], dict[str, list[int]], Cost]:
    from kernels.mamba2 import chunk_scan_cost
    from kernels.mamba2.chunk_grid import grid_owner, grid_size

    s, d, b = c.spec, c.draw, c.batch
    nh, hd, ds, ng = s["nheads"], s["headdim"], s["dstate"], s["ngroups"]
    lens = _lens(b, _extend_lens(b.rows, s["extend"]), c.padded_tokens)
    T = sum(lens) + c.tail
    chunk = scan_chunk_size(s["extend"])
    storage, state = _pool(d, b, c.guard, nh, hd, ds, scale=0.3)
    f32 = torch.float32
    cu = cu_seqlens(lens, d.device)
    args = {
        "x": d.randn(T, nh, hd),
        "dt": d.uniform(T, nh, lo=-1.0, hi=1.0).to(d.dtype),
        "A": -d.uniform(nh, lo=0.1, hi=1.0),
        "B": d.randn(T, ng, ds),
        "C": d.randn(T, ng, ds),
        "D": d.randn(nh, dtype=f32),
        "z": d.randn(T, nh, hd),
        "dt_bias": d.randn(nh, scale=0.5, dtype=f32),
        "dt_softplus": True,
        "state": state,
        "state_indices": d.ints(b.indices),
        "cu_seqlens": cu,
        "has_initial_state": d.ints([i % 3 != 1 for i in range(b.n)], dtype=torch.bool),
        "pad_slot_id": b.convention.pad_slot_id,
        "chunk_size": chunk,
        "out": d.nan(T, nh, hd),
        "chunk_states": d.nan(grid_size(T, chunk), nh, hd, ds, dtype=f32),
    }
    cu_list = cu.tolist()
    owners = [grid_owner(cu_list, k, chunk, T) for k in range(grid_size(T, chunk))]
    row_of = {
        "out": _token_rows(lens, b.rows, T, c.padded_tokens),
        "chunk_states": [-1 if o is None else o[0] for o in owners],
    }
    cost = chunk_scan_cost(sum(lens[: b.rows]), b.rows, nh, hd, ds, ng, d.dtype, num_chunks=len(owners), has_z=True)
    return {"args": args, "storage": {"state": storage}}, row_of, cost


def _linear_attn(c: _Ctx, variant: str) -> tuple[dict[str, Any], dict[str, list[int]], Cost]:
    from kernels.linear_attn import recurrent_cost

    s, d, b = c.spec, c.draw, c.batch
    H, HV, K, V = s["H"], s["HV"], s["K"], s["V"]
    L: int | list[int] = 1 if variant == "decode" else _extend_lens(b.rows, min(s["extend"], 8))
    lens = _lens(b, L, c.padded_tokens)
    T = sum(lens) + c.tail
    storage, state = c.kv_pool(HV, K, V, scale=0.3)
    args = {
        "q": d.randn(T, H, K),
        "k": d.randn(T, H, K, scale=0.3),
        "v": d.randn(T, HV, V),
        "state": state,
        "state_indices": d.ints(b.indices),
        "cu_seqlens": cu_seqlens(lens, d.device),
        "scale": K**-0.5,  # a plain sum of outer products grows: keep the outputs O(1)
        "pad_slot_id": b.convention.pad_slot_id,
        "out": d.nan(T, HV, V),
    }
    cost = recurrent_cost(sum(lens[: b.rows]), b.rows, H, HV, K, V, d.dtype)
    return {"args": args, "storage": {"state": storage}}, {"out": _token_rows(lens, b.rows, T, c.padded_tokens)}, cost


_BUILDERS: dict[str, Callable[[_Ctx, str], tuple[dict[str, Any], dict[str, list[int]], Cost]]] = {
    "gated_delta_rule.recurrent": _gdn_recurrent,
    "gated_delta_rule.chunked": lambda c, v: _gdn_recurrent(c, v, chunked=True),
    "gated_delta_rule.scatter_accepted": _gdn_scatter,
    "causal_conv1d.update": _conv_update,
    "causal_conv1d.varlen": _conv_varlen,
    "mamba2.selective_state_update": _mamba2,
    "mamba2.chunk_scan": _mamba2_scan,
    "linear_attn.recurrent": _linear_attn,
}


def _check_count(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}: must be an int >= {low}, got {value!r}")
    return value


def make_case(
    op: str,
    variant: str | None = None,
    *,
    rows: int = 3,
    padded: int = 2,
    convention: str | Convention = "sglang",
    shapes: str | Mapping[str, int] = "small",
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    guard: int = 1,
    padded_tokens: bool = False,
    tail: int | None = None,
    num_slots: int | None = None,
    state_layout: str | None = None,
) -> Case:
    """Draw one call of ``op`` (see the module docstring).

    Args:
        op: a name of :data:`OPS`; variant: one of its variants (default the first: decode, extend, ...).
        rows, padded: live rows (>= 1) and padded rows at the tail (>= 0).
        convention: a name of :data:`kernels.conventions.CONVENTIONS` or a Convention.
        shapes: a preset of :data:`SHAPES` or a mapping overriding "small"'s entries.
        seed: every draw comes from it, on the host; device: where the tensors go.
        dtype: activations and outputs (q, k, v, x, B, C, z, out); states, gates and intermediate buffers
            stay float32, as engines keep them.
        guard: slots of ``GUARD_VALUE`` before and after each pool (0: none).
        padded_tokens: give padded rows of varlen ops the live rows' token count instead of zero (the
            kernel must still skip them under a skipping convention).
        tail: tokens past ``cu_seqlens[-1]`` (default 2 for "small" shapes, else 0).
        num_slots: pool size (default: the live rows, the dummy slot and a few free slots).
        state_layout: one of :data:`~kernels.conventions.STATE_LAYOUTS`: the pool and the intermediate states
            are built in that layout and the call passes ``state_layout=``; one seed draws the same states in
            both. None: the op's default (k_first), passed to no call. Only for ops with
            :attr:`OpSpec.state_layouts` (ValueError otherwise).
    """
    spec = get_op(op)
    variant = spec.variants[0] if variant is None else variant
    if variant not in spec.variants:
        raise ValueError(f"variant: {op} has no variant {variant!r}; choose one of {list(spec.variants)}")
    conv = get_convention(convention)
    layout = _case_layout(spec, state_layout)
    _check_count("rows", rows, 1)
    _check_count("padded", padded, 0)
    _check_count("guard", guard, 0)
    if isinstance(shapes, str):
        if shapes not in SHAPES:
            raise ValueError(f"shapes: unknown preset {shapes!r}; choose one of {list(SHAPES)}")
        sizes, preset = dict(SHAPES[shapes]), shapes
    else:
        unknown = set(shapes) - set(SHAPES["small"])
        if unknown:
            raise ValueError(f"shapes: unknown size(s) {sorted(unknown)}; known: {list(SHAPES['small'])}")
        sizes, preset = {**SHAPES["small"], **shapes}, "small"
    for k, v in sizes.items():
        _check_count(f"shapes[{k!r}]", v, 2 if k == "width" else 1)
    tolerance(dtype)
    dev = torch.device(device)
    draw = _Draw(seed, dev, dtype)
    batch = _slots(draw.g, rows, padded, conv, num_slots)
    ctx = _Ctx(sizes, draw, batch, guard, padded_tokens, (2 if preset == "small" else 0) if tail is None else tail)
    ctx.layout = layout or DEFAULT_STATE_LAYOUT
    built, row_of, cost = _BUILDERS[op](ctx, variant)
    args, storage = built["args"], built["storage"]
    if state_layout is not None:
        args["state_layout"] = state_layout
    slot_bytes = {k: s[0].numel() * s.element_size() for k, s in storage.items()}
    transfers = built.get("transfers", 2)  # slot-sized reads + writes per live row: one each, or verify's
    return Case(
        op=op,
        variant=variant,
        convention=conv,
        rows=rows,
        padded=padded,
        args=args,
        outputs=tuple(row_of),
        row_of=row_of,
        live_slots=list(batch.live),
        guard=guard,
        storage=storage,
        cost=cost,
        state_bytes=transfers * rows * sum(slot_bytes.values()),
        tol=tolerance(dtype),
        state_layout=layout,
    )


def _case_layout(spec: OpSpec, state_layout: str | None) -> str | None:
    """The layout of a case of ``spec``: ``state_layout`` checked, the default for an op with a layout choice,
    None for one without."""
    if state_layout is None:
        return DEFAULT_STATE_LAYOUT if spec.state_layouts else None
    check_state_layout(state_layout)
    if state_layout not in spec.state_layouts:
        raise ValueError(
            f"state_layout: {spec.name} takes no state layout (its state is not a K x V matrix); leave it None"
        )
    return state_layout


def all_cases(**kw: Any) -> list[Case]:
    """Every op and variant under every convention (keyword arguments as :func:`make_case`)."""
    return [
        make_case(op, variant, convention=conv, **kw)
        for op, spec in OPS.items()
        for variant in spec.variants
        for conv in CONVENTIONS
    ]
