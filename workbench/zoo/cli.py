"""``workbench zoo``: run cases unfixed and fixed side by side, one line each (or JSON); with
``--metadata-backend`` / ``--kernel``, run them against the user's class or function instead."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from workbench.errors import WorkbenchError
from workbench.zoo import cases, names, run_all
from workbench.zoo.check import ZooChecks, check_backend, check_kernel, fit
from workbench.zoo.export import export_folder, write_pytest


def _error(message: str) -> int:
    print(f"workbench zoo: error: {message}", file=sys.stderr)
    return 2


def run_against(
    selected: Sequence[str],
    *,
    metadata_backend: str | None,
    kernel: str | None,
    as_json: bool = False,
    backend: str = "auto",
    profile: str | None = None,
    export: str | None = None,
) -> int:
    """Run the cases (default: those of each subject) against the user's backend class and/or kernel: one
    line per case and a verdict per subject; 0 when every applicable case is clean, 1 when any reproduced
    or failed another way, 2 for bad input (one line). ``export``: a folder to write ``test_<case>.py`` of
    every case that is not clean into (made, parents too, when missing; checked before any case runs)."""
    if export is not None:
        try:
            export_folder(export, what="--export")  # a file or an unwritable place: before minutes of cases
        except WorkbenchError as e:
            return _error(str(e))
    chosen = list(selected) or None
    checks: list[ZooChecks] = []
    try:
        if metadata_backend is not None:
            checks.append(check_backend(metadata_backend, chosen, profile=profile, backend=backend))
        if kernel is not None:
            checks.append(check_kernel(kernel, chosen, profile=profile, backend=backend))
    except WorkbenchError as e:  # an unloadable spec, not a backend class, a bad profile or backend
        return _error(str(e))
    ok = all(c.ok for c in checks)
    exported = []
    if export is not None:
        try:
            folder = export_folder(export, make=True, what="--export")
            failing = [r for c in checks for r in c if r.status in ("reproduced", "other failure")]
            exported = [write_pytest(r, folder) for r in failing]
        except WorkbenchError as e:  # the folder went away or turned read-only while the cases ran
            return _error(str(e))
    if as_json:
        data = {"ok": ok, "checks": [c.to_dict() for c in checks], "exported": [str(p) for p in exported]}
        print(json.dumps(data))
    else:
        for c in checks:
            print("\n".join(c.lines()))
        for path in exported:
            print(f"exported {path}")
    return 0 if ok else 1


def run_cli(
    selected: Sequence[str] = (),
    *,
    list_only: bool = False,
    as_json: bool = False,
    backend: str = "auto",
    metadata_backend: str | None = None,
    kernel: str | None = None,
    profile: str | None = None,
    export: str | None = None,
) -> int:
    """Print the cases (``list_only``) or run them; 0 only when every unfixed run broke and every fixed run
    is clean, 1 otherwise, 2 for an unknown case name. With ``metadata_backend`` or ``kernel``: see
    :func:`run_against`."""
    unknown = [n for n in selected if n not in names()]
    if unknown:
        return _error(f"unknown case {', '.join(map(repr, unknown))}; choose from {', '.join(names())}")
    subject = metadata_backend is not None or kernel is not None
    if not subject and (profile is not None or export is not None):
        flag = "--profile" if profile is not None else "--export"
        return _error(f"{flag} needs --metadata-backend MODULE_OR_FILE:CLASS or --kernel MODULE_OR_FILE:FUNCTION")
    if subject and not list_only:
        return run_against(
            selected,
            metadata_backend=metadata_backend,
            kernel=kernel,
            as_json=as_json,
            backend=backend,
            profile=profile,
            export=export,
        )
    chosen = [c for c in cases() if not selected or c.name in selected]
    if list_only:
        if as_json:
            keys = ("name", "title", "issue", "profile")
            print(json.dumps([{k: getattr(c, k) for k in keys} for c in chosen], indent=2))
        else:
            width = max(len(c.name) for c in chosen)
            for c in chosen:
                print(f"{c.name:<{width}}  {c.issue:<34}  {c.title}")
        return 0
    pairs = run_all([c.name for c in chosen], backend=backend)
    ok = all(b.broken and not f.broken for b, f in pairs)
    if as_json:
        print(json.dumps({"ok": ok, "cases": [{"broken": b.to_dict(), "fixed": f.to_dict()} for b, f in pairs]}))
    else:
        width = max(len(b.case) for b, _ in pairs)
        for b, f in pairs:
            unfixed = ("broken: " if b.broken else "NOT BROKEN: ") + fit(b.summary, 170)
            fixed = "fixed: " + ("clean" if not f.broken else "STILL BROKEN: " + fit(f.summary, 80))
            print(f"{b.case:<{width}}  {b.issue:<34}  {unfixed}  |  {fixed}")
        print(
            f"{sum(b.broken for b, _ in pairs)}/{len(pairs)} unfixed runs broke, "
            f"{sum(not f.broken for _, f in pairs)}/{len(pairs)} fixed runs clean"
        )
    return 0 if ok else 1
