"""The web console (/ui/, docs/console.md) in a real browser against a real daemon: Playwright's
own driver steering Debian's chromium, headless. Load the page, see a scheduled message appear,
cancel and reschedule it, redrive a dead letter, zoom the histogram, and the token prompt.

chromium comes from scripts/install-test-deps.sh (apt); Playwright never downloads a browser.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.integration.wire import Api, call, daemon_log_clean, now_ms, ok
from tests.support.daemon import ROOT, DaemonProcess, wait_until

sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is missing: "
                                "run scripts/install-test-deps.sh")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WAIT_MS = 10_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


class Console:
    """One browser tab on a daemon's console; fails the test on any script error."""

    def __init__(self, browser: Any, url: str) -> None:
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.context.set_default_timeout(WAIT_MS)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(url + "/ui/")

    def row(self, message_id: str) -> Any:
        return self.page.locator(f'#messages tr[data-id="{message_id}"]')

    def confirm(self, yes: bool = True) -> str:
        dialog = self.page.locator("#confirm")
        dialog.wait_for(state="visible")
        text = self.page.locator("#confirm-text").inner_text()
        self.page.click("#confirm-yes" if yes else "#confirm-no")
        dialog.wait_for(state="hidden")
        return text

    def toast(self, pattern: str) -> str:
        toast = self.page.locator("#toast")
        toast.filter(has_text=re.compile(pattern)).wait_for(state="visible")
        return str(toast.inner_text())

    def close(self) -> None:
        self.context.close()
        assert not self.errors, self.errors


@pytest.fixture
def console(browser: Any, daemon: DaemonProcess) -> Iterator[Console]:
    c = Console(browser, daemon.url)
    yield c
    c.close()


def local_input(ms: int) -> str:
    """A datetime-local value; the browser runs on this machine, in its time zone."""
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%dT%H:%M:%S")


def test_a_scheduled_message_appears_and_is_cancelled(console: Console, api: Api) -> None:
    (sent,) = api.produce("ui-cancel", {"body": "close order 42", "delay_ms": 3_600_000, "key": "order-42"})
    page = console.page
    page.click("#refresh")
    row = console.row(sent["id"])
    row.wait_for()
    assert "order-42" in row.inner_text() and "ui-cancel" in row.inner_text()
    row.click()
    page.locator("#detail").wait_for(state="visible")
    assert "close order 42" in page.locator("#detail-body").inner_text()
    assert "scheduled" in page.locator("#detail-fields").inner_text()
    # Changing one's mind keeps the message.
    page.click("#cancel")
    assert sent["id"] in console.confirm(yes=False)
    assert api.state(sent["id"]) == "scheduled"
    page.click("#cancel")
    console.confirm()
    console.toast("cancelled")
    row.wait_for(state="detached")
    assert api.state(sent["id"]) == "cancelled"


