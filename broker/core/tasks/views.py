"""What the API shows of the task store: a task's TaskInfo, pages of tasks, a function's
stats, and the waitTime estimate behind both.

Read-only functions of a `store.Tasks` and the time; nothing here changes the store.

waitTime, the time a queued task should wait before it starts, is the latest of three
bounds, each on its own a time the task cannot start before:

* its own due time (a delay, a retry's backoff);
* its function's rate: the gate opens (a pause, or the GCRA's next start), then each of
  the k due tasks ahead of it (its waitNum) takes one emission interval T, so it starts
  k x T after the opening at the earliest;
* its function's concurrency: with `free` slots now and c in all, the k tasks ahead take
  the free slots and then ceil((k + 1 - free) / c) rounds of the mean hold of a slot
  (limits.Recent: a call, or an admitted online task until done, its pass's expiry or a
  cancel, both together since they share the line and the slots; the last minute's, or
  the last ten holds' within the hour where the minute ended fewer; and while there is
  no such basis, the function's `expected_duration`, the configured mean call or, for
  an online function, the mean visit): a rough bound, since holds end at spread-out
  times.  Slots counter clients hold (fn:NAME) are not free, and do not turn over with
  the calls: c is then the slots they leave (at least one).

A bound with no basis (no rate and no pause; too few holds ended lately and no
expected_duration) is left out; with none at all, and the task due now, there is no
estimate (None: the API leaves the field out), nor for a task whose function left the
config (no spec).  The bounds are taken as a maximum, not a sum: a rate slower than the
calls' pace is the only limit that counts, and a delay runs while the tasks ahead start.

A held line (a room event's pre-line, or `closed`: room.py) starts nobody, so it has no
waitTime; a queued task there shows its line's `phase` instead (and `opensAt` before the
opening), and in a pre-line no waitNum either, as nobody's place is drawn yet.
"""
from __future__ import annotations

import heapq
import math
from typing import Any

from ....protocol.schema.task_info import TaskInfo, position
from ....protocol.schema.tasks import ADMITTED, QUEUED
from .components.room import PRE_LINE
from .model.spec import PER_UNIT, FunctionSpec
from .model.task import Task
from .store import PAGE_SCAN, Tasks

#: the named groups GET /v1/functions/{name} lists: the busiest, most queued first
BUSIEST = 10


def info(store: Tasks, uid: str, now: float, keyed: bool = False) -> dict | None:
    """The TaskInfo of the API (protocol/schema/task_info.py), as it travels: what applies
    to the task's state, nothing else (its client's address only to the master key:
    `keyed`)."""
    task = store.tasks.get(uid)
    if task is None:
        return None
    wall = store.wall_offset
    queued, admitted = task.status == QUEUED, task.online and task.status == ADMITTED
    spec = store.specs.get(task.function) if admitted or queued else None
    phase = store.room.phase(task.function, spec) if queued else None
    wait_num, wait_ms = _place(store, task, now, phase) if queued else (None, None)
    return TaskInfo(
        task.uid, task.function, task.status, task.created + wall,
        # (the Cloud Queue's names, attempt and attempts, beside calls and maxCalls)
        task.attempt, task.attempts + 1, task.attempt, task.attempts,
        started_at=None if task.started is None else task.started + wall,
        finished_at=None if task.finished is None else task.finished + wall,
        status_code=task.status_code, result=task.result,
        result_headers=task.result_headers or None, error=task.error,
        level=task.level or None, group=task.group or None, client_ip=task.client_ip if keyed else None,
        type="online" if task.online else None,
        pass_expires_at=task.pass_exp + wall if admitted else None,
        admit_url=spec.admit_url or None if admitted and spec is not None else None,
        ended_by=task.ended_by or None if task.online else None,
        wait_num=wait_num, wait_time=wait_ms,
        retry_at=task.due + wall if queued and task.attempt and task.due > now else None,
        upstream_addr=", ".join(task.tried) or None,
        phase=phase[0] if phase else None, opens_at=phase[1] if phase else None,
        possibly_executed=True if task.possibly_executed else None,
    ).wire()


def place(store: Tasks, task: Task, now: float) -> dict:
    """A task's place (T_POSITIONS): its info without what is not about its place
    (task_info.position), so whatever the info shows of a place, the place shows.  Its
    cost is its info's: the waitNum is a bisect of its function's line (lines.wait_num),
    never a walk of it, so the places of n tasks cost n log(line)."""
    return position(info(store, task.uid, now))


