"""The `zstalk` command: one click group, each subcommand builds one actor and runs it.

    zstalk serve [-l ADDR] [-p PORT] [--fronts N]    broker + fronts, supervised
    zstalk broker --bind tcp://HOST:PORT             the broker actor alone
    zstalk front beanstalk --broker EP --listen ADDR one beanstalk front

Heavy imports (zmq, asyncio) happen inside the subcommands, so `serve` binds its port
before any of them are loaded.
"""
from __future__ import annotations

import logging
import os
import sys

import click

from ..protocol.listen import bind_listen
from . import VERSION
from .supervisor import ServeOptions, serve as run_supervisor

MAX_JOB_SIZE_CAP = 1073741824   # beanstalkd's -z cap (1 GiB)


def setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s")


def exit_with_parent() -> None:
    """A supervised child whose supervisor is already gone exits (the prctl races start-up)."""
    parent = os.environ.get("ZSTALK_SUPERVISOR_PID")
    if parent and os.getppid() != int(parent):
        sys.exit(0)


def bind_or_exit(spec: str, port: int):
    try:
        return bind_listen(spec, port)
    except OSError as exc:
        click.echo(f"zstalk: bind {spec}: {exc.strerror}", err=True)
        sys.exit(111)       # beanstalkd's exit code for a socket it cannot bind


@click.group()
@click.option("-V", "--verbose", count=True, help="More logging (repeat for more).")
@click.version_option(VERSION, prog_name="zstalk")
@click.pass_context
def main(ctx: click.Context, verbose: int) -> None:
    """zstalk: a beanstalkd-compatible job broker on a ZeroMQ actor cluster."""
    ctx.obj = verbose
    setup_logging(verbose)


@main.command()
@click.option("-l", "--listen", "addr", default="0.0.0.0", show_default=True,
              help="Address to listen on, or unix:/path.")
@click.option("-p", "--port", default=11300, show_default=True)
@click.option("--fronts", default=1, show_default=True, help="Front processes sharing the port.")
@click.option("-z", "--max-job-size", default=65535, show_default=True)
@click.option("--max-jobs-bytes", default=0, help="Memory for jobs; past it put answers OUT_OF_MEMORY (0: no limit).")
@click.option("--max-connections", default=0, help="Per front; 0: no limit.")
@click.pass_obj
def serve(verbose, addr, port, fronts, max_job_size, max_jobs_bytes, max_connections):
    """Run a broker and beanstalk fronts on one machine (port 11300 by default)."""
    listener = bind_or_exit(addr, port)
    opts = ServeOptions(fronts=fronts, max_job_size=min(max_job_size, MAX_JOB_SIZE_CAP),
                        max_jobs_bytes=max_jobs_bytes, max_connections=max_connections,
                        verbose=verbose)
    sys.exit(run_supervisor([listener], opts))


@main.command()
@click.option("--bind", default="tcp://127.0.0.1:11400", show_default=True,
              help="ZeroMQ endpoint for fronts (tcp://HOST:PORT or ipc://PATH).")
@click.option("-z", "--max-job-size", default=65535, show_default=True)
@click.option("--max-jobs-bytes", default=0, help="0: no limit.")
@click.option("--drain", is_flag=True, help="Start in drain mode (as after SIGUSR1).")
def broker(bind, max_job_size, max_jobs_bytes, drain):
    """Run the broker actor: all tube, job and session state."""
    from .actor import BrokerActor
    from .core import Config

    exit_with_parent()
    config = Config(max_job_size=min(max_job_size, MAX_JOB_SIZE_CAP),
                    max_jobs_bytes=max_jobs_bytes, version=VERSION)
    try:
        actor = BrokerActor(bind, config)
    except Exception as exc:      # zmq.ZMQError: address in use, bad endpoint
        click.echo(f"zstalk broker: cannot bind {bind}: {exc}", err=True)
        sys.exit(111)
    actor.core.draining = drain
    actor.run()


@main.group()
def front():
    """Run a protocol front."""


@front.command()
@click.option("--broker", "broker_ep", default="tcp://127.0.0.1:11400", show_default=True)
@click.option("--listen", "listens", multiple=True, help="HOST:PORT or unix:/path (repeatable).")
@click.option("--fd", "fds", multiple=True, type=int, help="Inherited listening socket.")
@click.option("--max-connections", default=0, help="0: no limit.")
@click.option("-z", "--max-job-size", default=65535, help="Until the broker says otherwise.")
@click.option("--hold-s", default=5.0, show_default=True,
              help="How long commands wait for an unreachable broker before INTERNAL_ERROR.")
def beanstalk(broker_ep, listens, fds, max_connections, max_job_size, hold_s):
    """Serve the beanstalkd text protocol to TCP / unix-socket clients."""
    import socket
    exit_with_parent()
    sockets = [socket.socket(fileno=fd) for fd in fds]
    sockets += [bind_or_exit(spec, 11300) for spec in listens]
    if not sockets:
        raise click.UsageError("give --listen or --fd")
    from ..protocol.front_main import run_beanstalk_front
    run_beanstalk_front(broker_ep, sockets, max_connections, max_job_size, hold_s)


if __name__ == "__main__":
    main()

