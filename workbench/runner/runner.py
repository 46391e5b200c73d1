"""GraphRunner: capture a layer step per bucket, then pad, update metadata in place and replay, as engines do.

Capture follows the engine: for each mode and bucket (largest first), put the bucket's metadata in its
capture state through ``init_forward_metadata_out_graph(batch, in_capture=True)`` (every row points at
the dummy slot), run the step eagerly for warm-up, then capture it. Replay picks the bucket (bisect-left),
writes the batch's metadata into the bucket's static buffers, copies the live inputs into the static
input buffer, replays, and returns the live rows of the static output.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from workbench import html
from workbench.backends import MetadataBackend, metadata_backend_for
from workbench.batch import Batch
from workbench.buckets import above_largest
from workbench.errors import MetadataError, WorkbenchError
from workbench.graphs import NAMES as BACKEND_NAMES
from workbench.graphs import Graph, get_backend
from workbench.graphs.base import check_warmup
from workbench.layers import Intermediate, LayerState
from workbench.limits import INT32_MAX, check_int, check_memory
from workbench.metadata import GRAPH_MODES, Metadata, tokens_per_row, validate
from workbench.pool import StatePool
from workbench.profiles import get_profile
from workbench.runner.compare import Comparison, compare_replay


class Layer(Protocol):
    """What the runner needs of a layer (``workbench.layers.GatedDeltaNetLayer`` and ``Mamba2Layer`` are ones).

    ``forward(x, meta, state, intermediate)`` takes ``x`` ``[tokens, hidden]`` of ``dtype`` and returns the
    same shape; it reads and writes ``state`` at ``meta.state_indices`` only.
    """

    config: Any
    dtype: torch.dtype
    supported_modes: tuple[str, ...]

    def forward(
        self, x: torch.Tensor, meta: Metadata, state: LayerState, intermediate: Intermediate | None = None
    ) -> torch.Tensor: ...
    def new_state(self, num_slots: int, *, seed: int | None = None, dtype: torch.dtype = ...) -> LayerState: ...
    def new_intermediate(self, max_bs: int, draft_tokens: int, dtype: torch.dtype = ...) -> Intermediate: ...
    def accept(
        self,
        state: LayerState,
        intermediate: Intermediate,
        meta: Metadata,
        num_accepted: torch.Tensor | None,
        *,
        accepted_steps: torch.Tensor | None = None,
    ) -> None: ...


@dataclass
class StepResult:
    """One step's output (``[live tokens, hidden]``) and how it ran."""

    output: torch.Tensor
    mode: str
    raw_batch_size: int
    bucket: int | None
    replayed: bool
    reason: str | None = None

    def __repr__(self) -> str:
        how = f"replayed bucket {self.bucket}" if self.replayed else "eager"
        why = f", reason={self.reason!r}" if self.reason else ""
        out = f"{list(self.output.shape)} {str(self.output.dtype).removeprefix('torch.')}"
        return f"StepResult({self.mode} raw_bs={self.raw_batch_size}, {how}, output {out}{why})"

    def _repr_html_(self) -> str:
        head = {"mode": self.mode, "raw_bs": self.raw_batch_size, "bucket": self.bucket, "replayed": self.replayed}
        shape = f"{list(self.output.shape)} {str(self.output.dtype).removeprefix('torch.')} on {self.output.device}"
        parts = [html.facts(head), html.note(f"output {shape}")]
        if self.reason:
            parts.append(html.note(f"ran eagerly: {self.reason}"))
        return html.block(*parts, title="StepResult")


def _ordinary_tensors() -> torch.inference_mode:
    """Inside a caller's ``torch.inference_mode`` (a trace replay's step), what the runner keeps across calls
    (the metadata backend's tensors, made on first use; the eager verify buffers) is made as ordinary tensors:
    an inference tensor could never again be written outside inference mode (a notebook's next call)."""
    return torch.inference_mode(False)


