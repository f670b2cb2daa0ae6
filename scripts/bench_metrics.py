#!/usr/bin/env python3
"""Benchmark a /metrics scrape: how long it takes, and how long it holds the broker's loop.

Usage:
    scripts/bench_metrics.py [--quick | --smoke] [--repeats N] [--warmup N] [--against REF]
        [--tubes N,N] [--scrapes N] [--json PATH]

Target (issue 26): a scrape of 100 tubes must not stall the broker's loop more than 10 ms.

Method (what every row shares is in scripts/harness/__init__.py).  Each run gets a fresh
`zstalk serve -l 127.0.0.1 -p P --counter-port 0 --worker-bind none --health-port H`
(one process: the exposition is rendered on the broker's own loop, between commands).
Set-up, untimed: for each of --tubes (100 and 10,000; quick 100 and 1,000) tubes
`bench-0` ... , two ready jobs and one delayed job each (pipelined on one connection),
and 100 reserved jobs held by a connection that stays open, so every state and the
wait histograms have something in them.  Then, timed:
  * scrape: --scrapes (30) `GET /metrics`, one after the other, each on a new
    connection; its time is from the request's send to the response's last byte.  The
    render runs on the loop, so a scrape's time is an upper bound on the loop stall it
    caused.  The exposition's size is reported too.
  * stall seen by a client: one connection sends `list-tube-used` one at a time for 2 s
    while nothing else runs (quiet), and again for 2 s while scrapes run back to back
    (scraping); the rows are the round trip's p99 and maximum in each period.  The maximum
    while scraping minus the quiet one is the longest a client command waited for a scrape.
The ratio column is scraping / quiet for the round trips.  --against REF runs REF's
zstalk too, in alternation (a REF before /metrics existed answers 404 and its scrape
rows stay empty, with a note).
"""
from __future__ import annotations

import socket
import sys
import threading
import time

from harness.cli import Run, log, parser, sized
from harness.procs import HOST, Proc, free_port, wait_until, zstalk_keep
from harness.stats import Figure, median, pct, rounds
from harness.table import Table
from harness.venv import use_project_venv

TARGET_MS = 10.0
HELD = 100
WINDOW_S = 2.0


def http_get(port: int, path: str = "/metrics") -> tuple[int, bytes, float]:
    """(status, body, seconds from the request's send to the response's end)."""
    with socket.create_connection((HOST, port), timeout=10) as s:
        t0 = time.perf_counter()
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
        data = b""
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            data += chunk
        took = time.perf_counter() - t0
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body, took


def read_lines(s: socket.socket, n: int) -> None:
    got = 0
    buf = b""
    while got < n:
        chunk = s.recv(1 << 16)
        if not chunk:
            raise RuntimeError("the server closed the connection during set-up")
        buf += chunk
        got += chunk.count(b"\r\n")


def fill(port: int, tubes: int) -> socket.socket:
    """Two ready and one delayed job per tube; HELD reserved jobs on the returned socket."""
    with socket.create_connection((HOST, port), timeout=60) as s:
        for start in range(0, tubes, 1000):
            part = range(start, min(tubes, start + 1000))
            s.sendall(b"".join(b"use bench-%d\r\nput 0 0 60 1\r\nx\r\nput 0 0 60 1\r\nx\r\n"
                               b"put 0 3600 60 1\r\nx\r\n" % i for i in part))
            read_lines(s, 4 * len(part))
    holder = socket.create_connection((HOST, port), timeout=60)
    holder.sendall(b"watch bench-0\r\n" + b"reserve-with-timeout 0\r\n" * HELD)
    time.sleep(0.2)
    return holder


def round_trips(port: int, seconds: float) -> list[float]:
    """One command at a time for `seconds`: each round trip, in seconds."""
    out = []
    with socket.create_connection((HOST, port), timeout=10) as s:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end and len(out) < 1_000_000:
            t0 = time.perf_counter()
            s.sendall(b"list-tube-used\r\n")
            got = b""
            while not got.endswith(b"\r\n"):
                got += s.recv(100)
            out.append(time.perf_counter() - t0)
    return out


def scraping(health: int, stop: threading.Event, took: list[float]) -> None:
    while not stop.is_set() and len(took) < 100_000:
        took.append(http_get(health)[2])


