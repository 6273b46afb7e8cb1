"""The daemon's commands of the `delayd` CLI: `serve` runs the daemon; `check` and `dump` inspect a
data directory. (The client commands live in delayd.client.cli; delayd.cli dispatches to both.)"""

from __future__ import annotations

import argparse
import asyncio
import gc
import ipaddress
import logging
import os
import signal
import ssl
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web
from delayd.broker import admin_token
from delayd.broker import config as config_mod
from delayd.broker.clock import Clock
from delayd.broker.config import Config, ConfigError
from delayd.storage.errors import StorageError

log = logging.getLogger("delayd")
# Client address, request line, status, response bytes, seconds, user agent. Never a header that
# could carry a token.
ACCESS_LOG_FORMAT = '%a "%r" %s %b %Tf "%{User-Agent}i"'


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def serve(cfg: Config, clock: Clock | None = None) -> int:
    """Run until SIGTERM/SIGINT. One aiohttp cleanup_ctx per resource — storage, metrics,
    pipeline — started in that order (before the port is bound) and torn down in reverse."""
    from delayd.broker.http import make_app
    from delayd.broker.httpserver import JsonErrorAppRunner
    from delayd.broker.metrics import Metrics
    from delayd.broker.service import Broker

    t0 = time.monotonic()
    broker = Broker(cfg, clock)
    if cfg.replication_enabled:
        from delayd.broker.coord import Coordinator
        from delayd.broker.replication import Replication
        broker.repl = Replication(broker, Coordinator(cfg.replication()))
    metrics = Metrics(broker)
    app = make_app(broker, cfg, metrics)
    recovery: asyncio.Task[None] | None = None
    starting: asyncio.Task[None] | None = None

    async def storage_ctx(_app: web.Application) -> AsyncIterator[None]:
        nonlocal recovery
        # The data directory first, before the port is bound and before "listening" is logged:
        # a directory in use (LOCK), from a newer build, or of another node fails right here.
        broker.open()
        # Recovery runs in the background: /healthz answers and /readyz says 503 meanwhile.
        recovery = asyncio.create_task(broker.recover(), name="recovery")
        yield
        if not recovery.done():
            recovery.cancel()
        await asyncio.gather(recovery, return_exceptions=True)
        summary = broker.close_storage()
        if summary:
            log.info("shutdown ◆ %d produced ◆ %d delivered ◆ %d cancelled ◆ %d scheduled ◆ up %.1fs",
                     summary["produced"], summary["delivered"], summary["cancelled"], summary["scheduled"],
                     time.monotonic() - t0)

    async def metrics_ctx(_app: web.Application) -> AsyncIterator[None]:
        # Observes releases while the pipeline runs: on before it starts, off after it drained.
        if metrics not in broker.listeners:
            broker.listeners.append(metrics)
        yield
        if metrics in broker.listeners:
            broker.listeners.remove(metrics)

    async def pipeline_ctx(_app: web.Application) -> AsyncIterator[None]:
        nonlocal starting

        async def start_when_recovered() -> None:
            assert recovery is not None
            await recovery
            # What start-up and recovery built (modules, configuration, the recovered structures)
            # lives as long as the process: out of the collector's sight (gc.freeze), a full
            # collection walks only what came after - each walked ~40,000 objects for 40 ms on
            # 2 cores, on the event loop, while deliveries waited.
            gc.collect()
            gc.freeze()
            broker.start_pipeline()  # with replication: the enqueue side only, until elected
            if broker.repl is not None:
                await broker.repl.start()

        starting = asyncio.create_task(start_when_recovered(), name="pipeline start")
        yield
        if not starting.done():
            starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        if broker.repl is not None:
            await broker.repl.stop()  # steps down first: another member is elected at once
        await broker.stop_pipeline()  # drains, bounded by a timeout

    app.cleanup_ctx.extend([storage_ctx, metrics_ctx, pipeline_ctx])
    if broker.repl is not None:
        repl = broker.repl

        async def step_down(_app: web.Application) -> None:
            # First thing at shutdown: aiohttp then waits (shutdown_timeout) for open handlers, and
            # a follower's stream handler ends only when its websocket is closed.
            await repl.stop()

        app.on_shutdown.append(step_down)
    host, port = cfg.host_port
    ssl_ctx = None
    if cfg.tls_cert and cfg.tls_key:
        ssl_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ssl_ctx.load_cert_chain(cfg.tls_cert, cfg.tls_key)
    # Slow or idle clients: a connection that has not sent a whole request line and headers
    # within request_timeout_s (aiohttp arms its keep-alive timer at connect and after each
    # response) is closed; a stalled body is cut by read_body (408); the rest of an unread
    # body is drained for at most lingering_time.
    access: dict[str, Any] = {"access_log": None}
    if cfg.access_log:
        access = {"access_log": logging.getLogger("delayd.access"), "access_log_format": ACCESS_LOG_FORMAT}
    # JsonErrorAppRunner: requests aiohttp's parser refuses are answered in the API's JSON shape too.
    runner = JsonErrorAppRunner(app, **access, handle_signals=False, shutdown_timeout=5.0,
                                keepalive_timeout=cfg.request_timeout_s,
                                lingering_time=min(10.0, cfg.request_timeout_s))
    try:
        await runner.setup()  # runs the contexts' start halves: the data directory opens here
    except StorageError as e:
        log.error("cannot start: %s", e)
        await runner.cleanup()
        return 1
    site = web.TCPSite(runner, host, port, ssl_context=ssl_ctx, backlog=1024)
    try:
        await site.start()
    except OSError as e:
        log.error("cannot start: %s", e)
        await runner.cleanup()
        return 1
    log.info("delayd listening on %s://%s:%d, data in %s (node %s), fsync %s", "https" if ssl_ctx else "http",
             host, port, cfg.data_dir, broker.node_id, cfg.fsync)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    code = 0
    while not stop.is_set():
        try:
            async with asyncio.timeout(0.5):
                await stop.wait()
        except TimeoutError:
            pass
        failed = broker.failure()
        for task in (recovery, starting):
            if task is not None and task.done() and not task.cancelled() and task.exception():
                failed = task.exception()
        if failed is not None:
            log.error("fatal: %s: %s", type(failed).__name__, failed)
            code = 1
            break
    # Stop taking new connections, answer pending long-polls, then let handlers finish; the
    # contexts then stop the pipeline (drained), metrics, and storage, in that order.
    broker.stopping()
    await site.stop()
    await runner.cleanup()
    return code


