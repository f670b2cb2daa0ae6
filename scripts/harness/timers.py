# Row 5 of bench_beanstalk: how late a server's timers fire, as a client sees it.
#
# delay_lateness: one worker blocked in `reserve` on tube "lat" (a thread reading its
# replies); a producer puts jobs with delay 1 s at paced times; lateness = when RESERVED
# is received - (when the put was sent + 1 s).  ttr_lateness: for job i a holder
# connection puts it (ttr 1) in its own tube ttr-i and reserves it with plain `reserve`,
# then stays idle like a hung worker, while a waiter connection watching only ttr-i blocks
# in `reserve` (one selectors thread reads all waiters); lateness = when the waiter
# receives RESERVED - (when the holder's reserve was sent + 1 s).  Jobs not back within
# TIMER_GRACE_S of their due time are counted, not put in the percentiles (beanstalkd 1.12
# loses TTR expiries of idle holders now and then: bench_beanstalk's docstring, row 5).
from __future__ import annotations

import selectors
import socket
import threading
import time

from .beanstalk import Client, close_all
from .loadgen import BODY, BODY_LEN
from .stats import pct

TIMER_GRACE_S = 5.0         # how long past the last job's due time to wait


def paced(n: int, spacing: float):
    """0 .. n-1, each at its time: one every `spacing` s, the first 50 ms from now."""
    t0 = time.monotonic() + 0.05
    for i in range(n):
        delay = t0 + i * spacing - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        yield i


def delay_lateness(srv, n, spacing):
    errors = []
    got: dict[int, float] = {}
    w = Client(srv.addr, timeout=15)
    w.pipeline([b"watch lat\r\n", b"ignore default\r\n"], expect=b"WATCHING")
    w.sock.settimeout(0.5)
    w.send(b"reserve\r\n")
    stop = threading.Event()

    def worker():
        while len(got) < n and not stop.is_set():
            try:
                line, body = w.reply()
            except socket.timeout:
                continue
            except Exception as exc:
                errors.append(f"worker: {exc!r}")
                return
            t = time.monotonic()
            if line.startswith(b"RESERVED "):
                got[int(body[:10])] = t
                w.send(b"delete %s\r\n" % line.split()[1] + (b"reserve\r\n" if len(got) < n
                                                               else b""))
            elif line != b"DELETED":
                errors.append(f"worker got {line!r}")

    th = threading.Thread(target=worker, daemon=True)
    th.start()
    p = Client(srv.addr)
    p.pipeline([b"use lat\r\n"], expect=b"USING")
    sent, rtt = {}, []
    for i in paced(n, spacing):
        body = (b"%010d" % i + BODY)[:BODY_LEN]
        ts = time.monotonic()
        p.send(b"put 0 1 60 %d\r\n%s\r\n" % (BODY_LEN, body))
        p.expect(b"INSERTED")
        sent[i] = ts
        rtt.append((time.monotonic() - ts) * 1000)
    th.join(1.0 + TIMER_GRACE_S)
    stop.set()
    th.join(2)
    close_all([w, p])
    if len(got) < n:
        errors.append(f"only {len(got)} of {n} delayed jobs were reserved within "
                      f"{TIMER_GRACE_S:.0f} s after their delay")
    return dict(late_ms=[(got[i] - (sent[i] + 1.0)) * 1000 for i in sorted(got) if i in sent],
                put_rtt_ms_p50=pct(rtt, 50), errors=errors, sent=len(sent))


def ttr_lateness(srv, n, spacing):
    """Job i: holder H_i puts it (ttr 1) into tube ttr-i and reserves it; then waiter
    W_i (watching only ttr-i) blocks in reserve until the TTR sends the job back."""
    errors, holders, waiters = [], [], []
    for i in range(n):
        h, w = Client(srv.addr), Client(srv.addr)
        h.send(b"use ttr-%d\r\nwatch ttr-%d\r\nignore default\r\n" % (i, i))
        w.send(b"watch ttr-%d\r\nignore default\r\n" % i)
        holders.append(h)
        waiters.append(w)
    for h, w in zip(holders, waiters):
        for c, prefix in ((h, b"USING"), (h, b"WATCHING"), (h, b"WATCHING"),
                          (w, b"WATCHING"), (w, b"WATCHING")):
            c.expect(prefix)
        w.sock.setblocking(False)
    got: dict[int, float] = {}
    expected = [0]
    sel = selectors.DefaultSelector()
    for i, c in enumerate(waiters):
        sel.register(c.sock, selectors.EVENT_READ, (i, c))
    stop = threading.Event()

    def receiver():
        while not stop.is_set():
            for key, _ in sel.select(0.1):
                i, c = key.data
                try:
                    data = c.sock.recv(65536)
                except BlockingIOError:
                    continue
                t = time.monotonic()
                if not data:
                    errors.append(f"waiter {i}: connection closed")
                    sel.unregister(c.sock)
                    continue
                c.buf += data
                while b"\r\n" in c.buf:
                    j = c.buf.find(b"\r\n")
                    line = bytes(c.buf[:j])
                    if line.startswith(b"RESERVED "):
                        nb = int(line.split()[2])
                        if len(c.buf) < j + 2 + nb + 2:
                            break
                        del c.buf[:j + 2 + nb + 2]
                        got.setdefault(i, t)
                        c.sock.send(b"delete %s\r\n" % line.split()[1])
                    else:
                        del c.buf[:j + 2]
                        if line != b"DELETED":
                            errors.append(f"waiter {i} got {line!r}")
            if expected[0] and len(got) >= expected[0]:
                return

    th = threading.Thread(target=receiver, daemon=True)
    th.start()
    reserved_at, rtt = {}, []
    for i in paced(n, spacing):
        h = holders[i]
        h.send(b"put 0 0 1 %d\r\n" % BODY_LEN + BODY + b"\r\n")
        h.expect(b"INSERTED")
        ts = time.monotonic()
        h.send(b"reserve\r\n")       # the job is ready: this does not block
        line, body = h.reply()
        tr = time.monotonic()
        if not line.startswith(b"RESERVED "):
            errors.append(f"job {i}: reserve gave {line!r}")
            continue
        reserved_at[i] = ts
        rtt.append((tr - ts) * 1000)
        waiters[i].sock.send(b"reserve\r\n")
    expected[0] = len(reserved_at)
    th.join(1.0 + TIMER_GRACE_S)
    stop.set()
    th.join(2)
    sel.close()
    late = [(got[i] - (reserved_at[i] + 1.0)) * 1000 for i in sorted(got) if i in reserved_at]
    still = 0
    if len(got) < len(reserved_at):
        # what the server says about the jobs that did not come back
        probe = Client(srv.addr)
        for i in sorted(set(reserved_at) - set(got)):
            still += int(probe.stats(b"stats-tube ttr-%d" % i).get("current-jobs-reserved", 0))
        close_all([probe])
        errors.append(f"only {len(got)} of {len(reserved_at)} jobs came back within "
                      f"{TIMER_GRACE_S:.0f} s after their TTR; {still} were still "
                      f"'reserved' (by their idle holder connection) at that point")
    close_all(waiters + holders)
    return dict(late_ms=late, reserve_rtt_ms_p50=pct(rtt, 50), errors=errors,
                sent=len(reserved_at), still_reserved=still)
