"""``MetadataError.field`` and ``.row``: set where the error is raised, equal to what its message names.

``validate`` is held to it raise site by raise site (the table below must reach every ``raise _fail(...)`` of
``metadata/invariants.py``), the input checks of the pool, the batch, the buckets, the limits and the
metadata builders case by case, and every ``MetadataError(...)`` of ``workbench/`` must pass ``field=`` (the
other packages' raise sites case by case: ``tests/test_metadata_error_fields.py``).
"""

from __future__ import annotations

import ast
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import workbench.metadata.invariants as invariants
from workbench import Batch, DraftTree, MetadataBuffers, MetadataError, StatePool, build_metadata, validate
from workbench.limits import check_fits, check_int, check_memory, field_and_row
from workbench.metadata import Metadata, row_fate

ROOT = Path(__file__).resolve().parents[1]

# The field and row a message names at its head: `field[row]: ...`, `field: ...`, `field[row] = v: ...`.
_HEAD = re.compile(r"(?P<field>[A-Za-z_][\w.]*)(?:\[(?P<row>\d+)\])?(?=[:= ])")


def named(message: str) -> tuple[str, int | None]:
    """(field, row) as the message's head says them (the convention every validate message follows)."""
    m = _HEAD.match(message)
    assert m is not None, message
    return m["field"], None if m["row"] is None else int(m["row"])


# -- validate --------------------------------------------------------------------------------------------
def _decode() -> tuple[Metadata, StatePool]:
    """sglang decode: request rows 1..3 own slots 1..3, one padded row (batch row 3)."""
    pool = StatePool(16, "sglang")
    rows = pool.alloc(3)
    return build_metadata(Batch.decode(rows, [5, 6, 7]), pool, bucket=4, buckets=[4]), pool


def _extend() -> tuple[Metadata, StatePool]:
    pool = StatePool(16, "sglang")
    rows = pool.alloc(3)
    return build_metadata(Batch.extend(rows, [2, 3, 1]), pool, bucket=None), pool


def _verify_vllm() -> tuple[Metadata, StatePool]:
    """vLLM verify, D=3: two live rows of three slots each, two padded rows."""
    pool = StatePool(40, "vllm", slots_per_request=3)
    rows = pool.alloc(2)
    batch = Batch.target_verify(rows, [5, 6], draft_tokens=3, num_accepted_tokens=[2, 3])
    return build_metadata(batch, pool, bucket=4, buckets=[4]), pool


def _verify_sglang() -> tuple[Metadata, StatePool]:
    pool = StatePool(16, "sglang")
    rows = pool.alloc(3)
    return build_metadata(Batch.target_verify(rows, [5, 6, 7], 2), pool, bucket=4, buckets=[4]), pool


def _verify_tree() -> tuple[Metadata, StatePool]:
    """sglang verify of draft trees, D=4: rows 0 and 1 the example tree [-1, 0, 0, 1], one padded row."""
    pool = StatePool(16, "sglang")
    rows = pool.alloc(2)
    tree = DraftTree.from_parents([[-1, 0, 0, 1]] * 2)
    return build_metadata(Batch.target_verify(rows, [5, 6], 4, tree=tree), pool, bucket=3, buckets=[3]), pool


def _add_tree_fields(m: Metadata) -> None:
    """Draft-tree links of the right shape (zeros) on a step whose profile has no trees."""
    for name in ("retrieve_next_token", "retrieve_next_sibling", "retrieve_parent_token"):
        setattr(m, name, torch.zeros(m.batch_size, m.draft_tokens, dtype=torch.int32))


def _set(name: str, index: Any, value: Any) -> Callable[[Metadata], None]:
    return lambda m: getattr(m, name).__setitem__(index, value)


def _replace(name: str, change: Callable[[torch.Tensor], Any]) -> Callable[[Metadata], None]:
    return lambda m: setattr(m, name, change(getattr(m, name)))


