"""What a kernel check returns: one :class:`ConventionResult` per padding convention and form of padded
rows, a :class:`CaptureResult`, the :class:`VariantCheck` that holds them for one variant of the op, and the
:class:`KernelCheck` that holds every variant checked. Each says what went wrong in words (``summary()``;
``lines()``: one line per check, what ``workbench check-kernel`` prints), has a short ``__repr__`` and
renders itself in a notebook (``_repr_html_``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kernels.conventions import Convention
from kernels.testing import Call, Case, CaseCheck
from workbench import html
from workbench.kernelcheck.sizing import sizes_used

ErrorMap = tuple[list[str], list[str], list[list[float]]]  # row labels, head labels, max |error| per cell
TOKENS = "+tokens"  # the key suffix of a run whose padded rows carry tokens ("sglang+tokens")


def _span(lo: int, hi: int) -> str:
    """``"row 3"`` or ``"rows 3-4"`` for rows ``lo..hi`` inclusive."""
    return f"row {lo}" if lo == hi else f"rows {lo}-{hi}"


@dataclass
class ConventionResult:
    """The candidate under one padding convention, against the float64 reference.

    Attributes:
        convention: the convention (sentinel, skip rule, dummy slot).
        case: the drawn call (``kernels.testing.Case``); call: the candidate's arguments after it ran
            (outputs, pools), None if it never ran.
        check: ``Case.check``'s verdict (None when the candidate raised).
        error: ``"Type: message"`` when the candidate raised.
        misuse: what the candidate did to its arguments instead of writing them in place (resized or replaced
            a tensor, wrote a metadata tensor it must only read), in words; then nothing was judged.
        notes: hints beside the verdict (e.g. a result returned instead of written into ``out``).
        padded_tokens: padded rows of a varlen op carried the live rows' token count (else zero tokens, as
            engines pad); paired: the other form ran too under this convention (then the label says which).
    """

    convention: Convention
    case: Case = field(repr=False)
    call: Call | None = field(default=None, repr=False)
    check: CaseCheck | None = None
    error: str | None = None
    misuse: str | None = None
    notes: list[str] = field(default_factory=list)
    padded_tokens: bool = False
    paired: bool = False

    @property
    def name(self) -> str:
        return self.convention.name

    @property
    def variant(self) -> str:
        return self.case.variant

    @property
    def varlen(self) -> bool:
        """The op packs tokens by ``cu_seqlens``: padded rows may be zero-length."""
        return "cu_seqlens" in self.case.args

    @property
    def key(self) -> str:
        """How a :class:`VariantCheck` is indexed: the convention's name, ``+tokens`` for padded rows with tokens."""
        return self.name + (TOKENS if self.padded_tokens and self.varlen else "")

    @property
    def padding(self) -> str:
        """What the padded rows carried: "zero-length", "with tokens", "with inputs" (an op whose every row
        has its inputs: no ``cu_seqlens``), or "none" (no padded rows)."""
        if not self.case.padded:
            return "none"
        if not self.varlen:
            return "with inputs"
        return "with tokens" if self.padded_tokens else "zero-length"

    @property
    def label(self) -> str:
        """The convention's name, and the form of its padded rows where both forms were checked."""
        if self.varlen and (self.padded_tokens or self.paired):
            return f"{self.name} ({'padded rows with tokens' if self.padded_tokens else 'zero-length padded rows'})"
        return self.name

    @property
    def ok(self) -> bool:
        return self.error is None and self.misuse is None and self.check is not None and self.check.ok

    @property
    def max_err(self) -> float:
        """The largest relative error of the outputs and live slots (NaN when the candidate raised)."""
        return float("nan") if self.check is None else self.check.max_err

    def problems(self) -> list[str]:
        """One phrase per kind of failure (empty when ok)."""
        if self.error is not None:
            return [f"raised {self.error}"]
        if self.misuse is not None:
            return [self.misuse]
        return ([] if self.check is None else self.check.problems()) + ([] if self.ok else self.notes)

    def rows_text(self) -> str:
        """Which rows were live on which slots, and what the padded rows held: ``live rows 0-2 on slots [1, 6, 3];
        padded rows 3-4 hold -1 (zero-length)``."""
        c = self.case
        text = f"live {_span(0, c.rows - 1)} on slot(s) {c.live_slots}"
        if c.padded:
            text += f"; padded {_span(c.rows, c.rows + c.padded - 1)} hold {c.convention.sentinel} ({self.padding})"
        return text

    def summary(self) -> str:
        if self.ok:
            return f"{self.label}: ok (max error {self.max_err:.2e}, untouched slots and guard band bitwise unchanged)"
        return f"{self.label}: " + "; ".join(self.problems())

    def error_map(self, output: str | None = None) -> ErrorMap | None:
        """``Case.error_map`` of ``output`` (default: the op's first output) per (batch row, head); None when
        the candidate raised, resized or replaced an argument (:attr:`misuse`), or the op writes no output
        (``scatter_accepted``)."""
        if self.call is None or self.error is not None or self.misuse is not None or not self.case.outputs:
            return None
        return self.case.error_map(self.call, output or self.case.outputs[0])

    def to_dict(self) -> dict[str, Any]:
        err = self.max_err
        return {"convention": self.name, "padded_rows": self.padding, "ok": self.ok,
                "max_error": None if err != err else err, "problems": self.problems(),
                "live_slots": list(self.case.live_slots), "sentinel": self.case.convention.sentinel}  # fmt: skip

    def __repr__(self) -> str:
        return f"ConventionResult({self.summary()})"

    def _repr_html_(self) -> str:
        problems = self.problems()
        head = html.facts({"convention": self.name, "padded rows hold": self.convention.sentinel,
                           "padded rows": self.padding, "kernels": self.convention.guard})  # fmt: skip
        body = (
            html.table(["problem"], [[p] for p in problems], row_kinds=["fail"] * len(problems), left=("problem",))
            if problems
            else html.note(self.summary())
        )
        return html.block(html.badge(self.ok), head, body, title=f"{self.case.name} under {self.label}")


