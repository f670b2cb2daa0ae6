#!/usr/bin/env python3
"""What one beanstalk command costs in zstalk's own Python, with no socket in the way.

Usage:
    scripts/profile_commands.py [--against REF] [--count N] [--repeats N] [--json PATH]

The benchmarks (scripts/bench_beanstalk.py) time a command's whole round trip, where the
kernel's loopback and the client take half of it and the machine's phase moves every
figure.  This measures the other half alone, in one process: a broker actor and a
beanstalk front placed beside it (`local:` link, as `zstalk serve` and `zstalkd` run),
on uvloop, and one connection whose transport is a stand-in that keeps what is written.
Each command is handed to the connection's `data_received` as a client's read would
bring it, with one turn of the event loop after it (a client waits for its reply), so
the path is the one a one-at-a-time client takes: parse, the link, the broker's turn,
the core, the reply, the write.

Two loads: `put` (100-byte body) and `reserve+delete` (reserve, then delete its job at
the next turn; the queue filled first).  For each, per command:
  * CPU µs: time.process_time() over --count commands, less the same number of bare
    event-loop turns (what the stand-in client costs); each run a process of its own,
    --repeats of them per build, the builds alternated; their median and spread;
  * Python calls, by layer (cProfile over one more run; deterministic: a call removed
    shows as one fewer): the front and its parser, the link, the actor's turn, the
    beanstalk core, the rest of the core (routing, replies, timers, the journal),
    the libraries the core uses (sortedcontainers), builtins called from any of them
    (less those a bare event-loop turn calls).
With --against REF the same runs go through a build of REF (scripts/harness/builds.py),
side by side: the calls say what a change removed, the CPU figures how much it weighed.
The script itself imports no zstalk module; each build's own python runs the
measurement (this file with --child), so two versions never share a process.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.venv import CHILD_ENV, use_project_venv  # noqa: E402

LOADS = ("put", "reserve+delete")
LAYERS = (  # (name, path parts that place a function in it), first match wins
    ("front + parser", ("/protocol/fronts/", "/protocol/codecs/")),
    ("link", ("/protocol/links/",)),
    ("actor turn", ("/broker/actor.py",)),
    ("core: beanstalk", ("/broker/core/beanstalk/",)),
    ("core: routing, replies, timers, journal", ("/broker/core/",)),
    ("libraries", ("/sortedcontainers/", "/msgpack/")),
    ("builtins", ("~",)),
)
BODY = b"x" * 100
PUT = b"put 0 0 60 %d\r\n%s\r\n" % (len(BODY), BODY)


def layer_of(filename: str) -> str | None:
    for name, parts in LAYERS:
        if any(part in filename if part != "~" else filename == "~" for part in parts):
            return name
    return None         # the event loop and the stand-in client: not counted


# -- the child: one build's python, its own zstalk ---------------------------------------
class Transport:
    """The connection's transport: keeps the last write (a reply, whole)."""
    last = b""

    def write(self, data: bytes) -> None:
        self.last = data

    def get_extra_info(self, name):
        return None

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


async def _connection(name: str, jobs: int):
    """An actor, a front beside it, one connection on a stand-in transport; `jobs` put."""
    import asyncio

    from zstalk.broker.actor import BrokerActor
    from zstalk.broker.core.broker import Config
    from zstalk.protocol.fronts.beanstalk import BeanstalkFront

    actor = BrokerActor(None, Config(version="profile"))
    actor.start()
    front = BeanstalkFront(actor.expose(f"profile-{name}"))
    front.link.start()
    for _ in range(3):
        await asyncio.sleep(0)
    conn, transport = front.protocol_factory(), Transport()
    conn.connection_made(transport)
    for i in range(jobs):
        conn.data_received(PUT)
        if i % 256 == 255:
            await asyncio.sleep(0)
    await asyncio.sleep(0)
    return actor, conn, transport


def _commands(load: str, conn, transport):
    """A function that sends the next command of `load` (a reserve+delete is two)."""
    if load == "put":
        return lambda: conn.data_received(PUT)
    held = []

    def step() -> None:
        if held:
            conn.data_received(b"delete %s\r\n" % held.pop())
            return
        conn.data_received(b"reserve\r\n")
        reply = transport.last.split(b" ", 2)
        if reply[0] != b"RESERVED":
            raise SystemExit(f"reserve answered {transport.last[:40]!r}")
        held.append(reply[1])
    return step


