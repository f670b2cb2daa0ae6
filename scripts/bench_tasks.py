#!/usr/bin/env python3
"""Benchmark zstalk's cloud tasks over HTTP against Celery on Redis and a direct HTTP loop.

Usage:
    scripts/bench_tasks.py [--quick | --smoke] [--repeats N] [--warmup N] [--against REF]
        [--json PATH] [--rows 1,2,3,4,5] [--tasks N] [--enqueue-tasks N] [--batch-tasks N]
        [--direct-requests N] [--batch-size N] [--batch-inflight N] [--dispatchers 1,4]
        [--celery solo:1,solo:1x4] [--celery-prefetch N] [--time-cap S]

Row 4 needs Debian's redis-server (`apt-get install -y redis-server`) and Celery
(`.venv/bin/pip install -e '.[bench]'`); without them it is skipped and says why.
A full run takes about 2-3 minutes on 2 cores, --quick about 40 s.

Method
------
What every row shares (free loopback ports, fresh processes per run, alternation with
warm-up, medians with their min-max, the machine check, stopping what was started,
--against) is in scripts/harness/__init__.py.  ONE function host serves every system for
the whole run: an aiohttp app in its own process (on uvloop, as zstalk's processes;
keep-alive) answering `POST /{name}` with 200 and `{"ok": true}`.  It counts the calls
per name and the distinct task ids per name (the X-Zstalk-Task-Id / X-Task-Id header),
so every run checks that each task was called exactly once.  Each run uses a function
name of its own, so counts never mix.

zstalk runs in two placements (each for this tree and --against's ref, through their
own .venv/bin/zstalk), fresh processes for every run, with the config
`[functions] base_url = "<function host>"`, `concurrency = 256` (never the limit: 4 x
64 slots), `timeout = "30s"`, and no master key (loopback only):
* serve: `zstalk serve -l 127.0.0.1 -p P --counter-port 0 --worker-bind none --config
  C --http-port H`: broker, HTTP front and a dispatcher (64 slots) in one process;
* split: `zstalk broker --bind tcp://127.0.0.1:B --config C`, `zstalk front http
  --broker tcp://127.0.0.1:B --listen 127.0.0.1:H` and D x `zstalk dispatcher --broker
  tcp://127.0.0.1:B --slots 64` (--dispatchers: D = 1 and 4; D = 0 in rows 1-2).
A run begins once `GET /v1/tasks/<none>` gets the broker's 404 and (split) every
dispatcher process holds an established TCP connection to the broker port (/proc).

The load generator is this process: aiohttp clients (one ClientSession and its
keep-alive pool per run) on uvloop; bodies are built before the clock starts; any one
request gives up after 5 s (they take milliseconds), which aborts the run with a note.

* Row 1, enqueue, single POSTs: --enqueue-tasks (10,000; 2,000 --quick) times `POST
  /v1/tasks {"function", "params": {"i": i}, "options": {"delay": 3600000}}` (an hour's
  delay: nothing is called during the row) from 32 coroutines, each one request in
  flight on its own keep-alive connection, after 200 untimed POSTs that open the
  connections.  Rate = 201 answers / time from the first send to the last answer.
* Row 2, enqueue, batch form: the same tasks in JSON arrays of --batch-size (1,000, the
  API's maximum), --batch-tasks (50,000; 10,000 --quick) per run, --batch-inflight (2)
  arrays in flight.  Rate = items answered 201 / time.  Target: >= 10,000 tasks/s.
  Rows 1 and 2 alternate serve and split (the HTTP front in its own process, D = 0).
* Row 3, end to end, zstalk: 200 warm-up tasks are enqueued and waited for, then the
  clock starts; --tasks (5,000; 1,000 --quick) tasks without delay are POSTed as in row
  2 and the run waits until none is queued or running: `GET /v1/tasks?function=F&status=
  queued&limit=1`, then the same for `running` (following `next` past the listing's
  10,000-task scan limit), every 10 ms once the enqueue is done.  The clock stops when
  both come back empty.  A census then pages through `GET /v1/tasks?function=F&limit=1000`:
  every task must say `success` (the latest `finishedAt` goes to the JSON as the broker's
  own end time).  Rate = successes / elapsed.  Variants: serve; split with 1 and with 4
  dispatchers.
* Row 4, end to end, Celery 5 on Redis: a fresh `redis-server --port R --bind 127.0.0.1
  --save '' --appendonly no` per run, broker in db 0, result backend in db 1, JSON
  serializer.  A temp module defines one task that POSTs the same body to the same
  function host through one urllib3 PoolManager per worker process (keep-alive) and
  returns the decoded JSON, which the backend records.  Each worker process is `celery
  --quiet -A <module> worker --pool POOL --concurrency C -n wI@%h --without-gossip
  --without-mingle --without-heartbeat`, prefetch multiplier --celery-prefetch (64; 4,
  Celery's default, measured the same).  --celery lists POOL:C[xW] variants (W worker
  processes); the default, solo:1 and solo:1x4, is Celery's fastest here with 1 and with
  4 processes: on this 2-core machine 4 x `--pool solo` ran ~1,000 tasks/s, `--pool
  prefork --concurrency 4` ~890 (its parent relays every task to a child over a pipe),
  one `--pool solo` ~740, `--pool threads --concurrency 8` ~650 (gevent and eventlet are
  not installed).  The producer (this process) publishes with `task.apply_async(...,
  producer=p)` in a loop over one pooled producer, after 200 warm-up tasks that also
  wait for the workers to be up; then it polls, every 10 ms once publishing is done, an
  MGET of the result keys (`celery-task-meta-<id>`) of the tasks still missing, and
  counts the SUCCESS ones.  Rate = successes / elapsed, clock as in row 3.
* Row 5, the physical limit: one aiohttp ClientSession (a pool of 64 keep-alive
  connections), 64 coroutines each with one request in flight, POSTing `{"i": i}`
  straight to the function host, --direct-requests (20,000; 5,000 --quick) after 500
  untimed ones.  Rate = 200 answers / time.

Each row is a rotation: every repetition runs each of its systems once (rows 3, 4 and 5
are one rotation), the order reversed every other repetition.  Each zstalk end-to-end
figure is set against the best Celery variant's (target >= 2x) and the direct loop's
(target >= 0.5x).  A run has a time cap (--time-cap, 60 s): a capped run reports what
finished in the time and is flagged.

CPU check (procs.ShareMeter): each run's CPU share over its timed part of the generator
(this process), the system under test (its process trees), the function host, and
everyone else; rows 1-4 also give the system's CPU-seconds per 1,000 tasks.

What a process wrote (beyond zstalk's start-up line; Celery's and redis' only if it
names an error), wrong answers, and tasks not called exactly once are reported.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import importlib
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from datetime import datetime

from harness.builds import REPO
from harness.cli import Run, log, parser, sized
from harness.http import (JSON_HEADERS, batches, client, http_status, loop_factory, run_async,
                          task_body)
from harness.machine import tool_version
from harness.procs import (HOST, Proc, ShareMeter, free_port, tcp_peers, wait_until,
                           zstalk_keep)
from harness.stats import Figure, per_1k, rounds
from harness.table import Table, cpu_shares
from harness.venv import use_project_venv

RESULT = b'{"ok": true}'
SINGLE_INFLIGHT = 32        # row 1: coroutines, one request in flight each
DIRECT_INFLIGHT = 64        # row 5
SLOTS = 64                  # per dispatcher process
CONCURRENCY = 256           # the function's concurrency: never the limit (4 x 64 slots)
HOUR_MS = 3_600_000
WARM_TASKS = 200
POLL_S = 0.01
START_CAP_S = 30.0
SERVE = "`serve` (1 process)"
SPLIT = "broker + front http"
CELERY, DIRECT = "Celery", "direct loop"


# --------------------------------------------------------------------------- function host

def function_host_main(port: int) -> None:
    """The trivial function host (`--function-host PORT`, run as a child of this script)."""
    from aiohttp import web

    calls: collections.Counter = collections.Counter()
    ids: dict[str, set] = collections.defaultdict(set)

    async def call(request: web.Request) -> web.Response:
        await request.read()
        name = request.match_info["name"]
        calls[name] += 1
        task_id = request.headers.get("X-Zstalk-Task-Id") or request.headers.get("X-Task-Id")
        if task_id:
            ids[name].add(task_id)
        return web.Response(body=RESULT, content_type="application/json")

    async def counts(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        return web.json_response({"calls": calls[name], "ids": len(ids.get(name, ()))})

    app = web.Application()
    app.router.add_get("/_calls/{name}", counts)
    app.router.add_post("/{name}", call)
    web.run_app(app, host=HOST, port=port, access_log=None, print=None, loop=loop_factory())


class FunctionHost:
    """The function host process: `script --function-host PORT [options]` (a benchmark
    that serves calls its own way passes its own script, and the options it needs)."""

    def __init__(self, script: str = __file__, *options) -> None:
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.proc = Proc("function host", [sys.executable, script, "--function-host",
                                           self.port, *options], cwd=str(REPO))
        wait_until(lambda: http_status(f"{self.url}/_calls/x") == 200, "function host",
                   [self.proc])

    def calls(self, name: str) -> dict:
        with urllib.request.urlopen(f"{self.url}/_calls/{name}", timeout=10) as r:
            return json.loads(r.read())


# --------------------------------------------------------------------------- HTTP load

async def post_all(session, url: str, bodies: list[bytes], inflight: int, count) -> int:
    """POST every body, `inflight` at a time; the sum of `await count(response)` (the
    answers that count as done)."""
    it = iter(bodies)
    ok = 0

    async def lane():
        nonlocal ok
        for body in it:
            async with session.post(url, data=body, headers=JSON_HEADERS) as r:
                done = await count(r)       # (`ok += await ...` reads ok before the await:
            ok += done                      # two lanes' answers would count as one)
    await asyncio.gather(*(lane() for _ in range(inflight)))
    return ok


async def post_many(session, url: str, bodies: list[bytes], inflight: int,
                    ok_status: int, errors: list) -> int:
    """POST every body, `inflight` at a time; the count of `ok_status` answers."""
    async def count(r) -> int:
        text = await r.read()
        if r.status == ok_status:
            return 1
        if len(errors) < 5:
            errors.append(f"{r.status} {text[:200]!r}")
        return 0
    return await post_all(session, url, bodies, inflight, count)


async def post_batches(session, url: str, bodies: list[bytes], inflight: int,
                       errors: list) -> int:
    """POST task arrays; the count of items answered 201."""
    async def count(r) -> int:
        items = await r.json() if r.status == 200 else None
        if items is None:
            if len(errors) < 5:
                errors.append(f"an array answered {r.status}")
            return 0
        bad = [item for item in items if item.get("status") != 201]
        if bad and len(errors) < 5:
            errors.append(f"{len(bad)} items refused, e.g. {bad[0]}")
        return len(items) - len(bad)
    return await post_all(session, url, bodies, inflight, count)


async def open_tasks(session, api: str, name: str) -> bool:
    """Whether any task of function `name` is queued or running (the listing scans at
    most 10,000 tasks per call: follow `next`)."""
    for status in ("queued", "running"):
        after = None
        while True:
            query = f"{api}/v1/tasks?function={name}&status={status}&limit=1"
            async with session.get(query + (f"&after={after}" if after else "")) as r:
                page = await r.json()
            if page["tasks"]:
                return True
            if page["next"] is None:
                break
            after = page["next"]
    return False


async def census(session, api: str, name: str) -> tuple[collections.Counter, str | None]:
    """Every task of `name`: how many in each status, and the latest finishedAt."""
    statuses: collections.Counter = collections.Counter()
    last, after = None, None
    while True:
        query = f"{api}/v1/tasks?function={name}&limit=1000"
        async with session.get(query + (f"&after={after}" if after else "")) as r:
            page = await r.json()
        for info in page["tasks"]:
            statuses[info["status"]] += 1
            if info.get("finishedAt") and (last is None or info["finishedAt"] > last):
                last = info["finishedAt"]
        if page["next"] is None:
            return statuses, last
        after = page["next"]


# --------------------------------------------------------------------------- measuring

def sample(count: int, t0: float, t1: float, meter: ShareMeter, **extra) -> dict:
    elapsed = t1 - t0
    return dict(count=count, elapsed_s=round(elapsed, 4),
                rate=count / elapsed if elapsed > 0 else None, **meter.shares, **extra)


# --------------------------------------------------------------------------- zstalk

class Zstalk:
    """One zstalk placement: `serve` (one process) or broker + HTTP front + D dispatchers."""

    def __init__(self, build, host_url: str, tmp: str, split: bool, dispatchers: int):
        self.exe, self.split, self.dispatchers = build.exe("zstalk"), split, dispatchers
        self.config = os.path.join(tmp, "zstalk.toml")
        with open(self.config, "w") as f:
            f.write(f'[functions]\nbase_url = "{host_url}"\nconcurrency = {CONCURRENCY}\n'
                    f'timeout = "30s"\n')
        self.procs: list[Proc] = []
        self.http_port = 0

    @property
    def api(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    def start(self) -> None:
        self.http_port = free_port()
        if not self.split:
            self.procs.append(Proc("zstalk serve", [
                self.exe, "serve", "-l", HOST, "-p", str(free_port()), "--counter-port", "0",
                "--worker-bind", "none", "--config", self.config,
                "--http-port", str(self.http_port)],
                keep=zstalk_keep))
        else:
            self.bport = free_port()
            ep = f"tcp://{HOST}:{self.bport}"
            self.procs.append(Proc("zstalk broker", [
                self.exe, "broker", "--bind", ep, "--config", self.config], keep=zstalk_keep))
            self.procs.append(Proc("zstalk front http", [
                self.exe, "front", "http", "--broker", ep, "--listen",
                f"{HOST}:{self.http_port}"], keep=zstalk_keep))
        wait_until(lambda: http_status(f"{self.api}/v1/tasks/no-such-task") == 404,
                   "zstalk HTTP API", self.procs)
        if self.split:
            self.add_dispatchers(self.dispatchers)

    def add_dispatchers(self, n: int) -> None:
        """n more dispatcher processes (split), back once each holds a TCP connection to
        the broker (bench_groups starts its dispatcher once the tasks are in)."""
        new = []
        for _ in range(n):
            new.append(Proc(f"zstalk dispatcher {len(self.procs) - 1}", [
                self.exe, "dispatcher", "--broker", f"tcp://{HOST}:{self.bport}", "--slots",
                SLOTS], keep=zstalk_keep))
            self.procs.append(new[-1])
        wait_until(lambda: all(self.bport in tcp_peers(p.pid) for p in new),
                   "zstalk dispatchers' broker connections", self.procs)

    def pids(self) -> list[int]:
        return [p for proc in self.procs for p in proc.pids()]

    def stop(self, notes: list[str]) -> None:
        for proc in reversed(self.procs):
            proc.stop(notes)
        self.procs = []


def zstalk_systems(args) -> dict[str, tuple[bool, int]]:
    """Row 3's variants: name -> (split, dispatchers)."""
    out = {SERVE: (False, 1)}
    for d in args.dispatchers:
        out[f"{SPLIT} + {d} dispatcher{'s' if d > 1 else ''}"] = (True, d)
    return out


