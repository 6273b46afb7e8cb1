"""A real etcd for the replication coordination tests (tests/support/etcd.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.etcd import ETCD, EtcdProcess

MISSING = "etcd is not installed: scripts/install-test-deps.sh (run by `make test`) installs Debian's etcd-server"


def need_etcd() -> None:
    if ETCD is None:
        if os.environ.get("CI"):  # make test installs it first: missing there is a broken setup
            pytest.fail(MISSING)
        pytest.skip(MISSING)


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    """One etcd per test module; tests keep apart by key prefix."""
    need_etcd()
    e = EtcdProcess(tmp_path_factory.mktemp("etcd") / "data").start()
    yield e
    e.stop()


@pytest.fixture
def own_etcd(tmp_path) -> Iterator[EtcdProcess]:
    """An etcd of the test's own, for tests that kill and restart it."""
    need_etcd()
    e = EtcdProcess(tmp_path / "etcd-data").start()
    yield e
    e.stop()
