"""The group commit's fsync thread (storage/fsyncer.py): the compiled Syncer against the Python
reference (same job ids, same errno a job, every fd closed, bad input refused with nothing taken),
and `Fsyncer`, what the group commit awaits. `make asan` runs this file with AddressSanitizer."""

from __future__ import annotations

import asyncio
import errno
import os
import select
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from delayd.storage import fsyncer, native, segments
from delayd.storage.fsyncer import Fsyncer, Syncer
from hypothesis import given, settings
from hypothesis import strategies as st

c = pytest.importorskip("delayd.storage._batch", reason="the compiled batch core is built by pip install")

IMPLS = {"compiled": lambda: c.Syncer(), "reference": Syncer}
NOT_OPEN = 1_000_000  # a descriptor number no test process has open: fsync says EBADF


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as e:
        assert e.errno == errno.EBADF
        return False
    return True


def wait_done(s: Any, jobs: int, timeout_s: float = 10.0) -> list[tuple[int, int]]:
    got: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < jobs:
        assert time.monotonic() < deadline, f"{len(got)} of {jobs} jobs finished"
        got += s.done()
        time.sleep(0.001)
    return got


@pytest.fixture
def opener(tmp_path: Path) -> Iterator[Callable[[str], int]]:
    """Descriptors of a kind: 'file' (fsync works), 'pipe' (fsync fails: EINVAL), 'none' (not open).
    They are for jobs, which close them; only the pipes' write ends are closed here (closing a
    number a job closed could close what the process opened since under that number)."""
    writers: list[int] = []
    path = tmp_path / "f"
    path.write_bytes(b"x")

    def make(kind: str) -> int:
        if kind == "file":
            return os.open(path, os.O_RDWR)
        if kind == "pipe":
            fd, w = os.pipe()
            writers.append(w)
            return fd
        return NOT_OPEN

    yield make
    for w in writers:
        os.close(w)


JOBS = st.lists(st.lists(st.sampled_from(["file", "pipe", "none"]), max_size=5), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(jobs=JOBS)
def test_compiled_jobs_match_the_reference(tmp_path_factory: Any, jobs: list[list[str]]) -> None:
    """Each job: fsynced in order, the first failure's errno is the job's (a later failure does not
    replace it), every fd closed, ids from 0 in submit order; the same in both implementations."""
    results = {}
    path = tmp_path_factory.mktemp("f") / "f"
    path.write_bytes(b"x")
    for name, make in IMPLS.items():
        s = make()
        writers: list[int] = []
        batches = []
        for kinds in jobs:  # every fd opened before the first job closes any: no number is reused
            fds = []
            for k in kinds:
                if k == "file":
                    fds.append(os.open(path, os.O_RDWR))
                elif k == "pipe":
                    r, w = os.pipe()
                    writers.append(w)
                    fds.append(r)
                else:
                    fds.append(NOT_OPEN)
            batches.append(fds)
        given_fds = [fd for fds in batches for fd in fds if fd != NOT_OPEN]
        ids = [s.submit(fds) for fds in batches]
        results[name] = (ids, sorted(wait_done(s, len(jobs))))
        s.close()
        assert not [fd for fd in given_fds if is_open(fd)], "a job left an fd open"
        for w in writers:
            os.close(w)
    expected = []
    for i, kinds in enumerate(jobs):
        first_bad = next((k for k in kinds if k != "file"), None)
        expected.append((i, {None: 0, "pipe": errno.EINVAL, "none": errno.EBADF}[first_bad]))
    assert results["compiled"] == results["reference"] == (list(range(len(jobs))), expected)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bad, error", [
    ("3", TypeError), (None, TypeError), ([1.5], TypeError), (["3"], TypeError), ([-1], ValueError),
    ([2**31], ValueError), ([2**70], ValueError), ([-(2**70)], ValueError),
])
def test_bad_input_is_refused_and_nothing_is_taken(impl: str, bad: Any, error: type[Exception],
                                                   opener: Callable[[str], int]) -> None:
    s = IMPLS[impl]()
    try:
        fd = opener("file")
        with pytest.raises(error):
            s.submit([fd, *bad] if isinstance(bad, list) else bad)
        assert is_open(fd)  # refused whole: the good fd before the bad one was not taken
        os.close(fd)
        assert s.submit(()) == 0  # and no job id was spent
        assert wait_done(s, 1) == [(0, 0)]
    finally:
        s.close()


@pytest.mark.parametrize("impl", IMPLS)
def test_close_finishes_what_was_submitted_then_refuses(impl: str, opener: Callable[[str], int]) -> None:
    s = IMPLS[impl]()
    fds = [opener("file") for _ in range(50)]
    for fd in fds:
        s.submit([fd])
    s.close()
    assert not [fd for fd in fds if is_open(fd)]
    s.close()  # idempotent
    for call in (s.fileno, s.done, lambda: s.submit([])):
        with pytest.raises(ValueError):
            call()


