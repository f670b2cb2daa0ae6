#!/usr/bin/env python3
"""Benchmark zstalk's cron schedules: how late 1,000 every-second schedules fire.

Usage:
    scripts/bench_schedules.py [--quick | --smoke] [--repeats N] [--warmup N]
        [--against REF] [--json PATH] [--schedules N] [--window S] [--fronts 0,1]

Target (the issue): fire lateness p99 <= 10 ms with 1,000 schedules firing every second
(`* * * * * ?`) on an otherwise idle broker.  A run takes the window plus ~6 s; a full
run is (--warmup + --repeats) x placements x builds runs; --quick (200 schedules, a 3 s
window, one run each) about 20 s.

Method
------
What every row shares (free loopback ports, alternation, medians with their min-max, the
machine check, stopping what was started, --against) is in scripts/harness/__init__.py.
Each run of each placement (and build) gets a fresh `zstalk serve -l 127.0.0.1 -p P
--counter-port 0 --worker-bind none --config C --http-port H [--fronts 1]` in a temp
dir, with the config `[functions] base_url = "http://127.0.0.1:9/fn"`: nothing is ever
called, since every fire's task is enqueued with `options: {"delay": 3600000}` and only
queues.  No binlog.  The run begins
once `GET /v1/tasks/x` answers the broker's 404.
* `--fronts 0` (default placement): broker, HTTP front and dispatcher in one process;
* `--fronts 1`: the same server supervised, the broker, the HTTP front and the
  dispatcher each in a process of its own.  The broker does the firing either way.

--schedules (1,000; 200 --quick) schedules `s0000`, `s0001`, ... are made with `POST
/v1/schedules` (8 in flight, keep-alive), all with the cron `* * * * * ?` in UTC and
ONE function name, `tick`: the usual shape (many schedules, one handler), and nothing
here depends on the name: the schedule a task came from is known from its uniqueId
(below), and delayed tasks wait in one timer list whatever their function, so the name
count should not change the cost of a fire.  Once the last one is made, the window is
the --window (10 s; 3 s --quick) whole seconds W0 .. W1-1 starting at the second after
the next one, so every schedule exists for a full second before it counts.

Which fire a task is: the broker gives a fire's task the uniqueId
`zstalk.broker.core.schedules.schedules.fire_id(name, fire time)`, the first 32 hex digits of
sha256("<name>\\0<fire time in ms>"); this script computes that id (fire_id below, the
same formula: a benchmark imports no zstalk module; if zstalk's ever changes, every task
shows up as matching no schedule) for
every schedule and every whole second from before the first schedule to the census, so
each task is matched to its schedule and its exact fire time (a task matching none is an
error).  Each (schedule, second) of the window must have exactly one task: none is a
MISSING fire (reported, with the first few), and a schedule with two tasks created
within the same whole second is a DOUBLED fire (a catch-up burst).  A repeated fire of
the same time cannot show up at all: its uniqueId makes the broker refuse it.

Lateness of a fire = its task's `createdAt` minus its fire time.  The census runs 2 s
after the last fire time of the window (a fire later than that counts as missing) and
pages through `GET /v1/tasks?limit=1000&after=<next>` until it has passed the tasks that
existed when it began (the schedules keep firing meanwhile).  `createdAt` is RFC 3339 with
MILLISECONDS, truncated: a lateness of 0 ms means under 1 ms, 3 ms means 3.000-3.999 ms.
It is the broker's `now` (its monotonic clock plus its wall-clock offset, the same clock
the fire times are reckoned in) at the START of the loop turn that fired the task.
Every schedule due at second S fires in that one turn, so all N fires of a second carry
the same createdAt and the percentiles over fires are percentiles over seconds weighted
by N: in any window under 100 s the p99 is the worst second's lateness.

createdAt does not include the time the turn takes to enqueue the batch (the last task of
a second is enqueued, and visible to clients, only at the turn's end).  So each second
is also measured from outside without touching the broker: the broker's main thread's
CPU time and run-queue wait (/proc/<pid>/task/<pid>/schedstat, nanoseconds) are read
0.3 s before W0 and 0.7 s after each fire second; the difference for a second is "batch
busy": an upper bound on the firing turn's length (it also holds the turn that looks at
the wall clock, the other timers and, in one process, the idle fronts: a few tenths of a
ms).  "last fire" = that second's createdAt lateness + its batch busy time: about when
the last task of the batch was enqueued.  No client polls during the window: a request
would run a broker turn, and a turn fires whatever is due, so polling would make the
broker look more punctual than it is.

CPU check over [W0 - 0.3 s, W1 - 0.3 s) (exactly the window's fires): CPU seconds / wall
seconds of the broker process (the schedstat of all its threads, in ns: /proc/<pid>/stat
counts 10 ms ticks, too coarse here), of the whole server (its process tree), of this
script, and of everything else on the machine (harness procs.ShareMeter): "others" well
above 0 means another tenant took CPU during the window.  The broker's CPU-seconds per
1,000 fires are given too.  The load average is read before and after each run.

The table gives, per placement, the medians over the runs of each run's figures: the
p99 row is PASS when it is at most 10 ms, the missing + doubled row when it is 0.

What a server wrote beyond its start-up line and exit statuses other than 0 / SIGTERM
are reported.
"""
from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime

