#!/usr/bin/env python3
"""CurveZMQ's cost: the remote-front and native-worker rows with CURVE off and on, and good
clients' throughput while a test client makes 1,000 refused handshakes per second.

Usage:
    scripts/bench_curve.py [--quick | --smoke] [--repeats N] [--warmup N] [--against REF]
        [--parts rows,flood]
        [--workers 1,4] [--jobs N] [--put-count N] [--latency-count N]
        [--flood-rate R] [--flooders N] [--flood-nice N] [--no-decoy] [--json PATH]

Method
------
What every row shares (free loopback ports, alternation with warm-up, medians with their
min-max, the machine check, stopping what was started, --against: every zstalk process
from its tree's .venv, the SDK's clients in its python) is in scripts/harness/__init__.py.
Everything runs on 127.0.0.1.  Keys are made with `zstalk keygen` in a temp directory: the
broker's, and one each for the front, the worker pools and the producer, whose public keys
are copied into the directory the broker admits (ZSTALK_CURVE_CLIENTS); a "stranger" key is
made the same way and never admitted.  "CURVE on" starts every process with the
environment of protocol/network/curve.py (the broker: ZSTALK_CURVE_KEY + ZSTALK_CURVE_CLIENTS; the
front, the workers and the producer: ZSTALK_CURVE_KEY + ZSTALK_CURVE_SERVER, which the
SDK's Client reads); "CURVE off" runs the same commands with those variables unset.

Part 1, off / on side by side (--parts rows).  For each repetition and each mode (and
build), alternated (off, on, then on, off), a fresh `zstalk broker --bind tcp://127.0.0.1:P` and
`zstalk front beanstalk --broker tcp://127.0.0.1:P --listen 127.0.0.1:Q`, ready once a
`stats` through the front is answered (which needs the front's link to the broker):
* put round trip, idle: the harness's probes.request_latency, one connection, one `put`
  at a time, each timed from sendall() to its INSERTED line; --latency-count (2,000) puts;
* pipelined put: the harness's put loop, --put-conns (8) connections, at most --window
  (2,000) puts outstanding each, --put-count (200,000) puts in all, with the broker's and
  the front's CPU-seconds per 1,000 puts;
* native workers: bench_workers.py's zstalk side as it is (a fresh `zstalk broker`, W
  `zstalk.workers.Worker` processes at the SDK's defaults, `Client.put_many` batches of 100,
  --jobs (50,000) jobs put -> handled -> deleted, the clock stopped when cmd-delete reaches
  them), with the CURVE environment added; one row per W in --workers.
Ratio = on / off (above 1 is slower for the round trips, faster for the rates).

Part 2, refused handshakes (--parts flood).  Per repetition (and build) one CURVE broker,
front and 1 worker process stay up for all its segments.  First the flood alone for --idle-seconds
(3): the broker's CPU per refused handshake.  Then each good load runs once per condition:
the flood off ("quiet"), aimed at the broker ("flood"), aimed at the broker from a host it
does not accept ("filtered": the broker runs with ZSTALK_CURVE_ACCEPT=127.0.0.1/32 and the
flooder connects from 127.0.0.3, so its connections are closed at accept, before any
handshake; the good clients are on 127.0.0.1), or aimed at a decoy ("decoy", unless
--no-decoy); the conditions' order is rotated each repetition.
* Good loads (both CURVE clients): "front", the pipelined put above through the front,
  --flood-put-count (300,000) puts (--put-conns 8 as in part 1); "native", put ->
  handled -> deleted through the Client and the worker process, --flood-jobs (150,000)
  jobs, counted by cmd-delete; "one", the round-trip probe above, --flood-one-count
  (5,000) puts one at a time (its p50 / p99 are given too).  Rate = count / the load's
  own wall time.
* The flooder (--flooders processes of this script, --flood-rate / N each, 1,000/s in all,
  at nice --flood-nice (-5) so that it keeps its rate on a machine the good load
  saturates): per attempt a ZeroMQ DEALER with the stranger key (and the broker's real
  public key as server key) connects and is closed as soon as its socket monitor reports
  the handshake's outcome (HANDSHAKE_FAILED_AUTH: refused by the broker's ZAP handler;
  SUCCEEDED would be a bug), or after 2 s.  Attempts are paced to the rate; a backlog of
  more than 100 missed slots is dropped (and counted); at most 500 in flight; a flooder
  stops after --flood-seconds (60) or on SIGTERM.  It starts before the segment, the load
  starts once it has 20 refusals, and it is stopped after the load; the achieved rate is
  its refusals within the load's window / the window.  The broker's own count is the sum
  of its rate-limited refusal log lines (lines past the last one are not in it).
* The decoy is the broker's handshake work in another process: a second `zstalk broker`
  of the same tree with the broker's keys (so the same ZAP handler), bound to the decoy's
  endpoint and sent nothing but the flood (before the harness it was a bare ROUTER built
  from protocol/network/curve.py; a benchmark no longer imports zstalk's modules).  A flood
  at it costs the machine what a flood at the broker does (the flooder and the
  handshakes), so "decoy" against "flood" separates the broker's own slow-down from this
  2-core machine's CPU being shared with the test rig.
* Per segment: CPU seconds / wall of the broker's threads (from /proc: its main thread,
  libzmq's I/O thread, the rest, which is the ZAP handler's thread), of the front, the
  flooders and the decoy.  After each segment the broker and the front must still run;
  the broker's log is counted (lines, bytes) at the end of the repetition.
Target: flood / quiet >= 0.9 for each good load, medians of the repetitions.
"""
from __future__ import annotations

