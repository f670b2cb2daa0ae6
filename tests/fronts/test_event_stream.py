"""The HTTP front's event streams (protocol/fronts/http/streams.py, events.py): first the
rules as data (which place is news, the id that says what was sent), then real HTTP on
loopback against a front whose broker is test_http_front's FakeLink, answering T_INFO
and T_POSITIONS with the places a test sets: the events in order, one positions query a
tick for every stream, and the caps (the front's, per client address, the unsent bytes
of a reader that never reads).  With a real broker: tests/end_to_end/
test_event_stream_end_to_end.py."""
from __future__ import annotations

import asyncio
import json
import socket
import time

import aiohttp
import pytest

from test_http_front import CREATED, FakeLink, listening_socket
from zstalk.protocol.codecs.passes import check_pass
from zstalk.protocol.fronts.http import events, streams
from zstalk.protocol.fronts.http.events import Sent, moved, next_event, state
from zstalk.protocol.fronts.http.front import HttpFront
from zstalk.protocol.links.owner import READY
from zstalk.protocol.network.listen import HttpLimits
from zstalk.protocol.network.pass_keys import as_pass_keys
from zstalk.protocol.schema import MAX_POSITIONS, Op, R

WAIT_S = 10.0
TICK_S = 0.05


# -- the rules -----------------------------------------------------------------------------
def queued(wait_num: int, wait_time: int | None = 10_000, **more) -> dict:
    place = {"status": "queued", "waitNum": wait_num, **more}
    return place if wait_time is None else {**place, "waitTime": wait_time}


@pytest.mark.parametrize("before, after, news", [
    (queued(3), queued(3), False),
    (queued(3), queued(2), True),
    (queued(3, 10_000), queued(3, 9_100), False),       # 9 %, under 5 s
    (queued(3, 10_000), queued(3, 9_000), True),        # 10 %
    (queued(3, 100_000), queued(3, 95_000), True),      # 5 s, 5 %
    (queued(3, 100_000), queued(3, 96_000), False),
    (queued(3, 1000), queued(3, None), True),           # no estimate any more
    (queued(3), queued(3, phase="pre-line"), True),     # any other field, a later one too
])
def test_a_place_is_news_when_waitnum_or_anything_else_changes_or_waittime_moves_enough(
        before, after, news):
    assert moved(state(before), state(after)) is news


def test_the_event_a_place_calls_for_follows_its_status():
    assert next_event(None, queued(0))[0] == "place"
    assert next_event(None, {"status": "running"})[0] == "place"
    assert next_event(None, {"status": "admitted", "passExpiresAt": 1.0})[0] == "admitted"
    for status in ("success", "failed", "cancelled"):
        assert next_event(None, {"status": status})[0] == "end"
    assert next_event(state(queued(4)), queued(4)) is None


def test_an_event_id_is_the_state_sent_and_reads_back_on_any_front():
    sent = state(queued(12, 34_000))
    assert Sent.parse(sent.event_id()) == sent and sent.event_id().endswith(".12.34000")
    assert Sent.parse(state({"status": "running"}).event_id()).wait_num is None
    for garbage in ("", "nonsense", "abc.1.2", "x" * 200, None):
        assert Sent.parse(garbage) is None, garbage


def test_an_event_is_one_block_of_server_sent_events():
    data = events.event_data("end", {"status": "failed", "error": "x\ny", "waitNum": 3})
    assert data == {"status": "failed", "error": "x\ny"}
    raw = events.encode("end", data, "AAAAAAAA..")
    assert raw == b'event: end\nid: AAAAAAAA..\ndata: {"status":"failed","error":"x\\ny"}\n\n'


