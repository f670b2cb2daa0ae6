"""An enqueue's options, checked in one place: names and units as the API has them
(durations in ms), each against the vocabulary's range (protocol/schema/tasks.py) or its
function's own cap (`timeout` against its max_timeout); an error names the option.
"""
from __future__ import annotations

from typing import Any, Callable

from .....protocol.schema.tasks import (AT_LEAST_ONCE, AT_MOST_ONCE, DEFAULT_BACKOFF_MS, GROUP,
                                        INT64, MAX_ATTEMPTS,
                                        MAX_DURATION_MS, MAX_LEVEL, OPTIONS, UNIQUE_ID)
from .spec import FunctionSpec
from .task import TaskBackoff, TaskError


def parse_options(options: Any, spec: FunctionSpec) -> dict | TaskError:
    """The enqueue options, checked; names and units as in the API (durations in ms)."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        return bad("options must be an object")
    out: dict[str, Any] = {}
    for name, value in options.items():
        check = _CHECKS.get(name)       # (a dict lookup: OPTIONS is a tuple, for its order)
        if check is None:
            return bad(f"unknown option {name!r}; options are {', '.join(OPTIONS)}")
        checked = check(value, spec)
        if isinstance(checked, TaskError):
            return checked
        out[name] = checked
    return out


def bad(message: str) -> TaskError:
    return TaskError("bad_request", message)


def _int(name: str, value: Any, low: int, high: int) -> int | TaskError:
    if type(value) is not int:          # (a bool is an int to Python, not to JSON)
        return bad(f"{name} must be an integer")
    if not low <= value <= high:
        return bad(f"{name} must be between {low} and {high}")
    return value


def _backoff(value: Any, spec: FunctionSpec) -> TaskBackoff | TaskError:
    if not isinstance(value, dict):
        ms = _int("backoff", value, 0, MAX_DURATION_MS)
        return ms if isinstance(ms, TaskError) else TaskBackoff("fixed", ms)
    unknown = set(value) - {"type", "delay", "maxDelay", "jitter"}
    if unknown:
        return bad(f"unknown backoff field {sorted(unknown)[0]!r}")
    kind = value.get("type", "fixed")
    if kind not in ("fixed", "exponential"):
        return bad("backoff type must be 'fixed' or 'exponential'")
    delay = _int("backoff delay", value.get("delay", DEFAULT_BACKOFF_MS), 0, MAX_DURATION_MS)
    cap = _int("backoff maxDelay", value.get("maxDelay", MAX_DURATION_MS), 0, MAX_DURATION_MS)
    jitter = value.get("jitter", False)
    if type(jitter) is not bool:
        return bad("backoff jitter must be true or false")
    for checked in (delay, cap):
        if isinstance(checked, TaskError):
            return checked
    return TaskBackoff(kind, delay, cap, jitter)


def _delivery(value: Any, spec: FunctionSpec) -> str | TaskError:
    if value not in (AT_LEAST_ONCE, AT_MOST_ONCE):
        return bad(f"deliveryMode must be {AT_LEAST_ONCE!r} or {AT_MOST_ONCE!r}")
    return value


def _unique_id(value: Any, spec: FunctionSpec) -> str | TaskError:
    if not isinstance(value, str) or not UNIQUE_ID.fullmatch(value):
        return bad("uniqueId must be 1 to 32 characters of A-Z a-z 0-9 _ . : -")
    return value


def _group(value: Any, spec: FunctionSpec) -> str | TaskError:
    if not isinstance(value, str) or not GROUP.fullmatch(value):
        return bad("group must be 1 to 64 characters of A-Z a-z 0-9 _ . : @ -")
    return value


_CHECKS: dict[str, Callable[[Any, FunctionSpec], Any]] = {
    "attempts": lambda v, spec: _int("attempts", v, 0, MAX_ATTEMPTS),
    "backoff": _backoff,
    "delay": lambda v, spec: _int("delay", v, 0, MAX_DURATION_MS),
    "deliveryMode": _delivery,
    "group": _group,
    "keepResult": lambda v, spec: _int("keepResult", v, 0, MAX_DURATION_MS),
    "level": lambda v, spec: _int("level", v, 0, MAX_LEVEL),
    "priority": lambda v, spec: _int("priority", v, *INT64),
    "queueTimeout": lambda v, spec: _int("queueTimeout", v, 1, MAX_DURATION_MS),
    "timeout": lambda v, spec: _int("timeout", v, 1, spec.max_timeout_ms),
    "uniqueId": _unique_id,
}
