"""Sans-IO parser for the beanstalkd text protocol (beanstalkd 1.13, byte-exact).

How it works. `receive_data(bytes)` appends to one bytearray; `next_event()` extracts
from its front and returns a `Command`, a `Reject` (an error reply the front sends as
is), or `NEED_DATA`. The parser is in one of four states, each a method that
`next_event` calls through `self._step` (kept unbound, so a parser holds no
reference cycle and is freed as soon as its connection drops it):

    _read_line   a command line: at most LINE_MAX (224) bytes ending in CRLF.
                 A `put` line moves to _read_body, or to _drain_body if too big.
    _read_body   exactly size+2 bytes: the job body and its CRLF trailer.
    _drain_body  throw size+2 bytes away, then reply JOB_TOO_BIG (prot.c, dispatch_cmd).
    _skip_line   an over-long line: throw bytes away until CRLF, then BAD_FORMAT
                 (prot.c, conn_process_io's STATE_WANT_ENDLINE).

Why this shape: a command or body that arrives one byte at a time parses exactly
like one that arrives whole, since every state waits until its whole unit is buffered
(h11's `_receivebuffer`). Memory stays bounded: a pending line never exceeds 223
bytes and the drain and skip states discard input as it comes, so the parser holds
at most one line plus one body beyond the chunk last handed to `receive_data`.
Extraction only moves an offset; the consumed prefix is cut once per
`receive_data` call, not per command.

Parsing follows beanstalkd's prot.c: `which_cmd` matches by prefix in a fixed
order, `read_u32`/`read_u64` skip spaces and want a digit, kick uses `strtoul`. A
dict keyed on the first word sends the common commands straight to their entry;
only unusual lines (`quitx`, `pause-tubedefault 0`, `reservex`) walk the prefix list.

Deliberate deviations from beanstalkd, both in its buffer handling, not its grammar:
  * beanstalkd looks for CRLF only inside 224-byte chunks, so a CRLF split across a
    chunk boundary (e.g. a 223-byte line plus CRLF) is missed and the next line is
    swallowed too. Here every over-long line gives one BAD_FORMAT, then parsing
    resumes with the next line.
  * beanstalkd takes the first CR in its buffer as the line end; a CR not followed
    by LF leaves the connection waiting until 224 bytes pile up, then discards them
    (1.12 observed: `use a\\r\\r\\n` gets no reply). Here the line ends at the first
    CRLF, and a line that contains a CR is BAD_FORMAT, like one that contains a NUL;
    an over-long line likewise ends at its first CRLF.
"""
import re
from typing import Callable, NamedTuple

__all__ = ["Command", "Reject", "NEED_DATA", "Parser", "REPLIES", "LINE_MAX"]

LINE_MAX = 224          # LINE_BUF_SIZE: the longest command line, CRLF included (dat.h)
NAME_MAX = 200          # tube name length (MAX_TUBE_NAME_LEN - 1)
U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
INT_MAX = 2**31 - 1     # reserve-with-timeout limit since 1.13 (#607)


class Command(NamedTuple):
    name: str                  # protocol spelling, e.g. 'put', 'reserve-with-timeout'
    args: tuple                # parsed arguments in protocol order (ints, str names)
    body: bytes | None = None  # put only: the job body without its CRLF


#: Command(name, args, body) without NamedTuple's Python-level __new__ (half the cost of
#: making one, paid by every command)
_command = tuple.__new__


class Reject(NamedTuple):
    reply: bytes               # the exact reply line
    counts: str | None = None  # the cmd-* stat beanstalkd still increments, if any
    consumes_id: bool = False  # EXPECTED_CRLF: the job id was allocated before the body


class _NeedData:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA = _NeedData()

