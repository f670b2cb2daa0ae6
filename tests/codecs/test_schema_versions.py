"""Schema version skew: a broker takes peers older schema versions (a rolling update
updates the broker first), answers them in their version, and says clearly when a peer
is too old or too new, without filling its log.  Units on the schema module, then a real
broker process and raw ZeroMQ peers speaking other versions."""
from __future__ import annotations

import os
import time

import msgpack
import pytest
import zmq

from servers import LOOPBACK, ServerProcess, find_zstalk, free_port, self_check
from zstalk.protocol.schema import (FUNCTION_SEARCH_SINCE, OLDEST_PEER_VERSION, OPERATOR_SINCE,
                                    PEEK_SINCE, PEERS_SINCE, POSITIONS_SINCE, ROOMS_SINCE,
                                    SCHEMA_VERSION, NotLeader, Op, R, Replies, SchemaError,
                                    Settings, Stopping, Welcome, decode, decode_peer, encode)

V1, V2, V3, V4, V5, V6, V7, V8 = 1, 2, 3, 4, 5, 6, 7, 8
HELLO, BATCH = 1, 3


def packed(version: int, kind: int, *fields) -> bytes:
    return msgpack.packb((version, kind, *fields), use_bin_type=True)


# -- the schema module -----------------------------------------------------------------------
def test_this_version_takes_peers_back_to_version_1():
    assert (SCHEMA_VERSION, OLDEST_PEER_VERSION) == (9, 1)


def test_the_operators_ops_came_with_version_8_and_a_version_7_batch_is_taken_as_it_is():
    assert OPERATOR_SINCE == 8
    ops = [(Op.T_INFO, 1, "u", True, None), (Op.T_CANCEL, 1, "u", None)]
    version, msg = decode_peer(packed(V7, BATCH, ops))
    assert version == V7 and [tuple(op) for op in msg.ops] == ops



def test_a_version_6_front_reads_and_cancels_by_the_master_key_as_it_did():
    # (no task token before version 7: the trailing field is None, the key decides)
    ops = [(Op.T_INFO, 1, "u", False), (Op.T_CANCEL, 1, "u"),
           (Op.T_ENQUEUE, 1, "f", b"{}", None, "u", True, {"type": "online"})]
    version, msg = decode_peer(packed(V6, BATCH, ops))
    assert version == V6 and [tuple(op) for op in msg.ops] == [
        (Op.T_INFO, 1, "u", False, None), (Op.T_CANCEL, 1, "u", None), ops[2]]


def test_a_version_6_peer_is_still_told_where_the_leader_is():
    assert msgpack.unpackb(encode(NotLeader("tcp://10.0.0.2:11400", 3), V6)) == [
        V6, *msgpack.unpackb(encode(NotLeader("tcp://10.0.0.2:11400", 3)))[1:]]


def test_a_standby_tells_a_peer_of_this_version_where_the_leader_is():
    assert decode(encode(NotLeader("tcp://10.0.0.2:11400", 3))) == \
        NotLeader("tcp://10.0.0.2:11400", 3)
    assert decode(encode(NotLeader("", 0))) == NotLeader("", 0), "none known yet"


@pytest.mark.parametrize("version", [V1, V2, V3, V4, V5])
def test_a_peer_older_than_version_6_is_not_told_anything_by_a_standby(version):
    assert encode(NotLeader("tcp://10.0.0.2:11400", 3), version) is None


@pytest.mark.parametrize("version, fields", [(V5, 7), (V6, 7), (V7, 8), (V8, 9)])
def test_a_version_5_or_6_peer_gets_settings_without_the_group_headers_7_without_trust_8_rooms(
        version, fields):
    # (a peer builds Settings from every field it gets: one more would not fit)
    welcome = Welcome(7, 9, ORIGINS, True)
    without = welcome._replace(settings=tuple(ORIGINS[:fields]))
    assert msgpack.unpackb(encode(welcome, version)) == [
        version, *msgpack.unpackb(encode(without))[1:]]
    assert msgpack.unpackb(encode(ORIGINS, version))[2:] == \
        msgpack.unpackb(encode(ORIGINS))[2:2 + fields]


