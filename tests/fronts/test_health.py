"""--health-port: the probe parser and decisions (pure), and real processes' answers."""
from __future__ import annotations

import math
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servers import free_port, self_check, wait_for
from zstalk.protocol.network.health import (BadRequest, HealthRequest, TooLong, answer,
                                            health_state, link_state)

BIN = Path(__file__).resolve().parents[2] / ".venv" / "bin"
ZSTALK = str(BIN / "zstalk") if (BIN / "zstalk").exists() else "zstalk"
REQUEST = b"GET /readyz HTTP/1.1\r\nHost: x\r\nUser-Agent: kube-probe/1.30\r\n\r\n"


# -- the parser (sans-IO) -------------------------------------------------------------------
def parse(chunks) -> tuple[str, str] | None:
    """(method, path) of the request, once complete."""
    got = parse_request(chunks)
    return got and got[:2]


def parse_request(chunks):
    parser, got = HealthRequest(), None
    for chunk in chunks:
        parser.receive_data(chunk)
        got = got or parser.next_request()
    return got


def test_a_request_parses_the_same_whole_byte_by_byte_and_with_trailing_data():
    assert parse([REQUEST]) == ("GET", "/readyz")
    assert parse([REQUEST[i:i + 1] for i in range(len(REQUEST))]) == ("GET", "/readyz")
    assert parse([REQUEST + b"GET /healthz HTTP/1.1\r\n\r\n"]) == ("GET", "/readyz")


def test_a_request_keeps_its_authorization_header_whatever_its_case():
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nauthorization:  Bearer s3cret \r\n\r\n"
    assert parse_request([head]).authorization == "Bearer s3cret"
    assert parse_request([REQUEST]).authorization is None


def test_metrics_need_the_bearer_token_when_one_is_set():
    from zstalk.protocol.network.health import Request, answer_metrics
    text = lambda: b"zstalk_jobs 1\n"     # noqa: E731
    status = lambda reply: int(reply.split(b" ", 2)[1])     # noqa: E731
    assert status(answer_metrics(Request("GET", "/metrics"), None, text)) == 200
    assert status(answer_metrics(Request("GET", "/metrics"), "t0k", text)) == 401
    assert status(answer_metrics(Request("GET", "/metrics", "Basic dDBr"), "t0k", text)) == 401
    assert status(answer_metrics(Request("GET", "/metrics", "Bearer nope"), "t0k", text)) == 403
    good = answer_metrics(Request("GET", "/metrics", "bearer t0k"), "t0k", text)
    assert good.startswith(b"HTTP/1.1 200 ") and good.endswith(b"\r\n\r\nzstalk_jobs 1\n")
    assert b"version=0.0.4" in good
    assert status(answer_metrics(Request("POST", "/metrics"), None, text)) == 405
    assert status(answer_metrics(Request("GET", "/metrics"), None, None)) == 404


def test_a_request_needs_its_blank_line_and_drops_the_query():
    assert parse([REQUEST[:-2]]) is None
    assert parse([b"GET /healthz?x=1 HTTP/1.0\n\n"]) == ("GET", "/healthz")


@pytest.mark.parametrize("line", [b"GET /readyz\r\n\r\n", b"GET readyz HTTP/1.1\r\n\r\n",
                                  b"\xff /x HTTP/1.1\r\n\r\n", b"GET /x SPDY/3\r\n\r\n"])
def test_a_malformed_request_line_is_a_bad_request(line):
    with pytest.raises(BadRequest):
        parse([line])


def test_a_request_line_over_1_kib_is_too_long_even_before_it_ends():
    with pytest.raises(TooLong):
        parse([b"GET /" + b"x" * 1100])
    with pytest.raises(TooLong):
        parse([b"GET /" + b"x" * 1100 + b" HTTP/1.1\r\n\r\n"])
    with pytest.raises(TooLong):
        parse([b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 2000])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=20))
def test_arbitrary_bytes_give_a_request_more_data_or_one_of_two_errors(chunks):
    try:
        got = parse(chunks)
    except (BadRequest, TooLong):
        return
    assert got is None or (isinstance(got[0], str) and got[1].startswith("/"))


# -- the decisions (pure, the clock a parameter) --------------------------------------------
def test_the_loop_is_stalled_only_past_the_threshold():
    assert health_state(last_beat=100.0, now=159.0, stall_s=60.0) is None
    assert health_state(last_beat=100.0, now=160.0, stall_s=60.0) is None
    assert health_state(last_beat=100.0, now=172.4, stall_s=60.0) == "loop stalled 72 s"
    assert health_state(last_beat=100.0, now=102.5, stall_s=2.0) == "loop stalled 2 s"


def test_a_link_is_ready_while_connected_or_waiting_less_than_its_hold_time():
    assert link_state("ready", None, now=50.0, hold_s=5.0) is None
    assert link_state("connecting", 48.0, now=50.0, hold_s=5.0) is None
    assert link_state("lost", 40.0, now=50.0, hold_s=5.0) == "no broker for 10 s"
    assert link_state("connecting", -math.inf, now=50.0, hold_s=5.0) == "no broker yet"


def test_liveness_ignores_readiness_and_readiness_includes_liveness():
    assert answer("GET", "/healthz", None, "no broker for 9 s").startswith(b"HTTP/1.1 200 ")
    assert answer("GET", "/readyz", None, "no broker for 9 s").startswith(b"HTTP/1.1 503 ")
    stalled = answer("GET", "/readyz", "loop stalled 70 s", None)
    assert stalled.startswith(b"HTTP/1.1 503 ") and stalled.endswith(b"loop stalled 70 s\n")
    assert answer("POST", "/readyz", None, None).startswith(b"HTTP/1.1 405 ")
    assert answer("HEAD", "/readyz", None, None).endswith(b"\r\n\r\n")


