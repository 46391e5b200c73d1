"""transposed_state_read: a decode kernel reads the engine's V-first state pool as if it were K-first; at
K == V nothing refuses it (vLLM issues 40956, 41292)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

import kernels.gated_delta_rule as gdn
from kernels.conventions import DEFAULT_STATE_LAYOUT
from workbench.batch import Batch
from workbench.layers import GatedDeltaNetLayer, GDNConfig, float64_reference
from workbench.metadata import build_metadata
from workbench.pool import StatePool
from workbench.zoo import _harness as h
from workbench.zoo.case import ZooCase
from workbench.zoo.result import Evidence, RowsDiffer

EXPLANATION = (
    "Both released engines keep the gated-delta-rule state of a value head V-first, `[V, K]` (sglang's "
    "`MambaPool`, vLLM's GDN pool), where fla's kernels and most kernel candidates index it K-first, "
    "`[K, V]`. A decode kernel written for the K-first layout and handed the V-first pool takes each state "
    "as its transpose. Qwen3-Next's heads have K == V == 128, so the shapes agree and nothing refuses the "
    "call; a decode-only test, where the kernel reads back only what it wrote itself (from a zeroed pool), "
    "even gets every output right, because it stores and reads its private transposed state consistently. "
    "That is what 'passes' means here, and the case shows it at K == V (outputs against the float64 "
    "reference after two decode steps from zeros). A state anything else wrote (the prefill, a prefix "
    "checkpoint, a correct kernel) is read transposed, and a model whose head dims differ (K != V, this case's "
    "small layer: K=8, V=12) cannot run it at all: the state the kernel is given has the wrong shape, and the "
    'decode step is refused at capture. The fix passes the pool\'s layout (`state_layout="v_first"`), so the '
    "kernel indexes the state as the pool lays it out: clean at K != V, on a pool a correct writer filled."
)


class LayoutBlindGDN(GatedDeltaNetLayer):
    """A Gated DeltaNet layer whose pool is V-first (its ``state_layout``) and whose decode kernel is the
    candidate ``kernel``: called with ``gated_delta_rule.recurrent``'s keywords, ``state_layout`` among them.

    ``kernel`` is an instance attribute: the float64 reference copy (``Layer.to``) does not carry it and runs
    the workbench's own kernel in the layer's layout."""

    def __init__(self, *args: Any, kernel: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if kernel is not None:
            self.kernel = kernel

    def _recurrent(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        kernel = self.__dict__.get("kernel")
        return gdn.recurrent(*args, **kwargs) if kernel is None else kernel(*args, **kwargs)


def reads_k_first(*args: Any, state_layout: str = DEFAULT_STATE_LAYOUT, **kwargs: Any) -> torch.Tensor:
    """The unfixed candidate: ``gated_delta_rule.recurrent`` that drops ``state_layout`` and indexes the pool
    as ``[slots, HV, K, V]``, whatever its layout."""
    return gdn.recurrent(*args, **kwargs)


def variant(fixed: bool) -> Any:
    """The case's decode kernel: the workbench's ``recurrent`` (fixed) or one that reads K-first (unfixed)."""
    return gdn.recurrent if fixed else reads_k_first


SQUARE = replace(GDNConfig.small(), head_v_dim=GDNConfig.small().head_k_dim)
"""The small layer with K == V (8): the shapes Qwen3-Next's K == V == 128 gives, where nothing refuses."""


def _outputs_from_zeros(kernel: Any, device: torch.device) -> RowsDiffer:
    """At K == V: two decode steps of three requests from a zeroed V-first pool that only ``kernel`` writes;
    the second step's output rows against the float64 reference run from the same zeros (V-first)."""
    pool = StatePool(16, "vllm", device=device)
    layer = LayoutBlindGDN(SQUARE, seed=0, device=device, state_layout="v_first", kernel=kernel)
    ref = float64_reference(layer)
    state, st_r = layer.new_state(16), ref.new_state(16, dtype=torch.float64)
    rows = pool.alloc(3)
    errors: list[float] = []
    for i, lens in enumerate(([5, 6, 7], [6, 7, 8])):
        batch = Batch.decode(rows, lens, device=device)
        meta = build_metadata(batch, pool, bucket=None)
        x = torch.randn(3, SQUARE.hidden_size, generator=torch.Generator().manual_seed(i)).to(device)
        out, out_r = layer.forward(x, meta, state), ref.forward(x.double(), meta, st_r)
        errors = (out.double() - out_r).abs().amax(dim=1).tolist()
    bad = [r for r, e in enumerate(errors) if not e <= 1e-4]
    return RowsDiffer(
        "K == V (8), decode from a zeroed pool the kernel alone writes: outputs of step 2",
        bad,
        errors=[errors[r] for r in bad],
    )


def _run(fixed: bool, backend: str) -> list[Evidence]:
    name, device = h.resolve_backend(backend)
    kernel = variant(fixed)
    control = _outputs_from_zeros(kernel, device)
    # K != V (8, 12): a pool a correct writer filled (seeded, V-first), decode captured and replayed
    pool = StatePool(16, "vllm", device=device)
    layer = LayoutBlindGDN(GDNConfig.small(), seed=0, device=device, state_layout="v_first", kernel=kernel)
    runner = h.make_runner(layer, pool, name)
    try:
        runner.capture(progress=False)
    except ValueError as exc:  # the op's shape check: the bug's own refusal, nothing else is caught
        return [control, h.capture_failure(exc, runner)]
    rows = pool.alloc(3)
    batch = Batch.decode(rows, [5, 6, 7], device=device)
    step = h.replay_and_check(
        runner, batch, h.inputs_for(runner, batch, 0), what="K != V decode replay", may_write=[pool.profile.dummy_slot]
    )
    return [control, step]


CASE = ZooCase(
    name="transposed_state_read",
    title="a decode kernel reads the V-first state pool as K-first: passes at K == V, refused at K != V",
    issue="vLLM issues 40956, 41292",
    profile="vllm",
    explanation=EXPLANATION,
    run_fn=_run,
    why_not="the case swaps the decode kernel of the workbench's own layer; a kernel's own layout handling is "
    "what `workbench check-kernel MODULE_OR_FILE:FUNCTION --op gated_delta_rule.recurrent` checks (the "
    "kernels' layout tests run at K != V)",
    steps="pool of 16 slots (vllm), GDN layer with a V-first pool whose decode kernel is the candidate; at K == V "
    "(8): two decode steps of 3 requests from zeros, outputs against float64; at K != V (8, 12, the small "
    "layer): seeded pool, decode buckets 1, 2, 4, capture(), one decode step of 3 requests (seq_lens 5, 6, 7) "
    "padded to 4, output and slots checked",
)
