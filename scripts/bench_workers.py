#!/usr/bin/env python3
"""End-to-end jobs/s with workers: zstalk native workers against greenstalk on beanstalkd.

Usage:
    scripts/bench_workers.py [--quick | --smoke] [--workers 1,4] [--jobs N] [--repeats N]
        [--warmup N] [--against REF] [--concurrency C] [--prefetch P]
        [--handler sync|async] [--producer batch|window] [--window N] [--batch N]
        [--time-cap S] [--sides beanstalkd,zstalk] [--json PATH]

Method
------
What every row shares (free loopback ports, alternation with warm-up, medians with their
min-max, the machine check, stopping what was started, --against) is in
scripts/harness/__init__.py.  One row per worker process count W (--workers, default 1
and 4).  A run is 1 producer + W worker processes + the server, all on 127.0.0.1, and
measures J jobs (--jobs, default 50,000; 100-byte bodies, tube "bench", pri 0, delay 0,
TTR 60 s) going put -> handled -> deleted.  Both sides run the same trivial handler,
`len(job.body)`, on bodies handed over as bytes (greenstalk with encoding=None, zstalk
with the raw codec).

* beanstalkd: `beanstalkd -l 127.0.0.1 -p PORT` (no binlog).  Each worker process runs
  `greenstalk.Client((HOST, PORT), encoding=None, watch="bench")` in the loop
  `job = c.reserve(); handle(job); c.delete(job)`: one connection per process, which is
  how greenstalk is run.  The producer (this process) writes on a raw socket after
  `use bench`: with --producer batch (the default) --batch = 100 puts at once, then reads
  their 100 replies, and again, which is what zstalk's put_many does below, so both
  producers have the same puts outstanding at every moment; with --producer window it is
  the harness's pipelined put loop instead (at most --window = 100 outstanding, a
  continuous stream zstalk's synchronous Client has no equivalent of).  A greenstalk
  producer would wait for each put's reply: slower than either.
* zstalk: the broker actor alone, `zstalk broker --bind tcp://127.0.0.1:PORT` from the
  tree's .venv/bin; native workers and the producer speak ZeroMQ to it, no TCP front.
  Each worker process runs `zstalk.workers.Worker(broker=EP, concurrency=--concurrency,
  prefetch=--prefetch)` with the handler on tube "bench", `w.run()`.  The producer is
  `zstalk.workers.Client(EP).put_many([body] * 100, ...)`: one round trip per batch of
  --batch = 100, the same 100 jobs in flight as beanstalkd's window.  The workers and
  the producer run in the tree's own python (this file's hidden `_child` roles), so
  --against compares the SDK of each tree with its own broker; the producer is a process
  of its own (beanstalkd's is this process: both are one process beside the server and
  the workers).
  The docs/performance.md row uses this script's defaults, --concurrency 1 --prefetch auto --handler
  sync: the Worker's own defaults (a trivial handler gains nothing from more threads
  under the GIL; the auto prefetch holds about 20 ms of work, which for this handler is
  its cap of 256 jobs, so jobs stay queued in the worker while earlier acks travel).
  With a fixed prefetch equal to the concurrency (2 jobs held in all) a pool is bound
  by round trips: near 2,000 jobs/s per process in smoke runs, below greenstalk.

Every run gets a fresh server and fresh workers.  The workers are connected before the
clock starts: the run waits until the server's stats show W workers waiting for jobs
(beanstalkd: current-waiting = W; zstalk: current-workers = W, asked by the producer).
The clock starts as the producer starts and stops when the server's cmd-delete reaches
J, polled every 20 ms by the producer once it is done (one stats round trip per 20 ms;
it can add up to 20 ms to a run, which counts against the faster server).  Jobs/s = J /
elapsed.  A run that takes longer than --time-cap is cut there and reported as "capped"
at (jobs deleted / time).  After each run cmd-delete, total-jobs and the current-jobs-*
counts are checked, and the CPU shares of the server, the workers (summed) and the
producer are kept, so a reader can see which of them was the limit (this machine may
have fewer cores than the run has processes); the server's CPU-seconds per 1,000 jobs
is a row of the table.  Workers get SIGTERM (zstalk's graceful stop) when a run ends.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import tempfile
import time

from harness.beanstalk import Client
from harness.cli import Run, log, parser, sized
from harness.loadgen import BODY, put_loop
from harness.machine import tool_version
from harness.procs import HOST, Proc, free_port, zstalk_keep
from harness.stats import Figure, per_1k, rounds
from harness.table import Table, cpu_shares
from harness.venv import CHILD_ENV, use_project_venv

TUBE = "bench"
POLL_S = 0.02               # completion poll while the workers drain
READY_TIMEOUT_S = 30.0      # server up and W workers waiting
REFERENCE = "beanstalkd"
CURVE_VARS = ("ZSTALK_CURVE_KEY", "ZSTALK_CURVE_CLIENTS", "ZSTALK_CURVE_SERVER",
              "ZSTALK_INSECURE", "ZSTALK_CURVE_ACCEPT")


def handle(job) -> int:
    """The trivial handler, the same on both sides."""
    return len(job.body)


def child_env(extra: dict | None = None) -> dict:
    """A child's environment: no CURVE variable but those in `extra`, and marked as a
    benchmark child (so it runs in the python it was given, see harness/venv.py)."""
    env = {k: v for k, v in os.environ.items() if k not in CURVE_VARS}
    return dict(env, **(extra or {}), **{CHILD_ENV: "1"})


def child_argv(python: str, *args) -> list[str]:
    return [python, os.path.abspath(__file__), "_child", *map(str, args)]


def _number(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        return v


# --------------------------------------------------------------------------- children

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


def zstalk_producer(endpoint: str, workers: str, jobs: str, batch: str, cap: str,
                    path: str) -> None:
    """Wait for W workers, write PATH.ready, wait for SIGUSR1, put J jobs in put_many
    batches, poll stats until cmd-delete has grown by J; the result as JSON to PATH."""
    from zstalk.workers import Client as ZClient
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    c, jobs, cap = ZClient(endpoint, timeout_s=10.0), int(jobs), float(cap)
    stats = lambda: {k: _number(v) for k, v in c.stats().items()}      # noqa: E731
    deadline, st = time.monotonic() + READY_TIMEOUT_S, {}
    while st.get("current-workers") != int(workers):
        if time.monotonic() > deadline:
            raise SystemExit(f"{workers} workers not waiting after {READY_TIMEOUT_S:.0f}s: {st}")
        try:
            st = stats()
        except Exception:
            pass
        time.sleep(POLL_S)
    base = st["cmd-delete"]
    open(path + ".ready", "w").close()
    signal.sigwait({signal.SIGUSR1})
    cpu0, t0 = time.process_time(), time.monotonic()
    done, body = 0, [BODY] * int(batch)
    while done < jobs and time.monotonic() < t0 + cap:
        done += len(c.put_many(body[:min(len(body), jobs - done)], tube=TUBE, pri=0,
                               delay_s=0, ttr_s=60))
    t_put, cpu_put = time.monotonic(), time.process_time()
    while (deleted := stats()["cmd-delete"] - base) < jobs and time.monotonic() < t0 + cap:
        time.sleep(POLL_S)
    t1 = time.monotonic()
    with open(path + ".part", "w") as f:
        json.dump(dict(t0=t0, t1=t1, t_put=t_put, deleted=deleted, put=done, base=base,
                       producer_cpu_s=cpu_put - cpu0, stats=stats(), errors=[]), f)
    os.rename(path + ".part", path)                 # (whole, or not there)
    c.close()


def child_main(argv: list[str]) -> int:
    role, *rest = argv
    {"greenstalk": greenstalk_worker, "zstalk": zstalk_worker,
     "producer": zstalk_producer}[role](*rest)
    return 0


# --------------------------------------------------------------------------- the two sides

class Side:
    """One server kind: start it with W workers, produce J jobs, count deletes, stop."""
    worker_exit: tuple[int, ...] = ()

    def __init__(self, name: str, args):
        self.name, self.args = name, args
        self.server: Proc | None = None
        self.workers: list[Proc] = []

    def start(self, n_workers: int, jobs: int) -> None:
        self.start_server()
        self.workers = [Proc(f"{self.name} worker {i}", self.worker_argv(),
                             env=self.env("worker")) for i in range(n_workers)]
        self.wait_ready(n_workers, jobs)

    def env(self, role: str) -> dict:
        return child_env()

    def cpu_s(self) -> tuple[float, float]:
        return self.server.cpu_s(), sum(w.cpu_s() for w in self.workers)

    def check(self) -> None:
        for p in (self.server, *self.workers):
            if p is not None:
                p.check()

    def stop(self) -> list[str]:
        notes: list[str] = []
        for w in self.workers:
            w.stop(notes, expected=self.worker_exit, grace_s=5.0)
        if self.server is not None:
            self.server.stop(notes)
        self.workers, self.server = [], None
        return notes


class BeanstalkdSide(Side):
    worker_exit = (-signal.SIGTERM,)    # greenstalk's loop has no graceful stop

    def start_server(self) -> None:
        self.port = free_port()
        self.server = Proc(REFERENCE, [self.args.beanstalkd, "-l", HOST, "-p", self.port])
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
        return child_argv(sys.executable, "greenstalk", self.port)

    def stats(self) -> dict:
        return {k: _number(v) for k, v in self.client.stats().items()}

    def wait_ready(self, n: int, jobs: int) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self.stats()["current-waiting"] != n:
            self.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{n} workers not waiting after {READY_TIMEOUT_S:.0f}s; "
                                   f"stats {self.stats()}")
            time.sleep(POLL_S)

    def measure(self, jobs: int, time_cap: float) -> dict:
        srv0, wrk0 = self.cpu_s()
        cpu0, t0 = time.process_time(), time.monotonic()
        prod = self.produce(jobs, time_cap)
        t_put, cpu_put = time.monotonic(), time.process_time()
        while (deleted := self.stats()["cmd-delete"]) < jobs and time.monotonic() < t0 + time_cap:
            time.sleep(POLL_S)
        t1 = time.monotonic()
        return result(self, jobs, deleted, t0, t1, t_put, cpu_put - cpu0, srv0, wrk0,
                      self.stats(), prod["errors"])

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
            res = put_loop([sock], [jobs], self.args.window, time_cap)
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
    """A tree's broker, its workers and its producer, each in that tree's own python."""
    worker_exit = (0,)                  # Worker.run() returns on SIGTERM

    def __init__(self, build, args, tmp: str):
        super().__init__(build.label, args)
        self.build, self.tmp, self.producer = build, tmp, None

    def start_server(self) -> None:
        self.endpoint = f"tcp://{HOST}:{free_port()}"
        self.server = Proc(f"{self.name} broker", [self.build.exe("zstalk"), "broker", "--bind",
                                                    self.endpoint], env=self.env("broker"),
                           keep=zstalk_keep)

    def worker_argv(self) -> list[str]:
        a = self.args
        return child_argv(self.build.python, "zstalk", self.endpoint, a.concurrency,
                          a.prefetch, a.handler)

    def wait_ready(self, n: int, jobs: int) -> None:
        """A producer that has seen the broker answer and W workers waiting."""
        self.producer = Producer(self, n, jobs)
        deadline = time.monotonic() + READY_TIMEOUT_S + 5
        while not os.path.exists(self.producer.path + ".ready"):
            self.check()
            self.producer.proc.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: {n} workers not waiting")
            time.sleep(POLL_S)

    def measure(self, jobs: int, time_cap: float) -> dict:
        srv0, wrk0 = self.cpu_s()
        r = self.producer.go()
        st = {k: _number(v) for k, v in r["stats"].items()}
        return result(self, jobs, r["deleted"], r["t0"], r["t1"], r["t_put"],
                      r["producer_cpu_s"], srv0, wrk0, st if r["base"] == 0 else None,
                      r["errors"])

    def stop(self) -> list[str]:
        notes = self.producer.stop() if self.producer else []
        self.producer = None
        return notes + super().stop()


class Producer:
    """The zstalk side's producer: this file's `_child producer` in the tree's python."""

    def __init__(self, side: ZstalkSide, workers: int, jobs: int):
        a = side.args
        self.side, self.path = side, os.path.join(side.tmp, f"producer-{time.monotonic_ns()}")
        self.proc = Proc(f"{side.name} producer", child_argv(
            side.build.python, "producer", side.endpoint, workers, jobs, a.batch,
            a.time_cap, self.path), env=side.env("producer"))

    def go(self) -> dict:
        """SIGUSR1 (the clock starts), then wait for its result."""
        self.proc.p.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + self.side.args.time_cap + 30
        while not os.path.exists(self.path):
            if not self.proc.alive() and not os.path.exists(self.path):
                self.proc.check()
            if time.monotonic() > deadline:
                raise RuntimeError("the producer did not report")
            time.sleep(POLL_S)
        with open(self.path) as f:
            return json.load(f)

    def stop(self) -> list[str]:
        notes: list[str] = []
        self.proc.stop(notes, expected=(0, -signal.SIGTERM))
        return notes


