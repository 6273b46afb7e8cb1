"""User commands of the `delayd` CLI: send, cancel, get, ls, consume, subscribe, ack, dead, redrive,
stats, schedule, cluster.

`delayd/cli.py` (the `delayd` entry point) calls `register(subparsers)` and then `args.func(args)`, which returns the exit code.
`main(argv)` runs these commands on their own. Every command takes `--url` (env `DELAYD_URL`, default
http://127.0.0.1:7070; several URLs, comma-separated or `--url` repeated, address shards and the
members of replicated shards - URLs reporting the same node id are one shard), `--token` (env
`DELAYD_TOKEN`) and `--json` (machine-readable output on stdout; human text otherwise).

Exit codes: 0 ok, 1 other API error, 2 bad usage or input, 3 not found, 4 conflict (already
delivered), 5 broker unreachable, 130 interrupted.
"""

from __future__ import annotations

import argparse
import base64
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from delayd.client.aio import DEFAULT_URL
from delayd.client.codec import OutgoingMessage
from delayd.client.consumer import Consumer
from delayd.client.errors import Conflict, ConnectionFailed, DelaydError, InvalidRequest, NotFound
from delayd.client.http import RetryPolicy
from delayd.client.models import Message, ReceivedMessage
from delayd.client.render import (
    Progress,
    format_bytes,
    format_duration,
    format_relative,
    format_time,
    histogram,
    now_ms,
    parse_duration_ms,
    parse_time_ms,
    table,
)
from delayd.client.sync import Client

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_CONFLICT, EXIT_UNREACHABLE = 0, 1, 2, 3, 4, 5
EXIT_INTERRUPTED = 130
SEND_CHUNK = 1_000  # messages per request when sending a file


# ---------------------------------------------------------------------------------------- plumbing

def _common() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("connection and output")
    g.add_argument("--url", action="append", default=None, metavar="URL",
                   help="broker URL; repeat it (or separate with commas) for several shards or the members "
                        "of a replicated shard: URLs that report the same node id are one shard "
                        f"(env DELAYD_URL, default {DEFAULT_URL})")
    g.add_argument("--token", default=None, help="bearer token (env DELAYD_TOKEN)")
    g.add_argument("--ca-file", default=None, metavar="PEM",
                   help="trust the CA certificate(s) in this file for https URLs (env DELAYD_CA_FILE)")
    g.add_argument("--json", action="store_true", help="machine-readable output")
    g.add_argument("--timeout", type=float, default=30.0, metavar="S", help="per-request timeout in seconds")
    g.add_argument("--retries", type=_positive, default=RetryPolicy.attempts, metavar="N",
                   help=f"attempts per request where retrying is safe (default {RetryPolicy.attempts}; 1 = none)")
    return p


def _client(args: argparse.Namespace) -> Client:
    url = ",".join(args.url) if args.url else os.environ.get("DELAYD_URL") or DEFAULT_URL
    token = args.token or os.environ.get("DELAYD_TOKEN") or None
    ca_file = args.ca_file or os.environ.get("DELAYD_CA_FILE") or None
    return Client(url, token, timeout_s=args.timeout, retry=RetryPolicy(attempts=args.retries), tls=ca_file)


def _err(text: str) -> None:
    print(f"delayd: {text}", file=sys.stderr)


def _exit_code(e: DelaydError) -> int:
    if isinstance(e, NotFound):
        return EXIT_NOT_FOUND
    if isinstance(e, Conflict):
        return EXIT_CONFLICT
    if isinstance(e, ConnectionFailed):
        return EXIT_UNREACHABLE
    if isinstance(e, InvalidRequest):
        return EXIT_USAGE
    return EXIT_ERROR


def _command(fn: Callable[[argparse.Namespace, Client], int]) -> Callable[[argparse.Namespace], int]:
    """Open a client, run the command, turn errors into a message and an exit code."""
    @functools.wraps(fn)
    def run(args: argparse.Namespace) -> int:
        try:
            client = _client(args)
        except ValueError as e:
            _err(str(e))
            return EXIT_USAGE
        try:
            return fn(args, client)
        except DelaydError as e:
            _err(str(e))
            return _exit_code(e)
        except BrokenPipeError:
            # `delayd consume ... | head` closed our stdout; that is not an error. Point stdout at
            # /dev/null so the interpreter's final flush does not complain again.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_OK
        except (ValueError, TypeError, OSError) as e:
            _err(str(e))
            return EXIT_USAGE
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
        finally:
            client.close()
    return run


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, ensure_ascii=False, separators=(",", ":")), flush=True)


