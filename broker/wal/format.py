"""The bytes of zstalk's binlog: segment headers, checksummed frames, job records, replay.

Sans-IO: this module turns records into bytes and bytes back into the jobs they
describe; `binlog.py` owns the files, space, fsync and compaction.

A segment file `zstalk.NNNNNNNN.wal` is:

    header   <8s I Q Q Q I>  magic, FORMAT, state_id, next_id, seq, crc32 of the fields
    frame*   <I I> length, crc32(payload), then `length` bytes of records
    zeros    the preallocated rest (a frame length of 0 ends the segment)

One frame is one write of the broker (a batch, split where it crosses into a new
segment), so a checksum costs 8 bytes per batch and a torn write is caught as a frame
whose length or checksum does not hold: reading stops there.

Records (little-endian, fixed layout):
  * JOB    the whole job: put, and compaction's copy of a live job into a newer segment.
           A later JOB for the same id replaces everything known about it.
  * UPDATE state, priority, delay, order key and counters of a job already logged
           (bury, kick, release with a delay: what beanstalkd's prot.c logs).
  * DELETE the job is gone.
`key` is the job's place in its state: the absolute wall-clock due time when DELAYED,
the bury sequence number when BURIED (so bury order survives compaction), 0 when READY.
A reserved job is logged as READY: reservations are never durable (beanstalkd logs no
reserve, and its prot_replay re-queues a Reserved record as ready).  Format 3 adds one
exception: a broker stopping gracefully logs an UPDATE with state S_RESERVED for each job
a client holds, and replay keeps such a job from other clients for a few seconds, so its
holder's front can take it back when it re-registers (a rolling restart); a crash logs
none, as before.

Format 2 adds cloud tasks (tasks.py), whose priorities are signed 64-bit and whose state is
richer than a job's, as msgpack lists after a `<BI` kind and length:
  * TASK       the whole task (enqueue, a success with its result, compaction's copy):
               TASK_FIELDS, then the result.  Replaces everything known about the uid.
  * TASK_STATE the mutable fields (start, retry, failure, cancel): uid, then TASK_STATE_FIELDS.
  * TASK_GONE  the task was forgotten (keepResult passed): uid.
  * SCHEDULE   a whole cron schedule (made, paused or resumed, fired): SCHEDULE_FIELDS.
  * SCHEDULE_GONE  the schedule was deleted: its name.
Times in them are wall-clock seconds (floats; None where they do not apply).  A format-1
segment has no task records and is read as it always was.

Format 4 (segments written now) appends to a TASK record, after its result, a map of
optional fields (TASK_OPTIONAL: `level`, `queue_deadline` as wall-clock seconds, a
request task's `request` as [method, path, query, [[header, value], ...]], a
result's `result_headers` as a map, and for upstreams the task's `balance_key` and its
enqueuer's `client_ip`; a task's `group`, its tenant, when it has one; `token_sha256`,
the SHA-256 of the task's own token, never the token; `possibly_executed`, true once a
cancelled task's aborted call may have run): a
reader takes the keys it knows and ignores the others, and a record without the map
(formats 2 and 3) has their defaults, so later versions add task fields without a new
format.  A reader of format 3 or older refuses a format-4 segment by name, as any reader
refuses a newer format.

Format 5 adds two record kinds:
  * ROOM_DRAW  a room event's draw (core/tasks/components/room.py): ROOM_DRAW_FIELDS,
               the function, its opening (wall-clock seconds) and the seed, an unsigned
               64-bit integer.  A later one for the same function replaces it; there is
               no GONE (each function's latest is kept for good, and pins its segment).
  * FUNCTION_STATE  an operator's pause of a function (PATCH /v1/functions/{name}):
                    [name, paused]: paused true pins its segment (compaction copies it
                    forward while the function stays paused, as a schedule's record);
                    false ends it, like a GONE.  Replay keeps the names still paused.
A format-5 reader reads formats 1 to 4 as they were (neither record is in them); a reader
of format 4 or older refuses a format-5 segment by name.
"""
from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

#: msgpack loads with the first task or schedule record (`_codec`): a beanstalk-only
#: server never needs it
msgpack = None

MAGIC = b"ZSTALKWL"
FORMAT = 5
READS = (1, 2, 3, 4, 5)     # formats this zstalk replays
HEADER = struct.Struct("<8sIQQQ")
HEADER_SIZE = HEADER.size + 4
FRAME = struct.Struct("<II")
MAX_FRAME = 1 << 31

