"""Bearer tokens, the non-loopback guard and TLS, against the real daemon (API.md "Auth").

Tokens come from the config file (`[[auth.tokens]]`: token, rights, topic globs). Without a
valid token every /v1 call and /metrics answer 401 `unauthorized`; a valid token without the
right for the action or the topic answers 403 `forbidden`; /healthz and /readyz stay open.
"""

from __future__ import annotations

import json
import shutil
import ssl
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.robustness.rawhttp import get, raw_request, status_of
from tests.support.daemon import ROOT, DaemonProcess, free_port, wait_until

ADMIN = "adm-7Qx2-secret-token"
PRODUCER = "prd-9Lw4-secret-token"
CONSUMER = "cns-3Rt8-secret-token"
TOKENS = f"""
[[auth.tokens]]
token = "{ADMIN}"
rights = ["admin"]

[[auth.tokens]]
token = "{PRODUCER}"
rights = ["produce"]
topics = ["orders.*"]

[[auth.tokens]]
token = "{CONSUMER}"
rights = ["consume"]
topics = ["orders.*", "audit"]
"""


def bearer(token: str | None) -> dict[str, str]:
    return {} if token is None else {"Authorization": f"Bearer {token}"}


def err(d: DaemonProcess, method: str, path: str, body: Any = None, token: str | None = None) -> tuple[int, str]:
    status, resp = d.request(method, path, body, headers=bearer(token))
    code = resp["error"]["code"] if isinstance(resp, dict) and "error" in resp else ""
    return status, code


@pytest.fixture(scope="module")
def authd(tmp_path_factory):
    d = DaemonProcess(tmp_path_factory.mktemp("auth") / "data", config_text=TOKENS).start()
    yield d
    d.stop()


def test_missing_or_wrong_token_is_401(authd):
    d = authd
    for path in ("/v1/stats", "/v1/info", "/metrics", "/v1/messages/d-1"):
        assert err(d, "GET", path) == (401, "unauthorized"), path
        assert err(d, "GET", path, token="not-a-token-at-all") == (401, "unauthorized"), path
    for header in ({"Authorization": f"Basic {ADMIN}"}, {"Authorization": "Bearer "},
                   {"Authorization": f"Bearer {ADMIN}x"}, {"Authorization": f"Bearer {ADMIN[:-1]}"},
                   {"Authorization": ADMIN}):
        status, _ = d.request("GET", "/v1/stats", headers=header)
        assert status == 401, header
    assert err(d, "POST", "/v1/topics/orders.eu/messages", {"body": "x"}) == (401, "unauthorized")
    assert err(d, "POST", "/v1/topics/orders.eu/subscriptions/g/pull", {}) == (401, "unauthorized")
    # A header that is not valid UTF-8 is a wrong token too, not a 500.
    resp = raw_request(d.port, get("/v1/stats", b"Authorization: Bearer \xff\xfe" + ADMIN.encode() + b"\r\n"))
    assert status_of(resp) == 401, resp[:300]


def test_health_and_ready_stay_open(authd):
    d = authd
    assert d.request("GET", "/healthz")[0] == 200
    assert d.request("GET", "/readyz")[0] == 200


