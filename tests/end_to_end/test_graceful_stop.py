"""A broker stopped with SIGTERM and started again from its binlog (a rolling update) fails
no command: it tells its fronts first (Stopping), they hold what their clients send for
the next broker, and what it left unanswered (a waiting reserve) goes to the next one.
Real processes on loopback: `zstalk broker` and `zstalk front beanstalk` (or `http`), raw
clients."""
from __future__ import annotations

import concurrent.futures
import os
import signal
import time

import pytest
import zmq

from servers import LOOPBACK, RawClient, self_check, wait_for
from test_binlog_end_to_end import Pipeline, check_durable
from test_waiting_room_end_to_end import SlowFront, call, join, split
from zstalk.protocol.schema import (PEER_TIMEOUT_S, Fenced, Heartbeat, Hello, Holding, Stopping,
                                    Welcome, decode, encode)

pytestmark = pytest.mark.skipif(self_check(), reason="stops zstalk's own broker")


@pytest.fixture
def cluster(zstalk_cluster, tmp_path):
    return zstalk_cluster(fronts=1, broker_args=["-b", str(tmp_path / "wal"), "-f", "0"],
                          front_args=["--hold-s", "15"], verbose=True)    # (stops are INFO)


def restart(cluster) -> None:
    assert cluster.broker.stop() == 0, cluster.broker.output()
    cluster.broker.start()


def test_a_rolling_restart_of_the_broker_fails_no_command_of_a_busy_client(cluster):
    p = Pipeline(cluster.front_addresses[0])
    p.run(lambda: restart(cluster), after_s=1.0, keep_going_s=3.0)
    assert p.errors == [], p.errors[:5]
    check_durable(cluster.front_addresses[0], p)
    assert "holding commands for the next one" in cluster.fronts[0].output()


def test_a_reserve_waiting_across_a_rolling_restart_gets_the_job_put_after_it(cluster):
    address = cluster.front_addresses[0]
    waiting = RawClient(address, 15)
    waiting.send(b"watch later\r\nreserve\r\n")
    assert waiting.read_reply() == b"WATCHING 2\r\n"
    waiting.expect_silence(0.3)
    restart(cluster)
    with RawClient(address, 15) as producer:
        producer.send(b"use later\r\nput 0 0 60 5\r\nafter\r\n")
        assert producer.read_replies(2) == [b"USING later\r\n", b"INSERTED 1\r\n"]
    assert waiting.read_reply() == b"RESERVED 1 5\r\nafter\r\n"
    waiting.close()


def test_a_front_that_never_answers_delays_the_stop_by_5_s_at_most(cluster):
    """A front on schema version 3 that heartbeats but never answers Stopping: the broker
    waits STOP_WAIT_S (5 s) for its Holding, then stops anyway."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(cluster.broker_address)
    try:
        sock.send(encode(Hello(12345, "beanstalk", os.getpid(), 0, [])))
        assert sock.poll(5000) and isinstance(decode(sock.recv()), Welcome)
        started = time.monotonic()
        cluster.broker.process.send_signal(signal.SIGTERM)
        told = []
        while told[-1:] != [True] and time.monotonic() - started < 15:
            sock.send(encode(Heartbeat(12345)))     # alive, so not dropped for silence
            beat_again = time.monotonic() + 0.3
            while sock.poll(max(1, int((beat_again - time.monotonic()) * 1000))):
                msg = decode(sock.recv())
                if isinstance(msg, Stopping):
                    told.append(msg.final)
        assert cluster.broker.process.wait(10) == 0
        assert told == [False, True] and 4.0 < time.monotonic() - started < 10.0
    finally:
        sock.close()


def test_a_request_held_while_a_slow_front_keeps_the_stop_open_is_answered_by_the_next_broker(
        tmp_path):
    """The HTTP front answers Holding at once; another front (heartbeating, never answering)
    keeps the broker in its stop for STOP_WAIT_S, longer than PEER_TIMEOUT_S (2 s).  The
    front and the broker must not give up on each other meanwhile: the request waits for
    the next broker and is answered, not failed with 503, and the front is not fenced."""
    broker, front, base = split(tmp_path, hold_s=60.0)
    slow = None
    try:
        uid = join(base)
        slow = SlowFront(f"tcp://{LOOPBACK}:{broker.address[1]}")
        started = time.monotonic()
        broker.process.send_signal(signal.SIGTERM)
        assert wait_for(lambda: "holding commands" in front.output(), 5), front.output()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            asked = pool.submit(call, "GET", f"{base}/v1/tasks/{uid}", timeout=60)
            assert broker.process.wait(20) == 0, broker.output()
            stopped_after = time.monotonic() - started
            assert not asked.done(), asked.result()      # held, not failed, for that long
            broker.start()                                  # the next broker, same binlog
            code, _, info = asked.result(60)
        assert stopped_after > 4.0, stopped_after           # (STOP_WAIT_S is 5 s)
        assert (code, info.get("uniqueId")) == (200, uid), info
        assert "fenced" not in front.output() and "silent for" not in front.output(), \
            front.output()
    finally:
        if slow is not None:
            slow.close()
        front.stop()
        broker.stop()


class RawFront:
    """A front as a raw DEALER that says Hello, is welcomed, and then says only what a test
    makes it say."""

    def __init__(self, broker_endpoint: str, front_id: int) -> None:
        self.front_id = front_id
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(broker_endpoint)
        self.say(Hello(front_id, "beanstalk", os.getpid(), 0, []))
        self.welcome = self.receive(5.0)
        assert isinstance(self.welcome, Welcome), self.welcome

    def say(self, msg) -> None:
        self.sock.send(encode(msg))

    def receive(self, timeout_s: float):
        """The broker's next message, or None after `timeout_s`."""
        return decode(self.sock.recv()) if self.sock.poll(int(timeout_s * 1000)) else None

    def close(self) -> None:
        self.sock.close()


