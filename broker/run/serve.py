"""`zstalk serve` and `zstalkd` in one process: the broker and its fronts on one event loop.

The fronts are the same classes a front process runs; they are given the broker's
`local:` address, so their links hand batches to the broker actor through the in-process
mailbox (protocol/links/mailbox.py) instead of ZeroMQ, and a client's command is answered in
the event-loop turn that read it.

Start-up is ordered for the first reply.  The CLI has already bound the client ports
(a busy port fails at once, exit 111, as beanstalkd).  Then the broker is built (with a
binlog, its replay finishes first, while clients wait in the listen backlog, as with
beanstalkd), the beanstalk front starts accepting, and only after its first loop turns
(a client already waiting has its first command answered) do the counter front start and
ZeroMQ load to bind the endpoint for native workers, their modules imported on a thread
(`load_on_a_thread`) so that the loop goes on answering meanwhile; a failure there still stops the
server with exit 111 and the endpoint's name.  One line on stderr then says what listens
where.

With --journal the instance first stands by (leading.py): its health port answers from
the start (/leader and /readyz 503 with the reason), and the broker is built, the stream
replayed, only once the lease is its own; a graceful stop then releases the lease.
Meanwhile (following.py) its worker endpoint tells peers where the leader is, and its
fronts serve clients through the leader, wherever it runs; at
takeover they move to the broker beside them.  An instance with no worker endpoint keeps
its client ports bound but not listening (a connection is refused, not queued).

SIGTERM / SIGINT stop accepting, let the binlog reach the disk (replies held for it go
out), close the client connections and exit 0; SIGUSR1 turns on drain mode; SIGHUP reads
the --config file again.  There is
no supervisor: like beanstalkd, the server is one process (`--fronts N` for more).
"""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys

from . import HELD_SIGNALS, tune_gc
from .fronts import beanstalk_front, counter_front, start_front
from ...protocol.network.loop import run
from .. import VERSION
from .logs import start_line
from .options import (ServeOptions, announcement, binlog_said, checks_said, health_said, journal_said,
                      no_endpoint)

BINLOG_EXIT = 10        # beanstalkd's exit code for a binlog directory it cannot use
BIND_EXIT = 111         # and for an address it cannot bind
#: loop turns given to the beanstalk front before the counter front and ZeroMQ load: one to
#: accept a waiting client, one for connection_made, one to read and answer its command
_FIRST_TURNS = 3


def run_server(listeners, opts: ServeOptions, counter_listeners=()) -> int:
    """`zstalk serve` / `zstalkd` once their ports are bound: one process, or a supervisor
    with front processes (`--fronts N`)."""
    if opts.fronts == 0:
        return serve_here(listeners, opts, counter_listeners)
    from .supervisor import serve
    return serve(listeners, opts, counter_listeners)


def serve_here(listeners: list[socket.socket], opts: ServeOptions,
               counter_listeners: list[socket.socket] = ()) -> int:
    from ..actor import BrokerActor
    from ..core.broker import Config

    tune_gc()

    fns = opts.functions
    tasks = {}
    if fns is not None:     # (the config file's reader loads only with a config file)
        from ..config_file import core_fields
        tasks = core_fields(fns)
    config = Config(max_job_size=opts.max_job_size, max_jobs_bytes=opts.max_jobs_bytes,
                    version=VERSION, binlog_max_size=opts.binlog_size,
                    stat_interval_s=opts.stat_interval, tasks_later=fns is None, **tasks)

    def make(wal, config: Config):
        """The broker, its journal replayed; or the exit code when that cannot be."""
        try:
            return BrokerActor(None, config, binlog=wal, config_path=opts.config_path,
                               metrics_top=opts.health.metrics_top)
        except Exception as exc:
            from ..wal.binlog import BinlogError
            from ..wal.stream import JournalError
            if not isinstance(exc, (BinlogError, JournalError)):
                raise
            print(f"zstalk: {exc}", file=sys.stderr)
            return exc.code if isinstance(exc, JournalError) else BINLOG_EXIT
    if opts.journal is not None:
        actor, code = run(_lead(make, config, listeners, list(counter_listeners), opts))
    else:
        actor = make(opts.binlog(), config)
        if isinstance(actor, int):
            return actor
        code = run(_main(actor, listeners, list(counter_listeners), opts))
    if actor is None:
        return code
    actor.let_last_replies_leave()
    return actor.exit_code if actor.exit_code is not None else code


