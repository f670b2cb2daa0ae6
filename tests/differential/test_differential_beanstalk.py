# Differential tests: the same byte scripts go to the reference beanstalkd and to
# zstalk, and the transcripts must match byte for byte.
#
# A script is a list of steps, run in order: (connection, bytes to send, replies
# to read), plus Sleep, Close, HalfClose, Trickle (send one byte at a time) and
# Await (a barrier: poll `stats-tube` on a side connection until a counter
# reaches a value, so a script never guesses how long the server needs to
# notice a blocked reserve or a closed connection). Connections open on first
# use. After the last step every open connection must stay silent for a moment.
#
# Before comparing, replies are normalised for what differs by nature (pid,
# uptime, rusage, version, random id, uname fields) and for the 1.12 → 1.13
# change that quotes YAML strings (beanstalkd CHANGELOG 1.13, #592): a 1.13 speaker must
# quote, its quotes are removed and `OK <bytes>` recomputed, so both sides read
# as 1.12. Scripts whose bytes unavoidably cross a second boundary name the
# keys (age, time-left, …) they loosen.
#
# Each script runs on both sides at once (two threads) against a fresh server.
# The `cluster` variant points the same scripts at a broker with two fronts:
# connection i talks to front i % 2; select it with `-k cluster`.
#
# What 1.12 and 1.13 answer differently on purpose is checked on zstalk only, at
# the end of this module, with the expected bytes written out from the reference
# (reserve-with-timeout arguments, the 223-byte + CRLF line, quoted YAML).
from __future__ import annotations

import difflib
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from servers import Address, RawClient, ReplyTimeout, self_check, silence_on_all

SILENCE_S = 0.1
BARRIER_TIMEOUT_S = 5.0


# -- steps and scripts ----------------------------------------------------------


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Close:
    conn: int


@dataclass(frozen=True)
class HalfClose:
    """shutdown(SHUT_WR): the server sees EOF but may still answer."""

    conn: int


@dataclass(frozen=True)
class Trickle:
    """Send `data` one byte per packet, then read `replies`."""

    conn: int
    data: bytes
    replies: int


@dataclass(frozen=True)
class Await:
    """Barrier: `stats-tube tube` shows key == value (key None: the tube is gone)."""

    tube: str
    key: str | None = None
    value: int | None = None


@dataclass(frozen=True)
class Script:
    name: str
    steps: tuple
    max_job_size: int | None = None
    loose: frozenset = frozenset()

    def __str__(self) -> str:
        return self.name


def script(name: str, *steps, z: int | None = None, loose: tuple[str, ...] = ()) -> Script:
    return Script(name, steps, z, frozenset(loose))


def put(body: bytes = b"A", pri: int = 0, delay: int = 0, ttr: int = 10) -> bytes:
    return b"put %d %d %d %d\r\n%s\r\n" % (pri, delay, ttr, len(body), body)


def each(command: bytes, arguments: list[bytes], conn: int = 0) -> list[tuple[int, bytes, int]]:
    """One step per argument: `command argument\r\n`, one reply each."""
    return [(conn, command + argument + b"\r\n", 1) for argument in arguments]


NAME_200 = b"a" * 200
NAME_201 = b"a" * 201
ALL_NAME_CHARS = b"a-b+c/d;e.f$g_h(i)"
UINT32_MAX = b"4294967295"
UINT64_MAX = b"18446744073709551615"
# Single-id arguments that must be BAD_FORMAT (prot.c read_u64 with no end pointer: digits
# only, no sign, nothing after).
BAD_IDS = [b"1 ", b"1x", b"x1", b"-1", b"+1", b"", b"0x1", b"18446744073709551616"]