def _body_json(body: bytes) -> dict[str, str]:
    try:
        return {"body": body.decode("utf-8")}
    except UnicodeDecodeError:
        return {"body_b64": base64.b64encode(body).decode("ascii")}


def _body_human(body: bytes, limit: int = 200) -> str:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return f"base64:{base64.b64encode(body[:limit]).decode()}" + ("…" if len(body) > limit else "")
    shown = json.dumps(text, ensure_ascii=False)[1:-1] if not text.isprintable() else text
    return shown[:limit] + ("…" if len(shown) > limit else "")


def _message_json(m: Message | ReceivedMessage) -> dict[str, Any]:
    out: dict[str, Any] = {k: v for k, v in m.__dict__.items() if k not in ("body", "group")}
    out.update(_body_json(m.body))
    if isinstance(m, Message):
        out["state"] = str(m.state)
    return out


def _headers(pairs: Sequence[str] | None) -> dict[str, str] | None:
    if not pairs:
        return None
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"bad header {pair!r}: use NAME=VALUE")
        out[name] = value
    return out


# ---------------------------------------------------------------------------------------- send

@_command
def cmd_send(args: argparse.Namespace, client: Client) -> int:
    if args.file is not None:
        return _send_file(args, client)
    if args.body is None or args.body == "-":
        if args.body is None and sys.stdin.isatty():
            raise ValueError("give a BODY, '-' for stdin, or --file")
        body: bytes | str = sys.stdin.buffer.read()
    else:
        body = args.body
    result = client.send(args.topic, body, delay_ms=args.delay, deliver_at=args.at, key=args.key, tag=args.tag,
                         headers=_headers(args.header), replace=args.replace)
    if args.json:
        _print_json(result.__dict__)
    else:
        dup = "  (duplicate: a pending message already has this key)" if result.duplicate else ""
        print(f"{result.id}  due {format_time(result.deliver_at)} ({format_relative(result.deliver_at)}){dup}")
    return EXIT_OK


def _read_lines(path: str) -> list[tuple[int, dict[str, Any]]]:
    stream = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115 - closed below
    try:
        out = []
        for number, line in enumerate(stream, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}:{number}: not JSON: {e}") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{number}: expected a JSON object per line")
            out.append((number, obj))
        return out
    finally:
        if stream is not sys.stdin:
            stream.close()


def _send_file(args: argparse.Namespace, client: Client) -> int:
    rows = _read_lines(args.file)
    messages = []
    for number, obj in rows:
        try:
            messages.append(OutgoingMessage.coerce(obj))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{args.file}:{number}: {e}") from None
    progress = Progress(len(messages), enabled=args.progress)
    results = []
    try:
        for at in range(0, len(messages), SEND_CHUNK):
            try:
                results += client.send_batch(args.topic, messages[at:at + SEND_CHUNK])
            except DelaydError as e:
                if e.index is not None:
                    e.message += f" ({args.file}:{rows[at + e.index][0]})"
                if results:
                    _err(f"{len(results)} message(s) before this chunk were sent")
                raise
            progress.update(len(results))
    finally:
        progress.finish()
    duplicates = sum(r.duplicate for r in results)
    if args.json:
        _print_json({"messages": [r.__dict__ for r in results]})
    else:
        took = time.monotonic() - progress.started
        print(f"sent {len(results):,} message(s) to {args.topic} in {took:.2f}s"
              + (f", {duplicates:,} duplicate(s)" if duplicates else ""))
    return EXIT_OK


# ---------------------------------------------------------------------------------------- cancel / get

def _by_id_or_key(args: argparse.Namespace, what: str) -> None:
    if (args.id is None) == (args.key is None):
        raise ValueError(f"{what}: give an ID, or --topic and --key")
    if args.key is not None and not args.topic:
        raise ValueError(f"{what}: --key needs --topic")