JOB, UPDATE, DELETE = 1, 2, 3
TASK, TASK_STATE, TASK_GONE = 4, 5, 6
SCHEDULE, SCHEDULE_GONE = 7, 8
ROOM_DRAW = 9
FUNCTION_STATE = 10
#: state codes on disk
S_READY, S_DELAYED, S_BURIED, S_RESERVED = 1, 2, 3, 4
_JOB = struct.Struct("<BQIIIddB5IHI")      # ... tube_len, body_len; then tube, body
_UPDATE = struct.Struct("<BQBIId5I")
_DELETE = struct.Struct("<BQ")
DELETE_SIZE = _DELETE.size
UPDATE_SIZE = _UPDATE.size
JOB_FIXED_SIZE = _JOB.size
_TASK = struct.Struct("<BI")                # kind, msgpack length
#: a TASK record's list, then its result (bytes or None); the fields from `status` on are
#: TASK_STATE's (after its uid), so a TASK_STATE replaces TASK[T_STATUS:T_RESULT]
TASK_FIELDS = ("uid", "function", "params", "priority", "seq", "attempts", "backoff",
               "timeout_ms", "delivery", "keep_result_ms", "created",
               "status", "attempt", "started", "finished", "due", "expires", "status_code",
               "error")
T_UID, T_SEQ, T_STATUS = 0, 4, 11
T_RESULT = len(TASK_FIELDS)
T_OPTIONAL = T_RESULT + 1       # format 4: the map of optional fields, after the result
#: the keys this zstalk writes and reads
TASK_OPTIONAL = ("level", "queue_deadline", "request", "result_headers", "balance_key",
                 "client_ip", "online", "pass_exp", "ended_by", "group", "token_sha256",
                 "possibly_executed")
ROOM_DRAW_FIELDS = ("function", "opens_at", "seed")
SCHEDULE_FIELDS = ("name", "cron", "timezone", "function", "params", "options", "paused",
                   "next_fire", "last_fire", "last_error", "created")


class Image(NamedTuple):
    """A job as the binlog knows it (wall-clock times; no reservation)."""
    id: int
    tube: str
    pri: int
    delay_s: int
    ttr_s: int
    created_wall: float
    state: int
    key: float
    counts: tuple
    body: bytes
    seg: int = 0            # the segment holding its latest JOB record


class Header(NamedTuple):
    state_id: int
    next_id: int
    seq: int


class Replayed(NamedTuple):
    jobs: dict            # id -> (rec, tube, body, seq) of each live job: see `image`
    next_id: int
    state_id: int
    warnings: list
    tasks: dict = {}      # uid -> (TASK list with its result, seq) of each live task
    schedules: dict = {}  # name -> (SCHEDULE list, seq) of each live schedule
    gates: dict = {}      # function -> the wall-clock TAT of its slow rate (GATES_NAME)
    draws: dict = {}      # function -> (ROOM_DRAW list, seq): its latest draw
    functions: dict = {}  # name -> seq of the FUNCTION_STATE that paused it (still paused)


# -- encoding ------------------------------------------------------------------------
def encode_header(h: Header) -> bytes:
    fields = HEADER.pack(MAGIC, FORMAT, h.state_id, h.next_id, h.seq)
    return fields + struct.pack("<I", zlib.crc32(fields))


def encode_job(i: Image) -> bytes:
    tube = i.tube.encode()
    return _JOB.pack(JOB, i.id, i.pri, i.delay_s, i.ttr_s, i.created_wall, i.key, i.state,
                     *i.counts, len(tube), len(i.body)) + tube + i.body


def encode_new_job(job_id: int, tube: bytes, pri: int, delay_s: int, ttr_s: int,
                   created_wall: float, due_wall: float, body: bytes) -> bytes:
    """A JOB record for a job just put (the put path: no Image, no counters yet)."""
    state = S_DELAYED if due_wall else S_READY
    return _JOB.pack(JOB, job_id, pri, delay_s, ttr_s, created_wall, due_wall, state,
                     0, 0, 0, 0, 0, len(tube), len(body)) + tube + body


def job_record_size(tube: str, body_len: int) -> int:
    return JOB_FIXED_SIZE + len(tube.encode()) + body_len


def encode_update(job_id: int, state: int, pri: int, delay_s: int, key: float, counts) -> bytes:
    return _UPDATE.pack(UPDATE, job_id, state, pri, delay_s, key, *counts)


def encode_delete(job_id: int) -> bytes:
    return _DELETE.pack(DELETE, job_id)