def test_a_front_silent_after_its_holding_is_heartbeaten_to_the_broker_s_last_word(cluster):
    """A front that answers Holding and then says nothing, not even heartbeats (as links did
    before they heartbeated while holding), while another keeps the stop open STOP_WAIT_S:
    the broker keeps it to the end, so it hears from the broker at least every
    PEER_TIMEOUT_S until the final Stopping and is never fenced."""
    quiet = RawFront(cluster.broker_address, 777)
    slow = SlowFront(cluster.broker_address)
    try:
        started = time.monotonic()
        cluster.broker.process.send_signal(signal.SIGTERM)
        heard: list[tuple[float, object]] = []
        final = False
        while not final:
            msg = quiet.receive(15.0)
            assert msg is not None, heard
            heard.append((time.monotonic(), msg))
            if isinstance(msg, Stopping):
                final = msg.final
                if not final:
                    quiet.say(Holding(quiet.front_id))
        assert cluster.broker.process.wait(10) == 0, cluster.broker.output()
        assert heard[-1][0] - started > 4.0, heard      # (the slow front: STOP_WAIT_S, 5 s)
        assert not any(isinstance(msg, Fenced) for _, msg in heard), heard
        times = [started] + [at for at, _ in heard]
        assert max(b - a for a, b in zip(times, times[1:])) < PEER_TIMEOUT_S, heard
    finally:
        slow.close()
        quiet.close()


def test_a_front_silent_before_its_holding_is_dropped_and_not_waited_for(cluster):
    """... whereas one that falls silent without answering is taken for dead after
    PEER_TIMEOUT_S (2 s), as ever: it does not keep the broker for STOP_WAIT_S (5 s)."""
    started = time.monotonic()
    mute = RawFront(cluster.broker_address, 778)        # welcomed, then never says a word
    try:
        cluster.broker.process.send_signal(signal.SIGTERM)
        assert cluster.broker.process.wait(10) == 0, cluster.broker.output()
        assert time.monotonic() - started < 4.5
    finally:
        mute.close()


def hear_until(front: RawFront, until: float) -> list[tuple[float, object]]:
    """What the broker says to `front` until the final Stopping or `until` (monotonic),
    the front heartbeating every 0.3 s meanwhile, so that it is not dropped for silence."""
    heard: list[tuple[float, object]] = []
    while time.monotonic() < until:
        front.say(Heartbeat(front.front_id))
        beat_again = min(until, time.monotonic() + 0.3)
        while (msg := front.receive(max(0.001, beat_again - time.monotonic()))) is not None:
            heard.append((time.monotonic(), msg))
            if isinstance(msg, Stopping) and msg.final:
                return heard
    return heard