# -- over HTTP -----------------------------------------------------------------------------
class Broker:
    """What the FakeLink answers: each task's place (a test changes them), T_INFO with the
    task's info and T_POSITIONS with the places; the positions ops are kept."""

    def __init__(self, **places) -> None:
        self.places = places
        self.asked: list[list] = []

    def answer(self, op: tuple) -> tuple:
        if op[0] == Op.T_POSITIONS:
            self.asked.append(list(op[2]))
            return (1, R.T_POSITIONS, [self.places.get(uid) for uid in op[2]])
        uid = op[2]
        if uid not in self.places:
            return (1, R.T_ERROR, "not_found", f"no task {uid!r}")
        if len(op) > 4:                 # (a token: here always another task's)
            return (1, R.T_ERROR, "forbidden", "this token is not the task's own")
        return (1, R.T_TASK, {"uniqueId": uid, "function": "shop", "createdAt": CREATED,
                              "attempt": 0, "attempts": 1, **self.places[uid]})


def serve_streams(scenario, broker: Broker, limits: HttpLimits = HttpLimits(),
                  tweak=lambda front: None, **front_options):
    """A front with `broker` behind its FakeLink, its streams ticking every TICK_S, on
    127.0.0.1: `scenario(port, front)`'s result."""
    async def main():
        link = FakeLink(broker.answer)
        front = HttpFront("tcp://127.0.0.1:1", link=link, limits=limits, **front_options)
        link.front = front
        link.state = READY
        front.streams.tick_s = TICK_S
        tweak(front)
        sock = listening_socket()
        await front.start([sock])
        try:
            return await scenario(sock.getsockname()[1], front)
        finally:
            await front.close()
    return asyncio.run(main())


async def read_events(response, count: int) -> list[tuple[str, dict, str]]:
    """The next `count` events of a stream: (name, data, id)."""
    out, block = [], {}
    async with asyncio.timeout(WAIT_S):
        while len(out) < count:
            line = (await response.content.readline()).decode()
            assert line, f"the stream ended after {out}"
            if line == "\n":
                if "event" in block:
                    out.append((block["event"], json.loads(block["data"]), block["id"]))
                block = {}
            elif not line.startswith(":"):
                name, _, value = line.rstrip("\n").partition(": ")
                block[name] = value
    return out


async def until(predicate, what: str) -> None:
    async with asyncio.timeout(WAIT_S):
        while not predicate():
            await asyncio.sleep(0.01)


def test_a_stream_sends_the_place_then_each_change_then_the_pass_then_the_end(tmp_path):
    keys = tmp_path / "passes"
    keys.write_text("k1:" + "k" * 32 + "\n")
    broker = Broker(t1=queued(2, 20_000))

    async def scenario(port, front):
        async with aiohttp.ClientSession() as client:
            async with client.get(f"http://127.0.0.1:{port}/v1/tasks/t1/events") as response:
                assert response.status == 200
                assert response.headers["Content-Type"] == "text/event-stream"
                assert response.headers["Cache-Control"] == "no-store"
                assert response.headers["X-Accel-Buffering"] == "no"
                assert await response.content.readline() == b"retry: 2000\n"
                [first] = await read_events(response, 1)
                broker.places["t1"] = queued(2, 19_500)        # not news
                await until(lambda: len(broker.asked) >= 3, "three ticks")
                broker.places["t1"] = queued(1, 10_000)
                [second] = await read_events(response, 1)
                broker.places["t1"] = {"status": "admitted", "passExpiresAt": time.time() + 60,
                                       "admitUrl": "https://shop.example/in"}
                [third] = await read_events(response, 1)
                broker.places["t1"] = {"status": "success", "endedBy": "done"}
                [fourth] = await read_events(response, 1)
                assert await response.content.read() == b"", "the stream ends after the end"
        return first, second, third, fourth

    first, second, third, fourth = serve_streams(scenario, broker, pass_key_file=str(keys))
    assert first[:2] == ("place", {"status": "queued", "waitNum": 2, "waitTime": 20_000})
    assert first[2] == state(queued(2, 20_000)).event_id()
    assert second[:2] == ("place", {"status": "queued", "waitNum": 1, "waitTime": 10_000})
    name, data, _ = third
    assert name == "admitted" and set(data) == {"pass", "passExpiresAt", "admitUrl"}
    assert check_pass(data["pass"], as_pass_keys(str(keys)), time.time()) == "t1"
    assert data["admitUrl"] == f"https://shop.example/in#zstalk_pass={data['pass']}"
    assert fourth[:2] == ("end", {"status": "success", "endedBy": "done"})


