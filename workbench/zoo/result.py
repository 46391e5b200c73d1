"""What a zoo case hands back: typed evidence of what one run produced, and the result that wraps it.

Every evidence type answers ``broken`` from its own data (an exception was caught, an integrity report has
problems, rows differ), so a ``ZooResult`` is broken exactly when one of its pieces of evidence is: nothing
is set by hand.
"""

from __future__ import annotations

import math
import re
import traceback
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench import html
from workbench.errors import WorkbenchError
from workbench.measure.integrity import IntegrityReport, error_text, worst
from workbench.traces.replay import TraceDivergence

if TYPE_CHECKING:
    from workbench.metadata import Metadata


class ZooError(WorkbenchError, ValueError):
    """An unknown case name, or a bad argument to a case."""


class NotApplicable(Exception):
    """Raised by a scenario that finds, once it runs, that it cannot be built around the user's class (its
    own hooks route around the case's base, say): the message says why, and the result is "not
    applicable", never a failure of a class the case could not look at. Not a ``WorkbenchError``: it is
    no bad input either."""


@dataclass(frozen=True)
class RaisedError:
    """An exception a run raised and the zoo caught: its type, its message, and where it happened."""

    type: str
    message: str
    where: str = ""

    @property
    def broken(self) -> bool:
        return True  # only ever made from a caught exception

    def summary(self) -> str:
        at = f" ({self.where})" if self.where else ""
        return f"{self.type}: {_LOCALS.sub('', self.message)}{at}"

    @classmethod
    def of(cls, exc: BaseException, where: str = "") -> RaisedError:
        return cls(type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "", where)


_LOCALS = re.compile(r"[\w.]*<locals>\.")  # qualname prefixes of classes made inside functions
_RECORDER_AT = re.compile(r"At (?P<file>[^:\s]+):(?P<line>\d+) in (?P<func>\w+)(?:: `(?P<code>.*)`)?\.?\s*$")
_RECORDER_OP = re.compile(r"(aten\.[\w.]+)")


@dataclass(frozen=True)
class RecorderError:
    """The CPU recorder refused an op during capture: which op, and the source line that issued it."""

    op: str
    file: str
    line: int
    function: str
    code: str
    message: str

    @property
    def broken(self) -> bool:
        return True  # only ever made from a caught CaptureError

    def summary(self) -> str:
        return f"recorder refused {self.op} at {self.file}:{self.line} in {self.function}"

    @classmethod
    def parse(cls, exc: BaseException) -> RecorderError | None:
        """Read the op and ``file:line in func: `code``` out of a ``CaptureError`` message (None if absent)."""
        text = str(exc)
        at = _RECORDER_AT.search(text)
        op = _RECORDER_OP.search(text)
        if at is None or op is None:
            return None
        return cls(
            op=op.group(1).rstrip("."),
            file=at.group("file"),
            line=int(at.group("line")),
            function=at.group("func"),
            code=at.group("code") or "",
            message=text.split(". ")[0],
        )


@dataclass(frozen=True)
class IntegrityEvidence:
    """An integrity report (``workbench.measure.integrity``) and who owns the slots it names.

    ``what`` says which step was checked; ``owners`` maps each slot the report names to the request-pool
    row that owns it (None: no live request owns it). For a figure of the pool (``viz.zoo_evidence``):
    ``written``, every slot whose state the step changed (allowed or not); ``live``, the slots the step's
    live rows own; ``dummy``, the slot it may write without owning it (None: none); ``num_slots``, the
    pool's size (0: not recorded).
    """

    what: str
    report: IntegrityReport
    owners: dict[int, int | None] = field(default_factory=dict)
    written: tuple[int, ...] = ()
    live: tuple[int, ...] = ()
    dummy: int | None = None
    num_slots: int = 0

    @property
    def broken(self) -> bool:
        return not self.report.ok

    @property
    def slots(self) -> list[int]:
        """Every slot the report names: changed without an owner in the step, or off the reference."""
        named = {s for _, s in self.report.changed_slots}
        named |= {s for n, s, _ in self.report.state_mismatches if not n.startswith("intermediate")}
        return sorted(named)

    @property
    def rows(self) -> list[int]:
        """Output token rows off the reference, then padded rows that are not zeros."""
        return sorted({t for t, _ in self.report.output_mismatches} | set(self.report.nonzero_padded_outputs))

    def summary(self) -> str:
        r = self.report
        if r.ok:
            return f"{self.what}: clean"
        parts = []
        if r.changed_slots:
            slots = sorted({s for _, s in r.changed_slots})
            parts.append(f"foreign slot(s) {slots} written" + self._owned(slots))
        bad_state = sorted({s for n, s, _ in r.state_mismatches if not n.startswith("intermediate")})
        if bad_state:
            err = worst(e for n, _, e in r.state_mismatches if not n.startswith("intermediate"))
            parts.append(f"live slot(s) {bad_state} off the reference by {error_text(err)}" + self._owned(bad_state))
        if r.output_mismatches:
            rows = [t for t, _ in r.output_mismatches]
            parts.append(f"output row(s) {rows} off by {error_text(worst(e for _, e in r.output_mismatches))}")
        if r.nonzero_padded_outputs:
            parts.append(f"padded output row(s) {r.nonzero_padded_outputs} not zero")
        return f"{self.what}: " + "; ".join(parts)

    def _owned(self, slots: list[int]) -> str:
        owned = [self.owners[s] for s in slots if self.owners.get(s) is not None]
        return f" (owned by request row(s) {owned})" if owned else ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "report": self.report.to_dict(),
            "owners": {str(k): v for k, v in self.owners.items()},
            "written": list(self.written),
            "live": list(self.live),
            "dummy": self.dummy,
            "num_slots": self.num_slots,
        }


