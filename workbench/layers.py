"""Linear-attention layer steps wired to the metadata and the state pool (eager and graph run this code).

Each layer reads only ``Metadata`` tensors (never host copies of them), so the same ``forward`` is what a
graph records: shapes and the forward mode are fixed at capture, values change between replays.
Weights are deterministic for a seed; ``.to(torch.float64)`` gives the float64 reference of a layer.

Token layout: ``x`` is ``[T, hidden]`` with ``T = batch_size * L`` (L = 1 decode, D verify) for graph
modes, or the packed extend tokens. Padded rows are zero-length at the tail, so token ``t`` is live iff
``t < query_start_loc[-1]``; the outputs of the other tokens are written as zeros.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, ClassVar, NamedTuple, TypeVar

import torch
import torch.nn.functional as F

import kernels.causal_conv1d as conv1d
import kernels.gated_delta_rule as gdn
import kernels.mamba2 as mamba2
from kernels.conventions import DEFAULT_STATE_LAYOUT, STATE_LAYOUTS, state_dims
from kernels.dtypes import cast
from kernels.padding import skipped_rows
from workbench import html
from workbench.devices import canonical_device
from workbench.errors import MetadataError, WorkbenchError
from workbench.layer_names import GDN, KDA, MAMBA2, PRESET_NAMES
from workbench.metadata import Metadata


def _weight(gen: torch.Generator, *shape: int, fan_in: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) / math.sqrt(fan_in)


def _gated_rmsnorm(
    o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, gate: Any = F.silu
) -> torch.Tensor:
    """RMS-normalise the last dim of ``o``, scale, and gate with ``gate(z)``: silu (Gated DeltaNet / Mamba2
    output norm) or sigmoid (Kimi Linear's ``o_norm``)."""
    o32 = cast(o, torch.promote_types(o.dtype, torch.float32))
    normed = o32 * torch.rsqrt(o32.pow(2).mean(-1, keepdim=True) + eps)
    return cast(normed * weight * gate(cast(z, normed.dtype)), o.dtype)


def _live_tokens(y: torch.Tensor, meta: Metadata) -> torch.Tensor:
    """Zero the outputs of tokens that belong to no live row (tensor ops only: no host read)."""
    t = torch.arange(y.shape[0], device=y.device)
    return torch.where((t < meta.query_start_loc[-1])[:, None], y, torch.zeros((), dtype=y.dtype, device=y.device))


@dataclass
class LayerState:
    """A layer's state pool: conv windows ``[num_slots, conv_dim, W-1]`` and SSM states (float32), the SSM
    states in the layer's ``state_layout`` (GDN ``[num_slots, HV, K, V]`` k_first or ``[num_slots, HV, V, K]``
    v_first)."""

    conv: torch.Tensor
    ssm: torch.Tensor

    def clone(self) -> LayerState:
        return LayerState(self.conv.clone(), self.ssm.clone())

    def to(self, dtype: torch.dtype) -> LayerState:
        return LayerState(self.conv.to(dtype), self.ssm.to(dtype))

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"conv": self.conv, "ssm": self.ssm}


@dataclass
class Intermediate:
    """Per-step verify buffers indexed by batch row: conv windows ``[bs, D, conv_dim, W-1]``, SSM states."""

    conv: torch.Tensor
    ssm: torch.Tensor


class Tolerance(NamedTuple):
    """How far a value may be off its reference: ``|got - ref| <= atol + rtol * |ref|``."""

    atol: float
    rtol: float


FLOAT32_TOLERANCE = Tolerance(atol=2e-4, rtol=2e-3)
"""A float32 layer step against its float64 reference, on the small test layers: the one pair the trace replay
(states, accepts, checkpoints) and ``measure.integrity`` (its float32 default) compare with."""


