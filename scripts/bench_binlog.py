#!/usr/bin/env python3
"""Benchmark zstalk's binlog against beanstalkd's: pipelined puts, and recovery after kill -9.

Usage:
    .venv/bin/python scripts/bench_binlog.py [--quick] [--rows 1,2] [--jobs N]
        [--fsync 50,0] [--recovery-fsync 50] [--repeats N] [--put-count N]
        [--window N] [--gen-procs N] [--dir DIR] [--json PATH]

Method
------
Both servers get the same command line shape, each with its own fresh binlog directory
(made under --dir, default the system temp dir, so both sit on one filesystem):

    beanstalkd -l 127.0.0.1 -p PORT -b DIR -f MS      (or -F)
    zstalkd    -l 127.0.0.1 -p PORT -b DIR -f MS      (zstalk's beanstalkd drop-in)

Each server runs in its own session (process group), so that zstalkd, a supervisor with a
broker and front children, can be killed as a whole with os.killpg.  The load generator,
the alternation of runs and the table are those of bench_beanstalk.py, imported from it
(running this file puts scripts/ on sys.path, so `import bench_beanstalk` just works).

* Row 1, pipelined put with the binlog on, for each --fsync setting (default `-f 50` and
  `-f 0`) at 1 and 8 connections: a fresh server and a fresh binlog directory per run,
  then --put-count puts of 100-byte bodies, at most --window outstanding per connection
  (bench_beanstalk's row-1 loop).  Runs alternate beanstalkd/zstalk, best of --repeats.
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
  answers during its replay shows it there).  Best of --recovery-repeats fills.
  The binlog was just written, so it is read from the page cache: this is warm-cache
  recovery (the CPU cost of the replay), the same for both servers.

The script kills what it started on every way out (finally blocks, plus an atexit hook
and a SIGTERM/SIGHUP handler that SIGKILL every process group it made) and removes the
binlog directories unless --keep.  If zstalkd refuses the binlog flags (before the
binlog lands it exits 5, "the binlog is not supported yet") the zstalk rows are skipped
with its exit status and output, and beanstalkd's figures are still measured.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_beanstalk import (HOST, REPO, Client, Server, best, fill, free_port, log,
                             proc_children, render, timed_load)

POLL_S = 0.01               # recovery: connect / stats retry interval
NAMES = ("beanstalkd", "zstalk")
LIVE: set["BinlogServer"] = set()
SKIPPED: list[str] = []     # why zstalkd would not run with -b, if it would not


def default_zstalkd() -> str:
    here = Path(sys.executable).parent / "zstalkd"
    return str(here if here.exists() else REPO / ".venv" / "bin" / "zstalkd")


def fsync_flags(setting: str) -> list[str]:
    """"50" -> -f 50, "0" -> -f 0 (always fsync), "F" -> -F (never fsync)."""
    return ["-F"] if setting.upper() == "F" else ["-f", str(int(setting))]


# --------------------------------------------------------------------------- processes

def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry))
    return out


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


def filesystem_of(path: str) -> str:
    best_mount, fstype = "", "?"
    with open("/proc/mounts") as f:
        for line in f:
            _dev, mount, kind = line.split()[:3]
            inside = path == mount or path.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) > len(best_mount):
                best_mount, fstype = mount, kind
    return f"{fstype} at {best_mount}"


class BinlogServer(Server):
    """A server with `-b DIR`, run in its own session so kill -9 can take the whole group."""

    def __init__(self, kind: str, binary: str, flags: list[str], base_dir: str):
        self.binlog = tempfile.mkdtemp(prefix=f"bench-binlog-{kind}-", dir=base_dir)
        argv = lambda port: [binary, "-l", HOST, "-p", str(port), "-b", self.binlog, *flags]
        super().__init__(kind, argv, kind)
        self.pgid = 0

    def spawn(self) -> float:
        """Popen on a fresh port; returns the monotonic time just before it."""
        self.port = free_port()
        if self.errfile is None:
            self.errfile = tempfile.TemporaryFile("a+b")   # append: one log across restarts
        LIVE.add(self)
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.argv_fn(self.port), stdin=subprocess.DEVNULL,
                                     stdout=self.errfile, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.pgid = self.proc.pid
        self.start_children = None      # zstalkd's children are not there yet
        return t0

    def check_children(self, where: str) -> None:
        if self.start_children is None and self.alive():
            self.start_children = sorted(proc_children(self.proc.pid))
        super().check_children(where)

    def start(self, timeout: float = 20.0) -> float:
        t0 = self.spawn()
        self.wait_stats(lambda st: True, t0 + timeout)
        self.start_children = sorted(proc_children(self.proc.pid))
        return time.monotonic() - t0

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
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: "
                               f"{self.read_output()[-2000:]!r}")
        if time.monotonic() > deadline:
            seen = last.get("current-jobs-ready", "no stats answer")
            raise RuntimeError(f"{self.name} not there after {deadline - t0:.2f}s (last "
                               f"current-jobs-ready: {seen}); output: "
                               f"{self.read_output()[-2000:]!r}")

    def crash(self, timeout: float = 10.0) -> None:
        """SIGKILL the whole process group and wait until none of it is left."""
        kill_group(self.pgid)
        self.proc.wait(timeout)
        deadline = time.monotonic() + timeout
        while group_members(self.pgid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: processes {group_members(self.pgid)} "
                                   f"survive SIGKILL of their group")
            time.sleep(POLL_S)

    def close(self, where: str, keep: bool) -> list[str]:
        """Stop (SIGTERM, as bench_beanstalk does), kill leftovers, remove the binlog."""
        try:
            if self.proc is not None:
                self.stop(where)
        finally:
            kill_group(self.pgid)
            LIVE.discard(self)
            if not keep:
                shutil.rmtree(self.binlog, ignore_errors=True)
        return self.notes


def kill_group(pgid: int) -> None:
    if pgid:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _kill_all_live() -> None:
    for srv in list(LIVE):
        kill_group(srv.pgid)
        shutil.rmtree(srv.binlog, ignore_errors=True)


def _exit_on_signal(signum, _frame):
    sys.exit(128 + signum)      # runs finally blocks and the atexit hook


# --------------------------------------------------------------------------- rows

class Bench:
    def __init__(self, args, names: list[str]):
        self.args, self.names = args, names
        self.binaries = {"beanstalkd": args.beanstalkd, "zstalk": args.zstalkd}
        self.notes: list[str] = []
        self.results: dict = {}

    def fresh(self, name: str, setting: str) -> BinlogServer:
        extra = ["-s", str(self.args.segment)] if self.args.segment else []
        srv = BinlogServer(name, self.binaries[name], fsync_flags(setting) + extra,
                           self.args.dir)
        try:
            started = srv.start()
            self.results.setdefault("start", {}).setdefault(name, []).append(
                dict(start_s=started))
        except BaseException:
            self.notes += srv.close("start", self.args.keep)
            raise
        return srv

    def orders(self, reps: int):
        for r in range(reps):
            yield r, (self.names if r % 2 == 0 else self.names[::-1])

    def row_put(self):
        a = self.args
        out = self.results.setdefault("put", {})
        for setting in a.fsync.split(","):
            for nc in (1, 8):
                key = f"{' '.join(fsync_flags(setting))}, {nc} conn"
                for r, order in self.orders(a.repeats):
                    for name in order:
                        res = self._one_put(name, setting, nc, f"row1 put {key} rep={r} {name}")
                        out.setdefault(key, {}).setdefault(name, []).append(res)

    def _one_put(self, name: str, setting: str, nc: int, where: str) -> dict:
        a = self.args
        srv = None
        try:
            srv = self.fresh(name, setting)
            res = timed_load(srv, "put", nc, a.put_count, a.window, a.put_cap,
                             gen_procs=a.gen_procs)
            res["binlog_mib"] = disk_usage(srv.binlog)[0] / 2**20
        except Exception as exc:
            res = dict(rate=None, errors=[repr(exc)])
        finally:
            if srv is not None:
                self.notes += srv.close(where, a.keep)
        if res.get("rate") is None:
            log(f"  {where}: ERROR {res['errors']}")
        else:
            log(f"  {where}: {res['rate']:,.0f} puts/s{' (capped)' if res['capped'] else ''}, "
                f"binlog {res['binlog_mib']:.1f} MiB, gen cpu {res['gen_cpu_share']:.2f}, "
                f"server cpu {res['server_cpu_share']:.2f}"
                + (f" ERR {res['errors']}" if res["errors"] else ""))
        return res

    def row_recovery(self):
        a = self.args
        flags = " ".join(fsync_flags(a.recovery_fsync))
        out = self.results.setdefault("recovery", {"jobs": a.jobs, "flags": flags})
        for r, order in self.orders(a.recovery_repeats):
            for name in order:
                where = f"row2 recovery jobs={a.jobs:,} rep={r} {name}"
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
                out.setdefault(name, []).append(res)

    def _one_recovery(self, name: str, where: str) -> dict:
        a = self.args
        srv = self.fresh(name, a.recovery_fsync)
        try:
            t0 = time.monotonic()
            filled = fill(srv, a.jobs, a.window, a.fill_cap, gen_procs=a.gen_procs)
            res = dict(fill_s=time.monotonic() - t0, errors=list(filled["errors"]))
            self._expect_ready(srv, "after the fill")
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
            self.notes += srv.close(where, a.keep)

    def _expect_ready(self, srv, when: str) -> None:
        c = Client(srv.addr, timeout=60)
        try:
            ready = int(c.stats().get("current-jobs-ready", -1))
        finally:
            c.close()
        if ready != self.args.jobs:
            raise RuntimeError(f"{ready} jobs ready {when}, expected {self.args.jobs}")


# --------------------------------------------------------------------------- table

def table_row(metric, b, z, target=None, fmt="{:,.0f}", note=""):
    """One row for bench_beanstalk.render; target is (">=" or "<=", ratio)."""
    ratio = z / b if (b and z is not None) else None
    status = ""
    if target:
        op, thr = target
        status = ("SKIPPED" if SKIPPED and z is None else "MISS (no data)" if ratio is None else
                  "PASS" if (ratio >= thr if op == ">=" else ratio <= thr) else "MISS")
    return dict(metric=metric, beanstalkd=b, zstalk=z, ratio=ratio,
                target=f"ratio {target[0]} {target[1]}x" if target else None,
                status=status, fmt=fmt, note=note)


def build_table(results: dict) -> list[dict]:
    rows = []
    for key, per in results.get("put", {}).items():
        b, z = (best(per.get(n, [])) for n in NAMES)
        rows.append(table_row(f"pipelined put, {key} (puts/s)", b, z, target=(">=", 1.0)))
    rec = results.get("recovery")
    if rec:
        lowest = {n: best(rec.get(n, []), "recovery_s", lowest=True) for n in NAMES}
        rows.append(table_row(f"recovery of {rec['jobs']:,} jobs, {rec['flags']} (s)",
                              lowest["beanstalkd"], lowest["zstalk"], target=("<=", 2.0),
                              fmt="{:,.2f}"))
        starts = results.get("start", {})
        b, z = (best(starts.get(n, []), "start_s", lowest=True) for n in NAMES)
        rows.append(table_row("  start with an empty binlog (s)", b, z, fmt="{:,.2f}"))
        for key, label, fmt in (("first_answer_s", "first stats answer after restart (s)",
                                 "{:,.2f}"),
                                ("fill_s", "fill time before the kill (s)", "{:,.1f}"),
                                ("binlog_mib", "binlog on disk after the fill (MiB)",
                                 "{:,.1f}")):
            b, z = (best(rec.get(n, []), key, lowest=True) for n in NAMES)
            rows.append(table_row(f"  {label}", b, z, fmt=fmt))
    return rows


def collect_errors(results: dict) -> list[str]:
    errs = []
    for row, per in results.items():
        if row == "start":
            continue
        for key, samples in per.items():
            samples = samples.values() if isinstance(samples, dict) else [samples]
            for runs in samples:
                for i, s in enumerate(runs if isinstance(runs, list) else []):
                    if s.get("errors"):
                        errs.append(f"{row}/{key}[{i}]: {s['errors'][:3]}")
    return errs


# --------------------------------------------------------------------------- main

def probe_zstalkd(args) -> str | None:
    """None if zstalkd runs with -b; else why not (exit status and output)."""
    srv = BinlogServer("zstalk", args.zstalkd, fsync_flags("50"), args.dir)
    try:
        srv.start(timeout=30.0)
        return None
    except Exception as exc:
        return f"`{' '.join(srv.argv_fn(srv.port))}`: {exc}"
    finally:
        srv.close("probe", keep=False)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 20k jobs, 20k puts per run, one repetition (<1 min)")
    ap.add_argument("--rows", default="1,2", help="1 = pipelined put, 2 = recovery")
    ap.add_argument("--jobs", type=int, default=None, help="recovery row jobs (1,000,000)")
    ap.add_argument("--fsync", default="50,0",
                    help="row-1 settings: MS for -f MS, F for -F (default 50,0)")
    ap.add_argument("--recovery-fsync", default="50", help="row-2 setting (default 50)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="row-1 repetitions, best taken (default 3; 1 with --quick)")
    ap.add_argument("--recovery-repeats", type=int, default=None,
                    help="row-2 fills per server, best taken (default --repeats)")
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
    ap.add_argument("--json", help="write results as JSON to this path")
    ap.add_argument("--zstalkd", default=default_zstalkd())
    ap.add_argument("--beanstalkd", default="/usr/bin/beanstalkd")
    args = ap.parse_args(argv)
    q = args.quick
    defaults = dict(jobs=20000 if q else 1000000, repeats=1 if q else 3,
                    put_count=20000 if q else 100000,
                    recovery_timeout=60.0 if q else 600.0)
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.recovery_repeats is None:
        args.recovery_repeats = args.repeats
    args.put_cap = 4.0 if q else 15.0
    args.fill_cap = 60.0 if q else 900.0
    return args


def header(args) -> dict:
    git = lambda *a: subprocess.run(["git", "-C", str(REPO), *a], capture_output=True,
                                    text=True).stdout.strip()
    meta = dict(started=time.strftime("%Y-%m-%d %H:%M:%S"), argv=sys.argv[1:],
                quick=args.quick, jobs=args.jobs, repeats=args.repeats,
                recovery_repeats=args.recovery_repeats, window=args.window,
                binlog_fs=filesystem_of(os.path.realpath(args.dir)),
                beanstalkd=subprocess.run([args.beanstalkd, "-v"], capture_output=True,
                                          text=True).stdout.strip(),
                zstalk_commit=git("rev-parse", "--short", "HEAD"),
                zstalk_dirty=bool(git("status", "--porcelain", "--untracked-files=no")),
                nproc=os.cpu_count(), loadavg_before=os.getloadavg())
    log(f"bench_binlog: {meta['beanstalkd']} vs zstalkd {meta['zstalk_commit']}"
        f"{' (dirty tree)' if meta['zstalk_dirty'] else ''}, "
        f"{'quick' if args.quick else 'full'}, binlogs in {args.dir} ({meta['binlog_fs']}), "
        f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}")
    return meta


def report(bench: Bench, args, meta: dict) -> None:
    table = build_table(bench.results)
    text, md = render(table)
    print(f"\n{text}\n\nMarkdown:\n\n{md}\n")
    if "put" in bench.results:
        print(f"put rows: best of {args.repeats} run(s), {args.put_count:,} puts of 100 "
              f"bytes, window {args.window}, fresh server and binlog per run")
    if "recovery" in bench.results:
        print(f"recovery: best of {args.recovery_repeats} fill+kill+restart(s) per server, "
              f"binlog read from a warm page cache")
    capped = [f"{key} {name}" for key, per in bench.results.get("put", {}).items()
              for name, runs in per.items() if any(r.get("capped") for r in runs)]
    if capped:
        print(f"capped at {args.put_cap:.0f}s (rate = puts done / time): {', '.join(capped)}; "
              f"a capped run closes its connections with replies in flight, so a server "
              f"may log 'Connection reset by peer' below")
    errs = collect_errors(bench.results)
    if errs or bench.notes:
        print("\nerrors and notes:")
        for e in errs + bench.notes:
            print("  " + e.replace("\n", "\n    "))
    else:
        print("\nno errors, no server output")
    if args.json:
        with open(args.json, "w") as f:
            clean = [{k: v for k, v in r.items() if k != "fmt"} for r in table]
            json.dump(dict(meta=meta, table=clean, markdown=md, results=bench.results,
                           errors=errs, notes=bench.notes), f, indent=1, default=str)
        print(f"JSON written to {args.json}")


def main(argv=None) -> int:
    args = parse_args(argv)
    atexit.register(_kill_all_live)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    t_start = time.monotonic()
    meta = header(args)
    names = list(NAMES)
    refusal = probe_zstalkd(args)
    if refusal:
        SKIPPED.append(refusal)
        names.remove("zstalk")
        log(f"SKIPPING zstalk rows: zstalkd does not run with -b: {refusal}")
    meta["zstalk_skipped"] = refusal
    bench = Bench(args, names)
    rows = {int(x) for x in args.rows.split(",") if x.strip()}
    for num, label, fn in ((1, "row 1: pipelined put, binlog on", bench.row_put),
                           (2, f"row 2: recovery of {args.jobs:,} jobs", bench.row_recovery)):
        if num in rows:
            log(f"{label} ...")
            t0 = time.monotonic()
            fn()
            log(f"  ({time.monotonic() - t0:.1f}s)")
    meta.update(elapsed_s=time.monotonic() - t_start, loadavg_after=os.getloadavg())
    report(bench, args, meta)
    if refusal:
        print(f"\nzstalk rows SKIPPED: {refusal}")
    print(f"\ntotal time {meta['elapsed_s']:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