async def zstalk_enqueue(api: str, name: str, n: int, batch: int | None, inflight: int,
                         meter: ShareMeter) -> dict:
    """Rows 1 (batch None: single POSTs) and 2 (arrays of `batch`)."""
    errors: list[str] = []
    url = f"{api}/v1/tasks"
    async with client(max(inflight, SINGLE_INFLIGHT)) as session:
        warm = [json.dumps(task_body(name + "_warm", i, HOUR_MS)).encode() for i in range(200)]
        await post_many(session, url, warm, SINGLE_INFLIGHT, 201, errors)
        if batch:
            bodies = batches(name, n, HOUR_MS, batch)
            t0 = meter.start()
            ok = await post_batches(session, url, bodies, inflight, errors)
        else:
            bodies = [json.dumps(task_body(name, i, HOUR_MS)).encode() for i in range(n)]
            t0 = meter.start()
            ok = await post_many(session, url, bodies, SINGLE_INFLIGHT, 201, errors)
        t1 = meter.stop()
    return sample(ok, t0, t1, meter, errors=errors)


async def zstalk_e2e(api: str, name: str, n: int, batch: int, inflight: int, cap_s: float,
                     meter: ShareMeter) -> dict:
    errors: list[str] = []
    url = f"{api}/v1/tasks"
    async with client(inflight + 2) as session:
        await post_batches(session, url, batches(name + "_warm", WARM_TASKS, None, batch), 1,
                           errors)
        warm_until = time.monotonic() + START_CAP_S
        while await open_tasks(session, api, name + "_warm"):
            if time.monotonic() > warm_until:
                raise RuntimeError(f"warm-up tasks not done after {START_CAP_S:.0f} s")
            await asyncio.sleep(POLL_S)
        bodies = batches(name, n, None, batch)
        wall0, t0 = time.time(), meter.start()
        accepted = await post_batches(session, url, bodies, inflight, errors)
        t_enq = time.monotonic()
        capped = False
        while await open_tasks(session, api, name):
            if time.monotonic() - t0 > cap_s:
                capped = True
                break
            await asyncio.sleep(POLL_S)
        t1 = meter.stop()
        statuses, last = await census(session, api, name)
    broker_s = None
    if last:
        broker_s = datetime.fromisoformat(last.replace("Z", "+00:00")).timestamp() - wall0
    return sample(statuses["success"], t0, t1, meter, accepted=accepted, statuses=dict(statuses),
                  enqueue_s=round(t_enq - t0, 4), broker_elapsed_s=broker_s, capped=capped,
                  errors=errors)


