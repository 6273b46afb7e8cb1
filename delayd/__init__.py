"""delayd: a durable delay-message broker.

One package, three parts, each in a folder of the repository of the same name:

    delayd.storage   the storage engine (commit log, RIP-43 TimerLog/TimerWheel, recovery)
    delayd.broker    the daemon (`python -m delayd serve`)
    delayd.client    the SDK and the client commands of the CLI

Users import the SDK from here::

    from delayd import Client, AsyncClient

The SDK names are loaded on first use, so starting the daemon never imports client code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

if TYPE_CHECKING:
    from delayd.client import (
        AsyncClient,
        AsyncConsumer,
        AsyncProducer,
        Client,
        Consumer,
        DelaydError,
        Message,
        Producer,
        ReceivedMessage,
        SendResult,
    )

__all__ = ["__version__", "AsyncClient", "AsyncConsumer", "AsyncProducer", "Client", "Consumer", "DelaydError",
           "Message", "Producer", "ReceivedMessage", "SendResult"]


def __getattr__(name: str) -> Any:
    if name in __all__ and name != "__version__":
        return getattr(importlib.import_module("delayd.client"), name)
    raise AttributeError(f"module 'delayd' has no attribute {name!r}")