def test_rights_per_action_and_topic(authd):
    d = authd
    # produce: the producer on its topics, admin anywhere; nobody else.
    status, body = d.request("POST", "/v1/topics/orders.eu/messages", {"body": "o1"}, headers=bearer(PRODUCER))
    assert status == 200, body
    mid = body["messages"][0]["id"]
    assert err(d, "POST", "/v1/topics/billing/messages", {"body": "x"}, PRODUCER) == (403, "forbidden")
    assert err(d, "POST", "/v1/topics/orders.eu/messages", {"body": "x"}, CONSUMER) == (403, "forbidden")
    assert err(d, "POST", "/v1/topics/audit/messages", {"body": "x"}, CONSUMER) == (403, "forbidden")
    assert d.request("POST", "/v1/topics/billing/messages", {"body": "b"}, headers=bearer(ADMIN))[0] == 200

    # consume: the consumer on its topics; the producer never.
    pull = "/v1/topics/orders.eu/subscriptions/g/pull"
    assert err(d, "POST", pull, {"max": 1}, PRODUCER) == (403, "forbidden")
    assert err(d, "POST", "/v1/topics/billing/subscriptions/g/pull", {}, CONSUMER) == (403, "forbidden")
    assert err(d, "PUT", "/v1/topics/billing/subscriptions/g", {}, CONSUMER) == (403, "forbidden")
    got: list[dict] = []

    def pulled() -> bool:
        status, body = d.request("POST", pull, {"max": 10, "wait_ms": 200}, headers=bearer(CONSUMER))
        assert status == 200, body
        got.extend(body["messages"])
        return bool(got)
    wait_until(pulled, 10, what="the consumer to receive the message")
    assert got[0]["id"] == mid
    ack = "/v1/topics/orders.eu/subscriptions/g/ack"
    assert err(d, "POST", ack, {"receipts": [got[0]["receipt"]]}, PRODUCER) == (403, "forbidden")
    status, body = d.request("POST", ack, {"receipts": [got[0]["receipt"]]}, headers=bearer(CONSUMER))
    assert (status, body["acked"]) == (200, 1)

    # cancel is a produce right, on the message's topic.
    status, body = d.request("POST", "/v1/topics/orders.us/messages", {"body": "o2", "delay_ms": 60_000},
                             headers=bearer(PRODUCER))
    later = body["messages"][0]["id"]
    assert err(d, "DELETE", f"/v1/messages/{later}", token=CONSUMER) == (403, "forbidden")
    status, body = d.request("POST", "/v1/topics/billing/messages", {"body": "b2", "delay_ms": 60_000},
                             headers=bearer(ADMIN))
    billing = body["messages"][0]["id"]
    # A message of a topic the token may not use is, for that token, a missing one.
    assert err(d, "DELETE", f"/v1/messages/{billing}", token=PRODUCER) == (404, "not_found")
    assert err(d, "GET", f"/v1/messages/{billing}", token=CONSUMER) == (404, "not_found")
    assert d.request("DELETE", f"/v1/messages/{later}", headers=bearer(PRODUCER)) == \
        (200, {"id": later, "state": "cancelled"})
    # keys: cancel by key is produce, reading by key is produce or consume, on the topic.
    assert err(d, "DELETE", "/v1/topics/billing/keys/k1", token=PRODUCER) == (403, "forbidden")
    assert err(d, "DELETE", "/v1/topics/orders.eu/keys/k1", token=CONSUMER) == (403, "forbidden")
    assert err(d, "DELETE", "/v1/topics/orders.eu/keys/k1", token=PRODUCER) == (404, "not_found")
    assert err(d, "GET", "/v1/topics/orders.eu/keys/k1", token=CONSUMER) == (404, "not_found")
    assert err(d, "GET", "/v1/topics/billing/keys/k1", token=CONSUMER) == (403, "forbidden")

    # admin: stats, schedule, metrics; nobody else.
    for path in ("/v1/stats", "/metrics", "/v1/schedule?from=0&to=1000&step_ms=1000"):
        assert err(d, "GET", path, token=PRODUCER) == (403, "forbidden"), path
        assert err(d, "GET", path, token=CONSUMER) == (403, "forbidden"), path
    assert d.request("GET", "/v1/stats", headers=bearer(ADMIN))[0] == 200
    req = urllib.request.Request(d.url + "/metrics", headers=bearer(ADMIN))
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200 and b"delayd_" in r.read()


