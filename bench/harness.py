"""The benchmark's measuring tools: child-process bookkeeping, CPU/RSS of a server process,
py-spy profiles, how busy the rest of the machine was, timing and lateness statistics.

Nothing here knows about delayd or Redis; `bench.peers` builds the two systems on top of it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import gc
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

try:
    import psutil
except ImportError:  # pragma: no cover - the CLI says to run bench/install_peer.sh
    psutil = None

# ----------------------------------------------------------------------------------------------
# Time and logging
# ----------------------------------------------------------------------------------------------


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def now_ms_f() -> float:
    return time.time_ns() / 1e6


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------
# Statistics
# ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The measuring client's own garbage collector off while it times deliveries (collected
    first, on again after): its full collections took 26-77 ms here, with what a client holds
    (a burst's million ids), and each showed up as lateness of whichever server was measured."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def percentile(sorted_vals: list[float], p: float) -> float | None:
    if not sorted_vals:
        return None
    k = (len(sorted_vals) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    if lo == hi:
        return float(sorted_vals[lo])
    return float(sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo))


def lateness_summary(lat: list[float]) -> dict[str, Any]:
    s = sorted(lat)
    return {
        "count": len(s),
        "early": sum(1 for x in s if x < 0),
        "min_ms": s[0] if s else None,
        "p50_ms": percentile(s, 50),
        "p90_ms": percentile(s, 90),
        "p99_ms": percentile(s, 99),
        "p999_ms": percentile(s, 99.9),
        "max_ms": s[-1] if s else None,
        "mean_ms": (sum(s) / len(s)) if s else None,
    }


def lateness_shape(pairs: list[tuple[int, float]], late_ms: float = 10.0) -> dict[str, Any]:
    """Where the late ones are: by position of deliver_at inside its wall-clock second (100 ms
    buckets: slot-boundary effects with a 1 s wheel precision show up in bucket 0), and the
    worst 100 ms windows of deliver_at."""
    by_pos = [0] * 10
    windows: dict[int, list[float]] = {}
    for due, lat in pairs:
        if lat > late_ms:
            by_pos[(due % 1000) // 100] += 1
            windows.setdefault(due // 100 * 100, []).append(lat)
    worst = sorted(windows.items(), key=lambda kv: -max(kv[1]))[:8]
    return {
        "late_threshold_ms": late_ms,
        "late_count": sum(by_pos),
        "late_by_ms_in_second_100ms_buckets": by_pos,
        "worst_windows": [{"deliver_at_from": w, "late_msgs": len(v), "max_ms": max(v)} for w, v in worst],
    }


def us_per_msg(cpu_s: float, messages: int) -> float | None:
    """CPU microseconds per message (the unit the speed targets are stated in)."""
    return cpu_s * 1e6 / messages if messages else None


# ----------------------------------------------------------------------------------------------
# Load generation
# ----------------------------------------------------------------------------------------------


class Bodies:
    """A pool of distinct random 100-byte bodies, cycled (content is irrelevant; no compression)."""

    def __init__(self, size: int, pool: int = 4096, seed: int = 5) -> None:
        rnd = random.Random(seed)
        self.pool = [rnd.randbytes(size) for _ in range(pool)]
        self.size = size

    def __getitem__(self, i: int) -> bytes:
        return self.pool[i % len(self.pool)]


async def run_workers(
    n_items: int, batch: int, workers: int, fn: Callable[[int, int], Awaitable[None]]
) -> None:
    """Run fn(start, count) over [0, n_items) in batches, `workers` at a time."""
    next_start = 0

    async def worker() -> None:
        nonlocal next_start
        while next_start < n_items:
            start = next_start
            count = min(batch, n_items - start)
            next_start += count
            await fn(start, count)

    await asyncio.gather(*(worker() for _ in range(workers)))


# ----------------------------------------------------------------------------------------------
# Child processes: every server the benchmark starts is registered here and stopped at exit,
# also on Ctrl-C, SIGTERM or an exception.
# ----------------------------------------------------------------------------------------------


class Stoppable(Protocol):
    def stop(self) -> None: ...


_CHILDREN: list[Stoppable] = []
_SPIES: list[PySpy] = []


def track(child: Stoppable) -> None:
    if child not in _CHILDREN:
        _CHILDREN.append(child)


def untrack(child: Stoppable) -> None:
    if child in _CHILDREN:
        _CHILDREN.remove(child)


def stop_all_children() -> None:
    # Profilers first: py-spy writes its output only when it is stopped while its target lives.
    for spy in list(_SPIES):
        with contextlib.suppress(Exception):
            spy.stop()
    for child in list(_CHILDREN):
        with contextlib.suppress(Exception):
            child.stop()


atexit.register(stop_all_children)


def terminate(proc: subprocess.Popen[bytes] | None, timeout_s: float = 20.0) -> None:
    """SIGTERM, then SIGKILL if it does not exit within `timeout_s`."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


