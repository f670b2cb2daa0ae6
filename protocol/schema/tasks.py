"""The task API's vocabulary: what a task, a function and a schedule may be called, the
ranges of their numbers, the statuses a task goes through, and what a request task may
carry.  The broker core checks enqueues against these (broker/core/tasks/), the waiting
room's pass codec reads ids with them (protocol/codecs/passes.py), the HTTP front and its
OpenAPI document show them (protocol/fronts/http/), and the dispatcher calls with them:
one definition, so the document cannot drift from what is enforced.
"""
from __future__ import annotations

import re

# -- names ---------------------------------------------------------------------------------
UNIQUE_ID = re.compile(r"[A-Za-z0-9_.:-]{1,32}")
#: a function name is a URL path segment under base_url: no leading dot (no "..")
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_:-][A-Za-z0-9_.:-]{0,63}")
SCHEDULE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
#: a task's group (its tenant: the rotation serves a function's groups in turn); "" is the
#: group of a task enqueued without one
GROUP = re.compile(r"[A-Za-z0-9_.:@-]{1,64}")

def client_net(ip: str | None) -> str | None:
    """A client address as the waiting room counts it (the broker its waiting tasks, the
    HTTP front its event streams): IPv6 by its /64 (one user often has a whole /64), IPv4
    as it is.  (Not a task's `group`: that is its tenant.)"""
    if not ip or ":" not in ip:
        return ip or None
    import ipaddress        # (here: not on zstalkd's start path)
    try:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    except ValueError:
        return ip


# -- a task's life -------------------------------------------------------------------------
QUEUED, RUNNING, SUCCESS, FAILED, CANCELLED = "queued", "running", "success", "failed", "cancelled"
ADMITTED = "admitted"       # an online task whose turn came: it holds a slot, its user a pass
FINISHED = frozenset({SUCCESS, FAILED, CANCELLED})
STATUSES = frozenset({QUEUED, RUNNING, ADMITTED}) | FINISHED
AT_LEAST_ONCE, AT_MOST_ONCE = "atLeastOnce", "atMostOnce"
QUEUE_TIMEOUT = "queue timeout"     # the error of a task that waited past its queueTimeout
TASK_ERROR_CHARS = 1000     # a task's error text is cut to this (it travels and is logged)
#: how a dispatcher reports a call (T_OUTCOME's kind)
OUTCOME_KINDS = frozenset({"success", "failure", "unknown", "fatal", "declined"})

# -- ranges --------------------------------------------------------------------------------
OPTIONS = ("attempts", "backoff", "delay", "deliveryMode", "group", "keepResult", "level",
           "priority", "queueTimeout", "timeout", "uniqueId")
MAX_DURATION_MS = 365 * 24 * 3600 * 1000        # delays, backoffs, keepResult: a year
MAX_ATTEMPTS = 1000
MAX_PAGE = 1000             # tasks one listing request may return
MAX_TIMEOUT_MS = 15 * 60 * 1000                 # a function's timeout cap unless configured
CONNECT_TIMEOUT_MS = 5000   # a call's connect timeout unless its function sets one
MAX_LEVEL = 9
#: the options' defaults (a function's config may set its own timeout)
DEFAULT_ATTEMPTS = 1                # retries after the first call
DEFAULT_BACKOFF_MS = 60_000         # the wait before each retry
DEFAULT_KEEP_RESULT_MS = 300_000    # how long a finished task stays
DEFAULT_TIMEOUT_MS = 15_000         # one call, unless its function's config says
INT64 = (-(1 << 63), (1 << 63) - 1)

# -- request tasks (a call that is a whole HTTP request: broker/core/tasks/model/requests.py) -----
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
#: the headers any request task may set (a function's `request_headers` adds to them)
SAFE_HEADERS = ("Accept", "Accept-Language", "Content-Type", "If-None-Match",
                "If-Modified-Since", "Idempotency-Key")
#: never a request's to set, whatever the config says: framing, hop-by-hop, routing, ours
FORBIDDEN_HEADERS = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade",
    "te", "trailer", "proxy-authorization", "proxy-authenticate", "proxy-connection",
    "expect"})
OWN_PREFIX = "x-zstalk-"
REQUEST_FIELDS = ("method", "path", "query", "headers", "body")
MAX_TARGET = 8192           # path and query together, bytes
MAX_HEADER_VALUE = 8192
MAX_HEADERS = 64
