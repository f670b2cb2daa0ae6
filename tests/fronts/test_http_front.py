"""The HTTP front over real HTTP on loopback: aiohttp's client talks to the front, and a
fake link stands in for the broker, recording every op and answering each with the reply
a test chooses.  So each rule of protocol/fronts/http/front.py is checked end to end at the HTTP
level (status, JSON body, the op sent), without a broker."""
from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
import re
import socket

import aiohttp
import pytest
from hypothesis import given, settings, strategies as st

from zstalk.protocol.fronts.http.front import HttpFront
from zstalk.protocol.fronts.http.api import Enqueue, Problem, parse_enqueue
from zstalk.protocol.schema import SILENT_OPS, Op, R, SessionState, Settings, Welcome

CREATED = datetime.datetime(2026, 11, 24, 20, 30, 0, 123000, datetime.timezone.utc).timestamp()
KEY = "s3cret-master-key"


class FakeLink:
    """Records ops; answers each op that has a reply with `answer(op)` on the next loop
    turn (None: never answered, as when the broker is away)."""

    def __init__(self, answer=None, settings: Settings = Settings()) -> None:
        self.answer = answer
        self.settings = settings
        self.front: HttpFront | None = None
        self.ops: list[tuple] = []
        self.closed = False

    def start(self) -> None:
        self.front.on_welcome(Welcome(1, 1, Settings(), False))

    def submit(self, op: tuple) -> None:
        self.ops.append(op)
        if op[0] in SILENT_OPS or self.answer is None:
            return
        reply = self.answer(op)
        if reply is not None:
            asyncio.get_running_loop().call_soon(self.front.on_replies, [reply])

    def flush_now(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    @property
    def requests(self) -> list[tuple]:
        """The ops that wait for a reply (not OPEN / CLOSE)."""
        return [op for op in self.ops if op[0] not in SILENT_OPS]


def listening_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def run(scenario, answer=None, link: FakeLink | None = None, **front_options):
    """Serve a front with a FakeLink (`link`, or one answering with `answer`) on
    127.0.0.1 port 0 and run `scenario(client, link, front)` against it; returns what
    the scenario returns."""
    async def main():
        fake = link or FakeLink(answer)
        front = HttpFront("tcp://127.0.0.1:1", link=fake, **front_options)
        fake.front = front
        sock = listening_socket()
        port = sock.getsockname()[1]
        await front.start([sock])
        try:
            async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as client:
                return await scenario(client, fake, front)
        finally:
            await front.close()
    return asyncio.run(main())


async def fetch(client, method: str, path: str, **kwargs) -> tuple[int, dict]:
    """One request: its status and JSON body (every answer must be JSON).  A raw body
    is sent as JSON unless the test says otherwise."""
    if "data" in kwargs:
        kwargs["headers"] = {"Content-Type": "application/json", **kwargs.get("headers", {})}
    async with client.request(method, path, **kwargs) as response:
        assert response.content_type == "application/json"
        return response.status, await response.json()


def request(method: str, path: str, answer=None, front_options=None, **kwargs):
    """One request against a fresh front: (status, body, the ops that wanted a reply)."""
    async def scenario(client, link, front):
        status, body = await fetch(client, method, path, **kwargs)
        return status, body, link.requests
    return run(scenario, answer, **(front_options or {}))


# -- canned broker replies ------------------------------------------------------------------
def task_info(uid: str, **fields) -> dict:
    info = {"uniqueId": uid, "function": "hello", "status": "queued", "createdAt": CREATED,
            "attempt": 0, "attempts": 1, "waitNum": 3}
    info.update(fields)
    return info


def enqueued(op: tuple) -> tuple:
    """As the broker: the task under options.uniqueId, else under the front's uid, with
    the fields an enqueue is answered with (views.enqueued)."""
    uid = (op[4] or {}).get("uniqueId", op[5])
    return (1, R.T_TASK, {"uniqueId": uid, "status": "queued", "waitNum": 3})


def info_of(op: tuple, **fields) -> tuple:
    return (1, R.T_TASK, task_info(op[2], **fields))


def error(code: str, message: str):
    return lambda op: (1, R.T_ERROR, code, message)


# -- enqueue --------------------------------------------------------------------------------
def test_an_array_enqueues_each_good_task_in_one_batch_and_answers_each_in_order() -> None:
    def answer(op: tuple) -> tuple:
        if op[2] == "dup":
            return (1, R.T_ERROR, "duplicate", "a task with uniqueId 'd' exists")
        return enqueued(op)
    body = [{"function": "a", "options": {"uniqueId": "u1"}}, {"function": 7},
            {"function": "dup"}, {"function": "b", "params": [1]}]
    status, reply, ops = request("POST", "/v1/tasks", answer, json=body)
    assert status == 200
    token = reply[0].pop("token")
    assert reply[0] == {"status": 201, "uniqueId": "u1", "waitNum": 3}
    assert re.fullmatch(r"zt1_[A-Za-z0-9_-]{43}", token) and token != reply[3]["token"]
    assert ops[0][7]["token_sha256"] == hashlib.sha256(token.encode()).digest(), "digest only"
    assert reply[1] == {"status": 400, "error": "bad_request",
                        "message": "function must be a string"}
    assert reply[2]["status"] == 409 and reply[2]["error"] == "duplicate"
    assert reply[3]["status"] == 201 and len(reply[3]["uniqueId"]) == 32
    assert [op[2] for op in ops] == ["a", "dup", "b"], "the bad item sends nothing"


def test_an_empty_array_enqueues_nothing() -> None:
    status, reply, ops = request("POST", "/v1/tasks", enqueued, json=[])
    assert (status, reply, ops) == (200, [], [])


def test_enqueuing_a_task_answers_201_with_its_id_status_and_wait_number() -> None:
    body = {"function": "hello", "params": {"name": "zstalk", "n": [1, 2.5, None]},
            "options": {"priority": 5, "backoff": {"type": "exponential"}}}
    status, reply, ops = request("POST", "/v1/tasks", enqueued, json=body)

    [op] = ops
    assert op[:5] == (Op.T_ENQUEUE, 1, "hello", b'{"name":"zstalk","n":[1,2.5,null]}',
                      {"priority": 5, "backoff": {"type": "exponential"}})
    assert re.fullmatch(r"[0-9a-f]{32}", op[5])
    assert status == 201
    token = reply.pop("token")
    assert reply == {"uniqueId": op[5], "status": "queued", "waitNum": 3}
    assert re.fullmatch(r"zt1_[A-Za-z0-9_-]{43}", token)
    assert op[7] == {"client": "127.0.0.1",
                     "token_sha256": hashlib.sha256(token.encode()).digest()}, "never the token"


def test_params_default_to_null_and_absent_options_are_sent_as_none() -> None:
    status, reply, ops = request("POST", "/v1/tasks", enqueued, data=b'{"function": "hello"}')
    assert status == 201
    assert ops[0][2:5] == ("hello", b"null", None)


def test_the_uniqueid_given_in_options_is_the_tasks_id_and_its_location() -> None:
    async def scenario(client, link, front):
        body = {"function": "hello", "options": {"uniqueId": "order-42"}}
        async with client.post("/v1/tasks", json=body) as response:
            return response.status, response.headers["Location"], await response.json()

    status, location, reply = run(scenario, enqueued)
    assert (status, location, reply["uniqueId"]) == (201, "/v1/tasks/order-42", "order-42")


def test_each_task_gets_a_fresh_random_id() -> None:
    async def scenario(client, link, front):
        for _ in range(3):
            await fetch(client, "POST", "/v1/tasks", json={"function": "hello"})
        return [op[5] for op in link.requests]

    uids = run(scenario, enqueued)
    assert len(set(uids)) == 3


@pytest.mark.parametrize("status, code, message", [
    (409, "duplicate", "a task with uniqueId 'x' exists"),
    (404, "unknown_function", "no function named 'nope'"),
    (400, "bad_request", "unknown option 'colour'; options are ..."),
    (503, "out_of_space", "the binlog's disk is full"),
    (500, "a_code_from_a_newer_broker", "?"),
])
def test_the_brokers_refusal_of_an_enqueue_is_answered_with_its_code_s_status(
        status, code, message) -> None:
    got, reply, ops = request("POST", "/v1/tasks", error(code, message),
                              json={"function": "hello", "options": {"colour": 1}})
    assert len(ops) == 1
    assert (got, reply) == (status, {"error": code, "message": message})


# -- info and cancel ------------------------------------------------------------------------
def test_getting_a_task_formats_its_times_as_rfc3339_utc_with_milliseconds() -> None:
    def answer(op):
        return info_of(op, status="success", startedAt=CREATED + 1.5, finishedAt=CREATED + 2,
                       statusCode=200, result=b'{"ok": true, "n": [1, 2]}')

    status, reply, ops = request("GET", "/v1/tasks/order-42", answer)
    assert ops == [(Op.T_INFO, 1, "order-42", True)]
    assert status == 200
    assert reply == {"uniqueId": "order-42", "function": "hello", "status": "success",
                     "createdAt": "2026-11-24T20:30:00.123Z",
                     "startedAt": "2026-11-24T20:30:01.623Z",
                     "finishedAt": "2026-11-24T20:30:02.123Z",
                     "attempt": 0, "attempts": 1, "waitNum": 3, "statusCode": 200,
                     "result": {"ok": True, "n": [1, 2]}}


def test_a_retry_time_is_formatted_like_the_others() -> None:
    status, reply, _ = request("GET", "/v1/tasks/t", lambda op: info_of(op, retryAt=0.5))
    assert reply["retryAt"] == "1970-01-01T00:00:00.500Z"


@pytest.mark.parametrize("result, shown", [
    (b'"a json string"', "a json string"),
    (b"42", 42),
    (b"plain text, not JSON", "plain text, not JSON"),
    (b"caf\xc3\xa9 \xff", "caf\u00e9 \ufffd"),       # bad UTF-8 is replaced, not refused
    (b"NaN", "NaN"),                                # not JSON: shown as text
    (b"", ""),
])
def test_a_result_is_shown_as_json_when_it_is_json_and_as_text_otherwise(result, shown) -> None:
    status, reply, _ = request("GET", "/v1/tasks/t", lambda op: info_of(op, result=result))
    assert status == 200
    assert reply["result"] == shown


def test_getting_an_unknown_task_answers_the_brokers_404() -> None:
    status, reply, _ = request("GET", "/v1/tasks/nope",
                               error("not_found", "no task 'nope'"))
    assert (status, reply) == (404, {"error": "not_found", "message": "no task 'nope'"})


def test_deleting_a_task_cancels_it_and_answers_its_info() -> None:
    status, reply, ops = request("DELETE", "/v1/tasks/order-42",
                                 lambda op: info_of(op, status="cancelled", finishedAt=CREATED))
    assert ops == [(Op.T_CANCEL, 1, "order-42")]
    assert status == 200
    assert reply["status"] == "cancelled"
    assert reply["finishedAt"] == "2026-11-24T20:30:00.123Z"


def test_deleting_a_finished_task_answers_the_brokers_409() -> None:
    status, reply, _ = request("DELETE", "/v1/tasks/t",
                               error("not_cancellable", "task 't' is success"))
    assert (status, reply["error"]) == (409, "not_cancellable")


# -- bad requests ---------------------------------------------------------------------------
@pytest.mark.parametrize("body, says", [
    (b"{not json", "not valid JSON"),
    (b"", "not valid JSON"),
    (b"\xff\xfe\x00", "not valid JSON"),
    (b'{"function": "hello", "params": NaN}', "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
    (b'"hello"', "must be a JSON object, not a string"),
    (b"[" + b",".join([b'{"function": "f"}'] * 1001) + b"]", "1001 tasks in one request"),
    (b'{"function": "hello", "priority": 1}', "unknown field 'priority'"),
    (b'{"params": {}}', "function is required"),
    (b'{"function": 7}', "function must be a string"),
    (b'{"function": null}', "function must be a string"),
    (b'{"function": "hello", "options": [1]}', "options must be an object, not an array"),
    (b'{"function": "hello", "options": "fast"}', "options must be an object, not a string"),
])
def test_a_malformed_body_is_refused_with_400_and_nothing_is_sent(body, says) -> None:
    status, reply, ops = request("POST", "/v1/tasks", enqueued, data=body)
    assert (status, reply["error"]) == (400, "bad_request")
    assert says in reply["message"]
    assert ops == []


def test_a_body_that_cannot_be_decoded_is_refused_with_400_not_500() -> None:
    status, reply, ops = request("POST", "/v1/tasks", enqueued, data=b'{"function": "x"}',
                                 headers={"Content-Encoding": "gzip"})
    assert (status, reply["error"]) == (400, "bad_request")
    assert "could not be read" in reply["message"]
    assert ops == []


def test_a_body_over_the_limit_is_refused_with_413_and_one_at_the_limit_is_taken() -> None:
    def body(size: int) -> bytes:
        head = b'{"function":"hello","params":"'
        return head + b"x" * (size - len(head) - 2) + b'"}'

    async def scenario(client, link, front):
        over = await fetch(client, "POST", "/v1/tasks", data=body(101))
        at = await fetch(client, "POST", "/v1/tasks", data=body(100))
        return over, at, link.requests

    link = FakeLink(enqueued, Settings(max_body_bytes=100))
    (status, reply), (at_status, _), ops = run(scenario, link=link)
    assert (status, reply["error"]) == (413, "too_large")
    assert "100 bytes" in reply["message"]
    assert at_status == 201 and len(ops) == 1


def test_an_unknown_path_answers_404_in_json() -> None:
    status, reply, ops = request("GET", "/v2/elsewhere")
    assert (status, reply["error"]) == (404, "not_found")
    assert "/v2/elsewhere" in reply["message"]
    assert ops == []


@pytest.mark.parametrize("method, path, allowed", [
    ("PATCH", "/v1/tasks", "GET, HEAD, OPTIONS, POST"),         # (OPTIONS: CORS preflights)
    ("PUT", "/v1/tasks/t", "DELETE, GET, HEAD, OPTIONS"),
])
def test_a_wrong_method_answers_405_in_json_with_the_allowed_ones(method, path, allowed) -> None:
    async def scenario(client, link, front):
        async with client.request(method, path) as response:
            return response.status, response.headers.get("Allow"), await response.json()

    status, allow, reply = run(scenario)
    assert (status, reply["error"]) == (405, "method_not_allowed")
    assert set(allow.split(",")) == set(allowed.split(", "))
    assert allowed in reply["message"]


# -- auth -----------------------------------------------------------------------------------
@pytest.mark.parametrize("authorization", [
    "Bearer wrong-key", "Bearer s3cret-master-ke", "Bearer s3cret-master-k\u00e9y"])
@pytest.mark.parametrize("method, path", [("POST", "/v1/tasks"), ("GET", "/v1/tasks/t1")])
def test_with_a_master_key_a_wrong_key_is_refused_by_the_front(authorization, method,
                                                               path) -> None:
    got, reply, ops = request(method, path, enqueued, {"master_key": KEY},
                              json={"function": "hello"}, headers={"Authorization": authorization})
    assert (got, reply["error"]) == (403, "forbidden")
    assert ops == []


@pytest.mark.parametrize("authorization", [None, "Basic dXNlcjpwYXNz", "Bearer"])
def test_with_a_master_key_an_enqueue_without_it_is_refused_before_its_body_is_read(
        authorization) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    got, reply, ops = request("POST", "/v1/tasks", enqueued, {"master_key": KEY},
                              json={"function": "hello"}, headers=headers)
    assert (got, reply["error"], ops) == (401, "unauthorized", [])


def test_with_public_enqueue_an_enqueue_without_the_key_goes_to_the_broker_unkeyed() -> None:
    async def scenario(client, link, front):
        return await fetch(client, "POST", "/v1/tasks", json=[{"function": "hello"}])
    link = FakeLink(enqueued, Settings(public_enqueue=True))
    status, reply = run(scenario, link=link, master_key=KEY)
    assert status == 200 and [op[6] for op in link.requests] == [False]   # the broker decides


def test_with_private_results_reading_a_task_without_the_key_is_refused() -> None:
    async def scenario(client, link, front):
        return await fetch(client, "GET", "/v1/tasks/t1")
    link = FakeLink(info_of, Settings(private_results=True))
    status, reply = run(scenario, link=link, master_key=KEY)
    assert (status, reply["error"], link.requests) == (401, "unauthorized", [])


@pytest.mark.parametrize("scheme", ["Bearer", "bearer"])
def test_with_a_master_key_an_enqueue_with_it_is_sent_as_keyed(scheme) -> None:
    status, _, ops = request("POST", "/v1/tasks", enqueued, {"master_key": KEY},
                             json={"function": "hello"},
                             headers={"Authorization": f"{scheme} {KEY}"})
    assert status == 201 and [op[6] for op in ops] == [True]


def test_without_a_master_key_every_request_is_sent_as_keyed() -> None:
    status, _, ops = request("POST", "/v1/tasks", enqueued, json={"function": "hello"})
    assert status == 201 and [op[6] for op in ops] == [True]


def test_with_a_master_key_a_delete_needs_it_and_a_get_does_not() -> None:
    async def scenario(client, link, front):
        refused = await fetch(client, "DELETE", "/v1/tasks/t")
        wrong = await fetch(client, "DELETE", "/v1/tasks/t",
                            headers={"Authorization": "Bearer nope"})
        cancelled = await fetch(client, "DELETE", "/v1/tasks/t",
                                headers={"Authorization": f"Bearer {KEY}"})
        got = await fetch(client, "GET", "/v1/tasks/t")
        return [s for s, _ in (refused, wrong, cancelled, got)], link.requests

    statuses, ops = run(scenario, lambda op: info_of(op), master_key=KEY)
    assert statuses == [401, 403, 200, 200]
    assert [op[0] for op in ops] == [Op.T_CANCEL, Op.T_INFO]
    assert ops[1][-1] is False          # the broker's private_results decides


TOKEN = "zt1_" + "Q" * 43


@pytest.mark.parametrize("master_key", [KEY, None])
def test_a_task_token_is_sent_as_its_digest_with_get_and_delete_and_needs_no_master_key(
        master_key) -> None:
    async def scenario(client, link, front):
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        got = await fetch(client, "GET", "/v1/tasks/t", headers=bearer)
        cancelled = await fetch(client, "DELETE", "/v1/tasks/t", headers=bearer)
        return [s for s, _ in (got, cancelled)], link.requests

    options = {"master_key": master_key} if master_key else {}
    statuses, ops = run(scenario, lambda op: info_of(op), **options)
    sha = hashlib.sha256(TOKEN.encode()).digest()
    assert statuses == [200, 200]
    assert ops == [(Op.T_INFO, 1, "t", False, sha), (Op.T_CANCEL, 1, "t", sha)], \
        "the digest, never the token; the broker compares"


def test_a_master_key_that_starts_as_a_token_does_is_still_the_master_key() -> None:
    async def scenario(client, link, front):
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        await fetch(client, "DELETE", "/v1/tasks/t", headers=bearer)
        return link.requests

    assert run(scenario, lambda op: info_of(op), master_key=TOKEN) == [(Op.T_CANCEL, 1, "t")]


def test_a_broker_refusing_a_token_is_answered_403_in_json() -> None:
    status, reply, _ = request("DELETE", "/v1/tasks/t",
                               error("forbidden", "this token is not the task's own"),
                               {"master_key": KEY}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert (status, reply) == (403, {"error": "forbidden",
                                     "message": "this token is not the task's own"})


def test_an_online_task_admitted_at_once_gets_its_pass_in_the_201(tmp_path) -> None:
    keys = tmp_path / "passes"
    keys.write_text("k1:" + "k" * 32 + "\n")
    keys.chmod(0o400)
    admitted = lambda op: (1, R.T_TASK, {"uniqueId": op[5], "status": "admitted",  # noqa: E731
                                         "createdAt": 1_700_000_000.0,
                                         "passExpiresAt": 1_700_000_060.0,
                                         "admitUrl": "https://shop.example/in"})
    status, reply, _ = request("POST", "/v1/tasks", admitted, {"pass_key_file": str(keys)},
                               json={"function": "shop", "type": "online"})
    assert status == 201 and reply["status"] == "admitted"
    from zstalk.protocol.codecs.passes import PassKeys, check_pass
    assert check_pass(reply["pass"], PassKeys([("k1", b"k" * 32)]), 1_700_000_000) == \
        reply["uniqueId"], "signed for this task, expiring when the broker said"
    assert reply["admitUrl"] == f"https://shop.example/in#zstalk_pass={reply['pass']}"
    assert (reply["createdAt"], reply["passExpiresAt"]) == ("2023-11-14T22:13:20.000Z",
                                                            "2023-11-14T22:14:20.000Z")
    assert "function" not in reply and reply["token"].startswith("zt1_")


# -- the broker session ---------------------------------------------------------------------
def test_a_reply_read_while_its_own_op_is_being_sent_reaches_its_request() -> None:
    """A submit that fills the link's batch sends it and reads the socket at once; under
    load the broker's answer to that very op can be among what it reads."""
    class Immediate(FakeLink):
        def submit(self, op: tuple) -> None:
            self.ops.append(op)
            if op[0] not in SILENT_OPS:
                self.front.on_replies([enqueued(op)])

    async def scenario(client, link, front):
        return await asyncio.wait_for(fetch(client, "POST", "/v1/tasks", json=[
            {"function": "a"}, {"function": "b"}]), 10)    # (before the fix: no answer)

    status, reply = run(scenario, link=Immediate())
    assert status == 200 and [item["status"] for item in reply] == [201, 201]


def test_concurrent_requests_each_get_their_own_reply() -> None:
    n = 20

    class Batching(FakeLink):
        """Answers nothing until all n requests are in, then all at once, in op order."""
        def submit(self, op: tuple) -> None:
            self.ops.append(op)
            if len(self.requests) == n:
                replies = [info_of(o, attempt=int(o[2][1:])) for o in self.requests]
                asyncio.get_running_loop().call_soon(self.front.on_replies, replies)

    async def scenario(client, link, front):
        return await asyncio.gather(*(fetch(client, "GET", f"/v1/tasks/t{i}") for i in range(n)))

    results = run(scenario, link=Batching())
    assert [(status, body["uniqueId"], body["attempt"]) for status, body in results] == \
        [(200, f"t{i}", i) for i in range(n)]


@pytest.mark.parametrize("loss", ["on_lost", "on_fenced"])
def test_losing_the_broker_fails_the_requests_in_flight_with_503(loss) -> None:
    async def scenario(client, link, front):
        pending = asyncio.ensure_future(fetch(client, "GET", "/v1/tasks/t"))
        while not link.requests:
            await asyncio.sleep(0.001)
        getattr(front, loss)()
        failed = await pending
        link.answer = info_of                      # the broker is back
        link.start()
        return failed, await fetch(client, "GET", "/v1/tasks/t2")

    (status, reply), (then, info) = run(scenario)
    assert (status, reply["error"]) == (503, "unavailable")
    assert reply["message"]
    assert (then, info["uniqueId"]) == (200, "t2")       # no reply is owed to the failed one


def test_a_request_the_link_held_too_long_fails_with_503() -> None:
    status, reply, _ = request("GET", "/v1/tasks/t", lambda op: (1, R.INTERNAL_ERROR))
    assert (status, reply["error"]) == (503, "unavailable")


def test_the_front_opens_its_one_session_on_welcome_and_closes_it_at_the_end() -> None:
    async def main():
        link = FakeLink()
        front = HttpFront("tcp://127.0.0.1:1", link=link)
        link.front = front
        before = front.session_states()
        await front.start([listening_socket()])
        after = front.session_states()
        await front.close()
        return before, after, link

    before, after, link = asyncio.run(main())
    assert before == []
    assert after == [SessionState(1, "", [], [])]
    assert link.ops == [(Op.OPEN, 1), (Op.CLOSE, 1)]
    assert link.closed


# -- the body parser alone ------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(), st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.sampled_from(
        ["function", "params", "options", "x"]) | st.text(), inner),
).map(lambda doc: json.dumps(doc).encode())))
def test_any_body_either_parses_or_is_refused_with_400(body) -> None:
    parsed = parse_enqueue(body)
    for one in parsed if isinstance(parsed, list) else [parsed]:
        assert isinstance(one, (Enqueue, Problem))
        if isinstance(one, Problem):
            assert one.status == 400
        else:
            json.loads(one.params)



