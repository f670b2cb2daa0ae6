"""The Worker: handlers by tube, settings, and the ways to run them.

`run()` runs one pool (pool.py) on an asyncio loop in this process until SIGTERM or
SIGINT; `run(processes=N)` starts N such processes and supervises them: it forwards
SIGTERM/SIGINT, restarts one that dies unexpectedly (after a second), and returns once
they have all exited.  Children are forked, or with `spec="MODULE:ATTR"` spawned
(fresh interpreters that import the Worker by that name and take this one's broker,
concurrency and prefetch, and its root logger's level and format), which is what the CLI
does.  `run(health=PORT)` answers Kubernetes probes and /metrics on PORT (workers/probes.py
says what they mean with N processes; workers/metrics.py how the parent sums its
children's counts).
`run_until_idle()` is for tests: one pool in the caller's thread, no signals, until the
tubes have nothing ready or reserved.
"""
from __future__ import annotations

import asyncio
import importlib
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import time
from typing import Any, Callable, TypeVar

import zmq

from . import codecs
from .codecs import Codec
from .errors import WorkerVersionError, tube_name
from ..protocol.codecs.prometheus import render
from ..protocol.links.zeromq import endpoints_of
from ..protocol.network import curve
from ..protocol.network.curve import FROM_ENV
from ..protocol.network.health import link_ready, start_health
from ..protocol.network.listen import HealthOptions
from .job import Backoff
from .metrics import render_totals, resume
from .pool import Pool
from .probes import READY_HOLD_S, Slot, SlotReporter, Slots, parent_checks

DEFAULT_BROKER = "tcp://127.0.0.1:11400"
VERSION_EXIT = 3          # a pool process that can never work: not restarted
H = TypeVar("H", bound=Callable[..., Any])


