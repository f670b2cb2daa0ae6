"""Cron schedules (broker/core/schedules/cron.py): fields, Quartz's rules, refusals, and fire times on a fake
clock, DST included (New York, Berlin, Lord Howe's half hour, São Paulo's midnight shifts and
the day Samoa skipped), checked against a brute-force enumeration with Hypothesis."""
from __future__ import annotations

import math
import time
from datetime import date, datetime, timedelta, timezone
from functools import lru_cache
from itertools import product
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zstalk.broker.core.schedules.cron import Cron, CronError, next_fire, parse, zone

NEW_YORK = "America/New_York"
BERLIN = "Europe/Berlin"
LORD_HOWE = "Australia/Lord_Howe"


def cron(expr: str) -> Cron:
    got = parse(expr)
    assert isinstance(got, Cron), got
    return got


def fires(expr: str, zone_name: str, start: str, count: int) -> list[str | None]:
    """The next `count` fire times after `start` (ISO with an offset), as local ISO strings."""
    schedule, tz = cron(expr), ZoneInfo(zone_name)
    t: float | None = datetime.fromisoformat(start).timestamp()
    out: list[str | None] = []
    for _ in range(count):
        t = next_fire(schedule, tz, t)
        out.append(None if t is None else datetime.fromtimestamp(t, tz).isoformat())
        if t is None:
            break
    return out


def fire_times_between(expr: str, zone_name: str, start: str, end: str) -> list[float]:
    schedule, tz = cron(expr), ZoneInfo(zone_name)
    t, stop = datetime.fromisoformat(start).timestamp(), datetime.fromisoformat(end).timestamp()
    out: list[float] = []
    while (t := next_fire(schedule, tz, t)) is not None and t < stop:
        out.append(t)
    return out


# --- the seed's four examples ------------------------------------------------------------

def test_every_five_minutes_fires_on_each_fifth_minute_of_a_day():
    got = fire_times_between("0 */5 * * * ?", BERLIN, "2024-06-03T00:00:00+02:00",
                             "2024-06-04T00:00:00+02:00")
    assert len(got) == 288 - 1      # the midnight at `start` itself is not after it
    assert {b - a for a, b in zip(got, got[1:])} == {300}
    assert all(datetime.fromtimestamp(t, ZoneInfo(BERLIN)).minute % 5 == 0 for t in got)


def test_ten_seconds_past_every_fifth_minute_fires_at_second_ten():
    assert fires("10 */5 * * * ?", BERLIN, "2024-06-03T11:58:00+02:00", 4) == [
        "2024-06-03T12:00:10+02:00", "2024-06-03T12:05:10+02:00",
        "2024-06-03T12:10:10+02:00", "2024-06-03T12:15:10+02:00"]


def test_half_past_ten_to_half_past_one_fires_on_wednesdays_and_fridays_only():
    got = fires("0 30 10-13 ? * WED,FRI", BERLIN, "2024-06-03T00:00:00+02:00", 9)
    assert got == [f"2024-06-{day}T{hour}:30:00+02:00"
                   for day in ("05", "07") for hour in ("10", "11", "12", "13")] + [
        "2024-06-12T10:30:00+02:00"]


def test_every_half_hour_from_eight_to_nine_fires_on_the_fifth_and_twentieth():
    got = fire_times_between("0 */30 8-9 5,20 * ?", NEW_YORK, "2024-01-01T00:00:00-05:00",
                             "2024-04-01T00:00:00-04:00")
    local = [datetime.fromtimestamp(t, ZoneInfo(NEW_YORK)).strftime("%m-%d %H:%M") for t in got]
    assert local == [f"{month:02}-{day:02} {clock}" for month in (1, 2, 3) for day in (5, 20)
                     for clock in ("08:00", "08:30", "09:00", "09:30")]


# --- fields ------------------------------------------------------------------------------

