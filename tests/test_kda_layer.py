"""Issue 31: the Kimi Delta Attention layer (``workbench.layers.KDALayer``, ``"kda"``) end to end.

Its steps against a KDA layer written out here from its definition in float64 (projections, the q/k/v short
conv, the per-channel gate, the delta rule token by token, the sigmoid-gated norm), on fresh random inputs and
a random pool (never zeros), in every mode and both state layouts, K != V; every slot but the live rows' (and
the dummy slot) bitwise untouched; a capture's replay bitwise equal to the eager step; ``workbench trace run
--layer kda`` clean through the command line, with speculation and with each prefix cache.
"""

import _cli_run
import pytest
import torch
import torch.nn.functional as F

from kernels.conventions import to_layout
from workbench import Batch, StatePool
from workbench.layer_names import KDA
from workbench.layers import LAYERS, KDAConfig, KDALayer, float64_reference, make_layer
from workbench.runner import GraphRunner

D = 3
SLOTS = 14
BUCKETS = [1, 2, 4]


# -- KDA from its definition --------------------------------------------------------------------------------
def naive_rows(layer, x, conv, ssm, rows):
    """The layer's step in float64, one row and one token at a time. ``rows``: ``(slot, first token, tokens,
    fresh)`` per live row; ``conv`` ``[slots, conv_dim, W-1]`` and ``ssm`` ``[slots, HV, K, V]`` (K-first) are
    updated in place for each row. Returns the outputs ``[T, hidden]`` (zeros for tokens of no row) and the
    K-first state after each token, by token."""
    c, w = layer.config, {k: v.double() for k, v in layer.weights.items()}
    H, HV, K, V = c.num_k_heads, c.num_v_heads, c.head_k_dim, c.head_v_dim
    x = x.double()
    out = torch.zeros(x.shape[0], c.hidden_size, dtype=torch.float64)
    after = {}
    for slot, bos, n, fresh in rows:
        window = torch.zeros_like(conv[slot]) if fresh else conv[slot].clone()
        S = torch.zeros_like(ssm[slot]) if fresh else ssm[slot].clone()
        for t in range(bos, bos + n):
            xt = x[t]
            proj = xt @ w["w_qkvz"]
            mixed, z = proj[: c.conv_dim], proj[c.conv_dim :]
            full = torch.cat([window, mixed[:, None]], dim=1)  # [conv_dim, W]: the window, then this token
            conv_out = F.silu((full * w["conv_w"]).sum(1) + w["conv_b"])
            window = full[:, 1:]
            q = conv_out[: H * K].view(H, K)
            k = conv_out[H * K : 2 * H * K].view(H, K)
            v = conv_out[2 * H * K :].view(HV, V)
            f = (xt @ w["w_fa"] @ w["w_fb"]).view(HV, K)
            gk = -torch.exp(w["A_log"])[:, None] * F.softplus(f + w["dt_bias"].view(HV, K))
            beta = torch.sigmoid(xt @ w["w_b"])
            o = torch.empty(HV, V, dtype=torch.float64)
            for h in range(HV):
                qh, kh = q[h // (HV // H)], k[h // (HV // H)]
                qh = qh / torch.sqrt((qh * qh).sum() + 1e-6)
                kh = kh / torch.sqrt((kh * kh).sum() + 1e-6)
                S[h] = S[h] * torch.exp(gk[h])[:, None]  # row c of the K x V state decays by exp(gk[h, c])
                S[h] = S[h] + beta[h] * torch.outer(kh, v[h] - kh @ S[h])
                o[h] = (qh * K**-0.5) @ S[h]
            normed = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + c.rms_eps)
            out[t] = (normed * w["norm_w"] * torch.sigmoid(z.view(HV, V))).reshape(-1) @ w["w_out"]
            after[t] = (window.clone(), S.clone())
        conv[slot], ssm[slot] = window, S
    return out, after


def _layer(layout, impl="reference", seed=3):
    return make_layer(KDA, seed=seed, impl=impl, state_layout=layout)


def _runner(layer, profile="sglang"):
    pool = StatePool(SLOTS, profile, slots_per_request=D if profile == "vllm" else 1)
    state = layer.new_state(SLOTS, seed=7)  # random, never zeros: a lost or foreign write shows
    return GraphRunner(layer, pool, buckets=BUCKETS, draft_tokens=D, backend="cpu", state=state)


