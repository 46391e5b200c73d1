"""Load a user's object named ``MODULE:NAME`` or ``path/to/file.py:NAME`` (``workbench check-kernel``,
``workbench zoo --metadata-backend``): the one place the command line turns such a spec into an object.

A file is imported under a fresh module name (its folder first on ``sys.path`` while it runs, so its own
sibling imports work); a module name is imported normally. ``NAME`` may be dotted (``Outer.Inner``). Every
failure is one :class:`LoadError` naming the spec and what went wrong (the file's own exception included).

User code must never end a check with exit 0 ("every check passed" to a CI job): a file that exits at import
(``sys.exit(main())`` without a ``__main__`` guard) is a :class:`LoadError`, and :func:`exits_refused` turns
``sys.exit``, ``raise SystemExit`` or ``os._exit`` from user code while a check runs into a
:class:`UserCodeExit` naming the file and line.

>>> load_object("kernels.gated_delta_rule:recurrent").__name__
'recurrent'
>>> load_object("kernels.gated_delta_rule")
Traceback (most recent call last):
...
workbench.loading.LoadError: 'kernels.gated_delta_rule': expected MODULE:NAME or path/to/file.py:NAME
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import itertools
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

from workbench.errors import WorkbenchError

_counter = itertools.count()


class LoadError(WorkbenchError):
    """A ``MODULE:NAME`` / ``FILE:NAME`` spec that names nothing loadable; the message says why."""


class UserCodeExit(WorkbenchError):
    """User code tried to end the process (``sys.exit``, ``SystemExit``, ``os._exit``) while a check ran: the
    check has no verdict. The message names the call's file and line."""


_WORKBENCH_ROOT = str(Path(__file__).resolve().parent)
_ARGPARSE = os.path.dirname(contextlib.__file__)  # the standard library: argparse's own exits stay exits


def _origin(tb: TracebackType | None) -> str | None:
    """``file:line`` of the innermost frame of ``tb`` (where the exit was raised), or None."""
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return f"{last.tb_frame.f_code.co_filename}:{last.tb_lineno}" if last is not None else None


def _from_user_code(where: str | None) -> bool:
    if where is None:
        return False
    path = os.path.realpath(where.rsplit(":", 1)[0])
    return not (path.startswith(_WORKBENCH_ROOT) or path.startswith(_ARGPARSE))


def _exit_words(code: object) -> str:
    return f"exit status {code}" if isinstance(code, int) or code is None else f"SystemExit({code!r})"


@contextlib.contextmanager
def exits_refused(what: str) -> Iterator[None]:
    """Run a check's body where user code cannot end the process: a ``SystemExit`` raised in a file outside the
    workbench and the standard library, or any ``os._exit``, becomes :class:`UserCodeExit` ("``what``: user code
    at FILE:LINE tried to exit (exit status 0) before the check finished: no verdict"). The workbench's own
    exits (argparse's ``--help``) pass through."""
    real_exit = os._exit

    def refuse(status: int) -> NoReturn:
        caller = sys._getframe(1)
        where = f"{caller.f_code.co_filename}:{caller.f_lineno}"
        raise UserCodeExit(
            f"{what}: user code at {where} called os._exit({status}) before the check finished: no verdict"
        )

    os._exit = refuse
    try:
        yield
    except SystemExit as e:
        where = _origin(e.__traceback__)
        if not _from_user_code(where):
            raise
        words = _exit_words(e.code)
        raise UserCodeExit(
            f"{what}: user code at {where} tried to exit ({words}) before the check finished: no verdict"
        ) from None
    finally:
        os._exit = real_exit


def split_spec(spec: str) -> tuple[str, str]:
    """``"a/b.py:Name"`` -> (``"a/b.py"``, ``"Name"``); the last colon splits (Windows drive letters)."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name or not all(part.isidentifier() for part in name.split(".")):
        raise LoadError(f"{spec!r}: expected MODULE:NAME or path/to/file.py:NAME")
    return where, name


def _import_file(path: Path, spec: str) -> Any:
    if not path.is_file():
        raise LoadError(f"{spec!r}: no file {str(path)!r}")
    name = f"_workbench_user_{path.stem}_{next(_counter)}"
    mod_spec = importlib.util.spec_from_file_location(name, path)
    if mod_spec is None or mod_spec.loader is None:
        raise LoadError(f"{spec!r}: {str(path)!r} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    sys.path.insert(0, str(path.parent))
    try:
        mod_spec.loader.exec_module(module)
    except SystemExit as e:  # `sys.exit(main())` without a __main__ guard: the file exits when imported
        sys.modules.pop(name, None)
        raise LoadError(
            f"{spec!r}: importing {str(path)!r} exited ({_exit_words(e.code)}) at {_origin(e.__traceback__)}: "
            'guard the file\'s own run with `if __name__ == "__main__":`'
        ) from None
    except Exception as e:  # the user's file may raise anything while it runs: say so in one line
        sys.modules.pop(name, None)
        raise LoadError(f"{spec!r}: importing {str(path)!r} raised {type(e).__name__}: {e}") from e
    finally:
        sys.path.remove(str(path.parent))
    return module


def load_object(spec: str) -> Any:
    """The object ``spec`` names (see the module docstring)."""
    where, name = split_spec(spec)
    if where.endswith(".py") or "/" in where or "\\" in where:
        module = _import_file(Path(where), spec)
    else:
        try:
            module = importlib.import_module(where)
        except SystemExit as e:
            raise LoadError(f"{spec!r}: importing {where!r} exited ({_exit_words(e.code)}) at import") from None
        except Exception as e:  # ImportError, or whatever the module raises at import
            raise LoadError(f"{spec!r}: importing {where!r} raised {type(e).__name__}: {e}") from e
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            defined = sorted(n for n in vars(module) if not n.startswith("_"))[:12]
            raise LoadError(f"{spec!r}: {where!r} defines no {name!r} (it defines {', '.join(defined) or 'nothing'})")
        obj = getattr(obj, part)
    return obj
