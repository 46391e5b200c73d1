"""uninit_pad: the conv update skips padded rows and leaves their outputs uninitialised; fed onward to the
SSM, the garbage comes out of the layer in the padded rows (sglang PR 30974)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import kernels.causal_conv1d as conv1d
import kernels.mamba2 as mamba2
from kernels.padding import skipped_rows
from workbench.batch import Batch
from workbench.layers import Intermediate, LayerState, Mamba2Config, Mamba2Layer, _gated_rmsnorm
from workbench.metadata import Metadata
from workbench.pool import StatePool
from workbench.profiles import Profile
from workbench.zoo import _harness as h
from workbench.zoo.case import ZooCase
from workbench.zoo.result import Evidence, Propagation

EXPLANATION = (
    "The Triton `causal_conv1d_update` of sglang skips rows whose slot is the pad id and never writes their "
    "outputs, which live in a `torch.empty` buffer: whatever memory was there. That buffer goes straight into "
    "the Mamba2 state update, which for a padded row reads no state and writes none but still computes an "
    "output from its input; the padded rows' hidden states then travel through the rest of the model, "
    "where garbage or NaN can make a later kernel misbehave (the PR saw a multi-node run hang). Here the "
    "conv kernel gets an output buffer whose never-written memory shows as NaN (so it is visible and the run "
    "deterministic), the SSM computes padded rows the engine's way, and the layer does not mask its output: "
    "with a conv kernel that skips padded rows' outputs, NaN appears in the padded rows of the conv output, "
    "of the SSM output and of the layer output, while the live rows stay exact. The fix writes padded rows' "
    "conv outputs as zeros before the SSM (the workbench's `causal_conv1d.update` writes `out` in full): from "
    "zero input and zero state the SSM, the norm and the projection give exact zeros."
)

STAGES = ("conv output", "ssm output", "layer output")


def skips_padded_outputs(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    state_indices: torch.Tensor,
    out: torch.Tensor,
    pad_slot_id: int | None = -1,
    **kwargs: Any,
) -> torch.Tensor:
    """``causal_conv1d.update`` as sglang's Triton kernel ran it: the rows it skips never get their outputs
    written (``out`` keeps whatever it held)."""
    written = conv1d.update(x, conv_state, weight, bias, state_indices=state_indices, pad_slot_id=pad_slot_id, **kwargs)
    skipped = skipped_rows(state_indices, pad_slot_id)
    out.copy_(torch.where(skipped[:, None, None], out, written))
    return out


def variant(fixed: bool) -> Callable[..., Any]:
    """The case's own conv kernel: one that leaves padded rows' outputs unwritten (unfixed), or the
    workbench's ``causal_conv1d.update``, which writes zeros there (fixed)."""
    return conv1d.update if fixed else skips_padded_outputs


