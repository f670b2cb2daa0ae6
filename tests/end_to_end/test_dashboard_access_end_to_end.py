"""The dashboard's safety end to end (issue 50): a real `zstalk serve --master-key
--viewer-key-file`, a log-in that hands out the cookie (taken by another server with the
same master key, refused once the key rotated), the action header, the viewer's limits;
and a keyless server that answers the dashboard to no forwarded request."""
from __future__ import annotations

import http.client
import json

import pytest

from servers import LOOPBACK, ServerProcess, find_zstalk, free_port, self_check
from test_operator_views_end_to_end import KEY, put
from test_tasks_end_to_end import Api

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")
VIEWER = "viewer-test-key"


def serve(tmp_path, *args: str) -> Api:
    port, http_port = free_port(), free_port()
    process = ServerProcess([find_zstalk(), "serve", "-l", LOOPBACK, "-p", str(port),
                             "--counter-port", "0", "--worker-bind", "none",
                             "--http-port", str(http_port), *args], (LOOPBACK, port),
                            name="zstalk-dashboard-access").start()
    api = Api(f"http://{LOOPBACK}:{http_port}", process)
    api.wait_listening()
    return api


@pytest.fixture
def server(tmp_path):
    viewer = tmp_path / "viewer.key"
    viewer.write_text(VIEWER + "\n")
    api = serve(tmp_path, "--master-key", KEY, "--viewer-key-file", str(viewer))
    yield api
    api.server.stop()


def ask(api: Api, method: str, path: str, body=None, headers=None) -> tuple[int, dict, dict]:
    """(status, JSON, headers) of one request with exactly these headers."""
    conn = http.client.HTTPConnection(*api.base.removeprefix("http://").split(":"), timeout=10)
    data = None if body is None else json.dumps(body).encode()
    sent = {"Content-Type": "application/json", **(headers or {})}
    conn.request(method, path, body=data, headers=sent)
    response = conn.getresponse()
    raw = response.read()
    conn.close()
    return response.status, json.loads(raw) if raw else {}, dict(response.getheaders())


def login(api: Api, key: str) -> str:
    code, doc, headers = ask(api, "POST", "/ui/login", {"key": key})
    assert code == 200, doc
    cookie = headers["Set-Cookie"]
    for attribute in ("HttpOnly", "SameSite=Strict", "Path=/"):
        assert attribute in cookie
    return cookie.split(";")[0]


def test_the_master_keys_cookie_acts_only_with_the_action_header(server):
    put(server.server.address, "work", b"a")
    cookie = login(server, KEY)
    assert ask(server, "GET", "/ui/session", headers={"Cookie": cookie})[1]["role"] == "master"
    code, doc, _ = ask(server, "PATCH", "/v1/tubes/work", {"pausedFor": 30},
                       headers={"Cookie": cookie})
    assert code == 403 and "X-Zstalk-Action" in doc["message"]
    code, doc, _ = ask(server, "PATCH", "/v1/tubes/work", {"pausedFor": 30},
                       headers={"Cookie": cookie, "X-Zstalk-Action": "1"})
    assert code == 200 and doc["paused"] is True


def test_the_viewer_key_sees_counts_but_no_body_and_cannot_act(server):
    [job] = put(server.server.address, "work", b"secret body")
    cookie = login(server, VIEWER)
    as_viewer = {"Cookie": cookie, "X-Zstalk-Action": "1"}
    code, snap, _ = ask(server, "GET", "/v1/dashboard", headers=as_viewer)
    assert code == 200 and snap["functions"] is not None
    assert [t["currentJobsReady"] for t in snap["tubes"] if t["name"] == "work"] == [1]
    code, info, _ = ask(server, "GET", f"/v1/jobs/{job}", headers=as_viewer)
    assert code == 200 and "body" not in info
    for headers in (as_viewer, {"Authorization": f"Bearer {VIEWER}"}):
        code, doc, _ = ask(server, "POST", "/v1/tubes/work/kick", {"bound": 1}, headers=headers)
        assert code == 403 and "acting needs the master key" in doc["message"], doc
        code, doc, _ = ask(server, "GET", "/v1/functions", headers=headers)
        assert code == 403 and "reads the dashboard (/v1/dashboard)" in doc["message"], doc
    assert ask(server, "GET", f"/v1/jobs/{job}",
               headers={"Authorization": f"Bearer {KEY}"})[1]["body"] == "secret body"


