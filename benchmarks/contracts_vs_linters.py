"""check-contracts beside pylint and mypy on the engine-shaped fixture tree: per class, found / false alarm / missed.

    .venv/bin/python benchmarks/contracts_vs_linters.py [--json out.json]

pylint runs only W0221 (arguments-differ), W0222 (signature-differs) and W0237 (arguments-renamed); mypy reports
only ``[override]`` and its multiple-inheritance check ("Definition of ... in base class ... is incompatible");
check-contracts runs with no options (discovery). pylint and mypy are optional (``pip install pylint mypy``); a tool
that is not installed is shown as such. Each tool runs once as a subprocess on the same tree; the time is its
wall time, start-up included (check-contracts also shows its in-process time).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "contracts"
TREE = "eng"

# (class, method) -> (the truth, the class whose def the call runs). "break": a call the base makes raises;
# "silent": a call the base makes runs with another default; "clean": every call the base makes works.
TRUTH = {
    ("AscendMambaBackend", "_replay_metadata"): ("break", "AscendMambaBackend"),
    ("AscendOneKeywordBackend", "_replay_metadata"): ("break", "AscendOneKeywordBackend"),
    ("AscendForwardingBackend", "_replay_metadata"): ("clean", "AscendForwardingBackend"),
    ("AscendMTPBackend", "_replay_metadata"): ("break", "AscendOneKeywordBackend"),
    ("AscendMixedBackend", "_replay_metadata"): ("break", "AscendMixedBackend"),
    ("AscendTracedBackend", "_replay_metadata"): ("break", "AscendTracedBackend"),
    ("AscendStaticHookBackend", "_pad_value"): ("break", "AscendStaticHookBackend"),
    ("AscendStaticFineBackend", "_pad_value"): ("clean", "AscendStaticFineBackend"),
    ("AscendDefaultsBackend", "_prepare"): ("silent", "AscendDefaultsBackend"),
    ("AscendDefaultsBackend", "_replay_metadata"): ("clean", "AscendDefaultsBackend"),
    ("AscendOwnReplayBackend", "_replay_metadata"): ("clean", "AscendOwnReplayBackend"),
}
Reports = dict[tuple[str, str], list[str]]


def _run(argv: list[str], env: dict[str, str] | None = None) -> tuple[str, float]:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=FIXTURES, capture_output=True, text=True, env=env, check=False)
    return done.stdout + done.stderr, time.perf_counter() - start


def _tool(name: str) -> str | None:
    """The tool's executable next to this interpreter, else on PATH."""
    local = Path(sys.executable).with_name(name)
    return str(local) if local.exists() else shutil.which(name)


def run_check_contracts() -> tuple[Reports, float, float]:
    code = (
        "import json, sys, time; from workbench.contracts import check; t = time.perf_counter(); "
        f"r = check({TREE!r}); print(json.dumps([r.seconds, [[f.cls, f.method, str(f)] for f in r.findings]]))"
    )
    out, seconds = _run([sys.executable, "-c", code])
    inner, findings = json.loads(out.strip().splitlines()[-1])
    by_class: Reports = {}
    for cls, method, text in findings:
        by_class.setdefault((cls, method), []).append(text)
    return by_class, seconds, inner


def run_pylint() -> tuple[Reports, float] | None:
    exe = _tool("pylint")
    if exe is None:
        return None
    template = "{path}:{line}:{obj}:{msg_id}: {msg}"
    argv = [exe, "--disable=all", "--enable=W0221,W0222,W0237", f"--msg-template={template}", "-sn", TREE]
    env = {**os.environ, "PYTHONPATH": str(FIXTURES)}
    out, seconds = _run(argv, env)
    by_class: Reports = {}
    for line in out.splitlines():
        parts = line.split(":", 4)
        if len(parts) == 5 and parts[3].startswith("W0"):
            cls, _, method = parts[2].partition(".")
            by_class.setdefault((cls, method), []).append(f"{parts[3]} line {parts[1]}:{parts[4]}")
    return by_class, seconds


