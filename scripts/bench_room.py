#!/usr/bin/env python3
"""Benchmark the waiting room: pass verifies per front process, admission rates, the ETA.

Usage:
    scripts/bench_room.py [--quick | --smoke] [--repeats N] [--warmup N] [--against REF]
        [--json PATH] [--parts 1,2,3] [--verifies N] [--passes N] [--conns N]
        [--rates 20,100] [--seconds S] [--poll-ms MS] [--eta-rate N] [--eta-rate-tasks N]
        [--eta-concurrency N] [--eta-hold-ms MS] [--eta-warm N] [--eta-tasks N]
        [--launch-tasks N] [--streams N] [--launch-rate N] [--window S] [--time-cap S]

Targets (issue 31): at least 5,000 verifies a second per front process.  The ETA rows
carry issue 27's targets for the same figure on offline tasks (median error at most 5 %,
p90 10 %, when the rate holds the line; 15 % and 35 % when the concurrency does).
Part 4 carries issue 48's: 1,200 ± 24 admissions in 60 s at 20/s (± 2 % of rate x
window), no stream's place events more than 2 s apart while its place falls, the HTTP
front at most 200 MiB of RSS and 0.5 core, the generator below 0.8 core.  --quick takes
25 s on 2 cores for parts 1-3 and 25 s for part 4, --smoke 16 s and 7 s; a full run (4
rounds of each row, larger counts, part 4's 60 s runs) should take about 7 minutes,
reckoned from --quick's parts, not yet timed.

Method
------
What every row shares (free loopback ports, fresh processes per run, alternation with
warm-up, medians with their min-max, the machine check, stopping what was started,
--against) is in scripts/harness/__init__.py; a run is harness/runs.py's.  zstalk is
bench_limits.py's split placement without a dispatcher, fresh for every run and for each
build: `zstalk broker --bind tcp://127.0.0.1:B --config C` and `zstalk front http
--broker ... --listen 127.0.0.1:H`, the front given a pass key file of one 64-character
key by ZSTALK_PASS_KEY_FILE (as a mounted Secret would), so the front is a process of
its own and "per front process" is what it says.  C has one function per run:
`[functions.F] online = "only"`, `pass_ttl = "1h"`, `max_waiting_per_client =
1000000` (every user here is 127.0.0.1), and the concurrency and rate below.  Online
tasks are enqueued as JSON arrays of `{"function": F, "type": "online"}` (at most 1,000
an array).  "A user" is a coroutine of this process (aiohttp on uvloop, 64 keep-alive
connections in all) that GETs its task every --poll-ms (500; its first GET at a random
point within the first period, so polls spread) until it is admitted, then POSTs
`/v1/tasks/{id}/done` with its pass as a Bearer token (after --eta-hold-ms in part 3b,
at once elsewhere).  Every run checks that each task was admitted once and ended
`success` by `done`.

* Part 1, verifies a second through one front process.  F has `concurrency = --passes`
  (500; 200 --smoke) and no rate; --passes online tasks are enqueued, all admitted at
  once, and each one's pass read from its TaskInfo.  The load: this process's raw-socket
  HTTP/1.1 generator (harness/httpload.py: one process, one epoll loop, requests built
  before the clock starts), --conns (64) keep-alive connections with one request in
  flight each, as nginx's auth_request upstream connections have (64 keep the front
  near one core here; with 32 it idled at 0.75-0.9, waiting on the broker): `GET
  /v1/passes/verify?function=F` with `Authorization: Bearer <pass>`, the passes dealt
  round-robin, --verifies (50,000; 20,000 --quick, 2,000 --smoke) after 20 untimed ones
  a connection.
  (a) broker up: each verify asks the broker whether the task is still admitted
      (revocation), so the broker works too; every answer must be 204 with
      `X-Zstalk-Pass-Check: broker`;
  (b) broker away: the broker is killed (SIGKILL) after the passes are read, and the
      front left to notice (no word from it for 2 s); then every answer must be 204
      with `X-Zstalk-Pass-Check: offline`: signature and expiry only.  (A broker that
      stops gracefully, SIGTERM, gives the same answers: the front asks only a broker
      its link is READY with, so verify does not wait for the next one;
      tests/end_to_end/test_waiting_room_end_to_end.py checks that.)
  Rows: verifies/s (answers / time from the first send to the last answer; target >=
  5,000), the front's CPU-microseconds per verify (utime + stime of its process tree
  over the timed part), what that makes per second of one core (1e6 / it: what a front
  with a core to itself would answer), the broker's CPU-us per verify, and the front's
  CPU share (1.00 = one core: near it, the front is the limit; below, the 2 cores are
  shared with the generator and the broker).  The generator's own share is under the
  table.
* Part 2, admission-rate accuracy.  For each --rates N (20 and 100 a second): F has
  `rate = "N/s"` (burst 0) and `concurrency = 100000` (never the limit); N x --seconds
  (4; 3 --quick, 2 --smoke) tasks are enqueued in one go, their users poll.  From the
  broker's `startedAt` (ms) of every admission: the admitted rate, (admissions - 1) /
  (last - first), against N (ratio column), and the most admissions within any 1 s
  window (max over i of #{j: s_i <= s_j < s_i + 1 s}), which GCRA bounds by N + 1.
* Part 3, the ETA of online tasks.  A task's ETA is the `waitTime` of its item in the
  enqueue's answer (predicted admission: createdAt + waitTime), or failing that of the
  first GET that had one (predicted: the GET's time, the midpoint of its request and
  answer, + waitTime); actual is its `startedAt`.  Rows: median and p90 of |actual -
  predicted| in ms over every task that got an ETA; the same relative to the wait
  predicted from (actual - the time of the prediction), over those that waited >= 1 s,
  as bench_limits' part 3; the signed median of the latter (a bias shows there); and the
  tasks that never got an ETA.
  (a) rate-bound: `rate = "--eta-rate/s"` (50), concurrency 100000, --eta-rate-tasks
      (200; 150 --quick, 60 --smoke) tasks in one array, users done at once;
  (b) concurrency-bound: no rate, `concurrency = --eta-concurrency` (4), users holding
      their admission --eta-hold-ms (250) before done; --eta-warm (12) tasks go through
      first and are waited for (the estimate needs 10 ended calls in the last minute),
      then --eta-tasks (48; 32 --quick, 16 --smoke) in one array.
* Part 4, a launch: the event streams at scale (issue 48).  F has `rate =
  "--launch-rate/s"` (20), concurrency 100000, `online_heartbeat = "1h"` and `closed =
  true`; --launch-tasks (10,000; 500 --smoke) online tasks are enqueued (arrays of
  1,000), and every (tasks / --streams)-th of them, --streams (2,000; 100 --smoke) spread
  along the whole line, is followed by its event stream, `GET /v1/tasks/{id}/events` with
  its own token from its 201 (harness/sse.py): all read by this one process (aiohttp on
  uvloop), 200 opening at a time, each ready once its first `place` (phase closed) came.
  The front's cap of 4 streams per client address is honoured, not lifted: the streams
  come from 500 loopback source addresses (127.1.x.y), 4 each, so the front counts real
  peers, as a launch's visitors each have their own (X-Forwarded-For would need [api]
  trust_forwarded, which changes what the broker counts too); --http-max-streams keeps
  its default, 10,000.  The other tasks hold their places without a request: nothing
  polls them, and `online_heartbeat` (1 h, longer than any run; the same for the
  streamed ones, whose open streams count as looking anyway) keeps them; every run
  checks that no task was dropped (statuses queued, admitted, success only).  Then the
  line opens: the config is rewritten with `closed = false` and the broker sent SIGHUP,
  and this process watches --window (60 s; 20 --quick, 4 --smoke) + 1 s.  A stream that
  says `admitted` is done at once (POST /done with the pass from its event, through a
  pool of 64 keep-alive connections from 127.0.0.1); the admitted holders stay admitted
  (the concurrency is never the limit).  Rows: admissions in the window, by the
  broker's `startedAt` of every task (the listing, at the end), those within --window
  of the first one (target rate x window ± 2 %; --quick's 20 s: 400 ± 8), with the mean
  and the largest step between consecutive ones (where a short count was lost); for
  every stream the largest gap, by this process's clock, between the opening, the
  arrivals of its `place` (and `admitted`) events, and its admission or the end of the
  watch (so a stream gone quiet shows as a gap to the end): their max (target <= 2 s),
  how many are over 2 s (target 0) and their median; the front's RSS (VmRSS of its
  process tree, sampled every 0.5 s: the most), its CPU share over the watch (target
  <= 0.5) and CPU-us per event read; the broker's CPU share; this process's own CPU
  share (target < 0.8: the generator is not the limit).  A stream that ends before its
  admission, a done that is not 200, and a followed task admitted 2 s before the stop
  whose stream never said so are errors.

Each part's rows are rotations: every repetition runs each build's zstalk once, in part
1 both variants, the order reversed every other repetition.  A run has a time cap
(--time-cap, 60 s past the time it should take): a capped run reports what finished and
is flagged.  What a process wrote (beyond zstalk's start-up line; the front's lines
about the broker it lost in part 1b), answers that were not the expected ones, and
tasks not admitted exactly once are reported.
"""
from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import secrets
import shutil
import signal
import sys
import tempfile
import time
import urllib.request

