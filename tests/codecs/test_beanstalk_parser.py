"""Tests for zstalk.protocol.codecs.beanstalk, the sans-IO beanstalkd command parser.

Every parsing edge case of beanstalkd's prot.c (which_cmd, read_u32/read_u64, tube names,
the 224-byte line buffer, job bodies) and every parsing behaviour of beanstalkd's
testserv.c is run three ways: whole, one byte at a time, and followed by another command
that must still parse. Hypothesis then checks that arbitrary bytes never raise, that
chunking never changes the events, and that each command sent yields exactly one event.

Checked against the real beanstalkd 1.12 (/usr/bin/beanstalkd on 127.0.0.1) by sending
each case in CASES and TOO_BIG_CASES on a fresh connection and comparing the error
replies (BAD_FORMAT / UNKNOWN_COMMAND / JOB_TOO_BIG / EXPECTED_CRLF, any other reply for
a Command, EOF for quit): all agree except the cases marked "1.13" (reserve-with-
timeout is parsed with strtol in 1.12) and "deviation" (a 223-byte line swallows the
next line in beanstalkd; a stray CR makes it wait for more input). Also verified on
1.12: cmd-put counts a put with trailing garbage, cmd-pause-tube counts `pause-tube -x
1`, and `kick 4294967296` kicks nothing (strtoul truncated to 32 bits).
"""
from __future__ import annotations

import gc
import weakref

import pytest
from hypothesis import given, settings, strategies as st

from zstalk.protocol.codecs import beanstalk as beanstalk_codec
from zstalk.protocol.codecs.beanstalk import (COMMANDS, NEED_DATA, Command, Parser, Reject,
                                              which_cmd, which_cmd_by_prefix)

BAD = Reject(b"BAD_FORMAT\r\n")
UNKNOWN = Reject(b"UNKNOWN_COMMAND\r\n")
TOO_BIG = Reject(b"JOB_TOO_BIG\r\n", counts="put")
NO_CRLF = Reject(b"EXPECTED_CRLF\r\n", counts="put", consumes_id=True)
BAD_COUNTED_PUT = Reject(b"BAD_FORMAT\r\n", counts="put")
BAD_COUNTED_PAUSE = Reject(b"BAD_FORMAT\r\n", counts="pause-tube")
FOLLOWER = b"list-tube-used\r\n"
FOLLOWED = Command("list-tube-used", ())
U32 = 2**32 - 1
U64 = 2**64 - 1
NAME200 = b"a" * 200


def C(name: str, *args, body: bytes | None = None) -> Command:
    return Command(name, args, body)


def feed(data: bytes, chunk: int | None = None, max_job_size: int = 65535) -> tuple[list, int]:
    """Feed data whole (chunk=None) or `chunk` bytes at a time; return (events, bytes held)."""
    parser = Parser(max_job_size)
    out = []
    pieces = [data] if chunk is None else [data[i:i + chunk] for i in range(0, len(data), chunk)]
    for piece in pieces:
        parser.receive_data(piece)
        while (event := parser.next_event()) is not NEED_DATA:
            out.append(event)
    return out, parser.buffered


def events(data: bytes, chunk: int | None = None, max_job_size: int = 65535) -> list:
    return feed(data, chunk, max_job_size)[0]


def case(data: bytes, expected: list, id_: str, limit: int = 65535):
    return pytest.param(data, expected, limit, id=id_)


