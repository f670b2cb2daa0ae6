#!/usr/bin/env python3
"""Benchmark upstream groups: what balancing costs, least_conn's calls, failure detection.

Usage:
    scripts/bench_upstreams.py [--quick | --smoke] [--repeats N] [--warmup N] [--against REF]
        [--json PATH] [--parts 1,2,3] [--tasks N] [--lc-tasks N] [--lc-dispatchers N]
        [--lc-concurrency N] [--fail-dispatchers 1,4] [--fail-rate N] [--fail-batch N]
        [--fail-before S] [--fail-after S] [--fail-repeats N] [--time-cap S]

Targets (issue 30): balancing costs at most 5 % of a single-URL function's end-to-end
throughput; here both ways: system CPU-s per 1,000 tasks at most 1.05x a plain url's,
and tasks/s at least 1/1.05 of it.  Parts 2 and 3 have no target: they say how many
calls a second go through least_conn with 4 dispatchers (and how evenly), and how long a
server that stops accepting connections still gets calls.  A full run takes about
2.5 minutes on 2 cores (139 s), --quick 20 s, --smoke 13 s.

Method
------
What every row shares (free loopback ports, fresh processes per run, alternation with
warm-up, medians with their min-max, the machine check, stopping what was started,
--against) is in scripts/harness/__init__.py.  ONE function host serves the whole run:
an aiohttp process (uvloop, keep-alive) that listens on as many loopback ports as it is
asked to (each port a server of the upstream: `http://127.0.0.1:PORT`, an AppRunner of
its own), answers `POST /{name}` at once with 200 `{"ok": true}`, and counts per function
name the calls on each port, the distinct task ids (X-Zstalk-Task-Id) and the first and
last call's arrival (time.monotonic()).  On its control port it opens fresh ports and
stops one: the port's listening socket is closed and every connection it holds is
aborted, as when a server's process dies (closing the listening socket alone would let
the dispatcher's keep-alive connections go on being served).  Every run uses a function
name of its own.

zstalk is bench_limits.py's split placement, fresh for every run and for each build:
`zstalk broker --bind tcp://127.0.0.1:B --config C`, `zstalk front http --broker ...
--listen 127.0.0.1:H` and D x `zstalk dispatcher --broker ... --slots 64`, ready once the
API answers and every dispatcher holds a TCP connection to the broker.  C is one of
* plain url: `[functions] base_url = "http://127.0.0.1:P1"`, `base_url_any = true`: every
  function F is called at P1/F;
* on an upstream: `[upstreams.up] balance = "..."`, `servers = [{ url =
  "http://127.0.0.1:P1" }, ...]` and `[functions] upstream = "up"`, `base_url_any =
  true`: every function F is called at the server's url + /F;
both with `concurrency` (256; part 2: --lc-concurrency, 64) and `timeout = "30s"`.  Tasks
are POSTed as JSON arrays (the API's form for many), and a run ends when the host has
seen the calls and `GET /v1/tasks?function=F&status=queued|running` comes back empty.

* Part 1, the cost of balancing.  End to end as bench_tasks.py's row 3 and bench_limits'
  part 2 (200 warm-up tasks waited for, then the clock starts, --tasks (20,000; 5,000
  --quick, 2,000 --smoke) tasks posted in arrays of 1,000, 2 in flight, the clock stops
  when none is queued or running; 1 dispatcher) for (a) the plain url, (b) an upstream of
  that one server (round_robin), (c) an upstream of 3 servers (least_conn), alternated.
  Rows: tasks/s and the system's CPU-seconds per 1,000 tasks (utime + stime of the
  broker's, the front's and the dispatcher's process trees over the timed part); then
  (b)/(a) and (c)/(a) of both (ratios of the medians), targets above; a line under the
  table gives each repetition's own ratios (its runs ran side by side).
* Part 2, least_conn with --lc-dispatchers (4) dispatchers: the same end-to-end run of
  --lc-tasks (20,000; 5,000 --quick, 2,000 --smoke) tasks, function concurrency 64, on an
  upstream of 3 servers with `balance = "least_conn"`, alternated with the plain url.
  Rows: calls a second as the host saw them, (calls - 1) / (last call - first call); the
  system's CPU-s per 1,000 tasks; least_conn / plain url of the calls a second; and how
  evenly least_conn spread them, the most calls one server got / the fewest.
* Part 3, failure detection.  An upstream of 3 fresh ports, `balance = "round_robin"`,
  each server `max_fails = 1, fail_timeout = "10s"` (nginx's defaults), --fail-dispatchers
  (1 and 4) dispatchers; tasks with `attempts = 3, backoff = 0` enqueued at --fail-rate
  (200) a second in arrays of --fail-batch (10) on a timer, for --fail-before (1.5 s)
  and --fail-after (2.5 s) s in all; the host stops the second server at a random
  point (seeded by the run's name) between the two arrays around --fail-before.  Then,
  within fail_timeout of the stop (so no probe of the stopped server falls in the run),
  `GET /v1/functions/F`: the stopped server's `fails` and `usableAt`; a failure sets
  nginx's `checked` to its time and a failed server is usable again at checked +
  fail_timeout, so usableAt - 10 s is when the broker counted the server's last failed
  call.  Rows, from the stop (the host's time.time() once the socket is closed and its
  connections aborted): the first failed call, the earliest `startedAt` of a task on its
  second call (a failed call's retry starts when its failure comes back, backoff 0; ms);
  the last, as above: how long after it stopped the server still got calls (the time
  from the stop to the first is the load's: the next array that has a call for it); the
  calls that failed because of it, sum(calls) - tasks over the run's TaskInfo (the host
  answers every other call 200; the stopped server's `fails` must agree); and the tasks
  that did not succeed (target 0).  These rows are the median of --fail-repeats (5; 1
  --quick / --smoke) alternated runs, min-max in brackets.  One more row runs the same
  with 1 dispatcher and single-attempt tasks (`attempts = 0`): with next upstream
  (issue 46) a call to the stopped server moves to another server within its attempt,
  so no task fails (target 0; a build without it fails each task whose call the stopped
  server refused).  A task's calls are its attempts before the latest plus the servers
  its latest attempt called (`upstreamAddr`, one when absent); the calls that failed are
  its calls less one for a task that succeeded; the first failed call is the earliest
  `startedAt` of a task that was retried or moved (a moved task's is its attempt's first
  call, the one that failed).  The last row (issue 47: active health checks) runs that
  again with this tree's build only (an older one may not know the config): the upstream
  has `health_check = { path = "/health", interval = "1s", fails = 1, timeout = "500ms" }`
  (the host answers GET /health 200 on every port) and its servers `max_fails = 0`, so
  only a failed check takes the stopped server out of the picks; its calls after the
  stop are the tasks whose `upstreamAddr` begins with it and whose `startedAt` is after
  the stop (each moved on), the last of them is how long it still got calls.

Each part's rows are rotations: every repetition runs each of the row's systems once
(each build's zstalk, each variant), the order reversed every other repetition.  A run
has a time cap (--time-cap, 60 s past the time it should take): a capped run reports what
finished and is flagged.  What a process wrote (beyond zstalk's start-up line), wrong
answers, and tasks not called as they should be are reported.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import random
import shutil
import sys
import tempfile
import time
import urllib.request

import bench_tasks
from bench_limits import Placement, Session, seconds, statuses
from bench_tasks import RESULT, zstalk_e2e
from harness.cli import Run, ints, parser, sized
from harness.http import JSON_HEADERS, client, run_async
from harness.procs import HOST, Proc, ShareMeter, free_port
from harness.runs import Runs, run_parts
from harness.stats import Figure, paired, per_1k, ratios_text
from harness.table import Table, cpu_shares
from harness.venv import use_project_venv

CONCURRENCY = 256           # parts 1 and 3: never the limit
ARRAY = 1000                # tasks per POSTed array (the API's maximum)
INFLIGHT = 2                # arrays in flight
UPSTREAM = "up"
FAIL_TIMEOUT_S = 10.0
FAIL_SERVER = f', max_fails = 1, fail_timeout = "{FAIL_TIMEOUT_S:g}s"'
FAIL_ATTEMPTS = 3
#: the health checks' row: a check a second, one failure takes a server out, and the calls'
#: own failures not counted (max_fails = 0), so the checks alone take the server out
HEALTH_CHECK = 'health_check = { path = "/health", interval = "1s", fails = 1, timeout = "500ms" }\n'
HEALTH_SERVER = ", max_fails = 0"
PLAIN = "(a) plain url"
ONE = "(b) upstream of 1 server, round_robin"
THREE = "(c) upstream of 3 servers, least_conn"
LC = "least_conn over 3 servers"


# --------------------------------------------------------------------------- function host

def function_host_main(ctl_port: int) -> None:
    """The counting function host (`--function-host PORT`, a child of this script)."""
    from aiohttp import web

    calls: collections.Counter = collections.Counter()      # (name, port) -> calls
    ids: dict[str, set] = collections.defaultdict(set)
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    runners: dict[int, tuple] = {}                          # port -> (runner, site)

    def server_app(port: int) -> web.Application:
        async def call(request: web.Request) -> web.Response:
            now = time.monotonic()
            name = request.match_info["name"]
            await request.read()
            calls[name, port] += 1
            ids[name].add(request.headers.get("X-Zstalk-Task-Id"))
            first.setdefault(name, now)
            last[name] = now
            return web.Response(body=RESULT, content_type="application/json")
        async def health(request: web.Request) -> web.Response:
            return web.Response(text="ok")      # (the health checks' row: always well)
        app = web.Application()
        app.router.add_post("/{name}", call)
        app.router.add_get("/health", health)
        return app

    async def open_ports(request: web.Request) -> web.Response:
        ports = (await request.json())["ports"]
        for port in ports:
            runner = web.AppRunner(server_app(port), access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, HOST, port)
            await site.start()
            runners[port] = (runner, site)
        return web.json_response({"ports": ports})

    async def stop_port(request: web.Request) -> web.Response:
        port = int(request.match_info["port"])
        runner, site = runners.pop(port)
        await site.stop()                   # the listening socket is closed: connects refused
        aborted = 0
        for handler in runner.server.connections:   # and what it holds, as a dead process
            transport = handler.transport
            if transport is not None and not transport.is_closing():
                transport.abort()
                aborted += 1
        stopped = time.time()
        answered = {name: n for (name, p), n in calls.items() if p == port}
        return web.json_response({"stoppedAt": stopped, "aborted": aborted,
                                  "answered": answered})

    async def seen(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        ports = {str(p): n for (f, p), n in calls.items() if f == name}
        total = sum(ports.values())
        span = last.get(name, 0.0) - first.get(name, 0.0)
        return web.json_response({"calls": total, "ids": len(ids.get(name, set()) - {None}),
                                  "ports": ports, "span_s": span,
                                  "rate": (total - 1) / span if span > 0 else None})

    async def serve() -> None:
        app = web.Application()
        app.router.add_post("/_open", open_ports)
        app.router.add_post("/_stop/{port}", stop_port)
        app.router.add_get("/_calls/{name}", seen)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, HOST, ctl_port).start()
        await asyncio.Event().wait()
    run_async(serve())


class FunctionHost(bench_tasks.FunctionHost):
    """This script's host: many ports, opened on request (`open`)."""

    def __init__(self) -> None:
        super().__init__(__file__)
        self.taken: set[int] = {self.port}

    def _json(self, path: str, doc=None) -> dict:
        data = None if doc is None else json.dumps(doc).encode()
        req = urllib.request.Request(self.url + path, data, JSON_HEADERS)
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def open(self, n: int) -> list[str]:
        """n fresh servers (ports no run used before): their urls."""
        ports = []
        while len(ports) < n:
            port = free_port()
            if port not in self.taken:
                self.taken.add(port)
                ports.append(port)
        self._json("/_open", {"ports": ports})
        return [f"http://{HOST}:{p}" for p in ports]

    def seen(self, name: str) -> dict:
        """{"calls", "ids", "ports": {port: calls}, "span_s", "rate"} of function `name`."""
        return self._json(f"/_calls/{name}")