class _NoClientErrorTracebacks(logging.Filter):
    """aiohttp logs every request it cannot parse (junk, a 100 KiB header, bad bytes) with a
    traceback at ERROR. Those are client errors, answered 400 like any other bad request and
    not logged either: else anyone who can connect fills the log (and the disk) for free."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 400) < 500)


def _run_serve(args: argparse.Namespace) -> int:
    flags = {"data_dir": args.data_dir, "listen": args.listen, "fsync": args.fsync, "node_id": args.node_id,
             "insecure": True if args.insecure else None, "log_level": args.log_level,
             "access_log": args.access_log, "auto_token": args.auto_token}
    try:
        cfg = config_mod.load(args.config, flags=flags)
        cfg, token_file, token_created = admin_token.ensure(cfg)
    except ConfigError as e:
        print(f"delayd: {e}", file=sys.stderr)
        return 2
    host, _ = cfg.host_port
    if not _is_loopback(host) and not cfg.tokens and not cfg.insecure:
        print(f"delayd: refusing to listen on non-loopback {host} without auth tokens "
              "(configure [[auth.tokens]] or pass --insecure)", file=sys.stderr)
        return 2
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiohttp.server").addFilter(_NoClientErrorTracebacks())
    if cfg.access_log:  # asked for explicitly, so shown whatever --log-level says
        logging.getLogger("delayd.access").setLevel(logging.INFO)
    log.debug("effective configuration: %r", cfg)  # Token's repr leaves the secret out
    if token_file is not None:  # the file's name, never the token
        log.warning("no auth tokens configured: every /v1 call and /metrics need the admin token %s in %s",
                    "generated now" if token_created else "kept", token_file)
    try:
        import uvloop
        return int(uvloop.run(serve(cfg)))
    except ImportError:  # pragma: no cover - uvloop is a dependency; keep running without it
        return int(asyncio.run(serve(cfg)))
    except OSError as e:
        log.error("cannot start: %s", e)
        return 1


def _store_config(args: argparse.Namespace) -> object:
    """The storage geometry the daemon would use (a config file may change it)."""
    return config_mod.load(args.config, env={}).store_config()


def _run_check(args: argparse.Namespace) -> int:
    from delayd.storage import inspect
    if not Path(args.data_dir).is_dir():
        print(f"delayd check: {args.data_dir} is not a directory", file=sys.stderr)
        return 2
    report = inspect.check(Path(args.data_dir), config=_store_config(args))
    print(report.text())
    return 1 if report.problems else 0


def _run_dump(args: argparse.Namespace) -> int:
    from delayd.storage import inspect
    try:
        for line in inspect.dump(Path(args.data_dir), args.what, segment=args.segment, start=args.start,
                                 limit=args.limit, topic=args.topic, config=_store_config(args)):
            print(line)
        sys.stdout.flush()
    except BrokenPipeError:
        # `delayd dump ... | head` closed the pipe: the reader has what it wanted. Point stdout at
        # /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


DAEMON_COMMANDS = ("serve", "check", "dump")


def register(sub: Any) -> None:
    """Add the daemon's commands (serve, check, dump) to an argparse subparsers object."""
    s = sub.add_parser("serve", help="run the daemon in the foreground")
    s.add_argument("--data-dir", default=None, help="data directory (default ./delayd-data)")
    s.add_argument("--listen", default=None, help="HOST:PORT (default 127.0.0.1:7070)")
    s.add_argument("--fsync", choices=config_mod.FSYNC_POLICIES, default=None, help="default always")
    s.add_argument("--config", default=None, help="TOML configuration file")
    s.add_argument("--node-id", default=None, help="prefix of message ids (one per shard)")
    s.add_argument("--insecure", action="store_true", help="allow a non-loopback listen without tokens")
    s.add_argument("--auto-token", action="store_true", default=None,
                   help="without configured tokens, require a generated admin token kept in "
                        "DATA_DIR/admin.token (mode 0600); the container image's default")
    s.add_argument("--log-level", default=None, choices=config_mod.LOG_LEVELS, type=str.lower,
                   help="debug, info (default), warning or error (env DELAYD_LOG_LEVEL)")
    s.add_argument("--access-log", action="store_true", default=None,
                   help="log one line per HTTP request (logger delayd.access; off by default)")
    s.set_defaults(func=_run_serve)
    c = sub.add_parser("check", help="verify every CRC and chain of a (stopped or live) data directory")
    c.add_argument("data_dir")
    c.add_argument("--config", default=None, help="the daemon's TOML config (for its storage geometry)")
    c.set_defaults(func=_run_check)
    d = sub.add_parser("dump", help="print a structure of a data directory in readable form")
    d.add_argument("data_dir")
    d.add_argument("what", choices=["commitlog", "timerlog", "wheel", "checkpoint", "ready", "msgtable"])
    d.add_argument("--segment", type=int, default=None, help="segment base (commitlog, timerlog, msgtable)")
    d.add_argument("--start", type=int, default=0, help="first offset / slot / index to show")
    d.add_argument("--limit", type=int, default=None, help="at most this many lines")
    d.add_argument("--topic", default=None, help="ready queue of this topic")
    d.add_argument("--config", default=None, help="the daemon's TOML config (for its storage geometry)")
    d.set_defaults(func=_run_dump)
