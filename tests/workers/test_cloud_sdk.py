"""The cloud-task SDK (workers/cloud.py): a Functions app served on loopback and called over
real HTTP; then TaskClient and AsyncTaskClient against a real `zstalk serve --config`
process whose dispatcher calls a Functions app running in a thread of the test."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
import time

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from servers import LOOPBACK, ServerProcess, find_zstalk, free_port, self_check
from zstalk.workers import AsyncTaskClient, Functions, TaskApiError, TaskClient, signing

KEY = b"shared by the dispatchers and the functions"
OTHER_KEY = b"a key the dispatchers do not have"
MASTER_KEY = "s3cret"
WAIT_S = 10.0
BODY = b'{"id":1234}'


def unsigned_functions() -> Functions:
    """Functions that verify nothing, whatever this test process's environment says."""
    with pytest.MonkeyPatch.context() as env:
        env.delenv(signing.ENV_KEY, raising=False)
        env.delenv(signing.ENV_KEY_FILE, raising=False)
        return define_all(Functions())


def define_all(functions: Functions) -> Functions:
    @functions.define("closeOrder")
    def close_order(params):
        return {"closed": params["id"], "thread": threading.current_thread().name}

    @functions.define("echo")
    async def echo(params):
        return params

    @functions.define()
    def boom(params):
        raise RuntimeError("no such order")

    @functions.define("busy")
    def busy(params):
        return web.json_response({"later": True}, status=429, headers={"Retry-After": "7"})

    @functions.define("unsayable")
    def unsayable(params):
        return {1, 2}

    return functions


# -- the function host, called directly -----------------------------------------------------
@contextlib.asynccontextmanager
async def serving(functions: Functions):
    """The app on a port of the system's choosing; yields its base URL."""
    runner = web.AppRunner(functions.app())
    await runner.setup()
    await web.TCPSite(runner, LOOPBACK, 0).start()
    try:
        yield "http://%s:%d" % (LOOPBACK, runner.addresses[0][1])
    finally:
        await runner.cleanup()


def post(functions: Functions, path: str, body: bytes = BODY,
         headers: dict | None = None) -> tuple[int, object]:
    """One POST to a freshly served app, of `path` (and query) exactly as given, not
    requoted: (status, JSON body)."""
    async def main():
        async with serving(functions) as url, aiohttp.ClientSession() as http:
            async with http.post(URL(url + path, encoded=True), data=body,
                                 headers=headers or {}) as resp:
                return resp.status, json.loads(await resp.read())
    return asyncio.run(main())


def signed(task_id: str, body: bytes = BODY, key: bytes = KEY, at: float | None = None) -> dict:
    now = time.time() if at is None else at
    return {"X-Zstalk-Task-Id": task_id, signing.HEADER: signing.sign(key, task_id, body, now)}


def test_a_defined_function_answers_its_return_value_as_json() -> None:
    status, body = post(unsigned_functions(), "/closeOrder")
    assert status == 200 and body["closed"] == 1234


def test_a_plain_def_runs_in_a_thread_so_it_may_block() -> None:
    _, body = post(unsigned_functions(), "/closeOrder")
    assert body["thread"] != threading.main_thread().name


def test_an_async_def_is_awaited() -> None:
    assert post(unsigned_functions(), "/echo", b'[1, "two", null]') == (200, [1, "two", None])


def test_an_empty_body_is_null_params() -> None:
    assert post(unsigned_functions(), "/echo", b"") == (200, None)


def test_an_exception_is_a_500_that_keeps_its_message_to_itself_so_the_queue_retries() -> None:
    status, body = post(unsigned_functions(), "/boom")
    assert status == 500
    assert body == {"error": "function_failed", "message": "the function raised (its type "
                                                           "and message: Functions(expose_errors=True))"}


def test_with_expose_errors_an_exception_s_type_and_message_go_back_in_a_header() -> None:
    async def main():
        with pytest.MonkeyPatch.context() as env:
            env.delenv(signing.ENV_KEY, raising=False)
            env.delenv(signing.ENV_KEY_FILE, raising=False)
            functions = define_all(Functions(expose_errors=True))
        async with serving(functions) as url, aiohttp.ClientSession() as http:
            async with http.post(url + "/boom", data=BODY) as resp:
                return resp.status, resp.headers.get(signing.ERROR_HEADER), await resp.json()
    status, said, body = asyncio.run(main())
    assert (status, said) == (500, "RuntimeError: no such order")
    assert body == {"error": "function_failed", "message": "RuntimeError: no such order"}


