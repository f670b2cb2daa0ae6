"""The rotation of tenant groups (issue 44) against a model that simulates it as the issue
words it: Hypothesis runs enqueues (groups, levels, priorities, delays), hand-outs, calls
that end later, cancels and the clock on two functions, each with group limits of its own
(group_concurrency, group_rate and group_burst, or none), and after every step each
hand-out must be the model's and every queued task's waitNum the number of due tasks the
model would hand out before it if every group could start now (a task not due yet: as
if it were due now); the named groups' counts the functions' stats show are what the
tasks say.  The model decides which groups its limits hold back on its own (a count of
calls per group, and GCRA as redis-cell states it: a start at `now` iff now >= TAT - tau,
then TAT = max(TAT, now) + T): a group held back is passed over and keeps its place in
the ring, so it has its turn when the turn comes round to it."""
from __future__ import annotations

import copy

from hypothesis import given, settings, strategies as st

from zstalk.broker.core.tasks import views

from test_tasks_core import Clock

FUNCTIONS = ("f", "g")
GROUPS = ("", "acme", "beta", "gamma")


def never(group: str) -> bool:
    return False


class Ring:
    """One level of one function: the groups in the order they joined, whose turn it is
    (`turn`, an index into `order`) and each group's due tasks, best first."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.turn = 0
        self.lines: dict[str, list[tuple]] = {}     # group -> [(priority, seq, uid)]

    def add(self, group: str, entry: tuple) -> None:
        if group not in self.lines:
            self.order.append(group)                # joins at the end
            self.lines[group] = []
        self.lines[group].append(entry)
        self.lines[group].sort()

    def remove(self, group: str, entry: tuple) -> None:
        """Without a turn: the group keeps its place (or leaves, empty)."""
        self.lines[group].remove(entry)
        if not self.lines[group]:
            self._leave(group)

    def _leave(self, group: str) -> None:
        at = self.order.index(group)
        del self.order[at], self.lines[group]
        if at < self.turn:
            self.turn -= 1
        if self.turn >= len(self.order):
            self.turn = 0

    def next_open(self, held) -> int | None:
        """From the group whose turn it is round: the first its limits do not hold back."""
        for step in range(len(self.order)):
            at = (self.turn + step) % len(self.order)
            if not held(self.order[at]):
                return at
        return None

    def head(self, held=never) -> tuple | None:
        at = self.next_open(held)
        return None if at is None else self.lines[self.order[at]][0]

    def hand_out(self, held=never) -> tuple:
        at = self.next_open(held)
        group = self.order[at]
        entry = self.lines[group].pop(0)
        self.turn = at + 1                  # (the groups held back were passed over)
        if self.lines[group]:
            self.turn %= len(self.order)
        else:
            self._leave(group)
        return entry


class Limits:
    """The group limits of one function as the model keeps them: calls per group, and
    each group's TAT."""

    def __init__(self, concurrency: int = 0, rate: float = 0.0, burst: int = 0) -> None:
        self.concurrency = concurrency
        self.interval = 1 / rate if rate else 0.0
        self.tau = self.interval * burst
        self.running: dict[str, int] = {}
        self.tat: dict[str, float] = {}

    def held(self, group: str, now: float) -> bool:
        if self.concurrency and self.running.get(group, 0) >= self.concurrency:
            return True
        return bool(self.interval) and now < self.tat.get(group, now) - self.tau

    def start(self, group: str, now: float) -> None:
        self.running[group] = self.running.get(group, 0) + 1
        if self.interval:
            self.tat[group] = max(self.tat.get(group, now), now) + self.interval

    def end(self, group: str) -> None:
        self.running[group] -= 1