SCRIPTS: list[Script] = [
    # command matching (prot.c, which_cmd) ------------------------------------
    script("an_unknown_word_an_empty_line_and_a_leading_space_are_unknown_commands",
           (0, b"foo\r\n", 1), (0, b"\r\n", 1), (0, b" use a\r\n", 1), (0, b"USE a\r\n", 1),
           (0, b"Stats\r\n", 1), (0, b"list-tube-used\r\n", 1)),
    script("a_line_holding_a_nul_byte_is_bad_format",
           (0, b"use a\x00b\r\n", 1), (0, b"list-tube-used\x00\r\n", 1), (0, b"\x00\r\n", 1),
           (0, b"list-tube-used\r\n", 1)),
    script("commands_without_arguments_must_have_their_exact_length",
           *[(0, line + b"\r\n", 1) for line in [
               b"reserve ", b"reservex", b"stats ", b"statsx", b"stats-tubes", b"stats-tube",
               b"list-tubes ", b"list-tubesx", b"list-tube-used ", b"list-tubes-watched ",
               b"peek-ready ", b"peek-delayed ", b"peek-buried ", b"reserve-with-timeout",
               b"reserve-job", b"stats-job", b"pause-tube"]]),
    script("commands_that_take_arguments_are_unknown_without_their_space",
           *[(0, word + b"\r\n", 1) for word in [
               b"put", b"delete", b"peek", b"kick", b"use", b"watch", b"ignore", b"release",
               b"bury", b"touch", b"kick-job"]]),
    script("quit_closes_the_connection_without_a_reply",
           (0, b"list-tube-used\r\n", 1), (0, b"quit\r\n", 1)),
    script("a_line_that_starts_with_quit_closes_the_connection_too", (0, b"quitx\r\n", 1)),
    script("commands_pipelined_after_quit_are_never_answered",
           (0, b"quit\r\nlist-tube-used\r\n", 1)),
    script("pause_tube_finds_its_tube_name_after_any_number_of_spaces_or_none",
           (0, b"pause-tubedefault 0\r\n", 1), (0, b"pause-tube  default 0\r\n", 1),
           (0, b"pause-tube default  0\r\n", 1)),
    script("two_commands_in_one_packet_get_two_replies_in_order",
           (0, b"use a\r\nuse b\r\n", 2), (0, b"list-tube-used\r\n", 1)),
    script("a_whole_job_lifecycle_pipelined_in_one_packet_is_answered_in_order",
           (0, put(b"hello") + b"reserve\r\ntouch 1\r\nrelease 1 0 0\r\nreserve\r\n"
               b"delete 1\r\nstats-job 1\r\n", 7)),
    script("a_put_arriving_one_byte_at_a_time_parses_like_a_whole_one",
           Trickle(0, b"put 0 0 10 5\r\nhe\r\no\r\n", 1), Trickle(0, b"peek 1\r\n", 1)),
    script("a_job_body_split_across_packets_is_put_together_again",
           (0, b"put 0 0 10 10\r\n01234", 0), (0, b"56789", 0), (0, b"\r", 0), (0, b"\n", 1),
           (0, b"list-tube-used\r", 0), (0, b"\n", 1), (0, b"peek 1\r\n", 1)),

    # single-connection sequences the random scripts rarely reach ----------------
    script("the_default_tube_is_never_removed_even_when_nobody_uses_or_watches_it",
           (0, b"use zz\r\nwatch zz\r\nignore default\r\n", 3), (0, b"list-tubes\r\n", 1),
           (0, b"stats-tube default\r\n", 1), (0, b"pause-tube default 0\r\n", 1),
           (0, b"list-tubes\r\n", 1)),
    script("a_tube_that_empties_while_watched_by_one_connection_stays_listed",
           (0, b"use t\r\nwatch t\r\n", 2), (0, put(b"x"), 1), (0, b"reserve-with-timeout 0\r\n", 1),
           (0, b"delete 1\r\nlist-tubes\r\nstats-tube t\r\n", 3),
           (0, b"ignore t\r\nuse default\r\nlist-tubes\r\nstats-tube t\r\n", 4)),
    script("kick_in_an_empty_tube_kicks_nothing",
           (0, b"kick 10\r\nuse e\r\nkick 1\r\nkick-job 99\r\n", 4)),

    # numbers (prot.c, read_u32 / read_u64; kick uses strtoul) -----------------
    script("numbers_may_have_leading_spaces_and_leading_zeros",
           (0, b"put  0 0 1 1\r\nA\r\n", 1), (0, b"put 0  0 1 1\r\nB\r\n", 1),
           (0, b"put 007 0 010 1\r\nC\r\n", 1), (0, b"stats-job 3\r\n", 1),
           (0, b"stats-job  3\r\n", 1), (0, b"peek 003\r\n", 1)),
    script("put_accepts_the_largest_uint32_priority_delay_and_ttr",
           (0, b"put " + UINT32_MAX + b" 0 " + UINT32_MAX + b" 1\r\nA\r\n", 1),
           (0, b"put 0 " + UINT32_MAX + b" 1 1\r\nB\r\n", 1),
           (0, b"stats-job 1\r\n", 1), (0, b"stats-job 2\r\n", 1), (0, b"peek-delayed\r\n", 1)),
    script("put_numbers_above_uint32_are_bad_format_and_leave_the_body_as_a_command",
           (0, b"put 4294967296 0 1 1\r\nA\r\n", 2), (0, b"put 0 4294967296 1 1\r\nA\r\n", 2),
           (0, b"put 0 0 4294967296 1\r\nA\r\n", 2),
           (0, b"put 99999999999999999999999 0 1 1\r\nA\r\n", 2)),
    script("a_put_with_bad_format_leaves_its_body_to_be_read_as_a_command",
           *[(0, b"put " + args + b"\r\nlist-tube-used\r\n", 2) for args in [
               b"-1 0 10 14", b"+1 0 10 14", b"0\t0 10 14", b"0 0 10 14 ", b"0x10 0 10 14",
               b"1.5 0 10 14", b"0 -1 10 14", b"0 0 10", b"0 0 10 14 5", b"a 0 10 14"]],
           (0, b"stats-job 1\r\n", 1)),
    script("a_put_without_its_space_or_after_a_space_is_unknown_and_so_is_its_body",
           (0, b"put\t0 0 1 1\r\nA\r\n", 2), (0, b" put 0 0 1 1\r\nA\r\n", 2),
           (0, b"PUT 0 0 1 1\r\nA\r\n", 2)),
    script("job_ids_are_parsed_as_uint64",
           (0, put(), 1),
           (0, b"delete " + UINT64_MAX + b"\r\n", 1), (0, b"delete 18446744073709551616\r\n", 1),
           (0, b"delete 0\r\n", 1), (0, b"peek " + UINT64_MAX + b"\r\n", 1),
           (0, b"peek 99999999999999999999999\r\n", 1), (0, b"delete 3x\r\n", 1),
           (0, b"delete  1\r\n", 1)),
    *[script(f"{command}_rejects_malformed_ids",
             (0, put(), 1), (0, b"reserve\r\n", 1),
             *each(command.replace("_", "-").encode() + b" ", BAD_IDS),
             (0, b"list-tube-used\r\n", 1))
      for command in ["delete", "peek", "touch", "kick_job", "reserve_job", "stats_job"]],
    script("release_bury_and_touch_need_exactly_their_arguments",
           (0, put(), 1), (0, b"reserve\r\n", 1),
           *[(0, line + b"\r\n", 1) for line in [
               b"release 1 0", b"release 1 0 0 0", b"release 1 -1 0", b"release 1 0 -1",
               b"release x 0 0", b"release 1 4294967296 0", b"release 1 0 4294967296",
               b"release 1 0 0 ", b"bury 1", b"bury 1 x", b"bury 1 0 0", b"bury 1 -1",
               b"touch 1 1"]],
           (0, b"stats-job 1\r\n", 1), (0, b"release 1 0 0\r\n", 1)),
    script("kick_reads_its_bound_loosely",
           (0, put(b"A") + put(b"B") + put(b"C") + put(b"D"), 4),
           (0, b"reserve\r\nreserve\r\nreserve\r\nreserve\r\n", 4),
           (0, b"bury 1 0\r\nbury 2 0\r\nbury 3 0\r\nbury 4 0\r\n", 4),
           *each(b"kick ", [b"1x", b"1 junk", b"  1", b"x", b"99999999999999999999", b"",
                            b"0", b"+1"]),
           (0, b"stats\r\n", 1)),
    script("kick_minus_one_wraps_around_and_kicks_every_buried_job",
           (0, put(b"A") + put(b"B") + b"reserve\r\nreserve\r\nbury 1 0\r\nbury 2 0\r\n", 6),
           (0, b"kick -1\r\n", 1), (0, b"kick -1\r\n", 1), (0, b"stats-tube default\r\n", 1)),
    script("reserve_with_timeout_accepts_leading_spaces_and_trailing_junk",
           (0, b"reserve-with-timeout 0 junk\r\n", 1), (0, b"reserve-with-timeout  0\r\n", 1),
           (0, b"reserve-with-timeout 00\r\n", 1), (0, put(), 1),
           (0, b"reserve-with-timeout 0x\r\n", 1)),
    script("pause_tube_checks_its_delay_before_its_name_and_counts_before_the_name",
           *each(b"pause-tube ", [b"default", b"default -1", b"default 1 ", b"default 4294967296",
                                  b"default x", b"-x 1", b"nosuch 1", b"a*b 1", b"default 0"]),
           (0, b"stats\r\n", 1), (0, b"stats-tube default\r\n", 1)),

    # names (protocol.txt, "Protocol"; prot.c, is_valid_tube) ------------------
    script("every_name_character_is_allowed_in_a_tube_name",
           (0, b"use " + ALL_NAME_CHARS + b"\r\n", 1), (0, b"use 9\r\n", 1),
           (0, b"watch x_y\r\n", 1), (0, b"watch " + ALL_NAME_CHARS + b"\r\n", 1),
           (0, b"list-tubes\r\n", 1), (0, b"list-tubes-watched\r\n", 1),
           (0, b"stats-tube " + ALL_NAME_CHARS + b"\r\n", 1)),
    script("a_200_byte_tube_name_is_accepted_and_201_bytes_is_bad_format",
           (0, b"use " + NAME_200 + b"\r\n", 1), (0, b"list-tube-used\r\n", 1),
           (0, b"watch " + NAME_200 + b"\r\n", 1), (0, b"stats-tube " + NAME_200 + b"\r\n", 1),
           (0, b"use " + NAME_201 + b"\r\n", 1), (0, b"watch " + NAME_201 + b"\r\n", 1),
           (0, b"ignore " + NAME_201 + b"\r\n", 1), (0, b"stats-tube " + NAME_201 + b"\r\n", 1),
           (0, b"list-tubes-watched\r\n", 1)),
    script("malformed_tube_names_are_bad_format",
           *each(b"use ", [b"-foo", b"foo bar", b"foo ", b" foo", b"a*b", b"a:b", b'"a"',
                           b"\xc3\xa9", b"a\tb"]),
           *each(b"watch ", [b"-x", b"a*b"]), *each(b"ignore ", [b"-bad", b""]),
           *each(b"stats-tube ", [b"-x", b"a b"]),
           (0, b"list-tube-used\r\n", 1), (0, b"list-tubes-watched\r\n", 1)),
    script("stats_tube_and_pause_tube_of_a_missing_tube_are_not_found",
           (0, b"stats-tube nosuch\r\n", 1), (0, b"pause-tube nosuch 1\r\n", 1),
           (0, b"list-tubes\r\n", 1)),

    # line length (LINE_BUF_SIZE in dat.h: 224 bytes) ---------------------------
    script("the_longest_command_of_224_bytes_is_accepted",
           (0, b"use " + NAME_200 + b"\r\n", 1),
           (0, b"pause-tube " + NAME_200 + b" " + UINT32_MAX + b"\r\n", 1),
           (0, b"stats-tube " + NAME_200 + b"\r\n", 1)),
    script("lines_of_223_and_224_bytes_are_read_whole",
           (0, b"x" * 221 + b"\r\n", 1), (0, b"x" * 222 + b"\r\n", 1),
           (0, b"list-tube-used\r\n", 1)),
    script("a_226_byte_line_is_bad_format_and_the_next_line_is_answered",
           (0, b"x" * 224 + b"\r\nlist-tube-used\r\n", 2)),
    script("a_10000_byte_line_is_bad_format_once_and_the_connection_stays_in_sync",
           (0, b"y" * 9998 + b"\r\n", 1), (0, b"list-tube-used\r\n", 1)),
    script("an_over_long_put_line_is_bad_format_and_its_body_is_read_as_a_command",
           (0, b"put 0 0 10 14" + b" " * 220 + b"\r\nlist-tube-used\r\n", 2)),
    script("an_over_long_line_in_pieces_is_answered_once_its_crlf_arrives",
           (0, b"z" * 300, 0), (0, b"z" * 300, 0), (0, b"\r\n", 1),
           (0, b"list-tube-used\r\n", 1)),

    # job size, JOB_TOO_BIG, EXPECTED_CRLF (prot.c) -------------------------------
    script("with_z_10_a_ten_byte_job_fits_and_eleven_bytes_is_too_big",
           (0, b"put 0 0 1 10\r\n0123456789\r\n", 1),
           (0, b"put 0 0 1 11\r\n0123456789X\r\nlist-tube-used\r\n", 2),
           (0, b"put 0 0 1 1\r\nA\r\n", 1), (0, b"peek 1\r\n", 1), z=10),
    script("job_too_big_waits_for_the_whole_body_before_answering",
           (0, b"put 0 0 1 11\r\n", 0), (0, b"01234", 0), (0, b"56789X\r", 0), (0, b"\n", 1),
           (0, b"put 0 0 1 1\r\nA\r\n", 1), z=10),
    script("job_too_big_is_checked_before_trailing_garbage",
           (0, b"put 0 0 1 11 trailing-garbage\r\n0123456789X\r\nlist-tube-used\r\n", 2),
           (0, b"put 0 0 1 10 x\r\nlist-tube\r\n", 2), z=10),
    script("job_too_big_counts_as_a_put_but_uses_no_job_id",
           (0, b"put 0 0 1 11\r\n0123456789X\r\n", 1), (0, b"put 0 0 1 12\r\n0123456789XY\r\n", 1),
           (0, put(b"ok"), 1), (0, b"stats\r\n", 1), z=10),
    script("the_default_limit_accepts_65535_bytes_and_rejects_65536",
           (0, put(b"m" * 65535), 1), (0, put(b"n" * 65536), 1), (0, b"peek 1\r\n", 1),
           (0, b"stats-job 1\r\n", 1)),
    script("a_job_size_above_uint32_is_bad_format_and_nothing_is_drained",
           (0, b"put 0 0 1 4294967296\r\nA\r\n", 2), (0, b"put 0 0 1 10b\r\nA\r\n", 2),
           (0, b"put 0 0 1 -1\r\nA\r\n", 2), (0, b"put 0 0 1 x\r\nA\r\n", 2)),
    script("a_body_without_its_crlf_is_expected_crlf_and_uses_up_a_job_id",
           (0, b"put 0 0 1 1\r\nab\r\n", 1), (0, b"list-tube-used\r\n", 1),
           (0, b"put 0 0 1 1\r\nA\r\n", 1), (0, b"peek 1\r\n", 1), (0, b"stats\r\n", 1)),
    script("a_body_ending_in_lf_alone_is_expected_crlf",
           (0, b"put 0 0 1 3\r\nabc\n\r\n", 1), (0, b"list-tube-used\r\n", 1),
           (0, b"put 0 0 1 0\r\nX\r\n", 1), (0, b"\r\n", 1)),
    script("bodies_may_hold_crlf_nul_and_whole_commands",
           (0, b"put 0 0 1 4\r\na\r\nb\r\n", 1), (0, put(b"\x00\r\x00\n\x00"), 1),
           (0, put(b"use evil\r\nquit\r\n"), 1), (0, b"list-tube-used\r\n", 1),
           (0, b"peek 1\r\n", 1), (0, b"reserve\r\nreserve\r\nreserve\r\n", 3)),
    script("a_zero_byte_body_round_trips",
           (0, b"put 0 0 10 0\r\n\r\n", 1), (0, b"peek 1\r\n", 1), (0, b"peek-ready\r\n", 1),
           (0, b"reserve\r\n", 1), (0, b"stats-job 1\r\n", 1), (0, b"delete 1\r\n", 1)),

    # reserve, timeouts, TTR, DEADLINE_SOON, ordering (protocol.txt, "reserve") ---
    script("reserve_with_timeout_zero_answers_at_once",
           (0, b"reserve-with-timeout 0\r\n", 1), (0, put(), 1),
           (0, b"reserve-with-timeout 0\r\n", 1), (0, b"stats\r\n", 1)),
    script("reserve_with_timeout_one_times_out_even_while_another_connection_waits",
           (0, b"reserve\r\n", 0), Await("default", "current-waiting", 1),
           (1, b"reserve-with-timeout 1\r\n", 1), (1, put(), 1), (0, b"", 1),
           (1, b"stats\r\n", 1)),
    script("a_blocked_reserve_gets_the_job_another_connection_puts",
           (0, b"watch other\r\n", 1), (0, b"reserve\r\n", 0),
           Await("other", "current-waiting", 1),
           (1, b"stats-tube other\r\n", 1), (1, b"stats\r\n", 1), (1, b"use other\r\n", 1),
           (1, put(b"job"), 1), (0, b"", 1), (1, b"stats-tube other\r\n", 1)),
    script("ttr_zero_becomes_one_and_large_ttrs_are_kept_exactly",
           (0, put(ttr=0), 1), (0, put(ttr=120), 1), (0, put(ttr=21600), 1),
           (0, put(ttr=86400 * 49), 1),
           (0, b"stats-job 1\r\nstats-job 2\r\nstats-job 3\r\nstats-job 4\r\n", 4)),
    # TTR expiry. Debian's 1.12 sometimes loses a holder's TTR timer until that
    # connection sends another command (seen alone ~1 run in 10, and nearly
    # always while another connection is busy). So each script waits well past
    # the deadline, then lets the holder send a neutral `list-tube-used`, which
    # changes nothing on a correct server, before looking at the outcome.
    script("deadline_soon_comes_at_once_for_a_held_ttr_1_job_which_then_times_out",
           (0, put(ttr=1), 1), (0, b"reserve\r\n", 1), (0, b"reserve-with-timeout 10\r\n", 1),
           Sleep(1.5), (0, b"list-tube-used\r\n", 1), (0, b"stats-job 1\r\n", 1),
           (0, b"release 1 0 0\r\n", 1), (1, b"reserve-with-timeout 0\r\n", 1),
           (1, b"stats-job 1\r\ndelete 1\r\n", 2), (0, b"stats\r\n", 1),
           loose=("age",)),
    script("a_blocked_reserve_is_woken_with_deadline_soon_when_the_safety_margin_starts",
           (0, put(ttr=2), 1), (0, b"reserve\r\n", 1), (0, b"reserve\r\n", 1),
           (0, b"release 1 0 0\r\n", 1), (0, b"stats-job 1\r\n", 1),
           loose=("age",)),
    script("a_job_whose_ttr_runs_out_goes_to_a_connection_waiting_in_reserve",
           (0, put(ttr=2), 1), (0, b"reserve\r\n", 1), (0, b"reserve\r\n", 1),
           (1, b"reserve-with-timeout 10\r\n", 0), Sleep(1.5), (0, b"list-tube-used\r\n", 1),
           (1, b"", 1), (0, b"release 1 0 0\r\n", 1), (1, b"stats-job 1\r\ndelete 1\r\n", 2),
           loose=("age", "time-left")),
    script("reserve_job_never_answers_deadline_soon_but_its_job_times_out_like_any_other",
           (0, put(ttr=1), 1), (0, b"reserve-job 1\r\n", 1),
           (0, b"reserve-with-timeout 10\r\n", 1), (0, put(b"B"), 1),
           (0, b"reserve-job 2\r\n", 1), Sleep(1.5), (0, b"list-tube-used\r\n", 1),
           (1, b"reserve-with-timeout 0\r\n", 1), (1, b"stats-job 1\r\ndelete 1\r\n", 2),
           (0, b"release 2 0 0\r\n", 1), loose=("age",)),
    script("reserve_takes_a_ready_job_instead_of_answering_deadline_soon",
           (0, put(b"X", pri=1, ttr=1), 1), (0, b"reserve\r\n", 1), (0, put(b"Y", pri=0), 1),
           (0, b"reserve-with-timeout 0\r\n", 1), (0, b"release 2 0 0\r\n", 1),
           (0, b"reserve-with-timeout 0\r\n", 1)),
    script("reserve_job_takes_a_job_from_any_state_and_any_tube",
           (0, b"use t1\r\n", 1), (0, put(b"ready"), 1), (0, put(b"delayed", delay=100), 1),
           (0, put(b"buried"), 1), (0, b"reserve-job 3\r\n", 1), (0, b"bury 3 7\r\n", 1),
           (0, b"reserve-job 1\r\nreserve-job 2\r\nreserve-job 3\r\n", 3),
           (0, b"stats-tube t1\r\n", 1), (0, b"stats-job 2\r\n", 1), (0, b"stats-job 3\r\n", 1),
           (0, b"release 1 0 0\r\nrelease 2 0 0\r\nrelease 3 0 0\r\n", 3),
           (0, b"stats-tube t1\r\n", 1)),
    script("reserve_job_of_a_reserved_or_missing_job_is_not_found",
           (0, put(), 1), (0, b"reserve-job 1\r\n", 1), (0, b"reserve-job 1\r\n", 1),
           (1, b"reserve-job 1\r\n", 1), (1, b"reserve-job 2\r\n", 1),
           (1, b"reserve-job 0\r\n", 1)),
    script("ordering_is_by_priority_then_id_across_watched_tubes",
           *[(0, b"use %s\r\n" % tube + put(b"%d" % n, pri=pri), 2) for n, (tube, pri) in
             enumerate([(b"a", 5), (b"b", 5), (b"a", 1), (b"b", 5), (b"a", 4294967295),
                        (b"b", 0)], start=1)],
           (0, b"watch a\r\nwatch b\r\nignore default\r\n", 3),
           (0, b"reserve\r\n" * 6, 6), (0, b"reserve-with-timeout 0\r\n", 1)),
    script("ties_are_broken_by_job_id_not_by_release_time",
           (0, put(b"X") + put(b"Y"), 2), (0, b"reserve\r\n", 1), (0, b"release 1 0 0\r\n", 1),
           (0, b"reserve\r\n", 1), (0, b"release 1 1 0\r\n", 1), (0, b"reserve\r\n", 1),
           (0, b"reserve\r\n", 1)),
    script("jobs_in_unwatched_tubes_are_not_reserved",
           (0, b"use other\r\n", 1), (0, put(), 1), (0, b"reserve-with-timeout 0\r\n", 1),
           (0, b"peek-ready\r\n", 1), (0, b"watch other\r\n", 1),
           (0, b"reserve-with-timeout 0\r\n", 1)),
    script("delayed_jobs_that_become_ready_go_by_priority_then_id",
           (0, put(b"L", delay=2), 1), (0, put(b"S", delay=1), 1), (0, put(b"R", pri=9), 1),
           (0, b"stats-tube default\r\n", 1), (0, b"peek-delayed\r\n", 1),
           Await("default", "current-jobs-ready", 3),
           (0, b"stats-tube default\r\n", 1), (0, b"reserve\r\nreserve\r\nreserve\r\n", 3)),
    script("closing_a_connection_puts_its_reserved_jobs_back_at_once",
           (0, put(b"A", ttr=100) + put(b"B", ttr=100), 2), (1, b"reserve\r\nreserve\r\n", 2),
           Close(1), Await("default", "current-jobs-ready", 2),
           (0, b"stats-job 1\r\n", 1), (0, b"stats-job 2\r\n", 1), (0, b"stats\r\n", 1)),
    script("quit_puts_the_reserved_jobs_back_at_once",
           (0, put(ttr=100), 1), (1, b"reserve\r\n", 1), (1, b"quit\r\n", 1),
           Await("default", "current-jobs-ready", 1), (0, b"stats-job 1\r\n", 1),
           (0, b"reserve\r\n", 1)),
    script("a_half_closed_connection_waiting_in_reserve_gets_timed_out_then_eof",
           (0, b"reserve\r\n", 0), Await("default", "current-waiting", 1), HalfClose(0),
           (0, b"", 2), Await("default", "current-waiting", 0), (1, b"stats\r\n", 1)),
    script("a_half_closed_idle_connection_is_closed",
           (0, b"list-tube-used\r\n", 1), HalfClose(0), (0, b"", 1)),

    # pipelines past a waiting reserve: beanstalkd reads a connection's next command only
    # once its reserve is answered, so later commands take their ids and counts after it
    script("commands_pipelined_behind_a_waiting_reserve_run_after_it_with_later_ids",
           (0, b"reserve\r\n" + put(b"mine") + b"use t\r\nstats-tube default\r\n", 0),
           Await("default", "current-waiting", 1), (1, b"stats\r\n", 1),
           (1, put(b"wake"), 1), (0, b"", 4), (1, b"stats-job 2\r\nstats\r\n", 2)),
    script("pipelined_reserves_take_the_ready_jobs_then_wait_out_their_timeouts",
           (0, put(b"A") + put(b"B"), 2),
           (0, b"reserve\r\nreserve-with-timeout 1\r\nreserve-with-timeout 1\r\n"
               b"list-tube-used\r\ndelete 1\r\ndelete 2\r\n", 6), (0, b"stats\r\n", 1)),
    script("a_pipelined_reserve_with_a_timeout_gets_a_job_put_while_it_waits",
           (0, b"reserve-with-timeout 5\r\nreserve-with-timeout 0\r\n"
               b"stats-tube default\r\n", 0),
           Await("default", "current-waiting", 1), (1, put(b"x") + put(b"y"), 2), (0, b"", 3)),
    script("quit_behind_a_waiting_reserve_closes_once_the_reserve_is_answered",
           (0, b"reserve\r\nquit\r\n", 0), Await("default", "current-waiting", 1),
           (1, put(), 1), (0, b"", 2), Await("default", "current-jobs-ready", 1),
           (1, b"stats-job 1\r\n", 1)),
    script("half_close_behind_a_waiting_reserve_times_it_out_then_runs_what_follows",
           (0, b"reserve\r\nlist-tube-used\r\nreserve-with-timeout 5\r\nreserve\r\n", 0),
           Await("default", "current-waiting", 1), HalfClose(0), (0, b"", 5),
           (1, b"stats\r\n", 1)),
    script("half_close_after_a_pipelined_reserve_got_its_job_times_out_the_next_one",
           (0, b"reserve\r\nreserve\r\n", 0), Await("default", "current-waiting", 1),
           (1, put(), 1), (0, b"", 1), Await("default", "current-waiting", 1), HalfClose(0),
           (0, b"", 2), Await("default", "current-jobs-ready", 1), (1, b"stats-job 1\r\n", 1)),

    # cross-connection rules, touch, ids (prot.c, dispatch_cmd) --------------------
    script("another_connections_reserved_job_is_not_found_for_every_command",
           (0, put(), 1), (0, b"reserve\r\n", 1),
           *[(1, line + b"\r\n", 1) for line in [
               b"delete 1", b"touch 1", b"release 1 0 0", b"bury 1 0", b"kick-job 1",
               b"reserve-job 1", b"peek 1", b"stats-job 1"]],
           (0, b"touch 1\r\n", 1), (0, b"delete 1\r\n", 1)),
    script("any_connection_may_delete_ready_delayed_and_buried_jobs",
           (0, put(b"ready") + put(b"delayed", delay=100) + put(b"buried"), 3),
           (0, b"reserve-job 3\r\nbury 3 0\r\n", 2),
           (1, b"touch 2\r\n", 1), (1, b"bury 1 0\r\n", 1), (1, b"release 1 0 0\r\n", 1),
           (1, b"delete 1\r\n", 1), (1, b"delete 2\r\n", 1), (1, b"delete 3\r\n", 1),
           (1, b"delete 3\r\n", 1), (0, b"stats-tube default\r\n", 1)),
    script("a_deleted_job_is_not_found_by_any_command",
           (0, put(), 1), (0, b"reserve\r\n", 1), (0, b"delete 1\r\n", 1),
           *[(0, line + b"\r\n", 1) for line in [
               b"delete 1", b"release 1 0 0", b"bury 1 0", b"touch 1", b"peek 1",
               b"stats-job 1", b"kick-job 1", b"reserve-job 1"]]),
    script("touch_pushes_the_deadline_of_a_reserved_job_back_to_a_full_ttr",
           (0, put(ttr=3), 1), (0, b"reserve\r\n", 1), Sleep(1.2), (0, b"stats-job 1\r\n", 1),
           (0, b"touch 1\r\n", 1), (0, b"stats-job 1\r\n", 1), (0, b"bury 1 0\r\n", 1),
           (0, b"touch 1\r\n", 1), loose=("age",)),
    script("job_ids_grow_by_one_and_are_never_reused",
           (0, put(), 1), (0, b"delete 1\r\n", 1), (0, put(), 1),
           (0, b"put -1 0 1 1\r\nA\r\n", 2), (0, put(), 1), (0, b"peek 1\r\n", 1)),

    # tubes, watch lists, pause, kick, peek (protocol.txt; prot.c) --------------------
    script("a_new_connection_uses_and_watches_default",
           (0, b"list-tube-used\r\n", 1), (0, b"list-tubes-watched\r\n", 1),
           (0, b"list-tubes\r\n", 1), (0, b"stats-tube default\r\n", 1)),
    script("ignoring_the_last_watched_tube_is_not_ignored",
           (0, b"ignore default\r\n", 1), (0, b"watch a\r\n", 1), (0, b"ignore default\r\n", 1),
           (0, b"ignore a\r\n", 1), (0, b"list-tubes-watched\r\n", 1)),
    script("watching_twice_and_ignoring_an_unwatched_tube_change_nothing",
           (0, b"watch default\r\n", 1), (0, b"watch a\r\n", 1), (0, b"watch a\r\n", 1),
           (0, b"ignore nosuch\r\n", 1), (0, b"list-tubes-watched\r\n", 1),
           (0, b"list-tubes\r\n", 1)),
    script("list_tubes_removes_a_freed_tube_by_moving_the_last_one_into_its_place",
           (0, b"watch t1\r\nwatch t2\r\nwatch t3\r\n", 3), (0, b"list-tubes\r\n", 1),
           (0, b"ignore t1\r\n", 1), (0, b"list-tubes\r\n", 1), (0, b"watch t4\r\n", 1),
           (0, b"list-tubes\r\n", 1), (0, b"stats\r\n", 1)),
    script("list_tubes_watched_removes_by_moving_the_last_one_too",
           (0, b"watch w1\r\nwatch w2\r\nwatch w3\r\n", 3), (0, b"ignore default\r\n", 1),
           (0, b"list-tubes-watched\r\n", 1), (0, b"list-tubes\r\n", 1)),
    script("a_tube_used_only_by_a_closed_connection_disappears",
           (1, b"use t1\r\n", 1), (0, b"list-tubes\r\n", 1), (0, b"stats-tube t1\r\n", 1),
           Close(1), Await("t1"), (0, b"list-tubes\r\n", 1), (0, b"stats-tube t1\r\n", 1)),
    script("a_tube_that_holds_jobs_outlives_its_last_user",
           (0, b"use t2\r\n", 1), (0, put(), 1), (0, b"use default\r\n", 1),
           (0, b"list-tubes\r\n", 1), (0, b"stats-tube t2\r\n", 1), (0, b"delete 1\r\n", 1),
           (0, b"list-tubes\r\n", 1), (0, b"stats-tube t2\r\n", 1)),
    script("use_decides_where_put_and_the_peek_commands_look",
           (0, b"use a\r\n", 1), (0, put(b"in-a"), 1), (0, b"peek-ready\r\n", 1),
           (0, b"use default\r\n", 1), (0, put(b"in-default"), 1), (0, b"use b\r\n", 1),
           (0, b"peek-ready\r\npeek-delayed\r\npeek-buried\r\n", 3), (0, b"peek 1\r\n", 1),
           (0, b"peek 2\r\n", 1), (0, b"list-tube-used\r\n", 1)),
    script("peek_delayed_gives_the_soonest_deadline_and_peek_ready_the_smallest_priority",
           (0, put(b"d100", delay=100) + put(b"d50", delay=50) + put(b"d200", delay=200), 3),
           (0, put(b"p9", pri=9) + put(b"p3", pri=3) + put(b"p3b", pri=3), 3),
           (0, b"peek-delayed\r\npeek-ready\r\npeek-buried\r\n", 3)),
    script("buried_jobs_are_kicked_in_fifo_order_and_keep_their_bury_priority",
           (0, put(b"A") + put(b"B") + put(b"C"), 3),
           (0, b"reserve\r\nreserve\r\nreserve\r\n", 3),
           (0, b"bury 2 5\r\nbury 1 6\r\nbury 3 7\r\n", 3), (0, b"peek-buried\r\n", 1),
           (0, b"kick 1\r\n", 1), (0, b"peek-buried\r\n", 1), (0, b"stats-job 2\r\n", 1),
           (0, b"kick 5\r\n", 1), (0, b"reserve\r\nreserve\r\nreserve\r\n", 3)),
    script("kick_kicks_buried_jobs_before_delayed_ones",
           (0, put(b"A") + put(b"B") + put(b"C", delay=100), 3),
           (0, b"reserve\r\nreserve\r\nbury 1 7\r\nbury 2 8\r\n", 4),
           (0, b"kick 10\r\n", 1), (0, b"kick 10\r\n", 1), (0, b"kick 10\r\n", 1),
           (0, b"stats-job 1\r\nstats-job 3\r\n", 2), (0, b"stats\r\n", 1)),
    script("kick_acts_only_on_the_used_tube",
           (0, put(b"A"), 1), (0, b"reserve\r\nbury 1 0\r\n", 2), (0, b"use other\r\n", 1),
           (0, put(b"B", delay=100), 1), (0, b"kick 10\r\n", 1), (0, b"use default\r\n", 1),
           (0, b"kick 10\r\n", 1), (0, b"kick 10\r\n", 1)),
    script("kick_job_moves_a_buried_or_delayed_job_of_any_tube_to_ready",
           (0, b"use t\r\n", 1), (0, put(b"A") + put(b"B", delay=100) + put(b"C"), 3),
           (0, b"reserve-job 1\r\nbury 1 3\r\nuse default\r\n", 3), (1, b"reserve-job 3\r\n", 1),
           (0, b"kick-job 1\r\n", 1), (0, b"kick-job 1\r\n", 1), (0, b"kick-job 2\r\n", 1),
           (0, b"kick-job 3\r\n", 1), (0, b"kick-job 9\r\n", 1), (0, b"stats-job 1\r\n", 1),
           (0, b"stats-job 2\r\n", 1), (0, b"stats-tube t\r\n", 1), (0, b"stats\r\n", 1)),
    script("pause_tube_holds_back_reserve_but_not_peek_or_reserve_job",
           (0, put(), 1), (0, b"pause-tube default 100\r\n", 1),
           (0, b"reserve-with-timeout 0\r\n", 1), (0, b"peek-ready\r\n", 1),
           (0, b"stats-tube default\r\n", 1), (0, b"reserve-job 1\r\n", 1),
           (0, b"release 1 0 0\r\n", 1), (0, b"reserve-with-timeout 0\r\n", 1)),
    script("a_one_second_pause_expires_and_clears_its_stats",
           (0, put(), 1), (0, b"pause-tube default 1\r\n", 1),
           (0, b"reserve-with-timeout 0\r\n", 1), (0, b"stats-tube default\r\n", 1),
           (0, b"reserve-with-timeout 5\r\n", 1), (0, b"stats-tube default\r\n", 1)),
    script("pause_tube_zero_wakes_a_blocked_reserve",
           (0, put(), 1), (0, b"pause-tube default 100\r\n", 1), (1, b"reserve\r\n", 0),
           Await("default", "current-waiting", 1), (0, b"pause-tube default 0\r\n", 1),
           (1, b"", 1), (0, b"stats-tube default\r\n", 1)),
    script("release_with_a_delay_makes_the_job_delayed_with_its_new_priority",
           (0, put(), 1), (0, b"reserve\r\n", 1), (0, b"release 1 5 100\r\n", 1),
           (0, b"stats-job 1\r\n", 1), (0, b"peek-delayed\r\n", 1),
           (0, b"reserve-with-timeout 0\r\n", 1), (0, b"kick-job 1\r\n", 1),
           (0, b"stats-job 1\r\n", 1), (0, b"reserve\r\n", 1), (0, b"release 1 2000 0\r\n", 1),
           (0, b"stats-tube default\r\n", 1)),

    # stats, stats-job, stats-tube counters after sequences --------------------------
    script("stats_counts_every_kind_of_command",
           (0, put(), 1),
           *[(0, line + b"\r\n", 1) for line in [
               b"peek 1", b"peek-ready", b"peek-delayed", b"peek-buried", b"reserve", b"touch 1",
               b"release 1 0 0", b"reserve-job 1", b"bury 1 0", b"kick-job 1",
               b"reserve-with-timeout 0", b"bury 1 1", b"kick 1", b"use t", b"watch t",
               b"ignore t", b"stats-job 1", b"stats-tube default", b"list-tubes",
               b"list-tube-used", b"list-tubes-watched", b"pause-tube default 0", b"delete 1",
               b"stats"]]),
    script("stats_counts_not_found_commands_but_not_bad_format_ones",
           *[(0, line + b"\r\n", 1) for line in [
               b"delete 9", b"delete x", b"peek 9", b"peek x", b"release 9 0 0", b"release x",
               b"bury 9 0", b"bury x", b"touch 9", b"touch x", b"kick x", b"kick-job 9",
               b"reserve-job 9", b"stats-job 9", b"stats-job x", b"stats-tube nosuch",
               b"stats-tube -x", b"use -x", b"watch -x", b"ignore -x", b"ignore nosuch",
               b"pause-tube nosuch 1", b"pause-tube -x 1", b"pause-tube x -1", b"foo",
               b"stats"]]),
    script("stats_counts_producers_workers_and_waiting_connections",
           (0, put(), 1), (1, b"reserve\r\n", 1), (2, b"watch t\r\n", 1), (2, b"reserve\r\n", 0),
           Await("t", "current-waiting", 1),
           (0, b"stats\r\n", 1), (0, b"stats-tube default\r\n", 1), (0, b"stats-tube t\r\n", 1),
           (3, b"list-tube-used\r\n", 1), (0, put(), 1), (2, b"", 1), (3, b"stats\r\n", 1)),
    script("stats_job_follows_a_job_through_every_state",
           (0, put(pri=1, delay=100), 1), (0, b"stats-job 1\r\n", 1), (0, b"kick-job 1\r\n", 1),
           (0, b"stats-job 1\r\n", 1), (0, b"reserve\r\n", 1), (0, b"stats-job 1\r\n", 1),
           (0, b"release 1 3 0\r\n", 1), (0, b"stats-job 1\r\n", 1), (0, b"reserve\r\n", 1),
           (0, b"bury 1 4\r\n", 1), (0, b"stats-job 1\r\n", 1), (0, b"kick 1\r\n", 1),
           (0, b"stats-job 1\r\n", 1)),
    script("stats_tube_counts_jobs_by_state_and_only_successful_deletes",
           (0, b"use t\r\nwatch t\r\n", 2),
           (0, put(b"r", pri=1023) + put(b"u", pri=1024) + put(b"d", delay=100) +
            put(b"x", pri=0) + put(b"b", pri=2), 5),
           (0, b"reserve-job 4\r\nreserve-job 5\r\nbury 5 2\r\n", 3),
           (0, b"delete 99\r\ndelete 1\r\ndelete 1\r\n", 3), (0, b"stats-tube t\r\n", 1),
           (0, b"stats-tube default\r\n", 1), (0, b"stats\r\n", 1)),
    script("urgent_counts_only_ready_jobs_below_priority_1024",
           (0, put(pri=1023) + put(pri=1024) + put(pri=0, delay=100) + put(pri=0), 4),
           (0, b"reserve-job 4\r\nbury 4 0\r\n", 2), (0, b"stats-tube default\r\n", 1),
           (0, b"stats\r\n", 1)),
]