from harness.cli import Run, log, parser, sized
from harness.http import JSON_HEADERS, client, http_status, run_async
from harness.procs import HOST, Proc, ShareMeter, children, cmdline, free_port, wait_until, \
    zstalk_keep
from harness.stats import Figure, per_1k, rounds
from harness.table import Table
from harness.venv import use_project_venv

CRON = "* * * * * ?"
FUNCTION = "tick"
CONFIG = '[functions]\nbase_url = "http://127.0.0.1:9/fn"\n'
HOUR_MS = 3_600_000
TARGET_P99_MS = 10.0
CREATE_INFLIGHT = 8
LEAD_S = 0.3            # the per-second readings are taken at S - LEAD_S ... S + 1 - LEAD_S
GRACE_S = 2.0           # the census begins this long after the window's last fire time
CENSUS_PAGE = 1000
FIRST_ERRORS = 5        # missing fires and such: how many to name


def fire_id(name: str, at: float) -> str:
    """The uniqueId of the task a fire enqueues (zstalk.broker.core.schedules.schedules.fire_id's formula)."""
    return hashlib.sha256(f"{name}\0{round(at * 1000)}".encode()).hexdigest()[:32]


# --------------------------------------------------------------------------- the server

def schedstat_ns(pid: int, tid: int | None = None) -> tuple[int, int]:
    """(CPU time, run-queue wait) of thread `tid` of `pid` (its main thread: None), in ns."""
    with open(f"/proc/{pid}/task/{tid or pid}/schedstat") as f:
        run_ns, wait_ns, _ = f.read().split()
    return int(run_ns), int(wait_ns)


def process_cpu_s(pid: int) -> float:
    """CPU seconds of the live threads of `pid` (schedstat: ns, where /proc/<pid>/stat
    counts 10 ms ticks; threads that ended are not counted)."""
    try:
        return sum(schedstat_ns(pid, int(tid))[0] for tid in os.listdir(f"/proc/{pid}/task")
                   ) / 1e9
    except (OSError, ValueError):
        return 0.0


class Server:
    """One fresh `zstalk serve` (fronts 0: one process; N: supervised children)."""

    def __init__(self, build, tmp: str, fronts: int) -> None:
        self.fronts = fronts
        self.config = os.path.join(tmp, "zstalk.toml")
        with open(self.config, "w") as f:
            f.write(CONFIG)
        self.http_port = free_port()
        self.api = f"http://{HOST}:{self.http_port}"
        self.proc = Proc(f"{build.label} serve --fronts {fronts}", [
            build.exe("zstalk"), "serve", "-l", HOST, "-p", free_port(), "--counter-port", "0",
            "--worker-bind", "none", "--config", self.config,
            "--http-port", self.http_port, "--fronts", fronts], cwd=tmp, keep=zstalk_keep)
        wait_until(lambda: http_status(f"{self.api}/v1/tasks/x") == 404, "zstalk HTTP API",
                   [self.proc])
        self.broker_pid = self.proc.pid if fronts == 0 else self._broker_child()

    def _broker_child(self) -> int:
        """The supervised `zstalk broker --bind ...` child."""
        for pid in children(self.proc.pid):
            argv = cmdline(pid)
            if "broker" in argv and "--bind" in argv:
                return pid
        raise RuntimeError("no broker child under the supervisor")

    def stop(self, notes: list[str]) -> None:
        self.proc.stop(notes)


# --------------------------------------------------------------------------- HTTP