class ProcessMeter:
    """CPU and memory of one server process, from the kernel's view (psutil, /proc).

    Whether forked children count: yes for the daemon (helpers are part of it); no for redis,
    whose only children are copy-on-write fork snapshots (AOF rewrite) sharing its pages. CPU
    always includes children, RSS only when `rss_includes_children`.
    """

    def __init__(self, pid: Callable[[], int | None], rss_includes_children: bool) -> None:
        self._pid = pid
        self.rss_includes_children = rss_includes_children

    def _procs(self) -> list[Any]:
        pid = self._pid()
        if pid is None or psutil is None:
            return []
        try:
            p = psutil.Process(pid)
        except psutil.Error:
            return []
        try:
            return [p, *p.children(recursive=True)]
        except psutil.Error:
            return [p]

    def cpu_split(self) -> tuple[float, float]:
        """(user, system) CPU seconds the server has used since it started."""
        user = system = 0.0
        for p in self._procs():
            with contextlib.suppress(Exception):
                t = p.cpu_times()
                user += t.user
                system += t.system
        return user, system

    def rss_bytes(self) -> int:
        procs = self._procs() if self.rss_includes_children else self._procs()[:1]
        total = 0
        for p in procs:
            with contextlib.suppress(Exception):
                total += p.memory_info().rss
        return total

    def vm_status(self) -> dict[str, int]:
        """VmRSS / VmHWM / RssAnon / RssFile of the main process from /proc (bytes)."""
        out: dict[str, int] = {}
        pid = self._pid()
        if pid is None:
            return out
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                    out[key] = int(rest.split()[0]) * 1024
        except (OSError, ValueError):
            pass
        return out


async def sample_rss(meter: ProcessMeter, seconds: float) -> int:
    """Max RSS over a short window (the number we report is the settled, not the instant, one)."""
    best = meter.rss_bytes()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        await asyncio.sleep(0.1)
        best = max(best, meter.rss_bytes())
    return best


def dir_bytes(path: Path) -> int:
    """Disk blocks used under `path` (what the files really take, not their apparent size)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(dirpath, f)).st_blocks * 512
    return total


class CpuWindow:
    """Wall time, client CPU and server CPU over a phase: `with CpuWindow(meter) as cpu: ...`."""

    def __init__(self, server: ProcessMeter) -> None:
        self.server = server

    def __enter__(self) -> CpuWindow:
        self.t0 = time.perf_counter()
        self.c0 = time.process_time()
        self.u0, self.k0 = self.server.cpu_split()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self.t0
        self.client_cpu_s = time.process_time() - self.c0
        user, system = self.server.cpu_split()
        self.server_sys_s = system - self.k0
        self.server_cpu_s = user - self.u0 + self.server_sys_s

    def as_dict(self) -> dict[str, float]:
        return {"wall_s": self.wall_s, "client_cpu_s": self.client_cpu_s, "server_cpu_s": self.server_cpu_s,
                "server_sys_s": self.server_sys_s}


# ----------------------------------------------------------------------------------------------
# The rest of the machine: other processes compete for the same cores, so say how much they took.
# ----------------------------------------------------------------------------------------------


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores), from /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        v = [int(x) for x in fields]
        # user nice system irq softirq steal
        busy = v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)
        return busy / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def own_cpu_s() -> float:
    """CPU seconds of this process plus every child it has reaped (the servers, once stopped)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