def test_without_a_key_the_dashboard_shows_counts_only_and_no_action_is_taken(server):
    put(server.server.address, "work", b"a")
    code, snap, _ = ask(server, "GET", "/v1/dashboard")
    assert code == 200 and snap["functions"] is None
    assert ask(server, "POST", "/v1/tubes/work/kick", {"bound": 1})[0] == 401
    assert ask(server, "POST", "/ui/login", {"key": "guess"})[0] == 403
    assert ask(server, "GET", "/ui/session")[1] == {"role": "nobody", "keyed": True}


def test_a_forged_cookie_is_nobody_and_logging_out_clears_it(server):
    assert ask(server, "GET", "/ui/session",
               headers={"Cookie": "zstalk_ui=master.99999999999.forged"})[1]["role"] == "nobody"
    code, _, headers = ask(server, "POST", "/ui/logout")
    assert code == 200 and "zstalk_ui=" in headers["Set-Cookie"]


def test_a_cookie_made_before_the_master_key_rotated_is_refused(tmp_path):
    first = serve(tmp_path, "--master-key", KEY)
    try:
        cookie = login(first, KEY)
    finally:
        first.server.stop()
    rotated = serve(tmp_path, "--master-key", "a-new-master-key")
    try:
        assert ask(rotated, "GET", "/ui/session", headers={"Cookie": cookie})[1]["role"] == "nobody"
        again = serve(tmp_path, "--master-key", KEY)       # (the same key: another server takes it)
        try:
            assert ask(again, "GET", "/ui/session",
                       headers={"Cookie": cookie})[1]["role"] == "master"
        finally:
            again.server.stop()
    finally:
        rotated.server.stop()


def test_a_keyless_dashboard_refuses_a_forwarded_request(tmp_path):
    api = serve(tmp_path)
    try:
        assert ask(api, "GET", "/v1/dashboard")[0] == 200
        assert ask(api, "GET", "/ui/session")[1] == {"role": "master", "keyed": False}
        for header in ("X-Forwarded-For", "Forwarded"):
            code, doc, _ = ask(api, "GET", "/v1/dashboard", headers={header: "192.0.2.7"})
            assert code == 403 and "forwarded" in doc["message"]
            assert ask(api, "GET", "/ui/session", headers={header: "192.0.2.7"})[0] == 403
    finally:
        api.server.stop()


def test_a_viewer_key_without_a_master_key_is_a_usage_error(tmp_path):
    import subprocess
    viewer = tmp_path / "viewer.key"
    viewer.write_text(VIEWER)
    done = subprocess.run([find_zstalk(), "serve", "-p", "0", "--http-port", str(free_port()),
                           "--viewer-key-file", str(viewer)], capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "--viewer-key-file needs a master key" in done.stderr


def test_ten_wrong_keys_from_one_address_make_its_log_ins_wait(server):
    for _ in range(10):
        assert ask(server, "POST", "/ui/login", {"key": "guess"})[0] == 403
    code, doc, headers = ask(server, "POST", "/ui/login", {"key": KEY})
    assert (code, doc["error"], headers["Retry-After"]) == (429, "too_many_logins", "60")
    assert ask(server, "GET", "/v1/tubes", headers={"Authorization": f"Bearer {KEY}"})[0] == 200


def test_ui_typed_without_its_slash_is_sent_on_to_the_page(server):
    code, _, headers = ask(server, "GET", "/ui")
    assert (code, headers["Location"]) == (308, "/ui/")
