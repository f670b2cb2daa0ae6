#!/usr/bin/env python3
"""Side-by-side benchmark of zstalk's counter front against yrmcds 1.1.9 (issue: counter front).

Usage:
    scripts/bench_counter.py [--quick | --smoke] [--repeats N] [--warmup N] [--against REF]
        [--pairs N] [--serial-pairs N] [--json PATH]

Method (what every row shares is in scripts/harness/__init__.py).  Both servers are
started on loopback: yrmcds with the counter extension on (`virtual_ip` 127.0.0.1 and
`bind_ip` 127.0.0.2 as it needs), zstalk as `zstalk serve --counter-port` (the counter
front in the broker's process; its beanstalk port and worker endpoint on free ports
too).  Each repetition (9 by default, --repeats, after 1 warm-up round) starts every
system once, fresh, in alternated order, and runs the loads on it in turn.  The load is
pre-built byte streams of Acquire 1/1000 + Release 1 pairs on a name per connection, so
the generator only sends bytes and counts response headers:
  * serial: one connection, one pair at a time (send Acquire, read its response, send
    Release, read its response), --serial-pairs (5,000) pairs, by the minimal client
    (scripts/harness/minimal.py --kind counter): a process of its own, one blocking socket
    (kernel read timeouts, no poll), one sendall() per request and recv_into() until the
    response's 12-byte header and body are in, its status checked; 1,000 requests of
    warm-up (500 pairs), then the timed part, the server's CPU read around it alone.
    Beside the systems, in the same alternation, two more runs of this row only: the
    generator ceiling, the benchmark's own in-process loop (serial() below: a socket with a
    15 s Python timeout, read_responses) on yrmcds after the same warm-up, held against the
    minimal client on yrmcds (under 0.9x of it: marked generator-bound, not a result;
    scripts/harness/ceiling.py); and the floor, the minimal client on
    scripts/harness/floor_server.py --protocol counter (this tree's python and uvloop: a
    bare asyncio.Protocol answering every frame with status 0, its opcode and opaque, and
    a 4-byte count for Acquire), with each zstalk column's median / the floor's;
  * pipelined: one connection, --pairs (20,000) pairs sent in windows of WINDOW pairs;
  * 8 connections pipelined, --pairs each, one process per connection (so the generator
    is not the limit), started together at a shared instant.
Rates are pairs/s, with the ratio zstalk/yrmcds (targets: one at a time >= 1.0x, the
pipelined rows >= 0.5x; yrmcds is multi-threaded C); each load also gives the server's
CPU-seconds per 1,000 pairs.  The table's note gives the range of the 1-minute load
average at the end of the runs.
"""
from __future__ import annotations

import multiprocessing
import os
import shutil
import socket
import struct
import sys
import tempfile
import time

from harness.ceiling import ceiling_said
from harness.cli import Run, log, parser, sized
from harness.floor_server import floor
from harness.machine import load_range
from harness.minimal import drive
from harness.procs import HOST, Proc, free_port, wait_until, zstalk_keep
from harness.stats import Figure, per_1k, rounds
from harness.table import Table
from harness.venv import use_project_venv

HEADER = 12
WINDOW = 500
REFERENCE = "yrmcds"
IN_PROCESS = f"{REFERENCE} · in-process loop"      # the generator ceiling's run
FLOOR = "floor"
WARMUP = 1000               # requests (500 pairs) before a serial run's timed part
SERIAL_CAP_S = 60.0


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


def noop_answers(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1) as s:
            s.sendall(frame(0x00, b""))
            read_responses(s, 1, bytearray())
            return True
    except (OSError, RuntimeError):
        return False


# -- servers -------------------------------------------------------------------------------
YRMCDS_CONF = """user = ""
group = ""
virtual_ip = "127.0.0.1"
bind_ip = "127.0.0.2"
port = {memcache_port}
repl_port = {repl_port}
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
"""


