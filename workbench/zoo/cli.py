"""``workbench zoo``: run cases unfixed and fixed side by side, one line each (or JSON)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from workbench.zoo import cases, names, run_all


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def run_cli(
    selected: Sequence[str] = (), *, list_only: bool = False, as_json: bool = False, backend: str = "auto"
) -> int:
    """Print the cases (``list_only``) or run them; 0 only when every unfixed run broke and every fixed run
    is clean, 1 otherwise, 2 for an unknown case name."""
    unknown = [n for n in selected if n not in names()]
    if unknown:
        print(
            f"workbench zoo: error: unknown case {', '.join(map(repr, unknown))}; choose from {', '.join(names())}",
            file=sys.stderr,
        )
        return 2
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
            unfixed = ("broken: " if b.broken else "NOT BROKEN: ") + _fit(b.summary, 170)
            fixed = "fixed: " + ("clean" if not f.broken else "STILL BROKEN: " + _fit(f.summary, 80))
            print(f"{b.case:<{width}}  {b.issue:<34}  {unfixed}  |  {fixed}")
        print(
            f"{sum(b.broken for b, _ in pairs)}/{len(pairs)} unfixed runs broke, "
            f"{sum(not f.broken for _, f in pairs)}/{len(pairs)} fixed runs clean"
        )
    return 0 if ok else 1
