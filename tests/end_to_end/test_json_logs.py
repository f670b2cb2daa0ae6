# `--log-format json` (and $ZSTALK_LOG_FORMAT, zstalkd's only way to it): every role's
# stderr is one JSON object a line, with the fixed fields ts, level, logger, msg, pid, then
# the record's own (`extra=`) fields, and exc with a traceback; its start line too, with
# role and version. Real processes on loopback ports: every role is started at once
# (module fixture), fronts, dispatcher and worker pool pointed at a broker that does not
# answer, so that each logs its "has not welcomed" warning after ~2 s, and then stopped.
# The JsonFormatter itself is tested on records made here.
from __future__ import annotations

import calendar
import io
import json
import logging
import math
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from servers import LOOPBACK, children_of, find_zstalk, free_port, self_check, wait_for
from zstalk.broker import VERSION
from zstalk.broker.run.logs import JsonFormatter, TEXT_FORMAT

pytestmark = pytest.mark.skipif(self_check(), reason="tests zstalk's own programs")
ZSTALK = find_zstalk()
ZSTALKD = str(Path(ZSTALK).parent / "zstalkd")
ROOT = Path(__file__).resolve().parents[2]
FIXED = ("ts", "level", "logger", "msg", "pid")
TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
LEVELS = {"debug", "info", "warning", "error", "critical"}
UNWELCOMED = "has not welcomed this process"
RECORD_ATTRIBUTES = {*logging.makeLogRecord({}).__dict__, "message", "asctime", "taskName"}


#: the environment of every process started here: text unless a test says otherwise
OUR_ENV = {name: value for name, value in os.environ.items() if name != "ZSTALK_LOG_FORMAT"}


class Role:
    """One process; stderr to a file (a chatty process never blocks on a pipe), read as
    it grows; in its own session, so that stop() reaches its children too."""

    def __init__(self, *argv: str, env: dict | None = None) -> None:
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self.err, cwd=ROOT, start_new_session=True,
                                     env=dict(OUR_ENV, PYTHONPATH=str(ROOT), **(env or {})))

    def said(self) -> str:
        self.err.seek(0)
        return self.err.read().decode()

    def wait_said(self, text: str, times: int = 1, timeout_s: float = 10.0) -> None:
        assert wait_for(lambda: self.said().count(text) >= times, timeout_s), self.said()

    def stop(self) -> str:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        said = self.said()
        self.err.close()
        return said


def records(said: str) -> list[dict]:
    """Every stderr line as a JSON object whose fixed fields come first and are well formed."""
    lines = said.splitlines()
    assert lines, "nothing said"
    found = []
    for line in lines:
        record = json.loads(line)
        assert tuple(record)[:5] == FIXED, line
        assert TS.fullmatch(record["ts"]) and record["level"] in LEVELS, line
        assert isinstance(record["pid"], int) and isinstance(record["msg"], str), line
        found.append(record)
    return found


def start_record(found: list[dict], role: str) -> dict:
    starts = [r for r in found if r["logger"] == "zstalk.start"]
    assert len(starts) == 1, found
    name = "zstalkd" if role == "zstalkd" else f"zstalk {role}"
    assert starts[0]["msg"].startswith(f"{name} {VERSION}: ")
    assert starts[0]["level"] == "info"
    assert set(starts[0]) == {*FIXED, "role", "version"}
    assert (starts[0]["role"], starts[0]["version"]) == (role, VERSION)
    return starts[0]


# -- every role, at once ---------------------------------------------------------------
def roles_to_start() -> dict[str, tuple[tuple[str, ...], dict | None, str]]:
    """role: (argv, environment, what it says last), each on its own free ports (a
    worker pool says it twice: once from each process)."""
    away = f"tcp://{LOOPBACK}:{free_port()}"      # a broker that never answers

    def listen() -> str:
        return f"{LOOPBACK}:{free_port()}"

    def front(kind: str):
        return ((ZSTALK, "front", kind, "--broker", away, "--listen", listen(),
                 "--log-format", "json"), None, UNWELCOMED)

    return {
        "serve": ((ZSTALK, "-V", "serve", "-l", LOOPBACK, "-p", str(free_port()),
                   "--counter-port", "0", "--worker-bind", "none", "--log-format", "json"),
                  None, "zstalk serve"),
        "broker": ((ZSTALK, "-V", "broker", "--bind", f"tcp://{LOOPBACK}:{free_port()}"),
                   {"ZSTALK_LOG_FORMAT": "json"}, "zstalk broker"),
        "front beanstalk": front("beanstalk"),
        "front counter": front("counter"),
        "front http": front("http"),
        "dispatcher": ((ZSTALK, "dispatcher", "--broker", away, "--log-format", "JSON"), None,
                       UNWELCOMED),
        "worker": ((ZSTALK, "worker", "tests.support.workers_app:shared", "--broker", away,
                    "--processes", "2", "--log-format", "json"), None, UNWELCOMED),
        "zstalkd": ((ZSTALKD, "-V", "-l", LOOPBACK, "-p", str(free_port())),
                    {"ZSTALK_LOG_FORMAT": "json"}, "zstalkd"),
        "text front": ((ZSTALK, "front", "beanstalk", "--broker", away, "--listen", listen()),
                       None, UNWELCOMED),
    }


