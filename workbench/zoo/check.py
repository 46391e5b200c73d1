"""The zoo against the user's code: every case whose scenario exercises a metadata backend (or a kernel) run
against the user's class (or function), each result saying reproduced, clean, not applicable (and why) or
other failure.

>>> from workbench.backends import MetadataBackend
>>> checks = check_backend(MetadataBackend, ["fill_count"])
>>> checks[0].status, checks.ok
('clean', True)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from workbench import html
from workbench.backends import MetadataBackend
from workbench.loading import load_object, split_spec
from workbench.zoo.case import ZooCase, label_of
from workbench.zoo.result import ZooError, ZooResult, status_kind


def fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, ending in ... when cut."""
    return text if len(text) <= width else text[: width - 3] + "..."


class ZooChecks(list[ZooResult]):
    """The results of the zoo's cases against one subject (a list of :class:`ZooResult`), with a verdict.

    ``ok`` is True only when no case reproduced and none failed another way (every applicable case
    clean); ``exit_code`` is 0 then, else 1.
    """

    def __init__(self, results: Iterable[ZooResult], *, subject: str, kind: str) -> None:
        super().__init__(results)
        self.subject, self.kind = subject, kind

    def with_status(self, status: str) -> list[ZooResult]:
        return [r for r in self if r.status == status]

    @property
    def ok(self) -> bool:
        return all(r.status in ("clean", "not applicable") for r in self)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def line(self, r: ZooResult, width: int = 14, summary_width: int = 170) -> str:
        """One line: the case, its PR, the status and the evidence."""
        shown = {"reproduced": "REPRODUCED", "other failure": "OTHER FAILURE (not this case's bug)"}
        text = r.not_applicable if r.not_applicable is not None else r.summary
        evidence = "" if r.status == "clean" else f": {fit(text, summary_width)}"
        return f"{r.case:<{width}}  {r.issue:<34}  {shown.get(r.status, r.status)}{evidence}"

    def verdict(self) -> str:
        """The last line: counts per status, the reproduced cases named with their PR."""
        found = self.with_status("reproduced")
        applied = [r for r in self if r.status != "not applicable"]
        head = f"{self.kind.replace('_', ' ')} {self.subject}"
        if not applied:
            return f"{head}: no case applies, nothing was checked"
        parts = [
            f"{len(found)} reproduced" + (f" ({', '.join(f'{r.case}: {r.issue}' for r in found)})" if found else "")
        ]
        parts += [
            f"{len(self.with_status('other failure'))} other failure(s)",
            f"{len(self.with_status('clean'))} clean",
        ]
        parts += [f"{len(self.with_status('not applicable'))} not applicable"]
        tail = (
            " (other failures may follow from the bug reproduced)"
            if found and self.with_status("other failure")
            else ""
        )
        return f"{head}: " + ", ".join(parts) + tail

    def lines(self) -> list[str]:
        width = max((len(r.case) for r in self), default=4)
        return [self.line(r, width) for r in self] + [self.verdict()]

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "subject": self.subject, "kind": self.kind, "cases": [r.to_dict() for r in self]}

    def __repr__(self) -> str:
        return "\n".join(self.lines())

    def _repr_html_(self) -> str:
        rows = [[r.case, r.issue, r.profile or "", html.Cell(r.status, status_kind(r.status)), r.summary] for r in self]
        kinds = ["pad" if r.status == "not applicable" else "live" for r in self]
        table = html.table(
            ["case", "issue", "profile", "status", "evidence"],
            rows,
            row_kinds=kinds,
            left=("case", "issue", "evidence"),
        )
        verdict = html.note(self.verdict(), fail=not self.ok)
        return html.block(html.badge(self.ok, "clean" if self.ok else "FAILS"), verdict, table, title="zoo: your code")


def normalized_spec(spec: str) -> str:
    """``spec`` with a file path made absolute (a result, and a test exported from it, load it from anywhere)."""
    where, name = split_spec(spec)
    if where.endswith(".py") or "/" in where or "\\" in where:
        return f"{Path(where).resolve()}:{name}"
    return spec


def _chosen(names: Sequence[str] | None, subject: str) -> list[ZooCase]:
    from workbench.zoo.registry import cases, get

    if names is None:
        return [c for c in cases() if c.subject == subject]
    if isinstance(names, str):
        raise ZooError(f"names: expected a list of case names, got the string {names!r}")
    return [get(n) for n in names]


def _load(obj: Any) -> tuple[Any, str | None]:
    if isinstance(obj, str):
        return load_object(obj), normalized_spec(obj)
    return obj, None


def check_backend(
    cls: type[MetadataBackend] | str,
    names: Sequence[str] | None = None,
    *,
    profile: str | None = None,
    backend: str = "auto",
) -> ZooChecks:
    """Run every case that exercises a metadata backend (or the cases ``names``) against ``cls``: a
    ``MetadataBackend`` subclass, or its ``MODULE_OR_FILE:CLASS`` spec.

    ``profile``: the conventions to run under (default: the class's family, "sglang-ascend" for the NPU
    family, else "sglang"). A named case that cannot apply comes back "not applicable" with the reason.
    """
    obj, spec = _load(cls)
    if not (isinstance(obj, type) and issubclass(obj, MetadataBackend)):
        what = obj.__qualname__ if isinstance(obj, type) else repr(obj)
        raise ZooError(f"metadata_backend: {what} is not a subclass of workbench.backends.MetadataBackend")
    label = spec or label_of(obj)
    chosen = _chosen(names, "metadata_backend")
    results = [c.run_with(obj, profile=profile, backend=backend, label=label) for c in chosen]
    return ZooChecks(results, subject=label, kind="metadata_backend")


def check_kernel(
    fn: Callable[..., Any] | str,
    names: Sequence[str] | None = None,
    *,
    profile: str | None = None,
    backend: str = "auto",
) -> ZooChecks:
    """Run every case that exercises a kernel (or the cases ``names``) against ``fn``: a function with the
    signature of the case's ``kernel_op`` (today ``uninit_pad``: ``causal_conv1d.update``), or its
    ``MODULE_OR_FILE:FUNCTION`` spec. ``profile``: default, each case's own.

    sentinel_guard's guard is not among them: it lives in the workbench's own kernels under a profile, and a
    kernel's guard is what ``workbench check-kernel`` checks (named, it comes back "not applicable" saying so).
    """
    obj, spec = _load(fn)
    if isinstance(obj, type) or not callable(obj):
        raise ZooError(f"kernel: expected a function, got {obj!r}")
    label = spec or label_of(obj)
    chosen = _chosen(names, "kernel")
    results = [c.run_with(obj, profile=profile, backend=backend, label=label) for c in chosen]
    return ZooChecks(results, subject=label, kind="kernel")
