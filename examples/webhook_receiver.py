"""Receive delayd push deliveries: verify the signature, skip duplicates, do the work, answer 2xx.

Start it (the secret is shared with the subscription; any 16-256 bytes):

    .venv/bin/python examples/webhook_receiver.py --port 8080 --secret "$SECRET"

and make a subscription push to it, with the SDK (`--subscribe` does exactly this for you):

    Client("http://127.0.0.1:7070").subscribe("orders", "closer",
        push=PushSettings("http://127.0.0.1:8080/delayd", secret=SECRET))

or with curl:

    curl -XPUT localhost:7070/v1/topics/orders/subscriptions/closer -H 'Content-Type: application/json' \\
         -d '{"push": {"url": "http://127.0.0.1:8080/delayd", "secret": "'"$SECRET"'"}}'

Every verified message is printed as one JSON line. A request whose signature does not verify (a
wrong secret, a changed body, or a timestamp more than 5 minutes off: a replay) is answered 401, so
delayd retries it with backoff and finally dead-letters it. Delivery is at-least-once: the same
message can arrive again (a retry after a lost answer, a daemon restart), so the handler remembers
the ids it has handled and acknowledges a repeat without doing the work twice.
See docs/push.md for the scheme.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import signal
import sys
import time
from collections import OrderedDict
from typing import Any

import msgpack
from aiohttp import web

TOLERANCE_MS = 5 * 60 * 1000  # how far the signed timestamp may be from now (clock skew + replay window)
SEEN_MAX = 100_000  # ids remembered for de-duplication (a real service keeps them in its database)


class InvalidSignature(Exception):
    pass


def verify(secret: bytes, header: str | None, body: bytes, now_ms: int, tolerance_ms: int = TOLERANCE_MS) -> int:
    """Check `Delayd-Signature: t=<ms>,v1=<hex>` over the raw body; return the signed timestamp.

    The signed bytes are the timestamp, a dot, and the body exactly as received (do not re-encode
    the JSON first). Several v1= entries may appear; any one matching is enough."""
    if not header:
        raise InvalidSignature("no Delayd-Signature header")
    fields: dict[str, list[str]] = {}
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        fields.setdefault(name, []).append(value)
    try:
        t = int(fields["t"][0])
    except (KeyError, ValueError):
        raise InvalidSignature("no timestamp in Delayd-Signature") from None
    if abs(now_ms - t) > tolerance_ms:
        raise InvalidSignature(f"timestamp {t} is more than {tolerance_ms} ms from now: a replay?")
    expected = hmac.new(secret, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    if not any(hmac.compare_digest(expected, v) for v in fields.get("v1", [])):
        raise InvalidSignature("signature does not match")
    return t


def decode(content_type: str, body: bytes) -> dict[str, Any]:
    if content_type == "application/msgpack":
        return dict(msgpack.unpackb(body, raw=False))
    return dict(json.loads(body))


def out(line: dict[str, Any]) -> None:
    print(json.dumps(line), flush=True)


def make_app(secret: bytes) -> web.Application:
    seen: OrderedDict[str, None] = OrderedDict()

    async def receive(request: web.Request) -> web.Response:
        body = await request.read()  # the raw bytes: the signature is over exactly these
        try:
            verify(secret, request.headers.get("Delayd-Signature"), body, int(time.time() * 1000))
        except InvalidSignature as e:
            out({"rejected": str(e), "id": request.headers.get("Delayd-Id")})
            return web.json_response({"error": str(e)}, status=401)
        msg = decode(request.content_type, body)  # signed: trust these fields, not the headers
        key = f"{msg['topic']}/{msg['group']}/{msg['id']}"
        duplicate = key in seen
        if not duplicate:
            handle(msg)
            seen[key] = None
            if len(seen) > SEEN_MAX:
                seen.popitem(last=False)
        out({"id": msg["id"], "topic": msg["topic"], "group": msg["group"], "attempt": msg["attempt"],
             "deliver_at": msg["deliver_at"], "duplicate": duplicate,
             "body": msg["body"].decode(errors="replace") if isinstance(msg.get("body"), bytes) else
             msg.get("body", msg.get("body_b64"))})
        return web.Response(status=204)  # any 2xx acknowledges

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/{tail:.*}", receive)
    return app


def handle(msg: dict[str, Any]) -> None:
    """The work a due message asks for (here: nothing beyond the printed line)."""


async def subscribe(delayd_url: str, topic: str, group: str, url: str, secret: str) -> None:
    from delayd.client import AsyncClient, PushSettings
    async with AsyncClient(delayd_url) as c:
        sub = await c.subscribe(topic, group, push=PushSettings(url, secret=secret))
        assert sub.push is not None
        out({"subscribed": f"{topic}/{group}", "url": sub.push.url, "secret": sub.push.secret_fingerprint})


async def serve(args: argparse.Namespace) -> None:
    runner = web.AppRunner(make_app(args.secret.encode()), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    url = f"http://{args.host}:{args.port}/delayd"
    out({"listening": url})
    try:
        if args.subscribe:  # only now: the daemon may push at once
            await subscribe(args.subscribe, args.topic, args.group, url, args.secret)
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--secret", default=os.environ.get("DELAYD_PUSH_SECRET"),
                    help="the subscription's secret (default: $DELAYD_PUSH_SECRET)")
    ap.add_argument("--subscribe", metavar="DELAYD_URL", help="also make TOPIC/GROUP push here, e.g. "
                    "http://127.0.0.1:7070")
    ap.add_argument("--topic", default="orders")
    ap.add_argument("--group", default="webhook")
    args = ap.parse_args()
    if not args.secret:
        ap.error("a secret is required (--secret or $DELAYD_PUSH_SECRET)")
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
