#!/usr/bin/env python3
"""Benchmark zstalk's cloud tasks over HTTP against Celery on Redis and a direct HTTP loop.

Usage:
    .venv/bin/python scripts/bench_tasks.py [--quick] [--repeats N] [--json PATH]
        [--rows 1,2,3,4,5] [--tasks N] [--enqueue-tasks N] [--batch-tasks N]
        [--direct-requests N] [--batch-size N] [--batch-inflight N] [--dispatchers 1,4]
        [--celery solo:1,solo:1x4] [--celery-prefetch N] [--time-cap S]

Row 4 needs Debian's redis-server (`apt-get install -y redis-server`) and Celery
(`.venv/bin/pip install -e '.[bench]'`); without them it is skipped and says why.
A full run takes about 2-3 minutes on 2 cores, --quick about 40 s.

Method
------
Everything runs on 127.0.0.1 on ports this script picks (bind to port 0, release).  ONE
function host serves every system for the whole run: an aiohttp app in its own process
(zstalk's event loop: uvloop where installed; keep-alive) answering `POST /{name}` with
200 and `{"ok": true}`.  It counts the calls per name and the distinct task ids per name
(the X-Zstalk-Task-Id / X-Task-Id header), so every run checks that each task was
called exactly once.  Each run uses a function name of its own, so counts never mix.

zstalk runs in two placements, fresh processes for every run, with the config
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
keep-alive pool per run) on zstalk's event loop; bodies are built before the clock
starts; any one request gives up after 5 s (they take milliseconds), which aborts the
run with a note.

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
are one rotation), the order reversed every other repetition, so noise from other
tenants of this shared 2-core machine hits all alike.  Each figure is the BEST of
--repeats runs (3; 1 with --quick): interference only ever slows a run down.  Every
sample is in the --json file.  Each zstalk end-to-end figure is set against the best
Celery figure (target >= 2x) and the direct loop (target >= 0.5x).  A run has a time
cap (--time-cap, 60 s): a capped run reports what finished in the time and is flagged.

CPU check: each run records CPU seconds / wall seconds over its timed part of the
generator (this process), the system under test (its process trees, /proc/<pid>/stat),
the function host, and everything else on the machine (busy time from /proc/stat less
ours).  "others" well above 0 means another tenant took CPU during the run.

The script stops everything it started, also on an error or Ctrl-C: each process runs
in a session of its own, gets SIGTERM, then its whole process group SIGKILL.  What a
process wrote (beyond zstalk's start-up line; Celery's and redis' only if it names an
error), exit statuses other than 0 / SIGTERM, wrong answers, and tasks not called
exactly once are reported.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import importlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path

from bench_beanstalk import free_port, proc_cpu_s, proc_tree  # (run as a script)

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
DEFAULT_ZSTALK = str(BIN / "zstalk")
DEFAULT_CELERY = str(BIN / "celery")
TICKS = os.sysconf("SC_CLK_TCK")
RESULT = b'{"ok": true}'
JSON_HEADERS = {"Content-Type": "application/json"}
REQUEST_TIMEOUT_S = 5.0     # any one HTTP request of the generator (they take ~20 ms)
SINGLE_INFLIGHT = 32        # row 1: coroutines, one request in flight each
DIRECT_INFLIGHT = 64        # row 5
SLOTS = 64                  # per dispatcher process
CONCURRENCY = 256           # the function's concurrency: never the limit (4 x 64 slots)
HOUR_MS = 3_600_000
WARM_TASKS = 200
POLL_S = 0.01
START_CAP_S = 30.0
ZSTALK_START_LINE = "zstalk: beanstalk on "
SERVE = "zstalk serve (1 process)"


# --------------------------------------------------------------------------- processes

def machine_busy_s() -> float:
    """CPU seconds all cores spent busy since boot (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / TICKS


def tcp_peers(pid: int) -> set[int]:
    """Remote ports of the established TCP connections process `pid` holds."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:         # closed meanwhile
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        with open(f"/proc/{pid}/net/tcp") as f:
            rows = [line.split() for line in f.readlines()[1:]]
    except OSError:
        return set()
    # columns: sl local_address rem_address st ... inode (st 01: ESTABLISHED)
    return {int(r[2].split(":")[1], 16) for r in rows if r[3] == "01" and r[9] in inodes}


class Proc:
    """A process this script started, in a session of its own (so its whole group can be
    killed), output to a temp file.  `Proc.live` lists the ones not yet stopped."""
    live: list["Proc"] = []

    def __init__(self, name: str, argv: list[str], env: dict | None = None,
                 cwd: str | None = None, keep=lambda line: True) -> None:
        self.name, self.keep = name, keep
        self.out = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.out,
                                     stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                     start_new_session=True)
        Proc.live.append(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def pids(self) -> list[int]:
        return proc_tree(self.pid) if self.alive() else []

    def output(self) -> str:
        self.out.seek(0)
        return self.out.read().decode(errors="replace")

    def check(self) -> None:
        if not self.alive():
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: "
                               f"{self.output()[-2000:]!r}")

    def stop(self, notes: list[str], grace_s: float = 10.0) -> None:
        """SIGTERM, up to grace_s to exit, then SIGKILL to the whole group."""
        if self in Proc.live:
            Proc.live.remove(self)
        rc = self.proc.poll()
        if rc is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                notes.append(f"{self.name} did not exit {grace_s:.0f} s after SIGTERM: killed")
        try:
            os.killpg(self.pid, signal.SIGKILL)     # children left behind (celery's pool)
        except OSError:
            pass
        rc = self.proc.wait(5)
        if rc not in (0, -signal.SIGTERM):
            notes.append(f"{self.name} exit status {rc}")
        text = "\n".join(line for line in self.output().splitlines()
                         if line.strip() and self.keep(line)).strip()
        if text:
            notes.append(f"{self.name} output:\n{text[-3000:]}")
        self.out.close()

    @classmethod
    def stop_all(cls, notes: list[str]) -> None:
        for p in reversed(list(cls.live)):
            p.stop(notes, grace_s=3.0)


def wait_until(ready, what: str, procs: list[Proc], cap_s: float = START_CAP_S) -> None:
    deadline = time.monotonic() + cap_s
    while True:
        for p in procs:
            p.check()
        if ready():
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {cap_s:.0f} s")
        time.sleep(0.02)


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


# --------------------------------------------------------------------------- function host

def function_host_main(port: int) -> None:
    """The trivial function host (`--function-host PORT`, run as a child of this script)."""
    from aiohttp import web
    from zstalk.protocol.transport.loop import loop_factory

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
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.proc = Proc("function host", [sys.executable, __file__, "--function-host",
                                           str(self.port)], cwd=str(REPO))
        wait_until(lambda: http_status(f"{self.url}/_calls/x") == 200, "function host",
                   [self.proc])

    def calls(self, name: str) -> dict:
        with urllib.request.urlopen(f"{self.url}/_calls/{name}", timeout=10) as r:
            return json.loads(r.read())


# --------------------------------------------------------------------------- HTTP load

def task_body(name: str, i: int, delay_ms: int | None) -> dict:
    task = {"function": name, "params": {"i": i}}
    if delay_ms:
        task["options"] = {"delay": delay_ms}
    return task


def batches(name: str, n: int, delay_ms: int | None, size: int) -> list[bytes]:
    """The JSON arrays of `size` tasks (the last one shorter) that make n tasks."""
    return [json.dumps([task_body(name, i, delay_ms) for i in range(lo, min(n, lo + size))]
                       ).encode() for lo in range(0, n, size)]


def client(limit: int):
    import aiohttp
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit),
                                 timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S))


async def post_all(session, url: str, bodies: list[bytes], inflight: int, count) -> int:
    """POST every body, `inflight` at a time; the sum of `await count(response)` (the
    answers that count as done)."""
    it = iter(bodies)
    ok = 0

    async def lane():
        nonlocal ok
        for body in it:
            async with session.post(url, data=body, headers=JSON_HEADERS) as r:
                ok += await count(r)
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


def run_async(coro):
    from zstalk.protocol.transport.loop import run
    return run(coro)


# --------------------------------------------------------------------------- measuring

class Meter:
    """CPU seconds of the generator, the system, the host and everyone else, from start()
    to stop() (the timed part of a run), as shares of the wall time (1.0 = one core)."""

    def __init__(self, system_pids, host_pid: int) -> None:
        self.system_pids, self.host_pid = system_pids, host_pid
        self.shares: dict = {}

    def _sys(self) -> dict[int, float]:
        return {p: proc_cpu_s(p) for p in self.system_pids()}

    def start(self) -> float:
        self.sys0, self.host0 = self._sys(), proc_cpu_s(self.host_pid)
        self.busy0, self.gen0 = machine_busy_s(), time.process_time()
        self.t0 = time.monotonic()
        return self.t0

    def stop(self) -> float:
        t1 = time.monotonic()
        wall = t1 - self.t0
        gen = time.process_time() - self.gen0
        system = sum(v - self.sys0.get(p, 0.0) for p, v in self._sys().items())
        host = proc_cpu_s(self.host_pid) - self.host0
        others = machine_busy_s() - self.busy0 - gen - system - host
        self.shares = {k: round(v / wall, 3) for k, v in (
            ("gen_cpu_share", gen), ("system_cpu_share", system),
            ("host_cpu_share", host), ("others_cpu_share", max(0.0, others)))}
        return t1


def sample(count: int, t0: float, t1: float, meter: Meter, **extra) -> dict:
    elapsed = t1 - t0
    return dict(count=count, elapsed_s=round(elapsed, 4),
                rate=count / elapsed if elapsed > 0 else None, **meter.shares, **extra)


# --------------------------------------------------------------------------- zstalk

class Zstalk:
    """One zstalk placement: `serve` (one process) or broker + HTTP front + D dispatchers."""

    def __init__(self, exe: str, host_url: str, tmp: str, split: bool, dispatchers: int):
        self.exe, self.split, self.dispatchers = exe, split, dispatchers
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
                keep=lambda line: not line.startswith(ZSTALK_START_LINE)))
        else:
            bport = free_port()
            ep = f"tcp://{HOST}:{bport}"
            self.procs.append(Proc("zstalk broker", [self.exe, "broker", "--bind", ep,
                                                     "--config", self.config]))
            self.procs.append(Proc("zstalk front http", [
                self.exe, "front", "http", "--broker", ep, "--listen",
                f"{HOST}:{self.http_port}"]))
            for i in range(self.dispatchers):
                self.procs.append(Proc(f"zstalk dispatcher {i + 1}", [
                    self.exe, "dispatcher", "--broker", ep, "--slots", str(SLOTS)]))
        wait_until(lambda: http_status(f"{self.api}/v1/tasks/no-such-task") == 404,
                   "zstalk HTTP API", self.procs)
        if self.split:
            wait_until(lambda: all(bport in tcp_peers(p.pid) for p in self.procs[2:]),
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
        out[f"zstalk broker + front http + {d} dispatcher{'s' if d > 1 else ''}"] = (True, d)
    return out


async def zstalk_enqueue(api: str, name: str, n: int, batch: int | None, inflight: int,
                         meter: Meter) -> dict:
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
                     meter: Meter) -> dict:
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

    def e2e(self, name: str, n: int, cap_s: float, meter: Meter) -> dict:
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

async def direct_loop(host_url: str, name: str, n: int, meter: Meter) -> dict:
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

def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Bench:
    def __init__(self, args, host: FunctionHost, tmp: str) -> None:
        self.args, self.host, self.tmp = args, host, tmp
        self.results: dict[str, dict[str, list]] = {
            "enqueue_single": {}, "enqueue_batch": {}, "e2e": {}}
        self.notes: list[str] = []
        self.aborted: collections.Counter = collections.Counter()
        self.runs = 0

    def measure(self, key: str, label: str, system, fn, n: int, calls: int) -> None:
        """One run: start `system` (None: nothing to start), `fn(name, meter)` gives the
        sample, stop; then check the host saw `calls` calls (each task once)."""
        self.runs += 1
        name = f"r{self.runs}"
        meter = Meter(system.pids if system else list, self.host.proc.pid)
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
        self.notes += [f"{label} ({key}, run {name}): {note}" for note in notes]
        self.results[key].setdefault(label, [])
        if s is None:
            self.aborted[key, label] += 1
            log(f"  {label}: aborted, see the notes")
            return
        s.update(host=self.host.calls(name), function=name, n=n)
        self.check(s, n, calls)
        self.results[key].setdefault(label, []).append(s)
        flags = " CAPPED" if s.get("capped") else ""
        flags += f" ERRORS {s['errors'][:2]}" if s["errors"] else ""
        log(f"  {label}: {s['rate'] or 0:,.0f}/s ({s['count']:,} in {s['elapsed_s']:.2f} s; "
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
        """Each repetition runs every system once; the order is reversed every other one."""
        for rep in range(self.args.repeats):
            log(f" repetition {rep + 1}/{self.args.repeats}")
            for item in (systems if rep % 2 == 0 else systems[::-1]):
                self.measure(*item)

    def row_enqueue(self, batch_form: bool) -> None:
        args = self.args
        key = "enqueue_batch" if batch_form else "enqueue_single"
        n = args.batch_tasks if batch_form else args.enqueue_tasks
        systems = []
        for label, split in ((SERVE, False), ("zstalk broker + front http", True)):
            z = Zstalk(args.zstalk, self.host.url, self.tmp, split, 0)
            fn = (lambda z: lambda name, meter: run_async(asyncio.wait_for(
                zstalk_enqueue(z.api, name, n, args.batch_size if batch_form else None,
                               args.batch_inflight, meter), args.time_cap)))(z)
            systems.append((key, label, z, fn, n, 0))
        self.rotation(systems)

    def row_e2e(self, rows: set[int]) -> None:
        args = self.args
        n = args.tasks
        systems = []
        if 3 in rows:
            for label, (split, d) in zstalk_systems(args).items():
                z = Zstalk(args.zstalk, self.host.url, self.tmp, split, d)
                fn = (lambda z: lambda name, meter: run_async(zstalk_e2e(
                    z.api, name, n, args.batch_size, args.batch_inflight, args.time_cap,
                    meter)))(z)
                systems.append(("e2e", label, z, fn, n, n))
        if 4 in rows:
            missing = celery_missing(args)
            if missing:
                self.notes.append(f"row 4 (Celery) skipped: {missing}")
            for pool, c, w in ([] if missing else args.celery):
                cel = CeleryOnRedis(args, self.host.url, self.tmp, pool, c, w)
                fn = (lambda cel: lambda name, meter: cel.e2e(name, n, args.time_cap, meter))(cel)
                systems.append(("e2e", celery_label(pool, c, w), cel, fn, n, n))
        if 5 in rows:
            m = args.direct_requests
            fn = lambda name, meter: run_async(asyncio.wait_for(
                direct_loop(self.host.url, name, m, meter), args.time_cap))
            systems.append(("e2e", DIRECT, None, fn, m, m))
        self.rotation(systems)


DIRECT = "direct loop, 64 in flight"


def celery_label(pool: str, c: int, workers: int) -> str:
    many = f"{workers} workers x " if workers > 1 else ""
    return f"Celery {many}--pool {pool} --concurrency {c}"


# --------------------------------------------------------------------------- report

def best(samples: list[dict]) -> float | None:
    rates = [s["rate"] for s in samples if s.get("rate")]
    return max(rates) if rates else None


def build_table(results: dict, aborted: collections.Counter, args) -> list[dict]:
    e2e = results["e2e"]
    celery = [best(v) for k, v in e2e.items() if k.startswith("Celery")]
    celery_best = max([c for c in celery if c], default=None)
    direct = best(e2e.get(DIRECT, []))
    rows = []

    def add(row, key, label, metric, target=None, vs=False):
        samples = results[key][label]
        rate = best(samples)
        lost = aborted[key, label]
        r = dict(row=row, metric=metric, rate=rate, runs=len(samples),
                 vs_celery=rate / celery_best if vs and rate and celery_best else None,
                 vs_direct=rate / direct if row in (3, 4) and rate and direct else None,
                 target="", result="",
                 flags=("capped " if any(s.get("capped") for s in samples) else "")
                 + ("errors " if any(s["errors"] for s in samples) else "")
                 + (f"{lost} of {lost + len(samples)} runs aborted" if lost else ""))
        if target == "batch":
            r["target"] = ">= 10,000/s"
            r["result"] = "-" if rate is None else "met" if rate >= 10_000 else "missed"
        elif target == "e2e":
            r["target"] = ">= 2x Celery, >= 0.5x direct"
            checks = [("Celery", r["vs_celery"], 2.0), ("direct", r["vs_direct"], 0.5)]
            missed = [who for who, v, goal in checks if v is not None and v < goal]
            known = [v for _, v, _ in checks if v is not None]
            r["result"] = ("-" if not known else "missed (" + ", ".join(missed) + ")"
                           if missed else "met" if len(known) == 2 else "met (part)")
        rows.append(r)

    for label in results["enqueue_single"]:
        add(1, "enqueue_single", label,
            f"enqueue, single POSTs, {SINGLE_INFLIGHT} in flight: {label}")
    for label in results["enqueue_batch"]:
        add(2, "enqueue_batch", label, f"enqueue, arrays of {args.batch_size:,}, "
            f"{args.batch_inflight} in flight: {label}", target="batch")
    for label in e2e:
        if label.startswith("zstalk"):
            add(3, "e2e", label, f"end to end: {label}", target="e2e", vs=True)
    for label in e2e:
        if label.startswith("Celery"):
            add(4, "e2e", label, f"end to end: {label}")
    if DIRECT in e2e:
        add(5, "e2e", DIRECT, DIRECT)
    return rows


def _fmt(v, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def render(rows: list[dict]) -> tuple[str, str]:
    header = ["row", "metric", "tasks/s", "vs Celery", "vs direct", "target", "result"]
    body = [[str(r["row"]), r["metric"] + (f" [{r['flags'].strip()}]" if r["flags"] else ""),
             _fmt(r["rate"], "{:,.0f}"), _fmt(r["vs_celery"], "{:.2f}x"),
             _fmt(r["vs_direct"], "{:.2f}x"), r["target"], r["result"]] for r in rows]
    widths = [max(len(header[i]), *(len(b[i]) for b in body)) for i in range(len(header))]
    right = {0, 2, 3, 4}

    def line(cells):
        return "  ".join(c.rjust(widths[i]) if i in right else c.ljust(widths[i])
                         for i, c in enumerate(cells)).rstrip()
    text = [line(header), line(["-" * w for w in widths])] + [line(b) for b in body]
    md = ["| " + " | ".join(header) + " |",
          "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|"]
    md += ["| " + " | ".join(c.replace("|", "\\|") for c in b) + " |" for b in body]
    return "\n".join(text), "\n".join(md)


def diagnostics(results: dict) -> str:
    """Per system: the range over runs of each CPU share (cpu s / wall s)."""
    out = ["CPU check (cpu s / wall s over the timed part, min-max of the runs; 1.00 = one "
           "core of 2):"]
    for key, per in results.items():
        for label, samples in per.items():
            parts = []
            for k in ("gen", "system", "host", "others"):
                v = [s[f"{k}_cpu_share"] for s in samples]
                parts.append(f"{k} {min(v):.2f}-{max(v):.2f}" if v else "")
            out.append(f"  {key} / {label}: " + (", ".join(parts) if samples else
                                                  "no run finished"))
    return "\n".join(out)


def errors_of(results: dict) -> list[str]:
    return [f"{key} / {label} run {s['function']}: {e}" for key, per in results.items()
            for label, samples in per.items() for s in samples for e in s["errors"]]


# --------------------------------------------------------------------------- main

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small counts, one repetition")
    ap.add_argument("--rows", default="1,2,3,4,5", help="rows to run, e.g. 3,5")
    ap.add_argument("--repeats", type=int, default=None,
                    help="repetitions of every run (default 3; 1 with --quick); best taken")
    ap.add_argument("--json", help="write results as JSON to this path")
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
    ap.add_argument("--dispatchers", default="1,4",
                    help="row 3: dispatcher processes of the split variants")
    ap.add_argument("--celery", default="solo:1,solo:1x4",
                    help="row 4: Celery variants POOL:CONCURRENCY[xWORKER_PROCESSES]")
    ap.add_argument("--celery-prefetch", type=int, default=64,
                    help="row 4: Celery's worker_prefetch_multiplier")
    ap.add_argument("--time-cap", type=float, default=60.0, help="seconds per run at most")
    ap.add_argument("--zstalk", default=DEFAULT_ZSTALK)
    ap.add_argument("--celery-bin", default=DEFAULT_CELERY)
    ap.add_argument("--redis-server", default="redis-server")
    ap.add_argument("--function-host", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    quick = args.quick
    for name, full, small in (("repeats", 3, 1), ("tasks", 5000, 1000),
                              ("enqueue_tasks", 10000, 2000), ("batch_tasks", 50000, 10000),
                              ("direct_requests", 20000, 5000)):
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)
    args.dispatchers = [int(x) for x in args.dispatchers.split(",") if x.strip()]
    args.celery = parse_celery(args.celery)
    return args


def versions(args) -> dict:
    def run(argv):
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=30,
                                  cwd=str(REPO)).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return None
    return dict(zstalk_commit=run(["git", "rev-parse", "--short", "HEAD"]),
                zstalk_dirty=bool(run(["git", "status", "--porcelain", "--untracked-files=no"])),
                redis=run([args.redis_server, "--version"]),
                celery=run([args.celery_bin, "--version"]) if os.path.exists(args.celery_bin)
                else None, python=sys.version.split()[0], nproc=os.cpu_count())


def report(bench: Bench, args, meta: dict) -> None:
    table = build_table(bench.results, bench.aborted, args)
    text, md = render(table)
    print()
    print(text)
    print()
    print("Markdown:")
    print()
    print(md)
    print()
    print(f"best of {args.repeats} run(s); end-to-end runs of {args.tasks:,} tasks, direct "
          f"loop {args.direct_requests:,} requests; systems alternated, order reversed every "
          f"other repetition; fresh processes per run")
    print(diagnostics(bench.results))
    errs = errors_of(bench.results)
    if errs or bench.notes:
        print("\nerrors and notes:")
        for line in errs + bench.notes:
            print("  " + line.replace("\n", "\n    "))
    else:
        print("\nno errors: every task enqueued, called once and recorded; no process output")
    print(f"\ntotal time {meta['elapsed_s']:.1f}s, load average before "
          f"{meta['loadavg_before'][0]:.2f}, after {meta['loadavg_after'][0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, table=table, markdown=md, results=bench.results,
                           errors=errs, notes=bench.notes), f, indent=1, default=str)
        print(f"JSON written to {args.json}")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.function_host:
        function_host_main(args.function_host)
        return 0
    rows = {int(x) for x in args.rows.split(",") if x.strip()}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # so `finally` cleans up
    t_start = time.monotonic()
    meta = dict(started=time.strftime("%Y-%m-%d %H:%M:%S"), argv=sys.argv[1:],
                quick=args.quick, repeats=args.repeats, loadavg_before=os.getloadavg(),
                **versions(args))
    log(f"bench_tasks: zstalk {meta['zstalk_commit']}{' (dirty)' if meta['zstalk_dirty'] else ''}"
        f", {meta['celery'] or 'no celery'}, {(meta['redis'] or 'no redis').split(' sha')[0]}, "
        f"{'quick' if args.quick else 'full'}, repeats={args.repeats}, rows={sorted(rows)}, "
        f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}")
    tmp = tempfile.mkdtemp(prefix="bench_tasks_")
    notes: list[str] = []
    bench, status = None, 0
    try:
        bench = Bench(args, FunctionHost(), tmp)
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
    except (KeyboardInterrupt, SystemExit) as exc:
        status = 130 if isinstance(exc, KeyboardInterrupt) else 143
        notes.append("interrupted: the report covers the runs that finished")
        log("interrupted: stopping every process this script started")
    finally:
        Proc.stop_all(notes)
        shutil.rmtree(tmp, ignore_errors=True)
    if bench is None:
        print("\n".join(notes))
        return status or 1
    bench.notes += notes
    meta.update(elapsed_s=time.monotonic() - t_start, loadavg_after=os.getloadavg())
    report(bench, args, meta)
    return status

if __name__ == "__main__":
    sys.exit(main())