def enqueued(store: Tasks, task: Task, now: float) -> dict:
    """What an enqueue answers, the fields of the 201 (task_info.ENQUEUED): the id, the
    status, createdAt and, queued, the place and the wait, or, an online task admitted
    in the same turn, its pass's expiry and admitUrl (the front signs the pass); not the
    whole TaskInfo, which the front would decode to throw away (an enqueue's answer is
    the hot path: a dict, made here).  Made after the turn's hand-out (commands.py), so
    it says what a GET right after would."""
    out: dict[str, Any] = {"uniqueId": task.uid, "status": task.status,
                           "createdAt": task.created + store.wall_offset}
    if task.status == QUEUED:
        phase = store.room.phase(task.function, store.specs.get(task.function))
        wait_num, wait_ms = _place(store, task, now, phase)
        if phase is not None:
            out["phase"] = phase[0]
            if phase[1] is not None:
                out["opensAt"] = phase[1]
        if wait_num is not None:
            out["waitNum"] = wait_num
        if wait_ms is not None:
            out["waitTime"] = wait_ms
    elif task.online and task.status == ADMITTED:
        out["passExpiresAt"] = task.pass_exp + store.wall_offset
        spec = store.specs.get(task.function)
        if spec is not None and spec.admit_url:
            out["admitUrl"] = spec.admit_url
    return out


def _place(store: Tasks, task: Task, now: float,
           phase: tuple | None = None) -> tuple[int | None, int | None]:
    """A queued task's waitNum, and its waitTime (ms) if there is an estimate (the
    waitNum asked once: with groups it is a walk of the rotation).  A held line
    (`phase`, room.py) has no waitTime, as nobody starts; a pre-line no waitNum either,
    as its order is drawn at the opening."""
    if phase is not None:
        return None if phase[0] == PRE_LINE else store.lines.wait_num(task), None
    ahead = store.lines.wait_num(task)
    spec = store.specs.get(task.function)
    wait = None if spec is None else _wait(store, spec, ahead, task.due, now)
    return ahead, None if wait is None else round(wait * 1000)


def page(store: Tasks, function: str | None, status: str | None, limit: int, after: int,
         now: float) -> tuple[list[dict], int | None]:
    """Tasks enqueued after cursor `after` (a seq), oldest first, that match; and the
    cursor to go on from (None: nothing further).  At most PAGE_SCAN tasks are looked at
    per call, matching or not, so a listing never holds up the broker."""
    infos, last = [], None
    for scanned, seq in enumerate(store.by_seq.irange(minimum=after, inclusive=(False, True))):
        if len(infos) >= limit or scanned >= PAGE_SCAN:
            return infos, last
        task = store.by_seq[seq]
        last = seq
        if (function is None or task.function == function) and (
                status is None or task.status == status):
            infos.append(info(store, task.uid, now))
    return infos, None


def _wait(store: Tasks, spec: FunctionSpec, ahead: int, due: float,
          now: float) -> float | None:
    """The latest of the bounds on a start with `ahead` due tasks before it."""
    seen = store.limits.seen(spec.name)
    bounds = [due - now]
    gate = seen.gate
    if spec.rate or (gate is not None and gate.paused(now)):
        opens = gate.opens_at() if gate is not None else now
        bounds.append(opens - now + ahead * spec.interval)
    mean = seen.recent.mean_s(now) if seen.recent is not None else None
    if mean is None and spec.expected_duration_ms:      # (until enough holds ended)
        mean = spec.expected_duration_ms / 1000
    if mean is not None:
        free = max(0, spec.concurrency - seen.running - seen.held)
        turning = max(1, spec.concurrency - seen.held)      # (holds do not end)
        bounds.append(0.0 if ahead < free else
                      math.ceil((ahead + 1 - free) / turning) * mean)
    if len(bounds) == 1 and due <= now:
        return None                     # nothing to go by
    return max(0.0, *bounds)


