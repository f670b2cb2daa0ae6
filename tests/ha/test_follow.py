"""Clients follow the leader without NATS (issue 43, item 3), with real processes: instances
of `zstalk serve --journal` on a 3-node nats-server cluster (tests/support/nats_cluster.py),
each with a worker endpoint (--worker-bind, advertised in the lease).

  * a greenstalk client connected to the standby instance puts and reserves through it
    (its fronts reach the leader across ZeroMQ); a producer given both endpoints, the
    standby's first, is sent on to the leader; its HTTP front answers through the leader;
  * kill -9 of the leader: the same client connection goes on once the standby leads; a
    command in flight at the loss may be answered INTERNAL_ERROR (never replayed), the
    next ones are held and answered by the new leader; the session keeps the job it had
    reserved; nothing acknowledged is lost; SIGTERM of the leader fails no command;
  * a worker pool given both instances (`--broker standby,leader`) is sent on to the
    leader, works its jobs, and after kill -9 of the leader works the new one's;
  * a raw peer of schema version 5 gets nothing from a standby (a version-6 peer is told
    where the leader is), and is welcomed by the leader as before; a `zstalk broker`
    standing by tells peers where the leader is too.
Times are asserted with room for a loaded 2-core machine; the figures are printed (-s).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import greenstalk
import msgpack
import pytest
import zmq

from nats_cluster import Cluster, cluster  # noqa: F401 (a fixture)
from servers import LOOPBACK, RawClient, find_zstalk, free_port, self_check, wait_for
from test_failover import LEAD_S, Instance, answers, stats
from zstalk.workers import Client

pytestmark = pytest.mark.skipif(self_check(), reason="tests zstalk's own journal")
HELLO, WELCOME, NOT_LEADER = 1, 2, 10


@pytest.fixture
def name() -> str:
    return "w" + os.urandom(4).hex()


class Followed(Instance):
    """An instance with a worker endpoint of its own (so its fronts can follow)."""

    def __init__(self, urls: str, name: str, *extra: str) -> None:
        self.worker = f"tcp://{LOOPBACK}:{free_port()}"
        super().__init__(urls, name, "--worker-bind", self.worker, *extra)


def leader_and_follower(cluster: Cluster, name: str,
                        make: type[Followed] = Followed) -> tuple[Followed, Followed]:
    """One instance leading, then a second standing by for it, its port answering."""
    a = make(cluster.urls, name).launch()
    assert wait_for(lambda: answers(a.address) and a.leads(), LEAD_S, 0.05), a.output()
    b = make(cluster.urls, name).launch()
    assert wait_for(lambda: b.stands_by_for(a) and answers(b.address), LEAD_S, 0.05), \
        (b.leader(), b.output())
    return a, b


def test_a_greenstalk_client_of_the_standby_puts_and_reserves_through_it(cluster, name):
    a, b = leader_and_follower(cluster, name)
    try:
        with greenstalk.Client(b.address, encoding=None, use="follow",
                               watch="follow") as c:
            job_id = c.put(b"through the standby")
            job = c.reserve(timeout=10)
            assert (job.id, job.body) == (job_id, b"through the standby")
            c.delete(job)
            said = c.stats()
        assert said["journal-role"] == "leader", "answered by the leader, through the standby"
        with Client(f"{b.worker},{a.worker}", timeout_s=10) as producer:   # (sent on to a)
            assert producer.put(b"from a producer") == job_id + 1
        assert stats(a.address)[b"total-jobs"] == b"2"
        assert not b.leads() and a.leads()
    finally:
        a.stop()
        b.stop()


def test_the_standbys_http_front_answers_through_the_leader(cluster, name, tmp_path):
    config = tmp_path / "zstalk.toml"
    config.write_text(f'[functions.f]\nurl = "http://{LOOPBACK}:9/fn/f"\n')
    ports = [free_port(), free_port()]
    a = Followed(cluster.urls, name, "--config", str(config), "--http-port", str(ports[0]))
    a.launch()
    b = None
    try:
        assert wait_for(lambda: answers(a.address) and a.leads(), LEAD_S, 0.05), a.output()
        b = Followed(cluster.urls, name, "--config", str(config), "--http-port", str(ports[1]))
        b.launch()
        assert wait_for(lambda: b.stands_by_for(a) and answers(b.address), LEAD_S, 0.05), \
            b.output()
        url = f"http://{LOOPBACK}:{ports[1]}/v1/functions/f"
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.status == 200 and json.load(r)["name"] == "f"
    finally:
        a.stop()
        if b is not None:
            b.stop()


def put_until_acknowledged(c: greenstalk.Client, body: bytes, limit_s: float) -> tuple[int, int]:
    """Put `body` until acknowledged: (its id, the INTERNAL_ERRORs answered meanwhile)."""
    failed, until = 0, time.monotonic() + limit_s
    while True:
        try:
            return c.put(body), failed
        except greenstalk.InternalError:
            failed += 1
            assert time.monotonic() < until, f"no put acknowledged in {limit_s} s"
            time.sleep(0.05)


def test_kill_9_of_the_leader_the_standbys_client_goes_on_on_its_connection(cluster, name):
    a, b = leader_and_follower(cluster, name)
    try:
        with greenstalk.Client(b.address, encoding=None) as c:
            acked = {c.put(b"before %d" % i): b"before %d" % i for i in range(20)}
            held = c.reserve(timeout=10)                # (kept for this connection)
            del acked[held.id]
            killed = time.monotonic()
            a.kill()
            job_id, failed = put_until_acknowledged(c, b"after", LEAD_S)
            took = time.monotonic() - killed
            acked[job_id] = b"after"
            for i in range(20):
                acked[c.put(b"later %d" % i)] = b"later %d" % i
            print(f"\nkill -9 of the leader -> first acknowledged put on the standby's "
                  f"connection: {took:.2f} s ({failed} INTERNAL_ERROR)")
            assert failed <= 1, "only the command in flight at the loss may fail"
            assert took < 10.0, took
            c.delete(held)              # the session came back with the job it held
            said = c.stats()
            assert said["journal-role"] == "leader" and said["journal-epoch"] == 2, said
            got = {}
            while True:
                try:
                    job = c.reserve(timeout=0)
                except greenstalk.TimedOutError:
                    break
                got[job.id] = job.body
            assert got == acked, "an acknowledged job was lost"
        assert b.leads()
    finally:
        a.stop()
        b.stop()


def test_sigterm_of_the_leader_fails_no_command_of_the_standbys_client(cluster, name):
    a, b = leader_and_follower(cluster, name)
    try:
        with greenstalk.Client(b.address, encoding=None) as c:
            acked = {c.put(b"before"): b"before"}
            stopped = time.monotonic()
            a.signal(signal.SIGTERM)
            slowest = 0.0
            while a.running or not b.leads():       # (every put answered, none failed)
                began = time.monotonic()
                acked[c.put(b"during")] = b"during"
                slowest = max(slowest, time.monotonic() - began)
                assert time.monotonic() - stopped < LEAD_S, "the standby never led"
            acked[c.put(b"after")] = b"after"
            print(f"\nSIGTERM of the leader -> the slowest put on the standby's connection: "
                  f"{slowest:.2f} s")
            assert a.process.wait(10) == 0
            got = {}
            while True:
                try:
                    job = c.reserve(timeout=0)
                except greenstalk.TimedOutError:
                    break
                got[job.id] = job.body
            assert got == acked
    finally:
        a.stop()
        b.stop()


def put_raw_until_acknowledged(c: RawClient, body: bytes, limit_s: float) -> tuple[int, int]:
    """put_until_acknowledged on a raw connection (no greenstalk: it waits without a timeout)."""
    failed, until = 0, time.monotonic() + limit_s
    while True:
        c.send(b"put 0 0 60 %d\r\n%s\r\n" % (len(body), body))
        reply = c.read_reply()
        if reply.startswith(b"INSERTED "):
            return int(reply.split()[1]), failed
        assert reply == b"INTERNAL_ERROR\r\n" and time.monotonic() < until, reply
        failed += 1
        time.sleep(0.05)


def test_a_standby_with_front_processes_serves_through_the_leader_and_goes_on_after_a_kill(
        cluster, name):
    """`zstalk serve --fronts 1 --journal` standing by: its front process follows the
    leader (the broker child's door sends it on) and the health port says so (/leader
    503, /readyz 200), and after kill -9 of the leader the same client connection goes on
    once that broker child leads, keeping its job."""
    a = Followed(cluster.urls, name).launch()
    b = None
    try:
        assert wait_for(lambda: answers(a.address) and a.leads(), LEAD_S, 0.05), a.output()
        b = Followed(cluster.urls, name, "--fronts", "1").launch()
        assert wait_for(lambda: not b.refuses_clients(), LEAD_S, 0.05), b.output()
        with RawClient(b.address, LEAD_S) as c:     # (answered once its front follows)
            assert put_raw_until_acknowledged(c, b"through", LEAD_S) == (1, 0), b.output()
            c.send(b"reserve-with-timeout 10\r\n")
            assert c.read_reply() == b"RESERVED 1 7\r\nthrough\r\n"
            assert stats(b.address)[b"journal-role"] == b"leader"     # (a, through b)
            assert stats(a.address)[b"total-jobs"] == b"1"
            assert "restored" not in b.output(), "the standby's start line before it led"
            status, said = b.leader()
            assert status == 503 and "stands by" in said, (status, said)
            assert wait_for(lambda: b.ready()[0] == 200, LEAD_S, 0.05), b.ready()
            killed = time.monotonic()
            a.kill()
            job_id, failed = put_raw_until_acknowledged(c, b"after", LEAD_S)
            took = time.monotonic() - killed
            print(f"\nkill -9 of the leader -> first acknowledged put through a --fronts "
                  f"standby's front process: {took:.2f} s ({failed} INTERNAL_ERROR)")
            assert failed <= 1 and took < 10.0, (failed, took)
            c.send(b"delete 1\r\nstats\r\n")   # (the session came back with its job)
            deleted, said = c.read_replies(2)
            assert deleted == b"DELETED\r\n" and b"journal-epoch: 2" in said, (deleted, said)
        assert wait_for(b.leads, LEAD_S, 0.05), b.leader()
        assert "restored 1 jobs" in b.output()      # (its start line, once it leads)
    finally:
        a.stop()
        if b is not None:
            b.stop()


def start_pool(broker: str, log: Path, out: Path) -> subprocess.Popen:
    """`zstalk worker` of tests/support/workers_app.py (its lines to `out`)."""
    env = dict(os.environ, ZSTALK_TEST_LOG=str(log), PYTHONPATH=os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]))
    with open(out, "wb") as said:
        return subprocess.Popen([sys.executable, "-m", "zstalk.broker.run", "-V", "worker",
                                 "tests.support.workers_app:shared", "--broker", broker],
                                env=env, stdin=subprocess.DEVNULL, stdout=said,
                                stderr=subprocess.STDOUT, start_new_session=True)


def ended(log: Path) -> set[int]:
    if not log.exists():
        return set()
    return {int(line.split()[1]) for line in log.read_text().splitlines()
            if line.startswith("end ")}


def put_orders(address, count: int) -> list[int]:
    with greenstalk.Client(address, use="shared") as c:
        return [c.put(json.dumps({"sleep": 0})) for _ in range(count)]


def test_a_worker_pool_given_both_instances_follows_the_leader(cluster, name, tmp_path):
    a, b = leader_and_follower(cluster, name)
    log, out = tmp_path / "pool.log", tmp_path / "pool.out"
    pool = start_pool(f"{b.worker},{a.worker}", log, out)   # (the standby first: sent on)
    try:
        first = put_orders(a.address, 5)
        assert wait_for(lambda: set(first) <= ended(log), LEAD_S, 0.05), out.read_text()
        killed = time.monotonic()
        a.kill()
        assert wait_for(b.leads, LEAD_S, 0.05), b.output()
        second = put_orders(b.address, 5)
        assert wait_for(lambda: set(second) <= ended(log), LEAD_S, 0.05), ended(log)
        print(f"\nkill -9 of the leader -> the pool worked the new leader's jobs: "
              f"{time.monotonic() - killed:.2f} s")
        assert pool.poll() is None
    finally:
        pool.kill()
        pool.wait()
        a.stop()
        b.stop()
    said = out.read_text(errors="replace")
    assert "does not lead: going to the leader" in said, said[-3000:]


def hello(endpoint: str, version: int, wait_s: float):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, os.urandom(8))
    sock.connect(endpoint)
    try:
        sock.send(msgpack.packb((version, HELLO, 5, "pool", os.getpid(), 0, [])))
        return msgpack.unpackb(sock.recv()) if sock.poll(int(wait_s * 1000)) else None
    finally:
        sock.close()


def test_a_peer_of_schema_version_5_gets_nothing_from_a_standby_and_works_with_the_leader(
        cluster, name):
    a, b = leader_and_follower(cluster, name)
    try:
        assert hello(b.worker, 6, 5.0) == [6, NOT_LEADER, a.worker, 1]
        assert hello(b.worker, 5, 2.0) is None, "a standby answered a version-5 peer"
        welcome = hello(a.worker, 5, 5.0)
        assert welcome is not None and welcome[:2] == [5, WELCOME]
        assert wait_for(lambda: "speaks schema version 5" in b.output(), 5.0, 0.05)
    finally:
        a.stop()
        b.stop()


def test_a_zstalk_broker_standing_by_tells_peers_where_the_leader_is(cluster, name):
    a = Followed(cluster.urls, name).launch()
    assert wait_for(lambda: answers(a.address) and a.leads(), LEAD_S, 0.05), a.output()
    endpoint = f"tcp://{LOOPBACK}:{free_port()}"
    broker = subprocess.Popen([find_zstalk(), "broker", "--bind", endpoint, "--journal",
                               cluster.urls, "--journal-name", name],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert wait_for(lambda: hello(endpoint, 6, 1.0) == [6, NOT_LEADER, a.worker, 1],
                        LEAD_S, 0.1)
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(10) == 0
    finally:
        if broker.poll() is None:
            broker.kill()
            broker.wait()
        a.stop()
