#!/usr/bin/env python3
"""Benchmark zstalk against beanstalkd with the same load from the same generator.

Usage:
    scripts/bench_beanstalk.py [--quick | --smoke] [--rows 1,2,3,4,5,6,7,8,9 | hot]
        [--fronts 0[,1]] [--repeats N] [--warmup N] [--against REF] [--json PATH]
        [--jobs-for-memory N] [--window N] [--gen-procs N] [--put-count N]
        [--work-count N] [--one-put-count N] [--one-cycle-count N] [--latency-count N]

--fronts 0 (the default, as for `zstalk serve`) runs zstalk's fronts in the broker's
process; --fronts N runs N front processes; --fronts 0,1 runs both, side by side, as
columns of their own (the placement table of docs/performance.md).  Row 9 runs --fronts 0 and 1
whatever --fronts says.  --rows hot runs rows 6 and 8, the hot-path check that issues
touching the server's round trip run with --against REF: one command at a time, batches,
and the generator ceiling and floor beside them.

Method
------
What every row shares (free loopback ports, fresh servers, alternation, medians with
their min-max, CPU-seconds per 1,000 operations, the machine check, stopping what was
started, --against) is in scripts/harness/__init__.py; the load generators (pipelined
put, worker cycle, D in flight) in scripts/harness/loadgen.py, with how they keep their
own cost down (pre-built byte streams, one selectors loop, SO_RCVLOWAT); the minimal
client in scripts/harness/minimal.py, the floor server in scripts/harness/floor_server.py,
rows 6 and 8 in scripts/harness/hotpath.py; the latency probes in
scripts/harness/probes.py.  Every measurement that holds state (rows 1-3, 5, 6, 8, 9) gets
a fresh server process; 100-byte bodies.  zstalk runs as `zstalk serve -l 127.0.0.1 -p P
--counter-port C --worker-bind tcp://127.0.0.1:W --fronts N` (what `zstalk serve` runs by
default, every port a free one) from each tree's .venv/bin, beanstalkd as `beanstalkd -l
127.0.0.1 -p P`.  5 alternated runs per row and system by default (--repeats), after 1
warm-up round; the table's note gives the range of the 1-minute load average at the end
of the runs.

* Row 1, pipelined put: --put-count puts (20,000 with --quick) on 1, 8 and 50
  connections, at most --window (2,000) outstanding per connection (loadgen.put_loop).
* Row 2, worker cycle: the queue is filled first (pipelined puts, 8 connections) with
  100 jobs more than the measurement consumes, so it never runs dry; then
  --work-count cycles (loadgen.work_loop: on each RESERVED `delete <id>\\r\\nreserve\\r\\n`
  in one write) on 1, 8 and 50 connections.  DELETED replies are counted; the ready
  count is checked with `stats` afterwards.
* Row 3, memory: a fresh server is filled with N ready 100-byte jobs by 8 pipelined
  connections; RSS (VmRSS from /proc) is read before the fill and after it and a 1 s
  settle, summed over the zstalk supervisor and all its descendants (broker, fronts).
  The ready count is checked with `stats`.
* Row 4, reserve across 1000 tubes: on one server, connection W1000 watches t0..t999
  (and ignores default); connection W1 watches only t0.  Three variants, each filled
  with K jobs and then drained by K reserve->delete cycles on one connection (delete and
  the next reserve pipelined): W1 with jobs in t0; W1000 with jobs in t0; W1000 with
  jobs spread round-robin over all 1000 tubes.  Cost ratio = time per cycle of the
  W1000 variant / time per cycle of W1, each the median of the repetitions.  (The
  generator's own per-cycle cost is in both terms, which pulls a fast server's ratio
  toward 1.)  One server per system holds the connections for all repetitions.
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
  makes this near certain, which is why the holder uses plain `reserve`).  Each
  repetition is a fresh server; p50 / p99 / max are per run, then medians of the runs.
* Row 6, one command at a time, 1 connection (hotpath.row_one): (a) N puts
  (--one-put-count, 20,000; 3,000 with --quick), every reply checked to be one INSERTED
  line; (b) on a server first filled with N + 600 jobs (pipelined, as in row 2), N cycles
  (--one-cycle-count, 10,000; 2,000 with --quick) of `reserve` (RESERVED and its body
  checked) then `delete <id>` (DELETED).  Rate = puts/s or cycles/s; the ready count is
  checked with `stats` afterwards.  The client is the minimal client (minimal.py): a
  process of its own, one blocking socket (kernel read timeouts, no poll), one sendall()
  per command and recv_into() until the reply is whole, 1,000 commands of warm-up (500
  cycles), then the timed part, the server's CPU read around it alone.  In the same
  alternation as the servers: greenstalk as the client, on every system (greenstalk.Client
  with encoding=None, in a process of its own the same way): what its users see; the
  generator ceiling, the harness's own generator on beanstalkd (loadgen's put_loop with a
  window of 1, depth_work_loop with 1 in flight; in the benchmark's process, after the
  same warm-up); and the floor, the minimal client on floor_server.py (this tree's python
  and uvloop: a bare asyncio.Protocol answering put with `INSERTED n`, reserve with a
  canned `RESERVED n 100` and body, delete with `DELETED`).  The table gives the ceiling's
  rate in the beanstalkd column (its result: its share of the minimal client there), the
  floor's in the first zstalk column, and below it each zstalk column's median / the
  floor's.  Targets: 0.8x beanstalkd, put and reserve+delete.
* Row 7, exec -> first reply: the time from just before subprocess.Popen of the server
  command to the moment a client receives the INSERTED reply to `put 0 0 60 1`; the
  client retries connect() every 0.5 ms (connection refused -> retry; a connection closed
  before replying -> retry; 10 s cap).  The time the port first accepted a connection is
  recorded too.  9 starts per server (3 with --smoke), the servers' order alternating, a
  free loopback port each run, no binlog, server stopped after each run, each started
  without PR_SET_PDEATHSIG (so Popen can vfork, as it did before the harness).  zstalk
  is started as `zstalkd -l 127.0.0.1 -p PORT` (the drop-in a tool that spawns
  beanstalkd runs: greenstalk's suite gives it 0.1 s) and as `zstalk serve -l 127.0.0.1
  -p PORT --counter-port 0 --worker-bind none` (plus `--fronts N` when N > 0), each
  through its tree's .venv/bin.  The floor beside them is the same venv's `python -c
  "import asyncio, uvloop"` timed from exec to exit: what any server on this interpreter
  and event loop pays before its own code runs.  Target: zstalkd's median <= 80 ms and
  <= the floor + 20 ms.  Python's fork+exec is in every figure.
* Row 8, the pipelines clients use (hotpath.row_pipe): 32 commands in flight per
  connection (what an asynchronous client with a bounded pipeline keeps), 32 at a time
  (a client that sends a batch and waits for all of it), and many connections with one
  command each (a pool of synchronous workers).  (a) put, 8 connections, 32 in flight:
  the row-1 loop with a window of 32 (--put-count puts).  (b) put, 8 connections in
  batches of 32: the minimal client with 8 connections taking turns, each sending 32 puts
  in one write and reading all 32 replies before its next 32 (--put-count puts).  (c)
  reserve -> delete, 8 connections, 32 in flight (loadgen.depth_work_loop), the server
  filled first as in row 2 (--work-count + 100 jobs).  (d) reserve -> delete in batches
  of 32 on 8 connections: the minimal client, each connection sending 32 reserves, reading
  the 32 jobs, sending their 32 deletes in one write and reading the 32 DELETED
  (--work-count cycles; filled with --work-count + 600 jobs).  (e) one at a time on 50
  connections: the minimal client holding 50 blocking connections in one process, taking
  turns in a fixed order: `reserve`, on RESERVED `delete <id>`, on DELETED the next
  `reserve`, each connection's next command sent as soon as its reply is read, so each
  has one in flight (--work-count cycles); with its generator ceiling (the selectors loop,
  50 connections, 1 in flight each, on beanstalkd) and floor (the minimal client on
  floor_server.py) as in row 6.  Rate = puts/s or deletes/s; ready counts checked with
  `stats` afterwards.  Targets against beanstalkd: (a) 1.2x, (b) 1.0x, (c) 1.0x, (d)
  0.8x, (e) 0.9x, with server CPU per cycle <= 1.25x beanstalkd's.
* Row 9, request latency (probes.request_latency): N puts one at a time (--latency-count,
  2,000; 500 with --quick), each timed from just before sendall() to the reply's \\r\\n;
  p50 and p99 in ms.  (i) idle; (ii) under load: a forked process keeps 8 connections x
  32 pipelined puts in flight (probes.bg_put_main) from 0.2 s before the first probe
  request to the last.  Servers: beanstalkd and zstalk with its fronts in the broker's
  process (`--fronts 0`) and with one front process (`--fronts 1`: the round trip
  through a remote front).  On this 2-core machine the load generator, the server and
  the probe share two cores, so the under-load figures include waiting for a CPU.
  Target: idle p50 <= 1.5x beanstalkd's (--fronts 0); p99 reported.

Generator check (ceiling.py): a one-at-a-time row whose client reaches under 0.9x of the
minimal client's rate on beanstalkd (greenstalk's rows, the ceiling rows) is marked
*generator-bound* in its result column, not a result; a pipelined or batch row (rows 1,
2 and 8, and row 8's 50 connections one at a time, whose one client process serves all
50) likewise when its generator used more than 0.8 of a core (the median of a column's
runs).  A ceiling row says its share of the minimal client.

Rows 1, 2, 4, 6 and 8 also give the server's CPU-seconds per 1,000 operations, and every
load run records the generator's and the server's CPU share (the "CPU check" below the
table).
"""
from __future__ import annotations

