"""sglang 0.5.23's own scheduler as a trace source: ``run_sglang_scheduler`` drives the released engine's
scheduler-side code on the CPU and writes down, step by step, what one GDN layer saw (``docs/traces.md``). It
returns a :class:`~workbench.engines.scheduler_base.SchedulerTrace`, the file's JSON objects (the engines layer
sits below ``workbench.traces``); ``workbench.traces.format.read_trace(run.lines())`` reads it into a ``Trace``.

    run = run_sglang_scheduler(steps=300, seed=0, spec=2, prefix_cache="extra_buffer")  # EAGLE, D = 2
    trace = read_trace(run.lines()); replay_trace(trace)

What runs is sglang's code: ``ServerArgs`` and ``runtime_context.publish`` (the resolution of the strategy, the
chunk grids, speculation and mixed chunk), ``ModelConfig`` over a small Qwen3-Next configuration written for
the run (no weights), ``HybridReqToTokenPool`` with its ``MambaPool`` (real tensors) and
``MambaSlotAllocator``, ``TokenToKVPoolAllocator``, the tree cache from sglang's own factory
(``UnifiedRadixCache`` with its full-attention and mamba components: matching, copy-on-write, inserts,
donations, LRU eviction), ``Req`` and ``SamplingParams``, ``Scheduler.get_next_batch_to_run`` (filtering and
merging, ``PrefillAdder`` and the schedule policy, chunked prefill, ``ScheduleBatch`` ``prepare_for_extend``,
``mix_with_running``, ``prepare_for_decode`` and the EAGLE decode preparation, retraction),
``Scheduler._forward_isolation`` around a speculative forward, the verify's ``prepare_mamba_track_for_verify``
and ``_verify_commit_step_indices``, and ``SchedulerBatchResultProcessor`` (outputs, finishing, the ping-pong
track buffer, ``checkpoint_kv_cache`` / ``release_kv_cache`` into the tree). An error any of them raises
reaches the caller. What a CPU run cannot have is stood in for: :data:`DRIVER_STANDINS` (the model and the
draft model) and the tables of :mod:`workbench.engines.sglang_standins`, each with its reason.

How sglang's state maps to the trace, and the hooks on the ``Scheduler`` instance that write it:
:mod:`workbench.engines.sglang_recorder` (its :class:`~workbench.engines.sglang_recorder.Recorder`); the
driver supplies the requests, the fake forward and the toy model, so the same recorder serves a live
scheduler (:mod:`workbench.engines.sglang_dump`).

The fake model keeps a toy recurrence in the real ``MambaPool`` tensor (the tokens a state is of, and a hash
of them), so every copy, clear, donation and eviction sglang makes moves it: each state read (a row's
start, a copy-on-write source) and each published checkpoint is checked against the tokens the engine
says it holds. ``stats["toy_mismatches"]`` counts the ones that differ and ``trace.findings`` names them
(step, request, slot, what the state holds, what the engine claims).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import tempfile
import time
import types
import warnings
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.engines import sglang_0_5_23, sglang_standins
from workbench.engines.probes import Probe, fields, has, run_probes
from workbench.engines.scheduler_base import Acceptance, SchedulerTrace, Workload, WorkloadSettings
from workbench.engines.sglang_recorder import (
    Recorder,
    _Event,
    _header,
    _ids,
    _Row,
    batch_rows,
    cow_pairs,
    track_fields,
)
from workbench.engines.versions import EngineError
from workbench.layer_names import GDN

PREFIX_CACHES = ("extra_buffer", "no_buffer")
"""sglang's ``--mamba-radix-cache-strategy`` values the driver runs (``extra_buffer_lazy`` is not modelled by
the trace format)."""

DRIVER_STANDINS: tuple[tuple[str, str], ...] = (
    (
        "the model (TpModelWorker / EAGLEWorkerV2.forward_batch_generation)",
        "no weights run. Stand-in: the copy-on-write and clears the model runner makes before a forward "
        "(_maybe_execute_deferred_mamba_cow_and_clear: the real HybridReqToTokenPool.copy_mamba_state and "
        "MambaPool.clear_slots), a toy recurrence written into the real MambaPool tensor (each slot: the tokens "
        "its state is of and their hash; tracked rows write their track slot as the kernels do: the chunk's "
        "final state when the tracked length is on the chunk grid, else the chunk state before it), and a "
        "GenerationBatchResult of random sampled tokens",
    ),
    (
        "the draft model and the verify (EAGLE, chain, topk 1)",
        "D - 1 random draft ids per row; the tokens kept (1..D, the bonus included) drawn by "
        "workbench.engines.scheduler_base.Acceptance; the accept index of a chain; the real "
        "prepare_mamba_track_for_verify and _verify_commit_step_indices (its host path) say what to track; the "
        "commit writes the toy state of the last kept step (and of the tracked step into the track slot); "
        "next_draft_input None (filter_batch and merge_batch skip a falsy spec_info)",
    ),
    (
        "Scheduler.run_batch / process_batch_result",
        "their synchronous (non-overlap) paths re-done around the fake forward, set on the instance (the "
        "recorder wraps them there, as it wraps the real methods in a live scheduler): forward_ct, "
        "_forward_isolation around a speculative forward, new_seq_lens applied; the result dispatched to the real "
        "process_batch_result_prefill / _decode, then flush_pending_backups (no metrics, no streaming)",
    ),
    (
        "the target forward's metadata",
        "the real ForwardBatch.init_new of the real ScheduleBatch and the real GDNAttnBackend.init_forward_metadata "
        "over the run's HybridReqToTokenPool (built as the adapter builds it, its config getters rebound: "
        "sglang_0_5_23.REBINDINGS); the model runner is an attribute bag (CPU, not a draft worker, no LoRA, no "
        "n-gram embedding) holding the real pools and a real KVIndexTranslator",
    ),
    (
        "the verify input (EagleVerifyInput)",
        "an object with draft_token (int64 [bs * D]: the pending token, then the drawn drafts), "
        "draft_token_num D and topk 1, handed to the model worker's verify as the draft model would; "
        "batch.input_ids is set to it as eagle_prepare_for_verify does",
    ),
    (
        "ModelConfig",
        "read from a Qwen3-Next configuration the driver writes into a temporary folder (a few layers, tiny "
        "heads, no weights): ModelConfig.from_server_args reads it as a model folder",
    ),
    (
        "the memory profile",
        "the model runner sizes the pools from free GPU memory; here: max_mamba_cache_size published by "
        "override, the pools built with the sizes given (mamba_slots, kv_tokens, max_running)",
    ),
    (
        "TokenToKVPoolAllocator.kvcache",
        "None: it only hands out KV indices, no KV value is read or written",
    ),
    (
        "the tree cache's and the pool's methods",
        "wrapped on the instances, not replaced: checkpoint_into_tree (which request is cached), insert (a new "
        "mamba value: a publish), MambaPool.copy_from (a copy) and MambaSlotAllocator.free (a published slot "
        "given back: an eviction) are observed",
    ),
)
"""What the driver stands in for beyond :mod:`workbench.engines.sglang_standins`: (what, why)."""

IMPORT_WARNINGS: list[str] = []
"""Warnings sglang's scheduler imports raised (kept, not shown: the suite turns warnings into errors)."""

