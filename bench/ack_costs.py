"""Per-receipt cost of reading an ack's body, in process: the msgpack body of one pull's 1,000
receipts, as a consumer sends it.

    .venv/bin/python -m bench.ack_costs

Prints nanoseconds a receipt for: decoding the body as every control body is decoded (msgpack
with the depth and element hooks, the field and list checks), `parse_receipts` of the decoded
receipts, and, where the batch core has it, `parse_receipts_raw` of the body as it arrived (what
a msgpack ack of one pull's receipts costs now, instead of the first two). Best of `--rounds`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import msgpack
from delayd.broker import bodies, codec
from delayd.storage import batch


def best_ns(f: Callable[[], Any], n: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(200):
            f()
        best = min(best, (time.perf_counter() - t) / 200 / n * 1e9)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--receipts", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    n = args.receipts
    receipts = [f"d-{100_000 + i:x}.{5_000 + i:x}.9f3a2b41" for i in range(n)]
    raw = bytearray(msgpack.packb({"receipts": receipts}))

    def decode() -> Any:
        body = codec.only(codec.obj(bodies.control(raw, codec.MSGPACK)), {"receipts"})
        return codec.str_list(body, "receipts", required=True)

    print(f"decode the body, check it:   {best_ns(decode, n, args.rounds):6.1f} ns a receipt")
    print(f"parse_receipts (str list):   {best_ns(lambda: batch.ops.parse_receipts(receipts), n, args.rounds):6.1f} ns a receipt")
    if hasattr(batch.ops, "parse_receipts_raw"):
        raw_ns = best_ns(lambda: batch.ops.parse_receipts_raw(raw, bodies.CONTROL_LIST), n, args.rounds)
        print(f"parse_receipts_raw (body):   {raw_ns:6.1f} ns a receipt")


if __name__ == "__main__":
    main()
