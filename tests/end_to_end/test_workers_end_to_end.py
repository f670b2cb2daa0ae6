# The zstalk.workers SDK against a real broker process (`zstalk broker --bind tcp://...`).
#
# In-process workers run with Worker.run_until_idle (one pool on this thread, no
# signals) and record what their handlers saw in a list; workers that must be real
# processes (SIGTERM, --processes) are `zstalk worker tests.support.workers_app:NAME` and record
# to a log file (see workers_app.py).  Every test uses its own tubes, so one broker
# serves the whole module.  Timing asserts are generous windows.
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

import pytest

from servers import free_port
from zstalk.workers import Backoff, Bury, Client, Job, Retry, Worker, WorkerVersionError, codecs
from zstalk.workers import pool as pool_module
from zstalk.broker.testing import LocalBroker

ROOT = Path(__file__).resolve().parents[2]


def start_broker(endpoint: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "zstalk.broker.run", "broker", "--bind", endpoint],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with Client(endpoint, timeout_s=10.0) as probe:
        probe.stats()               # answers once the broker is bound and running
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=5)


@pytest.fixture(scope="module")
def broker():
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    proc = start_broker(endpoint)
    try:
        yield endpoint
    finally:
        stop(proc)


@pytest.fixture
def client(broker):
    with Client(broker, codec=codecs.json, timeout_s=5.0) as c:
        yield c


@pytest.fixture
def tube():
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def processes():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=5)