def port_of(url: str) -> str:
    return url.rsplit(":", 1)[1]


# --------------------------------------------------------------------------- configs

def plain(url: str, concurrency: int) -> str:
    return (f'[functions]\nbase_url = "{url}"\nbase_url_any = true\n'
            f'concurrency = {concurrency}\ntimeout = "30s"\n')


def on_upstream(urls: list[str], balance: str, concurrency: int, server: str = "",
                upstream: str = "") -> str:
    rows = "".join(f'  {{ url = "{u}"{server} }},\n' for u in urls)
    return (f'[upstreams.{UPSTREAM}]\nbalance = "{balance}"\n{upstream}'
            f'servers = [\n{rows}]\n\n'
            f'[functions]\nupstream = "{UPSTREAM}"\nbase_url_any = true\n'
            f'concurrency = {concurrency}\ntimeout = "30s"\n')


ROLES = ("broker", "front", "dispatchers")


def roles(z: Placement) -> dict:
    """ShareMeter groups: the system's CPU by role (its processes: broker, front, D x
    dispatcher, in that order)."""
    procs = z.procs
    return dict(broker=procs[0].pids, front=procs[1].pids,
                dispatchers=lambda: [p for proc in procs[2:] for p in proc.pids()])


def spread(seen: dict, urls: list[str]) -> float | None:
    """The most calls one of `urls` got / the fewest (None: one got none)."""
    counts = [seen["ports"].get(port_of(u), 0) for u in urls]
    return max(counts) / min(counts) if min(counts) else None


