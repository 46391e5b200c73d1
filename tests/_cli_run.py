"""Run the command line in process for a test: ``run(argv) -> (exit status, stdout, stderr)``.

A plain module beside the tests (``tests`` is not a package), imported as ``_cli_run``. Any exception but
``SystemExit`` propagates: a traceback is a test failure, never an exit status.
"""

from __future__ import annotations

import contextlib
import io

from workbench import cli


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
    return code, out.getvalue(), err.getvalue()
