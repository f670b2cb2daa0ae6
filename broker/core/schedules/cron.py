"""Cron schedules: Quartz-style six-field expressions and their next fire time (sans-IO).

    second minute hour day-of-month month day-of-week
    0      */5    *    *            *     ?              every 5 minutes, on the minute
    0      30     10-13 ?           *     WED,FRI        10:30, 11:30, 12:30, 13:30 on Wed and Fri

`parse(expr) -> Cron | CronError`, `zone(name) -> ZoneInfo | CronError` and
`next_fire(cron, tz, after) -> float | None`.  Nothing here reads a clock: `after` (UTC epoch
seconds) is an argument and the answer depends on the arguments alone, so after a wall-clock
jump the broker simply asks again from the current time.  A CronError names the field and the
reason; its `message` ("day-of-week: 8 is out of range 1-7 (1 = SUN)") is fit for an HTTP 400.

The fields.  Each is a comma list of parts; a part is `*`, `a` or `a-b`, each with an optional
step `/n`: `*/n`, `a-b/n`, and `a/n`, which runs from a to the field's maximum.  Seconds and
minutes are 0-59, hours 0-23, day-of-month 1-31, month 1-12 or JAN-DEC, day-of-week 1-7 or
SUN-SAT in Quartz's numbering (1 = SUN ... 7 = SAT); names are case-insensitive, in ranges and
lists too.  Exactly one of day-of-month and day-of-week is `?` (Quartz's rule), so the days are
chosen by one field and never by an OR of the two.  Refused: five or seven fields, L, W and #,
numbers out of range, a step of 0 or one larger than the field's count of values (`*/90` in
seconds cannot mean "every 90 s"), empty list items, and reversed ranges: `22-2` and `FRI-MON`
are not wrapped around as Quartz does, because a reversed range is more often a slip than a
wish and the list `22-23,0-2` says the same plainly; the message suggests that list.  A day that
no chosen month has (`0 0 0 30 FEB ?`) parses, and next_fire answers None for it.

How next_fire works.  The fields are matched on the zone's wall clock, counted as naive
"local seconds", by jumping field by field: to the next allowed month, then day, hour, minute
and second (bisect in sorted tuples), carrying into the larger field when a smaller one runs
out; nothing steps second by second.  A local match is then placed on the UTC line through
the zone's two readings of it (PEP 495's fold=0 and fold=1), which differ only where the
zone's offset changes: fold=0 earlier means the local time happens twice (a fall-back),
fold=0 later means it never happens (a spring-forward gap).  The instant where the offset
changes is found by bisection between the two readings.  The longest wait there can be is
for Feb 29 across a year like 2100 (8 years), so a schedule that matches nothing within
8 years never fires; nor does anything past the year 9998.  Fire times are whole seconds;
the answer is the first one strictly after `after`, which may be fractional.

Daylight saving time, as the issue states Debian cron's rule:
- A fixed hour (no `*` and no step anywhere in the hour field: `2`, `1,13`, `9-17`, even
  `0-23`) fires once for each local time it names.  A time skipped by a spring-forward fires
  at the first instant after the gap, the transition itself (02:30 in New York on
  2024-03-10 fires at 03:00 EDT); all the times matched in one gap fire there together,
  once.  A time repeated by a fall-back fires on its first occurrence only.
- An hour field that is `*` or has a step (`*/n`, `a/n`, `a-b/n`) follows elapsed time:
  a local time that does not exist is not fired, and one that happens twice fires twice.
This differs from Debian cron itself, which also looks at the minute field (a job whose minute
or hour field starts with `*` is a wildcard job) and takes `1-23/2` for a fixed time: the issue
decides by the hour field alone and counts every step as elapsed time.  The rule applies to
any change of a zone's offset, not only to DST (Pacific/Apia skipped 2011-12-30 whole).

Zones are the names zoneinfo.available_timezones() lists, less "localtime" (a link to the
host's own setting: a schedule must mean the same on every machine).
"""
from __future__ import annotations

import calendar
import math
import re
from bisect import bisect_left
from dataclasses import dataclass
from datetime import date, datetime, timedelta, tzinfo
from functools import cache
from typing import NamedTuple
from zoneinfo import ZoneInfo, available_timezones

HORIZON_YEARS = 8           # Feb 29, 2096 -> Feb 29, 2104: the longest wait between two fires
_LAST_YEAR = 9998           # datetime ends at 9999; keep a year for the offsets and the carry
_EPOCH = datetime(1970, 1, 1)
_EPOCH_ORDINAL = _EPOCH.toordinal()
_DAY_S = 86400
_FIRST_INSTANT = (date(2, 1, 1).toordinal() - _EPOCH_ORDINAL) * _DAY_S
_LAST_INSTANT = (date(_LAST_YEAR, 1, 1).toordinal() - _EPOCH_ORDINAL) * _DAY_S