def test_last_event_id_of_the_same_place_sends_nothing_until_it_moves():
    broker = Broker(t1=queued(5))

    async def scenario(port, front):
        said = {"Last-Event-ID": state(queued(5)).event_id()}
        async with aiohttp.ClientSession() as client:
            async with client.get(f"http://127.0.0.1:{port}/v1/tasks/t1/events",
                                  headers=said) as response:
                assert await response.content.readline() == b"retry: 2000\n"
                await until(lambda: len(broker.asked) >= 3, "three ticks")
                broker.places["t1"] = queued(4)
                return await read_events(response, 1)

    [(name, data, _)] = serve_streams(scenario, broker)
    assert (name, data["waitNum"]) == ("place", 4), "the first event is the new place"


def test_an_unknown_task_or_another_tasks_token_is_refused_in_json_before_any_stream():
    broker = Broker(t1=queued(5))

    async def scenario(port, front):
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as client:
            out = []
            other = {"Authorization": "Bearer zt1_" + "x" * 43}
            for path, headers in (("/v1/tasks/nosuch/events", {}),
                                  ("/v1/tasks/t1/events", other)):
                async with client.get(path, headers=headers) as response:
                    out.append((response.status, response.content_type,
                                (await response.json())["error"]))
            return out, front.streams.count

    out, count = serve_streams(scenario, broker)
    assert out == [(404, "application/json", "not_found"),
                   (403, "application/json", "forbidden")]
    assert count == 0, "a refused stream gives its place back"


def test_one_positions_query_a_tick_asks_about_every_followed_task_once(monkeypatch):
    monkeypatch.setattr(streams, "MAX_POSITIONS", 2)
    broker = Broker(**{f"t{i}": queued(i) for i in range(3)})

    async def scenario(port, front):
        async with aiohttp.ClientSession() as client:
            opened = [await client.get(f"http://127.0.0.1:{port}/v1/tasks/{uid}/events")
                      for uid in ("t0", "t1", "t2", "t1")]
            for response in opened:
                await read_events(response, 1)
            broker.asked.clear()
            await until(lambda: len(broker.asked) >= 4, "two ticks")
            for response in opened:
                response.close()
        return broker.asked[:2]

    first, second = serve_streams(scenario, broker)
    assert sorted(first + second) == ["t0", "t1", "t2"], "each task once, two ids an op"
    assert len(first) == 2 and MAX_POSITIONS == 500


async def fill(client: aiohttp.ClientSession, url: str, n: int) -> tuple[list, tuple]:
    """Open `n` streams of `url`, kept open, and one more: (the n, the refusal's status,
    Retry-After and error code)."""
    kept = [await client.get(url) for _ in range(n)]
    async with client.get(url) as refused:
        return kept, (refused.status, refused.headers.get("Retry-After"),
                      (await refused.json())["error"])


def test_beyond_the_fronts_stream_cap_a_stream_is_refused_503_with_retry_after():
    broker = Broker(t1=queued(5))

    async def scenario(port, front):
        async with aiohttp.ClientSession() as client:
            kept, answer = await fill(client, f"http://127.0.0.1:{port}/v1/tasks/t1/events", 2)
            async with client.get(f"http://127.0.0.1:{port}/v1/openapi.json") as other:
                plain = other.status     # (streams are apart from the connection cap)
            for response in kept:
                response.close()
        return answer, plain

    answer, plain = serve_streams(scenario, broker, HttpLimits(max_connections=2, max_streams=2))
    assert answer == (503, "10", "streams_full")
    assert plain == 200


