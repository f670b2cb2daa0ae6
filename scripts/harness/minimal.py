# The minimal client: what a worker's client does and nothing more, so that a row it drives
# measures the server, not the client.  One blocking socket per connection (TCP_NODELAY; a
# read or write that waits 15 s in the kernel fails, SO_RCVTIMEO / SO_SNDTIMEO, because a
# Python socket timeout would make every read a failed recv, a poll() and a recv again); a
# step's commands go out in one sendall() of pre-built bytes and its replies are read with
# recv_into() into one buffer made at the start, until the last reply's CRLF (plus the body
# for RESERVED, the 12-byte header plus body for a counter response); no selector, no
# thread.  It runs as a process of its own (`python scripts/harness/minimal.py`,
# started by drive() below), so nothing of the benchmark's process (its heap, its collector, its
# other work) stands in its way:
#
#   1. it connects its --conns connections and runs --warmup commands (1,000), untimed;
#   2. writes "ready" on stdout and waits for a line on stdin;
#   3. runs --count operations and writes one JSON line: count, wall, rate, its own CPU
#      share (process_time / wall; 1.0 = one core), capped, errors.
#
# Operations (--kind): put (`put 0 0 60 100` + body -> `INSERTED <id>`); cycle (`reserve` ->
# `RESERVED <id> 100` + body, the body checked, then `delete <id>` -> `DELETED`); counter
# (yrmcds Acquire 1 of 1000 -> a status-0 response, then Release 1 -> the same, on one
# name).  --batch B sends B commands of a step in one write and reads all B replies before
# the next step (B = 1: one command at a time); a cycle's batch is B reserves, then the B
# deletes of the jobs they gave.  With several connections the connections take turns
# (round-robin, in a fixed order): each one's next step is sent as soon as its replies are
# read, so every connection keeps its command (or batch) in flight the whole time, as a pool
# of blocking workers keeps a server busy, and the replies of the others wait in their
# sockets meanwhile.  --client greenstalk runs put or cycle through greenstalk itself (one
# connection, one command at a time; greenstalk.Client with encoding=None): what its users
# see.  Every loop is bounded by its count and by --cap seconds (then "capped"); drive()
# kills a client that has not answered --cap + 30 s after it was told to go.
from __future__ import annotations

import argparse
import json
import os
import select
import socket
import struct
import subprocess
import sys
import tempfile
import time

BODY_LEN = 100
BODY = (b"0123456789abcdefghijklmnopqrstuvwxyz" * 3)[:BODY_LEN]    # loadgen's body
PUT_CMD = b"put 0 0 60 %d\r\n" % BODY_LEN + BODY + b"\r\n"
RESERVE = b"reserve\r\n"
DELETED = b"DELETED\r\n"
COUNTER_NAME = b"serial"
ACQUIRE = struct.pack(">BBBBIIIIH", 0x90, 0x02, 0, 0, 10 + len(COUNTER_NAME), 0, 1, 1000,
                      len(COUNTER_NAME)) + COUNTER_NAME
RELEASE = struct.pack(">BBBBIIIH", 0x90, 0x03, 0, 0, 6 + len(COUNTER_NAME), 0, 1,
                      len(COUNTER_NAME)) + COUNTER_NAME
BUF_SIZE = 1 << 16
STALL_S = 15            # a read or write that waits this long fails the run
#: commands per operation: a put is one, a cycle (reserve, delete) and a pair two
COMMANDS = {"put": 1, "cycle": 2, "counter": 2}


class Unexpected(Exception):
    """A reply that is not the one the operation expects."""


def blocking_socket(addr) -> socket.socket:
    """A blocking connection whose reads and writes give up after STALL_S in the kernel
    (SO_RCVTIMEO / SO_SNDTIMEO): a Python socket timeout would poll() before every recv."""
    sock = socket.create_connection(addr)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    stall = struct.pack("ll", STALL_S, 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, stall)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, stall)
    return sock


