"""The waiting room: online tasks, whose users wait in their function's line until their
turn, then hold a slot of its concurrency and a signed pass until they are done or the
pass expires (the HTTP front signs it: protocol/fronts/http/room.py).  This component
counts who waits and who is admitted per function, bounds how many online tasks one
client address may keep waiting (`refusal`), and keeps two timers per task: when its pass
expires, and when to look again whether its user still looks (an online task nobody
looked at within its function's heartbeat is abandoned).  It ends no task itself: `expired`
and `abandoned` return the tasks whose time is up, and the waiting room's flow (waiting.py)
ends them.

Room events (a function's opens_at, closed, max_waiting; docs/waiting-room.md): this also
knows each function's phase.  Until its `opens_at` the line is a pre-line: visitors join,
nobody is admitted, and nobody's place is known yet.  At the opening (`openings`, a
timer of the core like the others) waiting.py draws: a seed, one ROOM_DRAW record, and
every online task that joined before the opening takes the place `drawn_priority` gives
it, all of them ahead of later joiners.  The order is a shuffle by the seed, made as a
sort by a keyed hash rather than random.Random(seed).shuffle of a list: a visitor's
place depends only on the seed and its own id, so a restart that finds some visitors
gone (admitted, left, abandoned) puts the rest in the same order without knowing who
else was there.  Sorting by independent uniform keys gives every order the same chance
(Knuth, TAOCP vol. 2, 3.4.2, "sorting random numbers"); two equal 40-bit keys, about
N²/2^41 for N visitors, keep their join order.  `draws` keeps each function's latest
draw: a draw made stays whatever the config says later, and only an `opens_at` after
it is a new event (everyone waiting at its opening takes part in its draw).  `closed`
holds the line after the opening as the pre-line does before it; `max_waiting` caps the
online tasks waiting (`refusal`).  A held line is not offered to take() or admit()
(ledger.offer asks `holds`).
"""
from __future__ import annotations

import hashlib
import math
from typing import Callable, Iterator

from ...shared.journal import RoomDraw
from ..model.options import bad
from ..model.spec import DEFAULTS, FunctionSpec
from ..model.task import Task, TaskError, client_net
from .deadlines import Deadlines

#: a liveness check waiting.py could not log (the journal is full): looked at again after
LOOK_AGAIN_S = 1.0
#: the bits of a visitor's key in a draw (`place_in_draw`); members' priorities span
#: 2**DRAW_BITS ms (34 years) below the opening's
DRAW_BITS = 40
PRE_LINE, CLOSED = "pre-line", "closed"
_SEED_MASK = (1 << 64) - 1


