"""Every error the API can answer, in one place, with its HTTP status.

The HTTP layer turns an ApiError into `{"error": {"code", "message"[, "index"]}}` with
`status`. Failures from below (storage errors, and OS errors that reach the broker) are mapped
by one table, `STORAGE_ERRORS` / `OS_ERRORS`, in `from_exception`: no handler or service
method needs its own try/except to choose a status.
"""

from __future__ import annotations

import errno
from collections.abc import Callable

from delayd.storage.errors import DiskFull, NotDurable, OutOfDescriptors, RecordTooLarge, StorageError


class ApiError(Exception):
    status = 400
    code = "bad_request"

    def __init__(self, message: str, *, index: int | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.index = index
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, object]:
        err: dict[str, object] = {"code": self.code, "message": self.message}
        if self.index is not None:
            err["index"] = self.index
        return {"error": err}


def _error(name: str, status: int, code: str, doc: str) -> type[ApiError]:
    return type(name, (ApiError,), {"status": status, "code": code, "__doc__": doc})


BadRequest = _error("BadRequest", 400, "bad_request", "The request is malformed.")
InvalidJson = _error("InvalidJson", 400, "invalid_body", "The body does not decode as JSON or msgpack.")
InvalidName = _error("InvalidName", 400, "invalid_name", "A topic or group name breaks the naming rule.")
InvalidMessage = _error("InvalidMessage", 400, "invalid_message", "A message object is invalid.")
InvalidParameter = _error("InvalidParameter", 400, "invalid_parameter", "A request field is out of range.")
InvalidPush = _error("InvalidPush", 400, "invalid_push", "A push subscription setting is invalid.")
DelayTooLong = _error("DelayTooLong", 400, "delay_too_long", "The due time is beyond the maximum horizon.")
Unauthorized = _error("Unauthorized", 401, "unauthorized", "Missing or wrong bearer token.")
Forbidden = _error("Forbidden", 403, "forbidden", "The token may not do this on this topic.")
NotFound = _error("NotFound", 404, "not_found", "No such message or resource.")
MethodNotAllowed = _error("MethodNotAllowed", 405, "method_not_allowed", "The path does not take this method.")
RequestTimeout = _error("RequestTimeout", 408, "request_timeout",
                       "The client did not send the whole request in time.")
AlreadyDelivered = _error("AlreadyDelivered", 409, "already_delivered", "The message was (or is being) delivered.")
PushSubscription = _error("PushSubscription", 409, "push_subscription",
                          "The group is a push subscription: the daemon delivers, nobody pulls.")
TooLarge = _error("TooLarge", 413, "too_large", "The body or a message exceeds a configured limit.")
UnsupportedMediaType = _error("UnsupportedMediaType", 415, "unsupported_media_type",
                              "Content-Type must be application/json or application/msgpack.")
Backpressure = _error("Backpressure", 429, "backpressure", "The broker is saturated; retry after a pause.")
NotReady = _error("NotReady", 503, "not_ready", "Recovery is still running.")
Unavailable = _error("Unavailable", 503, "unavailable",
                     "The broker is short of a resource (file descriptors); retry after a pause.")
NoPrimary = _error("NoPrimary", 503, "no_primary",
                   "Replication: this member is a follower and no primary of its shard is known; retry after a pause.")
InsufficientReplicas = _error("InsufficientReplicas", 503, "insufficient_replicas",
                              "Replication: fewer in-sync copies than replication_min_insync; nothing was stored.")
UnderReplicated = _error("UnderReplicated", 503, "under_replicated",
                         "Replication: the in-sync set shrank below replication_min_insync while the write waited "
                         "for it; the write is stored on the primary but was not acknowledged.")


class NotPrimaryError(ApiError):
    """Replication: this member is a follower; `primary` is the URL of the shard's primary."""
    status = 421
    code = "not_primary"

    def __init__(self, message: str, primary: str | None) -> None:
        super().__init__(message)
        self.primary = primary

    def body(self) -> dict[str, object]:
        return {"error": {"code": self.code, "message": self.message, "primary": self.primary}}


DiskFullError = _error("DiskFullError", 507, "disk_full", "The disk is full; nothing was stored.")
Internal = _error("Internal", 500, "internal", "An unexpected failure inside the broker.")


RETRY_AFTER_S = 1

# The one table from failures below the API to its answers: the first class that matches wins.
STORAGE_ERRORS: tuple[tuple[type[StorageError], Callable[[StorageError], ApiError]], ...] = (
    (DiskFull, lambda e: DiskFullError(f"disk full: {e}")),
    (NotDurable, lambda e: DiskFullError(f"could not make the write durable: {e}")),
    (OutOfDescriptors, lambda e: Unavailable(f"out of file descriptors ({e})", retry_after_s=RETRY_AFTER_S)),
    (RecordTooLarge, lambda e: TooLarge(str(e))),
    (StorageError, lambda e: Internal(f"storage failure: {type(e).__name__}: {e}")),
)
OS_ERRORS: dict[int, Callable[[OSError], ApiError]] = {
    errno.ENOSPC: lambda e: DiskFullError(f"disk full: {e}"),
    errno.EDQUOT: lambda e: DiskFullError(f"disk quota exceeded: {e}"),
    errno.EMFILE: lambda e: Unavailable(f"out of file descriptors: {e}", retry_after_s=RETRY_AFTER_S),
    errno.ENFILE: lambda e: Unavailable(f"the system is out of file descriptors: {e}", retry_after_s=RETRY_AFTER_S),
}


def from_exception(e: BaseException) -> ApiError | None:
    """The API's answer to a failure from below, or None when the table does not know it (an
    unexpected failure: 500, logged with its traceback)."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, StorageError):
        for cls, make in STORAGE_ERRORS:
            if isinstance(e, cls):
                return make(e)
    if isinstance(e, OSError) and e.errno in OS_ERRORS:
        return OS_ERRORS[e.errno](e)
    return None


# Coordination (broker/etcd.py, broker/coord.py). These never reach a client as such: the data path
# turns "not the primary" into its own answer; the rest are logged and retried.
class CoordinationError(Exception):
    """Replication coordination through etcd failed."""


class EtcdUnavailable(CoordinationError):
    """No etcd endpoint answered in time (connection refused, timed out, no leader)."""


class EtcdOutcomeUnknown(EtcdUnavailable):
    """A write was sent but its answer was lost: it may or may not have been applied."""


class EtcdRequestFailed(CoordinationError):
    """etcd answered with an error (its gRPC code and message are kept)."""

    def __init__(self, message: str, *, code: int, http_status: int) -> None:
        super().__init__(message)
        self.code = code
        self.http_status = http_status


class EtcdWatchCanceled(CoordinationError):
    """etcd canceled a watch (its start revision was compacted away); re-read and watch again."""


class NotPrimary(CoordinationError):
    """This member does not hold the shard's primary key (any more)."""


class StaleIsr(CoordinationError):
    """An in-sync set change lost its compare-and-swap: someone changed the set first."""
