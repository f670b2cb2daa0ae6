#!/usr/bin/env python3
"""Benchmark zstalk's binlog against beanstalkd's: pipelined puts, and recovery after kill -9.

Usage:
    scripts/bench_binlog.py [--quick | --smoke] [--rows 1,2] [--jobs N] [--fsync 50,0]
        [--recovery-fsync 50] [--repeats N] [--warmup N] [--against REF] [--put-count N]
        [--window N] [--gen-procs N] [--dir DIR] [--json PATH]

Method
------
What every row shares (free loopback ports, alternation with warm-up, medians with their
min-max, CPU-seconds per 1,000 operations, the machine check, stopping what was started,
--against) is in scripts/harness/__init__.py; the put load generator is
scripts/harness/loadgen.py's.  Both servers get the same command line shape, each with
its own fresh binlog directory (made under --dir, default the system temp dir, so both
sit on one filesystem):

    beanstalkd -l 127.0.0.1 -p PORT -b DIR -f MS      (or -F)
    zstalkd    -l 127.0.0.1 -p PORT -b DIR -f MS      (zstalk's beanstalkd drop-in, from
                                                       each tree's .venv/bin)

Each server runs in its own session (process group), so that zstalkd, a supervisor with a
broker and front children, can be killed as a whole with os.killpg.

* Row 1, pipelined put with the binlog on, for each --fsync setting (default `-f 50` and
  `-f 0`) at 1 and 8 connections: a fresh server and a fresh binlog directory per run,
  then --put-count puts of 100-byte bodies, at most --window outstanding per connection
  (loadgen.put_loop).  Rates with the server's CPU-seconds per 1,000 puts.
* Row 2, recovery of --jobs jobs (default 1,000,000, 100-byte bodies) with
  `-f --recovery-fsync` (default 50): a fresh server is filled with ready jobs by 8
  pipelined connections; `stats` must show them all ready; after --settle seconds (so
  that a `-f 50` sync has passed, for both alike) the binlog directory's size on disk is
  taken (allocated blocks, as `du -s`), then the whole process group gets SIGKILL.  Once
  every process of the group is gone, the same command line is started again (new port,
  same directory) and the clock runs from Popen until a `stats` reply shows
  current-jobs-ready == --jobs: connect is retried every 10 ms, and once connected the
  same connection asks `stats` every 10 ms.  The time of the first `stats` answer of any
  kind is reported too (beanstalkd only answers once its replay is over; a server that
  answers during its replay shows it there).  --recovery-repeats fills per server.
  The binlog was just written, so it is read from the page cache: this is warm-cache
  recovery (the CPU cost of the replay), the same for both servers.

The binlog directories are removed at the end (unless --keep), also on an error or a
SIGTERM.  If a zstalkd refuses the binlog flags (before the binlog landed it exited 5,
"the binlog is not supported yet") its rows are skipped with its exit status and output,
and the others are still measured.
"""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import time

from harness.beanstalk import BeanstalkServer, Client, stats_of
from harness.cli import Run, log, parser, sized
from harness.loadgen import fill, timed_load
from harness.machine import filesystem_of, tool_version
from harness.procs import HOST
from harness.stats import Figure, rounds
from harness.table import Table, cpu_shares
from harness.venv import use_project_venv

POLL_S = 0.01               # recovery: connect / stats retry interval
REFERENCE = "beanstalkd"
DIRS: set[str] = set()      # binlog directories to remove at exit


def fsync_flags(setting: str) -> list[str]:
    """"50" -> -f 50, "0" -> -f 0 (always fsync), "F" -> -F (never fsync)."""
    return ["-F"] if setting.upper() == "F" else ["-f", str(int(setting))]


def disk_usage(path: str) -> tuple[int, int]:
    """(allocated bytes as `du -s` counts them, apparent bytes as `du -sb`)."""
    alloc = apparent = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            alloc += st.st_blocks * 512
            apparent += st.st_size
    return alloc, apparent


def _remove_dirs() -> None:
    for d in list(DIRS):
        shutil.rmtree(d, ignore_errors=True)


