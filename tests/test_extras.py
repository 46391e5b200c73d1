"""A missing optional package is one line naming the extra that installs it, and exit status 2 on the command
line, never a ModuleNotFoundError traceback. Packages are hidden by putting None in ``sys.modules`` (what
Python reads as "not installed")."""

import sys

import pytest

from workbench import extras
from workbench.cli import main
from workbench.errors import MissingExtra, WorkbenchError
from workbench.measure.timing import Results, TimingRecord

LAB = "pip install 'linattn-workbench[lab]'"
DEFAULT = "it is a default dependency of linattn-workbench, reinstall it: pip install 'linattn-workbench'"


def hide(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    """Make ``package`` and its submodules unimportable for the rest of the test."""
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")] + [package]:
        monkeypatch.setitem(sys.modules, name, None)


def test_require_returns_the_module_or_names_the_extra(monkeypatch):
    assert extras.require("json", None, "x") is sys.modules["json"]
    hide(monkeypatch, "pandas")
    with pytest.raises(MissingExtra) as e:
        extras.require("pandas", "lab", "Results.to_frame()")
    assert str(e.value) == f"pandas is needed for Results.to_frame(); install the 'lab' extra: {LAB}"
    assert isinstance(e.value, WorkbenchError) and isinstance(e.value, ImportError)  # both kinds of handler catch it
    assert isinstance(e.value.__cause__, ModuleNotFoundError)  # the original failure, for a traceback reader


def test_a_package_missing_one_of_its_own_dependencies_says_which(tmp_path, monkeypatch):
    (tmp_path / "half_installed.py").write_text("import not_a_real_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MissingExtra, match="^half_installed is needed for figures but does not import "):
        extras.require("half_installed", None, "figures")
    with pytest.raises(MissingExtra, match="no module named 'not_a_real_dependency_xyz'.*reinstall it"):
        extras.require("half_installed", None, "figures")


def test_other_import_failures_are_not_mistaken_for_a_missing_package(tmp_path, monkeypatch):
    (tmp_path / "broken_library.py").write_text("raise ImportError('libascendcl.so: cannot open shared object')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match="libascendcl") as e:
        extras.require("broken_library", "npu", "npu graphs")
    assert not isinstance(e.value, MissingExtra)


def test_to_frame_without_pandas_is_one_line(monkeypatch):
    rec = TimingRecord(
        what="op", device="cpu", shape={"bs": 1}, impl="x", mode="eager", median_us=1.0, iqr_us=0.1, n=5, threads=1
    )
    hide(monkeypatch, "pandas")
    with pytest.raises(MissingExtra, match=r"^pandas is needed for Results\.to_frame\(\); install the 'lab' extra"):
        Results([rec]).to_frame()


def _one_error_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"workbench {command}: error: "), err
    return err.strip()


def test_report_without_plotly_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    hide(monkeypatch, "plotly")
    out = tmp_path / "report.html"
    assert main(["report", "--quick", "--out", str(out)]) == 2
    line = _one_error_line(capsys, "report")
    assert line.endswith(f"plotly is needed for workbench.viz figures; {DEFAULT}"), line
    assert not out.exists()


def test_bench_plot_without_plotly_exits_2_before_running(tmp_path, monkeypatch, capsys):
    hide(monkeypatch, "plotly")
    json_path = tmp_path / "metadata_cpu.json"
    argv = ["bench", "metadata", "--quick", "--device", "cpu", "--json", str(json_path)]
    assert main([*argv, "--plot", str(tmp_path / "f.html")]) == 2
    line = _one_error_line(capsys, "bench")
    assert line.endswith(f"plotly is needed for --plot FILE.html; {DEFAULT}"), line
    assert not json_path.exists()  # refused before the benchmark ran, not after


def test_widgets_without_ipywidgets_name_the_missing_package(monkeypatch):
    import workbench.widgets

    hide(monkeypatch, "ipywidgets")
    with pytest.raises(MissingExtra, match="^ipywidgets is needed for workbench.widgets.MetadataExplorer; it is a"):
        workbench.widgets.MetadataExplorer  # noqa: B018  (the attribute access imports the view)


def test_make_targets_check_with_one_line(capsys):
    assert extras.main(["json", "-", "make app"]) == 0
    assert extras.main(["not_installed_xyz", "lab", "make app"]) == 2
    assert (
        capsys.readouterr().err == f"error: not_installed_xyz is needed for make app; install the 'lab' extra: {LAB}\n"
    )
