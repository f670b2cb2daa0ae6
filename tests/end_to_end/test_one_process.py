"""One process by default: `zstalk serve` runs the broker and its fronts on one event loop,
the fronts reaching the broker through the in-process mailbox; and what a front does when
it starts before a broker exists (it waits, it does not refuse).

The mailbox itself is exercised first, in-process on a real broker actor; then the
programs, as real processes on loopback.
"""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time

import pytest

from servers import (LOOPBACK, RawClient, ServerProcess, children_of, find_zstalk, free_port,
                     self_check)

pytestmark = pytest.mark.skipif(self_check(), reason="tests zstalk's own placement")

ZSTALK = find_zstalk()


# -- the mailbox, in-process ----------------------------------------------------------

class Owner:
    """A front's side of a link, recording what comes back."""

    def __init__(self) -> None:
        self.replies: list[tuple] = []
        self.welcomed = 0

    def on_replies(self, items):
        self.replies.extend(items)

    def on_welcome(self, welcome):
        self.welcomed += 1

    def on_lost(self):
        raise AssertionError("a local link is never lost")

    def on_fenced(self):
        raise AssertionError("not fenced here")

    def session_states(self):
        return []


def _with_local_broker(body):
    from zstalk.broker.actor import BrokerActor
    from zstalk.broker.core.broker import Config
    from zstalk.protocol.links import open_link

    async def main():
        actor = BrokerActor(None, Config())
        actor.start()
        address = actor.expose(f"test-{os.getpid()}-{id(actor)}")
        owner = Owner()
        link = open_link(address, "beanstalk", owner)
        link.start()
        try:
            return await body(actor, link, owner)
        finally:
            link.close()
            actor.close()

    return asyncio.run(main())


def test_a_local_link_is_welcomed_and_answered_within_the_read_that_sent_the_command():
    from zstalk.protocol.schema import Op, R

    async def body(actor, link, owner):
        assert owner.welcomed == 1 and link.state == "ready"
        link.gather()
        link.submit((Op.OPEN, 1))
        link.submit((Op.PUT, 1, 0, 0, 60, b"hello"))
        assert owner.replies == [], "ops wait for the end of the read"
        link.read_done()
        return list(owner.replies)

    assert _with_local_broker(body) == [(1, R.INSERTED, 1)]


def test_the_first_read_of_a_loop_turn_is_answered_at_once_and_later_ones_at_its_end():
    from zstalk.protocol.schema import Op, R

    async def body(actor, link, owner):
        link.gather()
        link.submit((Op.OPEN, 1))
        link.submit((Op.PUT, 1, 0, 0, 60, b"first"))
        link.read_done()
        first = list(owner.replies)
        link.gather()
        link.submit((Op.PUT, 1, 0, 0, 60, b"second"))
        link.read_done()
        held = list(owner.replies)
        await asyncio.sleep(0)
        return first, held, list(owner.replies)

    first, held, after = _with_local_broker(body)
    assert first == [(1, R.INSERTED, 1)]
    assert held == first, "a second read in the same turn waits for the turn's end"
    assert after == [(1, R.INSERTED, 1), (1, R.INSERTED, 2)]


def test_a_message_that_cannot_be_encoded_is_dropped_and_the_next_one_arrives_whole():
    import zmq

    from zstalk.broker.actor import BrokerActor
    from zstalk.broker.core.broker import Config
    from zstalk.protocol.schema import R, Replies, decode

    ctx = zmq.Context()
    actor = BrokerActor(f"inproc://encode-{os.getpid()}", Config(), ctx=ctx)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, b"front-01")
    dealer.connect(actor.endpoint)
    try:
        dealer.send(b"hello")                   # (the ROUTER learns the peer)
        assert actor.sock.recv_multipart() == [b"front-01", b"hello"]
        actor._send([(b"front-01", Replies([(1, R.T_TASK, {"error": "\ud800"})])),
                     (b"front-01", Replies([(1, R.T_ERROR, "not_found", "fine")]))])
        assert dealer.poll(5000)
        assert decode(dealer.recv()) == Replies([[1, R.T_ERROR, "not_found", "fine"]])
        assert not dealer.poll(100), "nothing else, no stray peer frame"
    finally:
        dealer.close(0)
        actor.sock.close(0)
        ctx.term()


