"""vLLM 0.33.0's own scheduler as a trace source: ``run_vllm_scheduler`` drives the released engine's v1
``Scheduler`` on the CPU and writes down, step by step, what one GDN layer saw (``docs/traces.md``). It returns
a :class:`~workbench.engines.scheduler_base.SchedulerTrace`, the file's JSON objects (the engines layer sits
below ``workbench.traces``); ``workbench.traces.format.read_trace(run.lines())`` reads it into a ``Trace``.

    run = run_vllm_scheduler(steps=300, seed=0, spec=2, prefix_cache="align")   # D = 2: one MTP draft
    trace = read_trace(run.lines()); replay_trace(trace)

What runs is vLLM's code: ``Scheduler.schedule`` / ``update_from_output`` / ``update_draft_token_ids`` with
its ``KVCacheManager`` (the hybrid coordinator over a full-attention group and a GDN mamba group in
``mamba_cache_mode="align"``, the ``MambaManager`` and the ``BlockPool``: prefix-cache lookups, block
allocation and relocation, publishing, eviction, preemption), ``Request`` and its block hasher, the configs
(``VllmConfig``, ``CacheConfig``, ``SchedulerConfig``, ``DeviceConfig``, ``KVCacheConfig`` and its specs) with
the block sizes ``EngineCore`` resolves, Model Runner V2's batch order (``sort_batch_req_ids``), the worker's
align-mode pre-copy decisions (``mamba_utils.preprocess_mamba``, its host path) and the
``GDNAttentionMetadataBuilder`` for each step's state indices. An error any of them raises reaches the
caller. What a CPU run cannot have is stood in for (:data:`DRIVER_STANDINS`, each with its reason; the
import's stand-ins are the adapter's, ``vllm_0_33_0.STANDINS``).

How vLLM's state maps to the trace, the hooks on the ``Scheduler`` instance that write it and what a trace
cannot say yet: :mod:`workbench.engines.vllm_recorder` (its :class:`~workbench.engines.vllm_recorder.Recorder`).
"""

from __future__ import annotations

import functools
import logging
import sys
import time
import types
import warnings
from dataclasses import dataclass
from typing import Any

from workbench.engines import vllm_0_33_0
from workbench.engines.probes import Probe, has, run_probes, takes
from workbench.engines.scheduler_base import Acceptance, SchedulerTrace, Workload, WorkloadSettings
from workbench.engines.versions import EngineError
from workbench.engines.vllm_recorder import Deployment, Recorder, _commit, _finished
from workbench.layer_names import GDN

DRIVER_STANDINS: tuple[tuple[str, str], ...] = (
    (
        "ModelConfig",
        "a real one reads a Hugging Face config (a download or a local model folder). Stand-in: a namespace with "
        "the attributes the scheduler, the KV-cache manager, Request and the GDN builder read (a Qwen3-Next-like "
        "hybrid model), assigned after VllmConfig's checks.",
    ),
    (
        "SpeculativeConfig",
        "a real one (method 'mtp') builds the drafter's ModelConfig from the target's Hugging Face config. "
        "Stand-in: an MTP-like object with num_speculative_tokens; its methods and properties are "
        "SpeculativeConfig's own, bound to it.",
    ),
    (
        "StructuredOutputManager",
        "its package needs xgrammar and the tokenizers; no request here asks for structured output. Stand-in: "
        "pass-through (no bitmask, every token accepted), also the name scheduler.py imports from the adapter's "
        "stand-in package vllm.v1.structured_output.",
    ),
    (
        "the model and the drafter",
        "no weights run. Stand-in: ModelRunnerOutput with, per row that completes its prompt or verifies, the "
        "accepted drafts (workbench.engines.scheduler_base.Acceptance) and one random bonus token; "
        "num_speculative_tokens random draft ids per request after each step (DraftTokenIds).",
    ),
    (
        "the worker's copies",
        "the pre-copy and post-copy move GPU state bytes. preprocess_mamba runs (host path, align_ctx=None) with "
        "collect_mamba_copy_meta wrapped to record each decision; the post-copy decisions of "
        "postprocess_mamba_fused_kernel (a Triton kernel) are recomputed on the host per row.",
    ),
    (
        "the worker's request rows",
        "Model Runner V2 keeps each request on one request-state row for its life; the trace names rows lowest "
        "free first from 1 (row 0 is every profile's reserved row), freed at finish or preemption.",
    ),
    (
        "BlockPool",
        "wrapped, not replaced: cache_full_blocks / cache_partial_block (to know the request), "
        "_insert_block_hash (a new hash: a publish) and _remove_cached_block_hashes (an eviction) are observed.",
    ),
)
"""What the driver stands in for beyond the import's stand-ins (``vllm_0_33_0.STANDINS``): (what, why)."""

