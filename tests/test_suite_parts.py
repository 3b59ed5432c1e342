"""The suite's own machinery: tools/test.sh's parallel part keeps each ``xdist_group`` in one process; the session's
cache makes each thing once for all its processes; CI's run without the extras takes the files that name one."""

import pytest


@pytest.mark.xdist_group("suite_parts")
def test_xdist_groups_are_kept_together(request):
    """Under ``--dist loadgroup`` pytest-xdist ends the id of a test marked ``xdist_group`` with ``@<group>``, which
    is how its scheduler sends a group to one process (the Ray tests share one cluster; the parity tests one
    reference). pytest 9.2 builds ids anew and pytest-xdist 3.8's renaming is lost
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


def test_the_session_cache_makes_each_key_once(tmp_path):
    """``conftest.SessionCache``: two askers of one key at once (pytest-xdist's workers; here two threads, each
    with its own open lock file, as two processes have) get one folder and one make's result; another key is made
    apart; a make that failed is made again by the next to ask."""
    import threading
    import time

    from conftest import SessionCache

    calls = []

    def make(folder):
        calls.append(folder)
        time.sleep(0.3)  # the other asker arrives meanwhile
        (folder / "made").write_text("x")
        return {"n": len(calls)}

    got = []
    askers = [threading.Thread(target=lambda: got.append(SessionCache(tmp_path).get({"a": 1}, make)))
              for _ in range(2)]
    for t in askers:
        t.start()
    for t in askers:
        t.join()
    assert len(calls) == 1 and got[0] == got[1] == (calls[0], {"n": 1}) and (calls[0] / "made").is_file()
    assert SessionCache(tmp_path).get({"a": 2}, make)[1] == {"n": 2} and len(calls) == 2

    def failing(folder):
        (folder / "half").write_text("")
        raise RuntimeError("failed")

    with pytest.raises(RuntimeError):
        SessionCache(tmp_path).get({"b": 1}, failing)
    folder, made = SessionCache(tmp_path).get({"b": 1}, make)
    assert made == {"n": 3} and not (folder / "half").exists()