def place_in_draw(seed: int, uid: str) -> int:
    """A pre-line visitor's key in the draw seeded `seed`: SHA-256 of the seed as 8 bytes
    (big-endian) followed by the task's uniqueId in UTF-8, its first 5 bytes as a
    big-endian integer.  Lower keys are admitted first."""
    digest = hashlib.sha256((seed & _SEED_MASK).to_bytes(8, "big") + uid.encode()).digest()
    return int.from_bytes(digest[:DRAW_BITS // 8], "big")


def drawn_priority(draw: RoomDraw, uid: str) -> int:
    """The priority a member of `draw` takes: its key, counted up from 2**DRAW_BITS below
    the opening in ms, so every member is ahead of every later joiner (whose default
    priority, its enqueue's wall-clock ms, is the opening's or later)."""
    return math.floor(draw.opens_at * 1000) - (1 << DRAW_BITS) + place_in_draw(draw.seed, uid)


class Room:
    def __init__(self) -> None:
        self.timers = Deadlines("passes", "liveness")   # (pass expires | look at, seq)
        self.waiting_by: dict[tuple[str, str], int] = {}    # (function, client) -> waiting
        self.counts: dict[str, list[int]] = {}  # function -> [online waiting, admitted]
        self.draws: dict[str, RoomDraw] = {}        # function -> its latest draw
        # function -> (opens_at wall-clock, monotonic) of an event not drawn yet
        self.openings: dict[str, tuple[float, float]] = {}

    def refusal(self, spec: FunctionSpec, options: dict, online: bool,
                client_ip: str | None) -> TaskError | None:
        """Why an enqueue may not join (or skip) `spec`'s room; None: it may."""
        if not online:
            return bad(f"{spec.name!r} takes online tasks only (\"type\": \"online\")") \
                if spec.online == "only" else None
        if "uniqueId" in options:
            return bad("an online task gets a server-made uniqueId (its id is its user's "
                       "key to it): give none")
        if spec.max_waiting and self.counts.get(spec.name, (0,))[0] >= spec.max_waiting:
            return TaskError("line_full", f"the line of {spec.name!r} is full: "
                             f"{spec.max_waiting} online "
                             f"{'task waits' if spec.max_waiting == 1 else 'tasks wait'} "
                             f"(max_waiting)")
        net = client_net(client_ip)
        if net is not None and self.waiting_by.get((spec.name, net), 0) >= (
                spec.max_waiting_per_client):
            return TaskError("too_many_waiting", f"at most {spec.max_waiting_per_client} "
                             f"online tasks of {spec.name!r} may wait per client address")
        return None

    def _count(self, name: str, which: int, change: int) -> None:
        counts = self.counts.setdefault(name, [0, 0])
        counts[which] += change
        if counts == [0, 0]:
            del self.counts[name]

    def join(self, task: Task, spec: FunctionSpec | None, now: float) -> None:
        """A queued online task waits (a new one, or one a restart brought back)."""
        self._count(task.function, 0, 1)
        self.timers.add("liveness", now + (spec or DEFAULTS).heartbeat_ms / 1000, task.seq)
        net = client_net(task.client_ip)
        if net is not None:
            key = (task.function, net)
            self.waiting_by[key] = self.waiting_by.get(key, 0) + 1

    def leave(self, task: Task) -> None:
        """It waits no more (admitted, cancelled, abandoned, failed)."""
        self._count(task.function, 0, -1)
        net = client_net(task.client_ip)
        key = (task.function, net)
        if net is not None and key in self.waiting_by:
            self.waiting_by[key] -= 1
            if not self.waiting_by[key]:
                del self.waiting_by[key]

    def admitted(self, task: Task) -> None:
        """Its turn came: it holds a slot until its pass expires (task.pass_exp)."""
        self.timers.add("passes", task.pass_exp, task.seq)
        self._count(task.function, 1, 1)

    def released(self, task: Task) -> None:
        """An admitted task's slot is free (done, its pass expired, cancelled)."""
        self.timers.discard("passes", task.pass_exp, task.seq)
        self._count(task.function, 1, -1)

    @staticmethod
    def seen(task: Task, now: float) -> None:
        """Its user looked at a queued online task: it keeps its place."""
        task.last_seen = now

    def expired(self, now: float) -> Iterator[int]:
        """The seqs of admitted tasks whose pass has expired (their slots: `released`)."""
        while self.timers.due("passes", now):
            yield self.timers.pop("passes")[1]

    def abandoned(self, now: float, queued: Callable[[int], Task | None],
                  spec_of: Callable[[str], FunctionSpec | None]) -> Iterator[Task]:
        """The queued online tasks nobody looked at within their heartbeat, one at a time
        (a caller that stops leaves the rest for later); one looked at since is checked
        again a heartbeat after that.  `queued(seq)` is the task if it is still queued."""
        while self.timers.due("liveness", now):
            _, seq = self.timers.pop("liveness")
            task = queued(seq)
            if task is None:
                continue
            heartbeat = (spec_of(task.function) or DEFAULTS).heartbeat_ms / 1000
            if task.last_seen + heartbeat > now:        # looked at since: check again then
                self.timers.add("liveness", task.last_seen + heartbeat, seq)
                continue
            yield task

    def look_again(self, task: Task, now: float) -> None:
        """`abandoned` returned it, but waiting.py could not end it now (the journal is
        full): it is looked at again a little later."""
        self.timers.add("liveness", now + LOOK_AGAIN_S, task.seq)

    # -- room events ------------------------------------------------------------------------
    def plan(self, functions: dict[str, FunctionSpec], wall_offset: float) -> None:
        """The config (at start, SIGHUP, after a restore's draws): the events to draw, those
        whose opens_at is after their function's latest draw (a draw made stays)."""
        self.openings = {}
        for name, spec in functions.items():
            drawn = self.draws.get(name)
            if spec.opens_at is not None and (drawn is None or spec.opens_at > drawn.opens_at):
                self.openings[name] = (spec.opens_at, spec.opens_at - wall_offset)

    def opened(self, now: float) -> list[tuple[str, float]]:
        """(function, opens_at) of each event whose opening has come (waiting.py draws)."""
        return [(name, wall) for name, (wall, at) in self.openings.items() if at <= now]

    def drawn(self, draw: RoomDraw) -> None:
        """`draw` was made (or restored): its function's pre-line is over."""
        self.draws[draw.function] = draw
        self.openings.pop(draw.function, None)

    def again(self, name: str, at: float) -> None:
        """A draw waiting.py could not log (the journal is full): tried again at `at`."""
        self.openings[name] = (self.openings[name][0], at)

    def holds(self, name: str, spec: FunctionSpec) -> bool:
        """Whether nobody may start from `name`'s line now (a pre-line, or closed)."""
        return spec.closed or name in self.openings

    def phase(self, name: str, spec: FunctionSpec | None) -> tuple[str, float | None] | None:
        """A held line's phase: (PRE_LINE, opens_at) or (CLOSED, None); None: open."""
        opening = self.openings.get(name)
        if opening is not None:
            return PRE_LINE, opening[0]
        return (CLOSED, None) if spec is not None and spec.closed else None

    def next_deadline(self) -> float | None:
        heads = [at for _, at in self.openings.values()]
        timers = self.timers.next_deadline()
        if timers is not None:
            heads.append(timers)
        return min(heads) if heads else None
