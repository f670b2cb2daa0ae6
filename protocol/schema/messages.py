"""The messages between zstalk actors, and the one place they are encoded and decoded.

Wire format: each ZeroMQ message is one msgpack array `[SCHEMA_VERSION, kind, *fields]`
where `kind` is the small integer of a message class below and `fields` are that
NamedTuple's fields in order.  Nothing else in zstalk calls msgpack: actors build
these typed messages and hand them to `encode`/`decode`.

Traffic shape (why batches): a front gathers every client command of one event-loop
turn into one `Batch` of ops, and the broker answers each batch it handled with one
`Replies`, so one ZeroMQ message carries hundreds of commands under load.

Flow control (no silent drops): the broker's ROUTER socket sets ROUTER_MANDATORY, so a
reply to a front that is no longer connected raises instead of vanishing; the broker
then declares that front dead (its sessions close) and fences it if it speaks again.
Send high-water marks are unlimited on both sides; what bounds the queues is credit:
the broker only ever sends replies to ops a front sent (plus heartbeats, and jobs a pool
gave credit for), and a front only sends ops for commands its clients sent, reading no further from a client whose
replies are not yet written out.

The ops inside a Batch and the replies inside Replies are zstalk.protocol.schema.ops's.
"""
from typing import Any, NamedTuple

from .ops import Op, R

#: msgpack loads on the first encode or decode (`_codec`): a server whose fronts all share
#: its process, the default, never encodes a message and starts without it
msgpack = None

SCHEMA_VERSION = 9
#: the version from which a dispatcher's failed call may move to the next server of its
#: upstream within its attempt: it reports whether the request may have been sent and
#: echoes the T_CALL's "move" (outcome.py, task_messages.Call); an older dispatcher says
#: neither, so the broker never moves its calls (broker/core/tasks/commands.py)
NEXT_UPSTREAM_SINCE = 8
#: the version from which a dispatcher takes R.T_ABORT (abort the call of a task cancelled
#: while it ran): an older one is sent none, and its call runs to its end (the broker
#: has cancelled the task all the same, and reads the late report only for
#: possiblyExecuted)
ABORT_SINCE = 8
#: the version from which an HTTP front sends an operator's ops (T_FUNCTION_PAUSE,
#: T_RETRY: docs/operations/operator.md): an older broker would answer them
#: INTERNAL_ERROR, so a front of this version must not reach one (it refuses us as too
#: new); an older front never sends them, and nothing of it changes
OPERATOR_SINCE = 8
#: the version from which a broker answers T_POSITIONS (the places of many tasks at once,
#: for the HTTP front's event streams).  Only a front sends it, and a front reaches no
#: older broker (such a broker refuses it as too new, and a front takes only its own
#: version from a broker), so a front of this version never has to fall back; a front of
#: an older version, on a newer broker in a rolling update, has no event streams (404)
#: and its users poll GET /v1/tasks/{id} as before.
POSITIONS_SINCE = 8
#: the version from which a dispatcher keeps a connection pool per upstream: a T_CALL on
#: an upstream's server says which, with its keep-alive settings (task_messages.Call
#: `pool`); an older dispatcher would ignore the ext key (a reader skips names it does
#: not know) and call through its one shared pool, so the broker sends it none
KEEPALIVE_SINCE = 8
#: the version from which Settings carry `rooms` (the waiting pages an HTTP front serves
#: at /room/{function}): a version-8 front is sent its nine fields and serves no page (404)
ROOMS_SINCE = 9
#: the version from which a broker answers V_PEEK (the dashboard's peek at a tube's next
#: ready, delayed and buried job: broker/core/views.py).  Only an HTTP front sends it, and
#: a front reaches no older broker (it refuses it as too new), so it never falls back
PEEK_SINCE = 9
#: the version from which a broker answers V_PEERS (the fronts, worker pools and
#: dispatchers it knows, for the dashboard), sent by an HTTP front as V_PEEK is
PEERS_SINCE = 9
#: the version from which a broker answers V_FUNCTIONS (functions searched by a part of
#: their name and sorted by activity across all of them), sent by an HTTP front as V_PEEK
FUNCTION_SEARCH_SINCE = 9
#: the version from which a dispatcher probes servers for the broker's active health
#: checks (R.T_CHECKS, answered with T_CHECKED per probe: broker/core/upstreams/health.py):
#: an older dispatcher is given no probes (the others probe every server)
HEALTH_CHECKS_SINCE = 8
#: a broker accepts peers this much older (a rolling update: the broker first, then the
#: rest); `decode_peer` upgrades what they send and `encode(msg, version)` speaks their
#: version back.  Version 8 had no rooms in Settings (its nine first fields, ROOMS_SINCE).
#: Version 7 had no next upstream (NEXT_UPSTREAM_SINCE), no R.T_ABORT (`_downgrade` leaves
#: it out of Replies), no operator's ops (OPERATOR_SINCE), no trust_forwarded in Settings
#: (its eight first fields), no T_POSITIONS and no keep-alive pools (KEEPALIVE_SINCE).
#: Version 6 (the
#: first with NotLeader) had no group_headers in Settings (its seven first fields), and
#: no task token: T_INFO and T_CANCEL end before their
#: `token` field (an older front sends none: the key decides, as it did), and a T_ENQUEUE
#: ext no "token_sha256".  The bump is for the other direction: a version-6 broker would
#: index past a trailing token and cancel a task on a token it never checked, so a
#: front that sends tokens must not reach one (it refuses us as too new).  Version 5 had
#: no NotLeader: a standby does not answer such a peer at
#: all (its link says Hello again until the instance it asks leads).  Version 4 had no
#: CORS origins in Settings (its five first fields: a peer builds Settings from every
#: field it gets, so an older one is sent only those it has).  Version 3 had no
#: T_FUNCTIONS / T_FUNCTION, no `ext` in T_ENQUEUE, T_CALL and T_OUTCOME (so no request
#: tasks), and a T_OUTCOME's retry_after_ms was 0 when no Retry-After came (now -1).
#: Version 2 had no Stopping and Holding (a stopping broker just went quiet).  Version 1
#: (before cloud-task durability) also had no `keyed` in T_ENQUEUE / T_INFO, no
#: `stopping` in T_SUBSCRIBE (0 slots meant it), a silent T_OUTCOME, T_ERROR replies
#: carrying the HTTP status, a one-field Settings and no Settings message.
OLDEST_PEER_VERSION = 1