@dataclass(frozen=True)
class CronError:
    """Why an expression or a zone was refused: `field` as the issue names it, and why."""
    field: str
    reason: str

    @property
    def message(self) -> str:
        return f"{self.field}: {self.reason}"


@dataclass(frozen=True)
class Cron:
    """A parsed expression: each field's allowed values, ascending; None for the `?` day field."""
    text: str                           # the expression, its fields joined by single spaces
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...] | None        # day-of-month
    months: tuple[int, ...]
    weekdays: tuple[int, ...] | None    # Quartz numbers: 1 = SUN ... 7 = SAT
    fixed_hour: bool                    # no `*` nor step in the hour field: see the DST rule above


class _Field(NamedTuple):
    name: str
    lo: int
    hi: int
    names: tuple[str, ...] = ()         # names[i] stands for lo + i
    note: str = ""                      # said after the range in an out-of-range message
    wanted: str = "a number"


_MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_WEEKDAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
_FIELDS = (
    _Field("second", 0, 59),
    _Field("minute", 0, 59),
    _Field("hour", 0, 23),
    _Field("day-of-month", 1, 31),
    _Field("month", 1, 12, _MONTHS, " (1 = JAN)", "a number or a month name (JAN-DEC)"),
    _Field("day-of-week", 1, 7, _WEEKDAYS, " (1 = SUN)", "a number or a day name (SUN-SAT)"),
)
_DAY_FIELDS = ("day-of-month", "day-of-week")
_FIELD_LIST = " ".join(field.name for field in _FIELDS)
_COUNT_HINTS = {5: ": the seconds come first, as in '0 */5 * * * ?'",
                7: ": a year field is not supported"}
_QUARTZ_EXTRAS = re.compile(r"[0-9]*L|LW|[0-9]+W|.*#.*")
_ONE_QUESTION = "exactly one of day-of-month and day-of-week must be '?' (Quartz's rule)"


# --- parsing -----------------------------------------------------------------------------

def parse(expr: str) -> Cron | CronError:
    """The schedule `expr` describes, or why it describes none."""
    texts = expr.split()
    if len(texts) != len(_FIELDS):
        return CronError("expression", f"expected {len(_FIELDS)} fields ({_FIELD_LIST}), "
                                       f"got {len(texts)}{_COUNT_HINTS.get(len(texts), '')}")
    values = []
    for field, text in zip(_FIELDS, texts):
        got = _field_values(field, text)
        if isinstance(got, str):
            return CronError(field.name, got)
        values.append(got)
    seconds, minutes, hours, days, months, weekdays = values
    if (days is None) == (weekdays is None):
        return CronError(_blamed_day_field(texts[3], texts[5]), _ONE_QUESTION)
    fixed_hour = "*" not in texts[2] and "/" not in texts[2]
    return Cron(" ".join(texts), seconds, minutes, hours, days, months, weekdays, fixed_hour)


def _blamed_day_field(dom: str, dow: str) -> str:
    """The day field to change: the `*` beside a restricted one (`* * MON`), else day-of-week."""
    if dom == "?" and dow == "?":
        return "day-of-month"
    return "day-of-month" if dom == "*" and dow != "*" else "day-of-week"


def _field_values(field: _Field, text: str) -> tuple[int, ...] | None | str:
    """The field's allowed values ascending, None for `?`, or a reason it is wrong."""
    if text == "?" and field.name in _DAY_FIELDS:
        return None
    chosen: set[int] = set()
    for part in text.split(","):
        got = _part_values(field, part)
        if isinstance(got, str):
            return got
        chosen.update(got)
    return tuple(sorted(chosen))


def _part_values(field: _Field, part: str) -> range | str:
    if part == "":
        return "empty list item (two commas in a row, or one at an end)"
    if "?" in part:
        return ("'?' must be the whole field" if field.name in _DAY_FIELDS
                else "'?' is only allowed in day-of-month and day-of-week")
    base, slash, step_text = part.partition("/")
    step = _step(field, step_text) if slash else 1
    if isinstance(step, str):
        return step
    if base == "*":
        return range(field.lo, field.hi + 1, step)
    first_text, dash, last_text = base.partition("-")
    first = _value(field, first_text, part)
    if isinstance(first, str):
        return first
    if not dash:        # `a`, or `a/n`: from a to the field's maximum
        return range(first, (field.hi if slash else first) + 1, step)
    last = _value(field, last_text, part)
    if isinstance(last, str):
        return last
    if last < first:
        return (f"{base} is a reversed range (wrap-around is not supported): write "
                f"{_span(field, first, field.hi)},{_span(field, field.lo, last)}")
    return range(first, last + 1, step)


