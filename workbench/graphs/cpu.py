"""A CPU stand-in for a device graph: record the aten ops of one call, replay only those.

What is captured: every op that reaches the dispatcher's Python key while ``fn()`` runs under a
``TorchDispatchMode`` -- aten ops (after composite ops decompose) and, as ONE op each, kernels registered
with ``torch.library.custom_op`` (a custom op's kernel runs with the recorder popped, so its inner ops are
not recorded; a host sync among them is noted on the op's record). What is not: host Python, which runs at capture only,
as on a device, and work that never reaches the dispatcher (numpy, a raw Triton launch).

Semantics kept from device graphs, because they are what people trip over:

- Replay re-runs only the recorded ops, on the very tensor objects of the capture. An op whose output was
  allocated during capture owns that tensor as a *static output*; replay writes into it (through the op's
  ``out=`` variant where one matches, else by re-running the op and ``copy_`` into it). ``Graph.outputs``
  are therefore the same objects, overwritten each replay, and replay keeps no new tensor alive.
- Ops that mutate their inputs (``copy_``, ``index_copy_``, ``fill_``, ``out=``, custom ops with
  ``mutates_args``) are re-run as they are, so their mutation replays. A custom op whose one kernel is the
  function it was made from (``torch.library.custom_op``, no device kernel registered) is run, at capture and
  at each replay, by calling that function on its recorded arguments: what the dispatcher would end at,
  without its autograd and ADInplaceOrView layers (nothing to record under ``no_grad``).
- Views made during capture alias their base's storage; storages never move, so views need no replay.
- The capture call itself leaves unchanged every tensor that existed before it (the storages it would
  mutate are saved and put back), as a device capture runs nothing. Warm-up calls do run for real.
- A host sync during capture raises ``CaptureError`` naming the op and the source line:
  ``aten._local_scalar_dense`` (``.item()``, ``bool(t)``, ``int(t)``, ``float(t)``), ``aten.equal``,
  ``Tensor.tolist()``, ``.cpu()``, ``.numpy()``, ``np.asarray(t)``, printing a tensor. Inside a custom
  op's implementation a sync is only noted (``OpRecord.note``): the op replays whole with the values of
  the moment, and its CPU implementation is the torch reference, not the device kernel a real graph would
  hold. Data-dependent output shapes raise as well (``nonzero``, mask indexing, ``unique``)
  and ``Tensor.set_`` (a graph holds fixed addresses; a raw Triton launch under ``TRITON_INTERPRET=1``
  does this, so register Triton kernels as custom ops).
- Randomness is refused: an op that draws from a random generator (``rand``, ``randn``, dropout,
  ``bernoulli_``...) raises ``CaptureError``. A CUDA graph replays such ops with an advancing Philox
  offset, which this recorder does not model, so rather than replaying different numbers from eager, it
  says so. Draw the random tensor outside the graph and ``copy_`` it into a static input.
"""

from __future__ import annotations

import functools
import linecache
import operator
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any, ClassVar

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from workbench.errors import CaptureError
from workbench.graphs.base import (
    Graph,
    GraphBackend,
    OpRecord,
    Outputs,
    TensorMeta,
    check_outputs,
    check_warmup,
)

aten = torch.ops.aten

# Allocation only: their memory is uninitialised, so replay has nothing to redo (a device graph replays no
# kernel for them either).
_ALLOC_OPS = frozenset(
    {
        aten.empty.memory_format,
        aten.empty_like.default,
        aten.empty_strided.default,
        aten.new_empty.default,
        aten.new_empty_strided.default,
        aten.empty_permuted.default,
    }
)

# Ops that hand a tensor's value to the host. Besides the tagged ones (_local_scalar_dense, item).
_SYNC_OPS = frozenset({aten.equal.default, aten.is_nonzero.default})