def _k_first(runner):
    return runner.state.conv.double(), to_layout(runner.state.ssm, runner.layer.state_layout, "k_first").double()


def _untouched_but(before, runner, slots):
    """Every slot of the pool but ``slots`` and the dummy slot holds its bytes of before."""
    keep = [s for s in range(SLOTS) if s not in set(slots) | {runner.pool.profile.dummy_slot}]
    for name, t in runner.state.tensors().items():
        assert torch.equal(t[keep], before.tensors()[name][keep]), f"{name}: a slot not the step's changed"


TOL = {"atol": 2e-4, "rtol": 2e-3}


@pytest.mark.parametrize("layout", ["k_first", "v_first"])
@pytest.mark.parametrize("mode", ["decode", "extend", "target_verify"])
def test_each_mode_is_kda_from_its_definition(mode, layout):
    """Decode (3 rows replayed in the bucket of 4: one padded row), extend (a fresh row, two continuing: the
    recurrence with has_initial_state), verify (replayed, then sglang's accept of 3, 1, 2 drafts)."""
    layer = _layer(layout)
    runner = _runner(layer)
    runner.capture(progress=False)
    rows = runner.pool.alloc(3)
    slots = [int(s) for s in runner.pool.mapping[rows, 0]]
    conv0, ssm0 = _k_first(runner)
    before = runner.state.clone()
    g = torch.Generator().manual_seed(11)
    if mode == "decode":
        x = torch.randn(3, 32, generator=g)
        got = runner.replay(Batch.decode(rows, [5, 9, 3]), x)
        assert got.replayed and got.bucket == 4
        spans = [(s, i, 1, False) for i, s in enumerate(slots)]
    elif mode == "extend":
        lens, prefix = [4, 1, 5], [0, 6, 2]
        x = torch.randn(sum(lens), 32, generator=g)
        got = runner.eager(Batch.extend(rows, lens, prefix), x)
        starts = [0, 4, 5]
        spans = [(s, b, n, p == 0) for s, b, n, p in zip(slots, starts, lens, prefix, strict=True)]
    else:
        x = torch.randn(3 * D, 32, generator=g)
        got = runner.replay(Batch.target_verify(rows, [5, 9, 3], D), x)
        assert got.replayed
        spans = [(s, i * D, D, False) for i, s in enumerate(slots)]
    conv, ssm = conv0.clone(), ssm0.clone()
    want, after = naive_rows(layer, x, conv, ssm, spans)
    torch.testing.assert_close(got.output.double()[: x.shape[0]], want, **TOL)
    if mode == "target_verify":
        _untouched_but(before, runner, [])  # a verify writes its buffers only, until the accept
        accepted = [3, 1, 2]
        runner.accept(torch.tensor(accepted))
        for i, (s, a) in enumerate(zip(slots, accepted, strict=True)):
            conv[s], ssm[s] = after[i * D + a - 1]
    got_conv, got_ssm = _k_first(runner)
    torch.testing.assert_close(got_ssm[slots], ssm[slots], **TOL)
    torch.testing.assert_close(got_conv[slots], conv[slots], **TOL)
    _untouched_but(before, runner, slots)


@pytest.mark.parametrize("mode", ["decode", "extend"])
def test_the_triton_kernels_run_the_same_kda_step(mode):
    """The layer with ``impl="triton"`` (the interpreter) on the V-first pool: the same outputs and states."""
    layer = _layer("v_first", impl="triton")
    runner = _runner(layer)
    rows = runner.pool.alloc(2)
    slots = [int(s) for s in runner.pool.mapping[rows, 0]]
    conv, ssm = _k_first(runner)
    g = torch.Generator().manual_seed(5)
    if mode == "decode":
        x = torch.randn(2, 32, generator=g)
        got = runner.eager(Batch.decode(rows, [4, 7]), x).output
        spans = [(s, i, 1, False) for i, s in enumerate(slots)]
    else:
        x = torch.randn(5, 32, generator=g)
        got = runner.eager(Batch.extend(rows, [2, 3], [0, 3]), x).output
        spans = [(slots[0], 0, 2, True), (slots[1], 2, 3, False)]
    want, _ = naive_rows(layer, x, conv, ssm, spans)
    torch.testing.assert_close(got.double(), want, **TOL)
    got_conv, got_ssm = _k_first(runner)
    torch.testing.assert_close(got_ssm[slots], ssm[slots], **TOL)
    torch.testing.assert_close(got_conv[slots], conv[slots], **TOL)