# --------------------------------------------------------------------------- Celery

CELERY_MODULE = '''\
"""Celery side of scripts/bench_tasks.py: one task making the function host's call."""
import json, os, threading
import urllib3
from celery import Celery

REDIS = os.environ["BENCH_REDIS"]
HOST_URL = os.environ["BENCH_HOST_URL"]
app = Celery("bench_celery_tasks", broker=REDIS + "/0", backend=REDIS + "/1")
app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"],
                worker_prefetch_multiplier=int(os.environ.get("BENCH_PREFETCH", "4")),
                worker_disable_rate_limits=True, result_expires=3600,
                broker_connection_retry_on_startup=True)
_pool = [None, None]                    # (pid, PoolManager): one per worker process
_lock = threading.Lock()


def http():
    pid = os.getpid()
    if _pool[0] != pid:
        with _lock:
            if _pool[0] != pid:
                _pool[1] = urllib3.PoolManager(maxsize=64, block=True, retries=False)
                _pool[0] = pid
    return _pool[1]


@app.task(name="call")
def call(name, params):
    r = http().request("POST", f"{HOST_URL}/{name}", body=json.dumps(params).encode(),
                       headers={"Content-Type": "application/json",
                                "X-Task-Id": call.request.id})
    if r.status // 100 != 2:
        raise RuntimeError(f"function answered {r.status}")
    return json.loads(r.data)
'''


