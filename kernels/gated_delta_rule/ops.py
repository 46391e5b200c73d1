"""Public gated-delta-rule ops: validation, `torch.library.custom_op` registration, dispatch.

Each op's core is registered in the "linattn" namespace (`torch.ops.linattn.gdn_recurrent`, ...), mutating
its state / out / intermediate buffers and returning None. A TorchDispatchMode (the workbench's CPU graph
recorder) therefore sees one op per kernel call, and the host reads inside the torch reference never
reach it. The public functions below validate (shapes, dtypes, devices always; values only for CPU
tensors and outside a TorchDispatchMode, so that nothing here syncs with an accelerator or shows up in a
recording), allocate `out` when not given, call the op and return `out`.
"""

from __future__ import annotations

import torch

from kernels.checks import ArgChecker, value_checks
from kernels.conventions import DEFAULT_STATE_LAYOUT, state_dims
from kernels.dispatch import call_op, implementation, inplace_custom_op
from kernels.dtypes import FLOAT_DTYPES, INDEX_DTYPES, compute_dtype
from kernels.gated_delta_rule import reference as ref
from kernels.padding import skipped_rows

# Tokens per chunk of `chunked`: the Triton kernel keeps [C, C] and [C, K] tiles in registers; at C=64 with
# K=V=128 it spills about 41 KB per thread on sm_90, at C=16 about 0.4 KB (see triton_chunked.DEFAULT_NUM_WARPS).
DEFAULT_CHUNK_SIZE = 16

# ----------------------------------------------------------------------------------------------- checks


def _check_qkv(check: ArgChecker, q, k, v) -> tuple[int, int, int, int, int]:
    """Returns (T, H, K, HV, V)."""
    check.leading("q", q, "[T, H, K]", 3)
    T, H, K = q.shape
    check.tensor("k", k, (T, H, K), FLOAT_DTYPES, q.device)
    check.layout("v", v, f"[T={T}, HV, V]", 3, length=T)
    HV, V = v.shape[1], v.shape[2]
    if H == 0 or K == 0 or V == 0 or HV % H != 0:
        check.fail(
            f"v: value heads HV={HV} must be a positive multiple of q/k heads H={H} (GVA), "
            f"with K={K} and V={V} positive"
        )
    check.tensor("v", v, (T, HV, V), FLOAT_DTYPES, q.device)
    return T, H, K, HV, V


def _state_dims(HV: int, K: int, V: int) -> list[tuple[str, int | None]]:
    """A pool's dims as ``ArgChecker.states`` takes them (k_first order)."""
    return [("slots", None), ("HV", HV), ("K", K), ("V", V)]


def _check_intermediate(
    check: ArgChecker,
    inter,
    N: int,
    HV: int,
    K: int,
    V: int,
    cu_seqlens: torch.Tensor,
    dev: torch.device,
    layout: str,
) -> None:
    dims = [("N", N), ("D", None), ("HV", HV), ("K", K), ("V", V)]
    check.states("intermediate_states", inter, dims, layout, FLOAT_DTYPES, dev)
    if value_checks(dev) and N > 0:
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        D = inter.shape[1]
        for n, length in enumerate(lengths):
            if length > D:
                check.fail(
                    f"intermediate_states: depth D={D} < length {length} of row {n}; D must be >= every row's length"
                )


def _check_tree(
    check: ArgChecker,
    parents,
    N: int,
    inter: torch.Tensor | None,
    disable_state_update: bool,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    pad_slot_id: int | None,
    dev: torch.device,
) -> None:
    """``retrieve_parent_token`` [N, D'] of a tree verify (``ArgChecker.tree``); where values may be read,
    D' >= every row's length and each processed row's parents in ``0..t-1`` (``ArgChecker.tree_values``)."""
    parents = check.tree(
        parents, N, None, intermediate="intermediate_states", has_intermediate=inter is not None,
        disable_state_update=disable_state_update, dev=dev,
    )  # fmt: skip
    if value_checks(dev):
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        check.tree_values(parents, lengths, skipped_rows(state_indices, pad_slot_id).tolist())


