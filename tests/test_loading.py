"""workbench.loading: a user's object from MODULE:NAME or path/to/file.py:NAME, one-line errors."""

import pytest

from workbench.loading import LoadError, load_object


def test_a_module_attribute_and_a_dotted_name():
    from workbench.backends import MetadataBackend

    assert load_object("workbench.backends:MetadataBackend") is MetadataBackend
    assert (
        load_object("workbench.backends:MetadataBackend.init_forward_metadata") is MetadataBackend.init_forward_metadata
    )


def test_a_file_with_a_sibling_import(tmp_path):
    (tmp_path / "helper_mod_for_loading.py").write_text("VALUE = 41\n")
    (tmp_path / "mine.py").write_text("from helper_mod_for_loading import VALUE\n\ndef f():\n    return VALUE + 1\n")
    assert load_object(f"{tmp_path / 'mine.py'}:f")() == 42


@pytest.mark.parametrize(
    "spec, words",
    [
        ("nocolon", "expected MODULE:NAME"),
        ("mod:", "expected MODULE:NAME"),
        ("mod:1bad", "expected MODULE:NAME"),
        ("no_such_module_xyz:f", "importing 'no_such_module_xyz' raised ModuleNotFoundError"),
        ("workbench.backends:Nope", "defines no 'Nope'"),
        ("/no/such/file.py:f", "no file '/no/such/file.py'"),
    ],
)
def test_bad_specs_say_why_in_one_line(spec, words):
    with pytest.raises(LoadError, match=words) as e:
        load_object(spec)
    assert "\n" not in str(e.value)


def test_a_file_that_raises_at_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(LoadError, match="raised RuntimeError: boom"):
        load_object(f"{bad}:f")


# -- user code that tries to end the process: never exit 0, never silence ---------------------------------

EXITS = {
    "sys.exit": "import sys\n\ndef kern(*args, **kwargs):\n    sys.exit(0)\n",
    "SystemExit": "# raised, not called\n\ndef kern(*args, **kwargs):\n    raise SystemExit(0)\n",
    "os._exit": "import os\n\ndef kern(*args, **kwargs):\n    os._exit(0)\n",
}


@pytest.mark.parametrize("how", ["sys.exit(main())", "raise SystemExit(0)", "raise SystemExit"])
def test_a_file_that_exits_at_import_is_a_load_error_naming_its_line(tmp_path, how):
    path = tmp_path / "exits.py"
    path.write_text(f"import sys\n\ndef main():\n    return 0\n\ndef kern():\n    pass\n\n{how}\n")
    with pytest.raises(LoadError) as e:
        load_object(f"{path}:kern")
    text = str(e.value)
    assert f"{path}:9" in text and "exited (exit status" in text and '__name__ == "__main__"' in text
    assert "\n" not in text


@pytest.mark.parametrize("how", list(EXITS))
def test_exits_refused_turns_any_exit_of_user_code_into_one_error(tmp_path, how):
    import os

    from workbench.loading import UserCodeExit, exits_refused

    path = tmp_path / "k.py"
    path.write_text(EXITS[how])
    kern = load_object(f"{path}:kern")
    real = os._exit
    with pytest.raises(UserCodeExit) as e, exits_refused("the check"):
        kern()
    assert os._exit is real  # restored
    assert str(e.value).startswith(f"the check: user code at {path}:4") and "no verdict" in str(e.value)


def test_the_workbenchs_own_exits_pass_through():
    """argparse's --help and the workbench's own SystemExit are exits, not user code's."""
    import argparse

    from workbench.loading import exits_refused

    with pytest.raises(SystemExit) as e, exits_refused("x"):
        argparse.ArgumentParser(prog="p").parse_args(["--help"])
    assert e.value.code == 0


@pytest.mark.parametrize("how", list(EXITS))
def test_check_kernel_on_a_kernel_that_exits_is_a_failure_never_exit_0(tmp_path, how, capsys):
    """Exit 0 means every check passed to a CI job: a kernel that exits gets 1 and a line naming it."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _cli_run import run

    path = tmp_path / "k.py"
    path.write_text(EXITS[how])
    code, out, err = run(["check-kernel", f"{path}:kern", "--op", "causal_conv1d.update", "--no-capture"])
    assert code == 1, (out, err)
    assert f"{path}:4" in out + err and "Traceback" not in out + err
