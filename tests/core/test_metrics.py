"""Metrics without processes: the exposition format, the one table of metrics (and the
list in docs/operations/metrics.md made from it), and the broker's bounded labels over the
pure core with a clock that moves only when told (10,000 client-named tubes and functions)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

prometheus_parser = pytest.importorskip("prometheus_client.parser")

from test_broker_core import Harness  # noqa: E402
from zstalk.broker.core.tasks.store import FunctionSpec, Outcome  # noqa: E402
from zstalk.broker.metrics import ACTIVITY_S, IDLE_S, BrokerMetrics, build_info  # noqa: E402
from zstalk.protocol.codecs.prometheus import (METRICS, Histogram, Sample, merge,  # noqa: E402
                                               readme_table, render, with_label)
from zstalk.protocol.schema import Op  # noqa: E402

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operations" / "metrics.md"
#: the only label names any metric has: never a job's or a task's id
LABEL_NAMES = {"version", "role", "state", "tube", "command", "kind", "function", "outcome",
               "standby",
               "upstream", "server"}    # (bounded: the config's upstreams and their servers)


def parse(text: bytes) -> dict[tuple, float]:
    """{(sample name, ((label, value), ...)): value} as prometheus-client reads it."""
    found = {}
    for family in prometheus_parser.text_string_to_metric_families(text.decode()):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def values(samples: dict, name: str, **labels) -> dict[tuple, float]:
    """The samples of `name` whose labels include `labels`."""
    want = set(labels.items())
    return {key: v for key, v in samples.items()
            if key[0] == name and want <= set(key[1])}


def label_values(samples: dict, name: str, label: str) -> set[str]:
    return {dict(key[1])[label] for key in values(samples, name)}


# -- the exposition ---------------------------------------------------------------------------
def test_what_render_writes_parses_with_prometheus_clients_parser_whatever_the_tube_name():
    wait = Histogram((0.1, 1.0))
    for seconds in (0.05, 0.1, 0.5, 7.0):
        wait.observe(seconds)
    odd = 'a "quoted"\\ tube\nname'
    text = render([Sample("zstalk_tube_puts_total", (odd,), 3),
                   Sample("zstalk_job_wait_seconds", (odd,), wait),
                   Sample("zstalk_jobs", ("ready",), 2), build_info("broker")])
    got = parse(text)
    assert got[("zstalk_tube_puts_total", (("tube", odd),))] == 3
    assert got[("zstalk_jobs", (("state", "ready"),))] == 2
    buckets = {dict(k[1])["le"]: v for k, v in values(got, "zstalk_job_wait_seconds_bucket").items()}
    assert buckets == {"0.1": 2, "1.0": 3, "+Inf": 4}       # a bound holds its own value
    assert got[("zstalk_job_wait_seconds_count", (("tube", odd),))] == 4
    assert got[("zstalk_job_wait_seconds_sum", (("tube", odd),))] == pytest.approx(7.65)
    assert text.count(b"# HELP zstalk_job_wait_seconds ") == 1


def test_a_supervisor_labels_each_childs_samples_with_its_role_and_merges_the_families():
    broker = render([build_info("broker"), Sample("zstalk_jobs", ("ready",), 5)])
    front = render([build_info("front"), Sample("zstalk_front_connections", ("beanstalk",), 2)])
    text = merge([render([build_info("supervisor")]), with_label(broker, "role", "broker"),
                  with_label(front, "role", "front-0")])
    got = parse(text)
    assert label_values(got, "zstalk_build_info", "role") == {"supervisor", "broker", "front-0"}
    assert got[("zstalk_jobs", (("role", "broker"), ("state", "ready")))] == 5
    assert got[("zstalk_front_connections", (("kind", "beanstalk"), ("role", "front-0")))] == 2
    assert text.count(b"# TYPE zstalk_build_info gauge") == 1


def test_with_label_leaves_a_label_inside_a_quoted_value_alone():
    text = b'zstalk_tube_puts_total{tube="x\\",role=\\"y"} 1\n'
    assert with_label(text, "role", "broker") == (
        b'zstalk_tube_puts_total{role="broker",tube="x\\",role=\\"y"} 1\n')


# -- the table ----------------------------------------------------------------------------------
@pytest.mark.parametrize("metric", METRICS, ids=lambda m: m.name)
def test_every_metric_follows_prometheus_naming(metric):
    assert re.fullmatch(r"zstalk_[a-z_]+", metric.name)
    assert metric.help.endswith(".") and len(metric.help) > 20
    assert set(metric.labels) <= LABEL_NAMES
    if metric.type == "counter":
        assert metric.name.endswith("_total")
    else:
        assert not metric.name.endswith("_total")
    if metric.type == "histogram":
        assert metric.name.endswith("_seconds") and list(metric.buckets) == sorted(metric.buckets)
    else:
        assert not metric.buckets


def test_the_metrics_page_lists_exactly_the_metrics_of_the_table():
    text = PAGE.read_text()
    start, end = "<!-- metrics:begin -->\n", "<!-- metrics:end -->"
    assert start in text, "docs/operations/metrics.md has no generated metric list"
    listed = text[text.index(start) + len(start):text.index(end)]
    assert listed == readme_table(), (
        "docs/operations/metrics.md's metric list is out of date: put the output of .venv/bin/python -c "
        "'from zstalk.protocol.codecs.prometheus import readme_table; print(readme_table(), "
        "end=\"\")' between its <!-- metrics:begin --> and <!-- metrics:end --> lines")


# -- bounded labels over the core ----------------------------------------------------------------
class Metered(Harness):
    """The core, its metrics, and one beanstalk connection putting into named tubes."""

    def __init__(self, top: int) -> None:
        super().__init__()
        self.metrics = BrokerMetrics(self.broker, top)
        self.open(1)

    def put_into(self, tube: str, n: int = 1) -> None:
        self.send((Op.USE, 1, tube), *[(Op.PUT, 1, 0, 0, 60, b"x")] * n)

    def scrape(self) -> dict:
        return parse(self.metrics.render(self.now, [build_info("broker")]))

    def minute(self, minutes: float = 1.0) -> None:
        """Time passes; the broker's heartbeat ranks the names."""
        self.advance(minutes * ACTIVITY_S)
        self.metrics.tick(self.now)


