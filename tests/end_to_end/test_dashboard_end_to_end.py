"""The dashboard's data end to end (protocol/fronts/http/dashboard.py): a real `zstalk serve`
with a master key, tubes filled by a plain beanstalk client, a function's tasks, a counter
held, and GET /v1/dashboard and its event stream read over HTTP."""
from __future__ import annotations

import json
import time
import urllib.request

import pytest

from servers import LOOPBACK, RawClient, acquire_request, self_check, wait_for
from test_operator_views_end_to_end import KEY, put, server  # noqa: F401  (a fixture)

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")


def test_a_snapshot_shows_tubes_busiest_first_counters_and_functions(server):  # noqa: F811
    put(server.server.address, "quiet", b"1")
    put(server.server.address, "busy", b"1", b"2", b"3")
    assert server.enqueue("reports", None, delay=600000)[0] == 201
    with RawClient((LOOPBACK, server.counter_port), 10) as c:
        c.sock.sendall(acquire_request(b"gpu", 1, 4))
        c.sock.recv(100)
        code, snap = server.request("GET", "/v1/dashboard")
    assert code == 200, snap
    assert [t["name"] for t in snap["tubes"]][:2] == ["busy", "quiet"]
    busy = snap["tubes"][0]
    assert (busy["currentJobsReady"], len(busy["puts"])) == (3, 60)
    assert {"name": "gpu", "current": 1, "max": 1} in snap["counters"]
    [reports] = [f for f in snap["functions"] if f["name"] == "reports"]
    assert (reports["queued"], reports["delayed"]) == (1, 1)
    assert snap["schedules"] == []


def test_without_the_master_key_a_snapshot_shows_counts_but_no_functions(server):  # noqa: F811
    put(server.server.address, "emails", b"1")
    server.key = None
    code, snap = server.request("GET", "/v1/dashboard?q=emai")
    assert code == 200 and [t["name"] for t in snap["tubes"]] == ["emails"]
    assert snap["functions"] is None and snap["schedules"] is None
    server.key = "wrong"
    assert server.request("GET", "/v1/dashboard")[0] == 403


def test_functions_come_busiest_first_and_q_finds_one_beyond_the_first_page(server):  # noqa: F811
    for i in range(60):                     # (named under base_url: each one a function)
        assert server.enqueue(f"f-{i:03}", None, delay=600000)[0] == 201
    for _ in range(3):
        assert server.enqueue("zz-busy", None, delay=600000)[0] == 201
    code, snap = server.request("GET", "/v1/dashboard?limit=10")
    assert code == 200 and len(snap["functions"]) == 10
    assert (snap["functions"][0]["name"], snap["functions"][0]["queued"]) == ("zz-busy", 3)
    later = server.request("GET", f"/v1/dashboard?limit=10&functionsAfter={snap['functionsNext']}")
    assert later[1]["functions"][0]["name"] not in [f["name"] for f in snap["functions"]]
    code, snap = server.request("GET", "/v1/dashboard?limit=10&q=f-042")
    assert [f["name"] for f in snap["functions"]] == ["f-042"]     # (the 43rd by name)
    code, page = server.request("GET", "/v1/functions?sort=activity&limit=1")   # (the API's)
    assert (code, [f["name"] for f in page["functions"]], page["next"]) == (
        200, ["zz-busy"], "zz-busy")
    code, page = server.request("GET", "/v1/functions?q=f-04&limit=20")
    assert [f["name"] for f in page["functions"]] == [f"f-04{i}" for i in range(10)]
    assert server.request("GET", "/v1/functions?sort=size")[0] == 400


def test_puts_show_as_a_rate_from_the_fronts_per_second_differences(server):  # noqa: F811
    put(server.server.address, "busy", b"0")
    server.request("GET", "/v1/dashboard?q=busy")
    time.sleep(1.0)
    put(server.server.address, "busy", *[b"x"] * 5)
    code, snap = server.request("GET", "/v1/dashboard?q=busy")
    assert sum(snap["tubes"][0]["puts"]) == 5


def test_the_event_stream_sends_a_snapshot_every_second_and_a_put_shows_in_a_later_one(
        server):  # noqa: F811
    request = urllib.request.Request(server.base + "/v1/dashboard/events?q=live",
                                     headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=10) as stream:
        assert stream.headers["Content-Type"] == "text/event-stream"
        first = next_snapshot(stream)
        assert first["tubes"] == []
        put(server.server.address, "live", b"1")
        started = time.monotonic()
        while True:
            snap = next_snapshot(stream)
            if snap["tubes"]:
                break
        took = time.monotonic() - started
        print(f"\na put in a snapshot {took:.2f} s later")
        assert took < 5.0       # (about 1 s quiet: one a second; room for a loaded machine)
        assert snap["tubes"][0]["currentJobsReady"] == 1


def test_a_client_may_hold_four_dashboard_streams_and_no_more(server):  # noqa: F811
    opened = [urllib.request.urlopen(server.base + "/v1/dashboard/events", timeout=10)
              for _ in range(4)]
    try:
        code, doc = server.request("GET", "/v1/dashboard/events")
        assert (code, doc["error"]) == (429, "too_many_streams")
    finally:
        for stream in opened:
            stream.close()
    assert wait_for(lambda: server.request("GET", "/v1/dashboard?limit=1")[0] == 200, 5)


def next_snapshot(stream) -> dict:
    event = None
    for raw in stream:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: ") and event == "snapshot":
            return json.loads(line[6:])
    raise AssertionError("the stream ended")
