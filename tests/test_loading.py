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