@_command
def cmd_cancel(args: argparse.Namespace, client: Client) -> int:
    _by_id_or_key(args, "cancel")
    result = client.cancel(args.id) if args.id is not None else client.cancel_key(args.topic, args.key)
    if args.json:
        _print_json(result.__dict__)
    else:
        print(f"{result.id}  {result.state}")
    return EXIT_OK


@_command
def cmd_get(args: argparse.Namespace, client: Client) -> int:
    _by_id_or_key(args, "get")
    m = client.get(args.id) if args.id is not None else client.get_key(args.topic, args.key)
    if args.json:
        _print_json(_message_json(m))
        return EXIT_OK
    rows = [("id", m.id), ("topic", m.topic), ("state", str(m.state)), ("key", m.key or "-"),
            ("tag", m.tag or "-"),
            ("deliver_at", f"{format_time(m.deliver_at)} ({format_relative(m.deliver_at)})"),
            ("produced_at", format_time(m.produced_at)),
            ("headers", ", ".join(f"{k}={v}" for k, v in m.headers.items()) or "-"),
            ("body", f"{_body_human(m.body, 2_000)}  [{len(m.body):,} bytes]")]
    for name, value in rows:
        print(f"{name + ':':13}{value}")
    return EXIT_OK


# ---------------------------------------------------------------------------------------- consume

def _run_exec(command: str, m: ReceivedMessage, timeout_s: float | None) -> int:
    env = {**os.environ, "DELAYD_ID": m.id, "DELAYD_RECEIPT": m.receipt, "DELAYD_TOPIC": m.topic,
           "DELAYD_KEY": m.key or "", "DELAYD_TAG": m.tag or "", "DELAYD_ATTEMPT": str(m.attempt),
           "DELAYD_DELIVER_AT": str(m.deliver_at),
           "DELAYD_HEADERS": json.dumps(m.headers, ensure_ascii=False)}
    try:
        return subprocess.run(command, shell=True, input=m.body, env=env, timeout=timeout_s).returncode
    except subprocess.TimeoutExpired:
        return -1


@_command
def cmd_consume(args: argparse.Namespace, client: Client) -> int:
    if args.create is not None or args.max_attempts is not None:
        client.subscribe(args.topic, args.group, start=args.create, max_attempts=args.max_attempts)

    def handle(m: ReceivedMessage) -> None:
        if args.exec is None:
            if args.json:
                _print_json(_message_json(m))
            else:
                extra = "".join(f"  {k}={v}" for k, v in (("key", m.key), ("tag", m.tag)) if v)
                print(f"{format_time(m.delivered_at)}  {m.id}  attempt={m.attempt}{extra}  "
                      f"{_body_human(m.body)}", flush=True)
            return
        code = _run_exec(args.exec, m, args.exec_timeout)
        ok = code == 0
        if args.json:
            _print_json({"id": m.id, "attempt": m.attempt, "exit": code, "acked": ok})
        elif not args.quiet:
            print(f"{m.id}  attempt={m.attempt}  exit={code}  {'ack' if ok else 'nack'}", file=sys.stderr,
                  flush=True)
        if not ok:
            raise RuntimeError(f"command exited with {code}")

    consumer = Consumer(client, args.topic, args.group, handle, concurrency=args.concurrency,
                        lease_ms=args.lease, wait_ms=args.wait, tags=args.tags, retry_delay_ms=args.retry_delay,
                        max_messages=args.count,
                        idle_timeout_s=None if args.idle_exit is None else args.idle_exit / 1000)
    try:
        stats = consumer.run()
    except KeyboardInterrupt:
        stats = consumer.stats
        if not args.json:
            _err(f"stopped: {stats.succeeded} acked, {stats.failed} nacked")
        return EXIT_INTERRUPTED
    if not args.json and not args.quiet and args.exec is not None:
        _err(f"done: {stats.succeeded} acked, {stats.failed} nacked")
    return EXIT_OK


# ---------------------------------------------------------------------------------------- groups

