"""sglang 0.5.23's own linear-attention metadata code (``MambaAttnBackendBase`` and its subclasses) on a CPU.

The engine's classes are built as its model runner builds them and fed a workbench
:class:`~workbench.batch.Batch` as its model runner and cuda-graph runner feed them:

- eager: a real ``ForwardBatch`` -> ``init_forward_metadata``;
- replay: the ``SimpleNamespace`` view ``decode_cuda_graph_runner.build_replay_fb_view`` hands to
  ``init_forward_metadata_out_graph``, over padded input buffers filled by the runner's registry policy
  (``cuda_graph_buffer_registry.build_decode_registry``: ``req_pool_indices`` ZERO, ``seq_lens`` and
  ``seq_lens_cpu`` FILL_SENTINEL with the backend's ``get_cuda_graph_seq_len_fill_value()``,
  ``num_padding = bucket - r``);
- capture: the runner's capture ``ForwardBatch`` (``capture_prepare`` after ``reset_index_buffers``: all-zero
  ``req_pool_indices``, ``seq_lens`` at the fill value) -> ``init_forward_metadata_out_graph(fb,
  in_capture=True)``.

What the engine computes (``ForwardMetadata.mamba_cache_indices``, ``query_start_loc``; Mamba2's
``mixed_metadata.has_initial_states``; GDN's verify intermediate rows) is copied into a workbench
:class:`~workbench.metadata.Metadata`. Nothing is caught: an error the engine raises reaches the caller
unchanged.

Nothing here imports sglang until :func:`load` runs, so the module imports (and type-checks) in an
environment without the engine. What stands in for what, and why, is in :data:`STANDIN_PACKAGES`,
:data:`STANDIN_MODULES`, :data:`REBINDINGS` and :data:`STANDIN_OBJECTS`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import sys
import types
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from workbench.batch import Batch
from workbench.buckets import resolve_bucket
from workbench.engines import sglang_tree
from workbench.engines.base import EngineAdapter
from workbench.engines.identity import identify
from workbench.engines.probes import Probe, config_leaves, fields, has, required_fields, run_probes, takes
from workbench.engines.standins import NoActiveDriver, StandinFinder, install, module
from workbench.engines.versions import EngineError
from workbench.errors import MetadataError
from workbench.layer_names import DEFAULT_LAYER, GDN, KDA, MAMBA2
from workbench.metadata import DraftTree, Metadata
from workbench.pool import StatePool
from workbench.profiles import get_profile

VERSION = "0.5.23"

PROBED: dict[str, int] = {}
"""Engine -> how many probes its last :func:`load` ran (all passed); ``"sglang tree"``: :func:`load_tree`'s."""

BACKENDS = {GDN: "GDNAttnBackend", MAMBA2: "Mamba2AttnBackend", KDA: "KDAAttnBackend"}
"""The workbench layers (names of ``workbench.layers.LAYERS``) sglang has a backend for, and its class."""

STANDIN_PACKAGES: tuple[tuple[str, str], ...] = (
    ("triton", "imported at module level by sglang's FLA and Mamba kernel files; on a CPU its device probe falls back"),
    ("torchvision", "imported at module level by sglang.srt.multimodal.internvl_utils (config registry chain)"),
    ("tvm_ffi", "imported at module level by sglang.kernels.ops.communication.all_reduce"),
    ("sgl_kernel_npu", "Ascend kernels, imported at module level by the Ascend backends (load_ascend only)"),
)
"""Device-only packages served by :class:`~workbench.engines.standins.StandinFinder`, each only when it is
not really installed (a real triton is used as it is)."""

STANDIN_MODULES: tuple[tuple[str, str], ...] = (
    ("sglang", "a shell package over the installed tree: sglang/__init__.py is the frontend DSL (openai, IPython)"),
    (
        "sglang.srt.model_executor.model_runner",
        "ModelRunner is only an annotation in the backend files; the real module imports the whole server",
    ),
)
"""Engine modules replaced by plain modules (:func:`workbench.engines.standins.module`)."""

REBINDINGS: tuple[tuple[str, str], ...] = (
    (
        "get_spec / get_memory / get_exec / get_schedule in the backend modules",
        "runtime_context getters, unpublished without a server; bound by name, so rebound where imported "
        "(values: STANDIN_CONFIG)",
    ),
    (
        "sglang.srt.utils.common.get_eager_max_batch_size",
        "identity: it reads the unpublished parallel topology; no DP attention here",
    ),
    (
        "sglang.srt.model_executor.forward_batch_info.mamba_cache_chunk_size",
        "-> 64 (FLA chunk, page size 1): it reads the unpublished ServerArgs",
    ),
)
"""Functions of the engine replaced by the adapter, and why."""

STANDIN_OBJECTS: tuple[tuple[str, str], ...] = (
    ("model_runner", "an attribute bag: server_args.enable_mis False, device cpu, not a draft worker, the pool"),
    (
        "req_to_token_pool",
        "a REAL HybridReqToTokenPool built without __init__: req_index_to_mamba_index_mapping is pool.mapping[:, 0]",
    ),
    ("req_to_token_pool.mamba_pool", "an attribute bag: size, ReplaySSM off, conv/temporal shapes without memory"),
    ("spec_info", "an attribute bag: draft_token_num D, topk 1, dense (not ragged) verify layout"),
    (
        "spec_info (--topk K > 1)",
        "a REAL EagleVerifyInput, as the EAGLE worker hands a tree verify to the model runner: the batch's tree as "
        "int64 retrieve_next_token / retrieve_next_sibling [r, D] (build_tree_kernel_efficient's layout), topk K; "
        "at capture the graph runner's (links None)",
    ),
)
"""Engine objects the adapter builds (what the model runner would hold)."""