def _resolve_scale(check: ArgChecker, scale: float | None, K: int) -> float:
    if scale is None:
        return K**-0.5
    if not isinstance(scale, (int, float)) or scale != scale or abs(scale) == float("inf"):
        check.fail(f"scale: expected a finite float, got {scale!r}")
    return float(scale)


def _check_triton_dtypes(check: ArgChecker, state: torch.Tensor, inter: torch.Tensor | None) -> None:
    if state.dtype != torch.float32:
        check.fail(f"state: impl='triton' keeps float32 state pools, got {state.dtype}")
    if inter is not None and inter.dtype != torch.float32:
        check.fail(f"intermediate_states: impl='triton' writes float32, got {inter.dtype}")


def _validate(
    check: ArgChecker,
    *,
    q,
    k,
    v,
    gates: dict[str, torch.Tensor],
    state,
    state_layout,
    state_indices,
    cu_seqlens,
    has_initial_state,
    intermediate_states,
    pad_slot_id,
    scale,
    impl,
    gk=None,
    retrieve_parent_token=None,
    disable_state_update=False,
):
    """Validation shared by recurrent / chunked; gates: the [T, HV] inputs by name (g and beta, a and b, or
    beta alone beside the per-channel gate gk [T, HV, K]). Returns (T, HV, V, scale, impl)."""
    T, H, K, HV, V = _check_qkv(check, q, k, v)
    dev = q.device
    for name, t in gates.items():
        check.tensor(name, t, (T, HV), FLOAT_DTYPES, dev)
    if gk is not None:
        check.tensor("gk", gk, (T, HV, K), FLOAT_DTYPES, dev)
    layout = check.state_layout(state_layout)
    check.states("state", state, _state_dims(HV, K, V), layout, FLOAT_DTYPES, dev)
    N = check.varlen_rows(
        state, "[num_slots, HV, *state_dims]", state.shape[1:], state_indices, cu_seqlens, has_initial_state, T,
        pad_slot_id, dev,
    )  # fmt: skip
    if intermediate_states is not None:
        _check_intermediate(check, intermediate_states, N, HV, K, V, cu_seqlens, dev, layout)
    if retrieve_parent_token is not None:
        _check_tree(
            check, retrieve_parent_token, N, intermediate_states, disable_state_update, state_indices, cu_seqlens,
            pad_slot_id, dev,
        )  # fmt: skip
    scale = _resolve_scale(check, scale, K)
    impl = check.impl(impl, dev)
    if impl == "triton":
        _check_triton_dtypes(check, state, intermediate_states)
    return T, HV, V, scale, impl


_RAW_GATING = ("a", "b", "A_log", "dt_bias")


def _per_channel_gate_inputs(check: ArgChecker, g, beta, raw: dict[str, object]) -> dict[str, torch.Tensor]:
    """The per-channel gate ``gk`` was given: it replaces the scalar ``g`` and the engine's raw gating inputs
    (which make a scalar gate), and comes with ``beta``. Returns ``{"beta": beta}``."""
    if g is not None:
        check.fail("gk: give the per-channel gate gk or the scalar gate g, not both")
    given = [n for n in _RAW_GATING if raw[n] is not None]
    if given:
        check.fail(
            f"gk: the per-channel gate gk takes beta, not the raw gating inputs (a, b, A_log, dt_bias make a "
            f"scalar gate); got gk and {', '.join(given)}"
        )
    if beta is None:
        check.fail("beta: missing; gk and beta come together")
    return {"beta": beta}


