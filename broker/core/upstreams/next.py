"""nginx's next upstream: whether a call that failed moves to another server of its
upstream within the same attempt (ngx_http_upstream_next, ngx_http_upstream_test_next),
and how many servers an attempt may try.

A failure has a class, as proxy_next_upstream names them: "error" (no connection, or it
broke), "timeout", or "http_NNN" for a status.  It moves when every one of these holds:

- its class is listed in the function's `next_upstream` (`off` lists none);
- if the request may have been sent, the task may run twice: nginx moves a POST, LOCK
  or PATCH it sent only with `non_idempotent` (`ft_type |= NGX_HTTP_UPSTREAM_FT_NON_
  IDEMPOTENT`, then `(next_upstream & ft_type) == ft_type`).  zstalk asks the task's
  delivery mode instead of the method: an `atMostOnce` task never moves once its
  request may have been sent, an `atLeastOnce` one is idempotent by its own contract
  (its retries already call it again), whatever `non_idempotent` says;
- the attempt has tries left: nginx's `u->peer.tries` starts at the number of servers
  that are not `down`, backups included (ngx_http_upstream_tries), capped by
  proxy_next_upstream_tries (0: no cap), and each server tried spends one;
- `next_upstream_timeout` (0: none) has not passed since the attempt's first call
  started (`ngx_current_msec - u->peer.start_time >= timeout` stops it);
- a server is left that the attempt has not tried (`pick` with `tried`, group.py: nginx's
  `tried` bitmap of ngx_http_upstream_rr_peer_data_t, skipped as a down peer is).

nginx checks `peer.tries > 1` before a status moves and `tries == 0` after an error's
free has spent one: the same count, `tried < tries` here.  A group of one server has one
try (nginx frees `peers->single` with `pc->tries = 0`): it never moves.

Pure: no clock, no socket; `now` and the attempt's start are monotonic seconds.
"""
from __future__ import annotations

from typing import Iterable

#: what proxy_next_upstream may list in zstalk: the failure classes, and the two words
#: that are not one (nginx's invalid_header, a response it cannot parse, has no
#: counterpart: aiohttp's parse errors are "error")
CLASSES = ("error", "timeout", "http_500", "http_502", "http_503", "http_504",
           "http_403", "http_404", "http_429")
WORDS = (*CLASSES, "non_idempotent", "off")


def failure_class(kind: str, failure: str | None, status_code: int | None) -> str | None:
    """A failed call's class (None: it did not fail, or the broker decided its end)."""
    if kind in ("success", "declined", "fatal") or failure == "":
        return None
    if status_code is not None:
        return f"http_{status_code}"
    return failure or "error"


def tries(servers: Iterable, limit: int) -> int:
    """How many servers an attempt may try: those not down, at most `limit` (0: all)."""
    count = sum(1 for server in servers if not server.down)
    return min(count, limit) if limit else count


def may_move(next_upstream: frozenset, klass: str | None, sent: bool, at_most_once: bool,
             tried: int, allowed: int, started: float, timeout_s: float,
             now: float) -> bool:
    """Whether a call of class `klass` moves on (the module's rules): `sent`, the request
    may have been sent; `tried` servers of the `allowed` (`tries`) tried so far."""
    if klass is None or klass not in next_upstream or "off" in next_upstream:
        return False
    if sent and at_most_once:
        return False
    if tried >= allowed:
        return False
    return not (timeout_s and now - started >= timeout_s)
