"""What a contract check found: one :class:`Finding` per broken call, one :class:`Contract` per base class,
and the :class:`Report` that holds them (text, JSON, GitHub annotations, and a notebook table)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workbench import html

MISSING = "missing-parameter"
RENAMED = "renamed-parameter"
REORDERED = "reordered-parameter"
KIND_CHANGED = "parameter-kind-changed"
CHANGED_DEFAULT = "changed-default"
DROPPED_VARARGS = "dropped-varargs"
DROPPED_VARKW = "dropped-varkw"
NEW_REQUIRED = "new-required-parameter"
KINDS = (
    MISSING,
    RENAMED,
    REORDERED,
    KIND_CHANGED,
    CHANGED_DEFAULT,
    DROPPED_VARARGS,
    DROPPED_VARKW,
    NEW_REQUIRED,
)
"""Every finding kind, for filtering and for documentation."""


def display_path(file: str) -> str:
    """Relative to the working directory when under it, else as given."""
    if not file:
        return file
    try:
        return str(Path(file).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return file


def _where(file: str, line: int | None) -> str:
    return display_path(file) + (f":{line}" if line else "")


@dataclass(frozen=True)
class Finding:
    """One way a call the base makes (or promises) breaks, or silently changes meaning, on one subclass.

    ``file``/``line``: the override's ``def``. ``site_file``/``site_line``: where the base makes the call
    (empty for a public method's signature, whose callers are outside the base). ``message``: the
    ``TypeError`` Python would raise, or what silently changes. ``params``: every argument of the call that
    the override cannot take (Python names only the first).
    """

    file: str
    line: int | None
    cls: str
    method: str
    kind: str
    message: str
    call: str = ""
    param: str | None = None
    owner: str | None = None  # the class that defines the override, when ``cls`` inherits it
    base: str = ""
    site_file: str = ""
    site_line: int | None = None
    caller: str = ""  # the base method that makes the call
    params: tuple[str, ...] = ()

    @property
    def breaks(self) -> bool:
        """True when the call raises; False when it runs with a changed meaning."""
        return self.message.startswith("TypeError")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["params"] = list(self.params)
        return data

    def __str__(self) -> str:
        head = f"{_where(self.file, self.line)}: {self.cls}.{self.method} [{self.kind}]"
        if self.owner and self.owner != self.cls:
            head += f" (inherited from {self.owner})"
        lines = [head]
        if self.site_file:
            lines.append(f"    base call: {_where(self.site_file, self.site_line)} in {self.caller}")
        if self.call:
            lines.append(f"    call:      {self.call}")
        lines.append(f"    result:    {self.message}")
        if len(self.params) > 1:
            lines.append(f"    not taken: {', '.join(self.params)}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Finding {self.cls}.{self.method} [{self.kind}] at {_where(self.file, self.line)}>"

    def _repr_html_(self) -> str:
        return _table([self])


@dataclass(frozen=True)
class Contract:
    """One base class and what it promises: public methods (by signature) and the calls it makes on itself."""

    base: str
    file: str
    line: int | None
    methods: tuple[str, ...]
    call_sites: int
    subclasses: tuple[str, ...] = ()


@dataclass
class Report:
    """The outcome of :func:`~workbench.contracts.check`: findings, what was checked, how long it took."""

    base: str
    contracts: list[Contract] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when no subclass breaks a call its base makes or promises."""
        return not self.findings

    @property
    def checked(self) -> list[str]:
        """Every subclass checked, once, in the order found."""
        return list(dict.fromkeys(name for c in self.contracts for name in c.subclasses))

    @property
    def methods(self) -> tuple[str, ...]:
        """The public methods of the contract(s), in order."""
        return tuple(dict.fromkeys(name for c in self.contracts for name in c.methods))

    @property
    def read_from_source(self) -> list[str]:
        """The target files read (every file is read from source; nothing is imported)."""
        return list(self.files)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "base": self.base,
            "contracts": [asdict(c) for c in self.contracts],
            "findings": [f.to_dict() for f in self.findings],
            "files": len(self.files),
            "notes": list(self.notes),
            "seconds": round(self.seconds, 4),
        }

    def summary(self) -> str:
        """The last line of the text report."""
        count = len(self.findings)
        return "OK: no findings" if self.ok else f"{count} finding{'s' if count > 1 else ''}"

    def __str__(self) -> str:
        lines = []
        for c in self.contracts:
            what = ", ".join(c.methods) or "(no public methods)"
            lines.append(f"contract of {c.base}: {what}; {c.call_sites} call(s) on itself")
            lines.append(f"  checked {len(c.subclasses)} subclass(es): {', '.join(c.subclasses)}")
        lines += [f"note: {note}" for note in self.notes]
        lines += [str(finding) for finding in self.findings]
        lines.append(self.summary())
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"<Report {self.base}: {len(self.checked)} subclass(es) in {len(self.files)} file(s), "
            f"{len(self.findings)} finding(s)>"
        )

    def _repr_html_(self) -> str:
        head = html.facts({"base": self.base, "subclasses": len(self.checked), "files": len(self.files)})
        parts = [html.badge(self.ok, self.summary()), head, *(html.note(n) for n in self.notes)]
        if self.findings:
            parts.append(_table(self.findings))
        return html.block(*parts, title="Contract check")


_COLUMNS = ("class.method", "kind", "override", "base call", "call", "result")


def _table(findings: list[Finding]) -> str:
    """One row per finding: calls that raise as failures, silent changes of meaning as warnings."""
    rows = [
        [
            f"{f.cls}.{f.method}" + (f" (from {f.owner})" if f.owner and f.owner != f.cls else ""),
            f.kind,
            _where(f.file, f.line),
            _where(f.site_file, f.site_line) if f.site_file else "(public signature)",
            f.call,
            f.message,
        ]
        for f in findings
    ]
    kinds = ["fail" if f.breaks else "warn" for f in findings]
    return html.table(_COLUMNS, rows, row_kinds=kinds, left=_COLUMNS)
