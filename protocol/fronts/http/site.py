"""How the HTTP front listens: TLS, time limits against slow clients, a connection limit.

aiohttp's SockSite serves a socket bound by the caller but takes none of these, so the
front uses `GuardedSite` and the limits of `HttpLimits` (protocol/network/listen.py):

* Headers: aiohttp's keep-alive timer (the runner's `keepalive_timeout`) closes a
  connection that is waiting for a request.  Since aiohttp 3.14.5 it is armed when the
  connection opens as well as after each response (aiohttp PR 13681), so with
  `header_timeout_s` it is a header timeout: a request's headers must be complete within
  that time of the connection (after its TLS handshake) or of the previous response,
  however slowly they trickle in, or the connection is closed.  With no response: the
  timer cannot tell a half-sent request from an idle keep-alive connection, and a 408
  written on an idle one may be read by a client as the answer to its next request
  (nginx's client_header_timeout and Go's ReadHeaderTimeout close silently too).  An
  idle keep-alive connection is closed after the same time.
* TLS handshake: at most the same time (`ssl_handshake_timeout`; asyncio's default is 60 s).
* Body: the front reads bodies itself, within `body_timeout_s` (http_front.read_body),
  and answers 408 past it; `close_after_408` then closes the connection as soon as the
  408 is written (RFC 9110 section 15.5.9), where aiohttp would linger up to 10 s reading
  the rest of a body that is not coming.
* Connections: beyond `max_connections` open HTTP connections, a new one is accepted and
  closed at once, as the beanstalk and counter fronts do.  No 503: a response written
  before the request is read is often lost to the reset that closing with unread data
  sends (RFC 9112 section 9.6), and answering reliably means reading the request, which
  is the work the limit is there to refuse.  A connection in its TLS handshake is not
  counted until the handshake ends (aiohttp sees it only then); the handshake timeout
  bounds how long it can wait.  A connection that became an event stream is not counted
  (`streaming`): streams have their own cap (streams.py), so a front full of visitors'
  streams still answers requests.
"""
from __future__ import annotations

import asyncio
import socket
from typing import Callable

from aiohttp import web

from ...network.listen import BACKLOG, HttpLimits


class Refused(asyncio.Protocol):
    """A connection over the limit: closed as soon as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class GuardedSite(web.BaseSite):
    """aiohttp's SockSite with a TLS handshake timeout and the connection limit."""

    def __init__(self, runner: web.AppRunner, sock: socket.socket, limits: HttpLimits,
                 tls=None, streaming: Callable[[], int] = lambda: 0) -> None:
        super().__init__(runner, ssl_context=tls)
        self.sock = sock
        self.limits = limits
        self.streaming = streaming      # connections that are event streams now

    @property
    def name(self) -> str:
        address = self.sock.getsockname()
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{address if isinstance(address, str) else address[:2]}"

    async def start(self) -> None:
        await super().start()
        handshake_s = self.limits.header_timeout_s if self._ssl_context else None
        # backlog: asyncio listen()s again with it, so the socket keeps listen.py's
        self._server = await asyncio.get_running_loop().create_server(
            self.accept, sock=self.sock, ssl=self._ssl_context, backlog=BACKLOG,
            ssl_handshake_timeout=handshake_s)

    def accept(self) -> asyncio.BaseProtocol:
        """The protocol for a new connection: aiohttp's, or Refused past the limit."""
        server = self._runner.server
        limit = self.limits.max_connections
        if limit and len(server.connections) - self.streaming() >= limit:
            return Refused()
        return server()


@web.middleware
async def close_after_408(request: web.Request, handler) -> web.StreamResponse:
    """A 408 is written, then the connection closed (the transport sends what it holds
    before it closes)."""
    response = await handler(request)
    if response.status == 408:
        response.force_close()
        await response.prepare(request)
        await response.write_eof()
        request.protocol.force_close()
    return response
