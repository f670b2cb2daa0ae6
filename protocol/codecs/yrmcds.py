"""Sans-IO codec for the yrmcds counter protocol (yrmcds 1.1.9, byte-exact).

How it works. `receive_data(bytes)` appends to one bytearray; `next_event()` extracts
one frame from its front and returns a `Request`, a `Reject` (the exact error reply,
which the front sends as is), `TooLarge` (the front closes the connection), or
`NEED_DATA`. Sources: yrmcds' docs/counter.md
(https://github.com/cybozu/yrmcds/blob/master/docs/counter.md) and its src/counter/*.cpp.
Every frame is a 12-byte header plus `body_length` bytes (counter.md, "Request header"):

    request   0x90 | opcode | flags  | reserved | body length u32 | opaque (4 bytes)
    response  0x91 | opcode | status | 0        | body length u32 | opaque (copied)

Framing comes first and validation second, as in yrmcds' `request::parse` (counter.cpp): a
frame is extracted only once all `12 + body_length` bytes are buffered, and is then
consumed whole whatever is wrong with it, so no bad request can desync the stream.
Then, in yrmcds' order: a bad magic is 0x04 with the request's raw opcode byte
echoed; an unknown opcode is 0x81 with the response opcode 0x12 (yrmcds' internal
`Unknown`); a body too short for its opcode (or a zero name length, a zero Acquire
count, an Acquire maximum below its count) is 0x04. Flags, reserved and body bytes
beyond what the opcode reads are ignored. The opaque is kept as a big-endian u32, so
it goes back out byte for byte. Extraction only moves an offset; the consumed prefix
is cut once per `receive_data` call. A frame arriving one byte at a time therefore
parses exactly like one arriving whole (h11's `_receivebuffer`).

The bound (sockets.cpp, MAX_REQUEST_LENGTH): yrmcds drops a connection without a reply
once more than 30 MiB (MAX_REQUEST_LENGTH) stays unparsed after a recv. Here the
decision is taken from the header alone: a frame longer than 30 MiB in total gives
`TooLarge` as soon as its 12 header bytes are in, and the parser then holds nothing
and takes nothing more. Deliberate difference: yrmcds checks only after each recv of
up to 2 MiB, so whether it accepts a frame of 30-32 MiB depends on how the bytes
arrive (seen on 1.1.9: a 31 MiB Get sent at once was dropped; the same frame sent as
30 MiB, a pause, then 1 MiB got its reply). Here the answer depends only on the length.

A client's side comes last: requests built (`get_request`, ...) and reply frames cut from
a byte stream (`next_reply`), for zstalk.workers.CounterClient.

Replies are built by the functions near the bottom: one per opcode, `error_response`
from the one table of exact error bodies (`counter.cpp` STATUS_*), stats in yrmcds'
order (`response::stats`), dump as one frame per counter plus an empty terminator
(sockets.cpp `cmd_dump`; counter.md, "Dump").
"""
from __future__ import annotations

import struct
from enum import IntEnum
from typing import Iterable, Mapping, NamedTuple

__all__ = [
    "Opcode", "Status", "Request", "Reject", "TooLarge", "NEED_DATA", "Parser",
    "ERROR_BODIES", "STATS_NAMES", "HEADER_SIZE", "MAX_REQUEST_LENGTH",
    "response", "error_response", "noop_response", "get_response", "acquire_response",
    "release_response", "stats_response", "dump_record", "dump_end", "dump_response",
    "request", "get_request", "acquire_request", "release_request", "Reply", "next_reply",
    "stats_items",
]

HEADER_SIZE = 12
REQUEST_MAGIC = 0x90
RESPONSE_MAGIC = 0x91
MAX_REQUEST_LENGTH = 30 * 1024 * 1024    # yrmcds src/constants.hpp: 31457280 bytes
NAME_MAX = 65535                         # a u16 name length; 0 is invalid (counter.md)

HEADER = struct.Struct(">BBBBII")        # magic, opcode, flags|status, reserved, length, opaque
U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
ACQUIRE_FIXED = struct.Struct(">IIH")    # resources, maximum, name_len
RELEASE_FIXED = struct.Struct(">IH")     # resources, name_len
STAT_LENGTHS = struct.Struct(">HH")      # name_len, value_len
DUMP_FIXED = struct.Struct(">IIH")       # current, max_consumption, name_len


class Opcode(IntEnum):
    NOOP = 0x00
    GET = 0x01
    ACQUIRE = 0x02
    RELEASE = 0x03
    STATS = 0x10
    DUMP = 0x11
    UNKNOWN = 0x12       # never sent by clients: the opcode of an "Unknown command" reply


class Status(IntEnum):
    OK = 0x00
    NOT_FOUND = 0x01
    INVALID = 0x04
    RESOURCE_NOT_AVAILABLE = 0x21
    NOT_ACQUIRED = 0x22
    UNKNOWN_COMMAND = 0x81
    OUT_OF_MEMORY = 0x82  # defined by yrmcds, but no code path of its counter sends it


