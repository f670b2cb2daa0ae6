"""Request tasks end to end: `zstalk serve` with a real function host that records every
call as it arrived (method, raw path and query, headers, body) and checks its v2
signature; and a real broker with raw ZeroMQ dispatchers of two schema versions."""
from __future__ import annotations

import base64
import os
import time
from typing import NamedTuple

import msgpack
import pytest
import zmq
from aiohttp import web

from app_thread import AppThread
from servers import LOOPBACK, ServerProcess, find_zstalk, free_port, self_check
from test_tasks_end_to_end import Api
from zstalk.protocol.schema import SCHEMA_VERSION, Op, R
from zstalk.workers import signing

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")
KEY = b"request-tasks-signing-key"
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe"


class Seen(NamedTuple):
    method: str
    path: str                   # raw, as on the request line
    query: str                  # raw
    headers: dict
    body: bytes
    signature: str | None       # signing.verify's verdict with v2 (None: good)


class RequestHost(AppThread):
    """Any method at any path under /api: recorded, then answered JSON saying what came,
    or for /api/image a PNG with an ETag."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Seen] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        url = request.rel_url
        verdict = signing.verify(KEY, request.headers.get(signing.HEADER),
                                 request.headers.get("X-Zstalk-Task-Id", ""), body, time.time(),
                                 method=request.method, path=url.raw_path,
                                 query=url.raw_query_string)
        self.seen.append(Seen(request.method, url.raw_path, url.raw_query_string,
                              dict(request.headers), body, verdict))
        if url.raw_path == "/api/image":
            return web.Response(body=PNG, content_type="image/png", headers={"ETag": '"v7"'})
        return web.json_response({"method": request.method, "path": url.raw_path})

    def routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/api{tail:.*}", self.handle)


@pytest.fixture
def host():
    with RequestHost() as h:
        yield h


@pytest.fixture
def api(tmp_path, host):
    config = tmp_path / "zstalk.toml"
    config.write_text(f'[functions.api]\nurl = "http://{LOOPBACK}:{host.port}/api"\n'
                      'concurrency = 8\nrequest_headers = ["X-Tenant"]\n'
                      'result_headers = ["ETag"]\n')
    port, http_port = free_port(), free_port()
    server = ServerProcess([find_zstalk(), "serve", "-l", LOOPBACK, "-p", str(port),
                            "--counter-port", "0", "--worker-bind", "none",
                            "--config", str(config), "--http-port", str(http_port),
                            "--master-key", "s3cret"], (LOOPBACK, port), name="zstalk-requests",
                           env={**os.environ, signing.ENV_KEY: KEY.decode()}).start()
    client = Api(f"http://{LOOPBACK}:{http_port}", server)
    client.key = "s3cret"
    client.wait_listening()
    yield client
    server.stop()


def enqueue(api: Api, request: dict, **extra) -> tuple[int, dict]:
    return api.request("POST", "/v1/tasks", {"function": "api", "request": request, **extra})


def test_every_method_reaches_the_host_with_its_path_query_headers_and_body_exactly(
        api, host):
    sent = {
        "GET": {"path": "/reports/daily", "query": {"day": "2026-11-26", "tag": ["a b", "ü"]},
                "headers": {"Accept": "application/pdf", "x-tenant": "acme"}},
        "POST": {"path": "/orders", "body": {"id": 7}},
        "PUT": {"path": "/orders/7", "body": "plain words", "headers": {
            "If-None-Match": '"v1"', "Idempotency-Key": "k-7"}},
        "PATCH": {"path": "/orders/7", "body": {"base64": base64.b64encode(PNG).decode()}},
        "DELETE": {"path": "/orders/7;soft", "query": {"reason": "dup&more"}},
    }
    uids = {}
    for method, request in sent.items():
        code, body = enqueue(api, {"method": method, **request})
        assert code == 201, body
        uids[method] = body["uniqueId"]
    for method, uid in uids.items():
        info = api.wait_status(uid, "success", "failed")
        assert info["status"] == "success", info
        assert info["result"] == {"method": method, "path": "/api" + sent[method]["path"]}
    seen = {s.method: s for s in host.seen}
    get = seen["GET"]
    assert (get.path, get.query, get.body) == (
        "/api/reports/daily", "day=2026-11-26&tag=a%20b&tag=%C3%BC", b"")
    assert get.headers["Accept"] == "application/pdf" and get.headers["X-Tenant"] == "acme"
    assert seen["POST"].body == b'{"id":7}'
    assert seen["POST"].headers["Content-Type"] == "application/json"
    put = seen["PUT"]
    assert put.body == b"plain words" and put.headers["Content-Type"] == \
        "text/plain; charset=utf-8"
    assert (put.headers["If-None-Match"], put.headers["Idempotency-Key"]) == ('"v1"', "k-7")
    assert seen["PATCH"].body == PNG
    assert seen["PATCH"].headers["Content-Type"] == "application/octet-stream"
    assert (seen["DELETE"].path, seen["DELETE"].query) == (
        "/api/orders/7;soft", "reason=dup%26more")
    for s in host.seen:     # every call carried a v2 over its method, path and query
        assert s.signature is None and signing.parse(s.headers[signing.HEADER]).v2, s
        assert s.headers["X-Zstalk-Task-Id"] == uids[s.method]


def test_a_binary_answer_is_kept_as_base64_with_its_content_type_and_listed_headers(
        api, host):
    code, body = enqueue(api, {"method": "GET", "path": "/image"})
    info = api.wait_status(body["uniqueId"], "success", "failed")
    assert info["status"] == "success", info
    assert base64.b64decode(info["result"]["base64"]) == PNG
    assert info["resultHeaders"] == {"Content-Type": "image/png", "ETag": '"v7"'}


@pytest.mark.parametrize("task, status, message", [
    ({"request": {"path": "/../admin"}}, 400, "request path must not hold '..'"),
    ({"request": {"path": "/a%2Fb"}}, 400,
     "request path must not hold a percent-encoded '.' or '/'"),
    ({"request": {"headers": {"Cookie": "s=1"}}}, 400,
     "request header 'Cookie' is not allowed: allowed are Accept, Accept-Language, "
     "Content-Type, If-None-Match, If-Modified-Since, Idempotency-Key, X-Tenant (a "
     "function's request_headers adds to them)"),
    ({"request": {"method": "CONNECT"}}, 400,
     "request method must be one of GET, POST, PUT, PATCH, DELETE"),
    ({"request": {}, "params": {"id": 1}}, 400, "a task has params or a request, not both"),
    ({"request": "GET /"}, 400, "request must be an object, not a string"),
])
def test_a_bad_request_is_refused_with_a_400_naming_it_and_nothing_is_called(
        api, host, task, status, message):
    code, body = api.request("POST", "/v1/tasks", {"function": "api", **task})
    assert (code, body["error"], body["message"]) == (status, "bad_request", message)
    code, batch = api.request("POST", "/v1/tasks", [{"function": "api", **task}])
    assert code == 200 and batch[0]["status"] == status and batch[0]["message"] == message
    time.sleep(0.2)
    assert host.seen == []


def test_a_null_params_beside_a_request_is_no_params(api, host):
    code, body = api.request("POST", "/v1/tasks", {"function": "api", "params": None,
                                                    "request": {"method": "DELETE"}})
    assert code == 201, body
    assert api.wait_status(body["uniqueId"], "success")["result"]["method"] == "DELETE"


def test_without_the_master_key_no_request_is_taken(api, host):
    api.key = None
    code, body = enqueue(api, {"method": "GET"})
    assert code == 401 and host.seen == []


# -- dispatchers of two schema versions ---------------------------------------------------------
HELLO, BATCH = 1, 3


def peer(endpoint: str, version: int, kind: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, os.urandom(8))
    sock.connect(endpoint)
    sock.send(msgpack.packb((version, HELLO, int.from_bytes(os.urandom(4), "big"), kind,
                             os.getpid(), 0, []), use_bin_type=True))
    assert sock.poll(5000), "no Welcome"
    sock.recv()
    return sock


def send(sock: zmq.Socket, version: int, *ops) -> None:
    sock.send(msgpack.packb((version, BATCH, list(ops)), use_bin_type=True))


def calls(sock: zmq.Socket, wait_s: float) -> list[list]:
    """The T_CALLs that reach `sock` within `wait_s` (other messages are skipped)."""
    got, deadline = [], time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0 and sock.poll(int(left * 1000)):
        msg = msgpack.unpackb(sock.recv(), raw=False)
        if msg[1] == 4:         # Replies
            got += [item for item in msg[2] if item[1] == R.T_CALL]
    return got


def test_a_dispatcher_of_schema_3_is_never_handed_a_request_task(tmp_path):
    config = tmp_path / "zstalk.toml"
    config.write_text(f'[functions.api]\nurl = "http://{LOOPBACK}:9/api"\nconcurrency = 8\n')
    port = free_port()
    broker = ServerProcess([find_zstalk(), "broker", "--bind", f"tcp://{LOOPBACK}:{port}",
                            "--config", str(config)], (LOOPBACK, port),
                           name="request-broker").start()
    endpoint = f"tcp://{LOOPBACK}:{port}"
    sockets = []
    try:
        http = peer(endpoint, SCHEMA_VERSION, "http")
        old = peer(endpoint, 3, "dispatcher")
        sockets += [http, old]
        send(http, SCHEMA_VERSION, [Op.OPEN, 1],
             [Op.T_ENQUEUE, 1, "api", b"", None, "r1", True, {"request": {"path": "/r"}}],
             [Op.T_ENQUEUE, 1, "api", b"{}", None, "p1", True, None])
        send(old, 3, [Op.OPEN, 1], [Op.T_SUBSCRIBE, 1, 4, False])
        assert calls(old, 1.0) == [], "r1 heads the queue: the old one waits behind it"
        new = peer(endpoint, SCHEMA_VERSION, "dispatcher")
        sockets.append(new)
        send(new, SCHEMA_VERSION, [Op.OPEN, 1], [Op.T_SUBSCRIBE, 1, 1, False])
        [request] = calls(new, 3.0)
        assert request[2:] == ["r1", 1, f"http://{LOOPBACK}:9/api/r", b"", 15000,
                               {"result_headers": [], "method": "POST", "headers": []}]
        [plain] = calls(old, 3.0)
        assert plain[2:] == ["p1", 1, f"http://{LOOPBACK}:9/api", b"{}", 15000], \
            "a schema-3 dispatcher gets its calls as schema 3 has them"
    finally:
        for sock in sockets:
            sock.close()
        broker.stop()
    assert "speaks schema version 3" in broker.output()
