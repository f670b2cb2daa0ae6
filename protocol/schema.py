"""The one module that owns every message exchanged between zstalk actors.

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
gave credit for), and a front
only sends ops for commands its clients sent, reading no further from a client whose
replies are not yet written out.

An op is `(opcode, conn, *args)`; `conn` is the front-local connection number, and a
session is identified by (front incarnation, conn).  Every op except the SILENT_OPS
gets exactly one reply, in order per connection; a pool's session also receives pushed
`R.JOB` messages between its replies (bounded by the credits it gave).  A reply is
`(conn, code, *values)` with codes from `R`; values are protocol-neutral (ints, bytes,
and for stats an ordered list of (key, value) pairs), and each front formats them for
its own protocol.

Ordering behind a waiting reserve: a front forwards a connection's commands as it parses
them, also past a `reserve` that may block.  While a session waits in reserve the broker
holds its later ops (the silent COUNT included; OPEN, CLOSE and HALF_CLOSE act at once)
and runs them in order once the reserve is answered or times out, so job ids, `cmd-*`
counters and replies are what beanstalkd gives a client whose later commands it reads only
after the reserve.  A connection has at most SESSION_OPS_MAX commands and
SESSION_BYTES_MAX job bytes in flight (sent and not yet answered, or answered and not yet
written): past either the front stops reading that client; the broker answers
INTERNAL_ERROR to a session's waiting reserve and everything held behind it when a front
sends more (a front with a bug must not grow the broker's memory).
"""
from __future__ import annotations

from typing import Any, NamedTuple

#: msgpack loads on the first encode or decode (`_codec`): a server whose fronts all share
#: its process, the default, never encodes a message and starts without it
msgpack = None

SCHEMA_VERSION = 5
#: a broker accepts peers this much older (a rolling update: the broker first, then the
#: rest); `decode_peer` upgrades what they send and `encode(msg, version)` speaks their
#: version back.  Version 4 had no CORS origins in Settings (its five first fields: a
#: peer builds Settings from every field it gets, so an older one is sent only those it
#: has).  Version 3 had no T_FUNCTIONS / T_FUNCTION, no `ext` in T_ENQUEUE,
#: T_CALL and T_OUTCOME (so no request tasks), and a T_OUTCOME's retry_after_ms was 0
#: when no Retry-After came (now -1).  Version 2 had no Stopping and Holding (a stopping
#: broker just went quiet).  Version 1 (before cloud-task durability) also had no `keyed`
#: in T_ENQUEUE / T_INFO, no `stopping` in T_SUBSCRIBE (0 slots meant it), a silent
#: T_OUTCOME, T_ERROR replies carrying the HTTP status, a one-field Settings and no
#: Settings message.
OLDEST_PEER_VERSION = 1


class SchemaError(Exception):
    """A message that does not follow this schema (wrong version, unknown kind, bad shape)."""


class Codes:
    """Named int constants (Op, R) as plain class attributes.  Every command reads
    several (the op it is, the reply it gets): looking up an IntEnum member costs 60 ns
    on CPython 3.11, a class attribute 19.  The codes are ints on the wire and in
    comparisons either way; `name(code)` and `codes()` give what the enum gave."""
    _names: dict[int, str] = {}

    def __init_subclass__(cls) -> None:
        cls._names = {v: k for k, v in vars(cls).items() if k.isupper() and type(v) is int}
        assert len(cls._names) == sum(1 for k in vars(cls) if k.isupper()), "a code twice"

    @classmethod
    def name(cls, code: int) -> str:
        """The code's name ("INSERTED"), or the number itself for an unknown one."""
        return cls._names.get(code, str(code))

    @classmethod
    def codes(cls) -> list[int]:
        return sorted(cls._names)