def noteworthy(line: str) -> bool:
    """What of Celery's and redis-server's chatter is worth a note: errors, not their
    banners, the warning about running as root or redis' about memory overcommit."""
    low = line.lower()
    return (any(w in low for w in ("error", "exception", "traceback", "critical", "lost"))
            and not any(w in low for w in ("overcommit", "security")))


def celery_missing(args) -> str | None:
    if not shutil.which(args.redis_server):
        return f"no {args.redis_server} (apt-get install -y redis-server)"
    if not os.path.exists(args.celery_bin):
        return f"no {args.celery_bin} (.venv/bin/pip install -e '.[bench]')"
    return None


class CeleryOnRedis:
    """A fresh redis-server and Celery worker; the producer side lives in this process."""

    def __init__(self, args, host_url: str, tmp: str, pool: str, concurrency: int,
                 workers: int):
        self.args, self.host_url, self.tmp = args, host_url, tmp
        self.pool, self.concurrency, self.workers = pool, concurrency, workers
        with open(os.path.join(tmp, "bench_celery_tasks.py"), "w") as f:
            f.write(CELERY_MODULE)
        self.procs: list[Proc] = []
        self.mod = None

    def start(self) -> None:
        port = free_port()
        redis_url = f"redis://{HOST}:{port}"
        self.procs.append(Proc("redis-server", [
            self.args.redis_server, "--port", str(port), "--bind", HOST, "--save", "",
            "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"],
            keep=noteworthy))
        import redis
        self.redis = redis.Redis(host=HOST, port=port, db=1)
        wait_until(self._pong, "redis-server", self.procs)
        env = dict(os.environ, BENCH_REDIS=redis_url, BENCH_HOST_URL=self.host_url,
                   BENCH_PREFETCH=str(self.args.celery_prefetch), PYTHONPATH=self.tmp)
        for i in range(self.workers):
            self.procs.append(Proc(f"celery worker {i + 1}", [
                self.args.celery_bin, "--quiet", "-A", "bench_celery_tasks", "worker",
                "--pool", self.pool, "--concurrency", str(self.concurrency),
                "-n", f"w{i + 1}@%h", "--loglevel", "WARNING", "--without-gossip",
                "--without-mingle", "--without-heartbeat"],
                env=env, cwd=self.tmp, keep=noteworthy))
        os.environ.update(BENCH_REDIS=redis_url, BENCH_HOST_URL=self.host_url)
        if self.tmp not in sys.path:
            sys.path.insert(0, self.tmp)
        self.mod = importlib.reload(importlib.import_module("bench_celery_tasks"))

    def _pong(self) -> bool:
        try:
            return self.redis.ping()
        except Exception:
            return False

    def pids(self) -> list[int]:
        return [p for proc in self.procs for p in proc.pids()]

    def stop(self, notes: list[str]) -> None:
        if self.mod is not None:
            self.mod.app.close()
            self.redis.close()
        for proc in reversed(self.procs):
            proc.stop(notes)
        self.procs = []

    def publish(self, name: str, n: int) -> list[str]:
        call = self.mod.call
        with self.mod.app.producer_or_acquire() as producer:
            return [call.apply_async((name, {"i": i}), producer=producer).id for i in range(n)]

    def wait(self, ids: list[str], deadline: float) -> tuple[collections.Counter, bool]:
        """Poll the result keys of the tasks still missing until all are in."""
        backend = self.mod.app.backend
        pending = {backend.get_key_for_task(i): i for i in ids}
        statuses: collections.Counter = collections.Counter()
        while pending:
            keys = list(pending)
            for lo in range(0, len(keys), 1000):
                chunk = keys[lo:lo + 1000]
                for key, value in zip(chunk, self.redis.mget(chunk)):
                    if value is not None:
                        statuses[json.loads(value)["status"]] += 1
                        del pending[key]
            if not pending:
                break
            if time.monotonic() > deadline:
                return statuses, True
            time.sleep(POLL_S)
        return statuses, False

    def e2e(self, name: str, n: int, cap_s: float, meter: ShareMeter) -> dict:
        _, capped = self.wait(self.publish(name + "_warm", WARM_TASKS),
                              time.monotonic() + START_CAP_S)
        if capped:
            raise RuntimeError(f"Celery warm-up tasks not done after {START_CAP_S:.0f} s")
        t0 = meter.start()
        ids = self.publish(name, n)
        t_enq = time.monotonic()
        statuses, capped = self.wait(ids, t0 + cap_s)
        t1 = meter.stop()
        return sample(statuses["SUCCESS"], t0, t1, meter, accepted=len(ids),
                      statuses=dict(statuses), enqueue_s=round(t_enq - t0, 4),
                      capped=capped, errors=[])


