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
