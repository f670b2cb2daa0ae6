"""The peers end to end (GET /v1/peers and the dashboard's snapshot; broker/core/views.py's
V_PEERS): a real `zstalk serve` with its worker endpoint on a free port, a real
`zstalk worker` pool (tests/support/pools_app.py's `stuck`: one job at a time, no
prefetch) and a real `zstalk dispatcher` connected to it, each seen with its credits or
slots, the pool's credit taken by a job it holds, and the pool gone once it is killed."""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from servers import LOOPBACK, find_zstalk, free_port, self_check, wait_for
from test_operator_views_end_to_end import put, start_server

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")
WAIT_S = 15.0
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def served(tmp_path):
    """A server whose worker endpoint listens (`.endpoint`), and the processes started
    against it (`.started`), killed at teardown."""
    port = free_port()
    api = start_server(tmp_path, "--worker-bind", f"{LOOPBACK}:{port}", name="zstalk-peers")
    api.endpoint, api.started = f"tcp://{LOOPBACK}:{port}", []
    yield api
    for proc in api.started:
        kill(proc)
    api.server.stop()


def start(api, tmp_path, *argv: str) -> subprocess.Popen:
    env = dict(os.environ, POOLS_APP_OUT=str(tmp_path / "started.txt"))
    proc = subprocess.Popen([find_zstalk(), *argv, "--broker", api.endpoint], env=env, cwd=ROOT,
                            start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    api.started.append(proc)
    return proc


def kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)


def peers(api, kind: str) -> list[dict]:
    code, doc = api.request("GET", "/v1/peers")
    assert code == 200, doc
    return [p for p in doc["peers"] if p["kind"] == kind]


def test_a_worker_pool_and_a_dispatcher_show_with_their_credits_slots_and_last_seen(
        served, tmp_path):
    pool = start(served, tmp_path, "worker", "tests.support.pools_app:stuck")
    dispatcher = start(served, tmp_path, "dispatcher", "--slots", "7")
    assert wait_for(lambda: peers(served, "pool") and any(
        d["slots"] == 7 for d in peers(served, "dispatcher")), WAIT_S)
    [seen] = peers(served, "pool")
    assert (seen["credits"], seen["reserved"], seen["tubes"], seen["sessions"]) == (
        1, 0, ["stuck"], 1)
    assert seen["lastSeenMs"] < 5000          # (a heartbeat at least every second)
    mine = [d for d in peers(served, "dispatcher") if d["slots"] == 7]
    assert len(mine) == 1 and mine[0]["stopping"] is False
    assert mine[0]["pid"] == dispatcher.pid

    put(served.server.address, "stuck", b"hold me")          # (its one credit is taken)
    assert wait_for(lambda: [(p["credits"], p["reserved"]) for p in peers(served, "pool")]
                    == [(0, 1)], WAIT_S)
    code, snap = served.request("GET", "/v1/dashboard")
    assert code == 200 and [p["credits"] for p in snap["peers"] if p["kind"] == "pool"] == [0]
    assert {"beanstalk", "http", "pool", "dispatcher"} <= {p["kind"] for p in snap["peers"]}

    kill(pool)                                                  # (its session closes)
    assert wait_for(lambda: peers(served, "pool") == [], WAIT_S)

