"""The engine's own metadata against the workbench's profile, batch by random batch, bitwise.

:func:`compare` draws seeded random batches of each mode (decode, target_verify with D, extend with and
without prefixes, idle), through every bucket and padding amount, runs each through the engine's eager and
replay paths (:class:`~workbench.engines.base.EngineAdapter`) and through
:func:`~workbench.metadata.build_metadata` with the pool's profile, and compares every field the engine
computes. The first difference of each mode is kept as a :class:`Divergence` (step, mode, path, field,
row, expected, got) that renders itself; :class:`OracleResult` holds them all.

An adapter built with ``topk`` > 1 verifies random draft trees (``Batch.tree``); its replays are compared with
the profile's own tree graph buffers fed the same batches, whose padded rows are stale as the engine's are.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from workbench import html
from workbench.batch import Batch
from workbench.engines.base import EngineAdapter, EngineError
from workbench.metadata import DraftTree, Metadata, MetadataBuffers, build_metadata

ORACLE_MODES = ("decode", "target_verify", "extend", "idle")
PATHS = ("eager", "replay")


@dataclass(frozen=True)
class Divergence:
    """The first field where the engine's metadata and the profile's differ, for one batch."""

    mode: str
    path: str  # "eager" or "replay"
    index: int  # the batch's number in its mode
    batch: str  # the batch, in words
    bucket: int | None
    field: str
    row: int | None
    expected: Any  # the profile's value
    got: Any  # the engine's
    versus: str = "profile"  # what ``expected`` comes from

    def __str__(self) -> str:
        where = f"row {self.row}" if self.row is not None else "shape"
        padded = f", bucket {self.bucket}" if self.bucket else ""
        return (
            f"{self.mode} #{self.index} ({self.path}{padded}): {self.field} {where}: "
            f"{self.versus} {self.expected}, engine {self.got}; batch {self.batch}"
        )

    def _repr_html_(self) -> str:
        facts = {k: getattr(self, k) for k in ("mode", "path", "index", "bucket", "field", "row", "expected", "got")}
        return html.block(html.facts(facts), html.note(self.batch), title="Engine and profile differ")


@dataclass
class OracleResult:
    """What :func:`compare` found: batches compared per mode and path, the first divergence of each."""

    engine: str
    profile: str
    batches: dict[str, int] = field(default_factory=dict)
    divergences: list[Divergence] = field(default_factory=list)
    mismatched: dict[str, int] = field(default_factory=dict)  # mode/path -> batches that differ
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when every batch agreed bitwise on every field the engine computes."""
        return not self.divergences

    def summary(self) -> str:
        total = sum(self.batches.values())
        head = f"{self.engine} vs profile {self.profile!r}: {total:,} batches in {self.seconds:.1f} s"
        if self.ok:
            return f"{head}, all equal bitwise"
        bad = ", ".join(f"{k} {v}" for k, v in self.mismatched.items())
        return f"{head}; differ: {bad}"

    def __str__(self) -> str:
        return "\n".join([self.summary(), *(f"  {d}" for d in self.divergences)])

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "profile": self.profile,
            "ok": self.ok,
            "batches": dict(self.batches),
            "mismatched": dict(self.mismatched),
            "divergences": [{**d.__dict__, "expected": str(d.expected), "got": str(d.got)} for d in self.divergences],
            "seconds": round(self.seconds, 3),
        }

    def _repr_html_(self) -> str:
        parts = [html.badge(self.ok, self.summary())]
        if self.divergences:
            rows = [[d.mode, d.path, d.index, d.bucket, d.field, d.row, d.expected, d.got] for d in self.divergences]
            cols = ("mode", "path", "#", "bucket", "field", "row", "profile", "engine")
            parts.append(html.table(cols, rows, row_kinds=["fail"] * len(rows)))
        return html.block(*parts, title="Engine oracle")


def describe(batch: Batch) -> str:
    """The batch in words: mode, rows, seq_lens, D and each row's tree (its parents), extend and prefix."""
    parts = [f"{batch.mode} rows {batch.req_pool_indices.tolist()}", f"seq_lens {batch.seq_lens.tolist()}"]
    if batch.mode == "target_verify":
        parts.append(f"D {batch.draft_tokens}")
        if batch.tree is not None:
            parts.append(f"tree parents {batch.tree.parents.tolist()}")
    if batch.extend_lens is not None:
        parts.append(f"extend {batch.extend_lens.tolist()}")
    if batch.prefix_lens is not None:
        parts.append(f"prefix {batch.prefix_lens.tolist()}")
    return ", ".join(parts)


