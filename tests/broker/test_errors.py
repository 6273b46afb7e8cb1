"""broker.errors: the one table from failures below the API to its answers."""

from __future__ import annotations

import errno

import pytest
from delayd.broker import errors
from delayd.storage.errors import (
    ChecksumMismatch,
    DiskFull,
    NotDurable,
    OutOfDescriptors,
    StorageError,
    UnsupportedVersion,
)


@pytest.mark.parametrize("exc,status,code,retry", [
    (DiskFull("no space"), 507, "disk_full", None),
    (NotDurable("fsync failed"), 507, "disk_full", None),
    (OutOfDescriptors("no fd"), 503, "unavailable", 1),
    (OSError(errno.ENOSPC, "No space left on device"), 507, "disk_full", None),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), 507, "disk_full", None),
    (OSError(errno.EMFILE, "Too many open files"), 503, "unavailable", 1),
    (OSError(errno.ENFILE, "Too many open files in system"), 503, "unavailable", 1),
    (ChecksumMismatch("crc"), 500, "internal", None),
    (UnsupportedVersion("meta", 3, 2), 500, "internal", None),
    (StorageError("other"), 500, "internal", None),
])
def test_the_table(exc: BaseException, status: int, code: str, retry: int | None) -> None:
    err = errors.from_exception(exc)
    assert err is not None and (err.status, err.code, err.retry_after_s) == (status, code, retry)
    assert err.body()["error"]["code"] == code


def test_api_errors_pass_and_unknown_failures_are_not_guessed() -> None:
    e = errors.NotFound("gone")
    assert errors.from_exception(e) is e
    assert errors.from_exception(ValueError("bug")) is None
    assert errors.from_exception(OSError(errno.EIO, "I/O error")) is None