@_command
def cmd_ack(args: argparse.Namespace, client: Client) -> int:
    result = client.ack(args.topic, args.group, args.receipts)
    if args.json:
        _print_json(result.__dict__)
    else:
        print(f"acked {result.acked}" + (f", stale {len(result.stale)}: {' '.join(result.stale)}"
                                         if result.stale else ""))
    return EXIT_OK if not result.stale else EXIT_CONFLICT


@_command
def cmd_dead(args: argparse.Namespace, client: Client) -> int:
    letters = client.dead(args.topic, args.group, args.limit)
    if args.json:
        for d in letters:
            out = {k: v for k, v in d.__dict__.items() if k != "body"}
            _print_json({**out, **_body_json(d.body)})
        return EXIT_OK
    if not letters:
        print(f"no dead letters in {args.topic}/{args.group}")
        return EXIT_OK
    print(table(["id", "attempts", "reason", "due", "key", "body"],
                [(d.id, d.attempt, d.reason or "-", format_time(d.deliver_at), d.key or "-", _body_human(d.body, 60))
                 for d in letters]))
    return EXIT_OK


@_command
def cmd_redrive(args: argparse.Namespace, client: Client) -> int:
    if not args.ids and not args.all:
        raise ValueError("redrive: give message IDs, or --all for every dead letter of the group")
    result = client.redrive(args.topic, args.group, None if args.all else args.ids)
    if args.json:
        _print_json(result.__dict__)
    else:
        print(f"redriven {result.redriven} message(s) of {args.topic}/{args.group}")
    return EXIT_OK


@_command
def cmd_subscribe(args: argparse.Namespace, client: Client) -> int:
    if args.action == "delete":
        client.delete_subscription(args.topic, args.group)
        if args.json:
            _print_json({"topic": args.topic, "group": args.group, "deleted": True})
        else:
            print(f"deleted {args.topic}/{args.group}")
        return EXIT_OK
    if args.action == "create":
        client.subscribe(args.topic, args.group, start=args.start, max_attempts=args.max_attempts)
    elif args.start is not None or args.max_attempts is not None:
        raise ValueError("--start and --max-attempts go with 'subscribe create'")
    s = client.get_subscription(args.topic, args.group)
    if args.json:
        _print_json(s.__dict__)
        return EXIT_OK
    for name, value in (("group", f"{s.topic}/{s.group}"), ("start", s.start),
                        ("max_attempts", f"{s.max_attempts}"), ("backlog", f"{s.backlog:,}"),
                        ("inflight", f"{s.inflight:,}"), ("dead", f"{s.dead:,}"),
                        ("oldest", format_duration(s.oldest_unacked_age_ms) + " unacked" if s.oldest_unacked_age_ms
                         else "-")):
        print(f"{name + ':':14}{value}")
    return EXIT_OK


# ---------------------------------------------------------------------------------------- stats / schedule

@_command
def cmd_stats(args: argparse.Namespace, client: Client) -> int:
    s = client.stats()
    if args.json:
        _print_json(s.to_dict())
        return EXIT_OK
    lat = s.lateness_ms
    for name, value in (("scheduled", f"{s.scheduled:,}"), ("produced", f"{s.produced_total:,}"),
                        ("delivered", f"{s.delivered_total:,}"), ("cancelled", f"{s.cancelled_total:,}"),
                        ("lateness", f"p50 {lat.get('p50', 0)} ms  p99 {lat.get('p99', 0)} ms  "
                                     f"max {lat.get('max', 0)} ms"),
                        ("disk", format_bytes(s.disk_bytes))):
        print(f"{name:<11}{value}")
    if s.topics:
        print()
        print(table(["topic", "scheduled", "delivered"],
                    [(n, int(t.get("scheduled", 0)), int(t.get("delivered_total", 0)))
                     for n, t in sorted(s.topics.items())]))
    if s.groups:
        print()
        print(table(["group", "backlog", "inflight", "dead"],
                    [(n, int(g.get("backlog", 0)), int(g.get("inflight", 0)), int(g.get("dead", 0)))
                     for n, g in sorted(s.groups.items())]))
    if s.pipeline:
        print()
        print("pipeline  " + "  ".join(f"{k}={v}" for k, v in s.pipeline.items()))
    if len(s.shards) > 1:
        print()
        print(table(["shard", "scheduled", "delivered", "disk"],
                    [(n, sh.scheduled, sh.delivered_total, format_bytes(sh.disk_bytes))
                     for n, sh in s.shards.items()]))
    return EXIT_OK