CASES = [
    # -- every command in its plain form --
    case(b"put 1 2 3 5\r\nhello\r\n", [C("put", 1, 2, 3, 5, body=b"hello")], "put"),
    case(b"use foo\r\n", [C("use", "foo")], "use"),
    case(b"reserve\r\n", [C("reserve")], "reserve"),
    case(b"reserve-with-timeout 7\r\n", [C("reserve-with-timeout", 7)], "reserve-with-timeout"),
    case(b"reserve-job 3\r\n", [C("reserve-job", 3)], "reserve-job"),
    case(b"delete 3\r\n", [C("delete", 3)], "delete"),
    case(b"release 3 10 20\r\n", [C("release", 3, 10, 20)], "release"),
    case(b"bury 3 10\r\n", [C("bury", 3, 10)], "bury"),
    case(b"touch 3\r\n", [C("touch", 3)], "touch"),
    case(b"watch foo\r\n", [C("watch", "foo")], "watch"),
    case(b"ignore foo\r\n", [C("ignore", "foo")], "ignore"),
    case(b"peek 3\r\n", [C("peek", 3)], "peek"),
    case(b"peek-ready\r\n", [C("peek-ready")], "peek-ready"),
    case(b"peek-delayed\r\n", [C("peek-delayed")], "peek-delayed"),
    case(b"peek-buried\r\n", [C("peek-buried")], "peek-buried"),
    case(b"kick 5\r\n", [C("kick", 5)], "kick"),
    case(b"kick-job 3\r\n", [C("kick-job", 3)], "kick-job"),
    case(b"stats\r\n", [C("stats")], "stats"),
    case(b"stats-job 3\r\n", [C("stats-job", 3)], "stats-job"),
    case(b"stats-tube foo\r\n", [C("stats-tube", "foo")], "stats-tube"),
    case(b"list-tubes\r\n", [C("list-tubes")], "list-tubes"),
    case(b"list-tube-used\r\n", [C("list-tube-used")], "list-tube-used"),
    case(b"list-tubes-watched\r\n", [C("list-tubes-watched")], "list-tubes-watched"),
    case(b"pause-tube foo 30\r\n", [C("pause-tube", "foo", 30)], "pause-tube"),
    case(b"quit\r\n", [C("quit")], "quit"),

    # -- command matching (prot.c, which_cmd) --
    case(b"use a\x00b\r\n", [BAD], "a NUL byte is bad format"),
    case(b"quit\x00\r\n", [BAD], "a NUL byte is checked before the command word"),
    case(b"put 0 0 1 1\x00\r\nA\r\n", [BAD, UNKNOWN], "a put with a NUL reads no body"),
    case(b"\r\n", [UNKNOWN], "an empty line is unknown"),
    case(b"PUT 0 0 1 1\r\nA\r\n", [UNKNOWN, UNKNOWN], "matching is case sensitive"),
    case(b"Use a\r\n", [UNKNOWN], "matching is case sensitive for use"),
    case(b" put 0 0 1 1\r\nA\r\n", [UNKNOWN, UNKNOWN], "a leading space is unknown"),
    case(b"reserve \r\n", [BAD], "reserve with a space"),
    case(b"reservex\r\n", [BAD], "reservex"),
    case(b"reserve-with-timeout\r\n", [BAD], "reserve-with-timeout without its space"),
    case(b"reserve-job\r\n", [BAD], "reserve-job without its space"),
    case(b"stats \r\n", [BAD], "stats with a space"),
    case(b"statsx\r\n", [BAD], "statsx"),
    case(b"stats-tubes\r\n", [BAD], "stats-tubes"),
    case(b"stats-tube\r\n", [BAD], "stats-tube without an argument"),
    case(b"stats-job\r\n", [BAD], "stats-job without an argument"),
    case(b"list-tubes \r\n", [BAD], "list-tubes with a space"),
    case(b"list-tubesx\r\n", [BAD], "list-tubesx"),
    case(b"list-tube-usedx\r\n", [BAD], "list-tube-usedx"),
    case(b"list-tubes-watched \r\n", [BAD], "list-tubes-watched with a space"),
    case(b"peek-ready \r\n", [BAD], "peek-ready with a space"),
    case(b"peek-delayedx\r\n", [BAD], "peek-delayedx"),
    case(b"peek-buried 1\r\n", [BAD], "peek-buried with an argument"),
    case(b"put\r\n", [UNKNOWN], "put without its space"),
    case(b"delete\r\n", [UNKNOWN], "delete without its space"),
    case(b"peek\r\n", [UNKNOWN], "peek without its space"),
    case(b"kick\r\n", [UNKNOWN], "kick without its space"),
    case(b"use\r\n", [UNKNOWN], "use without its space"),
    case(b"list-tube\r\n", [UNKNOWN], "list-tube"),
    case(b"nont10knowncommand\r\n", [UNKNOWN], "testserv unknown_command"),
    case(b"quitx\r\n", [C("quit")], "quitx quits"),
    case(b"quit now\r\n", [C("quit")], "quit ignores what follows"),
    case(b"pause-tubedefault 0\r\n", [C("pause-tube", "default", 0)], "pause-tubedefault 0"),
    case(b"use a\r\nuse b\r\n", [C("use", "a"), C("use", "b")], "testserv 2cmdpacket"),

    # -- numbers (prot.c, read_u32 / read_u64; kick uses strtoul) --
    case(b"put  0 0 1 1\r\nA\r\n", [C("put", 0, 0, 1, 1, body=b"A")], "put with two spaces first"),
    case(b"put 0  0 1 1\r\nA\r\n", [C("put", 0, 0, 1, 1, body=b"A")], "put with two spaces inside"),
    case(b"put 007 0 1 1\r\nA\r\n", [C("put", 7, 0, 1, 1, body=b"A")], "leading zeros are fine"),
    case(b"put 0\t0 1 1\r\nA\r\n", [BAD, UNKNOWN], "a tab is bad format"),
    case(b"put -1 0 1 1\r\nA\r\n", [BAD, UNKNOWN], "a minus sign is bad format"),
    case(b"put +1 0 1 1\r\nA\r\n", [BAD, UNKNOWN], "a plus sign is bad format"),
    case(b"put 0x10 0 1 1\r\nA\r\n", [BAD, UNKNOWN], "hex is bad format"),
    case(b"put 1.5 0 1 1\r\nA\r\n", [BAD, UNKNOWN], "a fraction is bad format"),
    case(b"put 0 0 1 1 \r\nA\r\n", [BAD_COUNTED_PUT, UNKNOWN], "put with a trailing space"),
    case(b"put 0 0 1 1x\r\nA\r\n", [BAD_COUNTED_PUT, UNKNOWN], "put with trailing garbage"),
    case(b"put 4294967295 0 4294967295 1\r\nA\r\n", [C("put", U32, 0, U32, 1, body=b"A")],
         "u32 max pri and ttr"),
    case(b"put 4294967296 0 1 1\r\nA\r\n", [BAD, UNKNOWN], "pri above u32"),
    case(b"put 0 4294967296 1 1\r\nA\r\n", [BAD, UNKNOWN], "delay above u32"),
    case(b"put 0 0 4294967296 1\r\nA\r\n", [BAD, UNKNOWN], "ttr above u32"),
    case(b"put 99999999999999999999999 0 1 1\r\nA\r\n", [BAD, UNKNOWN], "pri above u64"),
    case(b"put 1 0 1\r\nA\r\n", [BAD, UNKNOWN], "put with three numbers"),
    case(b"put 0 0 0 1\r\nA\r\n", [C("put", 0, 0, 1, 1, body=b"A")], "ttr 0 becomes 1"),
    case(b"put 0 0 21600 1\r\nA\r\n", [C("put", 0, 0, 21600, 1, body=b"A")], "testserv ttrlarge"),
    case(b"delete 18446744073709551615\r\n", [C("delete", U64)], "delete u64 max"),
    case(b"delete 18446744073709551616\r\n", [BAD], "delete above u64"),
    case(b"delete 0\r\n", [C("delete", 0)], "delete 0"),
    case(b"delete  1\r\n", [C("delete", 1)], "delete with two spaces"),
    case(b"delete 1 \r\n", [BAD], "delete with a trailing space"),
    case(b"delete 3x\r\n", [BAD], "delete 3x"),
    case(b"delete \r\n", [BAD], "delete without an id"),
    case(b"stats-job 1 2\r\n", [BAD], "stats-job with two ids"),
    case(b"release 1 0\r\n", [BAD], "release without a delay"),
    case(b"release 1 0 0 0\r\n", [BAD], "release with four numbers"),
    case(b"release  1  2  3\r\n", [C("release", 1, 2, 3)], "release with double spaces"),
    case(b"bury 1\r\n", [BAD], "bury without a pri"),
    case(b"bury 1 2 \r\n", [BAD], "bury with a trailing space"),
    case(b"kick 1x\r\n", [C("kick", 1)], "kick ignores trailing garbage"),
    case(b"kick 1 junk\r\n", [C("kick", 1)], "kick ignores a trailing word"),
    case(b"kick  1\r\n", [C("kick", 1)], "kick with two spaces"),
    case(b"kick \t1\r\n", [C("kick", 1)], "kick skips a tab like strtoul"),
    case(b"kick +3\r\n", [C("kick", 3)], "kick takes a plus sign"),
    case(b"kick x\r\n", [BAD], "kick x"),
    case(b"kick \r\n", [BAD], "kick without a bound"),
    case(b"kick 99999999999999999999\r\n", [BAD], "kick above u64"),
    case(b"kick -1\r\n", [C("kick", U32)], "kick -1 wraps to a huge bound"),
    case(b"kick 4294967296\r\n", [C("kick", 0)], "kick truncates to 32 bits"),
    case(b"kick 18446744073709551615\r\n", [C("kick", U32)], "kick u64 max truncates"),
    case(b"kick -18446744073709551616\r\n", [BAD], "kick below minus u64 max"),
    case(b"reserve-with-timeout 0\r\n", [C("reserve-with-timeout", 0)], "reserve-with-timeout 0"),
    case(b"reserve-with-timeout 0 junk\r\n", [C("reserve-with-timeout", 0)],
         "reserve-with-timeout ignores trailing junk"),
    case(b"reserve-with-timeout  5\r\n", [C("reserve-with-timeout", 5)],
         "reserve-with-timeout skips spaces"),
    case(b"reserve-with-timeout 2147483647\r\n", [C("reserve-with-timeout", 2**31 - 1)],
         "reserve-with-timeout int max"),
    case(b"reserve-with-timeout abc\r\n", [BAD], "1.13 reserve-with-timeout abc"),
    case(b"reserve-with-timeout -1\r\n", [BAD], "1.13 reserve-with-timeout -1"),
    case(b"reserve-with-timeout 4294967296\r\n", [BAD], "1.13 reserve-with-timeout above u32"),
    case(b"reserve-with-timeout 2147483648\r\n", [BAD], "1.13 reserve-with-timeout above int max"),
    case(b"pause-tube default\r\n", [BAD], "pause-tube without a delay"),
    case(b"pause-tube default -1\r\n", [BAD], "pause-tube with a negative delay"),
    case(b"pause-tube default 1 \r\n", [BAD], "pause-tube with a trailing space"),
    case(b"pause-tube default 4294967296\r\n", [BAD], "pause-tube delay above u32"),
    case(b"pause-tube default5\r\n", [BAD], "pause-tube with the delay glued to the name"),
    case(b"pause-tube default*0\r\n", [BAD], "pause-tube with a bad separator"),
    case(b"pause-tube  default  0\r\n", [C("pause-tube", "default", 0)], "pause-tube with spaces"),
    case(b"pause-tube -x 1\r\n", [BAD_COUNTED_PAUSE], "pause-tube with a bad name still counts"),
    case(b"pause-tube " + b"a" * 201 + b" 1\r\n", [BAD_COUNTED_PAUSE],
         "pause-tube with a 201-byte name still counts"),
    case(b"pause-tube -x -1\r\n", [BAD], "pause-tube with a bad name and bad delay"),
    case(b"pause-tube nosuch 1\r\n", [C("pause-tube", "nosuch", 1)], "pause-tube nosuch"),

    # -- names (protocol.txt, "Protocol"; prot.c, is_valid_tube) --
    case(b"use a-b+c/d;e.f$g_h(i)\r\n", [C("use", "a-b+c/d;e.f$g_h(i)")], "every name char"),
    case(b"use 9\r\n", [C("use", "9")], "a digit name"),
    case(b"use x_y\r\n", [C("use", "x_y")], "testserv underscore"),
    case(b"use " + NAME200 + b"\r\n", [C("use", NAME200.decode())], "a 200-byte name"),
    case(b"use " + NAME200 + b"a\r\n", [BAD], "a 201-byte name"),
    case(b"use -foo\r\n", [BAD], "a name starting with a hyphen"),
    case(b"use foo bar\r\n", [BAD], "a name with a space"),
    case(b"use foo \r\n", [BAD], "a name with a trailing space"),
    case(b"use  foo\r\n", [BAD], "a name after two spaces"),
    case(b"use a*b\r\n", [BAD], "a name with a star"),
    case(b"use a:b\r\n", [BAD], "a name with a colon"),
    case(b"use \r\n", [BAD], "an empty name"),
    case(b"watch a\xffb\r\n", [BAD], "a name with a high byte"),
    case(b"ignore -bad\r\n", [BAD], "ignore a hyphen name"),
    case(b"stats-tube -x\r\n", [BAD], "stats-tube a hyphen name"),
    case(b"stats-tube nosuch\r\n", [C("stats-tube", "nosuch")], "stats-tube nosuch"),

    # -- line length (LINE_BUF_SIZE in dat.h: 224 bytes, CRLF included) --
    case(b"pause-tube " + NAME200 + b" 4294967295\r\n", [C("pause-tube", NAME200.decode(), U32)],
         "testserv longest_command is 224 bytes"),
    case(b"x" * 222 + b"\r\n", [UNKNOWN], "a 224-byte line is read"),
    case(b"x" * 224 + b"\r\n" + FOLLOWER, [BAD, FOLLOWED], "a 226-byte line is bad format once"),
    case(b"x" * 10000 + b"\r\n" + FOLLOWER, [BAD, FOLLOWED], "a 10000-byte line"),
    case(b"put 0 0 1 1" + b" " * 300 + b"\r\nA\r\n", [BAD, UNKNOWN], "an over-long put reads no body"),
    case(b"x" * 500 + b"\r\nput 0 0 1 1\r\nA\r\n", [BAD, C("put", 0, 0, 1, 1, body=b"A")],
         "testserv too_long_commandline"),
    case(b"x" * 223 + b"\r\n" + FOLLOWER, [BAD, FOLLOWED], "deviation a 223-byte line"),
    case(b"x" * 224 + b"\r\r\n" + FOLLOWER, [BAD, FOLLOWED], "deviation an over-long line ending in CR"),
    case(b"use a\rb\r\n" + FOLLOWER, [BAD, FOLLOWED], "deviation a stray CR"),
    case(b"use a\r\r\n" + FOLLOWER, [BAD, FOLLOWED], "deviation a CR before CRLF"),
    case(b"use a\nb\r\n", [BAD], "a lone LF is part of the line"),

    # -- bodies (prot.c, dispatch_cmd's put and enqueue_incoming_job) --
    case(b"put 0 0 1 4\r\na\r\nb\r\n", [C("put", 0, 0, 1, 4, body=b"a\r\nb")], "a body with CRLF"),
    case(b"put 0 0 1 3\r\na\x00b\r\n", [C("put", 0, 0, 1, 3, body=b"a\x00b")], "a body with NUL"),
    case(b"put 0 0 1 0\r\n\r\n", [C("put", 0, 0, 1, 0, body=b"")], "testserv zero_delay"),
    case(b"put 0 1 1 0\r\n\r\n", [C("put", 0, 1, 1, 0, body=b"")], "testserv small_delay"),
    case(b"put 0 0 1 1\r\nab\r\n" + FOLLOWER, [NO_CRLF, UNKNOWN],
         "expected crlf leaves the rest for the next line"),
    case(b"put 0 0 1 1\r\nAXY" + FOLLOWER, [NO_CRLF, FOLLOWED], "expected crlf takes size plus 2"),
    case(b"put 0 0 1 65535\r\n" + b"x" * 65535 + b"\r\n", [C("put", 0, 0, 1, 65535, body=b"x" * 65535)],
         "a body at the default limit"),
    case(b"put 0 0 1 65536\r\n" + b"x" * 65536 + b"\r\n" + FOLLOWER, [TOO_BIG, FOLLOWED],
         "a body over the default limit"),
    case(b"put 0 0 1 4294967296\r\nA\r\n", [BAD, UNKNOWN], "a size above u32 drains nothing"),
    case(b"put 0 0 0 10b\r\nput 0 0 1 1\r\nA\r\n", [BAD_COUNTED_PUT, C("put", 0, 0, 1, 1, body=b"A")],
         "testserv job_size_invalid 10b"),
    case(b"put 0 0 0 --!@#$%^&&**()0b\r\nput 0 0 1 1\r\nA\r\n", [BAD, C("put", 0, 0, 1, 1, body=b"A")],
         "testserv job_size_invalid garbage"),

    # -- testserv.c bad formats --
    case(b"peek 18446744073709551616\r\n", [BAD], "peek above u64"),
    case(b"peek 184467440737095516160000\r\n", [BAD], "peek far above u64"),
    case(b"peek foo111\r\n", [BAD], "peek with a non-digit prefix"),
    case(b"peek 111foo\r\n", [BAD], "peek with a non-digit suffix"),
    case(b"peek 18446744073709551615\r\n", [C("peek", U64)], "testserv peek_not_found u64 max"),
    case(b"touch a111\r\n", [BAD], "touch a111"),
    case(b"touch 111a\r\n", [BAD], "touch 111a"),
    case(b"touch !@#!@#\r\n", [BAD], "touch punctuation"),
    case(b"bury 111abc 2\r\n", [BAD], "bury a bad id"),
    case(b"bury 111 222abc\r\n", [BAD], "bury a bad pri"),
    case(b"bury 111 4294967296\r\n", [BAD], "bury a pri above u32"),
    case(b"kick-job a111\r\n", [BAD], "kick-job a111"),
    case(b"kick-job 111a\r\n", [BAD], "kick-job 111a"),
    case(b"kick-job !@#!@#\r\n", [BAD], "kick-job punctuation"),
    case(b"delete foo111\r\n", [BAD], "delete foo111"),
    case(b"delete 111foo\r\n", [BAD], "delete 111foo"),
    case(b"delete 184467440737095516160000\r\n", [BAD], "delete far above u64"),
    case(b"put 512 -1 100 0\r\n", [BAD], "testserv negative_delay"),
    case(b"put -!@#$%^&*() 0 100 0\r\n", [BAD], "testserv garbage_priority"),
    case(b"put -1 0 100 0\r\n", [BAD], "testserv negative_priority"),
    case(b"put 4294967296 0 100 0\r\n", [BAD], "testserv too_big_priority"),
    case(b"put 4294967295 0 100 1\r\nA\r\n", [C("put", U32, 0, 100, 1, body=b"A")],
         "testserv max_priority"),
    case(b"stats-job 111ABC\r\n", [BAD], "stats-job 111ABC"),
    case(b"stats-job 111 222\r\n", [BAD], "stats-job 111 222"),
    case(b"release 18446744073709551616 1 1\r\n", [BAD], "release an id above u64"),
    case(b"release 111abc 1 1\r\n", [BAD], "release a bad id"),
    case(b"release 1 abc 1\r\n", [BAD], "release a bad pri"),
    case(b"release 1 1 abc\r\n", [BAD], "release a bad delay"),
    case(b"release 1 4294967296 1\r\n", [BAD], "release a pri above u32"),
    case(b"reserve-job 18446744073709551616\r\n", [BAD], "reserve-job above u64"),
    case(b"reserve-job 1x\r\n", [BAD], "reserve-job with a suffix"),
]

