"""Replicated shards on loopback: one real etcd per module, real daemons per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.conftest import need_etcd
from tests.support.etcd import EtcdProcess
from tests.support.replicated import Cluster


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    need_etcd()
    e = EtcdProcess(tmp_path_factory.mktemp("etcd") / "data").start()
    yield e
    e.stop()


@pytest.fixture
def cluster(tmp_path: Path, etcd: EtcdProcess) -> Iterator[Cluster]:
    c = Cluster(tmp_path, etcd)
    try:
        yield c
    finally:
        c.shutdown()