@pytest.fixture(scope="module")
def said() -> dict[str, str]:
    """What every role said on stderr, started at once, once it said its last expected line."""
    started = {role: (Role(*argv, env=env), last)
               for role, (argv, env, last) in roles_to_start().items()}
    try:
        for role, (running, last) in started.items():
            running.wait_said(last, 2 if role == "worker" else 1)
    finally:
        said = {role: running.stop() for role, (running, _) in started.items()}
    return said


@pytest.mark.parametrize("role", ["serve", "broker", "front beanstalk", "front counter",
                                  "front http", "dispatcher", "worker", "zstalkd"])
def test_every_role_asked_for_json_writes_only_json_lines_and_its_start_line_is_one(said, role):
    found = records(said[role])
    start_record(found, role)
    for record in found:            # beyond the fixed fields, no LogRecord attribute leaks
        assert not (set(record) - set(FIXED)) & RECORD_ATTRIBUTES, record


@pytest.mark.parametrize("role", ["front beanstalk", "front counter", "front http",
                                  "dispatcher"])
def test_a_role_without_its_broker_warns_in_json(said, role):
    warned = [r for r in records(said[role]) if UNWELCOMED in r["msg"]]
    assert warned and warned[0]["level"] == "warning"
    assert warned[0]["logger"].startswith("zstalk.")
    assert f"the broker at tcp://{LOOPBACK}:" in warned[0]["msg"]


def test_the_processes_of_a_worker_pool_log_in_json_as_their_parent_does(said):
    found = records(said["worker"])
    parent = start_record(found, "worker")["pid"]
    warned = {r["pid"] for r in found if UNWELCOMED in r["msg"]}
    assert len(warned) == 2 and parent not in warned       # one warning from each child


def test_with_v_info_lines_come_in_json_too(said):
    for role in ("serve", "broker", "zstalkd"):
        assert any(r["level"] == "info" and r["logger"] != "zstalk.start"
                   for r in records(said[role])), role


def test_the_text_format_is_the_one_it_was(said):
    start, *rest = said["text front"].splitlines()
    assert re.fullmatch(rf"zstalk front beanstalk {re.escape(VERSION)}: listening on "
                        rf"{LOOPBACK}:\d+; broker tcp://{LOOPBACK}:\d+", start)
    assert TEXT_FORMAT == "%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} zstalk\.front\[\d+\] WARNING "
                        rf"beanstalk: the broker at tcp://{LOOPBACK}:\d+ {UNWELCOMED} for 2 s: "
                        r".+", rest[0])


def test_zstalkd_refuses_a_log_format_it_does_not_know_with_beanstalkds_usage_exit():
    done = subprocess.run([ZSTALKD, "-l", LOOPBACK, "-p", str(free_port())], timeout=30,
                          capture_output=True, text=True,
                          env=dict(OUR_ENV, ZSTALK_LOG_FORMAT="xml"))
    assert done.returncode == 5
    assert done.stderr == "zstalkd: $ZSTALK_LOG_FORMAT: log format 'xml': give text or json\n"


# -- the supervisor ----------------------------------------------------------------------
def cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def test_a_supervisor_and_all_its_children_log_in_json_and_it_warns_of_a_restart_in_json():
    port = free_port()
    server = Role(ZSTALK, "-V", "serve", "--fronts", "1", "-l", LOOPBACK, "-p", str(port),
                  "--counter-port", "0", "--worker-bind", "none", "--log-format", "json")
    try:
        server.wait_said("registered with broker")     # (-V: the front's INFO line)
        supervisor = server.proc.pid
        children = children_of(supervisor)
        assert len(children) == 2                       # the broker and one front
        [front] = [pid for pid in children if b"front" in cmdline(pid)]
        os.kill(front, signal.SIGKILL)
        server.wait_said("registered with broker", 2)  # (its successor's)
    finally:
        found = records(server.stop())
    start_record(found, "serve")
    restart = [r for r in found if "starting it again" in r["msg"]]
    assert restart[0]["level"] == "warning" and restart[0]["pid"] == supervisor
    assert (restart[0]["logger"], restart[0]["child"], restart[0]["status"]) == (
        "zstalk.supervisor", "front-0", -signal.SIGKILL)
    assert {r["pid"] for r in found} > {supervisor, *children}    # and the new front