# Tensor methods that read data to the host without reaching the dispatcher (seen at the torch-function
# level). On a device each is a device-to-host copy, which a capturing stream refuses.
_HOST_READS: dict[Any, str] = {
    torch.Tensor.tolist: "Tensor.tolist() reads every element to the host (a host sync, like aten._local_scalar_dense)",
    torch.Tensor.cpu: "Tensor.cpu() copies to the host (a host sync on a device)",
    torch.Tensor.numpy: "Tensor.numpy() reads the tensor on the host (a host sync on a device)",
    torch.Tensor.__array__: "np.asarray(tensor) reads the tensor on the host (a host sync on a device)",
    torch.Tensor.__repr__: "printing a tensor reads it on the host (a host sync on a device)",
    torch.Tensor.__format__: "formatting a tensor reads it on the host (a host sync on a device)",
}

_HINT_SYNC = (
    "A graph cannot hand values to the host while capturing (on cuda: 'operation not permitted when "
    "stream is capturing'), and host code would run only once anyway. Keep the value on the device "
    "(torch.where, masks, clamp) or compute it before capture."
)

# Frames of these modules are plumbing; the source line we report is the first frame outside them.
_PLUMBING = ("torch", "triton", "contextlib", "functools", "workbench.graphs")


def _user_frame() -> FrameType | None:
    f: FrameType | None = sys._getframe(1)
    while f is not None:
        mod = f.f_globals.get("__name__", "")
        if not any(mod == p or mod.startswith(p + ".") for p in _PLUMBING):
            return f
        f = f.f_back
    return None


def _where(with_code: bool = False) -> str:
    """``file:line in func`` of the user code running now (plus the line's text if ``with_code``)."""
    f = _user_frame()
    if f is None:
        return "?"
    path, line = f.f_code.co_filename, f.f_lineno
    loc = f"{os.path.basename(path)}:{line} in {f.f_code.co_name}"
    if with_code:
        code = linecache.getline(path, line).strip()
        if code:
            loc += f": `{code}`"
    return loc


def _storage_key(t: torch.Tensor) -> int:
    # The StorageImpl's address: equal for every view of one storage, stable while the storage lives.
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # no storage (sparse, nested): the tensor stands for itself
        return id(t)


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def _meta(ts: list[torch.Tensor]) -> tuple[TensorMeta, ...]:
    return tuple(TensorMeta(tuple(t.shape), t.dtype) for t in ts)


