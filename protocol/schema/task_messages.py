"""The cloud-task family's messages as named types: an enqueue (T_ENQUEUE) and a call pushed
to a dispatcher (T_CALL's ext: `Call`); a call's outcome is outcome.py's, a task's info
task_info.py's.

Typed in memory only: on the wire each stays the msgpack array ops.py describes, so peers
of every schema version the broker takes keep working (messages.py upgrades an older
peer's op before anything here reads it).  Each type has one way out (`op`, `ext`) and one
way in (`read`, `of`), which checks a peer's fields once: the broker reads every enqueue
with `TaskEnqueue.read` whatever the link (an in-process front's op is the same tuple), and
the dispatcher reads every T_CALL's ext with `Call.of`.  A field of the wrong type is None
(`read`: the op is refused as malformed) or its default (`of`); an op with too few fields
raises, as any malformed op does (the broker answers it INTERNAL_ERROR).

The ext maps ("ext", version 4) carry optional fields by name, so a later version adds
one without a new schema version; a reader ignores names it does not know.
"""
from typing import Any, NamedTuple

from .ops import Op
from .tasks import CONNECT_TIMEOUT_MS
from .tokens import DIGEST_BYTES

#: an enqueuer's address as a front reports it (the longest an IPv6 text can be, and more)
MAX_CLIENT_CHARS = 64
#: a group header's value as a front sends it: one character more than a group may have,
#: so that one too long is still refused as such
MAX_GROUP_HEADER_CHARS = 65


class TaskEnqueue(NamedTuple):
    """T_ENQUEUE: (conn, function, params, options, unique_id, keyed, ext).  The ext says
    {"request": a request task's object (master key only; the broker checks it against
    its function), "type": "online" (a waiting-room task), "client": the address the
    front saw, "forwarded": the first X-Forwarded-For hop, "headers": {lower-case name:
    value} of the request headers Settings.group_headers names that it had,
    "token_sha256": the SHA-256 of the task's own token, which the front made and gave
    its client (tokens.py)}."""
    function: str
    params: bytes               # the JSON body the function is POSTed, as sent
    options: Any                # the API's options object, or None (the broker checks it)
    unique_id: str              # made by the front; options.uniqueId wins
    keyed: bool                 # the request had the master key (or none is configured)
    request: Any = None
    online: bool = False
    client: str | None = None
    forwarded: str | None = None
    headers: dict | None = None
    token_sha256: bytes | None = None

    def op(self, conn: int) -> tuple:
        """The wire form."""
        ext = {}
        if self.client is not None:
            ext["client"] = self.client
        if self.forwarded is not None:
            ext["forwarded"] = self.forwarded
        if self.request is not None:
            ext["request"] = self.request
        if self.online:
            ext["type"] = "online"
        if self.headers:
            ext["headers"] = self.headers
        if self.token_sha256 is not None:
            ext["token_sha256"] = self.token_sha256
        return (Op.T_ENQUEUE, conn, self.function, self.params, self.options,
                self.unique_id, self.keyed, ext or None)

    @classmethod
    def read(cls, op: tuple) -> "TaskEnqueue | None":
        """A peer's T_ENQUEUE, or None when its fields cannot be one."""
        _, _, function, params, options, uid, keyed, *ext = op
        if type(function) is not str or type(params) is not bytes or type(uid) is not str:
            return None
        said = ext[0] if ext and isinstance(ext[0], dict) else None
        if said is None:
            return cls(function, params, options, uid, keyed is True)
        return cls(function, params, options, uid, keyed is True, said.get("request"),
                   said.get("type") == "online", _address(said.get("client")),
                   _address(said.get("forwarded")), _headers(said.get("headers")),
                   digest(said.get("token_sha256")))


def digest(value: Any) -> bytes | None:
    """A token's SHA-256 as a peer sent it (anything else: None, no token)."""
    return value if type(value) is bytes and len(value) == DIGEST_BYTES else None


def _address(value: Any) -> str | None:
    return value if type(value) is str and 0 < len(value) <= MAX_CLIENT_CHARS else None


