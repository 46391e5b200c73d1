"""What the two live dumpers share (``workbench.engines.dump`` for vLLM, ``sglang_dump`` for sglang): the trace
file written as an engine runs, the dumpers of a process, and the patch of an engine's ``Scheduler.__init__``
that the ``LINATTN_TRACE`` plugins install. Imports no engine.
"""

from __future__ import annotations

import atexit
import importlib
import json
import logging
import os
from collections.abc import Callable
from typing import Any

from workbench.engines.errors import EngineError

ENV = "LINATTN_TRACE"
"""The environment variable the plugins read: the trace file's path (``{pid}`` in it: the process id)."""

log = logging.getLogger("workbench.engines.dump")


class TraceFile:
    """A trace file open for a live dumper: the header line at open, then whole steps, each flushed.
    ``lines``: step lines written so far."""

    def __init__(self, path: str, header: str) -> None:
        self.path, self.lines = path, 0
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 -- open until the dumper closes it
        self._file.write(header + "\n")
        self._file.flush()

    @property
    def closed(self) -> bool:
        return self._file.closed

    def write(self, steps: list[dict[str, Any]], n: int | None = None) -> None:
        """Write the first ``n`` of ``steps`` (None: all) and remove them from the list."""
        n = len(steps) if n is None else n
        for step in steps[:n]:
            self._file.write(json.dumps(step, separators=(",", ":")) + "\n")
        self.lines += n
        del steps[:n]
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def stopped(dumper: Any, error: Exception, where: str) -> None:
    """A dumper's error while recording: raised when it is ``strict``, else kept in ``dumper.error``, logged
    (``where``: the step or round), and the recording stops (``dumper.close()``); the engine runs on."""
    if dumper.strict:
        raise error
    dumper.error = f"{type(error).__name__}: {error}"
    log.error("linattn trace %s: recording stopped at %s: %s", dumper.path, where, dumper.error)
    dumper.close()


class Dumpers:
    """The dumpers of one process, one per open file."""

    def __init__(self) -> None:
        self.active: list[Any] = []

    def add(self, path: str, make: Callable[[], Any]) -> Any:
        """``make()``'s dumper for ``path``, attached; :class:`EngineError` when one writes there already."""
        if any(d.path == path and not d.file.closed for d in self.active):
            raise EngineError(f"{path}: a dumper of this process writes there already")
        dumper = make()
        dumper.attach()
        self.active.append(dumper)
        return dumper

    def remove(self, dumper: Any = None) -> None:
        """Close ``dumper`` (None: every dumper of this process)."""
        for d in [dumper] if dumper is not None else list(self.active):
            d.close()
            if d in self.active:
                self.active.remove(d)


def plug(module: str, install: Callable[[Any, str], Any], uninstall: Callable[[], None]) -> None:
    """With ``LINATTN_TRACE`` set, patch ``module``'s ``Scheduler.__init__`` so that every scheduler made from
    now on gets ``install(scheduler, path)`` (``{pid}`` replaced); without it, nothing. Idempotent."""
    target = os.environ.get(ENV)
    if not target:
        return
    cls = importlib.import_module(module).Scheduler
    if getattr(cls.__init__, "_linattn_dump", False):
        return
    original = cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if getattr(self, "_linattn_dumper", None) is None:  # a subclass's __init__ runs this once
            self._linattn_dumper = install(self, target.replace("{pid}", str(os.getpid())))

    __init__._linattn_dump = True  # type: ignore[attr-defined]
    __init__._linattn_original = original  # type: ignore[attr-defined]
    cls.__init__ = __init__
    atexit.register(uninstall)


def unplug(module: str) -> None:
    """Undo :func:`plug` on ``module``'s ``Scheduler`` (dumpers already installed stay)."""
    cls = importlib.import_module(module).Scheduler
    original = getattr(cls.__init__, "_linattn_original", None)
    if original is not None:
        cls.__init__ = original


__all__ = ["ENV", "Dumpers", "TraceFile", "plug", "stopped", "unplug"]
