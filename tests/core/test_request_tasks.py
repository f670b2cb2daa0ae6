"""Request tasks in the broker core: the request object checked against its function
(broker/core/tasks/model/requests.py), the call it makes, the headers its result keeps, and
the dispatchers it may go to."""
from __future__ import annotations

import pytest

from test_tasks_core import D1, D2, HTTP, T0, BrokerClock
from zstalk.broker.core.tasks.model import requests
from zstalk.broker.core.tasks.store import FunctionSpec, Tasks
from zstalk.protocol.schema import Op, R

REPORT = {"method": "GET", "path": "/daily", "query": {"day": "2026-11-26"},
          "headers": {"Accept": "application/pdf"}, "body": None}


def parsed(doc, allowed=()):
    return requests.parse(doc, allowed)


# -- what a request may say -----------------------------------------------------------------
@pytest.mark.parametrize("method", requests.METHODS)
def test_every_method_is_taken_and_post_is_the_default(method):
    request, body = parsed({"method": method})
    assert request.method == method and body == b""
    assert parsed({})[0].method == "POST"


@pytest.mark.parametrize("doc, refusal", [
    ({"method": "get"}, "request method must be one of GET, POST, PUT, PATCH, DELETE"),
    ({"method": "TRACE"}, "request method must be one of GET, POST, PUT, PATCH, DELETE"),
    ({"url": "http://evil/"}, "unknown request field 'url'; fields are method, path, query, "
                              "headers, body"),
    ({"path": "daily"}, "request path must start with '/' (or be empty)"),
    ({"path": "/a/../b"}, "request path must not hold '..'"),
    ({"path": "/a//b"}, "request path must not hold '//'"),
    ({"path": "/a\\b"}, "request path must not hold '\\'"),
    ({"path": "/a%2e%2e/b"}, "request path must not hold a percent-encoded '.' or '/'"),
    ({"path": "/a%2Fb"}, "request path must not hold a percent-encoded '.' or '/'"),
    ({"path": "/a\r\nHost: evil"}, "request path must not hold a line break"),
    ({"path": "/a\nb"}, "request path must not hold a line break"),
    ({"path": "/a?x=1"}, "request path must not hold '?' (put the query in query)"),
    ({"path": "/a#top"}, "request path must not hold '#'"),
    ({"path": "/a b"}, "request path may hold only the characters RFC 3986 allows in a path, "
                       "and '%' only before two hex digits: percent-encode the rest"),
    ({"path": "/caf\u00e9"}, "request path may hold only the characters RFC 3986 allows in a "
                             "path, and '%' only before two hex digits: percent-encode the rest"),
    ({"path": "/100%"}, "request path may hold only the characters RFC 3986 allows in a path, "
                        "and '%' only before two hex digits: percent-encode the rest"),
    ({"path": 7}, "request path must be a string"),
    ({"query": ["day"]}, "request query must be an object of strings or lists of strings"),
    ({"query": {"day": 26}}, "request query 'day' must be a string or a list of strings"),
    ({"query": {"": "x"}}, "request query names must not be empty"),
    ({"headers": {"Authorization": "Bearer x"}},
     "request header 'Authorization' is not allowed: allowed are Accept, Accept-Language, "
     "Content-Type, If-None-Match, If-Modified-Since, Idempotency-Key (a function's "
     "request_headers adds to them)"),
    ({"headers": {"Host": "evil"}}, "request header 'Host' is not allowed: allowed are Accept, "
     "Accept-Language, Content-Type, If-None-Match, If-Modified-Since, Idempotency-Key (a "
     "function's request_headers adds to them)"),
    ({"headers": {"Accept": "a\r\nX: y"}}, "request header Accept must be printable ASCII, at "
                                           "most 8192 characters"),
    ({"headers": ["Accept"]}, "request headers must be an object of strings"),
    ({"body": {"base64": "not base64!"}}, "request body base64 is not valid base64"),
    ({"path": "/" + "a" * 9000}, "request path and query must be at most 8192 bytes"),
    ("GET /", "request must be an object"),
])
def test_each_refusal_names_what_is_wrong(doc, refusal):
    assert parsed(doc) == refusal


