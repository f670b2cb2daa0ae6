"""Keep-alive to an upstream's servers end to end: a broker, an HTTP front and a dispatcher
process call a server that counts requests per TCP connection (tests/support/
counting_http.py), through the upstream's own pool in the dispatcher (workers/upstream/keepalive.py)."""
from __future__ import annotations

import time

import pytest

from counting_http import CountingServer
from servers import self_check, wait_for
from test_upstreams_end_to_end import cluster, enqueue, finished

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")


def test_a_connection_is_reused_for_at_most_keepalive_requests_calls_and_idles_out(tmp_path):
    with CountingServer() as server:
        config = (f'[upstreams.gpu]\nkeepalive_requests = 3\nkeepalive_timeout = "1s"\n'
                  f'servers = [{{ url = "{server.url}" }}]\n'
                  '[functions.gen]\nupstream = "gpu"\npath = "/"\nconcurrency = 1\n')
        with cluster(tmp_path, config) as api:
            infos = finished(api, enqueue(api, 10))
            assert {i["status"] for i in infos} == {"success"}
            idle_from = time.monotonic()
            # the fourth connection, after its one call, idles out: the dispatcher closes it
            # after keepalive_timeout (aiohttp looks every second: within two, and slack)
            assert wait_for(lambda: len(server.connections) == 4 and all(
                c.closed_at is not None for c in server.connections), 30)
            assert server.connections[3].closed_at - idle_from <= 15    # (the client's close:
            # the server closes only after a request that says close, and none did)
        assert [c.requests for c in server.connections] == [3, 3, 3, 1]
        assert [c.closing for c in server.connections] == [[3], [3], [3], []]
