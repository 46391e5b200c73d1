"""``workbench check-contracts``: options, output formats (text, JSON, GitHub annotations), exit codes.

Exit codes: 0 no breaks, 1 breaks (or drift, with ``--strict``), 2 usage or lookup error (a target or base
not found, a target file that does not parse or is not read, no subclass of the base found, an inheritance
chain over ``MAX_ANCESTORS`` classes).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from workbench.contracts.check import DEFAULT_BASE, DEFAULT_TARGETS, ContractError, NothingToCheck, check
from workbench.contracts.results import Report, display_path

FORMATS = ("text", "json", "github")
DESCRIPTION = (
    "Report the calls code in the trees makes (self.NAME(...), super(), private hooks, and calls through "
    "annotated attributes and parameters) that an override cannot take: breaks. Signature differences no "
    "call shows are drift, counted and listed with --drift. Reads source; imports nothing. "
    "Exit 0: no breaks, 1: breaks (or drift with --strict), 2: usage or lookup error."
)


def _bench_files(text: str) -> int:
    """argparse type of --bench: a file count the synthetic tree can have (checked before anything is written)."""
    from workbench.contracts.synthetic import MAX_FILES, MIN_FILES

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None
    if not MIN_FILES <= value <= MAX_FILES:
        raise argparse.ArgumentTypeError(f"{value} is out of range: expected an int in [{MIN_FILES}, {MAX_FILES}]")
    return value


def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the check-contracts options to ``parser``."""
    parser.add_argument(
        "targets",
        nargs="*",
        metavar="module-or-path",
        help=f"files, folders or dotted module names (default: {' '.join(DEFAULT_TARGETS)} with --base {DEFAULT_BASE})",
    )
    parser.add_argument(
        "--base",
        default=None,
        metavar="pkg.mod:Class",
        help="the contract's class; without it every class the targets derive from and define is one",
    )
    parser.add_argument(
        "--search-path",
        action="append",
        default=[],
        metavar="DIR",
        help="a root for resolving imports in the targets (repeatable), e.g. the engine's python/ folder",
    )
    parser.add_argument(
        "--against",
        action="append",
        default=[],
        metavar="PACKAGE",
        help="an installed package whose classes are contracts too (repeatable): a plugin against its engine",
    )
    parser.add_argument(
        "--calls-from",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder (or file) read only for the calls it makes on the checked classes (repeatable)",
    )
    parser.add_argument("--drift", action="store_true", help="list the drift too, not only its count")
    parser.add_argument("--strict", action="store_true", help="exit 1 on drift as well as on breaks")
    parser.add_argument("--method", action="append", dest="methods", help="check only this method (repeatable)")
    parser.add_argument(
        "--allow-nothing",
        action="store_true",
        help="exit 0, not 2, when the targets hold no subclass to check (a hook run on changed files)",
    )
    parser.add_argument("--format", choices=FORMATS, default="text", help="output format (default: text)")
    parser.add_argument(
        "--bench",
        type=_bench_files,
        default=None,
        metavar="FILES",
        help="check a synthetic engine tree of FILES files instead and print files per second",
    )
    return parser


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``check-contracts`` on the ``workbench`` command's subparsers; the handler is :func:`run`."""
    parser = subparsers.add_parser(
        "check-contracts",
        help="check subclasses against the calls their base class makes and promises",
        description=DESCRIPTION,
    )
    configure(parser)
    parser.set_defaults(fn=run)
    return parser


def _escape(text: str, property_value: bool = False) -> str:
    """GitHub workflow-command escaping (``%``, newlines; ``:`` and ``,`` in property values)."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if property_value else text


def github_annotations(report: Report, drift: bool = False) -> str:
    """One ``::error`` line per break at the override, naming the call site; drift (with ``drift``) as
    warnings; notes as notices."""
    lines = [f"::notice::{_escape(note)}" for note in report.notes]
    for f in report.breaks + (report.drift if drift else []):
        where = f"file={_escape(display_path(f.file), True)}" + (f",line={f.line}" if f.line else "")
        title = _escape(f"check-contracts {f.tier} {f.kind}", True)
        level = "error" if f.tier == "break" else "warning"
        text = f"{f.cls}.{f.method}: {f.message}"
        if f.site_file:
            text += f" (call at {display_path(f.site_file)}:{f.site_line}: {f.call})"
        elif f.call:
            text += f" (call: {f.call})"
        if f.heirs:
            text += f"; inherited by {', '.join(f.heirs)}"
        lines.append(f"::{level} {where},title={title}::{_escape(text)}")
    lines.append(report.summary())
    return "\n".join(lines)


def _error(message: str, fmt: str) -> int:
    # a value from the command line may hold a line break or a control character: escaped, one line
    message = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode() for ch in message)
    if fmt == "json":
        print(json.dumps({"ok": False, "error": message}))
    elif fmt == "github":
        print(f"::error title=check-contracts::{_escape(message)}")
    print(f"workbench check-contracts: error: {message}", file=sys.stderr)  # as every subcommand says it
    return 2


def run(args: argparse.Namespace) -> int:
    """Run a parsed command line; prints the report and returns the exit code."""
    if args.bench is not None:
        from workbench.contracts.synthetic import bench

        result = bench(args.bench)
        print(json.dumps(result, indent=2) if args.format == "json" else result["text"])
        return 0
    targets = args.targets or list(DEFAULT_TARGETS)
    base = args.base if args.base or args.targets else DEFAULT_BASE
    try:
        report = check(
            targets, base, args.methods, search_path=args.search_path, against=args.against,
            calls_from=args.calls_from,
        )  # fmt: skip
    except NothingToCheck as exc:
        if not args.allow_nothing:
            return _error(str(exc), args.format)
        print(f"check-contracts: nothing to check: {exc}")
        return 0
    except ContractError as exc:
        return _error(str(exc), args.format)
    if args.format == "json":
        print(json.dumps(report.to_dict(), indent=2))
    elif args.format == "github":
        print(github_annotations(report, args.drift))
    else:
        print(report.text(drift=args.drift))
    return 1 if report.breaks or (args.strict and report.drift) else 0


def main(argv: list[str] | None = None) -> int:
    """``workbench check-contracts [module-or-path ...] [--base pkg.mod:Class] [--format ...]``."""
    parser = configure(argparse.ArgumentParser(prog="workbench check-contracts", description=DESCRIPTION))
    try:
        args = parser.parse_intermixed_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse already printed
        return exc.code if isinstance(exc.code, int) else 2
    return run(args)
