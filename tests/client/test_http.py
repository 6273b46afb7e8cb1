"""Error mapping, retries and backoff, against a real HTTP server on loopback (the fake broker)."""

from __future__ import annotations

import random

import pytest
from delayd.client import (
    AlreadyDelivered,
    AsyncClient,
    Backpressure,
    Conflict,
    ConnectionFailed,
    DelaydError,
    DiskFull,
    Forbidden,
    InvalidMessage,
    InvalidName,
    InvalidParameter,
    InvalidRequest,
    NotFound,
    ServerError,
    TooLarge,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
)
from delayd.client.http import RetryPolicy, parse_retry_after

from tests.client.fakebroker import FakeBroker, Reply
from tests.client.helpers import FAST_RETRY
from tests.support.daemon import free_port


def err(status: int, code: str, message: str = "m", index: int | None = None,
        headers: dict[str, str] | None = None) -> Reply:
    body: dict[str, object] = {"code": code, "message": message}
    if index is not None:
        body["index"] = index
    return Reply(status, {"error": body}, headers or {})


@pytest.mark.parametrize(("status", "code", "cls"), [
    (400, "invalid_name", InvalidName), (400, "invalid_message", InvalidMessage),
    (400, "something_new", InvalidRequest), (400, "invalid_parameter", InvalidParameter), (401, "unauthorized", Unauthorized), (403, "forbidden", Forbidden),
    (404, "not_found", NotFound), (409, "already_delivered", AlreadyDelivered), (409, "other", Conflict),
    (413, "too_large", TooLarge), (415, "unsupported_media_type", UnsupportedMediaType),
    (507, "disk_full", DiskFull), (500, "internal", ServerError), (418, "teapot", InvalidRequest),
])
async def test_error_answers_map_to_classes(fake: FakeBroker, status: int, code: str,
                                            cls: type[DelaydError]) -> None:
    fake.script.append(err(status, code, "went wrong", index=3 if code == "invalid_message" else None))
    async with AsyncClient(fake.url, retry=FAST_RETRY) as c:
        with pytest.raises(cls) as info:
            await c.get("d-1")
    e = info.value
    assert type(e) is cls
    assert (e.status, e.code, e.message, e.url) == (status, code, "went wrong", fake.url)
    assert e.index == (3 if code == "invalid_message" else None)
    assert isinstance(e, DelaydError)
    assert len(fake.requests) == 1  # none of these is retried


async def test_non_api_error_body_is_still_mapped(fake: FakeBroker) -> None:
    fake.script.append(Reply(404, raw=b"404: Not Found", headers={"Content-Type": "text/plain"}))
    async with AsyncClient(fake.url) as c:
        with pytest.raises(NotFound) as info:
            await c.get("d-1")
    assert info.value.code == "not_found" and "Not Found" in info.value.message


async def test_get_is_retried_after_503_then_succeeds(fake: FakeBroker) -> None:
    fake.script += [err(503, "unavailable"), err(503, "unavailable")]
    async with AsyncClient(fake.url, retry=FAST_RETRY) as c:
        info = await c.info()
    assert info[0].node_id == "d"
    assert fake.paths() == ["GET /v1/info"] * 3


async def test_retry_after_is_respected(fake: FakeBroker) -> None:
    fake.script.append(err(429, "backpressure", headers={"Retry-After": "0.3"}))
    async with AsyncClient(fake.url, retry=FAST_RETRY) as c:
        await c.stats()
    first, second = fake.requests
    assert second.at - first.at >= 0.29  # the policy alone would have waited <= 20 ms


async def test_gives_up_after_the_attempts(fake: FakeBroker) -> None:
    fake.script += [err(503, "unavailable")] * 10
    async with AsyncClient(fake.url, retry=FAST_RETRY) as c:
        with pytest.raises(Unavailable):
            await c.cancel("d-1")
    assert len(fake.requests) == FAST_RETRY.attempts


async def test_unkeyed_produce_is_not_retried_on_503(fake: FakeBroker) -> None:
    fake.script.append(err(503, "unavailable"))
    async with AsyncClient(fake.url, retry=FAST_RETRY) as c:
        with pytest.raises(Unavailable):
            await c.send("t", b"x")
        with pytest.raises(Unavailable):
            fake.script.append(err(503, "unavailable"))
            await c.send_batch("t", [{"body": "a", "key": "k1"}, {"body": "b"}])  # one unkeyed is enough
    assert len(fake.requests) == 2
    assert not fake.messages


