"""The operator's commands end to end: `zstalk serve --config` as a real process with a master
key (and a binlog where a restart is the point), a function host run by the test, and the
real `zstalk tasks | functions | schedules` commands run against it, their tables, their
--json and their exit codes read as a script would."""
from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from servers import LOOPBACK, ServerProcess, find_zstalk, free_port, self_check
from test_tasks_end_to_end import Api, FunctionHost

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")
KEY = "operator-test-key"
WAIT_S = 15.0


@pytest.fixture
def host():
    with FunctionHost() as h:
        yield h


@pytest.fixture
def server(tmp_path, host):
    """A started `zstalk serve` with a master key and a binlog (`.restart()` keeps it)."""
    config = tmp_path / "zstalk.toml"
    config.write_text(f'[functions]\nbase_url = "http://{LOOPBACK}:{host.port}/fn"\n')
    port, http_port = free_port(), free_port()
    process = ServerProcess([find_zstalk(), "serve", "-l", LOOPBACK, "-p", str(port),
                             "--counter-port", "0", "--worker-bind", "none", "-b",
                             str(tmp_path / "wal"), "--config", str(config), "--http-port",
                             str(http_port), "--master-key", KEY],
                            (LOOPBACK, port), name="zstalk-operator").start()
    api = Api(f"http://{LOOPBACK}:{http_port}", process)
    api.key = KEY
    api.wait_listening()
    yield api
    process.stop()


def zstalk(api: Api | None, *args: str, key: str | None = KEY,
           env: dict | None = None) -> subprocess.CompletedProcess:
    """A `zstalk` command against the server's API (`key` in ZSTALK_MASTER_KEY)."""
    environ = {"PATH": "/usr/bin:/bin", **(env or {})}
    if api is not None:
        environ["ZSTALK_URL"] = api.base
    if key is not None:
        environ["ZSTALK_MASTER_KEY"] = key
    return subprocess.run([find_zstalk(), *args], capture_output=True, text=True, timeout=60,
                          env=environ, stdin=subprocess.DEVNULL)


def json_of(*args, **kw):
    done = zstalk(*args, "--json", **kw)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def failed_task(api: Api, host: FunctionHost) -> str:
    """A task whose one attempt failed (its function answered 500)."""
    host.script["flaky"] = [{"status": 500, "text": "down"}]
    code, task = api.enqueue("flaky", {"n": 1}, attempts=0)
    assert code == 201, task
    api.wait_status(task["uniqueId"], "failed")
    return task["uniqueId"]


def test_tasks_list_shows_a_table_and_the_apis_json(server, host):
    uid = failed_task(server, host)
    done = zstalk(server, "tasks", "list", "--function", "flaky")
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.splitlines()
    assert header.split()[:5] == ["UNIQUE", "ID", "FUNCTION", "STATUS", "ATTEMPT"]
    assert row.split()[:4] == [uid, "flaky", "failed", "1"]
    doc = json_of(server, "tasks", "list", "--status", "failed", "--limit", "5")
    assert [t["uniqueId"] for t in doc["tasks"]] == [uid] and doc["next"] is None


def test_a_retried_task_runs_again_from_its_first_attempt(server, host):
    uid = failed_task(server, host)
    info = json_of(server, "tasks", "get", uid)
    assert (info["status"], info["attempt"], info["statusCode"]) == ("failed", 1, 500)
    done = zstalk(server, "tasks", "retry", uid)
    assert done.returncode == 0, done.stderr
    assert any(line.split()[:2] == ["uniqueId", uid] for line in done.stdout.splitlines())
    info = server.wait_status(uid, "success")       # (the host answers 200 this time)
    assert info["attempt"] == 1 and "error" not in info
    assert len(host.called("flaky")) == 2


def test_retrying_a_task_that_did_not_fail_is_refused_with_the_apis_code(server, host):
    code, task = server.enqueue("later", delay=3_600_000)
    done = zstalk(server, "tasks", "retry", task["uniqueId"])
    assert done.returncode == 1 and done.stderr.startswith("zstalk: 409 not_retryable: "), \
        done.stderr
    cancelled = json_of(server, "tasks", "cancel", task["uniqueId"])
    assert cancelled["status"] == "cancelled"
    # (due now: a retry runs it at once, its delay long spent or not)
    assert json_of(server, "tasks", "retry", task["uniqueId"])["status"] in ("queued", "running")
    server.wait_status(task["uniqueId"], "success")


def test_an_action_without_the_master_key_is_refused_and_a_wrong_one_too(server, tmp_path):
    done = zstalk(server, "functions", "pause", "f", key=None)
    assert (done.returncode, done.stderr.split()[:3]) == (1, ["zstalk:", "401", "unauthorized:"])
    wrong = tmp_path / "wrong.key"
    wrong.write_text("not-the-key\n")
    done = zstalk(server, "tasks", "list", "--master-key-file", str(wrong), key=None)
    assert (done.returncode, done.stderr.split()[:3]) == (1, ["zstalk:", "403", "forbidden:"])
    right = tmp_path / "right.key"
    right.write_text(KEY + "\n")
    assert zstalk(server, "tasks", "list", "--master-key-file", str(right),
                  key=None).returncode == 0


