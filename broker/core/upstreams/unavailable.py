"""Why a group gave no server: the answer the task store acts on without loading the
balancing code (a broker with no upstream in its config never loads group.py)."""
from __future__ import annotations

from typing import NamedTuple

NO_LIVE_UPSTREAMS = "no live upstreams"     # nginx's words when every server is down
BUSY = "busy"                               # all failed, at max_conns or paused


class Unavailable(NamedTuple):
    """Why `pick` gave None: `reason` is NO_LIVE_UPSTREAMS (every server is down: the
    attempt fails) or BUSY (wait: until `until`, or until a call ends when it is None)."""
    reason: str
    until: float | None