import collections
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

from bench_workers import ZstalkSide, child_env, one_run
from harness.beanstalk import Client
from harness.cli import Run, log, parser, sized
from harness.loadgen import run_load
from harness.probes import request_latency
from harness.procs import HOST, Proc, cpu_s, free_port, wait_until, zstalk_keep
from harness.stats import Figure, median, per_1k, rounds
from harness.table import Table
from harness.venv import use_project_venv

MODES = ("off", "on")
CONDS = ("quiet", "flood", "decoy", "filtered")
LOADS = {   # part 2's good loads
    "front": "pipelined put through a remote front, {conns} conn (puts/s)",
    "native": "native: put → handled → deleted, 1 producer + 1 worker process (jobs/s)",
    "one": "put one at a time through a remote front, 1 conn (puts/s)"}
ENV_KEY, ENV_CLIENTS, ENV_SERVER, ENV_ACCEPT = (   # protocol/network/curve.py's variables
    "ZSTALK_CURVE_KEY", "ZSTALK_CURVE_CLIENTS", "ZSTALK_CURVE_SERVER", "ZSTALK_CURVE_ACCEPT")
GOOD_CLIENTS = ("front", "worker", "producer")
OUTSIDE = "127.0.0.3"        # the "filtered" flood's source address (not accepted)
#: a flood attempt's outcomes that count as refused: by the ZAP handler, or closed at
#: accept (the flooder sees a handshake that failed with no detail, the peer gone)
REFUSALS = ("HANDSHAKE_FAILED_AUTH", "HANDSHAKE_FAILED_NO_DETAIL", "DISCONNECTED")
ATTEMPT_TIMEOUT_S = 2.0     # a flood attempt without an outcome by then: "timeout"
MAX_IN_FLIGHT = 500
BACKLOG = 100               # missed flood slots beyond this are dropped, not made up
FLOOD_READY = 20            # refusals before a flood segment's load starts
REFUSAL = re.compile(r"refused a CURVE handshake .*; (\d+) refused since the last such line")
NOTES: list[str] = []       # what the processes said; the run's notes at the end


# --------------------------------------------------------------------------- keys and processes

class Keys:
    """Key files made with `zstalk keygen`; the good clients' public keys admitted."""

    def __init__(self, zstalk: str, root: str):
        self.dir, self.admitted = os.path.join(root, "keys"), os.path.join(root, "admitted")
        os.makedirs(self.admitted)
        for name in ("broker", *GOOD_CLIENTS, "stranger"):
            subprocess.run([zstalk, "keygen", self.dir, name], check=True, capture_output=True)
        for name in GOOD_CLIENTS:
            shutil.copy(self.path(name), self.admitted)

    def path(self, name: str, secret: bool = False) -> str:
        return os.path.join(self.dir, name + (".key_secret" if secret else ".key"))

    def server_env(self) -> dict:
        return {ENV_KEY: self.path("broker", True), ENV_CLIENTS: self.admitted}

    def client_env(self, name: str) -> dict:
        return {ENV_KEY: self.path(name, True), ENV_SERVER: self.path("broker")}


def own_argv(*args) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "_child", *map(str, args)]


def thread_cpu_s(pid: int) -> dict:
    """CPU seconds of a process's threads: main, libzmq's I/O threads, the rest."""
    out = dict(main=0.0, zmq_io=0.0, other=0.0)
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        kind = "main" if int(tid) == pid else "zmq_io" if comm.startswith("ZMQbg/IO") else "other"
        out[kind] += cpu_s(f"{pid}/task/{tid}")
    return out


# --------------------------------------------------------------------------- the actors

