#!/usr/bin/env python3
"""CurveZMQ's cost: the remote-front and native-worker rows with CURVE off and on, and good
clients' throughput while a test client makes 1,000 refused handshakes per second.

Usage:
    .venv/bin/python scripts/bench_curve.py [--quick] [--repeats N] [--parts rows,flood]
        [--workers 1,4] [--jobs N] [--put-count N] [--latency-count N]
        [--flood-rate R] [--flooders N] [--flood-nice N] [--no-decoy] [--json PATH]

Method
------
Everything runs on 127.0.0.1.  Keys are made with `zstalk keygen` in a temp directory: the
broker's, and one each for the front, the worker pools and the producer, whose public keys
are copied into the directory the broker admits (ZSTALK_CURVE_CLIENTS); a "stranger" key is
made the same way and never admitted.  "CURVE on" starts every process with the
environment of protocol/transport/curve.py (the broker: ZSTALK_CURVE_KEY + ZSTALK_CURVE_CLIENTS; the
front and the workers: ZSTALK_CURVE_KEY + ZSTALK_CURVE_SERVER, through env(1); the producer
in this process: `Client(keys=...)`); "CURVE off" runs the same commands with those
variables unset.

Part 1, off / on side by side (--parts rows).  For each repetition and each mode, alternated
(off, on, then on, off), a fresh `zstalk broker --bind tcp://127.0.0.1:P` and
`zstalk front beanstalk --broker tcp://127.0.0.1:P --listen 127.0.0.1:Q`, ready once a
`stats` through the front is answered (which needs the front's link to the broker):
* put round trip, idle: bench_beanstalk's row-9 probe, one connection, one `put` at a time,
  each timed from sendall() to its INSERTED line; --latency-count (2,000) puts; the lowest
  p50 / p99 of the repetitions;
* pipelined put: bench_beanstalk's row-1 loop, --put-conns (8) connections, at most
  --window (2,000) puts outstanding each, --put-count (200,000) puts in all, best of the
  repetitions;
* native workers: bench_workers.py's zstalk side as it is (a fresh `zstalk broker`, W
  `zstalk.workers.Worker` processes at the SDK's defaults, `Client.put_many` batches of 100,
  --jobs (50,000) jobs put -> handled -> deleted, the clock stopped when cmd-delete reaches
  them), with the CURVE environment added; one row per W in --workers, best of the
  repetitions.
Ratio = on / off (above 1 is slower for the round trips, faster for the rates).

Part 2, refused handshakes (--parts flood).  Per repetition one CURVE broker, front and
1 worker process stay up for all its segments.  First the flood alone for --idle-seconds
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
* The decoy is the broker's handshake work alone in another process: a ROUTER with the
  broker's keys and the same ZAP handler (protocol/transport/curve.py), receiving nothing.  A flood
  at it costs the machine what a flood at the broker does (the flooder and the
  handshakes), so "decoy" against "flood" separates the broker's own slow-down from this
  2-core machine's CPU being shared with the test rig.
* Per segment: CPU seconds / wall of the broker's threads (from /proc: its main thread,
  libzmq's I/O thread, the rest, which is the ZAP handler's thread), of the front, the
  flooders and the decoy.  After each segment the broker and the front must still run;
  the broker's log is counted (lines, bytes) at the end of the repetition.
Target: flood / quiet >= 0.9 for each good load, the best of the repetitions on both
sides (interference only ever slows a run down).

Everything started is a process of its own session with PR_SET_PDEATHSIG (bench_workers'
Proc): SIGTERM, then SIGKILL to its group, in a finally block per run, at exit and on
SIGTERM/SIGHUP; unexpected exits and output are listed at the end.
"""
from __future__ import annotations

import argparse
import atexit
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

from bench_beanstalk import (DEFAULT_ZSTALK, HOST, REPO, Client, best, free_port, log, median,
                             proc_cpu_s, request_latency, run_load)
from bench_workers import (NOTES, POLL_S, READY_TIMEOUT_S, Proc, ZstalkSide, _exit_on_signal,
                           kill_all_live, one_run)
from zstalk.protocol.transport import curve
from zstalk.workers import Client as ZClient

MODES = ("off", "on")
LOADS = {   # part 2's good loads
    "front": "pipelined put through a remote front, {conns} conn (puts/s)",
    "native": "native: put → handled → deleted, 1 producer + 1 worker process (jobs/s)",
    "one": "put one at a time through a remote front, 1 conn (puts/s)"}
