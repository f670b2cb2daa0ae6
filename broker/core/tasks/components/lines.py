"""Each function's line of queued tasks, and the order tasks are handed out in.

A function's due tasks wait in `ready[function]` by key, (-level, priority, seq): level
0-9, higher first; then priority; then the enqueue order, so equal priorities run first
come, first served.  `waitNum` is a task's rank there.  Once a due task of the function
has a group (a tenant), its line is a Rotation (rotation.py): its groups served in turn
within each level, and a task's rank is its place in that order; the line stays one
until it runs out, so a function without groups keeps its plain line and its cost.  A
group its own limits hold back (group_limits.py) is passed over in its place (`hold`,
`free`); a function with a held group "" takes a Rotation for it too, and a line whose
groups are all held back has no head (its `[0]` is None) until one is free.
Tasks not due yet (a delay, a backoff) wait in a timer lane until `due` moves them in
line.

Handing out: `take` wants the best head among the functions that may start a call now.
The candidate heads wait in a heap (`heads`), cleaned lazily: an entry is good while it
is still its function's head (`offered`) and the function may start, so a hand-out does
not cost O(functions).  The ledger (ledger.py) offers a function (`offer`) whenever its
head or what holds it back changes; `top` finds the best good entry, and a stale one is
dropped on the way and its function offered again (the ledger's `reoffer`).
"""
from __future__ import annotations

import heapq
from typing import Callable, Iterator

from sortedcontainers import SortedList

from ..model.task import Task
from .deadlines import Deadlines
from .rotation import Rotation
from .stats import Queued