def _check_names(scripts: list[Script]) -> None:
    names = [s.name for s in scripts]
    duplicates = {name for name in names if names.count(name) > 1}
    assert not duplicates, f"duplicate script names: {duplicates}"
    # `-k cluster` must select the cluster variant and nothing else.
    assert not [name for name in names if "cluster" in name]


_check_names(SCRIPTS)


# -- normalisation ----------------------------------------------------------------

# stats keys whose values differ by nature between two processes (prot.c, fmt_stats).
NATURE_KEYS = {"pid", "uptime", "rusage-utime", "rusage-stime", "version", "id",
               "hostname", "os", "platform"}
# Strings 1.13 quotes and 1.12 does not (CHANGELOG 1.13, #592/#610), per kind of body.
QUOTED_SINCE_1_13 = {"stats": {"hostname", "os", "platform"}, "tube": {"name"},
                     "job": {"tube"}, "list": set()}


@dataclass(frozen=True)
class Normaliser:
    quoted: bool  # the server speaks 1.13 YAML (quoted strings)
    loose: frozenset = frozenset()  # further keys to mask, any body

    def __call__(self, reply: bytes) -> bytes:
        header, _, rest = reply.partition(b"\r\n")
        if not header.startswith(b"OK ") or not rest.endswith(b"\r\n"):
            return reply
        body = rest[:-2]
        if not body.startswith(b"---\n") or header != b"OK %d" % len(body):
            return reply
        kind = _body_kind(body)
        lines = [self._line(kind, line) for line in body.decode("latin-1").split("\n")]
        new_body = "\n".join(lines).encode("latin-1")
        return b"OK %d\r\n" % len(new_body) + new_body + b"\r\n"

    def _line(self, kind: str, line: str) -> str:
        key, sep, value = line.partition(": ")
        if not sep:
            return line
        if key in QUOTED_SINCE_1_13[kind]:
            value, ok = _unquote(value, self.quoted)
            if not ok:
                return f"{key}: {value}"
        if (kind == "stats" and key in NATURE_KEYS) or key in self.loose:
            value = f"<{key}>"
        return f"{key}: {value}"