STANDIN_CONFIG: dict[str, dict[str, Any]] = {
    "get_spec()": {"speculative_eagle_topk": None, "speculative_algorithm": None},
    "get_memory()": {
        "enable_unified_memory": False,
        "enable_page_major_kv_layout": False,
        "disable_radix_cache": False,
    },
    "get_exec()": {
        "features": {"enable_mis": False},
        "deterministic": {"enable_deterministic_inference": False},
        "mamba": {
            "mamba_track_interval": 256,
            "enable_mamba_extra_buffer": False,
            "enable_linear_replayssm_spec": False,
        },
        "overlap": {"enable_two_batch_overlap": False},
        "graph": {"cuda_graph_config": {"prefill": {"backend": None}}},
    },
    "get_schedule()": {},
}
"""The runtime-config leaves the backends read, as a server without speculation tree, MIS or unified memory
publishes them (an adapter built with ``topk`` K > 1 publishes ``speculative_eagle_topk`` K: :func:`published`).
A leaf not listed raises ``AttributeError`` naming it. KDA's ``speculative_algorithm``, ``disable_radix_cache``,
``enable_linear_replayssm_spec``, ``enable_two_batch_overlap`` and the prefill graph backend are read only behind
its FlashInfer kernels (CUDA), never on the CPU's Triton path: they carry the values of a server without those
features, so the probe finds every leaf the driven code can read answered."""

_CONFIG_GETTERS = ("get_spec", "get_memory", "get_exec", "get_schedule")
_PUBLISHED: dict[str, dict[str, Any]] = {}
"""Leaves a running adapter publishes over :data:`STANDIN_CONFIG` (:func:`published`)."""
_MAMBA_CHUNK = 64
_IMPORT_WARNINGS: list[str] = []


