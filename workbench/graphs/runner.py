"""GraphRunner: capture a layer step per bucket, then pad, update metadata in place and replay, as engines do.

Capture follows the engine: for each mode and bucket (largest first), put the bucket's metadata in its
capture state through ``init_forward_metadata_out_graph(batch, in_capture=True)`` (every row points at
the dummy slot), run the step eagerly for warm-up, then capture it. Replay picks the bucket (bisect-left),
writes the batch's metadata into the bucket's static buffers, copies the live inputs into the static
input buffer, replays, and returns the live rows of the static output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.backends import MetadataBackend, metadata_backend_for
from workbench.batch import Batch
from workbench.errors import MetadataError, WorkbenchError
from workbench.graphs import Graph, get_backend
from workbench.layers import Intermediate, LayerState, float64_reference
from workbench.measure.integrity import IntegrityReport, check
from workbench.metadata import Metadata, build_metadata, validate
from workbench.pool import StatePool
from workbench.profiles import get_profile


@dataclass
class StepResult:
    """One step's output (``[live tokens, hidden]``) and how it ran."""

    output: torch.Tensor
    mode: str
    raw_batch_size: int
    bucket: int | None
    replayed: bool
    reason: str | None = None


@dataclass
class Comparison:
    """Replay vs eager on the same batch and inputs, and the integrity report of the replay."""

    bucket: int | None
    replayed: bool
    bitwise_equal: bool
    max_output_diff: float
    max_state_diff: float
    integrity: IntegrityReport
    expect_bitwise: bool = True
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Integrity clean, and replay bitwise equal to eager where that is expected (the CPU recorder runs
        the very same kernels; a device graph may pick other kernels than eager)."""
        return self.integrity.ok and (self.bitwise_equal or not self.expect_bitwise)

    def to_dict(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "replayed": self.replayed,
            "bitwise_equal": self.bitwise_equal,
            "max_output_diff": self.max_output_diff,
            "max_state_diff": self.max_state_diff,
            "ok": self.ok,
            "integrity": self.integrity.to_dict(),
            **self.details,
        }


def tokens_per_row(mode: str, draft_tokens: int) -> int:
    """Tokens each batch row carries in a graph mode."""
    return draft_tokens if mode == "target_verify" else 1


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
        state: the layer's state pool tensors (default: zeros).
        metadata_backend: a ``MetadataBackend`` subclass to prototype (default: the graph backend's family).
        validate_metadata: after each in-place update, run ``validate`` on the bucket's metadata (host reads:
            a debugging aid that catches e.g. a request that is not allocated, which would point at the
            dummy slot).
    """

    def __init__(
        self,
        layer: Any,
        pool: StatePool,
        profile: str | None = None,
        *,
        buckets: Sequence[int] | dict[str, Sequence[int]] | None = None,
        draft_tokens: int = 2,
        modes: Sequence[str] | None = None,
        backend: str = "auto",
        state: LayerState | None = None,
        metadata_backend: type[MetadataBackend] | None = None,
        validate_metadata: bool = False,
    ) -> None:
        if profile is not None and get_profile(profile).name != pool.profile.name:
            raise MetadataError(f"profile: {profile!r} given, but the pool follows {pool.profile.name!r}")
        self.layer, self.pool, self.draft_tokens = layer, pool, draft_tokens
        self.validate_metadata = validate_metadata
        self.graph_backend = get_backend(backend, device=pool.device if backend == "auto" else None)
        wanted = modes or ("decode", "target_verify")
        self.modes = tuple(m for m in wanted if m in layer.supported_modes)
        if not self.modes:
            raise MetadataError(f"modes: {tuple(wanted)} none supported by {type(layer).__name__}")
        cls = metadata_backend or metadata_backend_for(self.graph_backend.name)
        self.meta_backend = cls(pool, buckets, draft_tokens, modes=self.modes)
        self.state = state if state is not None else layer.new_state(pool.num_slots)
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
        self.graphs: dict[tuple[str, int], Graph] = {}
        self.last_metadata: Metadata | None = None

    def buckets(self, mode: str) -> list[int]:
        return self.meta_backend.buffers[mode].buckets

    # -- capture ---------------------------------------------------------------------------------------
    def capture(self, *, warmup: int = 2, progress: bool = True) -> None:
        """Capture every bucket of every mode, largest first, sharing one memory pool."""
        from tqdm.auto import tqdm

        mem_pool = self.graph_backend.new_pool()
        todo = [(m, bs) for m in self.modes for bs in reversed(self.buckets(m))]
        for mode, bs in tqdm(todo, desc=f"capture ({self.graph_backend.name})", disable=not progress):
            batch = Batch.for_capture(mode, bs, self.draft_tokens, device=self.pool.device)
            meta = self.meta_backend.init_forward_metadata_out_graph(batch, in_capture=True)
            x = self.static_x[mode][: bs * tokens_per_row(mode, self.draft_tokens)]
            inter = self.intermediate if mode == "target_verify" else None

            def step(batch: Batch = batch, meta: Metadata = meta, x: torch.Tensor = x, inter=inter) -> torch.Tensor:
                self.meta_backend.init_forward_metadata_in_graph(batch)
                return self.layer.forward(x, meta, self.state, inter)

            self.graphs[(mode, bs)] = self.graph_backend.capture(step, pool=mem_pool, warmup=warmup)

    # -- run -------------------------------------------------------------------------------------------
    def _check_inputs(self, batch: Batch, inputs: torch.Tensor, mode: str) -> int:
        n = batch.raw_batch_size * (0 if batch.mode == "idle" else tokens_per_row(mode, self.draft_tokens))
        hidden = self.layer.config.hidden_size
        if tuple(inputs.shape) != (n, hidden):
            raise MetadataError(f"inputs: expected shape ({n}, {hidden}) for {batch!r}, got {tuple(inputs.shape)}")
        if inputs.dtype != self.layer.dtype or inputs.device != self.pool.device:
            raise MetadataError(
                f"inputs: expected {self.layer.dtype} on {self.pool.device}, got {inputs.dtype} on {inputs.device}"
            )
        return n

    def replay(self, batch: Batch, inputs: torch.Tensor) -> StepResult:
        """Run ``batch`` through its bucket's graph (or eagerly above the largest bucket, saying so).

        The returned output is a view of the graph's static output: the next replay overwrites it.
        """
        mode = self.meta_backend.graph_mode_of(batch)
        n = self._check_inputs(batch, inputs, mode)
        bs = self.meta_backend.buffers[mode].bucket_for(batch.raw_batch_size)
        if bs is None:
            res = self.eager(batch, inputs)
            res.reason = (
                f"raw batch {batch.raw_batch_size} is above the largest captured bucket {self.buckets(mode)[-1]}"
            )
            return res
        graph = self.graphs.get((mode, bs))
        if graph is None:
            raise WorkbenchError(f"bucket {bs} of {mode!r} is not captured yet: call capture() first")
        self.last_metadata = self.meta_backend.init_forward_metadata_out_graph(batch)
        if self.validate_metadata:
            validate(self.last_metadata, self.pool)
        self._last_intermediate = self.intermediate
        self.static_x[mode][:n].copy_(inputs)  # padded input rows keep stale values, as in engines
        graph.replay()
        return StepResult(graph.outputs[:n], batch.mode, batch.raw_batch_size, bs, True)

    def eager(self, batch: Batch, inputs: torch.Tensor) -> StepResult:
        """Run ``batch`` eagerly (unpadded metadata, fresh tensors) on the runner's state."""
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
            self._eager_intermediate = self.layer.new_intermediate(r, self.draft_tokens)
        return self._eager_intermediate

    def accept(self, num_accepted: torch.Tensor | Sequence[int]) -> None:
        """After a verify step: scatter each live row's last accepted state back to its slot (sglang)."""
        meta = self.last_metadata
        if meta is None or meta.forward_mode != "target_verify":
            raise MetadataError("accept: the last step was not a target_verify step")
        acc = torch.as_tensor(num_accepted, dtype=torch.int32, device=self.pool.device)
        self.layer.accept(self.state, self._last_intermediate, meta, acc)

    # -- compare ---------------------------------------------------------------------------------------
    def compare(
        self, batch: Batch, inputs: torch.Tensor, *, atol: float | None = None, rtol: float | None = None
    ) -> Comparison:
        """Replay ``batch``; also run it eagerly on a copy of the state, padded the same way, and unpadded
        in float64.

        ``bitwise_equal``: replay and the padded eager step agree bit for bit on the live outputs and on
        every slot but the dummy (they run the same ops on the same shapes, so on the CPU any difference is
        a graph bug: stale metadata, a wrong address, a step that ran at capture only). The integrity report
        compares the replay with the float64 reference: foreign slots changed, live rows off, padded outputs
        not zero. The runner's state advances by the replay.
        """
        before = self.state.clone()
        verify = batch.mode == "target_verify"
        mode = self.meta_backend.graph_mode_of(batch)
        n = self._check_inputs(batch, inputs, mode)
        r, L = batch.raw_batch_size, tokens_per_row(mode, self.draft_tokens)
        bucket = self.meta_backend.buffers[mode].bucket_for(r)
        # eager, padded like the replay (the padded input rows hold what the static buffer holds)
        if bucket is None:
            meta_e, x_e = build_metadata(batch, self.pool, bucket=None), inputs
        else:
            meta_e = build_metadata(batch, self.pool, bucket=bucket, buckets=self.buckets(mode))
            x_e = torch.cat([inputs, self.static_x[mode][n : bucket * L]])
        st_e = before.clone()
        inter_e = self.layer.new_intermediate(meta_e.batch_size, self.draft_tokens) if verify else None
        out_e = self.layer.forward(x_e, meta_e, st_e, inter_e)[:n]
        # float64 reference, unpadded: the truth padding must not change
        meta_r = build_metadata(batch, self.pool, bucket=None)
        ref = float64_reference(self.layer)
        st_r = before.to(torch.float64)
        inter_r = ref.new_intermediate(r, self.draft_tokens, torch.float64) if verify else None
        out_r = ref.forward(inputs.double(), meta_r, st_r, inter_r)
        # replay
        res = self.replay(batch, inputs)
        out_g = res.output.clone()
        after = self.state.tensors()
        dummy = self.pool.profile.dummy_slot
        live_slots = sorted({int(s) for s in meta_r.state_indices.flatten().tolist()})
        extra, same_inter = {}, True
        if verify and meta_r.state_indices.dim() == 1:
            got = self._last_intermediate
            extra = {
                "intermediate.ssm": (got.ssm[:r], inter_r.ssm[:r]),
                "intermediate.conv": (got.conv[:r], inter_r.conv[:r]),
            }
            same_inter = torch.equal(got.ssm[:r], inter_e.ssm[:r]) and torch.equal(got.conv[:r], inter_e.conv[:r])
        padded = self.graphs[(mode, res.bucket)].outputs[n:] if res.replayed else None
        report = check(
            before.tensors(),
            after,
            allowed_slots=set(live_slots) | {dummy},
            live_slots=live_slots,
            reference_state=st_r.tensors(),
            live_outputs=out_g,
            reference_outputs=out_r,
            padded_outputs=padded,
            padded_offset=n,
            extra_pairs=extra,
            atol=atol,
            rtol=rtol,
        )
        keep = [s for s in range(self.pool.num_slots) if s != dummy]
        eager_state = st_e.tensors()
        state_diff = max(float((after[k][keep] - eager_state[k][keep]).abs().max()) for k in after)
        bitwise = (
            torch.equal(out_g, out_e)
            and same_inter
            and all(torch.equal(after[k][keep], eager_state[k][keep]) for k in after)
        )
        return Comparison(
            bucket=res.bucket,
            replayed=res.replayed,
            bitwise_equal=bitwise,
            max_output_diff=float((out_g - out_e).abs().max()) if n else 0.0,
            max_state_diff=state_diff,
            integrity=report,
            expect_bitwise=self.graph_backend.name == "cpu",
            details={"raw_batch_size": r, "mode": batch.mode, "reason": res.reason},
        )