# ---------------------------------------------------------------------------------
# Ops: what a session asks of the broker.  Opcode values are part of the wire format.
class Op(Codes):
    OPEN = 1            # (conn)                      a client connected
    CLOSE = 2           # (conn)                      a client went away (or sent quit)
    COUNT = 3           # (conn, cmd, consumes_id)    a command the front rejected but beanstalkd counts
    HALF_CLOSE = 4      # (conn)                      client shut its write side (a waiting reserve times out)
    PUT = 10            # (conn, pri, delay_s, ttr_s, body)
    USE = 11            # (conn, tube)
    RESERVE = 12        # (conn, timeout_s)           timeout_s < 0: no timeout (plain `reserve`)
    RESERVE_JOB = 13    # (conn, id)
    DELETE = 14         # (conn, id)
    RELEASE = 15        # (conn, id, pri, delay_s)
    BURY = 16           # (conn, id, pri)
    TOUCH = 17          # (conn, id)
    WATCH = 18          # (conn, tube)
    IGNORE = 19         # (conn, tube)
    PEEK = 20           # (conn, id)
    PEEK_READY = 21     # (conn)
    PEEK_DELAYED = 22   # (conn)
    PEEK_BURIED = 23    # (conn)
    KICK = 24           # (conn, bound)
    KICK_JOB = 25       # (conn, id)
    STATS = 26          # (conn)
    STATS_JOB = 27      # (conn, id)
    STATS_TUBE = 28     # (conn, tube)
    LIST_TUBES = 29     # (conn)
    LIST_TUBE_USED = 30  # (conn)
    LIST_TUBES_WATCHED = 31  # (conn)
    PAUSE_TUBE = 32     # (conn, tube, delay_s)
    # native worker pools (kind "pool" fronts; see "Worker pools" below)
    SUBSCRIBE = 33      # (conn, [min_version, max_version], tubes, credits)
    CREDIT = 34         # (conn, n)                   n more jobs may be pushed (n < 0: fewer)
    # counters (yrmcds protocol); names are bytes, counts u32
    C_NOOP = 40         # (conn)
    C_GET = 41          # (conn, name)
    C_ACQUIRE = 42      # (conn, name, resources, maximum)
    C_RELEASE = 43      # (conn, name, resources)
    C_STATS = 44        # (conn)
    C_DUMP = 45         # (conn)
    # cloud tasks (kind "http" fronts and "dispatcher" pools; see "Cloud tasks" below)
    T_ENQUEUE = 50      # (conn, function, params: bytes, options: dict | None, unique_id, keyed, ext)
    T_INFO = 51         # (conn, unique_id, keyed)
    # keyed: the request carried the master key (or none is configured); the broker's
    # [api] policy decides what a request without it may do (public_enqueue, private_results)
    T_CANCEL = 52       # (conn, unique_id)
    T_SUBSCRIBE = 53    # (conn, slots, stopping)    the calls a dispatcher can take now
    T_OUTCOME = 54      # (conn, unique_id, attempt, kind, status_code, result, error, retry_after_ms, ext)
    # retry_after_ms: a 429 / 503's Retry-After, -1 when it sent none.  ext (version 4): a
    # map of optional fields, None for none, so later versions add fields to these ops
    # without a new schema version (a broker ignores keys it does not know)
    T_LIST = 55         # (conn, function | None, status | None, limit, after)  after: a cursor
    # cron schedules (broker/core/tasks/schedules.py), answered T_SCHEDULE / T_SCHEDULES / T_ERROR
    T_SCHEDULE = 56     # (conn, name, cron, timezone, function, params: bytes, options)
    T_SCHEDULES = 57    # (conn, after: a name, limit)
    T_SCHEDULE_INFO = 58    # (conn, name)
    T_UNSCHEDULE = 59   # (conn, name)
    T_SCHEDULE_PAUSE = 60   # (conn, name, paused: bool)
    # functions (version 4): their queues, limits and pauses, answered T_FUNCTIONS / T_FUNCTION
    T_FUNCTIONS = 61    # (conn, after: a name ('' from the start), limit)
    T_FUNCTION = 62     # (conn, name)
    # the waiting room (version 4): an admitted online task's user is through
    T_DONE = 63         # (conn, unique_id)  answered T_TASK or T_ERROR


