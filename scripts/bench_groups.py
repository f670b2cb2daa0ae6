#!/usr/bin/env python3
"""Benchmark tenant groups (issue 44): their cost with 10,000 groups, and fairness in real time.

Usage:
    scripts/bench_groups.py [--quick | --smoke] [--repeats N] [--warmup N] [--against REF]
        [--json PATH] [--parts 1,2] [--tasks N] [--groups G] [--forms arrays,single]
        [--big N] [--small N] [--call-ms MS] [--time-cap S]

Targets (issue 44): with 10,000 groups a task costs the broker at most 10 % more CPU than
in a function without groups (enqueue and hand-out apart), and against the commit
before groups (--against 8b6a864^); each task of a small group starts within one task
of a big group's.  A full run should take about 10 minutes on 2 cores with --against (an
estimate from --quick's 50 s), --smoke about 10 s.  Run it on a quiet machine: its
figures are CPU-seconds per task, and a 10 % target wants little else running.

Method
------
What every row shares (free loopback ports, fresh processes per run, alternation with
warm-up, medians with their min-max, the machine check, stopping what was started,
--against) is in scripts/harness/__init__.py.  ONE function host serves the whole run:
an aiohttp process (uvloop, keep-alive) that logs every call of `POST /{name}` (answered
200 at once) and of `POST /slow/{name}` (answered after --call-ms, 20 ms): its arrival
(time.monotonic(), the system-wide clock, on receipt of the request line and headers),
its task's group (the params' "g", which the benchmark sets to the task's group) and
the X-Zstalk-Task-Id header, so each run checks that every task was called once.

zstalk is bench_limits.py's split placement, fresh for every run and for each build:
`zstalk broker --bind tcp://127.0.0.1:B --config C` and `zstalk front http --broker ...
--listen 127.0.0.1:H`, and `zstalk dispatcher --broker ... --slots 64` when a part says,
ready once the API answers and the dispatcher holds a TCP connection to the broker.  C
has `[functions] base_url = "<host>"`, `base_url_any = true`, `concurrency = 256`,
`timeout = "30s"`, no master key (loopback: every option is allowed).  A build whose
tree has no option `group` (before issue 44) runs the rows without groups only.

* Part 1, cost.  Broker and front, no dispatcher: 200 untimed tasks of another function
  (an hour's delay) open the connections, then --tasks (20,000; 5,000 --quick, 2,000
  --smoke) due tasks are POSTed, in one of two --forms: `arrays` of 1,000 (the API's
  maximum, 2 in flight, as a producer with many does) or `single` POSTs (one task each,
  32 in flight, as one user's request enqueues one); either with no group option, or
  task i in the group `g{i mod G}` (G = --groups, 10,000: every group two tasks at
  20,000).  Enqueue: the clock and the CPU meter run from the first send to the last
  answer.  Then one dispatcher is started and the meter runs again until the host has
  seen every call and `GET /v1/functions/F` says none queued or running: the hand-out.
  A census of the tasks (`GET /v1/tasks?function=F`, after the meter) must find every
  one `success`.  Rows: enqueue tasks/s; hand-out calls/s as the host saw them, (calls -
  1) / (last call - first call) (the dispatcher's start-up is not in it); for each the
  broker's CPU-seconds per 1,000 tasks (the CPU time of its threads over the metered
  part, from /proc/<pid>/task/*/schedstat in ns: /proc/<pid>/stat counts 10 ms ticks,
  3 % of a 20,000-task enqueue; the dispatcher's start-up is in no broker figure); and
  the generator's own CPU (cores, 1.00 = one: near it the client limits the rate, never
  the CPU per task).  Ratios: G groups / no groups of this tree (target <= 1.10 on the
  CPU rows), and with --against, this tree's to REF's without groups.  Lines under the
  table give each repetition's own CPU ratio (its runs ran side by side), so its spread
  shows.
* Part 2, fairness.  One dispatcher, `[functions.F] url = "<host>/slow/F"`,
  `concurrency = 1`: --big (10,000; 2,000 --smoke) tasks of group "big" in arrays; once
  big's first call has come, --small (20; 10 --quick, 3 --smoke) tasks of group "small",
  one POST a second.  For each of small's tasks: how many of big's calls arrived at the
  host after its 201 came back (the broker had it by then) and before small's own call
  arrived; target at most 1 (the rotation puts a group that joins after the group whose
  turn comes next, so 1 is the design's figure: scripts/profile_rotation.py --fairness
  gets exactly 1 on the store's fake clock).  Counted from the POST's send instead, a
  big call that arrived during the POST counts too, though the broker may have handed
  it out before it had small's task: that count is an upper bound, shown beside.  Rows:
  the most and the median over small's tasks, how many of them had 0, 1, 2 or more,
  the median and most time from send to small's call (ms), the most waitNum small's
  201s said, and big's calls in the run (big must still have tasks queued at the end, or
  the run proves nothing).  A run ends once small's last call has come, or at
  --time-cap + --small seconds (flagged capped).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
import shutil
import sys
import tempfile
import time
import urllib.request

from bench_limits import Placement, config
from bench_schedules import process_cpu_s
from bench_tasks import RESULT, FunctionHost, census, post_batches, post_many
from bench_upstreams import roles
from harness.cli import Run, ints, parser, sized
from harness.http import JSON_HEADERS, batches, client, loop_factory, run_async, task_body
from harness.procs import HOST, Proc, ShareMeter
from harness.runs import Runs, run_parts
from harness.stats import Figure, median, paired, per_1k, ratios_text
from harness.table import Table, cpu_shares
from harness.venv import use_project_venv

ARRAY, ARRAY_INFLIGHT = 1000, 2
SINGLE_INFLIGHT = 32
WARM_TASKS = 200
HOUR_MS = 3_600_000
POLL_S = 0.05
NONE = "no groups"
FORMS = {"arrays": f"arrays of {ARRAY:,}, {ARRAY_INFLIGHT} in flight",
         "single": f"single POSTs, {SINGLE_INFLIGHT} in flight"}
METERED = ("broker", "front", "gen", "host", "others")


# --------------------------------------------------------------------------- function host

def function_host_main(port: int, call_ms: float) -> None:
    """The logging function host (`--function-host PORT`, a child of this script)."""
    from aiohttp import web

    calls: dict[str, list] = collections.defaultdict(list)     # name -> [[t, group, i]]
    ids: dict[str, set] = collections.defaultdict(set)

    async def call(request: web.Request) -> web.Response:
        now = time.monotonic()
        name = request.match_info["name"]
        params = json.loads(await request.read())
        calls[name].append([now, params.get("g", ""), params.get("i")])
        ids[name].add(request.headers.get("X-Zstalk-Task-Id"))
        if request.path.startswith("/slow/"):
            await asyncio.sleep(call_ms / 1000.0)
        return web.Response(body=RESULT, content_type="application/json")

    async def seen(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        log = calls.get(name, [])
        out = {"calls": len(log), "ids": len(ids.get(name, set()) - {None})}
        if log:
            out["first"], out["last"] = log[0][0], log[-1][0]
        if request.query.get("log"):
            out["log"] = log
        return web.json_response(out)

    app = web.Application()
    app.router.add_get("/_calls/{name}", seen)
    app.router.add_post("/slow/{name}", call)
    app.router.add_post("/{name}", call)
    web.run_app(app, host=HOST, port=port, access_log=None, print=None, loop=loop_factory())


class LogHost(FunctionHost):
    def __init__(self, call_ms: float) -> None:
        super().__init__(__file__, "--call-ms", call_ms)

    def seen(self, name: str, log: bool = False) -> dict:
        """{"calls", "ids", "first", "last"[, "log": [[t, group, i], ...]]} of `name`."""
        url = f"{self.url}/_calls/{name}" + ("?log=1" if log else "")
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())


def supports_groups(build) -> bool:
    """Whether the build's tree takes the option `group` (read from its source: a
    benchmark imports no zstalk module)."""
    try:
        text = (build.root / "protocol" / "schema" / "tasks.py").read_text()
    except OSError:
        return True             # (moved: the run says so if the option is refused)
    options = re.search(r"^OPTIONS = \((.*?)\)", text, re.M | re.S)
    return options is None or '"group"' in options.group(1)


# --------------------------------------------------------------------------- part 1

async def enqueue(z, name: str, n: int, form: str, group, meter: ShareMeter) -> dict:
    """The metered enqueue of n due tasks of `name` (task i in group(i), or none)."""
    errors: list[str] = []
    url = f"{z.api}/v1/tasks"
    async with client(SINGLE_INFLIGHT) as http:
        warm = [json.dumps(task_body(name + "_warm", i, HOUR_MS)).encode()
                for i in range(WARM_TASKS)]
        await post_many(http, url, warm, SINGLE_INFLIGHT, 201, errors)
        if form == "arrays":
            bodies = batches(name, n, None, ARRAY, group)
            t0 = meter.start()
            ok = await post_batches(http, url, bodies, ARRAY_INFLIGHT, errors)
        else:
            bodies = [json.dumps(task_body(name, i, None, group and group(i))).encode()
                      for i in range(n)]
            t0 = meter.start()
            ok = await post_many(http, url, bodies, SINGLE_INFLIGHT, 201, errors)
        t1 = meter.stop()
    return dict(enq_count=ok, enq_s=round(t1 - t0, 4), enq_rate=ok / (t1 - t0),
                enq_cpu_per_1k=per_1k(meter.cpu["broker"], ok),
                enq_front_cpu_per_1k=per_1k(meter.cpu["front"], ok),
                **meter.shares, errors=errors)


def function_idle(api: str, name: str) -> bool:
    with urllib.request.urlopen(f"{api}/v1/functions/{name}", timeout=10) as r:
        info = json.loads(r.read())
    return info["queued"] == 0 and info["running"] == 0


def hand_out(z, host: LogHost, name: str, n: int, cap_s: float) -> dict:
    """Start one dispatcher and meter the broker until every call is made and done."""
    meter = ShareMeter(process_cpu_s, **roles(z), host=lambda: [host.proc.pid])
    meter.start()
    z.add_dispatchers(1)
    deadline, capped = time.monotonic() + cap_s, False
    while host.seen(name)["calls"] < n or not function_idle(z.api, name):
        if time.monotonic() > deadline:
            capped = True
            break
        time.sleep(POLL_S)
    meter.stop()
    seen = host.seen(name)
    span = seen.get("last", 0.0) - seen.get("first", 0.0)
    out = dict(out_calls=seen["calls"], out_rate=(seen["calls"] - 1) / span if span > 0 else None,
               out_cpu_per_1k=per_1k(meter.cpu["broker"], seen["calls"]), capped=capped)
    out.update({f"out_{k}": v for k, v in meter.shares.items()})
    return out


# --------------------------------------------------------------------------- part 2

async def fairness(z, host: LogHost, name: str, big: int, small: int, cap_s: float) -> dict:
    """Part 2's run: big's backlog, then small's tasks one a second; the figures."""
    errors: list[str] = []
    url = f"{z.api}/v1/tasks"
    deadline = time.monotonic() + cap_s
    async with client(4) as http:
        await post_batches(http, url, batches(name, big, None, ARRAY, lambda i: "big"),
                           ARRAY_INFLIGHT, errors)
        while host.seen(name)["calls"] == 0:
            if time.monotonic() > deadline:
                raise RuntimeError("big's first call did not come")
            await asyncio.sleep(POLL_S)
        sent, answered, waits = await post_small(http, url, name, small, errors)
    log, capped = await calls_of_small(host, name, small, deadline)
    started = {i: t for t, g, i in log if g == "small"}
    bigs = [t for t, g, _ in log if g == "big"]
    if len(bigs) >= big:
        errors.append(f"big's {big:,} tasks all ran: no backlog to be fair against")
    return fairness_figures(
        [sum(1 for t in bigs if answered[k] < t < started[k]) for k in sorted(started)],
        [sum(1 for t in bigs if sent[k] < t < started[k]) for k in sorted(started)],
        [(started[k] - sent[k]) * 1000 for k in sorted(started)], waits, len(bigs), capped,
        errors)