# --------------------------------------------------------------------------- part 3's load

async def steady_load(s: Session, name: str, a, stop_url: str, attempts: int) -> dict:
    """--fail-rate tasks a second in arrays of --fail-batch for --fail-before s and
    --fail-after s more; the host stops `stop_url`'s server at a random point (seeded by
    the run's name) between the two arrays around --fail-before: the stop's answer."""
    period = a.fail_batch / a.fail_rate
    arrays = math.ceil((a.fail_before + a.fail_after) / period)
    stop_after = (math.floor(a.fail_before / period) + random.Random(name).random()) * period
    posts = []

    async def post(i: int) -> None:
        body = json.dumps([{"function": name, "params": {"i": i * a.fail_batch + j},
                            "options": {"attempts": attempts, "backoff": 0}}
                           for j in range(a.fail_batch)]).encode()
        async with s.http.post(f"{s.api}/v1/tasks", data=body, headers=JSON_HEADERS) as r:
            items = await r.json() if r.status == 200 else []
        bad = len(items) != a.fail_batch or any(it.get("status") != 201 for it in items)
        if bad and len(s.errors) < 5:
            s.errors.append(f"array {i} answered {r.status}: {str(items)[:200]}")

    async def stop_server() -> dict:
        await asyncio.sleep(max(0.0, t0 + stop_after - time.monotonic()))
        async with s.http.post(f"{s.host}/_stop/{port_of(stop_url)}") as r:
            return await r.json()

    t0 = time.monotonic()
    stop = asyncio.create_task(stop_server())
    for i in range(arrays):
        await asyncio.sleep(max(0.0, t0 + i * period - time.monotonic()))
        posts.append(asyncio.create_task(post(i)))
    await asyncio.gather(*posts)
    return dict(await stop, n=arrays * a.fail_batch, load_s=time.monotonic() - t0,
                stop_after_s=stop_after)


