"""The widget models answer any value in words (issue 27, "The promises under attack").

Every public model method that takes user values is called with each of ``HOSTILE`` (None, wrong types,
NaN, huge and negative ints, bools where ints belong, nested lists, unknown names) for each field it takes.
For every call:

1. nothing escapes: an exception out of the model fails the test as ``RAISED <type>: <message>``;
2. a value the field does not take comes back as words beside the field's control, naming the field, and
   a value of a type no control holds (``wrong_type``) is not taken: the model keeps its last good value;
3. the next good call for that field gives what a fresh model gives for the same call (nothing stuck), and a
   refused action leaves the results it had (runner, history, selection).

Small sizes throughout (one-bucket captures, one-step traces, one-convention kernel checks); the timeline's
replay is stubbed in the per-value tests (its simulation runs) and runs for real once at the end.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from workbench.widgets.explorer_model import ExplorerModel
from workbench.widgets.lab_model import INPUTS as LAB_INPUTS
from workbench.widgets.lab_model import LabModel
from workbench.widgets.lab_plan import SEED_MAX
from workbench.widgets.playground_model import CONTROLS as PLAYGROUND_CONTROLS
from workbench.widgets.playground_model import PlaygroundModel
from workbench.widgets.timeline_model import CONTROLS as TIMELINE_CONTROLS
from workbench.widgets.timeline_model import INPUTS as TIMELINE_INPUTS
from workbench.widgets.timeline_model import TimelineModel
from workbench.widgets.timing_model import MAX_RUN_TIME, TimingModel

HOSTILE: list[Any] = [
    None,
    "",
    " ",
    "nonsense",
    "1, x",
    "1, [2]",
    "nan",
    "-5",
    "9" * 40,
    "1e30",
    float("nan"),
    float("inf"),
    -1,
    0,
    10**30,
    -(10**30),
    True,
    False,
    2.5,
    [],
    [1, [2]],
    {"a": 1},
    (3,),
    b"3",
]


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 14 else r[:11] + "..."


IDS = [_short(v) for v in HOSTILE]


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(...)``; an exception out of a model fails the test, marked RAISED (the count of issue 27)."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # the point of these tests: nothing but words comes out
        pytest.fail(f"RAISED {type(e).__name__}: {e}"[:400], pytrace=False)


# -- what a field takes ------------------------------------------------------------------------------------
def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def int_in(lo: int, hi: int) -> Callable[[Any], bool]:
    return lambda v: is_int(v) and lo <= v <= hi


def blank(v: Any) -> bool:
    return isinstance(v, str) and not v.strip()


def never(v: Any) -> bool:
    return False


def is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def is_real(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


# the kind of value a field's control holds: a value of another type is not taken
KINDS: dict[str, Callable[[Any], bool]] = {
    "int": is_int,
    "str": lambda v: isinstance(v, str),
    "real": is_real,
    "bool": is_bool,
}


def wrong_type(kind: str, v: Any) -> bool:
    return not KINDS[kind](v)


def names_field(message: str | None, field: str, control: str) -> bool:
    """The words name the field (or, spaced, "draft tokens"; or its control)."""
    text = message or ""
    return any(w in text for w in (field, field.replace("_", " "), control))


def one_line(message: str | None) -> bool:
    return bool(message) and "\n" not in (message or "") and "Traceback" not in (message or "")


# -- explorer --------------------------------------------------------------------------------------------
EXPLORER_BASE = dict(profile="all", mode="target_verify", raw_batch_size=5, pool_size=64)
# field: (kind, good value, the hostile values it takes)
EXPLORER_FIELDS: dict[str, tuple[str, Any, Callable[[Any], bool]]] = {
    "profile": ("str", "sglang", never),
    "mode": ("str", "decode", never),
    "raw_batch_size": ("int", 3, int_in(0, 21)),  # vLLM's pool of 64 slots holds 21 requests of D=3 slots
    "seq_lens": ("str", "4, 5", blank),  # blank: random lengths
    "draft_tokens": ("int", 2, never),
    "topk": ("int", 1, never),  # 1: chains; above, vLLM (in "all") says beside it that it verifies chains only
    "buckets": ("str", "1, 2, 4", blank),  # blank: the engine's list
    "pool_size": ("int", 32, never),
    "fragmentation": ("real", 0.25, lambda v: is_real(v) and v == 0),
    "seed": ("int", 1, is_int),
}


def _explorer_view(st: Any) -> tuple[Any, ...]:
    metas = [
        (m.profile.name, m.batch_size, m.state_indices.tolist(), m.query_start_loc.tolist(), m.seq_lens.tolist())
        for m in st.metas
    ]
    return st.params, dict(st.errors), metas


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
@pytest.mark.parametrize("field", list(EXPLORER_FIELDS))
def test_explorer_update_answers_any_value(field, value):
    kind, good, takes = EXPLORER_FIELDS[field]
    m = ExplorerModel(**EXPLORER_BASE)
    assert m.state.ok, m.state.errors
    params, shown = m.params, m.shown
    st = call(m.update, **{field: value})
    if takes(value):
        assert st.ok, st.errors
    else:
        assert field in st.errors and names_field(st.errors[field], field, field), st.errors
        assert all(one_line(e) for e in st.errors.values()) and not st.metas
        assert m.shown is shown and m.stale is not None  # the figures keep the last good step, said stale
        call(m.notes)
        if wrong_type(kind, value):
            assert m.params == params, "a value of the wrong type was taken"
    got = call(m.update, **{field: good})
    want = ExplorerModel(**EXPLORER_BASE).update(**{field: good})
    assert want.ok and _explorer_view(got) == _explorer_view(want)


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
@pytest.mark.parametrize("field", list(EXPLORER_FIELDS))
def test_explorer_constructor_answers_any_value(field, value):
    kind, _, takes = EXPLORER_FIELDS[field]
    m = call(ExplorerModel, **{**EXPLORER_BASE, field: value})
    if takes(value):
        assert m.state.ok, m.state.errors
    else:
        assert field in m.state.errors and m.stale is not None, m.state.errors


@pytest.mark.parametrize("changes", [{"bogus": 1}, {"seq_lens": "3, 4", "Pool_size": 9}], ids=["unknown", "mixed"])
def test_explorer_unknown_names_are_words_and_take_nothing(changes):
    m = ExplorerModel(**EXPLORER_BASE)
    params = m.params
    st = call(m.update, **changes)
    assert "general" in st.errors and any(k in st.errors["general"] for k in changes), st.errors
    assert m.params == params and m.update().ok


# -- lab: set ------------------------------------------------------------------------------------------
LAB_BASE = dict(backend="cpu", buckets="1, 2")
LAB_FIELDS: dict[str, tuple[str, Any, Callable[[Any], bool]]] = {
    "layer": ("str", "mamba2", never),
    "preset": ("str", "small", never),
    "profile": ("str", "vllm", never),
    "backend": ("str", "auto", never),
    "buckets": ("str", "1, 4", blank),  # blank: the default list
    "draft_tokens": ("int", 3, never),
    "metadata": ("str", "profile", never),
}
assert set(LAB_FIELDS) == set(LAB_INPUTS)


def _lab_view(m: LabModel, ok: bool) -> tuple[Any, ...]:
    inputs = {name: getattr(m, attr) for name, attr in LAB_INPUTS.items()}
    return ok, m.error, m.error_control, inputs, m.check(), m.modes


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
@pytest.mark.parametrize("field", list(LAB_FIELDS))
def test_lab_set_answers_any_value(field, value):
    kind, good, takes = LAB_FIELDS[field]
    m = LabModel(**LAB_BASE)
    before = {name: getattr(m, attr) for name, attr in LAB_INPUTS.items()}
    ok = call(m.set, **{field: value})
    if takes(value):
        assert ok, m.error
    else:
        assert ok is False and m.error_control == field and names_field(m.error, field, field), m.error
        assert one_line(m.error)
        call(lambda: (m.modes, m.capture_text(), m.verdicts(), m.heatmap_data()))
        if wrong_type(kind, value):
            assert {name: getattr(m, attr) for name, attr in LAB_INPUTS.items()} == before
    fresh = LabModel(**LAB_BASE)
    want = _lab_view(fresh, fresh.set(**{field: good}))
    got = _lab_view(m, call(m.set, **{field: good}))
    assert want[0] and got == want


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
@pytest.mark.parametrize("field", [*LAB_FIELDS, "num_slots"])
def test_lab_constructor_and_capture_answer_any_value(field, value, monkeypatch):
    _, _, takes = LAB_FIELDS.get(field, ("int", None, lambda v: v is None))
    m = call(LabModel, **{**LAB_BASE, field: value})
    if takes(value):
        return  # a good setting: capture is tested elsewhere
    plan = call(m.check)
    assert plan is None and names_field(m.error, field, m.error_control), m.error
    assert call(m.capture) is False and m.runner is None and one_line(m.error)


@pytest.fixture(scope="module")
def lab() -> LabModel:
    m = LabModel(**LAB_BASE, draft_tokens=2)
    assert m.capture(), m.error
    return m


STEP_ARGS = {"batch_size": (1, int_in(1, 5)), "mode": ("decode", never), "seed": (0, int_in(0, SEED_MAX))}


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
@pytest.mark.parametrize("arg", list(STEP_ARGS))
def test_lab_step_answers_any_value(lab, arg, value):
    args = {name: good for name, (good, _) in STEP_ARGS.items()} | {arg: value}
    runner, history = lab.runner, len(lab.history)
    rep = call(lab.step, **args, time_it=False)
    if STEP_ARGS[arg][1](value):
        assert rep is not None, lab.error
    else:
        assert rep is None and lab.error_control == arg and names_field(lab.error, arg, arg), lab.error
        assert one_line(lab.error) and lab.runner is runner and len(lab.history) == history  # nothing changed
    rep = call(lab.step, 2, "decode", seed=3, time_it=False)
    assert rep is not None and rep.clean, lab.error


ACCEPT_ARGS = {
    "num_accepted": (None, lambda v: v is None or blank(v) or v == []),  # none typed: random counts
    "seed": (0, int_in(0, SEED_MAX)),
}


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
@pytest.mark.parametrize("arg", list(ACCEPT_ARGS))
def test_lab_accept_answers_any_value(lab, arg, value):
    if lab.last is None or lab.last.batch.mode != "target_verify" or lab.accepted is not None:
        assert lab.step(2, "target_verify", seed=1, time_it=False) is not None, lab.error
    args = {name: good for name, (good, _) in ACCEPT_ARGS.items()} | {arg: value}
    history = len(lab.history)
    res = call(lab.accept, **args)
    if ACCEPT_ARGS[arg][1](value):
        assert res is not None, lab.error
        return
    control = "accepted" if arg == "num_accepted" else "seed"
    assert res is None and lab.error_control == control and names_field(lab.error, arg, control), lab.error
    assert one_line(lab.error) and len(lab.history) == history and lab.accepted is None
    res = call(lab.accept, [1, 2])
    assert res is not None and res.ok, lab.error


# -- timeline ------------------------------------------------------------------------------------------
TIMELINE_BASE = dict(steps=1)
TIMELINE_FIELDS: dict[str, tuple[str, Any, Callable[[Any], bool]]] = {
    "profile": ("str", "vllm", never),
    "layer": ("str", "mamba2", never),
    "steps": ("int", 2, never),
    "seed": ("int", 1, int_in(0, 2**31 - 1)),
    "spec": ("int", 2, int_in(0, 8)),
    "mixed": ("bool", True, is_bool),
    "dp_dummies": ("bool", True, is_bool),
    "prefix_cache": ("str", "no_buffer", never),
}
assert set(TIMELINE_FIELDS) == set(TIMELINE_INPUTS)


@pytest.fixture
def stub_replay(monkeypatch):
    """The timeline's replay (a second a build) stubbed: the simulated trace is kept, nothing replayed."""

    def replay(self: TimelineModel, trace: Any) -> bool:
        self.trace = trace
        return True

    monkeypatch.setattr(TimelineModel, "_replay", replay)