#: per connection in flight (see "Ordering behind a waiting reserve" above); a put whose
#: body crosses the byte bound is still sent, so the broker allows one job beyond it
SESSION_OPS_MAX = 1024
SESSION_BYTES_MAX = 4 * 1024 * 1024

#: ops that produce no reply
SILENT_OPS = frozenset({Op.OPEN, Op.CLOSE, Op.COUNT, Op.HALF_CLOSE, Op.CREDIT, Op.T_SUBSCRIBE})


class R(Codes):
    """Reply codes.  Values are listed with each code."""
    INSERTED = 1        # (id)
    RESERVED = 3        # (id, body)
    FOUND = 4           # (id, body)
    DELETED = 5
    RELEASED = 6
    BURIED = 7
    TOUCHED = 8
    KICKED = 9          # (count) for kick; () for kick-job
    USING = 10          # (tube)
    WATCHING = 11       # (count)
    NOT_IGNORED = 12
    PAUSED = 13
    NOT_FOUND = 14
    TIMED_OUT = 15
    DEADLINE_SOON = 16
    DRAINING = 17
    OUT_OF_MEMORY = 18
    INTERNAL_ERROR = 19
    STATS = 20          # (pairs)  ordered [(key, value)], value int | bytes | bool | str
    LIST = 21           # (names)
    KICKED_JOB = 22
    JOB = 23            # (id, body, tube, pri, ttr_s, reserves)  pushed to a pool, not a reply
    SUBSCRIBED = 24     # (version)  the worker protocol version both sides speak
    BAD_VERSION = 25    # (min_version, max_version)  what this broker speaks; no subscription
    BAD_FORMAT = 26     # an op from a native peer with arguments beanstalkd would refuse
    JOB_TOO_BIG = 27    # a native PUT body over the broker's max job size
    C_OK = 30           # (value)  counter op succeeded; value: int, or None for no body
    C_ERROR = 31        # (status) a yrmcds status code (0x01 not found, 0x21, 0x22, ...)
    C_DUMP = 32         # (records)  [(name, current, max_in_interval)]
    T_TASK = 40         # (info)  a TaskInfo dict (an enqueue's: its 201 fields; times: wall s)
    T_ERROR = 41        # (code, message)  a refusal: a stable name (broker/core/tasks/store.py) and a sentence
    T_CALL = 42         # (unique_id, attempt, url, params, timeout_ms, ext)  pushed to a dispatcher
    # ext (version 4): None for a plain call (POST params as JSON), or {"result_headers":
    # [names to keep], and for a request task "method", "headers": [[name, value], ...]}
    # (broker/core/tasks/requests.py); a T_OUTCOME's ext may then hold {"headers": {...}}
    T_LIST = 43         # (infos, cursor)  a page of TaskInfos; cursor None: no more
    T_NOTED = 44        # (unique_id, attempt)  that T_OUTCOME was taken: it may be forgotten
    T_SCHEDULE = 45     # (info)  a schedule's info dict (times: wall-clock seconds)
    T_SCHEDULES = 46    # (infos, next)  a page of them by name; next None: no more
    T_FUNCTIONS = 47    # (infos, next)  a page of function stats by name; next None: no more
    T_FUNCTION = 48     # (info)  one function's stats (broker/core/tasks/views.py)