import os
import sys
import time

from harness import hotpath
from harness.beanstalk import BeanstalkServer, Client, close_all, stats_of
from harness.cli import Run, log, parser, sized
from harness.loadgen import PUT_CMD, fill, timed_load, work_loop
from harness.machine import load_range, tool_version
from harness.probes import exec_to_first_reply, latency_under_load, request_latency
from harness.procs import HOST, free_port
from harness.stats import Figure, pct, per_1k, rounds
from harness.table import Table, cpu_shares
from harness.timers import TIMER_GRACE_S, delay_lateness, ttr_lateness
from harness.venv import use_project_venv

REFERENCE = "beanstalkd"
TUBE_VARIANTS = {"watch1": "watch 1 tube", "watch1000_one": "watch 1000, jobs in 1",
                 "watch1000_spread": "watch 1000, jobs spread"}


def zstalk_key(label: str, fronts: int) -> str:
    return label if fronts == 0 else f"{label} --fronts {fronts}"


class Bench:
    def __init__(self, run: Run):
        self.run, self.a = run, run.args
        self.placements = [int(x) for x in str(self.a.fronts).split(",") if x.strip()]
        self.columns = [(b, f) for b in run.builds for f in self.placements]
        self.systems = [REFERENCE] + [zstalk_key(b.label, f) for b, f in self.columns]
        lat = [(b, f) for b in run.builds for f in sorted(set(self.placements) | {0, 1})]
        self.lat_systems = [REFERENCE] + [zstalk_key(b.label, f) for b, f in lat]
        self.factories = {REFERENCE: lambda: BeanstalkServer(REFERENCE, lambda port: [
            self.a.beanstalkd, "-l", HOST, "-p", port], kind="reference")}
        for b, f in set(self.columns) | set(lat):
            self.factories[zstalk_key(b.label, f)] = self._serve(b, f)
        hotpath.register(self)
        self.results: dict = {}

    @staticmethod
    def _serve(build, fronts: int):
        """`zstalk serve` as it runs by default (a counter front, a worker endpoint), on
        free ports: two of them run at once in row 4 with --against."""
        name = zstalk_key(build.label, fronts)
        return lambda: BeanstalkServer(name, lambda port: [
            build.exe("zstalk"), "serve", "-l", HOST, "-p", port, "--counter-port",
            free_port(), "--worker-bind", f"tcp://{HOST}:{free_port()}", "--fronts", fronts])

    def fresh(self, name: str) -> BeanstalkServer:
        srv = self.factories[name]()
        srv.start()
        return srv

    def finish(self, srv: BeanstalkServer, where: str) -> None:
        self.run.notes += srv.stop(where)

    def fresh_runs(self, key: str, variants, fn, unit, systems=None, stat="rate") -> None:
        """Alternated runs on a fresh server each: fn(server, variant) -> result dict.
        systems: the names to run (self.systems), or a function of the variant giving them."""
        out = self.results.setdefault(key, {})
        names_of = systems if callable(systems) else lambda _: systems or self.systems
        for rep, _, warm in rounds(self.systems, self.a.repeats, self.a.warmup):
            for variant in variants:
                names = names_of(variant)
                for name in (names if rep % 2 == 0 else names[::-1]):   # (rounds' order)
                    where = f"{key} {variant} {'warm-up' if warm else f'rep={rep}'} {name}"
                    srv = self.fresh(name)
                    try:
                        res = fn(srv, variant)
                    except Exception as exc:
                        res = dict(rate=None, errors=[repr(exc)])
                    finally:
                        self.finish(srv, where)
                    res["load1"] = round(os.getloadavg()[0], 2)
                    report(where, res, unit, stat)
                    if not warm:
                        out.setdefault(str(variant), {}).setdefault(name, []).append(res)

    # Row 1 -----------------------------------------------------------------
    def row_put(self):
        a = self.a
        self.fresh_runs("put", (1, 8, 50), lambda srv, nc: timed_load(
            srv, "put", nc, a.put_count, a.window, a.put_cap, gen_procs=a.gen_procs), "puts/s")

    # Row 2 -----------------------------------------------------------------
    def row_work(self):
        self.fresh_runs("work", (1, 8, 50), lambda srv, nc: self._drain_run(
            srv, "work", nc, self.a.window, self.a.work_count, self.a.work_cap), "jobs/s")

    def _drain_run(self, srv, kind, nc, window, total, cap) -> dict:
        """Fill total + 100 jobs, then `total` reserve -> delete cycles; check the rest."""
        a = self.a
        filled = fill(srv, total + 100, a.window, 120.0, gen_procs=a.gen_procs)
        res = timed_load(srv, kind, nc, total, window, cap, gen_procs=a.gen_procs)
        res["fill_rate"] = filled["rate"]
        res["ready_after"] = int(stats_of(srv.addr).get("current-jobs-ready", -1))
        # (a capped run may leave deletes in flight)
        if not res["capped"] and res["ready_after"] != total + 100 - res["count"]:
            res["errors"].append(f"ready after = {res['ready_after']}, expected "
                                 f"{total + 100 - res['count']}")
        return res

    # Row 3 -----------------------------------------------------------------
    def row_memory(self):
        n = self.a.jobs_for_memory
        self.results["memory_jobs"] = n
        self.fresh_runs("memory", (n,), self._memory, "MiB", stat="rss_mib")

    def _memory(self, srv, n) -> dict:
        a = self.a
        time.sleep(0.3)
        idle = srv.rss_mib()
        t0 = time.monotonic()
        filled = fill(srv, n, a.window, a.fill_cap, gen_procs=a.gen_procs)
        fill_s = time.monotonic() - t0
        time.sleep(1.0)
        ready = int(stats_of(srv.addr, timeout=60).get("current-jobs-ready", -1))
        time.sleep(0.2)
        res = dict(idle_mib=idle, rss_mib=srv.rss_mib(), fill_s=fill_s, ready=ready,
                   fill_rate=filled["rate"], gen_cpu_share=filled["gen_cpu_share"],
                   errors=filled["errors"])
        if ready != n:
            res["errors"].append(f"stats says {ready} ready, expected {n}")
        return res

    # Row 4 -----------------------------------------------------------------
    def row_tubes(self):
        a, k, ntubes = self.a, self.a.tube_jobs, 1000
        out = self.results.setdefault("tubes", {})
        servers = {}
        try:
            for name in self.systems:
                srv = servers[name] = self.fresh(name)
                w1000 = Client(srv.addr)
                w1000.pipeline([b"watch t%d\r\n" % i for i in range(ntubes)], expect=b"WATCHING")
                w1000.pipeline([b"ignore default\r\n"], expect=b"WATCHING")
                w1 = Client(srv.addr)
                w1.pipeline([b"watch t0\r\n", b"ignore default\r\n"], expect=b"WATCHING")
                srv.clients = (w1, w1000, Client(srv.addr))
            for rep, order, warm in rounds(self.systems, a.repeats, a.warmup):
                for name in order:
                    for variant in TUBE_VARIANTS:
                        where = f"tubes {variant} {'warm-up' if warm else f'rep={rep}'} {name}"
                        try:
                            res = self._tube_variant(servers[name], variant, k, ntubes)
                        except Exception as exc:
                            res = dict(rate=None, errors=[repr(exc)])
                        report(where, res, "cycles/s")
                        if not warm:
                            out.setdefault(variant, {}).setdefault(name, []).append(res)
        finally:
            for name, srv in servers.items():
                close_all(getattr(srv, "clients", ()))
                self.finish(srv, f"tubes {name}")

    def _tube_variant(self, srv, variant: str, k: int, ntubes: int) -> dict:
        w1, w1000, prod = srv.clients
        if variant == "watch1000_spread":
            cmds = [b"use t%d\r\n" % (j % ntubes) + PUT_CMD for j in range(k)]
            prod.pipeline(cmds, replies_per_cmd=2, batch=250)
        else:
            prod.pipeline([b"use t0\r\n"], expect=b"USING")
            prod.pipeline([PUT_CMD] * k, expect=b"INSERTED")
        res = self._cycles(srv, w1 if variant == "watch1" else w1000, k, self.a.work_cap)
        left = self._drain(w1000)
        if left:
            res["errors"].append(f"{left} jobs left after the drain")
        return res

    def _cycles(self, srv, c: Client, k: int, cap: float) -> dict:
        """k reserve -> delete+reserve cycles on one connection (the row-2 loop)."""
        if c.buf:
            raise RuntimeError(f"unread data before cycles: {bytes(c.buf[:80])!r}")
        c0 = srv.cpu_s()
        c.sock.setblocking(False)
        try:
            res = work_loop([c.sock], [k], cap)
        finally:
            c.sock.settimeout(15)
        wall, done = res["t1"] - res["t0"], res["count"]
        used = srv.cpu_s() - c0
        return dict(count=done, wall=wall, rate=done / wall,
                    per_cycle_us=wall / done * 1e6 if done else None,
                    gen_cpu_share=res["cpu"] / wall, server_cpu_share=used / wall,
                    cpu_per_1k=per_1k(used, done), capped=res["capped"], errors=res["errors"])

    @staticmethod
    def _drain(c: Client) -> int:
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
        n, spacing = self.a.timer_jobs, self.a.spacing / 1000.0
        self.results["timer_jobs"] = n

        def both(srv, test):
            fn = delay_lateness if test == "delay" else ttr_lateness
            res = fn(srv, n, spacing)
            lm = res["late_ms"]
            res.update(p50=pct(lm, 50), p99=pct(lm, 99), max=max(lm, default=float("nan")),
                       received=len(lm))
            return res
        self.fresh_runs("timers", ("delay", "ttr"), both, "jobs back", stat="received")

    # Row 6 -----------------------------------------------------------------
    def row_one(self):
        hotpath.row_one(self)

    # Row 7 -----------------------------------------------------------------
    def row_exec(self):
        names = [REFERENCE]
        for b in self.run.builds:
            names += [f"{b.label} zstalkd", f"{b.label} floor"]
            names += [f"{zstalk_key(b.label, f)} serve" for f in self.placements]
        out = self.results.setdefault("exec", {})
        for rep, order, warm in rounds(names, self.a.exec_runs, self.a.warmup):
            for name in order:
                where = f"exec {'warm-up' if warm else f'run={rep}'} {name}"
                srv = self._exec_server(name)
                try:
                    res = exec_to_first_reply(srv)
                except Exception as exc:
                    res = dict(listen_ms=None, first_ms=None, errors=[repr(exc)])
                finally:
                    self.finish(srv, where)
                log(f"  {where}: " + (f"INSERTED at {res['first_ms']:.1f} ms" if res["first_ms"]
                                      else f"ERROR {res['errors']}"))
                if not warm:
                    out.setdefault(name, []).append(res)

    def _exec_server(self, name: str) -> BeanstalkServer:
        """Row 7's commands as a user would type them (no counter front, no worker bind)."""
        if name == REFERENCE:
            return BeanstalkServer(name, lambda port: [self.a.beanstalkd, "-l", HOST, "-p", port],
                                   kind="reference", pdeathsig=False)
        label, what = name.rsplit(" ", 1)
        b = next(b for b in self.run.builds if label.split(" --fronts")[0] == b.label)
        if what == "zstalkd":
            argv = lambda port: [b.exe("zstalkd"), "-l", HOST, "-p", port]   # noqa: E731
        elif what == "floor":
            argv = lambda port: [b.python, "-c", "import asyncio, uvloop"]  # noqa: E731
        else:
            fronts = int(label.split("--fronts ")[1]) if "--fronts" in label else 0
            argv = lambda port: [b.exe("zstalk"), "serve", "-l", HOST, "-p", port,  # noqa
                                 "--counter-port", "0", "--worker-bind", "none",
                                 *(["--fronts", fronts] if fronts else [])]
        return BeanstalkServer(name, argv, kind="floor" if what == "floor" else "zstalk",
                               pdeathsig=False)

    # Row 8 -----------------------------------------------------------------
    def row_pipe(self):
        hotpath.row_pipe(self)

    # Row 9 -----------------------------------------------------------------
    def row_latency(self):
        a = self.a

        def probe(srv, cond):
            if cond == "load":
                res = latency_under_load(srv, a.latency_count, a.latency_cap)
            else:
                c0, w0 = srv.cpu_s(), time.monotonic()
                res = request_latency(srv.addr, a.latency_count, a.latency_cap)
                res["server_cpu_share"] = (srv.cpu_s() - c0) / (time.monotonic() - w0)
            res.pop("lat_ms", None)
            if res["count"] < a.latency_count and not res["errors"]:
                res["errors"].append(f"only {res['count']} of {a.latency_count} requests")
            return res
        self.fresh_runs("latency", ("idle", "load"), probe, "ms p50", self.lat_systems, "p50")


