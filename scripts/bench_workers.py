#!/usr/bin/env python3
"""End-to-end jobs/s with workers: zstalk native workers against greenstalk on beanstalkd.

Usage:
    .venv/bin/python scripts/bench_workers.py [--quick] [--workers 1,4] [--jobs N]
        [--repeats N] [--concurrency C] [--prefetch P] [--handler sync|async]
        [--window N] [--batch N] [--time-cap S] [--sides beanstalkd,zstalk] [--json PATH]

Method
------
One row per worker process count W (--workers, default 1 and 4).  A run is 1 producer +
W worker processes + the server, all on 127.0.0.1, and measures J jobs (--jobs, default
50,000; 100-byte bodies, tube "bench", pri 0, delay 0, TTR 60 s) going put -> handled ->
deleted.  Both sides run the same trivial handler, `len(job.body)`, on bodies handed over
as bytes (greenstalk with encoding=None, zstalk with the raw codec).

* beanstalkd: `beanstalkd -l 127.0.0.1 -p PORT` (no binlog).  Each worker process runs
  `greenstalk.Client((HOST, PORT), encoding=None, watch="bench")` in the loop
  `job = c.reserve(); handle(job); c.delete(job)`: one connection per process, which is
  how greenstalk is run.  The producer writes on a raw socket after `use bench`:
  with --producer batch (the default) --batch = 100 puts at once, then reads their 100
  replies, and again, which is what zstalk's put_many does below, so both producers have
  the same puts outstanding at every moment; with --producer window it is
  bench_beanstalk's pipelined put loop instead (at most --window = 100 outstanding, a
  continuous stream zstalk's synchronous Client has no equivalent of).  A greenstalk
  producer would wait for each put's reply: slower than either.
* zstalk: the broker actor alone, `python -m zstalk.broker.run broker --bind
  tcp://127.0.0.1:PORT`; native workers and the producer speak ZeroMQ to it, no TCP
  front.  Each worker process runs `zstalk.workers.Worker(broker=EP,
  concurrency=--concurrency, prefetch=--prefetch)` with the handler on tube "bench",
  `w.run()`.  The producer is `zstalk.workers.Client(EP).put_many([body] * 100, ...)`:
  one round trip per batch of --batch = 100, the same 100 jobs in flight as beanstalkd's
  window.
  The README row uses this script's defaults, --concurrency 1 --prefetch auto --handler
  sync: the Worker's own defaults (a trivial handler gains nothing from more threads
  under the GIL; the auto prefetch holds about 20 ms of work, which for this handler is
  its cap of 256 jobs, so jobs stay queued in the worker while earlier acks travel).
  With a fixed prefetch equal to the concurrency (2 jobs held in all) a pool is bound
  by round trips: near 2,000 jobs/s per process in smoke runs, below greenstalk.

Every run gets a fresh server and fresh workers (each its own process, in its own
session, started by re-running this file with a hidden `_child` role).  The workers are
connected before the clock starts: the run waits until the server's stats show W
workers waiting for jobs (beanstalkd: current-waiting = W; zstalk: current-workers = W).
The clock starts as the producer starts and stops when the server's cmd-delete reaches
J, polled every 20 ms once the producer is done (the producer and the poll share the
benchmark's process; the poll costs one stats round trip per 20 ms, and can add up to
20 ms to a run, which counts against the faster server).  Jobs/s = J / elapsed.  A run
that takes longer than --time-cap is cut there and reported as "capped" at (jobs
deleted / time).  After each run cmd-delete, total-jobs and the
current-jobs-* counts are checked, and CPU seconds (from /proc) of the server, the
workers (summed) and the producer are kept, so a reader can see which of them was the
limit (this machine may have fewer cores than the run has processes).

Runs alternate between the servers (beanstalkd, zstalk, beanstalkd, ...) across rows
and repetitions, so noise from other tenants of a shared machine hits both alike; each
figure is the best of --repeats (default 3) runs, because interference only ever slows a
run down.  The table gives both absolute figures and zstalk/beanstalkd per row against
the issue's target of >= 2.0x.  Every sample is kept in the --json file.

The script kills everything it starts on every way out: workers get SIGTERM (zstalk's
graceful stop) and then SIGKILL to their whole process group, servers the same; a
finally block per run, an atexit hook and a SIGTERM/SIGHUP handler cover the rest, and
every child has PR_SET_PDEATHSIG, so even a SIGKILL of this script leaves nothing behind.
Processes that exit otherwise than expected, or write anything, are listed at the end.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from bench_beanstalk import (BODY, HOST, REPO, Client, _put_loop, best, free_port, log,
                             proc_cpu_s, render)
from bench_binlog import group_members, kill_group, table_row

TUBE = "bench"
POLL_S = 0.02               # completion poll while the workers drain
READY_TIMEOUT_S = 30.0      # server up and W workers waiting
STOP_GRACE_S = 5.0          # SIGTERM -> SIGKILL
NAMES = ("beanstalkd", "zstalk")
LIVE: dict[int, subprocess.Popen] = {}    # pgid -> process; everything we started
NOTES: list[str] = []       # exit statuses and output of what we started


def handle(job) -> int:
    """The trivial handler, the same on both sides."""
    return len(job.body)


# --------------------------------------------------------------------------- processes

def die_with_parent() -> None:
    """In the child before exec: SIGKILL when we die, even by SIGKILL (PR_SET_PDEATHSIG)."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


