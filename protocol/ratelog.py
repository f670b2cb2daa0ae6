"""Lines that would repeat, logged at most once per key per interval, each saying how many
were not logged since.

A misconfigured peer reconnects every few hundred ms and a misspelled function fails every
call: one line per event would bury the rest of the log, none would hide the fault.  So a
`RateLog` logs the first line of a key, then keeps quiet about that key for `every_s`,
counting; the next line it logs ends with "(N more <verb> since the last such line)".
The clock is the caller's (`now`, monotonic seconds), so the broker's pure core passes
its own and tests pass a fake one.  A line kept quiet costs a dict lookup and a store:
its arguments are formatted only when it is logged (logging's %-style, lazily).  At most
`remembered` keys are kept; beyond that the oldest is forgotten (its next line is logged
as a first one).
"""
from __future__ import annotations

import logging

#: keys kept by default (a peer's host, a function's name): bounded, since their senders
#: choose them
REMEMBERED = 4096
_NEVER = (float("-inf"), 0)     # a key not logged yet: (logged at, kept quiet since)


class RateLog:
    def __init__(self, logger: logging.Logger, every_s: float, verb: str,
                 level: int = logging.WARNING, remembered: int = REMEMBERED) -> None:
        self.logger = logger
        self.every_s = every_s
        self.verb = verb                # what the count counts: "refused", "failed"
        self.level = level
        self.remembered = remembered
        self.said: dict = {}            # key -> (logged at, lines kept quiet since)

    def due(self, key, now: float) -> bool:
        """Whether a line of `key` would be logged now; one that would not is counted as
        kept quiet.  A caller whose arguments cost something to make asks this first."""
        logged_at, since = self.said.get(key, _NEVER)
        if now - logged_at < self.every_s:
            self.said[key] = (logged_at, since + 1)
            return False
        return True

    def say(self, key, now: float, msg: str, *args) -> bool:
        """Log `msg % args` unless `key` was logged less than `every_s` before `now`;
        whether it was."""
        if not self.due(key, now):
            return False
        since = self.said.pop(key, _NEVER)[1]
        if len(self.said) >= self.remembered:
            del self.said[next(iter(self.said))]
        self.said[key] = (now, 0)
        if since:
            msg += " (%d more %s since the last such line)"
            args += (since, self.verb)
        self.logger.log(self.level, msg, *args)
        return True