class CurveSide(ZstalkSide):
    """bench_workers' zstalk side of one tree (broker, W worker processes, the producer)
    with CURVE on or off, and a beanstalk front process reaching the broker over TCP."""

    def __init__(self, build, args, tmp: str, keys: Keys, on: bool, accept: str | None = None):
        super().__init__(build, args, tmp)
        self.name = f"{build.label} CURVE {'on' if on else 'off'}"
        self.keys, self.on, self.front, self.accept = keys, on, None, accept

    def env(self, role: str) -> dict:
        if not self.on:
            return child_env()
        if role != "broker":
            return child_env(self.keys.client_env(role))
        env = self.keys.server_env()
        if self.accept:
            env[ENV_ACCEPT] = self.accept
        return child_env(env)

    def start_front(self) -> None:
        self.port = free_port()
        self.front = Proc("front", [self.build.exe("zstalk"), "front", "beanstalk", "--broker",
                                    self.endpoint, "--listen", f"{HOST}:{self.port}"],
                          env=self.env("front"), keep=zstalk_keep)
        wait_until(self.front_answers, "front", [self.server, self.front])

    def front_answers(self) -> bool:
        c = Client((HOST, self.port), timeout=2.0)
        try:
            return "total-jobs" in c.stats()
        finally:
            c.sock.close()

    def check(self) -> None:
        super().check()
        if self.front is not None:
            self.front.check()

    def stop(self) -> list[str]:
        notes: list[str] = []
        if self.front is not None:
            self.front.stop(notes)
        self.front = None
        return notes + super().stop()


def cpu_snapshot(side: CurveSide, flooders=(), decoy: Proc | None = None) -> dict:
    return dict(t=time.monotonic(), broker=thread_cpu_s(side.server.pid),
                front=side.front.cpu_s(), flooders=sum(f.cpu_s() for f in flooders),
                decoy=decoy.cpu_s() if decoy else 0.0)


def shares(a: dict, b: dict) -> dict:
    wall = b["t"] - a["t"]
    out = {f"broker_{k}": (b["broker"][k] - a["broker"][k]) / wall for k in a["broker"]}
    out["broker"] = sum(out.values())
    out.update({k: (b[k] - a[k]) / wall for k in ("front", "flooders", "decoy")})
    return out


# --------------------------------------------------------------------------- part 1

def rows_part(run: Run, keys: Keys, tmp: str) -> dict:
    args, out = run.args, {}
    builds = {f"{b.label} CURVE {m}": (b, m == "on") for b in run.builds for m in MODES}
    side = lambda name: CurveSide(builds[name][0], args, tmp, keys, builds[name][1])  # noqa
    for rep, order, warm in rounds(list(builds), args.repeats, args.warmup):
        done = [("front", name, guarded(f"front run {rep + 1} {name}", front_run, side(name),
                                        args)) for name in order]
        for w in args.worker_counts:
            for name in order:
                res = one_run(side(name), w, args.jobs, args.time_cap, NOTES)
                done.append((f"workers {w}", name, res))
                log(f"  run {rep + 1}, {w} worker process(es), {name}: "
                    + (f"{res['rate']:,.0f} jobs/s, broker cpu {res['server_cpu_share']:.2f}"
                       if res.get("rate") else "FAILED") + errors_tail(res))
        for key, name, res in ([] if warm else done):
            out.setdefault(key, {}).setdefault(name, []).append(res)
    return out


def guarded(where: str, fn, side: CurveSide, args) -> dict:
    """Run fn(side, args) on a started broker + front; stop them whatever happens."""
    try:
        side.start_server()
        side.start_front()
        res = fn(side, args)
    except Exception as exc:
        res = dict(rate=None, errors=[f"{type(exc).__name__}: {exc}"])
    finally:
        NOTES.extend(f"{where}: {n}" for n in side.stop())
    log(f"  {where}: " + ", ".join(f"{k} {v:,.3f}" if isinstance(v, float) else f"{k} {v}"
                                   for k, v in res.items() if k != "errors") + errors_tail(res))
    return res


def errors_tail(res: dict) -> str:
    return f" ERR {res['errors'][:3]}" if res.get("errors") else ""


def front_run(side: CurveSide, args) -> dict:
    """The idle round trips first, then the pipelined puts, on a fresh broker and front."""
    lat = request_latency((HOST, side.port), args.latency_count, args.time_cap)
    a = cpu_snapshot(side)
    put = run_load((HOST, side.port), "put", args.put_conns, args.put_count, args.window,
                   args.time_cap)
    b = cpu_snapshot(side)
    cpu = shares(a, b)
    wall = b["t"] - a["t"]
    return dict(p50=lat["p50"], p99=lat["p99"], rate=put["rate"], broker_cpu=cpu["broker"],
                front_cpu=cpu["front"], gen_cpu=put["gen_cpu_share"],
                broker_per_1k=per_1k(cpu["broker"] * wall, put["count"]),
                front_per_1k=per_1k(cpu["front"] * wall, put["count"]),
                errors=lat["errors"] + put["errors"])


