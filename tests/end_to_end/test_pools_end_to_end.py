"""Native worker pools in a real cluster: `zstalk broker`, beanstalk fronts, greenstalk
clients, and `zstalk worker` processes (tests/support/pools_app.py) — mixed protocols, flow
control, stats, a pool killed with SIGKILL, and a broker restart under running pools."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import greenstalk
import pytest

from servers import find_zstalk
from zstalk.workers import Client

pytestmark = pytest.mark.cluster


class Pools:
    """`zstalk worker` processes, each in its own session, killed at teardown."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, broker: str, *args: str) -> subprocess.Popen:
        env = dict(os.environ, POOLS_APP_OUT=str(self.out))
        proc = subprocess.Popen([find_zstalk(), "worker", f"tests.support.pools_app:{name}",
                                 "--broker", broker, *args],
                                env=env, start_new_session=True, cwd=Path(__file__).resolve().parents[2],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(5)

    def started(self) -> list[tuple[int, str, int, bytes]]:
        """(id, tube, attempt, body) of every job a handler started, in order."""
        if not self.out.exists():
            return []
        rows = [line.split() for line in self.out.read_text().splitlines()]
        return [(int(i), tube, int(a), bytes.fromhex(b)) for i, tube, a, b in rows]

    def close(self) -> None:
        for proc in self.procs:
            self.kill(proc)
            proc.stderr.close()


@pytest.fixture
def pools(tmp_path):
    p = Pools(tmp_path / "started.txt")
    yield p
    p.close()


def wait_for(predicate, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def beanstalk(cluster, watch: str | None = None) -> greenstalk.Client:
    host, port = cluster.front_addresses[0]
    return greenstalk.Client((host, port), watch=watch or "default", encoding=None)


def workers_now(client: greenstalk.Client) -> int:
    return int(client.stats()["current-workers"])


def start_pool(pools, cluster, name: str, *args: str) -> subprocess.Popen:
    """Start a pool and wait until the broker counts it as a worker."""
    with beanstalk(cluster) as c:
        before = workers_now(c)
        proc = pools.start(name, cluster.broker_address, *args)
        wait_for(lambda: workers_now(c) > before, what=f"pool {name} to subscribe")
    return proc


def state(client: greenstalk.Client, job_id: int) -> str:
    try:
        return client.stats_job(job_id)["state"]
    except greenstalk.NotFoundError:
        return "gone"


def test_a_job_put_by_a_beanstalk_client_is_handled_and_deleted_by_a_native_pool(zstalk_cluster, pools):
    cluster = zstalk_cluster(fronts=1)
    start_pool(pools, cluster, "emails")
    with beanstalk(cluster) as c:
        c.use("emails")
        ids = [c.put(f"hello {n}".encode()) for n in range(5)]
        wait_for(lambda: all(state(c, i) == "gone" for i in ids), what="the jobs to be deleted")
    assert sorted((i, body) for i, _, _, body in pools.started()) == \
        [(i, f"hello {n}".encode()) for n, i in enumerate(ids)]


def test_a_job_put_by_the_native_client_is_reserved_by_a_beanstalk_client(zstalk_cluster):
    cluster = zstalk_cluster(fronts=1)
    with Client(cluster.broker_address) as producer:
        job_id = producer.put(b"order 42", tube="orders", pri=5)
    with beanstalk(cluster, watch="orders") as c:
        job = c.reserve(timeout=2)
        assert (job.id, job.body) == (job_id, b"order 42")
        assert c.stats_job(job_id)["pri"] == 5
        c.delete(job)


def test_a_pool_counts_as_a_connection_a_worker_and_waiting_while_it_has_free_slots(zstalk_cluster, pools):
    cluster = zstalk_cluster(fronts=1)
    with beanstalk(cluster) as c:
        before = c.stats()
        start_pool(pools, cluster, "emails")
        after = c.stats()
        tube = c.stats_tube("emails")
    assert after["current-connections"] == before["current-connections"] + 1
    assert after["current-workers"] == before["current-workers"] + 1
    assert after["current-waiting"] == before["current-waiting"] + 1
    assert tube["current-watching"] == 1 and tube["current-waiting"] == 1


def test_a_slow_pool_never_holds_more_than_its_credits_and_others_get_the_rest(zstalk_cluster, pools):
    cluster = zstalk_cluster(fronts=1)
    start_pool(pools, cluster, "stuck", "--concurrency", "2", "--prefetch", "0")
    with beanstalk(cluster) as c:
        c.use("stuck")
        ids = [c.put(b"slow %d" % n) for n in range(5)]
        wait_for(lambda: len(pools.started()) == 2, what="the pool to start two jobs")
        for _ in range(10):                 # and it never takes a third meanwhile
            tube = c.stats_tube("stuck")
            assert (tube["current-jobs-reserved"], tube["current-jobs-ready"]) == (2, 3)
            time.sleep(0.05)
        with beanstalk(cluster, watch="stuck") as other:
            job = other.reserve(timeout=2)   # a beanstalk client gets one at once
            assert job.id == ids[2]
            start_pool(pools, cluster, "stuck", "--concurrency", "1", "--prefetch", "0")
            wait_for(lambda: len(pools.started()) == 3, what="the second pool's job")
            assert c.stats_tube("stuck")["current-jobs-ready"] == 1
    started = [row[0] for row in pools.started()]
    # the first pool's two handler threads start theirs in either order
    assert sorted(started[:2]) == [ids[0], ids[1]] and started[2:] == [ids[3]]


def test_a_pool_killed_mid_job_has_the_job_ready_again_within_3_seconds(zstalk_cluster, pools):
    cluster = zstalk_cluster(fronts=1)
    proc = start_pool(pools, cluster, "stuck")
    with beanstalk(cluster) as c:
        c.use("stuck")
        job_id = c.put(b"payment", ttr=60)
        wait_for(lambda: pools.started(), what="the handler to start")
        assert state(c, job_id) == "reserved"
        killed = time.monotonic()
        pools.kill(proc)
        wait_for(lambda: state(c, job_id) == "ready", timeout=10, what="the job to be ready")
        elapsed = time.monotonic() - killed
        assert elapsed < 3.0, f"ready {elapsed:.2f} s after the kill"
        assert c.stats_job(job_id)["timeouts"] == 0     # the pool's death, not the TTR


def test_pools_reconnect_after_a_broker_restart_and_go_on_working(zstalk_cluster, pools):
    cluster = zstalk_cluster(fronts=1)
    start_pool(pools, cluster, "emails")
    with Client(cluster.broker_address) as producer:
        first = producer.put(b"before", tube="emails")
    wait_for(lambda: len(pools.started()) == 1, what="the first job")
    cluster.kill_broker()
    cluster.restart_broker()
    # the pool notices within the heartbeat timeout, says Hello again, re-subscribes
    with Client(cluster.broker_address) as producer:
        second = producer.put(b"after", tube="emails")
        wait_for(lambda: len(pools.started()) == 2, timeout=15, what="the pool to come back")
        wait_for(lambda: producer.stats_job(second) is None, what="the job to be deleted")
        assert producer.stats()["current-workers"] == 1
    assert [(i, body) for i, _, _, body in pools.started()] == [(first, b"before"), (second, b"after")]


def test_a_running_broker_refuses_a_pool_that_speaks_no_common_version():
    """The version is negotiated on SUBSCRIBE (broker side: tests/core/test_pools_core.py);
    here the running broker answers a raw pool that speaks no common version."""
    import zmq
    from zstalk.protocol.schema import (WORKER_VERSIONS, Batch, Hello, Op, R, Replies, Welcome,
                                        decode, encode)
    from servers import free_port
    port = free_port()
    broker = subprocess.Popen([find_zstalk(), "broker", "--bind", f"tcp://127.0.0.1:{port}"],
                              start_new_session=True, stderr=subprocess.DEVNULL)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    try:
        sock.connect(f"tcp://127.0.0.1:{port}")
        sock.send(encode(Hello(99, "pool", os.getpid(), 0, [])))
        assert isinstance(decode(sock.recv()), Welcome)
        far = [WORKER_VERSIONS[1] + 1, WORKER_VERSIONS[1] + 3]
        sock.send(encode(Batch([(Op.OPEN, 1), (Op.SUBSCRIBE, 1, far, ["a"], 5)])))
        reply = decode(sock.recv())
        while not isinstance(reply, Replies):
            reply = decode(sock.recv())
        assert reply.items == [[1, R.BAD_VERSION, *WORKER_VERSIONS]]
    finally:
        sock.close()
        ctx.term()
        os.killpg(broker.pid, signal.SIGKILL)
        broker.wait(5)


def test_with_a_binlog_a_pool_keeps_the_job_it_runs_across_a_broker_restart(zstalk_cluster, pools, tmp_path):
    cluster = zstalk_cluster(fronts=1, broker_args=["--binlog", str(tmp_path / "wal")])
    start_pool(pools, cluster, "stuck")
    with Client(cluster.broker_address) as producer:
        job_id = producer.put(b"long report", tube="stuck", ttr_s=120)
    wait_for(lambda: pools.started(), what="the handler to start")
    cluster.kill_broker()
    cluster.restart_broker()
    with Client(cluster.broker_address) as producer:
        wait_for(lambda: producer.stats()["current-workers"] == 1, timeout=15,
                 what="the pool to re-register")
        assert producer.stats_job(job_id)["state"] == "reserved"
    with beanstalk(cluster, watch="stuck") as c:
        with pytest.raises(greenstalk.TimedOutError):
            c.reserve(timeout=0)
    assert [row[0] for row in pools.started()] == [job_id]      # not handed out twice


def test_serve_stops_with_exit_111_naming_the_worker_endpoint_when_it_is_taken():
    from servers import free_port
    taken = f"tcp://127.0.0.1:{free_port()}"
    first = subprocess.Popen([find_zstalk(), "broker", "--bind", taken], start_new_session=True,
                             stderr=subprocess.DEVNULL)
    try:
        with Client(taken) as c:
            c.stats()                               # it is bound
        second = subprocess.run([find_zstalk(), "serve", "-l", "127.0.0.1", "-p", str(free_port()),
                                 "--counter-port", "0", "--worker-bind", taken],
                                capture_output=True, text=True, timeout=20)
        assert second.returncode == 111
        assert f"cannot bind {taken}: Address already in use" in second.stderr
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(5)


def test_a_pool_stopped_with_sigterm_says_goodbye_and_leaves_the_stats_at_once(zstalk_cluster, pools):
    cluster = zstalk_cluster(fronts=1)
    with beanstalk(cluster) as c:
        before = c.stats()["current-connections"]
        proc = start_pool(pools, cluster, "emails")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        stopped = time.monotonic()
        wait_for(lambda: c.stats()["current-connections"] == before, timeout=5,
                 what="the pool's session to close")
        # a pool that vanished is noticed after the 2 s heartbeat timeout; this one said so
        assert time.monotonic() - stopped < 1.5


@pytest.mark.parametrize("binlog", [True, False], ids=["binlog", "no-binlog"])
def test_a_job_finished_while_the_broker_is_down_is_acked_once_it_is_back(zstalk_cluster, pools,
                                                                         tmp_path, binlog):
    args = ["--binlog", str(tmp_path / "wal")] if binlog else []
    cluster = zstalk_cluster(fronts=1, broker_args=args)
    start_pool(pools, cluster, "slow_bury")
    with Client(cluster.broker_address) as producer:
        job_id = producer.put(b"bury me", tube="reports")
    wait_for(lambda: pools.started(), what="the handler to start")
    cluster.kill_broker()
    time.sleep(3.0)             # the handler buries its job while the broker is away
    cluster.restart_broker()
    with Client(cluster.broker_address) as producer:
        if binlog:
            wait_for(lambda: (producer.stats_job(job_id) or {}).get("state") == "buried",
                     timeout=15, what="the bury to land")
            assert producer.stats_job(job_id)["buries"] == 1
        # without a binlog the new broker never knew the job: the ack is dropped, and
        # the pool must still carry on (it used to lose step with its replies and stop)
        after = producer.put(b"next", tube="reports")
        wait_for(lambda: producer.stats_job(after) is None, timeout=15, what="the pool to go on")
    assert [row[3] for row in pools.started()] == [b"bury me", b"next"]     # not run twice
