"""The SDK over TLS against the real daemon serving a self-signed certificate: trusted through a CA
file or an `ssl.SSLContext`, refused without either (openssl is installed by make test's set-up)."""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from delayd.client import AsyncClient, Client, ConnectionFailed, RetryPolicy
from delayd.client.cli import main as cli_main

from tests.support.daemon import DaemonProcess, wait_until

TOKEN = "tls-4Jm7-secret-token"


@pytest.fixture(scope="module")
def tls_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, Path]]:
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout", str(key),
                    "-out", str(cert), "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    daemon = DaemonProcess(d / "data", config_text=f'tls_cert = "{cert}"\ntls_key = "{key}"\n'
                                                   f'[[auth.tokens]]\ntoken = "{TOKEN}"\n')
    daemon.start(wait_ready=False)
    ctx = ssl.create_default_context(cafile=str(cert))

    def ready() -> bool:
        if daemon.proc is not None and daemon.proc.poll() is not None:
            raise RuntimeError(daemon.log_tail())
        try:
            with Client(f"https://127.0.0.1:{daemon.port}", TOKEN, tls=ctx, retry=RetryPolicy(attempts=1)) as c:
                return bool(c.info())
        except ConnectionFailed:
            return False
    wait_until(ready, 30, 0.05, "the TLS daemon")
    yield daemon, cert
    assert daemon.stop() == 0


def test_sync_client_with_a_ca_file(tls_daemon: tuple[DaemonProcess, Path]) -> None:
    d, cert = tls_daemon
    with Client(f"https://127.0.0.1:{d.port}", TOKEN, tls=str(cert)) as c:
        sent = c.send("tls-sync", "over tls", key="k1")
        (m,) = c.pull("tls-sync", "g", wait_ms=5_000)
        assert (m.id, m.text) == (sent.id, "over tls")
        assert c.ack("tls-sync", "g", m).acked == 1


async def test_async_client_with_an_ssl_context(tls_daemon: tuple[DaemonProcess, Path]) -> None:
    d, cert = tls_daemon
    ctx = ssl.create_default_context(cafile=str(cert))
    async with AsyncClient(f"https://127.0.0.1:{d.port}", TOKEN, tls=ctx, encoding="json") as c:
        sent = await c.send("tls-async", b"\xff binary")
        (m,) = await c.pull("tls-async", "g", wait_ms=5_000)
        assert (m.id, m.body) == (sent.id, b"\xff binary")


def test_untrusted_certificate_is_refused(tls_daemon: tuple[DaemonProcess, Path]) -> None:
    d, _ = tls_daemon
    with Client(f"https://127.0.0.1:{d.port}", TOKEN, retry=RetryPolicy(attempts=1)) as c:
        with pytest.raises(ConnectionFailed) as info:
            c.info()
    assert "certificate" in str(info.value).lower()
    with pytest.raises(ValueError):
        Client(f"https://127.0.0.1:{d.port}", tls="/nonexistent/ca.pem")


def test_cli_with_ca_file(tls_daemon: tuple[DaemonProcess, Path], capsys: pytest.CaptureFixture[str]) -> None:
    d, cert = tls_daemon
    url = f"https://127.0.0.1:{d.port}"
    assert cli_main(["send", "tls-cli", "hi", "--url", url, "--token", TOKEN, "--ca-file", str(cert)]) == 0
    assert cli_main(["send", "tls-cli", "hi", "--url", url, "--token", TOKEN, "--retries", "1"]) == 5
    assert "certificate" in capsys.readouterr().err.lower()