class _SeededLayer:
    """What both layer steps share: seeded weights, dtype/impl copies, a state pool of their shapes.

    Subclasses set ``config_class`` and ``supported_modes`` and define ``_draw_weights(config, gen)``,
    ``state_shapes(config, num_slots, state_layout=None)`` and ``token_macs(config)`` (static: read from a
    config alone, so the registry (:data:`LAYERS`) sizes a layer without drawing its weights).

    ``state_layouts``: the layouts of :data:`kernels.conventions.STATE_LAYOUTS` the layer's recurrent state may
    take (a gated-delta-rule or linear-attention ``K x V`` state); empty for a state with no layout choice
    (Mamba2's ``[H, headdim, dstate]``). A layer with a choice is built with ``state_layout`` (default
    ``"k_first"``, so older callers keep their pools; the workbench builds a layer for a profile with
    ``profile.state_layout``, "v_first" for the released engines) and keeps its pool, its verify buffers and
    every kernel call in it. A layer without one has ``state_layout`` None and ignores the argument, so a
    caller passes the profile's layout to any layer.
    """

    config_class: ClassVar[type]
    supported_modes: tuple[str, ...] = ()
    state_layouts: ClassVar[tuple[str, ...]] = ()
    chunk_grid: str = "sequence"
    """How the layer's prefill kernel lays out its chunk states ``h``: "sequence" (one grid per sequence,
    GDN's chunked kernels) or "batch" (one grid over the flattened batch, Mamba2's scan:
    ``kernels.mamba2.chunk_grid``). sglang's tracking reads ``h`` through it."""

    def __init__(
        self,
        config: Any = None,
        *,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        impl: str = "auto",
        state_layout: str | None = None,
    ) -> None:
        self.config = config or self.config_class()
        self.seed, self.impl = seed, impl
        self.state_layout = self._layout_of(state_layout)
        w = self._draw_weights(self.config, torch.Generator().manual_seed(seed))
        self.dtype, self.device = dtype, canonical_device(device)
        self.weights = {k: v.to(dtype=dtype, device=self.device) for k, v in w.items()}

    @classmethod
    def _layout_of(cls, state_layout: str | None) -> str | None:
        """The layout a layer of this class keeps: ``state_layout`` checked (default "k_first"), or None for a
        class whose state has no layout choice (the argument ignored)."""
        if not cls.state_layouts:
            return None
        if state_layout is None:
            return DEFAULT_STATE_LAYOUT
        if not isinstance(state_layout, str) or state_layout not in cls.state_layouts:
            raise LayerError(f"state_layout: {state_layout!r} is not one of {_choices(cls.state_layouts)}")
        return state_layout

    @staticmethod
    def _draw_weights(config: Any, gen: torch.Generator) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    @staticmethod
    def state_shapes(
        config: Any, num_slots: int, state_layout: str | None = None
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The pool's shapes for ``config``: conv windows ``[num_slots, ...]`` and SSM states ``[num_slots, ...]``
        in ``state_layout`` (None: the default, "k_first"; ignored by a layer without a layout choice)."""
        raise NotImplementedError

    @staticmethod
    def token_macs(config: Any) -> int:
        """Multiply-adds of one token through the layer: its projections, the conv and the recurrence."""
        raise NotImplementedError

    def _state_shapes(self, num_slots: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return self.state_shapes(self.config, num_slots, self.state_layout)

    def to(self, dtype: torch.dtype | None = None, impl: str | None = None) -> Any:
        """A copy with other weight dtype and/or kernel implementation (same seed, same values)."""
        other = type(self).__new__(type(self))
        other.config, other.seed, other.impl = self.config, self.seed, impl or self.impl
        other.state_layout = self.state_layout
        other.dtype = dtype or self.dtype
        other.device = self.device
        other.weights = {k: v.to(other.dtype) for k, v in self.weights.items()}
        return other

    def new_state(self, num_slots: int, *, seed: int | None = None, dtype: torch.dtype = torch.float32) -> LayerState:
        """A state pool for ``num_slots`` slots (conv windows, SSM states); random (never zeros) when ``seed``
        is given, else zeros."""
        conv, ssm = self._state_shapes(num_slots)
        if seed is None:
            zeros = (torch.zeros(s, dtype=dtype, device=self.device) for s in (conv, ssm))
            return LayerState(*zeros)
        g = torch.Generator().manual_seed(seed)
        return LayerState(*(0.5 * torch.randn(s, generator=g).to(dtype=dtype, device=self.device) for s in (conv, ssm)))

    @staticmethod
    def _read_slots(meta: Metadata, intermediate: Intermediate | None) -> tuple[torch.Tensor, bool]:
        """The slot each row reads, and whether the step is vLLM's per-slot verify (one slot per draft
        position: the row reads slot ``indices[n, num_accepted[n] - 1]``, the state the previous step
        accepted). A verify without its per-step buffers is refused."""
        verify = meta.forward_mode == "target_verify"
        if verify and intermediate is None:
            raise MetadataError(
                "intermediate: target_verify needs per-step buffers (layer.new_intermediate)", field="intermediate"
            )
        if not (verify and meta.state_indices.dim() == 2):
            return meta.state_indices, False
        assert meta.num_accepted_tokens is not None  # validate() guarantees it for [bs, D] indices
        pick = (meta.num_accepted_tokens.long() - 1).clamp(min=0).unsqueeze(1)
        return meta.state_indices.gather(1, pick).squeeze(1), True

    def new_intermediate(self, max_bs: int, draft_tokens: int, dtype: torch.dtype = torch.float32) -> Intermediate:
        """Verify buffers for ``max_bs`` rows of ``draft_tokens`` steps: each step's conv window and state."""
        conv, ssm = self._state_shapes(max_bs)
        return Intermediate(
            torch.zeros(conv[0], draft_tokens, *conv[1:], dtype=dtype, device=self.device),
            torch.zeros(ssm[0], draft_tokens, *ssm[1:], dtype=dtype, device=self.device),
        )

    @staticmethod
    def _write_steps_to_slots(
        state: LayerState, inter_conv: torch.Tensor, inter_ssm: torch.Tensor, slots: torch.Tensor, pad, dummy: int
    ) -> None:
        """vLLM spec decode: the state after draft step t of row n goes to slot ``slots[n, t]``.

        Entries the kernels skip (``<= pad``) are aimed at the dummy slot and write back its own current
        value, so nothing changes there: a fixed-shape write with no host read, as a graph needs.
        """
        flat = slots.reshape(-1).long()
        keep = ~skipped_rows(flat, pad)
        target = torch.where(keep, flat, torch.full_like(flat, dummy))
        for pool, steps in ((state.ssm, inter_ssm), (state.conv, inter_conv)):
            new = cast(steps.reshape(flat.numel(), *steps.shape[2:]), pool.dtype)
            mask = keep.view(-1, *([1] * (new.dim() - 1)))
            pool.index_copy_(0, target, torch.where(mask, new, pool.index_select(0, target)))

    def accept(
        self,
        state: LayerState,
        intermediate: Intermediate,
        meta: Metadata,
        num_accepted: torch.Tensor | None,
        *,
        accepted_steps: torch.Tensor | None = None,
    ) -> None:
        """After verify (sglang): the last accepted step's conv window and SSM state go back to live slots.

        ``num_accepted``: int ``[raw_bs]`` in 1..D, the tokens each row kept: a chain commits step
        ``num_accepted - 1``. ``accepted_steps``: int ``[raw_bs]`` in 0..D-1, the step each row commits
        instead, a draft tree's last accepted node (sglang's ``last_correct_step_indices``); with it
        ``num_accepted`` may be None. Both are checked on the host first (one small read; this runs eagerly,
        outside the graph, like the engine's), so the SSM and conv scatters always agree.
        vLLM's per-slot layout needs no accept step (every draft step already has its slot).
        """
        r, d = meta.raw_batch_size, meta.draft_tokens
        if meta.state_indices.dim() == 2:
            return
        if num_accepted is None and accepted_steps is None:
            raise MetadataError("num_accepted: give num_accepted or accepted_steps", field="num_accepted")
        # (name, tensor, lowest, highest, the range in words): the counts 1..D, the steps (tree nodes) 0..D-1
        given = [
            ("num_accepted", num_accepted, 1, d, f"1..D={d}"),
            ("accepted_steps", accepted_steps, 0, d - 1, f"0..D-1={d - 1}"),
        ]
        for name, t, lo, hi, text in given:
            if t is None:
                continue
            if tuple(t.shape) != (r,):
                raise MetadataError(f"{name}: expected shape ({r},), got {tuple(t.shape)}", field=name)
            for i, a in enumerate(t.tolist()):
                if not lo <= a <= hi:
                    raise MetadataError(f"{name}[{i}] = {a}: must be in {text}", field=name, row=i)
        idx = meta.state_indices[:r]
        if accepted_steps is not None:  # a tree's node: the kernel commits that step
            steps = accepted_steps.to(device=idx.device)
            pick = {"accepted_steps": steps}
        else:  # a chain: the last kept token's step
            assert num_accepted is not None  # one of the two, checked above
            acc = num_accepted.to(device=idx.device)
            steps, pick = acc - 1, {"num_accepted": acc}
        gdn.scatter_accepted(
            state.ssm, intermediate.ssm[:r], idx, **pick, pad_slot_id=meta.profile.kernel_pad_slot_id,
            impl=self.impl, state_layout=self.state_layout or DEFAULT_STATE_LAYOUT,
        )  # fmt: skip
        windows = intermediate.conv[torch.arange(r, device=idx.device), steps.long()]
        state.conv.index_copy_(0, idx.long(), cast(windows, state.conv.dtype))

    @staticmethod
    def _tree_args(meta: Metadata) -> dict[str, torch.Tensor]:
        """The draft tree of a tree verify, as the kernels take it (``retrieve_parent_token``, int32 ``[bs,
        D]``), or nothing: chains (and every step but a verify) pass no keyword, so a candidate kernel
        without it still runs them."""
        parents = meta.retrieve_parent_token
        if meta.forward_mode != "target_verify" or parents is None:
            return {}
        if meta.state_indices.dim() == 2:  # vLLM's slot per draft position: a chain by construction
            raise MetadataError(
                "retrieve_parent_token: a tree verify with one slot per draft position ([bs, D] state_indices); "
                "draft trees write per-step states by batch row (sglang)",
                field="retrieve_parent_token",
            )
        return {"retrieve_parent_token": parents}

    def __repr__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        layout = "" if self.state_layout in (None, DEFAULT_STATE_LAYOUT) else f", state_layout={self.state_layout!r}"
        return (
            f"{type(self).__name__}({self.config.summary()}, impl={self.impl!r}, {dtype}, device={self.device}{layout})"
        )

    def _repr_html_(self) -> str:
        head = {
            "impl": self.impl,
            "dtype": str(self.dtype).removeprefix("torch."),
            "device": self.device,
            "seed": self.seed,
            "modes": ", ".join(self.supported_modes),
        }
        if self.state_layout is not None:
            head["state layout"] = self.state_layout
        config = [[f.name, getattr(self.config, f.name)] for f in fields(self.config)]
        config.append(["conv_dim", self.config.conv_dim])
        weights = [[k, "x".join(map(str, w.shape))] for k, w in self.weights.items()]
        return html.block(
            html.facts(head),
            html.table(["config", "value"], config),
            html.table(["weight", "shape"], weights),
            title=type(self).__name__,
        )


