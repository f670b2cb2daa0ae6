"""The waiting page in a real browser (issue 48): a real `zstalk serve` on loopback whose
room admits one visitor at a time, three visitors in three headless chromiums of their
own profiles (so three localStorages), driven by Selenium through Debian's chromedriver
(tests/support/browser.py: visitor).  The first is admitted and sent to admit_url (a tiny
page served here) with a pass that /v1/passes/verify takes; the others see their places,
and when the first is done the last one's place falls on screen, without a reload; a
visitor who reloads keeps their place; one who leaves (the button) gives it up; the page
breaks no rule of its CSP; a German visitor; a pre-line and a closed line; a page that
reconnects by itself across a restart.  Screenshots go to SCREENSHOTS (docs/waiting-room.md,
"The waiting page", shows one of them: docs/images/room-waiting.png)."""
from __future__ import annotations

import contextlib
import datetime
import http.server
import os
import pathlib
import threading
import time
import urllib.request

import pytest

from browser import visitor
from servers import LOOPBACK, self_check
from test_room_page import get
from test_waiting_room_end_to_end import FUNCTION, call, serve

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")
ROOT = pathlib.Path(__file__).resolve().parents[2]
#: where the screenshots go (the docs say so): build/screenshots/room-*.png
SCREENSHOTS = pathlib.Path(os.environ.get("ZSTALK_SCREENSHOTS", ROOT / "build" / "screenshots"))
WAIT_S = 30.0       # (generous: CI runs beside a CPU hog, and three chromiums on 2 cores)
ROOM = (f'[functions.{FUNCTION}]\nonline = "only"\nconcurrency = 1\npass_ttl = "5m"\n'
        'online_heartbeat = "5m"\nmax_waiting_per_client = 100\nexpected_duration = "3m"\n'
        'admit_url = "{admit_url}"\n')


class Shop(http.server.BaseHTTPRequestHandler):
    """admit_url: a page saying where the visitor is."""

    def do_GET(self) -> None:
        body = b"<!DOCTYPE html><title>Shop</title><h1 id=shop>Welcome to the shop</h1>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def shop():
    server = http.server.ThreadingHTTPServer((LOOPBACK, 0), Shop)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://{LOOPBACK}:{server.server_address[1]}/shop"
    server.shutdown()
    server.server_close()


@pytest.fixture
def room(tmp_path, shop):
    served = serve(tmp_path, config_text=ROOM.replace("{admit_url}", shop))
    yield served, shop
    served.server.stop()


@pytest.fixture
def visitors(tmp_path):
    """visitors(n): n browsers of their own profiles, quit at the end."""
    with contextlib.ExitStack() as stack:
        def make(n: int, language: str = "en") -> list:
            made = []
            for _ in range(n):
                driver = visitor(str(tmp_path / f"profile-{len(made)}-{time.monotonic_ns()}"),
                                 language)
                stack.callback(driver.quit)
                made.append(driver)
            return made
        yield make