async def make_schedules(api: str, names: list[str], errors: list[str]) -> None:
    url = f"{api}/v1/schedules"
    todo = iter(names)

    async def lane(session):
        for name in todo:
            body = json.dumps({"name": name, "cron": CRON, "function": FUNCTION,
                               "options": {"delay": HOUR_MS}}).encode()
            async with session.post(url, data=body, headers=JSON_HEADERS) as r:
                text = await r.read()
            if r.status != 201:
                errors.append(f"POST /v1/schedules {name}: {r.status} {text[:200]!r}")
    async with client(CREATE_INFLIGHT) as session:
        await asyncio.gather(*(lane(session) for _ in range(CREATE_INFLIGHT)))


def epoch_ms(rfc3339: str) -> int:
    """'2026-11-24T20:30:00.123Z' -> 1795552200123."""
    return round(datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000)


async def census(api: str) -> list[tuple[str, int]]:
    """(uniqueId, createdAt ms) of every task that existed when it began, oldest first."""
    began_ms = time.time() * 1000
    out, after = [], None
    async with client(1) as session:
        while True:
            query = f"{api}/v1/tasks?limit={CENSUS_PAGE}" + (f"&after={after}" if after else "")
            async with session.get(query) as r:
                if r.status != 200:
                    raise RuntimeError(f"GET {query}: {r.status} {(await r.read())[:200]!r}")
                page = await r.json()
            out += [(t["uniqueId"], epoch_ms(t["createdAt"])) for t in page["tasks"]]
            if page["next"] is None or (out and out[-1][1] > began_ms):
                return out
            after = page["next"]


# --------------------------------------------------------------------------- measuring

def sleep_until(wall: float) -> None:
    delay = wall - time.time()
    if delay > 0:
        time.sleep(delay)


def watch_window(server: Server, w0: int, w1: int) -> tuple[list[dict], dict]:
    """Per fire second S of [w0, w1): the broker main thread's CPU and run-queue wait (ms)
    from S - LEAD_S to S + 1 - LEAD_S; and the CPU check over the whole window."""
    meter = ShareMeter(reader=process_cpu_s, broker=lambda: [server.broker_pid],
                       server=server.proc.pids)
    sleep_until(w0 - LEAD_S)
    meter.start()
    last = schedstat_ns(server.broker_pid)
    seconds = []
    for s in range(w0, w1):
        sleep_until(s + 1 - LEAD_S)
        server.proc.check()
        now = schedstat_ns(server.broker_pid)
        seconds.append(dict(second=s, cpu_ms=(now[0] - last[0]) / 1e6,
                            wait_ms=(now[1] - last[1]) / 1e6))
        last = now
    meter.stop()
    return seconds, dict(meter.shares, broker_cpu_s=meter.cpu["broker"])


# --------------------------------------------------------------------------- analysis

def percentile(ordered: list, q: float):
    """Nearest rank: the smallest value with at least q of the values at or below it."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else None


def identify(names: list[str], lo: int, hi: int) -> dict[str, tuple[str, int]]:
    """uniqueId -> (schedule, fire second) for every whole second in [lo, hi]."""
    return {fire_id(n, float(s)): (n, s) for n in names for s in range(lo, hi + 1)}


def analyse(tasks: list[tuple[str, int]], names: list[str], first_s: int, w0: int, w1: int,
            seconds: list[dict]) -> dict:
    last_ms = max((c for _, c in tasks), default=w1 * 1000)
    ids = identify(names, first_s, last_ms // 1000 + 1)
    late: dict[tuple[str, int], list[int]] = collections.defaultdict(list)
    per_created: collections.Counter = collections.Counter()
    unknown = []
    for uid, created in tasks:
        hit = ids.get(uid)
        if hit is None:
            unknown.append(uid)
            continue
        late[hit].append(created - hit[1] * 1000)
        if w0 * 1000 <= created < w1 * 1000:
            per_created[hit[0], created // 1000] += 1
    expected = [(n, s) for s in range(w0, w1) for n in names]
    missing = [key for key in expected if key not in late]
    values = sorted(v for key in expected for v in late.get(key, ()))
    doubled = sorted(key for key, c in per_created.items() if c > 1)
    add_lateness(seconds, late, names)
    errors = []
    if missing:
        errors.append(f"{len(missing):,} fires missing, e.g. " + ", ".join(
            f"{n} at {_hms(s)}" for n, s in missing[:FIRST_ERRORS]))
    if doubled:
        errors.append(f"{len(doubled):,} doubled fires (two tasks of a schedule created in "
                      "one second), e.g. " + ", ".join(f"{n} at {_hms(s)}"
                                                       for n, s in doubled[:FIRST_ERRORS]))
    if unknown:
        errors.append(f"{len(unknown):,} tasks match no schedule's fire at a whole second, "
                      f"e.g. {unknown[:3]}")
    over_1s = sum(1 for v in values if v >= 1000)
    if over_1s:
        errors.append(f"{over_1s:,} fires were 1 s or more late")
    last = sorted(r["last_fire_ms"] for r in seconds if r["last_fire_ms"] is not None)
    busy = sorted(r["cpu_ms"] + r["wait_ms"] for r in seconds)
    return dict(expected=len(expected), seen=len(values), missing=len(missing),
                doubled=len(doubled), unknown=len(unknown), late_1s=over_1s,
                tasks_listed=len(tasks),
                lateness_ms={q: percentile(values, p) for q, p in PCTS},
                busy_ms=dict(p50=percentile(busy, 0.5), max=busy[-1] if busy else None),
                last_fire_ms=dict(p50=percentile(last, 0.5), max=last[-1] if last else None),
                errors=errors)


PCTS = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99), ("max", 1.0))


def add_lateness(seconds: list[dict], late: dict, names: list[str]) -> None:
    """Each second's fires and lateness, and its last fire: lateness + batch busy."""
    for rec in seconds:
        vals = [v for n in names for v in late.get((n, rec["second"]), ())]
        rec.update(fires=len(vals), lateness_ms_max=max(vals, default=None),
                   lateness_ms_min=min(vals, default=None))
        busy = rec["cpu_ms"] + rec["wait_ms"]
        rec["last_fire_ms"] = None if not vals else round(max(vals) + busy, 3)