class Conn:
    """One blocking connection, its buffer, and where it is in its operation."""
    __slots__ = ("sock", "recv_into", "buf", "view", "quota", "done", "step", "batch", "ids")

    def __init__(self, addr, quota: int) -> None:
        self.sock = blocking_socket(addr)
        self.recv_into = self.sock.recv_into
        self.buf = bytearray(BUF_SIZE)
        self.view = memoryview(self.buf)
        self.quota, self.done, self.step, self.batch, self.ids = quota, 0, 0, 0, []

    def fill(self, k: int) -> int:
        """Receive after the k bytes in hand; how many are in hand now."""
        if k >= BUF_SIZE:
            raise Unexpected(f"more than {BUF_SIZE} bytes of replies")
        got = self.recv_into(self.view[k:])
        if not got:
            raise EOFError("the server closed the connection")
        return k + got


# --------------------------------------------------------------------------- replies

def read_lines(c: Conn, n: int, word: bytes) -> None:
    """n one-line replies, each beginning with `word`."""
    buf, k, lines = c.buf, 0, 0
    while lines < n:
        k2 = c.fill(k)
        lines += buf.count(b"\n", k, k2)
        k = k2
    if lines != n or buf[k - 1] != 10 or buf.count(word, 0, k) != n:
        raise Unexpected(f"expected {n} x {word!r}, got {bytes(buf[:min(k, 80)])!r}")


def read_deleted(c: Conn, n: int) -> None:
    read_lines(c, n, DELETED)


def read_inserted(c: Conn, n: int) -> None:
    read_lines(c, n, b"INSERTED ")


def read_reserved(c: Conn, n: int) -> None:
    """n `RESERVED <id> <bytes>` replies, each with its body (checked); their ids to c.ids."""
    buf, ids, pos, k = c.buf, [], 0, 0
    while len(ids) < n:
        i = buf.find(b"\r\n", pos, k)
        if i < 0:
            k = c.fill(k)
            continue
        if not buf.startswith(b"RESERVED ", pos):
            raise Unexpected(f"expected RESERVED, got {bytes(buf[pos:i][:80])!r}")
        jid, nbytes = bytes(buf[pos + 9:i]).split(b" ")
        end = i + 4 + int(nbytes)
        while k < end:
            k = c.fill(k)
        if buf[i + 2:end - 2] != BODY or buf[end - 2:end] != b"\r\n":
            raise Unexpected(f"job {jid!r}: a wrong body")
        ids.append(jid)
        pos = end
    if k != pos:
        raise Unexpected(f"{k - pos} bytes after {n} RESERVED replies")
    c.ids = ids


def read_frames(c: Conn, n: int) -> None:
    """n counter responses (magic 0x91, status 0), each a 12-byte header and its body."""
    buf, pos, k = c.buf, 0, 0
    for _ in range(n):
        while k < pos + 12:
            k = c.fill(k)
        end = pos + 12 + int.from_bytes(buf[pos + 4:pos + 8], "big")
        while k < end:
            k = c.fill(k)
        if buf[pos] != 0x91 or buf[pos + 2] != 0:
            raise Unexpected(f"counter response {bytes(buf[pos:pos + 12]).hex()}")
        pos = end
    if k != pos:
        raise Unexpected(f"{k - pos} bytes after {n} counter responses")


#: kind -> its steps, each (the step's commands for a batch of b, the reader of b replies)
STEPS = {
    "put": [(lambda c, b: PUT_CMD * b, read_inserted)],
    "cycle": [(lambda c, b: RESERVE * b, read_reserved),
              (lambda c, b: b"".join(b"delete %s\r\n" % j for j in c.ids), read_deleted)],
    "counter": [(lambda c, b: ACQUIRE * b, read_frames),
                (lambda c, b: RELEASE * b, read_frames)],
}


# --------------------------------------------------------------------------- the loop

