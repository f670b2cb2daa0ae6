"""Broker replies -> beanstalk reply bytes (sans-IO; beanstalkd's protocol.txt, prot.c).

The broker answers in protocol-neutral terms (`R` codes with ints, bytes and ordered
stats pairs); this module is the one place that knows how beanstalkd spells them:
reply words, job framing (`RESERVED <id> <bytes>\\r\\n<data>\\r\\n`) and the YAML bodies
of stats and lists, with beanstalkd 1.13's quoting of string values (#592).
"""
from __future__ import annotations

from ..schema import R

#: replies that are one fixed line
WORDS: dict[int, bytes] = {
    R.DELETED: b"DELETED\r\n", R.RELEASED: b"RELEASED\r\n", R.BURIED: b"BURIED\r\n",
    R.TOUCHED: b"TOUCHED\r\n", R.NOT_IGNORED: b"NOT_IGNORED\r\n", R.PAUSED: b"PAUSED\r\n",
    R.NOT_FOUND: b"NOT_FOUND\r\n", R.TIMED_OUT: b"TIMED_OUT\r\n",
    R.DEADLINE_SOON: b"DEADLINE_SOON\r\n", R.DRAINING: b"DRAINING\r\n",
    R.OUT_OF_MEMORY: b"OUT_OF_MEMORY\r\n", R.INTERNAL_ERROR: b"INTERNAL_ERROR\r\n",
    R.KICKED_JOB: b"KICKED\r\n",
}
INTERNAL_ERROR = WORDS[R.INTERNAL_ERROR]

#: stats keys whose values beanstalkd 1.13 prints in double quotes
QUOTED_KEYS = frozenset({"version", "hostname", "os", "platform", "name", "tube"})


def format_reply(reply: tuple) -> bytes:
    """One broker reply `(conn, code, *values)` as the bytes beanstalkd would send."""
    code = reply[1]
    word = WORDS.get(code)
    if word is not None:
        return word
    if code == R.INSERTED:
        return b"INSERTED %d\r\n" % reply[2]
    if code == R.RESERVED:
        return _job(b"RESERVED", reply[2], reply[3])
    if code == R.FOUND:
        return _job(b"FOUND", reply[2], reply[3])
    if code == R.USING:
        return b"USING %s\r\n" % reply[2].encode()
    if code == R.WATCHING:
        return b"WATCHING %d\r\n" % reply[2]
    if code == R.KICKED:
        return b"KICKED %d\r\n" % reply[2]
    if code == R.STATS:
        return _ok(yaml_dict(reply[2]))
    if code == R.LIST:
        return _ok(yaml_list(reply[2]))
    return INTERNAL_ERROR


def _job(word: bytes, job_id: int, body: bytes) -> bytes:
    return b"%s %d %d\r\n%s\r\n" % (word, job_id, len(body), body)


def _ok(body: bytes) -> bytes:
    """`OK <bytes>` counts the YAML up to its last \\n, not the final CRLF (prot.c, do_stats)."""
    return b"OK %d\r\n%s\r\n" % (len(body), body)


def yaml_value(key: str, value) -> str:
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, float):
        return "%.6f" % value
    if key in QUOTED_KEYS:
        return '"%s"' % value
    return str(value)


def yaml_dict(pairs) -> bytes:
    lines = ["---\n"]
    lines += ["%s: %s\n" % (k, yaml_value(k, v)) for k, v in pairs]
    return "".join(lines).encode()


def yaml_list(names) -> bytes:
    """Names are never quoted in lists, in any version (prot.c, do_list_tubes)."""
    return ("---\n" + "".join("- %s\n" % n for n in names)).encode()