def test_a_caller_may_ask_for_the_error_and_gets_it_on_one_ascii_line_of_at_most_1_kib() -> None:
    functions = unsigned_functions()

    @functions.define()
    def long_boom(params):
        raise ValueError("é\n" + "x" * 5000)
    status, body = post(functions, "/long_boom", headers={signing.EXPOSE_HEADER: "1"})
    assert status == 500
    assert body["message"].startswith("ValueError: \\xe9 xxx") and len(body["message"]) == 1024


def test_a_result_json_cannot_say_is_a_500_too() -> None:
    status, body = post(unsigned_functions(), "/unsayable")
    assert status == 500 and body["error"] == "function_failed"


def test_a_function_may_answer_with_its_own_response() -> None:
    assert post(unsigned_functions(), "/busy") == (429, {"later": True})


def test_an_unknown_function_is_a_404() -> None:
    status, body = post(unsigned_functions(), "/closeorder")
    assert status == 404 and body["error"] == "not_found" and "'closeorder'" in body["message"]


def test_a_body_that_is_not_json_is_a_400() -> None:
    status, body = post(unsigned_functions(), "/echo", b"{not json")
    assert status == 400 and body["error"] == "bad_request"


def test_define_without_a_name_uses_the_function_s_own() -> None:
    functions = Functions(signing_key=KEY)

    @functions.define
    def refund(params):
        return "refunded"

    assert functions.functions == {"refund": refund}
    with pytest.raises(ValueError):
        functions.define("a/b")(refund)


def signed_v2(task_id: str, path: str, query: str = "", body: bytes = BODY) -> dict:
    header = signing.sign(KEY, task_id, body, time.time(), "POST", path, query)
    return {"X-Zstalk-Task-Id": task_id, signing.HEADER: header}


def test_with_a_signing_key_a_correctly_signed_call_runs() -> None:
    functions = define_all(Functions(signing_key=KEY))
    assert post(functions, "/echo", headers=signed("t1")) == (200, {"id": 1234})


@pytest.mark.parametrize("headers, reason", [
    ({"X-Zstalk-Task-Id": "t1"}, signing.MISSING),
    ({"X-Zstalk-Task-Id": "t1", signing.HEADER: "t=1,v1=nonsense"}, signing.MALFORMED),
    (signed("t1", key=OTHER_KEY), signing.BAD_SIGNATURE),
    (signed("t1", body=b'{"id":4321}'), signing.BAD_SIGNATURE),
    ({**signed("t1"), "X-Zstalk-Task-Id": "t2"}, signing.BAD_SIGNATURE),
    (signed("t1", at=time.time() - 600), signing.TOO_OLD),
], ids=["none", "malformed", "other-key", "other-body", "other-task", "stale"])
def test_with_a_signing_key_any_other_call_is_a_401_saying_why(headers, reason) -> None:
    functions = define_all(Functions(signing_key=KEY))
    assert post(functions, "/echo", headers=headers) == (
        401, {"error": "unauthorized", "message": reason})


@pytest.mark.parametrize("target, path, query", [
    ("/echo", "/echo", ""),
    ("/echo?day=2026-11-26&note=a+b%20c", "/echo", "day=2026-11-26&note=a+b%20c"),
    ("/ech%6F", "/ech%6F", ""),         # routed as /echo; signed as sent
], ids=["path", "path-and-query", "percent-encoded"])
def test_with_a_signing_key_a_call_signed_with_its_request_line_runs(target, path,
                                                                      query) -> None:
    functions = define_all(Functions(signing_key=KEY))
    assert post(functions, target, headers=signed_v2("t1", path, query)) == (200, {"id": 1234})


@pytest.mark.parametrize("target, path, query", [
    ("/echo", "/closeOrder", ""),
    ("/echo?day=2026-11-27", "/echo", "day=2026-11-26"),
    ("/echo?day=2026-11-26", "/echo", ""),
    ("/echo", "/echo", "day=2026-11-26"),
    ("/ech%6F", "/echo", ""),           # the raw path is checked, not its decoded form
], ids=["other-path", "other-query", "query-added", "query-dropped", "decoded-path"])
def test_with_a_signing_key_a_call_whose_v2_signs_another_request_line_is_a_401(
        target, path, query) -> None:
    functions = define_all(Functions(signing_key=KEY))
    assert post(functions, target, headers=signed_v2("t1", path, query)) == (
        401, {"error": "unauthorized", "message": signing.BAD_SIGNATURE})


def test_functions_requiring_v2_refuse_a_v1_only_call_and_run_a_v2_one() -> None:
    functions = define_all(Functions(signing_key=KEY, require_v2=True))
    assert post(functions, "/echo", headers=signed("t1")) == (
        401, {"error": "unauthorized", "message": signing.NO_V2})
    assert post(functions, "/echo", headers=signed_v2("t1", "/echo")) == (200, {"id": 1234})


