"""The ``BugZoo`` widget's "your backend" field: the model checks a spec against the zoo (words, not
exceptions, for bad input), and the view shows the results as a table that goes away when the spec changes."""

from pathlib import Path

USER = Path(__file__).parent / "fixtures" / "user_backends"


def test_model_checks_a_backend_and_says_what_is_wrong():
    from workbench.widgets.zoo_model import ZooModel

    m = ZooModel()
    checks = m.check_backend(f"{USER}/host_read_bug.py:MaxLenBackend")
    assert checks is not None and m.error is None and not checks.ok
    rows = {r["case"]: r for r in m.check_rows()}
    assert rows["host_value"]["status"] == "reproduced" and rows["host_value"]["issue"] == "sglang PR 16186"
    assert "recorder refused aten._local_scalar_dense" in rows["host_value"]["evidence"]
    assert rows["contract_drift"]["status"] == "not applicable"
    m.set_backend_spec("something_else.py:X")  # the results described the old spec
    assert m.checks is None and m.check_rows() == []
    for spec, words in [
        ("", "enter MODULE_OR_FILE:CLASS"),
        ("nope.py:X", "no file 'nope.py'"),
        ("workbench.batch:Batch", "is not a subclass of workbench.backends.MetadataBackend"),
    ]:
        assert m.check_backend(spec) is None and m.checks is None
        assert m.error is not None and m.error.startswith("your backend: ") and words in m.error


def test_view_shows_the_table_and_clears_it():
    from workbench.widgets import BugZoo

    z = BugZoo()
    assert z.your_backend.description == "your backend" and z.your_backend.placeholder == "MODULE_OR_FILE:CLASS"
    z.your_backend.value = f"{USER}/correct.py:AscendBackend"
    z.check_button.click()
    assert "data-ok='true'" in z.checks.value and "<table" in z.checks.value and z.error.value == ""
    assert z.checks.value.count("wb-ok") >= 6  # a green status cell per clean case
    z.your_backend.value = f"{USER}/in_capture_bug.py:AscendBackend"
    assert z.checks.value == ""  # the clean verdict was about the other class
    z.check_button.click()
    assert "data-ok='false'" in z.checks.value and "reproduced" in z.checks.value
    z.your_backend.value = "nope.py:X"
    z.check_button.click()
    assert z.checks.value == "" and "no file" in z.error.value


def test_a_failed_run_leaves_no_earlier_verdict():
    from workbench.widgets import BugZoo

    z = BugZoo()
    z.case.value = "fill_count"
    assert z.do_run() and z.unfixed.value
    z.model.backend = "tpu"  # the next run fails: the old results must not stay on show
    assert not z.do_run()
    assert z.unfixed.value == z.fixed.value == "" and "tpu" in z.error.value


# -- the evidence as a figure --------------------------------------------------------------------------------
def test_model_draws_the_last_run_broken_beside_fixed():
    """Without a browser: the figure of a run has traces on both sides, the slots the step wrote appear, and
    the fixed side differs from the broken one."""
    from workbench.viz.metadata import CHANGED_BAD, CHANGED_OK
    from workbench.widgets.zoo_model import ZooModel

    m = ZooModel()
    assert m.figure() is None and m.panels() == []  # nothing run yet
    assert m.run("tail_slice") is not None
    assert [p.kind for p in m.panels()] == ["rows", "pool"]
    fig = m.figure()
    sides = {t.xaxis for t in fig.data}
    assert sides == {"x", "x2", "x3", "x4"}  # two rows of panels, broken (x, x3) and fixed (x2, x4)
    (broken,) = [t for t in fig.data if t.type == "heatmap" and t.xaxis == "x3"]
    (fixed,) = [t for t in fig.data if t.type == "heatmap" and t.xaxis == "x4"]
    wrote = {name: {int(s): c for s, c in zip(t.x, t.z[0], strict=True)} for name, t in (("b", broken), ("f", fixed))}
    # unfixed: the graph read the tail of the buffer, so requests 5..8 (not in the step) were written
    assert [s for s, c in wrote["b"].items() if c == CHANGED_BAD] == [1, 2, 3, 5, 6, 7, 8]
    assert [s for s, c in wrote["f"].items() if c == CHANGED_OK] == [1, 2, 3]
    assert wrote["b"] != wrote["f"]
    cells = {
        (y, round(base + 0.5)): text
        for t in fig.data
        if t.type == "bar" and t.xaxis == "x" and t.text is not None
        for base, y, text in zip(t.base, t.y, t.text, strict=True)
    }
    handed = [cells[("graph's metadata", r)] for r in range(4)]
    assert handed == ["5", "6", "7", "8"]  # the slots the broken graph was handed
    assert [cells[("should be", r)] for r in range(4)] == ["1", "2", "3", "-1"]
    assert m.run("no_such_case") is None and m.figure() is None  # a failed run leaves no figure


def test_view_draws_the_figure_and_clears_it():
    from workbench.widgets import BugZoo
    from workbench.widgets.zoo import WAITING

    z = BugZoo()
    assert z.figure.layout.title.text == WAITING and len(z.figure.data) == 0
    z.case.value = "dummy_slot"
    z.run_button.click()
    assert z.figure.layout.title.text.startswith("dummy_slot (") and len(z.figure.data) > 0
    assert [a.text for a in z.figure.layout.annotations][:2] == [
        "broken: state slots written",
        "fixed: state slots written",
    ]
    z.case.value = "fill_count"  # another case: the figure of the last one goes
    assert z.figure.layout.title.text == WAITING and len(z.figure.data) == 0
    assert z.do_run() and len(z.figure.data) > 0
    z.model.backend = "tpu"
    assert not z.do_run() and z.figure.layout.title.text == WAITING
