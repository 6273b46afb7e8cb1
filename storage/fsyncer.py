"""The group commit's fsyncs, off the event loop, without a hand-over of the GIL per fsync.

`Syncer` fsyncs lists of file descriptors in a thread of its own, and closes them:

    s = Syncer()          # starts the thread
    s.fileno()            # readable once a job has finished (an event loop watches it)
    s.submit([fd, ...])   # -> job id; the job owns the fds: fsynced in order, the first failure
                          #    ends the fsyncs (its errno is the job's), and every fd is closed
    s.done()              # -> [(job id, errno or 0), ...] of the jobs finished since the last call
    s.close()             # finishes the jobs submitted and stops the thread; idempotent

It comes twice, like the batch core's functions: compiled (storage/batch_sync.c), whose thread
never takes the GIL, and here in Python as the reference, whose thread does.
`tests/storage/test_fsyncer.py` checks that both give the same results. `Fsyncer` is what the
group commit awaits: `await sync(fds)` returns once they are fsynced, or raises the OSError of
the first that failed.

Why not a worker thread of the event loop's executor: each fsync then cost the loop's thread
the wake-up of that worker and two hand-overs of the GIL, one to start the job and one for the
worker to report its end, 70-80 µs of the loop's CPU on 2 cores against 10-17 µs for the fsync
itself (BENCHMARKS.md); and while the loop was busy, the worker waited for the GIL to report
(up to the interpreter's 5 ms switch interval) with the fsync long done.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import os
import threading
from collections.abc import Sequence
from typing import Any

from delayd.storage import native, segments

INT_MAX = 2**31 - 1
_FSYNC = os.fsync  # os.fsync as imported: the compiled Syncer calls fsync(2) itself


class Syncer:
    """The Python reference of the compiled Syncer (storage/batch_sync.c)."""

    def __init__(self) -> None:
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._rfd, False)
        os.set_blocking(self._wfd, False)
        self._cv = threading.Condition()
        self._todo: collections.deque[tuple[int, list[int]]] = collections.deque()
        self._done: list[tuple[int, int]] = []
        self._next = 0
        self._stopping = self._closed = False
        self._thread = threading.Thread(target=self._main, name="delayd-fsync", daemon=True)
        self._thread.start()

    def _usable(self) -> None:
        if self._closed:
            raise ValueError("Syncer: closed")

    def fileno(self) -> int:
        self._usable()
        return self._rfd

    def submit(self, fds: Sequence[int]) -> int:
        self._usable()
        if not isinstance(fds, (list, tuple)):
            raise TypeError("fds: expected a list or a tuple of ints")
        for i, fd in enumerate(fds):
            if not isinstance(fd, int):
                raise TypeError(f"fds[{i}]: expected an int")
            if not 0 <= fd <= INT_MAX:
                raise ValueError(f"fds[{i}]: {fd} is not a file descriptor")
        with self._cv:
            if self._stopping:  # close() under way in another thread: the thread may be gone
                raise ValueError("Syncer: closed")
            job, self._next = self._next, self._next + 1
            self._todo.append((job, [int(fd) for fd in fds]))
            self._cv.notify()
        return job

    def _main(self) -> None:
        while True:
            with self._cv:
                while not self._todo and not self._stopping:
                    self._cv.wait()
                if not self._todo:
                    return
                job, fds = self._todo.popleft()
            err = 0
            for fd in fds:
                if not err:
                    try:
                        os.fsync(fd)
                    except OSError as e:
                        err = e.errno or errno.EIO
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            with self._cv:
                self._done.append((job, err))
            with contextlib.suppress(BlockingIOError):  # full of unread bytes: one is enough
                os.write(self._wfd, b"\1")

    def done(self) -> list[tuple[int, int]]:
        self._usable()
        with contextlib.suppress(BlockingIOError):
            while os.read(self._rfd, 256):
                pass
        with self._cv:
            out, self._done = self._done, []
        return out

    def close(self) -> None:
        with self._cv:
            if self._closed or self._stopping:  # closed, or a close() in another thread
                return
            self._stopping = True
            self._cv.notify()
        self._thread.join()
        self._closed = True
        self._done = []
        os.close(self._rfd)
        os.close(self._wfd)


def new_syncer() -> Any:
    """The compiled Syncer; the reference where the batch core is not built (storage.native) or
    where os.fsync was replaced since this module was imported (a test that counts or fails
    fsyncs, or makes them no-ops): the reference calls os.fsync, the compiled one fsync(2)."""
    compiled = native.compiled()
    if compiled is None or os.fsync is not _FSYNC:
        return Syncer()
    return compiled.Syncer()


class Fsyncer:
    """`await sync(fds)`: fsync and close duplicated descriptors in a Syncer's thread. `start` on
    the running loop (which then watches the Syncer's fileno; the group commit starts it when it
    starts, while descriptors are to be had: a Syncer holds a pipe), or the first `sync` does;
    stopped by `close`."""

    def __init__(self) -> None:
        self._syncer: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: dict[int, asyncio.Future[None]] = {}

    async def sync(self, fds: list[int]) -> None:
        """Raises the OSError of the first fd that failed (all of them are closed either way)."""
        try:
            segments.FAULTS.check_fsync()  # the tests' injected failure, as fsync_all has it
            if self._syncer is None:
                self.start()
            assert self._loop is not None
            job = self._syncer.submit(fds)
        except BaseException:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise
        fut = self._loop.create_future()
        self._waiting[job] = fut
        await fut

    def start(self) -> None:
        if self._syncer is not None:
            return
        loop = asyncio.get_running_loop()
        syncer = new_syncer()
        try:
            loop.add_reader(syncer.fileno(), self._finished)
        except BaseException:
            syncer.close()
            raise
        self._syncer, self._loop = syncer, loop

    def _finished(self) -> None:
        for job, err in self._syncer.done():
            fut = self._waiting.pop(job, None)
            if fut is None or fut.done():  # its waiter was cancelled
                continue
            if err:
                fut.set_exception(OSError(err, os.strerror(err)))
            else:
                fut.set_result(None)

    def close(self) -> None:
        """Finish the fsyncs under way (their fds are closed) and stop the thread. Idempotent."""
        syncer, self._syncer = self._syncer, None
        if syncer is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(syncer.fileno())
        syncer.close()
        for fut in self._waiting.values():
            if not fut.done():
                fut.cancel()
        self._waiting.clear()