# --------------------------------------------------------------------------- part 2

def flood_part(run: Run, keys: Keys, tmp: str) -> dict:
    args, out = run.args, {}
    for rep, order, warm in rounds(run.builds, args.repeats, args.warmup):
        for build in order:
            res = flood_run(run, build, keys, tmp, rep)
            if not warm:
                per = out.setdefault(build.label, {"logs": [], "idle": []})
                per["logs"].append(res.pop("log"))
                per["idle"] += res.pop("idle")
                for load, conds in res.items():
                    for cond, r in conds.items():
                        per.setdefault(load, {}).setdefault(cond, []).append(r)
    return out


def flood_run(run: Run, build, keys: Keys, tmp: str, rep: int) -> dict:
    """One broker, front and worker of `build` with CURVE on, each load under each
    condition; the conditions' order rotated by the repetition."""
    args = run.args
    conds = ["quiet", "flood", "filtered"] + ([] if args.no_decoy else ["decoy"])
    side, decoy, out = CurveSide(build, args, tmp, keys, True, accept=f"{HOST}/32"), None, {}
    where = f"flood run {rep + 1} {build.label}"
    try:
        side.start(1, args.flood_jobs)
        side.start_front()
        targets = {"flood": side.endpoint, "decoy": f"tcp://{HOST}:{free_port()}",
                   "filtered": f"tcp://{OUTSIDE}:0;{side.endpoint[len('tcp://'):]}"}
        if not args.no_decoy:
            decoy = Proc("decoy", [build.exe("zstalk"), "broker", "--bind", targets["decoy"]],
                         env=child_env(keys.server_env()), keep=zstalk_keep)
        out["idle"] = [segment(side, args, keys, "idle", side.endpoint, decoy)]
        log(f"  {where}, no load, flood: " + describe(out["idle"][0]))
        order = conds[rep % len(conds):] + conds[:rep % len(conds)]
        for load in LOADS:
            for cond in order:
                res = out.setdefault(load, {})[cond] = segment(side, args, keys, load,
                                                               targets.get(cond), decoy)
                log(f"  {where}, {load} load, {cond}: " + describe(res))
    except Exception as exc:
        NOTES.append(f"{where}: {type(exc).__name__}: {exc}")
    finally:
        out["log"] = broker_log(side)
        notes: list[str] = []
        if decoy:
            decoy.stop(notes, expected=(0, -signal.SIGTERM))
        NOTES.extend(f"{where}: {n}" for n in quiet(side.stop() + notes))
    out.setdefault("idle", [])
    return out


def segment(side: CurveSide, args, keys: Keys, load: str, target: str | None,
            decoy: Proc | None) -> dict:
    flooders = start_flooders(args, keys, target) if target else []
    try:
        a = cpu_snapshot(side, flooders, decoy)
        if load == "front":
            res = run_load((HOST, side.port), "put", args.put_conns, args.flood_put_count,
                           args.window, args.time_cap)
        elif load == "native":
            res = native_load(side, args.flood_jobs, args.time_cap)
        elif load == "one":
            res = one_load(side, args.flood_one_count, args.time_cap)
        else:           # the broker's cost per refused handshake, nothing else running
            time.sleep(args.idle_seconds)
            res = dict(rate=0.0, errors=[])
        b = cpu_snapshot(side, flooders, decoy)
        res.update(shares(a, b), t0=a["t"], t1=b["t"])
    except Exception as exc:
        res = dict(rate=None, errors=[f"{type(exc).__name__}: {exc}"])
    finally:
        reports = [stop_flooder(f) for f in flooders]
    if reports:
        res.update(flood_summary(reports, res.get("t0"), res.get("t1")))
    side.check()        # the broker and the front are still up
    return res


def native_load(side: CurveSide, jobs: int, time_cap: float) -> dict:
    """J jobs put -> handled -> deleted by a producer of the side's tree, counted by the
    broker's cmd-delete (the first segment's producer was made by side.start)."""
    if side.producer is None:
        side.wait_ready(1, jobs)
    try:
        r = side.producer.go()
    finally:
        NOTES.extend(side.producer.stop())
        side.producer = None
    wall = r["t1"] - r["t0"]
    return dict(rate=r["deleted"] / wall, count=r["deleted"], wall=wall,
                capped=r["deleted"] < jobs, errors=r["errors"])


