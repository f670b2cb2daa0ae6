#!/usr/bin/env python3
"""Benchmark the limits on cloud tasks: the rate limiter's accuracy, its cost, and the ETA.

Usage:
    scripts/bench_limits.py [--quick | --smoke] [--repeats N] [--warmup N] [--against REF]
        [--json PATH] [--parts 1,2,3] [--rates 10,100,1000] [--dispatchers 1,4]
        [--seconds S] [--celery-rates 10,100] [--celery-workers N] [--celery-pool POOL]
        [--celery-prefetch N] [--celery-cap S] [--time-cap S]
        [--overhead-tasks N] [--eta-rate-tasks N] [--eta-warm N] [--eta-tasks N]

Targets (issue 27): a rate far above the load costs at most 5 % more system CPU-s per
1,000 tasks than no rate; the ETA a task gets at enqueue is off by a median of at most
5 % (p90 10 %) of its real wait when the rate holds it, 15 % (p90 35 %) when its
concurrency does.  Part 1's Celery rows need Debian's redis-server and the `bench` extra
(`.venv/bin/pip install -e '.[bench]'`); without them they are skipped and say why.  A
full run takes about 9 minutes on 2 cores (510 s), --quick 1.5, --smoke half a minute.

Method
------
What every row shares (free loopback ports, fresh processes per run, alternation with
warm-up, medians with their min-max, the machine check, stopping what was started,
--against) is in scripts/harness/__init__.py.  ONE function host serves the whole run:
an aiohttp app in its own process (on uvloop, keep-alive) that stamps every call's
arrival (time.monotonic(), the system-wide clock, on receipt of the request line and
headers), counts the calls and the distinct task ids (X-Zstalk-Task-Id / X-Task-Id) per
function name, and answers 200 `{"ok": true}`: at once on `POST /{name}`, after
sleeping a log-normal time on `POST /lognormal/{name}` (median --lognormal-ms, 100 ms;
sigma --lognormal-sigma, 0.5; seeded).  Every run uses a function name of its own and
checks that each task was called exactly once and ended `success`.

zstalk is bench_tasks.py's split placement, fresh for every run and for each build:
`zstalk broker --bind tcp://127.0.0.1:B --config C`, `zstalk front http --broker ...
--listen 127.0.0.1:H` and D x `zstalk dispatcher --broker ... --slots 64`, ready once the
API answers and every dispatcher holds a TCP connection to the broker.  C has
`[functions] base_url = "<host>"`, `base_url_any = true`, `concurrency = 256`, `timeout =
"30s"`, and what each part adds below (burst is always the default, 0).  Tasks are
POSTed as JSON arrays of up to 1,000 (the API's maximum), 2 in flight.  A run ends when
the function host has seen every call and `GET /v1/tasks?function=F&status=queued|
running` comes back empty (polled every 50 ms, within --time-cap of the expected time);
the tasks' TaskInfo (the same object GET /v1/tasks/{id} gives) is then read by paging
through `GET /v1/tasks?function=F&limit=1000`.

* Part 1, accuracy.  For each --rates N (10, 100, 1,000 a second) and --dispatchers D
  (1 and 4): `[functions.F] rate = "N/s"`; 200 warm-up tasks of another (unlimited)
  function open every dispatcher's connections to the host, then N x --seconds (5; 3
  --quick, 1 --smoke) tasks of F are enqueued at once, so the limiter alone paces them.
  From the host's stamps of F's calls: the achieved rate, (calls - 1) / (last stamp -
  first stamp), and the worst 1 s window, the most calls whose stamps lie within one
  second of each other (max over i of #{j: s_i <= s_j < s_i + 1 s}).  GCRA allows at
  most burst + 1 + floor(t * N) starts in any t seconds, so a window holds N + 1 at the
  most at the broker; the host's stamps add the dispatch's jitter.  The same two figures
  from the broker's own `startedAt` (ms) are in the JSON and the lines under the table.
  Beside the D = 4 rows, at --celery-rates (10 and 100 a second; 10 --smoke): Celery 5
  on a fresh redis-server, bench_tasks.py's row 4 set-up (result backend, JSON, the task
  POSTing to the host through a pooled urllib3 client) with the task declared
  `rate_limit="N/s"` and rate limits enabled, --celery-workers (4) worker processes of
  `--pool solo` (--celery-pool) `--concurrency 1`, prefetch multiplier 4 (Celery's
  default; --celery-prefetch), started once all answer a control ping.  Celery's
  rate_limit holds per worker process, so N x workers x --seconds tasks are published
  (--seconds' worth at the 4 x N it allows); same figures.  A Celery run still calling
  --celery-cap (20 s; 15 --quick, 5 --smoke) after the --seconds it should take is cut
  there and flagged [capped]: its figures are over the calls made by then, and only
  "no task called twice" is checked.  (Celery 5.7 on Redis ran rate-limited tasks far
  below their limit here after a first burst, at about 1-2 a second per worker whatever
  the limit, with solo, prefork and threads pools and with prefetch 4 or 64: the
  symptom of celery#5927, open.)
  The configured rate is the reference column; the ratios are achieved / configured.
* Part 2, overhead.  End to end as bench_tasks.py's row 3 (200 warm-up tasks waited
  for, then the clock starts, --overhead-tasks (20,000; 5,000 --quick) tasks posted, the
  clock stops when none is queued or running; D = 1): with no rate at all, and with
  `rate = "1000000/s"` in [functions] (every function: far above the load), the two
  configs alternated (harness rounds).  Rows: tasks/s, and the system's CPU-seconds per
  1,000 tasks (utime + stime of the broker's, the front's and the dispatcher's process
  trees over the timed part); then rate / no rate of the latter (the ratio of the
  medians), target <= 1.05x; a line under the table gives each repetition's own ratio
  (its two runs ran side by side), so its spread shows.
* Part 3, ETA.  The ETA is the `waitTime` of the task's item in the 201s of the batch
  that enqueued it; the actual wait is its `startedAt - createdAt`; the error is
  |ETA - actual| / actual, over the tasks that waited at least 1 s; rows give its median
  and p90 (targets), the signed median (ETA - actual) / actual (a bias shows there), and
  how many tasks the figures are over.
  (a) rate-bound: `[functions.F] rate = "50/s"` (--eta-rate), --eta-rate-tasks (500;
      300 --quick) tasks in one array, calls answered at once;
  (b) concurrency-bound: no rate, `[functions.F] concurrency = 4`, the host's
      log-normal route: --eta-warm (60) tasks first, all waited for (waitTime needs 10
      calls in the last minute to know the mean call), then --eta-tasks (300; 200
      --quick) in one array.

Each part's rows are rotations: every repetition runs each of the row's systems once
(each build's zstalk; Celery beside the D = 4 rows; in part 2 both configs of each
build), the order reversed every other repetition.  A run has a time cap (--time-cap,
60 s past the time it should take): a capped run reports what finished and is flagged.
What a process wrote (beyond zstalk's start-up line; Celery's and redis' only if it
names an error), wrong answers, and tasks not called exactly once are reported.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
import urllib.request
from datetime import datetime

from bench_tasks import (CELERY_MODULE, RESULT, CeleryOnRedis, Zstalk, batches,
                         celery_missing, open_tasks, post_batches, zstalk_e2e)
from harness.builds import REPO
from harness.cli import Run, ints, parser, sized
from harness.http import JSON_HEADERS, client, http_status, loop_factory, run_async
from harness.machine import tool_version
from harness.procs import HOST, Proc, ShareMeter, free_port, wait_until
from harness.runs import Runs, run_parts
from harness.stats import Figure, median, paired, pct, per_1k, ratios_text
from harness.table import Table, cpu_shares
from harness.venv import use_project_venv

CONCURRENCY = 256           # the functions' default: never the limit
WARM_TASKS = 200
ARRAY = 1000                # tasks per POSTed array (the API's maximum)
INFLIGHT = 2                # arrays in flight
POLL_S = 0.05
ETA_FLOOR_S = 1.0           # part 3: only tasks that waited at least this long
ETA_CONCURRENCY = 4
FAR_RATE = "1000000/s"      # part 2: far above any load (the config's maximum)
CONFIGURED, CELERY = "configured", "Celery"
NO_RATE, FAR = "no rate", f"rate = {FAR_RATE}"

# bench_tasks.py's Celery module, its task rate-limited (the rate from the environment)
_LIMITED = [("worker_disable_rate_limits=True", "worker_disable_rate_limits=False"),
            ('@app.task(name="call")',
             '@app.task(name="call", rate_limit=os.environ["BENCH_RATE"])')]
RATE_LIMITED_MODULE = CELERY_MODULE
for _old, _new in _LIMITED:
    assert _old in RATE_LIMITED_MODULE, f"bench_tasks.CELERY_MODULE has no {_old!r}"
    RATE_LIMITED_MODULE = RATE_LIMITED_MODULE.replace(_old, _new)


# --------------------------------------------------------------------------- function host

def function_host_main(port: int, median_ms: float, sigma: float) -> None:
    """The stamping function host (`--function-host PORT`, a child of this script)."""
    from aiohttp import web

    stamps: dict[str, list[float]] = collections.defaultdict(list)
    ids: dict[str, set] = collections.defaultdict(set)
    rng, mu = random.Random(27), math.log(median_ms / 1000.0)

    async def call(request: web.Request) -> web.Response:
        now = time.monotonic()
        name = request.match_info["name"]
        stamps[name].append(now)
        ids[name].add(request.headers.get("X-Zstalk-Task-Id")
                      or request.headers.get("X-Task-Id"))
        await request.read()
        if request.path.startswith("/lognormal/"):
            await asyncio.sleep(rng.lognormvariate(mu, sigma))
        return web.Response(body=RESULT, content_type="application/json")

    async def seen(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        out = {"calls": len(stamps.get(name, ())), "ids": len(ids.get(name, set()) - {None})}
        if request.query.get("stamps"):
            out["stamps"] = stamps.get(name, [])
        return web.json_response(out)

    app = web.Application()
    app.router.add_get("/_calls/{name}", seen)
    app.router.add_post("/lognormal/{name}", call)
    app.router.add_post("/{name}", call)
    web.run_app(app, host=HOST, port=port, access_log=None, print=None, loop=loop_factory())


class FunctionHost:
    def __init__(self, args) -> None:
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.proc = Proc("function host", [
            sys.executable, __file__, "--function-host", self.port, "--lognormal-ms",
            args.lognormal_ms, "--lognormal-sigma", args.lognormal_sigma], cwd=str(REPO))
        wait_until(lambda: http_status(f"{self.url}/_calls/x") == 200, "function host",
                   [self.proc])

    def seen(self, name: str) -> dict:
        """{"calls", "ids", "stamps"}: what the host saw of function `name`."""
        with urllib.request.urlopen(f"{self.url}/_calls/{name}?stamps=1", timeout=10) as r:
            return json.loads(r.read())


# --------------------------------------------------------------------------- figures

def starts(stamps: list[float]) -> dict:
    """The achieved rate and the worst 1 s window of a run's call start times (s)."""
    s = sorted(stamps)
    worst, i = 0, 0
    for j, t in enumerate(s):
        while t - s[i] >= 1.0:
            i += 1
        worst = max(worst, j - i + 1)
    span = s[-1] - s[0] if len(s) > 1 else 0.0
    return dict(starts=len(s), span_s=round(span, 4), worst_1s=worst,
                rate=(len(s) - 1) / span if span > 0 else None)