@pytest.mark.parametrize("field, text, values", [
    ("seconds", "5", (5,)),
    ("seconds", "05", (5,)),
    ("seconds", "1,3,5", (1, 3, 5)),
    ("seconds", "10-12", (10, 11, 12)),
    ("seconds", "10-20/5", (10, 15, 20)),
    ("seconds", "*/15", (0, 15, 30, 45)),
    ("seconds", "50/4", (50, 54, 58)),
    ("seconds", "5,1-5", (1, 2, 3, 4, 5)),
    ("seconds", "*", tuple(range(60))),
    ("hours", "*/6", (0, 6, 12, 18)),
    ("hours", "22-23,0-2", (0, 1, 2, 22, 23)),
    ("days", "*/10", (1, 11, 21, 31)),
    ("months", "jan,Mar-MAY", (1, 3, 4, 5)),
    ("months", "*/4", (1, 5, 9)),
    ("months", "FEB/5", (2, 7, 12)),
    ("weekdays", "mon-Fri", (2, 3, 4, 5, 6)),
    ("weekdays", "SUN,sat", (1, 7)),
    ("weekdays", "2/2", (2, 4, 6)),
    ("weekdays", "1-7", (1, 2, 3, 4, 5, 6, 7)),
])
def test_each_field_form_gives_its_values(field, text, values):
    texts = {"seconds": "0", "hours": "0", "days": "*", "months": "*", "weekdays": "?"}
    texts[field] = text
    if field == "weekdays":
        texts["days"] = "?"
    got = cron(" ".join([texts["seconds"], "0", texts["hours"], texts["days"], texts["months"],
                         texts["weekdays"]]))
    assert getattr(got, field) == values


def test_the_question_mark_leaves_its_day_field_unset():
    assert cron("0 0 12 ? * MON").days is None
    assert cron("0 0 12 1 * ?").weekdays is None


def test_the_expression_text_is_kept_with_single_spaces():
    assert cron(" 0  */5 *\t* * ? ").text == "0 */5 * * * ?"


@pytest.mark.parametrize("hour, fixed", [
    ("2", True), ("1,13", True), ("9-17", True), ("0-23", True),
    ("*", False), ("*/2", False), ("1/3", False), ("2-20/6", False), ("1,*/6", False),
])
def test_an_hour_field_is_fixed_unless_it_has_a_star_or_a_step(hour, fixed):
    assert cron(f"0 0 {hour} * * ?").fixed_hour is fixed


def test_day_of_week_numbers_are_quartz_ones_with_sunday_first():
    monday = "2024-06-03T00:00:00+00:00"
    assert fires("0 0 12 ? * 1", "UTC", monday, 1) == ["2024-06-09T12:00:00+00:00"]
    assert fires("0 0 12 ? * SUN", "UTC", monday, 1) == ["2024-06-09T12:00:00+00:00"]
    assert fires("0 0 12 ? * 2", "UTC", monday, 1) == ["2024-06-03T12:00:00+00:00"]
    assert fires("0 0 12 ? * 7", "UTC", monday, 1) == ["2024-06-08T12:00:00+00:00"]


def test_a_31st_is_skipped_in_months_that_have_30_days_or_fewer():
    assert fires("0 0 12 31 * ?", "UTC", "2024-01-01T00:00:00+00:00", 8) == [
        f"{y}-{m}-31T12:00:00+00:00" for y, m in [("2024", "01"), ("2024", "03"), ("2024", "05"),
                                                  ("2024", "07"), ("2024", "08"), ("2024", "10"),
                                                  ("2024", "12"), ("2025", "01")]]


def test_a_30th_is_skipped_only_in_february():
    got = fires("0 0 0 30 * ?", "UTC", "2025-01-01T00:00:00+00:00", 3)
    assert got == ["2025-01-30T00:00:00+00:00", "2025-03-30T00:00:00+00:00",
                   "2025-04-30T00:00:00+00:00"]


def test_february_29th_fires_only_in_leap_years():
    assert fires("0 0 0 29 FEB ?", "UTC", "2024-03-01T00:00:00+00:00", 2) == [
        "2028-02-29T00:00:00+00:00", "2032-02-29T00:00:00+00:00"]


def test_february_29th_skips_2100_which_is_not_a_leap_year():
    assert fires("0 0 0 29 2 ?", "UTC", "2096-03-01T00:00:00+00:00", 1) == [
        "2104-02-29T00:00:00+00:00"]


