import os

# every reconciler (and every lab's controller) checks that its incrementally kept desired state
# equals a full compile after each pass (fathom.controller.reconciler, check_incremental)
os.environ.setdefault("FATHOM_CHECK_INCREMENTAL", "1")

import pytest

from .util import running_lab


@pytest.fixture(scope="module")
def standalone_lab():
    with running_lab("t2s") as lab:
        yield lab