# --------------------------------------------------------------------------- the runs

class Bench(Runs):
    def __init__(self, run: Run, host: FunctionHost, tmp: str) -> None:
        super().__init__(run, ("cost", "least_conn", "failure"), SHOWN)
        self.host, self.tmp = host, tmp
        self.servers = host.open(3)         # parts 1 and 2: the same three servers

    def e2e(self, build, toml: str, dispatchers: int, n: int, urls: list[str]):
        """make and fn of an end-to-end run of n tasks (parts 1 and 2)."""
        def make(name):
            return Placement(build, self.tmp, dispatchers, toml)

        def fn(name, z):
            meter = ShareMeter(system=z.pids, host=lambda: [self.host.proc.pid],
                               **roles(z))
            s = run_async(zstalk_e2e(z.api, name, n, ARRAY, INFLIGHT, self.args.time_cap,
                                     meter))
            seen = self.host.seen(name)
            s.update(n=n, cpu_per_1k=per_1k(meter.cpu["system"], s["count"]),
                     **{f"{r}_cpu_per_1k": per_1k(meter.cpu[r], s["count"]) for r in ROLES},
                     host_rate=seen["rate"], host_calls=seen["calls"], host_ids=seen["ids"],
                     per_server=[seen["ports"].get(port_of(u), 0) for u in urls],
                     spread=spread(seen, urls) if len(urls) > 1 else None)
            if seen["calls"] != n or seen["ids"] != n:
                s["errors"].append(f"the host saw {seen['calls']:,} calls of "
                                   f"{seen['ids']:,} distinct tasks, not {n:,}")
            if s["statuses"].get("success") != n:
                s["errors"].append(f"{s['statuses']} of {n:,} tasks")
            if sum(s["per_server"]) != seen["calls"]:
                s["errors"].append(f"calls on servers other than {urls}: {seen['ports']}")
            return s
        return make, fn

    # -- part 1 ----------------------------------------------------------------------------
    def cost(self) -> None:
        a, one = self.args, self.servers[:1]
        variants = [(PLAIN, plain(one[0], CONCURRENCY), one),
                    (ONE, on_upstream(one, "round_robin", CONCURRENCY), one),
                    (THREE, on_upstream(self.servers, "least_conn", CONCURRENCY),
                     self.servers)]
        systems = [(f"{b.label}: {label}", *self.e2e(b, toml, 1, a.tasks, urls))
                   for b in self.run.builds for label, toml, urls in variants]
        self.rotation("cost", [(cost_row(a), systems)], a.repeats)

    # -- part 2 ----------------------------------------------------------------------------
    def least_conn(self) -> None:
        a, one = self.args, self.servers[:1]
        variants = [(PLAIN, plain(one[0], a.lc_concurrency), one),
                    (LC, on_upstream(self.servers, "least_conn", a.lc_concurrency),
                     self.servers)]
        systems = [(f"{b.label}: {label}",
                    *self.e2e(b, toml, a.lc_dispatchers, a.lc_tasks, urls))
                   for b in self.run.builds for label, toml, urls in variants]
        self.rotation("least_conn", [(lc_row(a), systems)], a.repeats)

    # -- part 3 ----------------------------------------------------------------------------
    def failure(self) -> None:
        a = self.args
        rows = [(fail_row(a, d, attempts), [(b.label, *self.failover(b, d, attempts))
                                            for b in self.run.builds])
                for d, attempts in [*((d, FAIL_ATTEMPTS) for d in a.fail_dispatchers),
                                    (1, 0)]]       # (the last: single-attempt tasks)
        # (this tree's build only: an older one may not know health_check)
        rows.append((health_row(a), [(self.run.builds[0].label,
                                      *self.failover(self.run.builds[0], 1, 0, health=True))]))
        self.rotation("failure", rows, a.fail_repeats)

    def failover(self, build, dispatchers: int, attempts: int, health: bool = False):
        a = self.args
        expected_s = a.fail_before + a.fail_after

        def make(name):
            urls = self.host.open(3)
            z = Placement(build, self.tmp, dispatchers, on_upstream(
                urls, "round_robin", CONCURRENCY, HEALTH_SERVER if health else FAIL_SERVER,
                HEALTH_CHECK if health else ""))
            z.urls = urls
            return z

        def fn(name, z):
            victim = z.urls[1]

            async def go() -> dict:
                async with client(INFLIGHT + 8) as http:
                    s = Session(http, z.api, self.host.url,
                                time.monotonic() + expected_s + a.time_cap)
                    stop = await steady_load(s, name, a, victim, attempts)
                    capped = await s.done(name, stop["n"])
                    async with http.get(f"{z.api}/v1/functions/{name}") as r:
                        function = await r.json()
                    read_at = time.time()
                    infos = await s.infos(name)
                    return dict(stop=stop, capped=capped, function=function, infos=infos,
                                read_at=read_at, errors=s.errors)
            out = run_async(go())
            sample = health_sample if health else failure_sample
            return sample(name, out, victim, self.host.seen(name), attempts)
        return make, fn