async def post_small(http, url: str, name: str, small: int, errors: list[str]):
    """small's tasks, one POST a second: when each was sent and answered (monotonic),
    and the waitNum each 201 said."""
    sent, answered, waits = {}, {}, []
    t_first = time.monotonic() + 1.0
    for k in range(small):
        await asyncio.sleep(max(0.0, t_first + k - time.monotonic()))
        body = json.dumps(task_body(name, k, None, "small")).encode()
        sent[k] = time.monotonic()
        async with http.post(url, data=body, headers=JSON_HEADERS) as r:
            answer = await r.json()
        answered[k] = time.monotonic()
        if r.status != 201:
            errors.append(f"small's task {k}: {r.status} {answer}")
        waits.append(answer.get("waitNum"))
    return sent, answered, waits


async def calls_of_small(host: LogHost, name: str, small: int, deadline: float):
    """The host's log of `name` once all of small's calls are in it (or at the deadline:
    capped)."""
    while True:
        log = host.seen(name, log=True)["log"]
        if sum(1 for _, g, _ in log if g == "small") >= small:
            return log, False
        if time.monotonic() > deadline:
            return log, True
        await asyncio.sleep(POLL_S)


def fairness_figures(between: list[int], upper: list[int], late_ms: list[float], waits: list,
                     bigs: int, capped: bool, errors: list[str]) -> dict:
    """between: for each of small's tasks, big's calls after its 201 and before its call;
    upper: the same from the POST's send (a big call during the POST may have started
    before the broker had small's task, or after)."""
    counts = collections.Counter(min(b, 2) for b in between)
    known = [w for w in waits if w is not None]
    return dict(between=between, upper=upper, started=len(between),
                max_between=max(between, default=None), median_between=median(between),
                max_upper=max(upper, default=None), with_0=counts[0], with_1=counts[1],
                with_2_or_more=counts[2], median_ms=median(late_ms),
                max_ms=max(late_ms, default=None), median_wait_num=median(known),
                max_wait_num=max(known, default=None), big_started=bigs, capped=capped,
                errors=errors)


