"""kda_sentinel_rows: a KDA recurrent kernel that skips only zero-length rows processes a -1 sentinel row that
carries tokens, on the pool's last slot (fla 0.6.0, ``fla/ops/kda/fused_recurrent.py:99``, as engines_in_motion.md
section 4 reads it: fla is not installed here, that line was not re-read).

Verified here (the engines in ``.venv-engines``): sglang 0.5.23 pads decode replays with -1
(``layers/attention/hybrid_linear_attn_backend.py:785``, ``mamba_indices[bs - num_padding:] = -1``) and makes
those rows zero-length (``:883``, the padded ``query_start_loc`` filled with the live total); its captures
give every row of the bucket one token (``_capture_metadata``, ``:693-694``, the bucket's arange). vLLM 0.33.0
pads with 0 and zero-length rows (``v1/worker/gpu_model_runner.py:2037``, ``v1/attention/backends/gdn_attn.py:
664, 671``). So the released metadata keeps fla's kernel safe only through the padded rows' length: the length
is its one guard.
"""

from __future__ import annotations

from typing import Any

import torch

import kernels.gated_delta_rule as gdn
from workbench.measure.integrity import check, snapshot
from workbench.pool import StatePool
from workbench.zoo import _harness as h
from workbench.zoo.case import ZooCase
from workbench.zoo.result import Evidence

EXPLANATION = (
    "fla 0.6.0's KDA recurrent kernel (`fla/ops/kda/fused_recurrent.py:99`) skips a row only when its length "
    "is 0; unlike the gated-delta-rule kernels it has no `idx < 0` (or `idx <= 0`) guard on the slot. Under "
    "sglang's convention a padded row carries the -1 sentinel, and the released engines also make it "
    "zero-length at replay, so the length alone keeps the kernel off the pool. A -1 row that carries tokens "
    "(a captured bucket's uniform layout, one token per row, as sglang's capture gives every row; a port "
    "that pads query_start_loc by the bucket; a full-graph decode that runs padded rows) is processed: in "
    "Triton the slot offset -1 points one state before the pool, here (torch indexing) it wraps to the pool's "
    "last slot. The case calls the workbench's KDA kernel (`gated_delta_rule.recurrent` with the per-channel "
    "gate `gk`) through a candidate that keeps fla's rule, on a decode step of three requests padded to "
    "four, the padded row holding one token: the last slot, owned by a request that sits the step out, is "
    "read and rewritten, and the padded output row is not zero. The fix is the skip rule of every op here: "
    "a row is skipped when `state_indices <= pad_slot_id` (-1 under sglang), whatever its length."
)

HV, H, K, V = 2, 2, 8, 12
NUM_SLOTS = 16
CONVENTION = "sglang"
"""sentinel -1, ``pad_slot_id`` -1: the convention whose sentinel fla's missing guard is about."""


def skips_zero_length_only(*args: Any, state: torch.Tensor, state_indices: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """The unfixed candidate: fla 0.6.0's skip rule (zero-length rows only) on the workbench's kernel. A
    negative slot is an index into the pool as torch takes it (-1 is the last slot), and no row is skipped by
    its index (``pad_slot_id=None``); zero-length rows are still skipped, as the kernel always does."""
    kwargs.pop("pad_slot_id", None)
    wrapped = torch.remainder(state_indices, state.shape[0])
    return gdn.recurrent(*args, state=state, state_indices=wrapped, pad_slot_id=None, **kwargs)


def variant(fixed: bool) -> Any:
    """The case's kernel: ``gated_delta_rule.recurrent`` with its skip rule (fixed) or fla's (unfixed)."""
    return gdn.recurrent if fixed else skips_zero_length_only


def _inputs(tokens: int, device: torch.device, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "q": torch.randn(tokens, H, K, generator=g).to(device),
        "k": torch.randn(tokens, H, K, generator=g).to(device),
        "v": torch.randn(tokens, HV, V, generator=g).to(device),
        "gk": (-torch.rand(tokens, HV, K, generator=g) * 0.5).to(device),  # per-channel log-decay
        "beta": torch.rand(tokens, HV, generator=g).to(device),
    }


def _run(fixed: bool, backend: str) -> list[Evidence]:
    _, device = h.resolve_backend(backend)
    kernel = variant(fixed)
    pool = StatePool(NUM_SLOTS, CONVENTION, device=device)
    rows = pool.alloc(NUM_SLOTS - 1)  # every usable slot owned: the last one too
    step_rows = rows[:3].tolist()  # three requests decode; the one on the last slot sits this step out
    live = [pool.slots_of(int(r))[0] for r in step_rows]
    state = torch.randn(NUM_SLOTS, HV, K, V, generator=torch.Generator().manual_seed(1)).to(device)
    pre = snapshot({"ssm": state})
    x = _inputs(4, device, seed=2)  # four token rows: three live, one padded with a token
    idx = torch.tensor([*live, -1], dtype=torch.int32, device=device)
    qsl = torch.arange(5, dtype=torch.int32, device=device)  # one token per row, the padded row too
    out = kernel(
        x["q"], k=x["k"], v=x["v"], gk=x["gk"], beta=x["beta"], state=state, state_indices=idx, cu_seqlens=qsl,
        pad_slot_id=-1,
    )  # fmt: skip
    # the reference: the three live rows alone, in float64, from the state before the step
    ref_state = pre["ssm"].double()
    ref_out = gdn.recurrent(
        x["q"][:3].double(), k=x["k"][:3].double(), v=x["v"][:3].double(), gk=x["gk"][:3].double(),
        beta=x["beta"][:3].double(), state=ref_state, state_indices=idx[:3], cu_seqlens=qsl[:4], impl="reference",
    )  # fmt: skip
    report = check(
        pre,
        {"ssm": state},
        allowed_slots=live,
        live_slots=live,
        reference_state={"ssm": ref_state},
        live_outputs=out[:3],
        reference_outputs=ref_out,
        padded_outputs=out[3:],
        padded_offset=3,
    )
    what = "KDA decode, 3 requests + 1 padded row (-1, one token)"
    return [h.integrity_evidence(what, report, pool, pre, {"ssm": state}, live)]


CASE = ZooCase(
    name="kda_sentinel_rows",
    title="a KDA kernel that skips only zero-length rows runs a -1 padded row with tokens on the last slot",
    issue="fla 0.6.0 fla/ops/kda/fused_recurrent.py:99",
    profile=CONVENTION,
    explanation=EXPLANATION,
    run_fn=_run,
    why_not="the case swaps the skip rule of the workbench's own KDA kernel; a kernel's own guard is what "
    "`workbench check-kernel MODULE_OR_FILE:FUNCTION --op gated_delta_rule.recurrent --convention sglang` checks "
    "(padded rows with the -1 sentinel, a guard band around the pool)",
    steps="pool of 16 KDA states (HV=2, K=8, V=12, sglang), every usable slot owned; one decode step of 3 "
    "requests and 1 padded row (slot -1, one token) through gated_delta_rule.recurrent with gk; slots, outputs "
    "and the padded output row checked against the float64 reference of the 3 live rows",
)