RUN_WARNINGS: list[str] = []
"""Warnings sglang raised while a run drove it (kept, as :data:`IMPORT_WARNINGS`)."""

TOY_MODULUS = 1048573
"""The toy recurrence's hash modulus: a prime below 2**24, so a hash is exact in the pool's float32 state."""


# -- importing ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sglang:
    """The sglang names the driver uses, imported once (:func:`load`)."""

    version: str
    commit: str | None
    runtime_context: Any
    ServerArgs: Any
    mamba_hook: Any
    allocation: Any
    ModelConfig: Any
    HybridReqToTokenPool: Any
    TokenToKVPoolAllocator: Any
    TreeCacheBuildContext: Any
    create_tree_cache: Any
    CacheInitParams: Any
    extra_context_len: Any  # get_req_to_token_extra_context_len
    SpeculativeAlgorithm: Any
    max_draft_tokens: Any  # arg_groups.overrides.max_speculative_num_draft_tokens
    Scheduler: Any
    SchedulerBatchResultProcessor: Any
    SchedulerLogprobResultProcessor: Any
    DisaggregationMode: Any
    Req: Any
    SamplingParams: Any
    GenerationBatchResult: Any
    ForwardMode: Any
    prepare_mamba_track_for_verify: Any
    verify_commit_step_indices: Any  # spec_utils._verify_commit_step_indices