async def test_keyed_produce_is_retried_and_stays_single(fake: FakeBroker) -> None:
    fake.script += [err(503, "unavailable")]
    async with AsyncClient(fake.url, retry=FAST_RETRY) as c:
        r = await c.send_batch("t", [{"body": "a", "key": "k1"}, {"body": "b", "key": "k2"}])
    assert [x.duplicate for x in r] == [False, False]
    assert len(fake.requests) == 2 and len(fake.messages) == 2


async def test_unkeyed_produce_is_retried_on_backpressure(fake: FakeBroker) -> None:
    # 429 means the broker refused the whole batch: nothing was stored, a retry cannot duplicate.
    fake.script.append(err(429, "backpressure", headers={"Retry-After": "0"}))
    async with AsyncClient(fake.url, retry=FAST_RETRY) as c:
        await c.send("t", "x")
    assert len(fake.requests) == 2 and len(fake.messages) == 1


async def test_backpressure_is_raised_when_attempts_run_out(fake: FakeBroker) -> None:
    fake.script += [err(429, "backpressure", headers={"Retry-After": "0"})] * 3
    async with AsyncClient(fake.url, retry=RetryPolicy(attempts=3, base_delay_ms=1, max_delay_ms=2)) as c:
        with pytest.raises(Backpressure) as info:
            await c.send("t", "x")
    assert info.value.retry_after == 0.0 and info.value.status == 429


async def test_connection_refused_is_retried_then_raised() -> None:
    port = free_port()  # nothing listens there
    async with AsyncClient(f"http://127.0.0.1:{port}", retry=FAST_RETRY) as c:
        with pytest.raises(ConnectionFailed) as info:
            await c.send("t", "x")
    assert info.value.sent is False and info.value.status == 0


async def test_connection_refused_then_up(fake: FakeBroker) -> None:
    """The broker comes up while the client is backing off; even an unkeyed send gets through."""
    port = free_port()
    late = FakeBroker("late")
    attempts = []

    class StartOnSecondTry(RetryPolicy):
        def delay_s(self, retry_number: int, retry_after_s: float | None = None,
                    rng: random.Random | None = None) -> float:
            attempts.append(retry_number)
            if retry_number == 1:
                late.start(port)
            return 0.001

    try:
        async with AsyncClient(f"http://127.0.0.1:{port}", retry=StartOnSecondTry(attempts=3)) as c:
            r = await c.send("t", "x")
        assert r.id.startswith("late-") and attempts == [1]
    finally:
        late.stop()


def test_backoff_grows_with_jitter_and_honours_retry_after() -> None:
    p = RetryPolicy(base_delay_ms=100, max_delay_ms=1000, max_retry_after_ms=5000)
    rng = random.Random(7)
    for n, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (9, 1.0)]:
        samples = [p.delay_s(n, rng=rng) for _ in range(200)]
        assert all(ceiling / 2 <= s <= ceiling for s in samples)
        assert max(samples) - min(samples) > ceiling / 4  # actually jittered
    assert p.delay_s(1, 2.0, rng) == 2.0
    assert p.delay_s(1, 60.0, rng) == 5.0  # capped
    assert parse_retry_after("3") == 3.0 and parse_retry_after("0.5") == 0.5
    assert parse_retry_after(None) is None and parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") is None


async def test_auth_header_and_encodings(fake: FakeBroker) -> None:
    async with AsyncClient(fake.url, token="sekrit") as c:
        await c.send("t", b"\xffbin")
        await c.get("d-1")
    async with AsyncClient(fake.url, encoding="json") as c:
        await c.send("t", b"\xffbin")
        got = await c.get("d-2")
    assert got.body == b"\xffbin"
    produce, get, produce_json, get_json = fake.requests
    assert produce.headers["Authorization"] == "Bearer sekrit"
    assert produce.content_type == "application/msgpack" and produce.body["messages"][0]["body"] == b"\xffbin"
    assert get.accept == "application/msgpack" and get.body is None
    assert "Authorization" not in produce_json.headers
    assert produce_json.content_type == "application/json"
    assert produce_json.body["messages"][0]["body_b64"] == "/2Jpbg=="
    assert get_json.accept == "application/json"


async def test_path_segments_are_escaped(fake: FakeBroker) -> None:
    async with AsyncClient(fake.url) as c:
        await c.send("t", "x", key="a/b c?%")
        m = await c.get_key("t", "a/b c?%")
        assert m.key == "a/b c?%"
    assert fake.requests[1].path == "/v1/topics/t/keys/a%2Fb%20c%3F%25"
