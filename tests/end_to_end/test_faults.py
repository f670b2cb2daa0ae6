"""Faults in a real cluster: fronts killed with -9 or frozen, the broker killed and restarted."""
from __future__ import annotations

import os
import signal
import time

import greenstalk
import pytest

from servers import RawClient, self_check

pytestmark = pytest.mark.skipif(self_check(), reason="needs a real zstalk cluster")


def wait_for(predicate, timeout: float, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout} s")
        time.sleep(step)


def client(address) -> greenstalk.Client:
    return greenstalk.Client(tuple(address) if not isinstance(address, str) else address)


def test_killing_a_front_returns_its_reserved_jobs_and_spares_the_other_front(zstalk_cluster):
    cluster = zstalk_cluster(fronts=2)
    a, b = cluster.front_addresses
    with client(b) as survivor:
        ids = [survivor.put(f"job {i}", ttr=100) for i in range(20)]
        doomed = client(a)
        held = [doomed.reserve(timeout=5).id for _ in range(5)]
        killed_at = time.monotonic()
        cluster.kill_front(0)
        # the survivor keeps working under load while the broker notices the death
        for i in range(50):
            survivor.delete(survivor.put(f"load {i}"))
        wait_for(lambda: all(survivor.stats_job(j)["state"] == "ready" for j in held), 6)
        assert time.monotonic() - killed_at < 4.5   # heartbeat detection is < 3 s; slack for CI
        assert survivor.stats()["current-connections"] == 1
        assert sorted(survivor.reserve(timeout=5).id for _ in ids) == sorted(ids)


def test_a_restarted_front_serves_clients_again(zstalk_cluster):
    cluster = zstalk_cluster(fronts=1)
    cluster.kill_front(0)
    cluster.restart_front(0)
    with client(cluster.front_addresses[0]) as c:
        c.put("again")
        assert c.reserve(timeout=5).body == "again"


def test_a_frozen_front_is_fenced_and_starts_over_when_it_wakes(zstalk_cluster):
    cluster = zstalk_cluster(fronts=2)
    a, b = cluster.front_addresses
    with client(b) as observer:
        job_id = observer.put("held by the frozen front", ttr=100)
        frozen = RawClient(a)
        frozen.send(b"reserve\r\n")
        assert frozen.read_reply().startswith(b"RESERVED %d " % job_id)
        os.kill(cluster.fronts[0].pid, signal.SIGSTOP)
        try:
            wait_for(lambda: observer.stats_job(job_id)["state"] == "ready", 6)
        finally:
            os.kill(cluster.fronts[0].pid, signal.SIGCONT)
        # its clients are disconnected (their sessions are gone), new clients work
        assert frozen.read_available(5)[1], "the fenced front should close its clients"
        with client(a) as fresh:
            wait_for(lambda: fresh.stats()["current-connections"] >= 2, 5)
            assert fresh.reserve(timeout=5).id == job_id


def test_a_broker_restart_without_state_closes_client_connections(zstalk_cluster):
    cluster = zstalk_cluster(fronts=1)
    address = cluster.front_addresses[0]
    old = RawClient(address)
    old.send(b"put 0 0 10 1\r\nx\r\n")
    assert old.read_reply() == b"INSERTED 1\r\n"
    cluster.kill_broker()
    cluster.restart_broker()
    # like a beanstalkd restart: the client sees its connection close
    assert old.read_available(8)[1]
    fresh = RawClient(address)
    fresh.send(b"put 0 0 10 1\r\ny\r\n")
    assert fresh.read_reply(timeout=8) == b"INSERTED 1\r\n"


def test_a_reserve_in_flight_when_the_broker_dies_gets_internal_error(zstalk_cluster):
    cluster = zstalk_cluster(fronts=1)
    waiting = RawClient(cluster.front_addresses[0])
    waiting.send(b"reserve\r\n")
    waiting.expect_silence(0.3)
    cluster.kill_broker()
    assert waiting.read_reply(timeout=6) == b"INTERNAL_ERROR\r\n"


def test_commands_behind_a_waiting_reserve_get_internal_error_when_the_broker_dies(
        zstalk_cluster):
    cluster = zstalk_cluster(fronts=1)
    waiting = RawClient(cluster.front_addresses[0])
    waiting.send(b"reserve\r\nput 0 0 10 2\r\nhi\r\nbad\r\nlist-tube-used\r\n")
    waiting.expect_silence(0.3)                 # all four wait behind the reserve
    cluster.kill_broker()
    assert waiting.read_replies(4, timeout=6) == [
        b"INTERNAL_ERROR\r\n", b"INTERNAL_ERROR\r\n", b"UNKNOWN_COMMAND\r\n",
        b"INTERNAL_ERROR\r\n"]


def test_commands_wait_for_an_unreachable_broker_then_answer_internal_error(zstalk_cluster):
    cluster = zstalk_cluster(fronts=1, front_args=["--hold-s", "1"])
    c = RawClient(cluster.front_addresses[0])
    c.send(b"list-tube-used\r\n")
    assert c.read_reply() == b"USING default\r\n"
    cluster.kill_broker()
    time.sleep(2.5)                      # the front has noticed
    t0 = time.monotonic()
    c.send(b"list-tube-used\r\n")
    assert c.read_reply(timeout=6) == b"INTERNAL_ERROR\r\n"
    assert 0.7 < time.monotonic() - t0 < 4


def test_commands_held_during_a_short_outage_are_answered_by_the_new_broker(zstalk_cluster):
    cluster = zstalk_cluster(fronts=1)
    cluster.kill_broker()
    time.sleep(2.5)
    c = RawClient(cluster.front_addresses[0])      # connects during the outage
    c.send(b"put 0 0 10 2\r\nhi\r\n")
    cluster.restart_broker()
    assert c.read_reply(timeout=8) == b"INSERTED 1\r\n"