def report(where: str, res: dict, unit: str, stat: str = "rate") -> None:
    if res.get(stat) is None:
        log(f"  {where}: ERROR {res.get('errors')}")
        return
    shares = [f"{k.split('_cpu')[0]} cpu {res[k]:.2f}" for k in ("gen_cpu_share",
              "server_cpu_share") if res.get(k) is not None]
    log(f"  {where}: {res[stat]:,.{3 if res[stat] < 100 else 0}f} {unit}"
        + (" CAPPED" if res.get("capped") else "")
        + (f" ({', '.join(shares)})" if shares else "")
        + (f" ERR {res['errors'][:3]}" if res.get("errors") else ""))


# --------------------------------------------------------------------------- table

def build_table(bench: Bench) -> Table:
    run, res = bench.run, bench.results
    cols = [(REFERENCE, REFERENCE)] + [(s, s) for s in bench.systems[1:]]
    now = bench.systems[1]
    vs_ref = f"{now}/{REFERENCE}"
    t = Table("beanstalk", "beanstalk protocol against beanstalkd", cols,
              [(s, REFERENCE) for s in bench.systems[1:]] + run.against_ratios(), note=(
                  "`zstalk serve` (fronts in the broker's process unless the column says "
                  "`--fronts N`, on uvloop) and Debian's beanstalkd side by side, driven by "
                  "the same load generator (plain Python on raw sockets), 100-byte bodies, a "
                  "fresh server for every run that holds state; one at a time, the minimal "
                  "client (a process of its own); each row's method is in "
                  "`scripts/bench_beanstalk.py`'s docstring." + load_note(res)))

    def fig(key, variant, name, stat="rate"):
        return Figure.of(res.get(key, {}).get(str(variant), {}).get(name), stat)

    def add(key, variant, metric, stat="rate", cpu="", **kw):
        if key in res:
            t.add(metric, {s: fig(key, variant, s, stat) for s in bench.systems}, **kw)
            if cpu:
                t.add(f"  server CPU-s per 1,000 {cpu}", {s: fig(key, variant, s, "cpu_per_1k")
                                                          for s in bench.systems}, fmt="{:.4g}")

    for nc in (1, 8, 50):
        add("put", nc, f"pipelined put, {nc} conn (puts/s)", cpu="puts",
            target=(vs_ref, ">=", 1.5) if nc == 8 else None,
            result=hotpath.cpu_verdict(bench, "put", nc))
    hotpath.pipe_rows(bench, t)
    for nc in (1, 8, 50):
        add("work", nc, f"worker cycle, {nc} conn (jobs/s)", cpu="cycles",
            target=(vs_ref, ">=", 1.0) if nc > 1 else None,
            result=hotpath.cpu_verdict(bench, "work", nc))
    hotpath.one_rows(bench, t)
    latency_rows(bench, t)
    memory_rows(bench, t, add, vs_ref)
    tube_rows(bench, t, add)
    timer_rows(bench, t, add)
    exec_rows(bench, t)
    return t


