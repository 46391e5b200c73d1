"""fill_count: padding counted on the host from seq-len fill values miscounts when a live row's length
equals the fill value; the live row dropped is the last one (sglang's num_padding count)."""

from __future__ import annotations

import torch

from workbench.backends import MetadataBackend
from workbench.batch import Batch
from workbench.metadata import Metadata
from workbench.pool import StatePool
from workbench.profiles import Profile
from workbench.zoo import _harness as h
from workbench.zoo.case import ZooCase
from workbench.zoo.result import Evidence, RowsDiffer

EXPLANATION = (
    "At replay the engine fills the padded rows of the static `seq_lens` buffer with a fill value (1 for "
    "sglang's CUDA attention backends, 0 on Ascend, the number of draft tokens for one backend) and the "
    "linear-attention backend later recounts the padding as the number of entries equal to that value, "
    "assuming the padding sits at the tail. A live request whose length happens to equal the fill value is "
    "counted as padding too; and since the count is applied to the tail, the row marked as padding is not "
    "that request but the last live row, which is skipped: its state is not advanced and its output is "
    "zeros. A backend whose fill value differs from the one the buffer was filled with miscounts the other "
    "way. Here a decode step of three requests whose first has length 1 (sglang's fill) is padded to four: "
    "the host count says two padded rows, and request 3 loses its step. The fix carries the padding count "
    "from the batch size (`bucket - raw_batch_size`), which the scheduler knows, never from the values."
)


def _backend(from_batch_size: bool) -> type[MetadataBackend]:
    class HostPaddingCountBackend(MetadataBackend):
        """Re-derives the padded tail from a padding count, as the engine's replay hook does."""

        def init_forward_metadata_out_graph(self, batch: Batch, in_capture: bool = False) -> Metadata:
            meta = super().init_forward_metadata_out_graph(batch, in_capture=in_capture)
            if in_capture:
                return meta
            bs, fill = meta.batch_size, self.pool.profile.seq_len_fill
            if from_batch_size:
                num_padding = bs - batch.raw_batch_size
            else:
                num_padding = sum(v == fill for v in meta.seq_lens.tolist())  # the host mirror of seq_lens
            live = bs - num_padding
            meta.state_indices[live:].fill_(self.pool.profile.sentinel)
            steps = torch.arange(bs + 1, dtype=torch.int32, device=meta.query_start_loc.device)
            torch.clamp(steps, max=live, out=meta.query_start_loc)
            return meta

    return HostPaddingCountBackend


def variant(fixed: bool) -> type[MetadataBackend]:
    """The case's own backend: padding counted from fill values (unfixed) or from the batch size (fixed)."""
    return _backend(from_batch_size=fixed)


def fill_a_live_row_can_have(cls: type[MetadataBackend], profile: Profile) -> str | None:
    """The miscount needs a fill value that a live decode row's length can equal (at least 1)."""
    if profile.seq_len_fill >= 1:
        return None
    return (
        f"under {profile.name} padded seq_lens hold {profile.seq_len_fill}, a length no live decode row has: "
        "a count of fill values cannot take a live row (the case needs a fill of 1 or more, as sglang's)"
    )


def scenario(cls: type[MetadataBackend], profile: str, backend: str) -> list[Evidence]:
    """Capture decode buckets 1, 2, 4 with ``cls``; replay a step of three requests whose first has the
    profile's fill value as its length, padded to 4, and check it. Evidence of the bug: a live row's
    ``state_indices`` marked as padding."""
    name, device = h.resolve_backend(backend)
    pool = StatePool(16, profile, device=device)
    runner = h.make_runner(h.gdn_layer(device, pool.profile), pool, name, metadata_backend=cls)
    runner.capture(progress=False)
    rows = pool.alloc(3)
    fill = pool.profile.seq_len_fill
    batch = Batch.decode(rows, [fill, 8, 9], device=device)  # request 1 has the fill value's length
    step = h.replay_and_check(
        runner, batch, h.inputs_for(runner, batch, 0), what="decode replay", may_write=[pool.profile.dummy_slot]
    )
    return [h.metadata_rows_differ(runner, batch, rows=range(batch.raw_batch_size)), step]


CASE = ZooCase(
    name="fill_count",
    title="padding counted from seq-len fill values drops a live row",
    issue="sglang replay num_padding count",
    profile="sglang",
    explanation=EXPLANATION,
    subject="metadata_backend",
    scenario=scenario,
    variant=variant,
    mechanism=(RowsDiffer,),
    applies=fill_a_live_row_can_have,
    steps="pool of 16 slots, GDN layer (small, seed 0), decode buckets 1, 2, 4; capture(); one decode step "
    "of 3 requests with seq_lens (fill value, 8, 9) padded to 4: live rows' state_indices compared with "
    "build_metadata's, output and slots checked against the float64 reference",
)