def _prod(shape: Sequence[int]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


def _check_runner_args(
    layer: object,
    pool: object,
    draft_tokens: object,
    modes: object,
    backend: object,
    state_seed: object,
    validate_metadata: object,
    tree: object = False,
) -> None:
    """GraphRunner's arguments, each alone, before anything is allocated."""
    missing = [a for a in ("forward", "new_state", "config", "dtype", "supported_modes") if not hasattr(layer, a)]
    if missing:
        raise MetadataError(
            f"layer: {type(layer).__name__} is not a workbench layer (it lacks {', '.join(missing)})", field="layer"
        )
    if not isinstance(pool, StatePool):
        raise MetadataError(f"pool must be a workbench.StatePool, got {type(pool).__name__}", field="pool")
    check_int("draft_tokens", draft_tokens, 1, INT32_MAX)
    if modes is not None:
        if isinstance(modes, str) or not isinstance(modes, Sequence):
            raise MetadataError(f"modes must be a list of graph modes, got {modes!r}", field="modes")
        for i, m in enumerate(modes):
            if m not in GRAPH_MODES:
                raise MetadataError(f"modes[{i}] = {m!r}: graphs are captured for {GRAPH_MODES}", field="modes", row=i)
    if backend not in BACKEND_NAMES:
        raise MetadataError(f"backend must be one of {BACKEND_NAMES}, got {backend!r}", field="backend")
    if state_seed is not None:
        check_int("state_seed", state_seed, 0)
    if not isinstance(validate_metadata, bool):
        raise MetadataError(f"validate_metadata must be a bool, got {validate_metadata!r}", field="validate_metadata")
    if not isinstance(tree, bool):
        raise MetadataError(f"tree must be a bool, got {tree!r}", field="tree")
    if tree and not pool.profile.tree_verify:
        raise MetadataError(
            f"tree: profile {pool.profile.name!r} verifies chains only (vLLM removed tree drafts); draft trees are "
            "sglang's (topk > 1)",
            field="tree",
        )


def _check_runner_parts(layer: Any, pool: StatePool, buckets: object, state: object, metadata_backend: object) -> None:
    """The per-mode bucket lists, a given state pool and a metadata backend class."""
    if isinstance(buckets, dict):
        for key in buckets:
            if key not in GRAPH_MODES:
                raise MetadataError(
                    f"buckets: key {key!r} is not a graph mode; keys are {GRAPH_MODES}", field="buckets"
                )
    if metadata_backend is not None and not (
        isinstance(metadata_backend, type) and issubclass(metadata_backend, MetadataBackend)
    ):
        raise MetadataError(
            f"metadata_backend must be a MetadataBackend subclass, got {metadata_backend!r}", field="metadata_backend"
        )
    if state is None:
        return
    if not isinstance(state, LayerState):
        raise MetadataError(
            f"state must be a LayerState (layer.new_state(num_slots)), got {type(state).__name__}", field="state"
        )
    shapes = getattr(layer, "_state_shapes", None)
    if shapes is not None:
        for name, got, want in zip(("conv", "ssm"), (state.conv, state.ssm), shapes(pool.num_slots), strict=True):
            if tuple(got.shape) != tuple(want):
                raise MetadataError(
                    f"state.{name}: shape {tuple(got.shape)}, expected {tuple(want)} "
                    f"for the pool's {pool.num_slots} slots",
                    field=f"state.{name}",
                )


class GraphRunner:
    """Captured graphs of one layer step for every bucket of decode and target-verify.

    Args:
        layer: a layer from ``workbench.layers`` (its ``forward(x, meta, state, intermediate)``).
        pool: the state pool; its profile decides padding.
        profile: optional, for readability: must name the pool's profile.
        buckets: captured batch sizes (one list, or per mode); default: the profile's list for the pool.
        draft_tokens: D of the target-verify graphs.
        modes: graph modes to capture (default: those of decode/target_verify the layer supports).
        backend: graph backend, "auto" | "cuda" | "npu" | "cpu" ("auto" follows the pool's device).
        state: the layer's state pool tensors (default: a new pool of ``pool.num_slots`` slots, drawn from
            ``state_seed`` when given, else zeros).
        state_seed: seed of the default state (ignored when ``state`` is given).
        metadata_backend: a ``MetadataBackend`` subclass to prototype (default: the graph backend's family).
        validate_metadata: after each in-place update, run ``validate`` on the bucket's metadata (host reads:
            a debugging aid that catches e.g. a request that is not allocated, which would point at the
            dummy slot).
        tree: the target-verify graphs verify draft trees (sglang's ``speculative_eagle_topk > 1``): their
            buffers carry each row's tree (``MetadataBuffers(..., tree=True)``), so every verify batch gives
            one (``Batch.target_verify(..., tree=DraftTree...)``; a chain is ``DraftTree.chain``), and
            :meth:`accept` commits each row's last accepted node (``accept_index``). Only a profile with
            ``tree_verify``.
    """

    def __init__(
        self,
        layer: Layer,
        pool: StatePool,
        profile: str | None = None,
        *,
        buckets: Sequence[int] | dict[str, Sequence[int]] | None = None,
        draft_tokens: int = 2,
        modes: Sequence[str] | None = None,
        backend: str = "auto",
        state: LayerState | None = None,
        state_seed: int | None = None,
        metadata_backend: type[MetadataBackend] | None = None,
        validate_metadata: bool = False,
        tree: bool = False,
    ) -> None:
        _check_runner_args(layer, pool, draft_tokens, modes, backend, state_seed, validate_metadata, tree)
        _check_runner_parts(layer, pool, buckets, state, metadata_backend)
        if profile is not None and get_profile(profile).name != pool.profile.name:
            raise MetadataError(
                f"profile: {profile!r} given, but the pool follows {pool.profile.name!r}", field="profile"
            )
        self.layer, self.pool, self.draft_tokens = layer, pool, draft_tokens
        self.validate_metadata = validate_metadata
        self.tree = tree
        self.graph_backend = get_backend(backend, device=pool.device if backend == "auto" else None)
        wanted = modes or ("decode", "target_verify")
        self.modes = tuple(m for m in wanted if m in layer.supported_modes)
        if not self.modes:
            raise MetadataError(f"modes: {tuple(wanted)} none supported by {type(layer).__name__}", field="modes")
        cls = metadata_backend or metadata_backend_for(self.graph_backend.name)
        # tree= only when asked: a backend written before trees (an engine's, a zoo case's) keeps its signature
        extra = {"tree": True} if tree else {}
        self.meta_backend: MetadataBackend = cls(pool, buckets, draft_tokens, modes=self.modes, **extra)
        self._check_memory(state is None)
        self.state = state if state is not None else layer.new_state(pool.num_slots, seed=state_seed)
        hidden = layer.config.hidden_size
        self.static_x = {
            m: torch.zeros(
                self.buckets(m)[-1] * tokens_per_row(m, draft_tokens), hidden, dtype=layer.dtype, device=pool.device
            )
            for m in self.modes
        }
        self.intermediate: Intermediate | None = None
        if "target_verify" in self.modes:
            self.intermediate = layer.new_intermediate(self.buckets("target_verify")[-1], draft_tokens)
        self._eager_intermediate: Intermediate | None = None
        self._last_intermediate: Intermediate | None = None
        self._graphs: dict[tuple[str, int], Graph] = {}
        self._lazy = False  # capture(lazy=True): a bucket not captured yet is captured when first replayed
        self._mem_pool: Any = None
        self._warmup = 2
        self.last_metadata: Metadata | None = None

    def _check_memory(self, new_state: bool) -> None:
        """The state pool, the static inputs and the verify buffers must fit the device, before allocating."""
        shapes = getattr(self.layer, "_state_shapes", None)
        slot_bytes = 0
        if shapes is not None:
            slot_bytes = 4 * sum(_prod(s[1:]) for s in shapes(1))  # float32 state per slot
        dev, d = self.pool.device, self.draft_tokens
        if new_state and slot_bytes:
            n = self.pool.num_slots
            check_memory(
                f"pool.num_slots={n}", n * slot_bytes, f"a layer state of {n:,} slots of {slot_bytes:,} B", dev
            )
        item = torch.empty((), dtype=self.layer.dtype).element_size()
        hidden = self.layer.config.hidden_size
        rows = sum(self.buckets(m)[-1] * tokens_per_row(m, d) for m in self.modes)
        largest = max(self.buckets(m)[-1] for m in self.modes)
        name = f"draft_tokens={d}" if "target_verify" in self.modes else f"buckets up to {largest}"
        check_memory(name, rows * hidden * item, f"static inputs of {rows:,} tokens", dev)
        if "target_verify" in self.modes and slot_bytes:
            n = self.buckets("target_verify")[-1] * d
            check_memory(f"draft_tokens={d}", n * slot_bytes, f"verify buffers for {n:,} tokens", dev)

    def buckets(self, mode: str) -> list[int]:
        """The captured batch sizes of ``mode``."""
        return self.meta_backend.buffers[mode].buckets

    def graph(self, mode: str, bs: int | None) -> Graph:
        """The captured graph of ``mode`` at bucket ``bs``; after ``capture(lazy=True)`` a bucket not captured
        yet is captured now. Raises when it is not captured (and not to be captured on use)."""
        g = self._graphs.get((mode, bs)) if bs is not None else None
        if g is None and self._lazy and bs is not None and mode in self.modes and bs in self.buckets(mode):
            g = self._capture_one(mode, bs)
        if g is None:
            raise WorkbenchError(
                f"bucket {bs} of {mode!r} is not captured"
                + ("" if self._graphs else ": call capture() first")
                + f"; captured: {sorted(self._graphs)}"
            )
        return g

    @property
    def captured(self) -> list[tuple[str, int]]:
        """``(mode, bucket)`` of every captured graph."""
        return sorted(self._graphs)

    def __repr__(self) -> str:
        buckets = "; ".join(f"{m} {html.short_list(self.buckets(m), 8)}" for m in self.modes)
        total = sum(len(self.buckets(m)) for m in self.modes)
        tree = ", draft trees" if self.tree else ""
        return (
            f"GraphRunner({type(self.layer).__name__}, profile={self.pool.profile.name!r}, "
            f"backend={self.graph_backend.name!r}, buckets {buckets}{tree}, captured {len(self._graphs)}/{total})"
        )

    def _repr_html_(self) -> str:
        head = {
            "layer": type(self.layer).__name__,
            "profile": self.pool.profile.name,
            "backend": self.graph_backend.name,
            "draft_tokens": self.draft_tokens,
        }
        if self.tree:
            head["drafts"] = "tree"
        rows, kinds = [], []
        for m in self.modes:
            done = sum((m, bs) in self._graphs for bs in self.buckets(m))
            rows.append([m, html.short_list(self.buckets(m)), f"{done}/{len(self.buckets(m))}"])
            kinds.append("ok" if done == len(self.buckets(m)) else "pad")  # grey: not captured (yet)
        table = html.table(["mode", "buckets", "captured"], rows, row_kinds=kinds)
        return html.block(html.facts(head), table, title="GraphRunner")

    @property
    def last_intermediate(self) -> Intermediate | None:
        """The verify intermediate buffer the last step wrote (None after a decode step)."""
        return self._last_intermediate

    # -- capture ---------------------------------------------------------------------------------------
    def capture(
        self,
        *,
        warmup: int = 2,
        progress: bool = True,
        lazy: bool = False,
        now: Iterable[tuple[str, int]] | None = None,
    ) -> None:
        """Capture every bucket of every mode, largest first, sharing one memory pool.

        ``lazy=True``: capture only the ``(mode, bucket)`` pairs in ``now`` (default none) at once, and every
        other bucket when a step first replays it (:meth:`replay`, :meth:`graph`): a trace that never runs a
        verify step captures no verify graph. A capture writes what it writes either way (the warm-up calls
        run the step on the capture metadata, every row on the dummy slot); only its moment differs, so
        capture at once what must be captured before any request is live. Buckets already captured are kept.
        """
        from tqdm.auto import tqdm

        check_warmup(warmup)  # now, not at a lazy capture's first replay
        if not isinstance(lazy, bool):
            raise MetadataError(f"lazy must be a bool, got {lazy!r}", field="lazy")
        if now is not None and not lazy:
            raise MetadataError("now: only with lazy=True (capture() without it captures every bucket)", field="now")
        self._warmup = warmup
        if self._mem_pool is None:
            self._mem_pool = self.graph_backend.new_pool()
        if lazy:
            todo = self._capture_pairs(now or ())
        else:
            todo = [(m, bs) for m in self.modes for bs in reversed(self.buckets(m))]
        todo = [pair for pair in todo if pair not in self._graphs]
        self._lazy = lazy
        # None: tqdm keeps quiet where stderr is no terminal (logs, CI); a notebook still shows its bar
        for mode, bs in tqdm(todo, desc=f"capture ({self.graph_backend.name})", disable=None if progress else True):
            self._capture_one(mode, bs)

    def _capture_pairs(self, pairs: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
        """``pairs`` checked (each a captured mode and one of its buckets), in capture order: by mode, largest
        bucket first."""
        wanted = set()
        for pair in pairs:
            mode, bs = pair if isinstance(pair, tuple) and len(pair) == 2 else (None, None)
            if mode not in self.modes or bs not in self.buckets(mode):
                raise MetadataError(
                    f"now: {pair!r} is not a (mode, bucket) of this runner: modes {self.modes}, buckets "
                    + "; ".join(f"{m} {self.buckets(m)}" for m in self.modes),
                    field="now",
                )
            wanted.add((mode, bs))
        return [(m, bs) for m in self.modes for bs in reversed(self.buckets(m)) if (m, bs) in wanted]

    def _capture_one(self, mode: str, bs: int) -> Graph:
        """Capture bucket ``bs`` of ``mode``: its metadata in capture state, warm-up, record."""
        batch = Batch.for_capture(mode, bs, self.draft_tokens, device=self.pool.device)
        with _ordinary_tensors():
            meta = self.meta_backend.init_forward_metadata_out_graph(batch, in_capture=True)
        x = self.static_x[mode][: bs * tokens_per_row(mode, self.draft_tokens)]
        inter = self.intermediate if mode == "target_verify" else None

        def step() -> torch.Tensor:
            self.meta_backend.init_forward_metadata_in_graph(batch)
            return self.layer.forward(x, meta, self.state, inter)

        graph = self.graph_backend.capture(step, pool=self._mem_pool, warmup=self._warmup)
        self._graphs[(mode, bs)] = graph
        return graph

    # -- run -------------------------------------------------------------------------------------------
    def check_inputs(self, batch: Batch, inputs: torch.Tensor, mode: str) -> int:
        """Raise unless ``inputs`` is ``[live tokens, hidden]`` of the layer's dtype on the pool's device;
        returns the number of live tokens."""
        n = batch.raw_batch_size * (0 if batch.mode == "idle" else tokens_per_row(mode, self.draft_tokens))
        hidden = self.layer.config.hidden_size
        if tuple(inputs.shape) != (n, hidden):
            raise MetadataError(
                f"inputs: expected shape ({n}, {hidden}) for {batch!r}, got {tuple(inputs.shape)}", field="inputs"
            )
        if inputs.dtype != self.layer.dtype or inputs.device != self.pool.device:
            raise MetadataError(
                f"inputs: expected {self.layer.dtype} on {self.pool.device}, got {inputs.dtype} on {inputs.device}",
                field="inputs",
            )
        return n

    def replay(self, batch: Batch, inputs: torch.Tensor) -> StepResult:
        """Run ``batch`` through its bucket's graph (or eagerly above the largest bucket, saying so).

        The returned output is a view of the graph's static output: the next replay overwrites it.
        """
        mode = self.meta_backend.graph_mode_of(batch)
        n = self.check_inputs(batch, inputs, mode)
        bs = self.meta_backend.buffers[mode].bucket_for(batch.raw_batch_size)
        if bs is None:
            res = self.eager(batch, inputs)
            res.reason = above_largest(batch.raw_batch_size, self.buckets(mode))
            return res
        graph = self.graph(mode, bs)
        with _ordinary_tensors():
            self.last_metadata = self.meta_backend.init_forward_metadata_out_graph(batch)
        if self.validate_metadata:
            validate(self.last_metadata, self.pool)
        self._last_intermediate = self.intermediate
        self.static_x[mode][:n].copy_(inputs)  # padded input rows keep stale values, as in engines
        graph.replay()
        return StepResult(graph.outputs[:n], batch.mode, batch.raw_batch_size, bs, True)

    def eager(self, batch: Batch, inputs: torch.Tensor) -> StepResult:
        """Run ``batch`` eagerly (unpadded metadata, fresh tensors) on the runner's state."""
        with _ordinary_tensors():
            meta = self.meta_backend.init_forward_metadata(batch)
        self.last_metadata = meta
        inter = self._intermediate_for(batch.raw_batch_size) if batch.mode == "target_verify" else None
        self._last_intermediate = inter
        out = self.layer.forward(inputs, meta, self.state, inter)
        return StepResult(out, batch.mode, batch.raw_batch_size, None, False)

    def _intermediate_for(self, r: int) -> Intermediate:
        """The graphs' verify buffers when ``r`` fits, else a larger eager-only one: the graphs recorded
        the addresses of theirs, so those are never replaced."""
        if self.intermediate is not None and self.intermediate.ssm.shape[0] >= r:
            return self.intermediate
        if self._eager_intermediate is None or self._eager_intermediate.ssm.shape[0] < r:
            with _ordinary_tensors():
                self._eager_intermediate = self.layer.new_intermediate(r, self.draft_tokens)
        return self._eager_intermediate

    def accept(
        self,
        num_accepted: torch.Tensor | Sequence[int],
        *,
        accept_index: torch.Tensor | Sequence[Sequence[int]] | None = None,
        accepted_steps: torch.Tensor | Sequence[int] | None = None,
    ) -> None:
        """After a verify step: scatter each live row's last accepted state back to its slot (sglang).

        ``num_accepted``: int ``[raw_bs]``, the tokens each row kept (1..D): a chain commits step
        ``num_accepted - 1``. ``accept_index``: int ``[raw_bs, W]``, sglang's verify outcome under draft trees:
        row ``b``'s accepted root-first path as global node ids ``b * D + node``, -1 past it; each row commits
        its last accepted node, ``accept_index[b, num_accepted[b] - 1] - b * D`` (sglang's
        ``last_correct_step_indices``; a commit that took the depth ``num_accepted - 1`` for the node was
        sglang PR 27463's bug). ``accepted_steps``: int ``[raw_bs]``, the node each row commits, given
        directly (what an engine committed). Both need a profile with ``tree_verify``; the host reads here
        are the engine's too (the commit runs eagerly, after the graph).
        """
        meta = self.last_metadata
        if meta is None or meta.forward_mode != "target_verify":
            raise MetadataError("accept: the last step was not a target_verify step", field="accept")
        acc = torch.as_tensor(num_accepted, dtype=torch.int32, device=self.pool.device)
        if self._last_intermediate is None:
            raise MetadataError("accept: the last verify step left no intermediate states", field="accept")
        for name, given in (("accept_index", accept_index), ("accepted_steps", accepted_steps)):
            if given is not None and not self.pool.profile.tree_verify:
                raise MetadataError(
                    f"{name}: profile {self.pool.profile.name!r} commits chains by count (no tree verify: vLLM "
                    "removed tree drafts); give num_accepted alone",
                    field=name,
                )
        if accept_index is not None and accepted_steps is not None:
            raise MetadataError("accepted_steps: give accept_index or accepted_steps, not both", field="accepted_steps")
        steps = None
        if accept_index is not None:
            steps = self._last_accepted(accept_index, acc, meta.raw_batch_size, meta.draft_tokens)
        elif accepted_steps is not None:
            steps = torch.as_tensor(accepted_steps, dtype=torch.int32, device=self.pool.device)
        extra = {} if steps is None else {"accepted_steps": steps}  # a chain: the call a layer always took
        self.layer.accept(self.state, self._last_intermediate, meta, acc, **extra)

    def _last_accepted(self, accept_index: Any, acc: torch.Tensor, r: int, d: int) -> torch.Tensor:
        """Each row's last accepted node: ``accept_index[b, num_accepted[b] - 1] - b * D``, read on the host and
        checked to be one of row ``b``'s nodes (global ids ``b * D .. b * D + D - 1``)."""
        idx = torch.as_tensor(accept_index, dtype=torch.int64).cpu()
        if idx.dim() != 2 or idx.shape[0] != r:
            raise MetadataError(
                f"accept_index: expected shape ({r}, W), one row of global node ids per live row, got "
                f"{tuple(idx.shape)}",
                field="accept_index",
            )
        out = []
        for b, n in enumerate(acc.tolist()):
            if not 1 <= n <= idx.shape[1]:
                raise MetadataError(
                    f"num_accepted[{b}] = {n}: accept_index holds {idx.shape[1]} nodes per row", field="num_accepted"
                )
            g = int(idx[b, n - 1])
            if not b * d <= g < (b + 1) * d:
                raise MetadataError(
                    f"accept_index[{b}, {n - 1}] = {g}: not a node of row {b} (global ids {b * d}..{b * d + d - 1})",
                    field="accept_index",
                    row=b,
                )
            out.append(g - b * d)
        return torch.tensor(out, dtype=torch.int32, device=self.pool.device)

    # -- compare ---------------------------------------------------------------------------------------
    def compare(
        self, batch: Batch, inputs: torch.Tensor, *, atol: float | None = None, rtol: float | None = None
    ) -> Comparison:
        """Replay ``batch`` and compare it with the same padded step run eagerly and with the float64
        reference (see :func:`workbench.runner.compare.compare_replay`). The runner's state advances."""
        return compare_replay(self, batch, inputs, atol=atol, rtol=rtol)