def parse_celery(spec: str) -> list[tuple[str, int, int]]:
    """`POOL:C[xW]` items: W worker processes (1), each `--pool POOL --concurrency C`."""
    out = []
    for item in spec.split(","):
        pool, _, rest = item.strip().partition(":")
        c, _, w = (rest or "1").partition("x")
        out.append((pool, int(c), int(w or 1)))
    return out


# --------------------------------------------------------------------------- direct loop

async def direct_loop(host_url: str, name: str, n: int, meter: ShareMeter) -> dict:
    errors: list[str] = []
    url = f"{host_url}/{name}"
    async with client(DIRECT_INFLIGHT) as session:
        warm = [json.dumps({"i": i}).encode() for i in range(500)]
        await post_many(session, f"{host_url}/{name}_warm", warm, DIRECT_INFLIGHT, 200, errors)
        bodies = [json.dumps({"i": i}).encode() for i in range(n)]
        t0 = meter.start()
        ok = await post_many(session, url, bodies, DIRECT_INFLIGHT, 200, errors)
        t1 = meter.stop()
    return sample(ok, t0, t1, meter, errors=errors)


# --------------------------------------------------------------------------- the runs

class Bench:
    def __init__(self, run: Run, host: FunctionHost, tmp: str) -> None:
        self.run, self.args, self.host, self.tmp = run, run.args, host, tmp
        self.results: dict[str, dict] = {"enqueue_single": {}, "enqueue_batch": {}, "e2e": {}}
        self.aborted: collections.Counter = collections.Counter()
        self.runs = 0

    def measure(self, key: str, label: str, column: str, system, fn, n: int, calls: int,
                warm: bool) -> None:
        """One run: start `system` (None: nothing to start), `fn(name, meter)` gives the
        sample, stop; then check the host saw `calls` calls (each task once)."""
        self.runs += 1
        name = f"r{self.runs}"
        meter = ShareMeter(system=system.pids if system else list,
                           host=lambda: [self.host.proc.pid])
        notes: list[str] = []
        try:
            if system:
                system.start()
            s = fn(name, meter)
        except Exception as exc:
            s = None
            notes.append(f"aborted: {exc!r}")
        finally:
            if system:
                system.stop(notes)
        where = f"{label} / {column}{' (warm-up)' if warm else ''}"
        self.run.notes += [f"{where} ({key}, run {name}): {note}" for note in notes]
        runs = self.results[key].setdefault(label, {}).setdefault(column, [])
        if s is None:
            self.aborted[key, label, column] += 1
            log(f"  {where}: aborted, see the notes")
            return
        s.update(host=self.host.calls(name), function=name, n=n,
                 cpu_per_1k=per_1k(meter.cpu["system"], s["count"]) if system else None)
        self.check(s, n, calls)
        if not warm:
            runs.append(s)
        flags = " CAPPED" if s.get("capped") else ""
        flags += f" ERRORS {s['errors'][:2]}" if s["errors"] else ""
        log(f"  {where}: {s['rate'] or 0:,.0f}/s ({s['count']:,} in {s['elapsed_s']:.2f} s; "
            f"cpu gen {s['gen_cpu_share']:.2f} system {s['system_cpu_share']:.2f} host "
            f"{s['host_cpu_share']:.2f} others {s['others_cpu_share']:.2f}){flags}")

    @staticmethod
    def check(s: dict, n: int, calls: int) -> None:
        if s["count"] != n:
            s["errors"].append(f"{s['count']:,} of {n:,} done ({s.get('statuses')})")
        got = s["host"]
        if got["calls"] != calls:
            s["errors"].append(f"the function host had {got['calls']:,} calls, not {calls:,}")
        if calls and "statuses" in s and got["ids"] != calls:
            s["errors"].append(f"{got['ids']:,} distinct task ids called, not {calls:,}")

    def rotation(self, systems: list) -> None:
        """Each repetition runs every system once; the order reversed every other one."""
        for rep, order, warm in rounds(systems, self.args.repeats, self.args.warmup):
            log(f" {'warm-up' if warm else f'repetition {rep + 1}/{self.args.repeats}'}")
            for item in order:
                self.measure(*item, warm=warm)

    def zstalk(self, split: bool, dispatchers: int):
        """(column, Zstalk) for each build."""
        return [(b.label, Zstalk(b, self.host.url, self.tmp, split, dispatchers))
                for b in self.run.builds]

    def row_enqueue(self, batch_form: bool) -> None:
        args = self.args
        key = "enqueue_batch" if batch_form else "enqueue_single"
        n = args.batch_tasks if batch_form else args.enqueue_tasks
        systems = []
        for label, split in ((SERVE, False), (SPLIT, True)):
            for column, z in self.zstalk(split, 0):
                fn = (lambda z: lambda name, meter: run_async(asyncio.wait_for(
                    zstalk_enqueue(z.api, name, n, args.batch_size if batch_form else None,
                                   args.batch_inflight, meter), args.time_cap)))(z)
                systems.append((key, label, column, z, fn, n, 0))
        self.rotation(systems)

    def row_e2e(self, rows: set[int]) -> None:
        args = self.args
        n = args.tasks
        systems = []
        if 3 in rows:
            for label, (split, d) in zstalk_systems(args).items():
                for column, z in self.zstalk(split, d):
                    fn = (lambda z: lambda name, meter: run_async(zstalk_e2e(
                        z.api, name, n, args.batch_size, args.batch_inflight, args.time_cap,
                        meter)))(z)
                    systems.append(("e2e", label, column, z, fn, n, n))
        if 4 in rows:
            missing = celery_missing(args)
            if missing:
                self.run.notes.append(f"row 4 (Celery) skipped: {missing}")
            for pool, c, w in ([] if missing else args.celery):
                cel = CeleryOnRedis(args, self.host.url, self.tmp, pool, c, w)
                fn = (lambda cel: lambda name, meter: cel.e2e(name, n, args.time_cap, meter))(cel)
                systems.append(("e2e", celery_label(pool, c, w), CELERY, cel, fn, n, n))
        if 5 in rows:
            m = args.direct_requests
            fn = lambda name, meter: run_async(asyncio.wait_for(    # noqa: E731
                direct_loop(self.host.url, name, m, meter), args.time_cap))
            systems.append(("e2e", f"{DIRECT}, {DIRECT_INFLIGHT} in flight", DIRECT, None, fn,
                            m, m))
        self.rotation(systems)


