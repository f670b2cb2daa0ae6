"""Room events in the broker core, on a fake clock: a pre-line before a function's
opens_at (nobody admitted, no place shown), the draw at the opening (a seed the test
gives, one ROOM_DRAW record, the pre-line served in the order the seed gives and later
joiners behind), `closed` and `max_waiting`, a new config that keeps what was drawn, and
the draw's fairness measured over many seeds (broker/core/tasks/components/room.py)."""
from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest

import test_waiting_room
from test_tasks_core import T0, WALL
from zstalk.broker.config_file import ConfigError, load
from zstalk.broker.core.shared.journal import ROOM_DRAW, NullJournal, RoomDraw, by_kind, ignore
from zstalk.broker.core.tasks import views
from zstalk.broker.core.tasks.components.room import place_in_draw
from zstalk.broker.core.tasks.store import ADMITTED, QUEUED, FunctionSpec, Tasks

OPENS = T0 + WALL + 60          # the opening, wall-clock: a minute after the test starts


class Kept(NullJournal):
    """A journal that keeps the draws appended to it (and accepts everything)."""

    def __init__(self) -> None:
        super().__init__()
        self.draws: list[RoomDraw] = []
        self.append = by_kind(ignore, {ROOM_DRAW: self.draws.append})


class Room(test_waiting_room.Room):
    """test_waiting_room's Room (join, advance) of a function with a room event, a seed
    the test gives and a journal that keeps the draws."""

    def __init__(self, seed: int = 7, **spec) -> None:
        self.spec = FunctionSpec("shop", "http://fn/shop", **{
            "concurrency": 1, "online": "public", "opens_at": OPENS,
            "max_waiting_per_client": 1_000_000, **spec})
        self.store = Tasks({"shop": self.spec}, wall_offset=WALL, seeds=lambda: seed)
        self.store.journal = self.journal = Kept()
        self.now, self.n = T0, 0

    def reconfigure(self, **spec) -> None:
        self.spec = self.spec._replace(**spec)
        self.store.configure({"shop": self.spec}, None, self.now)
        self.store.admit(self.now)

    def line(self) -> list[str]:
        """The uids of the due tasks in line, first first."""
        lines = self.store.lines
        return [lines.by_key[key].uid for key in lines.ready.get("shop", ())]

    def info(self, task) -> dict:
        return views.info(self.store, task.uid, self.now)


def drawn(seed: int, uids) -> list[str]:
    """The order the docs give for a draw (docs/waiting-room.md): by place_in_draw."""
    return sorted(uids, key=lambda uid: place_in_draw(seed, uid))


def test_before_the_opening_visitors_join_a_pre_line_with_no_place_and_nobody_is_admitted():
    room = Room(concurrency=5)
    tasks = [room.join() for _ in range(3)]
    room.advance(59)
    assert [t.status for t in tasks] == [QUEUED] * 3
    info = room.info(tasks[0])
    assert (info["phase"], info["opensAt"]) == ("pre-line", OPENS)
    assert "waitNum" not in info and "waitTime" not in info
    answer = views.enqueued(room.store, room.join(), room.now)
    assert (answer["status"], answer["phase"], answer["opensAt"]) == ("queued", "pre-line", OPENS)
    assert "waitNum" not in answer
    assert room.store.next_deadline() == pytest.approx(T0 + 60)
    assert room.journal.draws == []


def test_at_the_opening_the_pre_line_is_served_in_the_seeds_order_and_later_joiners_behind():
    room = Room(seed=12345, concurrency=1)
    early = [room.join() for _ in range(6)]
    room.advance(60)
    assert room.journal.draws == [RoomDraw("shop", OPENS, 12345)]
    order = drawn(12345, [t.uid for t in early])
    assert order != [t.uid for t in early]      # (this seed does shuffle them)
    late = [room.join() for _ in range(2)]
    assert room.store.tasks[order[0]].status == ADMITTED
    assert room.line() == order[1:] + [t.uid for t in late]
    for n, uid in enumerate(order[1:]):
        info = views.info(room.store, uid, room.now)
        assert info["waitNum"] == n and "phase" not in info
    admitted = [order[0]]
    for _ in range(7):
        room.store.done(admitted[-1], room.now)
        room.store.admit(room.now)
        admitted.append(next(t.uid for t in room.store.tasks.values() if t.status == ADMITTED))
    assert admitted == order + [t.uid for t in late]