IMPORT_WARNINGS: list[str] = []
"""Warnings vLLM's scheduler imports raised (kept, not shown: the suite turns warnings into errors)."""

RUN_WARNINGS: list[str] = []
"""Warnings vLLM raised while a run drove it (kept, as :data:`IMPORT_WARNINGS`)."""

GDN_LAYER = "model.layers.0.linear_attn"
ATTN_LAYER = "model.layers.3.self_attn.attn"
GDN_SHAPES = ((3, 8192), (32, 128, 128))
"""Qwen3-Next-like GDN state shapes (conv window, recurrent state); the scheduler reads only the specs' kind."""


# -- importing ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Vllm:
    """The vLLM names the driver uses, imported once (:func:`load`)."""

    version: str
    commit: str | None
    VllmConfig: Any
    CacheConfig: Any
    DeviceConfig: Any
    SchedulerConfig: Any
    SpeculativeConfig: Any
    SamplingParams: Any
    EngineCoreRequest: Any
    Request: Any
    Scheduler: Any
    KVCacheConfig: Any
    KVCacheGroupSpec: Any
    FullAttentionSpec: Any
    MambaSpec: Any
    MambaAttentionBackendEnum: Any
    ModelRunnerOutput: Any
    DraftTokenIds: Any
    CommonAttentionMetadata: Any
    GDNAttentionMetadataBuilder: Any
    kv_cache_utils: Any
    mamba_utils: Any
    get_hash_fn_by_name: Any
    sort_batch_req_ids: Any


