# Every role says on start, in one line of one format, what it listens on or connects to:
# `zstalk <role> <version>: ...` (`zstalkd <version>: ...` with -V; silent without, as
# beanstalkd), every port it listens on (its health port too) and its binlog directory
# with what the binlog's replay restored. Real processes on loopback ports; each is
# stopped once it has spoken.
from __future__ import annotations

import os
import re
import subprocess
import threading
from pathlib import Path

import pytest

from servers import LOOPBACK, RawClient, find_zstalk, free_port, self_check, wait_for
from zstalk.broker import VERSION

pytestmark = pytest.mark.skipif(self_check(), reason="tests zstalk's own programs")
ZSTALK = find_zstalk()
ZSTALKD = str(Path(ZSTALK).parent / "zstalkd")
ROOT = Path(__file__).resolve().parents[2]


#: how many event streams an HTTP front holds (its open-files limit raised: the number
#: depends on this machine's hard limit)
STREAMS = (r"up to [\d,]+ event streams \(open files [\d,]+"
           r"(, fewer than --http-max-streams 10,000)?\)")


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
    line = first_line(ZSTALK, "serve", "-l", LOOPBACK, "-p", str(port), "--counter-port", "0",
                      "--worker-bind", "none", "--http-port", str(http))
    assert re.fullmatch(re.escape(
        f"zstalk serve {VERSION}: beanstalk on {LOOPBACK}:{port}; http on 127.0.0.1:{http} "
        "(no --master-key: loopback only; no --config: no functions, every task answers 404); "
        f"dashboard at http://127.0.0.1:{http}/ui/; ") + STREAMS + "; no worker endpoint",
        line), line