def test_a_front_welcomed_while_the_broker_stops_is_told_to_hold_and_told_it_stopped(cluster):
    """A front that says Hello while a slower front keeps the stop open (it restarted, or
    lost the broker and registered again) is told Stopping right after its Welcome and the
    final Stopping before the broker exits, which is no later for it (STOP_WAIT_S, 5 s,
    from the SIGTERM): else it would send the stopping broker commands that then fail."""
    slow = SlowFront(cluster.broker_address)            # never answers Holding
    late = None
    try:
        started = time.monotonic()
        cluster.broker.process.send_signal(signal.SIGTERM)
        assert wait_for(lambda: "stopping: telling" in cluster.broker.output(), 5), \
            cluster.broker.output()
        time.sleep(max(0.0, started + 2.5 - time.monotonic()))     # halfway through the stop
        late = RawFront(cluster.broker_address, 779)                # (welcomed: asserted)
        broker_id = late.welcome.broker_id
        assert late.receive(5.0) == Stopping(broker_id, False)      # next, and never answered
        heard = hear_until(late, started + 15.0)
        assert heard and heard[-1][1] == Stopping(broker_id, True), heard
        assert cluster.broker.process.wait(10) == 0, cluster.broker.output()
        assert 4.0 < heard[-1][0] - started < 7.5, heard    # not 2.5 s + STOP_WAIT_S
    finally:
        slow.close()
        if late is not None:
            late.close()


def test_a_front_welcomed_while_the_broker_stops_is_waited_for_until_it_answers_holding(
        cluster):
    """The late front is awaited like the others: once the early one (and the cluster's
    front) have answered, the broker still waits for it, and stops as soon as it answers,
    well before STOP_WAIT_S."""
    early = RawFront(cluster.broker_address, 780)
    late = None
    try:
        started = time.monotonic()
        cluster.broker.process.send_signal(signal.SIGTERM)
        broker_id = early.welcome.broker_id
        assert early.receive(5.0) == Stopping(broker_id, False)    # the stop has begun
        late = RawFront(cluster.broker_address, 781)
        assert late.receive(5.0) == Stopping(broker_id, False)
        early.say(Holding(early.front_id))
        heard = hear_until(late, time.monotonic() + 1.0)           # the late one is slow
        assert cluster.broker.process.poll() is None, (heard, cluster.broker.output())
        assert not any(isinstance(msg, Stopping) for _, msg in heard), heard
        late.say(Holding(late.front_id))
        answered = time.monotonic()
        heard = hear_until(late, answered + 10.0)
        assert heard and heard[-1][1] == Stopping(broker_id, True), heard
        assert cluster.broker.process.wait(10) == 0, cluster.broker.output()
        assert heard[-1][0] - answered < 1.5 and heard[-1][0] - started < 4.5, \
            (started, answered, heard)                      # (STOP_WAIT_S is 5 s)
    finally:
        early.close()
        if late is not None:
            late.close()


def test_a_broker_stopped_together_with_its_fronts_does_not_wait_for_them(cluster):
    """systemd's default stop signals every process of the service at once: a front that
    exits instead of answering Holding is not waited for (the next heartbeat finds it gone)."""
    started = time.monotonic()
    cluster.fronts[0].process.send_signal(signal.SIGTERM)
    cluster.broker.process.send_signal(signal.SIGTERM)
    assert cluster.broker.process.wait(15) == 0
    assert time.monotonic() - started < 3.0     # (STOP_WAIT_S is 5 s)


def test_a_job_held_across_a_rolling_restart_waits_for_its_holder_not_the_first_reserve(
        zstalk_cluster, tmp_path):
    """The holder's front re-registers after another front whose client waits on the same
    tube (it was stopped meanwhile): the job is kept for the holder (walformat S_RESERVED,
    RECLAIM_S), so the holder can delete it and the other client gets nothing."""
    cluster = zstalk_cluster(fronts=2, broker_args=["-b", str(tmp_path / "wal")],
                             front_args=["--hold-s", "15"])
    first, second = cluster.front_addresses
    holder, waiter = RawClient(second, 15), RawClient(first, 15)
    try:
        holder.send(b"use kept\r\nput 0 0 60 4\r\nmine\r\nwatch kept\r\nreserve\r\n")
        assert holder.read_replies(4) == [b"USING kept\r\n", b"INSERTED 1\r\n", b"WATCHING 2\r\n",
                                         b"RESERVED 1 4\r\nmine\r\n"]
        assert cluster.broker.stop() == 0, cluster.broker.output()
        os.kill(cluster.fronts[1].pid, signal.SIGSTOP)     # the holder's front comes back last
        try:
            waiter.send(b"watch kept\r\nreserve-with-timeout 8\r\n")   # held: no broker
            cluster.broker.start()
            time.sleep(1.0)                                # the waiter's front is back first
        finally:
            os.kill(cluster.fronts[1].pid, signal.SIGCONT)
        holder.send(b"delete 1\r\n")
        assert holder.read_reply() == b"DELETED\r\n"
        assert waiter.read_replies(2) == [b"WATCHING 2\r\n", b"TIMED_OUT\r\n"]
    finally:
        holder.close()
        waiter.close()
