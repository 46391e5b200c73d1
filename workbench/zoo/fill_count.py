"""fill_count: padding counted on the host from seq-len fill values miscounts when a live row's length
equals the fill value; the live row dropped is the last one (sglang's num_padding count)."""

from __future__ import annotations

import torch

from workbench.backends import MetadataBackend
from workbench.batch import Batch
from workbench.metadata import Metadata
from workbench.pool import StatePool
from workbench.zoo import _harness as h
from workbench.zoo.case import ZooCase
from workbench.zoo.result import Evidence

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


def _run(fixed: bool, backend: str) -> list[Evidence]:
    name, device = h.resolve_backend(backend)
    pool = StatePool(16, "sglang", device=device)
    runner = h.make_runner(h.gdn_layer(device), pool, name, metadata_backend=_backend(from_batch_size=fixed))
    runner.capture(progress=False)
    rows = pool.alloc(3)
    batch = Batch.decode(rows, [1, 8, 9], device=device)  # request 1 has the fill value's length
    step = h.replay_and_check(
        runner, batch, h.inputs_for(runner, batch, 0), what="decode replay", may_write=[pool.profile.dummy_slot]
    )
    return [h.metadata_rows_differ(runner, batch), step]


CASE = ZooCase(
    name="fill_count",
    title="padding counted from seq-len fill values drops a live row",
    issue="sglang replay num_padding count",
    profile="sglang",
    explanation=EXPLANATION,
    run_fn=_run,
)