def split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def turns(conns: list[Conn], kind: str, batch: int, cap_s: float) -> dict:
    """Every connection's quota of operations, the connections taking turns; what got done."""
    steps, errors, capped = STEPS[kind], [], False
    last = len(steps) - 1
    live = [c for c in conns if c.quota]
    for c in live:
        c.done, c.step, c.batch = 0, 0, min(batch, c.quota)
        c.sock.sendall(steps[0][0](c, c.batch))
    cpu0, t0 = time.process_time(), time.monotonic()
    deadline, turn = t0 + cap_s, 0
    try:
        while live:
            turn += 1
            if turn & 63 == 0 and time.monotonic() >= deadline:
                capped = True
                break
            finished = False
            for c in live:
                steps[c.step][1](c, c.batch)
                if c.step < last:
                    c.step += 1
                else:
                    c.done += c.batch
                    c.step, c.batch = 0, min(batch, c.quota - c.done)
                    if not c.batch:
                        finished = True
                        continue
                c.sock.sendall(steps[c.step][0](c, c.batch))
            if finished:
                live = [c for c in live if c.batch]
    except (OSError, EOFError, ValueError, Unexpected) as exc:
        errors.append(f"after {sum(c.done for c in conns)} {kind}s: {exc!r}")
    return outcome(sum(c.done for c in conns), t0, cpu0, capped, errors)


# One connection, one command at a time: each kind's loop written out, nothing in between.

def reply_line(c: Conn) -> int:
    """Receive one line's reply (to its \\n) into c.buf; its length."""
    buf, view, recv_into = c.buf, c.view, c.recv_into
    k = recv_into(buf)
    while not k or buf[k - 1] != 10:
        got = recv_into(view[k:])
        if not got:
            raise EOFError("the server closed the connection")
        k += got
    return k


def serial_put(c: Conn, n: int, deadline: float) -> tuple[int, bool]:
    send, buf, line = c.sock.sendall, c.buf, reply_line
    for i in range(n):
        if i & 63 == 63 and time.monotonic() >= deadline:
            return i, True
        send(PUT_CMD)
        k = line(c)
        if not buf.startswith(b"INSERTED ") or buf.find(b"\n", 0, k) != k - 1:
            raise Unexpected(f"expected INSERTED, got {bytes(buf[:min(k, 80)])!r}")
    return n, False


def serial_cycle(c: Conn, n: int, deadline: float) -> tuple[int, bool]:
    send, buf, line = c.sock.sendall, c.buf, reply_line
    for i in range(n):
        if i & 63 == 63 and time.monotonic() >= deadline:
            return i, True
        send(RESERVE)
        read_reserved(c, 1)
        send(b"delete %s\r\n" % c.ids[0])
        if line(c) != 9 or not buf.startswith(DELETED):
            raise Unexpected(f"expected DELETED, got {bytes(buf[:80])!r}")
    return n, False


def serial_counter(c: Conn, n: int, deadline: float) -> tuple[int, bool]:
    send = c.sock.sendall
    for i in range(n):
        if i & 63 == 63 and time.monotonic() >= deadline:
            return i, True
        send(ACQUIRE)
        read_frames(c, 1)
        send(RELEASE)
        read_frames(c, 1)
    return n, False


SERIAL = {"put": serial_put, "cycle": serial_cycle, "counter": serial_counter}


def one_by_one(c: Conn, kind: str, n: int, cap_s: float) -> dict:
    """turns() for one connection and one command at a time."""
    errors, capped, done = [], False, 0
    cpu0, t0 = time.process_time(), time.monotonic()
    try:
        done, capped = SERIAL[kind](c, n, t0 + cap_s)
    except (OSError, EOFError, ValueError, Unexpected) as exc:
        errors.append(f"in {kind}s: {exc!r}")
    return outcome(done, t0, cpu0, capped, errors)


def outcome(done: int, t0: float, cpu0: float, capped: bool, errors: list) -> dict:
    wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
    return dict(count=done, wall=wall, rate=done / wall if wall > 0 else 0.0,
                gen_cpu_share=cpu / wall if wall > 0 else 0.0, capped=capped, errors=errors)


def greenstalk_turns(client, kind: str, n: int, cap_s: float) -> dict:
    """n puts or reserve -> delete cycles through greenstalk, one command at a time."""
    errors, done, capped = [], 0, False
    cpu0, t0 = time.process_time(), time.monotonic()
    deadline = t0 + cap_s
    try:
        for i in range(n):
            if i & 63 == 63 and time.monotonic() >= deadline:
                capped = True
                break
            if kind == "put":
                client.put(BODY, priority=0, delay=0, ttr=60)
            else:
                job = client.reserve()
                if job.body != BODY:
                    raise Unexpected(f"job {job.id}: a wrong body")
                client.delete(job)
            done += 1
    except Exception as exc:        # greenstalk's errors, a socket's, a wrong body
        errors.append(f"after {done} {kind}s: {exc!r}")
    return outcome(done, t0, cpu0, capped, errors)