def load_note(results: dict) -> str:
    span = load_range(results)
    return f" Load average (1 min) at the end of the runs: {span}." if span else ""


def latency_rows(bench: Bench, t: Table) -> None:
    lat = bench.results.get("latency")
    if not lat:
        return
    both = {0, 1} <= set(bench.placements)
    for cond, label in (("idle", "idle"), ("load", "under a pipelined put load")):
        for fronts in ([None] if both else [0, 1]):
            for stat in ("p50", "p99"):
                cells = {REFERENCE: Figure.of(lat[cond].get(REFERENCE), stat)}
                for (b, f) in bench.columns:
                    name = zstalk_key(b.label, f if fronts is None else fronts)
                    cells[zstalk_key(b.label, f)] = Figure.of(lat[cond].get(name), stat)
                goals = []
                if cond == "idle" and stat == "p50" and fronts in (0, None):
                    goals.append((f"{bench.systems[1]}/{REFERENCE}", "<=", 1.5))
                if cond == "idle" and stat == "p50" and fronts in (1, None):
                    col = bench.systems[1] if fronts else zstalk_key(bench.run.builds[0].label, 1)
                    goals.append((col, "<=", 0.15, "--fronts 1: p50 <= 0.15"))
                t.add(f"put round trip, {label}, {stat} (ms)"
                      + (f", zstalk --fronts {fronts}" if fronts is not None else ""), cells,
                      fmt="{:.3f}", target=goals or None)