def start(name: str, run: Run, workdir: str) -> tuple[Proc, int]:
    """A fresh server of system `name`, answering on its counter port."""
    port = free_port()
    if name == FLOOR:
        argv = floor(run.builds[0].python, port, "counter")
    elif name in (REFERENCE, IN_PROCESS):
        conf = os.path.join(workdir, "yrmcds.conf")
        with open(conf, "w") as f:
            f.write(YRMCDS_CONF.format(memcache_port=free_port(), repl_port=free_port(),
                                       workdir=workdir, port=port))
        argv = [shutil.which("yrmcdsd") or "/usr/sbin/yrmcdsd", "-f", conf]
    else:
        build = next(b for b in run.builds if b.label == name)
        argv = [build.exe("zstalk"), "serve", "-l", HOST, "-p", free_port(),
                "--counter-port", port, "--worker-bind", f"tcp://{HOST}:{free_port()}"]
    proc = Proc(name, argv, keep=zstalk_keep)
    wait_until(lambda: noop_answers(port), name, [proc], cap_s=20.0)
    return proc, port


# -- load ----------------------------------------------------------------------------------
def serial(port: int, pairs: int) -> int:
    with socket.create_connection((HOST, port), timeout=15) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        acquire, release = acquire_frame(b"serial"), release_frame(b"serial")
        buf = bytearray()
        for _ in range(pairs):
            s.sendall(acquire)
            read_responses(s, 1, buf)
            s.sendall(release)
            read_responses(s, 1, buf)
        return pairs


