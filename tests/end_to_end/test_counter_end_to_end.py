"""The yrmcds counter protocol end to end: real `zstalk broker` + `zstalk front counter`
processes (and `zstalk serve --counter-port`), driven by a raw-socket client whose
requests are packed with zstalk.protocol.codecs.yrmcds' structs (servers.CounterClient).

The first group follows yrmcds' own live test (test/counter.cpp: noop, one_client,
multi_clients, over_releasing, multi_names, dump);
then what zstalk adds: several fronts sharing one counter, a killed front's holdings
released by heartbeat, holdings re-registered after a broker restart, failing closed
while the broker is away, and the connection limits.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from servers import (
    LOOPBACK, CounterClient, acquire_request, counter_request, find_zstalk, free_port,
    get_request, release_request, self_check,
)
from zstalk.protocol.codecs.yrmcds import (HEADER, Opcode, Status, acquire_response, dump_end,
                                           dump_record, error_response, get_response,
                                           noop_response)

pytestmark = pytest.mark.skipif(self_check(), reason="the counter front has no beanstalkd stand-in")

OK, NOT_FOUND, NOT_AVAILABLE, NOT_ACQUIRED = 0x00, 0x01, 0x21, 0x22


def u32(value: int) -> bytes:
    return value.to_bytes(4, "big")


def wait_for(predicate, timeout: float, step: float = 0.02):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout} s")
        time.sleep(step)


def consumption(client: CounterClient, name: bytes) -> int | None:
    reply = client.get(name)
    return int.from_bytes(reply.body, "big") if reply.status == OK else None


@pytest.fixture
def cluster(zstalk_cluster):
    return zstalk_cluster(fronts=0, counter_fronts=1)


@pytest.fixture
def connect():
    """connect(address) -> CounterClient; all closed at teardown."""
    clients: list[CounterClient] = []

    def open_one(address) -> CounterClient:
        client = CounterClient(address)
        clients.append(client)
        return client

    yield open_one
    for client in clients:
        client.close()


@pytest.fixture
def client(cluster, connect) -> CounterClient:
    return connect(cluster.counter_addresses[0])


# -- yrmcds' live counter test ---------------------------------------------------------

def test_three_noops_come_back_with_their_opaques(client):
    opaques = [0x01020304, 0xFFFFFFFF, 0]
    client.send(b"".join(counter_request(Opcode.NOOP, opaque=o) for o in opaques))
    assert [client.read_response() for _ in opaques] == [
        (0x91, Opcode.NOOP, OK, o, b"") for o in opaques]


def test_one_client_acquires_2_3_and_5_of_10_then_is_refused(client):
    total = 0
    for resources in (2, 3, 5):
        reply = client.acquire(b"one", resources, 10)
        assert (reply.opcode, reply.status, reply.body) == (Opcode.ACQUIRE, OK, u32(resources))
        total += resources
        assert consumption(client, b"one") == total
    refused = client.acquire(b"one", 1, 10)
    assert (refused.status, refused.body) == (NOT_AVAILABLE, b"Resource not available")
    assert client.release(b"one", 3) == (0x91, Opcode.RELEASE, OK, refused.opaque + 1, b"")
    assert client.acquire(b"one", 2, 10).status == OK
    assert consumption(client, b"one") == 9


def test_two_clients_share_a_counter_and_a_closed_clients_holdings_go_back(client, cluster, connect):
    other = connect(cluster.counter_addresses[0])
    assert client.acquire(b"shared", 2, 10).status == OK
    assert other.acquire(b"shared", 8, 10).status == OK
    assert client.acquire(b"shared", 1, 10).status == NOT_AVAILABLE     # full
    assert client.release(b"shared", 1).status == OK                    # room for one
    assert other.acquire(b"shared", 1, 10).status == OK
    assert other.release(b"shared", 1).status == OK
    assert consumption(client, b"shared") == 9
    other.close()                                   # holds 8: released with the session
    wait_for(lambda: consumption(client, b"shared") == 1, 2)
    assert client.acquire(b"shared", 8, 10).status == OK
    assert client.acquire(b"shared", 2, 10).status == NOT_AVAILABLE


def test_releasing_more_than_this_connection_holds_is_not_acquired(client, cluster, connect):
    assert client.acquire(b"over", 1, 10).status == OK
    over = client.release(b"over", 2)
    assert (over.opcode, over.status, over.body) == (Opcode.RELEASE, NOT_ACQUIRED, b"Not acquired")
    stranger = connect(cluster.counter_addresses[0])
    assert stranger.release(b"over", 0).status == NOT_ACQUIRED     # holds nothing, even for 0
    assert stranger.release(b"none", 0).status == NOT_FOUND
    assert client.release(b"over", 0).status == OK                  # holds 1: releasing 0 is fine
    assert consumption(client, b"over") == 1


def test_independent_names_with_partial_releases_and_a_zero_counter_still_answers_get(client):
    for name, resources in ((b"n1", 3), (b"n2", 5), (b"n3", 7)):
        assert client.acquire(name, resources, 10).status == OK
    assert client.release(b"n1", 1).status == OK
    assert client.release(b"n2", 5).status == OK
    assert client.release(b"n3", 2).status == OK
    assert [consumption(client, n) for n in (b"n1", b"n2", b"n3")] == [2, 0, 5]
    assert client.get(b"n2").body == u32(0)                         # OK, not Not found
    assert client.get(b"never").status == NOT_FOUND


def test_dump_lists_current_and_peak_of_every_counter_then_an_empty_terminator(client):
    assert client.acquire(b"aaa", 5, 10).status == OK
    assert client.acquire(b"aaa", 3, 10).status == OK
    assert client.release(b"aaa", 1).status == OK
    assert client.acquire(b"bbb", 100, 100).status == OK
    assert client.release(b"bbb", 100).status == OK
    assert sorted(client.dump()) == [(b"aaa", 7, 8), (b"bbb", 0, 100)]
    client.send(counter_request(Opcode.DUMP, opaque=0xD0))
    frames = [client.read_frame() for _ in range(3)]
    assert frames[-1] == dump_end(0xD0)
    assert set(frames[:2]) == {dump_record(0xD0, b"aaa", 7, 8), dump_record(0xD0, b"bbb", 0, 100)}


# -- the front ---------------------------------------------------------------------------

def test_pipelined_local_and_broker_replies_come_back_in_request_order(client):
    bad_magic = HEADER.pack(0x80, Opcode.NOOP, 0, 0, 0, 2)
    unknown = counter_request(0x05, b"xyz", opaque=4)
    invalid_acquire = counter_request(Opcode.ACQUIRE, b"\x00\x00\x00\x00", opaque=6)
    client.send(counter_request(Opcode.NOOP, opaque=1) + bad_magic + acquire_request(b"p", 2, 5, 3)
                + unknown + get_request(b"p", 5) + invalid_acquire + release_request(b"p", 9, 7))
    assert [client.read_frame() for _ in range(7)] == [
        noop_response(1),
        error_response(Opcode.NOOP, 2, Status.INVALID),
        acquire_response(3, 2),
        error_response(Opcode.UNKNOWN, 4, Status.UNKNOWN_COMMAND),
        get_response(5, 2),
        error_response(Opcode.ACQUIRE, 6, Status.INVALID),
        error_response(Opcode.RELEASE, 7, Status.NOT_ACQUIRED),
    ]


def test_stats_has_yrmcds_fifteen_items_in_order(client):
    client.acquire(b"s", 1, 1)
    stats = client.stats()
    assert list(stats)[:3] == ["objects", "total_objects", "used_memory"]
    assert len(stats) == 15 and list(stats)[-1] == "command:dump"
    assert stats["command:acquire"] == b"1" and stats["command:stats"] == b"1"


def test_a_half_closed_client_gets_its_pipelined_replies_then_its_holdings_go_back(
        client, cluster, connect):
    watcher = connect(cluster.counter_addresses[0])
    client.send(acquire_request(b"h", 4, 10, 1) + get_request(b"h", 2) + b"\x90\x00")  # + half a frame
    client.sock.shutdown(socket.SHUT_WR)
    assert client.read_response().body == u32(4)
    assert client.read_response().body == u32(4)
    assert client.closed_within(2)
    wait_for(lambda: consumption(watcher, b"h") == 0, 2)


def test_a_frame_over_30_mib_closes_the_connection_without_a_reply_and_releases(
        client, cluster, connect):
    watcher = connect(cluster.counter_addresses[0])
    assert client.acquire(b"big", 3, 10).status == OK
    client.send(HEADER.pack(0x90, Opcode.GET, 0, 0, 0xFFFFFFFF, 9))
    assert client.closed_within(2)
    wait_for(lambda: consumption(watcher, b"big") == 0, 2)


def test_two_counter_fronts_share_one_counter(zstalk_cluster, connect):
    cluster = zstalk_cluster(fronts=0, counter_fronts=2)
    a, b = (connect(address) for address in cluster.counter_addresses)
    assert a.acquire(b"pool", 6, 10).status == OK
    assert b.acquire(b"pool", 5, 10).status == NOT_AVAILABLE
    assert b.acquire(b"pool", 4, 10).status == OK
    assert consumption(a, b"pool") == consumption(b, b"pool") == 10
    assert b.release(b"pool", 6).status == NOT_ACQUIRED     # a's units are a's
    a.close()
    wait_for(lambda: consumption(b, b"pool") == 4, 2)


def test_killing_a_counter_front_releases_its_holdings_within_3_s(zstalk_cluster, connect):
    cluster = zstalk_cluster(fronts=0, counter_fronts=2)
    doomed, survivor = (connect(address) for address in cluster.counter_addresses)
    assert doomed.acquire(b"k", 7, 10).status == OK
    assert survivor.acquire(b"k", 4, 10).status == NOT_AVAILABLE
    killed_at = time.monotonic()
    cluster.kill_counter_front(0)
    wait_for(lambda: consumption(survivor, b"k") == 0, 5)
    assert time.monotonic() - killed_at < 3.0
    assert survivor.acquire(b"k", 10, 10).status == OK


def test_holdings_come_back_after_a_broker_restart(cluster, client, connect):
    assert client.acquire(b"r", 4, 10).status == OK
    assert client.release(b"r", 1).status == OK
    cluster.kill_broker()
    cluster.restart_broker()
    other = connect(cluster.counter_addresses[0])
    wait_for(lambda: consumption(other, b"r") == 3, 8, step=0.1)   # re-registered by the front
    assert client.release(b"r", 3).status == OK                    # the same session, still open
    assert consumption(other, b"r") == 0


def test_acquire_fails_closed_while_the_broker_is_away(zstalk_cluster, connect):
    cluster = zstalk_cluster(fronts=0, counter_fronts=1, counter_front_args=["--hold-s", "1"])
    c = connect(cluster.counter_addresses[0])
    assert c.acquire(b"f", 1, 10).status == OK
    cluster.kill_broker()
    started = time.monotonic()
    assert c.acquire(b"f", 1, 10).status == NOT_AVAILABLE      # at once, or once the loss is seen
    assert time.monotonic() - started < 4
    assert c.acquire(b"f", 1, 10).status == NOT_AVAILABLE      # not sent: the link is down
    c.send(counter_request(Opcode.NOOP, opaque=77))             # no yrmcds status fits: close
    assert c.closed_within(4)


def test_max_connections_accepts_then_closes_the_extra_connection(zstalk_cluster, connect):
    cluster = zstalk_cluster(fronts=0, counter_fronts=1, counter_front_args=["--max-connections", "2"])
    address = cluster.counter_addresses[0]
    kept = [connect(address), connect(address)]
    for c in kept:
        assert c.noop().status == OK
    assert connect(address).closed_within(2)
    kept[0].close()
    wait_for(lambda: _served(address), 3)


def _served(address) -> bool:
    with CounterClient(address) as c:
        try:
            return c.noop().status == OK
        except (AssertionError, OSError):
            return False


# -- zstalk serve ----------------------------------------------------------------------

def test_zstalk_serve_runs_a_counter_front_beside_the_beanstalk_one(zstalk_factory, connect):
    server = zstalk_factory(counter=True)
    a, b = connect(server.counter_address), connect(server.counter_address)
    assert a.acquire(b"serve", 3, 4).status == OK
    assert b.acquire(b"serve", 2, 4).status == NOT_AVAILABLE
    assert client_sees(server.address, b"list-tube-used\r\n") == b"USING default\r\n"
    a.close()
    wait_for(lambda: consumption(b, b"serve") == 0, 2)


def client_sees(address, line: bytes) -> bytes:
    with socket.create_connection(address, timeout=5) as s:
        s.sendall(line)
        return s.recv(1024)


def test_zstalk_serve_on_a_busy_counter_port_fails_with_address_in_use():
    with socket.socket() as busy:
        busy.bind((LOOPBACK, 0))
        busy.listen(1)
        result = subprocess.run(
            [find_zstalk(), "serve", "-l", LOOPBACK, "-p", str(free_port()),
             "--counter-port", str(busy.getsockname()[1])],
            capture_output=True, text=True, timeout=30)
    assert result.returncode == 111
    assert "Address already in use" in result.stderr


def test_zstalk_serve_restarts_a_counter_front_killed_with_9(zstalk_factory, connect):
    server = zstalk_factory(counter=True, extra_args=["--fronts", "1"])
    holder = connect(server.counter_address)
    assert holder.acquire(b"again", 5, 5).status == OK
    os.kill(_child_running(server.pid, b"counter"), signal.SIGKILL)
    assert holder.closed_within(2)
    # the supervisor starts a new counter front on the same socket; the broker released
    # the dead front's holdings by heartbeat
    wait_for(lambda: _served(server.counter_address), 5, step=0.1)
    fresh = connect(server.counter_address)
    wait_for(lambda: fresh.acquire(b"again", 5, 5).status == OK, 5, step=0.1)


def _child_running(parent: int, word: bytes) -> int:
    for task in Path(f"/proc/{parent}/task").glob("*/children"):
        for pid in task.read_text().split():
            if word in Path(f"/proc/{pid}/cmdline").read_bytes():
                return int(pid)
    raise AssertionError(f"no child of {parent} runs {word!r}")