@functools.cache
def load() -> Vllm:
    """Import vLLM's scheduler, KV-cache manager and worker helpers (once per process), after the adapter's
    :func:`~workbench.engines.vllm_0_33_0.load` (its probes, stand-ins), and run the driver's own probes: it
    follows vLLM 0.33.0 (older releases lack the block hasher's lookahead and the alignment helper, and pick
    Model Runner V1 on a CPU) and builds that pass them; an :class:`EngineError` names the first that fails.
    vLLM's logger is set to errors only (its import and its scheduler log at info and warning level)."""
    logging.getLogger("vllm").setLevel(logging.ERROR)
    vllm_0_33_0.load()
    # scheduler.py imports the name StructuredOutputManager from the adapter's stand-in package
    package = sys.modules["vllm.v1.structured_output"]
    if not hasattr(package, "StructuredOutputManager"):
        package.StructuredOutputManager = _PassThroughOutputs  # type: ignore[attr-defined]
    imp = vllm_0_33_0._import
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        version = imp("vllm._version")
        config = imp("vllm.config")
        sampling = imp("vllm.sampling_params")
        hashing = imp("vllm.utils.hashing")
        backend = imp("vllm.v1.attention.backend")
        registry = imp("vllm.v1.attention.backends.registry")
        gdn = imp("vllm.v1.attention.backends.gdn_attn")
        kv_utils = imp("vllm.v1.core.kv_cache_utils")
        scheduler = imp("vllm.v1.core.sched.scheduler")
        engine = imp("vllm.v1.engine")
        kv = imp("vllm.v1.kv_cache_interface")
        outputs = imp("vllm.v1.outputs")
        request = imp("vllm.v1.request")
        mamba_utils = imp("vllm.v1.worker.mamba_utils")
        runner = imp("vllm.v1.worker.gpu.model_runner")
    IMPORT_WARNINGS.extend(f"{w.category.__name__}: {w.message}" for w in caught)
    run_probes(
        f"vllm {version.__version__} (the scheduler driver)",
        [
            Probe(
                "VllmConfig.num_hash_lookahead_tokens (vLLM 0.33)", has(config.VllmConfig, "num_hash_lookahead_tokens")
            ),
            Probe(
                "get_request_block_hasher takes num_hash_lookahead_tokens",
                takes(kv_utils.get_request_block_hasher, "num_hash_lookahead_tokens"),
            ),
            Probe(
                "kv_cache_utils.resolve_cache_hit_alignment_tokens", has(kv_utils, "resolve_cache_hit_alignment_tokens")
            ),
            Probe("the align-mode worker helpers", has(mamba_utils, "preprocess_mamba", "collect_mamba_copy_meta")),
            Probe("Model Runner V2's batch order", has(runner, "sort_batch_req_ids")),
            Probe(
                "Scheduler.update_from_output and update_draft_token_ids",
                has(scheduler.Scheduler, "schedule", "update_from_output", "update_draft_token_ids"),
            ),
        ],
    )
    vllm_0_33_0._unpin_memory()  # modules imported now bound PIN_MEMORY too
    logging.getLogger("vllm").setLevel(logging.ERROR)  # vLLM's logging config ran on import
    return Vllm(
        version=str(version.__version__),
        commit=_commit(version),
        VllmConfig=config.VllmConfig,
        CacheConfig=config.CacheConfig,
        DeviceConfig=config.DeviceConfig,
        SchedulerConfig=config.SchedulerConfig,
        SpeculativeConfig=config.SpeculativeConfig,
        SamplingParams=sampling.SamplingParams,
        EngineCoreRequest=engine.EngineCoreRequest,
        Request=request.Request,
        Scheduler=scheduler.Scheduler,
        KVCacheConfig=kv.KVCacheConfig,
        KVCacheGroupSpec=kv.KVCacheGroupSpec,
        FullAttentionSpec=kv.FullAttentionSpec,
        MambaSpec=kv.MambaSpec,
        MambaAttentionBackendEnum=registry.MambaAttentionBackendEnum,
        ModelRunnerOutput=outputs.ModelRunnerOutput,
        DraftTokenIds=outputs.DraftTokenIds,
        CommonAttentionMetadata=backend.CommonAttentionMetadata,
        GDNAttentionMetadataBuilder=gdn.GDNAttentionMetadataBuilder,
        kv_cache_utils=kv_utils,
        mamba_utils=mamba_utils,
        get_hash_fn_by_name=hashing.get_hash_fn_by_name,
        sort_batch_req_ids=runner.sort_batch_req_ids,
    )


# -- the deployment -----------------------------------------------------------------------------------
class _ModelConfig(types.SimpleNamespace):
    """:data:`DRIVER_STANDINS` ``ModelConfig``: what the scheduler, the KV-cache manager, Request and the GDN
    builder read of a hybrid GDN model."""

    def get_multimodal_config(self) -> None:
        return None

    def get_mamba_chunk_size(self) -> int:
        return 64


def _model_config(max_model_len: int) -> _ModelConfig:
    import torch

    ns = types.SimpleNamespace
    return _ModelConfig(
        max_model_len=max_model_len,
        uses_mrope=False,
        is_encoder_decoder=False,
        runner_type="generate",
        is_diffusion=False,
        supports_multimodal_inputs=False,
        return_sampling_mask=False,
        multimodal_config=None,
        is_hybrid=True,
        dtype=torch.bfloat16,
        hf_text_config=ns(linear_key_head_dim=128, linear_value_head_dim=128),
        hf_config=ns(model_type="qwen3_next", num_nextn_predict_layers=1),
    )


