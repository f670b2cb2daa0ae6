"""The waiting room's gateway in real nginx (Debian's, issue 31): k8s/gateway/nginx-auth-request.conf
itself, its ${NAME}s filled in, runs in front of a recording API, and its auth_request asks a
stand-in for zstalk's GET /v1/passes/verify.  The stand-in is the endpoint's own logic
(protocol/fronts/http/pass_check.py) on a fixed key set, with a set of revoked task ids for the
broker's answer (or no answer: the broker away), until the HTTP front serves it.

No pass or not a pass: 401 from nginx, WWW-Authenticate passed on; a good pass: the API's 200,
with the task id and the kind of check in headers nginx set; expired, forged, another
function's, an unknown key's, or revoked: 403 with the reason; a refused request never reaches
the API.  Without nginx: skipped, except under CI=true, where it fails."""
from __future__ import annotations

import http.client
import re
import time
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest

from nginx import NGINX_CONF, Backend, Nginx, Recorded, Reply, require_nginx
from servers import LOOPBACK, free_port, start_on_a_free_port
from zstalk.protocol.codecs.passes import PassKeys, sign_pass
from zstalk.protocol.fronts.http.pass_check import check_request, settle

pytestmark = pytest.mark.reference

GATEWAY_CONF = Path(__file__).resolve().parents[2] / "k8s" / "gateway" / "nginx-auth-request.conf"

OLD_KEY = b"old-" + b"0123456789abcdef" * 2
NEW_KEY = b"new-" + b"fedcba9876543210" * 2
KEYS = PassKeys([("new", NEW_KEY), ("old", OLD_KEY)])      # mid-rotation: both verify
FUNCTION = "checkout"


class VerifyStandIn:
    """GET /v1/passes/verify as the HTTP front will answer it, on 127.0.0.1."""

    def __init__(self) -> None:
        self.revoked: set[str] = set()
        self.broker_away = False
        self.backend = Backend("zstalk", self.answer)

    def answer(self, request: Recorded) -> Reply:
        url = urlsplit(request.path)
        if (request.method, url.path) != ("GET", "/v1/passes/verify"):
            return Reply(404, {}, b"")
        query = dict(parse_qsl(url.query, keep_blank_values=True))
        verdict = check_request(request.headers, query, KEYS, time.time())
        if verdict.uid_to_check is not None:
            admitted = None if self.broker_away else verdict.uid_to_check not in self.revoked
            verdict = settle(verdict, admitted)
        return Reply(verdict.status, verdict.headers, verdict.body)


def render(template: str, values: dict[str, str]) -> str:
    """envsubst as the nginx image runs it, for exactly the names the template uses."""
    assert set(re.findall(r"\$\{([A-Z_]+)\}", template)) == set(values)
    return re.sub(r"\$\{([A-Z_]+)\}", lambda name: values[name[1]], template)


def start_gateway(tmp: Path, verify: Backend, api: Backend) -> tuple[Nginx, tuple[str, int]]:
    """nginx with the gateway's server block; NGINX_CONF's own server, with no locations,
    listens on a port of its own, which tells when nginx is ready (it binds both at once)."""
    binary = require_nginx()
    gateway = (LOOPBACK, 0)

    def build() -> Nginx:
        nonlocal gateway
        port, gateway = free_port(), (LOOPBACK, free_port())
        prefix = tmp / f"nginx-{port}"
        prefix.mkdir(parents=True, exist_ok=True)
        server = render(GATEWAY_CONF.read_text(), {
            "GATEWAY_LISTEN": f"{gateway[0]}:{gateway[1]}", "PROTECTED_API": api.server,
            "ZSTALK_HTTP": verify.server, "ZSTALK_FUNCTION": FUNCTION})
        (prefix / "gateway.conf").write_text(server)
        conf = NGINX_CONF.format(prefix=prefix, http=f"    include {prefix}/gateway.conf;",
                                 host=LOOPBACK, port=port, locations="")
        return Nginx(binary, prefix, conf, port)
    return start_on_a_free_port(build), gateway


@pytest.fixture(scope="module")
def stand_in():
    service = VerifyStandIn()
    yield service
    service.backend.stop()


@pytest.fixture(scope="module")
def api():
    with Backend("api") as backend:
        yield backend


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, stand_in, api):
    nginx, address = start_gateway(tmp_path_factory.mktemp("gateway"), stand_in.backend, api)
    yield address
    nginx.stop()


@pytest.fixture(autouse=True)
def fresh(stand_in):
    stand_in.revoked.clear()
    stand_in.broker_away = False


