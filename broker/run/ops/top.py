"""`zstalk top`: the live numbers of a broker in the terminal, refreshed every second.

    zstalk top [--url URL]              tubes, functions, counters and peers over the HTTP API
    zstalk top --beanstalk HOST:PORT    tubes from any beanstalk server (zstalk or beanstalkd)

Keys: `s` sorts by the next column (activity, name, ready, reserved, delayed, buried,
rate), `/` then text and Enter filters by name (Esc drops the filter), `q` quits.

How it works: three parts, as a sans-IO parser is split from its socket.
  * A source samples the server once: over the API (as `zstalk stats` reads it, stats.py)
    the busiest 1,000 tubes and functions matching the filter (the server searches all of
    them), the counters and the peers (fronts, worker pools and dispatchers, with a
    pool's credits and a dispatcher's free slots); over beanstalk, `list-tubes` and one
    `stats-tube` per tube (stats.py's `over_beanstalk`).  A source raises Unreachable, said on the screen
    while the next sample is tried.
  * `Board` is pure: it takes each sample with the time it was taken (the loop's
    monotonic clock, passed in), keeps the one before to turn the running totals into
    per-second rates (PUT/S from total-jobs, EV/S from the API's `activity`: puts,
    reserves and deletes; beanstalkd's stats-tube has no reserves, so puts and deletes
    there), holds the sort and the filter, takes keys (`press`) and lays the screen out as
    lines of text (`lines(width, height)`).  "Activity" ranks by events a second, then by
    events so far, then by name: what moves now comes first.
  * `run` is the curses loop (the standard library's: a table and four keys need nothing
    more, and nothing new is installed): it samples and draws every REFRESH_S, and between
    samples waits for keys TICK_S at a time.

Loaded only when `zstalk top` runs (cli.py's LAZY): never on serve's start path.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, NamedTuple
from urllib.parse import urlencode

import click

from ..cli import master_key_options
from .operator import (DEFAULT_URL, UNREACHABLE, URL_ENV, Api, Unreachable, api_from,
                       checked_url)
from .stats import host_port, over_beanstalk

REFRESH_S = 1.0
TICK_S = 0.1
#: tubes and functions asked for at most (one page each: what a screen can show, and more)
MAX_ROWS = 1000
SORTS = ("activity", "name", "ready", "reserved", "delayed", "buried", "rate")
#: per sort, the field a tube and a function are ranked by (descending; name ascending)
TUBE_KEY = {"ready": "currentJobsReady", "reserved": "currentJobsReserved",
            "delayed": "currentJobsDelayed", "buried": "currentJobsBuried", "rate": "putRate"}
FUNCTION_KEY = {"ready": "queued", "reserved": "running", "delayed": "delayed",
                "rate": "startRate"}          # (functions bury nothing: by activity then)
TUBE_COLUMNS = [("TUBE", "name", 24), ("READY", "currentJobsReady", 8),
                ("RESERVED", "currentJobsReserved", 9), ("DELAYED", "currentJobsDelayed", 8),
                ("BURIED", "currentJobsBuried", 7), ("TOTAL", "totalJobs", 9),
                ("PUT/S", "putRate", 7), ("EV/S", "eventRate", 7),
                ("OLDEST MS", "oldestReadyAgeMs", 10), ("PAUSED", "paused", 6)]
FUNCTION_COLUMNS = [("FUNCTION", "name", 24), ("QUEUED", "queued", 8), ("RUNNING", "running", 8),
                    ("DELAYED", "delayed", 8), ("STARTS/S", "startRate", 9),
                    ("WAIT MS", "waitTime", 8), ("OLDEST MS", "oldestQueuedAgeMs", 10),
                    ("PAUSED", "paused", 6)]
COUNTER_COLUMNS = [("COUNTER", "name", 24), ("CURRENT", "current", 8), ("MAX", "max", 8)]
#: a peer's name is its kind and process id (GET /v1/peers: pools' credits, dispatchers' slots)
PEER_COLUMNS = [("PEER", "name", 24), ("SESSIONS", "sessions", 8), ("CREDITS", "credits", 8),
                ("SLOTS", "slots", 6), ("RESERVED", "reserved", 9), ("SEEN MS", "lastSeenMs", 8)]


class Sample(NamedTuple):
    """One look at a server: its rows as the API spells them (stats.py's shape)."""
    tubes: list[dict]
    functions: list[dict] | None = None        # None: the source has none (beanstalk)
    counters: list[dict] | None = None
    peers: list[dict] | None = None            # the fronts, pools and dispatchers (API only)


# -- the sources -----------------------------------------------------------------------------
def over_api(api: Api, q: str) -> Sample:
    """The busiest tubes matching q, the functions, the counters and the peers; a refusal
    of the tubes or counters is Unreachable (said on the screen); functions refused (none
    configured, or not this key's) and peers refused (a server before them) are left out."""
    tubes = _get(api, "/v1/tubes?" + urlencode({"sort": "activity", "limit": MAX_ROWS, "q": q}))
    counters = _get(api, "/v1/counters")["counters"]
    status, doc = api.call("GET", "/v1/functions?" + urlencode(
        {"sort": "activity", "limit": MAX_ROWS, "q": q}))
    functions = doc["functions"] if status == 200 and isinstance(doc, dict) else None
    status, doc = api.call("GET", "/v1/peers")
    peers = [{**p, "name": f"{p['kind']} {p['pid']}"} for p in doc["peers"]] if (
        status == 200 and isinstance(doc, dict)) else None
    return Sample(tubes["tubes"], functions, counters, peers)


def _get(api: Api, path: str) -> dict:
    status, doc = api.call("GET", path)
    if status != 200 or not isinstance(doc, dict):
        said = doc if isinstance(doc, dict) else {}
        raise Unreachable(f"{api.address} answered {status} {said.get('error', '')}: "
                          f"{said.get('message', '')}")
    return doc


# -- the board: pure ---------------------------------------------------------------------------
def events(tube: dict) -> int:
    """A tube's events so far: the API's activity, else puts and deletes (stats-tube)."""
    return tube.get("activity", tube.get("totalJobs", 0) + tube.get("cmdDelete", 0))


def activity_key(row: dict) -> tuple:
    return (-row.get("eventRate", 0), -row.get("events", 0), row["name"])


class Board:
    """What `zstalk top` shows: the latest sample with its rates, the sort, the filter."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.sort = SORTS[0]
        self.filter = ""
        self.typing: str | None = None      # the filter being typed after `/`
        self.sample = Sample([])
        self.error: str | None = None
        self.before: tuple[float, dict[str, dict]] | None = None   # (taken at, tubes by name)
        self.before_functions: dict[str, dict] = {}
        self.taken_at: float | None = None

    # -- taking samples ------------------------------------------------------------------
    def take(self, sample: Sample, now: float) -> None:
        """A new sample taken at `now` (seconds, monotonic): rates against the last one."""
        last_at, last = self.before or (now, {})
        dt = now - last_at
        tubes = [self._rated(t, last.get(t["name"]), dt) for t in sample.tubes]
        functions = None if sample.functions is None else [
            {**f, "events": f.get("queued", 0) + f.get("running", 0),
             "eventRate": f.get("startRate", 0.0)} for f in sample.functions]
        self.sample = Sample(tubes, functions, sample.counters, sample.peers)
        self.before = (now, {t["name"]: t for t in tubes})
        self.taken_at, self.error = now, None

    @staticmethod
    def _rated(tube: dict, last: dict | None, dt: float) -> dict:
        out = {**tube, "events": events(tube), "putRate": 0.0, "eventRate": 0.0}
        if last is not None and dt > 0:
            out["putRate"] = max(0.0, (out.get("totalJobs", 0) - last.get("totalJobs", 0)) / dt)
            out["eventRate"] = max(0.0, (out["events"] - last["events"]) / dt)
        return out

    def failed(self, reason: str) -> None:
        self.error = reason

    # -- keys ----------------------------------------------------------------------------
    def press(self, key: str) -> bool:
        """One key ("\\n" Enter, "\\x1b" Esc, "\\x7f" backspace); False: quit."""
        if self.typing is not None:
            if key == "\n":
                self.filter, self.typing = self.typing, None
            elif key == "\x1b":
                self.filter, self.typing = "", None
            elif key == "\x7f":
                self.typing = self.typing[:-1]
            elif key.isprintable() and len(key) == 1:
                self.typing += key
            return True
        if key == "q":
            return False
        if key == "s":
            self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        elif key == "/":
            self.typing = self.filter
        elif key == "\x1b":
            self.filter = ""
        return True

    # -- the screen ----------------------------------------------------------------------
    def rows(self, rows: list[dict], by: dict[str, str]) -> list[dict]:
        """Rows whose name holds the filter, in the board's order."""
        shown = [r for r in rows if self.filter in r["name"]]
        if self.sort == "name":
            return sorted(shown, key=lambda r: r["name"])
        field = by.get(self.sort)
        if field is None:
            return sorted(shown, key=activity_key)
        return sorted(shown, key=lambda r: (-(r.get(field) or 0), r["name"]))

    def lines(self, width: int, height: int) -> list[str]:
        """The screen as at most `height` lines of at most `width` characters."""
        tables = [(TUBE_COLUMNS, self.rows(self.sample.tubes, TUBE_KEY))]
        if self.sample.functions is not None:
            tables.append((FUNCTION_COLUMNS, self.rows(self.sample.functions, FUNCTION_KEY)))
        if self.sample.counters is not None:
            counters = [c for c in self.sample.counters if self.filter in c["name"]]
            tables.append((COUNTER_COLUMNS, sorted(counters, key=lambda c: (-c["current"],
                                                                            c["name"]))))
        if self.sample.peers is not None:       # (by kind then process id, as the API lists them)
            tables.append((PEER_COLUMNS, [p for p in self.sample.peers
                                          if self.filter in p["name"]]))
        room = max(0, height - 2 - 2 * len(tables))       # (title, status; a header, a gap)
        shares = fair_shares(room, [len(rows) for _, rows in tables])
        out = [self.title()]
        for (columns, rows), share in zip(tables, shares):
            out.append(line(columns, {c[1]: c[0] for c in columns}))
            out += [line(columns, row) for row in rows[:share]]
            out.append("")
        out.append(self.status(tables))
        return [text[:width] for text in out[:height]]

    def title(self) -> str:
        shown = f"/{self.typing}_" if self.typing is not None else (self.filter or "-")
        return (f"zstalk top  {self.where}  sort: {self.sort} (s)  filter: {shown} (/)  "
                f"q: quit")

    def status(self, tables: list) -> str:
        counts = "  ".join(f"{columns[0][0].lower()}s: {len(rows)}" for columns, rows in tables)
        return f"{counts}  {self.error}" if self.error else counts


def fair_shares(room: int, wants: list[int]) -> list[int]:
    """`room` lines shared by tables wanting `wants` rows: each its even part, the part a
    table does not need given to the others."""
    shares = [0] * len(wants)
    left = room
    while left > 0:
        needy = [i for i, want in enumerate(wants) if shares[i] < want]
        if not needy:
            break
        part = max(1, left // len(needy))
        for i in needy:
            give = min(part, wants[i] - shares[i], left)
            shares[i] += give
            left -= give
    return shares


def cell(value) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def line(columns: list[tuple[str, str, int]], row: dict) -> str:
    """One row in fixed columns (a name longer than its column is cut, with `~`)."""
    cells = []
    for i, (_, key, width) in enumerate(columns):
        text = cell(row.get(key))
        if len(text) > width:
            text = text[:width - 1] + "~"
        cells.append(text.ljust(width) if i == 0 else text.rjust(width))
    return " ".join(cells).rstrip()


# -- the loop ----------------------------------------------------------------------------------
#: curses key codes as Board.press names them
KEYS = {10: "\n", 13: "\n", 27: "\x1b", 127: "\x7f", 8: "\x7f", 263: "\x7f"}


def run(screen, board: Board, sample: Callable[[str], Sample]) -> None:
    """Sample and draw every REFRESH_S; take keys between (curses.wrapper's screen)."""
    import curses
    try:
        curses.curs_set(0)
    except curses.error:
        pass                            # (a terminal that cannot hide its cursor)
    screen.timeout(int(TICK_S * 1000))
    due = 0.0
    while True:
        now = time.monotonic()
        if now >= due:
            try:
                board.take(sample(board.filter), now)
            except Unreachable as exc:
                board.failed(str(exc))
            due = now + REFRESH_S
        draw(screen, board)
        key = screen.getch()
        if key == -1:
            continue
        if not board.press(KEYS.get(key, chr(key) if 0 <= key < 0x110000 else "")):
            return
        if board.typing is None:
            due = 0.0                   # (a new filter or sort: sample again now)


def draw(screen, board: Board) -> None:
    import curses
    height, width = screen.getmaxyx()
    screen.erase()
    for y, text in enumerate(board.lines(width - 1, height)):
        try:
            screen.addstr(y, 0, text, curses.A_BOLD if y == 0 else curses.A_NORMAL)
        except curses.error:
            pass                        # (the last cell of a small screen)
    screen.refresh()


@click.command("top")
@click.option("--beanstalk", "beanstalk", default=None, metavar="HOST:PORT", callback=host_port,
              help="Read tubes from this beanstalk server (zstalk or beanstalkd) with "
                   "list-tubes and stats-tube, not from the HTTP API.")
@master_key_options("The master key, if the server has one.")
@click.option("--url", default=DEFAULT_URL, envvar=URL_ENV, show_default=True,
              show_envvar=True, callback=checked_url,
              help="The zstalk HTTP API (`zstalk serve --config` serves it).")
def top_command(beanstalk, master_key, master_key_file, url):
    """The live numbers in the terminal: tubes, functions and counters, busiest first,
    every second. Keys: s sort, / filter, q quit."""
    if beanstalk is not None:
        where = "beanstalk %s:%d" % beanstalk

        def sample(q: str) -> Sample:
            return Sample(over_beanstalk(beanstalk))
    else:
        api = api_from(url, master_key, master_key_file)
        where = url

        def sample(q: str) -> Sample:
            return over_api(api, q)
    board = Board(where)
    try:
        board.take(sample(""), time.monotonic())     # (out of reach: said before curses)
    except Unreachable as exc:
        click.echo(f"zstalk: {exc}", err=True)
        sys.exit(UNREACHABLE)
    import curses
    curses.wrapper(run, board, sample)
