"""How every zstalk process speaks on stderr: its log lines, and the one start line each
role prints.

`setup_logging` configures the root logger for a process (-V: INFO, -VV: DEBUG).
`start_line(role, text)` says, once, what a role listens on or connects to, as
`zstalk <role> <version>: <text>` (`zstalkd <version>: ...` for the drop-in); it goes
through its own logger ("zstalk.start"), shown whatever the log level, so that one switch
of the log format changes the start lines with the rest.  A child of `zstalk serve
--fronts N` prints none: its supervisor says what the whole server listens on.
"""
from __future__ import annotations

import logging
import os
import sys

from .. import VERSION

START = logging.getLogger("zstalk.start")
TEXT_FORMAT = "%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s"


def setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr, format=TEXT_FORMAT)
    START.handlers[:] = [_start_handler()]
    START.setLevel(logging.INFO)
    START.propagate = False


def _start_handler() -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    return handler


def start_line(role: str, text: str) -> None:
    """`zstalk ROLE VERSION: TEXT` on stderr, unless a supervisor speaks for this process."""
    if os.environ.get("ZSTALK_SUPERVISOR_PID"):
        return
    if not START.handlers:          # (a caller that set up no logging: still say it)
        START.addHandler(_start_handler())
        START.setLevel(logging.INFO)
        START.propagate = False
    name = "zstalkd" if role == "zstalkd" else f"zstalk {role}"
    START.info("%s %s: %s", name, VERSION, text)
    for handler in START.handlers:
        handler.flush()