def puts_by_tube(samples: dict) -> dict[str, float]:
    return {dict(k[1])["tube"]: v for k, v in values(samples, "zstalk_tube_puts_total").items()}


def test_ten_thousand_client_named_tubes_label_at_most_top_names_and_lose_no_put():
    h = Metered(top=100)
    for i in range(10_000):
        h.put_into(f"t{i}", 1 + (i % 7 == 0))
    first = h.scrape()
    puts = puts_by_tube(first)
    assert len(puts) == 101 and puts["default"] == 0    # the first 100 seen (`default` is
    assert "_other" in puts                             # the first), and the rest
    assert sum(puts.values()) == 10_000 + len(range(0, 10_000, 7))
    h.put_into("late", 50)                              # busier than any, after a minute
    h.minute()
    second = h.scrape()
    assert "late" in puts_by_tube(second) and len(puts_by_tube(second)) <= 2 * 100 + 1
    for name, _ in second:
        assert name.startswith("zstalk_")
    names = {label for key in second for label, _ in key[1]}
    assert names <= LABEL_NAMES | {"le"}
    assert len(h.metrics.render(h.now)) < 400_000       # bounded, whatever the tube count


def test_a_labelled_tube_keeps_its_series_until_idle_for_an_hour_and_never_goes_back_to_other():
    h = Metered(top=2)                      # `default` and one more
    h.put_into("first", 2)                  # labelled when first seen (there is room)
    h.put_into("second", 3)                 # no room: _other
    assert puts_by_tube(h.scrape()) == {"default": 0, "first": 2, "_other": 3}
    h.put_into("second", 10)
    h.minute()                              # the busiest of the minute gets a label
    got = puts_by_tube(h.scrape())
    assert got["first"] == 2 and got["_other"] == 13 and got["second"] == 0
    h.put_into("second", 1)
    for _ in range(int(IDLE_S / ACTIVITY_S) + 1):     # `first` idle for an hour
        h.put_into("second", 1)
        h.minute()
    got = puts_by_tube(h.scrape())
    assert "first" not in got and got["second"] > 0
    h.put_into("first", 5)                  # labelled once: not counted in _other again
    assert puts_by_tube(h.scrape())["_other"] == 13


def test_a_labelled_tubes_counters_never_decrease_while_it_stays_labelled():
    h = Metered(top=3)
    seen = []
    for minute in range(5):
        h.put_into("steady", 3)
        h.put_into(f"burst{minute}", 20)
        h.minute()
        seen.append(puts_by_tube(h.scrape())["steady"])
    assert seen == sorted(seen) and seen[-1] == 15


def test_the_oldest_ready_job_age_counts_from_when_it_became_ready_not_from_its_put():
    h = Metered(top=10)
    h.send((Op.USE, 1, "later"), (Op.PUT, 1, 0, 30, 60, b"x"))     # delayed 30 s
    h.advance(30)                                   # its timer fires: ready from now on
    h.advance(10)
    age = h.scrape()[("zstalk_tube_oldest_ready_age_seconds", (("tube", "later"),))]
    assert age == pytest.approx(10, abs=1.5)
    h.advance(5)
    assert h.scrape()[("zstalk_tube_oldest_ready_age_seconds", (("tube", "later"),))] == (
        pytest.approx(age + 5))


