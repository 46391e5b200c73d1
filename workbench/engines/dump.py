"""A trace dumper for a live vLLM 0.33.0 process (issue 29): the driver's recorder
(:class:`~workbench.engines.vllm_recorder.Recorder`) attached to the engine's own ``Scheduler``, writing the
trace file (``docs/traces.md``) as the engine runs.

    dumper = install(engine_core.scheduler, "/tmp/trace.jsonl")   # by hand, in the EngineCore process
    ...
    uninstall()                                                       # flushes the last steps

or, with this package installed beside vLLM, set ``LINATTN_TRACE=/path/trace.jsonl`` (``{pid}`` in it: the
process id): vLLM loads the ``vllm.general_plugins`` entry point :func:`vllm_plugin` in every process, and
each ``Scheduler`` made after it records into the file.

The file: the header on install, then each step once it is final (a step a later preemption or a later
publish can still change waits: at most until its requests move on), one line each, flushed. What is
recorded is what the scheduler and its block pool do; the worker's side (its request states, the align-mode
pre-copies of ``preprocess_mamba``, the post-copies, the GDN builder's metadata) is recomputed on the host from
the scheduler's outputs, as the CPU driver does. Needs sync scheduling (``--no-async-scheduling``) and Model
Runner V2's row order; an error while recording stops the recording (logged; ``Dumper.error``) and leaves the
engine running, unless ``strict``.
"""

from __future__ import annotations

import importlib
import os
import types
from typing import Any

from workbench.engines.live_dump import ENV, Dumpers, TraceFile, plug, stopped, unplug
from workbench.engines.vllm_recorder import Recorder, _commit

SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"

DUMPERS = Dumpers()
"""The vLLM dumpers of this process."""


def vllm_names() -> Any:
    """The vLLM names the recorder uses, imported as they are (no stand-ins: in a live process vLLM is whole;
    on the CPU, after ``vllm_scheduler.load()``, they are the modules it imported)."""
    imp = importlib.import_module
    version = imp("vllm._version")
    return types.SimpleNamespace(
        version=str(version.__version__),
        commit=_commit(version),
        MambaSpec=imp("vllm.v1.kv_cache_interface").MambaSpec,
        CommonAttentionMetadata=imp("vllm.v1.attention.backend").CommonAttentionMetadata,
        GDNAttentionMetadataBuilder=imp("vllm.v1.attention.backends.gdn_attn").GDNAttentionMetadataBuilder,
        kv_cache_utils=imp("vllm.v1.core.kv_cache_utils"),
        mamba_utils=imp("vllm.v1.worker.mamba_utils"),
        sort_batch_req_ids=imp("vllm.v1.worker.gpu.model_runner").sort_batch_req_ids,
    )


class Dumper(Recorder):
    """A :class:`Recorder` that writes its steps to ``path`` as they become final."""

    def __init__(self, v: Any, sched: Any, path: str, *, strict: bool = False, **kwargs: Any) -> None:
        super().__init__(v, sched, **kwargs)
        self.path, self.strict = path, strict
        self.error: str | None = None
        self.file = TraceFile(path, next(self.trace.lines()))

    @property
    def lines(self) -> int:
        """Step lines written so far."""
        return self.file.lines

    def _final(self) -> int:
        """How many of ``trace.steps`` no later step can change: all before the last (a preemption appends
        to its ``finish``) and before the first holding a move a later publish may add a ``keep`` to."""
        held = {id(move) for _, move in self.writer.left.values()} if self.writer.spec else set()
        steps = self.trace.steps
        for i, step in enumerate(steps[:-1]):
            if any(id(m) in held for m in (step["metadata"] or {}).get("moves", ())):
                return i
        return max(len(steps) - 1, 0)

    def written(self) -> None:
        self.file.write(self.trace.steps, self._final())

    def failed(self, error: Exception) -> None:
        stopped(self, error, f"step {self.number - 1}")

    def close(self) -> None:
        """Detach and write what is left (the last steps), then close the file."""
        self.detach()
        if not self.file.closed:
            self.file.write(self.trace.steps)
            self.file.close()


def install(
    scheduler: Any,
    path: str | os.PathLike[str],
    *,
    spec: int | None = None,
    seed: int | None = None,
    group: int | None = None,
    strict: bool = False,
    v: Any = None,
) -> Dumper:
    """Attach a :class:`Dumper` to a live vLLM ``Scheduler`` (``mamba_cache_mode="align"``) writing to
    ``path``; the header is written now. ``spec``: D (checked against the scheduler's speculative config;
    None: taken from it); ``seed``: the header's (None: null); ``group``: the KV-cache group whose blocks are
    the slots (None: the first mamba group); ``strict``: an error while recording is raised in the engine
    (default: logged, recording stops); ``v``: the vLLM names (default :func:`vllm_names`)."""
    path = os.fspath(path)
    return DUMPERS.add(
        path, lambda: Dumper(v or vllm_names(), scheduler, path, strict=strict, spec=spec, seed=seed, group=group)
    )


def uninstall(dumper: Dumper | None = None) -> None:
    """Detach ``dumper`` (None: every dumper of this process), write its last steps and close its file."""
    DUMPERS.remove(dumper)


def vllm_plugin() -> None:
    """vLLM's ``vllm.general_plugins`` entry point: with ``LINATTN_TRACE`` set, every ``Scheduler`` made from
    now on in this process gets a dumper (:func:`install`) writing there; without it, nothing happens.
    Idempotent (vLLM loads plugins more than once per process)."""
    plug(SCHEDULER_MODULE, install, uninstall)


def vllm_unplug() -> None:
    """Undo :func:`vllm_plugin`'s patch of ``Scheduler.__init__`` (dumpers already installed stay)."""
    unplug(SCHEDULER_MODULE)


__all__ = ["ENV", "Dumper", "install", "uninstall", "vllm_names", "vllm_plugin", "vllm_unplug"]