CURVE_VARS = (curve.ENV_KEY, curve.ENV_CLIENTS, curve.ENV_SERVER, curve.ENV_INSECURE)
GOOD_CLIENTS = ("front", "worker", "producer")
OUTSIDE = "127.0.0.3"        # the "filtered" flood's source address (not accepted)
#: a flood attempt's outcomes that count as refused: by the ZAP handler, or closed at
#: accept (the flooder sees a handshake that failed with no detail, the peer gone)
REFUSALS = ("HANDSHAKE_FAILED_AUTH", "HANDSHAKE_FAILED_NO_DETAIL", "DISCONNECTED")
ATTEMPT_TIMEOUT_S = 2.0     # a flood attempt without an outcome by then: "timeout"
MAX_IN_FLIGHT = 500
BACKLOG = 100               # missed flood slots beyond this are dropped, not made up
FLOOD_READY = 20            # refusals before a flood segment's load starts
SERVER_EXIT = (0, -signal.SIGTERM)
REFUSAL = re.compile(r"refused a CURVE handshake .*; (\d+) refused since the last such line")


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
        return {curve.ENV_KEY: self.path("broker", True), curve.ENV_CLIENTS: self.admitted}

    def client_env(self, name: str) -> dict:
        return {curve.ENV_KEY: self.path(name, True), curve.ENV_SERVER: self.path("broker")}


def env_argv(env: dict | None, argv: list[str]) -> list[str]:
    """argv run through env(1): no CURVE variable but those in `env` (None: CURVE off)."""
    unset = [a for var in CURVE_VARS for a in ("-u", var)]
    return ["env", *unset, *(f"{k}={v}" for k, v in (env or {}).items()), *map(str, argv)]


def own_argv(*args) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "_child", *map(str, args)]


def wait_until(ready, what: str, procs) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        for p in procs:
            p.check()
        try:
            if ready():
                return
        except Exception:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {READY_TIMEOUT_S:.0f}s")
        time.sleep(POLL_S)


def output_so_far(proc: Proc) -> str:
    """What a running process wrote (pread: the child's write offset is left alone)."""
    fd = proc.out.fileno()
    return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")


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
        out[kind] += proc_cpu_s(f"{pid}/task/{tid}")
    return out


# --------------------------------------------------------------------------- the actors

class CurveSide(ZstalkSide):
    """bench_workers' zstalk side (broker, W worker processes, the producer) with CURVE on
    or off, and a beanstalk front process reaching the broker over TCP."""

    def __init__(self, args, keys: Keys, on: bool, accept: str | None = None):
        super().__init__(args)
        self.keys, self.on, self.front, self.accept = keys, on, None, accept

    def env(self, role: str) -> dict | None:
        if not self.on:
            return None
        if role != "broker":
            return self.keys.client_env(role)
        env = self.keys.server_env()
        if self.accept:
            env[curve.ENV_ACCEPT] = self.accept
        return env

    def start_server(self) -> None:
        self.endpoint = f"tcp://{HOST}:{free_port()}"
        self.server = Proc("zstalk broker", env_argv(self.env("broker"), [
            self.args.zstalk, "broker", "--bind", self.endpoint]))
        keys = curve.client_keys(self.env("producer")) if self.on else None
        self.client = ZClient(self.endpoint, timeout_s=10.0, keys=keys)
        wait_until(self.client.stats, "broker", [self.server])

    def worker_argv(self) -> list[str]:
        return env_argv(self.env("worker"), super().worker_argv())

    def start_front(self) -> None:
        self.port = free_port()
        self.front = Proc("front", env_argv(self.env("front"), [
            self.args.zstalk, "front", "beanstalk", "--broker", self.endpoint,
            "--listen", f"{HOST}:{self.port}"]))
        wait_until(self.front_answers, "front", [self.server, self.front])

    def front_answers(self) -> bool:
        c = Client((HOST, self.port), timeout=2.0)
        try:
            return "total-jobs" in c.stats()
        finally:
            c.sock.close()

    def check(self) -> None:
        for p in (self.server, self.front, *self.workers):
            if p is not None:
                p.check()

    def stop(self) -> list[str]:
        notes = self.front.stop(SERVER_EXIT) if self.front is not None else []
        self.front = None
        return notes + super().stop()


