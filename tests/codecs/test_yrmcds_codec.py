"""Tests for zstalk.protocol.codecs.yrmcds, the sans-IO yrmcds counter codec.

Every frame type and every parse error of yrmcds (docs/counter.md, counter.cpp's
request::parse, and the cases of its test/counter_request.cpp) is run three ways:
whole, one byte at a time, and followed by more data (a whole frame, and a partial
header that must stay buffered). Then pipelining, the skip-by-declared-length rule,
the 30 MiB bound (from headers that declare a huge length, not 30 MiB buffers), the
reply builders, and Hypothesis: arbitrary bytes never raise, any chunking gives the
same events, and every complete frame gives exactly one event.

The expected error replies below are the exact bytes the real yrmcds 1.1.9 (Debian
1.1.9-1+b2, /usr/sbin/yrmcdsd, virtual_ip 127.0.0.1, bind_ip 127.0.0.2) sent back when
each request frame here was sent to it on its own connection with opaque b"OPQ1"
(0x4f505131); the same for the pipelined stream, the stats and dump replies, and the
Acquire/Release replies with opaques 1..5. That server also confirmed: a 65535-byte
name is accepted; a 30 MiB frame gets a reply; a 31 MiB frame sent at once gets none
(closed, "denied too large request of 32245553 bytes"), yet the same frame sent as
30 MiB, a pause, then 1 MiB got its reply, so yrmcds' bound depends on how the bytes
arrive. This codec decides from the declared length alone (see the module comment).
"""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings, strategies as st

from zstalk.protocol.codecs.yrmcds import (ERROR_BODIES, MAX_REQUEST_LENGTH, NEED_DATA,
                                           STATS_NAMES, Opcode, Parser, Reject, Request,
                                           Status, TooLarge, acquire_response, dump_end,
                                           dump_record, dump_response, error_response,
                                           get_response, noop_response, release_response,
                                           response, stats_response)

OPQ = 0x4F505131            # b"OPQ1", the opaque used when probing the real server
FOLLOW_OPQ = 0x464F4C4C     # b"FOLL"
U32 = 2**32 - 1
NOOP, GET, ACQUIRE, RELEASE, STATS, DUMP = 0x00, 0x01, 0x02, 0x03, 0x10, 0x11
REQUEST_OPCODES = (NOOP, GET, ACQUIRE, RELEASE, STATS, DUMP)