def one_load(side: CurveSide, count: int, time_cap: float) -> dict:
    """Puts one at a time through the front: their rate, and their round trips."""
    t0 = time.monotonic()
    res = request_latency((HOST, side.port), count, time_cap)
    res.pop("lat_ms")
    res["rate"] = res["count"] / (time.monotonic() - t0)
    return res


def start_flooders(args, keys: Keys, target: str) -> list[Proc]:
    flooders = []
    for i in range(args.flooders):
        out = os.path.join(keys.dir, f"flood-{time.monotonic_ns()}-{i}.json")
        flooders.append(Proc(f"flooder {i}", own_argv(
            "flood", target, keys.path("broker"), keys.path("stranger", True),
            args.flood_rate / args.flooders, args.flood_seconds, args.flood_nice, out)))
        flooders[-1].result_path = out
    try:
        wait_until(lambda: all(os.path.exists(f.result_path + ".ready") for f in flooders),
                   "flood", flooders)
    except Exception:
        for f in flooders:
            stop_flooder(f)
        raise
    return flooders


def stop_flooder(f: Proc) -> dict:
    f.p.send_signal(signal.SIGTERM)
    try:
        f.p.wait(ATTEMPT_TIMEOUT_S + 5)
    except subprocess.TimeoutExpired:
        pass
    f.stop(NOTES, expected=(0,))
    try:
        with open(f.result_path) as fh:
            return json.load(fh)
    except (OSError, ValueError) as exc:
        return dict(error=f"{f.name}: no report ({exc})")


def flood_summary(reports: list[dict], t0: float | None, t1: float | None) -> dict:
    outcomes = collections.Counter()
    for r in reports:
        outcomes.update(r.get("outcomes", {}))
    times = [t for r in reports for t in r.get("refused_at", [])]
    out = dict(outcomes=dict(outcomes), attempts=sum(r.get("attempts", 0) for r in reports),
               dropped_slots=sum(r.get("dropped", 0) for r in reports),
               most_in_flight=max(r.get("most_in_flight", 0) for r in reports),
               flood_errors=[r["error"] for r in reports if "error" in r])
    if t0 is not None:
        out["bad_rate"] = sum(t0 <= t <= t1 for t in times) / (t1 - t0)
    return out


def broker_log(side: CurveSide) -> dict:
    """The broker's log over a flood run: its size and its refusal lines' counts."""
    if side.server is None:
        return {}
    text = side.server.output()
    lines = text.splitlines()
    counts = [int(m.group(1)) for m in map(REFUSAL.search, lines) if m]
    others = [l for l in lines if not REFUSAL.search(l)]
    return dict(bytes=len(text.encode()), lines=len(lines), refusal_lines=len(counts),
                refused_logged=sum(counts), other_lines=others[:10])


def quiet(notes: list[str]) -> list[str]:
    """Stop notes without the refusal lines a flood is expected to log."""
    out = []
    for n in notes:
        if " output:\n" in n:
            head, body = n.split(" output:\n", 1)
            rest = [l for l in body.splitlines() if not REFUSAL.search(l)]
            n = f"{head} output:\n" + "\n".join(rest) if rest else ""
        if n:
            out.append(n)
    return out


def describe(res: dict) -> str:
    if res.get("rate") is None:
        return "FAILED" + errors_tail(res)
    s = (f"{res['rate']:,.0f}/s, broker cpu {res['broker']:.2f} (main {res['broker_main']:.2f}"
         f", io {res['broker_zmq_io']:.2f}, other {res['broker_other']:.2f}), front "
         f"{res['front']:.2f}, decoy {res['decoy']:.2f}")
    if "bad_rate" in res:
        s += (f"; bad handshakes {res['bad_rate']:,.0f}/s, flooders cpu {res['flooders']:.2f}, "
              f"outcomes {res['outcomes']}, dropped slots {res['dropped_slots']}, most in "
              f"flight {res['most_in_flight']}")
    return s + errors_tail(res) + errors_tail(dict(errors=res.get("flood_errors")))


# --------------------------------------------------------------------------- children

