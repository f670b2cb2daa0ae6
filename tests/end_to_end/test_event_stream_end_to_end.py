"""A task's event stream end to end (issue 48): real `zstalk serve` (and `zstalk broker`
with two `zstalk front http`) on loopback, a room whose concurrency of one makes visitors
wait, and the streams read with aiohttp's client: a visitor's place falls, its pass
comes, its end closes the stream; another task's token is refused; Last-Event-ID
resumes on another front with nothing stale; the caps; an open stream keeps a place past
online_heartbeat, where a visitor without one is dropped; and docs/waiting-room.md's
curl example as written.  The front's rules in process: tests/fronts/test_event_stream.py."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import aiohttp
import pytest

from servers import LOOPBACK, ServerProcess, find_zstalk, free_port, self_check, wait_for
from test_task_limits_end_to_end import docs_block
from test_waiting_room_end_to_end import FUNCTION, call, room_files, serve

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")
WAIT_S = 20.0
#: a room of one visitor at a time, whose expected visit makes waitTime steady (a minute
#: per visitor ahead) rather than the rate's milliseconds
ROOM = (f'[functions.{FUNCTION}]\nonline = "only"\nconcurrency = 1\nrate = "100/s"\n'
        'pass_ttl = "60s"\nonline_heartbeat = "{heartbeat}"\nmax_waiting_per_client = 100\n'
        'expected_duration = "60s"\n')


def join(base: str) -> dict:
    """A visitor joins: its 201 (uniqueId, token, and the pass if admitted at once)."""
    code, _, body = call("POST", f"{base}/v1/tasks", {"function": FUNCTION, "type": "online"})
    assert code == 201, body
    return body


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def done(base: str, visitor: dict, pass_: str) -> None:
    code, _, body = call("POST", f"{base}/v1/tasks/{visitor['uniqueId']}/done", {},
                         bearer(pass_))
    assert code == 200, body


class Events:
    """One open stream, read event by event."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response

    async def next(self, timeout: float = WAIT_S) -> tuple[str, dict, str]:
        """The next event: (name, data, id)."""
        block: dict = {}
        async with asyncio.timeout(timeout):
            while True:
                line = (await self.response.content.readline()).decode()
                assert line, "the stream ended"
                if line == "\n" and "event" in block:
                    return block["event"], json.loads(block["data"]), block["id"]
                if line != "\n" and not line.startswith(":"):
                    name, _, value = line.rstrip("\n").partition(": ")
                    block[name] = value

    async def ended(self, timeout: float = WAIT_S) -> bool:
        async with asyncio.timeout(timeout):
            return await self.response.content.read() == b""


def streaming(scenario):
    """Run `scenario(open_stream)`; open_stream(url, headers) -> (status, Events or JSON)."""
    async def main():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as client:
            async def open_stream(url: str, headers: dict | None = None):
                response = await client.get(url, headers=headers or {})
                if response.status != 200:
                    body = await response.json()
                    response.release()
                    return response.status, body, response.headers
                return 200, Events(response), response.headers
            return await scenario(open_stream)
    return asyncio.run(main())


@pytest.fixture
def room(tmp_path):
    served = serve(tmp_path, config_text=ROOM.replace("{heartbeat}", "5m"))
    yield served
    served.server.stop()


