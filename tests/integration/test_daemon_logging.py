"""The daemon's log: `--log-level` (flag, env, config file) and the optional access log."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.integration.wire import Api, ok
from tests.support.daemon import ROOT, DaemonProcess, free_port


def test_default_is_info_without_an_access_log(tmp_path) -> None:
    d = DaemonProcess(tmp_path / "data").start()
    try:
        ok(Api(d).call("GET", "/v1/stats"))
    finally:
        assert d.stop() == 0
    text = d.log_path.read_text()
    assert " INFO delayd: delayd listening on " in text
    assert "delayd.access" not in text and "GET /v1/stats" not in text, "no access log unless asked for"


def test_log_level_warning_from_flag_env_or_config(tmp_path) -> None:
    for how, kw in (("flag", {"extra_args": ["--log-level", "WARNING"]}),
                    ("env", {"env": {"DELAYD_LOG_LEVEL": "warning"}}),
                    ("config", {"config_text": '[logging]\nlog_level = "warning"\n'})):
        (tmp_path / how).mkdir()
        d = DaemonProcess(tmp_path / how / "data", **kw).start()
        try:
            ok(Api(d).call("GET", "/v1/stats"))
        finally:
            assert d.stop() == 0
        text = d.log_path.read_text()
        assert " INFO " not in text, (how, text)


def test_log_level_debug_shows_the_configuration_without_tokens(tmp_path) -> None:
    token = "dbg-2Fq8-secret-token"
    d = DaemonProcess(tmp_path / "data", extra_args=["--log-level", "debug"],
                      config_text=f'[[auth.tokens]]\ntoken = "{token}"\n').start()
    try:
        assert d.request("GET", "/v1/info", headers={"Authorization": f"Bearer {token}"})[0] == 200
    finally:
        assert d.stop() == 0
    text = d.log_path.read_text()
    assert re.search(r" DEBUG delayd: effective configuration: Config\(.*log_level='debug'", text), d.log_tail()
    assert token not in text


def test_bad_log_level_exits_2(tmp_path) -> None:
    r = subprocess.run([sys.executable, "-m", "delayd", "serve", "--data-dir", str(tmp_path / "d"),
                        "--listen", f"127.0.0.1:{free_port()}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=30, env={"DELAYD_LOG_LEVEL": "loud", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "log_level" in r.stderr, r.stderr


def test_access_log_has_one_line_per_request_and_no_token(tmp_path) -> None:
    token = "acc-5Hk9-secret-token"
    config = f'[[auth.tokens]]\ntoken = "{token}"\n'
    d = DaemonProcess(tmp_path / "data", extra_args=["--access-log", "--log-level", "warning"],
                      config_text=config).start()
    try:
        headers = {"Authorization": f"Bearer {token}", "User-Agent": "access-test/1"}
        assert d.request("GET", "/v1/stats", headers=headers)[0] == 200
        assert d.request("GET", "/v1/messages/d-ffff", headers=headers)[0] == 404
        assert d.request("GET", "/v1/stats")[0] == 401
    finally:
        assert d.stop() == 0
    text = d.log_path.read_text()
    lines = [line for line in text.splitlines() if " delayd.access: " in line]
    assert any('"GET /v1/stats HTTP/1.1" 200 ' in line and '"access-test/1"' in line for line in lines), text
    assert any('"GET /v1/messages/d-ffff HTTP/1.1" 404 ' in line for line in lines), text
    assert any('"GET /v1/stats HTTP/1.1" 401 ' in line for line in lines), text
    assert token not in text
