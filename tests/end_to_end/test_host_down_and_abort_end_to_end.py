"""A function host that is down, and a call aborted, end to end (issue 46 items 2 and 3): a
real `zstalk serve` on free ports with its dispatcher, function hosts run by the test on
loopback, and plain HTTP requests.

A plain url's host down when five single-attempt tasks are enqueued, started two seconds
later: every task succeeds, none spent an attempt on the outage (they waited in place,
probed once per fail_timeout); with `max_fails = 0` the old fail-fast holds.  A running
task cancelled by its own token or the master key answers 200 `cancelled` at once, its
host sees the call's connection close, its slot goes to the next task, and an atMostOnce
task whose request was sent shows possiblyExecuted.  The broker's side on a fake clock:
tests/core/test_host_failures.py, tests/core/test_abort_calls.py."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from servers import LOOPBACK, free_port, self_check, wait_for
from test_tasks_end_to_end import FunctionHost, start_split
from test_waiting_room_end_to_end import call, serve

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")
KEY = "s3cret-master-key"
MASTER = {"Authorization": f"Bearer {KEY}"}


def start(tmp_path, config: str):
    return serve(tmp_path, "1/s", 1, "--master-key", KEY, config_text=config, keyed=False)


def enqueue(base: str, function: str, **options) -> dict:
    code, _, body = call("POST", f"{base}/v1/tasks",
                         {"function": function, "params": {}, "options": options}, MASTER)
    assert code == 201, body
    return body


def info(base: str, uid: str) -> dict:
    code, _, body = call("GET", f"{base}/v1/tasks/{uid}", headers=MASTER)
    assert code == 200, body
    return body


def test_a_host_down_at_enqueue_and_up_two_seconds_later_runs_every_task_on_its_only_attempt(
        tmp_path):
    host = FunctionHost()                   # (not listening yet: its port refuses)
    served = start(tmp_path, f'[functions.f]\nurl = "http://{LOOPBACK}:{host.port}/fn/f"\n'
                             'concurrency = 5\nfail_timeout = "1s"\n')
    try:
        uids = [enqueue(served.base, "f", attempts=0)["uniqueId"] for _ in range(5)]
        assert wait_for(lambda: "host" in call("GET", f"{served.base}/v1/functions/f",
                                               headers=MASTER)[2], 10)
        down = call("GET", f"{served.base}/v1/functions/f", headers=MASTER)[2]
        assert down["host"]["url"] == f"http://{LOOPBACK}:{host.port}"
        assert down["queued"] + down["running"] == 5, down     # (a probe may be on its way)
        assert down["host"]["fails"] >= 1 and down["host"].get("usableAt", "Z").endswith("Z")
        time.sleep(2.0)
        for uid in uids:                    # (waiting, or the probe refused this moment)
            got = info(served.base, uid)
            assert got["status"] in ("queued", "running") and got["calls"] <= 1, got
            assert got["status"] == "running" or got["calls"] == 0, "no attempt spent"
        with host:
            assert wait_for(lambda: all(info(served.base, uid)["status"] == "success"
                                        for uid in uids), 20), [info(served.base, u)
                                                                for u in uids]
            for uid in uids:
                got = info(served.base, uid)
                assert (got["calls"], got["maxCalls"]) == (1, 1), got
            assert len(host.called("f")) == 5
            assert "host" not in call("GET", f"{served.base}/v1/functions/f",
                                      headers=MASTER)[2], "a good probe forgot the host"
    finally:
        served.server.stop()


def test_with_max_fails_0_a_refused_call_spends_its_attempt_as_before(tmp_path):
    served = start(tmp_path, f'[functions.g]\nurl = "http://{LOOPBACK}:{free_port()}/g"\n'
                             'max_fails = 0\n')
    try:
        uid = enqueue(served.base, "g", attempts=0)["uniqueId"]
        assert wait_for(lambda: info(served.base, uid)["status"] == "failed", 10)
        failed = info(served.base, uid)
        assert failed["calls"] == 1 and "could not connect" in failed["error"], failed
    finally:
        served.server.stop()


class SilentHost:
    """A plain asyncio server on loopback that reads each call's request and never
    answers: it notes the task id of every request (`requests`) and of every connection
    its caller closed (`closed`)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.requests: list[str] = []
        self.closed: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        assert self.ready.wait(10), "the silent host did not start"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._serve, LOOPBACK, self.port))
        self.ready.set()
        self.loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        uid = next(line.split(":", 1)[1].strip() for line in head.split("\r\n")
                   if line.lower().startswith("x-zstalk-task-id:"))
        self.requests.append(uid)
        while await reader.read(65536):     # (the body, then nothing until the close)
            pass
        self.closed.append(uid)
        writer.close()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


def test_a_running_call_cancelled_is_aborted_its_host_sees_the_close_and_its_slot_goes_on(
        tmp_path):
    host = SilentHost()
    served = start(tmp_path, f'[functions.hold]\nurl = "http://{LOOPBACK}:{host.port}/hold"\n'
                             'concurrency = 1\ntimeout = "60s"\n')
    try:
        once = enqueue(served.base, "hold", deliveryMode="atMostOnce")
        least = enqueue(served.base, "hold")
        assert wait_for(lambda: host.requests == [once["uniqueId"]], 10)
        asked = time.monotonic()
        code, _, cancelled = call("DELETE", f"{served.base}/v1/tasks/{once['uniqueId']}",
                                  headers={"Authorization": f"Bearer {once['token']}"})
        assert (code, cancelled["status"]) == (200, "cancelled"), cancelled
        assert time.monotonic() - asked < 2, "answered at once, not after the call"
        assert wait_for(lambda: host.closed == [once["uniqueId"]], 10), "the call runs on"
        assert wait_for(lambda: host.requests[1:] == [least["uniqueId"]], 10), \
            "the aborted call's slot went to the next task"
        assert wait_for(lambda: info(served.base, once["uniqueId"]).get("possiblyExecuted"), 10)
        code, _, cancelled = call("DELETE", f"{served.base}/v1/tasks/{least['uniqueId']}",
                                  headers=MASTER)
        assert (code, cancelled["status"]) == (200, "cancelled"), cancelled
        assert wait_for(lambda: host.closed[1:] == [least["uniqueId"]], 10)
        time.sleep(0.5)                     # (its report, read only for possiblyExecuted)
        later = info(served.base, least["uniqueId"])
        assert later["status"] == "cancelled" and "possiblyExecuted" not in later, later
        code, _, again = call("DELETE", f"{served.base}/v1/tasks/{least['uniqueId']}",
                              headers=MASTER)
        assert (code, again["error"]) == (409, "not_cancellable")
    finally:
        served.server.stop()
        host.stop()


def test_a_dispatcher_in_its_own_process_is_told_over_zeromq_to_abort_the_call(tmp_path):
    host = SilentHost()
    procs, api, _ = start_split(tmp_path, host)         # (no master key: none needed)
    try:
        code, body = api.request("POST", "/v1/tasks", {"function": "remote"})
        assert code == 201, body
        assert wait_for(lambda: host.requests == [body["uniqueId"]], 10)
        code, info = api.request("DELETE", f"/v1/tasks/{body['uniqueId']}")
        assert (code, info["status"]) == (200, "cancelled"), info
        assert wait_for(lambda: host.closed == [body["uniqueId"]], 10), "the call runs on"
    finally:
        for proc in reversed(procs):
            proc.stop()
        host.stop()