def test_a_waiting_visitors_stream_shows_its_place_fall_then_its_pass_then_its_end(room):
    first, second, third = join(room.base), join(room.base), join(room.base)
    assert first["status"] == "admitted" and third["status"] == "queued"
    url = f"{room.base}/v1/tasks/{third['uniqueId']}/events"

    async def scenario(open_stream):
        status, events, headers = await open_stream(url, bearer(third["token"]))
        assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
        assert (headers["Cache-Control"], headers["X-Accel-Buffering"]) == ("no-store", "no")
        seen = [await events.next()]
        done(room.base, first, first["pass"])
        seen.append(await events.next())
        _, _, info = call("GET", f"{room.base}/v1/tasks/{second['uniqueId']}")
        done(room.base, second, info["pass"])
        seen.append(await events.next())
        done(room.base, third, seen[-1][1]["pass"])
        seen.append(await events.next())
        return seen, await events.ended()

    seen, ended = streaming(scenario)
    assert [(name, data.get("waitNum")) for name, data, _ in seen] == [
        ("place", 1), ("place", 0), ("admitted", None), ("end", None)]
    assert seen[0][1]["status"] == "queued" and "waitTime" in seen[0][1]
    assert set(seen[2][1]) == {"pass", "passExpiresAt"}     # (no admit_url configured)
    assert seen[3][1] == {"status": "success", "endedBy": "done"}
    assert ended, "the stream closes after its end"


def test_another_tasks_token_is_403_and_a_visitor_who_leaves_ends_the_stream(room):
    join(room.base)
    mine, other = join(room.base), join(room.base)
    url = f"{room.base}/v1/tasks/{mine['uniqueId']}/events"

    async def scenario(open_stream):
        refused = await open_stream(url, bearer(other["token"]))
        unknown = await open_stream(f"{room.base}/v1/tasks/nosuch/events")
        status, events, _ = await open_stream(url)      # (reads by id are public here)
        first = await events.next()
        code, _, _ = call("DELETE", f"{room.base}/v1/tasks/{mine['uniqueId']}",
                          headers=bearer(mine["token"]))
        assert code == 200
        return refused[:2], unknown[:2], status, first, await events.next(), \
            await events.ended()

    refused, unknown, status, first, last, ended = streaming(scenario)
    assert refused[0] == 403 and refused[1]["error"] == "forbidden"
    assert unknown[0] == 404 and unknown[1]["error"] == "not_found"
    assert status == 200 and first[0] == "place"
    assert last[:2] == ("end", {"status": "cancelled"}) and ended


def test_last_event_id_resumes_on_another_front_with_nothing_stale(tmp_path):
    keys, config = room_files(tmp_path, config_text=ROOM.replace("{heartbeat}", "5m"))
    port = free_port()
    endpoint = f"tcp://{LOOPBACK}:{port}"
    procs = [ServerProcess([find_zstalk(), "broker", "--bind", endpoint, "--config", config,
                            "--pass-key-file", keys], (LOOPBACK, port), name="broker").start()]
    bases = []
    try:
        for n in range(2):
            http = free_port()
            procs.append(ServerProcess([find_zstalk(), "front", "http", "--broker", endpoint,
                                        "--listen", f"{LOOPBACK}:{http}", "--pass-key-file",
                                        keys], (LOOPBACK, http), name=f"front-{n}").start())
            bases.append(f"http://{LOOPBACK}:{http}")
            assert wait_for(lambda: call("GET", f"{bases[-1]}/v1/tasks/x")[0] == 404, 20)
        first, _, third = join(bases[0]), join(bases[0]), join(bases[0])
        path = f"/v1/tasks/{third['uniqueId']}/events"

        async def scenario(open_stream):
            _, events, _ = await open_stream(bases[0] + path, bearer(third["token"]))
            place = await events.next()
            events.response.close()
            # on the other front, from that id: the place has not moved, so nothing comes
            # until it does; then the new place, not the old one
            said = {**bearer(third["token"]), "Last-Event-ID": place[2]}
            _, resumed, _ = await open_stream(bases[1] + path, said)
            with pytest.raises(TimeoutError):
                await resumed.next(timeout=3)
            done(bases[1], first, first["pass"])
            moved = await resumed.next()
            # and from a stale id (that first place), the current place comes first
            _, again, _ = await open_stream(bases[0] + path, said)
            return place, moved, await again.next()

        place, moved, again = streaming(scenario)
        assert place[1]["waitNum"] == 1
        assert moved[:2] == ("place", {**moved[1], "waitNum": 0}) and moved[2] != place[2]
        assert again == moved, "the current place, the same on both fronts"
    finally:
        for proc in reversed(procs):
            proc.stop()


