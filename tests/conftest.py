import os

import pytest

# Integration tests start daemons that import the project from the checkout.
os.environ.setdefault("PYTHONHASHSEED", "0")


@pytest.fixture(scope="session", autouse=True)
def _reap_daemons():
    """A test that fails before stopping its daemon must not leave the process running."""
    yield
    from tests.support.daemon import STARTED
    from tests.support.etcd import STARTED as ETCDS
    for d in STARTED:
        d.kill9()
    for e in list(ETCDS):
        e.stop()