def _timeline_view(m: TimelineModel, ok: bool) -> tuple[Any, ...]:
    return ok, m.error, m.error_control, {k: getattr(m, k) for k in TIMELINE_INPUTS}, m.trace


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
@pytest.mark.parametrize("field", list(TIMELINE_FIELDS))
def test_timeline_build_answers_any_value(field, value, stub_replay):
    kind, good, takes = TIMELINE_FIELDS[field]
    m = TimelineModel(**TIMELINE_BASE)
    before = {k: getattr(m, k) for k in TIMELINE_INPUTS}
    ok = call(m.build, **{field: value})
    if takes(value):
        assert ok, m.error
    else:
        assert ok is False and m.error_control == field and names_field(m.error, field, field), m.error
        assert one_line(m.error) and m.trace is None
        call(lambda: (m.summary(), m.figure_data(), m.step_table(), m.step_text(), m.reused_slots()))
        if wrong_type(kind, value):
            assert {k: getattr(m, k) for k in TIMELINE_INPUTS} == before
    fresh = TimelineModel(**TIMELINE_BASE)
    want = _timeline_view(fresh, fresh.build(**{field: good}))
    assert want[0] and _timeline_view(m, call(m.build, **{field: good})) == want


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
@pytest.mark.parametrize("field", list(TIMELINE_FIELDS))
def test_timeline_constructor_answers_any_value(field, value):
    _, _, takes = TIMELINE_FIELDS[field]
    m = call(TimelineModel, **{**TIMELINE_BASE, field: value})
    ok = call(m.check)
    assert ok is takes(value), m.error
    if not ok:
        assert m.error_control in TIMELINE_CONTROLS and names_field(m.error, field, m.error_control), m.error


