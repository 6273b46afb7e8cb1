"""Every error the SDK raises, in one place.

The daemon answers errors as `{"error": {"code": ..., "message": ..., "index"?: ...}}`. The SDK turns
each into an instance of the class registered for its `code` (falling back to the HTTP status), so
callers can catch a family (`except NotFound`) or everything (`except DelaydError`).

    DelaydError
    ├── InvalidRequest          400  bad input; never retried
    │   ├── InvalidName         400  invalid_name
    │   ├── InvalidMessage      400  invalid_message (has .index in a batch)
    │   ├── InvalidParameter    400  invalid_parameter: a field out of range
    │   ├── DelayTooLong        400  delay_too_long
    │   ├── TooLarge            413  too_large
    │   └── UnsupportedMediaType 415
    ├── Unauthorized            401  missing or wrong token
    ├── Forbidden               403  token lacks the right for this topic or action
    ├── NotFound                404  no such message / key
    ├── Conflict                409
    │   └── AlreadyDelivered    409  already_delivered: too late to cancel
    ├── NotPrimary              421  not_primary: a replica follower; .primary names the primary's URL
    ├── Backpressure            429  the broker refused the work for now (.retry_after)
    ├── ServerError             5xx
    │   ├── Unavailable         503  not ready yet or shutting down (.retry_after)
    │   │   ├── NoPrimary       503  no_primary: the shard is electing a primary; nothing was done
    │   │   ├── InsufficientReplicas 503  insufficient_replicas: too few in-sync copies; nothing stored
    │   │   └── UnderReplicated 503  under_replicated: stored on the primary, copies uncertain
    │   └── DiskFull            507  disk_full
    ├── ConnectionFailed        no HTTP answer (refused, reset, timed out)
    └── ProtocolError           an answer the SDK cannot parse
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class DelaydError(Exception):
    """Base of every SDK error. `status` is the HTTP status (0 when there was no answer)."""

    default_code = "error"

    def __init__(self, message: str, *, code: str | None = None, status: int = 0, index: int | None = None,
                 retry_after: float | None = None, url: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.status = status
        self.index = index            # the offending message of a batch, when the broker names one
        self.retry_after = retry_after  # seconds, from the Retry-After header
        self.url = url                # the shard that answered (or failed to)

    def __str__(self) -> str:
        where = f" at index {self.index}" if self.index is not None else ""
        status = f" {self.status}" if self.status else ""
        return f"{self.code}{status}: {self.message}{where}"

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep the keyword-only attributes when pickled (e.g. across a process pool).
        return (_rebuild, (type(self), self.message, self.__dict__.copy()))


def _rebuild(cls: type[DelaydError], message: str, state: dict[str, Any]) -> DelaydError:
    err = cls(message)
    err.__dict__.update(state)
    return err


class InvalidRequest(DelaydError, ValueError):
    """Bad input. Also a `ValueError`, which is what local validation failures are in Python."""

    default_code = "invalid_request"


class InvalidName(InvalidRequest):
    default_code = "invalid_name"


class InvalidMessage(InvalidRequest):
    default_code = "invalid_message"


class InvalidParameter(InvalidRequest):
    default_code = "invalid_parameter"


class DelayTooLong(InvalidRequest):
    default_code = "delay_too_long"


class TooLarge(InvalidRequest):
    default_code = "too_large"


class UnsupportedMediaType(InvalidRequest):
    default_code = "unsupported_media_type"


class Unauthorized(DelaydError):
    default_code = "unauthorized"


class Forbidden(DelaydError):
    default_code = "forbidden"


class NotFound(DelaydError):
    default_code = "not_found"


class Conflict(DelaydError):
    default_code = "conflict"


class AlreadyDelivered(Conflict):
    default_code = "already_delivered"


class Backpressure(DelaydError):
    default_code = "backpressure"


class NotPrimary(DelaydError):
    """421: the member asked is a follower of a replicated shard. `primary` is the URL of the
    shard's primary (None while the follower knows none). Nothing was done; the SDK follows it."""

    default_code = "not_primary"

    def __init__(self, message: str, *, primary: str | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.primary = primary


class ServerError(DelaydError):
    default_code = "server_error"


class Unavailable(ServerError):
    default_code = "unavailable"


class NoPrimary(Unavailable):
    """503: the shard has no primary right now (an election is under way). Nothing was done."""

    default_code = "no_primary"


class InsufficientReplicas(Unavailable):
    """503: the primary has fewer in-sync members than `replication_min_insync`; it refused the
    write before storing anything."""

    default_code = "insufficient_replicas"


class UnderReplicated(Unavailable):
    """503: the primary stored the write but its in-sync set shrank before every copy was
    confirmed. The outcome is uncertain (like any 5xx): the write may survive or not."""

    default_code = "under_replicated"


class DiskFull(ServerError):
    default_code = "disk_full"


class ConnectionFailed(DelaydError):
    """No HTTP answer. `sent` is False when the connection could not even be opened, so the
    request certainly never reached the broker (which makes any request safe to retry)."""

    default_code = "connection_failed"

    def __init__(self, message: str, *, sent: bool = True, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.sent = sent


class ProtocolError(DelaydError):
    default_code = "protocol_error"


# The code in the body decides; the status is the fallback for codes this SDK does not know.
CODE_TO_ERROR: dict[str, type[DelaydError]] = {
    "invalid_request": InvalidRequest,
    "bad_request": InvalidRequest,
    "invalid_body": InvalidRequest,
    "method_not_allowed": InvalidRequest,
    "invalid_parameter": InvalidParameter,
    "invalid_name": InvalidName,
    "invalid_message": InvalidMessage,
    "delay_too_long": DelayTooLong,
    "too_large": TooLarge,
    "unsupported_media_type": UnsupportedMediaType,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "conflict": Conflict,
    "already_delivered": AlreadyDelivered,
    "backpressure": Backpressure,
    "not_primary": NotPrimary,
    "no_primary": NoPrimary,
    "insufficient_replicas": InsufficientReplicas,
    "under_replicated": UnderReplicated,
    "unavailable": Unavailable,
    "not_ready": Unavailable,
    "disk_full": DiskFull,
}

STATUS_TO_ERROR: dict[int, type[DelaydError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: TooLarge,
    415: UnsupportedMediaType,
    421: NotPrimary,
    429: Backpressure,
    503: Unavailable,
    507: DiskFull,
}


def error_from_response(status: int, payload: Any, *, retry_after: float | None = None,
                        url: str | None = None, fallback_text: str = "") -> DelaydError:
    """Build the exception for an error answer (`payload` already decoded, or None)."""
    code: str | None = None
    message = fallback_text or f"HTTP {status}"
    index: int | None = None
    primary: str | None = None
    if isinstance(payload, Mapping) and isinstance(payload.get("error"), Mapping):
        err = payload["error"]
        code = str(err["code"]) if err.get("code") is not None else None
        message = str(err.get("message") or message)
        raw_index = err.get("index")
        index = raw_index if isinstance(raw_index, int) and not isinstance(raw_index, bool) else None
        raw_primary = err.get("primary")
        primary = raw_primary.rstrip("/") if isinstance(raw_primary, str) and raw_primary else None
    cls = CODE_TO_ERROR.get(code or "") or STATUS_TO_ERROR.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else InvalidRequest
    if issubclass(cls, NotPrimary):
        return cls(message, code=code, status=status, index=index, retry_after=retry_after, url=url,
                   primary=primary)
    return cls(message, code=code, status=status, index=index, retry_after=retry_after, url=url)
