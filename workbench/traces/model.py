"""A serving trace: many scheduler steps of one layer, as plain data (the JSON Lines file's content).

A :class:`Trace` is a :class:`TraceHeader` (profile, layer, pool size, buckets, D, seed, optionally the
engine release it comes from: :class:`TraceEngine`) and one
:class:`TraceStep` per scheduler step: its mode, its rows (one per request in the step, in the order the
engine lays them out), the requests admitted and finished at the step, and optionally the metadata the
engine used. ``workbench.traces.format`` reads and writes it; ``workbench.traces.simulate`` makes one;
``workbench.traces.replay`` runs it through the graph runner and checks every step.
"""

from __future__ import annotations

from collections import Counter
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
boundary). Under tree drafts (the header's ``topk > 1``) the step is a node of the row's draft tree."""
TREE_KEYS = ("accept_index", "last_correct_step_indices")
"""sglang's verify outcome under tree drafts (``topk > 1``), one entry per verify row in the step's verify-row
order: ``accept_index``, the row's accepted root-first path as global node ids ``b * D + node`` (``b`` the
row's index among the step's verify rows) then -1 (sglang's ``accept_index`` ``[bs, spec_steps + 1]``), and
``last_correct_step_indices``, the node whose state the engine committed (``accept_index[b, accept_len - 1]
- b * D``)."""


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
    follows it); ``topk``: draft tokens each node of a draft tree expands (sglang's ``speculative_eagle_topk``):
    1, chains (every verify row's D tokens in a line); above 1, a verify row's tokens are the nodes of a tree
    (its ``tree``) and each verify step records its ``accept_index`` (:data:`TREE_KEYS`).
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
    topk: int = 1


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
    of :data:`ROW_KINDS`, or None: the step's mode says it (:meth:`TraceStep.kind_of`). ``tree``: a verify
    row's draft tree, the parent of each of its ``new_tokens`` nodes in feed order (node 0 the root, -1;
    ``0 <= tree[t] < t``), or None: the chain (:func:`row_parents`).
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
    tree: tuple[int, ...] | None = None

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


# -- draft trees (sglang's topk > 1) -------------------------------------------------------------------------
def chain_parents(d: int) -> tuple[int, ...]:
    """The parents of a chain of ``d`` draft nodes: node ``t`` follows node ``t - 1`` (the root: -1).

    >>> chain_parents(4)
    (-1, 0, 1, 2)
    """
    return tuple(range(-1, d - 1))


def row_parents(row: TraceRow) -> tuple[int, ...]:
    """A verify row's draft tree as parents (one per fed token): its ``tree``, or the chain."""
    return row.tree if row.tree is not None else chain_parents(row.new_tokens)


def is_chain(parents: Sequence[int]) -> bool:
    """Every node's parent is the node before it (a tree of topk 1)."""
    return all(p == t - 1 for t, p in enumerate(parents))


def tree_problem(parents: Sequence[int]) -> tuple[int, str] | None:
    """The first node of ``parents`` that breaks the tree rule (node 0 the root, -1; ``0 <= parents[t] < t``:
    a node comes after its parent in feed order), with what it should be; None for a tree.

    >>> tree_problem((-1, 0, 0, 1)) is None, tree_problem((-1, 0, 2)), tree_problem((0,))
    (True, (2, 'a parent in 0..1 (a node follows its parent)'), (0, '-1 (node 0 is the root)'))
    """
    for t, p in enumerate(parents):
        if t == 0 and p != -1:
            return 0, "-1 (node 0 is the root)"
        if t > 0 and not 0 <= p < t:
            return t, f"a parent in 0..{t - 1} (a node follows its parent)"
    return None


def node_path(parents: Sequence[int], node: int) -> tuple[int, ...]:
    """The root-first path from the root to ``node`` (its ancestors, then itself) in a tree of ``parents``.

    >>> node_path((-1, 0, 0, 1), 3), node_path((-1, 0, 0, 1), 2), node_path((-1, 0, 1), 0)
    ((0, 1, 3), (0, 2), (0,))
    """
    out = [node]
    while parents[out[-1]] >= 0:
        out.append(parents[out[-1]])
    return tuple(reversed(out))


def verify_rows(step: TraceStep) -> list[tuple[int, TraceRow]]:
    """``(index in the step, row)`` of the step's verify rows, in row order: the order of their batch, and
    of the entries of :data:`TREE_KEYS` (verify row ``b`` owns the global node ids ``b * D ... b * D + D - 1``)."""
    return [(i, r) for i, (r, k) in enumerate(zip(step.rows, step.kinds, strict=True)) if k == "verify"]


def accepted_paths(step: TraceStep, header: TraceHeader | str = "tokens") -> dict[int, tuple[int, ...]]:
    """Request id -> the root-first path of draft nodes each verify row of ``step`` accepted: read from the
    step's ``accept_index`` (global ids ``b * D + node`` then -1), or, where it is not recorded, the chain's
    first :meth:`TraceRow.kept` nodes. The path's length is the tokens the row kept; its last node is the one
    whose state the row commits. The step is taken as read (:func:`tree_step_problem` says what is wrong).

    >>> rows = (TraceRow(7, 1, 1, 9, 4, 5, 3, tree=(-1, 0, 0, 1)),)
    >>> accepted_paths(TraceStep(3, "target_verify", rows, metadata={"accept_index": [[0, 1, 3, -1]]}))
    {7: (0, 1, 3)}
    >>> accepted_paths(TraceStep(3, "target_verify", rows))  # no accept_index: the chain's
    {7: (0, 1, 2)}
    """
    recorded = (step.metadata or {}).get("accept_index")
    out: dict[int, tuple[int, ...]] = {}
    for b, (_, row) in enumerate(verify_rows(step)):
        if recorded is None:
            out[row.id] = tuple(range(row.kept(header)))
            continue
        d = row.new_tokens
        out[row.id] = tuple(int(g) - b * d for g in recorded[b] if g != -1)
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def tree_step_problem(step: TraceStep, header: TraceHeader) -> tuple[str, str, Any] | None:
    """What of a step's draft trees and tree verify outcome (:data:`TREE_KEYS`) is wrong, as ``(field path,
    expected, got)``, or None. The reader (``workbench.traces.format``) and the replay (for a trace built in
    Python) both ask it.

    - a row's ``tree``: on verify rows only, one parent per fed token, node 0 the root (-1), ``0 <= tree[t] <
      t``; a tree that is not a chain needs the header's ``topk > 1``, and its nodes have at most ``topk``
      children each (sglang expands each node into its ``topk`` best drafts).
    - ``accept_index``: one list per verify row (verify-row order), at most D entries: the row's accepted
      root-first path as global ids ``b * D + node``, then only -1; as many ids as the row kept tokens.
      Required on a verify step whose rows carry a tree that is not a chain.
    - ``last_correct_step_indices``: one node in ``0 .. D - 1`` per verify row.
    """
    vrows = verify_rows(step)
    problem, branching = _row_trees_problem(step, header, {i for i, _ in vrows})
    if problem is not None:
        return problem
    md = step.metadata or {}
    for key in TREE_KEYS:
        value = md.get(key)
        if value is None:
            continue
        where = f"metadata.{key}"
        if not vrows:
            return where, "null (the step has no verify rows)", value
        if not isinstance(value, list) or len(value) != len(vrows):
            return where, f"a list of {len(vrows)} entries (one per verify row, in row order)", value
    if md.get("accept_index") is not None:
        got = _accept_index_problem(md["accept_index"], vrows, header)
        if got is not None:
            return got
    elif branching:
        return (
            "metadata.accept_index",
            "one accepted path per verify row (the step's verify rows carry draft trees that are not chains)",
            None,
        )
    last = md.get("last_correct_step_indices")
    for b, (_, row) in enumerate(vrows):
        if last is not None and not (_is_int(last[b]) and 0 <= last[b] < row.new_tokens):
            where = f"metadata.last_correct_step_indices[{b}]"
            return where, f"a node of verify row {b}'s tree, an int in 0..{row.new_tokens - 1}", last[b]
    return None


def _row_trees_problem(
    step: TraceStep, header: TraceHeader, verify_at: set[int]
) -> tuple[tuple[str, str, Any] | None, bool]:
    """The first row ``tree`` that breaks :func:`tree_step_problem`'s rules (None), and whether some verify
    row carries a tree that is not a chain."""
    branching = False
    for i, row in enumerate(step.rows):
        if row.tree is None:
            continue
        path, tree = f"rows[{i}].tree", row.tree
        if i not in verify_at:
            return (path, "null (only verify rows carry a draft tree)", list(tree)), branching
        if len(tree) != row.new_tokens:
            return (path, f"{row.new_tokens} parents (one per fed token: new_tokens)", list(tree)), branching
        bad = tree_problem(tree)
        if bad is not None:
            return (f"{path}[{bad[0]}]", bad[1], tree[bad[0]]), branching
        if is_chain(tree):
            continue
        branching = True
        if header.topk <= 1:
            return (path, "null or the chain (the header's topk is 1: every draft is a chain)", list(tree)), True
        widest, n = Counter(tree[1:]).most_common(1)[0]
        if n > header.topk:
            return (path, f"at most topk = {header.topk} children per node (node {widest} has {n})", list(tree)), True
    return None, branching


def _accept_index_problem(
    value: list[Any], vrows: list[tuple[int, TraceRow]], header: TraceHeader
) -> tuple[str, str, Any] | None:
    """``accept_index`` against the verify rows: each list a root-first path of global ids of its row's tree,
    then -1; as many ids as the row kept."""
    for b, (_, row) in enumerate(vrows):
        where, d = f"metadata.accept_index[{b}]", row.new_tokens
        entries = value[b]
        if not isinstance(entries, list) or not 1 <= len(entries) <= d:
            return where, f"a list of 1..{d} global node ids (verify row {b}'s path, then -1)", entries
        parents, kept, prev = row_parents(row), row.kept(header), -1
        for j, g in enumerate(entries):
            at = f"{where}[{j}]"
            if not _is_int(g):
                return at, "an int (a global node id, or -1 past the path)", g
            if g == -1:
                continue
            if j and entries[j - 1] == -1:
                return at, "-1 (the path ends at the first -1)", g
            if j == 0:
                want = f"{b * d} (the root of verify row {b}: {b} * D + 0)"
                ok = g == b * d
            else:
                kids = [b * d + t for t, p in enumerate(parents) if p == prev]
                shown = ", ".join(map(str, kids)) if kids else "none: it is a leaf, the path ends there (-1)"
                want = f"a child of node {prev} in verify row {b}'s tree ({b} * D + node: {shown})"
                ok = g in kids
            if not ok:
                return at, want, g
            prev = g - b * d
        ids = sum(g != -1 for g in entries)
        if ids != kept:
            return where, f"{kept} node ids (rows[{vrows[b][0]}] kept {kept} tokens), then -1", entries
    return None


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