def celery_label(pool: str, c: int, workers: int) -> str:
    many = f"{workers} workers x " if workers > 1 else ""
    return f"Celery {many}--pool {pool} --concurrency {c}"


# --------------------------------------------------------------------------- report

def build_table(bench: Bench) -> Table:
    run, res, args = bench.run, bench.results, bench.args
    now = run.labels()[0]
    cols = [(b, b) for b in run.labels()] + [(CELERY, CELERY), (DIRECT, DIRECT)]
    t = Table("tasks", "Cloud tasks against Celery on Redis (tasks/s)", cols,
              [(now, CELERY), (now, DIRECT)] + run.against_ratios(), note=(
                  "One aiohttp function host answering 200 with a small JSON for every "
                  "system; zstalk in one process (`serve --config`) or split (`broker`, "
                  "`front http`, `dispatcher` processes); Celery on Redis with the task making "
                  "the same POST through a pooled client; the direct loop is the physical "
                  f"limit, {DIRECT_INFLIGHT} requests in flight straight to the host. "
                  f"{args.tasks:,} tasks end to end, each checked to be called exactly once; in "
                  "the rows 3 the Celery column is the best Celery variant's median."))
    e2e = res["e2e"]
    celery = [Figure.of(v.get(CELERY), "rate") for k, v in e2e.items() if k.startswith(CELERY)]
    best_celery = max(celery, key=lambda f: f.median or 0, default=Figure())
    direct = next((Figure.of(v.get(DIRECT), "rate") for k, v in e2e.items()
                   if k.startswith(DIRECT)), Figure())

    def add(key, label, metric, extra=None, target=None):
        per = res[key][label]
        lost = sum(v for (k, lab, _), v in bench.aborted.items() if (k, lab) == (key, label))
        flags = (" [capped]" if any(s.get("capped") for r in per.values() for s in r) else "")
        flags += f" [{lost} runs aborted]" if lost else ""
        t.add(metric + flags, dict({c: Figure.of(r, "rate") for c, r in per.items()},
                                   **(extra or {})), target=target)
        t.add("  system CPU-s per 1,000 tasks", {c: Figure.of(r, "cpu_per_1k")
                                                 for c, r in per.items()}, fmt="{:.4g}")

    for label in res["enqueue_single"]:
        add("enqueue_single", label, f"1: enqueue, single POSTs, {SINGLE_INFLIGHT} in flight: "
            f"{label}")
    for label in res["enqueue_batch"]:
        add("enqueue_batch", label, f"2: enqueue, arrays of {args.batch_size:,}, "
            f"{args.batch_inflight} in flight: {label}", target=(now, ">=", 10000, ">= 10,000/s"))
    for label in e2e:
        if not label.startswith((CELERY, DIRECT)):
            add("e2e", label, f"3: end to end: {label}", {CELERY: best_celery, DIRECT: direct},
                [(f"{now}/{CELERY}", ">=", 2.0), (f"{now}/{DIRECT}", ">=", 0.5)])
    for label in e2e:
        if label.startswith(CELERY):
            add("e2e", label, f"4: end to end: {label}")
    for label in e2e:
        if label.startswith(DIRECT):
            t.add(f"5: {label}", {DIRECT: direct})
    return t


