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

**Runners** (``Adapter(..., runner=)``, :attr:`Adapter.RUNNERS`). vLLM 0.31-0.33 run Model Runner V2 by
default (``VllmConfig.use_v2_model_runner``, ``config/vllm.py:731``; env ``VLLM_USE_V2_MODEL_RUNNER``), so
``"v2"`` is the default; ``"v1"`` is ``gpu_model_runner.py``. Line numbers are vLLM 0.33.0's. What differs:

- ``num_accepted_tokens`` of a verify step. v1: the batch's counts (else 1), per batch row, as V1 stages
  its ``num_accepted_tokens`` buffer (``gpu_model_runner.py:2081-2096``, written from the previous step's
  ``(output_token_ids != -1).sum`` at :1566, unclamped). v2: a store of one count per request-pool row
  (V2's request-state rows, ``model_states/mamba_hybrid.py:86``, ones), gathered through ``idx_mapping`` =
  the batch's ``req_pool_indices``; padded rows 1 (``prepare_attn``, :276-279). The store is written as
  ``postprocess_state`` writes it, ``max(n, 1)``, rows -1 skipped (:350-376, kernels :405-430), and reset to 1
  by ``add_request`` (:112-115). The adapter learns ``n`` three ways: :meth:`Adapter.postprocess` (a step's
  sampled counts, 0 allowed), a verify batch's ``num_accepted_tokens`` (written into the store before the
  gather: they are the previous step's counts), and, after each step it builds (eager, replay,
  ``second_group``), one sampled token per live row, the count V2 writes for a step that sampled one token
  (the adapter samples nothing; a later ``postprocess`` overrides it). A request newly put in a row runs a
  prompt chunk first, after which the row reads 1; :meth:`Adapter.add_request` resets rows reused without
  a step between.
- ``num_decode_draft_tokens_cpu``. v1: the draft count where the row's scheduled tokens are exactly drafts
  + 1, else -1 (``gpu_model_runner.py:2205-2226``). v2: the draft count for every decode row (not
  prefilling, 0 < scheduled <= num_speculative_tokens + 1), -1 otherwise and for padded rows
  (``mamba_hybrid.py:281-302``). For the adapter's verify rows (D tokens, D - 1 drafts) both give D - 1;
  they differ for drafts cut short by the token budget (:func:`_decode_drafts`).
- Extend order. v1: decode, short extend, long extend, first chunk (``reorder_batch_to_split_decodes_and_
  prefills``). v2: ``sort_batch_req_ids`` (``worker/gpu/model_runner.py:2507-2519``): rows with drafts,
  then rows of ``decode_query_len`` tokens, then by token count. Each row's values are the same.
- The builders' config says ``use_v2_model_runner`` (GDN reads it: ``gdn_attn.py:185-190``).
- A second KV-cache group of the same spec and builder (:meth:`Adapter.second_group`). v2: ``build_attn_
  metadata`` (``worker/gpu/attn_utils.py:458-583``, the reuse at :550-578) calls the group's builder's
  ``update_block_table(first_group_metadata, block_table, slot_mapping)`` instead of ``build()`` when
  ``supports_update_block_table`` and the spec is a ``MambaSpec`` (at capture too). GDN's says True only for
  MRV2 on CUDA and exactly ``GDNAttentionMetadataBuilder`` (``gdn_attn.py:185-190``): on a CPU it is False,
  so the adapter applies the MRV2 + exact-type part and sets the device aside (the method itself,
  ``gdn_attn.py:733-789``, runs on a CPU in mode "none"). Mamba2's is True unless speculating
  (``mamba_attn.py:90, 190-191``): its verify groups are built with ``build()``, as vLLM does. v1 reuses the
  same way, except at capture (``gpu_model_runner.py:2447-2466``); GDN never (MRV2 only).
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
from workbench.engines.identity import identify
from workbench.engines.probes import Probe, fields, has, run_probes, takes
from workbench.engines.versions import EngineError
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
    """:data:`POST_IMPORT_FIXES`: every vllm module that bound ``PIN_MEMORY = True`` gets False; where
    ``vllm.utils.torch_utils`` answers ``PIN_MEMORY`` lazily and its helpers ask ``is_pin_memory_available()``
    themselves (vLLM 0.32.0), that function answers False."""
    for name, mod in list(sys.modules.items()):
        if name.startswith("vllm") and isinstance(mod, types.ModuleType) and getattr(mod, "PIN_MEMORY", None) is True:
            mod.PIN_MEMORY = False  # type: ignore[attr-defined]
    torch_utils = sys.modules.get("vllm.utils.torch_utils")
    if torch_utils is not None and "__getattr__" in vars(torch_utils):
        torch_utils.is_pin_memory_available = lambda: False  # type: ignore[attr-defined]


