import pytest

from .util import running_lab


@pytest.fixture(scope="module")
def standalone_lab():
    with running_lab("t2s") as lab:
        yield lab
