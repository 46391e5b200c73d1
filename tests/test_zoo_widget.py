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