async def _measure(load: str, count: int) -> dict:
    import asyncio
    import cProfile
    import pstats
    import time

    # (a reserve+delete is two commands: jobs for the warm-up, the timed and profiled runs)
    actor, conn, transport = await _connection(load, 2 * count + 1000 if load != "put" else 0)
    send, turn = _commands(load, conn, transport), asyncio.sleep
    for _ in range(min(count, 1000)):
        send()
        await turn(0)
    t0 = time.process_time()
    for _ in range(count):
        send()
        await turn(0)
    loaded = time.process_time() - t0
    t0 = time.process_time()
    for _ in range(count):
        await turn(0)
    cpu_us = (loaded - (time.process_time() - t0)) / count * 1e6
    profile, bare = cProfile.Profile(), cProfile.Profile()
    profile.enable()
    for _ in range(count):
        send()
        await turn(0)
    profile.disable()
    bare.enable()
    for _ in range(count):
        await turn(0)
    bare.disable()
    actor.stop()
    calls = {name: 0.0 for name, _ in LAYERS}
    for stats, sign in ((profile, 1), (bare, -1)):     # (the loop's own builtins: out)
        for (filename, _line, _name), row in pstats.Stats(stats).stats.items():
            name = layer_of(filename)
            if name is not None:
                calls[name] += sign * row[1] / count
    return dict(cpu_us=round(cpu_us, 2), calls={k: round(v, 1) for k, v in calls.items()},
                calls_total=round(sum(calls.values()), 1))


def child(count: int) -> None:
    import uvloop

    out = {load: uvloop.run(_measure(load, count)) for load in LOADS}
    print(json.dumps(out))


# -- the parent ----------------------------------------------------------------------------
def run_build(build, count: int) -> dict:
    done = subprocess.run([build.python, os.path.abspath(__file__), "--child",
                           "--count", str(count)],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, **{CHILD_ENV: "1"}))
    if done.returncode:
        raise SystemExit(f"{build.describe()}: the measurement exited {done.returncode}:\n"
                         f"{done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def alternated(chosen: list, count: int, repeats: int) -> list[dict]:
    """`repeats` runs of each build, alternated (the machine's phase moves): per build and
    load, the CPU of each of its runs (sorted) and their median, the calls of its first."""
    runs = [[run_build(b, count) for b in chosen] for _ in range(repeats)]
    results = []
    for i in range(len(chosen)):
        mine = [r[i] for r in runs]
        merged = {}
        for load in LOADS:
            cpu = sorted(r[load]["cpu_us"] for r in mine)
            merged[load] = dict(mine[0][load], cpu_median_us=cpu[len(cpu) // 2], cpu_runs=cpu)
        results.append(merged)
    return results


def table(labels: list[str], results: list[dict]) -> str:
    """Rows: each load's CPU and calls (per layer), a column per build, the ratio last."""
    head = ["per command"] + labels + (["ratio"] if len(labels) == 2 else [])
    rows = []
    for load in LOADS:
        figures = [r[load] for r in results]
        rows.append([f"{load}: CPU µs, median (min-max)"]
                    + [f"{f['cpu_median_us']:.2f} ({f['cpu_runs'][0]:.2f}-{f['cpu_runs'][-1]:.2f})"
                       for f in figures]
                    + _ratio([f["cpu_median_us"] for f in figures]))
        rows.append([f"{load}: Python calls"] + [f"{f['calls_total']:.1f}" for f in figures]
                    + _ratio([f["calls_total"] for f in figures]))
        for name, _ in LAYERS:
            rows.append([f"    {name}"] + [f"{f['calls'][name]:.1f}" for f in figures]
                        + _ratio([f["calls"][name] for f in figures]))
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
                     for r in [head, *rows])


def _ratio(values: list[float]) -> list[str]:
    if len(values) != 2:
        return []
    return [f"{values[0] / values[1]:.2f}x" if values[1] else "-"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", metavar="REF", help="a git ref to measure beside this tree")
    ap.add_argument("--count", type=int, default=20000, help="commands per run (20,000)")
    ap.add_argument("--repeats", type=int, default=5,
                    help="runs per build, alternated (5)")
    ap.add_argument("--json", metavar="PATH", help="write the figures here too")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.count < 100 or args.repeats < 1:
        ap.error("--count must be at least 100 and --repeats at least 1")
    if args.child:
        child(args.count)
        return 0
    use_project_venv()
    from harness.builds import builds
    chosen = builds(args.against, log=lambda line: print(line, file=sys.stderr))
    results = alternated(chosen, args.count, args.repeats)
    print(table([b.label for b in chosen], results))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(
            builds=[b.as_json() for b in chosen], results=results), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
