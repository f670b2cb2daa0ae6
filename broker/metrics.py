"""The broker's metrics: read from the core's own state when scraped, on the actor's loop.

Nothing is counted here on the hot path: `samples(now)` walks what the core already holds
(tubes, sessions, fronts, the task store) and the few counts the core keeps for metrics
alone (core/beanstalk/jobs.py TubeMetrics, core/tasks/components/stats.py), and the exposition is
protocol/codecs/prometheus.py's.  A scrape of 100 tubes takes well under a millisecond.

Labels are bounded: a tube or function name is a label only while it is among the `top`
most active (activity: puts, reserves and deletes of a tube, enqueues, starts and ends of
a function's tasks, over the last minute: `ACTIVITY_S`), or was and has not been idle for
an hour since (`IDLE_S`), at most 2 x `top` at once; every other name counts in `_other`
(core/labels.py).  `rank(now)` decides, once a minute on the broker's heartbeat, and at a
scrape while fewer than `top` names are labelled, so a light load gets its names at once.
The same activity serves the dashboard later.
"""
from __future__ import annotations

import heapq
from typing import Iterable

from . import VERSION
from ..protocol.codecs.prometheus import LATENCY_BUCKETS, Histogram, Sample, render
from .core.shared.labels import OTHER

ACTIVITY_S = 60.0
IDLE_S = 3600.0
DEFAULT_TOP = 100
_STATES = ("ready", "reserved", "delayed", "buried")


def build_info(role: str) -> Sample:
    """zstalk_build_info of a process: its version and role (broker, serve, front, ...)."""
    return Sample("zstalk_build_info", (VERSION, role), 1)


class Ranking:
    """Which names are labelled: the most active, kept until idle for IDLE_S."""

    def __init__(self, top: int) -> None:
        self.top = top
        self.last_active: dict[str, float] = {}     # labelled name -> when last active

    def update(self, activity: dict[str, int], now: float, labelled=(),
               fill: bool = False) -> tuple[list[str], list[str]]:
        """(names to label, names to unlabel) after `activity` (events since last time);
        `labelled`: the names the core labelled itself when first seen (labels.py).
        `fill`: only label the most active names while fewer than `top` are."""
        for name in labelled:
            self.last_active.setdefault(name, now)
        for name, n in activity.items():
            if n and name in self.last_active:
                self.last_active[name] = now
        room = self.top - len(self.last_active) if fill else self.top
        best = heapq.nlargest(room, ((n, name) for name, n in activity.items()
                                     if n and not (fill and name in self.last_active)))
        added = [name for _, name in best if name not in self.last_active]
        for name in added:
            self.last_active[name] = now
        if fill:
            return added, []
        gone = [name for name, at in self.last_active.items() if now - at > IDLE_S]
        over = len(self.last_active) - len(gone) - 2 * self.top
        if over > 0:        # the least recently active beyond the cap (never the new ones)
            kept = sorted((at, name) for name, at in self.last_active.items()
                          if name not in gone and name not in added)
            gone += [name for _, name in kept[:over]]
        for name in gone:
            del self.last_active[name]
        return added, gone


