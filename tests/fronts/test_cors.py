"""CORS for the waiting room (protocol/fronts/http/cors.py): the rules on their own, then
a real `zstalk serve` answering preflights and actual requests with and without an
Origin, a 429 a page can read, and a SIGHUP that changes the origins.  What a real
browser makes of it: tests/project/test_readme.py's shop page, and test_a_browser_page_* below."""
from __future__ import annotations

import signal
import time

import pytest

from servers import self_check
from test_waiting_room_end_to_end import FUNCTION, call, serve
from zstalk.protocol.fronts.http.cors import ROUTES, allowed, preflight_refusal
from zstalk.protocol.schema import Settings

SHOP, ADMIN, ELSEWHERE = "https://shop.example", "https://admin.example", "https://else.example"
ENQUEUE, TASK, DONE = ROUTES["/v1/tasks"], ROUTES["/v1/tasks/{uniqueId}"], \
    ROUTES["/v1/tasks/{uniqueId}/done"]
#: checkout: a room pages join; report: offline, needs the key to enqueue (so no page may),
#: but a page may read and end its tasks; plain: no CORS
CONFIG = f'''
[functions.{FUNCTION}]
online = "only"
concurrency = 1
max_waiting_per_client = 2
allow_origins = ["{SHOP}"]

[functions.report]
url = "http://127.0.0.1:9/report"
allow_origins = ["{ADMIN}"]

[functions.plain]
url = "http://127.0.0.1:9/plain"
'''
SETTINGS = Settings(allow_origins={FUNCTION: [SHOP], "report": [ADMIN]},
                    enqueue_origins=[SHOP])


# -- the rules ---------------------------------------------------------------------------------
def test_a_preflight_to_enqueue_is_judged_by_the_origins_of_functions_a_page_can_enqueue_to():
    assert preflight_refusal(SETTINGS, ENQUEUE, SHOP, "POST", "content-type") is None
    refused = preflight_refusal(SETTINGS, ENQUEUE, ADMIN, "POST", "content-type")
    assert refused.status == 403 and "may not enqueue" in refused.message
    assert preflight_refusal(SETTINGS, TASK, ADMIN, "GET", "") is None
    assert preflight_refusal(SETTINGS, DONE, ADMIN, "POST", "authorization") is None


def test_a_preflight_asking_for_another_method_or_header_is_refused_naming_it():
    assert "only POST here, not DELETE" in preflight_refusal(
        SETTINGS, ENQUEUE, SHOP, "DELETE", "").message
    refused = preflight_refusal(SETTINGS, ENQUEUE, SHOP, "POST", "content-type,authorization")
    assert "may not send authorization here (a page enqueues without the master key)" in \
        refused.message
    assert preflight_refusal(SETTINGS, DONE, SHOP, "POST", "X-Zstalk-Pass, Content-Type") is None


def test_a_reply_is_readable_by_a_page_its_function_lists_or_when_none_is_named_as_preflight():
    assert allowed(SETTINGS, ENQUEUE, SHOP, (FUNCTION,))
    assert not allowed(SETTINGS, ENQUEUE, SHOP, ("report",))
    assert not allowed(SETTINGS, ENQUEUE, SHOP, (FUNCTION, "plain")), "a batch: every one"
    assert allowed(SETTINGS, ENQUEUE, SHOP, None) and not allowed(SETTINGS, ENQUEUE, ADMIN, None)
    assert allowed(SETTINGS, TASK, ADMIN, None)
    anyone = Settings(allow_origins={"": ["*"]})
    assert allowed(anyone, TASK, ELSEWHERE, ("unlisted",)), "a name under base_url"


# -- a real server -----------------------------------------------------------------------------
needs_zstalk = pytest.mark.skipif(self_check(), reason="needs zstalk")


@pytest.fixture
def shop(tmp_path):
    served = serve(tmp_path, config_text=CONFIG)
    yield served
    served.server.stop()


def preflight(base: str, path: str, origin: str, method: str = "POST",
              headers: str = "content-type") -> tuple[int, dict, dict]:
    return call("OPTIONS", base + path, headers={
        "Origin": origin, "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": headers})


def cors_headers(headers: dict) -> dict:
    return {k: v for k, v in headers.items() if k.startswith("Access-Control-") or k == "Vary"}