@dataclass
class CaptureResult:
    """Capture through the CPU graph recorder, then a replay on new values written into the captured
    tensors: ok when the replay passes ``Case.check`` on those values (the graph froze nothing).

    Attributes:
        convention: the convention of the captured call.
        ok: the verdict; detail: why, in words.
        ops: the names of the recorded ops (one custom op per kernel call when it is registered as one).
        check: ``Case.check`` of the replay (None when capture or replay failed).
        error: ``"Type: message"`` when the kernel raised during warm-up, capture or replay (not when the
            recorder refused it).
    """

    convention: str
    ok: bool
    detail: str
    ops: list[str] = field(default_factory=list)
    check: CaseCheck | None = None
    error: str | None = None

    @property
    def num_ops(self) -> int:
        return len(self.ops)

    def summary(self) -> str:
        return f"capture: {'ok' if self.ok else 'FAILED'}: {self.detail}"

    def to_dict(self) -> dict[str, Any]:
        return {"convention": self.convention, "ok": self.ok, "detail": self.detail, "ops": list(self.ops)}

    def __repr__(self) -> str:
        return f"CaptureResult({self.summary()})"

    def _repr_html_(self) -> str:
        return html.block(html.badge(self.ok, self.summary()), title=f"capture ({self.convention})")


@dataclass
class VariantCheck:
    """One variant of an op checked under padding conventions, and captured. Index it by convention
    (``res["vllm"]``: padded rows as engines pad them; ``res["vllm+tokens"]``: padded rows with tokens).

    Attributes:
        op, variant: what was checked (names of ``kernels.testing.OPS``).
        conventions: one result per convention and form of padded rows, in the order asked.
        capture: the capture check, None when not asked for (or when the kernel does not fit the call).
        unfit: why the candidate cannot take this variant's call (an argument it lacks or requires), in
            words; then nothing ran.
    """

    op: str
    variant: str
    conventions: list[ConventionResult]
    capture: CaptureResult | None = None
    unfit: str | None = None

    @property
    def name(self) -> str:
        return f"{self.op}[{self.variant}]"

    @property
    def ok(self) -> bool:
        return self.unfit is None and all(c.ok for c in self.conventions) and (self.capture is None or self.capture.ok)

    @property
    def failures(self) -> list[str]:
        """The keys of the conventions that failed (and "capture", or "signature" when the kernel does not fit)."""
        out = ["signature"] if self.unfit is not None else []
        out += [c.key for c in self.conventions if not c.ok]
        return out + (["capture"] if self.capture is not None and not self.capture.ok else [])

    def __getitem__(self, key: str) -> ConventionResult:
        for c in self.conventions:
            if key in (c.key, c.label):
                return c
        raise KeyError(f"convention: {key!r} was not checked; checked {[c.key for c in self.conventions]}")

    def details(self) -> list[str]:
        """One line per check (convention and form, capture), unindented."""
        if self.unfit is not None:
            return [f"not run: {self.unfit}"]
        out = [c.summary() for c in self.conventions]
        return out + ([self.capture.summary()] if self.capture is not None else [])

    def lines(self) -> list[str]:
        """One line per check, each naming the variant and the convention; a failure also names the rows and
        slots (what ``workbench check-kernel`` prints)."""
        if self.unfit is not None:
            return [f"FAIL {self.name}: {self.unfit}"]
        out = []
        for c in self.conventions:
            if c.ok:
                out.append(f"ok   {self.name} {c.label}: max error {c.max_err:.2e}")
            elif c.misuse is not None:  # nothing was judged: the rows and slots say nothing
                out.append(f"FAIL {self.name} {c.label}: {c.misuse}")
            else:
                out.append(f"FAIL {self.name} {c.label}: {'; '.join(c.problems())}; {c.rows_text()}")
        if self.capture is not None:
            verdict = "ok  " if self.capture.ok else "FAIL"
            out.append(f"{verdict} {self.name} capture ({self.capture.convention}): {self.capture.detail}")
        return out

    def summary(self) -> str:
        return "\n".join([f"{self.name}: {'OK' if self.ok else 'PROBLEMS'}", *("  " + d for d in self.details())])

    def to_dict(self) -> dict[str, Any]:
        return {"variant": self.variant, "ok": self.ok, "unfit": self.unfit,
                "conventions": [c.to_dict() for c in self.conventions],
                "capture": None if self.capture is None else self.capture.to_dict()}  # fmt: skip

    def __repr__(self) -> str:
        return self.summary()