def render(reply: bytes) -> list[str]:
    """A reply as transcript lines: a well-framed YAML body gets one line per
    YAML line (so a diff points at the key), anything else stays one repr."""
    header, _, rest = reply.partition(b"\r\n")
    body = rest[:-2]
    if header.startswith(b"OK ") and rest.endswith(b"\r\n") and header == b"OK %d" % len(body):
        return [repr(header + b"\r\n")] + [f"    {line!r}" for line in body.split(b"\n")]
    return [repr(reply)]


def _body_kind(body: bytes) -> str:
    if body.startswith(b"---\nid: "):
        return "job"
    if body.startswith(b"---\nname: "):
        return "tube"
    if b"\npid: " in body:
        return "stats"
    return "list"


def _unquote(value: str, quoted: bool) -> tuple[str, bool]:
    if not quoted:
        return value, True
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1], True
    return f"<1.13 quotes this, got {value}>", False


# -- running a script ----------------------------------------------------------------


class _Aborted(Exception):
    pass


class ScriptRun:
    """Runs one script against one server (or one cluster) and keeps a transcript."""

    def __init__(self, addresses: list[Address], normalise: Normaliser):
        self.addresses = addresses
        self.normalise = normalise
        self.clients: dict[int, RawClient] = {}
        self.finished: set[int] = set()  # closed by us, or EOF already read
        self.transcript: list[str] = []
        self.side: RawClient | None = None

    def run(self, script: Script) -> list[str]:
        try:
            if any(isinstance(step, Await) for step in script.steps):
                self.side = RawClient(self.addresses[0])
            for step in script.steps:
                self._step(step)
            self._expect_silence()
        except _Aborted as why:
            self.transcript.append(f"!! {why}")
        finally:
            for client in [*self.clients.values(), self.side]:
                if client is not None:
                    client.close()
        return self.transcript

    def _client(self, conn: int) -> RawClient:
        if conn in self.finished:
            raise _Aborted(f"script bug: connection {conn} is already closed")
        if conn not in self.clients:
            try:
                self.clients[conn] = RawClient(self.addresses[conn % len(self.addresses)])
            except OSError as error:
                raise _Aborted(f"{conn} cannot connect: {error}") from None
        return self.clients[conn]

    def _step(self, step) -> None:
        if isinstance(step, tuple):
            conn, data, replies = step
            self._send(conn, data, [data] if data else [])
            self._read(conn, replies)
        elif isinstance(step, Trickle):
            self._send(step.conn, step.data, [bytes([b]) for b in step.data], "one byte at a time")
            self._read(step.conn, step.replies)
        elif isinstance(step, Sleep):
            self.transcript.append(f"sleep {step.seconds:g} s")
            time.sleep(step.seconds)
        elif isinstance(step, Close):
            self._client(step.conn).close()
            self.finished.add(step.conn)
            self.transcript.append(f"{step.conn} closes")
        elif isinstance(step, HalfClose):
            self._client(step.conn).shutdown_write()
            self.transcript.append(f"{step.conn} shuts down its sending side")
        elif isinstance(step, Await):
            self._await(step)
        else:
            raise TypeError(f"unknown step {step!r}")

    def _send(self, conn: int, data: bytes, packets: list[bytes], how: str = "") -> None:
        client = self._client(conn)
        if data:
            self.transcript.append(f"{conn} > {data!r}" + (f" ({how})" if how else ""))
        try:
            for packet in packets:
                client.send(packet)
                if len(packets) > 1:
                    time.sleep(0.001)
        except OSError as error:
            raise _Aborted(f"{conn} send failed: {error}") from None

    def _read(self, conn: int, replies: int) -> None:
        client = self._client(conn)
        for _ in range(replies):
            try:
                reply = client.read_reply()
            except ReplyTimeout as error:
                raise _Aborted(f"{conn} no complete reply within {client.timeout:g} s; "
                               f"got {error.partial!r}") from None
            except OSError as error:
                raise _Aborted(f"{conn} {error}") from None
            if reply == b"":
                self.transcript.append(f"{conn} < EOF")
                self.finished.add(conn)
                return
            self.transcript += [f"{conn} < {line}" for line in render(self.normalise(reply))]

    def _await(self, step: Await) -> None:
        """Poll stats-tube on the side connection. Only the barrier itself goes
        into the transcript, not the polls (their number depends on timing)."""
        self.transcript.append(f"await {step.tube} {step.key or 'gone'}"
                               + ("" if step.key is None else f" = {step.value}"))
        deadline = time.monotonic() + BARRIER_TIMEOUT_S
        reply = b""
        while time.monotonic() < deadline:
            try:
                self.side.send(b"stats-tube %s\r\n" % step.tube.encode())
                reply = self.side.read_reply()
            except OSError as error:
                raise _Aborted(f"barrier connection failed: {error}") from None
            if step.key is None and reply == b"NOT_FOUND\r\n":
                return
            if step.key is not None and f"\n{step.key}: {step.value}\n".encode() in reply:
                return
            time.sleep(0.01)
        raise _Aborted(f"barrier timed out after {BARRIER_TIMEOUT_S:g} s; last {reply!r}")

    def _expect_silence(self) -> None:
        live = {conn: c for conn, c in self.clients.items() if conn not in self.finished}
        for (conn, _), (data, eof) in zip(live.items(), silence_on_all(live.values(), SILENCE_S)):
            if data:
                self.transcript.append(f"{conn} !! unexpected {data!r}")
            if eof:
                self.transcript.append(f"{conn} !! unexpected EOF")