class SchemaError(Exception):
    """A message that does not follow this schema (wrong version, unknown kind, bad shape)."""


class Settings(NamedTuple):
    """Limits the broker owns and fronts enforce: sent in Welcome, and on their own to HTTP
    fronts and dispatchers when the broker reads its config again (SIGHUP)."""
    max_job_size: int = 65535
    max_body_bytes: int = 1 << 20       # an HTTP request body (the config's [api] max_body)
    max_result_bytes: int = 1 << 20     # a function's result ([functions] max_result)
    public_enqueue: bool = False        # the [api] policy (the broker decides; the front
    private_results: bool = False       # uses it to refuse early, before reading a body)
    # CORS (version 5; protocol/fronts/http/cors.py): function -> its allow_origins ("":
    # any other name under base_url; "*": any origin), and the origins a page may enqueue
    # from (those of the functions a request without the master key can enqueue to).
    # Built by the broker, never changed in place.
    allow_origins: dict = {}
    enqueue_origins: list = []
    # (version 7) the request headers, lower case, some function's group_by names
    # ("header:NAME"): an HTTP front sends their values with an enqueue (TaskEnqueue)
    group_headers: list = []
    # (version 8) the [api] trust_forwarded policy: a client's address is the first
    # X-Forwarded-For hop, for the HTTP front's own per-address caps (its event streams)
    trust_forwarded: bool = False
    # (version 9) the waiting pages (protocol/fronts/http/page.py): each function the public
    # may join (online "public" or "only"; "" for any name under base_url) -> [its
    # room_template's HTML ("": the built-in page), its online_heartbeat in ms].  The
    # broker reads the templates (broker/config_file.py: room_pages), at start and on SIGHUP
    rooms: dict = {}


class SessionState(NamedTuple):
    """What a front knows of one session, re-registered after a broker restart."""
    conn: int
    use: str
    watch: list[str]
    held: list[int]     # ids of jobs the session holds reserved
    holds: list = []    # counter sessions: [(name, count)] this connection has acquired


class Hello(NamedTuple):
    """Front -> broker, first message of an incarnation (and after losing the broker)."""
    front_id: int               # the front's incarnation, random u64
    kind: str                   # 'beanstalk'
    pid: int
    state_id: int               # broker state the front last knew (0: none)
    sessions: list[SessionState]