def test_a_socket_read_scheduled_before_the_broker_closes_is_dropped():
    from zstalk.broker.actor import BrokerActor
    from zstalk.broker.core.broker import Config

    async def main():
        errors = []
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: errors.append(context))
        actor = BrokerActor(f"inproc://closing-{os.getpid()}", Config())
        actor.start()
        actor._read_scheduled = True
        loop.call_soon(actor._on_readable)      # as _check_socket leaves it
        actor.close()
        await asyncio.sleep(0.01)
        return errors

    assert asyncio.run(main()) == []


def test_ops_submitted_outside_a_read_leave_at_the_end_of_the_loop_turn():
    from zstalk.protocol.schema import Op, R

    async def body(actor, link, owner):
        link.submit((Op.OPEN, 1))
        link.submit((Op.PUT, 1, 0, 0, 60, b"x"))
        assert owner.replies == []
        await asyncio.sleep(0)
        return list(owner.replies)

    assert _with_local_broker(body) == [(1, R.INSERTED, 1)]


def test_a_local_front_is_never_declared_dead_however_long_the_loop_stalls():
    from zstalk.protocol.schema import PEER_TIMEOUT_S, Op, R

    async def body(actor, link, owner):
        link.submit((Op.OPEN, 1))
        link.submit((Op.PUT, 1, 0, 0, 60, b"x"))
        link.submit((Op.RESERVE, 1, 0))
        link.flush_now()
        time.sleep(PEER_TIMEOUT_S + 0.5)        # a GC pause, a slow disk: the loop stalls
        await asyncio.sleep(0.6)                # timers and heartbeats run again
        link.submit((Op.DELETE, 1, 1))
        link.flush_now()
        return list(owner.replies)

    replies = _with_local_broker(body)
    assert replies[-1] == (1, R.DELETED), replies


def test_a_local_address_nobody_registered_is_an_error_that_names_it():
    from zstalk.protocol.links import open_link

    async def main():
        with pytest.raises(ValueError, match="local:nobody"):
            open_link("local:nobody", "beanstalk", Owner())

    asyncio.run(main())


# -- the programs ---------------------------------------------------------------------

def _serve(extra=(), counter_port: int = 0):
    port = free_port()
    argv = [ZSTALK, "serve", "-l", LOOPBACK, "-p", str(port), "--counter-port", str(counter_port),
            *extra]
    return ServerProcess(argv, (LOOPBACK, port), name="zstalk-serve").start()


def test_zstalk_serve_is_one_process_by_default():
    with _serve() as server:
        with RawClient(server.address) as c:
            c.send(b"put 0 0 60 2\r\nhi\r\nreserve\r\n")
            assert c.read_replies(2) == [b"INSERTED 1\r\n", b"RESERVED 1 2\r\nhi\r\n"]
        assert children_of(server.pid) == []