def seconds(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def eta_errors(items: list[dict], infos: list[dict]) -> dict:
    """Part 3's figures: the enqueue's waitTime against startedAt - createdAt."""
    eta = {it["uniqueId"]: it["waitTime"] / 1000.0 for it in items if "waitTime" in it}
    rel, waited = [], 0
    for info in infos:
        if info["uniqueId"] not in eta or "startedAt" not in info:
            continue
        actual = seconds(info["startedAt"]) - seconds(info["createdAt"])
        if actual >= ETA_FLOOR_S:
            waited += 1
            rel.append((eta[info["uniqueId"]] - actual) / actual)
    absolute = [abs(x) for x in rel]
    return dict(over=len(rel), without_eta=len(items) - len(eta),
                median_pct=median(absolute) * 100 if rel else None,
                p90_pct=pct(absolute, 90) * 100 if rel else None,
                signed_pct=median(rel) * 100 if rel else None,
                max_pct=max(absolute) * 100 if rel else None)


# --------------------------------------------------------------------------- zstalk

def config(host_url: str, defaults: str = "", **functions: str) -> str:
    """The config file: [functions] with `defaults` added, a table per keyword."""
    text = (f'[functions]\nbase_url = "{host_url}"\nbase_url_any = true\n'
            f'concurrency = {CONCURRENCY}\ntimeout = "30s"\n{defaults}')
    return text + "".join(f"\n[functions.{name}]\n{body}" for name, body in functions.items())


class Placement(Zstalk):
    """bench_tasks.py's split placement, with a config file of its own."""

    def __init__(self, build, tmp: str, dispatchers: int, toml: str) -> None:
        super().__init__(build, "", tmp, True, dispatchers)
        fd, self.config = tempfile.mkstemp(prefix="zstalk-", suffix=".toml", dir=tmp)
        with os.fdopen(fd, "w") as f:
            f.write(toml)


class Session:
    """One run's HTTP client: the task API and the function host's counts."""

    def __init__(self, session, api: str, host: str, deadline: float) -> None:
        self.http, self.api, self.host, self.deadline = session, api, host, deadline
        self.errors: list[str] = []

    async def enqueue(self, name: str, n: int, params_from: int = 0) -> list[dict]:
        """n tasks of `name` in one array: the array's items."""
        body = json.dumps([{"function": name, "params": {"i": params_from + i}}
                           for i in range(n)]).encode()
        async with self.http.post(f"{self.api}/v1/tasks", data=body,
                                  headers=JSON_HEADERS) as r:
            if r.status != 200:
                raise RuntimeError(f"an array of {n} answered {r.status}: "
                                   f"{(await r.read())[:200]!r}")
            items = await r.json()
        bad = [it for it in items if it.get("status") != 201]
        if bad:
            self.errors.append(f"{len(bad)} items refused, e.g. {bad[0]}")
        return items

    async def enqueue_many(self, name: str, n: int) -> int:
        """n tasks of `name` in arrays of ARRAY, INFLIGHT at a time: how many were taken."""
        return await post_batches(self.http, f"{self.api}/v1/tasks",
                                  batches(name, n, None, ARRAY), INFLIGHT, self.errors)

    async def done(self, name: str, calls: int) -> bool:
        """Wait until the host saw `calls` calls of `name` and none is queued or running;
        whether the deadline came first (capped)."""
        while True:
            async with self.http.get(f"{self.host}/_calls/{name}") as r:
                seen = (await r.json())["calls"]
            if seen >= calls and not await open_tasks(self.http, self.api, name):
                return False
            if time.monotonic() > self.deadline:
                return True
            await asyncio.sleep(POLL_S)

    async def infos(self, name: str) -> list[dict]:
        """Every task of `name`: its TaskInfo, by pages of the listing."""
        out, after = [], None
        while True:
            query = f"{self.api}/v1/tasks?function={name}&limit=1000"
            async with self.http.get(query + (f"&after={after}" if after else "")) as r:
                page = await r.json()
            out += page["tasks"]
            if page["next"] is None:
                return out
            after = page["next"]


def in_session(z: Placement, host: FunctionHost, cap_s: float, work) -> dict:
    """Run `await work(session)` against placement z, within cap_s."""
    async def go():
        async with client(INFLIGHT + 2) as http:
            s = Session(http, z.api, host.url, time.monotonic() + cap_s)
            out = await work(s)
            out["errors"] = s.errors + out.get("errors", [])
            return out
    return run_async(go())


def statuses(infos: list[dict]) -> dict:
    return dict(collections.Counter(info["status"] for info in infos))


def broker_starts(infos: list[dict]) -> dict:
    return starts([seconds(i["startedAt"]) for i in infos if "startedAt" in i])


# --------------------------------------------------------------------------- Celery

class CeleryLimited(CeleryOnRedis):
    """bench_tasks.py's Celery on Redis, --celery-workers workers of --celery-pool
    (solo) --concurrency 1, the task rate-limited."""

    def __init__(self, args, host_url: str, tmp: str, rate: int) -> None:
        super().__init__(args, host_url, tmp, args.celery_pool, 1, args.celery_workers)
        self.rate = rate
        with open(os.path.join(tmp, "bench_celery_tasks.py"), "w") as f:
            f.write(RATE_LIMITED_MODULE)

    def start(self) -> None:
        os.environ["BENCH_RATE"] = f"{self.rate}/s"     # (the workers' and ours)
        super().start()
        wait_until(lambda: len(self.mod.app.control.ping(timeout=0.5)) >= self.workers,
                   "Celery workers' control ping", self.procs)


# --------------------------------------------------------------------------- the runs

class Bench(Runs):
    def __init__(self, run: Run, host: FunctionHost, tmp: str) -> None:
        super().__init__(run, ("accuracy", "overhead", "eta"), SHOWN)
        self.host, self.tmp = host, tmp
        self.celery_skip: str | None = None

    def checker(self, calls: int, capped_ok: bool = False):
        """A run's check: the host must have seen `calls` calls of its function, each task
        once (a Celery run cut at its cap: no task twice)."""
        return lambda name, s: self.check(s, name, calls, capped_ok)

    def check(self, s: dict, name: str, calls: int, capped_ok: bool = False) -> None:
        seen = self.host.seen(name)
        s["host_calls"], s["host_ids"] = seen["calls"], seen["ids"]
        if capped_ok and s.get("capped"):
            # (a Celery run cut at its cap: its figures are over the calls made by then;
            # no task may have been called twice)
            if seen["ids"] != seen["calls"]:
                s["errors"].append(f"the host saw {seen['calls']:,} calls of "
                                   f"{seen['ids']:,} distinct tasks")
            return
        if seen["calls"] != calls or seen["ids"] != calls:
            s["errors"].append(f"the host saw {seen['calls']:,} calls of {seen['ids']:,} "
                               f"distinct tasks, not {calls:,}")
        ok = s.get("statuses", {}).get("success", s.get("statuses", {}).get("SUCCESS"))
        if ok != calls:
            s["errors"].append(f"{ok} of {calls:,} tasks succeeded ({s.get('statuses')})")

    # -- part 1 ----------------------------------------------------------------------------
    def accuracy(self) -> None:
        a = self.args
        celery_skip = celery_missing(a)
        if celery_skip and a.celery_rates:
            self.celery_skip = celery_skip
            self.run.notes.append(f"part 1's Celery rows skipped: {celery_skip}")
        rows = []
        for rate in a.rates:
            n = rate * a.seconds
            for d in a.dispatchers:
                systems = [self.zstalk_accuracy(b, rate, n, d) for b in self.run.builds]
                celery = d == a.celery_workers and rate in a.celery_rates and not celery_skip
                if celery:
                    systems.append(self.celery_accuracy(rate, n * a.celery_workers))
                rows.append((accuracy_row(rate, d, a.celery_workers if celery else 0), systems))
        self.rotation("accuracy", rows)

    def zstalk_accuracy(self, build, rate: int, n: int, d: int):
        def make(name):
            return Placement(build, self.tmp, d, config(
                self.host.url, **{name: f'rate = "{rate}/s"\n'}))

        def fn(name, z):
            async def work(s: Session) -> dict:
                await s.enqueue_many(name + "_warm", WARM_TASKS)
                if await s.done(name + "_warm", WARM_TASKS):
                    raise RuntimeError("warm-up tasks not done in time")
                accepted = await s.enqueue_many(name, n)
                capped = await s.done(name, n)
                infos = await s.infos(name)
                return dict(accepted=accepted, capped=capped, statuses=statuses(infos),
                            broker=broker_starts(infos))
            out = in_session(z, self.host, n / rate + self.args.time_cap, work)
            return dict(starts(self.host.seen(name)["stamps"]), n=n, **out)
        return build.label, make, fn, self.checker(n)

    def celery_accuracy(self, rate: int, n: int):
        def make(name):
            return CeleryLimited(self.args, self.host.url, self.tmp, rate)

        def fn(name, cel):
            t0 = time.monotonic()
            ids = cel.publish(name, n)
            got, capped = cel.wait(ids, t0 + self.args.seconds + self.args.celery_cap)
            return dict(starts(self.host.seen(name)["stamps"]), n=n, accepted=len(ids),
                        capped=capped, statuses=dict(got), errors=[])
        return CELERY, make, fn, self.checker(n, capped_ok=True)

    # -- part 2 ----------------------------------------------------------------------------
    def overhead(self) -> None:
        a = self.args
        systems = []
        for b in self.run.builds:
            for label, defaults in ((NO_RATE, ""), (FAR, f'rate = "{FAR_RATE}"\n')):
                systems.append((f"{b.label}: {label}", *self.zstalk_e2e(b, defaults)))
        self.rotation("overhead", [(f"end to end, {a.overhead_tasks:,} tasks, 1 dispatcher",
                                    systems)])

    def zstalk_e2e(self, build, defaults: str):
        n = self.args.overhead_tasks

        def make(name):
            return Placement(build, self.tmp, 1, config(self.host.url, defaults))

        def fn(name, z):
            meter = ShareMeter(system=z.pids, host=lambda: [self.host.proc.pid])
            s = run_async(zstalk_e2e(z.api, name, n, ARRAY, INFLIGHT, self.args.time_cap,
                                     meter))
            s.update(n=n, cpu_per_1k=per_1k(meter.cpu["system"], s["count"]))
            return s
        return make, fn, self.checker(n)

    # -- part 3 ----------------------------------------------------------------------------
    def eta(self) -> None:
        a = self.args
        rows = [(eta_rate_row(a), [self.eta_rate(b) for b in self.run.builds]),
                (eta_slots_row(a), [self.eta_slots(b) for b in self.run.builds])]
        self.rotation("eta", rows)

    def eta_rate(self, build):
        a = self.args
        n = a.eta_rate_tasks

        def make(name):
            return Placement(build, self.tmp, 1, config(
                self.host.url, **{name: f'rate = "{a.eta_rate}/s"\n'}))

        def fn(name, z):
            async def work(s: Session) -> dict:
                items = await s.enqueue(name, n)
                capped = await s.done(name, n)
                infos = await s.infos(name)
                return dict(eta_errors(items, infos), capped=capped, statuses=statuses(infos))
            return dict(in_session(z, self.host, n / a.eta_rate + a.time_cap, work), n=n)
        return build.label, make, fn, self.checker(n)

    def eta_slots(self, build):
        a = self.args
        n, warm = a.eta_tasks, a.eta_warm
        mean_s = a.lognormal_ms / 1000.0 * math.exp(a.lognormal_sigma ** 2 / 2)
        expected_s = (n + warm) * mean_s / ETA_CONCURRENCY

        def make(name):
            return Placement(build, self.tmp, 1, config(
                self.host.url, **{name: f'url = "{self.host.url}/lognormal/{name}"\n'
                                        f'concurrency = {ETA_CONCURRENCY}\n'}))

        def fn(name, z):
            async def work(s: Session) -> dict:
                await s.enqueue(name, warm)
                if await s.done(name, warm):
                    raise RuntimeError("warm-up tasks not done in time")
                items = await s.enqueue(name, n, warm)
                capped = await s.done(name, warm + n)
                infos = await s.infos(name)
                return dict(eta_errors(items, infos), capped=capped, statuses=statuses(infos))
            return dict(in_session(z, self.host, expected_s + a.time_cap, work), n=n)
        return build.label, make, fn, self.checker(n + warm)


SHOWN = ("rate", "worst_1s", "cpu_per_1k", "median_pct", "p90_pct", "signed_pct", "over")


def accuracy_row(rate: int, dispatchers: int, celery_workers: int) -> str:
    d = f"{dispatchers} dispatcher{'s' if dispatchers > 1 else ''}"
    return f"{rate:,}/s, {d}" + (f" (Celery: {celery_workers} workers)" if celery_workers else "")


def eta_rate_row(a) -> str:
    return f"rate-bound: {a.eta_rate}/s, {a.eta_rate_tasks} tasks in one array"


def eta_slots_row(a) -> str:
    return (f"concurrency-bound: {ETA_CONCURRENCY} at once, log-normal calls "
            f"(median {a.lognormal_ms:g} ms, sigma {a.lognormal_sigma:g}), {a.eta_tasks} "
            f"tasks after {a.eta_warm}")


# --------------------------------------------------------------------------- report

def build_table(bench: Bench) -> Table:
    run, res, a = bench.run, bench.results, bench.args
    labels = run.labels()
    now = labels[0]
    cols = [(CONFIGURED, CONFIGURED)] + [(b, b) for b in labels] + [(CELERY, CELERY)]
    ratios = [(b, CONFIGURED, f"{b}/{CONFIGURED}") for b in labels]
    ratios += [(CELERY, CONFIGURED, f"{CELERY}/{CONFIGURED}")] + run.against_ratios()
    t = Table("limits", "Limits on cloud tasks: rate accuracy, the rate's cost, the ETA", cols,
              ratios, note=(
                  "zstalk split (`broker --config`, `front http`, D `dispatcher` processes), "
                  "fresh per run, calling one aiohttp function host that stamps each call's "
                  "arrival. Part 1: N x "
                  f"{a.seconds} s tasks of a function with `rate = \"N/s\"` (burst 0) "
                  "enqueued at once; achieved = (calls - 1) / (last - first stamp), worst "
                  "window = most calls within 1 s (GCRA allows N + 1); Celery on Redis "
                  f"beside, {a.celery_workers} `--pool {a.celery_pool}` workers, prefetch "
                  f"{a.celery_prefetch}, the task declared `rate_limit=\"N/s\"` (which holds "
                  "per worker); a Celery run not done "
                  f"{a.celery_cap:g} s after the {a.seconds} s it should take is cut there "
                  "([capped]; figures over the calls made by then). Part 2: end to end with no "
                  f"rate and with `rate = \"{FAR_RATE}\"`. Part 3: the 201's `waitTime` "
                  "against `startedAt - createdAt`, over the tasks that waited >= 1 s."
                  + (f" Celery not run: {bench.celery_skip}." if bench.celery_skip else "")))

    for row, per in res["accuracy"].items():
        rate = int(row.split("/s")[0].replace(",", ""))
        flags = bench.flags("accuracy", row, per)
        t.add(f"1: {row}: achieved (starts/s){flags}",
              dict({c: Figure.of(r, "rate") for c, r in per.items()}, **{CONFIGURED: rate}),
              fmt="{:,.2f}")
        t.add(f"1: {row}: worst 1 s window (starts)",
              dict({c: Figure.of(r, "worst_1s") for c, r in per.items()}, **{CONFIGURED: rate}))
    for row, per in res["overhead"].items():
        flags = bench.flags("overhead", row, per)
        for label in (NO_RATE, FAR):
            t.add(f"2: {row}, {label} (tasks/s){flags}",
                  {b: Figure.of(per.get(f"{b}: {label}"), "rate") for b in labels})
            t.add(f"2: {row}, {label}: system CPU-s per 1,000 tasks",
                  {b: Figure.of(per.get(f"{b}: {label}"), "cpu_per_1k") for b in labels},
                  fmt="{:.4g}")
        cost = {}
        for b in labels:
            far, none = (Figure.of(per.get(f"{b}: {x}"), "cpu_per_1k").median
                         for x in (FAR, NO_RATE))
            cost[b] = far / none if far is not None and none else None
        t.add(f"2: CPU-s per 1,000 tasks, {FAR_RATE} / no rate", cost, fmt="{:.3f}",
              target=(now, "<=", 1.05, "<= 1.05 (+5 %)"), ratio=False)
    targets = {"rate-bound": (5, 10), "concurrency-bound": (15, 35)}
    for row, per in res["eta"].items():
        med, p90 = targets[row.split(":")[0]]
        flags = bench.flags("eta", row, per)
        fig = lambda key: {c: Figure.of(r, key) for c, r in per.items()}   # noqa: E731
        t.add(f"3: ETA, {row}: median |ETA - actual| / actual (%){flags}", fig("median_pct"),
              fmt="{:.1f}", target=(now, "<=", med, f"<= {med} %"), ratio=False)
        t.add(f"3: ETA, {row}: p90 (%)", fig("p90_pct"), fmt="{:.1f}",
              target=(now, "<=", p90, f"<= {p90} %"), ratio=False)
        t.add(f"3: ETA, {row}: signed median (ETA - actual) / actual (%)", fig("signed_pct"),
              fmt="{:+.1f}", ratio=False)
        t.add(f"3: ETA, {row}: tasks that waited >= 1 s", fig("over"), ratio=False)
    return t


def paired_lines(bench: Bench) -> list[str]:
    """Part 2 per repetition: each rate run's CPU-s per 1,000 tasks / the no-rate run's of
    the same repetition (the two ran next to each other), so the ratio's spread shows."""
    lines = []
    for row, per in bench.results["overhead"].items():
        for b in bench.run.labels():
            ratios = paired(per.get(f"{b}: {FAR}", []), per.get(f"{b}: {NO_RATE}", []),
                            "cpu_per_1k")
            if ratios:
                lines.append(f"  {b}: {ratios_text(ratios)}")
    return ["Part 2 per repetition, CPU-s per 1,000 tasks with the rate / without it, "
            "the two runs of each repetition side by side:"] + lines if lines else []


def broker_lines(bench: Bench) -> list[str]:
    """Part 1 at the broker: the same figures from startedAt (ms)."""
    lines = []
    for row, per in bench.results["accuracy"].items():
        for column, runs in per.items():
            if runs and "broker" in runs[0]:
                rates = Figure([r["broker"]["rate"] for r in runs]).text("{:,.2f}")
                worst = Figure([r["broker"]["worst_1s"] for r in runs]).text("{:,.0f}")
                lines.append(f"  {row}, {column}: achieved {rates}/s, worst 1 s window {worst}")
    return ["Part 1 from the broker's startedAt (ms) instead of the host's stamps:"] + lines \
        if lines else []


# --------------------------------------------------------------------------- main

def parse_args(argv):
    ap = parser(__doc__)
    ap.add_argument("--parts", default="1,2,3", help="parts to run, e.g. 1,3")
    ap.add_argument("--rates", default="10,100,1000", help="part 1: rates a second")
    ap.add_argument("--dispatchers", default="1,4", help="part 1: dispatcher processes")
    ap.add_argument("--seconds", type=int, default=None,
                    help="part 1: seconds' worth of tasks per run (5; 3 --quick, 1 --smoke)")
    ap.add_argument("--celery-rates", default=None,
                    help="part 1: Celery's rate_limit runs, beside the rows of as many "
                         "dispatchers as --celery-workers (10,100; 10 --smoke; '' for none)")
    ap.add_argument("--celery-cap", type=float, default=None,
                    help="part 1: seconds a Celery run may take beyond --seconds before it "
                         "is cut (20; 15 --quick, 5 --smoke)")
    ap.add_argument("--celery-workers", type=int, default=4,
                    help="part 1: Celery worker processes (--pool solo)")
    ap.add_argument("--celery-pool", default="solo",
                    help="part 1: each Celery worker's --pool (--concurrency 1)")
    ap.add_argument("--celery-prefetch", type=int, default=4,
                    help="part 1: Celery's worker_prefetch_multiplier (its default, 4)")
    ap.add_argument("--overhead-tasks", type=int, default=None,
                    help="part 2: tasks per end-to-end run (20,000; 5,000 --quick, 2,000 "
                         "--smoke)")
    ap.add_argument("--eta-rate", type=int, default=50, help="part 3a: the rate a second")
    ap.add_argument("--eta-rate-tasks", type=int, default=None,
                    help="part 3a: tasks in the array (500; 300 --quick)")
    ap.add_argument("--eta-warm", type=int, default=None,
                    help="part 3b: calls made first (60; at least 10)")
    ap.add_argument("--eta-tasks", type=int, default=None,
                    help="part 3b: tasks in the array (300; 200 --quick)")
    ap.add_argument("--lognormal-ms", type=float, default=100.0,
                    help="part 3b: the calls' median duration")
    ap.add_argument("--lognormal-sigma", type=float, default=0.5,
                    help="part 3b: the sigma of the duration's logarithm")
    ap.add_argument("--time-cap", type=float, default=60.0,
                    help="seconds a run may take beyond its expected time")
    ap.add_argument("--celery-bin", default=str(REPO / ".venv" / "bin" / "celery"))
    ap.add_argument("--redis-server", default="redis-server")
    ap.add_argument("--function-host", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    sized(args, seconds=(5, 3, 1), overhead_tasks=(20000, 5000, 2000),
          celery_rates=("10,100", "10,100", "10"), celery_cap=(20, 15, 5),
          eta_rate_tasks=(500, 300, 100), eta_warm=(60, 60, 20), eta_tasks=(300, 200, 60))
    args.rates, args.dispatchers = ints(args.rates), ints(args.dispatchers)
    args.celery_rates = ints(args.celery_rates)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.function_host:
        function_host_main(args.function_host, args.lognormal_ms, args.lognormal_sigma)
        return 0
    parts = set(ints(args.parts))
    run = Run("bench_limits", args)
    run.machine.update(redis=tool_version([args.redis_server, "--version"]),
                       celery=tool_version([args.celery_bin, "--version"]))
    tmp = tempfile.mkdtemp(prefix="bench_limits_")
    bench = None
    try:
        bench = Bench(run, FunctionHost(args), tmp)
        steps = [(1, "part 1: limiter accuracy", bench.accuracy),
                 (2, "part 2: the cost of a rate", bench.overhead),
                 (3, "part 3: ETA error", bench.eta)]
        run_parts(steps, parts)
    finally:
        Proc.stop_all(run.notes)
        shutil.rmtree(tmp, ignore_errors=True)
    shares = cpu_shares(bench.results, ("gen_cpu_share", "system_cpu_share",
                                        "host_cpu_share", "others_cpu_share"))
    return run.report([build_table(bench)], bench.results,
                      broker_lines(bench) + paired_lines(bench) + [shares])


if __name__ == "__main__":
    use_project_venv()
    sys.exit(main())