def _import(name: str) -> types.ModuleType:
    """Import one vLLM module; a missing pure-Python dependency becomes one line naming it."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        missing = (e.name or "?").split(".")[0]
        if missing == "vllm":
            raise  # a module of vLLM itself is missing: the engine's own error, shown as it is
        raise EngineError(
            f"vllm {identify('vllm').version} needs the Python package {missing!r} to import {name} (make engines "
            "installs it)"
        ) from e


CAM_FIELDS = (
    "query_start_loc", "query_start_loc_cpu", "seq_lens", "num_reqs", "num_actual_tokens", "max_query_len",
    "max_seq_len", "block_table_tensor", "slot_mapping",
)  # fmt: skip
"""The ``CommonAttentionMetadata`` fields the adapter passes by name (``_cam``)."""


METADATA_READS: dict[str, tuple[str, tuple[str, ...]]] = {
    GDN: (
        "GDNAttentionMetadata",
        (
            "num_prefills", "num_decodes", "num_spec_decodes", "spec_state_indices_tensor", "spec_query_start_loc",
            "num_accepted_tokens", "non_spec_state_indices_tensor", "non_spec_query_start_loc", "has_initial_state",
        ),
    ),
    MAMBA2: (
        "Mamba2AttentionMetadata",
        (
            "num_prefills", "num_decodes", "state_indices_tensor_d", "query_start_loc_d", "num_accepted_tokens",
            "state_indices_tensor_p", "query_start_loc_p", "has_initial_states_p",
        ),
    ),
}  # fmt: skip
"""Per layer, the metadata dataclass the builder returns and the fields the adapter reads of it."""


def probes(backend: Any, gdn: Any, mamba2: Any, utils: Any, kv: Any) -> list[Probe]:
    """What the adapter needs of the imported vLLM (:mod:`workbench.engines.probes`): the builders'
    constructor and ``build`` with the arguments it passes, the CAM fields it sets (and no other required
    one), the metadata fields it reads, ``MambaSpec``, the null block and pad slot ids."""
    cam = backend.CommonAttentionMetadata
    out = [
        Probe("CommonAttentionMetadata has the fields the adapter passes", fields(cam, *CAM_FIELDS)),
        Probe("the null block and the pad slot ids", has(utils, "NULL_BLOCK_ID", "PAD_SLOT_ID")),
        Probe("MambaSpec", has(kv, "MambaSpec")),
    ]
    for layer, mod in ((GDN, gdn), (MAMBA2, mamba2)):
        cls = getattr(mod, _LAYERS[layer].builder)
        meta_name, reads = METADATA_READS[layer]
        meta = getattr(mod, meta_name)
        out += [
            Probe(
                f"{cls.__name__}(kv_cache_spec, layer_names, vllm_config, device)",
                takes(cls, "kv_cache_spec", "layer_names", "vllm_config", "device"),
            ),
            Probe(
                f"{cls.__name__}.build(common_prefix_len, common_attn_metadata)",
                takes(cls.build, "common_prefix_len", "common_attn_metadata"),
            ),
            Probe(f"{cls.__name__}.build_for_cudagraph_capture", has(cls, "build_for_cudagraph_capture")),
            Probe(f"{meta_name} has the fields the adapter reads", fields(meta, *reads)),
        ]
    out.append(
        Probe(
            "GDNAttentionMetadataBuilder.build takes the runner's spec-decode counts",
            takes(gdn.GDNAttentionMetadataBuilder.build, "num_accepted_tokens", "num_decode_draft_tokens_cpu"),
        )
    )
    return out


PROBED: dict[str, int] = {}
"""Engine -> how many probes its last :func:`load` ran (all passed)."""


@functools.cache
def load() -> Engine:
    """Import vLLM's metadata code with the stand-ins (once per process) and run the adapter's probes.

    The engine is the one :func:`~workbench.engines.identity.identify` names (a tree chosen with
    ``--engine-root``, else the installed one): a verified release or any build whose probes pass. Raises
    :class:`EngineError` when vLLM is not installed, a probe fails (naming it) or a dependency is missing.
    """
    ident = identify("vllm")
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
    PROBED["vllm"] = run_probes(f"vllm {ident.version}", probes(backend, gdn, mamba2, utils, kv))
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
def _config(eng: Engine, num_spec: int, capture_sizes: Sequence[int], max_num_seqs: int, v2: bool = False) -> Any:
    """A ``VllmConfig``-shaped namespace: exactly the attributes the two builders read (listed by the
    research prototype's recording config), with what a full-and-piecewise cudagraph deployment on
    ``mamba_cache_mode="none"`` holds. ``capture_sizes`` count tokens, as vLLM's do; ``v2``: the
    deployment runs Model Runner V2 (``use_v2_model_runner``)."""
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
        use_v2_model_runner=v2,
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


def _extend_order_v2(batch: Batch) -> list[int]:
    """MRV2's row order of a prompt batch (``sort_batch_req_ids``, ``worker/gpu/model_runner.py:2507-2519``,
    no row has drafts and ``decode_query_len`` is 1): one-token rows first, then by token count; stable."""
    assert batch.extend_lens is not None
    ext = batch.extend_lens.tolist()
    return sorted(range(batch.raw_batch_size), key=lambda i: (ext[i] != 1, ext[i]))


def _decode_drafts(
    runner: str, query_lens: Sequence[int], is_prefilling: Sequence[bool], drafts: Sequence[int], num_spec: int
) -> list[int]:
    """The runner's ``num_decode_draft_tokens`` of live rows (a row's scheduled tokens, whether it is still in
    its prompt, its draft count). v2 (``mamba_hybrid.py:284-302``): the draft count of every decode row (not
    prefilling, ``0 < scheduled <= num_spec + 1``), else -1. v1 (``gpu_model_runner.py:2205-2226``): the
    draft count where scheduled is exactly drafts + 1 (a row without drafts: one token, past its prompt),
    else -1. They differ where a row's drafts were cut short (scheduled < drafts + 1)."""
    out = []
    for q, pre, k in zip(query_lens, is_prefilling, drafts, strict=True):
        if runner == "v2":
            out.append(k if not pre and 0 < q <= num_spec + 1 else -1)
        else:
            out.append(k if q == k + 1 and (k > 0 or not pre) else -1)
    return out


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
    state_fields: tuple[str, ...] = ()