def test_the_opening_is_one_draw_made_once_and_a_new_config_keeps_it():
    room = Room(seed=99, concurrency=1)
    tasks = [room.join() for _ in range(4)]
    room.advance(61)
    before = room.line()
    room.reconfigure(opens_at=OPENS - 3600)          # (moved back: drawn already)
    room.reconfigure(opens_at=None)
    room.reconfigure(opens_at=OPENS)
    room.advance(5)
    assert room.journal.draws == [RoomDraw("shop", OPENS, 99)] and room.line() == before
    assert "phase" not in room.info(tasks[-1])


def test_an_opens_at_after_the_last_draw_is_a_new_event_with_its_own_draw():
    room = Room(seed=5, concurrency=1)
    [room.join() for _ in range(3)]
    room.advance(60)
    room.reconfigure(opens_at=OPENS + 600)
    late = room.join()
    assert room.info(late)["phase"] == "pre-line"
    room.advance(600)
    assert room.journal.draws == [RoomDraw("shop", OPENS, 5), RoomDraw("shop", OPENS + 600, 5)]
    assert room.line() == drawn(5, room.line())       # (everyone waiting took part)


def test_a_room_event_opens_and_draws_even_before_anyone_joined():
    room = Room(seed=3)
    assert room.store.next_deadline() == pytest.approx(T0 + 60)
    room.now += 60
    room.store.expire(room.now)
    assert room.journal.draws == [RoomDraw("shop", OPENS, 3)]
    assert room.join().status == ADMITTED


def test_closed_lets_the_line_fill_and_admits_nobody_until_it_opens_again():
    room = Room(opens_at=None, closed=True, concurrency=3)
    tasks = [room.join() for _ in range(4)]
    room.advance(30)
    assert [t.status for t in tasks] == [QUEUED] * 4
    info = room.info(tasks[2])
    assert (info["phase"], info["waitNum"]) == ("closed", 2) and "waitTime" not in info
    assert views.function_stats(room.store, "shop", room.now)["phase"] == "closed"
    room.reconfigure(closed=False)
    assert [t.status for t in tasks] == [ADMITTED] * 3 + [QUEUED]
    assert "phase" not in room.info(tasks[3])


def test_max_waiting_refuses_one_more_online_task_as_line_full_until_a_place_frees():
    room = Room(opens_at=None, closed=True, max_waiting=3)
    tasks = [room.join() for _ in range(3)]
    refused = room.join()
    assert refused.code == "line_full" and "max_waiting" in refused.message
    room.store.cancel(tasks[0].uid, room.now)
    assert room.join().status == QUEUED
    offline = room.store.enqueue("shop", b"{}", None, room.now, uid="offline")
    assert offline.status == QUEUED               # (the cap is the waiting room's)
    room.reconfigure(max_waiting=0)
    assert room.join().status == QUEUED


def test_each_of_the_120_orders_of_a_pre_line_of_5_comes_up_as_often_as_chance_says():
    """12,000 draws of a pre-line of five, through the store, one seed each: every one of
    the 5! orders comes up, and the counts pass Pearson's chi-square test of
    uniformity (119 degrees of freedom) at p > 0.001."""
    seeds = random.Random(45)
    counts: dict[tuple, int] = {}
    for _ in range(12_000):
        room = Room(seed=seeds.getrandbits(64), concurrency=1)
        [room.join() for _ in range(5)]
        room.now += 60
        room.store.expire(room.now)
        order = tuple(room.line())
        counts[order] = counts.get(order, 0) + 1
    assert set(counts) == set(itertools.permutations(["t1", "t2", "t3", "t4", "t5"]))
    expected = 12_000 / 120
    chi2 = sum((n - expected) ** 2 / expected for n in counts.values())
    assert chi_square_p(chi2, 119) > 0.001