def test_leader_answers_200_on_the_leader_and_503_with_the_reason_elsewhere():
    assert answer("GET", "/leader", None, None, None).startswith(b"HTTP/1.1 200 ")
    standby = answer("GET", "/leader", None, "standby", "standby: instance 1f leads (epoch 3)")
    assert standby.startswith(b"HTTP/1.1 503 ") and standby.endswith(b"(epoch 3)\n")
    assert answer("GET", "/leader", None, None).endswith(b"not a broker\n")   # a front's


# -- real processes on 127.0.0.1 ------------------------------------------------------------
needs_programs = pytest.mark.skipif(self_check(), reason="tests zstalk's own programs")


def probe(port: int, request: bytes = REQUEST, timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
        return data


def get(port: int, path: str) -> tuple[int, str]:
    data = probe(port, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.endswith(b"\r\nConnection: close")
    return int(head.split()[1]), body.decode().strip()


class Processes:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, *args: str) -> subprocess.Popen:
        proc = subprocess.Popen([ZSTALK, *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stderr.close()


@pytest.fixture
def procs():
    p = Processes()
    yield p
    p.close()


def health_args(port: int, *more: str) -> list[str]:
    return ["--health-port", str(port), "--health-listen", "127.0.0.1", *more]


def start_broker(procs: Processes) -> tuple[str, int]:
    endpoint, health = f"tcp://127.0.0.1:{free_port()}", free_port()
    procs.start("broker", "--bind", endpoint, *health_args(health))
    assert wait_for(lambda: get(health, "/readyz") == (200, "ok"), 30)
    return endpoint, health


@needs_programs
def test_a_broker_answers_ready_and_live_404_for_other_paths_and_400_for_junk(procs):
    _, health = start_broker(procs)
    assert get(health, "/healthz") == (200, "ok")
    assert get(health, "/nothing")[0] == 404
    assert probe(health, b"HELLO\r\n\r\n").startswith(b"HTTP/1.1 400 ")


@needs_programs
def test_a_probe_connection_closes_on_an_overlong_line_or_after_2_s_of_silence(procs):
    _, health = start_broker(procs)
    assert probe(health, b"GET /" + b"x" * 2000) == b""
    started = time.monotonic()
    assert probe(health, b"GET /readyz HTTP/1.1\r\n", timeout=10) == b""
    assert 1.5 < time.monotonic() - started < 6


@needs_programs
def test_a_remote_fronts_readiness_follows_its_broker(procs):
    endpoint, _ = start_broker(procs)
    broker = procs.procs[0]
    health = free_port()
    procs.start("front", "beanstalk", "--broker", endpoint, "--listen",
                f"127.0.0.1:{free_port()}", "--hold-s", "1", *health_args(health))
    assert wait_for(lambda: get(health, "/readyz") == (200, "ok"), 30)
    broker.kill()
    broker.wait()
    # silence is noticed after PEER_TIMEOUT_S (2 s), then the hold time (1 s) runs out
    assert wait_for(lambda: get(health, "/readyz")[0] == 503, 20)
    status, reason = get(health, "/readyz")
    assert status == 503 and reason.startswith("no broker for ")
    assert get(health, "/healthz") == (200, "ok")     # alive: restarting it would not help


@needs_programs
def test_a_dispatcher_is_ready_once_its_broker_welcomes_it(procs):
    endpoint, _ = start_broker(procs)
    health = free_port()
    procs.start("dispatcher", "--broker", endpoint, *health_args(health))
    assert wait_for(lambda: get(health, "/readyz") == (200, "ok"), 30)


@needs_programs
def test_the_one_process_server_answers_its_probes(procs):
    health = free_port()
    procs.start("serve", "-l", "127.0.0.1", "-p", str(free_port()), "--counter-port", "0",
                "--worker-bind", "none", *health_args(health))
    assert wait_for(lambda: get(health, "/readyz") == (200, "ok"), 30)
    assert get(health, "/healthz") == (200, "ok")


@needs_programs
@pytest.mark.parametrize("command", [["broker", "--bind", "tcp://127.0.0.1:{zmq}"],
                                     ["front", "counter", "--listen", "127.0.0.1:{zmq}"]])
def test_a_health_port_in_use_ends_the_process_with_111_naming_it(procs, command):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = [a.format(zmq=free_port()) for a in command]
        proc = procs.start(*args, *health_args(port))
        assert proc.wait(30) == 111
        assert f"bind health port 127.0.0.1:{port}" in proc.stderr.read().decode()


@needs_programs
def test_a_supervisor_with_a_health_port_stops_as_it_should_without_an_error_line(procs):
    """Its readiness watch was left pending when its probes' loop stopped, and every normal
    stop ended with asyncio's ERROR 'Task was destroyed but it is pending!'."""
    health = free_port()
    proc = procs.start("serve", "--fronts", "1", "-l", "127.0.0.1", "-p", str(free_port()),
                       "--counter-port", "0", "--worker-bind", "none", *health_args(health))
    assert wait_for(lambda: get(health, "/readyz") == (200, "ok"), 30)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    said = proc.stderr.read().decode()
    assert "ERROR" not in said and "Traceback" not in said, said