def run_both(script: Script, reference: list[Address], candidate: list[Address],
             reference_normaliser: Normaliser, candidate_normaliser: Normaliser):
    with ThreadPoolExecutor(max_workers=2) as pool:
        expected = pool.submit(ScriptRun(reference, reference_normaliser).run, script)
        actual = pool.submit(ScriptRun(candidate, candidate_normaliser).run, script)
        return expected.result(), actual.result()


# -- fixtures ---------------------------------------------------------------------------

TARGETS = [pytest.param("server", id="server"),
           pytest.param("cluster", id="cluster", marks=pytest.mark.cluster)]


@pytest.fixture(params=TARGETS)
def target(request) -> str:
    return request.param


@pytest.fixture
def start_candidate(target, zstalk_factory, zstalk_cluster):
    """start(max_job_size) -> (addresses, loose keys) for zstalk serve or a 2-front cluster."""

    def start(max_job_size: int | None = None) -> tuple[list[Address], frozenset]:
        if target == "cluster":
            cluster = zstalk_cluster(fronts=2, max_job_size=max_job_size)
            # The readiness probe connects once to every front (and the broker),
            # so total-connections cannot match a single reference server.
            return cluster.front_addresses, frozenset({"total-connections"})
        return [zstalk_factory(max_job_size=max_job_size).address], frozenset()

    return start