# (id, metadata maker, corruption, the field, the row)
VALIDATE_CASES: list[tuple[str, Callable[[], tuple[Metadata, StatePool]], Callable[[Metadata], None], str, Any]] = [
    ("raw_batch_size", _decode, lambda m: setattr(m, "raw_batch_size", 5), "raw_batch_size", None),
    ("device", _decode, _replace("seq_lens", lambda t: t.to("meta")), "seq_lens", None),
    ("dtype", _decode, _replace("state_indices", torch.Tensor.long), "state_indices", None),
    ("state shape", _decode, _replace("state_indices", lambda t: t[:3]), "state_indices", None),
    ("row shape", _decode, _replace("seq_lens", lambda t: t[:3]), "seq_lens", None),
    ("row dtype", _decode, _replace("req_pool_indices", torch.Tensor.int), "req_pool_indices", None),
    ("flag dtype", _decode, _replace("has_initial_state", torch.Tensor.int), "has_initial_state", None),
    ("no extend_lens", _extend, lambda m: setattr(m, "extend_lens", None), "extend_lens", None),
    ("padded index", _decode, _set("state_indices", 3, 5), "state_indices", 3),
    ("unallocated request", _decode, _set("req_pool_indices", 1, 7), "req_pool_indices", 1),
    ("live sentinel", _decode, _set("state_indices", 1, -1), "state_indices", 1),
    ("out of range", _decode, _set("state_indices", 0, 99), "state_indices", 0),
    ("dummy slot", _decode, _set("state_indices", 0, 0), "state_indices", 0),
    ("slot used twice", _decode, _set("state_indices", 2, 2), "state_indices", 2),
    ("slot not owned", _decode, _set("state_indices", 0, 9), "state_indices", 0),
    # batch_size is query_start_loc.numel() - 1: only a 2-D query_start_loc reaches the length check
    ("qsl length", _decode, _replace("query_start_loc", lambda t: t.view(1, -1)), "query_start_loc", None),
    ("qsl start", _decode, _set("query_start_loc", 0, 1), "query_start_loc", 0),
    ("qsl decreasing", _decode, _set("query_start_loc", 2, 0), "query_start_loc", 2),
    ("qsl padded tokens", _decode, _set("query_start_loc", 4, 4), "query_start_loc", 4),
    ("padded seq_len", _decode, _set("seq_lens", 3, 7), "seq_lens", 3),
    ("live seq_len", _decode, _set("seq_lens", 1, 0), "seq_lens", 1),
    ("padded request row", _decode, _set("req_pool_indices", 3, 5), "req_pool_indices", 3),
    ("padded initial state", _decode, _set("has_initial_state", 3, True), "has_initial_state", 3),
    ("live initial state", _decode, _set("has_initial_state", 0, False), "has_initial_state", 0),
    ("no num_accepted", _verify_vllm, lambda m: setattr(m, "num_accepted_tokens", None), "num_accepted_tokens", None),
    (
        "num_accepted dtype",
        _verify_vllm,
        _replace("num_accepted_tokens", torch.Tensor.long),
        "num_accepted_tokens",
        None,
    ),
    ("live num_accepted", _verify_vllm, _set("num_accepted_tokens", 1, 4), "num_accepted_tokens", 1),
    ("padded num_accepted", _verify_vllm, _set("num_accepted_tokens", 2, 2), "num_accepted_tokens", 2),
    ("padded verify slots", _verify_vllm, _set("state_indices", (3, 1), 5), "state_indices", 3),
    ("intermediate", _verify_sglang, _set("intermediate_state_indices", 2, 3), "intermediate_state_indices", 2),
    (
        "intermediate short",
        _verify_sglang,
        _replace("intermediate_state_indices", lambda t: t[:2]),
        "intermediate_state_indices",
        2,
    ),
    (
        "tree field missing",
        _verify_tree,
        lambda m: setattr(m, "retrieve_next_sibling", None),
        "retrieve_next_sibling",
        None,
    ),
    ("tree on vllm", _verify_vllm, _add_tree_fields, "retrieve_next_token", None),
    ("tree links", _verify_tree, _set("retrieve_next_sibling", (1, 1), -1), "retrieve_next_token", 1),
    ("tree parents", _verify_tree, _set("retrieve_parent_token", (1, 3), 0), "retrieve_parent_token", 1),
]


