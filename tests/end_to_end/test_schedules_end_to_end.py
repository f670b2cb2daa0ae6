"""Cron schedules end to end: `zstalk serve --config` as a real process, the function host
of test_tasks_end_to_end.py, and plain HTTP requests: a schedule made through the API
fires tasks on real seconds, and refusals name the field and the reason."""
from __future__ import annotations

import time

import pytest

from servers import self_check
from test_tasks_end_to_end import WAIT_S, host, serve, serve_with_binlog  # noqa: F401

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")


def test_a_schedule_made_over_http_calls_its_function_every_second_until_deleted(serve, host):
    api = serve("--master-key", "k")
    assert api.request("POST", "/v1/schedules", {"name": "tick", "cron": "* * * * * ?",
                                                  "function": "tick"})[0] == 401
    api.key = "k"
    code, info = api.request("POST", "/v1/schedules", {
        "name": "tick", "cron": "* * * * * ?", "timezone": "Europe/Berlin",
        "function": "tick", "params": {"n": 1}, "options": {"keepResult": 60000}})
    assert code == 201 and info["timezone"] == "Europe/Berlin" and info["params"] == {"n": 1}
    assert info["nextFireAt"].endswith(".000Z")         # on a whole second
    deadline = time.monotonic() + WAIT_S
    while len(host.called("tick")) < 3:
        assert time.monotonic() < deadline, "fewer than 3 fires"
        time.sleep(0.05)
    arrivals = [call.at for call in host.called("tick")[:3]]
    assert 0.5 < arrivals[1] - arrivals[0] < 1.5 and 0.5 < arrivals[2] - arrivals[1] < 1.5
    code, page = api.request("GET", "/v1/schedules")
    assert code == 200 and [s["name"] for s in page["schedules"]] == ["tick"]
    assert page["schedules"][0]["lastFireAt"].endswith(".000Z")
    assert api.request("DELETE", "/v1/schedules/tick")[0] == 200
    time.sleep(0.3)                                     # a fire already on its way
    calls = len(host.called("tick"))
    time.sleep(1.5)
    assert len(host.called("tick")) == calls
    assert api.request("GET", "/v1/schedules/tick")[0] == 404


@pytest.mark.parametrize("body, words", [
    ({"name": "x", "cron": "0 */5 * * *", "function": "f"}, "cron"),
    ({"name": "x", "cron": "0 0 0 ? * 8", "function": "f"}, "day-of-week"),
    ({"name": "x", "cron": "61 * * * * ?", "function": "f"}, "second"),
    ({"name": "x", "cron": "* * * * * ?", "timezone": "Mars/Base", "function": "f"},
     "timezone"),
    ({"name": "x", "cron": "* * * * * ?"}, "function is required"),
    ({"name": "x", "cron": "* * * * * ?", "function": "f", "colour": 1}, "colour"),
])
def test_a_bad_schedule_is_a_400_naming_the_field(serve, body, words):
    api = serve()
    code, reply = api.request("POST", "/v1/schedules", body)
    assert (code, reply["error"]) == (400, "bad_request") and words in reply["message"]
    assert api.request("GET", "/v1/schedules")[1]["schedules"] == []


def test_pausing_and_resuming_a_schedule_over_http(serve, host):
    api = serve()
    api.request("POST", "/v1/schedules", {"name": "p", "cron": "* * * * * ?", "function": "p"})
    code, info = api.request("PATCH", "/v1/schedules/p", {"paused": True})
    assert code == 200 and info["paused"] is True and "nextFireAt" not in info
    time.sleep(0.3)
    calls = len(host.called("p"))
    time.sleep(1.5)
    assert len(host.called("p")) == calls
    assert api.request("PATCH", "/v1/schedules/p", {"paused": "no"})[0] == 400
    code, info = api.request("PATCH", "/v1/schedules/p", {"paused": False})
    assert code == 200 and info["nextFireAt"]


def test_schedules_survive_kill_9_of_the_broker_with_a_binlog(tmp_path, host):
    server, api = serve_with_binlog(tmp_path, host)
    try:
        api.wait_listening()
        api.request("POST", "/v1/schedules", {"name": "daily", "cron": "0 30 10-13 ? * WED,FRI",
                                              "timezone": "America/New_York", "function": "f"})
        before = api.request("GET", "/v1/schedules/daily")[1]
        server.kill()
        server.start()
        api.wait_listening()
        assert api.request("GET", "/v1/schedules/daily") == (200, before)
    finally:
        server.stop()
