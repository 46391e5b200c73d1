"""vLLM 0.33.0's own GDN and Mamba2 metadata builders, driven by a workbench batch on a CPU.

vLLM computes a linear-attention layer's metadata in an ``AttentionMetadataBuilder``:
``GDNAttentionMetadataBuilder`` (``vllm.v1.attention.backends.gdn_attn``) and
``Mamba2AttentionMetadataBuilder`` (``vllm.v1.attention.backends.mamba2_attn``). Its model runner
(``vllm/v1/worker/gpu_model_runner.py``, ``_build_attention_metadata`` and ``_dummy_run``) hands each one a
``CommonAttentionMetadata`` (CAM) per step. :class:`Adapter` builds that CAM the way the runner does, calls
the real builder, and translates the result into a workbench :class:`~workbench.metadata.Metadata`.

How the workbench's inputs map to vLLM's (``mamba_cache_mode="none"``):

- **Block table.** In mode "none" a request's block-table row is ``1 + num_speculative_blocks`` state
  blocks, and the builders read ``block_table[:, 0]`` (decode, prefill) or ``block_table[:, :1 + k]`` (spec
  decode with ``k = num_speculative_tokens``). The workbench's vllm profile keeps ``D`` slots per request in
  target_verify (``StatePool(slots_per_request=D)``), and a verify step carries ``D`` tokens per request, so
  ``k = D - 1`` and a request's block-table row is exactly ``pool.mapping[row]``, int32 ``[D]``: column ``j``
  is the slot of draft position ``j``, the layout ``workbench.metadata.padding.live_index_table`` gives.
  Decode, extend and idle read column 0.
- **Deployments.** Decode, extend and idle run on a builder configured without speculation (a deployment
  without a drafter); target_verify on one configured with ``num_speculative_tokens = D - 1``.
- **Padded rows** (full-cudagraph replay, as the runner pads): query length 0, ``seq_lens`` 0,
  ``is_prefilling`` False, block-table row ``NULL_BLOCK_ID`` (0), ``num_accepted_tokens`` 1,
  ``num_decode_draft_tokens`` -1.
- **Extend order.** The runner reorders a batch decode -> short extend -> long extend -> prefill before
  building (``reorder_batch_to_split_decodes_and_prefills``); the adapter does the same (stably) and puts
  the engine's per-row values back into the batch's row order.

Nothing is faked: the builders are vLLM's, an error they raise reaches the caller. What vLLM cannot import
on a CPU is stood in (:data:`STANDINS`), each by name and reason.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
import types
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from workbench.batch import Batch
from workbench.engines import standins
from workbench.engines.base import EngineAdapter
from workbench.engines.versions import EngineError, check_supported
from workbench.layer_names import DEFAULT_LAYER, GDN, MAMBA2
from workbench.metadata import Metadata
from workbench.pool import StatePool
from workbench.profiles import get_profile

STANDINS: tuple[tuple[str, str], ...] = (
    (
        "vllm.entrypoints.mcp.tool_server",
        "vllm.config -> vllm.reasoning imports it for the name ToolServer (annotations only); the real module "
        "needs openai and openai_harmony (the API server's packages). Stand-in: a module with class ToolServer.",
    ),
    (
        "vllm.v1.structured_output",
        "backends.utils -> kv_transfer -> v1.request imports structured_output.request; the package __init__ "
        "pulls vllm.parser (openai, xgrammar, fastapi). Stand-in: an empty package whose __path__ is the real "
        "folder, so its light submodules (request.py, backend_types.py) load from the wheel.",
    ),
    (
        "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn",
        "GDNAttentionMetadataBuilder.__init__ imports _resolve_gdn_prefill_backend from this model-layer "
        "module, which imports the whole layer stack (quantization, fused MoE, Triton kernels). Stand-in: "
        "that one function, returning (requested, 'triton'), what the real one returns off CUDA/ROCm/XPU.",
    ),
)
"""The stand-in modules the import needs: (module, why). Nothing else of vLLM is replaced."""

POST_IMPORT_FIXES: tuple[tuple[str, str], ...] = (
    (
        "PIN_MEMORY = False in vllm.utils.torch_utils and vllm.v1.attention.backends.utils",
        "vLLM's UnspecifiedPlatform says pinned memory is available; torch+cpu raises on pin_memory=True.",
    ),
)
"""What is changed in the imported engine after the import, and why."""

IMPORT_WARNINGS: list[str] = []
"""The warnings vLLM's import chain raised (torch.jit deprecations and the like), kept rather than shown:
the suite turns warnings into errors, and they are the engine's, not the adapter's."""

GDN_PREFILL_BACKEND = "triton"
"""What the stand-in ``_resolve_gdn_prefill_backend`` reports (the real one's answer on a CPU)."""

MAX_MODEL_LEN = 1 << 20
"""``max_model_len`` of the configured deployment: only the capture CAM's ``max_seq_len`` reads it."""


# -- importing ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Engine:
    """The vLLM names the adapter uses, imported once (:func:`load`)."""

    CommonAttentionMetadata: type
    GDNAttentionMetadataBuilder: type
    Mamba2AttentionMetadataBuilder: type
    MambaSpec: type
    MambaAttentionBackendEnum: Any
    CUDAGraphMode: Any
    MambaBackendEnum: Any
    NULL_BLOCK_ID: int
    PAD_SLOT_ID: int


def _resolve_gdn_prefill_backend(vllm_config: Any) -> tuple[str, str]:
    """The stand-in's contract: ``(requested, active)``; ``requested`` from ``additional_config`` as the real
    function reads it."""
    additional = getattr(vllm_config, "additional_config", None)
    requested = "auto"
    if isinstance(additional, dict):
        requested = str(additional.get("gdn_prefill_backend", "auto")).strip().lower()
    return requested, GDN_PREFILL_BACKEND


class ToolServer:
    """Stand-in for ``vllm.entrypoints.mcp.tool_server.ToolServer`` (only ever an annotation here)."""


def _install_standins() -> None:
    """Register the :data:`STANDINS` in ``sys.modules`` (before anything of vLLM past ``vllm/__init__``)."""
    standins.module("vllm.entrypoints.mcp.tool_server", ToolServer=ToolServer)
    spec = importlib.util.find_spec("vllm")  # imports vllm/__init__.py, which is light
    if spec is None or spec.origin is None:
        raise EngineError("vllm is not importable (make engines installs it)")
    package = standins.module("vllm.v1.structured_output")
    package.__path__ = [os.path.join(os.path.dirname(spec.origin), "v1", "structured_output")]
    package.__package__ = "vllm.v1.structured_output"
    standins.module(
        "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn",
        _resolve_gdn_prefill_backend=_resolve_gdn_prefill_backend,
    )


def _unpin_memory() -> None:
    """:data:`POST_IMPORT_FIXES`: every vllm module that bound ``PIN_MEMORY = True`` gets False."""
    for name, mod in list(sys.modules.items()):
        if name.startswith("vllm") and isinstance(mod, types.ModuleType) and getattr(mod, "PIN_MEMORY", None) is True:
            mod.PIN_MEMORY = False  # type: ignore[attr-defined]


def _import(name: str) -> types.ModuleType:
    """Import one vLLM module; a missing pure-Python dependency becomes one line naming it."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        missing = (e.name or "?").split(".")[0]
        if missing == "vllm":
            raise  # a module of vLLM itself is missing: the engine's own error, shown as it is
        raise EngineError(
            f"vllm 0.33.0 needs the Python package {missing!r} to import {name} (make engines installs it)"
        ) from e


@functools.cache
def load() -> Engine:
    """Import vLLM 0.33.0's metadata code with the stand-ins (once per process).

    Raises :class:`EngineError` when vLLM is not installed, is another version, or lacks a dependency.
    """
    check_supported("vllm")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _install_standins()
        backend = _import("vllm.v1.attention.backend")
        gdn = _import("vllm.v1.attention.backends.gdn_attn")
        mamba2 = _import("vllm.v1.attention.backends.mamba2_attn")
        utils = _import("vllm.v1.attention.backends.utils")
        kv = _import("vllm.v1.kv_cache_interface")
        registry = _import("vllm.v1.attention.backends.registry")
        config = _import("vllm.config")
        mamba_config = _import("vllm.config.mamba")
    IMPORT_WARNINGS.extend(f"{w.category.__name__}: {w.message}" for w in caught)
    _unpin_memory()
    return Engine(
        CommonAttentionMetadata=backend.CommonAttentionMetadata,
        GDNAttentionMetadataBuilder=gdn.GDNAttentionMetadataBuilder,
        Mamba2AttentionMetadataBuilder=mamba2.Mamba2AttentionMetadataBuilder,
        MambaSpec=kv.MambaSpec,
        MambaAttentionBackendEnum=registry.MambaAttentionBackendEnum,
        CUDAGraphMode=config.CUDAGraphMode,
        MambaBackendEnum=mamba_config.MambaBackendEnum,
        NULL_BLOCK_ID=int(utils.NULL_BLOCK_ID),
        PAD_SLOT_ID=int(utils.PAD_SLOT_ID),
    )


# -- the deployment: config and kv-cache spec ---------------------------------------------------------
def _config(eng: Engine, num_spec: int, capture_sizes: Sequence[int], max_num_seqs: int) -> Any:
    """A ``VllmConfig``-shaped namespace: exactly the attributes the two builders read (listed by the
    research prototype's recording config), with what a full-and-piecewise cudagraph deployment on
    ``mamba_cache_mode="none"`` holds. ``capture_sizes`` count tokens, as vLLM's do."""
    ns = types.SimpleNamespace
    spec = None
    if num_spec:
        spec = ns(
            num_speculative_tokens=num_spec,
            parallel_drafting=False,
            method="mtp",
            use_eagle_block_drop=lambda: False,
            disable_lookahead_block_hashes=False,
        )
    block = 16  # only align mode and prefill checkpoints read it
    return ns(
        compilation_config=ns(
            cudagraph_mode=eng.CUDAGraphMode.FULL_AND_PIECEWISE,
            max_cudagraph_capture_size=max(capture_sizes),
            cudagraph_capture_sizes=list(capture_sizes),
        ),
        speculative_config=spec,
        cache_config=ns(
            mamba_cache_mode="none",
            use_replayssm=False,
            replayssm_buffer_len=16,
            hash_block_size=block,
            cache_hit_alignment_tokens=block,
            enable_prefix_caching=False,
            mamba_block_size=block,
        ),
        scheduler_config=ns(max_num_seqs=max_num_seqs, async_scheduling=False),
        parallel_config=ns(decode_context_parallel_size=1),
        model_config=ns(
            get_mamba_chunk_size=lambda: 64,
            hf_text_config=ns(linear_key_head_dim=128, linear_value_head_dim=128),
            dtype=torch.bfloat16,
        ),
        mamba_config=ns(backend=eng.MambaBackendEnum.TRITON),
        additional_config={},
        use_v2_model_runner=False,
        num_speculative_tokens=num_spec,
        num_hash_lookahead_tokens=0,
    )


def _kv_spec(eng: Engine, layer: str, num_spec: int) -> Any:
    """The layer's ``MambaSpec`` (Qwen3-Next / Mamba2-like shapes; the builders read only the mode and
    ``num_speculative_blocks``)."""
    own = _LAYERS[layer]
    return eng.MambaSpec(
        block_size=16,
        shapes=own.shapes,
        dtypes=(torch.bfloat16, torch.float32),
        mamba_type=getattr(eng.MambaAttentionBackendEnum, own.kind),
        mamba_cache_mode="none",
        num_speculative_blocks=num_spec,
    )


# -- the runner's CommonAttentionMetadata -------------------------------------------------------------
@dataclass(frozen=True)
class Rows:
    """One step's rows as the runner lays them out (live rows first, then padding), host lists.

    ``block_table``: int32 ``[rows, width]``; ``num_accepted`` / ``num_draft``: the runner's
    ``num_accepted_tokens`` and ``num_decode_draft_tokens`` (None: not a spec step).
    """

    query_lens: list[int]
    seq_lens: list[int]
    is_prefilling: list[bool]
    block_table: torch.Tensor
    num_accepted: list[int] | None = None
    num_draft: list[int] | None = None


def _pad(rows: Rows, num_rows: int, null_block: int) -> Rows:
    """``rows`` padded to ``num_rows`` as ``_build_attention_metadata`` pads a full-cudagraph step."""
    p = num_rows - len(rows.query_lens)
    table = torch.cat([rows.block_table, torch.full((p, rows.block_table.shape[1]), null_block, dtype=torch.int32)])
    return Rows(
        query_lens=rows.query_lens + [0] * p,
        seq_lens=rows.seq_lens + [0] * p,
        is_prefilling=rows.is_prefilling + [False] * p,
        block_table=table,
        num_accepted=None if rows.num_accepted is None else rows.num_accepted + [1] * p,
        num_draft=None if rows.num_draft is None else rows.num_draft + [-1] * p,
    )


def _cam(eng: Engine, rows: Rows, device: torch.device, num_tokens: int, max_seq_len: int | None = None) -> Any:
    """The ``CommonAttentionMetadata`` of ``rows``: ``query_start_loc`` int32 ``[n + 1]`` (and its CPU copy),
    ``seq_lens`` int32 ``[n]``, ``is_prefilling`` CPU bool ``[n]``, ``slot_mapping`` int64 ``[num_tokens]``
    (PAD_SLOT_ID: the mamba builders never read it). ``num_tokens`` is the (padded) token count."""
    qsl = torch.zeros(len(rows.query_lens) + 1, dtype=torch.int32)
    torch.cumsum(torch.tensor(rows.query_lens, dtype=torch.int32), 0, out=qsl[1:])
    seq = torch.tensor(rows.seq_lens, dtype=torch.int32)
    return eng.CommonAttentionMetadata(
        query_start_loc=qsl.to(device),
        query_start_loc_cpu=qsl,
        seq_lens=seq.to(device),
        num_reqs=len(rows.query_lens),
        num_actual_tokens=num_tokens,
        max_query_len=max(rows.query_lens, default=0),
        max_seq_len=max(rows.seq_lens, default=0) if max_seq_len is None else max_seq_len,
        block_table_tensor=rows.block_table.to(device),
        slot_mapping=torch.full((num_tokens,), eng.PAD_SLOT_ID, dtype=torch.int64, device=device),
        causal=True,
        is_prefilling=torch.tensor(rows.is_prefilling, dtype=torch.bool),
        seq_lens_cpu_upper_bound=seq.clone(),
    )


def _extend_order(batch: Batch) -> list[int]:
    """The runner's region order for an extend batch (all prompt chunks): short extends (cached tokens, 1
    new), long extends (cached tokens, more new), first chunks (nothing cached). Stable within a region:
    the order inside one changes no row's values."""
    assert batch.extend_lens is not None and batch.prefix_lens is not None
    ext, pre = batch.extend_lens.tolist(), batch.prefix_lens.tolist()

    def region(i: int) -> int:
        if pre[i] == 0:
            return 3
        return 1 if ext[i] == 1 else 2

    return sorted(range(batch.raw_batch_size), key=region)


def _unpermute(values: torch.Tensor, order: list[int]) -> torch.Tensor:
    """Engine row ``k`` is batch row ``order[k]``: the values back in the batch's order."""
    out = torch.empty_like(values)
    out[torch.tensor(order, dtype=torch.long, device=values.device)] = values
    return out


def _starts(lens: torch.Tensor) -> torch.Tensor:
    """int32 ``[n + 1]`` running sum of ``lens`` from 0."""
    out = torch.zeros(lens.numel() + 1, dtype=torch.int32, device=lens.device)
    torch.cumsum(lens.to(torch.int32), 0, out=out[1:])
    return out


# -- what the builder returns, as workbench fields ----------------------------------------------------
@dataclass
class Fields:
    """The engine's answer in the runner's row order: ``state_indices`` int32 ``[n]`` or ``[n, D]``,
    ``query_start_loc`` int32 ``[n + 1]`` or None (the engine computed none: the CAM's is used),
    ``has_initial_state`` bool ``[n]`` or None (not computed), ``num_accepted_tokens`` int32 ``[n]`` or None."""

    state_indices: torch.Tensor
    query_start_loc: torch.Tensor | None
    has_initial_state: torch.Tensor | None
    num_accepted_tokens: torch.Tensor | None


def _gdn_fields(md: Any, spec: bool) -> Fields:
    """``GDNAttentionMetadata`` -> Fields (cloned: in full-cudagraph mode they are views into the builder's
    buffers, rewritten by the next build)."""
    if spec:
        if md.num_prefills or md.num_decodes:
            raise EngineError(
                f"vllm GDN split a verify batch into {md.num_spec_decodes} spec decodes, {md.num_decodes} decodes "
                f"and {md.num_prefills} prefills; the adapter translates pure verify batches only"
            )
        return Fields(
            state_indices=md.spec_state_indices_tensor.clone(),
            query_start_loc=md.spec_query_start_loc.clone(),
            has_initial_state=None,
            num_accepted_tokens=md.num_accepted_tokens.clone(),
        )
    init = None if md.has_initial_state is None else md.has_initial_state.clone()
    return Fields(
        state_indices=md.non_spec_state_indices_tensor.clone(),
        query_start_loc=md.non_spec_query_start_loc.clone(),
        has_initial_state=init,
        num_accepted_tokens=None,
    )


def _mamba2_fields(md: Any, spec: bool) -> Fields:
    """``Mamba2AttentionMetadata`` -> Fields. Decode rows come first (``_d``), prefill rows after (``_p``);
    without speculation a decode row is one token and vLLM computes no ``query_start_loc_d``."""
    d, p = md.num_decodes, md.num_prefills
    if spec:
        if p:
            raise EngineError(f"vllm Mamba2 split a verify batch into {d} decodes and {p} prefills")
        return Fields(
            state_indices=md.state_indices_tensor_d.clone(),
            query_start_loc=md.query_start_loc_d.clone(),
            has_initial_state=None,
            num_accepted_tokens=md.num_accepted_tokens.clone(),
        )
    indices = [md.state_indices_tensor_d[:, 0], md.state_indices_tensor_p]
    if p == 0:
        return Fields(torch.cat(indices).clone(), None, None, None)
    dev = md.state_indices_tensor_p.device
    lens = torch.cat([torch.ones(d, dtype=torch.int32, device=dev), torch.diff(md.query_start_loc_p)])
    init = torch.cat([torch.ones(d, dtype=torch.bool, device=dev), md.has_initial_states_p])
    return Fields(torch.cat(indices).clone(), _starts(lens), init, None)


@dataclass(frozen=True)
class _Layer:
    """What vLLM has for one workbench layer: its metadata builder (a field of :class:`Engine`), the model's
    layer names the builder is built for, its ``MambaSpec`` (shapes, ``MambaAttentionBackendEnum`` member),
    how its metadata reads as :class:`Fields`, and whether a decode step (no speculation) computes a
    ``query_start_loc``."""

    builder: str
    layer_names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], tuple[int, ...]]
    kind: str
    fields: Callable[[Any, bool], Fields]
    decode_query_start_loc: bool