class Worker:
    def __init__(self, broker: str = DEFAULT_BROKER, concurrency: int = 1,
                 prefetch: int | None = None, codec: Codec = codecs.raw, max_attempts: int = 5,
                 backoff: Backoff = Backoff(), grace_s: float = 30.0, auto_touch: bool = False,
                 logger: logging.Logger | None = None, keys=FROM_ENV) -> None:
        """`keys`: CURVE keys for a broker beyond this host (protocol/network/curve.py ClientKeys;
        by default from ZSTALK_CURVE_KEY / ZSTALK_CURVE_SERVER).  A number out of its range
        is a ValueError here: a pool would otherwise start and never run a job
        (prefetch=-2: its credits, concurrency + prefetch, are below 1), or do what
        another number says (max_attempts=0 buries as 1 does, grace_s=-1 waits as 0)."""
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency!r}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {max_attempts!r}")
        if not grace_s >= 0:
            raise ValueError(f"grace_s must be 0 or more seconds, not {grace_s!r}")
        self.broker = broker
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.codec = codec
        self.max_attempts = max_attempts
        self.backoff = backoff
        self.grace_s = grace_s
        self.auto_touch = auto_touch
        self.keys = keys
        self.logger = logger or logging.getLogger("zstalk.workers")
        self.handlers: dict[str, Callable[..., Any]] = {}
        self.last_counts: dict[str, int] = {}

    @property
    def prefetch(self) -> int | None:
        """Jobs held beyond those running; None (the default): adapt to the handlers'
        run time, about 20 ms of work, 1 to 256 jobs (pool.py, Pool._adapt)."""
        return self._prefetch

    @prefetch.setter
    def prefetch(self, value: int | None) -> None:
        if value is not None and not (isinstance(value, int) and value >= 0):
            raise ValueError(f"prefetch must be None (adapt) or a whole number of jobs from 0 "
                             f"(none held beyond the running handlers) up, not {value!r}")
        self._prefetch = value

    def handler(self, *tubes: str) -> Callable[[H], H]:
        """Decorator: `fn(job)` (def or async def) handles the jobs of these tubes."""
        if not tubes:
            raise TypeError("handler() needs at least one tube name")
        for tube in tubes:
            tube_name(tube)

        def register(fn: H) -> H:
            for tube in tubes:
                if tube in self.handlers:
                    raise ValueError(f"tube {tube!r} already has a handler")
                self.handlers[tube] = fn
            return fn
        return register

    # -- running -----------------------------------------------------------------------
    def run(self, processes: int = 1, spec: str | None = None,
            health: HealthOptions | int | None = None) -> None:
        """Work until SIGTERM / SIGINT, then shut down gracefully.  `spec`: this
        Worker's MODULE:ATTR, to spawn the processes instead of forking them.  `health`:
        a port (or HealthOptions) for GET /healthz, /readyz and /metrics; a port that cannot be
        bound raises protocol.health.HealthBindError before any work starts.  A broker
        beyond this host without CURVE keys is refused here, before any process starts
        (protocol/network/curve.py)."""
        if isinstance(self.broker, str):
            for endpoint in endpoints_of(self.broker):
                curve.check_local(endpoint, curve.given_or_env(self.keys), "worker")
        if processes < 1:
            raise ValueError(f"processes must be at least 1, not {processes!r}")
        if isinstance(health, int):
            health = HealthOptions(health)
        if processes > 1:
            code = supervise(self, processes, spec, health)
            if code:
                sys.exit(code)
            return
        asyncio.run(self._serve(health))

    async def _serve(self, health: HealthOptions | None = None,
                     slot: Slot | None = None) -> None:
        """One pool until stopped; its probes and metrics on `health`, or its state and
        counts reported to the parent in `slot` (from the counts its slot holds)."""
        pool = Pool(self, self.broker)
        if slot is not None:
            resume(pool.metrics, slot.counts, slot.index)
        pool.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, pool.request_stop)
        probes = reporter = None
        try:
            probes = await start_health(health, link_ready(pool.link, READY_HOLD_S),
                                        metrics=lambda: render(pool.samples()))
            if slot is not None:
                reporter = SlotReporter(slot, pool.link, pool.metrics)
                reporter.start()
            await pool.done
        finally:
            for closing in (probes, reporter):
                if closing is not None:
                    closing.close()
            pool.close()
            self.last_counts = dict(pool.counts)

    def run_until_idle(self, broker: Any = None, timeout_s: float = 10.0,
                       wait_delayed: bool = False) -> dict[str, int]:
        """Run one pool here until its tubes have no ready or reserved job (nor delayed
        ones, with wait_delayed); return how many jobs were deleted, released, buried.
        `broker`: a testing.LocalBroker, an endpoint, or None for self.broker.
        Raises TimeoutError when the tubes are still busy after timeout_s."""
        endpoint = getattr(broker, "endpoint", broker) or self.broker
        ctx = getattr(broker, "ctx", None)
        track = getattr(broker, "track", None)      # (a LocalBroker stops us before it closes)
        return asyncio.run(self._until_idle(endpoint, ctx, timeout_s, wait_delayed, track))

    async def _until_idle(self, endpoint: str, ctx: zmq.Context | None, timeout_s: float,
                          wait_delayed: bool, track: Callable[[Pool, bool], None] | None = None
                          ) -> dict[str, int]:
        pool = Pool(self, endpoint, ctx)
        pool.start()
        if track is not None:
            track(pool, True)
        idle = asyncio.ensure_future(pool.until_idle(timeout_s, wait_delayed))
        try:
            await asyncio.wait({idle, pool.done}, return_when=asyncio.FIRST_COMPLETED)
            if pool.done.done():
                pool.done.result()          # a fatal error (e.g. WorkerVersionError)
            if not idle.result():
                raise TimeoutError(f"tubes {pool.tubes} not idle after {timeout_s} s")
            await pool.shutdown()
        finally:
            idle.cancel()
            pool.close()
            if track is not None:
                track(pool, False)
        self.last_counts = dict(pool.counts)
        return self.last_counts