def _speculative_config(v: Vllm, num_speculative_tokens: int) -> Any:
    """:data:`DRIVER_STANDINS` ``SpeculativeConfig``: an MTP drafter's settings, with the real class's methods
    and properties (its validators and dunders excepted) bound to it."""
    ns = types.SimpleNamespace
    own: dict[str, Any] = {
        "method": "mtp",
        "num_speculative_tokens": num_speculative_tokens,
        "num_speculative_tokens_per_batch_size": None,
        "disable_eagle_block_drop": False,
        "disable_lookahead_block_hashes": False,
        "parallel_drafting": False,
        "use_heterogeneous_vocab": False,
        "draft_model_config": ns(
            hf_config=ns(model_type="qwen3_next_mtp", num_nextn_predict_layers=1),
            architectures=["Qwen3NextMTP"],
            model="stand-in",
        ),
    }
    borrowed = {
        name: member
        for name, member in vars(v.SpeculativeConfig).items()
        if not name.startswith("_")
        and name not in own
        and (isinstance(member, property) or type(member) is types.FunctionType)
    }
    cls = type("MTPSpeculativeConfig", (), borrowed)
    obj = cls()
    for name, value in own.items():
        setattr(obj, name, value)
    return obj


class _PassThroughOutputs:
    """:data:`DRIVER_STANDINS` ``StructuredOutputManager``."""

    def grammar_bitmask(self, *args: Any, **kwargs: Any) -> None:
        return None

    def accept_tokens(self, request: Any, tokens: Any) -> bool:
        return True

    def validate_tokens(self, request: Any, tokens: Any) -> Any:
        return tokens


def _configs(v: Vllm, d: Deployment) -> tuple[Any, Any]:
    """``VllmConfig`` (sync scheduling, align mode, prefix caching) and the ``KVCacheConfig`` of one
    full-attention and one GDN group, sized and resolved as ``EngineCore`` does."""
    import torch

    vc = v.VllmConfig(
        device_config=v.DeviceConfig("cpu"),
        cache_config=v.CacheConfig(
            block_size=d.block_size, enable_prefix_caching=True, mamba_cache_mode="align", mamba_block_size=d.block_size
        ),
        scheduler_config=v.SchedulerConfig(
            max_model_len=d.max_model_len,
            is_encoder_decoder=False,
            max_num_batched_tokens=d.max_num_batched_tokens,
            max_num_seqs=d.max_num_seqs,
            async_scheduling=False,
        ),
    )
    vc.model_config = _model_config(d.max_model_len)  # model_config=None passed the checks above
    vc.speculative_config = _speculative_config(v, d.num_spec) if d.num_spec else None
    attn = v.FullAttentionSpec(block_size=d.block_size, num_kv_heads=2, head_size=256, dtype=torch.bfloat16)
    gdn = v.MambaSpec(
        block_size=d.block_size,
        shapes=GDN_SHAPES,
        dtypes=(torch.bfloat16, torch.float32),
        mamba_type=v.MambaAttentionBackendEnum.GDN_ATTN,
        mamba_cache_mode="align",
        num_speculative_blocks=d.num_spec,
    )
    kvc = v.KVCacheConfig(
        num_blocks=d.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[v.KVCacheGroupSpec([ATTN_LAYER], attn), v.KVCacheGroupSpec([GDN_LAYER], gdn)],
    )
    return vc, kvc


