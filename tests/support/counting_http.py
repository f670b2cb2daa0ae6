"""An HTTP/1.1 server that counts requests per TCP connection, for keep-alive tests.

`CountingServer(address)` listens in a thread (port 0 by default: no race for a port) and
answers every request 200 `{}` after `delay_s`, keeping the connection open until the
client closes it or a request says `Connection: close` (then it answers and closes, as
RFC 9112 section 9.6 asks).  `connections` lists one `Seen` per accepted connection, in
accept order: how many requests it carried, which of them said `Connection: close`
(1-based), and when (time.monotonic) the client closed it (None: still open).
"""
from __future__ import annotations

import socket
import socketserver
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Seen:
    requests: int = 0
    closing: list[int] = field(default_factory=list)   # the requests that said close
    hosts: list[str] = field(default_factory=list)
    closed_at: float | None = None


class CountingServer:
    def __init__(self, address: tuple[str, int] = ("127.0.0.1", 0), delay_s: float = 0.0):
        self.delay_s = delay_s
        self.connections: list[Seen] = []
        self.lock = threading.Lock()
        server = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                seen = Seen()
                with server.lock:
                    server.connections.append(seen)
                try:
                    while server.answer(self.rfile, self.wfile, seen):
                        pass
                finally:
                    seen.closed_at = time.monotonic()

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self._server = socketserver.ThreadingTCPServer(address, Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def answer(self, rfile, wfile, seen: Seen) -> bool:
        """One request on the connection; whether it stays open."""
        try:
            line = rfile.readline()
            if not line:
                return False
            headers = {}
            while (header := rfile.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = header.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            rfile.read(int(headers.get("content-length", 0)))
        except (ConnectionError, socket.timeout):
            return False
        seen.requests += 1
        seen.hosts.append(headers.get("host", ""))
        closing = headers.get("connection", "").lower() == "close"
        if closing:
            seen.closing.append(seen.requests)
        time.sleep(self.delay_s)
        try:
            wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Content-Length: 2\r\n" + (b"Connection: close\r\n" if closing else b"")
                        + b"\r\n{}")
            wfile.flush()
        except ConnectionError:
            return False
        return not closing

    def open_connections(self) -> int:
        with self.lock:
            return sum(1 for seen in self.connections if seen.closed_at is None)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "CountingServer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()
