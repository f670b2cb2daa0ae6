# zstalk.workers.CounterClient, the documented client of the counters, against both servers
# it claims to speak to: Debian's yrmcds (the reference) and `zstalk serve`'s counter front.
# Each test runs the same steps on both and expects the same answers.
from __future__ import annotations

import time

import pytest

from test_differential_yrmcds import counter_processes, require_yrmcdsd, start_yrmcds  # noqa: F401
from yrmcds_servers import zstalk_serve_process
from zstalk.workers import CounterClient, CounterError, NotAvailable


@pytest.fixture(params=["yrmcds", "zstalk"])
def server(request, counter_processes, start_yrmcds):  # noqa: F811
    if request.param == "yrmcds":
        require_yrmcdsd()
        return start_yrmcds().address
    return counter_processes.start(lambda: zstalk_serve_process()).address


def test_acquire_takes_units_within_the_maximum_and_refuses_beyond_it(server):
    with CounterClient(*server) as a, CounterClient(*server) as b:
        assert a.acquire(b"renders", 2, maximum=3) == 2
        assert b.get(b"renders") == 2
        with pytest.raises(NotAvailable) as refused:
            b.acquire(b"renders", 2, maximum=3)
        assert refused.value.status == 0x21
        assert b.acquire(b"renders", 1, maximum=3) == 1
        a.release(b"renders", 2)
        assert b.get(b"renders") == 1


def test_hold_releases_when_its_block_raises(server):
    with CounterClient(*server) as c:
        with pytest.raises(RuntimeError):
            with c.hold(b"once", 1, maximum=1):
                assert c.get(b"once") == 1
                raise RuntimeError("render failed")
        assert c.acquire(b"once", 1, maximum=1) == 1


def test_closing_the_connection_gives_back_what_it_held(server):
    a = CounterClient(*server)
    a.acquire(b"seats", 1, maximum=1)
    a.close()
    with CounterClient(*server) as b:
        assert acquire_once_released(b, b"seats") == 1


def acquire_once_released(client: CounterClient, name: bytes, within_s: float = 5.0) -> int:
    """Acquire one unit of `name` (maximum 1), retrying while it is still held: a server
    notices a closed connection on its own schedule (yrmcds in its reader thread), so a
    new connection's Acquire may be served first. Fails if it is never given back."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return client.acquire(name, 1, maximum=1)
        except NotAvailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def test_releasing_what_it_did_not_acquire_and_an_unknown_counter_are_errors(server):
    with CounterClient(*server) as a, CounterClient(*server) as b:
        a.acquire(b"held", 1, maximum=2)
        with pytest.raises(CounterError) as not_held:
            b.release(b"held", 1)                   # a's, not b's
        with pytest.raises(CounterError) as unknown:
            b.get(b"nothing")
    assert (not_held.value.status, unknown.value.status) == (0x22, 0x01)
    assert str(unknown.value) == "Not found (status 0x01)"


def test_dump_and_stats_read_every_counter(server):
    with CounterClient(*server) as c:
        c.acquire(b"a", 1, maximum=5)
        c.acquire(b"b", 2, maximum=5)
        c.noop()
        assert sorted(c.dump()) == [(b"a", 1, 1), (b"b", 2, 2)]
        assert c.stats()["command:acquire"] == b"2"   # (yrmcds counts objects at its GC)