def measure(build, tubes: int, scrapes: int, notes: list[str]) -> dict:
    port, health = free_port(), free_port()
    proc = Proc(f"{build.label} serve", [build.exe("zstalk"), "serve", "-l", HOST, "-p", port,
                                         "--counter-port", "0", "--worker-bind", "none",
                                         "--health-port", health, "--health-listen", HOST],
                keep=zstalk_keep)
    try:
        wait_until(lambda: _answers(health), "the health port", [proc])
        if http_get(health)[0] != 200:
            return dict(errors=[], note=f"{build.label}: no /metrics (404)")
        holder = fill(port, tubes)
        try:
            got = [http_get(health) for _ in range(scrapes)]
            took = [t for _, _, t in got]
            quiet = round_trips(port, WINDOW_S)
            stop, during = threading.Event(), []
            scraper = threading.Thread(target=scraping, args=(health, stop, during))
            scraper.start()
            busy = round_trips(port, WINDOW_S)
            stop.set()
            scraper.join(30)
        finally:
            holder.close()
        return dict(scrape_ms=median(took) * 1e3, scrape_max_ms=max(took) * 1e3,
                    kib=len(got[-1][1]) / 1024, quiet_p99_ms=pct(quiet, 99) * 1e3,
                    quiet_max_ms=max(quiet) * 1e3, busy_p99_ms=pct(busy, 99) * 1e3,
                    busy_max_ms=max(busy) * 1e3, scrapes_during=len(during), errors=[])
    finally:
        proc.stop(notes)


def _answers(port: int) -> bool:
    try:
        return http_get(port, "/healthz")[0] == 200
    except OSError:
        return False


def run_all(run: Run, labels: list[str]) -> dict:
    a, results = run.args, {}
    builds = {b.label: b for b in run.builds}
    for tubes in a.tubes:
        for rep, order, warm in rounds(labels, a.repeats, a.warmup):
            for label in order:
                res = measure(builds[label], tubes, a.scrapes, run.notes)
                if res.get("note") and res["note"] not in run.notes:
                    run.notes.append(res["note"])
                log(f"  {label:12} {tubes:6} tubes {'warm-up' if warm else f'rep {rep}'}: "
                    + (f"scrape {res['scrape_ms']:.2f} ms, round trip max "
                       f"{res['quiet_max_ms']:.2f} quiet / {res['busy_max_ms']:.2f} scraping"
                       if "scrape_ms" in res else res.get("note", "")))
                if not warm:
                    results.setdefault(str(tubes), {}).setdefault(label, []).append(res)
    return results


def table(run: Run, results: dict, labels: list[str]) -> Table:
    t = Table("metrics", "A /metrics scrape of `zstalk serve`",
              [(label, label) for label in labels], run.against_ratios(),
              note="Fresh `zstalk serve` per run; tubes with 2 ready + 1 delayed job each, "
                   f"{HELD} reserved; scrapes one after the other; a client's one-at-a-time "
                   f"round trips for {WINDOW_S:g} s quiet, then {WINDOW_S:g} s while scraping.")
    for tubes, per in results.items():
        n = f"{int(tubes):,} tubes"
        fig = lambda key: {label: Figure.of(per.get(label), key) for label in labels}  # noqa: E731
        target = (labels[0], "<=", TARGET_MS, f"<= {TARGET_MS:g} ms") if tubes == "100" else None
        t.add(f"{n}: scrape time, median (ms)", fig("scrape_ms"), fmt="{:.2f}", target=target)
        t.add(f"{n}: scrape time, max (ms)", fig("scrape_max_ms"), fmt="{:.2f}")
        t.add(f"{n}: exposition (KiB)", fig("kib"), fmt="{:,.0f}")
        t.add(f"{n}: client round trip p99, quiet (ms)", fig("quiet_p99_ms"), fmt="{:.3f}")
        t.add(f"{n}: client round trip p99, scraping (ms)", fig("busy_p99_ms"), fmt="{:.3f}")
        t.add(f"{n}: client round trip max, quiet (ms)", fig("quiet_max_ms"), fmt="{:.2f}")
        t.add(f"{n}: client round trip max, scraping (ms)", fig("busy_max_ms"), fmt="{:.2f}")
    return t


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--tubes", default=None, help="tube counts, comma-separated (100,10000)")
    ap.add_argument("--scrapes", type=int, default=None, help="timed scrapes per run (30)")
    args = ap.parse_args(argv)
    sized(args, tubes=("100,10000", "100,1000", "100"), scrapes=(30, 10, 3))
    args.tubes = [int(n) for n in str(args.tubes).split(",")]
    run = Run("bench_metrics", args)
    labels = run.labels()
    results = run_all(run, labels)
    return run.report([table(run, results, labels)], results)


if __name__ == "__main__":
    use_project_venv()
    sys.exit(main())