_LAYERS: dict[str, _Layer] = {
    GDN: _Layer(
        "GDNAttentionMetadataBuilder", ("model.layers.0.linear_attn",), ((2048, 3), (8, 128, 128)), "GDN_ATTN",
        _gdn_fields, decode_query_start_loc=True,
    ),
    MAMBA2: _Layer(
        "Mamba2AttentionMetadataBuilder", ("model.layers.0.mixer",), ((4096 + 2 * 128, 3), (64, 64, 128)),
        "MAMBA2", _mamba2_fields, decode_query_start_loc=False,
    ),
}  # fmt: skip
"""The workbench layers (names of ``workbench.layers.LAYERS``) vLLM 0.33.0 has a builder for."""


# -- the adapter --------------------------------------------------------------------------------------
class Adapter(EngineAdapter):
    """vLLM 0.33.0's ``GDNAttentionMetadataBuilder`` / ``Mamba2AttentionMetadataBuilder`` behind the
    workbench's hooks (see the module docstring for the mapping).

    Args:
        pool: a ``"vllm"``-profile pool; in target_verify it must keep ``D`` slots per request.
        buckets: captured batch sizes in rows (vLLM's capture sizes count tokens: ``bucket * D`` in verify).
        draft_tokens: D of target-verify steps (tokens per request; vLLM's ``num_speculative_tokens + 1``).
        layer: a name of ``layers`` (of ``workbench.layers.LAYERS``) vLLM has a builder for.
        backend_class: a builder class to use instead of vLLM's own (a user's modified copy).

    Attributes:
        builder: the engine's builder of decode, extend and idle steps (no speculation).
        spec_builder: the builder of target-verify steps (``num_speculative_tokens = D - 1``), or None when
            ``D < 2``: vLLM verifies at least one draft token.
    """

    engine = "vllm"
    version = "0.33.0"
    layers = tuple(_LAYERS)

    def __init__(
        self,
        pool: StatePool,
        buckets: Sequence[int],
        draft_tokens: int = 2,
        *,
        layer: str = DEFAULT_LAYER,
        backend_class: type | None = None,
    ) -> None:
        super().__init__(pool, buckets, draft_tokens, layer=layer, backend_class=backend_class)
        if pool.profile.name != self.profile:
            raise EngineError(f"pool: vllm builds for a {self.profile!r}-profile pool, got {pool.profile.name!r}")
        if not self.buckets:
            raise EngineError("buckets: vllm captures at least one batch size")
        self.eng = load()
        self.device = torch.device(pool.device)
        self.builder = self._make_builder(0)
        self.spec_builder = self._make_builder(draft_tokens - 1) if draft_tokens >= 2 else None

    # -- EngineAdapter ------------------------------------------------------------------------------------
    @property
    def profile(self) -> str:
        return "vllm"

    @property
    def default_class_name(self) -> str:
        return _LAYERS[self.layer].builder

    def compared_fields(self, mode: str) -> tuple[str, ...]:
        """What the builder computes per mode. Mamba2 without speculation computes no decode
        ``query_start_loc`` (a decode row is one token by construction); GDN passes the runner's through
        (eager) or restages it with the padded tail (full cudagraph)."""
        if mode == "target_verify":
            return ("state_indices", "query_start_loc", "num_accepted_tokens")
        if mode == "extend":
            return ("state_indices", "query_start_loc", "has_initial_state")
        if not _LAYERS[self.layer].decode_query_start_loc:
            return ("state_indices",)
        return ("state_indices", "query_start_loc")

    def eager(self, batch: Batch) -> Metadata:
        """``build(0, cam, ...)`` on the unpadded CAM, as the runner builds a step it does not replay (the
        same builder: its full-cudagraph staging does not change values of an unpadded step). An idle step
        run eagerly builds no attention metadata in vLLM (``_dummy_run`` without FULL skips it): zero rows."""
        self._check_batch(batch)
        if batch.mode == "idle":
            return self._empty(batch)
        if batch.mode == "extend":
            order = _extend_order(batch)
            rows = self._rows(batch, order)
            cam = _cam(self.eng, rows, self.device, sum(rows.query_lens))
            fields = self._complete(self._fields(self.builder.build(0, cam), spec=False), cam)
            return self._metadata(batch, self._in_batch_order(fields, order), None)
        rows = self._rows(batch)
        return self._build(batch, rows, len(rows.query_lens), None)

    def replay(self, batch: Batch, bucket: int) -> Metadata:
        """The build before a full-cudagraph replay of ``bucket`` rows: the runner's padded CAM (padded rows
        as in the module docstring), ``build(0, cam, ...)``. An idle step is the runner's
        ``execute_dummy_batch``: one dummy request of one step's tokens, padded to ``bucket``, built with
        ``build_for_cudagraph_capture`` (``_dummy_run`` restages FULL buffers from the zeroed block table)."""
        self._check_batch(batch)
        if batch.mode == "extend":
            raise EngineError("vllm captures full cudagraphs of decode and verify steps only; extend runs eagerly")
        self._check_bucket(bucket, batch.raw_batch_size)
        if batch.mode == "idle":
            return self._dummy(batch, bucket, rows_live=1)
        return self._build(batch, _pad(self._rows(batch), bucket, self.eng.NULL_BLOCK_ID), bucket, bucket)

    def capture(self, mode: str, bucket: int) -> Metadata:
        """``build_for_cudagraph_capture`` on the runner's capture batch (``_dummy_run(uniform_decode=True,
        is_graph_capturing=True)``): ``bucket`` rows of one step's tokens each, ``seq_lens`` equal to that,
        a zeroed (null-block) block table, ``max_seq_len = max_model_len``."""
        if mode not in ("decode", "target_verify", "idle"):
            raise EngineError(f"mode: vllm captures decode and target_verify graphs, got {mode!r}")
        self._check_bucket(bucket, 0)
        if mode == "target_verify":
            batch = Batch("target_verify", *self._no_rows(), draft_tokens=self.draft_tokens)
        else:
            batch = Batch(mode, *self._no_rows(), draft_tokens=1 if mode == "decode" else 0)
        return self._dummy(batch, bucket, rows_live=bucket)

    # -- builders -----------------------------------------------------------------------------------------
    def _make_builder(self, num_spec: int) -> Any:
        cls = self.backend_class or getattr(self.eng, _LAYERS[self.layer].builder)
        tokens = num_spec + 1
        config = _config(self.eng, num_spec, [b * tokens for b in self.buckets], max(self.buckets))
        return cls(_kv_spec(self.eng, self.layer, num_spec), list(_LAYERS[self.layer].layer_names), config, self.device)

    def _builder_for(self, mode: str) -> Any:
        if mode != "target_verify":
            return self.builder
        if self.spec_builder is None:
            raise EngineError(
                f"draft_tokens={self.draft_tokens}: vllm verifies D >= 2 tokens per request "
                "(num_speculative_tokens = D - 1 >= 1)"
            )
        return self.spec_builder

    def _fields(self, md: Any, spec: bool) -> Fields:
        return _LAYERS[self.layer].fields(md, spec)

    # -- one step -----------------------------------------------------------------------------------------
    def _tokens_per_row(self, mode: str) -> int:
        return self.draft_tokens if mode == "target_verify" else 1

    def _rows(self, batch: Batch, order: list[int] | None = None) -> Rows:
        """The live rows as the runner holds them (in ``order`` for extend)."""
        n, mode = batch.raw_batch_size, batch.mode
        idx = list(range(n)) if order is None else order
        rpi = batch.req_pool_indices.cpu()[idx]
        # verify: [n, D], vLLM's block_table[:, :1 + k]; otherwise [n, 1], no speculative blocks
        width = self.draft_tokens if mode == "target_verify" else 1
        table = self.pool.mapping.cpu()[rpi][:, :width]
        seq = [int(batch.seq_lens[i]) for i in idx]
        if mode == "extend":
            assert batch.extend_lens is not None
            ext = [int(batch.extend_lens[i]) for i in idx]
            return Rows(ext, seq, [True] * n, table.to(torch.int32))
        if mode == "target_verify":
            d = self.draft_tokens
            acc = [1] * n if batch.num_accepted_tokens is None else [int(batch.num_accepted_tokens[i]) for i in idx]
            return Rows([d] * n, seq, [False] * n, table.to(torch.int32), num_accepted=acc, num_draft=[d - 1] * n)
        return Rows([1] * n, seq, [False] * n, table.to(torch.int32))

    def _build(self, batch: Batch, rows: Rows, num_rows: int, bucket: int | None) -> Metadata:
        """``build(0, cam, ...)`` of decode / verify rows (padded or not) -> Metadata."""
        mode, spec = batch.mode, batch.mode == "target_verify"
        tokens = num_rows * self._tokens_per_row(mode) if bucket is not None else sum(rows.query_lens)
        cam = _cam(self.eng, rows, self.device, tokens)
        kwargs: dict[str, torch.Tensor] = {}
        if spec:
            assert rows.num_accepted is not None and rows.num_draft is not None
            kwargs = {
                "num_accepted_tokens": torch.tensor(rows.num_accepted, dtype=torch.int32, device=self.device),
                "num_decode_draft_tokens_cpu": torch.tensor(rows.num_draft, dtype=torch.int32),
            }
        md = self._builder_for(mode).build(0, cam, **kwargs)
        return self._metadata(batch, self._complete(self._fields(md, spec), cam), bucket, rows)

    def _dummy(self, batch: Batch, bucket: int, rows_live: int) -> Metadata:
        """The runner's uniform-decode dummy batch (``rows_live`` rows of one step's tokens on the null
        block, padded to ``bucket``) through ``build_for_cudagraph_capture``."""
        mode = "target_verify" if batch.mode == "target_verify" else "decode"
        q = self._tokens_per_row(mode)
        width = q if mode == "target_verify" else 1
        live = Rows(
            [q] * rows_live, [q] * rows_live, [False] * rows_live, torch.zeros((rows_live, width), dtype=torch.int32)
        )
        rows = _pad(live, bucket, self.eng.NULL_BLOCK_ID)
        cam = _cam(self.eng, rows, self.device, rows_live * q, max_seq_len=MAX_MODEL_LEN)
        md = self._builder_for(mode).build_for_cudagraph_capture(cam)
        fields = self._complete(self._fields(md, mode == "target_verify"), cam)
        meta = self._metadata(batch, fields, bucket, rows)
        meta.raw_batch_size = rows_live if batch.mode != "idle" else 0
        return meta

    def _complete(self, fields: Fields, cam: Any) -> Fields:
        """Fill what the engine did not compute from the runner's CAM (``query_start_loc``)."""
        if fields.query_start_loc is None:
            fields.query_start_loc = cam.query_start_loc.clone()
        return fields

    def _in_batch_order(self, fields: Fields, order: list[int]) -> Fields:
        """An extend step's Fields, from the runner's row order back to the batch's."""
        assert fields.query_start_loc is not None
        lens = torch.diff(fields.query_start_loc)
        init = fields.has_initial_state
        if init is None:  # every row ran the decode kernels, which read the state
            init = torch.ones(len(order), dtype=torch.bool, device=fields.state_indices.device)
        return Fields(
            state_indices=_unpermute(fields.state_indices, order),
            query_start_loc=_starts(_unpermute(lens, order)),
            has_initial_state=_unpermute(init, order),
            num_accepted_tokens=None,
        )

    def _metadata(self, batch: Batch, fields: Fields, bucket: int | None, rows: Rows | None = None) -> Metadata:
        """A workbench Metadata: the engine's fields; ``seq_lens`` and ``req_pool_indices`` from the inputs
        (padded per the runner: seq_len 0, the reserved request row 0). ``has_initial_state``, where the engine
        computes none (decode, verify), is what the decode kernels do: live rows read their state."""
        assert fields.query_start_loc is not None
        n = fields.state_indices.shape[0]
        r, dev = batch.raw_batch_size, self.device
        rpi = torch.zeros(n, dtype=torch.int64, device=dev)
        rpi[:r] = batch.req_pool_indices.to(dev)
        seq = batch.seq_lens.to(dev) if rows is None else torch.tensor(rows.seq_lens, dtype=torch.int32, device=dev)
        init = fields.has_initial_state
        if init is None:
            init = torch.zeros(n, dtype=torch.bool, device=dev)
            init[:r] = True
        return Metadata(
            profile=get_profile(self.profile),
            forward_mode=batch.mode,
            raw_batch_size=r,
            draft_tokens=batch.draft_tokens,
            state_indices=fields.state_indices.to(torch.int32),
            query_start_loc=fields.query_start_loc.to(torch.int32),
            seq_lens=seq,
            req_pool_indices=rpi,
            has_initial_state=init.to(torch.bool),
            extend_lens=batch.extend_lens.clone() if batch.extend_lens is not None else None,
            num_accepted_tokens=fields.num_accepted_tokens,
            bucket=bucket,
        )

    def _empty(self, batch: Batch) -> Metadata:
        dev = self.device
        none = torch.zeros(0, dtype=torch.int32, device=dev)
        fields = Fields(none, torch.zeros(1, dtype=torch.int32, device=dev), None, None)
        return self._metadata(batch, fields, None)

    def _no_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.zeros(0, dtype=torch.int64, device=self.device),
            torch.zeros(0, dtype=torch.int32, device=self.device),
        )

    # -- checks -------------------------------------------------------------------------------------------
    def _check_batch(self, batch: Batch) -> None:
        if not isinstance(batch, Batch):
            raise EngineError(f"batch must be a workbench Batch, got {type(batch).__name__}")
        if batch.mode == "target_verify" and batch.draft_tokens != self.draft_tokens:
            raise EngineError(
                f"draft_tokens: the adapter verifies D={self.draft_tokens}, batch has D={batch.draft_tokens}"
            )
        if batch.mode == "target_verify" and self.pool.slots_per_request != self.draft_tokens:
            raise EngineError(
                f"pool.slots_per_request={self.pool.slots_per_request}: vllm's verify block table holds D="
                f"{self.draft_tokens} state blocks per request (StatePool(slots_per_request=D))"
            )

    def _check_bucket(self, bucket: int, raw_bs: int) -> None:
        if bucket not in self.buckets:
            raise EngineError(f"bucket {bucket} is not captured; buckets: {list(self.buckets)}")
        if raw_bs > bucket:
            raise EngineError(f"bucket {bucket} is smaller than the batch ({raw_bs} rows)")
