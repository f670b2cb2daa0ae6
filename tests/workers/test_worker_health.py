"""`zstalk worker --health-port`: what the probes of a worker pool mean (workers/probes.py),
as pure decisions over the pool's shared slots, and as real pools on 127.0.0.1 of one
process, of two (the parent answers for its children), and forked by Worker.run."""
from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from servers import children_of, free_port, wait_for
from test_health import ZSTALK, get, health_args, needs_programs, procs, start_broker  # noqa: F401
from zstalk.workers.probes import pool_live, pool_ready

ROOT = Path(__file__).resolve().parents[2]
UP = math.nan


# -- the decisions (pure, the clock a parameter) --------------------------------------------
def test_a_pool_is_ready_while_every_process_is_connected_or_waiting_less_than_its_hold():
    assert pool_ready([(100.0, UP), (100.0, UP)], now=100.0, hold_s=5.0) is None
    assert pool_ready([(100.0, UP), (100.0, 96.0)], now=100.0, hold_s=5.0) is None
    assert pool_ready([(100.0, UP), (100.0, 93.0)], now=100.0, hold_s=5.0) == \
        "pool process 2 of 2: no broker for 7 s"
    assert pool_ready([(100.0, UP), (100.0, -math.inf)], now=100.0, hold_s=5.0) == \
        "pool process 2 of 2: no broker yet"


def test_a_pool_is_live_while_every_process_loop_turned_within_the_stall_time():
    assert pool_live([(50.0, UP), (99.0, 90.0)], now=100.0, stall_s=60.0) is None
    assert pool_live([(99.0, UP), (20.0, UP)], now=100.0, stall_s=60.0) == \
        "pool process 2 of 2: loop stalled 80 s"


# -- real pools -----------------------------------------------------------------------------
def pool_processes(parent: int) -> set[int]:
    """The parent's pool processes (not multiprocessing's resource tracker)."""
    found = set()
    for pid in children_of(parent):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except FileNotFoundError:       # it has just exited
            continue
        if b"resource_tracker" not in argv:
            found.add(pid)
    return found


def start_worker(procs, broker: str, port: int, *more: str) -> subprocess.Popen:
    proc = subprocess.Popen([ZSTALK, "worker", "tests.support.workers_app:shared", "--broker", broker,
                             *health_args(port), *more], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    procs.procs.append(proc)
    return proc


@needs_programs
@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_worker_pool_is_ready_and_live_once_its_broker_welcomes_it(procs, processes):
    endpoint, _ = start_broker(procs)
    health = free_port()
    start_worker(procs, endpoint, health, "--processes", processes)
    assert wait_for(lambda: get(health, "/readyz") == (200, "ok"), 30)
    assert get(health, "/healthz") == (200, "ok")


@needs_programs
@pytest.mark.parametrize("processes, reason", [
    ("1", "no broker yet"), ("2", "pool process 1 of 2: no broker yet")])
def test_a_worker_pool_that_never_reached_a_broker_is_unready_and_stays_live(procs, processes,
                                                                            reason):
    health = free_port()
    start_worker(procs, f"tcp://127.0.0.1:{free_port()}", health, "--processes", processes)
    assert wait_for(lambda: get(health, "/readyz")[0] == 503, 30)
    status, said = get(health, "/readyz")
    assert status == 503 and said.startswith(reason), said
    assert get(health, "/healthz") == (200, "ok")


@needs_programs
def test_a_pool_process_killed_and_restarted_by_its_parent_fails_no_probe(procs):
    endpoint, _ = start_broker(procs)
    health = free_port()
    parent = start_worker(procs, endpoint, health, "--processes", "2")
    assert wait_for(lambda: get(health, "/readyz") == (200, "ok"), 30)
    before = pool_processes(parent.pid)
    assert len(before) == 2
    os.kill(min(before), signal.SIGKILL)
    answers = set()

    def restarted() -> bool:
        answers.add(get(health, "/healthz"))
        answers.add(get(health, "/readyz"))
        now = pool_processes(parent.pid)
        return len(now - before) == 1 and len(now) == 2
    assert wait_for(restarted, 30)
    assert wait_for(lambda: get(health, "/readyz") == (200, "ok"), 10)
    assert answers == {(200, "ok")}


@needs_programs
@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_worker_health_port_in_use_ends_it_with_111_naming_it(procs, processes):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = start_worker(procs, f"tcp://127.0.0.1:{free_port()}", port,
                            "--processes", processes)
        assert proc.wait(30) == 111
        assert f"bind health port 127.0.0.1:{port}" in proc.stderr.read().decode()


@needs_programs
def test_processes_forked_by_worker_run_hold_no_copy_of_the_parents_health_port(procs):
    endpoint, _ = start_broker(procs)
    health = free_port()
    code = ("import tests.support.workers_app as app; from zstalk.protocol.network.listen import "
            "HealthOptions; app.shared.broker = %r; "
            "app.shared.run(processes=2, health=HealthOptions(%d, '127.0.0.1'))"
            % (endpoint, health))
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    procs.procs.append(parent)
    assert wait_for(lambda: get(health, "/readyz") == (200, "ok"), 30)
    children = pool_processes(parent.pid)
    assert len(children) == 2
    parent.kill()           # the children live on (orphans), and must not keep the port
    parent.wait()
    try:
        with socket.socket() as again:
            again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            again.bind(("127.0.0.1", health))
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