@pytest.mark.parametrize("expr", ["0 0 0 30 FEB ?", "0 0 0 31 APR,JUN,SEP,NOV ?"])
def test_a_day_no_chosen_month_has_never_fires(expr):
    assert next_fire(cron(expr), ZoneInfo("UTC"), 1_700_000_000.0) is None


def test_nothing_fires_past_the_calendars_end():
    assert next_fire(cron("* * * * * ?"), ZoneInfo("UTC"), 253_402_000_000.0) is None


# --- the fake clock -----------------------------------------------------------------------

def test_the_fire_time_is_strictly_after_the_given_instant():
    every_second, hourly, utc = cron("* * * * * ?"), cron("0 0 * * * ?"), ZoneInfo("UTC")
    assert next_fire(every_second, utc, 100.0) == 101.0
    assert next_fire(every_second, utc, 100.5) == 101.0
    assert next_fire(hourly, utc, 3600.0) == 7200.0
    assert next_fire(hourly, utc, 3599.999) == 3600.0


def test_the_answer_depends_only_on_the_arguments_so_a_clock_set_back_asks_again():
    schedule, tz = cron("0 */5 * * * ?"), ZoneInfo(BERLIN)
    later = next_fire(schedule, tz, 1_717_408_000.0)
    earlier = next_fire(schedule, tz, 1_717_400_000.0)
    assert earlier < later
    assert next_fire(schedule, tz, 1_717_400_000.0) == earlier


def test_a_thousand_schedules_firing_every_second_cost_little_time():
    dense, sparse, tz = cron("* * * * * ?"), cron("0 0 0 29 FEB ?"), ZoneInfo(BERLIN)
    started = time.perf_counter()
    for i in range(1000):
        next_fire(dense, tz, 1_717_400_000.0 + i)
        next_fire(sparse, tz, 1_717_400_000.0 + i)
    assert time.perf_counter() - started < 0.5      # measured: about 0.013 s


# --- daylight saving time ------------------------------------------------------------------

def test_a_fixed_hour_skipped_by_spring_forward_fires_once_when_the_gap_ends():
    # New York, 2024-03-10: 02:00 EST becomes 03:00 EDT
    assert fires("0 30 2 * * ?", NEW_YORK, "2024-03-09T12:00:00-05:00", 3) == [
        "2024-03-10T03:00:00-04:00", "2024-03-11T02:30:00-04:00", "2024-03-12T02:30:00-04:00"]


def test_every_time_a_fixed_hour_names_in_the_gap_fires_together_once():
    assert fires("0 * 2 * * ?", NEW_YORK, "2024-03-10T00:00:00-05:00", 3) == [
        "2024-03-10T03:00:00-04:00", "2024-03-11T02:00:00-04:00", "2024-03-11T02:01:00-04:00"]


def test_a_skipped_time_and_the_time_that_ends_the_gap_fire_once_together():
    assert fires("0 0 1-3 * * ?", NEW_YORK, "2024-03-10T00:00:00-05:00", 3) == [
        "2024-03-10T01:00:00-05:00", "2024-03-10T03:00:00-04:00", "2024-03-11T01:00:00-04:00"]


def test_a_star_hour_passes_over_times_that_spring_forward_skips():
    assert fires("0 30 * * * ?", NEW_YORK, "2024-03-10T00:00:00-05:00", 3) == [
        "2024-03-10T00:30:00-05:00", "2024-03-10T01:30:00-05:00", "2024-03-10T03:30:00-04:00"]


@pytest.mark.parametrize("hour", ["*/2", "0/2", "0-6/2"])
def test_a_stepped_hour_passes_over_times_that_spring_forward_skips(hour):
    assert fires(f"0 30 {hour} * * ?", NEW_YORK, "2024-03-10T00:00:00-05:00", 3) == [
        "2024-03-10T00:30:00-05:00", "2024-03-10T04:30:00-04:00", "2024-03-10T06:30:00-04:00"]