def memory_rows(bench: Bench, t: Table, add, vs_ref: str) -> None:
    n = bench.results.get("memory_jobs")
    add("memory", n, "RSS idle (MiB)", "idle_mib", fmt="{:,.1f}")
    add("memory", n, f"RSS with {n:,} ready jobs (MiB)" if n else "", "rss_mib", fmt="{:,.1f}",
        target=(vs_ref, "<=", 1.3))
    add("memory", n, f"  fill time for {n:,} jobs (s)" if n else "", "fill_s", fmt="{:,.1f}")


def tube_rows(bench: Bench, t: Table, add) -> None:
    tubes = bench.results.get("tubes")
    if not tubes:
        return
    for v, label in TUBE_VARIANTS.items():
        add("tubes", v, f"reserve+delete, {label} (cycles/s)", cpu="cycles")
    for v in ("watch1000_one", "watch1000_spread"):
        cells = {}
        for s in bench.systems:
            one = Figure.of(tubes.get("watch1", {}).get(s), "per_cycle_us").median
            many = Figure.of(tubes.get(v, {}).get(s), "per_cycle_us").median
            cells[s] = [many / one] if one and many else []
        t.add(f"reserve cost 1000/1 tubes, {TUBE_VARIANTS[v].split(', ')[1]} (x, of medians)",
              cells, fmt="{:.2f}", ratio=False, target=(bench.systems[1], "<=", 1.2))


