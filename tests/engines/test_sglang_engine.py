"""sglang 0.5.23's own metadata code (its adapter, ``get_adapter("sglang")`` of the engines' registry) against
the workbench profiles.

Needs the released engine (``make engines``); skipped visibly without it. The ``sg`` fixture is the adapter's
module, for its internals alone (``load_ascend``, ``_import``); adapters are built from the registry's class.
Every comparison uses fresh random batches from seeded pools that have seen frees, so live slots are scattered
and no value is left over from an earlier case.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest
import torch

from workbench import Batch, StatePool, build_metadata
from workbench.engines.registry import get_adapter
from workbench.engines.versions import installed_version
from workbench.traces.model import RECOMPUTE_FIELDS

ADAPTER = get_adapter("sglang")
pytestmark = [
    pytest.mark.engines,
    pytest.mark.skipif(
        installed_version("sglang") != ADAPTER.version,
        reason=f"sglang {ADAPTER.version} is not installed (found {installed_version('sglang')}); "
        "make engines installs it",
    ),
]

BUCKETS = [1, 2, 4, 8, 12, 16]
SEEDS = range(6)
MODES = ("decode", "target_verify", "idle")


@pytest.fixture(scope="module")
def sg():
    """The adapter's module, its engine imported: for the module's internals (the adapter: ``ADAPTER``)."""
    module = sys.modules[ADAPTER.__module__]
    module.load()
    return module


def scattered_pool(profile: str, seed: int, num_slots: int = 64) -> StatePool:
    """A pool with 20 live requests on scattered slots (40 allocated, 20 of them freed at random)."""
    gen = torch.Generator().manual_seed(seed)
    pool = StatePool(num_slots, profile)
    rows = pool.alloc(40)
    pool.free(rows[torch.randperm(40, generator=gen)[:20]])
    return pool


def random_batch(pool: StatePool, mode: str, rnd: random.Random, draft_tokens: int, max_rows: int = 16) -> Batch:
    """A fresh batch of ``mode``: 1..max_rows distinct live rows (idle: none)."""
    if mode == "idle":
        return Batch.idle()
    rows = rnd.sample(pool.live_rows, rnd.randint(1, max_rows))
    seq = [rnd.randint(1, 4000) for _ in rows]
    if mode == "decode":
        return Batch.decode(rows, seq)
    if mode == "target_verify":
        return Batch.target_verify(rows, seq, draft_tokens)
    ext = [rnd.randint(1, 300) for _ in rows]
    pre = [rnd.choice([0, rnd.randint(1, 5000)]) for _ in rows]
    return Batch.extend(rows, ext, pre)


def differences(engine, workbench, fields) -> dict[str, tuple]:
    """Field -> (engine's, workbench's) for every compared field whose dtype or values differ."""
    out = {}
    for name in fields:
        a, b = getattr(engine, name), getattr(workbench, name)
        if a is None or b is None:
            if a is not b:
                out[name] = (a, b)
        elif a.dtype != b.dtype or a.tolist() != b.tolist():
            out[name] = ((a.dtype, a.tolist()), (b.dtype, b.tolist()))
    return out


# -- the worked example and capture ------------------------------------------------------------------


@pytest.mark.parametrize("layer", ["gdn", "mamba2"])
def test_decode_five_of_eight(sg, layer):
    pool = scattered_pool("sglang", 0)
    rows = pool.live_rows[:5]
    adapter = ADAPTER(pool, BUCKETS, layer=layer)
    meta = adapter.replay(Batch.decode(rows, [17, 33, 5, 100, 64]), 8)
    live = [pool.slots_of(r)[0] for r in rows]
    assert meta.state_indices.dtype == torch.int32 and meta.query_start_loc.dtype == torch.int32
    assert meta.state_indices.tolist() == live + [-1, -1, -1]
    assert meta.query_start_loc.tolist() == [0, 1, 2, 3, 4, 5, 5, 5, 5]
    assert (meta.bucket, meta.raw_batch_size, meta.batch_size) == (8, 5, 8)
    assert meta.seq_lens.tolist() == [17, 33, 5, 100, 64, 1, 1, 1]  # the backend's fill value
    assert meta.req_pool_indices.tolist() == rows + [0, 0, 0]


@pytest.mark.parametrize("layer", ["gdn", "mamba2"])
@pytest.mark.parametrize("mode", ["decode", "target_verify"])
def test_capture_puts_every_row_on_the_dummy_slot(sg, layer, mode):
    pool = scattered_pool("sglang", 1)
    adapter = ADAPTER(pool, BUCKETS, draft_tokens=3, layer=layer)
    adapter.replay(random_batch(pool, mode, random.Random(1), 3), 16)  # live values in the buffers first
    for bs in reversed(BUCKETS):  # largest first, as the runner captures
        meta = adapter.capture(mode, bs)
        step = 3 if mode == "target_verify" else 1
        assert meta.state_indices.tolist() == [pool.profile.dummy_slot] * bs
        assert meta.query_start_loc.tolist() == [i * step for i in range(bs + 1)]
        assert meta.req_pool_indices.tolist() == [0] * bs


# -- agreement with the workbench's profile ----------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", ["decode", "target_verify", "extend", "idle"])
@pytest.mark.parametrize("layer", ["gdn", "mamba2"])
def test_eager_agrees_with_the_profile(sg, layer, mode, seed):
    rnd = random.Random(seed)
    pool = scattered_pool("sglang", seed)
    d = rnd.randint(1, 5)
    adapter = ADAPTER(pool, BUCKETS, draft_tokens=d, layer=layer)
    for _ in range(5):
        batch = random_batch(pool, mode, rnd, d)
        got = adapter.eager(batch)
        assert got.bucket is None and got.batch_size == batch.raw_batch_size
        assert differences(got, build_metadata(batch, pool, bucket=None), adapter.compared_fields(mode)) == {}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layer", ["gdn", "mamba2"])
def test_replay_agrees_with_the_profile(sg, layer, mode, seed):
    rnd = random.Random(100 + seed)
    pool = scattered_pool("sglang", seed)
    d = rnd.randint(1, 5)
    adapter = ADAPTER(pool, BUCKETS, draft_tokens=d, layer=layer)
    for _ in range(10):
        batch = random_batch(pool, mode, rnd, d)
        bucket = min(b for b in BUCKETS if b >= max(batch.raw_batch_size, 1))
        got = adapter.replay(batch, bucket)
        want = build_metadata(batch, pool, bucket, buckets=BUCKETS)
        assert differences(got, want, adapter.compared_fields(mode)) == {}


def test_replay_returns_copies_not_the_static_buffers(sg):
    pool = scattered_pool("sglang", 2)
    adapter = ADAPTER(pool, BUCKETS)
    rows = pool.live_rows
    first = adapter.replay(Batch.decode(rows[:8], [5] * 8), 8)
    kept = first.state_indices.tolist()
    second = adapter.replay(Batch.decode(rows[8:11], [5] * 3), 8)  # the same bucket, a shorter batch
    assert first.state_indices.tolist() == kept
    assert second.state_indices.tolist()[3:] == [-1] * 5  # the runner's padding policy: no stale rows


def test_compared_fields(sg):
    pool = scattered_pool("sglang", 3)
    gdn, mamba2 = ADAPTER(pool, BUCKETS), ADAPTER(pool, BUCKETS, layer="mamba2")
    for adapter in (gdn, mamba2):
        for mode in ("decode", "target_verify", "extend", "idle"):
            assert {"state_indices", "query_start_loc"} <= set(adapter.compared_fields(mode))
    assert "has_initial_state" in mamba2.compared_fields("extend")
    assert "has_initial_state" not in gdn.compared_fields("extend")  # GDN computes it in its forward
    assert "intermediate_state_indices" in gdn.compared_fields("target_verify")
    assert type(gdn.backend).__name__ == "GDNAttnBackend" and gdn.profile == "sglang"
    assert gdn.label == "sglang 0.5.23 GDNAttnBackend (real code)"


def test_adapter_class_finds_this_adapter(sg):
    from workbench.engines import adapter_class

    assert adapter_class("sglang") is ADAPTER is sg.Adapter


# -- Ascend -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("index", [0, 1], ids=["AscendMamba2AttnBackend", "AscendGDNAttnBackend"])
def test_ascend_class_captures_and_replays_on_the_cpu(sg, index):
    cls = sg.load_ascend()[index]
    pool = scattered_pool("sglang-ascend", 4)
    rnd = random.Random(4)
    adapter = ADAPTER(pool, BUCKETS, draft_tokens=3, backend_class=cls)
    assert adapter.profile == "sglang-ascend" and adapter.fill_value == 0
    for mode in ("decode", "target_verify"):
        meta = adapter.capture(mode, 8)
        assert meta.state_indices.tolist() == [0] * 8
        for _ in range(10):
            batch = random_batch(pool, mode, rnd, 3)
            bucket = min(b for b in BUCKETS if b >= batch.raw_batch_size)
            got = adapter.replay(batch, bucket)
            want = build_metadata(batch, pool, bucket, buckets=BUCKETS)
            assert differences(got, want, adapter.compared_fields(mode)) == {}
            if mode == "target_verify":  # Ascend's per-token rows, as the NPU metadata backend builds them
                assert got.intermediate_token_indices.tolist() == list(range(bucket * 3))


SIGNATURE_FIXED = (
    "        num_padding: Optional[int] = None,\n"
    "        in_capture: bool = False,\n"
    "        mamba_track_indices: Optional[torch.Tensor] = None,\n"
    "        *args,\n"
    "        **kwargs,\n"
    "    ):\n"
)
SIGNATURE_REVERTED = (
    "        num_padding: Optional[int] = None,\n        mamba_track_indices: Optional[torch.Tensor] = None,\n    ):\n"
)


def test_reverted_ascend_fix_raises_the_engines_own_type_error(sg, tmp_path):
    """sglang PR 29598 added ``in_capture`` to Ascend's ``_replay_metadata``; without it, capture fails in
    the engine's own code."""
    sg.load_ascend()  # the sgl_kernel_npu stand-in the copy imports
    installed = sys.modules["sglang.srt.hardware_backend.npu.attention.ascend_hybrid_linear_attn_backend"]
    assert installed.__file__ is not None
    text = Path(installed.__file__).read_text()
    assert text.count(SIGNATURE_FIXED) == 1, "the fixed signature is not in the installed Ascend file"
    path = tmp_path / "ascend_hybrid_linear_attn_backend_reverted.py"
    path.write_text(text.replace(SIGNATURE_FIXED, SIGNATURE_REVERTED))
    spec = importlib.util.spec_from_file_location(f"ascend_reverted_{id(tmp_path)}", path)
    assert spec is not None and spec.loader is not None
    reverted = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reverted)
    adapter = ADAPTER(scattered_pool("sglang-ascend", 5), BUCKETS, backend_class=reverted.AscendMamba2AttnBackend)
    assert adapter.profile == "sglang-ascend"
    with pytest.raises(TypeError, match=r"_replay_metadata\(\) got an unexpected keyword argument 'in_capture'"):
        adapter.capture("decode", 8)