TOO_BIG_CASES = [  # beanstalkd -z 10 (testserv.c, cttest_too_big)
    case(b"put 0 0 1 10\r\n0123456789\r\n", [C("put", 0, 0, 1, 10, body=b"0123456789")],
         "a body at a limit of 10", limit=10),
    case(b"put 0 0 1 11\r\n0123456789X\r\n" + FOLLOWER, [TOO_BIG, FOLLOWED],
         "a body over a limit of 10", limit=10),
    case(b"put 0 0 1 11 trailing-garbage\r\n0123456789X\r\n" + FOLLOWER, [TOO_BIG, FOLLOWED],
         "size is checked before trailing garbage", limit=10),
    case(b"put 0 0 1 11\r\n0123456789\r\n\r\n" + FOLLOWER, [TOO_BIG, UNKNOWN],   # LF + follower
         "the drain takes exactly size plus 2", limit=10),
    case(b"put 0 0 1 11\r\n0123456789X\r\nput 0 0 1 1\r\nA\r\n",
         [TOO_BIG, C("put", 0, 0, 1, 1, body=b"A")], "a put after a drain", limit=10),
]
ALL_CASES = CASES + TOO_BIG_CASES


@pytest.mark.parametrize("data, expected, limit", ALL_CASES)
def test_a_reference_case_parses_as_beanstalkd_does_when_sent_whole(data, expected, limit):
    assert feed(data, max_job_size=limit) == (expected, 0)