_LAYERS: dict[str, _Layer] = {
    GDN: _Layer(
        "GDNAttentionMetadataBuilder", ("model.layers.0.linear_attn",), ((2048, 3), (8, 128, 128)), "GDN_ATTN",
        _gdn_fields, decode_query_start_loc=True,
        state_fields=("non_spec_state_indices_tensor", "spec_state_indices_tensor", "prefill_state_indices"),
    ),
    MAMBA2: _Layer(
        "Mamba2AttentionMetadataBuilder", ("model.layers.0.mixer",), ((4096 + 2 * 128, 3), (64, 64, 128)),
        "MAMBA2", _mamba2_fields, decode_query_start_loc=False,
        state_fields=("state_indices_tensor_d", "state_indices_tensor_p"),
    ),
}  # fmt: skip
"""The workbench layers (names of ``workbench.layers.LAYERS``) vLLM 0.33.0 has a builder for."""


# -- a second KV-cache group ----------------------------------------------------------------------------
@dataclass(frozen=True)
class GroupCheck:
    """A second KV-cache group's state indices (:meth:`Adapter.second_group`): ``got``, as the runner makes
    them (``via`` ``"update_block_table"`` or ``"build"``), and ``built``, ``build()`` on a CAM with the
    group's own block table; per field of the layer's metadata (``_Layer.state_fields``), in the runner's
    row order; None where the metadata has none."""

    mode: str
    bucket: int | None
    via: str
    built: dict[str, torch.Tensor | None]
    got: dict[str, torch.Tensor | None]

    def difference(self) -> tuple[str, int | None, Any, Any] | None:
        """The first field where ``got`` and ``built`` differ: (field, row or None for presence/shape/dtype,
        build's value, the runner's); None when they agree bitwise."""
        for name, want in self.built.items():
            have = self.got[name]
            if want is None and have is None:
                continue
            if want is None or have is None:
                return name, None, "none" if want is None else "a tensor", "none" if have is None else "a tensor"
            if want.shape != have.shape or want.dtype != have.dtype:
                return name, None, f"{tuple(want.shape)} {want.dtype}", f"{tuple(have.shape)} {have.dtype}"
            if not torch.equal(want, have):
                unequal = (want != have).reshape(want.shape[0], -1).any(dim=1)
                row = int(unequal.nonzero()[0, 0])
                return name, row, want[row].tolist(), have[row].tolist()
        return None


