"""Load a user's object named ``MODULE:NAME`` or ``path/to/file.py:NAME`` (``workbench check-kernel``,
``workbench zoo --metadata-backend``): the one place the command line turns such a spec into an object.

A file is imported under a fresh module name (its folder first on ``sys.path`` while it runs, so its own
sibling imports work); a module name is imported normally. ``NAME`` may be dotted (``Outer.Inner``). Every
failure is one :class:`LoadError` naming the spec and what went wrong (the file's own exception included).

>>> load_object("kernels.gated_delta_rule:recurrent").__name__
'recurrent'
>>> load_object("kernels.gated_delta_rule")
Traceback (most recent call last):
...
workbench.loading.LoadError: 'kernels.gated_delta_rule': expected MODULE:NAME or path/to/file.py:NAME
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import sys
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError

_counter = itertools.count()


class LoadError(WorkbenchError):
    """A ``MODULE:NAME`` / ``FILE:NAME`` spec that names nothing loadable; the message says why."""


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
        except Exception as e:  # ImportError, or whatever the module raises at import
            raise LoadError(f"{spec!r}: importing {where!r} raised {type(e).__name__}: {e}") from e
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            defined = sorted(n for n in vars(module) if not n.startswith("_"))[:12]
            raise LoadError(f"{spec!r}: {where!r} defines no {name!r} (it defines {', '.join(defined) or 'nothing'})")
        obj = getattr(obj, part)
    return obj