def test_zstalkd_is_silent_as_beanstalkd_and_says_where_it_listens_with_v():
    port = free_port()
    said = f"zstalkd {VERSION}: beanstalk on {LOOPBACK}:{port}; no worker endpoint"
    proc = subprocess.Popen([ZSTALKD, "-V", "-l", LOOPBACK, "-p", str(port)],
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []       # (-V: INFO lines come too, often in the same read)
    reader = threading.Thread(target=lambda: [lines.append(line.rstrip("\n"))
                                              for line in proc.stderr], daemon=True)
    reader.start()
    try:
        assert wait_for(lambda: said in lines, 10), lines
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


def health(port: int) -> tuple[str, ...]:
    return ("--health-port", str(port), "--health-listen", LOOPBACK)


def test_the_broker_says_its_health_port_and_its_binlog_with_what_it_restored(tmp_path):
    endpoint, port = f"tcp://{LOOPBACK}:{free_port()}", free_port()
    assert first_line(ZSTALK, "broker", "--bind", endpoint, "-b", str(tmp_path),
                      *health(port)) == (
        f"zstalk broker {VERSION}: listening on {endpoint}; health on {LOOPBACK}:{port}; "
        f"binlog {tmp_path} (restored 0 jobs, 0 tasks)")


def checked_config(tmp_path: Path) -> Path:
    """150 servers checked every second: more than 100 probes a second."""
    servers = ", ".join(f'{{ url = "http://10.0.0.{i}:8000" }}' for i in range(1, 151))
    path = tmp_path / "zstalk.toml"
    path.write_text(f'[upstreams.gpu]\nservers = [{servers}]\n'
                    f'health_check = {{ path = "/health", interval = "1s" }}\n'
                    f'[functions.gen]\nupstream = "gpu"\n')
    return path


CHECKS_SAID = ("health checks: 150 servers of 1 upstream, each probed by one dispatcher, "
               "at most 100 probes/s (the configs ask 150/s: every interval is stretched "
               "1.50 times)")


def test_the_broker_and_serve_say_the_bound_on_health_probes_and_the_stretch(tmp_path):
    config, endpoint = checked_config(tmp_path), f"tcp://{LOOPBACK}:{free_port()}"
    assert first_line(ZSTALK, "broker", "--bind", endpoint, "--config", str(config)) == (
        f"zstalk broker {VERSION}: listening on {endpoint}; {CHECKS_SAID}; config {config}")
    line = first_line(ZSTALK, "serve", "-l", LOOPBACK, "-p", str(free_port()),
                      "--counter-port", "0", "--worker-bind", "none", "--http-port",
                      str(free_port()), "--config", str(config))
    assert line.startswith(f"zstalk serve {VERSION}: ") and line.endswith(CHECKS_SAID), line


@pytest.mark.parametrize("kind", ["beanstalk", "counter", "http"])
def test_a_front_says_where_it_listens_and_which_broker_it_reaches(kind):
    port, broker = free_port(), f"tcp://{LOOPBACK}:{free_port()}"
    line = first_line(ZSTALK, "front", kind, "--broker", broker, "--listen",
                      f"{LOOPBACK}:{port}")
    listens = {"http": re.escape(f"http on {LOOPBACK}:{port} (no --master-key: loopback "
                                 f"only); dashboard at http://{LOOPBACK}:{port}/ui/; ")
               + STREAMS}.get(
        kind, re.escape(f"listening on {LOOPBACK}:{port}"))
    assert re.fullmatch(re.escape(f"zstalk front {kind} {VERSION}: ") + listens
                        + re.escape(f"; broker {broker}"), line), line


@pytest.mark.parametrize("kind", ["beanstalk", "counter", "http"])
def test_a_front_with_a_health_port_says_it_too(kind):
    port, broker, probes = free_port(), f"tcp://{LOOPBACK}:{free_port()}", free_port()
    line = first_line(ZSTALK, "front", kind, "--broker", broker, "--listen",
                      f"{LOOPBACK}:{port}", *health(probes))
    assert line.endswith(f"; broker {broker}; health on {LOOPBACK}:{probes}"), line


def test_the_dispatcher_says_which_broker_it_connects_to_and_its_health_port():
    broker, probes = f"tcp://{LOOPBACK}:{free_port()}", free_port()
    assert first_line(ZSTALK, "dispatcher", "--broker", broker, "--slots", "3") == (
        f"zstalk dispatcher {VERSION}: connecting to {broker}; 3 calls at once")
    assert first_line(ZSTALK, "dispatcher", "--broker", broker, "--slots", "3",
                      *health(probes)) == (
        f"zstalk dispatcher {VERSION}: connecting to {broker}; 3 calls at once; "
        f"health on {LOOPBACK}:{probes}")


def test_a_worker_pool_says_which_broker_it_connects_to_what_it_runs_and_its_health_port():
    broker, probes = f"tcp://{LOOPBACK}:{free_port()}", free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    assert first_line(ZSTALK, "worker", "tests.support.workers_app:shared", "--broker", broker,
                      "--processes", "2", *health(probes), env=env) == (
        f"zstalk worker {VERSION}: connecting to {broker}; tests.support.workers_app:shared, "
        f"2 processes of 1 handlers; health on {LOOPBACK}:{probes}")


def test_serve_says_its_health_port_and_binlog_and_after_a_restart_the_jobs_it_restored(
        tmp_path):
    port, probes, wal = free_port(), free_port(), str(tmp_path / "wal")
    argv = [ZSTALK, "serve", "-l", LOOPBACK, "-p", str(port), "--counter-port", "0",
            "--worker-bind", "none", "-b", wal, *health(probes)]
    said = (f"zstalk serve {VERSION}: beanstalk on {LOOPBACK}:{port}; no worker endpoint; "
            f"health on {LOOPBACK}:{probes}; binlog {wal}")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr.readline() == f"{said} (restored 0 jobs, 0 tasks)\n"
        with RawClient((LOOPBACK, port)) as client:
            client.send(b"put 0 0 60 1\r\na\r\nput 0 0 60 1\r\nb\r\n")
            assert client.read_replies(2) == [b"INSERTED 1\r\n", b"INSERTED 2\r\n"]
    finally:
        proc.terminate()
        proc.communicate(timeout=20)
    assert first_line(*argv) == f"{said} (restored 2 jobs, 0 tasks)"
    # supervised (--fronts 1), the broker child replays it and tells its supervisor
    line = first_line(*argv, "--fronts", "1")
    assert re.fullmatch(rf"zstalk serve {re.escape(VERSION)}: beanstalk on {LOOPBACK}:{port}; "
                        rf"no worker endpoint; health on {LOOPBACK}:{probes} \(children's on "
                        rf"127\.0\.0\.1: broker \d+, front-0 \d+\); binlog {re.escape(wal)} "
                        rf"\(restored 2 jobs, 0 tasks\)", line), line


def test_zstalkd_with_v_says_its_binlog_and_what_it_restored(tmp_path):
    port = free_port()
    proc = subprocess.Popen([ZSTALKD, "-V", "-l", LOOPBACK, "-p", str(port), "-b", str(tmp_path)],
                            stderr=subprocess.PIPE, text=True)
    try:                                                      # (-V: INFO lines come too)
        line = next(line for line in proc.stderr if line.startswith("zstalkd "))
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    assert line == (f"zstalkd {VERSION}: beanstalk on {LOOPBACK}:{port}; no worker endpoint; "
                    f"binlog {tmp_path} (restored 0 jobs, 0 tasks)\n")


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



def test_the_dashboards_address_on_every_address_is_the_one_a_browser_here_opens():
    from types import SimpleNamespace

    from zstalk.broker.run.options import dashboard_at
    on = lambda *addr: SimpleNamespace(getsockname=lambda: addr)  # noqa: E731 (a socket's face)
    assert dashboard_at(on("0.0.0.0", 8080), False) == "dashboard at http://127.0.0.1:8080/ui/"
    assert dashboard_at(on("::", 8443, 0, 0), True) == "dashboard at https://[::1]:8443/ui/"
    assert dashboard_at(on("10.0.0.7", 80), False) == "dashboard at http://10.0.0.7:80/ui/"
