"""Argument checks for ops from native ZeroMQ peers (worker pools and the SDK's Client).

A beanstalk front's parser only ever builds ops whose arguments beanstalkd would accept
(u32 priorities and delays, u64 ids, valid tube names, a body within the size limit),
and the broker relies on that: a float priority would break the ready-set keys and a
priority past 2**32 the binlog's records.  Native peers build ops themselves, so every
op from a front of a native kind passes `check` first.  The rules are beanstalkd's
(prot.c: read_u32, read_u64, is_valid_tube, the job size limit) and the answer is data:
BAD_FORMAT (JOB_TOO_BIG for a body over the limit), or silence for a silent op, which has
no reply to carry it.
"""
from __future__ import annotations

from ....protocol.codecs.beanstalk import is_valid_tube
from ....protocol.schema import SILENT_OPS, Op, R
from ....protocol.schema.ops import ARG, CODE, PUT_BODY

#: fronts that build ops themselves instead of parsing beanstalk's text protocol
NATIVE_KINDS = frozenset({"pool", "client"})
_U32 = 1 << 32
_U64 = 1 << 64
MAX_SUBSCRIBED_TUBES = 1024
_DELETE, _CREDIT = Op.DELETE, Op.CREDIT


def u32(x) -> bool:
    return type(x) is int and 0 <= x < _U32


def u64(x) -> bool:
    return type(x) is int and 0 <= x < _U64


def name(x) -> bool:
    return type(x) is str and x.isascii() and is_valid_tube(x.encode("ascii"))


def timeout(x) -> bool:
    return type(x) is int and -1 <= x < _U32      # -1: plain reserve


def body(x) -> bool:
    return type(x) is bytes


def versions(x) -> bool:
    return isinstance(x, (list, tuple)) and len(x) == 2 and all(u32(v) for v in x)


def names(x) -> bool:
    return (isinstance(x, (list, tuple)) and 0 < len(x) <= MAX_SUBSCRIBED_TUBES
            and all(name(n) for n in x))


def credits(x) -> bool:
    return type(x) is int and -_U32 < x < _U32


#: op -> checks of its arguments after (opcode, conn); ops missing here are refused
ARGS = {
    Op.OPEN: (), Op.CLOSE: (), Op.HALF_CLOSE: (),
    Op.PUT: (u32, u32, u32, body), Op.USE: (name,), Op.RESERVE: (timeout,),
    Op.RESERVE_JOB: (u64,), Op.DELETE: (u64,), Op.RELEASE: (u64, u32, u32),
    Op.BURY: (u64, u32), Op.TOUCH: (u64,), Op.WATCH: (name,), Op.IGNORE: (name,),
    Op.PEEK: (u64,), Op.PEEK_READY: (), Op.PEEK_DELAYED: (), Op.PEEK_BURIED: (),
    Op.KICK: (u32,), Op.KICK_JOB: (u64,), Op.STATS: (), Op.STATS_JOB: (u64,),
    Op.STATS_TUBE: (name,), Op.LIST_TUBES: (), Op.LIST_TUBE_USED: (),
    Op.LIST_TUBES_WATCHED: (), Op.PAUSE_TUBE: (name, u32),
    Op.SUBSCRIBE: (versions, names, credits), Op.CREDIT: (credits,),
}


def check(op, max_job_size: int) -> R | None:
    """None when `op` is well-formed; else the reply code (0 for a silent op: drop it).
    `op` may be anything: what is not a sequence raises TypeError (the caller's net)."""
    code = op[CODE]
    # a pool's steady traffic first, without the generic loop (a third of the cost)
    if code == _DELETE or code == _CREDIT:
        if len(op) == 3 and type(op[ARG]) is int and (0 <= op[ARG] < _U64 if code == _DELETE
                                                   else -_U32 < op[ARG] < _U32):
            return None
        return _refuse(op)
    rules = ARGS.get(code)
    if rules is None or len(op) != 2 + len(rules):
        return _refuse(op)
    for rule, arg in zip(rules, op[2:]):
        if not rule(arg):
            return _refuse(op)
    if op[CODE] == Op.PUT and len(op[PUT_BODY]) > max_job_size:
        return R.JOB_TOO_BIG
    return None


def _refuse(op) -> R | int:
    return 0 if op[CODE] in SILENT_OPS or op[CODE] == Op.COUNT else R.BAD_FORMAT