def frame(opcode: int, body: bytes = b"", opaque: int = OPQ, magic: int = 0x90,
          flags: int = 0, reserved: int = 0, length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    return struct.pack(">BBBBII", magic, opcode, flags, reserved, size, opaque) + body


def name(raw: bytes) -> bytes:
    return struct.pack(">H", len(raw)) + raw


def acquire(resources: int, maximum: int, raw: bytes, extra: bytes = b"") -> bytes:
    return frame(ACQUIRE, struct.pack(">II", resources, maximum) + name(raw) + extra)


def release(resources: int, raw: bytes, extra: bytes = b"") -> bytes:
    return frame(RELEASE, struct.pack(">I", resources) + name(raw) + extra)


def reply(hex_bytes: str) -> Reject:
    return Reject(bytes.fromhex(hex_bytes))


# Replies observed from yrmcds 1.1.9 (opaque OPQ1).
INVALID_GET = reply("91010400000000114f505131496e76616c696420617267756d656e7473")
INVALID_ACQUIRE = reply("91020400000000114f505131496e76616c696420617267756d656e7473")
INVALID_RELEASE = reply("91030400000000114f505131496e76616c696420617267756d656e7473")
UNKNOWN = reply("911281000000000f4f505131556e6b6e6f776e20636f6d6d616e64")


def bad_magic(opcode: int) -> Reject:
    # observed for opcodes 0x00, 0x01, 0x05, 0x12, 0xff: 91 <raw opcode> 04 00 ... "Invalid arguments"
    return reply("91%02x0400000000114f505131496e76616c696420617267756d656e7473" % opcode)


FOLLOWER = frame(NOOP, opaque=FOLLOW_OPQ)
FOLLOWED = Request(NOOP, FOLLOW_OPQ)
NAME_MAX = b"n" * 65535


def case(data: bytes, expected: list, id: str):
    return pytest.param(data, expected, id=id)


CASES = [
    # -- well-formed requests (docs/counter.md) --
    case(frame(NOOP), [Request(NOOP, OPQ)], "noop"),
    case(frame(NOOP, flags=0xFF, reserved=0xEE), [Request(NOOP, OPQ)], "noop ignores flags and reserved"),
    case(frame(NOOP, b"12345"), [Request(NOOP, OPQ)], "noop ignores a 5-byte body"),
    case(frame(GET, name(b"zz")), [Request(GET, OPQ, b"zz")], "get"),
    case(frame(GET, name(b"a\x00b")), [Request(GET, OPQ, b"a\x00b")], "get a name with NUL"),
    case(frame(GET, name(NAME_MAX)), [Request(GET, OPQ, NAME_MAX)], "get a 65535-byte name"),
    case(frame(GET, name(b"a") + b"\x90\x00\x00\x00"), [Request(GET, OPQ, b"a")],
         "get ignores bytes after the name"),
    case(acquire(2, 10, b"ab"), [Request(ACQUIRE, OPQ, b"ab", 2, 10)], "acquire"),
    case(acquire(2, 10, b"ab", b"XYZ"), [Request(ACQUIRE, OPQ, b"ab", 2, 10)],
         "acquire ignores bytes after the name"),
    case(acquire(5, 5, b"a"), [Request(ACQUIRE, OPQ, b"a", 5, 5)],
         "acquire with resources equal to maximum"),
    case(acquire(U32, U32, b"a"), [Request(ACQUIRE, OPQ, b"a", U32, U32)],
         "acquire of u32 max parses (the broker refuses the wrap)"),
    case(acquire(1, 1, NAME_MAX), [Request(ACQUIRE, OPQ, NAME_MAX, 1, 1)], "acquire a 65535-byte name"),
    case(release(2, b"rr"), [Request(RELEASE, OPQ, b"rr", 2)], "release"),
    case(release(0, b"rr"), [Request(RELEASE, OPQ, b"rr", 0)], "release of zero parses"),
    case(release(1, b"rr", b"??"), [Request(RELEASE, OPQ, b"rr", 1)],
         "release ignores bytes after the name"),
    case(frame(STATS), [Request(STATS, OPQ)], "stats"),
    case(frame(STATS, b"junk"), [Request(STATS, OPQ)], "stats ignores its body"),
    case(frame(DUMP), [Request(DUMP, OPQ)], "dump"),
    case(frame(DUMP, b"junk"), [Request(DUMP, OPQ)], "dump ignores its body"),

    # -- bodies too short for their opcode (request::parse): 0x04, opcode echoed --
    case(frame(GET), [INVALID_GET], "get with no body"),
    case(frame(GET, b"\x00"), [INVALID_GET], "get with a 1-byte body"),
    case(frame(GET, b"\x00\x00"), [INVALID_GET], "get with a zero name length"),
    case(frame(GET, b"\x00\x00abc"), [INVALID_GET], "get with a zero name length and a body"),
    case(frame(GET, b"\x00\x03ab"), [INVALID_GET], "get with a name longer than its body"),
    case(frame(ACQUIRE, struct.pack(">IIB", 1, 1, 0)), [INVALID_ACQUIRE], "acquire with a 9-byte body"),
    case(acquire(0, 1, b"a"), [INVALID_ACQUIRE], "acquire of zero"),
    case(acquire(2, 1, b"a"), [INVALID_ACQUIRE], "acquire with maximum below resources"),
    case(acquire(1, 1, b""), [INVALID_ACQUIRE], "acquire with a zero name length"),
    case(frame(ACQUIRE, struct.pack(">IIH", 1, 1, 3) + b"ab"), [INVALID_ACQUIRE],
         "acquire with a name longer than its body"),
    case(frame(RELEASE, struct.pack(">IB", 1, 0)), [INVALID_RELEASE], "release with a 5-byte body"),
    case(release(1, b""), [INVALID_RELEASE], "release with a zero name length"),
    case(frame(RELEASE, struct.pack(">IH", 1, 3) + b"ab"), [INVALID_RELEASE],
         "release with a name longer than its body"),

    # -- bad magic: 0x04 with the raw opcode; unknown opcode: 0x81 with opcode 0x12 --
    case(frame(NOOP, opaque=0x42414431, magic=0x80),
         [reply("910004000000001142414431496e76616c696420617267756d656e7473")], "bad magic 0x80 on noop"),
    case(frame(0x05, magic=0x00), [bad_magic(0x05)], "bad magic echoes an unknown opcode"),
    case(frame(GET, name(b"a"), magic=0x91), [bad_magic(GET)], "the response magic in a request"),
    case(frame(0x12, magic=0x91), [bad_magic(0x12)], "bad magic echoes opcode 0x12"),
    case(frame(0xFF, b"xyz", magic=0xFF), [bad_magic(0xFF)], "bad magic with a body"),
    case(frame(0x04), [UNKNOWN], "unknown opcode 0x04"),
    case(frame(0x05, b"hello"), [UNKNOWN], "unknown opcode with a body"),
    case(frame(0x12), [UNKNOWN], "unknown opcode 0x12"),
    case(frame(0x13), [UNKNOWN], "unknown opcode 0x13"),
    case(frame(0xFF), [UNKNOWN], "unknown opcode 0xff"),

    # -- skip by declared length (request::parse): a frame inside a body is never parsed --
    case(frame(NOOP, FOLLOWER, magic=0x80), [bad_magic(NOOP)], "a bad-magic body hides a whole frame"),
    case(frame(0x07, FOLLOWER), [UNKNOWN], "an unknown opcode's body hides a whole frame"),
    case(frame(GET, b"\x00\x00" + FOLLOWER), [INVALID_GET], "an invalid get's body hides a whole frame"),
    case(frame(GET, name(b"a") + FOLLOWER), [Request(GET, OPQ, b"a")],
         "a get's extra body hides a frame"),
]


def feed(data: bytes, chunk: int | None = None, limit: int = MAX_REQUEST_LENGTH) -> tuple[list, int]:
    """Feed data whole (chunk=None) or `chunk` bytes at a time; return (events, bytes held)."""
    parser = Parser(limit)
    out = []
    pieces = [data] if chunk is None else [data[i:i + chunk] for i in range(0, len(data), chunk)]
    for piece in pieces:
        parser.receive_data(piece)
        out += drain(parser)
        if out and isinstance(out[-1], TooLarge):
            break                            # the front closes the connection here
    return out, parser.buffered


def drain(parser: Parser) -> list:
    """Events up to NEED_DATA, or up to and including TooLarge (the front closes then)."""
    out = []
    while (event := parser.next_event()) is not NEED_DATA:
        assert isinstance(event, (Request, Reject, TooLarge))
        out.append(event)
        if isinstance(event, TooLarge):
            break
    return out


@pytest.mark.parametrize("data, expected", CASES)
def test_a_reference_frame_parses_as_yrmcds_does_when_sent_whole(data, expected):
    assert feed(data) == (expected, 0)


@pytest.mark.parametrize("data, expected", CASES)
def test_a_reference_frame_parses_the_same_one_byte_at_a_time(data, expected):
    parser = Parser()
    for byte in data[:-1]:
        parser.receive_data(bytes([byte]))
        assert parser.next_event() is NEED_DATA      # nothing before the frame's last byte
    parser.receive_data(data[-1:])
    assert drain(parser) == expected
    assert parser.buffered == 0


@pytest.mark.parametrize("data, expected", CASES)
def test_a_reference_frame_leaves_the_following_data_intact(data, expected):
    assert feed(data + FOLLOWER) == (expected + [FOLLOWED], 0)
    assert feed(data + FOLLOWER, chunk=5) == (expected + [FOLLOWED], 0)
    assert feed(data + FOLLOWER[:4]) == (expected, 4)  # counter_request.cpp: a partial header waits


# -- pipelining and buffering --

def test_pipelined_frames_give_their_replies_in_order_as_yrmcds_does():
    stream = (frame(NOOP, opaque=0x50303031) + frame(0x04, b"zz", opaque=0x50303032)
              + frame(NOOP, magic=0x11, opaque=0x50303033) + frame(GET, b"\x00", opaque=0x50303034)
              + frame(STATS, opaque=0x50303035)[:6])
    # yrmcds 1.1.9 answered this stream with exactly these three error replies after the Noop
    # and waited on the 6-byte partial Stats header.
    observed = bytes.fromhex(
        "910000000000000050303031"
        "911281000000000f50303032556e6b6e6f776e20636f6d6d616e64"
        "910004000000001150303033496e76616c696420617267756d656e7473"
        "910104000000001150303034496e76616c696420617267756d656e7473")
    for chunk in (None, 1, 7):
        events, held = feed(stream, chunk)
        assert events[0] == Request(NOOP, 0x50303031)
        assert noop_response(0x50303031) + b"".join(e.reply for e in events[1:]) == observed
        assert held == 6


def test_a_pipelined_acquire_and_release_script_parses_in_order():
    stream = b"".join([acquire(2, 10, b"e1"), acquire(9, 10, b"e1"), frame(GET, name(b"e1")),
                       release(0, b"e1"), release(2, b"e1")])
    assert [e.opcode for e in feed(stream, 3)[0]] == [ACQUIRE, ACQUIRE, GET, RELEASE, RELEASE]


def test_a_frame_is_held_until_its_last_body_byte_arrives():
    data = acquire(1, 3, b"hello")
    parser = Parser()
    parser.receive_data(data[:-1])
    assert parser.next_event() is NEED_DATA
    assert parser.buffered == len(data) - 1
    parser.receive_data(data[-1:] + FOLLOWER[:11])
    assert parser.next_event() == Request(ACQUIRE, OPQ, b"hello", 1, 3)
    assert parser.next_event() is NEED_DATA
    assert parser.buffered == 11


def test_an_empty_parser_needs_data_and_holds_nothing():
    parser = Parser()
    assert parser.next_event() is NEED_DATA
    assert parser.buffered == 0
    assert repr(NEED_DATA) == "NEED_DATA"


def test_the_opaque_bytes_round_trip_exactly():
    for opaque in (0, 1, 0x01020304, 0x80000000, U32):
        event = feed(frame(NOOP, opaque=opaque))[0][0]
        assert noop_response(event.opaque)[8:12] == struct.pack(">I", opaque)


# -- the 30 MiB bound (MAX_REQUEST_LENGTH, sockets.cpp) --

def test_a_frame_of_exactly_30_mib_is_waited_for():
    parser = Parser()
    parser.receive_data(frame(GET, length=MAX_REQUEST_LENGTH - 12))
    assert parser.next_event() is NEED_DATA
    assert parser.buffered == 12


def test_a_frame_one_byte_over_30_mib_is_too_large_as_soon_as_its_header_is_in():
    parser = Parser()
    header = frame(GET, length=MAX_REQUEST_LENGTH - 11)
    for byte in header[:-1]:
        parser.receive_data(bytes([byte]))
        assert parser.next_event() is NEED_DATA
    parser.receive_data(header[-1:] + b"\x00\x01")
    assert parser.next_event() == TooLarge(MAX_REQUEST_LENGTH + 1)
    assert parser.buffered == 0


def test_too_large_is_final_and_nothing_more_is_buffered():
    parser = Parser()
    parser.receive_data(frame(NOOP, length=U32))
    assert parser.next_event() == TooLarge(U32 + 12)
    parser.receive_data(bytes(1 << 16) + FOLLOWER)
    assert parser.buffered == 0
    assert parser.next_event() == TooLarge(U32 + 12)


def test_frames_before_a_too_large_header_are_still_parsed():
    events, held = feed(frame(NOOP) + frame(0x05, magic=0x00, length=1 << 31) + FOLLOWER)
    assert events == [Request(NOOP, OPQ), TooLarge((1 << 31) + 12)]
    assert held == 0


def test_the_bound_applies_to_bad_frames_too():
    events = feed(frame(0x42, magic=0x00, length=MAX_REQUEST_LENGTH))[0]
    assert events == [TooLarge(MAX_REQUEST_LENGTH + 12)]


def test_a_smaller_bound_counts_the_header():
    assert feed(frame(NOOP, bytes(52)), limit=64) == ([Request(NOOP, OPQ)], 0)
    assert feed(frame(NOOP, bytes(53)), limit=64) == ([TooLarge(65)], 0)


def test_a_whole_30_mib_frame_parses():
    body = name(b"x") + bytes(MAX_REQUEST_LENGTH - 12 - 3)   # yrmcds 1.1.9 answered this Get
    assert feed(frame(GET, body, opaque=0x42494732) + FOLLOWER) == (
        [Request(GET, 0x42494732, b"x"), FOLLOWED], 0)


# -- replies (counter.cpp response::*), compared with bytes yrmcds 1.1.9 sent --

def test_ok_replies_match_yrmcds():
    assert noop_response(OPQ) == bytes.fromhex("91000000000000004f505131")
    assert get_response(3, 2) == bytes.fromhex("9101000000000004" "00000003" "00000002")
    assert acquire_response(1, 2) == bytes.fromhex("91020000000000040000000100000002")
    assert release_response(1) == bytes.fromhex("910300000000000000000001")


@pytest.mark.parametrize("opcode, opaque, status, observed", [
    (GET, OPQ, Status.NOT_FOUND, "91010100000000094f5051314e6f7420666f756e64"),
    (RELEASE, OPQ, Status.NOT_FOUND, "91030100000000094f5051314e6f7420666f756e64"),
    (ACQUIRE, 2, Status.RESOURCE_NOT_AVAILABLE,
     "9102210000000016000000025265736f75726365206e6f7420617661696c61626c65"),
    (RELEASE, 0x43434343, Status.NOT_ACQUIRED, "910322000000000c434343434e6f74206163717569726564"),
    (NOOP, 0x42414431, Status.INVALID, "910004000000001142414431496e76616c696420617267756d656e7473"),
    (Opcode.UNKNOWN, OPQ, Status.UNKNOWN_COMMAND,
     "911281000000000f4f505131556e6b6e6f776e20636f6d6d616e64"),
])
def test_error_replies_match_yrmcds(opcode, opaque, status, observed):
    assert error_response(opcode, opaque, status) == bytes.fromhex(observed)


def test_every_error_status_has_one_exact_body():
    assert {int(s) for s in ERROR_BODIES} == {0x01, 0x04, 0x21, 0x22, 0x81, 0x82}
    assert error_response(NOOP, 0, Status.OUT_OF_MEMORY) == (   # in counter.cpp; never sent
        b"\x91\x00\x82\x00\x00\x00\x00\x0b\x00\x00\x00\x00OutOfMemory")
    with pytest.raises(KeyError):
        error_response(NOOP, 0, Status.OK)


# Stats reply yrmcds 1.1.9 sent for a Stats request (with a 4-byte body) on a fresh server.
OBSERVED_STATS = bytes.fromhex(
    "911000000000010c4f505131000700016f626a6563747330000d0001746f74616c5f6f626a6563747332000b0001"
    "757365645f6d656d6f72793000090001636f6e666c69637473300008000167635f636f756e7431000f00026c6173"
    "745f67635f656c6170736564393500100002746f74616c5f67635f656c6170736564393500100001637572725f63"
    "6f6e6e656374696f6e733200110002746f74616c5f636f6e6e656374696f6e733332000c0001636f6d6d616e643a"
    "6e6f6f7033000b0001636f6d6d616e643a67657431000f0001636f6d6d616e643a6163717569726533000f000163"
    "6f6d6d616e643a72656c6561736533000d0001636f6d6d616e643a737461747331000c0001636f6d6d616e643a64"
    "756d7030")
OBSERVED_STATS_VALUES = {
    "objects": 0, "total_objects": 2, "used_memory": 0, "conflicts": 0, "gc_count": 1,
    "last_gc_elapsed": 95, "total_gc_elapsed": 95, "curr_connections": 2, "total_connections": 32,
    "command:noop": 3, "command:get": 1, "command:acquire": 3, "command:release": 3,
    "command:stats": 1, "command:dump": 0,
}


def test_stats_reply_matches_yrmcds_byte_for_byte():
    assert stats_response(OPQ, OBSERVED_STATS_VALUES) == OBSERVED_STATS


def test_stats_items_are_put_in_yrmcds_order_whatever_order_they_come_in():
    shuffled = sorted(OBSERVED_STATS_VALUES.items(), key=lambda kv: kv[0][::-1])
    assert stats_response(OPQ, shuffled) == OBSERVED_STATS
    as_text = [(k, str(v)) for k, v in shuffled]
    assert stats_response(OPQ, as_text) == OBSERVED_STATS
    assert list(OBSERVED_STATS_VALUES) == list(STATS_NAMES)


def test_stats_items_outside_yrmcds_follow_in_the_order_given():
    body = stats_response(0, [("zeta", b"1"), ("objects", 4), ("alpha", "2")])[12:]
    assert body == (b"\x00\x07\x00\x01objects4" b"\x00\x04\x00\x01zeta1" b"\x00\x05\x00\x01alpha2")


def test_dump_is_one_frame_per_counter_then_an_empty_terminator_as_yrmcds_sends():
    # yrmcds 1.1.9, after "rr" and "ab" were acquired (2 each) and released: (0, max 2) each
    observed = bytes.fromhex("911100000000000c44554d50000000000000000200027272"
                             "911100000000000c44554d50000000000000000200026162"
                             "911100000000000044554d50")
    opaque = 0x44554D50   # b"DUMP"
    assert dump_response(opaque, [(b"rr", 0, 2), (b"ab", 0, 2)]) == observed
    records = dump_record(opaque, b"rr", 0, 2) + dump_record(opaque, b"ab", 0, 2)
    assert records + dump_end(opaque) == observed
    assert dump_response(opaque, []) == dump_end(opaque) == bytes.fromhex("911100000000000044554d50")
    # the reference's record: name e1, cur 0, max 11
    assert dump_record(opaque, b"e1", 0, 11) == bytes.fromhex(
        "911100000000000c44554d50000000000000000b00026531")


def test_a_reply_carries_any_body_with_its_length():
    assert response(0x12, 7, 0x81, b"abc") == b"\x91\x12\x81\x00\x00\x00\x00\x03\x00\x00\x00\x07abc"


# -- properties --

opaques = st.integers(0, U32)
bodies = st.one_of(
    st.binary(max_size=24),
    st.tuples(st.integers(0, 3), st.integers(0, 3), st.binary(max_size=12)).map(
        lambda t: struct.pack(">IIH", t[0], t[1], len(t[2])) + t[2]),
    st.tuples(st.integers(0, 3), st.integers(0, 14), st.binary(max_size=12)).map(
        lambda t: struct.pack(">IH", t[0], t[1]) + t[2]),
    st.binary(max_size=12).map(name),
)
magics = st.one_of(st.just(0x90), st.just(0x90), st.integers(0, 255))
opcodes = st.one_of(st.sampled_from([NOOP, GET, ACQUIRE, RELEASE, STATS, DUMP]), st.integers(0, 255))
good_frames = st.builds(lambda m, o, b, q, f: frame(o, b, opaque=q, magic=m, flags=f),
                        magics, opcodes, bodies, opaques, st.integers(0, 255))
# a frame whose declared length is off: long ones wait or hit the bound, short ones resync later
bad_lengths = st.builds(lambda o, b, n: frame(o, b, length=n), opcodes, st.binary(max_size=8),
                        st.one_of(st.integers(0, 40), st.integers(0, U32)))
streams = st.one_of(
    st.binary(max_size=400),
    st.lists(st.one_of(good_frames, good_frames, bad_lengths, st.binary(max_size=14)),
             max_size=20).map(b"".join),
)
LIMIT = 64      # a small bound, so TooLarge shows up among ordinary frames


@settings(max_examples=300, deadline=None)
@given(streams)
def test_arbitrary_bytes_only_ever_yield_events(data):
    parser = Parser(LIMIT)
    parser.receive_data(data)
    events = drain(parser)
    if events and isinstance(events[-1], TooLarge):
        assert parser.buffered == 0
    else:
        assert parser.buffered < LIMIT     # at most one partial frame within the bound


@settings(max_examples=300, deadline=None)
@given(streams, st.lists(st.integers(min_value=0, max_value=2000), max_size=12))
def test_any_chunking_of_the_same_input_yields_the_same_events(data, cuts):
    expected, held = feed(data, limit=LIMIT)
    bounds = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    for pieces in ([data[a:b] for a, b in zip(bounds, bounds[1:])],    # random cuts
                   [data[i:i + 1] for i in range(len(data))]):          # one byte at a time
        parser = Parser(LIMIT)
        got = []
        for piece in pieces:
            parser.receive_data(piece)
            if not (got and isinstance(got[-1], TooLarge)):
                got += drain(parser)
        assert got == expected
        assert parser.buffered == held


def expected_shape(data: bytes, event) -> None:
    """Check one event against the frame it came from, without re-implementing parse."""
    magic, opcode, opaque = data[0], data[1], struct.unpack_from(">I", data, 8)[0]
    if isinstance(event, Request):
        assert magic == 0x90 and opcode in REQUEST_OPCODES
        assert (event.opcode, event.opaque) == (opcode, opaque)
        if event.name is not None:
            assert 1 <= len(event.name) <= 65535 and event.name in data[12:]
        return
    header = struct.unpack_from(">BBBBII", event.reply)
    if magic != 0x90:
        assert header == (0x91, opcode, 0x04, 0, 17, opaque)
    elif opcode not in REQUEST_OPCODES:
        assert header == (0x91, 0x12, 0x81, 0, 15, opaque)
    else:
        assert header == (0x91, opcode, 0x04, 0, 17, opaque) and opcode in (GET, ACQUIRE, RELEASE)
    assert event.reply[12:] == ERROR_BODIES[header[2]]


@settings(max_examples=200, deadline=None)
@given(st.lists(good_frames, max_size=25), st.integers(1, 40))
def test_every_complete_frame_gives_exactly_one_event(frames, chunk):
    events, held = feed(b"".join(frames), chunk)
    assert len(events) == len(frames) and held == 0
    for data, event in zip(frames, events):
        expected_shape(data, event)


names = st.binary(min_size=1, max_size=300)
valid_requests = st.one_of(     # every field given, so builds() infers none of them
    st.builds(Request, st.sampled_from([NOOP, STATS, DUMP]), opaques, st.none(), st.none(), st.none()),
    st.builds(Request, st.just(GET), opaques, names, st.none(), st.none()),
    st.integers(1, U32).flatmap(lambda r: st.builds(
        Request, st.just(ACQUIRE), opaques, names, st.just(r), st.integers(r, U32))),
    st.builds(Request, st.just(RELEASE), opaques, names, st.integers(0, U32), st.none()),
)


def encode(request: Request) -> bytes:
    body = b""
    if request.opcode == ACQUIRE:
        body = struct.pack(">II", request.resources, request.maximum)
    elif request.opcode == RELEASE:
        body = struct.pack(">I", request.resources)
    if request.name is not None:
        body += name(request.name)
    return frame(request.opcode, body, opaque=request.opaque)


@settings(max_examples=200, deadline=None)
@given(st.lists(valid_requests, max_size=20), st.integers(1, 64))
def test_every_valid_request_parses_back_to_itself(requests, chunk):
    assert feed(b"".join(map(encode, requests)), chunk) == (requests, 0)
