#!/usr/bin/env python3
"""Benchmark zstalk against beanstalkd with the same load from the same generator.

Usage:
    .venv/bin/python scripts/bench_beanstalk.py [--quick] [--rows 1,2,3,4,5,6,7,8,9]
        [--fronts N] [--json PATH] [--jobs-for-memory N] [--repeats N]
        [--window N] [--gen-procs N] [--one-put-count N] [--one-cycle-count N]
        [--latency-count N]

--fronts 0 (the default, as for `zstalk serve`) runs zstalk's fronts in the broker's
process; --fronts N runs N front processes.  The header and the footer say which.
Row 9 runs zstalk both ways (--fronts 0 and --fronts 1) whatever --fronts says.

Method
------
Both servers run on 127.0.0.1 on ports this script picks (bind to port 0, release).
Every measurement that holds state (rows 1-3, 6, 8, 9) gets a fresh server process, so jobs left
by one measurement never weigh on the next.  Runs alternate between the two servers
(beanstalkd then zstalk, then zstalk then beanstalkd on the next repetition), so noise
from other tenants of this shared 2-core machine hits both alike.  Throughput rows take
the BEST of the repetitions (interference on a shared machine only ever slows a run
down, so the best run is the least disturbed one); every sample is kept in the JSON.

The load generator is plain Python on raw sockets, built to cost as little as possible:

* Row 1, pipelined put: the byte stream `put 0 0 60 100\\r\\n<100 bytes>\\r\\n` is
  pre-built once; each connection sends slices of it with non-blocking send() from a
  single-threaded epoll (selectors) loop, keeping at most --window commands outstanding
  per connection, and counts replies by counting b"\\n" in what it receives (every
  reply to put is one line); SO_RCVLOWAT makes epoll wake the loop only once about
  half the outstanding replies have arrived, not once per tiny reply segment
  (beanstalkd writes every reply on its own).  b"INSERTED" is counted as well (across recv boundaries)
  so that any other reply is reported as an error.  Connections are opened before the
  clock starts; the run ends when every connection has its replies, or at a time cap
  (then the rate is what finished / the time taken, and the run is flagged "capped").
* Row 2, worker cycle: the queue is filled first (pipelined puts, 8 connections) with
  more jobs than the measurement consumes, so it never runs dry.  Each connection then
  sends `reserve`; on each `RESERVED <id> <n>` (+ body, checked for length and content)
  it sends `delete <id>\\r\\nreserve\\r\\n` in one write, as a real worker would; the
  last job of the connection's quota gets only `delete`.  DELETED replies are counted.
  SO_RCVLOWAT (one RESERVED reply plus body) gives one wake-up per cycle, not two.
* Row 3, memory: a fresh server is filled with N ready 100-byte jobs by 8 pipelined
  connections; RSS (VmRSS from /proc) is read after the fill and a 1 s settle, summed
  over the zstalk supervisor and all its descendants (broker, fronts).  The ready count
  is checked with `stats`.
* Row 4, reserve across 1000 tubes: on one server, connection W1000 watches t0..t999
  (and ignores default); connection W1 watches only t0.  Three variants, each filled
  with K jobs and then drained by K reserve->delete cycles on one connection (delete and
  the next reserve pipelined): W1 with jobs in t0; W1000 with jobs in t0; W1000 with
  jobs spread round-robin over all 1000 tubes.  Cost ratio = time per cycle of the
  W1000 variant / time per cycle of W1.  Best of the repetitions per variant.
  (The generator's own per-cycle cost is in both terms, which pulls a fast server's
  ratio toward 1.)
* Row 5, timer lateness: delay - one worker blocked in `reserve` on tube "lat"; a
  producer puts jobs with delay 1 s at spread times (one every --spacing ms); lateness =
  time RESERVED is received - (time the put was sent + 1 s).  TTR - for job i a
  holder connection H_i puts it (ttr 1) in its own tube ttr-i and reserves it with plain
  `reserve` (the job is ready, so it does not block; the time that reserve is sent =
  reserve time), then stays idle like a hung worker; a waiter connection W_i watching
  only ttr-i then blocks in `reserve`; lateness = time W_i receives RESERVED -
  (reserve time + 1 s).  One tube and one waiter per job so that no waiter can take a
  job that is still ready.  Both lateness figures include one client->server trip,
  which is the client's view.  Jobs that do not come back within 5 s of their due time
  are counted (row "jobs back"), not put in the percentiles: beanstalkd 1.12 loses TTR
  expiries now and then (its connection tick can fire a hair before the job's deadline,
  after which the idle holder connection is not rescheduled; `reserve-with-timeout`
  makes this near certain, which is why the holder uses plain `reserve`).
* Row 6, one command at a time, 1 connection, the way greenstalk / pystalk clients work:
  a blocking socket (TCP_NODELAY, 15 s timeout) sends one command with one sendall()
  and reads until the whole reply is in before sending the next.  (a) N puts of
  `put 0 0 60 100` + 100-byte body (--one-put-count, default 20000; 3000 with --quick),
  every reply checked to be one INSERTED line; (b) on a server first filled with N+100
  jobs (pipelined, as in row 2), N cycles (--one-cycle-count, default 10000; 2000 with
  --quick) of `reserve` (RESERVED <id> <n> + body, checked) then `delete <id>` (DELETED).
  Rate = puts/s or cycles/s; the ready count is checked with `stats` afterwards.  Best
  of the repetitions, fresh server per run.  This row measures latency per request
  (one client->server->client trip each) more than throughput.
* Row 7, exec -> first reply: the time from just before subprocess.Popen of the server
  command to the moment a client receives the INSERTED reply to `put 0 0 60 1`; the
  client retries connect() every 0.5 ms (connection refused -> retry; a connection closed
  before replying -> retry; 10 s cap).  The time the port first accepted a connection is
  recorded too.  9 runs per server, the servers' order alternating, a free loopback port
  each run, no binlog, server stopped after each run; the median is reported with the
  min-max spread.  zstalk is started as `zstalkd -l 127.0.0.1 -p PORT` (the drop-in a
  tool that spawns beanstalkd runs: greenstalk's suite gives it 0.1 s) and as `zstalk
  serve -l 127.0.0.1 -p PORT --counter-port 0 --worker-bind none` (plus `--fronts N`
  when N > 0), both from the directory of --zstalk.  The floor beside them is the same
  venv's `python -c "import asyncio, uvloop"` timed from exec to exit: what any server
  on this interpreter and event loop pays before its own code runs.  Target: zstalkd's
  median <= 80 ms and <= the floor + 20 ms.  Python's fork+exec is in every figure.
* Row 8, the pipelines clients use: 32 commands in flight per connection (what an
  asynchronous client with a bounded pipeline keeps), and many connections with one
  command each (a pool of synchronous workers).  (a) put, 8 connections, 32 in flight:
  the row-1 loop with a window of 32 (--put-count puts; 20000 with --quick).  (b)
  reserve -> delete, 8 connections, 32 in flight: the server is filled first as in row 2
  (--work-count + 100 jobs; 3000 + 100 with --quick); each connection sends min(32, its
  quota) `reserve`s; on each `RESERVED <id> <n>` (+ body, checked) it sends `delete
  <id>`; on each DELETED it sends one more `reserve` while it has sent fewer than its
  quota, so ~32 commands stay in flight.  SO_RCVLOWAT wakes the loop for the next
  reply, no later (DELETED while a delete is outstanding, else a whole RESERVED; the
  rest of a partial reply): waiting for more, as row 1 does, stalled beanstalkd, which
  writes every reply as its own segment.  (c) the same loop with 1 in flight, 50
  connections: `reserve`, on RESERVED `delete <id>`, on DELETED the next `reserve`
  (row 2 sends delete and the next reserve in one write; this does not); low-water
  mark 1.  Rate = deletes/s; the ready count is checked with `stats` afterwards as in
  row 2.  Best of the repetitions, fresh server per run, --gen-procs applies.
* Row 9, request latency: the round trip of each request of one connection sending one
  command at a time (blocking socket, TCP_NODELAY, as row 6): `put 0 0 60 100` +
  100-byte body, the INSERTED line read whole, each request timed with
  time.perf_counter() from just before sendall() to the reply's \\r\\n; N requests
  (--latency-count, default 2000; 500 with --quick); p50 and p99 in ms.  (i) idle; (ii)
  under load: a forked process keeps 8 connections x 32 pipelined puts in flight (the
  row-1 loop, in rounds of 2000 puts per connection, each round ending with all its
  replies in, until told to stop between rounds) from 0.2 s before the first probe
  request to the last.  Three servers: beanstalkd, zstalk with its fronts in the
  broker's process (`--fronts 0`) and zstalk with one front process (`--fronts 1`: the
  round trip through a remote front).  Fresh server per measurement; the order of the
  three servers is reversed every other repetition; the lowest p50 / p99 of the
  repetitions is reported.  On this 2-core machine the load generator, the server
  and the probe share two cores, so the under-load figures include waiting for a CPU.

Generator check: every load run records the generator's own CPU seconds
(time.process_time(), summed over generator processes with --gen-procs) and wall
seconds, and the servers' CPU seconds (utime+stime from /proc/<pid>/stat, summed over
the server's processes).  A generator share near 1.0 core would mean the generator,
not the server, is the limit.

The script stops what it started (SIGTERM to the server's pid, then SIGKILL to the
pids it recorded) and reports anything the servers wrote to stderr, restarts of zstalk
children, and replies that were not the expected ones.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HOST = "127.0.0.1"
BODY_LEN = 100
BODY = (b"0123456789abcdefghijklmnopqrstuvwxyz" * 3)[:BODY_LEN]
PUT_CMD = b"put 0 0 60 %d\r\n" % BODY_LEN + BODY + b"\r\n"
REPO = Path(__file__).resolve().parent.parent
DEFAULT_ZSTALK = str(Path(sys.executable).parent / "zstalk")
TICKS = os.sysconf("SC_CLK_TCK")
RECV_SIZE = 65536           # below glibc's mmap threshold: no mmap/munmap per recv
MIN_INSERTED = len(b"INSERTED 1\r\n")
MIN_RESERVED = len(b"RESERVED 1 %d\r\n" % BODY_LEN) + BODY_LEN + 2
LOWAT_CAP = 65536
TIMER_GRACE_S = 5.0         # row 5: how long past the last job's due time to wait


def set_lowat(sock, n: int) -> None:
    """SO_RCVLOWAT: epoll / recv report the socket readable only once n bytes wait."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, max(1, n))