@pytest.mark.parametrize("data, expected, limit", ALL_CASES)
def test_a_reference_case_parses_the_same_one_byte_at_a_time(data, expected, limit):
    assert feed(data, chunk=1, max_job_size=limit) == (expected, 0)


@pytest.mark.parametrize("data, expected, limit", ALL_CASES)
def test_a_reference_case_leaves_the_following_command_intact(data, expected, limit):
    assert feed(data + FOLLOWER, max_job_size=limit) == (expected + [FOLLOWED], 0)
    assert feed(data + FOLLOWER, chunk=7, max_job_size=limit) == (expected + [FOLLOWED], 0)


# -- buffering, draining and bounded memory --

def test_job_too_big_waits_for_the_last_byte_of_the_drain():
    parser = Parser(max_job_size=10)
    for piece in (b"put 0 0 1 11\r\n", b"01234", b"56789X\r"):
        parser.receive_data(piece)
        assert parser.next_event() is NEED_DATA
    parser.receive_data(b"\n")
    assert parser.next_event() == TOO_BIG
    assert parser.next_event() is NEED_DATA


def test_a_put_body_is_held_until_its_crlf_arrives():
    parser = Parser()
    parser.receive_data(b"put 0 0 1 5\r\nhel")
    assert parser.next_event() is NEED_DATA
    assert parser.buffered == 3
    parser.receive_data(b"lo\r")
    assert parser.next_event() is NEED_DATA
    parser.receive_data(b"\n")
    assert parser.next_event() == C("put", 0, 0, 1, 5, body=b"hello")
    assert parser.buffered == 0