# -- the differential test ---------------------------------------------------------------


@pytest.mark.reference
@pytest.mark.parametrize("script", SCRIPTS, ids=str)
def test_zstalk_answers_like_beanstalkd(script, beanstalkd_factory, beanstalkd_dialect,
                                         start_candidate):
    reference = beanstalkd_factory(max_job_size=script.max_job_size)
    candidate, target_loose = start_candidate(script.max_job_size)

    loose = script.loose | target_loose
    if any(isinstance(step, Await) for step in script.steps):
        loose |= {"cmd-stats-tube"}  # the barrier polls stats-tube a varying number of times
    reference_quotes = beanstalkd_dialect >= (1, 13)
    candidate_quotes = reference_quotes if self_check() else True
    expected, actual = run_both(script, [reference.address], candidate,
                                Normaliser(reference_quotes, loose),
                                Normaliser(candidate_quotes, loose))

    broken = [line for line in expected if "!!" in line]
    assert not broken, (f"the script is wrong: the reference beanstalkd "
                        f"{beanstalkd_dialect} did not follow it:\n" + "\n".join(expected))
    assert actual == expected, "zstalk differs from beanstalkd:\n" + "\n".join(
        difflib.unified_diff(expected, actual, "beanstalkd", "zstalk", lineterm=""))