# --------------------------------------------------------------------------- processes

def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def proc_children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    out += [int(x) for x in f.read().split()]
            except OSError:
                pass
    except OSError:
        pass
    return out


def proc_tree(pid: int) -> list[int]:
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.append(p)
        todo += proc_children(p)
    return seen


def proc_rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def proc_cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS
    except (OSError, IndexError, ValueError):
        return 0.0


def proc_cmd(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


class Server:
    """One server under test, started by us; `pids()` is the process tree."""

    def __init__(self, kind: str, argv_fn, name: str):
        self.kind, self.name, self.argv_fn = kind, name, argv_fn
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.start_children: list[int] = []
        self.errfile = None
        self.notes: list[str] = []

    @property
    def addr(self):
        return (HOST, self.port)

    def spawn(self) -> float:
        """Pick a port and start the process; return the time just before Popen."""
        self.port = free_port()
        self.errfile = tempfile.TemporaryFile()
        argv = self.argv_fn(self.port)
        t0 = time.monotonic()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                     stdout=self.errfile, stderr=subprocess.STDOUT)
        return t0

    def start(self, timeout: float = 20.0) -> float:
        t0 = self.spawn()
        deadline = t0 + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} at start: "
                                   f"{self.read_output()[:2000]!r}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} not ready after {timeout}s")
            try:
                with socket.create_connection(self.addr, timeout=0.5) as s:
                    s.sendall(b"list-tube-used\r\n")
                    got = b""
                    while not got.endswith(b"\r\n"):
                        chunk = s.recv(100)
                        if not chunk:
                            break
                        got += chunk
                    if got == b"USING default\r\n":
                        break
            except OSError:
                pass
            time.sleep(0.01)
        self.start_children = sorted(proc_children(self.proc.pid))
        return time.monotonic() - t0

    def pids(self) -> list[int]:
        return proc_tree(self.proc.pid) if self.proc and self.proc.poll() is None else []

    def rss_mib(self) -> float:
        return sum(proc_rss_kib(p) for p in self.pids()) / 1024.0

    def cpu_s(self) -> float:
        return sum(proc_cpu_s(p) for p in self.pids())

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_children(self, where: str) -> None:
        if self.kind == "floor":        # row 7's floor: a command that exits by itself
            return
        if not self.alive():
            self.notes.append(f"{where}: {self.name} supervisor/server exited "
                              f"(rc={self.proc.returncode})")
            return
        now = sorted(proc_children(self.proc.pid))
        if self.kind == "zstalk" and now != self.start_children:
            self.notes.append(f"{where}: {self.name} children changed {self.start_children}"
                              f" -> {now} (a child died and was restarted?)")
            self.start_children = now

    def read_output(self) -> str:
        if self.errfile is None:
            return ""
        self.errfile.seek(0)
        return self.errfile.read().decode(errors="replace")

    def stop(self, where: str = "") -> None:
        if self.proc is None:
            return
        self.check_children(where or "stop")
        tree = self.pids()
        rc = self.proc.poll()
        if rc is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.notes.append(f"{where}: {self.name} did not exit 10 s after SIGTERM; killed")
                for p in tree:
                    try:
                        os.kill(p, signal.SIGKILL)
                    except OSError:
                        pass
                rc = self.proc.wait(5)
        if rc not in (0, -signal.SIGTERM):
            self.notes.append(f"{where}: {self.name} exit status {rc} after SIGTERM")
        time.sleep(0.05)
        left = [p for p in tree if p != self.proc.pid and os.path.exists(f"/proc/{p}")
                and not open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"]
        if left:
            self.notes.append(f"{where}: {self.name} left processes after stop: "
                              f"{[(p, proc_cmd(p)) for p in left]}")
            for p in left:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
        # (zstalk's one start-up line, "zstalk: beanstalk on ...", is not news)
        out = "\n".join(l for l in self.read_output().splitlines()
                        if not l.startswith("zstalk: beanstalk on ")).strip()
        if out:
            self.notes.append(f"{where}: {self.name} output:\n{out[:3000]}")
        self.errfile.close()
        self.errfile, self.proc = None, None


# --------------------------------------------------------------------------- sync client

class Client:
    def __init__(self, addr, timeout: float = 15.0):
        self.sock = socket.create_connection(addr, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()

    def close(self, patience: float = 1.0) -> bool:
        """Half-close, read to EOF, close: no RST for replies still in flight."""
        ok = True
        try:
            self.sock.settimeout(patience)
            try:
                self.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            while self.sock.recv(65536):
                pass
        except OSError:
            ok = False
        finally:
            self.sock.close()
        return ok


    def send(self, data: bytes):
        self.sock.sendall(data)

    def _fill(self):
        d = self.sock.recv(65536)
        if not d:
            raise EOFError("server closed the connection")
        self.buf += d

    def line(self) -> bytes:
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                out = bytes(self.buf[:i])
                del self.buf[:i + 2]
                return out
            self._fill()

    def reply(self):
        line = self.line()
        if line.startswith((b"RESERVED ", b"FOUND ", b"OK ")):
            n = int(line.rsplit(b" ", 1)[1])
            while len(self.buf) < n + 2:
                self._fill()
            body = bytes(self.buf[:n])
            del self.buf[:n + 2]
            return line, body
        return line, None

    def expect(self, prefix: bytes):
        line, body = self.reply()
        if not line.startswith(prefix):
            raise RuntimeError(f"expected {prefix!r}, got {line!r}")
        return line, body

    def pipeline(self, cmds: list[bytes], replies_per_cmd: int = 1, batch: int = 500,
                 expect: bytes | None = None) -> list[bytes]:
        """Send commands in pipelined batches; return the reply lines."""
        lines = []
        for i in range(0, len(cmds), batch):
            part = cmds[i:i + batch]
            self.send(b"".join(part))
            for _ in range(len(part) * replies_per_cmd):
                line, _ = self.reply()
                lines.append(line)
        if expect is not None:
            bad = [l for l in lines if not l.startswith(expect)]
            if bad:
                raise RuntimeError(f"unexpected replies: {bad[:3]!r} ({len(bad)} total)")
        return lines

    def stats(self, cmd: bytes = b"stats") -> dict:
        self.send(cmd + b"\r\n")
        line, body = self.reply()
        if not line.startswith(b"OK"):
            raise RuntimeError(f"{cmd!r}: {line!r}")
        out = {}
        for l in body.decode().splitlines():
            if ":" in l:
                k, v = l.split(":", 1)
                out[k.strip()] = v.strip()
        return out


def close_all(clients) -> None:
    for c in clients:
        try:
            c.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
    patience = 1.0
    for c in clients:
        if not c.close(patience):
            patience = 0.01


# --------------------------------------------------------------------------- load loops

class _Conn:
    __slots__ = ("sock", "quota", "sent", "total", "lines", "ok", "tail", "wmode", "done",
                 "buf", "reserved", "out", "bad", "lowat")


def _connect_many(addr, n: int) -> list[socket.socket]:
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


def _put_loop(socks, quotas, window: int, time_cap: float) -> dict:
    """Pipelined puts, at most `window` outstanding per connection, replies counted."""
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
        conns.append(c)
        if not c.done:
            sel.register(s, selectors.EVENT_READ, c)
    errors = []

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
        # Wake only when about half the outstanding replies are in: never more bytes than
        # the replies still owed can make (else it would stall), re-set only on big changes.
        # (a partial reply line, up to 16 bytes, may already be in hand)
        budget = (c.sent // L - c.lines) * MIN_INSERTED - 16
        want = max(1, min(LOWAT_CAP, budget // 2))
        if c.lowat > max(1, budget) or c.lowat * 4 < want:
            c.lowat = want
            set_lowat(c.sock, want)

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
    return dict(count=ok, replies=lines, t0=t0, t1=t1, cpu=cpu1 - cpu0, capped=capped,
                errors=errors)


def _work_loop(socks, quotas, time_cap: float) -> dict:
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

    def flush(c):
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
            flush(c)
    t1, cpu1 = time.monotonic(), time.process_time()
    sel.close()
    if body_bad:
        errors.append(f"{body_bad} RESERVED replies had a wrong body")
    return dict(count=sum(c.lines for c in conns), replies=sum(c.reserved for c in conns),
                t0=t0, t1=t1, cpu=cpu1 - cpu0, capped=capped, errors=errors)


DELETED_LEN = len(b"DELETED\r\n")


def _depth_work_loop(socks, quotas, depth: int, time_cap: float) -> dict:
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

    def flush(c):
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

    def tune(c, need):
        # Wake for the next reply, no later: `need` more bytes of a partial reply in hand,
        # else the shortest reply that can come next (DELETED while a delete is
        # outstanding, else a whole RESERVED).  Waiting for more (half of what is in
        # flight, as _put_loop does) stalled beanstalkd here (~25k instead of ~85k
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
            flush(c)
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
            flush(c)
    t1, cpu1 = time.monotonic(), time.process_time()
    sel.close()
    if body_bad:
        errors.append(f"{body_bad} RESERVED replies had a wrong body")
    return dict(count=sum(c.lines for c in conns), replies=sum(c.reserved for c in conns),
                t0=t0, t1=t1, cpu=cpu1 - cpu0, capped=capped, errors=errors)


def _split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _loop_for(kind, socks, quotas, window, time_cap):
    if kind == "put":
        return _put_loop(socks, quotas, window, time_cap)
    if kind.startswith("work") and kind[4:].isdigit():      # "work32": depth 32
        return _depth_work_loop(socks, quotas, int(kind[4:]), time_cap)
    if kind == "work":
        return _work_loop(socks, quotas, time_cap)
    raise ValueError(f"unknown load kind {kind!r}")


def _child_main(pipe, go, kind, addr, quotas, window, time_cap):
    try:
        socks = _connect_many(addr, len(quotas))
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
    """Drive `total` puts ("put"), worker cycles ("work", delete+reserve in one write) or
    reserve -> delete cycles with D commands in flight per connection ("workD", e.g.
    "work32", "work1") over n_conns connections."""
    quotas = _split(total, n_conns)
    procs = max(1, min(gen_procs, n_conns))
    if procs == 1:
        socks = _connect_many(addr, n_conns)
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
    res["wall"] = res["t1"] - res["t0"]
    res["rate"] = res["count"] / res["wall"] if res["wall"] > 0 else 0.0
    res["gen_cpu_share"] = res["cpu"] / res["wall"] if res["wall"] > 0 else 0.0
    del res["t0"], res["t1"]
    return res


def one_at_a_time(addr, kind: str, n: int, time_cap: float) -> dict:
    """Row 6: one blocking connection, one command at a time, each reply read whole before
    the next command.  kind "put": n puts; kind "cycle": n reserve -> delete cycles."""
    sock = socket.create_connection(addr, timeout=15)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    send, recv = sock.sendall, sock.recv
    errors, bad, body_bad, done, capped = [], [], 0, 0, False

    def line_reply(r: bytes) -> bytes:          # a one-line reply: read to its \r\n
        while not r.endswith(b"\r\n"):
            d = recv(RECV_SIZE)
            if not d:
                raise EOFError(f"server closed the connection after {done} {kind}s")
            r += d
        return r

    cpu0, t0 = time.process_time(), time.monotonic()
    deadline = t0 + time_cap
    try:
        for i in range(n):
            if i & 63 == 63 and time.monotonic() >= deadline:
                capped = True
                break
            if kind == "put":
                send(PUT_CMD)
                r = line_reply(recv(RECV_SIZE))
                if r.startswith(b"INSERTED ") and r.find(b"\n") == len(r) - 1:
                    done += 1
                else:
                    bad.append(r[:80])
                continue
            send(b"reserve\r\n")
            r = recv(RECV_SIZE)
            while True:                          # RESERVED <id> <n>\r\n<body>\r\n
                j = r.find(b"\r\n")
                if j >= 0:
                    if not r.startswith(b"RESERVED "):
                        break
                    jid, nb = r[9:j].split(b" ")
                    end = j + 2 + int(nb) + 2
                    if len(r) >= end:
                        break
                d = recv(RECV_SIZE)
                if not d:
                    raise EOFError(f"server closed the connection after {done} cycles")
                r += d
            if not r.startswith(b"RESERVED "):
                bad.append(r[:80])
                break                            # nothing reserved: no cycle to go on with
            if int(nb) != BODY_LEN or r[j + 2:end - 2] != BODY or len(r) != end \
                    or r[end - 2:] != b"\r\n":
                body_bad += 1
            send(b"delete %s\r\n" % jid)
            r = line_reply(recv(RECV_SIZE))
            if r == b"DELETED\r\n":
                done += 1
            else:
                bad.append(r[:80])
    except (OSError, EOFError, ValueError) as exc:
        errors.append(f"after {done} {kind}s: {exc!r}")
    t1, cpu1 = time.monotonic(), time.process_time()
    sock.close()
    if bad:
        errors.append(f"{len(bad)} unexpected replies, e.g. {bad[:3]!r}")
    if body_bad:
        errors.append(f"{body_bad} RESERVED replies had a wrong body")
    wall = t1 - t0
    return dict(count=done, wall=wall, rate=done / wall if wall > 0 else 0.0,
                gen_cpu_share=(cpu1 - cpu0) / wall if wall > 0 else 0.0, capped=capped,
                errors=errors)


def request_latency(addr, n: int, time_cap: float) -> dict:
    """Row 9 probe: one blocking connection, n puts one at a time; each request's round
    trip (sendall of the put to its whole INSERTED line) timed with perf_counter()."""
    sock = socket.create_connection(addr, timeout=15)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    send, recv, clock = sock.sendall, sock.recv, time.perf_counter
    lat, bad, errors, capped = [], [], [], False
    deadline = time.monotonic() + time_cap
    try:
        for i in range(n):
            if i & 63 == 63 and time.monotonic() >= deadline:
                capped = True
                break
            t = clock()
            send(PUT_CMD)
            r = recv(RECV_SIZE)
            while not r.endswith(b"\r\n"):
                d = recv(RECV_SIZE)
                if not d:
                    raise EOFError(f"server closed the connection after {len(lat)} puts")
                r += d
            dt = clock() - t
            if r.startswith(b"INSERTED ") and r.find(b"\n") == len(r) - 1:
                lat.append(dt * 1000.0)
            else:
                bad.append(r[:80])
    except (OSError, EOFError) as exc:
        errors.append(f"after {len(lat)} puts: {exc!r}")
    sock.close()
    if bad:
        errors.append(f"{len(bad)} unexpected replies, e.g. {bad[:3]!r}")
    return dict(count=len(lat), p50=pct(lat, 50) if lat else None,
                p99=pct(lat, 99) if lat else None, max=max(lat) if lat else None,
                mean=sum(lat) / len(lat) if lat else None, capped=capped, errors=errors,
                lat_ms=[round(x, 4) for x in lat])


def _bg_put_main(pipe, go, stop, addr, n_conns: int, window: int, time_cap: float,
                 chunk: int = 2000):
    """Row 9 background load (a forked process): pipelined puts on n_conns connections,
    `window` in flight each, until `stop` is set (or time_cap).  _put_loop runs in rounds
    of `chunk` puts per connection, each round ending with all its replies in; `stop` is
    looked at between rounds."""
    try:
        socks = _connect_many(addr, n_conns)
    except BaseException as exc:
        pipe.send(dict(count=0, errors=[f"load process: {exc!r}"]))
        pipe.close()
        return
    pipe.send("ready")
    count = replies = rounds = 0
    cpu, errors, hit_cap = 0.0, [], False
    go.wait(60)
    cpu0, t0 = time.process_time(), time.monotonic()
    deadline = t0 + time_cap
    try:
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                hit_cap = True
                break
            r = _put_loop(socks, [chunk] * n_conns, window, left)
            count += r["count"]
            replies += r["replies"]
            rounds += 1
            errors += r["errors"]
            if r["capped"] or r["errors"]:
                hit_cap = hit_cap or r["capped"]
                break
            for s in socks:                   # _put_loop starts from a low-water mark of 1
                set_lowat(s, 1)
    except BaseException as exc:
        errors.append(f"load process: {exc!r}")
    t1, cpu1 = time.monotonic(), time.process_time()
    for s in socks:
        s.close()
    wall = t1 - t0
    pipe.send(dict(count=count, replies=replies, rounds=rounds, wall=wall,
                   rate=count / wall if wall > 0 else 0.0,
                   gen_cpu_share=(cpu1 - cpu0) / wall if wall > 0 else 0.0,
                   hit_time_cap=hit_cap, errors=errors))
    pipe.close()


def exec_to_exit(srv: Server, cap: float = 10.0) -> dict:
    """Row 7's floor: ms from just before Popen of `srv`'s command to its exit."""
    t0 = srv.spawn()
    # (a blocking wait: Popen.wait(timeout) polls with sleeps that grow to 50 ms)
    timer = threading.Timer(cap, srv.proc.kill)
    timer.start()
    rc = srv.proc.wait()
    ms = (time.monotonic() - t0) * 1000
    timer.cancel()
    return dict(listen_ms=None, first_ms=ms if rc == 0 else None, refused=0, dropped=0,
                errors=[] if rc == 0 else [f"exit status {rc}: {srv.read_output()[:200]!r}"])


def exec_to_first_reply(srv: Server, cap: float = 10.0) -> dict:
    """Row 7: start `srv`'s command, retry connect() every 0.5 ms, then one put; ms from
    just before Popen to the first accepted connection and to the INSERTED reply."""
    if srv.kind == "floor":
        return exec_to_exit(srv, cap)
    t0 = srv.spawn()
    deadline = t0 + cap
    listen = first = None
    errors, refused, dropped = [], 0, 0
    while first is None and not errors:
        if time.monotonic() >= deadline:
            errors.append(f"no INSERTED within {cap:.0f} s ({refused} connects refused, "
                          f"{dropped} connections dropped)")
            break
        s = socket.socket()
        try:
            s.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                s.connect(srv.addr)
            except ConnectionRefusedError:
                refused += 1
                if srv.proc.poll() is not None:
                    errors.append(f"{srv.name} exited with {srv.proc.returncode}")
                time.sleep(0.0005)
                continue
            if listen is None:
                listen = time.monotonic()
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(b"put 0 0 60 1\r\nx\r\n")
            r = b""
            while not r.endswith(b"\r\n"):
                d = s.recv(100)
                if not d:
                    raise ConnectionResetError("closed before replying")
                r += d
            if r.startswith(b"INSERTED "):
                first = time.monotonic()
            else:
                errors.append(f"first reply {r[:80]!r}")
        except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError):
            dropped += 1                          # accepted, then dropped: try again
            time.sleep(0.0005)
        except OSError as exc:
            errors.append(repr(exc))
        finally:
            s.close()
    if srv.alive():
        srv.start_children = sorted(proc_children(srv.proc.pid))
    ms = lambda t: (t - t0) * 1000 if t is not None else None
    return dict(listen_ms=ms(listen), first_ms=ms(first), refused=refused, dropped=dropped,
                errors=errors)


# --------------------------------------------------------------------------- helpers

def fill(server: Server, n: int, window: int, time_cap: float, conns: int = 8,
         gen_procs: int = 1) -> dict:
    res = run_load(server.addr, "put", conns, n, window, time_cap, gen_procs)
    if res["count"] != n:
        raise RuntimeError(f"fill: {res['count']} of {n} jobs inserted in {res['wall']:.1f}s; "
                           f"errors {res['errors'][:3]}")
    return res


def timed_load(server: Server, *args, **kw) -> dict:
    c0, w0 = server.cpu_s(), time.monotonic()
    res = run_load(server.addr, *args, **kw)
    w1 = time.monotonic()
    res["server_cpu_share"] = (server.cpu_s() - c0) / (w1 - w0)
    return res


def median(values: list) -> float | None:
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    k = max(0, min(len(v) - 1, math.ceil(p / 100.0 * len(v)) - 1))
    return v[k]


def log(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------- rows

class Bench:
    def __init__(self, args):
        self.args = args
        self.quick = args.quick
        self.fronts = args.fronts
        zs_bin = args.zstalk
        self.factories = {
            "beanstalkd": lambda: Server("beanstalkd", lambda port: [
                args.beanstalkd, "-l", HOST, "-p", str(port)], "beanstalkd"),
            "zstalk": lambda: Server("zstalk", lambda port: [
                zs_bin, "serve", "-l", HOST, "-p", str(port), "--fronts", str(self.fronts)],
                "zstalk"),
        }
        # row 9: both placements of the fronts, whatever --fronts says (names outside
        # self.orders(): row 9 orders its three servers itself)
        for nf in (0, 1):
            self.factories[f"zstalk-f{nf}"] = (lambda nf=nf: Server("zstalk", lambda port: [
                zs_bin, "serve", "-l", HOST, "-p", str(port), "--fronts", str(nf)],
                f"zstalk --fronts {nf}"))
        # row 7: the commands as a user would type them (no counter front, no worker endpoint)
        zstalkd = str(Path(zs_bin).parent / "zstalkd")
        self.exec_factories = {
            "beanstalkd": self.factories["beanstalkd"],
            "zstalk": lambda: Server("zstalk", lambda port: [
                zs_bin, "serve", "-l", HOST, "-p", str(port), "--counter-port", "0",
                "--worker-bind", "none"] + (["--fronts", str(self.fronts)] if self.fronts else []),
                "zstalk serve"),
            "zstalkd": lambda: Server("zstalk", lambda port: [zstalkd, "-l", HOST, "-p", str(port)],
                                      "zstalkd"),
            "floor": lambda: Server("floor", lambda port: [
                str(Path(zs_bin).parent / "python"), "-c", "import asyncio, uvloop"], "floor"),
        }
        self.notes: list[str] = []
        self.results: dict = {}
        self.start_times = {"beanstalkd": [], "zstalk": [], "zstalk-f0": [], "zstalk-f1": []}

    def orders(self, reps):
        for r in range(reps):
            yield r, (["beanstalkd", "zstalk"] if r % 2 == 0 else ["zstalk", "beanstalkd"])

    def fresh(self, name: str) -> Server:
        srv = self.factories[name]()
        self.start_times[name].append(srv.start())
        return srv

    def finish(self, srv: Server, where: str):
        try:
            srv.stop(where)
        finally:
            self.notes += srv.notes

    # Row 1 -----------------------------------------------------------------
    def row_put(self):
        a = self.args
        total = 20000 if self.quick else a.put_count
        cap = 4.0 if self.quick else 15.0
        reps = a.repeats
        out = {}
        for r, order in self.orders(reps):
            for nc in (1, 8, 50):
                for name in order:
                    where = f"row1 put conns={nc} rep={r} {name}"
                    srv = self.fresh(name)
                    try:
                        res = timed_load(srv, "put", nc, total, a.window, cap,
                                         gen_procs=a.gen_procs)
                    except Exception as exc:
                        res = dict(rate=None, errors=[repr(exc)])
                    finally:
                        self.finish(srv, where)
                    out.setdefault(str(nc), {}).setdefault(name, []).append(res)
                    self._report(where, res, "puts/s")
        self.results["put"] = out

    # Row 2 -----------------------------------------------------------------
    def row_work(self):
        a = self.args
        total = 3000 if self.quick else a.work_count
        cap = 4.0 if self.quick else 8.0
        out = {}
        for r, order in self.orders(a.repeats):
            for nc in (1, 8, 50):
                for name in order:
                    where = f"row2 worker conns={nc} rep={r} {name}"
                    srv = self.fresh(name)
                    try:
                        filled = fill(srv, total + 100, a.window, 120.0, gen_procs=a.gen_procs)
                        res = timed_load(srv, "work", nc, total, a.window, cap,
                                         gen_procs=a.gen_procs)
                        res["fill_rate"] = filled["rate"]
                        c = Client(srv.addr)
                        st = c.stats()
                        c.close()
                        res["ready_after"] = int(st.get("current-jobs-ready", -1))
                        # (a capped run may leave one delete in flight per connection)
                        if not res["capped"] and res["ready_after"] != total + 100 - res["count"]:
                            res["errors"].append(
                                f"ready after = {res['ready_after']}, expected "
                                f"{total + 100 - res['count']}")
                    except Exception as exc:
                        res = dict(rate=None, errors=[repr(exc)])
                    finally:
                        self.finish(srv, where)
                    out.setdefault(str(nc), {}).setdefault(name, []).append(res)
                    self._report(where, res, "jobs/s")
        self.results["work"] = out

    # Row 3 -----------------------------------------------------------------
    def row_memory(self):
        a = self.args
        n = 20000 if self.quick else a.jobs_for_memory
        out = {"jobs": n}
        for name in ("beanstalkd", "zstalk"):
            where = f"row3 memory jobs={n} {name}"
            srv = self.fresh(name)
            try:
                time.sleep(0.3)
                idle = srv.rss_mib()
                t0 = time.monotonic()
                filled = fill(srv, n, a.window, 60.0 if self.quick else 600.0,
                              gen_procs=a.gen_procs)
                fill_s = time.monotonic() - t0
                time.sleep(1.0)
                c = Client(srv.addr, timeout=60)
                st = c.stats()
                c.close()
                time.sleep(0.2)
                rss = srv.rss_mib()
                per = {str(p): round(proc_rss_kib(p) / 1024, 1) for p in srv.pids()}
                res = dict(idle_mib=idle, rss_mib=rss, fill_s=fill_s, fill_rate=filled["rate"],
                           ready=int(st.get("current-jobs-ready", -1)), per_process_mib=per,
                           gen_cpu_share=filled["gen_cpu_share"], errors=filled["errors"])
                if res["ready"] != n:
                    res["errors"].append(f"stats says {res['ready']} ready, expected {n}")
            except Exception as exc:
                res = dict(rss_mib=None, errors=[repr(exc)])
            finally:
                self.finish(srv, where)
            out[name] = res
            if res.get("rss_mib") is not None:
                log(f"  {where}: idle {res['idle_mib']:.1f} MiB, after fill {res['rss_mib']:.1f}"
                    f" MiB ({res['per_process_mib']}), fill {res['fill_s']:.1f}s "
                    f"({res['fill_rate']:.0f}/s), gen cpu {res['gen_cpu_share']:.2f}"
                    + (f" ERR {res['errors']}" if res["errors"] else ""))
            else:
                log(f"  {where}: ERROR {res['errors']}")
        self.results["memory"] = out

    # Row 4 -----------------------------------------------------------------
    def row_tubes(self):
        a = self.args
        k = 300 if self.quick else a.tube_jobs
        reps = a.repeats
        ntubes = 1000
        out = {"jobs": k}
        servers = {}
        try:
            for name in ("beanstalkd", "zstalk"):
                srv = self.fresh(name)
                servers[name] = srv
                w1000 = Client(srv.addr)
                w1000.pipeline([b"watch t%d\r\n" % i for i in range(ntubes)], expect=b"WATCHING")
                w1000.pipeline([b"ignore default\r\n"], expect=b"WATCHING")
                w1 = Client(srv.addr)
                w1.pipeline([b"watch t0\r\n", b"ignore default\r\n"], expect=b"WATCHING")
                prod = Client(srv.addr)
                srv.clients = (w1, w1000, prod)
            for r, order in self.orders(reps):
                for name in order:
                    srv = servers[name]
                    w1, w1000, prod = srv.clients
                    for variant in ("watch1", "watch1000_one", "watch1000_spread"):
                        where = f"row4 tubes {variant} rep={r} {name}"
                        try:
                            if variant == "watch1000_spread":
                                cmds = [b"use t%d\r\n" % (j % ntubes) + PUT_CMD for j in range(k)]
                                prod.pipeline(cmds, replies_per_cmd=2, batch=250)
                            else:
                                prod.pipeline([b"use t0\r\n"], expect=b"USING")
                                prod.pipeline([PUT_CMD] * k, expect=b"INSERTED")
                            worker = w1 if variant == "watch1" else w1000
                            res = self._cycles(srv, worker, k, 4.0 if self.quick else 15.0)
                            left = self._drain(w1000)
                            if left:
                                res["errors"].append(f"{left} jobs left after the drain")
                        except Exception as exc:
                            res = dict(per_cycle_us=None, errors=[repr(exc)])
                        out.setdefault(variant, {}).setdefault(name, []).append(res)
                        if res.get("per_cycle_us") is not None:
                            log(f"  {where}: {res['rate']:.0f} cycles/s "
                                f"({res['per_cycle_us']:.1f} us/cycle), gen cpu "
                                f"{res['gen_cpu_share']:.2f}, server cpu "
                                f"{res['server_cpu_share']:.2f}"
                                + (f" ERR {res['errors']}" if res["errors"] else ""))
                        else:
                            log(f"  {where}: ERROR {res['errors']}")
        finally:
            for name, srv in servers.items():
                close_all(getattr(srv, "clients", ()))
                self.finish(srv, f"row4 {name}")
        self.results["tubes"] = out

    def _cycles(self, srv, c: Client, k: int, cap: float) -> dict:
        """k reserve -> delete+reserve cycles on one connection (the row-2 loop)."""
        if c.buf:
            raise RuntimeError(f"unread data before cycles: {bytes(c.buf[:80])!r}")
        c0 = srv.cpu_s()
        c.sock.setblocking(False)
        try:
            res = _work_loop([c.sock], [k], cap)
        finally:
            c.sock.settimeout(15)
        wall = res["t1"] - res["t0"]
        done = res["count"]
        return dict(count=done, wall=wall, rate=done / wall,
                    per_cycle_us=wall / done * 1e6 if done else None,
                    gen_cpu_share=res["cpu"] / wall,
                    server_cpu_share=(srv.cpu_s() - c0) / wall,
                    capped=res["capped"], errors=res["errors"])

    def _drain(self, c: Client) -> int:
        n = 0
        while True:
            c.send(b"reserve-with-timeout 0\r\n")
            line, _ = c.reply()
            if not line.startswith(b"RESERVED "):
                return n
            c.send(b"delete %s\r\n" % line.split()[1])
            c.expect(b"DELETED")
            n += 1

    # Row 5 -----------------------------------------------------------------
    def row_timers(self):
        a = self.args
        n = 30 if self.quick else a.timer_jobs
        spacing = a.spacing / 1000.0
        out = {"jobs": n, "spacing_ms": a.spacing}
        for name in ("beanstalkd", "zstalk"):
            srv = self.fresh(name)
            try:
                for test, fn in (("delay", self._delay_lateness), ("ttr", self._ttr_lateness)):
                    where = f"row5 {test} {name}"
                    try:
                        res = fn(srv, n, spacing)
                    except Exception as exc:
                        res = dict(errors=[repr(exc)], late_ms=[])
                    lm = res["late_ms"]
                    res.update(p50=pct(lm, 50), p99=pct(lm, 99),
                               max=max(lm) if lm else float("nan"),
                               min=min(lm) if lm else float("nan"), received=len(lm))
                    out.setdefault(test, {})[name] = res
                    log(f"  {where}: {len(lm)}/{n} jobs, lateness p50 {res['p50']:.2f} p99 "
                        f"{res['p99']:.2f} max {res['max']:.2f} min {res['min']:.2f} ms"
                        + (f" ERR {res['errors']}" if res["errors"] else ""))
            finally:
                self.finish(srv, f"row5 {name}")
        self.results["timers"] = out

    def _delay_lateness(self, srv, n, spacing):
        errors = []
        got: dict[int, float] = {}
        w = Client(srv.addr, timeout=0.5)
        w.sock.settimeout(15)
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
                    idx = int(body[:10])
                    got[idx] = t
                    jid = line.split()[1]
                    w.send(b"delete %s\r\n" % jid + (b"reserve\r\n" if len(got) < n else b""))
                elif line != b"DELETED":
                    errors.append(f"worker got {line!r}")

        th = threading.Thread(target=worker, daemon=True)
        th.start()
        p = Client(srv.addr)
        p.pipeline([b"use lat\r\n"], expect=b"USING")
        sent, rtt = {}, []
        t0 = time.monotonic() + 0.05
        for i in range(n):
            delay = t0 + i * spacing - time.monotonic()
            if delay > 0:
                time.sleep(delay)
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
        late = [(got[i] - (sent[i] + 1.0)) * 1000 for i in sorted(got) if i in sent]
        if len(got) < n:
            errors.append(f"only {len(got)} of {n} delayed jobs were reserved within "
                          f"{TIMER_GRACE_S:.0f} s after their delay")
        return dict(late_ms=late, put_rtt_ms_p50=pct(rtt, 50), errors=errors, sent=len(sent))

    def _ttr_lateness(self, srv, n, spacing):
        """Job i: holder H_i puts it (ttr 1) into tube ttr-i and reserves it; then waiter
        W_i (watching only ttr-i) blocks in reserve until the TTR sends the job back."""
        errors = []
        holders, waiters = [], []
        for i in range(n):
            h = Client(srv.addr)
            h.send(b"use ttr-%d\r\nwatch ttr-%d\r\nignore default\r\n" % (i, i))
            w = Client(srv.addr)
            w.send(b"watch ttr-%d\r\nignore default\r\n" % i)
            holders.append(h)
            waiters.append(w)
        for h, w in zip(holders, waiters):
            h.expect(b"USING")
            h.expect(b"WATCHING")
            h.expect(b"WATCHING")
            w.expect(b"WATCHING")
            w.expect(b"WATCHING")
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
                            if i not in got:
                                got[i] = t
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
        t0 = time.monotonic() + 0.05
        for i in range(n):
            delay = t0 + i * spacing - time.monotonic()
            if delay > 0:
                time.sleep(delay)
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
                st = probe.stats(b"stats-tube ttr-%d" % i)
                still += int(st.get("current-jobs-reserved", 0))
            close_all([probe])
            errors.append(f"only {len(got)} of {len(reserved_at)} jobs came back within "
                          f"{TIMER_GRACE_S:.0f} s after their TTR; {still} were still "
                          f"'reserved' (by their idle holder connection) at that point")
        close_all(waiters + holders)
        return dict(late_ms=late, reserve_rtt_ms_p50=pct(rtt, 50), errors=errors,
                    sent=len(reserved_at), still_reserved=still)

    # Row 6 -----------------------------------------------------------------
    def row_one(self):
        a = self.args
        counts = {"put": 3000 if self.quick else a.one_put_count,
                  "cycle": 2000 if self.quick else a.one_cycle_count}
        cap = 10.0 if self.quick else 30.0
        out = {}
        for r, order in self.orders(a.repeats):
            for kind, n in counts.items():
                for name in order:
                    where = f"row6 one at a time {kind} rep={r} {name}"
                    srv = self.fresh(name)
                    try:
                        if kind == "cycle":
                            fill(srv, n + 100, a.window, 120.0, gen_procs=a.gen_procs)
                        c0, w0 = srv.cpu_s(), time.monotonic()
                        res = one_at_a_time(srv.addr, kind, n, cap)
                        res["server_cpu_share"] = (srv.cpu_s() - c0) / (time.monotonic() - w0)
                        c = Client(srv.addr)
                        st = c.stats()
                        c.close()
                        ready = int(st.get("current-jobs-ready", -1))
                        want = res["count"] if kind == "put" else n + 100 - res["count"]
                        if ready != want:
                            res["errors"].append(f"ready after = {ready}, expected {want}")
                    except Exception as exc:
                        res = dict(rate=None, errors=[repr(exc)])
                    finally:
                        self.finish(srv, where)
                    out.setdefault(kind, {}).setdefault(name, []).append(res)
                    self._report(where, res, "puts/s" if kind == "put" else "cycles/s")
        self.results["one"] = out

    # Row 7 -----------------------------------------------------------------
    def row_exec(self):
        runs = 9
        names = list(self.exec_factories)
        out = {"runs": runs}
        for r in range(runs):
            for name in (names if r % 2 == 0 else names[::-1]):
                where = f"row7 exec run={r} {name}"
                srv = self.exec_factories[name]()
                try:
                    res = exec_to_first_reply(srv)
                except Exception as exc:
                    res = dict(listen_ms=None, first_ms=None, errors=[repr(exc)])
                finally:
                    self.finish(srv, where)
                out.setdefault(name, []).append(res)
                if res["first_ms"] is not None and res["listen_ms"] is None:
                    log(f"  {where}: exited at {res['first_ms']:.1f} ms")
                elif res["first_ms"] is not None:
                    log(f"  {where}: port accepts at {res['listen_ms']:.1f} ms, INSERTED at "
                        f"{res['first_ms']:.1f} ms ({res['refused']} connects refused"
                        f"{', %d dropped' % res['dropped'] if res['dropped'] else ''})")
                else:
                    log(f"  {where}: ERROR {res['errors']}")
        self.results["exec"] = out

    # Row 8 -----------------------------------------------------------------
    def row_pipe(self):
        a = self.args
        puts = 20000 if self.quick else a.put_count
        cycles = 3000 if self.quick else a.work_count
        # (label, load kind, connections, in flight per connection, count, time cap)
        variants = [("put8x32", "put", 8, 32, puts, 4.0 if self.quick else 15.0),
                    ("work8x32", "work32", 8, 32, cycles, 4.0 if self.quick else 8.0),
                    ("work50x1", "work1", 50, 1, cycles, 4.0 if self.quick else 8.0)]
        out = {}
        for r, order in self.orders(a.repeats):
            for label, kind, nc, depth, total, cap in variants:
                for name in order:
                    where = f"row8 {label} rep={r} {name}"
                    srv = self.fresh(name)
                    try:
                        if kind == "put":
                            res = timed_load(srv, "put", nc, total, depth, cap,
                                             gen_procs=a.gen_procs)
                        else:
                            filled = fill(srv, total + 100, a.window, 120.0,
                                          gen_procs=a.gen_procs)
                            res = timed_load(srv, kind, nc, total, depth, cap,
                                             gen_procs=a.gen_procs)
                            res["fill_rate"] = filled["rate"]
                            c = Client(srv.addr)
                            st = c.stats()
                            c.close()
                            res["ready_after"] = int(st.get("current-jobs-ready", -1))
                            # (a capped run may leave deletes in flight)
                            if not res["capped"] and \
                                    res["ready_after"] != total + 100 - res["count"]:
                                res["errors"].append(
                                    f"ready after = {res['ready_after']}, expected "
                                    f"{total + 100 - res['count']}")
                    except Exception as exc:
                        res = dict(rate=None, errors=[repr(exc)])
                    finally:
                        self.finish(srv, where)
                    out.setdefault(label, {}).setdefault(name, []).append(res)
                    self._report(where, res, "puts/s" if kind == "put" else "deletes/s")
        self.results["pipe"] = out

    # Row 9 -----------------------------------------------------------------
    LAT_NAMES = ("beanstalkd", "zstalk-f0", "zstalk-f1")

    def row_latency(self):
        a = self.args
        n = 500 if self.quick else a.latency_count
        cap = 30.0 if self.quick else 120.0
        names = list(self.LAT_NAMES)
        out = {"requests": n, "load_desc": "8 conns x 32 pipelined puts, another process"}
        for r in range(a.repeats):
            order = names if r % 2 == 0 else names[::-1]
            for cond in ("idle", "load"):
                for name in order:
                    where = f"row9 latency {cond} rep={r} {name}"
                    srv = self.fresh(name)
                    try:
                        if cond == "idle":
                            c0, w0 = srv.cpu_s(), time.monotonic()
                            res = request_latency(srv.addr, n, cap)
                            res["server_cpu_share"] = ((srv.cpu_s() - c0)
                                                       / (time.monotonic() - w0))
                        else:
                            res = self._latency_under_load(srv, n, cap)
                        if res["count"] < n and not res["errors"]:
                            res["errors"].append(f"only {res['count']} of {n} requests")
                    except Exception as exc:
                        res = dict(p50=None, p99=None, errors=[repr(exc)])
                    finally:
                        self.finish(srv, where)
                    out.setdefault(cond, {}).setdefault(name, []).append(res)
                    if res.get("p50") is None:
                        log(f"  {where}: ERROR {res.get('errors')}")
                        continue
                    ld = res.get("load")
                    log(f"  {where}: p50 {res['p50']:.3f} ms, p99 {res['p99']:.3f} ms, max "
                        f"{res['max']:.2f} ms ({res['count']} puts"
                        f"{', CAPPED' if res.get('capped') else ''}), server cpu "
                        f"{res['server_cpu_share']:.2f}"
                        + (f"; load {ld['rate']:,.0f} puts/s, load gen cpu "
                           f"{ld['gen_cpu_share']:.2f}" if ld else "")
                        + (f" ERR {res['errors']}" if res["errors"] else ""))
        self.results["latency"] = out
        log(latency_table(out, a.repeats))

    def _latency_under_load(self, srv, n, cap):
        """The row-9 probe while another process keeps 8 connections x 32 puts in flight."""
        ctx = multiprocessing.get_context("fork")
        go, stop = ctx.Event(), ctx.Event()
        mine, theirs = ctx.Pipe()
        p = ctx.Process(target=_bg_put_main,
                        args=(theirs, go, stop, srv.addr, 8, 32, cap + 30.0))
        p.start()
        try:
            if not mine.poll(30):
                raise RuntimeError("load process did not get ready")
            msg = mine.recv()
            if msg != "ready":
                raise RuntimeError(f"load process: {msg.get('errors')}")
            c0, w0 = srv.cpu_s(), time.monotonic()
            go.set()
            time.sleep(0.2)                  # the load up to speed before the first probe
            res = request_latency(srv.addr, n, cap)
            stop.set()
            if not mine.poll(60):
                raise RuntimeError("load process did not report")
            load = mine.recv()
            res["server_cpu_share"] = (srv.cpu_s() - c0) / (time.monotonic() - w0)
        finally:
            stop.set()
            go.set()
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
        res["load"] = load
        res["errors"] += [f"load: {e}" for e in load["errors"][:3]]
        if load.get("hit_time_cap"):
            res["errors"].append("load: ran into its time cap before the probe ended")
        return res

    # ---------------------------------------------------------------------
    def _report(self, where, res, unit):
        if res.get("rate") is None:
            log(f"  {where}: ERROR {res.get('errors')}")
            return
        log(f"  {where}: {res['rate']:,.0f} {unit} ({res['count']} in {res['wall']:.2f}s"
            f"{', CAPPED' if res.get('capped') else ''}), gen cpu {res['gen_cpu_share']:.2f}, "
            f"server cpu {res['server_cpu_share']:.2f}"
            + (f" ERR {res['errors']}" if res["errors"] else ""))


# --------------------------------------------------------------------------- table

def best(samples, key="rate", lowest=False):
    vals = [s[key] for s in samples if s.get(key) is not None]
    if not vals:
        return None
    return min(vals) if lowest else max(vals)


def build_table(results: dict, mem_jobs: int | None) -> tuple[list[dict], dict]:
    rows = []
    diag = {}

    def add(metric, b, z, target=None, ratio=True, fmt="{:,.0f}", note=""):
        r = b and z and ratio and (z / b if b else None)
        row = dict(metric=metric, beanstalkd=b, zstalk=z,
                   ratio=(z / b) if (ratio and b and z is not None) else None,
                   target=None, status="", fmt=fmt, note=note)
        if target:
            which, op, thr = target
            val = row["ratio"] if which == "ratio" else z
            row["target"] = (f"ratio {op} {thr}x" if which == "ratio" else f"zstalk {op} {thr}")
            if val is None:
                row["status"] = "MISS (no data)"
            else:
                ok = val >= thr if op == ">=" else val <= thr
                row["status"] = "PASS" if ok else "MISS"
        rows.append(row)

    put = results.get("put")
    if put:
        for nc in ("1", "8", "50"):
            d = put.get(nc, {})
            add(f"pipelined put, {nc} conn (puts/s)", best(d.get("beanstalkd", [])),
                best(d.get("zstalk", [])), target=("ratio", ">=", 1.5) if nc == "8" else None)
    work = results.get("work")
    if work:
        for nc in ("1", "8", "50"):
            d = work.get(nc, {})
            add(f"worker cycle, {nc} conn (jobs/s)", best(d.get("beanstalkd", [])),
                best(d.get("zstalk", [])),
                target=("ratio", ">=", 1.0) if nc in ("8", "50") else None)
    mem = results.get("memory")
    if mem:
        b, z = mem.get("beanstalkd", {}), mem.get("zstalk", {})
        add(f"RSS idle (MiB)", b.get("idle_mib"), z.get("idle_mib"), fmt="{:,.1f}")
        add(f"RSS with {mem['jobs']:,} ready jobs (MiB)", b.get("rss_mib"), z.get("rss_mib"),
            target=("ratio", "<=", 1.3), fmt="{:,.1f}",
            note="" if mem["jobs"] == 1000000 else f"(--jobs-for-memory {mem['jobs']})")
        add(f"  fill time for {mem['jobs']:,} jobs (s)", b.get("fill_s"), z.get("fill_s"),
            fmt="{:,.1f}")
    tubes = results.get("tubes")
    if tubes:
        per = {}
        for v in ("watch1", "watch1000_one", "watch1000_spread"):
            d = tubes.get(v, {})
            per[v] = {n: best(d.get(n, []), "per_cycle_us", lowest=True)
                      for n in ("beanstalkd", "zstalk")}
        labels = {"watch1": "watch 1 tube", "watch1000_one": "watch 1000, jobs in 1",
                  "watch1000_spread": "watch 1000, jobs spread"}
        for v in ("watch1", "watch1000_one", "watch1000_spread"):
            b, z = per[v]["beanstalkd"], per[v]["zstalk"]
            add(f"reserve+delete, {labels[v]} (cycles/s)", b and 1e6 / b, z and 1e6 / z)
        for v in ("watch1000_one", "watch1000_spread"):
            cost = {n: (per[v][n] / per["watch1"][n]) if per[v][n] and per["watch1"][n] else None
                    for n in ("beanstalkd", "zstalk")}
            add(f"reserve cost 1000/1 tubes, {labels[v].split(', ')[1]} (x)",
                cost["beanstalkd"], cost["zstalk"], target=("zstalk", "<=", 1.2), ratio=False,
                fmt="{:.2f}")
    timers = results.get("timers")
    if timers:
        d = timers.get("delay", {})
        add("  request round trip during row 5, put p50 (ms)",
            d.get("beanstalkd", {}).get("put_rtt_ms_p50"), d.get("zstalk", {}).get("put_rtt_ms_p50"),
            fmt="{:.2f}", note="(part of each lateness below)")
        for test, label in (("delay", "delay 1s"), ("ttr", "TTR 1s")):
            d = timers.get(test, {})
            b, z = d.get("beanstalkd", {}), d.get("zstalk", {})
            add(f"{label}: jobs back within {TIMER_GRACE_S:.0f} s of due (of {timers['jobs']})",
                b.get("received"), z.get("received"), ratio=False, fmt="{:.0f}")
            for stat in ("p50", "p99", "max"):
                b = d.get("beanstalkd", {}).get(stat)
                z = d.get("zstalk", {}).get(stat)
                add(f"{label} lateness {stat} (ms)", b, z, fmt="{:.2f}",
                    ratio=bool(b is not None and b > 0.05))
    one = results.get("one")
    if one:
        for kind, label in (("put", "put (puts/s)"), ("cycle", "reserve+delete (cycles/s)")):
            d = one.get(kind, {})
            add(f"one at a time, 1 conn: {label}", best(d.get("beanstalkd", [])),
                best(d.get("zstalk", [])), target=("ratio", ">=", 0.7))
    pipe = results.get("pipe")
    if pipe:
        for key, label, goal in (
                ("put8x32", "32 in flight, 8 conn: put (puts/s)", 1.2),
                ("work8x32", "32 in flight, 8 conn: reserve+delete (deletes/s)", 1.0),
                ("work50x1", "1 in flight, 50 conn: reserve+delete (deletes/s)", 0.8)):
            d = pipe.get(key, {})
            add(label, best(d.get("beanstalkd", [])), best(d.get("zstalk", [])),
                target=("ratio", ">=", goal))
    lat = results.get("latency")
    if lat:
        for cond, label in (("idle", "idle"), ("load", "under load")):
            d = lat.get(cond, {})
            for stat in ("p50", "p99"):
                b = best(d.get("beanstalkd", []), stat, lowest=True)
                for zn, zl in (("zstalk-f0", "--fronts 0"), ("zstalk-f1", "--fronts 1")):
                    goal = ("zstalk", "<=", 0.15) if (cond, stat, zn) == (
                        "idle", "p50", "zstalk-f1") else None
                    add(f"put round trip, {label}, {stat} (ms); zstalk {zl}", b,
                        best(d.get(zn, []), stat, lowest=True), fmt="{:.3f}", target=goal)
    ex = results.get("exec")
    if ex:
        runs = ex["runs"]
        first = {n: [s.get("first_ms") for s in ex.get(n, [])]
                 for n in ("beanstalkd", "zstalk", "zstalkd", "floor")}
        med = {n: median(v) for n, v in first.items()}
        spread = {n: "" if not [x for x in v if x is not None] else
                  f"({min(x for x in v if x is not None):,.1f}–{max(x for x in v if x is not None):,.1f})"
                  for n, v in first.items()}
        floor = med["floor"]
        goal = None if floor is None else min(80.0, floor + 20.0)
        add(f"exec → first INSERTED, zstalkd, median of {runs} (ms)", med["beanstalkd"],
            med["zstalkd"], fmt="{:,.1f}",
            note=f"zstalkd {spread['zstalkd']}, beanstalkd {spread['beanstalkd']}")
        row = rows[-1]
        row["target"] = "zstalkd <= 80 and <= floor + 20"
        row["status"] = ("MISS (no data)" if goal is None or med["zstalkd"] is None else
                         "PASS" if med["zstalkd"] <= goal else "MISS")
        add(f"  floor: python -c 'import asyncio, uvloop', exec → exit, median of {runs} (ms)",
            None, floor, ratio=False, fmt="{:,.1f}", note=spread["floor"])
        add(f"exec → first INSERTED, `zstalk serve`, median of {runs} (ms)",
            med["beanstalkd"], med["zstalk"], fmt="{:,.1f}", note=spread["zstalk"])
        listen = median([s.get("listen_ms") for s in ex.get("zstalkd", [])])
        add(f"  exec → port accepts a connection, zstalkd, median of {runs} (ms)",
            median([s.get("listen_ms") for s in ex.get("beanstalkd", [])]), listen,
            fmt="{:,.1f}")
    return rows, diag


def _fmt(v, fmt):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return fmt.format(v)


def render(rows) -> tuple[str, str]:
    header = ["metric", "beanstalkd", "zstalk", "zstalk/beanstalkd", "target", "result"]
    body = []
    for r in rows:
        body.append([r["metric"] + (f" {r['note']}" if r["note"] else ""),
                     _fmt(r["beanstalkd"], r["fmt"]), _fmt(r["zstalk"], r["fmt"]),
                     _fmt(r["ratio"], "{:.2f}x"), r["target"] or "", r["status"]])
    widths = [max(len(header[i]), *(len(b[i]) for b in body)) for i in range(len(header))]
    lines = ["  ".join(h.ljust(widths[i]) if i == 0 else h.rjust(widths[i]) if i < 4
                       else h.ljust(widths[i]) for i, h in enumerate(header))]
    lines.append("  ".join("-" * w for w in widths))
    for b in body:
        lines.append("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) if i < 4
                               else c.ljust(widths[i]) for i, c in enumerate(b)))
    md = ["| " + " | ".join(header) + " |",
          "|" + "|".join(["---", "---:", "---:", "---:", "---", "---"]) + "|"]
    for b in body:
        md.append("| " + " | ".join(c.replace("|", "\\|") for c in b) + " |")
    return "\n".join(lines), "\n".join(md)


def latency_table(lat: dict, repeats: int) -> str:
    """Row 9's three servers side by side: lowest p50 / p99 of the repetitions."""
    names = Bench.LAT_NAMES
    header = ["put round trip (ms)", "beanstalkd", "zstalk --fronts 0", "ratio",
              "zstalk --fronts 1", "ratio"]
    body = []
    for cond, label in (("idle", "idle"), ("load", "under load")):
        for stat in ("p50", "p99"):
            v = {n: best(lat.get(cond, {}).get(n, []), stat, lowest=True) for n in names}
            b = v["beanstalkd"]
            row = [f"{label}, {stat}", _fmt(b, "{:.3f}")]
            for n in names[1:]:
                row += [_fmt(v[n], "{:.3f}"),
                        _fmt(v[n] / b if (b and v[n] is not None) else None, "{:.2f}x")]
            body.append(row)
    widths = [max(len(header[i]), *(len(r[i]) for r in body)) for i in range(len(header))]
    lines = [f"request latency (row 9): {lat.get('requests')} puts one at a time per run, "
             f"lowest of {repeats} run(s); load = {lat.get('load_desc')}"]
    for r in [header, ["-" * w for w in widths]] + body:
        lines.append("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i])
                               for i, c in enumerate(r)))
    return "\n".join(lines)


def diagnostics(results) -> str:
    """Generator / server CPU share per load row: the max over runs."""
    out = ["load generator check (cpu s / wall s; 1.00 = one full core):"]
    for row, label in (("put", "row1 put conns="), ("work", "row2 worker conns="),
                       ("one", "row6 one at a time, 1 conn, "), ("pipe", "row8 ")):
        d = results.get(row)
        if not d:
            continue
        for nc, per in d.items():
            parts = []
            for name, samples in per.items():
                g = [s["gen_cpu_share"] for s in samples if s.get("gen_cpu_share") is not None]
                sv = [s["server_cpu_share"] for s in samples if s.get("server_cpu_share") is not None]
                if g:
                    parts.append(f"{name}: gen {min(g):.2f}-{max(g):.2f}, server "
                                 f"{min(sv):.2f}-{max(sv):.2f}")
            out.append(f"  {label}{nc}: " + "; ".join(parts))
    d = results.get("tubes")
    if d:
        for v in ("watch1", "watch1000_one", "watch1000_spread"):
            parts = []
            for name, samples in d.get(v, {}).items():
                g = [s["gen_cpu_share"] for s in samples if s.get("gen_cpu_share") is not None]
                sv = [s["server_cpu_share"] for s in samples if s.get("server_cpu_share") is not None]
                if g:
                    parts.append(f"{name}: gen {max(g):.2f}, server {max(sv):.2f}")
            out.append(f"  row4 {v}: " + "; ".join(parts))
    d = results.get("memory")
    if d:
        parts = [f"{n}: gen {d[n].get('gen_cpu_share', float('nan')):.2f}"
                 for n in ("beanstalkd", "zstalk") if n in d]
        out.append("  row3 fill: " + "; ".join(parts))
    d = results.get("latency")
    if d:
        for cond in ("idle", "load"):
            parts = []
            for name, samples in d.get(cond, {}).items():
                sv = [s["server_cpu_share"] for s in samples if s.get("server_cpu_share") is not None]
                ld = [s["load"] for s in samples if s.get("load")]
                if sv:
                    parts.append(f"{name}: server {max(sv):.2f}" + (
                        f", load {min(l['rate'] for l in ld):,.0f}-"
                        f"{max(l['rate'] for l in ld):,.0f} puts/s, load gen "
                        f"{max(l['gen_cpu_share'] for l in ld):.2f}" if ld else ""))
            out.append(f"  row9 latency {cond}: " + "; ".join(parts))
    return "\n".join(out)


# --------------------------------------------------------------------------- main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small counts, one repetition (<60 s)")
    ap.add_argument("--rows", default="1,2,3,4,5,6,7,8,9", help="rows to run, e.g. 1,2,5")
    ap.add_argument("--fronts", type=int, default=0,
                    help="0: fronts in the broker's process (zstalk serve's default); "
                         "N: N front processes")
    ap.add_argument("--json", help="write results as JSON to this path")
    ap.add_argument("--jobs-for-memory", type=int, default=1000000)
    ap.add_argument("--repeats", type=int, default=None,
                    help="repetitions of rows 1, 2, 4, 6, 8, 9 (default 3; 1 with --quick); "
                         "best taken")
    ap.add_argument("--put-count", type=int, default=100000, help="puts per row-1 run and row-8 put run")
    ap.add_argument("--work-count", type=int, default=40000, help="cycles per row-2 run and row-8 cycle run")
    ap.add_argument("--one-put-count", type=int, default=20000,
                    help="puts per row-6 run (one command at a time)")
    ap.add_argument("--one-cycle-count", type=int, default=10000,
                    help="reserve+delete cycles per row-6 run (one command at a time)")
    ap.add_argument("--latency-count", type=int, default=2000,
                    help="row 9: requests per latency probe (500 with --quick)")
    ap.add_argument("--tube-jobs", type=int, default=5000, help="cycles per row-4 variant")
    ap.add_argument("--timer-jobs", type=int, default=200, help="jobs per row-5 test")
    ap.add_argument("--spacing", type=float, default=10.0, help="row 5: ms between jobs")
    ap.add_argument("--window", type=int, default=2000,
                    help="pipelined put: max outstanding commands per connection")
    ap.add_argument("--gen-procs", type=int, default=1,
                    help="load generator processes for rows 1-3, 6's fill and 8 "
                         "(connections split among them)")
    ap.add_argument("--zstalk", default=DEFAULT_ZSTALK)
    ap.add_argument("--beanstalkd", default="/usr/bin/beanstalkd")
    args = ap.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    rows = {int(x) for x in args.rows.split(",") if x.strip()}
    placement = ("one process" if args.fronts == 0 else
                 f"{args.fronts} front process{'es' if args.fronts > 1 else ''}")

    t_start = time.monotonic()
    meta = dict(started=time.strftime("%Y-%m-%d %H:%M:%S"), argv=sys.argv[1:],
                quick=args.quick, fronts=args.fronts, zstalk_placement=placement,
                repeats=args.repeats,
                window=args.window, gen_procs=args.gen_procs, nproc=os.cpu_count(),
                loadavg_before=os.getloadavg(), python=sys.version.split()[0],
                beanstalkd=subprocess.run([args.beanstalkd, "-v"], capture_output=True,
                                          text=True).stdout.strip(),
                aggregate="best of repetitions (max rate / min time per cycle)")
    try:
        meta["zstalk_commit"] = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
            text=True).stdout.strip()
        meta["zstalk_dirty"] = bool(subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True).stdout.strip())
    except OSError:
        pass
    log(f"bench: beanstalkd ({meta['beanstalkd']}) vs zstalk {meta.get('zstalk_commit', '?')}"
        f"{' (dirty tree)' if meta.get('zstalk_dirty') else ''}, fronts={args.fronts} "
        f"({placement}), "
        f"{'quick' if args.quick else 'full'}, repeats={args.repeats}, rows={sorted(rows)}, "
        f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}")

    bench = Bench(args)
    steps = [(1, "row 1: pipelined put", bench.row_put),
             (2, "row 2: worker cycle", bench.row_work),
             (3, "row 3: memory", bench.row_memory),
             (4, "row 4: reserve across 1000 watched tubes", bench.row_tubes),
             (5, "row 5: timer lateness", bench.row_timers),
             (6, "row 6: one command at a time, 1 connection", bench.row_one),
             (7, "row 7: exec -> first reply", bench.row_exec),
             (8, "row 8: pipelines clients use", bench.row_pipe),
             (9, "row 9: request latency", bench.row_latency)]
    durations = {}
    for num, label, fn in steps:
        if num not in rows:
            continue
        log(f"{label} ...")
        t0 = time.monotonic()
        try:
            fn()
        except Exception as exc:
            bench.notes.append(f"{label}: aborted: {exc!r}")
            log(f"  {label} aborted: {exc!r}")
        durations[label] = time.monotonic() - t0
        log(f"  ({durations[label]:.1f}s)")

    table, _ = build_table(bench.results, args.jobs_for_memory)
    text, md = render(table)
    elapsed = time.monotonic() - t_start
    meta.update(elapsed_s=elapsed, loadavg_after=os.getloadavg(), row_durations_s=durations,
                server_start_s={k: (sum(v) / len(v) if v else None)
                                for k, v in bench.start_times.items()})
    print()
    print(text)
    print()
    print("Markdown:")
    print()
    print(md)
    print()
    if 3 in rows and bench.results.get("memory"):
        mj = bench.results["memory"]["jobs"]
        print(f"memory row used {mj:,} jobs" + ("" if mj == 1000000 else
                                                 " (not 1,000,000)"))
    print(f"throughput figures: best of {args.repeats} run(s), beanstalkd and zstalk runs "
          f"alternated; fresh server per run for rows 1-3, 6, 8 and 9")
    if bench.results.get("latency"):
        print()
        print(latency_table(bench.results["latency"], args.repeats))
        print()
    print(f"zstalk placement: --fronts {args.fronts} ({placement})"
          + ("; row 9 runs --fronts 0 and --fronts 1 whatever --fronts says"
             if 9 in rows else ""))
    print(diagnostics(bench.results))
    errs = []
    for key, d in bench.results.items():
        def walk(x, path):
            if isinstance(x, dict):
                if x.get("errors"):
                    errs.append(f"{path}: {x['errors'][:3]}")
                for k, v in x.items():
                    if k != "errors":
                        walk(v, f"{path}/{k}")
            elif isinstance(x, list):
                for i, v in enumerate(x):
                    walk(v, f"{path}[{i}]")
        walk(d, key)
    if errs or bench.notes:
        print("\nerrors and notes:")
        for e in errs:
            print(f"  {e}")
        for n in bench.notes:
            print("  " + n.replace("\n", "\n    "))
    else:
        print("\nno errors, no server output, no zstalk child restarts")
    print(f"\ntotal time {elapsed:.1f}s (zstalk start {meta['server_start_s']['zstalk'] or 0:.2f}s"
          f" avg, beanstalkd {meta['server_start_s']['beanstalkd'] or 0:.2f}s)")
    if args.json:
        clean = [{k: v for k, v in r.items() if k != "fmt"} for r in table]
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, table=clean, markdown=md, results=bench.results,
                           errors=errs, notes=bench.notes), f, indent=1, default=str)
        print(f"JSON written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
