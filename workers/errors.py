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
        self.delay_s, self.pri = int(delay_s), pri


class Bury(Exception):
    """Raise from a handler to bury its job (priority `pri`, None: the job's own)."""

    def __init__(self, pri: int | None = None) -> None:
        super().__init__("bury")
        self.pri = pri