def _raise_lines() -> set[int]:
    """The lines of ``metadata/invariants.py`` that raise a ``_fail(...)``."""
    tree = ast.parse(Path(invariants.__file__).read_text())
    return {
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Raise)
        and isinstance(node.exc, ast.Call)
        and getattr(node.exc.func, "id", None) == "_fail"
    }


def _raised_at(e: BaseException) -> int:
    tb = e.__traceback__
    assert tb is not None
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_lineno


def _validate_error(
    make: Callable[[], tuple[Metadata, StatePool]], corrupt: Callable[[Metadata], None]
) -> MetadataError:
    meta, pool = make()
    validate(meta, pool)  # sound before the corruption
    corrupt(meta)
    with pytest.raises(MetadataError) as info:
        validate(meta, pool)
    return info.value


@pytest.mark.parametrize(
    ("make", "corrupt", "field", "row"), [c[1:] for c in VALIDATE_CASES], ids=[c[0] for c in VALIDATE_CASES]
)
def test_validate_errors_carry_the_field_and_row_their_message_names(make, corrupt, field, row):
    e = _validate_error(make, corrupt)
    assert (e.field, e.row) == (field, row), str(e)
    assert named(str(e)) == (field, row), str(e)
    head = field if row is None else f"{field}[{row}]"
    assert str(e).startswith(f"{head}: "), str(e)  # the message itself is as before: `field[row]: ...`


def test_the_validate_table_reaches_every_raise_site():
    lines = _raise_lines()
    reached = {_raised_at(_validate_error(make, corrupt)) for _, make, corrupt, _, _ in VALIDATE_CASES}
    assert len(lines) >= 25 and reached == lines, f"raise sites not reached: {sorted(lines - reached)}"


# -- the input checks ------------------------------------------------------------------------------------
def _pool() -> tuple[StatePool, torch.Tensor]:
    pool = StatePool(8, "sglang")
    return pool, pool.alloc(3)