def timer_rows(bench: Bench, t: Table, add) -> None:
    n = bench.results.get("timer_jobs")
    add("timers", "delay", "  request round trip during row 5, put p50 (ms)", "put_rtt_ms_p50",
        fmt="{:.2f}")
    for test, label in (("delay", "delay 1s"), ("ttr", "TTR 1s")):
        add("timers", test, f"{label}: jobs back within {TIMER_GRACE_S:.0f} s of due (of {n})",
            "received", fmt="{:.0f}", ratio=False)
        for stat in ("p50", "p99", "max"):
            add("timers", test, f"{label} lateness {stat} (ms)", stat, fmt="{:.2f}")


def exec_rows(bench: Bench, t: Table) -> None:
    ex = bench.results.get("exec")
    if not ex:
        return
    runs = bench.a.exec_runs

    def row(metric, what, stat="first_ms", target=None):
        cells = {REFERENCE: Figure.of(ex.get(REFERENCE), stat) if what != "floor" else Figure()}
        for b, f in bench.columns:
            name = (f"{zstalk_key(b.label, f)} serve" if what == "serve" else
                    f"{b.label} {what}" if f == bench.placements[0] else None)
            cells[zstalk_key(b.label, f)] = Figure.of(ex.get(name), stat)
        t.add(metric, cells, fmt="{:,.1f}", ratio=False, target=target)

    floor = Figure.of(ex.get(f"{bench.run.builds[0].label} floor"), "first_ms").median
    goal = None if floor is None else round(min(80.0, floor + 20.0), 1)
    row(f"exec → first INSERTED, `zstalkd`, median of {runs} (ms)", "zstalkd",
        target=(bench.systems[1], "<=", goal, "zstalkd <= 80 and <= floor + 20")
        if goal else None)
    row("  floor: `python -c \"import asyncio, uvloop\"`, exec → exit (ms)", "floor")
    row(f"exec → first INSERTED, `zstalk serve`, median of {runs} (ms)", "serve")
    row("  exec → port accepts a connection, `zstalkd` (ms)", "zstalkd", "listen_ms")


