"""`zstalk serve --fronts N` / `zstalkd`: one broker and N beanstalk fronts on one machine,
supervised, plus one counter front when `zstalk serve` is given a counter listener
(`zstalkd`, the beanstalkd drop-in, never runs one), and with `--config` the cloud-task
HTTP API (one `zstalk front http`) and one `zstalk dispatcher`.

The supervisor binds the client sockets first (so the ports are taken within
milliseconds of start, and a busy port fails at once with beanstalkd's message and exit
code), then starts the broker and the fronts as child processes running `zstalk broker`,
`zstalk front beanstalk --fd N`, `zstalk front counter --fd N` and `zstalk front http
--fd N`.  The broker listens on an ipc:// endpoint in a private temporary directory, so
no internal port is fixed and two servers run side by side.  Only the HTTP front is
given the master key, in its environment (not its argv, which `ps` shows), or the name
of the file it came from (--master-key-file); its TLS certificate and key go on its
command line by file name.

Signals are blocked and taken with sigtimedwait, so the loop has no races: SIGTERM or
SIGINT stops the children (SIGTERM, then SIGKILL after STOP_GRACE_S) and exits;
SIGUSR1 (drain mode) and SIGHUP (read --config again) are passed to the broker.  A child
that dies is started again, with a warning in the log format every child is given
(`--log-format`, as -V).  Children get PR_SET_PDEATHSIG, so they never outlive the
supervisor, even after kill -9 of it.  This module imports nothing heavy, to keep
start-up fast.

With --health-port each child gets a health port of its own on loopback, and the
supervisor serves the one asked for: its children's readiness and metrics as one
(probes.py).

With --journal the broker child stands by until the lease is its own (run/leading.py).
Its endpoint is bound meanwhile by a door that sends fronts on to the leader
(broker/standby.py), and it says so on the ready fd (STANDING) before the ready byte of
its takeover.  If this instance can follow (a worker endpoint to advertise: following.py
`cannot_follow`), the fronts start then and serve clients through the leader, as the
fronts of a one-process standby do; at the takeover their links lose that leader and ask
their broker's endpoint again, which now welcomes them.  The dispatcher, the health port
and the start line wait for the takeover (watched for in the loop), as does everything
when the instance cannot follow: clients then wait in the listen backlog.  The health
port opens with the fronts: /leader 503 and /readyz from the fronts alone meanwhile.
"""
from __future__ import annotations

import ctypes
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from .logs import log_format, start_line
from .options import (MASTER_KEY_ENV, MASTER_KEY_FILE_ENV, ServeOptions, announcement,
                      binlog_said, health_said, journal_said)

STOP_GRACE_S = 3.0
BIND_EXIT = 111         # beanstalkd's exit code for an address it cannot bind
#: a dispatcher lets running calls finish for 10 s (workers/upstream/dispatcher.py CLOSE_GRACE_S)
DISPATCHER_GRACE_S = 12.0
RESTART_DELAY_S = 0.5
#: a broker exiting with these cannot succeed by trying again (locked or foreign binlog
#: directory, endpoint in use, keys missing for a non-local endpoint; a journal on NATS it
#: cannot use, that another broker writes now (12), or that was out of reach for
#: --journal-timeout (13): a new broker would depose the other): the supervisor stops
#: and exits with the same code
FATAL_EXITS = {2, 10, 12, 13, 111}
#: signals the broker child is given in turn: drain mode, read --config again
_PASSED_ON = {signal.SIGUSR1, signal.SIGHUP}
_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, *_PASSED_ON}
_PR_SET_PDEATHSIG = 1
#: what a broker child with --journal writes on its ready fd once it stands by, its
#: endpoint bound (cli.py `broker`); the ready byte b"1" follows at its takeover
STANDING = b"s"
#: how often the loop looks whether a standing-by broker child took over
STANDING_LOOK_S = 0.2
log = logging.getLogger("zstalk.supervisor")