# Errors are data: each error status and its exact body (counter.cpp STATUS_*).
ERROR_BODIES: dict[int, bytes] = {
    Status.NOT_FOUND: b"Not found",
    Status.INVALID: b"Invalid arguments",
    Status.RESOURCE_NOT_AVAILABLE: b"Resource not available",
    Status.NOT_ACQUIRED: b"Not acquired",
    Status.UNKNOWN_COMMAND: b"Unknown command",
    Status.OUT_OF_MEMORY: b"OutOfMemory",
}

# The 15 stats items in the order yrmcds' `response::stats` writes them (counter.cpp).
STATS_NAMES = (
    "objects", "total_objects", "used_memory", "conflicts", "gc_count", "last_gc_elapsed",
    "total_gc_elapsed", "curr_connections", "total_connections", "command:noop",
    "command:get", "command:acquire", "command:release", "command:stats", "command:dump",
)
_STATS_RANK = {name: rank for rank, name in enumerate(STATS_NAMES)}


class Request(NamedTuple):
    opcode: int                    # an Opcode value
    opaque: int                    # the request's 4 opaque bytes as a big-endian u32
    name: bytes | None = None      # Get, Acquire, Release: 1-65535 binary bytes
    resources: int | None = None   # Acquire (>= 1), Release (may be 0)
    maximum: int | None = None     # Acquire: the capacity for this request (>= resources)


class Reject(NamedTuple):
    reply: bytes                   # the exact reply frame yrmcds sends


class TooLarge(NamedTuple):
    length: int                    # the frame's declared total length, header included


class _NeedData:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA = _NeedData()


# --- body readers (counter.cpp request::parse), one per opcode ---
# Each gets the opcode, opaque, buffer, body start and body length and returns the event.

def _invalid(opcode: int, opaque: int) -> Reject:
    return Reject(error_response(opcode, opaque, Status.INVALID))


def _read_no_body(opcode: int, opaque: int, buf: bytearray, start: int, length: int):
    return Request(opcode, opaque)         # Noop, Stats, Dump: any body is ignored


def _read_get(opcode: int, opaque: int, buf: bytearray, start: int, length: int):
    if length < 2:
        return _invalid(opcode, opaque)
    (name_len,) = U16.unpack_from(buf, start)
    if name_len == 0 or 2 + name_len > length:
        return _invalid(opcode, opaque)
    return Request(opcode, opaque, bytes(buf[start + 2:start + 2 + name_len]))


def _read_acquire(opcode: int, opaque: int, buf: bytearray, start: int, length: int):
    if length < 10:
        return _invalid(opcode, opaque)
    resources, maximum, name_len = ACQUIRE_FIXED.unpack_from(buf, start)
    if resources == 0 or maximum < resources or name_len == 0 or 10 + name_len > length:
        return _invalid(opcode, opaque)
    return Request(opcode, opaque, bytes(buf[start + 10:start + 10 + name_len]), resources, maximum)


def _read_release(opcode: int, opaque: int, buf: bytearray, start: int, length: int):
    if length < 6:
        return _invalid(opcode, opaque)
    resources, name_len = RELEASE_FIXED.unpack_from(buf, start)
    if name_len == 0 or 6 + name_len > length:
        return _invalid(opcode, opaque)
    return Request(opcode, opaque, bytes(buf[start + 6:start + 6 + name_len]), resources)


_READERS = {
    Opcode.NOOP: _read_no_body,
    Opcode.GET: _read_get,
    Opcode.ACQUIRE: _read_acquire,
    Opcode.RELEASE: _read_release,
    Opcode.STATS: _read_no_body,
    Opcode.DUMP: _read_no_body,
}


class Parser:
    def __init__(self, max_request_length: int = MAX_REQUEST_LENGTH) -> None:
        self.max_request_length = max_request_length
        self._buf = bytearray()
        self._pos = 0                          # start of the unparsed bytes in _buf
        self._too_large: TooLarge | None = None

    def receive_data(self, data: bytes) -> None:
        if self._too_large is not None:        # the connection is being closed
            return
        if self._pos:
            del self._buf[:self._pos]
            self._pos = 0
        self._buf += data

    def next_event(self) -> Request | Reject | TooLarge | object:
        if self._too_large is not None:
            return self._too_large
        buf, pos = self._buf, self._pos
        if len(buf) - pos < HEADER_SIZE:
            return NEED_DATA
        magic, opcode, _flags, _reserved, length, opaque = HEADER.unpack_from(buf, pos)
        if HEADER_SIZE + length > self.max_request_length:
            return self._refuse(HEADER_SIZE + length)
        start = pos + HEADER_SIZE
        if len(buf) < start + length:
            return NEED_DATA
        self._pos = start + length             # consumed whole, as request::parse does
        if magic != REQUEST_MAGIC:
            return _invalid(opcode, opaque)    # the raw opcode byte is echoed
        read = _READERS.get(opcode)
        if read is None:
            return Reject(error_response(Opcode.UNKNOWN, opaque, Status.UNKNOWN_COMMAND))
        return read(opcode, opaque, buf, start, length)

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def _refuse(self, length: int) -> TooLarge:
        self._too_large = TooLarge(length)
        self._buf = bytearray()
        self._pos = 0
        return self._too_large