def test_an_unsigned_caller_cannot_even_learn_which_functions_exist() -> None:
    status, _ = post(define_all(Functions(signing_key=KEY)), "/nosuch")
    assert status == 401


def test_functions_take_their_signing_key_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv(signing.ENV_KEY, KEY.decode())
    assert Functions().signing_key == KEY


# -- the clients against a real server ------------------------------------------------------
class FunctionsThread:
    """A Functions app on its own loop in a daemon thread, on a port the system picks."""

    def __init__(self, functions: Functions) -> None:
        self.functions = functions
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.url = ""

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        runner = web.AppRunner(self.functions.app())
        self.loop.run_until_complete(runner.setup())
        self.loop.run_until_complete(web.TCPSite(runner, LOOPBACK, 0).start())
        self.url = "http://%s:%d" % (LOOPBACK, runner.addresses[0][1])
        self.ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(runner.cleanup())
        self.loop.close()

    def __enter__(self) -> "FunctionsThread":
        self.thread.start()
        assert self.ready.wait(WAIT_S)
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT_S)


def serve(config_path, config: str, *extra: str, signing_key: bytes | None = None):
    """`zstalk serve` with the config and its HTTP API on a free port; (process, API URL)."""
    config_path.write_text(config)
    env = {k: v for k, v in os.environ.items()
           if k not in (signing.ENV_KEY, signing.ENV_KEY_FILE)}
    if signing_key is not None:
        env[signing.ENV_KEY] = signing_key.decode()
    port, http_port = free_port(), free_port()
    server = ServerProcess([find_zstalk(), "serve", "-l", LOOPBACK, "-p", str(port),
                            "--counter-port", "0", "--worker-bind", "none",
                            "--config", str(config_path), "--http-port", str(http_port),
                            *extra], (LOOPBACK, port), name="zstalk-sdk", env=env).start()
    url = f"http://{LOOPBACK}:{http_port}"
    try:
        wait_listening(url, server)
    except BaseException:
        server.stop()
        raise
    return server, url


def wait_listening(url: str, server: ServerProcess) -> None:
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            TaskClient(url, timeout=1).get_task_info("nosuch")
        except TaskApiError as err:
            if err.status == 404:
                return
            assert time.monotonic() < deadline, f"no API at {url}: {err}\n{server.output()}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """An unsigned server whose every function is served by one Functions app."""
    if self_check():
        pytest.skip("needs zstalk")
    with FunctionsThread(unsigned_functions()) as host:
        config = f'[functions]\nbase_url = "{host.url}"\n'
        server, url = serve(tmp_path_factory.mktemp("plain") / "zstalk.toml", config)
        try:
            yield url
        finally:
            server.stop()


@pytest.fixture(scope="module")
def signing_server(tmp_path_factory):
    """A server with a signing key and a master key: `closeOrder` is served by an app with
    the same signing key, `wrongKey` by one with another."""
    if self_check():
        pytest.skip("needs zstalk")
    with FunctionsThread(define_all(Functions(signing_key=KEY))) as good, \
            FunctionsThread(define_all(Functions(signing_key=OTHER_KEY))) as wrong:
        config = (f'[functions.closeOrder]\nurl = "{good.url}/closeOrder"\n'
                  f'[functions.wrongKey]\nurl = "{wrong.url}/closeOrder"\n')
        server, url = serve(tmp_path_factory.mktemp("signed") / "zstalk.toml", config,
                            "--master-key", MASTER_KEY, signing_key=KEY)
        try:
            yield url
        finally:
            server.stop()


def finished(client: TaskClient, unique_id: str) -> dict:
    """The task's info once it succeeded or failed (polled for at most WAIT_S)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        info = client.get_task_info(unique_id)
        if info["status"] in ("success", "failed", "cancelled"):
            return info
        assert time.monotonic() < deadline, f"task {unique_id} is still {info}"
        time.sleep(0.02)


async def finished_async(client: AsyncTaskClient, unique_id: str) -> dict:
    deadline = time.monotonic() + WAIT_S
    while True:
        info = await client.get_task_info(unique_id)
        if info["status"] in ("success", "failed", "cancelled"):
            return info
        assert time.monotonic() < deadline, f"task {unique_id} is still {info}"
        await asyncio.sleep(0.02)


def refused_url() -> str:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return f"http://{LOOPBACK}:{s.getsockname()[1]}"


