"""How many event streams an HTTP front can hold: its open-files limit, raised.

Each event stream is a connection held open, one file descriptor each, and a Linux
process starts with a soft RLIMIT_NOFILE of 1,024 (systemd's default) under a hard one of
a million or so.  The soft limit may be raised to the hard one by the process itself
(getrlimit(2)), so the front does at start (`raise_open_files`), and says how many
streams fit in what it got: the limit less the descriptors open now, the connection cap
(--http-max-connections, the requests apart from streams) and RESERVE for what the
process opens later (its broker link, logs, health probes).  The stream cap it enforces
is --http-max-streams or that, whichever is fewer: a refusal (503) is better than an
accept() that fails with EMFILE.
"""
from __future__ import annotations

import os

#: descriptors kept for what the process opens after its start
RESERVE = 64
#: the soft limit asked for when the hard one is unlimited
UNLIMITED_ASK = 1 << 20


def raise_open_files() -> int:
    """Raise the soft open-files limit to the hard one where allowed; the soft limit now."""
    try:
        import resource
    except ImportError:             # (not a Unix: nothing to raise)
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = UNLIMITED_ASK if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):       # (a container may forbid it: keep what we have)
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def open_now() -> int:
    """Descriptors this process has open (0 where /proc cannot say)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


#: the cap where neither --http-max-streams nor the open files set one
NO_CAP = 1 << 31


def stream_capacity(max_streams: int, max_connections: int) -> tuple[int, str]:
    """The streams a front may hold (its cap, `max_streams`, 0 for none of its own; or
    fewer if the open files allow fewer: then 0 may be all) after raising its open-files
    limit, and what its start line says of them."""
    files = raise_open_files()
    if not files:
        return (max_streams, f"up to {max_streams:,} event streams") if max_streams else (
            NO_CAP, "")
    fit = max(0, files - open_now() - max_connections - RESERVE)
    if max_streams and max_streams <= fit:
        return max_streams, f"up to {max_streams:,} event streams (open files {files:,})"
    return fit, (f"up to {fit:,} event streams (open files {files:,}"
                 + (f", fewer than --http-max-streams {max_streams:,})" if max_streams else ")"))
