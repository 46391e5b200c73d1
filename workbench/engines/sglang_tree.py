"""sglang's tree verify (speculative ``topk`` > 1) on the CPU: what the sglang adapter adds for ``--topk K``.

A verify row's D draft tokens are tree nodes. sglang hands the tree to its linear-attention backends as two
int64 ``[r, D]`` link tables on the verify input (``retrieve_next_token``: first child or -1,
``retrieve_next_sibling``: next sibling or -1); the backend passes them through its metadata (eager) or copies
them into per-bucket int32 buffers (a graph replay), beside an empty ``retrieve_parent_token`` that the verify
forward's first kernel fills. Three pieces:

- :func:`verify_input`: the real ``EagleVerifyInput`` the EAGLE worker builds for a tree (and the graph
  runner's capture one, links None);
- :func:`derive_parents`: the parents sglang derives from the metadata's links, by running its own
  derivation: the Triton conv kernel ``causal_conv1d_update`` that GDN's, Mamba2's and KDA's verify forward
  call first, in Triton's interpreter, on the metadata's own tensors (the kernel is the only place sglang
  derives them; there is no torch or host fallback in 0.5.23);
- :func:`drive_verify_forward`: a verify forward whose kernels are device-only (Ascend's ``torch.ops.npu``
  ops, ``sgl_kernel_npu``'s Triton kernels) run with those kernels recorded, so what reaches them can be
  compared between a tree and a chain of the same rows (:mod:`workbench.engines.tree_check`).

What stands in for what, and why, is in :data:`TREE_STANDINS`. Nothing here imports sglang: the adapter hands
in what it imported.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.engines.instance_hooks import patch
from workbench.engines.standins import Placeholder
from workbench.engines.versions import EngineError

TREE_FIELDS = ("retrieve_next_token", "retrieve_next_sibling", "retrieve_parent_token")
"""The forward metadata's tree fields, as sglang names them (and ``workbench.metadata.Metadata``)."""

CONV_KERNEL = "sglang.kernels.ops.mamba.causal_conv1d_triton.causal_conv1d_update"
"""Where sglang derives a tree's parents: the conv kernel of GDN's, Mamba2's and KDA's verify forward."""

_CONV_WIDTH = 4  # GDN's conv kernel; the parents do not depend on it

TREE_STANDINS: tuple[tuple[str, str], ...] = (
    (
        "triton.runtime.interpreter.InterpreterBuilder.create_splat",
        "while derive_parents runs sglang's conv kernel: Triton 3.9's interpreter keeps a scalar comparison's "
        "operand dtype on its handle, so splatting it into a block mask gives an int64 mask that tl.load refuses "
        "('mask has unsupported dtype'); compiled, that value is an i1, so a splat of bool data stays bool",
    ),
    (
        "the conv kernel's data (x, conv state, weights)",
        "zeros of one channel: derive_parents reads back only retrieve_parent_token, which the kernel computes from "
        "the links and the state indices alone (a row on the pad slot -1 is skipped, as in the forward); the "
        "verify scratch (intermediate_conv_window) is not passed, as it does not touch the parents",
    ),
    (
        "torch.ops.npu.<op>",
        "drive_verify_forward only: Ascend's fused kernels (torch_npu, absent on a CPU) recorded with their "
        "arguments and answered with zeros of their output's shape",
    ),
    (
        "sgl_kernel_npu functions the forward calls",
        "drive_verify_forward only: recorded and answered with zeros of their outputs' shapes "
        "(fused_gdn_gating_kernel_without_sigmoid: the gates g and beta, one per token and value head)",
    ),
    (
        "req_to_token_pool.mamba2_layer_cache",
        "drive_verify_forward only: a REAL MambaPool.SpeculativeState of small zero tensors (the layer's conv and "
        "SSM states, the verify scratch): the recorded kernels never read their values",
    ),
    (
        "the layer",
        "drive_verify_forward only: an attribute bag with one head of 2 dims per q/k/v, a width-4 conv, zero "
        "weights; the input mixed_qkv, a and b are zeros of the batch's token count",
    ),
)
"""The stand-ins of the tree paths, each with its reason."""


# -- the verify input -------------------------------------------------------------------------------------


