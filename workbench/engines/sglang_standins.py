"""What sglang 0.5.23's scheduler side needs on a CPU, and cannot have there, for
:mod:`workbench.engines.sglang_scheduler`: import-only modules, three device hooks, and the ``Scheduler``
object itself, built without its ``__init__``.

Each stand-in is listed with its reason in a table here (:data:`IMPORT_PACKAGES`, :data:`ENGINE_MODULES`,
:data:`CPU_PATCHES`, :data:`SCHEDULER_SHELL`); the driver's own (the model, the draft model) are in
``sglang_scheduler.DRIVER_STANDINS``. Everything else the driver calls is the engine's code as released.
Nothing here imports sglang at module level: the names come from the caller, once sglang is imported.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

from workbench.engines.standins import StandinFinder, StandinModule, install

IMPORT_PACKAGES: tuple[tuple[str, str], ...] = (
    ("fastapi", "imported at module level by sglang.srt.managers.scheduler (its HTTP hooks); never called"),
    ("uvicorn", "imported at module level by sglang.srt.managers.scheduler's server chain; never called"),
    ("setproctitle", "imported at module level by sglang.srt.managers.scheduler (process title); never called"),
    ("partial_json_parser", "the tool-call parser's streaming JSON, on the grammar backend's import chain"),
)
"""Third-party packages the scheduler's import chain names and a scheduling step never runs; each is stood
in (:class:`~workbench.engines.standins.StandinFinder`) only when it is not really installed."""

ENGINE_MODULES: tuple[tuple[str, str], ...] = (
    (
        "sglang.srt.rust_server.server",
        "the embedded Rust HTTP front end (routes built at import); scheduler.py imports RustServer for a type "
        "hook only",
    ),
    (
        "sglang.srt.entrypoints.openai.protocol",
        "the OpenAI API's pydantic models (needs the openai package), imported by the reasoning parser on the "
        "chain grammar backend -> schedule_batch; no request here has a tool call or a reasoning parser",
    ),
)
"""sglang modules replaced by permissive stand-in modules (exact names only)."""

CPU_PATCHES: tuple[tuple[str, str], ...] = (
    (
        "sglang.srt.mem_cache.allocation.assign_req_to_token_pool_func",
        "a Triton kernel (its CPU build needs sgl_kernel): the same writes of the request-to-token table as a "
        "torch loop",
    ),
    (
        "torch.Tensor.pin_memory",
        "identity while the run lasts, without an accelerator only: the extra_buffer decode pins its track "
        "mask unconditionally (schedule_batch.prepare_for_decode), which raises without one; pinning only "
        "speeds a host-to-device copy",
    ),
    (
        "sglang.srt.arg_groups.mamba_hook._platform_supports_mamba_cache_extra_buffer",
        "True while ServerArgs resolves: a device probe (CUDA, NPU, ...) for the extra_buffer snapshot "
        "kernels, which run in the forward, never on the scheduler side",
    ),
)
"""Engine functions replaced while a run lasts (:func:`cpu_patches` puts them back)."""

SCHEDULER_SHELL: tuple[tuple[str, str], ...] = (
    (
        "Scheduler.__init__",
        "not run: it starts the IPC sockets, the tokenizer, the model worker and CUDA streams. The Scheduler is "
        "made with object.__new__ and given the attributes its scheduling methods read, from the published "
        "config as __init__ derives them; its own init_running_status, init_chunked_prefill, "
        "init_schedule_policy, init_mamba_truncation_align and init_beam_coordinator run",
    ),
    (
        "dp_attn_adapter, ngram_embedding_manager",
        "identity: no DP attention, no n-gram embedding",
    ),
    (
        "grammar_manager, load_inquirer",
        "no grammar waits; no pending load reported (no router)",
    ),
    (
        "metrics_reporter, output_streamer",
        "no-op objects: no metrics, no client to stream to",
    ),
    (
        "future_map",
        "stash_bonus_tokens does nothing: it only relays sampled ids to the next forward's inputs, and there is "
        "no forward here",
    ),
    (
        "model_worker.on_verify_complete_cpu",
        "does nothing: it feeds an adaptive draft-length controller this deployment does not have",
    ),
    (
        "tp_worker.model_runner.attn_backend",
        "a namespace holding only the real GDNAttnBackend as linear_attn_backend (the hybrid backend's linear "
        "part, which the recorder reads): no full-attention backend, no KV is read; it has no "
        "extend_attention_block_m, so the prefill adder takes sglang's fallback as with any non-Triton backend",
    ),
)
"""What the scheduler object holds that a CPU run stands in for."""


# -- imports -----------------------------------------------------------------------------------------------
def install_import_standins() -> None:
    """Serve :data:`IMPORT_PACKAGES` that are absent and put :data:`ENGINE_MODULES` in ``sys.modules`` (for the
    rest of the process: a module once imported stays imported)."""
    absent = tuple(name for name, _ in IMPORT_PACKAGES if importlib.util.find_spec(name) is None)
    if absent:
        install(StandinFinder(absent))
    for name, _ in ENGINE_MODULES:
        if name not in sys.modules:
            stand_in = StandinModule(name)
            stand_in.__file__ = f"<stand-in {name}>"
            sys.modules[name] = stand_in


# -- device hooks ------------------------------------------------------------------------------------------
def _assign_req_to_token_pool(
    req_pool_indices: Any, req_to_token: Any, start_offset: Any, end_offset: Any, out_cache_loc: Any, batch_size: int
) -> None:
    """Row ``req_pool_indices[i]`` of ``req_to_token``, columns ``start_offset[i]:end_offset[i]``, takes the
    next ``end - start`` entries of ``out_cache_loc`` (the rows' entries laid end to end)."""
    taken = 0
    for i in range(batch_size):
        start, end = int(start_offset[i]), int(end_offset[i])
        row = int(req_pool_indices[i])
        req_to_token[row, start:end] = out_cache_loc[taken : taken + end - start].to(req_to_token.dtype)
        taken += end - start


def _unpinned(self: Any, *args: Any, **kwargs: Any) -> Any:
    return self


@contextlib.contextmanager
def cpu_patches(allocation: types.ModuleType, mamba_hook: types.ModuleType) -> Iterator[None]:
    """:data:`CPU_PATCHES` while open (``allocation``: ``sglang.srt.mem_cache.allocation``, ``mamba_hook``:
    ``sglang.srt.arg_groups.mamba_hook``); each is put back on exit, error or not."""
    import torch

    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    try:
        patch(allocation, "assign_req_to_token_pool_func", _assign_req_to_token_pool)
        patch(mamba_hook, "_platform_supports_mamba_cache_extra_buffer", lambda: True)
        if not torch.cuda.is_available():
            patch(torch.Tensor, "pin_memory", _unpinned)
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


# -- the scheduler object ----------------------------------------------------------------------------------
class _NoOp:
    """Every method does nothing and returns None; the attributes given are plain values."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("__"):
            raise AttributeError(name)
        return _nothing


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def scheduler_shell(sg: Any, parts: Any, *, model_worker: Any = None, attn_backend: Any = None) -> Any:
    """sglang's ``Scheduler`` without its ``__init__`` (:data:`SCHEDULER_SHELL`), over the driver's engine
    objects ``parts`` (``server_args``, ``model_config``, ``req_pool``, ``allocator``, ``tree_cache``,
    ``spec_algorithm``). ``sg`` holds the sglang names (``sglang_scheduler.Sglang``). ``model_worker``: the
    driver's (``forward_batch_generation``, ``verify``, ``on_verify_complete_cpu``; None: one that only has
    the last); ``attn_backend``: the target model runner's attention backend (None: one with no attribute)."""
    rc = sg.runtime_context
    sched, mem, lora = rc.get_schedule(), rc.get_memory(), rc.get_lora()
    sa = parts.server_args
    s = object.__new__(sg.Scheduler)
    values: dict[str, Any] = {
        # the settings __init__ reads off the published config
        "server_args": sa,
        "forward_ct": 0,
        "processed_tokens_counter": 0,
        "schedule_policy": sched.schedule_policy,
        "enable_priority_scheduling": sched.enable_priority_scheduling,
        "abort_on_priority_when_disabled": sched.abort_on_priority_when_disabled,
        "schedule_low_priority_values_first": sched.schedule_low_priority_values_first,
        "priority_scheduling_preemption_threshold": sched.priority_scheduling_preemption_threshold,
        "enable_lora": lora.enable_lora,
        "enable_overlap": not sched.disable_overlap_schedule,
        "enable_overlap_mlx": False,
        "spec_algorithm": parts.spec_algorithm,
        "page_size": sched.page_size,
        "enable_hierarchical_cache": mem.enable_hierarchical_cache,
        "enable_lmcache": mem.enable_lmcache,
        "enable_hicache_storage": mem.hicache_storage_backend is not None,
        "enable_unified_cache_external_linker": mem.enable_unified_cache_external_linker,
        "enable_hisparse": mem.enable_hisparse,
        "enable_unified_memory": mem.enable_unified_memory,
        "max_queued_requests": sched.max_queued_requests,
        "max_prefill_tokens": sa.max_prefill_tokens,
        "max_running_requests": sa.max_running_requests,
        # the engine objects the model runner would have built
        "model_config": parts.model_config,
        "req_to_token_pool": parts.req_pool,
        "token_to_kv_pool_allocator": parts.allocator,
        "tree_cache": parts.tree_cache,
        "max_total_num_tokens": parts.allocator.size,
        "device": "cpu",
        # one rank, a hybrid GDN model, no disaggregation, no sliding window, no optional features
        "is_hybrid_swa": False,
        "is_hybrid_ssm": True,
        "sliding_window_size": None,
        "kv_shard_widening": 1,
        "disaggregation_mode": sg.DisaggregationMode.NULL,
        "dllm_config": None,
        "hisparse_coordinator": None,
        "decode_offload_manager": None,
        "require_mlp_sync": False,
        "truncation_align_size": None,
        "max_new_tokens_limit": None,
        "lora_drainer": None,
        "min_free_slots_delayer": None,
        "dynamic_chunk_sizer": None,
        "enable_pdmux": False,
        "metrics_collector": None,
        "scheduler_stage_metrics": None,
        "draft_worker": None,
    }
    for name, value in values.items():
        setattr(s, name, value)
    s.max_req_len = min(s.model_config.context_len - 1, s.max_total_num_tokens - 1)
    s.max_req_input_len = s.max_req_len - 5
    if not rc.get_parallel().pp_max_micro_batch_size:  # as the scheduler's init defaults it
        rc.get_context().override(
            "workbench.sglang_scheduler",
            pp_max_micro_batch_size=max(s.max_running_requests // rc.get_parallel().pp_size, 1),
        )
    s.abort_request = _nothing
    s.init_running_status()
    s.init_chunked_prefill()
    s.metrics_reporter = _NoOp(num_generated_tokens=0, forward_ct_decode=0, enable_metrics=False)
    s.init_schedule_policy()
    s.init_mamba_truncation_align()
    s.check_truncation_align_fits_chunk()
    s.dp_attn_adapter = types.SimpleNamespace(
        maybe_prepare_mlp_sync_batch=lambda batch, need_sync=None: batch,
        maybe_convert_decode_to_extend=lambda batch: batch,
    )
    s.ngram_embedding_manager = types.SimpleNamespace(prepare_for_forward=lambda batch, chunked_req=None: batch)
    s.grammar_manager = types.SimpleNamespace(has_waiting_grammars=lambda: False)
    s.load_inquirer = types.SimpleNamespace(_get_num_pending_tokens=lambda chunk_deduct=0: 0)
    s.tp_worker = types.SimpleNamespace(
        model_runner=types.SimpleNamespace(
            attn_backend=object() if attn_backend is None else attn_backend, prefill_aware_swa=False
        )
    )
    s.future_map = types.SimpleNamespace(stash_bonus_tokens=_nothing)
    s.init_beam_coordinator()
    s.output_streamer = _NoOp()
    s.model_worker = types.SimpleNamespace(on_verify_complete_cpu=_nothing) if model_worker is None else model_worker
    s.batch_result_processor = sg.SchedulerBatchResultProcessor(
        is_generation=True,
        disaggregation_mode=s.disaggregation_mode,
        enable_overlap=s.enable_overlap,
        enable_overlap_mlx=False,
        model_config=s.model_config,
        token_to_kv_pool_allocator=s.token_to_kv_pool_allocator,
        tree_cache=s.tree_cache,
        hisparse_coordinator=None,
        req_to_token_pool=s.req_to_token_pool,
        decode_offload_manager=None,
        metrics_collector=None,
        metrics_reporter=s.metrics_reporter,
        draft_worker=None,
        model_worker=s.model_worker,
        logprob_result_processor=sg.SchedulerLogprobResultProcessor(model_config=s.model_config),
        output_streamer=s.output_streamer,
        beam_coordinator=s.beam_coordinator,
        abort_request=s.abort_request,
    )
    return s


__all__ = [
    "CPU_PATCHES",
    "ENGINE_MODULES",
    "IMPORT_PACKAGES",
    "SCHEDULER_SHELL",
    "cpu_patches",
    "install_import_standins",
    "scheduler_shell",
]