def _gate_inputs(check: ArgChecker, g, beta, a, b, A_log, dt_bias, gk=None) -> dict[str, torch.Tensor]:
    """Which gating the caller chose: ``g`` and ``beta`` given, the engine's raw inputs ``a``, ``b``,
    ``A_log``, ``dt_bias`` (all four), or the per-channel ``gk`` and ``beta``, never a mix. Returns the [T, HV]
    inputs by name (``gk`` is checked apart)."""
    if gk is not None:
        return _per_channel_gate_inputs(check, g, beta, {"a": a, "b": b, "A_log": A_log, "dt_bias": dt_bias})
    given = {
        n: t is not None
        for n, t in (("g", g), ("beta", beta), ("a", a), ("b", b), ("A_log", A_log), ("dt_bias", dt_bias))
    }
    explicit = given["g"] or given["beta"]
    raw = [n for n in ("a", "b", "A_log", "dt_bias") if given[n]]
    if explicit and raw:
        check.fail(f"gating: give either g and beta, or a, b, A_log and dt_bias; got g/beta and {', '.join(raw)}")
    if explicit:
        if not (given["g"] and given["beta"]):
            check.fail(f"{'beta' if given['g'] else 'g'}: missing; g and beta come together")
        return {"g": g, "beta": beta}
    if len(raw) != 4:
        missing = [n for n in ("a", "b", "A_log", "dt_bias") if not given[n]]
        check.fail(f"gating: g and beta not given, so a, b, A_log and dt_bias are needed; missing {', '.join(missing)}")
    return {"a": a, "b": b}


def _out_and_inputs(check: ArgChecker, out: torch.Tensor | None, q, k, v, T: int, HV: int, V: int):
    """`out` (allocated like v when None, else checked) and q, k, v with a contiguous last dim, as the
    kernels read them. Returns (out, q, k, v)."""
    if out is None:
        out = torch.empty((T, HV, V), dtype=v.dtype, device=v.device)
    else:
        check.tensor("out", out, (T, HV, V), (v.dtype,), v.device)
        if out.stride(-1) != 1 and V > 1:
            check.fail(f"out: the last dim must be contiguous, got strides {out.stride()}")
    return out, _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v)


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


# ------------------------------------------------------------------------------------------ custom ops


def _recurrent_reference(
    *,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor | None,
    a: torch.Tensor | None,
    b: torch.Tensor | None,
    A_log: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    softplus_beta: float,
    softplus_threshold: float,
    **rest,
) -> None:
    """The reference path of gdn_recurrent: the engine gating (if asked for) by ``reference.gating`` in the
    arithmetic dtype, then ``reference.recurrent_reference`` (which takes ``gk`` in ``rest`` as it is)."""
    if A_log is None:
        if (g is None and rest.get("gk") is None) or beta is None:
            raise ValueError("gdn_recurrent: g (or gk) and beta are needed when A_log is not given")
    else:
        if a is None or b is None or dt_bias is None:
            raise ValueError("gdn_recurrent: the engine gating (A_log given) needs a, b and dt_bias")
        g, beta = ref.gating(
            a,
            b,
            A_log,
            dt_bias,
            softplus_beta=softplus_beta,
            softplus_threshold=softplus_threshold,
            dtype=compute_dtype(q, k, v, a, b, rest["state"]),
        )
    ref.recurrent_reference(q=q, k=k, v=v, g=g, beta=beta, **rest)


@inplace_custom_op("linattn::gdn_recurrent", mutates_args=("state", "out", "intermediate_states"))
def _gdn_recurrent_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor | None,
    a: torch.Tensor | None,
    b: torch.Tensor | None,
    A_log: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    gk: torch.Tensor | None,
    state: torch.Tensor,
    state_layout: str,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    out: torch.Tensor,
    intermediate_states: torch.Tensor | None,
    has_initial_state: torch.Tensor | None,
    scale: float,
    use_qk_l2norm: bool,
    disable_state_update: bool,
    pad_slot_id: int | None,
    softplus_beta: float,
    softplus_threshold: float,
    impl: str,
    retrieve_parent_token: torch.Tensor | None = None,  # last, with a default: positional callers keep working
) -> None:
    run = implementation(
        impl,
        reference=_recurrent_reference,
        triton="kernels.gated_delta_rule.triton_recurrent:launch_recurrent",
    )
    run(
        q=q,
        k=k,
        v=v,
        g=g,
        beta=beta,
        a=a,
        b=b,
        A_log=A_log,
        dt_bias=dt_bias,
        gk=gk,
        softplus_beta=softplus_beta,
        softplus_threshold=softplus_threshold,
        state=state,
        state_layout=state_layout,
        state_indices=state_indices,
        cu_seqlens=cu_seqlens,
        out=out,
        intermediate_states=intermediate_states,
        retrieve_parent_token=retrieve_parent_token,
        has_initial_state=has_initial_state,
        scale=scale,
        use_qk_l2norm=use_qk_l2norm,
        disable_state_update=disable_state_update,
        pad_slot_id=pad_slot_id,
    )