class Lines:
    def __init__(self, still_queued: Callable[[int], bool],
                 held: Callable[[str, str], bool] = lambda name, group: False) -> None:
        self.held = held                            # (function, group) held back now?
        self.ready: dict[str, SortedList | Rotation] = {}   # function -> due task keys
        self.by_key: dict[tuple, Task] = {}
        self.heads: list[tuple[tuple, str]] = []    # heap of (head key, function)
        self.offered: dict[str, tuple] = {}         # function -> the key it has in heads
        self.timers = Deadlines("waiting")          # (due, seq) of queued tasks not due yet
        self.queued = Queued(still_queued)          # queued tasks by function (the metrics)

    # -- in line ---------------------------------------------------------------------------
    def queue(self, task: Task, now: float) -> bool:
        """`task` is queued, due at task.due: in line if due, else waiting for it; True if
        it is its function's new head (take() must see it)."""
        self.queued.add(task.function, task.seq)
        if task.due > now:
            self.queued.delay(task.function, 1)
            self.timers.add("waiting", task.due, task.seq)
            return False
        return self.make_due(task)

    def make_due(self, task: Task) -> bool:
        name = task.function
        ready = self.ready.get(name)
        if ready is None:
            ready = self.ready[name] = self._rotation(name) if task.group or self.held(
                name, "") else SortedList()
        elif task.group and type(ready) is SortedList:
            ready = self.ready[name] = self._rotation(name, ready)    # its first group
        if type(ready) is SortedList:
            ready.add(task.key)
        else:
            ready.add(task.key, task.group)
        self.by_key[task.key] = task
        return ready[0] == task.key

    def replace(self, task: Task, priority: int) -> None:
        """A queued task takes `priority` (a room's draw): out of its line if it is due,
        and back in at its new key (the caller offers its function again)."""
        due = task.key in self.by_key
        if due:
            self.unready(task)
        task.place(task.level, priority)
        if due:
            self.make_due(task)

    def _rotation(self, name: str, keys: SortedList = ()) -> Rotation:
        held = self.held
        return Rotation(keys, lambda group: held(name, group))

    def due(self, now: float) -> Iterator[int]:
        """The seqs of waiting tasks now due (each then `make_due`, by the caller)."""
        while self.timers.due("waiting", now):
            _, seq = self.timers.pop("waiting")
            yield seq

    def unready(self, task: Task, turn: bool = False) -> bool:
        """Take a due task out of its function's line (`turn`: it is the head, handed out,
        and its group has had its turn); True if it was the head and others are left (a
        new head to offer)."""
        del self.by_key[task.key]
        ready = self.ready[task.function]
        was_head = ready[0] == task.key
        if type(ready) is SortedList:
            ready.remove(task.key)
        else:
            ready.remove(task.key, task.group, turn)
        if not ready:
            del self.ready[task.function]       # take() looks only at functions with work
            return False
        return was_head

    def dequeue(self, task: Task) -> bool:
        """Take a queued task out (cancel, queue timeout, abandoned): from its line or the
        waiting; True if a new head is left to offer."""
        new_head = False
        if task.key in self.by_key:
            new_head = self.unready(task)
        else:
            self.timers.remove("waiting", task.due, task.seq)
            self.queued.delay(task.function, -1)
        self.queued.discard(task.function)
        return new_head

    def started(self, task: Task) -> None:
        """`task` left its line to run (or to be admitted): its head was taken by top()."""
        del self.offered[task.function]
        self.unready(task, turn=True)
        self.queued.discard(task.function)

    # -- groups held back by their own limits ---------------------------------------------
    def hold(self, name: str, group: str) -> None:
        """`group` of `name` may not start now: passed over in its place (a plain line of
        the group "" becomes a Rotation, which can pass it over)."""
        ready = self.ready.get(name)
        if type(ready) is SortedList:
            if not group:
                self.ready[name] = self._rotation(name, ready)
        elif ready is not None:
            ready.hold(group)

    def free(self, name: str, group: str) -> None:
        """`group` of `name` may start again (the caller offers `name`)."""
        ready = self.ready.get(name)
        if ready is not None and type(ready) is not SortedList:
            ready.free(group)

    # -- handing out -----------------------------------------------------------------------
    def head(self, name: str) -> tuple | None:
        ready = self.ready.get(name)
        return ready[0] if ready else None

    def offer(self, name: str, head: tuple) -> None:
        """`name` may start a call now: its head is a candidate."""
        if self.offered.get(name) != head:
            self.offered[name] = head
            heapq.heappush(self.heads, (head, name))

    def top(self, may_start: Callable[[str], bool],
            reoffer: Callable[[str], None]) -> tuple[tuple, str] | None:
        """The best entry of `heads` that is still its function's head and may start,
        stale entries dropped on the way (their functions offered again: their real head,
        or their opening time); None when none is left."""
        heads, offered = self.heads, self.offered
        while heads:
            key, name = heads[0]
            ready = self.ready.get(name)
            if offered.get(name) == key and ready and ready[0] == key and may_start(name):
                return key, name
            heapq.heappop(heads)
            if offered.get(name) == key:
                del offered[name]
                reoffer(name)
        return None

    def passing(self) -> "Passing":
        """A look through the candidates that passes some over (`with lines.passing()`)."""
        return Passing(self)

    def forget_offer(self, name: str) -> None:
        """A config read again: every function is offered afresh."""
        self.offered.pop(name, None)

    # -- looking ---------------------------------------------------------------------------
    def wait_num(self, task: Task) -> int:
        """Tasks of its function that run before it (if it were due now), every group
        starting as its turn comes: what group limits hold back now does not change it."""
        ready = self.ready.get(task.function)
        if not ready:
            return 0
        if type(ready) is not SortedList:
            return ready.rank(task.key, task.group)
        if not task.group:
            return ready.bisect_left(task.key)
        # (a group's task not due yet, in a line of the group "" alone: were it due, its
        # group would join right of "" at its level, after the "" task on top)
        above, level = ready.bisect_left(task.key[:1]), ready.bisect_left((task.key[0] + 1,))
        return above + (level > above)

    def due_count(self, name: str) -> int:
        return len(self.ready.get(name, ()))

    def next_deadline(self) -> float | None:
        return self.timers.next_deadline()


class Passing:
    """Candidate heads `take` or `admit` passed over (online ones for take, offline ones
    for admit, request tasks for an old dispatcher): popped from the heap while looking,
    pushed back when done, so the best head of another kind keeps its place."""

    def __init__(self, lines: Lines) -> None:
        self.lines = lines
        self.passed: list = []

    def __enter__(self) -> "Passing":
        return self

    def pop(self) -> None:
        """Pass over the top entry (it goes back at the end)."""
        self.passed.append(heapq.heappop(self.lines.heads))

    def drop(self, keep_offer: bool = False) -> None:
        """Take the top entry for good: its function is no longer offered, unless
        `keep_offer` (its task is leaving the line: Lines.started ends the offer)."""
        _, name = heapq.heappop(self.lines.heads)
        if not keep_offer:
            del self.lines.offered[name]

    def __exit__(self, *exc) -> None:
        for entry in self.passed:
            heapq.heappush(self.lines.heads, entry)