# ---------------------------------------------------------------------------------
# Envelopes: the messages themselves.
# ---------------------------------------------------------------------------------
# Worker pools: a native worker process is a front of kind "pool" with one session.
# It OPENs, then SUBSCRIBEs with the range of worker-protocol versions it speaks, its
# tubes and its credits (how many jobs it can take now).  The broker answers SUBSCRIBED
# with the highest version both speak (or BAD_VERSION), then pushes `R.JOB` messages,
# each spending one credit, in exactly the order `reserve` would hand the jobs out,
# interleaved round-robin with beanstalk clients blocked in reserve (a pool with
# credits left waits on its tubes like such a client).  Pushed jobs are reserved by the
# pool's session: it answers them with DELETE / RELEASE / BURY / TOUCH as any client,
# and gives credits back with CREDIT (silent) as its slots free up, usually in the
# same batch.  A SUBSCRIBE again replaces tubes and credits (credits 0: push nothing
# more, the graceful-shutdown step).  Heartbeats and re-registration after a broker
# restart are the fronts' (Hello/Welcome/SessionState).
#
# Cloud tasks: an HTTP front (kind "http") sends T_ENQUEUE / T_INFO / T_CANCEL, each
# answered T_TASK or T_ERROR (a T_ENQUEUE's T_TASK holds what the 201 shows: uniqueId,
# status, waitNum, waitTime; T_INFO's the whole TaskInfo); the unique id of a task
# enqueued without one is made by the front (the broker core has no randomness).  A
# dispatcher (kind "dispatcher") OPENs and T_SUBSCRIBEs with its free slots: the broker
# pushes `R.T_CALL` while it has some, and every T_OUTCOME (kind "success" | "failure" |
# "unknown" | "fatal" | "declined") frees one; T_SUBSCRIBE again sets the count (after a
# reconnect: the slots no running call will free; `stopping`: 0, and outcomes free none).
# broker/core/tasks/store.py says what the outcomes do.
# Each T_OUTCOME is answered T_NOTED: a dispatcher keeps a report until then and sends it
# again after losing the broker (a report on a call the broker no longer waits for is
# ignored).  Its SessionState lists, in `holds`, the calls ([unique_id, attempt]) it is
# making or has reports on, so a broker restarted with its binlog gives them back to it.
#: worker-protocol versions this code speaks (bump the max on an incompatible change)
WORKER_VERSIONS = (1, 1)


class Settings(NamedTuple):
    """Limits the broker owns and fronts enforce: sent in Welcome, and on their own to HTTP
    fronts and dispatchers when the broker reads its config again (SIGHUP)."""
    max_job_size: int = 65535
    max_body_bytes: int = 1 << 20       # an HTTP request body (the config's [api] max_body)
    max_result_bytes: int = 1 << 20     # a function's result ([functions] max_result)
    public_enqueue: bool = False        # the [api] policy (the broker decides; the front
    private_results: bool = False       # uses it to refuse early, before reading a body)
    # CORS (version 5; protocol/fronts/http_cors.py): function -> its allow_origins ("":
    # any other name under base_url; "*": any origin), and the origins a page may enqueue
    # from (those of the functions a request without the master key can enqueue to).
    # Built by the broker, never changed in place.
    allow_origins: dict = {}
    enqueue_origins: list = []


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


HEARTBEAT_S = 0.5
#: a peer silent this long is dead (heartbeats every HEARTBEAT_S; the issue asks for < 3 s)
PEER_TIMEOUT_S = 2.0

_KINDS: dict[type, int] = {Hello: 1, Welcome: 2, Batch: 3, Replies: 4, Heartbeat: 5, Fenced: 6,
                           Settings: 7, Stopping: 8, Holding: 9}
_CLASSES: dict[int, type] = {v: k for k, v in _KINDS.items()}

Message = Hello | Welcome | Batch | Replies | Heartbeat | Fenced | Settings | Stopping | Holding


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
    if code == Op.T_OUTCOME and n == 9:     # ... and 0 for "no Retry-After"
        retry_after = op[8]
        return (*op[:8], -1 if retry_after == 0 else retry_after, None)
    return op


#: the Settings fields of each older version (version 1 also had no Settings message)
_SETTINGS_FIELDS = {1: 1, 2: 5, 3: 5, 4: 5}


def _downgrade(msg: Message, version: int) -> Message | tuple | None:
    """A message as a peer of an older `version` takes it (None: it has none such; a
    Settings may come back as the plain tuple of the fields that version has)."""
    if isinstance(msg, (Stopping, Holding)) and version < 3:
        return None                     # version 2 and 1
    if isinstance(msg, Settings):
        return tuple(msg[:_SETTINGS_FIELDS[version]]) if version >= 2 else None
    if isinstance(msg, Welcome):
        return msg._replace(settings=tuple(msg.settings[:_SETTINGS_FIELDS[version]]))
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