def encode_task(fields: list) -> bytes:
    """A TASK record: TASK_FIELDS' values and the result, in that order."""
    return _packed(TASK, fields)


def encode_task_state(uid: str, state: list) -> bytes:
    return _packed(TASK_STATE, [uid, *state])


def encode_task_gone(uid: str) -> bytes:
    return _packed(TASK_GONE, [uid])


def encode_schedule(fields: list) -> bytes:
    return _packed(SCHEDULE, fields)


def encode_schedule_gone(name: str) -> bytes:
    return _packed(SCHEDULE_GONE, [name])


def encode_room_draw(fields: list) -> bytes:
    """A ROOM_DRAW record: ROOM_DRAW_FIELDS' values."""
    return _packed(ROOM_DRAW, fields)


def encode_function_state(name: str, paused: bool) -> bytes:
    return _packed(FUNCTION_STATE, [name, paused])


def _packed(kind: int, fields: list) -> bytes:
    payload = (msgpack or _codec()).packb(fields, use_bin_type=True)
    return _TASK.pack(kind, len(payload)) + payload


def _codec():
    global msgpack
    import msgpack as loaded
    msgpack = loaded
    return loaded


def encode_frame(payload: bytes) -> bytes:
    return FRAME.pack(len(payload), zlib.crc32(payload)) + payload


# -- decoding ------------------------------------------------------------------------
class BadSegment(Exception):
    """Not a zstalk segment, or a header that does not check."""


def decode_header(data: bytes) -> Header:
    if len(data) < HEADER_SIZE:
        raise BadSegment("short header")
    magic, fmt, state_id, next_id, seq = HEADER.unpack_from(data)
    (crc,) = struct.unpack_from("<I", data, HEADER.size)
    if magic != MAGIC:
        raise BadSegment("not a zstalk binlog segment")
    if crc != zlib.crc32(data[:HEADER.size]):
        raise BadSegment("header checksum mismatch")
    if fmt not in READS:
        raise BadSegment(f"binlog format {fmt}, this zstalk reads formats "
                         f"{', '.join(map(str, READS))}")
    return Header(state_id, next_id, seq)


def scan(data: bytes, start: int = HEADER_SIZE) -> tuple[list, int, str]:
    """The (start, end) of every good frame's payload, the offset where good data ends,
    and why reading stopped early ("" at a clean end: end of file or the zero tail)."""
    spans = []
    pos = start
    crc32, unpack = zlib.crc32, FRAME.unpack_from
    view = memoryview(data)
    while pos + FRAME.size <= len(data):
        length, crc = unpack(data, pos)
        if length == 0:
            break
        end = pos + FRAME.size + length
        if end > len(data) or length > MAX_FRAME:
            return spans, pos, f"frame at {pos} runs past the end of the file"
        if crc32(view[pos + FRAME.size:end]) != crc:
            return spans, pos, f"frame at {pos} fails its checksum"
        spans.append((pos + FRAME.size, end))
        pos = end
    return spans, pos, ""


# A replayed job is kept as `(rec, tube, body, seq)`: `rec` the JOB struct's fields as
# unpacked (indexes below), `seq` the segment of its latest JOB record.  Recovering a
# million jobs is dominated by per-record work, so replay builds no other object.
R_ID, R_PRI, R_DELAY, R_TTR, R_CREATED, R_KEY, R_STATE = range(1, 8)
R_COUNTS = slice(8, 13)


def image(live: tuple) -> Image:
    rec, tube, body, seq = live
    return Image(rec[R_ID], tube, rec[R_PRI], rec[R_DELAY], rec[R_TTR], rec[R_CREATED],
                 rec[R_STATE], rec[R_KEY], rec[R_COUNTS], body, seq)


