"""sglang 0.5.23's own Mamba2 prefill kernel (``mamba_chunk_scan_combined``, its SSD Triton kernels run in the
interpreter) against ``kernels.mamba2.chunk_scan``: the chunk states on one grid over the flattened batch,
the final states, the recompute path off the grid; then sglang's own ``_init_track_ssm_indices`` (Mamba2's
path) reading that kernel's states, against the float64 state of exactly each tracked prefix.

Needs the released engine (``make engines``); skipped visibly without it. Two shims, for the CPU only: the
kernels' wrappers enter ``torch.get_device_module(device).device(index)``, which ``torch.cpu`` lacks (a no-op
context stands in), and their autotuners time several configs on a GPU (each is cut to one config, its
smallest tile: the same numbers up to rounding).
"""

from __future__ import annotations

import contextlib
import importlib
from types import SimpleNamespace

import pytest
import torch

from kernels import mamba2
from kernels.mamba2.chunk_grid import grid_index, grid_size
from kernels.testing import cu_seqlens, rel_err
from workbench.engines.registry import get_adapter
from workbench.engines.versions import installed_version

ADAPTER = get_adapter("sglang")
pytestmark = [
    pytest.mark.engines,
    pytest.mark.skipif(
        installed_version("sglang") != ADAPTER.version,
        reason=f"sglang {ADAPTER.version} is not installed (found {installed_version('sglang')}); "
        "make engines installs it",
    ),
]

SSD_MODULES = ("ssd_chunk_scan", "ssd_chunk_state", "ssd_state_passing", "ssd_bmm")
NH, HD, DS, NG = 2, 4, 8, 1


@pytest.fixture(scope="module")
def ssd():
    """sglang's ``mamba_chunk_scan_combined`` with the CPU shims (module docstring), undone afterwards."""
    import triton

    importlib.import_module(ADAPTER.__module__).load()  # the engine, its stand-ins installed
    from sglang.kernels.ops.mamba.triton_ops import mamba_chunk_scan_combined

    saved: list[tuple[object, str, object]] = []
    for name in SSD_MODULES:
        mod = importlib.import_module(f"sglang.kernels.ops.mamba.triton_ops.{name}")
        for obj in vars(mod).values():
            if isinstance(obj, triton.runtime.autotuner.Autotuner):
                saved += [(obj, "configs", obj.configs), (obj, "early_config_prune", obj.early_config_prune)]
                obj.configs = [min(obj.configs, key=lambda c: (sorted(c.kwargs.values()), c.num_warps))]
                obj.early_config_prune = None
    had = hasattr(torch.cpu, "device")
    if not had:
        torch.cpu.device = lambda index=None: contextlib.nullcontext()  # type: ignore[attr-defined]
    yield mamba_chunk_scan_combined
    for obj, attr, value in saved:
        setattr(obj, attr, value)
    if not had:
        del torch.cpu.device  # type: ignore[attr-defined]