_MYPY_CLASS = re.compile(r'(?:supertype|base class) "(\w+)"')


def run_mypy() -> tuple[Reports, float] | None:
    exe = _tool("mypy")
    if exe is None:
        return None
    with tempfile.TemporaryDirectory() as cache:
        argv = [exe, "--ignore-missing-imports", "--check-untyped-defs", "--show-error-codes", "--no-error-summary"]
        out, seconds = _run([*argv, f"--cache-dir={cache}", TREE])
    classes = {}  # line of a class statement -> class name, per file, to name the class of each error
    for path in (FIXTURES / TREE).rglob("*.py"):
        for number, text in enumerate(path.read_text().splitlines(), 1):
            if m := re.match(r"class (\w+)", text):
                classes.setdefault(str(path.relative_to(FIXTURES)), []).append((number, m.group(1)))
    by_class: Reports = {}
    for line in out.splitlines():
        m = re.match(r"(.+?):(\d+): error: (.*)", line)
        if not m or not ("[override]" in line or "is incompatible with definition in base class" in line):
            continue
        path, number, message = m.group(1), int(m.group(2)), m.group(3)
        owner = [name for start, name in classes.get(path, []) if start <= number]
        method = re.search(r'"(\w+)"', message)
        if owner and method:
            by_class.setdefault((owner[-1], method.group(1)), []).append(f"line {number}: {message}")
    return by_class, seconds


def verdict(key: tuple[str, str], reports: Reports) -> str:
    """A tool finds an inherited break when it flags the class that defines the override."""
    truth, owner = TRUTH[key]
    flagged = bool(reports.get(key) or reports.get((owner, key[1])))
    if truth == "clean":
        return "false alarm" if flagged else "-"
    return "found" if flagged else "missed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    tools: dict[str, tuple[Reports, float] | None] = {}
    contracts, seconds, inner = run_check_contracts()
    tools["check-contracts"] = (contracts, seconds)
    tools["pylint W0221/2/37"] = run_pylint()
    tools["mypy [override]"] = run_mypy()
    width = max(len(".".join(key)) for key in TRUTH) + 2
    names = list(tools)
    print(f"{'class.method':<{width}}{'truth':<8}" + "".join(f"{n:<20}" for n in names))
    rows = []
    for key, (truth, _) in TRUTH.items():
        cells = [verdict(key, t[0]) if t else "not installed" for t in tools.values()]
        rows.append({"class": ".".join(key), "truth": truth, **dict(zip(names, cells, strict=True))})
        print(f"{'.'.join(key):<{width}}{truth:<8}" + "".join(f"{c:<20}" for c in cells))
    owners = {(owner, key[1]) for key, (_, owner) in TRUTH.items()}
    for name, result in tools.items():
        for key in sorted(set(result[0]) - set(TRUTH) - owners) if result else []:
            print(f"{name}: also flags {'.'.join(key)} (not in the table)")
    totals = []
    for name, result in tools.items():
        cells = [row[name] for row in rows]
        score = f"{cells.count('found')}/{cells.count('missed')}/{cells.count('false alarm')}"
        totals.append(score if result else "not installed")
    print(f"{'found/missed/false':<{width + 8}}" + "".join(f"{t:<20}" for t in totals))
    print(
        "wall time (s)".ljust(width + 8)
        + "".join(f"{(t[1] if t else float('nan')):<20.2f}" for t in tools.values())
        + f"(check-contracts in process: {inner:.3f} s)"
    )
    print("\nWhat each says about AscendMambaBackend (the hook without in_capture):")
    for name, result in tools.items():
        key = ("AscendMambaBackend", "_replay_metadata")
        for text in result[0].get(key, ["(nothing)"]) if result else ["not installed"]:
            print(f"--- {name}\n{text}")
    if args.json:
        data = {"rows": rows, "seconds": {n: (t[1] if t else None) for n, t in tools.items()}, "in_process": inner}
        data["messages"] = {n: (t[0] if t else None) for n, t in tools.items()}
        Path(args.json).write_text(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