def test_beyond_max_streams_503_and_a_fifth_stream_from_one_address_429(tmp_path):
    served = serve(tmp_path, "100/s", 1, "--http-max-streams", "6", config_text=ROOM.replace(
        "{heartbeat}", "5m") + "[api]\ntrust_forwarded = true\n")
    try:
        join(served.base)
        waiting = join(served.base)
        url = f"{served.base}/v1/tasks/{waiting['uniqueId']}/events"

        async def scenario(open_stream):
            kept = [await open_stream(url) for _ in range(4)]
            fifth = await open_stream(url)
            # other addresses, as a trusted proxy names them ([api] trust_forwarded)
            kept += [await open_stream(url, {"X-Forwarded-For": "203.0.113.7"})
                     for _ in range(2)]
            seventh = await open_stream(url, {"X-Forwarded-For": "203.0.113.8"})
            for _, events, _ in kept:
                events.response.close()
            return [status for status, _, _ in kept], fifth, seventh

        statuses, fifth, seventh = streaming(scenario)
    finally:
        served.server.stop()
    assert statuses == [200] * 6
    assert (fifth[0], fifth[1]["error"], fifth[2]["Retry-After"]) == (
        429, "too_many_streams", "10")
    assert (seventh[0], seventh[1]["error"], seventh[2]["Retry-After"]) == (
        503, "streams_full", "10")
    assert "up to 6 event streams (open files" in served.server.output()


def test_an_open_stream_keeps_a_place_past_online_heartbeat_and_one_without_is_dropped(
        tmp_path):
    # (a heartbeat of 4 s: the stream's front asks every second, so a loaded machine has
    # three to spare)
    served = serve(tmp_path, config_text=ROOM.replace("{heartbeat}", "4s"))
    try:
        holder = join(served.base)
        followed, forgotten = join(served.base), join(served.base)
        url = f"{served.base}/v1/tasks/{followed['uniqueId']}/events"

        def status_of(visitor: dict) -> str:       # (a listing does not count as looking)
            _, _, page = call("GET", f"{served.base}/v1/tasks?function={FUNCTION}")
            return next(t["status"] for t in page["tasks"]
                        if t["uniqueId"] == visitor["uniqueId"])

        async def scenario(open_stream):
            _, events, _ = await open_stream(url)
            first = await events.next()
            async with asyncio.timeout(WAIT_S):
                while status_of(forgotten) != "cancelled":
                    await asyncio.sleep(0.2)
            await asyncio.sleep(4)                          # (one heartbeat more)
            kept = status_of(followed)
            done(served.base, holder, holder["pass"])       # (its turn: the stream says so)
            return first, kept, await events.next()

        first, kept, admitted = streaming(scenario)
        assert first[1]["waitNum"] == 0 and kept == "queued"
        assert admitted[0] == "admitted", "its stream stayed open, its place kept"
    finally:
        served.server.stop()


def test_the_docs_curl_example_follows_a_visitor(room):
    join(room.base)         # (someone is in: the example's visitor waits)
    script = docs_block("waiting-room.md", "api=http://127.0.0.1:8080").replace(
        "http://127.0.0.1:8080", room.base)
    path = f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"    # (its python)
    proc = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PATH": path})
    try:
        lines = []
        deadline = time.monotonic() + WAIT_S
        while not any(line.startswith("data:") for line in lines):
            assert time.monotonic() < deadline, lines
            lines.append(proc.stdout.readline().rstrip("\n"))
    finally:
        proc.terminate()
        proc.wait(10)
    assert lines[:3] == ["retry: 2000", "", "event: place"]
    assert lines[3].startswith("id: ")
    place = json.loads(lines[4].removeprefix("data: "))
    assert (place["status"], place["waitNum"]) == ("queued", 0)
