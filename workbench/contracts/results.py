"""What a contract check found: one :class:`Finding` per broken call, one :class:`Contract` per base class,
and the :class:`Report` that holds them (text, JSON, GitHub annotations, and a notebook table)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from functools import lru_cache
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
SWALLOWED = "swallowed-keyword"
KINDS = (
    MISSING,
    RENAMED,
    REORDERED,
    KIND_CHANGED,
    CHANGED_DEFAULT,
    DROPPED_VARARGS,
    DROPPED_VARKW,
    NEW_REQUIRED,
    SWALLOWED,
)
"""Every finding kind, for filtering and for documentation."""
BREAK = "break"
"""A call that code in the trees makes and that raises, misbinds, or silently changes meaning on the class."""
DRIFT = "drift"
"""A signature that differs from the method it overrides, where no call in the trees shows it."""
TIERS = (BREAK, DRIFT)


def display_path(file: str) -> str:
    """Relative to the working directory when under it, else as given."""
    return _display_path(file, os.getcwd()) if file else file


@lru_cache(maxsize=8192)
def _display_path(file: str, cwd: str) -> str:
    try:
        return str(Path(file).resolve().relative_to(Path(cwd).resolve()))
    except ValueError:
        return file


def _where(file: str, line: int | None) -> str:
    return display_path(file) + (f":{line}" if line else "")


@dataclass(frozen=True)
class Finding:
    """One way a call breaks, or silently changes meaning, on the classes that share one override.

    ``tier``: ``"break"`` (a call in the trees, at ``site_file:site_line`` in ``caller``) or ``"drift"`` (a
    signature difference no call shows; ``call`` is the call the overridden signature promises).
    ``file``/``line``: the override's ``def``; ``cls``: the class that defines it; ``subclasses``: the
    classes checked that get it (``cls`` first when it was checked itself). ``message``: the ``TypeError``
    Python would raise, or what silently changes. ``params``: every argument of the call that the override
    cannot take (Python names only the first).
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
    caller: str = ""  # the method that makes the call
    params: tuple[str, ...] = ()
    tier: str = BREAK
    subclasses: tuple[str, ...] = ()

    @property
    def breaks(self) -> bool:
        """True when the call raises; False when it runs with a changed meaning."""
        return self.message.startswith("TypeError")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["params"] = list(self.params)
        data["subclasses"] = list(self.subclasses)
        return data

    @property
    def heirs(self) -> list[str]:
        """The other classes that get this override."""
        return [name for name in self.subclasses if name != self.cls]

    def __str__(self) -> str:
        override = f"{_where(self.file, self.line)} {self.cls}.{self.method} [{self.kind}]"
        if self.site_file:
            lines = [f"{_where(self.site_file, self.site_line)} in {self.caller}"]
            lines.append(f"    call:      {self.call}")
            lines.append(f"    override:  {override}")
        else:
            lines = [f"{override} ({self.tier} from {self.base})" if self.base else f"{override} ({self.tier})"]
            if self.call:
                lines.append(f"    call:      {self.call}")
        if self.heirs:
            lines.append(f"    inherited: {', '.join(self.heirs)}")
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
    classes: int = 0

    @property
    def breaks(self) -> list[Finding]:
        """The calls in the trees that break on a class they reach."""
        return [f for f in self.findings if f.tier == BREAK]

    @property
    def drift(self) -> list[Finding]:
        """Signature differences no call in the trees shows."""
        return [f for f in self.findings if f.tier == DRIFT]

    @property
    def ok(self) -> bool:
        """True when no call in the trees breaks on a class it reaches (drift does not count)."""
        return not self.breaks

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
            "breaks": len(self.breaks),
            "drift": len(self.drift),
            "base": self.base,
            "contracts": [asdict(c) for c in self.contracts],
            "findings": [f.to_dict() for f in self.findings],
            "files": len(self.files),
            "notes": list(self.notes),
            "seconds": round(self.seconds, 4),
        }

    def summary(self) -> str:
        """The last line of the text report: breaks, and the drift count."""
        breaks, drift = len(self.breaks), len(self.drift)
        head = "OK: no breaks" if self.ok else f"{breaks} break{'s' if breaks != 1 else ''}"
        return head + f"; {drift} drift (signature differences no call in the trees shows; --drift lists them)"

    def text(self, drift: bool = False) -> str:
        """Breaks grouped under the class that defines the override, call site first; drift when asked."""
        lines = [
            f"checked {self.classes} classes in {len(self.files)} files against {len(self.contracts)} bases "
            f"({self.seconds:.1f} s)"
        ]
        if len(self.contracts) == 1 and 0 < len(self.contracts[0].subclasses) <= _LISTED:
            lines.append(f"subclasses of {self.contracts[0].base}: {', '.join(self.contracts[0].subclasses)}")
        lines += [f"note: {note}" for note in self.notes]
        for title, findings in (("break", self.breaks), ("drift", self.drift if drift else [])):
            groups: dict[tuple[str, str], list[Finding]] = {}
            for f in findings:
                groups.setdefault((f.cls, f.file), []).append(f)
            for (cls, file), group in groups.items():
                lines.append(f"{title} in {cls} ({display_path(file)}):")
                lines += ["  " + str(f).replace("\n", "\n  ") for f in group]
        lines.append(self.summary())
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return (
            f"<Report {self.base}: {len(self.checked)} subclass(es) in {len(self.files)} file(s), "
            f"{len(self.breaks)} break(s), {len(self.drift)} drift>"
        )

    def _repr_html_(self) -> str:
        head = html.facts({"base": self.base, "subclasses": len(self.checked), "files": len(self.files)})
        parts = [html.badge(self.ok, self.summary()), head, *(html.note(n) for n in self.notes)]
        if self.breaks:
            parts.append(_table(self.breaks))
        if self.drift:
            parts.append(html.note(f"{len(self.drift)} drift (signature differences no call in the trees shows):"))
            parts.append(_table(self.drift))
        return html.block(*parts, title="Contract check")


_LISTED = 20
"""The most subclasses the text report names (with one base)."""
_COLUMNS = ("tier", "class.method", "kind", "override", "call site", "call", "result", "inherited by")


def _table(findings: list[Finding]) -> str:
    """One row per finding: breaks that raise as failures, silent changes and drift as warnings."""
    rows = [
        [
            f.tier,
            f"{f.cls}.{f.method}",
            f.kind,
            _where(f.file, f.line),
            f"{_where(f.site_file, f.site_line)} in {f.caller}" if f.site_file else "(overridden signature)",
            f.call,
            f.message,
            ", ".join(f.heirs),
        ]
        for f in findings
    ]
    kinds = ["fail" if f.tier == BREAK and f.breaks else "warn" for f in findings]
    return html.table(_COLUMNS, rows, row_kinds=kinds, left=_COLUMNS)
