"""Every topic's ready queue, with a bounded number of them open at once.

A daemon may serve thousands of topics; one open file per topic, forever, runs it out of
descriptors (and a restart under the same limit then fails the same way). So queues are opened
on demand and closed again by an LRU bound (`max_open`, the `ready_queue_open_files` setting),
and what the rest of the broker asks most — where a queue starts and ends — is answered from
memory without opening anything. Startup lists the directories and reads each queue's last
segment header and size (one short-lived descriptor at a time).

A topic that was never released to has no queue: reading it answers nothing and creates
nothing (a pull on an unknown topic leaves no file or directory behind); only a release
creates a queue.

A queue closed while it holds unsynced writes is remembered by path, and the next checkpoint
fsyncs those files by opening them again (fsync flushes a file's dirty pages whichever
descriptor asks).
"""

from __future__ import annotations

import collections
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from delayd.storage.readyqueue import READY_FORMAT, UNIT, UNIT_SIZE, ReadyQueue, ReadyUnit, unit_bounds
from delayd.storage.segments import list_segments, open_fd, read_header, segment_name

DEFAULT_MAX_OPEN = 256
NO_LOW = 1 << 62  # an empty queue pins nothing
PIN_BLOCK = 4096  # units a block of what a queue pins (`pin`), or a segment's when fewer


@dataclass(slots=True)
class QueueView:
    """One topic's queue as the consumer groups see it: bounds and reads, opening the files
    only to read (and never creating them)."""
    queues: ReadyQueues
    topic: str

    @property
    def start(self) -> int:
        return self.queues.start(self.topic)

    @property
    def end(self) -> int:
        return self.queues.end(self.topic)

    def read(self, first: int, count: int) -> list[ReadyUnit]:
        return self.queues.read(self.topic, first, count)

    def read_packed(self, first: int, count: int) -> tuple[int, bytes]:
        return self.queues.read_packed(self.topic, first, count)