class Proc:
    """A process of ours in its own session; its output goes to a temp file."""

    def __init__(self, name: str, argv: list[str]):
        self.name = name
        self.out = tempfile.TemporaryFile()
        self.p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.out,
                                  stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO,
                                  preexec_fn=die_with_parent)
        LIVE[self.p.pid] = self.p

    def check(self) -> None:
        if self.p.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.p.returncode}: "
                               f"{self.output()[-2000:]!r}")

    def cpu_s(self) -> float:
        return sum(proc_cpu_s(pid) for pid in group_members(self.p.pid))

    def output(self) -> str:
        self.out.seek(0)
        return self.out.read().decode(errors="replace").strip()

    def stop(self, expected: tuple[int, ...]) -> list[str]:
        """SIGTERM, then SIGKILL to the whole group; notes on anything unexpected."""
        notes = []
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                notes.append(f"{self.name} still running {STOP_GRACE_S:.0f} s after SIGTERM")
        kill_group(self.p.pid)
        rc = self.p.wait(5)
        LIVE.pop(self.p.pid, None)
        if rc not in expected and not notes:
            notes.append(f"{self.name} exit status {rc}")
        if self.output():
            notes.append(f"{self.name} output:\n{self.output()[-2000:]}")
        self.out.close()
        return notes


def child_argv(*args) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "_child", *map(str, args)]


def kill_all_live() -> None:
    for pgid in list(LIVE):
        kill_group(pgid)


def _exit_on_signal(signum, _frame):
    sys.exit(128 + signum)      # runs the finally blocks and the atexit hook


# --------------------------------------------------------------------------- worker children

def greenstalk_worker(port: str) -> None:
    import greenstalk
    c = greenstalk.Client((HOST, int(port)), encoding=None, watch=TUBE)
    while True:
        job = c.reserve()
        handle(job)
        c.delete(job)


def zstalk_worker(endpoint: str, concurrency: str, prefetch: str, kind: str) -> None:
    from zstalk.workers import Worker
    w = Worker(broker=endpoint, concurrency=int(concurrency),
               prefetch=None if prefetch == "auto" else int(prefetch))
    if kind == "async":
        @w.handler(TUBE)
        async def handle_async(job):
            return len(job.body)
    else:
        w.handler(TUBE)(handle)
    w.run()         # until SIGTERM


def child_main(argv: list[str]) -> int:
    role, *rest = argv
    {"greenstalk": greenstalk_worker, "zstalk": zstalk_worker}[role](*rest)
    return 0


# --------------------------------------------------------------------------- the two sides

class Side:
    """One server kind: start it with W workers, produce J jobs, count deletes, stop."""
    name = ""
    worker_exit: tuple[int, ...] = ()

    def __init__(self, args):
        self.args = args
        self.server: Proc | None = None
        self.workers: list[Proc] = []

    def start(self, n_workers: int) -> None:
        self.start_server()
        self.workers = [Proc(f"{self.name} worker {i}", self.worker_argv())
                        for i in range(n_workers)]
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self.workers_ready(n_workers):
            for p in (self.server, *self.workers):
                p.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: {n_workers} workers not waiting after "
                                   f"{READY_TIMEOUT_S:.0f}s; stats {self.stats()}")
            time.sleep(POLL_S)

    def cpu_s(self) -> tuple[float, float]:
        return self.server.cpu_s(), sum(w.cpu_s() for w in self.workers)

    def stop(self) -> list[str]:
        notes = []
        for w in self.workers:
            notes += w.stop(self.worker_exit)
        if self.server is not None:
            notes += self.server.stop((0, -signal.SIGTERM))
        self.workers, self.server = [], None
        return notes


