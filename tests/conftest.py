import compileall
import os
from pathlib import Path

import pytest

# Integration tests start daemons that import the project from the checkout.
os.environ.setdefault("PYTHONHASHSEED", "0")

ROOT = Path(__file__).resolve().parent.parent


def pytest_sessionstart(session: pytest.Session) -> None:
    """Write the project's bytecode once. The suite starts hundreds of Python processes that
    import it (daemons, the CLI, Spark workers); where PYTHONDONTWRITEBYTECODE is set none of
    them writes its .pyc, so each would compile every module again (about 0.25 s a start)."""
    for folder in ("delayd", "broker", "storage", "client", "bench", "tests/support"):
        compileall.compile_dir(ROOT / folder, quiet=2, workers=1)


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