# -- a failing job, from a pool process ----------------------------------------------
def test_a_failing_jobs_warning_from_a_pool_process_carries_its_fields_and_traceback(tmp_path):
    from zstalk.workers import Client, codecs
    endpoint = f"tcp://{LOOPBACK}:{free_port()}"
    broker = Role(ZSTALK, "broker", "--bind", endpoint)
    pool = None
    try:
        broker.wait_said("zstalk broker")
        pool = Role(ZSTALK, "worker", "tests.support.workers_app:shared", "--broker", endpoint,
                    "--processes", "2", "--log-format", "json",
                    env={"ZSTALK_TEST_LOG": str(tmp_path / "events")})
        with Client(endpoint, codec=codecs.json, timeout_s=10.0) as client:
            job_id = client.put({"fail": True}, tube="shared")
        pool.wait_said("failing on purpose")
    finally:
        said = pool.stop() if pool is not None else ""
        broker.stop()
    found = records(said)
    failed = [r for r in found if r.get("job_id") == job_id]
    assert failed and failed[0]["pid"] != start_record(found, "worker")["pid"]
    assert failed[0]["level"] == "warning" and failed[0]["logger"] == "zstalk.workers"
    assert (failed[0]["tube"], failed[0]["attempt"]) == ("shared", 1)
    assert isinstance(failed[0]["duration_s"], float) and failed[0]["outcome"]
    assert failed[0]["exc"].startswith("Traceback (most recent call last):")
    assert failed[0]["exc"].endswith("RuntimeError: failing on purpose")


# -- the formatter -------------------------------------------------------------------------
def logged(log: callable) -> list[str]:
    """The lines a JsonFormatter writes for what `log(logger)` logs."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(f"zstalk.test.json.{time.monotonic_ns()}")
    logger.propagate, logger.level = False, logging.DEBUG
    logger.addHandler(handler)
    log(logger)
    return out.getvalue().splitlines()


def test_a_record_carries_its_extra_fields_after_the_fixed_ones():
    [line] = logged(lambda log: log.info("job %d run", 7, extra={"job_id": 7, "tube": "t",
                                                                  "duration_s": 0.25}))
    record = json.loads(line)
    assert list(record) == [*FIXED, "job_id", "tube", "duration_s"]
    assert (record["level"], record["msg"], record["pid"]) == ("info", "job 7 run", os.getpid())
    assert (record["job_id"], record["tube"], record["duration_s"]) == (7, "t", 0.25)


def test_the_time_is_rfc_3339_utc_with_milliseconds():
    [line] = logged(lambda log: log.debug("now"))
    stamp = json.loads(line)["ts"]
    assert TS.fullmatch(stamp)
    assert abs(calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) - time.time()) < 2


def test_an_exception_is_one_exc_field_and_a_newline_stays_on_one_line():
    def log(logger):
        try:
            raise ValueError("bad\nvalue")
        except ValueError:
            logger.exception("two\nlines")
    [line] = logged(log)
    record = json.loads(line)
    assert (record["level"], record["msg"]) == ("error", "two\nlines")
    assert record["exc"].startswith("Traceback") and record["exc"].endswith("bad\nvalue")
    assert list(record) == [*FIXED, "exc"]


def test_values_json_cannot_hold_are_given_as_text():
    class Thing:
        def __str__(self):
            return "a thing"
    [line] = logged(lambda log: log.warning("odd", extra={
        "thing": Thing(), "keys": {(1, 2): "tuple key"}, "nan": math.nan, "fine": [1, "a"]}))
    record = json.loads(line)
    assert (record["thing"], record["keys"], record["nan"], record["fine"]) == (
        "a thing", "{(1, 2): 'tuple key'}", "nan", [1, "a"])
    assert record["level"] == "warning"


def test_a_fixed_field_is_never_overwritten_by_an_extra_of_the_same_name():
    [line] = logged(lambda log: log.critical("x", extra={"level": "quiet", "pid": 0}))
    record = json.loads(line)
    assert (record["level"], record["pid"]) == ("critical", os.getpid())