def calls_of(info: dict) -> int:
    """A task's calls: its attempts before the latest, and each server the latest called."""
    attempt = info.get("attempt", 0)
    servers = info.get("upstreamAddr", "").count(", ") + 1 if attempt else 0
    return max(0, attempt - 1) + servers


def failure_sample(name: str, out: dict, victim: str, seen: dict, attempts: int) -> dict:
    """Part 3's figures from a run's raw answers."""
    stop, infos, errors = out["stop"], out["infos"], list(out["errors"])
    n = stop["n"]
    servers = {sv["url"]: sv for sv in out["function"].get("servers", [])}
    state = servers.get(victim, {})
    st = statuses(infos)
    failed_calls = sum(calls_of(info) for info in infos) - st.get("success", 0)
    retried = [seconds(i["startedAt"]) for i in infos if calls_of(i) > 1
               and "startedAt" in i]
    # (a failed call's retry starts when its failure comes back: backoff 0)
    first_ms = (min(retried) - stop["stoppedAt"]) * 1000.0 if retried else None
    last_ms = None
    if state.get("state") == "failed" and "usableAt" in state:
        last_fail = seconds(state["usableAt"]) - FAIL_TIMEOUT_S
        last_ms = (last_fail - stop["stoppedAt"]) * 1000.0
    else:
        errors.append(f"the stopped server is not failed after the run: {state}")
    if out["read_at"] - stop["stoppedAt"] >= FAIL_TIMEOUT_S:
        errors.append("the servers were read after fail_timeout: a probe may be counted")
    if state.get("fails") != failed_calls:
        errors.append(f"the stopped server counts {state.get('fails')} failed calls, the "
                      f"tasks {failed_calls}")
    if len(infos) != n or attempts and st.get("success") != n:
        errors.append(f"{st} of {n:,} tasks")     # (single attempts: the row's measure)
    if seen["ids"] != n:
        errors.append(f"the host saw {seen['ids']:,} distinct tasks of {n:,}")
    # (calls the stopped server answered after the stop: none, its connections are gone)
    answered_after = seen["ports"].get(port_of(victim), 0) - stop["answered"].get(name, 0)
    return dict(n=n, first_call_ms=first_ms, last_call_ms=last_ms, failed_calls=failed_calls,
                not_succeeded=n - st.get("success", 0), statuses=st,
                victim=dict(state, url=victim), aborted=stop["aborted"],
                answered_after_stop=answered_after, load_s=round(stop["load_s"], 3),
                host_calls=seen["calls"], capped=out["capped"],
                per_server={u: sv.get("fails") for u, sv in servers.items()}, errors=errors)