@pytest.mark.parametrize("layout", ["k_first", "v_first"])
@pytest.mark.parametrize("profile", ["sglang", "sglang-ascend", "vllm"])
def test_a_capture_replays_its_eager_step_bitwise_and_holds_its_float64_reference(profile, layout):
    """``GraphRunner.compare``: the replay bitwise equal to the padded step run eagerly, the live rows near
    ``float64_reference(layer)``, padded outputs zero, no foreign slot written; decode then verify (vLLM's
    verify writes every draft position's slot)."""
    layer = _layer(layout)
    runner = _runner(layer, profile)
    runner.capture(progress=False)
    rows = runner.pool.alloc(3)
    g = torch.Generator().manual_seed(2)
    for batch, T in ((Batch.decode(rows, [4, 8, 6]), 3), (Batch.target_verify(rows, [4, 8, 6], D), 3 * D)):
        cmp = runner.compare(batch, torch.randn(T, 32, generator=g))
        assert cmp.replayed and cmp.bitwise_equal and cmp.integrity.ok, cmp.integrity


def test_the_float64_reference_is_a_kda_layer_on_the_reference_kernels():
    ref = float64_reference(_layer("v_first", impl="auto"))
    assert isinstance(ref, KDALayer) and ref.dtype == torch.float64 and ref.impl == "reference"
    assert ref.state_layout == "v_first" and all(w.dtype == torch.float64 for w in ref.weights.values())


def test_the_gate_is_per_key_channel_in_log_space():
    layer = _layer("k_first")
    gk, beta = layer.gates(torch.randn(6, 32, generator=torch.Generator().manual_seed(3)))
    c = layer.config
    assert gk.shape == (6, c.num_v_heads, c.head_k_dim) and beta.shape == (6, c.num_v_heads)
    assert (gk < 0).all() and ((beta > 0) & (beta < 1)).all()
    assert (gk.std(dim=-1) > 0).all()  # the channels of a head decay apart: not a scalar gate spread over K
    decay = gk.exp()
    assert decay.max() > 0.9 and decay.min() < 0.5  # some channels hold, others forget


def test_the_registry_entry_and_presets():
    spec = LAYERS[KDA]
    assert spec.layer_class is KDALayer and spec.presets == ("small", "quarter", "engine")
    assert spec.state_layouts == ("k_first", "v_first") and spec.chunk_grid == "sequence"
    small = KDAConfig.small()
    assert small.head_k_dim != small.head_v_dim and small.num_k_heads < small.num_v_heads
    assert spec.state_shapes("small", 5, "v_first") == ((5, small.conv_dim, 3), (5, 4, 12, 8))
    engine = spec.config("engine")
    assert (engine.hidden_size, engine.num_v_heads, engine.head_k_dim, engine.head_v_dim) == (2304, 32, 128, 128)
    assert 4 * spec.config("quarter").num_v_heads == engine.num_v_heads
    assert "per-channel gate" in repr(make_layer(KDA))


# -- the command line ---------------------------------------------------------------------------------------
@pytest.mark.slow  # 60-step traces with prefix caches through the CLI
@pytest.mark.parametrize(
    "args",
    [["--profile", "sglang", "--prefix-cache", "extra_buffer"], ["--profile", "vllm", "--prefix-cache", "align"]],
    ids=["sglang-extra_buffer", "vllm-align"],
)
def test_trace_run_with_kda_and_speculation_checks_clean(args):
    code, out, err = _cli_run.run(["trace", "run", "--layer", KDA, "--spec", "2", "--steps", "60", *args])
    assert code == 0, out + err
    assert out.startswith(f"OK: {args[1]} kda: 60 steps"), out
    assert "every request on its float64 recurrence, nothing foreign written" in out
    assert "verified against the float64 state of exactly their prefix" in out  # checkpoints checked


def test_the_replay_sweep_and_the_lab_run_kda():
    from workbench.sweeps.replay import sweep
    from workbench.widgets.lab_model import LabModel

    res = sweep([1, 2], layer=KDA, progress=False, min_run_time=0.01)
    assert res.records and all(r.median_us > 0 for r in res.records)
    lab = LabModel(layer=KDA, preset="small", backend="cpu", buckets="1, 2", profile="vllm", draft_tokens=2)
    assert lab.capture(), lab.error
    rep = lab.step(2, "target_verify", seed=1, time_it=False)
    assert rep is not None and rep.clean
