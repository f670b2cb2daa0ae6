"""The wiring above the actors: the `zstalk` and `zstalkd` commands, the one-process
server, the supervisor of front processes, and the settings each actor is built from.
No actor imports this package."""

import signal

#: the signals a server holds from binding its ports until its loop handles them: by
#: default each ends a process, and a server may take seconds to replay its binlog or
#: stand by for hours, its ports already accepting, so a reload (SIGHUP) or drain
#: (SIGUSR1) sent meanwhile, by a config tool or an impatient operator, killed it
HELD_SIGNALS = (signal.SIGHUP, signal.SIGUSR1)

#: the cyclic garbage collector's thresholds in zstalk's processes (gc.set_threshold)
GC_THRESHOLDS = (50_000, 20, 20)


def tune_gc() -> None:
    """Collect cycles every 50,000 allocations, not CPython's 700: the broker, the fronts
    and the dispatchers (not worker pools, which run their users' code).  A broker's heap
    is mostly jobs, which never form reference cycles, and a process that holds a million
    of them spent a fifth of its CPU on pipelined puts walking them in the collector; an
    HTTP front keeps a future and a reply per task of an array in flight, and spent a
    sixth of its CPU per task on them (10.1 -> 8.4 us a task in arrays of 1,000).  Cycles
    among zstalk's own objects are broken where they end (a closed session leaves its
    front), and aiohttp's per request are few, so the garbage left between collections
    is a few MiB at most.  The commands call it first, before their imports: module
    bodies allocate many objects that live on, and collecting them at 700 took ~4 ms of
    zstalkd's ~90 ms to its first answer."""
    import gc
    gc.set_threshold(*GC_THRESHOLDS)


def hold_signals() -> None:
    """Block HELD_SIGNALS, before the ports are bound: one that comes meanwhile waits,
    pending, and is handled once the server's loop unblocks it (`serve._main`; threads
    started meanwhile inherit the block, so none of them takes it with its default)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