# -- the driver ---------------------------------------------------------------------------------------
class _Driver:
    """One run: vLLM's scheduler, the fake model and the workload; with ``record``, a :class:`Recorder`
    attached to the scheduler (``self.trace``). Without it, nothing is written down (a recorder installed by
    ``workbench.engines.dump`` may be)."""

    def __init__(
        self,
        v: Vllm,
        d: Deployment,
        seed: int,
        workload: WorkloadSettings | None,
        accept_rate: float,
        *,
        record: bool = True,
    ) -> None:
        self.v, self.d = v, d
        self.vc, self.kvc = _configs(v, d)
        kv_utils = v.kv_cache_utils
        sched_bs, hash_bs = kv_utils.resolve_kv_cache_block_sizes(self.kvc, self.vc)
        self.kvc.hash_block_size = hash_bs
        self.kvc.cache_hit_alignment_tokens = kv_utils.resolve_cache_hit_alignment_tokens(
            self.kvc, self.vc, sched_bs, hash_bs
        )
        self.vc.cache_config.num_gpu_blocks = d.num_blocks
        hash_fn = v.get_hash_fn_by_name(self.vc.cache_config.prefix_caching_hash_algo)
        kv_utils.init_none_hash(hash_fn)
        self.hasher = kv_utils.get_request_block_hasher(hash_bs, hash_fn, self.vc.num_hash_lookahead_tokens)
        self.sched = v.Scheduler(
            vllm_config=self.vc,
            kv_cache_config=self.kvc,
            structured_output_manager=_PassThroughOutputs(),
            block_size=sched_bs,
            hash_block_size=hash_bs,
            log_stats=False,
        )
        self.recorder: Recorder | None = None
        if record:
            self.recorder = Recorder(v, self.sched, seed=seed)
            self.recorder.attach()
        self.workload = Workload(seed, workload)
        self.acceptance = Acceptance(seed, accept_rate)
        self.requests: dict[str, Any] = {}  # vLLM Request objects, by id, while live
        self.next_request = 0

    @property
    def trace(self) -> SchedulerTrace:
        if self.recorder is None:
            raise EngineError("this driver runs without its recorder")
        return self.recorder.trace

    def arrive(self, step: int) -> None:
        v = self.v
        for a in self.workload.arrivals(step):
            rid = f"r{self.next_request}"
            self.next_request += 1
            core = v.EngineCoreRequest(
                request_id=rid,
                prompt_token_ids=list(a.prompt)[: self.d.max_model_len // 2],
                mm_features=None,
                sampling_params=v.SamplingParams(max_tokens=a.max_tokens, ignore_eos=True),
                pooling_params=None,
                arrival_time=float(step),
                lora_request=None,
                cache_salt=None,
                data_parallel_rank=None,
            )
            req = v.Request.from_engine_core_request(core, self.hasher)
            self.requests[rid] = req
            self.sched.add_request(req)

    def forward(self, so: Any, order: list[str]) -> Any:
        """The fake model's output (:data:`DRIVER_STANDINS`), from the scheduler's output alone: a row that
        completes its prompt or verifies keeps its accepted drafts and one bonus token."""
        computed = {nr.req_id: nr.num_computed_tokens for nr in so.scheduled_new_reqs}
        cached = so.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        sampled: list[list[int]] = []
        for rid in order:
            drafts = list(so.scheduled_spec_decode_tokens.get(rid, ()))
            if computed[rid] + so.num_scheduled_tokens[rid] < self.requests[rid].num_tokens:  # a prompt chunk
                sampled.append([])
            else:
                kept = self.acceptance.kept(len(drafts))
                sampled.append([*drafts[: kept - 1], self.acceptance.token()])
        return self.v.ModelRunnerOutput(
            req_ids=order, req_id_to_index={r: i for i, r in enumerate(order)}, sampled_token_ids=sampled
        )

    def step(self) -> None:
        """One engine step: schedule, the fake forward, ``update_from_output``, the drafts."""
        v = self.v
        so = self.sched.schedule()
        if so.total_num_scheduled_tokens == 0:
            return
        order = list(
            v.sort_batch_req_ids(so.num_scheduled_tokens, so.scheduled_spec_decode_tokens, 1 + self.d.num_spec)
        )
        output = self.forward(so, order)
        engine_out = self.sched.update_from_output(so, output)
        finished = _finished(engine_out)
        for rid in finished:
            req = self.requests.pop(rid)
            self.workload.finished(list(req.all_token_ids))
        drafted = [r for r, got in zip(order, output.sampled_token_ids, strict=True) if got and r not in finished]
        if self.d.num_spec and drafted:
            ids = [[self.acceptance.token() for _ in range(self.d.num_spec)] for _ in drafted]
            self.sched.update_draft_token_ids(v.DraftTokenIds(req_ids=drafted, draft_token_ids=ids))


def run_vllm_scheduler(
    *,
    steps: int,
    seed: int = 0,
    spec: int = 2,
    prefix_cache: str = "align",
    block_size: int = 16,
    num_blocks: int = 1200,
    layer: str = GDN,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 256,
    max_model_len: int = 4096,
    accept_rate: float = 0.6,
    workload: WorkloadSettings | None = None,
) -> SchedulerTrace:
    """Drive vLLM 0.33.0's scheduler for ``steps`` engine steps and return the trace it produced.

    ``spec``: D, the tokens each verify row feeds (as ``workbench trace run --spec`` and the simulator count
    them: an MTP drafter of ``num_speculative_tokens = D - 1``; 0: no speculation); ``prefix_cache``: vLLM's
    ``mamba_cache_mode`` (``"align"``, the mode with prefix caching); ``block_size``: the scheduler's and the
    GDN group's block size; ``num_blocks``: the block pool's blocks, shared by both groups (the trace's
    ``num_slots``); ``layer``: ``"gdn"`` (the GDN builder); the batch limits are ``SchedulerConfig``'s;
    ``accept_rate``: each draft's chance to be accepted; ``workload``: the requests
    (:class:`~workbench.engines.scheduler_base.WorkloadSettings`). Steps where vLLM schedules nothing are not
    written (the step numbers skip them). ``stats`` counts what the run did.

    Raises :class:`EngineError` when vLLM 0.33.0 is not importable or an option is not one the driver has,
    and when vLLM does something a trace cannot say (named); vLLM's own errors propagate.
    """
    if prefix_cache != "align":
        raise EngineError(f"prefix_cache = {prefix_cache!r}: the vllm driver runs mamba_cache_mode='align' only")
    if layer != GDN:
        raise EngineError(f"layer = {layer!r}: the vllm driver runs the GDN builder only")
    for name, value, low in (
        ("steps", steps, 1), ("spec", spec, 0), ("block_size", block_size, 1), ("num_blocks", num_blocks, 2),
        ("max_num_seqs", max_num_seqs, 1), ("max_num_batched_tokens", max_num_batched_tokens, 1),
    ):  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise EngineError(f"{name} = {value!r}: must be an int >= {low}")
    if spec == 1:
        raise EngineError("spec = 1: a vLLM verify row feeds its token and at least one draft (D >= 2; 0: none)")
    if block_size < spec:
        raise EngineError(f"block_size = {block_size}: align mode needs a block of at least D = {spec} tokens")
    t0 = time.perf_counter()
    v = load()
    d = Deployment(max(spec - 1, 0), block_size, num_blocks, max_num_seqs, max_num_batched_tokens, max_model_len)
    t1 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        driver = _Driver(v, d, seed, workload, accept_rate)
        drive(driver, steps)
    trace = driver.trace
    trace.notes.extend(f"{what}: {why}" for what, why in (*vllm_0_33_0.STANDINS, *DRIVER_STANDINS))
    RUN_WARNINGS.extend(f"{w.category.__name__}: {w.message}" for w in caught)
    trace.stats["import_ms"] = round(1000 * (t1 - t0))
    trace.stats["run_ms"] = round(1000 * (time.perf_counter() - t1))
    return trace


def drive(driver: _Driver, steps: int) -> None:
    """The driver's loop: ``steps`` engine steps, each after that step's arrivals."""
    for number in range(steps):
        driver.arrive(number)
        driver.step()


__all__ = ["DRIVER_STANDINS", "Vllm", "load", "run_vllm_scheduler"]
