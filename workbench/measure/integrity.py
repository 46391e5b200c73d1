""" "Nothing lost": after a step, which slots changed that should not have, which live rows disagree with
the float64 reference, and which padded outputs are not zeros. Data in, a report out (for tests and widgets).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from kernels.dtypes import cast
from workbench import html
from workbench.layers import FLOAT32_TOLERANCE

# kernels against the float64 reference, on the small test layers (float32: the layers' one pair)
DEFAULT_ATOL = {torch.float32: FLOAT32_TOLERANCE.atol, torch.float16: 2e-2, torch.bfloat16: 5e-2, torch.float64: 1e-10}
DEFAULT_RTOL = {torch.float32: FLOAT32_TOLERANCE.rtol, torch.float16: 2e-2, torch.bfloat16: 5e-2, torch.float64: 1e-8}


class SlotChange(NamedTuple):
    """A state slot that changed although no live row owns it."""

    tensor: str
    slot: int


class StateMismatch(NamedTuple):
    """A live slot's new state off the float64 reference (``error``: max abs difference)."""

    tensor: str
    slot: int
    error: float


class RowMismatch(NamedTuple):
    """A batch row of a per-row buffer (e.g. a verify intermediate) off its reference."""

    tensor: str
    row: int
    error: float


class OutputMismatch(NamedTuple):
    """A live output token row off the float64 reference."""

    token: int
    error: float


