"""The replication stream carries every message of the shard: with tokens configured, only an
admin token opens it, and the members present the admin token of their shared configuration."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from delayd.broker.config import Config, ConfigError, Token

from tests.support.etcd import EtcdProcess
from tests.support.replicated import Cluster

ADMIN = "adm-4Hq9-replication"
PRODUCER = "prd-8Kd2-replication"
TOKENS = f"""
[[auth.tokens]]
token = "{PRODUCER}"
rights = ["produce", "consume"]

[[auth.tokens]]
token = "{ADMIN}"
rights = ["admin"]
"""


@pytest.fixture
def secured(tmp_path: Path, etcd: EtcdProcess) -> Iterator[Cluster]:
    c = Cluster(tmp_path, etcd, names=("a", "b"), config_text=TOKENS, token=ADMIN)
    try:
        yield c
    finally:
        c.shutdown()


def stream_status(url: str, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(url + "/internal/replication/stream?from=0&epoch=0&member=x&last_epoch=0",
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_followers_replicate_with_tokens_and_only_admin_opens_the_stream(secured: Cluster) -> None:
    c = secured.start()
    p = c.wait_primary()
    # The follower joined the in-sync set: it opened the stream with the shared admin token.
    c.wait_isr(p, 2)
    status, body = c.members[p].request("POST", "/v1/topics/t/messages", {"messages": [{"body": "x"}]},
                                        headers={"Authorization": f"Bearer {PRODUCER}"})
    assert status == 200, body
    url = c.members[p].url
    assert stream_status(url, None) == 401
    assert stream_status(url, "not-a-token-at-all") == 401
    assert stream_status(url, PRODUCER) == 403, "a token without the admin right must not read the log"


def test_replication_with_tokens_needs_an_admin_token_and_refuses_auto_token() -> None:
    base = {"replication_enabled": True, "replication_member": "a", "node_id": "s0",
            "replication_advertise_url": "http://127.0.0.1:7070",
            "replication_etcd_endpoints": ("http://127.0.0.1:2379",)}
    ok = Config(**base, tokens=(Token(PRODUCER, ("produce",)), Token(ADMIN, ("admin",)))).validate()
    assert ok.stream_token() == ADMIN
    with pytest.raises(ConfigError, match="admin"):
        Config(**base, tokens=(Token(PRODUCER, ("produce",)),)).validate()
    with pytest.raises(ConfigError, match="auto-token"):
        Config(**base, auto_token=True).validate()
    assert Config(**base).validate().stream_token() is None  # no tokens: loopback or --insecure
