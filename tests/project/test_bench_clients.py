"""The benchmarks' own clients and servers, which decide whether a row measures zstalk: the
minimal client (scripts/harness/minimal.py) counts exactly the replies a real beanstalkd
gives, one at a time, in batches and over many connections, and says so when a reply is
not the one it expects, whole or cut into single bytes; the floor server
(scripts/harness/floor_server.py) answers each command with its canned reply; and the rule
that marks a row generator-bound (scripts/harness/ceiling.py) is a pure function of
medians, shown in a table's result column in place of PASS / MISS."""
from __future__ import annotations

import socket
import struct
import sys
import threading
from pathlib import Path

import pytest

from servers import needs_group

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))

from harness import ceiling, minimal                       # noqa: E402
from harness.beanstalk import BeanstalkServer, stats_of    # noqa: E402
from harness.floor_server import floor                     # noqa: E402
from harness.table import Table                            # noqa: E402


@pytest.fixture
def beanstalkd():
    server = BeanstalkServer("beanstalkd", lambda port: [
        needs_group("reference", "beanstalkd"), "-l", "127.0.0.1", "-p", port], kind="reference")
    server.start()
    yield server
    assert server.stop() == []


@pytest.fixture
def floor_server():
    server = BeanstalkServer("floor", lambda port: floor(sys.executable, port), kind="canned")
    server.start()
    yield server
    assert server.stop() == []


def ready_jobs(server) -> int:
    return int(stats_of(server.addr)["current-jobs-ready"])


# -- the minimal client ------------------------------------------------------------------------
@pytest.mark.reference
@pytest.mark.parametrize("conns, batch", [(1, 1), (3, 8), (50, 1)])
def test_the_minimal_client_counts_every_put_and_cycle_a_real_beanstalkd_answers(
        beanstalkd, conns, batch):
    put = minimal.drive(beanstalkd.addr, "put", 700, conns=conns, batch=batch, warmup=100,
                        server=beanstalkd)
    assert (put["count"], put["warm_count"], put["errors"]) == (700, 100, [])
    assert ready_jobs(beanstalkd) == 800
    cycle = minimal.drive(beanstalkd.addr, "cycle", 300, conns=conns, batch=batch, warmup=100)
    assert (cycle["count"], cycle["warm_count"], cycle["errors"]) == (300, 50, [])
    assert ready_jobs(beanstalkd) == 800 - 350
    assert put["rate"] > 0 and 0 < put["gen_cpu_share"] <= 1.5 and put["cpu_per_1k"] >= 0


@pytest.mark.reference
def test_greenstalk_as_the_client_counts_what_it_put_and_deleted(beanstalkd):
    put = minimal.drive(beanstalkd.addr, "put", 300, client="greenstalk", warmup=10)
    cycle = minimal.drive(beanstalkd.addr, "cycle", 200, client="greenstalk", warmup=10)
    assert [(r["count"], r["errors"]) for r in (put, cycle)] == [(300, []), (200, [])]
    assert ready_jobs(beanstalkd) == 310 - 205


