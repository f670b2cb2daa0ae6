"""Bounds: no input may grow a front's memory without bound, and the connection stays in step."""
from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from servers import RawClient, self_check

pytestmark = pytest.mark.skipif(self_check(), reason="measures zstalk's own processes")

MiB = 1024 * 1024


def front_pid(server) -> int:
    """The pid of the server's front, once it answers: its own process by default, a
    child with `--fronts N` (the supervisor listens before it)."""
    with RawClient(server.address, 10) as c:
        c.send(b"list-tube-used\r\n")
        assert c.read_reply() == b"USING default\r\n"
    for task in Path(f"/proc/{server.pid}/task").glob("*/children"):
        for pid in task.read_text().split():
            if b"front" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return int(pid)
    return server.pid       # one process: the front runs beside the broker


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def send_for(sock: socket.socket, chunk: bytes, seconds: float, limit: int) -> int:
    """Send `chunk` repeatedly until the peer stops reading, `seconds` pass or `limit` bytes."""
    sock.setblocking(False)
    sent, deadline = 0, time.monotonic() + seconds
    while sent < limit and time.monotonic() < deadline:
        try:
            sent += sock.send(chunk)
        except BlockingIOError:
            time.sleep(0.01)
    sock.setblocking(True)
    return sent


def test_a_client_that_never_reads_replies_cannot_grow_the_front(zstalk_factory):
    server = zstalk_factory()
    pid = front_pid(server)
    before = rss(pid)
    sock = socket.create_connection(server.address)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sent = send_for(sock, b"list-tube-used\r\n" * 4096, seconds=4, limit=200 * MiB)
    grown = rss(pid) - before
    assert sent < 200 * MiB, "the front kept reading although its replies were not read"
    assert grown < 64 * MiB
    sock.close()


def test_an_endless_command_line_is_discarded_as_it_arrives(zstalk_factory, raw_client):
    server = zstalk_factory()
    pid = front_pid(server)
    before = rss(pid)
    c = raw_client(server.address)
    for _ in range(20):
        c.send(b"x" * MiB)
    c.send(b"\r\nlist-tube-used\r\n")
    assert c.read_replies(2, timeout=20) == [b"BAD_FORMAT\r\n", b"USING default\r\n"]
    assert rss(pid) - before < 16 * MiB


def test_a_body_past_the_size_limit_is_drained_without_being_kept(zstalk_factory, raw_client):
    server = zstalk_factory(max_job_size=1000)
    pid = front_pid(server)
    before = rss(pid)
    c = raw_client(server.address)
    size = 40 * MiB
    c.send(b"put 0 0 1 %d\r\n" % size)
    for _ in range(size // MiB):
        c.send(b"y" * MiB)
    c.send(b"\r\nput 0 0 1 1\r\nz\r\n")
    assert c.read_replies(2, timeout=20) == [b"JOB_TOO_BIG\r\n", b"INSERTED 1\r\n"]
    assert rss(pid) - before < 16 * MiB


def test_a_pipelined_flood_is_answered_completely_and_in_order(zstalk_factory, raw_client):
    server = zstalk_factory()
    c = raw_client(server.address)
    n = 20000
    c.send(b"".join(b"put 0 0 10 3\r\nabc\r\nbad\r\n" for _ in range(n)))
    replies = c.read_replies(2 * n, timeout=60)
    assert replies[0::2] == [b"INSERTED %d\r\n" % i for i in range(1, n + 1)]
    assert set(replies[1::2]) == {b"UNKNOWN_COMMAND\r\n"}


@pytest.mark.parametrize("placement", [[], ["--fronts", "1"]], ids=["one-process", "front-process"])
def test_thousands_of_commands_behind_a_waiting_reserve_are_answered_in_order_after_it(
        zstalk_factory, placement):
    server = zstalk_factory(extra_args=placement)
    n = 5000        # past the 1,024 a connection may have in flight: the front stops reading
    waiting = RawClient(server.address)
    waiting.send(b"reserve\r\n" + b"".join(b"put 0 0 10 1\r\n%d\r\n" % (i % 10)
                                          for i in range(n)))
    waiting.expect_silence(0.3)
    with RawClient(server.address) as producer:
        producer.send(b"put 0 0 10 4\r\nwake\r\n")
        assert producer.read_reply() == b"INSERTED 1\r\n"
    replies = waiting.read_replies(n + 1, timeout=30)
    assert replies[0] == b"RESERVED 1 4\r\nwake\r\n"
    assert replies[1:] == [b"INSERTED %d\r\n" % i for i in range(2, n + 2)]