def start_worker(processes: list, spec: str, broker: str, log: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, ZSTALK_TEST_LOG=str(log))
    p = subprocess.Popen([sys.executable, "-m", "zstalk.broker.run", "-V", "worker",
                          f"tests.support.workers_app:{spec}", "--broker", broker, *args],
                         cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    processes.append(p)
    return p


def events(log: Path) -> list[tuple[str, int, int, int, float]]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        event, job_id, attempt, pid, at = line.split()
        out.append((event, int(job_id), int(attempt), int(pid), float(at)))
    return out


def wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def recording_worker(tube: str, seen: list, **settings) -> Worker:
    w = Worker(codec=codecs.json, **settings)

    @w.handler(tube)
    def handle(job: Job) -> None:
        seen.append((job.id, job.body, job.attempt))
    return w


# -- order and outcomes -------------------------------------------------------------------
def test_jobs_are_pushed_in_priority_then_id_order_across_tubes(broker, client, tube):
    other = tube + "-b"
    ids = {}
    for name, t, pri in [("a", tube, 10), ("b", other, 5), ("c", tube, 5), ("d", other, 10),
                         ("e", tube, 0)]:
        ids[name] = client.put(name, tube=t, pri=pri)
    seen: list = []
    w = Worker(broker, concurrency=1, prefetch=0, codec=codecs.json)

    @w.handler(tube, other)
    def handle(job: Job) -> None:
        seen.append(job.body)

    counts = w.run_until_idle(timeout_s=10)
    assert seen == ["e", "b", "c", "a", "d"]
    assert counts == {"deleted": 5}
    assert client.peek(ids["a"]) is None


def test_a_returning_handler_deletes_and_retry_and_bury_choose_the_outcome(broker, client, tube):
    keep, later, bury = client.put_many(["ok", "later", "bury"], tube=tube, pri=100)
    w = Worker(broker, codec=codecs.json)

    @w.handler(tube)
    def handle(job: Job) -> None:
        if job.body == "later":
            raise Retry(delay_s=30, pri=7)
        if job.body == "bury":
            raise Bury(pri=9)

    counts = w.run_until_idle(timeout_s=10)
    assert counts == {"deleted": 1, "released": 1, "buried": 1}
    assert client.stats_job(keep) is None
    released = client.stats_job(later)
    assert (released["state"], released["pri"], released["releases"]) == ("delayed", 7, 1)
    buried = client.stats_job(bury)
    assert (buried["state"], buried["pri"], buried["buries"]) == ("buried", 9, 1)
    assert client.peek_buried(tube) == (bury, "bury")


def test_a_failing_job_is_retried_with_backoff_then_buried_after_max_attempts(broker, client, tube):
    job_id = client.put("boom", tube=tube)
    starts: list[tuple[int, float]] = []
    w = Worker(broker, codec=codecs.json, max_attempts=3, backoff=Backoff(base_s=0.5, factor=2))

    @w.handler(tube)
    def handle(job: Job) -> None:
        starts.append((job.attempt, time.monotonic()))
        raise ValueError("always")

    counts = w.run_until_idle(timeout_s=15, wait_delayed=True)
    # delays: int(0.5) = 0 s after attempt 1, int(1.0) = 1 s after attempt 2, then buried
    assert [a for a, _ in starts] == [1, 2, 3]
    assert starts[1][1] - starts[0][1] < 0.5
    assert 0.9 <= starts[2][1] - starts[1][1] < 2.0
    assert counts == {"released": 2, "buried": 1}
    stats = client.stats_job(job_id)
    assert (stats["state"], stats["reserves"], stats["releases"], stats["buries"]) == ("buried", 3, 2, 1)


# -- touch ---------------------------------------------------------------------------------
def test_auto_touch_keeps_a_job_past_its_ttr(broker, client, tube):
    job_id = client.put("long", tube=tube, ttr_s=1)
    attempts: list[int] = []
    w = Worker(broker, codec=codecs.json, auto_touch=True)

    @w.handler(tube)
    def handle(job: Job) -> None:
        attempts.append(job.attempt)
        time.sleep(2.2)

    counts = w.run_until_idle(timeout_s=10)
    assert attempts == [1]
    assert counts == {"deleted": 1}
    assert client.stats_job(job_id) is None


def test_touch_from_an_async_handler_keeps_its_job(broker, client, tube):
    client.put("long", tube=tube, ttr_s=1)
    attempts: list[int] = []
    w = Worker(broker, codec=codecs.json)

    @w.handler(tube)
    async def handle(job: Job) -> None:
        attempts.append(job.attempt)
        for _ in range(5):
            await asyncio.sleep(0.4)
            job.touch()

    assert w.run_until_idle(timeout_s=10) == {"deleted": 1}
    assert attempts == [1]


def test_a_job_whose_ttr_runs_out_is_given_again_and_the_late_result_is_not_acked(broker, client, tube):
    client.put("slow", tube=tube, ttr_s=1)
    attempts: list[int] = []
    w = Worker(broker, codec=codecs.json, concurrency=2)

    @w.handler(tube)
    def handle(job: Job) -> None:
        attempts.append(job.attempt)
        if job.attempt == 1:
            time.sleep(1.6)

    counts = w.run_until_idle(timeout_s=10)
    assert sorted(attempts) == [1, 2]
    assert counts == {"deleted": 1, "stale": 1}


# -- async handlers ---------------------------------------------------------------------------
def test_async_handlers_run_at_most_concurrency_at_a_time(broker, client, tube):
    client.put_many(list(range(9)), tube=tube)
    running, peak, done = [0], [0], []
    w = Worker(broker, codec=codecs.json, concurrency=3)

    @w.handler(tube)
    async def handle(job: Job) -> None:
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        await asyncio.sleep(0.2)
        running[0] -= 1
        done.append(job.body)

    started = time.monotonic()
    assert w.run_until_idle(timeout_s=10) == {"deleted": 9}
    assert peak[0] == 3
    assert sorted(done) == list(range(9))
    assert 0.55 < time.monotonic() - started < 3.0


def test_sync_handlers_run_on_concurrency_threads(broker, client, tube):
    client.put_many(list(range(8)), tube=tube)
    threads: set[str] = set()
    lock = threading.Lock()
    w = Worker(broker, codec=codecs.json, concurrency=4)

    @w.handler(tube)
    def handle(job: Job) -> None:
        with lock:
            threads.add(threading.current_thread().name)
        time.sleep(0.1)

    started = time.monotonic()
    assert w.run_until_idle(timeout_s=10) == {"deleted": 8}
    assert len(threads) == 4
    assert time.monotonic() - started < 2.0


# -- processes and shutdown ---------------------------------------------------------------------
def test_sigterm_lets_the_running_job_finish_and_releases_the_others_at_once(
        broker, client, processes, tmp_path):
    tube = "slow"
    log = tmp_path / "events"
    first = client.put({"sleep": 1.5}, tube=tube, pri=1)
    rest = client.put_many([{"sleep": 0}] * 2, tube=tube, pri=2)
    worker = start_worker(processes, "slow", broker, log)
    wait_for(lambda: any(e[0] == "start" for e in events(log)))
    wait_for(lambda: (client.stats_tube(tube) or {}).get("current-jobs-reserved") == 3, 5)
    worker.send_signal(signal.SIGTERM)
    # the two prefetched jobs are back at once, while the first one still runs
    wait_for(lambda: client.stats_tube(tube)["current-jobs-ready"] == 2, 0.8)
    assert worker.wait(timeout=5) == 0
    assert [e[:2] for e in events(log)] == [("start", first), ("end", first)]
    assert client.stats_job(first) is None
    for job_id in rest:
        assert client.stats_job(job_id)["state"] == "ready"
        assert client.delete(job_id)


def test_a_handler_still_running_after_the_grace_period_is_released(broker, client, processes, tmp_path):
    log = tmp_path / "events"
    job_id = client.put({"sleep": 8}, tube="slow", ttr_s=60)
    worker = start_worker(processes, "slow", broker, log)
    wait_for(lambda: bool(events(log)))
    worker.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert worker.wait(timeout=8) == 0
    assert 2.5 < time.monotonic() - started < 5.0           # grace_s is 3 s
    stats = client.stats_job(job_id)
    assert (stats["state"], stats["releases"]) == ("ready", 1)
    assert client.delete(job_id)


def test_a_second_sigterm_releases_the_running_job_at_once(broker, client, processes, tmp_path):
    log = tmp_path / "events"
    job_id = client.put({"sleep": 8}, tube="slow", ttr_s=60)
    worker = start_worker(processes, "slow", broker, log)
    wait_for(lambda: bool(events(log)))
    worker.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    started = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=5) == 0
    assert time.monotonic() - started < 1.5
    assert client.stats_job(job_id)["state"] == "ready"
    assert client.delete(job_id)


