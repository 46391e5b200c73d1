"""mamba2.chunk_scan: the conformance matrix (``kernels.testing``), the reference against the decode op
token by token, the chunk states on one grid over the flattened batch (and what per-sequence offsets read
there: sglang issue 31833), long rows, argument errors, the custom op and the cost model.
"""

from __future__ import annotations

import pytest
import torch
from _kernel_helpers import IMPLS, OpLog, conformance, opcheck_mutations

from kernels import mamba2
from kernels.mamba2.chunk_grid import grid_index, grid_owner, grid_size
from kernels.testing import cu_seqlens, make_case, rel_err

OP = "mamba2.chunk_scan"


def batch(lens, *, nheads=4, headdim=6, dstate=5, ngroups=2, chunk=4, dtype=torch.float64, seed=0):
    """Arguments of a chunk scan over rows of ``lens`` tokens on slots 1..N of a random pool (slot 0 free)."""
    g = torch.Generator().manual_seed(seed)
    T, N = sum(lens), len(lens)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    return {
        "x": r(T, nheads, headdim),
        "dt": r(T, nheads, scale=0.5),
        "A": -(0.1 + torch.rand(nheads, generator=g)).to(dtype),
        "B": r(T, ngroups, dstate),
        "C": r(T, ngroups, dstate),
        "D": r(nheads),
        "z": r(T, nheads, headdim),
        "dt_bias": r(nheads, scale=0.5),
        "dt_softplus": True,
        "state": r(N + 1, nheads, headdim, dstate, scale=0.3),
        "state_indices": torch.arange(1, N + 1),
        "cu_seqlens": cu_seqlens(lens),
        "has_initial_state": torch.tensor([i % 2 == 0 for i in range(N)]),
        "chunk_size": chunk,
        "chunk_states": torch.full((grid_size(T, chunk), nheads, headdim, dstate), float("nan"), dtype=dtype),
    }


@pytest.mark.parametrize("run", conformance(OP), ids=str)
def test_conforms(run):
    run.check()