# --------------------------------------------------------------------------- the runs

class Bench(Runs):
    def __init__(self, run: Run, host: LogHost, tmp: str) -> None:
        super().__init__(run, ("cost", "fairness"),
                         ("enq_rate", "enq_cpu_per_1k", "out_rate", "out_cpu_per_1k",
                          "max_between", "median_ms"))
        self.host, self.tmp = host, tmp
        self.grouped = [b for b in run.builds if supports_groups(b)]
        for b in run.builds:
            if b not in self.grouped:
                run.notes.append(f"{b.label} has no option group: its rows without groups only")

    def groups_label(self) -> str:
        return f"{min(self.args.groups, self.args.tasks):,} groups"

    def column(self, build, grouped: bool) -> str:
        return f"{build.label}: {self.groups_label() if grouped else NONE}"

    def check(self, name: str, s: dict, calls: int) -> None:
        seen = self.host.seen(name)
        if seen["calls"] != calls or seen["ids"] != calls:
            s["errors"].append(f"the host saw {seen['calls']:,} calls of {seen['ids']:,} "
                               f"distinct tasks, not {calls:,}")

    def cost(self) -> None:
        rows = []
        for form in self.args.forms:
            systems = [self.cost_system(b, grouped, form) for b in self.run.builds
                       for grouped in ((False, True) if b in self.grouped else (False,))]
            rows.append((FORMS[form], systems))
        self.rotation("cost", rows)

    def cost_system(self, build, grouped: bool, form: str):
        a = self.args
        n, g = a.tasks, a.groups
        group = (lambda i: f"g{i % g}") if grouped else None

        def make(name):
            return Placement(build, self.tmp, 0, config(self.host.url))

        def fn(name, z):
            meter = ShareMeter(process_cpu_s, **roles(z), host=lambda: [self.host.proc.pid])
            s = run_async(asyncio.wait_for(enqueue(z, name, n, form, group, meter),
                                           a.time_cap))
            s.update(hand_out(z, self.host, name, n, a.time_cap))
            statuses, _ = run_async(self.census(z.api, name))
            if statuses["success"] != n:
                s["errors"].append(f"{statuses['success']:,} of {n:,} succeeded "
                                   f"({dict(statuses)})")
            return s
        return (self.column(build, grouped), make, fn,
                lambda name, s: self.check(name, s, n))

    @staticmethod
    async def census(api: str, name: str):
        async with client(1) as http:
            return await census(http, api, name)

    def fairness(self) -> None:
        a = self.args
        systems = [self.fairness_system(b) for b in self.grouped]
        row = (f"big: {a.big:,} queued, small: {a.small} tasks 1 a second, concurrency 1, "
               f"calls of {a.call_ms:g} ms")
        self.rotation("fairness", [(row, systems)])

    def fairness_system(self, build):
        a = self.args

        def make(name):
            return Placement(build, self.tmp, 1, config(self.host.url, **{
                name: f'url = "{self.host.url}/slow/{name}"\nconcurrency = 1\n'}))

        def fn(name, z):
            cap_s = a.time_cap + a.small        # (small's tasks go a second apart)
            return run_async(fairness(z, self.host, name, a.big, a.small, cap_s))
        return build.label, make, fn