@pytest.fixture
def fed():
    """fed(replies, pieces) -> a Conn whose server side, a thread, writes `replies` in
    `pieces` sends (0: a byte at a time); every socket closed at teardown."""
    socks = []

    def make(replies: bytes, pieces: int) -> minimal.Conn:
        mine, theirs = socket.socketpair()
        socks.extend((mine, theirs))
        conn = minimal.Conn.__new__(minimal.Conn)
        conn.sock, conn.recv_into = mine, mine.recv_into
        conn.buf = bytearray(minimal.BUF_SIZE)
        conn.view = memoryview(conn.buf)
        step = 1 if not pieces else -(-len(replies) // pieces)
        chunks = [replies[i:i + step] for i in range(0, len(replies), step)]
        threading.Thread(target=send_all, args=(theirs, chunks), daemon=True).start()
        return conn
    yield make
    for s in socks:
        s.close()


def send_all(sock: socket.socket, chunks: list[bytes]) -> None:
    for chunk in chunks:
        sock.sendall(chunk)


RESERVED = b"RESERVED 7 100\r\n" + minimal.BODY + b"\r\nRESERVED 8 100\r\n" + minimal.BODY + b"\r\n"


@pytest.mark.parametrize("pieces", [1, 0, 3])
def test_reserved_replies_read_the_same_whole_or_a_byte_at_a_time(fed, pieces):
    conn = fed(RESERVED, pieces)
    minimal.read_reserved(conn, 2)
    assert conn.ids == [b"7", b"8"]


@pytest.mark.parametrize("reply, read", [
    (b"NOT_FOUND\r\n", minimal.read_inserted),
    (b"INSERTED 1\r\nINSERTED 2\r\n", minimal.read_inserted),
    (b"RESERVED 7 100\r\n" + minimal.BODY[::-1] + b"\r\n", minimal.read_reserved),
    (b"DEADLINE_SOON\r\n", minimal.read_reserved),
    (b"DELETED\r\n" + b"x", minimal.read_deleted)])
def test_a_reply_the_operation_does_not_expect_is_an_error_not_a_count(fed, reply, read):
    with pytest.raises(minimal.Unexpected):
        read(fed(reply, 1), 1)


# -- the floor server --------------------------------------------------------------------------
def test_the_floor_server_answers_each_beanstalk_command_with_its_canned_reply(floor_server):
    with socket.create_connection(floor_server.addr, timeout=5) as s:
        for piece in (b"put 0 0 60 5\r\nhel", b"lo\r\nreserve\r\ndelete 7\r\n",
                      b"list-tube-used\r\nbogus\r\n"):
            s.sendall(piece)
        want = (b"INSERTED 1\r\nRESERVED 2 100\r\n" + minimal.BODY + b"\r\nDELETED\r\n"
                b"USING default\r\nUNKNOWN_COMMAND\r\n")
        got = b""
        while len(got) < len(want):
            got += s.recv(4096)
        assert got == want


def test_the_floor_server_answers_counter_frames_with_status_0_and_their_opaque():
    server = BeanstalkServer("floor", lambda port: floor(sys.executable, port, "counter"),
                             kind="canned")
    server.spawn()
    try:
        s = wait_connect(server.addr)
        acquire = minimal.ACQUIRE[:8] + struct.pack(">I", 0xCAFE) + minimal.ACQUIRE[12:]
        s.sendall(acquire + minimal.RELEASE)
        got = b""
        while len(got) < 28:
            got += s.recv(4096)
        s.close()
        assert got == (struct.pack(">BBBBII", 0x91, 0x02, 0, 0, 4, 0xCAFE) + b"\0\0\0\1"
                       + struct.pack(">BBBBII", 0x91, 0x03, 0, 0, 0, 0))
    finally:
        assert server.stop() == []


def wait_connect(addr) -> socket.socket:
    for _ in range(500):
        try:
            return socket.create_connection(addr, timeout=5)
        except ConnectionRefusedError:
            threading.Event().wait(0.01)
    raise AssertionError(f"nothing listens on {addr}")


def test_the_minimal_client_runs_its_cycles_and_batches_against_the_floor(floor_server):
    for conns, batch in ((1, 1), (8, 32), (50, 1)):
        res = minimal.drive(floor_server.addr, "cycle", 640, conns=conns, batch=batch)
        assert (res["count"], res["errors"]) == (640, [])


# -- the rule ----------------------------------------------------------------------------------
def test_a_one_at_a_time_generator_below_nine_tenths_of_the_minimal_client_is_bound():
    assert ceiling.bound_one_at_a_time(17_000, 45_000) == \
        "0.38x the minimal client against the reference"
    assert ceiling.bound_one_at_a_time(40_500, 45_000) is None           # 0.90x: not bound
    assert ceiling.bound_one_at_a_time(None, 45_000) is None             # no figure, no verdict
    assert ceiling.ceiling_said(44_000, 40_000) == "1.10x the minimal client: not the limit"
    assert ceiling.ceiling_said(30_000, 40_000).startswith("*generator-bound* (0.75x")


def test_a_pipelined_generator_over_four_fifths_of_a_core_is_bound_and_says_where():
    assert ceiling.bound_by_cpu({"beanstalkd": 0.81, "zstalk": 0.8, "zstalk@x": None}) == \
        "generator at 0.81 core against beanstalkd"
    assert ceiling.bound_by_cpu({"beanstalkd": 0.8}) is None
    assert ceiling.verdict(None, None) is None
    assert ceiling.verdict("a", None, "b") == "*generator-bound* (a; b): not a result"


def test_a_bound_row_says_so_in_its_result_column_instead_of_pass_or_miss():
    t = Table("t", "T", [("ref", "ref"), ("z", "z")], [("z", "ref")])
    t.add("rate", {"ref": 100.0, "z": 90.0}, target=("z/ref", ">=", 0.8),
          result=ceiling.verdict("generator at 0.95 core against ref"))
    t.add("other", {"ref": 100.0, "z": 70.0}, target=("z/ref", ">=", 0.8))
    t.add("plain", {"ref": 1.0, "z": 1.0}, result=ceiling.ceiling_said(1.0, 1.0))
    assert [r["result"] for r in t.rows] == [
        "*generator-bound* (generator at 0.95 core against ref): not a result", "MISS",
        "1.00x the minimal client: not the limit"]
    assert "| rate | 100 | 90 | 0.90x | z/ref >= 0.8x | *generator-bound*" in t.markdown()