# (id, the call on a fresh 8-slot pool and its 3 rows, the message, the field, the row)
INPUT_CASES: list[tuple[str, Callable[[StatePool, torch.Tensor], Any], str, str, int | None]] = [
    ("seq_len < 1", lambda p, r: Batch.decode(r, [3, 0, 2]), "seq_lens[1] = 0: must be >= 1", "seq_lens", 1),
    (
        "float list value",
        lambda p, r: Batch.decode(r, [1, 2.5, 3]),
        "seq_lens[1]: expected an int, got 2.5",
        "seq_lens",
        1,
    ),
    (
        "float tensor",
        lambda p, r: Batch.decode(r, torch.tensor([1.0, 2.0, 3.0])),
        "seq_lens: expected an integer tensor, got dtype torch.float32",
        "seq_lens",
        None,
    ),
    (
        "2-D tensor",
        lambda p, r: Batch.decode(r.view(3, 1), [3, 3, 3]),
        "req_pool_indices: expected a 1-D tensor, got shape (3, 1)",
        "req_pool_indices",
        None,
    ),
    (
        "not a list",
        lambda p, r: Batch.decode(r, "abc"),
        "seq_lens: expected a list of ints or a 1-D integer tensor, got 'abc'",
        "seq_lens",
        None,
    ),
    (
        "list value past int32",
        lambda p, r: Batch.decode(r, [1, 2**31, 1]),
        "seq_lens[1] = 2147483648: does not fit int32 (range [-2147483648, 2147483647])",
        "seq_lens",
        1,
    ),
    (
        "tensor value past int32",
        lambda p, r: Batch.decode(r, torch.tensor([1, 1, 2**32 + 5])),
        "seq_lens[2] = 4294967301: does not fit int32 (range [-2147483648, 2147483647])",
        "seq_lens",
        2,
    ),
    ("length", lambda p, r: Batch.decode(r, [1, 2]), "seq_lens: 2 values for 3 requests", "seq_lens", None),
    (
        "duplicate request",
        lambda p, r: Batch.decode([1, 2, 1], [3, 3, 3]),
        "req_pool_indices[2] = 1: duplicate of row 0 (a request runs once a step)",
        "req_pool_indices",
        2,
    ),
    (
        "extend total",
        lambda p, r: Batch.extend(r, [2**30, 2**30, 2**30]),
        "extend_lens: 3,221,225,472 tokens in one step; the total must fit int32 (max 2,147,483,647)",
        "extend_lens",
        None,
    ),
    (
        "extend lengths",
        lambda p, r: Batch.extend(r, [1, 1]),
        "extend_lens: 2 values for 3 requests",
        "extend_lens",
        None,
    ),
    (
        "sequence past int32",
        lambda p, r: Batch.extend(r, [1, 1, 1], [0, 2**31 - 1, 0]),
        "prefix_lens[1] + extend_lens[1] = 2,147,483,648: a sequence length must fit int32 (max 2,147,483,647)",
        "prefix_lens",
        1,
    ),
    (
        "D < 1",
        lambda p, r: Batch.target_verify(r, [3, 3, 3], draft_tokens=0),
        "draft_tokens must be an int >= 1, got 0",
        "draft_tokens",
        None,
    ),
    (
        "accepted > D",
        lambda p, r: Batch.target_verify(r, [3, 3, 3], 2, num_accepted_tokens=[1, 3, 1]),
        "num_accepted_tokens[1] = 3: more than draft_tokens=2",
        "num_accepted_tokens",
        1,
    ),
    (
        "accepted count",
        lambda p, r: Batch.target_verify(r, [3, 3, 3], 2, num_accepted_tokens=[1]),
        "num_accepted_tokens: 1 values for 3 requests",
        "num_accepted_tokens",
        None,
    ),
    (
        "capture mode",
        lambda p, r: Batch.for_capture("extend", 4),
        "mode: graphs are captured for decode and target_verify, got 'extend'",
        "mode",
        None,
    ),
    (
        "capture size",
        lambda p, r: Batch.for_capture("decode", 0),
        "batch_size = 0: must be in [1, 2,147,483,647]",
        "batch_size",
        None,
    ),
    (
        "bool device",
        lambda p, r: Batch.idle(device=True),
        "device must be a str, torch.device or CUDA ordinal, got True",
        "device",
        None,
    ),
    (
        "not allocated",
        lambda p, r: build_metadata(Batch.decode([1, 6], [3, 3]), p),
        "req_pool_indices[1] = 6: request not allocated in the pool",
        "req_pool_indices",
        1,
    ),
    (
        "not a batch",
        lambda p, r: build_metadata("batch", p),
        "batch must be a workbench.Batch, got str",
        "batch",
        None,
    ),
    (
        "not a pool",
        lambda p, r: build_metadata(Batch.decode(r, [3, 3, 3]), "pool"),
        "pool must be a workbench.StatePool, got str",
        "pool",
        None,
    ),
    (
        "bucket too small",
        lambda p, r: build_metadata(Batch.decode(r, [3, 3, 3]), p, bucket=2, buckets=[2, 4]),
        "raw batch 3 is larger than bucket 2; a batch is never truncated",
        "bucket",
        None,
    ),
    (
        "bucket not captured",
        lambda p, r: build_metadata(Batch.decode(r, [3, 3, 3]), p, bucket=6, buckets=[2, 4]),
        "bucket 6 was not captured; captured buckets: [2, 4]",
        "bucket",
        None,
    ),
    (
        "bucket type",
        lambda p, r: build_metadata(Batch.decode(r, [3, 3, 3]), p, bucket="big"),
        "bucket must be 'auto', None or an int, got 'big'",
        "bucket",
        None,
    ),
    (
        "buckets empty",
        lambda p, r: build_metadata(Batch.decode(r, [3, 3, 3]), p, buckets=[]),
        "buckets: empty list; capture at least one batch size",
        "buckets",
        None,
    ),
    (
        "bucket not positive",
        lambda p, r: build_metadata(Batch.decode(r, [3, 3, 3]), p, buckets=[4, 0]),
        "buckets[1] must be a positive int, got 0",
        "buckets",
        1,
    ),
    (
        "buckets not increasing",
        lambda p, r: build_metadata(Batch.decode(r, [3, 3, 3]), p, buckets=[4, 2]),
        "buckets must be strictly increasing: buckets[1]=2 after 4",
        "buckets",
        1,
    ),
    (
        "graph bucket None",
        lambda p, r: MetadataBuffers(p, "decode", buckets=[4]).update(Batch.decode(r, [3, 3, 3]), bucket=None),
        "bucket must be 'auto' or a captured bucket (an int), got None: graph buffers are always padded "
        "(build_metadata(..., bucket=None) builds an unpadded step)",
        "bucket",
        None,
    ),
    (
        "graph extend",
        lambda p, r: MetadataBuffers(p, "extend", buckets=[4]),
        "mode: graphs are captured for ('decode', 'target_verify'), got 'extend' (extend runs eagerly)",
        "mode",
        None,
    ),
    (
        "graph pool",
        lambda p, r: MetadataBuffers("pool"),
        "pool must be a workbench.StatePool, got str",
        "pool",
        None,
    ),
    (
        "graph D type",
        lambda p, r: MetadataBuffers(p, "target_verify", [4], draft_tokens=0),
        "draft_tokens must be an int >= 1, got 0",
        "draft_tokens",
        None,
    ),
    (
        "graph decode D",
        lambda p, r: MetadataBuffers(p, "decode", [4], draft_tokens=2),
        "draft_tokens: decode has 1 token per request, got 2",
        "draft_tokens",
        None,
    ),
    (
        "graph D past int32",
        lambda p, r: MetadataBuffers(p, "target_verify", [4], draft_tokens=2**30),
        "draft_tokens=1073741824: bucket 4 x 1073741824 tokens does not fit int32 query_start_loc (max 2,147,483,647)",
        "draft_tokens",
        None,
    ),
    (
        "graph above largest",
        lambda p, r: MetadataBuffers(p, "decode", buckets=[1, 2]).update(Batch.decode(r, [3, 3, 3])),
        "raw batch 3 is above the largest captured bucket 2: run it eagerly",
        "bucket",
        None,
    ),
    (
        "graph modes",
        lambda p, r: MetadataBuffers(p, "decode", buckets=[4]).update(Batch.target_verify(r, [3, 3, 3], 2)),
        "forward_mode: buffers captured for 'decode', batch is 'target_verify'",
        "forward_mode",
        None,
    ),
    (
        "graph D",
        lambda p, r: MetadataBuffers(p, "target_verify", [4], draft_tokens=3).update(
            Batch.target_verify(r, [3, 3, 3], 2)
        ),
        "draft_tokens: buffers captured for D=3, batch has D=2",
        "draft_tokens",
        None,
    ),
    (
        "graph request row",
        lambda p, r: MetadataBuffers(p, "decode", buckets=[4]).update(Batch.decode([1, 50], [3, 3])),
        "req_pool_indices[1] = 50: out of range, the pool has request rows [0, 8)",
        "req_pool_indices",
        1,
    ),
    (
        "row fate",
        lambda p, r: row_fate(build_metadata(Batch.decode(r, [3, 3, 3]), p, bucket=None), 3),
        "row: expected a batch row in [0, batch_size=3), got 3",
        "row",
        None,
    ),
    (
        "vllm verify slots",
        lambda p, r: (lambda q: build_metadata(Batch.target_verify(q.alloc(1), [3], 2), q))(StatePool(8, "vllm")),
        "slots_per_request=1: profile 'vllm' keeps one slot per draft position in target_verify, so the pool "
        "needs slots_per_request=D=2",
        "slots_per_request",
        None,
    ),
    # the pool
    ("num_slots type", lambda p, r: StatePool("8"), "num_slots must be an int, got '8'", "num_slots", None),
    ("num_slots", lambda p, r: StatePool(1), "num_slots must be >= 2, got 1", "num_slots", None),
    (
        "no room",
        lambda p, r: StatePool(2, slots_per_request=2),
        "num_slots=2 leaves no room for one request of 2 slots beside the reserved dummy slot 0",
        "num_slots",
        None,
    ),
    (
        "max_requests",
        lambda p, r: StatePool(8, max_requests=0),
        "max_requests must be >= 1, got 0",
        "max_requests",
        None,
    ),
    ("slots_of", lambda p, r: p.slots_of(6), "req_pool_indices: row 6 is not allocated", "req_pool_indices", None),
    (
        "exhausted",
        lambda p, r: p.alloc(5),
        "pool exhausted: asked for 5 requests, 4 free (4 free slots, 1 per request)",
        "n",
        None,
    ),
    ("alloc n", lambda p, r: p.alloc(-1), "n must be >= 0, got -1", "n", None),
    (
        "hold taken",
        lambda p, r: p.hold(1),
        "slot=1: not free (owned by a request, held, reserved or past the pool)",
        "slot",
        None,
    ),
    (
        "hold exhausted",
        lambda p, r: (p.alloc(4), p.hold()),
        "pool exhausted: no free slot to hold (8 slots)",
        "slot",
        None,
    ),
    ("release", lambda p, r: p.release(5), "release: slot 5 is not held by a prefix cache", "slot", None),
    (
        "move taken",
        lambda p, r: p.move(1, 2),
        "slot=2: not free (owned by a request, held, reserved or past the pool)",
        "slot",
        None,
    ),
    (
        "move window",
        lambda p, r: StatePool(8, slots_per_request=2).move(1, 5),
        "move: a request owns 2 slots here; one can be moved",
        "slots_per_request",
        None,
    ),
    (
        "donate window",
        lambda p, r: StatePool(8, slots_per_request=2).donate(1),
        "donate: a request owns 2 slots here; one can be donated",
        "slots_per_request",
        None,
    ),
    ("remap count", lambda p, r: p.remap(1, [4, 5]), "slots: 2 given, the pool keeps 1 per request", "slots", None),
    ("remap type", lambda p, r: p.remap(1, ["4"]), "slots[0] must be an int, got '4'", "slots", 0),
    (
        "remap taken",
        lambda p, r: p.remap(1, [2]),
        "slots[0]=2: not free (owned by a request, held, reserved or past the pool)",
        "slots",
        0,
    ),
    (
        "alloc_at count",
        lambda p, r: p.alloc_at(5, [4, 5]),
        "slots: 2 given, the pool keeps 1 per request",
        "slots",
        None,
    ),
    (
        "alloc_at live row",
        lambda p, r: p.alloc_at(1, [5]),
        "row=1: not a free request-pool row (live, reserved or past the pool)",
        "row",
        None,
    ),
    (
        "alloc_at dummy",
        lambda p, r: p.alloc_at(5, [0]),
        "slots[0]=0: the dummy slot, out of range or given twice",
        "slots",
        0,
    ),
    (
        "alloc_at taken",
        lambda p, r: p.alloc_at(5, [2]),
        "slots[0]=2: owned by another request",
        "slots",
        0,
    ),
    ("free twice", lambda p, r: p.free([1, 1]), "free: rows[1]=1 appears twice in one call", "rows", 1),
    (
        "free unallocated",
        lambda p, r: p.free([1, 7]),
        "free: rows[1]=7 is not allocated (freed twice, or never allocated)",
        "rows",
        1,
    ),
]