# --------------------------------------------------------------------------- report

def build_table(bench: Bench) -> Table:
    run, res, a = bench.run, bench.results, bench.args
    now = run.builds[0]
    grouped, plain = bench.column(now, True), bench.column(now, False)
    cols = [(bench.column(b, g), bench.column(b, g)) for b in run.builds
            for g in ((False, True) if b in bench.grouped else (False,))]
    ratios, targets = [(grouped, plain, "groups / none")], [("groups / none", "<=", 1.10)]
    if len(run.builds) > 1:
        ref = bench.column(run.builds[1], False)
        ratios += [(grouped, ref, f"groups / {run.builds[1].label} none"),
                   (plain, ref, f"none / {run.builds[1].label} none")]
        targets.append((f"groups / {run.builds[1].label} none", "<=", 1.10))
    t = Table("groups", "Tenant groups: their cost, and fairness in real time", cols, ratios,
              note=(f"zstalk split (`broker --config`, `front http`, one `dispatcher`), fresh "
                    "per run, calling one aiohttp function host that logs each call's arrival "
                    f"and group. Part 1: {a.tasks:,} due tasks enqueued with no dispatcher "
                    f"(no group option, or task i in group i mod {a.groups:,}), then one "
                    "dispatcher hands them out; broker CPU-s per 1,000 tasks of each phase. "
                    f"Part 2: {a.big:,} tasks of group big queued, then {a.small} of group "
                    f"small one a second, function concurrency 1, calls of {a.call_ms:g} ms: "
                    "how many of big's calls came between a small task's POST and its call."))
    for row, per in res["cost"].items():
        flags = bench.flags("cost", row, per)
        fig = lambda key: {c: Figure.of(r, key) for c, r in per.items()}    # noqa: E731
        t.add(f"1: enqueue, {row} (tasks/s){flags}", fig("enq_rate"))
        t.add(f"1: enqueue, {row}: broker CPU-s per 1,000 tasks", fig("enq_cpu_per_1k"),
              fmt="{:.4g}", target=targets)
        t.add(f"1: enqueue, {row}: generator CPU (cores)", fig("gen_cpu_share"),
              fmt="{:.2f}", ratio=False)
        t.add(f"1: hand-out after {row}, 1 dispatcher (calls/s)", fig("out_rate"))
        t.add(f"1: hand-out after {row}: broker CPU-s per 1,000 tasks", fig("out_cpu_per_1k"),
              fmt="{:.4g}", target=targets)
    for row, per in res["fairness"].items():
        flags = bench.flags("fairness", row, per)
        fig = lambda key: {bench.column(b, True): Figure.of(per.get(b.label), key)  # noqa
                           for b in bench.grouped}
        t.add(f"2: big's calls between a small task's 201 and its call, most{flags}",
              fig("max_between"), target=(grouped, "<=", 1, "<= 1"), ratio=False)
        t.add("2: the same, median", fig("median_between"), fmt="{:.1f}", ratio=False)
        t.add("2: the same from the POST's send (an upper bound), most", fig("max_upper"),
              ratio=False)
        for key, say in (("with_0", "0"), ("with_1", "1"), ("with_2_or_more", "2 or more")):
            t.add(f"2: small's tasks with {say} of big's between", fig(key), ratio=False)
        t.add("2: small's POST → its call, median (ms)", fig("median_ms"), fmt="{:.1f}",
              ratio=False)
        t.add("2: small's POST → its call, most (ms)", fig("max_ms"), fmt="{:.1f}", ratio=False)
        t.add("2: small's waitNum at enqueue, most", fig("max_wait_num"), ratio=False)
        t.add("2: big's calls in the run", fig("big_started"), ratio=False)
    return t


