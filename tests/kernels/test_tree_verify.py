"""Tree verify (sglang's topk > 1 drafts): ``retrieve_parent_token`` on ``gated_delta_rule.recurrent``,
``causal_conv1d.update`` and ``mamba2.selective_state_update``, and ``scatter_accepted(accepted_steps=)``.

The truth is written here, in float64 and independently of the ops: for every node, walk its ancestors from the
root and run the plain recurrence (the convolution over the ancestors' inputs) along that path from the slot.
Both implementations must give every node's output and intermediate state; a chain-shaped tree must give the
chain verify's results bit for bit; the trees drawn here are never chains (an op that ignored the parents would
fail); bad trees and trees without the intermediate buffer or with a state update are refused by name. The
per-op conformance matrices (test_gated_delta_rule.py, test_causal_conv1d.py, test_mamba2.py) run the cases'
"tree" and "accepted_steps" variants under every convention and layout against the op's own float64 reference;
this file checks that reference and Triton against a truth written apart, node by node.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _kernel_helpers import IMPLS, OpLog, launch_triton, opcheck_mutations

import kernels.causal_conv1d as conv
import kernels.gated_delta_rule as gdn
import kernels.mamba2 as mamba2
from kernels.conventions import to_layout
from kernels.testing import Case, cu_seqlens, make_case, rel_err

GDN, CONV, SSM = "gated_delta_rule.recurrent", "causal_conv1d.update", "mamba2.selective_state_update"
D = 4  # nodes per row: a root, and three nodes whose parents are drawn
INTER = {GDN: "intermediate_states", CONV: "intermediate_conv_windows", SSM: "intermediate_states"}
# the float64 reference (inputs in float64) is held to float64 rounding, Triton (float32) to its tolerance
DTYPE = {"reference": torch.float64, "triton": torch.float32}
TOL = {"reference": 1e-12, "triton": 1e-4}


# ------------------------------------------------------------------------------------------ draft trees


def random_trees(rows: int, nodes: int, seed: int) -> torch.Tensor:
    """int32 ``[rows, nodes]``: node t's parent uniform in 0..t-1, redrawn until no row is a chain (so an op
    that ignores the parents, or reads step t-1, fails) and some node hangs off the root past node 1."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        parents = torch.zeros(rows, nodes, dtype=torch.int32)
        for t in range(1, nodes):
            parents[:, t] = torch.randint(0, t, (rows,), generator=gen, dtype=torch.int32)
        steps = torch.arange(nodes, dtype=torch.int32) - 1
        not_chain = (parents[:, 2:] != steps[2:]).any(dim=1).all()
        if bool(not_chain) and bool((parents[:, 2:] == 0).any()):
            return parents


def chain(rows: int, nodes: int) -> torch.Tensor:
    """The tree that is a chain: node t's parent is t - 1."""
    return (torch.arange(nodes, dtype=torch.int32) - 1).clamp(min=0).repeat(rows, 1)


def path(parents: list[int], node: int) -> list[int]:
    """The nodes from the root (0) down to ``node``."""
    out = [node]
    while out[-1] != 0:
        out.append(parents[out[-1]])
    return out[::-1]


def skipped(args: dict, n: int) -> bool:
    pad = args["pad_slot_id"]
    return pad is not None and int(args["state_indices"][n]) <= pad