# -- processes ---------------------------------------------------------------------------
def _child(worker: Worker, slot: Slot | None = None, probes=None) -> None:
    """A pool process; `probes`: the parent's HealthServer, whose socket a forked child
    holds a copy of."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)    # not the supervisor's handlers
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if probes is not None:
        probes.release_in_child()
    try:
        asyncio.run(worker._serve(slot=slot))
    except WorkerVersionError as exc:
        worker.logger.error("%s", exc)
        sys.exit(VERSION_EXIT)


def _spawned(spec: str, settings: dict[str, Any], slot: Slot | None) -> None:
    _log_as(*settings["logging"])
    worker = load_worker(spec)
    worker.broker, worker.concurrency = settings["broker"], settings["concurrency"]
    worker.prefetch = settings["prefetch"]
    if "keys" in settings:          # else the module's own (from the environment by default)
        worker.keys = settings["keys"]
    _child(worker, slot)


def _parent_logging() -> tuple[int, logging.Formatter | None]:
    """The root logger's level and its first handler's formatter (the CLI's text or JSON
    format), for a spawned child to log as this process does (a forked one inherits
    them); no formatter when there is no handler, or one that cannot be pickled."""
    root = logging.getLogger()
    formatter = root.handlers[0].formatter if root.handlers else None
    try:
        pickle.dumps(formatter)
    except Exception:               # (a formatter of the caller's own making)
        formatter = None
    return root.level, formatter


def _log_as(level: int, formatter: logging.Formatter | None) -> None:
    if formatter is not None:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(formatter)
        logging.basicConfig(level=level, handlers=[handler])


def supervise(worker: Worker, processes: int, spec: str | None = None,
              health: HealthOptions | None = None) -> int:
    """Start `processes` pools; forward SIGTERM/SIGINT; restart crashed ones; exit code.
    With `health`, answer the pool's probes and metrics meanwhile (workers/probes.py)."""
    mp = multiprocessing.get_context("spawn" if spec else "fork")
    slots = Slots(processes, mp) if health and health.port else None
    loop, probes, pause = _parent_probes(health, slots)
    stopping: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _: stopping.append(signum))
                for sig in (signal.SIGTERM, signal.SIGINT)}

    def start(i: int) -> Any:
        slot = None
        if slots is not None:
            slots.starting(i, time.monotonic())
            slot = slots.slot(i)
        if spec:
            settings = {"broker": worker.broker, "concurrency": worker.concurrency,
                        "prefetch": worker._prefetch, "logging": _parent_logging()}
            if worker.keys is not FROM_ENV:     # (FROM_ENV is not the same object there)
                settings["keys"] = worker.keys
            return _start(mp, _spawned, (spec, settings, slot))
        return _start(mp, _child, (worker, slot, probes))

    children: list = []
    code = 0
    try:
        for i in range(processes):
            children.append(start(i))
        code = _watch(start, worker, children, stopping, pause)
    except BaseException:
        for child in children:          # (a start that failed: no orphan keeps running)
            if child.is_alive():
                child.terminate()
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if probes is not None:
            probes.close()
            loop.close()
    return code


def _parent_probes(health: HealthOptions | None, slots: Slots | None):
    """(loop, HealthServer, pause) for the supervisor: the probes, and /metrics summing
    its children's counts, on a loop that runs while the watch loop pauses; without a
    port (None, None, time.sleep).  Raises HealthBindError before any process starts."""
    if slots is None:
        return None, None, time.sleep
    loop = asyncio.new_event_loop()
    ready, alive = parent_checks(slots, health.stall_s)
    try:
        probes = loop.run_until_complete(
            start_health(health, ready, alive, lambda: render_totals(slots.counts)))
    except BaseException:
        loop.close()
        raise
    return loop, probes, lambda s: loop.run_until_complete(asyncio.sleep(s))


def _start(mp: Any, target: Callable[..., None], args: tuple) -> Any:
    p = mp.Process(target=target, args=args, daemon=False)
    p.start()
    return p


def _watch(start: Callable[[int], Any], worker: Worker, children: list,
           stopping: list[int], pause: Callable[[float], None] = time.sleep) -> int:
    forwarded, code = False, 0
    while True:
        if stopping and not forwarded:
            forwarded = True
            for c in children:
                if c.is_alive():
                    os.kill(c.pid, signal.SIGTERM)
        alive = False
        for i, c in enumerate(children):
            if c.is_alive():
                alive = True
            elif c.exitcode == VERSION_EXIT and code != VERSION_EXIT:
                code = VERSION_EXIT         # it can never work: stop the others too
                stopping.append(signal.SIGTERM)
            elif c.exitcode not in (0, None) and not stopping:
                worker.logger.warning("pool process %d exited with %s: restarting", c.pid,
                                      c.exitcode)
                pause(1.0)
                children[i], alive = start(i), True
        if not alive:
            return code
        pause(0.05)


def load_worker(spec: str) -> Worker:
    """`MODULE:ATTR` -> the Worker object (the cwd is importable, as celery and rq do)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"expected MODULE:WORKER, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    obj = getattr(importlib.import_module(module_name), attr)
    if not isinstance(obj, Worker):
        raise TypeError(f"{spec} is a {type(obj).__name__}, not a zstalk.workers.Worker")
    return obj