from bench_limits import Placement, Session, seconds, starts, statuses
from harness.cli import Run, ints, parser, sized
from harness.http import JSON_HEADERS, client, run_async
from harness.httpload import get_request, run_gets
from harness.procs import HOST, ShareMeter, Proc, wait_until, zstalk_keep
from harness.runs import Runs, run_parts
from harness.sse import Sources, follow, raise_open_files
from harness.stats import Figure, median, pct
from harness.table import Table, cpu_shares
from harness.venv import use_project_venv

TARGET_VERIFIES = 5000
ROOMY = 100_000             # a concurrency that is never the limit
ARRAY = 1000                # online tasks per POSTed array (the API's maximum)
CLIENT_CONNS = 64           # the users' keep-alive connections, in all
WARM_PER_CONN = 20          # part 1: untimed verifies per connection
ETA_FLOOR_S = 1.0           # part 3: relative errors over tasks that waited this long
ETA_TARGETS = {"rate-bound": (5, 10), "concurrency-bound": (15, 35)}   # issue 27's
PER_ADDRESS = 4             # part 4: streams per client address (the front's cap)
HOLD = "1h"                 # part 4: online_heartbeat, beyond any run: holders never poll
OPEN_AT_ONCE = 200          # part 4: streams opening at one time (the front's backlog)
TAIL_S = 1.0                # part 4: the generator watches this long past the window
GAP_TARGET_S = 2.0
RSS_TARGET_MIB, FRONT_CORE_TARGET, GEN_CORE_TARGET = 200, 0.5, 0.8
CHECK_HEADER = "X-Zstalk-Pass-Check"
CONFIGURED = "configured"
UP, AWAY = "(a) broker up", "(b) broker away"
#: what the front says once its broker is killed (part 1b): expected, not news
LOST_BROKER = ("lost the broker", "has not welcomed this process")


def room_config(name: str, concurrency: int, rate: str | None = None) -> str:
    return (f'[functions.{name}]\nonline = "only"\nconcurrency = {concurrency}\n'
            f'pass_ttl = "1h"\nmax_waiting_per_client = 1000000\n'
            + (f'rate = "{rate}"\n' if rate else ""))