def _value(field: _Field, text: str, part: str) -> int | str:
    """One number or name of the field, or a reason it is not one."""
    upper = text.upper()
    if upper in field.names:
        return field.lo + field.names.index(upper)
    if text.isascii() and text.isdigit():
        number = int(text) if len(text) < 10 else field.hi + 1
        if field.lo <= number <= field.hi:
            return number
        return f"{_shown(text)} is out of range {field.lo}-{field.hi}{field.note}"
    if text == "":
        return f"{_shown(part)!r} is missing {field.wanted}"
    if _QUARTZ_EXTRAS.fullmatch(upper):
        return f"{_shown(text)!r}: Quartz's L, W and # are not supported"
    return f"{_shown(text)!r} is not {field.wanted}"


def _step(field: _Field, text: str) -> int | str:
    values = field.hi - field.lo + 1
    if text == "":
        return "a '/' needs a step after it"
    if not (text.isascii() and text.isdigit()):
        return f"step {_shown(text)!r} is not a whole number"
    step = int(text) if len(text) < 10 else values + 1
    if step == 0:
        return "a step of 0 is not allowed"
    if step > values:
        return f"step {_shown(text)} is more than the field's {values} values"
    return step


def _span(field: _Field, first: int, last: int) -> str:
    def label(value: int) -> str:
        return field.names[value - field.lo] if field.names else str(value)
    return label(first) if first == last else f"{label(first)}-{label(last)}"


def _shown(text: str) -> str:
    """User text quoted back in a message, cut short: it goes into an HTTP reply."""
    return text if len(text) <= 24 else text[:24] + "..."


# --- time zones --------------------------------------------------------------------------

def zone(name: str) -> ZoneInfo | CronError:
    """The IANA zone called `name` (reads the zone file once; ZoneInfo caches it)."""
    if name in _known_zones():
        try:
            return ZoneInfo(name)
        except (KeyError, ValueError, OSError):
            pass
    return CronError("timezone", f"unknown time zone {_shown(name)!r} "
                                 "(an IANA name such as Europe/Berlin or UTC)")


@cache
def _known_zones() -> frozenset[str]:
    # "localtime" is a link to this machine's own setting, not a zone's name: a schedule
    # must mean the same on every host.  available_timezones() already leaves out
    # posixrules and the right/ and posix/ copies.
    return frozenset(available_timezones() - {"localtime"})


# --- next fire time ----------------------------------------------------------------------

def next_fire(cron: Cron, tz: tzinfo, after: float) -> float | None:
    """The first fire time strictly after `after` (UTC epoch seconds); None if there is none."""
    a = math.floor(after)
    if not _FIRST_INSTANT <= a < _LAST_INSTANT:
        return None
    here = datetime.fromtimestamp(a, tz)
    local = a + _seconds(here.utcoffset())
    first, second = _readings(tz, local)
    if first == second:
        return _scan(cron, tz, local + 1, a)
    return _from_repeated(cron, tz, local, here.fold, a)


def _from_repeated(cron: Cron, tz: tzinfo, local: int, fold: int, a: int) -> float | None:
    """Like _scan, when `a` falls in a repeated stretch of local time (after a fall-back)."""
    shift = _shift(tz, local)
    if fold == 1:       # second pass: a fixed hour has fired every repeated time already
        return _scan(cron, tz, shift.end if cron.fixed_hour else local + 1, a)
    found = _first_match(cron, local + 1)
    if found is not None and found < shift.end:
        return float(found - shift.before)
    if not cron.fixed_hour:   # the second pass comes next, from the start of the repeat
        again = _first_match(cron, shift.start)
        if again is not None and again < shift.end:
            return float(again - shift.after)
    return _scan(cron, tz, shift.end, a)


def _scan(cron: Cron, tz: tzinfo, start: int, a: int) -> float | None:
    """The first fire later than instant `a` at a matching local time from `start` on."""
    while (local := _first_match(cron, start)) is not None:
        first, second = _readings(tz, local)
        if first == second:
            return float(first)
        if first < second:              # a repeated local time
            # A fixed hour never gets here on the second pass (_from_repeated skips it), and
            # from `start` on, a first reading not after `a` means the second pass is on.
            return float(first if cron.fixed_hour or first > a else second)
        shift = _shift(tz, local)       # a local time in a gap
        if cron.fixed_hour and shift.instant > a:
            return float(shift.instant)
        start = shift.end
    return None


