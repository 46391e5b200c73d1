"""A zoo case's evidence as a figure, broken beside fixed (``viz.zoo_evidence``): the panels it picks, what each
side draws (the metadata rows that differ, the slots a step wrote, the NaN rows, a trace's slot owners), and
the evidence data it is drawn from."""

import json

import pytest

from workbench import zoo
from workbench.viz import zoo_evidence
from workbench.viz.metadata import CHANGED_BAD, CHANGED_DUMMY, CHANGED_OK, UNCHANGED
from workbench.viz.zoo import DIFFERS, GOT, WANT, evidence_panels
from workbench.zoo.result import IntegrityEvidence, Propagation, RowsDiffer, TraceEvidence, ZooError


@pytest.fixture(scope="module")
def runs():
    """The cases these tests draw, run once each way."""
    names = ["stale_rows", "in_capture", "uninit_pad", "slot_reuse", "dp_dummy_rows"]
    return {b.case: (b, f) for b, f in zoo.run_all(names, backend="cpu")}


def axis(row: int, col: int) -> str:
    """The x axis of panel (row, col) of a two-column grid: x, x2, x3, ..."""
    n = (row - 1) * 2 + col
    return "x" if n == 1 else f"x{n}"


def on(fig, row: int, col: int, kind: str | None = None) -> list:
    return [t for t in fig.data if t.xaxis == axis(row, col) and (kind is None or t.type == kind)]


def one(evidence, kind):
    (found,) = [e for e in evidence if isinstance(e, kind)]
    return found


# -- the evidence carries what a figure needs ----------------------------------------------------------------
def test_evidence_records_the_slots_written_the_rows_compared_and_the_trace(runs):
    broken, fixed = runs["stale_rows"]
    ev = one(broken.evidence, IntegrityEvidence)
    assert ev.written == (1, 2, 3, 4) and ev.live == (1, 2, 3) and ev.slots == [4] and ev.num_slots == 16
    assert ev.dummy == 0  # the scenario lets the dummy slot be written
    assert one(fixed.evidence, IntegrityEvidence).written == (0, 1, 2, 3)
    rows = [e for e in broken.evidence if isinstance(e, RowsDiffer)]
    assert [r.field_name for r in rows] == ["req_pool_indices", "state_indices"]
    got, want = rows[1].metadata
    assert got.state_indices.tolist() == [1, 2, 3, 4] and want.state_indices.tolist() == [1, 2, 3, 0]
    nan = one(runs["uninit_pad"][0].evidence, Propagation)
    assert nan.num_rows == 4 and dict(nan.stages)["conv output"] == (3,)
    trace = one(runs["slot_reuse"][0].evidence, TraceEvidence)
    t = trace.timeline
    assert t is not None and t.steps == (0, 1, 2, 3) and len(t.owners) == 4 and len(t.owners[0]) == len(t.slots)
    assert t.owners[0][1] == 0 and t.owners[3][1] == 1  # slot 1: request 0's, then request 1's
    # the figure's metadata stays out of the JSON (and of the exported tests)
    data = json.loads(json.dumps(broken.to_dict()))
    assert "metadata" not in data["evidence"][2] and data["evidence"][2]["field_name"] == "state_indices"
    assert data["evidence"][0]["written"] == [1, 2, 3, 4]


# -- the panels ----------------------------------------------------------------------------------------------
def test_panels_put_the_case_s_own_mechanism_first(runs):
    kinds = {name: [(p.kind, p.title) for p in evidence_panels(*pair)] for name, pair in runs.items()}
    assert kinds["stale_rows"] == [("rows", "state_indices"), ("pool", "state slots written")]
    assert kinds["in_capture"] == [("pool", "state slots written")]  # the broken run raised: words on its side
    assert kinds["uninit_pad"] == [("nan", "NaN rows by stage")]  # its pool panel draws the same both sides
    assert [k for k, _ in kinds["dp_dummy_rows"]] == ["trace", "trace"]
    assert kinds["dp_dummy_rows"][0][1] == "condensed batch, slot owners"


