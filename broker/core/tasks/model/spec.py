"""What the config file says of a function and of the API: a function's spec (where its
calls go, its limits, its waiting room) and what a request without the master key may
do.  Its defaults are the config's (broker/config_file.py reads the file into these);
`DEFAULTS` is a spec of nothing but them, for a task whose function left the config.
"""
from typing import NamedTuple

from .....protocol.schema.tasks import CONNECT_TIMEOUT_MS, DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS

#: a rate's period as its config spells it: "10/s", "600/m", "2/h"
PER_UNIT = {1.0: "s", 60.0: "m", 3600.0: "h"}


class FunctionSpec(NamedTuple):
    """A function tasks may call (from the config file)."""
    name: str
    url: str
    concurrency: int = 1
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    max_timeout_ms: int = MAX_TIMEOUT_MS
    rate: int = 0                   # calls per `per_s` seconds (0: no rate)
    per_s: float = 1.0
    burst: int = 0
    queue_timeout_ms: int = 0       # 0: none
    max_pause_ms: int = 60000
    request_headers: tuple[str, ...] = ()   # request tasks may set these too (requests.py)
    result_headers: tuple[str, ...] = ()    # response headers a task keeps (resultHeaders)
    # the waiting room (online tasks, room.py): who may enqueue them ("public", "master" or
    # "only": online tasks only, public), how long a pass lasts, how often a waiting user
    # must look, how many may wait per client address
    online: str = "master"
    pass_ttl_ms: int = 300_000
    heartbeat_ms: int = 300_000
    max_waiting_per_client: int = 20
    admit_url: str = ""
    upstream: str | None = None     # its calls go to a server of this upstream (url unused)
    path: str = ""                  # ... at this path
    next_upstream: frozenset = frozenset({"error", "timeout"})  # what fails a server, moves a call
    connect_timeout_ms: int = CONNECT_TIMEOUT_MS
    # origins ("https://shop.example", or "*") whose pages may enqueue, read and end its
    # tasks from the browser (CORS, protocol/fronts/http/cors.py); () none, as before
    allow_origins: tuple[str, ...] = ()
    # named groups (tenants) with live tasks it may have: a task of one more is a 429
    max_groups: int = 10_000
    # "client": a task enqueued without a group is in its client address's (task.py
    # client_net); "header:NAME": in the group that request header names; "": in none
    group_by: str = ""
    # each group's own limits (group_limits.py; 0: none): calls at once, and a rate of
    # `group_rate` calls per `group_per_s` seconds with its burst
    group_concurrency: int = 0
    group_rate: int = 0
    group_per_s: float = 1.0
    group_burst: int = 0
    # the mean hold (a call; online, a visit) waitTime uses until Recent has a measured
    # one (views.py; 0: none), and how long a finished task stays once read by its token
    # or the master key (store.read; None: as keepResult says)
    expected_duration_ms: int = 0
    keep_result_after_read_ms: int | None = None
    # nginx's proxy_next_upstream_tries and _timeout (core/upstreams/next.py; 0: none)
    next_upstream_tries: int = 0
    next_upstream_timeout_ms: int = 0
    # room events (room.py): when the line opens, as wall-clock seconds (None: it is
    # open; before it, visitors join a pre-line, drawn at the opening); `closed`: the
    # line fills and nobody is admitted; `max_waiting`: online tasks that may wait at
    # once, one more is a 429 line_full (0: no cap)
    opens_at: float | None = None
    closed: bool = False
    max_waiting: int = 0
    # a plain url's host (scheme, host, port), shared by every function under it, counted
    # as nginx counts a server (components/hosts.py): max_fails calls that could not
    # connect or timed out within fail_timeout shut it for fail_timeout, its tasks waiting
    # in place; 0: never counted, a refused call spends an attempt (as it always did)
    max_fails: int = 1
    fail_timeout_s: float = 10.0

    @property
    def interval(self) -> float:
        """GCRA's T: seconds between calls at the rate (0: no rate)."""
        return self.per_s / self.rate if self.rate else 0.0

    @property
    def group_interval(self) -> float:
        """T of each group's rate (0: none)."""
        return self.group_per_s / self.group_rate if self.group_rate else 0.0

    @property
    def group_header(self) -> str | None:
        """With group_by = "header:NAME": NAME in lower case (None: no header)."""
        return self.group_by[7:].lower() if self.group_by.startswith("header:") else None


#: the config's defaults, for a function tasks use that the config no longer names
DEFAULTS = FunctionSpec("", "")


class ApiPolicy(NamedTuple):
    """What a request without the master key may do (the config's [api] table)."""
    public_enqueue: bool = False    # enqueue, without options (the Cloud Queue's client enqueue)
    private_results: bool = False   # False: a task's id is enough to read it
    trust_forwarded: bool = False   # clientIp: the first X-Forwarded-For hop, not the peer