@functools.cache
def load() -> Sglang:
    """Import sglang 0.5.23's scheduler side (once per process), after the adapter's
    :func:`~workbench.engines.sglang_0_5_23.load` (version check, device stand-ins) and
    :func:`~workbench.engines.sglang_standins.install_import_standins`. sglang's logger is set to errors only
    (its configuration resolution warns about what it adjusts)."""
    sglang_0_5_23.load()
    sglang_standins.install_import_standins()
    imp = sglang_0_5_23._import
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        version = imp("sglang.version")
        version_info = imp("sglang._version")
        rc = imp("sglang.srt.runtime_context")
        server_args = imp("sglang.srt.server_args")
        mamba_hook = imp("sglang.srt.arg_groups.mamba_hook")
        overrides = imp("sglang.srt.arg_groups.overrides")
        allocation = imp("sglang.srt.mem_cache.allocation")
        sizing = imp("sglang.srt.mem_cache.allocation_sizing")
        model_config = imp("sglang.srt.configs.model_config")
        pools = imp("sglang.srt.mem_cache.memory_pool")
        token_alloc = imp("sglang.srt.mem_cache.allocator.token")
        registry = imp("sglang.srt.mem_cache.registry")
        cache_params = imp("sglang.srt.mem_cache.cache_init_params")
        spec_info = imp("sglang.srt.speculative.spec_info")
        spec_utils = imp("sglang.srt.speculative.spec_utils")
        schedule_batch = imp("sglang.srt.managers.schedule_batch")
        unified = imp("sglang.srt.mem_cache.unified_radix_cache")
        imp("sglang.srt.managers.schedule_policy")
        results = imp("sglang.srt.managers.scheduler_components.batch_result_processor")
        logprobs = imp("sglang.srt.managers.scheduler_components.logprob_result_processor")
        scheduler = imp("sglang.srt.managers.scheduler")
        utils = imp("sglang.srt.managers.utils")
        disagg = imp("sglang.srt.disaggregation.utils")
        sampling = imp("sglang.srt.sampling.sampling_params")
        fbi = imp("sglang.srt.model_executor.forward_batch_info")
    IMPORT_WARNINGS.extend(f"{w.category.__name__}: {w.message}" for w in caught)
    run_probes(
        f"sglang {version.__version__} (the scheduler driver)",
        [
            Probe(
                "Scheduler.init_mamba_truncation_align and check_truncation_align_fits_chunk (sglang 0.5.23)",
                has(scheduler.Scheduler, "init_mamba_truncation_align", "check_truncation_align_fits_chunk"),
            ),
            Probe(
                "UnifiedRadixCache.checkpoint_into_tree (sglang 0.5.22's name for inserting a request)",
                has(unified.UnifiedRadixCache, "checkpoint_into_tree"),
            ),
            Probe(
                "the scheduler's batch loop",
                has(scheduler.Scheduler, "get_next_batch_to_run", "run_batch", "process_batch_result"),
            ),
            Probe("the verify's track helpers", has(spec_utils, "prepare_mamba_track_for_verify")),
            Probe("TreeCacheBuildContext's fields", fields(registry.TreeCacheBuildContext, "server_args", "params")),
        ],
    )
    logging.getLogger("sglang").setLevel(logging.ERROR)
    commit = getattr(version_info, "__commit_id__", None)
    return Sglang(
        version=str(version.__version__),
        commit=str(commit) if commit else None,
        runtime_context=rc,
        ServerArgs=server_args.ServerArgs,
        mamba_hook=mamba_hook,
        allocation=allocation,
        ModelConfig=model_config.ModelConfig,
        HybridReqToTokenPool=pools.HybridReqToTokenPool,
        TokenToKVPoolAllocator=token_alloc.TokenToKVPoolAllocator,
        TreeCacheBuildContext=registry.TreeCacheBuildContext,
        create_tree_cache=registry.create_tree_cache,
        CacheInitParams=cache_params.CacheInitParams,
        extra_context_len=sizing.get_req_to_token_extra_context_len,
        SpeculativeAlgorithm=spec_info.SpeculativeAlgorithm,
        max_draft_tokens=overrides.max_speculative_num_draft_tokens,
        Scheduler=scheduler.Scheduler,
        SchedulerBatchResultProcessor=results.SchedulerBatchResultProcessor,
        SchedulerLogprobResultProcessor=logprobs.SchedulerLogprobResultProcessor,
        DisaggregationMode=disagg.DisaggregationMode,
        Req=schedule_batch.Req,
        SamplingParams=sampling.SamplingParams,
        GenerationBatchResult=utils.GenerationBatchResult,
        ForwardMode=fbi.ForwardMode,
        prepare_mamba_track_for_verify=spec_utils.prepare_mamba_track_for_verify,
        verify_commit_step_indices=spec_utils._verify_commit_step_indices,
    )


# -- the deployment -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Deployment:
    """The sglang deployment a run drives: the prefix cache's strategy, speculation (``draft_tokens`` D, 0:
    none), mixed chunk, the pools and the batch limits (one GPU worker, page size 1, no overlap scheduler)."""

    prefix_cache: str
    draft_tokens: int
    mixed: bool
    max_running: int
    mamba_slots: int
    kv_tokens: int
    chunked_prefill: int
    track_interval: int | None
    context_len: int
    vocab: int


def model_config_json(vocab: int, context_len: int) -> dict[str, Any]:
    """A small Qwen3-Next configuration (three GDN layers, then one full-attention layer): what sglang's
    ``ModelConfig`` and the pool read of a hybrid GDN model (:data:`DRIVER_STANDINS` ``ModelConfig``).

    >>> cfg = model_config_json(4096, 4096)
    >>> cfg["model_type"], cfg["full_attention_interval"], cfg["vocab_size"]
    ('qwen3_next', 4, 4096)
    """
    return {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "vocab_size": vocab,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "full_attention_interval": 4,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_num_key_heads": 1,
        "linear_num_value_heads": 2,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "max_position_embeddings": context_len,
        "eos_token_id": vocab - 1,
        "torch_dtype": "bfloat16",
    }


@dataclass
class _Parts:
    """The engine objects of one run (what the model runner and the scheduler's init would build)."""

    server_args: Any
    model_config: Any
    req_pool: Any
    allocator: Any
    tree_cache: Any
    spec_algorithm: Any
    chunk: int  # mamba_cache_chunk_size()


def _server_args(sg: Sglang, d: Deployment, model_dir: str) -> Any:
    kw: dict[str, Any] = {
        "model_path": model_dir,
        "device": "cpu",
        "mamba_radix_cache_strategy": d.prefix_cache,
        "skip_tokenizer_init": True,
        "load_format": "dummy",
        "disable_overlap_schedule": True,
        "page_size": 1,
        "chunked_prefill_size": d.chunked_prefill,
        "max_prefill_tokens": d.chunked_prefill * 4,
        "max_running_requests": d.max_running,
        "enable_mixed_chunk": d.mixed,
    }
    if d.track_interval is not None:
        kw["mamba_track_interval"] = d.track_interval
    if d.draft_tokens:
        kw.update(
            speculative_algorithm="EAGLE",
            speculative_num_steps=d.draft_tokens - 1,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=d.draft_tokens,
        )
    return sg.ServerArgs(**kw)