def result(side: Side, jobs, deleted, t0, t1, t_put, prod_cpu, srv0, wrk0, stats,
           errors) -> dict:
    """One run's figures; the counts checked when `stats` are the run's alone."""
    srv1, wrk1 = side.cpu_s()
    wall = t1 - t0
    res = dict(rate=deleted / wall, jobs=jobs, deleted=deleted, wall=wall, put_s=t_put - t0,
               capped=deleted < jobs, errors=list(errors),
               server_cpu_share=(srv1 - srv0) / wall, workers_cpu_share=(wrk1 - wrk0) / wall,
               producer_cpu_share=prod_cpu / wall, cpu_per_1k=per_1k(srv1 - srv0, deleted))
    want = {"cmd-delete": jobs, "total-jobs": jobs, "current-jobs-ready": 0,
            "current-jobs-reserved": 0, "current-jobs-buried": 0}
    bad = {k: stats.get(k) for k, v in want.items() if stats.get(k) != v} if stats else {}
    if bad and not res["capped"]:
        res["errors"].append(f"after the run stats show {bad}, expected {want}")
    return res


def one_run(side: Side, n_workers: int, jobs: int, time_cap: float, notes: list) -> dict:
    try:
        side.start(n_workers, jobs)
        return side.measure(jobs, time_cap)
    except Exception as exc:
        return dict(rate=None, errors=[f"{type(exc).__name__}: {exc}"])
    finally:
        notes.extend(f"{side.name} W={n_workers}: {n}" for n in side.stop())


