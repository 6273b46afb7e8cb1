"""Retention: delete the segments nothing needs any more (mixed into storage.store.Store)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from delayd.storage.msgtable import MessageState
from delayd.storage.timerlog import UNIT_SIZE

if TYPE_CHECKING:
    from delayd.storage.store import Store

RETENTION_MARGIN_MS = 1000  # slack on top of the reader's lead, for retention horizons


def retain(store: Store, now_ms: int, retention_ms: int, needed: dict[str, int]) -> dict[str, int]:
    """Delete every segment nothing needs any more; returns what was deleted per kind.

    `needed`: per topic, the lowest ready-queue index a consumer group still needs (its
    ack floor, or a dead letter's index); topics without groups are kept for
    `retention_ms` after release only. Nothing is deleted that a recovery from the last
    checkpoint would read.

    Commit log and TimerLog need no per-message bookkeeping: a segment fully indexed at
    time τ holds nothing pending once the durable read time passes τ + roll window —
    whatever was due later than that rolled forward into a newer segment (RIP-43), so a
    far-future message never pins an old segment.
    """
    gone = {"ready": 0, "commit": 0, "timerlog": 0, "msgtable": 0}
    # A unit fires at most roll window + the reader's lead (lookahead + a slot) after it
    # was written; the margin covers that lead with room to spare.
    horizon = store.read_time_ms - store.cfg.roll_window_ms - store.cfg.lookahead_ms - 2 * store.cfg.precision_ms \
        - RETENTION_MARGIN_MS
    low = min(store.durable_indexed, store.keys.commit_pos, store.far.commit_pos)
    for topic, q in store.ready.items():
        keep_from = None
        for first, end, lo, released in q.segments():
            if keep_from is None and end <= needed.get(topic, end) and released < now_ms - retention_ms \
                    and end < q.end:
                continue
            keep_from = first if keep_from is None else keep_from
            low = min(low, lo)
        if keep_from:
            gone["ready"] += len(q.delete_before(keep_from))
    for base in store.commit.files.bases[:-1]:
        t = store.indexed_at.get(base)
        if t is None or t > horizon:
            low = min(low, base)
            break
    deleted = store.commit.delete_before(low)
    for base in deleted:
        store.indexed_at.pop(base, None)
    gone["commit"] = len(deleted)
    tl = store.timers.log
    for base in tl.files.bases[:-1]:
        end = tl.files.segment_end(base)
        if end > store.timers.log.end or end <= base:
            break
        last = tl.read(end - UNIT_SIZE)
        if last.enqueue_time > horizon:
            break
        gone["timerlog"] += len(tl.delete_before(end))
    gone["msgtable"] = _retain_msgtable(store, low)
    return gone


def _retain_msgtable(store: Store, low: int, scans: int = 2) -> int:
    """Drop message-table segments whose messages are all final and whose records are
    gone (below `low`); an id older than that answers 404. Segments are independent, so
    a long-pending message pins only its own: it is remembered and the segment skipped
    until that message is final. At most `scans` segments are read per round."""
    n = 0
    for seg in sorted(store.msgs.segments()):
        if (seg + 1) * store.msgs.segment_entries > store.next_seq or scans <= 0:
            break
        pin = store._msgtable_pins.get(seg)
        if pin is not None and store.msgs.get(pin)[0] == MessageState.SCHEDULED:
            continue
        scans -= 1
        why = store.msgs.blocker(seg, low)
        if why is None:
            store._msgtable_pins.pop(seg, None)
            n += store.msgs.delete_segment(seg)
        elif why[0] == "pending":
            store._msgtable_pins[seg] = why[1]
        else:
            break  # records still needed here are needed in every newer segment too
    return n