class Model:
    def __init__(self, limits: dict[str, Limits]) -> None:
        self.rings: dict[str, dict[int, Ring]] = {name: {} for name in FUNCTIONS}
        self.later: list[tuple] = []        # (due, seq, task) not due yet
        self.limits = limits
        self.now = 0.0

    def make_due(self, task) -> None:
        rings = self.rings[task.function]
        rings.setdefault(task.level, Ring()).add(task.group, (task.priority, task.seq, task.uid))

    def cancel(self, task, due: bool) -> None:
        if not due:
            self.later = [w for w in self.later if w[1] != task.seq]
            return
        rings = self.rings[task.function]
        rings[task.level].remove(task.group, (task.priority, task.seq, task.uid))
        if not rings[task.level].lines:
            del rings[task.level]

    def held(self, name: str):
        return lambda group: self.limits[name].held(group, self.now)

    def head(self, name: str) -> tuple | None:
        """The function's next hand-out and its level: levels first, but a level all of
        whose groups are held back holds up no one."""
        for level in sorted(self.rings[name], reverse=True):
            head = self.rings[name][level].head(self.held(name))
            if head is not None:
                priority, seq, uid = head
                return (-level, priority, seq), uid, level
        return None

    def take(self, now: float) -> str | None:
        self.now = now
        heads = [(*h, name) for name in FUNCTIONS if (h := self.head(name)) is not None]
        if not heads:
            return None
        _, uid, level, name = min(heads)
        ring, held = self.rings[name][level], self.held(name)
        group = ring.order[ring.next_open(held)]
        ring.hand_out(held)
        if not ring.lines:
            del self.rings[name][level]
        self.limits[name].start(group, now)
        return uid

    def order_of(self, name: str) -> list[str]:
        """Every due task of `name` in the order it would be handed out."""
        rings, uids = copy.deepcopy(self.rings[name]), []
        while rings:
            level = max(rings)
            uids.append(rings[level].hand_out()[2])
            if not rings[level].lines:
                del rings[level]
        return uids

    def wait_num(self, task, due: bool) -> int:
        if due:
            return self.order_of(task.function).index(task.uid)
        saved = copy.deepcopy(self.rings[task.function])
        self.make_due(task)
        place = self.order_of(task.function).index(task.uid)
        self.rings[task.function] = saved
        return place


def recount(store) -> dict:
    """The named groups' [queued, running] by function, counted from the tasks."""
    out: dict = {}
    for task in store.tasks.values():
        if task.group and task.status in ("queued", "running", "admitted"):
            counts = out.setdefault(task.function, {}).setdefault(task.group, [0, 0])
            counts[task.status != "queued"] += 1
    return out


step = st.one_of(
    st.tuples(st.just("enqueue"), st.sampled_from(FUNCTIONS), st.sampled_from(GROUPS),
              st.sampled_from([0, 0, 0, 1, 2]), st.one_of(st.none(), st.integers(0, 3)),
              st.sampled_from([0, 0, 0, 500, 1000, 2000])),
    st.tuples(st.just("take"), st.sampled_from(["success", "success", "running"])),
    st.tuples(st.just("end"), st.integers(0, 50)),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
    st.tuples(st.just("advance"), st.sampled_from([0.25, 0.5, 1.0])),
)
#: a function's group limits: (group_concurrency, group_rate per second, group_burst)
LIMITS = st.sampled_from([(0, 0, 0), (0, 0, 0), (1, 0, 0), (2, 0, 0), (0, 2, 0), (0, 1, 1),
                          (1, 2, 2), (2, 1, 0)])


@settings(max_examples=600, deadline=None)
@given(st.lists(step, min_size=8, max_size=60), st.tuples(LIMITS, LIMITS))
def test_the_hand_out_order_and_every_wait_num_are_the_models_after_every_step(steps, limits):
    spec = {"concurrency": 1000, "timeout_ms": 600_000}     # (no call times out here)
    c = Clock(**{name: {**spec, "group_concurrency": n, "group_rate": rate,
                        "group_burst": burst}
                 for name, (n, rate, burst) in zip(FUNCTIONS, limits)})
    model = Model({name: Limits(*limit) for name, limit in zip(FUNCTIONS, limits)})
    running = []
    for s in steps:
        if s[0] == "enqueue":
            _, name, group, level, priority, delay = s
            options = {"level": level, "delay": delay}
            if group:
                options["group"] = group
            if priority is not None:
                options["priority"] = priority
            task = c.enqueue(name, options)
            if delay:
                model.later.append((task.due, task.seq, task))
            else:
                model.make_due(task)
        elif s[0] == "take":
            task = c.take()
            assert (task.uid if task is not None else None) == model.take(c.now)
            if task is not None and s[1] == "success":
                c.report(task, "success")
                model.limits[task.function].end(task.group)
            elif task is not None:          # (left running: the groups' counts see it)
                running.append(task)
        elif s[0] == "cancel":
            queued = [t for t in c.store.tasks.values() if t.status == "queued"]
            if queued:
                task = queued[s[1] % len(queued)]
                due = all(w[1] != task.seq for w in model.later)
                assert c.store.cancel(task.uid, c.now).status == "cancelled"
                model.cancel(task, due)
        elif s[0] == "end":
            if running:
                task = running.pop(s[1] % len(running))
                c.report(task, "success")
                model.limits[task.function].end(task.group)
        else:
            c.advance(s[1])
            for _, _, task in sorted((w for w in model.later if w[0] <= c.now),
                                     key=lambda w: (w[0], w[1])):
                model.make_due(task)
            model.later = [w for w in model.later if w[0] > c.now]
        assert c.store.ledger.groups == recount(c.store)
        later = {w[1] for w in model.later}
        for task in c.store.tasks.values():
            if task.status == "queued":
                got = views.info(c.store, task.uid, c.now)["waitNum"]
                assert got == model.wait_num(task, task.seq not in later), task.uid