def test_a_partial_line_is_buffered_and_counted():
    parser = Parser()
    parser.receive_data(b"delete 12")
    assert parser.next_event() is NEED_DATA
    assert parser.buffered == 9
    parser.receive_data(b"\r\n")
    assert parser.next_event() == C("delete", 12)
    assert parser.buffered == 0


def test_a_one_gib_oversized_body_is_drained_without_being_buffered():
    # testserv job_size_max_plus_1: -z 1 GiB, a 1 GiB + 1 put gives JOB_TOO_BIG after a full drain
    size = (1 << 30) + 1
    parser = Parser(max_job_size=1 << 30)
    parser.receive_data(b"put 0 0 1 %d\r\n" % size)
    assert parser.next_event() is NEED_DATA
    chunk = bytes(1 << 20)
    left = size + 2
    while left > len(chunk):
        parser.receive_data(chunk)
        left -= len(chunk)
        assert parser.next_event() is NEED_DATA
        assert parser.buffered == 0
    parser.receive_data(chunk[:left] + FOLLOWER)
    assert parser.next_event() == TOO_BIG
    assert parser.next_event() == FOLLOWED


def test_an_over_long_line_gives_one_bad_format_and_keeps_memory_bounded():
    parser = Parser()
    for _ in range(200):
        parser.receive_data(b"x" * 65536)
        assert parser.next_event() is NEED_DATA
        assert parser.buffered <= 1
    parser.receive_data(b"\r")
    assert parser.next_event() is NEED_DATA
    assert parser.buffered == 1          # a CR that may start the CRLF is kept
    parser.receive_data(b"\n" + FOLLOWER)
    assert parser.next_event() == BAD
    assert parser.next_event() == FOLLOWED
    assert parser.next_event() is NEED_DATA