def _sync_reason(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> str | None:
    """Why ``func`` cannot be captured (a host sync, a data-dependent shape, a storage swap), or None."""
    tags = func.tags
    if torch.Tag.data_dependent_output in tags or func in _SYNC_OPS:
        name = "aten.item -> aten._local_scalar_dense" if func is aten.item.default else str(func)
        return f"host sync during capture: {name} reads a tensor's value on the host. {_HINT_SYNC}"
    if torch.Tag.dynamic_output_shape in tags:
        if func is aten.index.Tensor:
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if not any(t is not None and t.dtype in (torch.bool, torch.uint8) for t in indices):
                return None  # integer indexing is a gather: its shape is known
        elif func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is not None:
            return None
        elif func is aten.one_hot.default:
            num_classes = args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
            if num_classes != -1:
                return None
        return (
            f"data-dependent output shape during capture: {func} sizes its output from tensor values, "
            "which a graph cannot (on cuda it syncs with the host). Use a fixed-size form (masks, "
            "torch.where, integer indices, output_size=...)."
        )
    if func.overloadpacket is aten.set_:
        return (
            f"{func} during capture swaps a tensor's storage; a graph holds fixed addresses. A raw Triton "
            "launch under TRITON_INTERPRET=1 does this: register the kernel with torch.library.custom_op "
            "so the recorder sees it as one op."
        )
    return None


def _mutated(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> list[tuple[str, torch.Tensor]]:
    """(argument name, tensor) for every argument the op's schema marks as written (``Tensor(a!)``)."""
    out: list[tuple[str, torch.Tensor]] = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        val = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
        out.extend((arg.name, t) for t in _tensors(val))
    return out


_OUT_VARIANTS: dict[torch._ops.OpOverload, tuple[torch._ops.OpOverload, tuple[str, ...], bool] | None] = {}


def _out_variant(
    func: torch._ops.OpOverload,
) -> tuple[torch._ops.OpOverload, tuple[str, ...], bool] | None:
    """The overload of ``func`` that takes the same arguments plus kwarg-only ``out`` tensors.

    Returns (overload, out argument names, whether the single out argument is a tensor list), or None.
    """
    if func in _OUT_VARIANTS:
        return _OUT_VARIANTS[func]
    found = None
    schema = func._schema
    returns = [str(r.type) for r in schema.returns]
    tensors_only = returns and all(r == "Tensor" for r in returns)
    if tensors_only or returns == ["List[Tensor]"]:
        sig = [(a.name, str(a.type)) for a in schema.arguments]
        for name in func.overloadpacket.overloads():
            cand = getattr(func.overloadpacket, name)
            if cand is func:
                continue
            cand_args = cand._schema.arguments  # a fresh list of fresh objects on each access
            is_out = [a.kwarg_only and a.alias_info is not None and a.alias_info.is_write for a in cand_args]
            outs = [a for a, o in zip(cand_args, is_out, strict=True) if o]
            rest = [(a.name, str(a.type)) for a, o in zip(cand_args, is_out, strict=True) if not o]
            if rest == sig and [str(a.type) for a in outs] == returns:
                found = (cand, tuple(a.name for a in outs), not tensors_only)
                break
    _OUT_VARIANTS[func] = found
    return found


@dataclass
class _Step:
    record: OpRecord
    run: Callable[[], None] | None


def _make_run(
    func: Callable[..., Any], args: tuple, kwargs: dict, fresh: list[tuple[int, torch.Tensor]]
) -> Callable[[], None]:
    """Re-run ``func`` (an op, or a custom op's kernel) on the recorded arguments and ``copy_`` its fresh
    outputs into the static ones."""
    if not fresh:
        return lambda: func(*args, **kwargs)

    def run() -> None:
        leaves = tree_flatten(func(*args, **kwargs))[0]
        for i, dst in fresh:
            dst.copy_(leaves[i])

    return run


_KERNELS: dict[torch._ops.OpOverload, Callable[..., Any] | None] = {}


def _custom_kernel(func: torch._ops.OpOverload) -> Callable[..., Any] | None:
    """The Python function behind custom op ``func`` when it is the op's one kernel (``torch.library.custom_op``
    with no device kernel registered or disabled), else None (the dispatcher then runs the op).

    Capture and replay call it directly: below the Python key the dispatcher would only run the op's
    autograd and ADInplaceOrView layers (no gradient here: capture and replay run under ``no_grad``), refill
    its defaults and wrap the call to keep dynamo out, which together cost more than a small reference step
    (issue 33). Read through torch's private op registry; where that is missing, the dispatcher runs it."""
    if func in _KERNELS:
        return _KERNELS[func]
    kernel = None
    try:
        from torch._library.custom_ops import _maybe_get_opdef

        opdef = _maybe_get_opdef(func)
        fns, disabled = getattr(opdef, "_backend_fns", None), getattr(opdef, "_disabled_kernel", None)
        if opdef is not None and fns is not None and fns.keys() == {None} and not disabled:
            kernel = opdef._init_fn
    except (ImportError, AssertionError, AttributeError):
        kernel = None
    _KERNELS[func] = kernel
    return kernel


def _bound_kernel(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    """A call of ``func``'s kernel (:func:`_custom_kernel`) on ``args``/``kwargs`` as the dispatcher passes them
    (positional, kwarg-only ones by name, trailing defaults left out), its defaults filled in; or None."""
    kernel = _custom_kernel(func)
    if kernel is None:
        return None
    from torch._library.utils import fill_defaults

    full_args, full_kwargs = fill_defaults(func._schema, args, kwargs)
    return functools.partial(kernel, *full_args, **full_kwargs)


class _EagerMode(TorchDispatchMode):
    """A dispatch mode that never runs under ``torch.compile`` (the recorder records eager calls)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # else torch wraps __torch_dispatch__ in dynamo's disable, which imports torch._dynamo (and sympy) at the
        # first op: 1-2 CPU-s of every process that captures a graph, for a guard these modes never need
        return False


class _SyncCheck(_EagerMode):
    """Pushed while a custom op runs: its inner ops are not recorded, and a host sync among them is noted.

    A custom op replays whole (it re-runs with the values of the moment), so a sync inside its CPU
    implementation (the torch reference reads ``cu_seqlens`` to loop over rows) does not break replay.
    It is noted on the op's record: on a device, the op's kernel must not do this.
    """

    def __init__(self, outer: torch._ops.OpOverload, where: str) -> None:
        super().__init__()
        self.outer, self.where = outer, where
        self.notes: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        why = _sync_reason(func, args, kwargs)
        if why is not None and func.overloadpacket is not aten.set_ and not self.notes:
            self.notes.append(f"its CPU implementation syncs with the host ({func}); a device kernel must not")
        return func(*args, **kwargs)


class _HostReadGuard(TorchFunctionMode):
    """Sees host reads that never reach the dispatcher (``tolist``, ``cpu``, ``numpy``, printing)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        why = _HOST_READS.get(func)
        if why is not None:
            raise CaptureError(f"host sync during capture: {why}, at {_where(with_code=True)}. {_HINT_SYNC}")
        return func(*args, **(kwargs or {}))


class _Recorder(_EagerMode):
    """Runs each op for real and records how to replay it."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[_Step] = []
        self.fresh: set[int] = set()  # storages allocated during capture
        self.saved: dict[int, tuple[torch.UntypedStorage, torch.UntypedStorage]] = {}

    def restore(self) -> None:
        """Put back the pre-capture contents of pre-existing storages the capture mutated."""
        for storage, copy in self.saved.values():
            storage.copy_(copy)
        self.saved.clear()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        why = _sync_reason(func, args, kwargs)
        if why is not None:
            raise CaptureError(f"{why} At {_where(with_code=True)}.")
        where = _where()
        inputs = _tensors((args, kwargs))
        in_keys = {_storage_key(t) for t in inputs}
        mutated = _mutated(func, args, kwargs)
        for _, t in mutated:
            key = _storage_key(t)
            if key not in self.fresh and key not in self.saved:
                storage = t.untyped_storage()
                self.saved[key] = (storage, storage.clone())

        custom = func.namespace not in ("aten", "prims")
        # Tagged aten ops may draw random numbers (sdpa only with dropout); custom ops are opaque. Compare the
        # generator's state around them rather than refuse the tag.
        seeded = custom or torch.Tag.nondeterministic_seeded in func.tags
        gen = kwargs.get("generator") or torch.default_generator
        rng_before = gen.get_state() if seeded else None
        note = ""
        kernel: Callable[[], Any] | None = None
        if not custom or not inputs:
            out = func(*args, **kwargs)
        else:
            # A custom op: run its kernel (its own function, else below the Python key) with a sync check
            # pushed, so that its inner ops are watched for host syncs but not recorded (calling func() would
            # hand the op itself to the pushed mode and run the kernel with no mode at all).
            check = _SyncCheck(func, where)
            kernel = _bound_kernel(func, args, kwargs)
            if kernel is not None:  # the op's own function: what the dispatcher would end at, without its layers
                with check:
                    out = kernel()
            else:
                keys = functools.reduce(operator.or_, (torch._C._dispatch_keys(t) for t in inputs))
                keys = keys & torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.Python)
                with check:
                    out = func.redispatch(keys, *args, **kwargs)
            note = check.notes[0] if check.notes else ""
        if rng_before is not None and not torch.equal(rng_before, gen.get_state()):
            raise CaptureError(
                f"random numbers during capture: {func} at {_where(with_code=True)} draws from a generator. "
                "The cpu recorder refuses randomness (a cuda graph would replay it with an advancing Philox "
                "offset, giving numbers that differ from eager): draw outside the graph and copy_ the values "
                "into a static input."
            )

        leaves = tree_flatten(out)[0]
        fresh = [(i, t) for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and _storage_key(t) not in in_keys]
        self.fresh.update(_storage_key(t) for _, t in fresh)
        run: Callable[[], None] | None
        # what a re-run calls: a custom op's kernel with its arguments bound, else the op
        rerun: tuple[Callable[..., Any], tuple, dict] = (kernel, (), {}) if kernel is not None else (func, args, kwargs)
        if func in _ALLOC_OPS:
            kind, run = "alloc", None
        elif mutated:
            kind, run = "in place", _make_run(*rerun, fresh)
        elif not fresh:
            kind, run = ("view" if _tensors(leaves) else "no-op"), None
        else:
            variant = _out_variant(func) if len(fresh) == len(leaves) else None
            if variant is not None:
                kind, run = "out=", _out_run(variant, args, kwargs, out)
            else:
                kind, run = "rerun+copy", _make_run(*rerun, fresh)
        record = OpRecord(
            index=len(self.steps),
            name=str(func),
            inputs=_meta(inputs),
            mutates=tuple(dict.fromkeys(name for name, _ in mutated)),
            outputs=_meta(_tensors(leaves)),
            replay=kind,
            source=where,
            note=note,
        )
        self.steps.append(_Step(record, run))
        return out


def _out_run(
    variant: tuple[torch._ops.OpOverload, tuple[str, ...], bool], args: tuple, kwargs: dict, out: Any
) -> Callable[[], None]:
    op, names, is_list = variant
    if is_list:
        out_kw = {names[0]: list(out)}
    else:
        outs: list[Any] = [out] if isinstance(out, torch.Tensor) else list(out)
        out_kw = dict(zip(names, outs, strict=True))
    kw = {**kwargs, **out_kw}
    return lambda: op(*args, **kw)


_capturing = False


class CpuGraph(Graph):
    """A recorded op list; ``replay()`` runs it on the captured tensors. See the module docstring."""

    def __init__(self, backend: CpuBackend, outputs: Outputs, steps: list[_Step], inference: bool) -> None:
        super().__init__(backend, outputs)
        self._steps = steps
        self._runs = [s.run for s in steps if s.run is not None]
        self._inference = inference

    @property
    def ops(self) -> list[OpRecord]:
        """Every recorded op, in capture order (views and allocations included)."""
        return [s.record for s in self._steps]

    def replay(self) -> None:
        """Re-run the recorded ops in order; Python in ``fn`` does not run."""
        self._check_live()
        with torch.no_grad(), torch.inference_mode(self._inference):
            for run in self._runs:
                run()

    def reset(self) -> None:
        """Drop the recorded ops (outputs keep their last values); replay() then raises."""
        self._steps, self._runs, self._reset = [], [], True

    def summary(self) -> str:
        """A table: index, op, input shapes/dtypes, mutated arguments, what replay does, source line."""
        head = ("#", "op", "inputs", "mutates", "outputs", "replay", "source")
        rows = [head] + [
            (
                str(r.index),
                r.name,
                ", ".join(map(str, r.inputs)) or "-",
                ", ".join(r.mutates) or "-",
                ", ".join(map(str, r.outputs)) or "-",
                r.replay,
                r.source,
            )
            for r in self.ops
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        n_run = len(self._runs)
        lines.append(f"{len(self.ops)} ops recorded, {n_run} replayed (views and allocations need no replay)")
        return "\n".join(lines)


class CpuBackend(GraphBackend):
    """Graphs on the CPU, by recording aten ops (see the module docstring for what is kept)."""

    name: ClassVar[str] = "cpu"

    def __init__(self, device: torch.device | str | int | None = None) -> None:
        dev = torch.device("cpu" if device is None else device)
        if dev.type != "cpu":
            raise ValueError(f"the cpu graph backend runs on the cpu, got device={dev}")
        self.device = torch.device("cpu")  # what CPU tensors report, whatever index was given ("cpu:0")

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        """Always (True, "ok")."""
        return True, "ok"

    def new_pool(self) -> None:
        """None: host memory has no graph pool (capture keeps its own tensors alive)."""
        return None

    def capture(self, fn: Callable[[], Outputs], *, pool: Any | None = None, warmup: int = 2) -> CpuGraph:
        """Warm up ``fn`` ``warmup`` times, then record one call of it. ``pool`` is accepted and unused."""
        global _capturing
        check_warmup(warmup)
        if _capturing:
            raise CaptureError("cpu capture: another capture is already under way (captures do not nest)")
        with torch.no_grad():
            for _ in range(warmup):
                fn()
            recorder = _Recorder()
            _capturing = True
            try:
                with _HostReadGuard(), recorder:
                    outputs = fn()
            finally:
                _capturing = False
                recorder.restore()
        check_outputs(outputs, self.name)
        return CpuGraph(self, outputs, recorder.steps, torch.is_inference_mode_enabled())