# --------------------------------------------------------------------------- main

def parse_args(argv):
    ap = parser(__doc__)
    ap.add_argument("--rows", default="1,2,3,4,5", help="rows to run, e.g. 3,5")
    ap.add_argument("--tasks", type=int, default=None,
                    help="rows 3-4: tasks per end-to-end run (5,000; 1,000 with --quick)")
    ap.add_argument("--enqueue-tasks", type=int, default=None,
                    help="row 1: single POSTs per run (10,000; 2,000 with --quick)")
    ap.add_argument("--batch-tasks", type=int, default=None,
                    help="row 2: tasks per run (50,000; 10,000 with --quick)")
    ap.add_argument("--direct-requests", type=int, default=None,
                    help="row 5: requests per run (20,000; 5,000 with --quick)")
    ap.add_argument("--batch-inflight", type=int, default=2,
                    help="rows 2-3: task arrays in flight")
    ap.add_argument("--batch-size", type=int, default=1000,
                    help="rows 2-3: tasks per POSTed array (the API takes up to 1,000)")
    ap.add_argument("--dispatchers", default=None,
                    help="row 3: dispatcher processes of the split variants (1,4)")
    ap.add_argument("--celery", default=None,
                    help="row 4: Celery variants POOL:CONCURRENCY[xWORKER_PROCESSES] "
                         "(solo:1,solo:1x4)")
    ap.add_argument("--celery-prefetch", type=int, default=64,
                    help="row 4: Celery's worker_prefetch_multiplier")
    ap.add_argument("--time-cap", type=float, default=60.0, help="seconds per run at most")
    ap.add_argument("--celery-bin", default=str(REPO / ".venv" / "bin" / "celery"))
    ap.add_argument("--redis-server", default="redis-server")
    ap.add_argument("--function-host", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    sized(args, tasks=(5000, 1000, 300), enqueue_tasks=(10000, 2000, 300),
          batch_tasks=(50000, 10000, 2000), direct_requests=(20000, 5000, 500),
          dispatchers=("1,4", "1,4", "1"), celery=("solo:1,solo:1x4",) * 2 + ("solo:1",))
    args.dispatchers = [int(x) for x in args.dispatchers.split(",") if x.strip()]
    args.celery = parse_celery(args.celery)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.function_host:
        function_host_main(args.function_host)
        return 0
    rows = {int(x) for x in args.rows.split(",") if x.strip()}
    run = Run("bench_tasks", args)
    run.machine.update(redis=tool_version([args.redis_server, "--version"]),
                       celery=tool_version([args.celery_bin, "--version"]))
    tmp = tempfile.mkdtemp(prefix="bench_tasks_")
    bench = None
    try:
        bench = Bench(run, FunctionHost(), tmp)
        steps = [(1, "row 1: enqueue, single POSTs", lambda: bench.row_enqueue(False)),
                 (2, f"row 2: enqueue, arrays of {args.batch_size:,}",
                  lambda: bench.row_enqueue(True)),
                 (3, "rows 3-5: end to end (zstalk, Celery, direct loop)",
                  lambda: bench.row_e2e(rows))]
        for num, label, fn in steps:
            if num in rows or (num == 3 and rows & {4, 5}):
                log(f"{label} ...")
                t0 = time.monotonic()
                fn()
                log(f"  ({time.monotonic() - t0:.1f}s)")
    finally:
        Proc.stop_all(run.notes)
        shutil.rmtree(tmp, ignore_errors=True)
    return run.report([build_table(bench)], bench.results, [cpu_shares(
        bench.results, ("gen_cpu_share", "system_cpu_share", "host_cpu_share",
                        "others_cpu_share"))])


if __name__ == "__main__":
    use_project_venv()
    sys.exit(main())
