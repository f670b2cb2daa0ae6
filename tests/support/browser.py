# A real browser for the tests of what only a browser enforces (CORS) or shows (the
# waiting page, the dashboard): Debian's chromium, headless, which scripts/test installs
# (the browser group: chromium and chromium-driver).
#
# page_text(url, element_id) opens the page in a fresh profile, lets its scripts run until
# nothing is left to do (virtual time: a page's timers fire at once, while its fetches are
# waited for, within a budget), and gives back the text of that element in the DOM as the
# scripts left it.  No WebDriver: `--dump-dom` is all the tests need, and one process per
# page starts in about a second.  Without chromium, or with ZSTALK_TEST_SKIP=browser, the test
# is skipped, or fails under CI=true (servers.needs_group).
#
# visitor(profile) is a whole browser driven through WebDriver, for a page that goes on
# living while the test acts (the waiting page): Selenium with Debian's chromedriver
# (Service("/usr/bin/chromedriver"), SE_OFFLINE=true: Selenium Manager never downloads a
# driver or a browser), one profile folder each, so each visitor has a localStorage of
# its own.
#
# webdriver_chromium(profile) is the same for the dashboard's tests, at a desktop's size.
from __future__ import annotations

import html
import os
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


def visitor(profile: str, language: str = "en", width: int = 900, height: int = 640):
    """A headless chromium of its own `profile` folder, asking for pages in `language`,
    its console kept (get_log); the caller quits it."""
    browser, driver = chromium(), needs_group("browser", "chromedriver")
    os.environ["SE_OFFLINE"] = "true"       # (never a downloaded driver)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                     "--disable-dev-shm-usage", f"--user-data-dir={profile}",
                     f"--window-size={width},{height}", f"--lang={language}"):
        options.add_argument(argument)
    options.add_experimental_option("prefs", {"intl.accept_languages": language})
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=options)


def webdriver_chromium(profile: str, width: int = 1400, height: int = 1000):
    """`visitor` at a desktop's size (the dashboard's tests)."""
    return visitor(profile, "en", width, height)