# --------------------------------------------------------------------------- main

def parse_args(argv):
    ap = parser(__doc__)
    ap.add_argument("--rows", default="1,2,3,4,5,6,7,8,9",
                    help="rows to run, e.g. 1,2,5; hot: 6,8 (the hot-path check)")
    ap.add_argument("--fronts", default="0",
                    help="0: fronts in the broker's process (zstalk serve's default); N: N "
                         "front processes; 0,1: both, as columns of their own")
    ap.add_argument("--jobs-for-memory", type=int, default=None, help="row 3 (1,000,000)")
    ap.add_argument("--put-count", type=int, default=None, help="puts per row-1 / row-8 run")
    ap.add_argument("--work-count", type=int, default=None, help="cycles per row-2 / row-8 run")
    ap.add_argument("--one-put-count", type=int, default=None, help="puts per row-6 run")
    ap.add_argument("--one-cycle-count", type=int, default=None, help="cycles per row-6 run")
    ap.add_argument("--latency-count", type=int, default=None, help="requests per row-9 probe")
    ap.add_argument("--tube-jobs", type=int, default=None, help="cycles per row-4 variant")
    ap.add_argument("--timer-jobs", type=int, default=None, help="jobs per row-5 test")
    ap.add_argument("--exec-runs", type=int, default=None, help="row 7: starts per server (9)")
    ap.add_argument("--spacing", type=float, default=10.0, help="row 5: ms between jobs")
    ap.add_argument("--window", type=int, default=2000,
                    help="pipelined put: max outstanding commands per connection")
    ap.add_argument("--gen-procs", type=int, default=1,
                    help="load generator processes (connections split among them)")
    ap.add_argument("--beanstalkd", default="/usr/bin/beanstalkd")
    args = ap.parse_args(argv)
    sized(args, repeats=(5, 1, 1), put_count=(100000, 20000, 2000), work_count=(40000, 3000, 500),
          jobs_for_memory=(1000000, 20000, 2000), one_put_count=(20000, 3000, 300),
          one_cycle_count=(10000, 2000, 200), latency_count=(2000, 500, 100),
          tube_jobs=(5000, 300, 100), timer_jobs=(200, 30, 5), exec_runs=(9, 9, 2),
          put_cap=(15.0, 4.0, 4.0), work_cap=(8.0, 4.0, 4.0), one_cap=(30.0, 10.0, 10.0),
          latency_cap=(120.0, 30.0, 10.0), fill_cap=(600.0, 60.0, 60.0))
    return args