class ReadyQueues:
    def __init__(self, directory: Path, segment_units: int, max_open: int = DEFAULT_MAX_OPEN) -> None:
        self.directory = Path(directory)
        self.segment_units = segment_units
        self.max_open = max(1, max_open)
        # Blocks tile each segment from its first unit (the last of a segment is shorter when
        # `block` does not divide `segment_units`), so a segment's figures are its blocks'.
        self.block = min(PIN_BLOCK, segment_units)
        self._per_segment = -(-segment_units // self.block)
        self._open: collections.OrderedDict[str, ReadyQueue] = collections.OrderedDict()
        self._bounds: dict[str, tuple[int, int]] = {}  # topic -> (start, end) unit indexes
        # topic -> block (`_block`) -> (lowest commit offset, latest release) of its units
        self._blocks: dict[str, dict[int, tuple[int, int]]] = {}
        self._unsynced: set[Path] = set()  # segment files of closed queues written since the last fsync
        try:
            names = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            names = []
        for topic in names:
            bases = list_segments(self.directory / topic)
            if bases:
                last = bases[-1]
                _hdr, data = read_header(READY_FORMAT, self.directory / topic / segment_name(last), last)
                self._bounds[topic] = (bases[0] // UNIT_SIZE, (last + data) // UNIT_SIZE)

    # -- bounds (no files opened) ---------------------------------------------------------------
    def topics(self) -> list[str]:
        return sorted(self._bounds)

    def __contains__(self, topic: str) -> bool:
        return topic in self._bounds

    def start(self, topic: str) -> int:
        return self._bounds.get(topic, (0, 0))[0]

    def end(self, topic: str) -> int:
        return self._bounds.get(topic, (0, 0))[1]

    def ends(self) -> dict[str, int]:
        return {t: e for t, (_s, e) in self._bounds.items()}

    def view(self, topic: str) -> QueueView:
        return QueueView(self, topic)

    def single_segment(self, topic: str) -> bool:
        """Whether the topic's queue is one segment (so retention has nothing to delete there).
        From the bounds alone: segments fill to `segment_units` before the next one starts."""
        start, end = self._bounds.get(topic, (0, 0))
        return end <= start or (end - 1) // self.segment_units == start // self.segment_units

    # -- what the units pin (no files opened once learnt) ---------------------------------------
    def pin(self, topic: str, floor: int, cutoff_ms: int) -> int:
        """The lowest commit-log offset the topic's units still need (what they pin of the commit
        log): that of every block of `block` units holding a unit at or past `floor` (which a
        consumer group has not acked, a dead letter included) or released at `cutoff_ms` or
        later. The units of the other blocks stay in the queue until their segment goes, but
        their records need not: a queue whose segment never fills (a topic gone quiet) must not
        keep the whole log."""
        unsettled = self._block(floor) if floor < self.end(topic) else None  # (it and every later block)
        return min((lo for b, (lo, hi) in self._learnt(topic).items()
                    if hi >= cutoff_ms or (unsettled is not None and b >= unsettled)), default=NO_LOW)

    def earliest(self, topic: str, commit_start: int) -> int:
        """The first unit whose record is still in the log (which starts at `commit_start`) with
        none gone after it: where a new group starting at the earliest begins. Units before it
        were settled by every group and released before the cutoff (`pin`)."""
        start, end = self._bounds.get(topic, (0, 0))
        last = max((b for b, (lo, _hi) in self._learnt(topic).items() if lo < commit_start), default=None)
        if last is None:
            return start
        first, stop = self._span(last)
        first = max(start, first)
        after = first  # past the last unit of that block whose record is gone
        for u in self.scan(topic, first):
            if u.index >= stop:
                break
            if u.commit_offset < commit_start:
                after = u.index + 1
        return min(max(after, start), end)

    def _learnt(self, topic: str) -> dict[int, tuple[int, int]]:
        """The topic's blocks: learnt once from the files, then kept up to date by appends."""
        blocks = self._blocks.get(topic)
        if blocks is None:
            blocks = {}
            idx = self.start(topic)
            while True:
                first, units = self.read_packed(topic, idx, self._span(self._block(idx))[1] - idx)
                if not units:
                    break
                self._note(blocks, first, units)
                idx = first + len(units) // UNIT_SIZE
            self._blocks[topic] = blocks
        return blocks

    def _block(self, index: int) -> int:
        """The block of unit `index`."""
        seg, at = divmod(index, self.segment_units)
        return seg * self._per_segment + at // self.block

    def _span(self, block: int) -> tuple[int, int]:
        """The first unit index of `block` and the one past its last."""
        seg, k = divmod(block, self._per_segment)
        first = seg * self.segment_units + k * self.block
        return first, min(first + self.block, (seg + 1) * self.segment_units)

    def _note(self, blocks: dict[int, tuple[int, int]], first: int, units: bytes) -> None:
        """Fold packed units, the first at index `first`, into the figures of their blocks."""
        view = memoryview(units)
        i, n = 0, len(units) // UNIT_SIZE
        while i < n:
            b = self._block(first + i)
            j = min(n, self._span(b)[1] - first)
            lo, hi = unit_bounds(view[i * UNIT_SIZE:j * UNIT_SIZE])
            had = blocks.get(b)
            blocks[b] = (lo, hi) if had is None else (min(had[0], lo), max(had[1], hi))
            i = j

    # -- the LRU of open queues -----------------------------------------------------------------
    def _queue(self, topic: str, create: bool = False) -> ReadyQueue | None:
        q = self._open.get(topic)
        if q is not None:
            self._open.move_to_end(topic)
            return q
        if topic not in self._bounds and not create:
            return None
        while len(self._open) >= self.max_open:
            self._close_oldest()
        q = ReadyQueue(self.directory / topic, self.segment_units)
        self._open[topic] = q
        self._bounds[topic] = (q.start, q.end)
        return q

    def _close_oldest(self) -> None:
        _topic, q = self._open.popitem(last=False)
        if q.files.has_dirty():
            self._unsynced.update(q.files.dirty_paths())
        q.files.close(sync=False)

    # -- reading --------------------------------------------------------------------------------
    def read(self, topic: str, first: int, count: int) -> list[ReadyUnit]:
        """Up to `count` units from index `first` (nothing for a topic without a queue)."""
        lo, hi = self._bounds.get(topic, (0, 0))
        if max(first, lo) >= hi or count <= 0:
            return []
        q = self._queue(topic)
        return q.read(first, count) if q is not None else []

    def read_packed(self, topic: str, first: int, count: int) -> tuple[int, bytes]:
        """ReadyQueue.read_packed of the topic's queue ((first, b"") for a topic without one)."""
        lo, hi = self._bounds.get(topic, (0, 0))
        if max(first, lo) >= hi or count <= 0:
            return max(first, lo), b""
        q = self._queue(topic)
        return q.read_packed(first, count) if q is not None else (first, b"")

    def scan(self, topic: str, first: int) -> Iterator[ReadyUnit]:
        idx = first
        while True:
            batch = self.read(topic, idx, 8192)
            if not batch:
                return
            yield from batch
            idx = batch[-1].index + 1

    def segments(self, topic: str) -> Iterator[tuple[int, int, int, int]]:
        """(first index, end index, lowest commit offset, latest release) of each segment of the
        topic's queue that holds units, oldest first: what retention decides a segment's
        deletion by, from the blocks, computed as asked (retention stops at the first segment it
        keeps). A block across two segments (their size was changed between runs) counts in
        both."""
        q = self._queue(topic)
        if q is None:
            return
        blocks = self._learnt(topic)
        for base in q.files.bases:
            first, end = base // UNIT_SIZE, q.files.segment_end(base) // UNIT_SIZE
            if end > first:
                held = [blocks[b] for b in range(self._block(first), self._block(end - 1) + 1) if b in blocks]
                yield (first, end, min((lo for lo, _hi in held), default=NO_LOW),
                       max((hi for _lo, hi in held), default=0))

    # -- writing --------------------------------------------------------------------------------
    def append(self, topic: str, units: list[tuple[int, int, int, int, int, int]]) -> int:
        """Append units to `topic`'s queue (created on the first release); the first's index."""
        return self.append_units(topic, b"".join(UNIT.pack(*u) for u in units))

    def append_units(self, topic: str, units: bytes) -> int:
        """Append packed units (storage.readyqueue.UNIT) to `topic`'s queue (created on the first
        release); the first's index."""
        q = self._queue(topic, create=True)
        assert q is not None
        try:
            first = q.append_packed(units)
        finally:
            self._bounds[topic] = (q.start, q.end)
        blocks = self._blocks.get(topic)
        if blocks is not None:
            self._note(blocks, first, units)
        return first

    def truncate(self, topic: str, index: int) -> int:
        """Drop the units of `topic` at and after `index` (a cut of the commit log took their
        RELEASE records); how many went."""
        q = self._queue(topic)
        if q is None or index >= q.end:
            return 0
        try:
            return q.truncate(max(index, q.start))
        finally:
            self._bounds[topic] = (q.start, q.end)
            self._blocks.pop(topic, None)  # (learnt again from what is left, when next asked)

    def delete_before(self, topic: str, index: int) -> list[int]:
        q = self._queue(topic)
        if q is None:
            return []
        gone = q.delete_before(index)
        self._bounds[topic] = (q.start, q.end)
        blocks = self._blocks.get(topic)
        if gone and blocks is not None:
            kept = self._block(q.start)  # (the blocks before it end at or before the start)
            for b in [b for b in blocks if b < kept]:
                del blocks[b]
        self._unsynced -= {q.files.directory / segment_name(b) for b in gone}
        return gone

    # -- durability -----------------------------------------------------------------------------
    def dirty_handles(self) -> list[int]:
        """Duplicated fds of the open queues' segments written since the last call."""
        fds: list[int] = []
        for q in self._open.values():
            fds += q.files.dirty_handles()
        return fds

    def take_unsynced(self) -> list[Path]:
        """Files of closed queues that still need an fsync (see `fsync_paths`)."""
        paths, self._unsynced = sorted(self._unsynced), set()
        return paths

    def unsynced_again(self, paths: list[Path]) -> None:
        """The fsync of `take_unsynced`'s files failed: they are due next time."""
        self._unsynced.update(paths)

    def mark_all_dirty(self) -> None:
        for q in self._open.values():
            q.files.mark_all_dirty()

    def disk_bytes(self) -> int:
        """Bytes of units held (headers not counted): from memory, no file is opened."""
        return sum(e - s for s, e in self._bounds.values()) * UNIT_SIZE

    @property
    def open_count(self) -> int:
        return len(self._open)

    def close(self) -> None:
        while self._open:
            _topic, q = self._open.popitem(last=False)
            q.close()


def fsync_paths(paths: list[Path]) -> None:
    """fsync files by path, one descriptor at a time (a worker thread may run it). A file that
    is gone (retention) needs nothing."""
    for p in paths:
        try:
            fd = open_fd(p, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