def _check_resolved(sg: Sglang, d: Deployment) -> None:
    """What sglang's resolution made of the deployment is what was asked for, or an :class:`EngineError`."""
    rc = sg.runtime_context
    mamba, sched = rc.get_exec().mamba, rc.get_schedule()
    got = {
        "extra_buffer": bool(mamba.enable_mamba_extra_buffer),
        "extra_buffer_lazy": bool(mamba.enable_mamba_extra_buffer_lazy),
        "mixed chunk": bool(sched.enable_mixed_chunk),
        "overlap scheduler": not sched.disable_overlap_schedule,
    }
    want = {
        "extra_buffer": d.prefix_cache == "extra_buffer",
        "extra_buffer_lazy": False,
        "mixed chunk": d.mixed,
        "overlap scheduler": False,
    }
    for name, value in want.items():
        if got[name] != value:
            raise EngineError(f"sglang resolved {name} = {got[name]} for this deployment (asked: {value}); not driven")


def _build(sg: Sglang, d: Deployment, model_dir: str) -> _Parts:
    """Publish the deployment's ``ServerArgs`` and build the pools and the tree cache as sglang does."""
    import torch

    rc = sg.runtime_context
    sa = _server_args(sg, d, model_dir)
    rc.publish(sa, role="scheduler")
    _check_resolved(sg, d)
    rc.get_context().override("workbench.sglang_scheduler", max_mamba_cache_size=d.mamba_slots)
    model_config = sg.ModelConfig.from_server_args(sa)
    cache = model_config.hf_config.mamba2_cache_params
    ex, sched = rc.get_exec(), rc.get_schedule()
    spec = sg.SpeculativeAlgorithm.from_string(rc.get_spec().speculative_algorithm)
    req_pool = sg.HybridReqToTokenPool(
        size=d.max_running,
        mamba_size=d.mamba_slots,
        mamba_spec_state_size=d.max_running,
        max_context_len=model_config.context_len + sg.extra_context_len(),
        device="cpu",
        enable_memory_saver=False,
        cache_params=cache,
        mamba_layer_ids=list(cache.layers),
        enable_mamba_extra_buffer=ex.mamba.enable_mamba_extra_buffer,
        enable_mamba_extra_buffer_lazy=ex.mamba.enable_mamba_extra_buffer_lazy,
        speculative_num_draft_tokens=sg.max_draft_tokens(sa) if d.draft_tokens else None,
        speculative_eagle_topk=rc.get_spec().speculative_eagle_topk,
        enable_overlap_schedule=not sched.disable_overlap_schedule,
    )
    allocator = sg.TokenToKVPoolAllocator(
        d.kv_tokens, dtype=torch.bfloat16, device="cpu", kvcache=None, need_sort=False
    )
    params = sg.CacheInitParams(
        disable=False,
        req_to_token_pool=req_pool,
        token_to_kv_pool_allocator=allocator,
        page_size=1,
        is_eagle=spec.is_eagle(),
        eviction_policy=rc.get_memory().radix_eviction_policy,
        eviction_policy_config=rc.get_memory().radix_eviction_policy_config,
        enable_mamba_extra_buffer=ex.mamba.enable_mamba_extra_buffer,
        enable_mamba_extra_buffer_lazy=ex.mamba.enable_mamba_extra_buffer_lazy,
        chunked_prefill_size=sched.chunked_prefill_size,
    )
    ctx = sg.TreeCacheBuildContext(
        server_args=sa, params=params, is_hybrid_swa=False, is_hybrid_ssm=True, enable_hierarchical_cache=False,
        disable_radix_cache=False, tp_worker=None, model_config=model_config, tp_size=1, tp_rank=0, tp_group=None,
    )  # fmt: skip
    return _Parts(
        server_args=sa,
        model_config=model_config,
        req_pool=req_pool,
        allocator=allocator,
        tree_cache=sg.create_tree_cache(ctx),
        spec_algorithm=spec,
        chunk=int(rc.mamba_cache_chunk_size()),
    )


@contextlib.contextmanager
def _engine(sg: Sglang, d: Deployment) -> Iterator[_Parts]:
    """The run's engine objects, with sglang's process state (the published config, the CPU patches, its
    logger's level) put back as it was when the run ends."""
    rc = sg.runtime_context
    before = rc.snapshot_context()
    logger = logging.getLogger("sglang")
    level = logger.level
    try:
        with tempfile.TemporaryDirectory(prefix="sglang-model-") as model_dir:
            Path(model_dir, "config.json").write_text(json.dumps(model_config_json(d.vocab, d.context_len)))
            with sglang_standins.cpu_patches(sg.allocation, sg.mamba_hook):
                logger.setLevel(logging.ERROR)
                yield _build(sg, d, model_dir)
    finally:
        logger.setLevel(level)
        rc.restore_context(before)


# -- the fake model ---------------------------------------------------------------------------------------
def toy_hash(tokens: Any, h: int = 0) -> int:
    """The toy recurrence over ``tokens`` from state ``h``.

    >>> toy_hash([1, 2]) == toy_hash([2], toy_hash([1]))
    True
    """
    for t in tokens:
        h = (h * 31 + int(t) + 1) % TOY_MODULUS
    return h


