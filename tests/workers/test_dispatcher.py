"""The dispatcher against a real function host (an aiohttp server on a free loopback port)
and a fake link that records what it submits: how each kind of answer, or of silence,
becomes an outcome, and what the dispatcher tells the broker around its calls."""
from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import logging
import socket
import time
import urllib.parse

import pytest
from aiohttp import web
from hypothesis import given, settings, strategies as st

from zstalk.protocol.schema import Op, R, SessionState, Settings, Welcome
from zstalk.workers import signing
from zstalk.workers.upstream.dispatcher import RETRY_AFTER_MAX_MS, Dispatcher, Outcome, retry_after_ms

PARAMS = b'{"a":1}'
SLOW_S = 5.0            # the slow function: far past any timeout used here
NAP_S = 0.3             # the napping function: a call that takes a while, then succeeds


class FakeLink:
    """Records ops; the broker side of a test reads them."""

    def __init__(self, settings: Settings = Settings()) -> None:
        self.ops: list[tuple] = []
        self.started = self.closed = False
        self.settings = settings

    def start(self) -> None:
        self.started = True

    def submit(self, op: tuple) -> None:
        self.ops.append(op)

    def flush_now(self) -> None:
        pass

    def close(self, linger_ms: int = 0) -> None:
        self.closed = True

    def outcomes(self) -> dict[str, Outcome]:
        return {op[2]: Outcome.read(*op[4:10]) for op in self.ops if op[0] == Op.T_OUTCOME}

    async def outcome(self, uid: str) -> Outcome:
        await until(lambda: uid in self.outcomes())
        return self.outcomes()[uid]


