"""Cloud tasks under the supervisor: `zstalk serve --fronts 1 --config` as a real process
tree (broker, beanstalk front, HTTP front and dispatcher children), a function host run by
the test (aiohttp on loopback), and plain HTTP requests from the test."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from servers import LOOPBACK, children_of, find_zstalk, free_port, self_check
from test_tasks_end_to_end import WAIT_S, Api, host, serve  # noqa: F401 (fixtures)

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")


@pytest.fixture
def supervised(serve):
    """`zstalk serve --fronts 1 --config` on loopback: its Api (`.server`: the supervisor)."""
    return lambda *extra, **kw: serve("--fronts", "1", *extra, **kw)


def child(supervisor: int, *words: str) -> int | None:
    """The pid of the supervisor's child whose command line has `words` in a row."""
    for pid in children_of(supervisor):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except FileNotFoundError:       # it has just exited
            continue
        if any(argv[i:i + len(words)] == list(words) for i in range(len(argv))):
            return pid
    return None


def wait_until(predicate, what: str):
    deadline = time.monotonic() + WAIT_S
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.05)
    return found


def enqueue_and_finish(api: Api, function: str, params) -> dict:
    code, body = api.request("POST", "/v1/tasks", {"function": function, "params": params})
    assert code == 201, body
    return api.wait_status(body["uniqueId"], "success", "failed")


def test_serve_with_fronts_runs_a_task_through_its_http_front_and_dispatcher_children(
        supervised, host):
    api = supervised()
    supervisor = api.server.pid
    assert child(supervisor, "front", "http") and child(supervisor, "dispatcher")
    info = enqueue_and_finish(api, "closeOrder", {"id": 1234})
    assert info["status"] == "success" and info["result"]["params"] == {"id": 1234}
    assert [call[:2] for call in host.calls] == [("closeOrder", b'{"id":1234}')]
    line = wait_until(lambda: next((l for l in api.server.output().splitlines()
                                    if "http on" in l), None), "the announcement")
    assert api.base.removeprefix("http://") in line and "loopback only" in line


def test_sighup_to_the_supervisor_makes_the_broker_child_read_the_config_again(
        supervised, host, tmp_path):
    only_f = f'[functions.f]\nurl = "http://{LOOPBACK}:{host.port}/fn/f"\n'
    api = supervised(config=only_f)
    assert api.request("POST", "/v1/tasks", {"function": "g"})[0] == 404
    (tmp_path / "zstalk.toml").write_text(
        only_f + f'[functions.g]\nurl = "http://{LOOPBACK}:{host.port}/fn/g"\n')
    api.server.process.send_signal(signal.SIGHUP)
    wait_until(lambda: api.request("GET", "/v1/functions/g")[0] == 200, "the broker's reload")
    assert enqueue_and_finish(api, "g", [1])["status"] == "success"
    assert api.server.running


def test_the_http_front_child_is_started_again_after_kill_9_and_the_api_answers_again(
        supervised, host):
    api = supervised()
    supervisor = api.server.pid
    killed = child(supervisor, "front", "http")
    assert killed
    os.kill(killed, signal.SIGKILL)
    wait_until(lambda: child(supervisor, "front", "http") not in (None, killed),
               "a new HTTP front")
    api.wait_listening()
    assert enqueue_and_finish(api, "again", "after kill -9")["status"] == "success"


def test_the_master_key_reaches_only_the_http_front_and_never_its_command_line(
        supervised, host):
    api = supervised("--master-key", "s3cret")
    assert api.request("POST", "/v1/tasks", {"function": "f"})[0] == 401
    api.key = "s3cret"
    assert enqueue_and_finish(api, "keyed", None)["status"] == "success"
    supervisor = api.server.pid
    front = child(supervisor, "front", "http")
    assert front and b"s3cret" not in Path(f"/proc/{front}/cmdline").read_bytes()
    assert b"ZSTALK_MASTER_KEY=s3cret" in Path(f"/proc/{front}/environ").read_bytes()
    for other in (child(supervisor, "broker"), child(supervisor, "dispatcher")):
        assert b"s3cret" not in Path(f"/proc/{other}/environ").read_bytes()


def test_a_busy_http_port_fails_at_once_with_exit_111_naming_address_and_port(tmp_path, host):
    path = tmp_path / "zstalk.toml"
    path.write_text(f'[functions]\nbase_url = "http://{LOOPBACK}:{host.port}/fn"\n')
    with socket.socket() as busy:
        busy.bind((LOOPBACK, 0))
        busy.listen()
        http_port = busy.getsockname()[1]
        started = time.monotonic()
        out = subprocess.run([find_zstalk(), "serve", "--fronts", "1", "-l", LOOPBACK,
                              "-p", str(free_port()), "--counter-port", "0",
                              "--worker-bind", "none", "--config", str(path),
                              "--http-port", str(http_port)],
                             capture_output=True, text=True, timeout=30)
    assert out.returncode == 111, out.stderr
    assert f"{LOOPBACK}:{http_port}" in out.stderr and "Address already in use" in out.stderr
    assert "for the HTTP API (--http-port)" in out.stderr, out.stderr
    assert time.monotonic() - started < 5.0


def test_stopping_lets_a_running_call_finish_and_report_before_the_broker_stops(
        supervised, host, tmp_path):
    """The supervisor stops the dispatcher (which lets running calls finish) before the
    broker, so the report lands and is logged: nothing is left to guess after a restart."""
    wal = str(tmp_path / "wal")
    api = supervised("--binlog", wal, "-f", "0")
    host.script["slow"] = [{"sleep": 1.5, "text": "done"}]
    code, body = api.request("POST", "/v1/tasks", {"function": "slow", "options": {
        "deliveryMode": "atMostOnce"}})
    assert code == 201
    wait_until(lambda: host.called("slow"), "the call")
    api.server.process.send_signal(signal.SIGTERM)
    assert api.server.process.wait(20) == 0
    again = supervised("--binlog", wal, "-f", "0")
    code, info = again.request("GET", f"/v1/tasks/{body['uniqueId']}")
    assert (code, info["status"], info["result"]) == (200, "success", "done")


def test_a_sighup_while_the_broker_child_restarts_does_not_kill_it(supervised, host):
    api = supervised()
    supervisor = api.server.pid
    broker = child(supervisor, "broker")
    os.kill(broker, signal.SIGKILL)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:      # SIGHUPs all through the restart
        os.kill(supervisor, signal.SIGHUP)
        time.sleep(0.01)
    assert enqueue_and_finish(api, "after", [1])["status"] == "success"
    assert api.server.output().count("broker exited") == 1, api.server.output()
