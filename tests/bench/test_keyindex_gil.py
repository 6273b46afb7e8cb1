"""bench.keyindex_gil still runs: both ways of writing the key index's rows, a few keys each."""

from __future__ import annotations

import math

import pytest

from bench.keyindex_gil import write_beside_a_busy_thread


@pytest.mark.parametrize("json_rows", [True, False])
def test_a_write_beside_a_busy_thread_is_measured(json_rows: bool) -> None:
    cpu, off = write_beside_a_busy_thread(json_rows, 3, "t")
    assert math.isfinite(cpu) and cpu > 0
    assert math.isfinite(off)
