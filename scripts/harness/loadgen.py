# The load generators of the beanstalk-protocol benchmarks: plain Python on raw sockets,
# built to cost as little as possible, so that the server and not the generator is what
# a row measures.
#
# * put_loop (pipelined put): the byte stream `put 0 0 60 100\r\n<100 bytes>\r\n` is
#   pre-built once; each connection sends slices of it with non-blocking send() from a
#   single-threaded epoll (selectors) loop, keeping at most `window` commands
#   outstanding per connection, and counts replies by counting b"\n" in what it receives
#   (every reply to put is one line); SO_RCVLOWAT makes epoll wake the loop only once
#   about half the outstanding replies have arrived, not once per tiny reply segment
#   (beanstalkd writes every reply on its own).  b"INSERTED" is counted as well (across
#   recv boundaries) so that any other reply is reported as an error.
#   timed=True (load kind "put-timed") also times every put, from the send() that handed
#   over its last byte to the recv() that brought its reply (replies come in order on a
#   connection, so the k-th reply is the k-th put's): the time stamps are kept per batch
#   of puts sent at once and the latencies tallied in LAT_UNIT_S buckets (`lat_hist`),
#   and the low-water mark stays at 1 byte, so that a reply is seen when it comes, not
#   once half the window's have (at a few thousand puts/s that would add tens of ms).
# * work_loop (worker cycle): each connection sends `reserve`; on each `RESERVED <id> <n>`
#   (+ body, checked for length and content) it sends `delete <id>\r\nreserve\r\n` in
#   one write, as a real worker would; the last job of the connection's quota gets only
#   `delete`.  DELETED replies are counted.  SO_RCVLOWAT (one RESERVED reply plus body)
#   gives one wake-up per cycle, not two.
# * depth_work_loop (reserve -> delete with D commands in flight): first min(D, quota)
#   reserves; each RESERVED gets `delete <id>`, each DELETED one more `reserve` while
#   fewer than the quota were sent.  The low-water mark wakes the loop for the next
#   reply, no later (see tune() below).
#
# Connections are opened before the clock starts; a run ends when every connection has
# its replies, or at a time cap (then the rate is what finished / the time taken, and
# the run is flagged "capped").  run_load() can split the connections over forked
# generator processes (--gen-procs); every run records the generator's own CPU seconds
# (time.process_time(), summed over its processes): a generator share near 1.0 core
# would mean the generator, not the server, is the limit.
from __future__ import annotations

import collections
import multiprocessing
import selectors
import socket
import time

from .stats import per_1k

BODY_LEN = 100
BODY = (b"0123456789abcdefghijklmnopqrstuvwxyz" * 3)[:BODY_LEN]
PUT_CMD = b"put 0 0 60 %d\r\n" % BODY_LEN + BODY + b"\r\n"
RECV_SIZE = 65536           # below glibc's mmap threshold: no mmap/munmap per recv
MIN_INSERTED = len(b"INSERTED 1\r\n")
MIN_RESERVED = len(b"RESERVED 1 %d\r\n" % BODY_LEN) + BODY_LEN + 2
LOWAT_CAP = 65536
DELETED_LEN = len(b"DELETED\r\n")
LAT_UNIT_S = 1e-5           # put-timed: latency buckets of 10 µs