# --------------------------------------------------------------------------- the process

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="the minimal client (see its module comment)")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--kind", choices=sorted(STEPS), required=True)
    ap.add_argument("--count", type=int, required=True, help="operations, timed")
    ap.add_argument("--conns", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1000, help="commands, untimed")
    ap.add_argument("--cap", type=float, default=30.0, help="seconds, each of warm-up and run")
    ap.add_argument("--client", choices=("minimal", "greenstalk"), default="minimal")
    a = ap.parse_args(argv)
    addr = (a.host, a.port)
    warm_ops = a.warmup // COMMANDS[a.kind]
    if a.client == "greenstalk":
        import greenstalk
        client = greenstalk.Client(addr, encoding=None)
        warm = greenstalk_turns(client, a.kind, warm_ops, a.cap)
        res = handshake(warm) or greenstalk_turns(client, a.kind, a.count, a.cap)
        client.close()
    else:
        conns = [Conn(addr, q) for q in split(warm_ops, a.conns)]
        run = (lambda: one_by_one(conns[0], a.kind, conns[0].quota, a.cap)) \
            if a.conns == 1 and a.batch == 1 else (lambda: turns(conns, a.kind, a.batch, a.cap))
        warm = run()
        for c, q in zip(conns, split(a.count, a.conns)):
            c.quota = q
        res = handshake(warm) or run()
        for c in conns:
            c.sock.close()
    res["warm_count"] = warm["count"]
    print(json.dumps(res), flush=True)
    return 0


def handshake(warm: dict) -> dict | None:
    """Say "ready" and wait for the word to go; the warm-up's result instead when it failed."""
    if warm["errors"]:
        return dict(warm, count=0, rate=None, errors=[f"warm-up: {e}" for e in warm["errors"]])
    print("ready", flush=True)
    sys.stdin.readline()
    return None


# --------------------------------------------------------------------------- the benchmark's side

def drive(addr, kind: str, count: int, *, conns: int = 1, batch: int = 1,
          client: str = "minimal", warmup: int = 1000, cap_s: float = 30.0, server=None,
          python: str = sys.executable) -> dict:
    """Run the minimal client (or greenstalk) in a process of its own against `addr`; its
    result, with the server's CPU over the timed part when `server` (.cpu_s()) is given."""
    from .procs import _die_with_parent
    argv = [python, os.path.abspath(__file__), "--host", addr[0], "--port", str(addr[1]),
            "--kind", kind, "--count", str(count), "--conns", str(conns), "--batch",
            str(batch), "--warmup", str(warmup), "--cap", str(cap_s), "--client", client]
    err = tempfile.TemporaryFile()
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                         preexec_fn=_die_with_parent)
    try:
        first = _line(p, cap_s + 30.0)
        if first != "ready":
            return _failed(first, err)
        c0, w0 = (server.cpu_s() if server else 0.0), time.monotonic()
        p.stdin.write(b"go\n")
        p.stdin.flush()
        res = json.loads(_line(p, cap_s + 30.0) or "null") or _failed("", err)
        if server is not None:
            used = server.cpu_s() - c0
            res.update(server_cpu_share=used / (time.monotonic() - w0),
                       cpu_per_1k=used / res["count"] * 1000.0 if res["count"] else None)
        return res
    finally:
        try:
            p.wait(2)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
        err.close()


def _line(p: subprocess.Popen, timeout_s: float) -> str:
    """The child's next line on stdout ("" when none came within timeout_s or it exited)."""
    ready, _, _ = select.select([p.stdout], [], [], timeout_s)
    return p.stdout.readline().decode().strip() if ready else ""


def _failed(line: str, err) -> dict:
    """The result of a child that did not get ready, with what it said."""
    if line.startswith("{"):
        return json.loads(line)
    err.seek(0)
    said = err.read().decode(errors="replace").strip()[-300:]
    return dict(count=0, rate=None, errors=[f"client process: {line or 'no answer'} {said}"])


if __name__ == "__main__":
    sys.exit(main())