@inplace_custom_op("linattn::gdn_chunked", mutates_args=("state", "out"))
def _gdn_chunked_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor,
    gk: torch.Tensor | None,
    state: torch.Tensor,
    state_layout: str,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    out: torch.Tensor,
    has_initial_state: torch.Tensor | None,
    scale: float,
    use_qk_l2norm: bool,
    disable_state_update: bool,
    pad_slot_id: int | None,
    chunk_size: int,
    impl: str,
) -> None:
    run = implementation(
        impl, reference=ref.chunked_reference, triton="kernels.gated_delta_rule.triton_chunked:launch_chunked"
    )
    run(
        q=q,
        k=k,
        v=v,
        g=g,
        beta=beta,
        gk=gk,
        state=state,
        state_layout=state_layout,
        state_indices=state_indices,
        cu_seqlens=cu_seqlens,
        out=out,
        scale=scale,
        use_qk_l2norm=use_qk_l2norm,
        has_initial_state=has_initial_state,
        disable_state_update=disable_state_update,
        pad_slot_id=pad_slot_id,
        chunk_size=chunk_size,
    )


@inplace_custom_op("linattn::gdn_scatter_accepted", mutates_args=("state",))
def _gdn_scatter_accepted_op(
    state: torch.Tensor,
    state_layout: str,
    intermediate_states: torch.Tensor,
    state_indices: torch.Tensor,
    num_accepted: torch.Tensor | None,
    pad_slot_id: int | None,
    impl: str,
    accepted_steps: torch.Tensor | None = None,  # instead of num_accepted; last: positional callers keep working
) -> None:
    run = implementation(
        impl,
        reference=ref.scatter_accepted_reference,
        triton="kernels.gated_delta_rule.triton_recurrent:launch_scatter_accepted",
    )
    run(
        state=state,
        state_layout=state_layout,
        intermediate_states=intermediate_states,
        state_indices=state_indices,
        num_accepted=num_accepted,
        accepted_steps=accepted_steps,
        pad_slot_id=pad_slot_id,
    )


# --------------------------------------------------------------------------------------- public API


def recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    *,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_layout: str = DEFAULT_STATE_LAYOUT,
    gk: torch.Tensor | None = None,
    a: torch.Tensor | None = None,
    b: torch.Tensor | None = None,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
    has_initial_state: torch.Tensor | None = None,
    intermediate_states: torch.Tensor | None = None,
    disable_state_update: bool = False,
    pad_slot_id: int | None = -1,
    out: torch.Tensor | None = None,
    retrieve_parent_token: torch.Tensor | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """Gated delta rule, token by token, over a pool of states (decode, target-verify, short extends).

    The gates come either ready (``g``, ``beta``) or as the engine's raw inputs, gated inside the op
    (``a``, ``b``, ``A_log``, ``dt_bias``: ``g = -exp(A_log) * softplus(a + dt_bias)`` with torch's
    softplus(beta=softplus_beta, threshold=softplus_threshold), ``beta = sigmoid(b)``), never both.
    Kimi Delta Attention (KDA) gates each key channel apart: ``gk`` [T, HV, K] (log space) with ``beta``,
    instead of ``g`` and of the raw inputs; the decay scales row c of the K x V state by ``exp(gk[c])``.

    Args:
        q, k: [T, H, K] float; v: [T, HV, V] float (HV % H == 0; value head h reads q/k head h // (HV/H)).
        g: [T, HV] log-decay; beta: [T, HV] write strength (float, usually float32).
        gk: [T, HV, K] per-key-channel log-decay (KDA; instead of g). A gk whose K entries equal g is g.
        a, b: [T, HV] gate logits; A_log, dt_bias: [HV] float (instead of g and beta).
        state: [num_slots, HV, K, V] pool (state_layout "k_first") or [num_slots, HV, V, K] ("v_first", as
            the released engines' pools), float32 (float64 allowed for impl="reference").
            Row n starts from state[state_indices[n]] and writes its final state back there.
        state_indices: [N] int32/int64 slot per row. cu_seqlens: [N+1] int32/int64 token offsets.
        scale: multiplies q; default K ** -0.5. use_qk_l2norm: q, k <- x / sqrt(sum x^2 + 1e-6) first.
        has_initial_state: optional [N] bool; False rows start from zeros instead of their slot.
        state_layout: "k_first" | "v_first" (kernels.conventions.STATE_LAYOUTS): how `state` and
            `intermediate_states` lay out a head's state; both the same.
        intermediate_states: optional [N, D, HV, K, V] (v_first: [N, D, HV, V, K]); the state after step t
            of row n goes to [n, t] (batch row, not slot). D must be >= every row's length.
        disable_state_update: leave the pool untouched (target-verify; see scatter_accepted).
        retrieve_parent_token: optional [N, D'] int32/int64 (D' >= every row's length): a tree verify (sglang's
            topk > 1 drafts). Row n's tokens are the nodes of a draft tree in topological order; node t >= 1
            starts from the state after node ``retrieve_parent_token[n, t]`` (in 0..t-1), read back from
            ``intermediate_states[n, parent]``; node 0 starts from the slot (``[n, 0]`` is ignored). The state
            after node t goes to ``intermediate_states[n, t]`` and token t's output is computed from it.
            Needs ``intermediate_states`` and ``disable_state_update=True`` (the last node is a leaf of one
            branch, not a final state: commit with ``scatter_accepted(accepted_steps=)``). A chain
            (``parent[t] = t - 1``) gives the chain verify's results bit for bit. Parents are range-checked
            on CPU tensors only (like the other value checks); on a device an out-of-range parent reads zeros.
        pad_slot_id: rows with state_indices <= pad_slot_id are skipped (no state read or write, zero
            outputs); None processes every row (see kernels/padding.py).
        out: optional [T, HV, V] buffer of v's dtype, fully overwritten (tokens of skipped rows and
            tokens past cu_seqlens[-1], e.g. a graph bucket's padding, get zeros). impl: "auto"|"reference"|"triton".

    Returns:
        out [T, HV, V], dtype of v. Zero-length rows write nothing;
        rows sharing a slot give undefined results.
    """
    check = ArgChecker("gated_delta_rule.recurrent", device_of="q")
    gates = _gate_inputs(check, g, beta, a, b, A_log, dt_bias, gk)
    T, HV, V, scale, impl = _validate(
        check,
        q=q,
        k=k,
        v=v,
        gates=gates,
        state=state,
        state_layout=state_layout,
        state_indices=state_indices,
        cu_seqlens=cu_seqlens,
        has_initial_state=has_initial_state,
        intermediate_states=intermediate_states,
        pad_slot_id=pad_slot_id,
        scale=scale,
        impl=impl,
        gk=gk,
        retrieve_parent_token=retrieve_parent_token,
        disable_state_update=disable_state_update,
    )
    if A_log is not None:  # then dt_bias is given too (_gate_inputs)
        A_log = check.tensor("A_log", A_log, (HV,), FLOAT_DTYPES, q.device).contiguous()
        dt_bias = check.tensor("dt_bias", dt_bias, (HV,), FLOAT_DTYPES, q.device).contiguous()
        for name, x in (("softplus_beta", softplus_beta), ("softplus_threshold", softplus_threshold)):
            if not isinstance(x, (int, float)) or not x > 0 or x == float("inf"):
                check.fail(f"{name}: expected a finite positive float, got {x!r}")
    out, q, k, v = _out_and_inputs(check, out, q, k, v, T, HV, V)
    call_op(
        _gdn_recurrent_op,
        q=q,
        k=k,
        v=v,
        g=g,
        beta=beta,
        a=a,
        b=b,
        A_log=A_log,
        dt_bias=dt_bias,
        gk=None if gk is None else _last_dim_contiguous(gk),
        state=state,
        state_layout=state_layout,
        state_indices=state_indices,
        cu_seqlens=cu_seqlens,
        out=out,
        intermediate_states=intermediate_states,
        retrieve_parent_token=retrieve_parent_token,
        has_initial_state=has_initial_state,
        scale=scale,
        use_qk_l2norm=bool(use_qk_l2norm),
        disable_state_update=bool(disable_state_update),
        pad_slot_id=pad_slot_id,
        softplus_beta=float(softplus_beta),
        softplus_threshold=float(softplus_threshold),
        impl=impl,
    )
    return out


def chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    *,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_layout: str = DEFAULT_STATE_LAYOUT,
    gk: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
    has_initial_state: torch.Tensor | None = None,
    intermediate_states: torch.Tensor | None = None,
    disable_state_update: bool = False,
    pad_slot_id: int | None = -1,
    out: torch.Tensor | None = None,
    impl: str = "auto",
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> torch.Tensor:
    """Varlen prefill by the chunked (WY / UT-transform) algorithm; same semantics as `recurrent` (with
    ready gates: ``g`` and ``beta``, or KDA's per-channel ``gk`` [T, HV, K] and ``beta``; no raw gating).

    `state` is laid out as `state_layout` says (see `recurrent`). Chunks of `chunk_size` tokens restart at
    every sequence's first token. `intermediate_states` is not
    supported (use `recurrent` for target-verify). impl="triton" needs chunk_size a power of two >= 16.
    """
    check = ArgChecker("gated_delta_rule.chunked", device_of="q")
    if intermediate_states is not None:
        check.fail(
            "intermediate_states: not supported by chunked(); per-token states are a target-verify "
            "feature, use recurrent() for it"
        )
    if not isinstance(chunk_size, int) or chunk_size < 1:
        check.fail(f"chunk_size: expected a positive int, got {chunk_size!r}")
    if gk is None and (g is None or beta is None):
        check.fail(f"{'g' if g is None else 'beta'}: missing; chunked() takes g and beta, or gk and beta")
    gates = _gate_inputs(check, g, beta, None, None, None, None, gk)
    T, HV, V, scale, impl = _validate(
        check,
        q=q,
        k=k,
        v=v,
        gates=gates,
        state=state,
        state_layout=state_layout,
        state_indices=state_indices,
        cu_seqlens=cu_seqlens,
        has_initial_state=has_initial_state,
        intermediate_states=None,
        pad_slot_id=pad_slot_id,
        scale=scale,
        impl=impl,
        gk=gk,
    )
    if impl == "triton" and (chunk_size < 16 or chunk_size & (chunk_size - 1)):
        check.fail(f"chunk_size: impl='triton' needs a power of two >= 16 (tl.dot), got {chunk_size}")
    out, q, k, v = _out_and_inputs(check, out, q, k, v, T, HV, V)
    call_op(
        _gdn_chunked_op,
        q=q,
        k=k,
        v=v,
        g=g,
        beta=gates["beta"],
        gk=None if gk is None else _last_dim_contiguous(gk),
        state=state,
        state_layout=state_layout,
        state_indices=state_indices,
        cu_seqlens=cu_seqlens,
        out=out,
        has_initial_state=has_initial_state,
        scale=scale,
        use_qk_l2norm=bool(use_qk_l2norm),
        disable_state_update=bool(disable_state_update),
        pad_slot_id=pad_slot_id,
        chunk_size=chunk_size,
        impl=impl,
    )
    return out