def cpu_snapshot(side: CurveSide, flooders=(), decoy: Proc | None = None) -> dict:
    return dict(t=time.monotonic(), broker=thread_cpu_s(side.server.p.pid),
                front=side.front.cpu_s(), flooders=sum(f.cpu_s() for f in flooders),
                decoy=decoy.cpu_s() if decoy else 0.0)


def cpu_shares(a: dict, b: dict) -> dict:
    wall = b["t"] - a["t"]
    out = {f"broker_{k}": (b["broker"][k] - a["broker"][k]) / wall for k in a["broker"]}
    out["broker"] = sum(out.values())
    out.update({k: (b[k] - a[k]) / wall for k in ("front", "flooders", "decoy")})
    return out


# --------------------------------------------------------------------------- part 1

def rows_part(args, keys: Keys) -> dict:
    out: dict = {}
    for rep in range(args.repeats):
        order = MODES if rep % 2 == 0 else MODES[::-1]
        for mode in order:
            res = guarded(f"front run {rep + 1} CURVE {mode}", front_run,
                          CurveSide(args, keys, mode == "on"), args)
            out.setdefault("front", {}).setdefault(mode, []).append(res)
        for w in args.worker_counts:
            for mode in order:
                side = CurveSide(args, keys, mode == "on")
                res = one_run(side, w, args.jobs, args.time_cap)
                out.setdefault(f"workers {w}", {}).setdefault(mode, []).append(res)
                log(f"  run {rep + 1}, {w} worker process(es), CURVE {mode}: "
                    + (f"{res['rate']:,.0f} jobs/s, broker cpu {res['server_cpu_share']:.2f}"
                       if res.get("rate") else "FAILED") + errors_tail(res))
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
    cpu = cpu_shares(a, cpu_snapshot(side))
    return dict(p50=lat["p50"], p99=lat["p99"], rate=put["rate"], broker_cpu=cpu["broker"],
                front_cpu=cpu["front"], gen_cpu=put["gen_cpu_share"],
                errors=lat["errors"] + put["errors"])


# --------------------------------------------------------------------------- part 2

def flood_part(args, keys: Keys) -> dict:
    conds = ["quiet", "flood", "filtered"] + ([] if args.no_decoy else ["decoy"])
    out: dict = {"logs": [], "idle": []}
    for rep in range(args.repeats):
        side, decoy = CurveSide(args, keys, True, accept=f"{HOST}/32"), None
        try:
            side.start(1)
            side.start_front()
            targets = {"flood": side.endpoint, "decoy": f"tcp://{HOST}:{free_port()}",
                       "filtered": f"tcp://{OUTSIDE}:0;{side.endpoint[len('tcp://'):]}"}
            if not args.no_decoy:
                decoy = Proc("decoy", env_argv(keys.server_env(),
                                               own_argv("decoy", targets["decoy"])))
            res = segment(side, args, keys, "idle", side.endpoint, decoy)
            out["idle"].append(res)
            log(f"  run {rep + 1}, no load, flood: " + describe(res))
            order = conds[rep % len(conds):] + conds[:rep % len(conds)]
            for load in LOADS:
                for cond in order:
                    res = segment(side, args, keys, load, targets.get(cond), decoy)
                    out.setdefault(load, {}).setdefault(cond, []).append(res)
                    log(f"  run {rep + 1}, {load} load, {cond}: " + describe(res))
        except Exception as exc:
            NOTES.append(f"flood run {rep + 1}: {type(exc).__name__}: {exc}")
        finally:
            out["logs"].append(broker_log(side))
            NOTES.extend(f"flood run {rep + 1}: {n}" for n in quiet(side.stop())
                         + quiet(decoy.stop((0,)) if decoy else []))
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
        res.update(cpu_shares(a, b), t0=a["t"], t1=b["t"])
    except Exception as exc:
        res = dict(rate=None, errors=[f"{type(exc).__name__}: {exc}"])
    finally:
        reports = [stop_flooder(f) for f in flooders]
    if reports:
        res.update(flood_summary(reports, res.get("t0"), res.get("t1")))
    side.check()        # the broker and the front are still up
    return res