def test_for_a_pre_line_of_1000_join_order_and_drawn_order_are_uncorrelated_in_each_of_20_draws():
    seeds = random.Random(1000)
    for _ in range(20):
        room = Room(seed=seeds.getrandbits(64), concurrency=1)
        joined = [room.join().uid for _ in range(1000)]
        room.now += 60
        room.store.expire(room.now)
        place = {uid: n for n, uid in enumerate(room.line())}
        assert sorted(place) == sorted(joined)
        # (both are ranks 0-999 without ties: Pearson's r of them is Spearman's rho)
        rho = statistics.correlation(range(1000), [place[uid] for uid in joined])
        assert abs(rho) < 0.1, rho


def chi_square_p(statistic: float, df: int) -> float:
    """P(X >= statistic) for X chi-square with `df` degrees of freedom: the regularized
    upper incomplete gamma Q(df/2, statistic/2), by its continued fraction (Numerical
    Recipes, 2nd ed., section 6.2, gcf) or, below a + 1, one minus its series (gser)."""
    a, x = df / 2, statistic / 2
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1 / a
        n = a
        while abs(term) > abs(total) * 1e-15:
            n += 1
            term *= x / n
            total += term
        return 1 - total * math.exp(log_front)
    tiny = 1e-300
    b, c, d = x + 1 - a, 1 / tiny, 1 / (x + 1 - a)
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(log_front) * h


@pytest.mark.parametrize("statistic", [2.0, 60.0, 119.0, 150.0, 175.0, 240.0])
def test_the_chi_square_tail_agrees_with_its_closed_form_for_an_even_df(statistic):
    """For df = 2k, P(X >= x) is P(Poisson(x/2) < k): e^(-x/2) * sum of (x/2)^i / i!
    for i < k, computed here in logs (both branches of chi_square_p are taken)."""
    k, half = 60, statistic / 2
    exact = sum(math.exp(i * math.log(half) - half - math.lgamma(i + 1)) for i in range(k))
    assert chi_square_p(statistic, 2 * k) == pytest.approx(exact, rel=1e-9, abs=1e-15)


# -- the config file -------------------------------------------------------------------
def write(tmp_path, text: str) -> str:
    path = tmp_path / "zstalk.toml"
    path.write_text(text)
    return str(path)


def test_opens_at_is_a_toml_offset_date_time_or_an_rfc_3339_string(tmp_path):
    got = load(write(tmp_path, '[functions.a]\nurl = "http://a"\nopens_at = 2026-12-24T18:00:00Z\n'
                               '[functions.b]\nurl = "http://b"\n'
                               'opens_at = "2026-12-24T19:00:00+01:00"\nclosed = true\n'
                               'max_waiting = 5000\n'))
    a, b = got.named
    assert a.opens_at == b.opens_at == 1_798_135_200.0
    assert (a.closed, a.max_waiting, b.closed, b.max_waiting) == (False, 0, True, 5000)


@pytest.mark.parametrize("value", ["2026-12-24T18:00:00", '"2026-12-24T18:00:00"', "2026-12-24"])
def test_an_opens_at_without_an_offset_is_refused_naming_the_file_and_the_key(tmp_path, value):
    path = write(tmp_path, f'[functions.shop]\nurl = "http://a"\nopens_at = {value}\n')
    with pytest.raises(ConfigError, match=r"zstalk\.toml: \[functions\.shop\]: opens_at: "):
        load(path)


def test_closed_and_max_waiting_are_checked_and_per_function_only(tmp_path):
    for text, key in (('closed = "yes"', "closed"), ("max_waiting = -1", "max_waiting")):
        with pytest.raises(ConfigError, match=rf"\[functions\.shop\]: {key} must be"):
            load(write(tmp_path, f'[functions.shop]\nurl = "http://a"\n{text}\n'))
    with pytest.raises(ConfigError, match=r"\[functions\]: unknown key 'closed'"):
        load(write(tmp_path, '[functions]\nclosed = true\n[functions.shop]\nurl = "http://a"\n'))
