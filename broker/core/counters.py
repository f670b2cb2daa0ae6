"""Distributed counters (the yrmcds counter extension), held by the broker: the store and
the counters component.

A counter is a name with a consumption; a session (one client connection of a counter
front) acquires and releases units of it and keeps its own tally, so it can only
release what it acquired and everything it holds goes back when it closes or its front
dies (yrmcds src/counter/sockets.cpp: on_acquire, on_release, release_all).  The capacity
is not stored: every Acquire names its maximum (docs/counter.md, "Acquire").

Time: yrmcds keeps zero counters until the next stat-interval boundary, aligned to the
Unix epoch (object.hpp `deletable`, `nearest_boundary`), and reports in Dump the peak
consumption within the current interval (object.hpp `max_consumption`), so this module
works in wall-clock seconds.  The broker passes `wall` (its monotonic `now` plus a fixed
offset taken at start), which keeps this code pure and its timers testable with a fake
clock.

One deliberate difference from yrmcds: its u32 arithmetic lets Acquire 0xFFFFFFFF of
0xFFFFFFFF succeed on a counter at 1 and wrap it to 0; here the sum is checked exactly,
so that Acquire is refused with 0x21.

A function's concurrency is a counter too: while the config names functions, `fn:NAME`
is function NAME's slots in use (its calls in flight and what counter clients hold).
Get and Dump show it; Acquire takes slots against its configured concurrency (the
client's maximum is ignored) and queues nothing; Release, or the connection closing,
gives them back and a waiting task starts at once.  Those names are then reserved: an
fn: name that is no function is refused with 0x04 (yrmcds' answer to a bad name).  The
component asks the tasks component (`functions`, wired by the broker) for all of it;
without functions configured fn: names are ordinary counters.
"""
from __future__ import annotations

import math
import time
from typing import Callable

from ...protocol.schema import Op, R
from ...protocol.schema.ops import ARG

NOT_FOUND, INVALID, RESOURCE_NOT_AVAILABLE, NOT_ACQUIRED = 0x01, 0x04, 0x21, 0x22
FN = b"fn:"                 # a function's concurrency, while functions are configured
U32_MAX = 0xFFFFFFFF
DEFAULT_STAT_INTERVAL_S = 86400
OBJECT_OVERHEAD_BYTES = 64      # per object beside its name (yrmcds gc.cpp, amd64)
COMMANDS = ("noop", "get", "acquire", "release", "stats", "dump")


class Counter:
    __slots__ = ("name", "consumption", "peak", "last_updated")

    def __init__(self, name: bytes, consumption: int, wall: float) -> None:
        self.name = name
        self.consumption = consumption
        self.peak = consumption
        self.last_updated = wall


class CounterSession:
    """One connection of a counter front: what it holds, by counter name."""
    __slots__ = ("front", "conn", "holds", "slots")
    family = 1          # ops it may send: the counter ones (broker.Broker._batch)
    is_counter = True
    is_pool = False
    behind = None       # counter ops never wait behind one another (see broker.Broker._hold)

    def __init__(self, front, conn: int) -> None:
        self.front = front
        self.conn = conn
        self.holds: dict[bytes, int] = {}
        self.slots: dict[str, int] = {}     # function -> slots of it held (fn:NAME)