def flood_main(endpoint: str, server_key: str, key: str, rate: str, seconds: str,
               nice: str, out_path: str) -> int:
    """The flooder: CURVE handshakes with a key the broker does not admit, paced to `rate`
    per second, each on its own DEALER closed once its monitor reports the outcome."""
    import zmq
    import zmq.auth
    try:                # before the context: its I/O thread inherits the priority
        os.setpriority(os.PRIO_PROCESS, 0, int(nice))
    except OSError:
        nice = str(os.getpriority(os.PRIO_PROCESS, 0))
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    server_public = zmq.auth.load_certificate(server_key)[0]
    public, secret = zmq.auth.load_certificate(key)
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)   # 3 fds per attempt in flight
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8 * MAX_IN_FLIGHT)), hard))
    ctx, poller = zmq.Context(), zmq.Poller()
    ctx.max_sockets = 4 * MAX_IN_FLIGHT     # each attempt: its DEALER and two monitor PAIRs
    events = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_SUCCEEDED
              | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
              | zmq.EVENT_DISCONNECTED)     # (closed at accept: a host not accepted)
    names = {int(e): e.name for e in zmq.Event}
    in_flight: dict = {}
    outcomes, refused_at = collections.Counter(), []
    rate, seconds = float(rate), float(seconds)
    t0, slot, dropped, ready, most = time.monotonic(), 0, 0, False, 0

    def finish(mon, outcome: str, now: float) -> None:
        sock, _ = in_flight.pop(mon)
        poller.unregister(mon)
        outcomes[outcome] += 1
        if outcome in REFUSALS:
            refused_at.append(now)
        sock.disable_monitor()
        mon.close(0)
        sock.close(0)

    while True:
        now = time.monotonic()
        flooding = not stop and now - t0 < seconds
        if not flooding and not in_flight:
            break
        due = int((now - t0) * rate) if flooding else slot
        if due - slot > BACKLOG:
            dropped, slot = dropped + due - slot, due
        while slot < due and len(in_flight) < MAX_IN_FLIGHT:
            slot += 1
            try:
                sock = ctx.socket(zmq.DEALER)
            except zmq.ZMQError as exc:     # out of sockets: count it, try the next slot
                outcomes[f"socket error: {exc}"] += 1
                break
            sock.linger = 0
            sock.curve_secretkey, sock.curve_publickey = secret, public
            sock.curve_serverkey = server_public
            mon = sock.get_monitor_socket(events)
            sock.connect(endpoint)
            in_flight[mon] = (sock, now)
            poller.register(mon, zmq.POLLIN)
        most = max(most, len(in_flight))
        for mon, _ in poller.poll(1):
            event = struct.unpack("=H", mon.recv_multipart()[0][:2])[0]
            finish(mon, names.get(event, str(event)), now)
        for mon in [m for m, (_, t) in in_flight.items() if now - t > ATTEMPT_TIMEOUT_S]:
            finish(mon, "timeout", now)
        if not ready and len(refused_at) >= FLOOD_READY:
            open(out_path + ".ready", "w").close()
            ready = True
    with open(out_path, "w") as f:
        json.dump(dict(attempts=slot - dropped, dropped=dropped, outcomes=outcomes, nice=nice,
                       most_in_flight=most,
                       refused_at=refused_at, t0=t0, t_end=time.monotonic(),
                       cpu_s=time.process_time()), f)
    ctx.term()
    return 0


# --------------------------------------------------------------------------- tables

def rows_table(run: Run, res: dict) -> Table:
    """Part 1: each tree with CURVE off and on, and on / off."""
    labels, now = run.labels(), run.labels()[0]
    key = lambda b, m: f"{b} CURVE {m}"                                  # noqa: E731
    cols = [(key(b, m), f"CURVE {m}" if b == now else key(b, m)) for b in labels for m in MODES]
    ratios = [(key(b, "on"), key(b, "off"), "on/off" if b == now else f"{b} on/off")
              for b in labels]
    if len(labels) > 1:
        ratios.append((key(now, "on"), key(labels[1], "on"), f"{now}/{labels[1]}, CURVE on"))
    t = Table("curve", "CurveZMQ off and on", cols, ratios, note=(
        "`zstalk broker` on `tcp://127.0.0.1` with a remote `zstalk front beanstalk`, native "
        "workers and producers, every process with CURVE off and on (ratio on/off: above 1 "
        "is slower for the round trips, faster for the rates)."))

    def add(row, metric, stat="rate", fmt="{:,.0f}"):
        t.add(metric, {c: Figure.of(res.get(row, {}).get(c), stat) for c, _ in cols}, fmt=fmt)

    for p in ("p50", "p99"):
        add("front", f"put round trip through a remote front, idle, {p} (ms)", p, "{:.3f}")
    add("front", LOADS["front"].format(conns=run.args.put_conns))
    add("front", "  broker CPU-s per 1,000 puts", "broker_per_1k", "{:.4g}")
    add("front", "  front CPU-s per 1,000 puts", "front_per_1k", "{:.4g}")
    for w in run.args.worker_counts:
        add(f"workers {w}", f"native workers: put → handled → deleted, 1 producer + {w} "
            f"worker process{'es' if w > 1 else ''} (jobs/s)")
        add(f"workers {w}", "  broker CPU-s per 1,000 jobs", "cpu_per_1k", "{:.4g}")
    return t