def test_subscription_show_needs_consume_and_delete_needs_admin(authd):
    d = authd
    sub = "/v1/topics/orders.eu/subscriptions/sg"
    assert d.request("PUT", sub, {}, headers=bearer(CONSUMER))[0] == 200
    assert d.request("GET", sub, headers=bearer(CONSUMER))[0] == 200
    assert err(d, "GET", sub, token=PRODUCER) == (403, "forbidden")
    assert err(d, "GET", "/v1/topics/billing/subscriptions/sg", token=CONSUMER) == (403, "forbidden")
    # Deleting drops every consumer's state of the group: admin only, not the consumer.
    assert err(d, "DELETE", sub, token=CONSUMER) == (403, "forbidden")
    assert err(d, "DELETE", sub, token=PRODUCER) == (403, "forbidden")
    assert err(d, "DELETE", sub) == (401, "unauthorized")
    assert d.request("DELETE", sub, headers=bearer(ADMIN)) == (
        200, {"topic": "orders.eu", "group": "sg", "deleted": True})
    assert err(d, "GET", sub, token=CONSUMER) == (404, "not_found")


def test_a_message_of_another_topic_answers_exactly_like_a_missing_one(authd):
    """Ids are sequential: if a token for orders.* got 403 "may not use topic 'billing'" for an
    existing id and 404 for a missing one, it could walk the id space and learn which messages
    exist and their topics. Status, body (but for the id it names) and timing must match."""
    d = authd
    status, body = d.request("POST", "/v1/topics/billing/messages", {"body": "secret", "delay_ms": 600_000},
                             headers=bearer(ADMIN))
    assert status == 200, body
    hidden = body["messages"][0]["id"]
    node, num = hidden.split("-")
    missing = f"{node}-{int(num, 16) + 0x100000:x}"  # never issued in this test module
    for token in (PRODUCER, CONSUMER):
        for method in ("GET", "DELETE"):
            if method == "DELETE" and token == CONSUMER:
                continue  # no produce right at all: 403 for every id, existing or not (below)
            a = d.request(method, f"/v1/messages/{hidden}", headers=bearer(token))
            b = d.request(method, f"/v1/messages/{missing}", headers=bearer(token))
            assert a[0] == b[0] == 404, (method, a, b)
            assert json.dumps(a[1]).replace(hidden, "ID") == json.dumps(b[1]).replace(missing, "ID"), (a, b)
    # The right is checked before the id is looked up, so its 403 tells nothing either.
    assert err(d, "DELETE", f"/v1/messages/{hidden}", token=CONSUMER) == (403, "forbidden")
    assert err(d, "DELETE", f"/v1/messages/{missing}", token=CONSUMER) == (403, "forbidden")
    # The DELETE that answered 404 cancelled nothing.
    status, view = d.request("GET", f"/v1/messages/{hidden}", headers=bearer(ADMIN))
    assert (status, view["state"]) == (200, "scheduled")

    def median_s(mid: str) -> float:
        times = []
        for _ in range(25):
            t0 = time.perf_counter()
            d.request("GET", f"/v1/messages/{mid}", headers=bearer(PRODUCER))
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    slow, fast = sorted((median_s(hidden), median_s(missing)))
    assert slow < 10 * fast + 0.005, (slow, fast)


def test_tokens_never_reach_the_log(authd):
    d = authd
    # Exercise every path that could log a request: success, 401, 403, a bad body.
    d.request("GET", "/v1/stats", headers=bearer(ADMIN))
    d.request("GET", "/v1/stats", headers=bearer("wrong-" + ADMIN))
    d.request("POST", "/v1/topics/billing/messages", {"body": "x"}, headers=bearer(PRODUCER))
    d.request("POST", "/v1/topics/orders.eu/messages", {"nope": 1}, headers=bearer(PRODUCER))
    d.request("POST", "/v1/topics/orders.eu/subscriptions/g/pull", {"max": 0}, headers=bearer(CONSUMER))
    text = d.log_path.read_text(errors="replace")
    assert "listening" in text
    for secret in (ADMIN, PRODUCER, CONSUMER, "secret-token"):
        assert secret not in text, f"a token appears in the daemon log:\n{d.log_tail()}"