ROWS = [(1, "row 1: pipelined put", "row_put"), (2, "row 2: worker cycle", "row_work"),
        (3, "row 3: memory", "row_memory"),
        (4, "row 4: reserve across 1000 watched tubes", "row_tubes"),
        (5, "row 5: timer lateness", "row_timers"),
        (6, "row 6: one command at a time, 1 connection", "row_one"),
        (7, "row 7: exec -> first reply", "row_exec"),
        (8, "row 8: pipelines clients use", "row_pipe"),
        (9, "row 9: request latency", "row_latency")]


def main(argv=None) -> int:
    args = parse_args(argv)
    run = Run("bench_beanstalk", args)
    run.machine["beanstalkd"] = tool_version([args.beanstalkd, "-v"])
    bench = Bench(run)
    rows = {int(x) for x in args.rows.replace("hot", "6,8").split(",") if x.strip()}
    for num, label, method in ROWS:
        if num in rows:
            log(f"{label} ...")
            t0 = time.monotonic()
            try:
                getattr(bench, method)()
            except Exception as exc:
                run.notes.append(f"{label}: aborted: {exc!r}")
                log(f"  {label} aborted: {exc!r}")
            log(f"  ({time.monotonic() - t0:.1f}s)")
    table = build_table(bench)
    if len(bench.placements) > 1:
        table.name, table.title = "placement", "Placement: fronts beside the broker or apart"
        table.note = ("The same rows with zstalk's fronts beside the broker (`--fronts 0`, "
                      "the default) and in processes of their own (`--fronts N`), against "
                      "Debian's beanstalkd; each row's method is in "
                      "`scripts/bench_beanstalk.py`'s docstring." + load_note(bench.results))
    return run.report([table], bench.results, [cpu_shares(bench.results)])


if __name__ == "__main__":
    use_project_venv()
    sys.exit(main())