# -- Gated DeltaNet ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GDNConfig:
    """Shapes of a Gated DeltaNet layer. Defaults are engine-like (a Qwen3-Next-sized layer)."""

    hidden_size: int = 2048
    num_k_heads: int = 16
    num_v_heads: int = 32
    head_k_dim: int = 128
    head_v_dim: int = 128
    conv_kernel: int = 4
    rms_eps: float = 1e-6

    @classmethod
    def small(cls) -> GDNConfig:
        """A tiny layer for tests and the Triton interpreter. ``head_k_dim`` (8) != ``head_v_dim`` (12) on
        purpose: a state read in the other layout (``[V, K]`` for ``[K, V]``) then has the wrong shape or the
        wrong values, where at K == V it would pass unseen."""
        return cls(hidden_size=32, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=12)

    @classmethod
    def quarter(cls) -> GDNConfig:
        """A quarter of the engine layer's value heads (half its width): its state pool fits a CPU bench. Head
        dims stay the engine's (K == V == 128): it is sized for timing, where the engine's shapes matter; the
        layouts are told apart by ``small`` (K != V)."""
        return cls(hidden_size=1024, num_v_heads=8, num_k_heads=4)

    @classmethod
    def engine(cls) -> GDNConfig:
        """The engine-like defaults (a Qwen3-Next-sized layer: K == V == 128, as the real model; at K == V a
        transposed state read has the right shape, so layout bugs show only in values or at ``small``)."""
        return cls()

    @property
    def conv_dim(self) -> int:
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim

    def summary(self) -> str:
        """The shapes on one line, for the layer's repr.

        >>> GDNConfig.small().summary()
        'hidden=32, heads k=2 v=4, head dims k=8 v=12, conv W=4'
        """
        return (
            f"hidden={self.hidden_size}, heads k={self.num_k_heads} v={self.num_v_heads}, "
            f"head dims k={self.head_k_dim} v={self.head_v_dim}, conv W={self.conv_kernel}"
        )


