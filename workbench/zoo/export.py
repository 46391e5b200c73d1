"""A zoo run against the user's code, written out as a standalone pytest module to attach to an engine PR.

:func:`to_pytest` is the module's text, :func:`write_pytest` writes it into a folder :func:`export_folder`
checks. They live here, above the case registry (``zoo.get``: the case's title and scenario), not on
``ZooResult``: a result sits below the cases that make it, and nothing below the registry may call up into it.

The module reruns the case's scenario (``ZooCase.run_with``) against the same backend class or kernel and
expects "clean": it fails while the bug is there and passes once it is fixed. It needs only ``workbench``
installed and the subject importable; it carries the scenario's inputs (``STEPS``, ``PROFILE``), what the
exported run observed (``OBSERVED``: metadata rows, slots, errors) and the expectation.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

from workbench.zoo.result import ZooError, ZooResult

ENV = "WORKBENCH_ZOO_SUBJECT"
"""Environment variable that points an exported test at another ``MODULE_OR_FILE:NAME``."""


def export_folder(directory: str | Path, *, make: bool = False, what: str = "export") -> Path:
    """The folder exported tests go to, checked without running anything: ``ZooError`` (one line naming
    ``what``) when the path, or a folder on its way, is a file, or when the deepest folder of it that exists
    cannot be written; a missing folder is fine (made, parents too, when ``make``)."""
    if not isinstance(directory, str | Path) or not str(directory).strip():
        raise ZooError(f"{what}: expected a folder path, got {directory!r}")
    folder = Path(directory).expanduser()
    existing = folder  # the deepest part of the path that exists
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        if existing == folder:
            raise ZooError(f"{what}: {str(folder)!r} is a file, not a folder")
        raise ZooError(f"{what}: {str(folder)!r} cannot be made: {str(existing)!r} on its way is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        inside = "" if existing == folder else f" (to make {str(folder)!r} in it)"
        raise ZooError(f"{what}: cannot write into the folder {str(existing)!r}{inside}: permission denied")
    if make:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ZooError(f"{what}: cannot make the folder {str(folder)!r}: {e.strerror or e}") from e
    return folder


def _loadable(subject: str) -> bool:
    where, _, name = subject.rpartition(":")
    return bool(where) and not where.startswith("_workbench_user_") and "<locals>" not in name


def _wrap(text: str, indent: str = "") -> str:
    return textwrap.fill(text, 100, initial_indent=indent, subsequent_indent=indent)


def to_pytest(result: ZooResult) -> str:
    """A standalone pytest module (needs only ``workbench`` and the subject importable) that reruns ``result``'s
    case scenario against its subject and fails while the bug is there: the case, its PR, the scenario's inputs,
    the evidence this run produced, and the expectation (``status == "clean"``). ``ZooError`` (one line) for a
    run that cannot be exported: the zoo's own variant, a case that did not apply, a subject a test cannot load.
    """
    from workbench import __version__
    from workbench.zoo.registry import get

    if result.subject is None or result.subject_kind is None:
        raise ZooError(
            f"to_pytest: {result.case} ({result.variant}) is the zoo's own variant; export a run against your "
            "backend or kernel (zoo.check_backend, zoo.check_kernel)"
        )
    if result.not_applicable is not None:
        raise ZooError(f"to_pytest: {result.case} does not apply to {result.subject}: {result.not_applicable}")
    if not _loadable(result.subject):
        raise ZooError(
            f"to_pytest: {result.subject} cannot be loaded by a standalone test; run the check with its "
            "MODULE_OR_FILE:NAME spec (check_backend('my_backend.py:MyBackend'), or workbench zoo --metadata-backend)"
        )
    case = get(result.case)
    seen = [f"  - {e.summary()}" for e in result.evidence]
    doc = "\n\n".join(
        [
            _wrap(f'"""Zoo case {case.name} ({case.issue}) against {result.subject}: {case.title}.'),
            _wrap(case.explanation),
            _wrap(f"Scenario ({result.profile}): {case.steps}"),
            f"Exported by workbench {__version__} from a run whose status was {result.status!r}:\n" + "\n".join(seen),
            _wrap(
                f"The test fails while the bug is there and passes once it is fixed. It needs only `workbench` "
                f"installed and the {result.subject_kind.replace('_', ' ')} importable; set {ENV}="
                "MODULE_OR_FILE:NAME to point it at another one."
            ),
        ]
    )
    doc += '\n"""'
    observed = json.dumps([r for r in result.to_dict()["evidence"]], indent=1, sort_keys=True)
    body = f'''

import json
import os

from workbench import zoo
from workbench.loading import load_object

CASE = {case.name!r}
SUBJECT = os.environ.get({ENV!r}, {result.subject!r})
PROFILE = {result.profile!r}
STEPS = {case.steps!r}
# What the exported run observed (metadata rows got and expected, slots, errors): the bug, as seen then.
OBSERVED = json.loads(
    r"""
{observed}
"""
)


def test_{case.name}_is_clean() -> None:
    result = zoo.get(CASE).run_with(load_object(SUBJECT), profile=PROFILE, label=SUBJECT)
    assert result.not_applicable is None, result.not_applicable
    when_exported = [e["summary"] for e in OBSERVED if e["broken"]]
    assert result.status == "clean", "\\n".join(
        [f"{{CASE}} ({{result.issue}}): {{result.status}}: {{result.summary}}", "when exported:", *when_exported]
    )
'''
    return doc + body


def write_pytest(result: ZooResult, directory: str | Path) -> Path:
    """Write :func:`to_pytest` of ``result`` to ``directory/test_<case>.py``, making the folder (parents too)
    when it is missing; returns the path. ``ZooError`` (one line) when the path is a file or cannot be written."""
    text = to_pytest(result)  # refuses what cannot be exported before anything is made
    path = export_folder(directory, make=True) / f"test_{result.case}.py"
    try:
        path.write_text(text)
    except OSError as e:
        raise ZooError(f"export: cannot write {str(path)!r}: {e.strerror or e}") from e
    return path
