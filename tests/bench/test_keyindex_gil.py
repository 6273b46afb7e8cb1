"""bench.keyindex_gil still runs: both ways of writing the key index's rows and of reading its keys for a
filter build, a few keys each."""

from __future__ import annotations

import math

import pytest

from bench.keyindex_gil import scan_beside_a_busy_thread, write_beside_a_busy_thread


@pytest.mark.parametrize("json_rows", [True, False])
def test_a_write_beside_a_busy_thread_is_measured(json_rows: bool) -> None:
    cpu, off = write_beside_a_busy_thread(json_rows, 3, "t")
    assert math.isfinite(cpu) and cpu > 0
    assert math.isfinite(off)


def test_a_build_beside_a_busy_thread_is_measured(capsys: pytest.CaptureFixture[str]) -> None:
    scan_beside_a_busy_thread(2)
    out = capsys.readouterr().out
    for line in ("alone, json: the build", "alone, rows: the build", "median json: the build", "median rows: the build"):
        assert line in out
    assert "(2,000 keys)" in out


def test_a_json_only_build_is_measured_alone(capsys: pytest.CaptureFixture[str]) -> None:
    scan_beside_a_busy_thread(2, ("json",))
    out = capsys.readouterr().out
    assert "median json: the build" in out and "rows" not in out
