"""bench.produce_loop_bench, small: its rounds and the CPU of each part of a keyed produce."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from bench import produce_loop_bench as plb


def test_the_parts_of_a_keyed_produce_are_timed_and_put_back() -> None:
    originals = [getattr(owner, name) for owner, name, _, _ in plb.PARTS]
    parts: dict[tuple[str, str], list[float]] = defaultdict(list)
    us = asyncio.run(plb.run(rounds=1, batches=2, parts=parts))
    assert [len(us[k]) for k in ("keyless", "keyed")] == [1, 1] and min(us["keyless"] + us["keyed"]) > 0
    labels = [label for _, _, label, _ in plb.PARTS] + ["rest"]
    assert set(parts) == {(kind, label) for kind in ("keyless", "keyed") for label in labels}
    ns = {key: v[0] for key, v in parts.items()}
    for label in labels:  # every part ran for keyed messages; the key's own parts never for keyless ones
        assert ns[("keyed", label)] > 0, label
    for _, name, label, _ in plb.PARTS:
        if name in ("claim_many", "claim", "put_run", "put", "_keyed"):
            assert ns[("keyless", label)] == 0, label
    for kind in ("keyless", "keyed"):  # a part includes the parts under it
        total = us[kind][0] * 1e3
        top = sum(ns[(kind, label)] for _, _, label, depth in plb.PARTS if depth == 0)
        assert abs(top + ns[(kind, "rest")] - total) < 1, kind
        assert ns[(kind, plb.PARTS[2][2])] <= ns[(kind, plb.PARTS[1][2])]
        assert ns[(kind, plb.PARTS[6][2])] <= ns[(kind, plb.PARTS[5][2])] <= ns[(kind, plb.PARTS[4][2])]
    assert [getattr(owner, name) for owner, name, _, _ in plb.PARTS] == originals
