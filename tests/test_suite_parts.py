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