@pytest.fixture(scope="module")
def timeline() -> TimelineModel:
    m = TimelineModel(steps=1)
    assert m.build(), m.error
    return m


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
def test_timeline_select_answers_any_value(timeline, value):
    ok = call(timeline.select, value)
    if int_in(0, 0)(value):
        assert ok
    else:
        assert ok is False and timeline.error_control == "step" and "step" in (timeline.error or "")
        assert timeline.selected == 0 and timeline.built  # the trace stays, its selection too
    assert call(timeline.select, 0) and timeline.error is None


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
def test_timeline_show_answers_any_value(value):
    m = TimelineModel(**TIMELINE_BASE)
    assert call(m.show, value) is False and "trace" in (m.error or "") and one_line(m.error)
    assert m.check()


@pytest.mark.parametrize("changes", [{"bogus": 1}, {"steps": 2, "Seed": 3}], ids=["unknown", "mixed"])
def test_timeline_unknown_names_are_words_and_take_nothing(changes):
    m = TimelineModel(**TIMELINE_BASE)
    before = {k: getattr(m, k) for k in TIMELINE_INPUTS}
    assert call(m.build, **changes) is False and m.error_control == "general"
    assert {k: getattr(m, k) for k in TIMELINE_INPUTS} == before


def test_timeline_after_every_hostile_value_builds_as_a_fresh_model():
    """Unstubbed: every field attacked with every hostile value, then one real build of the base settings."""
    m = TimelineModel(**TIMELINE_BASE)
    for field, (_, _, takes) in TIMELINE_FIELDS.items():
        for value in HOSTILE:
            if not takes(value):  # a value it takes would build for real: a second each
                assert call(m.build, **{field: value}) is False
    good = {k: getattr(TimelineModel(**TIMELINE_BASE), k) for k in TIMELINE_INPUTS}
    fresh = TimelineModel(**TIMELINE_BASE)
    assert call(m.build, **good) and fresh.build(**good), m.error
    assert m.figure_data() == fresh.figure_data()
    untimed = [re.sub(r"in [0-9.]+ s", "in - s", x.summary()) for x in (m, fresh)]  # the replay's seconds differ
    assert untimed[0] == untimed[1]


