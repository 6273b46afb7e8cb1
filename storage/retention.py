"""Retention: delete the segments nothing needs any more.

Commit log and TimerLog need no per-message bookkeeping: a segment fully indexed at time τ
holds nothing pending once the durable read time passes τ + roll window — whatever was due
later than that rolled forward into a newer segment (RIP-43), so a far-future message never
pins an old segment. `indexed_at` (kept here, saved in the checkpoint) says when each commit
segment was first covered by a checkpoint. Ready-queue units pin their records while a group
has not acked them (dead letters included) or `retention_ms` has not passed since release
(ReadyQueues.pin), also in a segment still being written. Message-table segments go when all
their messages are final and their records are gone; a long-pending message pins only its own
segment (`pins` remembers it, so the segment is not scanned again until that message is final).
"""

from __future__ import annotations

from delayd.storage.commitlog import CommitLog
from delayd.storage.farindex import FarIndex
from delayd.storage.keyindex import KeyIndex
from delayd.storage.msgtable import MessageState, MessageTable
from delayd.storage.readyqueues import ReadyQueues
from delayd.storage.timerindex import TimerIndex
from delayd.storage.timerlog import UNIT_SIZE

RETENTION_MARGIN_MS = 1000  # slack on top of the reader's lead, for retention horizons
MSGTABLE_SCANS = 2  # message-table segments read per round at most


class Retention:
    def __init__(self, *, roll_window_ms: int, lookahead_ms: int, precision_ms: int, commit: CommitLog,
                 timers: TimerIndex, msgs: MessageTable, ready: ReadyQueues, keys: KeyIndex, far: FarIndex,
                 indexed_at: dict[int, int] | None = None) -> None:
        self.roll_window_ms, self.lookahead_ms, self.precision_ms = roll_window_ms, lookahead_ms, precision_ms
        self.commit, self.timers, self.msgs, self.ready, self.keys = commit, timers, msgs, ready, keys
        self.far = far
        self.indexed_at: dict[int, int] = dict(indexed_at or {})  # commit segment base -> when a checkpoint covered it
        self.pins: dict[int, int] = {}  # msgtable segment -> a pending seq that pins it

    def covered(self, commit_indexed: int, created_ms: int) -> None:
        """A checkpoint taken at `created_ms` covers the log up to `commit_indexed`: closed
        segments wholly below it are indexed as of then."""
        files = self.commit.files
        bases = files.bases
        for base in bases[:-1]:
            if base not in self.indexed_at and files.segment_end(base) <= commit_indexed:
                self.indexed_at[base] = created_ms

    def retain(self, now_ms: int, retention_ms: int, needed: dict[str, int], *, read_time_ms: int,
               durable_indexed: int, next_seq: int) -> dict[str, int]:
        """Delete every segment nothing needs any more; returns what was deleted per kind.

        `needed`: per topic, the lowest ready-queue index a consumer group still needs (its
        ack floor, or a dead letter's index); topics without groups are kept for
        `retention_ms` after release only. Nothing is deleted that a recovery from the last
        checkpoint (durable read time `read_time_ms`, indexed offset `durable_indexed`) would read.
        """
        gone = {"ready": 0, "commit": 0, "timerlog": 0, "msgtable": 0}
        # A unit fires at most roll window + the reader's lead (lookahead + a slot) after it
        # was written; the margin covers that lead with room to spare.
        horizon = read_time_ms - self.roll_window_ms - self.lookahead_ms - 2 * self.precision_ms \
            - RETENTION_MARGIN_MS
        low = min(durable_indexed, self.keys.commit_pos, self.far.commit_pos)
        cutoff = now_ms - retention_ms
        for topic in self.ready.topics():
            end = self.ready.end(topic)
            floor = needed.get(topic, end)  # (a topic without groups: every unit settled)
            if not self.ready.single_segment(topic):  # (else nothing to delete: the segment being written stays)
                keep_from = None
                for first, seg_end, _lo, released in self.ready.segments(topic):
                    if seg_end <= floor and released < cutoff and seg_end < end:
                        continue
                    keep_from = first
                    break
                if keep_from:
                    gone["ready"] += len(self.ready.delete_before(topic, keep_from))
            # The units still needed pin their records; known from memory: a thousand quiet topics
            # open no file here.
            low = min(low, self.ready.pin(topic, floor, cutoff))
        for base in self.commit.files.bases[:-1]:
            t = self.indexed_at.get(base)
            if t is None or t > horizon:
                low = min(low, base)
                break
        deleted = self.commit.delete_before(low)
        for base in deleted:
            self.indexed_at.pop(base, None)
        gone["commit"] = len(deleted)
        tl = self.timers.log
        for base in tl.files.bases[:-1]:
            seg_end = tl.files.segment_end(base)
            if seg_end > tl.end or seg_end <= base:
                break
            if tl.read(seg_end - UNIT_SIZE).enqueue_time > horizon:
                break
            gone["timerlog"] += len(tl.delete_before(seg_end))
        gone["msgtable"] = self._retain_msgtable(low, next_seq)
        return gone

    def _retain_msgtable(self, low: int, next_seq: int) -> int:
        """Drop message-table segments whose messages are all final and whose records are
        gone (below `low`); an id older than that answers 404."""
        n, scans = 0, MSGTABLE_SCANS
        for seg in self.msgs.segments():
            if (seg + 1) * self.msgs.segment_entries > next_seq or scans <= 0:
                break
            pin = self.pins.get(seg)
            if pin is not None and self.msgs.get(pin)[0] == MessageState.SCHEDULED:
                continue
            scans -= 1
            why = self.msgs.blocker(seg, low)
            if why is None:
                self.pins.pop(seg, None)
                n += self.msgs.delete_segment(seg)
            elif why[0] == "pending":
                self.pins[seg] = why[1]
            else:
                break  # records still needed here are needed in every newer segment too
        return n
