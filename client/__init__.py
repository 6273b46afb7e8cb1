"""delayd client SDK: `AsyncClient` / `Client`, auto-batching producers, consumer runners.

    from delayd.client import Client
    with Client("http://127.0.0.1:7070") as c:
        c.send("orders.timeout", b"order-42", delay_ms=30_000, key="order-42")
        c.cancel_key("orders.timeout", "order-42")

See docs/client.md.
"""

from delayd.client.aio import DEFAULT_URL, AsyncClient
from delayd.client.codec import Encoding, OutgoingMessage
from delayd.client.consumer import AsyncConsumer, Consumer, ConsumerStats
from delayd.client.errors import (
    AlreadyDelivered,
    Backpressure,
    Conflict,
    ConnectionFailed,
    DelaydError,
    DelayTooLong,
    DiskFull,
    Forbidden,
    InsufficientReplicas,
    InvalidMessage,
    InvalidName,
    InvalidParameter,
    InvalidRequest,
    NoPrimary,
    NotFound,
    NotPrimary,
    ProtocolError,
    ServerError,
    TooLarge,
    Unauthorized,
    Unavailable,
    UnderReplicated,
    UnsupportedMediaType,
)
from delayd.client.http import RetryPolicy
from delayd.client.models import (
    AckResult,
    CancelResult,
    DeadLetter,
    ExtendResult,
    Message,
    MessageState,
    NackResult,
    NodeInfo,
    PendingMessage,
    PendingPage,
    PushSettings,
    ReceivedMessage,
    RedriveResult,
    ScheduleBucket,
    SendResult,
    Stats,
    Subscription,
    SubscriptionStatus,
)
from delayd.client.producer import AsyncProducer, Producer
from delayd.client.ring import HashRing
from delayd.client.sync import Client

__all__ = [
    "DEFAULT_URL", "AsyncClient", "Client", "AsyncProducer", "Producer", "AsyncConsumer", "Consumer",
    "ConsumerStats", "Encoding", "OutgoingMessage", "RetryPolicy", "HashRing",
    "AckResult", "CancelResult", "DeadLetter", "ExtendResult", "Message", "MessageState", "NackResult",
    "NodeInfo", "PendingMessage", "PendingPage", "PushSettings", "ReceivedMessage", "RedriveResult",
    "ScheduleBucket", "SendResult", "Stats", "Subscription", "SubscriptionStatus",
    "DelaydError", "InvalidRequest", "InvalidName", "InvalidMessage", "InvalidParameter", "DelayTooLong", "TooLarge",
    "UnsupportedMediaType", "Unauthorized", "Forbidden", "NotFound", "Conflict", "AlreadyDelivered",
    "Backpressure", "ServerError", "Unavailable", "DiskFull", "ConnectionFailed", "ProtocolError",
    "NotPrimary", "NoPrimary", "InsufficientReplicas", "UnderReplicated",
]
