"""The counter front in-process: a fake link and a fake transport stand in for the broker
and the client, so each rule of protocol/fronts/counter.py is checked exactly (reply
order, the holdings tally, settling requests in flight when the broker is lost, failing
closed, closing)."""
from __future__ import annotations

import asyncio

import pytest

from servers import acquire_request, counter_request, get_request, release_request
from zstalk.protocol.fronts.counter import CounterFront
from zstalk.protocol.links.owner import CONNECTING, READY
from zstalk.protocol.schema import Op, R, SessionState
from zstalk.protocol.codecs.yrmcds import (HEADER, Opcode, Status, acquire_response,
                                           dump_response, error_response, get_response,
                                           noop_response, release_response, stats_response)


class FakeLink:
    def __init__(self) -> None:
        self.state = READY
        self.ops: list[tuple] = []
        self.broker_id = 1          # it has reached a broker (0: never yet)

    @property
    def fail_closed(self) -> bool:      # as BrokerLink's
        return self.state is not READY and self.broker_id != 0

    def gather(self) -> None:
        pass

    def read_done(self) -> None:
        pass

    def submit(self, op: tuple) -> None:
        self.ops.append(op)

    def flush_now(self) -> None:
        pass

    def close(self) -> None:
        pass


class FakeTransport:
    def __init__(self) -> None:
        self.written = b""
        self.closed = False
        self.reading = True

    def get_extra_info(self, name):
        return None

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def write(self, data: bytes) -> None:
        assert not self.closed, "write after close"
        self.written += data

    def close(self) -> None:
        self.closed = True

    abort = close

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


@pytest.fixture
def front():
    async def build() -> CounterFront:
        return CounterFront("tcp://127.0.0.1:1")    # the link is never started

    front = asyncio.run(build())
    front.link = FakeLink()
    return front


def connect(front: CounterFront):
    conn = front.protocol_factory()
    transport = FakeTransport()
    conn.connection_made(transport)
    return conn, transport


def take(transport: FakeTransport) -> bytes:
    data, transport.written = transport.written, b""
    return data


def test_each_request_is_one_op_and_replies_keep_request_order(front):
    conn, transport = connect(front)
    conn.data_received(acquire_request(b"a", 2, 10, 1) + HEADER.pack(0x80, 0, 0, 0, 0, 2)
                       + get_request(b"a", 3) + counter_request(Opcode.STATS, opaque=4)
                       + counter_request(Opcode.DUMP, opaque=5))
    assert front.link.ops == [(Op.OPEN, conn.conn), (Op.C_ACQUIRE, conn.conn, b"a", 2, 10),
                              (Op.C_GET, conn.conn, b"a"), (Op.C_STATS, conn.conn),
                              (Op.C_DUMP, conn.conn)]
    assert take(transport) == b""                        # the bad magic waits its turn
    front.on_replies([(conn.conn, R.C_OK, 2), (conn.conn, R.C_OK, 2),
                      (conn.conn, R.STATS, [["objects", 1]]),
                      (conn.conn, R.C_DUMP, [[b"a", 2, 2]])])
    assert take(transport) == (acquire_response(1, 2) + error_response(0, 2, Status.INVALID)
                               + get_response(3, 2) + stats_response(4, [("objects", 1)])
                               + dump_response(5, [(b"a", 2, 2)]))


def test_the_tally_mirrors_successful_acquires_and_releases(front):
    conn, _ = connect(front)
    conn.data_received(acquire_request(b"x", 5, 10) + acquire_request(b"y", 1, 1)
                       + acquire_request(b"x", 9, 10) + release_request(b"x", 2)
                       + release_request(b"y", 1))
    front.on_replies([(conn.conn, R.C_OK, 5), (conn.conn, R.C_OK, 1), (conn.conn, R.C_ERROR, 0x21),
                      (conn.conn, R.C_OK, None), (conn.conn, R.C_OK, None)])
    assert conn.holds == {b"x": 3}
    front.on_lost()
    assert front.session_states() == [SessionState(conn.conn, "", [], [], [(b"x", 3)])]


