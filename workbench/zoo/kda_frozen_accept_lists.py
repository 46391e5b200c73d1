"""kda_frozen_accept_lists: the KDA backend builds its accepted-state index lists lazily on the step's metadata;
warm-up builds them, capture finds them built and records none, and every replay reads warm-up's lists
(sglang PR 38994, open; present in sglang 0.5.23).

Verified on sglang 0.5.23 (``.venv-engines``):

- ``layers/attention/linear/kda_backend.py:608-621``: ``_fused_accept_indices`` builds
  ``fused_accept_state_indices`` / ``fused_accept_num_accepted`` only ``if metadata.fused_accept_state_indices
  is None``, onto ``self.forward_metadata``; ``:1451-1459`` the verify forward passes them to the kernel when
  ``accept_lens_pool`` exists (``:552-557``: a FlashInfer verify backend, speculative decoding, no radix cache).
- ``model_executor/runner/decode_cuda_graph_runner.py:1400``: ``init_forward_metadata_out_graph(fb,
  in_capture=True)`` once, then ``run_once`` for the warm-ups and the capture alike
  (``runner_backend/full_cuda_graph_backend.py:162-173``: two warm-ups, then capture): one metadata object.
  ``on_after_cuda_graph_warmup`` (``layers/attention/base_attn_backend.py:295``) is not overridden by the KDA
  backend, so nothing clears the lists.
- ``layers/attention/linear/kernels/kda_flashinfer.py:61-85``: ``build_fused_accept_indices``, device ops only
  (capture-safe): had capture run it, replays would recompute it from the static slot buffer and
  ``accept_lens_pool``.

Run on the CPU: ``KDAAttnBackend`` builds through the adapter (``sglang_0_5_23.Adapter(backend_class=)``) with
Triton kernel backends; the FlashInfer verify backend that turns the fused-accept path on needs CUDA
(``kda_backend.py:171-176``), so ``accept_lens_pool`` is set as ``__init__`` sets it (``:552-557``). The
capture uses the workbench's CPU recorder. The fix modelled is PR 38994's: the in-graph metadata hook
(``init_forward_metadata_in_graph``) clears the two cached references, so the capture records the build.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

import kernels.gated_delta_rule as gdn
from workbench.graphs import get_backend
from workbench.measure.integrity import check, snapshot
from workbench.pool import StatePool
from workbench.zoo import _harness as h
from workbench.zoo.case import ZooCase
from workbench.zoo.result import Evidence, RowsDiffer

EXPLANATION = (
    "sglang's KDA backend, on its fused-accept verify path (FlashInfer's recurrent_kda, PR 33722), seeds "
    "each request's verify from the checkpoint of the step it accepted last round: row n starts from scratch "
    "row `fused_accept_state_indices[n, fused_accept_num_accepted[n] - 1]`. The two lists are built once per "
    "forward on the shared metadata, lazily: `if metadata.fused_accept_state_indices is None` "
    "(`kda_backend.py:608`, sglang 0.5.23). The graph runner hands the same metadata object to both warm-ups "
    "and the capture, so warm-up builds the lists eagerly, from the capture batch (every row on the dummy "
    "slot, accept length 1), and the capture finds them built and records no build. Every replay then reads "
    "warm-up's arrays: each request is seeded from the dummy slot's first checkpoint instead of its own "
    "accepted one, and its new checkpoints land on the dummy slot. The case shows it on sglang 0.5.23's own "
    "`KDAAttnBackend` where the engine is installed (the lists a replay reads against those the replay's "
    "buffers give), and always on the workbench's model of the backend: a KDA verify step "
    "(`gated_delta_rule.recurrent` with `gk`) captured on the CPU recorder after two warm-ups, replayed for "
    "three requests that accepted 2, 1, 2 tokens. The fix (PR 38994): clear the cached lists in the in-graph "
    "metadata hook, so the capture records their build and a replay recomputes them from its own slots."
)

HV, H, K, V = 2, 2, 8, 12
NUM_SLOTS, BUCKET, DRAFT = 16, 4, 2
ACCEPTED = (2, 1, 2)
"""Tokens each of the replay's three requests accepted last round (``accept_lens_pool`` at their slots)."""