async def _lead(make, config, listeners, counter_listeners, opts: ServeOptions):
    """--journal: stand by until the lease is ours, then take over and serve
    (leading.py): (the actor, or None if it never led, and the exit code).  Meanwhile
    the health port answers (/readyz and /leader 503, the standby's reason; /metrics the
    standby's: Leadership.metrics) and the
    client ports stay closed (bound, not listening: a connection is refused)."""
    from .leading import Leadership
    from ..wal.stream import JournalError
    loop = asyncio.get_running_loop()
    lead = Leadership(opts.journal, opts.max_job_size)
    probes, code = await _start_probes(opts, lead.metrics, ready=lead.standing_by,
                                       leader=lead.standing_by)
    if code is not None:
        return None, code
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await asyncio.to_thread(lead.start)
    except JournalError as exc:
        print(f"zstalk: {exc}", file=sys.stderr)
        return _closed(probes, None, exc.code)
    follow, code = await _follow(opts, lead, listeners, counter_listeners)
    if code is not None:
        lead.hand_over(None)
        return _closed(probes, None, code)
    if probes is not None:
        probes.ready = follow.ready(lead.standing_by)
    epoch = await lead.until_leading(stop)
    if epoch is None:
        await follow.close()
        lead.hand_over(None)
        return _closed(probes, None, 0)
    actor = await asyncio.to_thread(make, lead.journal_options(epoch),
                                    config._replace(recovering=epoch > 1))
    if isinstance(actor, int):
        await follow.close()
        lead.hand_over(None)
        return _closed(probes, None, actor)
    lead.keep(actor, loop)
    if stop.is_set():       # (a SIGTERM while it took over: it stops once started)
        actor.stop()
    opts = opts._replace(journal=lead.journal_options(epoch))
    code = await _main(actor, listeners, counter_listeners, opts, probes, lead.leading, follow)
    lead.hand_over(actor)
    return actor, code


async def _follow(opts: ServeOptions, lead, listeners, counter_listeners):
    """A standby's door and following fronts (following.py): (them, None), or (None, the
    exit code) when the worker endpoint cannot be bound (111), or not without keys (2)."""
    from .following import stand_by
    from ...protocol.network.curve import CurveError
    from ..actor import BindError
    try:
        return await stand_by(opts, lead.pointer, listeners, counter_listeners), None
    except BindError as exc:
        print(f"zstalk: cannot bind {exc} (the worker endpoint: --worker-bind moves it, "
              f"'none' turns it off)", file=sys.stderr)
        return None, BIND_EXIT
    except CurveError as exc:
        print(f"zstalk: {exc}", file=sys.stderr)
        return None, 2


def _closed(probes, actor, code: int):
    if probes is not None:
        probes.close()
    return actor, code


async def _main(actor, listeners, counter_listeners, opts: ServeOptions, probes=None,
                leader=lambda: None, follow=None) -> int:
    """Serve until stopped; `probes` already listening (a standby's, _lead) now answer
    for the broker, `leader` is /leader's answer, and `follow` a standby's door and
    fronts (following.py), which now come to this broker."""
    loop = asyncio.get_running_loop()
    actor.start()
    address = actor.expose(f"serve-{os.getpid()}")
    fronts = await follow.take_over(actor, address) if follow is not None else []
    followed = bool(fronts)         # (the counter front came over too)
    if not followed:
        fronts = [await start_front(beanstalk_front(address, opts.max_connections,
                                                    opts.max_job_size), listeners)]
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, actor.stop)
    loop.add_signal_handler(signal.SIGUSR1, actor.drain)
    loop.add_signal_handler(signal.SIGHUP, actor.reload)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD_SIGNALS)   # (one held since the bind: now)
    for _ in range(_FIRST_TURNS):   # a client already waiting is answered before the rest loads
        await asyncio.sleep(0)
    await load_on_a_thread(_the_rest(opts, counter_listeners))
    actor.core.build_tasks()
    if counter_listeners and not followed:
        fronts.append(await start_front(counter_front(address, opts.counter_max_connections),
                                        counter_listeners))
    tasks = await _start_tasks(address, opts, follow.http if follow is not None else None)
    code = _bind_workers(actor, opts) if follow is None or follow.door is None else None
    if code is None and probes is not None:
        probes.ready, probes.leader = (lambda: None), leader
        probes.metrics = metrics(actor, fronts, tasks)
    elif code is None:
        probes, code = await _start_probes(opts, metrics(actor, fronts, tasks), leader=leader)
    if code is None:
        if opts.announce:
            start_line(opts.role, announcement(listeners, counter_listeners, actor.endpoint,
                                               opts.http_listeners, opts.master_key,
                                               bool(opts.tls_files), opts.functions is not None,
                                               health_said(opts.health),
                                               binlog_said(opts.binlog_dir, actor.restored)
                                               or journal_said(opts.journal, actor.restored,
                                                               getattr(actor.journal,
                                                                       "sync_said", "")),
                                               opts.http_limits,
                                               checks_said(actor.core.config.upstreams)))
        await actor.wait_stopped()
    if probes is not None:
        probes.close()
    for running in fronts:
        for server in running.servers:
            server.close()          # no new clients while the binlog reaches the disk
    for actor_ in tasks:
        await actor_.close()
    actor.close()
    for running in fronts:
        running.front.close()
    return code or 0