class BinlogServer(BeanstalkServer):
    """A server with `-b DIR`; crash() is kill -9 of its whole group, spawn() again
    restarts it on the same directory (its output kept in one file across both)."""

    def __init__(self, name: str, binary: str, flags: list[str], base_dir: str):
        self.binlog = tempfile.mkdtemp(prefix=f"bench-binlog-{name.split('@')[0]}-",
                                       dir=base_dir)
        DIRS.add(self.binlog)
        super().__init__(name, lambda port: [binary, "-l", HOST, "-p", port, "-b",
                                             self.binlog, *flags],
                         kind="reference" if name == REFERENCE else "zstalk")

    def wait_stats(self, done, deadline: float) -> tuple[float, dict]:
        """Ask `stats` every POLL_S until done(stats); returns (first answer time, stats)."""
        first, last, c, t0 = None, {}, None, time.monotonic()
        try:
            while True:
                self._check_running(deadline, last, t0)
                try:
                    c = c or Client(self.addr, timeout=max(0.1, deadline - time.monotonic()))
                    last = c.stats()
                    first = first or time.monotonic()
                    if done(last):
                        return first, last
                except (OSError, EOFError):
                    c = self._drop(c)
                time.sleep(POLL_S)
        finally:
            self._drop(c)

    @staticmethod
    def _drop(c):
        if c is not None:
            c.sock.close()
        return None

    def _check_running(self, deadline: float, last: dict, t0: float) -> None:
        if not self.alive():
            raise RuntimeError(f"{self.name} exited with {self.proc.p.returncode}: "
                               f"{self.proc.output()[-2000:]!r}")
        if time.monotonic() > deadline:
            seen = last.get("current-jobs-ready", "no stats answer")
            raise RuntimeError(f"{self.name} not there after {deadline - t0:.2f}s (last "
                               f"current-jobs-ready: {seen}); output: "
                               f"{self.proc.output()[-2000:]!r}")

    def crash(self) -> None:
        self.proc.crash()

    def close(self, where: str, keep: bool) -> list[str]:
        """Stop (SIGTERM, then SIGKILL to the group), remove the binlog unless `keep`."""
        try:
            return self.stop(where)
        finally:
            if not keep:
                shutil.rmtree(self.binlog, ignore_errors=True)
                DIRS.discard(self.binlog)


# --------------------------------------------------------------------------- rows