def apply_records(data: bytes, pos: int, end: int, seq: int, jobs: dict, job_ids: list,
                  tubes: dict, tasks: dict | None = None, task_uids: list | None = None,
                  schedules: dict | None = None, names: list | None = None,
                  draws: dict | None = None, functions: dict | None = None) -> int:
    """Apply the records in data[pos:end] (one frame) to `jobs` (id -> live tuple, see
    above), `tasks` (uid -> (TASK list, seq)), `schedules` (name -> (SCHEDULE list,
    seq)), `draws` (function -> (ROOM_DRAW list, seq)) and `functions` (name -> seq of
    the record that paused it, while paused); returns the largest job id seen in a JOB
    record.  The uids of TASK records go to `task_uids` and the names of SCHEDULE records
    to `names`, as job ids go to `job_ids`."""
    top = 0
    unpack_job, unpack_update, unpack_delete = _JOB.unpack_from, _UPDATE.unpack_from, _DELETE.unpack_from
    append = job_ids.append
    while pos < end:
        kind = data[pos]
        if kind == JOB:
            rec = unpack_job(data, pos)
            pos += JOB_FIXED_SIZE
            tlen = rec[13]
            raw = data[pos:pos + tlen]
            tube = tubes.get(raw)
            if tube is None:
                tube = tubes[raw] = raw.decode()
            pos += tlen
            jid = rec[1]
            jobs[jid] = (rec, tube, data[pos:pos + rec[14]], seq)
            pos += rec[14]
            append(jid)
            if jid > top:
                top = jid
        elif kind == UPDATE:
            _, jid, state, pri, delay_s, key, *counts = unpack_update(data, pos)
            pos += UPDATE_SIZE
            old = jobs.get(jid)
            if old is not None:
                r = old[0]
                rec = (JOB, jid, pri, delay_s, r[4], r[5], key, state, *counts, r[13], r[14])
                jobs[jid] = (rec, old[1], old[2], old[3])
        elif kind == DELETE:
            jobs.pop(unpack_delete(data, pos)[1], None)
            pos += DELETE_SIZE
        elif TASK <= kind <= TASK_GONE and tasks is not None:
            pos = _apply_task(data, pos, kind, seq, tasks, task_uids)
        elif SCHEDULE <= kind <= SCHEDULE_GONE and schedules is not None:
            pos = _apply_schedule(data, pos, kind, seq, schedules, names)
        elif kind == ROOM_DRAW and draws is not None:
            fields, pos = _unpack_list(data, pos)
            if (len(fields) != len(ROOM_DRAW_FIELDS) or type(fields[0]) is not str
                    or type(fields[2]) is not int):
                raise BadSegment(f"room draw record with fields {fields!r}")
            draws[fields[0]] = (fields, seq)
        elif kind == FUNCTION_STATE and functions is not None:
            pos = _apply_function(data, pos, seq, functions)
        else:
            raise BadSegment(f"unknown record type {kind} at {pos}")
    return top


def _unpack_list(data: bytes, pos: int) -> tuple[list, int]:
    """A msgpack record's list, and where the next record starts."""
    _, length = _TASK.unpack_from(data, pos)
    pos += _TASK.size
    if pos + length > len(data):
        raise BadSegment(f"record at {pos} runs past its frame")
    try:
        fields = (msgpack or _codec()).unpackb(data[pos:pos + length], raw=False)
    except Exception as exc:    # msgpack raises several unrelated types
        raise BadSegment(f"record at {pos}: {exc}") from None
    if not isinstance(fields, list) or not fields:
        raise BadSegment(f"record at {pos} is not a list")
    return fields, pos + length


def _apply_schedule(data: bytes, pos: int, kind: int, seq: int, schedules: dict,
                    names: list) -> int:
    fields, pos = _unpack_list(data, pos)
    if kind == SCHEDULE:
        if len(fields) != len(SCHEDULE_FIELDS):
            raise BadSegment(f"schedule record with {len(fields)} fields")
        schedules[fields[0]] = (fields, seq)
        names.append(fields[0])
    else:
        schedules.pop(fields[0], None)
    return pos


def _apply_function(data: bytes, pos: int, seq: int, functions: dict) -> int:
    fields, pos = _unpack_list(data, pos)
    if len(fields) != 2 or type(fields[0]) is not str or type(fields[1]) is not bool:
        raise BadSegment(f"function record at {pos} is not [name, paused]")
    if fields[1]:
        functions[fields[0]] = seq
    else:
        functions.pop(fields[0], None)
    return pos


def _apply_task(data: bytes, pos: int, kind: int, seq: int, tasks: dict, uids: list) -> int:
    fields, pos = _unpack_list(data, pos)
    uid = fields[0]
    if kind == TASK:
        if len(fields) not in (T_OPTIONAL, T_OPTIONAL + 1) or (
                len(fields) > T_OPTIONAL and not isinstance(fields[T_OPTIONAL], dict)):
            raise BadSegment(f"task record with {len(fields)} fields")
        tasks[uid] = (fields, seq)
        uids.append(uid)
    elif kind == TASK_STATE:
        old = tasks.get(uid)
        if old is not None:
            full = old[0]
            tasks[uid] = ([*full[:T_STATUS], *fields[1:], *full[T_RESULT:]], old[1])
    else:
        tasks.pop(uid, None)
    return pos