def test_a_fifth_stream_from_one_address_is_refused_429_and_others_are_not():
    broker = Broker(t1=queued(5))

    async def scenario(port, front):
        async with aiohttp.ClientSession() as client:
            url = f"http://127.0.0.1:{port}/v1/tasks/t1/events"
            kept, answer = await fill(client, url, 4)
            kept[0].close()
            await until(lambda: front.streams.count == 3, "the closed stream gone")
            again = await client.get(url)
            answer += (again.status,)
            for response in (*kept, again):
                response.close()
        return answer

    assert serve_streams(scenario, broker) == (429, "10", "too_many_streams", 200)


def test_a_reader_that_never_reads_is_cut_once_64_kib_are_unsent_and_a_reader_is_not():
    # a place that changes every tick with a big field, to a client with a small receive
    # buffer that reads nothing: the kernel's buffers fill, then the front's; past
    # BUFFER_MAX unsent the front aborts the connection, and nobody else notices
    broker = Broker(slow=queued(0), fast=queued(0))
    big = "x" * 4000

    async def flip(front):
        n = 0
        while True:
            n += 1
            broker.places["slow"] = broker.places["fast"] = queued(n % 2, note=big + str(n))
            await asyncio.sleep(TICK_S / 2)

    async def scenario(port, front):
        flipper = asyncio.get_running_loop().create_task(flip(front))
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /v1/tasks/slow/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        async with aiohttp.ClientSession() as client:
            async with client.get(f"http://127.0.0.1:{port}/v1/tasks/fast/events") as fast:
                await until(lambda: front.streams.closed_full == 1, "the slow stream cut")
                await read_events(fast, 3)          # (the reader reads on)
                streaming = front.streams.open
        flipper.cancel()
        sock.setblocking(False)
        got, ended = 0, False
        deadline = time.monotonic() + WAIT_S
        while not ended and time.monotonic() < deadline:
            try:
                chunk = sock.recv(1 << 16)
                got, ended = got + len(chunk), not chunk
            except BlockingIOError:
                await asyncio.sleep(0.01)
            except ConnectionResetError:
                ended = True
        sock.close()
        return streaming, got, ended

    streaming, got, ended = serve_streams(scenario, broker)
    assert streaming == 1, "only the reader's stream is left"
    assert ended, "the slow reader's connection was closed"
    assert got < 8 << 20


def test_a_stream_pings_when_nothing_changes():
    broker = Broker(t1=queued(5))

    async def scenario(port, front):
        async with aiohttp.ClientSession() as client:
            async with client.get(f"http://127.0.0.1:{port}/v1/tasks/t1/events") as response:
                await read_events(response, 1)
                async with asyncio.timeout(WAIT_S):
                    while (line := await response.content.readline()) != b": ping\n":
                        assert line in (b"\n",), line
                return True

    assert serve_streams(scenario, broker,
                         tweak=lambda front: setattr(front.streams, "ping_s", 0.2))


def test_the_stream_cap_is_what_the_open_files_allow_when_they_allow_fewer(monkeypatch):
    from zstalk.protocol.network import files
    monkeypatch.setattr(files, "open_now", lambda: 36)
    monkeypatch.setattr(files, "raise_open_files", lambda: 1_048_576)
    assert files.stream_capacity(10_000, 1000) == (
        10_000, "up to 10,000 event streams (open files 1,048,576)")
    monkeypatch.setattr(files, "raise_open_files", lambda: 4096)
    fit = 4096 - 36 - 1000 - files.RESERVE
    assert files.stream_capacity(10_000, 1000) == (
        fit, f"up to {fit:,} event streams (open files 4,096, fewer than "
             "--http-max-streams 10,000)")
    assert files.stream_capacity(0, 0)[0] == 4096 - 36 - files.RESERVE


def test_the_open_files_limit_is_raised_to_the_hard_limit():
    import resource

    from zstalk.protocol.network.files import raise_open_files
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
        raised = raise_open_files()
        assert raised == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert raised == hard or (hard == resource.RLIM_INFINITY and raised >= 1024)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
