# A low-overhead HTTP/1.1 load generator, built as loadgen.py's beanstalk ones are:
# plain Python on raw non-blocking sockets in one epoll (selectors) loop, requests
# pre-built as bytes, so that the server and not the generator is what a row measures:
# on 2 cores the two compete, and an aiohttp client spent 60 CPU-us on a verify request
# here, more than zstalk's front took to answer it (50-56), where this loop spends 14.
#
# Each connection is kept alive and has one request in flight, as the upstream
# connections of a gateway (nginx's auth_request) have: it sends its requests in turn,
# round and round, until it has its quota of answers.  An answer is read only as far as
# counting it needs: the status line, Content-Length (a body of that length is skipped;
# none on a 204) and the value of one header the caller names, so each answer is
# tallied by (status, that value) and one that is not what was wanted is counted apart,
# never taken for a success.  Chunked bodies are not read (zstalk's front sends
# Content-Length).  Connections are opened before the clock starts and closed after it
# stops; a run ends when every connection has its answers, or at a time cap (flagged
# "capped": the rate is then over what was answered by then).
from __future__ import annotations

import collections
import selectors
import time

from .loadgen import _receive, connect_many, split
from .procs import HOST

_CRLF2 = b"\r\n\r\n"
_LENGTH = b"\r\ncontent-length:"


def get_request(path: str, port: int, headers: dict[str, str] | None = None) -> bytes:
    """The bytes of `GET path` on a keep-alive connection to HOST:port."""
    lines = [f"GET {path} HTTP/1.1", f"Host: {HOST}:{port}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")


class _Conn:
    __slots__ = ("sock", "requests", "quota", "answers", "buf", "done")

    def __init__(self, sock, requests: list[bytes], quota: int) -> None:
        self.sock, self.requests, self.quota = sock, requests, quota
        self.answers, self.buf, self.done = 0, bytearray(), False

    def send_next(self) -> None:
        # (one short request on a connection with nothing in flight: the socket buffer
        # takes it whole)
        req = self.requests[self.answers % len(self.requests)]
        if self.sock.send(req) != len(req):
            raise OSError("a request did not fit the socket buffer")


def _answer(buf: bytearray, header: bytes) -> tuple[int, tuple[bytes, bytes]] | None:
    """(length, (status, the header's value)) of the whole answer at the start of buf, or
    None while it is not all there."""
    i = buf.find(_CRLF2)
    if i < 0:
        return None
    head = bytes(buf[:i]).lower()
    end = i + 4
    j = head.find(_LENGTH)
    if j >= 0:
        k = head.find(b"\r\n", j + 2)
        end += int(head[j + len(_LENGTH):k if k >= 0 else len(head)])
    if len(buf) < end:
        return None
    value = b""
    j = head.find(header)
    if j >= 0:
        k = head.find(b"\r\n", j + 2)
        value = head[j + len(header):k if k >= 0 else len(head)].strip()
    return end, (head[9:12], value)


def get_loop(conns: list[_Conn], header: bytes, time_cap: float) -> dict:
    sel = selectors.DefaultSelector()
    tally: collections.Counter = collections.Counter()
    errors: list[str] = []
    cpu0, t0 = time.process_time(), time.monotonic()
    deadline = t0 + time_cap
    waiting = [c for c in conns if c.quota]
    for c in waiting:
        sel.register(c.sock, selectors.EVENT_READ, c)
        c.send_next()
    active, capped = len(waiting), False
    while active and not capped:
        left = deadline - time.monotonic()
        capped = left <= 0
        for key, _ in [] if capped else sel.select(min(0.5, left)):
            c = key.data
            data = _receive(c, sel, errors, f"{c.answers} answers")
            if not data:
                active -= data == b""           # (None: nothing to read yet)
                continue
            c.buf += data
            got = _answer(c.buf, header)
            if got is None:
                continue
            end, kind = got
            del c.buf[:end]
            tally[kind] += 1
            c.answers += 1
            if c.answers < c.quota:
                c.send_next()
            else:
                sel.unregister(c.sock)
                active -= 1
    t1, cpu1 = time.monotonic(), time.process_time()
    sel.close()
    return dict(count=sum(tally.values()), t0=t0, t1=t1, cpu=cpu1 - cpu0, capped=capped,
                tally={f"{s.decode()} {v.decode()}".strip(): n for (s, v), n in tally.items()},
                errors=errors)


def run_gets(addr, requests: list[bytes], n_conns: int, total: int, header: str,
             time_cap: float) -> dict:
    """`total` GETs over n_conns keep-alive connections, one in flight on each; the
    requests are dealt out to the connections in turn (connection i sends requests i,
    i + n_conns, ...).  Answers are tallied by status and the value of `header`
    ("204 broker": {n}); the rate counts every answer."""
    socks = connect_many(addr, n_conns)
    try:
        conns = [_Conn(s, requests[i::n_conns] or requests, q)
                 for i, (s, q) in enumerate(zip(socks, split(total, n_conns)))]
        res = get_loop(conns, f"\r\n{header.lower()}:".encode("ascii"), time_cap)
    finally:
        for s in socks:
            s.close()
    res["wall"] = res["t1"] - res["t0"]
    res["rate"] = res["count"] / res["wall"] if res["wall"] > 0 else 0.0
    res["gen_cpu_share"] = res["cpu"] / res["wall"] if res["wall"] > 0 else 0.0
    del res["t0"], res["t1"]
    return res