def test_a_version_7_batch_is_taken_as_it_is_and_positions_came_with_version_8():
    ops = [(Op.T_INFO, 1, "u", False, b"d" * 32), (Op.T_CANCEL, 1, "u", None),
           (Op.T_ENQUEUE, 1, "f", b"{}", None, "u", True, {"type": "online"})]
    version, msg = decode_peer(packed(V7, BATCH, ops))
    assert version == V7 and [tuple(op) for op in msg.ops] == ops
    # (a front of version 8 reaches no version-7 broker: it refuses it as too new, so a
    # front never sends T_POSITIONS to a broker that does not know it)
    assert POSITIONS_SINCE == 8 and Op.T_POSITIONS == 64


def test_the_dashboards_peek_peers_and_function_search_came_with_version_9_in_their_op_numbers():
    # (only an HTTP front sends V_PEEK, V_PEERS and V_FUNCTIONS, and a front reaches no older
    # broker: it refuses one as too new, so it never sends them where they mean nothing)
    assert PEEK_SINCE == PEERS_SINCE == FUNCTION_SEARCH_SINCE == SCHEMA_VERSION == 9
    assert (Op.V_PEEK, Op.V_PEERS, Op.V_FUNCTIONS) == (90, 91, 92)


def test_the_waiting_pages_came_with_version_9_and_a_version_8_batch_is_taken_as_it_is():
    # (a version-8 front is sent nine Settings fields, without rooms: it serves no page)
    assert ROOMS_SINCE == SCHEMA_VERSION == 9 and Settings._fields[9] == "rooms"
    ops = [(Op.T_POSITIONS, 1, ["u"]), (Op.T_INFO, 1, "u", False, b"d" * 32)]
    version, msg = decode_peer(packed(V8, BATCH, ops))
    assert version == V8 and [tuple(op) for op in msg.ops] == ops


def test_a_version_5_batch_is_taken_as_it_is():
    ops = [(Op.T_ENQUEUE, 1, "f", b"{}", None, "u", False, None), (Op.PUT, 1, 0, 0, 60, b"x")]
    version, msg = decode_peer(packed(V5, BATCH, ops))
    assert version == V5 and [tuple(op) for op in msg.ops] == ops


def test_a_version_2_peer_gets_everything_but_the_stopping_handshake():
    welcome = Welcome(7, 9, Settings(), True)
    assert msgpack.unpackb(encode(welcome, V2)) == [V2, *msgpack.unpackb(encode(welcome, V4))[1:]]
    assert encode(Stopping(7, False), V2) is None and encode(Stopping(7, True), V1) is None
    ops = [(Op.T_SUBSCRIBE, 1, 0, True), (Op.PUT, 1, 0, 0, 60, b"x")]
    version, msg = decode_peer(packed(V2, BATCH, ops))
    assert version == V2 and [tuple(op) for op in msg.ops] == ops


def test_a_version_1_batch_gets_the_fields_version_2_added():
    ops = [(Op.T_ENQUEUE, 1, "f", b"{}", None, "u"), (Op.T_INFO, 1, "u"),
           (Op.T_SUBSCRIBE, 1, 0), (Op.T_SUBSCRIBE, 1, 8), (Op.PUT, 1, 0, 0, 60, b"x")]
    version, msg = decode_peer(packed(V1, BATCH, ops))
    assert version == V1
    assert [tuple(op) for op in msg.ops] == [
        (Op.T_ENQUEUE, 1, "f", b"{}", None, "u", True, None), (Op.T_INFO, 1, "u", True, None),
        (Op.T_SUBSCRIBE, 1, 0, True), (Op.T_SUBSCRIBE, 1, 8, False), (Op.PUT, 1, 0, 0, 60, b"x")]


def test_a_version_3_batch_gets_the_ext_slots_and_no_retry_after_as_minus_one():
    ops = [(Op.T_ENQUEUE, 1, "f", b"{}", None, "u", True),
           (Op.T_OUTCOME, 1, "u", 1, "failure", 429, None, "HTTP 429", 0),
           (Op.T_OUTCOME, 1, "u", 2, "failure", 503, None, "HTTP 503", 7000)]
    version, msg = decode_peer(packed(V3, BATCH, ops))
    assert version == V3 and [tuple(op) for op in msg.ops] == [
        (Op.T_ENQUEUE, 1, "f", b"{}", None, "u", True, None),
        (Op.T_OUTCOME, 1, "u", 1, "failure", 429, None, "HTTP 429", -1, None),
        (Op.T_OUTCOME, 1, "u", 2, "failure", 503, None, "HTTP 503", 7000, None)]