def launch_config(name: str, rate: int, closed: bool) -> str:
    """Part 4's function: its line filled closed, then opened by SIGHUP."""
    return room_config(name, ROOMY, f"{rate}/s") + (
        f'online_heartbeat = "{HOLD}"\nclosed = {"true" if closed else "false"}\n')


class Room(Placement):
    """broker + front http (no dispatcher); the broker can be killed (part 1b)."""

    def __init__(self, build, tmp: str, toml: str) -> None:
        super().__init__(build, tmp, 0, toml)
        self.killed = False

    @property
    def broker(self) -> Proc:
        return self.procs[0]

    @property
    def front(self) -> Proc:
        return self.procs[1]

    @property
    def addr(self) -> tuple[str, int]:
        return HOST, self.http_port

    def kill_broker(self) -> None:
        self.broker.crash()
        self.killed = True
        self.front.keep = lambda line: zstalk_keep(line) and not any(
            s in line for s in LOST_BROKER)

    def reopen(self, toml: str) -> None:
        """The broker's config file rewritten, and read again (SIGHUP)."""
        with open(self.config, "w") as f:
            f.write(toml)
        self.broker.p.send_signal(signal.SIGHUP)
        self.broker.keep = lambda line: zstalk_keep(line) and "SIGHUP" not in line

    def stop(self, notes: list[str]) -> None:
        if self.killed:
            self.procs.pop(0).stop(notes, expected=(-signal.SIGKILL,))
        super().stop(notes)


# --------------------------------------------------------------------------- users

async def enqueue_online(s: Session, name: str, n: int) -> list[dict]:
    """n online tasks of `name`, in arrays: the arrays' items (uniqueId, waitNum, waitTime)."""
    items = []
    for lo in range(0, n, ARRAY):
        body = json.dumps([{"function": name, "type": "online"}] * min(ARRAY, n - lo))
        async with s.http.post(f"{s.api}/v1/tasks", data=body.encode(),
                               headers=JSON_HEADERS) as r:
            if r.status != 200:
                raise RuntimeError(f"an array answered {r.status}: {(await r.read())[:200]!r}")
            got = await r.json()
        bad = [it for it in got if it.get("status") != 201]
        if bad:
            raise RuntimeError(f"{len(bad)} online tasks refused, e.g. {bad[0]}")
        items += got
    return items


async def get_info(s: Session, uid: str) -> dict:
    async with s.http.get(f"{s.api}/v1/tasks/{uid}") as r:
        return await r.json()


async def user(s: Session, uid: str, poll_s: float, hold_s: float, rng) -> dict:
    """One user: poll until admitted, hold, done.  What it saw: the first waitTime a GET
    gave and when ("etaAt", "etaS"), when it saw its admission, done's status."""
    rec: dict = {"uniqueId": uid}
    await asyncio.sleep(rng.random() * poll_s)
    while time.monotonic() < s.deadline:
        t0 = time.time()
        info = await get_info(s, uid)
        if info.get("status") == "admitted":
            rec["seenAt"] = time.time()
            await asyncio.sleep(hold_s)
            async with s.http.post(f"{s.api}/v1/tasks/{uid}/done", data=b"{}", headers={
                    **JSON_HEADERS, "Authorization": f"Bearer {info.get('pass')}"}) as r:
                rec["done"] = r.status
            return rec
        if info.get("status") != "queued":
            rec["status"] = info.get("status")
            return rec
        if "waitTime" in info and "etaAt" not in rec:
            rec["etaAt"], rec["etaS"] = (t0 + time.time()) / 2, info["waitTime"] / 1000.0
        await asyncio.sleep(poll_s)
    rec["capped"] = True
    return rec


async def crowd(s: Session, name: str, n: int, poll_s: float, hold_s: float,
                seed: str) -> tuple[list[dict], list[dict]]:
    """n users of `name` in line at once: (the enqueue's items, what each user saw)."""
    items = await enqueue_online(s, name, n)
    rng = random.Random(seed)
    recs = await asyncio.gather(*(user(s, it["uniqueId"], poll_s, hold_s, rng)
                                  for it in items))
    return items, list(recs)


def in_session(z: Room, cap_s: float, work) -> dict:
    """Run `await work(session)` against z's API within cap_s; its "errors" gathered."""
    async def go():
        async with client(CLIENT_CONNS) as http:
            s = Session(http, z.api, "", time.monotonic() + cap_s)
            out = await work(s)
            out["errors"] = s.errors + out.get("errors", [])
            return out
    return run_async(go())


def admitted_once(infos: list[dict], recs: list[dict], n: int) -> list[str]:
    """What is wrong with a run's tasks: each must be admitted once and ended by done."""
    errors = []
    st = statuses(infos)
    if len(infos) != n or st.get("success") != n:
        errors.append(f"{st} of {n:,} tasks")
    bad = [i for i in infos if i.get("calls") != 1 or i.get("endedBy") != "done"]
    if bad:
        errors.append(f"{len(bad)} tasks not admitted once and ended by done, e.g. {bad[0]}")
    undone = [r for r in recs if r.get("done") != 200]
    if undone:
        errors.append(f"{len(undone)} users were not let through, e.g. {undone[0]}")
    return errors


def most_at_once(infos: list[dict]) -> int:
    """The most tasks admitted at one time (startedAt to finishedAt)."""
    events = sorted([(seconds(i["finishedAt"]), -1) for i in infos if "finishedAt" in i]
                    + [(seconds(i["startedAt"]), 1) for i in infos if "startedAt" in i])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


# --------------------------------------------------------------------------- figures

