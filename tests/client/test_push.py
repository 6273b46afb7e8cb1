"""The SDK's side of push subscriptions, against the real daemon and a real endpoint:
`subscribe(..., push=...)` on both clients makes a group push, `push=False` makes it pull again."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterator

import msgpack
import pytest
from delayd.client import AsyncClient, Client, Conflict, InvalidRequest, PushSettings

from tests.support.daemon import DaemonProcess, wait_until
from tests.support.webhook import Receiver

SECRET = "sdk-secret-0123456789"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("push-sdk") / "data").start()
    yield d
    assert d.stop() == 0, d.log_tail()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


async def test_async_subscribe_with_push_settings_then_back_to_pull(daemon: DaemonProcess,
                                                                     receiver: Receiver) -> None:
    async with AsyncClient(daemon.url) as c:
        sub = await c.subscribe("sdk-a", "g", max_attempts=3, push=PushSettings(
            receiver.url("/sdk-a"), timeout_ms=2000, max_in_flight=2, secret=SECRET, format="msgpack"))
        assert sub.max_attempts == 3 and sub.push == PushSettings(
            receiver.url("/sdk-a"), 2000, 2, None, "msgpack",
            "sha256:" + hashlib.sha256(SECRET.encode()).hexdigest()[:16]), "the secret never comes back"
        assert (await c.subscribe("sdk-a", "g")).push == sub.push, "push=None leaves it as it is"
        sent = await c.send("sdk-a", b"\x01\x02", headers={"h": "v"})
        (hit,) = wait_until(lambda: receiver.answered("/sdk-a"), 10, what="push")
        t, v1 = (part.split("=", 1)[1] for part in hit.headers["delayd-signature"].split(","))
        assert v1 == hmac.new(SECRET.encode(), f"{t}.".encode() + hit.body, hashlib.sha256).hexdigest()
        env = msgpack.unpackb(hit.body, raw=False)
        assert (env["id"], env["body"], env["headers"]) == (sent.id, b"\x01\x02", {"h": "v"})
        with pytest.raises(Conflict) as info:
            await c.pull("sdk-a", "g", wait_ms=0)
        assert info.value.code == "push_subscription"
        back = await c.subscribe("sdk-a", "g", push=False)
        assert back.push is None and back.max_attempts == 3
        pulled = await c.send("sdk-a", b"pull me")
        got = await c.pull("sdk-a", "g", wait_ms=5000)
        assert [m.id for m in got] == [pulled.id]
        with pytest.raises(InvalidRequest) as bad:
            await c.subscribe("sdk-a", "g", push={"url": "ftp://nope"})
        assert bad.value.code == "invalid_push" and bad.value.status == 400
        with pytest.raises(TypeError):
            await c.subscribe("sdk-a", "g", push=True)


def test_sync_subscribe_with_a_mapping(daemon: DaemonProcess, receiver: Receiver) -> None:
    with Client(daemon.url, encoding="json") as c:
        sub = c.subscribe("sdk-s", "g", push={"url": receiver.url("/sdk-s")})
        assert sub.push is not None and sub.push.url == receiver.url("/sdk-s")
        assert (sub.push.timeout_ms, sub.push.max_in_flight, sub.push.format, sub.push.secret_fingerprint) == \
            (30_000, 10, "json", None), "the daemon's defaults"
        sent = c.send("sdk-s", "text body")
        (hit,) = wait_until(lambda: receiver.answered("/sdk-s"), 10, what="push")
        assert json.loads(hit.body)["body"] == "text body" and hit.headers["delayd-id"] == sent.id
        assert c.subscribe("sdk-s", "g", push=False).push is None