def test_a_short_line_never_holds_more_than_223_bytes():
    parser = Parser()
    parser.receive_data(b"y" * 223)
    assert parser.next_event() is NEED_DATA
    assert parser.buffered == 223
    parser.receive_data(b"y")
    assert parser.next_event() is NEED_DATA
    assert parser.buffered <= 1


def test_a_changed_max_job_size_applies_to_the_next_put():
    parser = Parser(max_job_size=65535)
    parser.receive_data(b"put 0 0 1 5\r\nhello\r\nput 0 0 1 5\r\nhello\r\n")
    assert parser.next_event() == C("put", 0, 0, 1, 5, body=b"hello")
    parser.max_job_size = 4
    assert parser.next_event() == TOO_BIG


def test_a_dropped_parser_is_freed_without_the_cycle_collector():
    gc.disable()
    try:
        parser = Parser()
        parser.receive_data(b"put 0 0 1 5\r\nhel")
        parser.next_event()
        ref = weakref.ref(parser)
        del parser
        assert ref() is None
    finally:
        gc.enable()


def test_need_data_is_one_named_sentinel():
    assert repr(NEED_DATA) == "NEED_DATA"
    assert Parser().next_event() is NEED_DATA


# -- dispatch --

LINE_TOKENS = [
    b"put ", b"peek", b"peek ", b"-ready", b"-delayed", b"-buried", b"reserve", b"-with-timeout",
    b"-job", b"delete ", b"release ", b"bury ", b"kick", b"kick ", b"-job ", b"touch ", b"stats",
    b"stats-", b"job ", b"tube ", b"tube", b"use ", b"watch ", b"ignore ", b"list-tube", b"s",
    b"-used", b"-watched", b"quit", b"pause-tube", b"pause-tube ", b" ", b"  ", b"0", b"1", b"7",
    b"4294967295", b"4294967296", b"18446744073709551616", b"-", b"+", b"x", b"default", b"\t",
    b"\x00", b"\r", b"\n", b"a" * 100,
]
line_text = st.lists(st.sampled_from(LINE_TOKENS), max_size=8).map(b"".join)


