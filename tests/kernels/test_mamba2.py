"""mamba2.selective_state_update: the conformance matrix (``kernels.testing``), the reference against the
mamba_ssm formula, and what the matrix does not cover (untied parameters, no optional inputs, softplus
extremes, strided inputs, argument errors, the custom op, the cost model).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _kernel_helpers import IMPLS, OpLog, conformance, opcheck_mutations

from kernels import mamba2
from kernels.cost import Cost
from kernels.testing import make_case, rel_err

OP = "mamba2.selective_state_update"
OPTIONAL = ("D", "z", "dt_bias")


def inputs(rows: int = 2, *, dtype: torch.dtype = torch.float32, num_slots: int | None = None, **shapes: int) -> dict:
    """The op's arguments for ``rows`` live rows and no padding, state and out included (``make_case``; dense
    copies: ``Case.fresh`` does not keep the stride-0 parameters)."""
    case = make_case(OP, rows=rows, padded=0, shapes=shapes, dtype=dtype, guard=0, num_slots=num_slots)
    return case.fresh(dtype if dtype == torch.float64 else None).args


# --- float64 reference: conformance and semantics ---------------------------------------------------


@pytest.mark.parametrize("run", conformance(OP), ids=str)
def test_conforms(run):
    run.check()


@pytest.mark.parametrize("impl", IMPLS)
def test_untied_parameters_without_optional_inputs(impl):
    """A, dt with a value per element (not per head expanded with stride 0); no D, z, dt_bias; no softplus."""
    case = make_case(OP, convention="vllm", rows=2, padded=1, shapes={"nheads": 6, "ngroups": 3})
    g = torch.Generator().manual_seed(1)
    a = case.args
    a.update(
        A=-(0.1 + torch.rand(a["A"].shape, generator=g)),
        dt=torch.rand(a["dt"].shape, generator=g).to(a["dt"].dtype),
        dt_softplus=False,
        **dict.fromkeys(OPTIONAL),
    )
    res = case.check(case.run(impl=impl))
    assert res.ok, res.summary()


def test_reference_follows_mamba_ssm_formula():
    """Independent check of the reference: one row, one head at a time, written out from the formula."""
    a = inputs(2, dtype=torch.float64, nheads=4, headdim=3, dstate=5, ngroups=2)
    state = a.pop("state")
    before = state.clone()
    nheads, ngroups = a["x"].shape[1], a["B"].shape[1]
    mamba2.selective_state_update(state, **a, impl="reference")
    out = a["out"]
    for n, slot in enumerate(a["state_indices"].tolist()):
        for h in range(nheads):
            g = h // (nheads // ngroups)
            dt = F.softplus(a["dt"][n, h] + a["dt_bias"][h])  # [headdim]
            S = before[slot, h] * torch.exp(a["A"][h] * dt[:, None])
            S = S + torch.outer(dt * a["x"][n, h], a["B"][n, g])
            y = S @ a["C"][n, g] + a["D"][h] * a["x"][n, h]
            y = y * a["z"][n, h] * torch.sigmoid(a["z"][n, h])
            torch.testing.assert_close(state[slot, h], S)
            torch.testing.assert_close(out[n, h], y)


@pytest.mark.parametrize("impl", IMPLS)
def test_softplus_extremes(impl):
    """softplus(dt) is linear above 20 and relatively accurate far below 0 (a naive log(1 + exp(dt))
    in float32 is off by percents at dt = -12). A zero state makes the update exactly dt * x * B."""
    a = inputs(1, nheads=1, headdim=4, dstate=4, ngroups=1)
    a.update(dt=torch.tensor([[[-30.0, -12.0, 19.0, 40.0]]]), dt_softplus=True, **dict.fromkeys(OPTIONAL))
    state = a.pop("state")
    state[a["state_indices"]] = 0.0
    state64 = state.double()
    mamba2.selective_state_update(state, **a, impl=impl)
    a64 = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in a.items()}
    mamba2.selective_state_update(state64, **{**a64, "out": None}, impl="reference")
    torch.testing.assert_close(state.double(), state64, atol=0.0, rtol=1e-5)


def test_triton_follows_strides():
    """Per-head A, dt, D, dt_bias expanded with stride 0 (as engines pass them), state slots padded in memory,
    x and z sliced out of a wider projection."""
    case = make_case(OP, rows=2, padded=0, shapes={"nheads": 4, "headdim": 3, "dstate": 6, "ngroups": 2})
    a = {k: v for k, v in case.args.items() if k not in ("state", "out")}
    assert all(0 in a[k].stride() for k in ("A", "dt", "D", "dt_bias"))
    N, nheads, headdim = a["x"].shape
    dstate = a["B"].shape[2]
    a["x"] = torch.randn(N, nheads, 2 * headdim)[..., :headdim]
    a["z"] = torch.randn(N, 2 * nheads, headdim)[:, nheads:]
    state = torch.randn(case.args["state"].shape[0], nheads, headdim, dstate + 2)[..., :dstate]
    ref_state = state.clone(memory_format=torch.contiguous_format)
    out = mamba2.selective_state_update(state, **a, impl="triton")
    dense = {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in a.items()}
    ref = mamba2.selective_state_update(ref_state, **dense, impl="reference")
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(state, ref_state)


def test_auto_is_reference_on_cpu():
    a = inputs(2)
    s1 = a.pop("state")
    s2 = s1.clone()
    a.pop("out")
    x = mamba2.selective_state_update(s1, **a, impl="auto")
    y = mamba2.selective_state_update(s2, **a, impl="reference")
    assert torch.equal(x, y) and torch.equal(s1, s2)


# --- custom op, validation, cost ------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_each_call_is_one_custom_op(impl):
    a = make_case(OP, rows=1, padded=1, convention="sglang").fresh().args
    with OpLog() as log:
        mamba2.selective_state_update(**a, impl=impl)
    assert log.ops == ["linattn.mamba2_selective_state_update.default"]


def test_custom_op_schema_declares_the_mutations():
    i = inputs(2)
    args = (i["state"], i["x"], i["dt"], i["A"], i["B"], i["C"], i["D"], i["z"], i["dt_bias"], True, i["state_indices"])
    op = torch.ops.linattn.mamba2_selective_state_update.default
    opcheck_mutations(op, (*args, -1, i["out"], None, False, "reference"))
    v = make_case(OP, "verify", rows=2, padded=0, convention="vllm").fresh().args
    args = (v["state"], v["x"], v["dt"], v["A"], v["B"], v["C"], v["D"], v["z"], v["dt_bias"], True, v["state_indices"])
    opcheck_mutations(op, (*args, 0, v["out"], v["intermediate_states"], True, "reference"))


BAD = [
    ("x", lambda i: i["x"][0], r"x must be \[N, nheads, headdim\]"),
    ("x", lambda i: i["x"].long(), r"x must be floating point"),
    ("state", lambda i: i["state"][:, :1], r"state must have shape \[5, 4, 6, 10\]"),
    ("state", lambda i: i["state"].half(), r"state must have dtype"),
    ("state", lambda i: i["state"][0], r"state must be a 4-D pool"),
    ("B", lambda i: torch.randn(3, 3, 10), r"nheads \(4\) must be a multiple of ngroups"),
    ("C", lambda i: torch.randn(3, 2, 9), r"C must have shape \[3, 2, 10\]"),
    ("dt", lambda i: torch.randn(3, 4), r"dt must have shape \[3, 4, 6\]"),
    ("A", lambda i: torch.randn(4, 6), r"A must have shape \[4, 6, 10\]"),
    ("D", lambda i: torch.randn(4), r"D must have shape \[4, 6\]"),
    ("z", lambda i: torch.randn(3, 4, 5), r"z must have shape \[3, 4, 6\]"),
    ("dt_bias", lambda i: torch.randn(6), r"dt_bias must have shape \[4, 6\]"),
    ("state_indices", lambda i: torch.tensor([0, 1]), r"state_indices must have shape \[3\]"),
    ("state_indices", lambda i: torch.tensor([0.0, 1.0, 2.0]), r"state_indices must have dtype"),
    ("out", lambda i: torch.empty(3, 4, 7), r"out must have shape \[3, 4, 6\]"),
    ("pad_slot_id", lambda i: 1.5, r"pad_slot_id must be an int or None"),
    ("impl", lambda i: "gpu", r"impl must be one of"),
]


@pytest.mark.parametrize("name,make,match", BAD, ids=[f"{b[0]}-{k}" for k, b in enumerate(BAD)])
def test_rejects_bad_inputs(name, make, match):
    kw = inputs(3, num_slots=5, nheads=4, headdim=6, dstate=10, ngroups=2)
    kw[name] = make(kw)
    with pytest.raises(ValueError, match=match):
        mamba2.selective_state_update(**kw)


def test_out_of_pool_slot_is_an_index_error_in_the_reference():
    a = inputs(2)
    a["state_indices"] = torch.tensor([a["state"].shape[0], 1])
    with pytest.raises(IndexError, match=rf"state_indices: row 0 has slot {a['state'].shape[0]}"):
        mamba2.selective_state_update(**a, impl="reference")


def test_cost():
    c = mamba2.selective_state_update_cost(
        2, 4, 8, 16, 1, torch.bfloat16, has_D=False, has_z=False, has_dt_bias=False, dt_softplus=False
    )
    state_bytes = 2 * (2 * 4 * 8 * 16 * 4)
    io_bytes = 2 * 4 * 8 * 2 * 2 + 2 * 4 * 2 + 2 * 2 * 16 * 2 + 4 * 4  # x+out, tied dt, B+C, tied A
    assert c == Cost(bytes=state_bytes + io_bytes, flops=7 * 2 * 4 * 8 * 16 + 2 * 4 * 8)
    untied = mamba2.selective_state_update_cost(2, 4, 8, 16, 1, torch.bfloat16, tied=False)
    assert untied.bytes > mamba2.selective_state_update_cost(2, 4, 8, 16, 1, torch.bfloat16).bytes


# --- verify: L steps with the state after each kept -----------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_verify_steps_are_successive_decode_steps(impl):
    """A verify of L = 3 steps against 3 decode calls on a copy of the pool: each step's output, the state after
    each step in ``intermediate_states``, and the pool bitwise unchanged under ``disable_state_update``."""
    case = make_case(OP, "verify", convention="sglang", rows=2, padded=1, shapes={"D": 3})
    call = case.fresh()
    a = call.args
    before = a["state"].clone()
    mamba2.selective_state_update(**a, impl=impl)
    assert torch.equal(a["state"], before)
    pool = before.double()
    live = [i for i, s in enumerate(a["state_indices"].tolist()) if s > a["pad_slot_id"]]
    for t in range(3):
        step = {k: a[k][:, t].double() for k in ("x", "dt", "B", "C", "z")}
        y = mamba2.selective_state_update(
            pool, **step, A=a["A"].double(), D=a["D"].double(), dt_bias=a["dt_bias"].double(), dt_softplus=True,
            state_indices=a["state_indices"], pad_slot_id=a["pad_slot_id"], impl="reference",
        )  # fmt: skip
        assert rel_err(a["out"][:, t], y) < 1e-4, t
        for n in live:
            slot = int(a["state_indices"][n])
            assert rel_err(a["intermediate_states"][n, t], pool[slot]) < 1e-4, (t, n)
    assert a["intermediate_states"][2].isnan().all()  # the padded row's buffer: untouched
    assert (a["out"][2] == 0).all()


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda a: {"intermediate_states": a["intermediate_states"][:, :2]}, r"intermediate_states must have shape"),
        (
            lambda a: {k: a[k][:, 0] for k in ("x", "dt", "B", "C", "z", "out")},
            r"intermediate_states needs the step axis",
        ),
        (lambda a: {"B": a["B"][:, 0]}, r"B must be \[N, L, ngroups, dstate\]"),
    ],
    ids=["depth", "no-step-axis", "B-without-steps"],
)
def test_verify_rejects_bad_inputs(change, match):
    a = make_case(OP, "verify", convention="vllm", rows=2, padded=0).fresh().args
    a.update(change(a))
    with pytest.raises(ValueError, match=rf"mamba2.selective_state_update: {match}"):
        mamba2.selective_state_update(**a, impl="reference")
