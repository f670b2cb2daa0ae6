"""Cloud tasks end to end: `zstalk serve --config` as a real process, a function host run by
the test (aiohttp on loopback), and plain HTTP requests from the test."""
from __future__ import annotations

import asyncio
import datetime
import json
import os
import time
import urllib.error
import urllib.request
from typing import NamedTuple

import pytest
from aiohttp import web

from app_thread import AppThread
from servers import LOOPBACK, ServerProcess, find_zstalk, free_port, self_check, wait_for
from zstalk.workers import signing

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")
WAIT_S = 10.0


class Call(NamedTuple):
    name: str
    body: bytes
    headers: dict
    at: float           # time.monotonic() when it arrived


class FunctionHost(AppThread):
    """The functions tasks call (an aiohttp app in a thread).

    A call waits while its function's name or its task id is in `held` (a minute at
    most), then answers the next of `script[name]` (a dict: web.Response's arguments,
    and `sleep`, seconds to wait first), else 200 with its name and params as JSON."""

    def __init__(self, ssl_context=None) -> None:
        super().__init__(ssl_context)
        self.calls: list[Call] = []
        self.held: set[str] = set()
        self.script: dict[str, list[dict]] = {}

    async def handle(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = await request.read()
        self.calls.append(Call(name, body, dict(request.headers), time.monotonic()))
        for _ in range(1200):
            if not self.held & {name, request.headers["X-Zstalk-Task-Id"]}:
                break
            await asyncio.sleep(0.05)
        if self.script.get(name):
            answer = dict(self.script[name].pop(0))
            await asyncio.sleep(answer.pop("sleep", 0))
            return web.Response(**answer)
        return web.json_response({"function": name, "params": json.loads(body)})

    def called(self, name: str) -> list[Call]:
        return [call for call in self.calls if call.name == name]

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/fn/{name}", self.handle)


@pytest.fixture
def host():
    with FunctionHost() as h:
        yield h


@pytest.fixture
def serve(tmp_path, host):
    started = []

    def start(*extra: str, config: str | None = None, env: dict | None = None,
              client_tls=None) -> "Api":
        """`client_tls`: an ssl.SSLContext to reach an HTTP front serving TLS with."""
        path = tmp_path / "zstalk.toml"
        path.write_text(config or f'[functions]\nbase_url = "http://{LOOPBACK}:{host.port}/fn"\n')
        port, http_port = free_port(), free_port()
        server = ServerProcess([find_zstalk(), "serve", "-l", LOOPBACK, "-p", str(port),
                                "--counter-port", "0", "--worker-bind", "none",
                                "--config", str(path), "--http-port", str(http_port), *extra],
                               (LOOPBACK, port), name="zstalk-tasks", env=env).start()
        started.append(server)
        scheme = "https" if client_tls else "http"
        api = Api(f"{scheme}://{LOOPBACK}:{http_port}", server, client_tls)
        api.wait_listening()
        return api

    yield start
    for server in started:
        server.stop()


class Api:
    def __init__(self, base: str, server: ServerProcess, tls=None) -> None:
        self.base = base
        self.server = server
        self.tls = tls          # the ssl.SSLContext of an https:// base
        self.key: str | None = None

    def request(self, method: str, path: str, body=None, raw: bytes | None = None,
                headers: dict | None = None):
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers=headers or {})
        req.add_header("Content-Type", "application/json")
        if self.key:
            req.add_header("Authorization", f"Bearer {self.key}")
        try:
            with urllib.request.urlopen(req, timeout=10, context=self.tls) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def enqueue(self, function: str, params=None, **options) -> tuple[int, dict]:
        return self.request("POST", "/v1/tasks", {"function": function, "params": params,
                                                  "options": options})

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
    # (the 201 is made after the turn's hand-out: the dispatcher may have taken it)
    assert code == 201 and (body["status"], body.get("waitNum", 0)) in (
        ("queued", 0), ("running", 0))
    info = api.wait_status(body["uniqueId"], "success", "failed")
    assert info["status"] == "success" and info["statusCode"] == 200
    assert info["result"] == {"function": "closeOrder", "params": {"id": 1234}}
    assert info["attempt"] == 1 and info["finishedAt"].endswith("Z")
    [(name, params, headers, _)] = host.calls
    assert (name, json.loads(params)) == ("closeOrder", {"id": 1234})
    assert headers["X-Zstalk-Task-Id"] == body["uniqueId"] and headers["X-Zstalk-Attempt"] == "1"


