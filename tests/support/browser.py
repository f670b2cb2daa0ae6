# A real browser for the tests of what only a browser enforces (CORS) or shows (the
# dashboard): Debian's chromium, headless, which scripts/test installs (the browser group:
# chromium and chromium-driver).
#
# page_text(url, element_id) opens the page in a fresh profile, lets its scripts run until
# nothing is left to do (virtual time: a page's timers fire at once, while its fetches are
# waited for, within a budget), and gives back the text of that element in the DOM as the
# scripts left it: `--dump-dom`, one process per page, about a second.  A test that clicks
# and types and watches a page change (the dashboard's) drives chromium through Debian's
# chromium-driver with Selenium instead (webdriver_chromium).  Without chromium, or with
# ZSTALK_TEST_SKIP=browser, the test is skipped, or fails under CI=true (servers.needs_group).
from __future__ import annotations

import html
import re
import subprocess
import tempfile

from servers import needs_group

BUDGET_MS = 20_000      # virtual time a page may take (its timers' waits count, not real time)
TIMEOUT_S = 60


def chromium() -> str:
    """Debian's chromium (scripts/test's browser group), or its name elsewhere."""
    return needs_group("browser", "chromium", "chromium-browser", "google-chrome")


def page_text(url: str, element_id: str) -> str:
    """The text of `element_id` once the page at `url` has done all it will."""
    with tempfile.TemporaryDirectory(prefix="zstalk-browser-") as profile:
        # (--no-sandbox: tests run as root, where chromium's sandbox will not start)
        out = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                              "--no-first-run", f"--user-data-dir={profile}",
                              f"--virtual-time-budget={BUDGET_MS}", "--dump-dom", url],
                             capture_output=True, text=True, timeout=TIMEOUT_S)
    match = re.search(rf'<(\w+) id="{re.escape(element_id)}"[^>]*>(.*?)</\1>', out.stdout, re.S)
    assert match, f"no #{element_id} in the page's DOM:\n{out.stdout}\n{out.stderr[-2000:]}"
    return html.unescape(match[2])


def webdriver_chromium(profile: str, width: int = 1400, height: int = 1000):
    """Debian's headless chromium driven by Debian's chromium-driver through Selenium
    (offline: Selenium Manager downloads nothing), in the fresh profile `profile`; the
    caller quits it."""
    import os

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    os.environ["SE_OFFLINE"] = "true"
    driver = needs_group("browser", "chromedriver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium()
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                     f"--window-size={width},{height}", f"--user-data-dir={profile}"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})     # (console: get_log)
    return webdriver.Chrome(service=Service(driver), options=options)