def test_reschedule_keyed_and_unkeyed(console: Console, api: Api) -> None:
    t = "ui-resched"
    keyed, plain = api.produce(t, {"body": "k", "delay_ms": 3_600_000, "key": "trip-7", "tag": "x"},
                               {"body_b64": "/wA=", "delay_ms": 3_600_000, "headers": {"h": "1"}})
    page = console.page
    new_due = (now_ms() // 1000 + 7200) * 1000
    # Keyed: found by its key, replaced atomically under the same key.
    page.fill("#search", "trip-7")
    page.press("#search", "Enter")
    page.locator("#detail-fields").filter(has_text=keyed["id"]).wait_for()
    page.fill("#reschedule-at", local_input(new_due))
    page.click("#reschedule")
    assert "same key" in console.confirm()
    console.toast("rescheduled")
    now = ok(api.call("GET", f"/v1/topics/{t}/keys/trip-7"))
    assert now["id"] != keyed["id"] and now["deliver_at"] == new_due and now["tag"] == "x" and now["body"] == "k"
    assert api.state(keyed["id"]) == "cancelled"
    # Unkeyed: found by its id, cancelled and produced again as a copy.
    page.fill("#search", plain["id"])
    page.press("#search", "Enter")
    page.locator("#detail-fields").filter(has_text=plain["id"]).wait_for()
    page.fill("#reschedule-at", local_input(new_due + 1000))
    page.click("#reschedule")
    assert "new id" in console.confirm()
    text = console.toast(rf"rescheduled: (?!{re.escape(now['id'])}\b)")  # not the first one's toast
    copy_id = text.split()[1]
    copy = ok(api.get(copy_id))
    assert (copy["body_b64"], copy["headers"], copy["deliver_at"], copy["state"]) == \
        ("/wA=", {"h": "1"}, new_due + 1000, "scheduled")
    assert api.state(plain["id"]) == "cancelled"
    console.row(copy_id).wait_for()


def test_dead_letters_are_shown_and_redriven(console: Console, api: Api) -> None:
    t, g = "ui-dead", "billing"
    api.subscribe(t, g, max_attempts=1)
    (sent,) = api.produce(t, {"body": "poison", "key": "p-1"})
    (got,) = api.pull_until(t, g, 1)
    api.settle(t, g, "nack", [got["receipt"]], delay_ms=0)
    assert [m["id"] for m in api.dead(t, g)] == [sent["id"]]
    page = console.page
    row = page.locator(f'#groups tr[data-group="{t}/{g}"]')
    row.locator("button", has_text="Dead letters").click()
    page.locator("#dead-dialog").filter(has_text=sent["id"]).wait_for(state="visible")
    assert "p-1" in page.locator("#dead").inner_text()
    page.click("#dead-dialog button[value=close]")
    row.locator("button", has_text="Redrive").click()
    assert "1 dead letter" in console.confirm()
    console.toast("re-queued")
    row.locator("button", has_text="Redrive").wait_for(state="detached")
    assert api.dead(t, g) == []
    (again,) = api.pull_until(t, g, 1)
    assert again["id"] == sent["id"]


def test_histogram_zooms_and_lists_a_bucket(console: Console, api: Api) -> None:
    t = "ui-chart"
    base = now_ms() + 600_000
    api.produce(t, *({"body": "x", "deliver_at": base + i * 60_000} for i in range(20)))
    page = console.page
    caption = page.locator("#chart-caption")
    page.click("#zoom button[data-span='3600000']")
    caption.filter(has_text=re.compile(r"\d+s per bar")).wait_for()
    bars = page.locator("#chart rect.bar")
    wait_until(lambda: bars.count() >= 20, 10, what="a bar per message")
    total = sum(int(bars.nth(i).get_attribute("data-count")) for i in range(bars.count()))
    assert total >= 20 and str(total) in caption.inner_text()
    # Zoom to seconds and back out to years.
    page.click("#zoom button[data-span='10000']")
    caption.filter(has_text=re.compile(r"\d+ms per bar")).wait_for()
    page.click("#zoom button[data-span='315360000000']")
    caption.filter(has_text=re.compile(r"\d+d .*per bar")).wait_for()
    before = caption.inner_text()
    box = page.locator("#chart").bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.wheel(0, -400)  # zoom in around the pointer
    wait_until(lambda: caption.inner_text() != before, 10, what="the wheel to zoom")
    # A bar's click lists what falls due in it.
    page.click("#zoom button[data-span='3600000']")
    caption.filter(has_text=re.compile(r"\d+s per bar")).wait_for()
    bar = page.locator("#chart rect.bar").last
    bar.click()
    chip = page.locator("#range")
    chip.wait_for(state="visible")
    start, end = (int(chip.get_attribute(f"data-{k}")) for k in ("from", "to"))
    assert start == int(bar.get_attribute("data-start")) and "due" in chip.inner_text()
    # The list shows exactly what the API lists for the bucket the click picked.
    want = [m["id"] for m in ok(api.call("GET", f"/v1/messages?from={start}&to={end}"))["messages"]]
    assert want
    rows = page.locator("#messages tbody tr")
    shown: list[Any] = []
    for _ in range(200):
        shown = [rows.nth(i).get_attribute("data-id") for i in range(rows.count())]
        if shown == want:
            break
        page.wait_for_timeout(100)
    assert shown == want, (shown, want, page.locator("#list-panel").inner_text()[:500])


TOKEN = "console-admin-token"


def test_the_token_prompt(browser: Any, tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "data", config_text=f'[[auth.tokens]]\ntoken = "{TOKEN}"\nrights = ["admin"]\n')
    d.start()
    try:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        status, body = d.request("POST", "/v1/topics/ui-auth/messages", {"body": "s", "delay_ms": 600_000},
                                 headers=auth)
        assert status == 200
        msg_id = body["messages"][0]["id"]
        # The page itself is public; no data is.
        assert call(d, "GET", "/ui/").status == 200
        assert call(d, "GET", "/v1/messages").status == 401
        c = Console(browser, d.url)
        page = c.page
        page.locator("#token-dialog").wait_for(state="visible")
        assert page.locator("[data-stat=scheduled]").inner_text() == "–"
        assert c.page.locator("#messages tbody tr").count() == 0
        page.fill("#token-input", "not-the-token")
        page.click("#token-use")
        page.locator("#token-error").filter(has_text="refused").wait_for(state="visible")
        page.fill("#token-input", TOKEN)
        page.click("#token-use")
        page.locator("#token-dialog").wait_for(state="hidden")
        c.row(msg_id).wait_for()
        assert page.evaluate("sessionStorage.getItem('delayd.token')") == TOKEN
        c.close()
        # Another tab (another session) is asked again: the token stays in its own tab.
        c = Console(browser, d.url)
        c.page.locator("#token-dialog").wait_for(state="visible")
        c.close()
    finally:
        d.stop()
    daemon_log_clean(d)


def test_static_files_and_their_headers(daemon: DaemonProcess) -> None:
    r = call(daemon, "GET", "/ui")
    assert r.status == 308 and r.headers["location"] == "/ui/"
    r = call(daemon, "GET", "/ui/")
    assert r.status == 200 and r.content_type == "text/html" and b"app.js" in r.raw
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "default-src 'none'" in csp
    for name, ctype in (("app.js", "text/javascript"), ("style.css", "text/css"), ("chart.js", "text/javascript")):
        r = call(daemon, "GET", f"/ui/{name}")
        assert r.status == 200 and r.content_type == ctype, name
    for path in ("/ui/nope.js", "/ui/..%2fconsole.py", "/ui/%2e%2e/console.py", "/ui/../http.py"):
        assert call(daemon, "GET", path).status == 404, path
    # Everything the page loads is local: no CDN, no external font.
    for f in (ROOT / "broker" / "ui").iterdir():
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", f.read_text()), f
    # (That the wheel carries every file: tests/packaging/test_wheel.py.)
