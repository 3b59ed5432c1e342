"""The suite's own machinery: tools/test.sh's parallel part keeps each ``xdist_group`` in one process."""

import pytest


@pytest.mark.xdist_group("suite_parts")
def test_xdist_groups_are_kept_together(request):
    """Under ``--dist loadgroup`` pytest-xdist ends the id of a test marked ``xdist_group`` with ``@<group>``, which
    is how its scheduler sends a group to one process (the Ray tests share one cluster; the parity tests one
    reference; the export tests one export). pytest 9.2 builds ids anew and pytest-xdist 3.8's renaming is lost
    there: every group silently spread over both processes (the test extra keeps pytest below 9.2)."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not under pytest-xdist's --dist loadgroup (tools/test.sh's parallel part)")
    assert request.node.nodeid.endswith("@suite_parts"), (
        f"pytest {pytest.__version__} with pytest-xdist's --dist loadgroup lost the test's xdist_group "
        f"({request.node.nodeid}): every group runs spread over the processes")


def test_the_run_without_the_extras_takes_the_files_that_name_one():
    """CI's run without the optional extras (``tools/without_extras.py --naming-extras``) takes the test files that
    name an extra (a guard, an import or a module's quoted name) and the CLI smoke run, and no file that names none."""
    import sys

    from helpers import ROOT

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import without_extras
    finally:
        sys.path.remove(str(ROOT / "tools"))
    files = without_extras.files_naming_extras(["onnx", "starlette"])
    assert {"tests/test_export.py", "tests/test_serve.py", "tests/test_int8.py"} <= set(files)  # guards and imports
    assert "tests/test_norm.py" not in files and "tests/test_cli.py" in without_extras.SMOKE
    assert all((ROOT / f).is_file() for f in [*files, *without_extras.SMOKE])
