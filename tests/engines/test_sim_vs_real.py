"""The same workload through ``--scheduler sim`` and vLLM 0.33.0's own scheduler (issue 29): the shape of the
two traces (how often verify rows share a step with prefill chunks, how many published blocks are still
their owner's running block, publishes per step, hits per admission, how many tokens a verify keeps) agrees
within stated bounds. ``tests/traces/test_sim_engine_shapes.py`` holds the simulator to a recorded run
without vLLM; this runs vLLM itself.

The workload: block 16, D = 3, 16 running requests, a 256-token budget, each draft kept with probability
0.6, 3 shared system prompts, follow-ups 0.3, 8..48 output tokens, 0.35 arrivals a step. The prompts are
drawn differently (the driver: a whole system prompt plus 5..90 own tokens; the simulator: a prefix of one
then its own tokens), so the hit rate's bound is one-sided.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from workbench.engines.versions import EngineError, check_supported

try:
    check_supported("vllm")
except EngineError as e:
    pytest.skip(f"vllm is not importable here: {e}", allow_module_level=True)

from workbench.engines.scheduler_base import WorkloadSettings  # noqa: E402
from workbench.engines.vllm_scheduler import run_vllm_scheduler  # noqa: E402
from workbench.traces.format import read_trace  # noqa: E402
from workbench.traces.model import Trace  # noqa: E402
from workbench.traces.simulate import simulate  # noqa: E402

pytestmark = pytest.mark.engines

D, STEPS = 3, 300
SIM: dict[str, Any] = dict(
    spec=D, mixed=True, prefix_cache="align", block_size=16, chunk_size=256, token_budget=256, max_running=16,
    accept_rate=0.6, arrival_rate=0.35, prompt_lens=(82, 320), prefix_len=(77, 230), shared_prefixes=3,
    followup_rate=0.3, output_lens=(8, 48),
)  # fmt: skip
REAL = WorkloadSettings(system_prompts=3, system_len=(77, 230), output_len=(8, 48), arrival_rate=0.35)


def shape(traces: list[Trace]) -> Counter[str]:
    """Pooled counts over ``traces``, idle steps left out (a real run writes no empty step)."""
    n: Counter[str] = Counter()
    for trace in traces:
        for step in trace.steps:
            if step.mode == "idle":
                continue
            kinds = {r.kind for r in step.rows}
            rows = {r.id: r for r in step.rows}
            md = step.metadata or {}
            n["steps"] += 1
            n["verify+extend"] += kinds >= {"verify", "extend"}
            n["admissions"] += len(step.admit)
            n["hits"] += len(md.get("hits", []))
            for c in md.get("checkpoints", []):
                row = rows.get(c["request"])
                n["published"] += 1
                n["running"] += row is not None and (row.slots[0] if row.slots else row.slot) == c["slot"]
            for r in step.rows:
                if r.kind == "verify" and r.accepted is not None:
                    n["verify rows"] += 1
                    n[f"kept {r.kept(trace.header)}"] += 1
    return n


@pytest.fixture(scope="module")
def both() -> tuple[Counter[str], Counter[str]]:
    real = [read_trace(run_vllm_scheduler(steps=STEPS, seed=s, spec=D, workload=REAL).lines()) for s in (0, 1)]
    sim = [simulate("vllm", "gdn", steps=STEPS, seed=s, **SIM) for s in range(4)]
    return shape(sim), shape(real)


def test_verify_rows_share_steps_with_prefill_chunks_about_as_often(both):
    sim, real = both
    assert real["verify+extend"] > 0
    assert abs(sim["verify+extend"] / sim["steps"] - real["verify+extend"] / real["steps"]) <= 0.12, (sim, real)


def test_about_as_many_published_blocks_are_still_running_blocks(both):
    sim, real = both
    assert real["running"] > 0
    assert abs(sim["running"] / sim["published"] - real["running"] / real["published"]) <= 0.1, (sim, real)


def test_publishes_per_step_and_hits_per_admission_are_alike(both):
    sim, real = both
    assert abs(sim["published"] / sim["steps"] - real["published"] / real["steps"]) <= 0.3, (sim, real)
    sim_hits, real_hits = sim["hits"] / sim["admissions"], real["hits"] / real["admissions"]
    assert sim_hits >= 0.4 and sim_hits >= real_hits - 0.4, (sim_hits, real_hits)


def test_verify_rows_keep_as_many_tokens(both):
    sim, real = both
    for k in range(1, D + 1):
        s, r = sim[f"kept {k}"] / sim["verify rows"], real[f"kept {k}"] / real["verify rows"]
        assert abs(s - r) <= 0.06, (k, s, r)