def eta_figures(items: list[dict], recs: list[dict], infos: list[dict]) -> dict:
    """Part 3's figures (see the module's text)."""
    info = {i["uniqueId"]: i for i in infos}
    predictions = {}                    # uid -> (predicted at, predicted admission)
    for it in items:
        task = info.get(it["uniqueId"])
        if "waitTime" in it and task is not None:
            at = seconds(task["createdAt"])
            predictions[it["uniqueId"]] = (at, at + it["waitTime"] / 1000.0)
    from_polls = 0
    for r in recs:
        if r["uniqueId"] not in predictions and "etaAt" in r:
            predictions[r["uniqueId"]] = (r["etaAt"], r["etaAt"] + r["etaS"])
            from_polls += 1
    absolute, rel = [], []
    for uid, (at, predicted) in predictions.items():
        if "startedAt" not in info.get(uid, {}):
            continue
        started = seconds(info[uid]["startedAt"])
        absolute.append(abs(started - predicted) * 1000.0)
        if started - at >= ETA_FLOOR_S:
            rel.append((predicted - started) / (started - at))
    both = bool(absolute)
    return dict(with_eta=len(predictions), from_polls=from_polls,
                without_eta=len(items) - len(predictions), over_1s=len(rel),
                abs_median_ms=median(absolute) if both else None,
                abs_p90_ms=pct(absolute, 90) if both else None,
                median_pct=median([abs(x) for x in rel]) * 100 if rel else None,
                p90_pct=pct([abs(x) for x in rel], 90) * 100 if rel else None,
                signed_pct=median(rel) * 100 if rel else None)