class GatedDeltaNetLayer(_SeededLayer):
    """Input projections -> short conv (update) -> fused gating + gated delta rule -> gated norm -> output.

    Args:
        config: shapes (default: ``GDNConfig()``, engine-like).
        seed: weights are drawn from this seed, so two layers with the same seed are identical.
        dtype, device: of the weights and activations (state pools are float32, or float64 for a reference).
        impl: kernel implementation, "auto" | "reference" | "triton".
        state_layout: how the recurrent state pool (and the verify buffers) lay out a value head's state:
            "k_first" ``[slots, HV, K, V]`` (the default) or "v_first" ``[slots, HV, V, K]`` (the released
            engines' pools: ``Profile.state_layout``). Every kernel call gets it.
    """

    config_class = GDNConfig
    supported_modes: tuple[str, ...] = ("decode", "target_verify", "extend", "idle")
    state_layouts = STATE_LAYOUTS

    @staticmethod
    def _draw_weights(c: GDNConfig, g: torch.Generator) -> dict[str, torch.Tensor]:
        vv = c.num_v_heads * c.head_v_dim
        return {
            "w_qkvz": _weight(g, c.hidden_size, c.conv_dim + vv, fan_in=c.hidden_size),
            "w_ba": _weight(g, c.hidden_size, 2 * c.num_v_heads, fan_in=c.hidden_size),
            "conv_w": _weight(g, c.conv_dim, c.conv_kernel, fan_in=c.conv_kernel),
            "conv_b": 0.1 * torch.randn(c.conv_dim, generator=g),
            "A_log": torch.log(torch.empty(c.num_v_heads).uniform_(1.0, 16.0, generator=g)),
            "dt_bias": 0.5 * torch.randn(c.num_v_heads, generator=g),
            "norm_w": 1.0 + 0.1 * torch.randn(c.head_v_dim, generator=g),
            "w_out": _weight(g, vv, c.hidden_size, fan_in=vv),
        }

    @staticmethod
    def state_shapes(
        c: GDNConfig, num_slots: int, state_layout: str | None = None
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Conv windows ``(slots, conv_dim, W-1)``; states ``(slots, HV, K, V)`` k_first, ``(slots, HV, V, K)``
        v_first."""
        dims = state_dims(state_layout or DEFAULT_STATE_LAYOUT, c.head_k_dim, c.head_v_dim)
        return (num_slots, c.conv_dim, c.conv_kernel - 1), (num_slots, c.num_v_heads, *dims)

    @staticmethod
    def token_macs(c: GDNConfig) -> int:
        hv, v = c.num_v_heads, c.head_v_dim
        proj = c.hidden_size * (c.conv_dim + hv * v + 2 * hv) + hv * v * c.hidden_size
        return proj + c.conv_dim * c.conv_kernel + 4 * hv * c.head_k_dim * v

    @staticmethod
    def _norm_gate(z: torch.Tensor) -> torch.Tensor:
        """The output norm's gate: silu (Gated DeltaNet)."""
        return F.silu(z)

    def _gating(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """The recurrence's gate arguments for tokens ``x``: the raw inputs the kernel gates itself (``a``,
        ``b`` ``[T, HV]``, ``A_log``, ``dt_bias``)."""
        HV, w = self.config.num_v_heads, self.weights
        b, a = (x @ w["w_ba"]).split([HV, HV], dim=-1)
        return {"a": a.contiguous(), "b": b.contiguous(), "A_log": w["A_log"], "dt_bias": w["dt_bias"]}

    def _recurrent(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The recurrence: ``kernels.gated_delta_rule.recurrent`` with ``forward``'s arguments (``state_layout``
        among them). The one call a subclass swaps for a candidate kernel (the zoo's ``transposed_state_read``)."""
        return gdn.recurrent(*args, **kwargs)

    def forward(
        self, x: torch.Tensor, meta: Metadata, state: LayerState, intermediate: Intermediate | None = None
    ) -> torch.Tensor:
        """One step. ``x``: ``[T, hidden]`` -> ``[T, hidden]``; updates ``state`` (or, in verify,
        ``intermediate``) in place. Reads only metadata tensors: safe to capture."""
        c, w, mode = self.config, self.weights, meta.forward_mode
        if mode not in self.supported_modes:
            raise MetadataError(f"forward_mode: {mode!r} not supported by {type(self).__name__}", field="forward_mode")
        T, N = x.shape[0], meta.state_indices.shape[0]
        if N == 0:
            return x.new_zeros(0, c.hidden_size)
        pad = meta.profile.kernel_pad_slot_id
        verify = mode == "target_verify"
        idx, per_slot = self._read_slots(meta, intermediate)
        H, HV, K, V = c.num_k_heads, c.num_v_heads, c.head_k_dim, c.head_v_dim
        mixed, z = (x @ w["w_qkvz"]).split([c.conv_dim, HV * V], dim=-1)
        gating = self._gating(x)
        qsl = meta.query_start_loc
        inter_conv = intermediate.conv[:N] if intermediate is not None and verify else None
        inter_ssm = intermediate.ssm[:N] if intermediate is not None and verify else None
        tree = self._tree_args(meta)  # a tree verify's parents: every node starts from its parent's state
        if mode == "extend":
            xc = conv1d.varlen(
                mixed, w["conv_w"], w["conv_b"], conv_state=state.conv, state_indices=idx,
                has_initial_state=meta.has_initial_state, cu_seqlens=qsl, activation="silu",
                pad_slot_id=pad, impl=self.impl,
            )  # fmt: skip
        else:
            xc = conv1d.update(
                mixed.reshape(N, T // N, c.conv_dim), state.conv, w["conv_w"], w["conv_b"],
                state_indices=idx, activation="silu", intermediate_conv_windows=inter_conv,
                disable_state_update=verify, pad_slot_id=pad, impl=self.impl, **tree,
            ).reshape(T, c.conv_dim)  # fmt: skip
        q, k, v = xc.split([H * K, H * K, HV * V], dim=-1)
        o = self._recurrent(
            q.reshape(T, H, K), k.reshape(T, H, K), v.reshape(T, HV, V), **gating, state=state.ssm,
            state_indices=idx, cu_seqlens=qsl, use_qk_l2norm=True,
            has_initial_state=meta.has_initial_state if mode == "extend" else None,
            intermediate_states=inter_ssm, disable_state_update=verify, pad_slot_id=pad, impl=self.impl,
            state_layout=self.state_layout or DEFAULT_STATE_LAYOUT, **tree,
        )  # fmt: skip
        if per_slot and inter_conv is not None and inter_ssm is not None:
            self._write_steps_to_slots(state, inter_conv, inter_ssm, meta.state_indices, pad, meta.profile.dummy_slot)
        o = _gated_rmsnorm(o, z.reshape(T, HV, V), w["norm_w"], c.rms_eps, gate=self._norm_gate)
        return _live_tokens(o.reshape(T, HV * V) @ w["w_out"], meta)


# -- Mamba2 --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Mamba2Config:
    """Shapes of a Mamba2 layer. Defaults are engine-like; ``chunk_size`` is the prefill scan's chunk grid
    (``mamba2.chunk_scan``; 256 in sglang's Mamba2 models, 16 in ``small`` to match the simulator's
    ``cache_chunk``)."""

    hidden_size: int = 2048
    head_dim: int = 64
    num_heads: int = 64
    n_groups: int = 8
    state_size: int = 128
    conv_kernel: int = 4
    rms_eps: float = 1e-6
    chunk_size: int = 256

    @classmethod
    def small(cls) -> Mamba2Config:
        """A tiny layer for tests and the Triton interpreter."""
        return cls(hidden_size=32, head_dim=8, num_heads=4, n_groups=2, state_size=8, chunk_size=16)

    @classmethod
    def quarter(cls) -> Mamba2Config:
        """A quarter of the engine layer's heads (half its width): its state pool fits a CPU bench."""
        return cls(hidden_size=1024, num_heads=16, n_groups=2)

    @classmethod
    def engine(cls) -> Mamba2Config:
        """The engine-like defaults."""
        return cls()

    @property
    def d_inner(self) -> int:
        return self.head_dim * self.num_heads

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.n_groups * self.state_size

    def summary(self) -> str:
        """The shapes on one line, for the layer's repr.

        >>> Mamba2Config.small().summary()
        'hidden=32, heads=4 x 8, groups=2, state=8, conv W=4'
        """
        return (
            f"hidden={self.hidden_size}, heads={self.num_heads} x {self.head_dim}, groups={self.n_groups}, "
            f"state={self.state_size}, conv W={self.conv_kernel}"
        )


class Mamba2Layer(_SeededLayer):
    """Input projection -> short conv -> SSM -> gated norm -> output: a decode step or a verify's D steps (conv
    update, selective state update, per-step buffers in verify) or a prefill (varlen conv, chunk scan)."""

    config_class = Mamba2Config
    supported_modes: tuple[str, ...] = ("decode", "target_verify", "extend", "idle")
    chunk_grid = "batch"

    @staticmethod
    def _draw_weights(c: Mamba2Config, g: torch.Generator) -> dict[str, torch.Tensor]:
        return {
            "w_in": _weight(g, c.hidden_size, c.d_inner + c.conv_dim + c.num_heads, fan_in=c.hidden_size),
            "conv_w": _weight(g, c.conv_dim, c.conv_kernel, fan_in=c.conv_kernel),
            "conv_b": 0.1 * torch.randn(c.conv_dim, generator=g),
            "A_log": torch.log(torch.empty(c.num_heads).uniform_(1.0, 16.0, generator=g)),
            "dt_bias": 0.5 * torch.randn(c.num_heads, generator=g),
            "D": torch.randn(c.num_heads, generator=g),
            "norm_w": 1.0 + 0.1 * torch.randn(c.d_inner, generator=g),
            "w_out": _weight(g, c.d_inner, c.hidden_size, fan_in=c.d_inner),
        }

    @staticmethod
    def state_shapes(
        c: Mamba2Config, num_slots: int, state_layout: str | None = None
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Conv windows and states ``(slots, H, headdim, dstate)``: no layout choice (``state_layout`` ignored)."""
        return (num_slots, c.conv_dim, c.conv_kernel - 1), (num_slots, c.num_heads, c.head_dim, c.state_size)

    @staticmethod
    def token_macs(c: Mamba2Config) -> int:
        proj = c.hidden_size * (c.d_inner + c.conv_dim + c.num_heads) + c.d_inner * c.hidden_size
        return proj + c.conv_dim * c.conv_kernel + 3 * c.num_heads * c.head_dim * c.state_size

    def forward(
        self, x: torch.Tensor, meta: Metadata, state: LayerState, intermediate: Intermediate | None = None
    ) -> torch.Tensor:
        """One step: ``x`` ``[T, hidden]`` -> ``[T, hidden]`` (decode: one token per row; verify: D per row;
        extend: the packed tokens); updates ``state`` (or, in verify, ``intermediate``) in place. Reads only
        metadata tensors: safe to capture."""
        c, w, mode = self.config, self.weights, meta.forward_mode
        if mode not in self.supported_modes:
            raise MetadataError(f"forward_mode: {mode!r} not supported by Mamba2Layer", field="forward_mode")
        N, T = meta.state_indices.shape[0], x.shape[0]
        if N == 0:
            return x.new_zeros(0, c.hidden_size)
        verify = mode == "target_verify"
        pad = meta.profile.kernel_pad_slot_id
        idx, per_slot = self._read_slots(meta, intermediate)
        nh, hd, ng, ds = c.num_heads, c.head_dim, c.n_groups, c.state_size
        z, xbc, dt = (x @ w["w_in"]).split([c.d_inner, c.conv_dim, nh], dim=-1)
        A = -torch.exp(w["A_log"].float()).to(w["A_log"].dtype)
        if mode == "extend":
            xbc = conv1d.varlen(
                xbc, w["conv_w"], w["conv_b"], conv_state=state.conv, state_indices=idx,
                has_initial_state=meta.has_initial_state, cu_seqlens=meta.query_start_loc, activation="silu",
                pad_slot_id=pad, impl=self.impl,
            )  # fmt: skip
            xs, B, C = xbc.split([c.d_inner, ng * ds, ng * ds], dim=-1)
            y = mamba2.chunk_scan(
                xs.reshape(T, nh, hd), dt.contiguous(), A, B.reshape(T, ng, ds), C.reshape(T, ng, ds),
                D=w["D"], dt_bias=w["dt_bias"], dt_softplus=True, state=state.ssm, state_indices=idx,
                cu_seqlens=meta.query_start_loc, has_initial_state=meta.has_initial_state, pad_slot_id=pad,
                chunk_size=c.chunk_size, impl=self.impl,
            )  # fmt: skip
        else:
            L = T // N  # 1 in decode, D in verify
            inter_conv = intermediate.conv[:N] if intermediate is not None and verify else None
            inter_ssm = intermediate.ssm[:N] if intermediate is not None and verify else None
            tree = self._tree_args(meta)  # a tree verify's parents: every node starts from its parent's state
            xbc = conv1d.update(
                xbc.reshape(N, L, c.conv_dim), state.conv, w["conv_w"], w["conv_b"], state_indices=idx,
                activation="silu", intermediate_conv_windows=inter_conv, disable_state_update=verify,
                pad_slot_id=pad, impl=self.impl, **tree,
            )  # fmt: skip
            xs, B, C = xbc.split([c.d_inner, ng * ds, ng * ds], dim=-1)
            lead = (N, L) if verify else (N,)  # the op's step axis: a verify keeps every step's state
            y = mamba2.selective_state_update(
                state.ssm, xs.reshape(*lead, nh, hd), dt.reshape(*lead, nh, 1).expand(*lead, nh, hd),
                A[:, None, None].expand(nh, hd, ds), B.reshape(*lead, ng, ds), C.reshape(*lead, ng, ds),
                D=w["D"][:, None].expand(nh, hd), dt_bias=w["dt_bias"][:, None].expand(nh, hd), dt_softplus=True,
                state_indices=idx, pad_slot_id=pad, intermediate_states=inter_ssm, disable_state_update=verify,
                impl=self.impl, **tree,
            )  # fmt: skip
            if per_slot and inter_conv is not None and inter_ssm is not None:
                self._write_steps_to_slots(
                    state, inter_conv, inter_ssm, meta.state_indices, pad, meta.profile.dummy_slot
                )
        y = _gated_rmsnorm(y.reshape(T, c.d_inner), z, w["norm_w"], c.rms_eps)
        return _live_tokens(y @ w["w_out"], meta)


# -- Kimi Delta Attention ------------------------------------------------------------------------------
@dataclass(frozen=True)
class KDAConfig(GDNConfig):
    """Shapes of a Kimi Delta Attention layer (Kimi Linear's KDA: the gated delta rule with a per-key-channel
    gate): a Gated DeltaNet's shapes, its own defaults, engine-like (``engine``)."""

    hidden_size: int = 2304
    num_k_heads: int = 32
    num_v_heads: int = 32
    head_k_dim: int = 128
    head_v_dim: int = 128
    conv_kernel: int = 4
    rms_eps: float = 1e-6

    @classmethod
    def small(cls) -> KDAConfig:
        """A tiny layer for tests and the Triton interpreter, K (8) != V (12) as ``GDNConfig.small`` (a state
        read in the other layout then has the wrong shape), and fewer key heads than value heads (the gate is
        per value head and key channel, ``[T, HV, K]``)."""
        return cls(hidden_size=32, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=12)

    @classmethod
    def quarter(cls) -> KDAConfig:
        """A quarter of the engine layer's heads (K == V == 128, the engine's head dims): a CPU bench's size."""
        return cls(hidden_size=1152, num_k_heads=8, num_v_heads=8)

    @classmethod
    def engine(cls) -> KDAConfig:
        """Kimi-Linear-48B-A3B's KDA layer: hidden 2304, 32 heads of 128 for q, k and v, a short conv of 4.
        Not in the engines' code (sglang's ``KimiLinearConfig`` / vLLM's read ``linear_attn_config`` from the
        checkpoint; their code defaults are generic): the sizes of the published checkpoint config, as recalled,
        not checked here (no checkpoint offline)."""
        return cls()

    def summary(self) -> str:
        """The shapes on one line, for the layer's repr.

        >>> KDAConfig.small().summary()
        'hidden=32, heads k=2 v=4, head dims k=8 v=12, conv W=4, per-channel gate'
        """
        return f"{super().summary()}, per-channel gate"


class KDALayer(GatedDeltaNetLayer):
    """Kimi Delta Attention: input projections -> q, k, v short convs -> per-channel gate ``gk`` and ``beta``
    -> gated delta rule (``gated_delta_rule.recurrent(..., gk=, beta=)``) -> sigmoid-gated norm -> output.

    The step is :class:`GatedDeltaNetLayer`'s (decode, target_verify with its per-step buffers, extend with
    ``has_initial_state``; its state shapes and layouts): only the gate arguments (:meth:`_gating`), the
    output norm's gate and the weights differ.

    Conv state: one window per slot over the concatenated q, k, v channels, ``[slots, conv_dim, W-1]``
    (``conv_dim = 2 * H * K + HV * V``), not three states. A depthwise conv is per channel, so three windows
    and one over their concatenation hold the same numbers; one keeps ``LayerState`` / ``Intermediate`` (two
    tensors) and every consumer of a layer's state (accept, vLLM's per-slot writes, prefix-cache copies,
    integrity, the shadow) as they are. sglang 0.5.23 keeps it so too (``KimiLinearStateShape``: one conv
    tensor over ``[q, k, v]``, one ``qkv_conv1d``); engines_in_motion.md counts four states (three convs and
    the recurrent one) for fla's layer.

    Gate (log space, per value head h and key channel c): ``gk = -exp(A_log[h]) * softplus(f + dt_bias[h, c])``
    with ``f = (x @ w_fa) @ w_fb`` (Kimi Linear's low-rank ``f_a_proj``/``f_b_proj`` and fla's
    ``fused_kda_gate``); ``A_log`` drawn as log U(1, 16), ``dt_bias`` as the inverse softplus of a log-uniform
    dt in [1e-3, 1e-1] (fla's init), so channels range from nearly held to quickly forgotten.
    ``beta = sigmoid(x @ w_b)``; q and k are L2-normalised in the kernel (``use_qk_l2norm``). The output norm
    gates with sigmoid (Kimi Linear's ``o_norm``), the GDN layer's with silu.

    Args: as :class:`GatedDeltaNetLayer` (``state_layout``: "k_first" ``[slots, HV, K, V]`` or "v_first"
    ``[slots, HV, V, K]``, the released engines' KDA pools).
    """

    config_class = KDAConfig

    @staticmethod
    def _norm_gate(z: torch.Tensor) -> torch.Tensor:
        """Kimi Linear's ``o_norm`` gates with sigmoid."""
        return torch.sigmoid(z)

    @staticmethod
    def _draw_weights(c: GDNConfig, g: torch.Generator) -> dict[str, torch.Tensor]:
        vv, hk = c.num_v_heads * c.head_v_dim, c.num_v_heads * c.head_k_dim
        dt = torch.exp(torch.empty(hk).uniform_(math.log(1e-3), math.log(1e-1), generator=g))
        return {
            "w_qkvz": _weight(g, c.hidden_size, c.conv_dim + vv, fan_in=c.hidden_size),
            "w_fa": _weight(g, c.hidden_size, c.head_k_dim, fan_in=c.hidden_size),
            "w_fb": _weight(g, c.head_k_dim, hk, fan_in=c.head_k_dim),
            "w_b": _weight(g, c.hidden_size, c.num_v_heads, fan_in=c.hidden_size),
            "conv_w": _weight(g, c.conv_dim, c.conv_kernel, fan_in=c.conv_kernel),
            "conv_b": 0.1 * torch.randn(c.conv_dim, generator=g),
            "A_log": torch.log(torch.empty(c.num_v_heads).uniform_(1.0, 16.0, generator=g)),
            "dt_bias": dt + torch.log(-torch.expm1(-dt)),  # softplus(dt_bias) == dt
            "norm_w": 1.0 + 0.1 * torch.randn(c.head_v_dim, generator=g),
            "w_out": _weight(g, vv, c.hidden_size, fan_in=vv),
        }

    @staticmethod
    def token_macs(c: GDNConfig) -> int:
        hv, k, v = c.num_v_heads, c.head_k_dim, c.head_v_dim
        proj = c.hidden_size * (c.conv_dim + hv * v + k + hv) + k * hv * k + hv * v * c.hidden_size
        return proj + c.conv_dim * c.conv_kernel + 4 * hv * k * v

    def _gating(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """The recurrence's gate arguments: the per-channel ``gk`` and ``beta`` (:meth:`gates`)."""
        gk, beta = self.gates(x)
        return {"gk": gk, "beta": beta}

    def gates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The per-channel log-decay ``gk`` ``[T, HV, K]`` and ``beta`` ``[T, HV]`` of tokens ``x``."""
        c, w = self.config, self.weights
        HV, K = c.num_v_heads, c.head_k_dim
        f = ((x @ w["w_fa"]) @ w["w_fb"]).reshape(-1, HV, K)
        gk = -torch.exp(w["A_log"])[:, None] * F.softplus(f + w["dt_bias"].reshape(HV, K))
        return gk.contiguous(), torch.sigmoid(x @ w["w_b"]).contiguous()


_L = TypeVar("_L", bound=_SeededLayer)


def float64_reference(layer: _L) -> _L:
    """The same layer in float64 with the torch reference kernels: the ground truth of integrity checks."""
    return layer.to(torch.float64, impl="reference")


# -- the registry --------------------------------------------------------------------------------------
class LayerError(WorkbenchError):
    """A layer or a preset the registry does not have; the one line names the field and the choices."""


def _choices(names: tuple[str, ...] | list[str]) -> str:
    return repr(tuple(names))


@dataclass(frozen=True)
class LayerSpec:
    """One layer the workbench runs: its name (a trace header's ``layer``, ``--layer``), its class, and what
    the rest of the workbench reads of it without building one (no weights drawn).

    Everything but the name and the title is read from the class, so it cannot drift from what runs:
    ``config_class`` and ``supported_modes`` (class attributes), ``chunk_grid`` ("sequence": one chunk grid
    per sequence, GDN's; "batch": one grid over the flattened batch, Mamba2's scan), ``presets`` (the names
    of :data:`~workbench.layer_names.PRESET_NAMES` the config class has a classmethod for),
    ``state_shapes`` / ``slot_elements`` (float32 elements of one state slot) and ``token_macs`` (the
    multiply-adds of one token: the lab's CPU-work bound).

    >>> spec = LAYERS["gdn"]
    >>> spec.layer_class.__name__, spec.presets, spec.chunk_grid, spec.slot_elements("small")
    ('GatedDeltaNetLayer', ('small', 'quarter', 'engine'), 'sequence', 624)
    >>> spec.state_shapes("small", 9, "v_first")[1], spec.state_layouts
    ((9, 4, 12, 8), ('k_first', 'v_first'))
    """

    name: str
    title: str
    layer_class: type[_SeededLayer]

    @property
    def config_class(self) -> type:
        return self.layer_class.config_class

    @property
    def supported_modes(self) -> tuple[str, ...]:
        return self.layer_class.supported_modes

    @property
    def chunk_grid(self) -> str:
        return self.layer_class.chunk_grid

    @property
    def state_layouts(self) -> tuple[str, ...]:
        """The state layouts the layer may keep (empty: its state has no layout choice, Mamba2's)."""
        return self.layer_class.state_layouts

    @property
    def presets(self) -> tuple[str, ...]:
        return tuple(p for p in PRESET_NAMES if callable(getattr(self.config_class, p, None)))

    def config(self, preset: str = "small") -> Any:
        """The layer's config at ``preset``; ``LayerError`` names the presets it has."""
        if not isinstance(preset, str) or preset not in self.presets:
            raise LayerError(f"preset: {preset!r} is not one of {_choices(self.presets)} for layer {self.name!r}")
        return getattr(self.config_class, preset)()

    def _config(self, config: Any) -> Any:
        return self.config(config) if isinstance(config, str) else config

    def state_shapes(
        self, config: Any = "small", num_slots: int = 1, state_layout: str | None = None
    ) -> tuple[tuple[int, ...], ...]:
        """The state pool's shapes (conv windows, SSM states) for a config or a preset's name, the states in
        ``state_layout`` (None: "k_first"; ignored by a layer without a layout choice)."""
        layout = self.layer_class._layout_of(state_layout)
        return self.layer_class.state_shapes(self._config(config), num_slots, layout)

    def slot_elements(self, config: Any = "small") -> int:
        """Elements of one state slot (conv window + SSM state) for a config or a preset's name."""
        return sum(math.prod(shape[1:]) for shape in self.state_shapes(config, 1))

    def token_macs(self, config: Any = "small") -> int:
        """Multiply-adds of one token through the layer, for a config or a preset's name."""
        return self.layer_class.token_macs(self._config(config))

    def make(self, preset: str = "small", *, seed: int = 0, config: Any = None, **kwargs: Any) -> Any:
        """A seeded layer at ``preset`` (or ``config``); ``kwargs``: ``dtype``, ``device``, ``impl``,
        ``state_layout`` (a profile's ``state_layout``; ignored by a layer without a layout choice)."""
        return self.layer_class(config if config is not None else self.config(preset), seed=seed, **kwargs)


LAYERS: dict[str, LayerSpec] = {
    spec.name: spec
    for spec in (
        LayerSpec(GDN, "Gated DeltaNet", GatedDeltaNetLayer),
        LayerSpec(MAMBA2, "Mamba2", Mamba2Layer),
        LayerSpec(KDA, "Kimi Delta Attention", KDALayer),
    )
}
"""Every layer, by name: a trace header's ``layer``, every ``--layer`` flag, the widgets' and the sweeps'
choices. Adding a layer is its class and one entry here (and its name in ``workbench.layer_names``)."""


def get_layer_spec(name: str | LayerSpec) -> LayerSpec:
    """The entry of ``name`` (a ``LayerSpec`` passes through); ``LayerError`` names the choices.

    >>> get_layer_spec("mamba").name
    Traceback (most recent call last):
    ...
    workbench.layers.LayerError: layer: 'mamba' is not one of ('gdn', 'mamba2', 'kda')
    """
    if isinstance(name, LayerSpec):
        return name
    try:
        return LAYERS[name]
    except (KeyError, TypeError):
        raise LayerError(f"layer: {name!r} is not one of {_choices(list(LAYERS))}") from None


def make_layer(name: str, preset: str = "small", seed: int = 0, **kwargs: Any) -> Any:
    """A seeded ``name`` layer at ``preset`` (``kwargs``: ``dtype``, ``device``, ``impl``, ``state_layout``):
    what a trace's steps, an engine check and the zoo's cases run (the small preset, seed 0), in the layout
    of the profile they run under (``state_layout=profile.state_layout``)."""
    return get_layer_spec(name).make(preset, seed=seed, **kwargs)


__all__ = [
    "FLOAT32_TOLERANCE",
    "LAYERS",
    "GDNConfig",
    "GatedDeltaNetLayer",
    "Intermediate",
    "KDAConfig",
    "KDALayer",
    "LayerError",
    "LayerSpec",
    "LayerState",
    "Mamba2Config",
    "Mamba2Layer",
    "Tolerance",
    "float64_reference",
    "get_layer_spec",
    "make_layer",
]
