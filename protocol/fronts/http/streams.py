"""The HTTP front's event streams (GET /v1/tasks/{id}/events, issue 48): each open stream
follows one task's place, and the front asks the broker about all of them at once.

How it works: the handler (front.py) checks who may follow the task as a read of it
(T_INFO: the task's token, the master key, or nothing where reads are public), which
also gives the first place; then `serve` holds the connection open as a `text/event-stream`
and writes what events.py says each new place calls for.  One task, `run`, asks the
broker once a tick (TICK_S) for the places of every task an open stream follows: one
T_POSITIONS of at most MAX_POSITIONS ids, the next sent when the previous is answered (a
front with more streams sends several a tick, so no op holds the broker long); the
broker counts each waiting user asked about as looking, so an open stream keeps its
user's place with no other heartbeat.  A stream keeps only the latest place it was
given (`Stream.offer`): a slow stream skips places, it never queues them.

Caps, each refused in the API's JSON with Retry-After:

* `max_streams` (--http-max-streams, 10,000 by default, 0: as many as the open files
  allow) across the front: beyond it 503 `streams_full`.  Streams are apart from the
  connection cap (--http-max-connections, site.py): a connection that became a stream no
  longer counts there, so streams do not starve requests nor requests streams.  The
  front raises its open-files limit (protocol/network/files.py), and the cap is what
  those files allow if that is fewer: a 503 is better than a failed accept().
* PER_CLIENT streams per client address (as the waiting room counts it: IPv6 by /64;
  the first X-Forwarded-For hop with [api] trust_forwarded): beyond it 429
  `too_many_streams`.  A connection with no address (a unix socket) has only the
  front's cap.
* BUFFER_MAX bytes unsent: a write that leaves more in the connection's buffer (the
  client reads slower than its place changes, or not at all) aborts the connection;
  the client reconnects with Last-Event-ID and gets the place as it is then.  The
  transport's high-water mark is set above it, so a write never waits for the client:
  one stuck reader holds BUFFER_MAX and one event at most, and holds up no one; and the
  socket's kernel buffer is kept small (`hold_little`), so the unsent bytes are the
  front's to see.

A comment is written every PING_S (proxies and clients see the connection alive); a
client gone is noticed at the next tick, a write, or a ping.  `close` (the front stops)
ends every stream, which a client takes as a reason to reconnect, to another front.
"""
from __future__ import annotations

import asyncio
import logging
import socket
from typing import Awaitable, Callable

from aiohttp import web

from ...ratelog import RateLog
from ...schema import MAX_POSITIONS, R
from ...schema.task_info import position
from . import events
from .api import STATUS, Problem

log = logging.getLogger("zstalk.http")

MAX_STREAMS = 10_000        # --http-max-streams' default
PER_CLIENT = 4              # streams per client address
BUFFER_MAX = 64 * 1024      # unsent bytes a stream may leave
TICK_S = 1.0                # how often the front asks for its streams' places
PING_S = 15.0               # a comment this often
RETRY_MS = 2000             # a client reconnects after this
RETRY_AFTER_S = 10          # a refused stream's Retry-After
HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-store",
           "X-Accel-Buffering": "no"}      # (nginx: pass each event on, do not buffer)
STREAMS_FULL = Problem(STATUS["streams_full"], "streams_full", "this front follows as many event streams as "
                                            "it may: try again later, or poll the task")
#: a positions query that failed is said at most this often (it is asked every tick)
SAY_FAILED_S = 60.0
TOO_MANY = Problem(STATUS["too_many_streams"], "too_many_streams", f"at most {PER_CLIENT} event streams per client "
                                            "address")


class Stream:
    """One open stream: its task, what it last sent, the newest place not yet looked at."""
    __slots__ = ("uid", "function", "client", "sent", "place", "wake", "transport", "written")

    def __init__(self, uid: str, function: str, client: str | None, sent: events.Sent | None,
                 transport: asyncio.Transport) -> None:
        self.uid, self.function, self.client = uid, function, client
        self.sent = sent
        self.place: dict | None = None
        self.wake = asyncio.Event()
        self.transport = transport
        self.written = 0.0          # when it was last written to (loop time): pings after

    def offer(self, place: dict) -> None:
        self.place = place          # (only the newest: a slow stream skips, never queues)
        self.wake.set()

    def gone(self) -> bool:
        return self.transport.is_closing()