@dataclass(frozen=True)
class RowsDiffer:
    """Rows of one quantity that differ from what they should hold, each with its error or values.

    ``rows[i]`` differs by ``errors[i]`` (max abs error; ``inf`` where the row is not finite), or holds
    ``got[i]`` where ``expected[i]`` was due (index metadata). For a figure (``viz.zoo_evidence``):
    ``field_name``, the metadata field compared, and ``metadata``, clones of the metadata the graph ran with
    and of the metadata it should have had (None: not kept; left out of :meth:`ZooResult.to_dict`).
    """

    what: str
    rows: list[int]
    errors: list[float] = field(default_factory=list)
    got: list[Any] = field(default_factory=list)
    expected: list[Any] = field(default_factory=list)
    field_name: str = ""
    metadata: tuple[Metadata, Metadata] | None = field(default=None, compare=False, repr=False)

    @property
    def broken(self) -> bool:
        return bool(self.rows)

    def summary(self) -> str:
        if not self.rows:
            return f"{self.what}: every row as expected"
        if self.got:
            pairs = ", ".join(
                f"row {r}: {g} (want {e})" for r, g, e in zip(self.rows, self.got, self.expected, strict=True)
            )
            return f"{self.what}: {pairs}"
        errs = ", ".join(f"row {r}: {_err(e)}" for r, e in zip(self.rows, self.errors, strict=True))
        return f"{self.what}: {errs}"


def _err(e: float) -> str:
    return f"{e:.3g}" if math.isfinite(e) else "NaN/inf"


@dataclass(frozen=True)
class AddressMismatch:
    """The tensor a graph recorded is not the one written before replay (``data_ptr`` of each)."""

    field_name: str
    recorded_ptr: int
    written_ptr: int

    @property
    def broken(self) -> bool:
        return self.recorded_ptr != self.written_ptr

    def summary(self) -> str:
        if not self.broken:
            return f"{self.field_name}: written in place at the recorded address"
        return f"{self.field_name}: written at {self.written_ptr:#x}, the graph reads {self.recorded_ptr:#x}"


@dataclass(frozen=True)
class Propagation:
    """Rows holding non-finite values (NaN, inf) at each stage of a pipeline, in pipeline order: ``stages``,
    ``(stage name, its non-finite rows)``."""

    stages: tuple[tuple[str, tuple[int, ...]], ...]
    num_rows: int = 0
    """The step's token rows (live and padded: a figure's columns); 0 when not recorded."""

    @property
    def broken(self) -> bool:
        return any(rows for _, rows in self.stages)

    def summary(self) -> str:
        hit = [(name, rows) for name, rows in self.stages if rows]
        if not hit:
            return "every stage finite: " + " -> ".join(name for name, _ in self.stages)
        rows = sorted({r for _, rs in hit for r in rs})
        return f"NaN in row(s) {rows}: " + " -> ".join(name for name, _ in hit)


@dataclass(frozen=True)
class Survived:
    """A run that was expected to be able to fail went through: what it did (for the record)."""

    what: str

    @property
    def broken(self) -> bool:
        return False

    def summary(self) -> str:
        return self.what