def _child_setup() -> None:
    """Runs in each child between fork and exec: only the signals we pass on blocked (the
    broker unblocks them once it handles them: one sent while it starts waits for that,
    instead of killing it), and die with the parent."""
    signal.pthread_sigmask(signal.SIG_SETMASK, _PASSED_ON)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Supervisor:
    def __init__(self, listeners: list[socket.socket], opts: ServeOptions,
                 counter_listeners: list[socket.socket] = ()) -> None:
        self.listeners = listeners
        self.counter_listeners = list(counter_listeners)
        self.opts = opts
        self.tmpdir = tempfile.mkdtemp(prefix="zstalk-")
        self.endpoint = opts.broker_bind or f"ipc://{self.tmpdir}/broker"
        self.children: dict[str, subprocess.Popen] = {}
        self.draining = False       # survives a broker restart (passed as --drain)
        self.broker_restarts = 0    # a restarted broker starts --recovering
        self.health_ports: dict[str, int] = {}  # child -> its health port (--health-port)
        self.probes = None          # probes.SupervisorProbes, with --health-port
        self.restored = None        # what the broker's binlog replay brought back (ready fd)
        self.ready_r: int | None = None     # the broker child's ready fd, until it leads
        self.standing = False       # the broker child stands by (its fronts follow)
        self.announced = False
        self.follows = opts.journal is not None and _can_follow(opts)

    def _command(self, name: str) -> list[str]:
        """A child's command line: this process's verbosity and log format, its role."""
        base = [sys.executable, "-m", "zstalk.broker.run"] + ["-V"] * self.opts.verbose
        cmd = base + self._arguments(name) + ["--log-format", log_format()]
        if self.opts.health.port:
            from .probes import child_args, free_port
            self.health_ports[name] = port = free_port()     # (afresh: the old may be taken)
            cmd += child_args(name, port, self.opts.health)
        for sock in self._listeners_of(name):
            cmd += ["--fd", str(sock.fileno())]
        return cmd

    def _arguments(self, name: str) -> list[str]:
        """The `zstalk` subcommand and options of a child (a front-N is a beanstalk front)."""
        if name == "broker":
            return ["broker", "--bind", self.endpoint,
                    "--max-job-size", str(self.opts.max_job_size),
                    "--max-jobs-bytes", str(self.opts.max_jobs_bytes),
                    *(["--drain"] if self.draining else []),
                    *(["--recovering"] if self.broker_restarts else []),
                    *self.opts.broker_args()]
        # with --journal the fronts hold through a failover (following.py's JOURNAL_HOLD_S)
        hold = ["--hold-s", "15"] if self.opts.journal is not None else []
        if name == "counter":
            return ["front", "counter", "--broker", self.endpoint,
                    "--max-connections", str(self.opts.counter_max_connections), *hold]
        if name == "http":
            return ["front", "http", "--broker", self.endpoint, *self.opts.http_args(), *hold]
        if name == "dispatcher":
            return ["dispatcher", "--broker", self.endpoint]
        return ["front", "beanstalk", "--broker", self.endpoint,
                "--max-job-size", str(self.opts.max_job_size),
                "--max-connections", str(self.opts.max_connections), *hold]

    def _listeners_of(self, name: str) -> list[socket.socket]:
        if name.startswith("front-"):
            return self.listeners
        return {"counter": self.counter_listeners,
                "http": self.opts.http_listeners}.get(name, [])

    def _environment(self, name: str) -> dict[str, str]:
        """The supervisor's environment; the master key (or its file's name) for the
        HTTP front only."""
        env = dict(os.environ, ZSTALK_SUPERVISOR_PID=str(os.getpid()))
        env.pop(MASTER_KEY_ENV, None)
        env.pop(MASTER_KEY_FILE_ENV, None)
        if name == "http" and self.opts.master_key_file:
            env[MASTER_KEY_FILE_ENV] = os.path.abspath(self.opts.master_key_file)
        elif name == "http" and self.opts.master_key:
            env[MASTER_KEY_ENV] = self.opts.master_key
        return env

    def _start(self, name: str, extra: list[str] = (), fds: list[int] = ()) -> None:
        fds = [s.fileno() for s in self._listeners_of(name)] + list(fds)
        self.children[name] = subprocess.Popen(
            self._command(name) + list(extra), pass_fds=fds, env=self._environment(name),
            preexec_fn=_child_setup, stdin=subprocess.DEVNULL)

    def _start_broker_and_wait(self) -> int | None:
        """Start the broker and wait until it has replayed its binlog and bound its socket,
        or, when its fronts can follow, until it stands by (module comment).

        Fronts start only then, so clients that connect meanwhile wait in the listen
        backlog, as with a beanstalkd replaying its binlog, instead of having their
        commands held and failed.  Returns an exit code if we must stop instead."""
        self._close_ready()
        self.ready_r, ready_w = os.pipe()
        self._start("broker", ["--ready-fd", str(ready_w)], [ready_w])
        os.close(ready_w)
        while True:
            if self._ready_said(0.05) and (not self.standing or self.follows):
                return None
            broker = self.children["broker"]
            if broker.poll() is not None:
                code = broker.wait()
                return code if code in FATAL_EXITS else None
            if signal.sigtimedwait([signal.SIGTERM, signal.SIGINT], 0) is not None:
                return 0

    def _ready_said(self, wait_s: float) -> bool:
        """Whether the broker child said it leads or stands by (`standing`), reading its
        ready fd for up to `wait_s`: b"1" and " JOBS TASKS SCHEDULES", after STANDING
        with a journal."""
        if self.ready_r is None or not select.select([self.ready_r], [], [], wait_s)[0]:
            return False
        said = os.read(self.ready_r, 64)
        if said.startswith(STANDING):
            self.standing, said = True, said[len(STANDING):]
        if said:
            self.standing, self.restored = False, restored(said[1:])
            self._close_ready()
        return self.standing or bool(said)

    def _close_ready(self) -> None:
        if self.ready_r is not None:
            os.close(self.ready_r)
            self.ready_r = None

    def run(self) -> int:
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            stop = self._start_broker_and_wait()
            if stop is not None:
                return stop
            for i in range(self.opts.fronts):
                self._start(f"front-{i}")
            if self.counter_listeners:
                self._start("counter")
            if self.opts.http_listeners:
                self._start("http")
            if self.opts.health.port:
                stop = self._start_probes()
                if stop is not None:
                    return stop
            if self.standing:
                log.info("the broker stands by: the fronts serve through the leader")
            else:
                self._leads()
            return self._loop()
        finally:
            if self.probes is not None:
                self.probes.close()
            self._stop()
            self._close_ready()
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    def _leads(self) -> None:
        """The broker child leads: the dispatcher and the start line (each once, whatever
        broker restarts come after)."""
        if self.opts.functions is not None and "dispatcher" not in self.children:
            self._start("dispatcher")       # (a SIGHUP may name functions later)
        if self.opts.announce and not self.announced:
            self.announced = True
            start_line(self.opts.role, announcement(
                self.listeners, self.counter_listeners, self.opts.worker_bind,
                self.opts.http_listeners, self.opts.master_key, bool(self.opts.tls_files),
                self.opts.functions is not None,
                health_said(self.opts.health, self.health_ports),
                binlog_said(self.opts.binlog_dir, self.restored)
                or journal_said(self.opts.journal, self.restored), self.opts.http_limits))
        return None

    def _start_probes(self) -> int | None:
        from ...protocol.network.health import HealthBindError
        from .probes import SupervisorProbes
        self.probes = SupervisorProbes(self.opts.health, self._probed, self._leader)
        try:
            self.probes.start()
        except HealthBindError as exc:
            self.probes = None
            print(f"zstalk: {exc}", file=sys.stderr)
            return BIND_EXIT
        return None

    def _probed(self) -> dict[str, int]:
        """The children whose probes count now, and their health ports: not a broker
        standing by, which opens its port only once it leads."""
        return {name: port for name, port in self.health_ports.items()
                if not (self.standing and name == "broker")}

    def _leader(self) -> str | None:
        """/leader (on the probes' thread): None while the broker child leads."""
        return "standby: the broker child stands by; the fronts serve through the leader" \
            if self.standing else None

    def _loop(self) -> int:
        while True:
            if self.probes is not None:
                self.probes.beat()
            if self.standing and self._ready_said(0) and not self.standing:
                self._leads()               # (it took over)
            info = signal.sigtimedwait(_SIGNALS, STANDING_LOOK_S if self.standing else 1.0)
            if info is None or info.si_signo == signal.SIGCHLD:
                broker = self.children["broker"]
                if broker.poll() in FATAL_EXITS:
                    return broker.returncode
                self._restart_dead()
            elif info.si_signo in _PASSED_ON:
                self.draining |= info.si_signo == signal.SIGUSR1
                broker = self.children.get("broker")
                if broker is not None:
                    broker.send_signal(info.si_signo)
            else:
                return 0

    def _restart_dead(self) -> None:
        for name, proc in list(self.children.items()):
            if proc.poll() is not None:
                log.warning("%s exited with %s; starting it again", name, proc.returncode,
                            extra={"child": name, "status": proc.returncode})
                time.sleep(RESTART_DELAY_S)
                if name == "broker":
                    self.broker_restarts += 1
                    self._start_broker_and_wait()   # its fronts wait for its replay
                else:
                    self._start(name)

    def _stop(self) -> None:
        """The fronts and the dispatcher first (the dispatcher lets running calls finish
        and report for its grace period), the broker last, once nothing more can reach it
        (with a binlog, it writes what they said)."""
        others = [p for name, p in self.children.items() if name != "broker"]
        self._terminate(others, DISPATCHER_GRACE_S if "dispatcher" in self.children
                        else STOP_GRACE_S)
        self._terminate([p for name, p in self.children.items() if name == "broker"],
                        STOP_GRACE_S)

    @staticmethod
    def _terminate(procs: list[subprocess.Popen], grace_s: float) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _can_follow(opts: ServeOptions) -> bool:
    from .following import cannot_follow      # (only with --journal: it imports the fronts')
    why = cannot_follow(opts)
    if why is not None:
        log.info("the fronts start once the broker leads: %s", why)
    return why is None


def restored(said: bytes) -> tuple[int, int, int] | None:
    """The counts a broker child wrote after its ready byte (cli.py `broker --ready-fd`)."""
    try:
        jobs, tasks, schedules = map(int, said.split())
    except ValueError:
        return None
    return jobs, tasks, schedules


def serve(listeners: list[socket.socket], opts: ServeOptions,
          counter_listeners: list[socket.socket] = ()) -> int:
    return Supervisor(listeners, opts, counter_listeners).run()
