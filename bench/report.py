"""What a run leaves behind: the comparison table (stdout, Markdown), the JSON with every raw
number, and the run's metadata (machine, command, versions).

The table has one row per (workload, metric): delayd, redis, the ratio delayd/redis, and the
design target with PASS/MISS where there is one. Each workload adds its own rows (`rows(table)`).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from bench.harness import PROFILES, log

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("delayd", "redis")


def fmt(v: Any, unit: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if unit == "MB":
        return f"{v / 1e6:,.1f}"
    if isinstance(v, float):
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.2f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


class Table:
    """Rows of (workload, metric, unit, delayd, redis, ratio, target, pass) from the results."""

    def __init__(self, results: dict[str, Any]) -> None:
        self.results = results
        self.rows: list[dict[str, Any]] = []

    def has(self, section: str) -> bool:
        return section in self.results

    def get(self, section: str, side: str, key: str) -> Any:
        """results[section][side][key], where key may be dotted ("drain.server_cpu_s")."""
        v = self.results.get(section, {}).get(side, {})
        for part in key.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        return v

    def either(self, section: str, key: str) -> Any:
        """The delayd value, or the redis one when delayd has none (e.g. the size of a run)."""
        return self.get(section, "delayd", key) or self.get(section, "redis", key)

    def row(
        self,
        section: str,
        metric: str,
        unit: str,
        key: str,
        target: str = "",
        check: Callable[[Any, Any], bool] | None = None,
        rkey: str | None = None,
    ) -> None:
        """A row comparing `key` (redis: `rkey`, when it differs); `check(delayd, redis)` says
        whether delayd meets `target`."""
        dv, rv = self.get(section, "delayd", key), self.get(section, "redis", rkey or key)
        ok = None
        if check is not None and dv is not None:
            try:
                ok = bool(check(dv, rv))
            except TypeError:
                ok = None
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (dv, rv))
        ratio = dv / rv if numeric and rv else None
        self.rows.append(
            {
                "workload": section,
                "metric": metric,
                "unit": unit,
                "delayd": dv,
                "redis": rv,
                "ratio": ratio,
                "target": target,
                "pass": ok,
            }
        )


class HasRows(Protocol):
    def rows(self, t: Table) -> None: ...


def table_rows(results: dict[str, Any], workloads: Iterable[HasRows], sections: Iterable[str]) -> list[dict[str, Any]]:
    """Every workload's rows, then how disturbed each section's run was."""
    t = Table(results)
    for wl in workloads:
        wl.rows(t)
    for section in sections:
        if t.has(section):
            t.row(section, "other processes' CPU share during the run", "%", "env.other_processes_cpu_share_pct")
    return t.rows


def render_table(rows: list[dict[str, Any]], markdown: bool = False) -> str:
    head = ["workload", "metric", "unit", "delayd", "redis", "delayd/redis", "target", "ok"]
    body = []
    for r in rows:
        ok = "" if r["pass"] is None else ("PASS" if r["pass"] else "MISS")
        body.append(
            [
                r["workload"],
                r["metric"],
                r["unit"],
                fmt(r["delayd"], r["unit"]),
                fmt(r["redis"], r["unit"]),
                "-" if r["ratio"] is None else f"{r['ratio']:.2f}",
                r["target"],
                ok,
            ]
        )
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(c for c in b) + " |" for b in body]
        return "\n".join(lines)
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    fmt_line = "  ".join(f"{{:<{w}}}" if i < 3 else f"{{:>{w}}}" for i, w in enumerate(widths))
    lines = [fmt_line.format(*head), fmt_line.format(*("-" * w for w in widths))]
    lines += [fmt_line.format(*b) for b in body]
    return "\n".join(lines)


def render_section(out: dict[str, Any]) -> str:
    """A Markdown block for BENCHMARKS.md: machine, command, table, disturbance."""
    meta = out["meta"]
    m = meta["machine"]
    mem = f"{m['mem_total_bytes'] / 2**30:.1f} GiB" if m.get("mem_total_bytes") else "?"
    lines = [
        f"Run {meta['started_at']} (git {meta.get('git_rev') or '-'}, {meta['duration_s']:.0f} s): "
        f"{m['nproc']} CPUs ({m['cpu_model']}), {mem} RAM, Linux {m['kernel']}, Python {m['python']}, "
        f"{(meta.get('redis_server') or '').split(' sha=')[0]}, redis-py {meta.get('redis_py')}, client loop "
        f"{meta.get('client_loop')}.",
        "",
        "```",
        meta["command"] if isinstance(meta["command"], str) else " ".join(meta["command"]),
        "```",
        "",
        render_table(out["table"], markdown=True),
    ]
    if out.get("errors"):
        lines += ["", "Errors: " + "; ".join(f"{k}: {v.splitlines()[0]}" for k, v in out["errors"].items())]
    return "\n".join(lines) + "\n"


def errors_of(results: dict[str, Any]) -> dict[str, str]:
    """{"workload/side": error} for every side that failed."""
    return {
        f"{wl}/{side}": r["error"]
        for wl, sides in results.items()
        for side, r in sides.items()
        if isinstance(r, dict) and "error" in r
    }


def publish(
    results: dict[str, Any],
    meta: dict[str, Any],
    rows: list[dict[str, Any]],
    *,
    markdown: bool,
    json_path: str | None,
    markdown_out: str | None,
) -> dict[str, str]:
    """Print the table, errors and profile hot spots; write the JSON and Markdown files.
    Returns the errors."""
    out: dict[str, Any] = {"meta": meta, "table": rows, "results": results}
    if rows:
        print()
        print(render_table(rows))
        if markdown:
            print()
            print(render_table(rows, markdown=True))
    errors = errors_of(results)
    for k, e in errors.items():
        print(f"ERROR {k}: {e.splitlines()[0] if e else e}", file=sys.stderr)
    out["errors"] = errors
    if PROFILES:
        out["profiles"] = PROFILES
        for name, prof in PROFILES.items():
            print(f"\npy-spy {name}: {prof.get('samples', 0)} samples, top self:")
            for frame, pct in prof.get("self_pct", [])[:12]:
                print(f"  {pct:5.1f}%  {frame}")
    if json_path:
        jp = Path(json_path)
        jp.parent.mkdir(parents=True, exist_ok=True)
        jp.write_text(json.dumps(out, indent=2, default=str) + "\n")
        log(f"results written to {jp}")
    if markdown_out:
        Path(markdown_out).write_text(render_section(out))
        log(f"markdown written to {markdown_out}")
    return errors


# ----------------------------------------------------------------------------------------------
# The run's metadata
# ----------------------------------------------------------------------------------------------


def display_python() -> str:
    exe = Path(sys.executable)
    try:
        return str(exe.relative_to(ROOT))
    except ValueError:
        return exe.name


def machine_info() -> dict[str, Any]:
    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    mem_total = None
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_total = int(line.split()[1]) * 1024
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model,
        "mem_total_bytes": mem_total,
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def git_rev() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
