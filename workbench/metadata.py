"""Per-step metadata of a linear-attention layer: build it (eager), write it in place (graph), validate it.

For ``r`` live requests padded to bucket ``bs`` (``p = bs - r`` padded rows at the tail):

- ``state_indices`` int32 ``[bs]`` (vLLM verify: ``[bs, D]``): live rows ``mapping[req_pool_indices[i]]``,
  padded rows the profile's sentinel.
- ``query_start_loc`` int32 ``[bs+1]``: decode ``[0,1,..,r, r,..,r]``, verify ``[0,D,..,rD, rD,..,rD]``,
  extend the cumulative extend lengths; padded rows are zero-length.
- ``seq_lens`` int32 ``[bs]`` padded with the profile's fill value; ``req_pool_indices`` int64 padded with the
  reserved request row (0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from workbench import html
from workbench.batch import Batch
from workbench.buckets import above_largest, capture_buckets, check_buckets, choose_bucket, resolve_bucket
from workbench.errors import MetadataError
from workbench.limits import INT32_MAX, check_memory
from workbench.pool import StatePool
from workbench.profiles import Profile, default_bucket_bytes
from workbench.tables import format_table

GRAPH_MODES = ("decode", "target_verify")


@dataclass
class Metadata:
    """Everything a linear-attention kernel reads about one (padded) step.

    Tensors are on the pool's device. ``raw_batch_size`` live rows come first; the rest is padding.
    ``bucket`` is the captured batch size used, or None when the step is not padded for a graph;
    ``eager_reason`` says why a step that asked for a bucket runs eagerly.

    Ascend's verify also carries (``NpuMetadataBackend`` fills it; None elsewhere)
    ``intermediate_token_indices``, int32 ``[bs * D]``, each verify token's row in the intermediate buffer
    (sglang-ascend's ``gdn_token_indices``).

    A Metadata returned by ``MetadataBuffers.update`` is the bucket's static buffer: the next update of
    that bucket rewrites it in place. :meth:`clone` keeps a copy.
    """

    profile: Profile
    forward_mode: str
    raw_batch_size: int
    draft_tokens: int
    state_indices: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    req_pool_indices: torch.Tensor
    has_initial_state: torch.Tensor
    extend_lens: torch.Tensor | None = None
    num_accepted_tokens: torch.Tensor | None = None
    intermediate_state_indices: torch.Tensor | None = None
    bucket: int | None = None
    eager_reason: str | None = None
    intermediate_token_indices: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.query_start_loc.numel() - 1

    @property
    def num_padding(self) -> int:
        return self.batch_size - self.raw_batch_size

    @property
    def num_tokens(self) -> int:
        """Live tokens, ``query_start_loc[-1]`` (a host read)."""
        return int(self.query_start_loc[-1])

    def tensors(self) -> dict[str, torch.Tensor]:
        """The metadata tensors by name (those that exist for this mode and profile)."""
        names = (
            "state_indices",
            "query_start_loc",
            "seq_lens",
            "req_pool_indices",
            "has_initial_state",
            "extend_lens",
            "num_accepted_tokens",
            "intermediate_state_indices",
            "intermediate_token_indices",
        )
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def clone(self) -> Metadata:
        """A copy with its own tensors: what a step's metadata was, kept past the next in-place update."""
        copies = {
            f.name: getattr(self, f.name).clone()
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return replace(self, **copies)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per batch row (host copies), for tables and figures."""
        qsl = self.query_start_loc.tolist()
        idx = self.state_indices.tolist()
        sl = self.seq_lens.tolist()
        rpi = self.req_pool_indices.tolist()
        init = self.has_initial_state.tolist()
        acc = None if self.num_accepted_tokens is None else self.num_accepted_tokens.tolist()
        out = []
        for i in range(self.batch_size):
            row = {
                "row": i,
                "kind": "live" if i < self.raw_batch_size else "pad",
                "req_pool_index": rpi[i],
                "state_index": idx[i],
                "seq_len": sl[i],
                "qsl_start": qsl[i],
                "qsl_end": qsl[i + 1],
                "num_tokens": qsl[i + 1] - qsl[i],
                "has_initial_state": bool(init[i]),
            }
            if acc is not None:
                row["num_accepted_tokens"] = acc[i]
            out.append(row)
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary and tensors."""
        return {
            "profile": self.profile.name,
            "forward_mode": self.forward_mode,
            "raw_batch_size": self.raw_batch_size,
            "batch_size": self.batch_size,
            "num_padding": self.num_padding,
            "draft_tokens": self.draft_tokens,
            "bucket": self.bucket,
            "eager_reason": self.eager_reason,
            "sentinel": self.profile.sentinel,
            "kernel_guard": self.profile.guard,
            **{name: t.tolist() for name, t in self.tensors().items()},
        }

    def facts(self) -> dict[str, object]:
        """The batch facts: profile, mode, raw and padded batch size, bucket, sentinel, guard (and D in verify)."""
        prof = self.profile
        out: dict[str, object] = {
            "profile": prof.name,
            "mode": self.forward_mode,
            "raw_bs": self.raw_batch_size,
            "bs": self.batch_size,
            "padding": self.num_padding,
            "bucket": self.bucket,
            "sentinel": prof.sentinel,
            "guard": prof.guard,
        }
        if self.forward_mode == "target_verify":
            out["D"] = self.draft_tokens
        return out

    def facts_line(self) -> str:
        """:meth:`facts` on one line, as the text table's header shows them."""
        return "  ".join(f"{k}: {v}" if k == "guard" else f"{k}={v}" for k, v in self.facts().items())

    def table(self) -> str:
        """A readable text table: a header with the batch facts, then one line per row (padded rows ``pad``)."""
        head = self.facts_line()
        if self.eager_reason:
            head += f"\nnote: {self.eager_reason}"
        cols = ["row", "kind", "req_pool_index", "state_index", "seq_len", "qsl_start", "qsl_end", "num_tokens"]
        if self.num_accepted_tokens is not None:
            cols.append("num_accepted_tokens")
        qsl = "query_start_loc = " + str(self.query_start_loc.tolist())
        return f"{head}\n{format_table(self.rows(), cols)}\n{qsl}"

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        # host reads: a notebook/debugging view, never on the replay hot path
        head = f"{self.profile.name} {self.forward_mode}"
        if self.forward_mode == "target_verify":
            head += f" D={self.draft_tokens}"
        size = f"raw_bs={self.raw_batch_size}"
        size += f" -> bs={self.batch_size} (bucket)" if self.bucket is not None else f", bs={self.batch_size}"
        if self.state_indices.is_meta:  # shapes only: a "meta" tensor holds no values
            return f"Metadata({head}, {size}, on the meta device)"
        idx = html.short_list(self.state_indices.tolist())
        qsl = html.short_list(self.query_start_loc.tolist())
        return f"Metadata({head}, {size}, state_indices={idx}, query_start_loc={qsl})"

    def _repr_html_(self) -> str:
        head = self.facts()
        cols = ["row", "kind", "req_pool_index", "state_index", "seq_len", "qsl_start", "qsl_end", "num_tokens"]
        if self.num_accepted_tokens is not None:
            cols.append("num_accepted_tokens")
        parts = [html.facts(head)]
        if self.eager_reason:
            parts.append(html.note(f"note: {self.eager_reason}"))
        if self.state_indices.is_meta:
            return html.block(*parts, html.note("on the meta device: shapes only, no values"), title="Metadata")
        rows = self.rows()
        parts.append(
            html.table(cols, [[r[c] for c in cols] for r in rows], row_kinds=[r["kind"] for r in rows], max_rows=40)
        )
        parts.append(html.note("query_start_loc = " + html.short_list(self.query_start_loc.tolist(), limit=40)))
        return html.block(*parts, title="Metadata")


def tokens_per_row(mode: str, draft_tokens: int) -> int:
    """Tokens each batch row carries in a graph mode (``draft_tokens`` in target_verify, else 1)."""
    return draft_tokens if mode == "target_verify" else 1


# -- eager build ----------------------------------------------------------------------------------------
def _resolve_bucket(
    batch: Batch, pool: StatePool, bucket: int | str | None, buckets: Sequence[int] | None
) -> tuple[int, int | None, str | None]:
    """(padded batch size, captured bucket or None, eager reason or None)."""
    r = batch.raw_batch_size
    if bucket is None:
        return r, None, None
    known = _default_buckets(pool, batch.mode == "target_verify") if buckets is None else check_buckets(buckets)
    bs = resolve_bucket(r, known, bucket)
    if bs is None:
        return r, None, f"{above_largest(r, known)}: runs eagerly"
    return bs, bs, None


def _default_buckets(pool: StatePool, speculative: bool) -> list[int]:
    # a pool of 10^9 slots makes a list of ~31M Python ints: refuse it before building it, not after
    n = pool.capacity
    check_memory(f"num_slots={pool.num_slots}", default_bucket_bytes(n), f"the default bucket list up to {n:,}")
    return capture_buckets(n, speculative, pool.profile)


def _row_bytes(pool: StatePool) -> int:
    """Metadata bytes per padded row: state indices (one int32 per slot a request owns), qsl, seq_lens,
    num_accepted, intermediate indices (int32), req_pool_indices (int64), has_initial_state (bool)."""
    return 4 * pool.slots_per_request + 4 * 4 + 8 + 1


def _check_padded_memory(name: str, rows: int, pool: StatePool) -> None:
    # A bucket is a user-given int: 10^10 would otherwise reach torch.full as an out-of-memory error.
    check_memory(name, rows * _row_bytes(pool), f"metadata of {rows:,} padded rows", pool.device)


def _check_allocated(batch: Batch, pool: StatePool) -> None:
    for i, row in enumerate(batch.req_pool_indices.tolist()):
        if not pool.is_allocated(row):
            raise MetadataError(f"req_pool_indices[{i}] = {row}: request not allocated in the pool")


def _live_index_table(pool: StatePool, mode: str, draft_tokens: int) -> torch.Tensor:
    """The mapping the live rows gather from: ``[rows]``, or ``[rows, D]`` for vLLM spec decode."""
    if mode == "target_verify" and pool.profile.spec_indices_2d:
        if pool.slots_per_request != draft_tokens:
            raise MetadataError(
                f"slots_per_request={pool.slots_per_request}: profile {pool.profile.name!r} keeps one slot "
                f"per draft position in target_verify, so the pool needs slots_per_request=D={draft_tokens}"
            )
        return pool.mapping
    return pool.mapping[:, 0]


def build_metadata(
    batch: Batch,
    pool: StatePool,
    bucket: int | str | None = "auto",
    *,
    buckets: Sequence[int] | None = None,
) -> Metadata:
    """Build the padded metadata of ``batch`` (eager path; allocates fresh tensors).

    Args:
        batch: the live requests.
        pool: the state pool they were allocated from (its profile decides the padding).
        bucket: "auto" (smallest captured bucket that holds the batch), an int (must be captured), or None
            (no padding). A batch above the largest bucket runs eagerly: ``bucket`` is None and
            ``eager_reason`` says why.
        buckets: the captured bucket list; default: the profile's list for ``pool.capacity``.
    """
    if not isinstance(batch, Batch):
        raise MetadataError(f"batch must be a workbench.Batch, got {type(batch).__name__}")
    if not isinstance(pool, StatePool):
        raise MetadataError(f"pool must be a workbench.StatePool, got {type(pool).__name__}")
    if batch.device != pool.device:
        raise MetadataError(f"batch.req_pool_indices is on {batch.device}, the pool on {pool.device}")
    _check_allocated(batch, pool)
    prof = pool.profile
    r = batch.raw_batch_size
    bs, captured, reason = _resolve_bucket(batch, pool, bucket, buckets)
    _check_padded_memory(f"bucket={bs}", bs, pool)
    dev = pool.device
    mode = batch.mode
    d = batch.draft_tokens

    table = _live_index_table(pool, mode, d)
    state_indices = torch.full((bs, *table.shape[1:]), prof.sentinel, dtype=torch.int32, device=dev)
    state_indices[:r] = table[batch.req_pool_indices]

    lens = torch.zeros(bs, dtype=torch.int32, device=dev)
    if mode == "extend" and batch.extend_lens is not None:
        lens[:r] = batch.extend_lens
    else:
        lens[:r] = d if mode != "idle" else 0
    qsl = torch.zeros(bs + 1, dtype=torch.int32, device=dev)
    qsl[1:] = torch.cumsum(lens, 0)

    seq_lens = torch.full((bs,), prof.seq_len_fill, dtype=torch.int32, device=dev)
    seq_lens[:r] = batch.seq_lens
    rpi = torch.full((bs,), prof.reserved_request_row, dtype=torch.int64, device=dev)
    rpi[:r] = batch.req_pool_indices
    init = torch.zeros(bs, dtype=torch.bool, device=dev)
    init[:r] = batch.prefix_lens > 0 if (mode == "extend" and batch.prefix_lens is not None) else True

    meta = Metadata(
        profile=prof,
        forward_mode=mode,
        raw_batch_size=r,
        draft_tokens=d,
        state_indices=state_indices,
        query_start_loc=qsl,
        seq_lens=seq_lens,
        req_pool_indices=rpi,
        has_initial_state=init,
        bucket=captured,
        eager_reason=reason,
    )
    if mode == "extend":
        meta.extend_lens = lens
    if mode == "target_verify":
        if prof.num_accepted_fill is not None:
            acc = torch.full((bs,), prof.num_accepted_fill, dtype=torch.int32, device=dev)
            if batch.num_accepted_tokens is not None:
                acc[:r] = batch.num_accepted_tokens
            meta.num_accepted_tokens = acc
        if prof.verify_intermediate_by_row:
            meta.intermediate_state_indices = torch.arange(bs, dtype=torch.int32, device=dev)
    return meta


# -- validation -----------------------------------------------------------------------------------------
def _fail(field_name: str, row: int | None, msg: str) -> MetadataError:
    where = f"{field_name}[{row}]" if row is not None else field_name
    return MetadataError(f"{where}: {msg}")


def validate(meta: Metadata, pool: StatePool) -> None:
    """Check the invariants of DESIGN.md; raise MetadataError naming the field and the row.

    Live indices unique, in range, never the dummy slot, and owned by the row's request; padded rows exactly
    the sentinel; padding only at the tail; ``qsl[0] = 0``, non-decreasing, live rows of the mode's length,
    padded rows zero-length; padded ``seq_lens`` and ``req_pool_indices`` hold the profile's fill values.
    Reads everything to the host: a debugging check, not for the replay hot path.
    """
    prof = pool.profile
    bs, r = meta.batch_size, meta.raw_batch_size
    if not 0 <= r <= bs:
        raise _fail("raw_batch_size", None, f"{r} not in [0, batch_size={bs}]")
    for name, t in meta.tensors().items():
        if t.device != pool.device:
            raise _fail(name, None, f"on device {t.device}, the pool on {pool.device}")
    for name in ("state_indices", "query_start_loc", "seq_lens"):
        t = getattr(meta, name)
        if t.dtype != torch.int32:
            raise _fail(name, None, f"dtype {t.dtype}, expected torch.int32")
    if meta.forward_mode == "target_verify" and prof.spec_indices_2d:
        want: tuple[int, ...] = (bs, meta.draft_tokens)
    elif meta.forward_mode == "idle" and prof.spec_indices_2d and meta.state_indices.dim() == 2:
        want = (bs, meta.state_indices.shape[1])  # an idle step run by a spec-decode graph
    else:
        want = (bs,)
    if tuple(meta.state_indices.shape) != want:
        raise _fail("state_indices", None, f"shape {tuple(meta.state_indices.shape)}, expected {want}")
    for name in ("seq_lens", "req_pool_indices", "has_initial_state"):
        if getattr(meta, name).shape != (bs,):
            raise _fail(name, None, f"shape {tuple(getattr(meta, name).shape)}, expected ({bs},)")
    for name, dtype in (("req_pool_indices", torch.int64), ("has_initial_state", torch.bool)):
        if getattr(meta, name).dtype != dtype:
            raise _fail(name, None, f"dtype {getattr(meta, name).dtype}, expected {dtype}")
    if meta.forward_mode == "extend" and meta.extend_lens is None:
        raise _fail("extend_lens", None, "missing: an extend step needs its per-row lengths")

    idx = [v if isinstance(v, list) else [v] for v in meta.state_indices.tolist()]
    rpi = meta.req_pool_indices.tolist()
    seen: dict[int, int] = {}
    for i in range(bs):
        if i >= r:
            if any(v != prof.sentinel for v in idx[i]):
                raise _fail("state_indices", i, f"padded row holds {idx[i]}, expected the sentinel {prof.sentinel}")
            continue
        if not pool.is_allocated(rpi[i]):
            raise _fail("req_pool_indices", i, f"row {rpi[i]} is not an allocated request")
        owned = pool.slots_of(rpi[i])
        for j, v in enumerate(idx[i]):
            if v == prof.sentinel:
                raise _fail("state_indices", i, f"live row holds the sentinel {v}: padding only at the tail")
            if not 0 <= v < pool.num_slots:
                raise _fail("state_indices", i, f"slot {v} out of range [0, {pool.num_slots})")
            if v == prof.dummy_slot:
                raise _fail("state_indices", i, f"live row points at the reserved dummy slot {v}")
            if v in seen:
                raise _fail("state_indices", i, f"slot {v} also used by row {seen[v]}")
            if v != owned[j]:
                raise _fail("state_indices", i, f"slot {v}, but request row {rpi[i]} owns slot {owned[j]}")
            seen[v] = i

    qsl = meta.query_start_loc.tolist()
    if len(qsl) != bs + 1:
        raise _fail("query_start_loc", None, f"length {len(qsl)}, expected batch_size+1 = {bs + 1}")
    if qsl[0] != 0:
        raise _fail("query_start_loc", 0, f"= {qsl[0]}, must be 0")
    expected = _expected_lens(meta)
    for i in range(bs):
        n = qsl[i + 1] - qsl[i]
        if n < 0:
            raise _fail("query_start_loc", i + 1, f"{qsl[i + 1]} < {qsl[i]}: must be non-decreasing")
        if n != expected[i]:
            kind = "padded row must be zero-length" if i >= r else f"{meta.forward_mode} row has {expected[i]} tokens"
            raise _fail("query_start_loc", i + 1, f"batch row {i} has {n} tokens; {kind}")

    sl = meta.seq_lens.tolist()
    for i in range(bs):
        if i >= r and sl[i] != prof.seq_len_fill:
            raise _fail("seq_lens", i, f"padded row holds {sl[i]}, expected fill {prof.seq_len_fill}")
        if i < r and sl[i] < 1:
            raise _fail("seq_lens", i, f"live row holds {sl[i]}, must be >= 1")
        if i >= r and rpi[i] != prof.reserved_request_row:
            raise _fail("req_pool_indices", i, f"padded row holds {rpi[i]}, expected {prof.reserved_request_row}")
    init = meta.has_initial_state.tolist()
    for i in range(bs):
        if i >= r and init[i]:
            raise _fail("has_initial_state", i, "padded row claims an initial state")
        if i < r and meta.forward_mode in GRAPH_MODES and not init[i]:
            raise _fail("has_initial_state", i, f"live {meta.forward_mode} row must read its state")
    _validate_verify_extras(meta, prof)


def _validate_verify_extras(meta: Metadata, prof: Profile) -> None:
    """vLLM's num_accepted_tokens and sglang's by-row intermediate indices."""
    bs, r, d = meta.batch_size, meta.raw_batch_size, meta.draft_tokens
    acc = meta.num_accepted_tokens
    if meta.forward_mode == "target_verify" and prof.num_accepted_fill is not None:
        if acc is None:
            raise _fail("num_accepted_tokens", None, f"missing: profile {prof.name!r} needs it in target_verify")
        if acc.dtype != torch.int32 or acc.shape != (bs,):
            raise _fail("num_accepted_tokens", None, f"{acc.dtype}{list(acc.shape)}, expected torch.int32[{bs}]")
        for i, a in enumerate(acc.tolist()):
            if i < r and not 1 <= a <= d:
                raise _fail("num_accepted_tokens", i, f"live row holds {a}, must be in 1..D={d}")
            if i >= r and a != prof.num_accepted_fill:
                raise _fail("num_accepted_tokens", i, f"padded row holds {a}, expected fill {prof.num_accepted_fill}")
    inter = meta.intermediate_state_indices
    if inter is not None:
        want = list(range(bs))
        got = inter.tolist()
        if got != want:
            row = next(i for i in range(max(len(got), bs)) if i >= len(got) or i >= bs or got[i] != want[i])
            raise _fail("intermediate_state_indices", row, "must be the batch row (arange(batch_size))")


def _expected_lens(meta: Metadata) -> list[int]:
    r, bs = meta.raw_batch_size, meta.batch_size
    if meta.forward_mode == "extend":
        live: list[int] = meta.extend_lens.tolist()[:r] if meta.extend_lens is not None else [0] * r
    elif meta.forward_mode == "idle":
        live = []
    else:
        live = [meta.draft_tokens] * r
    return live + [0] * (bs - r)


# -- graph mode: static buffers updated in place --------------------------------------------------------
@dataclass
class _Views:
    """Live and padded slices of one bucket's static tensors for one raw batch size."""

    state_live: torch.Tensor
    state_pad: torch.Tensor
    qsl_steps: torch.Tensor
    seq_live: torch.Tensor
    seq_pad: torch.Tensor
    rpi_live: torch.Tensor
    rpi_pad: torch.Tensor
    rows: torch.Tensor
    acc_live: torch.Tensor | None
    acc_pad: torch.Tensor | None


class MetadataBuffers:
    """One static set of metadata tensors per captured bucket, updated in place each step.

    A graph records the addresses of its bucket's tensors at capture, so :meth:`update` writes a batch's
    metadata into them with tensor ops only: no host sync, no loop over requests, no allocation. Padding
    is derived from ``batch.raw_batch_size`` (host shape information), never by counting fill values.

    Args:
        pool: the state pool (its profile and mapping, its device).
        mode: "decode" or "target_verify" (idle batches run in either).
        buckets: captured batch sizes (default: the profile's list for ``pool.capacity``).
        draft_tokens: D for target_verify (1 for decode).
    """

    def __init__(
        self,
        pool: StatePool,
        mode: str = "decode",
        buckets: Sequence[int] | None = None,
        draft_tokens: int = 1,
    ) -> None:
        if not isinstance(pool, StatePool):
            raise MetadataError(f"pool must be a workbench.StatePool, got {type(pool).__name__}")
        if mode not in GRAPH_MODES:
            raise MetadataError(f"mode: graphs are captured for {GRAPH_MODES}, got {mode!r} (extend runs eagerly)")
        if isinstance(draft_tokens, bool) or not isinstance(draft_tokens, int) or draft_tokens < 1:
            raise MetadataError(f"draft_tokens must be an int >= 1, got {draft_tokens!r}")
        if mode == "decode" and draft_tokens != 1:
            raise MetadataError(f"draft_tokens: decode has 1 token per request, got {draft_tokens}")
        self.pool = pool
        self.mode = mode
        self.draft_tokens = draft_tokens
        self.buckets = _default_buckets(pool, mode == "target_verify") if buckets is None else check_buckets(buckets)
        shown = self.buckets if len(self.buckets) <= 4 else [*self.buckets[:3], "...", self.buckets[-1]]
        _check_padded_memory(f"buckets={shown}", sum(self.buckets) + self.buckets[-1], pool)
        if (self.buckets[-1] + 1) * draft_tokens > INT32_MAX:
            raise MetadataError(
                f"draft_tokens={draft_tokens}: bucket {self.buckets[-1]} x {draft_tokens} tokens does not fit "
                f"int32 query_start_loc (max {INT32_MAX:,})"
            )
        prof, dev, d = pool.profile, pool.device, draft_tokens
        self._table = _live_index_table(pool, mode, d)
        self._qsl_steps = torch.arange(0, (self.buckets[-1] + 1) * d, d, dtype=torch.int32, device=dev)
        self._rows = torch.arange(self.buckets[-1], dtype=torch.int32, device=dev)
        self._views: dict[tuple[int, int], _Views] = {}
        self.static: dict[int, Metadata] = {}
        for bs in self.buckets:
            meta = Metadata(
                profile=prof,
                forward_mode=mode,
                raw_batch_size=bs,
                draft_tokens=d,
                state_indices=torch.empty((bs, *self._table.shape[1:]), dtype=torch.int32, device=dev),
                query_start_loc=torch.empty(bs + 1, dtype=torch.int32, device=dev),
                seq_lens=torch.empty(bs, dtype=torch.int32, device=dev),
                req_pool_indices=torch.empty(bs, dtype=torch.int64, device=dev),
                has_initial_state=torch.empty(bs, dtype=torch.bool, device=dev),
                bucket=bs,
            )
            if mode == "target_verify":
                if prof.num_accepted_fill is not None:
                    meta.num_accepted_tokens = torch.empty(bs, dtype=torch.int32, device=dev)
                if prof.verify_intermediate_by_row:
                    meta.intermediate_state_indices = torch.arange(bs, dtype=torch.int32, device=dev)
            self.static[bs] = meta
            self.reset_for_capture(bs)

    def bucket_for(self, raw_bs: int) -> int | None:
        """The bucket a batch of ``raw_bs`` pads to (bisect-left), or None: above the largest, run eagerly."""
        return choose_bucket(raw_bs, self.buckets)

    def update(self, batch: Batch, bucket: int | None = None) -> Metadata:
        """Write ``batch``'s metadata into its bucket's static tensors; return that bucket's Metadata.

        The returned object is the bucket's static buffer, by design: a captured graph reads these very
        tensors, so every call for the same bucket returns the same object and overwrites it in place
        (tensors and the host fields ``raw_batch_size``, ``forward_mode``, ``draft_tokens`` alike). A
        Metadata held from an earlier step therefore shows the latest step; call ``.clone()`` on it to
        keep a step's values. The slices of a (bucket, raw_bs) pair are cached the first time that pair
        is seen (Python view objects over the static storage; no tensor memory is allocated).

        >>> from workbench import Batch, StatePool
        >>> pool = StatePool(8)
        >>> bufs = MetadataBuffers(pool, "decode", buckets=[4])
        >>> first = bufs.update(Batch.decode(pool.alloc(2), [5, 6]))
        >>> kept = first.clone()
        >>> second = bufs.update(Batch.decode(pool.alloc(3), [7, 8, 9]))
        >>> second is first, first.raw_batch_size, kept.raw_batch_size
        (True, 3, 2)
        """
        r = batch.raw_batch_size
        if batch.mode != "idle" and batch.mode != self.mode:
            raise MetadataError(f"forward_mode: buffers captured for {self.mode!r}, batch is {batch.mode!r}")
        if batch.mode == "target_verify" and batch.draft_tokens != self.draft_tokens:
            raise MetadataError(
                f"draft_tokens: buffers captured for D={self.draft_tokens}, batch has D={batch.draft_tokens}"
            )
        if batch.device != self.pool.device:
            raise MetadataError(f"batch.req_pool_indices is on {batch.device}, the buffers on {self.pool.device}")
        bs = resolve_bucket(r, self.buckets, "auto" if bucket is None else bucket)
        if bs is None:
            raise MetadataError(f"{above_largest(r, self.buckets)}: run it eagerly")
        m = self.static[bs]
        prof = self.pool.profile
        v = self._views.get((bs, r)) or self._make_views(bs, r)
        if r and batch.req_pool_indices.device.type == "cpu":  # a host read here costs no device sync
            rows = self._table.shape[0]
            bad = (batch.req_pool_indices >= rows).nonzero()
            if bad.numel():
                i = int(bad[0, 0])
                row = int(batch.req_pool_indices[i])
                raise MetadataError(
                    f"req_pool_indices[{i}] = {row}: out of range, the pool has request rows [0, {rows})"
                )
        torch.index_select(self._table, 0, batch.req_pool_indices, out=v.state_live)
        v.state_pad.fill_(prof.sentinel)
        # qsl = min(arange * D, r * D): one op writes live rows and the zero-length padded tail
        torch.clamp(v.qsl_steps, max=r * (self.draft_tokens if batch.mode != "idle" else 0), out=m.query_start_loc)
        v.seq_live.copy_(batch.seq_lens)
        v.seq_pad.fill_(prof.seq_len_fill)
        v.rpi_live.copy_(batch.req_pool_indices)
        v.rpi_pad.fill_(prof.reserved_request_row)
        torch.lt(v.rows, r, out=m.has_initial_state)
        if m.num_accepted_tokens is not None and v.acc_live is not None and v.acc_pad is not None:
            fill = prof.num_accepted_fill if prof.num_accepted_fill is not None else 1
            if batch.num_accepted_tokens is not None:
                v.acc_live.copy_(batch.num_accepted_tokens)
            else:
                v.acc_live.fill_(fill)
            v.acc_pad.fill_(fill)
        m.raw_batch_size = r
        m.forward_mode = batch.mode
        m.draft_tokens = self.draft_tokens if batch.mode != "idle" else 0
        return m

    def _make_views(self, bs: int, r: int) -> _Views:
        # Slicing costs as much as a small op on the CPU; the views of a (bucket, raw_bs) pair are reused.
        m = self.static[bs]
        acc = m.num_accepted_tokens
        v = _Views(
            state_live=m.state_indices[:r],
            state_pad=m.state_indices[r:],
            qsl_steps=self._qsl_steps[: bs + 1],
            seq_live=m.seq_lens[:r],
            seq_pad=m.seq_lens[r:],
            rpi_live=m.req_pool_indices[:r],
            rpi_pad=m.req_pool_indices[r:],
            rows=self._rows[:bs],
            acc_live=None if acc is None else acc[:r],
            acc_pad=None if acc is None else acc[r:],
        )
        self._views[(bs, r)] = v
        return v

    def reset_for_capture(self, bucket: int) -> Metadata:
        """Put ``bucket``'s buffers in their capture state: all rows live, no padding, every row on request
        row 0 and the dummy slot (as in sglang, capture runs the kernels there and writes only that slot)."""
        m = self.static[bucket]
        prof = self.pool.profile
        m.state_indices.fill_(prof.dummy_slot)
        m.query_start_loc.copy_(self._qsl_steps[: bucket + 1])
        m.seq_lens.fill_(prof.seq_len_fill)
        m.req_pool_indices.fill_(prof.reserved_request_row)
        m.has_initial_state.fill_(True)
        if m.num_accepted_tokens is not None and prof.num_accepted_fill is not None:
            m.num_accepted_tokens.fill_(prof.num_accepted_fill)
        m.raw_batch_size = bucket
        m.forward_mode = self.mode
        m.draft_tokens = self.draft_tokens
        return m