class FunctionHost:
    """The functions the dispatcher calls, one per way an answer can go; `hits` lists the
    paths called."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self.app = web.Application(middlewares=[self._count])
        self.app.add_routes([
            web.post("/echo", self.echo), web.post("/error", self.error),
            web.post("/busy", self.busy), web.post("/down", self.down),
            web.post("/error-with-retry-after", self.error_with_retry_after),
            web.post("/slow", self.slow), web.post("/nap", self.nap),
            web.post("/hang-up", self.hang_up), web.post("/redirect", self.redirect),
            web.post("/bytes/{n}", self.sized), web.post("/chunked/{n}", self.chunked),
            web.post("/typed", self.typed), web.post("/abortable", self.abortable)])
        self.aborted: list[str] = []        # calls whose connection closed under them

    @web.middleware
    async def _count(self, request: web.Request, handler):
        self.hits.append(request.path)
        return await handler(request)

    async def echo(self, request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response({"body": body.decode(), "headers": dict(request.headers)})

    async def error(self, request: web.Request) -> web.Response:
        return web.Response(status=500, text="boom")

    async def busy(self, request: web.Request) -> web.Response:
        return web.Response(status=429, headers={"Retry-After": "7"})

    async def down(self, request: web.Request) -> web.Response:
        back_at = email.utils.formatdate(time.time() + 30, usegmt=True)
        return web.Response(status=503, headers={"Retry-After": back_at})

    async def error_with_retry_after(self, request: web.Request) -> web.Response:
        return web.Response(status=500, headers={"Retry-After": "7"})

    async def slow(self, request: web.Request) -> web.Response:
        await asyncio.sleep(SLOW_S)
        return web.Response(text="too late")

    async def abortable(self, request: web.Request) -> web.Response:
        """/slow, noting when its caller closes the connection (aiohttp then cancels the
        handler: handler_cancellation)."""
        try:
            await asyncio.sleep(SLOW_S)
        except asyncio.CancelledError:
            self.aborted.append(request.path)
            raise
        return web.Response(text="too late")

    async def nap(self, request: web.Request) -> web.Response:
        await asyncio.sleep(NAP_S)
        return web.Response(text="rested")

    async def hang_up(self, request: web.Request) -> web.Response:
        request.transport.close()       # no status line, nothing: the connection just ends
        return web.Response()

    async def redirect(self, request: web.Request) -> web.Response:
        return web.Response(status=302, headers={"Location": "/echo"})

    async def typed(self, request: web.Request) -> web.Response:
        """Answers the request's body back as the Content-Type `?type=` names."""
        return web.Response(body=await request.read(),
                            headers={"Content-Type": request.query["type"]})

    async def sized(self, request: web.Request) -> web.Response:
        return web.Response(body=b"x" * int(request.match_info["n"]))

    async def chunked(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        left = int(request.match_info["n"])
        with contextlib.suppress(ConnectionError):      # the dispatcher stops reading
            while left > 0:
                await resp.write(b"x" * min(left, 65536))
                left -= 65536
            await resp.write_eof()
        return resp


@contextlib.asynccontextmanager
async def function_host():
    host = FunctionHost()
    # handlers whose caller went away are cancelled, so cleanup does not wait for /slow
    runner = web.AppRunner(host.app, handler_cancellation=True, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host.url = "http://127.0.0.1:%d" % runner.addresses[0][1]
    try:
        yield host
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def dispatcher(cls=Dispatcher, max_result_bytes: int = 1 << 20, **options):
    """A dispatcher with a fake link, welcomed by a fresh broker session."""
    link = FakeLink(Settings(max_result_bytes=max_result_bytes))
    d = cls("tcp://broker.invalid:1", link=link, **options)
    d.start()
    d.on_welcome(welcome())
    try:
        yield d, link
    finally:
        await d.close()


def welcome(restored: bool = False) -> Welcome:
    return Welcome(broker_id=7, state_id=9, settings=Settings(), restored=restored)


def push(d: Dispatcher, url: str, uid: str = "t1", timeout_ms: int = 1000) -> None:
    d.on_replies([(1, R.T_CALL, uid, 1, url, PARAMS, timeout_ms)])


def call(path: str, timeout_ms: int = 1000, **options) -> Outcome:
    """Call one function of a fresh host; its outcome."""
    async def main() -> Outcome:
        async with function_host() as host, dispatcher(**options) as (d, link):
            push(d, host.url + path, timeout_ms=timeout_ms)
            return await link.outcome("t1")
    return asyncio.run(main())


async def until(predicate, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while not predicate():
        assert time.monotonic() < deadline, f"still not true after {within_s} s"
        await asyncio.sleep(0.01)


def refused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the session -------------------------------------------------------------------------
def test_welcome_opens_the_session_and_subscribes_with_the_slots() -> None:
    async def main() -> None:
        link = FakeLink()
        d = Dispatcher("tcp://broker.invalid:1", slots=8, link=link)
        assert d.session_states() == []
        d.start()
        d.on_welcome(welcome())
        assert link.started
        assert link.ops == [(Op.OPEN, 1), (Op.T_SUBSCRIBE, 1, 8, False)]
        assert d.session_states() == [SessionState(1, "", [], [])]
        await d.close()
    asyncio.run(main())


def test_a_restored_session_is_subscribed_again_without_opening_it_again() -> None:
    async def main() -> None:
        async with dispatcher(slots=8) as (d, link):
            d.on_lost()
            d.on_welcome(welcome(restored=True))
            assert link.ops == [(Op.OPEN, 1), (Op.T_SUBSCRIBE, 1, 8, False),
                                (Op.T_SUBSCRIBE, 1, 8, False)]
    asyncio.run(main())


def test_a_fenced_dispatcher_opens_a_new_session_on_the_next_welcome() -> None:
    async def main() -> None:
        async with dispatcher(slots=8) as (d, link):
            d.on_fenced()
            assert d.session_states() == []
            d.on_welcome(welcome(restored=True))
            assert link.ops[2:] == [(Op.OPEN, 1), (Op.T_SUBSCRIBE, 1, 8, False)]
    asyncio.run(main())


def test_a_welcome_while_calls_run_subscribes_only_the_slots_they_leave_free() -> None:
    async def main() -> None:
        async with function_host() as host, dispatcher(slots=8) as (d, link):
            push(d, host.url + "/nap")
            d.on_lost()
            d.on_welcome(welcome(restored=True))
            assert link.ops[-1] == (Op.T_SUBSCRIBE, 1, 7, False)
            d.on_fenced()
            d.on_welcome(welcome())
            assert link.ops[-2:] == [(Op.OPEN, 1), (Op.T_SUBSCRIBE, 1, 7, False)]
            assert (await link.outcome("t1")).kind == "success"
    asyncio.run(main())


def test_reports_made_while_the_broker_is_away_are_resent_after_the_next_welcome() -> None:
    async def main() -> None:
        async with function_host() as host, dispatcher(slots=8) as (d, link):
            push(d, host.url + "/bytes/5")
            d.on_lost()
            await until(lambda: not d.calls)
            assert not link.outcomes()
            d.on_welcome(welcome(restored=True))
            assert link.ops[-2:] == [(Op.T_SUBSCRIBE, 1, 7, False),
                                     (Op.T_OUTCOME, 1, "t1", 1, "success", 200, b'"xxxxx"', None,
                                      -1, None)]
    asyncio.run(main())


def test_a_report_the_broker_has_not_noted_is_sent_again_after_the_next_welcome() -> None:
    async def main() -> None:
        async with function_host() as host, dispatcher(slots=8) as (d, link):
            push(d, host.url + "/bytes/5", uid="t1")
            await link.outcome("t1")
            push(d, host.url + "/bytes/5", uid="t2")
            await link.outcome("t2")
            d.on_replies([(1, R.T_NOTED, "t1", 1)])     # t1's report arrived, t2's was lost
            d.on_lost()
            assert d.session_states()[0].holds == [["t2", 1]]
            d.on_welcome(welcome(restored=True))
            reports = [op[2] for op in link.ops if op[0] == Op.T_OUTCOME]
            assert reports == ["t1", "t2", "t2"]
            assert link.ops[-2][:4] == (Op.T_SUBSCRIBE, 1, 7, False)
            d.on_replies([(1, R.T_NOTED, "t2", 1)])
            assert not d.unacked and d.session_states()[0].holds == []
    asyncio.run(main())


def test_a_welcome_right_after_a_call_reports_counts_that_call_once() -> None:
    """The broker comes back between a call's report and the end of its asyncio task."""
    class WelcomedAtOnce(Dispatcher):
        def _report(self, report: tuple) -> None:
            super()._report(report)
            if not self.ready:
                self.on_welcome(welcome(restored=True))

    async def main() -> None:
        async with function_host() as host, dispatcher(WelcomedAtOnce, slots=4) as (d, link):
            d.on_lost()
            push(d, host.url + "/bytes/5")
            await link.outcome("t1")
            subscribed = [op for op in link.ops if op[0] == Op.T_SUBSCRIBE]
            assert subscribed[-1] == (Op.T_SUBSCRIBE, 1, 3, False)    # 4 - the resent one
    asyncio.run(main())


def test_the_session_lists_the_calls_it_makes_and_those_it_has_reports_on() -> None:
    """A broker restarted with its binlog gives these back to us (broker/core/tasks/store.py claim)."""
    async def main() -> None:
        async with function_host() as host, dispatcher(slots=8) as (d, link):
            push(d, host.url + "/nap", uid="napping")
            push(d, host.url + "/bytes/5", uid="done")
            await link.outcome("done")
            [state] = d.session_states()
            assert sorted(state.holds) == [["done", 1], ["napping", 1]]
            await link.outcome("napping")
    asyncio.run(main())


def test_replies_other_than_calls_are_ignored() -> None:
    async def main() -> None:
        async with dispatcher() as (d, link):
            d.on_replies([(1, R.INTERNAL_ERROR), (1, R.T_TASK, {})])
            assert not d.calls and len(link.ops) == 2
    asyncio.run(main())


# -- what the function gets --------------------------------------------------------------
def test_the_function_receives_the_params_as_a_json_body_with_the_task_headers() -> None:
    outcome = call("/echo")
    got = json.loads(outcome.result)
    assert got["body"] == PARAMS.decode()
    assert got["headers"]["Content-Type"] == "application/json"
    assert got["headers"]["X-Zstalk-Task-Id"] == "t1"
    assert got["headers"]["X-Zstalk-Attempt"] == "1"


def test_the_headers_and_the_outcome_name_the_task_and_its_attempt() -> None:
    async def main() -> None:
        async with function_host() as host, dispatcher() as (d, link):
            d.on_replies([(1, R.T_CALL, "t9", 3, host.url + "/echo", PARAMS, 1000)])
            got = json.loads((await link.outcome("t9")).result)["headers"]
            assert (got["X-Zstalk-Task-Id"], got["X-Zstalk-Attempt"]) == ("t9", "3")
            assert link.ops[-1][:4] == (Op.T_OUTCOME, 1, "t9", 3)
    asyncio.run(main())


# -- signatures --------------------------------------------------------------------------
SIGNING_KEY = b"shared between the dispatchers and the functions"


@pytest.fixture
def no_key_env(monkeypatch):
    monkeypatch.delenv(signing.ENV_KEY, raising=False)
    monkeypatch.delenv(signing.ENV_KEY_FILE, raising=False)
    return monkeypatch


def echoed_signature(outcome: Outcome) -> str | None:
    return json.loads(outcome.result)["headers"].get(signing.HEADER)


def test_with_a_signing_key_every_call_carries_a_signature_of_its_task_and_body(
        no_key_env) -> None:
    before = time.time()
    header = echoed_signature(call("/echo", signing_key=SIGNING_KEY))
    assert signing.verify(SIGNING_KEY, header, "t1", PARAMS, time.time()) is None
    assert signing.verify(SIGNING_KEY, header, "t2", PARAMS, time.time()) == "bad signature"
    assert int(before) <= signing.parse(header).t <= time.time()


def test_the_signing_key_comes_from_the_environment_when_none_is_given(no_key_env) -> None:
    no_key_env.setenv(signing.ENV_KEY, SIGNING_KEY.decode())
    header = echoed_signature(call("/echo"))
    assert signing.verify(SIGNING_KEY, header, "t1", PARAMS, time.time()) is None


def test_without_a_signing_key_calls_carry_no_signature(no_key_env) -> None:
    assert echoed_signature(call("/echo")) is None


# -- answers -----------------------------------------------------------------------------
def test_a_2xx_is_a_success_whose_result_is_the_body_as_json() -> None:
    assert call("/bytes/5") == Outcome("success", 200, b'"xxxxx"', None, -1)   # (as text)


@pytest.mark.parametrize("content_type, body, result", [
    ("application/json", b'{"n": [1, 2]}', b'{"n": [1, 2]}'),
    ("application/problem+json; charset=utf-8", b"42", b"42"),
    ("text/plain", b"42", b'"42"'),
    ("text/plain", b"null", b'"null"'),
    ("text/plain; charset=latin-1", "café".encode("latin-1"), '"café"'.encode()),
    ("text/html; charset=no-such-charset", b"<p>hi</p>", b'"<p>hi</p>"'),
    ("application/json", b"{not json", b'"{not json"'),
    ("application/json", b"NaN", b'"NaN"'),
    ("application/octet-stream", b"plain words", b'"plain words"'),
    ("application/octet-stream", b"\xff\xfe", b'{"base64":"//4="}'),
    ("image/png", b"\x89PNG", b'{"base64":"iVBORw=="}'),
    ("application/json", b"", None),
])
def test_a_result_is_kept_as_json_by_its_content_type(content_type, body, result) -> None:
    async def main() -> Outcome:
        async with function_host() as host, dispatcher() as (d, link):
            url = f"{host.url}/typed?type={urllib.parse.quote(content_type)}"
            d.on_replies([(1, R.T_CALL, "t1", 1, url, body, 1000)])
            return await link.outcome("t1")
    # bytes are never garbled into text: base64, with the type that says what they are
    kept = {"Content-Type": content_type} if b"base64" in (result or b"") else None
    assert asyncio.run(main()) == Outcome("success", 200, result, None, -1, kept)


def test_a_500_is_a_failure_naming_the_status() -> None:
    assert call("/error") == Outcome("failure", 500, None, "HTTP 500 Internal Server Error", -1)


def test_a_429_with_retry_after_is_a_failure_that_waits_that_long() -> None:
    outcome = call("/busy")
    assert (outcome.kind, outcome.status_code, outcome.retry_after_ms) == ("failure", 429, 7000)
    assert outcome.error.startswith("HTTP 429")


def test_a_503_with_an_http_date_retry_after_waits_until_that_date() -> None:
    outcome = call("/down")
    assert (outcome.kind, outcome.status_code) == ("failure", 503)
    assert 28_000 <= outcome.retry_after_ms <= 30_000       # HTTP-dates are whole seconds


def test_retry_after_counts_only_on_a_429_or_a_503() -> None:
    outcome = call("/error-with-retry-after")
    assert (outcome.kind, outcome.status_code, outcome.retry_after_ms) == ("failure", 500, -1)


def test_a_redirect_is_a_failure_and_is_not_followed() -> None:
    async def main() -> None:
        async with function_host() as host, dispatcher() as (d, link):
            push(d, host.url + "/redirect")
            outcome = await link.outcome("t1")
            assert (outcome.kind, outcome.status_code, outcome.result) == ("failure", 302, None)
            assert outcome.error == "HTTP 302 Found to /echo (redirects are not followed)"
            assert host.hits == ["/redirect"]
    asyncio.run(main())


@pytest.mark.parametrize("path", ["/bytes/2097152", "/chunked/2097152"],
                         ids=["with-content-length", "chunked"])
def test_a_result_over_the_limit_is_fatal_naming_the_limit(path: str) -> None:
    outcome = call(path)
    assert (outcome.kind, outcome.status_code, outcome.result) == ("fatal", 200, None)
    assert "over the 1048576-byte limit" in outcome.error


@pytest.mark.parametrize("path", ["/bytes/10", "/chunked/10"])
def test_a_result_of_exactly_the_limit_is_a_success(path: str) -> None:
    # (kept as the JSON string "xxxxxxxxxx": 12 bytes)
    assert call(path, max_result_bytes=12) == Outcome("success", 200, b'"xxxxxxxxxx"', None, -1)


@pytest.mark.parametrize("path", ["/bytes/11", "/chunked/11"])
def test_a_result_one_byte_over_the_limit_is_fatal(path: str) -> None:
    assert call(path, max_result_bytes=10).kind == "fatal"


@pytest.mark.parametrize("path", ["/bytes/11", "/chunked/11"])
def test_a_result_within_the_limit_that_outgrows_it_as_a_json_string_is_fatal(path) -> None:
    assert call(path, max_result_bytes=12).kind == "fatal"     # 13 bytes once kept


# -- no answer ---------------------------------------------------------------------------
def test_a_refused_connection_is_a_failure_naming_the_url() -> None:
    async def main() -> None:
        async with dispatcher() as (d, link):
            url = f"http://127.0.0.1:{refused_port()}/f"
            push(d, url)
            outcome = await link.outcome("t1")
            assert (outcome.kind, outcome.status_code, outcome.result) == ("failure", None, None)
            assert outcome.error.startswith(f"could not connect to {url}: ")
    asyncio.run(main())


def test_a_refused_connection_says_its_request_was_never_sent() -> None:
    async def main() -> None:
        async with dispatcher() as (d, link):
            push(d, f"http://127.0.0.1:{refused_port()}/f")
            outcome = await link.outcome("t1")
            assert (outcome.failure, outcome.sent) == ("error", False)
            assert outcome.fields()[5] == {"failure": "error", "sent": False}
    asyncio.run(main())


@pytest.mark.parametrize("path, kind", [("/slow", "unknown"), ("/hang-up", "unknown"),
                                        ("/error", "failure")])
def test_a_call_that_failed_after_its_headers_left_says_they_may_have_been_sent(path, kind):
    outcome = call(path, timeout_ms=300)
    assert (outcome.kind, outcome.sent) == (kind, True)


def test_a_moved_call_echoes_its_move_in_its_report() -> None:
    async def main() -> None:
        async with dispatcher() as (d, link):
            d.on_replies([(1, R.T_CALL, "t1", 1, f"http://127.0.0.1:{refused_port()}/f",
                           PARAMS, 1000, {"result_headers": [], "move": 2})])
            outcome = await link.outcome("t1")
            assert (outcome.move, outcome.sent) == (2, False)
            assert Outcome.read(*outcome.fields()) == outcome
    asyncio.run(main())


def test_a_refused_connection_says_it_failed_to_connect_so_the_broker_may_call_again(
        ) -> None:
    async def main() -> None:
        async with dispatcher() as (d, link):
            push(d, f"http://127.0.0.1:{refused_port()}/f")
            assert (await link.outcome("t1")).failure == "error"
    asyncio.run(main())


def test_an_abort_cancels_the_running_call_and_the_host_sees_its_connection_close() -> None:
    async def main() -> None:
        async with function_host() as host, dispatcher() as (d, link):
            push(d, host.url + "/abortable", timeout_ms=10_000)
            await until(lambda: host.hits == ["/abortable"])
            started = time.monotonic()
            d.on_replies([(1, R.T_ABORT, "t1", 1)])
            outcome = await link.outcome("t1")
            assert (outcome.kind, outcome.status_code) == ("unknown", None)
            assert outcome.error.startswith("aborted")
            await until(lambda: host.aborted == ["/abortable"])
            assert time.monotonic() - started < 2 and not d.calls and not d.aborting
    asyncio.run(main())


def test_a_call_aborted_before_it_began_is_reported_declined_and_never_made() -> None:
    async def main() -> None:
        async with function_host() as host, dispatcher() as (d, link):
            d.on_replies([(1, R.T_CALL, "t1", 1, host.url + "/echo", PARAMS, 1000),
                          (1, R.T_ABORT, "t1", 1)])
            outcome = await link.outcome("t1")
            assert (outcome.kind, outcome.error) == ("declined", "aborted before the call began")
            assert host.hits == [] and not d.calls and not d.aborting
    asyncio.run(main())


def test_an_abort_of_a_call_that_is_not_running_changes_nothing() -> None:
    async def main() -> None:
        async with function_host() as host, dispatcher() as (d, link):
            push(d, host.url + "/nap")
            d.on_replies([(1, R.T_ABORT, "t1", 2), (1, R.T_ABORT, "other", 1)])
            assert (await link.outcome("t1")).kind == "success"
    asyncio.run(main())


def test_a_timeout_is_an_unknown_outcome() -> None:
    started = time.monotonic()
    outcome = call("/slow", timeout_ms=300)
    assert (outcome.kind, outcome.status_code, outcome.result) == ("unknown", None, None)
    assert outcome.error.endswith("within 300 ms")
    assert time.monotonic() - started < 2


def test_a_connection_closed_without_an_answer_is_an_unknown_outcome() -> None:
    outcome = call("/hang-up")
    assert (outcome.kind, outcome.status_code, outcome.result) == ("unknown", None, None)
    assert "after the request was sent: ServerDisconnectedError" in outcome.error


def test_an_unexpected_error_in_a_call_is_an_unknown_outcome_logged_once(caplog) -> None:
    class Broken(Dispatcher):
        async def _send(self, *args) -> Outcome:
            raise RuntimeError("a bug")

    async def main() -> None:
        async with dispatcher(Broken) as (d, link):
            push(d, "http://127.0.0.1:1/f")
            outcome = await link.outcome("t1")
            assert outcome.kind == "unknown" and "RuntimeError('a bug')" in outcome.error
    with caplog.at_level(logging.ERROR, logger="zstalk.dispatcher"):
        asyncio.run(main())
    assert len(caplog.records) == 1 and caplog.records[0].exc_info


# -- concurrency and shutdown ------------------------------------------------------------
@pytest.mark.parametrize("slots, low_s, high_s", [(2, NAP_S, 2 * NAP_S),
                                                 (1, 2 * NAP_S, 3 * NAP_S)],
                         ids=["two-slots-together", "one-slot-in-turn"])
def test_calls_run_concurrently_up_to_the_slots(slots: int, low_s: float, high_s: float) -> None:
    async def main() -> float:
        async with function_host() as host, dispatcher(slots=slots) as (d, link):
            started = time.monotonic()
            push(d, host.url + "/nap", "t1", 2000)
            push(d, host.url + "/nap", "t2", 2000)
            for uid in ("t1", "t2"):
                assert (await link.outcome(uid)).kind == "success"
            return time.monotonic() - started
    assert low_s <= asyncio.run(main()) < high_s


def test_closing_lets_running_calls_finish_declines_new_ones_and_says_goodbye() -> None:
    async def main() -> None:
        async with function_host() as host:
            link = FakeLink()
            d = Dispatcher("tcp://broker.invalid:1", link=link)
            d.on_welcome(welcome())
            push(d, host.url + "/nap", "t1", 2000)
            await asyncio.sleep(0.1)
            closing = asyncio.ensure_future(d.close())
            await asyncio.sleep(0.05)
            push(d, host.url + "/echo", "t2")           # pushed before the broker heard
            await closing
            assert link.ops[2] == (Op.T_SUBSCRIBE, 1, 0, True), "take no more calls"
            reports = {op[2]: op[4] for op in link.ops if op[0] == Op.T_OUTCOME}
            assert reports == {"t1": "success", "t2": "declined"}
            assert link.ops[-1] == (Op.CLOSE, 1) and link.closed
            assert not d.calls and d.http.closed
    asyncio.run(main())


def test_closing_cancels_what_is_still_running_after_the_grace_period() -> None:
    async def main() -> None:
        async with function_host() as host:
            link = FakeLink()
            d = Dispatcher("tcp://broker.invalid:1", link=link)
            d.on_welcome(welcome())
            push(d, host.url + "/slow")
            await asyncio.sleep(0.1)
            started = time.monotonic()
            await d.close(grace_s=0.2)
            assert 0.2 <= time.monotonic() - started < 1.0
            assert [op[0] for op in link.ops[2:]] == [Op.T_SUBSCRIBE, Op.CLOSE]
            assert not d.calls and d.http.closed
    asyncio.run(main())


# -- Retry-After -------------------------------------------------------------------------
NOW = 1_700_000_000.0


@pytest.mark.parametrize("value, ms", [
    ("7", 7000), (" 0 ", 0), (None, -1), ("", -1), ("soon", -1), ("-1", -1), ("1.5", -1),
    ("²", -1), ("9" * 5000, RETRY_AFTER_MAX_MS), (str(10 ** 9), RETRY_AFTER_MAX_MS),
    (email.utils.formatdate(NOW + 90, usegmt=True), 90_000),
    (email.utils.formatdate(NOW - 90, usegmt=True), 0),
    ("Tue, 14 Nov 2023 22:13:50 -0000", 30_000),
    ("Tue, 14 Nov 2023 23:13:50 +0100", 30_000),
])
def test_retry_after_is_delta_seconds_or_an_http_date(value, ms: int) -> None:
    assert retry_after_ms(value, NOW) == ms


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_retry_after_gives_a_wait_and_never_an_exception(value: str) -> None:
    assert -1 <= retry_after_ms(value, NOW) <= RETRY_AFTER_MAX_MS


# -- a resolved name's address (T_CALL ext "host") ----------------------------------------
def test_a_call_to_a_resolved_address_says_the_name_as_its_host() -> None:
    async def main() -> None:
        async with function_host() as host, dispatcher() as (d, link):
            d.on_replies([(1, R.T_CALL, "t1", 1, host.url + "/echo", PARAMS, 1000,
                           {"result_headers": [], "host": "api.test:8000"})])
            got = json.loads((await link.outcome("t1")).result)["headers"]
            assert got["Host"] == "api.test:8000"
    asyncio.run(main())


def test_an_https_call_to_a_resolved_address_names_the_host_in_its_tls_handshake(
        tmp_path) -> None:
    """The server name (SNI) is the name, not the address: the host's callback hears it
    (the self-signed certificate is then refused: the call fails before any request)."""
    import ssl
    import subprocess
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=api.test", "-keyout", str(tmp_path / "key.pem"),
                    "-out", str(tmp_path / "cert.pem")], check=True, capture_output=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    names: list[str | None] = []
    context.sni_callback = lambda sock, name, ctx: names.append(name)

    async def main() -> None:
        host = FunctionHost()
        runner = web.AppRunner(host.app, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
        try:
            url = f"https://127.0.0.1:{runner.addresses[0][1]}/echo"
            async with dispatcher() as (d, link):
                d.on_replies([(1, R.T_CALL, "t1", 1, url, PARAMS, 1000,
                               {"result_headers": [], "host": "api.test:8443"})])
                outcome = await link.outcome("t1")
                assert (outcome.kind, outcome.sent) == ("failure", False), outcome
                assert "certificate" in outcome.error.lower()
        finally:
            await runner.cleanup()
        assert names == ["api.test"] and host.hits == []
    asyncio.run(main())