def inputs(lens: list[int], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    T, N = sum(lens), len(lens)
    return {
        "x": torch.randn(T, NH, HD, generator=g),
        "dt": 0.5 * torch.randn(T, NH, generator=g),
        "A": -(0.1 + torch.rand(NH, generator=g)),
        "B": torch.randn(T, NG, DS, generator=g),
        "C": torch.randn(T, NG, DS, generator=g),
        "D": torch.randn(NH, generator=g),
        "dt_bias": 0.5 * torch.randn(NH, generator=g),
        "init": 0.3 * torch.randn(N, NH, HD, DS, generator=g),
        "has_init": torch.tensor([i % 2 == 0 for i in range(N)]),
    }


def sglang_scan(ssd, a, lens, chunk, track_rows=(), track_ends=()):
    """sglang's Mamba2 prefill call (``Mamba2Mixer``'s, with its metadata from ``Mamba2Metadata``): chunk
    states, final states, recomputed states at ``track_ends`` of ``track_rows``."""
    from sglang.srt.layers.attention.mamba.mamba2_metadata import Mamba2Metadata

    T = sum(lens)
    cu = cu_seqlens(lens).to(torch.int32)
    seq_idx = torch.repeat_interleave(torch.arange(len(lens), dtype=torch.int32), torch.tensor(lens)).unsqueeze(0)
    chunk_indices, chunk_offsets = Mamba2Metadata._query_start_loc_to_chunk_indices_offsets(cu, chunk, T)
    init = torch.where(a["has_init"][:, None, None, None], a["init"], 0)  # as Mamba2Mixer gathers them
    states, final, track = ssd(
        a["x"][None], a["dt"][None], a["A"], a["B"][None], a["C"][None], chunk_size=chunk, D=a["D"], z=None,
        dt_bias=a["dt_bias"], seq_idx=seq_idx, chunk_indices=chunk_indices, chunk_offsets=chunk_offsets,
        cu_seqlens=cu, initial_states=init, return_varlen_states=True, return_final_states=False,
        return_track_states=True, track_seq_idx=torch.tensor(list(track_rows), dtype=torch.long),
        track_end_locs=torch.tensor(list(track_ends), dtype=torch.long), dt_softplus=True,
        dt_limit=(0.0, float("inf")), out=torch.empty(1, T, NH, HD), state_dtype=torch.float32,
    )  # fmt: skip
    return states[0], final, None if track is None else track[0]


def ours(a, lens, chunk, impl="reference", dtype=torch.float64):
    pool = a["init"].to(dtype).clone()
    h = torch.full((grid_size(sum(lens), chunk), NH, HD, DS), float("nan"), dtype=dtype)
    args = {k: a[k].to(dtype) for k in ("x", "dt", "A", "B", "C", "D", "dt_bias")}
    out = mamba2.chunk_scan(
        **args, dt_softplus=True, state=pool, state_indices=torch.arange(len(lens)), cu_seqlens=cu_seqlens(lens),
        has_initial_state=a["has_init"], chunk_size=chunk, chunk_states=h, impl=impl,
    )  # fmt: skip
    return h, pool, out


def prefix_state(a, lens, row, tokens):
    """Row ``row``'s float64 state after its first ``tokens`` tokens, the scan of those tokens alone."""
    start = sum(lens[:row])
    sl = slice(start, start + tokens)
    pool = a["init"][row : row + 1].double().clone()
    mamba2.chunk_scan(
        a["x"][sl].double(), a["dt"][sl].double(), a["A"].double(), a["B"][sl].double(), a["C"][sl].double(),
        D=a["D"].double(), dt_bias=a["dt_bias"].double(), dt_softplus=True, state=pool,
        state_indices=torch.tensor([0]), cu_seqlens=torch.tensor([0, tokens]),
        has_initial_state=a["has_init"][row : row + 1], impl="reference",
    )  # fmt: skip
    return pool[0]


@pytest.mark.parametrize(
    "lens,chunk,seed",
    [([20, 20, 12], 16, 0), ([5, 7, 6, 13], 4, 1), ([33, 1, 17, 9], 8, 2), ([64], 16, 3), ([100, 45], 16, 5)],
    ids=["off-grid", "many-boundaries", "one-token-row", "one-row", "past-a-block"],
)
@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_chunk_states_and_final_states_are_sglangs_kernels(ssd, lens, chunk, seed, impl):
    a = inputs(lens, seed)
    states, final, _ = sglang_scan(ssd, a, lens, chunk)
    dtype = torch.float64 if impl == "reference" else torch.float32
    h, pool, _ = ours(a, lens, chunk, impl, dtype)
    assert states.shape == h.shape  # cdiv(T, C) entries: one grid over the flattened batch
    assert rel_err(h.float(), states) < 1e-5, (h - states).abs().max()
    assert rel_err(pool.float(), final) < 1e-5


def test_sglangs_mamba2_track_indices_read_its_kernels_states_at_exactly_the_prefix(ssd):
    """sglang's own ``_init_track_ssm_indices`` on a Mamba2 backend, its kernel's chunk states and recomputed
    states copied as ``_track_mamba_state_extend`` does: each tracked row's state after its last chunk
    boundary, against the float64 scan of exactly those tokens; and the workbench's grid names the same
    entries (``grid_index``)."""
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import Mamba2AttnBackend, MambaAttnBackendBase

    lens, chunk = [20, 20, 12, 35, 18], 16
    a = inputs(lens, 4)
    a["has_init"][:] = False  # fresh prompts: cached 0, so a row's tokens are its prefix
    tracked = [n >= chunk for n in lens]  # sglang tracks a chunk of at least C tokens; at its end
    fb = SimpleNamespace(
        mamba_track_mask=torch.tensor(tracked), extend_seq_lens=torch.tensor(lens),
        mamba_track_indices=torch.arange(len(lens)) + 100, mamba_track_seqlens=torch.tensor(lens),
        extend_prefix_lens=torch.zeros(len(lens), dtype=torch.long),
    )  # fmt: skip
    backend = object.__new__(Mamba2AttnBackend)
    backend.__dict__.update(device="cpu", _mamba_chunk_size=chunk, _has_cpu_prefill_track_metadata=lambda fb: False)
    got = MambaAttnBackendBase._init_track_ssm_indices(backend, torch.arange(len(lens)), fb)
    h_src, h_dst, seq_idx, end_locs, recompute_dst = got[1], got[2], got[6], got[7], got[8]
    assert len(seq_idx) > 0 and len(h_src) > 0  # both paths
    states, _, track = sglang_scan(ssd, a, lens, chunk, seq_idx.tolist(), end_locs.tolist())
    copied = dict(zip(h_dst.tolist(), states[h_src], strict=True))
    copied.update(zip(recompute_dst.tolist(), track, strict=True))
    qsl = cu_seqlens(lens).tolist()
    for row, (n, on) in enumerate(zip(lens, tracked, strict=True)):
        if not on or n % chunk == 0:  # untracked, or its final state (copied from the running slot)
            continue
        aligned = n // chunk * chunk
        want = prefix_state(a, lens, row, aligned)
        assert rel_err(copied[100 + row].double(), want) < 1e-5, row
        k = grid_index(qsl, row, aligned, chunk)
        assert (k in h_src.tolist()) == (k is not None) and (k is None) == (row in seq_idx.tolist())