def test_a_fixed_hour_repeated_by_fall_back_fires_on_its_first_occurrence_only():
    # New York, 2024-11-03: 02:00 EDT becomes 01:00 EST, so 01:00-01:59 happens twice
    assert fires("0 30 1 * * ?", NEW_YORK, "2024-11-02T12:00:00-04:00", 2) == [
        "2024-11-03T01:30:00-04:00", "2024-11-04T01:30:00-05:00"]


def test_a_fixed_hour_asked_during_the_second_pass_waits_for_the_next_day():
    assert fires("0 */20 1 * * ?", NEW_YORK, "2024-11-03T01:10:00-05:00", 2) == [
        "2024-11-04T01:00:00-05:00", "2024-11-04T01:20:00-05:00"]
    assert fires("0 */20 1 * * ?", NEW_YORK, "2024-11-03T01:10:00-04:00", 3) == [
        "2024-11-03T01:20:00-04:00", "2024-11-03T01:40:00-04:00", "2024-11-04T01:00:00-05:00"]


def test_a_star_hour_fires_twice_in_the_repeated_hour():
    assert fires("0 30 * * * ?", NEW_YORK, "2024-11-03T00:00:00-04:00", 4) == [
        "2024-11-03T00:30:00-04:00", "2024-11-03T01:30:00-04:00",
        "2024-11-03T01:30:00-05:00", "2024-11-03T02:30:00-05:00"]


def test_a_star_hour_asked_late_in_the_first_pass_fires_early_in_the_second():
    assert fires("0 0 * * * ?", NEW_YORK, "2024-11-03T01:40:00-04:00", 2) == [
        "2024-11-03T01:00:00-05:00", "2024-11-03T02:00:00-05:00"]


def test_a_range_of_every_hour_is_still_a_fixed_hour_at_fall_back():
    assert fires("0 0 0-23 * * ?", NEW_YORK, "2024-11-02T23:30:00-04:00", 3) == [
        "2024-11-03T00:00:00-04:00", "2024-11-03T01:00:00-04:00", "2024-11-03T02:00:00-05:00"]
    assert fires("0 0 * * * ?", NEW_YORK, "2024-11-02T23:30:00-04:00", 4) == [
        "2024-11-03T00:00:00-04:00", "2024-11-03T01:00:00-04:00",
        "2024-11-03T01:00:00-05:00", "2024-11-03T02:00:00-05:00"]


def test_berlin_fires_a_fixed_hour_at_three_when_two_oclock_is_skipped():
    # Berlin, 2024-03-31: 02:00 CET becomes 03:00 CEST
    assert fires("0 30 2 * * ?", BERLIN, "2024-03-30T12:00:00+01:00", 2) == [
        "2024-03-31T03:00:00+02:00", "2024-04-01T02:30:00+02:00"]
    assert fires("0 0/20 * * * ?", BERLIN, "2024-03-31T01:30:00+01:00", 3) == [
        "2024-03-31T01:40:00+01:00", "2024-03-31T03:00:00+02:00", "2024-03-31T03:20:00+02:00"]


def test_berlin_fires_a_fixed_hour_once_and_a_star_hour_twice_when_two_oclock_repeats():
    # Berlin, 2024-10-27: 03:00 CEST becomes 02:00 CET
    assert fires("0 30 2 * * ?", BERLIN, "2024-10-26T12:00:00+02:00", 2) == [
        "2024-10-27T02:30:00+02:00", "2024-10-28T02:30:00+01:00"]
    assert fires("0 30 * * * ?", BERLIN, "2024-10-27T01:00:00+02:00", 3) == [
        "2024-10-27T01:30:00+02:00", "2024-10-27T02:30:00+02:00", "2024-10-27T02:30:00+01:00"]


def test_every_five_minutes_keeps_its_beat_through_both_berlin_shifts():
    spring = fire_times_between("0 */5 * * * ?", BERLIN, "2024-03-31T00:00:00+01:00",
                                "2024-04-01T00:00:00+02:00")
    autumn = fire_times_between("0 */5 * * * ?", BERLIN, "2024-10-27T00:00:00+02:00",
                                "2024-10-28T00:00:00+01:00")
    assert (len(spring), len(autumn)) == (23 * 12 - 1, 25 * 12 - 1)
    assert {b - a for a, b in zip(spring, spring[1:])} == {300}
    assert {b - a for a, b in zip(autumn, autumn[1:])} == {300}


