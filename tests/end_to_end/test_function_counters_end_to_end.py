"""A function's concurrency as the yrmcds counter fn:NAME, end to end: `zstalk serve` with
a function of concurrency 4, a real function host counting the calls in flight, and the
tests' raw yrmcds CounterClient on the counter port; and a split cluster whose broker is
killed and restarted while a counter client holds slots."""
from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import pytest
from aiohttp import web

from app_thread import AppThread
from servers import LOOPBACK, CounterClient, ServerProcess, find_zstalk, free_port, self_check
from test_counter_end_to_end import OK, NOT_AVAILABLE, consumption, wait_for

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")
CALL_S = 0.3


class Host(AppThread):
    """Each call takes CALL_S; the most calls in flight at once, overall and since `mark`."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = self.in_flight = self.most = 0

    def mark(self) -> None:
        self.most = self.in_flight

    async def render(self, request: web.Request) -> web.Response:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await request.read()
        await asyncio.sleep(CALL_S)
        self.in_flight -= 1
        self.calls += 1
        return web.json_response({"ok": True})

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/render", self.render)


@pytest.fixture
def host():
    with Host() as h:
        yield h


@pytest.fixture
def served(tmp_path, host):
    config = tmp_path / "zstalk.toml"
    config.write_text(f'[functions.render]\nurl = "http://{LOOPBACK}:{host.port}/render"\n'
                      "concurrency = 4\n")
    port, counter, http = free_port(), free_port(), free_port()
    server = ServerProcess([find_zstalk(), "serve", "-l", LOOPBACK, "-p", str(port),
                            "--counter-port", str(counter), "--worker-bind", "none",
                            "--config", str(config), "--http-port", str(http)],
                           (LOOPBACK, counter), name="zstalk-fn-counters").start()
    yield (LOOPBACK, counter), f"http://{LOOPBACK}:{http}/v1"
    server.stop()


def enqueue(api: str, count: int) -> None:
    body = json.dumps([{"function": "render", "params": i} for i in range(count)]).encode()
    req = urllib.request.Request(f"{api}/tasks", body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200


def test_a_counter_client_holding_3_of_4_slots_leaves_one_call_at_a_time(served, host):
    address, api = served
    with CounterClient(address) as client:
        assert client.acquire(b"fn:render", 3, 4).status == OK
        assert client.acquire(b"fn:render", 2, 100).status == NOT_AVAILABLE
        enqueue(api, 6)
        assert wait_for(lambda: host.calls >= 3, 10)
        assert host.most == 1, "one slot left: one call at a time"
        assert consumption(client, b"fn:render") == 4
        records = {name: (now, most) for name, now, most in client.dump()}
        assert records[b"fn:render"] == (4, 4)
        host.mark()
        assert client.release(b"fn:render", 3).status == OK
        assert wait_for(lambda: host.calls == 6, 10)
        assert host.most >= 2, "the released slots took the rest of the queue"


def test_closing_a_counter_connection_frees_its_slots_and_the_queue_moves_at_once(
        served, host):
    address, api = served
    client = CounterClient(address)
    assert client.acquire(b"fn:render", 4, 4).status == OK
    enqueue(api, 2)
    time.sleep(0.5)
    assert host.calls == 0 and host.in_flight == 0
    closed = time.monotonic()
    client.close()
    assert wait_for(lambda: host.calls == 2, 10)
    assert time.monotonic() - closed < 3 * CALL_S + 2.0


def test_a_user_counter_named_fn_is_refused_only_when_functions_are_configured(
        served, zstalk_cluster):
    address, _ = served
    with CounterClient(address) as client:
        assert client.acquire(b"fn:nosuch", 1, 5).status == 0x04
        assert client.acquire(b"mine", 1, 5).status == OK
    plain = zstalk_cluster(fronts=0, counter_fronts=1)
    with CounterClient(plain.counter_addresses[0]) as client:
        assert client.acquire(b"fn:nosuch", 1, 5).status == OK


def test_slots_held_through_a_broker_restart_are_held_after_it(tmp_path, zstalk_cluster):
    config = tmp_path / "zstalk.toml"
    config.write_text(f'[functions.render]\nurl = "http://{LOOPBACK}:9/render"\n'
                      "concurrency = 4\n")
    cluster = zstalk_cluster(fronts=0, counter_fronts=1, broker_args=("--config", str(config)))
    with CounterClient(cluster.counter_addresses[0]) as client:
        assert client.acquire(b"fn:render", 3, 4).status == OK
        cluster.kill_broker()
        cluster.restart_broker()
        with CounterClient(cluster.counter_addresses[0]) as other:
            assert wait_for(lambda: consumption(other, b"fn:render") == 3, 8, step=0.1)
            assert wait_for(lambda: other.acquire(b"fn:render", 1, 4).status == OK, 15,
                            step=0.2), "the fourth slot is free once the fronts are back"
            assert other.acquire(b"fn:render", 1, 4).status == NOT_AVAILABLE
        assert client.release(b"fn:render", 3).status == OK, "the same session, still open"
