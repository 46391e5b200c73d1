"""A trace dumper for a live sglang 0.5.23 scheduler process (issue 29): the CPU driver's recorder
(:class:`~workbench.engines.sglang_recorder.Recorder`) attached to the engine's own ``Scheduler``, writing the
trace file (``docs/traces.md``) as the engine runs.

    dumper = install(scheduler, "/tmp/trace.jsonl")   # by hand, in the scheduler process
    ...
    uninstall()                                         # writes the last step, closes the file

or, with ``LINATTN_TRACE=/path/trace-{pid}.jsonl`` set (``{pid}``: the process id), :func:`sglang_plugin`
patches ``Scheduler.__init__`` so that every scheduler made afterwards in the process records. sglang 0.5.23
starts its schedulers with ``multiprocessing`` under the ``spawn`` start method (``entrypoints/engine.py``
forces it), so a patch made in the launching process does not reach them. Two ways in:

- the launcher, ``python -m workbench.engines.sglang_dump --trace PATH -- <sglang.launch_server args>``: it
  sets ``LINATTN_TRACE`` and runs ``sglang.launch_server`` as ``__main__``. A ``spawn`` child imports the
  parent's main module again (as ``__mp_main__``) before it runs its target, so this module runs in every
  scheduler process and calls :func:`sglang_plugin` there before ``run_scheduler_process`` builds the
  ``Scheduler``.
- sglang's own plugin group (the plain way, with this package installed beside sglang): ``run_scheduler_process``
  calls ``sglang.srt.plugins.load_plugins()`` before it builds the ``Scheduler``, which runs every
  ``sglang.srt.plugins`` entry point; this package declares ``linattn_trace =
  "workbench.engines.sglang_dump:sglang_plugin"`` there, so ``LINATTN_TRACE=... python -m
  sglang.launch_server ...`` records (the plugin does nothing without the variable).

Verified here, on the CPU: the recorder in the scheduler (the driver's trace is made by it), the dumper on a
driven scheduler, the refusals, the patch of ``Scheduler.__init__`` and the ``__mp_main__`` re-import of a
``spawn`` child. Not run (no GPU here): a live ``launch_server``; the EAGLE worker's ``verify`` and the
backend's graph-replay path (``init_forward_metadata_out_graph``) are followed from sglang's sources.

The file: the header on install, then each step once final (at the next ``run_batch``: the cache's work until
then is the step's), one line each, flushed. Needs ``--disable-overlap-schedule`` (refused otherwise, naming
the setting); an error while recording stops the recording (logged; ``Dumper.error``) and leaves the engine
running, unless ``strict``.
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys
import types
from typing import Any

from workbench.engines.live_dump import ENV, Dumpers, TraceFile, plug, stopped, unplug
from workbench.engines.sglang_recorder import Recorder

SCHEDULER_MODULE = "sglang.srt.managers.scheduler"

DUMPERS = Dumpers()
"""The sglang dumpers of this process."""


def sglang_names() -> Any:
    """The sglang names the recorder uses, imported as they are (in a live process sglang is whole; on the
    CPU, after ``sglang_scheduler.load()``, they are the modules it imported)."""
    imp = importlib.import_module
    version = imp("sglang.version")
    commit = getattr(imp("sglang._version"), "__commit_id__", None)
    return types.SimpleNamespace(
        version=str(version.__version__),
        commit=str(commit) if commit else None,
        runtime_context=imp("sglang.srt.runtime_context"),
        verify_commit_step_indices=imp("sglang.srt.speculative.spec_utils")._verify_commit_step_indices,
    )


class Dumper(Recorder):
    """A :class:`Recorder` that writes its steps to ``path`` as they become final."""

    def __init__(self, sg: Any, sched: Any, path: str, *, strict: bool = False, **kwargs: Any) -> None:
        super().__init__(sg, sched, **kwargs)
        self.path, self.strict = path, strict
        self.error: str | None = None
        self.file = TraceFile(path, next(self.trace.lines()))

    @property
    def lines(self) -> int:
        """Step lines written so far."""
        return self.file.lines

    def written(self) -> None:
        self.file.write(self.trace.steps)

    def failed(self, error: Exception) -> None:
        stopped(self, error, f"round {self.round}")

    def close(self) -> None:
        """Detach; without an error, write the last step; close the file."""
        self.detach()
        if self.file.closed:
            return
        if self.error is None:
            self.finish()
        self.file.close()


def install(
    scheduler: Any,
    path: str | os.PathLike[str],
    *,
    seed: int | None = None,
    strict: bool = False,
    backend: Any = None,
    sg: Any = None,
) -> Dumper:
    """Attach a :class:`Dumper` to a live sglang ``Scheduler`` writing to ``path``; the header is written now.
    ``seed``: the header's (None: null); ``strict``: an error while recording is raised in the engine (default:
    logged, recording stops); ``backend``: the target's linear-attention backend (None: the scheduler's
    ``tp_worker.model_runner.attn_backend.linear_attn_backend``); ``sg``: the sglang names (default
    :func:`sglang_names`). Raises :class:`EngineError` for a deployment the recorder cannot follow (the
    overlap scheduler, ``extra_buffer_lazy``, a speculative tree or another algorithm than EAGLE: named)."""
    path = os.fspath(path)
    return DUMPERS.add(
        path, lambda: Dumper(sg or sglang_names(), scheduler, path, strict=strict, seed=seed, backend=backend)
    )


def uninstall(dumper: Dumper | None = None) -> None:
    """Detach ``dumper`` (None: every dumper of this process), write its last step and close its file."""
    DUMPERS.remove(dumper)


def sglang_plugin() -> None:
    """With ``LINATTN_TRACE`` set, every ``Scheduler`` made from now on in this process gets a dumper
    (:func:`install`) writing there; without it, nothing happens. Idempotent."""
    plug(SCHEDULER_MODULE, install, uninstall)


def sglang_unplug() -> None:
    """Undo :func:`sglang_plugin`'s patch of ``Scheduler.__init__`` (dumpers already installed stay)."""
    unplug(SCHEDULER_MODULE)


def main(argv: list[str]) -> int:
    """``--trace PATH -- <sglang.launch_server args>``: set ``LINATTN_TRACE`` and run sglang's launcher."""
    if len(argv) < 3 or argv[0] != "--trace" or argv[2] != "--":
        print("usage: python -m workbench.engines.sglang_dump --trace PATH -- <sglang.launch_server args>")
        return 2
    if "--disable-overlap-schedule" not in argv[3:]:
        print("--disable-overlap-schedule: required by the recorder (a step's result before the next step)")
        return 2
    os.environ[ENV] = argv[1]
    sys.argv = ["sglang.launch_server", *argv[3:]]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=False)  # __main__ stays this module
    return 0


if __name__ == "__mp_main__" and os.environ.get(ENV):  # a spawn child of the launcher: a scheduler, maybe
    sglang_plugin()

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))


__all__ = ["ENV", "Dumper", "install", "main", "sglang_names", "sglang_plugin", "sglang_unplug", "uninstall"]