class _ToyModel:
    """The model's stand-in (:data:`DRIVER_STANDINS`): a toy state per slot kept in the real ``MambaPool``
    tensor (``temporal[0, slot, 0, 0, :2]`` = the tokens the state is of and their hash), checked against the
    tokens the engine says each state holds."""

    def __init__(self, parts: _Parts, findings: list[str], stats: Counter[str]) -> None:
        self.temporal = parts.req_pool.mamba_pool.mamba_cache.temporal
        self.findings, self.stats = findings, stats
        self.step = 0

    def get(self, slot: int) -> tuple[int, int]:
        return int(self.temporal[0, slot, 0, 0, 0].item()), int(self.temporal[0, slot, 0, 0, 1].item())

    def put(self, slot: int, length: int, h: int) -> None:
        self.temporal[0, slot, 0, 0, 0] = float(length)
        self.temporal[0, slot, 0, 0, 1] = float(h)

    def check(self, what: str, slot: int, ids: Any, request: int | None) -> int:
        """The state in ``slot`` is of exactly ``ids`` (a mismatch is counted and named); its hash."""
        want = (len(ids), toy_hash(ids))
        got = self.get(slot)
        self.stats["toy_checks"] += 1
        if got != want:
            self.stats["toy_mismatches"] += 1
            self.findings.append(
                f"step {self.step}: {what} of request {request}: slot {slot} holds the state of {got[0]} tokens "
                f"(hash {got[1]}), the engine says {want[0]} (hash {want[1]})"
            )
        return want[1]


# -- the driver ---------------------------------------------------------------------------------------
class _VerifyInput:
    """What the draft model hands the verify (EAGLE, a chain: topk 1): ``draft_token`` int64 ``[bs * D]``, per
    row the pending token then its ``D - 1`` drafts; the fields the forward batch and the GDN backend read."""

    def __init__(self, draft_token: Any, draft_tokens: int) -> None:
        self.draft_token = draft_token
        self.draft_token_num = draft_tokens
        self.topk = 1
        self.ragged_verify_layout = None
        self.retrieve_next_token = None
        self.retrieve_next_sibling = None
        self.positions = None

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the verify input (workbench stand-in) has no attribute {name!r}")


def _forward_runner(parts: _Parts) -> Any:
    """The model runner as ``ForwardBatch.init_new`` and the GDN backend read it (:data:`DRIVER_STANDINS`): the
    real pools, the real ``KVIndexTranslator``; no draft worker, LoRA, n-gram embedding or multimodal rope."""
    eng = sglang_0_5_23.load()
    kvt = sglang_0_5_23._import("sglang.srt.mem_cache.kv_index_translator")
    triton = eng.kernel_backend.TRITON
    pool = parts.req_pool
    return sglang_0_5_23.Bag(
        "model_runner",
        server_args=sglang_0_5_23.Bag("model_runner.server_args", enable_mis=False),
        device="cpu",
        is_draft_worker=False,
        req_to_token_pool=pool,
        token_to_kv_pool=None,
        linear_attn_backends=eng.linear_attn_backends(decode=triton, prefill=triton, verify=triton),
        model_config=parts.model_config,
        prefill_attention_backend_str="triton",
        ngram_embedding_manager=types.SimpleNamespace(enabled=False),
        lora_manager=None,
        kv_index_translator=kvt.KVIndexTranslator(
            req_to_token=pool.req_to_token, token_to_kv_pool_allocator=parts.allocator, token_to_kv_pool=None,
            page_size=1, device="cpu", is_draft_worker=False,
        ),
    )  # fmt: skip


