"""The client commands of the `delayd` CLI, run through `client.cli.main` against the fake broker."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
from delayd.client.cli import main
from delayd.client.models import ScheduleBucket
from delayd.client.render import bar, format_duration, histogram, parse_duration_ms, parse_time_ms

from tests.client.fakebroker import FakeBroker, ReplicaSet
from tests.support.daemon import free_port


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_send_one_and_get_it(fake: FakeBroker, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "send", "orders", "hello", "--delay", "1h", "--key", "o-1", "--tag", "t",
                       "--header", "a=b", "--url", fake.url, "--json")
    assert code == 0
    sent = json.loads(out)
    assert sent["id"] == "d-1" and not sent["duplicate"]
    assert abs(sent["deliver_at"] - (time.time() * 1000 + 3_600_000)) < 60_000
    assert fake.messages["d-1"].headers == {"a": "b"}

    code, out, _ = run(capsys, "get", "d-1", "--url", fake.url)
    assert code == 0 and "hello" in out and "o-1" in out and "scheduled" in out and "in 59m" in out
    code, out, _ = run(capsys, "get", "--topic", "orders", "--key", "o-1", "--url", fake.url, "--json")
    assert json.loads(out)["body"] == "hello" and json.loads(out)["state"] == "scheduled"

    code, out, _ = run(capsys, "send", "orders", "again", "--key", "o-1", "--url", fake.url)
    assert code == 0 and "duplicate" in out


def test_env_url_and_stdin_body(fake: FakeBroker, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DELAYD_URL", fake.url)
    monkeypatch.setenv("DELAYD_TOKEN", "tok")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"\xff from stdin")))
    code, out, err = run(capsys, "send", "t", "-", "--at", "2030-01-01T00:00:00Z")
    assert code == 0, err
    assert fake.messages["d-1"].deliver_at == 1_893_456_000_000
    assert fake.messages["d-1"].body == b"\xff from stdin"
    assert fake.requests[0].headers["Authorization"] == "Bearer tok"


def test_send_file_with_progress(fake: FakeBroker, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lines = [json.dumps({"body": f"m{i}", "key": f"k{i}", "delay_ms": 1000}) for i in range(2500)]
    lines.insert(10, "")
    lines.append(json.dumps({"body_b64": "/wA=", "tag": "bin"}))
    f = tmp_path / "msgs.jsonl"
    f.write_text("\n".join(lines) + "\n")
    code, out, err = run(capsys, "send", "bulk", "--file", str(f), "--progress", "--url", fake.url)
    assert code == 0, err
    assert "sent 2,501 message(s)" in out
    assert "100%" in err and "2,501/2,501" in err
    assert [len(r.body["messages"]) for r in fake.requests] == [1000, 1000, 501]
    assert fake.messages["d-2501"].body == b"\xff\x00"

    code, out, _ = run(capsys, "send", "bulk", "--file", str(f), "--url", fake.url, "--json")
    results = json.loads(out)["messages"]
    assert len(results) == 2501 and sum(r["duplicate"] for r in results) == 2500


def test_send_file_errors_name_the_line(fake: FakeBroker, capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text('{"body": "ok"}\n{"body": "x", "dely_ms": 1}\n')
    code, _, err = run(capsys, "send", "t", "--file", str(f), "--url", fake.url)
    assert code == 2 and "bad.jsonl:2" in err and "dely_ms" in err
    f.write_text('{"body": "ok"}\n\n{"body": "x", "tag": "poison"}\n')
    code, _, err = run(capsys, "send", "t", "--file", str(f), "--url", fake.url)
    assert code == 2 and "bad.jsonl:3" in err and "invalid_message" in err
    f.write_text("not json\n")
    code, _, err = run(capsys, "send", "t", "--file", str(f), "--url", fake.url)
    assert code == 2 and "bad.jsonl:1" in err


def test_cancel_exit_codes(fake: FakeBroker, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "send", "t", "x", "--key", "k", "--url", fake.url)
    code, out, _ = run(capsys, "cancel", "--topic", "t", "--key", "k", "--url", fake.url)
    assert code == 0 and out.strip() == "d-1  cancelled"
    code, _, err = run(capsys, "cancel", "d-77", "--url", fake.url)
    assert code == 3 and "not_found" in err
    run(capsys, "send", "t", "y", "--url", fake.url)
    run(capsys, "consume", "t", "g", "--count", "1", "--url", fake.url)
    code, _, err = run(capsys, "cancel", "d-2", "--url", fake.url)
    assert code == 4 and "already_delivered" in err
    code, _, err = run(capsys, "cancel", "--url", fake.url)
    assert code == 2
    code, _, err = run(capsys, "stats", "--url", f"http://127.0.0.1:{free_port()}", "--timeout", "2", "--retries", "1")
    assert code == 5 and "connect" in err


def test_consume_prints_messages(fake: FakeBroker, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "send", "t", "one", "--url", fake.url)
    run(capsys, "send", "t", "two\nlines", "--key", "k2", "--url", fake.url)
    code, out, _ = run(capsys, "consume", "t", "g", "--count", "2", "--url", fake.url)
    assert code == 0
    first, second = out.splitlines()
    assert "d-1" in first and first.endswith("one") and "attempt=1" in first
    assert "key=k2" in second and second.endswith("two\\nlines")
    assert fake.groups[("t", "g")].acked == {"d-1", "d-2"}
    run(capsys, "send", "t", "three", "--url", fake.url)
    code, out, _ = run(capsys, "consume", "t", "g", "--json", "--idle-exit", "300ms", "--wait", "100ms",
                       "--url", fake.url)
    assert code == 0 and [json.loads(line)["body"] for line in out.splitlines()] == ["three"]


def test_consume_exec_acks_on_zero_exit(fake: FakeBroker, capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    out_file = tmp_path / "seen"
    run(capsys, "send", "t", "good", "--key", "g1", "--url", fake.url)
    run(capsys, "send", "t", "bad", "--key", "b1", "--url", fake.url)
    script = f'cat >> {out_file}; echo " $DELAYD_KEY $DELAYD_ATTEMPT" >> {out_file}; test "$DELAYD_KEY" != b1'
    code, _, err = run(capsys, "consume", "t", "g", "--exec", script, "--max-attempts", "2", "--retry-delay", "0",
                       "--count", "3", "--url", fake.url)
    assert code == 0, err
    assert sorted(out_file.read_text().splitlines()) == ["bad b1 1", "bad b1 2", "good g1 1"]
    assert "exit=1  nack" in err and "exit=0  ack" in err and "done: 1 acked, 2 nacked" in err
    g = fake.groups[("t", "g")]
    assert g.acked == {"d-1"} and set(g.dead) == {"d-2"}


def test_stats_and_schedule(fake: FakeBroker, capsys: pytest.CaptureFixture[str]) -> None:
    for delay in ("10m", "20m", "2h30m", "2h30m"):
        run(capsys, "send", "t", "x", "--delay", delay, "--url", fake.url)
    code, out, _ = run(capsys, "stats", "--url", fake.url)
    assert code == 0 and "scheduled  4" in out and "p99 3 ms" in out and "1000 B" in out
    code, out, _ = run(capsys, "stats", "--url", fake.url, "--json")
    assert json.loads(out)["scheduled"] == 4

    code, out, _ = run(capsys, "schedule", "--hours", "3", "--buckets", "3", "--no-align", "--url", fake.url)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("4 pending message(s) due in the next 3h")
    counts = [int(line.split()[-1]) for line in lines[1:]]
    assert counts == [2, 0, 2]
    for n in (3, 4, 7):
        code, out, _ = run(capsys, "schedule", "--hours", "3", "--buckets", str(n), "--url", fake.url)
        rows = out.splitlines()[1:]
        assert len(rows) == n, f"--buckets {n} printed {len(rows)} lines:\n{out}"
    code, out, _ = run(capsys, "schedule", "--hours", "4", "--buckets", "4", "--url", fake.url)
    rows = out.splitlines()[1:]
    assert sum(int(r.split()[-1]) for r in rows) == 4 and len(rows) == 4
    assert all(r.split()[1].endswith(":00") for r in rows)  # aligned to whole hours
    code, out, _ = run(capsys, "schedule", "--hours", "3", "--step", "1h", "--url", fake.url, "--json")
    data = json.loads(out)
    assert data["step_ms"] == 3_600_000 and sum(c for _, c in data["buckets"]) == 4


def test_durations_and_times() -> None:
    assert parse_duration_ms("1500") == 1500
    assert parse_duration_ms("250ms") == 250
    assert parse_duration_ms("1h30m") == 5_400_000
    assert parse_duration_ms("1.5s") == 1500
    assert parse_duration_ms("2d") == 172_800_000
    for bad in ("", "5 parsecs", "1x", "s", "-5s"):
        with pytest.raises(ValueError):
            parse_duration_ms(bad)
    assert parse_time_ms("1900000000000") == 1_900_000_000_000
    assert parse_time_ms("2030-01-01T01:00:00+01:00") == 1_893_456_000_000
    with pytest.raises(ValueError):
        parse_time_ms("next tuesday")
    assert format_duration(950) == "950ms" and format_duration(5_400_000) == "1h 30m"


def test_histogram_rendering() -> None:
    step = 3_600_000
    buckets = [ScheduleBucket(i * step, c) for i, c in enumerate([0, 5, 10, 1])]
    text = histogram(buckets, step, width=40, unicode=True)
    rows = text.splitlines()
    assert len(rows) == 4 and all(len(r) == len(rows[0]) for r in rows)
    assert rows[2].count("█") > rows[1].count("█") > rows[3].count("█") > 0
    assert rows[0].split("│")[1].strip() == "0"
    ascii_rows = histogram(buckets, step, width=40, unicode=False).splitlines()
    assert abs(ascii_rows[2].count("#") - 2 * ascii_rows[1].count("#")) <= 1
    assert bar(0, 10, 20) == "" and bar(10, 10, 4) == "████" and bar(1, 1000, 20) == "▏"


def test_repeated_url_members_of_one_shard_and_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    rs = ReplicaSet("s0", 3, primary=1)
    try:
        a, b, c = rs.urls
        # --url repeated (and comma-separated): members reporting one node id are one shard.
        code, out, err = run(capsys, "send", "t", "x", "--url", a, "--url", f"{b},{c}", "--json")
        assert code == 0, err
        assert json.loads(out)["id"].startswith("s0-") and len(rs.members[1].messages) == 1
        assert not any(p.startswith("POST") for p in rs.members[0].paths() + rs.members[2].paths()), \
            "/v1/info named b primary: the produce went there"

        code, out, err = run(capsys, "cluster", "--url", a, "--url", b, "--url", c)
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0].startswith("shard s0  epoch 1  primary s0-b " + b)
        assert lines[1].startswith("in sync: s0-a, s0-b, s0-c")
        assert lines[2].split() == ["member", "url", "role", "in", "sync", "registered", "lag"]
        assert lines[4].split()[:3] == ["s0-b", b, "primary"] and lines[3].split()[2] == "follower"
        assert lines[3].endswith("0ms / 0 B")

        code, out, _ = run(capsys, "cluster", "--url", a, "--json")
        view = json.loads(out)
        assert list(view) == [a] and view[a]["primary"]["member"] == "s0-b"

        rs.promote(None)
        code, out, _ = run(capsys, "cluster", "--url", c)
        assert code == 0 and "primary none" in out.splitlines()[0]
    finally:
        rs.stop()


def test_cluster_of_daemons_without_replication(fakes: list[FakeBroker], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "cluster", "--url", ",".join(f.url for f in fakes))
    assert code == 0, err
    assert [line for line in out.splitlines() if line] == [
        f"shard {f.node_id}: replication off (a single daemon; it is its own primary)" for f in fakes]