@dataclass
class IntegrityReport:
    """What a step broke. Empty lists everywhere means the step was clean.

    Attributes:
        changed_slots: slots that no live row owns (nor the dummy) yet changed.
        state_mismatches: live slots whose new state is off the reference.
        intermediate_mismatches: batch rows of the per-row buffers (``intermediates`` of :func:`check`,
            e.g. verify intermediate states) off their reference.
        output_mismatches: live output token rows off the reference.
        nonzero_padded_outputs: token rows of padded outputs that are not exactly zero.
        atol, rtol: the tolerances used.
    """

    changed_slots: list[SlotChange] = field(default_factory=list)
    state_mismatches: list[StateMismatch] = field(default_factory=list)
    intermediate_mismatches: list[RowMismatch] = field(default_factory=list)
    output_mismatches: list[OutputMismatch] = field(default_factory=list)
    nonzero_padded_outputs: list[int] = field(default_factory=list)
    atol: float = 0.0
    rtol: float = 0.0

    @property
    def ok(self) -> bool:
        return not (
            self.changed_slots
            or self.state_mismatches
            or self.intermediate_mismatches
            or self.output_mismatches
            or self.nonzero_padded_outputs
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "changed_slots": [list(c) for c in self.changed_slots],
            "state_mismatches": [list(m) for m in self.state_mismatches],
            "intermediate_mismatches": [list(m) for m in self.intermediate_mismatches],
            "output_mismatches": [list(m) for m in self.output_mismatches],
            "nonzero_padded_outputs": self.nonzero_padded_outputs,
            "atol": self.atol,
            "rtol": self.rtol,
        }

    def problems(self) -> list[tuple[str, str, str, float | None]]:
        """Every problem as ``(what, tensor, where, error)``: one row each, for tables."""
        out: list[tuple[str, str, str, float | None]] = []
        out += [("foreign slot changed", c.tensor, f"slot {c.slot}", None) for c in self.changed_slots]
        out += [("state off reference", m.tensor, f"slot {m.slot}", m.error) for m in self.state_mismatches]
        out += [("row off reference", m.tensor, f"row {m.row}", m.error) for m in self.intermediate_mismatches]
        out += [("output off reference", "output", f"token {m.token}", m.error) for m in self.output_mismatches]
        out += [("padded output not zero", "output", f"token {t}", None) for t in self.nonzero_padded_outputs]
        return out

    def __str__(self) -> str:
        if self.ok:
            return "integrity: clean (no foreign slot changed, live rows match the float64 reference, padding zeros)"
        lines = ["integrity: PROBLEMS"]
        lines += [f"  slot {c.slot} of {c.tensor} changed but no live row owns it" for c in self.changed_slots]
        lines += [
            f"  {m.tensor}[{m.slot}] differs from the float64 reference by {error_text(m.error)}"
            for m in self.state_mismatches
        ]
        lines += [
            f"  {m.tensor} row {m.row} differs from the float64 reference by {error_text(m.error)}"
            for m in self.intermediate_mismatches
        ]
        lines += [
            f"  output token {m.token} differs from the float64 reference by {error_text(m.error)}"
            for m in self.output_mismatches
        ]
        if self.nonzero_padded_outputs:
            lines.append(f"  padded output rows not zero: {self.nonzero_padded_outputs}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        if self.ok:
            return f"IntegrityReport(ok, atol={self.atol:.3g}, rtol={self.rtol:.3g})"
        counts = {
            "changed_slots": len(self.changed_slots),
            "state_mismatches": len(self.state_mismatches),
            "intermediate_mismatches": len(self.intermediate_mismatches),
            "output_mismatches": len(self.output_mismatches),
            "nonzero_padded_outputs": len(self.nonzero_padded_outputs),
        }
        return "IntegrityReport(FAIL: " + ", ".join(f"{k}={v}" for k, v in counts.items() if v) + ")"

    def _repr_html_(self) -> str:
        tol = {"atol": self.atol, "rtol": self.rtol}
        if self.ok:
            verdict = html.badge(True, "clean: no foreign slot changed, live rows match the float64 reference")
            return html.block(verdict, html.facts(tol), title="IntegrityReport")
        rows = [[what, tensor, where, "" if err is None else err] for what, tensor, where, err in self.problems()]
        table = html.table(["problem", "tensor", "where", "max abs error"], rows, row_kinds=["fail"] * len(rows))
        verdict = html.badge(False, f"FAIL: {len(rows)} problem(s)")
        return html.block(verdict, html.facts(tol), table, title="IntegrityReport")


def snapshot(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Clones of a pool's tensors, to compare against after a step."""
    return {name: t.detach().clone() for name, t in tensors.items()}


def changed_slots(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> list[SlotChange]:
    """Every ``(name, slot)`` whose bytes differ (bitwise: NaN-safe, -0.0 vs 0.0 counts as a change)."""
    out = []
    for name, b in before.items():
        a = after[name]
        if a.shape != b.shape:  # reshaped below: a mismatch would be read as other slots, not refused
            raise ValueError(f"changed_slots: {name} is {tuple(b.shape)} before and {tuple(a.shape)} after")
        if not b.numel():
            continue
        n = b.shape[0]  # slots first; a [num_slots] tensor too (its bytes are not more slots)
        if a.is_contiguous() and b.is_contiguous():
            diff = a.reshape(n, -1).view(torch.uint8) != b.reshape(n, -1).view(torch.uint8)
        else:
            diff = a.ne(b).reshape(n, -1)
        # a row's max over its flags read as uint8, not `any(dim=1)`: the same answer, 4-5x cheaper on the CPU on
        # a trace's pool (91 slots of 1.5 KB), where it was 5% of checking a trace (issue 33)
        rows = diff.view(torch.uint8).amax(dim=1).nonzero().flatten().tolist()
        out += [SlotChange(name, int(s)) for s in rows]
    return out


def _errors(got: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(``|got - ref|`` per value, in float64; which values are off): the one test of closeness, elementwise.

    The pre-filter (:func:`_suspect_rows`) and the measure of a row (:func:`_max_err`) both use it, so the
    pre-filter cannot pass a value the measure would call off: no sum, norm or absolute value of ``got``
    alone, which a sign flip or two opposite errors would leave unchanged. NaN is off (``NaN <= x`` is False).
    """
    err, close = _closeness(got, ref, atol, rtol)
    return err, ~close


def _closeness(got: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(``|got - ref|`` in float64, which values are within ``atol + rtol |ref|``): :func:`_errors` before its
    negation, in place where it can (a trace step makes a few of these on small tensors: calls are the cost)."""
    g, r = cast(got, torch.float64), cast(ref, torch.float64)
    err = torch.sub(g, r).abs_()
    return err, err <= torch.abs(r).mul_(rtol).add_(atol)


def _max_err(got: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> tuple[bool, float]:
    """(any value off, the largest error): NaN when a NaN is involved (said as NaN, never as a number)."""
    err, bad = _errors(got, ref, atol, rtol)
    if not err.numel():
        return False, 0.0
    return bool(bad.any()), float("nan") if bool(err.isnan().any()) else float(err.max())


# Values `_suspect_rows` compares at once (each becomes a few float64 temporaries).
_CHUNK_VALUES = 1 << 22


def _suspect_rows(got: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> list[int]:
    """Indices along dim 0 that `_max_err` must look at: those with a value off, found for all rows at once.

    A step's check is mostly clean, and row by row it is hundreds of small torch calls; the callers still
    decide and measure each suspect row with `_max_err`, so the report is the row-by-row one. Tensors whose
    shapes differ (``got[i]`` and ``ref[i]`` broadcast) are all suspect.
    """
    n = got.shape[0]
    if got.shape != ref.shape:
        return list(range(n))
    if not got.numel():
        return []
    step = max(1, _CHUNK_VALUES // (got.numel() // n))
    suspect: list[int] = []
    for lo in range(0, n, step):
        _, close = _closeness(got[lo : lo + step], ref[lo : lo + step], atol, rtol)  # the test of `_max_err`
        if not bool(close.all()):
            off = ~close
            suspect += (off.reshape(off.shape[0], -1).any(dim=1).nonzero().flatten() + lo).tolist()
    return suspect


def worst(errors: Iterable[float]) -> float:
    """The largest error, NaN if any is NaN (``max`` alone depends on the order NaNs come in)."""
    values = list(errors)
    return float("nan") if any(math.isnan(e) for e in values) else max(values, default=0.0)


def error_text(err: float) -> str:
    """An error for a message: ``NaN`` spelled out, else three significant digits."""
    return "NaN" if math.isnan(err) else f"{err:.3g}"


def check(
    before: dict[str, torch.Tensor],
    after: dict[str, torch.Tensor],
    *,
    allowed_slots: Iterable[int],
    live_slots: Iterable[int],
    reference_state: dict[str, torch.Tensor],
    live_outputs: torch.Tensor,
    reference_outputs: torch.Tensor,
    padded_outputs: torch.Tensor | None = None,
    padded_offset: int = 0,
    intermediates: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
    atol: float | None = None,
    rtol: float | None = None,
) -> IntegrityReport:
    """Compare a step's effects with what should have happened.

    Args:
        before, after: pool tensors (name -> ``[num_slots, ...]``) before and after the step.
        allowed_slots: slots the step may write (those of live rows, and the profile's dummy slot).
        live_slots: slots whose new state must match ``reference_state`` (float64, same names).
        live_outputs, reference_outputs: ``[tokens, ...]`` outputs of the live rows and their reference.
        padded_outputs: outputs of padded token rows (must be exactly zero), if any; their first token row
            is ``padded_offset`` (reported rows are absolute).
        intermediates: per-batch-row buffers, name -> ``(got, reference)`` each ``[rows, ...]``, checked row by
            row (e.g. verify intermediate states); reported in ``intermediate_mismatches``.
        atol, rtol: defaults by the outputs' dtype (``DEFAULT_ATOL`` / ``DEFAULT_RTOL``).
    """
    dtype = live_outputs.dtype
    atol = DEFAULT_ATOL.get(dtype, 1e-4) if atol is None else atol
    rtol = DEFAULT_RTOL.get(dtype, 1e-3) if rtol is None else rtol
    rep = IntegrityReport(atol=atol, rtol=rtol)
    allowed = set(allowed_slots)
    rep.changed_slots = [c for c in changed_slots(before, after) if c.slot not in allowed]
    slots = list(live_slots)
    if slots:
        index = torch.tensor([int(s) for s in slots], dtype=torch.long)
        for name, ref in reference_state.items():
            got_live, ref_live = after[name].index_select(0, index), ref.index_select(0, index)  # in the order given
            for i in _suspect_rows(got_live, ref_live, atol, rtol):
                bad, err = _max_err(got_live[i], ref_live[i], atol, rtol)
                if bad:
                    rep.state_mismatches.append(StateMismatch(name, int(slots[i]), err))
    for name, (got, ref) in (intermediates or {}).items():
        for row in _suspect_rows(got, ref, atol, rtol):
            bad, err = _max_err(got[row], ref[row], atol, rtol)
            if bad:
                rep.intermediate_mismatches.append(RowMismatch(name, row, err))
    for t in _suspect_rows(live_outputs, reference_outputs, atol, rtol):
        bad, err = _max_err(live_outputs[t], reference_outputs[t], atol, rtol)
        if bad:
            rep.output_mismatches.append(OutputMismatch(t, err))
    if padded_outputs is not None and padded_outputs.numel():
        nz = padded_outputs.reshape(padded_outputs.shape[0], -1).ne(0).any(dim=1).nonzero().flatten()
        rep.nonzero_padded_outputs = [padded_offset + int(i) for i in nz.tolist()]
    return rep