def set_lowat(sock, n: int) -> None:
    """SO_RCVLOWAT: epoll / recv report the socket readable only once n bytes wait."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, max(1, n))


class _Conn:
    __slots__ = ("sock", "quota", "sent", "total", "lines", "ok", "tail", "wmode", "done",
                 "buf", "reserved", "out", "bad", "lowat", "stamps", "stamped", "answered")


def connect_many(addr, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(addr, timeout=15)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        socks.append(s)
    return socks


def _receive(c, sel, errors: list, progress: str) -> bytes | None:
    """One recv for a load connection: data, None (nothing yet) or b"" (closed, unregistered)."""
    try:
        data = c.sock.recv(RECV_SIZE)
    except BlockingIOError:
        return None
    except OSError as exc:
        errors.append(f"recv: {exc}")
        data = b""
    if data == b"":
        errors.append(f"connection closed by server after {progress}")
        sel.unregister(c.sock)
        c.done = True
    return data


def put_loop(socks, quotas, window: int, time_cap: float, timed: bool = False) -> dict:
    """Pipelined puts, at most `window` outstanding per connection, replies counted;
    `timed`: each put's latency too (`lat_hist`: LAT_UNIT_S buckets -> puts)."""
    L = len(PUT_CMD)
    chunk_cmds = max(1, min(window, max(quotas), 2000))
    block = PUT_CMD * chunk_cmds
    mv = memoryview(block)
    blen = len(block)
    sel = selectors.DefaultSelector()
    conns = []
    for s, q in zip(socks, quotas):
        c = _Conn()
        c.sock, c.quota, c.sent, c.total, c.lines, c.ok = s, q, 0, q * L, 0, 0
        c.tail, c.wmode, c.done, c.bad, c.lowat = b"", False, q == 0, [], 1
        c.stamps, c.stamped, c.answered = collections.deque(), 0, 0
        conns.append(c)
        if not c.done:
            sel.register(s, selectors.EVENT_READ, c)
    errors = []
    hist: collections.Counter = collections.Counter()
    clock = time.perf_counter

    def pump(c):
        while True:
            limit = min(c.total, (c.lines + window) * L)
            n = limit - c.sent
            if n <= 0:
                blocked = False
                break
            off = c.sent % L
            n = min(n, blen - off)
            try:
                k = c.sock.send(mv[off:off + n])
            except BlockingIOError:
                k = 0
            c.sent += k
            if k < n:
                blocked = True
                break
        if blocked != c.wmode:
            c.wmode = blocked
            sel.modify(c.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if blocked else 0), c)
        if timed:
            whole = c.sent // L                 # puts whose last byte is handed over
            if whole > c.stamped:
                c.stamps.append((whole, clock()))
                c.stamped = whole
            return
        # Wake only when about half the outstanding replies are in: never more bytes than
        # the replies still owed can make (else it would stall), re-set only on big changes.
        # (a partial reply line, up to 16 bytes, may already be in hand)
        budget = (c.sent // L - c.lines) * MIN_INSERTED - 16
        want = max(1, min(LOWAT_CAP, budget // 2))
        if c.lowat > max(1, budget) or c.lowat * 4 < want:
            c.lowat = want
            set_lowat(c.sock, want)

    def answered(c, now):
        # the puts c.answered..c.lines-1 got their replies now: tally each batch's wait
        while c.answered < c.lines and c.stamps:
            upto, sent_at = c.stamps[0]
            k = min(upto, c.lines) - c.answered
            hist[int((now - sent_at) / LAT_UNIT_S)] += k
            c.answered += k
            if c.answered >= upto:
                c.stamps.popleft()

    cpu0, t0 = time.process_time(), time.monotonic()
    deadline = t0 + time_cap
    active = sum(1 for c in conns if not c.done)
    for c in conns:
        if not c.done:
            pump(c)
    capped = False
    while active:
        now = time.monotonic()
        if now >= deadline:
            capped = True
            break
        for key, ev in sel.select(min(0.5, deadline - now)):
            c = key.data
            if ev & selectors.EVENT_READ:
                data = _receive(c, sel, errors, f"{c.lines} replies")
                if data == b"":
                    active -= 1
                    continue
                if data:
                    nl = data.count(b"\n")
                    c.lines += nl
                    joined = c.tail + data
                    ins = joined.count(b"INSERTED")
                    c.ok += ins
                    if ins != nl and len(c.bad) < 5:
                        c.bad += [l for l in joined.split(b"\r\n")
                                  if l and not l.startswith(b"INSERTED")
                                  and not b"INSERTED".startswith(l[:8])][:5]
                    c.tail = joined[-7:]
                    if timed:
                        answered(c, clock())
                    if c.lines >= c.quota:
                        sel.unregister(c.sock)
                        c.done = True
                        active -= 1
                        continue
            pump(c)
    t1, cpu1 = time.monotonic(), time.process_time()
    sel.close()
    lines = sum(c.lines for c in conns)
    ok = sum(c.ok for c in conns)
    bad = [b for c in conns for b in c.bad][:5]
    if ok != lines:
        errors.append(f"{lines - ok} replies were not INSERTED, e.g. {bad!r}")
    res = dict(count=ok, replies=lines, t0=t0, t1=t1, cpu=cpu1 - cpu0, capped=capped,
               errors=errors)
    if timed:
        res["lat_hist"] = dict(hist)
    return res


def _flush(c, sel) -> None:
    """Send what a connection has queued; watch for writability while some is left."""
    if c.out:
        try:
            k = c.sock.send(c.out)
        except BlockingIOError:
            k = 0
        del c.out[:k]
    want = bool(c.out)
    if want != c.wmode:
        c.wmode = want
        sel.modify(c.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0), c)


def work_loop(socks, quotas, time_cap: float) -> dict:
    """reserve -> (delete id + reserve) cycles; counts DELETED."""
    sel = selectors.DefaultSelector()
    conns = []
    for s, q in zip(socks, quotas):
        c = _Conn()
        c.sock, c.quota, c.buf, c.reserved, c.lines, c.done = s, q, bytearray(), 0, 0, q == 0
        c.bad, c.out, c.wmode, c.lowat = [], bytearray(), False, MIN_RESERVED
        conns.append(c)
        if not c.done:
            sel.register(s, selectors.EVENT_READ, c)
            # one wake-up per cycle: DELETED alone is not worth a wake-up, RESERVED+body is
            set_lowat(s, MIN_RESERVED)
    errors = []
    body_bad = 0
    cpu0, t0 = time.process_time(), time.monotonic()
    deadline = t0 + time_cap
    active = 0
    for c in conns:
        if not c.done:
            c.sock.send(b"reserve\r\n")
            active += 1
    capped = False

    while active:
        now = time.monotonic()
        if now >= deadline:
            capped = True
            break
        for key, ev in sel.select(min(0.5, deadline - now)):
            c = key.data
            if ev & selectors.EVENT_READ:
                data = _receive(c, sel, errors, f"{c.lines} deletes")
                if data == b"":
                    active -= 1
                    continue
                if data:
                    buf = c.buf
                    buf += data
                    pos = 0
                    need = 1
                    while True:
                        i = buf.find(b"\r\n", pos)
                        if i < 0:
                            break
                        if buf.startswith(b"RESERVED ", pos):
                            parts = buf[pos + 9:i].split(b" ")
                            n = int(parts[1])
                            end = i + 2 + n + 2
                            if len(buf) < end:
                                need = end - len(buf)
                                break
                            if n != BODY_LEN or buf[i + 2:i + 2 + n] != BODY \
                                    or buf[end - 2:end] != b"\r\n":
                                body_bad += 1
                            pos = end
                            c.reserved += 1
                            if c.reserved < c.quota:
                                c.out += b"delete %s\r\nreserve\r\n" % parts[0]
                            else:
                                c.out += b"delete %s\r\n" % parts[0]
                        elif buf.startswith(b"DELETED\r\n", pos):
                            c.lines += 1
                            pos = i + 2
                        else:
                            line = bytes(buf[pos:i])
                            pos = i + 2
                            if len(errors) < 10:
                                errors.append(f"unexpected reply {line[:80]!r}")
                            c.done = True
                    if pos:
                        del buf[:pos]
                    if c.lines >= c.quota or c.done:
                        sel.unregister(c.sock)
                        c.done = True
                        active -= 1
                        set_lowat(c.sock, 1)
                        continue
                    # bytes to wait for: the rest of a partial reply, else a whole RESERVED
                    # (or just DELETED after the last delete)
                    low = need if buf else (1 if c.reserved >= c.quota else MIN_RESERVED)
                    if low != c.lowat:
                        c.lowat = low
                        set_lowat(c.sock, low)
            _flush(c, sel)
    t1, cpu1 = time.monotonic(), time.process_time()
    sel.close()
    if body_bad:
        errors.append(f"{body_bad} RESERVED replies had a wrong body")
    return dict(count=sum(c.lines for c in conns), replies=sum(c.reserved for c in conns),
                t0=t0, t1=t1, cpu=cpu1 - cpu0, capped=capped, errors=errors)


def depth_work_loop(socks, quotas, depth: int, time_cap: float) -> dict:
    """reserve -> delete cycles with `depth` commands in flight per connection: first
    min(depth, quota) reserves; each RESERVED gets `delete <id>`, each DELETED one more
    `reserve` while fewer than the quota were sent.  Counts DELETED."""
    sel = selectors.DefaultSelector()
    conns = []
    for s, q in zip(socks, quotas):
        c = _Conn()
        c.sock, c.quota, c.sent, c.reserved, c.lines, c.done = s, q, 0, 0, 0, q == 0
        c.buf, c.out, c.wmode, c.lowat = bytearray(), bytearray(), False, 1
        conns.append(c)
        if not c.done:
            sel.register(s, selectors.EVENT_READ, c)
            set_lowat(s, 1)
    errors = []
    body_bad = 0

    def tune(c, need):
        # Wake for the next reply, no later: `need` more bytes of a partial reply in hand,
        # else the shortest reply that can come next (DELETED while a delete is
        # outstanding, else a whole RESERVED).  Waiting for more (half of what is in
        # flight, as put_loop does) stalled beanstalkd here (~25k instead of ~85k
        # deletes/s, both processes mostly idle): it writes every reply as its own small
        # segment, and those seem to wait for ACKs that we delay while below the mark.
        if c.buf:
            want = need
        else:
            want = DELETED_LEN if c.reserved > c.lines else MIN_RESERVED
        if want != c.lowat:
            c.lowat = want
            set_lowat(c.sock, want)

    # depth 1: one reply outstanding, which the servers write whole: a low-water mark of
    # 1 (set above) saves a setsockopt per reply
    tuned = depth > 1
    cpu0, t0 = time.process_time(), time.monotonic()
    deadline = t0 + time_cap
    active = 0
    for c in conns:
        if not c.done:
            c.sent = min(depth, c.quota)
            c.out += b"reserve\r\n" * c.sent
            _flush(c, sel)
            if tuned:
                tune(c, 1)
            active += 1
    capped = False
    while active:
        now = time.monotonic()
        if now >= deadline:
            capped = True
            break
        for key, ev in sel.select(min(0.5, deadline - now)):
            c = key.data
            if ev & selectors.EVENT_READ:
                data = _receive(c, sel, errors, f"{c.lines} deletes")
                if data == b"":
                    active -= 1
                    continue
                if data:
                    buf = c.buf
                    buf += data
                    pos = 0
                    need = 1
                    while True:
                        i = buf.find(b"\r\n", pos)
                        if i < 0:
                            break
                        if buf.startswith(b"RESERVED ", pos):
                            parts = buf[pos + 9:i].split(b" ")
                            n = int(parts[1])
                            end = i + 2 + n + 2
                            if len(buf) < end:
                                need = end - len(buf)
                                break
                            if n != BODY_LEN or buf[i + 2:i + 2 + n] != BODY \
                                    or buf[end - 2:end] != b"\r\n":
                                body_bad += 1
                            pos = end
                            c.reserved += 1
                            c.out += b"delete %s\r\n" % parts[0]
                        elif buf.startswith(b"DELETED\r\n", pos):
                            c.lines += 1
                            pos = i + 2
                            if c.sent < c.quota:
                                c.sent += 1
                                c.out += b"reserve\r\n"
                        else:
                            line = bytes(buf[pos:i])
                            pos = i + 2
                            if len(errors) < 10:
                                errors.append(f"unexpected reply {line[:80]!r}")
                            c.done = True
                    if pos:
                        del buf[:pos]
                    if c.lines >= c.quota or c.done:
                        sel.unregister(c.sock)
                        c.done = True
                        active -= 1
                        if c.lowat != 1:
                            set_lowat(c.sock, 1)
                        continue
                    if tuned:
                        tune(c, need)
            _flush(c, sel)
    t1, cpu1 = time.monotonic(), time.process_time()
    sel.close()
    if body_bad:
        errors.append(f"{body_bad} RESERVED replies had a wrong body")
    return dict(count=sum(c.lines for c in conns), replies=sum(c.reserved for c in conns),
                t0=t0, t1=t1, cpu=cpu1 - cpu0, capped=capped, errors=errors)


def split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _loop_for(kind, socks, quotas, window, time_cap):
    if kind in ("put", "put-timed"):
        return put_loop(socks, quotas, window, time_cap, timed=kind == "put-timed")
    if kind.startswith("work") and kind[4:].isdigit():      # "work32": depth 32
        return depth_work_loop(socks, quotas, int(kind[4:]), time_cap)
    if kind == "work":
        return work_loop(socks, quotas, time_cap)
    raise ValueError(f"unknown load kind {kind!r}")


def _child_main(pipe, go, kind, addr, quotas, window, time_cap):
    try:
        socks = connect_many(addr, len(quotas))
        pipe.send("ready")
        go.wait(60)
        res = _loop_for(kind, socks, quotas, window, time_cap)
        for s in socks:
            s.close()
    except BaseException as exc:      # report, never hang the parent
        res = dict(count=0, replies=0, t0=time.monotonic(), t1=time.monotonic(), cpu=0.0,
                   capped=False, errors=[f"generator process: {exc!r}"])
    pipe.send(res)
    pipe.close()


def run_load(addr, kind: str, n_conns: int, total: int, window: int, time_cap: float,
             gen_procs: int = 1) -> dict:
    """Drive `total` puts ("put", or "put-timed": each put's latency too), worker cycles
    ("work", delete+reserve in one write) or reserve -> delete cycles with D commands in
    flight per connection ("workD", e.g. "work32", "work1") over n_conns connections."""
    quotas = split(total, n_conns)
    procs = max(1, min(gen_procs, n_conns))
    if procs == 1:
        socks = connect_many(addr, n_conns)
        try:
            res = _loop_for(kind, socks, quotas, window, time_cap)
        finally:
            for s in socks:
                s.close()
        res["gen_procs"] = 1
    else:
        ctx = multiprocessing.get_context("fork")
        go = ctx.Event()
        groups = [quotas[i::procs] for i in range(procs)]
        kids = []
        for g in groups:
            a, b = ctx.Pipe()
            p = ctx.Process(target=_child_main, args=(b, go, kind, addr, g, window, time_cap))
            p.start()
            kids.append((p, a))
        for p, a in kids:
            if not a.poll(30):
                raise RuntimeError("generator process did not get ready")
            a.recv()
        go.set()
        results = []
        for p, a in kids:
            if not a.poll(time_cap + 60):
                raise RuntimeError("generator process did not report")
            results.append(a.recv())
            p.join(10)
        res = dict(count=sum(r["count"] for r in results),
                   replies=sum(r["replies"] for r in results),
                   t0=min(r["t0"] for r in results), t1=max(r["t1"] for r in results),
                   cpu=sum(r["cpu"] for r in results),
                   capped=any(r["capped"] for r in results),
                   errors=[e for r in results for e in r["errors"]], gen_procs=procs)
        if kind == "put-timed":
            res["lat_hist"] = dict(sum((collections.Counter(r.get("lat_hist", {}))
                                        for r in results), collections.Counter()))
    res["wall"] = res["t1"] - res["t0"]
    res["rate"] = res["count"] / res["wall"] if res["wall"] > 0 else 0.0
    res["gen_cpu_share"] = res["cpu"] / res["wall"] if res["wall"] > 0 else 0.0
    del res["t0"], res["t1"]
    return res



def fill(server, n: int, window: int, time_cap: float, conns: int = 8,
         gen_procs: int = 1) -> dict:
    """Put n ready jobs into `server` (pipelined, 8 connections); raises unless all went in."""
    res = run_load(server.addr, "put", conns, n, window, time_cap, gen_procs)
    if res["count"] != n:
        raise RuntimeError(f"fill: {res['count']} of {n} jobs inserted in {res['wall']:.1f}s; "
                           f"errors {res['errors'][:3]}")
    return res


def timed_load(server, *args, **kw) -> dict:
    """run_load() on `server`, with the server's CPU: its share of the wall time and its
    CPU-seconds per 1,000 operations (utime + stime of its process tree)."""
    c0, w0 = server.cpu_s(), time.monotonic()
    res = run_load(server.addr, *args, **kw)
    used, wall = server.cpu_s() - c0, time.monotonic() - w0
    res.update(server_cpu_share=used / wall, server_cpu_s=used,
               cpu_per_1k=per_1k(used, res["count"]))
    return res
