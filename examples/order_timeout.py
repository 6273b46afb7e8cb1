"""Close unpaid orders after a timeout - the classic delay-queue job.

Every order placed schedules a "close if unpaid" message keyed by the order id. Paying cancels that
message by key, so it is never delivered. A consumer closes the orders whose message comes due.

Run a daemon (`make run`), then:

    .venv/bin/python examples/order_timeout.py            # 12 orders, 3 s timeout
    .venv/bin/python examples/order_timeout.py --orders 50 --timeout-ms 5000 --url http://127.0.0.1:7070

It finishes by itself once every unpaid order is closed (a few seconds), and exits 1 if anything went
wrong: a paid order closed, or an unpaid one not closed within the deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import sys
import time

from delayd.client import AlreadyDelivered, AsyncClient, AsyncConsumer, ReceivedMessage

TOPIC = "example.order-timeout"
GROUP = "order-closer"


class Shop:
    """The application's state: in real life, a database."""

    def __init__(self, run: str) -> None:
        self.run = run
        self.status: dict[str, str] = {}  # order id -> placed / paid / closed
        self.closed_paid: list[str] = []   # must stay empty
        self.timeouts: dict[str, str] = {}  # order id -> id of its timeout message

    def close_if_unpaid(self, order_id: str) -> None:
        if self.status.get(order_id) == "paid":
            self.closed_paid.append(order_id)  # would be a bug: payment cancels the timeout
            return
        self.status[order_id] = "closed"

    def open_unpaid(self) -> list[str]:
        return [o for o, s in self.status.items() if s == "placed"]


async def place_and_pay(client: AsyncClient, shop: Shop, orders: int, timeout_ms: int) -> None:
    for n in range(orders):
        order_id = f"{shop.run}-{n:03d}"
        sent = await client.send(TOPIC, json.dumps({"order": order_id, "amount": random.randint(5, 500)}),
                                 delay_ms=timeout_ms, key=order_id, headers={"run": shop.run})
        shop.status[order_id] = "placed"
        shop.timeouts[order_id] = sent.id
    print(f"placed {orders} orders; each closes after {timeout_ms} ms unless paid")

    # About half the customers pay, at some point before their order times out.
    payers = random.sample(sorted(shop.status), k=orders // 2)
    for order_id in payers:
        await asyncio.sleep(random.uniform(0, timeout_ms / 1000 / 3 / len(payers)))
        try:
            await client.cancel_key(TOPIC, order_id)
        except AlreadyDelivered:
            # Too late: the close is already under way. A real shop would refund or reopen here.
            print(f"  {order_id}: paid too late, timeout already firing")
            continue
        shop.status[order_id] = "paid"
    print(f"{len(payers)} orders paid; their timeouts are cancelled")


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=os.environ.get("DELAYD_URL", "http://127.0.0.1:7070"))
    ap.add_argument("--token", default=os.environ.get("DELAYD_TOKEN"))
    ap.add_argument("--orders", type=int, default=12)
    ap.add_argument("--timeout-ms", type=int, default=3_000)
    ap.add_argument("--deadline-s", type=float, default=45.0, help="give up after this long")
    args = ap.parse_args()

    shop = Shop(run=secrets.token_hex(3))
    started = time.monotonic()

    async def close_order(m: ReceivedMessage) -> None:
        if m.headers.get("run") != shop.run:
            return  # left over from an earlier run of this example: acknowledge and move on
        order = json.loads(m.body)
        lateness = int(time.time() * 1000) - m.deliver_at
        shop.close_if_unpaid(order["order"])
        print(f"  closed {order['order']} (attempt {m.attempt}, {lateness} ms after due)")
        if not shop.open_unpaid():
            consumer.stop()

    async with AsyncClient(args.url, args.token) as client:
        await client.subscribe(TOPIC, GROUP)
        consumer = AsyncConsumer(client, TOPIC, GROUP, close_order, concurrency=8, wait_ms=500)
        consumer.start()
        try:
            await place_and_pay(client, shop, args.orders, args.timeout_ms)
            if not shop.open_unpaid():
                consumer.stop()
            await asyncio.wait_for(consumer.join(), args.deadline_s)
        except TimeoutError:
            consumer.stop()
            await consumer.join()
        # Payment cancelled these timeouts; the broker guarantees they are never delivered.
        paid = [o for o, s in shop.status.items() if s == "paid"]
        not_cancelled = [o for o in paid if (await client.get(shop.timeouts[o])).state != "cancelled"]

    closed = [o for o, s in shop.status.items() if s == "closed"]
    print(f"done in {time.monotonic() - started:.1f}s: {len(closed)} closed, {len(paid)} paid, "
          f"{len(shop.open_unpaid())} still open, {len(shop.closed_paid)} paid-but-closed")
    if not_cancelled:
        print(f"paid orders whose timeout is not cancelled: {not_cancelled}")
    return 0 if not shop.open_unpaid() and not shop.closed_paid and not not_cancelled else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