class Bag:
    """A read-only attribute bag for engine objects: a missing attribute raises ``AttributeError`` naming it,
    so an engine read the adapter does not provide is never answered with a made-up value."""

    def __init__(self, label: str, **attrs: Any) -> None:
        object.__setattr__(self, "_label", label)
        object.__setattr__(self, "_attrs", attrs)

    def __getattr__(self, name: str) -> Any:
        attrs = object.__getattribute__(self, "_attrs")
        if name in attrs:
            return attrs[name]
        label = object.__getattribute__(self, "_label")
        raise AttributeError(f"{label} (workbench stand-in) has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        object.__getattribute__(self, "_attrs")[name] = value

    def __repr__(self) -> str:
        return f"<stand-in {object.__getattribute__(self, '_label')}>"


def _config(label: str, leaves: dict[str, Any]) -> Bag:
    return Bag(label, **{k: _config(f"{label}.{k}", v) if isinstance(v, dict) else v for k, v in leaves.items()})


@dataclass(frozen=True)
class Engine:
    """The imported engine: the classes and modules the adapter drives (``Any``: sglang is optional)."""

    gdn: Any  # GDNAttnBackend
    kda: Any  # KDAAttnBackend
    mamba2: Any  # Mamba2AttnBackend
    forward_batch: Any  # ForwardBatch
    forward_mode: Any  # ForwardMode
    hybrid_pool: Any  # HybridReqToTokenPool
    linear_attn_backends: Any  # LinearAttnBackends
    kernel_backend: Any  # LinearAttnKernelBackend
    select_verify_intermediate: Any  # select_verify_intermediate_state_indices
    modules: tuple[types.ModuleType, ...]


def _finder() -> StandinFinder:
    """The stand-in finder for the device-only packages that are not really installed."""
    absent = tuple(name for name, _ in STANDIN_PACKAGES if importlib.util.find_spec(name) is None)
    return StandinFinder(
        absent,
        explicit={
            "triton": {"__version__": "3.6.0"},
            "torchvision": {"__version__": "0.28.0"},
            "triton.runtime": {"driver": NoActiveDriver()},
        },
        submodules={
            "triton": {"runtime", "language", "compiler", "backends", "testing"},
            "triton.language": {"extra", "core", "math"},
        },
    )


def _install_shells() -> None:
    """The shell ``sglang`` package and the annotation-only model-runner module (:data:`STANDIN_MODULES`)."""
    if "sglang" not in sys.modules:
        spec = importlib.util.find_spec("sglang")
        if spec is None or spec.submodule_search_locations is None:
            raise EngineError("sglang is not installed as a package (make engines installs it)")
        shell = types.ModuleType("sglang")
        shell.__path__ = list(spec.submodule_search_locations)
        shell.__file__ = spec.origin
        sys.modules["sglang"] = shell
    name = "sglang.srt.model_executor.model_runner"
    if name not in sys.modules:
        module(name, ModelRunner=type("ModelRunner", (), {"__module__": name}))


def _import(name: str) -> types.ModuleType:
    """Import an engine module; a missing third-party package becomes one :class:`EngineError` line."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            # import-time warnings of the chain (deprecations, "Triton is not supported ... roll back to CPU")
            # are kept in import_warnings(), not raised: they are not the metadata code's
            warnings.simplefilter("always")
            mod = importlib.import_module(name)
        _IMPORT_WARNINGS.extend(f"{w.category.__name__}: {w.message}" for w in caught)
        return mod
    except ModuleNotFoundError as e:
        top = (e.name or "").split(".")[0]
        if top in ("", "sglang"):
            raise
        raise EngineError(
            f"sglang {identify('sglang').version} needs the Python package {top!r} to import {name} (make engines "
            "installs it)"
        ) from e


@functools.cache
def _answer(getter: str, published: tuple[tuple[str, Any], ...]) -> Bag:
    """What ``getter()`` returns: :data:`STANDIN_CONFIG`'s leaves, ``published`` over them (one bag per value)."""
    return _config(f"{getter}()", {**STANDIN_CONFIG[f"{getter}()"], **dict(published)})


def _getter(getter: str) -> Any:
    def read() -> Bag:
        return _answer(getter, tuple(sorted(_PUBLISHED.get(f"{getter}()", {}).items())))

    read.__qualname__ = f"standin_{getter}"
    return read


def bind_config(namespace: dict[str, Any]) -> None:
    """Rebind the runtime-config getters a module's ``namespace`` imported by name from
    ``sglang.srt.runtime_context`` (:data:`REBINDINGS`); a function of another origin is left alone."""
    context = sys.modules.get("sglang.srt.runtime_context")
    for getter in _CONFIG_GETTERS:
        if context is not None and namespace.get(getter) is getattr(context, getter, object()):
            namespace[getter] = _getter(getter)


@contextlib.contextmanager
def published(topk: int) -> Iterator[None]:
    """While the block runs, the config reads answer as a server started with ``--speculative-eagle-topk topk``
    (topk 1: :data:`STANDIN_CONFIG` as it is, ``speculative_eagle_topk`` None, as today's chain checks ran)."""
    saved = {k: dict(v) for k, v in _PUBLISHED.items()}
    if topk > 1:
        _PUBLISHED["get_spec()"] = {"speculative_eagle_topk": topk}
    else:
        _PUBLISHED.pop("get_spec()", None)
    try:
        yield
    finally:
        _PUBLISHED.clear()
        _PUBLISHED.update(saved)


def _class_globals(cls: type) -> list[dict[str, Any]]:
    """The module namespaces the methods of ``cls`` and its bases run in (a user's copy loaded from a file
    need not be in ``sys.modules``, so they are read from the functions)."""
    spaces: dict[int, dict[str, Any]] = {}
    for klass in cls.__mro__:
        for value in vars(klass).values():
            func = getattr(value, "__func__", value)
            glob = getattr(func, "__globals__", None)
            if isinstance(glob, dict):
                spaces[id(glob)] = glob
    return list(spaces.values())


FORWARD_BATCH_FIELDS = (
    "forward_mode", "batch_size", "req_pool_indices", "seq_lens", "seq_lens_cpu", "seq_lens_sum", "out_cache_loc",
    "extend_seq_lens", "extend_prefix_lens", "extend_start_loc", "extend_seq_lens_cpu", "extend_prefix_lens_cpu",
    "extend_num_tokens", "input_ids", "positions", "spec_info",
)  # fmt: skip
"""The ``ForwardBatch`` fields the adapter sets (``_eager_batch``, ``_capture_batch``): each must be one."""


DRIVEN_METHODS = (
    "__init__", "init_cuda_graph_state", "get_cuda_graph_seq_len_fill_value", "init_forward_metadata",
    "init_forward_metadata_out_graph",
)  # fmt: skip
"""The backend methods the adapter calls: the code reached from them is what its probes look at."""


def _table_as_is(table: torch.Tensor, req_pool_indices: torch.Tensor, valid: torch.Tensor, size: int) -> torch.Tensor:
    """sglang 0.5.21's verify intermediate rows: the backend's table itself (0.5.22 added
    ``select_verify_intermediate_state_indices``, which returns the table unless stable PP rows are on)."""
    return table


def probes(hlab: Any, gdnb: Any, utils: Any, fbi: Any, pools: Any, metadata: Any, kdab: Any) -> list[Probe]:
    """What the adapter needs of the imported sglang (:mod:`workbench.engines.probes`): the hooks it calls
    with the parameters it passes, the ``ForwardBatch`` fields it sets, the pool's mapping, the forward
    metadata fields it reads, the config leaves the backend files read."""
    is_dc = dataclasses.is_dataclass(fbi.ForwardBatch)
    fb_fields = {f.name for f in dataclasses.fields(fbi.ForwardBatch)} if is_dc else set()
    out = [
        Probe("the GDN backend", has(gdnb, "GDNAttnBackend")),
        Probe("the Mamba2 backend", has(hlab, "Mamba2AttnBackend")),
        Probe("the KDA backend", has(kdab, "KDAAttnBackend")),
    ]
    if not all(
        hasattr(m, n) for m, n in ((gdnb, "GDNAttnBackend"), (hlab, "Mamba2AttnBackend"), (kdab, "KDAAttnBackend"))
    ):
        return out  # they fail; nothing below can be asked
    backends = (gdnb.GDNAttnBackend, hlab.Mamba2AttnBackend, kdab.KDAAttnBackend)
    for cls in backends:
        name = cls.__name__
        out += [
            Probe(f"{name}(model_runner)", takes(cls, "model_runner")),
            Probe(f"{name}.init_forward_metadata(forward_batch)", takes(cls.init_forward_metadata, "forward_batch")),
            Probe(
                f"{name}.init_forward_metadata_out_graph(forward_batch, in_capture)",
                takes(cls.init_forward_metadata_out_graph, "forward_batch", "in_capture"),
            ),
            Probe(
                f"{name}.init_cuda_graph_state and its seq-len fill value",
                has(cls, "init_cuda_graph_state", "get_cuda_graph_seq_len_fill_value"),
            ),
        ]
    return out + [
        Probe(
            "ForwardBatch has the fields the adapter sets",
            lambda: (
                f"ForwardBatch has no field {', '.join(n for n in FORWARD_BATCH_FIELDS if n not in fb_fields)}"
                if not set(FORWARD_BATCH_FIELDS) <= fb_fields
                else None
            ),
        ),
        Probe("ForwardMode's modes", has(fbi.ForwardMode, "DECODE", "TARGET_VERIFY", "EXTEND", "IDLE")),
        Probe(
            "the forward metadata has mamba_cache_indices and query_start_loc",
            fields(metadata.ForwardMetadata, "mamba_cache_indices", "query_start_loc"),
        ),
        Probe(
            "HybridReqToTokenPool maps request rows to mamba slots",
            has(pools.HybridReqToTokenPool, "get_mamba_indices"),
        ),
        Probe("the linear-attention kernel tables", has(utils, "LinearAttnBackends", "LinearAttnKernelBackend")),
        Probe(
            "the config leaves the driven backend code reads are stood in",
            config_leaves(
                [(cls, DRIVEN_METHODS) for cls in backends],
                _CONFIG_GETTERS,
                STANDIN_CONFIG,
                package="sglang.",
            ),
        ),
    ]


@functools.cache
def load() -> Engine:
    """Import sglang's metadata code with its stand-ins (once per process) and run the adapter's probes.

    The engine is the one :func:`~workbench.engines.identity.identify` names (a tree chosen with
    ``--engine-root``, else the installed one): a verified release or any build whose probes pass. Raises
    :class:`EngineError` when sglang is absent, a probe fails (naming it) or a pure-Python dependency is
    missing (naming it and ``make engines``).
    """
    ident = identify("sglang")
    install(_finder())
    _install_shells()
    hlab = _import("sglang.srt.layers.attention.hybrid_linear_attn_backend")
    gdnb = _import("sglang.srt.layers.attention.linear.gdn_backend")
    utils = _import("sglang.srt.layers.attention.linear.utils")
    common = _import("sglang.srt.utils.common")
    fbi = _import("sglang.srt.model_executor.forward_batch_info")
    pools = _import("sglang.srt.mem_cache.memory_pool")
    metadata = _import("sglang.srt.layers.attention.mamba.mamba2_metadata")
    kdab = _import("sglang.srt.layers.attention.linear.kda_backend")
    found = probes(hlab, gdnb, utils, fbi, pools, metadata, kdab)
    PROBED["sglang"] = run_probes(f"sglang {ident.version}", found)
    for mod in (hlab, gdnb, kdab):
        bind_config(vars(mod))
    setattr(common, "get_eager_max_batch_size", lambda max_batch_size: max_batch_size)  # noqa: B010
    setattr(fbi, "mamba_cache_chunk_size", lambda: _MAMBA_CHUNK)  # noqa: B010
    return Engine(
        gdn=gdnb.GDNAttnBackend,
        kda=kdab.KDAAttnBackend,
        mamba2=hlab.Mamba2AttnBackend,
        forward_batch=fbi.ForwardBatch,
        forward_mode=fbi.ForwardMode,
        hybrid_pool=pools.HybridReqToTokenPool,
        linear_attn_backends=utils.LinearAttnBackends,
        kernel_backend=utils.LinearAttnKernelBackend,
        select_verify_intermediate=getattr(utils, "select_verify_intermediate_state_indices", _table_as_is),
        modules=(hlab, gdnb, utils, common, fbi, pools),
    )


@functools.cache
def load_ascend() -> tuple[Any, Any]:
    """``(AscendMamba2AttnBackend, AscendGDNAttnBackend)``, imported with the ``sgl_kernel_npu`` stand-in."""
    load()
    base = _import("sglang.srt.hardware_backend.npu.attention.ascend_hybrid_linear_attn_backend")
    gdn = _import("sglang.srt.hardware_backend.npu.attention.ascend_gdn_backend")
    for mod in (base, gdn):
        bind_config(vars(mod))
    return base.AscendMamba2AttnBackend, gdn.AscendGDNAttnBackend


@dataclass(frozen=True)
class TreeEngine:
    """What a tree verify (``topk`` > 1) needs of sglang beside :class:`Engine` (``Any``: sglang is optional)."""

    verify_input: Any  # EagleVerifyInput
    hidden_mode: Any  # CaptureHiddenMode
    conv: types.ModuleType  # causal_conv1d_triton: the parents' derivation
    speculative_state: Any  # MambaPool.SpeculativeState


VERIFY_INPUT_FIELDS = (
    "draft_token", "custom_mask", "positions", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling",
    "retrieve_cum_len", "spec_steps", "topk", "draft_token_num", "capture_hidden_mode", "seq_lens_sum",
    "seq_lens_cpu",
)  # fmt: skip
"""The ``EagleVerifyInput`` fields :func:`~workbench.engines.sglang_tree.verify_input` passes."""


def tree_probes(eagle: Any, conv: Any, fbi: Any, pools: Any, metadata: Any) -> list[Probe]:
    """What a tree verify needs of the imported sglang: the verify input's tree fields, the metadata's, the
    conv kernel that derives the parents (and takes the links), the verify state the Ascend forward reads."""
    return [
        Probe("EagleVerifyInput", has(eagle, "EagleVerifyInput")),
        Probe(
            "EagleVerifyInput carries a tree",
            fields(eagle.EagleVerifyInput, "retrieve_next_token", "retrieve_next_sibling", "topk", "draft_token_num"),
        ),
        Probe("EagleVerifyInput's required fields", required_fields(eagle.EagleVerifyInput, VERIFY_INPUT_FIELDS)),
        Probe("CaptureHiddenMode.FULL", has(fbi.CaptureHiddenMode, "FULL")),
        Probe("the forward metadata's tree fields", fields(metadata.ForwardMetadata, *sglang_tree.TREE_FIELDS)),
        Probe(
            "causal_conv1d_update(conv_state_indices, retrieve_next_token, retrieve_next_sibling, "
            "retrieve_parent_token)",
            takes(conv.causal_conv1d_update, "conv_state_indices", *sglang_tree.TREE_FIELDS),
        ),
        Probe(
            "MambaPool.SpeculativeState's verify state",
            fields(
                pools.MambaPool.SpeculativeState, "conv", "temporal", "intermediate_ssm", "intermediate_conv_window"
            ),
        ),
        Probe(
            "ForwardBatch.global_num_token_non_padded_cpu",
            fields(fbi.ForwardBatch, "global_num_token_non_padded_cpu"),
        ),
    ]


@functools.cache
def load_tree() -> TreeEngine:
    """The modules of a tree verify (after :func:`load`), probed (:func:`tree_probes`): what an adapter built
    with ``topk`` > 1 needs; a chain check never imports or probes them."""
    load()
    eagle = _import("sglang.srt.speculative.eagle_info")
    conv = _import("sglang.kernels.ops.mamba.causal_conv1d_triton")
    fbi = _import("sglang.srt.model_executor.forward_batch_info")
    pools = _import("sglang.srt.mem_cache.memory_pool")
    metadata = _import("sglang.srt.layers.attention.mamba.mamba2_metadata")
    ident = identify("sglang")
    PROBED["sglang tree"] = run_probes(f"sglang {ident.version}", tree_probes(eagle, conv, fbi, pools, metadata))
    return TreeEngine(eagle.EagleVerifyInput, fbi.CaptureHiddenMode, conv, pools.MambaPool.SpeculativeState)


def import_warnings() -> list[str]:
    """The warnings the engine's import chain raised (kept, not raised), each once."""
    return list(dict.fromkeys(_IMPORT_WARNINGS))


def is_ascend(backend_class: type) -> bool:
    """Whether ``backend_class`` derives from sglang's Ascend base (by name: a user's copy of the Ascend file,
    loaded as a module of its own, defines its own ``AscendMambaAttnBackendBase``)."""
    return any(c.__name__ == "AscendMambaAttnBackendBase" for c in backend_class.__mro__)


# -- the objects the model runner would hold -----------------------------------------------------------


def _hybrid_pool(engine: Engine, pool: StatePool) -> Any:
    """A real ``HybridReqToTokenPool`` over ``pool`` (built without ``__init__``, which would allocate the
    whole mamba pool): ``req_index_to_mamba_index_mapping`` is a view of ``pool.mapping[:, 0]`` (int32
    ``[rows]``), so later allocations are seen; ``size`` the request rows but the reserved one."""
    req_pool = object.__new__(engine.hybrid_pool)
    num_slots = pool.num_slots
    # shapes only (stride-0 views): the metadata code reads conv[0].shape and temporal.dtype, never values
    conv = torch.zeros(1).expand(1, num_slots, 1, 3)
    temporal = torch.zeros(1).expand(1, num_slots, 1, 1, 1)
    cache = Bag("mamba_pool.mamba_cache", conv=[conv], temporal=temporal, replayssm_rawv=None, replayssm_d=None)
    req_pool.__dict__.update(
        req_index_to_mamba_index_mapping=pool.mapping[:, 0],
        size=pool.mapping.shape[0] - 1,
        device="cpu",
        mamba_pool=Bag(
            "mamba_pool",
            size=num_slots - 1,  # sglang's mamba pool: slots 1..size, slot 0 its padding slot
            enable_linear_replayssm=False,
            replayssm_write_pos=None,
            replayssm_is_kda=False,
            mamba_cache=cache,
        ),
    )
    return req_pool


def _model_runner(engine: Engine, req_pool: Any) -> Bag:
    triton = engine.kernel_backend.TRITON
    return Bag(
        "model_runner",
        server_args=Bag("model_runner.server_args", enable_mis=False),
        device="cpu",
        is_draft_worker=False,
        req_to_token_pool=req_pool,
        token_to_kv_pool=None,
        linear_attn_backends=engine.linear_attn_backends(decode=triton, prefill=triton, verify=triton),
        model_config=Bag("model_runner.model_config", hf_text_config=types.SimpleNamespace(mamba_chunk_size=64)),
    )


def _spec_info(draft_tokens: int) -> Bag:
    """An EAGLE verify input as the metadata code reads it (chain drafts: topk 1, dense layout)."""
    return Bag(
        "spec_info",
        draft_token_num=draft_tokens,
        topk=1,
        ragged_verify_layout=None,
        retrieve_next_token=None,
        retrieve_next_sibling=None,
    )


def _links(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch``'s tree links, int64 ``[r, D]`` (a verify batch without a tree: the chain of its D drafts)."""
    tree = getattr(batch, "tree", None)
    if tree is None:
        tree = DraftTree.chain(batch.raw_batch_size, batch.draft_tokens)
    return tree.next_token.to(torch.int64), tree.next_sibling.to(torch.int64)


def _ints(values: torch.Tensor) -> list[int]:
    return [int(v) for v in values.tolist()]


def _extend_positions(prefix_lens: torch.Tensor, extend_lens: torch.Tensor) -> torch.Tensor:
    """int64 ``[sum(extend_lens)]``: each new token's position, after its request's cached prefix."""
    starts = torch.repeat_interleave(prefix_lens.to(torch.int64), extend_lens.to(torch.int64))
    first = torch.repeat_interleave(
        torch.cumsum(extend_lens.to(torch.int64), 0) - extend_lens, extend_lens.to(torch.int64)
    )
    return starts + torch.arange(starts.numel()) - first


class Adapter(EngineAdapter):
    """sglang 0.5.23's ``GDNAttnBackend`` / ``Mamba2AttnBackend`` (or ``backend_class``, a subclass of
    ``MambaAttnBackendBase``: a user's modified copy, or the Ascend classes) over a workbench pool.

    ``backend`` is the engine's own object. Its graph state is built once,
    ``init_cuda_graph_state(max(buckets), max(buckets) * draft_tokens)``, as the cuda-graph runner does.
    The pool must be on the CPU (the engine's CUDA fast path is a Triton kernel).
    """

    engine = "sglang"
    version = VERSION
    layers = tuple(BACKENDS)
    tree_verify = True

    def __init__(
        self,
        pool: StatePool,
        buckets: Sequence[int],
        draft_tokens: int = 2,
        *,
        layer: str = DEFAULT_LAYER,
        backend_class: type | None = None,
        topk: int = 1,
    ) -> None:
        super().__init__(pool, buckets, draft_tokens, layer=layer, backend_class=backend_class, topk=topk)
        if pool.device.type != "cpu":
            raise EngineError(f"the engine's metadata code runs on the CPU here; the pool is on {pool.device}")
        if pool.profile.dummy_slot != 0:
            raise EngineError(
                f"sglang reserves mamba slot 0 for padding; the pool's dummy slot is {pool.profile.dummy_slot}"
            )
        if not self.buckets:
            raise MetadataError("buckets: empty list; capture at least one batch size", field="buckets")
        self._engine = load()
        cls = backend_class or {GDN: self._engine.gdn, MAMBA2: self._engine.mamba2, KDA: self._engine.kda}[layer]
        for namespace in _class_globals(cls):  # a user's copy of a backend file imports the getters too
            bind_config(namespace)
        self._tree = load_tree() if topk > 1 else None
        self._req_pool = _hybrid_pool(self._engine, pool)
        with published(topk):  # the backend reads the server's topk in __init__
            self.backend: Any = cls(_model_runner(self._engine, self._req_pool))
        self.max_bs = max(self.buckets)
        self.backend.init_cuda_graph_state(self.max_bs, self.max_bs * draft_tokens)
        self.fill_value = int(self.backend.get_cuda_graph_seq_len_fill_value())
        self._buffers = self._runner_buffers()
        if self._tree is not None and self.derives_parents:
            why = sglang_tree.interpreted(self._tree.conv)
            if why is not None:
                raise EngineError(f"topk {topk}: {why}")

    # -- what the adapter is -----------------------------------------------------------------------------
    @property
    def profile(self) -> str:
        return "sglang-ascend" if is_ascend(type(self.backend)) else "sglang"

    @property
    def default_class_name(self) -> str:
        return BACKENDS[self.layer]

    @property
    def derives_parents(self) -> bool:
        """Whether the class's verify forward derives a tree's parents with sglang's conv kernel (GDN's, Mamba2's
        and KDA's CUDA forward do; the Ascend classes' forward calls no derivation, so their
        ``retrieve_parent_token`` stays as allocated: :mod:`workbench.engines.tree_check` says what their
        kernels get instead)."""
        return not is_ascend(type(self.backend))

    def compared_fields(self, mode: str) -> tuple[str, ...]:
        """``state_indices``, ``query_start_loc`` (the backend's), ``seq_lens`` and ``req_pool_indices`` (in a
        replay: the runner's padded buffers, filled with the backend's fill value and rewritten in place by
        ``_replay_metadata``); Mamba2's ``has_initial_state`` in extend; GDN's verify intermediate rows. With
        ``topk`` > 1, target_verify's tree links, and the parents where the forward derives them
        (:attr:`derives_parents`)."""
        out: tuple[str, ...] = ("state_indices", "query_start_loc", "seq_lens", "req_pool_indices")
        if mode == "extend" and isinstance(self.backend, self._engine.mamba2):
            out += ("has_initial_state",)
        if mode == "target_verify" and hasattr(self.backend, "verify_intermediate_state_indices"):
            out += ("intermediate_state_indices",)
        if mode == "target_verify" and self.topk > 1:
            out += sglang_tree.TREE_FIELDS if self.derives_parents else sglang_tree.TREE_FIELDS[:2]
        return out

    # -- the three paths -----------------------------------------------------------------------------------
    def eager(self, batch: Batch) -> Metadata:
        """``init_forward_metadata`` on a real ``ForwardBatch`` of ``batch`` (unpadded, ``bucket`` None)."""
        fb = self._eager_batch(batch)
        with published(self.topk):
            self.backend.init_forward_metadata(fb)
        meta = self.backend.forward_metadata
        init = self._initial_state(batch, meta)
        return self._metadata(batch.mode, batch, meta, batch.seq_lens, batch.req_pool_indices, init, bucket=None)

    def replay(self, batch: Batch, bucket: int) -> Metadata:
        """``init_forward_metadata_out_graph`` on the runner's replay view of ``batch`` padded to ``bucket``."""
        r = batch.raw_batch_size
        if batch.mode == "extend":
            raise MetadataError("mode: extend runs eagerly in sglang (no decode graph); use eager()", field="mode")
        if batch.mode == "target_verify" and batch.draft_tokens != self.draft_tokens:
            raise MetadataError(
                f"draft_tokens: the verify graphs were set up for D={self.draft_tokens}, "
                f"the batch has D={batch.draft_tokens}",
                field="draft_tokens",
            )
        bs = resolve_bucket(r, self.buckets, bucket)
        assert bs is not None  # an int bucket resolves to itself or raises
        view = self._replay_view(batch, bs)
        with published(self.topk):
            self.backend.init_forward_metadata_out_graph(view)
        init = torch.arange(bs) < r
        meta = self.backend.forward_metadata
        return self._metadata(batch.mode, batch, meta, view.seq_lens_cpu, view.req_pool_indices, init, bucket=bs)

    def capture(self, mode: str, bucket: int) -> Metadata:
        """``init_forward_metadata_out_graph(fb, in_capture=True)`` on the runner's capture batch."""
        bs = resolve_bucket(bucket, self.buckets, bucket)
        assert bs is not None
        batch = Batch.for_capture(mode, bs, self.draft_tokens)
        fb = self._capture_batch(batch)
        with published(self.topk):
            self.backend.init_forward_metadata_out_graph(fb, in_capture=True)
        init = torch.ones(bs, dtype=torch.bool)
        meta = self.backend.forward_metadata
        return self._metadata(mode, batch, meta, fb.seq_lens_cpu, fb.req_pool_indices, init, bucket=bs)

    # -- forward batches as the runners build them ---------------------------------------------------------
    def _mode(self, mode: str) -> Any:
        fm = self._engine.forward_mode
        return {"decode": fm.DECODE, "target_verify": fm.TARGET_VERIFY, "extend": fm.EXTEND, "idle": fm.IDLE}[mode]

    def _eager_batch(self, batch: Batch) -> Any:
        """A real ``ForwardBatch`` (built without ``__init__``; unset fields read the dataclass defaults)."""
        r, mode = batch.raw_batch_size, batch.mode
        seq = batch.seq_lens.to(torch.int64)
        d = batch.draft_tokens if mode == "target_verify" else 1
        fields: dict[str, Any] = {
            "forward_mode": self._mode(mode),
            "batch_size": r,
            "req_pool_indices": batch.req_pool_indices.clone(),
            "seq_lens": seq,
            "seq_lens_cpu": seq.clone(),
            "seq_lens_sum": int(seq.sum()),
            "out_cache_loc": None,
        }
        if mode == "extend":
            assert batch.extend_lens is not None and batch.prefix_lens is not None
            ext, pre = batch.extend_lens.to(torch.int32), batch.prefix_lens.to(torch.int32)
            start = torch.zeros(r, dtype=torch.int32)
            start[1:] = torch.cumsum(ext, 0)[:-1]
            n = int(ext.sum())
            fields.update(
                extend_seq_lens=ext,
                extend_prefix_lens=pre,
                extend_start_loc=start,
                extend_seq_lens_cpu=_ints(ext),
                extend_prefix_lens_cpu=_ints(pre),
                extend_num_tokens=n,
                input_ids=torch.zeros(n, dtype=torch.int64),
                positions=_extend_positions(pre, ext),
            )
        else:
            fields.update(input_ids=torch.zeros(r * d, dtype=torch.int64), positions=self._positions(seq, mode, d))
        if mode == "target_verify":
            fields["spec_info"] = self._verify_spec(batch, fields["positions"])
            if self._tree is not None:  # the runner's token count, read by Ascend's verify forward (verify_forward)
                fields["global_num_token_non_padded_cpu"] = r * d
        fb = object.__new__(self._engine.forward_batch)
        fb.__dict__.update(fields)
        return fb

    @staticmethod
    def _positions(seq: torch.Tensor, mode: str, d: int) -> torch.Tensor:
        if mode == "target_verify":  # the D draft tokens follow the committed ones
            return (seq.repeat_interleave(d) + torch.arange(d).repeat(seq.numel())).to(torch.int64)
        return (seq - 1).clamp(min=0)

    def _runner_buffers(self) -> dict[str, torch.Tensor]:
        """The runner's static input buffers (``DecodeInputBuffers``), ``max_bs`` rows."""
        m = self.max_bs
        return {
            "req_pool_indices": torch.zeros(m, dtype=torch.int64),
            "seq_lens": torch.full((m,), self.fill_value, dtype=torch.int64),
            "seq_lens_cpu": torch.full((m,), self.fill_value, dtype=torch.int64),
            "input_ids": torch.zeros(m * self.draft_tokens, dtype=torch.int64),
            "positions": torch.zeros(m * self.draft_tokens, dtype=torch.int64),
        }

    def _fill_from(self, batch: Batch, bs: int) -> None:
        """``CudaGraphBufferRegistry.fill_from``: the padded tail reset by each slot's policy, then the live
        rows copied in (``req_pool_indices`` ZERO, ``seq_lens`` / ``seq_lens_cpu`` FILL_SENTINEL)."""
        r, b = batch.raw_batch_size, self._buffers
        b["req_pool_indices"][r:bs].zero_()
        b["req_pool_indices"][:r].copy_(batch.req_pool_indices)
        for name in ("seq_lens", "seq_lens_cpu"):
            b[name][r:bs].fill_(self.fill_value)
            b[name][:r].copy_(batch.seq_lens)

    def _replay_view(self, batch: Batch, bs: int) -> types.SimpleNamespace:
        """``build_replay_fb_view``: the capture-time mode, the padded buffers, ``num_padding = bs - r``."""
        r = batch.raw_batch_size
        self._fill_from(batch, bs)
        graph_mode = "target_verify" if batch.mode == "target_verify" else "decode"  # idle runs the decode graph
        d = batch.draft_tokens if graph_mode == "target_verify" else 1
        b = self._buffers
        return types.SimpleNamespace(
            batch_size=bs,
            forward_mode=self._mode(graph_mode),
            actual_forward_mode=self._mode(batch.mode),
            input_ids=b["input_ids"][: bs * d],
            positions=b["positions"][: bs * d],
            req_pool_indices=b["req_pool_indices"][:bs],
            seq_lens=b["seq_lens"][:bs],
            seq_lens_sum=int(batch.seq_lens.sum()) + (bs - r) * self.fill_value,
            seq_lens_cpu=b["seq_lens_cpu"][:bs],
            num_padding=bs - r,
            encoder_lens=None,
            out_cache_loc=None,
            mamba_track_indices=None,
            spec_info=self._verify_spec(batch) if graph_mode == "target_verify" else None,
            lora_ids=None,
        )

    def _capture_batch(self, batch: Batch) -> Any:
        """``capture_prepare`` after ``reset_index_buffers``: zero indices, ``seq_lens`` at the fill value."""
        bs, b = batch.raw_batch_size, self._buffers
        b["req_pool_indices"].zero_()
        b["seq_lens"].fill_(self.fill_value)
        b["seq_lens_cpu"].fill_(self.fill_value)
        d = batch.draft_tokens if batch.mode == "target_verify" else 1
        fb = object.__new__(self._engine.forward_batch)
        fb.__dict__.update(
            forward_mode=self._mode(batch.mode),
            batch_size=bs,
            input_ids=b["input_ids"][: bs * d],
            positions=b["positions"][: bs * d],
            req_pool_indices=b["req_pool_indices"][:bs],
            seq_lens=b["seq_lens"][:bs],
            seq_lens_cpu=b["seq_lens_cpu"][:bs],
            seq_lens_sum=bs * self.fill_value,
            out_cache_loc=None,
            spec_info=self._verify_spec(None) if batch.mode == "target_verify" else None,
        )
        return fb

    def _verify_spec(self, batch: Batch | None, positions: torch.Tensor | None = None) -> Any:
        """The verify input: chains (``topk`` 1) the attribute bag the chain checks ran on; trees a real
        ``EagleVerifyInput`` with ``batch.tree``'s links (a verify batch without a tree is a chain), or, at
        capture (``batch`` None), the graph runner's, links None."""
        d = self.draft_tokens if batch is None else batch.draft_tokens
        if self._tree is None:
            return _spec_info(d)
        tree = self._tree
        if batch is None:
            return sglang_tree.verify_input(tree.verify_input, tree.hidden_mode, topk=self.topk, draft_tokens=d)
        links = _links(batch)
        return sglang_tree.verify_input(
            tree.verify_input,
            tree.hidden_mode,
            topk=self.topk,
            draft_tokens=d,
            next_token=links[0],
            next_sibling=links[1],
            positions=positions,
            seq_lens=batch.seq_lens,
        )

    def verify_forward(self, batch: Batch) -> sglang_tree.VerifyForward | None:
        """The class's eager verify forward of ``batch`` (``init_forward_metadata``, then ``forward_extend``) with
        its device-only kernels recorded (:func:`~workbench.engines.sglang_tree.drive_verify_forward`): for a
        class whose forward calls NPU kernels (an Ascend class defining ``forward_extend``). None for the others:
        the CUDA classes' forward runs Triton kernels on real data, and their tree reaches the conv kernel that
        :attr:`derives_parents`."""
        cls = type(self.backend)
        owner = next((k for k in cls.__mro__ if "forward_extend" in vars(k)), None)
        if self._tree is None or batch.mode != "target_verify" or owner is None or not is_ascend(owner):
            return None
        fb = self._eager_batch(batch)
        with published(self.topk):
            self.backend.init_forward_metadata(fb)
            return sglang_tree.drive_verify_forward(
                self.backend,
                "forward_extend",
                fb,
                self._tree.speculative_state,
                self.pool.num_slots,
                batch.raw_batch_size,
                batch.draft_tokens,
            )

    # -- translation ---------------------------------------------------------------------------------------
    def _initial_state(self, batch: Batch, meta: Any) -> torch.Tensor:
        """bool ``[r]``: Mamba2's ``mixed_metadata.has_initial_states`` in extend (the engine's); otherwise
        the batch's (GDN computes ``extend_prefix_lens > 0`` in its forward, not its metadata)."""
        mixed = getattr(meta, "mixed_metadata", None)
        if mixed is not None:
            return mixed.has_initial_states.to(torch.bool).clone()
        if batch.mode == "extend" and batch.prefix_lens is not None:
            return batch.prefix_lens > 0
        return torch.ones(batch.raw_batch_size, dtype=torch.bool)

    def _intermediate(self, mode: str, state_indices: torch.Tensor, rpi: torch.Tensor) -> torch.Tensor | None:
        """GDN's verify rows into the intermediate scratch, as its forward selects them: int32 ``[bs]``."""
        table = getattr(self.backend, "verify_intermediate_state_indices", None)
        if mode != "target_verify" or table is None:
            return None
        bs = state_indices.numel()
        rows = self._engine.select_verify_intermediate(table, rpi, state_indices >= 0, self._req_pool.size)
        return rows[:bs].to(torch.int32).clone()

    def _metadata(
        self,
        mode: str,
        batch: Batch,
        meta: Any,
        seq_lens: torch.Tensor,
        rpi: torch.Tensor,
        has_initial_state: torch.Tensor,
        *,
        bucket: int | None,
    ) -> Metadata:
        """The engine's tensors, copied (they are the backend's static per-bucket buffers in a replay)."""
        state = meta.mamba_cache_indices.clone()
        qsl = meta.query_start_loc.clone()
        out = Metadata(
            profile=get_profile(self.profile),
            forward_mode=mode,
            raw_batch_size=batch.raw_batch_size,
            draft_tokens=batch.draft_tokens,
            state_indices=state,
            query_start_loc=qsl,
            seq_lens=seq_lens.to(torch.int32).clone(),
            req_pool_indices=rpi.to(torch.int64).clone(),
            has_initial_state=has_initial_state.to(torch.bool).clone(),
            bucket=bucket,
        )
        if mode == "extend" and batch.extend_lens is not None:
            out.extend_lens = batch.extend_lens.to(torch.int32).clone()
        out.intermediate_state_indices = self._intermediate(mode, state, rpi)
        gdn_tokens = getattr(meta, "mamba_cache_indices_gdn", None)  # Ascend's verify token rows
        if mode == "target_verify" and gdn_tokens is not None:
            out.intermediate_token_indices = gdn_tokens.clone()
        if mode == "target_verify" and self._tree is not None:
            self._tree_fields(out, meta, state)
        return out

    def _tree_fields(self, out: Metadata, meta: Any, state: torch.Tensor) -> None:
        """The metadata's links and parents as int32 copies (eager: the verify input's own int64 tensors;
        replay and capture: the backend's per-bucket int32 buffers, whose padded rows keep what the last replay
        of the bucket left). The parents are what the verify forward's conv kernel derives from those links
        (:attr:`derives_parents`), written into the engine's own ``retrieve_parent_token`` first; a class whose
        forward derives none (Ascend) gives its buffer as allocated (eager: ``torch.empty_like``, uninitialised),
        which is not compared."""
        nt, ns, parent = (getattr(meta, name, None) for name in sglang_tree.TREE_FIELDS)
        if nt is None or ns is None or parent is None:
            return  # the class builds no tree metadata: the comparison reports the missing field
        if self.derives_parents:
            assert self._tree is not None
            sglang_tree.derive_parents(self._tree.conv, state, nt, ns, parent, self.pool.num_slots)
        out.retrieve_next_token = nt.to(torch.int32).clone()
        out.retrieve_next_sibling = ns.to(torch.int32).clone()
        out.retrieve_parent_token = parent.to(torch.int32).clone()
