"""The waiting room's flow: when online tasks are admitted, and how their passes end.

An online task waits in its function's line like any other, but no dispatcher takes it:
`admit` lets in every online head whose turn has come (as take() finds heads), and it
then holds a slot of its function and a signed pass until its user is `done`, it is
cancelled, or its pass expires (`expire`).  A waiting task nobody looked at within its
function's heartbeat is abandoned (cancelled) and everyone behind it moves up.

room.py owns who waits and the passes' and liveness timers, and says whose time is up;
the ledger (ledger.py) owns the tasks and moves them; this coordinator decides, calling
down into both, and the store (store.py) calls it: the ops, a cancel's release, its
timers.  The journal is passed in: each change is appended as it is made, its room asked
first (an admission reserves the room of its end, so done, expiry and a cancel of an
admitted task never find the disk full).

A room event's opening (`open_rooms`, room.py says what the draw is) is a timer of the
room: its seed comes from the caller (the store's `seeds`, the system's randomness,
which a test gives), one ROOM_DRAW record keeps it, and every online task still queued
that joined before the opening takes its drawn place in its line (`draw`; a restore
puts them there from the record the same way: restart.py).
"""
from __future__ import annotations

from typing import Callable

from ....protocol.schema.tasks import ADMITTED, QUEUED
from ..shared.journal import ROOM_DRAW, TASK_CALL, TASK_STATE, Journal, RoomDraw
from .components.room import drawn_priority
from .ledger import AGAIN_S, Ledger
from .model.task import ABANDONED, Task, TaskError


class WaitingRoom:
    def __init__(self, ledger: Ledger) -> None:
        self.ledger, self.room, self.limits = ledger, ledger.room, ledger.limits

    def has_online(self) -> bool:
        """Whether any online task waits (feed admits them first)."""
        return bool(self.room.timers.lanes["liveness"])

    def seen(self, task: Task, now: float) -> None:
        """Its user looked at a queued online task (a GET): it keeps its place."""
        if task.online and task.status == QUEUED:
            self.room.seen(task, now)

    def admit(self, now: float, journal: Journal) -> int:
        """Admit every online task whose turn has come (the best heads that may start,
        as take() finds them, skipping offline heads a dispatcher will take): each holds
        a slot of its function and a pass until done, cancelled or expired."""
        ledger = self.ledger
        ledger.open_gates(now)
        admitted = 0
        with ledger.lines.passing() as passed:
            while (top := ledger.top(now)) is not None:
                task = ledger.lines.by_key[top[0]]
                if not task.online:
                    passed.pop()
                    continue
                if not journal.room[TASK_CALL](task):
                    break                   # (the disk is full: it waits, queued)
                passed.drop(keep_offer=True)
                self._admit(task, now, journal)
                admitted += 1
        return admitted

    def open_rooms(self, now: float, journal: Journal, seeds: Callable[[], int],
                   wall_offset: float) -> None:
        """Each room event whose opening has come draws its pre-line's order and opens its
        line (admissions follow in the same turn: commands.feed)."""
        for name, opens_at in self.room.opened(now):
            draw = RoomDraw(name, opens_at, seeds())
            if not journal.room[ROOM_DRAW](draw):
                self.room.again(name, now + AGAIN_S)    # (the disk is full: still held)
                continue
            self.draw(draw, lambda task: task.created + wall_offset)
            journal.append[ROOM_DRAW](draw)
            self.ledger.offer(name, now)

    def draw(self, draw: RoomDraw, joined: Callable[[Task], float]) -> None:
        """Every online task of `draw`'s function still queued that joined (`joined`:
        its createdAt, wall-clock) before the opening takes its drawn place."""
        ledger, name = self.ledger, draw.function
        for seq in list(ledger.lines.queued.heaps.get(name, ())):
            task = ledger.by_seq.get(seq)
            if (task is not None and task.online and task.status == QUEUED
                    and joined(task) < draw.opens_at):
                ledger.lines.replace(task, drawn_priority(draw, task.uid))
        self.room.drawn(draw)

    def _admit(self, task: Task, now: float, journal: Journal) -> None:
        self.room.leave(task)
        self.ledger.start(task, "admit", now)
        task.attempt += 1
        task.pass_exp = now + self.ledger.specs[task.function].pass_ttl_ms / 1000
        self.room.admitted(task)
        journal.append[TASK_STATE](task)
        self.ledger.offer(task.function, now)

    def done(self, uid: str, now: float, journal: Journal) -> Task | TaskError:
        """POST /v1/tasks/{id}/done: an admitted task's user is through; it ends as a
        success and its slot goes to the next in line."""
        task = self.ledger.tasks.get(uid)
        if task is None:
            return TaskError("not_found", f"no task {uid!r}")
        if task.status != ADMITTED:
            return TaskError("not_admitted", f"task {uid!r} is {task.status}, not admitted")
        self.release(task, now)             # (its end was reserved when it was admitted)
        task.ended_by = "done"
        self.ledger.finish(task, "done", now)
        journal.append[TASK_STATE](task)
        return task

    def release(self, task: Task, now: float) -> None:
        """An admitted task's slot is free (done, its pass expired, cancelled).  How long
        it was held goes into the record a call's end feeds (limits.Recent), so waitTime
        behind a full concurrency knows how fast the slots turn over; a cancel counts too,
        as it frees the slot as early as a done would."""
        self.room.released(task)
        self.limits.ended(task.function)
        if task.started is not None:
            self.limits.recent_of(task.function).ended(now, now - task.started,
                                                       admission=True)
        self.ledger.offer(task.function, now)

    def expire(self, now: float, journal: Journal) -> None:
        """Passes that expired end their tasks; online tasks nobody looked at within their
        heartbeat are cancelled as abandoned, and everyone behind them moves up."""
        ledger = self.ledger
        for seq in self.room.expired(now):
            task = ledger.by_seq[seq]
            self.release(task, now)         # (its end was reserved at admission)
            task.ended_by = "expired"
            ledger.finish(task, "expire", now)
            journal.append[TASK_STATE](task)
        queued = lambda seq: (t if (t := ledger.by_seq.get(seq)) is not None  # noqa: E731
                              and t.status == QUEUED else None)
        for task in self.room.abandoned(now, queued, ledger.fns.function):
            if not journal.room[TASK_STATE](task):
                self.room.look_again(task, now)
                break
            ledger.dequeue(task, now)
            task.error = ABANDONED
            ledger.counted(task.function).abandoned += 1
            self.limits.recent_of(task.function).abandoned(now)
            ledger.finish(task, "abandon", now)
            journal.append[TASK_STATE](task)
