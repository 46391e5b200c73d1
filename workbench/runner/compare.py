"""Replay vs eager: run one batch through a captured graph, through the same padded step eagerly, and
through the float64 reference, and say whether anything differs or was lost.

Beside the runner it checks (``GraphRunner.compare`` calls :func:`compare_replay`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workbench import html
from workbench.batch import Batch
from workbench.layers import float64_reference
from workbench.measure.integrity import IntegrityReport, check
from workbench.metadata import build_metadata, tokens_per_row


@dataclass
class Comparison:
    """Replay vs eager on the same batch and inputs, and the integrity report of the replay.

    Attributes:
        bucket: the captured bucket replayed, or None when the batch ran eagerly (above the largest bucket).
        replayed: whether a graph ran.
        bitwise_equal: replay == the same padded step run eagerly, bit for bit (live outputs, every slot but
            the dummy, verify intermediates).
        max_output_diff, max_state_diff: largest absolute differences replay vs eager.
        integrity: replay vs the float64 reference (see ``measure.integrity``).
        expect_bitwise: True on the CPU recorder (the very same kernels run); a device graph may pick others.
        raw_batch_size, mode: the batch compared.
        reason: why the batch ran eagerly, when it did.
    """

    bucket: int | None
    replayed: bool
    bitwise_equal: bool
    max_output_diff: float
    max_state_diff: float
    integrity: IntegrityReport
    expect_bitwise: bool = True
    raw_batch_size: int = 0
    mode: str = "decode"
    reason: str | None = None

    @property
    def ok(self) -> bool:
        """Integrity clean, and replay bitwise equal to eager where that is expected."""
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
            "raw_batch_size": self.raw_batch_size,
            "mode": self.mode,
            "reason": self.reason,
        }

    def __repr__(self) -> str:
        how = f"replayed bucket {self.bucket}" if self.replayed else "eager (no bucket)"
        bitwise = (
            "bitwise equal" if self.bitwise_equal else f"NOT bitwise equal (max out diff {self.max_output_diff:.3g})"
        )
        verdict = "ok" if self.ok else "FAIL"
        return (
            f"Comparison({verdict}: {self.mode} raw_bs={self.raw_batch_size}, {how}, {bitwise}, "
            f"integrity {'ok' if self.integrity.ok else 'FAIL'})"
        )

    def _repr_html_(self) -> str:
        bitwise_ok = self.bitwise_equal or not self.expect_bitwise
        expect = "expected (cpu recorder runs the same kernels)" if self.expect_bitwise else "not expected on a device"
        rows: list[tuple[str, object, bool]] = [
            ("replayed", self.replayed if self.replayed else f"no: {self.reason or 'eager'}", True),
            ("bitwise equal to padded eager", f"{'yes' if self.bitwise_equal else 'no'} ({expect})", bitwise_ok),
            ("max |output replay - eager|", self.max_output_diff, bitwise_ok),
            ("max |state replay - eager|", self.max_state_diff, bitwise_ok),
            ("integrity vs float64 reference", "clean" if self.integrity.ok else "PROBLEMS (below)", self.integrity.ok),
        ]
        table = html.table(
            ["check", "value"], [[k, v] for k, v, _ in rows], row_kinds=["ok" if good else "fail" for *_, good in rows]
        )
        head = html.facts({"mode": self.mode, "raw_bs": self.raw_batch_size, "bucket": self.bucket})
        parts = [html.badge(self.ok), head, table]
        if not self.integrity.ok:
            parts.append(self.integrity._repr_html_())
        return html.block(*parts, title="Comparison: replay vs eager vs float64")


def compare_replay(
    runner: Any,  # a GraphRunner: not imported, runner.py imports this module
    batch: Batch,
    inputs: torch.Tensor,
    *,
    atol: float | None = None,
    rtol: float | None = None,
) -> Comparison:
    """Replay ``batch`` on ``runner``; also run it eagerly on a copy of the state, padded the same way, and
    unpadded in float64.

    ``bitwise_equal``: replay and the padded eager step agree bit for bit on the live outputs and on every
    slot but the dummy (they run the same ops on the same shapes, so on the CPU any difference is a graph
    bug: stale metadata, a wrong address, a step that ran at capture only). The integrity report compares
    the replay with the float64 reference: foreign slots changed, live rows off, padded outputs not zero.
    The runner's state advances by the replay.
    """
    # Any: float64_reference needs a workbench layer (its .to), more than the runner's Layer protocol promises
    layer: Any = runner.layer
    pool, D = runner.pool, runner.draft_tokens
    before = runner.state.clone()
    verify = batch.mode == "target_verify"
    mode = runner.meta_backend.graph_mode_of(batch)
    n = runner.check_inputs(batch, inputs, mode)
    r, L = batch.raw_batch_size, tokens_per_row(mode, D)
    bucket = runner.meta_backend.buffers[mode].bucket_for(r)
    # eager, padded like the replay (the padded input rows hold what the static buffer holds)
    if bucket is None:
        meta_e, x_e = build_metadata(batch, pool, bucket=None), inputs
    else:
        meta_e = build_metadata(batch, pool, bucket=bucket, buckets=runner.buckets(mode))
        x_e = torch.cat([inputs, runner.static_x[mode][n : bucket * L]])
    st_e = before.clone()
    inter_e = layer.new_intermediate(meta_e.batch_size, D) if verify else None
    out_e = layer.forward(x_e, meta_e, st_e, inter_e)[:n]
    # float64 reference, unpadded: the truth padding must not change
    meta_r = build_metadata(batch, pool, bucket=None)
    ref = float64_reference(layer)
    st_r = before.to(torch.float64)
    inter_r = ref.new_intermediate(r, D, torch.float64) if verify else None
    out_r = ref.forward(inputs.double(), meta_r, st_r, inter_r)
    # replay
    res = runner.replay(batch, inputs)
    out_g = res.output.clone()
    after = runner.state.tensors()
    dummy = pool.profile.dummy_slot
    live_slots = sorted({int(s) for s in meta_r.state_indices.flatten().tolist()})
    intermediates: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    same_inter = True
    got = runner.last_intermediate
    if verify and meta_r.state_indices.dim() == 1 and got is not None and inter_r is not None and inter_e is not None:
        intermediates = {
            "intermediate.ssm": (got.ssm[:r], inter_r.ssm[:r]),
            "intermediate.conv": (got.conv[:r], inter_r.conv[:r]),
        }
        same_inter = torch.equal(got.ssm[:r], inter_e.ssm[:r]) and torch.equal(got.conv[:r], inter_e.conv[:r])
    padded = runner.graph(mode, res.bucket).outputs[n:] if res.replayed else None
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
        intermediates=intermediates,
        atol=atol,
        rtol=rtol,
    )
    keep = [s for s in range(pool.num_slots) if s != dummy]
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
        expect_bitwise=runner.graph_backend.name == "cpu",
        raw_batch_size=r,
        mode=batch.mode,
        reason=res.reason,
    )