@pytest.mark.parametrize("version", [V1, V2, V3])
def test_a_dispatcher_older_than_version_4_gets_its_calls_without_the_ext(version):
    call = (1, R.T_CALL, "u", 1, "http://fn/f", b"{}", 15000, {"result_headers": ["ETag"]})
    replies = msgpack.unpackb(encode(Replies([call]), version))
    assert replies == [version, 4, [[1, R.T_CALL, "u", 1, "http://fn/f", b"{}", 15000]]]
    assert msgpack.unpackb(encode(Replies([call])))[2] == [list(call)]


@pytest.mark.parametrize("version", [V1, V3, V4, 7])
def test_a_dispatcher_older_than_version_8_is_never_sent_an_abort(version):
    replies = Replies([(1, R.T_ABORT, "t1", 1), (1, R.T_ERROR, "not_found", "no task")])
    items = msgpack.unpackb(encode(replies, version))[2]
    assert [item[1] for item in items] == [R.T_ERROR]
    assert msgpack.unpackb(encode(replies))[2][0] == [1, R.T_ABORT, "t1", 1]


ORIGINS = Settings(65535, 200, 300, True, False, {"shop": ["https://shop.example"]},
                   ["https://shop.example"])


def test_settings_carry_the_cors_origins_to_a_front_of_this_version():
    assert decode(encode(ORIGINS)) == ORIGINS
    assert decode(encode(Welcome(7, 9, ORIGINS, True))).settings == ORIGINS


@pytest.mark.parametrize("version", [V2, V3, V4])
def test_a_peer_older_than_version_5_gets_settings_without_the_cors_origins(version):
    # (such a peer builds Settings from every field it gets: a sixth would fail it)
    assert msgpack.unpackb(encode(ORIGINS, version)) == [version, 7, 65535, 200, 300, True,
                                                         False]
    welcome = msgpack.unpackb(encode(Welcome(7, 9, ORIGINS, True), version))
    assert welcome == [version, 2, 7, 9, [65535, 200, 300, True, False], True]


def test_a_version_4_batch_is_taken_as_it_is():
    ops = [(Op.T_ENQUEUE, 1, "f", b"{}", None, "u", False, {"type": "online"}),
           (Op.T_DONE, 1, "u"), (Op.T_INFO, 1, "u", True, None), (Op.T_CANCEL, 1, "u", None)]
    version, msg = decode_peer(packed(V4, BATCH, [*ops[:2], ops[2][:4], ops[3][:3]]))
    assert version == V4 and [tuple(op) for op in msg.ops] == ops


def test_a_version_3_peer_still_gets_the_stopping_handshake():
    assert msgpack.unpackb(encode(Stopping(7, False), V3)) == [V3, 8, 7, False]


def test_a_version_1_peer_is_answered_in_version_1():
    welcome = msgpack.unpackb(encode(Welcome(7, 9, Settings(), True), V1))
    assert welcome == [V1, 2, 7, 9, [65535], True]              # a one-field Settings
    assert encode(Settings(), V1) is None                       # it has no Settings message
    replies = msgpack.unpackb(encode(Replies([(1, R.T_NOTED, "u", 1),
                                              (1, R.T_ERROR, "duplicate", "taken"),
                                              (1, R.INSERTED, 5)]), V1))
    assert replies == [V1, 4, [[1, R.T_ERROR, 409, "duplicate", "taken"], [1, R.INSERTED, 5]]]


@pytest.mark.parametrize("version, words", [(SCHEMA_VERSION + 1, "too new"), (0, "too old"),
                                            ("2", "too new")])
def test_a_peer_too_old_or_too_new_is_refused_by_name(version, words):
    with pytest.raises(SchemaError, match=words):
        decode_peer(packed(version, BATCH, []))


def test_fronts_and_clients_take_only_their_own_version_from_a_broker():
    with pytest.raises(SchemaError, match="too old"):
        decode(packed(V1, BATCH, []))


# -- a real broker ---------------------------------------------------------------------------
needs_zstalk = pytest.mark.skipif(self_check(), reason="needs zstalk")


@pytest.fixture
def broker():
    port = free_port()
    proc = ServerProcess([find_zstalk(), "broker", "--bind", f"tcp://{LOOPBACK}:{port}"],
                         (LOOPBACK, port), name="versions-broker").start()
    proc.endpoint = f"tcp://{LOOPBACK}:{port}"
    yield proc
    proc.stop()