class Bench:
    def __init__(self, run: Run, names: list[str]):
        self.run, self.a, self.names = run, run.args, names
        self.binaries = {REFERENCE: self.a.beanstalkd}
        self.binaries.update({b.label: b.exe("zstalkd") for b in run.builds})
        self.results: dict = {}

    def fresh(self, name: str, setting: str) -> BinlogServer:
        extra = ["-s", str(self.a.segment)] if self.a.segment else []
        srv = BinlogServer(name, self.binaries[name], fsync_flags(setting) + extra, self.a.dir)
        try:
            started = srv.start()
            self.results.setdefault("start", {}).setdefault(name, []).append(
                dict(start_s=started))
        except BaseException:
            self.run.notes += srv.close("start", self.a.keep)
            raise
        return srv

    def row_put(self):
        out = self.results.setdefault("put", {})
        for setting in self.a.fsync.split(","):
            for nc in (1, 8):
                key = f"{' '.join(fsync_flags(setting))}, {nc} conn"
                for rep, order, warm in rounds(self.names, self.a.repeats, self.a.warmup):
                    for name in order:
                        where = f"put {key} {'warm-up' if warm else f'rep={rep}'} {name}"
                        res = self._one_put(name, setting, nc, where)
                        if not warm:
                            out.setdefault(key, {}).setdefault(name, []).append(res)

    def _one_put(self, name: str, setting: str, nc: int, where: str) -> dict:
        a, srv = self.a, None
        try:
            srv = self.fresh(name, setting)
            res = timed_load(srv, "put", nc, a.put_count, a.window, a.put_cap,
                             gen_procs=a.gen_procs)
            res["binlog_mib"] = disk_usage(srv.binlog)[0] / 2**20
        except Exception as exc:
            res = dict(rate=None, errors=[repr(exc)])
        finally:
            if srv is not None:
                self.run.notes += srv.close(where, a.keep)
        if res.get("rate") is None:
            log(f"  {where}: ERROR {res['errors']}")
        else:
            log(f"  {where}: {res['rate']:,.0f} puts/s{' (capped)' if res['capped'] else ''}, "
                f"binlog {res['binlog_mib']:.1f} MiB, gen cpu {res['gen_cpu_share']:.2f}, "
                f"server cpu {res['server_cpu_share']:.2f}"
                + (f" ERR {res['errors']}" if res["errors"] else ""))
        return res

    def row_recovery(self):
        a = self.a
        out = self.results.setdefault("recovery", {})
        for rep, order, warm in rounds(self.names, a.recovery_repeats, a.warmup):
            for name in order:
                where = f"recovery jobs={a.jobs:,} {'warm-up' if warm else f'rep={rep}'} {name}"
                try:
                    res = self._one_recovery(name, where)
                    log(f"  {where}: fill {res['fill_s']:.1f}s, binlog "
                        f"{res['binlog_mib']:.1f} MiB on disk, recovered in "
                        f"{res['recovery_s']:.2f}s (first stats answer at "
                        f"{res['first_answer_s']:.2f}s)"
                        + (f" ERR {res['errors']}" if res["errors"] else ""))
                except Exception as exc:
                    res = dict(recovery_s=None, errors=[repr(exc)])
                    log(f"  {where}: ERROR {res['errors']}")
                if not warm:
                    out.setdefault(name, []).append(res)

    def _one_recovery(self, name: str, where: str) -> dict:
        a = self.a
        srv = self.fresh(name, a.recovery_fsync)
        try:
            t0 = time.monotonic()
            filled = fill(srv, a.jobs, a.window, a.fill_cap, gen_procs=a.gen_procs)
            res = dict(fill_s=time.monotonic() - t0, errors=list(filled["errors"]))
            ready = int(stats_of(srv.addr, timeout=60).get("current-jobs-ready", -1))
            if ready != a.jobs:
                raise RuntimeError(f"{ready} jobs ready after the fill, expected {a.jobs}")
            time.sleep(a.settle)
            alloc, apparent = disk_usage(srv.binlog)
            res.update(binlog_mib=alloc / 2**20, binlog_apparent_mib=apparent / 2**20)
            srv.crash()
            t_popen = srv.spawn()
            first, st = srv.wait_stats(
                lambda s: int(s.get("current-jobs-ready", -1)) >= a.jobs,
                t_popen + a.recovery_timeout)
            res.update(recovery_s=time.monotonic() - t_popen, first_answer_s=first - t_popen)
            if int(st["current-jobs-ready"]) != a.jobs:
                res["errors"].append(f"recovered {st['current-jobs-ready']} ready jobs, "
                                     f"expected {a.jobs}")
            return res
        finally:
            self.run.notes += srv.close(where, a.keep)


# --------------------------------------------------------------------------- table

def build_table(run: Run, names: list[str], results: dict, skipped: dict) -> Table:
    cols = [(REFERENCE, REFERENCE)] + [(b, b) for b in run.labels()]
    t = Table("binlog", "Binlog against beanstalkd -b", cols,
              [(b, REFERENCE) for b in run.labels()] + run.against_ratios(), note=(
                  "`beanstalkd -b DIR -f MS` and `zstalkd -b DIR -f MS`, the same command "
                  f"line, fresh directories on one filesystem ({run.machine['binlog_fs']}); "
                  f"{run.args.put_count:,} puts of 100 bytes per put run; recovery is kill -9 "
                  "after the fill, then the time from restart until `stats` shows every job "
                  "ready (the binlog read from a warm page cache). "))
    now = f"{run.labels()[0]}/{REFERENCE}"

    def cells(runs: dict, key: str) -> dict:
        return {n: Figure.of(runs.get(n), key) for n in names}

    for key, per in results.get("put", {}).items():
        t.add(f"pipelined put, {key} (puts/s)", cells(per, "rate"), target=(now, ">=", 1.0))
        t.add("  server CPU-s per 1,000 puts", cells(per, "cpu_per_1k"), fmt="{:.4g}")
    rec = results.get("recovery")
    if rec:
        flags = " ".join(fsync_flags(run.args.recovery_fsync))
        t.add(f"recovery of {run.args.jobs:,} jobs, {flags} (s)", cells(rec, "recovery_s"),
              fmt="{:,.2f}", target=(now, "<=", 2.0))
        t.add("  start with an empty binlog (s)", cells(results.get("start", {}), "start_s"),
              fmt="{:,.2f}")
        for key, label, fmt in (("first_answer_s", "first stats answer after restart (s)",
                                 "{:,.2f}"),
                                ("fill_s", "fill time before the kill (s)", "{:,.1f}"),
                                ("binlog_mib", "binlog on disk after the fill (MiB)", "{:,.1f}")):
            t.add(f"  {label}", cells(rec, key), fmt=fmt)
    for label, why in skipped.items():
        t.note += f"{label} skipped: {why}. "
    return t