def paired_lines(bench: Bench) -> list[str]:
    """Part 1 per repetition: each grouped run's broker CPU per task / the plain run's of
    the same repetition (they ran side by side)."""
    lines = []
    for row, per in bench.results["cost"].items():
        for b in bench.grouped:
            runs = [per.get(bench.column(b, g), []) for g in (True, False)]
            for key, phase in (("enq_cpu_per_1k", "enqueue"), ("out_cpu_per_1k", "hand-out")):
                ratios = paired(*runs, key)
                if ratios:
                    lines.append(f"  {b.label}, {row}, {phase}: {ratios_text(ratios)}")
    return ["Part 1 per repetition, broker CPU per task with groups / without, the runs "
            "of each repetition side by side:"] + lines if lines else []


def fairness_lines(bench: Bench) -> list[str]:
    """Part 2: every run's counts, small's tasks in order."""
    lines = [f"  {column}: {run['between']}, from the send {run['upper']}"
             for per in bench.results["fairness"].values()
             for column, runs in per.items() for run in runs]
    return ["Part 2, big's calls between each small task's 201 and its call, per run:"] \
        + lines if lines else []


# --------------------------------------------------------------------------- main

def parse_args(argv):
    ap = parser(__doc__)
    ap.add_argument("--parts", default="1,2", help="parts to run, e.g. 2")
    ap.add_argument("--tasks", type=int, default=None,
                    help="part 1: tasks per run (20,000; 5,000 --quick, 2,000 --smoke)")
    ap.add_argument("--groups", type=int, default=10000, help="part 1: groups the tasks are in")
    ap.add_argument("--forms", default=None,
                    help="part 1: arrays, single or both (arrays,single; arrays --smoke)")
    ap.add_argument("--big", type=int, default=None,
                    help="part 2: big's queued tasks (10,000; 2,000 --smoke)")
    ap.add_argument("--small", type=int, default=None,
                    help="part 2: small's tasks, one a second (20; 10 --quick, 3 --smoke)")
    ap.add_argument("--call-ms", type=float, default=20.0, help="part 2: each call's time")
    ap.add_argument("--time-cap", type=float, default=60.0,
                    help="seconds a phase may take beyond its expected time")
    ap.add_argument("--function-host", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    sized(args, tasks=(20000, 5000, 2000), forms=("arrays,single",) * 2 + ("arrays",),
          big=(10000, 10000, 2000), small=(20, 10, 3))
    args.forms = [f.strip() for f in args.forms.split(",") if f.strip()]
    unknown = set(args.forms) - set(FORMS)
    if unknown:
        ap.error(f"--forms: {sorted(unknown)} (arrays, single)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.function_host:
        function_host_main(args.function_host, args.call_ms)
        return 0
    run = Run("bench_groups", args)
    tmp = tempfile.mkdtemp(prefix="bench_groups_")
    bench = None
    try:
        bench = Bench(run, LogHost(args.call_ms), tmp)
        run_parts([(1, "part 1: cost with and without groups", bench.cost),
                   (2, "part 2: fairness", bench.fairness)], set(ints(args.parts)))
    finally:
        Proc.stop_all(run.notes)
        shutil.rmtree(tmp, ignore_errors=True)
    shares = cpu_shares(bench.results, tuple(f"{k}_cpu_share" for k in METERED)
                        + ("out_broker_cpu_share", "out_dispatchers_cpu_share"))
    return run.report([build_table(bench)], bench.results,
                      paired_lines(bench) + fairness_lines(bench) + [shares])


if __name__ == "__main__":
    use_project_venv()
    sys.exit(main())