# -- zstalk only: where 1.13 (and zstalk) answer differently from 1.12 on purpose -----


@pytest.fixture
def zstalk_addresses(start_candidate) -> list[Address]:
    if self_check():
        pytest.skip("self-check mode runs beanstalkd 1.12, which differs here by design")
    return start_candidate()[0]


@pytest.mark.zstalk_only
@pytest.mark.parametrize("argument", [b"abc", b"-1", b"4294967296", b"2147483648", b"", b"+1"])
def test_reserve_with_timeout_rejects_what_1_13_rejects_and_stays_in_sync(argument,
                                                                          zstalk_addresses):
    # prot.c since 1.13 (#607): read_u32 then <= INT_MAX, so all of these are BAD_FORMAT
    # (1.12 answered TIMED_OUT or blocked forever). A ready job must not be taken.
    with RawClient(zstalk_addresses[0]) as client:
        client.send(b"put 0 0 10 1\r\nA\r\n")
        assert client.read_reply() == b"INSERTED 1\r\n"
        client.send(b"reserve-with-timeout " + argument + b"\r\nlist-tube-used\r\n")
        assert client.read_replies(2) == [b"BAD_FORMAT\r\n", b"USING default\r\n"]
        client.send(b"reserve-with-timeout 2147483647\r\n")
        assert client.read_reply() == b"RESERVED 1 1\r\nA\r\n"
        client.expect_silence(SILENCE_S)


