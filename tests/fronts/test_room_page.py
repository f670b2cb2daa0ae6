"""The waiting page on the HTTP front (protocol/fronts/http/page.py): the visitor's language
and the page's parts on their own, then a real `zstalk serve`: a page only for functions
the public may join, German for Accept-Language: de, a CSP without 'unsafe-inline', the
static files cached for a year, and a room_template read at start and on SIGHUP, where
a template with an error keeps the page in use and the log names the file.  The page in
a real browser: tests/end_to_end/test_room_page_browser.py."""
from __future__ import annotations

import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from servers import find_zstalk, self_check
from test_task_limits_end_to_end import docs_block
from test_waiting_room_end_to_end import FUNCTION, room_files, serve
from zstalk.broker.config_file import core_fields, load
from zstalk.broker.core.broker import Broker, Config
from zstalk.protocol.fronts.http.api import Problem
from zstalk.protocol.fronts.http.page import CSP, Pages, duration_text, language

CONFIG = f'''
[functions.{FUNCTION}]
online = "only"
concurrency = 1
online_heartbeat = "2m"
{{template}}
[functions.members]
url = "http://127.0.0.1:9/members"
online = "master"

[functions.plain]
url = "http://127.0.0.1:9/plain"
'''
TEMPLATE = "<!DOCTYPE html><html><body><header>Shop {n}</header>\n{{{{ room }}}}\n</body></html>\n"