def get(address: tuple[str, int], headers: dict[str, str]) -> Reply:
    connection = http.client.HTTPConnection(*address, timeout=5)
    try:
        connection.request("GET", "/orders?id=7", headers=headers)
        response = connection.getresponse()
        return Reply(response.status, dict(response.getheaders()), response.read())
    finally:
        connection.close()


def a_pass(uid: str = "4f1c2a9be0d34c7f8a61b2c3d4e5f607", function: str = FUNCTION,
           ttl_s: int = 300, keys: PassKeys = KEYS) -> str:
    return sign_pass(keys, uid, function, int(time.time()) + ttl_s)


def forge(token: str) -> str:
    """`token` with the first character of its MAC changed."""
    return token[:-43] + ("B" if token[-43] == "A" else "A") + token[-42:]


def refused(gateway, api, headers: dict[str, str]) -> Reply:
    before = len(api.requests)
    reply = get(gateway, headers)
    assert len(api.requests) == before, "a refused request reached the API"
    return reply


def test_a_request_without_a_pass_is_401_and_never_reaches_the_api(gateway, api):
    reply = refused(gateway, api, {})
    assert (reply.status, reply.headers["WWW-Authenticate"]) == (401, "Bearer")
    assert reply.headers["X-Zstalk-Pass-Error"] == "missing"


def test_a_request_with_something_that_is_not_a_pass_is_401(gateway, api):
    reply = refused(gateway, api, {"Authorization": "Bearer zp1.garbage"})
    assert reply.status == 401 and reply.headers["X-Zstalk-Pass-Error"] == "malformed"


@pytest.mark.parametrize("header", ["Authorization", "X-Zstalk-Pass"])
def test_a_good_pass_reaches_the_api_which_learns_the_task_and_that_the_broker_was_asked(
        gateway, api, stand_in, header):
    token = a_pass("task-1")
    value = f"Bearer {token}" if header == "Authorization" else token
    reply = get(gateway, {header: value, "X-Zstalk-Task-Id": "spoofed", "X-Zstalk-Pass-Check": "broker"})
    assert (reply.status, reply.body) == (200, b"api")
    seen = api.requests[-1]
    assert (seen.path, seen.headers["X-Zstalk-Task-Id"], seen.headers["X-Zstalk-Pass-Check"]) == (
        "/orders?id=7", "task-1", "broker")
    asked = stand_in.backend.requests[-1]
    assert (asked.method, asked.path, asked.body) == ("GET", f"/v1/passes/verify?function={FUNCTION}", b"")
    assert asked.headers[header] == value and asked.headers["X-Original-URI"] == "/orders?id=7"


def test_a_pass_of_the_old_key_opens_while_its_line_stays_in_the_key_file(gateway):
    assert get(gateway, {"X-Zstalk-Pass": a_pass(keys=PassKeys({"old": OLD_KEY}))}).status == 200


@pytest.mark.parametrize("why, token", [
    ("expired", lambda: a_pass(ttl_s=-1)),
    ("forged", lambda: forge(a_pass())),
    ("wrong_function", lambda: a_pass(function="refund")),
    ("unknown_kid", lambda: a_pass(keys=PassKeys({"gone": OLD_KEY}))),
])
def test_a_pass_that_is_no_good_here_is_403_with_its_reason(gateway, api, why, token):
    reply = refused(gateway, api, {"Authorization": f"Bearer {token()}"})
    assert (reply.status, reply.headers["X-Zstalk-Pass-Error"]) == (403, why)


def test_a_pass_whose_task_is_done_or_cancelled_is_403_revoked(gateway, api, stand_in):
    token = a_pass("task-done")
    assert get(gateway, {"X-Zstalk-Pass": token}).status == 200
    stand_in.revoked.add("task-done")
    reply = refused(gateway, api, {"X-Zstalk-Pass": token})
    assert (reply.status, reply.headers["X-Zstalk-Pass-Error"]) == (403, "revoked")


def test_with_the_broker_away_a_good_pass_opens_on_its_signature_and_the_api_is_told(gateway, api, stand_in):
    stand_in.revoked.add("task-done")
    stand_in.broker_away = True
    assert get(gateway, {"X-Zstalk-Pass": a_pass("task-done")}).status == 200
    assert api.requests[-1].headers["X-Zstalk-Pass-Check"] == "offline"
    assert get(gateway, {"X-Zstalk-Pass": a_pass(ttl_s=-1)}).status == 403