# -- what each side draws ------------------------------------------------------------------------------------
def test_metadata_rows_and_slots_broken_beside_fixed(runs):
    broken, fixed = runs["stale_rows"]
    fig = zoo_evidence(broken, fixed)
    titles = [a.text for a in fig.layout.annotations]
    assert titles[:4] == [
        "broken: state_indices",
        "fixed: state_indices",
        "broken: state slots written",
        "fixed: state slots written",
    ]
    assert fig.layout.title.text == "stale_rows (sglang PR 26292): broken beside fixed"
    for row in (1, 2):
        assert on(fig, row, 1) and on(fig, row, 2)  # traces on both sides of both rows

    def cells(col):  # (line, batch row) -> the state index drawn in the cell
        out = {}
        for t in on(fig, 1, col, "bar"):
            if t.name != DIFFERS:
                for base, y, text in zip(t.base, t.y, t.text, strict=True):
                    out[(y, round(base + 0.5))] = text
        return out

    assert cells(1)[(GOT, 3)] == "4" and cells(1)[(WANT, 3)] == "0"  # the padded row named request 4's slot
    assert cells(2)[(GOT, 3)] == "0"
    (b_diff,) = [t for t in on(fig, 1, 1, "bar") if t.name == DIFFERS]
    (f_diff,) = [t for t in on(fig, 1, 2, "bar") if t.name == DIFFERS]
    assert [round(b + 0.5) for b in b_diff.base] == [3] and list(f_diff.base) == []

    def pool(col):
        (hm,) = on(fig, 2, col, "heatmap")
        return dict(zip((int(x) for x in hm.x), hm.z[0], strict=True))

    b, f = pool(1), pool(2)
    assert [s for s, c in b.items() if c == CHANGED_OK] == [1, 2, 3] and b[4] == CHANGED_BAD
    assert f[0] == CHANGED_DUMMY and [s for s, c in f.items() if c == CHANGED_OK] == [1, 2, 3]
    assert f[4] == UNCHANGED and b != f


def test_a_run_that_stopped_says_so_in_its_panel(runs):
    fig = zoo_evidence(*runs["in_capture"])
    assert on(fig, 1, 1) == [] and on(fig, 1, 2, "heatmap")
    words = [a.text for a in fig.layout.annotations if a.text.startswith("nothing to draw here")]
    assert len(words) == 1 and "TypeError" in words[0] and "in_capture" in words[0].replace("<br>", "")
    assert fig.layout.xaxis.visible is False and fig.layout.xaxis2.visible is not False


def test_nan_rows_by_stage(runs):
    fig = zoo_evidence(*runs["uninit_pad"])
    (b,), (f,) = on(fig, 1, 1, "heatmap"), on(fig, 1, 2, "heatmap")
    assert list(b.y) == ["conv output", "ssm output", "layer output"] and list(b.x) == ["0", "1", "2", "3"]
    assert [list(line) for line in b.z] == [[0, 0, 0, 1]] * 3 and [list(line) for line in f.z] == [[0, 0, 0, 0]] * 3


def test_trace_cases_draw_slot_timelines_with_the_divergence_on_the_broken_side(runs):
    broken, fixed = runs["slot_reuse"]
    fig = zoo_evidence(broken, fixed)
    (b,), (f,) = on(fig, 1, 1, "heatmap"), on(fig, 1, 2, "heatmap")
    assert list(b.x) == [0, 1, 2, 3] and list(f.x) == [0, 1, 2, 3, 4, 5]  # the broken replay stopped at step 3
    crosses = [t for t in fig.data if t.type == "scatter" and t.name.startswith("first divergence")]
    assert [(t.xaxis, list(t.x)) for t in crosses] == [("x", [3])]
    assert broken.evidence[0].divergence.slot == 1 and list(crosses[0].y) == [1]
    names = [t.name for t in fig.data if t.showlegend is not False and t.type == "scatter"]
    assert len(names) == len(set(names))  # each legend entry once
    two = zoo_evidence(*runs["dp_dummy_rows"])
    assert all(on(two, r, c, "heatmap") for r in (1, 2) for c in (1, 2))


def test_every_case_draws_both_sides(runs):
    """Each side of each row has traces, or says in words why it has none."""
    for name, (broken, fixed) in runs.items():
        fig = zoo_evidence(broken, fixed)
        panels = evidence_panels(broken, fixed)
        for r, p in enumerate(panels, start=1):
            for c, shown in ((1, p.broken), (2, p.fixed)):
                assert bool(on(fig, r, c)) == bool(shown), (name, r, c)
        assert fig.layout.height > 300, name


def test_sides_can_be_renamed_and_bad_input_is_refused(runs):
    broken, fixed = runs["stale_rows"]
    fig = zoo_evidence(broken, fixed, sides=("yours", "fixed"))
    assert fig.layout.annotations[0].text == "yours: state_indices"
    with pytest.raises(ZooError, match="results of two cases, 'stale_rows' and 'in_capture'"):
        zoo_evidence(broken, runs["in_capture"][1])
    with pytest.raises(ZooError, match="expected two ZooResults"):
        zoo_evidence(broken, "fixed")  # type: ignore[arg-type]
    with pytest.raises(ZooError, match="sides: expected two titles"):
        zoo_evidence(broken, fixed, sides=("a",))
