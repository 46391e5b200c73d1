"""SimConfig: one frozen object holds every simulator parameter, validates itself naming the field and the
value, and runs the same trace as the keyword form; the prefix-cache strategies are a registry the config
checks against and the simulator picks from."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from typing import Any

import pytest

from workbench.profiles import PROFILES
from workbench.traces import cli as trace_cli
from workbench.traces.config import SimConfig
from workbench.traces.simulate import PREFIX_CACHES, SimulationError, simulate
from workbench.traces.strategies import STRATEGIES, Align, AlignSpec, ExtraBuffer, NoBuffer


def test_a_config_is_frozen():
    c = SimConfig("vllm", steps=20)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.seed = 3  # type: ignore[misc]
    assert c.seed == 0


def test_fields_after_the_layer_are_keywords_only_as_simulate_takes_them():
    with pytest.raises(TypeError):
        SimConfig("sglang", "gdn", 50)  # type: ignore[misc]
    assert SimConfig("sglang", "mamba2", steps=50).layer == "mamba2"


# -- every bad value is refused when the config is built, naming the field and the value ---------------------
@pytest.mark.parametrize(
    ("kw", "named"),
    [
        (dict(steps=-1), "steps = -1"),
        (dict(steps=2.5), "steps must be an int, got 2.5"),
        (dict(spec=2000), "spec = 2000"),
        (dict(mixed=1), "mixed = 1"),
        (dict(dp_dummies="yes"), "dp_dummies = 'yes'"),
        (dict(prefill="no"), "prefill = 'no'"),
        (dict(chunk_size=0), "chunk_size = 0"),
        (dict(spec=4, token_budget=3), "token_budget = 3"),
        (dict(arrival_rate=-0.5), "arrival_rate = -0.5"),
        (dict(accept_rate=1.5), "accept_rate = 1.5"),
        (dict(dp_dummy_rate=True), "dp_dummy_rate = True"),
        (dict(prompt_lens=(1, 5)), "prompt_lens = (1, 5)"),
        (dict(output_lens=(6, 5)), "output_lens = (6, 5)"),
        (dict(prefix_cache="zzz"), "prefix_cache = 'zzz'"),
        (dict(prefix_cache="extra_buffer_lazy"), "prefix_cache = 'extra_buffer_lazy'"),
        (dict(shared_prefixes=0), "shared_prefixes = 0"),
        (dict(prefix_len=(0, 3)), "prefix_len = (0, 3)"),
        (dict(vocab=0), "vocab = 0"),
        (dict(followup_rate=2), "followup_rate = 2"),
        (dict(block_size=4), "block_size = 4"),
        (dict(profile="vllm", prefix_cache="align", block_size=100), "block_size = 100"),
        (dict(cache_chunk=4), "cache_chunk = 4"),
        (dict(prefix_cache="extra_buffer", cache_chunk=5, track_interval=12), "track_interval = 12"),
        (dict(buckets=[4, 2]), "buckets must be strictly increasing"),
        (dict(num_slots=1), "num_slots = 1"),
        (dict(prefix_cache="extra_buffer", num_slots=3), "num_slots = 3"),
        (dict(profile="vllm", spec=2, num_slots=2, max_running=1), "num_slots = 2"),
        (dict(max_running=0), "max_running = 0"),
        (dict(max_waiting=-1), "max_waiting = -1"),
        (dict(max_cached=3), "max_cached = 3"),
        (dict(prefix_cache="no_buffer", num_slots=5, max_cached=5), "max_cached = 5"),
        (dict(layer="mla"), "layer = 'mla'"),
        (dict(profile="trtllm"), "unknown profile 'trtllm'"),
    ],
)
def test_each_bad_field_is_refused_naming_the_field_and_value(kw: dict[str, Any], named: str):
    with pytest.raises(SimulationError, match=re.escape(named)) as info:
        SimConfig(**kw)
    assert "\n" not in str(info.value)


def test_a_variant_is_validated_again():
    c = SimConfig("sglang", spec=4, token_budget=4)
    with pytest.raises(SimulationError, match=r"token_budget = 4"):
        dataclasses.replace(c, spec=5)
    assert dataclasses.replace(c, spec=3).spec == 3
    assert dataclasses.replace(c, profile="vllm", mixed=True).spec == 4  # vLLM mixes verify rows with prefill


@pytest.mark.parametrize("profile", ["sglang", "sglang-ascend"])
@pytest.mark.parametrize("prefix_cache", [None, "no_buffer", "extra_buffer"])
def test_sglang_takes_mixed_steps_with_speculation_as_decode_tails(profile: str, prefix_cache: str | None):
    # sglang 0.5.23 keeps mixed chunked prefill under EAGLE / EAGLE3 (supports_mixed_chunk): running requests
    # decode one token in a step that prefills
    c = SimConfig(profile, mixed=True, spec=3, prefix_cache=prefix_cache)
    assert c.mixed_tails and "mixed steps (1-token decode tails)" in c.summary()
    assert not SimConfig("vllm", mixed=True, spec=3).mixed_tails  # vLLM's mixed steps verify
    assert not SimConfig(profile, mixed=True).mixed_tails and not SimConfig(profile, spec=3).mixed_tails


# -- one config, one trace ---------------------------------------------------------------------------------
CONFIGS = [
    dict(profile="vllm", mixed=True, seed=1),
    dict(profile="sglang", layer="mamba2", spec=2, seed=2),
    dict(profile="sglang", prefix_cache="extra_buffer", spec=2, seed=3),
    dict(profile="sglang-ascend", prefix_cache="no_buffer", mixed=True, seed=4),
    dict(profile="vllm", prefix_cache="align", spec=2, seed=5),
    dict(profile="vllm", dp_dummies=True, prefill=False, seed=6),
    dict(profile="vllm", prefix_cache="align", spec=3, mixed=True, seed=7),
    dict(profile="sglang", prefix_cache="extra_buffer", spec=2, mixed=True, seed=8),
]


@pytest.mark.parametrize("kw", CONFIGS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_simulate_of_a_config_equals_the_keyword_form(kw: dict[str, Any]):
    kw = dict(kw)
    config = SimConfig(**kw, steps=80)
    got = simulate(config)
    assert got == simulate(**kw, steps=80)
    assert got == simulate(kw.pop("profile"), steps=80, **kw)
    assert len(got) == 80 and got.header.seed == config.seed


def test_keywords_beside_a_config_replace_its_fields():
    base = SimConfig("sglang", steps=60, seed=1)
    assert simulate(base, seed=2) == simulate(dataclasses.replace(base, seed=2)) != simulate(base)
    with pytest.raises(TypeError, match="give fields as keywords"):
        simulate(base, "gdn")
    with pytest.raises(TypeError):
        simulate(base, no_such_field=1)


def test_equal_configs_compare_and_hash_equal_however_their_sequences_were_given():
    a = SimConfig(prompt_lens=[4, 96], buckets=[1, 2, 4])  # type: ignore[arg-type]
    b = SimConfig(prompt_lens=(4, 96), buckets=(1, 2, 4))
    assert a == b and hash(a) == hash(b) and a.prompt_lens == (4, 96)
    assert a != SimConfig(buckets=(1, 2, 8))


def test_the_repr_names_the_fields_given_and_reads_back():
    c = SimConfig("vllm", steps=50, seed=1, prefix_cache="align", block_size=8)
    assert repr(c) == "SimConfig(profile='vllm', layer='gdn', steps=50, seed=1, prefix_cache='align', block_size=8)"
    assert eval(repr(c), {"SimConfig": SimConfig}) == c
    assert "prefix cache align" in c.summary() and c.summary().startswith("vllm gdn: 50 steps")


def test_the_plan_resolves_the_defaults_that_depend_on_other_fields():
    plan = SimConfig("sglang", prefix_cache="extra_buffer", max_running=5).plan
    assert plan.num_slots == 3 * 5 + 1 and plan.max_waiting == 10 and plan.strategy is ExtraBuffer
    assert plan.cache is not None and plan.cache.max_cached == (plan.num_slots - 1) // 2
    assert (
        SimConfig("vllm", spec=3).plan.slots_per_request == 3
        and SimConfig("sglang", spec=3).plan.slots_per_request == 1
    )
    assert "target_verify" not in SimConfig("vllm", prefix_cache="align").plan.buckets  # align without spec


# -- the strategies: a registry ----------------------------------------------------------------------------------
def test_the_registry_holds_each_strategy_by_its_name():
    assert {"no_buffer": NoBuffer, "extra_buffer": ExtraBuffer, "align": Align} == STRATEGIES
    assert all(cls.name == name for name, cls in STRATEGIES.items())
    assert tuple(STRATEGIES) == PREFIX_CACHES
    assert issubclass(AlignSpec, Align) and AlignSpec not in STRATEGIES.values()  # align's, with speculation


def test_every_profile_lists_only_strategies_the_simulator_has_and_the_cli_offers_them_all():
    for prof in PROFILES.values():
        assert set(prof.prefix_caches) <= set(STRATEGIES), prof.name
    assert trace_cli.PREFIX_CACHES == PREFIX_CACHES and tuple(PROFILES) == trace_cli.PROFILES


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_a_profile_takes_its_engines_strategies_and_refuses_another_engines(profile: str):
    prof = PROFILES[profile]
    for name in STRATEGIES:
        if name in prof.prefix_caches:
            assert SimConfig(profile, prefix_cache=name).plan.strategy is STRATEGIES[name]
            continue
        with pytest.raises(SimulationError) as info:
            SimConfig(profile, prefix_cache=name)
        msg = str(info.value)
        assert msg.startswith(f"profile = {profile!r}: prefix_cache = {name!r} is not its engine's"), msg
        assert prof.engine in msg


def test_simulate_picks_the_strategy_from_the_registry(monkeypatch):
    made: list[str] = []

    class Spy(NoBuffer):
        def __init__(self, *args: Any) -> None:
            made.append(type(self).__name__)
            super().__init__(*args)

    monkeypatch.setitem(STRATEGIES, "no_buffer", Spy)
    trace = simulate("sglang", steps=40, prefix_cache="no_buffer")
    assert made == ["Spy"] and any(s.metadata for s in trace.steps)


def test_align_with_speculation_runs_the_window_strategy(monkeypatch):
    made: list[type] = []
    create = Align.create.__func__  # type: ignore[attr-defined]

    def spy(cls: type[Align], *args: Any) -> NoBuffer:
        cache = create(cls, *args)
        made.append(type(cache))
        return cache

    monkeypatch.setattr(Align, "create", classmethod(spy))
    simulate("vllm", steps=10, prefix_cache="align", spec=2)
    simulate("vllm", steps=10, prefix_cache="align")
    assert made == [AlignSpec, Align]


def test_the_cli_reads_the_names_without_importing_torch():
    code = "import sys, workbench.traces.cli as c; print(c.PREFIX_CACHES, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"{PREFIX_CACHES} False"
