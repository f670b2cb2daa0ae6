"""A task's event stream as data (GET /v1/tasks/{id}/events, issue 48): which event a
new place calls for, the id that says what was sent, and the bytes of Server-Sent
Events (WHATWG HTML, section 9.2 "Server-sent events").  No socket here: streams.py
moves these bytes.

A stream follows one task's place, as the broker shows it (task_info.position: the
task's info less what is not about its place, so a field a later version adds, a room's
phase, is followed too).  Each place the front learns (the stream's first read, then the
front's positions query once a second) goes through `next_event`:

    event      when                                    data
    place      waiting or running, and the place       the place: status, waitNum,
               moved (below)                           waitTime, and whatever else it has
    admitted   an online task's turn came              pass (or passError), passExpiresAt,
                                                       admitUrl
    end        it ended (success, failed, cancelled)   status, error, endedBy (those it has)

A place moved when anything in it but waitTime changed (waitNum, status, a phase ...),
or waitTime came or went, or moved by WAIT_MOVE_RATIO of what was sent or WAIT_MOVE_MS,
whichever comes first: a countdown that creeps is not news every second.

The id of each event is the state it sent (`Sent`): a digest of the place less waitNum
and waitTime, then those two in clear, `<digest>.<waitNum>.<waitTime>`.  A client that
reconnects sends it back as Last-Event-ID, to this front or any other (they share no
state), and the stream starts from it as if it had sent it: the current place is sent
first unless it has not moved from there.  An id this version cannot read is ignored (the
current place is sent), so an id from another version never locks a client out.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any, NamedTuple

from ...schema.tasks import ADMITTED, FINISHED
from .api import task_json

PLACE, ADMITTED_EVENT, END = "place", "admitted", "end"
#: how far waitTime must move, of what was sent or in ms, to be news
WAIT_MOVE_RATIO = 0.10
WAIT_MOVE_MS = 5000
#: what an admitted event and an end carry of the place (the pass's fields: room.with_pass)
ADMITTED_FIELDS = ("pass", "passError", "passExpiresAt", "admitUrl")
END_FIELDS = ("status", "error", "endedBy")
#: a comment, which a client ignores and a proxy sees as traffic
PING = b": ping\n\n"
_DIGEST_CHARS = 8           # 48 bits of SHA-256, base64url
_ID = re.compile(r"([A-Za-z0-9_-]{8})\.(\d{0,12})\.(\d{0,15})")
_IN_CLEAR = ("waitNum", "waitTime")


class Sent(NamedTuple):
    """The state a stream sent last, as its event id carries it."""
    digest: str                 # of the place less waitNum and waitTime
    wait_num: int | None
    wait_time: int | None

    def event_id(self) -> str:
        return f"{self.digest}.{_number(self.wait_num)}.{_number(self.wait_time)}"

    @classmethod
    def parse(cls, text: str | None) -> Sent | None:
        """The state a Last-Event-ID says was sent (None: none, or one we cannot read)."""
        m = _ID.fullmatch(text.strip()) if text else None
        if m is None:
            return None
        return cls(m[1], *(int(v) if v else None for v in m.groups()[1:]))


def state(place: dict[str, Any]) -> Sent:
    """What sending `place` sends (the digest is the same on every front: the place is
    the broker's, before a front signs a pass into it)."""
    rest = {k: v for k, v in place.items() if k not in _IN_CLEAR}
    text = json.dumps(rest, sort_keys=True, separators=(",", ":"), default=repr)
    digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).decode()
    return Sent(digest[:_DIGEST_CHARS], place.get("waitNum"), place.get("waitTime"))


def moved(before: Sent, now: Sent) -> bool:
    """Whether a place in state `now` is news after `before` was sent."""
    if before.digest != now.digest or before.wait_num != now.wait_num:
        return True
    if (before.wait_time is None) != (now.wait_time is None):
        return True
    if before.wait_time is None:
        return False
    change = abs(now.wait_time - before.wait_time)
    return change >= WAIT_MOVE_MS or change >= WAIT_MOVE_RATIO * before.wait_time


def next_event(before: Sent | None, place: dict[str, Any]) -> tuple[str, Sent] | None:
    """The event `place` calls for after `before` was sent (None: nothing is news), and
    the state it sends."""
    now = state(place)
    if before is not None and not moved(before, now):
        return None
    status = place.get("status")
    return (END if status in FINISHED else ADMITTED_EVENT if status == ADMITTED else PLACE,
            now)


def ends(place: dict[str, Any]) -> bool:
    """Whether the stream of a task at `place` is over (it ended)."""
    return place.get("status") in FINISHED


def event_data(name: str, place: dict[str, Any]) -> dict[str, Any]:
    """An event's data, as the API shows it (times as RFC 3339); an admitted place with
    the pass the front signed into it."""
    if name == ADMITTED_EVENT:
        place = {k: place[k] for k in ADMITTED_FIELDS if k in place}
    elif name == END:
        place = {k: place[k] for k in END_FIELDS if k in place}
    return task_json(place)


def encode(name: str, data: dict[str, Any], event_id: str) -> bytes:
    """One event as a stream carries it (JSON has no newline: one data line)."""
    body = json.dumps(data, separators=(",", ":"))
    return f"event: {name}\nid: {event_id}\ndata: {body}\n\n".encode()


def retry(ms: int) -> bytes:
    """How long a client waits before it reconnects (a block with no data: no event)."""
    return f"retry: {ms}\n\n".encode()


def _number(value: int | None) -> str:
    return "" if value is None else str(value)