def tree_case(op: str, convention: str = "sglang", *, dtype=torch.float32, seed: int = 0, **kw) -> Case:
    """A "tree" case (two live rows on the pool's edges and one in the middle, one padded row) with trees
    that are no chains."""
    shapes = {"D": D, "V": 10, "HV": 2} if op == GDN else {"D": D}
    case = make_case(op, "tree", convention=convention, rows=3, padded=1, shapes=shapes, dtype=dtype, seed=seed, **kw)
    case.args["retrieve_parent_token"] = random_trees(4, D, seed)
    return case


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit, NaN poison included."""
    return a.dtype == b.dtype and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def assert_pool_untouched(case: Case, call) -> None:
    """A tree verify writes no slot (disable_state_update): every pool, guard band included, bit for bit."""
    for name, storage in case.storage.items():
        after = call.storage[name]  # float64 copies for the reference: exact copies of the float32 pool
        assert bitwise_equal(after, storage.to(after.dtype)), f"{name} changed"


# --------------------------------------------------------------------------- float64 truth, node by node


def naive_gdn(args: dict, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every node of every processed row from its slot along its ancestors' path, in float64, K-first.
    Returns (out [T, HV, V], intermediate [N, depth, HV, K, V], NaN where no node)."""
    f = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in args.items()}
    q, k, v = f["q"], f["k"], f["v"]
    state = to_layout(f["state"], f.get("state_layout", "k_first"), "k_first")
    if f.get("A_log") is not None:  # the engine's gating, written out
        g = -torch.exp(f["A_log"]) * F.softplus(f["a"] + f["dt_bias"])
        beta = torch.sigmoid(f["b"])
    else:
        g, beta = f.get("g"), f["beta"]
    gk = f.get("gk")
    T, HV, V = v.shape
    N, K, group = f["state_indices"].shape[0], q.shape[2], HV // q.shape[1]
    if f["use_qk_l2norm"]:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    out = torch.zeros(T, HV, V, dtype=torch.float64)
    inter = torch.full((N, depth, HV, K, V), float("nan"), dtype=torch.float64)
    cu, parents = f["cu_seqlens"].tolist(), f["retrieve_parent_token"].tolist()
    for n in range(N):
        if skipped(f, n):
            continue
        slot, bos = int(f["state_indices"][n]), cu[n]
        fresh = f.get("has_initial_state") is not None and not bool(f["has_initial_state"][n])
        for t in range(cu[n + 1] - bos):
            for h in range(HV):
                S = torch.zeros_like(state[slot, h]) if fresh else state[slot, h].clone()
                for node in path(parents[n], t):
                    tok, hk = bos + node, h // group
                    decay = torch.exp(gk[tok, h])[:, None] if gk is not None else torch.exp(g[tok, h])
                    S = decay * S
                    u = beta[tok, h] * (v[tok, h] - S.T @ k[tok, hk])
                    S = S + torch.outer(k[tok, hk], u)
                out[bos + t, h] = S.T @ (f["scale"] * q[bos + t, h // group])
                inter[n, t, h] = S
    return out, inter


def naive_conv(args: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Node t's output: the convolution over the slot's W-1 inputs followed by its ancestors' inputs, root
    first; its window: the last W-1 of those. Returns (out [N, L, dim], windows [N, L, dim, W-1])."""
    x, w, b, pool = (args[k].double() for k in ("x", "weight", "bias", "conv_state"))
    N, L, dim = x.shape
    W = w.shape[1]
    out = torch.zeros(N, L, dim, dtype=torch.float64)
    inter = torch.full((N, L, dim, W - 1), float("nan"), dtype=torch.float64)
    parents = args["retrieve_parent_token"].tolist()
    for n in range(N):
        if skipped(args, n):
            continue
        for t in range(L):
            inputs = torch.cat([pool[int(args["state_indices"][n])], x[n, path(parents[n], t)].T], dim=1)
            y = b + (inputs[:, -W:] * w).sum(-1)
            out[n, t] = F.silu(y) if args["activation"] == "silu" else y
            inter[n, t] = inputs[:, -(W - 1) :]
    return out, inter


def naive_ssm(args: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Every node of every processed row from its slot along its ancestors' path (mamba_ssm's step), float64.
    Returns (out [N, L, nheads, headdim], intermediate [N, L, nheads, headdim, dstate])."""
    f = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in args.items()}
    x, state = f["x"], f["state"]
    N, L, nh, hd = x.shape
    per_group = nh // f["B"].shape[2]
    out = torch.zeros(N, L, nh, hd, dtype=torch.float64)
    inter = torch.full((N, L, nh, hd, state.shape[-1]), float("nan"), dtype=torch.float64)
    parents = f["retrieve_parent_token"].tolist()
    for n in range(N):
        if skipped(f, n):
            continue
        for t in range(L):
            for h in range(nh):
                S = state[int(f["state_indices"][n]), h].clone()
                for node in path(parents[n], t):
                    dt = F.softplus(f["dt"][n, node, h] + f["dt_bias"][h])
                    B = f["B"][n, node, h // per_group]
                    S = S * torch.exp(f["A"][h] * dt[:, None]) + (dt * x[n, node, h])[:, None] * B[None, :]
                y = S @ f["C"][n, t, h // per_group] + f["D"][h] * x[n, t, h]
                out[n, t, h] = y * F.silu(f["z"][n, t, h])
                inter[n, t, h] = S
    return out, inter


def run(case: Case, impl: str, **change):
    """The op on a NaN-poisoned copy of the case (float64 for the reference), with ``change`` applied."""
    call = case.fresh(DTYPE[impl])
    call.args.update(change)
    case.fn(**call.args, impl=impl)
    return call


def assert_matches(got: torch.Tensor, want: torch.Tensor, tol: float, what: str) -> None:
    """Written where the truth is (NaN poison left nowhere), untouched (NaN) where it is not, within tol."""
    assert torch.equal(got.isnan(), want.isnan()), f"{what}: written where it should not be, or left unwritten"
    assert rel_err(got, want) <= tol, f"{what}: error {rel_err(got, want):.3g}"


# -------------------------------------------------------------------------------------- per-node truth


def _gdn_gates(case: Case, gate: str) -> None:
    """Swap the case's engine gating for the ready scalar gate ``g`` or KDA's per-channel ``gk`` (with beta)."""
    if gate == "gating":
        return
    a = case.args
    gen = torch.Generator().manual_seed(5)
    T, HV, K = a["v"].shape[0], a["v"].shape[1], a["q"].shape[2]
    for name in ("a", "b", "A_log", "dt_bias"):
        del a[name]
    a["beta"] = 0.1 + 0.8 * torch.rand(T, HV, generator=gen)
    shape = (T, HV) if gate == "g" else (T, HV, K)
    a[gate] = -(0.02 + 0.5 * torch.rand(*shape, generator=gen))


@pytest.mark.parametrize("state_layout", ["k_first", "v_first"])
@pytest.mark.parametrize("gate", ["g", "gk", "gating"])
@pytest.mark.parametrize("impl", IMPLS)
def test_gdn_every_node_is_the_recurrence_along_its_branch(impl, gate, state_layout):
    """GVA (2 value heads on 1 q/k head), K != V, rows of 4, 3 and 4 nodes (D' = 4 columns; the short row
    without an initial state: its root starts from zeros), a padded row: every node's output and intermediate
    state is the recurrence from the slot along its ancestors, for the scalar gate, the per-channel gate and the
    engine gating, in both layouts; padding tokens and the padded row output zeros, the pool (guard band
    included) is bitwise unchanged."""
    case = tree_case(GDN, state_layout=state_layout)
    _gdn_gates(case, gate)
    lens = [D, D - 1, D, 0]  # a row shorter than the buffer's depth; the tail tokens belong to nobody
    case.args["cu_seqlens"] = cu_seqlens(lens)
    case.args["has_initial_state"] = torch.tensor([True, False, True, True])
    call = run(case, impl)
    want_out, want_inter = naive_gdn(call.args, D)
    got_inter = to_layout(call.args["intermediate_states"], state_layout, "k_first")
    assert_matches(call.args["out"], want_out, TOL[impl], "out")
    assert_matches(got_inter, want_inter, TOL[impl], "intermediate_states")
    assert (call.args["out"][sum(lens) :] == 0).all()
    assert_pool_untouched(case, call)
    chained = run(case, impl, retrieve_parent_token=chain(4, D))  # not a chain: the parents change the results
    assert rel_err(chained.args["out"], call.args["out"]) > 1e-3


@pytest.mark.parametrize("convention", ["sglang", "sglang-ascend", "vllm"])
@pytest.mark.parametrize("impl", IMPLS)
def test_conv_every_node_convolves_its_ancestors_inputs(impl, convention):
    """Width 4 over 4 nodes: a node at depth < 3 reaches back into the slot's inputs, a deeper one does not;
    every node's output and window (the last W-1 of its ancestors' inputs) as the naive convolution; the
    pool is bitwise unchanged (Ascend's padded row really runs, on the dummy slot, and writes no slot either)."""
    case = tree_case(CONV, convention)
    call = run(case, impl)
    want_out, want_inter = naive_conv(call.args)
    if case.convention.processes_padding:  # the padded row runs on the dummy slot: judged as a live one
        assert not torch.isnan(call.args["out"][-1]).any()
    assert_matches(call.args["out"], want_out, TOL[impl], "out")
    assert_matches(call.args["intermediate_conv_windows"], want_inter, TOL[impl], "intermediate_conv_windows")
    assert_pool_untouched(case, call)
    chained = run(case, impl, retrieve_parent_token=chain(4, D))
    assert rel_err(chained.args["out"], call.args["out"]) > 1e-3


@pytest.mark.parametrize("convention", ["sglang", "vllm"])
@pytest.mark.parametrize("impl", IMPLS)
def test_mamba2_every_node_is_the_ssm_along_its_branch(impl, convention):
    """Grouped B/C (4 heads, 2 groups), the engines' stride-0 parameters: every node's output and state as
    mamba_ssm's step along its ancestors from the slot; the pool bitwise unchanged."""
    case = tree_case(SSM, convention)
    call = run(case, impl)
    want_out, want_inter = naive_ssm(call.args)
    assert_matches(call.args["out"], want_out, TOL[impl], "out")
    assert_matches(call.args["intermediate_states"], want_inter, TOL[impl], "intermediate_states")
    assert_pool_untouched(case, call)
    chained = run(case, impl, retrieve_parent_token=chain(4, D))
    assert rel_err(chained.args["out"], call.args["out"]) > 1e-3


# ---------------------------------------------------------------------------------- a chain is a chain


@pytest.mark.parametrize(
    "op,state_layout", [(GDN, "k_first"), (GDN, "v_first"), (CONV, None), (SSM, None)], ids=lambda v: str(v)
)
@pytest.mark.parametrize("impl", IMPLS)
def test_a_chain_shaped_tree_is_the_chain_verify_bit_for_bit(op, state_layout, impl):
    """parent[t] = t - 1 (int64 here: both index dtypes) gives the outputs and intermediate buffers of the
    verify without a tree, bit for bit, in float32, for both implementations."""
    case = tree_case(op, state_layout=state_layout) if state_layout else tree_case(op)
    tree, plain = case.fresh(), case.fresh()  # float32 for both implementations
    tree.args["retrieve_parent_token"] = chain(4, D).long()
    del plain.args["retrieve_parent_token"]
    for call in (tree, plain):
        case.fn(**call.args, impl=impl)
    assert tree.args["out"].dtype == torch.float32
    for name in ("out", INTER[op]):
        assert bitwise_equal(tree.args[name], plain.args[name]), name


# ------------------------------------------------------------------------------------------- refusals


def _args(op: str, convention: str = "sglang") -> dict:
    return tree_case(op, convention).fresh().args


def _with(parents: torch.Tensor, at: tuple[int, int], value: int) -> torch.Tensor:
    parents = parents.clone()
    parents[at] = value
    return parents


@pytest.mark.parametrize("op", [GDN, CONV, SSM])
def test_a_bad_tree_is_refused_naming_the_node_and_its_value(op):
    args = _args(op)
    parents = args["retrieve_parent_token"]
    bad = [
        ((1, 3), 3, r"retrieve_parent_token\[1, 3\] = 3: a node's parent must come before it \(0\.\.2\)"),
        ((0, 2), -1, r"retrieve_parent_token\[0, 2\] = -1: a node's parent must come before it \(0\.\.1\)"),
        ((2, 1), 5, r"retrieve_parent_token\[2, 1\] = 5: a node's parent must come before it \(0\.\.0\)"),
    ]
    for at, value, msg in bad:
        with pytest.raises(ValueError, match=rf"^{op}: {msg}$"):
            case_fn(op)(**{**args, "retrieve_parent_token": _with(parents, at, value)}, impl="reference")
    # node 0 has no parent: whatever sglang writes there is ignored
    case_fn(op)(**{**args, "retrieve_parent_token": _with(parents, (1, 0), 7)}, impl="reference")


def case_fn(op: str):
    return {GDN: gdn.recurrent, CONV: conv.update, SSM: mamba2.selective_state_update}[op]


@pytest.mark.parametrize("op", [GDN, CONV, SSM])
def test_a_tree_without_its_buffer_or_with_a_state_update_is_refused(op):
    """A tree reads its nodes back from the intermediate buffer, and its last node is a leaf of one branch,
    not the row's final state: no buffer, or a state update, is refused naming retrieve_parent_token."""
    args, inter, fn = _args(op), INTER[op], case_fn(op)
    prefix = rf"^{op}: retrieve_parent_token: a tree verify needs"
    with pytest.raises(ValueError, match=rf"{prefix} {inter}: each node starts from its parent's state"):
        fn(**{**args, inter: None}, impl="reference")
    with pytest.raises(ValueError, match=rf"{prefix} disable_state_update=True: its last node is a leaf"):
        fn(**{**args, "disable_state_update": False}, impl="reference")


@pytest.mark.parametrize("op", [GDN, CONV, SSM])
def test_a_tree_of_the_wrong_shape_dtype_or_width_is_refused(op):
    args, fn = _args(op), case_fn(op)
    parents = args["retrieve_parent_token"]
    bad = [
        (parents[:3], r"retrieve_parent_token must be \[N=4, D\] \(each draft node's parent\), got shape \[3, 4\]"),
        (parents[0], r"retrieve_parent_token must be \[N=4, D\]"),
        (parents.float(), r"retrieve_parent_token must have dtype in \['torch.int32', 'torch.int64'\]"),
        (parents[:, :3].contiguous(), r"retrieve_parent_token: .*D=3 columns .*; D must be >= every row's length"),
    ]
    for value, msg in bad:
        with pytest.raises(ValueError, match=rf"^{op}: {msg}"):
            fn(**{**args, "retrieve_parent_token": value}, impl="reference")
    wide = torch.cat([parents, torch.zeros(4, 2, dtype=parents.dtype)], dim=1)  # D' > L: accepted
    fn(**{**args, "retrieve_parent_token": wide}, impl="reference")


def test_mamba2_refuses_a_tree_without_the_step_axis():
    case = make_case(SSM, "decode", rows=2, padded=0)
    args = {**case.fresh().args, "retrieve_parent_token": torch.zeros(2, 1, dtype=torch.int32)}
    with pytest.raises(ValueError, match=r"retrieve_parent_token needs the step axis: x \[N, L, nheads, headdim\]"):
        mamba2.selective_state_update(**args, impl="reference")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("op", [GDN, CONV, SSM])
def test_a_skipped_rows_tree_and_a_roots_parent_are_never_read(op, impl):
    """The padded row (skipped under sglang) holds a garbage tree and a live row's root a garbage parent: not
    checked, not read, nothing changes. Where padded rows are processed (Ascend), the padded row's garbage is
    refused, naming the row."""
    tokens = {"padded_tokens": True} if op == GDN else {}  # the padded row carries tokens, as a live one
    case = tree_case(op, **tokens)
    parents = case.args["retrieve_parent_token"]
    garbage = _with(_with(_with(parents, (3, 1), 99), (3, 3), -7), (0, 0), 99)
    call = run(case, impl, retrieve_parent_token=garbage)
    want = run(case, impl)
    for name in ("out", INTER[op]):
        assert bitwise_equal(call.args[name], want.args[name]), name
    ascend = tree_case(op, "sglang-ascend", **tokens).fresh().args
    with pytest.raises(ValueError, match=r"retrieve_parent_token\[3, 1\] = 99"):
        case_fn(op)(**{**ascend, "retrieve_parent_token": garbage}, impl="reference")


# --------------------------------------------------------------------------------- the op as one call


@pytest.mark.parametrize("op", [GDN, CONV, SSM])
def test_a_tree_call_is_one_custom_op_whose_schema_takes_the_parents(op):
    """One ``linattn::`` op per call; inside a TorchDispatchMode (the graph recorder) nothing reads the parents'
    values on the host, so even a bad parent is not refused there: on a device the Triton kernel reads zeros for
    it, never memory outside the row's steps (the other nodes as before)."""
    case = tree_case(op)
    opname = {GDN: "gdn_recurrent", CONV: "causal_conv1d_update", SSM: "mamba2_selective_state_update"}[op]
    custom = getattr(torch.ops.linattn, opname).default
    assert "Tensor? retrieve_parent_token=None" in str(custom._schema)
    good = case.fresh()
    bad = case.fresh()
    bad.args["retrieve_parent_token"] = _with(good.args["retrieve_parent_token"], (1, 3), 9)
    with OpLog() as log:
        case.fn(**good.args, impl="triton")
        case.fn(**bad.args, impl="triton")
    assert log.ops == [f"linattn.{opname}.default"] * 2
    node = (int(good.args["cu_seqlens"][1]) + 3,) if op == GDN else (1, 3)  # row 1's node 3: out's index
    assert bad.args["out"][node].isfinite().all() and bad.args[INTER[op]][1, 3].isfinite().all()
    for name, at in (("out", node), (INTER[op], (1, 3))):
        got, want = bad.args[name].clone(), good.args[name].clone()
        got[at], want[at] = 0, 0  # the bad node aside, every node as before, bit for bit
        assert bitwise_equal(got, want), name
    assert_pool_untouched(case, bad)


def test_tree_schemas_pass_opcheck():
    """The declared mutations hold with a tree too (torch.library.opcheck, positional in schema order)."""
    a = tree_case(CONV).fresh().args
    op = torch.ops.linattn.causal_conv1d_update.default
    opcheck_mutations(
        op,
        (a["x"], a["conv_state"], a["weight"], a["bias"], a["state_indices"], a["intermediate_conv_windows"],
         a["out"], "silu", True, -1, "reference", a["retrieve_parent_token"]),
    )  # fmt: skip


# ----------------------------------------------------------------------------- committing a tree's node


def _scatter_args(convention: str = "vllm") -> tuple[Case, dict]:
    case = make_case(
        "gated_delta_rule.scatter_accepted", "accepted_steps", convention=convention, rows=3, padded=2,
        shapes={"D": D, "V": 10},
    )  # fmt: skip
    return case, case.fresh().args


@pytest.mark.parametrize("impl", IMPLS)
def test_accepted_steps_commits_that_step_as_num_accepted_commits_the_one_before(impl):
    """accepted_steps[n] = s copies intermediate step s to the row's slot, as num_accepted = s + 1 does;
    padded rows (any value: 99 here) and every other slot stay bitwise unchanged."""
    case, args = _scatter_args()
    steps = torch.tensor([3, 0, 2, 99, -5], dtype=torch.int32)
    args["accepted_steps"] = steps
    gdn.scatter_accepted(**args, impl=impl)
    idx, inter = args["state_indices"].tolist(), args["intermediate_states"]
    for n in range(case.rows):
        assert torch.equal(args["state"][idx[n]], inter[n, int(steps[n])]), f"row {n}"
    for s in set(range(args["state"].shape[0])) - set(idx[: case.rows]):
        assert torch.equal(args["state"][s], case.args["state"][s]), f"slot {s}"
    counted = case.fresh().args
    del counted["accepted_steps"]
    gdn.scatter_accepted(**counted, num_accepted=torch.tensor([4, 1, 3, 0, 0], dtype=torch.int32), impl=impl)
    assert torch.equal(counted["state"], args["state"])


def test_scatter_takes_exactly_one_step_tensor_and_range_checks_it():
    case, args = _scatter_args()
    steps = args.pop("accepted_steps")
    op = "gated_delta_rule.scatter_accepted"
    with pytest.raises(
        ValueError, match=rf"^{op}: accepted_steps: give num_accepted .* or accepted_steps .*, got neither"
    ):
        gdn.scatter_accepted(**args)
    with pytest.raises(ValueError, match=r"accepted_steps: give num_accepted .*, got both"):
        gdn.scatter_accepted(**args, num_accepted=steps + 1, accepted_steps=steps)
    for bad, row in ((D, 1), (-1, 2)):
        wrong = _with(steps.view(1, -1), (0, row), bad).view(-1)
        with pytest.raises(ValueError, match=rf"^{op}: accepted_steps: row {row} has {bad}, must be in 0\.\.D-1=3"):
            gdn.scatter_accepted(**args, accepted_steps=wrong)
    with pytest.raises(ValueError, match=r"accepted_steps must have shape \[5\]"):
        gdn.scatter_accepted(**args, accepted_steps=steps[:3])


@pytest.mark.parametrize("impl", IMPLS)
def test_tree_verify_then_commit_equals_decoding_the_accepted_branch(impl):
    """Verify a tree, accept one node per row (a deep one, a root, one hanging off the root), commit it with
    accepted_steps: each live slot holds the state of decoding that node's branch token by token from the
    original pool (the op's decode, no tree); the other slots are unchanged."""
    case = tree_case(GDN, "vllm")
    call = run(case, impl)
    a = call.args
    accepted = [D - 1, 0, int(torch.nonzero(a["retrieve_parent_token"][2, 1:] == 0)[-1]) + 1, 0]
    gdn.scatter_accepted(
        a["state"], a["intermediate_states"], a["state_indices"], accepted_steps=torch.tensor(accepted),
        pad_slot_id=a["pad_slot_id"], impl=impl,
    )  # fmt: skip
    seq = case.fresh(DTYPE[impl]).args
    pool, parents, cu = seq["state"], a["retrieve_parent_token"].tolist(), a["cu_seqlens"].tolist()
    gating = {k: seq[k] for k in ("A_log", "dt_bias")}
    for n in range(case.rows):
        for node in path(parents[n], accepted[n]):
            tok = torch.tensor([cu[n] + node])
            gdn.recurrent(
                *(seq[k][tok] for k in ("q", "k", "v")), a=seq["a"][tok], b=seq["b"][tok], **gating, state=pool,
                state_indices=seq["state_indices"][n : n + 1], cu_seqlens=cu_seqlens([1]), scale=seq["scale"],
                use_qk_l2norm=True, impl="reference",
            )  # fmt: skip
    live = case.live_slots
    for s in range(pool.shape[0]):
        if s in live:
            assert rel_err(a["state"][s], pool[s]) <= TOL[impl], f"slot {s}"
        else:
            assert torch.equal(a["state"][s], case.fresh(DTYPE[impl]).args["state"][s]), f"slot {s}"


# ---------------------------------------------------------------------------------------------- costs


def test_a_tree_costs_its_parents_state_reads():
    N, HV, K, V = 8, 4, 16, 16
    chain_cost = gdn.recurrent_cost(N * D, N, 1, HV, K, V, num_intermediate=N * D, state_update=False)
    tree_cost = gdn.recurrent_cost(N * D, N, 1, HV, K, V, num_intermediate=N * D, state_update=False, tree=True)
    assert tree_cost.bytes - chain_cost.bytes == N * (D - 1) * HV * K * V * 4 + N * D * 4
    assert tree_cost.flops == chain_cost.flops
    c0 = conv.update_cost(N, D, 32, 4, torch.float32, intermediate=True, state_update=False)
    c1 = conv.update_cost(N, D, 32, 4, torch.float32, intermediate=True, state_update=False, tree=True)
    assert c1.bytes - c0.bytes == (D - 1) * N * 32 * 3 * 4 + N * D * 4
    m0 = mamba2.selective_state_update_cost(N, 4, 8, 16, 2, torch.float32, steps=D, intermediate=True)
    m1 = mamba2.selective_state_update_cost(N, 4, 8, 16, 2, torch.float32, steps=D, intermediate=True, tree=True)
    assert m1.bytes - m0.bytes == N * (D - 1) * 4 * 8 * 16 * 4 + N * D * 4


def test_the_triton_launchers_refuse_a_tree_without_its_buffer():
    """The launchers (what a GPU script calls directly) refuse a tree they cannot run, as the ops do."""
    for op in (GDN, CONV, SSM):
        case = tree_case(op)
        call = case.fresh()
        with pytest.raises(ValueError, match="a tree verify needs"):
            launch_triton(case, {**call.args, "disable_state_update": False})