def test_lord_howe_half_hour_gap_fires_a_fixed_hour_at_half_past_two():
    # Lord Howe, 2024-10-06: 02:00 (+10:30) becomes 02:30 (+11:00)
    assert fires("0 15 2 * * ?", LORD_HOWE, "2024-10-05T12:00:00+10:30", 2) == [
        "2024-10-06T02:30:00+11:00", "2024-10-07T02:15:00+11:00"]
    assert fires("0 15 * * * ?", LORD_HOWE, "2024-10-06T00:30:00+10:30", 2) == [
        "2024-10-06T01:15:00+10:30", "2024-10-06T03:15:00+11:00"]


def test_lord_howe_repeated_half_hour_fires_a_fixed_hour_once_and_a_star_hour_twice():
    # Lord Howe, 2024-04-07: 02:00 (+11:00) becomes 01:30 (+10:30)
    assert fires("0 45 1 * * ?", LORD_HOWE, "2024-04-06T12:00:00+11:00", 2) == [
        "2024-04-07T01:45:00+11:00", "2024-04-08T01:45:00+10:30"]
    assert fires("0 45 * * * ?", LORD_HOWE, "2024-04-07T00:00:00+11:00", 4) == [
        "2024-04-07T00:45:00+11:00", "2024-04-07T01:45:00+11:00",
        "2024-04-07T01:45:00+10:30", "2024-04-07T02:45:00+10:30"]


def test_sao_paulo_midnight_that_never_came_fires_at_one():
    # São Paulo, 2018-11-04: 00:00 (-03) became 01:00 (-02)
    assert fires("0 0 0 * * ?", "America/Sao_Paulo", "2018-11-03T12:00:00-03:00", 2) == [
        "2018-11-04T01:00:00-02:00", "2018-11-05T00:00:00-02:00"]


def test_sao_paulo_repeated_hour_before_midnight_fires_a_fixed_hour_once():
    # São Paulo, 2018-02-18: 00:00 (-02) became 23:00 (-03) of the 17th again
    assert fires("0 30 23 * * ?", "America/Sao_Paulo", "2018-02-17T12:00:00-02:00", 2) == [
        "2018-02-17T23:30:00-02:00", "2018-02-18T23:30:00-03:00"]


def test_the_day_samoa_skipped_fires_a_fixed_hour_when_the_next_day_begins():
    # Pacific/Apia went from 2011-12-29T23:59:59-10:00 to 2011-12-31T00:00:00+14:00
    assert fires("0 0 12 * * ?", "Pacific/Apia", "2011-12-29T00:00:00-10:00", 3) == [
        "2011-12-29T12:00:00-10:00", "2011-12-31T00:00:00+14:00", "2011-12-31T12:00:00+14:00"]
    assert fires("0 0 12/6 * * ?", "Pacific/Apia", "2011-12-29T00:00:00-10:00", 3) == [
        "2011-12-29T12:00:00-10:00", "2011-12-29T18:00:00-10:00", "2011-12-31T12:00:00+14:00"]


# --- refusals ----------------------------------------------------------------------------