def _hms(second: int) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(second))


# --------------------------------------------------------------------------- one run

def run_placement(args, build, fronts: int, tmp: str, notes: list[str]) -> dict:
    """One fresh server: make the schedules, watch the window, take the census, stop.
    What the server wrote and how it exited go to `notes`."""
    load0 = os.getloadavg()
    names = [f"s{i:04d}" for i in range(args.schedules)]
    errors: list[str] = []
    server = None
    try:
        server = Server(build, tmp, fronts)
        first_s = math.floor(time.time())
        t0 = time.monotonic()
        run_async(make_schedules(server.api, names, errors))
        made_s = time.monotonic() - t0
        w0 = math.floor(time.time()) + 2
        w1 = w0 + args.window
        log(f"  {len(names):,} schedules made in {made_s:.2f} s; window "
            f"{_hms(w0)}-{_hms(w1)} UTC")
        seconds, cpu = watch_window(server, w0, w1)
        sleep_until(w1 - 1 + GRACE_S)
        tasks = run_async(census(server.api))
    finally:
        if server is not None:
            server.stop(notes)
    result = analyse(tasks, names, first_s - 1, w0, w1, seconds)
    if errors:
        result["errors"].insert(0, f"{len(errors):,} schedules not made: "
                                + "; ".join(errors[:FIRST_ERRORS]))
    result.update(fronts=fronts, schedules=len(names), window_s=args.window,
                  create_s=round(made_s, 3), cpu=cpu, seconds=seconds,
                  loadavg_before=load0, loadavg_after=os.getloadavg(),
                  cpu_per_1k=per_1k(cpu["broker_cpu_s"], result["seen"]),
                  wrong=result["missing"] + result["doubled"] + result["unknown"])
    result.update({f"lateness_{k}": v for k, v in result["lateness_ms"].items()},
                  last_fire_max=result["last_fire_ms"]["max"], busy_max=result["busy_ms"]["max"])
    lat = result["lateness_ms"]
    log(f"  fires {result['seen']:,}/{result['expected']:,}, lateness p50 {lat['p50']} p99 "
        f"{lat['p99']} max {lat['max']} ms, last fire max {result['last_fire_ms']['max']} "
        f"ms, broker cpu {cpu['broker_cpu_share']:.3f}, others {cpu['others_cpu_share']:.2f}"
        + (f"; ERRORS {result['errors'][:2]}" if result["errors"] else ""))
    return result


# --------------------------------------------------------------------------- report

ROWS = [("lateness_p50", "lateness p50 (ms)", "{:,.0f}"),
        ("lateness_p99", "lateness p99 (ms)", "{:,.0f}"),
        ("lateness_max", "lateness max (ms)", "{:,.0f}"),
        ("last_fire_max", "last fire of a batch, max (ms)", "{:,.1f}"),
        ("busy_max", "batch busy, max (ms)", "{:,.1f}"),
        ("wrong", "fires missing + doubled + unknown, all runs together", "{:,.0f}"),
        ("cpu_per_1k", "broker CPU-s per 1,000 fires", "{:.4g}")]