# Errors are data: every reply the parser itself produces (prot.c MSG_*).
REPLIES = {
    "BAD_FORMAT": b"BAD_FORMAT\r\n",
    "UNKNOWN_COMMAND": b"UNKNOWN_COMMAND\r\n",
    "JOB_TOO_BIG": b"JOB_TOO_BIG\r\n",
    "EXPECTED_CRLF": b"EXPECTED_CRLF\r\n",
}
BAD_FORMAT = Reject(REPLIES["BAD_FORMAT"])
UNKNOWN_COMMAND = Reject(REPLIES["UNKNOWN_COMMAND"])
JOB_TOO_BIG = Reject(REPLIES["JOB_TOO_BIG"], counts="put")   # counted before the size check
EXPECTED_CRLF = Reject(REPLIES["EXPECTED_CRLF"], counts="put", consumes_id=True)
# put counts before its trailing-garbage check (verified on 1.12: cmd-put +1).
PUT_TRAILING_GARBAGE = Reject(REPLIES["BAD_FORMAT"], counts="put")
# pause-tube counts before it validates the name (prot.c, dispatch_cmd: op_ct, then is_valid_tube).
PAUSE_TUBE_BAD_NAME = Reject(REPLIES["BAD_FORMAT"], counts="pause-tube")


class Malformed(Exception):
    """An argument reader found a bad argument; `reject` is the reply to send."""

    def __init__(self, reject: Reject = BAD_FORMAT) -> None:
        super().__init__(reject.reply)
        self.reject = reject


# --- argument readers (prot.c read_u32 / read_u64 / read_tube_name / is_valid_tube) ---
# read_u*: skip spaces, then a digit must follow. Digits run greedily, so the next
# number needs at least one space before it. `fullmatch` is the NULL-end-pointer form.
_ONE_NUM = re.compile(rb" *([0-9]+)")
_PUT = re.compile(rb" *([0-9]+) +([0-9]+) +([0-9]+) +([0-9]+)(.*)", re.S)
_RELEASE = re.compile(rb" *([0-9]+) +([0-9]+) +([0-9]+)")
_BURY = re.compile(rb" *([0-9]+) +([0-9]+)")
_STRTOUL = re.compile(rb"[ \t\n\v\f\r]*([+-]?)([0-9]+)")    # strtoul, base 10
_NAME_CHARS = rb"A-Za-z0-9\-+/;.$_()"
_NAME = re.compile(rb"[A-Za-z0-9+/;.$_()][%s]{0,%d}" % (_NAME_CHARS, NAME_MAX - 1))
_PAUSE = re.compile(rb" *([%s]+) +([0-9]+)" % _NAME_CHARS)   # name chars include digits


def _u32(digits: bytes) -> int:
    value = int(digits)
    if value > U32_MAX:
        raise Malformed
    return value


def _u64(digits: bytes) -> int:
    value = int(digits)
    if value > U64_MAX:
        raise Malformed
    return value


def is_valid_tube(raw: bytes) -> bool:
    """beanstalkd's is_valid_tube: 1-200 NAME_CHARS, no leading '-'."""
    return _NAME.fullmatch(raw) is not None


def _name(raw: bytes) -> str:
    if not is_valid_tube(raw):
        raise Malformed
    return raw.decode("ascii")


def args_none(rest: bytes) -> tuple:
    if rest:                     # "don't allow trailing garbage": exact length only
        raise Malformed
    return ()


def args_any(rest: bytes) -> tuple:
    return ()                    # quit: anything after the prefix is ignored


def args_id(rest: bytes) -> tuple:
    digits = rest.lstrip(b" ")   # read_u64(..., NULL): the whole rest must be the number
    if not digits.isdigit():
        raise Malformed
    return (_u64(digits),)


def args_name(rest: bytes) -> tuple:
    return (_name(rest),)


def args_release(rest: bytes) -> tuple:
    m = _RELEASE.fullmatch(rest)
    if m is None:
        raise Malformed
    return (_u64(m[1]), _u32(m[2]), _u32(m[3]))


def args_bury(rest: bytes) -> tuple:
    m = _BURY.fullmatch(rest)
    if m is None:
        raise Malformed
    return (_u64(m[1]), _u32(m[2]))


def args_kick(rest: bytes) -> tuple:
    # strtoul into an unsigned int: whitespace and a sign allowed, trailing junk
    # ignored, ERANGE above ULONG_MAX, a negative value wraps, then truncates to 32 bits.
    m = _STRTOUL.match(rest)
    if m is None:
        raise Malformed
    value = int(m[2])
    if value > U64_MAX:
        raise Malformed
    if m[1] == b"-":
        value = -value % 2**64
    return (value & U32_MAX,)