class EngineMamba2(Mamba2Layer):
    """Mamba2 decode as the engine ran it around PR 30974: the conv kernel (``conv_kernel``, called with
    ``causal_conv1d.update``'s keywords) writes into a buffer whose never-written memory is NaN, the SSM
    still computes padded rows' outputs (from a zero state, writing no state), and the layer output is not
    masked. Keeps each stage's tensor of the last call in ``probes[batch_size]`` (on a graph: the static
    tensors each replay overwrites).

    ``conv_kernel`` is an instance attribute: the float64 reference copy (``Layer.to``) does not carry it
    and runs the workbench's own kernel.
    """

    def __init__(self, *args: Any, conv_kernel: Callable[..., Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if conv_kernel is not None:
            self.conv_kernel = conv_kernel

    def _conv(self, **args: Any) -> torch.Tensor:
        kernel = self.__dict__.get("conv_kernel")
        if kernel is None:
            return conv1d.update(**args, impl=self.impl)
        returned = kernel(**args)
        return returned if isinstance(returned, torch.Tensor) else args["out"]

    def forward(
        self, x: torch.Tensor, meta: Metadata, state: LayerState, intermediate: Intermediate | None = None
    ) -> torch.Tensor:
        c, w = self.config, self.weights
        n = meta.state_indices.shape[0]
        pad = meta.profile.kernel_pad_slot_id
        nh, hd, ng, ds = c.num_heads, c.head_dim, c.n_groups, c.state_size
        z, xbc, dt = (x @ w["w_in"]).split([c.d_inner, c.conv_dim, nh], dim=-1)
        never_written = torch.full((n, 1, c.conv_dim), float("nan"), dtype=x.dtype, device=x.device)
        conv = self._conv(
            x=xbc.reshape(n, 1, c.conv_dim), conv_state=state.conv, weight=w["conv_w"], bias=w["conv_b"],
            state_indices=meta.state_indices, activation="silu", pad_slot_id=pad, out=never_written,
        ).reshape(n, c.conv_dim)  # fmt: skip
        skipped = skipped_rows(meta.state_indices, pad)
        xs, B, C = conv.split([c.d_inner, ng * ds, ng * ds], dim=-1)
        A = -torch.exp(w["A_log"].float()).to(w["A_log"].dtype)
        args = (
            xs.reshape(n, nh, hd), dt[:, :, None].expand(n, nh, hd), A[:, None, None].expand(nh, hd, ds),
            B.reshape(n, ng, ds), C.reshape(n, ng, ds),
        )  # fmt: skip
        kw: dict[str, Any] = {"D": w["D"][:, None].expand(nh, hd), "dt_bias": w["dt_bias"][:, None].expand(nh, hd)}
        y_live = mamba2.selective_state_update(
            state.ssm, *args, **kw, dt_softplus=True, state_indices=meta.state_indices, pad_slot_id=pad,
            impl=self.impl,
        )  # fmt: skip
        # padded rows as the engine's SSM kernel treats them: state read as zeros, output computed, no write
        zero_state = torch.zeros((n, nh, hd, ds), dtype=state.ssm.dtype, device=state.ssm.device)
        rows = torch.arange(n, dtype=torch.int32, device=x.device)
        y_pad = mamba2.selective_state_update(
            zero_state, *args, **kw, dt_softplus=True, state_indices=rows, pad_slot_id=None, impl=self.impl
        )
        y = torch.where(skipped[:, None, None], y_pad, y_live)
        out = _gated_rmsnorm(y.reshape(n, c.d_inner), z, w["norm_w"], c.rms_eps) @ w["w_out"]
        # (Layer.to() copies weights without __init__, so the dict is made on first use)
        self.__dict__.setdefault("probes", {})[n] = dict(zip(STAGES, (conv, y, out), strict=True))
        return out


def padding_is_skipped(fn: Callable[..., Any], profile: Profile) -> str | None:
    """The bug needs rows the kernel skips (a profile with a skip guard)."""
    if not profile.convention.processes_padding:
        return None
    return (
        f"under {profile.name} padded rows are processed on the dummy slot, so the kernel writes their outputs: "
        "none is left unwritten (the case needs a profile whose kernels skip padded rows, as sglang's)"
    )


def nonfinite_rows(stages: dict[str, torch.Tensor]) -> Propagation:
    """Rows of each stage's output holding a NaN or an inf."""
    found = []
    for name in STAGES:
        t = stages[name]
        rows = (~torch.isfinite(t.reshape(t.shape[0], -1))).any(dim=1).nonzero().flatten().tolist()
        found.append((name, tuple(rows)))
    return Propagation(tuple(found), num_rows=max((int(t.shape[0]) for t in stages.values()), default=0))


def scenario(kernel: Callable[..., Any], profile: str, backend: str) -> list[Evidence]:
    """Capture decode buckets 1, 2, 4 of the Mamba2 layer with ``kernel`` as its conv update; replay a step
    of three requests padded to 4 and check it. Evidence of the bug: NaN rows (never-written conv outputs)
    at each stage."""
    name, device = h.resolve_backend(backend)
    pool = StatePool(16, profile, device=device)
    layer = EngineMamba2(Mamba2Config.small(), seed=0, device=device, conv_kernel=kernel)
    runner = h.make_runner(layer, pool, name)
    runner.capture(progress=False)
    rows = pool.alloc(3)
    batch = Batch.decode(rows, [5, 6, 7], device=device)
    step = h.replay_and_check(
        runner, batch, h.inputs_for(runner, batch, 0), what="decode replay", may_write=[pool.profile.dummy_slot]
    )
    bucket = runner.last_metadata.batch_size if runner.last_metadata is not None else 0
    stages = layer.__dict__["probes"][bucket]
    return [nonfinite_rows(stages), step]


CASE = ZooCase(
    name="uninit_pad",
    title="conv update leaves padded outputs uninitialised: NaN flows on through the SSM",
    issue="sglang PR 30974",
    profile="sglang",
    explanation=EXPLANATION,
    subject="kernel",
    scenario=scenario,
    variant=variant,
    mechanism=(Propagation,),
    applies=padding_is_skipped,
    kernel_op="causal_conv1d.update",
    steps="pool of 16 slots, Mamba2 layer (small, seed 0) whose conv update is the kernel, called with "
    "causal_conv1d.update's keywords and an out= buffer of NaN; decode buckets 1, 2, 4; capture(); one decode "
    "step of 3 requests (seq_lens 5, 6, 7) padded to 4: NaN rows at each stage, output and slots checked",
)