@pytest.mark.parametrize("impl", IMPLS)
def test_fileno_becomes_readable_when_a_job_ends(impl: str, opener: Callable[[str], int]) -> None:
    s = IMPLS[impl]()
    try:
        assert select.select([s.fileno()], [], [], 0)[0] == []
        s.submit([opener("file")])
        assert select.select([s.fileno()], [], [], 10)[0] == [s.fileno()]
        assert s.done() == [(0, 0)]
        assert select.select([s.fileno()], [], [], 0)[0] == []  # done() read the pipe empty
    finally:
        s.close()


@pytest.mark.parametrize("impl", IMPLS)
def test_fsyncer_returns_once_synced_and_raises_the_first_failure(impl: str, monkeypatch: pytest.MonkeyPatch,
                                                                  opener: Callable[[str], int]) -> None:
    monkeypatch.setattr(fsyncer, "new_syncer", IMPLS[impl])

    async def main() -> None:
        f = Fsyncer()
        try:
            good = [opener("file"), opener("file")]
            await asyncio.wait_for(f.sync(good), 10)
            assert not [fd for fd in good if is_open(fd)]
            bad = [opener("file"), opener("pipe"), opener("file")]
            with pytest.raises(OSError) as e:
                await asyncio.wait_for(f.sync(bad), 10)
            assert e.value.errno == errno.EINVAL
            assert not [fd for fd in bad if is_open(fd)]
            # many at once, each answered
            await asyncio.wait_for(asyncio.gather(*(f.sync([opener("file")]) for _ in range(100))), 10)
        finally:
            f.close()
            f.close()

    asyncio.run(main())


def test_fsyncer_injected_failure_closes_the_fds(monkeypatch: pytest.MonkeyPatch,
                                                 opener: Callable[[str], int]) -> None:
    """The tests' fault file (storage.segments.FAULTS 'fsync-eio') fails a sync as it fails fsync_all."""

    class Failing:
        def check_fsync(self) -> None:
            raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(segments, "FAULTS", Failing())

    async def main() -> None:
        f = Fsyncer()
        fds = [opener("file")]
        with pytest.raises(OSError) as e:
            await f.sync(fds)
        assert e.value.errno == errno.EIO
        assert not is_open(fds[0])
        f.close()

    asyncio.run(main())


def test_the_reference_runs_where_os_fsync_was_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hook on os.fsync (tests/robustness counts the group commit's fsyncs with one,
    tests/storage/driver.py makes them no-ops) must see the fsyncs: the compiled Syncer would not
    call it."""
    s = fsyncer.new_syncer()
    assert isinstance(s, c.Syncer if native.compiled() is not None else Syncer)  # DELAYD_PURE=1: the reference
    s.close()
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    s = fsyncer.new_syncer()
    assert isinstance(s, Syncer)
    s.close()


@pytest.mark.parametrize("impl", IMPLS)
def test_a_submit_while_closing_is_refused(impl: str, opener: Callable[[str], int]) -> None:
    """close() lets the GIL go while it waits for the thread: a submit from another thread then
    must be refused, not queued behind a thread that is gone (its fds would never be closed)."""
    s = IMPLS[impl]()
    slow = [opener("file") for _ in range(200)]
    s.submit(slow)  # keeps the thread busy while close() waits
    closing = threading.Thread(target=s.close)
    closing.start()
    fds = []
    while closing.is_alive():
        fd = opener("file")
        try:
            s.submit([fd])
            fds.append(fd)
        except ValueError:
            os.close(fd)
            break
    closing.join()
    assert not [fd for fd in [*slow, *fds] if is_open(fd)], "a job submitted before close() was not finished"


@pytest.mark.parametrize("impl", IMPLS)
def test_close_from_two_threads_at_once(impl: str, opener: Callable[[str], int]) -> None:
    """The second close() returns while the first waits for the thread: neither joins it twice
    nor closes the pipe twice (a descriptor number closed twice may be another file's by then)."""
    s = IMPLS[impl]()
    s.submit([opener("file") for _ in range(200)])  # keeps the thread busy while close() waits
    errors: list[BaseException] = []

    def close() -> None:
        try:
            s.close()
        except BaseException as e:  # noqa: BLE001 - a thread's exception would go unseen
            errors.append(e)

    closers = [threading.Thread(target=close) for _ in range(4)]
    for t in closers:
        t.start()
    for t in closers:
        t.join(10)
        assert not t.is_alive()
    s.close()
    assert errors == []