# --------------------------------------------------------------------------- table and main

def run_all(run: Run, names: list[str], tmp: str) -> dict:
    args = run.args
    sides = {REFERENCE: BeanstalkdSide(REFERENCE, args)}
    sides.update({b.label: ZstalkSide(b, args, tmp) for b in run.builds})
    results: dict = {}
    for rep, order, warm in rounds(names, args.repeats, args.warmup):
        for w in args.worker_counts:
            key = f"{w} worker process{'es' if w != 1 else ''}"
            for name in order:
                res = one_run(sides[name], w, args.jobs, args.time_cap, run.notes)
                if not warm:
                    results.setdefault(key, {}).setdefault(name, []).append(res)
                log(f"  {'warm-up' if warm else f'run {rep + 1}'}, {key}, {name}: " + (
                    f"{res['rate']:,.0f} jobs/s ({res['deleted']:,} in {res['wall']:.2f}s"
                    f"{', CAPPED' if res['capped'] else ''})" if res["rate"] is not None
                    else "FAILED") + (f" ERR {res['errors']}" if res["errors"] else ""))
    return results


def build_table(run: Run, names: list[str], results: dict) -> Table:
    a = run.args
    t = Table("workers", "Native workers against greenstalk on beanstalkd",
              [(n, n) for n in names],
              [(b, REFERENCE) for b in run.labels() if REFERENCE in names]
              + run.against_ratios(), note=(
                  f"{a.jobs:,} jobs of 100 bytes per run going put → handled → deleted, the "
                  "same trivial handler on both sides: beanstalkd with one greenstalk "
                  "connection per worker process, `zstalk broker` with `zstalk.workers.Worker` "
                  f"processes (concurrency {a.concurrency}, prefetch {a.prefetch}, a "
                  f"{a.handler} handler); both producers "
                  + (f"write {a.batch} puts, then wait for their replies (`put_many`)."
                     if a.producer == "batch" else f"pipeline (beanstalkd: {a.window} "
                     f"outstanding; zstalk: put_many of {a.batch}).")))
    now = f"{run.labels()[0]}/{REFERENCE}"
    for key, per in results.items():
        t.add(f"put → handled → deleted, 1 producer + {key} (jobs/s)",
              {n: Figure.of(per.get(n), "rate") for n in names}, target=(now, ">=", 2.0))
        t.add("  server CPU-s per 1,000 jobs", {n: Figure.of(per.get(n), "cpu_per_1k")
                                                for n in names}, fmt="{:.4g}")
    return t