class BeanstalkdSide(Side):
    name = "beanstalkd"
    worker_exit = (-signal.SIGTERM,)    # greenstalk's loop has no graceful stop

    def start_server(self) -> None:
        self.port = free_port()
        self.server = Proc("beanstalkd", [self.args.beanstalkd, "-l", HOST, "-p", str(self.port)])
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            self.server.check()
            try:
                self.client = Client((HOST, self.port), timeout=10.0)
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(POLL_S)

    def worker_argv(self) -> list[str]:
        return child_argv("greenstalk", self.port)

    def stats(self) -> dict:
        return {k: _number(v) for k, v in self.client.stats().items()}

    def workers_ready(self, n: int) -> bool:
        return self.stats()["current-waiting"] == n

    def produce(self, jobs: int, time_cap: float) -> dict:
        sock = socket.create_connection((HOST, self.port), timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.sendall(b"use %s\r\n" % TUBE.encode())
            reply = b""
            while not reply.endswith(b"\r\n"):
                reply += sock.recv(100)
            if reply != b"USING %s\r\n" % TUBE.encode():
                raise RuntimeError(f"use {TUBE}: {reply!r}")
            if self.args.producer == "batch":
                return _put_batches(sock, jobs, self.args.batch, time_cap)
            sock.setblocking(False)
            res = _put_loop([sock], [jobs], self.args.window, time_cap)
        finally:
            sock.close()
        return dict(put=res["count"], capped=res["capped"], errors=res["errors"])

    def stop(self) -> list[str]:
        if getattr(self, "client", None) is not None:
            self.client.sock.close()
            self.client = None
        return super().stop()


def _put_batches(sock: socket.socket, jobs: int, batch: int, time_cap: float) -> dict:
    """What zstalk's put_many does, over beanstalk's protocol: write `batch` puts at
    once, then read their `batch` replies, and again (at most `batch` outstanding, and
    none while the replies come back)."""
    put = b"put 0 0 60 %d\r\n%s\r\n" % (len(BODY), BODY)
    done, errors, deadline = 0, [], time.monotonic() + time_cap
    pending = b""
    while done < jobs and time.monotonic() < deadline:
        n = min(batch, jobs - done)
        sock.sendall(put * n)
        replies = 0
        while replies < n:
            data = sock.recv(65536)
            if not data:
                raise RuntimeError("beanstalkd closed the producer's connection")
            pending += data
            lines = pending.split(b"\r\n")
            pending = lines.pop()
            for line in lines:
                replies += 1
                if not line.startswith(b"INSERTED "):
                    errors.append(line.decode(errors="replace"))
        done += n
    return dict(put=done, capped=done < jobs, errors=errors[:5])


class ZstalkSide(Side):
    name = "zstalk"
    worker_exit = (0,)                  # Worker.run() returns on SIGTERM

    def start_server(self) -> None:
        from zstalk.workers import Client as ZClient
        self.endpoint = f"tcp://{HOST}:{free_port()}"
        self.server = Proc("zstalk broker", [sys.executable, "-m", "zstalk.broker.run",
                                             "broker", "--bind", self.endpoint])
        self.client = ZClient(self.endpoint, timeout_s=10.0)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            self.server.check()
            try:
                self.client.stats()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(POLL_S)

    def worker_argv(self) -> list[str]:
        a = self.args
        return child_argv("zstalk", self.endpoint, a.concurrency, a.prefetch, a.handler)

    def stats(self) -> dict:
        return {k: _number(v) for k, v in self.client.stats().items()}

    def workers_ready(self, n: int) -> bool:
        return self.stats()["current-workers"] == n

    def produce(self, jobs: int, time_cap: float) -> dict:
        batch = [BODY] * self.args.batch
        done, deadline = 0, time.monotonic() + time_cap
        while done < jobs and time.monotonic() < deadline:
            n = min(len(batch), jobs - done)
            done += len(self.client.put_many(batch[:n], tube=TUBE, pri=0, delay_s=0,
                                                     ttr_s=60))
        return dict(put=done, capped=done < jobs, errors=[])

    def stop(self) -> list[str]:
        if getattr(self, "client", None) is not None:
            self.client.close()
            self.client = None
        return super().stop()


def _number(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        return v


# --------------------------------------------------------------------------- one run

def one_run(side: Side, n_workers: int, jobs: int, time_cap: float) -> dict:
    try:
        side.start(n_workers)
        return measure(side, jobs, time_cap)
    except Exception as exc:
        return dict(rate=None, errors=[f"{type(exc).__name__}: {exc}"])
    finally:
        side_notes = side.stop()
        if side_notes:
            NOTES.extend(f"{side.name} W={n_workers}: {n}" for n in side_notes)


def measure(side: Side, jobs: int, time_cap: float) -> dict:
    srv0, wrk0 = side.cpu_s()
    cpu0, t0 = time.process_time(), time.monotonic()
    prod = side.produce(jobs, time_cap)
    t_put, cpu_put = time.monotonic(), time.process_time()
    deadline, deleted = t0 + time_cap, 0
    while True:
        deleted = side.stats()["cmd-delete"]
        if deleted >= jobs or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    t1 = time.monotonic()
    srv1, wrk1 = side.cpu_s()
    wall = t1 - t0
    res = dict(rate=deleted / wall, jobs=jobs, deleted=deleted, wall=wall,
               put_s=t_put - t0, capped=deleted < jobs, errors=list(prod["errors"]),
               server_cpu_share=(srv1 - srv0) / wall, workers_cpu_share=(wrk1 - wrk0) / wall,
               producer_cpu_share=(cpu_put - cpu0) / wall)
    check_counts(side.stats(), jobs, res)
    return res


def check_counts(st: dict, jobs: int, res: dict) -> None:
    want = {"cmd-delete": jobs, "total-jobs": jobs, "current-jobs-ready": 0,
            "current-jobs-reserved": 0, "current-jobs-buried": 0}
    if res["capped"]:
        return
    bad = {k: st.get(k) for k, v in want.items() if st.get(k) != v}
    if bad:
        res["errors"].append(f"after the run stats show {bad}, expected {want}")



# --------------------------------------------------------------------------- table and main

def build_table(results: dict) -> list[dict]:
    rows = []
    for key, per in results.items():
        b, z = (best(per.get(n, [])) for n in NAMES)
        rows.append(table_row(f"put -> handled -> deleted, 1 producer + {key} (jobs/s)", b, z,
                              target=(">=", 2.0)))
    return rows


def diagnostics(results: dict) -> str:
    out = ["cpu s / wall s of the best run (1.00 = one full core): server, workers, producer"]
    for key, per in results.items():
        for name in NAMES:
            runs = [r for r in per.get(name, []) if r.get("rate") is not None]
            if runs:
                r = max(runs, key=lambda r: r["rate"])
                out.append(f"  {key}, {name}: {r['server_cpu_share']:.2f}, "
                           f"{r['workers_cpu_share']:.2f}, {r['producer_cpu_share']:.2f}"
                           f"  (puts done at {r['put_s']:.2f}s of {r['wall']:.2f}s)")
    return "\n".join(out)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 10,000 jobs per run, one repetition")
    ap.add_argument("--workers", default="1,4", help="worker process counts, one row each")
    ap.add_argument("--jobs", type=int, default=None, help="jobs per run (50,000)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="runs per server and row, best taken (default 3; 1 with --quick)")
    ap.add_argument("--concurrency", type=int, default=1, help="zstalk Worker concurrency")
    ap.add_argument("--prefetch", default="auto",
                    help="zstalk Worker prefetch: a number, or auto (the Worker's default)")
    ap.add_argument("--handler", choices=("sync", "async"), default="sync",
                    help="zstalk handler kind (the same len(job.body) either way)")
    ap.add_argument("--producer", choices=("batch", "window"), default="batch",
                    help="batch: both producers write --batch puts and wait for their "
                         "replies (zstalk: put_many); window: beanstalkd's keeps --window "
                         "puts outstanding, pipelined (zstalk's still uses put_many)")
    ap.add_argument("--window", type=int, default=100,
                    help="beanstalkd producer in window mode: puts outstanding at most")
    ap.add_argument("--batch", type=int, default=100, help="puts per producer batch")
    ap.add_argument("--time-cap", type=float, default=None,
                    help="seconds a run may take (120; 60 with --quick)")
    ap.add_argument("--sides", default=",".join(NAMES), help="servers to run")
    ap.add_argument("--json", help="write results as JSON to this path")
    ap.add_argument("--beanstalkd", default="/usr/bin/beanstalkd")
    args = ap.parse_args(argv)
    q = args.quick
    for k, v in dict(jobs=10000 if q else 50000, repeats=1 if q else 3,
                     time_cap=60.0 if q else 120.0).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.worker_counts = [int(x) for x in args.workers.split(",") if x.strip()]
    return args


def header(args) -> dict:
    git = lambda *a: subprocess.run(["git", "-C", str(REPO), *a], capture_output=True,
                                    text=True).stdout.strip()
    meta = dict(started=time.strftime("%Y-%m-%d %H:%M:%S"), argv=sys.argv[1:],
                jobs=args.jobs, repeats=args.repeats, workers=args.worker_counts,
                zstalk_worker=dict(concurrency=args.concurrency, prefetch=args.prefetch,
                                   handler=args.handler, batch=args.batch),
                producer=args.producer, beanstalkd_window=args.window, nproc=os.cpu_count(),
                loadavg_before=os.getloadavg(), python=sys.version.split()[0],
                beanstalkd=subprocess.run([args.beanstalkd, "-v"], capture_output=True,
                                          text=True).stdout.strip(),
                zstalk_commit=git("rev-parse", "--short", "HEAD"),
                zstalk_dirty=bool(git("status", "--porcelain", "--untracked-files=no")))
    log(f"bench_workers: {meta['beanstalkd']} + greenstalk vs zstalk workers "
        f"{meta['zstalk_commit']}{' (dirty tree)' if meta['zstalk_dirty'] else ''}; "
        f"{args.jobs:,} jobs/run, workers {args.worker_counts}, best of {args.repeats}; "
        f"zstalk concurrency={args.concurrency} prefetch={args.prefetch} "
        f"handler={args.handler}; {os.cpu_count()} cpus, load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return meta


def run_all(args, names: list[str]) -> dict:
    sides = {"beanstalkd": BeanstalkdSide(args), "zstalk": ZstalkSide(args)}
    results: dict = {}
    for rep in range(args.repeats):
        for w in args.worker_counts:
            key = f"{w} worker process{'es' if w != 1 else ''}"
            for name in names:
                res = one_run(sides[name], w, args.jobs, args.time_cap)
                results.setdefault(key, {}).setdefault(name, []).append(res)
                log(f"  run {rep + 1}, {key}, {name}: " + (
                    f"{res['rate']:,.0f} jobs/s ({res['deleted']:,} in {res['wall']:.2f}s"
                    f"{', CAPPED' if res['capped'] else ''})" if res["rate"] is not None
                    else "FAILED") + (f" ERR {res['errors']}" if res["errors"] else ""))
    return results


def report(results: dict, args, meta: dict) -> None:
    table = build_table(results)
    text, md = render(table)
    print(f"\n{text}\n\nMarkdown:\n\n{md}\n")
    print(f"best of {args.repeats} run(s) of {args.jobs:,} jobs per server and row, "
          f"servers alternated run by run; zstalk workers: concurrency {args.concurrency}, "
          f"prefetch {args.prefetch}, {args.handler} handler; producers: "
          + (f"batches of {args.batch} on both sides" if args.producer == "batch" else
             f"beanstalkd window {args.window}, zstalk put_many batch {args.batch}"))
    print(diagnostics(results))
    errs = [f"{key}/{name}[{i}]: {r['errors'][:3]}" for key, per in results.items()
            for name, runs in per.items() for i, r in enumerate(runs) if r.get("errors")]
    if errs or NOTES:
        print("\nerrors and notes:")
        for e in errs + NOTES:
            print("  " + e.replace("\n", "\n    "))
    else:
        print("\nno errors, no output from servers or workers")
    if args.json:
        clean = [{k: v for k, v in r.items() if k != "fmt"} for r in table]
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, table=clean, markdown=md, results=results,
                           errors=errs, notes=NOTES), f, indent=1,
                      default=str)
        print(f"JSON written to {args.json}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_child"]:
        return child_main(argv[1:])
    args = parse_args(argv)
    atexit.register(kill_all_live)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    meta = header(args)
    names = [n for n in NAMES if n in args.sides.split(",")]
    t0 = time.monotonic()
    try:
        results = run_all(args, names)
    finally:
        kill_all_live()
    meta.update(elapsed_s=time.monotonic() - t0, loadavg_after=os.getloadavg())
    report(results, args, meta)
    print(f"\ntotal time {meta['elapsed_s']:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