@dataclass
class KernelCheck:
    """A candidate kernel checked against ``op``'s float64 reference: every variant asked, each under padding
    conventions and captured. Index it by variant (``res["verify"]``, a :class:`VariantCheck`), or, when one
    variant was checked, by convention (``res["vllm"]``).

    Attributes:
        op: what was checked (a name of ``kernels.testing.OPS``); candidate: the kernel's name.
        variants: one :class:`VariantCheck` per variant, in the op's order.
        shapes, rows, padded, seed: how the cases were drawn (``kernels.testing.make_case``); sizes: every
            size of the shapes (``kernels.testing.SHAPES``'s keys).
    """

    op: str
    candidate: str
    variants: list[VariantCheck]
    shapes: str = "small"
    sizes: dict[str, int] = field(default_factory=dict)
    rows: int = 3
    padded: int = 2
    seed: int = 0

    @property
    def names(self) -> list[str]:
        """The variants checked."""
        return [v.variant for v in self.variants]

    @property
    def name(self) -> str:
        return self.variants[0].name if len(self.variants) == 1 else self.op

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.variants)

    @property
    def results(self) -> list[ConventionResult]:
        """Every convention run of every variant, in order."""
        return [c for v in self.variants for c in v.conventions]

    @property
    def failures(self) -> list[str]:
        """What failed: ``"variant: key"`` per failed check (``"decode: sglang+tokens"``, ``"verify: capture"``)."""
        return [f"{v.variant}: {f}" for v in self.variants for f in v.failures]

    def __getitem__(self, key: str) -> Any:
        for v in self.variants:
            if v.variant == key:
                return v
        if len(self.variants) == 1:
            return self.variants[0][key]
        raise KeyError(f"variant: {key!r} was not checked; checked {self.names} (index a variant by convention)")

    def _errors(self) -> list[str | None]:
        """Per check that ran (each convention run, each capture): what the kernel raised, None if nothing."""
        out: list[str | None] = []
        for v in self.variants:
            out += [c.error for c in v.conventions]
            out += [] if v.capture is None else [v.capture.error]
        return out

    @property
    def num_checks(self) -> int:
        """The checks made: each convention run and capture, and one per variant the kernel does not fit."""
        return len(self._errors()) + sum(v.unfit is not None for v in self.variants)

    @property
    def num_failed(self) -> int:
        """The checks that failed (of :attr:`num_checks`)."""
        failed = sum(not c.ok for c in self.results) + sum(v.unfit is not None for v in self.variants)
        return failed + sum(v.capture is not None and not v.capture.ok for v in self.variants)

    @property
    def raised(self) -> str | None:
        """``"Type: message"`` when every check ran the kernel and each time it raised that same error (then
        nothing was judged: :meth:`lines` says so once); else None."""
        errors = self._errors()
        if any(v.unfit is not None for v in self.variants) or not errors or len(set(errors)) != 1:
            return None
        return errors[0]

    def hint(self) -> str:
        """What to try when every check raised :attr:`raised`: power-of-two sizes where the error says the
        kernel needs them and some size of these shapes is not one (Triton's ``tl.arange(0, K)``); else ""."""
        error = self.raised or ""
        if "power of 2" not in error and "power of two" not in error.lower():
            return ""
        used = [k for k in sizes_used(self.op, self.names) if k != "extend"]  # a token count: no block of it
        odd = {k: n for k, n in self.sizes.items() if k in used and n & (n - 1)}
        if not odd:
            return ""
        here = ", ".join(f"{k}={n}" for k, n in odd.items())
        two = ",".join(f"{k}={1 << (n - 1).bit_length()}" for k, n in odd.items())
        return f"; the kernel may support only power-of-two sizes ({here} here): try --shape quarter or --shape {two}"

    def lines(self) -> list[str]:
        """One line per check of every variant (see :meth:`VariantCheck.lines`); one line in all when every
        check raised the same error (:attr:`raised`), with a :meth:`hint`."""
        error = self.raised
        if error is not None and self.num_checks > 1:
            return [f"FAIL {self.name}: every check ({self.num_checks}) raised {error}{self.hint()}"]
        out = [line for v in self.variants for line in v.lines()]
        return out if error is None else [line + self.hint() for line in out]

    def summary(self) -> str:
        verdict = "OK" if self.ok else "PROBLEMS"
        if len(self.variants) == 1:
            v = self.variants[0]
            return "\n".join([f"{v.name} [{self.candidate}]: {verdict}", *("  " + d for d in v.details())])
        lines = [f"{self.op} [{self.candidate}]: {verdict} ({len(self.variants)} variants: {', '.join(self.names)})"]
        for v in self.variants:
            lines += [f"  {v.variant}: {'OK' if v.ok else 'PROBLEMS'}", *("    " + d for d in v.details())]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "candidate": self.candidate, "ok": self.ok, "shapes": self.shapes, "sizes": self.sizes,
                "rows": self.rows, "padded": self.padded, "seed": self.seed,
                "variants": [v.to_dict() for v in self.variants]}  # fmt: skip

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        rows: list[list[object]] = []
        kinds = []
        for v in self.variants:
            if v.unfit is not None:
                rows.append([v.variant, "", "", "", "", html.Cell("FAIL", "fail"), "", f"not run: {v.unfit}"])
                kinds.append("fail")
            for c in v.conventions:
                kind = "ok" if c.ok else "fail"
                err = "" if c.check is None else c.max_err
                problems = "; ".join(c.problems()) or "untouched slots and guard band bitwise unchanged"
                rows.append([v.variant, c.name, c.padding, c.convention.sentinel, c.convention.guard,
                             html.Cell("ok" if c.ok else "FAIL", kind), err, problems])  # fmt: skip
                kinds.append(kind)
        cols = [
            "variant",
            "convention",
            "padded rows",
            "padded rows hold",
            "kernels",
            "verdict",
            "max error",
            "problems",
        ]
        table = html.table(cols, rows, row_kinds=kinds, left=("variant", "convention", "padded rows", "kernels",
                                                               "problems"))  # fmt: skip
        head = html.facts({"candidate": self.candidate, "shapes": self.shapes, "rows": self.rows,
                           "padded": self.padded, "seed": self.seed})  # fmt: skip
        parts = [html.badge(self.ok, "OK" if self.ok else f"FAIL: {', '.join(self.failures)}"), head, table]
        for v in self.variants:
            if v.capture is not None:
                parts.append(f"<div>{html.badge(v.capture.ok, f'{v.variant} {v.capture.summary()}')}</div>")
        return html.block(*parts, title=f"KernelCheck {self.name}")