@pytest.mark.parametrize(
    ("call", "message", "field", "row"), [c[1:] for c in INPUT_CASES], ids=[c[0] for c in INPUT_CASES]
)
def test_input_errors_carry_their_field_and_row_and_keep_their_message(call, message, field, row):
    pool, rows = _pool()
    with pytest.raises(MetadataError) as info:
        call(pool, rows)
    e = info.value
    assert str(e) == message
    assert (e.field, e.row) == (field, row), message


def test_memory_refusals_name_the_argument(monkeypatch):
    import workbench.limits as limits

    monkeypatch.setattr(limits, "host_memory_bytes", lambda: 2**20)
    cases = [
        (lambda: StatePool(10**9), "num_slots", None),
        (lambda: StatePool(10**9, max_requests=10**8), "max_requests", None),
        (lambda: Batch.for_capture("decode", 10**9), "batch_size", None),
        (lambda: check_memory("slots[3]", 2**30, "a test"), "slots", 3),
        (lambda: check_memory("anything", 2**30, "a test", field="num_slots", row=2), "num_slots", 2),
    ]
    for call, field, row in cases:
        with pytest.raises(MetadataError, match="free$") as info:
            call()
        assert (info.value.field, info.value.row) == (field, row), str(info.value)


def test_limits_read_field_and_row_from_the_name_unless_given():
    assert field_and_row("slots[3]") == ("slots", 3)
    assert field_and_row("num_slots=10") == ("num_slots", None)
    assert field_and_row("pool.num_slots=10") == ("pool.num_slots", None)
    assert field_and_row("buckets=[1, 2, ..., 256]") == ("buckets", None)
    assert field_and_row("--shape 'x'") == ("--shape", None)
    assert field_and_row("12345") == ("", None)
    with pytest.raises(MetadataError) as info:
        check_int("steps", "3", 0)
    assert (info.value.field, info.value.row, str(info.value)) == ("steps", None, "steps must be an int, got '3'")
    with pytest.raises(MetadataError) as info:
        check_fits("tokens", [1, 2**40], "int32")
    assert (info.value.field, info.value.row) == ("tokens", 1)
    with pytest.raises(MetadataError) as info:
        check_fits("tokens[7]", [2**40], "int32")
    assert (info.value.field, info.value.row, str(info.value)) == (
        "tokens",
        7,
        "tokens[7] = 1099511627776: does not fit int32 (range [-2147483648, 2147483647])",
    )


