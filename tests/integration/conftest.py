"""Shared fixtures: one real daemon per test module, for tests that use distinct topics."""

from __future__ import annotations

import pytest

from tests.integration.wire import Api, call, daemon_log_clean
from tests.support.daemon import DaemonProcess


@pytest.fixture(scope="module")
def daemon(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    d = DaemonProcess(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]) / "data").start()
    yield d
    # Whatever the module threw at it, the daemon still serves, logged no 500 and stops cleanly.
    assert call(d, "GET", "/healthz").status == 200
    code = d.stop()
    daemon_log_clean(d)
    assert code == 0, d.log_tail()


@pytest.fixture
def api(daemon: DaemonProcess) -> Api:
    return Api(daemon)