def args_timeout(rest: bytes) -> tuple:
    m = _ONE_NUM.match(rest)     # read_u32 with an end pointer: trailing junk ignored
    if m is None:
        raise Malformed
    seconds = int(m[1])
    if seconds > INT_MAX:
        raise Malformed
    return (seconds,)


def args_pause(rest: bytes) -> tuple:
    m = _PAUSE.fullmatch(rest)   # read_tube_name, then read_duration(..., NULL)
    if m is None:
        raise Malformed
    delay = _u32(m[2])
    name = m[1]
    if len(name) > NAME_MAX or name[0] == 0x2D:   # '-': validated after counting
        raise Malformed(PAUSE_TUBE_BAD_NAME)
    return (name.decode("ascii"), delay)


#: numbers as put lines spell them, for the spellings clients repeat (a priority, a delay,
#: a ttr, a body size): a dict lookup costs half of isdigit() and int() on the bytes, and
#: a spelling found is known to be all digits.  Bounded: past _SPELLED_MAX new spellings
#: are not kept.
_SPELLED: dict[bytes, int] = {}
_SPELLED_MAX = 4096


def _spelled(parts: list[bytes]) -> tuple[int, int, int, int] | None:
    """The four numbers of `put N N N N` split at single spaces, a spelling not yet
    known; None unless each is all digits (then _PUT's rules apply: spaces, signs,
    trailing garbage)."""
    if not (parts[1].isdigit() and parts[2].isdigit() and parts[3].isdigit()
            and parts[4].isdigit()):
        return None
    numbers = int(parts[1]), int(parts[2]), int(parts[3]), int(parts[4])
    if len(_SPELLED) < _SPELLED_MAX:
        _SPELLED.update(zip(parts[1:], numbers))
    return numbers


class Entry(NamedTuple):
    prefix: bytes
    name: str
    read_args: Callable[[bytes], tuple] | None   # the rest after the prefix -> args; put: None


# which_cmd's prefixes in its order (prot.c); the first prefix that matches wins.
COMMANDS = tuple(Entry(*row) for row in (
    (b"put ", "put", None),
    (b"peek ", "peek", args_id),
    (b"peek-ready", "peek-ready", args_none),
    (b"peek-delayed", "peek-delayed", args_none),
    (b"peek-buried", "peek-buried", args_none),
    (b"reserve-with-timeout ", "reserve-with-timeout", args_timeout),
    (b"reserve-job ", "reserve-job", args_id),
    (b"reserve", "reserve", args_none),
    (b"delete ", "delete", args_id),
    (b"release ", "release", args_release),
    (b"bury ", "bury", args_bury),
    (b"kick ", "kick", args_kick),
    (b"kick-job ", "kick-job", args_id),
    (b"touch ", "touch", args_id),
    (b"stats-job ", "stats-job", args_id),
    (b"stats-tube ", "stats-tube", args_name),
    (b"stats", "stats", args_none),
    (b"use ", "use", args_name),
    (b"watch ", "watch", args_name),
    (b"ignore ", "ignore", args_name),
    (b"list-tubes-watched", "list-tubes-watched", args_none),
    (b"list-tube-used", "list-tube-used", args_none),
    (b"list-tubes", "list-tubes", args_none),
    (b"quit", "quit", args_any),
    (b"pause-tube", "pause-tube", args_pause),
))

# Fast path: the line's first word (with its space, if any) looked up directly. This
# agrees with the prefix walk because no prefix is a proper prefix of an earlier one's
# word (tests/codecs/test_beanstalk_parser.py checks the two against each other).
BY_WORD = {entry.prefix: entry for entry in COMMANDS}


def which_cmd(line: bytes) -> Entry | None:
    space = line.find(b" ")
    entry = BY_WORD.get(line[:space + 1] if space >= 0 else line)
    return entry if entry is not None else which_cmd_by_prefix(line)


def which_cmd_by_prefix(line: bytes) -> Entry | None:
    for entry in COMMANDS:
        if line.startswith(entry.prefix):
            return entry
    return None


