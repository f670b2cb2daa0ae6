# Every role says on start, in one line of one format, what it listens on or connects to:
# `zstalk <role> <version>: ...` (`zstalkd <version>: ...` with -V; silent without, as
# beanstalkd). Real processes on loopback ports; each is stopped once it has spoken.
from __future__ import annotations

import os
import select
import subprocess
from pathlib import Path

import pytest

from servers import LOOPBACK, find_zstalk, free_port, self_check, wait_for
from zstalk.broker import VERSION

pytestmark = pytest.mark.skipif(self_check(), reason="tests zstalk's own programs")
ZSTALK = find_zstalk()
ZSTALKD = str(Path(ZSTALK).parent / "zstalkd")
ROOT = Path(__file__).resolve().parent.parent


def first_line(*argv: str, env: dict | None = None) -> str:
    """The first line a command writes on stderr (then it is stopped)."""
    proc = subprocess.Popen(list(argv), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, env=env)
    try:
        return proc.stderr.readline().rstrip("\n")
    finally:
        proc.terminate()
        proc.wait(10)


def test_serve_says_what_listens_where_and_that_an_http_port_without_config_has_no_functions():
    port, http = free_port(), free_port()
    assert first_line(ZSTALK, "serve", "-l", LOOPBACK, "-p", str(port), "--counter-port", "0",
                      "--worker-bind", "none", "--http-port", str(http)) == (
        f"zstalk serve {VERSION}: beanstalk on {LOOPBACK}:{port}; http on 127.0.0.1:{http} "
        "(no --master-key: loopback only; no --config: no functions, every task answers 404); "
        "no worker endpoint")


def test_zstalkd_is_silent_as_beanstalkd_and_says_where_it_listens_with_v():
    port = free_port()
    said = f"zstalkd {VERSION}: beanstalk on {LOOPBACK}:{port}; no worker endpoint"
    proc = subprocess.Popen([ZSTALKD, "-V", "-l", LOOPBACK, "-p", str(port)],
                            stderr=subprocess.PIPE, text=True)
    try:                                                      # (-V: INFO lines come too)
        assert wait_for(lambda: select.select([proc.stderr], [], [], 0.5)[0]
                        and proc.stderr.readline().rstrip("\n") == said, 10)
    finally:
        proc.terminate()
        proc.wait(10)
    proc = subprocess.Popen([ZSTALKD, "-l", LOOPBACK, "-p", str(free_port())],
                            stderr=subprocess.PIPE, text=True)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.communicate(timeout=1.0)
    finally:
        proc.terminate()
        assert proc.communicate(timeout=10)[1] == ""


def test_the_broker_says_its_endpoint():
    endpoint = f"tcp://{LOOPBACK}:{free_port()}"
    assert first_line(ZSTALK, "broker", "--bind", endpoint) == (
        f"zstalk broker {VERSION}: listening on {endpoint}")


@pytest.mark.parametrize("kind", ["beanstalk", "counter", "http"])
def test_a_front_says_where_it_listens_and_which_broker_it_reaches(kind):
    port, broker = free_port(), f"tcp://{LOOPBACK}:{free_port()}"
    line = first_line(ZSTALK, "front", kind, "--broker", broker, "--listen",
                      f"{LOOPBACK}:{port}")
    listens = {"http": f"http on {LOOPBACK}:{port} (no --master-key: loopback only)"}.get(
        kind, f"listening on {LOOPBACK}:{port}")
    assert line == f"zstalk front {kind} {VERSION}: {listens}; broker {broker}"


def test_the_dispatcher_says_which_broker_it_connects_to():
    broker = f"tcp://{LOOPBACK}:{free_port()}"
    assert first_line(ZSTALK, "dispatcher", "--broker", broker, "--slots", "3") == (
        f"zstalk dispatcher {VERSION}: connecting to {broker}; 3 calls at once")


def test_a_worker_pool_says_which_broker_it_connects_to_and_what_it_runs():
    broker = f"tcp://{LOOPBACK}:{free_port()}"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    assert first_line(ZSTALK, "worker", "tests.workers_app:shared", "--broker", broker,
                      "--processes", "2", env=env) == (
        f"zstalk worker {VERSION}: connecting to {broker}; tests.workers_app:shared, "
        "2 processes of 1 handlers")


def test_the_children_of_a_supervisor_leave_the_saying_to_it():
    port = free_port()
    proc = subprocess.Popen([ZSTALK, "serve", "--fronts", "1", "-l", LOOPBACK, "-p", str(port),
                             "--counter-port", "0", "--worker-bind", "none"],
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert line.startswith(f"zstalk serve {VERSION}: beanstalk on {LOOPBACK}:{port}")
    finally:
        proc.terminate()
        rest = proc.communicate(timeout=20)[1]
    assert "zstalk broker" not in rest and "zstalk front" not in rest


def test_a_master_key_without_the_http_api_is_a_usage_error():
    done = subprocess.run([ZSTALK, "serve", "-l", LOOPBACK, "-p", str(free_port()),
                           "--counter-port", "0", "--worker-bind", "none", "--master-key", "k"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert done.stderr.endswith(
        "Error: --master-key (ZSTALK_MASTER_KEY, --master-key-file) is the HTTP API's: give "
        "--http-port, or --config with [functions]\n")