@pytest.mark.parametrize("lens", [[5, 3, 6], [150, 7]], ids=["short", "past-a-block"])
def test_reference_is_the_decode_step_token_by_token(lens):
    """Independent of the scan's code: each row fed one token at a time through selective_state_update (a
    150-token row spans the reference's blocks of 64, each summed in closed form)."""
    a = batch(lens, chunk=16)
    state = a["state"].clone()
    out = mamba2.chunk_scan(**a, impl="reference")
    nh, hd, ds = state.shape[1:]
    step = state.clone()
    for n, slot in enumerate(a["state_indices"].tolist()):
        if not a["has_initial_state"][n]:
            step[slot] = 0
        for t in range(int(a["cu_seqlens"][n]), int(a["cu_seqlens"][n + 1])):
            y = mamba2.selective_state_update(
                step, a["x"][t : t + 1], a["dt"][t : t + 1, :, None].expand(1, nh, hd),
                a["A"][:, None, None].expand(nh, hd, ds), a["B"][t : t + 1], a["C"][t : t + 1],
                D=a["D"][:, None].expand(nh, hd), z=a["z"][t : t + 1],
                dt_bias=a["dt_bias"][:, None].expand(nh, hd), dt_softplus=True,
                state_indices=torch.tensor([slot]), impl="reference",
            )  # fmt: skip
            torch.testing.assert_close(out[t], y[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(a["state"], step, rtol=1e-12, atol=1e-12)
    assert torch.equal(a["state"][0], state[0])  # the free slot: bitwise unchanged


@pytest.mark.parametrize("impl", IMPLS)
def test_chunk_states_lie_on_one_grid_over_the_flattened_batch(impl):
    """Entry k is the state of the row owning flattened token k*C - 1 after its tokens up to there: checked
    against the scan of that row's first tokens alone. Rows of 5, 7 and 6 tokens with C = 4: row 1 starts off
    the grid (token 5), so its entries fall 3 and 7 tokens in, not at multiples of C; row 2 starts on it
    (token 12), its entry 4 tokens in."""
    lens, chunk = [5, 7, 6], 4
    dtype = torch.float32 if impl == "triton" else torch.float64
    a = batch(lens, chunk=chunk, dtype=dtype)
    before = a["state"].clone()
    mamba2.chunk_scan(**a, impl=impl)
    h, cu = a["chunk_states"], a["cu_seqlens"].tolist()
    assert [grid_owner(cu, k, chunk) for k in range(h.shape[0])] == [(0, 0), (0, 4), (1, 3), (1, 7), (2, 4)]
    for k in range(h.shape[0]):
        row, tokens = grid_owner(cu, k, chunk)
        alone = batch(lens, chunk=chunk, dtype=dtype)
        start = int(cu[row])
        want = before[row + 1].clone() if a["has_initial_state"][row] else torch.zeros_like(before[row + 1])
        if tokens:
            one = {key: v[start : start + tokens] for key, v in alone.items() if key in ("x", "dt", "B", "C", "z")}
            pool = before[row + 1 : row + 2].clone()
            mamba2.chunk_scan(
                **one, A=alone["A"], D=alone["D"], dt_bias=alone["dt_bias"], dt_softplus=True, state=pool,
                state_indices=torch.tensor([0]), cu_seqlens=torch.tensor([0, tokens]),
                has_initial_state=alone["has_initial_state"][row : row + 1], impl="reference",
            )  # fmt: skip
            want = pool[0]
        assert rel_err(h[k], want) < 1e-5, (k, row, tokens)
        assert grid_index(cu, row, tokens, chunk) == k


@pytest.mark.parametrize("impl", IMPLS)
def test_per_sequence_offsets_read_another_state_on_this_grid(impl):
    """sglang issue 31833: counting ``ceil(len / C)`` chunks per row before row b, as for GDN's per-sequence
    chunk states, names an entry of this grid that is not row b's state at its chunk boundary. Rows of 20, 20
    and 12 tokens, C = 16: row 1 after 16 tokens is GDN-style h[2 + 1] = h[3], which here is row 2's state
    after 8 tokens; row 1's is on no entry (20 + 16 = 36 is off the grid)."""
    lens, chunk = [20, 20, 12], 16
    dtype = torch.float32 if impl == "triton" else torch.float64
    a = batch(lens, chunk=chunk, dtype=dtype)
    a["has_initial_state"][:] = False  # from zeros: a row's prefix state is the scan of its tokens alone
    mamba2.chunk_scan(**a, impl=impl)
    cu = a["cu_seqlens"].tolist()
    per_sequence = -(-lens[0] // chunk) + 16 // chunk
    assert per_sequence == 3 and grid_owner(cu, per_sequence, chunk) == (2, 8)
    assert grid_index(cu, 1, 16, chunk) is None  # recompute it

    def alone(row: int, tokens: int) -> torch.Tensor:
        b, start = batch(lens, chunk=chunk), cu[row]
        one = {k: b[k][start : start + tokens] for k in ("x", "dt", "B", "C", "z")}
        pool = torch.zeros(1, *b["state"].shape[1:], dtype=torch.float64)
        mamba2.chunk_scan(**one, A=b["A"], D=b["D"], dt_bias=b["dt_bias"], dt_softplus=True, state=pool,
                          state_indices=torch.tensor([0]), cu_seqlens=torch.tensor([0, tokens]))  # fmt: skip
        return pool[0]

    h = a["chunk_states"].double()
    assert rel_err(h[3], alone(2, 8)) < 1e-5  # what the per-sequence index reads
    assert rel_err(h[3], alone(1, 16)) > 0.1  # not row 1's state at its boundary


@pytest.mark.slow  # rows of 83 tokens through the interpreted Triton scan
def test_long_rows_split_headdim_across_programs():
    """Rows longer than several chunks, headdim split across programs (block_p=2): the Triton launcher
    against the reference, every state and chunk state."""
    a32 = batch([19, 1, 83], headdim=5, chunk=8, dtype=torch.float32, seed=3)  # past a reference block
    a64 = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in a32.items()}
    from kernels.mamba2.triton_scan import chunk_scan_triton

    out = torch.full_like(a32["x"], float("nan"))
    chunk_scan_triton(**a32, out=out, pad_slot_id=-1, block_p=2)
    ref = mamba2.chunk_scan(**a64, impl="reference")
    assert rel_err(out, ref) < 1e-4
    assert rel_err(a32["state"], a64["state"]) < 1e-4
    assert rel_err(a32["chunk_states"], a64["chunk_states"]) < 1e-4
    assert not a32["chunk_states"].isnan().any()


@pytest.mark.parametrize("impl", IMPLS)
def test_without_chunk_states_the_rest_is_the_same(impl):
    dtype = torch.float32 if impl == "triton" else torch.float64
    a, b = batch([6, 4], dtype=dtype), batch([6, 4], dtype=dtype)
    b["chunk_states"] = None
    torch.testing.assert_close(mamba2.chunk_scan(**a, impl=impl), mamba2.chunk_scan(**b, impl=impl), rtol=0, atol=0)
    assert torch.equal(a["state"], b["state"])


def test_no_tokens_leaves_the_pool_alone():
    a = batch([0, 0], dtype=torch.float32)
    a["chunk_states"] = torch.empty(0, *a["state"].shape[1:])
    before = a["state"].clone()
    for impl in IMPLS:
        out = mamba2.chunk_scan(**a, impl=impl)
        assert out.shape[0] == 0 and torch.equal(a["state"], before)


# --- custom op, validation, cost ------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_each_call_is_one_custom_op(impl):
    a = make_case(OP, rows=1, padded=1, convention="sglang").fresh().args
    with OpLog() as log:
        mamba2.chunk_scan(**a, impl=impl)
    assert log.ops == ["linattn.mamba2_chunk_scan.default"]


def test_custom_op_schema_declares_the_mutations():
    i = batch([3, 2], dtype=torch.float32)
    args = (i["x"], i["dt"], i["A"], i["B"], i["C"], i["D"], i["z"], i["dt_bias"], True, i["state"])
    rest = (i["state_indices"], i["has_initial_state"], i["cu_seqlens"], -1, 4, torch.empty_like(i["x"]))
    opcheck_mutations(torch.ops.linattn.mamba2_chunk_scan.default, (*args, *rest, i["chunk_states"], "reference"))


BAD = [
    ("x", lambda i: i["x"][0], r"x must be \[T, nheads, headdim\]"),
    ("dt", lambda i: i["dt"][:, :, None], r"dt must have shape \[8, 4\]"),
    ("A", lambda i: torch.randn(4, 6), r"A must have shape \[4\]"),
    ("D", lambda i: torch.randn(4, 6), r"D must have shape \[4\]"),
    ("dt_bias", lambda i: torch.randn(3), r"dt_bias must have shape \[4\]"),
    ("B", lambda i: torch.randn(8, 3, 5), r"nheads \(4\) must be a multiple of ngroups"),
    ("z", lambda i: torch.randn(8, 4, 5), r"z must have shape \[8, 4, 6\]"),
    ("state", lambda i: i["state"][:, :, :, :2], r"state must have shape \[3, 4, 6, 5\]"),
    ("state", lambda i: i["state"].half(), r"state must have dtype in \['torch.float32', 'torch.float64'\]"),
    ("cu_seqlens", lambda i: torch.tensor([0, 5, 9]), r"cu_seqlens: last entry 9 exceeds the number of tokens T=8"),
    ("cu_seqlens", lambda i: torch.tensor([0, 5, 3]), r"cu_seqlens: must be non-decreasing, row 1: 5 -> 3"),
    ("state_indices", lambda i: torch.tensor([1, 7]), r"state_indices: row 1 has slot 7, outside \[0, 3\)"),
    ("chunk_size", lambda i: 0, r"chunk_size must be an int >= 1, got 0"),
    ("chunk_states", lambda i: torch.zeros(3, 4, 6, 5), r"chunk_states must have shape \[2, 4, 6, 5\]"),
    ("impl", lambda i: "gpu", r"impl must be one of"),
]


@pytest.mark.parametrize("name,make,match", BAD, ids=[f"{b[0]}-{k}" for k, b in enumerate(BAD)])
def test_rejects_bad_inputs(name, make, match):
    kw = batch([5, 3], dtype=torch.float32)
    kw[name] = make(kw)
    before = kw["state"].clone() if isinstance(kw["state"], torch.Tensor) else None
    with pytest.raises(ValueError, match=rf"mamba2.chunk_scan: {match}"):
        mamba2.chunk_scan(**kw)
    if before is not None and kw["state"].shape == before.shape and kw["state"].dtype == before.dtype:
        assert torch.equal(kw["state"], before)  # refused before anything was written


def test_cost():
    c = mamba2.chunk_scan_cost(10, 2, 4, 8, 16, 1, torch.float16, num_chunks=3, has_D=False)
    state = 4 * 8 * 16 * 4
    io = 10 * 4 * 8 * 2 * 2 + 10 * 4 * 2 + 2 * 10 * 16 * 2 + 4 * 4 * 2
    assert c.bytes == 2 * 2 * state + 3 * state + io
    assert c.flops == 7 * 10 * 4 * 8 * 16 + 10 * 4 * 8 + 10 * 4 * 7
    assert mamba2.chunk_scan_cost(10, 2, 4, 8, 16, 1, torch.float16, has_z=True).bytes > c.bytes - 3 * state