# -- playground ------------------------------------------------------------------------------------------
PLAYGROUND_BASE = dict(
    op="causal_conv1d.update", variant="decode", impl="reference", conventions=("sglang",), capture=False,
    rows=1, padded=1,
)  # fmt: skip
# field: (control, good value, the hostile values it takes)
PLAYGROUND_FIELDS: dict[str, tuple[str, Any, Callable[[Any], bool]]] = {
    "op": ("op", "linear_attn.recurrent", never),
    "variant": ("variant", "verify", lambda v: v is None),  # None: the op's first variant
    "impl": ("impl", "reference", never),
    "shapes": ("shapes", {"dim": 16}, never),
    "rows": ("shapes", 2, is_int),  # any int: clamped into RANGES, with a note
    "padded": ("shapes", 0, is_int),
    "padded_tokens": ("padded_rows", True, lambda v: v is None or is_bool(v)),
    "conventions": ("general", ("vllm",), never),
    "capture": ("general", True, is_bool),
    "seed": ("general", 3, int_in(0, 2**63 - 1)),
}
# the good op's variant: "verify" is not one of linear attention's
PLAYGROUND_PAIRS = {"op": {"variant": None}}


def _playground_view(m: PlaygroundModel) -> tuple[Any, ...]:
    res = m.run()
    return m.plan(), m.errors, m.notes, None if res is None else (res.ok, res.candidate, res.shapes, res.names)


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
@pytest.mark.parametrize("field", list(PLAYGROUND_FIELDS))
def test_playground_answers_any_value(field, value):
    control, good, takes = PLAYGROUND_FIELDS[field]
    m = PlaygroundModel(**PLAYGROUND_BASE)
    setattr(m, field, value)
    plan = call(m.plan)
    res = call(m.run)
    if takes(value):
        assert plan.ok and res is not None and not m.errors, m.errors
    else:
        assert res is None and m.result is None and control in m.errors, m.errors
        assert set(m.errors) <= set(PLAYGROUND_CONTROLS)
        assert names_field(m.errors[control], field, control) and all(one_line(e) for e in m.errors.values())
        assert not plan.ok and control in plan.errors, plan.errors  # said before a run, beside the control
        assert call(lambda: m.error) is not None
    fresh = PlaygroundModel(**PLAYGROUND_BASE)
    for name, v in {field: good, **PLAYGROUND_PAIRS.get(field, {})}.items():
        setattr(m, name, v)
        setattr(fresh, name, v)
    want = _playground_view(fresh)
    assert want[3] is not None and want[3][0], want
    assert call(_playground_view, m) == want


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
@pytest.mark.parametrize("field", list(PLAYGROUND_FIELDS))
def test_playground_constructor_answers_any_value(field, value):
    control, _, takes = PLAYGROUND_FIELDS[field]
    if field == "impl":
        takes = lambda v: v is None  # the constructor's None: what runs here
    m = call(PlaygroundModel, **{**PLAYGROUND_BASE, field: value})
    plan = call(m.plan)
    assert plan.ok is takes(value) or control in plan.errors, plan.errors


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
def test_playground_user_kernel_answers_any_value(value):
    m = PlaygroundModel(**PLAYGROUND_BASE)
    call(m.use_kernel, value)
    res = call(m.run)
    if value is None:
        assert res is not None and res.ok
        return
    assert res is None and "general" in m.errors and "fn" in m.errors["general"], m.errors
    call(m.use_kernel, None)
    assert call(m.run) is not None