def _the_rest(opts: ServeOptions, counter_listeners) -> list[str]:
    """The modules the rest of the start-up imports, by what it starts."""
    modules = ["zstalk.protocol.fronts.counter"] if counter_listeners else []
    modules += ["zstalk.broker.core.tasks.commands", "zstalk.broker.core.schedules.commands"]
    if opts.http_listeners:
        modules.append("zstalk.protocol.fronts.http.front")           # (aiohttp)
    if opts.functions is not None:
        modules.append("zstalk.workers.upstream.dispatcher")
    if not no_endpoint(opts.worker_bind):
        modules += ["zmq", "zstalk.protocol.links.handshakes"]
    return modules


async def load_on_a_thread(modules: list[str]) -> None:
    """Import `modules` on a thread while the loop goes on answering the clients already
    connected: an import on the loop stops it for as long as it takes (ZeroMQ ~17 ms here,
    aiohttp ~100 ms), inside the first timed command of a client that came early (a test
    suite that starts the server and times its first `put` with a delay).  The thread
    holds the GIL while a module runs, so the switch interval is cut to 1 ms meanwhile:
    the loop waits at most about that for it."""
    if not modules:
        return
    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, 0.001))
    try:        # (__import__, as an import statement: -X importtime logs it, import_module not)
        await asyncio.to_thread(lambda: [__import__(m) for m in modules])
    finally:
        sys.setswitchinterval(interval)


async def _start_tasks(address: str, opts: ServeOptions, http=None) -> list:
    """The HTTP task API and a dispatcher, when asked for (aiohttp loads only then);
    `http`: the HTTP front a standby started already (following.py)."""
    started = [http] if http is not None else []
    if opts.http_listeners and http is None:
        from ...protocol.fronts.http.front import HttpFront
        front = HttpFront(address, master_key=opts.master_key, limits=opts.http_limits,
                          tls=opts.http_tls())
        await front.start(opts.http_listeners)
        started.append(front)
    if opts.functions is not None:
        from ...workers.upstream.dispatcher import Dispatcher
        dispatcher = Dispatcher(address)
        dispatcher.start()
        started.append(dispatcher)
    return started


def metrics(actor, fronts: list, tasks: list):
    """/metrics of the one process: the broker's, and its fronts' and dispatcher's."""
    from ..metrics import build_info

    def render() -> bytes:
        more = [build_info("serve")]
        more += [s for running in fronts for s in running.front.samples()]
        for started in tasks:       # the HTTP front, the dispatcher
            more += started.samples()
        return actor.render_metrics(more)
    return render


async def _start_probes(opts: ServeOptions, metrics=None, ready=lambda: None,
                        leader=lambda: None):
    """--health-port, once the binlog is replayed and every endpoint bound (a standby's:
    from its start): (probes, None), or (None, BIND_EXIT) when its port cannot be bound."""
    from ...protocol.network.health import HealthBindError, start_health
    try:
        return await start_health(opts.health, ready, metrics=metrics, leader=leader), None
    except HealthBindError as exc:
        print(f"zstalk: {exc}", file=sys.stderr)
        return None, BIND_EXIT


def _bind_workers(actor, opts: ServeOptions) -> int | None:
    if no_endpoint(opts.worker_bind):
        return None
    from ...protocol.network.curve import CurveError
    from ..actor import BindError
    try:
        actor.bind(opts.worker_bind)
    except BindError as exc:
        print(f"zstalk: cannot bind {exc} (the worker endpoint: --worker-bind moves it, "
              f"'none' turns it off)", file=sys.stderr)
        return BIND_EXIT
    except CurveError as exc:
        print(f"zstalk: {exc}", file=sys.stderr)
        return 2
    return None
