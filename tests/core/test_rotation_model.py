"""The rotation of tenant groups (issue 44) against a model that simulates it as the issue
words it: Hypothesis runs enqueues (groups, levels, priorities, delays), hand-outs,
cancels and the clock on two functions, and after every step each hand-out must be the
model's and every queued task's waitNum the number of due tasks the model would hand out
before it (a task not due yet: as if it were due now); the named groups' counts the
functions' stats show are what the tasks say."""
from __future__ import annotations

import copy

from hypothesis import given, settings, strategies as st

from zstalk.broker.core.tasks import views

from test_tasks_core import Clock

FUNCTIONS = ("f", "g")
GROUPS = ("", "acme", "beta", "gamma")


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

    def head(self) -> tuple:
        return self.lines[self.order[self.turn]][0]

    def hand_out(self) -> tuple:
        group = self.order[self.turn]
        entry = self.lines[group].pop(0)
        if self.lines[group]:
            self.turn = (self.turn + 1) % len(self.order)
        else:
            self._leave(group)
        return entry


class Model:
    def __init__(self) -> None:
        self.rings: dict[str, dict[int, Ring]] = {name: {} for name in FUNCTIONS}
        self.later: list[tuple] = []        # (due, seq, task) not due yet

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

    def head(self, name: str) -> tuple | None:
        rings = self.rings[name]
        if not rings:
            return None
        level = max(rings)
        priority, seq, uid = rings[level].head()
        return (-level, priority, seq), uid

    def take(self) -> str | None:
        heads = [h for h in (self.head(name) for name in FUNCTIONS) if h is not None]
        if not heads:
            return None
        _, uid = min(heads)
        for name in FUNCTIONS:
            head = self.head(name)
            if head is not None and head[1] == uid:
                rings = self.rings[name]
                level = max(rings)
                rings[level].hand_out()
                if not rings[level].lines:
                    del rings[level]
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


@settings(max_examples=400, deadline=None)
@given(st.lists(step, min_size=8, max_size=60))
def test_the_hand_out_order_and_every_wait_num_are_the_models_after_every_step(steps):
    spec = {"concurrency": 1000, "timeout_ms": 600_000}     # (no call times out here)
    c = Clock(f=spec, g=spec)
    model, running = Model(), []
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
            assert (task.uid if task is not None else None) == model.take()
            if task is not None and s[1] == "success":
                c.report(task, "success")
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
                c.report(running.pop(s[1] % len(running)), "success")
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