@given(line_text)
def test_the_word_lookup_agrees_with_the_prefix_walk(line):
    assert which_cmd(line) == which_cmd_by_prefix(line)


def test_every_prefix_is_found_by_the_word_lookup():
    for entry in COMMANDS:
        assert which_cmd(entry.prefix + b"1") == which_cmd_by_prefix(entry.prefix + b"1") == entry


# -- properties --

STREAM_TOKENS = LINE_TOKENS + [b"\r\n", b"\r\n", b"\r\n", b"put 0 0 1 3\r\n", b"abc", b"x" * 223,
                               b"x" * 230]
stream = st.one_of(
    st.binary(max_size=600),
    st.lists(st.one_of(st.sampled_from(STREAM_TOKENS), st.binary(max_size=8)), max_size=40).map(b"".join),
)


def drain_events(parser: Parser) -> list:
    out = []
    while (event := parser.next_event()) is not NEED_DATA:
        assert isinstance(event, (Command, Reject))
        out.append(event)
    return out


@settings(max_examples=300, deadline=None)
@given(stream)
def test_arbitrary_bytes_only_ever_yield_events(data):
    parser = Parser(max_job_size=16)
    parser.receive_data(data)
    drain_events(parser)
    assert parser.buffered < 224     # at most a partial line or a partial 16-byte body