# --------------------------------------------------------------------------- main

def refusal(build, args) -> str | None:
    """None if this build's zstalkd runs with -b; else why not (exit status and output)."""
    srv = BinlogServer(build.label, build.exe("zstalkd"), fsync_flags("50"), args.dir)
    try:
        srv.start(timeout=30.0)
        return None
    except Exception as exc:
        return f"`{' '.join(map(str, srv.argv_fn(srv.port)))}`: {exc}"
    finally:
        srv.close("probe", keep=False)


def parse_args(argv):
    ap = parser(__doc__)
    ap.add_argument("--rows", default="1,2", help="1 = pipelined put, 2 = recovery")
    ap.add_argument("--jobs", type=int, default=None, help="recovery row jobs (1,000,000)")
    ap.add_argument("--fsync", default="50,0",
                    help="row-1 settings: MS for -f MS, F for -F (default 50,0)")
    ap.add_argument("--recovery-fsync", default="50", help="row-2 setting (default 50)")
    ap.add_argument("--recovery-repeats", type=int, default=None,
                    help="row-2 fills per server (default --repeats)")
    ap.add_argument("--put-count", type=int, default=None, help="puts per row-1 run (100k)")
    ap.add_argument("--window", type=int, default=2000,
                    help="pipelined put: max outstanding commands per connection")
    ap.add_argument("--gen-procs", type=int, default=1, help="load generator processes")
    ap.add_argument("--settle", type=float, default=1.0, help="seconds between fill and kill")
    ap.add_argument("--recovery-timeout", type=float, default=None,
                    help="seconds a restart may take (default 600; 60 with --quick)")
    ap.add_argument("--segment", type=int, default=None, help="pass -s BYTES to both")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where binlog dirs go")
    ap.add_argument("--keep", action="store_true", help="keep the binlog directories")
    ap.add_argument("--beanstalkd", default="/usr/bin/beanstalkd")
    args = ap.parse_args(argv)
    sized(args, jobs=(1000000, 20000, 2000), put_count=(100000, 20000, 2000),
          recovery_timeout=(600.0, 60.0, 60.0), put_cap=(15.0, 4.0, 4.0),
          fill_cap=(900.0, 60.0, 60.0))
    if args.recovery_repeats is None:
        args.recovery_repeats = args.repeats
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    atexit.register(_remove_dirs)
    run = Run("bench_binlog", args)
    run.machine.update(beanstalkd=tool_version([args.beanstalkd, "-v"]),
                       binlog_fs=filesystem_of(os.path.realpath(args.dir)))
    skipped = {b.label: why for b in run.builds if (why := refusal(b, args))}
    for label, why in skipped.items():
        log(f"SKIPPING {label}: its zstalkd does not run with -b: {why}")
    names = [REFERENCE] + [n for n in run.labels() if n not in skipped]
    bench = Bench(run, names)
    rows = {int(x) for x in args.rows.split(",") if x.strip()}
    for num, label, fn in ((1, "row 1: pipelined put, binlog on", bench.row_put),
                           (2, f"row 2: recovery of {args.jobs:,} jobs", bench.row_recovery)):
        if num in rows:
            log(f"{label} ...")
            t0 = time.monotonic()
            fn()
            log(f"  ({time.monotonic() - t0:.1f}s)")
    table = build_table(run, names, bench.results, skipped)
    extra = [f"binlogs in {args.dir} ({run.machine['binlog_fs']}); recovery reads the binlog "
             f"from a warm page cache", cpu_shares(bench.results.get("put", {}))]
    return run.report([table], bench.results, extra + [f"SKIPPED {k}: {v}"
                                                       for k, v in skipped.items()])


if __name__ == "__main__":
    use_project_venv()
    sys.exit(main())