class Counters:
    def __init__(self, wall: float, stat_interval_s: int = DEFAULT_STAT_INTERVAL_S,
                 timer: Callable[[], float] = time.perf_counter) -> None:
        self.interval = stat_interval_s
        self.timer = timer          # only to report how long GC took (stats)
        self.table: dict[bytes, Counter] = {}
        self.total_objects = 0
        self.gc_count = 0
        self.last_gc_elapsed_us = 0
        self.total_gc_elapsed_us = 0
        self.curr_connections = 0
        self.total_connections = 0
        self.commands = dict.fromkeys(COMMANDS, 0)
        self.gc(wall)               # yrmcds collects once at start-up

    # -- interval ----------------------------------------------------------------------
    def boundary(self, wall: float) -> float:
        return math.floor(wall / self.interval) * self.interval

    def next_gc(self) -> float:
        return self.gc_done_for + self.interval

    def _stale(self, c: Counter, wall: float) -> bool:
        return c.last_updated < self.boundary(wall)

    # -- commands ----------------------------------------------------------------------
    def get(self, name: bytes):
        c = self.table.get(name)
        return (R.C_ERROR, NOT_FOUND) if c is None else (R.C_OK, c.consumption)

    def acquire(self, holds: dict, name: bytes, resources: int, maximum: int, wall: float):
        c = self.table.get(name)
        if c is None:
            c = self.table[name] = Counter(name, resources, wall)
            self.total_objects += 1
        else:
            total = c.consumption + resources
            if total > maximum:                  # exact: no u32 wrap-around
                return (R.C_ERROR, RESOURCE_NOT_AVAILABLE)
            c.peak = total if self._stale(c, wall) else max(c.peak, total)
            c.consumption = total
            c.last_updated = wall
        holds[name] = holds.get(name, 0) + resources
        return (R.C_OK, resources)

    def release(self, holds: dict, name: bytes, resources: int, wall: float):
        """Only what this session holds: not found, then not acquired, then too many (yrmcds'
        cmd_release and on_release)."""
        c = self.table.get(name)
        if c is None:
            return (R.C_ERROR, NOT_FOUND)
        held = holds.get(name, 0)
        if not held or resources > held:
            return (R.C_ERROR, NOT_ACQUIRED)
        self._take_back(c, resources, wall)
        if held == resources:
            del holds[name]
        else:
            holds[name] = held - resources
        return (R.C_OK, None)

    def release_all(self, holds: dict, wall: float) -> None:
        """A session went away: everything it held goes back (yrmcds' release_all)."""
        for name, held in holds.items():
            c = self.table.get(name)
            if c is not None:
                self._take_back(c, held, wall)
        holds.clear()

    def restore(self, holds: dict, listed, wall: float) -> None:
        """Make a session hold exactly what its front says it holds (re-registration)."""
        self.release_all(holds, wall)
        for name, count in listed:
            c = self.table.get(name)
            if c is None:
                c = self.table[name] = Counter(name, 0, wall)
                self.total_objects += 1
            c.consumption += count
            c.peak = max(c.peak, c.consumption)
            c.last_updated = wall
            holds[name] = holds.get(name, 0) + count

    def _take_back(self, c: Counter, resources: int, wall: float) -> None:
        if self._stale(c, wall):
            c.peak = c.consumption      # the peak of a new interval starts where we are
        c.consumption -= resources
        c.last_updated = wall

    def dump(self, wall: float) -> list[tuple[bytes, int, int]]:
        return [(c.name, c.consumption, c.consumption if self._stale(c, wall) else c.peak)
                for c in self.table.values()]

    def stats(self) -> list[tuple[str, int]]:
        """yrmcds' 15 items in its order (counter.cpp); objects and used_memory are live here."""
        pairs = [
            ("objects", len(self.table)),
            ("total_objects", self.total_objects),
            ("used_memory", sum(OBJECT_OVERHEAD_BYTES + len(n) for n in self.table)),
            ("conflicts", 0),           # no hash buckets to collide in
            ("gc_count", self.gc_count),
            ("last_gc_elapsed", self.last_gc_elapsed_us),
            ("total_gc_elapsed", self.total_gc_elapsed_us),
            ("curr_connections", self.curr_connections),
            ("total_connections", self.total_connections),
        ]
        return pairs + [("command:" + k, self.commands[k]) for k in COMMANDS]

    # -- garbage collection (yrmcds gc.cpp, object.hpp deletable) ----------------------
    def gc(self, wall: float) -> None:
        """Forget counters at zero that were last touched before the current boundary."""
        started = self.timer()
        edge = self.boundary(wall)
        for name in [n for n, c in self.table.items() if not c.consumption and c.last_updated < edge]:
            del self.table[name]
        self.gc_done_for = edge
        self.gc_count += 1
        self.last_gc_elapsed_us = int((self.timer() - started) * 1e6)
        self.total_gc_elapsed_us += self.last_gc_elapsed_us

    def expire(self, wall: float) -> None:
        if wall >= self.next_gc():
            self.gc(wall)