@pytest.mark.parametrize("how", ["spawned by the CLI", "forked by Worker.run"])
def test_two_processes_share_the_jobs_and_both_stop_on_sigterm(broker, client, processes, tmp_path, how):
    log = tmp_path / "events"
    ids = client.put_many([{"sleep": 0.1}] * 12, tube="shared")
    if how == "spawned by the CLI":
        parent = start_worker(processes, "shared", broker, log, "--processes", "2")
    else:
        code = ("import tests.support.workers_app as app; app.shared.broker = %r; "
                "app.shared.run(processes=2)" % broker)
        parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT,
                                  env=dict(os.environ, ZSTALK_TEST_LOG=str(log)))
        processes.append(parent)
    wait_for(lambda: sum(e[0] == "end" for e in events(log)) == 12, 10)
    assert {e[1] for e in events(log) if e[0] == "end"} == set(ids)
    assert len({e[3] for e in events(log)}) == 2
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=8) == 0
    wait_for(lambda: client.stats_tube("shared")["current-jobs-reserved"] == 0, 3)


# -- broker restarts -------------------------------------------------------------------------------
def test_a_worker_carries_on_with_a_restarted_broker_and_sends_its_ack_again(tube):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    brokers = [start_broker(endpoint)]
    seen: list[bytes] = []
    w = Worker(endpoint)

    @w.handler(tube)
    def handle(job: Job) -> None:
        seen.append(job.body)
        if job.body == b"first":        # the broker dies under the running job
            brokers[0].kill()
            brokers[0].wait(timeout=5)
            brokers.append(start_broker(endpoint))
            with Client(endpoint) as c:
                c.put(b"second", tube=tube)
    try:
        with Client(endpoint) as c:
            c.put(b"first", tube=tube)
        counts = w.run_until_idle(timeout_s=15)
    finally:
        for proc in brokers:
            stop(proc)
    # the first job's DELETE went again to the new broker, which never had that job
    assert seen == [b"first", b"second"]
    assert counts == {"lost": 1, "deleted": 1}


def test_a_pool_dropped_for_silence_starts_afresh_and_its_ack_still_lands(broker, client, tube):
    job_id = client.put("block", tube=tube)
    attempts: list[int] = []
    w = Worker(broker, codec=codecs.json)

    @w.handler(tube)
    async def handle(job: Job) -> None:
        attempts.append(job.attempt)
        if job.attempt == 1:
            time.sleep(2.6)     # blocks the loop: no heartbeat, the broker drops the pool

    counts = w.run_until_idle(timeout_s=10)
    # the broker released the job when it dropped the pool; the DELETE sent again
    # after the new Hello deletes it before the new subscription could take it again
    assert attempts == [1]
    assert counts == {"deleted": 1}
    assert client.stats_job(job_id) is None


# -- versions and in-process mode ----------------------------------------------------------------
def test_a_broker_without_a_common_worker_version_is_a_clear_error(broker, tube, monkeypatch):
    monkeypatch.setattr(pool_module, "WORKER_VERSIONS", (90, 99))
    w = Worker(broker)
    w.handler(tube)(lambda job: None)
    with pytest.raises(WorkerVersionError, match="90..99"):
        w.run_until_idle(timeout_s=5)


def test_local_broker_runs_the_real_broker_and_a_worker_in_process(tube):
    seen: list = []
    w = recording_worker(tube, seen, concurrency=2)
    with LocalBroker() as local:
        c = local.client(codec=codecs.json)
        ids = c.put_many([{"n": i} for i in range(20)], tube=tube)
        assert local.work(w, timeout_s=5) == {"deleted": 20}
        assert sorted(i for i, _, _ in seen) == ids
        assert c.stats_tube(tube)["total-jobs"] == 20
        assert c.stats()["current-jobs-ready"] == 0