def _headers(value: Any) -> dict | None:
    """Group headers' values: text, each cut at MAX_GROUP_HEADER_CHARS (anything else: none)."""
    if not isinstance(value, dict):
        return None
    return {k: v[:MAX_GROUP_HEADER_CHARS] for k, v in value.items()
            if type(k) is str and type(v) is str} or None


class Call(NamedTuple):
    """What a call is beyond T_CALL's (unique_id, attempt, url, params, timeout_ms): its
    ext, None for a plain one (POST the params as JSON, keep no header but a binary
    result's Content-Type), else {"result_headers": [names to keep], and for a request
    task "method", "headers": [[name, value], ...], "connect_timeout_ms" when its
    function's is not the default, (schema 8) "move": n when the call is its
    attempt's nth move to another server of its upstream, which the outcome echoes, and
    (schema 8) "host": the Host, and the TLS server name, of a call whose url is an
    address its upstream resolved a name to (core/upstreams/spec.py `resolve`)}.  A
    dispatcher older than "host" ignores it and sends the address as Host: its calls
    reach the address, and a server that routes by Host may refuse them (upgrade the
    dispatchers before giving servers `resolve`); and (KEEPALIVE_SINCE) "pool":
    [upstream, keepalive, keepalive_timeout_ms, keepalive_requests] for a call on an
    upstream's server: the dispatcher's connection pool for that upstream, and its
    settings (nginx's keepalive directives)."""
    method: str = "POST"
    headers: tuple = ()             # a request task's, (name, value) pairs
    request: bool = False           # a request task: send method, URL and headers as given
    keep: tuple = ()                # response headers the task keeps (resultHeaders)
    connect_timeout_ms: int = CONNECT_TIMEOUT_MS    # the function's connect_timeout
    move: int = 0                   # (schema 8) its attempt's nth move to another server
    host: str | None = None         # (schema 8) the Host to send (None: the url's)
    pool: tuple | None = None       # (schema 8) (upstream, idle kept, idle ms, requests)

    def ext(self) -> dict | None:
        """The wire form (None: a plain call)."""
        connect = self.connect_timeout_ms if self.connect_timeout_ms != CONNECT_TIMEOUT_MS \
            else None
        if not self.request and not self.keep and connect is None and not self.move \
                and self.host is None and self.pool is None:
            return None
        out: dict[str, Any] = {"result_headers": list(self.keep)}
        if self.move:
            out["move"] = self.move
        if self.host is not None:
            out["host"] = self.host
        if self.pool is not None:
            out["pool"] = list(self.pool)
        if self.request:
            out["method"] = self.method
            out["headers"] = [list(h) for h in self.headers]
        if connect is not None:
            out["connect_timeout_ms"] = connect
        return out

    @classmethod
    def of(cls, ext: Any) -> "Call":
        """A T_CALL's ext as the dispatcher reads it (anything malformed: its default)."""
        if not isinstance(ext, dict):
            return PLAIN
        keep = tuple(h for h in ext.get("result_headers") or () if isinstance(h, str))
        connect = ext.get("connect_timeout_ms")
        connect = connect if type(connect) is int and connect > 0 else CONNECT_TIMEOUT_MS
        move = ext.get("move")
        move = move if type(move) is int and move > 0 else 0
        host = ext.get("host")
        host = host if isinstance(host, str) and host else None
        pool = _pool(ext.get("pool"))
        method = ext.get("method")
        if not isinstance(method, str):
            return cls(keep=keep, connect_timeout_ms=connect, move=move, host=host, pool=pool)
        headers = tuple((h[0], h[1]) for h in ext.get("headers") or ()
                        if isinstance(h, list) and len(h) == 2)
        return cls(method, headers, True, keep, connect, move, host, pool)


def _pool(value: Any) -> tuple | None:
    """A T_CALL's "pool" as (upstream, keepalive, keepalive_timeout_ms, keepalive_requests),
    or None (absent or malformed: the dispatcher's shared pool)."""
    if not isinstance(value, list) or len(value) != 4 or not isinstance(value[0], str):
        return None
    idle, timeout_ms, requests = value[1:]
    if not all(type(n) is int for n in (idle, timeout_ms, requests)) or idle < 0 \
            or timeout_ms < 1 or requests < 1:
        return None
    return tuple(value)


PLAIN = Call()