def function_stats(store: Tasks, name: str, now: float) -> dict | None:
    """What GET /v1/functions/{name} shows: queued (due, delayed), running, the oldest
    queued task's age, its named groups (their count, the busiest), the limits, a pause, the last minute's start rate, call durations
    and admissions' holds (apart: limits.Recent says why), and the waitTime a task
    enqueued now would get (last in line, due now).
    A function gone from the config that tasks still use shows its counts only; None:
    no such function."""
    spec = store.function(name)
    if spec is None and name not in store.specs:
        return None
    delayed = store.lines.queued.delayed.get(name, 0)
    due = store.lines.due_count(name)
    oldest = store.lines.queued.oldest(name)
    seen = store.limits.seen(name)
    recent = seen.recent
    out: dict[str, Any] = {
        "name": name, "queued": due + delayed, "due": due, "delayed": delayed,
        "running": seen.running,
        "oldestQueuedAgeMs": 0 if oldest is None else max(0, round(
            (now - store.by_seq[oldest].created) * 1000))}
    if seen.held:
        out["heldByCounters"] = seen.held
    groups = store.ledger.groups.get(name)
    if groups:
        out["groups"] = _groups(groups)
    room = store.room.counts.get(name)
    if room is not None or (spec is not None and spec.online == "only"):
        out["waitingOnline"], out["admitted"] = room or (0, 0)
        if recent is not None:          # (admissions are starts)
            out["admissionsPerMinute"] = round(recent.start_rate(now) * 60, 1)
            out["abandonedPerMinute"] = round(recent.abandon_rate(now) * 60, 1)
    if spec is None:
        return out
    out["concurrency"] = spec.concurrency
    if spec.upstream is not None:
        out["upstream"] = spec.upstream
        out["servers"] = store.upstream.servers(spec.upstream, now, store.wall_offset)
    elif store.limits.hosts.failing:
        host = store.limits.hosts.view(spec, now, store.wall_offset)
        if host is not None:
            out["host"] = host          # a plain url's host that fails (hosts.py)
    if spec.rate:
        out["rate"] = f"{spec.rate}/{PER_UNIT[spec.per_s]}"
        out["burst"] = spec.burst
    if spec.group_concurrency:
        out["groupConcurrency"] = spec.group_concurrency
    if spec.group_rate:
        out["groupRate"] = f"{spec.group_rate}/{PER_UNIT[spec.group_per_s]}"
        out["groupBurst"] = spec.group_burst
    _room_event(store, spec, out)
    out["paused"] = name in store.limits.stopped    # (an operator's, beside pausedUntil)
    gate = seen.gate
    if gate is not None and gate.paused(now):
        out["pausedUntil"] = gate.paused_until + store.wall_offset
        out["pauseReason"] = gate.pause_reason
    if recent is not None:
        out["startRate"] = round(recent.start_rate(now), 3)
        for key, q, admissions in (("callP50Ms", 0.5, False), ("callP90Ms", 0.9, False),
                                   ("holdP50Ms", 0.5, True), ("holdP90Ms", 0.9, True)):
            seconds = recent.quantile_s(now, q, admissions)
            if seconds is not None:
                out[key] = round(seconds * 1000)
    wait = None if store.room.holds(name, spec) else _wait(store, spec, due, now, now)
    if wait is not None:
        out["waitTime"] = round(wait * 1000)
    return out


def _room_event(store: Tasks, spec: FunctionSpec, out: dict) -> None:
    """A function's room event as its stats show it: its line's phase (held: pre-line
    until opensAt, or closed), max_waiting, and its latest draw, seed and all (anyone may
    check the order: docs/waiting-room.md), as a string (JSON numbers lose 64 bits)."""
    phase = store.room.phase(spec.name, spec)
    if phase is not None:
        out["phase"] = phase[0]
        if phase[1] is not None:
            out["opensAt"] = phase[1]
    if spec.max_waiting:
        out["maxWaiting"] = spec.max_waiting
    draw = store.room.draws.get(spec.name)
    if draw is not None:
        out["lastDraw"] = {"opensAt": draw.opens_at, "seed": str(draw.seed)}


def _groups(groups: dict[str, list[int]]) -> dict:
    """A function's named groups with live tasks: how many, and the busiest (one pass
    over them: O(groups), as a page of tasks is bounded by PAGE_SCAN)."""
    busiest = heapq.nlargest(BUSIEST, groups.items(), key=lambda item: item[1])
    return {"count": len(groups), "busiest": [{"group": group, "queued": queued,
                                              "running": running}
                                             for group, (queued, running) in busiest]}


def function_activity(store: Tasks, name: str, now: float) -> tuple:
    """A function's place when sorted by activity (least first): its starts a second over
    the last minute, then its tasks queued and running now (zstalk top's STARTS/S, then
    its load), then its name; read from what the limits and the lines keep anyway."""
    seen = store.limits.seen(name)
    load = (store.lines.queued.delayed.get(name, 0) + store.lines.due_count(name)
            + seen.running)
    return (-(0.0 if seen.recent is None else seen.recent.start_rate(now)), -load, name)


def function_page(store: Tasks, after: str, limit: int,
                  now: float) -> tuple[list[dict], str | None]:
    """The stats of the functions named after `after`, by name: the configured ones and
    those tasks use now; and the `after` of the next page (None: no more)."""
    names = sorted(name for name in store.fns.names() if name > after)
    shown = names[:limit]
    return ([function_stats(store, name, now) for name in shown],
            shown[-1] if len(names) > limit else None)