@needs_zstalk
def test_an_allowed_preflight_answers_204_with_the_origin_method_headers_and_max_age(shop):
    code, headers, _ = preflight(shop.base, "/v1/tasks", SHOP)
    assert code == 204 and cors_headers(headers) == {
        "Access-Control-Allow-Origin": SHOP, "Access-Control-Allow-Methods": "POST",
        "Access-Control-Allow-Headers": "Content-Type", "Access-Control-Max-Age": "600",
        "Vary": "Origin"}
    code, headers, _ = preflight(shop.base, "/v1/tasks/any/done", ADMIN,
                                 headers="authorization,content-type")
    assert code == 204 and headers["Access-Control-Allow-Origin"] == ADMIN
    assert headers["Access-Control-Allow-Headers"] == "Content-Type, Authorization, X-Zstalk-Pass"
    code, headers, _ = preflight(shop.base, "/v1/tasks/any", SHOP, "GET", "")
    assert code == 204 and headers["Access-Control-Allow-Methods"] == "GET, DELETE"
    assert "Access-Control-Allow-Credentials" not in headers


@needs_zstalk
def test_a_preflight_lets_a_page_delete_its_task_with_its_token_in_authorization(shop):
    code, headers, _ = preflight(shop.base, "/v1/tasks/any", SHOP, "DELETE", "authorization")
    assert code == 204 and cors_headers(headers) == {
        "Access-Control-Allow-Origin": SHOP, "Access-Control-Allow-Methods": "GET, DELETE",
        "Access-Control-Allow-Headers": "Content-Type, Authorization",
        "Access-Control-Max-Age": "600", "Vary": "Origin"}
    code, _, body = preflight(shop.base, "/v1/tasks/any", SHOP, "PATCH", "authorization")
    assert code == 403 and "only GET or DELETE here, not PATCH" in body["message"]


@needs_zstalk
def test_a_refused_preflight_answers_403_in_json_without_any_cors_header(shop):
    for origin, method, asked in ((ELSEWHERE, "POST", "content-type"),
                                  (ADMIN, "POST", "content-type"),    # report: key to enqueue
                                  (SHOP, "POST", "authorization"),
                                  (SHOP, "DELETE", "")):
        code, headers, body = preflight(shop.base, "/v1/tasks", origin, method, asked)
        assert (code, body["error"]) == (403, "forbidden"), (origin, method, asked)
        assert cors_headers(headers) == {"Vary": "Origin"}
    code, headers, _ = call("OPTIONS", f"{shop.base}/v1/tasks")     # (no preflight)
    assert code == 204 and set(headers["Allow"].split(", ")) == {"GET", "HEAD", "OPTIONS",
                                                                  "POST"}


@needs_zstalk
def test_an_enqueue_from_a_page_its_function_lists_is_readable_and_from_others_not(shop):
    code, headers, body = call("POST", f"{shop.base}/v1/tasks",
                               {"function": FUNCTION, "type": "online"}, {"Origin": SHOP})
    assert code == 201 and cors_headers(headers) == {
        "Access-Control-Allow-Origin": SHOP, "Vary": "Origin",
        "Access-Control-Expose-Headers": "Location, WWW-Authenticate"}
    uid = body["uniqueId"]
    code, headers, _ = call("POST", f"{shop.base}/v1/tasks", {"function": "report"},
                            {"Origin": SHOP})
    assert code == 201 and cors_headers(headers) == {"Vary": "Origin"}, "report lists ADMIN"
    code, headers, _ = call("POST", f"{shop.base}/v1/tasks", {"function": "nosuch"},
                            {"Origin": SHOP})
    assert code == 404 and "Access-Control-Allow-Origin" not in headers, "named, not listed"
    code, headers, _ = call("POST", f"{shop.base}/v1/tasks", "no object", {"Origin": SHOP})
    assert code == 400 and headers["Access-Control-Allow-Origin"] == SHOP, "none named"
    code, headers, _ = call("GET", f"{shop.base}/v1/tasks/{uid}")
    assert code == 200 and cors_headers(headers) == {}, "no Origin: as before"


@needs_zstalk
def test_a_page_reads_its_task_and_ends_it_with_its_pass_when_the_function_lists_it(shop):
    uid = call("POST", f"{shop.base}/v1/tasks", {"function": FUNCTION, "type": "online"})[2][
        "uniqueId"]
    code, headers, info = call("GET", f"{shop.base}/v1/tasks/{uid}", headers={"Origin": SHOP})
    assert (code, info["status"], headers["Access-Control-Allow-Origin"]) == (
        200, "admitted", SHOP)
    code, headers, _ = call("GET", f"{shop.base}/v1/tasks/{uid}", headers={"Origin": ADMIN})
    assert code == 200 and cors_headers(headers) == {"Vary": "Origin"}
    code, headers, _ = call("GET", f"{shop.base}/v1/tasks/nosuch", headers={"Origin": ADMIN})
    assert code == 404 and headers["Access-Control-Allow-Origin"] == ADMIN, "as its preflight"
    code, headers, done = call("POST", f"{shop.base}/v1/tasks/{uid}/done", {}, {
        "Origin": SHOP, "Authorization": f"Bearer {info['pass']}"})
    assert (code, done["endedBy"], headers["Access-Control-Allow-Origin"]) == (200, "done", SHOP)
    code, headers, _ = call("DELETE", f"{shop.base}/v1/tasks/{uid}", headers={"Origin": SHOP})
    assert code == 409 and headers["Access-Control-Allow-Origin"] == SHOP, "it can read why"