def test_a_failing_call_is_retried_after_its_backoff(serve, host):
    api = serve()
    host.script["flaky"] = [{"status": 500}]
    started = time.monotonic()
    code, body = api.request("POST", "/v1/tasks", {
        "function": "flaky", "params": None, "options": {"attempts": 2, "backoff": 300}})
    info = api.wait_status(body["uniqueId"], "success", "failed")
    assert info["status"] == "success" and info["attempt"] == 2
    assert time.monotonic() - started >= 0.3
    assert [call.name for call in host.calls] == ["flaky", "flaky"]


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


def test_a_misspelled_function_under_base_url_any_is_logged_once_with_its_url_and_404(
        serve, host):
    api = serve(config=f'[functions]\nbase_url = "http://{LOOPBACK}:{host.port}/fn"\n'
                       'base_url_any = true\n[functions.closeOrder]\n')
    host.script["closeOrdr"] = [{"status": 404}] * 3
    started = time.monotonic()
    code, body = api.enqueue("closeOrdr", uniqueId="typo", attempts=2, backoff=50)
    assert code == 201, "any name is accepted under base_url_any"
    assert api.wait_status("typo", "failed")["statusCode"] == 404
    took = time.monotonic() - started
    assert wait_for(lambda: "function closeOrdr" in api.server.output(), WAIT_S)
    lines = [ln for ln in api.server.output().splitlines() if "function closeOrdr" in ln]
    assert " WARNING " in lines[0], lines
    assert (f"a call to http://{LOOPBACK}:{host.port}/fn/closeOrdr failed: HTTP 404 Not Found "
            "(task typo, attempt 1: retried in 0.05 s)") in lines[0]
    if took < 9.0:                      # (three calls in 10 s: one line, at the default level)
        assert len(lines) == 1, lines


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


def test_the_api_policy_opens_enqueue_without_options_and_closes_reading_results(serve,
                                                                                 host):
    api = serve("--master-key", "s3cret", config=(
        f'[functions]\nbase_url = "http://{LOOPBACK}:{host.port}/fn"\n'
        "[api]\npublic_enqueue = true\nprivate_results = true\n"))
    code, body = api.request("POST", "/v1/tasks", {"function": "f", "params": {"n": 1}})
    assert code == 201
    code, refused = api.request("POST", "/v1/tasks", {"function": "f", "options": {"delay": 5}})
    assert code == 401 and "no option" in refused["message"]
    code, batch = api.request("POST", "/v1/tasks", [{"function": "f"},
                                                    {"function": "f", "options": {"attempts": 3}}])
    assert code == 200 and [item["status"] for item in batch] == [201, 401]
    assert api.request("GET", f"/v1/tasks/{body['uniqueId']}")[0] == 401
    api.key = "wrong"
    assert api.request("GET", f"/v1/tasks/{body['uniqueId']}")[0] == 403
    api.key = "s3cret"
    assert api.wait_status(body["uniqueId"], "success")["result"]["params"] == {"n": 1}


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


def start_split(tmp_path, host, broker_args=()) -> tuple[list, "Api", list[str]]:
    """A broker (with `broker_args`), an HTTP front and one dispatcher in their own
    processes: the processes (stop them in reverse), the API, and the command that starts
    another dispatcher."""
    path = tmp_path / "zstalk.toml"
    path.write_text(f'[functions]\nbase_url = "http://{LOOPBACK}:{host.port}/fn"\n')
    broker_port, http_port = free_port(), free_port()
    endpoint = f"tcp://{LOOPBACK}:{broker_port}"
    dispatcher = [find_zstalk(), "dispatcher", "--broker", endpoint]
    procs = [ServerProcess([find_zstalk(), "broker", "--bind", endpoint, "--config", str(path),
                            *broker_args], (LOOPBACK, broker_port), name="tasks-broker").start()]
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
    assert sorted(json.loads(call.body) for call in host.calls) == list(range(50))


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