def scatter_accepted(
    state: torch.Tensor,
    intermediate_states: torch.Tensor,
    state_indices: torch.Tensor,
    num_accepted: torch.Tensor | None = None,
    *,
    accepted_steps: torch.Tensor | None = None,
    state_layout: str = DEFAULT_STATE_LAYOUT,
    pad_slot_id: int | None = -1,
    impl: str = "auto",
) -> None:
    """After target-verify: state[state_indices[n]] = intermediate_states[n, step[n]], live rows, where step[n]
    is ``num_accepted[n] - 1`` (a chain verify: the last accepted token) or ``accepted_steps[n]`` (any node:
    the accepted leaf of a tree verify, sglang's ``last_correct_step_indices``). Give exactly one of the two.

    Args:
        state: [num_slots, HV, K, V]; intermediate_states: [N, D, HV, K, V] (batch-row indexed), both laid out
            as `state_layout` says ("v_first": [num_slots, HV, V, K] and [N, D, HV, V, K]): the same layout,
            as `recurrent` wrote the intermediate states. A slot is copied whole, so the op needs the layout
            for the shapes only; a buffer in the other layout is refused where K != V and copied transposed
            where K == V.
        state_indices: [N] int.
        num_accepted: [N] int, in 1..D for live rows (padded rows: any value).
        accepted_steps: [N] int, in 0..D-1 for live rows (padded rows: any value): the step (a tree's node id)
            whose state each row commits.
        pad_slot_id: padding rule of kernels/padding.py.

    num_accepted / accepted_steps are range-checked (ValueError naming the row) only for CPU tensors (and
    not under a TorchDispatchMode, see `kernels.checks.value_checks`): on an accelerator the
    check would need a host read, so there the triton kernel writes nothing for an out-of-range row and
    the reference (boolean-mask selection, one host sync) raises an indexing error.
    """
    check = ArgChecker("gated_delta_rule.scatter_accepted", device_of="intermediate_states")
    layout = check.state_layout(state_layout)
    check.leading("intermediate_states", intermediate_states, "[N, D, HV, K, V]", 5)
    dev = intermediate_states.device
    N, D, HV = intermediate_states.shape[:3]
    K, V = state_dims(layout, *intermediate_states.shape[3:])  # (K, V) read back from the layout's order
    check.states("state", state, _state_dims(HV, K, V), layout, FLOAT_DTYPES, dev)
    check.tensor("state_indices", state_indices, (N,), INDEX_DTYPES, dev)
    if (num_accepted is None) == (accepted_steps is None):
        got = "both" if num_accepted is not None else "neither"
        check.fail(
            f"accepted_steps: give num_accepted (a chain) or accepted_steps (any step, a tree's node), got {got}"
        )
    name, picked = ("num_accepted", num_accepted) if num_accepted is not None else ("accepted_steps", accepted_steps)
    picked = check.tensor(name, picked, (N,), INDEX_DTYPES, dev)
    impl = check.impl(impl, dev)
    if impl == "triton":
        _check_triton_dtypes(check, state, intermediate_states)
        for what, t in (("state", state), ("intermediate_states", intermediate_states)):
            if t.stride(-1) != 1 or t.stride(-2) != t.shape[-1]:
                check.fail(f"{what}: impl='triton' needs contiguous last two (K, V) dims, got strides {t.stride()}")
    if value_checks(dev):
        num_slots = state.shape[0]
        lo, hi = (1, D) if name == "num_accepted" else (0, D - 1)  # steps num_accepted - 1, or the step itself
        skipped = skipped_rows(state_indices, pad_slot_id).tolist()
        rows = zip(state_indices.tolist(), picked.tolist(), skipped, strict=True)
        for n, (slot, acc, skip) in enumerate(rows):
            if skip:
                continue
            if not lo <= acc <= hi:
                check.fail(
                    f"{name}: row {n} has {acc}, must be in {lo}..{'D' if hi == D else 'D-1'}={hi} for a live row"
                )
            if not 0 <= slot < num_slots:
                check.fail(f"state_indices: row {n} has slot {slot}, outside [0, {num_slots})")
    call_op(
        _gdn_scatter_accepted_op,
        state=state,
        state_layout=layout,
        intermediate_states=intermediate_states,
        state_indices=state_indices,
        num_accepted=num_accepted,
        accepted_steps=accepted_steps,
        pad_slot_id=pad_slot_id,
        impl=impl,
    )