def flood_table(run: Run, res: dict) -> Table:
    """Part 2: each good load quiet, under the flood, and the flood elsewhere."""
    args, labels, now = run.args, run.labels(), run.labels()[0]
    heads = {"quiet": "quiet", "flood": f"{args.flood_rate:,.0f} bad handshakes/s",
             "decoy": "flood at a decoy", "filtered": "flood from a host not accepted"}
    key = lambda b, c: f"{b} {c}"                                        # noqa: E731
    cols = [(key(b, c), heads[c] if b == now else f"{b}: {heads[c]}")
            for b in labels for c in CONDS]
    ratios = [(key(b, c), key(b, "quiet"), f"{c}/quiet" if b == now else f"{b}: {c}/quiet")
              for b in labels for c in CONDS[1:]]
    if len(labels) > 1:
        ratios.append((key(now, "flood"), key(labels[1], "flood"), f"{now}/{labels[1]}, flood"))
    t = Table("curve-flood", "Good loads, CURVE on, with 1,000 refused handshakes a second",
              cols, ratios, note=(
                  f"CURVE on: each good load quiet, while a flooder makes {args.flood_rate:,.0f} "
                  "handshakes a second with a key the broker does not admit, with the flood "
                  "aimed at a decoy (a second broker doing the same handshake work) instead, "
                  "and from a host the broker does not accept (closed at accept)."))
    for load, label in LOADS.items():
        t.add(label.format(conns=args.put_conns),
              {key(b, c): Figure.of(res.get(b, {}).get(load, {}).get(c), "rate")
               for b in labels for c in CONDS}, target=("flood/quiet", ">=", args.target))
    return t


def flood_details(res: dict) -> list[list[str]]:
    """Per load and condition: medians over the repetitions, counts summed."""
    rows = []
    cases = [("none", "flood", res.get("idle", []))] + [
        (load, cond, res.get(load, {}).get(cond, []))
        for load in LOADS for cond in ("quiet", "flood", "filtered", "decoy")]
    for load, cond, runs in cases:
        runs = [r for r in runs if r.get("rate") is not None]
        if not runs:
            continue
        med = lambda k: median([r.get(k) or 0.0 for r in runs])  # noqa: E731
        seen = collections.Counter()
        for r in runs:
            seen.update(r.get("outcomes", {}))
        rows.append([load, cond, cell(med("bad_rate") if cond != "quiet" else None, "{:,.0f}"),
                     f"{sum(seen[o] for o in REFUSALS):,} / "
                     f"{sum(r.get('attempts', 0) for r in runs):,}",
                     str(seen["HANDSHAKE_SUCCEEDED"]),
                     f"{med('broker'):.2f} ({med('broker_main'):.2f} / "
                     f"{med('broker_zmq_io'):.2f} / {med('broker_other'):.2f})",
                     *(f"{med(k):.2f}" for k in ("front", "flooders", "decoy"))])
    return rows


def round_trips(per: dict) -> str:
    return "round trips of the one-at-a-time puts, median p50 / p99 (ms): " + ", ".join(
        f"{cond} {Figure.of(per.get(cond), 'p50').text('{:.3f}')} / "
        f"{Figure.of(per.get(cond), 'p99').text('{:.3f}')}"
        for cond in ("quiet", "flood", "filtered", "decoy") if per.get(cond))


def handshake_cost(res: dict) -> str:
    """The broker's CPU per refused handshake with no other load (medians, µs)."""
    runs = [r for r in res.get("idle", []) if r.get("bad_rate")]
    if not runs:
        return "no idle flood measured"
    per = {k: median([r[k] / r["bad_rate"] * 1e6 for r in runs])
           for k in ("broker", "broker_zmq_io", "broker_other", "broker_main", "flooders")}
    return (f"broker CPU per refused handshake, no other load: {per['broker']:.0f} µs "
            f"(libzmq I/O thread {per['broker_zmq_io']:.0f}, ZAP handler thread "
            f"{per['broker_other']:.0f}, main thread {per['broker_main']:.0f}); the flooder's "
            f"own CPU per attempt {per['flooders']:.0f} µs; bad handshakes "
            f"{median([r['bad_rate'] for r in runs]):,.0f}/s")