def first_difference(
    expected: Metadata, got: Metadata, fields: Sequence[str]
) -> tuple[str, int | None, Any, Any] | None:
    """The first of ``fields`` where two metadata differ bitwise: (field, row or None for shape/dtype, expected,
    got); None when they agree."""
    for name in fields:
        a, b = getattr(expected, name), getattr(got, name)
        if a is None and b is None:
            continue
        if a is None or b is None:
            return name, None, a if a is None else "a tensor", b if b is None else "a tensor"
        if a.shape != b.shape or a.dtype != b.dtype:
            return name, None, f"{tuple(a.shape)} {a.dtype}", f"{tuple(b.shape)} {b.dtype}"
        a, b = a.cpu(), b.cpu()
        if not torch.equal(a, b):
            unequal = (a != b).reshape(a.shape[0], -1).any(dim=1) if a.dim() else torch.tensor([True])
            row = int(unequal.nonzero()[0, 0]) if a.dim() else None
            if row is None:
                return name, None, a.item(), b.item()
            return name, row, a[row].tolist(), b[row].tolist()
    return None


def random_batch(adapter: EngineAdapter, mode: str, rng: random.Random, max_rows: int) -> Batch:
    """A random batch of ``mode`` over the adapter's pool: 1..max_rows live rows (0 for idle), shuffled request
    rows, seq_lens from 1 to 4,096 (verify: at least D), extend lengths 1..64 after prefixes that are 0 for
    about a third of the rows. An adapter built with ``topk`` K > 1 verifies random trees
    (``DraftTree.random(r, D, K)``, seeded from ``rng``; every row branches)."""
    pool = adapter.pool
    if mode == "idle":
        return Batch.idle(device=pool.device)
    rows = rng.sample(pool.live_rows, rng.randint(1, min(max_rows, len(pool.live_rows))))
    d = adapter.draft_tokens
    if mode == "decode":
        return Batch.decode(rows, [rng.randint(1, 4096) for _ in rows], device=pool.device)
    if mode == "target_verify":
        seq = [rng.randint(d, 4096) for _ in rows]
        topk = getattr(adapter, "topk", 1)
        tree = DraftTree.random(len(rows), d, topk, seed=rng.randrange(1 << 62)) if topk > 1 else None
        return Batch.target_verify(rows, seq, d, tree=tree, device=pool.device)
    extend = [rng.randint(1, 64) for _ in rows]
    prefix = [0 if rng.random() < 0.34 else rng.randint(1, 2048) for _ in rows]
    return Batch.extend(rows, extend, prefix, device=pool.device)


def compare(
    adapter: EngineAdapter,
    *,
    modes: Sequence[str] = ORACLE_MODES,
    batches: int = 1000,
    seed: int = 0,
    paths: Sequence[str] = PATHS,
) -> OracleResult:
    """Run ``batches`` random batches of each mode through the engine and the profile; compare bitwise.

    The adapter's pool must have its requests allocated (``pool.alloc``): batches draw their rows from the
    live ones. ``paths``: ``"eager"`` (``init_forward_metadata`` / an unpadded ``build``) and ``"replay"``
    (the host-side update before a graph replay, padded to the smallest bucket that holds the batch; only
    decode and target_verify are captured). An engine error (``TypeError`` and the like) propagates: it is
    the finding.
    """
    for mode in modes:
        if mode not in ORACLE_MODES:
            raise EngineError(f"modes: {mode!r} is not one of {ORACLE_MODES}")
    for path in paths:
        if path not in PATHS:
            raise EngineError(f"paths: {path!r} is not one of {PATHS}")
    if not adapter.pool.live_rows:
        raise EngineError("the adapter's pool has no live requests: pool.alloc(n) first")
    rng = random.Random(seed)
    result = OracleResult(adapter.label, adapter.profile)
    start = time.perf_counter()
    biggest = max(adapter.buckets)
    graphs = _tree_graphs(adapter)
    for mode in modes:
        for path in paths:
            if path == "replay" and mode not in ("decode", "target_verify"):
                continue
            key = f"{mode}/{path}"
            fields = adapter.compared_fields(mode)
            result.batches[key] = batches
            for i in range(batches):
                batch = random_batch(adapter, mode, rng, biggest if path == "replay" else 2 * biggest)
                if path == "eager":
                    expected, got, bucket = build_metadata(batch, adapter.pool, bucket=None), adapter.eager(batch), None
                else:
                    bucket = min(b for b in adapter.buckets if b >= batch.raw_batch_size)
                    if graphs is not None and batch.tree is not None:  # stale padded rows: the buffers' own
                        expected = graphs.update(batch)
                    else:
                        expected = build_metadata(batch, adapter.pool, bucket=bucket, buckets=adapter.buckets)
                    got = adapter.replay(batch, bucket)
                diff = first_difference(expected, got, fields)
                if diff is None:
                    continue
                result.mismatched[key] = result.mismatched.get(key, 0) + 1
                if result.mismatched[key] == 1:
                    name, row, want, have = diff
                    result.divergences.append(Divergence(mode, path, i, describe(batch), bucket, name, row, want, have))
    result.seconds = time.perf_counter() - start
    return result


