"""The tasks the store holds, and the only writer of a task's status.

This owns the tasks (by uid and by enqueue order), the bytes they hold (--max-jobs-bytes),
their counts per function and per named group (`groups`: queued, and running or admitted;
the functions' stats show them), and two timers: when a finished task's result is
forgotten ("keeping") and when a queued one times out ("timeouts").  Every status change
goes through here (task.py's MOVES: `queue`, `start`, `finish`), so the counts, the timers
and the lines they touch cannot drift apart.  It also puts functions on offer: a function's
head goes where take() finds it when its line or its limits change (`offer`, `top`); and
it tells the lines when a group's own limits (group_limits.py) hold it back or free it.

The coordinators above decide when: store.py (enqueue, take, outcomes, cancel, the
timers), waiting.py (the waiting room's admissions and passes) and restart.py (a
journal's tasks back).  They call down into this; it calls down into the components it
was given (lines.py, limiter.py, group_limits.py, room.py, functions.py) and never up.
What a change keeps in the journal is passed in where one is made here (a queue timeout,
a task forgotten): the journal is the core's, set after the store is made.
"""
from __future__ import annotations

from sortedcontainers import SortedDict

from ....protocol.schema.tasks import ADMITTED, QUEUE_TIMEOUT, QUEUED, RUNNING
from ..shared.journal import TASK_GONE, TASK_STATE, Journal
from ..shared.labels import Labelled
from .components.deadlines import Deadlines
from .components.group_limits import GroupLimits
from .components.limiter import Limiter
from .components.lines import Lines
from .components.room import Room
from .components.stats import FunctionCounts
from .model.functions import Functions
from .model.spec import FunctionSpec
from .model.task import Task, held_bytes, move

#: a change the journal had no room for is tried again after this
AGAIN_S = 1.0