# -- what a browser page or a bad value must not do -----------------------------------------
@pytest.mark.parametrize("body, says", [
    (b'{"function": "f", "options": {"priority": 123456789012345678901234567890}}',
     "fit in 64 bits"),
    (b'{"function": "\\ud800"}', "valid Unicode"),
    (b'{"function": "f", "params": {"x": 1e400}}', "too large a number"),
])
def test_a_value_no_message_can_carry_is_refused_and_nothing_is_sent(body, says) -> None:
    status, reply, ops = request("POST", "/v1/tasks", enqueued, data=body)
    assert status == 400 and says in reply["message"] and ops == []


def test_a_body_not_sent_as_json_is_refused_so_no_web_page_can_post_one() -> None:
    status, reply, ops = request("POST", "/v1/tasks", enqueued, data=b'{"function": "f"}',
                                 headers={"Content-Type": "text/plain"})
    assert (status, reply["error"], ops) == (415, "unsupported_media_type", [])


def test_without_a_master_key_only_loopback_host_names_are_answered() -> None:
    status, reply, ops = request("GET", "/v1/tasks/t1", info_of,
                                 headers={"Host": "attacker.example:8080"})
    assert (status, ops) == (403, []) and "loopback" in reply["message"]
    for host in ("localhost:8080", "127.0.0.1", "[::1]:8080"):
        assert request("GET", "/v1/tasks/t1", info_of, headers={"Host": host})[0] == 200


