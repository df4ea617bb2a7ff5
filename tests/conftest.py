import os

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/tests/lab/" in str(item.fspath):
            item.add_marker(pytest.mark.lab)


@pytest.fixture(scope="session", autouse=True)
def _lab_tests_need_root(request):
    # Lab tests exercise real namespaces and OVS: without root they must fail loudly, not skip.
    if any("/tests/lab/" in str(i.fspath) for i in request.session.items) and os.geteuid() != 0:
        pytest.exit("tests/lab needs root (namespaces, OVS): run 'sudo make test'", returncode=1)


# Under `make test` (FATHOM_NO_SKIP=1) a skip is a failure: a missing tool, native build or root must
# not let a suite pass silently. Run by hand, a file may still skip.
NO_SKIP = os.environ.get("FATHOM_NO_SKIP") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if NO_SKIP and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped, and nothing may skip under `make test`: {reason}"
