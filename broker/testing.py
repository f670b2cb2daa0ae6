"""In-process broker for users' unit tests: the real broker actor, not a mock
(`zstalk.broker.testing.LocalBroker`; `zstalk.workers.testing` before 0.2).

`LocalBroker()` binds the actor (broker/actor.py) to `inproc://zstalk-<random>` on a
zmq Context it shares with the clients and workers it hands out, and runs its loop in
a daemon thread (no signal handlers) until the context manager exits.  A pool still
working on it then (`work` in another thread) is stopped first, and `work` raises there:
the context must not be destroyed under a pool's sockets, each later touch of which
would raise ZMQError in that thread.

    with LocalBroker() as broker:
        broker.client().put(b"hello", tube="emails")
        counts = broker.work(worker)          # until no job is ready or reserved
"""
from __future__ import annotations

import contextlib
import secrets
import threading
from typing import Any

import zmq

from ..workers.client import Client
from ..workers.codecs import Codec
from ..workers.worker import Worker
from .actor import BrokerActor
from .core.broker import Config


class LocalBroker:
    def __init__(self, max_job_size: int = 65535, max_jobs_bytes: int = 0) -> None:
        self.ctx = zmq.Context()
        self.endpoint = f"inproc://zstalk-{secrets.token_hex(8)}"
        self.actor = BrokerActor(self.endpoint, Config(max_job_size=max_job_size,
                                                       max_jobs_bytes=max_jobs_bytes),
                                 ctx=self.ctx)
        self.thread = threading.Thread(target=self.actor.run, kwargs={"signals": False},
                                       name="zstalk-local-broker", daemon=True)
        self.clients: list[Client] = []
        self.pools: set = set()         # pools working here (Worker.run_until_idle's `track`)
        self._pools_changed = threading.Condition()
        self.thread.start()

    def client(self, codec: Codec | None = None, timeout_s: float = 5.0) -> Client:
        """A producer Client on this broker (closed with the broker)."""
        c = Client(self.endpoint, timeout_s=timeout_s, ctx=self.ctx,
                   **({"codec": codec} if codec is not None else {}))
        self.clients.append(c)
        return c

    def work(self, worker: Worker, until_idle: bool = True, timeout_s: float = 10.0,
             wait_delayed: bool = False) -> dict[str, int]:
        """Run `worker` in this thread until its tubes are idle (see Worker.run_until_idle)."""
        if not until_idle:
            raise ValueError("LocalBroker.work only runs until idle (use a thread for more)")
        return worker.run_until_idle(self, timeout_s=timeout_s, wait_delayed=wait_delayed)

    def track(self, pool: Any, working: bool) -> None:
        """A pool starts or stops working on this broker (called in the pool's thread)."""
        with self._pools_changed:
            (self.pools.add if working else self.pools.discard)(pool)
            self._pools_changed.notify_all()

    def close(self) -> None:
        for c in self.clients:
            c.close()
        self._stop_pools()
        self.actor.stop()
        self.thread.join(timeout=5.0)
        self.ctx.destroy(linger=0)      # a socket left open by a test must not hang us

    def _stop_pools(self, wait_s: float = 5.0) -> None:
        """Pools still working here (in other threads) fail, and close their own sockets,
        before the context goes."""
        with self._pools_changed:
            for pool in self.pools:
                error = RuntimeError(f"the LocalBroker at {self.endpoint} closed while this "
                                     f"pool still worked on {', '.join(pool.tubes)}")
                with contextlib.suppress(RuntimeError):     # (its loop closed meanwhile)
                    pool.loop.call_soon_threadsafe(pool.fail, error)
            self._pools_changed.wait_for(lambda: not self.pools, wait_s)

    def __enter__(self) -> "LocalBroker":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
