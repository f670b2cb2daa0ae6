"""The dashboard's per-second differences (protocol/fronts/http/dashboard.py History) on a
fake clock, and its query's checks."""
from __future__ import annotations

from zstalk.protocol.fronts.http.dashboard import History, Query, parse_query


def test_rates_are_the_differences_of_one_total_a_second():
    history = History(seconds=5)
    for now, total in ((100.2, 10), (101.5, 13), (101.9, 14), (103.0, 20)):
        history.record("t", total, now)
    assert history.rates("t", 103.5) == [0, 0, 4, 0, 6]


def test_a_name_never_seen_has_a_flat_line():
    assert History(seconds=3).rates("nobody", 50.0) == [0, 0, 0]


def test_seconds_older_than_the_history_are_dropped():
    history = History(seconds=3)
    history.record("t", 1, 10.0)
    history.record("t", 2, 20.0)
    assert list(history.totals["t"]) == [20]


def test_beyond_max_names_the_least_recently_seen_is_forgotten():
    history = History(seconds=3, max_names=2)
    history.record("a", 1, 1.0)
    history.record("b", 1, 1.0)
    history.record("a", 2, 2.0)
    history.record("c", 1, 2.0)
    assert list(history.totals) == ["a", "c"]


def test_a_total_that_went_down_counts_as_none():
    history = History(seconds=2)
    history.record("t", 9, 1.0)
    history.record("t", 3, 2.0)
    assert history.rates("t", 2.0) == [0, 0]


def test_the_query_takes_its_four_parameters_and_refuses_others():
    assert parse_query({"q": "em", "limit": "10"}) == Query("em", 10, "", "")
    assert parse_query({"limit": "0"}) == "limit is 1 to 1000"
    assert "unknown parameter 'sort'" in parse_query({"sort": "name"})