def health_sample(name: str, out: dict, victim: str, seen: dict, attempts: int) -> dict:
    """The health checks' row from a run's raw answers: no failure is counted against the
    stopped server (max_fails = 0), so its calls after the stop, each a task's first call
    moved on to another server, go on until a check takes it out; the last is the latest
    `startedAt` among the tasks whose `upstreamAddr` begins with it."""
    stop, infos, errors = out["stop"], out["infos"], list(out["errors"])
    n = stop["n"]
    state = {sv["url"]: sv for sv in out["function"].get("servers", [])}.get(victim, {})
    st = statuses(infos)
    after = sorted(seconds(i["startedAt"]) for i in infos if "startedAt" in i
                   and i.get("upstreamAddr", "").startswith(victim)
                   and seconds(i["startedAt"]) >= stop["stoppedAt"])
    if state.get("health", {}).get("status") != "down":
        errors.append(f"the stopped server is not unhealthy after the run: {state}")
    if len(infos) != n:
        errors.append(f"{st} of {n:,} tasks")
    ms_after = [(t - stop["stoppedAt"]) * 1000.0 for t in after]
    return dict(n=n, first_call_ms=ms_after[0] if ms_after else None,
                last_call_ms=ms_after[-1] if ms_after else None, failed_calls=len(after),
                not_succeeded=n - st.get("success", 0), statuses=st,
                victim=dict(state, url=victim), aborted=stop["aborted"],
                load_s=round(stop["load_s"], 3), host_calls=seen["calls"],
                capped=out["capped"], errors=errors)


SHOWN = ("rate", "host_rate", "cpu_per_1k", "spread", "first_call_ms", "last_call_ms",
         "failed_calls", "not_succeeded")


def cost_row(a) -> str:
    return f"end to end, {a.tasks:,} tasks, 1 dispatcher"


def lc_row(a) -> str:
    return (f"{a.lc_dispatchers} dispatchers, concurrency {a.lc_concurrency}, "
            f"{a.lc_tasks:,} tasks")


def health_row(a) -> str:
    return (f"round_robin over 3, 1 dispatcher, {a.fail_rate} tasks/s, one server stops, "
            "single-attempt tasks, health checks (interval 1 s, fails 1) and max_fails = 0")


def fail_row(a, d: int, attempts: int) -> str:
    return (f"round_robin over 3, {d} dispatcher{'s' if d > 1 else ''}, {a.fail_rate} "
            f"tasks/s, one server stops" + ("" if attempts else ", single-attempt tasks"))


# --------------------------------------------------------------------------- report