def test_a_path_is_appended_to_the_functions_url_and_the_query_encoded_in_order():
    request, _ = parsed({"path": "/daily/~me;v=1", "query": {
        "day": "2026-11-26", "tag": ["a b", "ü&="], "empty": ""}})
    assert requests.url("http://reports:8000/fn/report", request) == (
        "http://reports:8000/fn/report/daily/~me;v=1"
        "?day=2026-11-26&tag=a%20b&tag=%C3%BC%26%3D&empty=")
    assert requests.url("http://h/fn/", parsed({"path": "/x"})[0]) == "http://h/fn/x"
    assert requests.url("http://h/fn", parsed({})[0]) == "http://h/fn"


@pytest.mark.parametrize("body, sent, content_type", [
    (None, b"", None),
    ("café", "café".encode(), "text/plain; charset=utf-8"),
    ({"base64": "iVBORw=="}, b"\x89PNG", "application/octet-stream"),
    ({"n": [1, 2]}, b'{"n":[1,2]}', "application/json"),
    ([1, "two"], b'[1,"two"]', "application/json"),
    (7, b"7", "application/json"),
])
def test_a_body_is_text_bytes_or_json_with_its_content_type_unless_one_is_given(
        body, sent, content_type):
    request, data = parsed({"method": "PUT", "body": body})
    assert data == sent
    assert dict(request.headers).get("Content-Type") == content_type
    given, _ = parsed({"body": body, "headers": {"content-type": "application/x-mine"}})
    assert given.headers == (("Content-Type", "application/x-mine"),)


def test_headers_match_the_allow_list_without_case_and_take_its_spelling():
    request, _ = parsed({"headers": {"accept": "text/csv", "x-tenant": "acme",
                                     "IDEMPOTENCY-KEY": "k1"}}, allowed=("X-Tenant",))
    assert request.headers == (("Accept", "text/csv"), ("X-Tenant", "acme"),
                               ("Idempotency-Key", "k1"))
    assert "X-Tenant" in parsed({"headers": {"X-Tenant": "acme"}})


@pytest.mark.parametrize("name, why", [
    ("Host", "Host is never a request's to set"),
    ("Transfer-Encoding", "Transfer-Encoding is never a request's to set"),
    ("X-Zstalk-Task-Id", "X-Zstalk-Task-Id is never a request's to set"),
    ("Bad Name", "'Bad Name' is not a header name"),
])
def test_a_config_may_not_let_requests_set_framing_routing_or_zstalks_own_headers(name, why):
    assert requests.header_problem(name) == why
    assert requests.header_problem("Authorization") is None


# -- in the broker ------------------------------------------------------------------------------
def enqueue_request(b: BrokerClock, uid: str, request: dict, keyed: bool = True) -> tuple:
    [reply] = b.send(HTTP, (Op.T_ENQUEUE, 1, "f", b"", None, uid, keyed,
                            {"request": request}))[HTTP]
    return reply


def calls(out: dict) -> list[tuple]:
    return [item for items in out.values() for item in items if item[1] == R.T_CALL]


def test_a_request_task_is_called_at_its_url_with_its_method_headers_and_body():
    b = BrokerClock(concurrency=4, result_headers=("ETag",))
    assert enqueue_request(b, "r1", REPORT)[1] == R.T_TASK
    assert enqueue_request(b, "r2", {"method": "PATCH", "body": {"n": 1}})[1] == R.T_TASK
    b.enqueue("p1")
    out = b.send(D1, (Op.T_SUBSCRIBE, 1, 3, False))
    assert [c[2:] for c in calls(out)] == [
        ("r1", 1, "http://fn/f/daily?day=2026-11-26", b"", 15000,
         {"result_headers": ["ETag"], "method": "GET", "headers": [["Accept", "application/pdf"]]}),
        ("r2", 1, "http://fn/f", b'{"n":1}', 15000,
         {"result_headers": ["ETag"], "method": "PATCH",
          "headers": [["Content-Type", "application/json"]]}),
        ("p1", 1, "http://fn/f", b'{"n":1}', 15000, {"result_headers": ["ETag"]})]


def test_only_the_master_key_may_send_a_request():
    from zstalk.broker.core.tasks.store import ApiPolicy
    b = BrokerClock(api=ApiPolicy(public_enqueue=True))
    assert enqueue_request(b, "r1", REPORT, keyed=False)[1:] == (
        R.T_ERROR, "unauthorized",
        "an enqueue without the master key may set no option and send no request")
    reply = enqueue_request(b, "r2", {"path": "/../etc/passwd"})
    assert reply[1:] == (R.T_ERROR, "bad_request", "request path must not hold '..'")


