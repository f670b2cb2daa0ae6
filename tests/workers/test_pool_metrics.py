"""A worker pool's GET /metrics (workers/metrics.py): jobs its handlers ran by outcome and
how long they ran, from a real `zstalk serve` and real pools on 127.0.0.1, of one process
and of two (the parent sums its children's shared rows, and keeps its totals when a child
is killed and started again); the bearer token of --metrics-token-file.  The exposition is
read with prometheus-client's parser.  Handlers are tests/support/workers_app.py's `metered`."""
from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from servers import free_port, wait_for
from test_health import ZSTALK, health_args, needs_programs, probe, procs  # noqa: F401
from test_worker_health import pool_processes
from zstalk.protocol.schema import Op, R
from zstalk.protocol.schema.version import VERSION
from zstalk.workers import Client, Worker, codecs
from zstalk.workers.job import BURY, DELETE, EXPIRED, RELEASE, Job, Outcome
from zstalk.workers.metrics import OUTCOMES, PoolMetrics, publish, resume, totals
from zstalk.workers.pool import Pool
from zstalk.workers.runners import Result

ROOT = Path(__file__).resolve().parents[2]
TUBE = "metered"
#: one job of each kind: a handler that returns, fails (buried: its only attempt), retries
#: (released for an hour, so it does not come back during the test), or takes 50 ms
ORDERS = [{}, {"fail": True}, {"retry": 3600}, {"sleep": 0.05}]
EXPECTED = {"deleted": 2, "released": 1, "buried": 1}
ACKS = (Op.DELETE, Op.RELEASE, Op.BURY)


# -- the counts and the rows (in process) ---------------------------------------------------
class Unlinked(Pool):
    """A pool whose ops are kept, not sent: `answer` plays the broker's reply to an ack."""

    def __init__(self) -> None:
        worker = Worker(prefetch=1)
        worker.handler("t")(lambda job: None)
        super().__init__(worker, "tcp://127.0.0.1:1")
        self.sent: list = []

    def _submit(self, op, callback=None) -> None:
        self.sent.append((op, callback))

    def take(self, job_id: int) -> Job:
        """A delivery of job_id (as _pushed makes it)."""
        self.held[job_id] = job = Job(job_id, b"", "t", 0, 60, 1, codecs.raw, None)
        self.busy += 1
        return job

    def finish(self, job: Job, action: str, duration_s: float = 0.01) -> None:
        self._finished([Result(job, Outcome(action), duration_s, None)])

    def ack_of(self, job_id: int) -> tuple:
        found = next(sent for sent in self.sent if sent[0][0] in ACKS and sent[0][2] == job_id)
        self.sent.remove(found)
        return found

    def answer(self, job_id: int, code: int) -> None:
        op, callback = self.ack_of(job_id)
        callback(op, (1, code))


def counted(pool: Pool) -> dict:
    return {k: v for k, v in pool.metrics.jobs.items() if v} | {"ran": pool.metrics.handler.count}


def test_a_pool_counts_each_handler_run_once_by_what_became_of_its_answer():
    pool = Unlinked()
    pool.finish(pool.take(1), DELETE)
    pool.finish(pool.take(2), BURY)
    assert counted(pool) == {"ran": 2}                  # counted once the broker answers
    pool.answer(1, R.DELETED)
    pool.answer(2, R.NOT_FOUND)                         # its TTR ran out meanwhile
    assert counted(pool) == {"deleted": 1, "lost": 1, "ran": 2}
    pool.finish(pool.take(3), EXPIRED, duration_s=0.0)  # not run: not in the histogram
    first = pool.take(4)
    again = pool.take(4)                                # given again while it ran
    pool.finish(first, DELETE)                          # the stale run: not acked, lost
    pool.finish(again, RELEASE)
    pool.answer(4, R.OUT_OF_MEMORY)                     # the broker refused the release
    assert counted(pool) == {"deleted": 1, "lost": 2, "refused": 1, "expired": 1, "ran": 4}
    pool._release(pool.take(5))                         # handed back unrun: not counted
    pool.answer(5, R.RELEASED)
    pool.finish(pool.take(6), DELETE)
    pool._release(pool.take(7))
    pool._forget_state([pool.ack_of(6), pool.ack_of(7)])    # a broker with other state
    assert counted(pool) == {"deleted": 1, "lost": 3, "refused": 1, "expired": 1, "ran": 5}
    assert pool.counts["released"] == 1                 # (the pool's own counts, as before)


def test_a_replacement_continues_from_its_rows_published_counts():
    counts = multiprocessing.get_context("fork").RawArray("d", 2 * len(PoolMetrics().row()))
    first = PoolMetrics()
    first.jobs["deleted"] += 3
    first.handler.observe(0.02)
    publish(first, counts, 1)
    second = PoolMetrics()
    resume(second, counts, 1)
    second.jobs["lost"] += 1
    publish(second, counts, 1)
    total = totals(counts)
    assert total.jobs == {**dict.fromkeys(OUTCOMES, 0), "deleted": 3, "lost": 1}
    assert (total.handler.count, total.handler.sum) == (1, 0.02)