def build_table(run: Run, results: dict) -> Table:
    now = run.labels()[0]
    t = Table("schedules", "Cron schedules: how late every-second schedules fire",
              [(b, b) for b in run.labels()], run.against_ratios(), note=(
                  f"{run.args.schedules:,} schedules `{CRON}` in one broker (their tasks "
                  f"delayed an hour, so they only queue), {run.args.window} whole seconds per "
                  "run; lateness = a task's `createdAt` (ms, truncated) − its fire time, over "
                  "every fire of the window; the last fire of a batch adds the broker's busy "
                  "time in that second (its main thread's CPU and run-queue wait)."))
    for fronts, per in results.items():
        head = (f"`serve --fronts {fronts}`, {run.args.schedules:,} × `{CRON}`, "
                f"{run.args.window} s: ")
        for key, label, fmt in ROWS:
            target = ((now, "<=", TARGET_P99_MS, f"<= {TARGET_P99_MS:g} ms")
                      if key == "lateness_p99" else (now, "<=", 0, "none")
                      if key == "wrong" else None)
            cells = {b: Figure.of(runs, key) for b, runs in per.items()}
            if key == "wrong":      # (a correctness count: one bad run is a miss, no median)
                cells = {b: Figure([sum(fig.samples)]) for b, fig in cells.items()}
            t.add(head + label, cells, fmt=fmt, target=target, ratio=key == "cpu_per_1k")
    return t


def per_second(results: dict) -> list[str]:
    """Each run's seconds: lateness + busy (ms), the detail behind the table."""
    out = ["lateness = createdAt - fire time over every fire of the window; createdAt has "
           "millisecond resolution (truncated: 0 ms means under 1 ms) and is the start of the "
           "broker turn that fired the whole second's batch, so p99 = the worst second; last "
           "fire = that plus the batch's busy time (broker main thread CPU + run-queue wait in "
           "that second, /proc schedstat)."]
    for fronts, per in results.items():
        for build, runs in per.items():
            for i, r in enumerate(runs):
                secs = ", ".join(f"{s['lateness_ms_max']}+{s['cpu_ms'] + s['wait_ms']:.1f}"
                                 for s in r["seconds"])
                out.append(f"  --fronts {fronts}, {build}, run {i + 1}: per second, lateness + "
                           f"busy (ms): {secs}; broker CPU {r['cpu']['broker_cpu_share']:.3f}, "
                           f"others {r['cpu']['others_cpu_share']:.2f}; schedules made in "
                           f"{r['create_s']:.2f} s; {r['tasks_listed']:,} tasks listed")
    return out


# --------------------------------------------------------------------------- main

def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--schedules", type=int, default=None,
                    help="every-second schedules (1,000; 200 with --quick)")
    ap.add_argument("--window", type=int, default=None,
                    help="fire seconds measured (10; 3 with --quick)")
    ap.add_argument("--fronts", default="0,1", help="placements: `serve --fronts N` for each N")
    args = ap.parse_args(argv)
    sized(args, schedules=(1000, 200, 50), window=(10, 3, 1))
    run = Run("bench_schedules", args)
    results: dict = {}
    builds = {b.label: b for b in run.builds}
    for fronts in [int(x) for x in args.fronts.split(",") if x.strip()]:
        per = results.setdefault(fronts, {})
        for rep, order, warm in rounds(list(builds), args.repeats, args.warmup):
            for label in order:
                log(f"{label} serve --fronts {fronts}, {'warm-up' if warm else f'run {rep + 1}'}")
                tmp = tempfile.mkdtemp(prefix="bench_schedules_")
                notes: list[str] = []
                try:
                    res = run_placement(args, builds[label], fronts, tmp, notes)
                    if not warm:
                        per.setdefault(label, []).append(res)
                except Exception as exc:
                    notes.append(f"aborted: {exc!r}")
                    log(f"  aborted: {exc!r}")
                finally:
                    run.notes += [f"{label} --fronts {fronts}: {n}" for n in notes]
                    shutil.rmtree(tmp, ignore_errors=True)
    return run.report([build_table(run, results)], results, per_second(results))


if __name__ == "__main__":
    use_project_venv()
    sys.exit(main())