@needs_zstalk
def test_a_page_leaves_the_line_with_its_token_and_reads_the_answer(shop):
    joined = [call("POST", f"{shop.base}/v1/tasks", {"function": FUNCTION, "type": "online"},
                   {"Origin": SHOP})[2] for _ in range(2)]
    assert [j["status"] for j in joined] == ["admitted", "queued"]
    code, headers, info = call("DELETE", f"{shop.base}/v1/tasks/{joined[1]['uniqueId']}",
                               headers={"Origin": SHOP,
                                        "Authorization": f"Bearer {joined[1]['token']}"})
    assert (code, info["status"], headers["Access-Control-Allow-Origin"]) == (
        200, "cancelled", SHOP)


@needs_zstalk
def test_a_page_can_read_why_it_may_not_wait_again(shop):
    for _ in range(4):                  # one admitted, then max_waiting_per_client = 2
        code, headers, body = call("POST", f"{shop.base}/v1/tasks",
                                   {"function": FUNCTION, "type": "online"}, {"Origin": SHOP})
    assert (code, body["error"]) == (429, "too_many_waiting")
    assert headers["Access-Control-Allow-Origin"] == SHOP


@needs_zstalk
def test_sighup_changes_the_origins_a_front_allows(shop, tmp_path):
    assert preflight(shop.base, "/v1/tasks", SHOP)[0] == 204
    (tmp_path / "zstalk.toml").write_text(CONFIG.replace(f'["{SHOP}"]', f'["{ELSEWHERE}"]'))
    shop.server.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while preflight(shop.base, "/v1/tasks", SHOP)[0] != 403:
        assert time.monotonic() < deadline, "the new origins never reached the front"
        time.sleep(0.05)
    code, headers, _ = preflight(shop.base, "/v1/tasks", ELSEWHERE)
    assert code == 204 and headers["Access-Control-Allow-Origin"] == ELSEWHERE


# -- a real browser ----------------------------------------------------------------------------
PAGE = """<!doctype html>
<pre id="out">running</pre>
<script>
const api = "API";
async function visit() {
  const joined = await fetch(`${api}/v1/tasks`, {method: "POST",
    headers: {"Content-Type": "application/json"},
    body: JSON.stringify({function: "FUNCTION", type: "online"})});
  const {uniqueId} = await joined.json();
  const task = await (await fetch(`${api}/v1/tasks/${uniqueId}`)).json();
  const done = await fetch(`${api}/v1/tasks/${uniqueId}/done`, {method: "POST",
    headers: {"Authorization": `Bearer ${task.pass}`}});
  return [joined.status, joined.headers.get("Location") !== null, task.status, done.status];
}
visit().then((seen) => document.getElementById("out").textContent = JSON.stringify(seen),
             (error) => document.getElementById("out").textContent = `${error}`);
</script>
"""


def serve_site(site, address: str, port: int):
    """The folder `site` at http://address:port/ from a thread (the server, to shut down)."""
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer((address, port),
                                             functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@needs_zstalk
def test_a_browser_page_from_a_listed_origin_joins_reads_and_ends_its_task_and_others_cannot(
        tmp_path):
    from browser import chromium, page_text
    from servers import free_port
    chromium()
    listed, other = f"http://127.0.0.2:{free_port()}", f"http://127.0.0.3:{free_port()}"
    served = serve(tmp_path, config_text=CONFIG.replace(SHOP, listed))
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text(PAGE.replace("API", served.base).replace("FUNCTION",
                                                                               FUNCTION))
    pages = [serve_site(site, url[7:].split(":")[0], int(url.rsplit(":", 1)[1]))
             for url in (listed, other)]
    try:
        assert page_text(f"{listed}/", "out") == '[201,true,"admitted",200]'
        assert page_text(f"{other}/", "out") == "TypeError: Failed to fetch"
        tasks = call("GET", f"{served.base}/v1/tasks?function={FUNCTION}")[2]["tasks"]
        assert len(tasks) == 1, "the browser stopped the other at its preflight: no task"
    finally:
        for page in pages:
            page.shutdown()
            page.server_close()
        served.server.stop()
