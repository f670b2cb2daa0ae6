"""Cloud tasks end to end: `zstalk serve --config` as a real process, a function host run by
the test (aiohttp on loopback), and plain HTTP requests from the test."""
from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from aiohttp import web

from servers import LOOPBACK, ServerProcess, find_zstalk, free_port, self_check

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")
WAIT_S = 10.0


class FunctionHost:
    """An aiohttp app on its own loop in a thread: the functions tasks call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes, dict]] = []
        self.failures_left: dict[str, int] = {}
        self.hanging = False        # functions named hang* answer only once this is False
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    async def handle(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = await request.read()
        self.calls.append((name, body, dict(request.headers)))
        for _ in range(1200):       # (a minute at most)
            if not (self.hanging and name.startswith("hang")):
                break
            await asyncio.sleep(0.05)
        if self.failures_left.get(name, 0) > 0:
            self.failures_left[name] -= 1
            return web.json_response({"error": "not yet"}, status=500)
        return web.json_response({"function": name, "params": json.loads(body)})

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/fn/{name}", self.handle)
        runner = web.AppRunner(app)
        self.loop.run_until_complete(runner.setup())
        self.loop.run_until_complete(web.TCPSite(runner, LOOPBACK, self.port).start())
        self.ready.set()
        self.loop.run_forever()

    def __enter__(self) -> "FunctionHost":
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def host():
    with FunctionHost() as h:
        yield h


@pytest.fixture
def serve(tmp_path, host):
    started = []

    def start(*extra: str, config: str | None = None) -> "Api":
        path = tmp_path / "zstalk.toml"
        path.write_text(config or f'[functions]\nbase_url = "http://{LOOPBACK}:{host.port}/fn"\n')
        port, http_port = free_port(), free_port()
        server = ServerProcess([find_zstalk(), "serve", "-l", LOOPBACK, "-p", str(port),
                                "--counter-port", "0", "--worker-bind", "none",
                                "--config", str(path), "--http-port", str(http_port), *extra],
                               (LOOPBACK, port), name="zstalk-tasks").start()
        started.append(server)
        api = Api(f"http://{LOOPBACK}:{http_port}", server)
        api.wait_listening()
        return api

    yield start
    for server in started:
        server.stop()


class Api:
    def __init__(self, base: str, server: ServerProcess) -> None:
        self.base = base
        self.server = server
        self.key: str | None = None

    def request(self, method: str, path: str, body=None, raw: bytes | None = None):
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if self.key:
            req.add_header("Authorization", f"Bearer {self.key}")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def wait_listening(self) -> None:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                self.request("GET", "/v1/tasks/nosuch")
                return
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline:
                    raise AssertionError("the HTTP API never answered:\n" + self.server.output())
                time.sleep(0.05)

    def wait_status(self, uid: str, *statuses: str) -> dict:
        deadline = time.monotonic() + WAIT_S
        while True:
            code, info = self.request("GET", f"/v1/tasks/{uid}")
            if code == 200 and info["status"] in statuses:
                return info
            assert time.monotonic() < deadline, f"task {uid} is still {info}"
            time.sleep(0.02)


def test_an_enqueued_task_calls_its_function_and_keeps_the_result(serve, host):
    api = serve()
    code, body = api.request("POST", "/v1/tasks", {"function": "closeOrder",
                                                    "params": {"id": 1234}})
    assert code == 201 and body["status"] == "queued" and body["waitNum"] == 0
    info = api.wait_status(body["uniqueId"], "success", "failed")
    assert info["status"] == "success" and info["statusCode"] == 200
    assert info["result"] == {"function": "closeOrder", "params": {"id": 1234}}
    assert info["attempt"] == 1 and info["finishedAt"].endswith("Z")
    [(name, params, headers)] = host.calls
    assert (name, json.loads(params)) == ("closeOrder", {"id": 1234})
    assert headers["X-Zstalk-Task-Id"] == body["uniqueId"] and headers["X-Zstalk-Attempt"] == "1"


def test_a_failing_call_is_retried_after_its_backoff(serve, host):
    api = serve()
    host.failures_left["flaky"] = 1
    started = time.monotonic()
    code, body = api.request("POST", "/v1/tasks", {
        "function": "flaky", "params": None, "options": {"attempts": 2, "backoff": 300}})
    info = api.wait_status(body["uniqueId"], "success", "failed")
    assert info["status"] == "success" and info["attempt"] == 2
    assert time.monotonic() - started >= 0.3
    assert [name for name, _, _ in host.calls] == ["flaky", "flaky"]


def test_a_delayed_task_can_be_cancelled_before_it_runs(serve, host):
    api = serve()
    _, body = api.request("POST", "/v1/tasks", {"function": "later", "options": {"delay": 60000}})
    code, info = api.request("DELETE", f"/v1/tasks/{body['uniqueId']}")
    assert code == 200 and info["status"] == "cancelled"
    assert api.request("DELETE", f"/v1/tasks/{body['uniqueId']}")[0] == 409
    assert host.calls == []


def test_bad_requests_get_a_json_error_and_enqueue_nothing(serve, host):
    api = serve()
    assert api.request("POST", "/v1/tasks", raw=b"{not json")[0] == 400
    code, body = api.request("POST", "/v1/tasks", {"function": "f", "options": {"delay": -1}})
    assert code == 400 and "delay" in body["message"]
    options = {"uniqueId": "order-1", "delay": 60000}
    assert api.request("POST", "/v1/tasks", {"function": "f", "options": options})[0] == 201
    code, body = api.request("POST", "/v1/tasks", {"function": "f", "options": options})
    assert code == 409 and body["error"] == "duplicate"
    assert api.request("GET", "/v1/tasks/nosuch")[0] == 404
    assert host.calls == []


def test_an_unknown_function_is_a_404_when_only_named_functions_are_configured(serve, host):
    api = serve(config=f'[functions.known]\nurl = "http://{LOOPBACK}:{host.port}/fn/known"\n')
    code, body = api.request("POST", "/v1/tasks", {"function": "unknown"})
    assert code == 404 and "unknown" in body["message"]
    _, body = api.request("POST", "/v1/tasks", {"function": "known"})
    assert api.wait_status(body["uniqueId"], "success")["result"]["function"] == "known"


def test_with_a_master_key_enqueue_needs_it_and_reading_a_task_does_not(serve, host):
    api = serve("--master-key", "s3cret")
    assert api.request("POST", "/v1/tasks", {"function": "f"})[0] == 401
    api.key = "wrong"
    assert api.request("POST", "/v1/tasks", {"function": "f"})[0] == 403
    api.key = "s3cret"
    code, body = api.request("POST", "/v1/tasks", {"function": "f"})
    assert code == 201
    api.key = None
    assert api.request("GET", f"/v1/tasks/{body['uniqueId']}")[0] == 200


def test_serve_says_where_the_http_api_listens_and_that_it_is_loopback_only(serve):
    api = serve()
    deadline = time.monotonic() + WAIT_S
    while "http on" not in api.server.output() and time.monotonic() < deadline:
        time.sleep(0.05)
    line = next(l for l in api.server.output().splitlines() if "http on" in l)
    assert api.base.removeprefix("http://") in line and "loopback only" in line


def test_a_config_file_with_an_error_stops_serve_and_names_the_key(tmp_path):
    import subprocess
    path = tmp_path / "bad.toml"
    path.write_text('[functions.f]\nurl = "http://x"\ntimeout = 10\n')
    out = subprocess.run([find_zstalk(), "serve", "-l", LOOPBACK, "-p", str(free_port()),
                          "--counter-port", "0", "--config", str(path)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert str(path) in out.stderr and "timeout" in out.stderr


def start_split(tmp_path, host) -> tuple[list, "Api", list[str]]:
    """A broker, an HTTP front and one dispatcher in their own processes: the processes
    (stop them in reverse), the API, and the command that starts another dispatcher."""
    path = tmp_path / "zstalk.toml"
    path.write_text(f'[functions]\nbase_url = "http://{LOOPBACK}:{host.port}/fn"\n')
    broker_port, http_port = free_port(), free_port()
    endpoint = f"tcp://{LOOPBACK}:{broker_port}"
    dispatcher = [find_zstalk(), "dispatcher", "--broker", endpoint]
    procs = [ServerProcess([find_zstalk(), "broker", "--bind", endpoint, "--config", str(path)],
                           (LOOPBACK, broker_port), name="tasks-broker").start()]
    try:
        procs.append(ServerProcess([find_zstalk(), "front", "http", "--broker", endpoint,
                                    "--listen", f"{LOOPBACK}:{http_port}"],
                                   (LOOPBACK, http_port), name="tasks-front").start())
        procs.append(ServerProcess(dispatcher, (LOOPBACK, broker_port),
                                   name="tasks-dispatcher").start())
        api = Api(f"http://{LOOPBACK}:{http_port}", procs[1])
        api.wait_listening()
    except BaseException:
        for proc in reversed(procs):
            proc.stop()
        raise
    return procs, api, dispatcher


def test_the_api_and_the_dispatcher_work_in_their_own_processes(tmp_path, host):
    procs, api, _ = start_split(tmp_path, host)
    try:
        code, body = api.request("POST", "/v1/tasks", {"function": "remote", "params": [1, 2]})
        assert code == 201
        info = api.wait_status(body["uniqueId"], "success", "failed")
        assert info["status"] == "success" and info["result"]["params"] == [1, 2]
    finally:
        for proc in reversed(procs):
            proc.stop()


def test_the_http_front_refuses_to_listen_beyond_loopback_without_a_master_key():
    import subprocess
    out = subprocess.run([find_zstalk(), "front", "http", "--listen", f"0.0.0.0:{free_port()}"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "loopback only" in out.stderr


def test_an_array_of_tasks_is_enqueued_in_one_request_and_each_is_called(serve, host):
    api = serve()
    code, results = api.request("POST", "/v1/tasks", [
        {"function": "batch", "params": n} for n in range(50)] + [{"function": 1}])
    assert code == 200 and len(results) == 51
    assert [r["status"] for r in results] == [201] * 50 + [400]
    for r in results[:50]:
        assert api.wait_status(r["uniqueId"], "success")["statusCode"] == 200
    assert sorted(json.loads(params) for _, params, _ in host.calls) == list(range(50))


def test_operators_list_tasks_page_by_page_with_the_master_key(serve, host):
    api = serve("--master-key", "k")
    api.key = "k"
    ids = [api.request("POST", "/v1/tasks", {"function": "f", "options": {"delay": 60000}})[1]
           ["uniqueId"] for _ in range(5)]
    code, page = api.request("GET", "/v1/tasks?limit=3&status=queued")
    assert code == 200 and [t["uniqueId"] for t in page["tasks"]] == ids[:3]
    code, page = api.request("GET", f"/v1/tasks?limit=3&after={page['next']}")
    assert [t["uniqueId"] for t in page["tasks"]] == ids[3:] and page["next"] is None
    assert api.request("GET", "/v1/tasks?status=sleeping")[0] == 400
    api.key = None
    assert api.request("GET", "/v1/tasks")[0] == 401


def test_sighup_reads_the_config_again_and_a_bad_one_changes_nothing(serve, host, tmp_path):
    import signal
    only_f = f'[functions.f]\nurl = "http://{LOOPBACK}:{host.port}/fn/f"\n'
    api = serve(config=only_f)
    config = tmp_path / "zstalk.toml"
    assert api.request("POST", "/v1/tasks", {"function": "g"})[0] == 404
    _, later = api.request("POST", "/v1/tasks", {"function": "f", "options": {"delay": 500}})
    config.write_text("")                               # f is gone: its task must wait
    api.server.process.send_signal(signal.SIGHUP)
    time.sleep(1.0)
    assert api.request("GET", f"/v1/tasks/{later['uniqueId']}")[1]["status"] == "queued"
    config.write_text(only_f + f'[functions.g]\nurl = "http://{LOOPBACK}:{host.port}/fn/g"\n')
    api.server.process.send_signal(signal.SIGHUP)
    assert api.wait_status(later["uniqueId"], "success")["status"] == "success"
    config.write_text("[functions.g]\nurl = 7\n")       # an error: the config in use stays
    api.server.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + WAIT_S
    while "kept the config in use" not in api.server.output():
        assert time.monotonic() < deadline, api.server.output()
        time.sleep(0.05)
    code, body = api.request("POST", "/v1/tasks", {"function": "g"})
    assert code == 201 and api.wait_status(body["uniqueId"], "success")


def wait_calls(host: FunctionHost, name: str, count: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while sum(1 for n, _, _ in host.calls if n == name) < count:
        assert time.monotonic() < deadline, f"{name} called {host.calls}"
        time.sleep(0.02)


def test_a_broker_killed_with_kill_9_comes_back_with_its_tasks_and_results(tmp_path, host):
    """-f 0: every acknowledged enqueue and every call start is on disk before it shows."""
    path = tmp_path / "zstalk.toml"
    path.write_text(f'[functions]\nbase_url = "http://{LOOPBACK}:{host.port}/fn"\n')
    port, http_port = free_port(), free_port()
    server = ServerProcess([find_zstalk(), "serve", "-l", LOOPBACK, "-p", str(port),
                            "--counter-port", "0", "--worker-bind", "none", "--config", str(path),
                            "--http-port", str(http_port), "--binlog", str(tmp_path / "wal"),
                            "-f", "0"], (LOOPBACK, port), name="zstalk-tasks-wal").start()
    api = Api(f"http://{LOOPBACK}:{http_port}", server)
    try:
        api.wait_listening()
        _, done = api.request("POST", "/v1/tasks", {"function": "closeOrder", "params": {"id": 7}})
        done = api.wait_status(done["uniqueId"], "success")
        api.request("POST", "/v1/tasks", {"function": "later", "options": {
            "delay": 600000, "priority": -5, "uniqueId": "later-1"}})
        later = api.request("GET", "/v1/tasks/later-1")[1]
        host.hanging = True
        api.request("POST", "/v1/tasks", {"function": "hangA", "options": {
            "uniqueId": "least", "backoff": 100}})
        api.request("POST", "/v1/tasks", {"function": "hangB", "options": {
            "uniqueId": "most", "deliveryMode": "atMostOnce"}})
        wait_calls(host, "hangA", 1)
        wait_calls(host, "hangB", 1)
        server.kill()
        host.hanging = False
        server.start()
        api.wait_listening()
        code, info = api.request("GET", f"/v1/tasks/{done['uniqueId']}")
        assert code == 200 and info == done
        assert api.request("GET", "/v1/tasks/later-1") == (200, later)
        least = api.wait_status("least", "success", "failed")
        assert (least["status"], least["attempt"]) == ("success", 2)
        most = api.wait_status("most", "success", "failed")
        assert most["status"] == "failed" and "atMostOnce" in most["error"]
        assert "the broker stopped during the call" in most["error"]
        assert [n for n, _, _ in host.calls].count("hangB") == 1
        assert api.request("POST", "/v1/tasks", {"function": "x", "options": {
            "uniqueId": "later-1"}})[0] == 409
    finally:
        server.stop()


@pytest.mark.parametrize("mode, status, calls", [("atLeastOnce", "success", 2),
                                                 ("atMostOnce", "failed", 1)])
def test_a_dispatcher_killed_mid_call_is_handled_by_the_delivery_mode(tmp_path, host, mode,
                                                                       status, calls):
    procs, api, dispatcher = start_split(tmp_path, host)
    try:
        host.hanging = True
        api.request("POST", "/v1/tasks", {"function": "hangC", "options": {
            "uniqueId": "t", "deliveryMode": mode, "backoff": 100}})
        wait_calls(host, "hangC", 1)
        procs[2].kill()
        host.hanging = False
        procs.append(ServerProcess(dispatcher, procs[0].address, name="dispatcher-2").start())
        info = api.wait_status("t", "success", "failed")
        assert info["status"] == status and info["attempt"] == calls
        if mode == "atMostOnce":
            assert "outcome unknown" in info["error"] and "dispatcher" in info["error"]
        assert [n for n, _, _ in host.calls].count("hangC") == calls
    finally:
        for proc in reversed(procs):
            proc.stop()