# --- replies (counter.cpp response::*) ---

def response(opcode: int, opaque: int, status: int = Status.OK, body: bytes = b"") -> bytes:
    """One reply frame: the header yrmcds' `fill_header` writes, then `body`."""
    return HEADER.pack(RESPONSE_MAGIC, opcode, status, 0, len(body), opaque) + body


def error_response(opcode: int, opaque: int, status: int) -> bytes:
    """An error reply with its exact body from ERROR_BODIES (KeyError for OK)."""
    return response(opcode, opaque, status, ERROR_BODIES[status])


def noop_response(opaque: int) -> bytes:
    return response(Opcode.NOOP, opaque)


def get_response(opaque: int, consumption: int) -> bytes:
    return response(Opcode.GET, opaque, body=U32.pack(consumption))


def acquire_response(opaque: int, resources: int) -> bytes:
    """Success echoes the *requested* count, not the new total (sockets.cpp cmd_acquire)."""
    return response(Opcode.ACQUIRE, opaque, body=U32.pack(resources))


def release_response(opaque: int) -> bytes:
    return response(Opcode.RELEASE, opaque)


def _stat(name: str, value: int | str | bytes) -> bytes:
    raw_name = name.encode("ascii")
    if isinstance(value, int):
        raw_value = b"%d" % value              # decimal ASCII, as std::to_string
    elif isinstance(value, str):
        raw_value = value.encode("ascii")
    else:
        raw_value = bytes(value)
    return STAT_LENGTHS.pack(len(raw_name), len(raw_value)) + raw_name + raw_value


def stats_response(opaque: int, items: Mapping[str, int | str | bytes]
                   | Iterable[tuple[str, int | str | bytes]]) -> bytes:
    """Stats items as `name_len u16, value_len u16, name, value`, in STATS_NAMES order.

    Names outside STATS_NAMES follow, in the order given."""
    pairs = items.items() if isinstance(items, Mapping) else items
    ordered = sorted(pairs, key=lambda pair: _STATS_RANK.get(pair[0], len(STATS_NAMES)))
    return response(Opcode.STATS, opaque, body=b"".join(_stat(n, v) for n, v in ordered))


def dump_record(opaque: int, name: bytes, current: int, maximum: int) -> bytes:
    """One counter of a Dump: `current u32, max_consumption u32, name_len u16, name`."""
    return response(Opcode.DUMP, opaque, body=DUMP_FIXED.pack(current, maximum, len(name)) + name)


def dump_end(opaque: int) -> bytes:
    """The empty Dump frame that ends the series."""
    return response(Opcode.DUMP, opaque)


def dump_response(opaque: int, records: Iterable[tuple[bytes, int, int]]) -> bytes:
    """A whole Dump: one frame per `(name, current, maximum)`, then the terminator."""
    return b"".join([*(dump_record(opaque, *record) for record in records), dump_end(opaque)])


# --- the client's side: requests, and reply frames cut from a byte stream ---

def request(opcode: int, opaque: int, body: bytes = b"") -> bytes:
    """One request frame: magic 0x90, opcode, flags 0, reserved 0, body length, opaque."""
    return HEADER.pack(REQUEST_MAGIC, opcode, 0, 0, len(body), opaque) + body


def get_request(opaque: int, name: bytes) -> bytes:
    return request(Opcode.GET, opaque, U16.pack(len(name)) + name)


def acquire_request(opaque: int, name: bytes, resources: int, maximum: int) -> bytes:
    return request(Opcode.ACQUIRE, opaque, ACQUIRE_FIXED.pack(resources, maximum, len(name)) + name)


def release_request(opaque: int, name: bytes, resources: int) -> bytes:
    return request(Opcode.RELEASE, opaque, RELEASE_FIXED.pack(resources, len(name)) + name)


class Reply(NamedTuple):
    opcode: int
    status: int
    opaque: int
    body: bytes


def next_reply(buf: bytearray) -> Reply | None:
    """Cut one reply frame from the front of `buf` (None: not all of it is there yet)."""
    if len(buf) < HEADER_SIZE:
        return None
    magic, opcode, status, _, length, opaque = HEADER.unpack_from(buf)
    if magic != RESPONSE_MAGIC:
        raise ValueError(f"not a yrmcds counter reply (magic {magic:#x})")
    if len(buf) < HEADER_SIZE + length:
        return None
    body = bytes(buf[HEADER_SIZE:HEADER_SIZE + length])
    del buf[:HEADER_SIZE + length]
    return Reply(opcode, status, opaque, body)


def stats_items(body: bytes) -> dict[str, bytes]:
    """A Stats reply's body as name -> value."""
    items, pos = {}, 0
    while pos < len(body):
        name_len, value_len = STAT_LENGTHS.unpack_from(body, pos)
        pos += STAT_LENGTHS.size
        items[body[pos:pos + name_len].decode("ascii", "replace")] = body[
            pos + name_len:pos + name_len + value_len]
        pos += name_len + value_len
    return items