def build_table(bench: Bench) -> Table:
    run, res, a = bench.run, bench.results, bench.args
    labels = run.labels()
    now = labels[0]
    t = Table("upstreams", "Upstream groups: the cost of balancing, least_conn, failure "
              "detection", [(b, b) for b in labels], run.against_ratios(), note=(
                  "zstalk split (`broker --config`, `front http`, D `dispatcher` processes), "
                  "fresh per run, calling one aiohttp function host that listens on each "
                  "server's loopback port and answers at once. Part 1: end to end, a "
                  "function with a plain `url` against the same function on an upstream of "
                  "that one server and on an upstream of 3 (least_conn); system = broker + "
                  "front + dispatcher process trees. Part 2: calls/s at the host, (calls - "
                  "1) / (last - first call). Part 3: tasks with `attempts = 3, backoff = 0` "
                  "(the single-attempt row: `attempts = 0`) "
                  f"at {a.fail_rate}/s in arrays of {a.fail_batch}; about {a.fail_before:g} s "
                  "in (at a random point between two arrays) the host closes one server's "
                  "listening socket and aborts its connections (`max_fails = 1`, "
                  "`fail_timeout = \"10s\"`); times from the stop: the first failed call is "
                  "the earliest retried or moved task's `startedAt`, the last the broker's "
                  "`usableAt` - fail_timeout for that server; failed calls = sum(calls) - "
                  "tasks that succeeded; "
                  f"median of {a.fail_repeats} run{'s' if a.fail_repeats != 1 else ''}."))

    def fig(per, variant, key):
        return {b: Figure.of(per.get(f"{b}: {variant}"), key) for b in labels}

    def ratio(per, num, den, key):
        out = {}
        for b in labels:
            x, y = (fig(per, v, key)[b].median for v in (num, den))
            out[b] = x / y if x is not None and y else None
        return out

    for row, per in res["cost"].items():
        f = bench.flags("cost", row, per)
        for variant in (PLAIN, ONE, THREE):
            t.add(f"1: {row}, {variant} (tasks/s){f}", fig(per, variant, "rate"))
            t.add(f"1: {row}, {variant}: system CPU-s per 1,000 tasks",
                  fig(per, variant, "cpu_per_1k"), fmt="{:.4g}")
        for variant, short in ((ONE, "(b)"), (THREE, "(c)")):
            t.add(f"1: tasks/s, {short} / (a)", ratio(per, variant, PLAIN, "rate"),
                  fmt="{:.3f}", target=(now, ">=", 0.952, ">= 0.952 (1/1.05)"), ratio=False)
            t.add(f"1: CPU-s per 1,000 tasks, {short} / (a)",
                  ratio(per, variant, PLAIN, "cpu_per_1k"), fmt="{:.3f}",
                  target=(now, "<=", 1.05, "<= 1.05 (+5 %)"), ratio=False)
    for row, per in res["least_conn"].items():
        f = bench.flags("least_conn", row, per)
        for variant in (PLAIN, LC):
            t.add(f"2: {row}, {variant}: calls/s at the host{f}", fig(per, variant, "host_rate"))
            t.add(f"2: {row}, {variant}: system CPU-s per 1,000 tasks",
                  fig(per, variant, "cpu_per_1k"), fmt="{:.4g}")
        t.add(f"2: calls/s, {LC} / plain url", ratio(per, LC, PLAIN, "host_rate"),
              fmt="{:.3f}", ratio=False)
        t.add(f"2: {LC}: most calls on one server / fewest", fig(per, LC, "spread"),
              fmt="{:.3f}", ratio=False)
    for row, per in res["failure"].items():
        f = bench.flags("failure", row, per)
        n = max((s["n"] for r in per.values() for s in r), default=0)
        cells = lambda key: {b: Figure.of(per.get(b), key) for b in labels}  # noqa: E731
        t.add(f"3: {row}: its first failed call after the stop (ms){f}",
              cells("first_call_ms"), fmt="{:.1f}", ratio=False)
        t.add(f"3: {row}: its last call after the stop (ms)", cells("last_call_ms"),
              fmt="{:.1f}", ratio=False)
        t.add(f"3: {row}: calls failed because of it", cells("failed_calls"), fmt="{:.0f}",
              ratio=False)
        t.add(f"3: {row}: tasks that did not succeed (of {n:,})", cells("not_succeeded"),
              target=(now, "<=", 0, "0: every task succeeds"), ratio=False)
    return t


def paired_lines(bench: Bench) -> list[str]:
    """Part 1 per repetition: (b)/(a) and (c)/(a) of the runs made side by side."""
    lines = []
    for row, per in bench.results["cost"].items():
        for b in bench.run.labels():
            runs = {v: per.get(f"{b}: {v}", []) for v in (PLAIN, ONE, THREE)}
            if len({len(r) for r in runs.values()}) != 1:
                continue
            for v, short in ((ONE, "(b)"), (THREE, "(c)")):
                for key, what in (("cpu_per_1k", "CPU-s per 1,000 tasks"), ("rate", "tasks/s")):
                    pairs = paired(runs[v], runs[PLAIN], key)
                    if pairs:
                        lines.append(f"  {b}: {what}, {short} / (a): {ratios_text(pairs)}")
    return ["Part 1 per repetition, each variant's run / the plain url's run of the same "
            "repetition:"] + lines if lines else []


