"""Real clients (greenstalk, pystalk) against real zstalk processes: `zstalk serve` over TCP and a
unix socket, in both placements (fronts in the broker's process, the default, and front
processes with `--fronts 1`), and a cluster of one broker and two fronts."""
from __future__ import annotations

import threading
import time

import greenstalk
import pytest
from pystalk import BeanstalkClient

from servers import self_check


def greenstalk_client(address, **kw) -> greenstalk.Client:
    return greenstalk.Client(address if isinstance(address, str) else tuple(address), **kw)


#: `zstalk serve` arguments per placement of its fronts
PLACEMENTS = {"one-process": [], "front-processes": ["--fronts", "1"]}


@pytest.fixture(params=[(listen, placement) for placement in PLACEMENTS
                        for listen in ("tcp", "unix")], ids=lambda p: "-".join(p))
def server(request, zstalk_factory):
    listen, placement = request.param
    return zstalk_factory(unix=listen == "unix", extra_args=PLACEMENTS[placement])


def test_greenstalk_puts_reserves_and_deletes_a_job(server):
    with greenstalk_client(server.address, use="emails", watch="emails") as c:
        job_id = c.put("hello")
        job = c.reserve(timeout=5)
        assert (job.id, job.body) == (job_id, "hello")
        assert c.stats_job(job)["state"] == "reserved"
        c.delete(job)
        with pytest.raises(greenstalk.NotFoundError):
            c.peek(job_id)


def test_greenstalk_sees_priorities_delays_bury_and_kick(server):
    with greenstalk_client(server.address) as c:
        late = c.put("late", priority=10)
        early = c.put("early", priority=1)
        delayed = c.put("delayed", delay=1)
        assert c.reserve(timeout=5).id == early
        job = c.reserve(timeout=5)
        assert job.id == late
        c.bury(job, priority=7)
        assert c.peek_buried().id == late
        assert c.kick(10) == 1
        assert c.stats_job(late)["pri"] == 7
        t0 = time.monotonic()
        got = {c.reserve(timeout=5).id, c.reserve(timeout=5).id}
        assert got == {late, delayed}
        assert time.monotonic() - t0 < 4


def test_greenstalk_reserve_times_out(server):
    with greenstalk_client(server.address) as c:
        t0 = time.monotonic()
        with pytest.raises(greenstalk.TimedOutError):
            c.reserve(timeout=1)
        assert 0.8 < time.monotonic() - t0 < 3.0


def test_greenstalk_stats_count_what_was_done(server):
    with greenstalk_client(server.address) as c:
        for i in range(5):
            c.put(f"job {i}")
        stats = c.stats()
        assert stats["cmd-put"] == 5 and stats["current-jobs-ready"] == 5
        assert stats["current-connections"] == 1
        assert c.stats_tube("default")["total-jobs"] == 5
        assert c.stats()["version"]


@pytest.fixture(params=list(PLACEMENTS))
def tcp_server(request, zstalk_factory):
    return zstalk_factory(extra_args=PLACEMENTS[request.param])


def test_pystalk_puts_reserves_releases_and_deletes(tcp_server):
    host, port = tcp_server.address
    c = BeanstalkClient(host, port, socket_timeout=10, auto_decode=True)
    c.use("work")
    c.watch("work")
    status, job_id = c.put_job("payload", pri=5)    # pystalk returns the reply word too
    assert status == b"INSERTED"
    job = c.reserve_job(timeout=5)
    assert (job.job_id, job.job_data) == (job_id, "payload")
    c.release_job(job_id, pri=5)
    assert c.stats_job(job_id)["releases"] == 1
    job = c.reserve_job(timeout=5)
    c.delete_job(job.job_id)
    assert c.stats_tube("work")["cmd-delete"] == 1
    assert "work" in c.list_tubes()
    c.close()


def test_a_blocked_reserve_wakes_when_another_client_puts(tcp_server):
    got = {}

    def worker():
        with greenstalk_client(tcp_server.address) as w:
            job = w.reserve(timeout=10)
            got["job"] = (job.id, job.body)
            w.delete(job)

    t = threading.Thread(target=worker)
    t.start()
    time.sleep(0.3)
    with greenstalk_client(tcp_server.address) as p:
        job_id = p.put("wake up")
    t.join(10)
    assert got["job"] == (job_id, "wake up")


def test_a_closed_connection_gives_its_reserved_job_back_at_once(tcp_server):
    with greenstalk_client(tcp_server.address) as p:
        job_id = p.put("x", ttr=100)
        with greenstalk_client(tcp_server.address) as w:
            assert w.reserve(timeout=5).id == job_id
        deadline = time.monotonic() + 3
        while p.stats_job(job_id)["state"] != "ready":
            assert time.monotonic() < deadline
            time.sleep(0.02)


# -- cluster ---------------------------------------------------------------------------
@pytest.fixture
def cluster(zstalk_cluster):
    if self_check():
        pytest.skip("needs a real zstalk cluster")
    return zstalk_cluster(fronts=2)


def test_a_job_put_through_one_front_is_reserved_through_another(cluster):
    a, b = cluster.front_addresses
    with greenstalk_client(a) as p, greenstalk_client(b) as w:
        job_id = p.put("across")
        job = w.reserve(timeout=5)
        assert (job.id, job.body) == (job_id, "across")
        w.delete(job)
        assert p.stats()["current-connections"] == 2


def test_a_reserve_blocked_on_one_front_wakes_when_the_other_front_puts(cluster):
    a, b = cluster.front_addresses
    got = {}

    def worker():
        with greenstalk_client(a) as w:
            got["job"] = w.reserve(timeout=10).body

    t = threading.Thread(target=worker)
    t.start()
    time.sleep(0.3)
    with greenstalk_client(b) as p:
        p.put("from b")
    t.join(10)
    assert got["job"] == "from b"


def test_pystalk_works_through_a_cluster_front(cluster):
    host, port = cluster.front_addresses[1]
    c = BeanstalkClient(host, port, socket_timeout=10)
    _, job_id = c.put_job("via front 1")
    assert c.reserve_job(timeout=5).job_id == job_id
    c.delete_job(job_id)
    c.close()