def test_a_success_keeps_the_response_headers_the_dispatcher_sent():
    b = BrokerClock()
    enqueue_request(b, "r1", REPORT)
    b.send(D1, (Op.T_SUBSCRIBE, 1, 1, False))
    headers = {"Content-Type": "application/pdf", "ETag": '"v1"'}
    b.send(D1, (Op.T_OUTCOME, 1, "r1", 1, "success", 200, b'{"base64":"JVBERg=="}', None, -1,
                {"headers": headers}))
    info = b.info("r1")[2]
    assert info["result"] == b'{"base64":"JVBERg=="}' and info["resultHeaders"] == headers


@pytest.mark.parametrize("ext", [{"headers": {"A": 1}}, {"headers": "x"},
                                 {"headers": {f"H{i}": "v" for i in range(65)}}, "x"])
def test_result_headers_that_are_not_a_small_map_of_strings_are_not_kept(ext):
    b = BrokerClock()
    b.enqueue("p1")
    b.send(D1, (Op.T_SUBSCRIBE, 1, 1, False))
    b.send(D1, (Op.T_OUTCOME, 1, "p1", 1, "success", 200, b"1", None, -1, ext))
    info = b.info("p1")[2]
    assert info["status"] == "success" and "resultHeaders" not in info


def test_a_dispatcher_older_than_request_tasks_gets_only_plain_ones_and_loses_no_place():
    b = BrokerClock(concurrency=10)
    b.broker.old_peers[D1] = 3                  # (the actor's note of a version-3 peer)
    enqueue_request(b, "r1", REPORT)
    b.enqueue("p1")
    old = calls(b.send(D1, (Op.T_SUBSCRIBE, 1, 5, False)))
    assert [c[2] for c in old] == [], "the head of f is a request task: f waits for a new one"
    out = b.send(D2, (Op.T_SUBSCRIBE, 1, 1, False))
    # the new one takes the request task; the plain one behind it goes to the old one
    assert {peer: [c[2] for c in items] for peer, items in out.items()} == {
        D2: ["r1"], D1: ["p1"]}


def test_an_old_dispatcher_takes_another_functions_plain_task_past_a_request_head():
    store = Tasks({name: FunctionSpec(name, f"http://fn/{name}", 10) for name in "fg"})
    store.enqueue("f", b"", None, T0, uid="r1", request=REPORT)
    store.enqueue("g", b"{}", None, T0 + 1, uid="p1")
    assert store.take("old", T0 + 1, plain_only=True).uid == "p1"
    assert store.take("old", T0 + 1, plain_only=True) is None
    assert store.take("new", T0 + 1).uid == "r1", "the request task kept its place"


def test_a_request_task_holds_its_path_query_and_headers_in_its_memory_count():
    store = Tasks({"f": FunctionSpec("f", "http://fn/f", 10)})
    store.enqueue("f", b"{}", None, T0, uid="p")
    plain = store.bytes
    store.enqueue("f", b"", None, T0, uid="r", request={
        "path": "/x" * 100, "query": {"q": "y" * 300}, "body": "z" * 50})
    assert store.bytes - plain == plain - 2 + 200 + len("q=" + "y" * 300) + 50 + len(
        "Content-Typetext/plain; charset=utf-8")


def test_a_request_tasks_body_counts_when_memory_is_checked_at_enqueue():
    b = BrokerClock(max_jobs_bytes=4096)
    reply = enqueue_request(b, "big", {"method": "PUT", "body": "x" * 8000})
    assert reply[1:3] == (R.T_ERROR, "out_of_memory")
    assert enqueue_request(b, "small", {"method": "PUT", "body": "x" * 100})[1] == R.T_TASK


def test_a_functions_url_with_a_query_keeps_it_after_the_requests_path():
    request, _ = parsed({"path": "/daily", "query": {"day": "1"}})
    assert requests.url("https://fn.example/api/report?code=KEY", request) == (
        "https://fn.example/api/report/daily?code=KEY&day=1")


@pytest.mark.parametrize("path", ["/%c0%ae%c0%ae/etc", "/a%00b", "/a%5c..%5cb", "/%2E%2E/x"])
def test_a_path_that_decodes_to_a_way_out_is_refused_too(path):
    assert parsed({"path": path}).startswith("request path must")
