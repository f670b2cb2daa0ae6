"""The ops a session asks of the broker and the replies it gets: the codes, the limits of
a connection in flight, and what each family's ops mean.  Opcode and reply values are
part of the wire format (zstalk.protocol.schema.messages carries them).

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
    T_INFO = 51         # (conn, unique_id, keyed, token)
    # keyed: the request carried the master key (or none is configured); the broker's
    # [api] policy decides what a request without it may do (public_enqueue, private_results).
    # token (version 7): None, or the SHA-256 of the task token the request presented
    # (protocol/schema/tokens.py): then it reads, cancels or leaves that task only
    T_CANCEL = 52       # (conn, unique_id, token)  None: the front checked the master key
    T_SUBSCRIBE = 53    # (conn, slots, stopping)    the calls a dispatcher can take now
    T_OUTCOME = 54      # (conn, unique_id, attempt, kind, status_code, result, error, retry_after_ms, ext)
    # retry_after_ms: a 429 / 503's Retry-After, -1 when it sent none.  ext (version 4): a
    # map of optional fields, None for none, so later versions add fields to these ops
    # without a new schema version (a broker ignores keys it does not know)
    T_LIST = 55         # (conn, function | None, status | None, limit, after)  after: a cursor
    # cron schedules (broker/core/schedules/schedules.py), answered T_SCHEDULE / T_SCHEDULES / T_ERROR
    T_SCHEDULE = 56     # (conn, name, cron, timezone, function, params: bytes, options)
    T_SCHEDULES = 57    # (conn, after: a name, limit)
    T_SCHEDULE_INFO = 58    # (conn, name)
    T_UNSCHEDULE = 59   # (conn, name)
    T_SCHEDULE_PAUSE = 60   # (conn, name, paused: bool)
    # functions (version 4): their queues, limits and pauses, answered T_FUNCTIONS / T_FUNCTION
    T_FUNCTIONS = 61    # (conn, after: a name ('' from the start), limit)  (a front of
    # version 9 sends V_FUNCTIONS instead: an older front still sends this)
    T_FUNCTION = 62     # (conn, name)
    # the waiting room (version 4): an admitted online task's user is through
    T_DONE = 63         # (conn, unique_id)  answered T_TASK or T_ERROR
    # the waiting room, live (version 8, messages.POSITIONS_SINCE): the places of many tasks
    # at once, for an HTTP front's event streams (protocol/fronts/http/streams.py), each a
    # waiting user who looks (it keeps the place); at most MAX_POSITIONS ids
    T_POSITIONS = 64    # (conn, [unique_id, ...])  answered T_POSITIONS or T_ERROR
    # an operator's hand (version 8, OPERATOR_SINCE; the HTTP front checked the master key)
    T_FUNCTION_PAUSE = 70   # (conn, name, paused: bool)  answered T_FUNCTION or T_ERROR
    T_RETRY = 71        # (conn, unique_id)  a failed or cancelled task again: T_TASK or T_ERROR
    # the HTTP front's views of tubes, jobs and counters (version 8, OPERATOR_SINCE;
    # broker/core/views.py): no beanstalk `cmd-*` or counter command is counted for them;
    # each answered V_PAGE, V_INFO or T_ERROR
    V_TUBES = 72        # (conn, q: a substring, sort: "name" | "activity", after: a name, limit)
    V_TUBE = 73         # (conn, tube)
    V_KICK = 74         # (conn, tube, bound)
    V_PAUSE_TUBE = 75   # (conn, tube, seconds)
    V_JOB = 76          # (conn, id, with_body: bool)
    V_DELETE_JOB = 77   # (conn, id)
    V_COUNTERS = 78     # (conn)
    # the dashboard's peek (version 9, messages.PEEK_SINCE): a tube's next ready, delayed
    # and buried job, counting no `cmd-peek-*`; their bodies only if with_body (the front
    # checked the master key); answered V_INFO or T_ERROR
    V_PEEK = 90         # (conn, tube, with_body: bool)
    # the connected fronts, worker pools and dispatchers (version 9, messages.PEERS_SINCE):
    # each one's kind, sessions, credits or slots and last word; answered V_INFO
    V_PEERS = 91        # (conn)
    # functions searched and sorted across all of them (version 9, FUNCTION_SEARCH_SINCE;
    # broker/core/tasks/commands.py), the page of function stats T_FUNCTIONS gives by
    # name; answered V_PAGE (each as T_FUNCTION's info) or T_ERROR
    V_FUNCTIONS = 92    # (conn, q: a substring, sort: "name" | "activity", after: a name, limit)
    # active health checks (version 8, messages.HEALTH_CHECKS_SINCE): a dispatcher's
    # result of one probe of a server the broker gave it (R.T_CHECKS); silent
    T_CHECKED = 80      # (conn, upstream, url, ok: bool, error: str | None)


#: where an op's fields are (ops stay tuples: a put is built and read on the hot path).
#: Every op is (CODE, CONN, ...); ARG is the first argument each op lists above (a job id,
#: a tube, a bound, a timeout, a counter's or a task's name) and ARG2 the second (a
#: release's or a bury's priority, a pause's seconds); a put is (CODE, CONN, PUT_PRI,
#: PUT_DELAY, PUT_TTR, PUT_BODY)
CODE, CONN, ARG, ARG2 = 0, 1, 2, 3
PUT_PRI, PUT_DELAY, PUT_TTR, PUT_BODY = 2, 3, 4, 5


#: per connection in flight (see "Ordering behind a waiting reserve" above); a put whose
#: body crosses the byte bound is still sent, so the broker allows one job beyond it
SESSION_OPS_MAX = 1024
SESSION_BYTES_MAX = 4 * 1024 * 1024
#: task ids one T_POSITIONS may ask about: a front with more open streams sends several
#: (the broker's turn for one is ~5 us a task: 500 keep it to a few ms)
MAX_POSITIONS = 500

#: ops that produce no reply
SILENT_OPS = frozenset({Op.OPEN, Op.CLOSE, Op.COUNT, Op.HALF_CLOSE, Op.CREDIT, Op.T_SUBSCRIBE,
                        Op.T_CHECKED})


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
    # (broker/core/tasks/model/requests.py); a T_OUTCOME's ext may then hold {"headers": {...}}
    T_LIST = 43         # (infos, cursor)  a page of TaskInfos; cursor None: no more
    T_NOTED = 44        # (unique_id, attempt)  that T_OUTCOME was taken: it may be forgotten
    T_SCHEDULE = 45     # (info)  a schedule's info dict (times: wall-clock seconds)
    T_SCHEDULES = 46    # (infos, next)  a page of them by name; next None: no more
    T_FUNCTIONS = 47    # (infos, next)  a page of function stats by name; next None: no more
    T_FUNCTION = 48     # (info)  one function's stats (broker/core/tasks/views.py)
    T_ABORT = 49        # (unique_id, attempt)  pushed to a dispatcher (version 8): that
    # call's task was cancelled, abort it; its T_OUTCOME still comes (and frees the slot)
    V_PAGE = 50         # (infos, next)  a page of a view (tubes); next None: no more
    V_INFO = 51         # (info)  one view's dict (a tube, a job, the counters, a kick's count)
    T_POSITIONS = 52    # (places)  one per unique_id asked, in order: its place (a TaskInfo
    # without what is not about its place: task_info.position), or None: no such task
    T_CHECKS = 60       # (checks)  pushed to a dispatcher (version 8): every server it is
    # to probe now, replacing what it probed: [[upstream, url, path, interval_ms,
    # timeout_ms, [[lo, hi], ...] statuses that pass], ...] ([]: none)



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
# answered T_TASK or T_ERROR (a T_ENQUEUE's T_TASK holds what the 201 shows, made after
# the turn's hand-out: uniqueId, status, createdAt, waitNum, waitTime, or an admitted
# online task's passExpiresAt and admitUrl; T_INFO's the whole TaskInfo); the unique id of a task
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
# A running task cancelled (T_CANCEL) is cancelled at once, and its dispatcher, of
# version 8 or later, is pushed `R.T_ABORT`: it cancels the HTTP request (the host sees
# the connection close) and reports the call as usual, a report the broker only reads
# for possiblyExecuted (an older dispatcher is sent nothing: its call runs to its end).
#: worker-protocol versions this code speaks (bump the max on an incompatible change)
WORKER_VERSIONS = (1, 1)