def parse_args(argv):
    ap = parser(__doc__)
    ap.add_argument("--workers", default="1,4", help="worker process counts, one row each")
    ap.add_argument("--jobs", type=int, default=None, help="jobs per run (50,000)")
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
    ap.add_argument("--sides", default="beanstalkd,zstalk",
                    help="servers to run (zstalk: every build)")
    ap.add_argument("--beanstalkd", default="/usr/bin/beanstalkd")
    args = ap.parse_args(argv)
    sized(args, jobs=(50000, 10000, 2000), time_cap=(120.0, 60.0, 60.0))
    args.worker_counts = [int(x) for x in args.workers.split(",") if x.strip()]
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_child"]:
        return child_main(argv[1:])
    args = parse_args(argv)
    run = Run("bench_workers", args)
    run.machine["beanstalkd"] = tool_version([args.beanstalkd, "-v"])
    sides = args.sides.split(",")
    names = ([REFERENCE] if REFERENCE in sides else []) + (run.labels() if "zstalk" in sides
                                                          else [])
    with tempfile.TemporaryDirectory(prefix="bench_workers-") as tmp:
        results = run_all(run, names, tmp)
    return run.report([build_table(run, names, results)], results,
                      [cpu_shares(results, ("server_cpu_share", "workers_cpu_share",
                                            "producer_cpu_share"))])


if __name__ == "__main__":
    if sys.argv[1:2] != ["_child"]:
        use_project_venv()
    sys.exit(main())