def test_body_and_result_limits_come_from_the_config_and_change_on_sighup(serve, host,
                                                                          tmp_path):
    import signal
    base = f'[functions]\nbase_url = "http://{LOOPBACK}:{host.port}/fn"\n'
    api = serve(config=base + 'max_result = "8B"\n[api]\nmax_body = "200B"\n')
    big = {"function": "f", "params": "x" * 300}
    code, refused = api.request("POST", "/v1/tasks", big)
    assert code == 413 and "over 200 bytes" in refused["message"]
    _, small = api.request("POST", "/v1/tasks", {"function": "f"})
    failed = api.wait_status(small["uniqueId"], "success", "failed")
    assert failed["status"] == "failed" and "over the 8-byte limit" in failed["error"]
    (tmp_path / "zstalk.toml").write_text(base)         # back to the defaults: 1 MiB each
    api.server.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + WAIT_S
    while (code := api.request("POST", "/v1/tasks", big)[0]) == 413:
        assert time.monotonic() < deadline, "the new max_body never reached the front"
        time.sleep(0.05)
    _, again = api.request("POST", "/v1/tasks", {"function": "f"})
    assert code == 201 and api.wait_status(again["uniqueId"], "success", "failed")["status"] == (
        "success")


def wait_calls(host: FunctionHost, name: str, count: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while len(host.called(name)) < count:
        assert time.monotonic() < deadline, f"{name} called {host.calls}"
        time.sleep(0.02)


def serve_with_binlog(tmp_path, host, tables: str = "") -> tuple[ServerProcess, Api]:
    """`zstalk serve --config --binlog DIR -f 0` on fixed ports, so `.kill()` and `.start()`
    make a crash and a restart: every acknowledged change is on disk before it shows.
    `tables`: more of the config (functions with limits)."""
    path = tmp_path / "zstalk.toml"
    path.write_text(f'[functions]\nbase_url = "http://{LOOPBACK}:{host.port}/fn"\n'
                    f'base_url_any = true\n{tables}')
    port, http_port = free_port(), free_port()
    server = ServerProcess([find_zstalk(), "serve", "-l", LOOPBACK, "-p", str(port),
                            "--counter-port", "0", "--worker-bind", "none", "--config", str(path),
                            "--http-port", str(http_port), "--binlog", str(tmp_path / "wal"),
                            "-f", "0"], (LOOPBACK, port), name="zstalk-wal").start()
    return server, Api(f"http://{LOOPBACK}:{http_port}", server)


def test_a_slow_rate_keeps_its_last_start_across_kill_9_so_a_crash_loop_cannot_exceed_it(
        tmp_path, host):
    server, api = serve_with_binlog(tmp_path, host, '[functions.hourly]\nrate = "1/h"\n')
    try:
        api.wait_listening()
        for n in range(2):
            api.request("POST", "/v1/tasks", {"function": "hourly", "options": {
                "uniqueId": f"h{n}"}})
        api.wait_status("h0", "success")
        server.kill()
        server.start()
        api.wait_listening()
        code, stats = api.request("GET", "/v1/functions/hourly")
        assert code == 200 and stats["queued"] == 1, stats
        assert stats["waitTime"] > 3500_000, "the next start is still an hour after the first"
        time.sleep(1.0)                 # (a restarted broker with no TAT calls h1 at once)
        assert len(host.called("hourly")) == 1
        assert api.request("GET", "/v1/tasks/h1")[1]["status"] == "queued"
    finally:
        server.stop()


def test_a_broker_killed_with_kill_9_keeps_each_tasks_group_and_its_running_call_counts(
        tmp_path, host):
    server, api = serve_with_binlog(tmp_path, host, '[functions.tenants]\nconcurrency = 3\n'
                                    'group_by = "header:X-Tenant"\ngroup_concurrency = 1\n')
    try:
        api.wait_listening()
        host.held.add("tenants")
        uids = []
        for tenant in ("acme", "acme", "beta"):
            code, task = api.request("POST", "/v1/tasks", {"function": "tenants"},
                                     headers={"X-Tenant": tenant})
            assert code == 201, task
            uids.append(task["uniqueId"])
        wait_calls(host, "tenants", 2)          # acme's first and beta's: acme's second waits
        time.sleep(0.5)                         # (for its group, not the function: 2 of 3)
        assert len(host.called("tenants")) == 2
        server.kill()
        host.held.clear()
        server.start()
        api.wait_listening()
        infos = [api.request("GET", f"/v1/tasks/{uid}")[1] for uid in uids]
        assert [(i["group"], i["status"]) for i in infos] == [
            ("acme", "running"), ("acme", "queued"), ("beta", "running")]
        _, stats = api.request("GET", "/v1/functions/tenants")
        assert stats["groups"]["count"] == 2 and stats["groupConcurrency"] == 1
        time.sleep(1.0)                 # (acme's call, running when it stopped, still counts)
        assert len(host.called("tenants")) == 2
        api.wait_status(uids[1], "success")     # once that call is given up (CLAIM_S)
    finally:
        server.stop()


def test_a_broker_killed_with_kill_9_comes_back_with_its_tasks_and_results(tmp_path, host):
    server, api = serve_with_binlog(tmp_path, host)
    try:
        api.wait_listening()
        _, done = api.request("POST", "/v1/tasks", {"function": "closeOrder", "params": {"id": 7}})
        done = api.wait_status(done["uniqueId"], "success")
        api.request("POST", "/v1/tasks", {"function": "later", "options": {
            "delay": 600000, "priority": -5, "uniqueId": "later-1"}})
        later = api.request("GET", "/v1/tasks/later-1")[1]
        host.held |= {"hangA", "hangB"}
        api.request("POST", "/v1/tasks", {"function": "hangA", "options": {
            "uniqueId": "least", "backoff": 100}})
        api.request("POST", "/v1/tasks", {"function": "hangB", "options": {
            "uniqueId": "most", "deliveryMode": "atMostOnce"}})
        wait_calls(host, "hangA", 1)
        wait_calls(host, "hangB", 1)
        server.kill()
        host.held.clear()
        server.start()
        api.wait_listening()
        code, info = api.request("GET", f"/v1/tasks/{done['uniqueId']}")
        assert code == 200 and info == done
        code, again = api.request("GET", "/v1/tasks/later-1")
        # the same task, with its delay run on while the broker was down and back
        assert code == 200 and {**again, "waitTime": 0} == {**later, "waitTime": 0}
        assert 0 < again["waitTime"] <= later["waitTime"]
        least = api.wait_status("least", "success", "failed")
        assert (least["status"], least["attempt"]) == ("success", 2)
        most = api.wait_status("most", "success", "failed")
        assert most["status"] == "failed" and "atMostOnce" in most["error"]
        assert "the broker stopped during the call" in most["error"]
        assert len(host.called("hangB")) == 1
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
        host.held.add("hangC")
        api.request("POST", "/v1/tasks", {"function": "hangC", "options": {
            "uniqueId": "t", "deliveryMode": mode, "backoff": 100}})
        wait_calls(host, "hangC", 1)
        procs[2].kill()
        host.held.clear()
        procs.append(ServerProcess(dispatcher, procs[0].address, name="dispatcher-2").start())
        info = api.wait_status("t", "success", "failed")
        assert info["status"] == status and info["attempt"] == calls
        if mode == "atMostOnce":
            assert "outcome unknown" in info["error"] and "dispatcher" in info["error"]
        assert len(host.called("hangC")) == calls
    finally:
        for proc in reversed(procs):
            proc.stop()


def one_at_a_time(host: FunctionHost) -> str:
    """A config with one function, `one`, whose concurrency is 1."""
    return f'[functions.one]\nurl = "http://{LOOPBACK}:{host.port}/fn/one"\nconcurrency = 1\n'


def wall(rfc3339: str) -> float:
    return datetime.datetime.fromisoformat(rfc3339).timestamp()


def wait_gone(api: Api, uid: str) -> float:
    """When (wall clock) the task's info was first found gone."""
    deadline = time.monotonic() + WAIT_S
    while api.request("GET", f"/v1/tasks/{uid}")[0] != 404:
        assert time.monotonic() < deadline, f"task {uid} is never forgotten"
        time.sleep(0.02)
    return time.time()


def test_a_unique_id_is_taken_while_queued_running_or_kept_and_free_once_the_task_is_forgotten(
        serve, host):
    """keepResult is 1 s, so that the check just after the task finishes comes within it
    even on a loaded machine."""
    api = serve(config=one_at_a_time(host))
    host.held |= {"first", "dup"}
    api.enqueue("one", uniqueId="first")
    wait_calls(host, "one", 1)
    assert api.enqueue("one", 1, uniqueId="dup", keepResult=1000)[0] == 201

    def enqueue_again() -> int:
        return api.enqueue("one", 2, uniqueId="dup")[0]

    assert api.request("GET", "/v1/tasks/dup")[1]["status"] == "queued"
    assert enqueue_again() == 409
    host.held.discard("first")
    api.wait_status("dup", "running")
    assert enqueue_again() == 409
    host.held.discard("dup")
    finished = api.wait_status("dup", "success")
    assert enqueue_again() == 409
    assert wait_gone(api, "dup") >= wall(finished["finishedAt"]) + 1.0 - 0.01
    assert enqueue_again() == 201
    assert api.wait_status("dup", "success")["result"]["params"] == 2
    assert [json.loads(call.body) for call in host.called("one")] == [None, 1, 2]


def test_a_function_with_concurrency_one_is_called_by_priority_then_in_enqueue_order(
        serve, host):
    api = serve(config=one_at_a_time(host))
    host.held.add("first")
    api.enqueue("one", uniqueId="first")
    wait_calls(host, "one", 1)
    enqueued = [api.enqueue("one", 0, priority=5), api.enqueue("one", 1, priority=1),
                api.enqueue("one", 2),                  # default: the enqueue time in ms
                api.enqueue("one", 3, priority=3), api.enqueue("one", 4, priority=1),
                api.enqueue("one", 5, priority=-2)]
    assert [body["waitNum"] for _, body in enqueued] == [0, 0, 2, 1, 1, 0]
    for _, body in enqueued:        # (a task is handed out, if it can be, before enqueue answers)
        assert api.request("GET", f"/v1/tasks/{body['uniqueId']}")[1]["status"] == "queued"
    host.held.clear()
    for _, body in enqueued:
        api.wait_status(body["uniqueId"], "success")
    assert [json.loads(call.body) for call in host.calls] == [None, 5, 1, 4, 3, 0, 2]


def test_groups_are_called_in_turn_each_wait_num_is_its_place_and_the_function_counts_them(
        serve, host):
    api = serve(config=one_at_a_time(host))
    host.held.add("first")
    api.enqueue("one", uniqueId="first")
    wait_calls(host, "one", 1)
    enqueued = [api.enqueue("one", f"big-{i}", group="big") for i in range(4)]
    enqueued += [api.enqueue("one", f"small-{i}", group="small") for i in range(2)]
    assert [body["waitNum"] for _, body in enqueued] == [0, 1, 2, 3, 1, 3]
    _, info = api.request("GET", f"/v1/tasks/{enqueued[4][1]['uniqueId']}")
    assert (info["group"], info["waitNum"]) == ("small", 1)
    _, stats = api.request("GET", "/v1/functions/one")
    assert stats["groups"] == {"count": 2, "busiest": [
        {"group": "big", "queued": 4, "running": 0},
        {"group": "small", "queued": 2, "running": 0}]}
    host.held.clear()
    for _, body in enqueued:
        api.wait_status(body["uniqueId"], "success")
    assert [json.loads(call.body) for call in host.calls[1:]] == [
        "big-0", "small-0", "big-1", "small-1", "big-2", "big-3"]


def test_a_task_of_a_group_beyond_max_groups_is_a_429_too_many_groups(serve, host):
    api = serve(config=one_at_a_time(host) + "max_groups = 1\n")
    host.held.add("one")
    assert api.enqueue("one", group="acme")[0] == 201
    code, body = api.enqueue("one", group="globex")
    assert (code, body["error"]) == (429, "too_many_groups"), body
    assert api.enqueue("one", group="acme")[0] == 201 and api.enqueue("one")[0] == 201
    host.held.clear()


def test_with_group_by_client_a_task_is_in_its_client_address_group_unless_it_names_one(
        serve, host):
    api = serve(config=one_at_a_time(host) + 'group_by = "client"\n')
    host.held.add("one")
    _, plain = api.enqueue("one")
    _, named = api.enqueue("one", group="acme")
    assert api.request("GET", f"/v1/tasks/{plain['uniqueId']}")[1]["group"] == LOOPBACK
    assert api.request("GET", f"/v1/tasks/{named['uniqueId']}")[1]["group"] == "acme"
    host.held.clear()


def test_with_group_by_a_header_a_task_is_in_the_group_its_gateway_named_and_a_bad_one_is_a_400(
        serve, host):
    api = serve("--master-key", "k", config=one_at_a_time(host) + 'group_by = "header:X-Tenant"\n'
                '[api]\npublic_enqueue = true\n')
    host.held.add("one")
    one = {"function": "one", "params": 1}

    def enqueue(body, **headers) -> dict:
        code, answer = api.request("POST", "/v1/tasks", body, headers=headers)
        assert code in (200, 201), answer
        return answer

    tenant = enqueue(one, **{"X-Tenant": "acme"})           # without the key
    nobody = enqueue(one)
    several = enqueue([one, one], **{"x-tenant": "globex"})
    api.key = "k"
    chosen = enqueue({**one, "options": {"group": "beta"}}, **{"X-Tenant": "acme"})
    code, refused = api.request("POST", "/v1/tasks", one, headers={"X-Tenant": "acme corp"})
    assert (code, refused["error"]) == (400, "bad_request") and "X-Tenant" in refused["message"]
    groups = [api.request("GET", f"/v1/tasks/{t['uniqueId']}")[1].get("group")
              for t in (tenant, nobody, *several, chosen)]
    assert groups == ["acme", None, "globex", "globex", "beta"]
    host.held.clear()


def test_a_call_answered_after_its_timeout_is_made_again_at_least_once_or_fails_at_most_once(
        serve, host):
    # (a call with no answer within its timeout counts against its host, which then waits
    # fail_timeout for its probe: docs/tasks.md#when-a-functions-host-is-down)
    api = serve(config=f'[functions]\nbase_url = "http://{LOOPBACK}:{host.port}/fn"\n'
                       'fail_timeout = "1s"\n')
    for name in ("slowLeast", "slowMost"):
        host.script[name] = [{"sleep": 1.5, "text": "too late"}]     # then answers at once
    api.enqueue("slowLeast", uniqueId="least", timeout=300, backoff=100)
    api.enqueue("slowMost", uniqueId="most", timeout=300, deliveryMode="atMostOnce")
    least = api.wait_status("least", "success", "failed")
    assert (least["status"], least["attempt"]) == ("success", 2)
    assert least["result"]["function"] == "slowLeast"
    assert len(host.called("slowLeast")) == 2
    most = api.wait_status("most", "success", "failed")
    assert most["status"] == "failed" and "statusCode" not in most
    assert "outcome unknown" in most["error"] and "300 ms" in most["error"]
    assert len(host.called("slowMost")) == 1


def test_a_delayed_task_is_called_once_its_delay_has_passed_and_not_before(serve, host):
    api = serve()
    sent = time.monotonic()
    assert api.enqueue("later", uniqueId="later", delay=1000)[0] == 201
    api.wait_status("later", "success")
    [call] = host.called("later")
    assert call.at - sent >= 1.0


def test_attempts_count_the_retries_and_a_failed_task_keeps_its_last_error(serve, host):
    api = serve()
    host.script["once"] = [{"status": 500, "reason": "failure 1"}]
    host.script["thrice"] = [{"status": 500, "reason": f"failure {n}"} for n in (1, 2, 3)]
    api.enqueue("once", uniqueId="once", attempts=0, backoff=0)
    api.enqueue("thrice", uniqueId="thrice", attempts=2, backoff=50)
    once = api.wait_status("once", "success", "failed")
    assert (once["status"], once["attempt"], once["attempts"]) == ("failed", 1, 0)
    assert len(host.called("once")) == 1
    thrice = api.wait_status("thrice", "success", "failed")
    assert (thrice["status"], thrice["attempt"], thrice["statusCode"], thrice["error"]) == (
        "failed", 3, 500, "HTTP 500 failure 3")
    assert [call.headers["X-Zstalk-Attempt"] for call in host.called("thrice")] == ["1", "2", "3"]


def test_exponential_backoff_doubles_each_wait_and_retry_after_waits_at_least_as_asked(
        serve, host):
    api = serve()
    host.script["doubling"] = [{"status": 500}, {"status": 500}]
    host.script["busy"] = [{"status": 429, "headers": {"Retry-After": "1"}}]
    api.enqueue("doubling", uniqueId="doubling", attempts=2,
                backoff={"type": "exponential", "delay": 300, "maxDelay": 60000})
    api.enqueue("busy", uniqueId="busy", backoff=0, attempts=0)
    wait_calls(host, "busy", 1)
    # a 429 puts the task back in its place, no call spent, and pauses its function
    waiting = api.wait_status("busy", "queued")
    assert waiting["calls"] == 0 and "retryAt" not in waiting
    code, stats = api.request("GET", "/v1/functions/busy")
    assert code == 200 and "429" in stats["pauseReason"], stats
    assert wall(stats["pausedUntil"]) - wall(waiting["createdAt"]) >= 1.0 - 0.002
    busy = api.wait_status("busy", "success", "failed")
    assert (busy["status"], busy["attempt"]) == ("success", 1), "no retry was needed"
    first, second = (call.at for call in host.called("busy"))
    assert second - first >= 1.0
    doubling = api.wait_status("doubling", "success", "failed")
    assert (doubling["status"], doubling["attempt"]) == ("success", 3)
    first, second, third = (call.at for call in host.called("doubling"))
    assert second - first >= 0.3 and third - second >= 0.6


def test_calls_are_signed_with_the_serve_process_key_over_their_task_id_and_body(serve, host):
    key = "shared by zstalk serve and the function host"
    env = {k: v for k, v in os.environ.items() if k != signing.ENV_KEY_FILE}
    api = serve(env={**env, signing.ENV_KEY: key})
    api.enqueue("signed", {"id": 1}, uniqueId="signed-1")
    api.wait_status("signed-1", "success")
    [call] = host.called("signed")
    header, now = call.headers[signing.HEADER], time.time()
    assert signing.verify(key.encode(), header, "signed-1", call.body, now) is None
    assert signing.verify(key.encode(), header, "signed-1", b'{"id":2}', now) == \
        signing.BAD_SIGNATURE
    assert signing.verify(key.encode(), header, "signed-2", call.body, now) == \
        signing.BAD_SIGNATURE


def test_a_json_result_reads_back_as_json_and_any_other_body_as_its_text(serve, host):
    api = serve()
    host.script["json"] = [{"text": '[1, "two", null]', "content_type": "application/json"}]
    host.script["text"] = [{"text": "closed order 7"}]
    for name in ("json", "text"):
        api.enqueue(name, uniqueId=name)
    assert api.wait_status("json", "success")["result"] == [1, "two", None]
    assert api.wait_status("text", "success")["result"] == "closed order 7"


def test_a_call_running_while_the_broker_restarts_is_reported_once_by_its_dispatcher(
        tmp_path, host):
    """A rolling update of the broker: its dispatcher, in its own process, keeps the call,
    claims it from the restarted broker and reports it; nothing is called twice, and
    atMostOnce does not fail a call that succeeded."""
    from zstalk.broker.core.tasks.store import CLAIM_S
    procs, api, _ = start_split(tmp_path, host, ["--binlog", str(tmp_path / "wal"), "-f", "0"])
    try:
        host.held.add("longCall")
        code, _ = api.request("POST", "/v1/tasks", {"function": "longCall", "options": {
            "uniqueId": "t", "deliveryMode": "atMostOnce", "timeout": 60000}})
        assert code == 201
        wait_calls(host, "longCall", 1)
        procs[0].kill()
        procs[0].start()                # the same endpoint and binlog
        time.sleep(CLAIM_S + 1)         # past the wait for a claim: its claim kept it
        host.held.clear()
        info = api.wait_status("t", "success", "failed")
        assert (info["status"], info["attempt"]) == ("success", 1), info
        assert len(host.called("longCall")) == 1
    finally:
        for proc in reversed(procs):
            proc.stop()


def test_an_https_function_is_called_only_with_a_certificate_the_dispatcher_trusts(
        serve, tmp_path):
    """Certificates are verified against the system's store; SSL_CERT_FILE names another
    (here a test CA that signed the function host's certificate for 127.0.0.1)."""
    import ssl
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(LOOPBACK).configure_cert(context)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    with FunctionHost(context) as tls_host:
        config = f'[functions]\nbase_url = "https://{LOOPBACK}:{tls_host.port}/fn"\n'
        untrusting = serve(config=config)
        _, body = untrusting.request("POST", "/v1/tasks", {"function": "f", "options": {
            "attempts": 0}})
        # the request never left: its task waits in its place for the host (or its
        # certificate) to be right, spending no attempt
        assert wait_for(lambda: "certificate" in untrusting.request(
            "GET", f"/v1/tasks/{body['uniqueId']}")[1].get("error", "").lower(), WAIT_S)
        info = untrusting.request("GET", f"/v1/tasks/{body['uniqueId']}")[1]
        assert (info["status"], info["calls"]) == ("queued", 0), info
        assert tls_host.calls == []
        trusting = serve(config=config, env={**os.environ, "SSL_CERT_FILE": str(ca_file)})
        _, body = trusting.request("POST", "/v1/tasks", {"function": "f", "params": [1]})
        info = trusting.wait_status(body["uniqueId"], "success", "failed")
        assert info["status"] == "success" and info["result"]["params"] == [1]