def _tree_graphs(adapter: EngineAdapter) -> MetadataBuffers | None:
    """The profile's target-verify graph buffers for an adapter that verifies trees (``topk`` > 1), else None.

    A replay of a tree verify copies the live rows' links into the bucket's static buffers and leaves the
    padded rows' links as the last replay of that bucket wrote them (sglang's buffers do; so does the profile's
    ``MetadataBuffers(..., tree=True)``). The replays are compared with these buffers, fed the same batches in
    the same order, so the stale rows are compared too, not skipped: both start from zeros."""
    if getattr(adapter, "topk", 1) < 2:
        return None
    return MetadataBuffers(adapter.pool, "target_verify", adapter.buckets, adapter.draft_tokens, tree=True)


GROUP_MODES = ("decode", "target_verify", "extend")


def compare_groups(
    adapter: EngineAdapter,
    *,
    modes: Sequence[str] = GROUP_MODES,
    batches: int = 200,
    seed: int = 0,
    paths: Sequence[str] = PATHS,
) -> OracleResult:
    """A second KV-cache group of the adapter's layer on random batches (an adapter with ``second_group``:
    vLLM's): each batch gets a fresh second block table (seeded), the runner's metadata for that group
    (``update_block_table`` where vLLM's runner calls it, else ``build``) is compared with ``build()`` on the
    group's table. Keys ``mode/path/via``; the first difference of each key is a :class:`Divergence` whose
    field names the metadata field and the call (``"spec_state_indices_tensor (update_block_table)"``)."""
    second_group = getattr(adapter, "second_group", None)
    if second_group is None:
        raise EngineError(f"{adapter.label}: the adapter models no second KV-cache group")
    rng = random.Random(seed)
    result = OracleResult(adapter.label, "build() on the second group's block table")
    start = time.perf_counter()
    biggest = max(adapter.buckets)
    for mode in (m for m in modes if m in GROUP_MODES):
        for path in paths:
            if path == "replay" and mode == "extend":
                continue
            for i in range(batches):
                batch = random_batch(adapter, mode, rng, biggest if path == "replay" else 2 * biggest)
                bucket = None
                if path == "replay":
                    bucket = min(b for b in adapter.buckets if b >= batch.raw_batch_size)
                check = second_group(batch, bucket, adapter.second_block_table(rng.randrange(1 << 31)))  # type: ignore[attr-defined]
                key = f"{mode}/{path}/{check.via}"
                result.batches[key] = result.batches.get(key, 0) + 1
                diff = check.difference()
                if diff is None:
                    continue
                result.mismatched[key] = result.mismatched.get(key, 0) + 1
                if result.mismatched[key] == 1:
                    name, row, want, have = diff
                    result.divergences.append(
                        Divergence(
                            mode,
                            path,
                            i,
                            describe(batch),
                            bucket,
                            f"{name} ({check.via})",
                            row,
                            want,
                            have,
                            versus="build()",
                        )
                    )
    result.seconds = time.perf_counter() - start
    return result