class Welcome(NamedTuple):
    """Broker -> front, answer to Hello."""
    broker_id: int              # broker process incarnation
    state_id: int               # identity of the broker's state (survives restarts only with a binlog)
    settings: Settings
    restored: bool              # True: the sessions in Hello were re-registered; False: front must close them


class Batch(NamedTuple):
    """Front -> broker: the ops of one event-loop turn."""
    ops: list[tuple]


class Replies(NamedTuple):
    """Broker -> front: replies, each (conn, code, *values)."""
    items: list[tuple]


class Heartbeat(NamedTuple):
    """Both ways, every HEARTBEAT_S; carries the sender's incarnation."""
    sender_id: int


class Fenced(NamedTuple):
    """Broker -> front: "I do not know you".  From the broker incarnation the front
    registered with, it means that broker declared the front dead: close every client
    and start over under a new incarnation.  From another incarnation it means the
    broker restarted: say Hello again and re-register the sessions."""
    front_id: int
    broker_id: int


class Stopping(NamedTuple):
    """Broker -> front, when the broker stops on SIGTERM (a rolling update).  First, with
    `final` False: send no more ops, hold new commands for the next broker, and answer
    Holding; the replies to what was sent still come.  Then, with `final` True, after the
    last of them: this broker is gone, say Hello to the next one.  So a graceful restart
    fails no command: none is left unanswered, and none is sent to a broker that would
    drop it."""
    broker_id: int
    final: bool


class Holding(NamedTuple):
    """Front -> broker, the answer to Stopping(final=False): this incarnation sends no op
    after it until a Welcome, so every op it sent is already in the broker's hands."""
    front_id: int


class NotLeader(NamedTuple):
    """Broker -> front, a standby's answer to Hello (version 6; docs/ha.md): this instance
    does not lead the journal; the leader is reached at `leader`, its --advertise address,
    under `epoch`.  `leader` is "" while none is known (the lease lapsed, or nobody has
    claimed it yet): ask again shortly, or another endpoint.  A link goes there at once,
    not after a timeout."""
    leader: str
    epoch: int


HEARTBEAT_S = 0.5
#: a peer silent this long is dead (heartbeats every HEARTBEAT_S; the issue asks for < 3 s)
PEER_TIMEOUT_S = 2.0

_KINDS: dict[type, int] = {Hello: 1, Welcome: 2, Batch: 3, Replies: 4, Heartbeat: 5, Fenced: 6,
                           Settings: 7, Stopping: 8, Holding: 9, NotLeader: 10}
_CLASSES: dict[int, type] = {v: k for k, v in _KINDS.items()}

Message = (Hello | Welcome | Batch | Replies | Heartbeat | Fenced | Settings | Stopping | Holding
           | NotLeader)


def encode(msg: Message, version: int = SCHEMA_VERSION) -> bytes | None:
    """The message as `version` has it (None: that version has no such message)."""
    kind = _KINDS[type(msg)]
    if version != SCHEMA_VERSION:
        msg = _downgrade(msg, version)
        if msg is None:
            return None
    return (msgpack or _codec()).packb((version, kind, *msg), use_bin_type=True)


def encodable(value: Any) -> bool:
    """Whether `value` can travel in a message (ints within 64 bits, valid Unicode text):
    fronts check what clients gave them before it becomes an op, so one bad value cannot
    take a whole batch down with it."""
    try:
        (msgpack or _codec()).packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError, UnicodeEncodeError):
        return False
    return True


def _codec():
    global msgpack
    import msgpack as loaded
    msgpack = loaded
    return loaded


def decode(data: bytes) -> Message:
    """A message of this version (what fronts and clients take from their broker)."""
    version, msg = _decode(data, SCHEMA_VERSION)
    return msg


def decode_peer(data: bytes) -> tuple[int, Message]:
    """A message from a peer of this version or one OLDEST_PEER_VERSION allows (the
    broker's side), upgraded to this version; and the version it came in."""
    version, msg = _decode(data, OLDEST_PEER_VERSION)
    return version, (_upgrade(msg, version) if version < SCHEMA_VERSION else msg)