class CounterCommands:
    """The counters component: counter sessions, the store, and one handler per counter op.

    After a restart (`recovering`), and when a front of an earlier broker says Hello,
    Acquire answers 0x21 for a grace period: the fronts re-register what their
    connections hold, and until they all have, an Acquire could overcommit."""

    def __init__(self, now: float, wall_offset: float, stat_interval_s: int,
                 refuse_acquire_until: float) -> None:
        self.wall_offset = wall_offset      # wall clock = now + offset (intervals)
        self.store = Counters(now + wall_offset, stat_interval_s)
        self.refuse_acquire_until = refuse_acquire_until
        self.functions = None       # the tasks component (tasks/commands.py), for fn:NAME

    def handlers(self) -> dict:
        return {Op.C_NOOP: self.c_noop, Op.C_GET: self.c_get, Op.C_ACQUIRE: self.c_acquire,
                Op.C_RELEASE: self.c_release, Op.C_STATS: self.c_stats, Op.C_DUMP: self.c_dump}

    def wall(self, now: float) -> float:
        return now + self.wall_offset

    # -- sessions ----------------------------------------------------------------------
    def open(self, front, conn: int) -> CounterSession:
        self.store.curr_connections += 1
        self.store.total_connections += 1
        return CounterSession(front, conn)

    def close(self, s: CounterSession, now: float) -> None:
        """A connection went away: everything it holds goes back."""
        self._set_slots(s, {}, now)
        self.store.release_all(s.holds, self.wall(now))
        self.store.curr_connections -= 1

    def restore(self, front, s: CounterSession | None, st, now: float) -> CounterSession:
        """A re-registered connection: what it holds is known exactly by its front (each
        name a counter's or, fn:NAME while functions are configured, a function's)."""
        s = s or self.open(front, st.conn)
        counters, slots = [], {}
        for hold in st.holds:
            if not (isinstance(hold, (list, tuple)) and len(hold) == 2
                    and _is_name(hold[0]) and type(hold[1]) is int and hold[1] > 0):
                continue                            # (not what a front sends)
            function = self._function(hold[0])
            if function is None:
                counters.append(tuple(hold))
            elif function is not False:
                slots[function] = slots.get(function, 0) + hold[1]
        self._set_slots(s, slots, now)
        self.store.restore(s.holds, counters, self.wall(now))
        return s

    def _set_slots(self, s: CounterSession, slots: dict[str, int], now: float) -> None:
        """Make `s` hold exactly `slots` of each function: more first, then fewer, and the
        dispatchers fed once, so no task takes a slot the session keeps meanwhile."""
        if self.functions is None or (not s.slots and not slots):
            return
        freed = False
        for function in {*s.slots, *slots}:
            change = slots.get(function, 0) - s.slots.get(function, 0)
            if change > 0:
                self.functions.rehold(function, change)
            elif change < 0:
                self.functions.unhold(function, -change, now, feed=False)
                freed = True
        s.slots = {f: n for f, n in slots.items() if n}
        if freed:
            self.functions.feed(now)

    def _function(self, name) -> str | bool | None:
        """For an fn: name while functions are configured, the function it names, or
        False when it names none (a reserved name); None for an ordinary counter."""
        functions = self.functions
        if functions is None or type(name) is not bytes or not name.startswith(FN) \
                or not functions.counted():
            return None
        try:
            function = name[len(FN):].decode()
        except UnicodeDecodeError:
            return False
        return function if functions.is_function(function) else False

    def _held_function(self, s: CounterSession, name) -> str | None:
        """The function of an fn: name `s` holds slots of, configured now or not."""
        if not s.slots or type(name) is not bytes or not name.startswith(FN):
            return None
        function = name[len(FN):].decode("utf-8", "replace")
        return function if function in s.slots else None

    def refuse_acquire_while_fronts_return(self, until: float) -> None:
        """A front of an earlier broker came back: others may still be on their way."""
        self.refuse_acquire_until = max(self.refuse_acquire_until, until)

    # -- timers --------------------------------------------------------------------------
    def next_deadline(self) -> float:
        return self.store.next_gc() - self.wall_offset

    def expire(self, now: float) -> None:
        collected = self.store.gc_count
        self.store.expire(self.wall(now))
        if self.store.gc_count != collected and self.functions is not None:
            self.functions.reset_peaks()        # a new interval for fn: counters too

    # -- ops -----------------------------------------------------------------------------
    def _counted(self, name: str) -> None:
        self.store.commands[name] += 1

    def c_noop(self, s, op, now):
        self._counted("noop")
        return (s.conn, R.C_OK, None)

    def c_get(self, s, op, now):
        self._counted("get")
        if not _is_name(op[ARG]):
            return (s.conn, R.C_ERROR, INVALID)
        function = self._function(op[ARG])
        if function is False:
            return (s.conn, R.C_ERROR, INVALID)
        if function is not None:
            return (s.conn, R.C_OK, self.functions.in_use(function))
        return (s.conn, *self.store.get(op[ARG]))

    def c_acquire(self, s, op, now):
        self._counted("acquire")
        _, conn, name, resources, maximum = op
        if not (_is_name(name) and 0 < resources <= maximum <= U32_MAX):
            return (conn, R.C_ERROR, INVALID)        # what yrmcds' request::parse refuses
        function = self._function(name)
        if function is False:
            return (conn, R.C_ERROR, INVALID)
        if now < self.refuse_acquire_until:
            return (conn, R.C_ERROR, RESOURCE_NOT_AVAILABLE)    # fail closed while recovering
        if function is not None:
            if not self.functions.hold(function, resources):
                return (conn, R.C_ERROR, RESOURCE_NOT_AVAILABLE)
            s.slots[function] = s.slots.get(function, 0) + resources
            return (conn, R.C_OK, resources)
        return (conn, *self.store.acquire(s.holds, name, resources, maximum, self.wall(now)))

    def c_release(self, s, op, now):
        self._counted("release")
        _, conn, name, resources = op
        if not (_is_name(name) and 0 <= resources <= U32_MAX):
            return (conn, R.C_ERROR, INVALID)
        function = self._held_function(s, name) or self._function(name)
        if function is False:
            return (conn, R.C_ERROR, INVALID)
        if function is not None:            # (slots it holds, even of a function gone since)
            held = s.slots.get(function, 0)
            if not held or resources > held:
                return (conn, R.C_ERROR, NOT_ACQUIRED)
            if held == resources:
                del s.slots[function]
            else:
                s.slots[function] = held - resources
            self.functions.unhold(function, resources, now)
            return (conn, R.C_OK, None)
        return (conn, *self.store.release(s.holds, name, resources, self.wall(now)))

    def c_stats(self, s, op, now):
        self._counted("stats")      # yrmcds counts the request being answered
        return (s.conn, R.STATS, self.store.stats())

    def c_dump(self, s, op, now):
        self._counted("dump")
        return (s.conn, R.C_DUMP, self.dump(now))

    def dump(self, now: float) -> list[tuple[bytes, int, int]]:
        """(name, current, most this interval) of every counter and fn:NAME slot (the
        HTTP front's view, core/views.py, reads it too, counting no command)."""
        dump = self.store.dump(self.wall(now))
        if self.functions is not None and self.functions.counted():
            dump += [(FN + name.encode(), used, peak)
                     for name, used, peak in self.functions.slots_dump()]
        return dump


def _is_name(name) -> bool:
    """Ops may come from any actor, not only our parser: check what yrmcds' parser checks."""
    return isinstance(name, bytes) and 0 < len(name) <= 0xFFFF