def test_functions_list_and_show_have_a_table_and_json(server, host):
    server.enqueue("f", {"n": 1})
    done = zstalk(server, "functions", "list")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:3] == ["NAME", "PAUSED", "QUEUED"]
    assert any(line.split()[:2] == ["f", "no"] for line in lines[1:])
    assert [f["name"] for f in json_of(server, "functions", "list")] == ["f"]
    shown = zstalk(server, "functions", "show", "f")
    assert "paused" in shown.stdout and shown.returncode == 0
    assert json_of(server, "functions", "show", "f")["paused"] is False
    missing = zstalk(server, "tasks", "get", "nosuch")
    assert (missing.returncode, missing.stderr.split()[:3]) == (1, ["zstalk:", "404", "not_found:"])


def test_a_paused_function_hands_nothing_out_and_stays_paused_across_a_restart(server, host):
    assert json_of(server, "functions", "pause", "slow")["paused"] is True
    code, task = server.enqueue("slow", {"n": 1})
    assert code == 201
    time.sleep(1.0)                                 # (it would have been called by now)
    assert host.called("slow") == []
    server.server.stop()
    server.server.start()
    server.wait_listening()
    assert json_of(server, "functions", "show", "slow")["paused"] is True
    time.sleep(1.0)
    assert host.called("slow") == [], "the restart kept the pause"
    assert json_of(server, "functions", "resume", "slow")["paused"] is False
    assert server.wait_status(task["uniqueId"], "success")["status"] == "success"


def test_schedules_list_show_pause_and_resume(server, host):
    code, made = server.request("POST", "/v1/schedules", {
        "name": "nightly", "cron": "0 0 3 * * ?", "function": "f", "params": {"n": 1}})
    assert code == 201, made
    done = zstalk(server, "schedules", "list")
    header, row = done.stdout.splitlines()
    assert header.split()[:2] == ["NAME", "CRON"] and row.split()[:7] == [
        "nightly", "0", "0", "3", "*", "*", "?"]
    assert [s["name"] for s in json_of(server, "schedules", "list")] == ["nightly"]
    assert json_of(server, "schedules", "pause", "nightly")["paused"] is True
    shown = zstalk(server, "schedules", "show", "nightly").stdout.splitlines()
    assert "paused     yes" in shown and not any(s.startswith("nextFireAt") for s in shown)
    assert json_of(server, "schedules", "resume", "nightly")["nextFireAt"].endswith("T03:00:00.000Z")
    assert zstalk(server, "schedules", "show", "other").returncode == 1


def test_an_api_out_of_reach_exits_3_naming_its_address_and_port():
    port = free_port()
    done = zstalk(None, "tasks", "list", "--url", f"http://{LOOPBACK}:{port}")
    assert done.returncode == 3
    assert f"{LOOPBACK}:{port}" in done.stderr and "cannot reach the HTTP API" in done.stderr


def test_a_url_that_is_not_http_is_a_usage_error():
    done = zstalk(None, "functions", "list", "--url", "ftp://example.org")
    assert done.returncode == 2 and "--url" in done.stderr


def test_an_empty_id_or_name_from_an_unset_variable_is_a_usage_error_not_another_route():
    for argv in (("tasks", "retry", ""), ("functions", "pause", ""), ("schedules", "show", "")):
        done = zstalk(None, *argv)
        assert done.returncode == 2 and "is empty" in done.stderr, (argv, done.stderr)


# -- the operations page's example (docs/operations/operator.md), as written -------------------
ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "operations" / "operator.md"


def page_block(marker: str) -> str:
    """The sh block of the operations page holding `marker` (test_readme.py's RUN_BY says
    this file runs it)."""
    [found] = [m[1] for m in re.finditer(r"```sh\n(.*?)\n```", PAGE.read_text(), re.S)
               if marker in m[1]]
    return found


def run_block(api: Api, marker: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The page's block holding `marker`, run by bash (stopping at its first failure) with
    zstalk on the PATH and the server's API and key in the environment."""
    return subprocess.run(["bash", "-c", "set -eo pipefail\n" + page_block(marker)],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={"PATH": f"{Path(find_zstalk()).parent}:/usr/bin:/bin",
                               "ZSTALK_URL": api.base, "ZSTALK_MASTER_KEY": KEY, **(env or {})})


def test_the_operations_pages_example_runs_as_written(server, host):
    host.script["resize"] = [{"status": 500, "text": "down"}]
    code, failed = server.enqueue("resize", {"n": 1}, attempts=0)
    assert code == 201
    server.wait_status(failed["uniqueId"], "failed")
    code, later = server.enqueue("thumbnail", {"n": 2}, delay=3_600_000)
    assert code == 201
    code, _ = server.request("POST", "/v1/schedules", {
        "name": "nightly-report", "cron": "0 0 2 * * ?", "function": "report"})
    assert code == 201
    done = run_block(server, "zstalk functions pause resize")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resize" in done.stdout and "nightly-report" in done.stdout
    assert server.wait_status(failed["uniqueId"], "success")["attempt"] == 1
    assert server.request("GET", f"/v1/tasks/{later['uniqueId']}")[1]["status"] == "cancelled"
    assert server.request("GET", "/v1/functions/resize")[1]["paused"] is False
    assert server.request("GET", "/v1/schedules/nightly-report")[1]["paused"] is False
