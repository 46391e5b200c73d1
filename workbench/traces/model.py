"""A serving trace: many scheduler steps of one layer, as plain data (the JSON Lines file's content).

A :class:`Trace` is a :class:`TraceHeader` (profile, layer, pool size, buckets, D, seed, optionally the
engine release it comes from: :class:`TraceEngine`) and one
:class:`TraceStep` per scheduler step: its mode, its rows (one per request in the step, in the order the
engine lays them out), the requests admitted and finished at the step, and optionally the metadata the
engine used. ``workbench.traces.format`` reads and writes it; ``workbench.traces.simulate`` makes one;
``workbench.traces.replay`` runs it through the graph runner and checks every step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.engine_versions import VERIFIED

FORMAT = "linattn-trace"
VERSION = 1
STEP_MODES = ("decode", "target_verify", "extend", "mixed", "idle")
"""``mixed``: any mix of decode, verify and extend rows in one step, each row with its ``kind``, in the
engine's row order (sglang: extend rows first, decodes last; vLLM: verify and decode rows first). Without
verify rows it runs as one extend batch; with them as two eager batches on their disjoint slots, the verify
rows as a target_verify batch and the others as an extend batch (vLLM's ``spec_*`` / ``non_spec_*`` split)."""
ROW_KINDS = ("decode", "verify", "extend")
"""A row's ``kind``: a one-token decode, a verify of D tokens (with ``accepted``), an extend chunk."""
MODE_KINDS = {"decode": "decode", "target_verify": "verify", "extend": "extend"}
"""The kind of every row of a step of one kind (a row's ``kind``, when given, must be it)."""
ACCEPTED_UNITS = ("tokens", "drafts")
"""The header's ``accepted``: what a verify row's ``accepted`` counts. ``"tokens"`` (the default): tokens
kept, the bonus token included, 1..D (vLLM's ``num_accepted_tokens``); ``"drafts"``: draft tokens accepted,
0..D-1 (sglang's ``num_correct_drafts_per_req_cpu``). Either way a verify keeps :func:`tokens_kept` tokens."""
SPLIT_KEYS = (
    "spec_state_indices_tensor", "non_spec_state_indices_tensor", "spec_query_start_loc",
    "non_spec_query_start_loc", "num_spec_decodes", "num_decodes", "num_prefills", "num_accepted_tokens",
)  # fmt: skip
"""vLLM's GDN metadata (``GDNAttentionMetadata``), recorded under its names: the verify rows' (``spec_*``,
``[n_spec, D]`` indices) and the other rows' (``non_spec_*``) tensors, the row counts by kind, and the
accepted count each verify row reads (``num_accepted_tokens``). Compared, where recorded, with what the
profile builds for the same split."""
PREFIX_KEYS = ("evict", "hits", "copies_before", "moves", "copies_after", "checkpoints")
"""The ``metadata`` keys of a prefix cache, in the order the replay runs them: checkpoint slots dropped,
admissions that start from a checkpoint, copies before the forward, running states moved to another slot
(vLLM's align mode: the block of the request's position), copies after the forward, checkpoints published."""
TRACK_FIELDS = ("mamba_track_mask", "mamba_track_indices", "mamba_track_seqlens")
"""sglang's track metadata of an extend or decode step (``ForwardBatch``), one entry per row in row order:
tracked or not, the track slot, the tracked length (-1 when untracked)."""
CHUNK_TRACK_FIELDS = (
    "mamba_chunk_size", "track_ssm_h_src", "track_ssm_h_dst", "track_ssm_seq_idx", "track_ssm_end_locs",
    "track_ssm_recompute_dst", "track_conv_indices",
)  # fmt: skip
"""sglang's tracking inside an extend chunk (``_init_track_ssm_indices``, ``_init_track_conv_indices``): the
state chunk size ``C``; for each tracked row whose tracked length is not a multiple of ``C`` past its cached
tokens, the index of its chunk state in the kernel's ``h`` and its track slot (GDN: one grid per sequence;
Mamba2: one grid over the flattened batch, where a row whose position is off that grid has its state
recomputed instead: its row index, its flattened end position, its track slot); for each tracked row, the
``W - 1`` flattened input positions of its conv window."""
FINAL_TRACK_FIELDS = ("track_ssm_final_src", "track_ssm_final_dst")
"""sglang's extend rows tracked at their chunk's end (``_init_track_ssm_indices``): the final state is copied
from the running slot (``track_ssm_final_src``) into the track slot (``track_ssm_final_dst``), one entry each
per such row in row order."""
RECOMPUTE_FIELDS = ("track_ssm_seq_idx", "track_ssm_end_locs", "track_ssm_recompute_dst")
"""The ``CHUNK_TRACK_FIELDS`` of sglang's Mamba2 rows tracked off the chunk grid (their state recomputed by
``mamba_chunk_scan_combined``'s track path): row index, flattened end position, track slot, one entry each."""
VERIFY_TRACK_FIELDS = ("mamba_track_indices", "mamba_steps_to_track")
"""sglang's track metadata of a verify step, one entry per row: the track slot, and the draft step whose
intermediate state goes there at commit (``mamba_steps_to_track``; -1 when the row crosses no track
boundary)."""


@dataclass(frozen=True)
class TraceEngine:
    """The engine release a trace was recorded from (or written for): the header's ``engine`` object.

    ``name``: the engine family, ``"sglang"`` or ``"vllm"`` (the header's profile's ``engine``); ``version``:
    its release (``"0.5.23"``); ``commit``: the engine's source commit, or None. A release the workbench has
    not verified is read all the same; :func:`engine_note` says so.
    """

    name: str
    version: str
    commit: str | None = None


@dataclass(frozen=True)
class TraceHeader:
    """The first line: what the steps run on.

    ``buckets``: captured batch sizes per graph mode (``{"decode": [1, 2, 4, 8], "target_verify": [...]}``);
    ``num_slots``: state slots of the pool, the dummy slot included; ``draft_tokens``: D of verify steps;
    ``seed``: of the simulation (None for a trace dumped from an engine); ``engine``: the engine release the
    trace comes from, or None (not recorded: a simulated or hand-written trace); ``accepted``: what a verify
    row's ``accepted`` counts (:data:`ACCEPTED_UNITS`: ``"tokens"`` kept, bonus included, or ``"drafts"``);
    ``zero_on_alloc``: the engine zeroes a slot's state when it allocates the slot to a request (the replay
    follows it).
    """

    profile: str
    layer: str
    num_slots: int
    buckets: dict[str, list[int]]
    draft_tokens: int = 2
    seed: int | None = None
    format: str = FORMAT
    version: int = VERSION
    engine: TraceEngine | None = None
    accepted: str = "tokens"
    zero_on_alloc: bool = False


def engine_note(header: TraceHeader, verified: Mapping[str, Sequence[str]] | None = None) -> str | None:
    """One line when the header's engine release is not among the verified releases of that engine (the
    replay then judges the trace by the rules its profile encodes, checked on another release); None when the
    header names no engine or a verified release.

    ``verified``: engine -> its verified versions; default :data:`workbench.engine_versions.VERIFIED`, the
    table the engine adapters' registry reads.

    >>> h = TraceHeader("sglang", "gdn", 9, {"decode": [1]}, engine=TraceEngine("sglang", "0.5.24.dev3", "abc"))
    >>> engine_note(h, {"sglang": ("0.5.23",)})
    "trace from sglang 0.5.24.dev3 (commit abc): judged by the rules of profile 'sglang', verified on sglang 0.5.23"
    >>> engine_note(h, {"sglang": ("0.5.24.dev3", "0.5.23")}) is None
    True
    """
    engine = header.engine
    if engine is None:
        return None
    versions = tuple((VERIFIED if verified is None else verified).get(engine.name, ()))
    if engine.version in versions:
        return None
    commit = f" (commit {engine.commit})" if engine.commit else ""
    on = f"verified on {engine.name} {', '.join(versions)}" if versions else f"no {engine.name} release verified"
    return f"trace from {engine.name} {engine.version}{commit}: judged by the rules of profile {header.profile!r}, {on}"


@dataclass(frozen=True)
class TraceRow:
    """One request's row in a step.

    ``id``: the request's id (stable across steps); ``req_pool_index``: its request-pool row; ``slot``: the
    state slot it owns (vLLM verify: the first of its D slots); ``seq_len``: its tokens after the step;
    ``new_tokens``: tokens this step feeds (decode 1, verify D, an extend chunk its length);
    ``cached_tokens``: tokens already in the state before the step (0: no initial state);
    ``accepted``: what this verify accepted, in the header's unit (:data:`ACCEPTED_UNITS`; None elsewhere, and
    at a verify: only the token always kept; :meth:`kept` reads it); ``tokens``: the token ids the row
    feeds (``new_tokens`` of them; verify: the last sampled token, then the drafts), or None: then the replay
    draws random inputs. Prefix-cache checks need them (a checkpoint is compared with the state recomputed
    over the ids). ``slots``: every slot the request owns, in column order (vLLM verify: its D slots, the
    window of blocks under ``align``), or None: then they are placed as the pool places them. ``kind``: one
    of :data:`ROW_KINDS`, or None: the step's mode says it (:meth:`TraceStep.kind_of`).
    """

    id: int
    req_pool_index: int
    slot: int
    seq_len: int
    new_tokens: int
    cached_tokens: int
    accepted: int | None = None
    tokens: tuple[int, ...] | None = None
    slots: tuple[int, ...] | None = None
    kind: str | None = None

    def kept(self, header: TraceHeader | str = "tokens") -> int:
        """Tokens this verify row keeps (1..D, the bonus token included), reading ``accepted`` in the unit
        of ``header`` (a :class:`TraceHeader`, or its ``accepted`` unit): ``"tokens"`` as it is, ``"drafts"``
        plus the token always kept; None keeps that one token.

        >>> r = TraceRow(0, 1, 1, 9, 3, 6, accepted=2)
        >>> r.kept(), r.kept("drafts"), TraceRow(0, 1, 1, 9, 3, 6).kept("drafts")
        (2, 3, 1)
        """
        unit = header if isinstance(header, str) else header.accepted
        if self.accepted is None:
            return 1
        return self.accepted + 1 if unit == "drafts" else max(self.accepted, 1)


def tokens_kept(row: TraceRow, header: TraceHeader | str = "tokens") -> int:
    """Tokens verify row ``row`` keeps, read through the header's unit: :meth:`TraceRow.kept`."""
    return row.kept(header)


def tokens_after(row: TraceRow, kind: str, header: TraceHeader | str = "tokens") -> int:
    """Tokens in the row's request's state after the row ran as ``kind`` (a row kind or a step mode): a verify
    keeps ``cached_tokens + kept``, any other row ``cached_tokens + new_tokens``."""
    if kind in ("verify", "target_verify"):
        return row.cached_tokens + row.kept(header)
    return row.cached_tokens + row.new_tokens


@dataclass(frozen=True)
class TraceStep:
    """One scheduler step. ``admit``: request ids that got a pool row at this step (before it runs);
    ``finish``: request ids whose rows (and slots) were freed after it; ``metadata``: the engine's own
    metadata for the step, by the engine's field names (``bucket``, ``state_indices``,
    ``query_start_loc``, ...), or None: then the workbench builds it. A prefix cache's work at the step is in
    ``metadata`` too (:data:`PREFIX_KEYS`; ``docs/traces.md``, "Prefix caching")."""

    step: int
    mode: str
    rows: tuple[TraceRow, ...] = ()
    admit: tuple[int, ...] = ()
    finish: tuple[int, ...] = ()
    metadata: dict[str, Any] | None = None

    def kind_of(self, row: TraceRow) -> str:
        """``row``'s kind (:data:`ROW_KINDS`): its own, else its step's mode's; a row of a mixed step written
        before rows had kinds is a decode when it feeds one token, else an extend row (it runs as an extend
        row either way)."""
        if row.kind is not None:
            return row.kind
        if self.mode in MODE_KINDS:
            return MODE_KINDS[self.mode]
        return "decode" if row.new_tokens == 1 else "extend"

    @property
    def kinds(self) -> tuple[str, ...]:
        """Every row's kind, in row order."""
        return tuple(self.kind_of(r) for r in self.rows)

    @property
    def splits(self) -> bool:
        """A mixed step with verify rows: it runs as two batches (the verify rows, then the others)."""
        return self.mode == "mixed" and "verify" in self.kinds


@dataclass
class Trace:
    """A header and its steps, in order."""

    header: TraceHeader
    steps: list[TraceStep] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.steps)

    def __repr__(self) -> str:
        h = self.header
        return f"<Trace {h.profile} {h.layer}: {len(self.steps)} steps, {h.num_slots} slots, D={h.draft_tokens}>"