def _serve(tmp_path: Path, *args: str, config: str | None = None) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "delayd", "serve", "--data-dir", str(tmp_path / "data"), *args]
    if config is not None:
        (tmp_path / "c.toml").write_text(config)
        cmd += ["--config", str(tmp_path / "c.toml")]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_refuses_non_loopback_without_tokens(tmp_path):
    port = free_port()
    p = _serve(tmp_path, "--listen", f"0.0.0.0:{port}")
    out, errtext = p.communicate(timeout=30)
    assert p.returncode == 2, (out, errtext)
    assert b"refusing to listen on non-loopback" in errtext and b"--insecure" in errtext
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())


@pytest.mark.parametrize("how", ["insecure", "tokens"])
def test_non_loopback_starts_with_insecure_or_tokens(tmp_path, how):
    port = free_port()
    extra = ["--listen", f"0.0.0.0:{port}"] + (["--insecure"] if how == "insecure" else [])
    d = DaemonProcess(tmp_path / "data", port=port, extra_args=extra,
                      config_text=TOKENS if how == "tokens" else None).start()
    try:
        headers = bearer(ADMIN) if how == "tokens" else {}
        assert d.request("POST", "/v1/topics/t/messages", {"body": "x"}, headers=headers)[0] == 200
        assert "listening on http://0.0.0.0" in d.log_path.read_text()
    finally:
        assert d.stop() == 0


def test_config_errors_exit_2(tmp_path):
    for config in ('[[auth.tokens]]\ntoken = "short"\n',
                   f'[[auth.tokens]]\ntoken = "{ADMIN}"\nrights = ["root"]\n',
                   'tls_cert = "/nonexistent/cert.pem"\n'):
        p = _serve(tmp_path, "--listen", f"127.0.0.1:{free_port()}", config=config)
        out, errtext = p.communicate(timeout=30)
        assert p.returncode == 2, (config, out, errtext)
        assert errtext.startswith(b"delayd: "), errtext


# -- TLS --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem"), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True, timeout=60)
    return d / "cert.pem", d / "key.pem"


def test_tls_with_a_self_signed_certificate(tmp_path, certificate):
    cert, key = certificate
    config = f'tls_cert = "{cert}"\ntls_key = "{key}"\n' + TOKENS
    d = DaemonProcess(tmp_path / "data", config_text=config)
    d.start(wait_ready=False)
    base = f"https://127.0.0.1:{d.port}"
    ctx = ssl.create_default_context(cafile=str(cert))

    def https(method: str, path: str, body: Any = None, token: str | None = ADMIN) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", **bearer(token)})
        try:
            with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def ready() -> bool:
        if d.proc is not None and d.proc.poll() is not None:
            raise RuntimeError(d.log_tail())
        try:
            return https("GET", "/readyz", token=None)[0] == 200
        except (urllib.error.URLError, OSError):
            return False
    try:
        wait_until(ready, 30, 0.05, "the TLS daemon to be ready")
        assert "listening on https://" in d.log_path.read_text()
        status, body = https("POST", "/v1/topics/tls/messages", {"body": "secret payload"})
        assert status == 200, body
        assert https("GET", "/v1/stats", token=None)[0] == 401
        got: list[dict] = []

        def pulled() -> bool:
            status, body = https("POST", "/v1/topics/tls/subscriptions/g/pull", {"wait_ms": 200})
            assert status == 200, body
            got.extend(body["messages"])
            return bool(got)
        wait_until(pulled, 10, what="delivery over TLS")
        assert got[0]["body"] == "secret payload"
        # No cleartext HTTP on the TLS port, and a client that does not trust the cert fails.
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.urlopen(f"http://127.0.0.1:{d.port}/healthz", timeout=5).read()
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(base + "/healthz", timeout=5, context=ssl.create_default_context())
        assert https("GET", "/healthz", token=None)[0] == 200
    finally:
        assert d.stop() == 0