def verify_input(
    verify_cls: Any,
    hidden_mode: Any,
    *,
    topk: int,
    draft_tokens: int,
    next_token: torch.Tensor | None = None,
    next_sibling: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    seq_lens: torch.Tensor | None = None,
) -> Any:
    """An ``EagleVerifyInput`` of a tree verify: the links int64 ``[r, D]`` as ``build_tree_kernel_efficient``
    leaves them (and ``retrieve_index`` its ``b * D + i``), ``topk``, D; without links, the graph runner's capture
    input (``get_spec_info``: every tensor None)."""
    if next_token is None or next_sibling is None:
        return verify_cls(
            draft_token=None,
            custom_mask=None,
            positions=None,
            retrieve_index=None,
            retrieve_next_token=None,
            retrieve_next_sibling=None,
            retrieve_cum_len=None,
            spec_steps=draft_tokens - 1,
            topk=topk,
            draft_token_num=draft_tokens,
            capture_hidden_mode=hidden_mode.FULL,
            seq_lens_sum=None,
            seq_lens_cpu=None,
        )
    r, d = next_token.shape
    if d != draft_tokens or tuple(next_sibling.shape) != (r, d):
        raise EngineError(
            f"tree: links of shape {tuple(next_token.shape)} / {tuple(next_sibling.shape)} for D={draft_tokens}"
        )
    seq = seq_lens.to(torch.int64) if seq_lens is not None else None
    return verify_cls(
        draft_token=torch.zeros(r * d, dtype=torch.int64),
        custom_mask=None,  # the attention mask: no metadata code reads it
        positions=positions,
        retrieve_index=torch.arange(r * d, dtype=torch.int64).view(r, d),
        retrieve_next_token=next_token.to(torch.int64).clone(),
        retrieve_next_sibling=next_sibling.to(torch.int64).clone(),
        retrieve_cum_len=None,
        spec_steps=d - 1,  # a bound of the tree's depth (max_tree_depth = spec_steps + 1)
        topk=topk,
        draft_token_num=d,
        capture_hidden_mode=hidden_mode.FULL,
        seq_lens_sum=None if seq is None else int(seq.sum()),
        seq_lens_cpu=None if seq is None else seq.clone(),
    )


# -- the parents, by sglang's own kernel ------------------------------------------------------------------


@contextlib.contextmanager
def _bool_splat() -> Iterator[None]:
    """:data:`TREE_STANDINS`' interpreter fix, while the block runs."""
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    original = builder.create_splat

    def create_splat(self: Any, ret_ty: Any, arg: Any) -> Any:
        out = original(self, ret_ty, arg)
        if np.asarray(arg.data).dtype == np.bool_ and out.data.dtype != np.bool_:
            return interpreter.TensorHandle(out.data.astype(np.bool_), interpreter.tl.int1)
        return out

    builder.create_splat = create_splat
    try:
        yield
    finally:
        builder.create_splat = original


def interpreted(conv_module: types.ModuleType) -> str | None:
    """None when sglang's conv kernel runs in Triton's interpreter here; else why not (one line)."""
    kernel = getattr(conv_module, "_causal_conv1d_update_kernel", None)
    if kernel is None or isinstance(kernel, Placeholder):
        return (
            f"{CONV_KERNEL} needs Triton (it derives a tree's parents), and only a stand-in is here: pip install "
            "triton, then run with TRITON_INTERPRET=1"
        )
    if type(kernel).__name__ != "InterpretedFunction":
        return (
            f"{CONV_KERNEL} derives a tree's parents and runs on a CPU only in Triton's interpreter: set "
            "TRITON_INTERPRET=1 before sglang is imported (workbench engine-check --topk K sets it)"
        )
    return None


def derive_parents(
    conv_module: types.ModuleType,
    state_indices: torch.Tensor,
    next_token: torch.Tensor,
    next_sibling: torch.Tensor,
    parent: torch.Tensor,
    num_slots: int,
) -> torch.Tensor:
    """Run sglang's ``causal_conv1d_update`` as a verify forward calls it, on the metadata's own link tensors and
    ``parent`` (its ``retrieve_parent_token``, written in place: a replay's static buffer stays written, as after
    a forward), over ``state_indices[:bs]``; returns ``parent``. A row on the pad slot (-1) is skipped by the
    kernel, so its parents stay what they were."""
    why = interpreted(conv_module)
    if why is not None:
        raise EngineError(why)
    bs, d = next_token.shape
    x = torch.zeros(bs, 1, d)  # (batch, dim, seqlen): one channel
    conv_state = torch.zeros(num_slots, 1, _CONV_WIDTH - 1)
    with _bool_splat():
        conv_module.causal_conv1d_update(
            x,
            conv_state,
            torch.zeros(1, _CONV_WIDTH),
            None,
            "silu",
            conv_state_indices=state_indices[:bs].to(torch.int32),
            retrieve_next_token=next_token,
            retrieve_next_sibling=next_sibling,
            retrieve_parent_token=parent,
        )
    return parent