def pipelined(port: int, pairs: int, name: bytes = b"pipe") -> int:
    with socket.create_connection((HOST, port), timeout=15) as s:
        window = pair(name) * WINDOW
        buf = bytearray()
        for _ in range(pairs // WINDOW):
            s.sendall(window)
            read_responses(s, 2 * WINDOW, buf)
        return (pairs // WINDOW) * WINDOW


def _conn_main(pipe, port: int, pairs: int, index: int, start_at: float) -> None:
    """One connection of the 8-connection row, in a forked process of its own."""
    try:
        while time.time() < start_at:
            time.sleep(0.001)
        t0 = time.time()
        pipelined(port, pairs, b"conn%d" % index)
        pipe.send((t0, time.time()))
    except BaseException as exc:          # report, never leave the parent waiting
        pipe.send(repr(exc))


def many(port: int, pairs: int, conns: int = 8) -> tuple[int, float]:
    """(pairs done, seconds from the first connection's start to the last one's end)."""
    ctx = multiprocessing.get_context("fork")
    start_at = time.time() + 0.3
    kids = []
    for i in range(conns):
        mine, theirs = ctx.Pipe()
        p = ctx.Process(target=_conn_main, args=(theirs, port, pairs, i, start_at))
        p.start()
        kids.append((p, mine))
    spans = []
    try:
        for p, mine in kids:
            if not mine.poll(60):
                raise RuntimeError("a connection's process did not report within 60 s")
            spans.append(mine.recv())
    finally:
        for p, _ in kids:
            p.join(5)
            if p.is_alive():
                p.kill()
    bad = [s for s in spans if isinstance(s, str)]
    if bad:
        raise RuntimeError(f"connections failed: {bad[:3]}")
    first, last = min(a for a, _ in spans), max(b for _, b in spans)
    return conns * (pairs // WINDOW) * WINDOW, last - first


def one_at_a_time(proc: Proc, port: int, pairs: int) -> dict:
    """The serial row: the minimal client in a process of its own, after its warm-up."""
    return drive((HOST, port), "counter", pairs, warmup=WARMUP, cap_s=SERIAL_CAP_S,
                 server=proc)


def in_process(proc: Proc, port: int, pairs: int) -> dict:
    """The generator ceiling: serial() in this process, after the same warm-up."""
    serial(port, WARMUP // 2)
    return measure(proc, port, serial, pairs)


def timed(fn):
    return lambda proc, port, pairs: measure(proc, port, fn, pairs)


ROWS = [("serial", "acquire+release, 1 connection, one at a time (pairs/s)", one_at_a_time,
         1.0),
        ("pipelined", "acquire+release, 1 connection pipelined (pairs/s)", timed(pipelined),
         0.5),
        ("many", "acquire+release, 8 connections pipelined (pairs/s)", timed(many), 0.5)]
#: the runs beside the systems, of the serial row only
BESIDE = {IN_PROCESS: in_process, FLOOR: one_at_a_time}


def measure(proc: Proc, port: int, fn, pairs: int) -> dict:
    c0, t0 = proc.cpu_s(), time.perf_counter()
    out = fn(port, pairs)
    wall = time.perf_counter() - t0
    done, span = out if isinstance(out, tuple) else (out, wall)
    used = proc.cpu_s() - c0
    return dict(rate=done / span, pairs=done, cpu_per_1k=per_1k(used, done),
                server_cpu_share=used / wall, errors=[])


def loads(name: str) -> list[tuple]:
    """(row key, the load) that a run of `name` makes."""
    if name in BESIDE:
        return [("serial", BESIDE[name])]
    return [(key, fn) for key, _, fn, _ in ROWS]


def run_all(run: Run, systems: list[str]) -> dict:
    a = run.args
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-counter-") as tmp:
        for rep, order, warm in rounds(systems + list(BESIDE), a.repeats, a.warmup):
            for name in order:
                proc, port = start(name, run, tmp)
                try:
                    for key, fn in loads(name):
                        n = a.serial_pairs if key == "serial" else a.pairs
                        try:
                            res = fn(proc, port, n)
                        except Exception as exc:
                            res = dict(rate=None, errors=[repr(exc)])
                        res["load1"] = round(os.getloadavg()[0], 2)
                        log(f"  {name:24} {'warm-up' if warm else f'rep {rep}'} {key:9} "
                            + (f"{res['rate']:12,.0f} pairs/s" if res["rate"] else
                               f"ERROR {res['errors']}"))
                        if not warm:
                            results.setdefault(key, {}).setdefault(name, []).append(res)
                finally:
                    proc.stop(run.notes)
    return results


def table(run: Run, results: dict, systems: list[str]) -> Table:
    span = load_range(results)
    t = Table("counter", "Counters against yrmcds 1.1.9",
              [(s, s) for s in systems],
              [(b, REFERENCE, f"{b}/{REFERENCE}") for b in run.labels()] + run.against_ratios(),
              note="Acquire 1 + Release 1 pairs; `zstalk serve` with the counter front in the "
                   "broker's process against yrmcds (multi-threaded C) with its counter "
                   "extension; a fresh server per repetition; one at a time, the minimal "
                   "client (a process of its own)."
                   + (f" Load average (1 min) at the end of the runs: {span}." if span else ""))
    for key, label, _, goal in ROWS:
        per = results.get(key, {})
        t.add(label, {s: Figure.of(per.get(s), "rate") for s in systems},
              target=(f"zstalk/{REFERENCE}", ">=", goal))
        t.add("  server CPU-s per 1,000 pairs",
              {s: Figure.of(per.get(s), "cpu_per_1k") for s in systems}, fmt="{:.4g}")
        if key == "serial":
            bounds(t, per, systems)
    return t


def bounds(t: Table, per: dict, systems: list[str]) -> None:
    """The serial row's generator ceiling and floor, and each zstalk's share of the floor."""
    loop = Figure.of(per.get(IN_PROCESS), "rate")
    t.add("  generator ceiling: the benchmark's in-process loop (pairs/s)", {REFERENCE: loop},
          result=ceiling_said(loop.median, Figure.of(per.get(REFERENCE), "rate").median))
    base = Figure.of(per.get(FLOOR), "rate")
    t.add("  floor: the minimal client on bare uvloop, canned replies (pairs/s)",
          {systems[1]: base}, ratio=False)
    shares = {s: Figure.of(per.get(s), "rate").median for s in systems[1:]}
    t.add("  zstalk / the floor (x, of medians)",
          {s: [v / base.median] if v and base.median else [] for s, v in shares.items()},
          fmt="{:.2f}", ratio=False)


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--pairs", type=int, default=None,
                    help="pairs per connection, pipelined rows (20,000)")
    ap.add_argument("--serial-pairs", type=int, default=None, help="serial row (5,000)")
    args = ap.parse_args(argv)
    sized(args, repeats=(9, 1, 1), pairs=(20000, 5000, 1000), serial_pairs=(5000, 1000, 300))
    run = Run("bench_counter", args)
    systems = [REFERENCE] + run.labels()
    results = run_all(run, systems)
    return run.report([table(run, results, systems)], results)


if __name__ == "__main__":
    use_project_venv()
    sys.exit(main())