def cell(v, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


def markdown(header: list[str], rows: list[list[str]], align: str) -> str:
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def flood_notes(res: dict) -> list[str]:
    out = []
    for label, fl in res.items():
        rows = flood_details(fl)
        out.append(f"{label}: per load and condition, medians: bad handshakes/s, refused / "
                   "attempts, admitted, broker CPU (main / zmq I/O / ZAP+other), front, "
                   "flooders, decoy CPU")
        out += ["  " + " | ".join(r) for r in rows]
        out += [round_trips(fl.get("one", {})), handshake_cost(fl)]
        logs = [lg for lg in fl.get("logs", []) if lg]
        out.append("broker log per flood run: " + "; ".join(
            f"{lg['lines']} lines / {lg['bytes']:,} bytes, {lg['refusal_lines']} refusal lines "
            f"counting {lg['refused_logged']:,}" + (f", other: {lg['other_lines']}"
                                                    if lg["other_lines"] else "")
            for lg in logs))
    return out


# --------------------------------------------------------------------------- main

def parse_args(argv):
    ap = parser(__doc__)
    ap.add_argument("--parts", default="rows,flood", help="rows (off / on), flood, or both")
    ap.add_argument("--workers", default="1,4", help="worker process counts of part 1")
    ap.add_argument("--jobs", type=int, default=None, help="part 1 jobs per run (50,000)")
    ap.add_argument("--put-count", type=int, default=None, help="part 1 pipelined puts (200,000)")
    ap.add_argument("--put-conns", type=int, default=8)
    ap.add_argument("--window", type=int, default=2000, help="puts outstanding per connection")
    ap.add_argument("--latency-count", type=int, default=None, help="round trips (2,000)")
    ap.add_argument("--flood-put-count", type=int, default=None, help="part 2 puts (300,000)")
    ap.add_argument("--flood-jobs", type=int, default=None, help="part 2 jobs (150,000)")
    ap.add_argument("--flood-one-count", type=int, default=None,
                    help="part 2 puts one at a time (5,000)")
    ap.add_argument("--flood-rate", type=float, default=1000.0, help="bad handshakes/s in all")
    ap.add_argument("--flooders", type=int, default=1, help="flooder processes sharing the rate")
    ap.add_argument("--flood-seconds", type=float, default=60.0, help="a flooder's own time cap")
    ap.add_argument("--flood-nice", type=int, default=-5,
                    help="the flooders' nice value (to reach the rate on a busy machine)")
    ap.add_argument("--idle-seconds", type=float, default=None,
                    help="flood with no good load, per repetition (3; 1 with --quick)")
    ap.add_argument("--no-decoy", action="store_true", help="no flood-at-a-decoy segments")
    ap.add_argument("--target", type=float, default=0.9, help="flood/quiet at least")
    ap.add_argument("--time-cap", type=float, default=30.0, help="seconds a load may take")
    args = ap.parse_args(argv)
    sized(args, jobs=(50000, 10000, 2000), put_count=(200000, 30000, 5000),
          latency_count=(2000, 500, 100), flood_put_count=(300000, 100000, 5000),
          flood_jobs=(150000, 40000, 2000), flood_one_count=(5000, 1000, 200),
          idle_seconds=(3.0, 1.0, 0.3))
    args.worker_counts = [int(x) for x in args.workers.split(",") if x.strip()]
    # what bench_workers' zstalk side reads: the SDK's defaults, put_many batches of 100
    args.concurrency, args.prefetch, args.handler, args.batch = 1, "auto", "sync", 100
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_child"]:
        return flood_main(*argv[2:]) if argv[1] == "flood" else 2
    args = parse_args(argv)
    run = Run("bench_curve", args)
    import zmq
    run.machine.update(pyzmq=zmq.__version__, libzmq=zmq.zmq_version())
    results, tables = {}, []
    with tempfile.TemporaryDirectory(prefix="bench_curve-") as root:
        keys = Keys(run.builds[0].exe("zstalk"), root)
        try:
            if "rows" in args.parts:
                log("part 1: CURVE off / on")
                results["rows"] = rows_part(run, keys, root)
                tables.append(rows_table(run, results["rows"]))
            if "flood" in args.parts:
                log(f"part 2: good loads with {args.flood_rate:,.0f} refused handshakes/s")
                results["flood"] = flood_part(run, keys, root)
                tables.append(flood_table(run, results["flood"]))
        finally:
            Proc.stop_all(NOTES)
    run.notes += NOTES
    return run.report(tables, results, flood_notes(results.get("flood", {})))


if __name__ == "__main__":
    if sys.argv[1:2] != ["_child"]:
        use_project_venv()
    sys.exit(main())