def test_losing_the_broker_settles_requests_in_flight_against_the_tally(front):
    conn, transport = connect(front)
    conn.data_received(acquire_request(b"x", 4, 10, 1))
    front.on_replies([(conn.conn, R.C_OK, 4)])
    take(transport)
    conn.data_received(release_request(b"x", 1, 2) + acquire_request(b"x", 1, 10, 3)
                       + get_request(b"x", 4) + release_request(b"x", 9, 5))
    front.link.ops.clear()
    front.link.state = CONNECTING
    front.on_lost()
    # the Release counts now (the Hello lists 3), the Acquire failed closed, the Get is asked again
    assert front.session_states()[0].holds == [(b"x", 3)]
    assert front.link.ops == [(Op.C_GET, conn.conn, b"x")]
    assert take(transport) == release_response(2) + error_response(Opcode.ACQUIRE, 3, 0x21)
    front.link.state = READY
    front.on_replies([(conn.conn, R.C_OK, 3)])
    assert take(transport) == get_response(4, 3) + error_response(Opcode.RELEASE, 5, 0x22)


def test_acquire_fails_closed_at_once_while_the_link_to_a_broker_it_had_is_down(front):
    conn, transport = connect(front)
    front.link.state = CONNECTING
    conn.data_received(acquire_request(b"x", 1, 10, 7) + counter_request(Opcode.NOOP, opaque=8))
    assert front.link.ops == [(Op.OPEN, conn.conn), (Op.C_NOOP, conn.conn)]
    assert take(transport) == error_response(Opcode.ACQUIRE, 7, Status.RESOURCE_NOT_AVAILABLE)
    front.on_replies([(conn.conn, R.C_OK, None)])
    assert take(transport) == noop_response(8)


def test_acquire_waits_for_the_link_while_the_front_has_never_reached_a_broker(front):
    conn, transport = connect(front)
    front.link.state, front.link.broker_id = CONNECTING, 0
    conn.data_received(acquire_request(b"x", 1, 10, 7))
    assert front.link.ops == [(Op.OPEN, conn.conn), (Op.C_ACQUIRE, conn.conn, b"x", 1, 10)]
    assert take(transport) == b""
    front.on_replies([(conn.conn, R.C_OK, 1)])
    assert take(transport) == acquire_response(7, 1)


def test_a_request_the_broker_cannot_answer_closes_the_connection_after_earlier_replies(front):
    conn, transport = connect(front)
    conn.data_received(counter_request(Opcode.NOOP, opaque=1) + get_request(b"x", 2)
                       + counter_request(Opcode.NOOP, opaque=3))
    front.on_replies([(conn.conn, R.C_OK, None), (conn.conn, R.INTERNAL_ERROR)])
    assert transport.written == noop_response(1) and transport.closed
    assert front.link.ops[-1] == (Op.CLOSE, conn.conn) and conn.conn not in front.conns


def test_a_too_large_frame_gets_no_reply_and_closes_after_the_replies_owed(front):
    conn, transport = connect(front)
    conn.data_received(counter_request(Opcode.NOOP, opaque=1) + HEADER.pack(0x90, 1, 0, 0, 2**32 - 1, 2))
    assert not transport.reading and not transport.closed
    front.on_replies([(conn.conn, R.C_OK, None)])
    assert transport.written == noop_response(1) and transport.closed
    assert front.link.ops[-1] == (Op.CLOSE, conn.conn)


def test_eof_answers_whole_frames_drops_a_partial_one_then_closes(front):
    conn, transport = connect(front)
    conn.data_received(counter_request(Opcode.NOOP, opaque=1) + b"\x90\x00\x00")
    conn.eof_received()
    assert not transport.closed
    front.on_replies([(conn.conn, R.C_OK, None)])
    assert transport.written == noop_response(1) and transport.closed


def test_beyond_max_connections_a_connection_is_accepted_then_closed(front):
    front.max_connections = 1
    _, first = connect(front)
    second_conn, second = connect(front)
    assert not first.closed and second.closed
    assert (Op.OPEN, second_conn.conn) not in front.link.ops