@settings(max_examples=300, deadline=None)
@given(stream, st.lists(st.integers(min_value=0, max_value=2000), max_size=12))
def test_any_chunking_of_the_same_input_yields_the_same_events(data, cuts):
    whole = Parser(max_job_size=16)
    whole.receive_data(data)
    expected = drain_events(whole)
    bounds = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    for pieces in ([data[a:b] for a, b in zip(bounds, bounds[1:])],    # random cuts
                   [data[i:i + 1] for i in range(len(data))]):          # one byte at a time
        chunked = Parser(max_job_size=16)
        got = []
        for piece in pieces:
            chunked.receive_data(piece)
            got += drain_events(chunked)
        assert got == expected
        assert chunked.buffered == whole.buffered


# Each item is (bytes sent, the one event it must give, or None for "any one event").
name = st.text("abcXYZ019-+/;.$_()", min_size=1, max_size=20).filter(lambda s: s[0] != "-")
u32 = st.integers(0, U32)
valid_command = st.one_of(
    st.sampled_from(["reserve", "stats", "list-tubes", "list-tube-used", "list-tubes-watched",
                     "peek-ready", "peek-delayed", "peek-buried", "quit"]).map(
        lambda n: (n.encode() + b"\r\n", C(n))),
    st.tuples(st.sampled_from(["delete", "touch", "peek", "kick-job", "stats-job", "reserve-job"]),
              st.integers(0, U64)).map(lambda t: (b"%s %d\r\n" % (t[0].encode(), t[1]), C(t[0], t[1]))),
    st.tuples(st.sampled_from(["use", "watch", "ignore", "stats-tube"]), name).map(
        lambda t: (f"{t[0]} {t[1]}\r\n".encode(), C(t[0], t[1]))),
    st.tuples(st.integers(0, U64), u32, u32).map(
        lambda t: (b"release %d %d %d\r\n" % t, C("release", *t))),
    st.tuples(name, u32).map(lambda t: (f"pause-tube {t[0]} {t[1]}\r\n".encode(), C("pause-tube", *t))),
)
good_put = st.tuples(u32, u32, u32, st.binary(max_size=40)).map(
    lambda t: (b"put %d %d %d %d\r\n%s\r\n" % (*t[:3], len(t[3]), t[3]),
               C("put", t[0], t[1], t[2] or 1, len(t[3]), body=t[3])))
big_put = st.binary(min_size=41, max_size=120).map(
    lambda b: (b"put 0 0 1 %d\r\n%s\r\n" % (len(b), b), TOO_BIG))
crlf_less_put = st.tuples(st.binary(max_size=40), st.binary(min_size=2, max_size=2)).filter(
    lambda t: t[1] != b"\r\n").map(lambda t: (b"put 0 0 1 %d\r\n%s%s" % (len(t[0]), t[0], t[1]), NO_CRLF))
bad_line = st.one_of(st.binary(max_size=30), st.binary(min_size=220, max_size=460)).filter(
    lambda b: b"\r\n" not in b and not b.startswith(b"put ")).map(lambda b: (b + b"\r\n", None))
command_mix = st.lists(st.one_of(valid_command, good_put, big_put, crlf_less_put, bad_line), max_size=25)


@settings(max_examples=200, deadline=None)
@given(command_mix, st.integers(1, 64))
def test_every_command_sent_gives_exactly_one_event(items, chunk):
    data = b"".join(sent for sent, _ in items)
    got = events(data, chunk=chunk, max_job_size=40)
    assert len(got) == len(items)
    for event, (_, expected) in zip(got, items):
        assert expected is None or event == expected


PUT_NUMBERS = [b"0", b"00", b"7", b"60", b"65535", b"4294967295", b"4294967296",
               b"18446744073709551616", b"+1", b"-1", b"1_0", b"", b"x", b"\t1"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PUT_NUMBERS), min_size=4, max_size=4))
def test_a_put_line_parses_the_same_whether_its_numbers_were_seen_before_or_not(numbers):
    line = b"put " + b" ".join(numbers) + b"\r\n" + b"x" * 7 + b"\r\n"

    def events() -> list:
        parser = Parser(max_job_size=16)
        parser.receive_data(line)
        return drain_events(parser)

    beanstalk_codec._SPELLED.clear()
    first = events()                    # the spellings not known yet
    assert events() == first            # now known (if they were all digits)