@dataclass(frozen=True)
class Interrupted:
    """The scenario stopped on an exception that is not this case's bug (run against a user's backend or
    kernel): the case could not look, so it is neither clean nor reproduced. ``where``: the innermost
    ``file:line in function`` of the traceback."""

    type: str
    message: str
    where: str = ""

    @property
    def broken(self) -> bool:
        return True  # not clean: whatever stopped the scenario is a failure too

    def summary(self) -> str:
        at = f" at {self.where}" if self.where else ""
        return f"stopped by {self.type}: {_LOCALS.sub('', self.message)}{at}"

    @classmethod
    def of(cls, exc: BaseException) -> Interrupted:
        frames = traceback.extract_tb(exc.__traceback__)
        where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
        return cls(type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "", where)


@dataclass(frozen=True)
class SlotTimeline:
    """Who owned each state slot at each step a trace replay ran (the data of ``viz.slot_timeline``, in
    plain values: the zoo sits below the figures).

    ``owners[i][j]``: the request id owning ``slots[j]`` after ``steps[i]`` (None: free); ``dummy``: the
    profile's dummy slot; ``foreign``: ``(step, slot)`` written by a row that does not own it;
    ``checkpoints``: ``(step, slot, request, tokens, ok)`` held by a prefix cache after the step (``ok``:
    verified against the float64 state of that prefix); ``copies``: ``(step, src, dst, before)`` slot copies
    (before or after the step's forward).
    """

    steps: tuple[int, ...]
    slots: tuple[int, ...]
    owners: tuple[tuple[int | None, ...], ...]
    dummy: int
    foreign: tuple[tuple[int, int], ...] = ()
    checkpoints: tuple[tuple[int, int, int, int, bool], ...] = ()
    copies: tuple[tuple[int, int, int, bool], ...] = ()


@dataclass(frozen=True)
class TraceEvidence:
    """A serving trace replayed step by step against the float64 shadow of every request
    (:mod:`workbench.traces`): steps run of ``total``, the first divergence, and the case's reading of it.

    ``matches``: the case found its own mechanism in the divergence (a new tenant at its first chunk on a
    reused slot, a padded row naming the slot that changed, ...); a divergence it does not match is a
    failure, but not this bug. ``facts``: what the case read off it (the slot's previous tenant, the chunk).
    ``timeline``: the slot owners of the steps that ran, for a figure (None: not recorded; left out of
    :meth:`to_dict`).
    """

    what: str
    steps: int
    total: int
    divergence: TraceDivergence | None = None
    matches: bool = False
    facts: str = ""
    timeline: SlotTimeline | None = field(default=None, compare=False, repr=False)

    @property
    def broken(self) -> bool:
        return self.divergence is not None or self.steps == 0

    @property
    def shows_mechanism(self) -> bool:
        return self.divergence is not None and self.matches

    def summary(self) -> str:
        if self.steps == 0:
            return f"{self.what}: no step ran"
        if self.divergence is None:
            return f"{self.what}: {self.steps} steps, every request on its float64 recurrence"
        return f"{self.what}: {self.divergence}" + (f"; {self.facts}" if self.facts else "")

    def to_dict(self) -> dict[str, Any]:
        d = self.divergence
        return {
            "what": self.what,
            "steps": self.steps,
            "total": self.total,
            "divergence": d.to_dict() if d is not None else None,
            "matches": self.matches,
            "facts": self.facts,
        }


Evidence = (
    RaisedError
    | RecorderError
    | IntegrityEvidence
    | RowsDiffer
    | AddressMismatch
    | Propagation
    | Survived
    | Interrupted
    | TraceEvidence
)


def _evidence_dict(e: Evidence) -> dict[str, Any]:
    if isinstance(e, IntegrityEvidence | TraceEvidence):
        d = e.to_dict()
    else:  # plain values; a figure's metadata clones stay out
        d = {f.name: getattr(e, f.name) for f in fields(e) if f.name != "metadata"}
    return {"kind": type(e).__name__, "broken": e.broken, "summary": e.summary(), **d}


STATUSES = ("reproduced", "clean", "not applicable", "other failure")
"""What a run says of its subject: this case's bug shows; clean; the scenario cannot apply; it failed, but
not (or not visibly) by this case's bug."""
_STATUS_KIND = {"reproduced": "fail", "clean": "ok", "not applicable": "pad", "other failure": "warn"}