@pytest.mark.zstalk_only
@pytest.mark.parametrize("length", [225, 449], ids=["223_bytes_and_crlf", "447_bytes_and_crlf"])
def test_a_line_whose_cr_ends_a_224_byte_chunk_is_bad_format_and_the_next_line_is_answered(
        length, zstalk_addresses):
    # Observed on 1.12 and 1.13: beanstalkd reads a line in 224-byte chunks (prot.c),
    # loses the CR at a chunk boundary and swallows the next line too; zstalk
    # deliberately answers that next line.
    with RawClient(zstalk_addresses[0]) as client:
        client.send(b"x" * (length - 2) + b"\r\nlist-tube-used\r\n")
        assert client.read_replies(2) == [b"BAD_FORMAT\r\n", b"USING default\r\n"]
        client.expect_silence(SILENCE_S)


@pytest.mark.zstalk_only
def test_stats_tube_and_stats_job_quote_tube_names_like_1_13(zstalk_addresses):
    # Bytes as captured from beanstalkd HEAD 25085c5, just after 1.13 (with this test's
    # counters).
    with RawClient(zstalk_addresses[0]) as client:
        client.send(b"stats-tube default\r\n")
        assert client.read_reply() == (
            b'OK 267\r\n---\nname: "default"\ncurrent-jobs-urgent: 0\ncurrent-jobs-ready: 0\n'
            b'current-jobs-reserved: 0\ncurrent-jobs-delayed: 0\ncurrent-jobs-buried: 0\n'
            b'total-jobs: 0\ncurrent-using: 1\ncurrent-watching: 1\ncurrent-waiting: 0\n'
            b'cmd-delete: 0\ncmd-pause-tube: 0\npause: 0\npause-time-left: 0\n\r\n')
        client.send(b"put 0 0 10 1\r\nA\r\nreserve\r\nstats-job 1\r\n")
        replies = client.read_replies(3)
        # (on a loaded machine a second may pass between the put, the reserve and the
        # stats-job: then age 1 or time-left 8, as beanstalkd would say too)
        age = int(re.search(rb"\nage: (\d+)\n", replies[2]).group(1))
        left = int(re.search(rb"\ntime-left: (\d+)\n", replies[2]).group(1))
        assert age in (0, 1) and left in (8, 9)
        assert replies == [
            b"INSERTED 1\r\n", b"RESERVED 1 1\r\nA\r\n",
            b'OK 149\r\n---\nid: 1\ntube: "default"\nstate: reserved\npri: 0\nage: %d\n'
            b'delay: 0\nttr: 10\ntime-left: %d\nfile: 0\nreserves: 1\ntimeouts: 0\n'
            b'releases: 0\nburies: 0\nkicks: 0\n\r\n' % (age, left)]


@pytest.mark.zstalk_only
def test_stats_quotes_hostname_os_and_platform_like_1_13(zstalk_addresses):
    with RawClient(zstalk_addresses[0]) as client:
        client.send(b"stats\r\n")
        reply = client.read_reply()
    header, _, body = reply.partition(b"\r\n")
    assert header == b"OK %d" % (len(body) - 2)
    for key in (b"version", b"hostname", b"os", b"platform"):
        assert re.search(rb'\n%s: "[^"\n]*"\n' % key, body), f"{key!r} is not quoted in {body!r}"


# -- the normaliser itself (no server needed) ------------------------------------------

_JOB_1_12 = (b"OK 147\r\n---\nid: 1\ntube: default\nstate: reserved\npri: 0\nage: 1\ndelay: 0\n"
             b"ttr: 10\ntime-left: 9\nfile: 0\nreserves: 1\ntimeouts: 0\nreleases: 0\n"
             b"buries: 0\nkicks: 0\n\r\n")
_JOB_1_13 = _JOB_1_12.replace(b"OK 147", b"OK 149").replace(b"tube: default", b'tube: "default"')


def test_normalising_turns_1_13_quoted_names_into_1_12_and_recounts_the_bytes():
    assert Normaliser(quoted=True)(_JOB_1_13) == Normaliser(quoted=False)(_JOB_1_12) == _JOB_1_12


def test_normalising_flags_a_1_13_speaker_that_leaves_names_unquoted():
    assert Normaliser(quoted=True)(_JOB_1_12) != _JOB_1_12


def test_normalising_masks_what_differs_by_nature_but_keeps_counters():
    body = (b'---\ncmd-put: 2\npid: 9692\nversion: "1.13"\nuptime: 3\nid: 7b158ada0a7f446a\n'
            b'hostname: "vm"\nos: "#1 SMP"\nplatform: "x86_64"\n')
    reply = b"OK %d\r\n%s\r\n" % (len(body), body)
    masked = (b"---\ncmd-put: 2\npid: <pid>\nversion: <version>\nuptime: <uptime>\nid: <id>\n"
              b"hostname: <hostname>\nos: <os>\nplatform: <platform>\n")
    assert Normaliser(quoted=True)(reply) == b"OK %d\r\n%s\r\n" % (len(masked), masked)


def test_normalising_leaves_a_reply_with_a_wrong_length_alone():
    wrong = _JOB_1_12.replace(b"OK 147", b"OK 146")
    assert Normaliser(quoted=False)(wrong) == wrong
