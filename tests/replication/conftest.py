"""Replicated shards on loopback: one real etcd per module (the coordination tests' fixture), real
daemons per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.conftest import etcd  # noqa: F401 - the fixture, shared with the coordination tests
from tests.support.etcd import EtcdProcess
from tests.support.replicated import Cluster


@pytest.fixture
def cluster(tmp_path: Path, etcd: EtcdProcess) -> Iterator[Cluster]:  # noqa: F811
    c = Cluster(tmp_path, etcd)
    try:
        yield c
    finally:
        c.shutdown()
