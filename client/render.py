"""Parsing and drawing for the command line: durations, times, tables, histograms, progress."""

from __future__ import annotations

import re
import shutil
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import IO, Any

from delayd.client.codec import from_epoch_ms, to_epoch_ms
from delayd.client.models import ScheduleBucket

_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_EIGHTHS = " ▏▎▍▌▋▊▉"


def parse_duration_ms(text: str) -> int:
    """`1500` (ms), `250ms`, `30s`, `5m`, `2h`, `1d`, or combinations such as `1h30m`."""
    text = text.strip().lower()
    if re.fullmatch(r"\d+", text):
        return int(text)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"bad duration {text!r} (examples: 500ms, 30s, 5m, 2h, 1d, 1h30m)")
    return round(sum(float(n) * _UNIT_MS[u] for n, u in parts))


def parse_time_ms(text: str) -> int:
    """Epoch milliseconds, or an ISO 8601 time (a time without zone is local time)."""
    text = text.strip()
    if re.fullmatch(r"\d+", text):
        return int(text)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"bad time {text!r}: give epoch ms or ISO 8601 like 2030-01-31T09:00:00+01:00") \
            from None
    if when.tzinfo is None:
        when = when.astimezone()  # the machine's local zone
    return to_epoch_ms(when)


def format_time(ms: int | None) -> str:
    """Local time with milliseconds, e.g. `2030-01-31 09:00:00.000`."""
    if ms is None:
        return "-"
    return from_epoch_ms(ms).astimezone().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def format_relative(ms: int, now_ms: int | None = None) -> str:
    """`in 4m 30s` / `2h ago`."""
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    delta = ms - now_ms
    text = format_duration(abs(delta))
    return f"in {text}" if delta >= 0 else f"{text} ago"


def format_duration(ms: int) -> str:
    if ms < 1_000:
        return f"{ms}ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    out = []
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        n, seconds = divmod(seconds, size)
        if n >= 1:
            out.append(f"{int(n)}{unit}")
    return " ".join(out[:2])


def format_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to fit; numbers right-aligned."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(isinstance(row[i], int | float) for row in rows) if rows else False
               for i in range(len(headers))]
    lines = []
    for r in cells:
        lines.append("  ".join(c.rjust(w) if num else c.ljust(w)
                               for c, w, num in zip(r, widths, numeric, strict=True)).rstrip())
    return "\n".join(lines)


def _cell(v: Any) -> str:
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def _unicode_ok(stream: IO[str]) -> bool:
    encoding = (getattr(stream, "encoding", None) or "").lower()
    return encoding.replace("-", "") in ("utf8", "utf16", "utf32")


def bar(value: float, scale: float, width: int, unicode: bool = True) -> str:
    """A horizontal bar of `value / scale * width` cells, in eighths when unicode is available."""
    if scale <= 0 or value <= 0:
        return ""
    cells = value / scale * width
    if not unicode:
        return "#" * max(1, round(cells))
    full = int(cells)
    rest = int((cells - full) * 8)
    out = "█" * full + (_EIGHTHS[rest] if rest else "")
    return out or "▏"  # a non-zero count always shows


def _bucket_label(ms: int, step_ms: int) -> str:
    local = from_epoch_ms(ms).astimezone()
    if step_ms < 60_000:
        return local.strftime("%m-%d %H:%M:%S")
    if step_ms < 86_400_000:
        return local.strftime("%m-%d %H:%M")
    return local.strftime("%Y-%m-%d")


def histogram(buckets: Sequence[ScheduleBucket], step_ms: int, *, width: int | None = None,
              unicode: bool | None = None) -> str:
    """One line per bucket: local start time, a bar, the count."""
    if not buckets:
        return "(no buckets)"
    if unicode is None:
        unicode = _unicode_ok(sys.stdout)
    width = width or shutil.get_terminal_size((100, 24)).columns
    labels = [_bucket_label(b.start_ms, step_ms) for b in buckets]
    counts = [f"{b.count:,}" for b in buckets]
    label_w, count_w = max(map(len, labels)), max(map(len, counts))
    bar_w = max(10, width - label_w - count_w - 4)
    peak = max(b.count for b in buckets)
    sep = "│" if unicode else "|"
    return "\n".join(f"{lbl.ljust(label_w)} {sep}{bar(b.count, peak, bar_w, unicode).ljust(bar_w)} "
                     f"{cnt.rjust(count_w)}" for lbl, cnt, b in zip(labels, counts, buckets, strict=True))


class Progress:
    """`sending [#####.....] 45% 4,500/10,000 3,120 msg/s` redrawn in place on a terminal."""

    def __init__(self, total: int, stream: IO[str] | None = None, enabled: bool | None = None,
                 label: str = "sending") -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label = label
        self.started = time.monotonic()
        self.done = 0
        self._drawn_at = 0.0

    def update(self, done: int, force: bool = False) -> None:
        self.done = done
        now = time.monotonic()
        if not self.enabled or (not force and now - self._drawn_at < 0.1 and done < self.total):
            return
        self._drawn_at = now
        fraction = done / self.total if self.total else 1.0
        width = 30
        filled = int(fraction * width)
        rate = done / max(now - self.started, 1e-6)
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {fraction:4.0%} "
                          f"{done:,}/{self.total:,} {rate:,.0f} msg/s")
        self.stream.flush()

    def finish(self) -> None:
        if self.enabled:
            self.update(self.done, force=True)
            self.stream.write("\n")
            self.stream.flush()


def now_ms() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)