def test_with_a_master_key_any_host_name_is_answered() -> None:
    status, _, _ = request("GET", "/v1/tasks/t1", info_of, front_options={"master_key": "k"},
                           headers={"Host": "queue.example.com"})
    assert status == 200


def test_a_503_for_an_unreachable_broker_says_retry_after_one_second() -> None:
    async def scenario(client, link, front):
        async with client.request("GET", "/v1/tasks/t") as response:
            return response.status, response.headers.get("Retry-After")
    assert run(scenario, lambda op: (1, R.INTERNAL_ERROR)) == (503, "1")


# -- group_by = "header:NAME" -------------------------------------------------------------------
class Unwelcomed(FakeLink):
    """A link whose broker has not welcomed it yet: the front has only default Settings."""

    def start(self) -> None:
        pass


def ext_of(op: tuple) -> dict:
    return op[7] or {}


def test_an_enqueue_sends_the_values_of_the_headers_a_function_groups_by_and_no_others():
    link = FakeLink(enqueued, Settings(group_headers=["x-tenant"]))

    async def scenario(client, link, front):
        await fetch(client, "POST", "/v1/tasks", json={"function": "a"},
                    headers={"X-Tenant": "acme", "X-Other": "no"})
        await fetch(client, "POST", "/v1/tasks", json=[{"function": "a"}, {"function": "b"}],
                    headers={"x-tenant": "t" * 100})
        await fetch(client, "POST", "/v1/tasks", json={"function": "a"})
        return link.requests
    ops = run(scenario, link=link)
    assert [ext_of(op).get("headers") for op in ops] == [
        {"x-tenant": "acme"}, {"x-tenant": "t" * 65}, {"x-tenant": "t" * 65}, None]


def test_before_a_broker_says_which_headers_group_tasks_an_enqueue_sends_every_header():
    async def scenario(client, link, front):
        await fetch(client, "POST", "/v1/tasks", json={"function": "a"},
                    headers={"X-Tenant": "acme"})
        return link.requests
    [op] = run(scenario, link=Unwelcomed(enqueued))
    assert ext_of(op)["headers"]["x-tenant"] == "acme"