@dataclass(frozen=True)
class ZooResult:
    """One run of one case: its own unfixed or fixed variant, or its scenario against a user's subject.

    Attributes:
        case: the case's name; issue: its public reference.
        fixed: which of the case's own variants ran (None: a user's subject ran).
        evidence: what the run produced (typed, see this module); ``broken`` is computed from it.
        explanation: the mechanism, what the engine did, and the fix, in one paragraph.
        subject: the user's backend class or kernel that ran (``MODULE_OR_FILE:NAME``); None for a variant.
        subject_kind: "metadata_backend" or "kernel" (None for a variant); profile: the conventions it ran under.
        mechanism: names of the evidence types that show this case's bug (empty: every type does).
        not_applicable: why the scenario could not apply to the subject (then ``evidence`` is empty).
    """

    case: str
    issue: str
    fixed: bool | None
    evidence: tuple[Evidence, ...]
    explanation: str
    subject: str | None = None
    subject_kind: str | None = None
    profile: str | None = None
    mechanism: tuple[str, ...] = ()
    not_applicable: str | None = None

    @property
    def broken(self) -> bool:
        """True when any evidence shows a failure (an exception, an integrity problem, differing rows)."""
        return any(e.broken for e in self.evidence)

    def shows_bug(self, e: Evidence) -> bool:
        """Whether ``e`` is broken evidence of this case's own mechanism."""
        if isinstance(e, TraceEvidence) and not e.shows_mechanism:
            return False
        return e.broken and (not self.mechanism or type(e).__name__ in self.mechanism)

    @property
    def reproduced(self) -> bool:
        """True when evidence of this case's own mechanism broke (not merely some failure)."""
        return any(self.shows_bug(e) for e in self.evidence)

    @property
    def status(self) -> str:
        """One of ``STATUSES``: "clean" only for a run that reached its end with every piece of evidence clean."""
        if self.not_applicable is not None:
            return "not applicable"
        if self.reproduced:
            return "reproduced"
        return "other failure" if self.broken else "clean"

    @property
    def summary(self) -> str:
        """One line: the broken evidence (this case's mechanism first), "clean", or why it does not apply."""
        if self.not_applicable is not None:
            return f"not applicable: {self.not_applicable}"
        bad = sorted((e for e in self.evidence if e.broken), key=lambda e: not self.shows_bug(e))
        return "; ".join(e.summary() for e in bad) if bad else "clean"

    @property
    def variant(self) -> str:
        if self.subject is not None:
            return self.subject
        return "fixed" if self.fixed else "unfixed"

    def to_dict(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "issue": self.issue,
            "fixed": self.fixed,
            "subject": self.subject,
            "subject_kind": self.subject_kind,
            "profile": self.profile,
            "status": self.status,
            "broken": self.broken,
            "summary": self.summary,
            "not_applicable": self.not_applicable,
            "evidence": [_evidence_dict(e) for e in self.evidence],
            "explanation": self.explanation,
        }

    def __repr__(self) -> str:
        if self.subject is None:
            state = "BROKEN" if self.broken else "clean"
            return f"<ZooResult {self.case} ({self.variant}, {self.issue}): {state}: {self.summary}>"
        return f"<ZooResult {self.case} ({self.issue}) against {self.subject}: {self.status.upper()}: {self.summary}>"

    def _repr_html_(self) -> str:
        rows = [
            [type(e).__name__, html.Cell(*(("broken", "fail") if e.broken else ("clean", "ok"))), e.summary()]
            for e in self.evidence
        ]
        table = html.table(["evidence", "state", "what"], rows, left=("evidence", "what")) if rows else ""
        facts = {"issue": self.issue, "variant": self.variant}
        if self.profile is not None:
            facts["profile"] = self.profile
        head = html.facts(facts)
        why = (
            "<details><summary>mechanism and fix</summary>"
            f"<p style='max-width:60em'>{html.escape(self.explanation)}</p></details>"
        )
        if self.subject is None:
            state = html.badge(not self.broken, "broken" if self.broken else "clean")
        elif self.not_applicable is not None:  # neither a pass nor a failure: no colour
            state = f"<b class='wb-na'>{html.escape(self.status)}</b>"
        else:
            state = html.badge(self.status == "clean", self.status)
        note = html.note(self.summary) if self.not_applicable is not None else ""
        return html.block(state, head, note, table, why, title=f"zoo: {self.case}")


def status_kind(status: str) -> str:
    """The ``workbench.html`` row kind of a status: reproduced red, clean green, not applicable grey,
    other failure amber."""
    return _STATUS_KIND[status]