def native_load(side: CurveSide, jobs: int, time_cap: float) -> dict:
    """J jobs put -> handled -> deleted, counted by the broker's cmd-delete."""
    base, t0 = side.stats()["cmd-delete"], time.monotonic()
    prod = side.produce(jobs, time_cap)
    done = 0
    while done < jobs and time.monotonic() < t0 + time_cap:
        done = side.stats()["cmd-delete"] - base
        if done < jobs:
            time.sleep(POLL_S)
    wall = time.monotonic() - t0
    return dict(rate=done / wall, count=done, wall=wall, capped=done < jobs,
                errors=list(prod["errors"]))


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
    NOTES.extend(f.stop((0,)))
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
    text = output_so_far(side.server)
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


def decoy_main(endpoint: str) -> int:
    """The broker's handshake work alone: a CURVE ROUTER with the same ZAP handler."""
    import zmq
    keys = curve.server_keys()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    ctx = zmq.Context()
    auth = curve.start_authenticator(ctx, curve.Admitted(keys.clients))
    sock = ctx.socket(zmq.ROUTER)
    curve.secure_server(sock, keys)
    sock.bind(endpoint)
    signal.sigwait({signal.SIGTERM})
    auth.stop()
    sock.close(0)
    ctx.term()
    return 0


# --------------------------------------------------------------------------- tables

def rows_table(res: dict, args) -> list[tuple]:
    """(metric, off, on, on/off, format) rows of part 1."""
    front = res.get("front", {})
    pick = lambda key, lowest: [best(front.get(m, []), key, lowest) for m in MODES]  # noqa
    rows = [(f"put round trip through a remote front, idle, {p} (ms)", *pick(p, True), "{:.3f}")
            for p in ("p50", "p99")]
    rows.append((LOADS["front"].format(conns=args.put_conns), *pick("rate", False), "{:,.0f}"))
    for w in args.worker_counts:
        per = res.get(f"workers {w}", {})
        rows.append((f"native workers: put → handled → deleted, 1 producer + {w} worker "
                     f"process{'es' if w > 1 else ''} (jobs/s)",
                     *[best(per.get(m, [])) for m in MODES], "{:,.0f}"))
    return [(m, off, on, on / off if off and on else None, fmt) for m, off, on, fmt in rows]