def test_a_missing_dependency_is_one_line_naming_it(sg, tmp_path, monkeypatch):
    (tmp_path / "needs_a_missing_package.py").write_text("import workbench_no_such_package_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(sg.EngineError, match=r"needs the Python package 'workbench_no_such_package_xyz'.*make engines"):
        sg._import("needs_a_missing_package")


# -- verify tracking at commit ----------------------------------------------------------------------------


def test_the_simulated_verify_track_step_is_sglangs_commit_index_math():
    """``workbench.traces.simulate.verify_track_step`` (what the simulator records as
    ``mamba_steps_to_track``) against sglang 0.5.23's own ``fused_commit_track_indices`` (its Triton kernel,
    in the interpreter) for chains (topk 1) of random lengths, accepted counts and track intervals."""
    from sglang.kernels.ops.mamba.mamba_state_scatter_triton import fused_commit_track_indices

    from workbench.traces.simulate import verify_track_step

    rnd = random.Random(0)
    crossings = 0
    for _ in range(12):
        d, interval, bs = rnd.randint(2, 5), rnd.choice([4, 8, 32, 256]), rnd.randint(1, 16)
        accepted = [rnd.randint(1, d) for _ in range(bs)]
        pre = [rnd.choice([rnd.randint(0, 4 * interval), rnd.randint(1, 4) * interval - rnd.randint(1, d)])
               for _ in range(bs)]  # fmt: skip
        accept_index = torch.full((bs, d), -1, dtype=torch.int32)  # a chain: row b's accepted nodes b*D + k
        for b, a in enumerate(accepted):
            accept_index[b, :a] = torch.arange(a, dtype=torch.int32) + b * d
        last, steps = fused_commit_track_indices(
            accept_index, torch.tensor(accepted, dtype=torch.int32), torch.tensor(pre), d, interval
        )
        assert last.tolist() == [a - 1 for a in accepted]  # the accept scatter reads the last accepted step
        want = steps.tolist()
        got = [verify_track_step(p, a, interval) for p, a in zip(pre, accepted, strict=True)]
        assert got == want, (d, interval, pre, accepted)
        crossings += sum(s >= 0 for s in want)
    assert crossings > 10  # the draws cross boundaries, also past them


@pytest.mark.parametrize("layer", ["gdn", "mamba2"])
def test_the_simulated_extend_track_fields_are_sglangs_own(sg, layer):
    """The track fields a simulated ``extra_buffer`` trace records for its extend steps (``track_ssm_h_src`` /
    ``track_ssm_h_dst`` inside a chunk, the final-state copies at a chunk's end, ``track_conv_indices``; for
    Mamba2 the rows off the batch's chunk grid, ``track_ssm_seq_idx`` / ``track_ssm_end_locs`` /
    ``track_ssm_recompute_dst``) against sglang 0.5.23's own ``_init_track_ssm_indices`` (GDN's path, and
    Mamba2's for an instance of ``Mamba2AttnBackend``) and ``_init_track_conv_indices``, fed the step's rows
    as a ForwardBatch would carry them."""
    from types import SimpleNamespace

    from sglang.srt.layers.attention.hybrid_linear_attn_backend import Mamba2AttnBackend, MambaAttnBackendBase

    from workbench.traces.simulate import CONV_WINDOW, simulate

    trace = simulate("sglang", layer, steps=300, seed=0, prefix_cache="extra_buffer", spec=2)
    checked = inside = recomputed = 0
    for step in trace.steps:
        md = step.metadata or {}
        if step.mode not in ("extend", "mixed") or "mamba_track_mask" not in md:
            continue
        chunk = md.get("mamba_chunk_size", 16)
        rows = step.rows
        seqlens = torch.tensor(md["mamba_track_seqlens"])
        prefix = torch.tensor([r.cached_tokens for r in rows])
        fb = SimpleNamespace(
            mamba_track_mask=torch.tensor(md["mamba_track_mask"]),
            extend_seq_lens=torch.tensor([r.new_tokens for r in rows]),
            mamba_track_indices=torch.tensor(md["mamba_track_indices"]),
            mamba_track_seqlens=seqlens,
            extend_prefix_lens=prefix,
            mamba_track_aligned_lens=lambda s=seqlens, p=prefix, c=chunk: (s - p) // c * c,
        )
        fields = dict(mamba_chunk_size=chunk, device="cpu", conv_states_shape=(1, 1, CONV_WINDOW))
        if layer == "mamba2":  # sglang picks the grid by the backend's class: a bare instance carries it
            backend = object.__new__(Mamba2AttnBackend)
            del fields["mamba_chunk_size"]  # a property there, read from its cache
            backend.__dict__.update(fields, _mamba_chunk_size=chunk, _has_cpu_prefill_track_metadata=lambda fb: False)
        else:
            backend = SimpleNamespace(**fields, _has_cpu_prefill_track_metadata=lambda fb: False)
        got = MambaAttnBackendBase._init_track_ssm_indices(backend, torch.tensor([r.slot for r in rows]), fb)
        h_src, h_dst, final_src, final_dst = got[1], got[2], got[4], got[5]
        assert h_src.tolist() == md.get("track_ssm_h_src", []), step.step
        assert h_dst.tolist() == md.get("track_ssm_h_dst", []), step.step
        recompute = [None if t is None else t.tolist() for t in got[6:9]]
        if layer == "mamba2":
            assert recompute == [md.get(k, []) for k in RECOMPUTE_FIELDS], step.step
            recomputed += len(recompute[0])
        else:
            assert recompute == [None] * 3 and not any(k in md for k in RECOMPUTE_FIELDS), step.step
        finals = [list(p) for p in zip(final_src.tolist(), final_dst.tolist(), strict=True)]
        assert finals == [p for p in md.get("copies_after", []) if p[1] in md["mamba_track_indices"]], step.step
        assert final_src.tolist() == md.get("track_ssm_final_src", []), step.step  # as the trace records them
        assert final_dst.tolist() == md.get("track_ssm_final_dst", []), step.step
        if "track_conv_indices" in md:
            qsl = torch.tensor([0, *torch.cumsum(fb.extend_seq_lens, 0).tolist()])
            conv = MambaAttnBackendBase._init_track_conv_indices(backend, qsl, fb)
            assert conv.tolist() == md["track_conv_indices"], step.step
        checked += 1
        inside += len(md.get("track_ssm_h_src", []))
    assert checked > 20 and inside > 5 and (recomputed > 5 or layer == "gdn"), (checked, inside, recomputed)