def first_line(*args: str) -> str:
    """What `zstalk serve ARGS` says first (its announcement); it then stops cleanly."""
    proc = subprocess.Popen([ZSTALK, "serve", "-l", LOOPBACK, *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        return proc.stderr.readline()
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


def test_a_worker_endpoint_given_as_host_and_port_is_a_tcp_endpoint():
    port, worker_port = free_port(), free_port()
    line = first_line("-p", str(port), "--counter-port", "0",
                      "--worker-bind", f"{LOOPBACK}:{worker_port}")
    assert f"workers on tcp://{LOOPBACK}:{worker_port}" in line


def test_zstalk_serve_says_on_start_what_listens_where():
    port, counter_port, worker_port = free_port(), free_port(), free_port()
    line = first_line("-p", str(port), "--counter-port", str(counter_port),
                      "--worker-bind", f"tcp://{LOOPBACK}:{worker_port}")
    assert f"beanstalk on {LOOPBACK}:{port}" in line
    assert f"counters on {LOOPBACK}:{counter_port}" in line
    assert f"workers on tcp://{LOOPBACK}:{worker_port}" in line


def test_a_stopped_and_continued_server_keeps_its_clients_and_their_jobs():
    """SIGSTOP for longer than the heartbeat timeout: the fronts share the broker's loop,
    so nothing is declared dead and the reserved job is still the client's."""
    with _serve() as server, RawClient(server.address, 10) as c:
        c.send(b"put 0 0 100 1\r\nx\r\nreserve\r\n")
        assert c.read_replies(2) == [b"INSERTED 1\r\n", b"RESERVED 1 1\r\nx\r\n"]
        os.kill(server.pid, signal.SIGSTOP)
        time.sleep(3.0)
        os.kill(server.pid, signal.SIGCONT)
        c.send(b"delete 1\r\n")
        assert c.read_reply() == b"DELETED\r\n"


def test_sigterm_stops_the_one_process_server_with_exit_0_and_keeps_the_binlog(tmp_path):
    wal = str(tmp_path / "wal")
    server = _serve(["-b", wal, "-f", "0"])
    with RawClient(server.address) as c:
        c.send(b"put 0 0 60 4\r\nkept\r\n")
        assert c.read_reply() == b"INSERTED 1\r\n"
    assert server.stop() == 0
    with _serve(["-b", wal]) as again, RawClient(again.address) as c:
        c.send(b"peek 1\r\n")
        assert c.read_reply() == b"FOUND 1 4\r\nkept\r\n"


def test_a_bind_error_names_the_address_and_the_port():
    with socket.socket() as busy:
        busy.bind((LOOPBACK, 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        out = subprocess.run([ZSTALK, "serve", "-l", LOOPBACK, "-p", str(port),
                              "--counter-port", "0"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 111
    assert f"{LOOPBACK}:{port}" in out.stderr and "Address already in use" in out.stderr
    assert "for beanstalk (-l, -p)" in out.stderr, out.stderr


# -- a remote front that starts before its broker -------------------------------------

def test_a_counter_front_started_before_its_broker_holds_an_acquire_until_it_comes():
    from servers import CounterClient

    broker_port, front_port = free_port(), free_port()
    endpoint = f"tcp://{LOOPBACK}:{broker_port}"
    front = ServerProcess([ZSTALK, "front", "counter", "--broker", endpoint, "--listen",
                           f"{LOOPBACK}:{front_port}"], (LOOPBACK, front_port),
                          name="counter-front", probe=None).start()
    try:
        with CounterClient((LOOPBACK, front_port), timeout=10) as client:
            client.send(acquire(b"sem", 1, 3, opaque=7))
            time.sleep(0.5)                     # the Acquire waits: no broker yet
            broker = ServerProcess([ZSTALK, "broker", "--bind", endpoint], (LOOPBACK, broker_port),
                                   name="broker").start()
            try:
                reply = client.read_response(timeout=8)
                assert reply is not None and reply.status == 0 and reply.opaque == 7, reply
                assert client.get(b"sem").status == 0
            finally:
                broker.stop()
    finally:
        front.stop()


def acquire(name: bytes, resources: int, maximum: int, opaque: int) -> bytes:
    from servers import acquire_request
    return acquire_request(name, resources, maximum, opaque)


def test_a_worker_with_no_broker_says_it_is_waiting(tmp_path):
    port = free_port()
    (tmp_path / "lonely.py").write_text(
        "from zstalk.workers import Worker\n"
        f"worker = Worker('tcp://{LOOPBACK}:{port}')\n"
        "@worker.handler('t')\n"
        "def handle(job):\n"
        "    pass\n")
    proc = subprocess.Popen([ZSTALK, "worker", "lonely:worker"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    try:
        deadline = time.monotonic() + 10
        line = ""
        while "has not welcomed" not in line and time.monotonic() < deadline:
            line = proc.stderr.readline()
    finally:
        proc.terminate()
        proc.wait(10)
    assert f"the broker at tcp://{LOOPBACK}:{port} has not welcomed this process for" in line