class _Driver:
    """One run: sglang's scheduler over the run's engine objects, the fake model, the requests. With ``record``
    (the default) its :class:`Recorder` is attached and writes ``self.trace``; without, the scheduler runs bare
    (a dumper may attach to ``self.sched``)."""

    def __init__(
        self,
        sg: Sglang,
        d: Deployment,
        parts: _Parts,
        seed: int,
        settings: WorkloadSettings,
        accept_rate: float,
        *,
        record: bool = True,
    ) -> None:
        self.sg, self.d, self.parts = sg, d, parts
        self.fbi = sglang_0_5_23._import("sglang.srt.model_executor.forward_batch_info")
        self.runner = _forward_runner(parts)
        self.backend = sglang_0_5_23.load().gdn(self.runner)
        worker = types.SimpleNamespace(
            forward_batch_generation=self.forward, verify=self.verify, on_verify_complete_cpu=lambda *a, **k: None
        )
        self.sched = sglang_standins.scheduler_shell(
            sg, parts, model_worker=worker, attn_backend=types.SimpleNamespace(linear_attn_backend=self.backend)
        )
        self.sched.run_batch = self.run_batch
        self.sched.process_batch_result = self.process_batch_result
        self.recorder: Recorder | None = None
        self.trace = SchedulerTrace(_header(sg, d.max_running, d.draft_tokens, d.mamba_slots + 1, seed, GDN))
        if record:
            self.recorder = Recorder(sg, self.sched, seed=seed, on_publish=self._published)
            self.recorder.attach()
            self.trace = self.recorder.trace
        self.toy = _ToyModel(parts, self.trace.findings, self.trace.stats)
        self.workload = Workload(seed, settings)
        self.acceptance = Acceptance(seed, accept_rate)
        self.requests: dict[str, Any] = {}
        self.next_request = 0
        self._rows: list[_Row] = []  # the batch in the forward, as the fake model sees it

    def _tid(self, req: Any) -> int | None:
        ids = self.recorder.ids if self.recorder is not None else None
        return ids[req.rid] if ids is not None and req.rid in ids else None

    def _published(self, e: _Event) -> None:
        self.toy.check("a published checkpoint", e.slot, e.ids, e.request)

    # -- requests -----------------------------------------------------------------------------------
    def arrive(self, step: int) -> None:
        sg, vocab = self.sg, self.d.vocab
        for a in self.workload.arrivals(step):
            rid = f"r{self.next_request}"
            self.next_request += 1
            sp = sg.SamplingParams(max_new_tokens=a.max_tokens, ignore_eos=True, temperature=0.0)
            sp.normalize(None)
            sp.verify(vocab)
            prompt = list(a.prompt)[: self.d.context_len // 2]
            req = sg.Req(rid, "", array("q", prompt), sp, vocab_size=vocab, eos_token_ids={vocab - 1})
            self.sched.init_req_max_new_tokens(req)
            self.sched._add_request_to_queue(req)
            self.requests[rid] = req

    # -- one engine step: the scheduler's non-overlap loop ------------------------------------------------
    def step(self, number: int) -> None:
        """``get_next_batch_to_run``, then ``run_batch`` and ``process_batch_result`` of a batch (each looked up
        on the scheduler: a recorder's wrappers run); the running batch kept as the scheduler's loop keeps it."""
        s = self.sched
        self.toy.step = number
        plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
        s.running_batch = plan.running_batch
        batch = plan.batch_to_run
        if batch is None or batch.is_empty():
            return
        result = s.run_batch(batch)
        s.process_batch_result(batch, result)
        for req in batch.reqs:  # finished conversations go back to the workload (follow-ups)
            if req.finished() and req.rid in self.requests:
                self.workload.finished(_ids(req))
                del self.requests[req.rid]
        s.last_batch = batch

    def run_batch(self, batch: Any) -> Any:
        """``Scheduler.run_batch``'s synchronous path around the fake forward (:data:`DRIVER_STANDINS`)."""
        s = self.sched
        s.forward_ct += 1
        batch.forward_iter = s.forward_ct
        if batch.extend_num_tokens:
            s.processed_tokens_counter += batch.extend_num_tokens
        if batch.spec_algorithm.is_none():
            result = s.model_worker.forward_batch_generation(batch)
        else:
            with s._forward_isolation(batch, overlap=False):
                result = s.model_worker.forward_batch_generation(batch)
            batch.spec_info = result.next_draft_input
            new = result.new_seq_lens
            if new is not None and new is not batch.seq_lens:
                batch.seq_lens = new
                if batch.seq_lens_cpu is not None:
                    batch.seq_lens_cpu = new.to("cpu")
                    batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        batch.input_ids = None
        result.extend_input_len_per_req = None
        result.extend_logprob_start_len_per_req = None
        return result

    def process_batch_result(self, batch: Any, result: Any) -> None:
        """``Scheduler.process_batch_result``'s dispatch to the real processor (no metrics, no streaming)."""
        s = self.sched
        if batch.forward_mode.is_decode():
            s.batch_result_processor.process_batch_result_decode(batch, result)
        else:
            s.batch_result_processor.process_batch_result_prefill(batch, result)
        s.tree_cache.flush_pending_backups()

    # -- the forward ----------------------------------------------------------------------------------
    def _target_forward(self, batch: Any) -> None:
        """The target model's forward as far as metadata goes: sglang's ``ForwardBatch.init_new`` of the batch
        and the GDN backend's ``init_forward_metadata`` (looked up on the backend: a recorder's wrapper runs)."""
        fb = self.fbi.ForwardBatch.init_new(batch, self.runner, return_hidden_states_before_norm=False)
        self.backend.init_forward_metadata(fb)

    def forward(self, batch: Any) -> Any:
        """The fake ``forward_batch_generation`` (:data:`DRIVER_STANDINS`): copy-on-write and clears, the toy
        recurrence, the target's metadata, and the result sglang's result processing reads; under EAGLE a decode
        batch draws its drafts and goes to ``model_worker.verify``."""
        import torch

        rows = batch_rows(batch, self.parts.req_pool, self.d.draft_tokens)
        for r in rows:
            tid = self._tid(r.req)
            r.tid = -1 if tid is None else tid
        self._rows = rows
        if batch.forward_mode.is_decode() and not batch.spec_algorithm.is_none():
            for r in rows:
                r.tokens = [_ids(r.req)[r.cached], *(self.acceptance.token(self.d.vocab) for _ in range(r.new - 1))]
            flat = torch.tensor([t for r in rows for t in r.tokens], dtype=torch.int64)
            batch.spec_info = _VerifyInput(flat, self.d.draft_tokens)
            return self.sched.model_worker.verify(batch)
        track = track_fields(batch, rows, self.parts.chunk)[0]
        if batch.forward_mode.is_extend():
            self._cow_and_clear(batch, rows)
            self._target_forward(batch)
            self._extend(rows, track)
        else:
            self._target_forward(batch)
            self._decode(rows, track)
        ids = torch.tensor([self.acceptance.token(self.d.vocab) for _ in rows], dtype=torch.int64)
        result = self.sg.GenerationBatchResult(next_token_ids=ids, can_run_cuda_graph=False)
        if not batch.spec_algorithm.is_none():
            result.new_seq_lens = batch.seq_lens  # an extend round hands back batch.seq_lens itself
            result.next_draft_input = None
        return result

    def _cow_and_clear(self, batch: Any, rows: list[_Row]) -> None:
        """What the model runner does before an extend forward, on the real pool."""
        pool = self.parts.req_pool
        owner = {r.slot: r for r in rows}
        for src, dst in cow_pairs(batch):
            r = owner[dst]
            self.toy.check("the copy-on-write source", src, _ids(r.req)[: r.cached], r.tid)
        if batch.mamba_clear_indices is not None and len(batch.mamba_clear_indices) > 0:
            pool.mamba_pool.clear_slots(pool.translate_mamba_indices(batch.mamba_clear_indices))
        if batch.mamba_cow_src_indices is not None and len(batch.mamba_cow_src_indices) > 0:
            pool.copy_mamba_state(
                pool.translate_mamba_indices(batch.mamba_cow_src_indices),
                pool.translate_mamba_indices(batch.mamba_cow_dst_indices),
            )

    def _extend(self, rows: list[_Row], track: dict[str, Any]) -> None:
        """Each row advances over its tokens; a tracked row writes its track slot as the kernels do (the
        final state when ``seqlen - cached`` is a multiple of the chunk, else the chunk state before it)."""
        chunk = self.parts.chunk
        for i, r in enumerate(rows):
            h = self.toy.check("the state before an extend row", r.slot, _ids(r.req)[: r.cached], r.tid)
            if track and track["mamba_track_mask"][i]:
                length = track["mamba_track_seqlens"][i] - r.cached
                at = r.new if length % chunk == 0 else length // chunk * chunk
                self.toy.put(track["mamba_track_indices"][i], r.cached + at, toy_hash(r.tokens[:at], h))
            self.toy.put(r.slot, r.cached + r.new, toy_hash(r.tokens, h))

    def _decode(self, rows: list[_Row], track: dict[str, Any]) -> None:
        for i, r in enumerate(rows):
            h = self.toy.check("the state before a decode", r.slot, _ids(r.req)[: r.cached], r.tid)
            h = toy_hash(r.tokens, h)
            self.toy.put(r.slot, r.cached + 1, h)
            if track and track["mamba_track_mask"][i]:
                self.toy.put(track["mamba_track_indices"][i], r.cached + 1, h)

    def verify(self, batch: Any) -> Any:
        """The fake ``verify`` of a chain (topk 1; :data:`DRIVER_STANDINS`): sglang's own track rebuild, the
        target's metadata, the accepted tokens drawn, the engine's own commit decision, the commit of the toy
        state, and the result (flattened ``[bs * D]`` ids, ``accept_lens``, ``accept_index``)."""
        import torch

        sg, d = self.sg, self.d.draft_tokens
        rows = self._rows
        sg.prepare_mamba_track_for_verify(batch)
        batch.forward_mode = sg.ForwardMode.TARGET_VERIFY
        batch.input_ids = batch.spec_info.draft_token  # as eagle_prepare_for_verify feeds the verify
        self._target_forward(batch)
        kept = [self.acceptance.kept(d - 1) for _ in rows]
        accept_lens = torch.tensor(kept, dtype=torch.int32)
        accept_index = torch.full((len(rows), d), -1, dtype=torch.int64)
        for b, a in enumerate(kept):
            accept_index[b, :a] = b * d + torch.arange(a)
        _, to_track = sg.verify_commit_step_indices(
            batch=batch, accept_index=accept_index, accept_lens=accept_lens, draft_token_num=d
        )
        track: dict[str, Any] = {}
        if batch.mamba_track_indices is not None and to_track is not None:
            track = {
                "mamba_track_indices": batch.mamba_track_indices.tolist(),
                "mamba_steps_to_track": to_track.tolist(),
            }
        ids = torch.full((len(rows) * d,), -1, dtype=torch.int64)
        for b, (r, a) in enumerate(zip(rows, kept, strict=True)):
            self._commit(r, a, track, b)
            out = [*r.tokens[1:a], self.acceptance.token(self.d.vocab)]
            ids[b * d : b * d + a] = torch.tensor(out, dtype=torch.int64)
        result = sg.GenerationBatchResult(
            next_token_ids=ids, accept_lens=accept_lens, can_run_cuda_graph=False, speculative_num_draft_tokens=d
        )
        result.new_seq_lens = batch.seq_lens + accept_lens.to(batch.seq_lens.dtype)
        result.next_draft_input = None
        result.accept_index = accept_index
        return result

    def _commit(self, r: _Row, kept: int, track: dict[str, Any], b: int) -> None:
        """The commit after a verify: the running slot takes the state after the ``kept`` tokens; a row with a
        step to track has that step's state put into its track slot."""
        h = self.toy.check("the state before a verify", r.slot, _ids(r.req)[: r.cached], r.tid)
        states = []
        for t in r.tokens:
            h = toy_hash([t], h)
            states.append(h)
        self.toy.put(r.slot, r.cached + kept, states[kept - 1])
        if track and track["mamba_steps_to_track"][b] >= 0 and track["mamba_track_indices"][b] >= 0:
            s = track["mamba_steps_to_track"][b]
            self.toy.put(track["mamba_track_indices"][b], r.cached + s + 1, states[s])


def drive(driver: _Driver, steps: int) -> None:
    """The driver's loop: ``steps`` engine steps, each after that step's arrivals; with its recorder, the last
    step goes to the trace."""
    for number in range(steps):
        driver.arrive(number)
        driver.step(number)
    if driver.recorder is not None:
        driver.recorder.finish()


def _validate(**values: Any) -> None:
    """Each ``name=(value, low)`` is an int >= low, or an :class:`EngineError` naming it."""
    for name, (value, low) in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise EngineError(f"{name} = {value!r}: must be an int >= {low}")


def run_sglang_scheduler(
    *,
    steps: int,
    seed: int = 0,
    spec: int = 2,
    prefix_cache: str = "extra_buffer",
    mixed: bool = False,
    layer: str = GDN,
    max_running: int = 8,
    mamba_slots: int = 40,
    kv_tokens: int = 16384,
    chunked_prefill: int = 256,
    track_interval: int | None = None,
    context_len: int = 4096,
    accept_rate: float = 0.6,
    workload: WorkloadSettings | None = None,
) -> SchedulerTrace:
    """Drive sglang 0.5.23's scheduler for ``steps`` engine steps and return the trace it produced.

    ``spec``: D, the tokens each verify row feeds (EAGLE, a chain: ``speculative_num_draft_tokens = D``,
    ``speculative_num_steps = D - 1``, topk 1; 0: no speculation); ``prefix_cache``: sglang's
    ``--mamba-radix-cache-strategy``, ``"extra_buffer"`` or ``"no_buffer"``; ``mixed``: ``--enable-mixed-chunk``
    (kept on under EAGLE by sglang 0.5.23); ``layer``: ``"gdn"``; ``max_running``: the request pool's rows
    (``--max-running-requests``); ``mamba_slots``: the ``MambaPool``'s slots (the trace's ``num_slots`` is one
    more: the dummy slot); ``kv_tokens``: the full-attention KV pool; ``chunked_prefill``:
    ``--chunked-prefill-size``; ``track_interval``: ``--mamba-track-interval`` (None: sglang's default);
    ``context_len``: the model's context (prompts are cut to half of it); ``accept_rate``: each draft's chance
    to be accepted; ``workload``: the requests (:class:`~workbench.engines.scheduler_base.WorkloadSettings`).
    Steps where sglang runs nothing are not written (the step numbers skip them). ``stats`` counts what the
    run did; ``findings`` names every state the toy model found off what the engine said it holds.

    Raises :class:`EngineError` when sglang 0.5.23 is not importable, an option is not one the driver has,
    sglang resolves the deployment into another one, or sglang does something a trace cannot say (named);
    sglang's own errors propagate.
    """
    if prefix_cache not in PREFIX_CACHES:
        raise EngineError(f"prefix_cache = {prefix_cache!r}: the sglang driver runs {' or '.join(PREFIX_CACHES)}")
    if layer != GDN:
        raise EngineError(f"layer = {layer!r}: the sglang driver runs a GDN model (Qwen3-Next) only")
    if not isinstance(mixed, bool):
        raise EngineError(f"mixed = {mixed!r}: must be True or False")
    _validate(
        steps=(steps, 1), seed=(seed, 0), spec=(spec, 0), max_running=(max_running, 1), mamba_slots=(mamba_slots, 4),
        kv_tokens=(kv_tokens, 64), chunked_prefill=(chunked_prefill, 64), context_len=(context_len, 256),
    )  # fmt: skip
    if track_interval is not None:
        _validate(track_interval=(track_interval, 1))
    if spec == 1:
        raise EngineError("spec = 1: an EAGLE verify row feeds its token and at least one draft (D >= 2; 0: none)")
    if not 0.0 <= accept_rate <= 1.0:
        raise EngineError(f"accept_rate = {accept_rate!r}: must be in [0, 1]")
    settings = workload or WorkloadSettings()
    t0 = time.perf_counter()
    sg = load()
    d = Deployment(
        prefix_cache, spec, mixed, max_running, mamba_slots, kv_tokens, chunked_prefill, track_interval,
        context_len, settings.vocab,
    )  # fmt: skip
    notes = [
        f"{what}: {why}"
        for what, why in (
            *sglang_0_5_23.STANDIN_PACKAGES,
            *sglang_standins.IMPORT_PACKAGES,
            *sglang_standins.ENGINE_MODULES,
            *sglang_standins.CPU_PATCHES,
            *sglang_standins.SCHEDULER_SHELL,
            *DRIVER_STANDINS,
        )
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _engine(sg, d) as parts:
            t1 = time.perf_counter()
            driver = _Driver(sg, d, parts, seed, settings, accept_rate)
            drive(driver, steps)
            assert driver.recorder is not None
            driver.recorder.detach()
    trace = driver.trace
    trace.notes.extend(notes)
    RUN_WARNINGS.extend(f"{w.category.__name__}: {w.message}" for w in caught)
    trace.stats["import_ms"] = round(1000 * (t1 - t0))
    trace.stats["run_ms"] = round(1000 * (time.perf_counter() - t1))
    return trace


__all__ = [
    "DRIVER_STANDINS",
    "PREFIX_CACHES",
    "Deployment",
    "Sglang",
    "drive",
    "load",
    "model_config_json",
    "run_sglang_scheduler",
    "toy_hash",
]