# -- a verify forward with device-only kernels, recorded ----------------------------------------------------


@dataclass(frozen=True)
class KernelCall:
    """One kernel call of a driven forward: its name, its arguments (tensors cloned when called) and the
    storages of its tensor arguments (to tell which metadata tensors reached it)."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    storages: frozenset[int] = frozenset()

    def same_as(self, other: KernelCall) -> bool:
        """The same kernel with bitwise-equal arguments."""
        if self.name != other.name or len(self.args) != len(other.args) or self.kwargs.keys() != other.kwargs.keys():
            return False
        pairs = list(zip(self.args, other.args, strict=True)) + [(v, other.kwargs[k]) for k, v in self.kwargs.items()]
        return all(_equal(a, b) for a, b in pairs)


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(torch.equal(a, b))
        )
    return bool(a == b)


def _storage(t: torch.Tensor) -> int:
    return int(t.untyped_storage().data_ptr())


@dataclass
class VerifyForward:
    """A driven verify forward: the method, its kernel calls in order, and which of the metadata's tree
    tensors (:data:`TREE_FIELDS`) reached which kernel (by storage)."""

    method: str
    calls: list[KernelCall] = field(default_factory=list)
    tree_tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def kernels(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.name for c in self.calls))

    def passed(self) -> dict[str, list[str]]:
        """Tree field -> the kernels that got it (or a view of it)."""
        out: dict[str, list[str]] = {}
        for name, tensor in self.tree_tensors.items():
            where = _storage(tensor)
            out[name] = list(dict.fromkeys(c.name for c in self.calls if where in c.storages))
        return out

    def same_as(self, other: VerifyForward) -> bool:
        """The same kernels called in the same order with bitwise-equal arguments."""
        return len(self.calls) == len(other.calls) and all(
            a.same_as(b) for a, b in zip(self.calls, other.calls, strict=True)
        )


class _Recorder:
    """Records kernel calls into ``forward``; each answers with its output builder's tensor."""

    def __init__(self, forward: VerifyForward) -> None:
        self.forward = forward

    def kernel(self, name: str, output: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
            self.forward.calls.append(
                KernelCall(
                    name,
                    tuple(_snapshot(a) for a in args),
                    {k: _snapshot(v) for k, v in kwargs.items()},
                    frozenset(_storage(t) for t in tensors),
                )
            )
            return output(*args, **kwargs)

        call.__qualname__ = f"recorded {name}"
        return call


def _snapshot(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


class _NpuOps:
    """``torch.ops.npu`` while a forward is driven: the ops of ``outputs`` recorded; any other op refused by
    name (the forward called an NPU op the recorder has no output shape for)."""

    def __init__(self, recorder: _Recorder, outputs: dict[str, Callable[..., Any]], method: str) -> None:
        self._recorder, self._outputs, self._method = recorder, outputs, method

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name not in self._outputs:
            raise EngineError(
                f"{self._method} called torch.ops.npu.{name}, which the workbench's recorder does not answer "
                f"(it answers {', '.join(sorted(self._outputs))})"
            )
        return self._recorder.kernel(f"torch.ops.npu.{name}", self._outputs[name])


@dataclass(frozen=True)
class TinyLayer:
    """The layer a driven verify forward runs: one q/k/v head of 2 dims each, a width-4 conv."""

    heads: int = 1
    head_dim: int = 2

    def bag(self) -> types.SimpleNamespace:
        h, k = self.heads, self.head_dim
        conv_dim = 3 * h * k
        return types.SimpleNamespace(
            layer_id=0,
            num_q_heads=h,
            num_k_heads=h,
            num_v_heads=h,
            head_q_dim=k,
            head_k_dim=k,
            head_v_dim=k,
            q_dim=h * k,
            k_dim=h * k,
            v_dim=h * k,
            conv_weights=torch.zeros(conv_dim, _CONV_WIDTH),
            bias=None,
            activation="silu",
            A_log=torch.zeros(h),
            dt_bias=torch.zeros(h),
        )


def _npu_outputs(layer: types.SimpleNamespace) -> dict[str, Callable[..., Any]]:
    """Output builders of the NPU ops a GDN verify forward calls (zeros of the shapes the forward reshapes)."""

    def conv(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.zeros_like(x)

    def recurrent(mix_qkv: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        b, t = mix_qkv.shape[:2]
        return torch.zeros(b, t, layer.num_v_heads, layer.head_v_dim, dtype=mix_qkv.dtype)

    return {"causal_conv1d": conv, "recurrent_gated_delta_rule": recurrent}


def _gates(a_log: torch.Tensor, a: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``fused_gdn_gating_kernel_without_sigmoid``'s (g, beta): float32 ``[1, tokens, heads]`` each."""
    shape = (1, *a.shape)
    return torch.zeros(shape), torch.zeros(shape)


STANDIN_FUNCTIONS: dict[str, Callable[..., Any]] = {"fused_gdn_gating_kernel_without_sigmoid": _gates}
"""Device-only functions a driven forward calls by a module-level name, and their output builders."""


@contextlib.contextmanager
def _npu_namespace(ops: _NpuOps) -> Iterator[None]:
    """``torch.ops.npu`` is ``ops`` while the block runs (torch creates the namespace lazily and caches it on
    ``torch.ops``; what was cached is put back)."""
    cached = vars(torch.ops).get("npu")
    setattr(torch.ops, "npu", ops)  # noqa: B010
    try:
        yield
    finally:
        if cached is None:
            delattr(torch.ops, "npu")
        else:
            setattr(torch.ops, "npu", cached)  # noqa: B010


def drive_verify_forward(
    backend: Any,
    method: str,
    forward_batch: Any,
    state_cls: Any,
    num_slots: int,
    rows: int,
    draft_tokens: int,
) -> VerifyForward:
    """Run ``backend.<method>(layer, forward_batch, mixed_qkv, a, b)`` (a verify forward after the backend's
    metadata call) with its device-only kernels recorded (:data:`TREE_STANDINS`); ``state_cls`` is
    ``MambaPool.SpeculativeState``. The metadata's tree tensors are kept beside the calls."""
    name = f"{type(backend).__name__}.{method}"
    out = VerifyForward(name)
    meta = backend.forward_metadata
    out.tree_tensors = {f: getattr(meta, f) for f in TREE_FIELDS if isinstance(getattr(meta, f, None), torch.Tensor)}
    tiny = TinyLayer()
    layer = tiny.bag()
    n = rows * draft_tokens
    h, k = tiny.heads, tiny.head_dim
    conv_dim = 3 * h * k
    state = state_cls(
        conv=[torch.zeros(num_slots, _CONV_WIDTH - 1, conv_dim)],
        temporal=torch.zeros(num_slots, h, k, k),
        intermediate_ssm=torch.zeros(rows + 1, draft_tokens, h, k, k),
        intermediate_conv_window=[torch.zeros(rows + 1, draft_tokens, _CONV_WIDTH - 1, conv_dim)],
    )
    recorder = _Recorder(out)
    func = getattr(type(backend), method)
    namespace = getattr(func, "__globals__", {})
    swapped = {g: namespace[g] for g in STANDIN_FUNCTIONS if g in namespace}
    restore = patch(backend.req_to_token_pool, "mamba2_layer_cache", lambda layer_id: state)
    try:
        for g in swapped:
            namespace[g] = recorder.kernel(_qualified(swapped[g], g), STANDIN_FUNCTIONS[g])
        with _npu_namespace(_NpuOps(recorder, _npu_outputs(layer), name)):
            getattr(backend, method)(
                layer,
                forward_batch,
                torch.zeros(n, conv_dim),
                torch.zeros(n, h),
                torch.zeros(n, h),
            )
    finally:
        namespace.update(swapped)
        restore()
    return out


def _qualified(func: Any, name: str) -> str:
    """``sgl_kernel_npu.fla.fused_gdn_gating.fused_gdn_gating_kernel_without_sigmoid`` (a stand-in's own name, a
    real function's module and name)."""
    if isinstance(func, Placeholder):
        return repr(func).removeprefix("<stand-in ").removesuffix(">")
    module = getattr(func, "__module__", None)
    return f"{module}.{name}" if module else name


__all__ = [
    "CONV_KERNEL",
    "STANDIN_FUNCTIONS",
    "TREE_FIELDS",
    "TREE_STANDINS",
    "KernelCall",
    "TinyLayer",
    "VerifyForward",
    "derive_parents",
    "drive_verify_forward",
    "interpreted",
    "verify_input",
]
