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

How sglang's state maps to the trace:

- **slots** are ``MambaPool`` slots as sglang hands them out (``num_slots`` = the pool's size + 1: slot 0 is
  sglang's dummy slot, the profile's); a row's ``slot`` is its request's ``mamba_pool_idx``. Its
  ``req_pool_index`` is sglang's own ``req_pool_idx`` (row 0 reserved there too, stable for the request's
  life). The ping-pong track slots of ``extra_buffer`` are no row's: the trace names them where a track or
  a checkpoint does.
- **rows** in sglang's order (``batch.reqs``), each with its ``kind``: a prefill chunk ``extend``; a verify
  (EAGLE, chain, topk 1) ``verify``, feeding the pending bonus token and the ``D - 1`` drafts on top of
  ``seq_lens``; a one-token ``decode``: a decode step's row without speculation, or a running request a
  ``MIXED`` step appends after the prefill rows (sglang keeps mixed chunk on for EAGLE: the running requests
  then feed their bonus token as one-token extend rows, never tracked). ``accepted`` is sglang's
  ``num_correct_drafts_per_req_cpu`` (drafts, no bonus; header ``"accepted": "drafts"``).
- **prefix keys**: ``hits`` (a request admitted with a matched prefix: its length and the copy-on-write
  source), ``copies_before`` (the copy-on-write pairs, ``mamba_cow_src_indices`` -> ``mamba_cow_dst_indices``),
  ``copies_after`` (what the forward copies into track slots, then ``MambaPool.copy_from`` of a
  ``no_buffer`` insert), ``checkpoints`` (every insert that gives the tree a new mamba value: the request,
  the inserted key's length, the slot), ``evict`` (a published slot the cache gives back to the allocator).
  The cache's work after a forward (result processing, and the next scheduling round, where the chunked
  request's insert and the evictions for new admissions happen; no forward runs in between) is the step's;
  an eviction whose slot no later write of that work reuses is written at the next step, before its
  admissions, as the format orders them.
- **track fields** (``extra_buffer``): an extend or mixed step's ``mamba_track_mask``,
  ``mamba_track_indices``, ``mamba_track_seqlens`` as the batch hands them to the forward (the running tails
  of a mixed step at -1), with ``mamba_chunk_size`` and the final-state copies (``track_ssm_final_src`` /
  ``_dst``, and the same pairs in ``copies_after``); a verify step's ``mamba_track_indices`` as
  ``prepare_mamba_track_for_verify`` rebuilds them inside the forward and ``mamba_steps_to_track`` from
  ``_verify_commit_step_indices`` (a verify batch reaches the forward still carrying the track fields of the
  extend step it was merged from: the forward clears them, so the trace records what it uses, and
  ``stats["verify_stale_track_fields"]`` counts them); without speculation a decode step's mask and indices,
  and ``mamba_track_seqlens`` (sglang keeps none for a decode: each tracked row's ``seq_len``, -1 elsewhere).
- ``zero_on_alloc``: sglang clears a fresh running slot before its first forward (``mamba_needs_clear``).

The trace is written by :class:`Recorder`, attached to the ``Scheduler`` instance through hooks (its
``get_next_batch_to_run``, ``run_batch``, ``process_batch_result``, the model worker's ``verify``, the target's
linear-attention backend's ``init_forward_metadata``, the tree cache's and the pool's methods); the driver
supplies the requests, the fake forward and the toy model, so the same recorder serves a live scheduler
(:mod:`workbench.engines.sglang_dump`). Each step's ``metadata`` also carries the GDN backend's
``state_indices`` (``mamba_cache_indices``) and ``query_start_loc`` as it built them for the target forward,
which ``workbench trace check`` compares with the profile's.

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.engines import sglang_0_5_23, sglang_standins
from workbench.engines.scheduler_base import (
    Acceptance,
    SchedulerTrace,
    TraceIds,
    Workload,
    WorkloadSettings,
    step_mode,
    trace_header,
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
        imp("sglang.srt.mem_cache.unified_radix_cache")
        imp("sglang.srt.managers.schedule_policy")
        results = imp("sglang.srt.managers.scheduler_components.batch_result_processor")
        logprobs = imp("sglang.srt.managers.scheduler_components.logprob_result_processor")
        scheduler = imp("sglang.srt.managers.scheduler")
        utils = imp("sglang.srt.managers.utils")
        disagg = imp("sglang.srt.disaggregation.utils")
        sampling = imp("sglang.srt.sampling.sampling_params")
        fbi = imp("sglang.srt.model_executor.forward_batch_info")
    IMPORT_WARNINGS.extend(f"{w.category.__name__}: {w.message}" for w in caught)
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


# -- observing the cache ------------------------------------------------------------------------------
@dataclass
class _Event:
    """One thing the cache did to a mamba slot: ``copy`` (``src`` -> ``slot``), ``publish`` (``slot`` holds
    ``request``'s state after its first ``tokens`` ids, the key's ``ids``) or ``free`` (``slot`` back to the
    allocator)."""

    kind: str
    slot: int
    src: int = -1
    request: int | None = None  # the trace's id of the request being cached
    tokens: int = 0
    ids: tuple[int, ...] = ()
    finished: bool = False
    forward: bool = False  # during the fake forward (copy-on-write), not the cache's own work


def _patch(obj: Any, name: str, new: Any) -> Callable[[], None]:
    """Set ``obj.name = new`` on the instance; returns the function that puts back what was there."""
    own = name in vars(obj)
    old = vars(obj).get(name)
    setattr(obj, name, new)

    def restore() -> None:
        if own:
            setattr(obj, name, old)
        else:
            delattr(obj, name)

    return restore


class _CacheEvents:
    """Wraps the tree cache's and the pool's methods on their instances (:data:`DRIVER_STANDINS`) and lists, in
    order, what they did to mamba slots; :meth:`restore` puts the methods back."""

    def __init__(self, tree_cache: Any, req_pool: Any, ids: TraceIds, on_publish: Callable[[_Event], None]) -> None:
        self.events: list[_Event] = []
        self.forward = False
        self.ids = ids  # sglang's request ids -> the trace's, as they are when the event happens
        self.on_publish = on_publish  # called as the tree takes the slot (the state is the one published)
        self._caching: list[Any] = []  # the requests being cached (checkpoint_into_tree), innermost last
        cache, pool = tree_cache, req_pool
        checkpoint, insert = cache.checkpoint_into_tree, cache.insert
        copy_from, free = pool.mamba_pool.copy_from, pool.mamba_allocator.free

        def checkpoint_into_tree(req: Any, *, up_to: int, **kwargs: Any) -> Any:
            self._caching.append(req)
            try:
                return checkpoint(req, up_to=up_to, **kwargs)
            finally:
                self._caching.pop()

        def insert_(params: Any) -> Any:
            result = insert(params)
            value = getattr(params, "mamba_value", None)
            if value is not None and not result.mamba_exist:
                self._publish(params, int(value.view(-1)[0]))
            return result

        def copy_from_(src: Any, dst: Any) -> Any:
            req = self._caching[-1] if self._caching else None
            for a, b in zip(src.view(-1).tolist(), dst.view(-1).tolist(), strict=True):
                self.events.append(
                    _Event(
                        "copy",
                        int(b),
                        src=int(a),
                        request=None if req is None else self.ids[req.rid],
                        forward=self.forward,
                    )
                )
            return copy_from(src, dst)

        def free_(index: Any) -> Any:
            for slot in index.view(-1).tolist():
                self.events.append(_Event("free", int(slot), forward=self.forward))
            return free(index)

        self._restore = [
            _patch(cache, "checkpoint_into_tree", checkpoint_into_tree),
            _patch(cache, "insert", insert_),
            _patch(pool.mamba_pool, "copy_from", copy_from_),
            _patch(pool.mamba_allocator, "free", free_),
        ]

    def restore(self) -> None:
        """Put the wrapped methods back (in reverse order)."""
        for restore in reversed(self._restore):
            restore()
        self._restore = []

    def _publish(self, params: Any, slot: int) -> None:
        if not self._caching:
            raise EngineError(f"sglang gave mamba slot {slot} to the tree outside a request's caching: not modelled")
        req = self._caching[-1]
        n = len(params.key)  # an EAGLE key is of bigrams: the state is of its first len(key) token ids
        ids = tuple(int(t) for t in params.key.token_ids[:n])
        event = _Event("publish", slot, request=self.ids[req.rid], tokens=n, ids=ids, finished=req.finished())
        self.on_publish(event)
        self.events.append(event)

    def take(self) -> list[_Event]:
        out, self.events = self.events, []
        return out


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


# -- one step in sglang's terms ---------------------------------------------------------------------------
@dataclass
class _Row:
    """One request of a batch, in sglang's order."""

    req: Any
    tid: int  # the trace's id of the request (-1 until the recorder knows it)
    kind: str
    pool_row: int
    slot: int
    cached: int
    new: int
    tokens: list[int]  # a verify row's: empty until its draft tokens are seen
    accepted: int | None = None  # a verify's num_correct_drafts


@dataclass
class _Step:
    """What one engine step did: its rows, and the requests (by their trace ids) it admitted, hit, finished."""

    number: int
    rows: list[_Row]
    admitted: list[int]
    hits: list[tuple[int, int, int]]  # (request, tokens, slot)
    cow: list[tuple[int, int]]  # (source, destination)
    track: dict[str, Any]  # the track fields the forward used
    track_copies: list[tuple[int, int]]  # (running slot, track slot): the forward's copies after it
    finished: list[int] = field(default_factory=list)
    retracted: list[int] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)  # the backend's: state_indices, query_start_loc


def _ids(req: Any) -> list[int]:
    return [*req.origin_input_ids, *req.output_ids]


def batch_rows(batch: Any, req_pool: Any, draft_tokens: int) -> list[_Row]:
    """A ``ScheduleBatch``'s rows in sglang's order: kind, request-pool row, slot, cached and new tokens, the
    tokens (a verify row's are left empty: its drafts exist only inside the forward). Each slot is checked
    against what the pool maps the row to (``get_mamba_indices``, what the backend reads)."""
    mode, spec = batch.forward_mode, not batch.spec_algorithm.is_none()
    tails = {id(r) for r in (batch.decoding_reqs or [])} if mode.is_mixed() else set()
    pool_rows, seq_lens = batch.req_pool_indices.tolist(), batch.seq_lens.tolist()
    mapped = req_pool.get_mamba_indices(batch.req_pool_indices).tolist()
    out = []
    for i, req in enumerate(batch.reqs):
        ids = _ids(req)
        if mode.is_extend():
            kind = "decode" if id(req) in tails else "extend"
            cached, new = int(batch.prefix_lens[i]), int(batch.extend_lens[i])
        elif spec:
            kind, cached, new = "verify", int(seq_lens[i]), draft_tokens
        else:
            kind, cached, new = "decode", int(seq_lens[i]) - 1, 1
        tokens = [] if kind == "verify" else ids[cached : cached + new]
        if len(tokens) != new if kind != "verify" else len(ids) <= cached:
            raise EngineError(f"request {req.rid}: {new} tokens from {cached}, but it has {len(ids)}")
        slot, row = int(req.kv.mamba_pool_idx), int(pool_rows[i])
        if slot != int(mapped[i]):
            raise EngineError(
                f"request {req.rid}: slot {slot} on pool row {row}, but the pool maps the row to {mapped[i]}"
            )
        out.append(_Row(req, -1, kind, row, slot, cached, new, tokens))
    return out


def cow_pairs(batch: Any) -> list[tuple[int, int]]:
    """The batch's copy-on-write pairs (``mamba_cow_src_indices`` -> ``mamba_cow_dst_indices``)."""
    if batch.mamba_cow_src_indices is None:
        return []
    return list(zip(batch.mamba_cow_src_indices.tolist(), batch.mamba_cow_dst_indices.tolist(), strict=True))


def track_fields(batch: Any, rows: list[_Row], chunk: int) -> tuple[dict[str, Any], list[tuple[int, int]]]:
    """An extend, mixed or (non-speculative) decode batch's track fields, as the forward reads them, and the
    copies after the forward they make (final states into track slots); a verify's are rebuilt inside its
    forward (empty here). ``chunk``: ``mamba_cache_chunk_size``."""
    verify = batch.forward_mode.is_decode() and not batch.spec_algorithm.is_none()
    if verify or batch.mamba_track_mask is None or batch.mamba_track_indices is None:
        return {}, []
    mask = [bool(x) for x in batch.mamba_track_mask.tolist()]
    indices = [int(x) for x in batch.mamba_track_indices.tolist()]
    if batch.forward_mode.is_extend():
        seqlens = [int(x) for x in batch.mamba_track_seqlens.tolist()]
        final = [(r.slot, indices[i]) for i, r in enumerate(rows) if mask[i] and (seqlens[i] - r.cached) % chunk == 0]
        fields: dict[str, Any] = {
            "mamba_track_mask": mask,
            "mamba_track_indices": indices,
            "mamba_track_seqlens": seqlens,
            "mamba_chunk_size": chunk,
            "track_ssm_final_src": [a for a, _ in final],
            "track_ssm_final_dst": [b for _, b in final],
        }
        return fields, list(final)
    seqlens = [r.cached + r.new if m else -1 for r, m in zip(rows, mask, strict=True)]
    copies = [(r.slot, indices[i]) for i, r in enumerate(rows) if mask[i]]
    return {"mamba_track_mask": mask, "mamba_track_indices": indices, "mamba_track_seqlens": seqlens}, copies


def linear_backend(sched: Any) -> Any:
    """The target model's linear-attention backend of a ``Scheduler`` (``tp_worker.model_runner.attn_backend``'s
    ``linear_attn_backend``, the hybrid backend's GDN part), or None."""
    runner = getattr(getattr(sched, "tp_worker", None), "model_runner", None)
    return getattr(getattr(runner, "attn_backend", None), "linear_attn_backend", None)


# -- the recorder -------------------------------------------------------------------------------------
class Recorder:
    """Attached to one sglang ``Scheduler`` instance, writes down what it does as a trace (the module docstring:
    the mapping). The CPU driver records with it, and so does ``workbench.engines.sglang_dump`` in a live
    scheduler process.

    :meth:`attach` wraps, on their instances: the scheduler's ``get_next_batch_to_run`` (the round's number,
    retractions), ``run_batch`` (before the forward: rows, admissions, hits, copy-on-write, track fields) and
    ``process_batch_result`` (accepted drafts ``num_correct_drafts_per_req_cpu``, finished requests); the model
    worker's ``verify(batch, ...)`` under EAGLE (the verify input's ``draft_token``, ``[bs * D]``, before it
    runs; the track indices ``prepare_mamba_track_for_verify`` rebuilt and the commit's tracked step after it);
    the target model's linear-attention backend's ``init_forward_metadata(forward_batch)`` and
    ``init_forward_metadata_out_graph(forward_batch, in_capture)`` (its ``forward_metadata``:
    ``mamba_cache_indices`` as ``state_indices``, ``query_start_loc``; a graph replay's ``bucket``); and the tree
    cache's and the pool's methods (:class:`_CacheEvents`). :meth:`detach` puts them back.

    A step goes to ``trace.steps`` at the next ``run_batch`` (the cache's work until then is its), or at
    :meth:`finish`; then :meth:`written` is called, and every step in ``trace.steps`` is final.

    ``sg``: the sglang names it uses (``version``, ``commit``, ``runtime_context``,
    ``verify_commit_step_indices``: :class:`Sglang` or ``sglang_dump.sglang_names()``). ``backend``: the
    linear-attention backend to read (None: :func:`linear_backend`; no metadata is recorded without one).
    ``on_publish``: called with each published checkpoint as the tree takes it. Errors: :meth:`failed` (here:
    raised). Raises :class:`EngineError` for a deployment it cannot follow (named).
    """

    def __init__(
        self,
        sg: Any,
        sched: Any,
        *,
        seed: int | None = None,
        backend: Any = None,
        on_publish: Callable[[_Event], None] | None = None,
    ) -> None:
        rc = sg.runtime_context
        self.sg, self.sched = sg, sched
        _check_followable(rc, sched)
        spec = rc.get_spec()
        self.draft_tokens = 0 if sched.spec_algorithm.is_none() else int(spec.speculative_num_draft_tokens)
        self.pool, self.tree_cache = sched.req_to_token_pool, sched.tree_cache
        self.chunk = int(rc.mamba_cache_chunk_size())
        self.backend = backend if backend is not None else linear_backend(sched)
        self.trace = SchedulerTrace(
            _header(sg, sched.max_running_requests, self.draft_tokens, self.pool.mamba_pool.size + 1, seed, GDN)
        )
        self.stats = self.trace.stats
        self.writer = _TraceWriter(self.trace)
        self.ids = TraceIds()
        self.on_publish = on_publish
        self.live: dict[str, Any] = {}  # requests that hold a row and a slot
        self.pool_rows: dict[str, int] = {}  # each live request's request-pool row (stable while it lives)
        self.round = -1  # get_next_batch_to_run calls so far, less one: the step's number
        self.current: _Step | None = None  # between run_batch and the end of process_batch_result
        self.pending: _Step | None = None  # processed, waiting for the next run_batch (the cache's work)
        self.events: _CacheEvents | None = None
        self.active = False
        self._restore: list[Callable[[], None]] = []

    # -- hooks -----------------------------------------------------------------------------------------
    def _guarded(self, hook: Callable[..., None], *args: Any) -> None:
        if self.active:
            try:
                hook(*args)
            except Exception as e:  # noqa: BLE001 -- failed() decides
                self.failed(e)

    def attach(self) -> None:
        """Wrap the methods (class docstring) on their instances (once)."""
        if self._restore:
            raise EngineError("this recorder is attached already")
        sched = self.sched
        next_batch, run_batch, process = sched.get_next_batch_to_run, sched.run_batch, sched.process_batch_result

        def get_next_batch_to_run(*args: Any, **kwargs: Any) -> Any:
            plan = next_batch(*args, **kwargs)
            self._guarded(self.scheduled, plan)
            return plan

        def run_batch_(batch: Any, *args: Any, **kwargs: Any) -> Any:
            self._guarded(self.before_forward, batch)
            forward = self.active and self.events is not None
            if forward:
                assert self.events is not None
                self.events.forward = True
            try:
                result = run_batch(batch, *args, **kwargs)
            finally:
                if forward and self.events is not None:
                    self.events.forward = False
            self._guarded(self.after_forward, batch)
            return result

        def process_batch_result_(batch: Any, result: Any, *args: Any, **kwargs: Any) -> Any:
            out = process(batch, result, *args, **kwargs)
            self._guarded(self.processed, batch, result)
            return out

        self.events = _CacheEvents(self.tree_cache, self.pool, self.ids, self._published)
        self._restore = [
            self.events.restore,
            _patch(sched, "get_next_batch_to_run", get_next_batch_to_run),
            _patch(sched, "run_batch", run_batch_),
            _patch(sched, "process_batch_result", process_batch_result_),
            *self._attach_worker(),
            *self._attach_backend(),
        ]
        self.active = True

    def _attach_worker(self) -> list[Callable[[], None]]:
        if not self.draft_tokens:
            return []
        worker = self.sched.model_worker
        verify = worker.verify

        def verify_(batch: Any, *args: Any, **kwargs: Any) -> Any:
            self._guarded(self.drafts, batch)
            result = verify(batch, *args, **kwargs)
            self._guarded(self.verified, batch, result)
            return result

        return [_patch(worker, "verify", verify_)]

    def _attach_backend(self) -> list[Callable[[], None]]:
        backend = self.backend
        if backend is None:
            return []
        eager, graph = backend.init_forward_metadata, backend.init_forward_metadata_out_graph

        def init_forward_metadata(forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
            out = eager(forward_batch, *args, **kwargs)
            self._guarded(self.forward_metadata, None)
            return out

        def init_forward_metadata_out_graph(forward_batch: Any, in_capture: bool = False, **kwargs: Any) -> Any:
            out = graph(forward_batch, in_capture=in_capture, **kwargs)
            if not in_capture:
                self._guarded(self.forward_metadata, int(forward_batch.batch_size))
            return out

        return [
            _patch(backend, "init_forward_metadata", init_forward_metadata),
            _patch(backend, "init_forward_metadata_out_graph", init_forward_metadata_out_graph),
        ]

    def detach(self) -> None:
        """Put back what :meth:`attach` wrapped (in reverse order); the recorder stops."""
        self.active = False
        for restore in reversed(self._restore):
            restore()
        self._restore = []

    def failed(self, error: Exception) -> None:
        """An error while recording a step: raised (the driver's rule; the dumper overrides)."""
        raise error

    def written(self) -> None:
        """Called after steps reached ``trace.steps`` (all of them final)."""

    def _published(self, e: _Event) -> None:
        if self.on_publish is not None:
            self.on_publish(e)

    # -- the hooks' work -----------------------------------------------------------------------------
    def scheduled(self, plan: Any) -> None:
        """After ``get_next_batch_to_run``: the round's number; the live requests it retracted (they finish at
        the last step written, and start over under a new id when readmitted)."""
        self.round += 1
        out = [rid for rid in sorted(self.live) if getattr(self.live[rid], "is_retracted", False)]
        for rid in out:
            del self.live[rid]
            self.pool_rows.pop(rid, None)
        tids = [self.ids[rid] for rid in out]
        if self.pending is not None and tids:
            self.pending.retracted.extend(tids)
        elif tids:
            self.writer.retract(tids)
        batch = plan.batch_to_run
        if batch is None or batch.is_empty():
            self.stats["empty_steps"] += 1

    def before_forward(self, batch: Any) -> None:
        """``run_batch`` is called: the step before goes to the trace; this one's rows, admissions, hits,
        copy-on-write and track fields."""
        if self.current is not None:
            raise EngineError(f"sglang ran a batch before step {self.current.number}'s result was processed")
        self._flush()
        rows = batch_rows(batch, self.pool, self.draft_tokens)
        for r in rows:
            row = self.pool_rows.get(r.req.rid, r.pool_row)
            if row != r.pool_row:
                raise EngineError(f"request {r.req.rid}: pool row {r.pool_row}, but the request had row {row}")
            if r.req.rid in self.live:
                r.tid = self.ids[r.req.rid]
        admitted, hits, cow = self._admissions(rows, batch)
        track, track_copies = track_fields(batch, rows, self.chunk)
        if track:
            self.stats["extend_track_rows" if batch.forward_mode.is_extend() else "decode_track_rows"] += sum(
                track["mamba_track_mask"]
            )
        if self.draft_tokens and batch.forward_mode.is_decode():
            self.stats["verify_stale_track_fields"] += int(batch.mamba_track_mask is not None)
        self.current = _Step(self.round, rows, admitted, hits, cow, track, track_copies)

    def _admissions(
        self, rows: list[_Row], batch: Any
    ) -> tuple[list[int], list[tuple[int, int, int]], list[tuple[int, int]]]:
        """The requests admitted at this step (given their trace ids: a request sglang readmits after a
        retraction starts over under a new one), their hits (request, tokens, copy-on-write source) and the
        copy-on-write pairs of the batch."""
        cow = cow_pairs(batch)
        source = {dst: src for src, dst in cow}
        admitted, hits = [], []
        for r in rows:
            rid = r.req.rid
            if rid in self.live:
                continue
            if r.kind != "extend":
                raise EngineError(f"request {rid} first runs as a {r.kind} row")
            r.tid = self.ids.readmit(rid) if rid in self.ids else self.ids.admit(rid)
            admitted.append(r.tid)
            self.live[rid] = r.req
            self.pool_rows[rid] = r.pool_row
            if r.cached:
                if r.slot not in source:
                    raise EngineError(f"request {rid} starts from {r.cached} cached tokens with no copy-on-write")
                hits.append((r.tid, r.cached, source[r.slot]))
        return admitted, hits, cow

    def drafts(self, batch: Any) -> None:
        """The verify's input (``batch.spec_info.draft_token``: per row the pending token, then its drafts)."""
        step = self._step("a verify")
        d = self.draft_tokens
        flat = [int(t) for t in batch.spec_info.draft_token.view(-1).tolist()]
        if len(flat) != d * len(step.rows):
            raise EngineError(
                f"step {step.number}: the verify input holds {len(flat)} draft tokens for {len(step.rows)} rows of "
                f"D = {d} (a tree, topk > 1, is not followed)"
            )
        for b, r in enumerate(step.rows):
            tokens = flat[b * d : (b + 1) * d]
            want = _ids(r.req)[r.cached]
            if r.kind != "verify" or tokens[0] != want:
                raise EngineError(
                    f"step {step.number}: request {r.req.rid}'s verify row starts with token {tokens[0]}, its pending "
                    f"token is {want} ({r.kind} row)"
                )
            r.tokens = tokens

    def verified(self, batch: Any, result: Any) -> None:
        """After the verify: the track indices it used and the step each row tracks at commit."""
        import torch

        step = self._step("a verify")
        if batch.mamba_track_indices is None:
            return
        host = types.SimpleNamespace(
            seq_lens=batch.seq_lens.cpu(),
            mamba_track_indices=batch.mamba_track_indices.cpu(),
            tree_cache=batch.tree_cache,
        )
        _, to_track = self.sg.verify_commit_step_indices(
            batch=host,
            accept_index=result.accept_index.cpu(),
            accept_lens=result.accept_lens.cpu().to(torch.int32),
            draft_token_num=self.draft_tokens,
        )
        if to_track is None:
            return
        steps = [int(x) for x in to_track.tolist()]
        step.track = {
            "mamba_track_indices": [int(x) for x in host.mamba_track_indices.tolist()],
            "mamba_steps_to_track": steps,
        }
        self.stats["verify_track_rows"] += sum(s >= 0 for s in steps)

    def forward_metadata(self, bucket: int | None) -> None:
        """The target backend built its metadata for the step's forward (``bucket``: a graph replay's size)."""
        step = self.current
        if step is None:
            return  # a forward outside a step (a warm-up, a capture)
        if step.metadata:
            self.stats["metadata_extra_calls"] += 1
            return
        m = self.backend.forward_metadata
        if bucket is not None:
            step.metadata["bucket"] = bucket
        step.metadata["state_indices"] = [int(x) for x in m.mamba_cache_indices.tolist()]
        step.metadata["query_start_loc"] = [int(x) for x in m.query_start_loc.tolist()]

    def after_forward(self, batch: Any) -> None:
        step = self._step("a forward")
        for r in step.rows:
            if r.kind == "verify" and not r.tokens:
                raise EngineError(
                    f"step {step.number}: request {r.req.rid}'s draft tokens never reached the recorder (the model "
                    "worker's verify was not called)"
                )

    def processed(self, batch: Any, result: Any) -> None:
        """After ``process_batch_result``: acceptance read back from sglang, finished requests."""
        step = self._step("a result")
        self.current = None
        drafts = result.num_correct_drafts_per_req_cpu
        for i, r in enumerate(step.rows):
            if r.kind == "verify":
                if drafts is None:
                    raise EngineError(f"step {step.number}: sglang's result of a verify has no accepted drafts")
                r.accepted = int(drafts[i])
            if r.req.finished() and r.req.rid in self.live:
                del self.live[r.req.rid]
                self.pool_rows.pop(r.req.rid, None)
                step.finished.append(r.tid)
        self.pending = step

    def _step(self, what: str) -> _Step:
        if self.current is None:
            raise EngineError(f"sglang reached {what} outside a run_batch the recorder saw")
        return self.current

    def _flush(self) -> None:
        """The pending step, with the cache's work since its forward, to ``trace.steps``."""
        step, self.pending = self.pending, None
        if step is None:
            return
        assert self.events is not None
        self.writer.add(step, self.events.take())
        if step.retracted:
            self.writer.retract(step.retracted)
        self.written()

    def finish(self) -> None:
        """The last step to the trace (no later scheduling round will add to it)."""
        self._flush()
        self.stats["evict_after_last_step"] += len(self.writer.carry)  # no step left to write them at
        self.writer.carry = []


def _check_followable(rc: Any, sched: Any) -> None:
    """The deployment is one the recorder follows, or an :class:`EngineError` naming the setting and value."""
    overlap = bool(getattr(sched, "enable_overlap", False)) or not rc.get_schedule().disable_overlap_schedule
    if overlap:
        raise EngineError(
            "disable_overlap_schedule = False: the sglang recorder needs --disable-overlap-schedule (a step's "
            "result must be processed before the next step runs)"
        )
    mamba = rc.get_exec().mamba
    if mamba.enable_mamba_extra_buffer_lazy:
        raise EngineError("mamba_radix_cache_strategy = 'extra_buffer_lazy': the trace format does not model it")
    if not sched.spec_algorithm.is_none():
        spec = rc.get_spec()
        if not sched.spec_algorithm.is_eagle() or (spec.speculative_eagle_topk or 1) != 1:
            raise EngineError(
                f"speculative_algorithm = {spec.speculative_algorithm!r}, speculative_eagle_topk = "
                f"{spec.speculative_eagle_topk!r}: the recorder follows EAGLE chains (topk 1) only"
            )
    if not hasattr(sched.req_to_token_pool, "mamba_pool"):
        raise EngineError(
            f"req_to_token_pool = {type(sched.req_to_token_pool).__name__}: not a hybrid pool (no mamba state)"
        )


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


# -- the trace ----------------------------------------------------------------------------------------
class _TraceWriter:
    """Turns each :class:`_Step` and the cache's work after its forward into the file's step object (module
    docstring: the mapping), keeping what the trace says across steps: ids and live checkpoints."""

    def __init__(self, trace: SchedulerTrace) -> None:
        self.trace, self.stats = trace, trace.stats
        self.live: dict[int, tuple[int, int]] = {}  # slot -> (trace id, tokens) of a live checkpoint
        self.carry: list[int] = []  # evictions for the next step's start

    def add(self, s: _Step, work: list[_Event]) -> None:
        """Step ``s`` with the cache's work after its forward (``work``, in order)."""
        evict = self._start(s)
        meta: dict[str, Any] = {
            "evict": evict,
            "hits": [{"request": tid, "tokens": n, "slot": slot} for tid, n, slot in s.hits],
            "copies_before": [[a, b] for a, b in s.cow],
            "copies_after": [[a, b] for a, b in s.track_copies],
            "checkpoints": [],
        }
        meta["evict"] += self._work(s, work, meta)
        rows = [self._row(r) for r in s.rows]
        metadata = {k: v for k, v in meta.items() if v}
        metadata.update(s.track)
        metadata.update(s.metadata)  # the backend's: state_indices, query_start_loc (a replay's bucket first)
        self.trace.steps.append({
            "step": s.number,
            "mode": step_mode([r.kind for r in s.rows]),
            "rows": rows,
            "admit": list(s.admitted),
            "finish": list(s.finished),
            "metadata": metadata or None,
        })  # fmt: skip
        self._count(s, metadata)

    def retract(self, tids: list[int]) -> None:
        """Requests sglang retracted after the last step written: they finish there."""
        if not tids:
            return
        if not self.trace.steps:
            raise EngineError(f"sglang retracted requests {tids} before any step ran")
        self.trace.steps[-1]["finish"].extend(tids)
        self.stats["retracted"] += len(tids)

    def _start(self, s: _Step) -> list[int]:
        """The evictions carried to this step's start (checked against its hits; :meth:`_work` took them out of
        ``live`` when sglang freed them)."""
        evict, self.carry = self.carry, []
        self.stats["evict_next_step"] += len(evict)
        hit = {slot for _, _, slot in s.hits}
        for slot in evict:
            if slot in hit:
                raise EngineError(f"step {s.number}: sglang evicted slot {slot} after a request hit it in this step")
        return evict

    def _work(self, s: _Step, work: list[_Event], meta: dict[str, Any]) -> list[int]:
        """The cache's work after the step's forward: copies and checkpoints into ``meta``; the evictions
        that must come at this step's start (returned: a later write of the same work reuses the slot),
        the others carried to the next step."""
        start = set(self.live)
        hit = {slot for _, _, slot in s.hits}
        own: list[int] = []
        for i, e in enumerate(work):
            if e.kind == "copy" and e.forward:  # the copy-on-write before the forward
                if (e.src, e.slot) not in s.cow:
                    raise EngineError(
                        f"step {s.number}: a copy {e.src} -> {e.slot} in the forward, not a copy-on-write"
                    )
            elif e.kind == "copy":
                if e.request is None:
                    raise EngineError(f"step {s.number}: sglang copied slot {e.src} -> {e.slot} outside caching")
                meta["copies_after"].append([e.src, e.slot])
            elif e.kind == "publish":
                self._publish(s, e, meta)
            elif e.slot in self.live:
                del self.live[e.slot]
                reused = any(x.slot == e.slot and x.kind in ("copy", "publish") for x in work[i + 1 :])
                if not reused:
                    self.carry.append(e.slot)
                elif e.slot in start and e.slot not in hit:
                    own.append(e.slot)
                    self.stats["evict_this_step"] += 1
                else:
                    raise EngineError(
                        f"step {s.number}: sglang evicted slot {e.slot} and wrote it again after the forward, but "
                        "the trace cannot evict it before the step (published or hit in it)"
                    )
        return own

    def _publish(self, s: _Step, e: _Event, meta: dict[str, Any]) -> None:
        if e.slot in self.live:
            raise EngineError(f"step {s.number}: sglang published slot {e.slot}, which holds a live checkpoint")
        assert e.request is not None
        self.live[e.slot] = (e.request, e.tokens)
        meta["checkpoints"].append({"request": e.request, "tokens": e.tokens, "slot": e.slot})
        self.stats["published_finished" if e.finished else "published_running"] += 1

    @staticmethod
    def _row(r: _Row) -> dict[str, Any]:
        return {
            "id": r.tid,
            "slot": r.slot,
            "req_pool_index": r.pool_row,
            "seq_len": r.cached + r.new,
            "new_tokens": r.new,
            "cached_tokens": r.cached,
            "accepted": r.accepted,
            "tokens": r.tokens,
            "kind": r.kind,
        }

    def _count(self, s: _Step, metadata: dict[str, Any]) -> None:
        """What a step did, added to the stats."""
        stats = self.stats
        kinds = Counter(r.kind for r in s.rows)
        stats["steps"] += 1
        stats[f"steps_{step_mode(list(kinds))}"] += 1
        for kind, n in kinds.items():
            stats[f"rows_{kind}"] += n
        stats["admitted"] += len(s.admitted)
        stats["hits"] += len(s.hits)
        stats["finished"] += len(s.finished)
        for key in ("evict", "copies_before", "copies_after", "checkpoints"):
            stats[key] += len(metadata.get(key, ()))


def _header(
    sg: Any, max_running: int, draft_tokens: int, num_slots: int, seed: int | None, layer: str
) -> dict[str, Any]:
    return trace_header(
        "sglang", version=sg.version, commit=sg.commit, max_running=max_running, draft_tokens=draft_tokens,
        num_slots=num_slots, seed=seed, layer=layer, accepted="drafts", zero_on_alloc=True,
    )  # fmt: skip


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
    "Recorder",
    "Sglang",
    "batch_rows",
    "drive",
    "linear_backend",
    "load",
    "model_config_json",
    "run_sglang_scheduler",
    "toy_hash",
    "track_fields",
]
