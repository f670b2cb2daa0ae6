"""A standby's door (broker/standby.py): what it answers, as a pure function, then a real
door on loopback with raw ZeroMQ peers of this schema version and of version 5, and the
hand-over of its socket to a broker actor (no NATS: the leader's address is given)."""
from __future__ import annotations

import os
import time

import msgpack
import pytest
import zmq

from servers import LOOPBACK, free_port
from zstalk.broker.standby import Door, answer
from zstalk.protocol.schema import (SCHEMA_VERSION, Batch, Fenced, Heartbeat, Hello, NotLeader,
                                    Op)

HELLO, WELCOME, NOT_LEADER, FENCED = 1, 2, 10, 6
LEADER = ("tcp://10.0.0.7:11400", 3)


def hello(front_id: int = 5) -> Hello:
    return Hello(front_id, "pool", os.getpid(), 0, [])


def test_a_hello_of_this_version_is_told_where_the_leader_is():
    assert answer(b"p" * 8, SCHEMA_VERSION, hello(), LEADER, 99) == NotLeader(*LEADER)


def test_a_hello_while_no_leader_is_known_is_told_so():
    assert answer(b"p" * 8, SCHEMA_VERSION, hello(), ("", 3), 99) == NotLeader("", 3)


@pytest.mark.parametrize("version", [1, 4, 5])
def test_a_hello_of_a_version_without_not_leader_gets_nothing(version):
    assert answer(b"p" * 8, version, hello(), LEADER, 99) is None


def test_a_peer_of_the_broker_that_ran_here_before_is_fenced_so_it_starts_over_at_once():
    peer = (1234).to_bytes(8, "big")
    assert answer(peer, SCHEMA_VERSION, Heartbeat(1234), LEADER, 99) == Fenced(1234, 99)
    assert answer(peer, SCHEMA_VERSION, Batch([(Op.OPEN, 1)]), LEADER, 99) == Fenced(1234, 99)


# -- a real door ----------------------------------------------------------------------------
@pytest.fixture
def door():
    endpoint = f"tcp://{LOOPBACK}:{free_port()}"
    d = Door([endpoint], lambda: LEADER, keys=None).start()
    yield d
    d.close()


def peer(endpoint: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, os.urandom(8))
    sock.connect(endpoint)
    return sock


def ask(sock: zmq.Socket, version: int, wait_s: float = 3.0):
    sock.send(msgpack.packb((version, HELLO, 5, "pool", os.getpid(), 0, [])))
    return msgpack.unpackb(sock.recv()) if sock.poll(int(wait_s * 1000)) else None


def test_a_door_tells_a_peer_of_this_version_the_leader_and_one_of_version_5_nothing(door):
    new, old = peer(door.endpoints[0]), peer(door.endpoints[0])
    try:
        assert ask(new, SCHEMA_VERSION) == [SCHEMA_VERSION, NOT_LEADER, *LEADER]
        assert ask(old, 5, wait_s=1.5) is None
    finally:
        new.close()
        old.close()


def test_a_door_hands_its_socket_over_and_a_hello_waiting_there_is_welcomed(door):
    from zstalk.broker.actor import BrokerActor
    from zstalk.broker.core.broker import Config
    sock = peer(door.endpoints[0])
    try:
        assert ask(sock, SCHEMA_VERSION)[1] == NOT_LEADER
        router, endpoints = door.hand_over()
        sock.send(msgpack.packb((SCHEMA_VERSION, HELLO, 5, "pool", os.getpid(), 0, [])))
        time.sleep(0.2)                     # (waiting in the socket, read by nobody)
        actor = BrokerActor(None, Config(), keys=None)
        actor.adopt(router, endpoints)      # (the door's close() then closes a closed socket)
        import threading
        thread = threading.Thread(target=actor.run, kwargs={"signals": False}, daemon=True)
        thread.start()
        try:
            got = msgpack.unpackb(sock.recv()) if sock.poll(5000) else None
            assert got is not None and got[:2] == [SCHEMA_VERSION, WELCOME], got
            assert actor.endpoints == endpoints
        finally:
            actor.stop()
            thread.join(5)
    finally:
        sock.close()


def test_a_producer_given_a_silent_endpoint_and_a_standby_reaches_the_leader_through_them():
    from zstalk.broker.testing import LocalBroker
    from zstalk.workers import Client
    leader = LocalBroker()
    door = Door([f"tcp://{LOOPBACK}:{free_port()}"], lambda: (leader.endpoint, 2),
                ctx=leader.ctx, keys=None).start()
    nobody = f"tcp://{LOOPBACK}:{free_port()}"
    try:
        with Client(f"{nobody},{door.endpoints[0]}", timeout_s=10, ctx=leader.ctx) as c:
            started = time.monotonic()
            job_id = c.put(b"sent on")
            assert time.monotonic() - started < 5.0     # (2 s on the silent one at most)
            assert c.peek(job_id) == (job_id, b"sent on")
    finally:
        door.close()
        leader.close()