@pytest.mark.parametrize("expr, message", [
    ("", "expression: expected 6 fields (second minute hour day-of-month month day-of-week), "
         "got 0"),
    ("*/5 * * * *", "expression: expected 6 fields (second minute hour day-of-month month "
                    "day-of-week), got 5: the seconds come first, as in '0 */5 * * * ?'"),
    ("0 0 12 * * ? 2024", "expression: expected 6 fields (second minute hour day-of-month "
                          "month day-of-week), got 7: a year field is not supported"),
    ("0 0 12 ? * 8", "day-of-week: 8 is out of range 1-7 (1 = SUN)"),
    ("0 0 12 ? * 0", "day-of-week: 0 is out of range 1-7 (1 = SUN)"),
    ("60 0 12 * * ?", "second: 60 is out of range 0-59"),
    ("0 60 12 * * ?", "minute: 60 is out of range 0-59"),
    ("0 0 24 * * ?", "hour: 24 is out of range 0-23"),
    ("0 0 12 0 * ?", "day-of-month: 0 is out of range 1-31"),
    ("0 0 12 32 * ?", "day-of-month: 32 is out of range 1-31"),
    ("0 0 12 1 13 ?", "month: 13 is out of range 1-12 (1 = JAN)"),
    ("0 0 12 1 * 1234567890123456789012345678",
     "day-of-week: 123456789012345678901234... is out of range 1-7 (1 = SUN)"),
    ("*/0 * * * * ?", "second: a step of 0 is not allowed"),
    ("*/90 * * * * ?", "second: step 90 is more than the field's 60 values"),
    ("*/ * * * * ?", "second: a '/' needs a step after it"),
    ("*/x * * * * ?", "second: step 'x' is not a whole number"),
    ("0 0 22-2 * * ?", "hour: 22-2 is a reversed range (wrap-around is not supported): "
                       "write 22-23,0-2"),
    ("0 0 12 ? * FRI-MON", "day-of-week: FRI-MON is a reversed range (wrap-around is not "
                           "supported): write FRI-SAT,SUN-MON"),
    ("1,,2 * * * * ?", "second: empty list item (two commas in a row, or one at an end)"),
    ("0 0 12 1, * ?", "day-of-month: empty list item (two commas in a row, or one at an end)"),
    ("0 0 12 1- * ?", "day-of-month: '1-' is missing a number"),
    ("0 0 -3 * * ?", "hour: '-3' is missing a number"),
    ("0 0 12 ? * ?", "day-of-month: exactly one of day-of-month and day-of-week must be '?' "
                     "(Quartz's rule)"),
    ("0 0 12 * * *", "day-of-week: exactly one of day-of-month and day-of-week must be '?' "
                     "(Quartz's rule)"),
    ("0 0 12 * * MON", "day-of-month: exactly one of day-of-month and day-of-week must be '?' "
                       "(Quartz's rule)"),
    ("0 0 12 1 * MON", "day-of-week: exactly one of day-of-month and day-of-week must be '?' "
                       "(Quartz's rule)"),
    ("0 ? 12 * * ?", "minute: '?' is only allowed in day-of-month and day-of-week"),
    ("0 0 12 ?,1 * ?", "day-of-month: '?' must be the whole field"),
    ("0 0 12 L * ?", "day-of-month: 'L': Quartz's L, W and # are not supported"),
    ("0 0 12 15W * ?", "day-of-month: '15W': Quartz's L, W and # are not supported"),
    ("0 0 12 LW * ?", "day-of-month: 'LW': Quartz's L, W and # are not supported"),
    ("0 0 12 ? * 6L", "day-of-week: '6L': Quartz's L, W and # are not supported"),
    ("0 0 12 ? * MON#2", "day-of-week: 'MON#2': Quartz's L, W and # are not supported"),
    ("0 0 12 ? * FOO", "day-of-week: 'FOO' is not a number or a day name (SUN-SAT)"),
    ("0 0 12 ? * MONDAY", "day-of-week: 'MONDAY' is not a number or a day name (SUN-SAT)"),
    ("0 0 12 1 JANUARY ?", "month: 'JANUARY' is not a number or a month name (JAN-DEC)"),
    ("0 0 MON * * ?", "hour: 'MON' is not a number"),
    ("0 0 12 ? JAN JAN", "day-of-week: 'JAN' is not a number or a day name (SUN-SAT)"),
    ("0 0 1.5 * * ?", "hour: '1.5' is not a number"),
    ("0 0 ٣ * * ?", "hour: '٣' is not a number"),
])
def test_a_refused_expression_names_its_field_and_reason(expr, message):
    got = parse(expr)
    assert isinstance(got, CronError)
    assert got.message == message
    assert got.field == message.split(":")[0]


def test_a_known_time_zone_is_a_zoneinfo():
    assert zone("Europe/Berlin") == ZoneInfo("Europe/Berlin")
    assert zone("UTC") == ZoneInfo("UTC")