def _snapshot(md: Any, names: Sequence[str]) -> dict[str, torch.Tensor | None]:
    """The named tensors of a builder's metadata, copied (they may view the builder's cudagraph buffers)."""
    out: dict[str, torch.Tensor | None] = {}
    for name in names:
        value = getattr(md, name)
        out[name] = None if value is None else value.detach().cpu().clone()
    return out


def _ints(values: Sequence[int] | torch.Tensor) -> list[int]:
    return [int(v) for v in (values.tolist() if isinstance(values, torch.Tensor) else values)]


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
        runner: ``"v2"`` (Model Runner V2, vLLM's default) or ``"v1"``: which runner's inputs the adapter
            emulates (the module docstring says what differs).

    Attributes:
        builder: the engine's builder of decode, extend and idle steps (no speculation).
        spec_builder: the builder of target-verify steps (``num_speculative_tokens = D - 1``), or None when
            ``D < 2``: vLLM verifies at least one draft token.
        runner: the emulated runner.
        accepted: v2: int32 ``[pool rows]``, the accepted count of each request-pool row (V2's
            ``num_accepted_tokens_gpu``); None under v1.
    """

    engine = "vllm"
    version = "0.33.0"
    layers = tuple(_LAYERS)
    no_tree = (
        "verifies chains of drafts only (vLLM removed tree attention; 0.33 has no tree-attention backend), so "
        "there is no tree to check"
    )
    RUNNERS = ("v2", "v1")

    def __init__(
        self,
        pool: StatePool,
        buckets: Sequence[int],
        draft_tokens: int = 2,
        *,
        layer: str = DEFAULT_LAYER,
        backend_class: type | None = None,
        runner: str = "v2",
        topk: int = 1,
    ) -> None:
        super().__init__(pool, buckets, draft_tokens, layer=layer, backend_class=backend_class, topk=topk)
        if runner not in self.RUNNERS:
            raise EngineError(f"runner: {runner!r} is not one of {self.RUNNERS} (vLLM's model runners)")
        self.runner = runner
        if pool.profile.name != self.profile:
            raise EngineError(f"pool: vllm builds for a {self.profile!r}-profile pool, got {pool.profile.name!r}")
        if not self.buckets:
            raise EngineError("buckets: vllm captures at least one batch size")
        self.eng = load()
        self.device = torch.device(pool.device)
        self.builder = self._make_builder(0)
        self.spec_builder = self._make_builder(draft_tokens - 1) if draft_tokens >= 2 else None
        rows = pool.mapping.shape[0]
        self.accepted = torch.ones(rows, dtype=torch.int32) if runner == "v2" else None
        self._group_builders: dict[tuple[int, str], Any] = {}

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
            order = self._extend_order(batch)
            rows = self._rows(batch, order)
            cam = _cam(self.eng, rows, self.device, sum(rows.query_lens))
            fields = self._complete(self._fields(self.builder.build(0, cam), spec=False), cam)
            meta = self._metadata(batch, self._in_batch_order(fields, order), None)
        else:
            rows = self._rows(batch)
            meta = self._build(batch, rows, len(rows.query_lens), None)
        self._stepped(batch)
        return meta

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
        meta = self._build(batch, _pad(self._rows(batch), bucket, self.eng.NULL_BLOCK_ID), bucket, bucket)
        self._stepped(batch)
        return meta

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

    # -- Model Runner V2's request-state store of accepted counts -----------------------------------------
    def add_request(self, rows: Sequence[int] | torch.Tensor) -> None:
        """V2's ``add_request``: request-pool ``rows`` hold new requests, their accepted count is 1 again."""
        store = self._store("add_request")
        for r in _ints(rows):
            store[r] = 1

    def postprocess(self, rows: Sequence[int] | torch.Tensor, num_sampled: int | Sequence[int] | torch.Tensor) -> None:
        """V2's ``postprocess_state`` after a step: each request-pool row's count becomes ``max(n, 1)`` (a
        chunked prompt samples 0); rows -1 are skipped. ``num_sampled``: one int for all rows, or one per row."""
        store = self._store("postprocess")
        rs = _ints(rows)
        ns = [int(num_sampled)] * len(rs) if isinstance(num_sampled, int) else _ints(num_sampled)
        if len(ns) != len(rs):
            raise EngineError(f"num_sampled: {len(ns)} values for {len(rs)} rows")
        for r, n in zip(rs, ns, strict=True):
            if n < 0:
                raise EngineError(f"num_sampled: {n} for row {r}; a step samples 0 or more tokens")
            if r >= 0:
                store[r] = max(n, 1)

    def _store(self, what: str) -> torch.Tensor:
        if self.accepted is None:
            raise EngineError(
                f"{what}: runner {self.runner!r} keeps no request-state store (Model Runner V2's); v1 takes the "
                "accepted counts from the batch"
            )
        return self.accepted

    def _accepted_of(self, batch: Batch, idx: list[int]) -> list[int]:
        """The live rows' ``num_accepted_tokens`` for a verify step. v1: the batch's, else 1. v2: the batch's
        counts (if any) written into the store first, then the store gathered through ``idx_mapping``."""
        given = None if batch.num_accepted_tokens is None else [int(batch.num_accepted_tokens[i]) for i in idx]
        if self.accepted is None:
            return [1] * len(idx) if given is None else given
        rows = [int(batch.req_pool_indices[i]) for i in idx]
        if given is not None:
            self.postprocess(rows, given)
        return [int(v) for v in self.accepted[rows]]

    def _stepped(self, batch: Batch) -> None:
        """After a step the adapter built: V2's postprocess of one sampled token per live row (v2 only)."""
        if self.accepted is not None and batch.raw_batch_size:
            self.postprocess(batch.req_pool_indices.tolist(), 1)

    def _extend_order(self, batch: Batch) -> list[int]:
        return _extend_order_v2(batch) if self.runner == "v2" else _extend_order(batch)

    def _spec_kwargs(self, rows: Rows, spec: bool) -> dict[str, torch.Tensor]:
        """The runner's spec-decode counts for ``build`` (a spec deployment, not capturing), else nothing."""
        if not spec:
            return {}
        assert rows.num_accepted is not None and rows.num_draft is not None
        return {
            "num_accepted_tokens": torch.tensor(rows.num_accepted, dtype=torch.int32, device=self.device),
            "num_decode_draft_tokens_cpu": torch.tensor(rows.num_draft, dtype=torch.int32),
        }

    # -- a second KV-cache group --------------------------------------------------------------------------
    def second_block_table(self, seed: int = 0) -> torch.Tensor:
        """A second KV-cache group's block table, int32 ``[pool rows, slots_per_request]``: one row per
        request-pool row. vLLM's groups share one block pool, so the same request holds other block ids in
        another group: here distinct ids from ``pool.num_slots`` up (never the null block 0, none of the
        first group's slots), shuffled by ``seed``."""
        shape = tuple(self.pool.mapping.shape)
        g = torch.Generator().manual_seed(seed)
        ids = torch.randperm(shape[0] * shape[1], generator=g) + self.pool.num_slots
        return ids.reshape(shape).to(torch.int32)

    def second_group(self, batch: Batch, bucket: int | None = None, table: torch.Tensor | None = None) -> GroupCheck:
        """A step of two KV-cache groups of this layer's spec: the first group's metadata with ``build``, then
        the second group's as the runner makes it (``update_block_table`` on the first group's metadata with
        ``table``, or ``build`` where vLLM builds: module docstring), beside ``build`` on a CAM that carries
        ``table`` (the reference). ``bucket``: padded to it, as before a replay (decode and verify); None: the
        eager step. ``table``: int32 ``[pool rows, >= width]`` (default :meth:`second_block_table`). Rows are in
        the runner's order (an extend batch reordered)."""
        self._check_batch(batch)
        mode = batch.mode
        if mode == "idle":
            raise EngineError("second_group: an idle step has no rows (a dummy run builds on the null block)")
        if bucket is not None:
            if mode == "extend":
                raise EngineError("vllm captures full cudagraphs of decode and verify steps only; extend runs eagerly")
            self._check_bucket(bucket, batch.raw_batch_size)
        second = self.second_block_table() if table is None else table
        order = self._extend_order(batch) if mode == "extend" else None
        rows = self._rows(batch, order)
        rpi = batch.req_pool_indices.cpu()[list(range(batch.raw_batch_size)) if order is None else order]
        rows2 = Rows(
            rows.query_lens, rows.seq_lens, rows.is_prefilling,
            second.cpu()[rpi][:, : rows.block_table.shape[1]].to(torch.int32), rows.num_accepted, rows.num_draft,
        )  # fmt: skip
        if bucket is not None:
            rows, rows2 = _pad(rows, bucket, self.eng.NULL_BLOCK_ID), _pad(rows2, bucket, self.eng.NULL_BLOCK_ID)
        spec = mode == "target_verify"
        tokens = bucket * self._tokens_per_row(mode) if bucket is not None else sum(rows.query_lens)
        cam, cam2 = _cam(self.eng, rows, self.device, tokens), _cam(self.eng, rows2, self.device, tokens)
        kwargs = self._spec_kwargs(rows, spec)
        first = self._builder_for(mode).build(0, cam, **kwargs)
        names = _LAYERS[self.layer].state_fields
        reference = _snapshot(self._group_builder(mode, "reference").build(0, cam2, **kwargs), names)
        builder = self._group_builder(mode, "second")
        via = "update_block_table" if self._reuses(builder) else "build"
        if via == "build":
            got = builder.build(0, cam2, **kwargs)
        else:
            got = builder.update_block_table(first, cam2.block_table_tensor, cam2.slot_mapping)
        self._stepped(batch)
        return GroupCheck(mode, bucket, via, reference, _snapshot(got, names))

    def _group_builder(self, mode: str, role: str) -> Any:
        """Another builder of the same class and deployment as ``mode``'s (vLLM makes one per attention
        group): ``"second"``, the second group's; ``"reference"``, the one that builds the second table."""
        num_spec = self.draft_tokens - 1 if mode == "target_verify" else 0
        self._builder_for(mode)  # refuses D < 2 for verify
        key = (num_spec, role)
        if key not in self._group_builders:
            self._group_builders[key] = self._make_builder(num_spec)
        return self._group_builders[key]

    def _reuses(self, builder: Any) -> bool:
        """Whether vLLM's runner calls ``update_block_table`` for this builder (module docstring). GDN's own
        flag also needs CUDA, set aside here: MRV2 and the exact class decide."""
        if isinstance(builder, self.eng.GDNAttentionMetadataBuilder):
            return self.runner == "v2" and type(builder) is self.eng.GDNAttentionMetadataBuilder
        return bool(builder.supports_update_block_table)

    # -- builders -----------------------------------------------------------------------------------------
    def _make_builder(self, num_spec: int) -> Any:
        cls = self.backend_class or getattr(self.eng, _LAYERS[self.layer].builder)
        tokens = num_spec + 1
        v2 = self.runner == "v2"
        config = _config(self.eng, num_spec, [b * tokens for b in self.buckets], max(self.buckets), v2)
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
            acc = self._accepted_of(batch, idx)
            drafts = _decode_drafts(self.runner, [d] * n, [False] * n, [d - 1] * n, d - 1)
            return Rows([d] * n, seq, [False] * n, table.to(torch.int32), num_accepted=acc, num_draft=drafts)
        return Rows([1] * n, seq, [False] * n, table.to(torch.int32))

    def _build(self, batch: Batch, rows: Rows, num_rows: int, bucket: int | None) -> Metadata:
        """``build(0, cam, ...)`` of decode / verify rows (padded or not) -> Metadata."""
        mode, spec = batch.mode, batch.mode == "target_verify"
        tokens = num_rows * self._tokens_per_row(mode) if bucket is not None else sum(rows.query_lens)
        cam = _cam(self.eng, rows, self.device, tokens)
        md = self._builder_for(mode).build(0, cam, **self._spec_kwargs(rows, spec))
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