def until(what, timeout: float = WAIT_S, message: str = ""):
    """what()'s first truthy value within timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value:
            return value
        assert time.monotonic() < deadline, message or f"not within {timeout} s"
        time.sleep(0.1)


def text(driver, element_id: str) -> str:
    return driver.find_element("id", element_id).text


def kept(driver) -> str:
    """The uniqueId the page keeps in localStorage."""
    return driver.execute_script(
        f"return JSON.parse(localStorage.getItem('zstalk.room.{FUNCTION}') || '{{}}').id")


def shows(driver, wanted: str) -> str:
    return until(lambda: wanted in text(driver, "room-status") and text(driver, "room-status"),
                 message=f"the page never said {wanted!r}: {text(driver, 'room-status')!r}")


def screenshot(driver, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SCREENSHOTS / f"room-{name}.png"))


def csp_breaches(driver) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser")
            if "Content Security Policy" in entry["message"]]


def test_three_visitors_wait_in_a_real_browser_the_first_goes_through_and_the_line_moves_on(
        room, visitors):
    served, admit_url = room
    page = f"{served.base}/room/{FUNCTION}"
    first, second, third = visitors(3)

    first.get(page)
    landed = until(lambda: first.current_url.startswith(admit_url) and first.current_url,
                   message="the first visitor was never sent to admit_url")
    assert first.find_element("id", "shop").text == "Welcome to the shop"
    pass_ = landed.split("#zstalk_pass=", 1)[1]
    with urllib.request.urlopen(urllib.request.Request(
            f"{served.base}/v1/passes/verify", headers={"Authorization": f"Bearer {pass_}"}),
            timeout=10) as verified:
        assert verified.status == 204
        first_id = verified.headers["X-Zstalk-Task-Id"]

    second.get(page)
    shows(second, "Ahead of you in line: 0")
    third.get(page)
    shows(third, "Ahead of you in line: 1")
    assert "Time left: about" in text(third, "room-time")
    assert "your place is kept for 5 min" in text(third, "room-note")
    screenshot(third, "waiting")
    third_id = kept(third)
    assert third_id and third_id != kept(second)

    third.refresh()         # a reload keeps the place: the same task, not a new one at the end
    shows(third, "Ahead of you in line: 1")
    assert kept(third) == third_id
    third.execute_script("window.zstalkNotReloaded = true")

    code, _, body = call("POST", f"{served.base}/v1/tasks/{first_id}/done", {},
                         {"Authorization": f"Bearer {pass_}"})
    assert code == 200, body
    until(lambda: second.current_url.startswith(admit_url),
          message="the second visitor was never sent on when the first was done")
    shows(third, "Ahead of you in line: 0")
    assert third.execute_script("return window.zstalkNotReloaded") is True, "no reload"
    screenshot(third, "next")

    third.find_element("id", "room-leave").click()
    shows(third, "You left the line.")
    until(lambda: call("GET", f"{served.base}/v1/tasks/{third_id}")[2].get("status")
          == "cancelled", message="leaving did not give the place up")
    assert kept(third) is None and third.find_element("id", "room-join").is_displayed()
    for driver in (second, third):
        assert csp_breaches(driver) == []


def test_a_german_visitor_waits_on_a_german_page(room, visitors):
    served, _ = room
    page = f"{served.base}/room/{FUNCTION}"
    ahead, german = visitors(2, "de")
    ahead.get(page)                     # (admitted at once: the German visitor waits)
    german.get(page)
    shows(german, "Vor Ihnen in der Schlange: 0")
    assert "Verbleibende Zeit: etwa" in text(german, "room-time")
    assert german.find_element("id", "room-leave").text == "Schlange verlassen"
    screenshot(german, "german")
    code, headers, _ = get(page, {"Accept-Language": "de"})
    assert code == 200 and "unsafe-inline" not in headers["Content-Security-Policy"]
    assert csp_breaches(german) == []


def test_a_visitor_sees_a_pre_line_before_the_opening_and_a_closed_line_as_such(
        tmp_path, visitors):
    opens = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=2)
    served = serve(tmp_path, config_text=(
        f'[functions.drop]\nonline = "only"\nmax_waiting_per_client = 100\n'
        f'opens_at = {opens.strftime("%Y-%m-%dT%H:%M:%SZ")}\n'
        f'[functions.shut]\nonline = "only"\nconcurrency = 1\nclosed = true\n'
        f'max_waiting_per_client = 100\n'))
    try:
        [driver] = visitors(1)
        driver.get(f"{served.base}/room/drop")
        shows(driver, "The line opens at")
        assert opens.strftime("%Y") in text(driver, "room-status")
        screenshot(driver, "pre-line")
        driver.get(f"{served.base}/room/shut")
        shows(driver, "The line is closed for now: nobody is admitted.")
        assert "Ahead of you in line: 0" in text(driver, "room-status"), "the place, held"
        screenshot(driver, "closed")
    finally:
        served.server.stop()


def test_a_waiting_page_reconnects_after_a_restart_and_follows_its_place_on(tmp_path, shop,
                                                                              visitors):
    """kill -9 of the server under a waiting page, then a start from its binlog: the page
    says the connection was lost, reconnects by itself (Last-Event-ID, backoff), and its
    stream goes on: when the visitor ahead is done, it is sent to admit_url."""
    served = serve(tmp_path, "100/s", 1, "-b", str(tmp_path / "wal"),
                   config_text=ROOM.replace("{admit_url}", shop))
    try:
        ahead = call("POST", f"{served.base}/v1/tasks",
                     {"function": FUNCTION, "type": "online"})[2]
        [driver] = visitors(1)
        driver.get(f"{served.base}/room/{FUNCTION}")
        shows(driver, "Ahead of you in line: 0")
        uid = kept(driver)
        driver.execute_script("window.zstalkNotReloaded = true")
        served.server.kill()
        until(lambda: "connection was lost" in text(driver, "room-time"),
              message="the page never said the connection was lost")
        served.server.start()
        until(lambda: "Time left: about" in text(driver, "room-time"),
              message="the page never came back from the restart")
        assert driver.execute_script("return window.zstalkNotReloaded") is True, "by itself"
        code, _, body = call("POST", f"{served.base}/v1/tasks/{ahead['uniqueId']}/done", {},
                             {"Authorization": f"Bearer {ahead['pass']}"})
        assert code == 200, body
        until(lambda: driver.current_url.startswith(shop),
              message="the resumed stream never brought the turn")
        assert call("GET", f"{served.base}/v1/tasks/{uid}")[2]["status"] == "admitted"
    finally:
        served.server.stop()