# -- real processes ---------------------------------------------------------------------------
def start_serve(procs) -> str:
    """`zstalk serve` with its native worker endpoint on a free port; that endpoint."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    procs.start("serve", "-l", "127.0.0.1", "-p", str(free_port()), "--counter-port", "0",
                "--worker-bind", endpoint)
    with Client(endpoint, timeout_s=20.0) as probe_client:
        probe_client.stats()        # answers once the broker is bound and running
    return endpoint


def start_pool(procs, broker: str, health: int, log: Path, *more: str) -> subprocess.Popen:
    """The pool, its handlers recording to `log`; its stderr in a file beside it (a pipe
    nobody reads could fill with failing jobs' tracebacks)."""
    env = dict(os.environ, ZSTALK_TEST_LOG=str(log))
    errors = open(log.with_suffix(".stderr"), "wb")
    proc = subprocess.Popen([ZSTALK, "worker", "tests.support.workers_app:metered", "--broker", broker,
                             *health_args(health), *more], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=errors)
    proc.stderr = errors            # procs closes it at teardown
    procs.procs.append(proc)
    return proc


def scrape(port: int, token: str | None = None) -> tuple[int, str]:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    data = probe(port, f"GET /metrics HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


def samples(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample of the pool's /metrics, by (name, sorted labels)."""
    status, body = scrape(port)
    assert status == 200, body
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def outcomes(found: dict) -> dict[str, float]:
    """The nonzero job counts by outcome, and the handler histogram's count as "ran"."""
    out = {outcome: found[("zstalk_pool_jobs_total", (("outcome", outcome),))]
           for outcome in OUTCOMES}
    out = {k: v for k, v in out.items() if v}
    out["ran"] = found[("zstalk_pool_handler_seconds_count", ())]
    return out


def expected(times: int) -> dict[str, int]:
    return {**{k: v * times for k, v in EXPECTED.items()}, "ran": len(ORDERS) * times}


def put_orders(broker: str) -> None:
    with Client(broker, codec=codecs.json, timeout_s=10.0) as client:
        client.put_many(ORDERS, tube=TUBE)


def reaches(port: int, want: dict, timeout_s: float = 30) -> dict:
    """The samples once the outcomes are `want` (the children write every second)."""
    assert wait_for(lambda: outcomes(samples(port)) == want, timeout_s), outcomes(samples(port))
    return samples(port)


def pids_that_ran(log: Path) -> set[int]:
    return {int(line.split()[3]) for line in log.read_text().splitlines()}


def no_lower(before: dict, after: dict) -> list[str]:
    """The samples of `before` that went down (or vanished) in `after`."""
    return [f"{key}: {value} -> {after.get(key)}" for key, value in before.items()
            if key[0].startswith("zstalk_pool") and not after.get(key, -1) >= value]


@needs_programs
def test_a_one_process_pool_counts_its_jobs_by_outcome_and_times_its_handlers(procs, tmp_path):
    broker = start_serve(procs)
    health = free_port()
    start_pool(procs, broker, health, tmp_path / "log")
    put_orders(broker)
    found = reaches(health, expected(1))
    assert found[("zstalk_build_info", (("role", "pool"), ("version", VERSION)))] == 1
    assert found[("zstalk_pool_handler_seconds_bucket", (("le", "0.025"),))] <= 3   # not 50 ms
    assert found[("zstalk_pool_handler_seconds_bucket", (("le", "+Inf"),))] == 4
    assert 0.05 <= found[("zstalk_pool_handler_seconds_sum", ())] < 5


@needs_programs
def test_a_two_process_pools_parent_sums_its_children_and_never_goes_down_across_a_kill(
        procs, tmp_path):
    broker = start_serve(procs)
    health, log = free_port(), tmp_path / "log"
    parent = start_pool(procs, broker, health, log, "--processes", "2")
    scrapes: list[dict] = []

    def scraped() -> dict:
        scrapes.append(samples(health))
        return outcomes(scrapes[-1])
    put_orders(broker)
    assert wait_for(lambda: scraped() == expected(1), 30), outcomes(scrapes[-1])
    children = pool_processes(parent.pid)
    victim = min(pids_that_ran(log) & children)         # one with counts to keep
    os.kill(victim, signal.SIGKILL)
    assert wait_for(lambda: scraped() and len(pool_processes(parent.pid) - children) == 1, 30)
    replacement = pool_processes(parent.pid) - children
    batches = 1
    while not pids_that_ran(log) & replacement and batches < 10:     # until it runs some
        put_orders(broker)
        batches += 1
        wait_for(lambda: scraped() == expected(batches), 15)
    assert pids_that_ran(log) & replacement, "the restarted process ran no job"
    assert wait_for(lambda: scraped() == expected(batches), 30), outcomes(scrapes[-1])
    assert [drop for a, b in zip(scrapes, scrapes[1:]) for drop in no_lower(a, b)] == []


@needs_programs
@pytest.mark.parametrize("processes", ["1", "2"])
def test_metrics_need_the_token_of_metrics_token_file_without_it_401(procs, tmp_path,
                                                                    processes):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-t0ken")
    health = free_port()
    start_pool(procs, f"tcp://127.0.0.1:{free_port()}", health, tmp_path / "log",
               "--processes", processes, "--metrics-token-file", str(token_file))
    assert wait_for(lambda: _answers(health), 30)
    assert scrape(health)[0] == 401
    assert scrape(health, "wrong")[0] == 403
    status, body = scrape(health, "s3cret-t0ken")
    assert status == 200 and "zstalk_pool_jobs_total" in body


def _answers(port: int) -> bool:
    try:
        return scrape(port)[0] == 401
    except OSError:
        return False