class Ledger:
    def __init__(self, fns: Functions, limits: Limiter, room: Room,
                 group_limits: GroupLimits | None = None) -> None:
        self.fns, self.specs, self.limits, self.room = fns, fns.specs, limits, room
        self.group_limits = group_limits = group_limits or GroupLimits(fns.function)
        self.tasks: dict[str, Task] = {}
        self.by_seq: SortedDict = SortedDict()     # seq -> task: enqueue order (listing)
        self.next_seq = 1               # the enqueue order of the next task
        self.bytes = 0                  # tasks held, with params and results (--max-jobs-bytes)
        self.timers = Deadlines("keeping", "timeouts")  # (expires | queue deadline, seq)
        self.lines = Lines(self.still_queued, group_limits.held)
        # the metrics' counts by function (core/shared/labels.py)
        self.counts: Labelled[FunctionCounts] = Labelled(FunctionCounts)
        self.activity: dict[str, int] = {}          # events per function since last asked
        # function -> group -> [queued, running or admitted]: named groups with live tasks
        self.groups: dict[str, dict[str, list[int]]] = {}

    def still_queued(self, seq: int) -> bool:
        task = self.by_seq.get(seq)
        return task is not None and task.status == QUEUED

    def counted(self, function: str) -> FunctionCounts:
        self.activity[function] = self.activity.get(function, 0) + 1
        return self.counts.of(function)

    def add(self, task: Task, spec: FunctionSpec | None) -> None:
        self.fns.use(task.function, spec)
        self.tasks[task.uid] = task
        self.by_seq[task.seq] = task
        self.bytes += held_bytes(task)

    def grouped(self, task: Task, queued: int, running: int) -> None:
        """A named group's counts change (callers test `task.group` first: the tasks with
        no group cost nothing here)."""
        groups = self.groups.get(task.function)
        if groups is None:
            groups = self.groups[task.function] = {}
        counts = groups.get(task.group)
        if counts is None:
            counts = groups[task.group] = [0, 0]
        counts[0] += queued
        counts[1] += running
        if not counts[0] and not counts[1]:
            del groups[task.group]
            if not groups:
                del self.groups[task.function]

    def set_result(self, task: Task, result: bytes | None, headers: dict | None = None) -> None:
        self.bytes -= held_bytes(task)
        task.result, task.result_headers = result, headers
        self.bytes += held_bytes(task)

    def enqueue(self, task: Task, spec: FunctionSpec, now: float) -> None:
        """A new task (new_task made it, the journal has room for it): held, counted, in
        the room if online, its queue timeout watched, queued."""
        self.next_seq += 1
        self.add(task, spec)
        self.counted(task.function).enqueued += 1
        if task.online:
            self.room.join(task, spec, now)
        if task.queue_deadline:
            self.timers.add("timeouts", task.queue_deadline, task.seq)
        if task.group:
            self.grouped(task, 1, 0)
        self.queue(task, task.due, now)

    # -- the moves -------------------------------------------------------------------------
    def queue(self, task: Task, due: float, now: float, restoring: bool = False) -> None:
        """Queue `task` (due at `due`); one past its queue deadline fails instead (after a
        restart it is queued, and `time_out` fails it, logging that)."""
        if task.queue_deadline and now >= task.queue_deadline and not restoring:
            task.error = QUEUE_TIMEOUT          # (a retry after its time ran out)
            self.finish(task, "time out", now)
            return
        if task.group and task.status == RUNNING:
            self.grouped(task, 1, -1)       # (a retry, a declined call, a 429)
        move(task, "queue")
        task.due = due
        if self.lines.queue(task, now):         # a new head: take() must see it
            self.offer(task.function, now)

    def start(self, task: Task, event: str, now: float) -> None:
        """`task` leaves its line to run or to be admitted: its function's slot, gate and
        counts (the start of a call, one block for both)."""
        name = task.function
        self.lines.started(task)
        self.counted(name).started += 1
        spec = self.specs[name]
        self.limits.started(name, spec, now)
        if self.group_limits.started(name, task.group, spec, now):
            self.lines.hold(name, task.group)
        if task.group:
            self.grouped(task, -1, 1)
        move(task, event)
        task.started = now

    def finish(self, task: Task, event: str, now: float) -> None:
        if task.online and task.status == QUEUED:
            self.room.leave(task)
        if task.queue_deadline:
            self.timers.discard("timeouts", task.queue_deadline, task.seq)
        if task.group:
            self.grouped(task, -(task.status == QUEUED), -(task.status != QUEUED))
        move(task, event)
        finished = self.counted(task.function).finished
        finished[task.status] = finished.get(task.status, 0) + 1
        task.finished = now
        task.expires = now + task.keep_result_ms / 1000
        self.timers.add("keeping", task.expires, task.seq)

    def retry(self, task: Task, now: float) -> None:
        """A failed or cancelled task queued again by an operator, as if new but for its
        uid and place (seq): its result no longer kept, its attempts, error and queue
        timeout gone (its queueTimeout was spent; an operator's retry runs it), due now."""
        self.timers.remove("keeping", task.expires, task.seq)
        self.set_result(task, None)
        move(task, "retry")
        task.attempt, task.status_code, task.error = 0, None, None
        task.started = task.finished = None
        task.expires = task.queue_deadline = 0.0
        self.counted(task.function).enqueued += 1
        if task.group:
            self.grouped(task, 1, 0)
        self.queue(task, now, now)

    def keep_until(self, task: Task, expires: float) -> None:
        """A finished task is forgotten at `expires` instead (store.read: sooner)."""
        self.timers.remove("keeping", task.expires, task.seq)
        task.expires = expires
        self.timers.add("keeping", expires, task.seq)

    def slot_freed(self, task: Task) -> None:
        """A call of `task` ended, or its admission did: its function's slot and its
        group's are free (the caller offers the function)."""
        self.limits.ended(task.function)
        if self.group_limits.ended(task.function, task.group):
            self.lines.free(task.function, task.group)

    def dequeue(self, task: Task, now: float) -> None:
        """Take a queued task out of its line (cancel, queue timeout, abandoned)."""
        if self.lines.dequeue(task):
            self.offer(task.function, now)

    def resume(self, task: Task, status: str, due: float | None, expires: float | None,
               now: float) -> None:
        """A restored task back in `status` as the journal kept it (set, no move: the move
        was made before the restart): queued, due at `due`; running or admitted; or
        finished, kept until `expires`."""
        if task.queue_deadline and status in (QUEUED, RUNNING):
            self.timers.add("timeouts", task.queue_deadline, task.seq)
        if task.group and status in (QUEUED, RUNNING, ADMITTED):
            self.grouped(task, status == QUEUED, status != QUEUED)
        if status == QUEUED:
            self.queue(task, due, now, restoring=True)
        elif status in (ADMITTED, RUNNING):
            task.status = status
        else:
            task.status, task.expires = status, expires
            self.timers.add("keeping", task.expires, task.seq)

    # -- on offer --------------------------------------------------------------------------
    def offer(self, name: str, now: float) -> None:
        """Put function `name` where take() will find it: its head among the candidates
        if it may start a call now, or its opening time on the limiter's timer if only
        that holds it back (one at its limits is offered again when a call ends)."""
        head = self.lines.head(name)
        spec = self.specs.get(name)
        if head is None or spec is None or self.room.holds(name, spec):
            return                  # (a held room is offered again as it opens: waiting.py)
        opens = self.limits.opens_at(name, spec, now)
        if opens is None:
            return
        if opens > now:
            self.limits.shut(name, opens)
            return
        self.lines.offer(name, head)

    def top(self, now: float) -> tuple[tuple, str] | None:
        """The best head on offer that may start now, as (key, function)."""
        return self.lines.top(lambda name: self.limits.may_start(name, self.specs.get(name), now),
                              lambda name: self.offer(name, now))

    def open_gates(self, now: float) -> None:
        """Offer again the functions whose gate has opened, and those with a group whose
        own gate has."""
        for name in self.limits.opened(now):
            self.offer(name, now)
        for name, group in self.group_limits.opened(now):
            self.lines.free(name, group)
            self.offer(name, now)

    def regroup(self, now: float) -> None:
        """A new config or a restart: the group limits count the calls in flight again,
        and the lines hold back or free each group whose state may have changed."""
        running = ((t.function, t.group) for t in self.tasks.values()
                   if t.status in (RUNNING, ADMITTED))
        limits = self.group_limits
        for name, group in limits.recount(running, now):
            if limits.held(name, group):
                self.lines.hold(name, group)
            else:
                self.lines.free(name, group)

    # -- the timers ------------------------------------------------------------------------
    def make_due(self, now: float) -> None:
        """Queued tasks whose delay or backoff ended take their places in line."""
        for seq in self.lines.due(now):
            task = self.by_seq[seq]
            self.lines.queued.delay(task.function, -1)
            if self.lines.make_due(task):
                self.offer(task.function, now)

    def time_out(self, now: float, journal: Journal) -> None:
        """Fail the tasks still queued past their queue deadline (never called)."""
        while self.timers.due("timeouts", now):
            _, seq = self.timers.pop("timeouts")
            task = self.by_seq[seq]         # (finished tasks leave `timeouts`: finish)
            if task.status != QUEUED:
                continue                    # running: a retry would fail instead (queue)
            if not journal.room[TASK_STATE](task):
                task.queue_deadline = now + AGAIN_S     # the binlog's disk is full: again
                self.timers.add("timeouts", task.queue_deadline, seq)
                return
            self.dequeue(task, now)
            task.error = QUEUE_TIMEOUT
            self.finish(task, "time out", now)
            journal.append[TASK_STATE](task)

    def forget(self, now: float, journal: Journal) -> None:
        """keepResult passed: those tasks are gone (their uniqueIds are free again)."""
        while self.timers.due("keeping", now):
            _, seq = self.timers.pop("keeping")
            task = self.by_seq.pop(seq)
            del self.tasks[task.uid]
            name = task.function
            spec = self.specs[name]
            if self.fns.unuse(name):        # its last task: what was kept for it may go
                self.limits.forget(name, spec, now)
            self.bytes -= held_bytes(task)
            journal.append[TASK_GONE](task)