class BrokerMetrics:
    def __init__(self, core, top: int = DEFAULT_TOP) -> None:
        self.core = core
        self.tubes = Ranking(top)
        self.functions = Ranking(top)
        self.tube_seen: dict[str, int] = {}     # tube -> its activity count at the last rank
        self.ranked_at = -ACTIVITY_S
        self.timer_lateness = Histogram(LATENCY_BUCKETS)   # (the actor observes)
        core.set_label_room(top)    # (labels.py: first seen)

    # -- labels ------------------------------------------------------------------------
    def rank(self, now: float, only_if_room: bool = False) -> None:
        """Label the most active names and unlabel the idle ones; `only_if_room` (at a
        scrape): only label names while fewer than `top` are."""
        if not (only_if_room and len(self.tubes.last_active) >= self.tubes.top):
            self._rank_tubes(self.core.queue, now, only_if_room)
        if self.core.tasks_built:       # (no function has been active before)
            self._rank_functions(now, only_if_room)
        if not only_if_room:
            self.ranked_at = now

    def _rank_functions(self, now: float, only_if_room: bool) -> None:
        store = self.core.tasks
        if only_if_room and len(self.functions.last_active) >= self.functions.top:
            return
        added, gone = self.functions.update(store.activity, now, store.counts.by_name,
                                            only_if_room)
        store.activity = {}
        for name in added:
            store.counts.label(name)
        for name in gone:
            store.counts.unlabel(name)

    def _rank_tubes(self, queue, now: float, only_if_room: bool) -> None:
        seen, activity = {}, {}
        for name, t in queue.tubes.items():
            seen[name] = count = t.total_jobs + t.reserves + t.cmd_delete
            activity[name] = count - self.tube_seen.get(name, 0)
        self.tube_seen = seen
        added, gone = self.tubes.update(activity, now, queue.metrics.by_name, only_if_room)
        for name in added:
            queue.label(name)
        for name in gone:
            queue.unlabel(name)

    def tick(self, now: float) -> None:
        """On the broker's heartbeat: rank once a minute."""
        if now - self.ranked_at >= ACTIVITY_S:
            self.rank(now)

    # -- a scrape ----------------------------------------------------------------------
    def render(self, now: float, more: Iterable[Sample] = ()) -> bytes:
        """The exposition: the broker's samples and `more` (its in-process fronts')."""
        self.rank(now, only_if_room=True)
        return render([*self.samples(now), *more])

    def samples(self, now: float) -> list[Sample]:
        out = self.beanstalk(now)
        out += self.connections()
        out += self.binlog()
        out += self.tasks(now)
        return out

    def beanstalk(self, now: float) -> list[Sample]:
        """Jobs by state (all tubes, and per labelled tube and `_other`), each row's oldest
        ready age and puts: one walk over the tubes (~1 us a tube)."""
        queue, core = self.core.queue, self.core
        labelled = queue.metrics
        other_m, sink = labelled.other, labelled.sink
        # id(TubeMetrics) -> [ready, reserved, delayed, buried, oldest ready since, unsettled puts]
        rows: dict[int, list] = {id(m): [0, 0, 0, 0, None, 0]
                                 for m in (*labelled.by_name.values(), other_m)}
        all_ready = all_reserved = all_delayed = all_buried = 0
        for t in queue.tubes.values():
            ready, reserved, delayed, buried = (len(t.ready), t.reserved, len(t.delayed),
                                                len(t.buried))
            all_ready += ready
            all_reserved += reserved
            all_delayed += delayed
            all_buried += buried
            m = t.metrics
            if m is sink:
                continue
            row = rows[id(m)]
            row[0] += ready
            row[1] += reserved
            row[2] += delayed
            row[3] += buried
            row[5] += t.total_jobs - t.puts_mark
            if ready:
                since = t.ready_since.oldest()
                if since is not None and (row[4] is None or since < row[4]):
                    row[4] = since
        totals = dict(zip(_STATES, (all_ready, all_reserved, all_delayed, all_buried)))
        per = {name: rows[id(m)] for name, m in labelled.by_name.items()}
        per[OTHER] = rows[id(other_m)]
        out = [Sample("zstalk_jobs", (s,), n) for s, n in totals.items()]
        for name, row in per.items():
            out += [Sample("zstalk_tube_jobs", (name, s), n) for s, n in zip(_STATES, row[:4])]
            age = 0.0 if row[4] is None else max(0.0, now - row[4])
            out.append(Sample("zstalk_tube_oldest_ready_age_seconds", (name,), age))
        for name, m in (*labelled.by_name.items(), (OTHER, other_m)):
            out += [Sample("zstalk_tube_puts_total", (name,), m.puts + per[name][5]),
                    Sample("zstalk_job_wait_seconds", (name,), m.wait),
                    Sample("zstalk_job_run_seconds", (name,), m.run)]
        out += [Sample("zstalk_commands_total", (key[4:],), n)
                for key, n in core.beanstalk.counters.items()]
        out.append(Sample("zstalk_timer_lateness_seconds", (), self.timer_lateness))
        return out

    def connections(self) -> list[Sample]:
        core = self.core
        sessions: dict[str, int] = {}
        fronts: dict[str, int] = {}
        for front in core.fronts.values():
            sessions[front.kind] = sessions.get(front.kind, 0) + len(front.sessions)
            fronts[front.kind] = fronts.get(front.kind, 0) + 1
        credits = sum(s.credits for s in core.beanstalk.sessions if s.is_pool)
        store = core.counter_store
        return [*(Sample("zstalk_sessions", (k,), n) for k, n in sessions.items()),
                *(Sample("zstalk_fronts", (k,), n) for k, n in fronts.items()),
                Sample("zstalk_pool_credits", (), credits),
                Sample("zstalk_counters", (), len(store.table)),
                Sample("zstalk_counters_held", (), sum(c.consumption for c in store.table.values()))]

    def binlog(self) -> list[Sample]:
        return self.core.journal.samples()

    def tasks(self, now: float) -> list[Sample]:
        store, scheduling = self.core.tasks, self.core.scheduling
        counts = store.counts
        gauges: dict[str, list] = {name: [0, 0, 0, None] for name in counts.by_name}
        other = gauges[OTHER] = [0, 0, 0, None]
        lines, running = store.lines, store.limits.running
        names = {*lines.ready, *running, *lines.queued.delayed, *lines.queued.counts}
        for name in names:
            row = gauges.get(name)
            if row is None:
                if name in counts.retired:
                    continue
                row = other
            row[0] += lines.due_count(name)
            row[1] += lines.queued.delayed.get(name, 0)
            row[2] += running.get(name, 0)
            seq = lines.queued.oldest(name)
            if seq is not None:
                created = store.by_seq[seq].created
                row[3] = created if row[3] is None else min(row[3], created)
        out = []
        for name, (due, delayed, running, oldest) in gauges.items():
            out += [Sample("zstalk_tasks", (name, "due"), due),
                    Sample("zstalk_tasks", (name, "delayed"), delayed),
                    Sample("zstalk_tasks", (name, "running"), running),
                    Sample("zstalk_task_oldest_queued_age_seconds", (name,),
                           0.0 if oldest is None else max(0.0, now - oldest))]
        for name, c in (*counts.by_name.items(), (OTHER, counts.other)):
            out += [Sample("zstalk_tasks_enqueued_total", (name,), c.enqueued),
                    Sample("zstalk_tasks_started_total", (name,), c.started),
                    Sample("zstalk_task_retries_total", (name,), c.retries),
                    Sample("zstalk_task_call_seconds", (name,), c.calls)]
            out += [Sample("zstalk_tasks_finished_total", (name, outcome), n)
                    for outcome, n in sorted(c.finished.items())]
        out += [Sample("zstalk_schedule_fires_total", (), scheduling.fires),
                Sample("zstalk_schedule_lateness_seconds", (), scheduling.lateness)]
        return out + self.health_checks(store.upstream.groups)

    def health_checks(self, groups) -> list[Sample]:
        """Each checked server's health and last check (bounded by the config's servers)."""
        out, wall = [], self.core.wall_offset
        for name, group in groups.items():
            for peer in group.peers if group.spec.health_check is not None else ():
                check = peer.check
                out.append(Sample("zstalk_upstream_server_up", (name, peer.url), int(peer.up)))
                if check is not None and check.last_check is not None:
                    out.append(Sample("zstalk_upstream_server_last_check_timestamp_seconds",
                                      (name, peer.url), check.last_check + wall))
        return out