def role_lines(bench: Bench) -> list[str]:
    """Parts 1 and 2: the system's CPU-s per 1,000 tasks by process (medians)."""
    lines = []
    for part in ("cost", "least_conn"):
        for row, per in bench.results[part].items():
            for column, runs in per.items():
                figs = [f"{r} {Figure.of(runs, f'{r}_cpu_per_1k').text('{:.4f}')}"
                        for r in ROLES]
                lines.append(f"  {row}, {column}: " + ", ".join(figs))
    return ["System CPU-s per 1,000 tasks by process (median, min-max):"] + lines \
        if lines else []


def ms(x: float | None) -> str:
    return "?" if x is None else f"{x:.1f}"


def failure_lines(bench: Bench) -> list[str]:
    """Part 3 per run: the figures, and what the stopped server last said."""
    lines = []
    for row, per in bench.results["failure"].items():
        for column, runs in per.items():
            each = "; ".join(f"{ms(s.get('first_call_ms'))}-{ms(s.get('last_call_ms'))} ms, "
                             f"{s['failed_calls']} failed" for s in runs)
            lines.append(f"  {row}, {column}: {each}")
            errs = {s["victim"].get("lastError") for s in runs} - {None}
            if errs:
                lines.append(f"    its lastError: {sorted(errs)[0]}")
    return ["Part 3 per run (first-last failed call after the stop, calls failed):"] + lines \
        if lines else []


# --------------------------------------------------------------------------- main

def parse_args(argv):
    ap = parser(__doc__)
    ap.add_argument("--parts", default="1,2,3", help="parts to run, e.g. 1,3")
    ap.add_argument("--tasks", type=int, default=None,
                    help="part 1: tasks per end-to-end run (20,000; 5,000 --quick, 2,000 "
                         "--smoke)")
    ap.add_argument("--lc-tasks", type=int, default=None,
                    help="part 2: tasks per run (20,000; 5,000 --quick, 2,000 --smoke)")
    ap.add_argument("--lc-dispatchers", type=int, default=4, help="part 2: dispatchers")
    ap.add_argument("--lc-concurrency", type=int, default=64,
                    help="part 2: the function's concurrency")
    ap.add_argument("--fail-dispatchers", default="1,4", help="part 3: dispatchers, a row each")
    ap.add_argument("--fail-rate", type=int, default=200, help="part 3: tasks a second")
    ap.add_argument("--fail-batch", type=int, default=10, help="part 3: tasks per array")
    ap.add_argument("--fail-before", type=float, default=None,
                    help="part 3: seconds of load before the stop (1.5; 1 --smoke)")
    ap.add_argument("--fail-after", type=float, default=None,
                    help="part 3: seconds of load after it (2.5; 1.5 --smoke; under 10)")
    ap.add_argument("--fail-repeats", type=int, default=None,
                    help="part 3: alternated runs per row (5; 1 --quick / --smoke)")
    ap.add_argument("--time-cap", type=float, default=60.0,
                    help="seconds a run may take beyond its expected time")
    ap.add_argument("--function-host", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    sized(args, tasks=(20000, 5000, 2000), lc_tasks=(20000, 5000, 2000),
          fail_before=(1.5, 1.5, 1.0), fail_after=(2.5, 2.5, 1.5), fail_repeats=(5, 1, 1))
    args.fail_dispatchers = ints(args.fail_dispatchers)
    if args.fail_after >= FAIL_TIMEOUT_S - 2:
        ap.error(f"--fail-after must stay well under fail_timeout ({FAIL_TIMEOUT_S:g} s)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.function_host:
        function_host_main(args.function_host)
        return 0
    parts = set(ints(args.parts))
    run = Run("bench_upstreams", args)
    tmp = tempfile.mkdtemp(prefix="bench_upstreams_")
    bench = None
    try:
        bench = Bench(run, FunctionHost(), tmp)
        steps = [(1, "part 1: the cost of balancing", bench.cost),
                 (2, "part 2: least_conn with several dispatchers", bench.least_conn),
                 (3, "part 3: failure detection", bench.failure)]
        run_parts(steps, parts)
    finally:
        Proc.stop_all(run.notes)
        shutil.rmtree(tmp, ignore_errors=True)
    shares = cpu_shares(bench.results, ("gen_cpu_share", "system_cpu_share",
                                        "host_cpu_share", "others_cpu_share"))
    return run.report([build_table(bench)], bench.results,
                      paired_lines(bench) + role_lines(bench) + failure_lines(bench)
                      + [shares])


if __name__ == "__main__":
    use_project_venv()
    sys.exit(main())