def test_an_enqueued_call_runs_and_its_result_is_the_function_s_return_value(plain) -> None:
    client = TaskClient(plain)
    enqueued = client.enqueue("closeOrder", {"id": 1234})
    # (queued, or running when the dispatcher took it in the enqueue's turn: the 201 says)
    assert enqueued["status"] in ("queued", "running")
    assert {"uniqueId", "status", "createdAt", "token"} <= set(enqueued) <= {
        "uniqueId", "status", "createdAt", "token", "waitNum"}
    info = finished(client, enqueued["uniqueId"])
    assert info["status"] == "success" and info["statusCode"] == 200
    assert info["result"]["closed"] == 1234


def test_an_exception_in_the_function_fails_the_task_with_a_500(plain) -> None:
    client = TaskClient(plain)
    info = finished(client, client.enqueue("boom", attempts=0)["uniqueId"])
    assert (info["status"], info["statusCode"]) == ("failed", 500)
    assert info["error"] == "HTTP 500 Internal Server Error"     # readable by id: no message


def test_with_private_results_the_task_s_error_names_what_the_function_raised(
        tmp_path) -> None:
    if self_check():
        pytest.skip("needs zstalk")
    with FunctionsThread(unsigned_functions()) as host:
        config = (f'[functions]\nbase_url = "{host.url}"\n'
                  '[api]\nprivate_results = true\n')
        server, url = serve(tmp_path / "zstalk.toml", config)
        try:
            client = TaskClient(url)
            info = finished(client, client.enqueue("boom", attempts=0)["uniqueId"])
        finally:
            server.stop()
    assert info["error"] == "HTTP 500 Internal Server Error: RuntimeError: no such order"
    assert (info["calls"], info["maxCalls"], info["attempt"], info["attempts"]) == (1, 1, 1, 0)


def test_enqueue_many_answers_each_item_in_order(plain) -> None:
    client = TaskClient(plain)
    results = client.enqueue_many([{"function": "echo", "params": n} for n in range(3)]
                                  + [{"function": 1}])
    assert [r["status"] for r in results] == [201, 201, 201, 400]
    assert results[3]["error"] == "bad_request"
    assert [finished(client, r["uniqueId"])["result"] for r in results[:3]] == [0, 1, 2]


def test_a_delayed_task_can_be_cancelled_once(plain) -> None:
    client = TaskClient(plain)
    uid = client.enqueue("echo", "later", delay=60000)["uniqueId"]
    assert client.cancel(uid)["status"] == "cancelled"
    with pytest.raises(TaskApiError) as refused:
        client.cancel(uid)
    assert refused.value.status == 409


def test_a_task_is_read_and_cancelled_with_its_own_token_and_another_s_is_a_403(plain) -> None:
    client = TaskClient(plain)
    mine, other = (client.enqueue("echo", "later", delay=60000) for _ in range(2))
    assert client.get_task_info(mine["uniqueId"], token=mine["token"])["status"] == "queued"
    with pytest.raises(TaskApiError) as refused:
        client.cancel(mine["uniqueId"], token=other["token"])
    assert (refused.value.status, refused.value.code) == (403, "forbidden")

    async def cancel() -> dict:
        async with AsyncTaskClient(plain) as tasks:
            return await tasks.cancel(mine["uniqueId"], token=mine["token"])
    assert asyncio.run(cancel())["status"] == "cancelled"


def test_a_unique_id_in_use_is_a_409_duplicate(plain) -> None:
    client = TaskClient(plain)
    uid = f"dup-{time.monotonic_ns()}"
    assert client.enqueue("echo", None, unique_id=uid, delay=60000)["uniqueId"] == uid
    with pytest.raises(TaskApiError) as refused:
        client.enqueue("echo", None, uniqueId=uid, delay=60000)
    assert (refused.value.status, refused.value.code) == (409, "duplicate")
    assert uid in refused.value.message


def test_an_unknown_task_and_a_bad_option_are_api_errors(plain) -> None:
    client = TaskClient(plain)
    with pytest.raises(TaskApiError) as unknown:
        client.get_task_info("nosuch")
    assert (unknown.value.status, unknown.value.code) == (404, "not_found")
    with pytest.raises(TaskApiError) as bad:
        client.enqueue("echo", delay=-1)
    assert bad.value.status == 400 and "delay" in bad.value.message


def test_a_server_that_cannot_be_reached_is_an_api_error_with_status_0_naming_the_url() -> None:
    url = refused_url()
    with pytest.raises(TaskApiError) as refused:
        TaskClient(url, timeout=2).enqueue("echo")
    assert (refused.value.status, refused.value.code) == (0, "unreachable")
    assert f"{url}/v1/tasks" in refused.value.message