def build_accept_lists(
    slots: torch.Tensor, scratch_steps: int, draft_tokens: int, accept_lens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """sglang 0.5.23's ``build_fused_accept_indices`` (``kda_flashinfer.py:61-85``): row n's scratch rows
    ``slot * scratch_steps + step`` (negative for a padded row), and its accept length (a padded row reads
    slot 0's)."""
    step = torch.arange(draft_tokens, device=slots.device, dtype=torch.int32)
    rows = (slots.to(torch.int32)[:, None] * scratch_steps + step[None, :]).contiguous()
    return rows, accept_lens.index_select(0, slots.clamp(min=0).to(torch.int64))


@dataclass
class _Meta:
    """The step's forward metadata: the static slot buffer, and the lists built from it (None: not yet)."""

    state_indices: torch.Tensor
    fused_accept_state_indices: torch.Tensor | None = None
    fused_accept_num_accepted: torch.Tensor | None = None


class LazyAcceptBackend:
    """The workbench's model of the KDA backend's fused-accept metadata: a static slot buffer of the bucket,
    written by the host-side update (``init_forward_metadata_out_graph``, a fresh metadata object each
    call, as sglang's ``_replay_metadata``), and the accepted-state lists built lazily on first use
    (``fused_accept_indices``). ``clear_in_graph``: the fix, the in-graph hook clears the lists."""

    def __init__(self, pool: StatePool, clear_in_graph: bool) -> None:
        self.pool, self.clear_in_graph = pool, clear_in_graph
        self.slots = torch.full((BUCKET,), -1, dtype=torch.int32, device=pool.device)
        self.accept_lens = torch.ones(pool.num_slots, dtype=torch.int32, device=pool.device)
        self.forward_metadata = _Meta(self.slots)

    def init_forward_metadata_out_graph(self, slots: list[int]) -> None:
        self.slots.fill_(-1)
        self.slots[: len(slots)].copy_(torch.tensor(slots, dtype=torch.int32))
        self.forward_metadata = _Meta(self.slots)

    def init_forward_metadata_in_graph(self) -> None:
        if self.clear_in_graph:  # PR 38994
            self.forward_metadata.fused_accept_state_indices = None
            self.forward_metadata.fused_accept_num_accepted = None

    def fused_accept_indices(self) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.forward_metadata
        if m.fused_accept_state_indices is None:  # kda_backend.py:608
            m.fused_accept_state_indices, m.fused_accept_num_accepted = build_accept_lists(
                m.state_indices, DRAFT, DRAFT, self.accept_lens
            )
        assert m.fused_accept_num_accepted is not None
        return m.fused_accept_state_indices, m.fused_accept_num_accepted


def _verify(
    x: dict[str, torch.Tensor], scratch: torch.Tensor, rows: torch.Tensor, nat: torch.Tensor, seed: torch.Tensor
) -> torch.Tensor:
    """One fused-accept KDA verify: row n starts from scratch row ``rows[n, nat[n] - 1]`` (a padded row,
    negative, is skipped), runs its ``DRAFT`` tokens, and writes its state after each into ``rows[n]``."""
    n = rows.shape[0]
    live = rows[:, 0] >= 0
    start = rows.gather(1, (nat.to(torch.int64) - 1).clamp(min=0)[:, None])[:, 0].clamp(min=0).to(torch.int64)
    seed.copy_(scratch.index_select(0, start))
    idx = torch.where(live, torch.arange(n, dtype=torch.int32, device=rows.device), -1)
    qsl = torch.arange(0, (n + 1) * DRAFT, DRAFT, dtype=torch.int32, device=rows.device)
    inter = torch.zeros(n, DRAFT, *scratch.shape[1:], dtype=scratch.dtype, device=scratch.device)
    out = gdn.recurrent(
        x["q"], x["k"], x["v"], gk=x["gk"], beta=x["beta"], state=seed, state_indices=idx, cu_seqlens=qsl,
        intermediate_states=inter, disable_state_update=True,
    )  # fmt: skip
    keep = torch.where(live[:, None], rows, rows.new_tensor(0)).reshape(-1).to(torch.int64)  # padded: dummy rows
    kept = scratch.index_select(0, keep).view_as(inter)  # a padded row leaves the dummy slot's rows as they are
    scratch.index_copy_(0, keep, torch.where(live[:, None, None, None, None], inter, kept).flatten(0, 1))
    return out


def _inputs(tokens: int, device: torch.device, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "q": torch.randn(tokens, H, K, generator=g).to(device),
        "k": torch.randn(tokens, H, K, generator=g).to(device),
        "v": torch.randn(tokens, HV, V, generator=g).to(device),
        "gk": (-torch.rand(tokens, HV, K, generator=g) * 0.5).to(device),
        "beta": torch.rand(tokens, HV, generator=g).to(device),
    }


def model_run(fixed: bool, backend: str) -> list[Evidence]:
    """The workbench's model: capture a verify bucket of 4 (D = 2) on the recorder after two warm-ups, replay
    three requests that accepted ``ACCEPTED``; the lists the replay read, and every slot's checkpoints
    against the float64 reference built from the right lists."""
    name, device = h.resolve_backend(backend)
    pool = StatePool(NUM_SLOTS, "sglang", device=device)
    be = LazyAcceptBackend(pool, clear_in_graph=fixed)
    scratch = torch.randn(NUM_SLOTS * DRAFT, HV, K, V, generator=torch.Generator().manual_seed(1)).to(device)
    x = _inputs(BUCKET * DRAFT, device, seed=2)
    seed = torch.zeros(BUCKET, HV, K, V, device=device)
    out = torch.zeros(BUCKET * DRAFT, HV, V, device=device)
    read_rows = torch.zeros(BUCKET, DRAFT, dtype=torch.int32, device=device)
    read_nat = torch.zeros(BUCKET, dtype=torch.int32, device=device)

    def step() -> tuple[torch.Tensor, ...]:
        be.init_forward_metadata_in_graph()
        rows, nat = be.fused_accept_indices()
        read_rows.copy_(rows)
        read_nat.copy_(nat)
        out.copy_(_verify(x, scratch, rows, nat, seed))
        return out, read_rows, read_nat

    dummy = pool.profile.dummy_slot
    be.init_forward_metadata_out_graph([dummy] * BUCKET)  # the capture batch: every row on the dummy slot
    for _ in range(2):  # the runner's two warm-ups, then the capture, on one metadata object
        step()
    graph = get_backend(name).capture(step, warmup=0)
    rows_ = pool.alloc(3)
    live = [pool.slots_of(int(r))[0] for r in rows_]
    be.accept_lens[torch.tensor(live)] = torch.tensor(ACCEPTED, dtype=torch.int32)
    x_new = _inputs(BUCKET * DRAFT, device, seed=3)
    for k_, t in x.items():
        t.copy_(x_new[k_])
    per_slot = scratch.view(NUM_SLOTS, DRAFT, HV, K, V)
    pre = snapshot({"kda_checkpoints": per_slot})
    # the reference: the right lists, float64, the three live requests alone
    want_rows, want_nat = build_accept_lists(torch.tensor(live, dtype=torch.int32), DRAFT, DRAFT, be.accept_lens)
    ref_scratch = scratch.double().clone()
    x64 = {k_: t[: 3 * DRAFT].double() for k_, t in x.items()}
    ref_out = _verify(x64, ref_scratch, want_rows, want_nat, torch.zeros(3, HV, K, V, dtype=torch.float64))
    be.init_forward_metadata_out_graph(live)  # the host-side update before the replay
    graph.replay()
    report = check(
        pre,
        {"kda_checkpoints": per_slot},
        allowed_slots=[*live, dummy],
        live_slots=live,
        reference_state={"kda_checkpoints": ref_scratch.view(NUM_SLOTS, DRAFT, HV, K, V)},
        live_outputs=out[: 3 * DRAFT],
        reference_outputs=ref_out,
    )
    ev = h.integrity_evidence("verify replay", report, pool, pre, {"kda_checkpoints": per_slot}, live, [dummy])
    got_nat, got_rows = read_nat[:3].tolist(), read_rows[:3].tolist()
    return [
        ev,
        _differ("fused_accept_num_accepted (model)", got_nat, want_nat.tolist()),
        _differ("fused_accept_state_indices (model)", got_rows, want_rows.tolist()),
    ]


def _differ(what: str, got: list[Any], want: list[Any]) -> RowsDiffer:
    rows = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
    return RowsDiffer(
        what, rows, got=[got[i] for i in rows], expected=[want[i] for i in rows], field_name=what.split()[0]
    )


def engine_run(fixed: bool) -> list[Evidence]:
    """sglang 0.5.23's own ``KDAAttnBackend`` (unfixed) or a subclass whose in-graph hook clears the lists (PR
    38994): capture a verify bucket of 4 (D = 2) on the recorder as the runner does, replay three requests that
    accepted ``ACCEPTED``; the lists the replay read against ``build_fused_accept_indices`` of its buffers."""
    from workbench.batch import Batch
    from workbench.engines import sglang_0_5_23 as sg

    sg.load()
    kda: Any = sg._import("sglang.srt.layers.attention.linear.kda_backend")
    kfi: Any = sg._import("sglang.srt.layers.attention.linear.kernels.kda_flashinfer")
    cls: Any = kda.KDAAttnBackend
    if fixed:

        class ClearsAcceptLists(cls):
            def init_forward_metadata_in_graph(self, forward_batch: Any) -> None:
                super().init_forward_metadata_in_graph(forward_batch)
                meta = getattr(self, "forward_metadata", None)
                if self.accept_lens_pool is not None and meta is not None:
                    meta.fused_accept_state_indices = None
                    meta.fused_accept_num_accepted = None

        cls = ClearsAcceptLists
    pool = StatePool(NUM_SLOTS, "sglang")
    adapter = sg.Adapter(pool, [BUCKET], draft_tokens=DRAFT, backend_class=cls)
    be = adapter.backend
    be.accept_lens_pool = torch.ones(be.req_to_token_pool.size + 1, dtype=torch.int32)  # kda_backend.py:552-557
    fb = adapter._capture_batch(Batch.for_capture("target_verify", BUCKET, DRAFT))
    be.init_forward_metadata_out_graph(fb, in_capture=True)  # decode_cuda_graph_runner.py:1400
    scratch = torch.zeros(pool.num_slots, DRAFT, 1)  # only its shape[1] is read
    read_rows = torch.zeros(BUCKET, DRAFT, dtype=torch.int32)
    read_nat = torch.zeros(BUCKET, dtype=torch.int32)

    def run_once() -> tuple[torch.Tensor, torch.Tensor]:
        be.init_forward_metadata_in_graph(fb)  # _run_in_graph_metadata_prep
        meta = be.forward_metadata
        rows, nat = be._fused_accept_indices(  # what _forward_target_verify passes the kernel (:1451-1459)
            cache_indices=meta.mamba_cache_indices,
            query_start_loc=meta.query_start_loc,
            intermediate_state_cache=scratch,
            draft_token_num=DRAFT,
        )
        read_rows.copy_(rows)
        read_nat.copy_(nat)
        return read_rows, read_nat

    for _ in range(2):  # full_cuda_graph_backend.py:162-173
        run_once()
        be.on_after_cuda_graph_warmup()
    graph = get_backend("cpu").capture(run_once, warmup=0)
    rows_ = pool.alloc(3)
    live = [pool.slots_of(int(r))[0] for r in rows_]
    be.accept_lens_pool[torch.tensor(live)] = torch.tensor(ACCEPTED, dtype=torch.int32)
    adapter.replay(Batch.target_verify(rows_, [7, 8, 9], draft_tokens=DRAFT), BUCKET)
    graph.replay()
    want_rows, want_nat = kfi.build_fused_accept_indices(
        slots=be.forward_metadata.mamba_cache_indices[:BUCKET],
        scratch_steps=DRAFT,
        draft_token_num=DRAFT,
        accept_lens_pool=be.accept_lens_pool,
    )
    return [
        _differ("fused_accept_num_accepted (sglang 0.5.23 KDAAttnBackend)", read_nat.tolist(), want_nat.tolist()),
        _differ("fused_accept_state_indices (sglang 0.5.23 KDAAttnBackend)", read_rows.tolist(), want_rows.tolist()),
    ]


def engine_installed() -> bool:
    """Whether sglang is installed at a verified release (read from its metadata, nothing imported)."""
    from workbench.engines import installed_engines

    return "sglang" in installed_engines()


def _run(fixed: bool, backend: str) -> list[Evidence]:
    evidence = model_run(fixed, backend)
    if engine_installed() and h.resolve_backend(backend)[0] == "cpu":
        evidence += engine_run(fixed)
    return evidence


CASE = ZooCase(
    name="kda_frozen_accept_lists",
    title="KDA's accepted-state lists built lazily in warm-up: every replay reads warm-up's",
    issue="sglang PR 38994",
    profile="sglang",
    explanation=EXPLANATION,
    run_fn=_run,
    why_not="the lists are built inside sglang's KDA backend, not behind the workbench's metadata hooks; the "
    "case runs sglang's own KDAAttnBackend where sglang 0.5.23 is installed (`tests/engines/test_sglang_kda.py`)",
    steps="16 slots (sglang), KDA states HV=2, K=8, V=12, a verify bucket of 4 with 2 draft tokens: two "
    "warm-ups and a capture on the CPU recorder from the capture batch (all rows on dummy slot 0), then a "
    "replay of 3 requests that accepted 2, 1, 2 tokens; the lists read and each slot's checkpoints against "
    "the float64 reference; where sglang 0.5.23 is installed, the same on its KDAAttnBackend",
)