def get(url: str, headers: dict | None = None) -> tuple[int, dict, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read().decode()


# -- the parts -----------------------------------------------------------------------------
@pytest.mark.parametrize("header, chosen", [
    ("de-AT,de;q=0.9,en;q=0.5", "de"), ("en-GB,de;q=0.8", "en"), ("fr, de;q=0.3", "de"),
    ("de;q=0, en;q=0.1", "en"), ("", "en"), ("fr, ja", "en"), ("DE", "de")])
def test_the_language_is_the_weightiest_of_english_and_german_the_visitor_accepts(header, chosen):
    assert language(header) == chosen


def test_a_duration_is_said_in_seconds_below_two_minutes_else_in_minutes():
    assert (duration_text(30_000, "en"), duration_text(300_000, "de")) == ("30 s", "5 Min.")


def test_a_page_is_made_only_for_a_function_the_public_may_join_or_a_name_under_base_url():
    pages = Pages()
    refused = pages.page({FUNCTION: ["", 60_000]}, "plain", "")
    assert isinstance(refused, Problem) and refused.status == 404
    html, lang = pages.page({"": ["", 60_000]}, "any-name", "de")
    assert lang == "de" and 'data-function="any-name"' in html and "1 Min." not in html
    assert "60 Sek." in html, "the heartbeat, as the page says it"


def test_the_page_runs_nothing_inline_and_names_its_static_files_by_their_version():
    pages = Pages()
    html, _ = pages.page({FUNCTION: ["", 60_000]}, FUNCTION, "")
    assert "<script>" not in html and "<style" not in html and " style=" not in html
    assert f'src="/room/static/room.js?v={pages.version}"' in html
    assert 'aria-live="polite"' in html
    assert "'unsafe-inline'" not in CSP and "frame-ancestors 'none'" in CSP


# -- a real server -------------------------------------------------------------------------
needs_zstalk = pytest.mark.skipif(self_check(), reason="needs zstalk")


@pytest.fixture
def shop(tmp_path):
    (tmp_path / "room.html").write_text(TEMPLATE.format(n=1))
    served = serve(tmp_path, config_text=CONFIG.replace(
        "{template}", 'room_template = "room.html"'))
    yield served
    served.server.stop()


@needs_zstalk
def test_a_function_the_public_may_not_join_has_no_page_but_a_404_in_json(shop):
    for name in ("plain", "members", "nosuch"):
        code, headers, body = get(f"{shop.base}/room/{name}")
        assert code == 404 and headers["Content-Type"].startswith("application/json"), body
        assert '"error": "not_found"' in body
    assert get(f"{shop.base}/room/static/other.js")[0] == 404


@needs_zstalk
def test_the_page_is_german_for_a_german_visitor_under_a_csp_without_unsafe_inline(shop):
    code, headers, body = get(f"{shop.base}/room/{FUNCTION}", {"Accept-Language": "de-DE"})
    assert code == 200 and headers["Content-Language"] == "de"
    assert "Vor Ihnen in der Schlange" in body and "2 Min." in body
    assert headers["Content-Security-Policy"] == CSP and "unsafe-inline" not in \
        headers["Content-Security-Policy"]
    assert headers["Cache-Control"] == "no-store" and headers["Vary"] == "Accept-Language"
    english = get(f"{shop.base}/room/{FUNCTION}")[2]
    assert "Keep this page open" in english and "2 min" in english


@needs_zstalk
def test_the_static_files_are_cached_for_a_year(shop):
    version = Pages().version
    code, headers, body = get(f"{shop.base}/room/static/room.js?v={version}")
    assert code == 200 and headers["Content-Type"].startswith("text/javascript")
    assert headers["Cache-Control"] == "public, max-age=31536000, immutable"
    assert "getReader" in body
    assert get(f"{shop.base}/room/static/room.css")[1]["Content-Type"].startswith("text/css")


def page_says(base: str, text: str, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while text not in get(f"{base}/room/{FUNCTION}")[2]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@needs_zstalk
def test_a_room_template_is_read_again_on_sighup_and_one_with_an_error_keeps_the_old(
        shop, tmp_path):
    assert page_says(shop.base, "<header>Shop 1</header>")
    template = tmp_path / "room.html"
    template.write_text("<p>no placeholder</p>")
    shop.server.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while f"room_template {template}: needs {{{{ room }}}} exactly once" not in \
            shop.server.output():
        assert time.monotonic() < deadline, shop.server.output()
        time.sleep(0.05)
    assert "kept the waiting page in use" in shop.server.output()
    assert page_says(shop.base, "<header>Shop 1</header>"), "the page in use stays"
    template.write_text(TEMPLATE.format(n=2))
    shop.server.process.send_signal(signal.SIGHUP)
    assert page_says(shop.base, "<header>Shop 2</header>")


@needs_zstalk
def test_a_room_template_that_cannot_be_read_at_start_refuses_the_config_naming_it(tmp_path):
    keys, config = room_files(tmp_path, config_text=CONFIG.replace(
        "{template}", 'room_template = "missing.html"'))
    out = subprocess.run([find_zstalk(), "serve", "-p", "0", "--config", config,
                          "--pass-key-file", keys], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert f"room_template {tmp_path / 'missing.html'}: No such file or directory" in out.stderr


@needs_zstalk
def test_the_docs_template_puts_the_room_inside_the_shops_own_page(tmp_path):
    """docs/waiting-room.md's shop-room.toml and shop-room.html as written."""
    (tmp_path / "shop-room.html").write_text(
        docs_block("waiting-room.md", "<!-- shop-room.html -->"))
    served = serve(tmp_path, config_text=docs_block("waiting-room.md", "# shop-room.toml"))
    try:
        code, headers, body = get(f"{served.base}/room/checkout")
        assert code == 200 and "<title>Shop: the line</title>" in body
        header, room = body.index('<header><a href="/">The shop</a></header>'), \
            body.index('<main id="zstalk-room"')
        assert header < room < body.index("</body>")
        assert headers["Content-Security-Policy"] == CSP
    finally:
        served.server.stop()


def test_a_room_template_is_read_relative_to_the_config_and_inherited_from_functions(tmp_path):
    (tmp_path / "pages").mkdir()
    (tmp_path / "pages" / "all.html").write_text(TEMPLATE.format(n="all"))
    (tmp_path / "pages" / "own.html").write_text(TEMPLATE.format(n="own"))
    config = tmp_path / "zstalk.toml"
    config.write_text('[functions]\nbase_url = "http://127.0.0.1:9"\nfunctions = ["listed"]\n'
                      'online = "public"\nroom_template = "pages/all.html"\n'
                      '[functions.own]\nroom_template = "pages/own.html"\n'
                      '[functions.members]\nonline = "master"\n'
                      '[functions.plain]\nroom_template = ""\n')
    rooms = Broker(Config(**core_fields(load(str(config)))), 0.0).settings().rooms
    assert set(rooms) == {"own", "listed", "plain"}, \
        "not members (master), nor others (no base_url_any)"
    assert "Shop own" in rooms["own"][0] and "Shop all" in rooms["listed"][0]
    assert rooms["plain"][0] == "", 'its own "": the built-in page'
