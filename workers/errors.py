"""The exceptions of the SDK: what the broker answered (ZstalkError, named after the
reply code), a broker that speaks no common worker-protocol version, and the two a
handler raises to choose its job's fate (Retry, Bury)."""
from __future__ import annotations


class ZstalkError(Exception):
    """The broker answered with an error reply; `reply` is its name (e.g. "OUT_OF_MEMORY")."""

    def __init__(self, reply: str, detail: str = "") -> None:
        super().__init__(f"{reply}: {detail}" if detail else reply)
        self.reply = reply


class WorkerVersionError(ZstalkError):
    """SUBSCRIBE got BAD_VERSION: the broker speaks worker protocol versions min..max only."""

    def __init__(self, ours: tuple[int, int], theirs: tuple[int, int]) -> None:
        super().__init__("BAD_VERSION", f"this worker speaks versions {ours[0]}..{ours[1]}, "
                                        f"the broker {theirs[0]}..{theirs[1]}")
        self.ours, self.theirs = ours, theirs


class Retry(Exception):
    """Raise from a handler to release its job now: back to ready after `delay_s`,
    with priority `pri` (None: the job's own).  Not counted against max_attempts."""

    def __init__(self, delay_s: int = 0, pri: int | None = None) -> None:
        super().__init__(f"retry in {delay_s} s")
        self.delay_s, self.pri = u32("delay_s", delay_s), _pri(pri)


class Bury(Exception):
    """Raise from a handler to bury its job (priority `pri`, None: the job's own)."""

    def __init__(self, pri: int | None = None) -> None:
        super().__init__("bury")
        self.pri = _pri(pri)


def u32(what: str, value: object) -> int:
    """beanstalkd's priorities and delays are whole numbers 0..2**32-1: refuse the rest
    where the handler made them, not as a BAD_FORMAT from the broker later."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 32:
        raise ValueError(f"{what} must be an int from 0 to 2**32-1, not {value!r}")
    return value


def _pri(pri: object) -> int | None:
    return None if pri is None else u32("pri", pri)


def tube_name(name: object) -> str:
    """A tube name as beanstalkd accepts it (1-200 of A-Za-z0-9 -+/;.$_(), no leading
    '-'), or ValueError before anything is sent: a batch whose USE the broker refuses
    would put its jobs in the tube used before."""
    from ..protocol.codecs.beanstalk import is_valid_tube
    if not isinstance(name, str) or not name.isascii() or not is_valid_tube(name.encode()):
        raise ValueError(f"not a valid tube name: {name!r} (1-200 characters of "
                         "A-Za-z0-9 -+/;.$_(), not starting with '-')")
    return name