@contextlib.contextmanager
def silent_server():
    """A port that takes connections (into its backlog) and never answers: its URL."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        s.listen(8)
        yield f"http://{LOOPBACK}:{s.getsockname()[1]}"


def test_no_answer_within_the_timeout_is_an_api_error_that_may_have_taken_effect() -> None:
    async def enqueue_async(url: str) -> None:
        async with AsyncTaskClient(url, timeout=0.3) as client:
            await client.enqueue("echo")

    with silent_server() as url:
        started = time.monotonic()
        with pytest.raises(TaskApiError) as silent:
            TaskClient(url, timeout=0.3).enqueue("echo")
        with pytest.raises(TaskApiError) as silent_async:
            asyncio.run(enqueue_async(url))
        assert time.monotonic() - started < 2
    for err in (silent.value, silent_async.value):
        assert (err.status, err.code) == (0, "timeout")
        assert url in err.message and "may or may not" in err.message


def test_the_async_client_does_the_same(plain) -> None:
    async def main() -> None:
        async with AsyncTaskClient(plain) as client:
            uid = (await client.enqueue("closeOrder", {"id": 7}))["uniqueId"]
            assert (await finished_async(client, uid))["result"]["closed"] == 7
            results = await client.enqueue_many([{"function": "echo", "params": "a"},
                                                 {"function": "echo", "options": {"delay": -1}}])
            assert [r["status"] for r in results] == [201, 400]
            assert (await finished_async(client, results[0]["uniqueId"]))["result"] == "a"
            sent = await client.enqueue_request("echo", "POST", body=["b"], level=1)
            assert (await finished_async(client, sent["uniqueId"]))["result"] == ["b"]
            later = (await client.enqueue("echo", delay=60000, unique_id=f"a-{uid[:20]}"))
            with pytest.raises(TaskApiError) as duplicate:
                await client.enqueue("echo", unique_id=later["uniqueId"])
            assert (duplicate.value.status, duplicate.value.code) == (409, "duplicate")
            assert (await client.cancel(later["uniqueId"]))["status"] == "cancelled"
            with pytest.raises(TaskApiError) as unknown:
                await client.get_task_info("nosuch")
            assert unknown.value.status == 404
        assert client.http is None
    asyncio.run(main())


def test_the_async_client_names_a_server_it_cannot_reach() -> None:
    async def main() -> TaskApiError:
        url = refused_url()
        async with AsyncTaskClient(url, timeout=2) as client:
            with pytest.raises(TaskApiError) as refused:
                await client.cancel("t1")
        assert f"{url}/v1/tasks/t1" in refused.value.message
        return refused.value
    assert asyncio.run(main()).status == 0


def test_a_signed_call_to_a_host_with_the_same_key_succeeds(signing_server) -> None:
    client = TaskClient(signing_server, master_key=MASTER_KEY)
    info = finished(client, client.enqueue("closeOrder", {"id": 99}, attempts=0)["uniqueId"])
    assert info["status"] == "success" and info["result"]["closed"] == 99


def test_a_host_with_another_key_refuses_the_call_and_the_task_fails_with_401(
        signing_server) -> None:
    client = TaskClient(signing_server, master_key=MASTER_KEY)
    info = finished(client, client.enqueue("wrongKey", {"id": 99}, attempts=0)["uniqueId"])
    assert (info["status"], info["statusCode"]) == ("failed", 401)


def test_without_the_master_key_the_client_is_refused(signing_server) -> None:
    with pytest.raises(TaskApiError) as refused:
        TaskClient(signing_server).enqueue("closeOrder", {"id": 1})
    assert (refused.value.status, refused.value.code) == (401, "unauthorized")
    with pytest.raises(TaskApiError) as wrong:
        TaskClient(signing_server, master_key="wrong").enqueue("closeOrder", {"id": 1})
    assert wrong.value.status == 403


def test_a_request_task_s_body_goes_as_base64_bytes_text_or_json() -> None:
    from zstalk.workers.cloud import request_task_body
    assert request_task_body("f", "PUT", "/x", body=b"\x00\xff") == {
        "function": "f", "request": {"method": "PUT", "path": "/x", "body": {"base64": "AP8="}}}
    assert request_task_body("f", "GET", query={"a": "1"}, headers={"Accept": "text/csv"},
                             options={"queue_timeout": 5000}) == {
        "function": "f", "request": {"method": "GET", "path": "", "query": {"a": "1"},
                                     "headers": {"Accept": "text/csv"}},
        "options": {"queueTimeout": 5000}}
    assert request_task_body("f", "POST", body="text")["request"]["body"] == "text"