def flood_table(res: dict, args) -> list[tuple]:
    """(load, quiet, flood, flood/quiet, decoy/quiet, result) rows of part 2."""
    out = []
    for load, label in LOADS.items():
        q, f, d, x = (best(res.get(load, {}).get(c, []))
                      for c in ("quiet", "flood", "decoy", "filtered"))
        ratio = f / q if q and f else None
        out.append((label.format(conns=args.put_conns), q, f, ratio, d / q if q and d else None,
                    x / q if q and x else None,
                    "MISS (no data)" if ratio is None else
                    "PASS" if ratio >= args.target else "MISS"))
    return out


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
    return "round trips of the one-at-a-time puts, lowest p50 / p99 (ms): " + ", ".join(
        f"{cond} {cell(best(per.get(cond, []), 'p50', True), '{:.3f}')} / "
        f"{cell(best(per.get(cond, []), 'p99', True), '{:.3f}')}"
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


def report(results: dict, args, meta: dict) -> str:
    parts = []
    if "rows" in results:
        parts.append(markdown(["metric", "CURVE off", "CURVE on", "on/off"], [
            [m, cell(off, fmt), cell(on, fmt), cell(r, "{:.2f}x")]
            for m, off, on, r, fmt in rows_table(results["rows"], args)], "lrrr"))
    if "flood" in results:
        fl = results["flood"]
        parts.append(markdown(
            ["good load, CURVE on", "quiet", f"{args.flood_rate:,.0f} bad handshakes/s",
             "flood/quiet", "flood at a decoy/quiet", "flood from a host not accepted/quiet",
             "target", "result"],
            [[m, cell(q, "{:,.0f}"), cell(f, "{:,.0f}"), cell(r, "{:.2f}x"),
              cell(d, "{:.2f}x"), cell(x, "{:.2f}x"), f">= {args.target}x", s]
             for m, q, f, r, d, x, s in flood_table(fl, args)], "lrrrrrll"))
        parts.append(markdown(
            ["good load", "flood", "bad handshakes/s", "refused / attempts", "admitted",
             "broker CPU (main / zmq I/O / ZAP+other)", "front CPU", "flooder CPU",
             "decoy CPU"], flood_details(fl), "llrrrrrrr"))
        parts.append(round_trips(fl.get("one", {})))
        parts.append(handshake_cost(fl))
        logs = [lg for lg in fl.get("logs", []) if lg]
        parts.append("broker log per flood run (CURVE on, one broker per repetition): " + "; ".join(
            f"{lg['lines']} lines / {lg['bytes']:,} bytes, {lg['refusal_lines']} refusal lines "
            f"counting {lg['refused_logged']:,}" + (f", other: {lg['other_lines']}"
                                                    if lg["other_lines"] else "")
            for lg in logs))
    return "\n\n".join(parts)


# --------------------------------------------------------------------------- main

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke test: small counts, 1 repetition")
    ap.add_argument("--parts", default="rows,flood", help="rows (off / on), flood, or both")
    ap.add_argument("--repeats", type=int, default=None, help="default 3; 1 with --quick")
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
    ap.add_argument("--json", help="write results as JSON to this path")
    ap.add_argument("--zstalk", default=DEFAULT_ZSTALK)
    args = ap.parse_args(argv)
    q = args.quick
    for k, full, quick in (("repeats", 3, 1), ("jobs", 50000, 10000),
                           ("put_count", 200000, 30000), ("latency_count", 2000, 500),
                           ("flood_put_count", 300000, 100000), ("flood_jobs", 150000, 40000),
                           ("flood_one_count", 5000, 1000), ("idle_seconds", 3.0, 1.0)):
        if getattr(args, k) is None:
            setattr(args, k, quick if q else full)
    args.worker_counts = [int(x) for x in args.workers.split(",") if x.strip()]
    # what bench_workers' zstalk side reads: the SDK's defaults, put_many batches of 100
    args.concurrency, args.prefetch, args.handler, args.batch = 1, "auto", "sync", 100
    return args


def header(args) -> dict:
    git = lambda *a: subprocess.run(["git", "-C", str(REPO), *a], capture_output=True,  # noqa
                                    text=True).stdout.strip()
    import zmq
    meta = dict(started=time.strftime("%Y-%m-%d %H:%M:%S"), argv=sys.argv[1:],
                nproc=os.cpu_count(), loadavg_before=os.getloadavg(),
                python=sys.version.split()[0], pyzmq=zmq.__version__, libzmq=zmq.zmq_version(),
                zstalk_commit=git("rev-parse", "--short", "HEAD"),
                zstalk_dirty=bool(git("status", "--porcelain", "--untracked-files=no")))
    log(f"bench_curve: zstalk {meta['zstalk_commit']}{' (dirty tree)' if meta['zstalk_dirty'] else ''}"
        f", pyzmq {meta['pyzmq']} / libzmq {meta['libzmq']}; parts {args.parts}, best of "
        f"{args.repeats}; {os.cpu_count()} cpus, load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return meta


def stop_everything_on_exit() -> None:
    """bench_workers' guards: what we started is killed at exit and on SIGTERM / SIGHUP."""
    atexit.register(kill_all_live)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)


def child_main(argv: list[str]) -> int:
    role, *rest = argv
    return {"flood": flood_main, "decoy": decoy_main}[role](*rest)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_child"]:
        return child_main(argv[1:])
    args = parse_args(argv)
    stop_everything_on_exit()
    meta, results, t0 = header(args), {}, time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench_curve-") as root:
        keys = Keys(args.zstalk, root)
        try:
            if "rows" in args.parts:
                log("part 1: CURVE off / on")
                results["rows"] = rows_part(args, keys)
            if "flood" in args.parts:
                log(f"part 2: good loads with {args.flood_rate:,.0f} refused handshakes/s")
                results["flood"] = flood_part(args, keys)
        finally:
            kill_all_live()
    meta.update(elapsed_s=time.monotonic() - t0, loadavg_after=os.getloadavg())
    md = report(results, args, meta)
    print(f"\nMarkdown:\n\n{md}\n")
    print("errors and notes:\n  " + "\n  ".join(n.replace("\n", "\n    ") for n in NOTES)
          if NOTES else "no errors, no unexpected output from the processes")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, results=results, markdown=md, notes=NOTES), f, indent=1,
                      default=str)
        print(f"JSON written to {args.json}")
    print(f"\ntotal time {meta['elapsed_s']:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
