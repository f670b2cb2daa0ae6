"""What the journal's tests share: a 3-node NATS cluster (nats-server from its wheel,
tests/support/nats_cluster.py) per test module, started on first use."""
from __future__ import annotations

import pytest

from nats_cluster import Cluster, needs_nats_server


@pytest.fixture(scope="module")
def cluster():
    needs_nats_server()
    with Cluster(3) as c:
        yield c