class Parser:
    def __init__(self, max_job_size: int = 65535) -> None:
        self.max_job_size = max_job_size
        self._buf = bytearray()
        self._pos = 0             # start of the unparsed bytes in _buf
        self._step = Parser._read_line
        self._put_args: tuple = ()
        self._remaining = 0       # _read_body: body size; _drain_body: bytes to discard

    def receive_data(self, data: bytes) -> None:
        if self._pos:
            del self._buf[:self._pos]
            self._pos = 0
        self._buf += data

    def next_event(self) -> Command | Reject | object:
        return self._step(self)

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    # --- states ---

    def _read_line(self):
        buf, pos = self._buf, self._pos
        end = buf.find(b"\r\n", pos, pos + LINE_MAX)
        if end < 0:
            if len(buf) - pos >= LINE_MAX:      # no CRLF within 224 bytes: over-long
                self._step = Parser._skip_line
                return self._skip_line()
            return NEED_DATA
        self._pos = end + 2
        if buf.startswith(b"put ", pos):        # the hot path; "put " is which_cmd's first
            return self._put(bytes(buf[pos:end]))
        return self._command(bytes(buf[pos:end]))

    def _read_body(self):
        buf, start = self._buf, self._pos
        end = start + self._remaining
        if len(buf) < end + 2:
            return NEED_DATA
        self._pos = end + 2
        self._step = Parser._read_line
        if buf[end] != 13 or buf[end + 1] != 10:
            return EXPECTED_CRLF
        return _command(Command, ("put", self._put_args, bytes(buf[start:end])))

    def _drain_body(self):
        available = len(self._buf) - self._pos
        if available < self._remaining:
            self._remaining -= available
            self._buf.clear()
            self._pos = 0
            return NEED_DATA
        self._pos += self._remaining
        self._step = Parser._read_line
        return JOB_TOO_BIG

    def _skip_line(self):
        buf = self._buf
        end = buf.find(b"\r\n", self._pos)
        if end < 0:
            keep = 1 if buf.endswith(b"\r") else 0     # it may pair with the next LF
            del buf[:len(buf) - keep]
            self._pos = 0
            return NEED_DATA
        self._pos = end + 2
        self._step = Parser._read_line
        return BAD_FORMAT

    # --- one command line (CRLF stripped) ---

    def _command(self, line: bytes):
        if 0 in line or 13 in line:             # NUL or CR: prot.c "possible maliciousness"
            return BAD_FORMAT
        entry = which_cmd(line)
        if entry is None:
            return UNKNOWN_COMMAND
        try:
            return _command(Command, (entry.name, entry.read_args(line[len(entry.prefix):]), None))
        except Malformed as error:
            return error.reject

    def _put(self, line: bytes):
        parts = line.split(b" ")
        if len(parts) == 5:     # the everyday `put N N N N`: as _PUT, at a third of its cost
            known = _SPELLED.get
            pri, delay, ttr = known(parts[1]), known(parts[2]), known(parts[3])
            size = known(parts[4])
            if pri is None or delay is None or ttr is None or size is None:
                pri, delay, ttr, size = _spelled(parts) or (None, None, None, None)
            tail = b""
        if len(parts) != 5 or pri is None:
            m = _PUT.match(line, 4)
            if m is None:
                return BAD_FORMAT
            pri, delay, ttr, size, tail = m.groups()
            if tail and (0 in tail or 13 in tail):  # only the tail can hold NUL or CR
                return BAD_FORMAT
            pri, delay, ttr, size = int(pri), int(delay), int(ttr), int(size)
        if pri > U32_MAX or delay > U32_MAX or ttr > U32_MAX or size > U32_MAX:
            return BAD_FORMAT
        if size > self.max_job_size:            # checked before trailing garbage (prot.c)
            self._remaining = size + 2
            self._step = Parser._drain_body
            return self._drain_body()
        if tail:
            return PUT_TRAILING_GARBAGE
        self._put_args = (pri, delay, ttr or 1, size)
        self._remaining = size
        self._step = Parser._read_body
        return self._read_body()
