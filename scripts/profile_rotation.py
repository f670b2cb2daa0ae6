#!/usr/bin/env python3
"""The task store's own CPU per task, in process (no HTTP, no journal): enqueue N due
tasks of one function, then take each and report its success, with the tasks in G groups
(0: no group at all, the plain line) or spread over 10,000 groups (the rotation).

Usage:
    scripts/profile_rotation.py [--tasks N] [--groups 0,1,10000] [--repeats R] [--tree PATH]
    scripts/profile_rotation.py --fairness [--calls-s S] [--seconds T]

`--tree PATH`: import zstalk from that checkout instead (e.g. `git archive REF | tar -x
-C /tmp/ref`, then --tree /tmp/ref) to compare with another commit in the same process
shape.  Each figure is the median over --repeats of time.process_time() per task, in
microseconds, enqueue and hand-out apart; the runs of a row alternate with nothing else.

--fairness (issue 44's benchmark, on the store's fake clock): a function of concurrency 1
whose calls take --calls-s (0.05 s); the group "big" has 10,000 tasks queued at 0, the
group "small" enqueues one task a second for --seconds (60).  For each of small's tasks:
how many of big's tasks started between its enqueue and its start (the distribution).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


def load(tree: str | None):
    if tree is not None:        # a checkout is the package `zstalk` (its root is the package)
        link = os.path.join(tempfile.mkdtemp(), "zstalk")
        os.symlink(os.path.abspath(tree), link)
        sys.path.insert(0, os.path.dirname(link))
    from zstalk.broker.core.tasks.store import FunctionSpec, Outcome, Tasks
    return FunctionSpec, Outcome, Tasks


def run(tasks: int, groups: int, classes) -> tuple[float, float]:
    FunctionSpec, Outcome, Tasks = classes
    store = Tasks({"f": FunctionSpec("f", "http://fn/f", concurrency=1 << 30)})
    options = [None] * tasks if not groups else [{"group": f"g{i % groups}"}
                                                 for i in range(tasks)]
    now = 1000.0
    start = time.process_time()
    for i in range(tasks):
        store.enqueue("f", b"{}", options[i], now, uid=f"t{i}")
    enqueued = time.process_time()
    ok = Outcome("success")
    while (task := store.take("d", now)) is not None:
        store.outcome(task.uid, task.attempt, ok, now)
    done = time.process_time()
    assert not store.lines.ready
    return (enqueued - start) / tasks * 1e6, (done - enqueued) / tasks * 1e6


def fairness(call_s: float, seconds: int, classes) -> None:
    FunctionSpec, Outcome, Tasks = classes
    store = Tasks({"f": FunctionSpec("f", "http://fn/f", concurrency=1)})
    now = 0.0
    for i in range(10_000):
        store.enqueue("f", b"{}", {"group": "big"}, now, uid=f"big-{i}")
    ends: float | None = None           # when the running call ends
    running = None
    next_small, small = 1.0, 0
    enqueued_at: dict[str, int] = {}    # small's task -> big's starts before its enqueue
    big_started, between = 0, []
    while now < seconds + 5:
        if running is None:
            running = store.take("d", now)
            if running is not None:
                ends = now + call_s
                if running.group == "big":
                    big_started += 1
                else:
                    between.append(big_started - enqueued_at.pop(running.uid))
        step = min(t for t in (ends, next_small) if t is not None)
        now = step
        if ends is not None and now >= ends:
            store.outcome(running.uid, running.attempt, Outcome("success"), now)
            running, ends = None, None
        if now >= next_small and next_small <= seconds:
            small += 1
            uid = f"small-{small}"
            store.enqueue("f", b"{}", {"group": "small"}, now, uid=uid)
            enqueued_at[uid] = big_started
            next_small = next_small + 1.0 if next_small < seconds else float("inf")
        store.expire(now)
    counts = {k: between.count(k) for k in sorted(set(between))}
    print(f"fairness: {len(between)} of small's tasks started; big's tasks started between "
          f"one's enqueue and its start -> how many of small's: {counts}; big started "
          f"{big_started} in all")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--groups", default="0,1,10000")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--tree")
    parser.add_argument("--fairness", action="store_true")
    parser.add_argument("--calls-s", type=float, default=0.05)
    parser.add_argument("--seconds", type=int, default=60)
    args = parser.parse_args()
    classes = load(args.tree)
    if args.fairness:
        fairness(args.calls_s, args.seconds, classes)
        return
    for groups in (int(g) for g in args.groups.split(",")):
        if groups and args.tree is not None:
            FunctionSpec, Outcome, Tasks = classes
            from zstalk.protocol.schema.tasks import OPTIONS
            if "group" not in OPTIONS:
                continue            # (a tree from before groups)
        runs = [run(args.tasks, groups, classes) for _ in range(args.repeats)]
        enq = statistics.median(r[0] for r in runs)
        out = statistics.median(r[1] for r in runs)
        print(f"groups {groups:>6}: enqueue {enq:6.1f} us/task, take+outcome {out:6.1f} "
              f"us/task (CPU, median of {args.repeats}; min {min(r[0] for r in runs):.1f} "
              f"/ {min(r[1] for r in runs):.1f})")


if __name__ == "__main__":
    main()