def _decode(data: bytes, oldest: int) -> tuple[int, Message]:
    try:
        version, kind, *fields = (msgpack or _codec()).unpackb(data, raw=False, use_list=True,
                                                               strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise SchemaError(f"undecodable message: {exc}") from None
    if type(version) is not int or version > SCHEMA_VERSION:
        raise SchemaError(f"schema version {version!r} is too new for this zstalk (it speaks "
                          f"{SCHEMA_VERSION}): update it (a broker first, then the rest)")
    if version < oldest:
        raise SchemaError(f"schema version {version} is too old for this zstalk (it speaks "
                          f"{SCHEMA_VERSION}, and takes {oldest} and later): update the peer")
    cls = _CLASSES.get(kind)
    if cls is None:
        raise SchemaError(f"unknown message kind {kind!r}")
    try:
        msg = cls(*fields)
    except TypeError as exc:
        raise SchemaError(f"bad {cls.__name__}: {exc}") from None
    return version, _nest(msg)


def _nest(msg: Any) -> Any:
    """Rebuild the nested NamedTuples msgpack flattened into arrays."""
    if isinstance(msg, Hello):
        return msg._replace(sessions=[SessionState(*s) for s in msg.sessions])
    if isinstance(msg, Welcome):
        return msg._replace(settings=Settings(*msg.settings))
    return msg


# -- older peers ------------------------------------------------------------------------
#: the HTTP status of each T_ERROR code (version 1 replies carried it; the HTTP front's
#: STATUS table is the one it answers with)
V1_ERROR_STATUS = {"bad_request": 400, "unauthorized": 401, "not_found": 404,
                   "unknown_function": 404, "duplicate": 409, "not_cancellable": 409,
                   "draining": 503, "out_of_memory": 503, "out_of_space": 503,
                   "unavailable": 503}


def _upgrade(msg: Message, version: int) -> Message:
    """A message of an older version as this version has it."""
    if isinstance(msg, Batch):
        return Batch([_upgrade_op(op, version) for op in msg.ops])
    return msg


def _upgrade_op(op, version: int):
    if not isinstance(op, (list, tuple)) or not op:
        return op
    code, n = op[0], len(op)
    if version == 1:
        if (code == Op.T_ENQUEUE and n == 6) or (code == Op.T_INFO and n == 3):
            op, n = (*op, True), n + 1      # a version-1 front checked the key itself
        elif code == Op.T_SUBSCRIBE and n == 3:
            return (*op, op[2] == 0)        # 0 slots meant stopping
    if code == Op.T_ENQUEUE and n == 7:
        return (*op, None)                  # no ext before version 4
    if (code == Op.T_INFO and n == 4) or (code == Op.T_CANCEL and n == 3):
        return (*op, None)                  # no task token before version 7
    if code == Op.T_OUTCOME and n == 9:     # ... and 0 for "no Retry-After"
        retry_after = op[8]
        return (*op[:8], -1 if retry_after == 0 else retry_after, None)
    return op


#: the Settings fields of each older version (version 1 also had no Settings message)
_SETTINGS_FIELDS = {1: 1, 2: 5, 3: 5, 4: 5, 5: 7, 6: 7, 7: 8, 8: 9}    # (9 on: all ten)


def _downgrade(msg: Message, version: int) -> Message | tuple | None:
    """A message as a peer of an older `version` takes it (None: it has none such; a
    Settings may come back as the plain tuple of the fields that version has)."""
    if isinstance(msg, NotLeader) and version < 6:
        return None                     # version 5 and older: a standby says nothing
    if isinstance(msg, (Stopping, Holding)) and version < 3:
        return None                     # version 2 and 1
    if isinstance(msg, Replies) and version < ABORT_SINCE:
        msg = Replies([item for item in msg.items if item[1] not in (R.T_ABORT, R.T_CHECKS)])
    fields = _SETTINGS_FIELDS.get(version)
    if isinstance(msg, Settings) and fields is not None:
        return tuple(msg[:fields]) if version >= 2 else None
    if isinstance(msg, Welcome) and fields is not None:
        return msg._replace(settings=tuple(msg.settings[:fields]))
    if version >= 4:
        return msg
    if isinstance(msg, Replies) and version >= 2:   # no ext in T_CALL before version 4
        return Replies([item[:7] if item[1] == R.T_CALL else item for item in msg.items])
    if version >= 2:
        return msg
    if isinstance(msg, Replies):
        items = [_downgrade_reply(item) for item in msg.items]
        return Replies([item for item in items if item is not None])
    return msg


def _downgrade_reply(item: tuple) -> tuple | None:
    if item[1] == R.T_CALL:
        return item[:7]
    if item[1] == R.T_NOTED:
        return None                     # its T_OUTCOME was silent
    if item[1] == R.T_ERROR:
        return (item[0], item[1], V1_ERROR_STATUS.get(item[2], 500), *item[2:])
    return item
