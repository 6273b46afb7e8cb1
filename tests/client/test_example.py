"""examples/order_timeout.py runs to completion (against the fake broker here; the daemon run is in
test_daemon.py)."""

from __future__ import annotations

import subprocess
import sys

from tests.client.fakebroker import FakeBroker
from tests.support.daemon import ROOT


def run_example(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "examples" / "order_timeout.py"), "--url", url,
                           "--orders", "8", "--timeout-ms", "600", "--deadline-s", "20"],
                          capture_output=True, text=True, timeout=60)


def test_order_timeout_example(fake: FakeBroker) -> None:
    done = run_example(fake.url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 closed, 4 paid, 0 still open, 0 paid-but-closed" in done.stdout
    assert sum(r.method == "DELETE" for r in fake.requests) == 4