def verify_check(z: Room, token: str, name: str) -> str | None:
    """What one verify says it checked (X-Zstalk-Pass-Check), None on anything but 204."""
    req = urllib.request.Request(f"{z.api}/v1/passes/verify?function={name}",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.headers.get(CHECK_HEADER) if r.status == 204 else None


# --------------------------------------------------------------------------- part 4

class Launch:
    """Part 4's generator: the streams of `followed` tasks, read from many source
    addresses, their events' arrival times after the opening, done at once when
    admitted (through `s`, the enqueuer's keep-alive pool)."""

    def __init__(self, s: Session, followed: list[dict]) -> None:
        self.s, self.followed = s, followed
        self.times: dict[str, list[float]] = {it["uniqueId"]: [] for it in followed}
        self.admitted: dict[str, float] = {}
        self.ready: set[str] = set()
        self.ended: dict[str, str] = {}
        self.events = 0
        self.opened_at: float | None = None
        self.opened_wall = 0.0      # (time.time(): the broker's startedAt is wall-clock)
        self.dones: list[asyncio.Task] = []

    def on_event(self, it: dict, first: asyncio.Event):
        uid = it["uniqueId"]

        def seen(name: str, data: dict, at: float) -> None:
            self.events += 1
            if name == "place" and data.get("phase") == "closed":
                self.ready.add(uid)
                first.set()
            elif name in ("place", "admitted") and self.opened_at is not None:
                self.times[uid].append(at)
                if name == "admitted":
                    self.admitted[uid] = at
                    self.dones.append(asyncio.ensure_future(self.done(uid, data.get("pass"))))
        return seen

    async def done(self, uid: str, token: str | None) -> int:
        async with self.s.http.post(f"{self.s.api}/v1/tasks/{uid}/done", data=b"{}", headers={
                **JSON_HEADERS, "Authorization": f"Bearer {token}"}) as r:
            return r.status

    async def stream(self, sources: Sources, i: int, it: dict, gate: asyncio.Semaphore):
        """Follow one task; the gate is held until its first event (or its end)."""
        first = asyncio.Event()
        await gate.acquire()
        waiting = asyncio.ensure_future(first.wait())
        reading = asyncio.ensure_future(follow(
            sources.session(i), f"{self.s.api}/v1/tasks/{it['uniqueId']}/events",
            it["token"], self.on_event(it, first)))
        await asyncio.wait([waiting, reading], return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        gate.release()
        try:
            self.ended[it["uniqueId"]] = await reading
        except Exception as exc:
            self.ended[it["uniqueId"]] = repr(exc)[:120]

    def gaps(self, stop: float) -> list[float]:
        """Each stream's largest gap between events from the opening until its admission
        (or the end of the watch: a stream gone quiet shows)."""
        out = []
        for uid, times in self.times.items():
            end = self.admitted.get(uid, stop)
            points = [self.opened_at] + [t for t in times if t <= end] + [end]
            out.append(max(b - a for a, b in zip(points, points[1:])))
        return out


async def launch_run(s: Session, z: Room, name: str, a) -> dict:
    """Part 4's run (see the module's text): its figures."""
    raise_open_files()
    items = await enqueue_online(s, name, a.launch_tasks)
    every = a.launch_tasks // a.streams
    g = Launch(s, [items[i * every] for i in range(a.streams)])
    sources = Sources(a.streams, PER_ADDRESS)
    gate = asyncio.Semaphore(OPEN_AT_ONCE)
    readers = [asyncio.ensure_future(g.stream(sources, i, it, gate))
               for i, it in enumerate(g.followed)]
    try:
        while len(g.ready) < a.streams and time.monotonic() < s.deadline:
            if len(g.ended) + len(g.ready) >= a.streams:
                break
            await asyncio.sleep(0.05)
        if len(g.ready) < a.streams:
            raise RuntimeError(f"{len(g.ready)} of {a.streams} streams open, ended: "
                               f"{collections.Counter(g.ended.values())}")
        meter = ShareMeter(front=z.front.pids, broker=z.broker.pids)
        g.opened_at, g.opened_wall = meter.start(), time.time()
        z.reopen(launch_config(name, a.launch_rate, False))
        rss = [z.front.rss_mib()]
        stop_at = g.opened_at + a.window + TAIL_S
        while time.monotonic() < stop_at:
            await asyncio.sleep(min(0.5, max(0.0, stop_at - time.monotonic())))
            rss.append(z.front.rss_mib())
        stop = meter.stop()
        stopped_wall = time.time()
    finally:
        for r in readers:
            r.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        await sources.close()
    dones = await asyncio.gather(*g.dones, return_exceptions=True)
    infos = await s.infos(name)
    return dict(launch_figures(g, infos, stop, a.window, rss, meter),
                errors=launch_errors(g, infos, dones, stopped_wall))


def launch_figures(g: Launch, infos: list[dict], stop: float, window: float,
                   rss: list[float], meter: ShareMeter) -> dict:
    started = sorted(seconds(i["startedAt"]) for i in infos if "startedAt" in i)
    inside = [t for t in started if t < started[0] + window]
    steps = [(b - a) * 1000.0 for a, b in zip(inside, inside[1:])]
    gaps = g.gaps(stop)
    return dict(admissions=len(inside), admitted_all=len(started), streams=len(gaps),
                first_admission_ms=(started[0] - g.opened_wall) * 1000.0 if started else None,
                step_mean_ms=sum(steps) / len(steps) if steps else None,
                step_max_ms=max(steps, default=None),
                gap_max_s=max(gaps), gap_median_s=median(gaps),
                over_2s=sum(1 for x in gaps if x > GAP_TARGET_S),
                streams_admitted=len(g.admitted), events=g.events,
                front_rss_mib=max(rss), front_us_per_event=meter.cpu["front"] / g.events * 1e6
                if g.events else None, **meter.shares)


def launch_errors(g: Launch, infos: list[dict], dones: list, stopped_wall: float) -> list[str]:
    """What is wrong: a place dropped, a pass not done, a stream that ended unadmitted,
    a followed task admitted well before the stop whose stream never said so."""
    errors = []
    st = statuses(infos)
    if set(st) - {"queued", "admitted", "success"}:
        errors.append(f"tasks dropped or failed: {st}")
    early_starts = [i for i in infos if "startedAt" in i
                    and seconds(i["startedAt"]) < g.opened_wall - 0.005]
    if early_starts:
        errors.append(f"{len(early_starts)} tasks admitted while the line was closed")
    bad = [d for d in dones if d != 200]
    if bad:
        errors.append(f"{len(bad)} of {len(dones)} dones not 200, e.g. {bad[0]!r}")
    early = [why for uid, why in g.ended.items() if uid not in g.admitted]
    if early:
        errors.append(f"{len(early)} streams ended before their admission: "
                      f"{collections.Counter(early)}")
    info = {i["uniqueId"]: i for i in infos}
    unseen = [uid for uid in g.times if uid not in g.admitted
              and "startedAt" in info.get(uid, {})
              and seconds(info[uid]["startedAt"]) < stopped_wall - GAP_TARGET_S]
    if unseen:
        errors.append(f"{len(unseen)} followed tasks admitted, their streams never said so")
    return errors


# --------------------------------------------------------------------------- the runs

class Bench(Runs):
    def __init__(self, run: Run, tmp: str) -> None:
        super().__init__(run, ("verify", "admission", "eta", "launch"), SHOWN)
        self.tmp = tmp

    # -- part 1 ----------------------------------------------------------------------------
    def verify(self) -> None:
        systems = [(f"{b.label}: {variant}", *self.verifies(b, variant == AWAY))
                   for b in self.run.builds for variant in (UP, AWAY)]
        self.rotation("verify", [(verify_row(self.args), systems)])

    def verifies(self, build, away: bool):
        a = self.args

        def make(name):
            return Room(build, self.tmp, room_config(name, a.passes))

        def fn(name, z):
            async def admit(s: Session) -> dict:
                items = await enqueue_online(s, name, a.passes)
                infos = await asyncio.gather(*(get_info(s, it["uniqueId"]) for it in items))
                return dict(passes=[i.get("pass") for i in infos
                                    if i.get("status") == "admitted"])
            passes = in_session(z, a.time_cap, admit)["passes"]
            if len(passes) != a.passes or not all(passes):
                raise RuntimeError(f"{len(passes)} of {a.passes} tasks admitted with a pass")
            expect = "offline" if away else "broker"
            if away:
                z.kill_broker()
            wait_until(lambda: verify_check(z, passes[0], name) == expect,
                       f"verify answering 204 {expect}", [z.front], cap_s=15)
            reqs = [get_request(f"/v1/passes/verify?function={name}", z.http_port,
                                {"Authorization": f"Bearer {p}"}) for p in passes]
            run_gets(z.addr, reqs, a.conns, a.conns * WARM_PER_CONN, CHECK_HEADER, a.time_cap)
            meter = ShareMeter(front=z.front.pids, broker=list if away else z.broker.pids)
            meter.start()
            res = run_gets(z.addr, reqs, a.conns, a.verifies, CHECK_HEADER, a.time_cap)
            meter.stop()
            return verify_sample(res, meter, a.verifies, f"204 {expect}")
        return make, fn

    # -- part 2 ----------------------------------------------------------------------------
    def admission(self) -> None:
        a = self.args
        rows = [(rate_row(a, rate), [(b.label, *self.admissions(b, rate))
                                     for b in self.run.builds]) for rate in a.rates]
        self.rotation("admission", rows)

    def admissions(self, build, rate: int):
        a = self.args
        n = rate * a.seconds

        def make(name):
            return Room(build, self.tmp, room_config(name, ROOMY, f"{rate}/s"))

        def fn(name, z):
            async def work(s: Session) -> dict:
                items, recs = await crowd(s, name, n, a.poll_ms / 1000.0, 0.0, name)
                infos = await s.infos(name)
                started = {i["uniqueId"]: seconds(i["startedAt"]) for i in infos
                           if "startedAt" in i}
                seen = [r["seenAt"] - started[r["uniqueId"]] for r in recs
                        if "seenAt" in r and r["uniqueId"] in started]
                return dict(starts(list(started.values())),
                            n=n, statuses=statuses(infos),
                            seen_median_ms=median(seen) * 1000.0 if seen else None,
                            capped=any(r.get("capped") for r in recs),
                            errors=admitted_once(infos, recs, n))
            return in_session(z, n / rate + a.time_cap, work)
        return make, fn

    # -- part 3 ----------------------------------------------------------------------------
    def eta(self) -> None:
        a = self.args
        rows = [(eta_rate_row(a), [(b.label, *self.eta_rate(b)) for b in self.run.builds]),
                (eta_slots_row(a), [(b.label, *self.eta_slots(b)) for b in self.run.builds])]
        self.rotation("eta", rows)

    def eta_rate(self, build):
        a = self.args
        n = a.eta_rate_tasks

        def make(name):
            return Room(build, self.tmp, room_config(name, ROOMY, f"{a.eta_rate}/s"))

        def fn(name, z):
            return self.eta_run(z, name, n, 0, 0.0, n / a.eta_rate)
        return make, fn

    def eta_slots(self, build):
        a = self.args
        n, warm, hold = a.eta_tasks, a.eta_warm, a.eta_hold_ms / 1000.0
        turn = hold + a.poll_ms / 1000.0           # (a slot turns over when its user sees it)

        def make(name):
            return Room(build, self.tmp, room_config(name, a.eta_concurrency))

        def fn(name, z):
            return self.eta_run(z, name, n, warm, hold,
                                (n + warm) * turn / a.eta_concurrency, a.eta_concurrency)
        return make, fn

    def eta_run(self, z: Room, name: str, n: int, warm: int, hold_s: float,
                expected_s: float, concurrency: int | None = None) -> dict:
        poll_s = self.args.poll_ms / 1000.0

        async def work(s: Session) -> dict:
            if warm:
                _, recs = await crowd(s, name, warm, poll_s, hold_s, name + "w")
                if any(r.get("capped") for r in recs):
                    raise RuntimeError("warm-up users not through in time")
            items, recs = await crowd(s, name, n, poll_s, hold_s, name)
            infos = await s.infos(name)
            errors = admitted_once(infos, recs, n + warm)
            most = most_at_once(infos)
            if concurrency and most > concurrency:
                errors.append(f"{most} admitted at once, concurrency {concurrency}")
            return dict(eta_figures(items, recs, infos), n=n, most_at_once=most,
                        statuses=statuses(infos), capped=any(r.get("capped") for r in recs),
                        errors=errors)
        return in_session(z, expected_s + self.args.time_cap, work)

    # -- part 4 ----------------------------------------------------------------------------
    def launch(self) -> None:
        a = self.args

        def system(build):
            def make(name):
                return Room(build, self.tmp, launch_config(name, a.launch_rate, True))

            def fn(name, z):
                return in_session(z, a.window + a.time_cap,
                                  lambda s: launch_run(s, z, name, a))
            return build.label, make, fn
        self.rotation("launch", [(launch_row(a), [system(b) for b in self.run.builds])])


def verify_sample(res: dict, meter: ShareMeter, n: int, expected: str) -> dict:
    count = res["count"]
    errors = list(res["errors"])
    wrong = {k: v for k, v in res["tally"].items() if k != expected}
    if wrong or count != n:
        errors.append(f"{count:,} of {n:,} answered, {res['tally'].get(expected, 0):,} "
                      f"{expected}; others: {wrong}")
    per = (lambda cpu: cpu / count * 1e6 if count else None)     # noqa: E731
    front_us = per(meter.cpu["front"])
    return dict(count=count, rate=res["tally"].get(expected, 0) / res["wall"],
                wall_s=round(res["wall"], 4), tally=res["tally"], capped=res["capped"],
                front_us=front_us, broker_us=per(meter.cpu["broker"]),
                front_per_cpu_s=1e6 / front_us if front_us else None,
                **meter.shares, errors=errors)


SHOWN = ("rate", "front_us", "broker_us", "front_cpu_share", "gen_cpu_share", "worst_1s",
         "seen_median_ms", "abs_median_ms", "median_pct", "without_eta", "admissions",
         "gap_max_s", "over_2s", "front_rss_mib", "broker_cpu_share")


def verify_row(a) -> str:
    return f"{a.verifies:,} verifies of {a.passes} passes, {a.conns} connections"


def rate_row(a, rate: int) -> str:
    return (f"rate {rate}/s, {rate * a.seconds} users polling every {a.poll_ms:g} ms, "
            f"done at once")


def eta_rate_row(a) -> str:
    return f"rate-bound: {a.eta_rate}/s, {a.eta_rate_tasks} users in one array"


def launch_row(a) -> str:
    return (f"{a.launch_tasks:,} online tasks at {a.launch_rate}/s, {a.streams:,} "
            f"streaming, {a.window:g} s")


def eta_slots_row(a) -> str:
    return (f"concurrency-bound: {a.eta_concurrency} at once, users holding "
            f"{a.eta_hold_ms:g} ms, {a.eta_tasks} after {a.eta_warm}")


# --------------------------------------------------------------------------- report

def build_table(bench: Bench) -> Table:
    run, res, a = bench.run, bench.results, bench.args
    labels = run.labels()
    now = labels[0]
    cols = [(CONFIGURED, CONFIGURED)] + [(b, b) for b in labels]
    ratios = [(b, CONFIGURED, f"{b}/{CONFIGURED}") for b in labels] + run.against_ratios()
    t = Table("room", "The waiting room: verifies per front process, admission rates, the "
              "ETA, a launch's event streams", cols, ratios, note=(
                  "zstalk split (`broker --config`, `front http --pass-key-file`, no "
                  "dispatcher), fresh per run, a function of `online = \"only\"` tasks. "
                  "Part 1: the load is this script's raw-socket HTTP/1.1 generator "
                  f"(scripts/harness/httpload.py), one process on the same 2 cores, {a.conns} "
                  "keep-alive connections with one request in flight each, `GET "
                  "/v1/passes/verify?function=F` with a Bearer pass of one of "
                  f"{a.passes} admitted tasks; (a) the front asks the broker about "
                  "revocation, (b) the broker was killed and the front checks signature and "
                  "expiry only; CPU = utime + stime of the process over the timed part. "
                  "Parts 2 and 3: users are coroutines (aiohttp) polling their task every "
                  f"{a.poll_ms:g} ms and calling done once admitted; admission times are "
                  "the broker's `startedAt`; part 2's worst window = most admissions within "
                  "1 s (GCRA allows N + 1). Part 3: ETA = the enqueue answer's `waitTime` "
                  "(else the first GET's) against `startedAt`; relative error over tasks "
                  "that waited >= 1 s; targets are issue 27's for offline tasks. Part 4: "
                  "a line filled closed, then opened (SIGHUP); the streams read by this "
                  f"process (aiohttp), {PER_ADDRESS} from each loopback source address, passes "
                  "done at once, the other tasks holding their places without a request "
                  f"(online_heartbeat {HOLD}); gaps by the generator's clock, admissions by "
                  "the broker's `startedAt` from the first one; RSS from /proc, the peak of "
                  "samples every 0.5 s; targets are issue 48's."))

    def cells(per, key, variant=None):
        return {b: Figure.of(per.get(f"{b}: {variant}" if variant else b), key)
                for b in labels}

    for row, per in res["verify"].items():
        f = bench.flags("verify", row, per)
        for v in (UP, AWAY):
            t.add(f"1: {row}, {v}: verifies/s through 1 front process{f}",
                  cells(per, "rate", v), target=(now, ">=", TARGET_VERIFIES, ">= 5,000/s"))
            t.add(f"1: {v}: front CPU-us per verify", cells(per, "front_us", v), fmt="{:.1f}")
            t.add(f"1: {v}: verifies per CPU-second of the front (1e6 / CPU-us)",
                  cells(per, "front_per_cpu_s", v))
            if v == UP:
                t.add(f"1: {v}: broker CPU-us per verify", cells(per, "broker_us", v),
                      fmt="{:.1f}")
            t.add(f"1: {v}: front's CPU share (1.00 = one core)",
                  cells(per, "front_cpu_share", v), fmt="{:.2f}")
    for row, per in res["admission"].items():
        rate = int(row.split("/s")[0].split()[-1])
        f = bench.flags("admission", row, per)
        t.add(f"2: {row}: admitted/s{f}", dict(cells(per, "rate"), **{CONFIGURED: rate}),
              fmt="{:,.2f}")
        t.add(f"2: {row}: most admissions in 1 s",
              dict(cells(per, "worst_1s"), **{CONFIGURED: rate + 1}),
              target=(now, "<=", rate + 1, f"<= {rate + 1} (N + 1)"), ratio=False)
    for row, per in res["eta"].items():
        med, p90 = ETA_TARGETS[row.split(":")[0]]
        f = bench.flags("eta", row, per)
        t.add(f"3: ETA, {row}: median |actual - predicted| (ms){f}",
              cells(per, "abs_median_ms"), fmt="{:,.0f}", ratio=False)
        t.add(f"3: ETA, {row}: p90 |actual - predicted| (ms)", cells(per, "abs_p90_ms"),
              fmt="{:,.0f}", ratio=False)
        t.add(f"3: ETA, {row}: median |error| / wait (%)", cells(per, "median_pct"),
              fmt="{:.1f}", target=(now, "<=", med, f"<= {med} %"), ratio=False)
        t.add(f"3: ETA, {row}: p90 |error| / wait (%)", cells(per, "p90_pct"), fmt="{:.1f}",
              target=(now, "<=", p90, f"<= {p90} %"), ratio=False)
        t.add(f"3: ETA, {row}: signed median (predicted - actual) / wait (%)",
              cells(per, "signed_pct"), fmt="{:+.1f}", ratio=False)
        t.add(f"3: ETA, {row}: tasks given no ETA", cells(per, "without_eta"), ratio=False)
    for row, per in res["launch"].items():
        launch_rows(t, now, row + bench.flags("launch", row, per), cells,
                    per, a.launch_rate * a.window)
    return t


def launch_rows(t: Table, now: str, row: str, cells, per: dict, expected: float) -> None:
    """Part 4's rows: issue 48's targets (the admissions' scaled to the window)."""
    slack = expected * 0.02
    t.add(f"4: {row}: admissions in the window", dict(cells(per, "admissions"), **{
        CONFIGURED: expected}), target=[
            (now, ">=", expected - slack, f">= {expected - slack:,.0f}"),
            (now, "<=", expected + slack, f"<= {expected + slack:,.0f} (± 2 %)")])
    t.add("4: mean step between admissions (ms; 1,000 / rate when on time)",
          cells(per, "step_mean_ms"), fmt="{:.1f}", ratio=False)
    t.add("4: largest step between admissions (ms)", cells(per, "step_max_ms"), fmt="{:.0f}",
          ratio=False)
    t.add("4: largest gap between a stream's place events while it falls (s)",
          cells(per, "gap_max_s"), fmt="{:.2f}",
          target=(now, "<=", GAP_TARGET_S, f"<= {GAP_TARGET_S:g} s"), ratio=False)
    t.add(f"4: streams with a gap over {GAP_TARGET_S:g} s", cells(per, "over_2s"),
          target=(now, "<=", 0, "0"), ratio=False)
    t.add("4: median of the streams' largest gaps (s)", cells(per, "gap_median_s"),
          fmt="{:.2f}", ratio=False)
    t.add("4: front RSS, most in the window (MiB)", cells(per, "front_rss_mib"),
          fmt="{:.0f}", target=(now, "<=", RSS_TARGET_MIB, f"<= {RSS_TARGET_MIB} MiB"))
    t.add("4: front CPU share (1.00 = one core)", cells(per, "front_cpu_share"),
          fmt="{:.2f}", target=(now, "<=", FRONT_CORE_TARGET, f"<= {FRONT_CORE_TARGET}"))
    t.add("4: front CPU-us per event read", cells(per, "front_us_per_event"), fmt="{:.0f}")
    t.add("4: broker CPU share", cells(per, "broker_cpu_share"), fmt="{:.2f}")
    t.add("4: generator's own CPU share (one asyncio process)", cells(per, "gen_cpu_share"),
          fmt="{:.2f}", target=(now, "<=", GEN_CORE_TARGET, f"< {GEN_CORE_TARGET}"))


def eta_lines(bench: Bench) -> list[str]:
    """Part 3 per run: where the ETAs came from, and how many waited >= 1 s."""
    lines = []
    for row, per in bench.results["eta"].items():
        for column, runs in per.items():
            each = "; ".join(f"{s['with_eta'] - s['from_polls']} at enqueue, "
                             f"{s['from_polls']} at a poll, {s['without_eta']} never, "
                             f"{s['over_1s']} waited >= 1 s, {s['most_at_once']} at once"
                             for s in runs)
            lines.append(f"  {row}, {column}: {each}")
    return ["Part 3 per run (ETAs given, waits over 1 s, most admitted at once):"] + lines \
        if lines else []


def seen_lines(bench: Bench) -> list[str]:
    """Part 2: how long after its admission a user saw it (the poll's lag)."""
    lines = [f"  {row}, {column}: {Figure.of(runs, 'seen_median_ms').text('{:.0f}')} ms"
             for row, per in bench.results["admission"].items()
             for column, runs in per.items()]
    return ["Part 2, median time from an admission to its user seeing it:"] + lines \
        if lines else []


# --------------------------------------------------------------------------- main

def parse_args(argv):
    ap = parser(__doc__)
    ap.add_argument("--parts", default="1,2,3,4", help="parts to run, e.g. 1,3")
    ap.add_argument("--verifies", type=int, default=None,
                    help="part 1: timed verifies per run (50,000; 20,000 --quick, 2,000 "
                         "--smoke)")
    ap.add_argument("--passes", type=int, default=None,
                    help="part 1: admitted tasks whose passes are verified (500; 200 --smoke)")
    ap.add_argument("--conns", type=int, default=64,
                    help="part 1: keep-alive connections, one request in flight each")
    ap.add_argument("--rates", default="20,100", help="part 2: rates a second, a row each")
    ap.add_argument("--seconds", type=int, default=None,
                    help="part 2: seconds' worth of users per run (4; 3 --quick, 2 --smoke)")
    ap.add_argument("--poll-ms", type=float, default=500.0,
                    help="parts 2 and 3: how often a waiting user GETs its task")
    ap.add_argument("--eta-rate", type=int, default=50, help="part 3a: the rate a second")
    ap.add_argument("--eta-rate-tasks", type=int, default=None,
                    help="part 3a: users in the array (200; 150 --quick, 60 --smoke)")
    ap.add_argument("--eta-concurrency", type=int, default=4, help="part 3b: concurrency")
    ap.add_argument("--eta-hold-ms", type=float, default=250.0,
                    help="part 3b: how long a user holds its admission before done")
    ap.add_argument("--eta-warm", type=int, default=12,
                    help="part 3b: users through first (the estimate needs 10 ended calls)")
    ap.add_argument("--eta-tasks", type=int, default=None,
                    help="part 3b: users in the array (48; 32 --quick, 16 --smoke)")
    ap.add_argument("--launch-tasks", type=int, default=None,
                    help="part 4: online tasks in the line (10,000; 500 --smoke)")
    ap.add_argument("--streams", type=int, default=None,
                    help="part 4: of them, followed by an event stream (2,000; 100 --smoke)")
    ap.add_argument("--launch-rate", type=int, default=20, help="part 4: the rate a second")
    ap.add_argument("--window", type=float, default=None,
                    help="part 4: seconds watched after the opening (60; 20 --quick, 4 "
                         "--smoke)")
    ap.add_argument("--time-cap", type=float, default=60.0,
                    help="seconds a run may take beyond its expected time")
    args = ap.parse_args(argv)
    sized(args, verifies=(50000, 20000, 2000), passes=(500, 500, 200), seconds=(4, 3, 2),
          eta_rate_tasks=(200, 150, 60), eta_tasks=(48, 32, 16),
          launch_tasks=(10000, 10000, 500), streams=(2000, 2000, 100), window=(60, 20, 4))
    args.rates = ints(args.rates)
    if not 0 < args.streams <= args.launch_tasks:
        ap.error("--streams: from 1 to --launch-tasks")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    parts = set(ints(args.parts))
    run = Run("bench_room", args)
    tmp = tempfile.mkdtemp(prefix="bench_room_")
    keys = os.path.join(tmp, "passes.keys")
    with open(keys, "w") as f:
        f.write(f"bench:{secrets.token_hex(32)}\n")
    os.chmod(keys, 0o400)
    os.environ["ZSTALK_PASS_KEY_FILE"] = keys       # (the fronts', as a mounted Secret)
    bench = Bench(run, tmp)
    try:
        steps = [(1, "part 1: verifies through one front process", bench.verify),
                 (2, "part 2: admission-rate accuracy", bench.admission),
                 (3, "part 3: ETA error", bench.eta),
                 (4, "part 4: a launch: streams at scale", bench.launch)]
        run_parts(steps, parts)
    finally:
        Proc.stop_all(run.notes)
        shutil.rmtree(tmp, ignore_errors=True)
    shares = cpu_shares(bench.results, ("gen_cpu_share", "front_cpu_share",
                                        "broker_cpu_share", "others_cpu_share"))
    return run.report([build_table(bench)], bench.results,
                      seen_lines(bench) + eta_lines(bench) + [shares])


if __name__ == "__main__":
    use_project_venv()
    sys.exit(main())
