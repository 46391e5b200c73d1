"""A fake engine for the adapter machinery's tests in ``make test``: sglang's shape, written independently.

``FakeMambaBackend`` computes state indices and ``query_start_loc`` in plain Python the way sglang 0.5.23's
``MambaAttnBackendBase`` does (padded rows -1, ``query_start_loc`` repeating the live total; capture puts
every row on request row 0's slot), and its host-side update calls the private hook
``self._replay_metadata(..., in_capture=in_capture)``, the seed's shape. ``FakeAscendReverted`` is the seed:
an override without ``in_capture``. ``FakeOffByOne`` is a wrong engine: its padded ``query_start_loc``
counts one token too many. :class:`FakeAdapter` translates them to workbench metadata, as a real adapter.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

import torch

from workbench.batch import Batch
from workbench.engines.base import EngineAdapter, capture_skeleton
from workbench.metadata import Metadata, build_metadata


class FakeMambaBackend:
    """The engine's base: request-row -> slot ``mapping``, static per-bucket buffers."""

    def __init__(self, mapping: torch.Tensor, draft_tokens: int) -> None:
        self._mapping, self.draft_tokens = mapping, draft_tokens

    @property
    def mapping(self) -> list[int]:
        return self._mapping.tolist()

    def init_forward_metadata(self, fb: Any) -> dict[str, list[int]]:
        tokens = fb.extend_lens if fb.extend_lens is not None else [fb.tokens_per_row] * len(fb.req_pool_indices)
        starts = [0]
        for n in tokens:
            starts.append(starts[-1] + n)
        return {"state_indices": [self.mapping[r] for r in fb.req_pool_indices], "query_start_loc": starts}

    def init_forward_metadata_out_graph(self, fb: Any, in_capture: bool = False) -> dict[str, list[int]]:
        return self._replay_metadata(
            fb.batch_size, fb.req_pool_indices, fb.tokens_per_row, num_padding=fb.num_padding, in_capture=in_capture
        )

    def _replay_metadata(
        self, bs: int, req_pool_indices: list[int], tokens: int, num_padding: int = 0, in_capture: bool = False
    ) -> dict[str, list[int]]:
        if in_capture:  # the capture batch is all zeros: every row reads request row 0's slot
            return {"state_indices": [self.mapping[0]] * bs, "query_start_loc": [i * tokens for i in range(bs + 1)]}
        live = bs - num_padding
        state = [self.mapping[r] for r in req_pool_indices[:live]] + [-1] * num_padding
        starts = [i * tokens for i in range(live + 1)] + [live * tokens] * num_padding
        return {"state_indices": state, "query_start_loc": starts}


class FakeAscendReverted(FakeMambaBackend):
    """The seed (sglang PR 29598 reverted): the override does not take ``in_capture``."""

    def _replay_metadata(  # type: ignore[override]
        self, bs: int, req_pool_indices: list[int], tokens: int, num_padding: int = 0
    ) -> dict[str, list[int]]:
        return super()._replay_metadata(bs, req_pool_indices, tokens, num_padding)


class FakeOffByOne(FakeMambaBackend):
    """A wrong engine: the padded rows' ``query_start_loc`` is one past the live total."""

    def _replay_metadata(
        self, bs: int, req_pool_indices: list[int], tokens: int, num_padding: int = 0, in_capture: bool = False
    ) -> dict[str, list[int]]:
        out = super()._replay_metadata(bs, req_pool_indices, tokens, num_padding, in_capture)
        live = bs - num_padding
        out["query_start_loc"] = out["query_start_loc"][: live + 1] + [live * tokens + 1] * num_padding
        return out


class FakeAdapter(EngineAdapter):
    engine: ClassVar[str] = "fake"
    version: ClassVar[str] = "1.0"
    layers: ClassVar[tuple[str, ...]] = ("gdn",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cls = self.backend_class or FakeMambaBackend
        self.engine_backend = cls(self.pool.mapping[:, 0], self.draft_tokens)  # a view: later allocations show

    @property
    def profile(self) -> str:
        return "sglang"

    @property
    def default_class_name(self) -> str:
        return "FakeMambaBackend"

    def compared_fields(self, mode: str) -> tuple[str, ...]:
        return ("state_indices", "query_start_loc")

    def _translate(self, skeleton: Metadata, out: dict[str, list[int]]) -> Metadata:
        device = self.pool.device
        skeleton.state_indices = torch.tensor(out["state_indices"], dtype=torch.int32, device=device)
        skeleton.query_start_loc = torch.tensor(out["query_start_loc"], dtype=torch.int32, device=device)
        return skeleton

    def eager(self, batch: Batch) -> Metadata:
        fb = SimpleNamespace(
            req_pool_indices=batch.req_pool_indices.tolist(),
            tokens_per_row=batch.draft_tokens if batch.mode == "target_verify" else 1,
            extend_lens=batch.extend_lens.tolist() if batch.extend_lens is not None else None,
        )
        return self._translate(
            build_metadata(batch, self.pool, bucket=None), self.engine_backend.init_forward_metadata(fb)
        )

    def replay(self, batch: Batch, bucket: int) -> Metadata:
        r = batch.raw_batch_size
        fb = SimpleNamespace(
            batch_size=bucket,
            req_pool_indices=batch.req_pool_indices.tolist() + [0] * (bucket - r),
            tokens_per_row=batch.draft_tokens if batch.mode == "target_verify" else 1,
            num_padding=bucket - r,
        )
        skeleton = build_metadata(batch, self.pool, bucket=bucket, buckets=self.buckets)
        return self._translate(skeleton, self.engine_backend.init_forward_metadata_out_graph(fb))

    def capture(self, mode: str, bucket: int) -> Metadata:
        d = self.draft_tokens if mode == "target_verify" else 1
        fb = SimpleNamespace(batch_size=bucket, req_pool_indices=[0] * bucket, tokens_per_row=d, num_padding=0)
        skeleton = capture_skeleton(self.pool, mode, bucket, self.draft_tokens)
        return self._translate(skeleton, self.engine_backend.init_forward_metadata_out_graph(fb, in_capture=True))