@_command
def cmd_schedule(args: argparse.Namespace, client: Client) -> int:
    span_ms = round(args.hours * 3_600_000)
    if span_ms <= 0:
        raise ValueError("--hours must be > 0")
    start = args.start if args.start is not None else now_ms()
    if args.step is None:
        # Exactly --buckets lines: the step is the span over the count, and with --align the window
        # starts at the step boundary at or before the start (lines read 10:00, 11:00, ...).
        step_ms = max(1, -(-span_ms // args.buckets))
        if args.align:
            start -= start % step_ms
        end = start + args.buckets * step_ms
    else:
        step_ms = args.step
        end = start + span_ms
        if args.align:
            # Round the window outwards to whole steps, so it covers all of the span.
            start -= start % step_ms
            end += -end % step_ms
    buckets = client.schedule(start, end, step_ms)
    if args.json:
        _print_json({"from": start, "to": end, "step_ms": step_ms,
                     "buckets": [[b.start_ms, b.count] for b in buckets]})
        return EXIT_OK
    total = sum(b.count for b in buckets)
    print(f"{total:,} pending message(s) due in the next {format_duration(span_ms)} "
          f"({format_duration(step_ms)} per line)")
    print(histogram(buckets, step_ms))
    return EXIT_OK


# ---------------------------------------------------------------------------------------- cluster

def _lag(m: dict[str, Any]) -> str:
    parts = []
    if isinstance(m.get("lag_ms"), int):
        parts.append(format_duration(m["lag_ms"]))
    if isinstance(m.get("lag_bytes"), int):
        parts.append(format_bytes(m["lag_bytes"]))
    return " / ".join(parts) or "-"


def _print_cluster(name: str, view: dict[str, Any]) -> None:
    if view.get("replication") is False:
        print(f"shard {view.get('shard', name)}: replication off (a single daemon; it is its own primary)")
        return
    primary = view.get("primary")
    isr = view.get("isr") or {}
    me = view.get("self") or {}
    print(f"shard {view.get('shard', name)}  epoch {view.get('epoch', '-')}  primary "
          + (f"{primary.get('member')} {primary.get('url')} (epoch {primary.get('epoch')})"
             if isinstance(primary, dict) else "none (an election is under way, or no in-sync member is up)"))
    print(f"in sync: {', '.join(isr.get('members') or []) or '-'} (set written in epoch {isr.get('epoch', '-')})")
    members = [m for m in view.get("members") or [] if isinstance(m, dict)]
    if members:
        print(table(["member", "url", "role", "in sync", "registered", "lag"],
                    [(m.get("member", "?"), m.get("url", "?"), m.get("role", "?"),
                      "yes" if m.get("in_sync") else "no", "yes" if m.get("registered") else "no", _lag(m))
                     for m in members]))
    if me:
        fence = me.get("fence_left_ms")
        print(f"answered by {me.get('member', '?')} ({me.get('role', '?')}, epoch {me.get('epoch', '-')}"
              + (f", may acknowledge for {fence} ms" if me.get("may_acknowledge") and fence is not None else "")
              + ")")


@_command
def cmd_cluster(args: argparse.Namespace, client: Client) -> int:
    views = client.cluster()
    if args.json:
        _print_json(views)
        return EXIT_OK
    for i, (name, view) in enumerate(views.items()):
        if i:
            print()
        _print_cluster(name, view)
    return EXIT_OK


# ---------------------------------------------------------------------------------------- ls

@_command
def cmd_ls(args: argparse.Namespace, client: Client) -> int:
    limit = None if args.all else args.limit
    page_size = min(1000, limit or 1000)
    shown, truncated, header = 0, False, True
    for page in client.list(args.topic, from_ms=args.start, to_ms=args.end, page_size=page_size, body=args.body):
        batch = page.messages if limit is None else page.messages[:limit - shown]
        truncated = limit is not None and (len(batch) < len(page.messages) or page.cursor is not None)
        if args.json:
            for m in batch:
                out: dict[str, Any] = {k: v for k, v in m.__dict__.items() if k != "body"}
                if m.body is not None:
                    out.update(_body_json(m.body))
                _print_json(out)
        elif batch:
            rows = [(format_time(m.deliver_at), format_relative(m.deliver_at), m.id, m.topic, m.key or "-",
                     m.tag or "-", format_bytes(m.body_size)) + ((_body_human(m.body, 60),) if m.body is not None
                                                                   else ()) for m in batch]
            text = table(["due", "in", "id", "topic", "key", "tag", "size"] + (["body"] if args.body else []), rows)
            print(text if header else text.split("\n", 1)[1], flush=True)
            header = False
        shown += len(batch)
        if limit is not None and shown >= limit:
            break
    if not args.json:
        if not shown:
            print("nothing pending" + (f" in {args.topic}" if args.topic else ""))
        elif truncated:
            _err(f"showing the first {shown:,}; more are pending (--limit N, or --all)")
    return EXIT_OK


# ---------------------------------------------------------------------------------------- parsers

def _duration(text: str) -> int:
    try:
        return parse_duration_ms(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _time(text: str) -> int:
    try:
        return parse_time_ms(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def _tags(text: str) -> list[str]:
    return [t for t in text.split(",") if t]


def register(subparsers: Any) -> None:
    """Add the client commands (send ... schedule) to an argparse subparsers object."""
    common = _common()

    p = subparsers.add_parser("send", parents=[common], help="produce a message (or a JSON-lines file of them)",
                              description="Produce one message, or every line of a JSON-lines file (each line a "
                              "message object as in the HTTP API: body or body_b64, delay_ms or deliver_at, "
                              "key, tag, headers, replace).")
    p.add_argument("topic")
    p.add_argument("body", nargs="?", help="message body; '-' reads stdin")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--delay", type=_duration, help="due after this long: 500ms, 30s, 5m, 2h, 1d, 1h30m")
    when.add_argument("--at", type=_time, help="due at this time: ISO 8601 (local if no zone) or epoch ms")
    p.add_argument("--key", help="business key (idempotent produce; cancel by key)")
    p.add_argument("--tag")
    p.add_argument("--header", action="append", metavar="NAME=VALUE")
    p.add_argument("--replace", action="store_true", help="reschedule the pending message with this key")
    p.add_argument("--file", "-f", metavar="F", help="JSON-lines file of messages ('-' for stdin)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")
    p.set_defaults(func=cmd_send)

    for name, fn, text in (("cancel", cmd_cancel, "cancel a pending message"),
                           ("get", cmd_get, "show a message")):
        p = subparsers.add_parser(name, parents=[common], help=text)
        p.add_argument("id", nargs="?", help="message id")
        p.add_argument("--topic")
        p.add_argument("--key", help="address the pending message of --topic with this key instead of an id")
        p.set_defaults(func=fn)

    p = subparsers.add_parser("consume", parents=[common], help="print or process due messages",
                              description="Pull messages of a subscription group and print them (ack after "
                              "printing), or run --exec CMD per message with the body on stdin: exit 0 acks, "
                              "anything else nacks.")
    p.add_argument("topic")
    p.add_argument("group")
    p.add_argument("--exec", metavar="CMD", help="shell command per message; env DELAYD_ID, DELAYD_KEY, ...")
    p.add_argument("--exec-timeout", type=float, default=None, metavar="S", help="kill CMD after S seconds")
    p.add_argument("--concurrency", "-c", type=_positive, default=1)
    p.add_argument("--lease", type=_duration, default=30_000, help="lease per message (default 30s)")
    p.add_argument("--wait", type=_duration, default=1_000, help="long-poll wait (default 1s)")
    p.add_argument("--tags", type=_tags, help="only these tags (comma-separated)")
    p.add_argument("--retry-delay", type=_duration, default=None,
                   help="nack delay on failure (default: the broker's exponential backoff)")
    p.add_argument("--count", "-n", type=_positive, default=None, help="exit after N messages")
    p.add_argument("--idle-exit", type=_duration, default=None, metavar="DURATION",
                   help="exit once nothing has arrived for this long")
    p.add_argument("--create", choices=["earliest", "latest"], default=None,
                   help="create/update the group starting here first")
    p.add_argument("--max-attempts", type=_positive, default=None, help="set the group's max_attempts first")
    p.add_argument("--quiet", "-q", action="store_true", help="no per-message status lines with --exec")
    p.set_defaults(func=cmd_consume)

    p = subparsers.add_parser("subscribe", parents=[common], help="create, show or delete a subscription group",
                              description="create: create the group (or change its settings) and show it; "
                              "show: its settings and counts (never creates it); delete: remove it with its "
                              "position and dead letters (needs the admin right).")
    p.add_argument("action", choices=["create", "show", "delete"])
    p.add_argument("topic")
    p.add_argument("group")
    p.add_argument("--start", choices=["earliest", "latest"], default=None,
                   help="create: where a new group starts (default earliest)")
    p.add_argument("--max-attempts", type=_positive, default=None, help="create: deliveries before dead letters")
    p.set_defaults(func=cmd_subscribe)

    p = subparsers.add_parser("ack", parents=[common], help="acknowledge pulled messages by receipt")
    p.add_argument("topic")
    p.add_argument("group")
    p.add_argument("receipts", nargs="+", metavar="RECEIPT")
    p.set_defaults(func=cmd_ack)

    p = subparsers.add_parser("dead", parents=[common], help="list a group's dead letters")
    p.add_argument("topic")
    p.add_argument("group")
    p.add_argument("--limit", type=_positive, default=100, help="at most this many (default 100)")
    p.set_defaults(func=cmd_dead)

    p = subparsers.add_parser("redrive", parents=[common], help="re-queue dead letters for delivery",
                              description="Re-queue the dead letters with these ids, or all of them (--all).")
    p.add_argument("topic")
    p.add_argument("group")
    p.add_argument("ids", nargs="*", metavar="ID")
    p.add_argument("--all", action="store_true", help="every dead letter of the group")
    p.set_defaults(func=cmd_redrive)

    p = subparsers.add_parser("ls", parents=[common], help="list pending messages in due order",
                              description="List pending messages in due order: of one TOPIC, or of every topic "
                              "(needs the admin right). Pages through the API's cursor.")
    p.add_argument("topic", nargs="?", help="only this topic (default: every topic)")
    p.add_argument("--from", dest="start", type=_time, default=None, metavar="TIME",
                   help="due at or after this time (ISO 8601 or epoch ms)")
    p.add_argument("--to", dest="end", type=_time, default=None, metavar="TIME", help="due at or before this time")
    p.add_argument("--limit", "-n", type=_positive, default=100, help="show at most N (default 100)")
    p.add_argument("--all", action="store_true", help="show every pending message")
    p.add_argument("--body", action="store_true", help="fetch and show bodies too")
    p.set_defaults(func=cmd_ls)

    p = subparsers.add_parser("stats", parents=[common], help="counters, lateness, backlog")
    p.set_defaults(func=cmd_stats)

    p = subparsers.add_parser("cluster", parents=[common], help="members, roles, epoch and lag of each shard",
                              description="GET /v1/cluster of each shard: its primary and epoch, the in-sync "
                              "set, and each member's role, registration and lag (replicated shards); a "
                              "daemon without replication says so.")
    p.set_defaults(func=cmd_cluster)

    p = subparsers.add_parser("schedule", parents=[common], help="histogram of what falls due",
                              description="How many pending messages fall due over the next N hours.")
    p.add_argument("--hours", type=float, default=24.0, help="how far ahead (default 24)")
    p.add_argument("--buckets", type=_positive, default=24, help="number of lines (default 24)")
    p.add_argument("--step", type=_duration, default=None, help="bucket width instead of --buckets")
    p.add_argument("--start", type=_time, default=None, help="start instead of now")
    p.add_argument("--align", action=argparse.BooleanOptionalAction, default=True,
                   help="align buckets to multiples of the step (default on)")
    p.set_defaults(func=cmd_schedule)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="delayd", description="delayd client commands")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register(subparsers)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