def peer(endpoint: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, os.urandom(8))
    sock.connect(endpoint)
    return sock


def answer(sock: zmq.Socket, wait_s: float = 3.0):
    return msgpack.unpackb(sock.recv()) if sock.poll(int(wait_s * 1000)) else None


@needs_zstalk
def test_a_version_1_producer_puts_a_job_through_a_version_2_broker(broker):
    sock = peer(broker.endpoint)
    try:
        sock.send(packed(V1, HELLO, 1, "client", os.getpid(), 0, []))
        welcome = answer(sock)
        assert welcome[:2] == [V1, 2] and welcome[4] == [65535]
        sock.send(packed(V1, BATCH, [[Op.OPEN, 1], [Op.PUT, 1, 0, 0, 60, b"old"]]))
        replies = answer(sock)
        assert replies[:2] == [V1, 4] and replies[2][0][1] == R.INSERTED
    finally:
        sock.close()
    assert "speaks schema version 1" in broker.output()


@needs_zstalk
def test_a_peer_too_new_gets_nothing_and_is_named_in_the_log_once(broker):
    sock = peer(broker.endpoint)
    try:
        for _ in range(20):
            sock.send(packed(SCHEMA_VERSION + 1, HELLO, 1, "client", os.getpid(), 0, []))
        assert answer(sock, 1.0) is None
    finally:
        sock.close()
    deadline = time.monotonic() + 5
    while "too new" not in broker.output():
        assert time.monotonic() < deadline, broker.output()
        time.sleep(0.05)
    assert broker.output().count("too new") == 1 and broker.running


WELCOME, REPLIES, SETTINGS = 2, 4, 7


def next_of(sock: zmq.Socket, kind: int) -> list:
    """The next message of that kind (heartbeats come every 0.5 s in between)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        msg = answer(sock, deadline - time.monotonic())
        if msg is not None and msg[1] == kind:
            return msg
    raise AssertionError(f"no message of kind {kind} within 5 s")


@needs_zstalk
def test_a_version_4_http_front_gets_five_settings_fields_in_welcome_and_after_sighup(tmp_path):
    import signal
    config = tmp_path / "zstalk.toml"
    room = '[functions.shop]\nonline = "only"\n'
    config.write_text(room + 'allow_origins = ["https://shop.example"]\n')
    keys = tmp_path / "passes"          # (a room's passes: the fronts', checked here too)
    keys.write_text(f"k1:{'k' * 40}\n")
    keys.chmod(0o400)
    port = free_port()
    broker = ServerProcess([find_zstalk(), "broker", "--bind", f"tcp://{LOOPBACK}:{port}",
                            "--config", str(config), "--pass-key-file", str(keys)],
                           (LOOPBACK, port),
                           name="versions-broker").start()
    old, new = peer(f"tcp://{LOOPBACK}:{port}"), peer(f"tcp://{LOOPBACK}:{port}")
    try:
        old.send(packed(V4, HELLO, 1, "http", os.getpid(), 0, []))
        new.send(packed(SCHEMA_VERSION, HELLO, 2, "http", os.getpid(), 0, []))
        assert next_of(old, WELCOME)[4] == [65535, 1 << 20, 1 << 20, False, False]
        assert next_of(new, WELCOME)[4][5:] == [{"shop": ["https://shop.example"]},
                                                ["https://shop.example"], [], False,
                                                {"shop": ["", 300_000]}]
        old.send(packed(V4, BATCH, [[Op.OPEN, 1], [Op.T_ENQUEUE, 1, "shop", b"{}", None, "u",
                                                   False, {"type": "online"}]]))
        [[_, code, info]] = next_of(old, REPLIES)[2]
        # (admitted at once, in the same turn: its answer says so, as a GET would)
        assert (code, info["status"]) == (R.T_TASK, "admitted"), "it works as before"
        config.write_text(room + 'allow_origins = ["https://other.example"]\n')
        broker.process.send_signal(signal.SIGHUP)
        assert next_of(old, SETTINGS) == [V4, 7, 65535, 1 << 20, 1 << 20, False, False]
        assert next_of(new, SETTINGS)[-5:] == [{"shop": ["https://other.example"]},
                                               ["https://other.example"], [], False,
                                               {"shop": ["", 300_000]}]
    finally:
        old.close()
        new.close()
        broker.stop()