def test_a_put_job_released_again_is_as_old_as_its_release_and_a_delayed_one_as_its_due():
    h = Metered(top=10)
    age = ("zstalk_tube_oldest_ready_age_seconds", (("tube", "mixed"),))
    h.send((Op.USE, 1, "mixed"), (Op.WATCH, 1, "mixed"), (Op.PUT, 1, 0, 0, 60, b"first"),
           (Op.PUT, 1, 5, 10, 60, b"later"))       # ready now; ready 10 s from now
    h.advance(4)
    assert h.scrape()[age] == pytest.approx(4)     # the first, ready since its put
    [(_, _, first, *_)] = h.send((Op.RESERVE, 1, 0))
    h.advance(6)                                   # t=10: the delayed one is ready
    h.advance(2)
    h.send((Op.RELEASE, 1, first, 0, 0))           # t=12: the first is ready again
    h.advance(3)
    assert h.scrape()[age] == pytest.approx(5)     # t=15: the delayed one's 5 s
    [(_, _, again, *_)] = h.send((Op.RESERVE, 1, 0))
    h.send((Op.BURY, 1, again, 0), (Op.KICK, 1, 1))     # the first: ready since t=15
    assert again == first and h.scrape()[age] == pytest.approx(5)
    [(_, _, taken, *_)] = h.send((Op.RESERVE, 1, 0))
    h.send((Op.DELETE, 1, taken))                  # the first goes (pri 0)
    assert taken == first and h.scrape()[age] == pytest.approx(5)
    h.advance(1)
    h.send((Op.DELETE, 1, h.send((Op.RESERVE, 1, 0))[0][2]))   # and the delayed one
    assert h.scrape()[age] == 0


def test_wait_and_run_histograms_count_each_reserve_and_delete_per_tube():
    h = Metered(top=10)
    h.put_into("work", 2)
    h.advance(2)
    h.send((Op.WATCH, 1, "work"))
    [(_, _, job_id, *_)] = h.send((Op.RESERVE, 1, 0))
    h.advance(3)
    h.send((Op.DELETE, 1, job_id))
    got = h.scrape()
    assert got[("zstalk_job_wait_seconds_count", (("tube", "work"),))] == 1
    assert got[("zstalk_job_wait_seconds_sum", (("tube", "work"),))] == pytest.approx(2, abs=0.01)
    assert got[("zstalk_job_run_seconds_sum", (("tube", "work"),))] == pytest.approx(3, abs=0.01)
    assert got[("zstalk_commands_total", (("command", "delete"),))] == 1


def test_ten_thousand_functions_label_at_most_top_names_and_count_every_outcome():
    h = Metered(top=50)
    store = h.broker.tasks
    store.base = FunctionSpec("*", "http://functions.invalid/fn")   # any name is a function
    for i in range(10_000):
        store.enqueue(f"fn{i}", b"{}", {"attempts": 1}, h.now, uid=f"u{i}")
    h.broker.expire(h.now)
    for _ in range(3):      # three calls: one succeeds, one fails, one is cancelled queued
        task = store.take("d1", h.now)
        store.outcome(task.uid, task.attempt, Outcome("success", 200, b"{}"), h.now)
    task = store.take("d1", h.now)
    store.outcome(task.uid, task.attempt, Outcome("fatal", 400, None, "no"), h.now)
    store.cancel("u9999", h.now)
    got = h.scrape()
    enqueued = {dict(k[1])["function"]: v
                for k, v in values(got, "zstalk_tasks_enqueued_total").items()}
    assert len(enqueued) == 51 and sum(enqueued.values()) == 10_000
    finished = values(got, "zstalk_tasks_finished_total")
    by_outcome: dict[str, float] = {}
    for key, v in finished.items():
        outcome = dict(key[1])["outcome"]
        by_outcome[outcome] = by_outcome.get(outcome, 0) + v
    assert by_outcome == {"success": 3, "failed": 1, "cancelled": 1}
    queued = sum(v for k, v in values(got, "zstalk_tasks", state="due").items())
    assert queued == 10_000 - 5


def test_the_oldest_ready_age_stays_right_and_its_index_small_through_many_reserves():
    h = Metered(top=10)
    h.send((Op.USE, 1, "q"), (Op.WATCH, 1, "q"), (Op.PUT, 1, 10, 0, 60, b"old"))
    h.advance(5)
    for _ in range(5000):                   # urgent jobs come and go ahead of the old one
        h.send((Op.PUT, 1, 0, 0, 60, b"x"))
        [(_, _, job_id, *_)] = h.send((Op.RESERVE, 1, 0))
        h.send((Op.DELETE, 1, job_id))
    tube = h.broker.queue.tubes["q"]
    assert len(tube.ready_since) <= 2 * 1 + tube.ready_since.SLACK + 1
    age = ("zstalk_tube_oldest_ready_age_seconds", (("tube", "q"),))
    assert h.scrape()[age] == pytest.approx(5)
    [(_, _, job_id, *_)] = h.send((Op.RESERVE, 1, 0))
    h.send((Op.DELETE, 1, job_id))
    assert h.scrape()[age] == 0