@pytest.mark.parametrize("name", ["Mars/Olympus", "", "europe/berlin", "localtime",
                                  "../etc/passwd", "/etc/localtime", "America"])
def test_an_unknown_time_zone_is_refused_by_name(name):
    got = zone(name)
    assert isinstance(got, CronError)
    assert got.message == (f"timezone: unknown time zone {name!r} "
                           "(an IANA name such as Europe/Berlin or UTC)")


# --- properties, against a brute-force enumeration ------------------------------------------

SECONDS = ["0", "30", "*/20", "10,40", "5-7"]
MINUTES = ["0", "30", "*/15", "0,45", "59", "10-12", "0/20"]
HOURS = ["*", "*/2", "1/3", "2-20/6", "0", "1", "2", "3", "23", "0-3", "1,2", "0-23"]
DAYS_OF_MONTH = ["*", "1", "15,31", "29", "31", "1-7", "*/10"]
MONTHS = ["*", "MAR,OCT,NOV", "FEB", "feb-Apr", "*/4", "SEP-DEC"]
WEEKDAYS = ["*", "SUN", "MON-FRI", "1,7", "*/3", "sat"]
ZONES = [NEW_YORK, BERLIN, LORD_HOWE, "America/Sao_Paulo", "Pacific/Apia", "UTC"]


@st.composite
def expressions(draw, every_day: bool = False) -> str:
    """Expressions with few enough times a day to enumerate; `every_day`: any day of the year."""
    by_month_day = draw(st.booleans())
    month_days, weekdays = (["*"], ["*"]) if every_day else (DAYS_OF_MONTH, WEEKDAYS)
    days = draw(st.sampled_from(month_days)) if by_month_day else "?"
    weekday = "?" if by_month_day else draw(st.sampled_from(weekdays))
    month = "*" if every_day else draw(st.sampled_from(MONTHS))
    return " ".join([draw(st.sampled_from(SECONDS)), draw(st.sampled_from(MINUTES)),
                     draw(st.sampled_from(HOURS)), days, month, weekday])


def offset_at(tz: ZoneInfo, instant: int) -> timedelta:
    return datetime.fromtimestamp(instant, tz).utcoffset()


@lru_cache(maxsize=None)
def offset_changes(zone_name: str, year: int) -> tuple[int, ...]:
    """The instants in `year` where the zone's offset changes (probed every 6 h, then bisected)."""
    tz, found = ZoneInfo(zone_name), []
    t = int(datetime(year, 1, 1, tzinfo=timezone.utc).timestamp())
    for probe in range(t, t + 366 * 86400, 6 * 3600):
        lo, hi = probe, probe + 6 * 3600
        if offset_at(tz, lo) != offset_at(tz, hi):
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if offset_at(tz, mid) == offset_at(tz, lo) else (lo, mid)
            found.append(hi)
    return tuple(found)


DST_YEARS = {NEW_YORK: (2005, 2030), BERLIN: (2005, 2030), LORD_HOWE: (2005, 2030),
             "America/Sao_Paulo": (2005, 2018), "Pacific/Apia": (2011, 2020)}


@st.composite
def instants_within_hours_of_a_shift(draw, zone_name: str) -> float:
    shifts = offset_changes(zone_name, draw(st.integers(*DST_YEARS[zone_name])))
    return (draw(st.sampled_from(shifts)) + draw(st.integers(-3 * 3600, 3 * 3600))
            + draw(st.sampled_from([0.0, 0.5])))


@st.composite
def instants(draw, zone_name: str) -> float:
    """Mostly within two days of an offset change of the zone; otherwise anywhere in 2000-2040."""
    shifts = offset_changes(zone_name, draw(st.integers(2005, 2030)))
    fraction = draw(st.sampled_from([0.0, 0.0, 0.25, 0.999]))
    if shifts and draw(st.integers(0, 3)) > 0:
        return draw(st.sampled_from(shifts)) + draw(st.integers(-2 * 86400, 2 * 86400)) + fraction
    return draw(st.integers(946_684_800, 2_208_988_800)) + fraction