class Streams:
    def __init__(self, ask: Callable[[list], Awaitable[tuple]], ready: Callable[[], bool],
                 sign: Callable[[dict], dict], max_streams: int = MAX_STREAMS) -> None:
        self.ask = ask              # T_POSITIONS of these ids to the broker: its reply
        self.ready = ready          # whether the broker is there to ask now
        self.sign = sign            # an admitted place with its pass (room.with_pass)
        self.max_streams = max_streams      # (network/files.py: the cap, or what fits)
        self.tick_s, self.ping_s, self.buffer_max = TICK_S, PING_S, BUFFER_MAX
        self.following: dict[str, set[Stream]] = {}     # task id -> its open streams
        self.count = 0              # streams open or opening
        self.open = 0               # streams open (their connections are streams)
        self.by_client: dict[str, int] = {}
        self.closing = False
        self.ticker: asyncio.Task | None = None
        self.closed_full = 0        # streams aborted for their unsent bytes
        self.failed = RateLog(log, SAY_FAILED_S, "failed")

    # -- the caps ----------------------------------------------------------------------
    def take(self, client: str | None) -> Problem | None:
        """Count a stream about to open for `client`, or say why it may not."""
        if self.closing or self.count >= self.max_streams:
            return STREAMS_FULL
        if client is not None and self.by_client.get(client, 0) >= PER_CLIENT:
            return TOO_MANY
        self.count += 1
        if client is not None:
            self.by_client[client] = self.by_client.get(client, 0) + 1
        return None

    def give_back(self, client: str | None) -> None:
        self.count -= 1
        if client is not None:
            left = self.by_client[client] - 1
            if left:
                self.by_client[client] = left
            else:
                del self.by_client[client]

    def streaming(self) -> int:
        """Connections that are streams now (the connection cap leaves them out)."""
        return self.open

    # -- one stream --------------------------------------------------------------------
    async def serve(self, request: web.Request, uid: str, info: dict, client: str | None,
                    dress: Callable[[web.StreamResponse], None]) -> web.StreamResponse:
        """Hold the request's connection as task `uid`'s stream (its info just read; the
        caller took its place with `take`, which this gives back at the end); `dress`
        adds the headers a middleware would (CORS), before the stream begins."""
        transport = request.transport
        stream = Stream(uid, info["function"], client,
                        events.Sent.parse(request.headers.get("Last-Event-ID")), transport)
        try:
            if transport is None or transport.is_closing():
                return web.Response(status=204)     # (the client left while we asked)
            response = web.StreamResponse(headers=HEADERS)
            response.force_close()          # (a stream's connection carries nothing after)
            dress(response)
            await response.prepare(request)
            hold_little(transport, self.buffer_max)
            self.following.setdefault(uid, set()).add(stream)
            self.open += 1
            stream.offer(position(info))
            if await self._write(stream, response, events.retry(RETRY_MS)):
                await self._pump(stream, response)
            return response
        finally:
            self._forget(stream)
            self.give_back(client)

    async def _pump(self, stream: Stream, response: web.StreamResponse) -> None:
        """Write the events the places call for, and the pings, until the task ends, the
        client goes, or the front closes."""
        while True:
            try:
                async with asyncio.timeout_at(stream.written + self.ping_s):
                    await stream.wake.wait()
                stream.wake.clear()
                chunk, done = self._news(stream)
            except TimeoutError:
                chunk, done = events.PING, False
            if self.closing or stream.gone():
                return
            if chunk and not await self._write(stream, response, chunk):
                return
            if done:
                await _quietly(response.write_eof())
                return

    def _news(self, stream: Stream) -> tuple[bytes, bool]:
        """The bytes the newest place calls for (b"": nothing new), and whether the
        stream is over."""
        place, stream.place = stream.place, None
        if place is None:
            return b"", False
        event = events.next_event(stream.sent, place)
        if event is None:
            return b"", events.ends(place)
        name, stream.sent = event
        if name == events.ADMITTED_EVENT:
            place = self.sign({**place, "uniqueId": stream.uid, "function": stream.function})
        data = events.event_data(name, place)
        return events.encode(name, data, stream.sent.event_id()), events.ends(place)

    async def _write(self, stream: Stream, response: web.StreamResponse, chunk: bytes) -> bool:
        """Write `chunk`; False if the stream is over (the client went, or left more than
        BUFFER_MAX unsent: then the connection is aborted, its buffer dropped)."""
        try:
            await response.write(chunk)
        except ConnectionError:
            return False
        stream.written = asyncio.get_running_loop().time()
        unsent = stream.transport.get_write_buffer_size()
        if unsent > self.buffer_max:
            log.info("HTTP front: an event stream of task %s left %d bytes unsent: closed "
                     "(its client reconnects)", stream.uid, unsent)
            self.closed_full += 1
            stream.transport.abort()
            return False
        return True

    def _forget(self, stream: Stream) -> None:
        streams = self.following.get(stream.uid)
        if streams is not None and stream in streams:
            self.open -= 1
            streams.discard(stream)
            if not streams:
                del self.following[stream.uid]

    # -- the positions query -------------------------------------------------------------
    def start(self) -> None:
        self.ticker = asyncio.get_running_loop().create_task(self.run())

    async def run(self) -> None:
        """Once a tick, the places of every followed task from the broker, to their
        streams (skipped while the broker is away: the streams ping on)."""
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while not self.closing:
            next_at = max(next_at + self.tick_s, loop.time())
            await asyncio.sleep(next_at - loop.time())
            self._sweep()
            if self.following and self.ready():
                try:
                    await self.tick()
                except Exception:       # (a bad reply must not end the streams' updates)
                    log.exception("HTTP front: the event streams' positions query failed")

    async def tick(self) -> None:
        """Ask about every followed task, MAX_POSITIONS ids an op, one op at a time."""
        uids = list(self.following)
        for at in range(0, len(uids), MAX_POSITIONS):
            asked = uids[at:at + MAX_POSITIONS]
            reply = await self.ask(asked)
            if reply[1] != R.T_POSITIONS:       # (the streams ping on, their places kept)
                self.failed.say("positions", asyncio.get_running_loop().time(),
                                "HTTP front: the broker answered the event streams' "
                                "positions query %r", reply[1:4])
                return
            for uid, place in zip(asked, reply[2]):
                for stream in self.following.get(uid, ()):
                    if place is None:       # (no longer kept: the client's reconnect 404s)
                        stream.transport.close()
                        stream.wake.set()
                    else:
                        stream.offer(place)

    def _sweep(self) -> None:
        """Wake the streams whose client went away, so they end now, not at a ping."""
        for streams in self.following.values():
            for stream in streams:
                if stream.gone():
                    stream.wake.set()

    async def close(self) -> None:
        """End every stream (the front stops): their clients reconnect elsewhere."""
        self.closing = True
        if self.ticker is not None:
            self.ticker.cancel()
        for streams in self.following.values():
            for stream in streams:
                stream.wake.set()
        for _ in range(3):              # (each writes nothing more and returns)
            await asyncio.sleep(0)


def hold_little(transport: asyncio.Transport, buffer_max: int) -> None:
    """Set up a stream's connection (this module's task streams, and the dashboard's
    snapshot stream, dashboard.py): its writes never wait on the client (`buffer_max`
    decides, below the high-water mark), and the kernel holds little of what it has not
    sent (SO_SNDBUF: a quarter of `buffer_max`, which Linux doubles), so what a client does
    not read piles up where the front sees it, not in an autotuned kernel buffer of
    megabytes per connection.  Events are small: that is room for hundreds in flight.
    Call it once the response is prepared, with the cap the stream cuts a client off at."""
    transport.set_write_buffer_limits(high=4 * buffer_max + (1 << 16))
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_max // 4)
        except OSError:
            pass


async def _quietly(write: Awaitable) -> None:
    try:
        await write
    except ConnectionError:
        pass
