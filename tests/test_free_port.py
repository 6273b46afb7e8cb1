"""The test suite's port picker (tests/support/daemon.py): `make test` runs two pytest-xdist
workers, and a port one of them hands to a daemon must never be handed out by the other."""

from __future__ import annotations

import socket

import pytest

from tests.support import daemon
from tests.support.daemon import free_port, port_range


def test_worker_ranges_are_disjoint_and_below_the_ephemeral_ports() -> None:
    ranges = [port_range(None), *(port_range(f"gw{i}") for i in range(21))]
    taken: set[int] = set()
    for r in ranges:
        assert r.stop <= 32768 and not taken & set(r)
        taken |= set(r)
    with pytest.raises(RuntimeError, match="more workers"):
        port_range("gw22")


def test_a_free_port_is_in_the_workers_range_and_skips_bound_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    held = []
    try:
        for port in port_range("gw1")[:999]:  # all but one bound: the picker finds that one
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            held.append(s)
        left = set(port_range("gw1")) - {s.getsockname()[1] for s in held}
        monkeypatch.setattr(daemon, "_turn", [])
        assert len(left) >= 1 and {free_port() for _ in range(3)} <= left
    finally:
        for s in held:
            s.close()


def test_ports_handed_out_and_not_bound_yet_are_not_handed_out_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster picks every member's port before it starts any member."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")
    monkeypatch.setattr(daemon, "_turn", [])
    picked = [free_port() for _ in range(500)]
    assert len(set(picked)) == len(picked) and set(picked) <= set(port_range("gw2"))