class _Shift(NamedTuple):
    """A change of the zone's UTC offset at `instant`, from `before` to `after` seconds.

    Local time `start` up to `end` (excluded) is skipped if the offset grows, repeated if it
    shrinks."""
    instant: int
    before: int
    after: int

    @property
    def start(self) -> int:
        return self.instant + min(self.before, self.after)

    @property
    def end(self) -> int:
        return self.instant + max(self.before, self.after)


def _shift(tz: tzinfo, local: int) -> _Shift:
    """The offset change that makes `local` skipped or repeated, found by bisection."""
    before, after = _offsets(tz, local)     # PEP 495: fold=0 reads the offset before it
    lo, hi = sorted((local - before, local - after))    # lo has offset `before`, hi `after`
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _seconds(datetime.fromtimestamp(mid, tz).utcoffset()) == before:
            lo = mid
        else:
            hi = mid
    return _Shift(hi, before, after)


def _offsets(tz: tzinfo, local: int) -> tuple[int, int]:
    wall = _EPOCH + timedelta(seconds=local)
    return _seconds(tz.utcoffset(wall)), _seconds(tz.utcoffset(wall.replace(fold=1)))


def _readings(tz: tzinfo, local: int) -> tuple[int, int]:
    """The instants local time `local` stands for, read with fold=0 and with fold=1."""
    before, after = _offsets(tz, local)
    return local - before, local - after


def _seconds(offset: timedelta | None) -> int:
    return 0 if offset is None else offset.days * _DAY_S + offset.seconds


# --- matching the fields on the wall clock -------------------------------------------------

def _first_match(cron: Cron, local: int) -> int | None:
    """The first local time at or after `local` that every field matches (no zone here)."""
    days, time_of_day = divmod(local, _DAY_S)
    today = date.fromordinal(_EPOCH_ORDINAL + days)
    limit = min(today.year + HORIZON_YEARS, _LAST_YEAR)
    day = _next_day(cron, today, limit)
    if day == today:
        time = _next_time(cron, time_of_day)
        if time is not None:
            return local - time_of_day + time
        day = _next_day(cron, today + timedelta(days=1), limit)
    if day is None:
        return None
    first_time = cron.hours[0] * 3600 + cron.minutes[0] * 60 + cron.seconds[0]
    return (day.toordinal() - _EPOCH_ORDINAL) * _DAY_S + first_time


def _next_day(cron: Cron, day: date, limit: int) -> date | None:
    """The first day from `day` on, up to the year `limit`, whose month and day match."""
    while day.year <= limit:
        if day.month in cron.months:
            found = _day_in_month(cron, day)
            if found is not None:
                return day.replace(day=found)
            month = day.month + 1
        else:
            month = _at_or_after(cron.months, day.month) or cron.months[0] + 12
        day = date(day.year + (month - 1) // 12, (month - 1) % 12 + 1, 1)
    return None


def _day_in_month(cron: Cron, day: date) -> int | None:
    """The first matching day of `day`'s month from `day` on (the 31st in April: none)."""
    last = calendar.monthrange(day.year, day.month)[1]
    if cron.weekdays is None:
        found = _at_or_after(cron.days, day.day)
        return found if found is not None and found <= last else None
    weekday = day.isoweekday() % 7 + 1      # Quartz: 1 = SUN
    for ahead in range(min(7, last - day.day + 1)):
        if (weekday + ahead - 1) % 7 + 1 in cron.weekdays:
            return day.day + ahead
    return None


def _next_time(cron: Cron, second: int) -> int | None:
    """The first matching time of day at or after `second` (seconds since midnight)."""
    hour, rest = divmod(second, 3600)
    minute, sec = divmod(rest, 60)
    h = _at_or_after(cron.hours, hour)
    if h is None:
        return None
    if h > hour:
        return h * 3600 + cron.minutes[0] * 60 + cron.seconds[0]
    m = _at_or_after(cron.minutes, minute)
    if m is None:
        return _next_time(cron, (hour + 1) * 3600)
    if m > minute:
        return hour * 3600 + m * 60 + cron.seconds[0]
    s = _at_or_after(cron.seconds, sec)
    if s is None:
        return _next_time(cron, hour * 3600 + (minute + 1) * 60)
    return hour * 3600 + minute * 60 + s


def _at_or_after(values: tuple[int, ...], value: int) -> int | None:
    i = bisect_left(values, value)
    return values[i] if i < len(values) else None