def quarter_hour_transition(tz: ZoneInfo, lo: int) -> int:
    """The first offset change after `lo`, found on a quarter-hour grid (as these zones have)."""
    before, t = offset_at(tz, lo), lo - lo % 900 + 900
    while offset_at(tz, t) == before:
        t += 900
    assert offset_at(tz, t - 1) == before
    return t


def brute_fires(schedule: Cron, tz: ZoneInfo, wall: datetime) -> list[int]:
    """The instants a matching local time fires at, by the module docstring's DST rule."""
    first = int(wall.replace(tzinfo=tz, fold=0).timestamp())
    second = int(wall.replace(tzinfo=tz, fold=1).timestamp())
    if first == second:
        return [first]
    if first < second:                  # happens twice
        return [first] if schedule.fixed_hour else [first, second]
    return [quarter_hour_transition(tz, second)] if schedule.fixed_hour else []


def day_matches(schedule: Cron, day: date) -> bool:
    if day.month not in schedule.months:
        return False
    if schedule.weekdays is None:
        return day.day in schedule.days
    return day.isoweekday() % 7 + 1 in schedule.weekdays


def walls(schedule: Cron, day: date):
    """Every local time of `day` that the fields match, in order."""
    if day_matches(schedule, day):
        for h, m, s in product(schedule.hours, schedule.minutes, schedule.seconds):
            yield datetime(day.year, day.month, day.day, h, m, s)


def brute_next_fire(schedule: Cron, tz: ZoneInfo, after: float) -> int | None:
    """Every matching local time of every day from the day before `after` on, placed on the
    UTC line; the earliest later than `after` (a local day two days on is always later)."""
    day = datetime.fromtimestamp(after, tz).date() - timedelta(days=1)
    give_up, best, last_day = day.replace(year=day.year + 9, day=1), None, None
    while day < give_up and (last_day is None or day <= last_day):
        for wall in walls(schedule, day):
            for t in brute_fires(schedule, tz, wall):
                if t > after and (best is None or t < best):
                    best = t
        if best is not None and last_day is None:
            last_day = day + timedelta(days=1)
        day += timedelta(days=1)
    return best


def local_time_matches(schedule: Cron, tz: ZoneInfo, instant: float) -> bool:
    local = datetime.fromtimestamp(instant, tz).replace(tzinfo=None, fold=0)
    return local in set(walls(schedule, local.date()))


def ends_a_gap_with_a_match(schedule: Cron, tz: ZoneInfo, instant: float) -> bool:
    """`instant` is an offset change that skipped local times, and one of them matches."""
    before, after = offset_at(tz, int(instant) - 1), offset_at(tz, int(instant))
    end = datetime.fromtimestamp(instant, tz).replace(tzinfo=None, fold=0)
    start = end - (after - before)
    return after > before and any(start <= wall < end for day in (start.date(), end.date())
                                  for wall in walls(schedule, day))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_next_fire_is_the_earliest_fire_a_brute_force_enumeration_finds(data):
    zone_name = data.draw(st.sampled_from(ZONES), label="zone")
    schedule, tz = cron(data.draw(expressions(), label="expr")), ZoneInfo(zone_name)
    agrees_with_brute_force(schedule, tz, data.draw(instants(zone_name), label="after"))


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_next_fire_agrees_with_brute_force_within_hours_of_a_shift(data):
    zone_name = data.draw(st.sampled_from(sorted(DST_YEARS)), label="zone")
    schedule = cron(data.draw(expressions(every_day=True), label="expr"))
    after = data.draw(instants_within_hours_of_a_shift(zone_name), label="after")
    agrees_with_brute_force(schedule, ZoneInfo(zone_name), after)


def agrees_with_brute_force(schedule: Cron, tz: ZoneInfo, after: float) -> None:
    """The earliest fire after `after`; later than it; at a matching local time, or at the
    end of a gap that swallowed one (fixed hours only)."""
    got = next_fire(schedule, tz, after)
    assert got == brute_next_fire(schedule, tz, after)
    if got is not None:
        assert got > after and got == math.floor(got)
        assert local_time_matches(schedule, tz, got) or (
            schedule.fixed_hour and ends_a_gap_with_a_match(schedule, tz, got))
