"""Optional packages, imported where they are needed; this module alone says how to install a missing one.

``require(module, extra, purpose)`` returns the module, or raises :class:`~workbench.errors.MissingExtra`
whose one line names the extra that installs it; the command line prints that line and exits 2, as for
any ``WorkbenchError``. ``extra=None`` marks a default dependency (plotly, ipywidgets...), missing only from
a broken or ``--no-deps`` install. Make targets call :func:`main` (``MODULE EXTRA PURPOSE``) first.

    >>> require("json", None, "a doctest").__name__
    'json'
    >>> print(missing_message("pandas", "lab", "Results.to_frame()"))
    pandas is needed for Results.to_frame(); install the 'lab' extra: pip install 'linattn-workbench[lab]'
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from workbench.errors import MissingExtra

DIST = "linattn-workbench"  # the distribution name in pyproject.toml


def install_command(extra: str | None = None) -> str:
    """The pip command that installs ``extra`` (None: the default dependencies)."""
    return f"pip install '{DIST}[{extra}]'" if extra else f"pip install '{DIST}'"


def missing_message(module: str, extra: str | None, purpose: str, why: str | None = None) -> str:
    """The one line :func:`require` raises: what needs ``module``, and the pip command that brings it."""
    head = f"{module.partition('.')[0]} is needed for {purpose}"
    if why:
        head += f" but does not import ({why})"
    if extra is None:
        return f"{head}; it is a default dependency of {DIST}, reinstall it: {install_command()}"
    return f"{head}; install the {extra!r} extra: {install_command(extra)}"


def require(module: str, extra: str | None, purpose: str) -> ModuleType:
    """``importlib.import_module(module)``, or MissingExtra naming ``extra`` when it (or a package it
    imports) is not installed. Other import failures (a broken shared library) propagate unchanged."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        top = module.partition(".")[0]
        missing = (e.name or top).partition(".")[0]
        # plotly installed without one of its own dependencies: the same extra brings that one too
        why = None if missing == top else f"no module named {missing!r}"
        raise MissingExtra(missing_message(module, extra, purpose, why)) from e


def main(argv: Sequence[str]) -> int:
    """``MODULE EXTRA PURPOSE`` (EXTRA ``-``: a default dependency): 0 when MODULE imports, else the line on
    stderr and 2. The Makefile's ``NEED`` runs it before ``make lab`` and ``make app``."""
    args = list(argv)
    if len(args) != 3:
        print(f"usage: MODULE EXTRA PURPOSE, got {args!r}", file=sys.stderr)
        return 2
    module, extra, purpose = args
    try:
        require(module, None if extra == "-" else extra, purpose)
    except MissingExtra as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
