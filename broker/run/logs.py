"""How every zstalk process speaks on stderr: its log lines, and the one start line each
role prints.

`setup_logging(verbose, log_format)` configures the root logger for a process (-V: INFO,
-VV: DEBUG) in one of two formats: "text" (TEXT_FORMAT, for people) or "json" (one
object per line, `JsonFormatter`, for log collectors); every role takes it as
`--log-format`, defaulting to $ZSTALK_LOG_FORMAT (`zstalkd`, which takes beanstalkd's
flags only, has just the variable).  A process that starts others passes its format on
(`log_format()`): the supervisor as their `--log-format`, a worker pool by giving its
spawned children the root logger's formatter.

`start_line(role, text)` says, once, what a role listens on or connects to, as
`zstalk <role> <version>: <text>` (`zstalkd <version>: ...` for the drop-in); it goes
through its own logger ("zstalk.start"), shown whatever the log level, so that one switch
of the log format changes the start lines with the rest (in JSON with `role` and
`version` fields).  A child of `zstalk serve --fronts N` prints none: its supervisor says
what the whole server listens on.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time

from .. import VERSION

START = logging.getLogger("zstalk.start")
TEXT_FORMAT = "%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s"
FORMATS = ("text", "json")
FORMAT_ENV = "ZSTALK_LOG_FORMAT"    # every role's default format; zstalkd's only way to it
#: what a LogRecord carries of its own (Formatter.format adds message and asctime): any
#: other attribute came in `extra=` and is a field of its JSON line
_RECORD_FIELDS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime",
                                                                   "taskName"}
_format = "text"                    # this process's, set by setup_logging (log_format())


class JsonFormatter(logging.Formatter):
    """A record as one line of JSON: ts (RFC 3339, UTC, milliseconds), level, logger,
    msg, pid, then its `extra=` fields (a fixed name wins over an extra of the same
    name), and exc (the traceback) or stack when it has them.  A value JSON cannot hold
    is given as str(); newlines are escaped inside the strings, so a record stays one line."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                  + f".{int(record.msecs):03d}Z",
                  "level": record.levelname.lower(), "logger": record.name,
                  "msg": record.getMessage(), "pid": record.process}
        for key, value in record.__dict__.items():
            if key not in _RECORD_FIELDS and key not in fields:
                fields[key] = value
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            fields["exc"] = record.exc_text
        if record.stack_info:
            fields["stack"] = self.formatStack(record.stack_info)
        try:
            return json.dumps(fields, default=str, allow_nan=False)
        except (TypeError, ValueError):     # a dict with non-str keys, a NaN: as text
            return json.dumps({key: _jsonable(value) for key, value in fields.items()},
                              default=str)


def _jsonable(value):
    try:
        json.dumps(value, default=str, allow_nan=False)
        return value
    except (TypeError, ValueError):
        return str(value)


def formatter(log_format: str) -> logging.Formatter:
    if log_format not in FORMATS:
        raise ValueError(f"log format {log_format!r}: give text or json")
    return JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)


def format_from_env() -> str:
    """$ZSTALK_LOG_FORMAT (text when unset); ValueError for any other value."""
    value = os.environ.get(FORMAT_ENV, "").strip().lower() or "text"
    formatter(value)
    return value


def log_format() -> str:
    """The format this process logs in, for the processes it starts."""
    return _format


def setup_logging(verbose: int, log_format: str = "text") -> None:
    """The root logger and the start lines to stderr in `log_format`; called again (the
    `zstalk` group, then a role's --log-format), it replaces what it set before."""
    global _format
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    _format = log_format
    START.handlers[:] = [_start_handler()]
    START.setLevel(logging.INFO)
    START.propagate = False


def _start_handler() -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if _format == "json" else logging.Formatter("%(message)s"))
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
    START.info("%s %s: %s", name, VERSION, text, extra={"role": role, "version": VERSION})
    for handler in START.handlers:
        handler.flush()