# -- the error itself ------------------------------------------------------------------------------------
def test_a_plain_metadata_error_still_works_and_the_values_survive_pickling():
    plain = MetadataError("something is off")
    assert (plain.field, plain.row, str(plain), plain.args) == ("", None, "something is off", ("something is off",))
    assert isinstance(plain, ValueError)
    e = MetadataError("state_indices[3]: padded row holds [5]", field="state_indices", row=3)
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is MetadataError and (back.field, back.row, str(back)) == ("state_indices", 3, str(e))


MODULES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "workbench").rglob("*.py"))

BARE_ALLOWED: dict[tuple[str, int], str] = {}
"""(path, line) -> why that ``MetadataError(...)`` names no field (a message about the whole batch, say): none
today. A line number, so that the entry goes stale (and this test fails) when the code around it moves."""


def bare_metadata_errors(source: str) -> list[int]:
    """Lines of ``MetadataError(...)`` calls (by name or ``errors.MetadataError``) without ``field=``."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) == "MetadataError"
        and "field" not in {k.arg for k in node.keywords}
    ]


@pytest.mark.parametrize("path", MODULES)
def test_every_metadata_error_raised_names_its_field(path):
    bare = [line for line in bare_metadata_errors((ROOT / path).read_text()) if (path, line) not in BARE_ALLOWED]
    assert not bare, f"{path}: MetadataError(...) without field= at lines {bare}"


def test_the_field_walk_sees_every_spelling_and_the_allowlist_is_current():
    source = (
        "raise MetadataError('a')\n"
        "raise errors.MetadataError('b', row=1)\n"
        "raise MetadataError('c', field='c')\n"
        "raise OtherError('d')\n"
    )
    assert bare_metadata_errors(source) == [1, 2]
    assert len(MODULES) > 100 and "workbench/cli.py" in MODULES and "workbench/engines/registry.py" in MODULES
    for (path, line), why in BARE_ALLOWED.items():
        assert why and line in bare_metadata_errors((ROOT / path).read_text()), f"stale allowlist entry {path}:{line}"
