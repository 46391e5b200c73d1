"""What a kernel check returns: one :class:`ConventionResult` per padding convention, a
:class:`CaptureResult`, and the :class:`KernelCheck` that holds them. Each says what went wrong in words
(``summary()``), has a short ``__repr__`` and renders itself in a notebook (``_repr_html_``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kernels.conventions import Convention
from kernels.testing import Call, Case, CaseCheck
from workbench import html

ErrorMap = tuple[list[str], list[str], list[list[float]]]  # row labels, head labels, max |error| per cell


@dataclass
class ConventionResult:
    """The candidate under one padding convention, against the float64 reference.

    Attributes:
        convention: the convention (sentinel, skip rule, dummy slot).
        case: the drawn call (``kernels.testing.Case``); call: the candidate's arguments after it ran
            (outputs, pools), None if it never ran.
        check: ``Case.check``'s verdict (None when the candidate raised).
        error: ``"Type: message"`` when the candidate raised.
        notes: hints beside the verdict (e.g. a result returned instead of written into ``out``).
    """

    convention: Convention
    case: Case = field(repr=False)
    call: Call | None = field(default=None, repr=False)
    check: CaseCheck | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.convention.name

    @property
    def ok(self) -> bool:
        return self.error is None and self.check is not None and self.check.ok

    @property
    def max_err(self) -> float:
        """The largest relative error of the outputs and live slots (NaN when the candidate raised)."""
        return float("nan") if self.check is None else self.check.max_err

    def problems(self) -> list[str]:
        """One phrase per kind of failure (empty when ok)."""
        if self.error is not None:
            return [f"raised {self.error}"]
        return ([] if self.check is None else self.check.problems()) + ([] if self.ok else self.notes)

    def summary(self) -> str:
        if self.ok:
            return f"{self.name}: ok (max error {self.max_err:.2e}, untouched slots and guard band bitwise unchanged)"
        return f"{self.name}: " + "; ".join(self.problems())

    def error_map(self, output: str | None = None) -> ErrorMap | None:
        """``Case.error_map`` of ``output`` (default: the op's first output) per (batch row, head); None when
        the candidate raised or the op writes no output (``scatter_accepted``)."""
        if self.call is None or self.error is not None or not self.case.outputs:
            return None
        return self.case.error_map(self.call, output or self.case.outputs[0])

    def __repr__(self) -> str:
        return f"ConventionResult({self.summary()})"

    def _repr_html_(self) -> str:
        problems = self.problems()
        head = html.facts({"convention": self.name, "padded rows hold": self.convention.sentinel,
                           "kernels": self.convention.guard})  # fmt: skip
        body = (
            html.table(["problem"], [[p] for p in problems], row_kinds=["fail"] * len(problems), left=("problem",))
            if problems
            else html.note(self.summary())
        )
        return html.block(html.badge(self.ok), head, body, title=f"{self.case.name} under {self.name}")


@dataclass
class CaptureResult:
    """Capture through the CPU graph recorder, then a replay on new values written into the captured
    tensors: ok when the replay passes ``Case.check`` on those values (the graph froze nothing).

    Attributes:
        convention: the convention of the captured call.
        ok: the verdict; detail: why, in words.
        ops: the names of the recorded ops (one custom op per kernel call when it is registered as one).
        check: ``Case.check`` of the replay (None when capture or replay failed).
    """

    convention: str
    ok: bool
    detail: str
    ops: list[str] = field(default_factory=list)
    check: CaseCheck | None = None

    @property
    def num_ops(self) -> int:
        return len(self.ops)

    def summary(self) -> str:
        return f"capture: {'ok' if self.ok else 'FAILED'}: {self.detail}"

    def __repr__(self) -> str:
        return f"CaptureResult({self.summary()})"

    def _repr_html_(self) -> str:
        return html.block(html.badge(self.ok, self.summary()), title=f"capture ({self.convention})")


@dataclass
class KernelCheck:
    """A candidate kernel checked against ``op``'s float64 reference under padding conventions, and
    captured. Index it by convention name (``res["vllm"]``).

    Attributes:
        op, variant: what was checked (names of ``kernels.testing.OPS``); candidate: the kernel's name.
        conventions: one result per convention, in the order asked.
        capture: the capture check, None when not asked for.
        shapes, rows, padded, seed: how the cases were drawn (``kernels.testing.make_case``).
    """

    op: str
    variant: str
    candidate: str
    conventions: list[ConventionResult]
    capture: CaptureResult | None = None
    shapes: str = "small"
    rows: int = 3
    padded: int = 2
    seed: int = 0

    @property
    def name(self) -> str:
        return f"{self.op}[{self.variant}]"

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.conventions) and (self.capture is None or self.capture.ok)

    @property
    def failures(self) -> list[str]:
        """The conventions that failed (and "capture" when it did)."""
        out = [c.name for c in self.conventions if not c.ok]
        return out + (["capture"] if self.capture is not None and not self.capture.ok else [])

    def __getitem__(self, convention: str) -> ConventionResult:
        for c in self.conventions:
            if c.name == convention:
                return c
        raise KeyError(f"convention: {convention!r} was not checked; checked {[c.name for c in self.conventions]}")

    def summary(self) -> str:
        lines = [f"{self.name} [{self.candidate}]: {'OK' if self.ok else 'PROBLEMS'}"]
        lines += ["  " + c.summary() for c in self.conventions]
        if self.capture is not None:
            lines.append("  " + self.capture.summary())
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        rows, kinds = [], []
        for c in self.conventions:
            kind = "ok" if c.ok else "fail"
            err = "" if c.check is None else c.max_err
            problems = "; ".join(c.problems()) or "untouched slots and guard band bitwise unchanged"
            rows.append([c.name, c.convention.sentinel, c.convention.guard, html.Cell("ok" if c.ok else "FAIL", kind),
                         err, problems])  # fmt: skip
            kinds.append(kind)
        cols = ["convention", "padded rows hold", "kernels", "verdict", "max error", "problems"]
        table = html.table(cols, rows, row_kinds=kinds, left=("convention", "kernels", "problems"))
        head = html.facts({"candidate": self.candidate, "shapes": self.shapes, "rows": self.rows,
                           "padded": self.padded, "seed": self.seed})  # fmt: skip
        parts = [html.badge(self.ok, "OK" if self.ok else f"FAIL: {', '.join(self.failures)}"), head]
        parts.append(table)
        if self.capture is not None:
            parts.append(f"<div>{html.badge(self.capture.ok, self.capture.summary())}</div>")
        return html.block(*parts, title=f"KernelCheck {self.name}")
