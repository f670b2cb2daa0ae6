#!/usr/bin/env python3
"""Side-by-side benchmark of zstalk's counter front against yrmcds 1.1.9 (issue: counter front).

Method. Both servers are started here on loopback (yrmcds with the counter extension on,
`virtual_ip` 127.0.0.1 and `bind_ip` 127.0.0.2 as it needs; zstalk as `zstalk serve
--counter-port`). The load is pre-built byte streams of Acquire 1/1000 + Release 1 pairs
on a name per connection, so the generator only sends bytes and counts response headers:
  * serial: one connection, one pair at a time (send Acquire, read, send Release, read);
  * pipelined: one connection, pairs sent in windows of WINDOW pairs;
  * 8 connections pipelined, one process per connection (so the generator is not the limit).
Each row runs for both servers alternately, best of --repeats, and prints pairs/s and
the ratio zstalk/yrmcds (target >= 0.5x on every row; yrmcds is multi-threaded C).
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

HEADER = 12
WINDOW = 500
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def frame(opcode: int, body: bytes, opaque: int = 0) -> bytes:
    return struct.pack(">BBBBII", 0x90, opcode, 0, 0, len(body), opaque) + body


def acquire_frame(name: bytes) -> bytes:
    return frame(0x02, struct.pack(">IIH", 1, 1000, len(name)) + name)


def release_frame(name: bytes) -> bytes:
    return frame(0x03, struct.pack(">IH", 1, len(name)) + name)


def pair(name: bytes) -> bytes:
    return acquire_frame(name) + release_frame(name)


def read_responses(sock: socket.socket, count: int, buf: bytearray) -> None:
    """Read `count` whole responses (header + body), failing on a non-zero status."""
    while count:
        while len(buf) < HEADER:
            buf += sock.recv(1 << 20) or _closed()
        length = struct.unpack_from(">I", buf, 4)[0]
        while len(buf) < HEADER + length:
            buf += sock.recv(1 << 20) or _closed()
        if buf[2] != 0:
            raise RuntimeError(f"status {buf[2]:#x} from the server")
        del buf[:HEADER + length]
        count -= 1


def _closed() -> bytes:
    raise RuntimeError("server closed the connection")


def noop_answers(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=1) as s:
            s.sendall(frame(0x00, b""))
            read_responses(s, 1, bytearray())
            return True
    except (OSError, RuntimeError):
        return False


# -- servers -------------------------------------------------------------------------------
class Server:
    def __init__(self, name: str, argv: list[str], port: int, workdir: str) -> None:
        self.name, self.argv, self.port, self.workdir = name, argv, port, workdir
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Server":
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 20
        while not noop_answers(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start: {' '.join(self.argv)}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def yrmcds(workdir: str) -> Server:
    port, memcache_port = free_port(), free_port()
    conf = os.path.join(workdir, "yrmcds.conf")
    with open(conf, "w") as f:
        f.write(f"""user = ""
group = ""
virtual_ip = "127.0.0.1"
bind_ip = "127.0.0.2"
port = {memcache_port}
repl_port = {free_port()}
max_connections = 0
temp_dir = "{workdir}"
log.threshold = "error"
log.file = "{workdir}/yrmcds.log"
buckets = 10000
max_data_size = "1M"
heap_data_limit = "256K"
memory_limit = "64M"
workers = 8
gc_interval = 10
counter.enable = true
counter.port = {port}
counter.max_connections = 0
counter.buckets = 10000
counter.stat_interval = 86400
""")
    binary = shutil.which("yrmcdsd") or "/usr/sbin/yrmcdsd"
    return Server("yrmcds", [binary, "-f", conf], port, workdir)


def zstalk(workdir: str) -> Server:
    port = free_port()
    exe = os.path.join(ROOT, ".venv", "bin", "zstalk")
    argv = [exe if os.path.exists(exe) else "zstalk", "serve", "-l", "127.0.0.1",
            "-p", str(free_port()), "--counter-port", str(port)]
    return Server("zstalk", argv, port, workdir)


# -- load ----------------------------------------------------------------------------------
def serial(port: int, pairs: int) -> float:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        acquire, release = acquire_frame(b"serial"), release_frame(b"serial")
        buf = bytearray()
        t0 = time.perf_counter()
        for _ in range(pairs):
            s.sendall(acquire)
            read_responses(s, 1, buf)
            s.sendall(release)
            read_responses(s, 1, buf)
        return pairs / (time.perf_counter() - t0)


def pipelined(port: int, pairs: int, name: bytes = b"pipe") -> float:
    with socket.create_connection(("127.0.0.1", port)) as s:
        window = pair(name) * WINDOW
        buf = bytearray()
        t0 = time.perf_counter()
        for _ in range(pairs // WINDOW):
            s.sendall(window)
            read_responses(s, 2 * WINDOW, buf)
        return (pairs // WINDOW) * WINDOW / (time.perf_counter() - t0)


def _worker(args) -> tuple[float, float]:
    port, pairs, index, start_at = args
    while time.time() < start_at:
        time.sleep(0.001)
    t0 = time.time()
    pipelined(port, pairs, b"conn%d" % index)
    return t0, time.time()


def many(port: int, pairs: int, conns: int = 8) -> float:
    start_at = time.time() + 0.3
    with multiprocessing.Pool(conns) as pool:
        spans = pool.map(_worker, [(port, pairs, i, start_at) for i in range(conns)])
    first, last = min(a for a, _ in spans), max(b for _, b in spans)
    return conns * (pairs // WINDOW) * WINDOW / (last - first)


# -- main ----------------------------------------------------------------------------------
ROWS = [("acquire+release, 1 connection, one at a time (pairs/s)", serial, "serial"),
        ("acquire+release, 1 connection pipelined (pairs/s)", pipelined, "pipelined"),
        ("acquire+release, 8 connections pipelined (pairs/s)", many, "many")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=20000, help="pairs per connection and row")
    ap.add_argument("--serial-pairs", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.pairs, args.serial_pairs, args.repeats = 5000, 1000, 1
    best: dict[tuple[str, str], float] = {}
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-counter-") as tmp:
        for rep in range(args.repeats):
            order = [yrmcds, zstalk] if rep % 2 == 0 else [zstalk, yrmcds]
            for make in order:
                server = make(tmp).start()
                try:
                    for label, fn, key in ROWS:
                        n = args.serial_pairs if key == "serial" else args.pairs
                        rate = fn(server.port, n)
                        print(f"  {server.name:7} rep {rep} {key:9} {rate:12,.0f} pairs/s", flush=True)
                        best[(server.name, key)] = max(best.get((server.name, key), 0.0), rate)
                finally:
                    server.stop()
    print("\n| metric | yrmcds | zstalk | zstalk/yrmcds | target | result |")
    print("|---|---:|---:|---:|---|---|")
    for label, _, key in ROWS:
        y, z = best[("yrmcds", key)], best[("zstalk", key)]
        ratio = z / y
        print(f"| {label} | {y:,.0f} | {z:,.0f} | {ratio:.2f}x | >= 0.5x | "
              f"{'PASS' if ratio >= 0.5 else 'MISS'} |")
    print(f"\nbest of {args.repeats} alternated runs; total {time.monotonic() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