async def run_side(name: str, side: str, coro: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """Run one workload against one system; a failure becomes {"error": ...} and never sinks the
    run. Adds `env`: how much CPU other processes on the machine took meanwhile."""
    log(f"{name}: {side} ...")
    t0 = time.perf_counter()
    m0, o0 = machine_busy_s(), own_cpu_s()
    try:
        res = await coro
    except Exception as e:  # noqa: BLE001 - one failure (timeouts included) must not sink the run
        log(f"{name}: {side} FAILED: {e!r}")
        res = {"error": f"{type(e).__name__}: {e}"[:4000]}
    wall = time.perf_counter() - t0
    other = max(0.0, (machine_busy_s() - m0) - (own_cpu_s() - o0))
    share = other / (wall * (os.cpu_count() or 1)) if wall > 0 else 0.0
    res["env"] = {
        "wall_s": wall,
        "other_processes_cpu_s": other,
        "other_processes_cpu_share_pct": 100 * share,
        "loadavg_end": os.getloadavg()[0],
    }
    log(f"{name}: {side} done in {wall:.1f}s (other processes used {100 * share:.0f}% of the machine)")
    if share > 0.05:
        log(f"WARNING: {name}/{side}: other processes used {100 * share:.0f}% of the CPU; numbers are disturbed")
    return res


# ----------------------------------------------------------------------------------------------
# py-spy profiles of a server process
# ----------------------------------------------------------------------------------------------

_LINENO = re.compile(r":\d+\)$")
PROFILES: dict[str, dict[str, Any]] = {}  # summaries of every profile taken, by file stem


class PySpy:
    """`py-spy record --format raw` attached to one pid; collapsed stacks for summarize_profile()."""

    def __init__(self, pid: int, out: Path) -> None:
        self.out = out
        exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        cmd = [exe, "record", "--pid", str(pid), "--format", "raw", "--rate", "100", "--nonblocking",
               "--subprocesses", "--output", str(out)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        _SPIES.append(self)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self in _SPIES:
            _SPIES.remove(self)


class Profiler:
    """The py-spy recordings of one server: DIR/<tag>.txt for its first process, <tag>-1.txt
    after a restart, and a file of its own for each named phase. Does nothing when DIR is None."""

    def __init__(self, out_dir: Path | None, tag: str) -> None:
        self.out_dir = out_dir
        self.tag = tag
        self.spies: list[PySpy] = []
        self.files: list[Path] = []

    def attach(self, pid: int) -> None:
        """A new server process: record it into the next file of this server."""
        self._record(pid, self.tag + ("" if not self.files else f"-{len(self.files)}"))

    def phase(self, pid: int, tag: str) -> None:
        """From now on, record into DIR/<tag>.txt (e.g. only the drain of a burst)."""
        self.pause()
        self._record(pid, tag)

    def pause(self) -> None:
        for spy in self.spies:
            spy.stop()
        self.spies.clear()

    def finish(self) -> None:
        """Stop recording and put every file's summary into PROFILES."""
        self.pause()
        for path in self.files:
            if path.stem not in PROFILES:
                PROFILES[path.stem] = summarize_profile(path)

    def _record(self, pid: int, name: str) -> None:
        if self.out_dir is None:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        out = self.out_dir / f"{name}.txt"
        self.files.append(out)
        self.spies.append(PySpy(pid, out))


def summarize_profile(path: Path, top: int = 25) -> dict[str, Any]:
    """Self and inclusive sample shares per frame ("func (file:line)") from a collapsed-stack file."""
    total = 0
    self_c: dict[str, int] = {}
    incl_c: dict[str, int] = {}
    self_fn: dict[str, int] = {}  # self samples per function (line numbers dropped)
    incl_fn: dict[str, int] = {}
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return {"error": f"no profile at {path}"}
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        frames = stack.split(";")
        total += c
        self_c[frames[-1]] = self_c.get(frames[-1], 0) + c
        for f in set(frames):
            incl_c[f] = incl_c.get(f, 0) + c
        fns = [_LINENO.sub(")", f) for f in frames]
        self_fn[fns[-1]] = self_fn.get(fns[-1], 0) + c
        for f in set(fns):
            incl_fn[f] = incl_fn.get(f, 0) + c

    def topn(d: dict[str, int]) -> list[list[Any]]:
        return [[f, round(100 * c / total, 1)] for f, c in sorted(d.items(), key=lambda kv: -kv[1])[:top]]

    return {
        "file": str(path),
        "samples": total,
        "self_pct": topn(self_c),
        "self_by_function_pct": topn(self_fn),
        "inclusive_by_function_pct": topn(incl_fn),
        "inclusive_pct": topn(incl_c),
    }