# -- timing ---------------------------------------------------------------------------------------------
TIMING_BASE = dict(batch_sizes="1", modes=("eager",), min_run_time=0.001)
# field: (control, good value, the hostile values it takes, the actions that read it)
TIMING_FIELDS: dict[str, tuple[str, Any, Callable[[Any], bool], tuple[str, ...]]] = {
    "batch_sizes": ("batch_sizes", "1, 2", never, ("sweep", "roofline_run", "bucket_lists")),
    "impls": ("impls", ("reference",), never, ("sweep", "roofline_run")),
    "modes": ("modes", ("replay",), never, ("sweep",)),
    "layer": ("layer", "mamba2", never, ("sweep",)),
    "preset": ("preset", "quarter", never, ("sweep", "roofline_run")),
    "device": ("general", "cpu", never, ("sweep", "roofline_run")),
    "buckets": ("buckets", "1, 8", blank, ("bucket_lists",)),  # blank: no list of yours
    "min_run_time": ("general", 0.002, lambda v: is_real(v) and 0 < v <= MAX_RUN_TIME, ("sweep", "roofline_run")),
}


def _timing_view(m: TimingModel) -> tuple[Any, ...]:
    problems, lists = m.problems(), m.bucket_lists()
    return problems, lists, m.error, m.error_on, dict(m.stale), m.status


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
@pytest.mark.parametrize("field", list(TIMING_FIELDS))
def test_timing_answers_any_value(field, value, monkeypatch):
    import workbench.measure.ceilings
    import workbench.sweeps.kernels
    import workbench.sweeps.replay

    control, good, takes, actions = TIMING_FIELDS[field]
    m = TimingModel(**TIMING_BASE)
    setattr(m, field, value)
    problems = call(m.problems)
    if takes(value):
        assert field == "buckets" or not problems, problems
        return  # a good setting: the actions run as tested elsewhere
    for module, name in (
        (workbench.sweeps.replay, "sweep"),
        (workbench.sweeps.kernels, "sweep"),
        (workbench.measure.ceilings, "measure_ceilings"),
    ):
        monkeypatch.setattr(module, name, lambda *a, _n=name, **k: pytest.fail(f"{_n} ran on a refused value"))
    if field != "buckets":
        assert control in problems and names_field(problems[control], field, control), problems
    for action in actions:
        out = call(getattr(m, action))
        assert out is None and m.error_on == control and names_field(m.error, field, control), (action, m.error)
        assert one_line(m.error) and m.status == ""
    monkeypatch.undo()
    setattr(m, field, good)
    fresh = TimingModel(**TIMING_BASE)
    setattr(fresh, field, good)
    assert call(_timing_view, m) == _timing_view(fresh)


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
@pytest.mark.parametrize("field", list(TIMING_FIELDS))
def test_timing_constructor_answers_any_value(field, value):
    control, _, takes, _ = TIMING_FIELDS[field]
    if field == "impls":
        takes = lambda v: v is None  # the constructor's None: what "auto" runs on the device
    m = call(TimingModel, **{**TIMING_BASE, field: value})
    problems = call(m.problems)
    if field == "buckets":
        assert (call(m.bucket_lists) is not None) is takes(value), m.error
    elif takes(value):
        assert not problems, problems
    else:
        assert control in problems, problems


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Any:
    from workbench.measure.timing import Results, TimingRecord

    rec = TimingRecord("gdn_decode_step", "cpu", {"bs": 1}, "reference", "eager", 100.0, 5.0, 9, 1)
    return Results([rec]).save(tmp_path_factory.mktemp("saved") / "run.json")


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
@pytest.mark.parametrize("arg", ["path", "label"])
def test_timing_load_answers_any_value(saved, arg, value):
    m = TimingModel(**TIMING_BASE)
    args = {"path": saved, "label": None} | {arg: value}
    res = call(m.load, **args)
    takes = arg == "label" and (value is None or isinstance(value, str))
    if takes:
        assert res is not None and len(m.overlays) == 1, m.error
        return
    assert res is None and not m.overlays and m.error_on == "path" and names_field(m.error, arg, "file"), m.error
    assert one_line(m.error)
    assert call(m.load, saved, "good") is not None and list(m.overlays) == ["good"]


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
@pytest.mark.parametrize("action, arg", [("bucket_lists", "max_bs"), ("roofline_run", "ops")])
def test_timing_action_arguments_answer_any_value(action, arg, value, monkeypatch):
    import workbench.measure.ceilings

    monkeypatch.setattr(workbench.measure.ceilings, "measure_ceilings", lambda *a, **k: pytest.fail("work ran"))
    m = TimingModel(**TIMING_BASE)
    if value is None or (action == "bucket_lists" and int_in(1, 8192)(value)):
        if action == "bucket_lists":  # a roofline run of good values is tested elsewhere
            assert call(getattr(m, action), value) is not None, m.error
        return
    out = call(getattr(m, action), value)
    assert out is None and names_field(m.error, arg, m.error_on) and one_line(m.error), m.error
