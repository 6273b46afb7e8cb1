"""The `delayd` command: one entry point for the daemon's commands and the client's.

`serve`, `check` and `dump` belong to the daemon (delayd.broker.cli); send, cancel, get, consume and
the other client commands talk to a running daemon through the SDK (delayd.client.cli). The daemon's
commands are dispatched without importing any client code: the server does not depend on the SDK.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from delayd import __version__


def build_parser(*, client: bool = True) -> argparse.ArgumentParser:
    from delayd.broker import cli as broker_cli

    p = argparse.ArgumentParser(prog="delayd", description="delayd: a durable delay-message broker")
    p.add_argument("--version", action="version", version=f"delayd {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    broker_cli.register(sub)
    if client:
        from delayd.client import cli as client_cli
        client_cli.register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    from delayd.broker.cli import DAEMON_COMMANDS
    daemon_only = bool(args_in) and args_in[0] in DAEMON_COMMANDS
    args = build_parser(client=not daemon_only).parse_args(args_in)
    return int(args.func(args))
